//! Flyte's own configuration, read the way Flyte reads it.
//!
//! `--flyte-config` takes flytepropeller's files, or the ConfigMap object that holds them
//! (`kubectl get cm flyte-propeller-config -o yaml`), and keeps their `webhook` and `secrets`
//! sections. Those two sections, from any source, are decoded with the leniencies of Flyte's
//! loader (flytestdlib's viper and mapstructure), so that a file Flyte 1.x, flyte-binary or
//! Union's dataplane chart renders loads unchanged:
//! - key names match without regard to case (`Webhook:`, `CertDir:`);
//! - a quoted number or boolean is read as one (`listenPort: '9443'`, which Union's chart
//!   writes; `localCert: "true"`), and where text is expected a number as its text and a
//!   boolean as `1` or `0` ([`text_where_expected`]), a map of the user's text included
//!   (`annotations: {vault.hashicorp.com/agent-run-as-user: 1000}`);
//! - a comma-separated string is a list (`secretManagerTypes: "K8s,AWS"`);
//! - `null` is unset (Flyte's generated configuration writes `annotations: null`);
//! - the keys of [`SKIPPED_KEYS`], which Flyte-family charts write for their own images, are
//!   skipped with a warning.
//!
//! Flyte also drops keys it does not know; we refuse them, naming the nearest known key, so a
//! misspelt `secretManagerTyps` is not silently ignored.

use serde_json::{Map, Value};

use super::{Config, ConfigError, nearest, parse_document, parse_documents};

/// The sections of a Flyte configuration podmutator reads: Flyte's webhook and its `secrets`
/// (the Global manager's).
pub const READ_SECTIONS: [&str; 2] = ["webhook", "secrets"];

/// Keys of the read sections that Flyte-family configurations carry and podmutator skips, each
/// with the reason the warning gives.
pub const SKIPPED_KEYS: [(&str, &str); 2] = [
    (
        "webhook.embeddedSecretManagerConfig.enabled",
        "Union's fork read it in 2024 and dropped it (its docs still show it); the Embedded manager is on when webhook.secretManagerTypes lists Embedded",
    ),
    (
        "webhook.embeddedSecretManagerConfig.clusterName",
        "Union's dataplane chart writes it for its own image; podmutator binds a pod's secrets with embedded.organization and the project and domain labels",
    ),
];

/// Top-level names of Flyte's configuration that are one or two letters from a read section
/// and are real sections of their own: Flyte 2's secret service (`secret:`).
const NOT_MISSPELT: [&str; 1] = ["secret"];

/// The documents `text` holds: the Flyte file itself, or, for a ConfigMap object (YAML or
/// JSON, `kind: ConfigMap`), each of its `data` entries named `*.yaml`, `*.yml` or `*.json`, in
/// name order, as the mounted ConfigMap's files are read. A YAML stream (`---` between
/// documents, as `helm template` prints) and a `kind: List` (as `kubectl get cm -o yaml`
/// prints) are read object by object, their other Kubernetes objects and ConfigMaps without
/// such entries skipped. Each comes with the name errors give.
pub fn documents(path: &str, text: &str) -> Result<Vec<(String, Value)>, ConfigError> {
    let kind = |v: &Value| v.get("kind").and_then(Value::as_str).map(str::to_owned);
    let mut objects = Vec::new();
    for doc in parse_documents(text).map_err(|e| ConfigError::new(path, e))? {
        match (kind(&doc).as_deref(), doc) {
            (Some("List"), Value::Object(mut list)) => match list.remove("items") {
                Some(Value::Array(items)) => objects.extend(items),
                _ => bail!(format!("{path}: items"), "a List with no items"),
            },
            (_, doc) => objects.push(doc),
        }
    }
    let several = objects.len() > 1;
    let mut out = Vec::new();
    for doc in objects {
        match kind(&doc).as_deref() {
            Some("ConfigMap") => out.extend(configmap_files(path, &doc, several)?),
            // Another Kubernetes object of the stream.
            Some(_) if several && doc.get("apiVersion").is_some() => {}
            _ => out.push((path.to_owned(), doc)),
        }
    }
    Ok(out)
}

