//! Routing shared by the Lambda adapter and the HTTPS server: path token, paths, methods,
//! content type and the body limit. [`Front::route`] decides from the request line and
//! headers alone, so a caller without the token is answered before its body is read. Every
//! answer is JSON.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use podmutator_core::admission::{API_VERSION_V1, Answer, Reply, ReplyLimit};
use podmutator_core::app::App;
use podmutator_core::config::{ConfigError, HttpConfig, check_path_token};
use podmutator_core::error::Error;
use podmutator_core::metrics::now_ms;
use podmutator_core::mutate::Route;

/// Flyte's path for the core Pod kind (`/mutate-` + group + `-` + version + `-` + kind).
pub const PATH_SECRETS: &str = "/mutate--v1-pod";
pub const PATH_MANAGED_POD: &str = "/mutate/managed-pod";
pub const PATH_MANAGED_NAMESPACE: &str = "/mutate/managed-namespace";
/// The Union fork's image-builder path (Flyte's pod path plus `/<mutatorID>`).
pub const PATH_IMAGE_BUILDER: &str = "/mutate--v1-pod/image-builder";
/// The registry rewrite rules' entry.
pub const PATH_IMAGES: &str = "/mutate/images";
pub const PATH_HEALTHZ: &str = "/healthz";

/// Each route's path.
pub const ROUTES: [(&str, Route); 5] = [
    (PATH_SECRETS, Route::Secrets),
    (PATH_MANAGED_POD, Route::ManagedPod),
    (PATH_MANAGED_NAMESPACE, Route::ManagedNamespace),
    (PATH_IMAGE_BUILDER, Route::ImageBuilder),
    (PATH_IMAGES, Route::Images),
];

/// The parts of an HTTP request the webhook looks at.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub method: &'a str,
    /// Path without query string (the API server appends `?timeout=10s`).
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

/// The path token as the front holds it: only its SHA-256, so the token itself need not be in
/// the function's configuration, and a cold start reads nothing to learn it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

impl TokenHash {
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }
}

podmutator_core::named_enum! {
    /// Why a request was answered from its head, before the app saw it: the refusals a token
    /// mismatch after a rotation, a wrong registration or a scanner produce. Its name is the log
    /// field's value and the metric's `Refusal` dimension.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Refusal as as_str {
        /// No path token, or not one of the accepted ones (404).
        PathToken = "PathToken",
        /// The token matched, the path did not (404).
        NotFound = "NotFound",
        /// A route asked with the wrong method (405).
        Method = "Method",
        /// A review that is not `application/json` (400).
        ContentType = "ContentType",
        /// A body over `http.maxBodyBytes` (400).
        BodyTooLarge = "BodyTooLarge",
        /// `serve`: a body whose read failed partway for another reason than its size: the
        /// client's connection ended or failed mid-body, or a malformed chunk (400).
        BodyReadFailed = "BodyReadFailed",
        /// `serve`: a TLS handshake that failed, most often a client (the API server) that does
        /// not trust the serving certificate's CA.
        TlsHandshake = "TlsHandshake",
    }
}

/// How often each kind of refusal is logged and counted at most: a flood of wrong-token
/// requests must not become a flood of log lines (CloudWatch bills each), yet the first one
/// after a quiet spell must show at once, and what a window held is reported when it ends
/// ([`Front::flush_refusals`]).
pub const REFUSAL_SAMPLE_MS: u64 = 10_000;

/// What a refusal's line says besides its kind and count: of the last refusal of that kind.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The caller: the socket's peer (`serve`), or the source address the load balancer or API
    /// Gateway reports (Lambda).
    peer: Option<String>,
    method: String,
    /// What follows the token, never the token or a guess at it.
    path: Option<String>,
    /// The error of a failed TLS handshake or body read.
    error: Option<String>,
    /// What a failed TLS handshake most likely means, by how it failed.
    hint: &'static str,
}

/// Per kind of refusal: when it was last reported, how many happened since, and the last one.
#[derive(Default)]
struct RefusalLog {
    last_ms: [std::sync::atomic::AtomicU64; Refusal::ALL.len()],
    pending: [std::sync::atomic::AtomicU64; Refusal::ALL.len()],
    seen: std::sync::Mutex<[Option<Seen>; Refusal::ALL.len()]>,
}

/// A review weighing at most this fraction of `limits.maxObjectsPerReview` is an ordinary one
/// for [`Front::review_in_budget`] (1,562 at the default: a review of some 100 KB).
pub const ORDINARY_SHARE: usize = 64;

