//! Hole 6 of issue 36: refusal bursts went unreported. A burst of wrong-token requests was
//! logged (and sent to the `Refusals` metric) as `count: 1`, the rest waiting for a later
//! refusal of the same kind, so spaced bursts never tripped the PathToken alarm; in Lambda the
//! pending count was lost with the instance. Now what a window holds is reported when it ends
//! (a timer in `serve`, the end of each invocation in Lambda), with the caller's address.

use serde_json::{Value, json};

use super::TOKEN;
use crate::common::*;

/// The refusal lines of a log, as JSON.
fn refusal_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "request refused before the admission")
        .collect()
}

/// The real `serve`: a burst of wrong-token requests, then nothing. The first is reported at
/// once; the rest of the burst when its window ends, without waiting for another refusal; both
/// lines name the caller.
#[tokio::test]
async fn a_burst_of_refusals_is_reported_in_full_when_its_window_ends() {
    let dir = temp_dir("attack-refusal-burst");
    let port = free_port();
    let (mut child, log) = spawn_serve(
        crate::common::bin().arg("serve").env(
            "PODMUTATOR_CONFIG",
            json!({
                "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator"},
                "http": {"listenAddress": "127.0.0.1", "pathToken": TOKEN}
            })
            .to_string(),
        ),
    )
    .await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let burst = 40;
    // Before the first request and after the last answer: every refusal lies between.
    let started = std::time::Instant::now();
    for i in 0..burst {
        let (status, _) = https_request(
            port,
            &ca,
            "localhost",
            "POST",
            &format!("/wrong-token-{i:02}-0123456789abcdefghijklmn/mutate--v1-pod"),
            Some("application/json"),
            b"{}",
        )
        .await
        .unwrap();
        assert_eq!(status, 404);
    }
    let took = started.elapsed();
    // Nothing more is sent: what is still pending is reported by the window's end alone. Waits
    // for the whole burst to be reported (the guard ends only a hang).
    let counted =
        |lines: &[Value]| -> u64 { lines.iter().map(|l| l["count"].as_u64().unwrap()).sum() };
    let waiting = std::time::Instant::now();
    let lines = loop {
        let lines = refusal_lines(&log.lock().unwrap());
        if counted(&lines) >= burst || waiting.elapsed() > std::time::Duration::from_secs(300) {
            break lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    let counts: Vec<u64> = lines.iter().map(|l| l["count"].as_u64().unwrap()).collect();
    assert_eq!(counted(&lines), burst, "every refusal reported: {lines:?}");
    let window = std::time::Duration::from_millis(podmutator::transport::http::REFUSAL_SAMPLE_MS);
    if took < window {
        // The whole burst fell in the first refusal's window: the first at once, the other 39
        // in one line at the window's end, which no refusal came to trigger.
        assert_eq!(counts, [1, burst - 1], "{lines:?}");
    } else {
        // A stalled machine spread the burst over more than one window: the first is still
        // reported at once, and the rest in full.
        eprintln!("the burst took {took:?}, longer than a window: counts {counts:?}");
        assert_eq!(counts[0], 1, "{lines:?}");
        assert!(counts.len() >= 2, "{lines:?}");
    }
    for l in &lines {
        assert_eq!(l["refusal"], "PathToken");
        assert!(l["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{l}");
        assert!(
            !l.to_string().contains("wrong-token"),
            "the guess is never written: {l}"
        );
    }
}

/// Lambda: each refused invocation's count is reported before the invocation ends (an instance
/// is frozen or recycled after any of them), with the source address the ALB reports, and the
/// one API Gateway (REST and HTTP APIs) and a Function URL report in their request context.
#[tokio::test]
async fn every_refused_lambda_invocation_is_reported_before_it_ends_with_its_source() {
    for (file, pointer, source) in [
        (
            "events/apigw-rest-mutate.json",
            "/requestContext/identity/sourceIp",
            "192.0.2.44",
        ),
        (
            "events/apigw-http-mutate.json",
            "/requestContext/http/sourceIp",
            "192.0.2.45",
        ),
        (
            "events/function-url-mutate.json",
            "/requestContext/http/sourceIp",
            "192.0.2.46",
        ),
    ] {
        let mut event = read_json(&root().join(file));
        *event.pointer_mut(pointer).unwrap() = json!(source);
        let path = if event.get("rawPath").is_some() {
            "/rawPath"
        } else {
            "/path"
        };
        *event.pointer_mut(path).unwrap() =
            json!("/wrong-token-0123456789abcdefghijklmnopq/mutate--v1-pod");
        refused_three_times_reported_with(event, source).await;
    }
    let mut event = read_json(&root().join("events/alb-mutate.json"));
    event["path"] = json!("/wrong-token-0123456789abcdefghijklmnopq/mutate--v1-pod");
    event["headers"]["x-forwarded-for"] = json!("198.51.100.7, 10.0.3.21");
    // The address the ALB accepted the connection from: the last of X-Forwarded-For.
    refused_three_times_reported_with(event, "10.0.3.21").await;
}

/// `event` (a wrong token's path) invoked three times: three refusals reported, each line naming
/// `peer`.
async fn refused_three_times_reported_with(event: Value, peer: &str) {
    let front = webhook(
        &super::config(json!({"http": {"pathToken": TOKEN}})),
        podmutator_core::Deps::offline(),
    );
    let logs = Logs::default();
    let writer = logs.clone();
    let _guard = tracing::subscriber::set_default(podmutator::logging::json_subscriber(
        move || writer.clone(),
        podmutator::logging::log_filter("info").unwrap(),
    ));
    for _ in 0..3 {
        let req: lambda_http::request::LambdaRequest =
            serde_json::from_value(event.clone()).unwrap();
        let reply = podmutator::transport::lambda::handle(&front, req).await;
        assert_eq!(reply.status(), 404);
    }
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines = refusal_lines(&logged);
    let total: u64 = lines.iter().map(|l| l["count"].as_u64().unwrap()).sum();
    assert_eq!(
        total, 3,
        "every refusal reported within its invocation: {logged}"
    );
    for l in &lines {
        assert_eq!(l["peer"], peer, "{l}");
    }
}
