//! Registry rewrite rules (`images.rules`): point images at a mirror or an ECR pull-through
//! cache, e.g. `nginx:1.27` becomes
//! `123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/library/nginx:1.27`.
//!
//! Never breaks a pod: an image that does not parse is left alone (with a warning in the
//! response), the tag and digest text are kept byte for byte, `imagePullPolicy` is not touched,
//! and a pod that names `imagePullSecrets` (credentials for the source registry, which the target
//! may not accept) is rewritten only by a rule with `rewriteWithPullSecrets: true`.

use k8s_openapi::api::core::v1::Pod;

use super::all_images_mut;
use crate::config::images::{ImageRule, ImagesConfig, normalise_prefix};
use crate::image_ref::{ImageRef, under};
use crate::mutate::{Denied, Effects, ImageCount, PodCtx, PodMutator, Route};

pub const ID: &str = "image-rules";

struct Rule {
    /// The normalised name the rule covers (`docker.io`, `docker.io/library/nginx`).
    prefix: String,
    rule: ImageRule,
}

pub struct ImageRules {
    rules: Vec<Rule>,
    excluded_containers: Vec<String>,
}

impl ImageRules {
    pub fn new(cfg: &ImagesConfig) -> Self {
        Self {
            rules: cfg
                .rules
                .iter()
                .map(|r| Rule {
                    prefix: normalise_prefix(&r.matches),
                    rule: r.clone(),
                })
                .collect(),
            excluded_containers: cfg.excluded_container_names.clone(),
        }
    }

    /// The images `image` may have been rewritten from: for each rule whose replacement it is
    /// under (at a path boundary), the rule's source with the rest of the image. What another
    /// entry checks after the images entry ran can then be checked against the image as written.
    pub fn sources_of<'a>(&'a self, image: &'a str) -> impl Iterator<Item = String> + 'a {
        self.rules.iter().filter_map(move |r| {
            let rest = image.strip_prefix(r.rule.replace.as_str())?;
            (rest.is_empty() || rest.starts_with(['/', ':', '@']))
                .then(|| format!("{}{rest}", r.prefix))
        })
    }

    /// The image rewritten by the first rule that covers it; `Ok(None)` when none does (or the
    /// rule does not rewrite pods with pull secrets and this pod has some).
    pub fn rewrite(&self, image: &str, has_pull_secrets: bool) -> Result<Option<String>, String> {
        let parsed = ImageRef::parse(image).map_err(|e| e.to_string())?;
        let name = parsed.name();
        let Some(r) = self.rules.iter().find(|r| under(&name, &r.prefix)) else {
            return Ok(None);
        };
        if has_pull_secrets && !r.rule.rewrite_with_pull_secrets {
            return Ok(None);
        }
        Ok(Some(format!(
            "{}{}{}",
            r.rule.replace,
            &name[r.prefix.len()..],
            parsed.suffix
        )))
    }
}

