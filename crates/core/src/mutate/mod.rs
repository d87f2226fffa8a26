//! The mutator chain: pure, idempotent changes to a typed Pod, built once from config.

pub mod image;
pub mod mesh;
pub mod pod;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{Config, MutatorId, SecretManagerType};
use crate::error::Denial;

/// Every mutator id, in chain order ([`crate::config::MutatorId`]).
pub const MUTATOR_IDS: [&str; 7] = {
    let mut ids = [""; 7];
    let mut i = 0;
    while i < ids.len() {
        ids[i] = crate::config::MutatorId::ALL[i].as_str();
        i += 1;
    }
    ids
};

crate::named_enum! {
    /// Which webhook entry (URL path) the review arrived by.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Route as as_str {
        /// `/mutate--v1-pod`: Flyte's secrets entry (`objectSelector inject-flyte-secrets=true`).
        Secrets = "secrets",
        /// `/mutate/managed-pod`: the mesh entry matching managed pods by label.
        ManagedPod = "managed-pod",
        /// `/mutate/managed-namespace`: the mesh entry matching pods in managed namespaces.
        ManagedNamespace = "managed-namespace",
        /// `/mutate--v1-pod/image-builder`: the Union fork's image-builder entry (its own
        /// `labelSelector`).
        ImageBuilder = "image-builder",
        /// `/mutate/images`: the registry rewrite rules' entry (`images.podSelector`,
        /// `images.namespaceSelector`).
        Images = "images",
    }
}

/// What a mutator may read besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct PodCtx<'a> {
    /// `request.namespace`: a pod being created often has no `metadata.namespace` yet.
    pub namespace: &'a str,
    pub route: Route,
    pub username: &'a str,
    pub groups: &'a [String],
    pub dry_run: bool,
    /// The pod before an UPDATE (`request.oldObject`), its containers of each kind by name and
    /// image only (so that a review's two pods are never in memory whole at once); `None` for a
    /// CREATE. Only mutators that [`PodMutator::checks_updates`] ever see an UPDATE.
    pub old: Option<&'a Pod>,
    /// What the admission fetched before the chain ran, for the member that said what it
    /// needs (the `secrets` mutator's plan and its values, `crate::secrets::Prepared`); opaque
    /// here. `None` before the fetch, and outside an admission.
    pub prepared: Option<&'a (dyn std::any::Any + Send + Sync)>,
}

/// What a mutator did besides changing the pod: what it counted (for the metrics) and what
/// the user should read (`warnings` of the review response). Mutators do not log or count
/// anywhere else; the admission adds these up and reports them once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effects {
    injected: [u32; SecretManagerType::ALL.len()],
    images: [u32; ImageCount::ALL.len()],
    /// Values a dry run replaced with the placeholder.
    withheld: u32,
    /// Warnings for changes a mutator chose not to make (names images and containers, never
    /// secret values).
    pub notes: Vec<String>,
}

/// A mutator's refusal, with what it counted on the way (the image builder's failure counts
/// are the point of its metrics). The counts are boxed: a refusal is the rare path, and the
/// `Result` every mutator returns stays small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub denial: Denial,
    pub effects: Box<Effects>,
}

impl Denied {
    pub fn new(denial: Denial, effects: Effects) -> Self {
        Self {
            denial,
            effects: Box::new(effects),
        }
    }
}

impl From<Denial> for Denied {
    fn from(denial: Denial) -> Self {
        Self::new(denial, Effects::default())
    }
}

crate::named_enum! {
    /// What the image mutators count, by EMF metric name. The first eight are the Union fork's
    /// image-builder metrics (`attempts`, `failures`, `replacements{version,type}`,
    /// `v1_container_validation_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ImageCount as metric {
        Attempts = "ImageBuilderAttempts",
        Failures = "ImageBuilderFailures",
        ReplacedPublicUnversioned = "ImageBuilderReplacements_public_none",
        ReplacedPublicV1 = "ImageBuilderReplacements_public_v1",
        ReplacedOrgUnversioned = "ImageBuilderReplacements_org_none",
        ReplacedOrgV1 = "ImageBuilderReplacements_org_v1",
        ValidationAttempts = "ImageBuilderV1ContainerValidationAttempts",
        ValidationFailures = "ImageBuilderV1ContainerValidationFailures",
        /// Images rewritten by `images.rules`.
        RuleRewrites = "ImageRuleRewrites",
        /// Images `images.rules` left alone because they do not parse.
        Unparsed = "ImageRuleUnparsed",
    }
}

