//! The Union fork's image-builder mutator (`image_builder_mutator_v1.go`): on its own webhook
//! entry, rewrite the registry host of every image to the replacement registry, then make sure
//! the result stays within the pod's organisation (its namespace) or the public paths.
//!
//! With `E` = `existing` and `R` = `replacement`, the first matching prefix wins:
//!
//! | # | image starts with | becomes   | counted as    |
//! |---|-------------------|-----------|---------------|
//! | 1 | `E/v1/unionai/`   | `R/union/`| public, v1    |
//! | 2 | `E/unionai/`      | `R/union/`| public, none  |
//! | 3 | `E/v1`            | `R/orgs`  | org, v1       |
//! | 4 | `R/orgs/v1`       | `R/orgs`  | org, v1       |
//! | 5 | `E`               | `R/orgs`  | org, none     |
//!
//! Prefixes 3-5 match only whole path components (`E/v1` does not match `E/v1x/...`); Flyte
//! compares text, which turns such images into paths no verification accepts, so both deny them
//! unless the pod's namespace happens to be that component.
//!
//! Two differences from Union, both closing a way around the organisation check, and one
//! for the containers podmutator adds that Union's webhook does not:
//! - `excludedContainerNames` exempts only the init container the webhook injects: a container
//!   is skipped when it is an init container, its name is listed, and it is the Embedded
//!   manager's file-mount init container by name *and* image
//!   (`webhook.embeddedSecretManagerConfig.fileMountInitContainer`). Union skips any container
//!   so named, so a pod could name its own container `init-embedded-secret` and run any image.
//! - `R/cloud/task` and `R/v1/cloud/task` match up to a path boundary (`/`, `:`, `@` or the
//!   end), so `R/cloud/task-other-team/private` is not under them.
//! - The other init containers the webhook adds (the reference fetcher, a secret manager's
//!   sidecar, the gate: [`ImageBuilder::with_own`]), told by kind, name and image, are
//!   rewritten but never refused: the API server calls this entry again after the entries
//!   that added them, and would otherwise refuse every pod that holds them.
//!
//! On a pod UPDATE (and the `pods/ephemeralcontainers` subresource) only the images the update
//! changes or adds are rewritten and checked: an image the pod already ran is left alone, so a
//! label change on an old pod is never refused.

use k8s_openapi::api::core::v1::Pod;

use super::{Kind, all_images_mut, image_of};
use crate::config::images::ImagesConfig;
use crate::config::{Config, FileMountInitContainer, ImageBuilderConfig};
use crate::error::Denial;
use crate::mutate::{Denied, Effects, ImageCount, PodCtx, PodMutator, Route};

pub const ID: &str = "image-builder";
/// The Union fork's name for the image-builder webhook entry.
pub const WEBHOOK_NAME: &str = "image-builder-webhook.union.ai";

pub struct ImageBuilder {
    existing: String,
    replacement: String,
    disable_verification: bool,
    excluded_containers: Vec<String>,
    excluded_prefixes: Vec<String>,
    /// The name of the init container the Embedded manager injects, and its images: the
    /// configured one, and its mirror under `images.rules` (the images entry may rewrite it
    /// after this entry exempted it, and the API server then calls this entry again).
    injected: (String, Vec<String>),
    /// `images.rules`, when the images entry runs: it may rewrite an image after this entry
    /// allowed it, and the API server then calls this entry again on the rewritten pod.
    mirrors: Option<super::ImageRules>,
    /// `excludedImagePrefixes` in Docker Hub's long form, as the sources of a mirrored image
    /// are named (`bitnami/` is `docker.io/bitnami/`, `nginx` also `docker.io/library/nginx`).
    excluded_sources: Vec<String>,
    /// The other init containers the webhook adds ([`Config::own_init_containers`]): a name
    /// (or a name prefix) and its images, configured and mirrored.
    own: Vec<(String, bool, Vec<String>)>,
}

impl ImageBuilder {
    /// `file_mount` is the Embedded manager's init container: the one container
    /// `excludedContainerNames` can exempt.
    pub fn new(
        cfg: &ImageBuilderConfig,
        file_mount: &FileMountInitContainer,
        images: &ImagesConfig,
    ) -> Self {
        let mirrors = images.enabled.then(|| super::ImageRules::new(images));
        Self {
            existing: cfg.hostname_replacement.existing.clone(),
            replacement: cfg.hostname_replacement.replacement.clone(),
            disable_verification: cfg.hostname_replacement.disable_verification,
            excluded_containers: cfg.excluded_container_names.clone(),
            excluded_prefixes: cfg.excluded_image_prefixes.clone(),
            injected: (
                file_mount.container_name.clone(),
                std::iter::once(file_mount.image.clone())
                    .chain(
                        mirrors
                            .as_ref()
                            .and_then(|m| m.rewrite(&file_mount.image, false).ok().flatten()),
                    )
                    .collect(),
            ),
            excluded_sources: cfg
                .excluded_image_prefixes
                .iter()
                .flat_map(|p| long_forms(p))
                .collect(),
            mirrors,
            own: Vec::new(),
        }
    }

