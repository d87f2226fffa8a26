//! The API server applies our patch to the pod JSON *it* holds, which may carry fields our
//! `k8s-openapi` does not know. Kubernetes' own maximal Pod proves that only the paths a mutator
//! meant to change move.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, Pod, Volume};
use podmutator_core::mutate::pod::{add_volume, containers_mut, env_value, put_env_first};
use podmutator_core::mutate::{Denied, Effects, PodCtx, PodMutator, Route};
use serde_json::{Value, json};

/// Adds an env var to every container, an init container in first position, a volume and a
/// label — each idempotently.
struct Everything;

impl PodMutator for Everything {
    fn id(&self) -> &'static str {
        "everything"
    }

    fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("podmutator.io/test".into(), "yes".into());
        let spec = pod.spec.get_or_insert_with(Default::default);
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        if !inits.iter().any(|c| c.name == "gate") {
            inits.insert(
                0,
                Container {
                    name: "gate".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                },
            );
        }
        for c in containers_mut(spec, &["gate".to_owned()]) {
            put_env_first(&mut c.env, &[env_value("INJECTED", "1")]);
        }
        add_volume(
            &mut spec.volumes,
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
        );
        Ok(Effects::default())
    }
}

/// The patch the admission path computes for `raw` after [`Everything`] ran: the typed pod
/// before and after, diffed by `podmutator_core::patch::diff_pods`.
fn patch_for(raw: &Value) -> Value {
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    Everything
        .mutate(&PodCtx::test(Route::Secrets), &mut after)
        .unwrap();
    serde_json::from_slice(
        podmutator_core::patch::diff_pods(before, after)
            .unwrap()
            .as_json(),
    )
    .unwrap()
}

/// What the patched pod must be: the raw pod with exactly the intended changes made by hand.
fn expected(raw: &Value) -> Value {
    let mut pod = raw.clone();
    pod["metadata"]["labels"]["podmutator.io/test"] = json!("yes");
    let spec = &mut pod["spec"];
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().unwrap() {
            let env = c["env"].as_array_mut().unwrap();
            env.insert(0, json!({"name": "INJECTED", "value": "1"}));
        }
    }
    spec["initContainers"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"name": "gate", "image": "busybox"}));
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scratch", "emptyDir": {}}));
    pod
}

#[rstest::rstest]
#[case::kubernetes_head("k8s-HEAD-core.v1.Pod.json")]
#[case::kubernetes_1_33("k8s-v1.33.0-core.v1.Pod.json")]
fn patch_on_the_raw_maximal_pod_changes_only_the_intended_paths(#[case] fixture: &str) {
    let raw = k8s_fixture(fixture);
    let patch = patch_for(&raw);
    for op in patch.as_array().unwrap() {
        assert_ne!(op["op"], "remove", "nothing is removed: {op}");
        assert_ne!(op["op"], "replace", "nothing is rewritten: {op}");
    }
    let patched = apply(&raw, &patch);
    assert_eq!(patched, expected(&raw));

    // The API server would send the mutated pod back on reinvocation: no further change.
    assert_eq!(patch_for(&patched), json!([]), "re-admission patch");
}

#[test]
fn the_head_fixture_has_fields_our_model_does_not_know() {
    // Guards the test above: if k8s-openapi learned every field, it would prove less.
    let raw = k8s_fixture("k8s-HEAD-core.v1.Pod.json");
    let typed: Pod = serde_json::from_value(raw.clone()).unwrap();
    let round_trip = serde_json::to_value(&typed).unwrap();
    assert_ne!(round_trip, raw);
    assert!(raw["spec"].get("hostnameOverride").is_some());
    assert!(round_trip["spec"].get("hostnameOverride").is_none());
}
