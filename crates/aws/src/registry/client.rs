//! The OCI distribution client of [`super`]: `GET /v2/<repo>/manifests/<ref>` (an index is
//! narrowed to the pod's platform), then `GET /v2/<repo>/blobs/<config digest>`, read
//! `config.Entrypoint` and `config.Cmd`.
//!
//! - HTTPS only, on the project's one TLS stack (rustls + ring), trusting the system's roots
//!   and `caBundleFile`. One HTTP/1.1 connection per request: a lookup is a few requests, and
//!   its answer is cached.
//! - Only registries of `embedded.entrypointLookup.registries` are asked. A registry's
//!   redirect (blobs are served from object storage or a CDN on real registries) is followed,
//!   HTTPS only and at most [`MAX_REDIRECTS`] times, without the registry's credentials when it
//!   leaves the host: what comes back is verified against its digest, or, for a manifest asked
//!   for by tag, it is the registry's own answer.
//! - Anonymous pulls: a `401` with a `Bearer` challenge is answered with a token from the
//!   challenge's realm, as `docker pull` does.
//! - Every body is bounded ([`MAX_BODY`]); every digest-named body is verified (sha256).
//! - Cached: tag to manifest digest for `tagTtlSeconds`; a digest's command (immutable) until
//!   evicted.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Request, StatusCode, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_rustls::rustls;

use super::{BoxFuture, EntrypointSource, ImageCommand, ImageQuery};
use crate::config::EntrypointLookupConfig;
use crate::image_ref::ImageRef;
pub use podmutator_core::registry::error::{
    BASIC_HINT, BEARER_HINT, DOCKER_HUB_API, LookupError, MAX_BODY, MAX_REDIRECTS, api_authority,
    known_platforms,
};

/// Lookups this process has in flight at most, all admissions together.
const MAX_IN_FLIGHT: usize = 8;
/// Entries of each cache.
const CACHE_ENTRIES: u64 = 4096;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The registry client, with its caches. Built at start; the system's root certificates are
/// loaded on the first lookup.
pub struct RegistryClient {
    config: EntrypointLookupConfig,
    extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    tls: OnceLock<Arc<rustls::ClientConfig>>,
    /// (registry, repository, tag) -> manifest digest.
    tags: moka::sync::Cache<(String, String, String), String>,
    /// (registry, repository, manifest digest, pinned arch) -> command.
    commands: moka::sync::Cache<(String, String, String, Option<String>), ImageCommand>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Basic credentials for ECR registries, from the function's AWS identity.
    ecr: Option<super::ecr::Ecr>,
    /// Host names answered without DNS (tests; split-horizon setups).
    resolve: Vec<(String, std::net::IpAddr)>,
}

/// Why the client cannot be built (the extra CA bundle).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub String);

