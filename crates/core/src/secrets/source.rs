//! The one asynchronous seam: fetching secret values for Embedded mode, before the pure chain
//! runs. [`SecretSource`] is what the admission asks for every id it needs, in one call; its
//! implementations on AWS Secrets Manager (and the cache in front of them) live in the
//! `podmutator-aws` crate, so this crate holds no network stack.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use crate::config::FetchStrategy;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A secret's value. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SecretValue {
    pub string: Option<String>,
    pub binary: Option<Vec<u8>>,
}

impl SecretValue {
    pub fn len(&self) -> usize {
        self.string.as_ref().map_or(0, String::len) + self.binary.as_ref().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes Flyte uses: the string when non-empty, else the binary.
    pub fn bytes(&self) -> Option<&[u8]> {
        match (&self.string, &self.binary) {
            (Some(s), _) if !s.is_empty() => Some(s.as_bytes()),
            (_, Some(b)) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretValue(<redacted, {} bytes>)", self.len())
    }
}

/// The answer for one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(SecretValue),
    /// The secret exists; only its metadata was read (`reference` delivery, see
    /// `podmutator_aws::resolve`).
    Exists(SecretRef),
    NotFound,
}

impl Lookup {
    /// Bytes the cache counts for this answer besides its id.
    pub fn weight(&self) -> usize {
        match self {
            Lookup::Found(v) => v.len(),
            Lookup::Exists(r) => r.name.len() + r.arn.len(),
            Lookup::NotFound => 0,
        }
    }

    /// Whether the secret exists (its value read or not).
    pub fn exists(&self) -> bool {
        !matches!(self, Lookup::NotFound)
    }
}

/// A secret's name and ARN: what the webhook learns about a secret in `reference` delivery.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecretRef {
    pub name: String,
    pub arn: String,
}

/// The answers for one `fetch_many`, with what they cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    pub values: BTreeMap<String, Lookup>,
    /// Ids answered from the cache.
    pub cache_hits: u32,
    /// Ids asked of the backend.
    pub backend_ids: u32,
    /// Calls made to the backend.
    pub backend_calls: u32,
    /// Attempts the backend answered with `ThrottlingException` (retried or not).
    pub throttles: u32,
}

impl From<BTreeMap<String, Lookup>> for Fetched {
    /// A backend answer: every id asked, in one call.
    fn from(values: BTreeMap<String, Lookup>) -> Self {
        let n = values.len() as u32;
        Self {
            values,
            backend_ids: n,
            backend_calls: u32::from(n > 0),
            ..Self::default()
        }
    }
}

/// The Secrets Manager operations Embedded mode calls, with the account quota each one shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    GetSecretValue,
    BatchGetSecretValue,
    /// Metadata only (`reference` delivery, `podmutator_aws::resolve`).
    DescribeSecret,
    /// Metadata of every secret whose name starts with a filter value. Not called by the
    /// webhook: the fleet simulation measures it against `DescribeSecret` (docs/scale.md).
    #[cfg(any(test, feature = "testing"))]
    ListSecrets,
}

impl Api {
    /// AWS's published request quota (per account and region, shared by every instance and
    /// every other application there).
    pub fn quota(self) -> String {
        let (rate, note) = match self {
            Api::GetSecretValue => ("10,000", ""),
            Api::BatchGetSecretValue => ("100", ", not adjustable"),
            Api::DescribeSecret => ("40,000", ""),
            #[cfg(any(test, feature = "testing"))]
            Api::ListSecrets => ("100", ""),
        };
        format!("{self} allows {rate} requests per second per account and region{note}")
    }
}

/// The operation's name, which is the variant's.
impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the service said about one id of a batch, kept out of [`SourceError`]'s `Display`
/// because a service message may name an account, a role or a key ARN.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServiceMessage(pub String);

