//! The binary's command line: generated help for every command, `check-config` redaction, and
//! `podmutator inject` against golden outputs in tests/fixtures/inject/ (inputs written for
//! these tests; the annotations are `podmutator secret-annotations` output).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::{apply, assert_valid_pods, create_review, patch_of, response, root};
use podmutator::mutate::Route;
use podmutator::{Config, Deps};
use serde_json::{Value, json};

const TOKEN: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/inject").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The binary with no configuration from this machine's environment.
fn podmutator(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podmutator"))
        .args(args)
        .env_remove("PODMUTATOR_CONFIG_FILE")
        .env_remove("PODMUTATOR_CONFIG")
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_command_has_generated_help_listing_its_options() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--help"],
            &[
                "serve",
                "lambda",
                "check-config",
                "webhook-config",
                "secret-annotations",
                "inject",
                "--config <FILE>",
                "PODMUTATOR_CONFIG_FILE",
                "PODMUTATOR_CONFIG]",
                "AWS_LAMBDA_RUNTIME_API",
                "RUST_LOG",
            ],
        ),
        (
            &["serve", "--help"],
            &["--pod-namespace", "POD_NAMESPACE", "--config <FILE>"],
        ),
        (
            &["lambda", "--help"],
            &["--config <FILE>", "PODMUTATOR_CONFIG_FILE"],
        ),
        (
            &["check-config", "--help"],
            &["--config-json <JSON>", "redacted"],
        ),
        (
            &["webhook-config", "--help"],
            &[
                "--url <URL>",
                "--path-token-file <FILE>",
                "--ca-bundle-file <FILE>",
                "--mesh ",
                "--mesh-label-key <KEY>",
                "--image-builder-selector <JSON>",
                "--images ",
                "--images-pod-selector <JSON>",
                "--images-namespace-selector <JSON>",
                "--failure-policy <POLICY>",
                "--timeout-seconds <N>",
                "--name <NAME>",
            ],
        ),
        (
            &["secret-annotations", "--help"],
            &["--decode", "<JSON>", "mount_requirement"],
        ),
        (
            &["inject", "--help"],
            &[
                "--filename <FILE|->",
                "--route <ROUTE>",
                "--namespace <NAMESPACE>",
                "--patch",
                "--diff",
                "--embedded",
                "PODMUTATOR_CONFIG_FILE",
            ],
        ),
    ];
    for (args, wanted) in cases {
        let out = podmutator(args, None);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {:?} {}",
            out.status,
            text(&out.stderr)
        );
        for w in *wanted {
            // A flag without a value ends its line when clap lays the help out long.
            let listed = stdout.contains(w) || stdout.lines().any(|l| l.trim() == w.trim());
            assert!(listed, "{args:?} help lacks {w:?}:\n{stdout}");
        }
    }
}

#[test]
fn a_usage_error_names_the_flag_and_exits_non_zero() {
    let out = podmutator(
        &[
            "webhook-config",
            "--url",
            "https://h",
            "--timeout-seconds",
            "31",
        ],
        None,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--timeout-seconds"), "{stderr}");
    assert!(stderr.contains("from 1 to 30"), "{stderr}");
}

#[test]
fn check_config_never_prints_the_path_token() {
    let config = json!({"http": {"pathToken": TOKEN}}).to_string();
    let out = podmutator(&["check-config", "--config-json", &config], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(!stdout.contains(TOKEN), "{stdout}");
    assert!(!text(&out.stderr).contains(TOKEN));
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed["http"]["pathToken"], "<redacted>");
}

/// `inject` prints the golden output for `args`, and succeeds.
fn assert_golden(args: &[&str], stdin: Option<&str>, golden: &str) {
    let out = podmutator(args, stdin);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout,
        read(golden),
        "{args:?} differs from {golden}; got:\n{stdout}"
    );
}

