//! Secret names that would become part of a template, a script or a path (issue 25, hole 4),
//! and a pod that brings its own fetcher under our name (hole 9): each through the whole
//! admission path (`App::build` from a configuration, a review in, the reply's patch applied to
//! the original pod by the `json-patch` crate).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::pod::injector::{INIT_CONTAINER, promised_files};
use podmutator_core::pod::plan::FETCH_PLAN_ENV;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::NameSource;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";

fn config(types: Value, extra: Value) -> Config {
    let mut v = json!({"webhook": {
        "secretManagerTypes": types,
        "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
    }});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    Config::from_value(v).unwrap().config
}

fn secret(group: &str, group_version: &str, key: &str, mount: MountRequirement) -> Secret {
    Secret {
        group: group.into(),
        group_version: group_version.into(),
        key: key.into(),
        mount_requirement: mount,
        ..Default::default()
    }
}

fn task_pod(secrets: &[Secret]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit", "command": ["python", "task.py"]}]}
    })
}

/// Admits `pod` and returns the HTTP status, the review's response and the pod the API server
/// would store (the original when nothing is patched).
async fn admit(app: &Front, pod: &Value) -> (u16, Value, Value) {
    let review = serde_json::to_vec(&create_review(pod, NS)).unwrap();
    let reply = app.review(Route::Secrets, &review).await;
    let resp = response(&reply.body);
    let stored = apply(pod, &patch_of(&resp));
    (reply.status, resp, stored)
}

fn app(types: Value) -> Front {
    webhook(&config(types, json!({})), Deps::offline())
}

/// The denial's message, after checking it is a 400 refusal of the pod (HTTP 200, allowed
/// false) that names the annotation, the field and says to rename the secret.
fn refused(status: u16, resp: &Value, field: &str) -> String {
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 400, "{resp}");
    assert!(resp.get("patch").is_none(), "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("flyte.secrets/s0"), "{msg}");
    assert!(
        msg.contains(&format!("{field} ")) && msg.contains("cannot be used: it must be"),
        "{msg}"
    );
    assert!(msg.contains("rename the secret"), "{msg}");
    msg
}

fn annotations_of(pod: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(pod["metadata"]["annotations"].clone()).unwrap()
}

