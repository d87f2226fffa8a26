//! `http`: podmutator's HTTP front (the path token, body and reply limits) and `serve`'s
//! connection bounds.

use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use super::{ConfigError, bounds};

/// Default body limit: Lambda's synchronous payload limit (6 MB); an AdmissionReview for a Pod
/// is bounded by etcd's object size (1.5 MiB) well below it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 6 * 1024 * 1024;

/// Default reply limit of `serve` (and `inject`): Lambda's 6 MB, so a configuration answers the
/// same pods on both.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 6 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpConfig {
    /// Address `podmutator serve` binds (with `webhook.listenPort`): all interfaces by default,
    /// as a server behind a Kubernetes Service needs; `127.0.0.1` keeps a local run on loopback.
    #[default(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED))]
    pub listen_address: std::net::IpAddr,
    #[default(DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// The largest reply `podmutator serve` and `inject` build; a review whose reply would be
    /// larger is refused (413) from an estimate made before the patch is built. On Lambda the
    /// path back's own limit applies instead (an ALB's 1 MB, Lambda's 6 MB).
    #[default(DEFAULT_MAX_REPLY_BYTES)]
    pub max_reply_bytes: usize,
    /// A literal path token (for local testing); every route then lives under `/<token>/`.
    pub path_token: Option<String>,
    /// The SHA-256 of the path token, as 64 hex digits: the function holds only this, so a
    /// cold start reads nothing (what Terraform and SAM configure). A list accepts each of its
    /// tokens (the current one and, during a rotation, the previous).
    pub path_token_sha256: Option<TokenHashes>,
    /// Secrets Manager id of the path token, read once at cold start (one network call before
    /// the first answer; prefer `pathTokenSha256`).
    pub path_token_secret_id: Option<String>,
    /// Serving without any path token must be asked for: then anyone who reaches the endpoint
    /// can send reviews (and, in Embedded value mode, read secrets). `podmutator serve` and the
    /// Lambda refuse to start without a token unless this is true, and warn when it is.
    pub path_token_disabled: bool,
    /// While a registration switches from plain paths to a path token: the plain paths are
    /// answered beside the token's, so replicas that hold the token and a registration that
    /// does not yet agree. Needs a path token; the token keeps no one out while this is true.
    pub accept_plain_paths: bool,
    /// `podmutator serve`: connections open at once. When full, one is closed to make room:
    /// one that never sent a request, else the idlest, else the one whose body has arrived
    /// least; never one whose request is wholly read and being answered.
    #[default(1024)]
    pub max_connections: usize,
    /// `podmutator serve`: connections open at once from one source address.
    #[default(32)]
    pub max_connections_per_source: usize,
    /// `podmutator serve`: time from accept until the first request head, TLS handshake included.
    #[default(10)]
    pub first_request_timeout_seconds: u64,
    /// `podmutator serve`: time for a request's body to arrive once its head has.
    #[default(5)]
    pub body_timeout_seconds: u64,
    /// `podmutator serve`: on SIGTERM, how long readiness fails while the webhook port still
    /// answers, before the listeners stop: the time the endpoint's removal takes to reach
    /// every API server (kube-proxy, EndpointSlices). 0 stops at once.
    #[default(10)]
    pub drain_seconds: u64,
    /// `podmutator serve`: how long a connection may stay open with no request in flight.
    #[default(60)]
    pub idle_timeout_seconds: u64,
    /// `podmutator serve`: age at which a connection is closed gracefully (HTTP/2 GOAWAY).
    #[default(600)]
    pub max_connection_age_seconds: u64,
    /// `podmutator serve`: a PEM file of the CA certificates whose client certificates the
    /// webhook port requires: every caller must present one (the API server, through its
    /// admission configuration's kubeconfig). What lets `serve` write Embedded values into
    /// its replies; unset, it refuses value delivery at start.
    pub client_ca_file: Option<String>,
}

/// The SHA-256 of the empty string: the hash a missing or empty token file gives.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// What `http.pathTokenSha256` must hold.
const HASH_FORMAT: &str =
    "must be the SHA-256 of the path token as 64 hex digits (`printf %s \"$TOKEN\" | sha256sum`)";

/// A SHA-256 digest, written as 64 hex digits and parsed as the configuration is read: nothing
/// after the gate reads hex.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sha256Hex(pub [u8; 32]);

impl Sha256Hex {
    /// 64 hex digits (either case), or `None`.
    pub fn parse(hex_digits: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut out).ok()?;
        Some(Self(out))
    }
}

impl std::fmt::Debug for Sha256Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for Sha256Hex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).ok_or_else(|| serde::de::Error::custom(HASH_FORMAT))
    }
}

/// `http.pathTokenSha256`: one hash, or a list of them (current first, then previous).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum TokenHashes {
    One(#[cfg_attr(feature = "schema", schemars(with = "String"))] Sha256Hex),
    Many(#[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))] Vec<Sha256Hex>),
}

/// A string or a list, each hash's error at its own key (`http.pathTokenSha256[1]`), which
/// `untagged` would lose.
impl<'de> Deserialize<'de> for TokenHashes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Hashes;
        impl<'de> serde::de::Visitor<'de> for Hashes {
            type Value = TokenHashes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a SHA-256 as 64 hex digits, or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<TokenHashes, E> {
                Sha256Hex::parse(s)
                    .map(TokenHashes::One)
                    .ok_or_else(|| E::custom(HASH_FORMAT))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<TokenHashes, A::Error> {
                let all = std::iter::from_fn(|| seq.next_element().transpose());
                Ok(TokenHashes::Many(all.collect::<Result<_, _>>()?))
            }
        }
        d.deserialize_any(Hashes)
    }
}

