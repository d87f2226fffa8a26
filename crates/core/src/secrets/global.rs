//! The `Global` manager: secrets this webhook process itself holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::codec::MountRequirement;
use super::refusal::Refusal;
use super::{Accept, ENV_ENV_PREFIX, Edits, SecretInjector, SecretRequest, flyte_env_name};
use crate::config::{GlobalSecretsConfig, SecretManagerType};
use crate::error::Denial;
use crate::mutate::PodCtx;
use crate::mutate::pod::env_value;

/// Where Global secrets come from: the process environment and files.
pub trait GlobalSecretSource: Send + Sync {
    /// The value of `group`/`key`, or a description of where it was looked for.
    fn get(&self, group: &str, key: &str) -> Result<String, String>;
}

/// Flyte's `FileEnvSecretManager`: env `<env-prefix><GROUP>_<KEY>`, else file
/// `<secrets-prefix>/<group>/<key>` read verbatim. The environment is captured once at start.
pub struct FileEnvSource {
    env_prefix: String,
    dir: PathBuf,
    /// Whether `dir` existed at start. On Lambda it never does; then no file is ever opened.
    dir_exists: bool,
    env: BTreeMap<String, String>,
}

impl FileEnvSource {
    pub fn from_process(cfg: &GlobalSecretsConfig) -> Self {
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with(&cfg.env_prefix))
            .collect();
        Self::new(cfg, env)
    }

    pub fn new(cfg: &GlobalSecretsConfig, env: BTreeMap<String, String>) -> Self {
        let dir = PathBuf::from(&cfg.secrets_prefix);
        Self {
            env_prefix: cfg.env_prefix.clone(),
            dir_exists: dir.is_dir(),
            dir,
            env,
        }
    }
}

impl GlobalSecretSource for FileEnvSource {
    fn get(&self, group: &str, key: &str) -> Result<String, String> {
        let var = self.env_prefix.clone() + &format!("{group}_{key}").to_uppercase();
        if let Some(v) = self.env.get(&var) {
            return Ok(v.clone());
        }
        if !self.dir_exists {
            return Err(format!(
                "not found in env [{var}] (no directory {} to look in)",
                self.dir.display()
            ));
        }
        // group and key come from the pod's annotations: never let them leave the directory.
        if !is_plain_segment(group) || !is_plain_segment(key) {
            return Err(format!(
                "not found in env [{var}]; group and key must be plain file names to be looked up in {}",
                self.dir.display()
            ));
        }
        let path = self.dir.join(group).join(key);
        std::fs::read_to_string(&path)
            .map_err(|_| format!("not found in env [{var}] or file [{}]", path.display()))
    }
}

/// A process that holds no Global secrets (tests, `podmutator inject`).
pub struct NoGlobalSecrets;

impl GlobalSecretSource for NoGlobalSecrets {
    fn get(&self, group: &str, key: &str) -> Result<String, String> {
        Err(format!("no Global secret {group}/{key} in this process"))
    }
}

fn is_plain_segment(s: &str) -> bool {
    !matches!(s, "" | "." | "..")
        && !s.contains(['/', '\\', '\0'])
        && Path::new(s).components().count() == 1
}

/// Injects a secret held by this process as a plain-text env var in every container:
/// `<PREFIX><GROUP>_<KEY>=<value>` (upper-cased) and `FLYTE_SECRETS_ENV_PREFIX`. FILE requests
/// are refused. The value is visible in the pod spec, as in Flyte.
pub struct GlobalInjector {
    pub env_prefix: String,
    pub source: Box<dyn GlobalSecretSource>,
    /// `embedded.allowedUsernames`: a Global value is as secret as an Embedded one.
    pub allowed_usernames: Vec<String>,
}

