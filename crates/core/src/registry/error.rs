//! Why an image's command could not be read ([`LookupError`]): the contract between the core's
//! [`super::EntrypointSource`] and the registry client, with what of it a reply may repeat.

use crate::image_ref::{DOCKER_HUB, ImageRef};

/// Largest manifest, config blob or token response read.
pub const MAX_BODY: usize = 4 << 20;
/// Redirects followed per request.
pub const MAX_REDIRECTS: usize = 3;

/// Why an image's command could not be read. Names the image's registry, repository and
/// digests, never a token.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("image reference {image:?} {reason}")]
    Reference { image: String, reason: String },
    #[error(
        "registry {0} is not listed in embedded.entrypointLookup.registries, so it is not asked"
    )]
    NotAllowed(String),
    #[error("the lookup took longer than embedded.entrypointLookup.timeoutMs ({0} ms)")]
    Timeout(u64),
    #[error("cannot reach {host}: {reason}")]
    Connect { host: String, reason: String },
    #[error("{what}: the registry answered HTTP {status}")]
    Status { what: String, status: u16 },
    #[error("{what}: not found (HTTP 404): check the image name and tag")]
    NotFound { what: String },
    #[error(
        "{what}: the registry asks for credentials ({challenge}); podmutator reads images anonymously"
    )]
    Unauthorized { what: String, challenge: String },
    #[error("{what}: more than {MAX_BODY} bytes")]
    TooLarge { what: String },
    #[error(
        "{what}: more than {MAX_REDIRECTS} redirects, or a redirect to a non-HTTPS or unreadable location"
    )]
    Redirect { what: String },
    #[error("{what}: its content does not match its digest {digest}")]
    DigestMismatch { what: String, digest: String },
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error(
        "the image has no linux/{arch} platform (it has {}): pin another kubernetes.io/arch", listed(.available)
    )]
    NoPlatform {
        arch: String,
        available: Vec<String>,
    },
    #[error(
        "the image's platforms run different commands ({commands}): pin the pod's kubernetes.io/arch (nodeSelector)"
    )]
    PlatformsDisagree {
        platforms: Vec<String>,
        /// Each platform's command, as the registry's config blobs have it.
        commands: String,
    },
}

impl LookupError {
    /// What the pod's creator is told (the injector adds the container and the image): the kind
    /// of failure, with only what the webhook itself knows (the pod's image, its registry, the
    /// configuration's limits, an HTTP status). No text a registry sent (a body, a
    /// deserialiser's quote of it, a challenge, a redirect's host, an AWS error) reaches it:
    /// the [`std::fmt::Display`] form has those, for the log ([`super::lookup_all`]).
    pub fn reason(&self, image: &str) -> String {
        const LOGGED: &str = "details in the webhook's log";
        match self {
            // The pod's own reference, the registry it names, and the configuration's limit.
            Self::Reference { .. } | Self::NotAllowed(_) | Self::Timeout(_) => self.to_string(),
            Self::Connect { host, reason } => {
                // The registry the image names, or a host it sent the lookup on to.
                let own = ImageRef::parse(image).is_ok_and(|r| api_authority(&r.registry) == *host);
                let whom = if own {
                    host.as_str()
                } else {
                    "a host the registry sent the lookup to"
                };
                if reason.starts_with("TLS") {
                    format!(
                        "cannot reach {whom}: TLS failed (a registry with a private CA needs embedded.entrypointLookup.caBundleFile; {LOGGED})"
                    )
                } else {
                    format!("cannot reach {whom} ({LOGGED})")
                }
            }
            Self::Status { status, .. } => {
                format!("the registry answered HTTP {status} ({LOGGED})")
            }
            Self::NotFound { .. } => "not found (HTTP 404): check the image name and tag".into(),
            // Our own hint for a Basic or Bearer challenge; any other scheme, or an AWS error,
            // is the log's.
            Self::Unauthorized { challenge, .. }
                if challenge == BASIC_HINT || challenge == BEARER_HINT =>
            {
                format!(
                    "the registry asks for credentials ({challenge}); podmutator reads images anonymously"
                )
            }
            Self::Unauthorized { .. } => format!(
                "the registry asks for credentials podmutator does not have ({LOGGED}); podmutator reads images anonymously, and ECR images with the function's role"
            ),
            Self::TooLarge { .. } => {
                format!("an answer of the registry was more than {MAX_BODY} bytes")
            }
            Self::Redirect { .. } => format!(
                "the registry redirected more than {MAX_REDIRECTS} times, or to a non-HTTPS or unreadable location"
            ),
            Self::DigestMismatch { .. } => {
                "an answer of the registry does not match its digest".into()
            }
            Self::Invalid { .. } => format!(
                "an answer of the registry is not a valid image manifest, index, config or token response ({LOGGED})"
            ),
            // The architecture is the pod's own (its nodeSelector or affinity); of the image's
            // platforms only names Kubernetes knows are repeated.
            Self::NoPlatform { arch, available } => format!(
                "the image has no linux/{arch} platform (it has {}): pin another kubernetes.io/arch",
                listed(&known_platforms(available))
            ),
            Self::PlatformsDisagree { platforms, .. } => format!(
                "the image's platforms ({}) run different commands: pin the pod's kubernetes.io/arch (nodeSelector; the commands are in the webhook's log)",
                listed(&known_platforms(platforms))
            ),
        }
    }
}

pub(crate) fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Of `names` (`os/arch[/variant]` from a registry's index), those made only of names
/// Kubernetes nodes report (`kubernetes.io/arch`), so that a reply repeats no other text of
/// the registry's.
pub fn known_platforms(names: &[String]) -> Vec<String> {
    const ARCHES: &[&str] = &[
        "386", "amd64", "arm", "arm64", "loong64", "mips", "mips64", "mips64le", "mipsle", "ppc64",
        "ppc64le", "riscv64", "s390x", "unknown",
    ];
    const VARIANTS: &[&str] = &["v5", "v6", "v7", "v8", "v1", "v2", "v3", "v4"];
    names
        .iter()
        .filter(|n| match n.split('/').collect::<Vec<_>>()[..] {
            ["linux" | "unknown", arch] => ARCHES.contains(&arch),
            ["linux" | "unknown", arch, v] => ARCHES.contains(&arch) && VARIANTS.contains(&v),
            _ => false,
        })
        .cloned()
        .collect()
}

/// The host the distribution API of `registry` is served on.
pub fn api_authority(registry: &str) -> String {
    let docker_hub = registry == DOCKER_HUB;
    (if docker_hub { DOCKER_HUB_API } else { registry }).to_owned()
}

/// What a `Basic` challenge means here.
pub const BASIC_HINT: &str = "Basic: podmutator has credentials for ECR registries only (the function's role); make the image public";
/// What a `Bearer` challenge that an anonymous token did not answer means here.
pub const BEARER_HINT: &str = "Bearer, and an anonymous token does not grant pull";

/// Docker Hub's API host (`docker.io` is only its name in references).
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
