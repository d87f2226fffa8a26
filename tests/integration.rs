//! Every integration test, as one test binary: each file of `tests/` is a module here (one
//! link of the library instead of one per file, and their tests share the cores instead of
//! running binary after binary). Run one file's tests with a filter on its module:
//! `cargo test --test integration cli::`, or one test with `--exact cli::<name>`.

mod common;
/// The fuzz targets' oracles (`fuzz/src/harness.rs`), replayed by `bad_input` and
/// `fuzz_regressions`.
#[allow(dead_code)]
#[path = "../fuzz/src/harness.rs"]
mod harness;

/// The binary's allocator (`src/main.rs`), counted on each thread (`common::work`), so that
/// the bad-input corpus and the fuzz regressions can bound the work of what they run.
#[global_allocator]
static GLOBAL: common::work::Counting<mimalloc::MiMalloc> =
    common::work::Counting(mimalloc::MiMalloc);

mod admission;
mod architecture;
mod attacks;
mod bad_input;
mod cargo_lambda;
mod certs;
mod cli;
mod dockerfile;
mod docs;
mod embedded;
mod embedded_aws;
mod embedded_mocks;
mod entrypoint;
mod fuzz_regressions;
mod golden;
mod golden_images;
mod hygiene;
mod iac;
mod kustomize;
mod lambda_events;
mod mesh;
mod metrics;
mod patch_fidelity;
mod pod_side;
mod probe;
mod quota_proxy;
mod reference;
mod release;
mod server;
mod terraform_apply;
