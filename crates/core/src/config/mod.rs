//! Configuration: Flyte's `webhook` section (same keys, same defaults, spec §6) plus our own
//! sections, from `PODMUTATOR_CONFIG_FILE` (JSON or YAML) and/or `PODMUTATOR_CONFIG` (inline
//! JSON, merged over the file). Everything is validated once at start: an unknown key, a wrong
//! type or a contradictory setting stops the process with a message naming the key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use smart_default::SmartDefault;

/// Returns a [`ConfigError`] for `key` from the enclosing function:
/// `bail!(key, "format", args...)`.
macro_rules! bail {
    ($key:expr, $($message:tt)+) => {
        return Err($crate::config::ConfigError::new($key, format!($($message)+)))
    };
}

/// Returns a [`ConfigError`] for `key` from the enclosing function unless `cond` holds:
/// `ensure!(cond, key, "format", args...)`.
macro_rules! ensure {
    ($cond:expr, $key:expr, $($message:tt)+) => {
        if !$cond {
            bail!($key, $($message)+);
        }
    };
}

pub mod bounds;
pub mod embedded;
pub mod flyte;
pub mod http;
pub mod images;
pub mod mesh;
pub mod metrics;

pub use embedded::*;
pub use http::*;

pub const ENV_CONFIG_FILE: &str = "PODMUTATOR_CONFIG_FILE";
pub const ENV_CONFIG_INLINE: &str = "PODMUTATOR_CONFIG";
/// A whole Flyte (flytepropeller) configuration file, read for its `webhook` and `secrets`.
pub const ENV_FLYTE_CONFIG_FILE: &str = "PODMUTATOR_FLYTE_CONFIG_FILE";

/// How the configuration's JSON Schema describes a field of a Kubernetes type
/// (`ResourceRequirements`, `LabelSelector`, `SecurityContext`): an object, written as in a pod
/// spec, which the API server's own schema checks.
#[cfg(feature = "schema")]
pub struct KubernetesObject;

#[cfg(feature = "schema")]
impl schemars::JsonSchema for KubernetesObject {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "KubernetesObject".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "description": "A Kubernetes object of the field's type, written as in a pod spec",
        })
    }
}

/// The configuration's JSON Schema (draft 2020-12), derived from the types `Config` is read
/// into: every key, its type, default and description (the types' doc comments).
#[cfg(feature = "schema")]
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
    bounds::publish(&mut schema);
    schema
}

/// A configuration the process cannot start with. `key` is the dotted path of the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Flyte's webhook section, key for key.
    pub webhook: WebhookConfig,
    /// Flyte's `secrets` section: where the Global manager looks in this process.
    pub secrets: GlobalSecretsConfig,
    /// Our HTTP front: body limit and the optional secret path token.
    pub http: HttpConfig,
    /// Per-mutator settings (Flyte's `MutatorConfig`), keyed by mutator id.
    pub mutators: BTreeMap<MutatorId, MutatorConfig>,
    /// Embedded mode: deadline, cache and scope binding.
    pub embedded: EmbeddedConfig,
    /// Mesh pod mutations (all off unless `mesh.enabled`).
    pub mesh: mesh::MeshConfig,
    /// The pod label that asks for secret injection (Flyte's is fixed).
    #[serde(rename = "secretsSelector")]
    pub secrets_selector: SecretsSelector,
    /// CloudWatch Embedded Metric Format lines on stdout.
    pub metrics: metrics::MetricsConfig,
    /// What one admission may ask for: the cost one pod can impose is bounded here.
    pub limits: LimitsConfig,
    /// Registry rewrite rules (ECR pull-through caches, mirrors).
    pub images: images::ImagesConfig,
}

/// Bounds on what one pod may ask for, checked when its secrets are planned (before any fetch).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsConfig {
    /// Most `flyte.secrets/s<N>` annotations one pod may carry. A Flyte task lists its secrets
    /// by hand (a few, rarely dozens); 64 leaves room and bounds the planning work.
    #[default(64)]
    pub max_secret_requests_per_pod: usize,
    /// Most distinct Secrets Manager ids one admission may fetch. An Embedded request tries up
    /// to 3 ids (project, domain, organisation), so 64 requests need at most 192; 200 ids are
    /// 10 `BatchGetSecretValue` calls of 20, a tenth of the account's 100 calls/s.
    #[default(200)]
    pub max_secret_ids_per_admission: usize,
    /// Most JSON objects one review may hold, counted on its bytes before it is read into
    /// Kubernetes types, a container counting 8 and a volume 16 (their types take 2 and 3 KB,
    /// every other object's at most some 400 bytes): the bound on the memory a review can take.
    /// Real pods weigh a few hundred; 100,000 leaves room for a 10,000-container pod.
    #[default(100_000)]
    pub max_objects_per_review: usize,
}

/// Environment variable prefixes of this process's own credentials and runtime: a Global
/// `secrets.env-prefix` that matches any of them would hand them to pods.
pub const PROTECTED_ENV_PREFIXES: [&str; 4] = ["AWS_", "PODMUTATOR_", "_HANDLER", "LAMBDA_"];

/// Flyte's label that asks for secret injection (`secretsSelector`'s default).
pub const DEFAULT_SECRETS_LABEL: &str = "inject-flyte-secrets";
pub const DEFAULT_SECRETS_LABEL_VALUE: &str = "true";

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct SecretsSelector {
    #[default(DEFAULT_SECRETS_LABEL.into())]
    pub label: String,
    #[default(DEFAULT_SECRETS_LABEL_VALUE.into())]
    pub value: String,
}

crate::named_enum! {
    /// Flyte's `secretManagerTypes` values, in Flyte's order (a number is a position). JSON
    /// accepts the names in any case (as Flyte v2's enumer).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
    #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
    pub enum SecretManagerType as as_str {
        Global = "Global",
        K8s = "K8s",
        AWS = "AWS",
        GCP = "GCP",
        Vault = "Vault",
        Embedded = "Embedded",
        Azure = "Azure",
    }
}

impl<'de> Deserialize<'de> for SecretManagerType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let found = match Value::deserialize(d)? {
            Value::String(s) => Self::ALL
                .into_iter()
                .find(|t| t.as_str().eq_ignore_ascii_case(&s))
                .ok_or_else(|| format!(
                    "unknown secret manager type {s:?}, expected one of Global, K8s, AWS, GCP, Vault, Embedded, Azure"
                )),
            // Flyte's loader reads a number as the enum's position (Global is 0, Azure 6).
            Value::Number(n) => n
                .as_u64()
                .and_then(|i| Self::ALL.get(usize::try_from(i).ok()?).copied())
                .ok_or_else(|| format!(
                    "secret manager type {n} is not one of Flyte's (0 Global, 1 K8s, 2 AWS, 3 GCP, 4 Vault, 5 Embedded, 6 Azure); write its name"
                )),
            other => Err(format!(
                "expected a secret manager type's name (Global, K8s, AWS, GCP, Vault, Embedded or Azure), got {other}"
            )),
        };
        found.map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookConfig {
    #[serde(rename = "metrics-prefix")]
    #[default("flyte:".into())]
    pub metrics_prefix: String,
    /// Environment-expanded (`$VAR`, `${VAR}`) like Flyte's `os.ExpandEnv`.
    #[default("/etc/webhook/certs".into())]
    pub cert_dir: String,
    /// Generate a CA and serving certificate into `certDir` when none is there. Unset means
    /// "yes" for `podmutator serve` (local runs) — unlike Flyte, existing files are reused.
    pub local_cert: Option<bool>,
    #[default(9443)]
    pub listen_port: u16,
    /// `podmutator serve`: a second, plain-HTTP port with `/metrics` (Prometheus) and `/healthz`
    /// only, no path token and no admission route. Unset: no such listener.
    pub metrics_port: Option<u16>,
    /// Accepted for compatibility; Flyte's cache-invalidation server has no Lambda equivalent.
    #[default(9444)]
    pub cache_invalidation_port: u16,
    #[default("flyte-pod-webhook".into())]
    pub service_name: String,
    #[default(443)]
    pub service_port: u16,
    #[default("flyte-pod-webhook".into())]
    pub secret_name: String,
    /// Deprecated singular form; ignored when `secretManagerTypes` is non-empty.
    pub secret_manager_type: Option<SecretManagerType>,
    pub secret_manager_types: Vec<SecretManagerType>,
    pub aws_secret_manager: SidecarConfig,
    pub gcp_secret_manager: SidecarConfig,
    pub azure_secret_manager: SidecarConfig,
    pub vault_secret_manager: VaultConfig,
    pub embedded_secret_manager_config: EmbeddedSecretManagerConfig,
    pub image_builder_config: ImageBuilderConfig,
    /// Declared by Flyte and read nowhere; the registration's `timeoutSeconds` is set where the
    /// webhook is registered (Terraform / `podmutator webhook-config`).
    #[default(30)]
    pub webhook_timeout: u32,
    pub disable_create_mutating_webhook_config: bool,
    #[cfg_attr(feature = "schema", schemars(with = "Option<KubernetesObject>"))]
    pub namespace_selector: Option<LabelSelector>,
    pub kube_client_config: KubeClientConfig,
    #[default("_UNION_".into())]
    pub secret_env_var_prefix: String,
}

/// Our default when neither `secretManagerTypes` nor `secretManagerType` is set. Flyte v2
/// defaults to Embedded with a K8s fetcher, which needs a Kubernetes client; a webhook on Lambda
/// has none, so the no-network `K8s` manager (Flyte v1's default) is the safe default here.
pub const DEFAULT_SECRET_MANAGER_TYPE: SecretManagerType = SecretManagerType::K8s;

/// A sidecar manager: its type, its settings' key and settings, and its default image.
pub type SidecarManager<'a> = (
    SecretManagerType,
    &'static str,
    &'a SidecarConfig,
    &'static str,
);

impl WebhookConfig {
    /// Flyte's sidecar managers, in [`SECRET_MANAGER_CONTAINER_PREFIXES`]' order.
    pub fn sidecar_managers(&self) -> [SidecarManager<'_>; 3] {
        [
            (
                SecretManagerType::AWS,
                "awsSecretManager",
                &self.aws_secret_manager,
                AWS_SIDECAR_IMAGE,
            ),
            (
                SecretManagerType::GCP,
                "gcpSecretManager",
                &self.gcp_secret_manager,
                GCP_SIDECAR_IMAGE,
            ),
            (
                SecretManagerType::Azure,
                "azureSecretManager",
                &self.azure_secret_manager,
                AZURE_SIDECAR_IMAGE,
            ),
        ]
    }

