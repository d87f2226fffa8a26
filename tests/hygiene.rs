//! Secret hygiene: every manager that handles a value (Global from this process, Embedded from
//! Secrets Manager) runs inside the real binary with sentinel values, through successes and
//! every kind of refusal, at TRACE level; no sentinel may reach the logs, the metric lines or an
//! error message, in clear or base64-encoded at any alignment, nor inside any base64 there
//! (a patch, and the file values inside it), which `common::leaks` decodes before searching.

use crate::common;

use common::aws::{CountingProxy, Moto, client, create_secret};
use common::*;
use podmutator_core::secrets::codec::{
    MountRequirement, Secret, encode_annotations, encode_base32,
};
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
const GLOBAL: &str = "SENTINEL-global-4f1d";
const PROJECT: &str = "SENTINEL-project-9a2c";
const ORG: &str = "SENTINEL-org-77be";
const BIG: &str = "SENTINEL-big-";
/// Every sentinel, by label (failures name the label, never the value).
const SENTINELS: [(&str, &str); 4] = [
    ("GLOBAL", GLOBAL),
    ("PROJECT", PROJECT),
    ("ORG", ORG),
    ("BIG", BIG),
];

/// The probe itself: a sentinel is found at each byte alignment of base64, inside a base64
/// JSON Patch, and inside a base64 value inside that patch (a FILE secret's `SECRETS` line);
/// text without it gives nothing.
#[test]
fn the_leak_probe_finds_a_value_in_every_encoding() {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    for pad in ["", "x", "xy", "xyz"] {
        let text = b64(format!("{pad}{PROJECT}!").as_bytes());
        let hits = leaks::find(text.as_bytes(), &SENTINELS);
        assert!(
            hits.iter().any(|h| h.starts_with("PROJECT as base64")),
            "after {} bytes: {hits:?}",
            pad.len()
        );
    }
    let file_line = format!("api={}", b64(ORG.as_bytes()));
    let patch = json!([{"op": "add", "path": "/spec/initContainers", "value": [
        {"name": "init", "env": [{"name": "SECRETS", "value": format!("db=eA==\n{file_line}\n")}]}
    ]}]);
    let reply = json!({"response": {"patch": b64(patch.to_string().as_bytes())}}).to_string();
    let hits = leaks::find(reply.as_bytes(), &SENTINELS);
    assert!(
        hits.iter()
            .any(|h| h.starts_with("ORG in clear in base64 at byte")
                && h.matches("in base64").count() == 2),
        "{hits:?}"
    );
    assert_eq!(
        leaks::find(b"SENTINEL U0VOVElORUw plain text", &SENTINELS),
        Vec::<String>::new()
    );
}

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
    // Value delivery under `serve`: the API server authenticates with a client certificate.
    let api_server = ClientCert::new();
    let client_ca_file = dir.join("client-ca.crt");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&client_ca_file, &api_server.ca).unwrap();
    let cfg = json!({
        "webhook": {
            "certDir": dir, "listenPort": port,
            "secretManagerTypes": ["Embedded", "Vault", "AWS"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        // Moto is slow on a loaded machine; the deadline is not what this test is about.
        "embedded": {"organization": "flyte", "deadlineMs": 25000},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 0,
            "clientCaFile": client_ca_file}
    });
    let (mut child, out) =
        spawn_serve(serve_with_aws(&cfg, &proxy.url()).env("FLYTE_SECRET_TEAM_TOKEN", GLOBAL))
            .await;
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
    let mut allowed_replies = Vec::new();
    for (p, allowed) in &cases {
        let body = serde_json::to_vec(&create_review(p, NS)).unwrap();
        let (status, reply) = https_request_as(
            Some(&api_server),
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
            for (label, s) in &SENTINELS[..2] {
                assert!(patched.contains(s), "{label} injected");
            }
            allowed_replies.push(reply);
        } else {
            // A refusal carries no patch: the whole reply must be clean.
            let hits = leaks::find(&reply, &SENTINELS);
            assert!(hits.is_empty(), "a refusal carries a value: {hits:?}");
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
    // `RUST_LOG=trace` is the most verbose filter there is; the crates that would log whole
    // requests are capped below it (`cli::LOG_CAPS`: the AWS SDK at DEBUG), so the SDK's DEBUG
    // lines are the most verbose ones left, and they must have been written.
    assert!(
        logs.contains("\"level\":\"DEBUG\""),
        "verbose logging was on"
    );
    assert!(messages.contains("embedded.maxValueBytes"), "{messages}");
    assert!(
        messages.contains("both set environment variable _UNION_TEAM_TOKEN"),
        "{messages}"
    );
    // Positive control on real output: the admitted reply's base64 patch carries GLOBAL and
    // PROJECT as env values and ORG as a FILE value, base64 inside it; the probe finds all three
    // (so it would find them in the logs), and nothing else.
    let hits = leaks::find(&allowed_replies.concat(), &SENTINELS);
    for label in ["GLOBAL", "PROJECT"] {
        assert!(
            hits.iter()
                .any(|h| h.starts_with(&format!("{label} in clear in base64 at byte"))),
            "{label} not found in the patch: {hits:?}"
        );
    }
    assert!(
        hits.iter()
            .any(|h| h.starts_with("ORG in clear") && h.matches("in base64").count() == 2),
        "the FILE value was not found base64 inside the patch: {hits:?}"
    );
    assert!(!hits.iter().any(|h| h.starts_with("BIG")), "{hits:?}");

    let hits = leaks::find(logs.as_bytes(), &SENTINELS);
    assert!(hits.is_empty(), "reached the logs or metrics: {hits:?}");
    let hits = leaks::find(messages.as_bytes(), &SENTINELS);
    assert!(hits.is_empty(), "reached an error message: {hits:?}");
}
