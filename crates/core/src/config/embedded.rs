//! `embedded`: the Embedded manager's own settings (Flyte has none of these): the fetch
//! deadline, the cache, the scope binding, the delivery and the registry lookup.

use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use super::{Config, ConfigError, PLACEHOLDERS, TemplatePart, bounds, template_parts};

/// Our Embedded-mode settings (Flyte has none of these).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EmbeddedConfig {
    /// Budget for fetching every value an admission needs, all calls included.
    #[default(2000)]
    pub deadline_ms: u64,
    /// How long a fetched value is reused across warm invocations.
    #[default(300)]
    pub cache_ttl_seconds: u64,
    /// How long "no such secret" is remembered; short, so a newly created secret shows up soon.
    #[default(10)]
    pub negative_cache_ttl_seconds: u64,
    #[default(10_000)]
    pub cache_max_entries: usize,
    #[default(16 << 20)]
    pub cache_max_bytes: usize,
    /// Ids per BatchGetSecretValue call (the API's maximum is 20).
    #[default(20)]
    pub batch_size: usize,
    /// Which Secrets Manager API fetches the ids a cache miss leaves.
    pub fetch_strategy: FetchStrategy,
    /// Secrets Manager calls this process has in flight at most, all admissions together, so
    /// one instance cannot spend the account's request quota on its own.
    #[default(16)]
    pub max_calls_in_flight: usize,
    /// Secrets Manager calls one admission has in flight at most, so one pod asking for many
    /// secrets cannot take every slot of `max_calls_in_flight`.
    #[default(4)]
    pub max_calls_in_flight_per_admission: usize,
    /// Largest value accepted; bigger ones are refused with a message naming the key.
    #[default(64 << 10)]
    pub max_value_bytes: usize,
    /// The one organisation this webhook serves: a pod's `organization` label must equal it
    /// to read any Embedded secret (403 `EmbeddedOrganizationMismatch` otherwise, nothing
    /// fetched). With Embedded enabled and the scope binding on, either this or a
    /// `{{ organization }}` in `namespace_template` must bind the organisation, or the
    /// configuration is refused at start. Empty: not set.
    pub organization: String,
    /// The namespace a pod with labels organization/project/domain must be in to read that
    /// scope's secrets. `{{ organization }}`, `{{ project }}` and `{{ domain }}` are replaced.
    /// Empty turns the check off (then any pod creator can read any project's secrets). A
    /// non-empty template must use `{{ domain }}`.
    #[default("{{ project }}-{{ domain }}".into())]
    pub namespace_template: String,
    /// The Flyte domains a namespace may end in. A namespace must have exactly one reading
    /// (organization, project, domain) under the template with these domains, and it must be
    /// the pod's labels: `ml-pre-prod` would otherwise be both `ml-pre`+`prod` and
    /// `ml`+`pre-prod`. By default Flyte's (`domains` in flyteadmin's configuration).
    #[default(vec!["development".into(), "staging".into(), "production".into()])]
    pub domains: Vec<String>,
    /// When non-empty, only these requesting users (`request.userInfo.username`) may get
    /// Embedded secrets; an entry ending in `*` matches a prefix.
    pub allowed_usernames: Vec<String>,
    /// Where a secret's value travels: `value` (Flyte's Embedded manager: the webhook reads it
    /// and writes it into the pod spec) or `reference` (the webhook resolves the name with
    /// metadata calls only; an init container in the pod fetches the value with the pod's own
    /// AWS identity).
    pub delivery: Delivery,
    /// In `reference` delivery, how ENV_VAR requests (and ANY requests that name an
    /// `env_var`) are served: `exec` (the container's command is wrapped by `podmutator exec`,
    /// which sets the variables from the init container's files) or `value` (Flyte's
    /// behaviour: the webhook reads the value and writes it into the pod spec, so the function
    /// needs `GetSecretValue` again).
    pub env_var_delivery: EnvVarDelivery,
    /// The podmutator image the `reference` init container runs (`podmutator fetch`); required
    /// with `delivery: reference`. Pin it by digest.
    pub fetcher_image: String,
    /// In `reference` delivery with `envVarDelivery: exec`, where the ENTRYPOINT of a container
    /// without `command` is read from: the image's config in its registry.
    pub entrypoint_lookup: EntrypointLookupConfig,
}

