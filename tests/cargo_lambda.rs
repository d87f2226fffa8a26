//! The real Lambda Runtime API loop: `cargo lambda watch --only-lambda-apis` emulates Lambda's
//! control plane on loopback, the built `podmutator` binary polls it exactly as it would in AWS,
//! and `cargo lambda invoke --data-file` sends every envelope in `events/`.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::Value;

/// Kills the child when dropped, so a failing assertion leaves no server behind.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_line(child: &mut Child, needle: &str) {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Waited for as long as the child writes: a loaded machine may take minutes to build and
    // start it, and a child that exits ends the stream.
    while let Ok(line) = rx.recv() {
        if line.contains(needle) {
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return;
        }
    }
    panic!("the output ended without a line containing {needle:?}");
}

#[test]
fn every_event_file_through_the_lambda_runtime_api() {
    let cargo_lambda = tool("cargo-lambda");
    let port = free_port().to_string();
    // Its log goes to stderr; merge it into the one pipe we read.
    let mut watch = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" lambda watch --only-lambda-apis -A 127.0.0.1 -P "$1" 2>&1"#)
        .args([&cargo_lambda, &port])
        .current_dir(root())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cargo-lambda starts");
    wait_for_line(&mut watch, "starting Runtime server");
    let _watch = Guard(watch);

    let function = crate::common::bin()
        .env(
            "AWS_LAMBDA_RUNTIME_API",
            format!("http://127.0.0.1:{port}/.rt"),
        )
        .env("AWS_LAMBDA_FUNCTION_NAME", "_")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        // The events' paths carry no token (tests/lambda_events.rs covers the token).
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"http": {"pathTokenDisabled": true}}"#,
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _function = Guard(function);

    let events = json_files(&root().join("events"));
    assert!(events.len() >= 5, "events/: {events:?}");
    for path in &events {
        let out = Command::new(&cargo_lambda)
            .args([
                "lambda",
                "invoke",
                "_",
                "-A",
                "127.0.0.1",
                "-P",
                &port,
                "--data-file",
            ])
            .arg(path)
            .current_dir(root())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "invoke {}: {stdout}{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let reply: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{}: reply is not JSON ({e}): {stdout}", path.display()));
        assert_eq!(reply["statusCode"], 200, "{}: {reply}", path.display());
        let event = read_json(path);
        let is_review = event
            .get("rawPath")
            .or(event.get("path"))
            .is_some_and(|p| p.as_str().unwrap().ends_with("/mutate--v1-pod"));
        let body: Value = serde_json::from_str(reply["body"].as_str().unwrap()).unwrap();
        if is_review {
            let resp = &body["response"];
            assert_eq!(resp["allowed"], true, "{}", path.display());
            assert_eq!(resp["patchType"], "JSONPatch", "{}", path.display());
            assert!(!patch_of(resp).as_array().unwrap().is_empty());
        } else {
            assert_eq!(body["message"], "ok");
        }
    }
}