#[test]
fn inject_prints_the_mutated_manifests() {
    let input = fixture("manifests.yaml");
    let input = input.to_str().unwrap();
    assert_golden(&["inject", "-f", input], None, "manifests.out.yaml");
    assert_golden(&["inject", "-f", input, "--diff"], None, "manifests.diff");
    assert_golden(
        &["inject", "-f", input, "--patch"],
        None,
        "manifests.patch.yaml",
    );
}

#[test]
fn inject_reads_a_json_list_from_stdin_and_answers_in_json() {
    assert_golden(
        &["inject", "-f", "-"],
        Some(&read("list.json")),
        "list.out.json",
    );
}

#[test]
fn a_denial_reads_as_the_api_server_would_show_it_and_the_rest_is_still_printed() {
    let out = podmutator(
        &["inject", "-f", fixture("denied.yaml").to_str().unwrap()],
        None,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "Pod/default/broken: admission webhook \"podmutator\" denied the request: [secrets]"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("re-register the task or remove the annotation"),
        "{stderr}"
    );
    assert!(stderr.contains("1 of 1 pods would be refused"), "{stderr}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("kind: ConfigMap") && stdout.contains("name: after"),
        "{stdout}"
    );
}

#[test]
fn inject_will_not_reach_aws_unless_told_to() {
    let config = json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }})
    .to_string();
    let input = fixture("manifests.yaml");
    let out = podmutator(
        &[
            "inject",
            "-f",
            input.to_str().unwrap(),
            "--config-json",
            &config,
        ],
        None,
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pass --embedded"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

/// `inject --embedded` in reference delivery is the served webhook's reference delivery: names
/// resolved with `DescribeSecret` only, the fetcher and the wrapped command in the output, and
/// no value anywhere in what it prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_in_reference_delivery_resolves_names_and_reads_no_value() {
    use common::aws::{CountingProxy, Moto, client, create_secret};
    use podmutator::pod::injector::{EXECUTABLE, INIT_CONTAINER};
    use podmutator::secrets::codec::{MountRequirement, Secret, encode_annotations};

    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let value = "SENTINEL-inject-3f9a0c71";
    for key in ["db", "token"] {
        create_secret(
            &setup,
            &format!("u__org__flyte__domain__development__project__flytesnacks__key__{key}"),
            value,
        )
        .await;
    }
    let proxy = CountingProxy::start(moto.port).await;
    let secrets = [
        Secret {
            key: "db".into(),
            mount_requirement: MountRequirement::File,
            ..Default::default()
        },
        Secret {
            key: "token".into(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        },
    ];
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit", "command": ["python", "task.py"]}]}
    });
    let config = json!({
        "webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        }
    })
    .to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_podmutator"))
        .args([
            "inject",
            "--embedded",
            "-n",
            "flytesnacks-development",
            "-f",
            "-",
            "--config-json",
            &config,
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_ENDPOINT_URL", proxy.url())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(pod.to_string().as_bytes()).unwrap();
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stdout.contains(value) && !stderr.contains(value),
        "{stdout}"
    );
    assert!(proxy.count("DescribeSecret") > 0, "names were resolved");
    assert_eq!(
        proxy.total(),
        proxy.count("DescribeSecret"),
        "and nothing but names"
    );
    let injected: Value = serde_json::from_str(&stdout).unwrap();
    let inits = injected["spec"]["initContainers"].as_array().unwrap();
    assert!(
        inits.iter().any(|c| c["name"] == INIT_CONTAINER),
        "{stdout}"
    );
    assert_eq!(
        injected["spec"]["containers"][0]["command"],
        json!([EXECUTABLE, "exec", "--", "python", "task.py"])
    );
    assert!(
        stdout.contains("u__org__flyte__domain__development__project__flytesnacks__key__db"),
        "{stdout}"
    );
}

