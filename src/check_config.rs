//! `check-config`'s output: the effective configuration (what the process will use, the path
//! token redacted), the part of it that differs from the defaults, and what the environment of
//! a Lambda function leaves room for.

use podmutator_core::config::{Config, ENV_CONFIG_INLINE, Loaded};

/// The configuration as `check-config` prints it: what the process will actually use. Unset
/// options are left out rather than printed as `null`; the managers are the ones tried (after
/// Global, which is always first), and each fetcher's image and resources are filled in with
/// their defaults. `http.pathToken` is redacted. The document loads back as the same
/// configuration.
pub fn effective(config: &Config) -> Result<serde_json::Value, serde_json::Error> {
    use podmutator_core::config::{
        AWS_SIDECAR_IMAGE, AZURE_SIDECAR_IMAGE, GCP_SIDECAR_IMAGE, SecretManagerType,
    };
    let mut c = config.clone();
    let w = &mut c.webhook;
    w.secret_manager_types = w
        .enabled_secret_managers()
        .into_iter()
        .filter(|t| *t != SecretManagerType::Global)
        .collect();
    w.secret_manager_type = None;
    for (sidecar, image) in [
        (&mut w.aws_secret_manager, AWS_SIDECAR_IMAGE),
        (&mut w.gcp_secret_manager, GCP_SIDECAR_IMAGE),
        (&mut w.azure_secret_manager, AZURE_SIDECAR_IMAGE),
    ] {
        sidecar.sidecar_image = Some(sidecar.image_or(image));
        sidecar.resources = Some(sidecar.resources_or_default());
    }
    w.local_cert = Some(w.local_cert.unwrap_or(true));
    let mut v = redacted(&c)?;
    let defaults = serde_json::to_value(Config::default())?;
    drop_unset(&mut v, Some(&defaults));
    Ok(v)
}

/// The effective configuration less every value equal to its default: what a deployment must
/// set, which loads back as the same configuration (`check-config --changed`).
pub fn changed_from_defaults(config: &Config) -> Result<serde_json::Value, serde_json::Error> {
    fn strip(v: &mut serde_json::Value, default: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (v, default) {
            (Value::Object(m), Value::Object(d)) => {
                m.retain(|k, child| d.get(k).is_none_or(|dc| !strip(child, dc)));
                m.is_empty()
            }
            (v, d) => v == d,
        }
    }
    let mut v = effective(config)?;
    let defaults = effective(&Config::default())?;
    if strip(&mut v, &defaults) {
        v = serde_json::Value::Object(Default::default());
    }
    Ok(v)
}

/// Lambda's limit on the environment: 4 KB for every variable's name and value together.
pub const LAMBDA_ENVIRONMENT_BYTES: usize = 4096;

/// A warning when `changed` (the configuration's changed keys, compact) would not leave room
/// in the Lambda environment as `PODMUTATOR_CONFIG`: its size, and what to do instead.
pub fn lambda_environment_warning(changed: &str, changed_mode: bool) -> Option<String> {
    // The variable as Lambda counts it, in the environment's JSON object: "NAME":"value",
    // where the value is the JSON text escaped once more.
    let escaped = serde_json::Value::String(changed.to_owned()).to_string();
    let bytes = ENV_CONFIG_INLINE.len() + 3 + escaped.len();
    // The other variables a deployment sets (RUST_LOG, the AWS_* Lambda adds are not counted).
    (bytes > LAMBDA_ENVIRONMENT_BYTES * 7 / 8).then(|| {
        let what = if changed_mode {
            "this configuration"
        } else {
            "this configuration's changed keys (check-config --changed)"
        };
        format!(
            "{what} would take {bytes} bytes of Lambda's {LAMBDA_ENVIRONMENT_BYTES}-byte environment as {ENV_CONFIG_INLINE}, which every other variable shares: ship it as a file (PODMUTATOR_CONFIG_FILE, in the zip or a layer), or shorten it (docs/deploy.md, \"The 4 KB environment\")"
        )
    })
}

/// `check-config --changed`'s report on stderr: how many keys were read, what was skipped, and
/// which of the keys read podmutator never uses.
pub fn summary(loaded: &Loaded) -> String {
    let mut out = format!("podmutator: read {} keys\n", loaded.read.len());
    // Sections by the file they came from (`file: section`), then keys.
    let mut by_source: Vec<(&str, Vec<&str>)> = Vec::new();
    for s in &loaded.skipped {
        let (source, name) = s.rsplit_once(": ").unwrap_or(("keys", s));
        match by_source.iter_mut().find(|(src, _)| *src == source) {
            Some((_, names)) => names.push(name),
            None => by_source.push((source, vec![name])),
        }
    }
    for (source, names) in by_source {
        out.push_str(&format!(
            "podmutator: skipped, {source}: {}\n",
            names.join(", ")
        ));
    }
    let unused = loaded.unused();
    if !unused.is_empty() {
        out.push_str(&format!(
            "podmutator: unused (accepted so Flyte's configurations load): {}\n",
            unused.join(", ")
        ));
    }
    if loaded.config.http.path_token.is_some() {
        out.push_str("podmutator: http.pathToken is printed redacted: give the deployment the token itself, or its hash as http.pathTokenSha256\n");
    }
    out
}

/// Drops each `null` that is also the default there (an unset option); a `null` that differs
/// from its default (`mesh.gate.securityContext: null`, "none") is a setting and stays.
fn drop_unset(v: &mut serde_json::Value, default: Option<&serde_json::Value>) {
    if let serde_json::Value::Object(map) = v {
        map.retain(|k, v| {
            !v.is_null() || default.and_then(|d| d.get(k)).is_some_and(|d| !d.is_null())
        });
        for (k, v) in map.iter_mut() {
            drop_unset(v, default.and_then(|d| d.get(k)));
        }
    }
}

/// The configuration as `check-config` prints it: `http.pathToken` is a credential (whoever
/// holds it may call the webhook), so only whether it is set shows.
pub fn redacted(config: &Config) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(config)?;
    if let Some(token) = v.pointer_mut("/http/pathToken")
        && !token.is_null()
    {
        *token = serde_json::Value::String("<redacted>".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_config_hides_the_path_token_and_keeps_the_rest() {
        let token = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
        let config = Config::from_value(serde_json::json!({"http": {"pathToken": token}}))
            .expect("loads")
            .config;
        let v = redacted(&config).unwrap();
        assert_eq!(v["http"]["pathToken"], "<redacted>");
        assert!(!v.to_string().contains(token), "{v}");
        assert_eq!(
            v["webhook"],
            serde_json::to_value(&config).unwrap()["webhook"]
        );
        let unset = redacted(&Config::default()).unwrap();
        assert!(unset["http"]["pathToken"].is_null(), "{unset}");
    }
}
