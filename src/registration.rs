//! The `MutatingWebhookConfiguration` that registers podmutator with the API server.
//!
//! Rendered from `terraform/registration.json`, the file the Terraform module reads too, so
//! `podmutator webhook-config` prints exactly what `terraform apply` creates for the same
//! settings (`tests/iac.rs` evaluates the Terraform and compares). People who deploy with SAM,
//! which cannot reach the cluster, or who apply manifests through GitOps use the command.

use std::sync::OnceLock;

use base64::Engine;
use serde_json::{Value, json};

use podmutator_core::k8s_names::{is_dns_label, is_dns_subdomain, is_qualified_name};

/// The registration settings shared with Terraform.
pub const REGISTRATION_JSON: &str = include_str!("../terraform/registration.json");

/// Stands for the mesh label key in [`REGISTRATION_JSON`], in keys and values alike.
pub const MESH_LABEL_KEY_PLACEHOLDER: &str = "@MESH_LABEL_KEY@";

/// Kubernetes caps `timeoutSeconds` at 30.
pub const MAX_TIMEOUT_SECONDS: u32 = 30;

podmutator_core::named_enum! {
    /// `failurePolicy` of every registered webhook.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FailurePolicy as as_str {
        Fail = "Fail",
        Ignore = "Ignore",
    }
}

/// A webhook reached through a Kubernetes Service (`clientConfig.service`): `serve` in the
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// [`REGISTRATION_JSON`], parsed once.
pub fn registration() -> &'static Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    PARSED.get_or_init(|| {
        serde_json::from_str(REGISTRATION_JSON)
            .expect("terraform/registration.json is valid JSON (checked by the unit tests)")
    })
}

fn file_str<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Replaces the placeholder in every key and string, as Terraform does in the file's text.
fn substitute(v: &Value, label_key: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(MESH_LABEL_KEY_PLACEHOLDER, label_key)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| substitute(i, label_key)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        k.replace(MESH_LABEL_KEY_PLACEHOLDER, label_key),
                        substitute(v, label_key),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The URL (or, for a Service, the path) every path is appended to. Like Terraform's
/// `trimsuffix`, one trailing `/` goes.
fn url_prefix(opts: &RegistrationOptions) -> String {
    let base = if opts.service.is_some() {
        ""
    } else {
        let url = opts.url.as_deref().unwrap_or_default();
        url.strip_suffix('/').unwrap_or(url)
    };
    match &opts.path_token {
        Some(token) => format!("{base}/{token}"),
        None => base.to_owned(),
    }
}

/// The registration object (`admissionregistration.k8s.io/v1`) for `opts`. Pure; check the
/// options first with [`RegistrationOptions::validate`].
pub fn mutating_webhook_configuration(opts: &RegistrationOptions) -> Value {
    let file = registration();
    let label_key = opts
        .mesh_label_key
        .as_deref()
        .unwrap_or_else(|| file_str(file, "meshLabelKey"));
    let prefix = url_prefix(opts);

    let webhooks: Vec<Value> = file["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| opts.mesh || !w["mesh"].as_bool().unwrap_or(false))
        .filter_map(|w| {
            let mut w = substitute(w, label_key);
            // Each feature's selectors; the image-builder and images entries only when asked for.
            let (namespaces, pods) = match file_str(&w, "feature") {
                "secrets" => (opts.secrets_namespace_selector.as_ref(), None),
                "imageBuilder" => (None, Some(opts.image_builder_selector.as_ref()?)),
                "images" if !opts.images => return None,
                "images" => (
                    opts.images_namespace_selector.as_ref(),
                    opts.images_pod_selector.as_ref(),
                ),
                _ => (None, None),
            };
            if let Some(s) = namespaces {
                w["namespaceSelector"] = with_file_exclusions(s, &w["namespaceSelector"]);
            }
            if let Some(s) = pods {
                w["objectSelector"] = s.clone();
            }
            let path = format!("{prefix}{}", file_str(&w, "path"));
            let mut client_config = match &opts.service {
                Some(svc) => {
                    w["namespaceSelector"] = with_file_exclusions(
                        &w["namespaceSelector"],
                        &json!({"matchExpressions": [{
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": [svc.namespace],
                        }]}),
                    );
                    json!({"service": {
                        "namespace": svc.namespace,
                        "name": svc.name,
                        "path": path,
                        "port": svc.port,
                    }})
                }
                None => json!({ "url": path }),
            };
            if let Some(pem) = &opts.ca_bundle_pem {
                client_config["caBundle"] =
                    Value::String(base64::engine::general_purpose::STANDARD.encode(pem));
            }
            Some(json!({
                "name": w["name"],
                "clientConfig": client_config,
                "rules": w["rules"],
                "namespaceSelector": w["namespaceSelector"],
                "objectSelector": w["objectSelector"],
                "matchConditions": w["matchConditions"],
                "failurePolicy": failure_policy(&w, opts.failure_policy),
                "sideEffects": w["sideEffects"],
                "timeoutSeconds": timeout(&w, opts.timeout_seconds),
                "reinvocationPolicy": w["reinvocationPolicy"],
                "admissionReviewVersions": w["admissionReviewVersions"],
            }))
        })
        .collect();

    let name = opts.name.as_deref().unwrap_or(file_str(file, "name"));
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": { "name": name },
        "webhooks": webhooks,
    })
}

/// An entry's `failurePolicy`: the override, except that an entry failing open in the file
/// (the images entry: at worst a pod pulls its source image) stays open under `Fail`, as the
/// Terraform module does. `Ignore` is the fail-open switch; `Fail` is each entry's own.
fn failure_policy(w: &Value, override_policy: Option<FailurePolicy>) -> Value {
    match override_policy {
        Some(p) if file_str(w, "failurePolicy") != "Ignore" => p.as_str().into(),
        _ => w["failurePolicy"].clone(),
    }
}

/// An entry's `timeoutSeconds`: the override, except that an entry failing open in the file
/// keeps its own when shorter (a longer wait on it only delays pods), as the Terraform module
/// does.
fn timeout(w: &Value, override_seconds: Option<u32>) -> Value {
    let ignore = file_str(w, "failurePolicy") == "Ignore";
    match (override_seconds, w["timeoutSeconds"].as_u64()) {
        (Some(o), Some(own)) if ignore => Value::from(u64::from(o).min(own)),
        (Some(o), Some(_)) => Value::from(o),
        _ => w["timeoutSeconds"].clone(),
    }
}

