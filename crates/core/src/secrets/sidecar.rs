//! The `AWS`, `GCP` and `Azure` managers: one fetcher init container per secret downloads it
//! from the cloud provider into a shared in-memory volume, before the pod's containers start.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, Volume, VolumeMount};

use super::codec::{MountRequirement, Secret};
use super::refusal::Refusal;
use super::vault::identity_digest;
use super::{Accept, Edits, SECRETS_DIR, SecretInjector, SecretRequest};
use crate::config::{
    AWS_SIDECAR_IMAGE, AZURE_SIDECAR_IMAGE, GCP_SIDECAR_IMAGE, SecretManagerType, SidecarConfig,
};
use crate::image_ref::is_ours_or_pinned;
use crate::mutate::PodCtx;
use crate::mutate::pod::{
    add_volume, env_value, is_windows, memory_volume, mount, only_tightens, ro_mount,
};

/// AWS's fetcher image reads `SECRET_ARN` and writes under `/tmp` + `SECRET_FILENAME`.
pub const ENV_SECRET_ARN: &str = "SECRET_ARN";
pub const ENV_SECRET_FILENAME: &str = "SECRET_FILENAME";
/// Hex digits of the fetcher id: 48 bits, so the few secrets of one pod never collide, and an
/// accidental collision is caught (the existing fetcher would fetch something else).
const FETCHER_ID_LEN: usize = 12;

crate::named_enum! {
    /// Which cloud secret store a [`SidecarInjector`] fetches from; its slug is the prefix of
    /// Flyte's names: `<slug>-secret-vol`, `<slug>-pull-secret-…`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Provider as slug {
        Aws = "aws",
        Gcp = "gcp",
        Azure = "azure",
    }
}

impl Provider {
    pub const fn kind(self) -> SecretManagerType {
        match self {
            Provider::Aws => SecretManagerType::AWS,
            Provider::Gcp => SecretManagerType::GCP,
            Provider::Azure => SecretManagerType::Azure,
        }
    }

    pub const fn default_image(self) -> &'static str {
        match self {
            Provider::Aws => AWS_SIDECAR_IMAGE,
            Provider::Gcp => GCP_SIDECAR_IMAGE,
            Provider::Azure => AZURE_SIDECAR_IMAGE,
        }
    }

    /// How errors name the provider.
    const fn label(self) -> &'static str {
        match self {
            Provider::Aws => "aws secrets manager",
            Provider::Gcp => "gcp secret manager",
            Provider::Azure => "azure key vault",
        }
    }

    /// The shared emptyDir all fetchers of this provider write to.
    pub fn volume_name(self) -> String {
        format!("{self}-secret-vol")
    }

    /// Where the fetcher mounts the volume read-write (every other container gets it read-only
    /// at `/etc/flyte/secrets`; the plan's mount does not replace the fetcher's, same volume).
    const fn fetcher_mount_path(self) -> &'static str {
        match self {
            // The AWS sidecar image always writes below `/tmp`.
            Provider::Aws => "/tmp",
            Provider::Gcp | Provider::Azure => SECRETS_DIR,
        }
    }

    /// Which required field of `s` is missing, if any: what [`Self::fetch`] refuses, without
    /// building the fetcher (planning asks this of every request a fetcher could take).
    fn check(self, s: &Secret) -> Result<(), Refusal> {
        match self {
            Provider::Aws => self.require(
                "the secret's group (the secret ARN) and key (appended to the ARN)",
                &[("group", &s.group), ("key", &s.key)],
            ),
            Provider::Gcp => self.require(
                "the secret's group (the secret name or projects/<p>/secrets/<name>) and group_version (the version number or latest)",
                &[("group", &s.group), ("group_version", &s.group_version)],
            ),
            Provider::Azure => {
                self.require(AZURE_NEEDS, &[("group", &s.group)])?;
                if matches!(azure_secret_name(&s.group), "" | "." | "..") {
                    return Err(Refusal::MissingField(format!(
                        "{} needs {AZURE_NEEDS}; the group does not end in a secret name",
                        self.label()
                    )));
                }
                Ok(())
            }
        }
    }

    /// What the fetcher for `s` runs, or which required field is missing.
    fn fetch(self, s: &Secret) -> Result<Fetch, Refusal> {
        self.check(s)?;
        self.check_names(s)?;
        let (script, path) = match self {
            Provider::Aws => {
                let filename = go_join(&["/", &s.group.to_lowercase(), &s.key.to_lowercase()]);
                let (arn, name) = (s.group.trim_end_matches(':'), s.key.trim_start_matches(':'));
                return Ok(Fetch {
                    command: None,
                    env: vec![
                        env_value(ENV_SECRET_ARN, &format!("{arn}:{name}")),
                        env_value(ENV_SECRET_FILENAME, &filename),
                    ],
                    file: go_join(&[SECRETS_DIR, &filename]),
                });
            }
            Provider::Gcp => {
                let (g, v) = (&s.group, &s.group_version);
                let dir = go_join(&[SECRETS_DIR, g]).to_lowercase();
                let path = go_join(&[&dir, v]).to_lowercase();
                // gcloud writes the file 0600; chmod lets non-root containers read it.
                let script = format!(
                    "gcloud secrets versions access {g}/versions/{v} --out-file={path} || gcloud secrets versions access {v} --secret={g} --out-file={path}; chmod +rX {dir} {path}"
                );
                (script, path)
            }
            Provider::Azure => {
                let uri = s.group.trim_end_matches('/');
                let name = azure_secret_name(&s.group);
                let v = &s.group_version;
                let dir = go_join(&[SECRETS_DIR, name]).to_lowercase();
                let (mkdir, path) = if v.is_empty() {
                    // No version: the latest one, written to /etc/flyte/secrets/<name>.
                    (String::new(), dir)
                } else {
                    (
                        format!("mkdir -p {dir}; "),
                        go_join(&[&dir, v]).to_lowercase(),
                    )
                };
                let script = format!(
                    "az login --service-principal -u $AZURE_CLIENT_ID -t $AZURE_TENANT_ID --federated-token \"$(cat $AZURE_FEDERATED_TOKEN_FILE)\"; {mkdir}az keyvault secret show --id \"{uri}/{v}\" --query \"value\" -o tsv > {path}"
                );
                (script, path)
            }
        };
        Ok(Fetch {
            command: Some(vec!["sh".into(), "-ec".into(), script]),
            env: Vec::new(),
            file: path,
        })
    }

    /// Whether the names of `s` are ones this provider's fetcher can hold without changing
    /// its structure ([`super::names`]): asked after [`Self::check`] and the mount requirement,
    /// so a request refused for those is refused in the same words as before.
    fn check_names(self, s: &Secret) -> Result<(), Refusal> {
        match self {
            Provider::Aws => super::names::aws(s),
            Provider::Gcp => super::names::gcp(s),
            Provider::Azure => super::names::azure(s),
        }
    }

    /// `Err` naming the empty ones among `fields` (never a value: these are names).
    fn require(self, needs: &str, fields: &[(&str, &str)]) -> Result<(), Refusal> {
        let missing: Vec<&str> = fields
            .iter()
            .filter_map(|&(name, v)| v.is_empty().then_some(name))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Refusal::MissingField(format!(
            "{} needs {needs}; {} {} empty",
            self.label(),
            missing.join(" and "),
            if missing.len() == 1 { "is" } else { "are" }
        )))
    }
}