/// The transport's gate in front of the app.
pub struct Front {
    app: Arc<App>,
    max_body_bytes: usize,
    /// Every token accepted (empty: none asked for). More than one during a rotation.
    tokens: Vec<TokenHash>,
    /// `http.acceptPlainPaths`: the plain paths answered too, while a registration switches
    /// to the token.
    accept_plain: bool,
    refusals: RefusalLog,
    /// [`Front::review_in_budget`]'s budget: one review's worth of objects for large reviews,
    /// and a quarter of that for ordinary ones, in a queue of their own.
    large: tokio::sync::Semaphore,
    ordinary: tokio::sync::Semaphore,
    /// Reviews waiting for their share of it.
    waiting: std::sync::atomic::AtomicUsize,
}

/// `{"message":"<text>"}` with `status`.
pub(crate) fn message(status: u16, text: &str) -> Reply {
    Reply {
        status,
        body: serde_json::json!({ "message": text })
            .to_string()
            .into_bytes(),
    }
}

/// A `/healthz` body, `{"message":"<text>","version":"<version>"}`, so a probe or a curl also
/// says which release is answering (this port's and the metrics port's).
pub(crate) fn health(text: &str) -> Vec<u8> {
    serde_json::json!({ "message": text, "version": podmutator_core::metrics::VERSION })
        .to_string()
        .into_bytes()
}

/// The 400 for a request that is not an AdmissionReview this webhook can read.
pub(crate) fn invalid(text: String) -> Answer {
    Answer::error(&Error::Invalid(text), "", API_VERSION_V1)
}

/// Where a request goes, decided before its body is read.
#[derive(Debug)]
pub enum Routed {
    /// An AdmissionReview for this route: read the body (at most `max_body_bytes`) and admit.
    Review(Route),
    /// Answered already (health check, unknown path, wrong method or content type).
    Answer(Reply),
}

