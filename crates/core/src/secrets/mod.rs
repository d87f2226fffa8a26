//! Flyte-compatible secret injection: the `secrets` mutator, the request codec, and one
//! injector per secret manager.
//!
//! A pod labelled `inject-flyte-secrets: "true"` carries one `flyte.secrets/s<N>` annotation per
//! secret. Each secret is offered to the enabled managers in order (Global first); the first that
//! accepts it wins. The choice is made once, by [`SecretsMutator::plan`], before any value is
//! fetched; [`SecretsMutator::apply`] then injects. Environment variables and mounts are collected
//! in [`Edits`] and applied at the end to every container and init container, so that the result
//! does not depend on which container existed when, and a second pass changes nothing.

pub mod codec;
pub mod edits;
pub mod embedded;
pub mod global;
pub mod k8s;
pub mod names;
pub mod plan;
pub mod refusal;
pub mod sidecar;
pub mod source;
pub mod vault;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::SecretManagerType;
use crate::error::Denial;
use crate::mutate::PodCtx;
use crate::registry::{Entrypoints, ImageQuery};
use codec::MountRequirement;
pub use edits::Edits;
pub use plan::Plan;
pub use refusal::Refusal;
use source::Lookup;

pub use crate::config::{
    DEFAULT_SECRETS_LABEL as POD_LABEL, DEFAULT_SECRETS_LABEL_VALUE as POD_LABEL_VALUE,
};
/// Where every injector puts secret files (`K8sSecretPathPrefix`).
pub const SECRETS_DIR: &str = "/etc/flyte/secrets";
pub const ENV_DEFAULT_DIR: &str = "FLYTE_SECRETS_DEFAULT_DIR";
pub const ENV_FILE_PREFIX: &str = "FLYTE_SECRETS_FILE_PREFIX";
pub const ENV_ENV_PREFIX: &str = "FLYTE_SECRETS_ENV_PREFIX";

/// What was read before the chain runs: secret values or names (Embedded mode), keyed by
/// secret id, and the images' commands reference delivery wraps.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResolvedSecrets {
    values: BTreeMap<String, Lookup>,
    /// The ENTRYPOINT and CMD of the images of containers without `command`.
    pub entrypoints: Entrypoints,
}

/// Nothing fetched.
pub static NOTHING_RESOLVED: ResolvedSecrets = ResolvedSecrets {
    values: BTreeMap::new(),
    entrypoints: Entrypoints::new(),
};

/// [`NOTHING_RESOLVED`], for [`Edits`] with nothing fetched.
impl Default for &ResolvedSecrets {
    fn default() -> Self {
        &NOTHING_RESOLVED
    }
}

impl ResolvedSecrets {
    /// Adds `more`; where both answer an id, a value read beats a bare existence, and any
    /// answer beats none.
    pub fn merge(&mut self, more: BTreeMap<String, Lookup>) {
        for (id, lookup) in more {
            match self.values.get(&id) {
                Some(Lookup::Found(_)) => {}
                Some(Lookup::Exists(_)) if !matches!(lookup, Lookup::Found(_)) => {}
                _ => {
                    self.values.insert(id, lookup);
                }
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<&Lookup> {
        self.values.get(id)
    }
}

/// Whether `username` may get secret values when `allowed` (`embedded.allowedUsernames`) is
/// set: an entry ending in `*` matches a prefix.
pub fn user_allowed(allowed: &[String], username: &str) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => username.starts_with(prefix),
            None => a == username,
        })
}

/// Flyte's variable for a secret of `group` and `key` (Global, and K8s's ENV_VAR):
/// `<prefix><group>_<key>`, upper-cased.
fn flyte_env_name(prefix: &str, group: &str, key: &str) -> String {
    format!("{prefix}{group}_{key}").to_uppercase()
}

/// An environment variable name podmutator is about to write, checked against the API
/// server's rule so that the pod is refused here, naming the rule, not by the API server later
/// (which blames the pod).
pub fn check_env_name(name: &str) -> Result<(), Refusal> {
    if crate::k8s_names::is_env_var_name(name) {
        return Ok(());
    }
    Err(Refusal::BadName(format!(
        "environment variable name {name:?} would be refused by the API server (names are {}); fix the secret's env_var, group or key",
        crate::k8s_names::ENV_VAR_NAME_RULE
    )))
}

