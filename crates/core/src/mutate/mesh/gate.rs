//! The egress identity gate: an init container, first of all, that holds a managed pod's app
//! containers until the identity provider (SPIRE) has issued the pod's certificate, so the app
//! cannot send before the node proxy has a client certificate for it.

use k8s_openapi::api::core::v1::{CSIVolumeSource, Container, Pod, PodSpec, Volume, VolumeMount};

use crate::error::Denial;
use crate::mutate::mesh::{MeshConfig, OPTED_OUT, annotation, is_managed};
use crate::mutate::pod::{env_value, is_windows};
use crate::mutate::{Denied, Effects, PodCtx, PodMutator};

/// The standard SPIFFE variable: go-spiffe and most Workload API clients read it.
pub const ENV_SOCKET: &str = "SPIFFE_ENDPOINT_SOCKET";
/// Seconds the gate waits for an identity before it exits 1; "0" waits forever.
pub const ENV_TIMEOUT: &str = "GATE_TIMEOUT_SECONDS";

/// Adds init container `<gate.name>` in first position (image, pull policy, command, args,
/// resources and security context from config; env `SPIFFE_ENDPOINT_SOCKET=unix://<socketPath>`
/// and `GATE_TIMEOUT_SECONDS`), the CSI volume `<gate.volume.name>` (driver
/// `<gate.volume.driver>`), and a mount of that volume at `<gate.volume.mountPath>` in the gate
/// container only: app containers never see the identity provider's socket.
///
/// Acts on managed pods unless annotation `<gate.optOutAnnotation>` is `"false"`. An init
/// container named `<gate.name>` anywhere in the list means the pod is already gated and nothing
/// is changed.
pub struct InitGate {
    label: String,
    opt_out_annotation: String,
    container: Container,
    volume: Volume,
}

