//! Findings of the fuzz targets (`scripts/fuzz.sh`) and of the bad-input corpus, kept as
//! regression cases: every input saved under `fuzz/regressions/<target>/` replays through the
//! same oracles as the fuzzer (`fuzz/src/harness.rs`), and each bug found has a named case whose
//! name is the claim. A case fails until its bug is fixed; none is ignored. Every fuzz target
//! must have a regression folder holding at least its minimal inputs ([`MINIMAL`]).
//!
//! Bounds here are on work counted on the test's thread (allocations, bytes allocated, patch
//! operations), not on milliseconds: steady on a loaded machine and in a debug build. Times in
//! release are reported by `scripts/bench-bad-input.sh`.

use crate::common;

use crate::harness;

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};

use common::root;
use common::work::measure;
use podmutator_core::mutate::Route;
use serde_json::{Value, json};

fn base_review() -> Value {
    common::read_json(&root().join("tests/fixtures/bad-input/base-review.json"))
}

/// `App::review` of the default app on Flyte's route; (HTTP status, reply).
fn review(body: &[u8]) -> (u16, Value) {
    let reply = harness::block_on(harness::apps().default.review(Route::Secrets, body));
    let v = serde_json::from_slice(&reply.body).expect("reply is JSON");
    (reply.status, v)
}