/// One decoded `flyte.secrets/s<N>` annotation.
pub use codec::SecretAnnotation as SecretRequest;

impl SecretRequest {
    /// Names the request without any value: annotation, group, key and mount requirement.
    pub fn describe(&self) -> String {
        let s = &self.secret;
        let mut out = format!("{} (", self.annotation);
        for (field, v) in [("group", &s.group), ("group_version", &s.group_version)] {
            if !v.is_empty() {
                out += &format!("{field} {v:?}, ");
            }
        }
        let mount = mount_name(s.mount_requirement);
        out + &format!("key {:?}, mount {mount})", s.key)
    }
}

pub fn mount_name(m: MountRequirement) -> String {
    match m {
        MountRequirement::Unknown(n) => n.to_string(),
        m => m.name().unwrap_or_default().to_owned(),
    }
}

/// Whether a manager takes a request, as decided when the pod is planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accept {
    /// The manager injects it from what it holds.
    Now,
    /// The manager injects it if one of these Secrets Manager ids resolves (in this order);
    /// otherwise the request goes on to the next manager.
    Fetch(Vec<String>),
    /// As `Fetch`, but only whether each id exists (its name and ARN) is read, never its value
    /// (`embedded.delivery: reference`).
    Resolve(Vec<String>),
}

/// Turns one secret request into pod changes. Pure.
///
/// A request meets the managers twice: [`accepts`](Self::accepts) when the pod is planned
/// (before any value is fetched), then [`inject`](Self::inject) for the one chosen.
pub trait SecretInjector: Send + Sync {
    fn kind(&self) -> SecretManagerType;

    /// Whether this manager takes `req`: `Err` says why not (never a value), and the next
    /// manager is asked.
    fn accepts(&self, req: &SecretRequest, ctx: &PodCtx<'_>, pod: &Pod) -> Result<Accept, Refusal>;

    /// A refusal that stops the admission outright when this manager is reached for `req`
    /// (e.g. a pod asking for another project's secrets), instead of trying the next manager.
    fn deny(&self, _req: &SecretRequest, _ctx: &PodCtx<'_>, _pod: &Pod) -> Option<Denial> {
        None
    }

    /// The images whose ENTRYPOINT and CMD must be read from their registry before `req` can
    /// be injected (containers without `command` that reference delivery wraps). Asked only
    /// of a manager that accepted `req` and did not deny it.
    fn images(&self, _req: &SecretRequest, _pod: &Pod) -> Vec<ImageQuery> {
        Vec::new()
    }

    /// Injects an accepted request. `Err` (the reason, never a value) leaves `pod` unchanged
    /// and hands the request to the next manager that accepted it; for a manager that accepted
    /// with [`Accept::Now`] there is none, so the pod is denied with that reason.
    fn inject(
        &self,
        req: &SecretRequest,
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal>;

    /// Whether an injected request writes into every container (an env var or a mount in
    /// each), so that the reply grows with containers × requests: `false` for a manager that
    /// writes pod-level fields only (Vault's annotations). What the reply's size is estimated
    /// from before the patch is built ([`SecretsMutator::reply_estimate`]).
    fn writes_every_container(&self) -> bool {
        true
    }
}

/// Reads `flyte.secrets/s<N>` annotations of pods labelled `inject-flyte-secrets: "true"` and
/// asks the enabled managers, in order, to inject each secret.
pub struct SecretsMutator {
    pub injectors: Vec<Box<dyn SecretInjector>>,
    /// Init containers other mutators own (e.g. the mesh gate); secrets never reach them.
    pub skip_containers: Vec<String>,
    /// The pod label (and value) that asks for injection (`secretsSelector`).
    pub selector: (String, String),
    /// What one pod may ask for (`limits`), checked when it is planned.
    pub limits: crate::config::LimitsConfig,
}

impl SecretsMutator {
    /// Selected by Flyte's label `inject-flyte-secrets: "true"`.
    pub fn new(injectors: Vec<Box<dyn SecretInjector>>) -> Self {
        Self {
            injectors,
            skip_containers: Vec::new(),
            selector: (POD_LABEL.to_owned(), POD_LABEL_VALUE.to_owned()),
            limits: crate::config::LimitsConfig::default(),
        }
    }

    /// Whether the pod whose metadata is `meta` carries the selector label.
    pub fn selects(&self, meta: &ObjectMeta) -> bool {
        let (key, value) = &self.selector;
        meta.labels
            .as_ref()
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value)
    }

    /// The pod's secret requests in index order.
    pub fn requests(pod: &Pod) -> Result<Vec<SecretRequest>, Denial> {
        codec::decode_annotations(pod.metadata.annotations.iter().flatten()).map_err(|e| {
            Denial::bad_request(
                "BadSecretAnnotation",
                format!(
                    "failed to unmarshal secrets from pod annotations: {e}; these annotations are written by Flyte from the task's secret requests: re-register the task or remove the annotation"
                ),
            )
        })
    }
}

/// Builders shared by the injectors' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::mutate::Route;
    use codec::Secret;
    use k8s_openapi::api::core::v1::Container;

