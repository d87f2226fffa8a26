//! The `Embedded` manager with the AWS provider: the webhook itself holds the value (fetched
//! before the chain ran, see [`super::source`]) and writes it into the pod.

use base64::Engine;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, Volume, VolumeMount,
};

use super::codec::MountRequirement;
use super::source::Lookup;
use super::{
    Accept, ENV_DEFAULT_DIR, ENV_ENV_PREFIX, ENV_FILE_PREFIX, Edits, SECRETS_DIR, SecretInjector,
    SecretRequest,
};
use crate::config::{EmbeddedConfig, FileMountInitContainer, SecretManagerType};
use crate::error::Denial;
use crate::mutate::PodCtx;
use crate::mutate::pod::{add_volume, env_value};

pub const LABEL_ORGANIZATION: &str = "organization";
pub const LABEL_PROJECT: &str = "project";
pub const LABEL_DOMAIN: &str = "domain";
pub const VOLUME: &str = "embedded-secret-vol";
/// The init container's variable carrying `<key>=<base64 value>` lines.
pub const ENV_SECRETS: &str = "SECRETS";

/// Writes each `<key>=<base64>` line of `$SECRETS` to `/etc/flyte/secrets/<key>`. Flyte's script
/// takes the name with `substr($0, 0, i - 1)`, which GNU awk reads as one character short;
/// position 1 is right in every awk.
pub const FILE_SCRIPT: &str = r#"printf "%s" "$SECRETS" | awk '/^.+=/ { i = index($0, "="); name = substr($0, 1, i - 1); value = substr($0, i + 1); output_file = "/etc/flyte/secrets/" name; print value | "base64 -d > " output_file; }'"#;

/// Flyte's `EncodeSecretName`: `u__org__<o>__domain__<d>__project__<p>__key__<k>`.
pub fn secret_name(org: &str, domain: &str, project: &str, key: &str) -> String {
    format!("u__org__{org}__domain__{domain}__project__{project}__key__{key}")
}

/// The ids to try, most specific first: project, domain, organisation.
pub fn cascade(org: &str, domain: &str, project: &str, key: &str) -> [String; 3] {
    [
        secret_name(org, domain, project, key),
        secret_name(org, domain, "", key),
        secret_name(org, "", "", key),
    ]
}

fn render(t: &str, org: &str, project: &str, domain: &str) -> String {
    let mut out = String::with_capacity(t.len() + 16);
    let mut rest = t;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        out.push_str(match after[..end].trim() {
            "organization" => org,
            "project" => project,
            _ => domain,
        });
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The pod's scope labels, or the first missing one (checked in Flyte's order).
fn scope(pod: &Pod) -> Result<(&str, &str, &str), &'static str> {
    let get = |k: &'static str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .ok_or(k)
    };
    Ok((
        get(LABEL_ORGANIZATION)?,
        get(LABEL_PROJECT)?,
        get(LABEL_DOMAIN)?,
    ))
}

