//! `podmutator certs`: the self-managed certificates of the in-cluster install. One run (a Job
//! at install, a CronJob after) keeps three objects consistent through the Kubernetes API:
//!
//! 1. the CA Secret (`ca.crt`, `ca.key`, and `previous-ca.crt` while the CA it replaced can
//!    still verify anything): created when absent, replaced when it expires within
//!    `--renew-before`;
//! 2. every webhook's `caBundle` in the registration: the current CA, plus the previous one
//!    until its own `notAfter` (nothing it signed verifies after that);
//! 3. the serving Secret `serve` mounts (`tls.crt`, `tls.key`, `ca.crt`): issued again when
//!    absent, not signed by the current CA, not for the Service's names, or expiring within
//!    `--renew-before`.
//!
//! In that order: the CA's key is stored before anything trusts it, and the registration trusts
//! a new CA before a leaf it signed is written. A run with nothing due only reads.
//! Expiry is read from the certificates themselves ([`tls::not_after`], and the leaf is checked
//! as a TLS client checks it, at now + `--renew-before`, [`tls::verify_leaf`]).
//!
//! Not `kube`'s client: three kinds of REST call (get, create, update) with the pod's
//! service-account token need neither its kubeconfig loading nor its tower and TLS stacks. Not
//! `humantime` for the durations: it also reads calendar units (`1year 2months`) whose length
//! varies; `90d`, `720h`, `30m` and `45s` are what is meant. One client stack is not shared with
//! the registry lookup's (`crates/aws`), which pools connections to many hosts with the system's
//! roots: this one makes a few calls to one host trusting only the cluster's CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use http_body_util::BodyExt as _;
use hyper::header;
use serde_json::{Value, json};
use tokio_rustls::rustls;

use crate::transport::tls::{self, CA_CERT};

/// Where the kubelet mounts a pod's service account token and the cluster's CA.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const CA_KEY: &str = "ca.key";
/// The CA certificate a rotation replaced (never its key), kept for the overlap.
const PREVIOUS_CA: &str = "previous-ca.crt";
/// One request, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A registration or Secret is a few kilobytes; anything far larger is not what was asked for.
const MAX_RESPONSE_BYTES: usize = 4 << 20;
/// PUTs of the registration that meet a newer version (409) before giving up.
const CONFLICT_ATTEMPTS: usize = 5;

const AFTER_HELP: &str = "\
Each run is idempotent: with nothing due it only reads (GET). In a pod every option has a working
default except the namespace, which the pod's own is (POD_NAMESPACE, else the service account's
namespace file). Durations: a number and s, m, h or d (90d, 720h).
RBAC: get/create/update on the two Secrets, get/update on the MutatingWebhookConfiguration
(deploy/kubernetes/overlays/self-managed-ca).";

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct CertsArgs {
    /// The API server, https://HOST[:PORT] [default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT]
    #[arg(long, value_name = "URL", env = "PODMUTATOR_API_SERVER")]
    pub api_server: Option<String>,
    /// The bearer token, read at every run (a projected service account token rotates)
    #[arg(
        long,
        value_name = "FILE",
        env = "PODMUTATOR_API_TOKEN_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,
    /// The CA the API server's certificate must chain to
    #[arg(
        long,
        value_name = "FILE",
        env = "PODMUTATOR_API_CA_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )]
    pub api_ca_file: PathBuf,
    /// Namespace of the Service and both Secrets [default: the service account's namespace file]
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The Service the registration calls: the certificate is for <SERVICE>.<NAMESPACE>.svc
    #[arg(long, value_name = "NAME", default_value = "podmutator", value_parser = dns_label)]
    pub service: String,
    /// The MutatingWebhookConfiguration whose every webhook gets the caBundle
    #[arg(long, value_name = "NAME", default_value = "podmutator")]
    pub webhook_config: String,
    /// The Secret holding the CA and its key (never mounted by the webhook)
    #[arg(long, value_name = "NAME", default_value = "podmutator-ca")]
    pub ca_secret: String,
    /// The Secret serve mounts (kubernetes.io/tls: tls.crt, tls.key, ca.crt)
    #[arg(long, value_name = "NAME", default_value = "podmutator-tls")]
    pub tls_secret: String,
    /// How long a new CA is valid
    #[arg(long, value_name = "DURATION", default_value = "1825d", value_parser = parse_duration)]
    pub ca_validity: Duration,
    /// How long a new serving certificate is valid (never past its CA)
    #[arg(long, value_name = "DURATION", default_value = "90d", value_parser = parse_duration)]
    pub leaf_validity: Duration,
    /// Replace a CA or serving certificate that expires within this; shorter than both
    /// validities
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_duration)]
    pub renew_before: Duration,
}

