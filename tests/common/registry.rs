//! A small OCI registry on 127.0.0.1 over HTTPS (a generated test CA, trusted through
//! `embedded.entrypointLookup.caBundleFile`), for the ENTRYPOINT lookup: manifests by tag and
//! digest, an index when an image has several platforms (and an attestation entry, as
//! buildx writes), config blobs (optionally behind a redirect, as real registries serve them),
//! the anonymous Bearer token flow, and a log of every request.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::temp_dir;

pub const TOKEN: &str = "fake-registry-token-1b7e";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// One platform of an image: (architecture, Entrypoint, Cmd); `None` leaves the key out.
pub type PlatformCmd = (
    &'static str,
    Option<Vec<&'static str>>,
    Option<Vec<&'static str>>,
);

/// How the registry misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Ask for a Bearer token (anonymous, from `/token`) before serving `/v2/`.
    pub bearer: bool,
    /// Serve config blobs through a redirect to `/storage/<digest>`.
    pub redirect_blobs: bool,
    /// Hold every answer this long.
    pub delay: Option<Duration>,
    /// Serve config blobs with one byte changed.
    pub corrupt_blobs: bool,
    /// Answer manifests with 5 MiB of padding.
    pub oversize: bool,
    /// Ask for Basic credentials, as ECR does: `AWS:<password>`, base64.
    pub basic: bool,
    /// Redirect config blobs (with `redirect_blobs`) to this host name, on the same port,
    /// instead of `localhost`: storage on another host, as real registries have it (the
    /// certificate names `localhost` and [`ECR_HOST`]).
    pub redirect_host: Option<String>,
    /// Answer every manifest with this body (a registry that sends what it likes).
    pub manifest_body: Option<Vec<u8>>,
}

/// One request as the registry saw it: `Host`, "GET /path", and its `Authorization`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub host: String,
    pub request: String,
    pub authorization: Option<String>,
}

/// The ECR host name the registry's certificate also names (tests connect it to 127.0.0.1).
pub const ECR_HOST: &str = "123456789012.dkr.ecr.us-east-1.amazonaws.com";

pub struct FakeRegistry {
    pub port: u16,
    /// The CA that signed the registry's certificate (PEM file).
    pub ca_file: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    /// Every `Authorization` header received.
    auths: Arc<Mutex<Vec<String>>>,
    /// Every request, with the host it was sent to and its credentials.
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    /// repo -> tag -> manifest digest (the index's, for several platforms).
    digests: BTreeMap<String, BTreeMap<String, String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[derive(Default)]
struct Content {
    /// "repo@reference" -> (media type, body)
    manifests: BTreeMap<String, (String, Vec<u8>)>,
    /// "repo@digest" -> body
    blobs: BTreeMap<String, Vec<u8>>,
}

impl FakeRegistry {
    /// Serves `images`: (repository, tag, platforms). One platform is a plain manifest;
    /// several are an index.
    pub async fn start(images: &[(&str, &str, Vec<PlatformCmd>)], faults: Faults) -> Self {
        let mut content = Content::default();
        let mut digests: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (repo, tag, platforms) in images {
            let mut entries = Vec::new();
            for (arch, entrypoint, cmd) in platforms {
                let mut config = serde_json::Map::new();
                if let Some(e) = entrypoint {
                    config.insert("Entrypoint".into(), json!(e));
                }
                if let Some(c) = cmd {
                    config.insert("Cmd".into(), json!(c));
                }
                config.insert("Env".into(), json!(["PATH=/usr/bin:/bin"]));
                let blob = serde_json::to_vec(
                    &json!({"architecture": arch, "os": "linux", "config": config, "rootfs": {"type": "layers", "diff_ids": []}}),
                )
                .unwrap();
                let blob_digest = digest(&blob);
                content
                    .blobs
                    .insert(format!("{repo}@{blob_digest}"), blob.clone());
                let manifest = serde_json::to_vec(&json!({
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob_digest, "size": blob.len()},
                    "layers": []
                }))
                .unwrap();
                let d = digest(&manifest);
                content.manifests.insert(
                    format!("{repo}@{d}"),
                    (OCI_MANIFEST.into(), manifest.clone()),
                );
                entries.push((arch.to_string(), d, manifest.len()));
            }
            let (media, top) = if entries.len() == 1 {
                let d = &entries[0].1;
                content.manifests[&format!("{repo}@{d}")].clone()
            } else {
                let mut manifests: Vec<Value> = entries
                    .iter()
                    .map(|(arch, d, size)| json!({"mediaType": OCI_MANIFEST, "digest": d, "size": size, "platform": {"architecture": arch, "os": "linux"}}))
                    .collect();
                // buildx's provenance attestation: not a platform to read.
                manifests.push(json!({"mediaType": OCI_MANIFEST, "digest": entries[0].1, "size": entries[0].2, "platform": {"architecture": "unknown", "os": "unknown"}}));
                let index = serde_json::to_vec(
                    &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}),
                )
                .unwrap();
                (OCI_INDEX.to_owned(), index)
            };
            let d = digest(&top);
            content
                .manifests
                .insert(format!("{repo}@{d}"), (media.clone(), top.clone()));
            content
                .manifests
                .insert(format!("{repo}@{tag}"), (media, top));
            digests
                .entry(repo.to_string())
                .or_default()
                .insert(tag.to_string(), d);
        }

        let dir = temp_dir("fake-registry");
        let files = podmutator::transport::tls::ensure_certs(
            &dir,
            true,
            &["localhost".into(), ECR_HOST.into()],
        )
        .unwrap();
        let tls = podmutator::transport::tls::tls_config(&files, None).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let auths: Arc<Mutex<Vec<String>>> = Arc::default();
        let exchanges: Arc<Mutex<Vec<Exchange>>> = Arc::default();
        let shared = Arc::new((
            content,
            faults,
            port,
            log.clone(),
            auths.clone(),
            exchanges.clone(),
        ));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move {
                            let (content, faults, port, log, auths, exchanges) = &*shared;
                            Ok::<_, Infallible>(
                                handle(req, content, faults, *port, log, auths, exchanges).await,
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
                });
            }
        });
        FakeRegistry {
            port,
            ca_file: files.ca,
            log,
            auths,
            exchanges,
            digests,
            task,
        }
    }

    /// The registry as an image reference names it.
    pub fn host(&self) -> String {
        format!("localhost:{}", self.port)
    }

    /// The digest `repo:tag` resolves to.
    pub fn digest(&self, repo: &str, tag: &str) -> String {
        self.digests[repo][tag].clone()
    }

    /// Every request so far, as "GET /path".
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Every `Authorization` header received.
    pub fn authorizations(&self) -> Vec<String> {
        self.auths.lock().unwrap().clone()
    }

    /// Every request so far, with the host it was sent to and its credentials.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }

    pub fn reset(&self) {
        self.log.lock().unwrap().clear();
    }
}

