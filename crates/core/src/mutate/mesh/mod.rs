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
use crate::mutate::{PodMutator, Step};
use dns::DnsOptions;
use gate::InitGate;
use namespace::NamespaceInjection;
use socket_check::SocketCheck;

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
/// `others` (`secrets` and the image mutators; namespace injection first, so a namespace-routed
/// pod is managed before anything reads the label; the gate after secrets, so it is inserted
/// first last and stays first).
pub fn in_chain_order(cfg: &MeshConfig, others: Vec<(Step, bool)>) -> Vec<(Step, bool)> {
    let mut all: Vec<(Step, bool)> = mesh_mutators(cfg)
        .into_iter()
        .map(|(m, required)| (Step::Mutator(m), required))
        .collect();
    all.extend(others);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s_names::qualified_name_problem;
    use crate::mutate::MUTATOR_IDS;
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
        ) -> Result<crate::mutate::Effects, crate::mutate::Denied> {
            Ok(crate::mutate::Effects::default())
        }
    }

    /// The intended chain, stated here rather than read from `MUTATOR_IDS` (the constant
    /// `in_chain_order` sorts by), so reordering that constant fails this test:
    /// - `namespace-injection` first: it adds the managed label, and every later mutator decides
    ///   whether to act by reading that label;
    /// - `secrets` before the gate: the secrets managers append fetcher init containers, and the
    ///   gate inserts itself at index 0 afterwards, so the gate still runs first in the pod;
    /// - `dns` after `secrets` and before the gate (neither reads the other's fields;
    ///   docs/mesh.md documents this order);
    /// - `socket-check` after the mesh: it denies on the final mesh pod, after the gate added
    ///   its volume;
    /// - `image-builder` after every container is in the pod (the secrets fetchers' and the
    ///   gate's included), so its verification sees every image; it excludes the Embedded init
    ///   container by name, as in Flyte;
    /// - `image-rules` last: "applied after the Flyte mutator", so a rule never rewrites what
    ///   the image builder is about to verify, and rewrites the gate's image too.
    const INTENDED_CHAIN: [&str; 7] = [
        "namespace-injection",
        "secrets",
        "dns",
        "init-gate",
        "socket-check",
        "image-builder",
        "image-rules",
    ];

    fn others() -> Vec<(Step, bool)> {
        vec![
            (Step::Mutator(Box::new(Named("image-rules"))), false),
            (Step::Secrets, true),
            (Step::Mutator(Box::new(Named("image-builder"))), true),
        ]
    }

    #[test]
    fn secrets_sits_between_namespace_injection_and_dns() {
        let all = in_chain_order(&parse(enabled_gate()), others());
        let ids: Vec<_> = all.iter().map(|(m, _)| m.id()).collect();
        assert_eq!(ids, INTENDED_CHAIN);
        // Config keys under `mutators` are the same ids, in the same order.
        assert_eq!(MUTATOR_IDS, INTENDED_CHAIN);
        let required: Vec<_> = all.iter().map(|(_, r)| *r).collect();
        assert_eq!(required, [false, true, false, false, true, true, false]);
        let off = in_chain_order(&MeshConfig::default(), others());
        let ids: Vec<_> = off.iter().map(|(m, _)| m.id()).collect();
        assert_eq!(ids, ["secrets", "image-builder", "image-rules"]);
        // Switches leave mutators out without moving the others.
        let no_dns = parse(json!({"enabled": true, "dns": {"enabled": false}}));
        let ids: Vec<_> = in_chain_order(&no_dns, others())
            .iter()
            .map(|(m, _)| m.id())
            .collect();
        assert_eq!(
            ids,
            [
                "namespace-injection",
                "secrets",
                "socket-check",
                "image-builder",
                "image-rules"
            ]
        );
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
