//! The `mesh` config section and the pieces the mesh mutators share.
//!
//! Four mutators reproduce the mesh webhook (seed 002): [`namespace`](super::namespace) labels
//! pods that arrived through the namespace rule, [`dns`](super::dns) bounds the resolver,
//! [`gate`](super::gate) holds the app until the pod has an identity, and
//! [`socket_check`](super::socket_check) refuses a pod whose Unix socket can never arrive.
//!
//! "Managed" means one thing everywhere: the pod's `<managedLabel>` is `"true"` once namespace
//! injection ran. A pod that says `"false"` has opted out and no mesh mutator touches it; any
//! other value (or none) is simply not managed. Nothing here runs unless `mesh.enabled` is set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Pod, ResourceRequirements, SeccompProfile, SecurityContext,
};
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, equal_resources};
use crate::mutate::PodMutator;
use crate::mutate::dns::DnsOptions;
use crate::mutate::gate::InitGate;
use crate::mutate::namespace::NamespaceInjection;
use crate::mutate::socket_check::{SUN_PATH_MAX, SocketCheck};

pub const DEFAULT_MANAGED_LABEL: &str = "aether.io/managed";
pub const DEFAULT_MESH_DOMAIN: &str = "aether.internal";
pub const DEFAULT_GATE_NAME: &str = "aether-identity-ready";
pub const DEFAULT_GATE_COMMAND: &str = "/identity-ready";
pub const DEFAULT_GATE_VOLUME: &str = "aether-identity-gate-spiffe";
pub const DEFAULT_GATE_DRIVER: &str = "csi.spiffe.io";
/// The spiffe-csi-driver's conventional mount point and the SPIRE agent's socket in it.
pub const DEFAULT_GATE_MOUNT_PATH: &str = "/spiffe-workload-api";
pub const DEFAULT_GATE_SOCKET_PATH: &str = "/spiffe-workload-api/spire-agent.sock";
pub const DEFAULT_GATE_OPT_OUT: &str = "aether.io/identity-gate";
pub const DEFAULT_SOCKET_ANNOTATION: &str = "endpoint.aether.io/uds-socket";
pub const DEFAULT_CARRIER_DRIVER: &str = "csi.aether.io";

/// The label value that makes a pod managed, and the one that opts it out.
pub const MANAGED: &str = "true";
pub const OPTED_OUT: &str = "false";

/// glibc caps `ndots` at 15 (RES_MAXNDOTS), `timeout` at 30 s and `attempts` at 5; larger values
/// are silently clamped, so a config that asks for more is a mistake worth stopping on.
pub const MAX_NDOTS: u32 = 15;
pub const MAX_TIMEOUT: u32 = 30;
pub const MAX_ATTEMPTS: u32 = 5;
/// An init container that waits longer than this is a hang, not a gate; 0 (wait forever) is the
/// explicit way to fail closed.
pub const MAX_GATE_TIMEOUT_SECONDS: u32 = 3600;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshConfig {
    /// The one switch for every mesh mutator; off by default.
    pub enabled: bool,
    /// Pod label that marks a pod managed (`"true"`) or opted out (`"false"`).
    pub managed_label: String,
    /// The mesh's DNS domain: mesh names are `<svc>.<meshDomain>`.
    pub mesh_domain: String,
    pub dns: MeshDnsConfig,
    pub gate: GateConfig,
    pub socket_check: SocketCheckConfig,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            managed_label: DEFAULT_MANAGED_LABEL.into(),
            mesh_domain: DEFAULT_MESH_DOMAIN.into(),
            dns: MeshDnsConfig::default(),
            gate: GateConfig::default(),
            socket_check: SocketCheckConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshDnsConfig {
    pub enabled: bool,
    /// Overrides the derived value (the label count of `meshDomain`).
    pub ndots: Option<u32>,
    /// Seconds before the resolver retransmits (resolv.conf `timeout`).
    pub timeout: u32,
    /// Tries per name server (resolv.conf `attempts`).
    pub attempts: u32,
}

impl Default for MeshDnsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ndots: None,
            timeout: 1,
            attempts: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GateConfig {
    /// Off by default: the gate needs an image, which has no sensible default.
    pub enabled: bool,
    /// Init container name, also the idempotency key.
    pub name: String,
    pub image: String,
    pub image_pull_policy: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// The Workload API socket inside the gate container; must lie under `volume.mountPath`.
    pub socket_path: String,
    /// How long the gate waits for an identity before it exits 1; 0 waits forever (fail closed).
    pub timeout_seconds: u32,
    pub resources: ResourceRequirements,
    /// The default passes Pod Security "restricted" except `runAsNonRoot`, which depends on the
    /// image; `null` leaves the container without one.
    pub security_context: Option<SecurityContext>,
    pub volume: GateVolumeConfig,
    /// Pod annotation; the value `"false"` skips the gate for that pod.
    pub opt_out_annotation: String,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            name: DEFAULT_GATE_NAME.into(),
            image: String::new(),
            image_pull_policy: "IfNotPresent".into(),
            command: vec![DEFAULT_GATE_COMMAND.into()],
            args: Vec::new(),
            socket_path: DEFAULT_GATE_SOCKET_PATH.into(),
            timeout_seconds: 0,
            resources: equal_resources("32Mi", "50m"),
            security_context: Some(default_gate_security_context()),
            volume: GateVolumeConfig::default(),
            opt_out_annotation: DEFAULT_GATE_OPT_OUT.into(),
        }
    }
}

