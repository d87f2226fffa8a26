//! The `K8s` manager: references a Kubernetes Secret named after the group.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, KeyToPath, Pod, PodSpec, SecretKeySelector, SecretVolumeSource, Volume,
};
use md5::{Digest, Md5};
use sha2::Sha256;

use super::codec::{MountRequirement, encode_base32};
use super::refusal::Refusal;
use super::{
    Accept, ENV_ENV_PREFIX, Edits, SECRETS_DIR, SecretInjector, SecretRequest, flyte_env_name,
};
use crate::config::SecretManagerType;
use crate::mutate::PodCtx;
use crate::mutate::pod::{env_value, ro_mount};

/// Injects a Kubernetes Secret (name = group, or md5(key) when the group is empty, as Flyte v2's
/// secret service names them):
/// - ENV_VAR: `<PREFIX><GROUP>_<KEY>` (upper-cased) from `secretKeyRef {group, key, optional}`,
///   plus `<env_var>` with the same reference when set, and `FLYTE_SECRETS_ENV_PREFIX`;
/// - ANY/FILE: volume `base32(group_groupversion)` with item `key -> lower(key)`, mounted
///   read-only at `/etc/flyte/secrets/<lower(group)>` in every container, plus
///   `<env_var>=<file path>` when set and `FLYTE_SECRETS_FILE_PREFIX`/`FLYTE_SECRETS_DEFAULT_DIR`.
///
/// It never checks that the Secret exists (the references are optional), so it accepts every
/// request that has a key: managers listed after it only see keyless requests.
pub struct K8sInjector {
    pub env_prefix: String,
}

impl SecretInjector for K8sInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::K8s
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, _: &Pod) -> Result<Accept, Refusal> {
        let s = &req.secret;
        if s.key.is_empty() {
            return Err(Refusal::MissingField(
                "k8s Secrets Webhook require key to be set".into(),
            ));
        }
        if !s.env_var.is_empty() {
            super::check_env_name(&s.env_var)?;
        }
        match s.mount_requirement {
            MountRequirement::Unknown(n) => return Err(Refusal::UnknownMount(n)),
            MountRequirement::EnvVar => {
                super::check_env_name(&flyte_env_name(&self.env_prefix, &secret_group(s), &s.key))?;
            }
            // A Secret key is a file name ([`super::names::k8s`]): no `/`, `.` or `..`.
            MountRequirement::Any | MountRequirement::File => {}
        }
        super::names::k8s(s)?;
        Ok(Accept::Now)
    }

    fn inject(
        &self,
        req: &SecretRequest,
        _ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let s = &req.secret;
        let group = secret_group(s);
        match s.mount_requirement {
            MountRequirement::EnvVar => {
                let source = EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: group.clone(),
                        key: s.key.clone(),
                        optional: Some(true),
                    }),
                    ..Default::default()
                };
                let by_ref = |name, source| EnvVar {
                    name,
                    value: None,
                    value_from: Some(source),
                };
                edits.env(env_value(ENV_ENV_PREFIX, &self.env_prefix));
                if !s.env_var.is_empty() {
                    edits.env(by_ref(s.env_var.clone(), source.clone()));
                }
                let name = flyte_env_name(&self.env_prefix, &group, &s.key);
                edits.env(by_ref(name, source));
            }
            MountRequirement::Any | MountRequirement::File => {
                let dir = format!("{SECRETS_DIR}/{}", group.to_lowercase());
                let file = s.key.to_lowercase();
                let volume = add_secret_item(
                    pod,
                    &mut edits.secret_volumes,
                    &group,
                    &s.group_version,
                    &s.key,
                    &file,
                )?;
                edits.mount(ro_mount(volume.clone(), dir.clone()));
                let source = format!("{group}/{}", s.key);
                edits.file_secret(&s.env_var, format!("{dir}/{file}"), volume, source);
            }
            MountRequirement::Unknown(n) => return Err(Refusal::UnknownMount(n)),
        }
        Ok(())
    }
}

/// The Kubernetes Secret a request reads: its group, or Flyte's MD5 of the key without one.
fn secret_group(s: &super::codec::Secret) -> String {
    if s.group.is_empty() {
        hex::encode(Md5::digest(s.key.as_bytes()))
    } else {
        s.group.clone()
    }
}

