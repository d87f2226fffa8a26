//! The composition root: [`App::build`] is the one place the webhook is put together from its
//! configuration and the few things that come from outside ([`Deps`]). `main`, `podmutator
//! inject`, every test and every bench build the app here.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Delivery, SecretManagerType};
use crate::metrics::{Metrics, Sink};
use crate::mutate::{Chain, mesh};
use crate::pod::injector::ReferenceInjector;
use crate::prometheus::Counters;
use crate::registry::EntrypointSource;
use crate::secrets::global::{FileEnvSource, GlobalSecretSource};
use crate::secrets::source::SecretSource;
use crate::secrets::{SecretInjector, SecretsMutator};
use crate::secrets::{embedded, global, k8s, sidecar, vault};

/// The webhook's core: the mutator chain and what it runs with. It answers review bodies
/// ([`App::review`]); it knows nothing of HTTP, paths or tokens (see [`crate::transport`]).
pub struct App {
    /// The mutators in order ([`Chain::from_config`]), `secrets` among them.
    pub(crate) chain: Chain,
    /// The chain's `secrets` mutator: the admission plans with it and fetches, then hands the
    /// plan and its values to it through the chain ([`crate::secrets::plan::Prepared`]).
    pub(crate) secrets: Arc<SecretsMutator>,
    pub(crate) source: Option<Arc<dyn SecretSource>>,
    /// Where `reference` delivery resolves names (metadata only, never a value).
    pub(crate) resolver: Option<Arc<dyn SecretSource>>,
    /// Where reference delivery reads the commands of images it wraps
    /// (`embedded.entrypointLookup`).
    pub(crate) entrypoints: Option<Arc<dyn EntrypointSource>>,
    pub(crate) deadline: Duration,
    pub(crate) metrics: Option<Metrics>,
    /// What the probe port's `/metrics` reports; counted whether or not EMF lines are written.
    pub(crate) counters: Arc<Counters>,
    /// [`EmbeddedReads::values`](crate::config::EmbeddedReads): the transport refuses such replies on public
    /// event sources.
    pub(crate) values_in_replies: bool,
    /// [`Deps::errors_in_replies`].
    pub(crate) errors_in_replies: bool,
    /// `http.maxReplyBytes`: the reply limit of [`App::review`].
    pub(crate) max_reply_bytes: usize,
    /// `limits.maxObjectsPerReview`.
    pub(crate) max_objects: usize,
}

/// What the app takes from outside its configuration. Made at the edge (`cli`), by tests, or
/// by `podmutator inject`.
pub struct Deps {
    /// Where the Global manager reads: this process's environment and files in production.
    pub global: Box<dyn GlobalSecretSource>,
    /// Where Embedded values come from. `None` answers a pod that needs one with a 500.
    pub source: Option<Arc<dyn SecretSource>>,
    /// Where `reference` delivery resolves names (`DescribeSecret`). `None` answers a pod that
    /// needs one with a 500.
    pub resolver: Option<Arc<dyn SecretSource>>,
    /// Where image commands are read (`embedded.entrypointLookup`): the registry client, made
    /// at the edge (it holds the network stack the core does not). `None` answers a pod that
    /// needs an image's command with a 500.
    pub entrypoints: Option<Arc<dyn EntrypointSource>>,
    /// Where metric lines go when `metrics.enabled`; `None` sends them nowhere.
    pub metrics: Option<Sink>,
    /// Whether a failed call's own text (AWS's message, which names the account, the role and
    /// the action) goes into the reply rather than only the log: for `inject`, whose reader is
    /// the operator at their own terminal, with their own credentials. Never for a server.
    pub errors_in_replies: bool,
}

impl Deps {
    /// This process: Global reads its environment and files, metrics go to stdout, and no
    /// secret source (add one with [`Deps::with_source`]).
    pub fn process(config: &Config) -> Self {
        Self {
            global: Box::new(FileEnvSource::from_process(&config.secrets)),
            metrics: Some(Sink::Stdout),
            ..Self::offline()
        }
    }