/// The Vault key closes the template's action and opens one reading another team's path with
/// the pod's Vault role.
#[tokio::test]
async fn a_vault_key_that_opens_another_teams_secret_in_the_template_is_refused() {
    let app = app(json!(["Vault"]));
    let key = r#"k }}{{ with secret "secret/data/other-team/db" }}{{ .Data.data.password }}{{ end }}{{ .x"#;
    let pod = task_pod(&[secret(
        "secret/data/team-a",
        "kv2",
        key,
        MountRequirement::File,
    )]);
    let (status, resp, stored) = admit(&app, &pod).await;
    let written: Vec<String> = annotations_of(&stored)
        .into_iter()
        .filter(|(k, _)| k.starts_with("vault.hashicorp.com/agent-inject-template-"))
        .map(|(_, v)| v)
        .collect();
    assert!(
        !written.iter().any(|t| t.contains("other-team")),
        "another team's path reached the template: {written:?}"
    );
    refused(status, &resp, "key");

    // Control: a plain key is written in Flyte's form, byte for byte.
    let pod = task_pod(&[secret(
        "secret/data/team-a",
        "kv2",
        "password",
        MountRequirement::File,
    )]);
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let templates: Vec<String> = annotations_of(&stored)
        .into_iter()
        .filter(|(k, _)| k.starts_with("vault.hashicorp.com/agent-inject-template-"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        templates,
        [r#"{{- with secret "secret/data/team-a" -}}{{ .Data.data.password }}{{- end -}}"#]
    );
}

/// The Vault group climbs out of `/etc/flyte/secrets` through `agent-inject-file`.
#[tokio::test]
async fn a_vault_group_that_leaves_the_secrets_dir_is_refused() {
    let app = app(json!(["Vault"]));
    for group in ["../../../tmp/x", "/etc/cron.d/x", "secret//x"] {
        let pod = task_pod(&[secret(group, "kv2", "k", MountRequirement::File)]);
        let (status, resp, stored) = admit(&app, &pod).await;
        let files: Vec<String> = annotations_of(&stored)
            .into_iter()
            .filter(|(k, _)| k.starts_with("vault.hashicorp.com/agent-inject-file-"))
            .map(|(_, v)| v)
            .collect();
        assert!(
            files.is_empty(),
            "{group}: a file was requested at {files:?}"
        );
        let msg = refused(status, &resp, "group");
        assert!(msg.contains(&format!("{group:?}")), "{msg}");
    }
}

/// Runs the `sh -ec` script of every fetcher init container in `pod` as the container would,
/// in `dir`: the fetcher's volume, mounted at `/etc/flyte/secrets`, is `dir/secrets` (the
/// script's paths are mapped there), and `gcloud`, `az` and `chmod` are stubs that log their
/// arguments (one per line, each call ended by `--end--`) to `dir/calls`. Returns that log,
/// with `dir/secrets` written back as `/etc/flyte/secrets`.
fn run_fetchers(pod: &Value, dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    let volume = dir.join("secrets");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&volume).unwrap();
    let log = dir.join("calls");
    for stub in ["gcloud", "az", "chmod"] {
        let path = bin.join(stub);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\n{{ echo {stub}; for a in \"$@\"; do printf '%s\\n' \"$a\"; done; echo --end--; }} >> '{}'\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let token = dir.join("token");
    std::fs::write(&token, "federated-token").unwrap();
    let mount = volume.display().to_string();
    for c in pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(command) = c["command"].as_array() else {
            continue;
        };
        let command: Vec<String> = command
            .iter()
            .map(|a| a.as_str().unwrap().replace("/etc/flyte/secrets", &mount))
            .collect();
        if command.first().map(String::as_str) != Some("sh") {
            continue;
        }
        // The exit status is not asserted: an injected script may fail after its payload ran.
        Command::new("sh")
            .args(&command[1..])
            .current_dir(dir)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("AZURE_CLIENT_ID", "client")
            .env("AZURE_TENANT_ID", "tenant")
            .env("AZURE_FEDERATED_TOKEN_FILE", &token)
            .stdin(Stdio::null())
            .status()
            .expect("sh runs");
    }
    std::fs::read_to_string(&log)
        .unwrap_or_default()
        .replace(&mount, "/etc/flyte/secrets")
}

/// The calls of a log from [`run_fetchers`], each as its argument list.
fn calls(log: &str) -> Vec<Vec<&str>> {
    log.split_terminator("--end--\n")
        .map(|c| c.lines().collect())
        .collect()
}

/// GCP's group closes the fetcher's command: `mysecret; touch <file>; #` would run `touch` in
/// the init container. Whatever the reply, its fetchers are run with `sh`: the file must not
/// appear, and the pod must be refused.
#[tokio::test]
async fn a_gcp_group_that_runs_a_command_in_the_fetcher_is_refused_and_nothing_runs() {
    let app = app(json!(["GCP"]));
    let dir = temp_dir("gcp-shell-injection");
    let marker = dir.join("pm-pwned");
    let attacks = [
        (
            "group",
            format!("mysecret; touch {}; #", marker.display()),
            "2".to_owned(),
        ),
        (
            "group",
            format!("$(touch {})", marker.display()),
            "2".to_owned(),
        ),
        (
            "group_version",
            "s".to_owned(),
            format!("2; touch {}; #", marker.display()),
        ),
    ];
    for (field, group, version) in attacks {
        let pod = task_pod(&[secret(&group, &version, "", MountRequirement::File)]);
        let (status, resp, stored) = admit(&app, &pod).await;
        run_fetchers(&stored, &dir);
        assert!(
            !marker.exists(),
            "the fetcher ran `touch` for {group:?} / {version:?}"
        );
        refused(status, &resp, field);
    }

    // Control: a plain name reaches gcloud as whole arguments, one each.
    let pod = task_pod(&[secret("TestSecret", "2", "", MountRequirement::File)]);
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let log = run_fetchers(&stored, &dir);
    assert_eq!(
        calls(&log),
        [
            vec![
                "gcloud",
                "secrets",
                "versions",
                "access",
                "TestSecret/versions/2",
                "--out-file=/etc/flyte/secrets/testsecret/2"
            ],
            vec![
                "chmod",
                "+rX",
                "/etc/flyte/secrets/testsecret",
                "/etc/flyte/secrets/testsecret/2"
            ],
        ]
    );
}

/// Azure's group closes the double-quoted `--id` argument and adds a command.
#[tokio::test]
async fn an_azure_group_that_runs_a_command_in_the_fetcher_is_refused_and_nothing_runs() {
    let app = app(json!(["Azure"]));
    let dir = temp_dir("azure-shell-injection");
    let marker = dir.join("pm-pwned");
    let attacks = [
        (
            "group",
            format!(
                "https://v.vault.azure.net/secrets/a\"; touch {}; #",
                marker.display()
            ),
            String::new(),
        ),
        (
            "group",
            format!(
                "https://v.vault.azure.net/secrets/$(touch {})",
                marker.display()
            ),
            String::new(),
        ),
        (
            "group_version",
            "https://v.vault.azure.net/secrets/a".to_owned(),
            format!("1; touch {}; #", marker.display()),
        ),
    ];
    for (field, group, version) in attacks {
        let pod = task_pod(&[secret(&group, &version, "", MountRequirement::File)]);
        let (status, resp, stored) = admit(&app, &pod).await;
        run_fetchers(&stored, &dir);
        assert!(
            !marker.exists(),
            "the fetcher ran `touch` for {group:?} / {version:?}"
        );
        refused(status, &resp, field);
    }

    // Control: a plain URI and version reach az as whole arguments.
    let pod = task_pod(&[secret(
        "https://flyte-kv.vault.azure.net/secrets/DbPassword",
        "5d9e2c7a",
        "",
        MountRequirement::File,
    )]);
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let log = run_fetchers(&stored, &dir);
    let got = calls(&log);
    assert_eq!(got.len(), 2, "{log}");
    assert_eq!(
        got[0],
        [
            "az",
            "login",
            "--service-principal",
            "-u",
            "client",
            "-t",
            "tenant",
            "--federated-token",
            "federated-token"
        ]
    );
    assert_eq!(
        got[1],
        [
            "az",
            "keyvault",
            "secret",
            "show",
            "--id",
            "https://flyte-kv.vault.azure.net/secrets/DbPassword/5d9e2c7a",
            "--query",
            "value",
            "-o",
            "tsv"
        ]
    );
    assert!(
        dir.join("secrets/dbpassword/5d9e2c7a").is_file(),
        "the value's file is where the pod reads it"
    );
}

/// A K8s group climbs out of `/etc/flyte/secrets` as the mount path, or names a Secret the
/// API server refuses in a `secretKeyRef`.
#[tokio::test]
async fn a_k8s_group_that_leaves_the_secrets_dir_or_is_no_secret_name_is_refused() {
    let app = app(json!(["K8s"]));
    let cases = [
        ("group", "../../var/run", "k", MountRequirement::File),
        ("group", "team/../../../var/run", "k", MountRequirement::Any),
        ("group", "Team_DB", "password", MountRequirement::EnvVar),
        ("key", "db-creds", "../token", MountRequirement::File),
        ("key", "db-creds", "..", MountRequirement::EnvVar),
        ("key", "db-creds", "..data", MountRequirement::File),
        ("key", "db-creds", "..data", MountRequirement::EnvVar),
    ];
    for (field, group, key, mount) in cases {
        let pod = task_pod(&[secret(group, "", key, mount)]);
        let (status, resp, stored) = admit(&app, &pod).await;
        let text = stored["spec"].to_string();
        assert!(
            !text.contains(group) && !text.contains(&group.to_lowercase()),
            "{group:?} reached the pod spec: {text}"
        );
        refused(status, &resp, field);
    }
}

const FETCHER_IMAGE: &str = "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000";
const OURS: &str = "u__org__flyte__domain__development__project__flytesnacks__key__db";
const THEIRS: &str = "u__org__payroll__domain__production__project__salaries__key__db";

fn reference_app() -> Front {
    let cfg = config(
        json!(["Embedded"]),
        json!({"embedded": {"organization": "flyte", "delivery": "reference", "envVarDelivery": "exec", "fetcherImage": FETCHER_IMAGE}}),
    );
    webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::only([OURS, THEIRS]))),
    )
}

