//! Golden tests for secret injection, one fixture per case, through the real configuration path
//! (`Config::from_value` -> `App::build`, with the Global manager and an in-memory secret
//! source when Embedded is enabled). For every case the decoded response and the pod the API
//! server would store are compared with `tests/fixtures/golden/out/<case>.json`; for every
//! admitted case the patch is also applied to the original pod JSON by Python's `jsonpatch`
//! (an independent implementation) and must give the same pod, removes nothing the user wrote
//! except an env var we replace on purpose, changes nothing on re-admission (also as the API
//! server stores it: defaults filled in, empty values dropped), and yields a pod
//! that `kubernetes-validate --strict` accepts for Kubernetes 1.33 and 1.37.
//!
//! A case is a file in `tests/fixtures/golden/cases/`:
//! `{"description", "config", "globalEnv"?, "secretValues"?, "imageConfigs"?, "namespace", "pod"}`
//! (`imageConfigs` maps an image reference to its config's `{"Entrypoint", "Cmd"}`: what the
//! registry holds, for `embedded.entrypointLookup`). The
//! description must state each request as `flyte.secrets/s<N> = {<decoded fields>}` (checked).
//! `podmutator secret-annotations '[{"key": "k", "mount_requirement": "FILE"}]'` prints the
//! annotations for new requests;
//! `PODMUTATOR_BLESS=1 cargo test --test integration golden::` writes the outputs. Review them, then commit.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use podmutator_core::config::{Config, SecretManagerType};
use podmutator_core::mutate::Route;
use podmutator_core::pod::injector::{EXECUTABLE, INIT_CONTAINER};
use podmutator_core::registry::error::LookupError;
use podmutator_core::registry::{EntrypointSource, ImageCommand, ImageQuery};
use podmutator_core::secrets::codec::{self, Secret};
use podmutator_core::secrets::global::FileEnvSource;
use podmutator_core::secrets::source::{NameSource, StaticSource};
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    root().join("tests/fixtures/golden")
}

struct Case {
    name: String,
    description: String,
    config: Value,
    global_env: BTreeMap<String, String>,
    secret_values: BTreeMap<String, String>,
    image_configs: BTreeMap<String, ImageCommand>,
    namespace: String,
    pod: Value,
}

fn string_map(v: &Value, what: &str) -> BTreeMap<String, String> {
    match v {
        Value::Null => BTreeMap::new(),
        v => serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{what} must map names to strings: {e}")),
    }
}

fn cases() -> Vec<Case> {
    let files = json_files(&fixtures().join("cases"));
    assert!(files.len() >= 20, "tests/fixtures/golden/cases: {files:?}");
    files
        .iter()
        .map(|f| {
            let v = read_json(f);
            let name = f.file_stem().unwrap().to_string_lossy().into_owned();
            let known = [
                "description",
                "config",
                "globalEnv",
                "secretValues",
                "imageConfigs",
                "namespace",
                "pod",
            ];
            for key in v.as_object().expect("a case is an object").keys() {
                assert!(known.contains(&key.as_str()), "{name}: unknown key {key}");
            }
            let pod = v["pod"].clone();
            assert!(
                pod["metadata"]["name"].is_string(),
                "{name}: give the pod a name (the pinned kubernetes-validate CLI needs one)"
            );
            Case {
                description: v["description"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: description"))
                    .to_owned(),
                config: v["config"].clone(),
                global_env: string_map(&v["globalEnv"], &format!("{name}: globalEnv")),
                secret_values: string_map(&v["secretValues"], &format!("{name}: secretValues")),
                image_configs: image_configs(&v["imageConfigs"], &name),
                namespace: v["namespace"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: namespace"))
                    .to_owned(),
                pod,
                name,
            }
        })
        .collect()
}

/// The app `podmutator` builds from the case's configuration, with the Global manager reading
/// `globalEnv` and Embedded reading `secretValues`.
fn app_for(case: &Case) -> Front {
    let config = Config::from_value(case.config.clone())
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
        .config;
    let global = FileEnvSource::new(&config.secrets, case.global_env.clone());
    let embedded = config
        .webhook
        .enabled_secret_managers()
        .contains(&SecretManagerType::Embedded);
    assert!(
        embedded || case.secret_values.is_empty(),
        "{}: secretValues without Embedded in webhook.secretManagerTypes",
        case.name
    );
    let mut deps = Deps::offline().with_global(Box::new(global));
    if embedded {
        let source = case
            .secret_values
            .iter()
            .fold(StaticSource::default(), |s, (id, v)| s.with(id, v));
        deps = deps
            .with_source(Arc::new(source))
            .with_resolver(Arc::new(NameSource::only(
                case.secret_values.keys().cloned(),
            )));
    }
    if !case.image_configs.is_empty() {
        deps = deps.with_entrypoints(Arc::new(Images(case.image_configs.clone())));
    }
    webhook(&config, deps)
}

fn image_configs(v: &Value, name: &str) -> BTreeMap<String, ImageCommand> {
    let Some(map) = v.as_object() else {
        assert!(v.is_null(), "{name}: imageConfigs must be an object");
        return BTreeMap::new();
    };
    let list = |c: &Value, key: &str| -> Vec<String> {
        serde_json::from_value(c[key].clone()).unwrap_or_default()
    };
    map.iter()
        .map(|(image, c)| {
            let found = ImageCommand {
                entrypoint: list(c, "Entrypoint"),
                cmd: list(c, "Cmd"),
            };
            (image.clone(), found)
        })
        .collect()
}

/// The registry of `imageConfigs`: each image's command, whatever the platform.
struct Images(BTreeMap<String, ImageCommand>);

impl EntrypointSource for Images {
    fn lookup<'a>(
        &'a self,
        query: &'a ImageQuery,
    ) -> podmutator_core::registry::BoxFuture<'a, Result<ImageCommand, LookupError>> {
        let found = self
            .0
            .get(&query.image)
            .cloned()
            .ok_or_else(|| LookupError::NotFound {
                what: query.image.clone(),
            });
        Box::pin(async move { found })
    }
}