impl SecretInjector for GlobalInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::Global
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, _: &Pod) -> Result<Accept, Refusal> {
        let s = &req.secret;
        if s.group.is_empty() || s.key.is_empty() {
            return Err(Refusal::MissingField(
                "both key and group are required parameters".into(),
            ));
        }
        self.source
            .get(&s.group, &s.key)
            .map_err(Refusal::NotFound)?;
        match s.mount_requirement {
            MountRequirement::Any | MountRequirement::EnvVar => {
                super::check_env_name(&flyte_env_name(&self.env_prefix, &s.group, &s.key))?;
                Ok(Accept::Now)
            }
            MountRequirement::File => Err(Refusal::UnsupportedMount(format!(
                "global secrets can only be injected as environment variables [{}/{}]",
                s.group, s.key
            ))),
            MountRequirement::Unknown(n) => Err(Refusal::UnknownMount(n)),
        }
    }

    /// A user outside `embedded.allowedUsernames` is refused only for a secret Global would
    /// serve: its other requests still go on to the other managers.
    fn deny(&self, req: &SecretRequest, ctx: &PodCtx<'_>, pod: &Pod) -> Option<Denial> {
        if super::user_allowed(&self.allowed_usernames, ctx.username)
            || self.accepts(req, ctx, pod).is_err()
        {
            return None;
        }
        Some(Denial::forbidden(
            "GlobalUserNotAllowed",
            format!(
                "user {:?} may not create pods that read Global secrets ({} asks for one); add it to embedded.allowedUsernames or create the pod as an allowed user",
                ctx.username, req.annotation
            ),
        ))
    }

    fn inject(
        &self,
        req: &SecretRequest,
        ctx: &PodCtx<'_>,
        _pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let s = &req.secret;
        let value = if ctx.dry_run {
            edits.withheld += 1;
            super::embedded::DRY_RUN_PLACEHOLDER.to_owned()
        } else {
            self.source
                .get(&s.group, &s.key)
                .map_err(Refusal::NotFound)?
        };
        // A file can hold a NUL; an environment variable cannot (execve ends it there).
        if value.contains('\0') {
            return Err(Refusal::UnsupportedMount(format!(
                "Global secret {}/{} cannot be an environment variable: its value is not text without NUL bytes (it contains a NUL byte, which an environment variable cannot hold)",
                s.group, s.key
            )));
        }
        let name = flyte_env_name(&self.env_prefix, &s.group, &s.key);
        edits.env(env_value(&name, &value));
        edits.env(env_value(ENV_ENV_PREFIX, &self.env_prefix));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Flyte's `TestGlobalSecrets_Inject` (spec §8).
    use super::*;
    use crate::secrets::testing::{inject_one, json, mk_pod, secret};
    use rstest::rstest;
    use serde_json::json;

    fn global(env: &[(&str, &str)], dir: &str) -> GlobalInjector {
        let cfg = GlobalSecretsConfig {
            secrets_prefix: dir.into(),
            ..Default::default()
        };
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        GlobalInjector {
            env_prefix: "_UNION_".into(),
            allowed_usernames: Vec::new(),
            source: Box::new(FileEnvSource::new(&cfg, env)),
        }
    }

    #[test]
    fn simple() {
        let inj = global(
            &[("FLYTE_SECRET_GROUP_HELLO", "my_password")],
            "/nonexistent",
        );
        let pod = inject_one(
            &inj,
            &[secret("group", "hello", MountRequirement::Any, "")],
            mk_pod(),
        )
        .unwrap();
        assert_eq!(
            json(&pod)["spec"]["containers"][0]["env"],
            json!([
                {"name": "_UNION_GROUP_HELLO", "value": "my_password"},
                {"name": "FLYTE_SECRETS_ENV_PREFIX", "value": "_UNION_"}
            ])
        );
    }

    #[rstest]
    #[case::require_group(
        secret("", "hello", MountRequirement::Any, ""),
        "both key and group are required parameters"
    )]
    #[case::require_file(
        secret("group", "hello", MountRequirement::File, ""),
        "global secrets can only be injected as environment variables [group/hello]"
    )]
    #[case::not_found(
        secret("group", "nope", MountRequirement::EnvVar, ""),
        "not found in env [FLYTE_SECRET_GROUP_NOPE] (no directory /nonexistent to look in)"
    )]
    fn refused(#[case] s: crate::secrets::codec::Secret, #[case] message: &str) {
        let inj = global(
            &[("FLYTE_SECRET_GROUP_HELLO", "my_password")],
            "/nonexistent",
        );
        assert_eq!(inject_one(&inj, &[s], mk_pod()).unwrap_err(), message);
    }

    #[test]
    fn files_are_read_verbatim() {
        let dir = std::env::temp_dir().join(format!("podmutator-global-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("db")).unwrap();
        std::fs::write(dir.join("db/password"), "fake-pw\n").unwrap();
        let inj = global(&[], dir.to_str().unwrap());
        let pod = inject_one(
            &inj,
            &[secret("db", "password", MountRequirement::EnvVar, "")],
            mk_pod(),
        )
        .unwrap();
        assert_eq!(
            json(&pod)["spec"]["containers"][0]["env"][0]["value"],
            "fake-pw\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file can hold a NUL byte, an environment variable cannot: refused, naming the secret
    /// and never the value.
    #[test]
    fn a_file_with_a_nul_byte_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("podmutator-global-nul-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("db")).unwrap();
        std::fs::write(dir.join("db/password"), "hun\0ter2").unwrap();
        let inj = global(&[], dir.to_str().unwrap());
        let err = inject_one(
            &inj,
            &[secret("db", "password", MountRequirement::EnvVar, "")],
            mk_pod(),
        )
        .unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains("db/password") && err.contains("NUL byte"),
            "{err}"
        );
        assert!(!err.contains("ter2"), "{err}");
    }

    #[rstest]
    #[case::dot_dot_group("..", "passwd")]
    #[case::slash_in_key("db", "../../etc/passwd")]
    #[case::absolute_key("db", "/etc/passwd")]
    fn annotations_cannot_read_files_outside_the_secrets_directory(
        #[case] group: &str,
        #[case] key: &str,
    ) {
        let inj = global(&[], "/etc");
        let err = inject_one(
            &inj,
            &[secret(group, key, MountRequirement::EnvVar, "")],
            mk_pod(),
        )
        .unwrap_err();
        assert!(err.contains("must be plain file names"), "{err}");
    }
}