/// `90d`, `720h`, `30m`, `45s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?}: a number and s, m, h or d (90d, 720h)");
    // The unit is the last character, whatever its width (`90é`), not the last byte.
    let mut chars = text.chars();
    let seconds = match chars.next_back() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(bad()),
    };
    let number = chars.as_str();
    let n: u64 = number.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(format!("{text:?}: must be more than zero"));
    }
    n.checked_mul(seconds)
        .filter(|s| *s <= 100 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: at most 100 years"))
}

/// Why a run stopped. Messages name the object, the request and what to change; they never
/// hold key material (a Secret's body is never part of one).
#[derive(Debug, thiserror::Error)]
#[error("certs: {0}")]
pub struct CertsError(String);

/// A [`CertsError`] from `format!`'s arguments.
macro_rules! err {
    ($($arg:tt)*) => {
        CertsError(format!($($arg)*))
    };
}

/// What a run changed, in order, or what it found current.
#[derive(Debug, Default)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub writes: usize,
}

/// One object of the API: where it is, how the errors name it, and the RBAC resource.
struct Object {
    path: String,
    collection: String,
    what: String,
    resource: &'static str,
    /// A Secret's error bodies are not echoed (only their reason): the message of a refused
    /// write could quote what was sent.
    secret: bool,
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl Object {
    fn secret(namespace: &str, name: &str) -> Self {
        let collection = format!("/api/v1/namespaces/{namespace}/secrets");
        Self {
            path: format!("{collection}/{name}"),
            collection,
            what: format!("Secret {namespace}/{name}"),
            resource: "secrets",
            secret: true,
        }
    }

    fn registration(name: &str) -> Self {
        let collection = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
        Self {
            path: format!("{collection}/{name}"),
            collection: collection.into(),
            what: format!("MutatingWebhookConfiguration {name}"),
            resource: "mutatingwebhookconfigurations.admissionregistration.k8s.io",
            secret: false,
        }
    }
}

/// A Kubernetes API client for the few requests a run makes: HTTP/1.1 over rustls, trusting
/// only the given CA, one connection per request.
struct Api {
    /// `HOST:PORT`: where to connect, and the `Host` header.
    authority: String,
    server_name: rustls::pki_types::ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    token: String,
    token_file: PathBuf,
}

impl Api {
    fn new(args: &CertsArgs) -> Result<Self, CertsError> {
        let url = match &args.api_server {
            Some(url) => url.clone(),
            None => in_cluster_url(|k| std::env::var(k).ok())?,
        };
        let (host, port) = parse_url(&url)?;
        let server_name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| err!("--api-server {url}: {e}"))?;
        let ca_file = args.api_ca_file.display();
        let ca = std::fs::read(&args.api_ca_file)
            .map_err(|e| err!("cannot read the API server's CA {ca_file}: {e}"))?;
        let roots = tls::root_store(
            &ca,
            &format!("{ca_file} is not PEM"),
            &format!("{ca_file}: not a usable CA"),
        )
        .map_err(CertsError)?;
        if roots.is_empty() {
            return Err(err!("{ca_file} holds no certificate"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err!("{e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let token_file = args.token_file.display();
        let token = std::fs::read_to_string(&args.token_file)
            .map_err(|e| err!("cannot read the token {token_file}: {e}"))?
            .trim()
            .to_owned();
        if token.is_empty() {
            return Err(err!("the token {token_file} is empty"));
        }
        Ok(Self {
            authority: authority(&host, port),
            server_name,
            tls: Arc::new(tls),
            token,
            token_file: args.token_file.clone(),
        })
    }

    /// One request: (status, body as JSON, or null when it is not JSON).
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let tcp = tokio::net::TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.authority))?;
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", self.authority))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP with {}: {e}", self.authority))?;
        let driver = tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token));
        let mut bytes = Vec::new();
        if let Some(v) = body {
            bytes = serde_json::to_vec(v).map_err(|e| e.to_string())?;
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(http_body_util::Full::new(hyper::body::Bytes::from(bytes)))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP with {}: {e}", self.authority))?;
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer from {}: {e}", self.authority))?
            .to_bytes();
        driver.abort();
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// `method` on `object` (its collection for POST); 200 and 201 are answers, so is 404 for a
    /// GET and 409 for a PUT (the caller decides); anything else is an error that says what
    /// to fix.
    async fn request(
        &self,
        method: &str,
        object: &Object,
        body: Option<&Value>,
    ) -> Result<(u16, Value), CertsError> {
        let path = if method == "POST" {
            &object.collection
        } else {
            &object.path
        };
        let (status, answer) = tokio::time::timeout(REQUEST_TIMEOUT, self.call(method, path, body))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())))
            .map_err(|e| err!("{method} {object}: {e}"))?;
        match (method, status) {
            // A proxy's page, or another server at --api-server: nothing here is to be read as
            // an object that lacks its keys (which would say "delete it").
            (_, 200 | 201) if !answer.is_object() => Err(err!(
                "{method} {object}: HTTP {status} with an answer that is not a Kubernetes object: is {} the cluster's API server (--api-server)?",
                self.authority
            )),
            (_, 200 | 201) | ("GET", 404) | ("PUT", 409) => Ok((status, answer)),
            _ => Err(self.refused(method, object, status, &answer)),
        }
    }

    fn refused(&self, method: &str, object: &Object, status: u16, answer: &Value) -> CertsError {
        let verb = match method {
            "GET" => "get",
            "POST" => "create",
            "PUT" => "update",
            other => other,
        };
        let reason = answer["reason"].as_str().unwrap_or("");
        let message = answer["message"].as_str().unwrap_or("");
        let said = match (object.secret, message.is_empty()) {
            (false, false) => format!(": {}", message.chars().take(400).collect::<String>()),
            _ if !reason.is_empty() => format!(" ({reason})"),
            _ => String::new(),
        };
        let hint = match status {
            401 => format!(
                "the API server refused the token in {} (expired, revoked, or not this cluster's)",
                self.token_file.display()
            ),
            403 => format!(
                "the service account is probably missing RBAC verb `{verb}` on {} (see the Role and ClusterRole of deploy/kubernetes/overlays/self-managed-ca)",
                object.resource
            ),
            404 => format!(
                "{object} does not exist: apply the install (kubectl apply -k) before running certs"
            ),
            409 => {
                "it already exists (another run created it at the same moment); run again".into()
            }
            _ => "the API server refused the request".into(),
        };
        err!("{method} {object}: HTTP {status}{said}: {hint}")
    }
}

/// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, as every pod has them.
fn in_cluster_url(env: impl Fn(&str) -> Option<String>) -> Result<String, CertsError> {
    match (
        env("KUBERNETES_SERVICE_HOST"),
        env("KUBERNETES_SERVICE_PORT"),
    ) {
        (Some(host), Some(port)) if !host.is_empty() && !port.is_empty() => {
            Ok(format!("https://{}", authority(&host, port)))
        }
        _ => Err(err!(
            "no API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset (they are set in every pod); outside a pod pass --api-server https://HOST:PORT"
        )),
    }
}

/// `HOST:PORT`, an IPv6 host in brackets.
fn authority(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// (host, port) of `https://HOST[:PORT][/]`; an IPv6 host is written in brackets.
fn parse_url(text: &str) -> Result<(String, u16), CertsError> {
    let bad = |why: &str| err!("--api-server {text:?}: {why} (https://HOST[:PORT])");
    let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
    if url.scheme() != "https" {
        return Err(bad("only https is accepted"));
    }
    if url.path() != "/" || !url.username().is_empty() || url.password().is_some() {
        return Err(bad("no path or user info"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("no query or fragment"));
    }
    let host = match url.host() {
        // Without the brackets: the name the certificate is checked against.
        Some(url::Host::Ipv6(address)) => address.to_string(),
        Some(host) => host.to_string(),
        None => return Err(bad("no host")),
    };
    Ok((host, url.port().unwrap_or(443)))
}

/// A Service's or namespace's name: what the certificate's DNS names are made of.
fn dns_label(s: &str) -> Result<String, String> {
    use podmutator_core::k8s_names::{DNS_LABEL_RULE, is_dns_label};
    is_dns_label(s)
        .then(|| s.to_owned())
        .ok_or_else(|| format!("{s:?} is not a Kubernetes name: {DNS_LABEL_RULE}"))
}

fn namespace(args: &CertsArgs) -> Result<String, CertsError> {
    if let Some(ns) = args.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        return dns_label(ns).map_err(|e| err!("--namespace: {e}"));
    }
    let file = args
        .token_file
        .parent()
        .unwrap_or(Path::new(SA_DIR))
        .join("namespace");
    std::fs::read_to_string(&file)
        .map(|ns| ns.trim().to_owned())
        .ok()
        .filter(|ns| !ns.is_empty())
        .ok_or_else(|| {
            err!(
                "no namespace: set --namespace or POD_NAMESPACE (in a pod: the downward API's metadata.namespace), or mount {}",
                file.display()
            )
        })
}

/// The serving certificate's names: the Service as the API server calls it (`.svc`, which is
/// also the common name, and `.svc.cluster.local`), and the shorter forms in-cluster clients use.
fn leaf_names(service: &str, namespace: &str) -> (Vec<String>, Vec<String>) {
    let required = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    let all = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        required[1].clone(),
        required[0].clone(),
    ];
    (all, required)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `data.<key>` of a Secret, decoded; `None` when absent or not base64.
fn data(secret: &Value, key: &str) -> Option<Vec<u8>> {
    let text = secret["data"][key].as_str()?;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// Writes the Secret `name` in `namespace` holding `data`: a new one of `type_` when it was
/// absent (`existing` is `None`), else `existing` with its data replaced, its metadata
/// (resourceVersion included) kept, so the PUT fails with 409 if it changed since it was read;
/// that failure's message ends with `after_conflict`.
async fn write_secret(
    api: &Api,
    namespace: &str,
    name: &str,
    existing: Option<&Value>,
    type_: &str,
    data: &[(&str, &[u8])],
    after_conflict: &str,
) -> Result<(), CertsError> {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String(b64(v))))
        .collect();
    let object = &Object::secret(namespace, name);
    let Some(existing) = existing else {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/name": "podmutator",
                    "app.kubernetes.io/part-of": "podmutator",
                    "app.kubernetes.io/managed-by": "podmutator-certs",
                },
            },
            "type": type_,
            "data": data,
        });
        api.request("POST", object, Some(&body)).await?;
        return Ok(());
    };
    let mut body = existing.clone();
    body["data"] = Value::Object(data);
    let (status, _) = api.request("PUT", object, Some(&body)).await?;
    if status == 409 {
        return Err(err!(
            "PUT {object}: HTTP 409: it changed while this run read it (another run at the same moment?); {after_conflict}"
        ));
    }
    Ok(())
}

