//! AWS Secrets Manager behind [`SecretSource`]: [`AwsSource`] asks for every id an admission
//! needs, by `GetSecretValue` per id or `BatchGetSecretValue` per 20 ids ([`FetchStrategy`]),
//! with a bound on calls in flight per admission and per process; [`CachingSource`] remembers
//! answers across warm invocations, found and not-found alike, within bounds; [`SharedAws`] is
//! the process's one AWS configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::operation::batch_get_secret_value::BatchGetSecretValueError;
use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::AfterDeserializationInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use podmutator_core::config::EmbeddedConfig;
use podmutator_core::config::FetchStrategy;
use podmutator_core::secrets::source::{
    Api, BoxError, BoxFuture, Fetched, Lookup, MAX_BATCH, SecretSource, SecretValue,
    ServiceMessage, SourceError,
};

/// Classifies an SDK failure of `api` for `ids` (`, `-joined), after the throttles counted.
pub(crate) fn from_sdk<E>(
    api: Api,
    ids: String,
    throttles: &ThrottleCounter,
    e: SdkError<E, HttpResponse>,
) -> SourceError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = match &e {
        SdkError::ServiceError(s) => match s.err().code() {
            Some(code) => shown_code(code),
            // A body the SDK could not read as an AWS error: a proxy's page, a truncated answer.
            None => format!(
                "an unreadable response (HTTP {})",
                s.raw().status().as_u16()
            ),
        },
        SdkError::TimeoutError(_) => "a timeout (embedded.deadlineMs)".to_owned(),
        // The SDK reports credentials it could not load as a dispatch failure, though no
        // request was sent.
        SdkError::DispatchFailure(_) if mentions_credentials(&e) => {
            "no AWS credentials (no request was sent)".to_owned()
        }
        SdkError::DispatchFailure(_) => "a connection failure".to_owned(),
        SdkError::ResponseError(_) => "an unreadable response".to_owned(),
        _ => "a request it could not build".to_owned(),
    };
    if code == THROTTLED {
        // The final attempt is one of the throttles; count it even if the interceptor
        // could not (an error it could not classify).
        SourceError::Throttled {
            api,
            ids,
            throttles: throttles.get().max(1),
            source: Box::new(e),
        }
    } else {
        SourceError::Call {
            api,
            ids,
            code,
            source: Box::new(e),
        }
    }
}

/// An error code as the reply may show it: AWS's are one word (`AccessDeniedException`); anything
/// else, from an endpoint that is not AWS's, is not repeated.
fn shown_code(code: &str) -> String {
    match !code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()) {
        true => code.to_owned(),
        false => "an error code that is not AWS's".to_owned(),
    }
}

/// Whether any error in `e`'s chain is about credentials.
fn mentions_credentials(e: &dyn std::error::Error) -> bool {
    std::iter::successors(Some(e), |e| e.source())
        .any(|e| e.to_string().to_ascii_lowercase().contains("credential"))
}

type HttpResponse = aws_smithy_runtime_api::client::orchestrator::HttpResponse;

const THROTTLED: &str = "ThrottlingException";
const NOT_FOUND: &str = "ResourceNotFoundException";
/// What a read of a secret scheduled for deletion answers (the one cause a read can have): for
/// the pod, as for reference delivery's `DescribeSecret`, there is no value, and the cascade
/// goes on. `get` reads the typed error the same way.
const SCHEDULED_FOR_DELETION: &str = "InvalidRequestException";