pub fn default_gate_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        read_only_root_filesystem: Some(true),
        seccomp_profile: Some(SeccompProfile {
            localhost_profile: None,
            type_: "RuntimeDefault".into(),
        }),
        ..Default::default()
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GateVolumeConfig {
    pub name: String,
    pub driver: String,
    /// Where the volume is mounted in the gate container (and nowhere else).
    pub mount_path: String,
    pub read_only: bool,
    pub volume_attributes: BTreeMap<String, String>,
}

impl Default for GateVolumeConfig {
    fn default() -> Self {
        Self {
            name: DEFAULT_GATE_VOLUME.into(),
            driver: DEFAULT_GATE_DRIVER.into(),
            mount_path: DEFAULT_GATE_MOUNT_PATH.into(),
            read_only: true,
            volume_attributes: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketCheckConfig {
    pub enabled: bool,
    /// Pod annotation declaring the socket as `<volume>/<file>`.
    pub annotation: String,
    /// The CSI driver that delivers sockets into pods.
    pub carrier_driver: String,
}

impl Default for SocketCheckConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            annotation: DEFAULT_SOCKET_ANNOTATION.into(),
            carrier_driver: DEFAULT_CARRIER_DRIVER.into(),
        }
    }
}

impl MeshConfig {
    /// The `ndots` the dns mutator sets: the override, or the label count of `meshDomain`, so
    /// that `<svc>.<meshDomain>` has exactly `ndots` dots and is tried as an absolute name first.
    pub fn ndots(&self) -> u32 {
        self.dns.ndots.unwrap_or_else(|| {
            self.mesh_domain
                .trim_end_matches('.')
                .split('.')
                .filter(|l| !l.is_empty())
                .count() as u32
        })
    }