impl RegistryClient {
    /// The client for `config`; reads `caBundleFile` now, so a bad one stops the start.
    pub fn new(config: &EntrypointLookupConfig) -> Result<Self, BuildError> {
        let mut extra_roots = Vec::new();
        if !config.ca_bundle_file.is_empty() {
            let pem = std::fs::read(&config.ca_bundle_file)
                .map_err(|e| BuildError(format!("cannot read {}: {e}", config.ca_bundle_file)))?;
            for cert in rustls_pemfile::certs(&mut &pem[..]) {
                extra_roots.push(cert.map_err(|e| {
                    BuildError(format!("{} is not PEM: {e}", config.ca_bundle_file))
                })?);
            }
            if extra_roots.is_empty() {
                return Err(BuildError(format!(
                    "{} holds no PEM certificate",
                    config.ca_bundle_file
                )));
            }
            // Each must be usable as a root now, not at the first lookup.
            let mut store = rustls::RootCertStore::empty();
            for cert in &extra_roots {
                store.add(cert.clone()).map_err(|e| {
                    BuildError(format!(
                        "{} holds a certificate that cannot be a root: {e}",
                        config.ca_bundle_file
                    ))
                })?;
            }
        }
        Ok(Self {
            config: config.clone(),
            extra_roots,
            tls: OnceLock::new(),
            tags: moka::sync::Cache::builder()
                .max_capacity(CACHE_ENTRIES)
                .time_to_live(Duration::from_secs(config.tag_ttl_seconds))
                .build(),
            commands: moka::sync::Cache::builder()
                .max_capacity(CACHE_ENTRIES)
                .build(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            ecr: None,
            resolve: Vec::new(),
        })
    }

    /// Reads ECR registries (`<account>.dkr.ecr.<region>.amazonaws.com`) with a token from
    /// `ecr:GetAuthorizationToken`, signed with the credentials of the AWS configuration
    /// `load` returns (called once, on the first ECR lookup).
    #[must_use]
    pub fn with_ecr(mut self, load: super::ecr::LoadSdkConfig) -> Self {
        self.ecr = Some(super::ecr::Ecr::new(load));
        self
    }

    /// Connects to `ip` for `host` instead of asking DNS (`curl --resolve`).
    #[must_use]
    pub fn resolving(mut self, host: &str, ip: std::net::IpAddr) -> Self {
        self.resolve.push((host.to_owned(), ip));
        self
    }

    fn tls(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(self.tls.get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            // Certificates the system store cannot parse are skipped, as every TLS client does.
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            roots.add_parsable_certificates(self.extra_roots.iter().cloned());
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = match rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
            {
                Ok(b) => b.with_root_certificates(roots).with_no_client_auth(),
                // ring supports the default versions; keep a working client regardless.
                Err(_) => rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            };
            Arc::new(config)
        }))
    }

    async fn lookup_uncached(&self, query: &ImageQuery) -> Result<ImageCommand, LookupError> {
        let image = ImageRef::parse(&query.image).map_err(|e| LookupError::Reference {
            image: query.image.clone(),
            reason: e.to_string(),
        })?;
        if !self.config.allows(&image.registry) {
            return Err(LookupError::NotAllowed(image.registry));
        }
        let (tag, digest) = split_suffix(image.suffix);
        // ECR answers anonymous requests with a Basic challenge: its token is sent up front.
        let auth = match (&self.ecr, super::ecr::ecr_host(&image.registry)) {
            (Some(ecr), Some((account, region))) => Some(format!(
                "Basic {}",
                ecr.token(self, &image.registry, account, region).await?
            )),
            _ => None,
        };
        let mut session = Session {
            client: self,
            authority: api_authority(&image.registry),
            repo: image.path.clone(),
            auth,
        };
        let registry = image.registry.clone();
        let repo = image.path.clone();
        let mut by_tag = None;
        let digest = match digest {
            Some(d) => d.to_owned(),
            None => {
                let key = (registry.clone(), repo.clone(), tag.to_owned());
                match self.tags.get(&key) {
                    Some(d) => d,
                    None => {
                        let body = session.manifest(tag).await?;
                        let d = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
                        self.tags.insert(key, d.clone());
                        by_tag = Some(body);
                        d
                    }
                }
            }
        };
        let key = (registry, repo, digest.clone(), query.arch.clone());
        if let Some(found) = self.commands.get(&key) {
            return Ok(found);
        }
        let body = match by_tag {
            Some(b) => b,
            None => session.manifest_verified(&digest).await?,
        };
        let found = session
            .command(&digest, &body, query.arch.as_deref())
            .await?;
        self.commands.insert(key, found.clone());
        Ok(found)
    }

    /// One GET, following redirects; the status, the `WWW-Authenticate` header and the body.
    async fn get(
        &self,
        url: &str,
        accept: &str,
        auth: Option<&str>,
        what: &str,
    ) -> Result<(StatusCode, Option<String>, Bytes), LookupError> {
        let mut url = Url::parse(url).ok_or_else(|| LookupError::Redirect { what: what.into() })?;
        let origin = url.authority.clone();
        for _ in 0..=MAX_REDIRECTS {
            let mut headers = Vec::new();
            if !accept.is_empty() {
                headers.push((header::ACCEPT, accept.to_owned()));
            }
            // The registry's credentials never leave its host.
            if let Some(a) = auth.filter(|_| url.authority == origin) {
                headers.push((header::AUTHORIZATION, a.to_owned()));
            }
            let answer = self.send("GET", &url, &headers, Bytes::new(), what).await?;
            if answer.status.is_redirection() {
                url = answer
                    .location
                    .and_then(|l| url.join(&l))
                    .ok_or_else(|| LookupError::Redirect { what: what.into() })?;
                continue;
            }
            return Ok((answer.status, answer.challenge, answer.body));
        }
        Err(LookupError::Redirect { what: what.into() })
    }

    /// One request on its own HTTP/1.1 connection (TLS unless `url` is an `http://` API
    /// endpoint from the AWS configuration), its body read to [`MAX_BODY`] at most.
    pub(super) async fn send(
        &self,
        method: &str,
        url: &Url,
        headers: &[(header::HeaderName, String)],
        body: Bytes,
        what: &str,
    ) -> Result<Answer, LookupError> {
        let connect = |reason: String| LookupError::Connect {
            host: url.authority.clone(),
            reason,
        };
        let tcp = match self.resolve.iter().find(|(h, _)| *h == url.host) {
            Some((_, ip)) => tokio::net::TcpStream::connect((*ip, url.port)).await,
            None => tokio::net::TcpStream::connect((url.host.as_str(), url.port)).await,
        }
        .map_err(|e| connect(e.to_string()))?;
        let io: Box<dyn Io> = if url.tls {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())
                .map_err(|e| connect(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls())
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    connect(format!(
                        "TLS: {e} (a registry with a private CA needs embedded.entrypointLookup.caBundleFile)"
                    ))
                })?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| connect(e.to_string()))?;
        let _stop = AbortOnDrop(tokio::spawn(conn));
        let mut req = Request::builder()
            .method(method)
            .uri(url.path.as_str())
            .header(header::HOST, url.authority.as_str())
            .header(
                header::USER_AGENT,
                concat!("podmutator/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in headers {
            req = req.header(name, value.as_str());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| connect(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| connect(e.to_string()))?;
        let status = resp.status();
        let text = |name: header::HeaderName| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let location = text(header::LOCATION);
        let challenge = text(header::WWW_AUTHENTICATE);
        if resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > MAX_BODY as u64)
        {
            return Err(LookupError::TooLarge { what: what.into() });
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    LookupError::TooLarge { what: what.into() }
                } else {
                    connect(e.to_string())
                }
            })?
            .to_bytes();
        Ok(Answer {
            status,
            location,
            challenge,
            body,
        })
    }
}