    /// The managers tried for each secret, in order: Global first (always, once), then the
    /// configured list, or the deprecated singular type when the list is empty.
    pub fn enabled_secret_managers(&self) -> Vec<SecretManagerType> {
        let singular = self.secret_manager_types.is_empty().then(|| {
            self.secret_manager_type
                .unwrap_or(DEFAULT_SECRET_MANAGER_TYPE)
        });
        let mut out = vec![SecretManagerType::Global];
        for t in self.secret_manager_types.iter().copied().chain(singular) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// Whether the Embedded manager is one of them.
    pub fn embedded_enabled(&self) -> bool {
        self.enabled_secret_managers()
            .contains(&SecretManagerType::Embedded)
    }

    pub fn cert_dir_expanded(&self) -> String {
        expand_env(&self.cert_dir, |k| std::env::var(k).ok())
    }

    /// The `webhook` section's checks; its warnings.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let w = self;
        let mut warnings = Vec::new();
        if let Some(t) = w.secret_manager_type {
            warnings.push(if w.secret_manager_types.is_empty() {
                format!(
                    "webhook.secretManagerType is deprecated: use webhook.secretManagerTypes: [{t}] (Flyte 1.x reads only the singular key: a file Flyte 1.x also reads keeps it)"
                )
            } else if w.secret_manager_types.contains(&t) {
                "webhook.secretManagerType is deprecated and ignored because webhook.secretManagerTypes is set".into()
            } else {
                let list: Vec<String> = w.secret_manager_types.iter().map(|t| t.to_string()).collect();
                format!(
                    "webhook.secretManagerType is {t}, but webhook.secretManagerTypes [{}] is set and wins: {t} is not used (pods whose secrets only {t} serves are refused); add {t} to webhook.secretManagerTypes to keep it",
                    list.join(", ")
                )
            });
        }
        if w.vault_secret_manager.kv_version.is_some() {
            warnings.push(String::from(
                "webhook.vaultSecretManager.kvVersion is deprecated: set the secret's group_version (kv1, kv2 or db)"
            ));
        }
        for (i, t) in w.secret_manager_types.iter().enumerate() {
            if *t == SecretManagerType::Global {
                warnings.push(String::from(
                    "webhook.secretManagerTypes lists Global, which is always tried first; the entry is ignored"
                ));
            } else if w.secret_manager_types[..i].contains(t) {
                warnings.push(format!(
                    "webhook.secretManagerTypes lists {t} twice; the later entry is ignored"
                ));
            }
        }

        let e = &w.embedded_secret_manager_config;
        if w.embedded_enabled() {
            ensure!(
                e.kind == EmbeddedType::AWS,
                "webhook.embeddedSecretManagerConfig.type",
                "podmutator's Embedded manager fetches from AWS Secrets Manager only; set it to AWS (got {:?}) or remove Embedded from webhook.secretManagerTypes",
                e.kind
            );
            ensure!(
                !e.image_pull_secrets.enabled,
                "webhook.embeddedSecretManagerConfig.imagePullSecrets.enabled",
                "copying image-pull Secrets needs write access to the cluster, which this webhook does not have by design; set it to false"
            );
        }
        // The containers' settings are checked whether or not their manager is on: turning it
        // on never reveals a mistake in them.
        let init = &e.file_mount_init_container;
        ensure!(
            crate::k8s_names::is_dns_label(&init.container_name),
            "webhook.embeddedSecretManagerConfig.fileMountInitContainer.containerName",
            "{:?} is not a container name: lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit (default \"init-embedded-secret\")",
            init.container_name
        );
        images::check_image(
            "webhook.embeddedSecretManagerConfig.fileMountInitContainer.image",
            &init.image,
        )?;
        check_resources(
            "webhook.embeddedSecretManagerConfig.fileMountInitContainer.resources",
            &init.resources,
        )?;
        for (_, key, cfg, _) in w.sidecar_managers() {
            // Unset, the manager's default.
            if let Some(image) = &cfg.sidecar_image {
                images::check_image(&format!("webhook.{key}.sidecarImage"), image)?;
            }
            check_resources(
                &format!("webhook.{key}.resources"),
                &cfg.resources_or_default(),
            )?;
        }
        // The prefix starts every name the managers write: what no name may hold, it may not.
        ensure!(
            w.secret_env_var_prefix
                .bytes()
                .all(|b| (b' '..=b'~').contains(&b) && b != b'='),
            "webhook.secretEnvVarPrefix",
            "{:?} cannot start an environment variable name (printable ASCII other than '='): every ENV_VAR secret would be refused; use the default _UNION_",
            w.secret_env_var_prefix
        );
        let annotations = &w.vault_secret_manager.annotations;
        for (key, value) in annotations {
            ensure!(
                crate::k8s_names::is_qualified_name(key),
                "webhook.vaultSecretManager.annotations",
                "{key:?} is not an annotation key the API server accepts (a qualified name: an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.')"
            );
            if let Some(problem) = annotation_problem(key, value) {
                bail!(
                    format!("webhook.vaultSecretManager.annotations.{key}"),
                    "{value:?}: {problem}, or the API server refuses the pods it is added to"
                );
            }
        }
        let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        ensure!(
            size <= MAX_ANNOTATION_BYTES,
            "webhook.vaultSecretManager.annotations",
            "are {size} bytes: a pod's annotations may total {MAX_ANNOTATION_BYTES} at most"
        );
        let prefix = &w.secret_env_var_prefix;
        if prefix.starts_with(|c: char| c.is_ascii_digit())
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            warnings.push(format!(
                "webhook.secretEnvVarPrefix {prefix:?} is not a C identifier (letters, digits, '_', not starting with a digit): API servers before Kubernetes 1.32 refuse a pod with such an environment variable"
            ));
        }
        bounds::LISTEN_PORT.check(w.listen_port.into(), |b| {
            format!("must be a port number between {} and {}", b.min, b.max)
        })?;
        if let Some(p) = w.metrics_port {
            bounds::METRICS_PORT.check(p.into(), |b| {
                format!(
                    "must be a port number between {} and {} (leave it unset for no metrics port)",
                    b.min, b.max
                )
            })?;
        }
        ensure!(
            w.metrics_port != Some(w.listen_port),
            "webhook.metricsPort",
            "must differ from webhook.listenPort ({}): the metrics port is plain HTTP without the path token",
            w.listen_port
        );
        let mut unset = Vec::new();
        let dir = expand_env(&w.cert_dir, |k| {
            (std::env::var(k).map_err(|_| unset.push(k.to_owned()))).ok()
        });
        if !unset.is_empty() {
            warnings.push(format!(
                "webhook.certDir {:?}: {} is not set, so it reads as \"\" (as in Flyte) and the certificates are in {dir:?}",
                w.cert_dir,
                unset.join(", ")
            ));
        }
        ensure!(
            crate::k8s_names::is_dns_label(&w.service_name),
            "webhook.serviceName",
            "{:?} is not a Service name (the name the serving certificate is made for, with .<namespace> and .<namespace>.svc added): {}",
            w.service_name,
            crate::k8s_names::DNS_LABEL_RULE
        );
        if prefix.bytes().any(|b| b.is_ascii_lowercase()) {
            warnings.push(format!(
                "webhook.secretEnvVarPrefix {prefix:?} has lower-case letters: the variables are named upper-case ({:?}...), as in Flyte, while FLYTE_SECRETS_ENV_PREFIX tells flytekit {prefix:?}, so flytekit does not find ENV_VAR secrets; use {:?}",
                prefix.to_ascii_uppercase(),
                prefix.to_ascii_uppercase()
            ));
        }
        if w.secret_env_var_prefix.is_empty() {
            warnings.push(String::from(
                "webhook.secretEnvVarPrefix is empty: injected variables are named after group and key alone"
            ));
        }
        warnings.extend(images::check_image_builder(
            &w.image_builder_config,
            &w.embedded_secret_manager_config.file_mount_init_container,
        )?);
        Ok(warnings)
    }
}

/// A fetcher init container's image and resources (`awsSecretManager`, `gcpSecretManager`,
/// `azureSecretManager`). The image default depends on the provider, so it is optional here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SidecarConfig {
    pub sidecar_image: Option<String>,
    #[cfg_attr(feature = "schema", schemars(with = "Option<KubernetesObject>"))]
    pub resources: Option<ResourceRequirements>,
}

pub const AWS_SIDECAR_IMAGE: &str = "docker.io/amazon/aws-secrets-manager-secret-sidecar:v0.1.4";
pub const GCP_SIDECAR_IMAGE: &str = "gcr.io/google.com/cloudsdktool/cloud-sdk:alpine";
pub const AZURE_SIDECAR_IMAGE: &str = "mcr.microsoft.com/azure-cli:cbl-mariner2.0";

impl SidecarConfig {
    pub fn image_or(&self, default: &str) -> String {
        self.sidecar_image
            .clone()
            .unwrap_or_else(|| default.to_owned())
    }

    /// Flyte's default: requests = limits = 500Mi memory, 200m CPU.
    pub fn resources_or_default(&self) -> ResourceRequirements {
        self.resources
            .clone()
            .unwrap_or_else(|| equal_resources("500Mi", "200m"))
    }
}

pub fn equal_resources(memory: &str, cpu: &str) -> ResourceRequirements {
    let q: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]
    .into();
    ResourceRequirements {
        requests: Some(q.clone()),
        limits: Some(q),
        ..Default::default()
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct VaultConfig {
    #[default("flyte".into())]
    pub role: String,
    /// Deprecated: use the secret's `group_version` (`kv1`, `kv2`, `db`).
    pub kv_version: Option<KvVersion>,
    pub annotations: BTreeMap<String, String>,
}

/// Flyte marshals this enum as `"1"` / `"2"`. A bare number is refused: Flyte's loader reads it
/// as the enum's position, so Flyte takes `kvVersion: 1` for KV2, and no reading of ours could
/// be both Flyte's and what the writer meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum KvVersion {
    #[serde(rename = "1")]
    V1,
    #[serde(rename = "2")]
    V2,
}

impl<'de> Deserialize<'de> for KvVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let message = match Value::deserialize(d)? {
            Value::String(s) if s == "1" => return Ok(Self::V1),
            Value::String(s) if s == "2" => return Ok(Self::V2),
            Value::Number(n) => format!(
                "write \"1\" or \"2\", quoted: Flyte reads a bare {n} as the version's position (1 is KV2 there), so a number cannot mean the same to both"
            ),
            other => format!("expected \"1\" or \"2\", got {other}"),
        };
        Err(serde::de::Error::custom(message))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum EmbeddedType {
    AWS,
    GCP,
    Azure,
    #[default]
    K8s,
}

impl<'de> Deserialize<'de> for EmbeddedType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        [Self::AWS, Self::GCP, Self::Azure, Self::K8s]
            .into_iter()
            .find(|t| format!("{t:?}").eq_ignore_ascii_case(&s))
            .ok_or_else(|| serde::de::Error::custom(format!(
                "unknown embedded secret manager type {s:?}, expected one of AWS, GCP, Azure, K8s"
            )))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EmbeddedSecretManagerConfig {
    #[serde(rename = "type")]
    pub kind: EmbeddedType,
    pub aws_config: AwsConfig,
    pub gcp_config: GcpConfig,
    pub azure_config: AzureConfig,
    pub k8s_config: K8sFetcherConfig,
    pub file_mount_init_container: FileMountInitContainer,
    pub image_pull_secrets: ImagePullSecrets,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct AwsConfig {
    pub region: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct GcpConfig {
    pub project: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct AzureConfig {
    #[serde(rename = "vaultURI")]
    pub vault_uri: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct K8sFetcherConfig {
    #[default("flyte".into())]
    pub namespace: String,
    pub kube_client_config: KubeClientConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FileMountInitContainer {
    #[default("public.ecr.aws/docker/library/busybox:latest".into())]
    pub image: String,
    #[cfg_attr(feature = "schema", schemars(with = "KubernetesObject"))]
    #[default(equal_resources("100Mi", "100m"))]
    pub resources: ResourceRequirements,
    #[default("init-embedded-secret".into())]
    pub container_name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ImagePullSecrets {
    pub enabled: bool,
}

/// The Union fork's image-builder settings (`crate::mutate::image::builder`), key for key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageBuilderConfig {
    pub enabled: bool,
    pub hostname_replacement: HostnameReplacement,
    #[cfg_attr(feature = "schema", schemars(with = "Option<KubernetesObject>"))]
    pub label_selector: Option<LabelSelector>,
    /// By default the Embedded manager's init container: it carries secret values, so it keeps
    /// its image.
    #[default(vec!["init-embedded-secret".into()])]
    pub excluded_container_names: Vec<String>,
    pub excluded_image_prefixes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HostnameReplacement {
    pub existing: String,
    pub replacement: String,
    pub disable_verification: bool,
}

/// Flyte's Kubernetes client tuning. Accepted and validated; a Lambda webhook has no client.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct KubeClientConfig {
    #[default(100)]
    pub qps: i32,
    #[default(25)]
    pub burst: i32,
    /// A Go duration such as `30s`.
    #[default("30s".into())]
    pub timeout: String,
}

/// Flyte's `secrets` section, used by the Global manager.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct GlobalSecretsConfig {
    #[serde(rename = "type")]
    #[default("local".into())]
    pub kind: String,
    #[serde(rename = "secrets-prefix")]
    #[default("/etc/secrets".into())]
    pub secrets_prefix: String,
    #[serde(rename = "env-prefix")]
    #[default("FLYTE_SECRET_".into())]
    pub env_prefix: String,
}

impl GlobalSecretsConfig {
    /// The `secrets` section's checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_global_env_prefix(&self.env_prefix)?;
        check_global_secrets_prefix(&self.secrets_prefix)?;
        ensure!(
            self.kind == "local",
            "secrets.type",
            "only \"local\" (environment and files of this process) is supported, got {:?}",
            self.kind
        );
        Ok(())
    }
}

/// The Global manager hands pods every variable of this process that starts with
/// `secrets.env-prefix`: a prefix that also matches this process's credentials or runtime
/// variables (or is matched by one of their prefixes, like `A` or the empty string) would
/// serve them to any selected pod.
fn check_global_env_prefix(prefix: &str) -> Result<(), ConfigError> {
    ensure!(
        !prefix.is_empty(),
        "secrets.env-prefix",
        "is empty: the Global manager would serve every variable of this process (its AWS credentials included) to pods; use Flyte's default FLYTE_SECRET_"
    );
    if let Some(p) = PROTECTED_ENV_PREFIXES
        .iter()
        .find(|p| p.starts_with(prefix) || prefix.starts_with(*p))
    {
        bail!(
            "secrets.env-prefix",
            "{prefix:?} overlaps {p:?}, the prefix of this process's own credentials or runtime variables, which the Global manager would then serve to pods; use Flyte's default FLYTE_SECRET_"
        );
    }
    Ok(())
}

/// The Global manager serves pods every file below `secrets.secrets-prefix`
/// (`<prefix>/<group>/<key>`): the root, or a directory of the system's or this process's own
/// (its environment under `/proc`, a service account token under `/run`), would hand them out.
/// The directories named here are the known ones, not every one a host may have.
fn check_global_secrets_prefix(prefix: &str) -> Result<(), ConfigError> {
    // Never below these; nor one of these top-level directories itself (nor the root).
    const SYSTEM: [&str; 8] = [
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/var/run",
        "/root",
        "/var/lib/kubelet",
        "/var/task",
    ];
    const TOP: [&str; 6] = ["/etc", "/var", "/usr", "/home", "/opt", "/boot"];
    let key = "secrets.secrets-prefix";
    let dir = prefix.trim_end_matches('/');
    let mut components = dir.split('/').skip(1);
    ensure!(
        prefix.starts_with('/') && components.all(|c| !matches!(c, "" | "." | "..")),
        key,
        "{prefix:?} must be a clean absolute path (no empty, '.' or '..' components), the directory of the Global secrets' files; Flyte's default is /etc/secrets"
    );
    let inside = |d: &str| dir == d || dir.starts_with(&format!("{d}/"));
    ensure!(
        !dir.is_empty() && !TOP.contains(&dir) && !SYSTEM.iter().any(|d| inside(d)),
        key,
        "{prefix:?} would serve pods files that are not secrets for them (the root, a system directory such as {}, or one below {}): name a directory that holds only those files; Flyte's default is /etc/secrets",
        TOP.join(", "),
        SYSTEM.join(", ")
    );
    Ok(())
}

crate::named_enum! {
    /// A mutator's id: the key of its `mutators.<id>` settings (its name as configuration keys,
    /// metrics and logs write it), declared in chain order. An unknown id is refused at load.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
    #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
    #[serde(rename_all = "kebab-case")]
    pub enum MutatorId as as_str {
        NamespaceInjection = "namespace-injection",
        Secrets = "secrets",
        Dns = "dns",
        InitGate = "init-gate",
        SocketCheck = "socket-check",
        ImageBuilder = "image-builder",
        ImageRules = "image-rules",
    }
}

/// Flyte's `MutatorConfig`: a required mutator's failure denies the pod; an optional one's
/// failure admits it with a warning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct MutatorConfig {
    pub required: bool,
}

/// The most a configuration file may hold: four times a ConfigMap's (etcd's 1 MiB object).
pub const MAX_CONFIG_FILE_BYTES: u64 = 4 << 20;

/// A configuration file's text: a regular file (or a link to one) of at most
/// [`MAX_CONFIG_FILE_BYTES`], so that `/dev/zero`, a FIFO or a runaway file given by mistake is
/// an error naming it, not a read until memory runs out or forever.
pub fn read_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    // Looked at before opening: opening a FIFO waits for a writer.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a configuration is a file: not a device, a FIFO or a socket)",
        ));
    }
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_FILE_BYTES} bytes, which no configuration needs"),
        ));
    }
    Ok(text)
}

