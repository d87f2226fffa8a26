//! Namespace auto-injection: a pod created in a managed namespace becomes a managed pod without
//! a per-pod label, so the CNI (which selects pods, not namespaces) meshes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::mutate::mesh::{MANAGED, MeshConfig};
use crate::mutate::{Denied, Effects, PodCtx, PodMutator, Route};

/// Adds label `<managedLabel>: "true"` to a pod that arrived by `/mutate/managed-namespace` and
/// has no value for that label. A pod that says `"false"` has opted out and is left untouched;
/// any other value is the user's and is never rewritten. Other routes add nothing: there the
/// pod matched by its own label, or is not a mesh pod at all.
pub struct NamespaceInjection {
    label: String,
}

impl NamespaceInjection {
    pub fn new(cfg: &MeshConfig) -> Self {
        Self {
            label: cfg.managed_label.clone(),
        }
    }
}

/// `labels` with `key: "true"` added unless `key` already has a value (which is kept).
pub fn with_managed_label(
    labels: Option<&BTreeMap<String, String>>,
    key: &str,
) -> BTreeMap<String, String> {
    let mut out = labels.cloned().unwrap_or_default();
    out.entry(key.to_owned())
        .or_insert_with(|| MANAGED.to_owned());
    out
}

impl PodMutator for NamespaceInjection {
    fn id(&self) -> &'static str {
        "namespace-injection"
    }

    fn applies(&self, ctx: &PodCtx<'_>, _: &ObjectMeta) -> bool {
        ctx.route == Route::ManagedNamespace
    }

    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        if self.applies(ctx, &pod.metadata) && super::label(pod, &self.label).is_none() {
            let labels = &mut pod.metadata.labels;
            *labels = Some(with_managed_label(labels.as_ref(), &self.label));
        }
        Ok(Effects::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const KEY: &str = "aether.io/managed";

    fn mk_pod(labels: &[(&str, &str)]) -> Pod {
        crate::mutate::pod::testing::mk_pod().labels(labels).build()
    }

    fn run(route: Route, pod: &mut Pod) {
        let ctx = PodCtx {
            namespace: "shop",
            ..PodCtx::test(route)
        };
        NamespaceInjection::new(&MeshConfig::default())
            .mutate(&ctx, pod)
            .unwrap();
    }

    #[rstest]
    #[case::namespace_route_adds_the_label(Route::ManagedNamespace, &[], &[(KEY, "true")])]
    #[case::other_labels_are_kept(Route::ManagedNamespace, &[("app", "web")], &[("app", "web"), (KEY, "true")])]
    #[case::existing_true_is_kept(Route::ManagedNamespace, &[(KEY, "true")], &[(KEY, "true")])]
    #[case::opted_out_pod_is_untouched(Route::ManagedNamespace, &[(KEY, "false")], &[(KEY, "false")])]
    #[case::another_value_is_not_rewritten(Route::ManagedNamespace, &[(KEY, "yes")], &[(KEY, "yes")])]
    #[case::pod_route_adds_nothing(Route::ManagedPod, &[], &[])]
    #[case::secrets_route_adds_nothing(Route::Secrets, &[("inject-flyte-secrets", "true")], &[("inject-flyte-secrets", "true")])]
    fn managed_label(
        #[case] route: Route,
        #[case] before: &[(&str, &str)],
        #[case] after: &[(&str, &str)],
    ) {
        let mut pod = mk_pod(before);
        run(route, &mut pod);
        assert_eq!(pod, mk_pod(after));
        let once = pod.clone();
        run(route, &mut pod);
        assert_eq!(pod, once, "second pass changes nothing");
    }

    #[test]
    fn with_managed_label_keeps_an_existing_value() {
        let labels: BTreeMap<_, _> = [(KEY.to_owned(), "false".to_owned())].into();
        assert_eq!(with_managed_label(Some(&labels), KEY), labels);
        assert_eq!(
            with_managed_label(None, KEY),
            BTreeMap::from([(KEY.to_owned(), "true".to_owned())])
        );
    }
}
