//! Infrastructure checks: the linters and scanners over `terraform/` and `template.yaml`, and
//! proof that Terraform, SAM, `registration.json` and `podmutator webhook-config` agree with the
//! function's routes and deadlines.
//!
//! Every tool comes from `scripts/tools.sh path ...`; a tool that cannot be installed fails the
//! test, it never skips it. Plans, and apply/destroy against moto, are in
//! tests/terraform_apply.rs. `sam build` is slow (a cross-compiled LTO release build) and runs in
//! `scripts/sam-build-check.sh` instead.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{root, tool};

use podmutator::registration::{
    self, FailurePolicy, MESH_LABEL_KEY_PLACEHOLDER, RegistrationOptions,
};
use serde_json::{Value, json};

/// The oldest Kubernetes line the crate pins (k8s-openapi `v1_33`); matchConditions are GA there.
const KUBERNETES_VERSION: &str = "1.33.0";

fn run(what: &str, cmd: &mut Command) -> Output {
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(root());
    }
    cmd.env("SAM_CLI_TELEMETRY", "0")
        .env("BC_SKIP_MAPPING", "TRUE")
        .env("CHECKPOINT_DISABLE", "1")
        // Keeps tests/iac/__pycache__ out of the work tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"))
}

fn run_ok(what: &str, cmd: &mut Command) -> Output {
    let out = run(what, cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A scratch directory under the target dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("iac-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Linters and scanners
// ---------------------------------------------------------------------------------------------

#[test]
fn terraform_is_formatted() {
    let terraform = tool("terraform");
    for dir in ["terraform", "examples"] {
        run_ok(
            &format!("terraform fmt -check {dir}"),
            Command::new(&terraform).args(["fmt", "-check", "-recursive", "-diff", dir]),
        );
    }
}

#[test]
fn sam_validate_lint_is_clean() {
    run_ok(
        "sam validate --lint",
        Command::new(tool("sam")).args(["validate", "--lint", "-t", "template.yaml"]),
    );
}

#[test]
fn cfn_lint_is_clean() {
    run_ok(
        "cfn-lint",
        Command::new(tool("cfn-lint")).arg("template.yaml"),
    );
}

/// Runs checkov and asserts nothing failed and every skip says why. Returns (passed, skips,
/// resources checked).
fn checkov(what: &str, args: &[&str]) -> (u64, Vec<String>, Vec<String>) {
    let out = run(
        what,
        Command::new(tool("checkov"))
            .args(args)
            .args(["--skip-download", "--output", "json"]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: checkov printed no JSON report ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let summary = &report["summary"];
    let failed: Vec<String> = report["results"]["failed_checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| format!("{} {} ({})", c["check_id"], c["resource"], c["check_name"]))
        .collect();
    assert!(
        failed.is_empty() && summary["failed"] == 0,
        "{what}: checkov failed checks:\n{}",
        failed.join("\n")
    );
    assert_eq!(
        summary["parsing_errors"], 0,
        "{what}: checkov could not parse everything"
    );
    let skips: Vec<String> = report["results"]["skipped_checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let reason = c["check_result"]["suppress_comment"].as_str().unwrap_or("");
            assert!(
                reason.len() > 20,
                "{what}: skip of {} on {} has no reason",
                c["check_id"],
                c["resource"]
            );
            format!(
                "{} {}: {reason}",
                c["check_id"].as_str().unwrap_or("?"),
                c["resource"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let resources: Vec<String> = report["results"]["passed_checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["resource"].as_str().map(str::to_owned))
        .collect();
    let passed = summary["passed"].as_u64().unwrap_or(0);
    assert!(passed > 0, "{what}: checkov ran no check");
    eprintln!(
        "{what}: {passed} checks passed, {} skipped with a reason\n  {}",
        skips.len(),
        skips.join("\n  ")
    );
    (passed, skips, resources)
}

#[test]
fn checkov_passes_terraform_with_every_skip_explained() {
    for dir in ["terraform", "examples"] {
        checkov(
            &format!("checkov {dir}/"),
            &["--directory", dir, "--framework", "terraform"],
        );
    }
}

/// The task pods' role module on its own, so that its resources are known to have been scanned.
#[test]
fn checkov_passes_the_pod_identity_module() {
    let (_, _, resources) = checkov(
        "checkov terraform/modules/pod-identity",
        &[
            "--directory",
            "terraform/modules/pod-identity",
            "--framework",
            "terraform",
        ],
    );
    // checkov has no check of Pod Identity associations; the roles and policies are the point.
    for want in [
        "aws_iam_role.pods",
        "aws_iam_role_policy.read",
        "aws_iam_policy_document.read",
    ] {
        assert!(
            resources.iter().any(|r| r.contains(want)),
            "{want} was not scanned: {resources:?}"
        );
    }
}

/// checkov drops resources whose Condition is false for the parameter defaults, so the template
/// is scanned once per endpoint: as written (alb) and with http-api, mesh, the image builder and
/// a pull-through cache switched on.
#[test]
fn checkov_passes_template_for_both_endpoints_with_every_skip_explained() {
    checkov(
        "checkov template.yaml (alb)",
        &["--file", "template.yaml", "--framework", "cloudformation"],
    );

    let text = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let mut variant = text.clone();
    for (from, to) in [
        (
            "    Default: alb\n    AllowedValues: [alb, http-api]",
            "    Default: http-api\n    AllowedValues: [alb, http-api]",
        ),
        (
            "    Default: \"false\"\n    AllowedValues: [\"true\", \"false\"]\n    Description: Turn on the mesh",
            "    Default: \"true\"\n    AllowedValues: [\"true\", \"false\"]\n    Description: Turn on the mesh",
        ),
        (
            "  ImageBuilderEnabled:\n    Type: String\n    Default: \"false\"",
            "  ImageBuilderEnabled:\n    Type: String\n    Default: \"true\"",
        ),
        (
            "  EcrPullThroughCacheQuay:\n    Type: String\n    Default: \"false\"",
            "  EcrPullThroughCacheQuay:\n    Type: String\n    Default: \"true\"",
        ),
    ] {
        assert_eq!(
            variant.matches(from).count(),
            1,
            "template.yaml changed: update this test's parameter switch for {from:?}"
        );
        variant = variant.replace(from, to);
    }
    let scratch = Scratch::new("checkov-template");
    let file = scratch.path().join("template-http-api.yaml");
    std::fs::write(&file, variant).unwrap();
    let (_, _, resources) = checkov(
        "checkov template.yaml (http-api, mesh, images)",
        &[
            "--file",
            file.to_str().unwrap(),
            "--framework",
            "cloudformation",
        ],
    );
    assert!(
        resources.iter().any(|r| r.contains("HttpApiStage")),
        "the http-api variant was not scanned as such: {resources:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Agreement between the IaC, registration.json and the function
// ---------------------------------------------------------------------------------------------

/// What the crate says the IaC must match: its routes, and the defaults the IaC passes
/// explicitly, which must be the function's own.
fn expectations() -> Value {
    let config = podmutator_core::Config::default();
    json!({
        "routes": {
            "secrets": podmutator::transport::http::PATH_SECRETS,
            "managedPod": podmutator::transport::http::PATH_MANAGED_POD,
            "managedNamespace": podmutator::transport::http::PATH_MANAGED_NAMESPACE,
            "imageBuilder": podmutator::transport::http::PATH_IMAGE_BUILDER,
            "images": podmutator::transport::http::PATH_IMAGES,
            "healthz": podmutator::transport::http::PATH_HEALTHZ,
        },
        "secretsWebhookName": "flyte-pod-webhook.flyte.org",
        "imageBuilderWebhookName": podmutator_core::mutate::image::builder::WEBHOOK_NAME,
        "meshLabelKeyPlaceholder": MESH_LABEL_KEY_PLACEHOLDER,
        "annotationPrefix": podmutator_core::secrets::codec::ANNOTATION_PREFIX,
        "embedded": {
            "deadlineMs": config.embedded.deadline_ms,
            "cacheTtlSeconds": config.embedded.cache_ttl_seconds,
            "namespaceTemplate": config.embedded.namespace_template,
        },
        "maxBodyBytes": config.http.max_body_bytes,
        "metricsNamespace": config.metrics.namespace,
        "secretsSelector": {
            "label": config.secrets_selector.label,
            "value": config.secrets_selector.value,
        },
        "meshManagedLabel": config.mesh.managed_label,
        "meshManagedValue": podmutator_core::mutate::mesh::MANAGED,
        "bounds": podmutator_core::config::bounds::to_json(),
    })
}

/// `var.mutators` may name only the function's mutator ids (`local.mutator_ids`, terraform/main.tf):
/// the list must be the function's own, so that no id Terraform accepts is refused at start and
/// none the function knows is refused at plan.
#[test]
fn terraform_knows_the_functions_mutator_ids() {
    let main = std::fs::read_to_string(root().join("terraform/main.tf")).unwrap();
    let line = main
        .lines()
        .find_map(|l| l.trim().strip_prefix("mutator_ids = "))
        .expect("terraform/main.tf has no `mutator_ids = [...]` local");
    let listed: Vec<String> = serde_json::from_str(line).unwrap();
    let want: Vec<&str> = podmutator_core::config::MutatorId::ALL
        .iter()
        .map(|id| id.as_str())
        .collect();
    assert_eq!(listed, want, "terraform/main.tf's mutator_ids");
}

/// Terraform validates its variables against `terraform/config-bounds.json`: it must be the
/// function's own bounds, as the function checks them.
#[test]
fn terraform_reads_the_functions_own_bounds() {
    let path = root().join("terraform/config-bounds.json");
    let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let want = podmutator_core::config::bounds::to_json();
    assert_eq!(
        file,
        want,
        "{} differs from the function's bounds; write it as:\n{}",
        path.display(),
        serde_json::to_string_pretty(&want).unwrap()
    );
}

#[test]
fn terraform_and_sam_agree_with_the_functions_routes_and_deadlines() {
    let scratch = Scratch::new("agreement");
    let expect = scratch.path().join("expect.json");
    let facts = scratch.path().join("terraform-facts.json");
    std::fs::write(&expect, expectations().to_string()).unwrap();
    let out = run_ok(
        "tests/iac/check_terraform.py",
        Command::new(tool("python-hcl"))
            .arg("tests/iac/check_terraform.py")
            .arg(root())
            .arg(&expect)
            .arg(&facts),
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let configs = scratch.path().join("sam-configs.json");
    let out = run_ok(
        "tests/iac/check_sam.py",
        Command::new(tool("python"))
            .arg("tests/iac/check_sam.py")
            .arg(root())
            .arg(&expect)
            .arg(&facts)
            .arg(&configs),
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));

    // Every PODMUTATOR_CONFIG the template renders (each endpoint, mesh, image builder, images
    // and path token switch, and a rotation's two hashes) is one the function starts with (the
    // binary's own start-up gate, `check-config`, as the Lambda runs it), without a warning but
    // the one that says the token is off, and with the image mutators on exactly when the
    // template serves their routes.
    let rendered: Vec<Value> = serde_json::from_slice(&std::fs::read(&configs).unwrap()).unwrap();
    assert!(
        rendered.len() >= 2 * 2 * 2 * 2 * 2 * 4,
        "check_sam.py rendered {} configurations",
        rendered.len()
    );
    let token_file = scratch.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for r in &rendered {
        let tag = r["tag"].as_str().unwrap();
        // A value the template refuses (a Rule, an AllowedPattern): the function refuses it too.
        if let Some(key) = r["refusedAt"].as_str() {
            let out = crate::common::bin()
                .arg("check-config")
                .env("PODMUTATOR_CONFIG", r["config"].to_string())
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains(&format!("invalid configuration: {key}")),
                "{tag}: the template refuses it, the function does not refuse it at {key}:\n{stderr}"
            );
            continue;
        }
        let loaded = podmutator_core::Config::from_value(r["config"].clone())
            .unwrap_or_else(|e| panic!("{tag}: the function refuses the SAM config: {e}"));
        let c = &loaded.config;
        let warnings: Vec<&str> = loaded
            .warnings
            .iter()
            .map(String::as_str)
            .filter(|w| !(c.http.path_token_disabled && w.starts_with("http.pathTokenDisabled")))
            .collect();
        assert!(warnings.is_empty(), "{tag}: {warnings:?}");
        assert!(
            c.http.path_token_disabled != c.http.path_token_sha256.is_some(),
            "{tag}: neither a token hash nor pathTokenDisabled (or both): {}",
            r["config"]["http"]
        );
        let out = run(
            &format!("{tag}: podmutator check-config"),
            crate::common::bin()
                .arg("check-config")
                .env("PODMUTATOR_CONFIG", r["config"].to_string()),
        );
        assert!(
            out.status.success(),
            "{tag}: the function would refuse to start with the SAM config:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(command) = r["webhookConfig"].as_array() {
            sam_registration_matches(tag, command, r, &token_file);
        }
        let builder = c.webhook.image_builder_config.enabled;
        assert_eq!(Some(builder), r["imageBuilder"].as_bool(), "{tag}");
        assert_eq!(Some(c.images.enabled), r["images"].as_bool(), "{tag}");
        assert_eq!(c.images.enabled, !c.images.rules.is_empty(), "{tag}");
        seen.insert((builder, c.images.rules.len()));
    }
    // Off, one cache, and five caches with two extra rules, each with and without the builder.
    for want in [
        (false, 0),
        (true, 0),
        (false, 1),
        (true, 1),
        (false, 7),
        (true, 7),
    ] {
        assert!(
            seen.contains(&want),
            "no rendered config {want:?}: {seen:?}"
        );
    }
}

/// SAM cannot register: its `WebhookConfigCommand` output is what the operator runs. Run as
/// printed (the token file in place of `token`), it must register exactly the routes the stack
/// serves, with the function's own selectors and label, and the secrets namespace selector.
fn sam_registration_matches(tag: &str, command: &[Value], r: &Value, token_file: &Path) {
    let args: Vec<String> = command
        .iter()
        .map(|a| match a.as_str().unwrap() {
            "token" => token_file.display().to_string(),
            other => other.to_owned(),
        })
        .collect();
    let out = run_ok(
        &format!("{tag}: WebhookConfigCommand"),
        crate::common::bin().args(&args),
    );
    let registered: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{tag}: webhook-config printed no YAML: {e}"));
    let hooks = registered["webhooks"].as_array().unwrap();
    let config = &r["config"];
    let paths: Vec<String> = hooks
        .iter()
        .map(|w| {
            let url = w["clientConfig"]["url"].as_str().unwrap();
            let path = url.trim_start_matches("https://podmutator.example.com");
            path.strip_prefix(&format!("/{TOKEN}"))
                .unwrap_or(path)
                .to_owned()
        })
        .collect();
    let mut routes: Vec<String> = r["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(routes.pop().as_deref(), Some("/healthz"), "{tag}");
    assert_eq!(
        paths, routes,
        "{tag}: the registration calls other paths than the stack serves"
    );
    let token_on = config["http"]["pathTokenSha256"].is_string();
    assert!(
        hooks
            .iter()
            .all(|w| w["clientConfig"]["url"].as_str().unwrap().contains(TOKEN) == token_on),
        "{tag}: the URLs and the function disagree about the token"
    );
    let kube_system = json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]});
    let label = config["mesh"]["managedLabel"].as_str().unwrap();
    for w in hooks {
        let selector = &w["namespaceSelector"];
        match w["name"].as_str().unwrap() {
            "flyte-pod-webhook.flyte.org" => {
                let mut want = r["secretsNamespaceSelector"].clone();
                if want.is_null() {
                    want = json!({});
                }
                let mut exprs = want["matchExpressions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                exprs.push(kube_system.clone());
                want["matchExpressions"] = Value::Array(exprs);
                assert_eq!(selector, &want, "{tag}: secrets namespaceSelector");
            }
            "managed-pod.podmutator.io" => {
                assert_eq!(
                    w["objectSelector"],
                    json!({"matchLabels": {label: "true"}}),
                    "{tag}"
                )
            }
            "managed-namespace.podmutator.io" => {
                assert_eq!(selector["matchLabels"], json!({label: "true"}), "{tag}")
            }
            "image-builder-webhook.union.ai" => assert_eq!(
                w["objectSelector"], config["webhook"]["imageBuilderConfig"]["labelSelector"],
                "{tag}"
            ),
            "images.podmutator.io" => {
                let pod = &config["images"]["podSelector"];
                let every_pod = json!({});
                assert_eq!(
                    &w["objectSelector"],
                    if pod.is_null() { &every_pod } else { pod },
                    "{tag}"
                );
                let ns = &config["images"]["namespaceSelector"];
                for e in ns["matchExpressions"].as_array().into_iter().flatten() {
                    assert!(
                        selector["matchExpressions"].as_array().unwrap().contains(e),
                        "{tag}: images namespaceSelector lacks {e}"
                    );
                }
                assert_eq!(w["timeoutSeconds"], 3, "{tag}");
            }
            other => panic!("{tag}: unexpected entry {other}"),
        }
    }
}

const TOKEN: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
const FAKE_CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nZmFrZS1jYS1mb3ItdGVzdHM=\n-----END CERTIFICATE-----\n";

/// Inputs given both to the Terraform renderer and to `mutating_webhook_configuration`.
fn cases() -> Vec<(&'static str, RegistrationOptions)> {
    vec![
        (
            "alb_defaults",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                ..Default::default()
            },
        ),
        (
            "alb_private_ca_mesh",
            RegistrationOptions {
                url: Some("https://podmutator.internal.example.com/".into()),
                ca_bundle_pem: Some(FAKE_CA_PEM.as_bytes().to_vec()),
                mesh: true,
                ..Default::default()
            },
        ),
        (
            "http_api_everything_overridden",
            RegistrationOptions {
                url: Some("https://hooks.example.com/base".into()),
                path_token: Some(TOKEN.into()),
                ca_bundle_pem: Some(FAKE_CA_PEM.as_bytes().to_vec()),
                mesh: true,
                mesh_label_key: Some("example.org/meshed".into()),
                failure_policy: Some(FailurePolicy::Ignore),
                timeout_seconds: Some(7),
                name: Some("podmutator-staging".into()),
                ..Default::default()
            },
        ),
        (
            "alb_image_entries",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                image_builder_selector: Some(json!({"matchLabels": {"image-builder": "true"}})),
                images: true,
                images_namespace_selector: Some(json!({
                    "matchLabels": {"mirror": "ecr"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]
                })),
                ..Default::default()
            },
        ),
        (
            "alb_images_pod_selector",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                images: true,
                images_pod_selector: Some(json!({"matchLabels": {"mirror": "ecr"}})),
                ..Default::default()
            },
        ),
        // A staged rollout (docs/migration.md): the secrets entry on one namespace, failing
        // open; a longer timeout that the images entry does not take.
        (
            "staged_rollout",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                path_token: Some(TOKEN.into()),
                images: true,
                mesh: true,
                secrets_namespace_selector: Some(json!({
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["flytesnacks-development"]}]
                })),
                failure_policy: Some(FailurePolicy::Ignore),
                timeout_seconds: Some(15),
                ..Default::default()
            },
        ),
        // `Fail` written out (undoing the fail-open switch) keeps the images entry open.
        (
            "fail_written_out",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                images: true,
                mesh: true,
                failure_policy: Some(FailurePolicy::Fail),
                ..Default::default()
            },
        ),
        (
            "short_timeout",
            RegistrationOptions {
                url: Some("https://podmutator.example.com".into()),
                images: true,
                secrets_namespace_selector: Some(
                    json!({"matchLabels": {"podmutator-pilot": "true"}}),
                ),
                timeout_seconds: Some(2),
                ..Default::default()
            },
        ),
    ]
}

fn hcl_string(s: &str) -> String {
    // JSON string escapes are HCL string escapes; none of the inputs contain "${" or "%{".
    assert!(!s.contains("${") && !s.contains("%{"), "{s}");
    serde_json::to_string(s).unwrap()
}

/// A root module that instantiates terraform/modules/webhook-config once per case.
fn render_root(cases: &[(&str, RegistrationOptions)]) -> String {
    let module_dir = root().join("terraform/modules/webhook-config");
    let registration_file = root().join("terraform/registration.json");
    let mut tf = String::new();
    for (name, o) in cases {
        let mut args = vec![
            format!("source = {}", hcl_string(module_dir.to_str().unwrap())),
            format!(
                "registration_json = file({})",
                hcl_string(registration_file.to_str().unwrap())
            ),
            format!("url = {}", hcl_string(o.url.as_deref().unwrap_or_default())),
            format!("mesh_enabled = {}", o.mesh),
        ];
        if let Some(t) = &o.path_token {
            args.push(format!("path_token = {}", hcl_string(t)));
        }
        if let Some(pem) = &o.ca_bundle_pem {
            args.push(format!(
                "ca_bundle_pem = {}",
                hcl_string(std::str::from_utf8(pem).unwrap())
            ));
        }
        if let Some(k) = &o.mesh_label_key {
            args.push(format!("mesh_label_key = {}", hcl_string(k)));
        }
        if let Some(p) = o.failure_policy {
            args.push(format!("failure_policy = {}", hcl_string(p.as_str())));
        }
        if let Some(t) = o.timeout_seconds {
            args.push(format!("timeout_seconds = {t}"));
        }
        if let Some(n) = &o.name {
            args.push(format!("name = {}", hcl_string(n)));
        }
        // A JSON object is an HCL expression as it stands.
        if let Some(s) = &o.image_builder_selector {
            args.push(format!("image_builder_object_selector = {s}"));
        }
        if o.images {
            args.push("images_enabled = true".into());
        }
        if let Some(s) = &o.images_pod_selector {
            args.push(format!("images_pod_selector = {s}"));
        }
        if let Some(s) = &o.images_namespace_selector {
            args.push(format!("images_namespace_selector = {s}"));
        }
        if let Some(s) = &o.secrets_namespace_selector {
            args.push(format!("secrets_namespace_selector = {s}"));
        }
        tf.push_str(&format!(
            "module \"{name}\" {{\n  {}\n}}\n\noutput \"{name}\" {{\n  value     = module.{name}.manifest\n  sensitive = true\n}}\n\noutput \"{name}_min_timeout\" {{\n  value = module.{name}.min_timeout_seconds\n}}\n\n",
            args.join("\n  ")
        ));
    }
    tf
}

/// Terraform itself evaluates the module that the root module registers with, offline (it has no
/// providers), and the result must equal what `podmutator webhook-config` prints.
#[test]
fn terraform_renders_exactly_what_webhook_config_prints() {
    let terraform = tool("terraform");
    let scratch = Scratch::new("render");
    let cases = cases();
    std::fs::write(scratch.path().join("main.tf"), render_root(&cases)).unwrap();
    let tf = |args: &[&str]| {
        run_ok(
            &format!("terraform {}", args.join(" ")),
            Command::new(&terraform)
                .args(args)
                .current_dir(scratch.path()),
        )
    };
    tf(&["init", "-input=false", "-no-color"]);
    tf(&["apply", "-auto-approve", "-input=false", "-no-color"]);
    let outputs: Value =
        serde_json::from_slice(&tf(&["output", "-no-color", "-json"]).stdout).unwrap();

    let kubernetes_validate = tool("kubernetes-validate");
    for (name, opts) in &cases {
        opts.validate().unwrap();
        let rust = registration::mutating_webhook_configuration(opts);
        assert_eq!(
            outputs[*name]["value"], rust,
            "{name}: Terraform and `podmutator webhook-config` disagree"
        );
        // The entries that fail closed in the file: the function's answer must reach the API
        // server before their timeout. The images entry fails open (and waits 3 s).
        let file_policy = |name: &Value| {
            registration::registration()["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| &w["name"] == name)
                .map(|w| w["failurePolicy"].clone())
        };
        let min_timeout = rust["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| file_policy(&w["name"]) == Some(json!("Fail")))
            .map(|w| w["timeoutSeconds"].as_u64().unwrap())
            .min();
        assert!(min_timeout.is_some(), "{name}: no entry fails closed");
        assert_eq!(
            outputs[format!("{name}_min_timeout")]["value"].as_u64(),
            min_timeout
        );

        // What the command prints is a valid object for the oldest supported Kubernetes. An
        // unknown kind is only a warning with exit status 0, so the "passed" line for this very
        // object is required, not just the status.
        let yaml = scratch.path().join(format!("{name}.yaml"));
        std::fs::write(&yaml, registration::to_yaml(&rust)).unwrap();
        let out = run_ok(
            &format!("kubernetes-validate {name}.yaml"),
            Command::new(&kubernetes_validate)
                .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
                .arg(&yaml),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let minor = KUBERNETES_VERSION.trim_end_matches(".0");
        let want = format!(
            "{} passed for resource mutatingwebhookconfiguration/{} against version {minor}",
            yaml.display(),
            rust["metadata"]["name"].as_str().unwrap()
        );
        assert!(
            stdout.lines().any(|l| l.ends_with(&want)),
            "{name}: the registration was not validated as a MutatingWebhookConfiguration (no line {want:?}):\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What `webhook-config` refuses, the module refuses at plan: a path token the function would
/// not accept, a CA bundle that would publish a private key.
#[rstest::rstest]
#[case::short_token(
    RegistrationOptions { path_token: Some("short".into()), ..Default::default() },
    "path_token must be at least 32"
)]
#[case::ca_bundle_with_a_key(
    RegistrationOptions {
        ca_bundle_pem: Some(format!("-----BEGIN PRIVATE KEY-----\nZmFrZQ==\n-----END PRIVATE KEY-----\n{FAKE_CA_PEM}").into_bytes()),
        ..Default::default()
    },
    "ca_bundle_pem must hold certificates only"
)]
fn terraform_rejects_what_webhook_config_rejects(
    #[case] bad: RegistrationOptions,
    #[case] says: &str,
) {
    let terraform = tool("terraform");
    let scratch = Scratch::new(&format!("render-bad-{}", says.len()));
    let bad = RegistrationOptions {
        url: Some("https://h.example.com".into()),
        ..bad
    };
    assert!(bad.validate().is_err());
    std::fs::write(scratch.path().join("main.tf"), render_root(&[("bad", bad)])).unwrap();
    run_ok(
        "terraform init",
        Command::new(&terraform)
            .args(["init", "-input=false", "-no-color"])
            .current_dir(scratch.path()),
    );
    let out = run(
        "terraform plan",
        Command::new(&terraform)
            .args(["plan", "-input=false", "-no-color"])
            .current_dir(scratch.path()),
    );
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "terraform accepted it: {text}");
    assert!(
        text.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains(says),
        "{text}"
    );
}

/// docs/deploy.md's fetcher image publish block, as written (its placeholders filled: moto's
/// account, the region, the crate's version), with the stand-in `aws` against moto and a stand-in
/// `docker` (tests/iac/fake_docker.py) whose push puts an image index into moto's ECR: the
/// repository is made immutable and scanned on push, `docker login` gets the registry's own
/// password, the build is for both platforms, tagged in that repository and pushed from the
/// repository's root, and the last command prints the digest the registry holds for the tag,
/// the one `fetcherImage` pins. No image is built: no Docker engine or registry is reachable
/// here (what the build makes is `scripts/pod-image.sh`'s, run in CI).
#[tokio::test]
async fn the_fetcher_image_publish_block_runs_as_written() {
    let moto = common::aws::Moto::start();
    let dir = common::temp_dir("ecr-publish");
    let bin = common::fake_bin(&dir);
    common::stand_in(&bin, "docker", "fake_docker.py");
    let log = dir.join("docker-calls.jsonl");
    let deploy = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    let at = deploy
        .find("Publish it to ECR and pin the digest")
        .expect("docs/deploy.md publishes the fetcher image");
    let rest = &deploy[at..];
    let start = rest.find("```sh\n").unwrap() + "```sh\n".len();
    let block = &rest[start..start + rest[start..].find("```").unwrap()];
    let (account, region, version) = ("123456789012", "us-east-1", env!("CARGO_PKG_VERSION"));
    let env = moto.env(region);
    let script = block
        .replace("<account>", account)
        .replace("<region>", region)
        .replace("<version>", version);
    assert!(
        script
            .lines()
            .all(|l| !l.split(" #").next().unwrap().contains('<')),
        "a placeholder left:\n{script}"
    );
    let out = Command::new("sh")
        .args(["-ec", &script])
        .current_dir(root())
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("FAKE_DOCKER_LOG", &log)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ecr = |code: &str| -> Value {
        let code = format!("c = boto3.client('ecr')\n{code}\nprint(json.dumps(r, default=str))");
        serde_json::from_str(&common::aws::boto3(&env, &code, &[])).unwrap()
    };
    let repo =
        ecr("r = c.describe_repositories(repositoryNames=['podmutator'])['repositories'][0]");
    assert_eq!(repo["imageTagMutability"], "IMMUTABLE", "{repo}");
    assert_eq!(
        repo["imageScanningConfiguration"]["scanOnPush"], true,
        "{repo}"
    );
    let registry = format!("{account}.dkr.ecr.{region}.amazonaws.com");
    let password = ecr(
        "import base64\nr = base64.b64decode(c.get_authorization_token()['authorizationData'][0]['authorizationToken']).decode().partition(':')[2]",
    );
    use sha2::Digest;
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        calls,
        [
            json!({
                "login": registry,
                "password_sha256": hex::encode(sha2::Sha256::digest(password.as_str().unwrap())),
            }),
            json!({
                "build": format!("{registry}/podmutator:{version}"),
                "registry": registry,
                "platforms": ["linux/amd64", "linux/arm64"],
            }),
        ]
    );
    let image = ecr(&format!(
        "r = c.describe_images(repositoryName='podmutator', imageIds=[{{'imageTag': '{version}'}}])['imageDetails'][0]['imageDigest']"
    ));
    let last = stdout.trim().lines().last().unwrap_or_default();
    let printed: Value = serde_json::from_str(last).expect("the digest, as JSON, last");
    assert_eq!(printed, image, "the block prints the pushed tag's digest");
    assert!(image.as_str().unwrap().starts_with("sha256:"), "{image}");
}

/// `scripts/path-token.sh` (it once exited 141 every time: `tr ... | head -c 48` under
/// `pipefail`), against moto through the stand-in `aws`: with a name, and with none as
/// docs/deploy.md's Path B runs it (the default name, `podmutator-path-token-<UTC time>`), it
/// exits 0, prints the two stack parameters, and the secret it stored, under that name, is 48
/// letters and digits whose SHA-256 is the one printed; the token itself is never printed.
#[tokio::test]
async fn path_token_script_stores_a_token_and_prints_its_hash_and_arn() {
    let moto = common::aws::Moto::start();
    let dir = common::temp_dir("path-token-script");
    let bin = common::fake_bin(&dir);
    let client = common::aws::client(&moto.url()).await;
    let default_name = regex::Regex::new("^podmutator-path-token-[0-9]{14}$").unwrap();
    // Without a name, the command as docs/deploy.md's Path B writes it.
    let deploy = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    let documented = deploy
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("scripts/path-token.sh "))
        .expect("docs/deploy.md runs scripts/path-token.sh")
        .to_owned();
    for name in [Some("podmutator-path-token-test"), None] {
        let mut cmd = match name {
            Some(name) => {
                let mut cmd = Command::new(root().join("scripts/path-token.sh"));
                cmd.arg(name);
                cmd
            }
            None => {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", &documented]).current_dir(root());
                cmd
            }
        };
        let out = cmd
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .envs(moto.env("us-east-1"))
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.trim();
        let (hash, arn) = line
            .strip_prefix("PathTokenSha256=")
            .and_then(|r| r.split_once(" PathTokenSecretArn="))
            .unwrap_or_else(|| panic!("{line}"));
        assert!(
            hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{hash}"
        );
        assert!(
            arn.starts_with("arn:aws:secretsmanager:us-east-1:"),
            "{arn}"
        );
        let secret = client
            .get_secret_value()
            .secret_id(arn)
            .send()
            .await
            .unwrap();
        let stored = secret.name().unwrap();
        match name {
            Some(name) => assert_eq!(stored, name),
            None => assert!(default_name.is_match(stored), "{stored}"),
        }
        let token = secret.secret_string().unwrap();
        assert_eq!(token.len(), 48);
        assert!(token.bytes().all(|b| b.is_ascii_alphanumeric()));
        use sha2::Digest;
        assert_eq!(hex::encode(sha2::Sha256::digest(token.as_bytes())), hash);
        assert!(!stdout.contains(token) && !String::from_utf8_lossy(&out.stderr).contains(token));
    }
}

/// Runs `cmd` with `input` on its stdin.
fn with_stdin(cmd: &mut Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Fields another field manager adds to the registration survive `kubectl
/// diff --server-side` and every apply (`-replace` included: server-side apply removes only its
/// own manager's fields), so `scripts/registration-drift.sh` compares the live object, less what
/// the API server writes, with the registration and names each foreign field. Against
/// tests/iac/fake_kubectl.py, which merges applies by field manager as the API server does, with
/// `podmutator webhook-config`'s YAML as the input (the SAM and GitOps path):
/// - as applied (the server's own fields and defaults added), and with every field the script
///   calls server-set written in by hand, the check exits 0;
/// - an always-false `matchConditions` entry, a `namespaceSelector.matchLabels` key and a second
///   webhook entry, each owned by another manager: exit 1, the field's path, value and manager
///   listed; still there, and still reported, after the registration is applied again; gone
///   after `kubectl replace` (docs/deploy.md), which the check then finds as registered;
/// - a defaulted field at another value than its default is foreign too.
///
/// The path token is never in the output; the second entry's copy of the URL shows its hash.
#[test]
fn registration_drift_names_foreign_fields_and_ignores_what_the_api_server_writes() {
    let dir = common::temp_dir("registration-drift");
    let bin = common::fake_bin(&dir);
    let kube = dir.join("kube");
    std::fs::create_dir_all(&kube).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "{}").unwrap();
    let token = "DriftDriftDriftDriftDriftDriftDrift0123456789";
    let token_file = dir.join("token");
    std::fs::write(&token_file, token).unwrap();
    let rendered = run_ok(
        "podmutator webhook-config",
        common::bin()
            .args(["webhook-config", "--url", "https://podmutator.example.com"])
            .arg("--path-token-file")
            .arg(&token_file)
            .arg("--images"),
    );
    let rendered = String::from_utf8(rendered.stdout).unwrap();
    // The same object as JSON.
    let object = registration::mutating_webhook_configuration(&RegistrationOptions {
        url: Some("https://podmutator.example.com".into()),
        path_token: Some(token.into()),
        images: true,
        ..Default::default()
    });
    let secrets = "flyte-pod-webhook.flyte.org";
    assert_eq!(object["webhooks"][0]["name"], secrets);
    let live_file = kube.join("podmutator.json");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let kubectl = |args: &[&str]| {
        let out = with_stdin(
            Command::new(bin.join("kubectl"))
                .args(args)
                .env("FAKE_KUBE_DIR", &kube)
                .env("PATH", &path)
                .env_remove("FAKE_KUBE_CLUSTER"),
            &rendered,
        );
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let apply = || {
        kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "podmutator-terraform",
            "-f",
            "-",
        ])
    };
    let check = || -> (i32, String, String) {
        let out = with_stdin(
            Command::new(root().join("scripts/registration-drift.sh"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env("FAKE_KUBE_DIR", &kube)
                .env("PATH", &path)
                .env_remove("FAKE_KUBE_CLUSTER"),
            &rendered,
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(
            !stdout.contains(token) && !stderr.contains(token),
            "the drift check shows the path token"
        );
        (out.status.code().unwrap_or(-1), stdout, stderr)
    };
    let live = || -> Value { serde_json::from_slice(&std::fs::read(&live_file).unwrap()).unwrap() };
    let in_sync = |when: &str| {
        let (rc, stdout, stderr) = check();
        assert_eq!(rc, 0, "{when}: not in sync:\n{stdout}{stderr}");
        assert!(stderr.contains("is as registered"), "{when}: {stderr}");
    };

    // As applied: the fake server added uid, resourceVersion, generation, creationTimestamp,
    // managedFields and the defaults it fills in.
    apply();
    let applied = live();
    assert!(
        applied["metadata"]["uid"].is_string()
            && applied["metadata"]["managedFields"].is_array()
            && applied["webhooks"][0]["matchPolicy"] == "Equivalent",
        "the fake server wrote none of its fields: {applied}"
    );
    in_sync("as applied");

    // The registration plus every field the script calls server-set, written by hand: a client-
    // side `kubectl apply`'s annotation, two managers, the defaults at their default values.
    let mut server_set = object.clone();
    server_set["metadata"] = json!({
        "name": "podmutator",
        "uid": "5d2b0c4e-0000-4000-8000-000000000000",
        "resourceVersion": "4711",
        "generation": 3,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "selfLink": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/podmutator",
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": object.to_string()},
        "managedFields": [
            {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:webhooks": {}}},
            {"manager": "podmutator-terraform", "operation": "Apply", "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:webhooks": {}}}
        ]
    });
    for w in server_set["webhooks"].as_array_mut().unwrap() {
        for (k, v) in [
            ("failurePolicy", json!("Fail")),
            ("matchPolicy", json!("Equivalent")),
            ("namespaceSelector", json!({})),
            ("objectSelector", json!({})),
            ("reinvocationPolicy", json!("Never")),
            ("timeoutSeconds", json!(10)),
        ] {
            w.as_object_mut().unwrap().entry(k).or_insert(v);
        }
    }
    std::fs::write(&live_file, server_set.to_string()).unwrap();
    in_sync("with every server-set field");

    // A default at another value is someone's setting.
    let mut exact = server_set.clone();
    exact["webhooks"][1]["matchPolicy"] = "Exact".into();
    std::fs::write(&live_file, exact.to_string()).unwrap();
    let (rc, stdout, _) = check();
    assert_eq!(rc, 1, "{stdout}");
    assert!(
        stdout.contains(r#"webhooks[name=images.podmutator.io].matchPolicy = "Exact""#),
        "{stdout}"
    );

    // Each kind of foreign field, added by another field manager to the registration as applied.
    let shadow_hash = {
        use sha2::Digest;
        format!(
            "<token sha256:{}…>",
            &hex::encode(sha2::Sha256::digest(token.as_bytes()))[..12]
        )
    };
    let item = |name: &str| format!("k:{}", json!({"name": name}));
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, Value, &str); 3] = [
        (
            "an always-false matchConditions entry",
            |o| {
                o["webhooks"][0]["matchConditions"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "paused", "expression": "false"}))
            },
            json!({"f:webhooks": {item(secrets): {"f:matchConditions": {item("paused"): {".": {}, "f:name": {}, "f:expression": {}}}}}}),
            r#"webhooks[name=flyte-pod-webhook.flyte.org].matchConditions[name=paused] = {"name":"paused","expression":"false"} (field managers: policy-bot)"#,
        ),
        (
            "a namespaceSelector.matchLabels key",
            |o| o["webhooks"][0]["namespaceSelector"]["matchLabels"] = json!({"team": "pilot"}),
            json!({"f:webhooks": {item(secrets): {"f:namespaceSelector": {"f:matchLabels": {"f:team": {}}}}}}),
            r#"webhooks[name=flyte-pod-webhook.flyte.org].namespaceSelector.matchLabels.team = "pilot" (field managers: policy-bot)"#,
        ),
        (
            "a second webhook entry",
            |o| {
                let mut shadow = o["webhooks"][0].clone();
                shadow["name"] = "shadow.example.com".into();
                shadow["failurePolicy"] = "Ignore".into();
                o["webhooks"].as_array_mut().unwrap().push(shadow);
            },
            json!({"f:webhooks": {item("shadow.example.com"): {".": {}, "f:name": {}, "f:clientConfig": {"f:url": {}}}}}),
            "webhooks[name=shadow.example.com] = {",
        ),
    ];
    for (what, edit, owned, line) in cases {
        std::fs::remove_file(&live_file).unwrap();
        apply();
        let mut edited = live();
        edit(&mut edited);
        edited["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(json!({"manager": "policy-bot", "operation": "Apply", "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1", "fieldsV1": owned}));
        std::fs::write(&live_file, edited.to_string()).unwrap();
        let reported = |when: &str| {
            let (rc, stdout, stderr) = check();
            assert_eq!(rc, 1, "{what} {when}: not reported:\n{stdout}{stderr}");
            assert!(
                stdout.contains("Foreign fields: in the cluster, not in the registration")
                    && stdout.lines().any(|l| l.trim_start().starts_with(line)),
                "{what} {when}: not named ({line}):\n{stdout}"
            );
            assert!(
                stderr.contains("holds foreign fields") && stderr.contains("kubectl replace -f -"),
                "{what} {when}: {stderr}"
            );
            stdout
        };
        let stdout = reported("");
        if what == "a second webhook entry" {
            assert!(
                stdout.contains(&format!(
                    "https://podmutator.example.com/{shadow_hash}/mutate--v1-pod"
                )) && stdout.contains("(field managers: policy-bot)"),
                "the copied URL is not shown by its hash: {stdout}"
            );
        }
        // Applied again, as `terraform apply -replace` does: the field stays, and so does the
        // report.
        apply();
        assert_ne!(
            live(),
            applied,
            "{what}: the apply removed the foreign field"
        );
        reported("after another apply");
        // Replaced with the registration, as docs/deploy.md says: gone.
        kubectl(&["replace", "-f", "-"]);
        in_sync(&format!("{what}, replaced"));
    }
}

/// Every SAM command of docs/deploy.md runs as written. The runbook told users
/// to drop the previous token's hash with an empty `PreviousPathTokenSha256=`, which SAM CLI
/// refuses as an argument and drops inside a quoted override string (the stack then keeps the
/// old hash, and the old token stays valid); `--guided` cannot leave it empty. The template now
/// takes `none`. `tests/iac/check_sam_runbook.py` reads each documented `sam` command and
/// override span with SAM CLI's own parser and samconfig.toml (nothing dropped, every name a
/// parameter, every value within its constraints), and runs each `sam deploy` through SAM's own
/// change set code against a stand-in CloudFormation client that keeps previous values: the
/// first deploys need no prompt (and, with `--guided`, deploy the same stack when answered as
/// documented), the rotation and the removal run on the installed stack, and the reinstall
/// names nothing the deleted stack retained. Here: the function
/// starts with every configuration the runbook deploys, and holds `[new, previous]`, then the
/// new hash alone.
#[test]
fn every_sam_command_in_deploy_md_parses_with_sam_cli_and_deploys_what_it_says() {
    let scratch = Scratch::new("sam-runbook");
    let work = scratch.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let steps_file = scratch.path().join("steps.json");
    let out = run_ok(
        "tests/iac/check_sam_runbook.py",
        Command::new(tool("python"))
            .arg("tests/iac/check_sam_runbook.py")
            .arg(root())
            .arg(&work)
            .arg(&steps_file),
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let steps: Vec<Value> = serde_json::from_slice(&std::fs::read(&steps_file).unwrap()).unwrap();

    for s in &steps {
        let tag = format!("docs/deploy.md:{} ({})", s["line"], s["section"]);
        let out = run(
            &format!("{tag}: podmutator check-config"),
            crate::common::bin()
                .arg("check-config")
                .env("PODMUTATOR_CONFIG", s["config"].to_string()),
        );
        assert!(
            out.status.success(),
            "{tag}: the function would refuse to start after `{}`:\n{}",
            s["command"],
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let first: Vec<&Value> = steps
        .iter()
        .filter(|s| s["section"] == "Path B: SAM")
        .collect();
    for endpoint in ["alb", "http-api"] {
        assert!(
            first.iter().any(|s| s["changeSetType"] == "CREATE"
                && s["parameters"]["EndpointType"] == endpoint
                && !s["command"].as_str().unwrap().contains("--guided")),
            "no first deploy without prompts for {endpoint}: {first:?}"
        );
    }
    assert!(
        first
            .iter()
            .any(|s| s["command"].as_str().unwrap().ends_with(" --guided")),
        "the guided first deploy was not run"
    );

    let hashes: Vec<&Value> = steps
        .iter()
        .filter(|s| s["section"] == "Rotating the path token")
        .map(|s| &s["config"]["http"]["pathTokenSha256"])
        .collect();
    let installed = &first[0]["config"]["http"]["pathTokenSha256"];
    assert!(installed.is_string(), "{installed}");
    assert_eq!(
        hashes.len(),
        2,
        "the SAM rotation is two deploys: {hashes:?}"
    );
    let new = hashes[1];
    assert!(new.is_string() && new != installed, "{hashes:?}");
    assert_eq!(
        hashes[0],
        &json!([new, installed]),
        "step 1 keeps the installed hash beside the new one"
    );

    let alb = first
        .iter()
        .find(|s| s["parameters"]["EndpointType"] == "alb")
        .unwrap();
    sam_registration_runs_as_written(alb);
}

/// The first ```sh block of `doc` after `marker`.
fn sh_block_after<'d>(doc: &'d str, marker: &str) -> &'d str {
    let at = doc
        .find(marker)
        .unwrap_or_else(|| panic!("docs/deploy.md has no {marker:?}"));
    let block = &doc[at..];
    let block = &block[block.find("```sh\n").expect("an sh block") + "```sh\n".len()..];
    &block[..block.find("```").unwrap()]
}

/// The `out` function Path B's step 4 (`register`) defines, which the later SAM commands use.
fn out_function(register: &str) -> String {
    let out: String = register
        .lines()
        .take_while(|l| !l.starts_with('('))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(out.starts_with("out() {"), "{out}");
    out
}

/// docs/deploy.md's SAM rotation, as an operator runs it with `out` from Path B's step 4
/// (`register`): the commands up to `scripts/path-token.sh` as written, then the deploys with the
/// placeholders filled from what those printed (the hash deployed so far, the new secret's hash
/// and ARN), through a stand-in `sam` that records them. The hash read back is the one the stack
/// deployed; step 1 names the new secret and keeps that hash as the previous one; step 3 drops
/// it.
fn sam_rotation_runs_as_written(
    doc: &str,
    register: &str,
    dir: &Path,
    bin: &Path,
    env: &[(&str, String)],
    step: &Value,
) {
    let block = sh_block_after(
        doc,
        "**SAM** deploys each step, in the directory of `samconfig.toml`",
    );
    let out_fn = out_function(register);
    let cut = block
        .find("scripts/path-token.sh")
        .map(|i| i + block[i..].find('\n').unwrap() + 1)
        .unwrap();
    let (read, deploys) = block.split_at(cut);
    let sh = |script: &str| {
        run_ok(
            "docs/deploy.md's SAM rotation",
            Command::new("bash")
                .args(["-euo", "pipefail", "-c", &format!("{out_fn}{script}")])
                .current_dir(dir)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("PATH", format!("{}:/usr/bin:/bin", bin.display())),
        )
    };
    let printed = String::from_utf8(sh(read).stdout).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    let installed = step["config"]["http"]["pathTokenSha256"].as_str().unwrap();
    assert_eq!(lines.len(), 2, "{printed}");
    assert_eq!(lines[0], installed, "the hash deployed so far");
    let new: std::collections::BTreeMap<&str, &str> = lines[1]
        .split(' ')
        .map(|kv| kv.split_once('=').unwrap())
        .collect();
    let (hash, arn) = (new["PathTokenSha256"], new["PathTokenSecretArn"]);
    assert!(hash.len() == 64 && hash != installed, "{printed}");
    let calls = dir.join("sam-calls");
    let _ = std::fs::remove_file(&calls);
    sh(&deploys
        .replace("<new hash>", hash)
        .replace("<new arn>", arn)
        .replace("<the hash deployed so far>", lines[0]));
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        format!(
            "deploy --parameter-overrides PathTokenSha256={hash} PathTokenSecretArn={arn} PreviousPathTokenSha256={installed}\n\
             deploy --parameter-overrides PreviousPathTokenSha256=none\n"
        )
    );
}

/// docs/deploy.md's Path B step 4, the registration, as written, on the outputs of `step` (a
/// first deploy): the stack in moto with those outputs, its PathTokenSecretArn naming the token's
/// secret there; the stand-in `aws` and `kubectl` (tests/iac/fake_aws.py, fake_kubectl.py) and
/// this build as `podmutator` on PATH. The registration applied points every webhook at the
/// stack's domain through the token; the token is in none of the output and its file is gone.
/// The stack was protected first, as step 3 ends (termination protection). Then, on the same
/// stack: the SAM upgrade section's tail of the pre-traffic hook's log group (the output
/// `PreTrafficLogGroupName`) shows the line a failed check logged; the SAM drift check finds the
/// registration in sync; the SAM rotation ([`sam_rotation_runs_as_written`]) runs on the function
/// the stack made; a plain `sam delete` is refused with the stack and the registration in place;
/// the SAM removal deletes the registration, lifts both protections and deletes the stack (SAM
/// CLI's `sam delete`).
fn sam_registration_runs_as_written(step: &Value) {
    let moto = common::aws::Moto::start();
    let scratch = Scratch::new("sam-register");
    let dir = scratch.path();
    let token = "SamRegister0Token1Never2Printed3abcdefghijk";
    let env = [
        ("AWS_ENDPOINT_URL", moto.url()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "eu-west-1".into()),
        ("AWS_DEFAULT_REGION", "eu-west-1".into()),
        ("AWS_CONFIG_FILE", "/dev/null".into()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".into()),
    ];
    // The token's secret, as scripts/path-token.sh makes it, and the stack naming it.
    let mut outputs = step["outputs"].clone();
    let domain = step["parameters"]["DomainName"]
        .as_str()
        .unwrap()
        .to_owned();
    let stack = r##"
import boto3, io, json, sys, time, zipfile
outputs = json.loads(sys.argv[2])
# The function, its configuration as deployed, published behind the alias `live`.
role = boto3.client("iam").create_role(RoleName="podmutator-fn", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
code = io.BytesIO()
with zipfile.ZipFile(code, "w") as z:
    z.writestr("bootstrap", "#!/bin/sh\n")
lam = boto3.client("lambda")
name = outputs["FunctionName"] = "podmutator-Function-5JQ9W2R8XYZA"
lam.create_function(FunctionName=name, Runtime="provided.al2023", Role=role, Handler="bootstrap",
                    Code={"ZipFile": code.getvalue()},
                    Environment={"Variables": {"PODMUTATOR_CONFIG": sys.argv[3]}})
lam.create_alias(FunctionName=name, Name="live", FunctionVersion=lam.publish_version(FunctionName=name)["Version"])
outputs["PathTokenSecretArn"] = boto3.client("secretsmanager").create_secret(
    Name="podmutator-path-token", SecretString=sys.argv[1])["ARN"]
# The hook's log group, named as CloudFormation names it, with a failed check's line.
group = outputs["PreTrafficLogGroupName"] = "podmutator-PreTrafficHookLogGroup-7Q2XKZ4N1ABC"
logs = boto3.client("logs")
logs.create_log_group(logGroupName=group)
logs.create_log_stream(logGroupName=group, logStreamName="hook")
logs.put_log_events(logGroupName=group, logStreamName="hook", logEvents=[{
    "timestamp": int(time.time() * 1000),
    "message": "pre-traffic check: Failed: the new version answered status 404 (the token was refused)"}])
template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {k: {"Value": v} for k, v in outputs.items() if isinstance(v, str)}}
boto3.client("cloudformation").create_stack(StackName="podmutator", TemplateBody=json.dumps(template))
"##;
    outputs["PathTokenSecretArn"] = json!("");
    run_ok(
        "the SAM stack in moto",
        Command::new(tool("python"))
            .args([
                "-c",
                stack,
                token,
                &outputs.to_string(),
                &step["config"].to_string(),
            ])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
    );
    let bin = common::fake_bin(dir);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podmutator"), bin.join("podmutator")).unwrap();
    // `sam`: SAM CLI's own `delete`; a deploy (whose reading by SAM CLI is checked above) is
    // recorded.
    std::fs::copy(root().join("samconfig.toml"), dir.join("samconfig.toml")).unwrap();
    let real_sam = PathBuf::from(tool("python")).with_file_name("sam");
    let calls = dir.join("sam-calls");
    std::fs::write(
        bin.join("sam"),
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$1\" in\n  delete) exec '{}' \"$@\" ;;\n  deploy) exit 0 ;;\n  *) exit 3 ;;\nesac\n",
            calls.display(),
            real_sam.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        bin.join("sam"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let kube = dir.join("kube");
    std::fs::create_dir_all(&kube).unwrap();
    // The repository's scripts, and a kubeconfig for the drift check's `--kubeconfig`.
    std::os::unix::fs::symlink(root().join("scripts"), dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join(".kube")).unwrap();
    std::fs::write(dir.join(".kube/config"), "{}").unwrap();
    let doc = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    // A script run as an operator types it, answering `sam delete`'s question: success and what
    // it said.
    let answered = |script: &str| -> (bool, String) {
        let mut sh = Command::new("bash");
        sh.args(["-euo", "pipefail", "-c", script])
            .current_dir(dir)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("FAKE_KUBE_DIR", &kube)
            .env("HOME", dir)
            .env("SAM_CLI_TELEMETRY", "0")
            .env_remove("PODMUTATOR_CONFIG")
            .env_remove("PODMUTATOR_CONFIG_FILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = sh.spawn().unwrap();
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"y\n").unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    // Path B's step 3 ends by protecting the stack.
    let protect = doc
        .lines()
        .find(|l| l.contains("update-termination-protection --enable-termination-protection"))
        .expect("Path B's step 3 protects the stack")
        .trim();
    let (ok, said) = answered(protect);
    assert!(ok, "{protect}: {said}");
    // Then, before registering, the first deploy's configuration is checked by hand (CodeDeploy
    // checks none): the function's own check passes the stack's, and names a setting it refuses
    // once `live` carries one.
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_podmutator"),
        dir.join("target/release/podmutator"),
    )
    .unwrap();
    let check = sh_block_after(&doc, "**What CloudFormation cannot check.**");
    let (ok, said) = answered(check);
    assert!(
        ok && said.contains("\"secretManagerTypes\""),
        "{check}: {said}"
    );
    run_ok(
        "a refused configuration behind `live`",
        Command::new(tool("python"))
            .args([
                "-c",
                "import boto3\nlam = boto3.client('lambda'); name = 'podmutator-Function-5JQ9W2R8XYZA'\nlam.update_function_configuration(FunctionName=name, Environment={'Variables': {'PODMUTATOR_CONFIG': '{\"mutators\": {\"secretz\": {}}}'}})\nlam.update_alias(FunctionName=name, Name='live', FunctionVersion=lam.publish_version(FunctionName=name)['Version'])",
            ])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
    );
    let (ok, said) = answered(check);
    assert!(
        !ok && said.contains("unknown mutator `secretz`"),
        "{check}: {said}"
    );
    run_ok(
        "the stack's configuration behind `live` again",
        Command::new(tool("python"))
            .args([
                "-c",
                "import boto3, sys\nlam = boto3.client('lambda'); name = 'podmutator-Function-5JQ9W2R8XYZA'\nlam.update_function_configuration(FunctionName=name, Environment={'Variables': {'PODMUTATOR_CONFIG': sys.argv[1]}})\nlam.update_alias(FunctionName=name, Name='live', FunctionVersion=lam.publish_version(FunctionName=name)['Version'])",
                &step["config"].to_string(),
            ])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
    );
    let block: String = sh_block_after(&doc, "4. **Register**")
        .lines()
        .map(|l| format!("{}\n", l.trim_start()))
        .collect();
    let (ok, printed) = answered(&block);
    assert!(ok, "docs/deploy.md's SAM registration: {printed}");
    assert!(!printed.contains(token), "the token was printed: {printed}");
    assert!(
        printed.contains("podmutator webhook-config --url https://")
            && printed.contains(" created"),
        "{printed}"
    );
    assert!(!dir.join("token").exists(), "the token's file is removed");
    // The upgrade section's look at a failed pre-traffic check, on the same stack.
    let (ok, shown) = answered(sh_block_after(
        &doc,
        "CodeDeploy's status carries no message",
    ));
    assert!(
        ok && shown.contains("pre-traffic check: Failed: the new version answered status 404"),
        "docs/deploy.md's pre-traffic log tail: {shown}"
    );
    let applied: Value =
        serde_json::from_slice(&std::fs::read(kube.join("podmutator.json")).unwrap()).unwrap();
    // The drift check as "Registration drift" writes it for SAM, with `out` from step 4: in
    // sync right after the registration.
    let drift = doc
        .find("# SAM or GitOps: the same command that registered it")
        .expect("the SAM drift check");
    let drift = &doc[drift..];
    let drift = &drift[..drift.find("```").unwrap()];
    let (ok, said) = answered(&format!("{}{drift}", out_function(&block)));
    assert!(ok, "the SAM drift check: {said}");
    assert!(!said.contains(token), "the token was printed: {said}");
    assert!(!dir.join("token").exists(), "the token's file is removed");
    sam_rotation_runs_as_written(&doc, &block, dir, &bin, &env, step);
    let webhooks = applied["webhooks"].as_array().unwrap();
    assert!(!webhooks.is_empty());
    for w in webhooks {
        let url = w["clientConfig"]["url"].as_str().unwrap();
        assert!(
            url.starts_with(&format!("https://{domain}/{token}/")),
            "{} is not through the token",
            w["name"]
        );
    }

    // The SAM removal, as written, answering `sam delete`'s question: the registration goes
    // first, then the deploy that lifts the ALB's protection (SAM CLI's reading of it is
    // checked above; a stand-in here, which records it) and the stack's termination
    // protection, then SAM CLI's own `sam delete` against moto, with the repository's
    // samconfig.toml.
    let removal = sh_block_after(&doc, "**SAM**, in the directory of `samconfig.toml`");
    let describe = |what: &str| {
        run(
            what,
            Command::new(tool("python"))
                .args([
                    "-c",
                    "import boto3; boto3.client('cloudformation').describe_stacks(StackName='podmutator')",
                ])
                .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
        )
    };
    // A plain `sam delete` of the protected stack: refused, nothing deleted.
    let (ok, said) = answered("sam delete");
    assert!(!ok, "a protected stack was deleted: {said}");
    assert!(
        said.contains("cannot be deleted while TerminationProtection is enabled"),
        "{said}"
    );
    assert!(
        describe("the stack after a refused delete")
            .status
            .success()
    );
    assert!(kube.join("podmutator.json").exists());
    let _ = std::fs::remove_file(&calls);
    let (ok, said) = answered(removal);
    assert!(ok, "the SAM removal failed: {said}");
    assert!(said.contains("Deleted successfully"), "{said}");
    assert!(
        !kube.join("podmutator.json").exists(),
        "the registration is deleted"
    );
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "deploy --parameter-overrides AlbDeletionProtection=false\ndelete\n"
    );
    let gone = describe("describe-stacks after the removal");
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("does not exist"),
        "the stack is deleted"
    );
}

/// For SAM: before CodeDeploy moves the `live` alias, template.yaml's
/// pre-traffic hook (`deploy/sam/pre-traffic-hook/hook.py`) invokes the new version with
/// Terraform's canned review and reports Succeeded only for status 200, the review's uid and
/// `allowed: true`. `tests/iac/check_pre_traffic_hook.py` runs the hook's handler as Lambda would,
/// against moto (the token in Secrets Manager, the function and a published version) with each
/// case's stand-in answering for the version (moto runs no function code) and botocore's Stubber
/// for CodeDeploy (moto has no lifecycle hooks), which takes exactly one report. Each case: the
/// status reported, the reason the hook logs (naming the status, the function error, the
/// `allowed` value, the uid or the secret), and the invocations: the published version itself,
/// through the token (or without one, with the token off), none when the token cannot be read.
/// The token is in none of the output, even when a version echoes the path back.
#[test]
fn the_sam_pre_traffic_hook_reports_succeeded_only_for_a_version_that_answers_allowed() {
    let hook_event = root().join("deploy/sam/pre-traffic-hook/pre-traffic-event.json");
    assert_eq!(
        std::fs::read(&hook_event).unwrap(),
        std::fs::read(root().join("terraform/pre-traffic-event.json")).unwrap(),
        "{} must be terraform/pre-traffic-event.json byte for byte: both checks send one review",
        hook_event.display()
    );
    let scratch = Scratch::new("pre-traffic-hook");
    let token = "PreTraffic0Hook1Token2Never3Shown4abcdefghijkl";
    let token_file = scratch.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let results_file = scratch.path().join("results.json");
    let out = run_ok(
        "tests/iac/check_pre_traffic_hook.py",
        Command::new(tool("python"))
            .arg("tests/iac/check_pre_traffic_hook.py")
            .arg(root())
            .arg(&token_file)
            .arg(&results_file),
    );
    let results = std::fs::read_to_string(&results_file).unwrap();
    for (what, text) in [
        ("stdout", String::from_utf8_lossy(&out.stdout).into_owned()),
        ("stderr", String::from_utf8_lossy(&out.stderr).into_owned()),
        ("results", results.clone()),
    ] {
        assert!(
            !text.contains(token),
            "the path token is in the hook's {what}"
        );
    }
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Value> = serde_json::from_str(&results).unwrap();

    // (case, status reported, what the reason names, paths the version was sent)
    let want: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "answers-allowed",
            "Succeeded",
            &["status 200", "allowed: true"],
            &["token"],
        ),
        (
            "answers-allowed-base64",
            "Succeeded",
            &["status 200"],
            &["token"],
        ),
        (
            "accepts-another-token",
            "Failed",
            &["status 404", "not found"],
            &["token"],
        ),
        (
            "function-error",
            "Failed",
            &["FunctionError", "Runtime.ExitError", "exit status 1"],
            &["token"],
        ),
        (
            "answers-allowed-false",
            "Failed",
            &[
                "status 200",
                "allowed: false",
                "refused by the version under test",
            ],
            &["token"],
        ),
        (
            "answers-another-uid",
            "Failed",
            &["uid 'someone-else'"],
            &["token"],
        ),
        (
            "echoes-the-path",
            "Failed",
            &["status 500", "/<path token>/"],
            &["token"],
        ),
        ("token-off", "Succeeded", &["status 200"], &["no token"]),
        (
            "token-on-without-secret-arn",
            "Failed",
            &["PathTokenSecretArn is empty"],
            &[],
        ),
        (
            "secret-missing",
            "Failed",
            &["GetSecretValue", "ResourceNotFoundException"],
            &[],
        ),
        (
            "secret-not-a-token",
            "Failed",
            &["does not hold a path token"],
            &[],
        ),
    ];
    assert_eq!(
        results
            .iter()
            .map(|r| r["case"].as_str().unwrap())
            .collect::<Vec<_>>(),
        want.iter().map(|w| w.0).collect::<Vec<_>>()
    );
    for (r, (case, status, names, paths)) in results.iter().zip(want) {
        assert!(r.get("error").is_none(), "{case}: {}", r["error"]);
        assert_eq!(
            r["reported"],
            json!([status]),
            "{case}: reported to CodeDeploy"
        );
        assert_eq!(r["returned"]["status"], *status, "{case}: {r}");
        let reason = r["returned"]["reason"].as_str().unwrap();
        for name in *names {
            assert!(
                reason.contains(name),
                "{case}: the reason names {name:?}: {reason}"
            );
        }
        if *status == "Failed" {
            assert!(
                reason.contains("the live alias stays on the version it names"),
                "{case}: {reason}"
            );
        }
        let level = if *status == "Succeeded" {
            "INFO"
        } else {
            "ERROR"
        };
        assert_eq!(
            r["logs"],
            json!([format!("{level} pre-traffic check {status}: {reason}")]),
            "{case}: the hook logs its outcome once"
        );
        let invocations = r["invocations"].as_array().unwrap();
        assert_eq!(
            invocations
                .iter()
                .map(|i| i["path"].as_str().unwrap())
                .collect::<Vec<_>>(),
            paths.to_vec(),
            "{case}: {invocations:?}"
        );
        for i in invocations {
            assert_eq!(i["function"], "podmutator", "{case}");
            assert_eq!(
                i["version"], r["published"],
                "{case}: the published version itself"
            );
            assert_eq!(i["uid"], "podmutator-pre-traffic-check", "{case}");
        }
    }
}

/// For SAM: the pull-through cache rules belong to the account and region's
/// registry, and other stacks rewrite to them; deleting the stack that made them (or switching a
/// cache off in it) must not take them away. Every rule of template.yaml is retained.
#[test]
fn sam_keeps_its_pull_through_cache_rules_when_its_stack_goes() {
    let text = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let resources = &text[text.find("\nResources:\n").unwrap()..];
    // Each resource: its two-space-indented name, then its lines up to the next one.
    let mut blocks: Vec<(String, Vec<&str>)> = Vec::new();
    for line in resources.lines().skip(2) {
        let header = line
            .strip_prefix("  ")
            .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()) && l.ends_with(':'));
        match (header, blocks.last_mut()) {
            (Some(name), _) => blocks.push((name.to_owned(), Vec::new())),
            (None, Some((_, lines))) => lines.push(line.trim()),
            (None, None) => {}
        }
    }
    let rules: Vec<_> = blocks
        .iter()
        .filter(|(_, lines)| lines.contains(&"Type: AWS::ECR::PullThroughCacheRule"))
        .collect();
    assert_eq!(rules.len(), 5, "one rule per upstream");
    for (name, lines) in rules {
        assert!(
            lines.contains(&"DeletionPolicy: Retain")
                && lines.contains(&"UpdateReplacePolicy: Retain"),
            "{name} is not retained"
        );
    }
}
