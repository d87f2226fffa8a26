//! The OCI distribution client of [`super`]: `GET /v2/<repo>/manifests/<ref>` (an index is
//! narrowed to the pod's platform), then `GET /v2/<repo>/blobs/<config digest>`, read
//! `config.Entrypoint` and `config.Cmd`.
//!
//! - HTTPS only, on the project's one TLS stack (rustls + ring), trusting the system's roots
//!   and `caBundleFile`, through hyper's pooled client ([`super::http`]): a lookup's requests
//!   to one host share a connection, and its answer is cached.
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

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Method, StatusCode, header};
use moka::sync::Cache;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_rustls::rustls;
use url::Url;

use super::http::{Http, authority};
use podmutator_core::config::EntrypointLookupConfig;
use podmutator_core::image_ref::ImageRef;
use podmutator_core::registry::error::{
    BASIC_HINT, BEARER_HINT, LookupError, MAX_REDIRECTS, api_authority,
};
use podmutator_core::registry::{BoxFuture, EntrypointSource, ImageCommand, ImageQuery};

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
    http: Http,
    /// (registry, repository, tag) -> manifest digest.
    tags: Cache<(String, String, String), String>,
    /// (registry, repository, manifest digest, pinned arch) -> command.
    commands: Cache<(String, String, String, Option<String>), ImageCommand>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Basic credentials for ECR registries, from the function's AWS identity.
    ecr: Option<super::ecr::Ecr>,
}

/// Why the client cannot be built (the extra CA bundle).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub String);