impl InitGate {
    pub fn new(cfg: &MeshConfig) -> Self {
        let g = &cfg.gate;
        let v = &g.volume;
        let container = Container {
            name: g.name.clone(),
            image: Some(g.image.clone()),
            image_pull_policy: Some(g.image_pull_policy.clone()),
            command: Some(g.command.clone()),
            args: (!g.args.is_empty()).then(|| g.args.clone()),
            env: Some(vec![
                env_value(ENV_SOCKET, &format!("unix://{}", g.socket_path)),
                env_value(ENV_TIMEOUT, &g.timeout_seconds.to_string()),
            ]),
            resources: Some(g.resources.clone()),
            security_context: g.security_context.clone(),
            volume_mounts: Some(vec![VolumeMount {
                name: v.name.clone(),
                mount_path: v.mount_path.clone(),
                read_only: Some(v.read_only),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let volume = Volume {
            name: v.name.clone(),
            csi: Some(CSIVolumeSource {
                driver: v.driver.clone(),
                read_only: Some(v.read_only),
                volume_attributes: (!v.volume_attributes.is_empty())
                    .then(|| v.volume_attributes.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Self {
            label: cfg.managed_label.clone(),
            opt_out_annotation: g.opt_out_annotation.clone(),
            container,
            volume,
        }
    }
}

/// Puts `gate` first among the init containers and adds `volume` (only `gate` mounts it).
/// Nothing changes when an init container named like `gate` exists. A name already taken by an
/// app container, or a different volume under the gate volume's name, is refused before
/// anything changes: adding ours would make the pod invalid, and renaming theirs is not ours.
pub fn add_gate(
    spec: &mut PodSpec,
    gate: &Container,
    volume: &Volume,
    opt_out: &str,
) -> Result<(), Denial> {
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.iter().any(|c| c.name == gate.name) {
        return Ok(());
    }
    let mut taken = spec
        .containers
        .iter()
        .map(|c| &c.name)
        .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name));
    if taken.any(|name| *name == gate.name) {
        return Err(Denial::bad_request(
            "GateNameTaken",
            format!(
                "container name {:?} is reserved for the identity gate init container: rename the container, or skip the gate with annotation {opt_out}: \"false\"",
                gate.name
            ),
        ));
    }
    let existing = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume.name);
    if existing.is_some_and(|v| v != volume) {
        return Err(Denial::bad_request(
            "GateVolumeTaken",
            format!(
                "volume name {:?} is reserved for the identity gate's CSI volume: rename the pod's volume, or skip the gate with annotation {opt_out}: \"false\"",
                volume.name
            ),
        ));
    }
    if existing.is_none() {
        spec.volumes
            .get_or_insert_with(Vec::new)
            .push(volume.clone());
    }
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .insert(0, gate.clone());
    Ok(())
}

impl PodMutator for InitGate {
    fn id(&self) -> &'static str {
        "init-gate"
    }

    fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        if !is_managed(pod, &self.label)
            || annotation(pod, &self.opt_out_annotation) == Some(OPTED_OUT)
        {
            return Ok(Effects::default());
        }
        if is_windows(pod.spec.as_ref()) {
            // Refused like a taken name: the optional gate (the default) passes the pod by
            // with this as a warning; a required one denies it.
            return Err(Denial::bad_request(
                "GateWindowsPod",
                format!(
                    "the pod runs on Windows (spec.os.name: windows): the identity gate {:?} is a Linux container, which cannot run on a Windows node and whose Linux securityContext the API server refuses in a Windows pod, so the pod is not gated; skip the gate with annotation {}: \"false\" to silence this",
                    self.container.name, self.opt_out_annotation
                ),
            )
            .into());
        }
        if let Some(spec) = pod.spec.as_mut() {
            add_gate(
                spec,
                &self.container,
                &self.volume,
                &self.opt_out_annotation,
            )?;
        }
        Ok(Effects::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::pod::testing::{self, PodBuilder};
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, EphemeralContainer};
    use rstest::rstest;

    const KEY: &str = "aether.io/managed";
    const GATE: &str = "aether-identity-ready";
    const VOL: &str = "aether-identity-gate-spiffe";

    fn cfg() -> MeshConfig {
        serde_json::from_value(serde_json::json!({
            "enabled": true,
            "gate": {"enabled": true, "image": "registry.example/aether/agent:v1", "timeoutSeconds": 120}
        }))
        .unwrap()
    }

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            volume_mounts: Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: "/data".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    /// A managed pod with containers `app` and `proxy` and an emptyDir `data`.
    fn mk_pod() -> PodBuilder {
        testing::mk_pod()
            .label(KEY, "true")
            .app(container("app"))
            .app(container("proxy"))
            .volume(Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            })
    }

    impl PodBuilder {
        fn ephemeral(mut self, name: &str) -> Self {
            self.spec()
                .ephemeral_containers
                .get_or_insert_with(Vec::new)
                .push(EphemeralContainer {
                    name: name.into(),
                    ..Default::default()
                });
            self
        }
    }

    fn run(pod: &mut Pod) -> Result<(), Denial> {
        let ctx = PodCtx {
            namespace: "shop",
            ..PodCtx::test(crate::mutate::Route::ManagedPod)
        };
        let effects = InitGate::new(&cfg())
            .mutate(&ctx, pod)
            .map_err(|d| d.denial)?;
        assert_eq!(effects, Effects::default(), "the gate counts nothing");
        Ok(())
    }

    fn init_names(pod: &Pod) -> Vec<String> {
        let spec = pod.spec.as_ref().unwrap();
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect()
    }

    fn gated_once_and_idempotent(mut pod: Pod) -> Pod {
        run(&mut pod).unwrap();
        let once = pod.clone();
        run(&mut pod).unwrap();
        assert_eq!(pod, once, "second pass changes nothing");
        pod
    }

    #[rstest]
    #[case::no_init_containers(mk_pod(), &[GATE])]
    #[case::gate_goes_before_existing_init_containers(mk_pod().init(container("migrate")).init(container("seed")), &[GATE, "migrate", "seed"])]
    #[case::pod_with_the_gate_first_is_left_alone(mk_pod().init(container(GATE)).init(container("migrate")), &[GATE, "migrate"])]
    #[case::pod_with_the_gate_later_is_left_alone(mk_pod().init(container("migrate")).init(container(GATE)), &["migrate", GATE])]
    fn gate_position(#[case] pod: PodBuilder, #[case] expected: &[&str]) {
        let pod = gated_once_and_idempotent(pod.build());
        assert_eq!(init_names(&pod), expected);
    }

    #[rstest]
    #[case::opted_out_pod_is_untouched(mk_pod().label(KEY, "false"))]
    #[case::unmanaged_pod_is_untouched(mk_pod().label(KEY, "maybe"))]
    #[case::gate_opt_out_annotation(mk_pod().annotation("aether.io/identity-gate", "false"))]
    #[case::opted_out_windows_pod(mk_pod().windows().annotation("aether.io/identity-gate", "false"))]
    fn pods_without_a_gate(#[case] pod: PodBuilder) {
        let before = pod.build();
        let after = gated_once_and_idempotent(before.clone());
        assert_eq!(after, before);
    }

    #[test]
    fn gate_opt_out_needs_exactly_false() {
        let pod = mk_pod()
            .annotation("aether.io/identity-gate", "true")
            .build();
        assert_eq!(init_names(&gated_once_and_idempotent(pod)), [GATE]);
    }

    #[test]
    fn gate_volume_is_not_mounted_into_app_containers() {
        let pod = gated_once_and_idempotent(mk_pod().init(container("migrate")).build());
        let spec = pod.spec.as_ref().unwrap();
        let mounts_gate_volume =
            |c: &Container| c.volume_mounts.iter().flatten().any(|m| m.name == VOL);
        let who: Vec<_> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter(|c| mounts_gate_volume(c))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(who, [GATE]);
        let names: Vec<_> = spec.volumes.iter().flatten().map(|v| &v.name).collect();
        assert_eq!(names, ["data", VOL]);
    }

    #[test]
    fn gate_container_and_volume_come_from_config() {
        let pod = gated_once_and_idempotent(mk_pod().build());
        let spec = pod.spec.unwrap();
        let gate = &spec.init_containers.unwrap()[0];
        let want = serde_json::json!({
            "name": GATE,
            "image": "registry.example/aether/agent:v1",
            "imagePullPolicy": "IfNotPresent",
            "command": ["/identity-ready"],
            "env": [
                {"name": "SPIFFE_ENDPOINT_SOCKET", "value": "unix:///spiffe-workload-api/spire-agent.sock"},
                {"name": "GATE_TIMEOUT_SECONDS", "value": "120"}
            ],
            "resources": {"limits": {"cpu": "50m", "memory": "32Mi"}, "requests": {"cpu": "50m", "memory": "32Mi"}},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": true,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "volumeMounts": [{"name": VOL, "mountPath": "/spiffe-workload-api", "readOnly": true}]
        });
        assert_eq!(serde_json::to_value(gate).unwrap(), want);
        let vol = spec.volumes.unwrap().pop().unwrap();
        assert_eq!(
            serde_json::to_value(vol).unwrap(),
            serde_json::json!({"name": VOL, "csi": {"driver": "csi.spiffe.io", "readOnly": true}})
        );
    }

    #[test]
    fn an_identical_gate_volume_is_reused() {
        let gate = InitGate::new(&cfg());
        let mut pod = mk_pod().volume(gate.volume.clone()).build();
        run(&mut pod).unwrap();
        let vols = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        assert_eq!(vols.iter().filter(|v| v.name == VOL).count(), 1);
        assert_eq!(init_names(&pod), [GATE]);
    }

    #[rstest]
    #[case::gate_name_taken_by_an_app_container(mk_pod().app(container(GATE)), "container name \"aether-identity-ready\" is reserved")]
    #[case::gate_name_taken_by_an_ephemeral_container(mk_pod().ephemeral(GATE), "container name \"aether-identity-ready\" is reserved")]
    #[case::foreign_volume_under_the_gate_volume_name(
        mk_pod().volume(Volume { name: VOL.into(), empty_dir: Some(Default::default()), ..Default::default() }),
        "volume name \"aether-identity-gate-spiffe\" is reserved"
    )]
    #[case::windows_pod(
        mk_pod().windows(),
        "the pod runs on Windows (spec.os.name: windows): the identity gate \"aether-identity-ready\" is a Linux container"
    )]
    fn conflicts_are_refused_without_changes(#[case] pod: PodBuilder, #[case] message: &str) {
        let before = pod.build();
        let mut pod = before.clone();
        let err = run(&mut pod).unwrap_err();
        assert!(err.message.contains(message), "{}", err.message);
        assert!(
            err.message
                .contains("annotation aether.io/identity-gate: \"false\""),
            "{}",
            err.message
        );
        assert_eq!(pod, before);
    }
}