    /// A pod with one container `container1`, like Flyte's injector tests.
    pub fn mk_pod() -> Pod {
        let mut pod = crate::mutate::pod::testing::mk_pod()
            .app(Container {
                name: "container1".into(),
                ..Default::default()
            })
            .build();
        pod.metadata.name = None;
        pod
    }

    pub fn secret(group: &str, key: &str, mount: MountRequirement, env_var: &str) -> Secret {
        Secret {
            group: group.into(),
            key: key.into(),
            mount_requirement: mount,
            env_var: env_var.into(),
            ..Default::default()
        }
    }

    /// Runs one injector on `pod` the way the secrets mutator does: accepted, injected, the
    /// edits applied at the end.
    pub fn inject_one(
        inj: &dyn SecretInjector,
        secrets: &[Secret],
        mut pod: Pod,
    ) -> Result<Pod, String> {
        let ctx = PodCtx::test(Route::Secrets);
        let mut edits = Edits::default();
        for (i, s) in secrets.iter().enumerate() {
            let req = SecretRequest {
                index: i as u32,
                annotation: format!("flyte.secrets/s{i}"),
                secret: s.clone(),
            };
            edits.current = req.annotation.clone();
            accept_and_inject(inj, &req, &ctx, &mut pod, &mut edits).map_err(|e| e.to_string())?;
        }
        if !edits.conflicts.is_empty() {
            return Err(edits.conflicts.join("; "));
        }
        edits.apply(&mut pod, &[]);
        Ok(pod)
    }

    /// `accepts`, then `inject` when accepted: one manager's whole say on one request.
    pub fn accept_and_inject(
        inj: &dyn SecretInjector,
        req: &SecretRequest,
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        inj.accepts(req, ctx, pod)?;
        inj.inject(req, ctx, pod, edits)
    }

    /// Admits `pod`, labelled and annotated with `secrets`, through the real `secrets` mutator
    /// with `injectors` enabled.
    pub fn admit(
        injectors: Vec<Box<dyn SecretInjector>>,
        secrets: &[Secret],
        mut pod: Pod,
    ) -> Result<Pod, Denial> {
        pod.metadata.labels = Some([(POD_LABEL.to_owned(), POD_LABEL_VALUE.to_owned())].into());
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend(codec::encode_annotations(secrets).unwrap());
        SecretsMutator::new(injectors)
            .plan_and_apply(&PodCtx::test(Route::Secrets), &mut pod)
            .map(|_| pod)
    }