    /// Nothing from outside: an empty Global source, no secret source, no metrics.
    pub fn offline() -> Self {
        Self {
            global: Box::new(global::NoGlobalSecrets),
            source: None,
            resolver: None,
            entrypoints: None,
            metrics: None,
            errors_in_replies: false,
        }
    }

    #[must_use]
    pub fn with_source(mut self, source: Arc<dyn SecretSource>) -> Self {
        self.source = Some(source);
        self
    }

    #[must_use]
    pub fn with_resolver(mut self, resolver: Arc<dyn SecretSource>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    #[must_use]
    pub fn with_entrypoints(mut self, entrypoints: Arc<dyn EntrypointSource>) -> Self {
        self.entrypoints = Some(entrypoints);
        self
    }

    #[must_use]
    pub fn with_global(mut self, global: Box<dyn GlobalSecretSource>) -> Self {
        self.global = global;
        self
    }

    #[must_use]
    pub fn with_metrics(mut self, metrics: Option<Sink>) -> Self {
        self.metrics = metrics;
        self
    }
}

impl App {
    /// Where this app's metric lines go (`None`: `metrics.enabled` is off), for the transports'
    /// own counts (requests refused before an admission).
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    /// Builds the webhook from a loaded configuration, which is a valid one
    /// ([`Config::validate`](crate::config::Config::validate)): nothing here checks it again.
    pub fn build(config: &Config, deps: Deps) -> Self {
        // Secrets never reach the mesh gate: it runs before the app and needs none.
        let skip_containers = mesh::skip_containers(&config.mesh);
        let injectors = injectors(config, deps.global, &skip_containers);
        let secrets = Arc::new(SecretsMutator {
            skip_containers,
            selector: (
                config.secrets_selector.label.clone(),
                config.secrets_selector.value.clone(),
            ),
            limits: config.limits.clone(),
            ..SecretsMutator::new(injectors)
        });
        let metrics = deps.metrics.filter(|_| config.metrics.enabled);
        Self {
            chain: Chain::from_config(config, secrets.clone()),
            secrets,
            source: deps.source,
            resolver: deps.resolver,
            entrypoints: deps.entrypoints,
            deadline: Duration::from_millis(config.embedded.deadline_ms),
            metrics: metrics.map(|sink| Metrics::new(config.metrics.clone(), sink)),
            counters: Arc::new(Counters::default()),
            values_in_replies: config.embedded_reads().values,
            errors_in_replies: deps.errors_in_replies,
            max_reply_bytes: config.http.max_reply_bytes,
            max_objects: config.limits.max_objects_per_review,
        }
    }

    /// Whether a secrets reply can carry an Embedded value (see
    /// [`EmbeddedReads::values`](crate::config::EmbeddedReads)).
    pub fn values_in_replies(&self) -> bool {
        self.values_in_replies
    }

    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// `limits.maxObjectsPerReview`: what one review may weigh ([`App::weight`]).
    pub fn max_objects(&self) -> usize {
        self.max_objects
    }

