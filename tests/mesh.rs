//! The mesh mutators through the full handler: golden fixtures for every route, re-admission,
//! a pod that arrives by both webhook entries, Kubernetes' own schema (kubernetes-validate
//! --strict) on every mutated pod, and a property test over arbitrary pods.
//!
//! A new golden case is a new file in `tests/fixtures/mesh/cases/` (`path`, `namespace`, `pod`);
//! run `PODMUTATOR_BLESS=1 cargo test --test integration mesh::` to write its golden file, review it, commit.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar,
    EphemeralContainer, Pod, PodDNSConfig, PodDNSConfigOption, PodSecurityContext, PodSpec, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podmutator::transport::http::{PATH_MANAGED_NAMESPACE, PATH_MANAGED_POD, PATH_SECRETS};
use podmutator_core::mutate::MUTATOR_IDS;
use podmutator_core::mutate::mesh::MeshConfig;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use rstest::rstest;
use serde_json::{Value, json};

const PATHS: [&str; 3] = [PATH_SECRETS, PATH_MANAGED_POD, PATH_MANAGED_NAMESPACE];
const MANAGED: &str = "aether.io/managed";
const GATE: &str = "aether-identity-ready";
const GATE_VOLUME: &str = "aether-identity-gate-spiffe";
const GATE_OPT_OUT: &str = "aether.io/identity-gate";
const SOCKET: &str = "endpoint.aether.io/uds-socket";
/// A Flyte ENV_VAR secret request (group/key), as Flyte writes it.
const FLYTE_S0: &str = "m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk";

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/mesh")
}

fn mesh_config() -> MeshConfig {
    let cfg: MeshConfig = serde_json::from_value(read_json(&fixtures().join("config.json")))
        .expect("tests/fixtures/mesh/config.json is a mesh section");
    assert_eq!(cfg.validate(), Ok(vec![]));
    cfg
}

/// The webhook for a mesh section, with the K8s secret manager (Flyte 2's `_UNION_` prefix).
fn app_with(cfg: &MeshConfig) -> Front {
    let config = podmutator_core::config::Config::from_value(json!({
        "webhook": {"secretManagerTypes": ["K8s"], "secretEnvVarPrefix": "_UNION_"},
        "mesh": serde_json::to_value(cfg).unwrap(),
    }))
    .expect("mesh test config loads")
    .config;
    webhook(&config, Deps::offline())
}

fn app() -> Front {
    app_with(&mesh_config())
}

/// The same secrets mutator without any mesh mutator.
fn secrets_only_app() -> Front {
    app_with(&MeshConfig::default())
}

/// What one admission did, as the API server sees it.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Admitted; the pod after the patch, the raw patch and the warnings.
    Admitted {
        pod: Value,
        patch: Value,
        warnings: Value,
    },
    Denied {
        code: u64,
        message: String,
    },
}

impl Outcome {
    fn pod(&self) -> Option<&Value> {
        match self {
            Outcome::Admitted { pod, .. } => Some(pod),
            Outcome::Denied { .. } => None,
        }
    }

    fn patch_is_empty(&self) -> bool {
        matches!(self, Outcome::Admitted { patch, .. } if patch.as_array().is_some_and(Vec::is_empty))
    }
}

/// POSTs a CREATE review of `pod` to `path`; returns the HTTP status and the response.
async fn post(app: &Front, path: &str, namespace: &str, pod: &Value) -> (u16, Value) {
    let body = serde_json::to_vec(&create_review(pod, namespace)).unwrap();
    let reply = app
        .handle(Incoming {
            method: "POST",
            path,
            content_type: Some("application/json"),
            body: &body,
        })
        .await;
    (reply.status, response(&reply.body))
}

async fn admit(app: &Front, path: &str, namespace: &str, pod: &Value) -> Outcome {
    let (status, resp) = post(app, path, namespace, pod).await;
    assert_eq!(status, 200, "{path}: {resp}");
    if resp["allowed"] == true {
        let patch = patch_of(&resp);
        Outcome::Admitted {
            pod: apply(pod, &patch),
            patch,
            warnings: resp.get("warnings").cloned().unwrap_or(json!([])),
        }
    } else {
        Outcome::Denied {
            code: resp["status"]["code"].as_u64().unwrap(),
            message: resp["status"]["message"].as_str().unwrap().to_owned(),
        }
    }
}