/// The API server calls this webhook again after a credentials webhook (EKS Pod Identity's,
/// IRSA's) and the ServiceAccount plugin gave every container, our fetcher included, their
/// variables and token mounts: the second pass keeps them (or the fetch would run without
/// credentials) and patches nothing. Mounts at or under the fetcher's own paths are not kept.
#[tokio::test]
async fn what_other_admission_steps_add_to_our_fetcher_survives_readmission() {
    let app = reference_app();
    let requests = [
        secret("", "", "db", MountRequirement::File),
        secret("", "", "db", MountRequirement::EnvVar),
    ];
    let (status, resp, mut pod) = admit(&app, &task_pod(&requests)).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let token = "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount";
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "eks-pod-identity-token", "projected": {"sources": [
            {"serviceAccountToken": {"audience": "pods.eks.amazonaws.com", "path": "eks-pod-identity-token"}}
        ]}}));
    for kind in ["containers", "initContainers"] {
        for c in pod["spec"][kind].as_array_mut().unwrap() {
            c["env"].as_array_mut().unwrap().extend([
                json!({"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI", "value": "http://169.254.170.23/v1/credentials"}),
                json!({"name": "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "value": format!("{token}/eks-pod-identity-token")}),
            ]);
            c["volumeMounts"].as_array_mut().unwrap().push(
                json!({"name": "eks-pod-identity-token", "mountPath": token, "readOnly": true}),
            );
        }
    }
    let (status, resp, again) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(patch_of(&resp), json!([]), "re-admission patches nothing");
    assert_eq!(again, pod);

    // A mount of the pod's under the fetcher's files, on a fetcher under our image, is dropped.
    let fetcher = |pod: &mut Value| -> Value {
        let inits = pod["spec"]["initContainers"].as_array_mut().unwrap();
        inits
            .iter_mut()
            .find(|c| c["name"] == INIT_CONTAINER)
            .unwrap()
            .take()
    };
    let mut planted = pod.clone();
    let mut ours = fetcher(&mut planted);
    let files = ours["volumeMounts"][0]["mountPath"]
        .as_str()
        .unwrap()
        .to_owned();
    ours["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "disk", "mountPath": format!("{files}/db")}));
    let inits = planted["spec"]["initContainers"].as_array_mut().unwrap();
    *inits.iter_mut().find(|c| c.is_null()).unwrap() = ours;
    let (status, resp, stored) = admit(&app, &planted).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(fetcher(&mut stored.clone()), fetcher(&mut pod.clone()));
    assert_valid_pods("credentials-webhook", &[("again".into(), again)]);
}

/// EKS's credentials webhook (`pod-identity-webhook`) sorts before this one and never sees the
/// fetcher: the fetcher takes the pod's own AWS identity (Pod Identity's or IRSA's variables
/// and the mount of their token) from the first app container, and nothing else of it.
#[tokio::test]
async fn the_fetcher_reads_with_the_pods_own_aws_identity() {
    let app = reference_app();
    let token_dir = "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount";
    let mut pod = task_pod(&[secret("", "", "db", MountRequirement::File)]);
    pod["spec"]["volumes"] = json!([{"name": "eks-pod-identity-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "pods.eks.amazonaws.com", "expirationSeconds": 86400, "path": "eks-pod-identity-token"}}
    ]}}]);
    let main = &mut pod["spec"]["containers"][0];
    main["env"] = json!([
        {"name": "APP_SETTING", "value": "kept in the app only"},
        {"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"},
        // The app's data region, not where the webhook resolved the secrets: not copied.
        {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"},
        {"name": "AWS_REGION", "value": "eu-west-1"},
        {"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI", "value": "http://169.254.170.23/v1/credentials"},
        {"name": "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "value": format!("{token_dir}/eks-pod-identity-token")}
    ]);
    main["volumeMounts"] = json!([
        {"name": "data", "mountPath": "/data"},
        {"name": "eks-pod-identity-token", "mountPath": token_dir, "readOnly": true}
    ]);
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "data", "emptyDir": {}}));
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let fetcher = init_containers(&stored)
        .into_iter()
        .find(|c| c["name"] == INIT_CONTAINER)
        .unwrap();
    let names: Vec<&str> = fetcher["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("AWS_") || *n == "APP_SETTING")
        .collect();
    assert_eq!(
        names,
        [
            "AWS_STS_REGIONAL_ENDPOINTS",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
        ],
        "{fetcher:#}"
    );
    let mounts = fetcher["volumeMounts"].to_string();
    assert!(mounts.contains(token_dir), "{mounts}");
    assert!(!mounts.contains("/data"), "{mounts}");
    let (status, resp, again) = admit(&app, &stored).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(patch_of(&resp), json!([]), "re-admission patches nothing");
    assert_valid_pods("pod-identity", &[("stored".into(), again)]);
}