/// One admission as the API server sees it.
struct Admission {
    status: u16,
    response: Value,
    patch: Value,
    /// The pod after the patch (our `json-patch` crate application), when admitted.
    mutated: Option<Value>,
}

async fn admit(app: &Front, namespace: &str, pod: &Value) -> Admission {
    let review = serde_json::to_vec(&create_review(pod, namespace)).unwrap();
    let reply = app.review(Route::Secrets, &review).await;
    let response = response(&reply.body);
    let patch = patch_of(&response);
    let mutated = (response["allowed"] == true).then(|| apply(pod, &patch));
    Admission {
        status: reply.status,
        response,
        patch,
        mutated,
    }
}

/// Every case with its app and first admission.
async fn admit_all() -> Vec<(Case, Front, Admission)> {
    let mut out = Vec::new();
    for case in cases() {
        let app = app_for(&case);
        let first = admit(&app, &case.namespace, &case.pod).await;
        out.push((case, app, first));
    }
    out
}

fn golden_of(a: &Admission) -> Value {
    let mut response = a.response.clone();
    if let Some(p) = response.get_mut("patch") {
        *p = a.patch.clone();
    }
    json!({"httpStatus": a.status, "response": response, "mutated": a.mutated})
}

fn golden_path(name: &str) -> PathBuf {
    fixtures().join("out").join(format!("{name}.json"))
}

