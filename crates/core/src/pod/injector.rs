//! The webhook's half of reference delivery (`embedded.delivery: reference`): the Embedded
//! manager, but the pod spec gets where each secret is, never what it is.
//!
//! For a pod's requests the patch adds:
//! - one init container, [`INIT_CONTAINER`] (`embedded.fetcherImage`, `podmutator fetch`), whose
//!   [`FETCH_PLAN_ENV`] lists each resolved secret name and the file it goes to. It mounts the
//!   in-memory volumes it writes, and runs before every other init container but the ones
//!   another mutator owns (the mesh gate);
//! - FILE requests (and ANY requests without an `env_var`): the file on the in-memory volume
//!   [`FILES_VOLUME`], mounted read-only at `/etc/flyte/secrets` in every container, at the
//!   path the SDKs read ([`file_path`]);
//! - ENV_VAR requests (and ANY requests naming an `env_var`), with `envVarDelivery: exec`: the
//!   value's file on a second in-memory volume, [`RUN_VOLUME`], with a copy of the podmutator
//!   executable; each container's `command` becomes `/podmutator/bin/podmutator exec --
//!   <command>`, and its [`EXEC_ENV_ENV`] maps each variable to its file. That volume is
//!   mounted, read-only, only in the wrapped containers. A wrapped command is never wrapped
//!   again, so a second admission of the patched pod changes nothing.
//!
//! A container without `command` runs its image's ENTRYPOINT, which the pod spec does not
//! show. With `embedded.entrypointLookup`, the admission reads the image's ENTRYPOINT and CMD
//! from its registry first ([`crate::registry`]); the wrapped command is then
//! `podmutator exec -- <ENTRYPOINT>`, and `args` the container's own, else the image's CMD
//! (Kubernetes ignores CMD once `command` is set). An image on a registry the configuration
//! does not list is never looked up: the pod is refused naming the container, the image and
//! the fixes, as it is when the lookup is off or fails.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, SecurityContext, VolumeMount};

use super::exec::{EXEC_ENV_ENV, ExecPlan};
use super::plan::{FETCH_PLAN_ENV, FetchItem, FetchPlan};
use crate::config::{
    EmbeddedConfig, EntrypointLookupConfig, EnvVarDelivery, FetchStrategy,
    SECRET_MANAGER_CONTAINER_PREFIXES, SecretManagerType,
};
use crate::error::Denial;
use crate::image_ref::{ImageRef, is_ours_or_pinned};
use crate::k8s_names::{FILE_NAME_RULE, is_config_map_key};
use crate::mutate::PodCtx;
use crate::mutate::pod::{
    add_missing_env, add_mounts, add_volume, env_value, is_under, is_windows, memory_volume, mount,
    only_tightens, ro_mount,
};
use crate::registry::{ImageQuery, pinned_arch};
use crate::secrets::codec::{MountRequirement, Secret};
use crate::secrets::embedded::{EmbeddedInjector, cascade, scope};
use crate::secrets::{
    Accept, ENV_ENV_PREFIX, Edits, Refusal, SECRETS_DIR, SecretInjector, SecretRequest,
    check_env_name,
};

/// The fetcher's init container.
pub const INIT_CONTAINER: &str = "podmutator-fetch";
/// In-memory volume of the secret files, read-only at `/etc/flyte/secrets` in every container.
pub const FILES_VOLUME: &str = "podmutator-secret-files";
/// In-memory volume of the executable and the env-var files, read-only at [`RUN_DIR`] in the
/// wrapped containers only.
pub const RUN_VOLUME: &str = "podmutator-run";
/// The plan's root in the init container (the image keeps its executable at `/podmutator`).
pub const INIT_ROOT: &str = "/podmutator-init";
const INIT_FILES: &str = "/podmutator-init/files";
const INIT_RUN: &str = "/podmutator-init/run";
/// Where wrapped containers see [`RUN_VOLUME`].
pub const RUN_DIR: &str = "/podmutator";
/// The executable the wrapped command starts with.
pub const EXECUTABLE: &str = "/podmutator/bin/podmutator";

/// A wrapped container's new `command`, and its new `args` when the image's CMD stands in
/// for them.
type Wrapping = (Vec<String>, Option<Vec<String>>);

/// How one request reaches the container.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// A file below `/etc/flyte/secrets`, at this relative path.
    File(String),
    /// An environment variable set by `podmutator exec`.
    Exec(String),
    /// Flyte's behaviour (`envVarDelivery: value`): the value in the pod spec.
    Value,
}