/// A cloud manager's fetcher is the webhook's own: an exec request never wraps it, whether it
/// was added before the request, after it, or by an earlier pass (re-admission denied the pod:
/// the AWS fetcher has no command to wrap).
#[tokio::test]
async fn exec_delivery_never_wraps_a_cloud_managers_fetcher_in_either_order_or_on_readmission() {
    let cfg = config(
        json!(["Embedded", "AWS"]),
        json!({"embedded": {"organization": "flyte", "delivery": "reference", "envVarDelivery": "exec", "fetcherImage": FETCHER_IMAGE}}),
    );
    let app = webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::only([OURS, THEIRS]))),
    );
    let exec = secret("", "", "db", MountRequirement::EnvVar);
    let aws = secret(
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:",
        "",
        "prod-db-AbCdEf",
        MountRequirement::File,
    );
    for requests in [[exec.clone(), aws.clone()], [aws, exec]] {
        let (status, resp, once) = admit(&app, &task_pod(&requests)).await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
        let fetcher = init_containers(&once)
            .into_iter()
            .find(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("aws-pull-secret-"))
            })
            .unwrap();
        assert!(
            !fetcher.to_string().contains("podmutator exec"),
            "{fetcher:#}"
        );
        let (status, resp, twice) = admit(&app, &once).await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
        assert_eq!(patch_of(&resp), json!([]), "re-admission patches nothing");
        assert_valid_pods("exec-and-aws", &[("twice".into(), twice)]);
    }
}