fn write_json(path: &Path, v: &Value) {
    let mut text = serde_json::to_string_pretty(v).unwrap();
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn every_case_matches_its_golden_output() {
    let bless = std::env::var_os("PODMUTATOR_BLESS").is_some();
    let mut mismatches = Vec::new();
    let all = admit_all().await;
    let names: BTreeSet<String> = all
        .iter()
        .map(|(c, ..)| format!("{}.json", c.name))
        .collect();
    for (case, _, first) in &all {
        let got = golden_of(first);
        let path = golden_path(&case.name);
        if bless {
            write_json(&path, &got);
            continue;
        }
        assert!(
            path.exists(),
            "{} is missing: run PODMUTATOR_BLESS=1 cargo test --test integration golden::, then review it",
            path.display()
        );
        let want = read_json(&path);
        if got != want {
            mismatches.push(format!("{}:\n  want {want}\n  got  {got}", path.display()));
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches (PODMUTATOR_BLESS=1 rewrites them; review the diff):\n{}",
        mismatches.join("\n")
    );
    let stale: Vec<String> = std::fs::read_dir(fixtures().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| !names.contains(f))
        .collect();
    assert!(stale.is_empty(), "outputs without a case: {stale:?}");
}

/// `{group: "g", key: "k", mount_requirement: FILE}`: the decoded request as the description
/// must state it (Go's text format, one field per line joined by ", ").
fn stated(s: &Secret) -> String {
    let text = codec::marshal_text(s);
    format!("{{{}}}", text.trim_end().replace('\n', ", "))
}

#[test]
fn every_description_states_the_requests_its_annotations_encode() {
    for case in cases() {
        let Some(annotations) = case.pod["metadata"]["annotations"].as_object() else {
            continue;
        };
        for (key, value) in annotations {
            if !key.starts_with(codec::ANNOTATION_PREFIX) {
                continue;
            }
            // An undecodable value is the point of a denial case; the golden shows the message.
            let Ok(secret) = codec::decode_secret(value.as_str().unwrap_or_default()) else {
                continue;
            };
            let want = format!("{key} = {}", stated(&secret));
            assert!(
                case.description.contains(&want),
                "{}: the description must say {want}",
                case.name
            );
        }
    }
}

#[tokio::test]
async fn denials_are_http_200_answers_that_name_the_annotation_and_never_a_value() {
    let mut denied = 0;
    for (case, app, first) in admit_all().await {
        let values: Vec<&String> = case
            .global_env
            .values()
            .chain(case.secret_values.values())
            .collect();
        let warnings = first.response["warnings"].to_string();
        for v in &values {
            assert!(!warnings.contains(v.as_str()), "{}: {warnings}", case.name);
        }
        assert_eq!(first.status, 200, "{}: {}", case.name, first.response);
        if first.response["allowed"] == true {
            continue;
        }
        denied += 1;
        let status = &first.response["status"];
        assert!(
            [400, 403].contains(&status["code"].as_u64().unwrap()),
            "{}: {status}",
            case.name
        );
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with("[secrets] "),
            "{}: {message}",
            case.name
        );
        if status["code"] == 400 {
            assert!(
                message.contains(codec::ANNOTATION_PREFIX),
                "{}: a bad request names the annotation: {message}",
                case.name
            );
        }
        for v in &values {
            assert!(!message.contains(v.as_str()), "{}: {message}", case.name);
        }
        // Nothing is stored, and asking again gives the same answer.
        let again = admit(&app, &case.namespace, &case.pod).await;
        assert_eq!(again.response, first.response, "{}", case.name);
    }
    assert!(denied >= 3, "expected the denial cases, found {denied}");
}

#[tokio::test]
async fn python_jsonpatch_applies_every_patch_to_the_original_pod_as_we_do() {
    let all = admit_all().await;
    let items: Vec<(String, Value, Value)> = all
        .iter()
        .filter(|(.., a)| a.mutated.is_some())
        .map(|(c, _, a)| (c.name.clone(), c.pod.clone(), a.patch.clone()))
        .collect();
    let theirs = python_apply(&items);
    let mut checked = 0;
    for (case, _, first) in &all {
        let Some(ours) = &first.mutated else {
            continue;
        };
        match &theirs[&case.name] {
            Ok(pod) => assert_eq!(pod, ours, "{}: jsonpatch and json-patch differ", case.name),
            Err(e) => panic!("{}: jsonpatch cannot apply our patch: {e}", case.name),
        }
        checked += 1;
    }
    assert!(checked >= 16, "only {checked} admitted cases");
}

fn containers_of<'a>(pod: &'a Value, list: &str) -> &'a [Value] {
    pod["spec"][list].as_array().map_or(&[], Vec::as_slice)
}

fn find_named<'a>(list: &'a [Value], name: &Value) -> Option<&'a Value> {
    list.iter().find(|x| x["name"] == *name)
}

