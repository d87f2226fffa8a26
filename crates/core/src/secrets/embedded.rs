//! The `Embedded` manager with the AWS provider: the webhook itself holds the value (fetched
//! before the chain ran, see [`super::source`]) and writes it into the pod.

use base64::{Engine, engine::general_purpose::STANDARD};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::ResolvedSecrets;
use super::codec::MountRequirement;
use super::refusal::Refusal;
use super::source::Lookup;
use super::{Accept, ENV_ENV_PREFIX, Edits, SECRETS_DIR, SecretInjector, SecretRequest};
use crate::config::{
    EmbeddedConfig, FileMountInitContainer, PLACEHOLDERS, SecretManagerType, TemplatePart,
};
use crate::error::Denial;
use crate::k8s_names::{FILE_NAME_RULE, is_config_map_key};
use crate::mutate::PodCtx;
use crate::mutate::pod::{add_volume, env_value, is_windows, memory_volume, mount, ro_mount};

pub const VOLUME: &str = "embedded-secret-vol";
/// The init container's variable carrying `<key>=<base64 value>` lines.
pub const ENV_SECRETS: &str = "SECRETS";

/// Writes each `<key>=<base64>` line of `$SECRETS` to `/etc/flyte/secrets/<key>`. Flyte's script
/// takes the name with `substr($0, 0, i - 1)`, which GNU awk reads as one character short;
/// position 1 is right in every awk.
pub const FILE_SCRIPT: &str = r#"printf "%s" "$SECRETS" | awk '/^.+=/ { i = index($0, "="); name = substr($0, 1, i - 1); value = substr($0, i + 1); output_file = "/etc/flyte/secrets/" name; print value | "base64 -d > " output_file; }'"#;

/// The user the file writer runs as: any user may write the in-memory volume (an `emptyDir` is
/// 0777), and the files it writes (0644) are readable by every user of the pod.
const FILE_WRITER_USER: i64 = 65532;

/// The file writer's security context: what Pod Security's `restricted` level asks of a
/// container, so that a pod that meets it (or `runAsNonRoot: true` on the pod, with which the
/// kubelet refuses to start an image's root user) still does with the writer added. Union's
/// writer has none, and runs as busybox's root.
fn file_writer_security_context() -> k8s_openapi::api::core::v1::SecurityContext {
    use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile, SecurityContext};
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(FILE_WRITER_USER),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The file writer's command, built in one place: `add_file` gives it and
/// `check_file_writer_name` recognises the writer by it.
fn file_command() -> Vec<String> {
    ["sh", "-c", FILE_SCRIPT].map(String::from).into()
}

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

/// The template `parts` with each placeholder replaced by its value.
fn render(parts: &[TemplatePart], org: &str, project: &str, domain: &str) -> String {
    let values = [org, project, domain];
    parts
        .iter()
        .map(|part| match part {
            TemplatePart::Literal(l) => l,
            TemplatePart::Slot(i) => values[*i],
        })
        .collect()
}

/// One way to read a namespace under the template: the value of each placeholder the template
/// uses (`None` for one it does not use, which the namespace says nothing about).
type Reading<'n> = [Option<&'n str>; 3];