    /// Checks what types cannot express, whether or not `enabled` is set (so flipping the switch
    /// never reveals a latent mistake). Returns the warnings worth logging.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        if !self.enabled && *self != Self::default() {
            warnings.push(
                "mesh.enabled is false: the other mesh.* settings are validated but have no effect"
                    .into(),
            );
        }
        if let Some(problem) = qualified_name_problem(&self.managed_label) {
            return Err(ConfigError::new("mesh.managedLabel", problem));
        }
        self.validate_dns()?;
        self.validate_gate(&mut warnings)?;
        let s = &self.socket_check;
        if let Some(problem) = qualified_name_problem(&s.annotation) {
            return Err(ConfigError::new("mesh.socketCheck.annotation", problem));
        }
        if !is_dns_subdomain(&s.carrier_driver) {
            return Err(ConfigError::new(
                "mesh.socketCheck.carrierDriver",
                format!(
                    "{:?} is not a CSI driver name (a DNS subdomain such as {DEFAULT_CARRIER_DRIVER})",
                    s.carrier_driver
                ),
            ));
        }
        Ok(warnings)
    }

    fn validate_dns(&self) -> Result<(), ConfigError> {
        let d = &self.dns;
        let domain = self.mesh_domain.trim_end_matches('.');
        if !domain.is_empty() && !is_dns_subdomain(domain) {
            return Err(ConfigError::new(
                "mesh.meshDomain",
                format!(
                    "{:?} is not a DNS domain (lowercase labels of letters, digits and '-', joined by '.')",
                    self.mesh_domain
                ),
            ));
        }
        match d.ndots {
            Some(n) if n > MAX_NDOTS => {
                return Err(ConfigError::new(
                    "mesh.dns.ndots",
                    format!("{n} is over the resolver's maximum of {MAX_NDOTS}"),
                ));
            }
            None if d.enabled && domain.is_empty() => {
                return Err(ConfigError::new(
                    "mesh.meshDomain",
                    "is empty, so ndots cannot be derived from it: set mesh.meshDomain (e.g. aether.internal) or mesh.dns.ndots",
                ));
            }
            None if self.ndots() > MAX_NDOTS => {
                return Err(ConfigError::new(
                    "mesh.meshDomain",
                    format!(
                        "has {} labels, over the resolver's ndots maximum of {MAX_NDOTS}; set mesh.dns.ndots",
                        self.ndots()
                    ),
                ));
            }
            _ => {}
        }
        if !(1..=MAX_TIMEOUT).contains(&d.timeout) {
            return Err(ConfigError::new(
                "mesh.dns.timeout",
                format!(
                    "{} is outside 1..={MAX_TIMEOUT} seconds (the resolver clamps larger values; 1 is right for a node-local resolver)",
                    d.timeout
                ),
            ));
        }
        if !(1..=MAX_ATTEMPTS).contains(&d.attempts) {
            return Err(ConfigError::new(
                "mesh.dns.attempts",
                format!("{} is outside 1..={MAX_ATTEMPTS}", d.attempts),
            ));
        }
        Ok(())
    }

    fn validate_gate(&self, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
        let g = &self.gate;
        let v = &g.volume;
        if !is_dns_label(&g.name) {
            return Err(ConfigError::new(
                "mesh.gate.name",
                format!("{:?} is not a container name: {DNS_LABEL_RULE}", g.name),
            ));
        }
        if g.enabled && g.image.trim().is_empty() {
            return Err(ConfigError::new(
                "mesh.gate.image",
                "must be set when mesh.gate.enabled is true (the image that runs the gate command, e.g. the mesh agent image)",
            ));
        }
        if g.image.chars().any(char::is_whitespace) {
            return Err(ConfigError::new(
                "mesh.gate.image",
                format!("{:?} contains whitespace", g.image),
            ));
        }
        if !["Always", "IfNotPresent", "Never"].contains(&g.image_pull_policy.as_str()) {
            return Err(ConfigError::new(
                "mesh.gate.imagePullPolicy",
                format!(
                    "{:?} is not one of Always, IfNotPresent, Never",
                    g.image_pull_policy
                ),
            ));
        }
        if g.command.is_empty() || g.command.iter().any(|c| c.is_empty()) {
            return Err(ConfigError::new(
                "mesh.gate.command",
                format!(
                    "must be a non-empty list of non-empty strings (default [{DEFAULT_GATE_COMMAND:?}])"
                ),
            ));
        }
        if !is_dns_label(&v.name) {
            return Err(ConfigError::new(
                "mesh.gate.volume.name",
                format!("{:?} is not a volume name: {DNS_LABEL_RULE}", v.name),
            ));
        }
        if !is_dns_subdomain(&v.driver) {
            return Err(ConfigError::new(
                "mesh.gate.volume.driver",
                format!(
                    "{:?} is not a CSI driver name (a DNS subdomain such as {DEFAULT_GATE_DRIVER})",
                    v.driver
                ),
            ));
        }
        if v.driver == self.socket_check.carrier_driver {
            return Err(ConfigError::new(
                "mesh.gate.volume.driver",
                format!(
                    "{:?} is also mesh.socketCheck.carrierDriver: the socket check would count the gate's volume as a second socket carrier",
                    v.driver
                ),
            ));
        }
        if let Some(problem) = absolute_path_problem(&v.mount_path) {
            return Err(ConfigError::new("mesh.gate.volume.mountPath", problem));
        }
        if v.mount_path == "/" {
            return Err(ConfigError::new(
                "mesh.gate.volume.mountPath",
                "must not be \"/\": the volume would hide the gate image's own files",
            ));
        }
        if !v.read_only {
            warnings.push(format!(
                "mesh.gate.volume.readOnly is false: the gate only reads the socket, and {DEFAULT_GATE_DRIVER} refuses writable volumes"
            ));
        }
        if let Some(problem) = absolute_path_problem(&g.socket_path) {
            return Err(ConfigError::new("mesh.gate.socketPath", problem));
        }
        let dir = v.mount_path.trim_end_matches('/');
        if !g
            .socket_path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'))
        {
            return Err(ConfigError::new(
                "mesh.gate.socketPath",
                format!(
                    "{:?} is not under mesh.gate.volume.mountPath {:?}, the only place the socket appears in the gate container",
                    g.socket_path, v.mount_path
                ),
            ));
        }
        if g.socket_path.len() > SUN_PATH_MAX {
            return Err(ConfigError::new(
                "mesh.gate.socketPath",
                format!(
                    "is {} bytes, over the AF_UNIX limit of {SUN_PATH_MAX}",
                    g.socket_path.len()
                ),
            ));
        }
        if g.timeout_seconds > MAX_GATE_TIMEOUT_SECONDS {
            return Err(ConfigError::new(
                "mesh.gate.timeoutSeconds",
                format!(
                    "{} is over {MAX_GATE_TIMEOUT_SECONDS}: use 0 to wait forever (fail closed) or a bound of at most an hour",
                    g.timeout_seconds
                ),
            ));
        }
        if let Some(problem) = qualified_name_problem(&g.opt_out_annotation) {
            return Err(ConfigError::new("mesh.gate.optOutAnnotation", problem));
        }
        Ok(())
    }
}