impl Effects {
    /// One more `what`.
    pub fn image(&mut self, what: ImageCount) {
        // A variant's number is its place in `ALL` (declaration order).
        self.images[what as usize] += 1;
    }

    /// Image counts (only those that are not zero).
    pub fn images(&self) -> Vec<(ImageCount, u32)> {
        nonzero(&ImageCount::ALL, self.images)
    }

    /// `n` more secrets injected by `manager`.
    pub fn secrets_injected(&mut self, manager: SecretManagerType, n: u32) {
        self.injected[manager as usize] += n;
    }

    /// Secrets injected, by manager (only managers that injected something).
    pub fn injected(&self) -> Vec<(SecretManagerType, u32)> {
        nonzero(&SecretManagerType::ALL, self.injected)
    }

    /// `n` more secret values a dry run left out (the placeholder is in the pod instead).
    pub fn values_withheld(&mut self, n: u32) {
        self.withheld += n;
    }

    /// Whether a dry run left out any value.
    pub fn any_withheld(&self) -> bool {
        self.withheld > 0
    }

    /// A warning for the review response.
    pub fn note(&mut self, warning: String) {
        self.notes.push(warning);
    }

    /// Adds `other`'s counts and notes (after this one's) to this one.
    pub fn absorb(&mut self, other: Effects) {
        for (a, b) in self.injected.iter_mut().zip(other.injected) {
            *a += b;
        }
        for (a, b) in self.images.iter_mut().zip(other.images) {
            *a += b;
        }
        self.withheld += other.withheld;
        self.notes.extend(other.notes);
    }
}

/// Each of `all` with its count in `counts` (the same places), where that is not zero.
fn nonzero<T: Copy, const N: usize>(all: &[T], counts: [u32; N]) -> Vec<(T, u32)> {
    all.iter()
        .copied()
        .zip(counts)
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(any(test, feature = "testing"))]
impl PodCtx<'static> {
    /// A context outside any admission (tests, examples): namespace `ns`, user `u`.
    pub fn test(route: Route) -> Self {
        PodCtx {
            namespace: "ns",
            route,
            username: "u",
            groups: &[],
            dry_run: false,
            old: None,
            prepared: None,
        }
    }
}

/// One self-contained change to a Pod. Pure (no I/O, no clock, no logging) and idempotent:
/// running it on its own output changes nothing.
pub trait PodMutator: Send + Sync {
    fn id(&self) -> &'static str;
    /// Changes `pod` and says what it counted and noted, or refuses it. A mutator that only
    /// refuses can `?` a [`Denial`].
    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied>;
    /// Whether it also runs on a pod UPDATE (and the `pods/ephemeralcontainers` subresource),
    /// with `ctx.old` set. Only the image builder does: an UPDATE may change images, and
    /// nothing else of a pod that a mutator here writes.
    fn checks_updates(&self) -> bool {
        false
    }
    /// Whether it may change or refuse the pod here, told from its metadata alone. `false` lets
    /// the chain pass it by, and an admission whose chain passes every member by allows the pod
    /// without reading its spec into types or copying it (the copy the patch is diffed against).
    /// The default, `true`, is always right; a mutator that can tell cheaply and for certain
    /// that it would do nothing says so.
    fn applies(&self, _ctx: &PodCtx<'_>, _meta: &ObjectMeta) -> bool {
        true
    }
}

struct Entry {
    mutator: Arc<dyn PodMutator>,
    required: bool,
}

/// The mutators in order, each with Flyte's `required` flag.
#[derive(Default)]
pub struct Chain {
    entries: Vec<Entry>,
}

