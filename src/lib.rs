//! podmutator: a Kubernetes pod-mutating admission webhook for AWS Lambda and HTTPS.
//!
//! [`App::build`] puts the webhook together from its configuration; [`App::review`] takes
//! review bytes and returns response bytes. The transports ([`transport`]: the Lambda adapter
//! and the HTTPS server) hold an `Arc<App>` behind a [`transport::http::Front`] that checks the
//! path token, route, method and body limit; the core never sees HTTP.
#![forbid(unsafe_code)]

pub mod admission;
pub mod app;
pub mod cli;
pub mod config;
pub mod error;
pub mod image_ref;
pub mod k8s_names;
pub mod metrics;
pub mod mutate;
pub mod patch;
pub mod pod;
pub mod prometheus;
pub mod registration;
pub mod registry;
pub mod secrets;
pub mod transport;

/// This build's version (`Cargo.toml`): in the start-up log line, in `/healthz` and in every
/// metric line, since which release answered is the first question about any failure.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub use admission::Reply;
pub use app::{App, Deps};
pub use config::Config;
pub use error::{Denial, Error};
