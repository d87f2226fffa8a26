//! Flyte-compatible secret injection: the `secrets` mutator, the request codec, and one
//! injector per secret manager.
//!
//! A pod labelled `inject-flyte-secrets: "true"` carries one `flyte.secrets/s<N>` annotation per
//! secret. Each secret is offered to the enabled managers in order (Global first); the first that
//! can inject it wins. Environment variables and mounts are collected in a [`Plan`] and applied
//! at the end to every container and init container, so that the result does not depend on
//! which container existed when, and a second pass changes nothing.

pub mod codec;
pub mod embedded;
pub mod global;
pub mod k8s;
pub mod sidecar;
pub mod source;
pub mod vault;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, Pod, VolumeMount};

use crate::config::SecretManagerType;
use crate::error::Denial;
use crate::mutate::pod::{add_mounts, containers_mut, put_env_first};
use crate::mutate::{PodCtx, PodMutator};
use codec::{MountRequirement, Secret};
use source::Lookup;

pub const POD_LABEL: &str = "inject-flyte-secrets";
pub const POD_LABEL_VALUE: &str = "true";
/// Where every injector puts secret files (`K8sSecretPathPrefix`).
pub const SECRETS_DIR: &str = "/etc/flyte/secrets";
pub const ENV_DEFAULT_DIR: &str = "FLYTE_SECRETS_DEFAULT_DIR";
pub const ENV_FILE_PREFIX: &str = "FLYTE_SECRETS_FILE_PREFIX";
pub const ENV_ENV_PREFIX: &str = "FLYTE_SECRETS_ENV_PREFIX";

/// Secret values fetched before the chain runs (Embedded mode), keyed by secret id.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResolvedSecrets {
    values: BTreeMap<String, Lookup>,
}

/// Nothing fetched.
pub static NOTHING_RESOLVED: ResolvedSecrets = ResolvedSecrets {
    values: BTreeMap::new(),
};

impl ResolvedSecrets {
    pub fn new(values: BTreeMap<String, Lookup>) -> Self {
        Self { values }
    }

    pub fn get(&self, id: &str) -> Option<&Lookup> {
        self.values.get(id)
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// One decoded `flyte.secrets/s<N>` annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRequest {
    pub index: u32,
    pub annotation: String,
    pub secret: Secret,
}

impl SecretRequest {
    /// Names the request without any value: annotation, group, key and mount requirement.
    pub fn describe(&self) -> String {
        let s = &self.secret;
        let mut out = format!("{} (", self.annotation);
        if !s.group.is_empty() {
            out.push_str(&format!("group {:?}, ", s.group));
        }
        if !s.group_version.is_empty() {
            out.push_str(&format!("group_version {:?}, ", s.group_version));
        }
        out.push_str(&format!(
            "key {:?}, mount {})",
            s.key,
            mount_name(s.mount_requirement)
        ));
        out
    }
}

pub fn mount_name(m: MountRequirement) -> String {
    match m {
        MountRequirement::Any => "ANY".into(),
        MountRequirement::EnvVar => "ENV_VAR".into(),
        MountRequirement::File => "FILE".into(),
        MountRequirement::Unknown(n) => n.to_string(),
    }
}

/// Environment variables and mounts that every (init) container receives, in request order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    env: Vec<EnvVar>,
    env_owner: Vec<String>,
    mounts: Vec<VolumeMount>,
    mount_owner: Vec<String>,
    conflicts: Vec<String>,
    current: String,
}

/// A position in a [`Plan`] to roll back to when an injector fails.
#[derive(Debug, Clone, Copy)]
pub struct PlanMark {
    env: usize,
    mounts: usize,
    conflicts: usize,
}

impl Plan {
    /// Adds `var` unless the same variable is already planned. Two requests that want different
    /// values under one name are a conflict, reported after all requests ran.
    pub fn env(&mut self, var: EnvVar) {
        match self.env.iter().position(|e| e.name == var.name) {
            Some(i) if self.env[i] == var => {}
            Some(i) => self.conflicts.push(format!(
                "{} and {} both set environment variable {}; give one of them a different env_var",
                self.env_owner[i], self.current, var.name
            )),
            None => {
                self.env.push(var);
                self.env_owner.push(self.current.clone());
            }
        }
    }