/// The enabled mesh mutators in chain order (`namespace-injection`, `dns`, `init-gate`,
/// `socket-check`), each with its default `required`. Empty when `mesh.enabled` is false.
pub fn mesh_mutators(cfg: &MeshConfig) -> Vec<(Box<dyn PodMutator>, bool)> {
    let mut out: Vec<(Box<dyn PodMutator>, bool)> = Vec::new();
    if !cfg.enabled {
        return out;
    }
    out.push((Box::new(NamespaceInjection::new(cfg)), false));
    if cfg.dns.enabled {
        out.push((Box::new(DnsOptions::new(cfg)), false));
    }
    if cfg.gate.enabled {
        out.push((Box::new(InitGate::new(cfg)), false));
    }
    if cfg.socket_check.enabled {
        // The one mesh rule that refuses: a pod that cannot get its socket is denied.
        out.push((Box::new(SocketCheck::new(cfg)), true));
    }
    out
}

/// Every mutator of the chain in `MUTATOR_IDS` order: the enabled mesh mutators around
/// `secrets` (namespace injection first, so a namespace-routed pod is managed before anything
/// reads the label; the gate after secrets, so it is inserted first last and stays first).
pub fn in_chain_order(
    cfg: &MeshConfig,
    secrets: (Box<dyn PodMutator>, bool),
) -> Vec<(Box<dyn PodMutator>, bool)> {
    let mut all = mesh_mutators(cfg);
    all.push(secrets);
    let position = |id: &str| {
        super::MUTATOR_IDS
            .iter()
            .position(|known| *known == id)
            .unwrap_or(usize::MAX)
    };
    // Stable: mutators with the same position keep their order.
    all.sort_by_key(|(m, _)| position(m.id()));
    all
}

/// Init containers other mutators must leave alone (the secrets mutator's `skip_containers`).
pub fn skip_containers(cfg: &MeshConfig) -> Vec<String> {
    if cfg.enabled && cfg.gate.enabled {
        vec![cfg.gate.name.clone()]
    } else {
        Vec::new()
    }
}

/// The pod's value for label `key`.
pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The pod's value for annotation `key`.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether the mesh mutators act on `pod`: its managed label is exactly `"true"`.
pub fn is_managed(pod: &Pod, managed_label: &str) -> bool {
    label(pod, managed_label) == Some(MANAGED)
}

const DNS_LABEL_RULE: &str =
    "at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit";