/// Pod Security's `restricted` level, checked per container as the admission plugin checks it
/// (a container's own setting, else the pod's): a pod that meets it with settings on its
/// containers alone still meets it with the fetcher added.
#[tokio::test]
async fn the_fetcher_meets_pod_security_restricted_where_the_pods_containers_do() {
    let app = reference_app();
    let mut pod = task_pod(&[secret("", "", "db", MountRequirement::File)]);
    pod["spec"]["containers"][0]["securityContext"] = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": true,
        "seccompProfile": {"type": "RuntimeDefault"}
    });
    let restricted = |pod: &Value| -> Vec<String> {
        let level = |c: &Value, key: &str| -> Value {
            let own = &c["securityContext"][key];
            if own.is_null() {
                pod["spec"]["securityContext"][key].clone()
            } else {
                own.clone()
            }
        };
        let mut problems = Vec::new();
        for kind in ["containers", "initContainers"] {
            for c in pod["spec"][kind].as_array().into_iter().flatten() {
                let name = &c["name"];
                let sc = &c["securityContext"];
                if sc["allowPrivilegeEscalation"] != json!(false) {
                    problems.push(format!("{name}: allowPrivilegeEscalation"));
                }
                if !sc["capabilities"]["drop"]
                    .as_array()
                    .is_some_and(|d| d.contains(&json!("ALL")))
                {
                    problems.push(format!("{name}: capabilities.drop ALL"));
                }
                if level(c, "runAsNonRoot") != json!(true) || level(c, "runAsUser") == json!(0) {
                    problems.push(format!("{name}: runAsNonRoot"));
                }
                let seccomp = level(c, "seccompProfile")["type"].clone();
                if seccomp != json!("RuntimeDefault") && seccomp != json!("Localhost") {
                    problems.push(format!("{name}: seccompProfile"));
                }
            }
        }
        problems
    };
    assert_eq!(restricted(&pod), Vec::<String>::new());
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(
        restricted(&stored),
        Vec::<String>::new(),
        "{:#}",
        stored["spec"]
    );
}