/// The CA a run works with.
struct Ca {
    cert: String,
    key: String,
    not_after: time::OffsetDateTime,
    /// The CA this one replaced, while it can still verify anything.
    previous: Option<String>,
}

impl Ca {
    /// What goes into every `caBundle`: the current CA, then the previous one.
    fn bundle(&self) -> String {
        let mut bundle = self.cert.clone();
        if let Some(previous) = &self.previous {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(previous);
        }
        bundle
    }
}

/// One run; see the module's documentation.
pub async fn run(args: &CertsArgs, out: &mut Outcome) -> Result<(), CertsError> {
    for (flag, validity) in [
        ("--ca-validity", args.ca_validity),
        ("--leaf-validity", args.leaf_validity),
    ] {
        if args.renew_before >= validity {
            return Err(err!(
                "--renew-before ({} s) must be shorter than {flag} ({} s): every run would replace the certificate again",
                args.renew_before.as_secs(),
                validity.as_secs()
            ));
        }
    }
    let namespace = namespace(args)?;
    let api = Api::new(args)?;
    let now = time::OffsetDateTime::now_utc();
    let ca = ensure_ca(&api, args, &namespace, now, out).await?;
    ensure_bundle(&api, args, &ca, out).await?;
    ensure_leaf(&api, args, &namespace, &ca, now, out).await
}