/// Whether `ptr` points into a user env var (present in `original`) that the mutated pod
/// redefines: the only thing we may remove or rewrite. Resolved against `doc`, the document
/// as it is when the operation runs.
fn is_replaced_user_env(ptr: &str, doc: &Value, original: &Value, mutated: &Value) -> bool {
    let parts: Vec<&str> = ptr.split('/').skip(1).collect();
    let [
        "spec",
        list @ ("containers" | "initContainers"),
        i,
        "env",
        j,
        ..,
    ] = parts.as_slice()
    else {
        return false;
    };
    let (Ok(i), Ok(j)) = (i.parse::<usize>(), j.parse::<usize>()) else {
        return false;
    };
    let Some(container) = containers_of(doc, list).get(i) else {
        return false;
    };
    let Some(var) = container["env"].get(j) else {
        return false;
    };
    let name = &container["name"];
    let user_had_it = find_named(containers_of(original, list), name)
        .and_then(|c| c["env"].as_array())
        .is_some_and(|env| env.contains(var));
    let ours = find_named(containers_of(mutated, list), name)
        .and_then(|c| c["env"].as_array())
        .and_then(|env| find_named(env, &var["name"]));
    user_had_it && ours.is_some_and(|o| o != var)
}

/// Everything the user wrote is still there, in its order: metadata and spec fields, volumes
/// (ours appended), containers and init containers (ours appended), each container's fields,
/// mounts (ours appended) and env vars (ours first, a same-name user var replaced, the others
/// after them in their order). Returns the names of the user env vars that were replaced.
fn user_fields_kept(input: &Value, mutated: &Value) -> Result<Vec<String>, String> {
    let meta = (&input["metadata"], &mutated["metadata"]);
    for (k, v) in meta.0.as_object().unwrap() {
        match k.as_str() {
            "annotations" => {
                for (a, x) in v.as_object().unwrap() {
                    if meta.1["annotations"][a] != *x {
                        return Err(format!("annotation {a} changed"));
                    }
                }
            }
            _ if meta.1[k] != *v => return Err(format!("metadata.{k} changed")),
            _ => {}
        }
    }
    let spec = (&input["spec"], &mutated["spec"]);
    for (k, v) in spec.0.as_object().unwrap() {
        match k.as_str() {
            "volumes" => {
                let ours = spec.1[k].as_array().unwrap();
                if !ours.starts_with(v.as_array().unwrap()) {
                    return Err("spec.volumes: the user's are not kept first".into());
                }
            }
            "containers" | "initContainers" => {}
            _ if spec.1[k] != *v => return Err(format!("spec.{k} changed")),
            _ => {}
        }
    }
    let mut replaced = Vec::new();
    for list in ["initContainers", "containers"] {
        let before = containers_of(input, list);
        // Reference delivery's fetcher goes before the user's init containers, which may need
        // what it fetches; it is the one container allowed ahead of theirs.
        let after: Vec<Value> = containers_of(mutated, list)
            .iter()
            .filter(|c| c["name"] != INIT_CONTAINER || find_named(before, &c["name"]).is_some())
            .cloned()
            .collect();
        let after = after.as_slice();
        if before.len() > after.len()
            || before
                .iter()
                .zip(after)
                .any(|(b, a)| b["name"] != a["name"])
        {
            return Err(format!("spec.{list}: the user's are not kept first"));
        }
        if list == "containers" && before.len() != after.len() {
            return Err("spec.containers: a container was added".into());
        }
        for (b, a) in before.iter().zip(after) {
            let name = b["name"].as_str().unwrap();
            for (k, v) in b.as_object().unwrap() {
                match k.as_str() {
                    "volumeMounts" => {
                        let ours = a[k].as_array().unwrap();
                        if !ours.starts_with(v.as_array().unwrap()) {
                            return Err(format!("{name}: volumeMounts not kept first"));
                        }
                    }
                    "env" => {
                        let ours = a["env"].as_array().unwrap();
                        let mut kept = Vec::new();
                        for var in v.as_array().unwrap() {
                            match find_named(ours, &var["name"]) {
                                Some(o) if o != var => {
                                    replaced.push(format!("{name}/{}", var["name"]));
                                }
                                _ => kept.push(var.clone()),
                            }
                        }
                        if !ours.ends_with(&kept) {
                            return Err(format!("{name}: the user's env vars moved"));
                        }
                    }
                    // Reference delivery's exec wrapper: the same command after it.
                    "command" if a[k] != *v => {
                        let wrapped: Vec<Value> = [EXECUTABLE, "exec", "--"]
                            .into_iter()
                            .map(Value::from)
                            .chain(v.as_array().unwrap().iter().cloned())
                            .collect();
                        if a[k].as_array() != Some(&wrapped) {
                            return Err(format!("{name}.command changed other than wrapped"));
                        }
                    }
                    _ if a[k] != *v => return Err(format!("{name}.{k} changed")),
                    _ => {}
                }
            }
        }
    }
    Ok(replaced)
}

