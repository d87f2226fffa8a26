//! Container image references, normalised the way docker and containerd read them
//! (`github.com/distribution/reference`): `nginx` is `docker.io/library/nginx`, a first path
//! component is a registry only if it has a `.` or a `:`, is `localhost`, or has an upper-case
//! letter; `index.docker.io` is `docker.io`. A leaf module like `k8s_names`: the config checks
//! rules with it and the image mutators rewrite with it.
//!
//! Written here rather than taken from a crate: the grammar is small, and the rewrite must keep
//! the tag and digest text byte for byte, which a parse-and-print crate does not promise.

/// Docker Hub's canonical registry name and the official-images namespace.
pub const DOCKER_HUB: &str = "docker.io";
const LEGACY_DOCKER_HUB: &str = "index.docker.io";
const OFFICIAL: &str = "library/";
/// distribution/reference caps a name (registry and path) at 255 characters.
pub const NAME_MAX: usize = 255;

/// One parsed reference. `suffix` is the original `:tag`, `@digest` or `:tag@digest` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// The registry, normalised (`docker.io` when the reference names none).
    pub registry: String,
    /// The repository path, normalised (`library/nginx` for `nginx`).
    pub path: String,
    /// Everything after the name, exactly as written (may be empty).
    pub suffix: &'a str,
}

/// Why a reference does not parse; the message says what part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("is empty")]
    Empty,
    #[error("has more than one '@'")]
    TwoDigests,
    #[error("digest {0:?} is not algorithm:hex (sha256 needs 64 lower-case hex digits)")]
    Digest(String),
    #[error("tag {0:?} is not 1-128 of [A-Za-z0-9_.-] starting with a letter, digit or '_'")]
    Tag(String),
    #[error("registry {0:?} is not a host name or IP with an optional :port")]
    Registry(String),
    #[error(
        "path component {0:?} is not lower-case letters and digits separated by '.', '_', '__' or '-'"
    )]
    Component(String),
    #[error("name is longer than {NAME_MAX} characters")]
    TooLong,
}

impl<'a> ImageRef<'a> {
    /// Parses `image` (whitespace anywhere is an error, as in docker).
    pub fn parse(image: &'a str) -> Result<Self, RefError> {
        if image.is_empty() {
            return Err(RefError::Empty);
        }
        let (before_digest, digest) = match image.split_once('@') {
            Some((_, d)) if d.contains('@') => return Err(RefError::TwoDigests),
            Some((n, d)) => (n, Some(d)),
            None => (image, None),
        };
        if let Some(d) = digest
            && !is_digest(d)
        {
            return Err(RefError::Digest(d.to_owned()));
        }
        // A tag's ':' comes after the last '/'; an earlier ':' is a registry port.
        let last_slash = before_digest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match before_digest[last_slash..].find(':') {
            Some(i) => (
                &before_digest[..last_slash + i],
                Some(&before_digest[last_slash + i + 1..]),
            ),
            None => (before_digest, None),
        };
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(RefError::Tag(t.to_owned()));
        }
        if name.len() > NAME_MAX {
            return Err(RefError::TooLong);
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, rest)) if is_registry_like(first) => (first, rest),
            _ => (DOCKER_HUB, name),
        };
        if !is_registry(registry) {
            return Err(RefError::Registry(registry.to_owned()));
        }
        if let Some(c) = path.split('/').find(|c| !is_component(c)) {
            return Err(RefError::Component(c.to_owned()));
        }
        let registry = if registry == LEGACY_DOCKER_HUB {
            DOCKER_HUB
        } else {
            registry
        };
        let path = if registry == DOCKER_HUB && !path.contains('/') {
            format!("{OFFICIAL}{path}")
        } else {
            path.to_owned()
        };
        Ok(Self {
            registry: registry.to_owned(),
            path,
            suffix: &image[name.len()..],
        })
    }

    /// `registry/path`, the name a rule's `match` is compared with.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.path)
    }

    /// The digest as written (`sha256:…`), if any.
    pub fn digest(&self) -> Option<&'a str> {
        self.suffix.split_once('@').map(|(_, d)| d)
    }
}

