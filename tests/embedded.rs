//! Embedded mode through the whole admission path, with an in-memory secret source: Flyte's
//! embedded-manager cases (spec §8), the scope binding, the deadline and the error mapping.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::{
    Api, BoxFuture, Fetched, SecretSource, SecretValue, SourceError, StaticSource,
};
use rstest::rstest;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";

fn id(org: &str, domain: &str, project: &str, key: &str) -> String {
    format!("u__org__{org}__domain__{domain}__project__{project}__key__{key}")
}

fn config(extra: Value) -> Config {
    let mut v = json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }, "embedded": {"organization": "flyte"}});
    if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            base.insert(k.clone(), x.clone());
        }
    }
    if v["embedded"].get("organization").is_none() {
        v["embedded"]["organization"] = json!("flyte");
    }
    Config::from_value(v).unwrap().config
}

fn app_with(source: impl SecretSource + 'static, extra: Value) -> Front {
    webhook(
        &config(extra),
        Deps::offline().with_source(Arc::new(source)),
    )
}

fn secret(key: &str, mount: MountRequirement, env_var: &str) -> Secret {
    Secret {
        key: key.into(),
        mount_requirement: mount,
        env_var: env_var.into(),
        ..Default::default()
    }
}

fn pod(secrets: &[Secret], labels: Value) -> Value {
    let mut all = json!({"inject-flyte-secrets": "true"});
    for (k, v) in labels.as_object().unwrap() {
        all[k] = v.clone();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "task-pod",
            "labels": all,
            "annotations": encode_annotations(secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit:latest"}]}
    })
}

fn scope_labels() -> Value {
    json!({"organization": "flyte", "project": "flytesnacks", "domain": "development"})
}

async fn admit(app: &Front, pod: &Value, namespace: &str) -> (u16, Value) {
    let review = create_review(pod, namespace);
    let reply = app
        .review(Route::Secrets, &serde_json::to_vec(&review).unwrap())
        .await;
    (reply.status, response(&reply.body))
}

async fn mutated(app: &Front, pod: &Value) -> Value {
    let (status, resp) = admit(app, pod, NS).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["allowed"], true, "{resp}");
    apply(pod, &patch_of(&resp))
}

fn env(pod: &Value, container: &str) -> Vec<(String, String)> {
    let all = pod["spec"]["containers"].as_array().unwrap().iter().chain(
        pod["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten(),
    );
    let c = all.clone().find(|c| c["name"] == container).unwrap();
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap_or("<from>").to_owned(),
            )
        })
        .collect()
}

fn var(pod: &Value, container: &str, name: &str) -> String {
    env(pod, container)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{container} has no {name}"))
        .1
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[rstest]
#[case::empty_organization(json!({"project": "flytesnacks", "domain": "development"}), "empty organization field")]
#[case::empty_project(json!({"organization": "flyte", "domain": "development"}), "empty project field")]
#[case::empty_domain(json!({"organization": "flyte", "project": "flytesnacks"}), "empty domain field")]
#[tokio::test]
async fn missing_scope_labels_are_denied_naming_the_label(
    #[case] labels: Value,
    #[case] want: &str,
) {
    let app = app_with(StaticSource::default(), json!({}));
    let p = pod(&[secret("secretid", MountRequirement::Any, "")], labels);
    let (status, resp) = admit(&app, &p, NS).await;
    assert_eq!(status, 200);
    assert_eq!(resp["allowed"], false);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("[SecretRequirementsError] secret read requirements not met due to {want} in the pod labels")),
        "{msg}"
    );
}

#[tokio::test]
async fn all_labels_org_scope_value_becomes_an_env_var() {
    // Spec `all labels`: project and domain scopes not found, organisation found.
    let source = StaticSource::default().with(&id("flyte", "", "", "secretid"), "secretValue");
    let app = app_with(source, json!({}));
    let out = mutated(
        &app,
        &pod(
            &[secret("secretid", MountRequirement::Any, "")],
            scope_labels(),
        ),
    )
    .await;
    assert_eq!(
        env(&out, "main"),
        pairs(&[
            ("_UNION_SECRETID", "secretValue"),
            ("FLYTE_SECRETS_ENV_PREFIX", "_UNION_")
        ])
    );
}

