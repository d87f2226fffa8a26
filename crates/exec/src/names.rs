//! The two Kubernetes name rules a plan is checked against, as the API server's validation
//! (`k8s.io/apimachinery/pkg/util/validation`) states them. podmutator's `k8s_names` re-exports
//! these, and holds them to the API server's own regular expressions in its property tests.

use std::path::Path;

/// The rule of [`is_env_var_name`], for messages.
pub const ENV_VAR_NAME_RULE: &str = "printable ASCII characters other than '='";
/// The rule of [`is_config_map_key`], for messages.
pub const FILE_NAME_RULE: &str =
    "at most 253 letters, digits, '-', '_' and '.', not \".\" and not starting with \"..\"";

/// `IsRelaxedEnvVarName`: a container environment variable's name, as every API server
/// podmutator supports (1.33 and later: `RelaxedEnvironmentVariableValidation`, on by default
/// since 1.32 and GA in 1.34) accepts it. Flyte writes any name; the older rule (letters,
/// digits, `_`, `-`, `.`, no leading digit) refused names these API servers take.
pub fn is_env_var_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'=')
}

/// `IsConfigMapKey`: a Secret or ConfigMap key, and so a projected file name. Not `.`, and
/// nothing starting with `..` (`..` itself included): the API server refuses such a key, and
/// such a path in a projected volume, where kubelet keeps `..data` and its timestamped
/// directories. Every file name podmutator writes follows this one rule.
pub fn is_config_map_key(s: &str) -> bool {
    s != "."
        && !s.starts_with("..")
        && !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Why `path` is not an absolute, clean path whose every component is a plain file name, if
/// it is not. Plain names (the rule of a Secret key) keep `..`, empty and odd components out,
/// so a path cannot leave the directory it names.
pub fn path_problem(path: &Path) -> Option<String> {
    let text = path.to_string_lossy();
    let Some(rest) = text.strip_prefix('/') else {
        return Some(format!("{text:?} must be an absolute path"));
    };
    // The text as written, not `Path::components`, which hides `a/./b`, `a//b` and a trailing
    // `/`: the path the kernel resolves must be the one validated.
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Some(format!(
                "{text:?} must be a clean path (no empty, '.' or '..' parts)"
            ));
        }
        if !is_config_map_key(part) {
            return Some(format!(
                "{text:?}: the part {part:?} must be {FILE_NAME_RULE}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::plain("/etc/flyte/secrets/db_password")]
    #[case::dots_inside_a_name("/podmutator/env/a.b-c_d")]
    fn clean_absolute_paths_pass(#[case] path: &str) {
        assert_eq!(path_problem(Path::new(path)), None);
    }

    #[rstest]
    #[case::relative("etc/secret", "absolute")]
    #[case::parent("/etc/../secret", "clean")]
    #[case::current("/etc/./secret", "clean")]
    #[case::double_slash("/etc//secret", "clean")]
    #[case::trailing_slash("/etc/secret/", "clean")]
    #[case::space("/etc/my secret", "must be at most 253")]
    #[case::colon("/etc/a:b", "must be at most 253")]
    #[case::reserved_dot_dot_prefix("/etc/..data", "not starting with")]
    fn unclean_paths_are_named_with_the_rule(#[case] path: &str, #[case] want: &str) {
        let problem = path_problem(Path::new(path)).expect("refused");
        assert!(problem.contains(want), "{problem}");
        assert!(problem.contains(path), "{problem}");
    }

    /// `IsConfigMapKey` refuses a key starting with `..` (the API server's
    /// `validateLocalNonReservedPath` too, for a projected item's path: kubelet keeps `..data`
    /// and its timestamped directories there); dots elsewhere are fine.
    #[rstest]
    #[case::dot(".", false)]
    #[case::dot_dot("..", false)]
    #[case::dot_dot_data("..data", false)]
    #[case::three_dots("...", false)]
    #[case::dot_dot_dot_name("...a", false)]
    #[case::hidden(".a", true)]
    #[case::dots_inside("a..b", true)]
    #[case::trailing_dots("a..", true)]
    fn keys_starting_with_two_dots_are_refused(#[case] key: &str, #[case] ok: bool) {
        assert_eq!(is_config_map_key(key), ok, "{key:?}");
    }
}
