//! The socket carrier check: the one mesh rule that refuses a pod instead of changing it.
//!
//! The mesh delivers a pod's Unix socket through one CSI volume (the carrier, e.g.
//! `csi.aether.io`); the pod names the socket with an annotation such as
//! `endpoint.aether.io/uds-socket: "<volume>/<file>"`. Some pods can never get their socket, and
//! admitting them would only move the failure to a confusing runtime symptom (a connect that
//! fails forever). Those are denied at admission with every problem and its fix in one message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use crate::error::Denial;
use crate::k8s_names::is_dns_label;
use crate::mutate::mesh::{MeshConfig, annotation, is_managed};
use crate::mutate::pod::is_windows;
use crate::mutate::{Denied, Effects, PodCtx, PodMutator};

/// Longest path `connect(2)`/`bind(2)` accept: `sun_path` is 108 bytes and holds the NUL.
pub use crate::config::mesh::SUN_PATH_MAX;

/// Adds nothing. Denies a managed pod (code 403, reason `SocketUndeliverable`) when:
/// - annotation `<socketCheck.annotation>` is not `<volume>/<file>`;
/// - it names a volume the pod does not declare, or an `emptyDir` (the removed carrier);
/// - no container mounts that volume where the file is visible;
/// - the socket's path in a container that mounts it exceeds 107 bytes;
/// - the pod declares a carrier volume (driver `<socketCheck.carrierDriver>`) without
///   `spec.securityContext.fsGroup`, or more than one carrier volume;
/// - a Windows pod (`spec.os.name: windows`) declares a carrier volume: the carrier needs
///   fsGroup, which the API server refuses in a Windows pod (so it is never told to set it).
///
/// The carrier rules apply with or without the annotation: a carrier volume only exists to
/// deliver a socket.
pub struct SocketCheck {
    label: String,
    annotation: String,
    carrier_driver: String,
}

impl SocketCheck {
    pub fn new(cfg: &MeshConfig) -> Self {
        Self {
            label: cfg.managed_label.clone(),
            annotation: cfg.socket_check.annotation.clone(),
            carrier_driver: cfg.socket_check.carrier_driver.clone(),
        }
    }
}

/// `<volume>/<file>` split into its parts, or why the value is not of that form.
pub fn parse_socket_annotation<'a>(
    key: &str,
    value: &'a str,
) -> Result<(&'a str, &'a str), String> {
    let bad = || {
        format!(
            "annotation {key}: expected \"<volume>/<file>\" (a volume of this pod and the socket's path inside it, e.g. \"mesh-socket/app.sock\"), got {value:?}: fix the annotation"
        )
    };
    let (volume, file) = value.split_once('/').ok_or_else(bad)?;
    let file_ok = !file.is_empty()
        && !file.contains('\0')
        && file
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !is_dns_label(volume) || !file_ok {
        return Err(bad());
    }
    Ok((volume, file))
}

/// Where `file` of volume `volume` appears in each container that mounts it where the file is
/// visible (`None` when a `subPathExpr` makes the path unknowable at admission). Init
/// containers come first, as the kubelet starts them.
pub fn socket_paths(spec: &PodSpec, volume: &str, file: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let containers = (spec.init_containers.iter().flatten()).chain(&spec.containers);
    for c in containers {
        for m in (c.volume_mounts.iter().flatten()).filter(|m| m.name == volume) {
            let dir = m.mount_path.trim_end_matches('/');
            let path = if m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
                None
            } else {
                // As the kubelet resolves it: `./sub`, `sub/` and `sub//dir` name `sub` and
                // `sub/dir` (the API server refuses `..` in a subPath).
                let sub = m.sub_path.as_deref().map(|s| {
                    s.split('/')
                        .filter(|c| !c.is_empty() && *c != ".")
                        .collect::<Vec<_>>()
                        .join("/")
                });
                match sub.as_deref().filter(|s| !s.is_empty()) {
                    None => Some(format!("{dir}/{file}")),
                    // The file itself is mounted: at the mount path, as the kernel reads it.
                    Some(sub) if file == sub => Some(if dir.is_empty() { "/" } else { dir }.into()),
                    Some(sub) => match file.strip_prefix(sub).and_then(|r| r.strip_prefix('/')) {
                        Some(rest) => Some(format!("{dir}/{rest}")),
                        // This mount shows another part of the volume.
                        None => continue,
                    },
                }
            };
            out.push((c.name.clone(), path));
        }
    }
    out
}