/// The file the SDKs read for `s`, relative to `/etc/flyte/secrets`:
/// - FILE: `<key>`, as Flyte's Embedded manager writes it (and value delivery here);
/// - ANY: flytekit's `SecretsManager.get_secrets_file`: `<group>/[<group_version>/]<key>`, each
///   part lower-cased, empty parts left out (with `FLYTE_SECRETS_FILE_PREFIX` empty).
pub fn file_path(s: &Secret) -> Result<String, Refusal> {
    let parts: Vec<String> = match s.mount_requirement {
        MountRequirement::File => vec![s.key.clone()],
        _ => [&s.group, &s.group_version, &s.key]
            .into_iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.to_lowercase())
            .collect(),
    };
    match parts.iter().find(|p| !is_config_map_key(p)) {
        Some(bad) => Err(Refusal::BadName(format!(
            "{bad:?} cannot be part of a file name: {FILE_NAME_RULE}"
        ))),
        None => Ok(parts.join("/")),
    }
}

/// The Embedded manager in reference delivery. Scope checks are the value manager's.
pub struct ReferenceInjector {
    base: EmbeddedInjector,
    env_var_delivery: EnvVarDelivery,
    image: String,
    region: String,
    /// `embedded.fetchStrategy`, for the pod's fetch too.
    fetch_strategy: FetchStrategy,
    /// Init containers another mutator owns: neither wrapped nor given secrets.
    skip: Vec<String>,
    /// Which registries the ENTRYPOINT of a container without `command` may be read from.
    lookup: EntrypointLookupConfig,
    /// The images a fetcher of ours may carry when the pod comes back: `image`, and what the
    /// other entries rewrite it to ([`ReferenceInjector::rewritten_to`]).
    images: Vec<String>,
}

impl ReferenceInjector {
    pub fn new(
        base: EmbeddedInjector,
        cfg: &EmbeddedConfig,
        region: &str,
        skip_containers: &[String],
    ) -> Self {
        Self {
            base,
            env_var_delivery: cfg.env_var_delivery,
            image: cfg.fetcher_image.clone(),
            region: region.to_owned(),
            fetch_strategy: cfg.fetch_strategy,
            skip: skip_containers.to_vec(),
            lookup: cfg.entrypoint_lookup.clone(),
            images: vec![cfg.fetcher_image.clone()],
        }
    }

    /// Also takes a fetcher whose image another entry rewrote to one of `images`, when the pod
    /// comes back for another pass.
    pub fn rewritten_to(mut self, images: impl IntoIterator<Item = String>) -> Self {
        self.images.extend(images);
        self
    }

    /// The variable `req` sets through `podmutator exec`, if it is served that way (and its
    /// pod could be scoped at all).
    fn exec_var(&self, req: &SecretRequest, pod: &Pod) -> Option<String> {
        if req.secret.key.is_empty() || scope(pod).is_err() {
            return None;
        }
        match self.route(&req.secret) {
            Ok(Route::Exec(var)) => Some(var),
            _ => None,
        }
    }

    /// Why the ENTRYPOINT of `c` (a container without `command`) cannot be read, naming the
    /// container and its image; `None` when it may be looked up. An image on an unlisted
    /// registry is refused here, before any connection.
    fn unreadable(&self, c: &Container) -> Option<String> {
        let name = &c.name;
        let Some(image) = c.image.as_deref().filter(|i| !i.is_empty()) else {
            return Some(format!("container {name:?} has neither command nor image"));
        };
        if !self.lookup.enabled() {
            return Some(format!(
                "container {name:?} has no command, and its image's ENTRYPOINT is not looked up (embedded.entrypointLookup.registries is empty; list the registry of {image:?} there to read it)"
            ));
        }
        match ImageRef::parse(image) {
            Err(e) => Some(format!(
                "container {name:?} has no command, and its image {image:?} {e}"
            )),
            Ok(r) if !self.lookup.allows(&r.registry) => Some(format!(
                "container {name:?} has no command, and its image {image:?} is on registry {:?}, which embedded.entrypointLookup.registries does not list (add it there if the webhook may ask that registry for the image's ENTRYPOINT)",
                r.registry
            )),
            Ok(_) => None,
        }
    }

