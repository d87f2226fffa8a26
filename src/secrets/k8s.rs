//! The `K8s` manager: references a Kubernetes Secret named after the group.

use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, KeyToPath, Pod, SecretKeySelector, SecretVolumeSource, Volume,
    VolumeMount,
};
use md5::{Digest, Md5};
use sha2::Sha256;

use super::codec::{MountRequirement, encode_base32};
use super::{
    ENV_DEFAULT_DIR, ENV_ENV_PREFIX, ENV_FILE_PREFIX, Plan, SECRETS_DIR, SecretInjector,
    SecretRequest,
};
use crate::config::SecretManagerType;
use crate::mutate::PodCtx;
use crate::mutate::pod::env_value;

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

    fn inject(
        &self,
        req: &SecretRequest,
        _ctx: &PodCtx<'_>,
        pod: &mut Pod,
        plan: &mut Plan,
    ) -> Result<(), String> {
        let s = &req.secret;
        if s.key.is_empty() {
            return Err("k8s Secrets Webhook require key to be set".into());
        }
        let group = if s.group.is_empty() {
            hex::encode(Md5::digest(s.key.as_bytes()))
        } else {
            s.group.clone()
        };
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
                plan.env(env_value(ENV_ENV_PREFIX, &self.env_prefix));
                if !s.env_var.is_empty() {
                    plan.env(EnvVar {
                        name: s.env_var.clone(),
                        value: None,
                        value_from: Some(source.clone()),
                    });
                }
                plan.env(EnvVar {
                    name: format!("{}{}_{}", self.env_prefix, group, s.key).to_uppercase(),
                    value: None,
                    value_from: Some(source),
                });
            }
            MountRequirement::Any | MountRequirement::File => {
                let dir = format!("{SECRETS_DIR}/{}", group.to_lowercase());
                let file = s.key.to_lowercase();
                let volume = add_secret_item(pod, &group, &s.group_version, &s.key, &file)?;
                plan.mount(VolumeMount {
                    name: volume,
                    read_only: Some(true),
                    mount_path: dir.clone(),
                    ..Default::default()
                });
                if !s.env_var.is_empty() {
                    plan.env(env_value(&s.env_var, &format!("{dir}/{file}")));
                }
                plan.env(env_value(ENV_FILE_PREFIX, ""));
                plan.env(env_value(ENV_DEFAULT_DIR, SECRETS_DIR));
            }
            MountRequirement::Unknown(n) => {
                return Err(format!("unrecognized mount requirement [{n}]"));
            }
        }
        Ok(())
    }
}

/// Adds `key -> path` to the pod's volume for Secret `group` (creating the volume if needed) and
/// returns that volume's name. Unlike Flyte, an item already present is not added twice, and the
/// mount always names the volume that really holds the item.
fn add_secret_item(
    pod: &mut Pod,
    group: &str,
    group_version: &str,
    key: &str,
    path: &str,
) -> Result<String, String> {
    let spec = pod.spec.get_or_insert_with(Default::default);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    let existing = volumes.iter_mut().find(|v| {
        v.secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
            .is_some_and(|n| n == group)
    });
    let item = KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        mode: None,
    };
    match existing {
        Some(v) => {
            let items = v
                .secret
                .get_or_insert_with(Default::default)
                .items
                .get_or_insert_with(Vec::new);
            if let Some(clash) = items.iter().find(|i| i.path == path && i.key != key) {
                // Flyte lower-cases file names, so MY_KEY and my_key would share one file.
                return Err(format!(
                    "keys {:?} and {:?} of Kubernetes Secret {group:?} would both be written to {SECRETS_DIR}/{}/{path}; request only one of them as a file",
                    clash.key,
                    key,
                    group.to_lowercase()
                ));
            }
            if !items.iter().any(|i| i.key == key) {
                items.push(item);
            }
            Ok(v.name.clone())
        }
        None => {
            let name = volume_name(group, group_version);
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