/// Whether `name` (a normalised `registry/path`) is `prefix` or lies under it, component-wise:
/// `docker.io/library` covers `docker.io/library/nginx`, not `docker.io/library2/x`.
pub fn under(name: &str, prefix: &str) -> bool {
    name == prefix
        || name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `image` is `ours`, or `ours` pinned to a digest as a policy engine pins an image
/// it verified (Kyverno's `mutateDigest`): `repo:tag@sha256:…`, the tag kept. The digest is
/// not checked against the tag (that takes the registry), so it may name another build in the
/// same repository; an image of ours written with a digest is only itself.
pub fn is_ours_or_pinned(image: &str, ours: &str) -> bool {
    if image == ours {
        return true;
    }
    let Some((name, digest)) = image.split_once('@') else {
        return false;
    };
    let is_digest = digest.split_once(':').is_some_and(|(algorithm, encoded)| {
        !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+._-".contains(&b))
            && !encoded.is_empty()
            && encoded
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"=_-".contains(&b))
    });
    is_digest && !ours.contains('@') && name == ours
}

/// docker's test for "the first component names a registry".
pub(crate) fn is_registry_like(first: &str) -> bool {
    first.contains(['.', ':'])
        || first == "localhost"
        || first.chars().any(|c| c.is_ascii_uppercase())
}

