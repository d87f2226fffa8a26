//! Bytes as an AdmissionReview body: `App::review` with the default config (Flyte's route) and
//! with Embedded (fake source) + Vault + AWS managers and the mesh mutators (route by length).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    podmutator_fuzz::timed("review", data, podmutator_fuzz::harness::review);
});
