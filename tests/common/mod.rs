//! Shared test helpers: fixtures, reviews, response decoding.
#![allow(dead_code)]

pub mod aws;
pub mod leaks;
pub mod quota;
pub mod registry;
pub mod runtime_api;
pub mod work;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
#[allow(unused_imports)]
pub use podmutator::transport::http::{Front, Incoming};
use podmutator_core::config::Config;
pub use podmutator_core::{App, Deps};
use serde_json::{Value, json};

/// The one way tests build the webhook, as `serve` and the Lambda do: the outside dependencies
/// `config` reads and `deps` lacks ([`podmutator_aws::wiring::deps`]), [`App::build`], behind the
/// HTTP front `config.http` describes. The AWS configuration they are made with reaches nothing
/// (port 9 of 127.0.0.1, fixed credentials): a dependency a test did not give fails at once,
/// and never reaches for the network.
pub fn webhook(config: &Config, deps: Deps) -> Front {
    let deps = podmutator_aws::wiring::deps(config, &unreachable_aws(), deps)
        .unwrap_or_else(|e| panic!("{e}"));
    let app = App::build(config, deps);
    Front::new(Arc::new(app), &config.http, None).unwrap_or_else(|e| panic!("{e}"))
}

/// An AWS configuration whose every call is refused on 127.0.0.1 ([`webhook`]).
pub fn unreachable_aws() -> podmutator_aws::secretsmanager::SharedAws {
    use aws_credential_types::Credentials;
    podmutator_aws::secretsmanager::SharedAws::with_loader(
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
            .endpoint_url("http://127.0.0.1:9"),
    )
}