const AZURE_NEEDS: &str = "the secret's group (the secret URI, https://<vault>.vault.azure.net/secrets/<name>); group_version (the version) is optional";

/// The secret's name: the last segment of an Azure secret URI.
fn azure_secret_name(group: &str) -> &str {
    group
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
}

/// What one fetcher does, derived from the secret alone.
struct Fetch {
    command: Option<Vec<String>>,
    /// The fetcher's own env vars (the plan's are added on top).
    env: Vec<EnvVar>,
    /// Where the secret's file appears in every container.
    file: String,
}

impl Fetch {
    /// The fetcher's name: `<slug>-pull-secret-<12 hex>`, a valid DNS-1123 label of at most 30
    /// characters. The id is the start of the SHA-256 of what the fetcher does (its command and
    /// its own env vars, length-prefixed), hence stable across admissions, distinct for secrets
    /// fetched differently, and shared by requests that would fetch the same file the same way
    /// (e.g. ANY and FILE of one secret), which then get one fetcher.
    fn name(&self, provider: Provider) -> String {
        // The argument count first, so command and env vars cannot trade places.
        let count = self.command.as_ref().map_or(0, Vec::len).to_string();
        let mut fields: Vec<&str> = vec![&count];
        fields.extend(self.command.iter().flatten().map(String::as_str));
        for e in &self.env {
            fields.extend([e.name.as_str(), e.value.as_deref().unwrap_or_default()]);
        }
        let digest = identity_digest(&format!("podmutator.io/{provider}-fetcher"), &fields);
        let id = &hex::encode(digest)[..FETCHER_ID_LEN];
        format!("{provider}-pull-secret-{id}")
    }

    /// Whether `c` (an init container of our name) is `ours`, the fetcher this injector builds
    /// for it, possibly after a previous admission put the plan's env vars and mounts on it:
    /// one of `images` (ours, or what the other entries rewrote it to), possibly pinned to a
    /// digest, the same in what it runs (command, args...), its security context ours or
    /// tighter, and holding our own env vars and mount. What the API server fills in once our
    /// patch is applied, before it calls the webhook again (the defaults of
    /// `terminationMessagePath`, `terminationMessagePolicy` and `imagePullPolicy`, resources in
    /// canonical quantities), is not compared; nor what a policy engine's webhook may change
    /// in between (a digest, restrictions).
    fn is_done_by(c: &Container, ours: &Container, images: &[String]) -> bool {
        c.image
            .as_ref()
            .is_some_and(|i| images.iter().any(|o| is_ours_or_pinned(i, o)))
            && Self::runs_as(c, ours)
    }

    /// [`Fetch::is_done_by`] but for the image.
    fn runs_as(c: &Container, ours: &Container) -> bool {
        let bare = |c: &Container| Container {
            env: None,
            volume_mounts: None,
            image: None,
            image_pull_policy: None,
            termination_message_path: None,
            termination_message_policy: None,
            resources: None,
            security_context: None,
            ..c.clone()
        };
        fn has_all<T: PartialEq>(theirs: &Option<Vec<T>>, mine: &Option<Vec<T>>) -> bool {
            mine.iter()
                .flatten()
                .all(|x| theirs.iter().flatten().any(|y| y == x))
        }
        bare(c) == bare(ours)
            && only_tightens(c.security_context.as_ref(), ours.security_context.as_ref())
            && has_all(&c.env, &ours.env)
            && has_all(&c.volume_mounts, &ours.volume_mounts)
    }
}

/// Injects a secret through a fetcher init container (ANY and FILE; ENV_VAR is refused):
/// - volume `<p>-secret-vol` (`emptyDir`, medium `Memory`), added once per pod;
/// - init container `<p>-pull-secret-<id>` (`Fetch::name`) appended after the
///   existing init containers, with the configured image and resources (default
///   requests = limits = 500Mi / 200m), mounting the volume read-write:
///   - `aws`: at `/tmp`, env `SECRET_ARN=<group without trailing ':'>:<key without leading ':'>`
///     and `SECRET_FILENAME=/<lower(group)>/<lower(key)>`;
///   - `gcp`: at `/etc/flyte/secrets`, `sh -ec` running `gcloud secrets versions access` of
///     `<group>/versions/<group_version>` (falling back to `--secret=<group>`) into
///     `/etc/flyte/secrets/<lower(group)>/<lower(group_version)>`, then `chmod +rX`;
///   - `azure`: at `/etc/flyte/secrets`, `sh -ec` running `az login` (workload identity) and
///     `az keyvault secret show --id <uri>/<group_version>` into
///     `/etc/flyte/secrets/<lower(name)>/<lower(group_version)>`, or
///     `/etc/flyte/secrets/<lower(name)>` (latest version) without a group_version;
/// - in every container and init container: the volume mounted read-only at
///   `/etc/flyte/secrets` (the fetcher keeps its own mount), `<env_var>=<that file>` when the
///   secret has an `env_var`, and `FLYTE_SECRETS_FILE_PREFIX=""`,
///   `FLYTE_SECRETS_DEFAULT_DIR=/etc/flyte/secrets`.
///
/// Paths are built like Go's `filepath.Join` (cleaned). Unlike Flyte, the fetcher is named
/// after what it fetches rather than numbered by position, and an init container of that name
/// means "already injected", so admitting the pod again adds nothing. `env_var` is honoured for
/// all three providers (Flyte v1 master does it for AWS only, v2 for none): the variable holds
/// the path of the file the fetcher writes, as the K8s manager does for files.
pub struct SidecarInjector {
    pub provider: Provider,
    pub image: String,
    /// The images a fetcher of ours may carry when the pod comes back: `image`, and what
    /// `images.rules` rewrite it to ([`SidecarInjector::rewritten_to`]).
    images: Vec<String>,
    // What every fetcher, volume and mount of this manager shares (none of it depends on the
    // secret), built once by `new` and cloned for each secret:
    /// A fetcher without its name, command and env vars.
    fetcher: Container,
    /// The shared in-memory volume.
    volume: Volume,
    /// The volume, read-only at `/etc/flyte/secrets`, for every container.
    mount: VolumeMount,
}

impl SidecarInjector {
    /// `awsSecretManager`, `gcpSecretManager` or `azureSecretManager`, defaults filled in.
    pub fn new(provider: Provider, cfg: &SidecarConfig) -> Self {
        let image = cfg.image_or(provider.default_image());
        Self {
            provider,
            images: vec![image.clone()],
            fetcher: Container {
                image: Some(image.clone()),
                volume_mounts: Some(vec![mount(
                    provider.volume_name(),
                    provider.fetcher_mount_path(),
                )]),
                resources: Some(cfg.resources_or_default()),
                ..Default::default()
            },
            volume: memory_volume(provider.volume_name()),
            mount: ro_mount(provider.volume_name(), SECRETS_DIR),
            image,
        }
    }

