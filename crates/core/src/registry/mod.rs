//! A container's ENTRYPOINT and CMD, read from its image's config in the registry
//! (`embedded.entrypointLookup`).
//!
//! Reference delivery serves ENV_VAR requests by wrapping each container's `command` in
//! `podmutator exec`. A container without `command` runs its image's ENTRYPOINT, which the pod
//! spec does not show: it is read here, before the chain runs, for the containers that need it
//! ([`ImageQuery`]), and the injector reads the answers ([`Entrypoints`]). Only the registries
//! the configuration lists are ever contacted: pod creators choose image names, and an
//! unlisted host is refused before any lookup (see [`crate::config::EntrypointLookupConfig`]). The registry client itself, with the network
//! stack, is in the `podmutator-aws` crate.

pub mod error;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodSpec;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The node label a pod pins its CPU architecture with.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";

/// One image to read, for the platform the pod runs on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ImageQuery {
    /// The image reference as the container writes it.
    pub image: String,
    /// The architecture the pod is pinned to (linux), if it is: then only that platform of a
    /// multi-platform image is read; otherwise every linux platform is, and they must agree.
    pub arch: Option<String>,
}

/// The architecture `spec` pins with `nodeSelector`, or else with a required node affinity
/// whose every term names the same one value (`kubernetes.io/arch In [x]`).
pub fn pinned_arch(spec: &PodSpec) -> Option<String> {
    if let Some(arch) = spec.node_selector.as_ref().and_then(|s| s.get(ARCH_LABEL)) {
        return Some(arch.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let mut found: Option<&String> = None;
    for term in terms {
        let arch =
            term.match_expressions
                .iter()
                .flatten()
                .find_map(|e| match e.values.as_deref() {
                    Some([one]) if e.key == ARCH_LABEL && e.operator == "In" => Some(one),
                    _ => None,
                })?;
        if found.is_some_and(|f| f != arch) {
            return None;
        }
        found = Some(arch);
    }
    found.cloned()
}

/// What an image runs when the container names no `command`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageCommand {
    /// `config.Entrypoint` (empty when unset).
    pub entrypoint: Vec<String>,
    /// `config.Cmd` (empty when unset).
    pub cmd: Vec<String>,
}

/// The answers of one admission's lookups: each image's command, or why it could not be read
/// (a message naming the image and the cause, never a credential).
pub type Entrypoints = BTreeMap<ImageQuery, Result<ImageCommand, String>>;

/// Where image commands are read: the registry client in production, a fake in tests.
pub trait EntrypointSource: Send + Sync {
    fn lookup<'a>(
        &'a self,
        query: &'a ImageQuery,
    ) -> BoxFuture<'a, Result<ImageCommand, error::LookupError>>;
}

/// Looks every query up, in parallel; each answer is the command or why not.
pub async fn lookup_all(source: &Arc<dyn EntrypointSource>, queries: &[ImageQuery]) -> Entrypoints {
    let mut calls = tokio::task::JoinSet::new();
    for q in queries {
        let source = Arc::clone(source);
        let q = q.clone();
        calls.spawn(async move {
            let answer = source.lookup(&q).await.map_err(|e| {
                // The reply gets the kind of failure; what the registry sent goes to the log
                // only, since the pod's creator chose the image and so the registry's words.
                tracing::warn!(
                    image = q.image.as_str(),
                    error = %e,
                    "reading an image's command from its registry failed"
                );
                e.reason(&q.image)
            });
            (q, answer)
        });
    }
    let mut out = Entrypoints::new();
    while let Some(joined) = calls.join_next().await {
        // A task that panicked leaves its query unanswered; the injector refuses it as not read.
        out.extend(joined.ok());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    };

    fn term(values: &[&str]) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: ARCH_LABEL.into(),
                operator: "In".into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            ..Default::default()
        }
    }

    fn with_terms(terms: Vec<NodeSelectorTerm>) -> PodSpec {
        PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_node_selector_pins_the_arch() {
        let spec = PodSpec {
            node_selector: Some([(ARCH_LABEL.to_owned(), "arm64".to_owned())].into()),
            ..Default::default()
        };
        assert_eq!(pinned_arch(&spec).as_deref(), Some("arm64"));
        assert_eq!(pinned_arch(&PodSpec::default()), None);
    }

    #[test]
    fn a_required_affinity_pins_the_arch_only_when_every_term_names_the_same_one() {
        assert_eq!(
            pinned_arch(&with_terms(vec![term(&["amd64"]), term(&["amd64"])])).as_deref(),
            Some("amd64")
        );
        assert_eq!(
            pinned_arch(&with_terms(vec![term(&["amd64", "arm64"])])),
            None
        );
        assert_eq!(
            pinned_arch(&with_terms(vec![term(&["amd64"]), term(&["arm64"])])),
            None
        );
        assert_eq!(
            pinned_arch(&with_terms(vec![
                term(&["amd64"]),
                NodeSelectorTerm::default()
            ])),
            None
        );
    }
}