/// A ConfigMap's Flyte files ([`documents`]); none is an error unless it is one of `several`.
fn configmap_files(
    path: &str,
    doc: &Value,
    several: bool,
) -> Result<Vec<(String, Value)>, ConfigError> {
    let mut files: Vec<(&String, &Value)> = doc
        .get("data")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| [".yaml", ".yml", ".json"].iter().any(|e| k.ends_with(e)))
        .collect();
    files.sort_by_key(|(k, _)| *k);
    ensure!(
        several || !files.is_empty(),
        format!("{path}: data"),
        "the ConfigMap holds no *.yaml, *.yml or *.json entry: give the ConfigMap that holds Flyte's configuration files (flytepropeller's, flyte-binary's or the webhook's)"
    );
    files
        .into_iter()
        .map(|(name, text)| {
            let at = format!("{path}: data.{name}");
            let text = text.as_str().ok_or_else(|| {
                ConfigError::new(
                    &at,
                    "expected the file's text (a string), as a ConfigMap holds it",
                )
            })?;
            let doc = parse_document(text).map_err(|e| ConfigError::new(&at, e))?;
            Ok((at, doc))
        })
        .collect()
}

/// A Flyte document's `webhook` and `secrets` (names matched without regard to case); every
/// other section is skipped, as Flyte skips the sections it does not read, except a name one
/// or two letters from a read section (`webhok`) and podmutator's own sections (`http`,
/// `embedded`, ...), which belong in `--config`.
pub fn sections(path: &str, doc: Value) -> Result<(Value, Vec<String>), ConfigError> {
    let Value::Object(sections) = doc else {
        bail!(
            path,
            "expected a Flyte configuration: a mapping of sections such as webhook, secrets, propeller"
        );
    };
    let ours = own_sections();
    let mut out = Value::Object(Map::new());
    let mut skipped = Vec::new();
    for (key, value) in sections {
        if let Some(read) = READ_SECTIONS.iter().find(|s| s.eq_ignore_ascii_case(&key)) {
            let section = Value::Object(Map::from_iter([(read.to_string(), value)]));
            super::merge(&mut out, section);
        } else if ours.iter().any(|s| s.eq_ignore_ascii_case(&key)) {
            bail!(
                format!("{path}: {key}"),
                "podmutator's own section: it belongs in --config; --flyte-config reads webhook and secrets"
            );
        } else if let Some(near) = nearest(&key, READ_SECTIONS)
            && !NOT_MISSPELT.contains(&key.to_ascii_lowercase().as_str())
        {
            bail!(
                format!("{path}: {key}"),
                "not a section podmutator reads: did you mean `{near}`? --flyte-config reads webhook and secrets, and skips Flyte's other sections"
            );
        } else {
            skipped.push(key);
        }
    }
    Ok((out, skipped))
}

/// The top-level sections of podmutator's configuration, Flyte's read ones among them (which
/// [`sections`] matches first).
fn own_sections() -> Vec<String> {
    let config = serde_json::to_value(Config::default()).unwrap_or_default();
    config
        .as_object()
        .map_or_else(Vec::new, |m| m.keys().cloned().collect())
}

/// For a key whose default is unset, so that the default does not show its type, a value of
/// that type: what a quoted value of theirs is read as.
fn unset_scalar(path: &str) -> Value {
    match path {
        "webhook.localCert" => Value::Bool(false),
        "webhook.metricsPort" => Value::from(0),
        _ => Value::Null,
    }
}

/// Decodes the read sections of a whole configuration in place with Flyte's leniencies (the
/// module's documentation): returns the keys skipped, whose warnings are added to `warnings`.
pub fn decode(config: &mut Value, warnings: &mut Vec<String>) -> Vec<String> {
    let reference = canonical_keys(config);
    let Value::Object(root) = config else {
        return Vec::new();
    };
    // A section with nothing under it (`webhook:`, its keys commented out) is unset.
    root.retain(|_, v| !v.is_null());
    let mut skipped = Vec::new();
    for section in READ_SECTIONS {
        if let Some(v) = root.get_mut(section) {
            decode_at(v, &reference[section], section, warnings, &mut skipped);
        }
    }
    skipped
}