/// RFC 1123 label, as Kubernetes checks container and volume names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: labels joined by '.', at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Why `key` is not a Kubernetes label or annotation key (`[prefix/]name`), if it is not.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Some(format!(
            "{key:?}: the prefix {p:?} must be a DNS subdomain such as aether.io"
        ));
    }
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    (!name_ok).then(|| {
        format!(
            "{key:?} is not a label or annotation key: the name part must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    })
}

/// Why `path` is not a clean absolute path, if it is not.
fn absolute_path_problem(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some(format!("{path:?} must be an absolute path"));
    }
    if path.contains(':') || path.contains('\0') {
        return Some(format!("{path:?} must not contain ':' or NUL"));
    }
    let body = path.trim_end_matches('/');
    if body
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Some(format!(
            "{path:?} must be a clean path (no empty, '.' or '..' segments)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::MUTATOR_IDS;
    use rstest::rstest;
    use serde_json::{Value, json};

    fn parse(v: Value) -> MeshConfig {
        serde_json::from_value(v).expect("mesh section parses")
    }

    fn enabled_gate() -> Value {
        json!({"enabled": true, "gate": {"enabled": true, "image": "registry.example/aether/agent:v1"}})
    }

    #[test]
    fn defaults_are_off_with_the_seed_names() {
        let c = MeshConfig::default();
        assert!(!c.enabled);
        assert_eq!(c.managed_label, "aether.io/managed");
        assert_eq!(c.ndots(), 2);
        assert_eq!((c.dns.timeout, c.dns.attempts), (1, 3));
        assert!(!c.gate.enabled);
        assert_eq!(c.gate.name, "aether-identity-ready");
        assert_eq!(c.gate.volume.driver, "csi.spiffe.io");
        assert_eq!(c.socket_check.annotation, "endpoint.aether.io/uds-socket");
        assert_eq!(c.validate(), Ok(vec![]));
        assert!(mesh_mutators(&c).is_empty());
        assert!(skip_containers(&c).is_empty());
    }

    #[test]
    fn an_empty_section_is_the_default() {
        assert_eq!(parse(json!({})), MeshConfig::default());
    }

    #[rstest]
    #[case::two_labels("aether.internal", None, 2)]
    #[case::trailing_dot("aether.internal.", None, 2)]
    #[case::one_label("mesh", None, 1)]
    #[case::three_labels("svc.aether.internal", None, 3)]
    #[case::override_wins("aether.internal", Some(5), 5)]
    fn ndots_is_the_label_count_of_the_mesh_domain(
        #[case] domain: &str,
        #[case] ndots: Option<u32>,
        #[case] expected: u32,
    ) {
        let c = parse(json!({"meshDomain": domain, "dns": {"ndots": ndots}}));
        assert_eq!(c.ndots(), expected);
    }

    #[rstest]
    #[case::unknown_key(json!({"enabeld": true}), "mesh.enabeld")]
    #[case::unknown_gate_key(json!({"gate": {"imag": "x"}}), "mesh.gate.imag")]
    #[case::wrong_type(json!({"dns": {"timeout": "1s"}}), "mesh.dns.timeout")]
    fn unknown_or_mistyped_keys_are_refused_by_serde(#[case] v: Value, #[case] key: &str) {
        let v = json!({ "mesh": v });
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Root {
            mesh: MeshConfig,
        }
        let err = serde_path_to_error::deserialize::<_, Root>(&v).unwrap_err();
        assert_eq!(err.path().to_string(), key);
    }

    #[rstest]
    #[case::managed_label_with_space(json!({"managedLabel": "aether io/managed"}), "mesh.managedLabel")]
    #[case::managed_label_bad_prefix(json!({"managedLabel": "Aether_IO/managed"}), "mesh.managedLabel")]
    #[case::mesh_domain_not_a_domain(json!({"meshDomain": "Aether..internal"}), "mesh.meshDomain")]
    #[case::no_domain_and_no_ndots(json!({"meshDomain": ""}), "mesh.meshDomain")]
    #[case::ndots_over_15(json!({"dns": {"ndots": 16}}), "mesh.dns.ndots")]
    #[case::zero_timeout(json!({"dns": {"timeout": 0}}), "mesh.dns.timeout")]
    #[case::timeout_over_30(json!({"dns": {"timeout": 31}}), "mesh.dns.timeout")]
    #[case::six_attempts(json!({"dns": {"attempts": 6}}), "mesh.dns.attempts")]
    #[case::gate_without_image(json!({"gate": {"enabled": true}}), "mesh.gate.image")]
    #[case::gate_image_with_space(json!({"gate": {"image": "a b"}}), "mesh.gate.image")]
    #[case::gate_name_not_a_label(json!({"gate": {"name": "Identity_Ready"}}), "mesh.gate.name")]
    #[case::gate_pull_policy(json!({"gate": {"imagePullPolicy": "Sometimes"}}), "mesh.gate.imagePullPolicy")]
    #[case::gate_empty_command(json!({"gate": {"command": []}}), "mesh.gate.command")]
    #[case::gate_relative_socket(json!({"gate": {"socketPath": "spire-agent.sock"}}), "mesh.gate.socketPath")]
    #[case::gate_socket_outside_mount(json!({"gate": {"socketPath": "/run/spire/agent.sock"}}), "mesh.gate.socketPath")]
    #[case::gate_socket_is_the_mount(json!({"gate": {"socketPath": "/spiffe-workload-api/"}}), "mesh.gate.socketPath")]
    #[case::gate_socket_prefix_is_not_a_parent(json!({"gate": {"socketPath": "/spiffe-workload-api-2/s.sock"}}), "mesh.gate.socketPath")]
    #[case::gate_socket_dotdot(json!({"gate": {"socketPath": "/spiffe-workload-api/../etc/s.sock"}}), "mesh.gate.socketPath")]
    #[case::gate_socket_too_long(json!({"gate": {"socketPath": format!("/spiffe-workload-api/{}", "s".repeat(90))}}), "mesh.gate.socketPath")]
    #[case::gate_timeout_over_an_hour(json!({"gate": {"timeoutSeconds": 3601}}), "mesh.gate.timeoutSeconds")]
    #[case::gate_volume_name(json!({"gate": {"volume": {"name": "spiffe_socket"}}}), "mesh.gate.volume.name")]
    #[case::gate_volume_driver(json!({"gate": {"volume": {"driver": ""}}}), "mesh.gate.volume.driver")]
    #[case::gate_driver_is_the_carrier(json!({"gate": {"volume": {"driver": "csi.aether.io"}}}), "mesh.gate.volume.driver")]
    #[case::gate_mount_relative(json!({"gate": {"volume": {"mountPath": "spiffe"}}}), "mesh.gate.volume.mountPath")]
    #[case::gate_mount_root(json!({"gate": {"volume": {"mountPath": "/"}, "socketPath": "/s.sock"}}), "mesh.gate.volume.mountPath")]
    #[case::gate_opt_out_annotation(json!({"gate": {"optOutAnnotation": "/x"}}), "mesh.gate.optOutAnnotation")]
    #[case::socket_annotation(json!({"socketCheck": {"annotation": "endpoint.aether.io/"}}), "mesh.socketCheck.annotation")]
    #[case::carrier_driver(json!({"socketCheck": {"carrierDriver": "CSI AETHER"}}), "mesh.socketCheck.carrierDriver")]
    fn bad_mesh_config_names_the_key(#[case] v: Value, #[case] key: &str) {
        // Validated whether or not mesh.enabled is set.
        for enabled in [false, true] {
            let mut v = v.clone();
            v["enabled"] = json!(enabled);
            let err = parse(v).validate().unwrap_err();
            assert_eq!(err.key, key, "{err}");
        }
    }

    #[test]
    fn a_complete_gate_config_is_valid() {
        let c = parse(enabled_gate());
        assert_eq!(c.validate(), Ok(vec![]));
    }

    #[rstest]
    #[case::settings_while_disabled(json!({"gate": {"timeoutSeconds": 30}}), "mesh.enabled is false")]
    #[case::writable_gate_volume(json!({"enabled": true, "gate": {"volume": {"readOnly": false}}}), "readOnly is false")]
    fn questionable_mesh_config_loads_with_a_warning(#[case] v: Value, #[case] warning: &str) {
        let warnings = parse(v).validate().unwrap();
        assert!(warnings.iter().any(|w| w.contains(warning)), "{warnings:?}");
    }

    #[test]
    fn mutators_come_in_chain_order_and_only_the_socket_check_is_required() {
        let c = parse(enabled_gate());
        let got: Vec<_> = mesh_mutators(&c)
            .iter()
            .map(|(m, required)| (m.id(), *required))
            .collect();
        assert_eq!(
            got,
            [
                ("namespace-injection", false),
                ("dns", false),
                ("init-gate", false),
                ("socket-check", true)
            ]
        );
        assert_eq!(skip_containers(&c), ["aether-identity-ready"]);
    }

    #[rstest]
    #[case::dns_off(json!({"enabled": true, "dns": {"enabled": false}}), &["namespace-injection", "socket-check"])]
    #[case::gate_default_off(json!({"enabled": true}), &["namespace-injection", "dns", "socket-check"])]
    #[case::socket_check_off(json!({"enabled": true, "socketCheck": {"enabled": false}}), &["namespace-injection", "dns"])]
    #[case::mesh_off(json!({"enabled": false, "gate": {"enabled": true, "image": "x"}}), &[])]
    fn switches_leave_mutators_out(#[case] v: Value, #[case] ids: &[&str]) {
        let got: Vec<_> = mesh_mutators(&parse(v))
            .iter()
            .map(|(m, _)| m.id())
            .collect();
        assert_eq!(got, ids);
    }

    struct Named(&'static str);
    impl PodMutator for Named {
        fn id(&self) -> &'static str {
            self.0
        }
        fn mutate(
            &self,
            _: &crate::mutate::PodCtx<'_>,
            _: &mut Pod,
        ) -> Result<(), crate::error::Denial> {
            Ok(())
        }
    }

    /// The intended chain, stated here rather than read from `MUTATOR_IDS` (the constant
    /// `in_chain_order` sorts by), so reordering that constant fails this test:
    /// - `namespace-injection` first: it adds the managed label, and every later mutator decides
    ///   whether to act by reading that label;
    /// - `secrets` before the gate: the secrets managers append fetcher init containers, and the
    ///   gate inserts itself at index 0 afterwards, so the gate still runs first in the pod;
    /// - `dns` after `secrets` and before the gate (neither reads the other's fields; README
    ///   "Mesh" documents this order);
    /// - `socket-check` last: it denies on the final pod, after the gate added its volume.
    const INTENDED_CHAIN: [&str; 5] = [
        "namespace-injection",
        "secrets",
        "dns",
        "init-gate",
        "socket-check",
    ];

    #[test]
    fn secrets_sits_between_namespace_injection_and_dns() {
        let all = in_chain_order(&parse(enabled_gate()), (Box::new(Named("secrets")), true));
        let ids: Vec<_> = all.iter().map(|(m, _)| m.id()).collect();
        assert_eq!(ids, INTENDED_CHAIN);
        // Config keys under `mutators` are the same ids, in the same order.
        assert_eq!(MUTATOR_IDS, INTENDED_CHAIN);
        let required: Vec<_> = all.iter().map(|(_, r)| *r).collect();
        assert_eq!(required, [false, true, false, false, true]);
        let off = in_chain_order(&MeshConfig::default(), (Box::new(Named("secrets")), true));
        let ids: Vec<_> = off.iter().map(|(m, _)| m.id()).collect();
        assert_eq!(ids, ["secrets"]);
        // Switches leave mutators out without moving the others.
        let no_dns = parse(json!({"enabled": true, "dns": {"enabled": false}}));
        let ids: Vec<_> = in_chain_order(&no_dns, (Box::new(Named("secrets")), true))
            .iter()
            .map(|(m, _)| m.id())
            .collect();
        assert_eq!(ids, ["namespace-injection", "secrets", "socket-check"]);
    }

    #[rstest]
    #[case::plain("managed", true)]
    #[case::prefixed("aether.io/managed", true)]
    #[case::dots_inside("a.b/x.y_z-1", true)]
    #[case::empty("", false)]
    #[case::empty_name("aether.io/", false)]
    #[case::upper_prefix("Aether.io/x", false)]
    #[case::two_slashes("a/b/c", false)]
    #[case::too_long_name(&"x".repeat(64), false)]
    fn label_keys(#[case] key: &str, #[case] ok: bool) {
        assert_eq!(qualified_name_problem(key).is_none(), ok, "{key}");
    }
}
