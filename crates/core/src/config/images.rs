//! The `images` section: registry rewrite rules (feature code in `crate::mutate::image`), and the
//! checks of `webhook.imageBuilderConfig`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::{ConfigError, FileMountInitContainer, ImageBuilderConfig};
use crate::image_ref::{ImageRef, under};
use crate::k8s_names::{is_label_value, qualified_name_problem};

/// Ordered registry rewrite rules, applied by the `image-rules` mutator to pods that reach the
/// images webhook (selected by `podSelector` and `namespaceSelector`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ImagesConfig {
    pub enabled: bool,
    /// First match wins.
    pub rules: Vec<ImageRule>,
    /// The images webhook's `objectSelector`; unset sends every pod.
    #[cfg_attr(feature = "schema", schemars(with = "Option<super::KubernetesObject>"))]
    pub pod_selector: Option<LabelSelector>,
    /// The images webhook's `namespaceSelector`; unset means every namespace but kube-system.
    #[cfg_attr(feature = "schema", schemars(with = "Option<super::KubernetesObject>"))]
    pub namespace_selector: Option<LabelSelector>,
    /// Containers (of any kind) whose image is never rewritten.
    pub excluded_container_names: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageRule {
    /// A registry (`docker.io`) or a normalised repository prefix (`docker.io/library`).
    #[serde(rename = "match")]
    pub matches: String,
    /// What replaces the matched part (`<account>.dkr.ecr.<region>.amazonaws.com/docker-hub`).
    pub replace: String,
    /// Also rewrite pods that name `imagePullSecrets`: those secrets are for the source
    /// registry, and the target may not accept them.
    pub rewrite_with_pull_secrets: bool,
}

impl ImagesConfig {
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        if !self.enabled {
            return Ok(warnings);
        }
        if self.rules.is_empty() {
            warnings.push(
                "images.enabled is true but images.rules is empty: no image is rewritten".into(),
            );
        }
        for (i, r) in self.rules.iter().enumerate() {
            let key = format!("images.rules[{i}]");
            check_prefix(&format!("{key}.match"), &r.matches)?;
            check_prefix(&format!("{key}.replace"), &r.replace)?;
            // A rewritten image must not match again, or a second admission would rewrite it
            // twice (`registry.example` -> `registry.example/mirror` -> ...).
            // A target without registry or '/' (`mirror`) is a Docker Hub namespace: what it
            // makes is `mirror/<rest>`, which reads as `docker.io/mirror/<rest>`.
            let mut targets = vec![normalise_prefix(&r.replace)];
            if !r.replace.contains('/') && !crate::image_ref::is_registry_like(&r.replace) {
                targets.push(format!("{}/{}", crate::image_ref::DOCKER_HUB, r.replace));
            }
            if let Some(j) = self.rules.iter().position(|o| {
                let m = normalise_prefix(&o.matches);
                targets.iter().any(|t| under(t, &m) || under(&m, t))
            }) {
                bail!(
                    format!("{key}.replace"),
                    "{:?} overlaps images.rules[{j}].match {:?}: a rewritten image would be rewritten again; pick a target that no rule's match covers or lies under",
                    r.replace,
                    self.rules[j].matches
                );
            }
        }
        if let Some(s) = &self.pod_selector {
            check_label_selector("images.podSelector", s)?;
        }
        if let Some(s) = &self.namespace_selector {
            check_label_selector("images.namespaceSelector", s)?;
        }
        Ok(warnings)
    }
}

/// An image the webhook writes into pods (a fetcher's, an init container's, the gate's): one the
/// kubelet can pull, as an image reference reads (`registry/path[:tag][@digest]`, lower-case
/// path, no spaces).
pub fn check_image(key: &str, image: &str) -> Result<(), ConfigError> {
    ensure!(!image.is_empty(), key, "is empty: name the image to run");
    ImageRef::parse(image).map_err(|e| {
        ConfigError::new(
            key,
            format!("{image:?} is not an image reference the kubelet can pull ({e})"),
        )
    })?;
    // Another algorithm name (`sha265`, `SHA256`) leaves every pod at InvalidImageName.
    ensure!(
        crate::image_ref::kubelet_reads_digest(image),
        key,
        "{image:?}: the kubelet reads a digest as sha256, sha384 or sha512, lower-case, with 64, 96 or 128 hex digits"
    );
    Ok(())
}