/// `selector` with the file's `matchExpressions` (the kube-system exclusion) appended, as the
/// Terraform module does.
fn with_file_exclusions(selector: &Value, file: &Value) -> Value {
    let mut out = selector.clone();
    let expressions: Vec<Value> = [selector, file]
        .into_iter()
        .filter_map(|v| v["matchExpressions"].as_array())
        .flatten()
        .cloned()
        .collect();
    if let Value::Object(map) = &mut out {
        map.insert("matchExpressions".into(), Value::Array(expressions));
    }
    out
}

/// A `LabelSelector` given as JSON on the command line, checked like the config's.
pub fn parse_label_selector(json: &str) -> Result<Value, String> {
    use podmutator_core::config::{dropped_key, dropped_key_message};
    let selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_str(json).map_err(|e| {
            format!(
                "must be a LabelSelector as JSON, e.g. '{{\"matchLabels\":{{\"image-builder\":\"true\"}}}}': {e}"
            )
        })?;
    podmutator_core::config::images::check_label_selector("selector", &selector)
        .map_err(|e| e.to_string())?;
    let given: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let kept = serde_json::to_value(&selector).map_err(|e| e.to_string())?;
    match dropped_key(&given, &kept) {
        Some(key) => Err(format!("selector{key}: {}", dropped_key_message(&key))),
        None => Ok(kept),
    }
}

/// The object as a YAML document for `kubectl apply -f`.
pub fn to_yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).expect("a JSON value always serialises to YAML")
}

// ----------------------------------------------------------------------------------------------
// Validation: the same rules as terraform/modules/webhook-config/variables.tf.
// ----------------------------------------------------------------------------------------------

/// Why a registration option is refused; [`ArgError`] adds the flag that set it.
#[derive(Debug, thiserror::Error)]
pub enum InvalidValue {
    #[error("must start with https:// (the API server calls webhooks over TLS only), got {0:?}")]
    NotHttps(String),
    #[error("has no host, got {0:?}")]
    NoHost(String),
    #[error("must not contain user info (user@host)")]
    UserInfo,
    #[error("must not contain a query or fragment; the API server rejects them")]
    QueryOrFragment,
    #[error("must not contain whitespace")]
    Whitespace,
    #[error("must be a whole number of seconds, got {0:?}")]
    NotANumber(String),
    #[error("must be from 1 to {MAX_TIMEOUT_SECONDS} (the Kubernetes limit), got {0}")]
    Timeout(u32),
    #[error("is not a PEM file (not UTF-8)")]
    PemNotText,
    #[error("holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate,
    #[error(
        "holds a {0} block: a caBundle holds certificates only, and anyone who may read the registration reads it; give the CA's certificate alone"
    )]
    NotACertificate(String),
    #[error("must be Fail or Ignore, got {0:?}")]
    FailurePolicy(String),
    #[error("must be a Kubernetes label key such as aether.io/managed, got {0:?}")]
    LabelKey(String),
    #[error("must be a DNS subdomain (lowercase letters, digits, '-', '.'), got {0:?}")]
    Name(String),
    #[error("needs a non-empty value")]
    Empty,
    #[error(
        "must be <namespace>/<name>[:<port>] with DNS-label namespace and name and a port from 1 to 65535, e.g. podmutator/podmutator:443, got {0:?}"
    )]
    Service(String),
    #[error("cannot read {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    #[error(
        "is required: the function answers 404 to URLs without its path token (http.pathTokenSha256, on by default in Terraform and SAM), so every pod would be refused under failurePolicy Fail; pass the token's file, or --no-path-token if the endpoint was deployed without one (path_token_enabled = false, PathTokenEnabled=false, http.pathTokenDisabled)"
    )]
    PathTokenMissing,
    #[error(transparent)]
    PathToken(#[from] podmutator_core::config::ConfigError),
}

/// A bad command-line option, named so the user knows what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct ArgError {
    pub flag: &'static str,
    #[source]
    pub reason: InvalidValue,
}

impl ArgError {
    fn new(flag: &'static str, reason: InvalidValue) -> Self {
        Self { flag, reason }
    }
}

/// `https://host[/path]` without user info, query, fragment or whitespace: what the API server
/// accepts as a webhook URL.
pub fn parse_url(url: &str) -> Result<String, InvalidValue> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(InvalidValue::NotHttps(url.to_owned()));
    };
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(InvalidValue::NoHost(url.to_owned()));
    }
    if host.contains('@') {
        return Err(InvalidValue::UserInfo);
    }
    if rest.contains(['?', '#']) {
        return Err(InvalidValue::QueryOrFragment);
    }
    if rest.chars().any(char::is_whitespace) {
        return Err(InvalidValue::Whitespace);
    }
    Ok(url.to_owned())
}

fn check_timeout(n: u32) -> Result<u32, InvalidValue> {
    (1..=MAX_TIMEOUT_SECONDS)
        .contains(&n)
        .then_some(n)
        .ok_or(InvalidValue::Timeout(n))
}

/// `--service`: `<namespace>/<name>[:<port>]`, port 443 when left out (the API server's
/// default too).
pub fn parse_service(s: &str) -> Result<ServiceRef, InvalidValue> {
    let bad = || InvalidValue::Service(s.to_owned());
    let (namespace, rest) = s.split_once('/').ok_or_else(bad)?;
    let (name, port) = match rest.split_once(':') {
        Some((name, port)) => (name, port.parse::<u16>().map_err(|_| bad())?),
        None => (rest, 443),
    };
    if !is_dns_label(namespace) || !is_dns_label(name) || port == 0 {
        return Err(bad());
    }
    Ok(ServiceRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        port,
    })
}

/// `--timeout-seconds`: a whole number from 1 to [`MAX_TIMEOUT_SECONDS`].
pub fn parse_timeout(s: &str) -> Result<u32, InvalidValue> {
    s.parse()
        .map_err(|_| InvalidValue::NotANumber(s.to_owned()))
        .and_then(check_timeout)
}

fn check_ca_bundle(pem: &[u8]) -> Result<(), InvalidValue> {
    let text = std::str::from_utf8(pem).map_err(|_| InvalidValue::PemNotText)?;
    let labels = text.split("-----BEGIN ").skip(1);
    if let Some(other) = labels
        .filter_map(|rest| rest.split_once("-----").map(|(label, _)| label))
        .find(|label| *label != "CERTIFICATE")
    {
        return Err(InvalidValue::NotACertificate(other.into()));
    }
    text.contains("-----BEGIN CERTIFICATE-----")
        .then_some(())
        .ok_or(InvalidValue::NoCertificate)
}

