//! Hole 3 of issue 25: the pod's `organization` label chose whose secrets it read. A pod in its
//! own project's namespace (`flytesnacks-development`) labelled `organization: otherorg` was
//! given `otherorg`'s secrets, because the namespace template binds project and domain only.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::StaticSource;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
const FETCHER: &str = "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000";
const OURS: &str = "SENTINEL-org-5c1e-flyte-value";
const THEIRS: &str = "SENTINEL-org-5c1e-otherorg-value";

fn id(org: &str, key: &str) -> String {
    format!("u__org__{org}__domain__development__project__flytesnacks__key__{key}")
}

/// Embedded with `embedded` as its section.
fn embedded(embedded: Value) -> Value {
    json!({
        "webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}},
        "embedded": embedded
    })
}

fn config(embedded_section: Value) -> Config {
    Config::from_value(embedded(embedded_section))
        .unwrap_or_else(|e| panic!("{e}"))
        .config
}

/// Both organisations hold a secret `db` for project flytesnacks, domain development.
fn source() -> StaticSource {
    StaticSource::default()
        .with(&id("flyte", "db"), OURS)
        .with(&id("otherorg", "db"), THEIRS)
}

fn shared(s: &StaticSource) -> Arc<StaticSource> {
    Arc::new(StaticSource {
        values: s.values.clone(),
        calls: Arc::clone(&s.calls),
    })
}

/// A task pod asking for `db` as an env var and as a file, with `labels` over Flyte's.
fn pod(labels: Value) -> Value {
    let secrets = [
        Secret {
            key: "db".into(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        },
        Secret {
            key: "db".into(),
            mount_requirement: MountRequirement::File,
            ..Default::default()
        },
    ];
    let mut l =
        json!({"inject-flyte-secrets": "true", "project": "flytesnacks", "domain": "development"});
    for (k, v) in labels.as_object().unwrap() {
        l[k] = v.clone();
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "task", "labels": l, "annotations": encode_annotations(&secrets).unwrap()},
        "spec": {"containers": [{"name": "main", "image": "flytekit:1", "command": ["python", "task.py"]}]}
    })
}

async fn admit(front: &Front, pod: &Value, namespace: &str) -> (u16, Value, String) {
    let review = serde_json::to_vec(&create_review(pod, namespace)).unwrap();
    let reply = front.review(Route::Secrets, &review).await;
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    (reply.status, response(&reply.body), body)
}

/// The reply without its patch, which would carry a value: what an assertion may print.
fn shown(resp: &Value) -> String {
    let mut r = resp.clone();
    if let Some(o) = r.as_object_mut() {
        o.remove("patch");
    }
    r.to_string()
}