fn init_containers(pod: &Value) -> Vec<Value> {
    pod["spec"]["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A pod brings an init container named like our fetcher: its own image, and a plan naming
/// another project's secret. It is replaced by exactly the fetcher the same pod gets without
/// it; the result admitted again gets no patch.
#[tokio::test]
async fn a_pod_supplied_reference_fetcher_is_replaced_by_ours_and_readmission_changes_nothing() {
    let app = reference_app();
    let requests = [
        secret("", "", "db", MountRequirement::File),
        secret("", "", "db", MountRequirement::EnvVar),
    ];
    let clean = task_pod(&requests);
    let (status, resp, expected) = admit(&app, &clean).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");

    let foreign_plan = json!({
        "root": "/podmutator-init",
        "secrets": [
            {"id": THEIRS, "file": "/podmutator-init/files/salaries"}
        ],
        "copyExecutableTo": "/podmutator-init/run/bin/podmutator"
    });
    let mut pod = clean.clone();
    pod["spec"]["initContainers"] = json!([
        {"name": "setup", "image": "busybox", "command": ["true"]},
        {
            "name": INIT_CONTAINER,
            "image": "evil.example/exfiltrate:1",
            "command": ["/exfiltrate"],
            "env": [
                {"name": FETCH_PLAN_ENV, "value": foreign_plan.to_string()},
                {"name": "UPLOAD_TO", "value": "https://evil.example/"}
            ],
            "volumeMounts": [{"name": "host", "mountPath": "/host"}]
        }
    ]);
    pod["spec"]["volumes"] = json!([{"name": "host", "hostPath": {"path": "/"}}]);
    let (status, resp, stored) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");

    let fetchers: Vec<Value> = init_containers(&stored)
        .into_iter()
        .filter(|c| c["name"] == INIT_CONTAINER)
        .collect();
    assert_eq!(fetchers.len(), 1, "{fetchers:#?}");
    let ours = init_containers(&expected)
        .into_iter()
        .find(|c| c["name"] == INIT_CONTAINER)
        .unwrap();
    assert_eq!(
        fetchers[0], ours,
        "exactly the fetcher the pod gets without its own"
    );
    assert_eq!(fetchers[0]["image"], FETCHER_IMAGE);
    let promised = promised_files(&serde_json::from_value(stored.clone()).unwrap()).unwrap();
    assert!(
        promised.values().all(|id| id == OURS),
        "the plan names another project's secret: {promised:?}"
    );
    let names: Vec<Value> = init_containers(&stored)
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, [json!(INIT_CONTAINER), json!("setup")]);
    assert!(
        !stored["spec"]["initContainers"]
            .to_string()
            .contains(THEIRS)
    );
    assert!(
        !stored["spec"]["initContainers"]
            .to_string()
            .contains("evil.example")
    );

    // Admitted again, the mutated pods change no more.
    for (what, done) in [("clean", &expected), ("replaced", &stored)] {
        let (status, resp, again) = admit(&app, done).await;
        assert_eq!(
            (status, &resp["allowed"]),
            (200, &json!(true)),
            "{what}: {resp}"
        );
        assert_eq!(
            patch_of(&resp),
            json!([]),
            "{what}: re-admission patches nothing"
        );
        assert_eq!(&again, done);
    }
    assert_valid_pods(
        "pod-supplied-fetcher",
        &[("clean".into(), expected), ("replaced".into(), stored)],
    );
}

/// `pod` admitted by `route`, which allows it: the patch, and the pod the API server stores.
async fn review_by(app: &Front, route: Route, pod: &Value) -> (Value, Value) {
    let body = serde_json::to_vec(&create_review(pod, NS)).unwrap();
    let reply = app.review(route, &body).await;
    let resp = response(&reply.body);
    assert_eq!(
        (reply.status, &resp["allowed"]),
        (200, &json!(true)),
        "{route:?}: {resp}"
    );
    (patch_of(&resp), apply(pod, &patch_of(&resp)))
}

/// Our own fetcher as it comes back when another webhook changed the pod after ours
/// (`reinvocationPolicy: IfNeeded`): the API server has filled in its defaults, and the images
/// entry has pointed its image at the mirror. It is ours, on every provider: allowed, nothing
/// more to patch. (It was refused as "not the fetcher podmutator injects".)
#[tokio::test]
async fn our_fetcher_as_the_api_server_gives_it_back_is_ours() {
    let rules = json!({"enabled": true, "rules": [
        {"match": "docker.io", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub"},
        {"match": "gcr.io", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gcr"},
        {"match": "mcr.microsoft.com", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/mcr"}
    ]});
    let cases = [
        (
            "AWS",
            secret(
                "arn:aws:secretsmanager:us-east-1:1:secret:",
                "",
                "db-AbCdEf",
                MountRequirement::File,
            ),
        ),
        ("GCP", secret("TestSecret", "2", "", MountRequirement::File)),
        (
            "Azure",
            secret(
                "https://vault.vault.azure.net/secrets/db",
                "",
                "",
                MountRequirement::File,
            ),
        ),
    ];
    for (provider, s) in cases {
        let app = webhook(
            &config(json!([provider]), json!({"images": rules})),
            Deps::offline(),
        );
        let (_, stored) = review_by(&app, Route::Secrets, &task_pod(&[s])).await;
        let stored = as_stored(&stored);
        let (again, _) = review_by(&app, Route::Secrets, &stored).await;
        assert_eq!(again, json!([]), "{provider}: defaults filled in");
        let (rewrote, mirrored) = review_by(&app, Route::Images, &stored).await;
        assert!(
            rewrote.to_string().contains("123456789012.dkr.ecr"),
            "{provider}: {rewrote}"
        );
        let (again, _) = review_by(&app, Route::Secrets, &as_stored(&mirrored)).await;
        assert_eq!(
            again,
            json!([]),
            "{provider}: image rewritten by the images entry"
        );
    }
}

/// The same when the image-builder entry rewrote a fetcher's image (one under
/// `hostnameReplacement.existing`), and for the reference fetcher the images entry mirrored:
/// each pass as the API server stores the pod, the last one patches nothing. (The sidecar
/// fetcher was refused as foreign; the reference fetcher was rebuilt, its mirror and defaults
/// patched away.)
#[tokio::test]
async fn a_fetcher_the_other_entries_rewrote_is_ours_when_the_pod_comes_back() {
    let e = "registry.union.example";
    let r = "cr.union.example";
    let builder = json!({
        "enabled": true,
        "hostnameReplacement": {"existing": e, "replacement": r},
        "excludedImagePrefixes": ["flytekit"]
    });
    let sidecar = json!({"webhook": {
        "secretManagerTypes": ["AWS"],
        "awsSecretManager": {"sidecarImage": format!("{e}/unionai/aws-sidecar:1")},
        "imageBuilderConfig": builder
    }});
    let sidecar = webhook(
        &Config::from_value(sidecar).unwrap().config,
        Deps::offline(),
    );
    let aws = secret(
        "arn:aws:secretsmanager:us-east-1:1:secret:",
        "",
        "db-AbCdEf",
        MountRequirement::File,
    );
    let reference = config(
        json!(["Embedded"]),
        json!({
            "embedded": {"organization": "flyte", "delivery": "reference", "envVarDelivery": "exec", "fetcherImage": FETCHER_IMAGE},
            "images": {"enabled": true, "rules": [
                {"match": "registry.example", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror"}
            ]}
        }),
    );
    let reference = webhook(
        &reference,
        Deps::offline().with_resolver(Arc::new(NameSource::only([OURS]))),
    );
    let requests = [
        secret("", "", "db", MountRequirement::File),
        secret("", "", "db", MountRequirement::EnvVar),
    ];
    let cases = [
        (&sidecar, task_pod(&[aws]), Route::ImageBuilder, r),
        (
            &reference,
            task_pod(&requests),
            Route::Images,
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror/",
        ),
    ];
    for (app, pod, other, rewritten) in cases {
        let (_, stored) = review_by(app, Route::Secrets, &pod).await;
        let (rewrote, stored) = review_by(app, other, &as_stored(&stored)).await;
        assert!(
            rewrote.to_string().contains(rewritten),
            "{other:?}: {rewrote}"
        );
        let stored = as_stored(&stored);
        let (again, _) = review_by(app, Route::Secrets, &stored).await;
        assert_eq!(again, json!([]), "{other:?}: {stored}");
    }
}

/// What a policy engine's webhook (Kyverno's `verifyImages` with `mutateDigest`, a
/// `restricted` security-context default) does to every container between two of our passes:
/// each image pinned to a digest, and restrictions added where the container sets none.
fn policy_engine(pod: &Value) -> Value {
    let mut pod = pod.clone();
    for list in ["initContainers", "containers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let image = c["image"].as_str().unwrap().to_owned();
            if !image.contains('@') {
                c["image"] = json!(format!("{image}@sha256:{}", "9d".repeat(32)));
            }
            let sc = c
                .as_object_mut()
                .unwrap()
                .entry("securityContext")
                .or_insert(json!({}));
            let sc = sc.as_object_mut().unwrap();
            for (k, v) in [
                ("allowPrivilegeEscalation", json!(false)),
                ("runAsNonRoot", json!(true)),
                ("seccompProfile", json!({"type": "RuntimeDefault"})),
                ("capabilities", json!({"drop": ["ALL"]})),
            ] {
                sc.entry(k).or_insert(v);
            }
        }
    }
    pod
}

/// Our fetchers after a policy engine pinned their images and tightened their security
/// context, when the pod comes back: ours, on every provider and for the reference fetcher,
/// and the last pass patches nothing. (They were refused as foreign, or rebuilt.) A fetcher
/// that a policy loosened is still refused: the sidecar test's `privileged` case.
#[tokio::test]
async fn a_fetcher_a_policy_engine_pinned_and_tightened_is_ours_when_the_pod_comes_back() {
    let aws = secret(
        "arn:aws:secretsmanager:us-east-1:1:secret:",
        "",
        "db-AbCdEf",
        MountRequirement::File,
    );
    let gcp = secret("TestSecret", "2", "", MountRequirement::File);
    let azure = secret(
        "https://vault.vault.azure.net/secrets/db",
        "",
        "",
        MountRequirement::File,
    );
    let requests = [
        secret("", "", "db", MountRequirement::File),
        secret("", "", "db", MountRequirement::EnvVar),
    ];
    let cases = [
        ("AWS", app(json!(["AWS"])), task_pod(&[aws])),
        ("GCP", app(json!(["GCP"])), task_pod(&[gcp])),
        ("Azure", app(json!(["Azure"])), task_pod(&[azure])),
        ("reference", reference_app(), task_pod(&requests)),
    ];
    for (what, app, pod) in cases {
        let (_, stored) = review_by(&app, Route::Secrets, &pod).await;
        let stored = as_stored(&policy_engine(&as_stored(&stored)));
        let (again, after) = review_by(&app, Route::Secrets, &stored).await;
        assert_eq!(again, json!([]), "{what}: {stored}");
        assert!(
            after["spec"]["initContainers"][0]["image"]
                .as_str()
                .unwrap()
                .contains("@sha256:"),
            "{what}: {after}"
        );
    }
}

/// A pod brings an init container under a GCP fetcher's name, with the fetcher's very command
/// but an image of its own: it is given our image, so what runs is ours (as it is for a
/// previous configuration's `sidecarImage` during a rollout). One that also runs something
/// else is refused, not taken for ours.
#[tokio::test]
async fn a_pod_supplied_gcp_fetcher_with_our_name_runs_our_image_or_is_refused() {
    let app = app(json!(["GCP"]));
    let clean = task_pod(&[secret("TestSecret", "2", "", MountRequirement::File)]);
    let (status, resp, admitted) = admit(&app, &clean).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let mut ours = init_containers(&admitted)[0].clone();
    let name = ours["name"].as_str().unwrap().to_owned();
    let image = ours["image"].clone();

    // Our own, as an admission left it: nothing more to do.
    let (status, resp, _) = admit(&app, &admitted).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(patch_of(&resp), json!([]));

    ours["image"] = json!("evil.example/cloud-sdk:alpine");
    let mut pod = admitted.clone();
    pod["spec"]["initContainers"] = json!([ours]);
    let (status, resp, again) = admit(&app, &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "replace", "path": "/spec/initContainers/0/image", "value": image}])
    );
    assert_eq!(again, admitted);

    ours["command"] = json!(["sh", "-ec", "gcloud secrets list"]);
    pod["spec"]["initContainers"] = json!([ours]);
    let (status, resp, _) = admit(&app, &pod).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 400, "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(msg.contains("flyte.secrets/s0"), "{msg}");
    assert!(
        msg.contains(&format!(
            "init container {name} already exists and is not the fetcher podmutator injects"
        )) && msg.contains("remove or rename that init container"),
        "{msg}"
    );
}

/// A pod's own container named like the Embedded file writer (`init-embedded-secret`) would
/// be given `SECRETS` and write no file: value delivery refuses the FILE secret, naming the
/// container, before any fetch. Reference delivery writes files with its own fetcher and
/// never adds that container: the same pod is admitted.
#[tokio::test]
async fn a_pods_own_container_named_like_the_file_writer_is_refused_only_where_it_would_be_written()
{
    let requests = [secret("", "", "db", MountRequirement::File)];
    let mut pod = task_pod(&requests);
    pod["spec"]["initContainers"] =
        json!([{"name": "init-embedded-secret", "image": "busybox", "command": ["true"]}]);
    let value = webhook(
        &config(
            json!(["Embedded"]),
            json!({"embedded": {"organization": "flyte"}}),
        ),
        Deps::offline(),
    );
    let (_, resp, _) = admit(&value, &pod).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("its own container named init-embedded-secret"),
        "{message}"
    );
    let (status, resp, stored) = admit(&reference_app(), &pod).await;
    assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    let own = init_containers(&stored)
        .into_iter()
        .find(|c| c["name"] == "init-embedded-secret")
        .unwrap();
    assert_eq!(
        (&own["image"], &own["command"]),
        (&json!("busybox"), &json!(["true"]))
    );
}