/// At most this many path tokens are accepted at once: the current, the previous, and room
/// for a rotation that overlaps another.
pub const MAX_PATH_TOKEN_HASHES: usize = 4;

impl TokenHashes {
    pub fn as_slice(&self) -> &[Sha256Hex] {
        match self {
            Self::One(h) => std::slice::from_ref(h),
            Self::Many(hs) => hs,
        }
    }
}

impl HttpConfig {
    /// The `http` section's checks (`values_in_replies`: replies can carry Embedded values,
    /// [`super::EmbeddedReads::values`]); its warnings.
    pub fn validate(&self, values_in_replies: bool) -> Result<Vec<String>, ConfigError> {
        let h = self;
        let mut warnings = Vec::new();
        bounds::MAX_BODY_BYTES.check(h.max_body_bytes as u64, |b| {
            format!(
                "{} bytes: use {}..={} (default {DEFAULT_MAX_BODY_BYTES}); less cannot hold an AdmissionReview, and the API server never sends more",
                h.max_body_bytes, b.min, b.max
            )
        })?;
        bounds::MAX_REPLY_BYTES.check(h.max_reply_bytes as u64, |b| {
            format!(
                "{} bytes: use from {} (an answer with a small patch) to {}, which a replica's memory can build (default {DEFAULT_MAX_REPLY_BYTES})",
                h.max_reply_bytes, b.min, b.max
            )
        })?;
        for (bound, value) in [
            (bounds::MAX_CONNECTIONS, h.max_connections as u64),
            (
                bounds::MAX_CONNECTIONS_PER_SOURCE,
                h.max_connections_per_source as u64,
            ),
            (
                bounds::FIRST_REQUEST_TIMEOUT_SECONDS,
                h.first_request_timeout_seconds,
            ),
            (bounds::BODY_TIMEOUT_SECONDS, h.body_timeout_seconds),
            (bounds::IDLE_TIMEOUT_SECONDS, h.idle_timeout_seconds),
            (
                bounds::MAX_CONNECTION_AGE_SECONDS,
                h.max_connection_age_seconds,
            ),
        ] {
            bound.check(value, |b| {
                format!(
                    "{value}: use {} to {} (0 would accept no connection or close each at once)",
                    b.min, b.max
                )
            })?;
        }
        bounds::DRAIN_SECONDS.check(h.drain_seconds, |b| {
            format!(
                "must be at most {} (default 10): the pod's terminationGracePeriodSeconds must cover it and the requests in flight",
                b.max
            )
        })?;
        let tokens = [
            h.path_token.is_some(),
            h.path_token_sha256.is_some(),
            h.path_token_secret_id.is_some(),
        ];
        match tokens.iter().filter(|set| **set).count() {
            0 if h.path_token_disabled && values_in_replies => warnings.push(String::from(
                "http.pathTokenDisabled is true and the Embedded manager delivers values: anyone who reaches the endpoint is served the secret values of any pod they describe (AWS Secrets Manager, with the webhook's role); set a path token, or embedded.delivery: reference, which serves names only"
            )),
            0 if h.path_token_disabled => warnings.push(String::from(
                "http.pathTokenDisabled is true: every route answers without a path token, so anyone who reaches the endpoint can send reviews"
            )),
            0 => {}
            1 if h.path_token_disabled => bail!(
                "http.pathTokenDisabled",
                "is true while a path token is configured; remove one of them"
            ),
            1 if h.accept_plain_paths => warnings.push(String::from(
                "http.acceptPlainPaths is true: the plain paths are answered beside the path token's, so the token keeps no one out; set it back to false once every registration calls with the token (docs/deploy.md, \"Turning the token on\")"
            )),
            1 => {}
            _ => bail!(
                "http.pathToken",
                "set one of http.pathToken, http.pathTokenSha256 and http.pathTokenSecretId, not several"
            ),
        }
        ensure!(
            !h.accept_plain_paths || tokens.contains(&true),
            "http.acceptPlainPaths",
            "is true with no path token to switch to: it answers the plain paths beside a token's while a registration moves to the token; set http.pathTokenSha256 (or http.pathToken, http.pathTokenSecretId) too, or remove it"
        );
        if let Some(t) = &h.path_token {
            check_path_token("http.pathToken", t)?;
        }
        if let Some(hashes) = &h.path_token_sha256 {
            let hashes = hashes.as_slice();
            ensure!(
                !hashes.is_empty() && hashes.len() <= MAX_PATH_TOKEN_HASHES,
                "http.pathTokenSha256",
                "takes one hash or a list of 1 to {MAX_PATH_TOKEN_HASHES} (the current token's first, then the previous one's during a rotation), got {}",
                hashes.len()
            );
            for (i, hash) in hashes.iter().enumerate() {
                let key = || match h.path_token_sha256 {
                    Some(TokenHashes::Many(_)) => format!("http.pathTokenSha256[{i}]"),
                    _ => "http.pathTokenSha256".to_owned(),
                };
                ensure!(
                    Some(*hash) != Sha256Hex::parse(EMPTY_SHA256),
                    key(),
                    "is the SHA-256 of the empty string, which would admit a path with no token at all (`//mutate--v1-pod`): the token's file was missing or empty when it was hashed; hash the real token"
                );
            }
        }
        Ok(warnings)
    }
}

/// A path token must be one URL path segment that is hard to guess.
pub fn check_path_token(key: &str, token: &str) -> Result<(), ConfigError> {
    ensure!(
        token.len() >= 32,
        key,
        "a path token must be at least 32 characters (got {}); generate one with `openssl rand -hex 32`",
        token.len()
    );
    ensure!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        key,
        "a path token may contain only letters, digits, '-' and '_'"
    );
    Ok(())
}