/// Keys that become file names inside a shell pipeline: nothing that can leave the directory or
/// be read by the shell.
fn is_safe_file_key(key: &str) -> bool {
    !key.is_empty()
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Injects a value fetched from AWS Secrets Manager (name
/// `u__org__<organization>__domain__<domain>__project__<project>__key__<key>`, most specific scope
/// found first), for pods labelled `organization`, `project` and `domain`:
/// - ANY/ENV_VAR: `<env_var>` or `<PREFIX><KEY>` = the value, in plain text, in every container,
///   plus `FLYTE_SECRETS_ENV_PREFIX`;
/// - FILE: init container `init-embedded-secret` (busybox) whose `SECRETS` variable carries
///   `<key>=<base64 value>` lines it writes to `/etc/flyte/secrets/<key>`, an in-memory volume
///   `embedded-secret-vol` mounted read-only at `/etc/flyte/secrets` in every container,
///   `FLYTE_SECRETS_DEFAULT_DIR`, `FLYTE_SECRETS_FILE_PREFIX`, and `<env_var>=<file path>` for every
///   FILE secret that sets it (Flyte sets only the first one's).
///
/// Either way the value ends up in the pod spec, as in Flyte. Unlike Flyte, a pod may only read
/// the scope its namespace belongs to (`embedded.namespaceTemplate`), and optionally only for
/// listed users.
pub struct EmbeddedInjector {
    pub env_prefix: String,
    pub file_init: FileMountInitContainer,
    pub namespace_template: String,
    pub allowed_usernames: Vec<String>,
    pub max_value_bytes: usize,
}

impl EmbeddedInjector {
    pub fn new(env_prefix: &str, file_init: &FileMountInitContainer, cfg: &EmbeddedConfig) -> Self {
        Self {
            env_prefix: env_prefix.to_owned(),
            file_init: file_init.clone(),
            namespace_template: cfg.namespace_template.clone(),
            allowed_usernames: cfg.allowed_usernames.clone(),
            max_value_bytes: cfg.max_value_bytes,
        }
    }

    fn user_allowed(&self, username: &str) -> bool {
        self.allowed_usernames.is_empty()
            || self
                .allowed_usernames
                .iter()
                .any(|a| match a.strip_suffix('*') {
                    Some(prefix) => username.starts_with(prefix),
                    None => a == username,
                })
    }

    /// The scope binding: a 403 when the pod asks for another scope's secrets.
    fn check_binding(&self, ctx: &PodCtx<'_>, pod: &Pod) -> Result<(), Denial> {
        if !self.user_allowed(ctx.username) {
            return Err(Denial::forbidden(
                "EmbeddedUserNotAllowed",
                format!(
                    "user {:?} may not create pods that read Embedded secrets; add it to embedded.allowedUsernames or create the pod as an allowed user",
                    ctx.username
                ),
            ));
        }
        let Ok((org, project, domain)) = scope(pod) else {
            return Ok(());
        };
        if self.namespace_template.is_empty() {
            return Ok(());
        }
        let expected = render(&self.namespace_template, org, project, domain);
        if expected != ctx.namespace {
            return Err(Denial::forbidden(
                "EmbeddedScopeMismatch",
                format!(
                    "pod labels organization={org:?} project={project:?} domain={domain:?} belong to namespace {expected:?} (embedded.namespaceTemplate {:?}), not {:?}; a pod may read only its own project's secrets: create it in {expected:?} or fix its labels",
                    self.namespace_template, ctx.namespace
                ),
            ));
        }
        Ok(())
    }

    fn add_file(&self, pod: &mut Pod, key: &str, bytes: &[u8]) {
        let line = format!(
            "{key}={}\n",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        );
        let spec = pod.spec.get_or_insert_with(Default::default);
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        let idx = match inits
            .iter()
            .position(|c| c.name == self.file_init.container_name)
        {
            Some(i) => i,
            None => {
                inits.push(Container {
                    name: self.file_init.container_name.clone(),
                    image: Some(self.file_init.image.clone()),
                    command: Some(vec!["sh".into(), "-c".into(), FILE_SCRIPT.into()]),
                    resources: Some(self.file_init.resources.clone()),
                    volume_mounts: Some(vec![VolumeMount {
                        name: VOLUME.into(),
                        mount_path: SECRETS_DIR.into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                });
                inits.len() - 1
            }
        };
        let env = inits[idx].env.get_or_insert_with(Vec::new);
        let var = match env.iter_mut().find(|e| e.name == ENV_SECRETS) {
            Some(v) => v,
            None => {
                env.push(EnvVar {
                    name: ENV_SECRETS.into(),
                    value: Some(String::new()),
                    value_from: None,
                });
                env.last_mut().expect("just pushed")
            }
        };
        let text = var.value.get_or_insert_with(String::new);
        // One line per key: a second admission changes nothing, a new value replaces the old.
        let prefix = format!("{key}=");
        let mut lines: Vec<&str> = text
            .split_inclusive('\n')
            .filter(|l| !l.starts_with(&prefix))
            .collect();
        lines.push(&line);
        *text = lines.concat();
        add_volume(
            &mut spec.volumes,
            Volume {
                name: VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
    }
}

impl SecretInjector for EmbeddedInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::Embedded
    }

    /// Takes a request with a key from a pod with its scope labels, if one of the scope's
    /// three names (project, domain, organisation) resolves.
    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, pod: &Pod) -> Result<Accept, String> {
        let key = &req.secret.key;
        if key.is_empty() {
            return Err("EmbeddedSecretManager requires key to be set".into());
        }
        let (org, project, domain) = scope(pod).map_err(|label| {
            format!(
                "[SecretRequirementsError] secret read requirements not met due to empty {label} field in the pod labels"
            )
        })?;
        match req.secret.mount_requirement {
            MountRequirement::Any | MountRequirement::EnvVar => {}
            MountRequirement::File if is_safe_file_key(key) => {}
            MountRequirement::File => {
                return Err(format!(
                    "key {key:?} cannot be a file name: use letters, digits, '.', '_' and '-' only"
                ));
            }
            MountRequirement::Unknown(n) => {
                return Err(format!("unrecognized mount requirement [{n}]"));
            }
        }
        Ok(Accept::Fetch(cascade(org, domain, project, key).into()))
    }

    fn deny(&self, req: &SecretRequest, ctx: &PodCtx<'_>, pod: &Pod) -> Option<Denial> {
        if req.secret.key.is_empty() {
            return None;
        }
        self.check_binding(ctx, pod).err()
    }

    fn inject(
        &self,
        req: &SecretRequest,
        _ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), String> {
        let key = &req.secret.key;
        let (org, project, domain) = scope(pod).map_err(|label| format!("no {label} label"))?;
        let ids = cascade(org, domain, project, key);
        let mut value = None;
        for id in &ids {
            match edits.resolved.get(id) {
                Some(Lookup::Found(v)) => {
                    value = Some((id, v));
                    break;
                }
                Some(Lookup::NotFound) => {}
                None => return Err(format!("secret {id} was not fetched")),
            }
        }
        let Some((id, value)) = value else {
            return Err(format!(
                "[SecretNotFoundAcrossAllScopes] secret not found across all scopes (looked for {})",
                ids.join(", ")
            ));
        };
        if value.len() > self.max_value_bytes {
            return Err(format!(
                "secret {id} is {} bytes, over embedded.maxValueBytes ({})",
                value.len(),
                self.max_value_bytes
            ));
        }
        let Some(bytes) = value.bytes() else {
            return Err(format!(
                "[SecretNil] secret {id} read as empty from the secret manager"
            ));
        };
        match req.secret.mount_requirement {
            MountRequirement::Any | MountRequirement::EnvVar => {
                let text = std::str::from_utf8(bytes).map_err(|_| {
                    format!(
                        "secret {key:?} is attempted to be mounted as an environment variable, but has a binary value that is not a valid UTF-8 string; mount as a file instead"
                    )
                })?;
                let name = if req.secret.env_var.is_empty() {
                    format!("{}{}", self.env_prefix, key.to_uppercase())
                } else {
                    req.secret.env_var.clone()
                };
                edits.env(env_value(&name, text));
                edits.env(env_value(ENV_ENV_PREFIX, &self.env_prefix));
            }
            MountRequirement::File => {
                self.add_file(pod, key, bytes);
                edits.mount(VolumeMount {
                    name: VOLUME.into(),
                    read_only: Some(true),
                    mount_path: SECRETS_DIR.into(),
                    ..Default::default()
                });
                if !req.secret.env_var.is_empty() {
                    // The file keeps the key's case (Flyte pointed the variable at a lower-cased
                    // path that does not exist for mixed-case keys).
                    edits.env(env_value(
                        &req.secret.env_var,
                        &format!("{SECRETS_DIR}/{key}"),
                    ));
                }
                edits.env(env_value(ENV_FILE_PREFIX, ""));
                edits.env(env_value(ENV_DEFAULT_DIR, SECRETS_DIR));
            }
            MountRequirement::Unknown(n) => {
                return Err(format!("unrecognized mount requirement [{n}]"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::project("o", "d", "p", "k", "u__org__o__domain__d__project__p__key__k")]
    #[case::org_only(
        "o-apple",
        "",
        "",
        "secret1",
        "u__org__o-apple__domain____project____key__secret1"
    )]
    fn secret_names_follow_flyte(
        #[case] org: &str,
        #[case] domain: &str,
        #[case] project: &str,
        #[case] key: &str,
        #[case] expected: &str,
    ) {
        assert_eq!(secret_name(org, domain, project, key), expected);
    }

    #[test]
    fn cascade_is_project_then_domain_then_org() {
        assert_eq!(
            cascade("o", "d", "p", "k"),
            [
                "u__org__o__domain__d__project__p__key__k",
                "u__org__o__domain__d__project____key__k",
                "u__org__o__domain____project____key__k",
            ]
        );
    }

    #[rstest]
    #[case::flyte_default("{{ project }}-{{ domain }}", "p-d")]
    #[case::tight("{{project}}-{{domain}}", "p-d")]
    #[case::with_org("{{ organization }}-{{ project }}", "o-p")]
    #[case::literal("fixed", "fixed")]
    fn templates_render(#[case] t: &str, #[case] expected: &str) {
        crate::config::check_template(t).unwrap();
        assert_eq!(render(t, "o", "p", "d"), expected);
    }

    #[rstest]
    #[case::unknown("{{ tenant }}")]
    #[case::unclosed("{{ project")]
    fn bad_templates_are_rejected(#[case] t: &str) {
        assert!(crate::config::check_template(t).is_err());
    }
}