/// Every pod and pod template in a manifest, as the Pod the API server would create.
fn pods_of(docs: &[Value]) -> Vec<(String, Value)> {
    let mut pods = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let template = match kind {
            "Pod" => {
                pods.push((format!("Pod/{name}"), doc.clone()));
                continue;
            }
            "CronJob" => doc.pointer("/spec/jobTemplate/spec/template"),
            _ => doc.pointer("/spec/template"),
        };
        if let Some(t) = template {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": t["metadata"], "spec": t["spec"]});
            pod["metadata"]["name"] = json!(name);
            pods.push((format!("{kind}/{name}"), pod));
        }
    }
    pods
}

#[test]
fn injected_pods_are_valid_kubernetes_pods() {
    let docs: Vec<Value> = serde_saphyr::from_multiple(&read("manifests.out.yaml")).unwrap();
    let pods = pods_of(&docs);
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert_valid_pods("inject", &pods);
}

/// `inject` is the webhook: its pod is what the served webhook's patch makes of the input.
#[tokio::test]
async fn inject_does_what_the_served_webhook_does() {
    let input: Vec<Value> = serde_saphyr::from_multiple(&read("manifests.yaml")).unwrap();
    let out = podmutator(
        &["inject", "-f", fixture("manifests.yaml").to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let output: Vec<Value> = serde_saphyr::from_multiple(&text(&out.stdout)).unwrap();
    let front = common::webhook(&Config::default(), Deps::offline());
    let pod = &input[2];
    assert_eq!(pod["kind"], "Pod");
    let body = serde_json::to_vec(&create_review(pod, "flyte")).unwrap();
    let reply = front.review(Route::Secrets, &body).await;
    let served = apply(pod, &patch_of(&response(&reply.body)));
    assert_ne!(&served, pod, "the fixture pod must be mutated");
    assert_eq!(output[2], served);
    // Objects that are not pods pass through unchanged.
    assert_eq!(output[3], input[3]);
}

#[test]
fn lambda_outside_lambda_names_the_missing_variables_instead_of_panicking() {
    // `lambda_runtime` reads these at start and panics on a missing one.
    let out = Command::new(env!("CARGO_BIN_EXE_podmutator"))
        .arg("lambda")
        .env_remove("PODMUTATOR_CONFIG_FILE")
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"http": {"pathTokenDisabled": true}}"#,
        )
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "lots")
        .stdin(Stdio::null())
        .output()
        .expect("the binary starts");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("AWS_LAMBDA_FUNCTION_NAME is not set")
            && stderr
                .contains("AWS_LAMBDA_FUNCTION_MEMORY_SIZE is not a whole number of MB: \"lots\"")
            && stderr.contains("podmutator serve"),
        "{stderr}"
    );
}

/// A misspelt level, or an empty `RUST_LOG`, used to select no target at all: not one line,
/// and nothing said. Now the bad filter is named on stderr and `info` is used.
#[test]
fn a_misspelt_or_empty_rust_log_is_named_on_stderr_and_info_is_used() {
    for (spec, named) in [
        ("inof", "\"inof\" is not a level"),
        ("", "it is empty"),
        ("info,podmutator=loud", "\"podmutator=loud\""),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_podmutator"))
            .arg("check-config")
            .env_remove("PODMUTATOR_CONFIG_FILE")
            .env(
                "PODMUTATOR_CONFIG",
                r#"{"http": {"pathTokenDisabled": true}}"#,
            )
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env("RUST_LOG", spec)
            .stdin(Stdio::null())
            .output()
            .expect("the binary starts");
        let stderr = text(&out.stderr);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{spec:?}: {stderr}");
        let said: Vec<&str> = stderr.lines().collect();
        assert_eq!(said.len(), 1, "{spec:?}: one line: {stderr}");
        assert!(
            said[0].starts_with(&format!(
                "podmutator: RUST_LOG={spec:?} is not a valid log filter"
            )) && said[0].contains(named)
                && said[0].ends_with("logging at info"),
            "{stderr}"
        );
        // The start-up warning of `pathTokenDisabled` is logged: the filter is not empty.
        let warned = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["level"] == "WARN" && v["message"] == "configuration");
        assert!(warned, "{spec:?}: nothing logged: {stdout}");
    }
}