/// Why values could not be fetched. `Display` is short (what failed: ids and an error code,
/// never a value, an ARN or an account id) so it can be answered to the pod's creator; the
/// service's own error, which may name the account or role, is only reachable through
/// [`std::error::Error::source`], for the logs.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Secrets Manager kept answering `ThrottlingException` until the SDK's retries, sized to
    /// `embedded.deadlineMs`, ran out.
    #[error(
        "throttled by AWS Secrets Manager while fetching secret {ids}: {} ({throttles} throttled attempts); retry the pod later, lower embedded.maxCallsInFlight on every instance or raise embedded.cacheTtlSeconds",
        api.quota()
    )]
    Throttled {
        api: Api,
        ids: String,
        throttles: u32,
        #[source]
        source: BoxError,
    },
    /// A call failed: the service answered an error, or it could not be reached in time.
    #[error("failed to fetch secret {ids}: {api} failed with {code}")]
    Call {
        api: Api,
        ids: String,
        code: String,
        #[source]
        source: BoxError,
    },
    /// A batch answered an error other than not-found for one id.
    #[error("failed to fetch secret {id}: {code}")]
    Entry {
        id: String,
        code: String,
        #[source]
        source: ServiceMessage,
    },
    /// A fetch task ended without an answer (a panic in the SDK, or the runtime shutting down).
    #[error("failed to fetch secret {ids}: the fetch task stopped")]
    Task {
        ids: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl SourceError {
    /// Throttled attempts behind this error, for the `SecretsManagerThrottles` metric.
    pub fn throttles(&self) -> u32 {
        match self {
            SourceError::Throttled { throttles, .. } => *throttles,
            _ => 0,
        }
    }
}

/// A boxed error of the service behind a source, kept for the logs.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The API's per-call maximum for `SecretIdList` (`BatchGetSecretValue`).
pub const MAX_BATCH: usize = 20;

/// Where Embedded values come from.
pub trait SecretSource: Send + Sync {
    /// Answers for every id in `ids` (each exactly once), or the first failure.
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>>;
}

impl<S: SecretSource + ?Sized> SecretSource for Arc<S> {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        (**self).fetch_many(ids)
    }
}

/// A fixed map of values, for tests and examples. Ids it does not hold are not found.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default, Clone)]
pub struct StaticSource {
    pub values: BTreeMap<String, SecretValue>,
    pub calls: Arc<std::sync::atomic::AtomicU64>,
}

#[cfg(any(test, feature = "testing"))]
impl StaticSource {
    pub fn with(mut self, id: &str, value: &str) -> Self {
        let value = SecretValue {
            string: Some(value.to_owned()),
            binary: None,
        };
        self.values.insert(id.to_owned(), value);
        self
    }
}

/// Reference delivery's resolver, for tests: the ids it holds exist (a name and an ARN in
/// us-east-1), or every id does ([`NameSource::all`]); no value is ever read from it.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default, Clone)]
pub struct NameSource {
    /// `None`: every id exists.
    only: Option<std::collections::BTreeSet<String>>,
}

#[cfg(any(test, feature = "testing"))]
impl NameSource {
    pub fn all() -> Self {
        Self { only: None }
    }

    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(ids: I) -> Self {
        Self {
            only: Some(ids.into_iter().map(Into::into).collect()),
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl SecretSource for NameSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        answer_each(ids, |id| {
            if !self.only.as_ref().is_none_or(|only| only.contains(id)) {
                return Lookup::NotFound;
            }
            Lookup::Exists(SecretRef {
                name: id.clone(),
                arn: format!("arn:aws:secretsmanager:us-east-1:123456789012:secret:{id}-AbCdEf"),
            })
        })
    }
}

#[cfg(any(test, feature = "testing"))]
impl SecretSource for StaticSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer_each(ids, |id| {
            (self.values.get(id)).map_or(Lookup::NotFound, |v| Lookup::Found(v.clone()))
        })
    }
}

/// A test source's answer: `lookup` of each id, as one backend call.
#[cfg(any(test, feature = "testing"))]
fn answer_each<'a>(
    ids: &[String],
    lookup: impl Fn(&String) -> Lookup,
) -> BoxFuture<'a, Result<Fetched, SourceError>> {
    let out: BTreeMap<_, _> = ids.iter().map(|id| (id.clone(), lookup(id))).collect();
    Box::pin(async move { Ok(out.into()) })
}
