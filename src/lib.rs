//! podmutator: a Kubernetes pod-mutating admission webhook for AWS Lambda and HTTPS.
//!
//! The workspace by layer: the admission itself is [`podmutator_core`] (no network stack:
//! [`App::build`] puts the webhook together, [`App::review`] turns review bytes into reply
//! bytes); AWS Secrets Manager, its cache and the registry client are [`podmutator_aws`]; this
//! crate holds the edges: the transports ([`transport`]: the Lambda adapter and the HTTPS
//! server, each holding an `Arc<App>` behind a [`transport::http::Front`] that checks the path
//! token, route, method and body limit), the command line ([`cli`]), the registration renderer
//! ([`registration`]) and the pod's fetcher ([`pod::fetch`]).
//!
//! The core's modules are re-exported under their own names, and [`secrets`] and [`registry`]
//! join each core module with its AWS half, so `podmutator::secrets::source::AwsSource` and
//! `podmutator::secrets::source::SecretSource` both resolve.
#![forbid(unsafe_code)]

pub mod cli;
pub mod pod;
#[cfg(feature = "tools")]
pub mod registration;
pub mod transport;

pub use podmutator_aws as aws;
pub use podmutator_core::{
    VERSION, admission, app, config, error, image_ref, k8s_names, metrics, mutate, patch,
    prometheus,
};

/// The core's secret managers with the AWS sources of Embedded mode.
pub mod secrets {
    pub use podmutator_aws::resolve;
    pub use podmutator_core::secrets::*;

    /// The core's source contract with its AWS Secrets Manager implementations.
    pub mod source {
        pub use podmutator_aws::secretsmanager::*;
        pub use podmutator_core::secrets::source::*;
    }
}

/// The core's lookup contract with the registry client.
pub mod registry {
    pub use podmutator_aws::registry::*;
}

pub use admission::Reply;
pub use app::{App, Deps};
pub use config::Config;
pub use error::{Denial, Error};