async fn ensure_ca(
    api: &Api,
    args: &CertsArgs,
    namespace: &str,
    now: time::OffsetDateTime,
    out: &mut Outcome,
) -> Result<Ca, CertsError> {
    let object = Object::secret(namespace, &args.ca_secret);
    let (status, existing) = api.request("GET", &object, None).await?;
    // A new CA, and the one it replaces while that can still verify anything.
    let new_ca = |previous: Option<String>| -> Result<Ca, CertsError> {
        let not_after = now + args.ca_validity;
        let (cert, key) =
            tls::generate_ca(not_after).map_err(|e| err!("cannot generate a CA: {e}"))?;
        Ok(Ca {
            // As written: the certificate holds whole seconds.
            not_after: tls::not_after(cert.as_bytes()).unwrap_or(not_after),
            cert,
            key,
            previous,
        })
    };
    let (ca, why) = if status == 404 {
        (new_ca(None)?, "created".to_owned())
    } else {
        let unusable = |what: &str| {
            err!(
                "{object}: {what}; it is not a CA this command wrote. Delete it to have a new CA made (the registration and the serving certificate follow in the same run)"
            )
        };
        let text = |key: &str| {
            data(&existing, key)
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| unusable(&format!("no {key}")))
        };
        let cert = text(CA_CERT)?;
        let key = text(CA_KEY)?;
        let not_after = tls::ca_not_after(cert.as_bytes())
            .map_err(|why| unusable(&format!("{}: {why}", CA_CERT)))?;
        // The previous CA stays until its own notAfter (past it nothing it signed verifies),
        // and only if it is one CA certificate: the API server trusts whatever the caBundle
        // holds, so a leaf, a chain or anything else written there is dropped, not copied.
        let (previous, dropped) = match data(&existing, PREVIOUS_CA) {
            None => (None, None),
            Some(bytes) => match tls::ca_not_after(&bytes) {
                Ok(end) if end > now => (String::from_utf8(bytes).ok(), None),
                Ok(_) => (None, Some("expired".to_owned())),
                Err(why) => (None, Some(why)),
            },
        };
        if not_after - now <= args.renew_before {
            let why = if not_after > now {
                format!(
                    "rotated (the previous CA expires {}, within --renew-before; it stays in the caBundle until then)",
                    tls::rfc3339(not_after)
                )
            } else {
                format!(
                    "replaced (the previous CA expired {}: nothing it signed verifies, it is not kept)",
                    tls::rfc3339(not_after)
                )
            };
            (new_ca((not_after > now).then_some(cert))?, why)
        } else {
            // `previous` is None whenever something was dropped.
            let ca = Ca {
                cert,
                key,
                not_after,
                previous,
            };
            let Some(why) = dropped else {
                out.lines.push(format!(
                    "{object}: current (CA valid until {})",
                    tls::rfc3339(not_after)
                ));
                return Ok(ca);
            };
            (ca, format!("previous CA dropped ({PREVIOUS_CA}: {why})"))
        }
    };
    let mut fields: Vec<(&str, &[u8])> =
        vec![(CA_CERT, ca.cert.as_bytes()), (CA_KEY, ca.key.as_bytes())];
    if let Some(previous) = &ca.previous {
        fields.push((PREVIOUS_CA, previous.as_bytes()));
    }
    write_secret(
        api,
        namespace,
        &args.ca_secret,
        (status != 404).then_some(&existing),
        "Opaque",
        &fields,
        "nothing else was changed, run again",
    )
    .await?;
    out.writes += 1;
    out.lines.push(format!(
        "{object}: {why} (CA valid until {})",
        tls::rfc3339(ca.not_after)
    ));
    Ok(ca)
}