/// A fuzz target's oracle, by name.
type Target = (&'static str, fn(&[u8]));

const TARGETS: [Target; 4] = [
    ("review", harness::review),
    ("codec", harness::codec_bytes),
    ("lambda_event", harness::lambda_event),
    ("handler", harness::handler),
];

/// Inputs every target's regression folder must hold: the empty input, and the smallest inputs
/// that reach each target's main path (checked by
/// [`the_minimal_inputs_reach_what_they_are_for`]).
const MINIMAL: [(&str, &[&str]); 4] = [
    (
        "review",
        &[
            "minimal-empty",
            "minimal-empty-object",
            "minimal-pod-create",
        ],
    ),
    (
        "codec",
        &["minimal-empty", "minimal-one-byte", "minimal-text-secret"],
    ),
    (
        "lambda_event",
        &[
            "minimal-empty",
            "minimal-empty-object",
            "minimal-http-api-event",
        ],
    ),
    (
        "handler",
        &["minimal-empty", "minimal-healthz", "minimal-post"],
    ),
];

fn regression(target: &str, name: &str) -> Vec<u8> {
    let path = root().join("fuzz/regressions").join(target).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_fuzz_target_has_an_oracle_here_and_its_minimal_regressions() {
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("fuzz/fuzz_targets")).expect("fuzz/fuzz_targets") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|x| x == "rs") {
            on_disk.insert(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    let here: BTreeSet<String> = TARGETS.iter().map(|(t, _)| (*t).to_owned()).collect();
    assert_eq!(
        here, on_disk,
        "each fuzz target needs its oracle in TARGETS"
    );
    let minimal: BTreeSet<String> = MINIMAL.iter().map(|(t, _)| (*t).to_owned()).collect();
    assert_eq!(
        minimal, on_disk,
        "each fuzz target needs its MINIMAL inputs"
    );
    for (target, names) in MINIMAL {
        let dir = root().join("fuzz/regressions").join(target);
        assert!(dir.is_dir(), "{} is missing", dir.display());
        for name in names {
            assert!(
                dir.join(name).is_file(),
                "{target}: minimal input {name} is missing"
            );
        }
    }
}

#[test]
fn every_saved_fuzz_input_passes_its_targets_oracles() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (target, check) in TARGETS {
        let dir = root().join("fuzz/regressions").join(target);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (every target has regressions)", dir.display()));
        let mut files: Vec<_> = entries.map(|e| e.expect("dir entry").path()).collect();
        files.sort();
        assert!(!files.is_empty(), "{} is empty", dir.display());
        for path in files {
            count += 1;
            let data = std::fs::read(&path).expect("readable input");
            let name = format!("{target}/{}", path.file_name().unwrap().to_string_lossy());
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failures.push(format!("{name}: an oracle failed (see the panic above)"));
            }
        }
    }
    println!("replayed {count} saved fuzz inputs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The minimal inputs are not only harmless: each reaches the path it stands for.
#[test]
fn the_minimal_inputs_reach_what_they_are_for() {
    // review: the smallest pod CREATE that asks for a secret is admitted with a patch; `{}` is
    // refused (no request), the empty body too.
    let (status, v) = review(&regression("review", "minimal-pod-create"));
    assert_eq!(
        (status, &v["response"]["allowed"]),
        (200, &json!(true)),
        "{v}"
    );
    assert!(v["response"]["patch"].is_string(), "{v}");
    for name in ["minimal-empty", "minimal-empty-object"] {
        let (status, v) = review(&regression("review", name));
        assert_eq!(status, 400, "{name}: {v}");
    }
    // codec: the text secret parses.
    let text = regression("codec", "minimal-text-secret");
    assert!(podmutator_core::secrets::codec::unmarshal_text(&text).is_ok());
    // lambda_event: the smallest event the runtime accepts, answered by our code (a 404 names
    // the missing route, so the event got past deserialisation).
    let event = regression("lambda_event", "minimal-http-api-event");
    let event: lambda_http::request::LambdaRequest =
        serde_json::from_slice(&event).expect("the runtime accepts the minimal event");
    let reply = harness::block_on(podmutator::transport::lambda::handle(
        &harness::apps().default,
        event,
    ));
    assert_eq!(reply.status(), 404);
    for name in ["minimal-empty", "minimal-empty-object"] {
        let bytes = regression("lambda_event", name);
        assert!(
            serde_json::from_slice::<lambda_http::request::LambdaRequest>(&bytes).is_err(),
            "{name}"
        );
    }
    // handler: healthz answers 200, a POST of `{}` to Flyte's route reaches the review (400).
    for (name, status) in [("minimal-healthz", 200), ("minimal-post", 400)] {
        let data = regression("handler", name);
        let input = harness::HttpInput::parse(&data);
        let reply = harness::block_on(harness::apps().default.handle(
            podmutator::transport::http::Incoming {
                method: &input.method,
                path: &input.path,
                content_type: input.content_type.as_deref(),
                body: input.body,
            },
        ));
        assert_eq!(reply.status, status, "{name}");
    }
}

/// A review of `base-review.json` with its annotations replaced by `count` copies of `s0`.
fn with_secret_annotations(count: usize) -> Vec<u8> {
    let mut r = base_review();
    let annotations = &mut r["request"]["object"]["metadata"]["annotations"];
    let value = annotations["flyte.secrets/s0"].clone();
    *annotations = (0..count)
        .map(|i| (format!("flyte.secrets/s{i}"), value.clone()))
        .collect::<serde_json::Map<_, _>>()
        .into();
    serde_json::to_vec(&r).expect("serialise")
}

/// Found writing the bad-input corpus: the secrets mutator's prefetch cloned the whole pod once
/// per secret request (`crates/core/src/secrets/mod.rs`, `SecretsMutator::prefetch`:
/// `scratch.get_or_insert_with(|| pod.clone())` inside the loop over requests, when a manager
/// that fetches comes after others), and the pod carries every annotation, so the work grew
/// with the square of the number of `flyte.secrets/s<N>` annotations (release, busy 2-core
/// machine: 1,000 took 51 ms, 10,000 5.7 to 7 s). Counted instead of timed, through the default
/// chain and through the rich one (Global, then Embedded with a source, Vault, AWS): ten times
/// the annotations may cost at most 15 times the allocations and bytes (linear work is 10x plus
/// fixed costs; the bug was 100x), with the same answer whatever the count (all copies ask for
/// one secret). 10,000 annotations, in release, are timed by `scripts/bench-bad-input.sh`
/// (`huge/ten-thousand-secret-annotations`).
#[test]
fn secret_annotations_cost_linear_work() {
    let apps = harness::apps();
    for (name, app) in [("default", &apps.default), ("rich", &apps.rich)] {
        let mut runs = Vec::new();
        for count in [300, 3_000] {
            let body = with_secret_annotations(count);
            let (reply, work) = measure(|| harness::block_on(app.review(Route::Secrets, &body)));
            let r = harness::check_review_reply(reply.status, &reply.body);
            assert_eq!(r.status, 200, "{name}: {}", r.v);
            let ops = r.patch.as_ref().map_or(0, |p| p.as_array().unwrap().len());
            println!(
                "{name}: {count} annotations ({} bytes): {work}, allowed {}, {ops} patch ops",
                body.len(),
                r.allowed
            );
            runs.push((work, r.allowed, ops));
        }
        let (small, large) = (runs[0], runs[1]);
        assert_eq!(
            (small.1, small.2),
            (large.1, large.2),
            "{name}: the same secret gives the same answer"
        );
        assert!(
            large.0.allocations <= 15 * small.0.allocations,
            "{name}: 10x the annotations cost {} allocations against {}: super-linear",
            large.0.allocations,
            small.0.allocations
        );
        assert!(
            large.0.bytes <= 15 * small.0.bytes,
            "{name}: 10x the annotations allocated {} bytes against {}: super-linear",
            large.0.bytes,
            small.0.bytes
        );
    }
}

/// Splices `depth` nested arrays in as `request.object.spec.template` of a Deployment review.
fn deep_deployment(depth: usize) -> Vec<u8> {
    let mut r = base_review();
    r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    r["request"]["object"] = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "fake-deployment"},
        "spec": {"template": "NEST"}
    });
    let text = serde_json::to_string(&r).expect("serialise");
    let nest = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    text.replacen("\"NEST\"", &nest, 1).into_bytes()
}