/// A loaded configuration and the warnings to log once at start.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<String>,
    /// Every key the sources set, as dotted paths to their values (a map's or a Kubernetes
    /// object's keys not followed), in order.
    pub read: Vec<String>,
    /// What was in the sources and is not read: Flyte's other sections (`file: section`) and
    /// the keys of [`flyte::SKIPPED_KEYS`].
    pub skipped: Vec<String>,
}

/// Keys accepted so that Flyte's configurations load, which podmutator never reads
/// (docs/configuration.md says "unused" of each).
pub const UNUSED_KEYS: [&str; 11] = [
    "webhook.metrics-prefix",
    "webhook.cacheInvalidationPort",
    "webhook.servicePort",
    "webhook.secretName",
    "webhook.webhookTimeout",
    "webhook.disableCreateMutatingWebhookConfig",
    "webhook.namespaceSelector",
    "webhook.kubeClientConfig",
    "webhook.embeddedSecretManagerConfig.gcpConfig",
    "webhook.embeddedSecretManagerConfig.azureConfig",
    "webhook.embeddedSecretManagerConfig.k8sConfig",
];

impl Loaded {
    /// The keys read that are in [`UNUSED_KEYS`] (or under one).
    pub fn unused(&self) -> Vec<&str> {
        self.read
            .iter()
            .map(String::as_str)
            .filter(|k| {
                UNUSED_KEYS
                    .iter()
                    .any(|u| *k == *u || k.strip_prefix(u).is_some_and(|r| r.starts_with('.')))
            })
            .collect()
    }
}

impl Config {
    /// Parses `file` (JSON, or YAML when it is not JSON) and `inline` (JSON, merged over the file
    /// key by key; `PODMUTATOR_CONFIG`), then validates.
    pub fn load(file: Option<(&str, &str)>, inline: Option<&str>) -> Result<Loaded, ConfigError> {
        Self::load_with_flyte(&[], file, inline.map(|t| (ENV_CONFIG_INLINE, t)))
    }

    /// [`Config::load`] over a whole Flyte configuration (`--flyte-config`), given as the files
    /// Flyte itself would read (or ConfigMap objects holding them), merged in order: their
    /// `webhook` and `secrets` sections are read, Flyte's other sections skipped
    /// ([`flyte::sections`]), and `file` and `inline` are merged over them. Each source comes
    /// with the name its errors give: a path, or for `inline` the option or variable it came by.
    pub fn load_with_flyte(
        flyte: &[(&str, &str)],
        file: Option<(&str, &str)>,
        inline: Option<(&str, &str)>,
    ) -> Result<Loaded, ConfigError> {
        let mut merged = Value::Object(Default::default());
        let mut skipped = Vec::new();
        // Each source's key names are made ours before it is merged ([`flyte::canonical_keys`]),
        // and each is kept to tell which one set a key an error names.
        let mut sources: Vec<(String, Value)> = Vec::new();
        let mut merge_in = |name: &str, mut v: Value| {
            flyte::canonical_keys(&mut v);
            merge(&mut merged, v.clone());
            sources.push((name.to_owned(), v));
        };
        let mut found = false;
        for (path, text) in flyte {
            for (name, doc) in flyte::documents(path, text)? {
                let (read, others) = flyte::sections(&name, doc)?;
                found |= read.as_object().is_some_and(|r| !r.is_empty());
                merge_in(&name, read);
                skipped.extend(others.into_iter().map(|s| format!("{name}: {s}")));
            }
        }
        let not_found = (!flyte.is_empty() && !found).then(|| {
            format!(
                "--flyte-config {}: no webhook or secrets section was found, so Flyte's defaults apply; give flytepropeller's configuration (the files, or the ConfigMap that holds them)",
                flyte.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(", ")
            )
        });
        if let Some((path, text)) = file {
            let v = parse_document(text).map_err(|e| ConfigError::new(path, e))?;
            merge_in(path, v);
        }
        if let Some((name, text)) = inline.filter(|(_, t)| !t.trim().is_empty()) {
            let v: Value = serde_json::from_str(text)
                .map_err(|e| ConfigError::new(name, format!("not valid JSON: {e}")))?;
            merge_in(name, v);
        }
        let mut loaded = Self::from_value(merged).map_err(|mut e| {
            // Among several sources, the last that sets the key the error names.
            let setter = sources.iter().rev().find(|(_, v)| holds(v, &e.key));
            if let Some((name, _)) = setter.filter(|_| sources.len() > 1) {
                e.message = format!("{} (set in {name})", e.message);
            }
            e
        })?;
        loaded.warnings.extend(not_found);
        skipped.append(&mut loaded.skipped);
        loaded.skipped = skipped;
        Ok(loaded)
    }

    pub fn from_value(mut v: Value) -> Result<Loaded, ConfigError> {
        ensure!(v.is_object(), "(root)", "expected a mapping of sections");
        // Flyte's sections are read as Flyte reads them (`null` is unset, quoted numbers, key
        // case); ours keep `null` where it means "none" (mesh.gate.securityContext).
        let mut warnings = Vec::new();
        let skipped = flyte::decode(&mut v, &mut warnings);
        let read = read_keys(&v);
        let decoded = loop {
            match serde_path_to_error::deserialize(&v) {
                Err(e) if flyte::text_where_expected(&mut v, &e) => continue,
                decoded => break decoded,
            }
        };
        let mut config: Config = decoded.map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            let key = match path.strip_suffix(".?") {
                _ if path == "." => "(root)".to_owned(),
                // A map key that is not one of its type's (a mutator id): name the key.
                Some(map) => match inner.split('`').nth(1) {
                    Some(name) if inner.starts_with("unknown variant") => format!("{map}.{name}"),
                    _ => path,
                },
                None => path,
            };
            ConfigError::new(&key, in_users_words(&inner, &key))
        })?;
        check_kubernetes_values(&v, &config)?;
        config
            .embedded
            .follow_defaults(|key| read.iter().any(|k| k == key));
        warnings.extend(config.validate()?);
        Ok(Loaded {
            config,
            warnings,
            read,
            skipped,
        })
    }

    /// Checks what types cannot express; returns the warnings worth logging.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let w = &self.webhook;
        let mut warnings = w.validate()?;
        warnings.extend(self.embedded.validate(w.embedded_enabled())?);
        warnings.extend(self.http.validate(self.embedded_reads().values)?);
        self.limits.validate()?;
        self.secrets.validate()?;
        warnings.extend(self.images.validate()?);
        warnings.extend(self.mesh.validate()?);
        warnings.extend(self.file_mount_the_builder_denies());
        self.check_reserved_names()?;
        self.metrics.validate()?;
        let SecretsSelector { label, value } = &self.secrets_selector;
        ensure!(
            crate::k8s_names::is_qualified_name(label),
            "secretsSelector.label",
            "{label:?} is not a valid Kubernetes label key"
        );
        ensure!(
            crate::k8s_names::is_label_value(value),
            "secretsSelector.value",
            "{value:?} is not a valid Kubernetes label value"
        );
        // Namespace injection writes that label; secrets are planned before it runs.
        ensure!(
            !self.mesh.enabled || self.secrets_selector.label != self.mesh.managed_label,
            "secretsSelector.label",
            "must differ from mesh.managedLabel: the mesh label is written by the namespace-injection mutator, and the secrets selector must be the pod's own"
        );
        Ok(warnings)
    }

    /// The init containers the webhook adds to pods itself, beside the Embedded file-mount one
    /// (which `excludedContainerNames` exempts, as in Union): each name, whether it is a name
    /// prefix (the sidecars are numbered), and its image, for what `self` turns on.
    pub fn own_init_containers(&self) -> Vec<(String, bool, String)> {
        let w = &self.webhook;
        let managers = w.enabled_secret_managers();
        let mut own = vec![];
        if self.embedded_reads().names {
            let name = SECRET_MANAGER_CONTAINERS[0].to_owned();
            own.push((name, false, self.embedded.fetcher_image.clone()));
        }
        for ((t, _, cfg, default), prefix) in w
            .sidecar_managers()
            .into_iter()
            .zip(SECRET_MANAGER_CONTAINER_PREFIXES)
        {
            if managers.contains(&t) {
                own.push((prefix.to_owned(), true, cfg.image_or(default)));
            }
        }
        let gate = &self.mesh.gate;
        if self.mesh.enabled && gate.enabled {
            own.push((gate.name.clone(), false, gate.image.clone()));
        }
        own
    }

    /// A warning when the image builder, verifying, would deny the Embedded file-mount init
    /// container: `excludedContainerNames` no longer lists it, and no excluded prefix or the
    /// replacement registry's shared path covers its image.
    fn file_mount_the_builder_denies(&self) -> Option<String> {
        let w = &self.webhook;
        let b = &w.image_builder_config;
        let init = &w.embedded_secret_manager_config.file_mount_init_container;
        let r = &b.hostname_replacement.replacement;
        let shared = [format!("{r}/union/"), format!("{r}/v1/union/")];
        let writes_files =
            w.embedded_enabled() && self.embedded.delivery == embedded::Delivery::Value;
        (b.enabled
            && !b.hostname_replacement.disable_verification
            && writes_files
            && !b.excluded_container_names.contains(&init.container_name)
            && !b.excluded_image_prefixes.iter().chain(&shared).any(|p| init.image.starts_with(p.as_str())))
        .then(|| format!(
            "webhook.embeddedSecretManagerConfig.fileMountInitContainer.image {:?}: webhook.imageBuilderConfig.excludedContainerNames does not list {:?} and no excludedImagePrefixes entry covers the image: with verification on, the image builder denies every pod with an Embedded file secret that it reaches",
            init.image, init.container_name
        ))
    }

    /// Whether a mutator's failure denies the pod; the default is in [`crate::mutate`].
    pub fn mutator_required(&self, id: MutatorId, default: bool) -> bool {
        self.mutators.get(&id).map_or(default, |m| m.required)
    }

    /// The mesh gate's container and volume are not named like those the secret managers add:
    /// the gate would be taken for theirs, or skipped as the pod's own.
    fn check_reserved_names(&self) -> Result<(), ConfigError> {
        let g = &self.mesh.gate;
        if !self.mesh.enabled || !g.enabled {
            return Ok(());
        }
        let file_mount = &self
            .webhook
            .embedded_secret_manager_config
            .file_mount_init_container
            .container_name;
        let taken = g.name == *file_mount
            || SECRET_MANAGER_CONTAINERS.contains(&g.name.as_str())
            || SECRET_MANAGER_CONTAINER_PREFIXES
                .iter()
                .any(|p| g.name.starts_with(p));
        ensure!(
            !taken,
            "mesh.gate.name",
            "{:?} is a name the secret managers give their init containers ({file_mount:?}, {}, {}<id>): choose another",
            g.name,
            SECRET_MANAGER_CONTAINERS.join(", "),
            SECRET_MANAGER_CONTAINER_PREFIXES.join("<id>, ")
        );
        ensure!(
            !SECRET_MANAGER_VOLUMES.contains(&g.volume.name.as_str()),
            "mesh.gate.volume.name",
            "{:?} is a volume the secret managers add ({}): choose another",
            g.volume.name,
            SECRET_MANAGER_VOLUMES.join(", ")
        );
        Ok(())
    }
}

/// The init containers (by name, or name prefix) and volumes the secret managers add, which the
/// mesh gate may not take (held to the managers' own constants by `app`'s tests).
pub const SECRET_MANAGER_CONTAINERS: [&str; 1] = ["podmutator-fetch"];
pub const SECRET_MANAGER_CONTAINER_PREFIXES: [&str; 3] =
    ["aws-pull-secret-", "gcp-pull-secret-", "azure-pull-secret-"];
