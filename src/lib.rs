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

/// The secret managers enabled by `webhook.secretManagerTypes`, in order, Global first.
pub fn build_injectors(config: &Config) -> Result<Vec<Box<dyn SecretInjector>>, ConfigError> {
    let w = &config.webhook;
    w.enabled_secret_managers()
        .into_iter()
        .map(|t| -> Result<Box<dyn SecretInjector>, ConfigError> {
            Ok(match t {
                SecretManagerType::Global => Box::new(secrets::global::GlobalInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                    source: Box::new(secrets::global::FileEnvSource::from_process(
                        &config.secrets,
                    )),
                }),
                SecretManagerType::K8s => Box::new(secrets::k8s::K8sInjector {
                    env_prefix: w.secret_env_var_prefix.clone(),
                }),
                SecretManagerType::Embedded => Box::new(secrets::embedded::EmbeddedInjector::new(
                    &w.secret_env_var_prefix,
                    &w.embedded_secret_manager_config.file_mount_init_container,
                    &config.embedded,
                )),
                other => {
                    return Err(ConfigError::new(
                        "webhook.secretManagerTypes",
                        format!("secret manager {other} is not available in this build"),
                    ));
                }
            })
        })
        .collect()
}

/// The mutator chain, built once at start.
pub fn build_chain(config: &Config) -> Result<Chain, ConfigError> {
    let mut chain = Chain::default();
    chain.push(
        Box::new(SecretsMutator {
            injectors: build_injectors(config)?,
            skip_containers: Vec::new(),
        }),
        config.mutator_required("secrets", true),
    );
    Ok(chain)
}