/// `--failure-policy`: exactly `Fail` or `Ignore`, as the API server spells them.
pub fn parse_failure_policy(s: &str) -> Result<FailurePolicy, InvalidValue> {
    FailurePolicy::ALL
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| InvalidValue::FailurePolicy(s.to_owned()))
}

/// `s` when `ok`, else `refused` of it.
fn accept(ok: bool, s: &str, refused: fn(String) -> InvalidValue) -> Result<String, InvalidValue> {
    ok.then(|| s.to_owned())
        .ok_or_else(|| refused(s.to_owned()))
}

/// `--mesh-label-key`: a Kubernetes qualified name.
pub fn parse_label_key(s: &str) -> Result<String, InvalidValue> {
    accept(is_qualified_name(s), s, InvalidValue::LabelKey)
}

/// `--name`: a DNS subdomain, as `metadata.name` must be.
pub fn parse_name(s: &str) -> Result<String, InvalidValue> {
    accept(is_dns_subdomain(s), s, InvalidValue::Name)
}

/// A file flag: any non-empty path (read later, so the error names the flag and the file).
pub fn parse_path(s: &str) -> Result<String, InvalidValue> {
    accept(!s.is_empty(), s, |_| InvalidValue::Empty)
}

impl RegistrationOptions {
    /// Checks what the API server (or the function, for the path token) would reject; the error
    /// names the command-line flag that sets the option.
    pub fn validate(&self) -> Result<(), ArgError> {
        if self.service.is_none() {
            parse_url(self.url.as_deref().unwrap_or_default())
                .map_err(|e| ArgError::new("--url", e))?;
        }
        if let Some(token) = &self.path_token {
            podmutator_core::config::check_path_token("path token", token)
                .map_err(|e| ArgError::new("--path-token-file", e.into()))?;
        }
        if let Some(pem) = &self.ca_bundle_pem {
            check_ca_bundle(pem).map_err(|e| ArgError::new("--ca-bundle-file", e))?;
        }
        if let Some(key) = &self.mesh_label_key {
            parse_label_key(key).map_err(|e| ArgError::new("--mesh-label-key", e))?;
        }
        if let Some(n) = self.timeout_seconds {
            check_timeout(n).map_err(|e| ArgError::new("--timeout-seconds", e))?;
        }
        if let Some(name) = &self.name {
            parse_name(name).map_err(|e| ArgError::new("--name", e))?;
        }
        Ok(())
    }
}

// ----------------------------------------------------------------------------------------------
// Command line
// ----------------------------------------------------------------------------------------------

/// What varies between deployments (everything else is in [`REGISTRATION_JSON`]), as `podmutator
/// webhook-config` takes it: values are checked as they are parsed; the files are read into
/// `path_token` and `ca_bundle_pem` by [`RegistrationOptions::read_files`].
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(
    after_help = "Example (path-token: a file holding the endpoint's token, e.g. the secret of Terraform's path_token_secret_arn output):\n  podmutator webhook-config --url https://podmutator.example.com --path-token-file path-token > webhook.yaml && kubectl apply -f webhook.yaml"
)]
pub struct RegistrationOptions {
    /// Base URL of the endpoint, e.g. https://podmutator.example.com (SAM output WebhookUrl,
    /// Terraform output webhook_base_url); each webhook's path is appended
    #[arg(long, value_name = "URL", required_unless_present = "service", conflicts_with = "service", value_parser = parse_url)]
    pub url: Option<String>,
    /// Register the Service <namespace>/<name>[:<port>] (clientConfig.service, port 443 when
    /// left out) instead of a URL, for `podmutator serve` in the cluster; every webhook then
    /// also skips that namespace
    #[arg(long, value_name = "NAMESPACE/NAME[:PORT]", value_parser = parse_service)]
    pub service: Option<ServiceRef>,
    /// File holding the API Gateway path token (SAM output PathTokenSecretArn); kept out of the
    /// command line on purpose
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub path_token_file: Option<String>,
    /// The endpoint was deployed without a path token (path_token_enabled = false,
    /// PathTokenEnabled=false): print URLs without one
    #[arg(long, conflicts_with = "path_token_file")]
    pub no_path_token: bool,
    /// PEM CA the API server must trust for the endpoint (private CA); without it the API
    /// server uses its system roots
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub ca_bundle_file: Option<String>,
    /// Also register the two mesh webhooks
    #[arg(long)]
    pub mesh: bool,
    /// Label of mesh-managed pods and namespaces (implies --mesh) [default: aether.io/managed]
    #[arg(long, value_name = "KEY", value_parser = parse_label_key)]
    pub mesh_label_key: Option<String>,
    /// Also register the image-builder webhook, with this objectSelector
    /// (webhook.imageBuilderConfig.labelSelector as JSON)
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    pub image_builder_selector: Option<Value>,
    /// Also register the images webhook (images.rules)
    #[arg(long)]
    pub images: bool,
    /// Its objectSelector (images.podSelector) as JSON [default: every pod]
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    pub images_pod_selector: Option<Value>,
    /// Its namespaceSelector (images.namespaceSelector) as JSON; kube-system is always excluded
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    pub images_namespace_selector: Option<Value>,
    /// Narrow the secrets webhook to the namespaces this LabelSelector (JSON) selects, e.g.
    /// '{"matchLabels":{"kubernetes.io/metadata.name":"flytesnacks-development"}}' for a staged
    /// rollout; kube-system is always excluded [default: every other namespace]
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    pub secrets_namespace_selector: Option<Value>,
    /// Ignore fails every webhook open; Fail keeps the images webhook's Ignore [default: each
    /// webhook's own: Fail, the images webhook Ignore]
    #[arg(long, value_name = "POLICY", value_parser = parse_failure_policy)]
    pub failure_policy: Option<FailurePolicy>,
    /// timeoutSeconds for every webhook, 1-30 [default: 10, the images webhook 3]; keep it above
    /// the Lambda timeout. The images webhook, which fails open, keeps 3 when this is longer
    #[arg(long, value_name = "N", value_parser = parse_timeout)]
    pub timeout_seconds: Option<u32>,
    /// metadata.name [default: podmutator]
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    pub name: Option<String>,
    /// API Gateway option: the secret first path segment (`path_token_file`'s contents).
    #[arg(skip)]
    pub path_token: Option<String>,
    /// PEM bytes, written base64-encoded as `caBundle` (`ca_bundle_file`'s contents).
    #[arg(skip)]
    pub ca_bundle_pem: Option<Vec<u8>>,
}

