//! The one asynchronous seam: fetching secret values for Embedded mode, before the pure chain
//! runs. [`AwsSource`] asks AWS Secrets Manager for every id an admission needs with
//! `BatchGetSecretValue` (20 ids a call, calls in parallel); [`CachingSource`] remembers answers
//! across warm invocations, found and not-found alike, within bounds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::DisplayErrorContext;

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
    /// [`super::resolve`]).
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
}

impl From<BTreeMap<String, Lookup>> for Fetched {
    /// A backend answer: every id asked, in one call.
    fn from(values: BTreeMap<String, Lookup>) -> Self {
        let n = values.len() as u32;
        Self {
            values,
            cache_hits: 0,
            backend_ids: n,
            backend_calls: u32::from(n > 0),
        }
    }
}

/// Why values could not be fetched. Names ids, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("failed to fetch secret {ids}: {reason}")]
    Failed { ids: String, reason: String },
}

impl SourceError {
    pub fn failed(ids: &[String], reason: impl Into<String>) -> Self {
        SourceError::Failed {
            ids: ids.join(", "),
            reason: reason.into(),
        }
    }
}

/// Where Embedded values come from.
pub trait SecretSource: Send + Sync {
    /// Answers for every id in `ids` (each exactly once), or the first failure.
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>>;
}

/// An HTTPS client for the AWS SDK on rustls with ring (no aws-lc in the binary).
pub fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// Loads the AWS configuration the standard way (environment, Lambda role, `AWS_ENDPOINT_URL`
/// for emulators), with `region` when non-empty. Retries and timeouts are sized to `budget`
/// (`embedded.deadlineMs`): the SDK's defaults back off for a second or more, so a throttled
/// call would spend the whole budget waiting for its first retry.
pub async fn aws_client(region: &str, budget: Duration) -> Client {
    use aws_config::retry::RetryConfig;
    use aws_config::timeout::TimeoutConfig;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http_client())
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(budget / 40)
                .with_max_backoff(budget / 5),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(budget / 4)
                .operation_attempt_timeout(budget / 2)
                .build(),
        );
    if !region.is_empty() {
        loader = loader.region(aws_config::Region::new(region.to_owned()));
    }
    Client::new(&loader.load().await)
}

/// AWS Secrets Manager, `AWSCURRENT` values by secret name.
#[derive(Clone)]
pub struct AwsSource {
    client: Client,
    batch_size: usize,
}

/// The API's per-call maximum for `SecretIdList`.
pub const MAX_BATCH: usize = 20;

impl AwsSource {
    pub fn new(client: Client, batch_size: usize) -> Self {
        Self {
            client,
            batch_size: batch_size.clamp(1, MAX_BATCH),
        }
    }

    async fn batch(client: Client, ids: Vec<String>) -> Result<Vec<(String, Lookup)>, SourceError> {
        let mut out = Vec::with_capacity(ids.len());
        let mut next_token = None;
        loop {
            let resp = client
                .batch_get_secret_value()
                .set_secret_id_list(Some(ids.clone()))
                .set_next_token(next_token.take())
                .send()
                .await
                .map_err(|e| SourceError::failed(&ids, DisplayErrorContext(e).to_string()))?;
            for entry in resp.secret_values() {
                let Some(name) = entry.name() else { continue };
                // A batch answers by name; match it to the id we asked for.
                if let Some(id) = ids.iter().find(|i| *i == name || entry.arn() == Some(i)) {
                    out.push((
                        id.clone(),
                        Lookup::Found(SecretValue {
                            string: entry.secret_string().map(str::to_owned),
                            binary: entry.secret_binary().map(|b| b.as_ref().to_vec()),
                        }),
                    ));
                }
            }
            for err in resp.errors() {
                let id = err.secret_id().unwrap_or_default().to_owned();
                match err.error_code() {
                    Some("ResourceNotFoundException") => out.push((id, Lookup::NotFound)),
                    code => {
                        return Err(SourceError::failed(
                            std::slice::from_ref(&id),
                            format!(
                                "{}: {}",
                                code.unwrap_or("error"),
                                err.message().unwrap_or("no message")
                            ),
                        ));
                    }
                }
            }
            match resp.next_token() {
                Some(t) if !t.is_empty() => next_token = Some(t.to_owned()),
                _ => break,
            }
        }
        Ok(out)
    }
}

