//! `podmutator certs` (the self-managed certificates of the in-cluster install), the real
//! binary against a Kubernetes API server of the test's own on 127.0.0.1: HTTPS with its own
//! CA, a bearer token, Secrets and the MutatingWebhookConfiguration kept in memory by name with
//! resourceVersions (404 when absent, 201 on create, 409 on a stale PUT), every request
//! recorded. What the runs write is then used as the cluster would: a real `podmutator serve`
//! on the serving Secret's files answers an admission to a client that trusts only the
//! registration's caBundle.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};

use base64::Engine;
use http_body_util::BodyExt;
use podmutator::registration::{RegistrationOptions, ServiceRef, mutating_webhook_configuration};
use podmutator::transport::tls;
use serde_json::{Value, json};

use crate::common;

const NS: &str = "podmutator";
const TOKEN: &str = "sa-token-9f2c4b7e1d3a5c8e0b6d";
const CA_SECRET: &str = "podmutator-ca";
const TLS_SECRET: &str = "podmutator-tls";
const SECRETS: &str = "/api/v1/namespaces/podmutator/secrets";
const REGISTRATION: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/podmutator";

/// What the fake API server holds and saw.
#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    version: u64,
    /// (method, path, status) of every request, in order.
    requests: Vec<(String, String, u16)>,
    /// Answered instead of the store, once each: (method, path, status, message).
    faults: Vec<(String, String, u16, String)>,
    /// Another writer: before the next PUT of this path, the stored object changes (a label
    /// is added, a new resourceVersion given), so that PUT carries a stale version.
    interfere: Option<String>,
}

impl State {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// One request against the store, as the API server answers it.
fn answer(
    state: &mut State,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
) -> (u16, Value) {
    if auth != Some(&format!("Bearer {TOKEN}")) {
        return (401, status_body(401, "Unauthorized", "Unauthorized"));
    }
    if let Some(i) = state
        .faults
        .iter()
        .position(|(m, p, _, _)| m == method && p == path)
    {
        let (_, _, code, message) = state.faults.remove(i);
        // A 200 fault is something else answering in the API server's place: its text.
        if code == 200 {
            return (200, Value::String(message));
        }
        let reason = if code == 403 {
            "Forbidden"
        } else {
            "InternalError"
        };
        return (code, status_body(code, reason, &message));
    }
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (collection, name) = match path.rsplit_once('/') {
        Some((c, n)) if c == SECRETS || path.starts_with(REGISTRATION) => (c, n.to_owned()),
        _ if path == SECRETS => (SECRETS, String::new()),
        _ => {
            return (
                404,
                status_body(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            );
        }
    };
    let key = format!("{collection}/{name}");
    match method {
        "GET" => match state.objects.get(&key) {
            Some(obj) => (200, obj.clone()),
            None => (
                404,
                status_body(404, "NotFound", &format!("\"{name}\" not found")),
            ),
        },
        "POST" if collection == SECRETS && name.is_empty() => {
            let Some(name) = body["metadata"]["name"].as_str() else {
                return (
                    422,
                    status_body(422, "Invalid", "metadata.name: Required value"),
                );
            };
            if let Some(problem) = invalid_secret(&body) {
                return (422, status_body(422, "Invalid", &problem));
            }
            let key = format!("{SECRETS}/{name}");
            if state.objects.contains_key(&key) {
                return (
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        &format!("secrets \"{name}\" already exists"),
                    ),
                );
            }
            let mut obj = body.clone();
            obj["metadata"]["resourceVersion"] = json!(state.next_version());
            obj["metadata"]["namespace"] = json!(NS);
            state.objects.insert(key, obj.clone());
            (201, obj)
        }
        "PUT" if !name.is_empty() => {
            if state.interfere.as_deref() == Some(path) {
                state.interfere = None;
                let version = state.next_version();
                if let Some(obj) = state.objects.get_mut(&key) {
                    obj["metadata"]["labels"]["changed-by"] = json!("another-writer");
                    obj["metadata"]["resourceVersion"] = json!(version);
                }
            }
            let Some(stored) = state.objects.get(&key) else {
                return (
                    404,
                    status_body(404, "NotFound", &format!("\"{name}\" not found")),
                );
            };
            if body["metadata"]["name"] != json!(name) {
                return (
                    400,
                    status_body(
                        400,
                        "BadRequest",
                        "the name of the object does not match the name on the URL",
                    ),
                );
            }
            if body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
                return (
                    409,
                    status_body(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                        ),
                    ),
                );
            }
            if collection == SECRETS {
                if let Some(problem) = invalid_secret(&body) {
                    return (422, status_body(422, "Invalid", &problem));
                }
                if body["type"] != stored["type"] {
                    return (
                        422,
                        status_body(422, "Invalid", "type: Invalid value: field is immutable"),
                    );
                }
            }
            let mut obj = body.clone();
            obj["metadata"]["resourceVersion"] = json!(state.next_version());
            state.objects.insert(key, obj.clone());
            (200, obj)
        }
        _ => (
            405,
            status_body(405, "MethodNotAllowed", "method not allowed"),
        ),
    }
}

