//! Attacks on the webhook, one test each, named after what the attacker tries. The security
//! model in `docs/security.md` names these tests; each fails if its hole comes back.

mod common;

use std::time::{Duration, Instant};

use common::*;
use lambda_http::request::LambdaRequest;
use podmutator::config::Config;
use podmutator::transport::lambda::handle;
use podmutator::transport::server::Limits;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "attack-test-token-0123456789abcdefghij";

fn config(v: Value) -> Config {
    Config::from_value(v).unwrap().config
}

fn review_bytes() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap()
}

/// Reads what the server sends until it closes or `limit` passes; `None` if it stayed open.
async fn read_until_closed<S: AsyncReadExt + Unpin>(s: &mut S, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + limit;
    loop {
        let left = end.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn a_caller_without_the_token_gets_404_before_sending_its_body() {
    let s = start_server(
        &config(json!({"http": {"pathToken": TOKEN}})),
        Limits::default(),
    )
    .await;
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    // Announce a large body and send none of it: the answer must come from the head alone.
    tls.write_all(
        b"POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
        .await
        .expect("answered without the body")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_guessed_token_gets_404_and_the_right_one_is_admitted() {
    let s = start_server(
        &config(json!({"http": {"pathToken": TOKEN}})),
        Limits::default(),
    )
    .await;
    let body = review_bytes();
    let wrong = format!("/{}X/mutate--v1-pod", &TOKEN[..TOKEN.len() - 1]);
    for path in ["/mutate--v1-pod", wrong.as_str(), "/healthz"] {
        let (status, _) = https_request(
            s.port,
            &s.ca,
            "localhost",
            "POST",
            path,
            Some("application/json"),
            &body,
        )
        .await
        .unwrap();
        assert_eq!(status, 404, "{path}");
    }
    let (status, reply) = https_request(
        s.port,
        &s.ca,
        "localhost",
        "POST",
        &format!("/{TOKEN}/mutate--v1-pod"),
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(response(&reply)["patch"].is_string());
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_forged_lambda_event_without_the_token_is_refused() {
    // `aws lambda invoke` with a hand-made event reaches the function without the endpoint:
    // the token check in the function is what stops it.
    let front = webhook(
        &config(json!({"http": {"pathTokenSha256": hex_sha256(TOKEN)}})),
        Deps::offline(),
    );
    let mut event = read_json(&root().join("events/apigw-http-mutate.json"));
    let event_for =
        |event: &Value| -> LambdaRequest { serde_json::from_value(event.clone()).unwrap() };
    let reply = handle(&front, event_for(&event)).await;
    assert_eq!(reply.status(), 404);
    let with_token = format!("/{TOKEN}/mutate--v1-pod");
    event["rawPath"] = json!(with_token);
    let reply = handle(&front, event_for(&event)).await;
    assert_eq!(reply.status(), 200);
}

#[tokio::test]
async fn slow_loris_headers_are_cut_off_at_the_header_timeout() {
    let limits = Limits {
        header_read: Duration::from_millis(500),
        ..Limits::default()
    };
    let s = start_server(&config(json!({})), limits).await;
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    tls.write_all(b"POST /mutate--v1-pod HTTP/1.1\r\nHost: local")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    // One byte now and then keeps a naive server waiting forever.
    let started = Instant::now();
    let mut closed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if tls.write_all(b"h").await.is_err() || tls.flush().await.is_err() {
            closed = true;
            break;
        }
        if let Some(rest) = read_until_closed(&mut tls, Duration::from_millis(10)).await {
            let text = String::from_utf8_lossy(&rest);
            assert!(
                text.is_empty() || text.starts_with("HTTP/1.1 408"),
                "{text}"
            );
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "the connection was still open after 4 s of trickled headers"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_body_that_never_arrives_gets_408_at_the_request_timeout() {
    let limits = Limits {
        request: Duration::from_millis(700),
        ..Limits::default()
    };
    let s = start_server(&config(json!({})), limits).await;
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    tls.write_all(
        b"POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"a\":",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let out = read_until_closed(&mut tls, Duration::from_secs(5))
        .await
        .expect("answered");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3));
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn ten_thousand_idle_connections_do_not_take_the_server_down() {
    let limits = Limits {
        max_connections: 256,
        handshake: Duration::from_millis(300),
        ..Limits::default()
    };
    let s = start_server(&config(json!({})), limits).await;
    // Open 10,000 TCP connections that never start TLS, and hold them.
    let port = s.port;
    let attackers = tokio::spawn(async move {
        let mut held = Vec::with_capacity(10_000);
        let mut refused = 0usize;
        for _ in 0..10_000 {
            match tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            {
                Ok(Ok(c)) => held.push(c),
                _ => refused += 1,
            }
        }
        (held, refused)
    });
    let (held, refused) = attackers.await.unwrap();
    assert!(
        held.len() >= 1000,
        "only {} connections opened ({refused} refused)",
        held.len()
    );
    // While they are held, a real client still gets its answer: idle connections are dropped
    // at the handshake timeout, 256 at a time, and the accept loop keeps running.
    let started = Instant::now();
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(60),
        https_request(s.port, &s.ca, "localhost", "GET", "/healthz", None, b""),
    )
    .await
    .expect("served within 60 s while 10,000 connections idle")
    .unwrap();
    assert_eq!(status, 200);
    let during = started.elapsed();
    drop(held);
    let started = Instant::now();
    let (status, _) = https_request(s.port, &s.ca, "localhost", "GET", "/healthz", None, b"")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    eprintln!(
        "idle-connection attack: {} held, {refused} not accepted by the kernel; a real client waited {during:?}",
        10_000 - refused
    );
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[test]
fn the_binary_will_not_serve_without_a_path_token_unless_told_to() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_podmutator"))
        .arg("serve")
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"http": {"listenAddress": "127.0.0.1"}}"#,
        )
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.pathTokenSha256"), "{stderr}");
    assert!(stderr.contains("http.pathTokenDisabled"), "{stderr}");
}

fn hex_sha256(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}
