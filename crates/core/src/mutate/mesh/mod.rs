//! The mesh mutators and the pieces they share.
//!
//! Four mutators reproduce the mesh webhook (seed 002): [`namespace`] labels pods that arrived
//! through the namespace rule, [`dns`] bounds the resolver, [`gate`] holds the app until the pod
//! has an identity, and [`socket_check`] refuses a pod whose Unix socket can never arrive. Their
//! settings are the `mesh` config section ([`crate::config::mesh`]).
//!
//! "Managed" means one thing everywhere: the pod's `<managedLabel>` is `"true"` once namespace
//! injection ran. A pod that says `"false"` has opted out and no mesh mutator touches it; any
//! other value (or none) is simply not managed. Nothing here runs unless `mesh.enabled` is set.

pub mod dns;
pub mod gate;
pub mod namespace;
pub mod socket_check;

use k8s_openapi::api::core::v1::Pod;

pub use crate::config::mesh::{MANAGED, MeshConfig, OPTED_OUT};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s_names::qualified_name_problem;
    use rstest::rstest;
    use serde::Deserialize;
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
    fn only_the_gate_is_skipped_by_the_other_mutators() {
        assert_eq!(
            skip_containers(&parse(enabled_gate())),
            ["aether-identity-ready"]
        );
        assert!(skip_containers(&parse(json!({"enabled": true}))).is_empty());
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
