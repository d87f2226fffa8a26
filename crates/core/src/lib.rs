//! podmutator's core: the admission of a pod, from review bytes to reply bytes, with no network
//! stack. [`App::build`] puts the webhook together from its configuration and what comes from
//! outside ([`Deps`]: the secret sources and the registry client, made by the `podmutator`
//! binary with the `podmutator-aws` crate); [`App::review`] takes review bytes and returns
//! response bytes. The transports hold an `Arc<App>`; the core never sees HTTP.
#![forbid(unsafe_code)]

pub mod admission;
pub mod app;
pub mod config;
pub mod error;
pub mod image_ref;
pub mod k8s_names;
pub mod metrics;
pub mod mutate;
pub mod patch;
pub mod pod;
pub mod prometheus;
pub mod registry;
pub mod secrets;

pub use admission::Reply;
pub use app::{App, Deps};
pub use config::Config;
pub use error::{Denial, Error};
