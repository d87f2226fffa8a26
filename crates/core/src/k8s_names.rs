//! Every Kubernetes name rule podmutator checks, in one place: what the API server's
//! validation (`k8s.io/apimachinery/pkg/util/validation`) accepts, so that a name we write or
//! read from config is refused here, with the rule, rather than by the API server later.
//!
//! The property tests at the bottom hold each function to the API server's own regular
//! expression and length limit.

/// The rule of [`is_dns_label`], for messages.
pub const DNS_LABEL_RULE: &str =
    "at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit";
/// The rule of [`is_dns_subdomain`], for messages.
pub const DNS_SUBDOMAIN_RULE: &str = "at most 253 characters: lowercase letters, digits, '-' and '.', each '.'-separated part starting and ending with a letter or digit";
// The two rules the in-pod exec wrapper checks a plan against live in its crate, which holds
// nothing else; the property tests below hold them to the API server's expressions too.
pub use podmutator_exec::names::{
    ENV_VAR_NAME_RULE, FILE_NAME_RULE, is_config_map_key, is_env_var_name,
};

/// RFC 1123 label (`IsDNS1123Label`): container, volume and port names.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_dns_part(s)
}

/// RFC 1123 subdomain (`IsDNS1123Subdomain`): object names, label prefixes, CSI drivers.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_part)
}

/// A label of any length: lowercase letters, digits and '-', a letter or digit at both ends.
fn is_dns_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The name part of a qualified name, and a non-empty label value: 1-63 alphanumerics, `-`,
/// `_` or `.`, alphanumeric at both ends.
fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// `IsQualifiedName`: a label or annotation key, `[prefix/]name`.
pub fn is_qualified_name(key: &str) -> bool {
    qualified_name_problem(key).is_none()
}

/// Why `key` is not a label or annotation key (`[prefix/]name`), if it is not.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = key
        .split_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Some(format!(
            "{key:?}: the prefix {p:?} must be a DNS subdomain such as example.io"
        ));
    }
    (!is_qualified_name_part(name)).then(|| {
        format!(
            "{key:?} is not a label or annotation key: the name part must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    })
}

/// `IsValidLabelValue`: empty, or a qualified name's name part.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

#[cfg(test)]
mod tests {
    //! Each rule against the API server's own expression (apimachinery's validation.go),
    //! on strings drawn mostly from the characters that matter.
    use super::*;
    use proptest::prelude::*;
    use regex::Regex;

    const DNS1123_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    const DNS1123_SUBDOMAIN: &str =
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
    const QUALIFIED_NAME: &str = "^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
    const LABEL_VALUE: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
    /// `IsRelaxedEnvVarName` checks runes, not a regular expression: printable ASCII
    /// (`unicode.IsPrint` below `MaxASCII`, the space included) other than '='.
    const ENV_VAR_NAME: &str = "^[ -<>-~]+$";
    const CONFIG_MAP_KEY: &str = r"^[-._a-zA-Z0-9]+$";

    fn api_label(s: &str) -> bool {
        s.len() <= 63 && Regex::new(DNS1123_LABEL).unwrap().is_match(s)
    }
    fn api_subdomain(s: &str) -> bool {
        s.len() <= 253 && Regex::new(DNS1123_SUBDOMAIN).unwrap().is_match(s)
    }
    fn api_qualified(s: &str) -> bool {
        let parts: Vec<&str> = s.split('/').collect();
        let (prefix, name) = match parts.as_slice() {
            [name] => (None, *name),
            [prefix, name] => (Some(*prefix), *name),
            _ => return false,
        };
        prefix.is_none_or(|p| !p.is_empty() && api_subdomain(p))
            && name.len() <= 63
            && Regex::new(QUALIFIED_NAME).unwrap().is_match(name)
    }

    /// Strings of up to `n` characters, mostly from the ones each rule cares about.
    fn names(n: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::string::string_regex(&format!("[a-zA-Z0-9._/=-]{{0,{n}}}")).unwrap(),
            proptest::string::string_regex(&format!("[a-z0-9-]{{0,{n}}}")).unwrap(),
            proptest::string::string_regex(&format!("[a-z0-9.-]{{0,{n}}}")).unwrap(),
            proptest::string::string_regex(&format!("[a-z]{{60,{}}}", n.max(61))).unwrap(),
            ".{0,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn dns_label_is_the_api_servers(s in names(70)) {
            prop_assert_eq!(is_dns_label(&s), api_label(&s), "{:?}", s);
        }

        #[test]
        fn dns_subdomain_is_the_api_servers(s in names(260)) {
            prop_assert_eq!(is_dns_subdomain(&s), api_subdomain(&s), "{:?}", s);
        }

        #[test]
        fn qualified_name_is_the_api_servers(s in names(80)) {
            prop_assert_eq!(is_qualified_name(&s), api_qualified(&s), "{:?}", s);
        }

        #[test]
        fn label_value_is_the_api_servers(s in names(70)) {
            let api = s.len() <= 63 && Regex::new(LABEL_VALUE).unwrap().is_match(&s);
            prop_assert_eq!(is_label_value(&s), api, "{:?}", s);
        }

        #[test]
        fn env_var_name_is_the_api_servers(s in prop_oneof![
            names(20),
            proptest::string::string_regex("[\\x00-\\x7f\u{e9}]{0,12}").unwrap(),
        ]) {
            let api = Regex::new(ENV_VAR_NAME).unwrap().is_match(&s);
            prop_assert_eq!(is_env_var_name(&s), api, "{:?}", s);
        }

        #[test]
        fn config_map_key_is_the_api_servers(s in prop_oneof![
            names(260),
            proptest::string::string_regex(r"\.{1,3}[a-z.]{0,4}").unwrap(),
        ]) {
            // IsConfigMapKey: the expression, the length, not "." and not starting with ".."
            // (`..` itself included).
            let api = s.len() <= 253
                && Regex::new(CONFIG_MAP_KEY).unwrap().is_match(&s)
                && s != "."
                && !s.starts_with("..");
            prop_assert_eq!(is_config_map_key(&s), api, "{:?}", s);
        }
    }

    #[test]
    fn edges_the_generators_might_miss() {
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_subdomain(""));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_qualified_name(""));
        assert!(!is_qualified_name("/name"));
        assert!(!is_qualified_name("a/b/c"));
        assert!(is_qualified_name("example.io/managed"));
        assert!(!is_env_var_name("A=B"));
        assert!(!is_env_var_name(""));
        assert!(!is_env_var_name("A\u{7}"));
        assert!(!is_env_var_name("A\u{7f}"));
        assert!(!is_env_var_name("Ä"));
        assert!(is_env_var_name("_A.b-1"));
        assert!(is_env_var_name("1PASSWORD_TOKEN"));
        assert!(is_env_var_name("MY:PATH ~"));
        assert!(!is_config_map_key(".."));
        assert!(!is_config_map_key("..data"));
        assert!(is_config_map_key(".data"));
        assert!(is_config_map_key("a..b"));
        assert!(is_label_value(""));
    }
}
