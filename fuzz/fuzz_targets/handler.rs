//! `METHOD\nPATH\nCONTENT-TYPE\nBODY` through `App::handle` (routing, methods, content type,
//! body limit, path token) of the default app and of one behind a path token.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    podmutator_fuzz::timed("handler", data, podmutator_fuzz::harness::handler);
});