async fn ensure_bundle(
    api: &Api,
    args: &CertsArgs,
    ca: &Ca,
    out: &mut Outcome,
) -> Result<(), CertsError> {
    let object = Object::registration(&args.webhook_config);
    let bundle = ca.bundle();
    let encoded = b64(bundle.as_bytes());
    for attempt in 1..=CONFLICT_ATTEMPTS {
        let (status, mut registration) = api.request("GET", &object, None).await?;
        if status == 404 {
            return Err(api.refused("GET", &object, 404, &registration));
        }
        let Some(hooks) = registration["webhooks"].as_array_mut() else {
            return Err(err!("{object} has no webhooks: nothing to give the CA to"));
        };
        if let Some(i) = hooks.iter().position(|w| !w["clientConfig"].is_object()) {
            return Err(err!(
                "{object}: webhooks[{i}] is not a webhook with a clientConfig: not a registration this command can give the CA to; apply the install's"
            ));
        }
        let current = |w: &Value| {
            w["clientConfig"]["caBundle"]
                .as_str()
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                .is_some_and(|b| b == bundle.as_bytes())
        };
        if hooks.iter().all(current) {
            out.lines.push(format!(
                "{object}: every caBundle current ({} webhooks)",
                hooks.len()
            ));
            return Ok(());
        }
        for w in hooks.iter_mut() {
            w["clientConfig"]["caBundle"] = Value::String(encoded.clone());
        }
        let n = hooks.len();
        let (status, _) = api.request("PUT", &object, Some(&registration)).await?;
        if status != 409 {
            out.writes += 1;
            out.lines.push(format!(
                "{object}: caBundle of {n} webhooks set ({} CAs)",
                1 + usize::from(ca.previous.is_some())
            ));
            return Ok(());
        }
        out.lines.push(format!(
            "{object}: changed meanwhile (HTTP 409), read again (attempt {attempt} of {CONFLICT_ATTEMPTS})"
        ));
    }
    Err(err!(
        "PUT {object}: HTTP 409 {CONFLICT_ATTEMPTS} times: something else keeps changing it; its caBundle is not set"
    ))
}