    /// With the other init containers the webhook adds to pods: rewritten as any image, but
    /// never refused, since a pod the API server calls this entry for again holds what the
    /// other entries added (a fetcher, a sidecar, the gate).
    pub fn with_own(mut self, config: &Config) -> Self {
        self.own = config
            .own_init_containers()
            .into_iter()
            .map(|(name, prefix, image)| {
                let images = super::rewritten_forms(&image, self.mirrors.as_ref(), Some(&self));
                (name, prefix, images)
            })
            .collect();
        self
    }

    /// Whether the container is one of the webhook's own ([`ImageBuilder::with_own`]), by
    /// name and image (as it came, before this entry rewrote it).
    fn is_own(&self, kind: Kind, name: &str, image: &str) -> bool {
        kind == Kind::Init
            && self.own.iter().any(|(own, prefix, images)| {
                (if *prefix {
                    name.starts_with(own.as_str())
                } else {
                    name == own
                }) && images
                    .iter()
                    .any(|x| crate::image_ref::is_ours_or_pinned(image, x))
            })
    }

    /// Whether the container is the init container the webhook injects (its image as
    /// configured or mirrored, possibly pinned to a digest since), and listed in
    /// `excludedContainerNames`: its name alone is not enough, a pod chooses its names.
    fn exempt(&self, kind: Kind, name: &str, image: Option<&str>) -> bool {
        let (injected_name, injected_images) = &self.injected;
        kind == Kind::Init
            && name == injected_name
            && image.is_some_and(|i| {
                injected_images
                    .iter()
                    .any(|x| crate::image_ref::is_ours_or_pinned(i, x))
            })
            && self.excluded_containers.iter().any(|e| e == name)
    }

    /// Whether `image` is allowed, as it is or as written before the images entry's rules
    /// rewrote it (a mirror of an allowed image holds the same image).
    fn allows(&self, allowed: &[(String, bool)], image: &str) -> bool {
        is_allowed(allowed, image)
            || self.mirrors.iter().any(|m| {
                m.sources_of(image).any(|source| {
                    is_allowed(allowed, &source)
                        || self.excluded_sources.iter().any(|p| source.starts_with(p))
                })
            })
    }

    /// The rewritten image and what it counts as, or `None` when no prefix matches.
    pub fn rewrite(&self, image: &str) -> Option<(String, ImageCount)> {
        let (e, r) = (&self.existing, &self.replacement);
        // (base, then what follows it; what replaces both after `replacement`).
        let rules = [
            (e, "/v1/unionai/", "/union/", ImageCount::ReplacedPublicV1),
            (
                e,
                "/unionai/",
                "/union/",
                ImageCount::ReplacedPublicUnversioned,
            ),
            (e, "/v1", "/orgs", ImageCount::ReplacedOrgV1),
            (r, "/orgs/v1", "/orgs", ImageCount::ReplacedOrgV1),
            (e, "", "/orgs", ImageCount::ReplacedOrgUnversioned),
        ];
        rules.into_iter().find_map(|(base, from, to, count)| {
            let from = format!("{base}{from}");
            let rest = image.strip_prefix(&from)?;
            // Prefixes that end in '/' already end on a boundary.
            (from.ends_with('/') || rest.starts_with('/'))
                .then(|| (format!("{r}{to}{rest}"), count))
        })
    }

    /// Prefixes an image may have in namespace (organisation) `org`, each with whether it must
    /// end at a path boundary of the image.
    fn allowed(&self, org: &str) -> Vec<(String, bool)> {
        let r = &self.replacement;
        let mut allowed = vec![
            (format!("{r}/orgs/{org}/"), false),
            (format!("{r}/v1/orgs/{org}/"), false),
            (format!("{r}/cloud/task"), true),
            (format!("{r}/union/"), false),
            (format!("{r}/v1/cloud/task"), true),
            (format!("{r}/v1/union/"), false),
        ];
        // Written by the operator, compared as text as in Union.
        allowed.extend(self.excluded_prefixes.iter().map(|p| (p.clone(), false)));
        allowed
    }
}

/// What an excluded prefix written as text reads as in a normalised image name (Docker Hub's
/// images as `docker.io/<namespace>/…`, official ones under `docker.io/library/`): `bitnami/`
/// as `docker.io/bitnami/`; a prefix without `/` (`nginx`, `redis:7`) also under `library/`;
/// `docker.io/` or `index.docker.io/` before a name without `/` also with `library/`. Another
/// registry's prefix reads as it is written.
fn long_forms(prefix: &str) -> Vec<String> {
    let hub = crate::image_ref::DOCKER_HUB;
    let under_hub = |rest: &str| {
        let mut forms = vec![format!("{hub}/{rest}")];
        if !rest.contains('/') {
            forms.push(format!("{hub}/library/{rest}"));
        }
        forms
    };
    match prefix.split_once('/') {
        _ if prefix.is_empty() || prefix == hub => Vec::new(),
        None if prefix == "index.docker.io" => vec![hub.to_owned()],
        None => under_hub(prefix),
        Some(("index.docker.io", "")) => vec![format!("{hub}/")],
        Some(("docker.io" | "index.docker.io", rest)) if !rest.is_empty() => under_hub(rest),
        Some((first, _)) if crate::image_ref::is_registry_like(first) => Vec::new(),
        Some(_) => vec![format!("{hub}/{prefix}")],
    }
}