/// A rule's `match`/`replace` written like an image name (`docker.io`, `quay.io/org`,
/// `nginx` for `docker.io/library/nginx`), without tag or digest.
fn check_prefix(key: &str, p: &str) -> Result<(), ConfigError> {
    // A registry alone (`docker.io`, `registry.k8s.io`, `localhost:5000`) is a valid prefix.
    let probe = if !p.contains('/') && (p.contains(['.', ':']) || p == "localhost") {
        format!("{p}/x")
    } else {
        p.to_owned()
    };
    let why = if p.is_empty() {
        "is empty".to_owned()
    } else if p.contains("://") {
        "has a scheme".to_owned()
    } else if p.ends_with('/') {
        "ends with '/'".to_owned()
    } else {
        match ImageRef::parse(&probe) {
            Ok(r) if r.suffix.is_empty() => return Ok(()),
            Ok(_) => "has a tag or digest".to_owned(),
            Err(e) => e.to_string(),
        }
    };
    bail!(
        key,
        "{p:?} {why}; write a registry (docker.io) or a repository prefix (123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub)"
    )
}

/// A rule prefix as the normalised name it stands for. A prefix that names its registry is
/// taken as written (`docker.io/bitnami` is the `bitnami` namespace); one without is read as an
/// image on Docker Hub (`nginx` is `docker.io/library/nginx`, `bitnami/redis` is
/// `docker.io/bitnami/redis`). `index.docker.io` is `docker.io`.
pub fn normalise_prefix(p: &str) -> String {
    let first = p.split('/').next().unwrap_or_default();
    if first == "index.docker.io" {
        crate::image_ref::DOCKER_HUB.to_owned() + &p[first.len()..]
    } else if crate::image_ref::is_registry_like(first) {
        p.to_owned()
    } else {
        ImageRef::parse(p).map_or_else(|_| p.to_owned(), |r| r.name())
    }
}

/// A `LabelSelector` the API server would accept in a webhook's object or namespace selector.
pub fn check_label_selector(key: &str, s: &LabelSelector) -> Result<(), ConfigError> {
    for (k, v) in s.match_labels.iter().flatten() {
        if let Some(problem) = qualified_name_problem(k) {
            bail!(format!("{key}.matchLabels"), "key {k:?}: {problem}");
        }
        ensure!(
            is_label_value(v),
            format!("{key}.matchLabels"),
            "value {v:?} of {k:?} is not a valid label value (63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric)"
        );
    }
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let k = format!("{key}.matchExpressions[{i}]");
        if let Some(problem) = qualified_name_problem(&e.key) {
            bail!(format!("{k}.key"), "{:?}: {problem}", e.key);
        }
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" => ensure!(
                !values.is_empty(),
                format!("{k}.values"),
                "operator {} needs at least one value",
                e.operator
            ),
            "Exists" | "DoesNotExist" => ensure!(
                values.is_empty(),
                format!("{k}.values"),
                "operator {} takes no values",
                e.operator
            ),
            other => bail!(
                format!("{k}.operator"),
                "{other:?} is not In, NotIn, Exists or DoesNotExist"
            ),
        }
        if let Some(v) = values.iter().find(|v| !is_label_value(v)) {
            bail!(format!("{k}.values"), "{v:?} is not a valid label value");
        }
    }
    Ok(())
}