#[rstest]
#[case::scoped_to_organization(&[("flyte", "", "")], "org-value")]
#[case::scoped_to_domain(&[("flyte", "", ""), ("flyte", "development", "")], "domain-value")]
#[case::scoped_to_project(&[("flyte", "", ""), ("flyte", "development", ""), ("flyte", "development", "flytesnacks")], "project-value")]
#[tokio::test]
async fn the_most_specific_scope_wins(
    #[case] present: &[(&str, &str, &str)],
    #[case] want: &str,
    // Flyte's ScopedTo* cases, with and without an env_var.
    #[values("MY_VAR", "")] env_var: &str,
) {
    let mut source = StaticSource::default();
    for (org, domain, project) in present {
        let value = match (*domain, *project) {
            ("", _) => "org-value",
            (_, "") => "domain-value",
            _ => "project-value",
        };
        source = source.with(&id(org, domain, project, "k"), value);
    }
    let app = app_with(source, json!({}));
    let out = mutated(
        &app,
        &pod(
            &[secret("k", MountRequirement::EnvVar, env_var)],
            scope_labels(),
        ),
    )
    .await;
    let name = if env_var.is_empty() {
        "_UNION_K"
    } else {
        env_var
    };
    assert_eq!(env(&out, "main")[0], (name.to_owned(), want.to_owned()));
}

#[rstest]
#[case::without_env_var("")]
#[case::with_env_var("MY_ENV_VAR")]
#[tokio::test]
async fn file_secrets_go_through_one_init_container(#[case] env_var: &str) {
    let source = StaticSource::default().with(
        &id("flyte", "development", "flytesnacks", "secret1"),
        "banana",
    );
    let app = app_with(source, json!({}));
    let out = mutated(
        &app,
        &pod(
            &[secret("secret1", MountRequirement::File, env_var)],
            scope_labels(),
        ),
    )
    .await;
    let inits = out["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0]["name"], "init-embedded-secret");
    assert_eq!(
        inits[0]["image"],
        "public.ecr.aws/docker/library/busybox:latest"
    );
    assert_eq!(
        var(&out, "init-embedded-secret", "SECRETS"),
        "secret1=YmFuYW5h\n"
    );
    // Pod Security's `restricted` level, and a user that is not root: a pod with
    // `runAsNonRoot: true` starts with the writer added.
    let sc = &inits[0]["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{sc}");
    assert!(sc["runAsUser"].as_i64().is_some_and(|u| u > 0), "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{sc}");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{sc}");
    let mut want = vec![];
    if !env_var.is_empty() {
        want.push((env_var, "/etc/flyte/secrets/secret1"));
    }
    want.extend([
        ("FLYTE_SECRETS_FILE_PREFIX", ""),
        ("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
    ]);
    assert_eq!(env(&out, "main"), pairs(&want));
    assert_eq!(
        out["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "embedded-secret-vol", "mountPath": "/etc/flyte/secrets", "readOnly": true}])
    );
    assert_eq!(
        out["spec"]["volumes"],
        json!([{"name": "embedded-secret-vol", "emptyDir": {"medium": "Memory"}}])
    );
}

#[tokio::test]
async fn every_file_secret_gets_its_env_var_not_only_the_first() {
    let source = StaticSource::default()
        .with(&id("flyte", "development", "flytesnacks", "a"), "fake-a")
        .with(&id("flyte", "development", "flytesnacks", "B"), "fake-b");
    let app = app_with(source, json!({}));
    let p = pod(
        &[
            secret("a", MountRequirement::File, "A_PATH"),
            secret("B", MountRequirement::File, "B_PATH"),
        ],
        scope_labels(),
    );
    let out = mutated(&app, &p).await;
    let e = env(&out, "main");
    assert!(
        e.contains(&("A_PATH".into(), "/etc/flyte/secrets/a".into())),
        "{e:?}"
    );
    assert!(
        e.contains(&("B_PATH".into(), "/etc/flyte/secrets/B".into())),
        "file keeps the key's case: {e:?}"
    );
    assert_eq!(
        var(&out, "init-embedded-secret", "SECRETS"),
        "a=ZmFrZS1h\nB=ZmFrZS1i\n"
    );
}

#[tokio::test]
async fn re_admitting_an_injected_pod_changes_nothing() {
    let source = StaticSource::default()
        .with(&id("flyte", "development", "flytesnacks", "a"), "fake-a")
        .with(&id("flyte", "", "", "b"), "fake-b");
    let app = app_with(source, json!({}));
    let p = pod(
        &[
            secret("a", MountRequirement::File, "A_PATH"),
            secret("b", MountRequirement::EnvVar, ""),
        ],
        scope_labels(),
    );
    let once = mutated(&app, &p).await;
    let (status, resp) = admit(&app, &once, NS).await;
    assert_eq!(status, 200);
    assert!(resp.get("patch").is_none(), "{resp}");
}

#[tokio::test]
async fn binary_values_that_are_not_utf8_cannot_be_env_vars_but_can_be_files() {
    let mut source = StaticSource::default();
    source.values.insert(
        id("flyte", "development", "flytesnacks", "bin"),
        SecretValue {
            string: None,
            binary: Some(vec![0xff, 0xfe, 0x00]),
        },
    );
    let app = app_with(source, json!({}));
    let (_, resp) = admit(
        &app,
        &pod(
            &[secret("bin", MountRequirement::EnvVar, "")],
            scope_labels(),
        ),
        NS,
    )
    .await;
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "has a binary value that is not a valid UTF-8 string; mount as a file instead"
        ),
        "{msg}"
    );
    let out = mutated(
        &app,
        &pod(&[secret("bin", MountRequirement::File, "")], scope_labels()),
    )
    .await;
    assert_eq!(var(&out, "init-embedded-secret", "SECRETS"), "bin=//4A\n");
}

/// A NUL byte cannot be in an environment variable: value delivery refuses the variable,
/// naming the secret and never the value, as reference delivery's wrapper refuses the file.
/// A FILE takes the value as it is.
#[tokio::test]
async fn values_with_a_nul_byte_cannot_be_env_vars_but_can_be_files() {
    let secret_id = id("flyte", "development", "flytesnacks", "nul");
    let source = StaticSource::default().with(&secret_id, "hun\0ter2");
    let app = app_with(source, json!({}));
    for mount in [MountRequirement::EnvVar, MountRequirement::Any] {
        let (status, resp) =
            admit(&app, &pod(&[secret("nul", mount, "")], scope_labels()), NS).await;
        assert_eq!(status, 200);
        assert_eq!(resp["allowed"], false, "{resp}");
        let msg = resp["status"]["message"].as_str().unwrap();
        assert!(msg.contains(&secret_id), "{msg}");
        assert!(msg.contains("NUL byte"), "{msg}");
        assert!(!msg.contains("hun\\0") && !msg.contains("ter2"), "{msg}");
    }
    let out = mutated(
        &app,
        &pod(&[secret("nul", MountRequirement::File, "")], scope_labels()),
    )
    .await;
    assert_eq!(
        var(&out, "init-embedded-secret", "SECRETS"),
        "nul=aHVuAHRlcjI=\n"
    );
}

#[tokio::test]
async fn values_over_the_limit_are_refused_naming_the_secret() {
    let source = StaticSource::default().with(
        &id("flyte", "development", "flytesnacks", "big"),
        &"x".repeat(2000),
    );
    let app = app_with(source, json!({"embedded": {"maxValueBytes": 1000}}));
    let (_, resp) = admit(
        &app,
        &pod(
            &[secret("big", MountRequirement::EnvVar, "")],
            scope_labels(),
        ),
        NS,
    )
    .await;
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("is 2000 bytes, over embedded.maxValueBytes (1000)"),
        "{msg}"
    );
    assert!(!msg.contains("xxxx"));
}