impl RegistryClient {
    /// The client for `config`; reads `caBundleFile` now, so a bad one stops the start.
    pub fn new(config: &EntrypointLookupConfig) -> Result<Self, BuildError> {
        let mut extra_roots = Vec::new();
        let file = &config.ca_bundle_file;
        if !file.is_empty() {
            // A regular file of at most 4 MiB, as every file a configuration names.
            let pem = podmutator_core::config::read_file(file.as_ref())
                .map_err(|e| BuildError(format!("cannot read {file}: {e}")))?;
            extra_roots = rustls_pemfile::certs(&mut pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| BuildError(format!("{file} is not PEM: {e}")))?;
            if extra_roots.is_empty() {
                return Err(BuildError(format!("{file} holds no PEM certificate")));
            }
            // Each must be usable as a root now, not at the first lookup.
            let mut store = rustls::RootCertStore::empty();
            for cert in &extra_roots {
                store.add(cert.clone()).map_err(|e| {
                    BuildError(format!(
                        "{file} holds a certificate that cannot be a root: {e}"
                    ))
                })?;
            }
        }
        Ok(Self {
            config: config.clone(),
            http: Http::new(extra_roots),
            tags: Cache::builder()
                .max_capacity(CACHE_ENTRIES)
                .time_to_live(Duration::from_secs(config.tag_ttl_seconds))
                .build(),
            commands: Cache::builder().max_capacity(CACHE_ENTRIES).build(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            ecr: None,
        })
    }

    /// Reads ECR registries (`<account>.dkr.ecr.<region>.amazonaws.com`) with a token from
    /// `ecr:GetAuthorizationToken`, signed with `aws`'s credentials (loaded on the first ECR
    /// lookup if nothing loaded them before).
    #[must_use]
    pub fn with_ecr(mut self, aws: crate::secretsmanager::SharedAws) -> Self {
        self.ecr = Some(super::ecr::Ecr::new(aws));
        self
    }

    /// Connects to `ip` for `host` instead of asking DNS (`curl --resolve`).
    #[must_use]
    pub fn resolving(mut self, host: &str, ip: std::net::IpAddr) -> Self {
        self.http = self.http.resolving(host, ip);
        self
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
                ecr.token(&self.http, &image.registry, account, region)
                    .await?
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
        let tag_key = (registry.clone(), repo.clone(), tag.to_owned());
        let cached = digest
            .map(str::to_owned)
            .or_else(|| self.tags.get(&tag_key));
        let digest = match cached {
            Some(d) => d,
            None => {
                let body = session.manifest(tag).await?;
                let d = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
                self.tags.insert(tag_key, d.clone());
                by_tag = Some(body);
                d
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

    /// One GET, following redirects (HTTPS only); the status, the `WWW-Authenticate` header and
    /// the body.
    async fn get(
        &self,
        url: &str,
        accept: &str,
        auth: Option<&str>,
        what: &str,
    ) -> Result<(StatusCode, Option<String>, Bytes), LookupError> {
        let mut url = Url::parse(url)
            .ok()
            .filter(is_https)
            .ok_or_else(|| LookupError::Redirect { what: what.into() })?;
        let origin = authority(&url);
        for _ in 0..=MAX_REDIRECTS {
            let mut headers = Vec::new();
            if !accept.is_empty() {
                headers.push((header::ACCEPT, accept.to_owned()));
            }
            // The registry's credentials never leave its host.
            if let Some(a) = auth.filter(|_| authority(&url) == origin) {
                headers.push((header::AUTHORIZATION, a.to_owned()));
            }
            let answer = self
                .http
                .send(Method::GET, &url, &headers, Bytes::new(), what)
                .await?;
            if answer.status.is_redirection() {
                url = answer
                    .location
                    .and_then(|l: String| url.join(&l).ok())
                    .filter(is_https)
                    .ok_or_else(|| LookupError::Redirect { what: what.into() })?;
                continue;
            }
            return Ok((answer.status, answer.challenge, answer.body));
        }
        Err(LookupError::Redirect { what: what.into() })
    }
}

/// Registries and where they send a lookup: `https://`, a host, no user information.
fn is_https(url: &Url) -> bool {
    url.scheme() == "https"
        && url.host_str().is_some_and(|h| !h.is_empty())
        && url.username().is_empty()
        && url.password().is_none()
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
            tokio::time::timeout(timeout, run)
                .await
                .unwrap_or(Err(LookupError::Timeout(self.config.timeout_ms)))
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
    /// `<registry>/<repo> <thing>`, as an error names what it was about.
    fn what(&self, thing: &str) -> String {
        format!("{}/{} {thing}", self.authority, self.repo)
    }

    /// GET under `/v2/<repo>/`, answering one Bearer challenge.
    async fn fetch(
        &mut self,
        kind: &str,
        reference: &str,
        accept: &str,
    ) -> Result<Bytes, LookupError> {
        let (authority, repo) = (&self.authority, &self.repo);
        let url = format!("https://{authority}/v2/{repo}/{kind}/{reference}");
        let what = self.what(&format!("{kind} {reference}"));
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
        verify(body, digest, &self.what("manifest"))
    }

    /// The command of the manifest `body` (named `digest`), narrowed to `arch` if an index.
    async fn command(
        &mut self,
        digest: &str,
        body: &[u8],
        arch: Option<&str>,
    ) -> Result<ImageCommand, LookupError> {
        let what = self.what(&format!("manifest {digest}"));
        let manifest: Manifest =
            serde_json::from_slice(body).map_err(|e| LookupError::Invalid {
                what: what.clone(),
                reason: format!("not an OCI or Docker v2 manifest: {e}"),
            })?;
        match (manifest.config, manifest.manifests) {
            (Some(config), _) => self.config_command(&config.digest).await,
            (None, Some(list)) => {
                let mut chosen: Vec<&Descriptor> = list
                    .iter()
                    .filter(|d| {
                        d.platform
                            .as_ref()
                            .is_some_and(|p| p.os == "linux" && p.architecture != "unknown")
                    })
                    .collect();
                if let Some(a) = arch {
                    chosen.retain(|d| d.platform.as_ref().is_some_and(|p| p.architecture == a));
                    chosen.truncate(1);
                }
                if chosen.is_empty() {
                    return Err(LookupError::NoPlatform {
                        arch: arch.unwrap_or("any").to_owned(),
                        available: list.iter().map(platform_name).collect(),
                    });
                }
                let mut seen: Vec<(String, ImageCommand)> = Vec::new();
                for d in chosen {
                    let sub = self.manifest_verified(&d.digest).await?;
                    let invalid = |reason| LookupError::Invalid {
                        what: self.what(&format!("manifest {}", d.digest)),
                        reason,
                    };
                    let m: Manifest = serde_json::from_slice(&sub)
                        .map_err(|e| invalid(format!("not an image manifest: {e}")))?;
                    let Some(config) = m.config else {
                        return Err(invalid("an index inside an index is not supported".into()));
                    };
                    let found = self.config_command(&config.digest).await?;
                    seen.push((platform_name(d), found));
                }
                if seen.iter().any(|(_, c)| *c != seen[0].1) {
                    return Err(LookupError::PlatformsDisagree {
                        platforms: seen.iter().map(|(p, _)| p.clone()).collect(),
                        commands: seen
                            .iter()
                            .map(|(p, c)| {
                                format!("{p}: Entrypoint {:?}, Cmd {:?}", c.entrypoint, c.cmd)
                            })
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
        let body = self.fetch("blobs", digest, "").await?;
        let body = verify(body, digest, &self.what("config blob"))?;
        #[derive(Deserialize)]
        struct Blob {
            config: Option<Inner>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase")]
        struct Inner {
            entrypoint: Option<Vec<String>>,
            cmd: Option<Vec<String>>,
        }
        let blob: Blob = serde_json::from_slice(&body).map_err(|e| LookupError::Invalid {
            what: self.what(&format!("config blob {digest}")),
            reason: format!("not an image config: {e}"),
        })?;
        let inner = blob.config.unwrap_or_default();
        Ok(ImageCommand {
            entrypoint: inner.entrypoint.unwrap_or_default(),
            cmd: inner.cmd.unwrap_or_default(),
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

/// `body`, once its sha256 is `digest`.
fn verify(body: Bytes, digest: &str, what: &str) -> Result<Bytes, LookupError> {
    let Some(want) = digest.strip_prefix("sha256:") else {
        return Err(LookupError::Invalid {
            what: what.into(),
            reason: format!("digest {digest:?} is not sha256; only sha256 is verified"),
        });
    };
    if hex::encode(Sha256::digest(&body)) != want {
        return Err(LookupError::DigestMismatch {
            what: what.into(),
            digest: digest.into(),
        });
    }
    Ok(body)
}

/// The tag (default `latest`) and the digest of an image reference's suffix.
fn split_suffix(suffix: &str) -> (&str, Option<&str>) {
    let (name, digest) = suffix
        .split_once('@')
        .map_or((suffix, None), |(n, d)| (n, Some(d)));
    let tag = name
        .strip_prefix(':')
        .filter(|t| !t.is_empty())
        .unwrap_or("latest");
    (tag, digest)
}

/// A `Bearer realm=...,service=...,scope=...` challenge.
#[derive(Debug, Default, PartialEq, Eq)]
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
    let mut bearer = Bearer::default();
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
            "realm" => bearer.realm = value.to_owned(),
            "service" => bearer.service = Some(value.to_owned()),
            "scope" => bearer.scope = Some(value.to_owned()),
            _ => {}
        }
        rest = next.trim_start_matches(',').trim_start();
    }
    bearer.realm.starts_with("https://").then_some(bearer)
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
    s.bytes()
        .map(|b| match b {
            b if b.is_ascii_alphanumeric() || b"-._~:/".contains(&b) => char::from(b).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
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
        let url = |s: &str| Url::parse(s).unwrap();
        let u = url("https://localhost:5000/v2/a/blobs/sha256:x?y=1");
        assert_eq!(authority(&u), "localhost:5000");
        assert_eq!(authority(&url("https://public.ecr.aws")), "public.ecr.aws");
        assert_eq!(
            authority(&url("https://public.ecr.aws:443/")),
            "public.ecr.aws"
        );
        assert_eq!(authority(&url("https://[::1]:5000/")), "[::1]:5000");
        // Where a redirect may go: a path on the host, or another HTTPS host without the
        // registry's credentials (the caller compares authorities).
        let next = |l: &str| u.join(l).ok().filter(is_https);
        assert_eq!(authority(&next("/other").unwrap()), "localhost:5000");
        assert_eq!(
            authority(&next("https://cdn.example/x").unwrap()),
            "cdn.example"
        );
        assert_eq!(authority(&next("//cdn.example/x").unwrap()), "cdn.example");
        assert_eq!(next("http://cdn.example/x"), None);
        assert_eq!(next("https://user@cdn.example/x"), None);
        assert_eq!(next("https://:pw@cdn.example/x"), None);
        assert_eq!(next("file:///etc/passwd"), None);
        assert!(!is_https(&url("http://x/")));
        assert!(!is_https(&url("https://user@x/")));
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

    /// Read like every file a configuration names: a device or a FIFO is refused unread.
    #[test]
    fn a_ca_bundle_that_is_no_regular_file_is_refused_unread() {
        let err = RegistryClient::new(&EntrypointLookupConfig {
            registries: vec!["r.example".into()],
            ca_bundle_file: "/dev/zero".into(),
            ..Default::default()
        })
        .err()
        .expect("refused");
        assert!(err.0.contains("not a regular file"), "{err}");
    }
}
