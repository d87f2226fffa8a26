//! The pod side of reference delivery: what runs inside the task pod, with the pod's own AWS
//! identity, so that the webhook never holds a secret value.
//!
//! - [`fetch`]: `podmutator fetch`, the one init container. It reads [`fetch::FETCH_PLAN_ENV`],
//!   fetches every secret in one `BatchGetSecretValue` round trip and writes each to a file
//!   (mode 0400) on an in-memory volume, all or nothing. It can also copy its own executable
//!   into a volume, for [`exec`].
//! - [`exec`]: `podmutator exec -- <command> <args>`, the wrapper of a container that needs
//!   secrets as environment variables. It reads the files [`exec::EXEC_ENV_ENV`] names into its
//!   environment and replaces itself with the original command, so the values exist only in
//!   that process's memory and never in the pod spec.
//!
//! Both read their whole plan from one environment variable, written by the webhook, and
//! validate it before doing anything: a plan is data from the pod spec, which whoever may
//! create pods can write.

pub mod exec;
pub mod fetch;
pub mod injector;

use std::path::Path;

use crate::k8s_names::{FILE_NAME_RULE, is_config_map_key};

/// Why `path` is not an absolute, clean path whose every component is a plain file name, if
/// it is not. Plain names (the rule of a Secret key) keep `..`, empty and odd components out,
/// so a path cannot leave the directory it names.
pub(crate) fn path_problem(path: &Path) -> Option<String> {
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