/// Whether `image` is under one of `allowed`.
fn is_allowed(allowed: &[(String, bool)], image: &str) -> bool {
    allowed.iter().any(|(prefix, boundary)| {
        image.strip_prefix(prefix.as_str()).is_some_and(|rest| {
            // The build task's image is `R/cloud/task`, with a tag, a digest or a path below
            // it; `R/cloud/task-other-team/...` is another repository.
            !boundary || rest.is_empty() || rest.starts_with(['/', ':', '@'])
        })
    })
}

impl PodMutator for ImageBuilder {
    fn id(&self) -> &'static str {
        ID
    }

    fn checks_updates(&self) -> bool {
        true
    }

    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        // Only pods the image-builder entry's own selector sent; other entries never see it.
        let mut effects = Effects::default();
        if ctx.route != Route::ImageBuilder {
            return Ok(effects);
        }
        effects.image(ImageCount::Attempts);
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(effects);
        };
        let allowed = (!self.disable_verification).then(|| self.allowed(ctx.namespace));
        for (kind, name, image) in all_images_mut(spec) {
            if self.exempt(kind, name, image.as_deref()) {
                continue;
            }
            // An UPDATE is checked for what it changes: an image the pod already had is not
            // this request's doing.
            if let Some(old) = ctx.old
                && image_of(old, kind, name) == Some(image.as_deref())
            {
                continue;
            }
            // Flyte's image is a string: a container without one is verified as "".
            let original = image.clone().unwrap_or_default();
            if let Some((rewritten, count)) = self.rewrite(&original) {
                effects.image(count);
                *image = Some(rewritten);
            }
            let verified = allowed
                .as_ref()
                .filter(|_| !self.is_own(kind, name, &original));
            if let Some(allowed) = verified {
                effects.image(ImageCount::ValidationAttempts);
                if !self.allows(allowed, image.as_deref().unwrap_or_default()) {
                    effects.image(ImageCount::ValidationFailures);
                    effects.image(ImageCount::Failures);
                    let denial = Denial::forbidden(
                        "ImageNotAuthorized",
                        format!(
                            "access to {original} is not authorized; in namespace {ns:?} images must be under {}/orgs/{ns}/, {0}/union/ or {0}/cloud/task (also with /v1), or a prefix in webhook.imageBuilderConfig.excludedImagePrefixes",
                            self.replacement,
                            ns = ctx.namespace,
                        ),
                    );
                    return Err(Denied::new(denial, effects));
                }
            }
        }
        Ok(effects)
    }
}

