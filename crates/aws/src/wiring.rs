//! The webhook's outside dependencies, from its validated configuration: the one place they are
//! built, for `serve`, `lambda`, `check-config`, `inject`, the tests and the benches. What is
//! built follows [`Config::embedded_reads`], the one decoding of what Embedded mode reads.
//!
//! Nothing here touches the network: the AWS configuration is loaded on its first use
//! ([`SharedAws`]), and each Secrets Manager client on its source's first fetch ([`Lazy`]), so
//! a cold start whose first admissions fetch nothing pays for neither.

use std::sync::Arc;
use std::time::Duration;

use podmutator_core::Deps;
use podmutator_core::config::{Config, ConfigError};
use podmutator_core::secrets::source::{BoxFuture, Fetched, SecretSource, SourceError};

use crate::registry::client::RegistryClient;
use crate::resolve::DescribeSource;
use crate::secretsmanager::{AwsSource, CachePolicy, CachingSource, SharedAws};

/// `deps` with each outside dependency that `config` reads and `deps` lacks: Embedded's value
/// source and name resolver (Secrets Manager behind the configured cache) and the registry
/// client of `embedded.entrypointLookup`, all on `aws`. What `deps` already holds (a test's
/// double) is kept.
pub fn deps(config: &Config, aws: &SharedAws, mut deps: Deps) -> Result<Deps, ConfigError> {
    let reads = config.embedded_reads();
    let region = region(config);
    let budget = Duration::from_millis(config.embedded.deadline_ms);
    let cached = |source: Arc<dyn SecretSource>| -> Arc<dyn SecretSource> {
        Arc::new(CachingSource::new(
            source,
            CachePolicy::from_config(&config.embedded),
        ))
    };
    if reads.values && deps.source.is_none() {
        let embedded = config.embedded.clone();
        deps.source = Some(cached(Arc::new(Lazy::new(
            aws,
            region,
            budget,
            move |client| AwsSource::from_config(client, &embedded),
        ))));
    }
    if reads.names && deps.resolver.is_none() {
        deps.resolver = Some(cached(Arc::new(Lazy::new(
            aws,
            region,
            budget,
            DescribeSource::new,
        ))));
    }
    if reads.images && deps.entrypoints.is_none() {
        let client = RegistryClient::new(&config.embedded.entrypoint_lookup)
            .map_err(|e| ConfigError::new("embedded.entrypointLookup.caBundleFile", e.0))?;
        deps.entrypoints = Some(Arc::new(client.with_ecr(aws.clone())));
    }
    Ok(deps)
}

/// Embedded's region (`webhook.embeddedSecretManagerConfig.awsConfig.region`, empty for the
/// SDK's chain): the process's one AWS configuration is loaded with it.
pub fn region(config: &Config) -> &str {
    &config
        .webhook
        .embedded_secret_manager_config
        .aws_config
        .region
}

/// A Secrets Manager source whose client is made on its first fetch. Loading the AWS
/// configuration (root certificates, the HTTP client, the credential chain's providers) costs a
/// cold start time it need not pay when its first admissions fetch nothing; made here, it is
/// paid once, inside that fetch's deadline.
pub struct Lazy<S> {
    aws: SharedAws,
    region: String,
    budget: Duration,
    make: Box<dyn Fn(aws_sdk_secretsmanager::Client) -> S + Send + Sync>,
    source: tokio::sync::OnceCell<S>,
}

impl<S> Lazy<S> {
    pub fn new(
        aws: &SharedAws,
        region: &str,
        budget: Duration,
        make: impl Fn(aws_sdk_secretsmanager::Client) -> S + Send + Sync + 'static,
    ) -> Self {
        Self {
            aws: aws.clone(),
            region: region.to_owned(),
            budget,
            make: Box::new(make),
            source: tokio::sync::OnceCell::new(),
        }
    }
}

impl<S: SecretSource> SecretSource for Lazy<S> {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let source = self
                .source
                .get_or_init(|| async {
                    let client = self.aws.secrets_manager(&self.region, self.budget).await;
                    (self.make)(client)
                })
                .await;
            source.fetch_many(ids).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podmutator_core::secrets::source::{Lookup, StaticSource};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_lazy_source_is_made_on_its_first_fetch_and_once() {
        let aws = SharedAws::with_loader(
            aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new("us-east-1"))
                .credentials_provider(aws_credential_types::Credentials::new(
                    "testing", "testing", None, None, "test",
                ))
                .endpoint_url("http://127.0.0.1:9"),
        );
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let lazy = Lazy::new(&aws, "", Duration::from_secs(1), move |_client| {
            counter.fetch_add(1, Ordering::SeqCst);
            StaticSource::default().with("id", "value")
        });
        assert_eq!(made.load(Ordering::SeqCst), 0, "made before any fetch");
        assert_eq!(
            aws.loads(),
            0,
            "the AWS configuration loaded before any fetch"
        );
        for _ in 0..3 {
            let got = lazy.fetch_many(&["id".to_owned()]).await.unwrap();
            assert!(matches!(got.values.get("id"), Some(Lookup::Found(_))));
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert_eq!(aws.loads(), 1);
    }
}
