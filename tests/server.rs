//! The HTTPS server: TLS with generated certificates, the same routes, body limit, reuse of
//! existing certificates, and graceful shutdown of the real binary on SIGTERM.

use crate::common;

use std::time::Duration;

use common::*;
use podmutator::transport::server::Limits;
use podmutator::transport::tls;
use podmutator_core::config::Config;
use serde_json::{Value, json};

async fn start(max_body: usize) -> Running {
    let mut cfg = Config::from_value(json!({})).unwrap().config;
    cfg.http.max_body_bytes = max_body;
    start_server(&cfg, Limits::default()).await
}

fn review_bytes() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap()
}

#[tokio::test]
async fn serves_the_webhook_over_tls_for_every_serving_name() {
    let s = start(6 << 20).await;
    for name in [
        "localhost",
        "podmutator",
        "podmutator.flyte",
        "podmutator.flyte.svc",
    ] {
        let (status, body) = https_request(
            s.port,
            &s.ca,
            name,
            "POST",
            "/mutate--v1-pod?timeout=10s",
            Some("application/json"),
            &review_bytes(),
        )
        .await
        .unwrap_or_else(|e| panic!("TLS to {name}: {e}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let resp = response(&body);
        assert_eq!(resp["allowed"], true);
        assert!(resp["patch"].is_string());
    }
    let (status, _) = https_request(s.port, &s.ca, "localhost", "GET", "/healthz", None, b"")
        .await
        .unwrap();
    assert_eq!(status, 200);
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_name_outside_the_certificate_is_rejected_by_the_client() {
    let s = start(6 << 20).await;
    let err = https_request(
        s.port,
        &s.ca,
        "evil.example.com",
        "GET",
        "/healthz",
        None,
        b"",
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_body_over_the_limit_gets_400_without_being_read_whole() {
    let s = start(4096).await;
    let big = vec![b' '; 64 * 1024];
    let (status, body) = https_request(
        s.port,
        &s.ca,
        "localhost",
        "POST",
        "/mutate--v1-pod",
        Some("application/json"),
        &big,
    )
    .await
    .unwrap();
    assert_eq!(status, 400);
    let msg = response(&body)["status"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(msg.contains("over the 4096-byte limit"), "{msg}");
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

/// A body whose read fails partway (the client's connection ends mid-body, a malformed chunk)
/// is not a body over the limit: it was answered, logged and counted as `BodyTooLarge`, with a
/// 400 naming a limit it never reached. It is `BodyReadFailed` now, its line and 400 saying why
/// the body could not be read. Waits on the events (the replies read to their end, the refusal
/// line, the counters reaching both requests), not on a clock.
#[tokio::test]
async fn a_body_cut_off_or_malformed_is_refused_as_unreadable_not_as_too_large() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = temp_dir("body-read-failed");
    let (port, probe) = (free_port(), free_port());
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "metricsPort": probe, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "maxBodyBytes": 1 << 20}
    });
    let (child, rx) = serve_child(&config);
    // Stopped however the test ends: a failed assertion must not leave it serving.
    let mut child = KillOnDrop(child);
    wait_for(&rx, "serving https");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();

    let review = review_bytes();
    let head =
        "POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n";
    // Half the review sent, then the client's write half closed: the body ends early.
    let mut cut_off = format!("{head}Content-Length: {}\r\n\r\n", review.len()).into_bytes();
    cut_off.extend_from_slice(&review[..review.len() / 2]);
    // A chunk whose size line is not hex.
    let malformed =
        format!("{head}Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"a\":\r\nZZ\r\n").into_bytes();
    // The first request's reply, if one arrived: its refusal is the one logged at once.
    let mut first_reply = None;
    for (i, request) in [cut_off, malformed].into_iter().enumerate() {
        let mut tls = crate::common::tls_connect(port, &ca).await.unwrap();
        tls.write_all(&request).await.unwrap();
        tls.flush().await.unwrap();
        tls.shutdown().await.unwrap();
        // Whatever the server sends before it closes: the reply, if one is written.
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = tls.read(&mut buf).await {
            raw.extend_from_slice(&buf[..n]);
        }
        if raw.is_empty() {
            continue;
        }
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let message = response(&raw[split + 4..])["status"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.starts_with("the request body could not be read: "),
            "{message}"
        );
        assert!(!message.contains("limit"), "{message}");
        if i == 0 {
            first_reply = Some(message);
        }
    }

    // The first refusal's line is written at once; the second waits for its window's end.
    let line = wait_for(&rx, "request refused before the admission");
    assert_eq!(line["refusal"], "BodyReadFailed", "{line}");
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["method"], "POST", "{line}");
    assert!(
        line["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{line}"
    );
    // The line's error is the reason the reply gave.
    let error = line["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{line}");
    if let Some(reply) = first_reply {
        assert!(reply.ends_with(error), "{reply} / {line}");
    }

    // Every refusal is counted: scraped until both requests are, whatever their kind.
    let counted = loop {
        let counted = refusals_counted(probe).await;
        if counted.values().sum::<f64>() >= 2.0 {
            break counted;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("serve exited ({status}) with the refusals counted so far: {counted:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        counted,
        std::collections::BTreeMap::from([("BodyReadFailed".to_owned(), 2.0)])
    );
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `podmutator_refusals_total` by `refusal`, scraped from the probe port.
async fn refusals_counted(probe: u16) -> std::collections::BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", probe))
        .await
        .unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("podmutator_refusals_total{refusal=\""))
        .map(|l| {
            let (kind, value) = l.split_once("\"} ").unwrap();
            (kind.to_owned(), value.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn existing_certificates_are_reused_not_regenerated() {
    let dir = temp_dir("reuse");
    let names = tls::serving_names("svc", "ns");
    let first = tls::ensure_certs(&dir, true, &names).unwrap();
    let cert = std::fs::read(&first.cert).unwrap();
    let key = std::fs::read(&first.key).unwrap();
    let second = tls::ensure_certs(&dir, true, &names).unwrap();
    assert!(!second.generated);
    assert_eq!(std::fs::read(&second.cert).unwrap(), cert);
    assert_eq!(std::fs::read(&second.key).unwrap(), key);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&first.key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key is not world-readable");
}

#[test]
fn missing_certificates_without_local_cert_name_the_fix() {
    let dir = temp_dir("nocerts");
    let err = tls::ensure_certs(&dir, false, &tls::serving_names("s", "n")).unwrap_err();
    assert!(err.to_string().contains("webhook.localCert: true"), "{err}");
}

/// `podmutator serve` with `config`, its stdout lines read into a channel.
fn serve_child(config: &Value) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = crate::common::bin()
        .arg("serve")
        .env("PODMUTATOR_CONFIG", config.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    (child, rx)
}

/// Sends `child` SIGTERM, as the kubelet does to stop a pod.
fn sigterm(child: &std::process::Child) {
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// Reads the child's stdout lines into a channel.
fn lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// Waits for the child's log line `message`. It waits on the event, not a deadline a loaded
/// machine can miss: the child's stdout ending first (it exited) fails at once; only a child
/// that neither prints nor exits for five minutes (a hang) fails on time.
fn wait_for(rx: &std::sync::mpsc::Receiver<String>, message: &str) -> Value {
    use std::sync::mpsc::RecvTimeoutError;
    const HANG: Duration = Duration::from_secs(300);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(HANG) {
            Ok(line) => {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
                if v["message"] == message {
                    return v;
                }
                seen.push(v["message"].clone());
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the binary exited before a {message:?} log line; it logged {seen:?}")
            }
            Err(RecvTimeoutError::Timeout) => {
                panic!("no {message:?} log line, nor an exit, in {HANG:?}; it logged {seen:?}")
            }
        }
    }
}

#[tokio::test]
async fn the_binary_serves_and_stops_cleanly_on_sigterm() {
    let dir = temp_dir("binary");
    let port = free_port();
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 0}
    });
    let (mut child, rx) = serve_child(&config);
    let started = wait_for(&rx, "serving https");
    assert_eq!(started["certs_generated"], true);
    assert_eq!(started["addr"], format!("127.0.0.1:{port}"));
    // The package's version, not a constant of its own: a release bump shows in the log.
    assert_eq!(started["version"], env!("CARGO_PKG_VERSION"), "{started}");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let (status, body) = https_request(
        port,
        &ca,
        "localhost",
        "POST",
        "/mutate--v1-pod",
        Some("application/json"),
        &review_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(response(&body)["patch"].is_string());
    let audit = wait_for(&rx, "admission");
    assert_eq!(audit["decision"], "mutated");
    assert_eq!(audit["mutators"], "secrets");
    assert!(audit["duration_us"].as_u64().is_some());

    sigterm(&child);
    wait_for(&rx, "shut down");
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// Kubernetes may stop a pod the moment it starts (a rollout overtaking itself, a node drain).
/// A SIGTERM sent as soon as the start line is out is caught and drains: the handlers are
/// installed before that line, not when a spawned task first runs, so the signal's default
/// action (death, the exit status a signal's) cannot win the race. Repeated, so a lost race
/// shows.
#[test]
fn a_sigterm_as_soon_as_the_start_line_is_out_drains_and_exits_cleanly() {
    use std::os::unix::process::ExitStatusExt as _;
    for round in 0..5 {
        let dir = temp_dir(&format!("early-term-{round}"));
        let config = json!({
            "webhook": {"certDir": dir, "listenPort": free_port(), "serviceName": "podmutator"},
            "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 0}
        });
        let (mut child, rx) = serve_child(&config);
        wait_for(&rx, "serving https");
        sigterm(&child);
        // Lost either way, a race shows here: killed by the signal (the stdout ends first) or
        // the signal swallowed (no line, no exit: the hang guard).
        wait_for(&rx, "shut down");
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), None, "round {round}: killed by the signal");
        assert!(status.success(), "round {round}: {status:?}");
    }
}

/// A second SIGTERM or Ctrl-C during the drain ends it at once (a developer's second Ctrl-C),
/// where the drain ran its whole length. The drain here is the longest allowed, 120 s: without
/// the second signal's line the test fails.
#[test]
fn a_second_signal_ends_the_drain() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = temp_dir("second-signal");
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": free_port(), "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 120}
    });
    let (mut child, rx) = serve_child(&config);
    wait_for(&rx, "serving https");
    sigterm(&child);
    wait_for(
        &rx,
        "draining: readiness fails, the webhook port answers until the drain ends",
    );
    sigterm(&child);
    wait_for(&rx, "second signal: the drain ends now");
    wait_for(&rx, "shut down");
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), None, "killed by the signal");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_bad_config_stops_the_binary_with_the_key_named() {
    let out = crate::common::bin()
        .arg("serve")
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"webhook": {"listenPort": "9443x"}}"#,
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("webhook.listenPort"), "{stderr}");
}