    /// The Prometheus counters of this app's admissions and of its front's refusals.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

/// The secret managers enabled by `webhook.secretManagerTypes`, in order, Global first.
fn injectors(
    config: &Config,
    global: Box<dyn GlobalSecretSource>,
    skip_containers: &[String],
) -> Vec<Box<dyn SecretInjector>> {
    let w = &config.webhook;
    let mut global = Some(global);
    // A fetcher's image as the other entries may have rewritten it before the pod comes back:
    // the images entry (a rule that skips pods with pull secrets rewrites the same way or not
    // at all) and the image-builder entry, in either order.
    let rules = (config.images.enabled)
        .then(|| crate::mutate::image::rules::ImageRules::new(&config.images));
    let builder = (w.image_builder_config.enabled).then(|| {
        crate::mutate::image::ImageBuilder::new(
            &w.image_builder_config,
            &w.embedded_secret_manager_config.file_mount_init_container,
            &config.images,
        )
    });
    let rewrites = |image: &str| -> Vec<String> {
        let mut forms =
            crate::mutate::image::rewritten_forms(image, rules.as_ref(), builder.as_ref());
        forms.split_off(1)
    };
    let sidecar = |provider: sidecar::Provider, cfg| -> Box<dyn SecretInjector> {
        let injector = sidecar::SidecarInjector::new(provider, cfg);
        let mirrors = rewrites(&injector.image);
        Box::new(injector.rewritten_to(mirrors))
    };
    // Each type once (`enabled_secret_managers`), so the Global source is taken once.
    w.enabled_secret_managers()
        .into_iter()
        .filter_map(|t| -> Option<Box<dyn SecretInjector>> {
            Some(match t {
                SecretManagerType::Global => Box::new(global::GlobalInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                    allowed_usernames: config.embedded.allowed_usernames.clone(),
                    source: global.take()?,
                }),
                SecretManagerType::K8s => Box::new(k8s::K8sInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                }),
                SecretManagerType::Embedded => {
                    let value = embedded::EmbeddedInjector::new(
                        &w.secret_env_var_prefix,
                        &w.embedded_secret_manager_config.file_mount_init_container,
                        &config.embedded,
                    );
                    match config.embedded.delivery {
                        Delivery::Value => Box::new(value),
                        Delivery::Reference => Box::new(
                            ReferenceInjector::new(
                                value,
                                &config.embedded,
                                &w.embedded_secret_manager_config.aws_config.region,
                                skip_containers,
                            )
                            .rewritten_to(rewrites(&config.embedded.fetcher_image)),
                        ),
                    }
                }
                SecretManagerType::Vault => {
                    Box::new(vault::VaultInjector(w.vault_secret_manager.clone()))
                }
                SecretManagerType::AWS => sidecar(sidecar::Provider::Aws, &w.aws_secret_manager),
                SecretManagerType::GCP => sidecar(sidecar::Provider::Gcp, &w.gcp_secret_manager),
                SecretManagerType::Azure => {
                    sidecar(sidecar::Provider::Azure, &w.azure_secret_manager)
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The names the configuration keeps from the mesh gate are the secret managers' own.
    #[test]
    fn the_names_the_gate_may_not_take_are_the_managers() {
        use crate::config::{
            SECRET_MANAGER_CONTAINER_PREFIXES, SECRET_MANAGER_CONTAINERS, SECRET_MANAGER_VOLUMES,
        };
        let providers = [
            sidecar::Provider::Aws,
            sidecar::Provider::Gcp,
            sidecar::Provider::Azure,
        ];
        assert_eq!(
            SECRET_MANAGER_CONTAINERS,
            [crate::pod::injector::INIT_CONTAINER]
        );
        let prefixes: Vec<String> = providers
            .iter()
            .map(|p| format!("{}-pull-secret-", p.slug()))
            .collect();
        assert_eq!(SECRET_MANAGER_CONTAINER_PREFIXES.to_vec(), prefixes);
        let mut volumes = vec![
            embedded::VOLUME.to_owned(),
            crate::pod::injector::FILES_VOLUME.to_owned(),
            crate::pod::injector::RUN_VOLUME.to_owned(),
        ];
        volumes.extend(providers.iter().map(|p| p.volume_name()));
        assert_eq!(SECRET_MANAGER_VOLUMES.to_vec(), volumes);
    }

    fn build(v: serde_json::Value) -> App {
        let config = Config::from_value(v).expect("loads").config;
        App::build(&config, Deps::offline())
    }

    #[test]
    fn the_default_config_builds_the_secrets_mutator_alone() {
        let app = build(json!({}));
        assert_eq!(app.chain().ids(), vec!["secrets"]);
    }

    #[test]
    fn the_image_mutators_follow_their_switches() {
        let app = build(json!({
            "webhook": {"imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"},
                "labelSelector": {"matchLabels": {"image-builder": "true"}}}},
            "images": {"enabled": true, "rules": [{"match": "docker.io", "replace": "r.io/hub"}]}
        }));
        assert_eq!(
            app.chain().ids(),
            vec!["secrets", "image-builder", "image-rules"]
        );
    }
}