    /// The command (and `args`, when the image's CMD stands in for them) that wraps `c`; `None`
    /// when `c` is already wrapped.
    fn wrapping(
        &self,
        c: &Container,
        arch: &Option<String>,
        resolved: &crate::secrets::ResolvedSecrets,
    ) -> Result<Option<Wrapping>, Refusal> {
        if is_wrapped(c) {
            return Ok(None);
        }
        let mut command = vec![EXECUTABLE.to_owned(), "exec".into(), "--".into()];
        if let Some(own) = c.command.as_ref().filter(|c| !c.is_empty()) {
            command.extend(own.iter().cloned());
            return Ok(Some((command, None)));
        }
        let image = c.image.clone().unwrap_or_default();
        let fix = "set the container's `command` (its image's ENTRYPOINT, followed by what `args` needs), or request the secret with mount_requirement FILE";
        let query = ImageQuery {
            image: image.clone(),
            arch: arch.clone(),
        };
        let found = match resolved.entrypoints.get(&query) {
            Some(Ok(found)) => found,
            Some(Err(why)) => {
                return Err(Refusal::Entrypoint(format!(
                    "container {:?} has no command, and the ENTRYPOINT of its image {image:?} could not be read from the registry: {why}; {fix}",
                    c.name
                )));
            }
            None => {
                return Err(Refusal::Entrypoint(format!(
                    "container {:?} has no command, and its image {image:?} was not looked up; {fix}",
                    c.name
                )));
            }
        };
        let own_args = c.args.as_ref().filter(|a| !a.is_empty());
        if found.entrypoint.is_empty() && own_args.is_none() && found.cmd.is_empty() {
            return Err(Refusal::Entrypoint(format!(
                "container {:?} has no command, no args, and its image {image:?} has neither ENTRYPOINT nor CMD: there is nothing to run; {fix}",
                c.name
            )));
        }
        command.extend(found.entrypoint.iter().cloned());
        // Kubernetes ignores the image's CMD once `command` is set: it moves to `args`.
        let args = (own_args.is_none() && !found.cmd.is_empty()).then(|| found.cmd.clone());
        Ok(Some((command, args)))
    }

    fn route(&self, s: &Secret) -> Result<Route, Refusal> {
        let env = |name: String| match self.env_var_delivery {
            EnvVarDelivery::Value => Ok(Route::Value),
            EnvVarDelivery::Exec => {
                check_env_name(&name)?;
                if name == EXEC_ENV_ENV || !is_config_map_key(&name) {
                    return Err(Refusal::BadName(format!(
                        "environment variable {name:?} cannot be set by podmutator exec; choose another env_var"
                    )));
                }
                Ok(Route::Exec(name))
            }
        };
        match s.mount_requirement {
            MountRequirement::File => file_path(s).map(Route::File),
            MountRequirement::Any if s.env_var.is_empty() => file_path(s).map(Route::File),
            MountRequirement::Any | MountRequirement::EnvVar => env(self.base.env_name(s)),
            MountRequirement::Unknown(n) => Err(Refusal::UnknownMount(n)),
        }
    }

    /// The containers an exec request wraps: every container and init container but the
    /// fetcher, a cloud manager's fetcher (added before or after this request, or by an
    /// earlier pass) and those another mutator owns.
    fn wrapped<'a>(&'a self, spec: &'a mut PodSpec) -> impl Iterator<Item = &'a mut Container> {
        let ours = |name: &str| {
            name == INIT_CONTAINER
                || SECRET_MANAGER_CONTAINER_PREFIXES
                    .iter()
                    .any(|p| name.starts_with(p))
        };
        spec.containers.iter_mut().chain(
            spec.init_containers
                .iter_mut()
                .flatten()
                .filter(move |c| !ours(&c.name) && !self.skip.contains(&c.name)),
        )
    }

    /// The first resolved name of the request's cascade.
    fn resolved_name(
        &self,
        req: &SecretRequest,
        edits: &Edits<'_>,
        pod: &Pod,
    ) -> Result<String, Refusal> {
        let (org, project, domain) = scope(pod).map_err(Refusal::MissingScopeLabel)?;
        let ids = cascade(org, domain, project, &req.secret.key);
        for id in &ids {
            match edits.resolved.get(id) {
                Some(l) if l.exists() => return Ok(id.clone()),
                Some(_) => {}
                None => return Err(Refusal::NotFetched(id.clone())),
            }
        }
        Err(Refusal::NotFound(format!(
            "[SecretNotFoundAcrossAllScopes] secret not found across all scopes (looked for {})",
            ids.join(", ")
        )))
    }