    /// Adds `m` unless a mount of that volume is already planned. Two different volumes at one
    /// path (say an AWS fetcher's and an Embedded file volume, both at `/etc/flyte/secrets`) would
    /// make the API server reject the pod: that is a conflict, reported after all requests ran.
    pub fn mount(&mut self, m: VolumeMount) {
        if self.mounts.iter().any(|x| x.name == m.name) {
            return;
        }
        if let Some(i) = self
            .mounts
            .iter()
            .position(|x| x.mount_path == m.mount_path)
        {
            self.conflicts.push(format!(
                "{} and {} both need a volume mounted at {} ({:?} and {:?}); request these secrets through one secret manager",
                self.mount_owner[i], self.current, m.mount_path, self.mounts[i].name, m.name
            ));
            return;
        }
        self.mounts.push(m);
        self.mount_owner.push(self.current.clone());
    }

    fn mark(&self) -> PlanMark {
        PlanMark {
            env: self.env.len(),
            mounts: self.mounts.len(),
            conflicts: self.conflicts.len(),
        }
    }

    fn reset(&mut self, mark: PlanMark) {
        self.env.truncate(mark.env);
        self.env_owner.truncate(mark.env);
        self.mounts.truncate(mark.mounts);
        self.mount_owner.truncate(mark.mounts);
        self.conflicts.truncate(mark.conflicts);
    }

    /// Puts the planned variables first in every container (replacing same-name ones) and adds
    /// the planned mounts, skipping containers named in `skip`.
    pub fn apply(&self, pod: &mut Pod, skip: &[String]) {
        let Some(spec) = pod.spec.as_mut() else {
            return;
        };
        for c in containers_mut(spec, skip) {
            put_env_first(&mut c.env, &self.env);
            add_mounts(&mut c.volume_mounts, &self.mounts);
        }
    }
}

/// Turns one secret request into pod changes. Pure. On `Err` (the reason this manager cannot
/// inject the secret, never containing a value) the pod has not been changed.
pub trait SecretInjector: Send + Sync {
    fn kind(&self) -> SecretManagerType;

    /// Whether this manager needs values fetched before the chain (only Embedded does).
    fn fetches(&self) -> bool {
        false
    }

    /// Secret ids whose values this manager needs to inject `req` (fetched before the chain).
    fn prefetch(&self, _req: &SecretRequest, _ctx: &PodCtx<'_>, _pod: &Pod) -> Vec<String> {
        Vec::new()
    }

    /// A refusal that stops the admission outright when this manager is reached for `req`
    /// (e.g. a pod asking for another project's secrets), instead of trying the next manager.
    fn deny(&self, _req: &SecretRequest, _ctx: &PodCtx<'_>, _pod: &Pod) -> Option<Denial> {
        None
    }

    fn inject(
        &self,
        req: &SecretRequest,
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
        plan: &mut Plan,
    ) -> Result<(), String>;
}

/// Reads `flyte.secrets/s<N>` annotations of pods labelled `inject-flyte-secrets: "true"` and
/// asks the enabled managers, in order, to inject each secret.
pub struct SecretsMutator {
    pub injectors: Vec<Box<dyn SecretInjector>>,
    /// Init containers other mutators own (e.g. the mesh gate); secrets never reach them.
    pub skip_containers: Vec<String>,
    /// The pod label (and value) that asks for injection (`secretsSelector`).
    pub selector: (String, String),
}

impl SecretsMutator {
    /// Selected by Flyte's label `inject-flyte-secrets: "true"`.
    pub fn new(injectors: Vec<Box<dyn SecretInjector>>) -> Self {
        Self {
            injectors,
            skip_containers: Vec::new(),
            selector: (POD_LABEL.to_owned(), POD_LABEL_VALUE.to_owned()),
        }
    }

    pub fn selects(&self, pod: &Pod) -> bool {
        let (key, value) = &self.selector;
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value)
    }

    /// The pod's secret requests in index order.
    pub fn requests(pod: &Pod) -> Result<Vec<SecretRequest>, Denial> {
        let Some(annotations) = pod.metadata.annotations.as_ref() else {
            return Ok(Vec::new());
        };
        let decoded = codec::decode_annotations(annotations).map_err(|e| {
            Denial::bad_request(
                "BadSecretAnnotation",
                format!(
                    "failed to unmarshal secrets from pod annotations: {e}; these annotations are written by Flyte from the task's secret requests: re-register the task or remove the annotation"
                ),
            )
        })?;
        Ok(decoded
            .into_iter()
            .map(|d| SecretRequest {
                index: d.index,
                annotation: d.annotation,
                secret: d.secret,
            })
            .collect())
    }
}