/// A connection, encrypted or not.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// What [`RegistryClient::send`] read.
pub(super) struct Answer {
    pub status: StatusCode,
    pub location: Option<String>,
    pub challenge: Option<String>,
    pub body: Bytes,
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl EntrypointSource for RegistryClient {
    fn lookup<'a>(
        &'a self,
        query: &'a ImageQuery,
    ) -> BoxFuture<'a, Result<ImageCommand, LookupError>> {
        Box::pin(async move {
            let timeout = Duration::from_millis(self.config.timeout_ms);
            let run = async {
                let _permit = self.in_flight.acquire().await;
                self.lookup_uncached(query).await
            };
            match tokio::time::timeout(timeout, run).await {
                Ok(answer) => answer,
                Err(_) => Err(LookupError::Timeout(self.config.timeout_ms)),
            }
        })
    }
}

/// One image's requests: its registry, repository and the token once one was needed.
struct Session<'c> {
    client: &'c RegistryClient,
    authority: String,
    repo: String,
    auth: Option<String>,
}

impl Session<'_> {
    fn url(&self, kind: &str, reference: &str) -> String {
        format!(
            "https://{}/v2/{}/{kind}/{reference}",
            self.authority, self.repo
        )
    }

    /// GET under `/v2/<repo>/`, answering one Bearer challenge.
    async fn fetch(
        &mut self,
        kind: &str,
        reference: &str,
        accept: &str,
    ) -> Result<Bytes, LookupError> {
        let url = self.url(kind, reference);
        let what = format!("{}/{} {kind} {reference}", self.authority, self.repo);
        let mut challenged = false;
        loop {
            let (status, challenge, body) = self
                .client
                .get(&url, accept, self.auth.as_deref(), &what)
                .await?;
            match status {
                StatusCode::OK => return Ok(body),
                StatusCode::NOT_FOUND => return Err(LookupError::NotFound { what }),
                StatusCode::UNAUTHORIZED if !challenged => {
                    challenged = true;
                    let bearer = challenge.as_deref().and_then(parse_bearer).ok_or_else(|| {
                        LookupError::Unauthorized {
                            what: what.clone(),
                            challenge: challenge_scheme(challenge.as_deref()),
                        }
                    })?;
                    let token = self.token(&bearer, &what).await?;
                    self.auth = Some(format!("Bearer {token}"));
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return Err(LookupError::Unauthorized {
                        what,
                        challenge: challenge_scheme(challenge.as_deref()),
                    });
                }
                other => {
                    return Err(LookupError::Status {
                        what,
                        status: other.as_u16(),
                    });
                }
            }
        }
    }

    /// An anonymous token for `challenge`, from its realm.
    async fn token(&self, challenge: &Bearer, what: &str) -> Result<String, LookupError> {
        let mut query = Vec::new();
        if let Some(s) = &challenge.service {
            query.push(format!("service={}", encode_query(s)));
        }
        let scope = challenge
            .scope
            .clone()
            .unwrap_or_else(|| format!("repository:{}:pull", self.repo));
        query.push(format!("scope={}", encode_query(&scope)));
        let sep = if challenge.realm.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!("{}{sep}{}", challenge.realm, query.join("&"));
        let what = format!("{what}: token from {}", challenge.realm);
        let (status, _, body) = self
            .client
            .get(&url, "application/json", None, &what)
            .await?;
        if status != StatusCode::OK {
            return Err(LookupError::Unauthorized {
                what,
                challenge: format!("the token endpoint answered HTTP {}", status.as_u16()),
            });
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body).map_err(|e| LookupError::Invalid {
            what: what.clone(),
            reason: format!("not a token response: {e}"),
        })?;
        t.token
            .or(t.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or(LookupError::Invalid {
                what,
                reason: "no usable token in the response".into(),
            })
    }

    async fn manifest(&mut self, reference: &str) -> Result<Bytes, LookupError> {
        let accept = [OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].join(", ");
        self.fetch("manifests", reference, &accept).await
    }

    async fn manifest_verified(&mut self, digest: &str) -> Result<Bytes, LookupError> {
        let body = self.manifest(digest).await?;
        verify(
            &body,
            digest,
            &format!("{}/{} manifest", self.authority, self.repo),
        )?;
        Ok(body)
    }

    async fn blob_verified(&mut self, digest: &str) -> Result<Bytes, LookupError> {
        let body = self.fetch("blobs", digest, "").await?;
        verify(
            &body,
            digest,
            &format!("{}/{} config blob", self.authority, self.repo),
        )?;
        Ok(body)
    }

    /// The command of the manifest `body` (named `digest`), narrowed to `arch` if an index.
    async fn command(
        &mut self,
        digest: &str,
        body: &[u8],
        arch: Option<&str>,
    ) -> Result<ImageCommand, LookupError> {
        let what = format!("{}/{} manifest {digest}", self.authority, self.repo);
        let manifest: Manifest =
            serde_json::from_slice(body).map_err(|e| LookupError::Invalid {
                what: what.clone(),
                reason: format!("not an OCI or Docker v2 manifest: {e}"),
            })?;
        match manifest {
            Manifest {
                config: Some(config),
                ..
            } => self.config_command(&config.digest).await,
            Manifest {
                manifests: Some(list),
                ..
            } => {
                let linux: Vec<&Descriptor> = list
                    .iter()
                    .filter(|d| {
                        d.platform
                            .as_ref()
                            .is_some_and(|p| p.os == "linux" && p.architecture != "unknown")
                    })
                    .collect();
                let chosen: Vec<&Descriptor> = match arch {
                    Some(a) => linux
                        .iter()
                        .copied()
                        .filter(|d| d.platform.as_ref().is_some_and(|p| p.architecture == a))
                        .take(1)
                        .collect(),
                    None => linux.clone(),
                };
                if chosen.is_empty() {
                    return Err(LookupError::NoPlatform {
                        arch: arch.unwrap_or("any").to_owned(),
                        available: list.iter().map(platform_name).collect(),
                    });
                }
                let mut seen: Vec<(String, ImageCommand)> = Vec::new();
                for d in chosen {
                    let sub = self.manifest_verified(&d.digest).await?;
                    let m: Manifest =
                        serde_json::from_slice(&sub).map_err(|e| LookupError::Invalid {
                            what: format!("{}/{} manifest {}", self.authority, self.repo, d.digest),
                            reason: format!("not an image manifest: {e}"),
                        })?;
                    let Some(config) = m.config else {
                        return Err(LookupError::Invalid {
                            what: format!("{}/{} manifest {}", self.authority, self.repo, d.digest),
                            reason: "an index inside an index is not supported".into(),
                        });
                    };
                    let found = self.config_command(&config.digest).await?;
                    seen.push((platform_name(d), found));
                }
                if seen.iter().any(|(_, c)| *c != seen[0].1) {
                    return Err(LookupError::PlatformsDisagree {
                        platforms: seen.iter().map(|(p, _)| p.clone()).collect(),
                        commands: seen
                            .iter()
                            .map(|(p, c)| format!("{p}: {}", describe(c)))
                            .collect::<Vec<_>>()
                            .join("; "),
                    });
                }
                Ok(seen.swap_remove(0).1)
            }
            _ => Err(LookupError::Invalid {
                what,
                reason:
                    "neither an image manifest nor an index (schema 1 manifests are not supported)"
                        .into(),
            }),
        }
    }

    async fn config_command(&mut self, digest: &str) -> Result<ImageCommand, LookupError> {
        let body = self.blob_verified(digest).await?;
        #[derive(Deserialize)]
        struct Blob {
            config: Option<Inner>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Inner {
            entrypoint: Option<Vec<String>>,
            cmd: Option<Vec<String>>,
        }
        let blob: Blob = serde_json::from_slice(&body).map_err(|e| LookupError::Invalid {
            what: format!("{}/{} config blob {digest}", self.authority, self.repo),
            reason: format!("not an image config: {e}"),
        })?;
        let inner = blob.config;
        Ok(ImageCommand {
            entrypoint: inner
                .as_ref()
                .and_then(|c| c.entrypoint.clone())
                .unwrap_or_default(),
            cmd: inner.and_then(|c| c.cmd).unwrap_or_default(),
        })
    }
}

#[derive(Deserialize)]
struct Manifest {
    config: Option<Descriptor>,
    manifests: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    variant: Option<String>,
}

fn platform_name(d: &Descriptor) -> String {
    match &d.platform {
        Some(p) => match &p.variant {
            Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
            None => format!("{}/{}", p.os, p.architecture),
        },
        None => "unknown".into(),
    }
}

fn describe(c: &ImageCommand) -> String {
    format!("Entrypoint {:?}, Cmd {:?}", c.entrypoint, c.cmd)
}

fn verify(body: &[u8], digest: &str, what: &str) -> Result<(), LookupError> {
    let Some(want) = digest.strip_prefix("sha256:") else {
        return Err(LookupError::Invalid {
            what: what.into(),
            reason: format!("digest {digest:?} is not sha256; only sha256 is verified"),
        });
    };
    if hex::encode(Sha256::digest(body)) != want {
        return Err(LookupError::DigestMismatch {
            what: what.into(),
            digest: digest.into(),
        });
    }
    Ok(())
}

/// The tag (default `latest`) and the digest of an image reference's suffix.
fn split_suffix(suffix: &str) -> (&str, Option<&str>) {
    let (name, digest) = match suffix.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (suffix, None),
    };
    let tag = name
        .strip_prefix(':')
        .filter(|t| !t.is_empty())
        .unwrap_or("latest");
    (tag, digest)
}

