//! The image mutators: [`builder`] is the Union fork's image-builder (`webhook.imageBuilderConfig`),
//! [`rules`] the registry rewrite rules (`images`). Both only ever change `image` fields, of
//! containers, init containers and ephemeral containers alike; `imagePullPolicy` and everything
//! else stay as they were.

pub mod builder;
pub mod rules;

use k8s_openapi::api::core::v1::PodSpec;

pub use builder::ImageBuilder;
pub use rules::ImageRules;

/// `(container name, image)` of every container, init container and ephemeral container, in
/// that order, skipping those named in `excluded`.
pub fn images_mut<'a>(
    spec: &'a mut PodSpec,
    excluded: &'a [String],
) -> impl Iterator<Item = (&'a str, &'a mut Option<String>)> + 'a {
    let plain = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .map(|c| (c.name.as_str(), &mut c.image));
    let ephemeral = spec
        .ephemeral_containers
        .iter_mut()
        .flatten()
        .map(|c| (c.name.as_str(), &mut c.image));
    plain
        .chain(ephemeral)
        .filter(move |(name, _)| !excluded.iter().any(|e| e == name))
}
