//! podmutator: a Kubernetes pod-mutating admission webhook for AWS Lambda and HTTPS.
//!
//! The core is pure: [`admission::App::review`] takes review bytes and returns response bytes;
//! the Lambda adapter ([`lambda`]) and the HTTPS server ([`server`]) are thin edges around it.
#![forbid(unsafe_code)]

pub mod admission;
pub mod cli;
pub mod config;
pub mod error;
pub mod http;
pub mod lambda;
pub mod metrics;
pub mod mutate;
pub mod patch;
pub mod registration;
pub mod secrets;
pub mod server;

pub use admission::{App, Reply};
pub use config::Config;
pub use error::{Denial, Error};

use config::{ConfigError, SecretManagerType};
use mutate::Chain;
use secrets::{SecretInjector, SecretsMutator};

/// The secret managers enabled by `webhook.secretManagerTypes`, in order, Global first; the
/// Global manager reads `global` (this process's environment and files in production).
pub fn build_injectors(
    config: &Config,
    global: Box<dyn secrets::global::GlobalSecretSource>,
) -> Result<Vec<Box<dyn SecretInjector>>, ConfigError> {
    let w = &config.webhook;
    let mut global = Some(global);
    w.enabled_secret_managers()
        .into_iter()
        .map(|t| -> Result<Box<dyn SecretInjector>, ConfigError> {
            Ok(match t {
                SecretManagerType::Global => Box::new(secrets::global::GlobalInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                    source: global.take().ok_or_else(|| {
                        ConfigError::new("webhook.secretManagerTypes", "Global listed twice")
                    })?,
                }),
                SecretManagerType::K8s => Box::new(secrets::k8s::K8sInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                }),
                SecretManagerType::Embedded => Box::new(secrets::embedded::EmbeddedInjector::new(
                    &w.secret_env_var_prefix,
                    &w.embedded_secret_manager_config.file_mount_init_container,
                    &config.embedded,
                )),
                SecretManagerType::Vault => Box::new(secrets::vault::VaultInjector::from_config(
                    &w.vault_secret_manager,
                )),
                SecretManagerType::AWS => Box::new(secrets::sidecar::SidecarInjector::new(
                    secrets::sidecar::Provider::Aws,
                    &w.aws_secret_manager,
                )),
                SecretManagerType::GCP => Box::new(secrets::sidecar::SidecarInjector::new(
                    secrets::sidecar::Provider::Gcp,
                    &w.gcp_secret_manager,
                )),
                SecretManagerType::Azure => Box::new(secrets::sidecar::SidecarInjector::new(
                    secrets::sidecar::Provider::Azure,
                    &w.azure_secret_manager,
                )),
            })
        })
        .collect()
}

/// The mutator chain, built once at start, in [`mutate::MUTATOR_IDS`] order.
pub fn build_chain(config: &Config) -> Result<Chain, ConfigError> {
    build_chain_with(
        config,
        Box::new(secrets::global::FileEnvSource::from_process(
            &config.secrets,
        )),
    )
}

/// [`build_chain`] with the Global manager reading `global` instead of this process.
pub fn build_chain_with(
    config: &Config,
    global: Box<dyn secrets::global::GlobalSecretSource>,
) -> Result<Chain, ConfigError> {
    let secrets = SecretsMutator {
        // Secrets never reach the mesh gate: it runs before the app and needs none.
        skip_containers: mutate::mesh::skip_containers(&config.mesh),
        selector: (
            config.secrets_selector.label.clone(),
            config.secrets_selector.value.clone(),
        ),
        ..SecretsMutator::new(build_injectors(config, global)?)
    };
    let mut chain = Chain::default();
    for (m, default_required) in
        mutate::mesh::in_chain_order(&config.mesh, (Box::new(secrets), true))
    {
        let required = config.mutator_required(m.id(), default_required);
        chain.push(m, required);
    }
    Ok(chain)
}