    /// Also takes a fetcher whose image the images entry rewrote to one of `images`, when the
    /// pod comes back for another pass.
    pub fn rewritten_to(mut self, images: impl IntoIterator<Item = String>) -> Self {
        self.images.extend(images);
        self
    }
}

impl SecretInjector for SidecarInjector {
    fn kind(&self) -> SecretManagerType {
        self.provider.kind()
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, pod: &Pod) -> Result<Accept, Refusal> {
        let s = &req.secret;
        let p = self.provider;
        p.check(s)?;
        if !s.env_var.is_empty() {
            super::check_env_name(&s.env_var)?;
        }
        match s.mount_requirement {
            MountRequirement::Any | MountRequirement::File => {
                p.check_names(s)?;
                if is_windows(pod.spec.as_ref()) {
                    return Err(Refusal::WindowsPod {
                        via: "",
                        container: p.fetch(s)?.name(p),
                        detail: " (a Linux image running a Linux command)",
                        instead: "request the secret from a manager that only adds volumes or variables (K8s, or Embedded with mount_requirement ENV_VAR)",
                    });
                }
                Ok(Accept::Now)
            }
            MountRequirement::EnvVar => Err(Refusal::UnsupportedMount(format!(
                "mount requirement ENV_VAR is not supported by {}: its init container writes the secret to a file; request FILE or ANY (env_var then names a variable holding the file's path)",
                p.label()
            ))),
            MountRequirement::Unknown(n) => Err(Refusal::UnknownMount(n)),
        }
    }

    fn inject(
        &self,
        req: &SecretRequest,
        _ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let s = &req.secret;
        let p = self.provider;
        let fetch = p.fetch(s)?;

        let name = fetch.name(p);
        // What the file holds: Key Vault's names are case-insensitive, so two requests that
        // differ only in case are one secret; the others' are not.
        let source = match p {
            Provider::Azure => format!("{}/{}", s.group, s.group_version).to_lowercase(),
            Provider::Aws | Provider::Gcp => name.clone(),
        };
        // Checked before the pod changes: a volume of the pod's own under the name would be
        // written into (a disk, say) and never mounted where the secret is read. Any in-memory
        // `emptyDir` is taken as the one an earlier admission added.
        let volume = &self.volume;
        let own = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        let in_memory =
            |v: &Volume| v.empty_dir.as_ref().and_then(|e| e.medium.as_deref()) == Some("Memory");
        let has_volume = match own.into_iter().flatten().find(|v| v.name == volume.name) {
            Some(v) if !in_memory(v) => {
                return Err(Refusal::Conflict(format!(
                    "the pod has a volume named {:?} that is not the in-memory volume {} writes its secrets to; rename that volume",
                    volume.name,
                    p.label()
                )));
            }
            found => found.is_some(),
        };
        let ours = Container {
            name: name.clone(),
            command: fetch.command,
            env: (!fetch.env.is_empty()).then_some(fetch.env),
            ..self.fetcher.clone()
        };
        let spec = pod.spec.get_or_insert_with(Default::default);
        let inits = spec.init_containers.get_or_insert_with(Vec::new);
        match inits.iter_mut().find(|c| c.name == name) {
            Some(c) if Fetch::is_done_by(c, &ours, &self.images) => {}
            // Ours but for the image: a previous configuration's `sidecarImage`, when a rollout
            // that changes it splits an admission's two calls. It runs ours again.
            Some(c) if Fetch::runs_as(c, &ours) => c.image = ours.image,
            Some(_) => {
                return Err(Refusal::Conflict(format!(
                    "init container {name} already exists and is not the fetcher podmutator injects for this secret (its command or settings differ); remove or rename that init container"
                )));
            }
            None => inits.push(ours),
        }
        // Looked for before the clone: `add_volume` would find it too, after cloning it.
        if !has_volume {
            add_volume(&mut spec.volumes, volume.clone());
        }
        edits.mount(self.mount.clone());
        edits.file_secret(&s.env_var, fetch.file, &volume.name, source);
        Ok(())
    }
}

