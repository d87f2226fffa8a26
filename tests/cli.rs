//! The binary's command line: generated help for every command, `check-config` redaction, and
//! `podmutator inject` against golden outputs in tests/fixtures/inject/ (inputs written for
//! these tests; the annotations are `podmutator secret-annotations` output).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{apply, assert_valid_pods, create_review, patch_of, response, root};
use podmutator_core::mutate::Route;
use podmutator_core::{Config, Deps};
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
    let mut child = crate::common::bin()
        .args(args)
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
                "certs",
                "lambda",
                "check-config",
                "webhook-config",
                "secret-annotations",
                "inject",
                "version",
                "completion",
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
            &["certs", "--help"],
            &[
                "--api-server <URL>",
                "--token-file <FILE>",
                "--api-ca-file <FILE>",
                "POD_NAMESPACE",
                "--ca-validity <DURATION>",
                "--renew-before <DURATION>",
                "overlays/self-managed-ca",
            ],
        ),
        (
            &["lambda", "--help"],
            &[
                "--config <FILE>",
                "PODMUTATOR_CONFIG_FILE",
                "--flyte-config <FILE>",
                "PODMUTATOR_FLYTE_CONFIG_FILE",
            ],
        ),
        (
            &["check-config", "--help"],
            &[
                "--config-json <JSON>",
                "redacted",
                "--flyte-config <FILE>",
                "PODMUTATOR_FLYTE_CONFIG_FILE",
            ],
        ),
        (
            &["webhook-config", "--help"],
            &[
                "--url <URL>",
                "--path-token-file <FILE>",
                "--no-path-token",
                "--ca-bundle-file <FILE>",
                "--mesh ",
                "--mesh-label-key <KEY>",
                "--image-builder-selector <JSON>",
                "--images ",
                "--images-pod-selector <JSON>",
                "--images-namespace-selector <JSON>",
                "--secrets-namespace-selector <JSON>",
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
                // --embedded's help says what it is.
                "A dry run",
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

/// What a newcomer types first: nothing, `version`, a misspelt command or option, and the
/// shell completion kubectl users source.
#[test]
fn no_command_prints_help_and_version_completion_and_suggestions_answer() {
    let out = podmutator(&[], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("podmutator: Kubernetes pod-mutating admission webhook"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("Commands:"));

    let out = podmutator(&["version"], None);
    let v = text(&out.stdout);
    let lines: Vec<&str> = v.lines().collect();
    assert_eq!(
        lines[0],
        format!("podmutator {}", env!("CARGO_PKG_VERSION"))
    );
    let commit = lines[1].strip_prefix("commit: ").unwrap();
    // This checkout's commit, or "unknown" where the build had no Git metadata.
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{v}"
    );
    assert_eq!(lines[2], "build: full (serve and the operator's tools)");

    for (typed, tip) in [
        (&["serv"][..], "'serve'"),
        (&["check-config", "--confg", "x"][..], "'--config'"),
    ] {
        let out = podmutator(typed, None);
        assert_eq!(out.status.code(), Some(2));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("a similar") && stderr.contains(tip),
            "{typed:?}: {stderr}"
        );
    }

    for shell in ["bash", "zsh", "fish"] {
        let out = podmutator(&["completion", shell], None);
        assert!(out.status.success(), "{shell}");
        let script = text(&out.stdout);
        for command in ["check-config", "inject", "webhook-config"] {
            assert!(script.contains(command), "{shell} completes {command}");
        }
    }
    // The bash script loads in bash and registers the command.
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <({} completion bash) && complete -p podmutator",
            env!("CARGO_BIN_EXE_podmutator")
        ))
        .output()
        .unwrap();
    assert!(
        text(&bash.stdout).contains("-F _podmutator podmutator"),
        "{}",
        text(&bash.stderr)
    );
}

/// A file with no pod in it (a wrong file passed by mistake) is said to hold nothing to mutate,
/// and pods the webhook leaves alone are said to be left alone, on stderr, beside the output.
#[test]
fn inject_says_when_it_found_nothing_to_mutate() {
    let config = root().join("config/local.yaml");
    let out = podmutator(&["inject", "-f", config.to_str().unwrap()], None);
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("holds no Pod or pod template"),
        "{}",
        text(&out.stderr)
    );
    let plain = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}"#;
    let out = podmutator(&["inject", "-f", "-"], Some(plain));
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("the webhook changes none of the 1 pods in -"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("inject-flyte-secrets"),
        "{}",
        text(&out.stderr)
    );
    let out = podmutator(
        &["inject", "-f", fixture("manifests.yaml").to_str().unwrap()],
        None,
    );
    assert_eq!(text(&out.stderr), "", "pods were changed: nothing to say");
}

/// `inject --diff` colours its hunks only on a terminal, and not when `NO_COLOR` is set (run
/// under `script`, which gives the binary a pseudo-terminal as its standard output).
#[test]
fn inject_diff_is_coloured_on_a_terminal_unless_no_color_is_set() {
    let input = fixture("manifests.yaml");
    let command = format!(
        "{} inject -f {} --diff",
        env!("CARGO_BIN_EXE_podmutator"),
        input.display()
    );
    let under_a_terminal = |no_color: Option<&str>| -> String {
        let mut script = Command::new("script");
        script
            .args(["-qec", &command, "/dev/null"])
            .stdin(Stdio::null())
            .env_remove("PODMUTATOR_CONFIG")
            .env_remove("PODMUTATOR_CONFIG_FILE")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            script.env("NO_COLOR", v);
        }
        let out = script.output().expect("script (util-linux) is required");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let coloured = under_a_terminal(None);
    assert!(
        coloured.contains("\x1b[32m+") && coloured.contains("\x1b[0m"),
        "{coloured}"
    );
    for no_color in ["1", "yes"] {
        let plain = under_a_terminal(Some(no_color));
        assert!(!plain.contains('\x1b'), "NO_COLOR={no_color}: {plain}");
        assert!(plain.contains("\n+"), "{plain}");
    }
    // Piped (not a terminal): plain, as the golden diff shows.
    let piped = podmutator(&["inject", "-f", input.to_str().unwrap(), "--diff"], None);
    assert!(!text(&piped.stdout).contains('\x1b'));
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

/// The staged rollout of docs/migration.md, step 1: the secrets entry on the pilot namespace,
/// failing open, as the binary prints it for `kubectl apply -f -`.
#[test]
fn webhook_config_renders_a_secrets_namespace_selector() {
    let dir = std::env::temp_dir().join(format!("podmutator-cli-selector-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let out = podmutator(
        &[
            "webhook-config",
            "--url",
            "https://podmutator.example.com",
            "--path-token-file",
            token.to_str().unwrap(),
            "--failure-policy",
            "Ignore",
            "--secrets-namespace-selector",
            r#"{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["flytesnacks-development"]}]}"#,
        ],
        None,
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: Value = serde_saphyr::from_str(&text(&out.stdout)).unwrap();
    let secrets = &printed["webhooks"][0];
    assert_eq!(secrets["name"], "flyte-pod-webhook.flyte.org");
    assert_eq!(secrets["failurePolicy"], "Ignore");
    assert_eq!(
        secrets["namespaceSelector"],
        json!({"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["flytesnacks-development"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]})
    );

    let refused = podmutator(
        &[
            "webhook-config",
            "--url",
            "https://h",
            "--no-path-token",
            "--secrets-namespace-selector",
            "kubernetes.io/metadata.name=flytesnacks-development",
        ],
        None,
    );
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("--secrets-namespace-selector") && stderr.contains("LabelSelector as JSON"),
        "{stderr}"
    );
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
            "Pod/default/broken: admission webhook \"flyte-pod-webhook.flyte.org\" denied the request: [secrets]"
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
    }, "embedded": {"organization": "flyte"}})
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

/// `-n` is a namespace the API server would take, or the command is refused naming it.
#[test]
fn inject_refuses_a_namespace_no_pod_could_be_in() {
    let input = fixture("manifests.yaml");
    for bad in ["", "Bad_NS"] {
        let out = podmutator(&["inject", "-f", input.to_str().unwrap(), "-n", bad], None);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("{bad:?} is not a namespace name")),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
}

/// `inject --embedded` in reference delivery is the served webhook's reference delivery: names
/// resolved with `DescribeSecret` only, the fetcher and the wrapped command in the output, and
/// no value anywhere in what it prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_in_reference_delivery_resolves_names_and_reads_no_value() {
    use common::aws::{CountingProxy, Moto, client, create_secret};
    use podmutator_core::pod::injector::{EXECUTABLE, INIT_CONTAINER};
    use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};

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
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            // Moto is slow on a loaded machine; the deadline is not what this test is about.
            "deadlineMs": 25000
        }
    })
    .to_string();
    let mut child = crate::common::bin()
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
    let out = crate::common::bin()
        .arg("lambda")
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

