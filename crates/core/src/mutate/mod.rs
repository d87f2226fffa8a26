//! The mutator chain: pure, idempotent changes to a typed Pod, built once from config.

pub mod image;
pub mod mesh;
pub mod pod;

use k8s_openapi::api::core::v1::Pod;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::SecretManagerType;
use crate::error::Denial;

/// Every mutator id, in chain order. Config keys under `mutators` must be one of these.
pub const MUTATOR_IDS: &[&str] = &[
    "namespace-injection",
    "secrets",
    "dns",
    "init-gate",
    "socket-check",
    "image-builder",
    "image-rules",
];

/// Which webhook entry (URL path) the review arrived by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/mutate--v1-pod`: Flyte's secrets entry (`objectSelector inject-flyte-secrets=true`).
    Secrets,
    /// `/mutate/managed-pod`: the mesh entry matching managed pods by label.
    ManagedPod,
    /// `/mutate/managed-namespace`: the mesh entry matching pods in managed namespaces.
    ManagedNamespace,
    /// `/mutate--v1-pod/image-builder`: the Union fork's image-builder entry (its own
    /// `labelSelector`).
    ImageBuilder,
    /// `/mutate/images`: the registry rewrite rules' entry (`images.podSelector`,
    /// `images.namespaceSelector`).
    Images,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Secrets => "secrets",
            Route::ManagedPod => "managed-pod",
            Route::ManagedNamespace => "managed-namespace",
            Route::ImageBuilder => "image-builder",
            Route::Images => "images",
        }
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
    /// Where mutators count what they did, for metrics.
    pub tally: &'a Tally,
    /// The pod before an UPDATE (`request.oldObject`); `None` for a CREATE. Only mutators that
    /// [`PodMutator::checks_updates`] ever see an UPDATE.
    pub old: Option<&'a Pod>,
}

/// Per-admission counters that mutators fill in (mutators do not log; the admission reports).
#[derive(Debug, Default)]
pub struct Tally {
    injected: [AtomicU32; SecretManagerType::ALL.len()],
    images: [AtomicU32; ImageCount::ALL.len()],
    /// Things the user should see (`warnings` of the review response), for changes a mutator
    /// chose not to make.
    notes: Mutex<Vec<String>>,
    /// Values a dry run replaced with the placeholder.
    withheld: AtomicU32,
}

/// What the image mutators count. The first seven are the Union fork's image-builder metrics
/// (`attempts`, `failures`, `replacements{version,type}`, `v1_container_validation_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageCount {
    Attempts,
    Failures,
    ReplacedPublicUnversioned,
    ReplacedPublicV1,
    ReplacedOrgUnversioned,
    ReplacedOrgV1,
    ValidationAttempts,
    ValidationFailures,
    /// Images rewritten by `images.rules`.
    RuleRewrites,
    /// Images `images.rules` left alone because they do not parse.
    Unparsed,
}

impl ImageCount {
    pub const ALL: [ImageCount; 10] = [
        ImageCount::Attempts,
        ImageCount::Failures,
        ImageCount::ReplacedPublicUnversioned,
        ImageCount::ReplacedPublicV1,
        ImageCount::ReplacedOrgUnversioned,
        ImageCount::ReplacedOrgV1,
        ImageCount::ValidationAttempts,
        ImageCount::ValidationFailures,
        ImageCount::RuleRewrites,
        ImageCount::Unparsed,
    ];

    /// The EMF metric name.
    pub fn metric(self) -> &'static str {
        match self {
            ImageCount::Attempts => "ImageBuilderAttempts",
            ImageCount::Failures => "ImageBuilderFailures",
            ImageCount::ReplacedPublicUnversioned => "ImageBuilderReplacements_public_none",
            ImageCount::ReplacedPublicV1 => "ImageBuilderReplacements_public_v1",
            ImageCount::ReplacedOrgUnversioned => "ImageBuilderReplacements_org_none",
            ImageCount::ReplacedOrgV1 => "ImageBuilderReplacements_org_v1",
            ImageCount::ValidationAttempts => "ImageBuilderV1ContainerValidationAttempts",
            ImageCount::ValidationFailures => "ImageBuilderV1ContainerValidationFailures",
            ImageCount::RuleRewrites => "ImageRuleRewrites",
            ImageCount::Unparsed => "ImageRuleUnparsed",
        }
    }
}