/// Every reason the pod's socket can never be delivered, each followed by its fix. Empty when
/// the pod is fine. `declared` is the annotation's value, if the pod has one.
pub fn socket_problems(
    spec: &PodSpec,
    annotation_key: &str,
    declared: Option<&str>,
    carrier_driver: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    if let Some(value) = declared {
        match parse_socket_annotation(annotation_key, value) {
            Err(problem) => problems.push(problem),
            Ok((name, file)) => match volumes.iter().find(|v| v.name == name) {
                None => problems.push(format!(
                    "annotation {annotation_key} names volume {name:?}, which the pod does not declare: add a volume {name:?} with csi.driver {carrier_driver}"
                )),
                Some(v) if v.empty_dir.is_some() => problems.push(format!(
                    "volume {name:?} is an emptyDir, which no longer carries mesh sockets (the emptyDir carrier was removed): declare {name:?} as a CSI volume with driver {carrier_driver} instead"
                )),
                Some(_) => {
                    let paths = socket_paths(spec, name, file);
                    if paths.is_empty() {
                        problems.push(format!(
                            "no container mounts volume {name:?} where {file:?} is visible, so no process can reach the socket: mount {name:?} in the container that uses the socket"
                        ));
                    }
                    let mut too_long: BTreeMap<String, Vec<String>> = BTreeMap::new();
                    for (container, path) in paths {
                        if let Some(path) = path.filter(|p| p.len() > SUN_PATH_MAX) {
                            too_long.entry(path).or_default().push(container);
                        }
                    }
                    for (path, containers) in too_long {
                        problems.push(format!(
                            "socket path {path:?} in container {} is {} bytes, over the AF_UNIX limit of {SUN_PATH_MAX} (sun_path holds 108 bytes including the terminating NUL): mount volume {name:?} at a shorter path or shorten the file name",
                            containers.join(", "),
                            path.len()
                        ));
                    }
                }
            },
        }
    }
    let carriers: Vec<&str> = volumes
        .iter()
        .filter(|v| v.csi.as_ref().is_some_and(|c| c.driver == carrier_driver))
        .map(|v| v.name.as_str())
        .collect();
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    if !carriers.is_empty() && is_windows(Some(spec)) {
        // fsGroup is Linux-only: the API server refuses it in a Windows pod.
        problems.push(format!(
            "volume {:?} uses {carrier_driver}, which needs spec.securityContext.fsGroup to make the socket accessible to the app, and the pod runs on Windows (spec.os.name: windows), where the API server refuses fsGroup: a Windows pod cannot receive a mesh socket; remove the {carrier_driver} volume (and annotation {annotation_key}), or run the app in a Linux pod",
            carriers[0]
        ));
    } else if !carriers.is_empty() && fs_group.is_none() {
        problems.push(format!(
            "volume {:?} uses {carrier_driver} but the pod sets no spec.securityContext.fsGroup, which the driver needs to make the socket accessible to the app: set spec.securityContext.fsGroup (e.g. to the app's group id)",
            carriers[0]
        ));
    }
    if carriers.len() > 1 {
        problems.push(format!(
            "the pod declares {} {carrier_driver} volumes ({}), and a pod receives its socket through exactly one: keep one carrier volume and point {annotation_key} at it",
            carriers.len(),
            carriers.join(", ")
        ));
    }
    problems
}