    /// The fetcher with `item` added (and the executable copy, for exec), or why not. Reads
    /// the pod; changes nothing. Only a fetcher this admission built is added to: one the pod
    /// arrived with (a previous admission's, or the pod author's own image and plan) is
    /// ignored here and replaced by [`Self::put_fetcher`]. A previous admission's is rebuilt
    /// the same from the same requests, so re-admission still changes nothing.
    fn fetcher(
        &self,
        pod: &Pod,
        item: FetchItem,
        exec: bool,
        edits: &Edits<'_>,
    ) -> Result<Container, Refusal> {
        let existing = fetcher_of(pod).filter(|_| edits.built.contains(INIT_CONTAINER));
        let mut container = existing.cloned().unwrap_or_else(|| self.new_fetcher(pod));
        let mut plan = match plan_env(&container, FETCH_PLAN_ENV) {
            Some(json) => FetchPlan::parse(json).map_err(|e| {
                Refusal::Conflict(format!(
                    "init container {INIT_CONTAINER:?} carries an invalid plan: {e}"
                ))
            })?,
            None => FetchPlan {
                root: PathBuf::from(INIT_ROOT),
                region: (!self.region.is_empty()).then(|| self.region.clone()),
                secrets: Vec::new(),
                copy_executable_to: None,
                fetch_strategy: Some(self.fetch_strategy),
                readable_by_all: !fetcher_is_every_containers_user(pod),
            },
        };
        match plan.secrets.iter().find(|i| i.file == item.file) {
            Some(i) if i.id == item.id => {}
            Some(i) => {
                return Err(Refusal::Conflict(format!(
                    "{} would hold both {} and {}; request one of them under another key or env_var",
                    item.file.display(),
                    i.id,
                    item.id
                )));
            }
            None => plan.secrets.push(item),
        }
        let mut mounts = vec![mount(FILES_VOLUME, INIT_FILES)];
        if exec {
            plan.copy_executable_to = Some(PathBuf::from(format!("{INIT_RUN}/bin/podmutator")));
            mounts.push(mount(RUN_VOLUME, INIT_RUN));
        }
        let json = plan
            .to_json()
            .map_err(|e| Refusal::Conflict(e.to_string()))?;
        set_env(&mut container, FETCH_PLAN_ENV, json);
        add_mounts(&mut container.volume_mounts, &mounts);
        Ok(container)
    }