/// Renames the keys of the read sections of `config` that match ours without regard to case to
/// ours, as Flyte's loader matches them. Done to each source before they are merged, so that a
/// key one file writes `CertDir` and another `certDir` is one key, the later one's. Returns the
/// default configuration as JSON, the names' reference.
pub fn canonical_keys(config: &mut Value) -> Value {
    fn rename_at(v: &mut Value, reference: &Value, path: &str) {
        let Value::Object(map) = v else {
            return;
        };
        let Value::Object(known) = reference else {
            // A map of the user's keys keeps them; a Kubernetes type's field names match
            // without regard to case.
            rename_kubernetes_fields(map, path);
            return;
        };
        rename_keys(map, known.keys().map(String::as_str));
        for (key, child) in map.iter_mut() {
            let reference = known.get(key).unwrap_or(&Value::Null);
            rename_at(child, reference, &format!("{path}.{key}"));
        }
    }
    let reference = serde_json::to_value(Config::default()).unwrap_or(Value::Null);
    if let Value::Object(root) = config {
        rename_keys(root, READ_SECTIONS.iter().copied());
        for section in READ_SECTIONS {
            if let Some(v) = root.get_mut(section) {
                rename_at(v, &reference[section], section);
            }
        }
    }
    reference
}

/// Renames each key of `map` that matches one of `known` without regard to case, unless the
/// exact key is there too.
fn rename_keys<'a>(map: &mut Map<String, Value>, known: impl Iterator<Item = &'a str> + Clone) {
    let renames: Vec<(String, &str)> = map
        .keys()
        .filter(|k| !known.clone().any(|n| n == k.as_str()))
        .filter_map(|k| {
            let n = known.clone().find(|n| n.eq_ignore_ascii_case(k))?;
            (!map.contains_key(n)).then(|| (k.clone(), n))
        })
        .collect();
    for (from, to) in renames {
        if let Some(v) = map.remove(&from) {
            map.insert(to.to_owned(), v);
        }
    }
}

/// Renames the field names of the Kubernetes types the read sections hold (a `resources` value,
/// a label selector) as Flyte's loader matches them: where the default is unset, it shows no
/// names to match against.
fn rename_kubernetes_fields(map: &mut Map<String, Value>, path: &str) {
    if path.ends_with(".resources") {
        rename_keys(map, ["claims", "limits", "requests"].into_iter());
    } else if path.ends_with("Selector") {
        rename_keys(map, ["matchExpressions", "matchLabels"].into_iter());
        if let Some(Value::Array(items)) = map.get_mut("matchExpressions") {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                rename_keys(item, ["key", "operator", "values"].into_iter());
            }
        }
    }
}

fn decode_at(
    v: &mut Value,
    reference: &Value,
    path: &str,
    warnings: &mut Vec<String>,
    skipped: &mut Vec<String>,
) {
    let unset = unset_scalar(path);
    let reference = if reference.is_null() {
        &unset
    } else {
        reference
    };
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            let Value::Object(known) = reference else {
                // A map of the user's keys, or a Kubernetes type: only `null` is Flyte's.
                map.values_mut().for_each(super::drop_nulls);
                return;
            };
            for (key, why) in SKIPPED_KEYS {
                let Some(name) = key.strip_prefix(path).and_then(|k| k.strip_prefix('.')) else {
                    continue;
                };
                if !name.contains('.') && map.remove(name).is_some() {
                    warnings.push(format!("{key} is skipped: {why}"));
                    skipped.push(key.to_owned());
                }
            }
            for (key, child) in map.iter_mut() {
                decode_at(
                    child,
                    known.get(key).unwrap_or(&Value::Null),
                    &format!("{path}.{key}"),
                    warnings,
                    skipped,
                );
            }
        }
        Value::Array(items) => items.iter_mut().for_each(super::drop_nulls),
        Value::String(s) => {
            let parsed = match reference {
                Value::Bool(_) => go_bool(s).map(Value::Bool),
                Value::Number(_) => s.trim().parse().ok().map(Value::Number),
                // viper's string-to-slice hook: "K8s,AWS" is a list.
                Value::Array(_) => Some(
                    s.split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(Value::from)
                        .collect(),
                ),
                _ => None,
            };
            // Text that is not what the key takes stays text, for the error to name it.
            if let Some(parsed) = parsed {
                *v = parsed;
            }
        }
        // mapstructure's weak decoding: a number where a boolean goes is whether it is not 0.
        Value::Number(n) if reference.is_boolean() => *v = Value::Bool(n.as_f64() != Some(0.0)),
        _ => {}
    }
}