pub const SECRET_MANAGER_VOLUMES: [&str; 6] = [
    "embedded-secret-vol",
    "podmutator-secret-files",
    "podmutator-run",
    "aws-secret-vol",
    "gcp-secret-vol",
    "azure-secret-vol",
];

impl LimitsConfig {
    /// The `limits` section's checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        bounds::MAX_SECRET_REQUESTS_PER_POD
            .check(self.max_secret_requests_per_pod as u64, |_| {
                "must be positive (default 64)".into()
            })?;
        bounds::MAX_SECRET_IDS_PER_ADMISSION
            .check(self.max_secret_ids_per_admission as u64, |_| {
                "must be positive (default 200)".into()
            })?;
        bounds::MAX_OBJECTS_PER_REVIEW.check(self.max_objects_per_review as u64, |b| {
            format!(
                "must be from {} to {} (default 100000): what a review may hold costs some 400 bytes of memory an object",
                b.min, b.max
            )
        })
    }
}

/// A quantity's value (`500Mi`, `0.5`, `1e3`, `100m`), or `None` when it is no Kubernetes
/// quantity.
fn quantity_value(q: &str) -> Option<f64> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let digits = number.trim_start_matches(['+', '-']);
    if digits.is_empty()
        || digits.matches('.').count() > 1
        || digits == "."
        || number.len() - digits.len() > 1
    {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    // The decimal suffixes are powers of 1000 from 1000^-3 (`n`), the binary ones of 1024.
    let power = |suffixes: &[&str]| suffixes.iter().position(|s| *s == suffix);
    let scale = if let Some(i) = power(&["n", "u", "m", "", "k", "M", "G", "T", "P", "E"]) {
        1000f64.powi(i as i32 - 3)
    } else if let Some(i) = power(&["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]) {
        1024f64.powi(i as i32 + 1)
    } else {
        let exp = suffix.strip_prefix(['e', 'E'])?;
        let digits = exp.trim_start_matches(['+', '-']);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        10f64.powi(exp.parse().ok()?)
    };
    Some(value * scale)
}

/// Resources the webhook writes into a container of its own, as the API server checks a pod's:
/// quantities, non-negative, a container's resource names, whole extended resources that are
/// not overcommitted, requests at most the limits, and no claims (the pod's `resourceClaims` are
/// not the webhook's to know).
pub fn check_resources(key: &str, r: &ResourceRequirements) -> Result<(), ConfigError> {
    ensure!(
        r.claims.as_ref().is_none_or(Vec::is_empty),
        format!("{key}.claims"),
        "must be empty: a claim names one of the pod's resourceClaims, which differ from pod to pod"
    );
    // A resource of a domain other than Kubernetes'.
    let extended = |name: &str| name.contains('/') && !name.contains("kubernetes.io/");
    let mut values = BTreeMap::new();
    for (part, list) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (name, q) in list.iter().flatten() {
            let at = format!("{key}.{part}.{name}");
            ensure!(
                crate::k8s_names::is_qualified_name(name),
                at,
                "{name:?} is not a resource name"
            );
            // The API server's container resource names: a name without a domain is one of its own.
            ensure!(
                name.contains('/')
                    || ["cpu", "memory", "ephemeral-storage"].contains(&name.as_str())
                    || name.starts_with("hugepages-"),
                at,
                "{name:?} is not a container resource: cpu, memory, ephemeral-storage, hugepages-<size>, or a name with a domain (example.com/dongle); names are lower-case"
            );
            let v = quantity_value(&q.0).filter(|v| v.is_finite() && *v >= 0.0);
            let Some(v) = v else {
                bail!(
                    at,
                    "{:?} is not a non-negative quantity (such as 100m, 0.5, 500Mi or 1Gi)",
                    q.0
                );
            };
            ensure!(
                !extended(name) || v.fract() == 0.0,
                at,
                "{:?}: an extended resource is counted in whole units",
                q.0
            );
            ensure!(
                !(extended(name) && name.starts_with("requests.")),
                at,
                "{name:?}: an extended resource's name cannot start with `requests.`"
            );
            if let Some(page) = name.strip_prefix("hugepages-") {
                let page = quantity_value(page).filter(|p| *p > 0.0);
                ensure!(
                    page.is_some_and(|p| (v / p).fract() == 0.0),
                    at,
                    "{:?}: huge pages are a whole number of pages of the size the name gives (hugepages-2Mi: 2Mi, 4Mi, ...)",
                    q.0
                );
            }
            values.insert((part, name.clone()), v);
        }
    }
    for ((part, name), v) in &values {
        if *part == "requests" && (extended(name) || name.starts_with("hugepages-")) {
            let limit = values.get(&("limits", name.clone()));
            ensure!(
                limit == Some(v),
                format!("{key}.requests.{name}"),
                "must equal the limit ({}): an extended resource or huge pages are not overcommitted",
                limit.map_or_else(|| "unset".to_owned(), f64::to_string)
            );
        }
    }
    let huge_pages = values.keys().find(|(_, n)| n.starts_with("hugepages-"));
    if let Some((part, name)) = huge_pages {
        ensure!(
            values.keys().any(|(_, n)| n == "cpu" || n == "memory"),
            format!("{key}.{part}.{name}"),
            "huge pages need a cpu or memory request or limit beside them"
        );
    }
    for ((part, name), request) in &values {
        if *part == "requests"
            && let Some(limit) = values.get(&("limits", name.clone()))
        {
            // In binary floating point `700m` is a hair over `0.7`: equal within rounding.
            ensure!(
                request.total_cmp(&(limit * (1.0 + 1e-12))).is_le(),
                format!("{key}.requests.{name}"),
                "must not exceed the limit ({request} over {limit})"
            );
        }
    }
    Ok(())
}

/// A security context the webhook writes into a container of its own, as the API server checks
/// a pod's.
pub fn check_security_context(
    key: &str,
    sc: &k8s_openapi::api::core::v1::SecurityContext,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for (field, id) in [
        ("runAsUser", sc.run_as_user),
        ("runAsGroup", sc.run_as_group),
    ] {
        ensure!(
            id.is_none_or(|id| (0..=i64::from(i32::MAX)).contains(&id)),
            format!("{key}.{field}"),
            "must be from 0 to 2147483647"
        );
    }
    let seccomp = sc.seccomp_profile.as_ref().map(|p| {
        (
            "seccompProfile",
            p.type_.as_str(),
            p.localhost_profile.as_deref(),
        )
    });
    let app_armor = sc.app_armor_profile.as_ref().map(|p| {
        (
            "appArmorProfile",
            p.type_.as_str(),
            p.localhost_profile.as_deref(),
        )
    });
    for (field, kind, named) in seccomp.into_iter().chain(app_armor) {
        ensure!(
            ["RuntimeDefault", "Unconfined", "Localhost"].contains(&kind)
                && named.is_some() == (kind == "Localhost"),
            format!("{key}.{field}"),
            "type {kind:?}: use RuntimeDefault, Unconfined, or Localhost with its localhostProfile (and a localhostProfile only with Localhost)"
        );
        // As the API server reads a Localhost profile: a name, or a path below the
        // kubelet's profile directory.
        let Some(name) = named else { continue };
        ensure!(
            !name.is_empty()
                && name.trim() == name
                && (field == "appArmorProfile" || is_local_descending_path(name)),
            format!("{key}.{field}.localhostProfile"),
            "{name:?}: name the profile without padding; a seccomp profile is a path relative to the kubelet's seccomp directory, without '..'"
        );
    }
    ensure!(
        !(sc.run_as_non_root == Some(true) && sc.run_as_user == Some(0)),
        format!("{key}.runAsNonRoot"),
        "cannot be true with runAsUser: 0: the kubelet would refuse to start the container"
    );
    if let Some(w) = &sc.windows_options {
        ensure!(
            w.host_process != Some(true),
            format!("{key}.windowsOptions.hostProcess"),
            "cannot be true: the API server refuses it unless every container of the pod is a host process and hostNetwork is true"
        );
        // What the API server checks of them in any pod.
        let user = w.run_as_user_name.as_deref();
        ensure!(
            user.is_none_or(|u| !u.is_empty() && u.matches('\\').count() <= 1)
                && w.gmsa_credential_spec
                    .as_deref()
                    .is_none_or(|s| !s.is_empty())
                && w.gmsa_credential_spec_name
                    .as_deref()
                    .is_none_or(crate::k8s_names::is_dns_subdomain),
            format!("{key}.windowsOptions"),
            "runAsUserName must be a user name (at most one '\\'), gmsaCredentialSpec not empty, gmsaCredentialSpecName a DNS subdomain"
        );
        warnings.push(format!("{key}.windowsOptions is set: the API server refuses it in a pod with spec.os.name: linux"));
    }
    let no_escalation = sc.allow_privilege_escalation == Some(false);
    let sys_admin = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_some_and(|a| a.iter().any(|c| c == "CAP_SYS_ADMIN"));
    ensure!(
        !(no_escalation && (sc.privileged == Some(true) || sys_admin)),
        format!("{key}.allowPrivilegeEscalation"),
        "cannot be false with privileged: true or the CAP_SYS_ADMIN capability"
    );
    if let Some(m) = &sc.proc_mount {
        ensure!(
            m == "Default" || m == "Unmasked",
            format!("{key}.procMount"),
            "{m:?}: use Default or Unmasked"
        );
        if m == "Unmasked" {
            warnings.push(format!("{key}.procMount is Unmasked: the API server refuses it in a pod without hostUsers: false"));
        }
    }
    Ok(())
}

/// What the API server allows a pod's annotations to total, keys and values.
const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// What is wrong with the annotation `key: value` for the API server, which reads a few
/// annotations of a pod and refuses the pod when they do not parse; `None` for the others.
fn annotation_problem(key: &str, value: &str) -> Option<&'static str> {
    const CONTAINER_SECCOMP: &str = "container.seccomp.security.alpha.kubernetes.io/";
    const APPARMOR: &str = "container.apparmor.security.beta.kubernetes.io/";
    let (fine, problem) = match key {
        "kubernetes.io/config.mirror" => (
            false,
            "marks a mirror pod, which the API server takes only with the spec.nodeName a kubelet writes",
        ),
        // Go's parse, as the API server reads it: no '+', no leading zero.
        "controller.kubernetes.io/pod-deletion-cost" => (
            (value == "0" || value.starts_with(['-', '1', '2', '3', '4', '5', '6', '7', '8', '9']))
                && value.parse::<i32>().is_ok(),
            "must be a 32-bit integer written without '+' or leading zeros",
        ),
        "scheduler.alpha.kubernetes.io/tolerations" => {
            use crate::k8s_names::{is_label_value, is_qualified_name};
            use k8s_openapi::api::core::v1::Toleration;
            let valid = |t: &Toleration| {
                let [key, op, val, effect] =
                    [&t.key, &t.operator, &t.value, &t.effect].map(|f| f.as_deref().unwrap_or(""));
                (key.is_empty() && op == "Exists" || !key.is_empty() && is_qualified_name(key))
                    && (op == "Exists" && val.is_empty()
                        || matches!(op, "" | "Equal") && is_label_value(val))
                    && ["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect)
                    && (t.toleration_seconds.is_none() || effect == "NoExecute")
            };
            // Unset when empty; Go reads `null` as no list.
            let fine = value.is_empty()
                || serde_json::from_str::<Option<Vec<Toleration>>>(value)
                    .is_ok_and(|ts| ts.iter().flatten().all(valid));
            (
                fine,
                "must be a JSON list of tolerations as the API server checks them (an empty key with operator Exists, Exists without a value, tolerationSeconds only with NoExecute)",
            )
        }
        k if k == "seccomp.security.alpha.kubernetes.io/pod"
            || k.starts_with(CONTAINER_SECCOMP) =>
        {
            (
                matches!(value, "runtime/default" | "docker/default" | "unconfined")
                    || value
                        .strip_prefix("localhost/")
                        .is_some_and(is_local_descending_path),
                "must be runtime/default, docker/default, unconfined or localhost/<path relative to the kubelet's seccomp directory>",
            )
        }
        k if k.starts_with(APPARMOR) => (
            matches!(value, "" | "runtime/default" | "unconfined")
                || value.starts_with("localhost/"),
            "must be runtime/default, unconfined or localhost/<profile>",
        ),
        _ => (true, ""),
    };
    (!fine).then_some(problem)
}

/// A path the API server reads as below a directory of the kubelet's (a seccomp profile's):
/// relative, without `..`.
fn is_local_descending_path(p: &str) -> bool {
    !p.starts_with('/') && !p.split('/').any(|s| s == "..")
}

/// The placeholders `embedded.namespaceTemplate` may use, in slot order.
pub const PLACEHOLDERS: [&str; 3] = ["organization", "project", "domain"];

/// A piece of a namespace template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    /// An index into [`PLACEHOLDERS`].
    Slot(usize),
}

/// `t` cut at its `{{ name }}` placeholders, or what is wrong with it: an unclosed `{{`, or a
/// name other than `organization`, `project` and `domain`.
pub fn template_parts(t: &str) -> Result<Vec<TemplatePart>, String> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unclosed '{{{{' in {t:?}"))?;
        let name = after[..end].trim();
        let slot = PLACEHOLDERS.iter().position(|p| *p == name).ok_or_else(|| {
            format!(
                "unknown placeholder {{{{ {name} }}}} in {t:?}; use {{{{ organization }}}}, {{{{ project }}}} or {{{{ domain }}}}"
            )
        })?;
        if start > 0 {
            out.push(TemplatePart::Literal(rest[..start].to_owned()));
        }
        out.push(TemplatePart::Slot(slot));
        rest = &after[end + 2..];
    }
    if !rest.is_empty() {
        out.push(TemplatePart::Literal(rest.to_owned()));
    }
    Ok(out)
}