/// What the API server refuses in a Secret: a value that is not base64.
fn invalid_secret(body: &Value) -> Option<String> {
    let data = body["data"].as_object()?;
    data.iter()
        .find(|(_, v)| {
            v.as_str()
                .is_none_or(|s| base64::engine::general_purpose::STANDARD.decode(s).is_err())
        })
        .map(|(k, _)| format!("data[{k}]: Invalid value: not base64"))
}

/// The fake API server, its CA and token files, and a scratch directory.
pub(crate) struct FakeApi {
    port: u16,
    pub(crate) dir: PathBuf,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApi {
    /// Serving HTTPS on a free loopback port, holding the registration `podmutator
    /// webhook-config --service podmutator/podmutator --mesh --images` renders (four webhooks).
    async fn start() -> Self {
        let registration =
            serde_json::to_value(mutating_webhook_configuration(&RegistrationOptions {
                service: Some(ServiceRef {
                    namespace: NS.into(),
                    name: "podmutator".into(),
                    port: 443,
                }),
                mesh: true,
                images: true,
                ..Default::default()
            }))
            .unwrap();
        Self::start_with(registration).await
    }

    /// Serving HTTPS on a free loopback port, holding `registration` (named `podmutator`).
    pub(crate) async fn start_with(registration: Value) -> Self {
        use tokio_rustls::rustls;
        assert_eq!(registration["metadata"]["name"], "podmutator");
        let dir = common::temp_dir("certs-api");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let (ca, cert, key) = tls::generate_certs(&names).unwrap();
        std::fs::write(dir.join("api-ca.crt"), &ca).unwrap();
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
        let certs = rustls_pemfile::certs(&mut cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pemfile::private_key(&mut key.as_bytes())
            .unwrap()
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        let mut state = State::default();
        let mut stored = registration;
        stored["metadata"]["resourceVersion"] = json!(state.next_version());
        state.objects.insert(REGISTRATION.into(), stored);
        let state = Arc::new(Mutex::new(state));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let state = shared.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let state = state.clone();
                            async move {
                                let method = req.method().as_str().to_owned();
                                let path = req.uri().path().to_owned();
                                let auth = req
                                    .headers()
                                    .get(hyper::header::AUTHORIZATION)
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned);
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let mut state = state.lock().unwrap();
                                let (status, reply) =
                                    answer(&mut state, &method, &path, auth.as_deref(), &body);
                                state.requests.push((method, path, status));
                                let reply = hyper::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(hyper::body::Bytes::from(
                                        serde_json::to_vec(&reply).unwrap(),
                                    )))
                                    .unwrap();
                                Ok::<_, Infallible>(reply)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            port,
            dir,
            state,
            task,
        }
    }

    /// `podmutator certs` against this server, with `flags` after the connection's.
    pub(crate) async fn run(&self, flags: &[&str]) -> Output {
        self.run_with_token(&self.dir.join("token"), flags).await
    }

    async fn run_with_token(&self, token: &Path, flags: &[&str]) -> Output {
        tokio::process::Command::from(crate::common::bin())
            .arg("certs")
            .arg("--api-server")
            .arg(format!("https://127.0.0.1:{}", self.port))
            .arg("--token-file")
            .arg(token)
            .arg("--api-ca-file")
            .arg(self.dir.join("api-ca.crt"))
            .args(["--namespace", NS])
            .args(flags)
            .env_remove("POD_NAMESPACE")
            .env_remove("PODMUTATOR_API_SERVER")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .await
            .unwrap()
    }

    /// The requests since the last call, as `METHOD path status`.
    pub(crate) fn take_requests(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
            .into_iter()
            .map(|(m, p, s)| format!("{m} {p} {s}"))
            .collect()
    }