/// What the webhook reads from outside for Embedded mode: the one decoding of
/// `embedded.delivery` × `envVarDelivery` (and `entrypointLookup`), from which the outside
/// dependencies are built and the transports' refusals decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmbeddedReads {
    /// Secret values (`GetSecretValue`): value delivery, or env vars by value in reference
    /// delivery. Replies then carry values.
    pub values: bool,
    /// Names only (`DescribeSecret`): reference delivery.
    pub names: bool,
    /// Image commands from registries: `entrypointLookup` lists a registry.
    pub images: bool,
}

impl Config {
    /// What Embedded mode reads ([`EmbeddedReads`]); nothing when it is not enabled, but the
    /// registry lookup, whose settings are checked at start whenever they are set.
    pub fn embedded_reads(&self) -> EmbeddedReads {
        let e = &self.embedded;
        let on = self.webhook.embedded_enabled();
        EmbeddedReads {
            values: on
                && (e.delivery == Delivery::Value || e.env_var_delivery == EnvVarDelivery::Value),
            names: on && e.delivery == Delivery::Reference,
            images: e.entrypoint_lookup.enabled(),
        }
    }
}

/// Reading a container's ENTRYPOINT and CMD from its image's config in the registry
/// (`embedded.entrypointLookup`), so that a container with only `args` can be wrapped.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct EntrypointLookupConfig {
    /// The registry hosts (`host[:port]`, as in an image reference) the webhook may ask. Pod
    /// creators choose image names, so any other host, however written, is never contacted.
    /// Empty turns the lookup off: a container without `command` is refused.
    pub registries: Vec<String>,
    /// Budget of one image's lookup (every request of it), within `embedded.deadlineMs`.
    #[default(1500)]
    pub timeout_ms: u64,
    /// How long a tag's manifest digest is reused. What a digest names never changes, so its
    /// ENTRYPOINT and CMD are kept until evicted.
    #[default(300)]
    pub tag_ttl_seconds: u64,
    /// A PEM file of extra CA certificates trusted besides the system's (a private registry
    /// with its own CA). Empty: the system's only.
    pub ca_bundle_file: String,
}

impl EntrypointLookupConfig {
    /// Whether images may be looked up at all.
    pub fn enabled(&self) -> bool {
        !self.registries.is_empty()
    }

    /// Whether `registry` (normalised, as [`crate::image_ref::ImageRef::registry`]) is listed.
    pub fn allows(&self, registry: &str) -> bool {
        self.registries
            .iter()
            .any(|r| normalised_registry(r).as_deref() == Some(registry))
    }
}

/// `entry` as an image reference names its registry (`index.docker.io` is `docker.io`), or
/// `None` when it is not a registry host.
fn normalised_registry(entry: &str) -> Option<String> {
    let probe = format!("{entry}/probe");
    let parsed = crate::image_ref::ImageRef::parse(&probe).ok()?;
    let same = parsed.registry == entry
        || (parsed.registry == crate::image_ref::DOCKER_HUB && entry == "index.docker.io");
    same.then_some(parsed.registry)
}

/// How Embedded secrets reach the pod (`embedded.delivery`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// The webhook reads each value and writes it into the pod spec (Flyte's behaviour).
    #[default]
    Value,
    /// The webhook resolves names only; the pod fetches the values with its own identity.
    Reference,
}

/// How ENV_VAR requests are served in `reference` delivery (`embedded.envVarDelivery`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum EnvVarDelivery {
    /// `podmutator exec` sets the variables in the container's process from the fetched files.
    #[default]
    Exec,
    /// The value goes into the pod spec, as in `value` delivery.
    Value,
}

/// How Embedded mode asks Secrets Manager for the ids a cache miss leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum FetchStrategy {
    /// `BatchGetSecretValue`, `batchSize` ids a call: fewest calls, but that API allows only
    /// 100 requests per second per account and region, shared by every instance.
    Batch,
    /// One `GetSecretValue` per id (10,000 requests per second per account and region).
    #[default]
    Parallel,
    /// `Batch` until this instance's first successful call (one connection while cold), then
    /// `Parallel`.
    Hybrid,
}

