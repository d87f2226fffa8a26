//! Hole 2 of issue 36: value delivery through the in-cluster `serve` was an oracle. Any pod can
//! reach the webhook's port, and the path token is no secret from whoever creates pods (the API
//! server quotes it in its errors), so a pod's forged review for another project's namespace was
//! answered with that project's secret values. `serve` now refuses value delivery at start,
//! unless every caller must present a client certificate signed by `http.clientCaFile`.

use serde_json::{Value, json};

use super::TOKEN;
use crate::common::*;

/// Embedded, AWS, with `delivery` and `env_var_delivery` as given.
fn embedded(delivery: &str, env_var_delivery: &str) -> Value {
    json!({
        "webhook": {"secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}},
        "embedded": {"organization": "flyte", "delivery": delivery, "envVarDelivery": env_var_delivery,
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"},
        "http": {"pathToken": TOKEN, "listenAddress": "127.0.0.1"}
    })
}

fn serve_command(config: &Value, dir: &std::path::Path, port: u16) -> std::process::Command {
    let mut config = config.clone();
    config["webhook"]["certDir"] = json!(dir);
    config["webhook"]["listenPort"] = json!(port);
    config["webhook"]["serviceName"] = json!("podmutator");
    let mut cmd = crate::common::bin();
    cmd.arg("serve")
        .env("PODMUTATOR_CONFIG", config.to_string())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        // Nothing here may reach AWS: a closed port.
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
    cmd
}

/// `GET /<token>/healthz` over TLS trusting `server_ca`, presenting `client` if given: the
/// status, or the error (TLS 1.3 sends the server's verdict on a client certificate after the
/// handshake, so it shows on the first read).
async fn healthz(port: u16, server_ca: &[u8], client: Option<&ClientCert>) -> Result<u16, String> {
    https_request_as(
        client,
        port,
        server_ca,
        "localhost",
        "GET",
        &format!("/{TOKEN}/healthz"),
        None,
        b"",
    )
    .await
    .map(|(status, _)| status)
    .map_err(|e| e.to_string())
}

#[tokio::test]
async fn serve_refuses_to_write_values_for_callers_it_cannot_authenticate() {
    // Value delivery, and reference delivery that serves env vars by value: refused at start,
    // naming the ways out, before any certificate is touched.
    for (delivery, env_var) in [("value", "exec"), ("reference", "value")] {
        let dir = temp_dir("attack-serve-values");
        let out = serve_command(&embedded(delivery, env_var), &dir, free_port())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{delivery}/{env_var}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("will not write Embedded secret values into its replies")
                && stderr.contains("embedded.delivery: reference")
                && stderr.contains("http.clientCaFile")
                && stderr.contains("EKS cannot"),
            "{delivery}/{env_var}: {stderr}"
        );
        assert!(
            !dir.join("tls.key").exists(),
            "{delivery}/{env_var}: a key was made"
        );
        // `check-config` runs the same gate; it cannot know which command will run, so it
        // accepts the configuration (`lambda` serves it) and warns of serve's refusal.
        let out = crate::common::bin()
            .arg("check-config")
            .env("PODMUTATOR_CONFIG", embedded(delivery, env_var).to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success()
                && stderr.contains("warning: `lambda` serves this configuration")
                && stderr.contains("will not write Embedded secret values into its replies"),
            "{delivery}/{env_var}: {stderr}"
        );
    }

    // Reference delivery serves names only: it starts (the control).
    let dir = temp_dir("attack-serve-values");
    let (child, _) = spawn_serve(&mut serve_command(
        &embedded("reference", "exec"),
        &dir,
        free_port(),
    ))
    .await;
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();

    // Values with a client CA: only a caller presenting a certificate it signed gets an answer.
    let dir = temp_dir("attack-serve-values-mtls");
    let api_server = ClientCert::new();
    let other = ClientCert::new();
    std::fs::write(dir.join("client-ca.crt"), &api_server.ca).unwrap();
    let mut config = embedded("value", "exec");
    config["http"]["clientCaFile"] = json!(dir.join("client-ca.crt"));
    let port = free_port();
    let certs = dir.join("certs");
    let (mut child, _) = spawn_serve(&mut serve_command(&config, &certs, port)).await;
    let server_ca = std::fs::read(certs.join("ca.crt")).unwrap();
    let no_cert = healthz(port, &server_ca, None).await;
    let wrong_cert = healthz(port, &server_ca, Some(&other)).await;
    let right_cert = healthz(port, &server_ca, Some(&api_server)).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        no_cert.is_err(),
        "answered without a client certificate: {no_cert:?}"
    );
    assert!(
        wrong_cert.is_err(),
        "answered with another CA's certificate: {wrong_cert:?}"
    );
    assert_eq!(right_cert, Ok(200));
}