/// An HTTPS client for the AWS SDK on rustls with ring (no aws-lc in the binary).
pub fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the AWS configuration the standard way (environment, Lambda role, `AWS_ENDPOINT_URL`
/// for emulators), with `region` when non-empty, for a process with one AWS use (the pod's
/// `fetch`). Retries and timeouts as [`SharedAws::secrets_manager`] sizes them.
pub async fn aws_client(region: &str, budget: Duration) -> Client {
    SharedAws::new(region).secrets_manager(region, budget).await
}

/// The process's one AWS configuration, loaded on its first use and shared by every AWS client
/// the process makes (Embedded's values and names, the path token, ECR's tokens): one
/// credential chain with its cache, one HTTP client with its connection pool, one load of the
/// root certificates. Loading it costs cold-start time, so nothing loads it until a first call
/// needs it. Clones share it.
#[derive(Clone)]
pub struct SharedAws {
    inner: Arc<SharedAwsInner>,
}

struct SharedAwsInner {
    /// The region of a load without `AWS_REGION` (else the SDK's chain, down to IMDS).
    region: String,
    /// Taken by the one load.
    loader: std::sync::Mutex<Option<aws_config::ConfigLoader>>,
    config: tokio::sync::OnceCell<aws_config::SdkConfig>,
    loads: AtomicU32,
}

impl SharedAws {
    /// The standard chain; `region` (when non-empty) where the environment names none.
    pub fn new(region: &str) -> Self {
        Self::build(region, None)
    }

    /// From `loader` instead of the standard defaults (tests: an emulator's endpoint and fixed
    /// credentials without touching the process's environment). The HTTP client is still ours.
    pub fn with_loader(loader: aws_config::ConfigLoader) -> Self {
        Self::build("", Some(loader))
    }

    fn build(region: &str, loader: Option<aws_config::ConfigLoader>) -> Self {
        Self {
            inner: Arc::new(SharedAwsInner {
                region: region.to_owned(),
                loader: std::sync::Mutex::new(loader),
                config: tokio::sync::OnceCell::new(),
                loads: AtomicU32::new(0),
            }),
        }
    }

    /// The configuration, loaded on the first call.
    pub async fn config(&self) -> &aws_config::SdkConfig {
        let inner = &self.inner;
        inner
            .config
            .get_or_init(|| async {
                let given = inner
                    .loader
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                let loader = given
                    .unwrap_or_else(|| aws_config::defaults(aws_config::BehaviorVersion::latest()));
                let mut loader = loader.http_client(http_client());
                if !inner.region.is_empty() && std::env::var_os("AWS_REGION").is_none() {
                    loader = loader.region(aws_config::Region::new(inner.region.clone()));
                }
                inner.loads.fetch_add(1, Ordering::Relaxed);
                let config = loader.load().await;
                tracing::debug!(
                    region = config.region().map(|r| r.as_ref()),
                    "AWS configuration loaded"
                );
                config
            })
            .await
    }

    /// How many times the configuration was loaded (at most once).
    pub fn loads(&self) -> u32 {
        self.inner.loads.load(Ordering::Relaxed)
    }

    /// A Secrets Manager client in `region` (when non-empty, else the configuration's), with
    /// retries and timeouts sized to `budget` (`embedded.deadlineMs`): the SDK's defaults back
    /// off for a second or more, so a throttled call would spend the whole budget waiting for
    /// its first retry.
    pub async fn secrets_manager(&self, region: &str, budget: Duration) -> Client {
        use aws_config::timeout::TimeoutConfig;
        let mut config = aws_sdk_secretsmanager::config::Builder::from(self.config().await)
            .retry_config(retry_config(budget))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(budget / 4)
                    .operation_attempt_timeout(budget / 2)
                    .build(),
            );
        if !region.is_empty() {
            config = config.region(aws_config::Region::new(region.to_owned()));
        }
        Client::from_conf(config.build())
    }
}

impl fmt::Debug for SharedAws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedAws")
            .field("region", &self.inner.region)
            .field("loaded", &self.inner.config.initialized())
            .finish()
    }
}

/// The SDK's standard retry policy (3 attempts, exponential backoff with full jitter, a
/// client-side retry quota), with backoffs sized to `budget` (`embedded.deadlineMs`).
pub fn retry_config(budget: Duration) -> aws_config::retry::RetryConfig {
    aws_config::retry::RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(budget / 40)
        .with_max_backoff(budget / 5)
}

/// Counts the attempts of one operation that Secrets Manager answered with
/// `ThrottlingException`. The SDK retries those itself, so the final result alone would hide
/// every throttle that a retry absorbed; the alarm wants them all.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThrottleCounter(Arc<AtomicU32>);