/// What running the chain did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Ids of the mutators that changed the pod, in order.
    pub changed: Vec<&'static str>,
    /// One entry per optional mutator that failed (the pod is admitted without its change),
    /// then the mutators' own notes.
    pub warnings: Vec<String>,
    /// What every mutator that ran counted.
    pub effects: Effects,
}

impl Chain {
    /// The chain `config` enables, in [`MutatorId::ALL`]'s order, each member `required` as
    /// `mutators.<id>` says or by its default: the refusals whose point is the refusal
    /// (`secrets`, `socket-check`, `image-builder`) are required, the rest optional. `secrets`
    /// is built by the caller (it plans and fetches with it too: `crate::secrets::Prepared`).
    /// Adding a mutator is a line here and its id there.
    pub fn from_config(config: &Config, secrets: Arc<dyn PodMutator>) -> Self {
        let m = &config.mesh;
        let builder = &config.webhook.image_builder_config;
        let mut chain = Self::default();
        for id in MutatorId::ALL {
            let (mutator, required): (Arc<dyn PodMutator>, bool) = match id {
                MutatorId::NamespaceInjection if m.enabled => {
                    (Arc::new(mesh::namespace::NamespaceInjection::new(m)), false)
                }
                MutatorId::Secrets => (secrets.clone(), true),
                MutatorId::Dns if m.enabled && m.dns.enabled => {
                    (Arc::new(mesh::dns::DnsOptions::new(m)), false)
                }
                MutatorId::InitGate if m.enabled && m.gate.enabled => {
                    (Arc::new(mesh::gate::InitGate::new(m)), false)
                }
                MutatorId::SocketCheck if m.enabled && m.socket_check.enabled => {
                    (Arc::new(mesh::socket_check::SocketCheck::new(m)), true)
                }
                MutatorId::ImageBuilder if builder.enabled => (
                    Arc::new(
                        image::ImageBuilder::new(
                            builder,
                            &config
                                .webhook
                                .embedded_secret_manager_config
                                .file_mount_init_container,
                            &config.images,
                        )
                        .with_own(config),
                    ),
                    true,
                ),
                // Never fails: a reference it cannot read is left alone with a warning.
                MutatorId::ImageRules if config.images.enabled => {
                    (Arc::new(image::ImageRules::new(&config.images)), false)
                }
                _ => continue,
            };
            chain.push(mutator, config.mutator_required(id, required));
        }
        chain
    }

    pub fn push(&mut self, mutator: Arc<dyn PodMutator>, required: bool) {
        self.entries.push(Entry { mutator, required });
    }

