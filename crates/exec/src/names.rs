//! The two Kubernetes name rules a plan is checked against, as the API server's validation
//! (`k8s.io/apimachinery/pkg/util/validation`) states them. podmutator's `k8s_names` re-exports
//! these, and holds them to the API server's own regular expressions in its property tests.

use std::path::Path;

/// The rule of [`is_env_var_name`], for messages.
pub const ENV_VAR_NAME_RULE: &str = "printable ASCII characters other than '='";
/// The rule of [`is_config_map_key`], for messages.
pub const FILE_NAME_RULE: &str =
    "at most 253 letters, digits, '-', '_' and '.', and not \".\" or \"..\"";

/// `IsRelaxedEnvVarName`: a container environment variable's name, as every API server
/// podmutator supports (1.33 and later: `RelaxedEnvironmentVariableValidation`, on by default
/// since 1.32 and GA in 1.34) accepts it. Flyte writes any name; the older rule (letters,
/// digits, `_`, `-`, `.`, no leading digit) refused names these API servers take.
pub fn is_env_var_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'=')
}

/// `IsConfigMapKey`: a Secret or ConfigMap key, and so a projected file name.
pub fn is_config_map_key(s: &str) -> bool {
    !matches!(s, "" | "." | "..")
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
    fn unclean_paths_are_named_with_the_rule(#[case] path: &str, #[case] want: &str) {
        let problem = path_problem(Path::new(path)).expect("refused");
        assert!(problem.contains(want), "{problem}");
        assert!(problem.contains(path), "{problem}");
    }
}