/// The exec wrapper binary (`crates/exec`), built up to date beside the `podmutator` binary the
/// tests run, where the fetcher image puts them too (a test target alone does not build another
/// package's binary).
pub fn exec_wrapper() -> PathBuf {
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "podmutator-exec",
            "--bin",
            "podmutator-exec",
        ])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build -p podmutator-exec failed");
    let wrapper = Path::new(env!("CARGO_BIN_EXE_podmutator")).with_file_name("podmutator-exec");
    assert!(wrapper.is_file(), "no wrapper at {}", wrapper.display());
    wrapper
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures/kubernetes-api/<name>`: Kubernetes' own round-trip fixtures (origin in
/// that folder's README).
pub fn k8s_fixture(name: &str) -> Value {
    let path = root().join("tests/fixtures/kubernetes-api").join(name);
    read_json(&path)
}

/// The `*.json` files directly in `dir`, sorted by path.
pub fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

pub use podmutator_core::admission::create_review;

/// The `response` of a review reply.
pub fn response(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {}", String::from_utf8_lossy(body)));
    v["response"].clone()
}

/// The decoded JSON Patch of a response, or an empty array.
pub fn patch_of(response: &Value) -> Value {
    match response.get("patch") {
        None => json!([]),
        Some(Value::String(b64)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("patch is base64");
            serde_json::from_slice(&bytes).expect("patch is JSON")
        }
        Some(other) => panic!("patch must be a base64 string, got {other}"),
    }
}

/// Applies `patch` to `doc` with the `json-patch` crate (not our diff code).
pub fn apply(doc: &Value, patch: &Value) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("valid JSON Patch");
    let mut out = doc.clone();
    json_patch::patch(&mut out, &ops).expect("patch applies to the original document");
    out
}

/// `pod` as the API server stores it and hands it to the next webhook: what its defaulting
/// fills in on every container (`terminationMessagePath`, `terminationMessagePolicy`,
/// `imagePullPolicy` by the image's tag) and what Go's `omitempty` drops on the way through
/// its types (an env var's empty `value`, a mount's `readOnly: false` and empty `subPath`).
pub fn as_stored(pod: &Value) -> Value {
    let mut pod = pod.clone();
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(containers) = pod["spec"][list].as_array_mut() else {
            continue;
        };
        for c in containers.iter_mut().filter_map(Value::as_object_mut) {
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or("");
            let tag = last.split_once(':').map(|(_, t)| t);
            let policy = if !image.contains('@') && tag.is_none_or(|t| t == "latest") {
                "Always"
            } else {
                "IfNotPresent"
            };
            c.entry("terminationMessagePath")
                .or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            c.entry("imagePullPolicy").or_insert(json!(policy));
            for e in c
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let e = e.as_object_mut().expect("an env var is an object");
                if e.get("value") == Some(&json!("")) {
                    e.remove("value");
                }
            }
            for m in c
                .get_mut("volumeMounts")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let m = m.as_object_mut().expect("a mount is an object");
                if m.get("readOnly") == Some(&json!(false)) {
                    m.remove("readOnly");
                }
                if m.get("subPath") == Some(&json!("")) {
                    m.remove("subPath");
                }
            }
        }
    }
    pod
}

/// Path of a pinned tool; a missing tool fails the test (it is never skipped).
pub fn tool(name: &str) -> String {
    let out = std::process::Command::new(root().join("scripts/tools.sh"))
        .args(["path", name])
        .output()
        .expect("scripts/tools.sh runs");
    assert!(
        out.status.success(),
        "scripts/tools.sh path {name} failed (run `scripts/tools.sh install`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The Kubernetes versions every mutated pod is validated against: EKS's oldest supported
/// line and the newest schema the pinned kubernetes-validate has.
pub const K8S_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];

/// Validates every pod as a standalone `Pod` document with `kubernetes-validate --strict` for
/// each of [`K8S_VERSIONS`] (one invocation per version), and checks the tool really validated
/// each file as a Pod. A pod without a name gets one (the API server would generate it; the
/// CLI needs it).
pub fn assert_valid_pods(what: &str, pods: &[(String, Value)]) {
    assert!(!pods.is_empty(), "{what}: nothing to validate");
    let kv = tool("kubernetes-validate");
    let dir = temp_dir(what);
    let mut files = Vec::new();
    let mut names = Vec::new();
    for (i, (label, pod)) in pods.iter().enumerate() {
        let mut pod = pod.clone();
        if pod["metadata"]["name"].is_null() {
            pod["metadata"]["name"] = json!(format!("generated-{i}"));
        }
        names.push(
            pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        let safe: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = dir.join(format!("{i:04}-{safe}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(&pod).unwrap()).unwrap();
        files.push(file);
    }
    for version in K8S_VERSIONS {
        let out = std::process::Command::new(&kv)
            .args(["--strict", "-k", version])
            .args(&files)
            .output()
            .expect("kubernetes-validate runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{what}: kubernetes-validate --strict -k {version} failed:\n{stdout}\n{stderr}"
        );
        let minor = version.trim_end_matches(".0");
        for (((label, _), file), name) in pods.iter().zip(&files).zip(&names) {
            let want = format!(
                "{} passed for resource pod/{name} against version {minor}",
                file.display()
            );
            assert!(
                stdout.lines().any(|l| l.ends_with(&want)),
                "{what}: {label} was not validated as a Pod against {version} (no line {want:?}):\n{stdout}\n{stderr}"
            );
        }
    }
}

/// A fresh, empty directory under Cargo's per-target temp dir, named `<name>-<pid>-<n>`. It is
/// kept after the test (for a look at a failure) until a later run's first call removes it.
pub fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| remove_stale_temp_dirs(Path::new(env!("CARGO_TARGET_TMPDIR"))));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the [`temp_dir`]s of test processes that have exited: some hold copies of the
/// debug binary (hundreds of MB each), and runs add up. Directories of a running process (this
/// one, or a test binary of another worktree's run) are kept, and so is anything not named
/// `<name>-<pid>-<n>`.
fn remove_stale_temp_dirs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, _)) = name.to_str().and_then(temp_dir_owner) else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The process id and counter of a [`temp_dir`] name (`server-4242-7` -> (4242, 7)).
fn temp_dir_owner(name: &str) -> Option<(u32, usize)> {
    let mut parts = name.rsplitn(3, '-');
    let n = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    parts.next().filter(|stem| !stem.is_empty())?;
    Some((pid, n))
}

#[test]
fn stale_temp_dirs_are_removed_and_live_ones_kept() {
    assert_eq!(temp_dir_owner("release-from-4242-7"), Some((4242, 7)));
    assert_eq!(temp_dir_owner("server-1-0"), Some((1, 0)));
    assert_eq!(temp_dir_owner("iac-plan-4242"), None);
    assert_eq!(temp_dir_owner("4242-7"), None);
    assert_eq!(temp_dir_owner("x-y-7"), None);
    let root = temp_dir("sweep-root");
    // No process has pid 4194304 or above (Linux's pid_max limit).
    let dead = root.join("release-from-4194305-0");
    let live = root.join(format!("server-{}-99", std::process::id()));
    let other = root.join("tf-plan-4194305");
    for d in [&dead, &live, &other] {
        std::fs::create_dir_all(d.join("inner")).unwrap();
    }
    remove_stale_temp_dirs(&root);
    assert!(!dead.exists(), "a dead process's directory is removed");
    assert!(
        live.exists() && other.exists(),
        "live and unrelated directories stay"
    );
}

/// A TCP port that was free a moment ago on 127.0.0.1.
/// The lowercase hex SHA-256 of `s`: how configurations name a path token.
pub fn hex_sha256(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request over TLS, verified against `ca_pem` for `server_name`.
/// Returns (status, body).
pub async fn https_request(
    port: u16,
    ca_pem: &[u8],
    server_name: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    https_request_as(
        None,
        port,
        ca_pem,
        server_name,
        method,
        path,
        content_type,
        body,
    )
    .await
}

/// [`https_request`] presenting `client`'s certificate, as an API server configured with one
/// does (`http.clientCaFile`).
#[allow(clippy::too_many_arguments)]
pub async fn https_request_as(
    client: Option<&ClientCert>,
    port: u16,
    ca_pem: &[u8],
    server_name: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let mut tls = tls_over(tcp, ca_pem, server_name, client).await?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(body).await?;
    // What the socket did not take yet is still in the TLS stream's buffer: only a flush sends
    // it (reading never does), and without it a large body could wait there while the server
    // waits for its end, until its body deadline answers 408.
    tls.flush().await?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let status_line = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    Ok((status, raw[split + 4..].to_vec()))
}

/// A child's captured stdout and stderr (one buffer, line by line), and how many of the two
/// streams have ended: both ended means the child exited (or closed them), so no awaited line
/// can come any more.
pub struct Captured {
    text: Mutex<String>,
    ended: std::sync::atomic::AtomicUsize,
}

impl std::ops::Deref for Captured {
    type Target = Mutex<String>;
    fn deref(&self) -> &Mutex<String> {
        &self.text
    }
}

impl Captured {
    /// Whether both of the child's output streams have ended.
    pub fn ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::SeqCst) >= 2
    }
}

/// Reads a child's stdout and stderr, line by line, into one shared buffer.
pub fn capture(child: &mut std::process::Child) -> Arc<Captured> {
    use std::io::BufRead;
    let buf = Arc::new(Captured {
        text: Mutex::new(String::new()),
        ended: std::sync::atomic::AtomicUsize::new(0),
    });
    let streams: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(child.stdout.take().expect("stdout piped")),
        Box::new(child.stderr.take().expect("stderr piped")),
    ];
    for stream in streams {
        let b = buf.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                let mut text = b.text.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
            b.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
    buf
}

/// Starts `command` (a `podmutator serve` with its config and environment set) outside Lambda,
/// its output captured, and waits for its "serving https" line.
pub async fn spawn_serve(
    command: &mut std::process::Command,
) -> (std::process::Child, Arc<Captured>) {
    let mut child = command
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = capture(&mut child);
    // Killed if it never gets there (wait_for panics), not left running.
    struct Guard(Option<std::process::Child>);
    impl Drop for Guard {
        fn drop(&mut self) {
            if let Some(child) = &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let mut guard = Guard(Some(child));
    wait_for(&log, "\"serving https\"", 1).await;
    (guard.0.take().expect("still held"), log)
}

/// `podmutator serve` with `config`, its AWS calls sent to `endpoint` (moto, or a proxy in
/// front of it) with test credentials, logging at `trace`.
pub fn serve_with_aws(config: &Value, endpoint: &str) -> std::process::Command {
    let mut cmd = bin();
    cmd.arg("serve")
        .env("PODMUTATOR_CONFIG", config.to_string())
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "trace");
    cmd
}

/// The `podmutator` binary under test, as every test starts it: without the variables it
/// reads from this process's environment (`PODMUTATOR_*`, and `AWS_LAMBDA_RUNTIME_API`, which
/// would make it a Lambda), so that only what a test sets reaches it.
pub fn bin() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_podmutator"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("PODMUTATOR_") || name == "AWS_LAMBDA_RUNTIME_API" {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

/// Waits until `buf` holds `needle` at least `count` times. It waits on the event, not a
/// deadline a loaded machine can miss: the child's output ending first (it exited) fails at
/// once; only a child that neither logs the line nor exits for five minutes (a hang) fails
/// on time.
pub async fn wait_for(buf: &Captured, needle: &str, count: usize) {
    const HANG: std::time::Duration = std::time::Duration::from_secs(300);
    let started = std::time::Instant::now();
    loop {
        // Read `ended` before the text: a line logged just before the exit is still seen.
        let ended = buf.ended();
        if buf.lock().unwrap().matches(needle).count() >= count {
            return;
        }
        if ended {
            panic!(
                "the child's output ended (it exited) with fewer than {count} {needle:?} in:\n{}",
                buf.lock().unwrap()
            );
        }
        if started.elapsed() > HANG {
            panic!(
                "fewer than {count} {needle:?}, and no exit, in {HANG:?}:\n{}",
                buf.lock().unwrap()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Server limits under which no deadline fires in a test's lifetime (an hour each; the
/// drain and accept back-off as by default): a test sets only the limit it is about, so that a
/// stalled machine cannot make another one fire first.
pub fn patient_limits() -> podmutator::transport::server::Limits {
    use podmutator::transport::server::Limits;
    const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
    Limits {
        first_request: HOUR,
        header_read: HOUR,
        body: HOUR,
        request: HOUR,
        idle: HOUR,
        max_age: HOUR,
        h2_keep_alive_interval: HOUR,
        h2_keep_alive_timeout: HOUR,
        linger: HOUR,
        ..Limits::default()
    }
}

/// A `podmutator` HTTPS server running in this process on a free loopback port.
pub struct Running {
    pub port: u16,
    /// The generated CA the client trusts.
    pub ca: Vec<u8>,
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Serves the webhook for `config` (certificates generated into a temp dir) with `limits`.
pub async fn start_server(
    config: &Config,
    limits: podmutator::transport::server::Limits,
) -> Running {
    use podmutator::transport::{server, tls};
    let dir = temp_dir("server");
    let names = tls::serving_names("podmutator", "flyte");
    let files = tls::ensure_certs(&dir, true, &names).unwrap();
    assert!(files.generated);
    let tls = tls::tls_config(&files, None).unwrap();
    let front = Arc::new(webhook(config, Deps::offline()));
    let (listener, local) = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = local.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server::serve(front, listener, tls, limits, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        port,
        ca: std::fs::read(&files.ca).unwrap(),
        stop,
        task,
    }
}

/// A TLS client connection to `port`, trusting `ca_pem`, as `localhost`.
pub async fn tls_connect(
    port: u16,
    ca_pem: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_connect_as(port, ca_pem, "localhost").await
}

/// A TLS client connection to `port`, trusting `ca_pem`, verifying `server_name`.
pub async fn tls_connect_as(
    port: u16,
    ca_pem: &[u8],
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tls_over(tcp, ca_pem, server_name, None).await
}

/// A client CA and a client certificate it signed (extended key usage clientAuth), as PEM: what
/// an API server presents to a webhook through its admission configuration's kubeconfig.
pub struct ClientCert {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl ClientCert {
    /// A new CA and a certificate for `kube-apiserver` it signed.
    pub fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, "kube-apiserver client CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        Self {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// TLS over `tcp`, trusting `ca_pem`, verifying `server_name`, presenting `client` if given.
pub async fn tls_over(
    tcp: tokio::net::TcpStream,
    ca_pem: &[u8],
    server_name: &str,
    client: Option<&ClientCert>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_with(tcp, client_config(ca_pem, client)?, server_name).await
}

/// A TLS client connection over `tcp` made with `config`, verifying `server_name`.
pub async fn tls_with(
    tcp: tokio::net::TcpStream,
    config: tokio_rustls::rustls::ClientConfig,
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// A TLS client's configuration trusting `ca_pem`, presenting `client` when given.
pub fn client_config(
    ca_pem: &[u8],
    client: Option<&ClientCert>,
) -> std::io::Result<tokio_rustls::rustls::ClientConfig> {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert?).map_err(std::io::Error::other)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(c) => builder
            .with_client_auth_cert(
                rustls_pemfile::certs(&mut c.cert.as_bytes()).collect::<Result<_, _>>()?,
                rustls_pemfile::private_key(&mut c.key.as_bytes())?
                    .ok_or_else(|| std::io::Error::other("no key"))?,
            )
            .map_err(std::io::Error::other)?,
    };
    Ok(config)
}

/// A TCP connection to `port` on 127.0.0.1 from the loopback address `127.0.0.<source>`: a
/// client of its own source address, as another pod would be.
pub async fn tcp_connect_from(source: u8, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    use std::net::{Ipv4Addr, SocketAddr};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, source), 0)))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

/// [`tls_connect`] from the loopback address `127.0.0.<source>` ([`tcp_connect_from`]).
pub async fn tls_connect_from(
    source: u8,
    port: u16,
    ca_pem: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_over(
        tcp_connect_from(source, port).await?,
        ca_pem,
        "localhost",
        None,
    )
    .await
}

/// Python's `jsonpatch` result for each `(name, doc, patch)`, from one process.
pub fn python_apply(
    items: &[(String, Value, Value)],
) -> std::collections::BTreeMap<String, Result<Value, String>> {
    let input: Vec<Value> = items
        .iter()
        .map(|(name, doc, patch)| json!({"name": name, "doc": doc, "patch": patch}))
        .collect();
    let script = root().join("tests/golden/apply_patches.py");
    let mut child = std::process::Command::new(tool("python"))
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    let body = serde_json::to_vec(&input).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &body));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), items.len());
    results
        .into_iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap().to_owned();
            let result = match r.get("error") {
                Some(e) => Err(e.as_str().unwrap().to_owned()),
                None => Ok(r["result"].clone()),
            };
            (name, result)
        })
        .collect()
}

/// The commands deploy/kubernetes/components/path-token/kustomization.yaml documents for making
/// its git-ignored files (its comment's indented lines), in order.
pub fn path_token_recipe() -> Vec<String> {
    let text = std::fs::read_to_string(
        root().join("deploy/kubernetes/components/path-token/kustomization.yaml"),
    )
    .unwrap();
    let recipe: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        recipe.len(),
        3,
        "the component documents three commands: {recipe:?}"
    );
    recipe
}

/// Log lines written into memory, for a `tracing` subscriber's writer (`move || logs.clone()`).
#[derive(Clone, Default)]
pub struct Logs(pub Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `bin/name`, a stand-in that runs tests/iac/`script` with the venv's python, and returns
/// its path.
pub fn stand_in(bin: &Path, name: &str, script: &str) -> PathBuf {
    let path = bin.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
            tool("python"),
            root().join("tests/iac").join(script).display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A directory of stand-ins on PATH: `kubectl` (tests/iac/fake_kubectl.py) and `aws`
/// (tests/iac/fake_aws.py), both run with the venv's python.
pub fn fake_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    stand_in(&bin, "kubectl", "fake_kubectl.py");
    stand_in(&bin, "aws", "fake_aws.py");
    bin
}