fn forbidden(status: u16, resp: &Value, reason: &str) -> String {
    let r = shown(resp);
    assert_eq!(status, 200, "{r}");
    assert_eq!(resp["allowed"], false, "{r}");
    assert_eq!(resp["status"]["code"], 403, "{r}");
    assert_eq!(resp["auditAnnotations"]["denial-reason"], reason, "{r}");
    resp["status"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_pod_labelled_with_another_organization_is_forbidden_and_nothing_is_fetched() {
    let values = source();
    let front = webhook(
        &config(json!({"organization": "flyte"})),
        Deps::offline().with_source(shared(&values)),
    );
    let (status, resp, body) = admit(&front, &pod(json!({"organization": "otherorg"})), NS).await;
    let msg = forbidden(status, &resp, "EmbeddedOrganizationMismatch");
    assert!(msg.contains("organization=\"otherorg\""), "{msg}");
    assert!(msg.contains("embedded.organization \"flyte\""), "{msg}");
    assert!(
        !body.contains(THEIRS) && !body.contains(OURS),
        "a value in the denial"
    );
    assert_eq!(values.calls.load(Ordering::Relaxed), 0, "nothing fetched");

    // No label, or an empty one, forms no id at all (Flyte's manager requires the label and
    // never defaults it), so no organisation-less name `u__org____...` is ever asked for.
    for labels in [json!({}), json!({"organization": ""})] {
        let (status, resp, body) = admit(&front, &pod(labels.clone()), NS).await;
        assert_eq!(status, 200, "{labels}: {}", shown(&resp));
        assert_eq!(resp["allowed"], false, "{labels}: {}", shown(&resp));
        let msg = resp["status"]["message"].as_str().unwrap();
        assert!(msg.contains("empty organization field"), "{labels}: {msg}");
        assert!(!body.contains("SENTINEL"), "a value in the refusal");
    }
    assert_eq!(values.calls.load(Ordering::Relaxed), 0, "nothing fetched");

    // The organisation the webhook serves still gets its own value, and only its own.
    let p = pod(json!({"organization": "flyte"}));
    let (status, resp, _) = admit(&front, &p, NS).await;
    assert_eq!(
        (status, &resp["allowed"]),
        (200, &json!(true)),
        "{}",
        shown(&resp)
    );
    let out = apply(&p, &patch_of(&resp)).to_string();
    assert!(out.contains(OURS) && !out.contains(THEIRS));
    assert_eq!(values.calls.load(Ordering::Relaxed), 1);
}

/// Reference delivery reads the same scoped ids (by name): the same label check, and nothing
/// is resolved for another organisation.
#[tokio::test]
async fn a_pod_labelled_with_another_organization_gets_no_reference_to_its_secrets() {
    let names = source();
    let front = webhook(
        &config(json!({"organization": "flyte", "delivery": "reference", "fetcherImage": FETCHER})),
        Deps::offline().with_resolver(shared(&names)),
    );
    let (status, resp, body) = admit(&front, &pod(json!({"organization": "otherorg"})), NS).await;
    forbidden(status, &resp, "EmbeddedOrganizationMismatch");
    assert!(!body.contains("u__org__otherorg"), "{}", shown(&resp));
    assert_eq!(names.calls.load(Ordering::Relaxed), 0, "nothing resolved");
    let p = pod(json!({"organization": "flyte"}));
    let (status, resp, _) = admit(&front, &p, NS).await;
    assert_eq!(
        (status, &resp["allowed"]),
        (200, &json!(true)),
        "{}",
        shown(&resp)
    );
    assert!(
        apply(&p, &patch_of(&resp))
            .to_string()
            .contains(&id("flyte", "db"))
    );
}

/// The other way to bind it: the organisation in the namespace template.
#[tokio::test]
async fn a_namespace_template_with_the_organization_binds_the_label_to_the_namespace() {
    let values = source();
    let front = webhook(
        &config(json!({"namespaceTemplate": "{{ organization }}-{{ project }}-{{ domain }}"})),
        Deps::offline().with_source(shared(&values)),
    );
    let ns = "flyte-flytesnacks-development";
    let (status, resp, body) = admit(&front, &pod(json!({"organization": "otherorg"})), ns).await;
    let msg = forbidden(status, &resp, "EmbeddedScopeMismatch");
    assert!(msg.contains("otherorg-flytesnacks-development"), "{msg}");
    assert!(!body.contains(THEIRS), "a value in the denial");
    assert_eq!(values.calls.load(Ordering::Relaxed), 0, "nothing fetched");
    let (_, resp, _) = admit(&front, &pod(json!({"organization": "flyte"})), ns).await;
    assert_eq!(resp["allowed"], true, "{}", shown(&resp));
}

/// Runs `podmutator serve` with `config` and returns its exit status and output (stdout and
/// stderr), killing it (`None`: the configuration was accepted) once it logs its start line.
fn serve(config: &Value) -> (Option<i32>, String) {
    let dir = temp_dir("org-start");
    let mut cfg = config.clone();
    cfg["webhook"]["certDir"] = json!(dir);
    cfg["webhook"]["localCert"] = json!(true);
    cfg["webhook"]["listenPort"] = json!(free_port());
    cfg["http"] = json!({"listenAddress": "127.0.0.1", "pathTokenDisabled": true});
    let mut child = crate::common::bin()
        .arg("serve")
        .env("PODMUTATOR_CONFIG", cfg.to_string())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Waits on the event: the exit, or the start line of a serve that started (then killed).
    // The guard ends only a hang.
    let output = crate::common::capture(&mut child);
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if output.lock().unwrap().contains("serving https")
            || started.elapsed() > Duration::from_secs(300)
        {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Everything it wrote, read to the end of both streams.
    while !output.ended() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = output.lock().unwrap().clone();
    (code, text)
}

#[test]
fn an_embedded_configuration_that_binds_no_organization_is_refused_at_start() {
    for section in [
        json!({}),
        json!({"namespaceTemplate": "{{ project }}-{{ domain }}"}),
        json!({"delivery": "reference", "fetcherImage": FETCHER}),
        json!({"delivery": "reference", "envVarDelivery": "value", "fetcherImage": FETCHER}),
    ] {
        let Err(err) = Config::from_value(embedded(section.clone())) else {
            panic!("{section}: loaded without binding the organisation");
        };
        assert_eq!(err.key, "embedded.organization", "{section}: {err}");
        assert!(err.message.contains("{{ organization }}"), "{err}");
    }
    let (code, stderr) = serve(&embedded(json!({})));
    assert!(
        matches!(code, Some(c) if c != 0),
        "serve started without binding the organisation ({code:?}): {stderr}"
    );
    assert!(stderr.contains("embedded.organization"), "{stderr}");

    // What binds it, or turns the scope check off on purpose (then with a warning).
    for bound in [
        json!({"organization": "flyte"}),
        json!({"organization": "flyte", "delivery": "reference", "fetcherImage": FETCHER}),
        json!({"namespaceTemplate": "{{ organization }}-{{ project }}-{{ domain }}"}),
    ] {
        let loaded =
            Config::from_value(embedded(bound.clone())).unwrap_or_else(|e| panic!("{bound}: {e}"));
        assert!(loaded.warnings.is_empty(), "{bound}: {:?}", loaded.warnings);
    }
    let off = Config::from_value(embedded(json!({"namespaceTemplate": ""}))).unwrap();
    assert!(
        off.warnings
            .iter()
            .any(|w| w.contains("any organisation's and project's Embedded secrets")),
        "{:?}",
        off.warnings
    );
    // Without Embedded there is nothing to bind.
    Config::from_value(json!({"webhook": {"secretManagerTypes": ["K8s"]}})).unwrap();
}