impl PodMutator for ImageRules {
    fn id(&self) -> &'static str {
        ID
    }

    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        // The images entry's selectors chose the pod; the API server applied them.
        let mut effects = Effects::default();
        if ctx.route != Route::Images {
            return Ok(effects);
        }
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(effects);
        };
        let has_pull_secrets = spec
            .image_pull_secrets
            .as_ref()
            .is_some_and(|s| !s.is_empty());
        let excluded = |name: &str| self.excluded_containers.iter().any(|e| e == name);
        for (_, name, image) in all_images_mut(spec).filter(|(_, name, _)| !excluded(name)) {
            let Some(current) = image.as_deref() else {
                continue;
            };
            match self.rewrite(current, has_pull_secrets) {
                Ok(Some(new)) => {
                    effects.image(ImageCount::RuleRewrites);
                    *image = Some(new);
                }
                Ok(None) => {}
                Err(why) => {
                    effects.image(ImageCount::Unparsed);
                    effects.note(format!(
                        "podmutator: image {current:?} of container {name:?} was not rewritten: it {why}"
                    ));
                }
            }
        }
        Ok(effects)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, LocalObjectReference, PodSpec};
    use proptest::prelude::*;
    use rstest::rstest;

    const ECR: &str = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn rules() -> ImageRules {
        let rule = |m: &str, r: &str| ImageRule {
            matches: m.into(),
            replace: format!("{ECR}/{r}"),
            rewrite_with_pull_secrets: false,
        };
        ImageRules::new(&ImagesConfig {
            enabled: true,
            rules: vec![
                ImageRule {
                    rewrite_with_pull_secrets: true,
                    ..rule("docker.io/bitnami", "bitnami")
                },
                rule("docker.io", "docker-hub"),
                rule("quay.io", "quay"),
                rule("ghcr.io", "github"),
                rule("registry.k8s.io", "k8s"),
                rule("public.ecr.aws", "ecr-public"),
            ],
            excluded_container_names: vec!["keep".into()],
            ..Default::default()
        })
    }

    #[rstest]
    #[case::official_image_without_tag("nginx", "docker-hub/library/nginx")]
    #[case::official_image_with_tag("nginx:1.27", "docker-hub/library/nginx:1.27")]
    #[case::hub_user_image("grafana/grafana:11.0.0", "docker-hub/grafana/grafana:11.0.0")]
    #[case::legacy_hub_name("index.docker.io/library/redis:7", "docker-hub/library/redis:7")]
    #[case::first_rule_wins("bitnami/redis:7", "bitnami/redis:7")]
    #[case::digest_only(&format!("quay.io/prometheus/node-exporter@{D}"), &format!("quay/prometheus/node-exporter@{D}"))]
    #[case::tag_and_digest(&format!("ghcr.io/org/app:v1@{D}"), &format!("github/org/app:v1@{D}"))]
    #[case::kubernetes_registry("registry.k8s.io/pause:3.10", "k8s/pause:3.10")]
    #[case::ecr_public(
        "public.ecr.aws/docker/library/busybox:latest",
        "ecr-public/docker/library/busybox:latest"
    )]
    fn rewrites(#[case] image: &str, #[case] expected: &str) {
        assert_eq!(
            rules().rewrite(image, false).unwrap(),
            Some(format!("{ECR}/{expected}"))
        );
    }

    #[rstest]
    #[case::unmatched_registry("gcr.io/distroless/static")]
    #[case::already_rewritten(&format!("{ECR}/docker-hub/library/nginx:1.27"))]
    #[case::registry_with_same_start("docker.io.evil.example/x")]
    fn leaves_alone(#[case] image: &str) {
        assert_eq!(rules().rewrite(image, false).unwrap(), None);
    }

    #[test]
    fn pull_secrets_stop_a_rule_unless_it_says_so() {
        let r = rules();
        assert_eq!(r.rewrite("nginx", true).unwrap(), None);
        assert_eq!(
            r.rewrite("bitnami/redis", true).unwrap(),
            Some(format!("{ECR}/bitnami/redis"))
        );
    }

    fn pod(images: &[&str], pull_secrets: bool) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: images
                    .iter()
                    .enumerate()
                    .map(|(i, image)| Container {
                        name: if i == 0 {
                            "keep".into()
                        } else {
                            format!("c{i}")
                        },
                        image: Some((*image).into()),
                        image_pull_policy: Some("IfNotPresent".into()),
                        ..Default::default()
                    })
                    .collect(),
                image_pull_secrets: pull_secrets
                    .then(|| vec![LocalObjectReference { name: "hub".into() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_unparseable_image_is_left_alone_with_a_warning() {
        let mut p = pod(&["nginx", "Not/An:Image:", "nginx:1"], false);
        let effects = rules()
            .mutate(&PodCtx::test(Route::Images), &mut p)
            .unwrap();
        let images: Vec<_> = p
            .spec
            .unwrap()
            .containers
            .into_iter()
            .map(|c| (c.image.unwrap(), c.image_pull_policy.unwrap()))
            .collect();
        assert_eq!(
            images,
            [
                ("nginx".to_owned(), "IfNotPresent".to_owned()),
                ("Not/An:Image:".into(), "IfNotPresent".into()),
                (
                    format!("{ECR}/docker-hub/library/nginx:1"),
                    "IfNotPresent".into()
                )
            ]
        );
        assert_eq!(effects.notes.len(), 1);
        assert!(
            effects.notes[0].contains("\"Not/An:Image:\" of container \"c1\""),
            "{:?}",
            effects.notes
        );
        assert_eq!(
            effects.images(),
            [(ImageCount::RuleRewrites, 1), (ImageCount::Unparsed, 1)]
        );
    }

    #[test]
    fn other_routes_are_left_alone() {
        let mut p = pod(&["x", "nginx"], false);
        let before = p.clone();
        rules()
            .mutate(&PodCtx::test(Route::ImageBuilder), &mut p)
            .unwrap();
        assert_eq!(p, before);
    }

    fn image_strategy() -> impl Strategy<Value = String> {
        let registry = prop_oneof![
            Just(String::new()),
            Just("docker.io/".to_owned()),
            Just("quay.io/".to_owned()),
            Just("localhost:5000/".to_owned()),
            Just("registry.k8s.io/".to_owned()),
            Just(format!("{ECR}/docker-hub/")),
        ];
        let path = "[a-z0-9]{1,6}(/[a-z0-9]{1,6}){0,2}";
        let tag = prop_oneof![
            Just(String::new()),
            "[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,8}".prop_map(|t| format!(":{t}"))
        ];
        let digest = prop_oneof![
            Just(String::new()),
            "[0-9a-f]{64}".prop_map(|d| format!("@sha256:{d}"))
        ];
        (registry, path, tag, digest).prop_map(|(r, p, t, d)| format!("{r}{p}{t}{d}"))
    }

    proptest! {
        #[test]
        fn idempotent_and_never_drops_a_digest(image in image_strategy(), pull in any::<bool>()) {
            let r = rules();
            let once = r.rewrite(&image, pull).unwrap().unwrap_or_else(|| image.clone());
            let twice = r.rewrite(&once, pull).unwrap().unwrap_or_else(|| once.clone());
            prop_assert_eq!(&once, &twice);
            let digest = image.split_once('@').map(|(_, d)| d.to_owned());
            prop_assert_eq!(once.split_once('@').map(|(_, d)| d.to_owned()), digest);
            prop_assert!(ImageRef::parse(&once).is_ok());
        }

        #[test]
        fn anything_else_never_panics(image in "\\PC{0,80}") {
            let _ = rules().rewrite(&image, false);
        }
    }
}