    /// The fetcher: it runs as the user the first app container names, so that files only its
    /// user may read are readable there ([`fetcher_is_every_containers_user`] says when every
    /// container can).
    fn new_fetcher(&self, pod: &Pod) -> Container {
        // The files are 0400: the fetcher runs as the user the first app container names, so
        // that it can read them (a pod-level runAsUser applies to both anyway).
        let user = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.security_context.as_ref());
        Container {
            name: INIT_CONTAINER.into(),
            image: Some(self.image.clone()),
            command: Some(vec!["/podmutator".into(), "fetch".into()]),
            resources: Some(self.base.file_init.resources.clone()),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Default::default()
                }),
                run_as_user: user.and_then(|u| u.run_as_user),
                run_as_group: user.and_then(|u| u.run_as_group),
                // With the profile, what Pod Security's `restricted` level asks of a container
                // that the pod may set per container rather than for the pod.
                run_as_non_root: user.and_then(|u| u.run_as_non_root),
                seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Puts the fetcher in the pod: the one this admission built is replaced in place;
    /// otherwise every init container of that name the pod arrived with is removed, and the
    /// fetcher inserted before every init container but those another mutator owns.
    /// A fetcher the pod arrived with under one of our images (a previous pass's, given back
    /// by the API server) lends the new one its image, which another entry may have mirrored
    /// or a policy engine pinned to a digest, its security context if that only tightens ours,
    /// the fields the API server filled in and our empty variables it stored without a value:
    /// a second pass then changes nothing.
    fn put_fetcher(&self, spec: &mut PodSpec, mut fetcher: Container, edits: &mut Edits<'_>) {
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        if !edits.built.insert(INIT_CONTAINER.to_owned())
            && let Some(c) = inits.iter_mut().find(|c| c.name == INIT_CONTAINER)
        {
            *c = fetcher;
            return;
        }
        if let Some(old) = inits.iter().find(|c| {
            c.name == INIT_CONTAINER
                && c.image
                    .as_ref()
                    .is_some_and(|i| self.images.iter().any(|o| is_ours_or_pinned(i, o)))
        }) {
            fetcher.image.clone_from(&old.image);
            if only_tightens(
                old.security_context.as_ref(),
                fetcher.security_context.as_ref(),
            ) {
                fetcher.security_context.clone_from(&old.security_context);
            }
            // Only the values the API server defaults them to: a path of the pod's choosing
            // would have the kubelet mount its file among the secret files.
            let defaulted = [
                (
                    &mut fetcher.image_pull_policy,
                    &old.image_pull_policy,
                    &["Always", "IfNotPresent"][..],
                ),
                (
                    &mut fetcher.termination_message_path,
                    &old.termination_message_path,
                    &["/dev/termination-log"],
                ),
                (
                    &mut fetcher.termination_message_policy,
                    &old.termination_message_policy,
                    &["File"],
                ),
            ];
            for (ours, theirs, defaults) in defaulted {
                if ours.is_none() && theirs.as_deref().is_some_and(|t| defaults.contains(&t)) {
                    ours.clone_from(theirs);
                }
            }
            // What the previous pass's fetcher holds besides what this one sets stays, in its
            // order: the variables the edits write (our empty prefixes, stored without their
            // value, included) and what other admission steps added to it after that pass, the
            // service account's token and a credentials webhook's variables and token (EKS Pod
            // Identity's, IRSA's). Such a webhook, called again after this one, gave them to
            // the fetcher; this pass, called again after it, must not take them away, or the
            // fetch runs without credentials. Mounts near ours stay ours alone.
            add_missing_env(&mut fetcher.env, old.env.iter().flatten().cloned());
            let ours = fetcher.volume_mounts.get_or_insert_with(Vec::new);
            let kept: Vec<_> = (old.volume_mounts.iter().flatten())
                .filter(|m| {
                    ours.iter()
                        .all(|o| o.name != m.name && !near(&o.mount_path, &m.mount_path))
                })
                .cloned()
                .collect();
            ours.extend(kept);
        }
        // After what a previous pass's fetcher lends, so its order stands.
        if let Some(first) = spec.containers.first() {
            let (env, mounts) = aws_identity(first);
            add_missing_env(&mut fetcher.env, env);
            add_mounts(&mut fetcher.volume_mounts, &mounts);
        }
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        inits.retain(|c| c.name != INIT_CONTAINER);
        let at = inits
            .iter()
            .rposition(|c| self.skip.contains(&c.name))
            .map_or(0, |i| i + 1);
        inits.insert(at, fetcher);
    }
}

/// The variables of the pod's own AWS identity, as a credentials webhook (EKS Pod Identity's,
/// IRSA's) sets them in every container. Not the region: the app's may be another than the
/// one the webhook resolved the secrets in (the plan's, else the fetcher's own environment).
const AWS_IDENTITY_VARS: [&str; 5] = [
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_STS_REGIONAL_ENDPOINTS",
];

/// Whether one of two mount paths is the other or lies under it.
fn near(a: &str, b: &str) -> bool {
    is_under(a, b) || is_under(b, a)
}

/// The pod's AWS identity as `c` has it: its [`AWS_IDENTITY_VARS`], and the mounts of the
/// token files they name (none at or near the fetcher's own paths). The fetcher reads secrets
/// with that identity. A credentials webhook called before this one (EKS's sorts first:
/// `pod-identity-webhook`) never saw the fetcher, and whether it is called again for it depends
/// on its `reinvocationPolicy`, so the fetcher takes them from the first app container instead.
/// They are the pod's own: nothing more.
fn aws_identity(c: &Container) -> (Vec<EnvVar>, Vec<VolumeMount>) {
    let env: Vec<EnvVar> = (c.env.iter().flatten())
        .filter(|e| AWS_IDENTITY_VARS.contains(&e.name.as_str()))
        .cloned()
        .collect();
    let tokens: Vec<&str> = (env.iter())
        .filter(|e| e.name.ends_with("_TOKEN_FILE"))
        .filter_map(|e| e.value.as_deref())
        .collect();
    let mounts = (c.volume_mounts.iter().flatten())
        .filter(|m| !near(&m.mount_path, INIT_ROOT))
        .filter(|m| {
            let dir = m.mount_path.trim_end_matches('/');
            tokens.iter().any(|t| *t != dir && is_under(t, dir))
        })
        .cloned()
        .collect();
    (env, mounts)
}