    fn object(&self, path: &str) -> Value {
        self.state
            .lock()
            .unwrap()
            .objects
            .get(path)
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub(crate) fn secret(&self, name: &str) -> Value {
        self.object(&format!("{SECRETS}/{name}"))
    }

    pub(crate) fn registration(&self) -> Value {
        self.object(REGISTRATION)
    }

    /// Writes `bytes` as `key` of the stored Secret `name`, as someone with write access to it
    /// would (no request is recorded).
    pub(crate) fn set_secret_data(&self, name: &str, key: &str, bytes: &[u8]) {
        use base64::Engine;
        let mut state = self.state.lock().unwrap();
        let secret = state
            .objects
            .get_mut(&format!("{SECRETS}/{name}"))
            .expect("the Secret exists");
        secret["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
}

fn decode(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_else(|| panic!("not a string: {v}")))
        .unwrap()
}

fn data(secret: &Value, key: &str) -> Vec<u8> {
    decode(&secret["data"][key])
}

/// Every webhook's caBundle, decoded; all the same, or the test fails.
fn ca_bundle(registration: &Value) -> Vec<u8> {
    let hooks = registration["webhooks"].as_array().unwrap();
    assert!(hooks.len() >= 4, "{registration}");
    let first = decode(&hooks[0]["clientConfig"]["caBundle"]);
    for w in hooks {
        assert_eq!(
            decode(&w["clientConfig"]["caBundle"]),
            first,
            "{}",
            w["name"]
        );
    }
    first
}

fn pem_count(pem: &[u8]) -> usize {
    rustls_pemfile::certs(&mut &pem[..]).count()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert!(out.status.success(), "certs failed: {}", stderr(out));
}

/// No private key of either Secret in the run's output, in PEM or as stored (base64 of PEM).
fn assert_no_keys(api: &FakeApi, out: &Output) {
    let mut text = stderr(out);
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    for (secret, key) in [(CA_SECRET, "ca.key"), (TLS_SECRET, "tls.key")] {
        let stored = api.secret(secret)["data"][key]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if stored.is_empty() {
            continue;
        }
        let pem = String::from_utf8(decode(&json!(stored))).unwrap();
        let body_line = pem.lines().nth(1).unwrap();
        assert!(
            !text.contains(&stored[..40]),
            "{secret}.{key} (base64) in the output"
        );
        assert!(
            !text.contains(body_line),
            "{secret}.{key} (PEM) in the output"
        );
    }
}

/// A real `podmutator serve` with the base's config, reading its certificate from `dir`.
struct Serve {
    child: std::process::Child,
    port: u16,
    log: Arc<crate::common::Captured>,
}

impl Serve {
    async fn start(dir: &Path) -> Self {
        let port = common::free_port();
        let overrides = json!({
            "webhook": {"certDir": dir, "listenPort": port, "metricsPort": common::free_port()},
            "http": {"listenAddress": "127.0.0.1", "drainSeconds": 0}
        });
        let (child, log) = common::spawn_serve(
            crate::common::bin()
                .args(["serve", "--config"])
                .arg(common::root().join("deploy/kubernetes/base/config.yaml"))
                .env("PODMUTATOR_CONFIG", overrides.to_string()),
        )
        .await;
        Self { child, port, log }
    }

    /// An admission to the registration's first path, over TLS that trusts only `ca` and checks
    /// `host`: Ok(allowed) or the TLS / HTTP error.
    async fn admit(&self, ca: &[u8], host: &str, registration: &Value) -> Result<bool, String> {
        let review =
            std::fs::read(common::root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"))
                .unwrap();
        let path = registration["webhooks"][0]["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap();
        let (status, body) = common::https_request(
            self.port,
            ca,
            host,
            "POST",
            &format!("{path}?timeout=10s"),
            Some("application/json"),
            &review,
        )
        .await
        .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(common::response(&body)["allowed"] == true)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The serving Secret's certificate and key, as the kubelet would put them in the volume.
fn write_leaf(secret: &Value, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        let tmp = dir.join(format!(".{key}.new"));
        std::fs::write(&tmp, data(secret, key)).unwrap();
        std::fs::rename(&tmp, dir.join(key)).unwrap();
    }
}

const SVC: &str = "podmutator.podmutator.svc";
const SVC_LOCAL: &str = "podmutator.podmutator.svc.cluster.local";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_run_creates_both_secrets_and_every_ca_bundle_and_a_second_run_only_reads() {
    let api = FakeApi::start().await;
    let out = api.run(&[]).await;
    assert_ok(&out);
    assert_no_keys(&api, &out);
    // The CA is stored before anything trusts it; the registration trusts it before a leaf
    // it signed exists.
    assert_eq!(
        api.take_requests(),
        [
            format!("GET {SECRETS}/{CA_SECRET} 404"),
            format!("POST {SECRETS} 201"),
            format!("GET {REGISTRATION} 200"),
            format!("PUT {REGISTRATION} 200"),
            format!("GET {SECRETS}/{TLS_SECRET} 404"),
            format!("POST {SECRETS} 201"),
        ]
    );
    let ca_secret = api.secret(CA_SECRET);
    let ca = data(&ca_secret, "ca.crt");
    assert!(
        String::from_utf8(data(&ca_secret, "ca.key"))
            .unwrap()
            .contains("PRIVATE KEY")
    );
    assert!(ca_secret["data"].get("previous-ca.crt").is_none());
    let serving = api.secret(TLS_SECRET);
    assert_eq!(serving["type"], "kubernetes.io/tls");
    assert_eq!(data(&serving, "ca.crt"), ca);
    let registration = api.registration();
    assert_eq!(ca_bundle(&registration), ca, "every caBundle is the CA");
    // Nothing else of the registration changed.
    let mut without = registration.clone();
    for w in without["webhooks"].as_array_mut().unwrap() {
        w["clientConfig"]
            .as_object_mut()
            .unwrap()
            .remove("caBundle");
    }
    without["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let rendered = serde_json::to_value(mutating_webhook_configuration(&RegistrationOptions {
        service: Some(ServiceRef {
            namespace: NS.into(),
            name: "podmutator".into(),
            port: 443,
        }),
        mesh: true,
        images: true,
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(without, rendered);

    let again = api.run(&[]).await;
    assert_ok(&again);
    let requests = api.take_requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests
            .iter()
            .all(|r| r.starts_with("GET ") && r.ends_with(" 200")),
        "{requests:?}"
    );
    assert!(
        stderr(&again).contains("0 objects written"),
        "{}",
        stderr(&again)
    );
    assert_eq!(api.secret(TLS_SECRET), serving);

    // serve on the Secret's files: a client trusting only the caBundle completes an admission
    // for either of the Service's names.
    let certs = api.dir.join("mounted");
    write_leaf(&serving, &certs);
    let serve = Serve::start(&certs).await;
    for host in [SVC, SVC_LOCAL] {
        assert_eq!(
            serve
                .admit(&ca_bundle(&registration), host, &registration)
                .await,
            Ok(true),
            "{host}"
        );
    }
    // ...and not for a name the certificate was not made for.
    assert!(
        serve
            .admit(&ca, "podmutator.other.svc", &registration)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_due_for_renewal_is_replaced_and_both_cas_are_trusted_while_the_leaf_moves() {
    let api = FakeApi::start().await;
    assert_ok(
        &api.run(&[
            "--ca-validity",
            "2h",
            "--leaf-validity",
            "2h",
            "--renew-before",
            "10m",
        ])
        .await,
    );
    api.take_requests();
    let old_ca = data(&api.secret(CA_SECRET), "ca.crt");
    let old_serving = api.secret(TLS_SECRET);
    let certs = api.dir.join("mounted");
    write_leaf(&old_serving, &certs);
    let serve = Serve::start(&certs).await;
    assert_eq!(
        serve.admit(&old_ca, SVC, &api.registration()).await,
        Ok(true)
    );

    // The CA has 2 h left; renewing 150 m before expiry makes it due.
    let rotate = [
        "--ca-validity",
        "3h",
        "--leaf-validity",
        "3h",
        "--renew-before",
        "150m",
    ];
    let out = api.run(&rotate).await;
    assert_ok(&out);
    assert_no_keys(&api, &out);
    assert_eq!(
        api.take_requests(),
        [
            format!("GET {SECRETS}/{CA_SECRET} 200"),
            format!("PUT {SECRETS}/{CA_SECRET} 200"),
            format!("GET {REGISTRATION} 200"),
            format!("PUT {REGISTRATION} 200"),
            format!("GET {SECRETS}/{TLS_SECRET} 200"),
            format!("PUT {SECRETS}/{TLS_SECRET} 200"),
        ],
        "{}",
        stderr(&out)
    );
    let ca_secret = api.secret(CA_SECRET);
    let new_ca = data(&ca_secret, "ca.crt");
    assert_ne!(new_ca, old_ca);
    assert_eq!(
        data(&ca_secret, "previous-ca.crt"),
        old_ca,
        "the old CA's certificate is kept"
    );
    assert!(
        !String::from_utf8_lossy(&data(&ca_secret, "previous-ca.crt")).contains("PRIVATE KEY"),
        "never its key"
    );
    let registration = api.registration();
    let bundle = ca_bundle(&registration);
    assert_eq!(pem_count(&bundle), 2);
    assert_eq!(
        bundle,
        [new_ca.clone(), old_ca.clone()].concat(),
        "new, then old"
    );
    let serving = api.secret(TLS_SECRET);
    assert_eq!(data(&serving, "ca.crt"), new_ca);
    let required = [SVC.to_owned(), SVC_LOCAL.to_owned()];
    let now = std::time::SystemTime::now();
    tls::verify_leaf(&new_ca, &data(&serving, "tls.crt"), &required, now).unwrap();
    assert!(tls::verify_leaf(&old_ca, &data(&serving, "tls.crt"), &required, now).is_err());

    // During the overlap, a client trusting only the bundle accepts the old leaf (still served)
    // and then the new one, which serve picks up from its files without a restart.
    assert_eq!(
        serve.admit(&bundle, SVC, &registration).await,
        Ok(true),
        "old leaf"
    );
    write_leaf(&serving, &certs);
    let mut served_new = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // A client trusting only the old CA fails once the new leaf is served.
        if serve.admit(&old_ca, SVC, &registration).await.is_err() {
            served_new = true;
            break;
        }
    }
    assert!(
        served_new,
        "serve never served the new leaf: {}",
        serve.log.lock().unwrap()
    );
    assert_eq!(
        serve.admit(&bundle, SVC, &registration).await,
        Ok(true),
        "new leaf"
    );
    assert_eq!(
        serve.admit(&new_ca, SVC_LOCAL, &registration).await,
        Ok(true)
    );

    // Nothing is due now: the next run only reads, and both CAs stay in the bundle.
    assert_ok(&api.run(&rotate).await);
    assert!(api.take_requests().iter().all(|r| r.starts_with("GET ")));
    assert_eq!(ca_bundle(&api.registration()), bundle);
}

/// The serving certificate alone is issued again (same CA, same caBundle) when it expires
/// within --renew-before, and when the Service it must be valid for changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_alone_is_reissued_when_due_or_for_another_service() {
    let api = FakeApi::start().await;
    assert_ok(
        &api.run(&["--leaf-validity", "1h", "--renew-before", "10m"])
            .await,
    );
    let ca_secret = api.secret(CA_SECRET);
    let registration = api.registration();
    let first = api.secret(TLS_SECRET);
    api.take_requests();
    let only_the_leaf = [
        format!("GET {SECRETS}/{CA_SECRET} 200"),
        format!("GET {REGISTRATION} 200"),
        format!("GET {SECRETS}/{TLS_SECRET} 200"),
        format!("PUT {SECRETS}/{TLS_SECRET} 200"),
    ];

    // 1 h left, renewed 70 m before expiry: due; the CA (5 years) is not.
    let out = api
        .run(&["--leaf-validity", "2h", "--renew-before", "70m"])
        .await;
    assert_ok(&out);
    assert_eq!(api.take_requests(), only_the_leaf, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("expires within --renew-before"),
        "{}",
        stderr(&out)
    );
    let second = api.secret(TLS_SECRET);
    assert_ne!(data(&second, "tls.crt"), data(&first, "tls.crt"));
    assert_ne!(
        data(&second, "tls.key"),
        data(&first, "tls.key"),
        "a new key too"
    );
    assert_eq!(api.secret(CA_SECRET), ca_secret);
    assert_eq!(api.registration(), registration);

    // Another Service name: the certificate must be for it.
    let out = api.run(&["--service", "webhook"]).await;
    assert_ok(&out);
    assert_eq!(api.take_requests(), only_the_leaf, "{}", stderr(&out));
    let third = api.secret(TLS_SECRET);
    let ca = data(&ca_secret, "ca.crt");
    let names = [
        "webhook.podmutator.svc".to_owned(),
        "webhook.podmutator.svc.cluster.local".to_owned(),
    ];
    let now = std::time::SystemTime::now();
    tls::verify_leaf(&ca, &data(&third, "tls.crt"), &names, now).unwrap();
    assert!(tls::verify_leaf(&ca, &data(&third, "tls.crt"), &[SVC.to_owned()], now).is_err());
    assert_ok(&api.run(&["--service", "webhook"]).await);
    assert!(api.take_requests().iter().all(|r| r.starts_with("GET ")));
}

/// The previous CA leaves the bundle (and the CA Secret) at the first run after its own
/// notAfter, and the serving certificate (already the new CA's) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_ca_is_dropped_at_the_first_run_after_it_expires() {
    let long = [
        "--ca-validity",
        "1h",
        "--leaf-validity",
        "1h",
        "--renew-before",
        "10m",
    ];
    // The second run must come while the first CA (valid 8 s) still is, to see the overlap. A
    // machine stalled past that (known once the run is over: the safe direction) proves nothing
    // either way, and the pair is run again against a fresh API server.
    let mut attempts = 0;
    let (api, old_ca, old_end) = loop {
        attempts += 1;
        let api = FakeApi::start().await;
        assert_ok(
            &api.run(&[
                "--ca-validity",
                "8s",
                "--leaf-validity",
                "8s",
                "--renew-before",
                "1s",
            ])
            .await,
        );
        let old_ca = data(&api.secret(CA_SECRET), "ca.crt");
        let old_end = tls::not_after(&old_ca).unwrap();
        let out = api.run(&long).await;
        assert_ok(&out);
        if time::OffsetDateTime::now_utc() < old_end {
            break (api, old_ca, old_end);
        }
        eprintln!("attempt {attempts}: more than 8 s between two runs; again");
        assert!(
            attempts < 5,
            "the machine took more than 8 s between two runs {attempts} times; the overlap could not be seen"
        );
    };
    let new_ca = data(&api.secret(CA_SECRET), "ca.crt");
    assert_eq!(
        ca_bundle(&api.registration()),
        [new_ca.clone(), old_ca].concat()
    );
    let serving = api.secret(TLS_SECRET);
    api.take_requests();

    let wait = old_end - time::OffsetDateTime::now_utc() + time::Duration::milliseconds(1100);
    tokio::time::sleep(wait.try_into().unwrap_or_default()).await;
    let out = api.run(&long).await;
    assert_ok(&out);
    assert_eq!(
        api.take_requests(),
        [
            format!("GET {SECRETS}/{CA_SECRET} 200"),
            format!("PUT {SECRETS}/{CA_SECRET} 200"),
            format!("GET {REGISTRATION} 200"),
            format!("PUT {REGISTRATION} 200"),
            format!("GET {SECRETS}/{TLS_SECRET} 200"),
        ],
        "{}",
        stderr(&out)
    );
    assert_eq!(ca_bundle(&api.registration()), new_ca);
    let ca_secret = api.secret(CA_SECRET);
    assert!(
        ca_secret["data"].get("previous-ca.crt").is_none(),
        "{}",
        stderr(&out)
    );
    assert_eq!(data(&ca_secret, "ca.crt"), new_ca);
    assert_eq!(api.secret(TLS_SECRET), serving);
    assert_ok(&api.run(&long).await);
    assert!(api.take_requests().iter().all(|r| r.starts_with("GET ")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_a_clear_error_and_nothing_is_written() {
    let api = FakeApi::start().await;
    let wrong = api.dir.join("wrong-token");
    std::fs::write(&wrong, "not-the-token-4f1e8a").unwrap();
    let out = api.run_with_token(&wrong, &[]).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("GET Secret {NS}/{CA_SECRET}: HTTP 401")),
        "{err}"
    );
    assert!(
        err.contains("refused the token in") && err.contains("wrong-token"),
        "{err}"
    );
    assert!(
        !err.contains("not-the-token-4f1e8a"),
        "the token in the error: {err}"
    );
    assert_eq!(
        api.take_requests(),
        [format!("GET {SECRETS}/{CA_SECRET} 401")]
    );
    assert!(api.secret(CA_SECRET).is_null());

    // A token file that is not there says so, before any request.
    let out = api.run_with_token(&api.dir.join("absent"), &[]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot read the token"),
        "{}",
        stderr(&out)
    );
    assert!(api.take_requests().is_empty());
}

/// Another writer changes the registration between the run's GET and PUT: the PUT meets 409,
/// the run reads it again and puts the caBundle into the newer version, keeping the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_registration_write_is_read_again_and_retried() {
    let api = FakeApi::start().await;
    api.state.lock().unwrap().interfere = Some(REGISTRATION.into());
    let out = api.run(&[]).await;
    assert_ok(&out);
    // Two Secrets and the registration: the refused PUT wrote nothing.
    assert!(
        stderr(&out).contains("done, 3 objects written"),
        "{}",
        stderr(&out)
    );
    let requests = api.take_requests();
    let registration_calls: Vec<&String> = requests
        .iter()
        .filter(|r| r.contains(REGISTRATION))
        .collect();
    assert_eq!(
        registration_calls,
        [
            &format!("GET {REGISTRATION} 200"),
            &format!("PUT {REGISTRATION} 409"),
            &format!("GET {REGISTRATION} 200"),
            &format!("PUT {REGISTRATION} 200"),
        ]
    );
    let registration = api.registration();
    assert_eq!(
        registration["metadata"]["labels"]["changed-by"],
        "another-writer"
    );
    assert_eq!(
        ca_bundle(&registration),
        data(&api.secret(CA_SECRET), "ca.crt")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_names_the_rbac_verb_and_resource_and_fails() {
    let api = FakeApi::start().await;
    let cases = [
        (
            "POST",
            SECRETS.to_owned(),
            "secrets is forbidden: User \"system:serviceaccount:podmutator:podmutator-certs\" cannot create resource \"secrets\" in API group \"\" in the namespace \"podmutator\"",
            "`create` on secrets",
        ),
        (
            "PUT",
            REGISTRATION.to_owned(),
            "mutatingwebhookconfigurations.admissionregistration.k8s.io \"podmutator\" is forbidden: User \"system:serviceaccount:podmutator:podmutator-certs\" cannot update resource \"mutatingwebhookconfigurations\" in API group \"admissionregistration.k8s.io\" at the cluster scope",
            "`update` on mutatingwebhookconfigurations.admissionregistration.k8s.io",
        ),
    ];
    for (method, path, message, wanted) in cases {
        api.state
            .lock()
            .unwrap()
            .faults
            .push((method.into(), path.clone(), 403, message.into()));
        let out = api.run(&[]).await;
        assert!(!out.status.success(), "{method} {path}");
        let err = stderr(&out);
        assert!(err.contains("HTTP 403"), "{err}");
        assert!(err.contains(wanted), "{err}");
        assert!(err.contains("overlays/self-managed-ca"), "{err}");
        if method == "PUT" {
            // What the run did before the refusal is in the Job's log too.
            assert!(err.contains(": created (CA valid until "), "{err}");
        }
        assert!(
            api.take_requests()
                .contains(&format!("{method} {path} 403"))
        );
    }
    // The registration was never written, so it trusts nothing yet.
    assert!(
        api.registration()["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none()
    );
    // Once allowed, the next run completes what was left.
    assert_ok(&api.run(&[]).await);
    assert_eq!(
        ca_bundle(&api.registration()),
        data(&api.secret(CA_SECRET), "ca.crt")
    );
}

/// Something other than the API server answers 200 (a proxy's page): the run stops saying so,
/// and writes nothing, where it read the page as a CA Secret without `ca.crt` and advised
/// deleting the Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_no_kubernetes_object_stops_the_run() {
    let api = FakeApi::start().await;
    assert_ok(&api.run(&[]).await);
    api.take_requests();
    let path = format!("{SECRETS}/{CA_SECRET}");
    api.state.lock().unwrap().faults.push((
        "GET".into(),
        path.clone(),
        200,
        "<html>Sign in to the proxy</html>".into(),
    ));
    let out = api.run(&[]).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("HTTP 200 with an answer that is not a Kubernetes object")
            && err.contains("--api-server")
            && !err.contains("Delete it"),
        "{err}"
    );
    assert_eq!(api.take_requests(), [format!("GET {path} 200")]);
}

/// Without the registration (not applied yet, or removed first) a run fails naming it, and
/// issues no serving certificate for a webhook nothing calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_registration_fails_the_run_before_any_serving_certificate() {
    let api = FakeApi::start().await;
    api.state.lock().unwrap().objects.remove(REGISTRATION);
    let out = api.run(&[]).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("GET MutatingWebhookConfiguration podmutator: HTTP 404")
            && err.contains("apply the install"),
        "{err}"
    );
    assert!(api.secret(TLS_SECRET).is_null());
    assert!(!api.take_requests().iter().any(|r| r.contains(TLS_SECRET)));
}

/// A registration whose webhooks are not objects with a `clientConfig` (edited by hand, another
/// tool's) fails the run naming the entry, with exit 1, and is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_registration_is_named_not_written() {
    let api = FakeApi::start().await;
    for (webhooks, says) in [
        (
            json!(["x"]),
            "webhooks[0] is not a webhook with a clientConfig",
        ),
        (
            json!([{"name": "a", "clientConfig": {}}, {"name": "b"}]),
            "webhooks[1] is not a webhook with a clientConfig",
        ),
    ] {
        api.state
            .lock()
            .unwrap()
            .objects
            .get_mut(REGISTRATION)
            .unwrap()["webhooks"] = webhooks;
        let out = api.run(&[]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
        assert!(
            !api.take_requests()
                .iter()
                .any(|r| r.starts_with(&format!("PUT {REGISTRATION}")))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_that_would_renew_at_every_run_are_refused_before_any_request() {
    let api = FakeApi::start().await;
    let out = api
        .run(&["--leaf-validity", "1h", "--renew-before", "2h"])
        .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--renew-before (7200 s) must be shorter than --leaf-validity"),
        "{}",
        stderr(&out)
    );
    assert!(api.take_requests().is_empty());
    // A Service name that cannot make the certificate's DNS names.
    for (args, says) in [(&["--service", "a..b"][..], "--service")] {
        let out = api.run(args).await;
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains(says) && err.contains("is not a Kubernetes name"),
            "{err}"
        );
        assert!(api.take_requests().is_empty(), "{args:?}");
    }
}

/// `certs` copied whatever `previous-ca.crt` held into every caBundle, and the API
/// server trusts whatever a caBundle holds. A leaf certificate, a chain, or text that is no
/// certificate in that key is now dropped at the next run, with the reason, and the bundle holds
/// the current CA alone; a `ca.crt` that is not a CA certificate stops the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_ca_that_is_not_one_ca_certificate_never_reaches_the_ca_bundle() {
    let api = FakeApi::start().await;
    assert_ok(&api.run(&[]).await);
    let ca = data(&api.secret(CA_SECRET), "ca.crt");
    let leaf = data(&api.secret(TLS_SECRET), "tls.crt");
    let cases: [(&[u8], &str); 3] = [
        (&leaf, "not a CA certificate"),
        (
            &[ca.clone(), leaf.clone()].concat(),
            "2 certificates where one CA belongs",
        ),
        (
            b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
            "not a certificate",
        ),
    ];
    for (written, why) in cases {
        api.set_secret_data(CA_SECRET, "previous-ca.crt", written);
        let out = api.run(&[]).await;
        assert_ok(&out);
        let said = stderr(&out);
        assert!(
            said.contains(&format!("previous CA dropped (previous-ca.crt: {why}")),
            "{said}"
        );
        assert_eq!(
            ca_bundle(&api.registration()),
            ca,
            "{why}: the bundle holds the current CA alone"
        );
        assert!(
            api.secret(CA_SECRET)["data"]
                .get("previous-ca.crt")
                .is_none(),
            "{why}"
        );
    }
    // A leaf where the CA belongs is not a CA this command wrote: the run stops, naming it.
    api.set_secret_data(CA_SECRET, "ca.crt", &leaf);
    let out = api.run(&[]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("ca.crt: not a CA certificate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(ca_bundle(&api.registration()), ca, "nothing was written");
}

/// docs/cli.md's `certs` and `serve` commands, as written, each where it is meant to run.
/// `certs` in a pod's environment: the API server from `KUBERNETES_SERVICE_HOST`/`_PORT` and
/// the namespace from the file beside the token, as in a pod; only the token's and the CA's
/// paths, which a test cannot write under /var/run, come from their variables. It creates both
/// Secrets and sets the caBundle. `serve --config config/local.yaml` in a copy of the project's
/// demo config: its port moved to a free one (`PODMUTATOR_CONFIG`, merged over the file), it
/// answers the README's review of a Flyte task pod with the secret injected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_md_certs_and_serve_run_as_written() {
    let commands = crate::cli::doc_sh_commands("docs/cli.md");
    let pick = |prefix: &str| {
        let found: Vec<&String> = commands.iter().filter(|c| c.starts_with(prefix)).collect();
        assert_eq!(
            found.len(),
            1,
            "one {prefix:?} command in docs/cli.md: {commands:?}"
        );
        found[0].clone()
    };
    let (certs, serve) = (pick("podmutator certs"), pick("podmutator serve"));
    let bin = common::temp_dir("cli-md-bin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podmutator"), bin.join("podmutator")).unwrap();
    let bash = |command: &str, dir: &Path| {
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", &format!("exec {command}")])
            .current_dir(dir)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()));
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("PODMUTATOR_")
                || name.starts_with("KUBERNETES_")
                || name == "POD_NAMESPACE"
                || name == "AWS_LAMBDA_RUNTIME_API"
            {
                cmd.env_remove(name.as_ref());
            }
        }
        cmd
    };