async fn ensure_leaf(
    api: &Api,
    args: &CertsArgs,
    namespace: &str,
    ca: &Ca,
    now: time::OffsetDateTime,
    out: &mut Outcome,
) -> Result<(), CertsError> {
    let object = Object::secret(namespace, &args.tls_secret);
    let (names, required) = leaf_names(&args.service, namespace);
    let (status, existing) = api.request("GET", &object, None).await?;
    let renew_at = SystemTime::now() + args.renew_before;
    let cert = data(&existing, tls::TLS_CERT).unwrap_or_default();
    let verify = |cert: &[u8], at| tls::verify_leaf(ca.cert.as_bytes(), cert, &required, at);
    let key = data(&existing, tls::TLS_KEY).unwrap_or_default();
    let due = if status == 404 {
        Some("absent".to_owned())
    } else if let Err(why) = verify(&cert, SystemTime::now()) {
        Some(format!(
            "tls.crt is not a valid certificate of the current CA for {} ({why})",
            required.join(" and ")
        ))
    } else if verify(&cert, renew_at).is_err() {
        Some("it expires within --renew-before".into())
    } else if tls::is_pair(&cert, &key).is_err() {
        Some("tls.key is not tls.crt's key".into())
    } else if data(&existing, CA_CERT).as_deref() != Some(ca.cert.as_bytes()) {
        Some("ca.crt is not the current CA".into())
    } else {
        None
    };
    let Some(why) = due else {
        out.lines.push(format!(
            "{object}: current (valid until {})",
            tls::not_after(&cert).map_or_else(|| "?".into(), tls::rfc3339)
        ));
        return Ok(());
    };
    let not_after = (now + args.leaf_validity).min(ca.not_after);
    let (cert, key) = tls::issue_leaf(&ca.cert, &ca.key, &names, not_after)
        .map_err(|e| err!("cannot issue the serving certificate: {e}"))?;
    // A ca.key that is not ca.crt's key signs leaves no client accepts: stop before serving one.
    verify(cert.as_bytes(), SystemTime::now()).map_err(|e| {
        err!(
            "Secret {namespace}/{}: ca.key does not sign what ca.crt verifies ({e}); delete that Secret to have a new CA made",
            args.ca_secret
        )
    })?;
    let fields: [(&str, &[u8]); 3] = [
        (tls::TLS_CERT, cert.as_bytes()),
        (tls::TLS_KEY, key.as_bytes()),
        (CA_CERT, ca.cert.as_bytes()),
    ];
    write_secret(
        api,
        namespace,
        &args.tls_secret,
        (status != 404).then_some(&existing),
        "kubernetes.io/tls",
        &fields,
        "run again",
    )
    .await?;
    out.writes += 1;
    out.lines.push(format!(
        "{object}: issued for {} ({why}; valid until {})",
        required[0],
        tls::rfc3339(tls::not_after(cert.as_bytes()).unwrap_or(not_after))
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_and_refuse_the_rest() {
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_duration("720h"), Ok(Duration::from_secs(720 * 3600)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        for bad in [
            "",
            "d",
            "90",
            "90x",
            "90é",
            "é",
            "9é0d",
            "-1d",
            "0s",
            "1.5h",
            "99999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_api_server_url_is_https_host_and_port() {
        assert_eq!(
            parse_url("https://10.96.0.1:443").unwrap(),
            ("10.96.0.1".into(), 443)
        );
        assert_eq!(
            parse_url("https://kubernetes.default.svc/").unwrap(),
            ("kubernetes.default.svc".into(), 443)
        );
        assert_eq!(
            parse_url("https://[fd00::1]:6443").unwrap(),
            ("fd00::1".into(), 6443)
        );
        for bad in [
            "http://10.0.0.1",
            "https://",
            "https://h:x",
            "https://h/api",
            "https://u@h",
            "https://[::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
            _ => None,
        };
        let url = in_cluster_url(env).unwrap();
        assert_eq!(url, "https://[fd00::1]:443");
        assert_eq!(parse_url(&url).unwrap(), ("fd00::1".into(), 443));
        assert!(in_cluster_url(|_| None).is_err());
    }

    #[test]
    fn the_bundle_holds_the_previous_ca_after_the_current_one() {
        let ca = Ca {
            cert: "A".into(),
            key: String::new(),
            not_after: time::OffsetDateTime::now_utc(),
            previous: Some("B\n".into()),
        };
        assert_eq!(ca.bundle(), "A\nB\n");
        let (all, required) = leaf_names("podmutator", "ns");
        assert_eq!(
            required,
            ["podmutator.ns.svc", "podmutator.ns.svc.cluster.local"]
        );
        assert_eq!(all.last().unwrap(), "podmutator.ns.svc");
    }
}