/// Found by the bad-input corpus (`nesting/ten-thousand-nested-arrays-in-a-deployment`): when a
/// review fails both the typed (Pod) and the untyped parse, `parse` in `crates/core/src/admission.rs`
/// reports the typed error, so a Deployment that is too deeply nested is refused with
/// `invalid value: string "apps/v1", expected v1 (at request.object)`: a Pod-schema complaint
/// about an object that was never meant to be a Pod, hiding the real problem.
#[test]
fn a_deployment_nested_too_deep_is_refused_for_its_depth_not_as_a_broken_pod() {
    let (status, v) = review(&deep_deployment(10_000));
    assert_eq!(status, 400, "{v}");
    let message = v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("recursion limit"), "{message}");
    assert!(!message.contains("expected v1"), "{message}");
}

/// The same confusion without any nesting: a Deployment whose labels are not a map.
#[test]
fn a_deployment_with_malformed_labels_is_refused_for_its_labels_not_as_a_broken_pod() {
    let mut r = base_review();
    r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    r["request"]["object"] = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "fake-deployment", "labels": ["not", "a", "map"]},
        "spec": {}
    });
    let (status, v) = review(&serde_json::to_vec(&r).expect("serialise"));
    assert_eq!(status, 400, "{v}");
    let message = v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("labels"), "{message}");
    assert!(!message.contains("expected v1"), "{message}");
}

/// Found by the `review` target (`fuzz/regressions/review/invalid-utf8-in-an-unknown-field.json`):
/// serde_json checks UTF-8 only in strings it reads; in the value of a field no type knows (here
/// `request.object.spec.fakeExtension`) it skips invalid bytes, so `parse` in `crates/core/src/admission.rs`
/// admits, and mutates, a body that is not JSON, where the README's outcome table says "not JSON:
/// 400". Harmless in practice (the API server sends valid UTF-8), but the promise is broken.
#[test]
fn a_body_with_invalid_utf8_in_an_unknown_field_is_refused_as_not_json() {
    let mut r = base_review();
    r["request"]["object"]["spec"]["fakeExtension"] = json!("MARK");
    let body = serde_json::to_vec(&r)
        .expect("serialise")
        .windows(4)
        .position(|w| w == b"MARK")
        .map(|at| {
            let mut b = serde_json::to_vec(&r).expect("serialise");
            b.splice(at..at + 4, [0xff, 0xfe]);
            b
        })
        .expect("marker");
    assert!(std::str::from_utf8(&body).is_err());
    let (status, v) = review(&body);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["response"]["allowed"], false, "{v}");
}

/// Found by the `review` target (`fuzz/regressions/review/pod-without-metadata-on-the-namespace-route.json`,
/// a mesh pod whose `metadata` key is misspelt): the typed `Pod` always has `metadata`, so the
/// diff (`crates/core/src/patch.rs`, `diff` of the typed before/after) answers `add /metadata/labels` for a
/// pod the API server sent without `metadata`, a patch that cannot apply to that pod (the API
/// server then fails the call and `failurePolicy` decides). The API server always sends
/// `metadata`, so this is robustness, not a live bug; the fix is to add `/metadata` whole, or to
/// refuse such a pod with a 400.
#[test]
fn the_patch_applies_to_a_pod_sent_without_metadata() {
    let mesh: Value = common::read_json(&root().join("tests/fixtures/mesh/config.json"));
    let loaded =
        podmutator_core::config::Config::from_value(json!({"mesh": mesh})).expect("config");
    let app = common::webhook(&loaded.config, podmutator_core::Deps::offline());
    let mut r = base_review();
    r["request"]["object"]
        .as_object_mut()
        .expect("object")
        .remove("metadata");
    let body = serde_json::to_vec(&r).expect("serialise");
    let reply = harness::block_on(app.review(Route::ManagedNamespace, &body));
    let out = harness::check_review_reply(reply.status, &reply.body);
    // The namespace route manages the pod: it must be admitted with the managed label (and the
    // mesh's DNS settings), so a patch is required, and it must apply to the pod as sent.
    assert!(out.allowed, "{}", out.v);
    let patch = out
        .patch
        .unwrap_or_else(|| panic!("the namespace route must label the pod: {}", out.v));
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("JSON Patch");
    let mut pod = r["request"]["object"].clone();
    assert!(pod.get("metadata").is_none());
    json_patch::patch(&mut pod, &ops)
        .unwrap_or_else(|e| panic!("the patch does not apply ({e}): {patch}"));
    let label = mesh["managedLabel"].as_str().unwrap_or("aether.io/managed");
    assert_eq!(pod["metadata"]["labels"][label], "true", "{pod}");
}