/// `host[:port]` where host is dotted DNS-ish labels (any case) or a bracketed IPv6 address.
fn is_registry(r: &str) -> bool {
    let (host, port) = if let Some(rest) = r.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return false;
        }
        if after.is_empty() {
            return true;
        }
        match after.strip_prefix(':') {
            Some(port) => ("x", Some(port)),
            None => return false,
        }
    } else {
        match r.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (r, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_component(c: &str) -> bool {
    let alnum = |x: char| x.is_ascii_lowercase() || x.is_ascii_digit();
    // Between the alphanumerics: nothing, or a separator.
    let sep = |s: &str| matches!(s, "" | "." | "_" | "__") || s.bytes().all(|x| x == b'-');
    c.starts_with(alnum) && c.ends_with(alnum) && c.split(alnum).all(sep)
}

/// `[\w][\w.-]{0,127}`
fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

/// Whether `image`'s digest, if it has one, is one the kubelet's parser knows: `sha256`,
/// `sha384` or `sha512`, lower-case hex of its length. [`ImageRef::parse`] reads any
/// algorithm, as the reference grammar does; the kubelet then refuses the others
/// (`InvalidImageName`).
pub fn kubelet_reads_digest(image: &str) -> bool {
    image.split_once('@').is_none_or(|(_, d)| {
        d.split_once(':').is_some_and(|(alg, hex)| {
            [("sha256", 64), ("sha384", 96), ("sha512", 128)].contains(&(alg, hex.len()))
                && hex.bytes().all(is_lower_hex)
        })
    })
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// `algorithm:encoded`; sha256 must be 64 lower-case hex digits, others at least 32 hex digits.
fn is_digest(d: &str) -> bool {
    let Some((alg, enc)) = d.split_once(':') else {
        return false;
    };
    let alg_ok = !alg.is_empty()
        && alg.split(['+', '.', '_', '-']).all(|part| {
            part.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
                && part.bytes().all(|b| b.is_ascii_alphanumeric())
        });
    alg_ok
        && match alg {
            "sha256" => enc.len() == 64 && enc.bytes().all(is_lower_hex),
            "sha512" => enc.len() == 128 && enc.bytes().all(is_lower_hex),
            _ => enc.len() >= 32 && enc.bytes().all(|b| b.is_ascii_hexdigit()),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[rstest]
    #[case::bare_official_image("nginx", "docker.io", "library/nginx", "")]
    #[case::official_with_tag("nginx:1.27", "docker.io", "library/nginx", ":1.27")]
    #[case::hub_user_image("bitnami/redis:7", "docker.io", "bitnami/redis", ":7")]
    #[case::explicit_hub("docker.io/nginx", "docker.io", "library/nginx", "")]
    #[case::legacy_hub("index.docker.io/library/nginx", "docker.io", "library/nginx", "")]
    #[case::registry_with_port("localhost:5000/app:v1", "localhost:5000", "app", ":v1")]
    #[case::localhost_alone("localhost/app", "localhost", "app", "")]
    #[case::quay(
        "quay.io/prometheus/node-exporter:v1.8.0",
        "quay.io",
        "prometheus/node-exporter",
        ":v1.8.0"
    )]
    #[case::uppercase_first_component_is_a_registry("Registry/app", "Registry", "app", "")]
    #[case::ipv6_registry("[::1]:5000/app", "[::1]:5000", "app", "")]
    #[case::separators("r.io/a__b/c-d.e_f--g", "r.io", "a__b/c-d.e_f--g", "")]
    fn parses_like_docker(
        #[case] image: &str,
        #[case] registry: &str,
        #[case] path: &str,
        #[case] suffix: &str,
    ) {
        let r = ImageRef::parse(image).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.path.as_str(), r.suffix),
            (registry, path, suffix)
        );
    }

    #[test]
    fn tag_and_digest_are_kept_together_byte_for_byte() {
        let image = format!("ghcr.io/o/app:v1.2@{D}");
        let r = ImageRef::parse(&image).unwrap();
        assert_eq!(r.suffix, format!(":v1.2@{D}"));
        assert_eq!(r.digest(), Some(D));
    }

    #[rstest]
    #[case::empty("", RefError::Empty)]
    #[case::upper_case_repository("docker.io/Library/nginx", RefError::Component("Library".into()))]
    #[case::space_inside("ngi nx", RefError::Component("ngi nx".into()))]
    #[case::short_digest("nginx@sha256:abc", RefError::Digest("sha256:abc".into()))]
    #[case::two_digests(&format!("nginx@{D}@{D}"), RefError::TwoDigests)]
    #[case::bad_tag("nginx:-x", RefError::Tag("-x".into()))]
    #[case::empty_tag("nginx:", RefError::Tag(String::new()))]
    #[case::empty_component("r.io//app", RefError::Component(String::new()))]
    #[case::trailing_slash("r.io/app/", RefError::Component(String::new()))]
    #[case::bad_port("r.io:http/app", RefError::Registry("r.io:http".into()))]
    #[case::scheme("https://r.io/app", RefError::Registry("https:".into()))]
    fn refuses_what_docker_refuses(#[case] image: &str, #[case] err: RefError) {
        assert_eq!(ImageRef::parse(image), Err(err));
    }

    #[test]
    fn a_name_over_255_characters_is_refused() {
        let image = format!("r.io/{}", "a".repeat(251));
        assert_eq!(ImageRef::parse(&image), Err(RefError::TooLong));
    }

    #[rstest]
    #[case::equal("docker.io/library", "docker.io/library", true)]
    #[case::below("docker.io/library/nginx", "docker.io/library", true)]
    #[case::sibling_with_same_start("docker.io/library2/x", "docker.io/library", false)]
    #[case::registry("docker.io/library/nginx", "docker.io", true)]
    #[case::registry_with_longer_host("docker.io.evil/x", "docker.io", false)]
    fn under_is_component_wise(#[case] name: &str, #[case] prefix: &str, #[case] expected: bool) {
        assert_eq!(under(name, prefix), expected);
    }

    #[rstest::rstest]
    #[case::itself("docker.io/amazon/sidecar:v1", true)]
    #[case::tag_and_digest(&format!("docker.io/amazon/sidecar:v1@sha256:{}", "a".repeat(64)), true)]
    #[case::digest_for_the_tag(&format!("docker.io/amazon/sidecar@sha256:{}", "a".repeat(64)), false)]
    #[case::another_tag_and_digest(&format!("docker.io/amazon/sidecar:v2@sha256:{}", "a".repeat(64)), false)]
    #[case::another_repository(&format!("docker.io/evil/sidecar@sha256:{}", "a".repeat(64)), false)]
    #[case::a_longer_repository(&format!("docker.io/amazon/sidecar2@sha256:{}", "a".repeat(64)), false)]
    #[case::no_digest_after_at("docker.io/amazon/sidecar:v1@latest", false)]
    #[case::an_empty_digest("docker.io/amazon/sidecar:v1@sha256:", false)]
    fn an_image_of_ours_pinned_to_a_digest_is_ours(#[case] image: &str, #[case] ours: bool) {
        assert_eq!(
            is_ours_or_pinned(image, "docker.io/amazon/sidecar:v1"),
            ours
        );
    }

    #[test]
    fn a_registry_port_is_no_tag_and_a_pinned_image_is_only_itself() {
        let d = format!("sha256:{}", "b".repeat(64));
        assert!(is_ours_or_pinned(
            &format!("localhost:5000/f@{d}"),
            "localhost:5000/f"
        ));
        assert!(!is_ours_or_pinned(
            &format!("localhost:5000/f@{d}"),
            "localhost:5000/f:1"
        ));
        assert!(!is_ours_or_pinned(
            &format!("localhost@{d}"),
            "localhost:5000/f"
        ));
        let pinned = format!("r.example/f@{d}");
        assert!(!is_ours_or_pinned(&format!("{pinned}@{d}"), &pinned));
    }
}