/// The binary with `config` in a file, for `command`; `lambda` gets the variables the Lambda
/// runtime would set, pointing at a port nothing listens on (a refused start never reaches it).
fn start_with(command: &str, config: &Value, dir: &std::path::Path) -> Output {
    let file = dir.join(format!("{command}.json"));
    std::fs::write(&file, config.to_string()).unwrap();
    let mut cmd = crate::common::bin();
    cmd.args([command, "--config", file.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null());
    if command == "lambda" {
        cmd.env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
            .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512");
    }
    cmd.output().unwrap()
}

/// `out` is a refused start (exit 1) whose last line starts with `wanted`.
fn assert_refused(name: &str, command: &str, out: &Output, wanted: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{name}: {command}: {}",
        text(&out.stderr)
    );
    assert!(
        refusal(out).starts_with(wanted),
        "{name}: {command} said {:?}",
        refusal(out)
    );
}

/// The last line of stderr: `main`'s error, after any warning.
fn refusal(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn check_config_refuses_exactly_what_serve_and_lambda_refuse_with_the_same_key_and_message() {
    let tmp = common::temp_dir("gate");
    let certs = tmp.join("certs");
    let token = json!({"pathToken": TOKEN, "listenAddress": "127.0.0.1"});
    let cases: &[(&str, Value, &str)] = &[
        (
            "unknown_mutator",
            json!({"http": token, "mutators": {"secret": {"required": true}}}),
            "mutators.secret: unknown mutator",
        ),
        (
            "no_path_token",
            json!({"http": {"listenAddress": "127.0.0.1"}}),
            "http: no path token",
        ),
        (
            "secrets_selector_equal_to_the_mesh_label",
            json!({"http": token, "mesh": {"enabled": true, "managedLabel": "inject-flyte-secrets"}}),
            "secretsSelector.label: must differ from mesh.managedLabel",
        ),
        (
            "unreadable_registry_ca_bundle",
            json!({"http": token, "embedded": {"entrypointLookup": {
                       "registries": ["registry.example"],
                       "caBundleFile": "/nonexistent/registry-ca.pem"}}}),
            "embedded.entrypointLookup.caBundleFile: cannot read /nonexistent/registry-ca.pem",
        ),
        (
            "path_token_hash_that_is_not_hex",
            json!({"http": {"pathTokenSha256": "not-a-hash"}}),
            "http.pathTokenSha256:",
        ),
        (
            "namespace_template_without_the_domain",
            json!({"http": token, "embedded": {"namespaceTemplate": "{{ project }}"}}),
            "embedded.namespaceTemplate:",
        ),
    ];
    for (name, config, wanted) in cases {
        let mut config = config.clone();
        config["webhook"]["certDir"] = json!(certs.to_str().unwrap());
        let checked = start_with("check-config", &config, &tmp);
        let served = start_with("serve", &config, &tmp);
        let lambda = start_with("lambda", &config, &tmp);
        for (command, out) in [
            ("check-config", &checked),
            ("serve", &served),
            ("lambda", &lambda),
        ] {
            let wanted = format!("podmutator: invalid configuration: {wanted}");
            assert_refused(name, command, out, &wanted);
        }
        assert_eq!(refusal(&checked), refusal(&served), "{name}");
        assert_eq!(refusal(&checked), refusal(&lambda), "{name}");
        assert!(
            checked.stdout.is_empty(),
            "{name}: a refusal prints no configuration"
        );
        assert!(
            !certs.exists(),
            "{name}: a refused start must not write certificates"
        );
    }
}

/// `http.clientCaFile` is `serve`'s alone (Lambda's callers come through its endpoint), and
/// `check-config` refuses the file `serve` would, before a certificate is written.
#[test]
fn check_config_refuses_the_client_ca_file_serve_would() {
    let tmp = common::temp_dir("client-ca");
    let certs = tmp.join("certs");
    std::fs::create_dir_all(&tmp).unwrap();
    let good = common::ClientCert::new();
    let files = [
        ("missing", None, "cannot read"),
        ("empty", Some(String::new()), "holds no certificate"),
        ("key", Some(good.key.clone()), "holds no certificate"),
        ("ca", Some(good.ca.clone()), ""),
    ];
    for (name, content, wanted) in files {
        let file = tmp.join(format!("{name}.pem"));
        if let Some(content) = content {
            std::fs::write(&file, content).unwrap();
        }
        let config = json!({
            "webhook": {"certDir": certs, "listenPort": 1},
            "http": {"pathTokenDisabled": true, "clientCaFile": file}
        });
        let checked = start_with("check-config", &config, &tmp);
        if wanted.is_empty() {
            assert!(
                checked.status.success(),
                "{name}: {}",
                text(&checked.stderr)
            );
            continue;
        }
        let served = start_with("serve", &config, &tmp);
        let expected = format!(
            "podmutator: invalid configuration: http.clientCaFile: {}: {wanted}",
            file.display()
        );
        for (command, out) in [("check-config", &checked), ("serve", &served)] {
            assert_refused(name, command, out, &expected);
        }
        assert!(
            !certs.exists(),
            "{name}: a refused start must not write certificates"
        );
    }
}

#[test]
fn check_config_prints_one_json_document_of_effective_values_that_loads_back_the_same() {
    let config = json!({"http": {"pathTokenDisabled": true},
                        "webhook": {"secretManagerType": "AWS"}});
    let out = podmutator(
        &["check-config", "--config-json", &config.to_string()],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Warnings (the deprecated key, the missing token) go to stderr; stdout is the document.
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("webhook.secretManagerType is deprecated"),
        "{stderr}"
    );
    assert!(
        stderr.contains("http.pathTokenDisabled is true"),
        "{stderr}"
    );
    let printed: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert!(
        !text(&out.stdout).contains("null"),
        "unset options are left out"
    );
    let w = &printed["webhook"];
    assert_eq!(
        w["secretManagerTypes"],
        json!(["AWS"]),
        "the managers in use"
    );
    assert!(w.get("secretManagerType").is_none());
    assert_eq!(
        w["awsSecretManager"]["sidecarImage"],
        "docker.io/amazon/aws-secrets-manager-secret-sidecar:v0.1.4"
    );
    assert_eq!(
        w["awsSecretManager"]["resources"]["limits"]["memory"],
        "500Mi"
    );
    assert_eq!(
        w["gcpSecretManager"]["sidecarImage"],
        "gcr.io/google.com/cloudsdktool/cloud-sdk:alpine"
    );
    // The effective document is a configuration in its own right, with the same meaning.
    let again = podmutator(
        &["check-config", "--config-json", &printed.to_string()],
        None,
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&again.stdout).unwrap(),
        printed
    );
    assert!(
        !text(&again.stderr).contains("deprecated"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn a_whole_flytepropeller_configuration_is_read_for_its_webhook_and_secrets_sections() {
    let flyte = fixture("../flyte/propeller.yaml");
    let ours = json!({"http": {"pathToken": TOKEN}}).to_string();
    let out = podmutator(
        &[
            "check-config",
            "--flyte-config",
            flyte.to_str().unwrap(),
            "--config-json",
            &ours,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = &printed["webhook"];
    // Flyte's sections, as written there.
    assert_eq!(w["certDir"], "/etc/webhook/certs");
    assert_eq!(w["serviceName"], "flyte-pod-webhook");
    assert_eq!(w["secretManagerTypes"], json!(["K8s"]));
    assert_eq!(
        w["vaultSecretManager"]["annotations"],
        json!({}),
        "null is unset"
    );
    assert_eq!(printed["secrets"]["env-prefix"], "FLYTE_SECRET_");
    // Ours, from --config-json, merged over it.
    assert_eq!(printed["http"]["pathToken"], "<redacted>");
    // Flyte's other sections are skipped, not carried into the configuration.
    for skipped in [
        "propeller",
        "storage",
        "logger",
        "admin",
        "tasks",
        "plugins",
    ] {
        assert!(printed.get(skipped).is_none(), "{skipped}");
    }
}

#[test]
fn a_flyte_configuration_with_a_misspelt_or_podmutator_section_is_refused_naming_it() {
    let tmp = common::temp_dir("flyte-config");
    for (section, why) in [
        ("webhok", "did you mean `webhook`?"),
        ("http", "podmutator's own section: it belongs in --config"),
    ] {
        let file = tmp.join(format!("{section}.yaml"));
        std::fs::write(
            &file,
            format!("webhook: {{}}\nstorage: {{type: s3}}\n{section}: {{}}\n"),
        )
        .unwrap();
        let out = podmutator(
            &["check-config", "--flyte-config", file.to_str().unwrap()],
            None,
        );
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("{}: {section}:", file.display())),
            "{stderr}"
        );
        assert!(stderr.contains(why), "{stderr}");
    }
}

#[test]
fn a_flyte_configmap_directory_is_read_file_by_file_in_name_order() {
    // The mounted ConfigMap: several files, several of them with the same top-level section.
    let dir = common::temp_dir("flyte-configmap");
    std::fs::write(
        dir.join("core.yaml"),
        "manager: {pod-application: flytepropeller}\npropeller: {workers: 4}\nwebhook:\n  certDir: /etc/webhook/certs\n  serviceName: flyte-pod-webhook\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("resource_manager.yaml"),
        "propeller:\n  resourcemanager: {type: noop}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("secrets.yaml"),
        "secrets: {env-prefix: FLYTE_SECRET_}\nwebhook: {serviceName: flyte-pod-webhook-2}\n",
    )
    .unwrap();
    std::fs::write(dir.join("storage.yaml"), "storage: {type: s3}\n").unwrap();
    std::fs::write(dir.join("README"), "not configuration").unwrap();
    let ours = json!({"http": {"pathToken": TOKEN}}).to_string();
    let out = podmutator(
        &[
            "check-config",
            "--flyte-config",
            dir.to_str().unwrap(),
            "--config-json",
            &ours,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["webhook"]["certDir"], "/etc/webhook/certs");
    // secrets.yaml comes after core.yaml, so its webhook keys win.
    assert_eq!(printed["webhook"]["serviceName"], "flyte-pod-webhook-2");
    assert_eq!(printed["secrets"]["env-prefix"], "FLYTE_SECRET_");
}

/// What `kubectl get cm -o yaml` and `helm template` print, files ending in `---`, and empty
/// sections load as Flyte reads them; a source with no webhook or secrets section is named.
#[test]
fn flyte_configurations_as_kubectl_and_helm_print_them_load() {
    let dir = common::temp_dir("flyte-shapes");
    let configmap = |name: &str, file: &str, body: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {file: body}})
    };
    let webhook = "webhook:\n  SecretManagerTypes: [AWS]\n";
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        configmap("flyte-propeller-config", "core.yaml", webhook),
        configmap("other", "notes.txt", "not configuration"),
    ]});
    let helm = format!(
        "---\n{}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: flytepropeller}}\n---\n",
        serde_saphyr::to_string(&configmap("flyte-propeller-config", "core.yaml", webhook))
            .unwrap()
    );
    let cases = [
        ("list.yaml", serde_saphyr::to_string(&list).unwrap()),
        ("helm.yaml", helm),
        ("trailing.yaml", format!("{webhook}---\n")),
        (
            "commented.yaml",
            format!("{webhook}secrets:\n  # env-prefix: X\n"),
        ),
    ];
    let token = json!({"http": {"pathToken": TOKEN}}).to_string();
    let ours =
        json!({"http": {"pathToken": TOKEN}, "webhook": {"secretManagerTypes": ["AWS", "K8s"]}})
            .to_string();
    for (name, body) in cases {
        let file = dir.join(name);
        std::fs::write(&file, body).unwrap();
        let args = ["check-config", "--flyte-config", file.to_str().unwrap()];
        let out = podmutator(&[&args[..], &["--config-json", &token]].concat(), None);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            printed["webhook"]["secretManagerTypes"],
            json!(["AWS"]),
            "{name}"
        );
        // The overlay's key in its own case is the same key: it wins.
        let out = podmutator(&[&args[..], &["--config-json", &ours]].concat(), None);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            printed["webhook"]["secretManagerTypes"],
            json!(["AWS", "K8s"]),
            "{name}"
        );
    }

    let database = dir.join("002-database.yaml");
    std::fs::write(&database, "database: {postgres: {host: db}}\n").unwrap();
    let args = ["check-config", "--flyte-config", database.to_str().unwrap()];
    let out = podmutator(&[&args[..], &["--config-json", &token]].concat(), None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("no webhook or secrets section was found, so Flyte's defaults apply"),
        "{}",
        text(&out.stderr)
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let args = ["check-config", "--flyte-config", empty.to_str().unwrap()];
    let out = podmutator(&[&args[..], &["--config-json", &token]].concat(), None);
    assert_refused(
        "an empty directory",
        "check-config",
        &out,
        &format!(
            "podmutator: invalid configuration: --flyte-config {}: the directory holds no *.yaml",
            empty.display()
        ),
    );
}