#[tokio::test]
async fn not_found_anywhere_is_denied_listing_the_ids() {
    let app = app_with(StaticSource::default(), json!({}));
    let (status, resp) = admit(
        &app,
        &pod(&[secret("nope", MountRequirement::Any, "")], scope_labels()),
        NS,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(resp["status"]["code"], 400);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Global: both key and group are required parameters"),
        "{msg}"
    );
    assert!(
        msg.contains("Embedded: [SecretNotFoundAcrossAllScopes]"),
        "{msg}"
    );
    assert!(msg.contains(&id("flyte", "", "", "nope")), "{msg}");
}

#[tokio::test]
async fn a_pod_labelled_with_another_project_is_forbidden_and_nothing_is_fetched() {
    let source = StaticSource::default().with(
        &id("flyte", "production", "payroll", "db"),
        "fake-payroll-db",
    );
    let calls = source.calls.clone();
    let app = app_with(source, json!({}));
    let labels = json!({"organization": "flyte", "project": "payroll", "domain": "production"});
    let (status, resp) = admit(
        &app,
        &pod(&[secret("db", MountRequirement::EnvVar, "")], labels),
        NS,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 403);
    assert_eq!(
        resp["auditAnnotations"]["denial-reason"],
        "EmbeddedScopeMismatch"
    );
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("belong to namespace \"payroll-production\""),
        "{msg}"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test]
