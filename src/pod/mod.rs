//! The pod side of reference delivery that talks to AWS: [`fetch`], the init container's
//! program. The plans, the injector and `exec` are the core's ([`podmutator_core::pod`]).

pub mod fetch;
