//! podmutator on AWS: the network side of the webhook. Secrets Manager behind the core's
//! [`SecretSource`](podmutator_core::secrets::source::SecretSource) ([`secretsmanager`]: values,
//! batching, bounds, the cache and the process's one AWS configuration; [`resolve`]: names
//! only), and the registry client that reads image commands, ECR included ([`registry`]).

pub mod registry;
pub mod resolve;
pub mod secretsmanager;
pub mod wiring;
