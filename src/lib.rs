//! podmutator: a Kubernetes pod-mutating admission webhook for AWS Lambda and HTTPS.
//!
//! The workspace by layer: the admission itself is [`podmutator_core`] (no network stack:
//! `App::build` puts the webhook together, `App::review` turns review bytes into reply bytes);
//! AWS Secrets Manager, its cache, the registry client and the wiring of all three are
//! [`podmutator_aws`]. This crate holds what the binary adds: the transports ([`transport`]:
//! the Lambda adapter and the HTTPS server, each holding an `Arc<App>` behind a
//! [`transport::http::Front`] that checks the path token, route, method and body limit), the
//! start-up gate ([`startup`]), `serve`'s orchestration ([`serve`]), the log ([`logging`]), the
//! command line ([`cli`]) with the configuration's loading ([`load`]) and `check-config`'s
//! output ([`check_config`]), the registration renderer ([`registration`]) and the pod side
//! ([`pod`]).
#![forbid(unsafe_code)]

pub mod check_config;
pub mod cli;
pub mod load;
pub mod logging;
pub mod pod;
#[cfg(feature = "tools")]
pub mod registration;
#[cfg(feature = "serve")]
pub mod serve;
pub mod startup;
pub mod transport;