    /// The pod as JSON, for compact expectations.
    pub fn json(pod: &Pod) -> serde_json::Value {
        serde_json::to_value(pod).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::config::SidecarConfig;
    use crate::secrets::sidecar::{Provider, SidecarInjector};
    use codec::Secret;

    fn run(injectors: Vec<Box<dyn SecretInjector>>, secrets: &[Secret]) -> Result<Pod, Denial> {
        admit(injectors, secrets, mk_pod())
    }

    // Flyte's TestSecretsWebhook_Mutate, with its annotation `nnsxsorcnv4v623fperca` (spec §1.3).
    fn flyte_test_pod() -> Pod {
        let mut pod = mk_pod();
        pod.metadata.labels = Some([(POD_LABEL.to_owned(), POD_LABEL_VALUE.to_owned())].into());
        pod.metadata.annotations = Some(
            [(
                "flyte.secrets/s0".to_owned(),
                "nnsxsorcnv4v623fperca".to_owned(),
            )]
            .into(),
        );
        pod
    }

    #[test]
    fn no_injectors_and_no_annotations_change_nothing() {
        let mut pod = mk_pod();
        pod.metadata.labels = Some([(POD_LABEL.to_owned(), POD_LABEL_VALUE.to_owned())].into());
        let before = pod.clone();
        SecretsMutator::new(vec![])
            .plan_and_apply(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap();
        assert_eq!(pod, before);
    }

    /// Before its plan, the secrets member applies to the pods it selects; once the admission
    /// has prepared the plan, where the plan holds something: to a pod that asks for a secret
    /// (injected or refused), not to one without the label or one that asks for none.
    #[test]
    fn applies_only_where_the_plan_holds_something() {
        use crate::mutate::PodMutator;
        let m = SecretsMutator::new(vec![Box::new(crate::secrets::k8s::K8sInjector {
            env_prefix: "_UNION_".into(),
        })]);
        let ctx = PodCtx::test(crate::mutate::Route::Secrets);
        let applies = |pod: &Pod| {
            let prepared = plan::Prepared {
                plan: m.plan(&ctx, pod),
                resolved: ResolvedSecrets::default(),
            };
            let planned = PodCtx {
                prepared: Some(&prepared),
                ..ctx
            };
            (
                m.applies(&ctx, &pod.metadata),
                m.applies(&planned, &pod.metadata),
            )
        };
        let mut asks = flyte_test_pod();
        asks.metadata.annotations = Some(
            codec::encode_annotations(&[secret("g", "k", MountRequirement::Any, "")]).unwrap(),
        );
        assert_eq!(applies(&asks), (true, true));
        assert_eq!(
            applies(&flyte_test_pod()),
            (true, true),
            "refused, so it applies"
        );
        let mut no_label = asks.clone();
        no_label.metadata.labels = None;
        assert_eq!(applies(&no_label), (false, false));
        let mut asks_none = asks.clone();
        asks_none.metadata.annotations = None;
        assert_eq!(applies(&asks_none), (true, false));
    }

    #[test]
    fn first_fail_denies_and_leaves_the_pod_unchanged() {
        let global = crate::secrets::global::GlobalInjector {
            env_prefix: "_UNION_".into(),
            allowed_usernames: Vec::new(),
            source: Box::new(crate::secrets::global::FileEnvSource::new(
                &crate::config::GlobalSecretsConfig::default(),
                Default::default(),
            )),
        };
        let mut pod = flyte_test_pod();
        let before = pod.clone();
        let err = SecretsMutator::new(vec![Box::new(global)])
            .plan_and_apply(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap_err();
        assert_eq!(err.reason, "SecretNotInjected");
        assert!(
            err.message
                .contains("Global: both key and group are required parameters")
        );
        assert_eq!(pod, before);
    }

    #[test]
    fn added_when_an_injector_succeeds() {
        let k8s = crate::secrets::k8s::K8sInjector {
            env_prefix: "_UNION_".into(),
        };
        // Flyte's test vector, with a key a Kubernetes Secret can hold (see below).
        let mut pod = flyte_test_pod();
        pod.metadata.annotations = Some(
            codec::encode_annotations(&[secret("g", "k", MountRequirement::Any, "")]).unwrap(),
        );
        let before = pod.clone();
        SecretsMutator::new(vec![Box::new(k8s)])
            .plan_and_apply(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap();
        assert_ne!(pod, before);
    }

    /// Flyte's vector `nnsxsorcnv4v623fperca` decodes to a key with bytes no Kubernetes Secret
    /// key may hold: K8s refuses it, naming the annotation and the rule, and the pod is
    /// unchanged.
    #[test]
    fn flytes_test_vector_names_no_secret_key_and_is_refused() {
        let k8s = crate::secrets::k8s::K8sInjector {
            env_prefix: "_UNION_".into(),
        };
        let mut pod = flyte_test_pod();
        let before = pod.clone();
        let err = SecretsMutator::new(vec![Box::new(k8s)])
            .plan_and_apply(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap_err();
        assert_eq!((err.code, err.reason), (400, "SecretNotInjected"));
        assert!(err.message.contains("flyte.secrets/s0"), "{}", err.message);
        assert!(err.message.contains(names::K8S_KEY_RULE), "{}", err.message);
        assert_eq!(pod, before);
    }

    #[test]
    fn two_managers_that_mount_the_same_path_are_refused_not_admitted_invalid() {
        // Flyte dedupes mounts by volume name only, and the API server then rejects the pod
        // for a duplicate mountPath.
        let mut gcp = secret("TestSecret", "", MountRequirement::File, "");
        gcp.group_version = "2".into();
        let err = run(
            vec![
                Box::new(SidecarInjector::new(
                    Provider::Aws,
                    &SidecarConfig::default(),
                )),
                Box::new(SidecarInjector::new(
                    Provider::Gcp,
                    &SidecarConfig::default(),
                )),
            ],
            &[
                secret(
                    "arn:aws:secretsmanager:us-east-1:1:secret:",
                    "db-AbCdEf",
                    MountRequirement::File,
                    "",
                ),
                gcp,
            ],
        )
        .unwrap_err();
        assert_eq!(err.reason, "SecretConflict");
        assert!(
            err.message.contains("flyte.secrets/s0 (AWS) and flyte.secrets/s1 (GCP) both need a volume mounted at /etc/flyte/secrets"),
            "{}",
            err.message
        );
    }

    fn sidecar(provider: Provider) -> Box<dyn SecretInjector> {
        Box::new(SidecarInjector::new(provider, &SidecarConfig::default()))
    }

    fn k8s() -> Box<dyn SecretInjector> {
        Box::new(crate::secrets::k8s::K8sInjector {
            env_prefix: "_UNION_".into(),
        })
    }

    fn file(group: &str, version: &str) -> Secret {
        let mut s = secret(group, "", MountRequirement::File, "");
        s.group_version = version.into();
        s
    }

    /// Files no container would read as asked: two secrets written to one path, a file inside
    /// another, and a file another manager's mount hides (each admitted before, and each a
    /// secret served under another's name or a fetcher that fails).
    #[test]
    fn files_that_one_secret_would_hide_or_overwrite_in_another_are_refused() {
        let vault = |host: &str| format!("https://{host}.vault.azure.net/secrets/db-password");
        type Case = (Vec<Box<dyn SecretInjector>>, Vec<Secret>, &'static str);
        let cases: [Case; 4] = [
            (
                vec![sidecar(Provider::Azure)],
                vec![file(&vault("team"), ""), file(&vault("shared"), "")],
                "flyte.secrets/s0 (Azure) and flyte.secrets/s1 (Azure) both write /etc/flyte/secrets/db-password, with different secrets",
            ),
            (
                vec![sidecar(Provider::Aws)],
                vec![
                    secret(
                        "arn:aws:secretsmanager:us-east-1:1:secret:",
                        "Db-AbCdEf",
                        MountRequirement::File,
                        "",
                    ),
                    secret(
                        "arn:aws:secretsmanager:us-east-1:1:secret:",
                        "db-abcdef",
                        MountRequirement::File,
                        "",
                    ),
                ],
                "both write /etc/flyte/secrets/",
            ),
            (
                vec![sidecar(Provider::Azure)],
                vec![file(&vault("team"), ""), file(&vault("team"), "abc123")],
                "flyte.secrets/s0 (Azure) writes the file /etc/flyte/secrets/db-password and flyte.secrets/s1 (Azure) a file inside it, /etc/flyte/secrets/db-password/abc123",
            ),
            (
                vec![k8s(), sidecar(Provider::Gcp)],
                vec![
                    secret("db", "password", MountRequirement::File, ""),
                    // The K8s manager takes no version: GCP does.
                    file("db", "1"),
                ],
                "flyte.secrets/s1 (GCP) reads /etc/flyte/secrets/db/1 from volume \"gcp-secret-vol\", but flyte.secrets/s0 (K8s) mounts volume",
            ),
        ];
        for (injectors, secrets, wanted) in cases {
            let err = run(injectors, &secrets).unwrap_err();
            assert_eq!(err.reason, "SecretConflict", "{}", err.message);
            assert!(err.message.contains(wanted), "{wanted}: {}", err.message);
        }
        // The same secret asked for twice is one file, and Key Vault's names are one secret
        // whatever their case.
        let twice = [file(&vault("team"), ""), file(&vault("team"), "")];
        run(vec![sidecar(Provider::Azure)], &twice).unwrap();
        let cased = [
            file(&vault("team"), ""),
            file(&vault("TEAM").replace("db-p", "DB-P"), ""),
        ];
        run(vec![sidecar(Provider::Azure)], &cased).unwrap();
        let group = [
            secret("db", "password", MountRequirement::File, ""),
            secret("db", "user", MountRequirement::File, ""),
        ];
        run(vec![k8s()], &group).unwrap();
    }

    /// The API server refuses two mounts at one path: a pod that already mounts its own volume
    /// where a manager mounts its one is refused, naming the container's mount. Its volume
    /// under a fetcher's volume name is refused too (the secret would go to that volume).
    #[test]
    fn a_pods_own_mount_or_volume_in_a_managers_place_is_refused() {
        let aws = || {
            vec![secret(
                "arn:aws:secretsmanager:us-east-1:1:secret:",
                "db-AbCdEf",
                MountRequirement::File,
                "",
            )]
        };
        let mut pod = mk_pod();
        pod.spec.as_mut().unwrap().containers[0].volume_mounts =
            Some(vec![crate::mutate::pod::mount("shared", SECRETS_DIR)]);
        let err = admit(vec![sidecar(Provider::Aws)], &aws(), pod).unwrap_err();
        assert_eq!(err.reason, "SecretConflict", "{}", err.message);
        assert!(
            err.message.contains("mounts volume \"aws-secret-vol\" at /etc/flyte/secrets, where container \"container1\" already mounts its volume \"shared\""),
            "{}",
            err.message
        );

        let mut pod = mk_pod();
        pod.spec.as_mut().unwrap().volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "aws-secret-vol".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }]);
        let before = pod.clone();
        let err = admit(vec![sidecar(Provider::Aws)], &aws(), pod.clone()).unwrap_err();
        assert!(
            err.message.contains(
                "the pod has a volume named \"aws-secret-vol\" that is not the in-memory volume"
            ),
            "{}",
            err.message
        );
        // Its own output, admitted again, is not refused: the volume and mount are ours.
        let once = admit(vec![sidecar(Provider::Aws)], &aws(), mk_pod()).unwrap();
        let twice = admit(vec![sidecar(Provider::Aws)], &aws(), once.clone()).unwrap();
        assert_eq!(json(&once), json(&twice));
        assert_ne!(json(&once), json(&before));
    }

    /// A container's own mount below a manager's volume and at or above a secret's file hides
    /// the file from that container: refused, naming the mount and the file. A mount above
    /// the manager's volume, or beside the file, hides nothing.
    #[test]
    fn a_pods_own_mount_over_a_secrets_file_is_refused() {
        let files = || vec![secret("db", "password", MountRequirement::File, "")];
        let with_mount = |path: &str| {
            let mut pod = mk_pod();
            pod.spec.as_mut().unwrap().containers[0].volume_mounts =
                Some(vec![crate::mutate::pod::mount("cfg", path)]);
            pod
        };
        // The K8s manager mounts the Secret at /etc/flyte/secrets/db.
        for path in [
            "/etc/flyte/secrets/db/password",
            "/etc/flyte/secrets/db/password/",
        ] {
            let err = admit(vec![k8s()], &files(), with_mount(path)).unwrap_err();
            assert_eq!(err.reason, "SecretConflict", "{}", err.message);
            assert!(
                err.message.contains(&format!("container \"container1\" mounts its volume \"cfg\" at {path}, which hides /etc/flyte/secrets/db/password, where flyte.secrets/s0 (K8s) puts the secret")),
                "{}",
                err.message
            );
        }
        let beside = ["/etc/flyte/secrets/db/other", "/etc/flyte/secrets/dbx"];
        for path in ["/etc", "/etc/flyte/secrets"].into_iter().chain(beside) {
            admit(vec![k8s()], &files(), with_mount(path)).unwrap();
        }
    }

    #[test]
    fn a_failed_manager_leaves_nothing_behind_for_the_next_one() {
        // Flyte v1 handed the next injector the nil pod Global returned for a FILE request.
        let global = crate::secrets::global::GlobalInjector {
            env_prefix: "_UNION_".into(),
            allowed_usernames: Vec::new(),
            source: Box::new(crate::secrets::global::FileEnvSource::new(
                &crate::config::GlobalSecretsConfig::default(),
                [("FLYTE_SECRET_G_K".to_owned(), "fake-global".to_owned())].into(),
            )),
        };
        let k8s = crate::secrets::k8s::K8sInjector {
            env_prefix: "_UNION_".into(),
        };
        let pod = run(
            vec![Box::new(global), Box::new(k8s)],
            &[secret("g", "k", MountRequirement::File, "")],
        )
        .unwrap();
        let text = serde_json::to_string(&pod).unwrap();
        assert!(!text.contains("fake-global"));
        assert!(text.contains("\"secretName\":\"g\""));
    }
}