/// Go's `filepath.Join` on Unix, as Flyte builds every path: the non-empty elements joined by
/// `/`, then lexically cleaned (repeated `/`, `.` and `..` resolved, no trailing `/`).
fn go_join(elems: &[&str]) -> String {
    let joined = elems
        .iter()
        .copied()
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    if joined.is_empty() {
        return joined;
    }
    let rooted = joined.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in joined.split('/') {
        match seg {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            // `..` above the root stays at the root.
            ".." if rooted => {}
            seg => parts.push(seg),
        }
    }
    let body = parts.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".into(),
        (false, false) => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::equal_resources;
    use crate::mutate::Route;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use proptest::prelude::*;
    use rstest::rstest;
    use sha2::Digest;

    impl Provider {
        /// The name of the fetcher for `s`, or which required field is missing.
        fn fetcher_name(self, s: &Secret) -> Result<String, Refusal> {
            Ok(self.fetch(s)?.name(self))
        }
    }

    fn injector(provider: Provider) -> SidecarInjector {
        SidecarInjector::new(provider, &SidecarConfig::default())
    }

    fn secret(group: &str, group_version: &str, key: &str) -> Secret {
        Secret {
            group: group.into(),
            group_version: group_version.into(),
            key: key.into(),
            ..Default::default()
        }
    }

    /// A secret `provider` accepts, distinct per `n`.
    fn any_secret(provider: Provider, n: u32) -> Secret {
        let group = match provider {
            Provider::Azure => format!("https://v.vault.azure.net/secrets/s{n}"),
            Provider::Aws | Provider::Gcp => format!("projects/p/secrets/s{n}"),
        };
        secret(&group, "1", &format!("k{n}"))
    }

    /// Flyte's input pod: `containers: []`.
    fn empty_pod() -> Pod {
        Pod {
            spec: Some(PodSpec::default()),
            ..Default::default()
        }
    }

    fn mk_container(name: &str) -> Container {
        Container {
            name: name.into(),
            ..Default::default()
        }
    }

    /// A pod with a user init container and an app container.
    fn user_pod() -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![mk_container("user-init")]),
                containers: vec![Container {
                    env: Some(vec![env_value("USER", "kept")]),
                    ..mk_container("app")
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A fetcher is a Linux container: a Windows pod's request is refused, naming the
    /// manager, the container and what to use instead, and the pod is left as it was.
    #[rstest]
    #[case::aws(Provider::Aws)]
    #[case::gcp(Provider::Gcp)]
    #[case::azure(Provider::Azure)]
    fn a_windows_pod_is_refused(#[case] provider: Provider) {
        let mut pod = user_pod();
        pod.spec.as_mut().unwrap().os = Some(k8s_openapi::api::core::v1::PodOS {
            name: "windows".into(),
        });
        let before = pod.clone();
        let err =
            inject_all(&injector(provider), &[any_secret(provider, 0)], pod.clone()).unwrap_err();
        assert!(
            err.contains("cannot deliver this secret to a Windows pod (spec.os.name: windows)")
                && err.contains("pull-secret")
                && err.contains("K8s"),
            "{err}"
        );
        assert_eq!(pod, before);
        // A Linux pod (said or not) is served as before.
        let mut linux = user_pod();
        linux.spec.as_mut().unwrap().os = Some(k8s_openapi::api::core::v1::PodOS {
            name: "linux".into(),
        });
        let served = inject_all(
            &injector(provider),
            &[any_secret(provider, 0)],
            linux.clone(),
        )
        .unwrap();
        let mut unsaid =
            inject_all(&injector(provider), &[any_secret(provider, 0)], user_pod()).unwrap();
        unsaid.spec.as_mut().unwrap().os = linux.spec.unwrap().os;
        assert_eq!(served, unsaid);
    }

    /// Admits `pod` through the real `secrets` mutator with only `inj` enabled.
    fn admit(inj: Box<dyn SecretInjector>, secrets: &[Secret], pod: Pod) -> Pod {
        crate::secrets::testing::admit(vec![inj], secrets, pod).unwrap()
    }

    fn inject_all(inj: &SidecarInjector, secrets: &[Secret], mut pod: Pod) -> Result<Pod, String> {
        let ctx = PodCtx::test(Route::Secrets);
        let mut plan = Edits::default();
        for (i, s) in secrets.iter().enumerate() {
            let req = SecretRequest {
                index: i as u32,
                annotation: format!("flyte.secrets/s{i}"),
                secret: s.clone(),
            };
            let before = pod.clone();
            if let Err(e) =
                crate::secrets::testing::accept_and_inject(inj, &req, &ctx, &mut pod, &mut plan)
            {
                assert_eq!(pod, before, "a refused request leaves the pod alone");
                return Err(e.to_string());
            }
        }
        plan.apply(&mut pod, &[]);
        Ok(pod)
    }

    /// Runs one injection the way `SecretsMutator` does: inject, then apply the plan.
    fn run(inj: &SidecarInjector, s: &Secret, pod: Pod) -> Result<Pod, String> {
        inject_all(inj, std::slice::from_ref(s), pod)
    }

    fn memory_volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: None,
            }),
            ..Default::default()
        }
    }

    fn rw_mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    fn init_names(pod: &Pod) -> Vec<String> {
        pod.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect()
    }

    /// Port of Flyte's `TestAWSSecretManagerInjector_Inject` (v2). Adapted: Flyte names the
    /// fetcher `aws-pull-secret-0` after its position; ours is named after what it fetches.
    /// The pinned fetcher names in these ports were checked against an independent Python
    /// computation (hashlib) of the same length-prefixed SHA-256.
    #[test]
    fn aws_secret_manager_injector_inject() {
        let got = run(
            &injector(Provider::Aws),
            &secret("arn", "", "name"),
            empty_pod(),
        )
        .unwrap();
        let expected = Pod {
            spec: Some(PodSpec {
                volumes: Some(vec![memory_volume("aws-secret-vol")]),
                init_containers: Some(vec![Container {
                    name: "aws-pull-secret-dc158eb384ac".into(),
                    image: Some(
                        "docker.io/amazon/aws-secrets-manager-secret-sidecar:v0.1.4".into(),
                    ),
                    env: Some(vec![
                        env_value("FLYTE_SECRETS_FILE_PREFIX", ""),
                        env_value("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
                        env_value("SECRET_ARN", "arn:name"),
                        env_value("SECRET_FILENAME", "/arn/name"),
                    ]),
                    volume_mounts: Some(vec![rw_mount("aws-secret-vol", "/tmp")]),
                    resources: Some(equal_resources("500Mi", "200m")),
                    ..Default::default()
                }]),
                containers: vec![],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(got, expected);
    }

    /// Port of Flyte v1 master's `env_var` case (PR #6316): `MY_SECRET_VAR` holds the file path.
    /// Adapted: v1 appends env vars (existing wins); we put them first as v2 does.
    #[test]
    fn aws_env_var_holds_the_file_path() {
        let s = Secret {
            env_var: "MY_SECRET_VAR".into(),
            ..secret("arn", "", "name")
        };
        let got = run(&injector(Provider::Aws), &s, user_pod()).unwrap();
        let app = &got.spec.unwrap().containers[0];
        assert_eq!(
            app.env,
            Some(vec![
                env_value("MY_SECRET_VAR", "/etc/flyte/secrets/arn/name"),
                env_value("FLYTE_SECRETS_FILE_PREFIX", ""),
                env_value("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
                env_value("USER", "kept"),
            ])
        );
    }

    /// Port of Flyte's `TestGCPSecretManagerInjector_Inject`. Adapted: Flyte names the fetcher
    /// `gcp-pull-secret-0` after its position; ours is named after what it fetches.
    #[test]
    fn gcp_secret_manager_injector_inject() {
        let got = run(
            &injector(Provider::Gcp),
            &secret("TestSecret", "2", ""),
            empty_pod(),
        )
        .unwrap();
        let expected = Pod {
            spec: Some(PodSpec {
                volumes: Some(vec![memory_volume("gcp-secret-vol")]),
                init_containers: Some(vec![Container {
                    name: "gcp-pull-secret-6c319689e95a".into(),
                    image: Some("gcr.io/google.com/cloudsdktool/cloud-sdk:alpine".into()),
                    command: Some(vec![
                        "sh".into(),
                        "-ec".into(),
                        "gcloud secrets versions access TestSecret/versions/2 --out-file=/etc/flyte/secrets/testsecret/2 || gcloud secrets versions access 2 --secret=TestSecret --out-file=/etc/flyte/secrets/testsecret/2; chmod +rX /etc/flyte/secrets/testsecret /etc/flyte/secrets/testsecret/2".into(),
                    ]),
                    env: Some(vec![
                        env_value("FLYTE_SECRETS_FILE_PREFIX", ""),
                        env_value("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
                    ]),
                    volume_mounts: Some(vec![rw_mount("gcp-secret-vol", "/etc/flyte/secrets")]),
                    resources: Some(equal_resources("500Mi", "200m")),
                    ..Default::default()
                }]),
                containers: vec![],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(got, expected);
    }

    const AZ_LOGIN: &str = "az login --service-principal -u $AZURE_CLIENT_ID -t $AZURE_TENANT_ID --federated-token \"$(cat $AZURE_FEDERATED_TOKEN_FILE)\"; ";

    /// Port of Flyte's `TestAzureSecretManagerInjector_Inject`. Adapted: Flyte names the
    /// fetcher `azure-pull-secret-0` after its position; ours is named after what it fetches
    /// (the explicit-version and ending-slash cases run the same command, so share the name).
    #[rstest]
    #[case::test_secret_with_explicit_version(
        "https://test-storage-account.vault.azure.net/secrets/test-secret-name",
        "test-version",
        "mkdir -p /etc/flyte/secrets/test-secret-name; az keyvault secret show --id \"https://test-storage-account.vault.azure.net/secrets/test-secret-name/test-version\" --query \"value\" -o tsv > /etc/flyte/secrets/test-secret-name/test-version",
        "azure-pull-secret-4100006040f6"
    )]
    #[case::test_secret_with_ending_slash(
        "https://test-storage-account.vault.azure.net/secrets/test-secret-name/",
        "test-version",
        "mkdir -p /etc/flyte/secrets/test-secret-name; az keyvault secret show --id \"https://test-storage-account.vault.azure.net/secrets/test-secret-name/test-version\" --query \"value\" -o tsv > /etc/flyte/secrets/test-secret-name/test-version",
        "azure-pull-secret-4100006040f6"
    )]
    #[case::test_secret_with_no_version_defaults_to_latest(
        "https://test-storage-account.vault.azure.net/secrets/test-secret-name",
        "",
        "az keyvault secret show --id \"https://test-storage-account.vault.azure.net/secrets/test-secret-name/\" --query \"value\" -o tsv > /etc/flyte/secrets/test-secret-name",
        "azure-pull-secret-5fd5d0c04118"
    )]
    fn azure_secret_manager_injector_inject(
        #[case] group: &str,
        #[case] group_version: &str,
        #[case] command: &str,
        #[case] fetcher: &str,
    ) {
        let s = secret(group, group_version, "");
        let got = run(&injector(Provider::Azure), &s, empty_pod()).unwrap();
        let expected = Pod {
            spec: Some(PodSpec {
                volumes: Some(vec![memory_volume("azure-secret-vol")]),
                init_containers: Some(vec![Container {
                    name: fetcher.into(),
                    image: Some("mcr.microsoft.com/azure-cli:cbl-mariner2.0".into()),
                    command: Some(vec![
                        "sh".into(),
                        "-ec".into(),
                        format!("{AZ_LOGIN}{command}"),
                    ]),
                    env: Some(vec![
                        env_value("FLYTE_SECRETS_FILE_PREFIX", ""),
                        env_value("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
                    ]),
                    volume_mounts: Some(vec![rw_mount("azure-secret-vol", "/etc/flyte/secrets")]),
                    resources: Some(equal_resources("500Mi", "200m")),
                    ..Default::default()
                }]),
                containers: vec![],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(got, expected);
    }

    #[rstest]
    #[case::gcp(
        Provider::Gcp,
        secret("Proj/Secret", "Latest", ""),
        "/etc/flyte/secrets/proj/secret/latest"
    )]
    #[case::azure_versioned(
        Provider::Azure,
        secret("https://v.vault.azure.net/secrets/DB", "V1", ""),
        "/etc/flyte/secrets/db/v1"
    )]
    #[case::azure_latest(
        Provider::Azure,
        secret("https://v.vault.azure.net/secrets/DB", "", ""),
        "/etc/flyte/secrets/db"
    )]
    #[case::aws_cleaned_like_go(
        Provider::Aws,
        secret("arn:x:secret:Team//Db/", "", "Pw"),
        "/etc/flyte/secrets/arn:x:secret:team/db/pw"
    )]
    fn env_var_holds_the_path_of_the_fetched_file(
        #[case] provider: Provider,
        #[case] s: Secret,
        #[case] path: &str,
    ) {
        let s = Secret {
            env_var: "MY_SECRET".into(),
            ..s
        };
        let got = run(&injector(provider), &s, user_pod()).unwrap();
        let spec = got.spec.unwrap();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            assert_eq!(
                c.env.as_ref().unwrap()[0],
                env_value("MY_SECRET", path),
                "{}",
                c.name
            );
        }
    }

    #[rstest]
    fn fetcher_is_appended_after_user_init_containers_and_everyone_gets_the_file(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = any_secret(provider, 1);
        let got = run(&injector(provider), &s, user_pod()).unwrap();
        let fetcher = provider.fetcher_name(&s).unwrap();
        assert_eq!(init_names(&got), ["user-init", fetcher.as_str()]);
        let spec = got.spec.unwrap();
        let vol = provider.volume_name();
        let ro = VolumeMount {
            name: vol.clone(),
            read_only: Some(true),
            mount_path: "/etc/flyte/secrets".into(),
            ..Default::default()
        };
        let inits = spec.init_containers.unwrap();
        assert_eq!(inits[0].volume_mounts, Some(vec![ro.clone()]));
        assert_eq!(spec.containers[0].volume_mounts, Some(vec![ro]));
        assert_eq!(
            inits[1].volume_mounts,
            Some(vec![rw_mount(&vol, provider.fetcher_mount_path())]),
            "the fetcher keeps its read-write mount"
        );
        assert_eq!(
            spec.containers[0].env.as_ref().unwrap()[..2],
            [
                env_value("FLYTE_SECRETS_FILE_PREFIX", ""),
                env_value("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
            ]
        );
        assert_eq!(spec.volumes, Some(vec![memory_volume(&vol)]));
    }

    #[rstest]
    fn reinjection_changes_nothing(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
        #[values(MountRequirement::Any, MountRequirement::File)] mount: MountRequirement,
    ) {
        let inj = injector(provider);
        let s = Secret {
            mount_requirement: mount,
            env_var: "MY_SECRET".into(),
            ..any_secret(provider, 1)
        };
        let once = run(&inj, &s, user_pod()).unwrap();
        let twice = run(&inj, &s, once.clone()).unwrap();
        assert_eq!(twice, once);
        assert_eq!(init_names(&twice).len(), 2);
    }

    /// Flyte appended another `<p>-pull-secret-<n+1>` on every admission. Through the real
    /// mutator, admitting the admitted pod again changes nothing.
    #[rstest]
    fn readmission_through_the_secrets_mutator_changes_nothing(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let secrets = [
            any_secret(provider, 1),
            Secret {
                env_var: "TOKEN".into(),
                ..any_secret(provider, 2)
            },
        ];
        let once = admit(Box::new(injector(provider)), &secrets, user_pod());
        let twice = admit(Box::new(injector(provider)), &secrets, once.clone());
        assert_eq!(twice, once);
        assert_eq!(init_names(&once).len(), 3);
    }

    #[rstest]
    fn two_secrets_get_two_fetchers_and_one_volume(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let inj = injector(provider);
        let (a, b) = (any_secret(provider, 1), any_secret(provider, 2));
        let (na, nb) = (
            provider.fetcher_name(&a).unwrap(),
            provider.fetcher_name(&b).unwrap(),
        );
        assert_ne!(na, nb);
        let both = [a, b];
        let once = inject_all(&inj, &both, user_pod()).unwrap();
        assert_eq!(init_names(&once), ["user-init", na.as_str(), nb.as_str()]);
        assert_eq!(
            once.spec.as_ref().unwrap().volumes.as_ref().unwrap().len(),
            1
        );
        assert_eq!(inject_all(&inj, &both, once.clone()).unwrap(), once);
        let reversed = [both[1].clone(), both[0].clone()];
        assert_eq!(
            init_names(&inject_all(&inj, &reversed, once.clone()).unwrap()),
            init_names(&once),
            "re-admission in another order adds nothing either"
        );
    }

    #[rstest]
    fn any_and_file_requests_of_one_secret_share_one_fetcher(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let any = any_secret(provider, 1);
        let file = Secret {
            mount_requirement: MountRequirement::File,
            ..any.clone()
        };
        let got = inject_all(&injector(provider), &[any, file], empty_pod()).unwrap();
        assert_eq!(init_names(&got).len(), 1);
    }

    #[rstest]
    fn env_var_mount_is_refused(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = Secret {
            mount_requirement: MountRequirement::EnvVar,
            ..any_secret(provider, 1)
        };
        let err = run(&injector(provider), &s, user_pod()).unwrap_err();
        assert_eq!(
            err,
            format!(
                "mount requirement ENV_VAR is not supported by {}: its init container writes the secret to a file; request FILE or ANY (env_var then names a variable holding the file's path)",
                provider.label()
            )
        );
    }

    #[rstest]
    fn unknown_mount_requirement_is_refused(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = Secret {
            mount_requirement: MountRequirement::Unknown(7),
            ..any_secret(provider, 1)
        };
        let err = run(&injector(provider), &s, user_pod()).unwrap_err();
        assert_eq!(err, "unrecognized mount requirement [7]");
    }

    #[rstest]
    #[case::aws_without_group(
        Provider::Aws,
        secret("", "", "name"),
        "aws secrets manager needs the secret's group (the secret ARN) and key (appended to the ARN); group is empty"
    )]
    #[case::aws_without_key(
        Provider::Aws,
        secret("arn", "", ""),
        "aws secrets manager needs the secret's group (the secret ARN) and key (appended to the ARN); key is empty"
    )]
    #[case::aws_without_either(
        Provider::Aws,
        secret("", "", ""),
        "aws secrets manager needs the secret's group (the secret ARN) and key (appended to the ARN); group and key are empty"
    )]
    #[case::gcp_without_group(
        Provider::Gcp,
        secret("", "2", "k"),
        "gcp secret manager needs the secret's group (the secret name or projects/<p>/secrets/<name>) and group_version (the version number or latest); group is empty"
    )]
    #[case::gcp_without_version(
        Provider::Gcp,
        secret("TestSecret", "", "k"),
        "gcp secret manager needs the secret's group (the secret name or projects/<p>/secrets/<name>) and group_version (the version number or latest); group_version is empty"
    )]
    #[case::azure_without_group(
        Provider::Azure,
        secret("", "1", "k"),
        "azure key vault needs the secret's group (the secret URI, https://<vault>.vault.azure.net/secrets/<name>); group_version (the version) is optional; group is empty"
    )]
    #[case::azure_without_secret_name(
        Provider::Azure,
        secret("///", "1", "k"),
        "azure key vault needs the secret's group (the secret URI, https://<vault>.vault.azure.net/secrets/<name>); group_version (the version) is optional; the group does not end in a secret name"
    )]
    fn missing_fields_are_named(
        #[case] provider: Provider,
        #[case] s: Secret,
        #[case] message: &str,
    ) {
        let err = run(&injector(provider), &s, user_pod()).unwrap_err();
        assert_eq!(err, message);
    }

    #[rstest]
    fn foreign_init_container_with_the_fetchers_name_is_refused(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = any_secret(provider, 1);
        let name = provider.fetcher_name(&s).unwrap();
        let mut pod = user_pod();
        pod.spec
            .as_mut()
            .unwrap()
            .init_containers
            .as_mut()
            .unwrap()
            .push(mk_container(&name));
        let err = run(&injector(provider), &s, pod).unwrap_err();
        assert_eq!(
            err,
            format!(
                "init container {name} already exists and is not the fetcher podmutator injects for this secret (its command or settings differ); remove or rename that init container"
            )
        );
    }

    /// A pod's own init container under the fetcher's name that runs something else than
    /// ours (other args, a looser security context) is refused, not taken for ours.
    #[rstest]
    fn a_pod_supplied_fetcher_with_our_name_that_runs_something_else_is_refused(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
        #[values("args", "privileged")] changed: &str,
    ) {
        let s = any_secret(provider, 1);
        let ours = fetcher_of(provider, &s);
        let mut theirs = ours.clone();
        match changed {
            "args" => theirs.args = Some(vec!["curl evil.example".into()]),
            _ => {
                theirs.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
                    privileged: Some(true),
                    ..Default::default()
                })
            }
        }
        let mut pod = user_pod();
        let inits = pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap();
        inits.push(theirs);
        let err = run(&injector(provider), &s, pod.clone()).unwrap_err();
        assert!(
            err.contains("is not the fetcher podmutator injects"),
            "{err}"
        );
        // Ours, as a previous admission left it, is recognised.
        inits_of(&mut pod).pop();
        inits_of(&mut pod).push(ours);
        run(&injector(provider), &s, pod).unwrap();
    }

    /// Ours in every way but its image (a previous configuration's `sidecarImage`, when a
    /// rollout that changes it splits an admission's two calls, or a pod's copy of ours in an
    /// image of its own): it gets our image back and runs ours, and nothing else changes.
    #[rstest]
    fn our_fetcher_in_another_image_runs_ours_again(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = any_secret(provider, 1);
        let ours = fetcher_of(provider, &s);
        let with = |image: &str| {
            let mut pod = user_pod();
            let mut fetcher = ours.clone();
            fetcher.image = Some(image.into());
            inits_of(&mut pod).push(fetcher);
            run(&injector(provider), &s, pod)
        };
        let again = with(ours.image.as_deref().unwrap()).unwrap();
        assert_eq!(with("evil.example/fetcher:1").unwrap(), again);
        let fetchers: Vec<_> = (again.spec.unwrap().init_containers.unwrap().into_iter())
            .filter(|c| c.name == ours.name)
            .collect();
        assert_eq!(fetchers, [ours]);
    }

    /// Ours after a policy engine pinned its image to a digest and tightened its security
    /// context: still ours.
    #[rstest]
    fn our_fetcher_pinned_and_tightened_is_ours(
        #[values(Provider::Aws, Provider::Gcp, Provider::Azure)] provider: Provider,
    ) {
        let s = any_secret(provider, 1);
        let mut ours = fetcher_of(provider, &s);
        let image = ours.image.take().unwrap();
        ours.image = Some(format!("{image}@sha256:{}", "0".repeat(64)));
        ours.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
            allow_privilege_escalation: Some(false),
            run_as_non_root: Some(true),
            ..Default::default()
        });
        let mut pod = user_pod();
        inits_of(&mut pod).push(ours);
        run(&injector(provider), &s, pod).unwrap();
    }

    fn inits_of(pod: &mut Pod) -> &mut Vec<Container> {
        pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap()
    }

    #[test]
    fn image_and_resources_come_from_config() {
        let resources = equal_resources("1Gi", "1");
        let cfg = SidecarConfig {
            sidecar_image: Some("registry.example/fetcher:1".into()),
            resources: Some(resources.clone()),
        };
        let inj = SidecarInjector::new(Provider::Gcp, &cfg);
        let got = run(&inj, &any_secret(Provider::Gcp, 1), empty_pod()).unwrap();
        let fetcher = &got.spec.unwrap().init_containers.unwrap()[0];
        assert_eq!(fetcher.image.as_deref(), Some("registry.example/fetcher:1"));
        assert_eq!(fetcher.resources, Some(resources));
        assert_eq!(
            fetcher.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"],
            Quantity("1Gi".into())
        );
    }

    #[rstest]
    #[case::plain(&["/etc/flyte/secrets", "a", "b"], "/etc/flyte/secrets/a/b")]
    #[case::empty_elements_skipped(&["/", "", "a"], "/a")]
    #[case::double_slash(&["/", "a//b/"], "/a/b")]
    #[case::dot(&["/x", "./a/."], "/x/a")]
    #[case::dot_dot(&["/x/y", "../a"], "/x/a")]
    #[case::dot_dot_above_root(&["/", "../../a"], "/a")]
    #[case::relative_dot_dot_kept(&["..", "a"], "../a")]
    #[case::nothing(&["", ""], "")]
    #[case::only_dot(&["."], ".")]
    fn go_join_matches_go(#[case] elems: &[&str], #[case] expected: &str) {
        assert_eq!(go_join(elems), expected);
    }

    fn is_dns1123_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    /// The fetcher's name recomputed from the container the injector really wrote, without
    /// `Fetch::name` or `identity_digest`: `<slug>-pull-secret-` and the first 12 hex digits of
    /// SHA-256 over the domain `podmutator.io/<slug>-fetcher`, the command's length in decimal,
    /// each command argument, then each of the fetcher's own env vars (AWS: `SECRET_ARN`,
    /// `SECRET_FILENAME`) as name and value; every field preceded by its length as 8 big-endian
    /// bytes. Returns the name and what went into it (command, own env vars).
    fn name_by_definition(provider: Provider, fetcher: &Container) -> (String, Vec<String>) {
        let command = fetcher.command.clone().unwrap_or_default();
        let mut fields = vec![command.len().to_string()];
        fields.extend(command.iter().cloned());
        for e in fetcher.env.iter().flatten() {
            if matches!(e.name.as_str(), ENV_SECRET_ARN | ENV_SECRET_FILENAME) {
                fields.push(e.name.clone());
                fields.push(e.value.clone().unwrap_or_default());
            }
        }
        let domain = format!("podmutator.io/{}-fetcher", provider.slug());
        let mut input = Vec::new();
        for f in std::iter::once(domain.as_str()).chain(fields.iter().map(String::as_str)) {
            input.extend_from_slice(&(f.len() as u64).to_be_bytes());
            input.extend_from_slice(f.as_bytes());
        }
        let digest = sha2::Sha256::digest(&input);
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        (format!("{}-pull-secret-{hex}", provider.slug()), fields)
    }

    /// The one fetcher `s` gets in an empty pod.
    fn fetcher_of(provider: Provider, s: &Secret) -> Container {
        let pod = run(&injector(provider), s, empty_pod()).unwrap();
        let mut inits = pod.spec.unwrap().init_containers.unwrap();
        assert_eq!(inits.len(), 1);
        inits.remove(0)
    }

    #[test]
    fn the_definition_gives_the_golden_names() {
        // The names pinned in the Flyte ports above, recomputed by definition.
        let gcp = fetcher_of(Provider::Gcp, &secret("TestSecret", "2", ""));
        assert_eq!(
            name_by_definition(Provider::Gcp, &gcp).0,
            "gcp-pull-secret-6c319689e95a"
        );
        let azure = fetcher_of(
            Provider::Azure,
            &secret(
                "https://test-storage-account.vault.azure.net/secrets/test-secret-name",
                "",
                "",
            ),
        );
        assert_eq!(
            name_by_definition(Provider::Azure, &azure).0,
            "azure-pull-secret-5fd5d0c04118"
        );
    }

    /// Names that would run a command in the fetcher's shell, or move its file, are refused
    /// naming the field and the rule.
    #[rstest]
    #[case::gcp_command_in_the_group(
        Provider::Gcp,
        secret("mysecret; touch /tmp/pm-pwned; #", "1", ""),
        "group"
    )]
    #[case::gcp_command_in_the_version(
        Provider::Gcp,
        secret("s", "1 || touch /tmp/x", ""),
        "group_version"
    )]
    #[case::gcp_substitution(Provider::Gcp, secret("$(touch x)", "1", ""), "group")]
    #[case::gcp_option(
        Provider::Gcp,
        secret("--impersonate-service-account", "1", ""),
        "group"
    )]
    #[case::gcp_climbing_out(Provider::Gcp, secret("../../../usr/bin", "sh", ""), "group")]
    #[case::azure_quote(
        Provider::Azure,
        secret("https://v.vault.azure.net/secrets/a\"; touch x; \"", "", ""),
        "group"
    )]
    #[case::azure_version(
        Provider::Azure,
        secret("https://v.vault.azure.net/secrets/a", "1;id", ""),
        "group_version"
    )]
    #[case::azure_not_https(Provider::Azure, secret("a; id #/secrets/x", "", ""), "group")]
    #[case::aws_climbing_out(Provider::Aws, secret("arn:x:secret:", "", "../../../etc/x"), "key")]
    fn names_that_change_the_fetcher_are_refused(
        #[case] provider: Provider,
        #[case] s: Secret,
        #[case] field: &str,
    ) {
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: s,
        };
        let err = injector(provider)
            .accepts(&req, &PodCtx::test(Route::Secrets), &user_pod())
            .unwrap_err();
        let Refusal::BadSecretName { field: f, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*f, field, "{err}");
        assert!(provider.fetcher_name(&req.secret).is_err());
    }

    /// One element of a shell script as `sh` splits it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Shape {
        /// `;`, `||`, `>`, a newline...
        Op(String),
        /// A word: whether it starts with `-` (an option), and whether the shell would expand
        /// anything in it (`$`, a backquote, a glob, `~`, a brace).
        Word { dash: bool, expands: bool },
        /// `#` at the start of a word: the rest of the line is not run.
        Comment,
    }

    /// How `sh` splits `script` into words and operators, independently of how the fetcher
    /// builds it (quotes and backslashes as POSIX reads them).
    fn shell_shape(script: &str) -> Vec<Shape> {
        let mut out = Vec::new();
        let mut chars = script.chars().peekable();
        let mut word: Option<(bool, bool)> = None; // (dash, expands)
        let end_word = |word: &mut Option<(bool, bool)>, out: &mut Vec<Shape>| {
            if let Some((dash, expands)) = word.take() {
                out.push(Shape::Word { dash, expands });
            }
        };
        while let Some(c) = chars.next() {
            match c {
                ' ' | '\t' => end_word(&mut word, &mut out),
                '\n' | ';' | '&' | '|' | '<' | '>' | '(' | ')' => {
                    end_word(&mut word, &mut out);
                    let mut op = c.to_string();
                    while let Some(&n) = chars.peek() {
                        if matches!(n, ';' | '&' | '|' | '<' | '>') && n != '\n' {
                            op.push(n);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    out.push(Shape::Op(op));
                }
                '#' if word.is_none() => {
                    out.push(Shape::Comment);
                    return out;
                }
                _ => {
                    let w = word.get_or_insert((c == '-', false));
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '\'' => {
                            for q in chars.by_ref() {
                                if q == '\'' {
                                    break;
                                }
                            }
                        }
                        '"' => {
                            while let Some(q) = chars.next() {
                                match q {
                                    '"' => break,
                                    '\\' => {
                                        chars.next();
                                    }
                                    '$' | '`' => w.1 = true,
                                    _ => {}
                                }
                            }
                        }
                        '$' | '`' | '*' | '?' | '[' | '~' | '{' | '}' => w.1 = true,
                        _ => {}
                    }
                }
            }
        }
        end_word(&mut word, &mut out);
        out
    }

    /// The script of the fetcher `s` gets.
    fn script_of(provider: Provider, s: &Secret) -> String {
        let command = fetcher_of(provider, s).command.unwrap();
        assert_eq!(command[..2], ["sh", "-ec"]);
        command[2].clone()
    }

    #[test]
    fn the_shape_reader_sees_the_injection_it_is_for() {
        let reference = script_of(Provider::Gcp, &secret("TestSecret", "2", ""));
        let injected = reference.replace("TestSecret", "mysecret; touch /tmp/pm-pwned; #");
        assert_ne!(shell_shape(&injected), shell_shape(&reference));
        let substituted = reference.replace("TestSecret", "$(id)");
        assert_ne!(shell_shape(&substituted), shell_shape(&reference));
        let option = reference.replace("TestSecret", "-x");
        assert_ne!(shell_shape(&option), shell_shape(&reference));
        assert_eq!(
            shell_shape("a -b \"$(c d)\" 'e f'; g || h > i # j; k"),
            [
                Shape::Word {
                    dash: false,
                    expands: false
                },
                Shape::Word {
                    dash: true,
                    expands: false
                },
                Shape::Word {
                    dash: false,
                    expands: true
                },
                Shape::Word {
                    dash: false,
                    expands: false
                },
                Shape::Op(";".into()),
                Shape::Word {
                    dash: false,
                    expands: false
                },
                Shape::Op("||".into()),
                Shape::Word {
                    dash: false,
                    expands: false
                },
                Shape::Op(">".into()),
                Shape::Word {
                    dash: false,
                    expands: false
                },
                Shape::Comment,
            ]
        );
    }

    fn shell_name() -> impl Strategy<Value = String> {
        prop_oneof![
            // Flyte's alphabet, slashes, dots and dashes often.
            "[a-zA-Z0-9_/.-]{1,12}",
            // What a script would be attacked with.
            "[a-z;&|$`\"' #/.*~(){}<>\\\\-]{1,12}",
            ".*",
        ]
    }

    proptest! {
        /// Whatever the group and group_version, the GCP and Azure fetchers' scripts split
        /// into the same words and operators as for a plain name (no new command, option,
        /// expansion or comment), or the request is refused; the file they write stays inside
        /// `/etc/flyte/secrets` at a path cleaning leaves alone.
        #[test]
        fn no_accepted_name_changes_the_fetchers_script_or_leaves_the_secrets_dir(
            group in shell_name(),
            version in prop_oneof![Just(String::new()), shell_name()],
            azure_prefix in any::<bool>(),
        ) {
            for provider in [Provider::Gcp, Provider::Azure] {
                let group = if azure_prefix && provider == Provider::Azure {
                    format!("https://v.vault.azure.net/secrets/{group}")
                } else {
                    group.clone()
                };
                let s = secret(&group, &version, "");
                let req = SecretRequest { index: 0, annotation: "flyte.secrets/s0".into(), secret: s.clone() };
                let accepted = injector(provider).accepts(&req, &PodCtx::test(Route::Secrets), &user_pod());
                let Ok(_) = accepted else { continue };
                let reference = match provider {
                    Provider::Gcp => secret("TestSecret", "2", ""),
                    _ => secret("https://v.vault.azure.net/secrets/a", if version.is_empty() { "" } else { "1" }, ""),
                };
                let script = script_of(provider, &s);
                prop_assert_eq!(
                    shell_shape(&script),
                    shell_shape(&script_of(provider, &reference)),
                    "{}", script
                );
                let file = provider.fetch(&s).unwrap().file;
                prop_assert!(file.starts_with("/etc/flyte/secrets/"), "{file}");
                prop_assert_eq!(go_join(&[&file]), file.clone());
            }
        }

        /// Whatever the names, the AWS fetcher runs no script, and its file stays inside
        /// `/etc/flyte/secrets` at the path the names spell (no part moved by `..`), or the
        /// request is refused.
        #[test]
        fn no_accepted_name_moves_the_aws_fetchers_file(group in shell_name(), key in shell_name()) {
            let s = secret(&group, "", &key);
            let Ok(fetch) = Provider::Aws.fetch(&s) else { return Ok(()) };
            prop_assert_eq!(fetch.command, None);
            prop_assert!(fetch.file.starts_with("/etc/flyte/secrets/"), "{}", fetch.file);
            let filename = fetch.env.iter().find(|e| e.name == ENV_SECRET_FILENAME).unwrap();
            let filename = filename.value.as_deref().unwrap();
            // Cleaning dropped empty parts at most: every part is one the names hold.
            let named = format!("{}/{}", group.to_lowercase(), key.to_lowercase());
            let expected: Vec<&str> = named.split('/').filter(|p| !p.is_empty()).collect();
            let got: Vec<&str> = filename.split('/').filter(|p| !p.is_empty()).collect();
            prop_assert_eq!(got, expected);
        }
    }

    fn field() -> impl Strategy<Value = String> {
        // A small alphabet, so two draws often fetch the same thing (case, slashes, colons).
        prop_oneof![Just(String::new()), "[aAb/:.]{0,4}", ".*"]
    }

    proptest! {
        #[test]
        fn fetcher_name_is_a_stable_dns_label(group in ".*", group_version in ".*", key in ".*") {
            let s = secret(&group, &group_version, &key);
            for provider in Provider::ALL {
                let Ok(name) = provider.fetcher_name(&s) else { continue };
                prop_assert!(is_dns1123_label(&name), "{name}");
                let fetcher = fetcher_of(provider, &s);
                prop_assert_eq!(&fetcher.name, &name);
                prop_assert_eq!(&name, &name_by_definition(provider, &fetcher).0);
            }
        }

        #[test]
        fn fetcher_names_differ_exactly_when_the_fetchers_do(
            a in (field(), field(), field()),
            b in (field(), field(), field()),
        ) {
            let (sa, sb) = (secret(&a.0, &a.1, &a.2), secret(&b.0, &b.1, &b.2));
            for provider in Provider::ALL {
                let (Ok(na), Ok(nb)) = (provider.fetcher_name(&sa), provider.fetcher_name(&sb)) else {
                    continue;
                };
                let (fa, fb) = (fetcher_of(provider, &sa), fetcher_of(provider, &sb));
                let (da, inputs_a) = name_by_definition(provider, &fa);
                let (db, inputs_b) = name_by_definition(provider, &fb);
                prop_assert_eq!(&na, &da);
                prop_assert_eq!(&nb, &db);
                prop_assert_eq!(
                    na == nb,
                    inputs_a == inputs_b,
                    "{:?}: {:?} -> {}, {:?} -> {}", provider, a, na, b, nb
                );
                // Different fetched files always mean different fetchers.
                if fa.command != fb.command || fa.env != fb.env {
                    prop_assert_ne!(&na, &nb);
                }
            }
        }
    }
}