/// The pod's init container named [`INIT_CONTAINER`], if any.
fn fetcher_of(pod: &Pod) -> Option<&Container> {
    let inits = pod.spec.as_ref()?.init_containers.as_ref()?;
    inits.iter().find(|c| c.name == INIT_CONTAINER)
}

fn plan_env<'c>(c: &'c Container, name: &str) -> Option<&'c str> {
    c.env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .as_deref()
}

fn set_env(c: &mut Container, name: &str, value: String) {
    let env = c.env.get_or_insert_with(Vec::new);
    match env.iter_mut().find(|e| e.name == name) {
        Some(e) => {
            e.value = Some(value);
            e.value_from = None;
        }
        // Ahead of the container's own variables, like every variable podmutator adds.
        None => env.insert(0, env_value(name, &value)),
    }
}

/// Whether `c`'s command already starts with `podmutator exec`.
fn is_wrapped(c: &Container) -> bool {
    c.command
        .as_ref()
        .is_some_and(|cmd| cmd.len() >= 2 && cmd[0] == EXECUTABLE && cmd[1] == "exec")
}

impl SecretInjector for ReferenceInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::Embedded
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, pod: &Pod) -> Result<Accept, Refusal> {
        let fetch = self.base.accepts_request(req, pod)?;
        match self.route(&req.secret)? {
            // The value manager's own requests (env vars by value): its file writer is not used.
            Route::Value => Ok(fetch),
            Route::File(_) | Route::Exec(_) => {
                if is_windows(pod.spec.as_ref()) {
                    return Err(Refusal::WindowsPod {
                        via: " by reference (embedded.delivery: reference)",
                        container: INIT_CONTAINER.into(),
                        detail: ", and whose Linux securityContext (allowPrivilegeEscalation, capabilities, readOnlyRootFilesystem) the API server refuses in a Windows pod",
                        instead: "request the secret with mount_requirement ENV_VAR under embedded.envVarDelivery: value (a variable set by value), or from a manager that only adds volumes (K8s)",
                    });
                }
                let (org, project, domain) = scope(pod).map_err(Refusal::MissingScopeLabel)?;
                Ok(Accept::Resolve(
                    cascade(org, domain, project, &req.secret.key).into(),
                ))
            }
        }
    }

    /// The value manager's scope binding, and for an env var served by `exec`, every
    /// container must have a `command` to wrap, or an image whose ENTRYPOINT may be read.
    fn deny(&self, req: &SecretRequest, ctx: &PodCtx<'_>, pod: &Pod) -> Option<Denial> {
        if let Some(d) = self.base.deny(req, ctx, pod) {
            return Some(d);
        }
        let var = self.exec_var(req, pod)?;
        let mut spec = pod.spec.clone()?;
        let problem = self
            .wrapped(&mut spec)
            .filter(|c| c.command.as_ref().is_none_or(Vec::is_empty))
            .find_map(|c| self.unreadable(c))?;
        Some(Denial::bad_request(
            "ContainerCommandRequired",
            format!(
                "{problem}, so podmutator cannot wrap it to set {var} from {} without putting the value in the pod spec (embedded.delivery: reference): set the container's `command` (its image's ENTRYPOINT, followed by what `args` needs), request the secret with mount_requirement FILE, or set embedded.envVarDelivery: value",
                req.describe()
            ),
        ))
    }

    /// For an env var served by `exec`, the images to read: those of the containers without
    /// `command` (each allowed, or `deny` has refused the pod).
    fn images(&self, req: &SecretRequest, pod: &Pod) -> Vec<ImageQuery> {
        let Some(mut spec) = self.exec_var(req, pod).and_then(|_| pod.spec.clone()) else {
            return Vec::new();
        };
        let arch = pinned_arch(&spec);
        self.wrapped(&mut spec)
            .filter(|c| c.command.as_ref().is_none_or(Vec::is_empty))
            .filter(|c| self.unreadable(c).is_none())
            .filter_map(|c| c.image.clone())
            .map(|image| ImageQuery {
                image,
                arch: arch.clone(),
            })
            .collect()
    }

    fn inject(
        &self,
        req: &SecretRequest,
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let route = self.route(&req.secret)?;
        if route == Route::Value {
            return self.base.inject(req, ctx, pod, edits);
        }
        let id = self.resolved_name(req, edits, pod)?;
        // Everything is decided before the pod changes: an `Err` leaves it as it was.
        match route {
            Route::File(rel) => {
                let source = id.clone();
                let item = FetchItem {
                    id,
                    file: PathBuf::from(format!("{INIT_FILES}/{rel}")),
                };
                let fetcher = self.fetcher(pod, item, false, edits)?;
                let spec = pod.spec.get_or_insert_with(Default::default);
                self.put_fetcher(spec, fetcher, edits);
                add_volume(&mut spec.volumes, memory_volume(FILES_VOLUME));
                edits.mount(ro_mount(FILES_VOLUME, SECRETS_DIR));
                let env_var = match req.secret.mount_requirement {
                    MountRequirement::File => req.secret.env_var.as_str(),
                    _ => "",
                };
                let path = format!("{SECRETS_DIR}/{rel}");
                edits.file_secret(env_var, path, FILES_VOLUME, source);
            }
            Route::Exec(var) => {
                let item = FetchItem {
                    id,
                    file: PathBuf::from(format!("{INIT_RUN}/env/{var}")),
                };
                let fetcher = self.fetcher(pod, item, true, edits)?;
                let seen = PathBuf::from(format!("{RUN_DIR}/env/{var}"));
                let spec = pod.spec.get_or_insert_with(Default::default);
                let arch = pinned_arch(spec);
                let mut plans = Vec::new();
                for c in self.wrapped(spec) {
                    let wrap = self.wrapping(c, &arch, edits.resolved)?;
                    let mut plan = match plan_env(c, EXEC_ENV_ENV) {
                        Some(json) => ExecPlan::parse(json).map_err(|e| {
                            Refusal::Conflict(format!(
                                "container {:?} carries an invalid plan: {e}",
                                c.name
                            ))
                        })?,
                        None => ExecPlan::default(),
                    };
                    plan.vars.insert(var.clone(), seen.clone());
                    let json = serde_json::to_string(&plan)
                        .map_err(|e| Refusal::Conflict(e.to_string()))?;
                    plans.push((json, wrap));
                }
                for (c, (json, wrap)) in self.wrapped(spec).zip(plans) {
                    if let Some((command, args)) = wrap {
                        c.command = Some(command);
                        if args.is_some() {
                            c.args = args;
                        }
                    }
                    set_env(c, EXEC_ENV_ENV, json);
                    add_mounts(&mut c.volume_mounts, &[ro_mount(RUN_VOLUME, RUN_DIR)]);
                }
                self.put_fetcher(spec, fetcher, edits);
                add_volume(&mut spec.volumes, memory_volume(RUN_VOLUME));
                add_volume(&mut spec.volumes, memory_volume(FILES_VOLUME));
                edits.env(env_value(ENV_ENV_PREFIX, &self.base.env_prefix));
            }
            Route::Value => {}
        }
        Ok(())
    }
}