#[cfg(test)]
mod tests {
    //! `TestImageBuilderWebhook_Mutate` of the Union fork, case for case, with its metric counts.
    use super::*;
    use crate::config::{FileMountInitContainer, HostnameReplacement};
    use k8s_openapi::api::core::v1::{Container, EphemeralContainer, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use rstest::rstest;

    const ORG: &str = "test-org";
    const E: &str = "test.original.hostname";
    const R: &str = "test.replacement.hostname";

    /// `E` to `R`, with `excluded` as `excludedImagePrefixes`.
    fn config(disable_verification: bool, excluded: &[&str]) -> ImageBuilderConfig {
        ImageBuilderConfig {
            enabled: true,
            hostname_replacement: HostnameReplacement {
                existing: E.into(),
                replacement: R.into(),
                disable_verification,
            },
            excluded_image_prefixes: excluded.iter().map(|p| (*p).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn mutator(disable_verification: bool) -> ImageBuilder {
        ImageBuilder::new(
            &config(disable_verification, &[]),
            &FileMountInitContainer::default(),
            &ImagesConfig::default(),
        )
    }

    fn pod(images: &[String]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ORG.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: images
                    .iter()
                    .enumerate()
                    .map(|(i, image)| Container {
                        name: format!("testcontainer{}", i + 1),
                        image: Some(image.clone()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn images(pod: &Pod) -> Vec<String> {
        let spec = pod.spec.as_ref().unwrap();
        spec.containers
            .iter()
            .map(|c| c.image.clone().unwrap_or_default())
            .collect()
    }

    /// Counts in the order attempts, failures, validation attempts, validation failures,
    /// replacements (public none, public v1, org none, org v1).
    type Counts = [u32; 8];

    fn counts(effects: &Effects) -> Counts {
        let get = |c| {
            effects
                .images()
                .into_iter()
                .find(|(k, _)| *k == c)
                .map_or(0, |(_, n)| n)
        };
        [
            get(ImageCount::Attempts),
            get(ImageCount::Failures),
            get(ImageCount::ValidationAttempts),
            get(ImageCount::ValidationFailures),
            get(ImageCount::ReplacedPublicUnversioned),
            get(ImageCount::ReplacedPublicV1),
            get(ImageCount::ReplacedOrgUnversioned),
            get(ImageCount::ReplacedOrgV1),
        ]
    }

    fn run(m: &ImageBuilder, pod: &mut Pod) -> (Result<(), Denial>, Counts) {
        let ctx = PodCtx {
            namespace: ORG,
            ..PodCtx::test(Route::ImageBuilder)
        };
        match m.mutate(&ctx, pod) {
            Ok(effects) => (Ok(()), counts(&effects)),
            Err(Denied { denial, effects }) => (Err(denial), counts(&effects)),
        }
    }

    const OTHER: &str = "test.replacement.hostname/orgs/test-org/other-image";

    #[rstest]
    #[case::unversioned_build_image_task(format!("{R}/cloud/task"))]
    #[case::unversioned_org_image(format!("{R}/orgs/{ORG}/image"))]
    #[case::unversioned_org_other_image(format!("{R}/orgs/{ORG}/other-image"))]
    #[case::unversioned_public_image(format!("{R}/union/image"))]
    #[case::unversioned_public_other_image(format!("{R}/union/other-image"))]
    #[case::v1_build_image_task(format!("{R}/v1/cloud/task"))]
    #[case::v1_org_image(format!("{R}/v1/orgs/{ORG}/image"))]
    #[case::v1_org_other_image(format!("{R}/v1/orgs/{ORG}/other-image"))]
    #[case::v1_public_image(format!("{R}/v1/union/image"))]
    #[case::v1_public_other_image(format!("{R}/v1/union/other-image"))]
    fn valid_hostnames(#[case] image: String) {
        let mut p = pod(std::slice::from_ref(&image));
        let before = p.clone();
        let (result, counts) = run(&mutator(false), &mut p);
        result.unwrap();
        assert_eq!(p, before, "no change for {image}");
        assert_eq!(counts, [1, 0, 1, 0, 0, 0, 0, 0]);
    }

    #[rstest]
    #[case::replaces_hostname_for_pre_versioned_union_public_images(
        format!("{E}/unionai/image"), format!("{R}/union/image"), [1, 0, 2, 0, 1, 0, 0, 0])]
    #[case::replaces_hostname_for_versioned_union_public_images(
        format!("{E}/v1/unionai/image"), format!("{R}/union/image"), [1, 0, 2, 0, 0, 1, 0, 0])]
    #[case::preserves_hostname_org_images_with_older_sdk_and_build_image_task_versions(
        format!("{R}/orgs/{ORG}/image"), format!("{R}/orgs/{ORG}/image"), [1, 0, 2, 0, 0, 0, 0, 0])]
    #[case::replaces_hostname_org_images_with_newer_sdk_and_older_build_image_task_version(
        format!("{E}/{ORG}/image"), format!("{R}/orgs/{ORG}/image"), [1, 0, 2, 0, 0, 0, 1, 0])]
    #[case::replaces_hostname_org_images_with_older_sdk_and_newer_build_image_task_version(
        format!("{R}/orgs/v1/{ORG}/image"), format!("{R}/orgs/{ORG}/image"), [1, 0, 2, 0, 0, 0, 0, 1])]
    #[case::replaces_hostname_org_images_with_newer_sdk_and_build_image_task_version(
        format!("{E}/v1/{ORG}/image"), format!("{R}/orgs/{ORG}/image"), [1, 0, 2, 0, 0, 0, 0, 1])]
    fn rewrites_the_first_container_and_keeps_the_other(
        #[case] image: String,
        #[case] expected: String,
        #[case] expected_counts: Counts,
    ) {
        let mut p = pod(&[image, OTHER.into()]);
        let (result, counts) = run(&mutator(false), &mut p);
        result.unwrap();
        assert_eq!(images(&p), [expected, OTHER.to_owned()]);
        assert_eq!(counts, expected_counts);
    }

    #[test]
    fn replaces_multiple_hostname_match_occurrence() {
        let originals: Vec<String> = (0..3).map(|i| format!("{E}/{ORG}/image-{i}")).collect();
        let mut all = originals.clone();
        all.push(OTHER.into());
        let mut p = pod(&all);
        let (result, counts) = run(&mutator(false), &mut p);
        result.unwrap();
        let mut expected: Vec<String> = (0..3)
            .map(|i| format!("{R}/orgs/{ORG}/image-{i}"))
            .collect();
        expected.push(OTHER.into());
        assert_eq!(images(&p), expected);
        assert_eq!(counts, [1, 0, 4, 0, 0, 0, 3, 0]);
    }

    #[test]
    fn rejects_different_organization() {
        let image = format!("other-org/{E}/image");
        let mut p = pod(std::slice::from_ref(&image));
        let (result, counts) = run(&mutator(false), &mut p);
        let denial = result.unwrap_err();
        assert_eq!(denial.code, 403);
        assert!(
            denial
                .message
                .starts_with(&format!("access to {image} is not authorized;")),
            "{}",
            denial.message
        );
        assert_eq!(counts, [1, 1, 1, 1, 0, 0, 0, 0]);
    }

    #[rstest]
    #[case::org_with_suffix(format!("{E}/{ORG}-suffix/image"))]
    #[case::org_with_prefix(format!("{E}/prefix-{ORG}/image"))]
    #[case::other_org(format!("{E}/test-other-org/image"))]
    fn rejects_unauthorized_paths(#[case] image: String) {
        let mut p = pod(std::slice::from_ref(&image));
        let (result, counts) = run(&mutator(false), &mut p);
        let denial = result.unwrap_err();
        assert_eq!(denial.code, 403);
        assert!(
            denial
                .message
                .starts_with(&format!("access to {image} is not authorized;")),
            "{}",
            denial.message
        );
        assert!(
            denial.message.contains("excludedImagePrefixes"),
            "names the fix"
        );
        assert_eq!(counts, [1, 1, 1, 1, 0, 0, 1, 0]);
    }

    #[rstest]
    #[case::org_with_suffix(format!("{E}/{ORG}-suffix/image"), format!("{R}/orgs/{ORG}-suffix/image"))]
    #[case::org_with_prefix(format!("{E}/prefix-{ORG}/image"), format!("{R}/orgs/prefix-{ORG}/image"))]
    #[case::other_org(format!("{E}/test-other-org/image"), format!("{R}/orgs/test-other-org/image"))]
    fn skips_verification_for_invalid_uri_paths(#[case] image: String, #[case] expected: String) {
        let mut p = pod(&[image]);
        let (result, counts) = run(&mutator(true), &mut p);
        result.unwrap();
        assert_eq!(images(&p), [expected]);
        assert_eq!(counts, [1, 0, 0, 0, 0, 0, 1, 0]);
    }

    #[rstest]
    #[case::build_image_task("test.other.hostname/cloud/task")]
    #[case::org_image("test.other.hostname/orgs/test-org/image")]
    #[case::public_image("test.other.hostname/union/image")]
    #[case::v1_build_image_task("test.other.hostname/v1/cloud/task")]
    #[case::v1_org_image("test.other.hostname/v1/orgs/test-org/image")]
    #[case::v1_public_image("test.other.hostname/v1/union/image")]
    fn skips_verification_for_different_host(#[case] image: &str) {
        let mut p = pod(&[image.to_owned()]);
        let before = p.clone();
        let (result, counts) = run(&mutator(true), &mut p);
        result.unwrap();
        assert_eq!(p, before);
        assert_eq!(counts, [1, 0, 0, 0, 0, 0, 0, 0]);
    }

    // Beyond the Flyte suite.

    #[test]
    fn other_routes_are_left_alone() {
        let mut p = pod(&[format!("{E}/{ORG}/image")]);
        let before = p.clone();
        mutator(false)
            .mutate(&PodCtx::test(Route::Secrets), &mut p)
            .unwrap();
        assert_eq!(p, before);
    }

    #[test]
    fn init_and_ephemeral_containers_are_rewritten_and_excluded_names_are_not() {
        let mut p = pod(&[format!("{E}/{ORG}/app")]);
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![
            Container {
                name: "init".into(),
                image: Some(format!("{E}/{ORG}/init")),
                ..Default::default()
            },
            Container {
                name: "init-embedded-secret".into(),
                image: Some("public.ecr.aws/docker/library/busybox:latest".into()),
                ..Default::default()
            },
        ]);
        spec.ephemeral_containers = Some(vec![EphemeralContainer {
            name: "debug".into(),
            image: Some(format!("{E}/v1/unionai/debug")),
            ..Default::default()
        }]);
        let m = mutator(false);
        let (result, _) = run(&m, &mut p);
        result.unwrap();
        let spec = p.spec.as_ref().unwrap();
        let init: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.image.clone().unwrap())
            .collect();
        assert_eq!(
            init,
            [
                format!("{R}/orgs/{ORG}/init"),
                "public.ecr.aws/docker/library/busybox:latest".into()
            ]
        );
        assert_eq!(
            spec.ephemeral_containers.as_ref().unwrap()[0]
                .image
                .as_deref(),
            Some(format!("{R}/union/debug").as_str())
        );
        let once = p.clone();
        run(&m, &mut p).0.unwrap();
        assert_eq!(p, once, "a rewritten pod is not rewritten again");
    }

    #[test]
    fn an_excluded_prefix_is_allowed() {
        let m = ImageBuilder::new(
            &config(false, &["public.ecr.aws/"]),
            &FileMountInitContainer::default(),
            &ImagesConfig::default(),
        );
        let mut p = pod(&["public.ecr.aws/docker/library/busybox".into()]);
        run(&m, &mut p).0.unwrap();
    }

    const BUSYBOX: &str = "public.ecr.aws/docker/library/busybox:latest";
    const FOREIGN: &str = "test.replacement.hostname/orgs/other-org/private:1";

    /// The builder beside an images entry whose rules rewrite `public.ecr.aws` and `ghcr.io`,
    /// with `ghcr.io/aether/` among the excluded prefixes.
    fn beside_the_images_entry() -> ImageBuilder {
        let ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
        let rule = |m: &str, r: &str| crate::config::images::ImageRule {
            matches: m.into(),
            replace: format!("{ecr}/{r}"),
            rewrite_with_pull_secrets: false,
        };
        ImageBuilder::new(
            &config(false, &["ghcr.io/aether/", "bitnami/", "nginx"]),
            &FileMountInitContainer::default(),
            &ImagesConfig {
                enabled: true,
                rules: vec![
                    rule("public.ecr.aws", "ecr-public"),
                    rule("ghcr.io", "github"),
                    rule("docker.io", "docker-hub"),
                ],
                ..Default::default()
            },
        )
    }

    /// The images entry rewrote what this entry had allowed, and the API server calls this
    /// entry again (`reinvocationPolicy: IfNeeded`): the injected init container and an
    /// excluded prefix are still allowed under their mirror; other mirrored images are not.
    #[rstest]
    #[case::the_injected_init_container(
        Kind::Init,
        "init-embedded-secret",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/ecr-public/docker/library/busybox:latest",
        true
    )]
    #[case::an_excluded_prefix(
        Kind::Init,
        "mesh-gate",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/github/aether/gate:1",
        true
    )]
    #[case::an_excluded_docker_hub_prefix_in_short_form(
        Kind::Container,
        "cache",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/bitnami/redis:7",
        true
    )]
    #[case::an_excluded_official_image_by_its_bare_name(
        Kind::Container,
        "web",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/library/nginx:1.27",
        true
    )]
    #[case::a_docker_hub_image_beside_the_excluded_ones(
        Kind::Container,
        "main",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/bitnamix/redis:7",
        false
    )]
    #[case::a_mirrored_image_of_no_allowed_source(
        Kind::Container,
        "main",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/github/other/tool:1",
        false
    )]
    #[case::a_mirror_path_on_no_boundary(
        Kind::Container,
        "main",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/githubx/aether/gate:1",
        false
    )]
    fn images_the_images_entry_mirrored_are_checked_as_written(
        #[case] kind: Kind,
        #[case] name: &str,
        #[case] image: &str,
        #[case] allowed: bool,
    ) {
        let m = beside_the_images_entry();
        let (result, _) = run(&m, &mut with_extra(kind, name, image));
        assert_eq!(result.is_ok(), allowed, "{result:?}");
    }

    /// The pod of `pod(&[OTHER])` with one more container of `kind`.
    fn with_extra(kind: Kind, name: &str, image: &str) -> Pod {
        let mut p = pod(&[OTHER.into()]);
        let spec = p.spec.as_mut().unwrap();
        let c = Container {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        };
        match kind {
            Kind::Container => spec.containers.push(c),
            Kind::Init => spec.init_containers = Some(vec![c]),
            Kind::Ephemeral => {
                spec.ephemeral_containers = Some(vec![EphemeralContainer {
                    name: c.name,
                    image: c.image,
                    ..Default::default()
                }]);
            }
        }
        p
    }

    #[rstest]
    #[case::a_docker_hub_namespace("bitnami/", &["docker.io/bitnami/"])]
    #[case::a_bare_name("nginx", &["docker.io/nginx", "docker.io/library/nginx"])]
    #[case::a_bare_name_and_tag("redis:7", &["docker.io/redis:7", "docker.io/library/redis:7"])]
    #[case::the_hub_and_a_bare_name(
        "docker.io/nginx",
        &["docker.io/nginx", "docker.io/library/nginx"]
    )]
    #[case::the_legacy_hub_and_a_bare_name(
        "index.docker.io/nginx",
        &["docker.io/nginx", "docker.io/library/nginx"]
    )]
    #[case::the_legacy_hub_host("index.docker.io/bitnami/", &["docker.io/bitnami/"])]
    #[case::the_hub_itself("docker.io/", &[])]
    #[case::the_hub_host("docker.io", &[])]
    #[case::the_legacy_hub_host_alone("index.docker.io", &["docker.io"])]
    #[case::the_legacy_hub_itself("index.docker.io/", &["docker.io/"])]
    #[case::a_registry("ghcr.io/aether/", &[])]
    #[case::library("library/", &["docker.io/library/"])]
    #[case::nothing("", &[])]
    fn excluded_prefixes_read_in_long_form(#[case] prefix: &str, #[case] long: &[&str]) {
        assert_eq!(long_forms(prefix), long);
    }

    /// Only the init container we inject, by name and configured image, skips the check; a
    /// pod's own container of that name is checked like any other.
    #[rstest]
    #[case::the_injected_init_container(Kind::Init, "init-embedded-secret", BUSYBOX, true)]
    #[case::a_pod_init_container_with_the_name_and_a_foreign_image(
        Kind::Init,
        "init-embedded-secret",
        FOREIGN,
        false
    )]
    #[case::a_pod_container_with_the_name_and_the_busybox_image(
        Kind::Container,
        "init-embedded-secret",
        BUSYBOX,
        false
    )]
    #[case::a_pod_container_with_the_name_and_a_foreign_image(
        Kind::Container,
        "init-embedded-secret",
        FOREIGN,
        false
    )]
    #[case::an_ephemeral_container_with_the_name(
        Kind::Ephemeral,
        "init-embedded-secret",
        BUSYBOX,
        false
    )]
    #[case::the_busybox_image_under_another_name(Kind::Init, "setup", BUSYBOX, false)]
    fn a_container_named_like_the_injected_init_container_is_exempt_only_if_it_is_it(
        #[case] kind: Kind,
        #[case] name: &str,
        #[case] image: &str,
        #[case] exempt: bool,
    ) {
        let mut p = with_extra(kind, name, image);
        let (result, _) = run(&mutator(false), &mut p);
        match (exempt, result) {
            (true, Ok(())) => {}
            (false, Err(d)) => {
                assert_eq!(d.code, 403);
                assert!(
                    d.message
                        .starts_with(&format!("access to {image} is not authorized;")),
                    "{}",
                    d.message
                );
            }
            (want, got) => panic!("{kind:?} {name} {image}: exempt {want}, got {got:?}"),
        }
    }

    #[test]
    fn the_exempt_image_is_the_configured_file_mount_image() {
        let mirror = "test.replacement.hostname/mirror/busybox:1.36";
        let m = ImageBuilder::new(
            &config(false, &[]),
            &FileMountInitContainer {
                image: mirror.into(),
                ..Default::default()
            },
            &ImagesConfig::default(),
        );
        run(
            &m,
            &mut with_extra(Kind::Init, "init-embedded-secret", mirror),
        )
        .0
        .unwrap();
        let refused = run(
            &m,
            &mut with_extra(Kind::Init, "init-embedded-secret", BUSYBOX),
        )
        .0;
        assert_eq!(
            refused.unwrap_err().code,
            403,
            "the default image is no longer ours"
        );
    }

    /// `R/cloud/task` and `R/v1/cloud/task` end at `/`, `:`, `@` or the end of the image.
    #[rstest]
    #[case::bare(format!("{R}/cloud/task"), true)]
    #[case::tag(format!("{R}/cloud/task:1.2"), true)]
    #[case::digest(format!("{R}/cloud/task@sha256:{}", "0".repeat(64)), true)]
    #[case::path_below(format!("{R}/cloud/task/builder:1"), true)]
    #[case::v1_tag(format!("{R}/v1/cloud/task:1"), true)]
    #[case::v1_path_below(format!("{R}/v1/cloud/task/builder@sha256:{}", "0".repeat(64)), true)]
    #[case::longer_name(format!("{R}/cloud/task-other-team/private:1"), false)]
    #[case::longer_name_without_tag(format!("{R}/cloud/tasks"), false)]
    #[case::v1_longer_name(format!("{R}/v1/cloud/task-other-team/private:1"), false)]
    #[case::dot_after(format!("{R}/cloud/task.evil/x:1"), false)]
    fn cloud_task_prefixes_end_at_a_path_boundary(#[case] image: String, #[case] allowed: bool) {
        let mut p = pod(std::slice::from_ref(&image));
        let (result, _) = run(&mutator(false), &mut p);
        assert_eq!(result.is_ok(), allowed, "{image}: {result:?}");
    }

    /// An UPDATE (or the ephemeral containers subresource) rewrites and checks the images it
    /// changes or adds; the images the pod already had are not its doing.
    #[test]
    fn an_update_checks_the_images_it_changes_and_only_those() {
        let m = mutator(false);
        let check = |old: &Pod, new: &mut Pod| {
            let ctx = PodCtx {
                namespace: ORG,
                old: Some(old),
                ..PodCtx::test(Route::ImageBuilder)
            };
            m.mutate(&ctx, new).map_err(|d| d.denial)
        };
        // An old pod that runs an image the check would refuse today.
        let old = pod(&[FOREIGN.into()]);
        let mut same = old.clone();
        same.metadata.labels = Some([("team".to_owned(), "x".to_owned())].into());
        check(&old, &mut same).unwrap();
        assert_eq!(images(&same), [FOREIGN], "an unchanged image is left alone");

        let allowed_old = pod(&[OTHER.into()]);
        let mut swapped = pod(&[FOREIGN.into()]);
        assert_eq!(check(&allowed_old, &mut swapped).unwrap_err().code, 403);

        let mut rewritten = pod(&[format!("{E}/{ORG}/app:2")]);
        check(&allowed_old, &mut rewritten).unwrap();
        assert_eq!(images(&rewritten), [format!("{R}/orgs/{ORG}/app:2")]);

        let mut debug = with_extra(Kind::Ephemeral, "debug", FOREIGN);
        assert_eq!(check(&allowed_old, &mut debug).unwrap_err().code, 403);
        let mut debug = with_extra(Kind::Ephemeral, "debug", &format!("{R}/union/debug"));
        check(&allowed_old, &mut debug).unwrap();
    }

    fn builder_image() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let host = prop_oneof![Just(E), Just(R), Just("other.example")];
        let middle = prop_oneof![
            Just("/v1/unionai/"),
            Just("/unionai/"),
            Just("/v1/"),
            Just("/orgs/v1/"),
            Just("/orgs/"),
            Just("/"),
            Just("/union/"),
        ];
        let digest = prop_oneof![
            Just(String::new()),
            "[0-9a-f]{64}".prop_map(|d| format!("@sha256:{d}"))
        ];
        // No organisation named `v1`: see `an_org_named_v1_is_rewritten_twice_as_in_flyte`.
        (
            host,
            middle,
            "(test-org|[a-z]{1,5})/[a-z]{1,5}(:[a-z0-9]{1,4})?",
            digest,
        )
            .prop_map(|(h, m, rest, d)| format!("{h}{m}{rest}{d}"))
    }

    proptest::proptest! {
        /// A pod the builder admitted is admitted again unchanged, and a digest survives.
        #[test]
        fn idempotent_and_keeps_digests(images in proptest::collection::vec(builder_image(), 1..4), verify in proptest::bool::ANY) {
            let m = mutator(!verify);
            let mut p = pod(&images);
            if run(&m, &mut p).0.is_ok() {
                let once = p.clone();
                proptest::prop_assert!(run(&m, &mut p).0.is_ok());
                proptest::prop_assert_eq!(&p, &once);
                for (before, after) in images.iter().zip(self::images(&once)) {
                    proptest::prop_assert_eq!(before.split_once('@').map(|x| x.1), after.split_once('@').map(|x| x.1));
                }
            }
        }
    }

    /// Flyte's rule 4 (`R/orgs/v1` -> `R/orgs`) cannot tell an old SDK's `R/orgs/v1/<org>/...`
    /// from an organisation named `v1`; kept as Flyte has it, so the one image family that is
    /// not idempotent is written down here.
    #[test]
    fn an_org_named_v1_is_rewritten_twice_as_in_flyte() {
        let m = mutator(true);
        let once = m.rewrite(&format!("{R}/orgs/v1/v1/x")).unwrap().0;
        assert_eq!(once, format!("{R}/orgs/v1/x"));
        assert_eq!(m.rewrite(&once).unwrap().0, format!("{R}/orgs/x"));
    }

    #[test]
    fn prefixes_match_whole_components() {
        assert_eq!(mutator(false).rewrite(&format!("{E}x.io/a")), None);
        assert_eq!(
            mutator(false).rewrite(&format!("{E}/v1x/a")),
            Some((
                format!("{R}/orgs/v1x/a"),
                ImageCount::ReplacedOrgUnversioned
            ))
        );
    }

    /// The init containers the webhook adds itself (a fetcher, a sidecar, the gate), which the
    /// API server shows this entry when it calls it again after the other entries: rewritten,
    /// never refused; the same images in a pod's own containers are.
    #[test]
    fn the_webhooks_own_init_containers_are_rewritten_but_never_refused() {
        let fetcher = format!("{E}/platform/podmutator:1");
        let mut cfg: Config = serde_json::from_value(serde_json::json!({
            "webhook": {"secretManagerTypes": ["AWS", "Embedded"],
                "embeddedSecretManagerConfig": {"type": "AWS"}},
            "embedded": {"organization": "o", "delivery": "reference", "fetcherImage": fetcher},
            "mesh": {"enabled": true, "gate": {"enabled": true, "image": "g.io/agent:1"}},
        }))
        .unwrap();
        cfg.webhook.image_builder_config = config(false, &[]);
        let m = ImageBuilder::new(
            &cfg.webhook.image_builder_config,
            &FileMountInitContainer::default(),
            &ImagesConfig::default(),
        )
        .with_own(&cfg);
        let init = |name: &str, image: &str| Container {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        };
        let ours = vec![
            init("podmutator-fetch", &fetcher),
            init("aws-pull-secret-0", crate::config::AWS_SIDECAR_IMAGE),
            init("aether-identity-ready", "g.io/agent:1"),
        ];
        let mut p = pod(&[format!("{R}/orgs/{ORG}/app")]);
        p.spec.as_mut().unwrap().init_containers = Some(ours.clone());
        let (result, _) = run(&m, &mut p);
        assert_eq!(result, Ok(()));
        let inits = p.spec.as_ref().unwrap().init_containers.clone().unwrap();
        // Rewritten as any image under `existing` is.
        assert_eq!(
            inits[0].image.as_deref(),
            Some(format!("{R}/orgs/platform/podmutator:1").as_str())
        );
        assert_eq!(
            inits[1].image.as_deref(),
            Some(crate::config::AWS_SIDECAR_IMAGE)
        );
        // Called again on its own output, as after a later entry: still ours.
        assert_eq!(run(&m, &mut p.clone()).0, Ok(()));
        // A pod's own container with one of these images, under another name or kind, is not.
        for (name, image) in [
            ("fetch", fetcher.as_str()),
            ("aether-identity-ready", "g.io/agent:1"),
        ] {
            let mut p = pod(&[image.to_owned()]);
            p.spec.as_mut().unwrap().containers[0].name = name.into();
            assert!(run(&m, &mut p).0.is_err(), "{name} {image}");
        }
        let mut p = pod(&[]);
        p.spec.as_mut().unwrap().init_containers =
            Some(vec![init("aws-pull-secret-0", "g.io/other:1")]);
        assert!(run(&m, &mut p).0.is_err());
    }
}
