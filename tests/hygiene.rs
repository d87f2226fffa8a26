//! Secret hygiene: every manager that handles a value (Global from this process, Embedded from
//! Secrets Manager) runs inside the real binary with sentinel values, through successes and
//! every kind of refusal, at TRACE level; no sentinel may reach the logs, the metric lines or an
//! error message.

mod common;

use common::aws::{CountingProxy, Moto, client, create_secret};
use common::*;
use podmutator::secrets::codec::{MountRequirement, Secret, encode_annotations, encode_base32};
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
const GLOBAL: &str = "SENTINEL-global-4f1d";
const PROJECT: &str = "SENTINEL-project-9a2c";
const ORG: &str = "SENTINEL-org-77be";
const BIG: &str = "SENTINEL-big-";

fn secret(group: &str, key: &str, mount: MountRequirement, env_var: &str) -> Secret {
    Secret {
        group: group.into(),
        key: key.into(),
        mount_requirement: mount,
        env_var: env_var.into(),
        ..Default::default()
    }
}

fn pod(secrets: &[Secret]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit"}]}
    })
}

#[tokio::test]
async fn no_secret_value_reaches_logs_metrics_or_error_messages() {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    create_secret(
        &setup,
        "u__org__flyte__domain__development__project__flytesnacks__key__db",
        PROJECT,
    )
    .await;
    create_secret(&setup, "u__org__flyte__domain____project____key__api", ORG).await;
    let big = format!("{BIG}{}", "x".repeat(70_000));
    create_secret(
        &setup,
        "u__org__flyte__domain____project____key__huge",
        &big,
    )
    .await;
    let proxy = CountingProxy::start(moto.port).await;

    let dir = temp_dir("hygiene");
    let port = free_port();
    let cfg = json!({
        "webhook": {
            "certDir": dir, "listenPort": port,
            "secretManagerTypes": ["Embedded", "Vault", "AWS"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true}
    });
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_podmutator"))
        .arg("serve")
        .env("PODMUTATOR_CONFIG", cfg.to_string())
        .env("FLYTE_SECRET_TEAM_TOKEN", GLOBAL)
        .env("AWS_ENDPOINT_URL", proxy.url())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "trace")
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = capture(&mut child);
    wait_for(&out, "serving https", 1).await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();

    // (pod, must be allowed, sentinels the *patch* may carry)
    let cases = [
        // Every manager that sees a value injects: Global, Embedded env + file; and Vault.
        (
            pod(&[
                secret("team", "token", MountRequirement::EnvVar, ""),
                secret("", "db", MountRequirement::EnvVar, ""),
                secret("", "api", MountRequirement::File, "API_FILE"),
                secret("kv/team", "password", MountRequirement::File, ""),
            ]),
            true,
        ),
        // Refused: the value is over embedded.maxValueBytes.
        (
            pod(&[secret("", "huge", MountRequirement::EnvVar, "")]),
            false,
        ),
        // Refused: two secrets want one variable with different values.
        (
            pod(&[
                secret("team", "token", MountRequirement::EnvVar, ""),
                secret("", "db", MountRequirement::EnvVar, "_UNION_TEAM_TOKEN"),
            ]),
            false,
        ),
        // Refused: Global holds the value, but for a mount requirement no manager knows.
        (
            {
                let mut p = pod(&[]);
                p["metadata"]["annotations"]["flyte.secrets/s0"] = json!(encode_base32(
                    b"group: \"team\"\nkey: \"token\"\nmount_requirement: 9\n"
                ));
                p
            },
            false,
        ),
    ];
    let mut messages = String::new();
    for (p, allowed) in &cases {
        let body = serde_json::to_vec(&create_review(p, NS)).unwrap();
        let (status, reply) = https_request(
            port,
            &ca,
            "localhost",
            "POST",
            "/mutate--v1-pod",
            Some("application/json"),
            &body,
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
        let resp = response(&reply);
        assert_eq!(resp["allowed"], *allowed, "{resp}");
        if *allowed {
            let patched = apply(p, &patch_of(&resp)).to_string();
            for s in [GLOBAL, PROJECT] {
                assert!(patched.contains(s), "{s} injected");
            }
        } else {
            messages.push_str(resp["status"]["message"].as_str().unwrap());
            messages.push('\n');
        }
        messages.push_str(&resp["warnings"].to_string());
    }
    wait_for(&out, "\"message\":\"admission\"", cases.len()).await;
    wait_for(&out, "\"_aws\"", cases.len()).await;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();

    let logs = out.lock().unwrap().clone();
    assert!(
        logs.contains("TRACE") || logs.contains("\"level\":\"TRACE\""),
        "trace was on"
    );
    assert!(messages.contains("embedded.maxValueBytes"), "{messages}");
    assert!(
        messages.contains("both set environment variable _UNION_TEAM_TOKEN"),
        "{messages}"
    );
    for sentinel in [GLOBAL, PROJECT, ORG, BIG, "U0VOVElORUw"] {
        // The last is the start of base64("SENTINEL"): file values travel encoded.
        assert!(
            !logs.contains(sentinel),
            "{sentinel} reached the logs or metrics"
        );
        assert!(
            !messages.contains(sentinel),
            "{sentinel} reached an error message"
        );
    }
}
