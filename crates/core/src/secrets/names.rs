//! What a secret's group, group_version and key may contain, per manager. Each manager writes
//! these names into something with a structure of its own: a Vault template and a file path
//! (Vault), a fetcher's `sh -ec` script (GCP, Azure), a Kubernetes Secret name, key and mount
//! path (K8s), a file name under `/tmp` (AWS). A name outside its rule is refused when the pod is
//! planned ([`Refusal::BadSecretName`], a 400 naming the annotation), so no accepted name can
//! add an action to the template, a command to the script, or a `..` to a path.
//!
//! Flyte's own alphabet for secret names is `A-Z a-z 0-9 . _ -` and `/` (flytekit's
//! `Secret` validation); every rule below is that alphabet or narrower, except the Azure
//! secret URI (`https://`) and AWS ARNs and names (`:`, and AWS's `+ = @`), which are what
//! those providers' names are made of.

use super::codec::Secret;
use super::refusal::Refusal;
use crate::k8s_names::{is_config_map_key, is_dns_subdomain};

/// The rule of [`is_flyte_path`], for messages.
pub const FLYTE_PATH_RULE: &str = "letters, digits, '.', '_', '-' and '/' (Flyte's alphabet), with no empty, '.' or '..' part between slashes";
/// The rule of [`is_shell_path`], for messages.
pub const SHELL_PATH_RULE: &str = "letters, digits, '.', '_', '-' and '/' (Flyte's alphabet), with no empty, '.' or '..' part between slashes and no part starting with '-'";
/// The rule of [`is_shell_word`], for messages.
pub const SHELL_WORD_RULE: &str =
    "letters, digits, '.', '_' and '-', not starting with '-', and not '.' or '..'";
/// The rule of [`is_azure_uri`], for messages.
pub const AZURE_URI_RULE: &str = "https:// followed by letters, digits, '.', '_', '-' and '/', with no empty, '.' or '..' part between slashes (one trailing '/' allowed) and no part starting with '-'";
/// The rule of the K8s manager's key ([`is_config_map_key`]), for messages.
pub const K8S_KEY_RULE: &str = "a Kubernetes Secret key: at most 253 letters, digits, '-', '_' and '.', not '.' and not starting with '..'";
/// The rule of [`is_aws_name`], for messages.
pub const AWS_NAME_RULE: &str = "letters, digits and '/', '_', '+', '=', '.', '@', '-', ':', with no '.' or '..' part between slashes";

fn is_flyte_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/')
}

/// Flyte's alphabet, split on `/` into non-empty parts none of which is `.` or `..`: a relative
/// path that names itself, so that joining it under a directory neither leaves the directory
/// nor is rewritten by cleaning.
pub fn is_flyte_path(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(is_flyte_char)
        && s.split('/').all(|p| !matches!(p, "" | "." | ".."))
}

/// [`is_flyte_path`], and no part starts with `-`: each character is one the shell reads
/// literally in an unquoted word, and the word can never be taken for an option.
pub fn is_shell_path(s: &str) -> bool {
    is_flyte_path(s) && s.split('/').all(|p| !p.starts_with('-'))
}

/// One part of [`is_shell_path`]: no `/`.
pub fn is_shell_word(s: &str) -> bool {
    !s.contains('/') && is_shell_path(s)
}

/// An Azure Key Vault secret URI the Azure fetcher's script can hold: `https://` and a
/// [`is_shell_path`] (host, `secrets`, name, optionally a version), one trailing `/` allowed.
pub fn is_azure_uri(s: &str) -> bool {
    s.strip_prefix("https://")
        .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
        .is_some_and(is_shell_path)
}

/// AWS ARNs and secret names: AWS's secret-name alphabet and `:`, no `.` or `..` part (the
/// fetcher's file name is `/<group>/<key>`, cleaned, so such a part would move the file).
pub fn is_aws_name(s: &str) -> bool {
    s.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(b, b'/' | b'_' | b'+' | b'=' | b'.' | b'@' | b'-' | b':')
    }) && s.split('/').all(|p| !matches!(p, "." | ".."))
}

/// `value` of `field` if `valid` accepts it, else the refusal naming `rule`.
fn check(
    field: &'static str,
    value: &str,
    valid: fn(&str) -> bool,
    rule: &'static str,
) -> Result<(), Refusal> {
    if !valid(value) {
        let name = value.to_owned();
        return Err(Refusal::BadSecretName { field, name, rule });
    }
    Ok(())
}

/// Vault: the group is the secret's path and the key its field, both written into the
/// template and into `agent-inject-file` (`<group>/<key>` below `/etc/flyte/secrets`). The
/// group_version only selects the engine and is written nowhere.
pub fn vault(s: &Secret) -> Result<(), Refusal> {
    check("group", &s.group, is_flyte_path, FLYTE_PATH_RULE)?;
    check("key", &s.key, is_flyte_path, FLYTE_PATH_RULE)
}