/// The fetcher's files are readable by its user alone only when every container of the pod runs
/// as that user by the pod spec (the fetcher runs as the first container's user); otherwise a
/// container may run as its image's user (flytekit's: 1000, where the fetcher's is 65532), and
/// the files are readable by every user, as a Secret volume's are, or it could not read them.
#[tokio::test]
async fn the_fetchers_files_are_its_users_alone_only_when_the_pod_names_one_user_for_all() {
    let app = reference_app();
    let plan_of = |stored: &Value| -> Value {
        let fetcher = init_containers(stored)
            .into_iter()
            .find(|c| c["name"] == INIT_CONTAINER)
            .unwrap();
        let env = fetcher["env"].as_array().unwrap();
        let plan = env.iter().find(|e| e["name"] == FETCH_PLAN_ENV).unwrap();
        serde_json::from_str(plan["value"].as_str().unwrap()).unwrap()
    };
    let base = task_pod(&[secret("", "", "db", MountRequirement::File)]);
    let mut one_user = base.clone();
    one_user["spec"]["securityContext"] = json!({"runAsUser": 1000});
    let mut sidecar = one_user.clone();
    sidecar["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "image": "envoy", "securityContext": {"runAsUser": 2000}}));
    for (pod, readable_by_all) in [(&base, true), (&one_user, false), (&sidecar, true)] {
        let (status, resp, stored) = admit(&app, pod).await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
        let plan = plan_of(&stored);
        assert_eq!(
            plan.get("readableByAll").is_some_and(|v| v == true),
            readable_by_all,
            "{plan}"
        );
    }
}