fn parse_document(text: &str) -> Result<Value, String> {
    let mut docs = parse_documents(text)?;
    match docs.len() {
        0 => Ok(Value::Object(Default::default())),
        1 => Ok(docs.remove(0)),
        n => Err(format!(
            "holds {n} YAML documents (separated by `---`); a configuration file is one"
        )),
    }
}

/// The documents of a YAML stream (`---` between them), or one JSON document. Empty ones (a
/// trailing `---`, a file of comments, `null`) are left out.
fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map(|v| vec![v]).map_err(|e| {
            let at = quoted_line(text, e.line(), e.column());
            format!("not valid JSON: {e}{at}")
        });
    }
    // The parser's own rendering quotes the lines around the error unredacted; ours quotes the
    // one line, with a token's value hidden ([`quoted_line`]).
    serde_saphyr::from_str_multiple_with_options::<Value, Vec<Value>>(
        text,
        serde_saphyr::options! { with_snippet: false },
    )
    .map(|docs| docs.into_iter().filter(|d| !d.is_null()).collect())
    .map_err(|e| {
        let at = e
            .location()
            .map(|l| quoted_line(text, l.line() as usize, l.column() as usize))
            .unwrap_or_default();
        format!("not valid YAML: {e}{at}")
    })
}

/// Line `line` (1-based) of `text` under the message, with a caret at `column` (1-based), as a
/// compiler shows it. A configuration holds `http.pathToken`, which must never reach a terminal
/// or a CI log: after a key that names a token, the line shows `<redacted>`.
fn quoted_line(text: &str, line: usize, column: usize) -> String {
    let Some(src) = line.checked_sub(1).and_then(|i| text.lines().nth(i)) else {
        return String::new();
    };
    // From the first key that names a token (YAML `pathToken: ...`, or JSON on one line) to
    // the end of the line.
    let token = src.to_ascii_lowercase().find("token");
    let shown = match token.and_then(|at| src[at..].find(':').map(|colon| at + colon)) {
        Some(colon) => format!("{}: <redacted>", &src[..colon]),
        None => src.to_owned(),
    };
    let width = line.to_string().len();
    let caret = column.saturating_sub(1).min(shown.chars().count());
    format!(
        "\n {line} | {shown}\n {blank:width$} | {pad}^",
        blank = "",
        pad = " ".repeat(caret)
    )
}

/// A deserialiser's message in the words of whoever wrote the configuration: an unknown key
/// names the nearest known key rather than listing every one, and Rust's type names (`u16`)
/// become what the key takes ("a port number from 1 to 65535").
fn in_users_words(message: &str, key: &str) -> String {
    // serde's "unknown field `x`, expected one of `a`, `b`" and its "unknown variant" twin.
    let unknown = |prefix: &str| {
        let (unknown, expected) = message.strip_prefix(prefix)?.split_once('`')?;
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let listed = format!("`{}`", known.join("`, `"));
        Some((unknown, nearest(unknown, known.iter().copied()), listed))
    };
    if let Some((unknown, near, listed)) = unknown("unknown field `") {
        return match near {
            Some(near) => format!("unknown key `{unknown}`: did you mean `{near}`?"),
            None => format!(
                "unknown key `{unknown}`: the keys here are {listed} (docs/configuration.md)"
            ),
        };
    }
    if let Some((unknown, near, listed)) = unknown("unknown variant `") {
        let what = if key.starts_with("mutators.") {
            "mutator"
        } else {
            "value"
        };
        return match near {
            Some(near) => format!("unknown {what} `{unknown}`: did you mean `{near}`?"),
            None => format!("unknown {what} `{unknown}`: use one of {listed}"),
        };
    }
    let u16 = if key.to_ascii_lowercase().ends_with("port") {
        "a port number from 1 to 65535"
    } else {
        "a whole number from 0 to 65535"
    };
    let mut out = message.to_owned();
    for (rust, words) in [
        ("u8", "a whole number from 0 to 255"),
        ("u16", u16),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number, 0 or more"),
        ("usize", "a whole number, 0 or more"),
        ("i32", "a whole number from -2147483648 to 2147483647"),
        ("i64", "a whole number"),
        ("f64", "a number"),
        ("a boolean", "true or false"),
        ("a sequence", "a list"),
        ("a map", "a mapping (key: value)"),
    ] {
        out = out.replace(&format!("expected {rust}"), &format!("expected {words}"));
    }
    out
}

/// The candidate closest to `word` (ignoring case) within a few edits, if one is: the "did you
/// mean" of keys, sections and values. A swap of two neighbours is one edit (`lsiten`).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let allowed = (word.chars().count() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (strsim::osa_distance(&word, &c.to_ascii_lowercase()), c))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The dotted path of every value in `v`, stopping at maps of the user's keys and Kubernetes
/// objects (whose keys the default configuration does not have).
fn read_keys(v: &Value) -> Vec<String> {
    fn walk(v: &Value, reference: &Value, path: &str, out: &mut Vec<String>) {
        match (v, reference) {
            (Value::Object(m), Value::Object(known)) if !m.is_empty() => {
                for (k, child) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(child, known.get(k).unwrap_or(&Value::Null), &p, out);
                }
            }
            // An empty configuration (`{}`) reads no key.
            _ if path.is_empty() => {}
            _ => out.push(path.to_owned()),
        }
    }
    let reference = serde_json::to_value(Config::default()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    walk(v, &reference, "", &mut out);
    out
}

/// The values of the configuration read into Kubernetes' own types, which drop a key they do
/// not have where ours refuse it.
const KUBERNETES_VALUES: [&str; 10] = [
    "/webhook/awsSecretManager/resources",
    "/webhook/gcpSecretManager/resources",
    "/webhook/azureSecretManager/resources",
    "/webhook/embeddedSecretManagerConfig/fileMountInitContainer/resources",
    "/webhook/imageBuilderConfig/labelSelector",
    "/webhook/namespaceSelector",
    "/images/podSelector",
    "/images/namespaceSelector",
    "/mesh/gate/resources",
    "/mesh/gate/securityContext",
];

/// Where `kept` (a value read into a Kubernetes type and written back) lacks a non-null member
/// of `given` (the value as written): `.field` or `[index]` steps from the root, to the first
/// key the type dropped. Kubernetes' types drop what they do not have, silently.
pub fn dropped_key(given: &Value, kept: &Value) -> Option<String> {
    let children: Vec<(String, &Value, Option<&Value>)> = match (given, kept) {
        (Value::Object(g), Value::Object(k)) => g
            .iter()
            .map(|(n, v)| (format!(".{n}"), v, k.get(n)))
            .collect(),
        (Value::Array(g), Value::Array(k)) => g
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("[{i}]"), v, k.get(i)))
            .collect(),
        _ => return None,
    };
    children.into_iter().find_map(|(step, g, kept)| match kept {
        None => (!g.is_null()).then_some(step),
        Some(kept) => dropped_key(g, kept).map(|rest| step + &rest),
    })
}

/// What to say of a key [`dropped_key`] found, `key` its whole dotted path.
pub fn dropped_key_message(key: &str) -> String {
    let field = key.rsplit('.').next().unwrap_or_default();
    format!(
        "unknown field `{field}`: the Kubernetes type of this value has no such field and would drop it; check its spelling, case included (`limits`, `runAsNonRoot`, `matchLabels`), against the Kubernetes API reference"
    )
}

/// A key of a [`KUBERNETES_VALUES`] value that its type dropped: a misspelt `resources.limit` would leave the container without limits, silently.
/// Told by writing the value back: what was read and kept is written, what was dropped is not.
fn check_kubernetes_values(input: &Value, config: &Config) -> Result<(), ConfigError> {
    let written = serde_json::to_value(config)
        .map_err(|e| ConfigError::new("(root)", format!("cannot be written back: {e}")))?;
    for pointer in KUBERNETES_VALUES {
        let (Some(given), Some(kept)) = (input.pointer(pointer), written.pointer(pointer)) else {
            continue;
        };
        if let Some(rest) = dropped_key(given, kept) {
            let key = pointer[1..].replace('/', ".") + &rest;
            return Err(ConfigError::new(&key, dropped_key_message(&key)));
        }
    }
    Ok(())
}

/// Whether `v` sets the dotted `key` (`webhook.awsSecretManager.resources.limits`,
/// `images.rules[0].match`).
fn holds(v: &Value, key: &str) -> bool {
    key.split(['.', '['])
        .filter(|s| !s.is_empty())
        .try_fold(v, |v, step| match step.strip_suffix(']') {
            Some(i) => v.get(i.parse::<usize>().ok()?),
            None => v.get(step),
        })
        .is_some_and(|v| !v.is_null())
}

/// Removes every `null` member, at any depth: `null` is unset.
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// Objects merge key by key; anything else in `overlay` replaces what was there.
fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (base, overlay) => *base = overlay,
    }
}