impl PodMutator for SecretsMutator {
    fn id(&self) -> &'static str {
        "secrets"
    }

    /// Ids for every request that no manager before the fetching one would take (the earlier
    /// managers are pure, so trying them on a scratch copy answers exactly). Without a fetching
    /// manager this costs nothing.
    fn prefetch(&self, ctx: &PodCtx<'_>, pod: &Pod) -> Vec<String> {
        let Some(fetching) = self.injectors.iter().position(|i| i.fetches()) else {
            return Vec::new();
        };
        if !self.selects(pod) {
            return Vec::new();
        }
        let Ok(requests) = Self::requests(pod) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = Vec::new();
        // One copy for the whole admission: like the real run, each request sees the pod as the
        // requests before it left it.
        let mut scratch: Option<Pod> = None;
        for req in &requests {
            let taken_earlier = self.injectors[..fetching].iter().any(|inj| {
                let scratch = scratch.get_or_insert_with(|| pod.clone());
                inj.inject(req, ctx, scratch, &mut Plan::default()).is_ok()
            });
            if taken_earlier {
                continue;
            }
            for id in self.injectors[fetching].prefetch(req, ctx, pod) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<(), Denial> {
        if !self.selects(pod) {
            return Ok(());
        }
        let requests = Self::requests(pod)?;
        if requests.is_empty() {
            return Ok(());
        }
        let mut plan = Plan::default();
        let mut by = Vec::with_capacity(requests.len());
        for req in &requests {
            plan.current = req.annotation.clone();
            let mut reasons = Vec::new();
            let mut injected = false;
            for inj in &self.injectors {
                if let Some(denial) = inj.deny(req, ctx, pod) {
                    return Err(denial);
                }
                plan.current = format!("{} ({})", req.annotation, inj.kind());
                let mark = plan.mark();
                match inj.inject(req, ctx, pod, &mut plan) {
                    Ok(()) => {
                        injected = true;
                        by.push(inj.kind());
                        break;
                    }
                    Err(reason) => {
                        plan.reset(mark);
                        reasons.push(format!("{}: {reason}", inj.kind()));
                    }
                }
            }
            if !injected {
                return Err(Denial::bad_request(
                    "SecretNotInjected",
                    format!(
                        "none of the secret managers could inject {}: {}",
                        req.describe(),
                        reasons.join("; ")
                    ),
                ));
            }
        }
        if !plan.conflicts.is_empty() {
            return Err(Denial::bad_request(
                "SecretConflict",
                plan.conflicts.join("; "),
            ));
        }
        plan.apply(pod, &self.skip_containers);
        for kind in by {
            ctx.tally.secret_injected(kind);
        }
        Ok(())
    }
}

/// Builders shared by the injectors' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::mutate::Route;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    /// A pod with one container `container1`, like Flyte's injector tests.
    pub fn mk_pod() -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "container1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
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

    /// Runs one injector on `pod` the way the secrets mutator does (plan applied at the end).
    pub fn inject_one(
        inj: &dyn SecretInjector,
        secrets: &[Secret],
        mut pod: Pod,
    ) -> Result<Pod, String> {
        let ctx = PodCtx::test(Route::Secrets);
        let mut plan = Plan::default();
        for (i, s) in secrets.iter().enumerate() {
            let req = SecretRequest {
                index: i as u32,
                annotation: format!("flyte.secrets/s{i}"),
                secret: s.clone(),
            };
            plan.current = req.annotation.clone();
            inj.inject(&req, &ctx, &mut pod, &mut plan)?;
        }
        if !plan.conflicts.is_empty() {
            return Err(plan.conflicts.join("; "));
        }
        plan.apply(&mut pod, &[]);
        Ok(pod)
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
            .mutate(&PodCtx::test(Route::Secrets), &mut pod)
            .map(|()| pod)
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
            .mutate(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap();
        assert_eq!(pod, before);
    }

    #[test]
    fn first_fail_denies_and_leaves_the_pod_unchanged() {
        let global = crate::secrets::global::GlobalInjector {
            env_prefix: "_UNION_".into(),
            source: Box::new(crate::secrets::global::FileEnvSource::new(
                &crate::config::GlobalSecretsConfig::default(),
                Default::default(),
            )),
        };
        let mut pod = flyte_test_pod();
        let before = pod.clone();
        let err = SecretsMutator::new(vec![Box::new(global)])
            .mutate(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
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
        let mut pod = flyte_test_pod();
        let before = pod.clone();
        SecretsMutator::new(vec![Box::new(k8s)])
            .mutate(&PodCtx::test(crate::mutate::Route::Secrets), &mut pod)
            .unwrap();
        assert_ne!(pod, before);
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

    #[test]
    fn a_failed_manager_leaves_nothing_behind_for_the_next_one() {
        // Flyte v1 handed the next injector the nil pod Global returned for a FILE request.
        let global = crate::secrets::global::GlobalInjector {
            env_prefix: "_UNION_".into(),
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