impl ThrottleCounter {
    pub(crate) fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Intercept for ThrottleCounter {
    fn name(&self) -> &'static str {
        "ThrottleCounter"
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Err(e) = context.output_or_error() else {
            return Ok(());
        };
        let Some(e) = e.as_operation_error() else {
            return Ok(());
        };
        let code = e
            .downcast_ref::<GetSecretValueError>()
            .and_then(|e| e.code())
            .or_else(|| {
                e.downcast_ref::<BatchGetSecretValueError>()
                    .and_then(|e| e.code())
            })
            .or_else(|| {
                e.downcast_ref::<aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretError>()
                    .and_then(|e| e.code())
            });
        if code == Some(THROTTLED) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// AWS Secrets Manager, `AWSCURRENT` values by secret name.
#[derive(Clone)]
pub struct AwsSource {
    client: Client,
    batch_size: usize,
    strategy: FetchStrategy,
    per_admission: usize,
    /// Shared by every admission of this process (`embedded.maxCallsInFlight`).
    in_flight: Arc<Semaphore>,
    /// Whether any call has succeeded yet: [`FetchStrategy::Hybrid`] batches until then.
    warm: Arc<AtomicBool>,
}

/// What one spawned call needs.
#[derive(Clone)]
struct CallCtx {
    client: Client,
    admission: Arc<Semaphore>,
    process: Arc<Semaphore>,
    throttles: ThrottleCounter,
    warm: Arc<AtomicBool>,
}

impl CallCtx {
    /// Waits for one call's share of the bounds, a slot of the admission's and one of the
    /// process's; the admission's first so that one admission queues behind its own calls and
    /// takes at most its share of the process's. The semaphores are never closed; if one were,
    /// the call would go ahead unbounded rather than fail.
    async fn slot(&self) -> (Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>) {
        (
            self.admission.clone().acquire_owned().await.ok(),
            self.process.clone().acquire_owned().await.ok(),
        )
    }

    async fn batch(self, ids: Vec<String>) -> Result<(Vec<(String, Lookup)>, u32), SourceError> {
        let mut out = Vec::with_capacity(ids.len());
        let mut next_token = None;
        let mut calls: u32 = 0;
        loop {
            // Each page answers at least one id: a service that keeps paging is not followed.
            if calls as usize >= ids.len().max(1) {
                return Err(SourceError::Call {
                    api: Api::BatchGetSecretValue,
                    ids: ids.join(", "),
                    code: format!("a NextToken after {calls} pages of {} ids", ids.len()),
                    source: Box::new(ServiceMessage("the service kept paging".into())),
                });
            }
            let _slot = self.slot().await;
            calls += 1;
            let resp = self
                .client
                .batch_get_secret_value()
                .set_secret_id_list(Some(ids.clone()))
                .set_next_token(next_token.take())
                .customize()
                .interceptor(self.throttles.clone())
                .send()
                .await
                .map_err(|e| {
                    from_sdk(Api::BatchGetSecretValue, ids.join(", "), &self.throttles, e)
                })?;
            self.warm.store(true, Ordering::Relaxed);
            for entry in resp.secret_values() {
                let Some(name) = entry.name() else { continue };
                // A batch answers by name; match it to the id we asked for.
                if let Some(id) = ids.iter().find(|i| *i == name || entry.arn() == Some(i)) {
                    let value = found(entry.secret_string(), entry.secret_binary());
                    out.push((id.clone(), value));
                }
            }
            for err in resp.errors() {
                let id = err.secret_id().unwrap_or_default().to_owned();
                match err.error_code() {
                    Some(NOT_FOUND | SCHEDULED_FOR_DELETION) => out.push((id, Lookup::NotFound)),
                    code => {
                        return Err(SourceError::Entry {
                            id,
                            code: code.map_or("an unnamed error".into(), shown_code),
                            source: ServiceMessage(
                                err.message().unwrap_or("no message").to_owned(),
                            ),
                        });
                    }
                }
            }
            match resp.next_token() {
                Some(t) if !t.is_empty() => next_token = Some(t.to_owned()),
                _ => break,
            }
        }
        Ok((out, calls))
    }

    async fn get(self, id: String) -> Result<(Vec<(String, Lookup)>, u32), SourceError> {
        let _slot = self.slot().await;
        let sent = self
            .client
            .get_secret_value()
            .secret_id(&id)
            .customize()
            .interceptor(self.throttles.clone())
            .send()
            .await;
        let lookup = match sent {
            Ok(resp) => found(resp.secret_string(), resp.secret_binary()),
            Err(e)
                if e.as_service_error().is_some_and(|e| {
                    e.is_resource_not_found_exception() || e.is_invalid_request_exception()
                }) =>
            {
                Lookup::NotFound
            }
            Err(e) => return Err(from_sdk(Api::GetSecretValue, id, &self.throttles, e)),
        };
        self.warm.store(true, Ordering::Relaxed);
        Ok((vec![(id, lookup)], 1))
    }
}

/// A value as either API returns it.
fn found(string: Option<&str>, binary: Option<&aws_smithy_types::Blob>) -> Lookup {
    Lookup::Found(SecretValue {
        string: string.map(str::to_owned),
        binary: binary.map(|b| b.as_ref().to_vec()),
    })
}

impl AwsSource {
    /// `BatchGetSecretValue` in chunks of `batch_size`, with the default bounds on calls in
    /// flight.
    pub fn new(client: Client, batch_size: usize) -> Self {
        let d = EmbeddedConfig::default();
        Self {
            client,
            batch_size: batch_size.clamp(1, MAX_BATCH),
            strategy: FetchStrategy::Batch,
            per_admission: d.max_calls_in_flight_per_admission,
            in_flight: Arc::new(Semaphore::new(d.max_calls_in_flight)),
            warm: Arc::default(),
        }
    }

    /// As `embedded` says: strategy, batch size and bounds.
    pub fn from_config(client: Client, embedded: &EmbeddedConfig) -> Self {
        Self::new(client, embedded.batch_size)
            .with_strategy(embedded.fetch_strategy)
            .with_limits(
                embedded.max_calls_in_flight,
                embedded.max_calls_in_flight_per_admission,
            )
    }

    pub fn with_strategy(mut self, strategy: FetchStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// At most `per_process` calls in flight for every admission together, and `per_admission`
    /// for one (each at least 1).
    pub fn with_limits(mut self, per_process: usize, per_admission: usize) -> Self {
        self.in_flight = Arc::new(Semaphore::new(per_process.max(1)));
        self.per_admission = per_admission.max(1);
        self
    }
}

impl SecretSource for AwsSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let ctx = CallCtx {
                client: self.client.clone(),
                admission: Arc::new(Semaphore::new(self.per_admission)),
                process: self.in_flight.clone(),
                throttles: ThrottleCounter::default(),
                warm: self.warm.clone(),
            };
            // Dropping the set (first error, or the admission's deadline) aborts the calls
            // still queued, so a failed admission spends no more quota.
            let mut calls = tokio::task::JoinSet::new();
            let batches = match self.strategy {
                FetchStrategy::Batch => true,
                FetchStrategy::Parallel => false,
                FetchStrategy::Hybrid => !self.warm.load(Ordering::Relaxed),
            };
            if batches {
                for chunk in ids.chunks(self.batch_size) {
                    calls.spawn(ctx.clone().batch(chunk.to_vec()));
                }
            } else {
                for id in ids {
                    calls.spawn(ctx.clone().get(id.clone()));
                }
            }
            let mut backend_calls = 0;
            let mut found: BTreeMap<String, Lookup> = BTreeMap::new();
            while let Some(joined) = calls.join_next().await {
                let (answers, n) = joined.map_err(|source| SourceError::Task {
                    ids: ids.join(", "),
                    source,
                })??;
                backend_calls += n;
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
                throttles: ctx.throttles.get(),
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

impl CachePolicy {
    pub fn from_config(e: &EmbeddedConfig) -> Self {
        Self {
            ttl: Duration::from_secs(e.cache_ttl_seconds),
            negative_ttl: Duration::from_secs(e.negative_cache_ttl_seconds),
            max_entries: e.cache_max_entries,
            max_bytes: e.cache_max_bytes,
        }
    }

    /// moka bounds one total weight; both bounds hold when every entry weighs at least
    /// `max_bytes / max_entries` (then no more than `max_entries` fit) and at least its bytes.
    fn weight(&self, id: &str, lookup: &Lookup) -> u32 {
        let bytes = id.len() + lookup.weight();
        let floor = self.max_bytes.div_ceil(self.max_entries.max(1));
        u32::try_from(bytes.max(floor)).unwrap_or(u32::MAX)
    }
}

#[derive(Clone)]
struct Entry {
    lookup: Lookup,
    /// On the source's clock, which tests control; moka's own expiry (real time) frees the
    /// memory, this decides what is fresh.
    fresh_until: Instant,
    ttl: Duration,
}

/// Each entry lives for its own TTL: found and not found differ.
struct EntryTtl;

impl moka::Expiry<String, Entry> for EntryTtl {
    fn expire_after_create(&self, _: &String, e: &Entry, _: Instant) -> Option<Duration> {
        Some(e.ttl)
    }

    /// A refresh starts a new lifetime (moka's default would keep the old entry's remainder).
    fn expire_after_update(
        &self,
        _: &String,
        e: &Entry,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(e.ttl)
    }
}

/// Remembers answers of `inner` for `ttl` (found) or `negative_ttl` (not found), bounded in
/// entries and bytes (moka: a refreshed id replaces its entry, so refreshes cannot grow it).
/// Each id is cached on its own, so a cached organisation-scope value never hides a
/// project-scope value: the cascade always sees an answer for every scope.
pub struct CachingSource<S> {
    inner: S,
    policy: CachePolicy,
    cache: moka::sync::Cache<String, Entry>,
    now: Arc<dyn Fn() -> Instant + Send + Sync>,
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
        let cache = moka::sync::Cache::builder()
            .max_capacity(policy.max_bytes as u64)
            .weigher(move |id: &String, e: &Entry| policy.weight(id, &e.lookup))
            .expire_after(EntryTtl)
            .build();
        Self {
            inner,
            policy,
            cache,
            now,
        }
    }

    /// Entries held, after moka's pending evictions have run.
    pub fn len(&self) -> usize {
        self.cache.run_pending_tasks();
        self.cache.entry_count() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The total weight held (bytes, with the per-entry floor of [`CachePolicy`]), after
    /// moka's pending evictions have run.
    pub fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}

impl<S: SecretSource> SecretSource for CachingSource<S> {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let now = (self.now)();
            let mut out = BTreeMap::new();
            let mut misses = Vec::new();
            for id in ids {
                match self.cache.get(id) {
                    Some(e) if e.fresh_until > now => {
                        out.insert(id.clone(), e.lookup);
                    }
                    _ => misses.push(id.clone()),
                }
            }
            let cache_hits = out.len() as u32;
            if misses.is_empty() {
                return Ok(Fetched {
                    values: out,
                    cache_hits,
                    ..Fetched::default()
                });
            }
            let fetched = self.inner.fetch_many(&misses).await?;
            let now = (self.now)();
            for (id, lookup) in &fetched.values {
                let ttl = match lookup {
                    Lookup::Found(_) | Lookup::Exists(_) => self.policy.ttl,
                    Lookup::NotFound => self.policy.negative_ttl,
                };
                if !ttl.is_zero() {
                    self.cache.insert(
                        id.clone(),
                        Entry {
                            lookup: lookup.clone(),
                            fresh_until: now + ttl,
                            ttl,
                        },
                    );
                }
            }
            out.extend(fetched.values);
            Ok(Fetched {
                values: out,
                cache_hits: cache_hits + fetched.cache_hits,
                ..fetched
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_secretsmanager::operation::batch_get_secret_value::{
        BatchGetSecretValueError, BatchGetSecretValueOutput,
    };
    use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueOutput;
    use aws_sdk_secretsmanager::types::error::{InternalServiceError, ResourceNotFoundException};
    use aws_sdk_secretsmanager::types::{ApiErrorType, SecretValueEntry};
    use aws_smithy_mocks::{MockResponse, Rule, RuleMode, mock, mock_client};
    use aws_smithy_runtime_api::client::http::{
        HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
    };
    use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
    use aws_smithy_types::Blob;
    use aws_smithy_types::body::SdkBody;
    use podmutator_core::secrets::source::StaticSource;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

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

    /// Every error in `e`'s source chain, joined: what the logs get.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            out.push_str(&format!(" <- {s} ({s:?})"));
            next = s.source();
        }
        out
    }

    const ARN: &str = "arn:aws:iam::123456789012:role/podmutator";

    #[tokio::test]
    async fn a_failing_call_names_the_ids_and_code_and_keeps_the_service_message_for_the_logs() {
        let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
            .then_http_response(|| {
                HttpResponse::new(
                    500.try_into().unwrap(),
                    SdkBody::from(format!(
                        r#"{{"__type":"InternalServiceError","message":"service unavailable for {ARN}"}}"#
                    )),
                )
            });
        let client = mock_client!(
            aws_sdk_secretsmanager,
            RuleMode::MatchAny,
            [&rule],
            fast_retries
        );
        let err = AwsSource::new(client, 20)
            .fetch_many(&ids(2))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to fetch secret u__org__o__domain__d__project__p__key__k0, u__org__o__domain__d__project__p__key__k1: BatchGetSecretValue failed with InternalServiceError"
        );
        assert!(
            chain(&err).contains("service unavailable for"),
            "{}",
            chain(&err)
        );
        assert_eq!(err.throttles(), 0);
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
                            .message(format!("cannot decrypt with {ARN}"))
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
            "failed to fetch secret k: DecryptionFailure"
        );
        assert!(chain(&err).contains(ARN), "the logs get the detail");
    }

    /// A secret scheduled for deletion answers `InvalidRequestException` to a read, by either
    /// API: for the pod it has no value, as `DescribeSecret` tells reference delivery, and the
    /// cascade goes on.
    #[tokio::test]
    async fn a_secret_scheduled_for_deletion_has_no_value_by_either_api() {
        let deleted =
            "You tried to perform the operation on a secret that's currently marked deleted.";
        let batch =
            mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value).then_output(move || {
                BatchGetSecretValueOutput::builder()
                    .errors(
                        ApiErrorType::builder()
                            .secret_id("k")
                            .error_code("InvalidRequestException")
                            .message(deleted)
                            .build(),
                    )
                    .build()
            });
        let get = mock!(aws_sdk_secretsmanager::Client::get_secret_value).then_error(move || {
            GetSecretValueError::InvalidRequestException(
                aws_sdk_secretsmanager::types::error::InvalidRequestException::builder()
                    .message(deleted)
                    .build(),
            )
        });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&batch, &get]);
        for strategy in [FetchStrategy::Batch, FetchStrategy::Parallel] {
            let got = AwsSource::new(client.clone(), 20)
                .with_strategy(strategy)
                .fetch_many(&["k".to_owned()])
                .await
                .unwrap();
            assert_eq!(got.values["k"], Lookup::NotFound, "{strategy:?}");
        }
        assert_eq!((batch.num_calls(), get.num_calls()), (1, 1));
    }

    /// What an endpoint that is not AWS's answers is not repeated as an error code, and an answer
    /// that is no AWS error at all is named by its HTTP status.
    #[tokio::test]
    async fn an_answer_that_is_not_awss_is_named_by_its_status_not_its_words() {
        for (body, code) in [
            (
                r#"{"__type":"SENTINEL value here"}"#,
                "an error code that is not AWS's",
            ),
            (
                "<html>bad gateway</html>",
                "an unreadable response (HTTP 502)",
            ),
        ] {
            let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
                .then_http_response(move || {
                    HttpResponse::new(502.try_into().unwrap(), SdkBody::from(body))
                });
            let client = mock_client!(
                aws_sdk_secretsmanager,
                RuleMode::MatchAny,
                [&rule],
                fast_retries
            );
            let err = AwsSource::new(client, 20)
                .fetch_many(&["k".to_owned()])
                .await
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("failed to fetch secret k: BatchGetSecretValue failed with {code}")
            );
        }
    }

    /// A service that answers every page with another `NextToken` is not followed past one
    /// page per id.
    #[tokio::test]
    async fn a_batch_that_keeps_paging_is_not_followed() {
        let rule =
            mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value).then_output(|| {
                BatchGetSecretValueOutput::builder()
                    .next_token("again")
                    .build()
            });
        let client = mock_client!(
            aws_sdk_secretsmanager,
            RuleMode::MatchAny,
            [&rule],
            fast_retries
        );
        let err = AwsSource::new(client, 20)
            .fetch_many(&ids(2))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("BatchGetSecretValue failed with a NextToken after 2 pages of 2 ids"),
            "{err}"
        );
        assert_eq!(rule.num_calls(), 2);
    }

    // === Strategies ===

    fn get_answer(
        store: &BTreeMap<String, SecretValue>,
        id: &str,
    ) -> MockResponse<GetSecretValueOutput, GetSecretValueError> {
        match store.get(id) {
            Some(v) => MockResponse::Output(
                GetSecretValueOutput::builder()
                    .name(id)
                    .set_secret_string(v.string.clone())
                    .set_secret_binary(v.binary.clone().map(Blob::new))
                    .build(),
            ),
            None => MockResponse::Error(GetSecretValueError::ResourceNotFoundException(
                ResourceNotFoundException::builder()
                    .message("Secrets Manager can't find the specified secret.")
                    .build(),
            )),
        }
    }

    /// A Secrets Manager holding `store`, answering both APIs; the rules count the calls.
    fn both_apis(store: BTreeMap<String, SecretValue>) -> (Rule, Rule) {
        let s1 = store.clone();
        let get = mock!(aws_sdk_secretsmanager::Client::get_secret_value).then_compute_response(
            move |input| get_answer(&s1, input.secret_id().unwrap_or_default()),
        );
        let batch = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
            .then_compute_output(move |input| {
                let view: BTreeMap<&str, SecretValue> =
                    store.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                answer(&view, input.secret_id_list())
            });
        (get, batch)
    }

    fn store_of(wanted: &[String], found: usize) -> BTreeMap<String, SecretValue> {
        wanted[..found]
            .iter()
            .map(|id| (id.clone(), text("fake-value")))
            .collect()
    }

    #[tokio::test]
    async fn parallel_makes_one_get_per_id_and_not_found_is_a_negative_answer() {
        let wanted = ids(25);
        let (get, batch) = both_apis(store_of(&wanted, 10));
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&get, &batch]);
        let got = AwsSource::new(client, 20)
            .with_strategy(FetchStrategy::Parallel)
            .fetch_many(&wanted)
            .await
            .unwrap();
        assert_eq!((get.num_calls(), batch.num_calls()), (25, 0));
        assert_eq!((got.backend_calls, got.backend_ids), (25, 25));
        for (i, id) in wanted.iter().enumerate() {
            let expected = if i < 10 {
                Lookup::Found(text("fake-value"))
            } else {
                Lookup::NotFound
            };
            assert_eq!(got.values[id], expected, "{id}");
        }
    }

    #[tokio::test]
    async fn batch_never_calls_get() {
        let wanted = ids(25);
        let (get, batch) = both_apis(store_of(&wanted, 10));
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&get, &batch]);
        let source = AwsSource::new(client, 20).with_strategy(FetchStrategy::Batch);
        source.fetch_many(&wanted).await.unwrap();
        let again = source.fetch_many(&wanted).await.unwrap();
        assert_eq!((get.num_calls(), batch.num_calls()), (0, 4));
        assert_eq!(again.backend_calls, 2);
    }

    #[tokio::test]
    async fn hybrid_batches_while_cold_then_gets_in_parallel() {
        let wanted = ids(3);
        let (get, batch) = both_apis(store_of(&wanted, 1));
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&get, &batch]);
        let source = AwsSource::new(client, 20).with_strategy(FetchStrategy::Hybrid);
        let cold = source.fetch_many(&wanted).await.unwrap();
        assert_eq!(
            (get.num_calls(), batch.num_calls()),
            (0, 1),
            "cold: one batch"
        );
        let warm = source.fetch_many(&wanted).await.unwrap();
        assert_eq!((get.num_calls(), batch.num_calls()), (3, 1), "then gets");
        assert_eq!(cold.values, warm.values);
    }

    #[tokio::test]
    async fn hybrid_stays_cold_after_a_failed_call() {
        let rule = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value).then_error(|| {
            BatchGetSecretValueError::InternalServiceError(
                InternalServiceError::builder().message("down").build(),
            )
        });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let source = AwsSource::new(client, 20).with_strategy(FetchStrategy::Hybrid);
        source.fetch_many(&ids(1)).await.unwrap_err();
        source.fetch_many(&ids(1)).await.unwrap_err();
        assert_eq!(rule.num_calls(), 2, "still batching");
    }

    // === Throttling ===

    fn throttled() -> HttpResponse {
        HttpResponse::new(
            400.try_into().unwrap(),
            SdkBody::from(format!(
                r#"{{"__type":"ThrottlingException","message":"Rate exceeded for {ARN}"}}"#
            )),
        )
    }

    fn fast_retries(
        c: aws_sdk_secretsmanager::config::Builder,
    ) -> aws_sdk_secretsmanager::config::Builder {
        c.retry_config(
            aws_sdk_secretsmanager::config::retry::RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff(Duration::from_millis(2)),
        )
    }

    #[rstest::rstest]
    #[case::parallel(
        FetchStrategy::Parallel,
        "GetSecretValue allows 10,000 requests per second per account and region"
    )]
    #[case::batch(
        FetchStrategy::Batch,
        "BatchGetSecretValue allows 100 requests per second per account and region"
    )]
    #[tokio::test]
    async fn throttling_past_the_retries_names_the_quota_and_counts_every_attempt(
        #[case] strategy: FetchStrategy,
        #[case] quota: &str,
    ) {
        let get =
            mock!(aws_sdk_secretsmanager::Client::get_secret_value).then_http_response(throttled);
        let batch = mock!(aws_sdk_secretsmanager::Client::batch_get_secret_value)
            .then_http_response(throttled);
        let client = mock_client!(
            aws_sdk_secretsmanager,
            RuleMode::MatchAny,
            [&get, &batch],
            fast_retries
        );
        let err = AwsSource::new(client, 20)
            .with_strategy(strategy)
            .fetch_many(&["k".to_owned()])
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("throttled by AWS Secrets Manager while fetching secret k: "),
            "{msg}"
        );
        assert!(msg.contains(quota), "{msg}");
        assert!(
            !msg.contains("arn:") && !msg.contains("123456789012"),
            "{msg}"
        );
        assert_eq!(err.throttles(), 3, "three attempts, each throttled");
        assert_eq!(get.num_calls() + batch.num_calls(), 3);
        assert!(chain(&err).contains(ARN), "the logs get the detail");
    }

    #[tokio::test]
    async fn a_throttle_the_retry_absorbs_is_still_counted() {
        let get = mock!(aws_sdk_secretsmanager::Client::get_secret_value)
            .sequence()
            .http_response(throttled)
            .output(|| {
                GetSecretValueOutput::builder()
                    .name("k")
                    .secret_string("fake-k")
                    .build()
            })
            .build();
        let client = mock_client!(
            aws_sdk_secretsmanager,
            RuleMode::MatchAny,
            [&get],
            fast_retries
        );
        let got = AwsSource::new(client, 20)
            .with_strategy(FetchStrategy::Parallel)
            .fetch_many(&["k".to_owned()])
            .await
            .unwrap();
        assert_eq!(got.values["k"], Lookup::Found(text("fake-k")));
        assert_eq!((got.throttles, got.backend_calls), (1, 1));
    }

    // === Calls in flight ===

    /// An HTTP connector that answers every request with not-found after letting every other
    /// runnable task run, and records the most requests it held at once.
    #[derive(Debug, Clone, Default)]
    struct Gauge {
        now: Arc<AtomicUsize>,
        max: Arc<AtomicUsize>,
        calls: Arc<AtomicUsize>,
    }

    impl HttpConnector for Gauge {
        fn call(&self, _: HttpRequest) -> HttpConnectorFuture {
            let g = self.clone();
            HttpConnectorFuture::new(async move {
                let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
                g.max.fetch_max(n, Ordering::SeqCst);
                g.calls.fetch_add(1, Ordering::SeqCst);
                // Every call that can start starts before this one ends, so `max` is the peak
                // the bounds allow, without a timer.
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
                g.now.fetch_sub(1, Ordering::SeqCst);
                Ok(HttpResponse::new(
                    400.try_into().unwrap(),
                    SdkBody::from(r#"{"__type":"ResourceNotFoundException","message":"none"}"#),
                ))
            })
        }
    }

    fn gauged(g: &Gauge) -> aws_sdk_secretsmanager::Client {
        let g = g.clone();
        let conf = aws_sdk_secretsmanager::Config::builder()
            .with_test_defaults_v2()
            .http_client(http_client_fn(move |_, _| {
                SharedHttpConnector::new(g.clone())
            }))
            .build();
        aws_sdk_secretsmanager::Client::from_conf(conf)
    }

    #[tokio::test]
    async fn one_admission_has_at_most_its_share_of_calls_in_flight() {
        let g = Gauge::default();
        let source = AwsSource::new(gauged(&g), 20)
            .with_strategy(FetchStrategy::Parallel)
            .with_limits(16, 4);
        let got = source.fetch_many(&ids(30)).await.unwrap();
        assert!(got.values.values().all(|l| *l == Lookup::NotFound));
        assert_eq!(g.calls.load(Ordering::SeqCst), 30);
        assert_eq!(g.max.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn admissions_together_have_at_most_the_process_bound_in_flight() {
        let g = Gauge::default();
        let source = AwsSource::new(gauged(&g), 20)
            .with_strategy(FetchStrategy::Parallel)
            .with_limits(6, 4);
        let (a, b, c) = (ids(30), ids(30), ids(30));
        let (ra, rb, rc) = tokio::join!(
            source.fetch_many(&a),
            source.fetch_many(&b),
            source.fetch_many(&c)
        );
        ra.unwrap();
        rb.unwrap();
        rc.unwrap();
        assert_eq!(g.calls.load(Ordering::SeqCst), 90);
        assert_eq!(g.max.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn batches_count_against_the_bound_too() {
        let g = Gauge::default();
        let source = AwsSource::new(gauged(&g), 1)
            .with_strategy(FetchStrategy::Batch)
            .with_limits(16, 2);
        source.fetch_many(&ids(10)).await.unwrap_err();
        assert_eq!(g.max.load(Ordering::SeqCst), 2);
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
        assert_eq!(source.weighted_size(), 309);
    }

    /// The soak of issue 12: 9,000 ids refreshed 100 times. Each refresh replaces its id's
    /// entry, so the cache holds 9,000 entries of the same weight after every round.
    #[tokio::test]
    async fn refreshing_9000_ids_100_times_holds_9000_entries() {
        let wanted = ids(9_000);
        let mut inner = StaticSource::default();
        for id in &wanted[..4_500] {
            inner = inner.with(id, "fake-value");
        }
        let calls = inner.calls.clone();
        // Bounds far above 9,000 entries, so only replacement can keep the count down; every
        // entry weighs the floor, 1 KiB.
        let roomy = CachePolicy {
            ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
            max_entries: 1 << 20,
            max_bytes: 1 << 30,
        };
        let (source, clock) = cached(inner, roomy);
        for round in 0..100 {
            let got = source.fetch_many(&wanted).await.unwrap();
            assert_eq!(got.backend_ids, 9_000, "round {round} refreshed every id");
            advance(&clock, 2);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 100);
        assert_eq!(source.len(), 9_000);
        assert_eq!(source.weighted_size(), 9_000 * 1024);
    }
}
