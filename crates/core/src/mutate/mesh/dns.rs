//! Resolver options for managed pods.
//!
//! `ndots`: Kubernetes' default of 5 makes the resolver walk the cluster search list before it
//! tries a mesh name such as `web.aether.internal` as written. glibc tolerates the fall-through;
//! musl (Alpine) trips on the churn and fails to resolve mesh names. With `ndots` equal to the
//! dot count of `<svc>.<meshDomain>`, mesh names are tried absolute first while shorter
//! Kubernetes names keep their search behaviour.
//!
//! `timeout`/`attempts`: the resolver a managed pod talks to is node-local (the CNI sends :53 to
//! the node's mesh DNS), so an unanswered query was dropped, not slow. The stock 5 s retransmit
//! then stalls every concurrent lookup of that name (Go's resolver shares one in-flight query per
//! name) for 5 s. A 1 s retransmit is generous against a node-local resolver, and 3 attempts keep
//! the worst case at 3 s instead of the defaults' 10 s.

use k8s_openapi::api::core::v1::{Pod, PodDNSConfig, PodDNSConfigOption};

use crate::mutate::mesh::{MeshConfig, is_managed};
use crate::mutate::{Denied, Effects, PodCtx, PodMutator};

/// Upserts `dnsConfig.options` `ndots`, `timeout` and `attempts` (in that order when appended)
/// on managed pods. Name servers, searches and other options are kept in order; an existing
/// entry for one of ours gets our value in place.
pub struct DnsOptions {
    label: String,
    options: Vec<PodDNSConfigOption>,
}

impl DnsOptions {
    pub fn new(cfg: &MeshConfig) -> Self {
        let opt = |name: &str, value: u32| PodDNSConfigOption {
            name: Some(name.to_owned()),
            value: Some(value.to_string()),
        };
        Self {
            label: cfg.managed_label.clone(),
            options: vec![
                opt("ndots", cfg.ndots()),
                opt("timeout", cfg.dns.timeout),
                opt("attempts", cfg.dns.attempts),
            ],
        }
    }
}

/// `dns` with each of `wanted` set: every existing entry of that name takes the wanted value
/// where it stands (the resolver lets a later duplicate win, so none may keep an old value), and
/// a missing one is appended. Everything else is kept as it was, in order, so that a pod that
/// already has our values yields an equal config and no patch.
pub fn set_dns_options(dns: Option<&PodDNSConfig>, wanted: &[PodDNSConfigOption]) -> PodDNSConfig {
    let mut out = dns.cloned().unwrap_or_default();
    let options = out.options.get_or_insert_with(Vec::new);
    for want in wanted {
        let mut found = false;
        for have in options.iter_mut().filter(|o| o.name == want.name) {
            have.value.clone_from(&want.value);
            found = true;
        }
        if !found {
            options.push(want.clone());
        }
    }
    out
}

