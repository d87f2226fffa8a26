//! Pod-editing helpers shared by mutators: upserts by name that keep order, so that running a
//! mutator twice changes nothing.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PodSpec, SecurityContext, Volume, VolumeMount,
};

/// Whether the pod says it runs on Windows (`spec.os.name: windows`). The API server then
/// refuses Linux-only fields (a container's `seccompProfile`, `allowPrivilegeEscalation`,
/// `capabilities`, `readOnlyRootFilesystem`, `runAsGroup`..., the pod's `fsGroup`...), and the
/// Linux containers podmutator adds could not run on the node anyway.
pub fn is_windows(spec: Option<&PodSpec>) -> bool {
    spec.and_then(|s| s.os.as_ref())
        .is_some_and(|os| os.name == "windows")
}

/// Every container and init container (never ephemeral ones), except init containers named in
/// `skip` (those other mutators own, such as the mesh gate). An app container is never skipped,
/// whatever its name.
pub fn containers_mut<'a>(
    spec: &'a mut PodSpec,
    skip: &'a [String],
) -> impl Iterator<Item = &'a mut Container> + 'a {
    spec.containers.iter_mut().chain(
        spec.init_containers
            .iter_mut()
            .flatten()
            .filter(move |c| !skip.contains(&c.name)),
    )
}

/// Puts `block` first, in its order, replacing same-name variables; every other variable keeps
/// its relative order. User variables can then reference injected ones with `$(NAME)`.
pub fn put_env_first(env: &mut Option<Vec<EnvVar>>, block: &[EnvVar]) {
    put_env_first_named(env, block, &names_of(block));
}

/// The names of `block`, for [`put_env_first_named`]: built once for a block that goes into
/// every container. A set, not a scan of `block` per variable: both lists can be long (the
/// pod's own env and one variable per secret request).
pub fn names_of(block: &[EnvVar]) -> HashSet<&str> {
    block.iter().map(|b| b.name.as_str()).collect()
}

/// [`put_env_first`] with the names of `block` already collected ([`names_of`]).
pub fn put_env_first_named(env: &mut Option<Vec<EnvVar>>, block: &[EnvVar], ours: &HashSet<&str>) {
    if block.is_empty() {
        return;
    }
    let old = env.take().unwrap_or_default();
    let mut merged = Vec::with_capacity(block.len() + old.len());
    merged.extend_from_slice(block);
    // The API server stores an empty value as no value (Go's `omitempty`): the variable it
    // gives back is ours, and writing `""` again would patch it on every later pass.
    for b in merged
        .iter_mut()
        .filter(|b| b.value.as_deref() == Some("") && b.value_from.is_none())
    {
        if old
            .iter()
            .any(|o| o.name == b.name && o.value.is_none() && o.value_from.is_none())
        {
            b.value = None;
        }
    }
    merged.extend(old.into_iter().filter(|e| !ours.contains(e.name.as_str())));
    *env = Some(merged);
}

