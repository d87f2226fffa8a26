//! Golden tests for the two image mutators (`image-builder`, `image-rules`), through the real
//! configuration path and the route of their own webhook entry. For every case the decoded
//! response and the stored pod are compared with `tests/fixtures/golden/images/out/<case>.json`;
//! every admitted case's patch is applied to the original pod JSON by Python's `jsonpatch` and
//! must give the same pod, replaces `image` fields only, changes nothing on re-admission, and
//! yields a pod `kubernetes-validate --strict` accepts.
//!
//! A case is `{"description", "config", "route": "image-builder" | "images", "namespace",
//! "pod"}` in `tests/fixtures/golden/images/cases/`. `PODMUTATOR_BLESS=1 cargo test --test
//! golden_images` writes the outputs; review them, then commit.

use crate::common;

use std::path::PathBuf;

use common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/golden/images")
}

struct Case {
    name: String,
    route: Route,
    namespace: String,
    config: Value,
    pod: Value,
}

fn cases() -> Vec<Case> {
    let files = json_files(&fixtures().join("cases"));
    assert!(files.len() >= 5, "{files:?}");
    files
        .iter()
        .map(|f| {
            let v = read_json(f);
            let name = f.file_stem().unwrap().to_string_lossy().into_owned();
            for key in v.as_object().unwrap().keys() {
                assert!(
                    ["description", "config", "route", "namespace", "pod"].contains(&key.as_str()),
                    "{name}: unknown key {key}"
                );
            }
            let route = match v["route"].as_str() {
                Some("image-builder") => Route::ImageBuilder,
                Some("images") => Route::Images,
                other => panic!("{name}: route {other:?} is not image-builder or images"),
            };
            Case {
                name,
                route,
                namespace: v["namespace"].as_str().unwrap().to_owned(),
                config: v["config"].clone(),
                pod: v["pod"].clone(),
            }
        })
        .collect()
}

struct Admission {
    response: Value,
    patch: Value,
    mutated: Option<Value>,
}

async fn admit(app: &Front, case: &Case, pod: &Value) -> Admission {
    let review = serde_json::to_vec(&create_review(pod, &case.namespace)).unwrap();
    let reply = app.review(case.route, &review).await;
    assert_eq!(reply.status, 200, "{}", case.name);
    let response = response(&reply.body);
    let patch = patch_of(&response);
    let mutated = (response["allowed"] == true).then(|| apply(pod, &patch));
    Admission {
        response,
        patch,
        mutated,
    }
}

async fn admit_all() -> Vec<(Case, Front, Admission)> {
    let mut out = Vec::new();
    for case in cases() {
        let config = Config::from_value(case.config.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", case.name))
            .config;
        let app = webhook(&config, Deps::offline());
        let first = admit(&app, &case, &case.pod).await;
        out.push((case, app, first));
    }
    out
}

#[tokio::test]
async fn every_case_matches_its_golden_output() {
    let bless = std::env::var_os("PODMUTATOR_BLESS").is_some();
    for (case, _, a) in admit_all().await {
        let mut response = a.response.clone();
        response.as_object_mut().unwrap().remove("patch");
        let golden = json!({"response": response, "patch": a.patch, "pod": a.mutated});
        let path = fixtures().join("out").join(format!("{}.json", case.name));
        if bless {
            std::fs::write(&path, serde_json::to_string_pretty(&golden).unwrap() + "\n").unwrap();
            continue;
        }
        assert_eq!(golden, read_json(&path), "{}", case.name);
    }
    assert!(
        !bless,
        "blessed: review the outputs, then run again without PODMUTATOR_BLESS"
    );
}

#[tokio::test]
async fn both_mutators_rewrite_all_three_container_kinds() {
    let all = admit_all().await;
    for name in ["builder_all_container_kinds", "rules_all_container_kinds"] {
        let (_, _, a) = all.iter().find(|(c, ..)| c.name == name).unwrap();
        let paths: Vec<&str> = a
            .patch
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["path"].as_str().unwrap())
            .collect();
        for kind in [
            "/spec/containers/",
            "/spec/initContainers/",
            "/spec/ephemeralContainers/",
        ] {
            assert!(
                paths.iter().any(|p| p.starts_with(kind)),
                "{name}: nothing under {kind}: {paths:?}"
            );
        }
    }
}

#[tokio::test]
async fn patches_replace_images_only_and_python_jsonpatch_agrees() {
    let all = admit_all().await;
    let mut items = Vec::new();
    for (case, _, a) in &all {
        if a.mutated.is_none() {
            continue;
        }
        for op in a.patch.as_array().unwrap() {
            assert_eq!(op["op"], "replace", "{}: {op}", case.name);
            assert!(
                op["path"].as_str().unwrap().ends_with("/image"),
                "{}: {op}",
                case.name
            );
        }
        items.push((case.name.clone(), case.pod.clone(), a.patch.clone()));
    }
    let theirs = python_apply(&items);
    let mut checked = 0;
    for (case, _, a) in &all {
        let Some(ours) = &a.mutated else { continue };
        match &theirs[&case.name] {
            Ok(pod) => assert_eq!(pod, ours, "{}: jsonpatch and json-patch differ", case.name),
            Err(e) => panic!("{}: jsonpatch cannot apply our patch: {e}", case.name),
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} admitted cases");
}

#[tokio::test]
async fn re_admitting_every_mutated_pod_gives_no_patch() {
    for (case, app, a) in admit_all().await {
        let Some(pod) = &a.mutated else { continue };
        let again = admit(&app, &case, pod).await;
        assert_eq!(again.patch, json!([]), "{}", case.name);
        let stored = admit(&app, &case, &as_stored(pod)).await;
        assert_eq!(stored.patch, json!([]), "{}: as stored", case.name);
    }
}

#[tokio::test]
async fn input_and_mutated_pods_pass_kubernetes_validate_strict() {
    let mut pods = Vec::new();
    for (case, _, a) in admit_all().await {
        pods.push((format!("{}-input", case.name), case.pod.clone()));
        if let Some(m) = a.mutated {
            pods.push((case.name, m));
        }
    }
    assert_valid_pods("golden-images", &pods);
}