impl Front {
    /// The front for `app` with `http`'s body limit and path token. `fetched_token` is a token
    /// read at start from `http.pathTokenSecretId`, if that is how it was configured.
    pub fn new(
        app: Arc<App>,
        http: &HttpConfig,
        fetched_token: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let tokens = match (&http.path_token, &http.path_token_sha256, fetched_token) {
            (Some(t), _, _) => vec![TokenHash::of(t)],
            // `http.pathTokenSha256`, parsed as the configuration was read.
            (None, Some(hashes), _) => hashes.as_slice().iter().map(|h| TokenHash(h.0)).collect(),
            (None, None, Some(t)) => {
                check_path_token("http.pathTokenSecretId", t)?;
                vec![TokenHash::of(t)]
            }
            (None, None, None) => Vec::new(),
        };
        Ok(Self {
            max_body_bytes: http.max_body_bytes,
            tokens,
            accept_plain: http.accept_plain_paths,
            refusals: RefusalLog::default(),
            large: tokio::sync::Semaphore::new(app.max_objects()),
            ordinary: tokio::sync::Semaphore::new((app.max_objects() / 4).max(1)),
            waiting: Default::default(),
            app,
        })
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// Strips the path token, if one is configured; `None` means "not found". With
    /// `http.acceptPlainPaths`, a path the token does not open is taken as it is.
    fn route_path<'a>(&self, path: &'a str) -> Option<&'a str> {
        if self.tokens.is_empty() {
            return Some(path);
        }
        self.token_tail(path).or(self.accept_plain.then_some(path))
    }

    /// What follows the path's first segment when that segment is an accepted token.
    fn token_tail<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path.strip_prefix('/')?;
        let (given, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        // No token is no token, whatever hash was configured (the gate refuses the empty
        // string's; this holds if one got past it).
        if given.is_empty() {
            return None;
        }
        // Every accepted token is compared, in constant time, so the time taken says neither
        // which one matched nor how much of a guess was right.
        let given = Sha256::digest(given.as_bytes());
        let matched = self.tokens.iter().fold(subtle::Choice::from(0), |any, t| {
            any | given.as_slice().ct_eq(&t.0)
        });
        bool::from(matched).then_some(tail)
    }

    /// Records a refusal: counted always (the Prometheus counter too); logged (a WARN line) and
    /// reported (an EMF line with the count since the last one) at once when its kind was quiet
    /// for [`REFUSAL_SAMPLE_MS`], else when the window ends ([`Front::flush_refusals`]). `path`
    /// is what follows the token, never the token or a guess at it.
    pub fn refused(&self, kind: Refusal, peer: Option<&str>, method: &str, path: Option<&str>) {
        self.record(
            kind,
            Seen {
                peer: peer.map(str::to_owned),
                method: method.to_owned(),
                path: path.map(str::to_owned),
                ..Seen::default()
            },
        );
    }

    /// Records a failed TLS handshake (`serve`) as [`Front::refused`] records a refusal: an API
    /// server that does not trust the certificate fails every call, and its operator must see
    /// why at the default level.
    pub fn tls_failed(&self, peer: SocketAddr, error: &dyn Display, hint: &'static str) {
        self.record(
            Refusal::TlsHandshake,
            Seen {
                peer: Some(peer.to_string()),
                error: Some(error.to_string()),
                hint,
                ..Seen::default()
            },
        );
    }

    fn record(&self, kind: Refusal, seen: Seen) {
        let i = Refusal::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        // Every refusal, unsampled: the counter is read by scraping, not written as a line.
        self.app.counters().refused(kind.as_str());
        self.refusals.pending[i].fetch_add(1, Relaxed);
        self.lock_seen()[i] = Some(seen);
        let last = self.refusals.last_ms[i].load(Relaxed);
        if last == 0 || now_ms().saturating_sub(last) >= REFUSAL_SAMPLE_MS {
            self.report(i, last);
        }
    }

    fn lock_seen(&self) -> std::sync::MutexGuard<'_, [Option<Seen>; Refusal::ALL.len()]> {
        // The last refusal of each kind, for its line: a panic elsewhere cannot leave it torn.
        super::unpoisoned(self.refusals.seen.lock())
    }

    /// Reports what kind `i` holds since its last report (`last`, in ms), unless another caller
    /// did since: one WARN line and one EMF line with the count.
    fn report(&self, i: usize, last: u64) {
        if self.refusals.last_ms[i]
            .compare_exchange(last, now_ms().max(1), Relaxed, Relaxed)
            .is_err()
        {
            return; // another caller is reporting this window
        }
        let count = self.refusals.pending[i].swap(0, Relaxed);
        if count == 0 {
            return;
        }
        let kind = Refusal::ALL[i];
        let seen = self.lock_seen()[i].clone().unwrap_or_default();
        let peer = seen.peer.as_deref().unwrap_or("<unknown>");
        let sample_seconds = REFUSAL_SAMPLE_MS / 1000;
        match kind {
            Refusal::TlsHandshake => tracing::warn!(
                refusal = kind.as_str(),
                count,
                peer,
                error = seen.error.as_deref().unwrap_or_default(),
                sample_seconds,
                "tls handshake failed: {}",
                seen.hint
            ),
            _ => tracing::warn!(
                refusal = kind.as_str(),
                count,
                peer,
                method = seen.method,
                path = seen
                    .path
                    .as_deref()
                    .unwrap_or("<withheld: it would hold the token>"),
                error = seen.error.as_deref(),
                sample_seconds,
                "request refused before the admission"
            ),
        }
        if let Some(m) = self.app.metrics() {
            m.emit_refusals(kind.as_str(), count);
        }
    }

    /// Reports the refusals counted and not yet reported: every kind whose window has ended,
    /// or with `all` every kind. `serve` calls it every [`REFUSAL_SAMPLE_MS`], so a burst's
    /// count is reported when its window ends rather than at the next refusal of its kind; the
    /// Lambda adapter calls it with `all` at the end of each invocation, before the instance
    /// can be frozen or recycled with counts in memory.
    pub fn flush_refusals(&self, all: bool) {
        for i in 0..Refusal::ALL.len() {
            if self.refusals.pending[i].load(Relaxed) == 0 {
                continue;
            }
            let last = self.refusals.last_ms[i].load(Relaxed);
            if all || now_ms().saturating_sub(last) >= REFUSAL_SAMPLE_MS {
                self.report(i, last);
            }
        }
    }

    /// The 400 for a body over `http.maxBodyBytes`, recorded as a refusal.
    pub fn body_too_large(&self, peer: Option<&str>, method: &str) -> Answer {
        self.refused(Refusal::BodyTooLarge, peer, method, None);
        invalid(format!(
            "body is over the {}-byte limit (http.maxBodyBytes); a Pod AdmissionReview is normally a few kilobytes",
            self.max_body_bytes
        ))
    }

    /// The 400 for a body whose read failed partway for another reason than its size (the
    /// client's connection ended or failed mid-body, a malformed chunk), recorded as a refusal
    /// with the error.
    pub fn body_read_failed(
        &self,
        peer: Option<&str>,
        method: &str,
        error: &dyn Display,
    ) -> Answer {
        let error = error.to_string();
        self.record(
            Refusal::BodyReadFailed,
            Seen {
                peer: peer.map(str::to_owned),
                method: method.to_owned(),
                error: Some(error.clone()),
                ..Seen::default()
            },
        );
        invalid(format!("the request body could not be read: {error}"))
    }

    /// Decides from the request line and headers alone; `peer` is the caller, for the lines
    /// of a refusal.
    pub fn route(
        &self,
        peer: Option<&str>,
        method: &str,
        path: &str,
        content_type: Option<&str>,
    ) -> Routed {
        let Some(path) = self.route_path(path) else {
            // An ALB's health check asks for /healthz without the token (its path is no
            // secret) and takes this 404 as healthy: no refusal, or the path-token alarm
            // would never clear.
            if path != PATH_HEALTHZ || !matches!(method, "GET" | "HEAD") {
                self.refused(Refusal::PathToken, peer, method, None);
            }
            return Routed::Answer(message(404, "not found"));
        };
        if path == PATH_HEALTHZ {
            return Routed::Answer(match method {
                "GET" | "HEAD" => Reply {
                    status: 200,
                    body: health("ok"),
                },
                _ => message(405, "method not allowed: use GET for /healthz"),
            });
        }
        let Some(&(_, route)) = ROUTES.iter().find(|(p, _)| *p == path) else {
            self.refused(Refusal::NotFound, peer, method, Some(path));
            return Routed::Answer(message(404, "not found"));
        };
        if method != "POST" {
            self.refused(Refusal::Method, peer, method, Some(path));
            return Routed::Answer(message(
                405,
                "method not allowed: the API server POSTs AdmissionReviews to this path",
            ));
        }
        let is_json = content_type.is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
        });
        if !is_json {
            self.refused(Refusal::ContentType, peer, method, Some(path));
            return Routed::Answer(
                invalid(format!(
                    "content-type must be application/json, got {}",
                    content_type.map_or_else(|| "none".to_owned(), |c| format!("{c:?}"))
                ))
                .into(),
            );
        }
        Routed::Review(route)
    }

    /// Admits a body that arrived by `route`, within the body limit.
    pub async fn review(&self, route: Route, body: &[u8]) -> Answer {
        self.review_within(route, body, None).await
    }

    /// [`Front::review`] within an admission budget, for a server that answers many reviews at
    /// once (`serve`). An admission is CPU work and holds its pod's types and its reply in
    /// memory, about 1 KB per unit of [`App::weight`] (one review of 90,000 environment
    /// variables took 100 MB more): without a budget, a few of the largest reviews at once
    /// exceed a replica's memory limit and hold every worker of its runtime. Large reviews
    /// (over 1/[`ORDINARY_SHARE`] of `limits.maxObjectsPerReview`) admitted at the same time
    /// weigh together at most what one review may; ordinary ones (a few hundred: every pod the
    /// API server sends in practice) a quarter of that, in a queue of their own, so a queue of
    /// large reviews never holds up the ordinary ones. Each waits for its share, first come
    /// first served within its queue.
    pub async fn review_in_budget(&self, route: Route, body: &[u8]) -> Answer {
        /// Counts a review as waiting until it has its share, or is given up (a timeout).
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Relaxed);
            }
        }
        let weight = self.app.weight(body);
        let lane = if weight <= self.app.max_objects() / ORDINARY_SHARE {
            &self.ordinary
        } else {
            &self.large
        };
        let weight = u32::try_from(weight).unwrap_or(u32::MAX);
        self.waiting.fetch_add(1, Relaxed);
        let waiting = Waiting(&self.waiting);
        // Held until the review is answered.
        let _share = lane.acquire_many(weight).await;
        drop(waiting);
        self.review(route, body).await
    }

    /// Reviews waiting for their share of the admission budget ([`Front::review_in_budget`]).
    pub fn admissions_waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// [`Front::review`] for a path back whose own limit on the reply is `limit` (`None`: the
    /// app's own).
    pub async fn review_within(
        &self,
        route: Route,
        body: &[u8],
        limit: Option<ReplyLimit>,
    ) -> Answer {
        if body.len() > self.max_body_bytes {
            return self.body_too_large(None, "POST");
        }
        self.app.review_within(route, body, limit).await
    }

    /// [`Front::route`], then [`Front::review`]: for a caller that holds the whole request.
    pub async fn handle(&self, req: Incoming<'_>) -> Reply {
        match self.route(None, req.method, req.path, req.content_type) {
            Routed::Answer(reply) => reply,
            Routed::Review(route) => self.review(route, req.body).await.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podmutator_core::app::Deps;
    use podmutator_core::config::{Config, Sha256Hex};

    fn front(token: &str) -> Front {
        let config = Config::default();
        let app = Arc::new(App::build(&config, Deps::offline()));
        let http = HttpConfig {
            path_token: Some(token.into()),
            ..HttpConfig::default()
        };
        Front::new(app, &http, None).unwrap()
    }

    impl TokenHash {
        fn matches(&self, given: &str) -> bool {
            Sha256::digest(given.as_bytes())
                .as_slice()
                .ct_eq(&self.0)
                .into()
        }
    }

    #[test]
    fn token_comparison_requires_the_whole_token() {
        let hash = TokenHash::of("abc");
        assert!(hash.matches("abc"));
        assert!(!hash.matches("abd"));
        assert!(!hash.matches("ab"));
        assert!(!hash.matches(""));
    }

    #[test]
    fn a_hash_from_config_matches_its_token() {
        let hex = hex::encode(Sha256::digest(b"t0k3n"));
        let hash = TokenHash(Sha256Hex::parse(&hex).unwrap().0);
        assert!(hash.matches("t0k3n"));
        assert!(!hash.matches("t0k3m"));
    }

    #[test]
    fn path_token_is_stripped_or_the_path_is_not_found() {
        let front = front("t0k3n");
        assert_eq!(
            front.route_path("/t0k3n/mutate--v1-pod"),
            Some("/mutate--v1-pod")
        );
        assert_eq!(front.route_path("/mutate--v1-pod"), None);
        assert_eq!(front.route_path("/t0k3nX/mutate--v1-pod"), None);
        assert_eq!(front.route_path("/t0k3n"), Some(""));
    }

    #[test]
    fn plain_paths_are_answered_beside_the_token_only_while_asked_for() {
        let token = "t0k3n".repeat(8);
        let http = |accept_plain_paths| HttpConfig {
            path_token: Some(token.clone()),
            accept_plain_paths,
            ..HttpConfig::default()
        };
        let app = Arc::new(App::build(&Config::default(), Deps::offline()));
        let switching = Front::new(app.clone(), &http(true), None).unwrap();
        let tokened = format!("/{token}/mutate--v1-pod");
        assert_eq!(switching.route_path(&tokened), Some("/mutate--v1-pod"));
        assert_eq!(
            switching.route_path("/mutate--v1-pod"),
            Some("/mutate--v1-pod")
        );
        // A wrong token is not stripped: what follows it is no route.
        assert_eq!(
            switching.route_path("/wrong/mutate--v1-pod"),
            Some("/wrong/mutate--v1-pod")
        );
        let Routed::Answer(reply) = switching.route(None, "POST", "/wrong/mutate--v1-pod", None)
        else {
            panic!("a wrong token's path is answered from the head");
        };
        assert_eq!(reply.status, 404);
        let after = Front::new(app, &http(false), None).unwrap();
        assert_eq!(after.route_path(&tokened), Some("/mutate--v1-pod"));
        assert_eq!(after.route_path("/mutate--v1-pod"), None);
    }

    /// An ALB's health check (GET /healthz, no token) gets the 404 it takes as healthy, and is
    /// no path-token refusal; anything else without the token is one.
    #[test]
    fn a_health_check_without_the_token_is_no_refusal() {
        let front = front("t0k3n");
        let refusals = || {
            let text = front.app().counters().render();
            text.lines()
                .find_map(|l| l.strip_prefix("podmutator_refusals_total{refusal=\"PathToken\"} "))
                .map_or(0, |n| n.parse::<u64>().unwrap())
        };
        for method in ["GET", "HEAD"] {
            let Routed::Answer(reply) = front.route(None, method, "/healthz", None) else {
                panic!("{method} /healthz is answered from the head");
            };
            assert_eq!(reply.status, 404);
        }
        assert_eq!(refusals(), 0);
        for (method, path) in [
            ("POST", "/healthz"),
            ("POST", "/mutate--v1-pod"),
            ("GET", "/"),
        ] {
            let Routed::Answer(reply) = front.route(None, method, path, None) else {
                panic!("{method} {path} is answered from the head");
            };
            assert_eq!(reply.status, 404);
        }
        assert_eq!(refusals(), 3);
    }

    #[test]
    fn healthz_answers_ok_with_the_version() {
        let front = front("t0k3n");
        for method in ["GET", "HEAD"] {
            let Routed::Answer(reply) = front.route(None, method, "/t0k3n/healthz", None) else {
                panic!("{method} /healthz is answered from the head");
            };
            assert_eq!(reply.status, 200);
            let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"message": "ok", "version": env!("CARGO_PKG_VERSION")})
            );
        }
    }
}