/// mapstructure's weak decoding where text is expected (a name, an image, an annotation's or a
/// label's value): a number is its text, a boolean `1` or `0`. Given a failed decode of the
/// whole configuration, turns the value in a read section that it failed on into that text and
/// says whether it did, so that the decode is tried again; each try turns one more value.
pub fn text_where_expected(
    config: &mut Value,
    failed: &serde_path_to_error::Error<serde_json::Error>,
) -> bool {
    use serde_path_to_error::Segment;
    let message = failed.inner().to_string();
    if !(message.starts_with("invalid type: ") && message.ends_with(", expected a string")) {
        return false;
    }
    let mut segments = failed.path().iter();
    let Some(Segment::Map { key }) = segments.next() else {
        return false;
    };
    if !READ_SECTIONS.contains(&key.as_str()) {
        return false;
    }
    let at = segments.try_fold(&mut config[key.as_str()], |at, segment| match segment {
        Segment::Map { key } => at.get_mut(key.as_str()),
        Segment::Seq { index } => at.get_mut(index),
        _ => None,
    });
    let Some(at) = at else { return false };
    let text = match at {
        Value::Bool(b) => if *b { "1" } else { "0" }.to_owned(),
        Value::Number(n) if n.is_f64() => {
            n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string())
        }
        Value::Number(n) => n.to_string(),
        _ => return false,
    };
    *at = Value::String(text);
    true
}

