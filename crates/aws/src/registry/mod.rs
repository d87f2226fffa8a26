//! Image commands from registries: the core's [`EntrypointSource`] over HTTPS ([`client`]),
//! ECR's token signed with the process's AWS identity ([`ecr`]).

pub mod client;
pub mod ecr;
pub mod http;