impl PodMutator for DnsOptions {
    fn id(&self) -> &'static str {
        "dns"
    }

    fn mutate(&self, _: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        if is_managed(pod, &self.label)
            && let Some(spec) = pod.spec.as_mut()
        {
            let updated = set_dns_options(spec.dns_config.as_ref(), &self.options);
            if spec.dns_config.as_ref() != Some(&updated) {
                spec.dns_config = Some(updated);
            }
        }
        Ok(Effects::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn opt(name: &str, value: Option<&str>) -> PodDNSConfigOption {
        PodDNSConfigOption {
            name: Some(name.into()),
            value: value.map(Into::into),
        }
    }

    fn ours() -> Vec<PodDNSConfigOption> {
        DnsOptions::new(&MeshConfig::default()).options
    }

    fn dns(options: Vec<PodDNSConfigOption>) -> PodDNSConfig {
        PodDNSConfig {
            nameservers: None,
            options: Some(options),
            searches: None,
        }
    }

    #[rstest]
    #[case::no_dns_config_gets_all_three(
        None,
        dns(vec![opt("ndots", Some("2")), opt("timeout", Some("1")), opt("attempts", Some("3"))])
    )]
    #[case::empty_options_get_all_three(
        Some(dns(vec![])),
        dns(vec![opt("ndots", Some("2")), opt("timeout", Some("1")), opt("attempts", Some("3"))])
    )]
    #[case::existing_ndots_is_replaced_in_place(
        Some(dns(vec![opt("edns0", None), opt("ndots", Some("5")), opt("single-request", None)])),
        dns(vec![opt("edns0", None), opt("ndots", Some("2")), opt("single-request", None), opt("timeout", Some("1")), opt("attempts", Some("3"))])
    )]
    #[case::our_options_in_another_order_stay_where_they_are(
        Some(dns(vec![opt("attempts", Some("5")), opt("timeout", Some("5")), opt("ndots", Some("5"))])),
        dns(vec![opt("attempts", Some("3")), opt("timeout", Some("1")), opt("ndots", Some("2"))])
    )]
    #[case::every_duplicate_gets_our_value(
        Some(dns(vec![opt("ndots", Some("5")), opt("edns0", None), opt("ndots", Some("1"))])),
        dns(vec![opt("ndots", Some("2")), opt("edns0", None), opt("ndots", Some("2")), opt("timeout", Some("1")), opt("attempts", Some("3"))])
    )]
    #[case::option_without_value_gets_ours(
        Some(dns(vec![opt("timeout", None)])),
        dns(vec![opt("timeout", Some("1")), opt("ndots", Some("2")), opt("attempts", Some("3"))])
    )]
    #[case::nameservers_and_searches_are_kept(
        Some(PodDNSConfig {
            nameservers: Some(vec!["10.0.0.10".into(), "1.1.1.1".into()]),
            searches: Some(vec!["b.example".into(), "a.example".into()]),
            options: None,
        }),
        PodDNSConfig {
            nameservers: Some(vec!["10.0.0.10".into(), "1.1.1.1".into()]),
            searches: Some(vec!["b.example".into(), "a.example".into()]),
            options: Some(vec![opt("ndots", Some("2")), opt("timeout", Some("1")), opt("attempts", Some("3"))]),
        }
    )]
    #[case::our_values_already_there_change_nothing(
        Some(dns(vec![opt("ndots", Some("2")), opt("edns0", None), opt("timeout", Some("1")), opt("attempts", Some("3"))])),
        dns(vec![opt("ndots", Some("2")), opt("edns0", None), opt("timeout", Some("1")), opt("attempts", Some("3"))])
    )]
    fn set_dns_options_upserts_in_place(
        #[case] before: Option<PodDNSConfig>,
        #[case] expected: PodDNSConfig,
    ) {
        let once = set_dns_options(before.as_ref(), &ours());
        assert_eq!(once, expected);
        assert_eq!(
            set_dns_options(Some(&once), &ours()),
            once,
            "second pass changes nothing"
        );
    }

    fn mk_pod(labels: &[(&str, &str)], dns_config: Option<PodDNSConfig>) -> Pod {
        let mut pod = crate::mutate::pod::testing::mk_pod()
            .labels(labels)
            .with_spec(|s| s.dns_config = dns_config)
            .build();
        // A pod with no labels has an empty label map here, as the dns cases expect.
        pod.metadata.labels.get_or_insert_with(Default::default);
        pod
    }

    fn run(m: &DnsOptions, pod: &mut Pod) {
        let ctx = PodCtx {
            namespace: "shop",
            ..PodCtx::test(crate::mutate::Route::ManagedPod)
        };
        m.mutate(&ctx, pod).unwrap();
    }

    const KEY: &str = "aether.io/managed";

    #[rstest]
    #[case::managed_pod_gets_the_options(&[(KEY, "true")], true)]
    #[case::opted_out_pod_is_untouched(&[(KEY, "false")], false)]
    #[case::unlabelled_pod_is_untouched(&[], false)]
    #[case::other_value_is_not_managed(&[(KEY, "True")], false)]
    fn only_managed_pods_get_options(#[case] labels: &[(&str, &str)], #[case] changed: bool) {
        let m = DnsOptions::new(&MeshConfig::default());
        let before = mk_pod(labels, Some(dns(vec![opt("ndots", Some("5"))])));
        let mut pod = before.clone();
        run(&m, &mut pod);
        assert_eq!(pod != before, changed);
        let once = pod.clone();
        run(&m, &mut pod);
        assert_eq!(pod, once, "second pass changes nothing");
    }

    #[test]
    fn configured_values_are_used() {
        let cfg: MeshConfig = serde_json::from_value(serde_json::json!({
            "meshDomain": "mesh.corp.example", "dns": {"timeout": 2, "attempts": 2}
        }))
        .unwrap();
        assert_eq!(
            DnsOptions::new(&cfg).options,
            [
                opt("ndots", Some("3")),
                opt("timeout", Some("2")),
                opt("attempts", Some("2"))
            ]
        );
    }
}