/// What a plan promises, for tests and `podmutator inject`: the fetcher's files, by the path a
/// task container sees, each with the secret name it holds.
pub fn promised_files(pod: &Pod) -> Result<BTreeMap<String, String>, String> {
    let Some(c) = fetcher_of(pod) else {
        return Ok(BTreeMap::new());
    };
    let json = plan_env(c, FETCH_PLAN_ENV).ok_or("the fetcher has no plan")?;
    let plan = FetchPlan::parse(json).map_err(|e| e.to_string())?;
    Ok(plan
        .secrets
        .into_iter()
        .map(|i| {
            let file = i.file.display().to_string();
            let seen = if let Some(rel) = file.strip_prefix(&format!("{INIT_FILES}/")) {
                format!("{SECRETS_DIR}/{rel}")
            } else if let Some(rel) = file.strip_prefix(&format!("{INIT_RUN}/")) {
                format!("{RUN_DIR}/{rel}")
            } else {
                file
            };
            (seen, i.id)
        })
        .collect())
}

/// Whether the fetcher runs as the user every other container of `pod` runs as, each named in
/// the pod spec (the container's `runAsUser`, else the pod's): only then are files readable by
/// their owner alone readable wherever they are mounted. A container without one runs as its
/// image's user, which the webhook does not know.
fn fetcher_is_every_containers_user(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let user = |c: &Container| {
        c.security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_user)
    };
    let Some(fetcher) = spec.containers.first().and_then(user) else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| c.name != INIT_CONTAINER)
        .all(|c| user(c) == Some(fetcher))
}
