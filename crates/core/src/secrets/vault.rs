//! The `Vault` manager: asks an existing Vault Agent Injector (itself a webhook, run after this
//! one) to render the secret into a file, by annotating the pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};

use super::codec::{MountRequirement, Secret};
use super::refusal::Refusal;
use super::{Accept, Edits, SECRETS_DIR, SecretInjector, SecretRequest};
use crate::config::{KvVersion, SecretManagerType, VaultConfig};
use crate::mutate::PodCtx;

/// Prefix of every annotation the Vault Agent Injector reads.
pub const VAULT_ANNOTATION_PREFIX: &str = "vault.hashicorp.com/";

/// Injects a secret through the Vault Agent Injector (ANY and FILE; ENV_VAR is refused):
/// - pod annotations `vault.hashicorp.com/agent-inject: "true"`, `secret-volume-path:
///   /etc/flyte/secrets`, `role: <role>`, `agent-pre-populate-only: "true"`, then per secret
///   `agent-inject-secret-<id>: <group>`, `agent-inject-file-<id>: <group>/<key>` and, unless the
///   group_version is `db`, `agent-inject-template-<id>` selecting `<key>` from `.Data` (KV v1)
///   or `.Data.data` (KV v2), the engine coming from group_version `kv1`/`kv2`, else from the
///   deprecated `kvVersion` (default 2). The configured annotations override these defaults and
///   annotations already on the pod override both (Flyte's `UnionMaps` order);
/// - env `FLYTE_SECRETS_FILE_PREFIX=""` and `FLYTE_SECRETS_DEFAULT_DIR=/etc/flyte/secrets` in
///   every container and init container.
///
/// Unlike Flyte, `<id>` is not a fresh time-based UUID but [`vault_id`], derived from the
/// secret: admitting the already-annotated pod again adds nothing, and two secrets never share
/// an id. The agent writes the file to `/etc/flyte/secrets/<group>/<key>` (case kept).
///
/// Configured by `vaultSecretManager`: its `role`, its deprecated `kvVersion` (the engine when
/// group_version is not `kv1`, `kv2` or `db`), and its `annotations`, added to and overriding
/// the defaults above.
pub struct VaultInjector(pub VaultConfig);

impl VaultInjector {
    /// The consul-template path of the key-value map, `None` for the database engine (the agent
    /// then renders the whole credential).
    fn query(&self, group_version: &str) -> Option<&'static str> {
        let kv1 = match group_version {
            "kv1" => true,
            "kv2" => false,
            "db" => return None,
            _ => self.0.kv_version == Some(KvVersion::V1),
        };
        Some(if kv1 { ".Data" } else { ".Data.data" })
    }

    /// The per-secret annotation triple (`CreateVaultAnnotationsForSecret`).
    fn secret_annotations(&self, s: &Secret) -> BTreeMap<String, String> {
        let id = vault_id(s);
        let key = |what: &str| format!("{VAULT_ANNOTATION_PREFIX}agent-inject-{what}-{id}");
        let mut out = BTreeMap::from([
            (key("secret"), s.group.clone()),
            (key("file"), format!("{}/{}", s.group, s.key)),
        ]);
        if let Some(query) = self.query(&s.group_version) {
            out.insert(key("template"), template(query, &s.group, &s.key));
        }
        out
    }

    fn common_annotations(&self) -> BTreeMap<String, String> {
        [
            ("agent-inject", "true"),
            ("secret-volume-path", SECRETS_DIR),
            ("role", self.0.role.as_str()),
            ("agent-pre-populate-only", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{VAULT_ANNOTATION_PREFIX}{k}"), v.to_owned()))
        .collect()
    }
}

impl SecretInjector for VaultInjector {
    fn kind(&self) -> SecretManagerType {
        SecretManagerType::Vault
    }

    fn writes_every_container(&self) -> bool {
        false
    }

    fn accepts(&self, req: &SecretRequest, _: &PodCtx<'_>, _: &Pod) -> Result<Accept, Refusal> {
        let s = &req.secret;
        let missing: Vec<&str> = [("group", &s.group), ("key", &s.key)]
            .into_iter()
            .filter_map(|(name, v)| v.is_empty().then_some(name))
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::MissingField(format!(
                "vault secrets webhook requires both key and group to be set; {} is empty (group is the Vault secret path, key the field to read)",
                missing.join(" and ")
            )));
        }
        match s.mount_requirement {
            MountRequirement::Any | MountRequirement::File => {}
            MountRequirement::EnvVar => {
                // Flyte's text, kept verbatim: users grep for it.
                return Err(Refusal::UnsupportedMount(
                    "Env_Var is not a supported mount requirement for Vault Secret Manager".into(),
                ));
            }
            MountRequirement::Unknown(n) => return Err(Refusal::UnknownMount(n)),
        }
        super::names::vault(s)?;
        Ok(Accept::Now)
    }

    fn inject(
        &self,
        req: &SecretRequest,
        _ctx: &PodCtx<'_>,
        pod: &mut Pod,
        edits: &mut Edits,
    ) -> Result<(), Refusal> {
        let s = &req.secret;
        // Later maps win: defaults < configured annotations < what the pod already has. On
        // re-admission the pod already holds exactly these keys with these values. Only our few
        // keys are inserted where absent; the pod's own map is not rebuilt per secret.
        let mut ours = self.secret_annotations(s);
        ours.extend(self.common_annotations());
        ours.extend(self.0.annotations.clone());
        let annotations = pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        for (k, v) in ours {
            annotations.entry(k).or_insert(v);
        }

        edits.secrets_dir_env();
        Ok(())
    }
}