/// A tally nobody reads, for callers that do not report metrics.
pub static UNCOUNTED: Tally = Tally::new();

impl Tally {
    pub const fn new() -> Self {
        Self {
            injected: [const { AtomicU32::new(0) }; SecretManagerType::ALL.len()],
            images: [const { AtomicU32::new(0) }; ImageCount::ALL.len()],
            notes: Mutex::new(Vec::new()),
            withheld: AtomicU32::new(0),
        }
    }

    /// One secret value a dry run left out (the placeholder is in the pod instead).
    pub fn value_withheld(&self) {
        self.withheld.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a dry run left out any value.
    pub fn any_withheld(&self) -> bool {
        self.withheld.load(Ordering::Relaxed) > 0
    }

    /// One more `what`.
    pub fn image(&self, what: ImageCount) {
        if let Some(i) = ImageCount::ALL.iter().position(|c| *c == what) {
            self.images[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Image counts (only those that are not zero).
    pub fn images(&self) -> Vec<(ImageCount, u32)> {
        ImageCount::ALL
            .iter()
            .zip(&self.images)
            .map(|(c, n)| (*c, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// A warning for the review response (names images and containers, never secret values).
    pub fn note(&self, warning: String) {
        // Nobody reads the shared tally; it must not grow.
        if std::ptr::eq(self, &UNCOUNTED) {
            return;
        }
        if let Ok(mut notes) = self.notes.lock() {
            notes.push(warning);
        }
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().map(|n| n.clone()).unwrap_or_default()
    }

    /// One secret injected by `manager`.
    pub fn secret_injected(&self, manager: SecretManagerType) {
        if let Some(i) = SecretManagerType::ALL.iter().position(|t| *t == manager) {
            self.injected[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Secrets injected, by manager (only managers that injected something).
    pub fn injected(&self) -> Vec<(SecretManagerType, u32)> {
        SecretManagerType::ALL
            .iter()
            .zip(&self.injected)
            .map(|(t, n)| (*t, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

#[cfg(any(test, feature = "testing"))]
impl PodCtx<'static> {
    /// A context outside any admission (tests, examples): namespace `ns`, user `u`, nothing
    /// counted.
    pub fn test(route: Route) -> Self {
        PodCtx {
            namespace: "ns",
            route,
            username: "u",
            groups: &[],
            dry_run: false,
            tally: &UNCOUNTED,
            old: None,
        }
    }
}

/// One self-contained change to a Pod. Pure (no I/O, no clock, no logging) and idempotent:
/// running it on its own output changes nothing.
pub trait PodMutator: Send + Sync {
    fn id(&self) -> &'static str;
    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<(), Denial>;
    /// Whether it also runs on a pod UPDATE (and the `pods/ephemeralcontainers` subresource),
    /// with `ctx.old` set. Only the image builder does: an UPDATE may change images, and
    /// nothing else of a pod that a mutator here writes.
    fn checks_updates(&self) -> bool {
        false
    }
}

/// A shared mutator (the app keeps the `secrets` mutator to plan with, the chain runs it).
impl<M: PodMutator + ?Sized> PodMutator for std::sync::Arc<M> {
    fn id(&self) -> &'static str {
        (**self).id()
    }
    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<(), Denial> {
        (**self).mutate(ctx, pod)
    }
    fn checks_updates(&self) -> bool {
        (**self).checks_updates()
    }
}

struct Entry {
    mutator: Box<dyn PodMutator>,
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
    /// One entry per optional mutator that failed (the pod is admitted without its change).
    pub warnings: Vec<String>,
}

impl Chain {
    pub fn push(&mut self, mutator: Box<dyn PodMutator>, required: bool) {
        self.entries.push(Entry { mutator, required });
    }

    pub fn ids(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.mutator.id()).collect()
    }

    /// Runs every mutator in order. A required mutator's failure stops the chain with a denial
    /// that names it; an optional one's failure is undone and becomes a warning.
    pub fn apply(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Applied, Denial> {
        let original = pod.clone();
        self.apply_from(ctx, &original, pod, None)
    }

    /// [`Chain::apply`] for a caller that already holds a copy of the pod as it came in
    /// (`original == *pod` on entry): the pod is copied again only after a mutator changed it.
    /// `stand_in` runs in place of the entry with its id, with that entry's `required`: the
    /// admission's per-request form of a mutator (the `secrets` mutator with this pod's plan
    /// and fetched values).
    pub fn apply_from(
        &self,
        ctx: &PodCtx<'_>,
        original: &Pod,
        pod: &mut Pod,
        stand_in: Option<&dyn PodMutator>,
    ) -> Result<Applied, Denial> {
        self.run(ctx, original, pod, stand_in, false)
    }

    /// The chain on a pod UPDATE (`ctx.old` is the pod before it): only the mutators that
    /// [`PodMutator::checks_updates`] run, each as in [`Chain::apply_from`].
    pub fn apply_update(
        &self,
        ctx: &PodCtx<'_>,
        original: &Pod,
        pod: &mut Pod,
    ) -> Result<Applied, Denial> {
        self.run(ctx, original, pod, None, true)
    }

    fn run(
        &self,
        ctx: &PodCtx<'_>,
        original: &Pod,
        pod: &mut Pod,
        stand_in: Option<&dyn PodMutator>,
        update: bool,
    ) -> Result<Applied, Denial> {
        let mut applied = Applied::default();
        let mut previous = std::borrow::Cow::Borrowed(original);
        for (i, entry) in self.entries.iter().enumerate() {
            if update && !entry.mutator.checks_updates() {
                continue;
            }
            let id = entry.mutator.id();
            let mutator = match stand_in {
                Some(m) if m.id() == id => m,
                _ => entry.mutator.as_ref(),
            };
            match mutator.mutate(ctx, pod) {
                Ok(()) => {
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
                Err(denial) if entry.required => {
                    return Err(Denial {
                        message: format!("[{id}] {}", denial.message),
                        ..denial
                    });
                }
                Err(denial) => {
                    // A failed mutator may have changed part of the pod; none of it is kept.
                    pod.clone_from(&previous);
                    applied
                        .warnings
                        .push(format!("podmutator: {id} skipped: {}", denial.message));
                }
            }
        }
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Label(&'static str);
    impl PodMutator for Label {
        fn id(&self) -> &'static str {
            self.0
        }
        fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<(), Denial> {
            pod.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(self.0.into(), "true".into());
            Ok(())
        }
    }

    /// Changes the pod, then fails: the change must not survive.
    struct HalfDone;
    impl PodMutator for HalfDone {
        fn id(&self) -> &'static str {
            "half-done"
        }
        fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<(), Denial> {
            pod.metadata.name = Some("renamed".into());
            Err(Denial::bad_request("Broken", "it broke; fix the thing"))
        }
    }

    fn mk_pod() -> Pod {
        pod::testing::mk_pod().build()
    }

    #[test]
    fn required_mutator_failure_denies_and_names_the_mutator() {
        let mut chain = Chain::default();
        chain.push(Box::new(Label("a")), true);
        chain.push(Box::new(HalfDone), true);
        let err = chain
            .apply(&PodCtx::test(Route::Secrets), &mut mk_pod())
            .unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "[half-done] it broke; fix the thing");
    }

    #[test]
    fn optional_mutator_failure_is_undone_and_warned() {
        let mut chain = Chain::default();
        chain.push(Box::new(Label("a")), true);
        chain.push(Box::new(HalfDone), false);
        chain.push(Box::new(Label("b")), false);
        let mut pod = mk_pod();
        let applied = chain
            .apply(&PodCtx::test(Route::Secrets), &mut pod)
            .unwrap();
        assert_eq!(applied.changed, vec!["a", "b"]);
        assert_eq!(
            applied.warnings,
            vec!["podmutator: half-done skipped: it broke; fix the thing"]
        );
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    }

    #[test]
    fn a_mutator_that_changes_nothing_is_not_reported() {
        let mut chain = Chain::default();
        chain.push(Box::new(Label("a")), true);
        let mut pod = mk_pod();
        chain
            .apply(&PodCtx::test(Route::Secrets), &mut pod)
            .unwrap();
        let again = chain
            .apply(&PodCtx::test(Route::Secrets), &mut pod)
            .unwrap();
        assert!(again.changed.is_empty());
    }
}