/// A path token rotation: the function holds the new token's hash and the old one's, so the
/// API server's calls with either are admitted until the registration has moved; any other
/// token is still 404.
#[tokio::test]
async fn during_a_rotation_the_current_and_the_previous_token_are_both_admitted() {
    use sha2::Digest as _;
    let hash = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let current = "current-token-0123456789abcdefghijklmn";
    let previous = "previous-token-0123456789abcdefghijklm";
    let cfg =
        Config::from_value(json!({"http": {"pathTokenSha256": [hash(current), hash(previous)]}}))
            .unwrap()
            .config;
    let s = start_server(&cfg, Limits::default()).await;
    let body = review_bytes();
    for (token, wanted) in [
        (current, 200),
        (previous, 200),
        ("other-token-0123456789abcdefghijklmnop", 404),
    ] {
        let (status, reply) = https_request(
            s.port,
            &s.ca,
            "localhost",
            "POST",
            &format!("/{token}/mutate--v1-pod"),
            Some("application/json"),
            &body,
        )
        .await
        .unwrap();
        assert_eq!(status, wanted, "{token}");
        if wanted == 200 {
            assert_eq!(response(&reply)["allowed"], true);
        }
    }
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[test]
fn a_path_token_hash_list_names_the_bad_entry() {
    let good = "a".repeat(64);
    let err =
        Config::from_value(json!({"http": {"pathTokenSha256": [good, "not-hex"]}})).unwrap_err();
    assert_eq!(err.key, "http.pathTokenSha256[1]");
    let err = Config::from_value(json!({"http": {"pathTokenSha256": []}})).unwrap_err();
    assert_eq!(err.key, "http.pathTokenSha256");
    assert!(err.message.contains("1 to 4"), "{}", err.message);
}

/// A review in flight when the drain ends and the listeners stop: its head and half its body
/// sent before the SIGTERM, the rest only once the webhook port refuses new connections (the
/// listener is gone). It is answered, allowed, before `serve` exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_in_flight_when_the_listeners_stop_is_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = temp_dir("drain-in-flight");
    let port = free_port();
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 1,
                 "bodyTimeoutSeconds": 300}
    });
    let (mut child, rx) = serve_child(&config);
    wait_for(&rx, "serving https");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let body = review_bytes();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut tls = crate::common::tls_connect(port, &ca).await.unwrap();
    let head = format!(
        "POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(first).await.unwrap();
    tls.flush().await.unwrap();

    sigterm(&child);
    wait_for(
        &rx,
        "draining: readiness fails, the webhook port answers until the drain ends",
    );
    // The drain's end: the listener is dropped, a new connection is refused (waited for).
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tls.write_all(rest).await.unwrap();
    tls.flush().await.unwrap();
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    assert_eq!(response(&raw[split + 4..])["allowed"], true, "{text}");
    wait_for(&rx, "shut down");
    assert!(child.wait().unwrap().success());
}