/// A reading as `project="p" domain="d"`, for the message that shows it.
fn describe(reading: &Reading<'_>) -> String {
    let values = PLACEHOLDERS.iter().zip(reading);
    (values.filter_map(|(name, v)| Some(format!("{name}={:?}", (*v)?))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every reading of `namespace` under `template` whose domain is one of `domains` and whose
/// placeholders are non-empty; stops at two, which is enough to call it ambiguous. A
/// namespace is at most 63 bytes and a template has a few placeholders, so the search is small.
/// Borrowed from the namespace: every request's scope check reads it, and only an ambiguous
/// one is described.
fn readings<'n>(
    template: &[TemplatePart],
    namespace: &'n str,
    domains: &[String],
) -> Vec<Reading<'n>> {
    fn walk<'n>(
        parts: &[TemplatePart],
        rest: &'n str,
        bound: &mut Reading<'n>,
        domains: &[String],
        out: &mut Vec<Reading<'n>>,
    ) {
        if out.len() >= 2 {
            return;
        }
        let Some((first, more)) = parts.split_first() else {
            if rest.is_empty() && !out.contains(bound) {
                out.push(*bound);
            }
            return;
        };
        match first {
            TemplatePart::Literal(l) => {
                if let Some(after) = rest.strip_prefix(l.as_str()) {
                    walk(more, after, bound, domains, out);
                }
            }
            TemplatePart::Slot(i) => {
                if let Some(v) = bound[*i] {
                    if let Some(after) = rest.strip_prefix(v) {
                        walk(more, after, bound, domains, out);
                    }
                    return;
                }
                let cuts: Vec<usize> = if *i == 2 {
                    domains
                        .iter()
                        .filter(|d| rest.starts_with(d.as_str()))
                        .map(String::len)
                        .collect()
                } else {
                    (1..=rest.len())
                        .filter(|n| rest.is_char_boundary(*n))
                        .collect()
                };
                for n in cuts {
                    bound[*i] = Some(&rest[..n]);
                    walk(more, &rest[n..], bound, domains, out);
                    bound[*i] = None;
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(template, namespace, &mut [None; 3], domains, &mut out);
    out
}

/// The pod's scope labels `organization`, `project` and `domain`, or the first missing one
/// (checked in Flyte's order).
pub(crate) fn scope(pod: &Pod) -> Result<(&str, &str, &str), &'static str> {
    let get = |k: &'static str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .ok_or(k)
    };
    Ok((get("organization")?, get("project")?, get("domain")?))
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
/// the organisation the webhook serves (`embedded.organization`) and the scope its namespace
/// belongs to (`embedded.namespaceTemplate`), and optionally only for listed users.
pub struct EmbeddedInjector {
    pub env_prefix: String,
    pub file_init: FileMountInitContainer,
    /// `embedded`: the organisation (the only `organization` label a pod may carry; empty,
    /// any), the namespace template and domains, the allowed users and the value limit.
    pub cfg: EmbeddedConfig,
    /// `cfg.namespace_template` cut at its placeholders, once.
    template: Vec<TemplatePart>,
}

/// What a dry run gets instead of a value: `kubectl create --dry-run=server -o yaml` prints the
/// patched pod, and no pod is left behind to answer for having read it.
pub const DRY_RUN_PLACEHOLDER: &str = "<podmutator: value withheld from dry run>";

impl EmbeddedInjector {
    pub fn new(env_prefix: &str, file_init: &FileMountInitContainer, cfg: &EmbeddedConfig) -> Self {
        Self {
            env_prefix: env_prefix.to_owned(),
            file_init: file_init.clone(),
            cfg: cfg.clone(),
            // Checked at load (`embedded.namespaceTemplate`).
            template: crate::config::template_parts(&cfg.namespace_template).unwrap_or_default(),
        }
    }

    /// The scope binding: a 403 when the pod asks for another organisation's or scope's
    /// secrets, or when its namespace could belong to more than one scope.
    pub(crate) fn check_binding(&self, ctx: &PodCtx<'_>, pod: &Pod) -> Result<(), Denial> {
        if !super::user_allowed(&self.cfg.allowed_usernames, ctx.username) {
            return Err(Denial::forbidden(
                "EmbeddedUserNotAllowed",
                format!(
                    "user {:?} may not create pods that read Embedded secrets; add it to embedded.allowedUsernames or create the pod as an allowed user",
                    ctx.username
                ),
            ));
        }
        // A pod without its scope labels forms no id at all (`accepts` refuses it, as Flyte
        // does): there is nothing to bind.
        let Ok((org, project, domain)) = scope(pod) else {
            return Ok(());
        };
        if !self.cfg.organization.is_empty() && org != self.cfg.organization {
            return Err(Denial::forbidden(
                "EmbeddedOrganizationMismatch",
                format!(
                    "pod label organization={org:?} is not embedded.organization {:?}: this webhook serves only that organisation's Embedded secrets; label the pod organization={:?}, or create it in a cluster that serves {org:?}",
                    self.cfg.organization, self.cfg.organization
                ),
            ));
        }
        if self.cfg.namespace_template.is_empty() {
            return Ok(());
        }
        // The labels are one reading of the namespace when they render to it with a
        // configured domain; the search below then tells whether they are the only one.
        let expected = render(&self.template, org, project, domain);
        let domain_known = self.cfg.domains.iter().any(|d| d == domain);
        if expected != ctx.namespace || !domain_known {
            let domain_hint = if domain_known {
                String::new()
            } else {
                format!(
                    " (domain {domain:?} is not one of embedded.domains {:?})",
                    self.cfg.domains
                )
            };
            return Err(Denial::forbidden(
                "EmbeddedScopeMismatch",
                format!(
                    "pod labels organization={org:?} project={project:?} domain={domain:?} belong to namespace {expected:?} (embedded.namespaceTemplate {:?}), not {:?}{domain_hint}; a pod may read only its own project's secrets: create it in {expected:?} or fix its labels",
                    self.cfg.namespace_template, ctx.namespace
                ),
            ));
        }
        let readings = readings(&self.template, ctx.namespace, &self.cfg.domains);
        if readings.len() > 1 {
            return Err(Denial::forbidden(
                "EmbeddedScopeAmbiguous",
                format!(
                    "namespace {:?} reads as {} under embedded.namespaceTemplate {:?} and embedded.domains {:?}, so its pods could claim another project's secrets; remove the domain that makes it ambiguous from embedded.domains, or run the project in a namespace with one reading",
                    ctx.namespace,
                    readings
                        .iter()
                        .map(describe)
                        .collect::<Vec<_>>()
                        .join(" and as "),
                    self.cfg.namespace_template,
                    self.cfg.domains
                ),
            ));
        }
        Ok(())
    }

    /// The variable an ANY or ENV_VAR request is written to.
    pub(crate) fn env_name(&self, s: &super::codec::Secret) -> String {
        if s.env_var.is_empty() {
            format!("{}{}", self.env_prefix, s.key.to_uppercase())
        } else {
            s.env_var.clone()
        }
    }

    /// The value fetched under the first of `ids` (most specific scope first) that exists, with
    /// that id.
    fn fetched<'c, 'i>(
        &self,
        resolved: &'c ResolvedSecrets,
        ids: &'i [String],
    ) -> Result<(&'i str, &'c [u8]), Refusal> {
        let found = ids.iter().find_map(|id| match resolved.get(id) {
            Some(Lookup::Found(v)) => Some(Ok((id, v))),
            Some(Lookup::NotFound) => None,
            Some(Lookup::Exists(_)) | None => Some(Err(Refusal::NotFetched(id.clone()))),
        });
        let Some((id, value)) = found.transpose()? else {
            return Err(Refusal::NotFound(format!(
                "[SecretNotFoundAcrossAllScopes] secret not found across all scopes (looked for {})",
                ids.join(", ")
            )));
        };
        // The limit weighs what is written into the pod, not both of AWS's fields.
        let Some(bytes) = value.bytes() else {
            return Err(Refusal::Empty(id.clone()));
        };
        if bytes.len() > self.cfg.max_value_bytes {
            return Err(Refusal::TooLarge {
                id: id.clone(),
                bytes: bytes.len(),
                max: self.cfg.max_value_bytes,
            });
        }
        Ok((id, bytes))
    }

    /// Takes a request with a key from a pod with its scope labels, if one of the scope's
    /// three names (project, domain, organisation) resolves. Delivered by value, a FILE
    /// request also needs the file writer's name ([`Self::check_file_writer_name`]).
    pub fn accepts_request(&self, req: &SecretRequest, pod: &Pod) -> Result<Accept, Refusal> {
        let key = &req.secret.key;
        if key.is_empty() {
            return Err(Refusal::MissingField(
                "EmbeddedSecretManager requires key to be set".into(),
            ));
        }
        let (org, project, domain) = scope(pod).map_err(Refusal::MissingScopeLabel)?;
        match req.secret.mount_requirement {
            MountRequirement::Any | MountRequirement::EnvVar => {
                super::check_env_name(&self.env_name(&req.secret))?;
            }
            // The key becomes a file name inside a shell pipeline: a Secret key's rule keeps out
            // what could leave the directory or be read by the shell, and over-long names.
            MountRequirement::File if is_config_map_key(key) => {
                if !req.secret.env_var.is_empty() {
                    super::check_env_name(&req.secret.env_var)?;
                }
            }
            MountRequirement::File => {
                return Err(Refusal::BadName(format!(
                    "key {key:?} cannot be a file name: {FILE_NAME_RULE}"
                )));
            }
            MountRequirement::Unknown(n) => return Err(Refusal::UnknownMount(n)),
        }
        Ok(Accept::Fetch(cascade(org, domain, project, key).into()))
    }

    /// The file-mount init container's name is the pod's own only if that container is ours
    /// (from an earlier admission: it runs our script): a container of the pod's under that
    /// name would be given the values and write no file.
    pub fn check_file_writer_name(&self, pod: &Pod) -> Result<(), Refusal> {
        let name = &self.file_init.container_name;
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let ours = |c: &Container| c.command.as_ref() == Some(&file_command());
        let taken = spec.containers.iter().any(|c| c.name == *name)
            || (spec.init_containers.iter().flatten()).any(|c| c.name == *name && !ours(c))
            || (spec.ephemeral_containers.iter().flatten()).any(|c| c.name == *name);
        if taken {
            return Err(Refusal::Conflict(format!(
                "the pod has its own container named {name}, the name of the init container that writes Embedded FILE secrets (webhook.embeddedSecretManagerConfig.fileMountInitContainer.containerName); rename that container"
            )));
        }
        Ok(())
    }

    fn add_file(&self, pod: &mut Pod, key: &str, bytes: &[u8]) {
        let line = format!("{key}={}\n", STANDARD.encode(bytes));
        let spec = pod.spec.get_or_insert_with(Default::default);
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        let name = &self.file_init.container_name;
        let idx = inits
            .iter()
            .position(|c| c.name == *name)
            .unwrap_or_else(|| {
                inits.push(Container {
                    name: name.clone(),
                    image: Some(self.file_init.image.clone()),
                    command: Some(file_command()),
                    resources: Some(self.file_init.resources.clone()),
                    volume_mounts: Some(vec![mount(VOLUME, SECRETS_DIR)]),
                    security_context: Some(file_writer_security_context()),
                    ..Default::default()
                });
                inits.len() - 1
            });
        let env = inits[idx].env.get_or_insert_with(Vec::new);
        let var = env
            .iter()
            .position(|e| e.name == ENV_SECRETS)
            .unwrap_or_else(|| {
                env.push(env_value(ENV_SECRETS, ""));
                env.len() - 1
            });
        let text = env[var].value.get_or_insert_with(String::new);
        // One line per key: a second admission changes nothing, a new value replaces the old.
        let prefix = format!("{key}=");
        let kept = text
            .split_inclusive('\n')
            .filter(|l| !l.starts_with(&prefix));
        *text = kept.chain([line.as_str()]).collect();
        add_volume(&mut spec.volumes, memory_volume(VOLUME));
    }
}

impl SecretInjector for EmbeddedInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::Embedded
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, pod: &Pod) -> Result<Accept, Refusal> {
        let accept = self.accepts_request(req, pod)?;
        if req.secret.mount_requirement == MountRequirement::File {
            // Refused before anything is fetched: the writer is a Linux shell script.
            if is_windows(pod.spec.as_ref()) {
                return Err(Refusal::WindowsPod {
                    via: " as a file",
                    container: self.file_init.container_name.clone(),
                    detail: " (it runs sh, awk and base64)",
                    instead: "request the secret with mount_requirement ENV_VAR (a variable set by value), or from a manager that only adds volumes (K8s)",
                });
            }
            self.check_file_writer_name(pod)?;
        }
        Ok(accept)
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
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let key = &req.secret.key;
        let (org, project, domain) = scope(pod).map_err(Refusal::MissingScopeLabel)?;
        let ids = cascade(org, domain, project, key);
        let (id, bytes) = if ctx.dry_run {
            // Nothing was fetched for a dry run (see `Plan::ids`): the same names and paths,
            // never the value.
            edits.withheld += 1;
            (ids[0].as_str(), DRY_RUN_PLACEHOLDER.as_bytes())
        } else {
            self.fetched(edits.resolved, &ids)?
        };
        match req.secret.mount_requirement {
            MountRequirement::Any | MountRequirement::EnvVar => {
                let text = std::str::from_utf8(bytes).map_err(|_| {
                    Refusal::UnsupportedMount(format!(
                        "secret {key:?} is attempted to be mounted as an environment variable, but has a binary value that is not a valid UTF-8 string; mount as a file instead"
                    ))
                })?;
                // execve ends a variable at its first NUL and runtimes refuse one: the
                // container would start with another value, or not at all.
                if text.contains('\0') {
                    return Err(Refusal::UnsupportedMount(format!(
                        "secret {id} (key {key:?}) is attempted to be mounted as an environment variable, but its value is not UTF-8 text without NUL bytes: it contains a NUL byte, which an environment variable cannot hold; a binary secret can only be mounted as a file (mount_requirement: FILE)"
                    )));
                }
                edits.env(env_value(&self.env_name(&req.secret), text));
                edits.env(env_value(ENV_ENV_PREFIX, &self.env_prefix));
            }
            MountRequirement::File => {
                self.add_file(pod, key, bytes);
                edits.mount(ro_mount(VOLUME, SECRETS_DIR));
                // The file keeps the key's case (Flyte pointed the variable at a lower-cased path
                // that does not exist for mixed-case keys).
                let path = format!("{SECRETS_DIR}/{key}");
                edits.file_secret(&req.secret.env_var, path, VOLUME, key);
            }
            MountRequirement::Unknown(n) => return Err(Refusal::UnknownMount(n)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::template_parts;
    use crate::secrets::source::SecretValue;
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

    /// A pod with the three scope labels, and an Embedded FILE request for `key`.
    fn file_request(key: String) -> (Pod, SecretRequest) {
        let mut pod = Pod::default();
        pod.metadata.labels = Some(
            [("organization", "o"), ("project", "p"), ("domain", "d")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
        );
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: crate::secrets::codec::Secret {
                key,
                mount_requirement: MountRequirement::File,
                ..Default::default()
            },
        };
        (pod, req)
    }

    fn injector() -> EmbeddedInjector {
        EmbeddedInjector::new(
            "_UNION_",
            &FileMountInitContainer::default(),
            &EmbeddedConfig::default(),
        )
    }

    /// A FILE key is a file name in the pod: a Secret key's rule, length included (a name over
    /// 255 bytes would fail the init container's write after the value was fetched).
    #[test]
    fn a_file_key_that_cannot_be_a_file_name_is_refused_before_any_fetch() {
        use crate::mutate::{PodCtx, Route};
        let injector = injector();
        let accepts = |key: String| {
            let (pod, req) = file_request(key);
            injector.accepts(&req, &PodCtx::test(Route::Secrets), &pod)
        };
        assert!(accepts("k".repeat(253)).is_ok());
        for key in ["k".repeat(254), "../k".into(), "a b".into(), "..".into()] {
            let err = accepts(key.clone()).unwrap_err().to_string();
            assert!(
                err.contains("cannot be a file name: at most 253"),
                "{key}: {err}"
            );
        }
    }

    /// The FILE writer is a Linux shell script: a Windows pod's FILE request is refused before
    /// any fetch, naming the container and what to use instead; its env vars (values in the
    /// pod spec) are taken.
    #[test]
    fn a_windows_pods_file_request_is_refused_and_its_env_vars_taken() {
        use crate::mutate::{PodCtx, Route};
        let injector = injector();
        let (mut pod, mut req) = file_request("k".into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            os: Some(k8s_openapi::api::core::v1::PodOS {
                name: "windows".into(),
            }),
            ..Default::default()
        });
        let ctx = PodCtx::test(Route::Secrets);
        let err = injector.accepts(&req, &ctx, &pod).unwrap_err();
        assert!(matches!(err, Refusal::WindowsPod { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(
                "cannot deliver this secret to a Windows pod (spec.os.name: windows) as a file"
            ) && msg.contains(&FileMountInitContainer::default().container_name)
                && msg.contains("mount_requirement ENV_VAR"),
            "{msg}"
        );
        req.secret.mount_requirement = MountRequirement::EnvVar;
        assert!(injector.accepts(&req, &ctx, &pod).is_ok());
    }

    /// A container of the pod's own under the file writer's name would be given `SECRETS` and
    /// write no file: refused before any fetch, naming it. The writer of an earlier admission
    /// (our script) is ours and is added to.
    #[test]
    fn a_container_of_the_pods_under_the_file_writers_name_is_refused() {
        use crate::mutate::{PodCtx, Route};
        let injector = injector();
        let name = FileMountInitContainer::default().container_name;
        let own = Container {
            name: name.clone(),
            image: Some("busybox".into()),
            command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
            ..Default::default()
        };
        let ours = Container {
            command: Some(file_command()),
            ..own.clone()
        };
        let accepts = |init: Option<Container>, app: Option<Container>| {
            let (mut pod, req) = file_request("k".into());
            let spec = pod.spec.get_or_insert_with(Default::default);
            spec.init_containers = init.map(|c| vec![c]);
            spec.containers.extend(app);
            injector.accepts(&req, &PodCtx::test(Route::Secrets), &pod)
        };
        assert!(accepts(None, None).is_ok());
        assert!(accepts(Some(ours), None).is_ok());
        for (init, app) in [(Some(own.clone()), None), (None, Some(own))] {
            let err = accepts(init, app).unwrap_err();
            assert!(matches!(err, Refusal::Conflict(_)), "{err}");
            assert!(
                err.to_string()
                    .contains(&format!("its own container named {name}")),
                "{err}"
            );
        }
    }

    /// `embedded.maxValueBytes` weighs the bytes written into the pod (the string when it is
    /// not empty, else the binary), not the two fields added up.
    #[test]
    fn the_value_limit_weighs_the_bytes_the_pod_gets() {
        let mut injector = injector();
        injector.cfg.max_value_bytes = 4;
        let value = |string: &str, binary: &[u8]| {
            let mut resolved = ResolvedSecrets::default();
            let v = SecretValue {
                string: Some(string.into()),
                binary: Some(binary.into()),
            };
            resolved.merge([("id".to_owned(), Lookup::Found(v))].into());
            injector
                .fetched(&resolved, &["id".to_owned()])
                .map(|(_, bytes)| bytes.to_vec())
        };
        assert_eq!(value("abcd", b"1234").unwrap(), b"abcd");
        assert_eq!(value("", b"1234").unwrap(), b"1234");
        for (string, binary) in [("abcde", &b""[..]), ("", b"12345")] {
            let err = value(string, binary).unwrap_err();
            assert!(matches!(err, Refusal::TooLarge { bytes: 5, .. }), "{err}");
        }
    }

    /// A value with a NUL byte cannot be an environment variable (execve ends the string
    /// there; runtimes refuse it): an ANY or ENV_VAR request for it is refused, naming the
    /// secret's id and never the value. As a FILE it is written as it is.
    #[rstest]
    #[case::env_var(MountRequirement::EnvVar)]
    #[case::any(MountRequirement::Any)]
    fn a_value_with_a_nul_byte_is_no_env_var_but_can_be_a_file(#[case] mount: MountRequirement) {
        use crate::mutate::{PodCtx, Route};
        use crate::secrets::edits::Edits;
        let injector = injector();
        let id = "u__org__o__domain__d__project__p__key__k";
        let mut resolved = ResolvedSecrets::default();
        let v = SecretValue {
            string: Some("hun\0ter2".into()),
            binary: None,
        };
        resolved.merge([(id.to_owned(), Lookup::Found(v))].into());
        let ctx = PodCtx::test(Route::Secrets);
        let inject = |mount: MountRequirement| {
            let (mut pod, mut req) = file_request("k".into());
            req.secret.mount_requirement = mount;
            let mut edits = Edits::new(&resolved);
            injector
                .inject(&req, &ctx, &mut pod, &mut edits)
                .map(|()| pod)
        };
        let err = inject(mount).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Refusal::UnsupportedMount(_)), "{msg}");
        assert!(msg.contains(id), "{msg}");
        assert!(msg.contains("NUL"), "{msg}");
        assert!(!msg.contains("ter2"), "{msg}");
        let pod = inject(MountRequirement::File).expect("a FILE takes any bytes");
        let init = &pod.spec.unwrap().init_containers.unwrap()[0];
        let secrets = init.env.as_ref().unwrap()[0].value.clone().unwrap();
        assert_eq!(secrets, "k=aHVuAHRlcjI=\n");
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
        crate::config::template_parts(t).unwrap();
        assert_eq!(render(&template_parts(t).unwrap(), "o", "p", "d"), expected);
    }

    fn domains(d: &[&str]) -> Vec<String> {
        d.iter().map(|s| s.to_string()).collect()
    }

    #[rstest]
    #[case::flyte_default("{{ project }}-{{ domain }}", "ml-pre-production", &["development", "production"], &["project=\"ml-pre\" domain=\"production\""])]
    #[case::two_readings("{{ project }}-{{ domain }}", "ml-pre-prod", &["prod", "pre-prod"], &["project=\"ml\" domain=\"pre-prod\"", "project=\"ml-pre\" domain=\"prod\""])]
    #[case::unlisted_domain("{{ project }}-{{ domain }}", "ml-pre-prod", &["production"], &[])]
    #[case::domain_first("{{ domain }}-{{ project }}", "prod-ml-pre", &["prod", "pre-prod"], &["project=\"ml-pre\" domain=\"prod\""])]
    #[case::no_separator("{{ project }}{{ domain }}", "mlprod", &["prod"], &["project=\"ml\" domain=\"prod\""])]
    #[case::org_and_project_split_two_ways("{{ organization }}-{{ project }}-{{ domain }}", "a-b-c-prod", &["prod"], &["organization=\"a\" project=\"b-c\" domain=\"prod\"", "organization=\"a-b\" project=\"c\" domain=\"prod\""])]
    #[case::repeated_placeholder("{{ project }}-{{ domain }}-{{ project }}", "ml-prod-ml", &["prod"], &["project=\"ml\" domain=\"prod\""])]
    #[case::empty_project_is_no_reading("{{ project }}-{{ domain }}", "-prod", &["prod"], &[])]
    fn namespaces_are_read_back_under_the_template(
        #[case] t: &str,
        #[case] namespace: &str,
        #[case] d: &[&str],
        #[case] expected: &[&str],
    ) {
        let found = readings(&template_parts(t).unwrap(), namespace, &domains(d));
        assert_eq!(found.iter().map(describe).collect::<Vec<_>>(), expected);
    }

    #[rstest]
    #[case::unknown("{{ tenant }}")]
    #[case::unclosed("{{ project")]
    fn bad_templates_are_rejected(#[case] t: &str) {
        assert!(crate::config::template_parts(t).is_err());
    }
}