/// `$VAR` and `${VAR}` expansion; unknown variables expand to "" as in Go's `os.ExpandEnv`.
fn expand_env(s: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, consumed) = match after.strip_prefix('{') {
            Some(braced) => braced
                .find('}')
                .map_or(("", 0), |end| (&braced[..end], end + 2)),
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        match consumed {
            0 => out.push('$'),
            _ => out.push_str(&lookup(name).unwrap_or_default()),
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn load_json(v: Value) -> Result<Loaded, ConfigError> {
        Config::from_value(v)
    }

    /// Empty documents (a trailing `---`, comments alone, `null`) are nothing; a file of two
    /// documents is refused, naming the file.
    #[test]
    fn a_configuration_file_is_one_yaml_document() {
        for text in [
            "",
            "# nothing yet\n",
            "---\n",
            "null\n",
            "webhook: {}\n---\n",
        ] {
            let loaded = Config::load(Some(("c.yaml", text)), None).unwrap();
            assert_eq!(loaded.config, Config::default(), "{text:?}");
        }
        let err = Config::load(Some(("c.yaml", "http: {}\n---\nmesh: {}\n")), None).unwrap_err();
        assert_eq!(err.key, "c.yaml");
        assert!(err.message.starts_with("holds 2 YAML documents"), "{err}");
    }

    /// A variable `certDir` names that is not set reads as "", as Flyte's `os.ExpandEnv`
    /// reads it, and the warning says where the certificates then are.
    #[test]
    fn a_cert_dir_variable_that_is_not_set_is_warned_of() {
        let dir = "/tmp/${PODMUTATOR_NO_SUCH_VARIABLE}/certs";
        let loaded = load_json(json!({"webhook": {"certDir": dir}})).unwrap();
        let warning = loaded
            .warnings
            .iter()
            .find(|w| w.contains("webhook.certDir"));
        assert_eq!(
            warning.map(String::as_str),
            Some(
                "webhook.certDir \"/tmp/${PODMUTATOR_NO_SUCH_VARIABLE}/certs\": PODMUTATOR_NO_SUCH_VARIABLE is not set, so it reads as \"\" (as in Flyte) and the certificates are in \"/tmp//certs\""
            )
        );
        let loaded = load_json(json!({"webhook": {"certDir": "/tmp/certs"}})).unwrap();
        assert!(loaded.warnings.iter().all(|w| !w.contains("certDir")));
    }

    #[test]
    fn an_empty_configuration_reads_no_key() {
        assert!(load_json(json!({})).unwrap().read.is_empty());
        assert_eq!(load_json(json!({"webhook": {}})).unwrap().read, ["webhook"]);
    }

    #[test]
    fn empty_config_has_flyte_defaults() {
        let c = load_json(json!({})).unwrap().config;
        assert_eq!(c.webhook.listen_port, 9443);
        assert_eq!(c.webhook.cert_dir, "/etc/webhook/certs");
        assert_eq!(c.webhook.service_name, "flyte-pod-webhook");
        assert_eq!(c.webhook.secret_env_var_prefix, "_UNION_");
        assert_eq!(c.webhook.vault_secret_manager.role, "flyte");
        assert_eq!(c.secrets.env_prefix, "FLYTE_SECRET_");
        assert_eq!(
            c.webhook.enabled_secret_managers(),
            vec![SecretManagerType::Global, SecretManagerType::K8s]
        );
    }

    #[test]
    fn the_seed_document_loads() {
        let seed = json!({"webhook": {
            "metrics-prefix": "flyte:", "certDir": "/etc/webhook/certs", "listenPort": 9443,
            "serviceName": "flyte-pod-webhook", "servicePort": 443, "secretName": "flyte-pod-webhook",
            "secretManagerTypes": ["K8s", "AWS"], "secretEnvVarPrefix": "_UNION_", "webhookTimeout": 30,
            "kubeClientConfig": {"qps": 100, "burst": 25, "timeout": "30s"},
            "awsSecretManager": {"sidecarImage": "docker.io/amazon/aws-secrets-manager-secret-sidecar:v0.1.4",
                "resources": {"requests": {"cpu": "200m", "memory": "500Mi"}, "limits": {"cpu": "200m", "memory": "500Mi"}}},
            "imageBuilderConfig": {"enabled": false, "hostnameReplacement": {"existing": "old.registry.com", "replacement": "new.registry.com"},
                "labelSelector": {"matchLabels": {"inject-secrets": "true"}}, "excludedContainerNames": ["init-embedded-secret"]}
        }});
        let loaded = load_json(seed).unwrap();
        assert_eq!(
            loaded.config.webhook.enabled_secret_managers(),
            vec![
                SecretManagerType::Global,
                SecretManagerType::K8s,
                SecretManagerType::AWS
            ]
        );
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }

    #[rstest]
    #[case::unknown_top_level_section(json!({"webhok": {}}), "webhok")]
    #[case::unknown_webhook_key(json!({"webhook": {"lsitenPort": 1}}), "webhook.lsitenPort")]
    #[case::wrong_type(json!({"webhook": {"listenPort": "x"}}), "webhook.listenPort")]
    #[case::port_out_of_range(json!({"webhook": {"listenPort": 70000}}), "webhook.listenPort")]
    #[case::unknown_manager(json!({"webhook": {"secretManagerTypes": ["S3"]}}), "webhook.secretManagerTypes[0]")]
    #[case::nested_unknown_key(json!({"webhook": {"vaultSecretManager": {"rol": "x"}}}), "webhook.vaultSecretManager.rol")]
    #[case::embedded_needs_aws(json!({"webhook": {"secretManagerTypes": ["Embedded"]}}), "webhook.embeddedSecretManagerConfig.type")]
    #[case::reference_needs_an_image(json!({"embedded": {"delivery": "reference"}}), "embedded.fetcherImage")]
    #[case::unknown_delivery(json!({"embedded": {"delivery": "inline"}}), "embedded.delivery")]
    #[case::unknown_env_var_delivery(json!({"embedded": {"envVarDelivery": "file"}}), "embedded.envVarDelivery")]
    #[case::lookup_registry_with_a_scheme(json!({"embedded": {"entrypointLookup": {"registries": ["public.ecr.aws", "https://r.example"]}}}), "embedded.entrypointLookup.registries[1]")]
    #[case::lookup_registry_with_a_path(json!({"embedded": {"entrypointLookup": {"registries": ["r.example/team"]}}}), "embedded.entrypointLookup.registries[0]")]
    #[case::lookup_registry_that_is_an_image(json!({"embedded": {"entrypointLookup": {"registries": ["python"]}}}), "embedded.entrypointLookup.registries[0]")]
    #[case::lookup_timeout_at_the_deadline(json!({"embedded": {"entrypointLookup": {"registries": ["r.example"], "timeoutMs": 2000}}}), "embedded.entrypointLookup.timeoutMs")]
    #[case::lookup_timeout_zero(json!({"embedded": {"entrypointLookup": {"registries": ["r.example"], "timeoutMs": 0}}}), "embedded.entrypointLookup.timeoutMs")]
    #[case::lookup_unknown_key(json!({"embedded": {"entrypointLookup": {"registry": ["r.example"]}}}), "embedded.entrypointLookup.registry")]
    #[case::image_pull_copies_need_writes(json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS", "imagePullSecrets": {"enabled": true}}}}), "webhook.embeddedSecretManagerConfig.imagePullSecrets.enabled")]
    #[case::embedded_binds_no_organization(json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}}}), "embedded.organization")]
    #[case::organization_with_the_name_separator(json!({"embedded": {"organization": "a__b"}}), "embedded.organization")]
    #[case::organization_no_label_can_carry(json!({"embedded": {"organization": "-flyte"}}), "embedded.organization")]
    #[case::no_calls_in_flight(json!({"embedded": {"maxCallsInFlight": 0}}), "embedded.maxCallsInFlight")]
    #[case::admission_over_process(json!({"embedded": {"maxCallsInFlight": 2, "maxCallsInFlightPerAdmission": 3}}), "embedded.maxCallsInFlightPerAdmission")]
    #[case::unknown_strategy(json!({"embedded": {"fetchStrategy": "serial"}}), "embedded.fetchStrategy")]
    #[case::token_and_token_secret(json!({"http": {"pathToken": "a", "pathTokenSecretId": "b"}}), "http.pathToken")]
    #[case::short_token(json!({"http": {"pathToken": "abc"}}), "http.pathToken")]
    #[case::tiny_body_limit(json!({"http": {"maxBodyBytes": 10}}), "http.maxBodyBytes")]
    #[case::bad_listen_address(json!({"http": {"listenAddress": "localhost"}}), "http.listenAddress")]
    #[case::zero_port(json!({"webhook": {"listenPort": 0}}), "webhook.listenPort")]
    #[case::zero_metrics_port(json!({"webhook": {"metricsPort": 0}}), "webhook.metricsPort")]
    #[case::metrics_port_is_the_listen_port(json!({"webhook": {"listenPort": 8443, "metricsPort": 8443}}), "webhook.metricsPort")]
    #[case::metrics_port_out_of_range(json!({"webhook": {"metricsPort": 70000}}), "webhook.metricsPort")]
    #[case::global_provider_type(json!({"secrets": {"type": "vault"}}), "secrets.type")]
    #[case::not_a_mapping(json!([1]), "(root)")]
    #[case::bad_selector_label(json!({"secretsSelector": {"label": "bad label"}}), "secretsSelector.label")]
    #[case::bad_selector_value(json!({"secretsSelector": {"value": "-x"}}), "secretsSelector.value")]
    #[case::unknown_mutator(json!({"mutators": {"secretz": {"required": true}}}), "mutators.secretz")]
    #[case::unknown_far_mutator(json!({"mutators": {"zzz": {}}}), "mutators.zzz")]
    #[case::token_hash_not_hex(json!({"http": {"pathTokenSha256": "not-a-hash"}}), "http.pathTokenSha256")]
    #[case::token_hash_not_text(json!({"http": {"pathTokenSha256": 5}}), "http.pathTokenSha256")]
    #[case::second_token_hash_short(json!({"http": {"pathTokenSha256": ["ab".repeat(32), "ab"]}}), "http.pathTokenSha256[1]")]
    #[case::token_hash_of_nothing(json!({"http": {"pathTokenSha256": ["ab".repeat(32), EMPTY_SHA256]}}), "http.pathTokenSha256[1]")]
    #[case::plain_paths_without_a_token(json!({"http": {"pathTokenDisabled": true, "acceptPlainPaths": true}}), "http.acceptPlainPaths")]
    #[case::deadline_below_its_bound(json!({"embedded": {"deadlineMs": 99}}), "embedded.deadlineMs")]
    #[case::cache_ttl_over_a_day(json!({"embedded": {"cacheTtlSeconds": 86401}}), "embedded.cacheTtlSeconds")]
    #[case::body_over_64_mib(json!({"http": {"maxBodyBytes": 67108865}}), "http.maxBodyBytes")]
    #[case::selector_is_the_mesh_label(json!({"mesh": {"enabled": true, "managedLabel": "example.io/managed"},
        "secretsSelector": {"label": "example.io/managed", "value": "true"}}), "secretsSelector.label")]
    #[case::global_files_at_the_root(json!({"secrets": {"secrets-prefix": "/"}}), "secrets.secrets-prefix")]
    #[case::global_files_in_proc(json!({"secrets": {"secrets-prefix": "/proc"}}), "secrets.secrets-prefix")]
    #[case::global_files_below_run(json!({"secrets": {"secrets-prefix": "/var/run/secrets"}}), "secrets.secrets-prefix")]
    #[case::global_files_in_etc(json!({"secrets": {"secrets-prefix": "/etc/"}}), "secrets.secrets-prefix")]
    #[case::global_files_relative(json!({"secrets": {"secrets-prefix": "secrets"}}), "secrets.secrets-prefix")]
    #[case::global_files_climbing(json!({"secrets": {"secrets-prefix": "/etc/secrets/../.."}}), "secrets.secrets-prefix")]
    #[case::calls_in_flight_past_the_semaphore(json!({"embedded": {"maxCallsInFlight": 2_305_843_009_213_693_952u64}}), "embedded.maxCallsInFlight")]
    #[case::first_request_timeout_past_the_clock(json!({"http": {"firstRequestTimeoutSeconds": 9_223_372_036_854_775_807u64}}), "http.firstRequestTimeoutSeconds")]
    #[case::connection_age_past_the_clock(json!({"http": {"maxConnectionAgeSeconds": 9_223_372_036_854_775_807u64}}), "http.maxConnectionAgeSeconds")]
    #[case::idle_timeout_past_the_clock(json!({"http": {"idleTimeoutSeconds": u64::MAX}}), "http.idleTimeoutSeconds")]
    #[case::tag_ttl_past_the_cache(json!({"embedded": {"entrypointLookup": {"tagTtlSeconds": 31_536_000_001u64}}}), "embedded.entrypointLookup.tagTtlSeconds")]
    #[case::env_var_prefix_with_equals(json!({"webhook": {"secretEnvVarPrefix": "A=B"}}), "webhook.secretEnvVarPrefix")]
    #[case::env_var_prefix_not_ascii(json!({"webhook": {"secretEnvVarPrefix": "\u{c4}_"}}), "webhook.secretEnvVarPrefix")]
    #[case::vault_annotation_key(json!({"webhook": {"vaultSecretManager": {"annotations": {"bad key": "x"}}}}), "webhook.vaultSecretManager.annotations")]
    #[case::sidecar_image_empty(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"sidecarImage": ""}}}), "webhook.awsSecretManager.sidecarImage")]
    #[case::sidecar_image_upper_case(json!({"webhook": {"secretManagerTypes": ["GCP"], "gcpSecretManager": {"sidecarImage": "Reg.io/App:1"}}}), "webhook.gcpSecretManager.sidecarImage")]
    #[case::sidecar_image_empty_tag(json!({"webhook": {"secretManagerTypes": ["Azure"], "azureSecretManager": {"sidecarImage": "r.io/app:"}}}), "webhook.azureSecretManager.sidecarImage")]
    #[case::sidecar_resources_not_a_quantity(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limits": {"cpu": "abc"}}}}}), "webhook.awsSecretManager.resources.limits.cpu")]
    #[case::sidecar_resources_negative(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limits": {"cpu": "-1"}}}}}), "webhook.awsSecretManager.resources.limits.cpu")]
    #[case::sidecar_request_over_limit(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}}), "webhook.awsSecretManager.resources.requests.cpu")]
    #[case::sidecar_fractional_gpu(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limits": {"nvidia.com/gpu": "0.5"}}}}}), "webhook.awsSecretManager.resources.limits.nvidia.com/gpu")]
    #[case::sidecar_resource_claims(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"claims": [{"name": "x"}]}}}}), "webhook.awsSecretManager.resources.claims")]
    #[case::file_mount_container_name(json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS", "fileMountInitContainer": {"containerName": "Init_Bad"}}}, "embedded": {"organization": "flyte"}}), "webhook.embeddedSecretManagerConfig.fileMountInitContainer.containerName")]
    #[case::file_mount_image(json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS", "fileMountInitContainer": {"image": " docker.io/x:1"}}}, "embedded": {"organization": "flyte"}}), "webhook.embeddedSecretManagerConfig.fileMountInitContainer.image")]
    #[case::file_mount_memory(json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS", "fileMountInitContainer": {"resources": {"limits": {"memory": "-5"}}}}}, "embedded": {"organization": "flyte"}}), "webhook.embeddedSecretManagerConfig.fileMountInitContainer.resources.limits.memory")]
    #[case::fetcher_image(json!({"embedded": {"delivery": "reference", "fetcherImage": "r.io//podmutator:1"}}), "embedded.fetcherImage")]
    #[case::namespace_template_no_namespace_can_match(json!({"embedded": {"namespaceTemplate": "{{ project }}_{{ domain }}"}}), "embedded.namespaceTemplate")]
    #[case::namespace_template_upper_case(json!({"embedded": {"namespaceTemplate": "Flyte-{{ project }}-{{ domain }}"}}), "embedded.namespaceTemplate")]
    #[case::builder_replacement_with_a_tag(json!({"webhook": {"imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io/x:1"}}}}), "webhook.imageBuilderConfig.hostnameReplacement.replacement")]
    #[case::builder_replacement_upper_case(json!({"webhook": {"imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "R.IO/UP"}}}}), "webhook.imageBuilderConfig.hostnameReplacement.replacement")]
    #[case::builder_excludes_everything(json!({"webhook": {"imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"}, "excludedImagePrefixes": ["ghcr.io/", ""]}}}), "webhook.imageBuilderConfig.excludedImagePrefixes[1]")]
    #[case::images_rule_loop_through_a_hub_namespace(json!({"images": {"enabled": true, "rules": [{"match": "quay.io", "replace": "mirror"}, {"match": "docker.io/mirror", "replace": "r.io/x"}]}}), "images.rules[0].replace")]
    #[case::gate_image(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/a//b:1"}}}), "mesh.gate.image")]
    #[case::gate_privileged_without_escalation(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"privileged": true, "allowPrivilegeEscalation": false}}}}), "mesh.gate.securityContext.allowPrivilegeEscalation")]
    #[case::gate_localhost_seccomp_unnamed(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"seccompProfile": {"type": "Localhost"}}}}}), "mesh.gate.securityContext.seccompProfile")]
    #[case::sidecar_resource_name_upper_case(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limits": {"CPU": "1"}}}}}), "webhook.awsSecretManager.resources.limits.CPU")]
    #[case::gate_resource_name_without_a_domain(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "resources": {"limits": {"gpu": "1"}}}}}), "mesh.gate.resources.limits.gpu")]
    #[case::sidecar_extended_resource_requested_without_a_limit(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"requests": {"example.com/dongle": "1"}}}}}), "webhook.awsSecretManager.resources.requests.example.com/dongle")]
    #[case::sidecar_extended_resource_named_like_a_quota(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limits": {"requests.example.com/dongle": "1"}}}}}), "webhook.awsSecretManager.resources.limits.requests.example.com/dongle")]
    #[case::gate_huge_pages_alone(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "resources": {"limits": {"hugepages-2Mi": "2Mi"}}}}}), "mesh.gate.resources.limits.hugepages-2Mi")]
    #[case::gate_huge_pages_not_whole_pages(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "resources": {"limits": {"hugepages-2Mi": "1Mi", "cpu": "1"}}}}}), "mesh.gate.resources.limits.hugepages-2Mi")]
    #[case::gate_huge_pages_overcommitted(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "resources": {"requests": {"hugepages-2Mi": "2Mi"}, "limits": {"hugepages-2Mi": "4Mi", "cpu": "1"}}}}}), "mesh.gate.resources.requests.hugepages-2Mi")]
    #[case::gate_seccomp_profile_absolute(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "/var/lib/kubelet/seccomp/gate.json"}}}}}), "mesh.gate.securityContext.seccompProfile.localhostProfile")]
    #[case::gate_seccomp_profile_climbing(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "../gate.json"}}}}}), "mesh.gate.securityContext.seccompProfile.localhostProfile")]
    #[case::gate_apparmor_profile_empty(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": ""}}}}}), "mesh.gate.securityContext.appArmorProfile.localhostProfile")]
    #[case::gate_apparmor_profile_padded(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": " gate"}}}}}), "mesh.gate.securityContext.appArmorProfile.localhostProfile")]
    #[case::gate_windows_host_process(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"windowsOptions": {"hostProcess": true}}}}}), "mesh.gate.securityContext.windowsOptions.hostProcess")]
    #[case::gate_non_root_as_root(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"runAsNonRoot": true, "runAsUser": 0}}}}), "mesh.gate.securityContext.runAsNonRoot")]
    #[case::gate_volume_under_proc(json!({"mesh": {"enabled": true, "gate": {"volume": {"mountPath": "/proc/spiffe"}, "socketPath": "/proc/spiffe/agent.sock"}}}), "mesh.gate.volume.mountPath")]
    #[case::vault_annotation_mirror_pod(json!({"webhook": {"vaultSecretManager": {"annotations": {"kubernetes.io/config.mirror": "x"}}}}), "webhook.vaultSecretManager.annotations.kubernetes.io/config.mirror")]
    #[case::vault_annotation_seccomp_profile_misspelt(json!({"webhook": {"vaultSecretManager": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "runtime-default"}}}}), "webhook.vaultSecretManager.annotations.seccomp.security.alpha.kubernetes.io/pod")]
    #[case::vault_annotation_toleration_without_a_key_or_exists(json!({"webhook": {"vaultSecretManager": {"annotations": {"scheduler.alpha.kubernetes.io/tolerations": "[{\"effect\": \"NoSchedule\"}]"}}}}), "webhook.vaultSecretManager.annotations.scheduler.alpha.kubernetes.io/tolerations")]
    #[case::vault_annotation_toleration_seconds_without_no_execute(json!({"webhook": {"vaultSecretManager": {"annotations": {"scheduler.alpha.kubernetes.io/tolerations": "[{\"key\": \"a\", \"effect\": \"NoSchedule\", \"tolerationSeconds\": 5}]"}}}}), "webhook.vaultSecretManager.annotations.scheduler.alpha.kubernetes.io/tolerations")]
    #[case::gate_windows_user_empty(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"windowsOptions": {"runAsUserName": ""}}}}}), "mesh.gate.securityContext.windowsOptions")]
    #[case::vault_annotation_tolerations_not_json(json!({"webhook": {"vaultSecretManager": {"annotations": {"scheduler.alpha.kubernetes.io/tolerations": "gpu"}}}}), "webhook.vaultSecretManager.annotations.scheduler.alpha.kubernetes.io/tolerations")]
    #[case::vault_annotation_apparmor_profile_misspelt(json!({"webhook": {"vaultSecretManager": {"annotations": {"container.apparmor.security.beta.kubernetes.io/vault-agent": "runtime-default"}}}}), "webhook.vaultSecretManager.annotations.container.apparmor.security.beta.kubernetes.io/vault-agent")]
    #[case::vault_annotation_deletion_cost_with_a_sign(json!({"webhook": {"vaultSecretManager": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "+5"}}}}), "webhook.vaultSecretManager.annotations.controller.kubernetes.io/pod-deletion-cost")]
    #[case::vault_annotation_deletion_cost_not_a_number(json!({"webhook": {"vaultSecretManager": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "high"}}}}), "webhook.vaultSecretManager.annotations.controller.kubernetes.io/pod-deletion-cost")]
    #[case::vault_annotations_over_the_pods_total(json!({"webhook": {"vaultSecretManager": {"annotations": {"vault.hashicorp.com/agent-inject-template-x": "x".repeat(300_000)}}}}), "webhook.vaultSecretManager.annotations")]
    #[case::fetcher_image_digest_misspelt(json!({"embedded": {"delivery": "reference", "fetcherImage": "r.io/podmutator@sha265:0000000000000000000000000000000000000000000000000000000000000000"}}), "embedded.fetcherImage")]
    #[case::gate_image_digest_upper_case(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate@SHA256:0000000000000000000000000000000000000000000000000000000000000000"}}}), "mesh.gate.image")]
    #[case::sidecar_extended_resource_overcommitted(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"requests": {"example.com/dongle": "1"}, "limits": {"example.com/dongle": "2"}}}}}), "webhook.awsSecretManager.resources.requests.example.com/dongle")]
    #[case::gate_user_past_int32(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"runAsUser": 2_147_483_648u64}}}}), "mesh.gate.securityContext.runAsUser")]
    #[case::gate_negative_user(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"runAsUser": -1}}}}), "mesh.gate.securityContext.runAsUser")]
    #[case::gate_request_over_limit(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Mi"}}}}}), "mesh.gate.resources.requests.memory")]
    #[case::gate_driver_over_63(json!({"mesh": {"enabled": true, "gate": {"volume": {"driver": format!("{}.spiffe.io", "a".repeat(60))}}}}), "mesh.gate.volume.driver")]
    #[case::gate_opt_out_is_the_socket_annotation(json!({"mesh": {"enabled": true, "gate": {"optOutAnnotation": "aether.io/sockets"}, "socketCheck": {"annotation": "aether.io/sockets"}}}), "mesh.gate.optOutAnnotation")]
    #[case::gate_named_like_the_embedded_init_container(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "name": "init-embedded-secret"}}}), "mesh.gate.name")]
    #[case::gate_named_like_a_fetcher(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "name": "aws-pull-secret-0"}}}), "mesh.gate.name")]
    #[case::gate_volume_of_a_manager(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "volume": {"name": "podmutator-secret-files"}}}}), "mesh.gate.volume.name")]
    #[case::resources_limit_misspelt(json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources": {"limit": {"cpu": "1"}}}}}), "webhook.awsSecretManager.resources.limit")]
    #[case::gate_run_as_non_root_misspelt(json!({"mesh": {"enabled": true, "gate": {"enabled": true, "image": "r.io/gate:1", "securityContext": {"runAsNonroot": true}}}}), "mesh.gate.securityContext.runAsNonroot")]
    #[case::builder_match_labels_misspelt(json!({"webhook": {"imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"}, "labelSelector": {"matchLabel": {"a": "b"}}}}}), "webhook.imageBuilderConfig.labelSelector.matchLabel")]
    #[case::selector_expression_values_misspelt(json!({"images": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "a", "operator": "In", "value": ["x"]}]}}}), "images.podSelector.matchExpressions[1].value")]
    #[case::a_sidecar_image_of_a_manager_that_is_off(json!({"webhook": {"gcpSecretManager": {"sidecarImage": "Not Valid!!"}}}), "webhook.gcpSecretManager.sidecarImage")]
    #[case::sidecar_resources_of_a_manager_that_is_off(json!({"webhook": {"awsSecretManager": {"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "100m"}}}}}), "webhook.awsSecretManager.resources.requests.cpu")]
    #[case::file_writer_name_with_embedded_off(json!({"webhook": {"embeddedSecretManagerConfig": {"fileMountInitContainer": {"containerName": "Init_Secret"}}}}), "webhook.embeddedSecretManagerConfig.fileMountInitContainer.containerName")]
    #[case::service_name_with_a_namespace(json!({"webhook": {"serviceName": "flyte-pod-webhook.${POD_NAMESPACE}"}}), "webhook.serviceName")]
    fn bad_config_names_the_key(#[case] v: Value, #[case] key: &str) {
        let err = load_json(v).unwrap_err();
        assert_eq!(err.key, key, "{err}");
        if key == "mutators.secretz" {
            assert_eq!(
                err.message, "unknown mutator `secretz`: did you mean `secrets`?",
                "{err}"
            );
        }
        if key == "mutators.zzz" {
            assert!(
                err.message.contains("use one of `namespace-injection`"),
                "{err}"
            );
        }
        assert!(err.to_string().contains(key));
    }

    /// The neighbours of the refusals above that the API server and the kubelet accept load.
    #[test]
    fn container_settings_the_api_server_accepts_load() {
        let gate = |extra: Value| {
            let mut gate = json!({"enabled": true, "image": "r.io/gate@sha512:".to_owned() + &"0".repeat(128)});
            merge(&mut gate, extra);
            json!({"mesh": {"enabled": true, "gate": gate}})
        };
        for v in [
            gate(
                json!({"resources": {"requests": {"hugepages-2Mi": "4Mi", "memory": "8Mi", "ephemeral-storage": "1Gi"},
                "limits": {"hugepages-2Mi": "4Mi", "memory": "8Mi", "example.com/dongle": "1", "kubernetes.io/x": "1"}}}),
            ),
            gate(
                json!({"securityContext": {"procMount": "Default", "runAsNonRoot": true, "runAsUser": 1000,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/gate.json"},
                "appArmorProfile": {"type": "Localhost", "localhostProfile": "gate"}}}),
            ),
            gate(
                json!({"volume": {"mountPath": "/processes"}, "socketPath": "/processes/agent.sock"}),
            ),
            json!({"webhook": {"vaultSecretManager": {"annotations": {
                "controller.kubernetes.io/pod-deletion-cost": "-10",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
                "container.apparmor.security.beta.kubernetes.io/vault-agent": "runtime/default",
                "container.seccomp.security.alpha.kubernetes.io/vault-agent": "localhost/profiles/vault.json",
                "scheduler.alpha.kubernetes.io/tolerations": "[{\"key\": \"gpu\", \"operator\": \"Exists\"}, {\"operator\": \"Exists\"}, {\"key\": \"k\", \"value\": \"v\", \"effect\": \"NoExecute\", \"tolerationSeconds\": 30}]",
                "kubernetes.io/config.hash": "x"}}}}),
            gate(json!({"resources": {"limits": {"hugepages-2Mi": "0", "cpu": "1"}}})),
        ] {
            let loaded = load_json(v.clone());
            assert!(loaded.is_ok(), "{v}: {loaded:?}");
        }
        let warnings = load_json(json!({"webhook": {"secretEnvVarPrefix": "1st-secret."}}))
            .unwrap()
            .warnings;
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("before Kubernetes 1.32")),
            "{warnings:?}"
        );
        // Legal in some pods only: warned of.
        let warnings = load_json(gate(json!({"securityContext": {"procMount": "Unmasked",
            "windowsOptions": {"runAsUserName": "gate"}}})))
        .unwrap()
        .warnings;
        assert!(
            warnings.iter().any(|w| w.contains("procMount is Unmasked"))
                && warnings.iter().any(|w| w.contains("windowsOptions is set")),
            "{warnings:?}"
        );
    }

    /// The image builder, verifying, is warned of a file-mount init container it would deny.
    #[test]
    fn a_file_mount_init_container_the_builder_would_deny_is_warned_of() {
        let config = |excluded_names: Value| {
            json!({
                "webhook": {"secretManagerTypes": ["Embedded"],
                    "embeddedSecretManagerConfig": {"type": "AWS"},
                    "imageBuilderConfig": {"enabled": true, "labelSelector": {"matchLabels": {"a": "b"}},
                        "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"},
                        "excludedContainerNames": excluded_names}},
                "embedded": {"organization": "o"},
            })
        };
        let warned = |v: Value| -> Vec<String> {
            load_json(v)
                .unwrap()
                .warnings
                .into_iter()
                .filter(|w| w.contains("the image builder denies"))
                .collect()
        };
        let w = warned(config(json!([])));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("webhook.embeddedSecretManagerConfig.fileMountInitContainer.image")
        );
        assert!(warned(config(json!(["init-embedded-secret"]))).is_empty());
    }

    /// Where Flyte's sections take text, a number or a boolean is read as Flyte's loader reads
    /// it (mapstructure's weak decoding): a number as its text, a boolean as `1` or `0`, in maps
    /// of the user's keys and in keys whose default is unset too. Our own sections stay strict.
    #[test]
    fn numbers_and_booleans_where_flyte_takes_text_are_read_as_its_text() {
        let loaded = load_json(json!({"webhook": {
            "vaultSecretManager": {"annotations": {
                "vault.hashicorp.com/agent-run-as-user": 1000,
                "vault.hashicorp.com/agent-inject-token": true,
                "vault.hashicorp.com/agent-limits-cpu": 0.5,
            }, "role": 123},
            "awsSecretManager": {"sidecarImage": 123},
            "namespaceSelector": {"matchLabels": {"team": 42}},
            "kubeClientConfig": {"timeout": 30},
        }}))
        .unwrap();
        let w = &loaded.config.webhook;
        let a = &w.vault_secret_manager.annotations;
        assert_eq!(a["vault.hashicorp.com/agent-run-as-user"], "1000");
        assert_eq!(a["vault.hashicorp.com/agent-inject-token"], "1");
        assert_eq!(a["vault.hashicorp.com/agent-limits-cpu"], "0.5");
        assert_eq!(w.vault_secret_manager.role, "123");
        assert_eq!(w.aws_secret_manager.sidecar_image.as_deref(), Some("123"));
        let selector = serde_json::to_value(&loaded.config).unwrap();
        assert_eq!(
            selector["webhook"]["namespaceSelector"]["matchLabels"]["team"],
            "42"
        );
        assert_eq!(selector["webhook"]["kubeClientConfig"]["timeout"], "30");
        let err = load_json(json!({"mesh": {"managedLabel": 1}})).unwrap_err();
        assert!(err.message.contains("expected a string"), "{err}");
    }

    /// Every value read into a Kubernetes type refuses a key the type drops, naming it.
    #[test]
    fn kubernetes_typed_values_refuse_keys_their_types_drop() {
        for pointer in KUBERNETES_VALUES {
            let mut v = json!({});
            let mut at = &mut v;
            for part in pointer[1..].split('/') {
                at = &mut at[part];
            }
            *at = json!({"bogus": {}});
            let err = load_json(v).unwrap_err();
            assert_eq!(err.key, format!("{}.bogus", pointer[1..].replace('/', ".")));
            assert!(err.message.starts_with("unknown field `bogus`"), "{err}");
        }
    }

    /// Quantities that are equal however they are written are equal; the API server's own
    /// forms all load.
    #[test]
    fn resources_equal_in_other_notations_load() {
        for (request, limit) in [
            ("700m", "0.7"),
            ("9m", "0.009"),
            ("1Gi", "1024Mi"),
            ("1e3", "1k"),
        ] {
            let v = json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources":
                {"requests": {"cpu": request}, "limits": {"cpu": limit}}}}});
            load_json(v).unwrap_or_else(|e| panic!("{request} <= {limit}: {e}"));
        }
        let v = json!({"webhook": {"secretManagerTypes": ["AWS"], "awsSecretManager": {"resources":
            {"requests": {"cpu": "701m"}, "limits": {"cpu": "0.7"}}}}});
        assert_eq!(
            load_json(v).unwrap_err().key,
            "webhook.awsSecretManager.resources.requests.cpu"
        );
    }

    /// Token hashes are bytes from the moment they are read: any case in, lowercase out, and
    /// what `check-config` prints loads back the same.
    #[test]
    fn token_hashes_are_parsed_as_they_are_read() {
        let upper = "AB".repeat(32);
        let c = load_json(json!({"http": {"pathTokenSha256": [upper, "cd".repeat(32)]}}))
            .unwrap()
            .config;
        let hashes = c.http.path_token_sha256.as_ref().unwrap().as_slice();
        assert_eq!(hashes[0].0, [0xab; 32]);
        let printed = serde_json::to_value(&c).unwrap();
        assert_eq!(
            printed["http"]["pathTokenSha256"],
            json!(["ab".repeat(32), "cd".repeat(32)])
        );
        assert_eq!(load_json(printed).unwrap().config, c);
        let err = load_json(json!({"http": {"pathTokenSha256": "not-a-hash"}})).unwrap_err();
        assert!(err.message.contains("64 hex digits"), "{err}");
    }

    /// A short cache or deadline never makes a default refused (the IaC passes only
    /// `cacheTtlSeconds` and `deadlineMs`); a dependent value set explicitly is checked as given.
    #[test]
    fn defaults_that_depend_on_another_setting_follow_it_unless_set() {
        let c = load_json(json!({"embedded": {"cacheTtlSeconds": 0}}))
            .unwrap()
            .config;
        assert_eq!(c.embedded.negative_cache_ttl_seconds, 0);
        let c = load_json(json!({"embedded": {"cacheTtlSeconds": 600}}))
            .unwrap()
            .config;
        assert_eq!(c.embedded.negative_cache_ttl_seconds, 10);
        let err =
            load_json(json!({"embedded": {"cacheTtlSeconds": 5, "negativeCacheTtlSeconds": 10}}))
                .unwrap_err();
        assert_eq!(err.key, "embedded.negativeCacheTtlSeconds", "{err}");

        let lookup = json!({"registries": ["registry.example"]});
        let c = load_json(json!({"embedded": {"deadlineMs": 100, "entrypointLookup": lookup}}))
            .unwrap()
            .config;
        assert_eq!(c.embedded.entrypoint_lookup.timeout_ms, 50);
        let c = load_json(json!({"embedded": {"deadlineMs": 2000, "entrypointLookup": lookup}}))
            .unwrap()
            .config;
        assert_eq!(c.embedded.entrypoint_lookup.timeout_ms, 1500);
        let err = load_json(json!({"embedded": {"deadlineMs": 100,
            "entrypointLookup": {"registries": ["registry.example"], "timeoutMs": 1500}}}))
        .unwrap_err();
        assert_eq!(err.key, "embedded.entrypointLookup.timeoutMs", "{err}");
    }

    #[test]
    fn lookup_registries_are_compared_as_image_references_name_them() {
        let cfg = EntrypointLookupConfig {
            registries: vec![
                "index.docker.io".into(),
                "public.ecr.aws".into(),
                "localhost:5000".into(),
            ],
            ..Default::default()
        };
        for listed in ["docker.io", "public.ecr.aws", "localhost:5000"] {
            assert!(cfg.allows(listed), "{listed}");
        }
        for other in ["localhost", "localhost:5001", "169.254.169.254", "ecr.aws"] {
            assert!(!cfg.allows(other), "{other}");
        }
        assert!(!EntrypointLookupConfig::default().enabled());
    }

    #[test]
    fn unknown_key_message_names_the_field() {
        let err = load_json(json!({"webhook": {"lsitenPort": 1}})).unwrap_err();
        assert!(err.message.contains("lsitenPort"), "{err}");
    }

    #[rstest]
    #[case::singular(json!({"webhook": {"secretManagerType": "vault"}}), "secretManagerType is deprecated")]
    #[case::lower_case_prefix(json!({"webhook": {"secretEnvVarPrefix": "my_"}}), "flytekit does not find ENV_VAR secrets; use \"MY_\"")]
    #[case::singular_listed(json!({"webhook": {"secretManagerType": "K8s", "secretManagerTypes": ["K8s"]}}), "deprecated and ignored")]
    #[case::singular_overridden(
        json!({"webhook": {"secretManagerType": "AWS", "secretManagerTypes": ["K8s"]}}),
        "webhook.secretManagerType is AWS, but webhook.secretManagerTypes [K8s] is set and wins: AWS is not used"
    )]
    #[case::kv_version(json!({"webhook": {"vaultSecretManager": {"kvVersion": "1"}}}), "kvVersion is deprecated")]
    #[case::global_listed(json!({"webhook": {"secretManagerTypes": ["Global", "K8s"]}}), "always tried first")]
    #[case::values_without_a_token(json!({"http": {"pathTokenDisabled": true}, "embedded": {"organization": "o"},
        "webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}}}),
        "anyone who reaches the endpoint is served the secret values")]
    #[case::plain_paths_beside_a_token(json!({"http": {"pathTokenSha256": "ab".repeat(32), "acceptPlainPaths": true}}),
        "the token keeps no one out")]
    fn deprecated_or_redundant_keys_load_with_a_warning(#[case] v: Value, #[case] warning: &str) {
        let loaded = load_json(v).unwrap();
        assert!(
            loaded.warnings.iter().any(|w| w.contains(warning)),
            "{:?}",
            loaded.warnings
        );
    }

    #[test]
    fn deprecated_singular_type_still_selects_the_manager() {
        let c = load_json(json!({"webhook": {"secretManagerType": "Vault"}}))
            .unwrap()
            .config;
        assert_eq!(
            c.webhook.enabled_secret_managers(),
            vec![SecretManagerType::Global, SecretManagerType::Vault]
        );
    }

    #[test]
    fn inline_json_merges_over_the_yaml_file() {
        let yaml = "webhook:\n  listenPort: 8443\n  serviceName: from-file\n";
        let loaded = Config::load(
            Some(("cfg.yaml", yaml)),
            Some(r#"{"webhook": {"serviceName": "inline"}}"#),
        )
        .unwrap();
        assert_eq!(loaded.config.webhook.listen_port, 8443);
        assert_eq!(loaded.config.webhook.service_name, "inline");
    }

    #[test]
    fn yaml_errors_name_the_file() {
        let err = Config::load(Some(("cfg.yaml", "webhook: [unclosed")), None).unwrap_err();
        assert_eq!(err.key, "cfg.yaml");
    }

    #[test]
    fn inline_json_errors_name_the_variable() {
        let err = Config::load(None, Some("{nope")).unwrap_err();
        assert_eq!(err.key, ENV_CONFIG_INLINE);
    }

    #[rstest]
    #[case::swapped_letters("lsitenPort", Some("listenPort"))]
    #[case::a_letter_missing("secretManagerTyps", Some("secretManagerTypes"))]
    #[case::another_case("CERTDIR", Some("certDir"))]
    #[case::nothing_near("colour", None)]
    #[case::short_words_take_one_edit("tpye", None)]
    fn the_nearest_key_is_suggested_within_a_few_edits(
        #[case] word: &str,
        #[case] want: Option<&str>,
    ) {
        let keys = [
            "listenPort",
            "secretManagerTypes",
            "certDir",
            "type",
            "serviceName",
        ];
        // `tpye` is two edits from `type` but a swap is one.
        let want = if word == "tpye" { Some("type") } else { want };
        assert_eq!(nearest(word, keys), want);
    }

    #[test]
    fn an_unknown_key_names_the_nearest_one_or_lists_them() {
        let near = in_users_words(
            "unknown field `lsitenPort`, expected one of `listenPort`, `certDir`",
            "webhook.lsitenPort",
        );
        assert_eq!(near, "unknown key `lsitenPort`: did you mean `listenPort`?");
        let far = in_users_words("unknown field `zzz`, expected `required`", "mutators.x.zzz");
        assert!(far.contains("the keys here are `required`"), "{far}");
    }

    #[rstest]
    #[case::port(
        "webhook.listenPort",
        "expected u16",
        "expected a port number from 1 to 65535"
    )]
    #[case::other_u16(
        "mesh.dns.ndots",
        "expected u16",
        "expected a whole number from 0 to 65535"
    )]
    #[case::boolean("webhook.localCert", "expected a boolean", "expected true or false")]
    #[case::list("webhook.secretManagerTypes", "expected a sequence", "expected a list")]
    fn types_are_named_in_the_users_words(
        #[case] key: &str,
        #[case] rust: &str,
        #[case] words: &str,
    ) {
        let got = in_users_words(&format!("invalid type: string \"x\", {rust}"), key);
        assert!(got.ends_with(words), "{got}");
    }

    #[test]
    fn a_syntax_error_quotes_its_line_with_a_tokens_value_hidden() {
        let err = parse_document("webhook:\n  listenPort: [1\n").unwrap_err();
        assert!(err.contains(" | "), "{err}");
        let err = parse_document("http:\n  pathToken: s3cr3t-value: x\n").unwrap_err();
        assert!(err.contains("pathToken: <redacted>"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        let err = parse_document("{\"http\": {\"pathToken\": \"s3cr3t\",}}").unwrap_err();
        assert!(!err.contains("s3cr3t"), "{err}");
    }

    #[test]
    fn a_secret_manager_type_may_be_flytes_enum_number() {
        let c = load_json(json!({"webhook": {"secretManagerType": 2}}))
            .unwrap()
            .config;
        assert_eq!(c.webhook.secret_manager_type, Some(SecretManagerType::AWS));
        let err = load_json(json!({"webhook": {"secretManagerTypes": [7]}})).unwrap_err();
        assert!(err.message.contains("write its name"), "{err}");
    }

    #[test]
    fn a_bare_kv_version_number_is_refused_since_flyte_reads_it_as_a_position() {
        let err =
            load_json(json!({"webhook": {"vaultSecretManager": {"kvVersion": 1}}})).unwrap_err();
        assert_eq!(err.key, "webhook.vaultSecretManager.kvVersion");
        assert!(err.message.contains("quoted"), "{err}");
    }

    #[rstest]
    #[case::plain("/etc/certs", "/etc/certs")]
    #[case::dollar("$HOME/certs", "/home/u/certs")]
    #[case::braced("${HOME}/x", "/home/u/x")]
    #[case::unknown("/a/$NOPE/b", "/a//b")]
    #[case::lone_dollar("/a/$", "/a/$")]
    fn cert_dir_is_env_expanded(#[case] input: &str, #[case] expected: &str) {
        let got = expand_env(input, |k| (k == "HOME").then(|| "/home/u".to_owned()));
        assert_eq!(got, expected);
    }
}