impl SecretSource for AwsSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let mut calls = tokio::task::JoinSet::new();
            for chunk in ids.chunks(self.batch_size) {
                calls.spawn(Self::batch(self.client.clone(), chunk.to_vec()));
            }
            let backend_calls = calls.len() as u32;
            let mut found: BTreeMap<String, Lookup> = BTreeMap::new();
            while let Some(joined) = calls.join_next().await {
                let answers = joined
                    .map_err(|e| SourceError::failed(ids, format!("fetch task failed: {e}")))??;
                found.extend(answers);
            }
            // An id the service neither returned nor reported does not exist under that name.
            for id in ids {
                found.entry(id.clone()).or_insert(Lookup::NotFound);
            }
            Ok(Fetched {
                values: found,
                cache_hits: 0,
                backend_ids: ids.len() as u32,
                backend_calls,
            })
        })
    }
}

/// Cache bounds and lifetimes.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    pub ttl: Duration,
    pub negative_ttl: Duration,
    pub max_entries: usize,
    pub max_bytes: usize,
}

struct Entry {
    lookup: Lookup,
    expires: Instant,
    bytes: usize,
    seq: u64,
}

#[derive(Default)]
struct Store {
    entries: HashMap<String, Entry>,
    order: VecDeque<(u64, String)>,
    bytes: usize,
    seq: u64,
}