#[tokio::test]
async fn patches_only_add_except_where_a_user_env_var_is_replaced_on_purpose() {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut replaced_total = 0;
    for (case, _, first) in admit_all().await {
        let Some(mutated) = &first.mutated else {
            continue;
        };
        let replaced =
            user_fields_kept(&case.pod, mutated).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        replaced_total += replaced.len();
        let mut doc = case.pod.clone();
        for op in first.patch.as_array().unwrap() {
            let kind = op["op"].as_str().unwrap();
            let path = op["path"].as_str().unwrap();
            *counts.entry(kind.to_owned()).or_default() += 1;
            match kind {
                "add" => {}
                "remove" | "replace" if is_replaced_user_env(path, &doc, &case.pod, mutated) => {}
                _ => panic!("{}: unexpected {kind} of {path}: {op}", case.name),
            }
            doc = apply(&doc, &json!([op]));
        }
        if !replaced.is_empty() {
            assert!(
                case.description.contains("replaced"),
                "{}: replaces {replaced:?}; say so in the description",
                case.name
            );
        }
    }
    assert!(counts["add"] > 0, "{counts:?}");
    assert!(replaced_total >= 1, "no case replaces a user env var");
}

#[tokio::test]
async fn re_admitting_every_mutated_pod_gives_no_patch() {
    let mut checked = 0;
    for (case, app, first) in admit_all().await {
        let Some(pod) = &first.mutated else {
            continue;
        };
        let again = admit(&app, &case.namespace, pod).await;
        assert_eq!(again.status, 200, "{}", case.name);
        assert_eq!(
            again.response["allowed"], true,
            "{}: {}",
            case.name, again.response
        );
        assert_eq!(again.patch, json!([]), "{}: second pass patched", case.name);
        // As the API server gives it back when a later webhook changed the pod.
        let stored = admit(&app, &case.namespace, &as_stored(pod)).await;
        assert_eq!(
            (stored.status, &stored.response["allowed"]),
            (200, &json!(true)),
            "{}: stored, {}",
            case.name,
            stored.response
        );
        assert_eq!(stored.patch, json!([]), "{}: stored pod patched", case.name);
        checked += 1;
    }
    assert!(checked >= 16, "only {checked} admitted cases");
}

/// What the API server checks beyond the schema and a mutator could break: unique container,
/// volume and env var names, mounts of declared volumes at distinct paths.
fn pod_problems(pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    let all = || {
        containers_of(pod, "initContainers")
            .iter()
            .chain(containers_of(pod, "containers"))
    };
    for c in all() {
        if !names.insert(c["name"].clone().to_string()) {
            problems.push(format!("duplicate container {}", c["name"]));
        }
    }
    let mut volumes = BTreeSet::new();
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        if !volumes.insert(v["name"].as_str().unwrap()) {
            problems.push(format!("duplicate volume {}", v["name"]));
        }
        if v["name"].as_str().unwrap().len() > 63 {
            problems.push(format!("volume name over 63 characters: {}", v["name"]));
        }
    }
    for c in all() {
        let mut paths = BTreeSet::new();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            if !volumes.contains(m["name"].as_str().unwrap()) {
                problems.push(format!("{} mounts undeclared {}", c["name"], m["name"]));
            }
            if !paths.insert(m["mountPath"].as_str().unwrap()) {
                problems.push(format!("{} mounts twice at {}", c["name"], m["mountPath"]));
            }
        }
        let mut env = BTreeSet::new();
        for e in c["env"].as_array().into_iter().flatten() {
            if !env.insert(e["name"].as_str().unwrap()) {
                problems.push(format!("{} has env {} twice", c["name"], e["name"]));
            }
        }
    }
    problems
}

#[tokio::test]
async fn input_and_mutated_pods_pass_kubernetes_validate_strict() {
    let mut pods = Vec::new();
    for (case, _, first) in admit_all().await {
        pods.push((format!("{}-input", case.name), case.pod.clone()));
        if let Some(mutated) = first.mutated {
            let problems = pod_problems(&mutated);
            assert!(problems.is_empty(), "{}: {problems:?}", case.name);
            pods.push((case.name, mutated));
        }
    }
    // A blocking child process inside the async test: this test has the runtime to itself.
    assert_valid_pods("golden", &pods);
}