impl RegistrationOptions {
    /// Reads the token and CA files and validates the result. `images` is set by either of its
    /// selectors too.
    pub fn read_files(mut self) -> Result<Self, ArgError> {
        let read = |flag: &'static str, path: &str| {
            std::fs::read(path).map_err(|source| {
                ArgError::new(
                    flag,
                    InvalidValue::Read {
                        path: path.to_owned(),
                        source,
                    },
                )
            })
        };
        self.path_token = match &self.path_token_file {
            Some(path) => {
                let bytes = read("--path-token-file", path)?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    ArgError::new("--path-token-file", InvalidValue::NotText(path.clone()))
                })?;
                // `aws secretsmanager get-secret-value --output text > file` ends with a newline.
                Some(text.trim().to_owned())
            }
            None if self.no_path_token => None,
            None => {
                return Err(ArgError::new(
                    "--path-token-file",
                    InvalidValue::PathTokenMissing,
                ));
            }
        };
        self.ca_bundle_pem = match &self.ca_bundle_file {
            Some(path) => Some(read("--ca-bundle-file", path)?),
            None => None,
        };
        self.images |=
            self.images_pod_selector.is_some() || self.images_namespace_selector.is_some();
        self.mesh |= self.mesh_label_key.is_some();
        self.validate()?;
        Ok(self)
    }
}