fn reply(status: StatusCode, media: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if !media.is_empty() {
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, media.parse().unwrap());
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    content: &Content,
    faults: &Faults,
    port: u16,
    log: &Mutex<Vec<String>>,
    auths: &Mutex<Vec<String>>,
    exchanges: &Mutex<Vec<Exchange>>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &hyper::header::HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    exchanges.lock().unwrap().push(Exchange {
        host: header(hyper::header::HOST).unwrap_or_default(),
        request: format!("{} {}", req.method(), req.uri()),
        authorization: header(hyper::header::AUTHORIZATION),
    });
    if let Some(a) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        auths.lock().unwrap().push(a.to_owned());
    }
    log.lock()
        .unwrap()
        .push(format!("{} {}", req.method(), req.uri()));
    if let Some(d) = faults.delay {
        tokio::time::sleep(d).await;
    }
    if path == "/token" {
        return reply(
            StatusCode::OK,
            "application/json",
            json!({"token": TOKEN}).to_string().into_bytes(),
        );
    }
    if let Some(key) = path.strip_prefix("/storage/") {
        return match content.blobs.get(key) {
            Some(b) => reply(StatusCode::OK, "application/octet-stream", b.clone()),
            None => reply(StatusCode::NOT_FOUND, "", Vec::new()),
        };
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return reply(StatusCode::NOT_FOUND, "", Vec::new());
    };
    let (repo, kind, reference) =
        match (rest.rsplit_once("/manifests/"), rest.rsplit_once("/blobs/")) {
            (Some((repo, r)), _) => (repo, "manifests", r),
            (None, Some((repo, r))) => (repo, "blobs", r),
            _ => return reply(StatusCode::NOT_FOUND, "", Vec::new()),
        };
    let authorised = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
    let basic = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(b).ok()
        })
        .is_some_and(|d| d.starts_with(b"AWS:") && d.len() > 4);
    if faults.basic && !basic {
        let mut r = reply(StatusCode::UNAUTHORIZED, "application/json", b"{}".to_vec());
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            format!(r#"Basic realm="https://{ECR_HOST}/",service="ecr.amazonaws.com""#)
                .parse()
                .unwrap(),
        );
        return r;
    }
    if faults.bearer && !authorised {
        let mut r = reply(StatusCode::UNAUTHORIZED, "application/json", b"{}".to_vec());
        let challenge = format!(
            r#"Bearer realm="https://localhost:{port}/token",service="fake-registry",scope="repository:{repo}:pull""#
        );
        r.headers_mut()
            .insert(hyper::header::WWW_AUTHENTICATE, challenge.parse().unwrap());
        return r;
    }
    let key = format!("{repo}@{reference}");
    match kind {
        "manifests" if faults.manifest_body.is_some() => reply(
            StatusCode::OK,
            OCI_MANIFEST,
            faults.manifest_body.clone().unwrap_or_default(),
        ),
        "manifests" => match content.manifests.get(&key) {
            Some((media, body)) => {
                let mut body = body.clone();
                if faults.oversize {
                    body.extend(std::iter::repeat_n(b' ', 5 << 20));
                }
                reply(StatusCode::OK, media, body)
            }
            None => reply(StatusCode::NOT_FOUND, "application/json", b"{}".to_vec()),
        },
        _ => match content.blobs.get(&key) {
            Some(_) if faults.redirect_blobs => {
                let mut r = reply(StatusCode::TEMPORARY_REDIRECT, "", Vec::new());
                r.headers_mut().insert(
                    hyper::header::LOCATION,
                    format!(
                        "https://{}:{port}/storage/{key}",
                        faults.redirect_host.as_deref().unwrap_or("localhost")
                    )
                    .parse()
                    .unwrap(),
                );
                r
            }
            Some(b) => {
                let mut body = b.clone();
                if faults.corrupt_blobs
                    && let Some(last) = body.iter().rposition(|c| *c == b'}')
                {
                    body.insert(last, b' ');
                }
                reply(StatusCode::OK, "application/octet-stream", body)
            }
            None => reply(StatusCode::NOT_FOUND, "application/json", b"{}".to_vec()),
        },
    }
}