/// The pod's volumes by name, the volume this admission puts each Secret's files in, and, for
/// each volume the K8s manager adds to, its items by path and by key, kept for one admission in
/// [`Edits`]: a pod's file requests are then added in O(n), where a scan of the volumes and of
/// their items per request made 1,000 file secrets of one Secret quadratic. While a pod's
/// secrets are injected, volumes and items are only ever appended, so the index catches up with
/// what others appended by reading the new tail only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecretVolumes {
    /// The pod's volumes by name.
    by_name: Positions,
    /// Secret name -> position of the volume this admission's file requests of it go to.
    by_secret: HashMap<String, usize>,
    /// Volume position -> its items by path, indexed once the K8s manager adds to that volume.
    items: HashMap<usize, Positions>,
}

/// The positions of a list's elements by a name of theirs, in order, for the first `seen`
/// elements.
#[derive(Debug, Clone, Default, PartialEq)]
struct Positions {
    seen: usize,
    by: HashMap<String, Vec<usize>>,
}

impl Positions {
    /// Indexes what was appended to `list` since the last call, under `name`; starts over,
    /// and says so, if the list shrank.
    fn catch_up<T>(&mut self, list: &[T], name: impl Fn(&T) -> &String) -> bool {
        let shrank = list.len() < self.seen;
        if shrank {
            *self = Self::default();
        }
        for (i, x) in list.iter().enumerate().skip(self.seen) {
            self.by.entry(name(x).clone()).or_default().push(i);
        }
        self.seen = list.len();
        shrank
    }
}