/// K8s: a non-empty group is the Secret's name (and, lower-cased, the mount path's last part);
/// the key is the Secret's key (and, lower-cased, the file's name). An empty group names the
/// Secret `md5hex(key)`. The group_version only goes into the volume name's base32.
pub fn k8s(s: &Secret) -> Result<(), Refusal> {
    if !s.group.is_empty() {
        check("group", &s.group, is_dns_subdomain, K8S_SECRET_NAME_RULE)?;
    }
    check("key", &s.key, is_config_map_key, K8S_KEY_RULE)
}

/// The rule of a K8s group.
pub const K8S_SECRET_NAME_RULE: &str = "a Kubernetes Secret name (DNS subdomain): at most 253 characters: lowercase letters, digits, '-' and '.', each '.'-separated part starting and ending with a letter or digit";

/// GCP: group and group_version are words of the fetcher's script and parts of the file path;
/// the key is not used.
pub fn gcp(s: &Secret) -> Result<(), Refusal> {
    check("group", &s.group, is_shell_path, SHELL_PATH_RULE)?;
    let v = &s.group_version;
    check("group_version", v, is_shell_word, SHELL_WORD_RULE)
}

/// Azure: the group is the secret URI (its last part the file's name), the optional
/// group_version the version; both are in the fetcher's script. The key is not used.
pub fn azure(s: &Secret) -> Result<(), Refusal> {
    check("group", &s.group, is_azure_uri, AZURE_URI_RULE)?;
    match s.group_version.as_str() {
        "" => Ok(()),
        v => check("group_version", v, is_shell_word, SHELL_WORD_RULE),
    }
}

/// AWS: group (the ARN) and key (the secret's name) reach the fetcher as env vars, and make
/// its file name.
pub fn aws(s: &Secret) -> Result<(), Refusal> {
    check("group", &s.group, is_aws_name, AWS_NAME_RULE)?;
    check("key", &s.key, is_aws_name, AWS_NAME_RULE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s_names::DNS_SUBDOMAIN_RULE;
    use rstest::rstest;

    #[test]
    fn the_k8s_group_rule_is_the_subdomain_rule() {
        assert!(K8S_SECRET_NAME_RULE.ends_with(DNS_SUBDOMAIN_RULE));
    }

    #[rstest]
    #[case::plain("secret/data/db", true)]
    #[case::one_part("db", true)]
    #[case::dots_inside("a.b/c..d", true)]
    #[case::empty("", false)]
    #[case::leading_slash("/etc/passwd", false)]
    #[case::trailing_slash("a/", false)]
    #[case::double_slash("a//b", false)]
    #[case::dot_dot("../../../tmp/x", false)]
    #[case::dot_dot_inside("a/../b", false)]
    #[case::dot("a/./b", false)]
    #[case::template_braces("k }}{{ with secret \"x\" }}", false)]
    #[case::quote("a\"b", false)]
    #[case::space("a b", false)]
    #[case::non_ascii("caf\u{e9}", false)]
    fn flyte_paths(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_flyte_path(s), ok, "{s:?}");
    }

    #[rstest]
    #[case::name("TestSecret", true)]
    #[case::full("projects/p-1/secrets/name_2", true)]
    #[case::option("--help", false)]
    #[case::option_part("projects/-x", false)]
    #[case::semicolon("mysecret; touch /tmp/pm-pwned; #", false)]
    #[case::dollar("$(id)", false)]
    #[case::backtick("`id`", false)]
    #[case::glob("*", false)]
    #[case::tilde("~root", false)]
    fn shell_paths(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_shell_path(s), ok, "{s:?}");
    }

    #[rstest]
    #[case::plain("https://flyte-kv.vault.azure.net/secrets/DbPassword", true)]
    #[case::trailing_slash("https://flyte-kv.vault.azure.net/secrets/ApiToken/", true)]
    #[case::http("http://v.vault.azure.net/secrets/a", false)]
    #[case::no_scheme("v.vault.azure.net/secrets/a", false)]
    #[case::two_trailing_slashes("https://v.vault.azure.net/secrets/a//", false)]
    #[case::quote("https://v.vault.azure.net/secrets/a\"; touch x; #", false)]
    #[case::dot_dot("https://v.vault.azure.net/secrets/../../x", false)]
    fn azure_uris(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_azure_uri(s), ok, "{s:?}");
    }

    #[rstest]
    #[case::arn("arn:aws:secretsmanager:us-east-1:123456789012:secret:", true)]
    #[case::name("flyte/db-password+x=y@z-AbCdEf", true)]
    #[case::dot_dot("../../etc", false)]
    #[case::space("a b", false)]
    fn aws_names(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_aws_name(s), ok, "{s:?}");
    }
}