#[test]
fn inject_prints_the_webhooks_warnings_on_stderr_as_kubectl_does() {
    // The mesh gate cannot be added where the pod already has a container of its name: the
    // webhook admits the pod with a warning, which `inject` must not drop.
    let case: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join(
            "tests/fixtures/mesh/cases/pod-route-gate-name-taken-is-admitted-with-a-warning.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let mesh: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/mesh/config.json")).unwrap(),
    )
    .unwrap();
    let config = json!({"mesh": mesh, "http": {"pathTokenDisabled": true}}).to_string();
    let out = podmutator(
        &[
            "inject",
            "-f",
            "-",
            "--route",
            "managed-pod",
            "--config-json",
            &config,
        ],
        Some(&case["pod"].to_string()),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("Warning: Pod/shop/odd-1: "))
        .unwrap_or_else(|| panic!("no warning line:\n{stderr}"));
    assert!(warning.contains("aether-identity-ready"), "{warning}");
    // The pod is still printed, mutated by the mutators that did apply.
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["metadata"]["name"], "odd-1");
}

#[test]
fn inject_takes_the_image_routes_and_names_their_registered_webhook_in_a_denial() {
    let case = |name: &str| -> Value {
        let path = root().join(format!("tests/fixtures/golden/images/cases/{name}.json"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let run = |case: &Value| {
        let mut config = case["config"].clone();
        config["http"] = json!({"pathTokenDisabled": true});
        podmutator(
            &[
                "inject",
                "-f",
                "-",
                "--route",
                case["route"].as_str().unwrap_or("images"),
                "--config-json",
                &config.to_string(),
            ],
            Some(&case["pod"].to_string()),
        )
    };
    let denied = run(&case("builder_other_org_denied"));
    assert_eq!(denied.status.code(), Some(1));
    let stderr = text(&denied.stderr);
    assert!(
        stderr.contains(
            "Pod/acme/steal: admission webhook \"image-builder-webhook.union.ai\" denied the request: "
        ),
        "{stderr}"
    );
    let rules = case("rules_all_container_kinds");
    let rewritten = run(&rules);
    assert!(rewritten.status.success(), "{}", text(&rewritten.stderr));
    let stdout = text(&rewritten.stdout);
    assert!(
        stdout.contains("123456789012.dkr.ecr.us-east-1.amazonaws.com/"),
        "{stdout}"
    );
}

/// A misspelt level, or an empty `RUST_LOG`, used to select no target at all: not one line,
/// and nothing said. Now the bad filter is named on stderr and `info` is used.
#[test]
fn a_misspelt_empty_or_span_rust_log_is_named_on_stderr_and_info_is_used() {
    for (spec, named) in [
        ("inof", "\"inof\" is not a level"),
        ("", "it is empty"),
        ("info,podmutator=loud", "\"podmutator=loud\""),
        ("podmutator[span]=debug", "span and field filters"),
    ] {
        // `lambda` logs (check-config prints its warnings on stderr instead): it starts, logs
        // the configuration's warning, and stops at the Runtime API nothing serves.
        let out = crate::common::bin()
            .arg("lambda")
            .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
            .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env(
                "PODMUTATOR_CONFIG",
                r#"{"http": {"pathTokenDisabled": true}}"#,
            )
            .env("RUST_LOG", spec)
            .stdin(Stdio::null())
            .output()
            .expect("the binary starts");
        let stderr = text(&out.stderr);
        let stdout = text(&out.stdout);
        let said: Vec<&str> = stderr.lines().collect();
        let rust_log: Vec<&&str> = said.iter().filter(|l| l.contains("RUST_LOG")).collect();
        assert_eq!(rust_log.len(), 1, "{spec:?}: one line: {stderr}");
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

/// `inject --embedded` in value delivery is a dry run: nothing is fetched (the AWS endpoint is a
/// closed port, so a fetch would fail the command), every value is the placeholder, and the
/// webhook's dry-run warning reaches stderr as kubectl prints it.
#[test]
fn inject_embedded_in_value_delivery_prints_placeholders_warns_and_fetches_nothing() {
    use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
    use podmutator_core::secrets::embedded::DRY_RUN_PLACEHOLDER;

    let secrets: Vec<Secret> = ["db", "token"]
        .iter()
        .map(|k| Secret {
            key: (*k).into(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        })
        .collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit"}]}
    });
    let config = json!({
        "webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {"organization": "flyte"},
        "http": {"pathTokenDisabled": true}
    })
    .to_string();
    let mut child = crate::common::bin()
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
        // The discard port: nothing answers there.
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
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
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("Warning: ") && l.contains("dry run: secret values were withheld"))
        .unwrap_or_else(|| panic!("no dry-run warning line on stderr:\n{stderr}"));
    assert!(warning.contains("task"), "names the pod: {warning}");
    let injected: Value = serde_json::from_str(&stdout).unwrap();
    let env = injected["spec"]["containers"][0]["env"].as_array().unwrap();
    for key in ["DB", "TOKEN"] {
        let var = env
            .iter()
            .find(|e| e["name"].as_str().is_some_and(|n| n.ends_with(key)))
            .unwrap_or_else(|| panic!("no env var for {key}: {stdout}"));
        assert_eq!(var["value"], DRY_RUN_PLACEHOLDER, "{var}");
    }
    // No other value: every injected variable that holds a secret holds the placeholder.
    let values: Vec<&str> = env.iter().filter_map(|e| e["value"].as_str()).collect();
    assert_eq!(
        values.iter().filter(|v| **v == DRY_RUN_PLACEHOLDER).count(),
        2,
        "{values:?}"
    );
}

/// `PODMUTATOR_FLYTE_CONFIG_FILE` alone, without `--flyte-config`, reads a whole flytepropeller
/// configuration, as `lambda` needs it (a function has no flags).
#[test]
fn the_flyte_config_file_variable_alone_loads_a_propeller_configuration() {
    let flyte = fixture("../flyte/propeller.yaml");
    let ours = json!({"http": {"pathToken": TOKEN}}).to_string();
    let check = |flyte_env: Option<&std::path::Path>| {
        let mut cmd = crate::common::bin();
        cmd.args(["check-config", "--config-json", &ours])
            .stdin(Stdio::null());
        if let Some(path) = flyte_env {
            cmd.env("PODMUTATOR_FLYTE_CONFIG_FILE", path);
        }
        let out = cmd.output().expect("the binary starts");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        (printed, text(&out.stderr))
    };
    let (with, said) = check(Some(&flyte));
    let (without, said_without) = check(None);
    // Most of Flyte's webhook section is podmutator's defaults; these are the file's own.
    assert_eq!(
        with["webhook"]["vaultSecretManager"]["kvVersion"], "2",
        "{with}"
    );
    assert!(without["webhook"]["vaultSecretManager"]["kvVersion"].is_null());
    let from_the_file = "webhook.secretManagerType is deprecated";
    assert!(said.contains(from_the_file), "{said}");
    assert!(!said_without.contains(from_the_file), "{said_without}");
    // Its other values, as written there.
    assert_eq!(with["webhook"]["certDir"], "/etc/webhook/certs");
    assert_eq!(with["webhook"]["secretManagerTypes"], json!(["K8s"]));
    assert_eq!(with["secrets"]["env-prefix"], "FLYTE_SECRET_");
    assert!(
        with.get("propeller").is_none(),
        "Flyte's other sections are skipped"
    );
}

/// The configurations Flyte 1.x (flyte-core), flyte-binary (Flyte 1 and 2) and Union's Flyte 2
/// dataplane chart render, each as the ConfigMap object `kubectl get cm -o yaml` prints
/// (tests/fixtures/flyte/, origins in each file's header), load as Flyte reads them: Union's
/// quoted ports, its `clusterName` and Union's documented `enabled` skipped with a warning, its
/// own top-level sections (`leaseworker`, `union`, `fasttask`, ...) skipped. The Flyte 2 ones
/// ask for a Kubernetes fetcher, refused naming the key, and load with the documented overlay.
#[test]
fn flyte_union_and_flyte_binary_configmaps_load_as_flyte_reads_them() {
    let dir = root().join("tests/fixtures/flyte");
    let check = |file: &str, ours: &Value| {
        let path = dir.join(file);
        podmutator(
            &[
                "check-config",
                "--flyte-config",
                path.to_str().unwrap(),
                "--config-json",
                &ours.to_string(),
            ],
            None,
        )
    };
    let plain = json!({"http": {"pathToken": TOKEN}});
    // What Flyte 2's defaults need to run outside the cluster (docs/configuration.md).
    let overlay = json!({"http": {"pathToken": TOKEN}, "embedded": {"organization": "my-org"},
        "webhook": {"embeddedSecretManagerConfig": {"type": "AWS", "imagePullSecrets": {"enabled": false}}}});
    for (file, ours, service, managers, skipped) in [
        (
            "flyte-core-propeller-configmap.yaml",
            &plain,
            "flyte-pod-webhook",
            json!(["AWS"]),
            "",
        ),
        (
            "flyte-binary-v1-configmap.yaml",
            &plain,
            "flyte-backend-flyte-binary-webhook",
            json!(["AWS"]),
            "",
        ),
        (
            "flyte-binary-v2-configmap.yaml",
            &overlay,
            "flyte-backend-flyte-binary-webhook",
            json!(["Embedded"]),
            "",
        ),
        (
            "union-dataplane-leaseworker-configmap.yaml",
            &overlay,
            "union-pod-webhook",
            json!(["Embedded", "K8s"]),
            "webhook.embeddedSecretManagerConfig.clusterName is skipped",
        ),
        (
            "union-docs-embedded-values.yaml",
            &overlay,
            "flyte-pod-webhook",
            json!(["Embedded", "K8s"]),
            "webhook.embeddedSecretManagerConfig.enabled is skipped",
        ),
    ] {
        let out = check(file, ours);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{file}: {stderr}");
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        let w = &printed["webhook"];
        assert_eq!(w["serviceName"], service, "{file}");
        assert_eq!(w["secretManagerTypes"], managers, "{file}");
        // Union's chart quotes them; they are numbers all the same.
        assert_eq!(w["listenPort"], 9443, "{file}");
        assert_eq!(w["servicePort"], 443, "{file}");
        assert!(stderr.contains(skipped), "{file}: {stderr}");
        for section in [
            "propeller",
            "storage",
            "leaseworker",
            "union",
            "fasttask",
            "sharedService",
        ] {
            assert!(printed.get(section).is_none(), "{file}: {section}");
        }
    }
    // Flyte 2's Kubernetes fetcher, as its charts default to it, is refused naming the key.
    for file in [
        "flyte-binary-v2-configmap.yaml",
        "union-dataplane-leaseworker-configmap.yaml",
    ] {
        let out = check(file, &plain);
        assert_eq!(out.status.code(), Some(1), "{file}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("webhook.embeddedSecretManagerConfig.type: podmutator's Embedded manager fetches from AWS Secrets Manager only"),
            "{file}: {stderr}"
        );
    }
    // The same ConfigMap as JSON (`kubectl get cm -o json`) reads the same.
    let yaml = std::fs::read_to_string(dir.join("flyte-core-propeller-configmap.yaml")).unwrap();
    let as_json: Value = serde_saphyr::from_str(&yaml).unwrap();
    let tmp = common::temp_dir("flyte-cm-json");
    let json_file = tmp.join("cm.json");
    std::fs::write(&json_file, as_json.to_string()).unwrap();
    let out = podmutator(
        &[
            "check-config",
            "--flyte-config",
            json_file.to_str().unwrap(),
            "--config-json",
            &plain.to_string(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["webhook"]["secretManagerTypes"], json!(["AWS"]));
}

/// Usage and configuration errors say what the user wrote and where: the nearest key, the type
/// in words, the option or variable the inline configuration came by.
#[test]
fn configuration_errors_name_the_nearest_key_the_type_in_words_and_the_source_as_given() {
    let out = podmutator(
        &[
            "check-config",
            "--config-json",
            r#"{"webhook": {"lsitenPort": 1}}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "podmutator: invalid configuration: webhook.lsitenPort: unknown key `lsitenPort`: did you mean `listenPort`?"
    );
    let out = podmutator(
        &[
            "check-config",
            "--config-json",
            r#"{"webhook": {"listenPort": 70000}}"#,
        ],
        None,
    );
    assert!(
        text(&out.stderr).contains("expected a port number from 1 to 65535"),
        "{}",
        text(&out.stderr)
    );
    let out = podmutator(&["check-config", "--config-json", "{nope"], None);
    assert!(
        text(&out.stderr).contains("invalid configuration: --config-json: not valid JSON"),
        "{}",
        text(&out.stderr)
    );
    let out = crate::common::bin()
        .arg("check-config")
        .env("PODMUTATOR_CONFIG", "{nope")
        .output()
        .unwrap();
    assert!(
        text(&out.stderr).contains("invalid configuration: PODMUTATOR_CONFIG: not valid JSON"),
        "{}",
        text(&out.stderr)
    );
    let tmp = common::temp_dir("config-yaml-error");
    let file = tmp.join("c.yaml");
    std::fs::write(
        &file,
        "webhook:\n  listenPort: 9443\nhttp:\n  pathToken: abc: def\n",
    )
    .unwrap();
    let out = podmutator(&["check-config", "--config", file.to_str().unwrap()], None);
    let stderr = text(&out.stderr);
    assert!(stderr.contains(" 4 |   pathToken: <redacted>"), "{stderr}");
    assert!(!stderr.contains("abc"), "{stderr}");
}

/// An AWS that answers every call with `status` and `body` (as JSON 1.1 errors come), on a
/// loopback port, for as long as the returned listener's thread runs.
fn aws_answering(status: u16, error_type: &str, body: &str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = format!(
        "HTTP/1.1 {status} Bad Request\r\ncontent-type: application/x-amz-json-1.1\r\nx-amzn-errortype: {error_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            // The request's head and body: read until the client has sent what it sends.
            let mut buf = [0u8; 65536];
            let mut got = Vec::new();
            while let Ok(n) = conn.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    port
}

/// `inject --embedded` is run by an operator at their own terminal: a failed call shows AWS's
/// own text (the role and the action it was refused), and missing credentials are named as
/// such, not as a connection failure, with what to set.
#[test]
fn inject_names_missing_credentials_and_shows_awss_own_error() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "task", "labels": {"inject-flyte-secrets": "true", "organization": "flyte",
            "project": "flytesnacks", "domain": "development"},
            "annotations": podmutator_core::secrets::codec::encode_annotations(&[podmutator_core::secrets::codec::Secret {
                group: "db".into(), key: "password".into(),
                mount_requirement: podmutator_core::secrets::codec::MountRequirement::File, ..Default::default()
            }]).unwrap()},
        "spec": {"containers": [{"name": "main", "image": "flytekit", "command": ["python", "task.py"]}]}
    });
    let config = json!({
        "webhook": {"secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}},
        "embedded": {"organization": "flyte", "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"}
    })
    .to_string();
    let tmp = common::temp_dir("inject-aws-errors");
    let file = tmp.join("pod.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let run = |env: &[(&str, String)]| {
        let mut cmd = crate::common::bin();
        cmd.args([
            "inject",
            "--embedded",
            "-n",
            "flytesnacks-development",
            "-f",
        ])
        .arg(&file)
        .args(["--config-json", &config])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &tmp)
        .env("AWS_EC2_METADATA_DISABLED", "true");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
        text(&out.stderr)
    };
    let stderr = run(&[]);
    assert!(
        stderr.contains("DescribeSecret failed with no AWS credentials (no request was sent)"),
        "{stderr}"
    );
    assert!(stderr.contains("set AWS_PROFILE"), "{stderr}");
    assert!(
        !stderr.contains("connection failure") && !stderr.contains("function's log"),
        "{stderr}"
    );

    let refusal = "User: arn:aws:sts::123456789012:assumed-role/platform-dev/me is not authorized to perform: secretsmanager:DescribeSecret on resource: u__org__flyte__domain__development__project__flytesnacks__key__password because no identity-based policy allows the secretsmanager:DescribeSecret action";
    let port = aws_answering(
        400,
        "AccessDeniedException",
        &json!({"__type": "AccessDeniedException", "message": refusal}).to_string(),
    );
    let creds = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
    ];
    let stderr = run(&creds);
    assert!(
        stderr.contains("DescribeSecret failed with AccessDeniedException"),
        "{stderr}"
    );
    assert!(stderr.contains(refusal), "AWS's text: {stderr}");

    let port = aws_answering(
        400,
        "ExpiredTokenException",
        r#"{"__type": "ExpiredTokenException", "message": "The security token included in the request is expired"}"#,
    );
    let mut creds = creds;
    creds[0].1 = format!("http://127.0.0.1:{port}");
    let stderr = run(&creds);
    assert!(
        stderr.contains("your AWS credentials have expired"),
        "{stderr}"
    );
}

/// `check-config --changed` prints only what differs from the defaults, on one line, which
/// loads back as the same configuration; stderr says what was read, skipped and unused; and a
/// configuration too long for Lambda's 4 KB environment is warned about in both modes.
#[test]
fn check_config_changed_prints_what_differs_from_the_defaults_and_what_was_skipped() {
    let flyte = root().join("tests/fixtures/flyte/flyte-core-propeller-configmap.yaml");
    let ours = json!({"http": {"pathTokenSha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"},
        "webhook": {"listenPort": 9443, "secretEnvVarPrefix": "_FSEC_", "servicePort": 8443}})
    .to_string();
    let args = [
        "check-config",
        "--flyte-config",
        flyte.to_str().unwrap(),
        "--config-json",
        &ours,
    ];
    let full = podmutator(&args, None);
    assert!(full.status.success(), "{}", text(&full.stderr));
    let mut changed_args = args.to_vec();
    changed_args.push("--changed");
    let changed = podmutator(&changed_args, None);
    assert!(changed.status.success(), "{}", text(&changed.stderr));
    let line = text(&changed.stdout);
    assert_eq!(line.lines().count(), 1, "{line}");
    let minimal: Value = serde_json::from_str(&line).unwrap();
    // Only what differs: the file's and ours, not the defaults they restate.
    assert_eq!(
        minimal["webhook"]["secretManagerTypes"],
        json!(["AWS"]),
        "{minimal}"
    );
    assert_eq!(minimal["webhook"]["secretEnvVarPrefix"], "_FSEC_");
    assert!(
        minimal["webhook"].get("listenPort").is_none(),
        "the default, restated: {minimal}"
    );
    assert!(minimal["webhook"].get("certDir").is_none(), "{minimal}");
    assert!(line.len() < text(&full.stdout).len() / 4, "{line}");
    // It loads back as the same effective configuration.
    let back = podmutator(&["check-config", "--config-json", line.trim()], None);
    assert!(back.status.success(), "{}", text(&back.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&back.stdout).unwrap(),
        serde_json::from_slice::<Value>(&full.stdout).unwrap()
    );
    let stderr = text(&changed.stderr);
    assert!(stderr.contains("podmutator: read "), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "podmutator: skipped, {}: data.core.yaml: manager, propeller",
            flyte.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("data.storage.yaml: storage"), "{stderr}");
    assert!(
        stderr.contains(
            "podmutator: unused (accepted so Flyte's configurations load): webhook.servicePort"
        ),
        "{stderr}"
    );
    assert!(
        !text(&full.stderr).contains("podmutator: read "),
        "the summary is --changed's"
    );

    let annotations: serde_json::Map<String, Value> = (0..80)
        .map(|i| {
            (
                format!("vault.hashicorp.com/agent-extra-{i}"),
                json!("x".repeat(30)),
            )
        })
        .collect();
    let big = json!({"http": {"pathTokenDisabled": true}, "webhook": {"vaultSecretManager": {"annotations": annotations}}}).to_string();
    for extra in [None, Some("--changed")] {
        let mut a = vec!["check-config", "--config-json", &big];
        a.extend(extra);
        let out = podmutator(&a, None);
        assert!(out.status.success());
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("bytes of Lambda's 4096-byte environment as PODMUTATOR_CONFIG")
                && stderr.contains("PODMUTATOR_CONFIG_FILE"),
            "{extra:?}: {stderr}"
        );
    }
}

/// Every example the help prints (`Example:` / `Examples:` in any command's help) and every
/// command of docs/cli.md, docs/images.md and docs/migration.md ([`doc_commands`]) runs as
/// written, in a scratch directory holding the files they name, with `podmutator` on PATH and a
/// `kubectl` that accepts what it is piped or given and prints a Deployment, or a Flyte
/// ConfigMap, for `get`.
#[test]
fn every_help_and_cli_md_example_runs_as_written() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::temp_dir("help-examples");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podmutator"), bin.join("podmutator")).unwrap();
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  template:\n    metadata:\n      labels: {inject-flyte-secrets: \"true\"}\n      annotations: {flyte.secrets/s0: m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk}\n    spec:\n      containers: [{name: web, image: nginx}]\n";
    std::fs::write(dir.join("deployment.yaml"), deployment).unwrap();
    for token in ["path-token", "token"] {
        std::fs::write(
            dir.join(token),
            "abcdefghijklmnopqrstuvwxyz0123456789ABCD\n",
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("task.yaml"),
        deployment
            .replace("kind: Deployment", "kind: Job")
            .replace("apps/v1", "batch/v1"),
    )
    .unwrap();
    std::fs::write(
        dir.join("podmutator.yaml"),
        "http:\n  pathTokenDisabled: true\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::copy(
        root().join("config/local.yaml"),
        dir.join("config/local.yaml"),
    )
    .unwrap();
    // `kubectl get ... -o yaml` prints the Deployment; `kubectl apply -f F` checks F (or stdin)
    // is a non-empty YAML document it was given.
    let kubectl = bin.join("kubectl");
    std::fs::write(
        &kubectl,
        format!(
            "#!/bin/sh\ncase \"$*\" in\n  *get*configmap*) cat '{}' ;;\n  *get*) cat '{}' ;;\n  apply*) f=\"$3\"; if [ \"$f\" = - ]; then c=$(cat); else c=$(cat \"$f\"); fi; printf '%s' \"$c\" | grep -q '^kind: ' || exit 3; echo applied ;;\n  *) exit 4 ;;\nesac\n",
            root()
                .join("tests/fixtures/flyte/flyte-core-propeller-configmap.yaml")
                .display(),
            dir.join("deployment.yaml").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();

    use clap::CommandFactory;
    let cli = podmutator::cli::Cli::command();
    let mut helps = vec![text(&podmutator(&["--help"], None).stdout)];
    for sub in cli.get_subcommands() {
        helps.push(text(&podmutator(&[sub.get_name(), "--help"], None).stdout));
    }
    let mut examples = Vec::new();
    for help in &helps {
        let mut in_examples = false;
        for line in help.lines() {
            if line.starts_with("Example") {
                in_examples = true;
                continue;
            }
            if in_examples && line.starts_with("  ") && line.contains("podmutator ") {
                examples.push(line.trim().to_owned());
            } else if !line.starts_with("  ") {
                in_examples = false;
            }
        }
    }
    assert!(examples.len() >= 4, "{examples:?}");
    let from_cli_md = doc_commands("docs/cli.md");
    assert!(from_cli_md.len() >= 10, "{from_cli_md:?}");
    examples.extend(from_cli_md);
    examples.extend(doc_commands("docs/images.md"));
    assert!(
        examples
            .iter()
            .any(|e| e.contains("--image-builder-selector")),
        "images.md's registering command is run"
    );
    for example in &examples {
        run_example(example, &dir, &bin);
    }

    // docs/migration.md, in a directory of its own: its podmutator.yaml as the doc writes it,
    // the path token it reads (`path-token`; `token`, as deploy.md's Path B names it), and a
    // task pod whose annotation is one secret-annotations prints.
    let migration = common::temp_dir("migration-examples");
    let doc = std::fs::read_to_string(root().join("docs/migration.md")).unwrap();
    let config = doc
        .split("```yaml\n")
        .find(|b| b.starts_with("# podmutator.yaml"))
        .and_then(|b| b.split("```").next())
        .expect("migration.md writes podmutator.yaml in a yaml block");
    std::fs::write(migration.join("podmutator.yaml"), config).unwrap();
    for token in ["path-token", "token"] {
        std::fs::copy(dir.join(token), migration.join(token)).unwrap();
    }
    std::fs::write(
        migration.join("task-pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: task\n  labels: {inject-flyte-secrets: \"true\"}\n  annotations: {flyte.secrets/s0: m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk}\nspec:\n  containers: [{name: task, image: python}]\n",
    )
    .unwrap();
    let commands = doc_commands("docs/migration.md");
    assert!(
        commands.len() >= 5
            && commands
                .iter()
                .any(|c| c.contains("check-config --changed"))
            && commands.iter().any(|c| c.contains("inject ")),
        "{commands:?}"
    );
    for command in &commands {
        run_example(command, &migration, &bin);
    }
    let shipped = std::fs::read_to_string(migration.join("podmutator.json")).unwrap();
    assert!(
        shipped.contains("_FSEC_") && shipped.contains("pathTokenSha256"),
        "check-config --changed wrote what differs: {shipped}"
    );
}

/// The commands of `doc`'s `sh` blocks ([`doc_sh_commands`]) but the two that need a server or
/// a cluster, `serve` and `certs`: `certs::cli_md_certs_and_serve_run_as_written` runs those.
fn doc_commands(doc: &str) -> Vec<String> {
    doc_sh_commands(doc)
        .into_iter()
        .filter(|c| !c.starts_with("podmutator serve") && !c.starts_with("podmutator certs"))
        .collect()
}

/// The commands of `doc`'s `sh` blocks, continuation lines joined, comments left out.
pub(crate) fn doc_sh_commands(doc: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let (mut in_sh, mut current, mut commands) = (false, String::new(), Vec::new());
    for line in text.lines() {
        if line.trim() == "```sh" {
            in_sh = true;
            continue;
        }
        if line.trim() == "```" {
            in_sh = false;
            continue;
        }
        let line = line.trim();
        if !in_sh || (current.is_empty() && (line.is_empty() || line.starts_with('#'))) {
            continue;
        }
        current.push_str(line.trim_end_matches('\\'));
        if line.ends_with('\\') || line.ends_with('|') {
            current.push(' ');
            continue;
        }
        commands.push(std::mem::take(&mut current));
    }
    commands
}

/// Runs `example` with bash (`-euo pipefail`) in `dir`, `bin` (podmutator and the stand-in
/// kubectl) first on PATH, `url` set as deploy.md's Path B sets it, no configuration from this
/// process; it must succeed.
fn run_example(example: &str, dir: &Path, bin: &Path) {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", example])
        .current_dir(dir)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        // The endpoint deploy.md's Path B sets before the commands that register it.
        .env("url", "https://podmutator.example.internal")
        .env_remove("PODMUTATOR_CONFIG")
        .env_remove("PODMUTATOR_CONFIG_FILE")
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{example}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Every dotted key path of a JSON Schema's `properties`, `$ref`s into `$defs` followed and
/// `anyOf` branches (an optional value) merged; a Kubernetes object or a map stops the walk
/// and goes into `opaque`.
fn schema_paths(
    schema: &Value,
    node: &Value,
    prefix: &str,
    out: &mut std::collections::BTreeSet<String>,
    opaque: &mut std::collections::BTreeSet<String>,
) {
    let node = match node.get("$ref").and_then(Value::as_str) {
        Some(r) if r.ends_with("/KubernetesObject") => {
            opaque.insert(prefix.to_owned());
            return;
        }
        Some(r) => schema["$defs"][r.trim_start_matches("#/$defs/")].clone(),
        None => node.clone(),
    };
    if node
        .get("additionalProperties")
        .is_some_and(Value::is_object)
    {
        opaque.insert(prefix.to_owned());
    }
    for branch in node
        .get("anyOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        schema_paths(schema, branch, prefix, out, opaque);
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, child) in props {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.insert(path.clone());
            schema_paths(schema, child, &path, out, opaque);
        }
    }
}

/// `podmutator config-schema` is derived from the types the configuration is read into: it has
/// every key the defaults have (and no key they lack but under an unset optional object), it
/// refuses what start-up refuses for its shape (an unknown key, a wrong type), and the
/// configurations shipped here validate against it (Python's `jsonschema`, the validator
/// kubernetes-validate pins).
#[test]
fn the_config_schema_has_every_key_and_validates_the_shipped_configurations() {
    let out = podmutator(&["config-schema"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    let mut in_schema = std::collections::BTreeSet::new();
    let mut opaque = std::collections::BTreeSet::new();
    schema_paths(&schema, &schema, "", &mut in_schema, &mut opaque);
    let defaults = serde_json::to_value(Config::default()).unwrap();
    let mut in_defaults = std::collections::BTreeSet::new();
    fn walk(v: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        if let Value::Object(m) = v {
            for (k, child) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(path.clone());
                walk(child, &path, out);
            }
        }
    }
    walk(&defaults, "", &mut in_defaults);
    // A Kubernetes object's keys and a map's are not the configuration's.
    in_defaults.retain(|p| !opaque.iter().any(|o| p.starts_with(&format!("{o}."))));
    let missing: Vec<_> = in_defaults.difference(&in_schema).collect();
    assert!(missing.is_empty(), "keys the schema lacks: {missing:?}");
    // A key the defaults lack is under one whose default is unset (`null`), or an entry of a
    // map keyed by a closed set whose default is empty (`mutators.<id>`).
    for path in in_schema.difference(&in_defaults) {
        let parent_unset = (1..path.matches('.').count() + 1).any(|n| {
            let parent: Vec<&str> = path.split('.').take(n).collect();
            parent
                .iter()
                .try_fold(&defaults, |v, k| v.get(*k))
                .is_some_and(|v| v.is_null() || v.as_object().is_some_and(|m| m.is_empty()))
        });
        assert!(parent_unset, "{path} is in the schema, not in the defaults");
    }

    let dir = common::temp_dir("config-schema");
    std::fs::write(dir.join("schema.json"), &out.stdout).unwrap();
    let mut instances = Vec::new();
    for file in ["config/local.yaml", "deploy/kubernetes/base/config.yaml"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let v: Value = serde_saphyr::from_str(&text).unwrap();
        instances.push((file.to_owned(), v, true));
    }
    let flyte = root().join("tests/fixtures/flyte/flyte-core-propeller-configmap.yaml");
    let effective = podmutator(
        &[
            "check-config",
            "--flyte-config",
            flyte.to_str().unwrap(),
            "--config-json",
            &json!({"http": {"pathToken": TOKEN}}).to_string(),
        ],
        None,
    );
    instances.push((
        "check-config's output".into(),
        serde_json::from_slice(&effective.stdout).unwrap(),
        true,
    ));
    instances.push((
        "an unknown key".into(),
        json!({"webhook": {"lsitenPort": 1}}),
        false,
    ));
    instances.push((
        "a wrong type".into(),
        json!({"webhook": {"listenPort": "x"}}),
        false,
    ));
    instances.push((
        "an unknown manager".into(),
        json!({"webhook": {"secretManagerTypes": ["S3"]}}),
        false,
    ));
    for (i, (_, v, _)) in instances.iter().enumerate() {
        std::fs::write(dir.join(format!("{i}.json")), v.to_string()).unwrap();
    }
    let check = Command::new(common::tool("python"))
        .arg("-c")
        .arg(
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             v = jsonschema.Draft202012Validator(schema)\n\
             for f in sys.argv[2:]:\n    print('valid' if v.is_valid(json.load(open(f))) else 'invalid')\n",
        )
        .arg(dir.join("schema.json"))
        .args((0..instances.len()).map(|i| dir.join(format!("{i}.json"))))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    let verdicts: Vec<String> = text(&check.stdout).lines().map(str::to_owned).collect();
    for ((what, _, valid), verdict) in instances.iter().zip(&verdicts) {
        let want = if *valid { "valid" } else { "invalid" };
        assert_eq!(verdict, want, "{what}");
    }
    assert_eq!(verdicts.len(), instances.len());
}