/// Adds `key -> path` to the volume for Secret `group` (creating it if needed) and returns that
/// volume's name: Flyte's `base32(group_groupversion)`, or the volume an earlier request of this
/// admission put the same Secret's files in. Unlike Flyte, an item already present is not added
/// twice, the mount always names the volume that really holds the item, and a volume of the
/// pod's own for the same Secret is left as it is: Flyte added the item to it (so a volume that
/// projected every key then projected that one alone) and mounted a volume that did not exist.
/// A volume under that name is taken as the webhook's own (from an earlier admission) only if
/// [`check_ours`] finds nothing against it; any other is the pod's, and refused rather than
/// changed.
fn add_secret_item(
    pod: &mut Pod,
    index: &mut SecretVolumes,
    group: &str,
    group_version: &str,
    key: &str,
    path: &str,
) -> Result<String, Refusal> {
    let spec = pod.spec.get_or_insert_with(Default::default);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if index.by_name.catch_up(volumes, |v| &v.name) {
        *index = SecretVolumes::default();
        index.by_name.catch_up(volumes, |v| &v.name);
    }
    let item = KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        mode: None,
    };
    let name = volume_name(group, group_version);
    let this_admission = index.by_secret.get(group).copied();
    let Some(at) = this_admission.or(index.by_name.by.get(&name).map(|at| at[0])) else {
        index.by_secret.insert(group.to_owned(), volumes.len());
        volumes.push(Volume {
            name: name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(group.to_owned()),
                items: Some(vec![item]),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        return Ok(name);
    };
    let secret = volumes[at].secret.as_ref();
    if secret.and_then(|s| s.secret_name.as_deref()) != Some(group) {
        return Err(Refusal::Conflict(format!(
            "the pod has a volume named {name:?} that is not Kubernetes Secret {group:?}, the name the file secrets of {group:?} get; rename that volume"
        )));
    }
    if this_admission.is_none() {
        check_ours(spec, at, group)?;
    }
    let v = &mut spec.volumes.get_or_insert_with(Vec::new)[at];
    index.by_secret.insert(group.to_owned(), at);
    let items = v
        .secret
        .get_or_insert_with(Default::default)
        .items
        .get_or_insert_with(Vec::new);
    let indexed = index.items.entry(at).or_default();
    indexed.catch_up(items, |i| &i.path);
    let clash = (indexed.by.get(path).into_iter().flatten())
        .map(|&i| &items[i])
        .find(|i| i.key != key);
    if let Some(clash) = clash {
        // Flyte lower-cases file names, so MY_KEY and my_key would share one file.
        return Err(Refusal::Conflict(format!(
            "keys {:?} and {:?} of Kubernetes Secret {group:?} would both be written to {SECRETS_DIR}/{}/{path}; request only one of them as a file",
            clash.key,
            key,
            group.to_lowercase()
        )));
    }
    // Present only as `key -> path` itself: every item at `path` has `key` (above).
    if !indexed.by.contains_key(path) {
        items.push(item);
        indexed.catch_up(items, |i| &i.path);
    }
    Ok(v.name.clone())
}

/// Why volume `at` (Secret `group`'s, under the name the K8s manager gives its files) is not one
/// the K8s manager wrote, if it is not. Ours is optional, projects only items it writes (`key ->
/// lower(key)`, no mode), and is mounted nowhere but at `/etc/flyte/secrets/<lower(group)>`; a
/// volume of the pod's own under that name (one that projects every key, or mounts elsewhere)
/// is refused rather than narrowed to one key or mounted among the secrets.
fn check_ours(spec: &PodSpec, at: usize, group: &str) -> Result<(), Refusal> {
    let v = &spec.volumes.as_deref().unwrap_or_default()[at];
    let dir = format!("{SECRETS_DIR}/{}", group.to_lowercase());
    let secret = v.secret.as_ref();
    let items = secret.and_then(|s| s.items.as_deref()).unwrap_or_default();
    let elsewhere = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .find(|m| {
            m.name == v.name
                && (m.mount_path != dir || m.sub_path.is_some() || m.sub_path_expr.is_some())
        });
    let why = if items.is_empty() {
        "it projects every key of the Secret".to_owned()
    } else if let Some(i) = items
        .iter()
        .find(|i| i.mode.is_some() || i.path != i.key.to_lowercase())
    {
        format!("it projects key {:?} to {:?}", i.key, i.path)
    } else if let Some(m) = elsewhere {
        format!("it is mounted at {:?}", m.mount_path)
    } else if secret.and_then(|s| s.optional) != Some(true) {
        "it is not optional".to_owned()
    } else {
        return Ok(());
    };
    Err(Refusal::Conflict(format!(
        "the pod has its own volume {:?} for Kubernetes Secret {group:?} ({why}), under the name podmutator gives the volume it mounts at {dir}; podmutator does not change a pod's own volume: rename that volume",
        v.name
    )))
}

/// Longest valid volume name (a DNS-1123 label).
pub const MAX_VOLUME_NAME: usize = 63;

/// Flyte's name `base32(group + "_" + group_version)`; when that exceeds 63 characters (groups
/// longer than ~38 bytes, which the API server would reject) the first 46 characters are kept
/// and the first 16 hex digits of the SHA-256 of the full name appended: still stable, and two
/// long groups that share a prefix still get different names.
pub fn volume_name(group: &str, group_version: &str) -> String {
    let full = encode_base32(format!("{group}_{group_version}").as_bytes());
    if full.len() <= MAX_VOLUME_NAME {
        return full;
    }
    let digest = hex::encode(Sha256::digest(full.as_bytes()));
    format!("{}-{}", &full[..46], &digest[..16])
}

#[cfg(test)]
mod tests {
    //! Flyte's `TestK8sSecretInjector_Inject` (spec §8), with v2's resulting orders, plus the
    //! bugs fixed here.
    use super::*;
    use crate::secrets::testing::{inject_one, json, mk_pod, secret};
    use rstest::rstest;
    use serde_json::{Value, json};

    fn k8s() -> K8sInjector {
        K8sInjector {
            env_prefix: "_UNION_".into(),
        }
    }

    fn secret_ref(name: &str, key: &str) -> Value {
        json!({"secretKeyRef": {"name": name, "key": key, "optional": true}})
    }

    #[test]
    fn no_group_falls_back_to_md5_of_the_key() {
        let pod = inject_one(
            &k8s(),
            &[secret("", "HELLO", MountRequirement::EnvVar, "")],
            Pod::default(),
        )
        .unwrap();
        // An empty pod has no containers to receive anything; the request is still accepted.
        assert_eq!(pod.spec, None);
        let pod = inject_one(
            &k8s(),
            &[secret("", "HELLO", MountRequirement::EnvVar, "")],
            mk_pod(),
        )
        .unwrap();
        assert_eq!(
            json(&pod)["spec"]["containers"][0]["env"][1],
            json!({"name": "_UNION_EB61EEAD90E3B899C6BCBE27AC581660_HELLO", "valueFrom": secret_ref("eb61eead90e3b899c6bcbe27ac581660", "HELLO")})
        );
    }

    // Flyte's test vectors name the Secret `grOUP`, which no Kubernetes Secret can be called
    // (the API server refuses it in a `secretKeyRef`): refused here
    // (`names_that_are_no_kubernetes_secret_or_key_are_refused`), so these ports use `group`.
    #[rstest]
    #[case::simple("", json!([
        {"name": "FLYTE_SECRETS_ENV_PREFIX", "value": "_UNION_"},
        {"name": "_UNION_GROUP_HELLO", "valueFrom": secret_ref("group", "HELLO")}
    ]))]
    #[case::simple_with_env_name("MY_CUSTOM_ENV", json!([
        {"name": "FLYTE_SECRETS_ENV_PREFIX", "value": "_UNION_"},
        {"name": "MY_CUSTOM_ENV", "valueFrom": secret_ref("group", "HELLO")},
        {"name": "_UNION_GROUP_HELLO", "valueFrom": secret_ref("group", "HELLO")}
    ]))]
    fn env_var_secrets_reference_the_kubernetes_secret(#[case] env_var: &str, #[case] env: Value) {
        let pod = inject_one(
            &k8s(),
            &[secret("group", "HELLO", MountRequirement::EnvVar, env_var)],
            mk_pod(),
        )
        .unwrap();
        let pod = json(&pod);
        assert_eq!(pod["spec"]["containers"][0]["env"], env);
        assert!(pod["spec"].get("volumes").is_none());
    }

    fn file_env(env_var: Option<(&str, &str)>) -> Value {
        let mut env = vec![];
        if let Some((n, v)) = env_var {
            env.push(json!({"name": n, "value": v}));
        }
        env.push(json!({"name": "FLYTE_SECRETS_FILE_PREFIX", "value": ""}));
        env.push(json!({"name": "FLYTE_SECRETS_DEFAULT_DIR", "value": "/etc/flyte/secrets"}));
        Value::Array(env)
    }

    #[rstest]
    #[case::require_file_single(MountRequirement::File, "", None)]
    #[case::any_means_file(MountRequirement::Any, "", None)]
    #[case::require_file_single_with_name(MountRequirement::File, "MY_CUSTOM_ENV", Some(("MY_CUSTOM_ENV", "/etc/flyte/secrets/group/hello")))]
    fn file_secrets_mount_the_secret_volume(
        #[case] mount: MountRequirement,
        #[case] env_var: &str,
        #[case] expected_env_var: Option<(&str, &str)>,
    ) {
        let pod = inject_one(
            &k8s(),
            &[secret("group", "HELLO", mount, env_var)],
            mk_pod(),
        )
        .unwrap();
        let pod = json(&pod);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "m4zg54lql3", "secret": {"secretName": "group", "items": [{"key": "HELLO", "path": "hello"}], "optional": true}}])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "m4zg54lql3", "mountPath": "/etc/flyte/secrets/group", "readOnly": true}])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["env"],
            file_env(expected_env_var)
        );
    }

    #[test]
    fn require_file_multiple_from_same_secret_group() {
        let pod = inject_one(
            &k8s(),
            &[
                secret("group", "HELLO", MountRequirement::File, ""),
                secret("group", "world", MountRequirement::File, ""),
            ],
            mk_pod(),
        )
        .unwrap();
        let pod = json(&pod);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "m4zg54lql3", "secret": {"secretName": "group", "items": [
                {"key": "HELLO", "path": "hello"}, {"key": "world", "path": "world"}
            ], "optional": true}}])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn require_file_all_keys_without_group() {
        let pod = inject_one(
            &k8s(),
            &[secret("", "hello", MountRequirement::File, "")],
            mk_pod(),
        )
        .unwrap();
        let pod = json(&pod);
        assert_eq!(
            pod["spec"]["volumes"][0],
            json!({"name": "gvsdimjugazgcytdgrrdeyjxgzrdsnzrhfsdsmjrgaytoyzvhezf5", "secret": {
                "secretName": "5d41402abc4b2a76b9719d911017c592", "items": [{"key": "hello", "path": "hello"}], "optional": true}})
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
            "/etc/flyte/secrets/5d41402abc4b2a76b9719d911017c592"
        );
    }

    #[test]
    fn re_injecting_does_not_duplicate_volume_items() {
        // Flyte's AppendVolume appends the item again on every admission.
        let s = [secret("group", "HELLO", MountRequirement::File, "")];
        let once = inject_one(&k8s(), &s, mk_pod()).unwrap();
        let twice = inject_one(&k8s(), &s, once.clone()).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn the_mount_names_the_volume_that_holds_the_item() {
        // Same Secret, different group_version: Flyte mounted a volume name that did not exist.
        let mut second = secret("group", "other", MountRequirement::File, "");
        second.group_version = "v2".into();
        let pod = inject_one(
            &k8s(),
            &[secret("group", "HELLO", MountRequirement::File, ""), second],
            mk_pod(),
        )
        .unwrap();
        let pod = json(&pod);
        let volumes: Vec<&str> = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(volumes, ["m4zg54lql3"]);
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "m4zg54lql3"
        );
    }

    #[test]
    fn a_volume_of_the_pods_own_for_the_same_secret_is_left_as_it_is() {
        // Flyte added the item to the pod's volume (which then projected that key alone, not
        // every key) and mounted base32(group_version), a volume that did not exist.
        let mut pod = mk_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes = Some(vec![Volume {
            name: "creds".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("db-creds".into()),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![crate::mutate::pod::mount("creds", "/data")]);
        let own = json(&pod)["spec"]["volumes"][0].clone();
        let s = [secret("db-creds", "password", MountRequirement::File, "")];
        let once = inject_one(&k8s(), &s, pod).unwrap();
        let pod = json(&once);
        assert_eq!(
            pod["spec"]["volumes"][0], own,
            "the pod's own volume is untouched"
        );
        assert_eq!(
            pod["spec"]["volumes"][1],
            json!({"name": volume_name("db-creds", ""), "secret": {"secretName": "db-creds",
                "items": [{"key": "password", "path": "password"}], "optional": true}})
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "creds", "mountPath": "/data"},
                {"name": volume_name("db-creds", ""), "mountPath": "/etc/flyte/secrets/db-creds", "readOnly": true}])
        );
        // Admitted again (reinvocation): nothing more.
        assert_eq!(inject_one(&k8s(), &s, once.clone()).unwrap(), once);
    }

    /// A pod with Secret volume `db-creds` under the name the K8s manager gives that Secret's
    /// files (`items`, `optional`), mounted in the first container at `mount_path`.
    fn pod_with_a_volume_under_our_name(
        items: Option<Vec<(&str, &str)>>,
        optional: Option<bool>,
        mount_path: &str,
    ) -> Pod {
        let mut pod = mk_pod();
        let spec = pod.spec.as_mut().unwrap();
        let name = volume_name("db-creds", "");
        spec.volumes = Some(vec![Volume {
            name: name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("db-creds".into()),
                items: items.map(|items| {
                    items
                        .into_iter()
                        .map(|(key, path)| KeyToPath {
                            key: key.into(),
                            path: path.into(),
                            mode: None,
                        })
                        .collect()
                }),
                optional,
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![crate::mutate::pod::mount(name, mount_path)]);
        pod
    }

    /// A volume of the pod's own under the name the K8s manager gives the Secret's files is
    /// neither narrowed to the requested key nor mounted among the secrets: refused, naming it
    /// and why it is not ours. (Before, the item was added to it, so a volume that projected
    /// every key at /var/run/db-creds projected `password` alone, and no file appeared under
    /// /etc/flyte/secrets.)
    #[rstest]
    #[case::projects_every_key(
        None,
        Some(true),
        "/var/run/db-creds",
        "it projects every key of the Secret"
    )]
    #[case::projects_every_key_at_the_secrets_dir(
        None,
        Some(true),
        "/etc/flyte/secrets/db-creds",
        "it projects every key of the Secret"
    )]
    #[case::same_key_at_another_path(Some(vec![("password", "sub/pw")]), Some(true), "/etc/flyte/secrets/db-creds", "it projects key \"password\" to \"sub/pw\"")]
    #[case::mounted_elsewhere(Some(vec![("password", "password")]), Some(true), "/var/run/db-creds", "it is mounted at \"/var/run/db-creds\"")]
    #[case::not_optional(Some(vec![("password", "password")]), None, "/etc/flyte/secrets/db-creds", "it is not optional")]
    fn a_volume_of_the_pods_own_under_our_name_is_refused_not_changed(
        #[case] items: Option<Vec<(&str, &str)>>,
        #[case] optional: Option<bool>,
        #[case] mount_path: &str,
        #[case] why: &str,
    ) {
        let pod = pod_with_a_volume_under_our_name(items, optional, mount_path);
        for mount in [MountRequirement::File, MountRequirement::Any] {
            let s = [secret("db-creds", "password", mount, "")];
            let err = inject_one(&k8s(), &s, pod.clone()).unwrap_err();
            assert!(
                err.contains(&format!(
                    "the pod has its own volume {:?} for Kubernetes Secret \"db-creds\" ({why})",
                    volume_name("db-creds", "")
                )) && err.contains("rename that volume"),
                "{err}"
            );
        }
    }

    /// The volume an earlier admission wrote (as the API server stores it: `defaultMode` filled
    /// in) is ours: a key it holds adds nothing, another key is added to it.
    #[test]
    fn a_volume_an_earlier_admission_wrote_is_added_to() {
        let mut pod = pod_with_a_volume_under_our_name(
            Some(vec![("password", "password")]),
            Some(true),
            "/etc/flyte/secrets/db-creds",
        );
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes.as_mut().unwrap()[0]
            .secret
            .as_mut()
            .unwrap()
            .default_mode = Some(420);
        spec.containers[0].volume_mounts.as_mut().unwrap()[0].read_only = Some(true);
        let same = [secret("db-creds", "password", MountRequirement::File, "")];
        let once = inject_one(&k8s(), &same, pod.clone()).unwrap();
        assert_eq!(
            json(&once)["spec"]["volumes"],
            json(&pod)["spec"]["volumes"]
        );
        let other = [secret("db-creds", "user", MountRequirement::File, "")];
        let added = inject_one(&k8s(), &other, pod).unwrap();
        assert_eq!(
            json(&added)["spec"]["volumes"][0]["secret"]["items"],
            json!([{"key": "password", "path": "password"}, {"key": "user", "path": "user"}])
        );
    }

    #[test]
    fn a_volume_of_another_kind_under_the_secrets_volume_name_is_refused() {
        let mut pod = mk_pod();
        pod.spec.as_mut().unwrap().volumes = Some(vec![crate::mutate::pod::memory_volume(
            volume_name("g", ""),
        )]);
        let err =
            inject_one(&k8s(), &[secret("g", "k", MountRequirement::File, "")], pod).unwrap_err();
        assert!(err.contains("that is not Kubernetes Secret \"g\""), "{err}");
    }

    #[test]
    fn keys_that_would_share_a_lower_cased_file_are_refused() {
        // Flyte issue #2801: MY_SECRET and my_secret both became /etc/flyte/secrets/<g>/my_secret.
        let err = inject_one(
            &k8s(),
            &[
                secret("g", "MY_SECRET", MountRequirement::File, ""),
                secret("g", "my_secret", MountRequirement::File, ""),
            ],
            mk_pod(),
        )
        .unwrap_err();
        assert!(
            err.contains("would both be written to /etc/flyte/secrets/g/my_secret"),
            "{err}"
        );
    }

    #[rstest]
    #[case::short("g", "")]
    #[case::at_the_limit(&"g".repeat(38), "")]
    #[case::long(&"a-very-long-kubernetes-secret-name-for-a-team".repeat(2), "v1")]
    fn volume_names_are_valid_dns_labels(#[case] group: &str, #[case] gv: &str) {
        let name = volume_name(group, gv);
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
        assert!(!name.starts_with('-') && !name.ends_with('-'));
        assert_eq!(name, volume_name(group, gv), "stable");
    }

    #[rstest]
    #[case::parent(
        "g",
        "../etc",
        MountRequirement::File,
        "",
        "key \"../etc\" cannot be used: it must be a Kubernetes Secret key"
    )]
    #[case::absolute(
        "g",
        "/etc/passwd",
        MountRequirement::Any,
        "",
        "key \"/etc/passwd\" cannot be used: it must be a Kubernetes Secret key"
    )]
    #[case::env_var_with_equals(
        "g",
        "k",
        MountRequirement::File,
        "A=B",
        "\"A=B\" would be refused by the API server"
    )]
    #[case::env_var_with_a_newline(
        "g",
        "k",
        MountRequirement::EnvVar,
        "A\nB",
        "\"A\\nB\" would be refused"
    )]
    fn names_the_api_server_would_refuse_are_refused_before_injection(
        #[case] group: &str,
        #[case] key: &str,
        #[case] mount: MountRequirement,
        #[case] env_var: &str,
        #[case] says: &str,
    ) {
        let err = inject_one(&k8s(), &[secret(group, key, mount, env_var)], mk_pod()).unwrap_err();
        assert!(err.contains(says), "{err}");
    }

    #[test]
    fn names_only_the_older_rule_refused_are_written_as_flyte_writes_them() {
        // Kubernetes 1.32+ (RelaxedEnvironmentVariableValidation) takes any printable ASCII
        // but '='; the rule before it refused a leading digit and ':'.
        for name in ["1PASSWORD_TOKEN", "MY:PATH"] {
            let pod = inject_one(
                &k8s(),
                &[secret("g", "k", MountRequirement::EnvVar, name)],
                mk_pod(),
            )
            .unwrap();
            let env = &json(&pod)["spec"]["containers"][0]["env"];
            assert!(
                env.as_array().unwrap().iter().any(|e| e["name"] == name),
                "{name}: {env}"
            );
        }
    }

    /// A group that is no Secret name (it would climb out of `/etc/flyte/secrets` as the mount
    /// path, or name a Secret the API server refuses) and a key that is no Secret key are
    /// refused, whatever the mount, naming the field and the rule.
    #[rstest]
    #[case::group_climbing_out("../../var/run", "k", MountRequirement::File, "group")]
    #[case::group_with_a_slash("team/db", "k", MountRequirement::Any, "group")]
    #[case::flytes_upper_case_vector("grOUP", "HELLO", MountRequirement::File, "group")]
    #[case::upper_case_env_var("grOUP", "HELLO", MountRequirement::EnvVar, "group")]
    #[case::group_dot_dot("..", "k", MountRequirement::File, "group")]
    #[case::key_with_a_slash("g", "a/b", MountRequirement::File, "key")]
    #[case::key_dot_dot("g", "..", MountRequirement::File, "key")]
    #[case::env_key_dot_dot("g", "..", MountRequirement::EnvVar, "key")]
    #[case::key_starting_with_dot_dot("g", "..data", MountRequirement::File, "key")]
    #[case::env_key_starting_with_dot_dot("g", "..data", MountRequirement::EnvVar, "key")]
    #[case::any_key_starting_with_dot_dot("g", "...", MountRequirement::Any, "key")]
    fn names_that_are_no_kubernetes_secret_or_key_are_refused(
        #[case] group: &str,
        #[case] key: &str,
        #[case] mount: MountRequirement,
        #[case] field: &str,
    ) {
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: secret(group, key, mount, ""),
        };
        let err = k8s()
            .accepts(
                &req,
                &PodCtx::test(crate::mutate::Route::Secrets),
                &mk_pod(),
            )
            .unwrap_err();
        let Refusal::BadSecretName { field: f, rule, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*f, field);
        let expected = match field {
            "group" => crate::secrets::names::K8S_SECRET_NAME_RULE,
            _ => crate::secrets::names::K8S_KEY_RULE,
        };
        assert_eq!(*rule, expected);
    }

    proptest::proptest! {
        /// Whatever the names, an accepted request references a valid Secret name and key,
        /// mounts exactly one directory below `/etc/flyte/secrets` and writes a file name
        /// there; any other request is refused before the pod changes.
        #[test]
        fn no_accepted_name_leaves_the_secrets_dir_or_names_an_invalid_secret(
            group in proptest::prop_oneof!["[a-z0-9.-]{0,12}", "[a-zA-Z0-9./_ -]{0,12}", ".*"],
            key in proptest::prop_oneof!["[a-zA-Z0-9._-]{1,12}", "[a-z./ -]{1,8}", ".*"],
            mount in proptest::prop_oneof![
                proptest::strategy::Just(MountRequirement::Any),
                proptest::strategy::Just(MountRequirement::File),
                proptest::strategy::Just(MountRequirement::EnvVar),
            ],
        ) {
            use crate::k8s_names::{is_config_map_key, is_dns_label, is_dns_subdomain, is_env_var_name};
            let Ok(pod) = inject_one(&k8s(), &[secret(&group, &key, mount, "")], mk_pod()) else {
                return Ok(());
            };
            let pod = json(&pod);
            let spec = &pod["spec"];
            for v in spec["volumes"].as_array().into_iter().flatten() {
                proptest::prop_assert!(is_dns_label(v["name"].as_str().unwrap()), "{v}");
                let source = &v["secret"];
                proptest::prop_assert!(is_dns_subdomain(source["secretName"].as_str().unwrap()), "{v}");
                for item in source["items"].as_array().unwrap() {
                    proptest::prop_assert!(is_config_map_key(item["key"].as_str().unwrap()), "{v}");
                    proptest::prop_assert!(is_config_map_key(item["path"].as_str().unwrap()), "{v}");
                }
            }
            let c = &spec["containers"][0];
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let path = m["mountPath"].as_str().unwrap();
                let rest = path.strip_prefix("/etc/flyte/secrets/").unwrap_or_default();
                proptest::prop_assert!(is_dns_subdomain(rest), "{path}");
            }
            for e in c["env"].as_array().into_iter().flatten() {
                proptest::prop_assert!(is_env_var_name(e["name"].as_str().unwrap()), "{e}");
                let r = &e["valueFrom"]["secretKeyRef"];
                if !r.is_null() {
                    proptest::prop_assert!(is_dns_subdomain(r["name"].as_str().unwrap()), "{e}");
                    proptest::prop_assert!(is_config_map_key(r["key"].as_str().unwrap()), "{e}");
                }
            }
        }
    }

    /// `add_secret_item` without its index: a scan of the volumes and of their items per
    /// request, with `chosen` (Secret -> the volume name its files went to) for the admission.
    /// The indexed one must answer and edit exactly as this one does.
    fn add_secret_item_by_scan(
        pod: &mut Pod,
        chosen: &mut HashMap<String, String>,
        group: &str,
        group_version: &str,
        key: &str,
        path: &str,
    ) -> Result<String, Refusal> {
        let spec = pod.spec.get_or_insert_with(Default::default);
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        let name = volume_name(group, group_version);
        let want = chosen.get(group).cloned().unwrap_or_else(|| name.clone());
        if let Some(at) = volumes.iter().position(|v| v.name == want)
            && !chosen.contains_key(group)
            && volumes[at]
                .secret
                .as_ref()
                .and_then(|s| s.secret_name.as_deref())
                == Some(group)
        {
            check_ours(spec, at, group)?;
        }
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        let existing = volumes.iter_mut().find(|v| v.name == want);
        let item = KeyToPath {
            key: key.to_owned(),
            path: path.to_owned(),
            mode: None,
        };
        match existing {
            Some(v) if v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) != Some(group) => {
                Err(Refusal::Conflict(format!(
                    "the pod has a volume named {name:?} that is not Kubernetes Secret {group:?}, the name the file secrets of {group:?} get; rename that volume"
                )))
            }
            Some(v) => {
                chosen.insert(group.to_owned(), want);
                let items = v
                    .secret
                    .get_or_insert_with(Default::default)
                    .items
                    .get_or_insert_with(Vec::new);
                if let Some(clash) = items.iter().find(|i| i.path == path && i.key != key) {
                    return Err(Refusal::Conflict(format!(
                        "keys {:?} and {:?} of Kubernetes Secret {group:?} would both be written to {SECRETS_DIR}/{}/{path}; request only one of them as a file",
                        clash.key,
                        key,
                        group.to_lowercase()
                    )));
                }
                if !items.iter().any(|i| i.path == path) {
                    items.push(item);
                }
                Ok(v.name.clone())
            }
            None => {
                chosen.insert(group.to_owned(), name.clone());
                volumes.push(Volume {
                    name: name.clone(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(group.to_owned()),
                        items: Some(vec![item]),
                        optional: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                Ok(name)
            }
        }
    }

    /// A pod's own volumes: Secret volumes (some sharing a Secret, some with items that already
    /// share a path or lack `items`, some under the name the K8s manager gives a Secret's files,
    /// of that Secret or another) and volumes of other kinds.
    fn arb_volumes() -> impl proptest::strategy::Strategy<Value = Vec<Volume>> {
        use proptest::prelude::*;
        let item = ("[aAbB]", "[ab]").prop_map(|(key, path)| KeyToPath {
            key,
            path,
            mode: None,
        });
        let names = prop_oneof![
            "v[0-9]",
            proptest::sample::select(vec![volume_name("g", ""), volume_name("h", "")]),
        ];
        let volume = (
            names,
            proptest::option::of("[gh]"),
            proptest::option::of(proptest::collection::vec(item, 0..4)),
            proptest::option::of(proptest::bool::ANY),
        )
            .prop_map(|(name, secret_name, items, optional)| Volume {
                name,
                secret: secret_name.map(|n| SecretVolumeSource {
                    secret_name: Some(n),
                    items,
                    optional,
                    ..Default::default()
                }),
                ..Default::default()
            });
        proptest::collection::vec(volume, 0..4)
    }

    proptest::proptest! {
        #[test]
        fn the_indexed_volume_items_match_a_scan(
            volumes in arb_volumes(),
            requests in proptest::collection::vec(("[ghi]", "[aAbBc]", proptest::bool::ANY), 0..24),
        ) {
            let mut scanned = mk_pod();
            scanned.spec.as_mut().unwrap().volumes = (!volumes.is_empty()).then_some(volumes);
            let mut indexed = scanned.clone();
            let mut index = SecretVolumes::default();
            let mut chosen = HashMap::new();
            for (group, key, other_first) in requests {
                if other_first {
                    // Another manager's volume between two requests, as a sidecar adds one.
                    for pod in [&mut scanned, &mut indexed] {
                        crate::mutate::pod::add_volume(
                            &mut pod.spec.as_mut().unwrap().volumes,
                            Volume { name: format!("other-{group}"), ..Default::default() },
                        );
                    }
                }
                let path = key.to_lowercase();
                let want = add_secret_item_by_scan(&mut scanned, &mut chosen, &group, "", &key, &path);
                let got = add_secret_item(&mut indexed, &mut index, &group, "", &key, &path);
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert_eq!(&indexed, &scanned);
            }
        }
    }

    #[test]
    fn long_groups_with_a_common_prefix_get_different_volume_names() {
        let a = volume_name(&format!("{}-a", "x".repeat(60)), "");
        let b = volume_name(&format!("{}-b", "x".repeat(60)), "");
        assert_ne!(a, b);
    }

    #[rstest]
    #[case::no_key(
        secret("g", "", MountRequirement::EnvVar, ""),
        "k8s Secrets Webhook require key to be set"
    )]
    #[case::unknown_mount(
        secret("g", "k", MountRequirement::Unknown(7), ""),
        "unrecognized mount requirement [7]"
    )]
    fn unusable_requests_are_refused(
        #[case] s: crate::secrets::codec::Secret,
        #[case] message: &str,
    ) {
        assert_eq!(inject_one(&k8s(), &[s], mk_pod()).unwrap_err(), message);
    }
}