async fn scope_binding_can_be_turned_off() {
    let source = StaticSource::default().with(
        &id("flyte", "production", "payroll", "db"),
        "fake-payroll-db",
    );
    let app = app_with(source, json!({"embedded": {"namespaceTemplate": ""}}));
    let labels = json!({"organization": "flyte", "project": "payroll", "domain": "production"});
    mutated(
        &app,
        &pod(&[secret("db", MountRequirement::EnvVar, "")], labels),
    )
    .await;
}

#[rstest]
#[case::listed("system:serviceaccount:flyte:flyte-executor", true)]
#[case::prefix("system:serviceaccount:flyte:other", true)]
#[case::someone_else("alice@example.com", false)]
#[tokio::test]
async fn the_requesting_user_can_be_restricted(#[case] user: &str, #[case] allowed: bool) {
    let source = StaticSource::default().with(&id("flyte", "", "", "k"), "fake-k");
    let app = app_with(
        source,
        json!({"embedded": {"allowedUsernames": ["system:serviceaccount:flyte:*", "ci-bot"]}}),
    );
    let p = pod(&[secret("k", MountRequirement::EnvVar, "")], scope_labels());
    let mut review = create_review(&p, NS);
    review["request"]["userInfo"]["username"] = json!(user);
    let reply = app
        .review(Route::Secrets, &serde_json::to_vec(&review).unwrap())
        .await;
    let resp = response(&reply.body);
    assert_eq!(resp["allowed"], allowed, "{resp}");
    if !allowed {
        assert_eq!(resp["status"]["code"], 403);
        assert!(
            resp["status"]["message"]
                .as_str()
                .unwrap()
                .contains("embedded.allowedUsernames")
        );
    }
}

/// Fails or stalls every fetch.
struct Broken(Option<Duration>);

impl SecretSource for Broken {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            match self.0 {
                Some(d) => {
                    tokio::time::sleep(d).await;
                    Ok(BTreeMap::new().into())
                }
                None => Err(SourceError::Throttled {
                    api: Api::BatchGetSecretValue,
                    ids: ids.join(", "),
                    throttles: 3,
                    source: "Rate exceeded for arn:aws:iam::123456789012:role/podmutator".into(),
                }),
            }
        })
    }
}

#[rstest]
#[case::throttled(
    Broken(None),
    "throttled by AWS Secrets Manager while fetching secret u__org__flyte__domain__development__project__flytesnacks__key__k"
)]
#[case::past_the_deadline(
    // Far longer than any stall of a loaded machine: answered before it ends, the admission was
    // cut by its deadline.
    Broken(Some(Duration::from_secs(120))),
    "deadline of 500 ms (embedded.deadlineMs) passed while fetching secret u__org__flyte__domain__development__project__flytesnacks__key__k"
)]
#[tokio::test]
async fn backend_trouble_is_an_internal_error_so_failure_policy_decides(
    #[case] source: Broken,
    #[case] want: &str,
) {
    let app = app_with(source, json!({"embedded": {"deadlineMs": 500}}));
    let started = std::time::Instant::now();
    let (status, resp) = admit(
        &app,
        &pod(&[secret("k", MountRequirement::EnvVar, "")], scope_labels()),
        NS,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, 500);
    assert_eq!(resp["allowed"], false);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(msg.contains(want), "{msg}");
    assert!(
        !msg.contains("arn:") && !msg.contains("123456789012"),
        "the service's detail stays out of the reply: {msg}"
    );
}

#[tokio::test]
async fn one_fetch_per_admission_covers_every_secret_and_scope() {
    let mut source = StaticSource::default();
    let mut secrets = vec![];
    for i in 0..10 {
        source = source.with(&id("flyte", "", "", &format!("k{i}")), "fake-v");
        secrets.push(secret(&format!("k{i}"), MountRequirement::EnvVar, ""));
    }
    let calls = source.calls.clone();
    let app = app_with(source, json!({}));
    mutated(&app, &pod(&secrets, scope_labels())).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_pod_served_by_an_earlier_manager_fetches_nothing() {
    // K8s before Embedded takes every keyed secret: nothing to fetch, nothing to fail.
    let config = Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["K8s", "Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }, "embedded": {"organization": "flyte"}}))
    .unwrap()
    .config;
    let app = webhook(&config, Deps::offline().with_source(Arc::new(Broken(None))));
    mutated(
        &app,
        &pod(&[secret("k", MountRequirement::EnvVar, "")], scope_labels()),
    )
    .await;
}