impl PodMutator for SocketCheck {
    fn id(&self) -> &'static str {
        "socket-check"
    }

    fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        let Some(spec) = pod.spec.as_ref().filter(|_| is_managed(pod, &self.label)) else {
            return Ok(Effects::default());
        };
        let declared = annotation(pod, &self.annotation);
        let problems = socket_problems(spec, &self.annotation, declared, &self.carrier_driver);
        if problems.is_empty() {
            return Ok(Effects::default());
        }
        let count = match problems.len() {
            1 => "1 problem".to_owned(),
            n => format!("{n} problems"),
        };
        Err(Denial::forbidden(
            "SocketUndeliverable",
            format!(
                "the pod's Unix socket can never be delivered ({count}): {}",
                problems.join("; ")
            ),
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::pod::testing::{self, PodBuilder};
    use k8s_openapi::api::core::v1::{
        CSIVolumeSource, Container, EmptyDirVolumeSource, HostPathVolumeSource, PodSecurityContext,
        Volume, VolumeMount,
    };
    use rstest::rstest;

    const KEY: &str = "aether.io/managed";
    const ANN: &str = "endpoint.aether.io/uds-socket";

    /// A managed pod with one carrier volume `mesh-socket` mounted at /run/mesh in `app`, fsGroup
    /// set and the socket declared: the pod the check admits.
    fn mk_pod() -> PodBuilder {
        testing::mk_pod()
            .label(KEY, "true")
            .annotation(ANN, "mesh-socket/app.sock")
            .app(Container {
                name: "app".into(),
                image: Some("app".into()),
                volume_mounts: Some(vec![mount("mesh-socket", "/run/mesh")]),
                ..Default::default()
            })
            .volume(carrier("mesh-socket"))
            .with_spec(|s| {
                s.security_context = Some(PodSecurityContext {
                    fs_group: Some(1000),
                    ..Default::default()
                })
            })
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    fn carrier(name: &str) -> Volume {
        Volume {
            name: name.into(),
            csi: Some(CSIVolumeSource {
                driver: "csi.aether.io".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    impl PodBuilder {
        fn managed(self, v: &str) -> Self {
            self.label(KEY, v)
        }
        fn socket(self, v: &str) -> Self {
            self.annotation(ANN, v)
        }
        fn no_socket(mut self) -> Self {
            self.0.metadata.annotations = None;
            self
        }
        fn volumes(mut self, v: Vec<Volume>) -> Self {
            self.spec().volumes = Some(v);
            self
        }
        fn app_mounts(mut self, m: Vec<VolumeMount>) -> Self {
            self.spec().containers[0].volume_mounts = Some(m);
            self
        }
        fn no_fs_group(mut self) -> Self {
            self.spec().security_context = None;
            self
        }
    }

    fn run(pod: &mut Pod) -> Result<(), Denial> {
        let ctx = PodCtx {
            namespace: "shop",
            ..PodCtx::test(crate::mutate::Route::ManagedPod)
        };
        let effects = SocketCheck::new(&MeshConfig::default())
            .mutate(&ctx, pod)
            .map_err(|d| d.denial)?;
        assert_eq!(effects, Effects::default(), "the check counts nothing");
        Ok(())
    }

    /// Runs the check twice: same answer, pod never changed.
    fn check(pod: Pod) -> Result<(), Denial> {
        let mut p = pod.clone();
        let first = run(&mut p);
        assert_eq!(p, pod, "the check never changes the pod");
        assert_eq!(run(&mut p), first, "second pass gives the same answer");
        first
    }

    fn long_dir() -> String {
        // "/" + dir + "/app.sock" = 107 bytes exactly.
        format!("/{}", "d".repeat(107 - 1 - "/app.sock".len()))
    }

    #[rstest]
    #[case::carrier_with_fs_group_is_admitted(mk_pod())]
    #[case::pod_without_socket_or_carrier_is_admitted(mk_pod().no_socket().volumes(vec![]).app_mounts(vec![]).no_fs_group())]
    #[case::carrier_without_annotation_but_with_fs_group_is_admitted(mk_pod().no_socket())]
    #[case::path_of_exactly_107_bytes_is_admitted(mk_pod().app_mounts(vec![mount("mesh-socket", &long_dir())]))]
    #[case::host_path_volume_is_admitted(mk_pod().volumes(vec![Volume { name: "mesh-socket".into(), host_path: Some(HostPathVolumeSource { path: "/run/aether".into(), type_: None }), ..Default::default() }]))]
    #[case::socket_in_a_sub_directory(mk_pod().socket("mesh-socket/sockets/app.sock"))]
    #[case::sub_path_mount_showing_the_socket(mk_pod().socket("mesh-socket/sockets/app.sock").app_mounts(vec![VolumeMount { sub_path: Some("sockets".into()), ..mount("mesh-socket", "/s") }]))]
    #[case::opted_out_pod_is_not_checked(mk_pod().managed("false").socket("scratch/app.sock"))]
    #[case::unmanaged_pod_is_not_checked(mk_pod().managed("").no_fs_group())]
    fn admitted(#[case] pod: PodBuilder) {
        assert_eq!(check(pod.build()), Ok(()));
    }

    #[rstest]
    #[case::malformed_annotation(
        mk_pod().socket("app.sock"),
        &["annotation endpoint.aether.io/uds-socket: expected \"<volume>/<file>\"", "got \"app.sock\""]
    )]
    #[case::dotdot_in_the_file(mk_pod().socket("mesh-socket/../etc/passwd"), &["expected \"<volume>/<file>\""])]
    #[case::undeclared_volume_is_denied(
        mk_pod().socket("mesh/app.sock"),
        &["names volume \"mesh\", which the pod does not declare: add a volume \"mesh\" with csi.driver csi.aether.io"]
    )]
    #[case::empty_dir_volume_is_denied(
        mk_pod().volumes(vec![Volume { name: "mesh-socket".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }]),
        &["volume \"mesh-socket\" is an emptyDir", "the emptyDir carrier was removed", "declare \"mesh-socket\" as a CSI volume with driver csi.aether.io"]
    )]
    #[case::path_of_108_bytes_is_denied(
        mk_pod().app_mounts(vec![mount("mesh-socket", &format!("{}d", long_dir()))]),
        &["in container app is 108 bytes, over the AF_UNIX limit of 107", "mount volume \"mesh-socket\" at a shorter path"]
    )]
    #[case::unmounted_volume_is_denied(
        mk_pod().app_mounts(vec![]),
        &["no container mounts volume \"mesh-socket\" where \"app.sock\" is visible"]
    )]
    #[case::sub_path_hiding_the_socket_is_denied(
        mk_pod().app_mounts(vec![VolumeMount { sub_path: Some("other".into()), ..mount("mesh-socket", "/s") }]),
        &["no container mounts volume \"mesh-socket\""]
    )]
    #[case::carrier_without_fs_group_is_denied(
        mk_pod().no_fs_group(),
        &["volume \"mesh-socket\" uses csi.aether.io but the pod sets no spec.securityContext.fsGroup", "set spec.securityContext.fsGroup"]
    )]
    #[case::carrier_without_annotation_still_needs_fs_group(mk_pod().no_socket().no_fs_group(), &["no spec.securityContext.fsGroup"])]
    #[case::windows_pod_is_not_told_to_set_fs_group(
        mk_pod().no_fs_group().windows(),
        &["the pod runs on Windows (spec.os.name: windows), where the API server refuses fsGroup: a Windows pod cannot receive a mesh socket", "remove the csi.aether.io volume"]
    )]
    #[case::windows_pod_with_fs_group_is_denied_alike(mk_pod().windows(), &["a Windows pod cannot receive a mesh socket"])]
    #[case::two_carrier_volumes_are_denied(
        mk_pod().volumes(vec![carrier("mesh-socket"), carrier("mesh-socket-2")]),
        &["the pod declares 2 csi.aether.io volumes (mesh-socket, mesh-socket-2)", "keep one carrier volume"]
    )]
    fn denied(#[case] pod: PodBuilder, #[case] fragments: &[&str]) {
        let err = check(pod.build()).unwrap_err();
        // A Windows pod cannot set fsGroup: it is never told to.
        if fragments.iter().any(|f| f.contains("Windows")) {
            assert!(
                !err.message.contains("set spec.securityContext.fsGroup"),
                "{}",
                err.message
            );
        }
        assert_eq!((err.code, err.reason), (403, "SocketUndeliverable"));
        assert!(
            err.message
                .starts_with("the pod's Unix socket can never be delivered (1 problem): "),
            "{}",
            err.message
        );
        for f in fragments {
            assert!(err.message.contains(f), "{:?} lacks {f:?}", err.message);
        }
    }

    #[test]
    fn every_problem_is_named_in_one_message() {
        let pod = mk_pod()
            .volumes(vec![carrier("mesh-socket"), carrier("other")])
            .app_mounts(vec![mount("mesh-socket", &format!("{}/x", long_dir()))])
            .no_fs_group()
            .build();
        let err = check(pod).unwrap_err();
        assert!(
            err.message
                .starts_with("the pod's Unix socket can never be delivered (3 problems): "),
            "{}",
            err.message
        );
        for f in [
            "over the AF_UNIX limit",
            "fsGroup",
            "2 csi.aether.io volumes",
        ] {
            assert!(err.message.contains(f), "{:?} lacks {f:?}", err.message);
        }
    }

    #[test]
    fn long_paths_are_grouped_by_path() {
        let mut pod = mk_pod()
            .app_mounts(vec![mount("mesh-socket", &format!("{}/x", long_dir()))])
            .build();
        let spec = pod.spec.as_mut().unwrap();
        let mut sidecar = spec.containers[0].clone();
        sidecar.name = "sidecar".into();
        spec.init_containers = Some(vec![sidecar]);
        let err = check(pod).unwrap_err();
        assert!(
            err.message
                .contains("in container sidecar, app is 109 bytes"),
            "{}",
            err.message
        );
    }

    #[rstest]
    #[case::plain("/run/mesh", None, "app.sock", Some("/run/mesh/app.sock"))]
    #[case::trailing_slash("/run/mesh/", None, "app.sock", Some("/run/mesh/app.sock"))]
    #[case::root("/", None, "app.sock", Some("/app.sock"))]
    #[case::sub_path_is_the_file(
        "/run/app.sock",
        Some("app.sock"),
        "app.sock",
        Some("/run/app.sock")
    )]
    #[case::sub_path_is_the_file_under_a_trailing_slash(
        "/run/app.sock/",
        Some("app.sock"),
        "app.sock",
        Some("/run/app.sock")
    )]
    #[case::sub_path_directory("/s", Some("sockets/"), "sockets/app.sock", Some("/s/app.sock"))]
    #[case::sub_path_with_a_dot("/s", Some("./sockets"), "sockets/app.sock", Some("/s/app.sock"))]
    #[case::sub_path_with_doubled_slashes(
        "/s",
        Some("a//./b"),
        "a/b/app.sock",
        Some("/s/app.sock")
    )]
    fn in_container_path(
        #[case] mount_path: &str,
        #[case] sub_path: Option<&str>,
        #[case] file: &str,
        #[case] expected: Option<&str>,
    ) {
        let mut pod = mk_pod()
            .app_mounts(vec![VolumeMount {
                sub_path: sub_path.map(Into::into),
                ..mount("mesh-socket", mount_path)
            }])
            .build();
        let spec = pod.spec.take().unwrap();
        assert_eq!(
            socket_paths(&spec, "mesh-socket", file),
            [("app".to_owned(), expected.map(Into::into))]
        );
    }

    #[test]
    fn sub_path_expr_makes_the_path_unknown_but_mounted() {
        let pod = mk_pod()
            .app_mounts(vec![VolumeMount {
                sub_path_expr: Some("$(POD_NAME)".into()),
                ..mount("mesh-socket", &long_dir())
            }])
            .build();
        assert_eq!(check(pod), Ok(()));
    }
}