    pub fn ids(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.mutator.id()).collect()
    }

    /// Whether a member that runs on this operation (`update`: a pod UPDATE) may change or
    /// refuse the pod whose metadata is `meta` ([`PodMutator::applies`]). When none may, the
    /// admission allows the pod as it came, without reading its spec or running the chain.
    pub fn applies(&self, ctx: &PodCtx<'_>, meta: &ObjectMeta, update: bool) -> bool {
        self.members_for(update)
            .any(|(_, e)| e.mutator.applies(ctx, meta))
    }

    /// Each member that runs on this operation, with its place.
    fn members_for(&self, update: bool) -> impl Iterator<Item = (usize, &Entry)> {
        (self.entries.iter().enumerate())
            .filter(move |(_, e)| !update || e.mutator.checks_updates())
    }

    /// Runs the chain's mutators in order: on a pod CREATE every one, on a pod UPDATE
    /// (`update`; `ctx.old` is the pod before it) only those that
    /// [`PodMutator::checks_updates`]. `original` is the pod as it came in (`original == *pod`
    /// on entry): the pod is copied only after a mutator changed it. A required mutator's
    /// failure stops the chain with a denial that names it; an optional one's failure is undone
    /// and becomes a warning.
    pub fn apply(
        &self,
        ctx: &PodCtx<'_>,
        original: &Pod,
        pod: &mut Pod,
        update: bool,
    ) -> Result<Applied, Denied> {
        let mut applied = Applied::default();
        let mut previous = std::borrow::Cow::Borrowed(original);
        for (i, entry) in self.members_for(update) {
            let mutator = &entry.mutator;
            if !mutator.applies(ctx, &pod.metadata) {
                continue;
            }
            let id = mutator.id();
            match mutator.mutate(ctx, pod) {
                Ok(effects) => {
                    applied.effects.absorb(effects);
                    if *pod != *previous {
                        applied.changed.push(id);
                        // Kept for the mutators after this one (to tell what they changed, and
                        // to undo a failed one); after the last there are none, and on a large
                        // pod the copy is a good share of the admission.
                        if i + 1 < self.entries.len() {
                            previous = std::borrow::Cow::Owned(pod.clone());
                        }
                    }
                }
                Err(Denied { denial, effects }) => {
                    applied.effects.absorb(*effects);
                    if entry.required {
                        let denial = Denial {
                            message: format!("[{id}] {}", denial.message),
                            ..denial
                        };
                        return Err(Denied::new(denial, applied.effects));
                    }
                    // A failed mutator may have changed part of the pod; none of it is kept.
                    pod.clone_from(&previous);
                    applied
                        .warnings
                        .push(format!("podmutator: {id} skipped: {}", denial.message));
                }
            }
        }
        applied.warnings.append(&mut applied.effects.notes);
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each member's id and whether its failure denies the pod, in order.
    fn members(chain: &Chain) -> Vec<(&'static str, bool)> {
        (chain.entries.iter())
            .map(|e| (e.mutator.id(), e.required))
            .collect()
    }

    struct Label(&'static str);
    impl PodMutator for Label {
        fn id(&self) -> &'static str {
            self.0
        }
        fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
            pod.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(self.0.into(), "true".into());
            Ok(Effects::default())
        }
    }

    /// Changes the pod, then fails: the change must not survive.
    struct HalfDone;
    impl PodMutator for HalfDone {
        fn id(&self) -> &'static str {
            "half-done"
        }
        fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
            pod.metadata.name = Some("renamed".into());
            Err(Denial::bad_request("Broken", "it broke; fix the thing").into())
        }
    }

    /// Counts one image attempt and notes it, then changes the pod (or only counts, and
    /// refuses, when `deny`).
    struct Counting {
        deny: bool,
    }
    impl PodMutator for Counting {
        fn id(&self) -> &'static str {
            "counting"
        }
        fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
            let mut effects = Effects::default();
            effects.image(ImageCount::Attempts);
            effects.secrets_injected(SecretManagerType::K8s, 2);
            if self.deny {
                return Err(Denied::new(
                    Denial::forbidden("No", "not this one"),
                    effects,
                ));
            }
            effects.note("counted".into());
            pod.metadata.name = Some("counted".into());
            Ok(effects)
        }
    }

    fn mk_pod() -> Pod {
        pod::testing::mk_pod().build()
    }

    /// A CREATE through `chain`, nothing prepared.
    fn apply(chain: &Chain, pod: &mut Pod) -> Result<Applied, Denied> {
        let original = pod.clone();
        chain.apply(&PodCtx::test(Route::Secrets), &original, pod, false)
    }

    /// A member that says it does not apply is passed by, not run; with no other member, the
    /// chain says so too, and the admission needs no copy of the pod.
    #[test]
    fn a_member_that_does_not_apply_is_passed_by() {
        struct Never;
        impl PodMutator for Never {
            fn id(&self) -> &'static str {
                "never"
            }
            fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
                pod.metadata.name = Some("changed".into());
                Ok(Effects::default())
            }
            fn applies(&self, _: &PodCtx<'_>, _: &ObjectMeta) -> bool {
                false
            }
        }
        let ctx = PodCtx::test(Route::Secrets);
        let mut chain = Chain::default();
        chain.push(Arc::new(Never), true);
        let mut pod = mk_pod();
        assert!(!chain.applies(&ctx, &pod.metadata, false));
        assert_eq!(apply(&chain, &mut pod).unwrap(), Applied::default());
        assert_eq!(pod, mk_pod());

        chain.push(Arc::new(Label("x")), false);
        assert!(chain.applies(&ctx, &pod.metadata, false));
        assert!(
            !chain.applies(&ctx, &pod.metadata, true),
            "no member checks updates"
        );
        assert_eq!(apply(&chain, &mut pod).unwrap().changed, ["x"]);
        assert_eq!(pod.metadata.name, mk_pod().metadata.name);
    }

    #[test]
    fn required_mutator_failure_denies_and_names_the_mutator() {
        let mut chain = Chain::default();
        chain.push(Arc::new(Label("a")), true);
        chain.push(Arc::new(HalfDone), true);
        let err = apply(&chain, &mut mk_pod()).unwrap_err().denial;
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "[half-done] it broke; fix the thing");
    }

    #[test]
    fn optional_mutator_failure_is_undone_and_warned() {
        let mut chain = Chain::default();
        chain.push(Arc::new(Label("a")), true);
        chain.push(Arc::new(HalfDone), false);
        chain.push(Arc::new(Label("b")), false);
        let mut pod = mk_pod();
        let applied = apply(&chain, &mut pod).unwrap();
        assert_eq!(applied.changed, vec!["a", "b"]);
        assert_eq!(
            applied.warnings,
            vec!["podmutator: half-done skipped: it broke; fix the thing"]
        );
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    }

    fn chain(v: serde_json::Value) -> Chain {
        Chain::from_config(
            &Config::from_value(v).expect("loads").config,
            Arc::new(Label("secrets")),
        )
    }

    fn mesh_with_gate() -> serde_json::Value {
        serde_json::json!({"enabled": true,
            "gate": {"enabled": true, "image": "registry.example/aether/agent:v1"}})
    }

    /// The intended chain, stated here rather than read from [`MutatorId::ALL`] (the order
    /// [`Chain::from_config`] builds in), so reordering that constant fails this test:
    /// - `namespace-injection` first: it adds the managed label, and every later mutator decides
    ///   whether to act by reading that label;
    /// - `secrets` before the gate: the secrets managers append fetcher init containers, and the
    ///   gate inserts itself at index 0 afterwards, so the gate still runs first in the pod;
    /// - `dns` after `secrets` and before the gate (neither reads the other's fields;
    ///   docs/mesh.md documents this order);
    /// - `socket-check` after the mesh: it denies on the final mesh pod, after the gate added
    ///   its volume;
    /// - `image-builder` after every container is in the pod (the secrets fetchers' and the
    ///   gate's included), so its verification sees every image; it excludes the Embedded init
    ///   container by name, as in Flyte;
    /// - `image-rules` last: "applied after the Flyte mutator", so it rewrites the gate's image
    ///   too; when it rewrites what the image builder allowed, the image builder, called again,
    ///   checks the mirrored image as written (`ImageBuilder::allows`).
    #[test]
    fn the_chain_is_built_in_the_intended_order_with_each_default_required() {
        let all = chain(serde_json::json!({
            "mesh": mesh_with_gate(),
            "webhook": {"imageBuilderConfig": {"enabled": true,
                "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"},
                "labelSelector": {"matchLabels": {"image-builder": "true"}}}},
            "images": {"enabled": true, "rules": [{"match": "docker.io", "replace": "r.io/hub"}]}
        }));
        assert_eq!(
            members(&all),
            [
                ("namespace-injection", false),
                ("secrets", true),
                ("dns", false),
                ("init-gate", false),
                ("socket-check", true),
                ("image-builder", true),
                ("image-rules", false),
            ]
        );
        // Config keys under `mutators` are the same ids, in the same order.
        assert_eq!(MUTATOR_IDS.to_vec(), all.ids());
        // `mutators.<id>.required` overrides the default either way.
        let overridden = chain(serde_json::json!({"mesh": {"enabled": true},
            "mutators": {"secrets": {"required": false}, "dns": {"required": true}}}));
        assert_eq!(
            members(&overridden),
            [
                ("namespace-injection", false),
                ("secrets", false),
                ("dns", true),
                ("socket-check", true),
            ]
        );
    }

    #[rstest::rstest]
    #[case::defaults(serde_json::json!({}), &["secrets"])]
    #[case::dns_off(serde_json::json!({"mesh": {"enabled": true, "dns": {"enabled": false}}}), &["namespace-injection", "secrets", "socket-check"])]
    #[case::gate_default_off(serde_json::json!({"mesh": {"enabled": true}}), &["namespace-injection", "secrets", "dns", "socket-check"])]
    #[case::gate_on(serde_json::json!({"mesh": mesh_with_gate()}), &["namespace-injection", "secrets", "dns", "init-gate", "socket-check"])]
    #[case::socket_check_off(serde_json::json!({"mesh": {"enabled": true, "socketCheck": {"enabled": false}}}), &["namespace-injection", "secrets", "dns"])]
    #[case::mesh_off(serde_json::json!({"mesh": {"enabled": false, "gate": {"enabled": true, "image": "x"}}}), &["secrets"])]
    fn switches_leave_mutators_out_without_moving_the_others(
        #[case] v: serde_json::Value,
        #[case] ids: &[&str],
    ) {
        assert_eq!(chain(v).ids(), ids);
    }

    #[test]
    fn a_mutator_that_changes_nothing_is_not_reported() {
        let mut chain = Chain::default();
        chain.push(Arc::new(Label("a")), true);
        let mut pod = mk_pod();
        apply(&chain, &mut pod).unwrap();
        let again = apply(&chain, &mut pod).unwrap();
        assert!(again.changed.is_empty());
    }

    /// What the admission prepared reaches the members through the context; effects add up.
    #[test]
    fn the_prepared_values_reach_the_members_and_effects_add_up() {
        /// Names the pod after what was prepared for it, when it is a `&str`.
        struct Prepared;
        impl PodMutator for Prepared {
            fn id(&self) -> &'static str {
                "prepared"
            }
            fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
                if let Some(name) = ctx.prepared.and_then(|p| p.downcast_ref::<&str>()) {
                    pod.metadata.namespace = Some((*name).to_owned());
                }
                Ok(Effects::default())
            }
        }
        let mut chain = Chain::default();
        chain.push(Arc::new(Label("a")), true);
        chain.push(Arc::new(Prepared), true);
        chain.push(Arc::new(Counting { deny: false }), true);
        chain.push(Arc::new(HalfDone), false);
        assert_eq!(chain.ids(), vec!["a", "prepared", "counting", "half-done"]);
        let mut pod = mk_pod();
        assert_eq!(
            apply(&chain, &mut pod).unwrap().changed,
            vec!["a", "counting"]
        );

        let mut pod = mk_pod();
        let original = pod.clone();
        let value = "fetched";
        let ctx = PodCtx {
            prepared: Some(&value),
            ..PodCtx::test(Route::Secrets)
        };
        let applied = chain.apply(&ctx, &original, &mut pod, false).unwrap();
        assert_eq!(applied.changed, vec!["a", "prepared", "counting"]);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("fetched"));
        assert_eq!(pod.metadata.name.as_deref(), Some("counted"));
        // The failed optional mutator's warning, then the notes.
        assert_eq!(
            applied.warnings,
            vec![
                "podmutator: half-done skipped: it broke; fix the thing".to_owned(),
                "counted".to_owned()
            ]
        );
        assert!(applied.effects.notes.is_empty());
        assert_eq!(applied.effects.images(), vec![(ImageCount::Attempts, 1)]);
        assert_eq!(
            applied.effects.injected(),
            vec![(SecretManagerType::K8s, 2)]
        );
        // An UPDATE runs none of them (none checks updates).
        let mut pod = mk_pod();
        let original = pod.clone();
        let applied = chain.apply(&ctx, &original, &mut pod, true).unwrap();
        assert!(applied.changed.is_empty());

        // A required refusal keeps what was counted on the way to it.
        let mut pod = mk_pod();
        let original = pod.clone();
        let mut chain = Chain::default();
        chain.push(Arc::new(Label("a")), true);
        chain.push(Arc::new(Counting { deny: true }), true);
        let denied = chain.apply(&ctx, &original, &mut pod, false).unwrap_err();
        assert_eq!(denied.denial.message, "[counting] not this one");
        assert_eq!(denied.effects.images(), vec![(ImageCount::Attempts, 1)]);
    }
}
