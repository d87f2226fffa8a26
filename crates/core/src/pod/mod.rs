//! The pod side of reference delivery, as the webhook sees it: what runs inside the task pod,
//! with the pod's own AWS identity, so that the webhook never holds a secret value.
//!
//! - [`plan`]: the plan of `podmutator fetch`, the one init container ([`plan::FETCH_PLAN_ENV`]).
//!   It fetches every secret in one round trip and writes each to a file (mode 0400) on an
//!   in-memory volume, all or nothing; it can also copy the exec wrapper into a volume. The
//!   fetcher itself is in the `podmutator` binary.
//! - [`exec`] (the `podmutator-exec` crate): `podmutator exec -- <command> <args>`, the wrapper
//!   of a container that needs secrets as environment variables. It reads the files
//!   [`exec::EXEC_ENV_ENV`] names into its environment and replaces itself with the original
//!   command, so the values exist only in that process's memory and never in the pod spec.
//! - [`injector`]: the injector that writes both plans into the pod.
//!
//! Both programs read their whole plan from one environment variable, written by the webhook,
//! and validate it before doing anything: a plan is data from the pod spec, which whoever may
//! create pods can write.

pub mod injector;
pub mod plan;

/// `podmutator exec`: its own crate, because its binary is what a pod copies.
pub use podmutator_exec as exec;
pub use podmutator_exec::names::path_problem;