impl EmbeddedConfig {
    /// The defaults that depend on another setting, for the keys `set` says were not set: the
    /// negative cache never outlives the cache (`cacheTtlSeconds: 0` turns both off), and a
    /// registry lookup gets half the deadline when the deadline is shorter than its 1.5 s. Set
    /// explicitly, either is checked as given.
    pub(super) fn follow_defaults(&mut self, set: impl Fn(&str) -> bool) {
        if !set("embedded.negativeCacheTtlSeconds") {
            self.negative_cache_ttl_seconds =
                self.negative_cache_ttl_seconds.min(self.cache_ttl_seconds);
        }
        let lookup = &mut self.entrypoint_lookup;
        if !set("embedded.entrypointLookup.timeoutMs") && lookup.timeout_ms >= self.deadline_ms {
            lookup.timeout_ms = (self.deadline_ms / 2).max(1);
        }
    }

    /// The `embedded` section's checks (`on`: the Embedded manager is enabled); its warnings.
    pub fn validate(&self, on: bool) -> Result<Vec<String>, ConfigError> {
        let em = self;
        let mut warnings = Vec::new();
        bounds::DEADLINE_MS.check(em.deadline_ms, |b| {
            format!(
                "{} ms: use {}..={}, and keep it well below the webhook's timeoutSeconds (default 10 s)",
                em.deadline_ms, b.min, b.max
            )
        })?;
        bounds::BATCH_SIZE.check(em.batch_size as u64, |b| {
            format!(
                "{}: BatchGetSecretValue takes {} to {} ids per call",
                em.batch_size, b.min, b.max
            )
        })?;
        bounds::MAX_CALLS_IN_FLIGHT.check(em.max_calls_in_flight as u64, |b| {
            format!("{}: use {} to {}", em.max_calls_in_flight, b.min, b.max)
        })?;
        let per_admission = em.max_calls_in_flight_per_admission as u64;
        let most = bounds::Bound {
            max: em.max_calls_in_flight as u64,
            ..bounds::MAX_CALLS_IN_FLIGHT_PER_ADMISSION
        };
        most.check(per_admission, |b| {
            format!(
                "{per_admission}: use {} to embedded.maxCallsInFlight ({})",
                b.min, b.max
            )
        })?;
        bounds::MAX_VALUE_BYTES.check(em.max_value_bytes as u64, |_| "must be positive".into())?;
        ensure!(
            em.delivery != Delivery::Reference
                || !(em.fetcher_image.is_empty()
                    || em.fetcher_image.chars().any(char::is_whitespace)),
            "embedded.fetcherImage",
            "must name the podmutator image (e.g. <account>.dkr.ecr.<region>.amazonaws.com/podmutator@sha256:...) when embedded.delivery is reference: its init container runs `podmutator fetch` in each pod"
        );
        if em.delivery == Delivery::Reference {
            super::images::check_image("embedded.fetcherImage", &em.fetcher_image)?;
        }
        let lookup = &em.entrypoint_lookup;
        for (i, r) in lookup.registries.iter().enumerate() {
            ensure!(
                normalised_registry(r).is_some(),
                format!("embedded.entrypointLookup.registries[{i}]"),
                "{r:?} is not a registry host: write it as in an image reference, host[:port] (e.g. public.ecr.aws, docker.io, 123456789012.dkr.ecr.us-east-1.amazonaws.com), without a scheme or path"
            );
        }
        ensure!(
            !lookup.enabled()
                || (bounds::LOOKUP_TIMEOUT_MS.contains(lookup.timeout_ms)
                    && lookup.timeout_ms < em.deadline_ms),
            "embedded.entrypointLookup.timeoutMs",
            "{} ms: use 1 to less than embedded.deadlineMs ({} ms), so that a slow registry is a denial naming the image, not a timed-out admission",
            lookup.timeout_ms,
            em.deadline_ms
        );
        bounds::CACHE_TTL_SECONDS.check(em.cache_ttl_seconds, |b| {
            format!(
                "{} s: use {}..={} (0 turns the cache off)",
                em.cache_ttl_seconds, b.min, b.max
            )
        })?;
        ensure!(
            em.negative_cache_ttl_seconds <= em.cache_ttl_seconds,
            "embedded.negativeCacheTtlSeconds",
            "must not exceed embedded.cacheTtlSeconds"
        );
        bounds::TAG_TTL_SECONDS.check(lookup.tag_ttl_seconds, |b| {
            format!("{} s: use {}..={}", lookup.tag_ttl_seconds, b.min, b.max)
        })?;
        let parts = template_parts(&em.namespace_template)
            .map_err(|e| ConfigError::new("embedded.namespaceTemplate", e))?;
        let uses = |name| {
            parts
                .iter()
                .any(|p| matches!(p, TemplatePart::Slot(i) if PLACEHOLDERS[*i] == name))
        };
        // Its literal text too must be able to make a namespace name: with one-letter values,
        // it must give one.
        let sample = parts
            .iter()
            .map(|p| match p {
                TemplatePart::Literal(l) => l.as_str(),
                TemplatePart::Slot(_) => "a",
            })
            .collect::<String>();
        ensure!(
            em.namespace_template.is_empty() || crate::k8s_names::is_dns_label(&sample),
            "embedded.namespaceTemplate",
            "{:?} can name no namespace: filled in, it gives names like {sample:?}, and a namespace name is lower-case letters, digits and '-' (at most 63, starting and ending with a letter or digit); use e.g. \"{{{{ project }}}}-{{{{ domain }}}}\"",
            em.namespace_template
        );
        ensure!(
            em.namespace_template.is_empty() || uses("domain"),
            "embedded.namespaceTemplate",
            "{:?} does not use {{{{ domain }}}}: every domain of a project would share one namespace and read each other's secrets; use e.g. \"{{{{ project }}}}-{{{{ domain }}}}\" (or \"\" to turn the binding off)",
            em.namespace_template
        );
        ensure!(
            em.organization.is_empty()
                || (crate::k8s_names::is_label_value(&em.organization)
                    && !em.organization.contains("__")),
            "embedded.organization",
            "{:?} is not an organisation a pod can be labelled with: use a Kubernetes label value (at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit) without \"__\", which separates the parts of a secret name",
            em.organization
        );
        // Both deliveries read ids scoped by the pod's `organization` label: unless something
        // binds it, a pod in its own project's namespace may name any organisation's secrets.
        ensure!(
            !on || em.namespace_template.is_empty()
                || !em.organization.is_empty()
                || uses("organization"),
            "embedded.organization",
            "is not set and embedded.namespaceTemplate {:?} does not use {{{{ organization }}}}: a pod labelled organization=<another org> in its own namespace would read that organisation's secrets; set embedded.organization to the organisation this cluster serves (the value of its pods' organization label, e.g. \"flyte\"), or put {{{{ organization }}}} in embedded.namespaceTemplate",
            em.namespace_template
        );
        let mut seen_domains = std::collections::HashSet::new();
        for d in &em.domains {
            ensure!(
                crate::k8s_names::is_dns_label(d) && seen_domains.insert(d.as_str()),
                "embedded.domains",
                "{d:?}: each domain must be listed once and be part of a namespace name ({})",
                crate::k8s_names::DNS_LABEL_RULE
            );
        }
        ensure!(
            em.namespace_template.is_empty() || !em.domains.is_empty(),
            "embedded.domains",
            "is empty while embedded.namespaceTemplate is set: no namespace could be read; list Flyte's domains (default development, staging, production)"
        );
        if on && em.namespace_template.is_empty() {
            warnings.push(
                if em.organization.is_empty() {
                    "embedded.namespaceTemplate is empty and embedded.organization is not set: any pod creator can read any organisation's and project's Embedded secrets by labelling a pod with them"
                        .into()
                } else {
                    format!(
                        "embedded.namespaceTemplate is empty: any pod creator can read any project's Embedded secrets of organisation {:?} by labelling a pod with that project",
                        em.organization
                    )
                },
            );
        }
        Ok(warnings)
    }
}