/// `podmutator webhook-config ARGS`: the YAML to print.
pub fn webhook_config_command(args: RegistrationOptions) -> Result<String, ArgError> {
    let opts = args.read_files()?;
    Ok(to_yaml(&mutating_webhook_configuration(&opts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    const TOKEN: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
    const FAKE_PEM: &str = "-----BEGIN CERTIFICATE-----\nZmFrZS1jYQ==\n-----END CERTIFICATE-----\n";

    fn opts(url: &str) -> RegistrationOptions {
        RegistrationOptions {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// `webhook-config` as the binary parses it.
    #[derive(Debug, clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        args: RegistrationOptions,
    }

    fn parse(list: &[&str]) -> Result<RegistrationOptions, clap::Error> {
        use clap::Parser;
        Cmd::try_parse_from(std::iter::once("webhook-config").chain(list.iter().copied()))
            .map(|c| c.args)
    }

    fn webhooks(v: &Value) -> &Vec<Value> {
        v["webhooks"].as_array().expect("webhooks is a list")
    }

    fn file_webhook(name: &str) -> &'static Value {
        registration()["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == name)
            .unwrap()
    }

    #[test]
    fn registration_paths_are_the_functions_routes() {
        let paths: Vec<&str> = registration()["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                crate::transport::http::PATH_SECRETS,
                crate::transport::http::PATH_MANAGED_POD,
                crate::transport::http::PATH_MANAGED_NAMESPACE,
                crate::transport::http::PATH_IMAGE_BUILDER,
                crate::transport::http::PATH_IMAGES,
            ]
        );
    }

    #[test]
    fn image_entries_are_registered_only_when_asked_with_their_selectors() {
        let names = |o: &RegistrationOptions| -> Vec<String> {
            webhooks(&mutating_webhook_configuration(o))
                .iter()
                .map(|w| w["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let plain = opts("https://x.example");
        assert_eq!(names(&plain), ["flyte-pod-webhook.flyte.org"]);
        let parsed = parse(&[
            "--url",
            "https://x.example",
            "--no-path-token",
            "--image-builder-selector",
            r#"{"matchLabels":{"image-builder":"true"}}"#,
            "--images-namespace-selector",
            r#"{"matchLabels":{"mirror":"ecr"}}"#,
        ])
        .unwrap()
        .read_files()
        .unwrap();
        let v = mutating_webhook_configuration(&parsed);
        let hooks = webhooks(&v);
        assert_eq!(
            names(&parsed),
            [
                "flyte-pod-webhook.flyte.org",
                "image-builder-webhook.union.ai",
                "images.podmutator.io"
            ]
        );
        assert_eq!(
            hooks[1]["clientConfig"]["url"],
            "https://x.example/mutate--v1-pod/image-builder"
        );
        assert_eq!(
            hooks[1]["objectSelector"],
            json!({"matchLabels": {"image-builder": "true"}})
        );
        assert_eq!(hooks[1]["failurePolicy"], "Fail");
        // The image builder's check also covers UPDATEs (an image changed) and ephemeral
        // containers; the other entries mutate pod CREATEs only.
        assert_eq!(
            hooks[1]["rules"],
            json!([
                {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"},
                {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}
            ])
        );
        for i in [0, 2] {
            assert_eq!(
                hooks[i]["rules"],
                json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]),
                "{}",
                hooks[i]["name"]
            );
        }
        assert_eq!(hooks[2]["objectSelector"], json!({}));
        assert_eq!(
            hooks[2]["namespaceSelector"],
            json!({"matchLabels": {"mirror": "ecr"}, "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]})
        );
        assert_eq!(hooks[2]["failurePolicy"], "Ignore");
    }

    #[rstest]
    #[case::not_json("{", "--image-builder-selector", "LabelSelector as JSON")]
    #[case::bad_label(
        r#"{"matchLabels":{"bad key!":"x"}}"#,
        "--image-builder-selector",
        "label"
    )]
    #[case::secrets_not_json("ns=pilot", "--secrets-namespace-selector", "LabelSelector as JSON")]
    #[case::secrets_bad_operator(
        r#"{"matchExpressions":[{"key":"a","operator":"Within","values":["b"]}]}"#,
        "--secrets-namespace-selector",
        "is not In, NotIn, Exists or DoesNotExist"
    )]
    #[case::secrets_in_without_values(
        r#"{"matchExpressions":[{"key":"a","operator":"In"}]}"#,
        "--secrets-namespace-selector",
        "needs at least one value"
    )]
    #[case::misspelt_field(
        r#"{"matchlabel":{"a":"b"}}"#,
        "--image-builder-selector",
        "selector.matchlabel: unknown field `matchlabel`"
    )]
    #[case::field_in_another_case(
        r#"{"matchLabels":{"a":"b"},"MatchExpressions":[]}"#,
        "--secrets-namespace-selector",
        "selector.MatchExpressions: unknown field `MatchExpressions`"
    )]
    #[case::misspelt_expression_field(
        r#"{"matchExpressions":[{"key":"a","operator":"Exists","valeus":[]}]}"#,
        "--images-pod-selector",
        "selector.matchExpressions[0].valeus: unknown field `valeus`"
    )]
    fn a_bad_selector_names_the_flag(#[case] json: &str, #[case] flag: &str, #[case] rule: &str) {
        let err = parse(&["--url", "https://x.example", flag, json])
            .unwrap_err()
            .to_string();
        assert!(err.contains(flag), "{err}");
        assert!(err.contains(rule), "{err}");
    }

    /// Whether the API server calls webhook entry `w` for `request` (of a pod, or a pod
    /// subresource), as far as its rules and `matchConditions` decide (selectors apart): the
    /// conditions evaluated by a CEL interpreter on the variables the API server gives them
    /// (`object`, `oldObject`, `request`), every one true. An error (the API server would apply
    /// `failurePolicy`) fails the test.
    fn api_server_calls(w: &Value, request: &Value) -> bool {
        let resource = match request["subResource"].as_str() {
            Some(sub) => format!("pods/{sub}"),
            None => "pods".into(),
        };
        let ruled = w["rules"].as_array().unwrap().iter().any(|r| {
            r["operations"]
                .as_array()
                .unwrap()
                .contains(&request["operation"])
                && r["resources"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(resource))
        });
        ruled
            && w["matchConditions"].as_array().unwrap().iter().all(|m| {
                let program = cel::Program::compile(m["expression"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("{}: {e}", m["name"]));
                let mut vars = cel::Context::default();
                for (name, v) in [
                    ("object", &request["object"]),
                    ("oldObject", &request["oldObject"]),
                    ("request", request),
                ] {
                    vars.add_variable(name, v.clone()).unwrap();
                }
                match program.execute(&vars) {
                    Ok(cel::Value::Bool(b)) => b,
                    other => panic!("{} on {request}: {other:?}", m["name"]),
                }
            })
    }

    /// The API server calls each entry for the pods it is for, and never for a mirror pod
    /// (the kubelet's, which no webhook may change). The image builder's gets every pod CREATE
    /// and only the UPDATEs that change an image (or add an ephemeral container): while its
    /// endpoint is down (`failurePolicy: Fail`), every other update of a labelled pod (a label,
    /// the finalizer removal its deletion waits on) still goes through.
    #[test]
    fn the_api_server_calls_each_entry_for_what_it_mutates() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "finalizers": ["flyte/flytek8s"]},
            "spec": {"containers": [{"name": "app", "image": "r.io/app:1"}, {"name": "noimage"}],
                "initContainers": [{"name": "init", "image": "r.io/init:1"}]}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut p = pod.clone();
            f(&mut p);
            p
        };
        let create = |p: &Value| json!({"operation": "CREATE", "object": p, "oldObject": null});
        let update = |new: &Value, sub: Option<&str>| {
            let mut r = json!({"operation": "UPDATE", "object": new, "oldObject": pod});
            if let Some(sub) = sub {
                r["subResource"] = json!(sub);
            }
            r
        };
        let mirror = with(&|p| {
            p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        });
        let secrets = with(&|p| p["metadata"]["annotations"] = json!({"flyte.secrets/s0": "x"}));
        let relabelled = with(&|p| p["metadata"]["labels"]["a"] = json!("c"));
        let released = with(&|p| p["metadata"]["finalizers"] = json!([]));
        let set_image = with(&|p| p["spec"]["containers"][0]["image"] = json!("r.io/app:2"));
        let set_init_image =
            with(&|p| p["spec"]["initContainers"][0]["image"] = json!("r.io/init:2"));
        let debugged = with(&|p| {
            p["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "r.io/dbg:1"}]);
        });
        let calls = |name: &str, request: &Value| api_server_calls(file_webhook(name), request);
        let builder = "image-builder-webhook.union.ai";
        for (request, expected) in [
            (create(&pod), true),
            (create(&mirror), false),
            (update(&relabelled, None), false),
            (update(&released, None), false),
            (update(&pod, None), false),
            (update(&set_image, None), true),
            (update(&set_init_image, None), true),
            (update(&debugged, Some("ephemeralcontainers")), true),
            (update(&released, Some("status")), false),
        ] {
            assert_eq!(calls(builder, &request), expected, "{request}");
        }
        let flyte = "flyte-pod-webhook.flyte.org";
        assert!(calls(flyte, &create(&secrets)));
        assert!(!calls(flyte, &create(&pod)));
        assert!(!calls(flyte, &update(&secrets, None)));
        let mut mirrored_secrets = secrets.clone();
        mirrored_secrets["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("x");
        assert!(!calls(flyte, &create(&mirrored_secrets)));
        for w in registration()["webhooks"].as_array().unwrap() {
            let name = w["name"].as_str().unwrap();
            if name != flyte {
                assert!(calls(name, &create(&pod)), "{name}");
            }
            assert!(!calls(name, &create(&mirror)), "{name}");
            if name != builder {
                assert!(!calls(name, &update(&set_image, None)), "{name}");
            }
        }
    }

    #[test]
    fn secrets_webhook_selects_what_the_secrets_mutator_reads() {
        let w = file_webhook("flyte-pod-webhook.flyte.org");
        assert_eq!(
            w["objectSelector"]["matchLabels"][podmutator_core::secrets::POD_LABEL],
            podmutator_core::secrets::POD_LABEL_VALUE
        );
        let conditions = w["matchConditions"].to_string();
        assert!(
            conditions.contains(&format!(
                "k.startsWith('{}')",
                podmutator_core::secrets::codec::ANNOTATION_PREFIX
            )),
            "{conditions}"
        );
    }

    #[test]
    fn selectors_use_the_functions_default_labels() {
        let config = podmutator_core::Config::default();
        let secrets = file_webhook("flyte-pod-webhook.flyte.org");
        assert_eq!(
            secrets["objectSelector"]["matchLabels"][&config.secrets_selector.label],
            config.secrets_selector.value.as_str()
        );
        assert_eq!(
            registration()["meshLabelKey"],
            config.mesh.managed_label.as_str()
        );
        let pod = file_webhook("managed-pod.podmutator.io");
        assert_eq!(
            pod["objectSelector"]["matchLabels"][MESH_LABEL_KEY_PLACEHOLDER],
            podmutator_core::mutate::mesh::MANAGED
        );
    }

    #[test]
    fn default_registration_is_the_secrets_webhook_only() {
        let v = mutating_webhook_configuration(&opts("https://podmutator.example.com"));
        assert_eq!(v["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(v["kind"], "MutatingWebhookConfiguration");
        assert_eq!(v["metadata"], json!({"name": "podmutator"}));
        let hooks = webhooks(&v);
        assert_eq!(hooks.len(), 1);
        let w = &hooks[0];
        assert_eq!(w["name"], "flyte-pod-webhook.flyte.org");
        assert_eq!(
            w["clientConfig"],
            json!({"url": "https://podmutator.example.com/mutate--v1-pod"})
        );
        assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(w["sideEffects"], "None");
        assert_eq!(w["reinvocationPolicy"], "IfNeeded");
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["timeoutSeconds"], 10);
        assert_eq!(
            w["rules"],
            json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}])
        );
        assert_eq!(
            w["namespaceSelector"],
            json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]})
        );
        assert!(w.get("$comment").is_none() && w.get("path").is_none() && w.get("mesh").is_none());
    }

    #[test]
    fn every_webhook_skips_kube_system() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            ..opts("https://h")
        });
        for w in webhooks(&v) {
            let exprs = w["namespaceSelector"]["matchExpressions"]
                .as_array()
                .unwrap();
            assert!(
                exprs.contains(&json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]})),
                "{}",
                w["name"]
            );
        }
    }

    #[test]
    fn mesh_adds_two_webhooks_with_the_label_key_substituted() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            mesh_label_key: Some("example.org/mesh".into()),
            ..opts("https://h")
        });
        let names: Vec<&str> = webhooks(&v)
            .iter()
            .map(|w| w["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "flyte-pod-webhook.flyte.org",
                "managed-pod.podmutator.io",
                "managed-namespace.podmutator.io"
            ]
        );
        let text = v.to_string();
        assert!(!text.contains(MESH_LABEL_KEY_PLACEHOLDER), "{text}");
        let pod = &webhooks(&v)[1];
        assert_eq!(pod["clientConfig"]["url"], "https://h/mutate/managed-pod");
        assert_eq!(
            pod["objectSelector"],
            json!({"matchLabels": {"example.org/mesh": "true"}})
        );
        let ns = &webhooks(&v)[2];
        assert_eq!(
            ns["clientConfig"]["url"],
            "https://h/mutate/managed-namespace"
        );
        assert_eq!(
            ns["namespaceSelector"]["matchLabels"],
            json!({"example.org/mesh": "true"})
        );
        assert_eq!(
            ns["objectSelector"],
            json!({"matchExpressions": [{"key": "example.org/mesh", "operator": "DoesNotExist"}]})
        );
    }

    #[test]
    fn default_mesh_label_key_comes_from_the_file() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            ..opts("https://h")
        });
        assert_eq!(
            webhooks(&v)[1]["objectSelector"]["matchLabels"],
            json!({"aether.io/managed": "true"})
        );
    }

    #[rstest]
    #[case::bare_host("https://h", None, "https://h/mutate--v1-pod")]
    #[case::one_trailing_slash_dropped("https://h/", None, "https://h/mutate--v1-pod")]
    #[case::prefix_kept("https://h/a", None, "https://h/a/mutate--v1-pod")]
    #[case::token_first(
        "https://h/",
        Some(TOKEN),
        "https://h/abcdefghijklmnopqrstuvwxyz0123456789ABCD/mutate--v1-pod"
    )]
    fn url_is_base_then_token_then_path(
        #[case] base: &str,
        #[case] token: Option<&str>,
        #[case] want: &str,
    ) {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            path_token: token.map(str::to_owned),
            ..opts(base)
        });
        assert_eq!(webhooks(&v)[0]["clientConfig"]["url"], want);
    }

    #[test]
    fn service_replaces_the_url_and_every_entry_skips_its_namespace() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            service: Some(ServiceRef {
                namespace: "pm-system".into(),
                name: "podmutator".into(),
                port: 8443,
            }),
            path_token: Some(TOKEN.into()),
            mesh: true,
            images: true,
            ..Default::default()
        });
        let hooks = webhooks(&v);
        assert_eq!(hooks.len(), 4);
        let paths: Vec<&str> = hooks
            .iter()
            .map(|w| {
                let c = &w["clientConfig"];
                assert!(c.get("url").is_none(), "{c}");
                assert_eq!(c["service"]["namespace"], "pm-system");
                assert_eq!(c["service"]["name"], "podmutator");
                assert_eq!(c["service"]["port"], 8443);
                let exprs = w["namespaceSelector"]["matchExpressions"]
                    .as_array()
                    .unwrap();
                for ns in ["kube-system", "pm-system"] {
                    assert!(
                        exprs.contains(&json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]})),
                        "{} {exprs:?}",
                        w["name"]
                    );
                }
                c["service"]["path"].as_str().unwrap()
            })
            .collect();
        assert_eq!(
            paths,
            [
                format!("/{TOKEN}/mutate--v1-pod"),
                format!("/{TOKEN}/mutate/managed-pod"),
                format!("/{TOKEN}/mutate/managed-namespace"),
                format!("/{TOKEN}/mutate/images"),
            ]
        );
        // The mesh namespace entry keeps its own label selector beside the exclusions.
        assert_eq!(
            hooks[2]["namespaceSelector"]["matchLabels"],
            json!({"aether.io/managed": "true"})
        );
    }

    #[rstest]
    #[case::default_port("podmutator/podmutator", "podmutator", "podmutator", 443)]
    #[case::port("a/b:9443", "a", "b", 9443)]
    fn service_flag_is_parsed(
        #[case] arg: &str,
        #[case] namespace: &str,
        #[case] name: &str,
        #[case] port: u16,
    ) {
        let opts = parse(&["--service", arg, "--no-path-token"])
            .unwrap()
            .read_files()
            .unwrap();
        assert_eq!(
            opts.service,
            Some(ServiceRef {
                namespace: namespace.into(),
                name: name.into(),
                port
            })
        );
        let v = mutating_webhook_configuration(&opts);
        assert_eq!(
            webhooks(&v)[0]["clientConfig"]["service"]["path"],
            "/mutate--v1-pod"
        );
    }

    #[rstest]
    #[case::no_slash("podmutator")]
    #[case::empty_name("podmutator/")]
    #[case::uppercase("Podmutator/podmutator")]
    #[case::port_zero("a/b:0")]
    #[case::port_too_big("a/b:65536")]
    #[case::port_not_a_number("a/b:https")]
    #[case::dotted_name("a/b.c")]
    fn bad_service_names_the_flag_and_the_form(#[case] arg: &str) {
        let err = parse(&["--service", arg, "--no-path-token"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--service"), "{err}");
        assert!(err.contains("<namespace>/<name>[:<port>]"), "{err}");
    }

    #[test]
    fn service_and_url_exclude_each_other() {
        let err = parse(&["--service", "a/b", "--url", "https://h", "--no-path-token"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be used with"), "{err}");
    }

    #[test]
    fn ca_bundle_is_the_pem_base64_encoded() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            ca_bundle_pem: Some(FAKE_PEM.as_bytes().to_vec()),
            ..opts("https://h")
        });
        let encoded = webhooks(&v)[0]["clientConfig"]["caBundle"]
            .as_str()
            .unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(decoded, FAKE_PEM.as_bytes());
    }

    #[test]
    fn overrides_apply_to_every_webhook() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            failure_policy: Some(FailurePolicy::Ignore),
            timeout_seconds: Some(7),
            name: Some("pm".into()),
            ..opts("https://h")
        });
        assert_eq!(v["metadata"]["name"], "pm");
        for w in webhooks(&v) {
            assert_eq!(w["failurePolicy"], "Ignore");
            assert_eq!(w["timeoutSeconds"], 7);
        }
    }

    /// The images entry fails open whatever the override says; the others take it.
    #[rstest]
    #[case::fail(FailurePolicy::Fail, "Fail", "Ignore")]
    #[case::ignore(FailurePolicy::Ignore, "Ignore", "Ignore")]
    fn the_images_entry_stays_open_under_any_failure_policy(
        #[case] policy: FailurePolicy,
        #[case] others: &str,
        #[case] images: &str,
    ) {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            images: true,
            image_builder_selector: Some(json!({"matchLabels": {"build": "yes"}})),
            failure_policy: Some(policy),
            ..opts("https://h")
        });
        for w in webhooks(&v) {
            let want = if w["name"] == "images.podmutator.io" {
                images
            } else {
                others
            };
            assert_eq!(w["failurePolicy"], want, "{}", w["name"]);
        }
        assert_eq!(webhooks(&v).len(), 5);
    }

    /// The images entry fails open: it waits 3 s, and an override only ever shortens that.
    #[rstest]
    #[case::defaults(None, 10, 3)]
    #[case::longer_override(Some(15), 15, 3)]
    #[case::shorter_override(Some(2), 2, 2)]
    fn the_images_entry_keeps_its_shorter_timeout(
        #[case] override_seconds: Option<u32>,
        #[case] secrets: u64,
        #[case] images: u64,
    ) {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            images: true,
            timeout_seconds: override_seconds,
            ..opts("https://h")
        });
        let hooks = webhooks(&v);
        assert_eq!(hooks[0]["name"], "flyte-pod-webhook.flyte.org");
        assert_eq!(hooks[0]["timeoutSeconds"], secrets);
        assert_eq!(hooks[1]["name"], "images.podmutator.io");
        assert_eq!(hooks[1]["timeoutSeconds"], images);
        assert_eq!(
            file_webhook("images.podmutator.io")["failurePolicy"],
            "Ignore"
        );
    }

    /// A staged rollout: the secrets entry on one namespace, still never kube-system; the other
    /// entries keep their own selectors.
    #[test]
    fn a_secrets_namespace_selector_narrows_the_secrets_entry_only() {
        let parsed = parse(&[
            "--url",
            "https://h",
            "--no-path-token",
            "--mesh",
            "--images",
            "--secrets-namespace-selector",
            r#"{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"In","values":["flytesnacks-development"]}]}"#,
        ])
        .unwrap()
        .read_files()
        .unwrap();
        let v = mutating_webhook_configuration(&parsed);
        let hooks = webhooks(&v);
        assert_eq!(hooks[0]["name"], "flyte-pod-webhook.flyte.org");
        assert_eq!(
            hooks[0]["namespaceSelector"],
            json!({"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["flytesnacks-development"]},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]})
        );
        let plain = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            images: true,
            ..opts("https://h")
        });
        for (i, w) in hooks.iter().enumerate().skip(1) {
            assert_eq!(
                w["namespaceSelector"],
                webhooks(&plain)[i]["namespaceSelector"],
                "{}",
                w["name"]
            );
        }
        let labels = parse(&[
            "--url",
            "https://h",
            "--no-path-token",
            "--secrets-namespace-selector",
            r#"{"matchLabels":{"podmutator-pilot":"true"}}"#,
        ])
        .unwrap()
        .read_files()
        .unwrap();
        assert_eq!(
            webhooks(&mutating_webhook_configuration(&labels))[0]["namespaceSelector"],
            json!({"matchLabels": {"podmutator-pilot": "true"}, "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]})
        );
    }

    #[test]
    fn yaml_reads_back_as_the_same_object() {
        let v = mutating_webhook_configuration(&RegistrationOptions {
            mesh: true,
            ca_bundle_pem: Some(FAKE_PEM.as_bytes().to_vec()),
            ..opts("https://h")
        });
        let yaml = to_yaml(&v);
        let back: Value = serde_saphyr::from_str(&yaml).unwrap();
        // Label values stay strings ("true"), timeouts stay numbers.
        assert_eq!(back, v, "{yaml}");
    }

    #[test]
    fn command_prints_yaml_for_a_minimal_invocation() {
        let out =
            webhook_config_command(parse(&["--url", "https://h", "--no-path-token"]).unwrap())
                .unwrap();
        let back: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(back, mutating_webhook_configuration(&opts("https://h")));
    }

    /// URLs without the token would all be 404 under the function's default: printing them must
    /// be asked for.
    #[test]
    fn urls_without_a_path_token_must_be_asked_for() {
        let err = webhook_config_command(parse(&["--url", "https://h"]).unwrap()).unwrap_err();
        assert_eq!(err.flag, "--path-token-file");
        let text = format!("{err}: {}", err.reason);
        assert!(text.contains("--no-path-token"), "{text}");
        let both = parse(&[
            "--url",
            "https://h",
            "--no-path-token",
            "--path-token-file",
            "/t",
        ])
        .unwrap_err()
        .to_string();
        assert!(both.contains("cannot be used with"), "{both}");
    }

    /// A mesh label key asks for the mesh webhooks, as an images selector asks for the images
    /// entry: without them it would be dropped in silence.
    #[test]
    fn a_mesh_label_key_registers_the_mesh_webhooks() {
        let opts = parse(&[
            "--url",
            "https://h",
            "--no-path-token",
            "--mesh-label-key",
            "e.org/m",
        ])
        .unwrap()
        .read_files()
        .unwrap();
        assert!(opts.mesh);
        let v = mutating_webhook_configuration(&opts);
        let selectors: Vec<&Value> = webhooks(&v).iter().map(|w| &w["objectSelector"]).collect();
        assert!(
            selectors
                .iter()
                .any(|s| s["matchLabels"]["e.org/m"] == "true"),
            "{selectors:?}"
        );
    }

    #[test]
    fn every_flag_is_parsed_in_both_forms() {
        let parsed = parse(&[
            "--url=https://h",
            "--path-token-file",
            "/t",
            "--ca-bundle-file=/ca.pem",
            "--mesh",
            "--mesh-label-key",
            "example.org/mesh",
            "--failure-policy=Ignore",
            "--timeout-seconds",
            "8",
            "--name",
            "pm",
        ])
        .unwrap();
        assert_eq!(
            parsed,
            RegistrationOptions {
                url: Some("https://h".into()),
                path_token_file: Some("/t".into()),
                ca_bundle_file: Some("/ca.pem".into()),
                mesh: true,
                mesh_label_key: Some("example.org/mesh".into()),
                failure_policy: Some(FailurePolicy::Ignore),
                timeout_seconds: Some(8),
                name: Some("pm".into()),
                ..Default::default()
            }
        );
    }

    /// Each bad argument is refused before any file is read, with a message naming the flag
    /// and, where a rule is broken, the rule.
    #[rstest]
    #[case::missing_url(&[], "--url", "required")]
    #[case::http_url(&["--url", "http://h"], "--url", "must start with https://")]
    #[case::url_with_query(&["--url", "https://h/x?timeout=5s"], "--url", "query or fragment")]
    #[case::url_with_user(&["--url", "https://u@h"], "--url", "user info")]
    #[case::url_without_host(&["--url", "https:///x"], "--url", "has no host")]
    #[case::url_without_value(&["--url"], "--url", "a value is required")]
    #[case::url_followed_by_flag(&["--url", "--mesh"], "--url", "a value is required")]
    #[case::url_twice(&["--url", "https://a", "--url", "https://b"], "--url", "cannot be used multiple times")]
    #[case::empty_file(&["--url", "https://h", "--ca-bundle-file="], "--ca-bundle-file", "non-empty")]
    #[case::failure_policy_lowercase(&["--url", "https://h", "--failure-policy", "fail"], "--failure-policy", "must be Fail or Ignore")]
    #[case::timeout_not_a_number(&["--url", "https://h", "--timeout-seconds", "ten"], "--timeout-seconds", "whole number")]
    #[case::timeout_zero(&["--url", "https://h", "--timeout-seconds", "0"], "--timeout-seconds", "from 1 to 30")]
    #[case::timeout_over_the_kubernetes_limit(&["--url", "https://h", "--timeout-seconds", "31"], "--timeout-seconds", "from 1 to 30")]
    #[case::name_uppercase(&["--url", "https://h", "--name", "PodMutator"], "--name", "DNS subdomain")]
    #[case::label_key_with_quote(&["--url", "https://h", "--mesh-label-key", "a\"b"], "--mesh-label-key", "label key")]
    #[case::label_key_with_empty_name(&["--url", "https://h", "--mesh-label-key", "example.org/"], "--mesh-label-key", "label key")]
    #[case::mesh_with_value(&["--url", "https://h", "--mesh=true"], "--mesh", "unexpected value")]
    #[case::unknown_flag(&["--url", "https://h", "--ca-bundle", "x"], "--ca-bundle", "unexpected argument")]
    #[case::stray_argument(&["https://h"], "https://h", "unexpected argument")]
    fn bad_arguments_name_the_flag(#[case] list: &[&str], #[case] flag: &str, #[case] rule: &str) {
        let err = parse(list).unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
        assert!(err.contains(rule), "{err}");
    }

    fn temp_file(name: &str, contents: &[u8]) -> String {
        let dir =
            std::env::temp_dir().join(format!("podmutator-registration-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.display().to_string()
    }

    #[test]
    fn token_file_is_read_and_trimmed() {
        let token = temp_file("token-ok", format!("{TOKEN}\n").as_bytes());
        let ca = temp_file("ca-ok.pem", FAKE_PEM.as_bytes());
        let opts = parse(&[
            "--url",
            "https://h",
            "--path-token-file",
            &token,
            "--ca-bundle-file",
            &ca,
        ])
        .unwrap()
        .read_files()
        .unwrap();
        assert_eq!(opts.path_token.as_deref(), Some(TOKEN));
        assert_eq!(opts.ca_bundle_pem.as_deref(), Some(FAKE_PEM.as_bytes()));
    }

    #[rstest]
    #[case::short_token("--path-token-file", b"too-short")]
    #[case::token_with_slash("--path-token-file", b"abcdefghijklmnopqrstuvwxyz0123456789/ABCD")]
    #[case::ca_without_certificate("--ca-bundle-file", b"not a certificate")]
    #[case::ca_with_a_key(
        "--ca-bundle-file",
        b"-----BEGIN PRIVATE KEY-----\nZmFrZQ==\n-----END PRIVATE KEY-----\n-----BEGIN CERTIFICATE-----\nZmFrZQ==\n-----END CERTIFICATE-----\n"
    )]
    fn bad_file_contents_name_the_flag(#[case] flag: &str, #[case] contents: &[u8]) {
        let path = temp_file(&format!("bad{}", flag.len() + contents.len()), contents);
        let mut args = vec!["--url", "https://h", flag, &path];
        if flag != "--path-token-file" {
            args.push("--no-path-token");
        }
        let err = parse(&args).unwrap().read_files().unwrap_err();
        assert_eq!(err.flag, flag, "{err}");
    }

    #[test]
    fn missing_file_names_the_flag_and_the_path() {
        let err = parse(&[
            "--url",
            "https://h",
            "--no-path-token",
            "--ca-bundle-file",
            "/nonexistent/ca.pem",
        ])
        .unwrap()
        .read_files()
        .unwrap_err();
        assert_eq!(err.flag, "--ca-bundle-file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[rstest]
    #[case::plain("managed", true)]
    #[case::prefixed("aether.io/managed", true)]
    #[case::underscores_inside("example.org/a_b.c", true)]
    #[case::uppercase_prefix("Aether.io/managed", false)]
    #[case::leading_dash("-managed", false)]
    #[case::two_slashes("a/b/c", false)]
    #[case::too_long(&"a".repeat(64), false)]
    fn label_keys_follow_kubernetes_rules(#[case] key: &str, #[case] ok: bool) {
        assert_eq!(is_qualified_name(key), ok, "{key}");
    }
}