/// Go's `strconv.ParseBool`, which mapstructure's weak decoding uses.
fn go_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(v: Value) -> (Value, Vec<String>) {
        let mut v = v;
        let mut warnings = Vec::new();
        let skipped = decode(&mut v, &mut warnings);
        assert_eq!(
            skipped.len(),
            warnings.iter().filter(|w| w.contains("is skipped")).count()
        );
        (v, warnings)
    }

    #[test]
    fn quoted_numbers_and_booleans_are_read_as_flyte_reads_them() {
        let (v, _) = decoded(json!({"webhook": {
            "listenPort": "9443", "servicePort": " 443", "localCert": "true",
            "metricsPort": "9090", "disableCreateMutatingWebhookConfig": "T",
            "kubeClientConfig": {"qps": "50", "timeout": 30},
        }}));
        let w = &v["webhook"];
        assert_eq!(w["listenPort"], 9443);
        assert_eq!(w["servicePort"], 443);
        assert_eq!(w["localCert"], true);
        assert_eq!(w["metricsPort"], 9090);
        assert_eq!(w["disableCreateMutatingWebhookConfig"], true);
        assert_eq!(w["kubeClientConfig"]["qps"], 50);
        let (v, _) =
            decoded(json!({"webhook": {"localCert": 1, "disableCreateMutatingWebhookConfig": 0}}));
        assert_eq!(v["webhook"]["localCert"], true);
        assert_eq!(v["webhook"]["disableCreateMutatingWebhookConfig"], false);
    }

    #[test]
    fn text_that_is_not_a_number_stays_text_for_the_error() {
        let (v, _) = decoded(json!({"webhook": {"listenPort": "x", "localCert": "yes"}}));
        assert_eq!(v["webhook"]["listenPort"], "x");
        assert_eq!(v["webhook"]["localCert"], "yes");
    }

    #[test]
    fn keys_match_without_regard_to_case_and_the_exact_key_wins() {
        let (v, _) = decoded(json!({"Webhook": {"CertDir": "/a", "LISTENPORT": 1,
            "vaultSecretManager": {"Role": "r", "annotations": {"Keep-Case": "x"}}}}));
        assert_eq!(v["webhook"]["certDir"], "/a");
        assert_eq!(v["webhook"]["listenPort"], 1);
        assert_eq!(v["webhook"]["vaultSecretManager"]["role"], "r");
        // The user's own keys are not ours to rename.
        assert_eq!(
            v["webhook"]["vaultSecretManager"]["annotations"]["Keep-Case"],
            "x"
        );
        let (v, _) = decoded(json!({"webhook": {"certDir": "/exact", "CertDir": "/other"}}));
        assert_eq!(v["webhook"]["certDir"], "/exact");
        assert_eq!(v["webhook"]["CertDir"], "/other");
    }

    #[test]
    fn kubernetes_field_names_match_without_regard_to_case_where_the_default_is_unset() {
        let (v, _) = decoded(json!({"webhook": {
            "awsSecretManager": {"Resources": {"Limits": {"cpu": "1"}, "REQUESTS": {"cpu": "1"}}},
            "imageBuilderConfig": {"LabelSelector": {"MatchLabels": {"Team": "a"},
                "matchexpressions": [{"Key": "k", "Operator": "In", "Values": ["v"]}]}},
        }}));
        assert_eq!(
            v["webhook"]["awsSecretManager"]["resources"],
            json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}})
        );
        // The label's own key keeps its case.
        assert_eq!(
            v["webhook"]["imageBuilderConfig"]["labelSelector"],
            json!({"matchLabels": {"Team": "a"},
                "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]})
        );
        let config = crate::config::Config::from_value(json!({"webhook": {
            "secretManagerTypes": ["AWS"],
            "awsSecretManager": {"resources": {"Limits": {"cpu": "300m"}}},
        }}));
        assert!(config.is_ok(), "{config:?}");
    }

    /// A key each source writes in its own case is one key, the later source's value (a Flyte
    /// file's `SecretManagerTypes` under an overlay's `secretManagerTypes`).
    #[test]
    fn a_key_two_sources_write_in_different_cases_is_one_key() {
        let flyte = [
            (
                "000.yaml",
                "Webhook:\n  SecretManagerTypes: [K8s]\n  CertDir: /a\n",
            ),
            ("100.yaml", "webhook:\n  certdir: /b\n"),
        ];
        let file = (
            "podmutator.yaml",
            "webhook:\n  secretManagerTypes: [Vault]\n",
        );
        let loaded = Config::load_with_flyte(&flyte, Some(file), None).unwrap();
        let w = &loaded.config.webhook;
        assert_eq!(
            w.secret_manager_types,
            [crate::config::SecretManagerType::Vault]
        );
        assert_eq!(w.cert_dir, "/b");
        let inline = (
            "PODMUTATOR_CONFIG",
            r#"{"Webhook": {"SECRETMANAGERTYPES": ["K8s"]}}"#,
        );
        let loaded = Config::load_with_flyte(&flyte, Some(file), Some(inline)).unwrap();
        let types = &loaded.config.webhook.secret_manager_types;
        assert_eq!(types, &[crate::config::SecretManagerType::K8s]);
    }

    /// Among several sources, an error names the last that sets its key.
    #[test]
    fn an_error_names_the_source_that_set_its_key() {
        let flyte = [
            ("000-core.yaml", "webhook:\n  listenPort: 1\n"),
            ("100-webhook.yaml", "webhook:\n  secretManagerTyp: AWS\n"),
        ];
        let err = Config::load_with_flyte(&flyte, None, None).unwrap_err();
        assert_eq!(err.key, "webhook.secretManagerTyp");
        assert!(err.message.ends_with(" (set in 100-webhook.yaml)"), "{err}");
        let file = ("podmutator.yaml", "webhook:\n  listenPort: 0\n");
        let err = Config::load_with_flyte(&flyte[..1], Some(file), None).unwrap_err();
        assert_eq!(err.key, "webhook.listenPort");
        assert!(err.message.ends_with(" (set in podmutator.yaml)"), "{err}");
        // One source: nothing to tell apart.
        let err = Config::load(Some(file), None).unwrap_err();
        assert!(!err.message.contains("(set in"), "{err}");
    }

    /// A section whose keys are all commented out is `null`: unset, as an empty one.
    #[test]
    fn a_section_with_nothing_under_it_is_unset() {
        let flyte = [("f.yaml", "webhook:\n  # listenPort: 1\nsecrets:\n")];
        let loaded = Config::load_with_flyte(&flyte, Some(("c.yaml", "mesh:\n")), None).unwrap();
        assert_eq!(loaded.config, Config::default());
    }

    #[test]
    fn a_comma_separated_string_is_a_list() {
        let (v, _) = decoded(json!({"webhook": {"secretManagerTypes": "K8s, AWS"}}));
        assert_eq!(v["webhook"]["secretManagerTypes"], json!(["K8s", "AWS"]));
    }

    #[test]
    fn the_keys_unions_charts_write_are_skipped_with_a_warning() {
        let (v, warnings) = decoded(json!({"webhook": {"embeddedSecretManagerConfig": {
            "enabled": true, "clusterName": "c", "type": "AWS"}}}));
        let e = &v["webhook"]["embeddedSecretManagerConfig"];
        assert_eq!(e, &json!({"type": "AWS"}));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("embeddedSecretManagerConfig.enabled is skipped"));
        assert!(warnings[1].contains("clusterName is skipped"));
    }

    #[test]
    fn nulls_are_unset_at_any_depth() {
        let (v, _) = decoded(json!({"webhook": {"namespaceSelector": null,
            "vaultSecretManager": {"annotations": null}, "awsSecretManager": {"resources": {"limits": null}}}}));
        assert_eq!(v["webhook"]["vaultSecretManager"], json!({}));
        assert!(v["webhook"].get("namespaceSelector").is_none());
        assert_eq!(v["webhook"]["awsSecretManager"]["resources"], json!({}));
    }

    #[test]
    fn a_configmap_object_is_read_by_its_data_files_in_name_order() {
        let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: flyte-propeller-config}\ndata:\n  core.yaml: |\n    webhook:\n      listenPort: 1\n  admin.yaml: |\n    admin: {endpoint: x}\n  README: not a file\n";
        let docs = documents("cm.yaml", cm).unwrap();
        let names: Vec<&str> = docs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["cm.yaml: data.admin.yaml", "cm.yaml: data.core.yaml"]
        );
        assert_eq!(docs[1].1["webhook"]["listenPort"], 1);
        let json = r#"{"kind": "ConfigMap", "data": {"a.json": "{\"webhook\": {}}"}}"#;
        assert_eq!(documents("cm.json", json).unwrap().len(), 1);
        let err = documents("cm.yaml", "kind: ConfigMap\ndata: {x: y}\n").unwrap_err();
        assert_eq!(err.key, "cm.yaml: data");
        let err = documents("cm.yaml", "kind: ConfigMap\ndata: {a.yaml: [1]}\n").unwrap_err();
        assert_eq!(err.key, "cm.yaml: data.a.yaml");
    }

    #[test]
    fn other_sections_are_skipped_but_a_near_miss_or_our_own_is_refused() {
        let doc = json!({"Webhook": {"a": 1}, "secret": {}, "leaseworker": {}, "union": {}, "fasttask": {}});
        let (read, skipped) = sections("f", doc).unwrap();
        assert_eq!(read, json!({"webhook": {"a": 1}}));
        assert_eq!(skipped, ["secret", "leaseworker", "union", "fasttask"]);
        let err = sections("f", json!({"webhok": {}})).unwrap_err();
        assert_eq!(err.key, "f: webhok");
        assert!(err.message.contains("did you mean `webhook`"), "{err}");
        let err = sections("f", json!({"http": {}})).unwrap_err();
        assert!(err.message.contains("belongs in --config"), "{err}");
    }
}