/// `webhook.imageBuilderConfig`, when enabled: both host names, usable as image prefixes, that do
/// not contain each other (or a rewritten image would be rewritten again). A warning for each
/// `excludedContainerNames` entry that is not `file_mount`'s name: only that init container, by
/// name and image, is ever exempt.
pub fn check_image_builder(
    c: &ImageBuilderConfig,
    file_mount: &FileMountInitContainer,
) -> Result<Vec<String>, ConfigError> {
    let mut warnings = Vec::new();
    if !c.enabled {
        return Ok(warnings);
    }
    const K: &str = "webhook.imageBuilderConfig.hostnameReplacement";
    let h = &c.hostname_replacement;
    for (name, v) in [("existing", &h.existing), ("replacement", &h.replacement)] {
        let key = format!("{K}.{name}");
        ensure!(
            !v.is_empty(),
            key,
            "is required when webhook.imageBuilderConfig.enabled is true: the registry host (and optional path) whose images are rewritten / the one they are rewritten to"
        );
        ensure!(
            !v.contains("://") && !v.ends_with('/') && !v.chars().any(char::is_whitespace),
            key,
            "{v:?} must be a registry host with an optional path, without scheme, spaces or trailing '/'"
        );
        // What the rewritten images start with: a registry and a repository path, without
        // tag or digest (`r.io/x:1` would make `r.io/x:1/orgs/...`).
        check_prefix(&key, v)?;
    }
    for (i, p) in c.excluded_image_prefixes.iter().enumerate() {
        ensure!(
            !p.is_empty(),
            format!("webhook.imageBuilderConfig.excludedImagePrefixes[{i}]"),
            "is empty, which every image starts with: it would turn verification off; set hostnameReplacement.disableVerification instead if that is what you mean"
        );
    }
    ensure!(
        !under(&h.replacement, &h.existing) && !under(&h.existing, &h.replacement),
        format!("{K}.replacement"),
        "{:?} and existing {:?} must not contain each other: a rewritten image would be rewritten again",
        h.replacement,
        h.existing
    );
    match &c.label_selector {
        Some(s) => check_label_selector("webhook.imageBuilderConfig.labelSelector", s)?,
        None => warnings.push(
            "webhook.imageBuilderConfig.labelSelector is unset: every pod reaches the image-builder webhook, and with verification on, any image outside the replacement registry is denied".into(),
        ),
    }
    for (i, name) in c.excluded_container_names.iter().enumerate() {
        if *name != file_mount.container_name {
            warnings.push(format!(
                "webhook.imageBuilderConfig.excludedContainerNames[{i}] {name:?} exempts no container: only the init container the webhook injects (webhook.embeddedSecretManagerConfig.fileMountInitContainer, {:?} with image {:?}) is exempt, by name and image, since a pod chooses its own container names; list the image's registry path in excludedImagePrefixes instead",
                file_mount.container_name, file_mount.image
            ));
        }
    }
    if h.disable_verification {
        warnings.push("webhook.imageBuilderConfig.hostnameReplacement.disableVerification is true: pods may run images of any organisation".into());
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::{Value, json};

    fn images(v: Value) -> Result<Vec<String>, ConfigError> {
        serde_json::from_value::<ImagesConfig>(v)
            .expect("parses")
            .validate()
    }

    fn builder(v: Value) -> Result<Vec<String>, ConfigError> {
        check_image_builder(
            &serde_json::from_value(v).expect("parses"),
            &FileMountInitContainer::default(),
        )
    }

    #[test]
    fn image_builder_defaults_are_flytes() {
        let c = ImageBuilderConfig::default();
        assert!(!c.enabled);
        assert_eq!(c.excluded_container_names, ["init-embedded-secret"]);
        assert!(c.excluded_image_prefixes.is_empty());
        assert!(c.label_selector.is_none());
        assert!(!c.hostname_replacement.disable_verification);
    }

    #[rstest]
    #[case::no_existing(json!({"enabled": true, "hostnameReplacement": {"replacement": "r.io"}}), "webhook.imageBuilderConfig.hostnameReplacement.existing")]
    #[case::no_replacement(json!({"enabled": true, "hostnameReplacement": {"existing": "e.io"}}), "webhook.imageBuilderConfig.hostnameReplacement.replacement")]
    #[case::scheme(json!({"enabled": true, "hostnameReplacement": {"existing": "https://e.io", "replacement": "r.io"}}), "webhook.imageBuilderConfig.hostnameReplacement.existing")]
    #[case::nested(json!({"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "e.io/mirror"}}), "webhook.imageBuilderConfig.hostnameReplacement.replacement")]
    #[case::bad_selector(json!({"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"}, "labelSelector": {"matchLabels": {"bad key!": "x"}}}), "webhook.imageBuilderConfig.labelSelector.matchLabels")]
    #[case::bad_operator(json!({"enabled": true, "hostnameReplacement": {"existing": "e.io", "replacement": "r.io"}, "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}), "webhook.imageBuilderConfig.labelSelector.matchExpressions[0].operator")]
    fn image_builder_refuses(#[case] v: Value, #[case] key: &str) {
        assert_eq!(builder(v).unwrap_err().key, key);
    }

    #[test]
    fn disable_verification_is_read_from_the_config_and_warned_about() {
        // Flyte's config_test: imageBuilderConfig with `disableVerification: true`.
        let loaded = crate::config::Config::from_value(json!({"webhook": {"imageBuilderConfig": {
            "enabled": true,
            "hostnameReplacement": {"existing": "e.io", "replacement": "r.io", "disableVerification": true}
        }}}))
        .unwrap();
        let c = &loaded.config.webhook.image_builder_config;
        assert!(c.enabled);
        assert!(c.hostname_replacement.disable_verification);
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.contains("disableVerification is true")),
            "{:?}",
            loaded.warnings
        );
    }

    #[test]
    fn image_builder_disabled_is_not_checked() {
        assert_eq!(
            builder(json!({"hostnameReplacement": {"existing": "https://x"}})).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_valid_image_builder_config_loads_without_warnings() {
        let w = builder(json!({"enabled": true, "hostnameReplacement": {"existing": "old.registry.com", "replacement": "new.registry.com"},
            "labelSelector": {"matchLabels": {"inject-secrets": "true"}}})).unwrap();
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn an_excluded_container_name_that_is_not_the_injected_init_container_warns_that_it_exempts_nothing()
     {
        let w = builder(json!({"enabled": true, "hostnameReplacement": {"existing": "old.registry.com", "replacement": "new.registry.com"},
            "labelSelector": {"matchLabels": {"inject-secrets": "true"}},
            "excludedContainerNames": ["init-embedded-secret", "istio-proxy"]})).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("webhook.imageBuilderConfig.excludedContainerNames[1] \"istio-proxy\" exempts no container")
                && w[0].contains("excludedImagePrefixes"),
            "{w:?}"
        );
    }

    #[rstest]
    #[case::empty_match(json!({"enabled": true, "rules": [{"match": "", "replace": "r.io/hub"}]}), "images.rules[0].match")]
    #[case::scheme(json!({"enabled": true, "rules": [{"match": "docker.io", "replace": "https://r.io"}]}), "images.rules[0].replace")]
    #[case::tag(json!({"enabled": true, "rules": [{"match": "docker.io/library/nginx:1", "replace": "r.io/hub"}]}), "images.rules[0].match")]
    #[case::rewrites_itself(json!({"enabled": true, "rules": [{"match": "r.io", "replace": "r.io/mirror"}]}), "images.rules[0].replace")]
    #[case::another_rule_rewrites_it(json!({"enabled": true, "rules": [{"match": "docker.io", "replace": "quay.io/hub"}, {"match": "quay.io", "replace": "r.io/quay"}]}), "images.rules[0].replace")]
    #[case::a_longer_match_lies_under_the_target(json!({"enabled": true, "rules": [{"match": "docker.io", "replace": "r.io/hub"}, {"match": "r.io/hub/library", "replace": "q.io/x"}]}), "images.rules[0].replace")]
    #[case::bad_pod_selector(json!({"enabled": true, "podSelector": {"matchLabels": {"a": "not ok!"}}}), "images.podSelector.matchLabels")]
    #[case::in_without_values(json!({"enabled": true, "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}), "images.namespaceSelector.matchExpressions[0].values")]
    fn images_refuses(#[case] v: Value, #[case] key: &str) {
        assert_eq!(images(v).unwrap_err().key, key);
    }

    #[test]
    fn ecr_pull_through_rules_load() {
        let w = images(json!({"enabled": true, "rules": [
            {"match": "docker.io", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub"},
            {"match": "registry.k8s.io", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/k8s"},
            {"match": "localhost:5000", "replace": "123456789012.dkr.ecr.us-east-1.amazonaws.com/local"}
        ]})).unwrap();
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_bare_name_prefix_means_the_official_image() {
        assert_eq!(normalise_prefix("nginx"), "docker.io/library/nginx");
        assert_eq!(normalise_prefix("index.docker.io"), "docker.io");
        assert_eq!(normalise_prefix("bitnami/redis"), "docker.io/bitnami/redis");
        assert_eq!(normalise_prefix("docker.io/bitnami"), "docker.io/bitnami");
        assert_eq!(
            normalise_prefix("index.docker.io/library"),
            "docker.io/library"
        );
    }
}
