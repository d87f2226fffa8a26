//! Hole 6 of issue 25: the path token outside the redaction. Whoever reads a command's stderr
//! (a CI log, a pod's log) or the function's log at any level must never see the token.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::common::runtime_api::{Seen, runtime_api};
use super::common::{hex_sha256, root, temp_dir};

const TOKEN: &str = "leaky-token-6f1c2a9e0b7d4c3a8e5f1d2c3b4a5968";

/// A configuration file whose YAML breaks on the token's own line: a renderer that quotes the
/// lines around an error quotes the token.
fn broken_config() -> std::path::PathBuf {
    let dir = temp_dir("attack-token-yaml");
    let file = dir.join("config.yaml");
    std::fs::write(
        &file,
        format!("webhook: {{}}\nhttp:\n  pathToken: {TOKEN}: x\n  listenAddress: 127.0.0.1\n"),
    )
    .unwrap();
    file
}

#[test]
fn a_yaml_syntax_error_in_the_config_never_prints_the_path_token() {
    let file = broken_config();
    let file = file.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["check-config", "--config", file],
        &["serve", "--config", file],
        &["inject", "--config", file, "-f", "-"],
        &["lambda", "--config", file],
    ];
    for args in commands {
        let out = crate::common::bin()
            .args(args)
            .env("RUST_LOG", "trace")
            // `lambda` checks the runtime's variables before it reads the configuration.
            .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
            .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        // Still actionable: which file, that it is YAML, and where.
        assert!(
            stderr.contains("not valid YAML") && stderr.contains("line 3"),
            "{args:?}: {stderr}"
        );
        for part in [TOKEN, &TOKEN[..16], &TOKEN[TOKEN.len() - 16..]] {
            assert!(
                !stderr.contains(part),
                "{args:?} printed the token: {stderr}"
            );
            assert!(
                !stdout.contains(part),
                "{args:?} printed the token: {stdout}"
            );
        }
    }
}

/// `lambda_runtime` logs every raw event at TRACE, and the event's path holds the token. The
/// real binary, polling a Runtime API with `RUST_LOG=trace`, answers an event that carries the
/// token and logs nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lambda_runtime_at_trace_never_logs_the_path_token() {
    let mut event: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("events/apigw-http-healthz.json")).unwrap(),
    )
    .unwrap();
    let path = format!("/{TOKEN}/healthz");
    event["rawPath"] = serde_json::json!(path);
    event["requestContext"]["http"]["path"] = serde_json::json!(path);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let port = runtime_api(event.to_string(), seen.clone()).await;
    let config = serde_json::json!({"http": {"pathTokenSha256": hex_sha256(TOKEN)}});
    for level in [
        "trace",
        "debug",
        "info,lambda_runtime=trace,lambda_http=trace,hyper=trace,h2=trace",
    ] {
        seen.lock().unwrap().nexts = 0;
        seen.lock().unwrap().responses.clear();
        let mut child = crate::common::bin()
            .arg("lambda")
            .env("PODMUTATOR_CONFIG", config.to_string())
            .env("RUST_LOG", level)
            .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
            .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_REGION", "us-east-1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Both streams are read as they come: at trace the log can fill a pipe's buffer, and a
        // child blocked writing its log would never answer.
        let drain = |stream: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = String::new();
                stream.unwrap().read_to_string(&mut text).unwrap();
                text
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        // The answer proves the event, token and all, went through the runtime. Waited for
        // as long as the child runs.
        while seen.lock().unwrap().responses.is_empty() {
            if child.try_wait().unwrap().is_some() {
                panic!(
                    "no response for the event ({:?}); stderr: {}",
                    seen.lock().unwrap().errors,
                    err.join().unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
        let reply: serde_json::Value =
            serde_json::from_str(&seen.lock().unwrap().responses[0]).unwrap();
        assert_eq!(reply["statusCode"], 200, "{level}: {reply}");
        // The log ran, and its start-up line says which release answered.
        let started = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message"] == "lambda runtime starting")
            .unwrap_or_else(|| panic!("{level}: no start-up line: {stdout}"));
        assert_eq!(started["version"], env!("CARGO_PKG_VERSION"), "{started}");
        for part in [TOKEN, &TOKEN[..16], &TOKEN[TOKEN.len() - 16..]] {
            assert!(
                !stdout.contains(part),
                "RUST_LOG={level} logged the token: {stdout}"
            );
            assert!(
                !stderr.contains(part),
                "RUST_LOG={level} printed the token: {stderr}"
            );
        }
    }
}

/// Hole 5 of issue 36: the empty string's SHA-256 as `http.pathTokenSha256` admitted
/// `POST //mutate--v1-pod`, a path with no token at all, and the path-token component's recipe
/// wrote exactly that hash when its `path-token` file was missing or empty. Now the hash is
/// refused at start, an empty first segment never matches whatever is configured, and the
/// recipe fails without writing the hash.
#[test]
fn the_empty_strings_hash_never_opens_the_door() {
    use podmutator_core::config::{EMPTY_SHA256, Sha256Hex, TokenHashes};
    assert_eq!(hex_sha256(""), EMPTY_SHA256);
    let config = format!(r#"{{"http": {{"pathTokenSha256": "{EMPTY_SHA256}"}}}}"#);
    let out = crate::common::bin()
        .args(["check-config", "--config-json", &config])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("http.pathTokenSha256: is the SHA-256 of the empty string"),
        "{stderr}"
    );

    // Past the gate (a front built straight from a configuration), no token still matches nothing.
    let mut c = podmutator_core::config::Config::default();
    c.http.path_token_sha256 = Some(TokenHashes::One(Sha256Hex::parse(EMPTY_SHA256).unwrap()));
    let front = podmutator::transport::http::Front::new(
        Arc::new(podmutator_core::App::build(
            &c,
            podmutator_core::Deps::offline(),
        )),
        &c.http,
        None,
    )
    .unwrap();
    for path in ["//mutate--v1-pod", "/", "//healthz"] {
        assert!(
            matches!(
                front.route(None, "POST", path, Some("application/json")),
                podmutator::transport::http::Routed::Answer(r) if r.status == 404
            ),
            "{path}"
        );
    }

    // The recipe's hash line, run on a missing and an empty token file.
    let recipe = super::common::path_token_recipe();
    for content in [None, Some(""), Some("\n")] {
        let dir = temp_dir("attack-empty-token");
        if let Some(c) = content {
            std::fs::write(dir.join("path-token"), c).unwrap();
        }
        let out = Command::new("sh")
            .args(["-c", &recipe[2]])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{content:?}: the recipe went on");
        assert!(
            !dir.join("path-token.env").exists(),
            "{content:?}: a hash was written"
        );
    }
    // And on a real token it writes that token's hash.
    let dir = temp_dir("attack-empty-token");
    std::fs::write(dir.join("path-token"), format!("{TOKEN}\n")).unwrap();
    let status = Command::new("sh")
        .args(["-c", &recipe[2]])
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("path-token.env")).unwrap(),
        format!("PATH_TOKEN_SHA256={}\n", hex_sha256(TOKEN))
    );
}
