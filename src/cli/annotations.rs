//! `secret-annotations`: Flyte's `flyte.secrets/s<N>` annotations from a JSON list of secrets,
//! and back.

/// A secret request as JSON, the way Flyte's `flyteidl.core.Secret` names its fields.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SecretJson {
    #[serde(skip_serializing_if = "String::is_empty")]
    group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    group_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    key: String,
    mount_requirement: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    env_var: String,
}

/// What `secret-annotations` could not read or encode.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationsError {
    #[error("--decode: expected a JSON object of annotations")]
    DecodeInput(#[source] serde_json::Error),
    #[error("expected a JSON array of secrets")]
    EncodeInput(#[source] serde_json::Error),
    #[error(transparent)]
    Annotation(#[from] podmutator_core::secrets::codec::AnnotationError),
    #[error(transparent)]
    Codec(#[from] podmutator_core::secrets::codec::CodecError),
    #[error("secret {index}: mount_requirement {value:?}: use ANY, ENV_VAR or FILE")]
    MountRequirement { index: usize, value: String },
    #[error("cannot write the output")]
    Output(#[source] serde_json::Error),
}

/// `secret-annotations JSON` encodes; `secret-annotations --decode JSON` decodes.
pub fn secret_annotations(decode: bool, json: &str) -> Result<String, AnnotationsError> {
    use podmutator_core::secrets::codec::{self, MountRequirement, Secret};
    if decode {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_str(json).map_err(AnnotationsError::DecodeInput)?;
        let out: Vec<SecretJson> = codec::decode_annotations(&map)?
            .into_iter()
            .map(|d| SecretJson {
                group: d.secret.group,
                group_version: d.secret.group_version,
                key: d.secret.key,
                mount_requirement: podmutator_core::secrets::mount_name(d.secret.mount_requirement),
                env_var: d.secret.env_var,
            })
            .collect();
        return serde_json::to_string_pretty(&out).map_err(AnnotationsError::Output);
    }
    let list: Vec<SecretJson> =
        serde_json::from_str(json).map_err(AnnotationsError::EncodeInput)?;
    let secrets = list
        .into_iter()
        .enumerate()
        .map(|(index, s)| {
            let mount_requirement = match s.mount_requirement.as_str() {
                "" | "ANY" => MountRequirement::Any,
                "ENV_VAR" => MountRequirement::EnvVar,
                "FILE" => MountRequirement::File,
                other => {
                    return Err(AnnotationsError::MountRequirement {
                        index,
                        value: other.to_owned(),
                    });
                }
            };
            Ok(Secret {
                group: s.group,
                group_version: s.group_version,
                key: s.key,
                mount_requirement,
                env_var: s.env_var,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let map = codec::encode_annotations(&secrets)?;
    serde_json::to_string_pretty(&map).map_err(AnnotationsError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_annotations_round_trip_through_the_cli() {
        let json = r#"[{"group": "user-info", "key": "user_secret", "mount_requirement": "ENV_VAR"}, {"key": "openai_key", "env_var": "OPENAI_API_KEY"}]"#;
        let out = secret_annotations(false, json).unwrap();
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        // The spec's vectors (flyte-webhook-spec.md §1.2).
        assert_eq!(
            map["flyte.secrets/s0"],
            "m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk"
        );
        assert_eq!(
            map["flyte.secrets/s1"],
            "nnsxsoraejxxazlomfuv512fperauzloozpxmylshiqcet1qivhecsk6ifiesx1livmsecq"
        );
        let back = secret_annotations(true, &out).unwrap();
        let back: serde_json::Value = serde_json::from_str(&back).unwrap();
        assert_eq!(back[0]["group"], "user-info");
        assert_eq!(back[0]["mount_requirement"], "ENV_VAR");
        assert_eq!(back[1]["env_var"], "OPENAI_API_KEY");
        assert_eq!(back[1]["mount_requirement"], "ANY");
    }

    #[test]
    fn secret_annotations_name_what_is_wrong() {
        let err = secret_annotations(false, r#"[{"key": "k", "mount_requirement": "DISK"}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secret 0: mount_requirement \"DISK\""),
            "{err}"
        );
        let err = secret_annotations(true, r#"{"flyte.secrets/s0": "9"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("flyte.secrets/s0"), "{err}");
    }
}