/// The agent's template for `key` of the secret at `group`: Flyte's
/// `{{- with secret "<group>" -}}{{ <query>.<key> }}{{- end -}}`, byte for byte, when the key is
/// a chain of Go identifiers (`api_token`, `config.password`: a field, or a nested field as in
/// Flyte); any other key (`api-token`, which Flyte's form cannot parse) is indexed as a quoted
/// literal, `{{ index <query> "<key>" }}`. The group is always a Go string literal. Both are
/// escaped as Go string literals whatever they hold, so no name can close the action; the
/// manager accepts only [`super::names::vault`] names anyway.
pub fn template(query: &str, group: &str, key: &str) -> String {
    let field = if is_go_field_chain(key) {
        format!("{query}.{key}")
    } else {
        format!("index {query} {}", go_quote(key))
    };
    format!(
        "{{{{- with secret {} -}}}}{{{{ {field} }}}}{{{{- end -}}}}",
        go_quote(group)
    )
}

/// `a`, `a.b`, ...: each part a Go identifier (ASCII), so `.<key>` is read as field lookups.
fn is_go_field_chain(key: &str) -> bool {
    key.split('.').all(|part| {
        let mut bytes = part.bytes();
        bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// `s` as a Go interpreted string literal: `"`, `\` and every byte outside printable ASCII
/// escaped, so the literal ends exactly at its closing quote.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// The `<id>` of a secret's Vault annotations: a UUID (RFC 9562 version 8, the name-based form
/// with SHA-256) of the secret's group, key and group_version, so re-admission reproduces it.
/// Each field is length-prefixed, so no choice of field contents makes two different secrets
/// hash the same input (`a`+`bc` vs `ab`+`c`). The mount requirement is left out on purpose:
/// ANY and FILE produce the same annotations. 36 characters, so the longest annotation name
/// (`agent-inject-template-<id>`, 58) stays within the 63 the API server allows.
pub fn vault_id(s: &Secret) -> String {
    let digest = identity_digest("podmutator.io/vault", &[&s.group, &s.key, &s.group_version]);
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80; // version 8
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 9562 variant
    let h = hex::encode(b);
    [&h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]].join("-")
}

/// SHA-256 of `domain` and `fields`, each prefixed with its length as 8 big-endian bytes: an
/// unambiguous encoding whatever bytes the fields contain (NUL included).
pub(crate) fn identity_digest(domain: &str, fields: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for f in std::iter::once(domain).chain(fields.iter().copied()) {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f.as_bytes());
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::Route;
    use crate::mutate::pod::env_value;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;
    use rstest::rstest;

    /// Longest name part (after the `/`) of an annotation key the API server accepts.
    const MAX_ANNOTATION_NAME: usize = 63;

    fn injector(kv_version: Option<KvVersion>, annotations: &[(&str, &str)]) -> VaultInjector {
        VaultInjector(VaultConfig {
            role: "flyte".into(),
            kv_version,
            annotations: map(annotations, ""),
        })
    }

    fn secret(group: &str, key: &str, group_version: &str) -> Secret {
        Secret {
            group: group.into(),
            key: key.into(),
            group_version: group_version.into(),
            ..Default::default()
        }
    }

    /// `pairs` as a map, `{id}` in keys replaced by `id`.
    fn map(pairs: &[(&str, &str)], id: &str) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.replace("{id}", id), (*v).to_owned()))
            .collect()
    }

    /// Flyte's `NewInputPod`: one container, the given annotations.
    fn mk_pod(annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                annotations: Some(map(annotations, "")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "container1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Admits `pod` through the real `secrets` mutator with only `inj` enabled.
    fn admit(inj: Box<dyn SecretInjector>, secrets: &[Secret], pod: Pod) -> Pod {
        crate::secrets::testing::admit(vec![inj], secrets, pod).unwrap()
    }

    /// Runs one injection the way `SecretsMutator` does: inject, then apply the plan.
    fn run(inj: &VaultInjector, s: &Secret, mut pod: Pod) -> Result<Pod, String> {
        let ctx = PodCtx::test(Route::Secrets);
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: s.clone(),
        };
        let mut plan = Edits::default();
        crate::secrets::testing::accept_and_inject(inj, &req, &ctx, &mut pod, &mut plan)
            .map_err(|e| e.to_string())?;
        plan.apply(&mut pod, &[]);
        Ok(pod)
    }

    fn env(name: &str, value: &str) -> EnvVar {
        env_value(name, value)
    }

    // Flyte's expected annotation sets (vault_secret_manager_test.go), `{id}` for the UUID.
    const KV1: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "flyte"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
        (
            "vault.hashicorp.com/agent-inject-template-{id}",
            r#"{{- with secret "foo" -}}{{ .Data.bar }}{{- end -}}"#,
        ),
    ];
    const KV2: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "flyte"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
        (
            "vault.hashicorp.com/agent-inject-template-{id}",
            r#"{{- with secret "foo" -}}{{ .Data.data.bar }}{{- end -}}"#,
        ),
    ];
    const EXTRA: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "flyte"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
        (
            "vault.hashicorp.com/agent-inject-template-{id}",
            r#"{{- with secret "foo" -}}{{ .Data.data.bar }}{{- end -}}"#,
        ),
        ("vault.hashicorp.com/auth-config-type", "gce"),
    ];
    const EXISTING_ROLE: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "my-role"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
        (
            "vault.hashicorp.com/agent-inject-template-{id}",
            r#"{{- with secret "foo" -}}{{ .Data.data.bar }}{{- end -}}"#,
        ),
    ];
    const CONFIG_OVERRIDE: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "flyte"),
        ("vault.hashicorp.com/agent-pre-populate-only", "false"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
        (
            "vault.hashicorp.com/agent-inject-template-{id}",
            r#"{{- with secret "foo" -}}{{ .Data.data.bar }}{{- end -}}"#,
        ),
    ];
    const DB: &[(&str, &str)] = &[
        ("vault.hashicorp.com/agent-inject", "true"),
        (
            "vault.hashicorp.com/secret-volume-path",
            "/etc/flyte/secrets",
        ),
        ("vault.hashicorp.com/role", "flyte"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
        ("vault.hashicorp.com/agent-inject-secret-{id}", "foo"),
        ("vault.hashicorp.com/agent-inject-file-{id}", "foo/bar"),
    ];

    /// Port of Flyte v2's `TestVaultSecretManagerInjector_Inject` (group `foo`, key `bar`).
    /// Flyte extracts its random UUID from the result before comparing; ours is
    /// `vault_id(secret)` (pinned separately below). Flyte's expected spec has
    /// `initContainers: []`, Go's nil-to-empty quirk that JSON omits; ours stays absent.
    #[rstest]
    #[case::kv_v1_group_version_overwrites_config(Some(KvVersion::V2), &[], "kv1", &[], KV1)]
    #[case::kv_v2_group_version_overwrites_config(Some(KvVersion::V1), &[], "kv2", &[], KV2)]
    #[case::extra_annotations_from_config_are_added(
        Some(KvVersion::V2),
        &[("vault.hashicorp.com/auth-config-type", "gce")],
        "",
        &[],
        EXTRA
    )]
    #[case::already_present_annotation_is_not_overwritten(
        Some(KvVersion::V2),
        &[],
        "",
        &[("vault.hashicorp.com/role", "my-role")],
        EXISTING_ROLE
    )]
    #[case::config_annotation_overwrites_system_default_annotation(
        Some(KvVersion::V2),
        &[("vault.hashicorp.com/agent-pre-populate-only", "false")],
        "",
        &[],
        CONFIG_OVERRIDE
    )]
    #[case::db_secret_backend_engine_is_supported(Some(KvVersion::V1), &[], "db", &[], DB)]
    #[case::legacy_config_option_v1_is_still_supported(Some(KvVersion::V1), &[], "", &[], KV1)]
    #[case::legacy_config_option_v2_is_still_supported(Some(KvVersion::V2), &[], "", &[], KV2)]
    fn vault_secret_manager_injector_inject(
        #[case] kv_version: Option<KvVersion>,
        #[case] config_annotations: &[(&str, &str)],
        #[case] group_version: &str,
        #[case] pod_annotations: &[(&str, &str)],
        #[case] expected_annotations: &[(&str, &str)],
    ) {
        let s = secret("foo", "bar", group_version);
        let got = run(
            &injector(kv_version, config_annotations),
            &s,
            mk_pod(pod_annotations),
        )
        .unwrap();
        let expected = Pod {
            metadata: ObjectMeta {
                annotations: Some(map(expected_annotations, &vault_id(&s))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "container1".into(),
                    env: Some(vec![
                        env("FLYTE_SECRETS_FILE_PREFIX", ""),
                        env("FLYTE_SECRETS_DEFAULT_DIR", "/etc/flyte/secrets"),
                    ]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn unset_kv_version_defaults_to_kv2() {
        let s = secret("foo", "bar", "");
        let got = run(&injector(None, &[]), &s, mk_pod(&[])).unwrap();
        assert_eq!(got.metadata.annotations.unwrap(), map(KV2, &vault_id(&s)));
    }

    /// Golden value, checked against an independent Python computation (hashlib + uuid):
    /// changing the derivation changes the annotations of every pod admitted afterwards.
    #[test]
    fn vault_id_is_a_pinned_uuid_v8() {
        let id = vault_id(&secret("foo", "bar", "kv2"));
        assert_eq!(id, "a4d130ea-8c8e-8a96-b85e-19d6a93e8648");
        assert_eq!(&id[14..15], "8", "version nibble");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "variant");
    }

    #[test]
    fn reinjection_changes_nothing() {
        let inj = injector(
            Some(KvVersion::V2),
            &[("vault.hashicorp.com/auth-config-type", "gce")],
        );
        let s = secret("foo", "bar", "kv2");
        let once = run(&inj, &s, mk_pod(&[("team", "ml")])).unwrap();
        let twice = run(&inj, &s, once.clone()).unwrap();
        assert_eq!(twice, once);
        assert_eq!(twice.metadata.annotations, once.metadata.annotations);
        assert_eq!(once.metadata.annotations.unwrap().len(), 9);
    }

    /// Flyte added a fresh UUID triple on every admission. Through the real mutator, admitting
    /// the admitted pod again changes nothing.
    #[test]
    fn readmission_through_the_secrets_mutator_changes_nothing() {
        let secrets = [
            secret("secret/data/db", "password", "kv2"),
            secret("database/creds/ro", "username", "db"),
        ];
        let once = admit(Box::new(injector(None, &[])), &secrets, mk_pod(&[]));
        let twice = admit(Box::new(injector(None, &[])), &secrets, once.clone());
        assert_eq!(twice, once);
        let annotations = once.metadata.annotations.unwrap();
        assert_eq!(annotations.len(), 2 + 4 + 3 + 2, "{annotations:#?}");
    }

    #[rstest]
    #[case::different_key(secret("foo", "baz", "kv2"))]
    #[case::different_group(secret("fo", "bar", "kv2"))]
    #[case::different_group_version(secret("foo", "bar", "kv1"))]
    #[case::fields_shifted_across_the_boundary(secret("foob", "ar", "kv2"))]
    fn two_secrets_get_two_ids(#[case] other: Secret) {
        let inj = injector(Some(KvVersion::V2), &[]);
        let first = secret("foo", "bar", "kv2");
        assert_ne!(vault_id(&first), vault_id(&other));
        let pod = run(&inj, &other, run(&inj, &first, mk_pod(&[])).unwrap()).unwrap();
        let annotations = pod.metadata.annotations.unwrap();
        for s in [&first, &other] {
            let id = vault_id(s);
            assert_eq!(
                annotations[&format!("vault.hashicorp.com/agent-inject-file-{id}")],
                format!("{}/{}", s.group, s.key)
            );
        }
        assert_eq!(annotations.len(), 4 + 3 + 3, "{annotations:#?}");
    }

    #[test]
    fn any_and_file_requests_of_one_secret_share_the_id() {
        let inj = injector(None, &[]);
        let any = secret("foo", "bar", "");
        let file = Secret {
            mount_requirement: MountRequirement::File,
            ..any.clone()
        };
        let once = run(&inj, &any, mk_pod(&[])).unwrap();
        assert_eq!(run(&inj, &file, once.clone()).unwrap(), once);
    }

    #[test]
    fn env_var_mount_is_refused_with_flytes_message() {
        let s = Secret {
            mount_requirement: MountRequirement::EnvVar,
            ..secret("foo", "bar", "kv2")
        };
        let err = run(&injector(None, &[]), &s, mk_pod(&[])).unwrap_err();
        assert_eq!(
            err,
            "Env_Var is not a supported mount requirement for Vault Secret Manager"
        );
    }

    #[test]
    fn unknown_mount_requirement_is_refused() {
        let s = Secret {
            mount_requirement: MountRequirement::Unknown(7),
            ..secret("foo", "bar", "kv2")
        };
        let err = run(&injector(None, &[]), &s, mk_pod(&[])).unwrap_err();
        assert_eq!(err, "unrecognized mount requirement [7]");
    }

    #[rstest]
    #[case::no_group(secret("", "bar", ""), "group is empty")]
    #[case::no_key(secret("foo", "", ""), "key is empty")]
    #[case::neither(secret("", "", ""), "group and key is empty")]
    fn missing_group_or_key_is_refused(#[case] s: Secret, #[case] says: &str) {
        let pod = mk_pod(&[]);
        let mut changed = pod.clone();
        let mut plan = Edits::default();
        let ctx = PodCtx::test(Route::Secrets);
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: s,
        };
        let err = crate::secrets::testing::accept_and_inject(
            &injector(None, &[]),
            &req,
            &ctx,
            &mut changed,
            &mut plan,
        )
        .unwrap_err();
        assert!(matches!(err, Refusal::MissingField(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.starts_with("vault secrets webhook requires"), "{err}");
        assert!(err.contains(says), "{err}");
        assert_eq!(changed, pod, "a refused request leaves the pod alone");
        assert_eq!(plan, Edits::default());
    }

    fn is_dns1123_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    /// The id recomputed from its definition, without `identity_digest` or `vault_id`: SHA-256
    /// of the domain `podmutator.io/vault`, then group, key and group_version, each preceded by
    /// its length as 8 big-endian bytes; the first 16 bytes, version nibble 8 (RFC 9562 §5.8),
    /// variant bits 10; lower-case hex grouped 8-4-4-4-12.
    fn uuid_v8_by_definition(group: &str, key: &str, group_version: &str) -> String {
        let mut input = Vec::new();
        for field in ["podmutator.io/vault", group, key, group_version] {
            input.extend_from_slice(&(field.len() as u64).to_be_bytes());
            input.extend_from_slice(field.as_bytes());
        }
        let digest = sha2::Sha256::digest(&input);
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        bytes[6] = 0x80 | (bytes[6] & 0x0f);
        bytes[8] = 0x80 | (bytes[8] & 0x3f);
        let mut out = String::new();
        for (i, b) in bytes.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out.push('-');
            }
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    #[test]
    fn the_definition_gives_the_golden_id() {
        // Pins the test's own derivation to the Python-checked golden value above.
        assert_eq!(
            uuid_v8_by_definition("foo", "bar", "kv2"),
            "a4d130ea-8c8e-8a96-b85e-19d6a93e8648"
        );
    }

    /// Flyte's form for a key that is a chain of Go identifiers (byte-identical to Flyte's,
    /// nested lookups included); an index with a quoted literal for any other accepted key.
    #[rstest]
    #[case::field("bar", r#"{{- with secret "foo" -}}{{ .Data.data.bar }}{{- end -}}"#)]
    #[case::nested_field_as_in_flyte(
        "config.password",
        r#"{{- with secret "foo" -}}{{ .Data.data.config.password }}{{- end -}}"#
    )]
    #[case::dash(
        "api-token",
        r#"{{- with secret "foo" -}}{{ index .Data.data "api-token" }}{{- end -}}"#
    )]
    #[case::leading_digit(
        "1st",
        r#"{{- with secret "foo" -}}{{ index .Data.data "1st" }}{{- end -}}"#
    )]
    #[case::slash(
        "a/b",
        r#"{{- with secret "foo" -}}{{ index .Data.data "a/b" }}{{- end -}}"#
    )]
    fn the_template_indexes_the_key_as_flyte_does_or_as_a_quoted_literal(
        #[case] key: &str,
        #[case] expected: &str,
    ) {
        let s = secret("foo", key, "kv2");
        let got = run(&injector(None, &[]), &s, mk_pod(&[])).unwrap();
        let annotations = got.metadata.annotations.unwrap();
        assert_eq!(
            annotations[&format!("vault.hashicorp.com/agent-inject-template-{}", vault_id(&s))],
            expected
        );
    }

    /// Names that would add an action to the template or move the file are refused, naming
    /// the field and the rule, and the pod is left alone.
    #[rstest]
    #[case::template_injection_in_the_key(
        "secret/data/team",
        r#"k }}{{ with secret "secret/data/other-team/db" }}{{ .Data.data.password }}{{ end }}{{ .x"#,
        "key"
    )]
    #[case::quote_in_the_group(r#"a" -}}{{ with secret "b"#, "k", "group")]
    #[case::group_climbing_out_of_the_secrets_dir("../../../tmp/x", "k", "group")]
    #[case::key_climbing_out_of_the_secrets_dir("secret/a", "../../x", "key")]
    #[case::absolute_group("/etc", "k", "group")]
    #[case::empty_part("a//b", "k", "group")]
    #[case::newline("a", "k\n", "key")]
    fn names_that_change_the_template_or_the_path_are_refused(
        #[case] group: &str,
        #[case] key: &str,
        #[case] field: &str,
    ) {
        let s = secret(group, key, "kv2");
        let pod = mk_pod(&[]);
        let mut changed = pod.clone();
        let req = SecretRequest {
            index: 0,
            annotation: "flyte.secrets/s0".into(),
            secret: s,
        };
        let err = crate::secrets::testing::accept_and_inject(
            &injector(None, &[]),
            &req,
            &PodCtx::test(Route::Secrets),
            &mut changed,
            &mut Edits::default(),
        )
        .unwrap_err();
        let Refusal::BadSecretName { field: f, rule, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*f, field);
        assert_eq!(*rule, crate::secrets::names::FLYTE_PATH_RULE);
        assert!(err.to_string().contains("rename the secret"), "{err}");
        assert_eq!(changed, pod);
    }

    /// One token of a template action, as Go's `text/template` lexer reads it.
    #[derive(Debug, PartialEq)]
    enum Tok {
        Word(String),
        Str(String),
    }

    /// Reads `t` as Go's `text/template` does with the default delimiters, independently of
    /// `template`: the text between actions, and each action's tokens (trim markers dropped,
    /// string literals decoded). `None` when an action or a literal does not close.
    fn parse_template(t: &str) -> Option<(Vec<String>, Vec<Vec<Tok>>)> {
        let mut texts = Vec::new();
        let mut actions = Vec::new();
        let mut rest = t;
        loop {
            let Some(open) = rest.find("{{") else {
                texts.push(rest.to_owned());
                return Some((texts, actions));
            };
            texts.push(rest[..open].to_owned());
            let mut chars = rest[open + 2..].char_indices().peekable();
            let body_start = open + 2;
            let mut toks = Vec::new();
            let mut word = String::new();
            let end;
            loop {
                let (i, c) = chars.next()?;
                match c {
                    '}' if rest[body_start + i..].starts_with("}}") => {
                        end = body_start + i + 2;
                        break;
                    }
                    '"' => {
                        let mut lit = String::new();
                        loop {
                            let (_, c) = chars.next()?;
                            match c {
                                '"' => break,
                                '\\' => {
                                    let (_, e) = chars.next()?;
                                    match e {
                                        '"' => lit.push('"'),
                                        '\\' => lit.push('\\'),
                                        'u' | 'U' => {
                                            let n = if e == 'u' { 4 } else { 8 };
                                            let hex: String = (0..n)
                                                .map(|_| chars.next().map(|x| x.1))
                                                .collect::<Option<_>>()?;
                                            lit.push(char::from_u32(
                                                u32::from_str_radix(&hex, 16).ok()?,
                                            )?);
                                        }
                                        _ => return None,
                                    }
                                }
                                '\n' => return None,
                                c => lit.push(c),
                            }
                        }
                        toks.push(Tok::Str(lit));
                    }
                    c if c.is_whitespace() => {
                        if !word.is_empty() {
                            toks.push(Tok::Word(std::mem::take(&mut word)));
                        }
                    }
                    c => word.push(c),
                }
            }
            if !word.is_empty() {
                toks.push(Tok::Word(word));
            }
            // Trim markers: `{{- ` and ` -}}`.
            if toks.first() == Some(&Tok::Word("-".into())) {
                toks.remove(0);
            }
            if toks.last() == Some(&Tok::Word("-".into())) {
                toks.pop();
            }
            actions.push(toks);
            rest = &rest[end..];
        }
    }

    /// What the key's action must look up: the key as field lookups (Flyte's form) or as one
    /// index.
    fn looks_up(action: &[Tok], query: &str, key: &str) -> bool {
        match action {
            [Tok::Word(field)] => {
                field.strip_prefix(query).and_then(|f| f.strip_prefix('.')) == Some(key)
            }
            [Tok::Word(index), Tok::Word(q), Tok::Str(k)] => {
                index == "index" && q == query && k == key
            }
            _ => false,
        }
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            // Flyte's alphabet, slashes and dots often.
            "[a-zA-Z0-9_/.-]{1,12}",
            // What a template or a path would be attacked with.
            "[a-z./{}\" -]{1,16}",
            ".*",
        ]
    }

    proptest! {
        /// Whatever the names, the template has three actions: `with secret <group>`, one
        /// lookup of the key, `end`; and nothing around them.
        #[test]
        fn no_name_changes_the_templates_structure(group in name(), key in name(), kv1 in any::<bool>()) {
            let query = if kv1 { ".Data" } else { ".Data.data" };
            let t = template(query, &group, &key);
            let (texts, actions) = parse_template(&t).expect("the template closes");
            prop_assert!(texts.iter().all(String::is_empty), "{t}");
            prop_assert_eq!(actions.len(), 3, "{}", t);
            prop_assert_eq!(
                &actions[0],
                &vec![Tok::Word("with".into()), Tok::Word("secret".into()), Tok::Str(group.clone())]
            );
            prop_assert!(looks_up(&actions[1], query, &key), "{t}");
            prop_assert_eq!(&actions[2], &vec![Tok::Word("end".into())]);
        }

        /// Every name the manager accepts gives a file inside `/etc/flyte/secrets` at the very
        /// path `<group>/<key>` (no part that cleaning would rewrite), and Flyte's template;
        /// every other name is refused before the pod changes.
        #[test]
        fn vault_accepts_only_names_whose_file_stays_inside_the_secrets_dir(group in name(), key in name()) {
            let s = secret(&group, &key, "kv2");
            let pod = mk_pod(&[]);
            match run(&injector(None, &[]), &s, pod.clone()) {
                Err(e) => prop_assert!(
                    e.contains("cannot be used: it must be")
                        || e.starts_with("vault secrets webhook requires both key and group"),
                    "{e}"
                ),
                Ok(got) => {
                    let annotations = got.metadata.annotations.unwrap();
                    let id = vault_id(&s);
                    let file = &annotations[&format!("vault.hashicorp.com/agent-inject-file-{id}")];
                    let joined = format!("{SECRETS_DIR}/{file}");
                    let mut parts: Vec<&str> = Vec::new();
                    for p in joined.split('/').skip(1) {
                        prop_assert!(!matches!(p, "" | "." | ".."), "{joined}");
                        parts.push(p);
                    }
                    prop_assert!(joined.starts_with("/etc/flyte/secrets/"));
                    prop_assert!(parts.len() >= 5, "{joined}");
                    let t = &annotations[&format!("vault.hashicorp.com/agent-inject-template-{id}")];
                    prop_assert_eq!(t, &template(".Data.data", &group, &key));
                }
            }
        }
    }

    fn field() -> impl Strategy<Value = String> {
        // Short strings from a small alphabet, so two draws often share prefixes and contents.
        prop_oneof![Just(String::new()), "[a-c/:\\x00]{0,4}", ".*"]
    }

    proptest! {
        #[test]
        fn vault_id_is_the_uuid_v8_of_its_fields_and_differs_when_they_do(
            a in (field(), field(), field()),
            b in (field(), field(), field()),
        ) {
            let (sa, sb) = (secret(&a.0, &a.1, &a.2), secret(&b.0, &b.1, &b.2));
            let (ia, ib) = (vault_id(&sa), vault_id(&sb));
            prop_assert_eq!(&ia, &uuid_v8_by_definition(&a.0, &a.1, &a.2));
            prop_assert_eq!(&ib, &uuid_v8_by_definition(&b.0, &b.1, &b.2));
            prop_assert_eq!(ia == ib, a == b, "{:?} -> {}, {:?} -> {}", a, ia, b, ib);
            // The mount requirement and env_var are not part of the id.
            let file = Secret { mount_requirement: MountRequirement::File, env_var: "X".into(), ..sa.clone() };
            prop_assert_eq!(vault_id(&file), ia);
        }

        #[test]
        fn vault_id_is_a_stable_label_and_annotation_names_fit(
            group in ".*", key in ".*", gv in prop_oneof![Just(String::new()), Just("kv1".to_owned()), Just("db".to_owned()), ".*"],
        ) {
            let s = secret(&group, &key, &gv);
            let id = vault_id(&s);
            prop_assert!(is_dns1123_label(&id), "{id}");
            prop_assert_eq!(&id, &uuid_v8_by_definition(&group, &key, &gv));
            let inj = injector(None, &[]);
            for k in inj.secret_annotations(&s).keys() {
                let name = k.strip_prefix(VAULT_ANNOTATION_PREFIX).unwrap();
                prop_assert!(name.len() <= MAX_ANNOTATION_NAME, "{name}");
                prop_assert!(is_dns1123_label(name), "{name}");
            }
        }
    }
}