/// A `Bearer realm=...,service=...,scope=...` challenge.
#[derive(Debug, PartialEq, Eq)]
struct Bearer {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

fn parse_bearer(header: &str) -> Option<Bearer> {
    let (scheme, params) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut scope = None;
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], quoted[end + 1..].trim_start())
        } else {
            match after.find(',') {
                Some(i) => (after[..i].trim(), &after[i..]),
                None => (after.trim(), ""),
            }
        };
        match key.as_str() {
            "realm" => realm = Some(value.to_owned()),
            "service" => service = Some(value.to_owned()),
            "scope" => scope = Some(value.to_owned()),
            _ => {}
        }
        rest = next.trim_start_matches(',').trim_start();
    }
    let realm = realm.filter(|r| r.starts_with("https://"))?;
    Some(Bearer {
        realm,
        service,
        scope,
    })
}

fn challenge_scheme(header: Option<&str>) -> String {
    match header.and_then(|h| h.split_whitespace().next()) {
        Some(s) if s.eq_ignore_ascii_case("basic") => BASIC_HINT.into(),
        Some(s) if s.eq_ignore_ascii_case("bearer") => BEARER_HINT.into(),
        Some(s) => format!("scheme {s}"),
        None => "no challenge".into(),
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters, and `:` `/` kept).
fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An `https://host[:port]/path?query` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Url {
    /// `https`, or plain `http` (only for an AWS API endpoint the configuration names).
    pub tls: bool,
    /// `host[:port]`, as sent in `Host`.
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Path and query.
    pub path: String,
}

impl Url {
    /// An `https://` URL.
    fn parse(s: &str) -> Option<Self> {
        Self::parse_with(s, "https://", 443)
    }

    /// An `https://` or `http://` URL: an AWS API endpoint (`AWS_ENDPOINT_URL` may name an
    /// emulator).
    pub(super) fn parse_api(s: &str) -> Option<Self> {
        Self::parse_with(s, "https://", 443).or_else(|| Self::parse_with(s, "http://", 80))
    }

    fn parse_with(s: &str, scheme: &str, default_port: u16) -> Option<Self> {
        let rest = s.strip_prefix(scheme)?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if authority.is_empty() || authority.contains('@') {
            return None;
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            match after.strip_prefix(':') {
                Some(p) => (host, p.parse().ok()?),
                None if after.is_empty() => (host, default_port),
                None => return None,
            }
        } else {
            match authority.split_once(':') {
                Some((h, p)) => (h, p.parse().ok()?),
                None => (authority, default_port),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(Self {
            tls: scheme == "https://",
            authority: authority.to_owned(),
            host: host.to_owned(),
            port,
            path,
        })
    }

    /// `location` (absolute, or a path on this host) from this URL.
    fn join(&self, location: &str) -> Option<Self> {
        if location.starts_with("https://") {
            return Self::parse(location);
        }
        if location.starts_with('/') && !location.starts_with("//") {
            return Some(Self {
                path: location.to_owned(),
                ..self.clone()
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of failure, filled with text a registry (or AWS) chose: the reason the pod's
    /// creator is told keeps none of it, and the log's form keeps all of it.
    #[test]
    fn a_registrys_words_never_reach_the_reason() {
        const W: &str = "MARKER-from-the-registry";
        let image = "registry.example/team/app:1";
        let serde_text = serde_json::from_str::<Manifest>(&format!(r#"{{"config":"{W}"}}"#))
            .err()
            .unwrap()
            .to_string();
        assert!(
            serde_text.contains(W),
            "serde quotes the body: {serde_text}"
        );
        let cases = [
            LookupError::Connect {
                host: format!("{W}.example"),
                reason: format!("TLS: invalid peer certificate {W}"),
            },
            LookupError::Connect {
                host: "registry.example".into(),
                reason: format!("connection reset {W}"),
            },
            LookupError::Status {
                what: format!("registry.example/team/app token from https://{W}/t"),
                status: 500,
            },
            LookupError::Unauthorized {
                what: format!("token from https://{W}/t"),
                challenge: format!("scheme {W}"),
            },
            LookupError::Unauthorized {
                what: "ecr".into(),
                challenge: format!("HTTP 400 {W} (the function's role needs ...)"),
            },
            LookupError::Redirect {
                what: format!("https://{W}/"),
            },
            LookupError::Invalid {
                what: "registry.example/team/app manifest sha256:00".into(),
                reason: format!("not an OCI or Docker v2 manifest: {serde_text}"),
            },
            LookupError::NoPlatform {
                arch: "s390x".into(),
                available: vec!["linux/amd64".into(), format!("linux/{W}")],
            },
            LookupError::PlatformsDisagree {
                platforms: vec!["linux/amd64".into(), format!("{W}/arm64")],
                commands: format!("linux/amd64: Entrypoint [\"{W}\"]"),
            },
        ];
        for e in &cases {
            let reason = e.reason(image);
            assert!(
                !reason.contains(W),
                "{e:?} told the pod's creator: {reason}"
            );
            assert!(
                e.to_string().contains(W),
                "{e:?} lost the detail for the log"
            );
        }
        // What is the webhook's own is kept: the registry it asked, a TLS failure, the
        // platforms Kubernetes knows, the pod's architecture.
        assert!(cases[0].reason(image).contains("TLS failed"));
        assert!(
            cases[1]
                .reason(image)
                .starts_with("cannot reach registry.example")
        );
        assert!(
            cases[7]
                .reason(image)
                .contains("no linux/s390x platform (it has linux/amd64)")
        );
        assert!(
            cases[8]
                .reason(image)
                .contains("platforms (linux/amd64) run different")
        );
        let basic = LookupError::Unauthorized {
            what: "x".into(),
            challenge: challenge_scheme(Some("Basic realm=x")),
        };
        assert!(basic.reason(image).contains(BASIC_HINT));
    }

    #[test]
    fn a_bearer_challenge_is_read_with_quoted_and_bare_values() {
        let b = parse_bearer(r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/python:pull""#).unwrap();
        assert_eq!(b.realm, "https://auth.docker.io/token");
        assert_eq!(b.service.as_deref(), Some("registry.docker.io"));
        assert_eq!(b.scope.as_deref(), Some("repository:library/python:pull"));
        let b = parse_bearer("bearer realm=https://r.example/t, service=r").unwrap();
        assert_eq!(b.realm, "https://r.example/t");
        assert_eq!(b.service.as_deref(), Some("r"));
        assert_eq!(parse_bearer(r#"Basic realm="x""#), None);
        // A token is never asked for over plain HTTP.
        assert_eq!(parse_bearer(r#"Bearer realm="http://r.example/t""#), None);
    }

    #[test]
    fn urls_keep_the_authority_and_resolve_redirects() {
        let u = Url::parse("https://localhost:5000/v2/a/blobs/sha256:x?y=1").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("localhost", 5000));
        assert_eq!(u.path, "/v2/a/blobs/sha256:x?y=1");
        let u = Url::parse("https://public.ecr.aws").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.port, u.path.as_str()),
            ("public.ecr.aws", 443, "/")
        );
        assert_eq!(u.join("/other").unwrap().authority, "public.ecr.aws");
        assert_eq!(u.join("https://cdn.example/x").unwrap().host, "cdn.example");
        assert_eq!(u.join("http://cdn.example/x"), None);
        assert_eq!(u.join("//cdn.example/x"), None);
        assert_eq!(Url::parse("http://x/"), None);
        assert_eq!(Url::parse("https://user@x/"), None);
    }

    #[test]
    fn a_suffix_gives_the_tag_and_digest() {
        let d = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
        assert_eq!(split_suffix(""), ("latest", None));
        assert_eq!(split_suffix(":3.12"), ("3.12", None));
        assert_eq!(split_suffix(&format!("@{d}")), ("latest", Some(d)));
        assert_eq!(split_suffix(&format!(":1@{d}")), ("1", Some(d)));
    }

    #[test]
    fn docker_hub_is_asked_on_its_api_host() {
        assert_eq!(api_authority("docker.io"), "registry-1.docker.io");
        assert_eq!(api_authority("public.ecr.aws"), "public.ecr.aws");
    }

    #[tokio::test]
    async fn an_unlisted_registry_is_never_asked() {
        let client = RegistryClient::new(&EntrypointLookupConfig {
            registries: vec!["public.ecr.aws".into()],
            ..Default::default()
        })
        .unwrap();
        for image in [
            "169.254.169.254/latest/meta-data",
            "127.0.0.1:1/x",
            "python:3.12",
        ] {
            let err = client
                .lookup(&ImageQuery {
                    image: image.into(),
                    arch: None,
                })
                .await
                .unwrap_err();
            assert!(matches!(err, LookupError::NotAllowed(_)), "{image}: {err}");
        }
    }

    #[test]
    fn a_ca_bundle_that_is_not_there_stops_the_start() {
        let err = RegistryClient::new(&EntrypointLookupConfig {
            registries: vec!["r.example".into()],
            ca_bundle_file: "/nonexistent/ca.pem".into(),
            ..Default::default()
        })
        .err()
        .expect("refused");
        assert!(err.0.contains("/nonexistent/ca.pem"), "{err}");
    }
}
