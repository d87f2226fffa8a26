//! Shared test helpers: fixtures, reviews, response decoding.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Value, json};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/fixtures/kubernetes-api/<name>` from the project root.
pub fn k8s_fixture(name: &str) -> Value {
    let path = root()
        .join("..")
        .join("shared/fixtures/kubernetes-api")
        .join(name);
    read_json(&path)
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A pod CREATE review around `pod`, as the API server sends it.
pub fn create_review(pod: &Value, namespace: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e911857d-c318-11e8-bbad-025000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:flyte:flyte-executor", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// The `response` of a review reply.
pub fn response(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {}", String::from_utf8_lossy(body)));
    v["response"].clone()
}

/// The decoded JSON Patch of a response, or an empty array.
pub fn patch_of(response: &Value) -> Value {
    match response.get("patch") {
        None => json!([]),
        Some(Value::String(b64)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("patch is base64");
            serde_json::from_slice(&bytes).expect("patch is JSON")
        }
        Some(other) => panic!("patch must be a base64 string, got {other}"),
    }
}

/// Applies `patch` to `doc` with the `json-patch` crate (not our diff code).
pub fn apply(doc: &Value, patch: &Value) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("valid JSON Patch");
    let mut out = doc.clone();
    json_patch::patch(&mut out, &ops).expect("patch applies to the original document");
    out
}
