//! The image mutators: [`builder`] is the Union fork's image-builder (`webhook.imageBuilderConfig`),
//! [`rules`] the registry rewrite rules (`images`). Both only ever change `image` fields, of
//! containers, init containers and ephemeral containers alike; `imagePullPolicy` and everything
//! else stay as they were.

pub mod builder;
pub mod rules;

use k8s_openapi::api::core::v1::{Pod, PodSpec};

pub use builder::ImageBuilder;
pub use rules::ImageRules;

/// Which list of the pod spec a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Container,
    Init,
    Ephemeral,
}

/// `image` (first) and what the images entry (`rules`) and the image-builder entry (`builder`)
/// rewrite it to, each once after the other in either order, as the API server may have called
/// them before a pod comes back to an entry.
pub fn rewritten_forms(
    image: &str,
    rules: Option<&ImageRules>,
    builder: Option<&ImageBuilder>,
) -> Vec<String> {
    let mut seen = vec![image.to_owned()];
    for _ in 0..2 {
        for i in seen.clone() {
            let by_rules = rules.and_then(|r| r.rewrite(&i, false).ok().flatten());
            let by_builder = builder.and_then(|b| b.rewrite(&i)).map(|(i, _)| i);
            for new in by_rules.into_iter().chain(by_builder) {
                if !seen.contains(&new) {
                    seen.push(new);
                }
            }
        }
    }
    seen
}

/// `(kind, container name, image)` of every container, init container and ephemeral container,
/// in that order.
pub fn all_images_mut(
    spec: &mut PodSpec,
) -> impl Iterator<Item = (Kind, &str, &mut Option<String>)> {
    let containers = spec
        .containers
        .iter_mut()
        .map(|c| (Kind::Container, c.name.as_str(), &mut c.image));
    let init = spec
        .init_containers
        .iter_mut()
        .flatten()
        .map(|c| (Kind::Init, c.name.as_str(), &mut c.image));
    let ephemeral = spec
        .ephemeral_containers
        .iter_mut()
        .flatten()
        .map(|c| (Kind::Ephemeral, c.name.as_str(), &mut c.image));
    containers.chain(init).chain(ephemeral)
}

/// The image of the container of `kind` named `name` in `pod`: `None` when there is no such
/// container, `Some(None)` when it has no image.
pub fn image_of<'p>(pod: &'p Pod, kind: Kind, name: &str) -> Option<Option<&'p str>> {
    let spec = pod.spec.as_ref()?;
    let named = |n: &str, image: &'p Option<String>| (n == name).then_some(image.as_deref());
    match kind {
        Kind::Container => (spec.containers.iter()).find_map(|c| named(&c.name, &c.image)),
        Kind::Init => {
            (spec.init_containers.iter().flatten()).find_map(|c| named(&c.name, &c.image))
        }
        Kind::Ephemeral => {
            (spec.ephemeral_containers.iter().flatten()).find_map(|c| named(&c.name, &c.image))
        }
    }
}