    let api = FakeApi::start().await;
    std::fs::write(api.dir.join("namespace"), NS).unwrap();
    let out = tokio::process::Command::from({
        let mut cmd = bash(&certs, &api.dir);
        cmd.env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", api.port.to_string())
            .env("PODMUTATOR_API_TOKEN_FILE", api.dir.join("token"))
            .env("PODMUTATOR_API_CA_FILE", api.dir.join("api-ca.crt"));
        cmd
    })
    .output()
    .await
    .unwrap();
    assert_ok(&out);
    assert_no_keys(&api, &out);
    let ca = data(&api.secret(CA_SECRET), "ca.crt");
    assert_eq!(data(&api.secret(TLS_SECRET), "ca.crt"), ca);
    assert_eq!(
        ca_bundle(&api.registration()),
        ca,
        "every caBundle is the CA"
    );

    let demo = common::temp_dir("cli-md-serve");
    std::fs::create_dir_all(demo.join("config")).unwrap();
    std::fs::copy(
        common::root().join("config/local.yaml"),
        demo.join("config/local.yaml"),
    )
    .unwrap();
    let port = common::free_port();
    let (child, log) = common::spawn_serve(bash(&serve, &demo).env(
        "PODMUTATOR_CONFIG",
        json!({"webhook": {"listenPort": port}, "http": {"drainSeconds": 0}}).to_string(),
    ))
    .await;
    // Stopped (SIGTERM) when dropped.
    let serving = Serve { child, port, log };
    let review =
        std::fs::read(common::root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"))
            .unwrap();
    let (status, body) = common::https_request(
        serving.port,
        &std::fs::read(demo.join(".certs/ca.crt")).unwrap(),
        "localhost",
        "POST",
        "/mutate--v1-pod",
        Some("application/json"),
        &review,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let response = common::response(&body);
    assert_eq!(response["allowed"], true, "{response}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    assert!(
        String::from_utf8(patch).unwrap().contains("_UNION_"),
        "the secret is injected under config/local.yaml's prefix"
    );
}