/// Every patch operation is an `add`, or a `replace` of one of our DNS option values: nothing
/// the user wrote is removed, and nothing else is rewritten.
fn ours_only(patch: &Value) -> Result<(), String> {
    for op in patch.as_array().unwrap() {
        let path = op["path"].as_str().unwrap();
        match op["op"].as_str().unwrap() {
            "add" => {}
            "replace" if is_dns_option_value(path) => {}
            other => return Err(format!("unexpected {other} of {path}: {op}")),
        }
    }
    Ok(())
}

fn is_dns_option_value(path: &str) -> bool {
    path.strip_prefix("/spec/dnsConfig/options/")
        .and_then(|rest| rest.strip_suffix("/value"))
        .is_some_and(|i| i.bytes().all(|b| b.is_ascii_digit()))
}

/// The parts of the API server's Pod validation a mutator could break (kubernetes-validate
/// checks the schema only, not uniqueness or references).
fn pod_problems(pod: &Value) -> Vec<String> {
    let pod: Pod = match serde_json::from_value(pod.clone()) {
        Ok(p) => p,
        Err(e) => return vec![format!("not a Pod: {e}")],
    };
    let mut problems = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return vec!["no spec".into()];
    };
    if spec.containers.is_empty() {
        problems.push("no containers".into());
    }
    let mut names = BTreeSet::new();
    let all_names = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| &c.name)
        .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name));
    for name in all_names {
        if !names.insert(name.clone()) {
            problems.push(format!("duplicate container name {name}"));
        }
    }
    let mut volumes = BTreeSet::new();
    for v in spec.volumes.iter().flatten() {
        if !volumes.insert(v.name.clone()) {
            problems.push(format!("duplicate volume {}", v.name));
        }
    }
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let mut paths = BTreeSet::new();
        for m in c.volume_mounts.iter().flatten() {
            if !volumes.contains(&m.name) {
                problems.push(format!("{} mounts undeclared volume {}", c.name, m.name));
            }
            if !paths.insert(m.mount_path.clone()) {
                problems.push(format!("{} mounts twice at {}", c.name, m.mount_path));
            }
        }
        let mut env = BTreeSet::new();
        for e in c.env.iter().flatten() {
            if !env.insert(e.name.clone()) {
                problems.push(format!("{} has env {} twice", c.name, e.name));
            }
        }
    }
    if let Some(dns) = &spec.dns_config {
        if dns.nameservers.as_ref().is_some_and(|n| n.len() > 3) {
            problems.push("more than 3 nameservers".into());
        }
        for o in dns.options.iter().flatten() {
            if o.name.as_deref().is_none_or(str::is_empty) {
                problems.push("dns option without a name".into());
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Golden fixtures

struct Case {
    name: String,
    path: String,
    namespace: String,
    pod: Value,
}

fn cases() -> Vec<Case> {
    let files = json_files(&fixtures().join("cases"));
    assert!(files.len() >= 10, "tests/fixtures/mesh/cases: {files:?}");
    files
        .iter()
        .map(|f| {
            let v = read_json(f);
            Case {
                name: f.file_stem().unwrap().to_string_lossy().into_owned(),
                path: v["path"].as_str().expect("case has a path").to_owned(),
                namespace: v["namespace"]
                    .as_str()
                    .expect("case has a namespace")
                    .to_owned(),
                pod: v["pod"].clone(),
            }
        })
        .collect()
}

fn golden_path(name: &str) -> PathBuf {
    fixtures().join("golden").join(format!("{name}.json"))
}

fn read_golden(name: &str) -> Value {
    let path = golden_path(name);
    assert!(
        path.exists(),
        "{} is missing: run PODMUTATOR_BLESS=1 cargo test --test integration mesh::, then review it",
        path.display()
    );
    read_json(&path)
}

/// The response with its patch decoded, and the pod the API server would store.
async fn golden_of(app: &Front, case: &Case) -> Value {
    let (status, mut resp) = post(app, &case.path, &case.namespace, &case.pod).await;
    let patch = patch_of(&resp);
    let mutated = (resp["allowed"] == true).then(|| apply(&case.pod, &patch));
    if let Some(p) = resp.get_mut("patch") {
        *p = patch;
    }
    json!({"httpStatus": status, "response": resp, "mutated": mutated})
}

fn write_json(path: &Path, v: &Value) {
    let mut text = serde_json::to_string_pretty(v).unwrap();
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn every_case_matches_its_golden_file() {
    let app = app();
    let bless = std::env::var_os("PODMUTATOR_BLESS").is_some();
    let mut mismatches = Vec::new();
    for case in cases() {
        let got = golden_of(&app, &case).await;
        if bless {
            write_json(&golden_path(&case.name), &got);
            continue;
        }
        let want = read_golden(&case.name);
        if got != want {
            mismatches.push(format!(
                "{}:\n  want {want}\n  got  {got}",
                golden_path(&case.name).display()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches (PODMUTATOR_BLESS=1 rewrites them; review the diff):\n{}",
        mismatches.join("\n")
    );
}

#[tokio::test]
async fn golden_patches_only_add_or_set_our_dns_values() {
    for case in cases() {
        let golden = read_golden(&case.name);
        if let Some(patch) = golden["response"].get("patch") {
            ours_only(patch).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        }
    }
}

#[test]
fn golden_pods_pass_kubernetes_validate_strict() {
    let mut pods = Vec::new();
    for case in cases() {
        pods.push((format!("{}-input", case.name), case.pod.clone()));
        let golden = read_golden(&case.name);
        if !golden["mutated"].is_null() {
            assert!(
                pod_problems(&golden["mutated"]).is_empty(),
                "{}: {:?}",
                case.name,
                pod_problems(&golden["mutated"])
            );
            pods.push((case.name, golden["mutated"].clone()));
        }
    }
    assert_valid_pods("mesh-golden", &pods);
}

#[tokio::test]
async fn re_admitting_a_mutated_pod_changes_nothing() {
    let app = app();
    for case in cases() {
        let first = admit(&app, &case.path, &case.namespace, &case.pod).await;
        let Some(pod) = first.pod() else {
            // A denied pod is never stored; asking again gives the same denial.
            assert_eq!(
                admit(&app, &case.path, &case.namespace, &case.pod).await,
                first
            );
            continue;
        };
        let again = admit(&app, &case.path, &case.namespace, pod).await;
        assert!(again.patch_is_empty(), "{}: {again:?}", case.name);
        let stored = admit(&app, &case.path, &case.namespace, &as_stored(pod)).await;
        assert!(
            stored.patch_is_empty(),
            "{}: as stored {stored:?}",
            case.name
        );
        // Once the pod carries the managed label (any value), every entry agrees with it.
        if !pod["metadata"]["labels"][MANAGED].is_null() {
            for path in PATHS {
                let other = admit(&app, path, &case.namespace, pod).await;
                assert!(
                    other.patch_is_empty(),
                    "{} via {path}: {other:?}",
                    case.name
                );
            }
        }
    }
}

/// The pod stored after the API server called entry `a`, then entry `b`.
async fn two_entries(app: &Front, a: &str, b: &str, pod: &Value) -> Value {
    let once = admit(app, a, "shop", pod).await;
    let pod = once.pod().expect("admitted by the first entry");
    let twice = admit(app, b, "shop", pod).await;
    twice.pod().expect("admitted by the second entry").clone()
}

#[rstest]
#[case::managed_pod_in_a_managed_namespace(
    PATH_MANAGED_POD,
    PATH_MANAGED_NAMESPACE,
    json!({"metadata": {"name": "both", "labels": {MANAGED: "true"}},
           "spec": {"initContainers": [{"name": "migrate", "image": "m"}], "containers": [{"name": "app", "image": "a"}]}})
)]
#[case::flyte_task_in_a_managed_namespace(
    PATH_SECRETS,
    PATH_MANAGED_NAMESPACE,
    json!({"metadata": {"name": "task", "labels": {"inject-flyte-secrets": "true"}, "annotations": {"flyte.secrets/s0": FLYTE_S0}},
           "spec": {"containers": [{"name": "task", "image": "t"}]}})
)]
#[case::labelled_flyte_task(
    PATH_SECRETS,
    PATH_MANAGED_POD,
    json!({"metadata": {"name": "task", "labels": {"inject-flyte-secrets": "true", MANAGED: "true"}, "annotations": {"flyte.secrets/s0": FLYTE_S0}},
           "spec": {"containers": [{"name": "task", "image": "t"}]}})
)]
#[tokio::test]
async fn a_pod_that_arrives_by_both_entries_gets_one_result(
    #[case] first: &str,
    #[case] second: &str,
    #[case] pod: Value,
) {
    let app = app();
    let one_way = two_entries(&app, first, second, &pod).await;
    let other_way = two_entries(&app, second, first, &pod).await;
    assert_eq!(one_way, other_way);
    let inits = one_way["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(inits[0]["name"], GATE, "the gate is first: {inits:?}");
    assert_eq!(one_way["metadata"]["labels"][MANAGED], "true");
}

#[tokio::test]
async fn the_secrets_path_keeps_working_alongside_the_mesh() {
    let review = read_json(&root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"));
    let body = serde_json::to_vec(&review).unwrap();
    let incoming = Incoming {
        method: "POST",
        path: PATH_SECRETS,
        content_type: Some("application/json"),
        body: &body,
    };
    let with_mesh = app().handle(incoming).await;
    let without = secrets_only_app().handle(incoming).await;
    assert_eq!(with_mesh, without);
    let resp = response(&with_mesh.body);
    assert_eq!(resp["allowed"], true);
    assert!(!patch_of(&resp).as_array().unwrap().is_empty());
}

#[rstest]
#[case::managed_pod_route(PATH_MANAGED_POD)]
#[case::managed_namespace_route(PATH_MANAGED_NAMESPACE)]
#[tokio::test]
async fn a_disabled_mesh_changes_nothing(#[case] path: &str) {
    let mut cfg = mesh_config();
    cfg.enabled = false;
    let pod = json!({"metadata": {"name": "p", "labels": {MANAGED: "true"}, "annotations": {SOCKET: "nope"}},
                     "spec": {"containers": [{"name": "app", "image": "a"}]}});
    let out = admit(&app_with(&cfg), path, "shop", &pod).await;
    assert!(out.patch_is_empty(), "{out:?}");
}

/// The chain as README "Mesh" states it, written out rather than read from `MUTATOR_IDS`
/// (the constant `Chain::from_config` builds in): namespace injection first, because every later
/// mutator reads the managed label it adds; `secrets` before the gate, because the gate puts
/// itself at index 0 after the fetcher init containers were appended, so it still runs first;
/// `dns` in between; `socket-check` after the mesh, denying on the final mesh pod; then the
/// image mutators (docs/images.md): `image-builder` once every container is in the pod, so its
/// verification sees them all, and `image-rules` after it, as the issue asks ("applied after the
/// Flyte mutator"). This app has the image mutators off, so its chain is the first five.
#[test]
fn the_chain_runs_in_the_documented_order() {
    let intended = [
        "namespace-injection",
        "secrets",
        "dns",
        "init-gate",
        "socket-check",
        "image-builder",
        "image-rules",
    ];
    assert_eq!(app().app().chain().ids(), intended[..5]);
    assert_eq!(MUTATOR_IDS, intended, "config keys list the chain in order");
}

// ---------------------------------------------------------------------------------------------
// Property test

const NAME_POOL: [&str; 6] = ["app", "web", "proxy", "migrate", "seed", GATE];
const VOLUME_POOL: [&str; 6] = ["data", "scratch", "sock", "sock-b", "cfg", GATE_VOLUME];
/// Namespaces the property test admits pods into (the chain must not depend on which).
const NAMESPACES: [&str; 4] = ["shop", "flytesnacks-development", "default", "a"];
/// User env vars (name, value): none is a name the K8s secrets manager injects.
const USER_ENV: [(&str, &str); 4] = [
    ("USER", "me"),
    ("LANG", "C.UTF-8"),
    ("API_TOKEN_PATH", "/home/me/token"),
    ("_UNION_NOT_A_SECRET", "x"),
];
const EPHEMERAL_NAMES: [&str; 2] = ["debug", "debug-2"];

/// The Flyte secret requests a pod may carry (K8s manager: env vars, files and both).
fn secret_pool() -> Vec<Secret> {
    let s = |group: &str, key: &str, mount, env_var: &str| Secret {
        group: group.into(),
        key: key.into(),
        mount_requirement: mount,
        env_var: env_var.into(),
        ..Default::default()
    };
    vec![
        s("user-info", "user_secret", MountRequirement::EnvVar, ""),
        s("db", "password", MountRequirement::EnvVar, "DB_PASSWORD"),
        s("tls", "ca.crt", MountRequirement::File, ""),
        s("api", "token", MountRequirement::Any, "API_TOKEN"),
        s("", "solo", MountRequirement::EnvVar, ""),
    ]
}

const OPTION_NAMES: [&str; 6] = [
    "ndots",
    "timeout",
    "attempts",
    "edns0",
    "single-request",
    "rotate",
];

fn volume(name: &str) -> Volume {
    let mut v = Volume {
        name: name.into(),
        ..Default::default()
    };
    match name {
        "sock" | "sock-b" => {
            v.csi = Some(CSIVolumeSource {
                driver: "csi.aether.io".into(),
                read_only: Some(true),
                ..Default::default()
            })
        }
        "cfg" => {
            v.config_map = Some(ConfigMapVolumeSource {
                name: "app-config".into(),
                ..Default::default()
            })
        }
        // Includes the gate volume's name: a pod that took it is refused by the gate (warning).
        _ => v.empty_dir = Some(EmptyDirVolumeSource::default()),
    }
    v
}

/// A valid pod of arbitrary shape: containers and init containers (possibly one named like the
/// gate), user env vars, ephemeral containers, volumes and mounts (some at paths too long for a
/// socket), dnsConfig, labels and the annotations every mutator reads (several Flyte secrets).
fn arb_pod() -> impl Strategy<Value = Pod> {
    let names = proptest::sample::subsequence(NAME_POOL.to_vec(), 1..=5)
        .prop_shuffle()
        .prop_flat_map(|names| {
            let n = names.len();
            (Just(names), 0..n)
        });
    let volumes = proptest::sample::subsequence(VOLUME_POOL.to_vec(), 0..=VOLUME_POOL.len());
    let dns = proptest::option::of((
        proptest::sample::subsequence(vec!["10.100.0.10", "1.1.1.1", "8.8.8.8"], 0..=3),
        proptest::sample::subsequence(vec!["corp.example", "svc.cluster.local"], 0..=2),
        proptest::collection::vec(
            (
                proptest::sample::select(OPTION_NAMES.to_vec()),
                proptest::option::of(proptest::sample::select(vec!["1", "2", "5"])),
            ),
            0..5,
        ),
    ));
    let labels = (
        proptest::option::of(proptest::sample::select(vec!["true", "false", "yes"])),
        proptest::option::of(proptest::sample::subsequence(
            (0..secret_pool().len()).collect::<Vec<_>>(),
            1..=3,
        )),
    );
    let ephemeral = proptest::sample::subsequence(EPHEMERAL_NAMES.to_vec(), 0..=2);
    let annotations = (
        proptest::option::of(proptest::sample::select(vec!["false", "true"])),
        proptest::option::of(proptest::sample::select(vec![
            "sock/app.sock",
            "scratch/app.sock",
            "missing/app.sock",
            "app.sock",
        ])),
    );
    (
        names,
        volumes,
        dns,
        labels,
        annotations,
        (proptest::option::of(Just(1000i64)), ephemeral),
    )
        .prop_flat_map(
            |((names, split), volumes, dns, labels, annotations, (fs_group, ephemeral))| {
                // Per container: which volumes it mounts, whether at an overlong path, and
                // which user env vars it has.
                let mounts = proptest::collection::vec(
                    (
                        proptest::sample::subsequence(volumes.clone(), 0..=volumes.len()),
                        proptest::bool::weighted(0.2),
                        proptest::sample::subsequence(USER_ENV.to_vec(), 0..=3),
                    ),
                    names.len(),
                );
                (
                    Just((
                        names,
                        split,
                        volumes,
                        dns,
                        labels,
                        annotations,
                        fs_group,
                        ephemeral,
                    )),
                    mounts,
                )
            },
        )
        .prop_map(|(parts, mounts)| {
            let (
                names,
                split,
                volumes,
                dns,
                (managed, flyte),
                (opt_out, socket),
                fs_group,
                ephemeral,
            ) = parts;
            let user_env = |vars: &[(&str, &str)]| {
                (!vars.is_empty()).then(|| {
                    vars.iter()
                        .map(|(n, v)| EnvVar {
                            name: (*n).into(),
                            value: Some((*v).into()),
                            ..Default::default()
                        })
                        .collect::<Vec<_>>()
                })
            };
            let containers: Vec<Container> = names
                .iter()
                .zip(mounts)
                .map(|(name, (vols, long, env))| Container {
                    name: (*name).into(),
                    image: Some(format!("registry.example/{name}:1")),
                    env: user_env(&env),
                    volume_mounts: (!vols.is_empty()).then(|| {
                        vols.iter()
                            .map(|v| VolumeMount {
                                name: (*v).into(),
                                mount_path: if long {
                                    format!("/{}/{v}", "l".repeat(100))
                                } else {
                                    format!("/mnt/{v}")
                                },
                                ..Default::default()
                            })
                            .collect()
                    }),
                    ..Default::default()
                })
                .collect();
            let (init, app) = containers.split_at(split);
            let mut label_map = std::collections::BTreeMap::new();
            if let Some(v) = managed {
                label_map.insert(MANAGED.to_owned(), v.to_owned());
            }
            let mut annotation_map = std::collections::BTreeMap::new();
            if let Some(picked) = flyte {
                label_map.insert("inject-flyte-secrets".into(), "true".into());
                let pool = secret_pool();
                let secrets: Vec<Secret> = picked.iter().map(|&i| pool[i].clone()).collect();
                annotation_map.extend(encode_annotations(&secrets).expect("encodable secrets"));
            }
            if let Some(v) = opt_out {
                annotation_map.insert(GATE_OPT_OUT.into(), v.into());
            }
            if let Some(v) = socket {
                annotation_map.insert(SOCKET.into(), v.into());
            }
            Pod {
                metadata: ObjectMeta {
                    name: Some("arbitrary".into()),
                    labels: (!label_map.is_empty()).then_some(label_map),
                    annotations: (!annotation_map.is_empty()).then_some(annotation_map),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    init_containers: (!init.is_empty()).then(|| init.to_vec()),
                    containers: app.to_vec(),
                    ephemeral_containers: (!ephemeral.is_empty()).then(|| {
                        ephemeral
                            .iter()
                            .map(|name| EphemeralContainer {
                                name: (*name).into(),
                                image: Some("registry.example/debug:1".into()),
                                env: user_env(&USER_ENV[..1]),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    volumes: (!volumes.is_empty())
                        .then(|| volumes.iter().map(|v| volume(v)).collect()),
                    dns_config: dns.map(|(ns, searches, options)| PodDNSConfig {
                        nameservers: (!ns.is_empty())
                            .then(|| ns.iter().map(|s| (*s).to_owned()).collect()),
                        searches: (!searches.is_empty())
                            .then(|| searches.iter().map(|s| (*s).to_owned()).collect()),
                        options: (!options.is_empty()).then(|| {
                            options
                                .iter()
                                .map(|(n, v)| PodDNSConfigOption {
                                    name: Some((*n).into()),
                                    value: v.map(Into::into),
                                })
                                .collect()
                        }),
                    }),
                    security_context: fs_group.map(|g| PodSecurityContext {
                        fs_group: Some(g),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(msg()))
    }
}

#[test]
fn for_arbitrary_pods_the_chain_is_idempotent_keeps_user_fields_and_yields_valid_pods() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let app = app();
    let secrets_only = secrets_only_app();
    let run_in =
        |app: &Front, path: &str, ns: &str, pod: &Value| rt.block_on(admit(app, path, ns, pod));
    let collected = std::cell::RefCell::new(Vec::<(String, Value)>::new());
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        arb_pod(),
        proptest::sample::select(PATHS.to_vec()),
        proptest::sample::select(NAMESPACES.to_vec()),
    );
    let result = runner.run(&strategy, |(pod, path, namespace)| {
        let run = |app: &Front, path: &str, pod: &Value| run_in(app, path, namespace, pod);
        let input = serde_json::to_value(&pod).unwrap();
        check(pod_problems(&input).is_empty(), || {
            format!("generator made an invalid pod: {:?}", pod_problems(&input))
        })?;
        {
            // A sample of inputs goes to kubernetes-validate too: the claim is about valid pods.
            let mut all = collected.borrow_mut();
            if all.len() < 60 {
                let label = format!("input-{}", all.len());
                all.push((label, input.clone()));
            }
        }
        let first = run(&app, path, &input);
        match &first {
            Outcome::Denied { code, message } => {
                check(
                    *code == 403 && message.starts_with("[socket-check] "),
                    || format!("only the socket check denies: {code} {message}"),
                )?;
            }
            Outcome::Admitted {
                pod: mutated,
                patch,
                warnings,
            } => {
                ours_only(patch).map_err(TestCaseError::fail)?;
                check(
                    mutated["spec"]["ephemeralContainers"] == input["spec"]["ephemeralContainers"],
                    || format!("ephemeral containers were changed: {patch}"),
                )?;
                for (i, c) in input["spec"]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                {
                    let env_after = mutated["spec"]["containers"][i]["env"].as_array();
                    for var in c["env"].as_array().into_iter().flatten() {
                        check(env_after.is_some_and(|e| e.contains(var)), || {
                            format!("user env var {var} of {} was lost: {patch}", c["name"])
                        })?;
                    }
                }
                let problems = pod_problems(mutated);
                check(problems.is_empty(), || {
                    format!("mutated pod is invalid: {problems:?}\n{mutated}")
                })?;
                let again = run(&app, path, mutated);
                check(again.patch_is_empty(), || {
                    format!("second pass via {path} patched: {again:?}")
                })?;
                let stored = run(&app, path, &as_stored(mutated));
                check(stored.patch_is_empty(), || {
                    format!("second pass via {path} of the stored pod patched: {stored:?}")
                })?;
                if !mutated["metadata"]["labels"][MANAGED].is_null() {
                    for other in PATHS {
                        let o = run(&app, other, mutated);
                        check(o.patch_is_empty(), || {
                            format!("labelled pod re-admitted via {other} patched: {o:?}")
                        })?;
                    }
                }
                let label = &input["metadata"]["labels"][MANAGED];
                if *label == "false" {
                    // Opted out: every mesh mutator leaves it alone; secrets may still apply,
                    // except to an init container named like the gate, which the mesh owns
                    // (a webhook without the mesh has no such rule): compare without it.
                    let without_gate = |pod: &Value| {
                        let mut pod = pod.clone();
                        if let Some(inits) = pod["spec"]["initContainers"].as_array_mut() {
                            inits.retain(|c| c["name"] != GATE);
                        }
                        pod
                    };
                    let gate_of = |pod: &Value| {
                        pod["spec"]["initContainers"]
                            .as_array()
                            .and_then(|l| l.iter().find(|c| c["name"] == GATE).cloned())
                    };
                    let reference = run(&secrets_only, path, &without_gate(&input));
                    check(
                        reference.pod() == Some(&without_gate(mutated))
                            && gate_of(&input) == gate_of(mutated),
                        || format!("opted-out pod was meshed: {patch}"),
                    )?;
                }
                let managed_now = mutated["metadata"]["labels"][MANAGED] == "true";
                let gate_wanted = managed_now
                    && input["metadata"]["annotations"][GATE_OPT_OUT] != "false"
                    && warnings.as_array().is_some_and(Vec::is_empty);
                if gate_wanted {
                    let inits = mutated["spec"]["initContainers"].as_array();
                    let had_gate = input["spec"]["initContainers"]
                        .as_array()
                        .is_some_and(|l| l.iter().any(|c| c["name"] == GATE));
                    check(
                        had_gate || inits.is_some_and(|l| l[0]["name"] == GATE),
                        || format!("gate is not first: {mutated}"),
                    )?;
                }
                let mut all = collected.borrow_mut();
                if all.len() < 360 {
                    let label = format!("case-{}", all.len());
                    all.push((label, mutated.clone()));
                }
            }
        }
        // Two entries, either order, one result.
        for (a, b) in [
            (PATH_SECRETS, PATH_MANAGED_POD),
            (PATH_SECRETS, PATH_MANAGED_NAMESPACE),
            (PATH_MANAGED_POD, PATH_MANAGED_NAMESPACE),
        ] {
            let then = |x: &str, y: &str| match run(&app, x, &input) {
                Outcome::Admitted { pod, .. } => run(&app, y, &pod).pod().cloned(),
                Outcome::Denied { .. } => None,
            };
            let ab = then(a, b);
            let ba = then(b, a);
            check(ab == ba, || {
                format!("{a} then {b} differs from {b} then {a}:\n{ab:?}\n{ba:?}")
            })?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let pods = collected.into_inner();
    assert!(pods.len() >= 110, "too few admitted pods: {}", pods.len());
    assert_valid_pods("mesh-property", &pods);
}
