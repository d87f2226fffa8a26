//! The pod side of reference delivery: the plans and the injector come from the core
//! ([`podmutator_core::pod`]); [`fetch`] is the init container's program, which talks to AWS.

pub use podmutator_core::pod::{exec, injector, path_problem, plan};

pub mod fetch;
