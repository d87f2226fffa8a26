//! The `mesh` section: the mesh mutators' settings and the checks types cannot express
//! (feature code lives in `crate::mutate::mesh`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ResourceRequirements, SeccompProfile, SecurityContext,
};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use super::{ConfigError, equal_resources};
use crate::k8s_names::{DNS_LABEL_RULE, is_dns_label, is_dns_subdomain, qualified_name_problem};

/// The AF_UNIX `sun_path` limit without its terminating NUL (Linux: 108 bytes).
pub const SUN_PATH_MAX: usize = 107;

pub const DEFAULT_GATE_COMMAND: &str = "/identity-ready";
pub const DEFAULT_GATE_DRIVER: &str = "csi.spiffe.io";
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshConfig {
    /// The one switch for every mesh mutator; off by default.
    pub enabled: bool,
    /// Pod label that marks a pod managed (`"true"`) or opted out (`"false"`).
    #[default("aether.io/managed".into())]
    pub managed_label: String,
    /// The mesh's DNS domain: mesh names are `<svc>.<meshDomain>`.
    #[default("aether.internal".into())]
    pub mesh_domain: String,
    pub dns: MeshDnsConfig,
    pub gate: GateConfig,
    pub socket_check: SocketCheckConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshDnsConfig {
    #[default(true)]
    pub enabled: bool,
    /// Overrides the derived value (the label count of `meshDomain`).
    pub ndots: Option<u32>,
    /// Seconds before the resolver retransmits (resolv.conf `timeout`).
    #[default(1)]
    pub timeout: u32,
    /// Tries per name server (resolv.conf `attempts`).
    #[default(3)]
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GateConfig {
    /// Off by default: the gate needs an image, which has no sensible default.
    pub enabled: bool,
    /// Init container name, also the idempotency key.
    #[default("aether-identity-ready".into())]
    pub name: String,
    pub image: String,
    #[default("IfNotPresent".into())]
    pub image_pull_policy: String,
    #[default(vec![DEFAULT_GATE_COMMAND.into()])]
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// The Workload API socket inside the gate container; must lie under `volume.mountPath`
    /// (by default the SPIRE agent's socket in the spiffe-csi-driver's mount point).
    #[default("/spiffe-workload-api/spire-agent.sock".into())]
    pub socket_path: String,
    /// How long the gate waits for an identity before it exits 1; 0 waits forever (fail closed).
    pub timeout_seconds: u32,
    #[cfg_attr(feature = "schema", schemars(with = "super::KubernetesObject"))]
    #[default(equal_resources("32Mi", "50m"))]
    pub resources: ResourceRequirements,
    /// The default passes Pod Security "restricted" except `runAsNonRoot`, which depends on the
    /// image; `null` leaves the container without one.
    #[cfg_attr(feature = "schema", schemars(with = "Option<super::KubernetesObject>"))]
    #[default(Some(default_gate_security_context()))]
    pub security_context: Option<SecurityContext>,
    pub volume: GateVolumeConfig,
    /// Pod annotation; the value `"false"` skips the gate for that pod.
    #[default("aether.io/identity-gate".into())]
    pub opt_out_annotation: String,
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GateVolumeConfig {
    #[default("aether-identity-gate-spiffe".into())]
    pub name: String,
    #[default(DEFAULT_GATE_DRIVER.into())]
    pub driver: String,
    /// Where the volume is mounted in the gate container (and nowhere else): the
    /// spiffe-csi-driver's conventional mount point.
    #[default("/spiffe-workload-api".into())]
    pub mount_path: String,
    #[default(true)]
    pub read_only: bool,
    pub volume_attributes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketCheckConfig {
    #[default(true)]
    pub enabled: bool,
    /// Pod annotation declaring the socket as `<volume>/<file>`.
    #[default("endpoint.aether.io/uds-socket".into())]
    pub annotation: String,
    /// The CSI driver that delivers sockets into pods.
    #[default(DEFAULT_CARRIER_DRIVER.into())]
    pub carrier_driver: String,
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
            warnings.push(String::from(
                "mesh.enabled is false: the other mesh.* settings are validated but have no effect",
            ));
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
        ensure!(
            is_dns_subdomain(&s.carrier_driver),
            "mesh.socketCheck.carrierDriver",
            "{:?} is not a CSI driver name (a DNS subdomain such as {DEFAULT_CARRIER_DRIVER})",
            s.carrier_driver
        );
        Ok(warnings)
    }

    fn validate_dns(&self) -> Result<(), ConfigError> {
        let d = &self.dns;
        let domain = self.mesh_domain.trim_end_matches('.');
        ensure!(
            domain.is_empty() || is_dns_subdomain(domain),
            "mesh.meshDomain",
            "{:?} is not a DNS domain (lowercase labels of letters, digits and '-', joined by '.')",
            self.mesh_domain
        );
        match d.ndots {
            Some(n) if n > MAX_NDOTS => bail!(
                "mesh.dns.ndots",
                "{n} is over the resolver's maximum of {MAX_NDOTS}"
            ),
            None if d.enabled && domain.is_empty() => bail!(
                "mesh.meshDomain",
                "is empty, so ndots cannot be derived from it: set mesh.meshDomain (e.g. aether.internal) or mesh.dns.ndots"
            ),
            None if self.ndots() > MAX_NDOTS => bail!(
                "mesh.meshDomain",
                "has {} labels, over the resolver's ndots maximum of {MAX_NDOTS}; set mesh.dns.ndots",
                self.ndots()
            ),
            _ => {}
        }
        ensure!(
            (1..=MAX_TIMEOUT).contains(&d.timeout),
            "mesh.dns.timeout",
            "{} is outside 1..={MAX_TIMEOUT} seconds (the resolver clamps larger values; 1 is right for a node-local resolver)",
            d.timeout
        );
        ensure!(
            (1..=MAX_ATTEMPTS).contains(&d.attempts),
            "mesh.dns.attempts",
            "{} is outside 1..={MAX_ATTEMPTS}",
            d.attempts
        );
        Ok(())
    }

    fn validate_gate(&self, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
        let g = &self.gate;
        let v = &g.volume;
        ensure!(
            is_dns_label(&g.name),
            "mesh.gate.name",
            "{:?} is not a container name: {DNS_LABEL_RULE}",
            g.name
        );
        ensure!(
            !g.enabled || !g.image.trim().is_empty(),
            "mesh.gate.image",
            "must be set when mesh.gate.enabled is true (the image that runs the gate command, e.g. the mesh agent image)"
        );
        if g.enabled {
            super::images::check_image("mesh.gate.image", &g.image)?;
            super::check_resources("mesh.gate.resources", &g.resources)?;
            if let Some(sc) = &g.security_context {
                super::check_security_context("mesh.gate.securityContext", sc, warnings)?;
            }
        }
        ensure!(
            !g.image.chars().any(char::is_whitespace),
            "mesh.gate.image",
            "{:?} contains whitespace",
            g.image
        );
        ensure!(
            ["Always", "IfNotPresent", "Never"].contains(&g.image_pull_policy.as_str()),
            "mesh.gate.imagePullPolicy",
            "{:?} is not one of Always, IfNotPresent, Never",
            g.image_pull_policy
        );
        ensure!(
            !g.command.is_empty() && g.command.iter().all(|c| !c.is_empty()),
            "mesh.gate.command",
            "must be a non-empty list of non-empty strings (default [{DEFAULT_GATE_COMMAND:?}])"
        );
        ensure!(
            is_dns_label(&v.name),
            "mesh.gate.volume.name",
            "{:?} is not a volume name: {DNS_LABEL_RULE}",
            v.name
        );
        ensure!(
            is_dns_subdomain(&v.driver) && v.driver.len() <= 63,
            "mesh.gate.volume.driver",
            "{:?} is not a CSI driver name (a DNS subdomain of at most 63 characters, such as {DEFAULT_GATE_DRIVER})",
            v.driver
        );
        ensure!(
            v.driver != self.socket_check.carrier_driver,
            "mesh.gate.volume.driver",
            "{:?} is also mesh.socketCheck.carrierDriver: the socket check would count the gate's volume as a second socket carrier",
            v.driver
        );
        if let Some(problem) = absolute_path_problem(&v.mount_path) {
            return Err(ConfigError::new("mesh.gate.volume.mountPath", problem));
        }
        ensure!(
            v.mount_path != "/",
            "mesh.gate.volume.mountPath",
            "must not be \"/\": the volume would hide the gate image's own files"
        );
        let dir = v.mount_path.trim_end_matches('/');
        ensure!(
            dir != "/proc" && !dir.starts_with("/proc/"),
            "mesh.gate.volume.mountPath",
            "{:?} is under /proc, where the container runtime refuses a mount: the gate would never start",
            v.mount_path
        );
        if !v.read_only {
            warnings.push(format!(
                "mesh.gate.volume.readOnly is false: the gate only reads the socket, and {DEFAULT_GATE_DRIVER} refuses writable volumes"
            ));
        }
        if let Some(problem) = absolute_path_problem(&g.socket_path) {
            return Err(ConfigError::new("mesh.gate.socketPath", problem));
        }
        ensure!(
            g.socket_path
                .strip_prefix(dir)
                .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/')),
            "mesh.gate.socketPath",
            "{:?} is not under mesh.gate.volume.mountPath {:?}, the only place the socket appears in the gate container",
            g.socket_path,
            v.mount_path
        );
        ensure!(
            g.socket_path.len() <= SUN_PATH_MAX,
            "mesh.gate.socketPath",
            "is {} bytes, over the AF_UNIX limit of {SUN_PATH_MAX}",
            g.socket_path.len()
        );
        ensure!(
            g.timeout_seconds <= MAX_GATE_TIMEOUT_SECONDS,
            "mesh.gate.timeoutSeconds",
            "{} is over {MAX_GATE_TIMEOUT_SECONDS}: use 0 to wait forever (fail closed) or a bound of at most an hour",
            g.timeout_seconds
        );
        if let Some(problem) = qualified_name_problem(&g.opt_out_annotation) {
            return Err(ConfigError::new("mesh.gate.optOutAnnotation", problem));
        }
        ensure!(
            g.opt_out_annotation != self.socket_check.annotation,
            "mesh.gate.optOutAnnotation",
            "{:?} is also mesh.socketCheck.annotation: a pod opting out of the gate (\"false\") would be refused by the socket check, which reads the annotation as <volume>/<file>",
            g.opt_out_annotation
        );
        Ok(())
    }
}

/// Why `path` is not a clean absolute path, if it is not.
fn absolute_path_problem(path: &str) -> Option<String> {
    let mut segments = path.trim_end_matches('/').split('/').skip(1);
    let why = if !path.starts_with('/') {
        "must be an absolute path"
    } else if path.contains([':', '\0']) {
        "must not contain ':' or NUL"
    } else if segments.any(|seg| matches!(seg, "" | "." | "..")) {
        "must be a clean path (no empty, '.' or '..' segments)"
    } else {
        return None;
    };
    Some(format!("{path:?} {why}"))
}
