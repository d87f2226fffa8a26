//! Bytes as a Lambda event: `serde_json::from_slice::<LambdaRequest>` as the runtime does, then
//! `podmutator::transport::lambda::handle`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    podmutator_fuzz::timed("lambda_event", data, podmutator_fuzz::harness::lambda_event);
});