/// On SIGTERM (a rollout, a node drain) `serve` closed its listener at once,
/// so the API server's calls that reached the pod before its endpoint was removed everywhere
/// were refused. Now readiness fails at once and the webhook port answers through
/// `http.drainSeconds`: reviews sent across the SIGTERM, and after readiness has said 503, are
/// every one answered until the drain ends, which the caller sees as its first refused
/// connection (the listener closed). No clock of the test's decides which review counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_sent_across_a_sigterm_are_all_answered_while_readiness_drains() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Instant;
    let dir = temp_dir("drain");
    let (port, probe) = (free_port(), free_port());
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "metricsPort": probe, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true, "drainSeconds": 20}
    });
    let (mut child, rx) = serve_child(&config);
    wait_for(&rx, "serving https");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let ready = || async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", probe))
            .await
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tcp.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(ready().await, "200");

    // The API server: one review after another, each on a new connection, until one is refused
    // (the drain has ended and the listener is closed). Each result notes whether readiness had
    // already said 503 when the review was sent.
    const HANG: Duration = Duration::from_secs(300);
    let (not_ready, started) = (Arc::new(AtomicBool::new(false)), Instant::now());
    let ok_before_signal = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (not_ready, ok, ca) = (not_ready.clone(), ok_before_signal.clone(), ca.clone());
        tokio::spawn(async move {
            let mut results = Vec::new();
            while started.elapsed() < HANG {
                let after_503 = not_ready.load(Ordering::SeqCst);
                let answered = https_request(
                    port,
                    &ca,
                    "localhost",
                    "POST",
                    "/mutate--v1-pod",
                    Some("application/json"),
                    &review_bytes(),
                )
                .await;
                let refused = matches!(&answered, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
                if matches!(answered, Ok((200, _))) && !after_503 {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
                results.push((
                    after_503,
                    answered
                        .map(|(status, _)| status)
                        .map_err(|e| format!("{:?}: {e}", e.kind())),
                ));
                if refused {
                    break;
                }
                // Paced, not a loop of handshakes that takes both cores for the whole drain.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            results
        })
    };
    // A review answered before the signal (waited for, not slept on).
    while ok_before_signal.load(Ordering::SeqCst) == 0 {
        assert!(
            !sender.is_finished() && started.elapsed() < HANG,
            "no review answered before the signal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigterm(&child);
    // Readiness fails as soon as the signal is handled (waited for, not slept on).
    while ready().await != "503" {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    not_ready.store(true, Ordering::SeqCst);
    wait_for(
        &rx,
        "draining: readiness fails, the webhook port answers until the drain ends",
    );
    let results = sender.await.unwrap();
    wait_for(&rx, "shut down");
    assert!(child.wait().unwrap().success());
    eprintln!(
        "{} reviews, {} after readiness said 503; the last two: {:?}",
        results.len(),
        results.iter().filter(|r| r.0).count(),
        &results[results.len().saturating_sub(2)..]
    );
    let (last, answered) = results.split_last().expect("reviews were sent");
    assert!(
        last.1
            .as_ref()
            .is_err_and(|e| e.starts_with("ConnectionRefused")),
        "no refusal (the drain never ended) in {HANG:?}: {results:?}"
    );
    // A review sent as the listener closed may land in its accept queue and be reset with it:
    // that one, just before the first refusal, was sent after the drain ended.
    let answered = match answered.split_last() {
        Some((raced, before)) if raced.1 != Ok(200) => before,
        _ => answered,
    };
    let lost: Vec<_> = answered.iter().filter(|r| r.1 != Ok(200)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} reviews lost: {lost:?}",
        lost.len(),
        answered.len()
    );
    assert!(
        answered.iter().any(|r| !r.0) && answered.iter().any(|r| r.0),
        "reviews answered before the signal and after readiness said 503: {results:?}"
    );
}
