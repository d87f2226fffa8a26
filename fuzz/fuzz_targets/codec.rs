//! Flyte's annotation codec: the bytes as base32 / annotation value / protobuf text, and, from
//! the same bytes read as `arbitrary` data, a structured `Secret` and an annotation map.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use podmutator_core::secrets::codec::{ANNOTATION_PREFIX, MountRequirement, Secret};
use podmutator_fuzz::harness;

#[derive(Debug, Arbitrary)]
struct ArbSecret {
    group: String,
    group_version: String,
    key: String,
    /// 0-2 name a variant; anything else is `Unknown`.
    mount: i32,
    env_var: String,
}

/// An annotation key, mostly under Flyte's prefix so the index parser is exercised.
#[derive(Debug, Arbitrary)]
struct ArbAnnotation {
    prefixed: bool,
    suffix: String,
    value: String,
}

#[derive(Debug, Arbitrary)]
struct Structured {
    secret: ArbSecret,
    annotations: Vec<ArbAnnotation>,
}

fuzz_target!(|data: &[u8]| {
    podmutator_fuzz::timed("codec", data, |data| {
        harness::codec_bytes(data);
        let Ok(s) = Structured::arbitrary(&mut Unstructured::new(data)) else {
            return;
        };
        harness::codec_secret(&Secret {
            group: s.secret.group,
            group_version: s.secret.group_version,
            key: s.secret.key,
            mount_requirement: MountRequirement::from_number(s.secret.mount),
            env_var: s.secret.env_var,
        });
        let annotations: BTreeMap<String, String> = s
            .annotations
            .into_iter()
            .map(|a| {
                let key = if a.prefixed {
                    format!("{ANNOTATION_PREFIX}{}", a.suffix)
                } else {
                    a.suffix
                };
                (key, a.value)
            })
            .collect();
        harness::codec_annotations(&annotations);
    });
});