/// Whether mount path `path` is `dir` or lies below it (a trailing `/` on either ignored).
pub fn is_under(path: &str, dir: &str) -> bool {
    let (path, dir) = (path.trim_end_matches('/'), dir.trim_end_matches('/'));
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Appends, in order, each of `more` whose name `env` does not already hold.
pub fn add_missing_env(env: &mut Option<Vec<EnvVar>>, more: impl IntoIterator<Item = EnvVar>) {
    let env = env.get_or_insert_with(Vec::new);
    let missing: Vec<EnvVar> = more
        .into_iter()
        .filter(|e| env.iter().all(|h| h.name != e.name))
        .collect();
    env.extend(missing);
}

/// Appends each mount whose volume is not mounted yet (Flyte compares names, not paths).
pub fn add_mounts(mounts: &mut Option<Vec<VolumeMount>>, new: &[VolumeMount]) {
    if new.is_empty() {
        return;
    }
    let list = mounts.get_or_insert_with(Vec::new);
    if list.len().saturating_mul(new.len()) <= 64 {
        // The usual case: a mount or two into a short list, where a set costs more than a scan.
        for m in new {
            if !list.iter().any(|x| x.name == m.name) {
                list.push(m.clone());
            }
        }
        return;
    }
    let mut names: HashSet<String> = list.iter().map(|x| x.name.clone()).collect();
    for m in new {
        if names.insert(m.name.clone()) {
            list.push(m.clone());
        }
    }
}

/// Appends `v` unless a volume of that name exists.
pub fn add_volume(volumes: &mut Option<Vec<Volume>>, v: Volume) {
    let list = volumes.get_or_insert_with(Vec::new);
    if !list.iter().any(|x| x.name == v.name) {
        list.push(v);
    }
}

/// An in-memory `emptyDir` volume named `name`.
pub fn memory_volume(name: impl Into<String>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A mount of the volume `name` at `path`.
pub fn mount(name: impl Into<String>, path: impl Into<String>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// A read-only mount of the volume `name` at `path`.
pub fn ro_mount(name: impl Into<String>, path: impl Into<String>) -> VolumeMount {
    VolumeMount {
        read_only: Some(true),
        ..mount(name, path)
    }
}

/// Whether `theirs` is `ours` with only restrictions added, as policy engines default a
/// container's security context (Kyverno, Gatekeeper, the `restricted` Pod Security profile):
/// no privilege or escalation, non-root, a read-only root, the runtime's default seccomp or
/// AppArmor profile, more capabilities dropped. Anything else that differs (another user, a
/// `Localhost` profile, which may allow more than the pod's), or a setting of ours it changes,
/// is not ours.
pub fn only_tightens(theirs: Option<&SecurityContext>, ours: Option<&SecurityContext>) -> bool {
    let mut t = theirs.cloned().unwrap_or_default();
    let o = ours.cloned().unwrap_or_default();
    fn forgive<T: PartialEq>(t: &mut Option<T>, o: &Option<T>, tighter: impl Fn(&T) -> bool) {
        if o.is_none() && t.as_ref().is_some_and(tighter) {
            *t = None;
        }
    }
    forgive(&mut t.privileged, &o.privileged, |v| !v);
    forgive(
        &mut t.allow_privilege_escalation,
        &o.allow_privilege_escalation,
        |v| !v,
    );
    forgive(
        &mut t.read_only_root_filesystem,
        &o.read_only_root_filesystem,
        |v| *v,
    );
    forgive(&mut t.run_as_non_root, &o.run_as_non_root, |v| *v);
    forgive(&mut t.seccomp_profile, &o.seccomp_profile, |p| {
        p.type_ == "RuntimeDefault"
    });
    forgive(&mut t.app_armor_profile, &o.app_armor_profile, |p| {
        p.type_ == "RuntimeDefault"
    });
    let list = |l: &Option<Vec<String>>| l.clone().unwrap_or_default();
    let (tc, oc) = (
        t.capabilities.clone().unwrap_or_default(),
        o.capabilities.clone().unwrap_or_default(),
    );
    let dropped = list(&tc.drop);
    let drops_more =
        dropped.iter().any(|d| d == "ALL") || list(&oc.drop).iter().all(|d| dropped.contains(d));
    if list(&tc.add) == list(&oc.add) && drops_more {
        t.capabilities = o.capabilities.clone();
    }
    t == o
}

pub fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(env: &Option<Vec<EnvVar>>) -> Vec<String> {
        env.iter()
            .flatten()
            .map(|e| format!("{}={}", e.name, e.value.as_deref().unwrap_or("")))
            .collect()
    }

    #[test]
    fn injected_vars_go_first_and_replace_same_name() {
        let mut env = Some(vec![
            env_value("A", "1"),
            env_value("X", "user"),
            env_value("B", "2"),
        ]);
        put_env_first(&mut env, &[env_value("X", "ours"), env_value("P", "p")]);
        assert_eq!(names(&env), ["X=ours", "P=p", "A=1", "B=2"]);
        let once = env.clone();
        put_env_first(&mut env, &[env_value("X", "ours"), env_value("P", "p")]);
        assert_eq!(env, once, "second pass changes nothing");
    }

    #[test]
    fn an_empty_value_the_api_server_gave_back_without_value_is_kept_as_it_is() {
        let block = [env_value("PREFIX", ""), env_value("DIR", "/d")];
        let mut env = None;
        put_env_first(&mut env, &block);
        assert_eq!(env.as_ref().unwrap()[0], env_value("PREFIX", ""));
        // Stored: `{"name": "PREFIX"}`.
        env.as_mut().unwrap()[0].value = None;
        let stored = env.clone();
        put_env_first(&mut env, &block);
        assert_eq!(env, stored, "second pass changes nothing");
        // A variable of the pod's own under that name, taken from elsewhere, is still ours.
        let mut env = Some(vec![EnvVar {
            name: "PREFIX".into(),
            value: None,
            value_from: Some(Default::default()),
        }]);
        put_env_first(&mut env, &block);
        assert_eq!(env.unwrap()[0], env_value("PREFIX", ""));
    }

    #[test]
    fn a_security_context_that_only_adds_restrictions_only_tightens() {
        use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile};
        let restricted = SecurityContext {
            allow_privilege_escalation: Some(false),
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        };
        assert!(only_tightens(None, None));
        assert!(only_tightens(Some(&restricted), None));
        let ours = SecurityContext {
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["NET_RAW".into()]),
                add: None,
            }),
            ..Default::default()
        };
        let both = SecurityContext {
            read_only_root_filesystem: Some(true),
            ..restricted.clone()
        };
        assert!(only_tightens(Some(&both), Some(&ours)), "drops ALL");
        for loosened in [
            SecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            },
            SecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "Localhost".into(),
                    localhost_profile: Some("profiles/log-only.json".into()),
                }),
                ..Default::default()
            },
            SecurityContext {
                privileged: Some(true),
                ..Default::default()
            },
            SecurityContext {
                allow_privilege_escalation: Some(true),
                ..Default::default()
            },
            SecurityContext {
                run_as_user: Some(0),
                ..Default::default()
            },
            SecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "Unconfined".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            SecurityContext {
                capabilities: Some(Capabilities {
                    add: Some(vec!["SYS_ADMIN".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            },
        ] {
            assert!(!only_tightens(Some(&loosened), None), "{loosened:?}");
        }
        // A setting of ours changed, even to something tighter, is not ours.
        let ours = SecurityContext {
            run_as_user: Some(1000),
            ..Default::default()
        };
        let changed = SecurityContext {
            run_as_user: Some(2000),
            ..Default::default()
        };
        assert!(!only_tightens(Some(&changed), Some(&ours)));
        // Dropping less than ours drops is not ours.
        let theirs = SecurityContext {
            read_only_root_filesystem: Some(true),
            capabilities: None,
            ..Default::default()
        };
        let ours = SecurityContext {
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        };
        assert!(!only_tightens(Some(&theirs), Some(&ours)));
    }

    #[test]
    fn nothing_to_add_leaves_an_absent_list_absent() {
        let mut env = None;
        put_env_first(&mut env, &[]);
        assert_eq!(env, None);
    }

    #[test]
    fn mounts_are_deduplicated_by_name() {
        let m = |n: &str, p: &str| VolumeMount {
            name: n.into(),
            mount_path: p.into(),
            ..Default::default()
        };
        let mut mounts = Some(vec![m("v", "/tmp")]);
        add_mounts(&mut mounts, &[m("v", "/etc/flyte/secrets"), m("w", "/w")]);
        let paths: Vec<_> = mounts.unwrap().into_iter().map(|m| m.mount_path).collect();
        assert_eq!(paths, ["/tmp", "/w"]);
    }
}

/// The one pod builder of the unit tests: `mk_pod().label(K, V).annotation(K, V).build()`.
#[cfg(test)]
pub(crate) mod testing {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A pod under construction; tests add what their case needs.
    #[derive(Debug, Clone)]
    pub struct PodBuilder(pub Pod);

    /// Pod `p` with no spec: add containers, volumes or a spec as the case needs.
    pub fn mk_pod() -> PodBuilder {
        PodBuilder(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    impl PodBuilder {
        pub fn label(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(k.into(), v.into());
            self
        }

        pub fn labels(self, pairs: &[(&str, &str)]) -> Self {
            pairs.iter().fold(self, |b, (k, v)| b.label(k, v))
        }

        pub fn annotation(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(k.into(), v.into());
            self
        }

        /// The spec, created empty on first use.
        pub fn spec(&mut self) -> &mut PodSpec {
            self.0.spec.get_or_insert_with(Default::default)
        }

        pub fn with_spec(mut self, f: impl FnOnce(&mut PodSpec)) -> Self {
            f(self.spec());
            self
        }

        /// `spec.os.name: windows`.
        pub fn windows(mut self) -> Self {
            self.spec().os = Some(k8s_openapi::api::core::v1::PodOS {
                name: "windows".into(),
            });
            self
        }

        pub fn app(mut self, c: Container) -> Self {
            self.spec().containers.push(c);
            self
        }

        pub fn init(mut self, c: Container) -> Self {
            self.spec()
                .init_containers
                .get_or_insert_with(Vec::new)
                .push(c);
            self
        }

        pub fn volume(mut self, v: Volume) -> Self {
            self.spec().volumes.get_or_insert_with(Vec::new).push(v);
            self
        }

        pub fn build(self) -> Pod {
            self.0
        }
    }
}