impl Store {
    fn insert(&mut self, id: String, lookup: Lookup, expires: Instant, policy: &CachePolicy) {
        let bytes = id.len() + lookup.weight();
        if bytes > policy.max_bytes {
            return;
        }
        self.remove(&id);
        self.seq += 1;
        self.order.push_back((self.seq, id.clone()));
        self.bytes += bytes;
        self.entries.insert(
            id,
            Entry {
                lookup,
                expires,
                bytes,
                seq: self.seq,
            },
        );
        // Oldest first; queue slots of replaced entries are skipped.
        while self.entries.len() > policy.max_entries || self.bytes > policy.max_bytes {
            let Some((seq, id)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&id).is_some_and(|e| e.seq == seq) {
                self.remove(&id);
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.entries.remove(id) {
            self.bytes -= e.bytes;
        }
    }
}

/// Counters for logs and metrics.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// Remembers answers of `inner` for `ttl` (found) or `negative_ttl` (not found), bounded in
/// entries and bytes. Each id is cached on its own, so a cached organisation-scope value never
/// hides a project-scope value: the cascade always sees an answer for every scope.
pub struct CachingSource<S> {
    inner: S,
    policy: CachePolicy,
    store: Mutex<Store>,
    now: Arc<dyn Fn() -> Instant + Send + Sync>,
    pub stats: CacheStats,
}

impl<S: SecretSource> CachingSource<S> {
    pub fn new(inner: S, policy: CachePolicy) -> Self {
        Self::with_clock(inner, policy, Arc::new(Instant::now))
    }

    /// For tests: a controllable clock.
    pub fn with_clock(
        inner: S,
        policy: CachePolicy,
        now: Arc<dyn Fn() -> Instant + Send + Sync>,
    ) -> Self {
        Self {
            inner,
            policy,
            store: Mutex::new(Store::default()),
            now,
            stats: CacheStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.store.lock().map_or(0, |s| s.entries.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<S: SecretSource> SecretSource for CachingSource<S> {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let now = (self.now)();
            let mut out = BTreeMap::new();
            let mut misses = Vec::new();
            {
                let store = self
                    .store
                    .lock()
                    .map_err(|_| SourceError::failed(ids, "secret cache lock poisoned"))?;
                for id in ids {
                    match store.entries.get(id) {
                        Some(e) if e.expires > now => {
                            out.insert(id.clone(), e.lookup.clone());
                        }
                        _ => misses.push(id.clone()),
                    }
                }
            }
            self.stats
                .hits
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            self.stats
                .misses
                .fetch_add(misses.len() as u64, Ordering::Relaxed);
            let cache_hits = out.len() as u32;
            if misses.is_empty() {
                return Ok(Fetched {
                    values: out,
                    cache_hits,
                    backend_ids: 0,
                    backend_calls: 0,
                });
            }
            let fetched = self.inner.fetch_many(&misses).await?;
            let now = (self.now)();
            if let Ok(mut store) = self.store.lock() {
                for (id, lookup) in &fetched.values {
                    let ttl = match lookup {
                        Lookup::Found(_) | Lookup::Exists(_) => self.policy.ttl,
                        Lookup::NotFound => self.policy.negative_ttl,
                    };
                    if !ttl.is_zero() {
                        store.insert(id.clone(), lookup.clone(), now + ttl, &self.policy);
                    }
                }
            }
            out.extend(fetched.values);
            Ok(Fetched {
                values: out,
                cache_hits: cache_hits + fetched.cache_hits,
                backend_ids: fetched.backend_ids,
                backend_calls: fetched.backend_calls,
            })
        })
    }
}

impl<S: SecretSource + ?Sized> SecretSource for Arc<S> {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        (**self).fetch_many(ids)
    }
}

/// A fixed map of values, for tests and examples. Ids it does not hold are not found.
#[derive(Debug, Default, Clone)]
pub struct StaticSource {
    pub values: BTreeMap<String, SecretValue>,
    pub calls: Arc<AtomicU64>,
}

impl StaticSource {
    pub fn with(mut self, id: &str, value: &str) -> Self {
        self.values.insert(
            id.to_owned(),
            SecretValue {
                string: Some(value.to_owned()),
                binary: None,
            },
        );
        self
    }
}

impl SecretSource for StaticSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let out = ids
            .iter()
            .map(|id| {
                let lookup = self
                    .values
                    .get(id)
                    .map_or(Lookup::NotFound, |v| Lookup::Found(v.clone()));
                (id.clone(), lookup)
            })
            .collect::<BTreeMap<_, _>>();
        Box::pin(async move { Ok(out.into()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_secretsmanager::operation::batch_get_secret_value::{
        BatchGetSecretValueError, BatchGetSecretValueOutput,
    };
    use aws_sdk_secretsmanager::types::error::InternalServiceError;
    use aws_sdk_secretsmanager::types::{ApiErrorType, SecretValueEntry};
    use aws_smithy_mocks::{RuleMode, mock, mock_client};
    use aws_smithy_types::Blob;

    /// A fake Secrets Manager answering BatchGetSecretValue from `store`.
    fn answer(store: &BTreeMap<&str, SecretValue>, ids: &[String]) -> BatchGetSecretValueOutput {
        let mut out = BatchGetSecretValueOutput::builder();
        for id in ids {
            match store.get(id.as_str()) {
                Some(v) => {
                    out = out.secret_values(
                        SecretValueEntry::builder()
                            .name(id)
                            .arn(format!(
                                "arn:aws:secretsmanager:us-east-1:1:secret:{id}-AbCdEf"
                            ))
                            .set_secret_string(v.string.clone())
                            .set_secret_binary(v.binary.clone().map(Blob::new))
                            .version_stages("AWSCURRENT")
                            .build(),
                    )
                }
                None => {
                    out = out.errors(
                        ApiErrorType::builder()
                            .secret_id(id)
                            .error_code("ResourceNotFoundException")
                            .message("Secrets Manager can't find the specified secret.")
                            .build(),
                    )
                }
            }
        }
        out.build()
    }

    fn text(s: &str) -> SecretValue {
        SecretValue {
            string: Some(s.into()),
            binary: None,
        }
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("u__org__o__domain__d__project__p__key__k{i}"))
            .collect()
    }

    #[tokio::test]
    async fn twenty_five_ids_cost_two_batch_calls_and_every_id_is_answered() {
        let wanted = ids(25);
        let store: BTreeMap<&str, SecretValue> = wanted[..10]
            .iter()
            .map(|id| (id.as_str(), text("fake-value")))
            .collect();
        let store = std::sync::Arc::new(
            store
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<BTreeMap<String, SecretValue>>(),
        );
        let s2 = store.clone();
        let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
            .then_compute_output(move |input| {
                let view: BTreeMap<&str, SecretValue> =
                    s2.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                answer(&view, input.secret_id_list())
            });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let got = AwsSource::new(client, 20)
            .fetch_many(&wanted)
            .await
            .unwrap()
            .values;
        assert_eq!(rule.num_calls(), 2);
        assert_eq!(got.len(), 25);
        for (i, id) in wanted.iter().enumerate() {
            let expected = if i < 10 {
                Lookup::Found(text("fake-value"))
            } else {
                Lookup::NotFound
            };
            assert_eq!(got[id], expected, "{id}");
        }
    }

    #[tokio::test]
    async fn binary_values_come_back_as_bytes() {
        let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
            .then_compute_output(|input| {
                let mut store = BTreeMap::new();
                store.insert(
                    "bin",
                    SecretValue {
                        string: None,
                        binary: Some(vec![0xff, 0x00, 0x10]),
                    },
                );
                answer(&store, input.secret_id_list())
            });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let got = AwsSource::new(client, 20)
            .fetch_many(&["bin".to_owned()])
            .await
            .unwrap()
            .values;
        assert_eq!(
            got["bin"],
            Lookup::Found(SecretValue {
                string: None,
                binary: Some(vec![0xff, 0x00, 0x10])
            })
        );
    }

    #[tokio::test]
    async fn a_failing_call_names_the_ids_and_not_any_value() {
        let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value).then_error(|| {
            BatchGetSecretValueError::InternalServiceError(
                InternalServiceError::builder()
                    .message("service unavailable")
                    .build(),
            )
        });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let err = AwsSource::new(client, 20)
            .fetch_many(&ids(2))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("failed to fetch secret u__org__o__domain__d__project__p__key__k0, u__org__o__domain__d__project__p__key__k1: "), "{msg}");
        assert!(msg.contains("service unavailable"), "{msg}");
    }

    #[tokio::test]
    async fn a_per_id_error_other_than_not_found_fails_the_fetch() {
        let rule =
            mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value).then_output(|| {
                BatchGetSecretValueOutput::builder()
                    .errors(
                        ApiErrorType::builder()
                            .secret_id("k")
                            .error_code("DecryptionFailure")
                            .message("cannot decrypt with the KMS key")
                            .build(),
                    )
                    .build()
            });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let err = AwsSource::new(client, 20)
            .fetch_many(&["k".to_owned()])
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to fetch secret k: DecryptionFailure: cannot decrypt with the KMS key"
        );
    }

    #[test]
    fn debug_output_never_shows_a_value() {
        let v = text("fake-db-password");
        let shown = format!("{v:?} {:?}", Lookup::Found(v.clone()));
        assert!(!shown.contains("fake-db-password"), "{shown}");
        assert!(shown.contains("16 bytes"));
    }

    // === CachingSource ===

    struct Clock(Mutex<Instant>);

    fn policy() -> CachePolicy {
        CachePolicy {
            ttl: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(10),
            max_entries: 100,
            max_bytes: 1 << 20,
        }
    }

    fn cached(
        inner: StaticSource,
        policy: CachePolicy,
    ) -> (CachingSource<StaticSource>, Arc<Clock>) {
        let clock = Arc::new(Clock(Mutex::new(Instant::now())));
        let c2 = clock.clone();
        let source =
            CachingSource::with_clock(inner, policy, Arc::new(move || *c2.0.lock().unwrap()));
        (source, clock)
    }

    fn advance(clock: &Clock, secs: u64) {
        *clock.0.lock().unwrap() += Duration::from_secs(secs);
    }

    #[tokio::test]
    async fn a_warm_fetch_costs_no_backend_call() {
        let inner = StaticSource::default().with("a", "fake-a");
        let calls = inner.calls.clone();
        let (source, _) = cached(inner, policy());
        let want = vec!["a".to_owned(), "missing".to_owned()];
        let cold = source.fetch_many(&want).await.unwrap();
        let warm = source.fetch_many(&want).await.unwrap();
        assert_eq!(cold.values, warm.values);
        assert_eq!(
            (cold.cache_hits, cold.backend_ids, cold.backend_calls),
            (0, 2, 1)
        );
        assert_eq!(
            (warm.cache_hits, warm.backend_ids, warm.backend_calls),
            (2, 0, 0)
        );
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(source.stats.hits.load(Ordering::Relaxed), 2);
        assert_eq!(source.stats.misses.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn values_expire_after_the_ttl_and_not_found_after_the_negative_ttl() {
        let inner = StaticSource::default().with("a", "fake-a");
        let calls = inner.calls.clone();
        let (source, clock) = cached(inner, policy());
        let want = vec!["a".to_owned(), "missing".to_owned()];
        source.fetch_many(&want).await.unwrap();
        advance(&clock, 11);
        source.fetch_many(&["a".to_owned()]).await.unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 1, "value still cached");
        source.fetch_many(&["missing".to_owned()]).await.unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 2, "negative entry expired");
        advance(&clock, 300);
        source.fetch_many(&["a".to_owned()]).await.unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 3, "value expired");
    }

    /// A backend whose contents a test can change between fetches.
    #[derive(Clone, Default)]
    struct Mutable(Arc<Mutex<BTreeMap<String, SecretValue>>>);

    impl SecretSource for Mutable {
        fn fetch_many<'a>(
            &'a self,
            ids: &'a [String],
        ) -> BoxFuture<'a, Result<Fetched, SourceError>> {
            let store = self.0.lock().unwrap();
            let out = ids
                .iter()
                .map(|id| {
                    let l = store
                        .get(id)
                        .map_or(Lookup::NotFound, |v| Lookup::Found(v.clone()));
                    (id.clone(), l)
                })
                .collect::<BTreeMap<_, _>>();
            Box::pin(async move { Ok(out.into()) })
        }
    }

    #[tokio::test]
    async fn stale_org_cache_does_not_mask_project_scope() {
        // Spec: TestEmbeddedSecretManagerInjector_LookUpSecret_StaleOrgCacheDoesNotMaskProjectScope.
        let org = "u__org__o__domain____project____key__k".to_owned();
        let project = "u__org__o__domain__d__project__p__key__k".to_owned();
        let backend = Mutable::default();
        backend
            .0
            .lock()
            .unwrap()
            .insert(org.clone(), text("fake-org"));
        let source = CachingSource::new(backend.clone(), policy());
        // An earlier pod (another project) warmed the cache with the org-scope value.
        source.fetch_many(std::slice::from_ref(&org)).await.unwrap();
        backend
            .0
            .lock()
            .unwrap()
            .insert(project.clone(), text("fake-project"));
        let got = source
            .fetch_many(&[project.clone(), org.clone()])
            .await
            .unwrap()
            .values;
        assert_eq!(
            got[&org],
            Lookup::Found(text("fake-org")),
            "served from cache"
        );
        assert_eq!(got[&project], Lookup::Found(text("fake-project")));
    }

    #[tokio::test]
    async fn a_new_secret_is_seen_once_the_negative_ttl_passes() {
        let project = "u__org__o__domain__d__project__p__key__k".to_owned();
        let backend = Mutable::default();
        let (source, clock) = {
            let clock = Arc::new(Clock(Mutex::new(Instant::now())));
            let c2 = clock.clone();
            let s = CachingSource::with_clock(
                backend.clone(),
                policy(),
                Arc::new(move || *c2.0.lock().unwrap()),
            );
            (s, clock)
        };
        let want = std::slice::from_ref(&project);
        assert_eq!(
            source.fetch_many(want).await.unwrap().values[&project],
            Lookup::NotFound
        );
        backend
            .0
            .lock()
            .unwrap()
            .insert(project.clone(), text("fake-new"));
        assert_eq!(
            source.fetch_many(want).await.unwrap().values[&project],
            Lookup::NotFound
        );
        advance(&clock, 11);
        assert_eq!(
            source.fetch_many(want).await.unwrap().values[&project],
            Lookup::Found(text("fake-new"))
        );
    }

    #[tokio::test]
    async fn the_cache_is_bounded_in_entries_and_bytes() {
        let mut inner = StaticSource::default();
        for i in 0..10 {
            inner = inner.with(&format!("id{i}"), &"v".repeat(100));
        }
        let (source, _) = cached(
            inner.clone(),
            CachePolicy {
                max_entries: 4,
                ..policy()
            },
        );
        let all: Vec<String> = (0..10).map(|i| format!("id{i}")).collect();
        source.fetch_many(&all).await.unwrap();
        assert_eq!(source.len(), 4);

        let (source, _) = cached(
            inner,
            CachePolicy {
                max_bytes: 350,
                ..policy()
            },
        );
        source.fetch_many(&all).await.unwrap();
        assert_eq!(
            source.len(),
            3,
            "3 x (3-byte id + 100-byte value) fit in 350 bytes"
        );
    }
}
