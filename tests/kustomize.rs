//! The in-cluster install (`deploy/kubernetes/`): the base and each overlay render with
//! `kubectl kustomize` (kubectl is part of the machine image: missing is an error), every
//! built-in object passes `kubernetes-validate --strict`, the cert-manager objects carry what
//! cert-manager requires, and the registration is the renderer's, pointing at the Service and
//! the paths `serve` answers. `PODMUTATOR_BLESS=1 cargo test --test integration kustomize::`
//! rewrites `deploy/kubernetes/base/registration.yaml` from the renderer; review the diff.

use std::path::PathBuf;
use std::process::Command;

use podmutator::registration::{
    RegistrationOptions, ServiceRef, mutating_webhook_configuration, to_yaml,
};
use podmutator::transport::http;
use serde_json::{Value, json};

use crate::common;

const NAMESPACE: &str = "podmutator";
const OVERLAYS: [&str; 4] = [
    "cert-manager",
    "provided-ca",
    "path-token",
    "self-managed-ca",
];

fn deploy_dir(rel: &str) -> PathBuf {
    common::root().join("deploy/kubernetes").join(rel)
}

/// `kubectl kustomize` of `deploy/kubernetes/<rel>`, parsed into its objects. `provided-ca`
/// is rendered from a copy of the tree holding a certificate made for the test, as an
/// operator's files would sit there.
fn render(rel: &str) -> Vec<Value> {
    if rel == "overlays/provided-ca" {
        let (dir, _) = provided_ca_copy();
        return render_dir(rel, &dir);
    }
    if rel == "overlays/path-token" {
        let (dir, _) = provided_ca_copy();
        path_token_files(&dir);
        return render_dir(rel, &dir.join("../path-token"));
    }
    render_dir(rel, &deploy_dir(rel))
}

/// A copy of `deploy/kubernetes` with `tls.crt`, `tls.key` and `ca.crt` in `provided-ca`;
/// returns that overlay's directory and the CA's PEM.
fn provided_ca_copy() -> (PathBuf, Vec<u8>) {
    let root = common::temp_dir("kustomize-provided-ca");
    let status = Command::new("cp")
        .arg("-r")
        .arg(common::root().join("deploy"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(status.success());
    let dir = root.join("deploy/kubernetes/overlays/provided-ca");
    let files = podmutator::transport::tls::ensure_certs(
        &dir,
        true,
        &[format!("podmutator.{NAMESPACE}.svc")],
    )
    .unwrap();
    assert!(files.generated);
    let ca = std::fs::read(&files.ca).unwrap();
    (dir, ca)
}

/// In the copy of the tree holding `provided_ca` (its overlay directory given), the path-token
/// component's git-ignored files made with the commands its kustomization.yaml documents (the
/// renderer through the real binary, the hash through `sha256sum`); returns the token.
fn path_token_files(provided_ca: &std::path::Path) -> String {
    let component = provided_ca.join("../../components/path-token");
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    std::fs::write(component.join("path-token"), format!("{token}\n")).unwrap();
    let out = crate::common::bin()
        .args([
            "webhook-config",
            "--service",
            "podmutator/podmutator",
            "--path-token-file",
            "path-token",
        ])
        .current_dir(&component)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(component.join("registration.yaml"), &out.stdout).unwrap();
    let status = Command::new("sh")
        .args(["-c", &common::path_token_recipe()[2]])
        .current_dir(&component)
        .status()
        .unwrap();
    assert!(status.success());
    token.to_owned()
}

fn render_dir(rel: &str, dir: &std::path::Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("kubectl (1.32+, with kustomize) is required on PATH to render {rel}: {e}")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert!(!docs.is_empty(), "{rel} rendered nothing");
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

/// What the renderer prints for the base: the Service, no path token (see docs/deploy.md).
fn rendered_registration() -> String {
    to_yaml(&mutating_webhook_configuration(&RegistrationOptions {
        service: Some(ServiceRef {
            namespace: NAMESPACE.into(),
            name: "podmutator".into(),
            port: 443,
        }),
        ..Default::default()
    }))
}

#[test]
fn committed_registration_is_the_renderers() {
    let path = deploy_dir("base/registration.yaml");
    let want = rendered_registration();
    if std::env::var_os("PODMUTATOR_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from `podmutator webhook-config --service {NAMESPACE}/podmutator --no-path-token`: run PODMUTATOR_BLESS=1 cargo test --test integration kustomize:: and review the diff\n--- committed\n{have}\n--- rendered\n{want}",
        path.display()
    );
}

/// Every built-in kind, for each version of [`common::K8S_VERSIONS`]; the tool must say it
/// validated each object (a kind it does not know would otherwise pass silently).
fn assert_valid(rel: &str, docs: &[Value]) {
    let kv = common::tool("kubernetes-validate");
    let dir = common::temp_dir(&format!("kustomize-{}", rel.replace('/', "-")));
    let mut files = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let group = doc["apiVersion"].as_str().unwrap_or_default();
        if group.starts_with("cert-manager.io/") {
            continue; // a CRD: checked by cert_manager_objects_have_what_cert_manager_requires
        }
        let file = dir.join(format!("{i:02}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
        let kind = doc["kind"].as_str().unwrap().to_lowercase();
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        files.push((file, kind, name));
    }
    for version in common::K8S_VERSIONS {
        let out = Command::new(&kv)
            .args(["--strict", "-k", version])
            .args(files.iter().map(|f| &f.0))
            .output()
            .expect("kubernetes-validate runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{rel}: kubernetes-validate --strict -k {version} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let minor = version.trim_end_matches(".0");
        for (file, kind, name) in &files {
            let want = format!(
                "{} passed for resource {kind}/{name} against version {minor}",
                file.display()
            );
            assert!(
                stdout.lines().any(|l| l.ends_with(&want)),
                "{rel}: {kind}/{name} not validated against {version}:\n{stdout}"
            );
        }
    }
}

#[test]
fn base_and_overlays_render_valid_objects() {
    for rel in std::iter::once("base".to_owned()).chain(OVERLAYS.map(|o| format!("overlays/{o}"))) {
        let docs = render(&rel);
        for kind in [
            "Namespace",
            "ServiceAccount",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "MutatingWebhookConfiguration",
        ] {
            assert!(
                docs.iter().any(|d| d["kind"] == kind),
                "{rel} has no {kind}"
            );
        }
        for d in &docs {
            let namespaced = !matches!(
                d["kind"].as_str(),
                Some(
                    "Namespace"
                        | "MutatingWebhookConfiguration"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                )
            );
            if namespaced {
                assert_eq!(
                    d["metadata"]["namespace"], NAMESPACE,
                    "{rel}: {} {}",
                    d["kind"], d["metadata"]["name"]
                );
            }
        }
        assert_valid(&rel, &docs);
    }
}

/// The registration reaches the Service on its port, at paths `serve` routes, and skips the
/// webhook's own namespace in every entry.
#[test]
fn registration_points_at_the_service_and_skips_its_namespace() {
    let docs = render("base");
    let service = find(&docs, "Service", "podmutator");
    let port = &service["spec"]["ports"][0];
    let deployment = find(&docs, "Deployment", "podmutator");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(port["targetPort"], container["ports"][0]["name"]);
    let routes = [
        http::PATH_SECRETS,
        http::PATH_MANAGED_POD,
        http::PATH_MANAGED_NAMESPACE,
        http::PATH_IMAGE_BUILDER,
        http::PATH_IMAGES,
    ];
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    let hooks = registration["webhooks"].as_array().unwrap();
    assert!(!hooks.is_empty());
    for w in hooks {
        let svc = &w["clientConfig"]["service"];
        assert_eq!(svc["name"], service["metadata"]["name"], "{}", w["name"]);
        assert_eq!(svc["namespace"], NAMESPACE, "{}", w["name"]);
        assert_eq!(svc["port"], port["port"], "{}", w["name"]);
        let path = svc["path"].as_str().unwrap();
        assert!(routes.contains(&path), "{}: {path}", w["name"]);
        assert!(w["clientConfig"].get("url").is_none());
        let exprs = w["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap();
        assert!(
            exprs.contains(&json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]})),
            "{}: {exprs:?}",
            w["name"]
        );
        assert!(
            matches!(w["failurePolicy"].as_str(), Some("Fail" | "Ignore")),
            "{}",
            w["name"]
        );
    }
}

#[test]
fn deployment_runs_restricted_and_highly_available() {
    let docs = render("base");
    let d = find(&docs, "Deployment", "podmutator");
    let spec = &d["spec"]["template"]["spec"];
    assert!(d["spec"]["replicas"].as_u64().unwrap() >= 2);
    assert_eq!(
        spec["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(spec["automountServiceAccountToken"], false);
    for c in spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true);
        assert_eq!(sc["runAsUser"], 65532);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        assert!(c["resources"]["requests"]["cpu"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());
        assert!(c["readinessProbe"].is_object() && c["livenessProbe"].is_object());
    }
    let pdb = find(&docs, "PodDisruptionBudget", "podmutator");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let ns = find(&docs, "Namespace", NAMESPACE);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
}

/// The committed config passes the start-up gate `serve` runs, and is the one mounted where
/// the container's `--config` points.
#[test]
fn config_passes_check_config_and_is_the_one_mounted() {
    let file = deploy_dir("base/config.yaml");
    let out = crate::common::bin()
        .args(["check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check-config refused {}:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let effective: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(effective["webhook"]["certDir"], "/etc/webhook/certs");
    assert_eq!(effective["webhook"]["localCert"], false);

    let docs = render("base");
    let d = find(&docs, "Deployment", "podmutator");
    let spec = &d["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    // SIGTERM: the drain (readiness fails, the port answers) and then up to 20 s for the
    // requests in flight, within the grace period the kubelet gives before SIGKILL.
    let drain = effective["http"]["drainSeconds"].as_u64().unwrap();
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        drain >= 5,
        "the drain covers the endpoint's removal: {drain} s"
    );
    assert!(
        grace >= drain + 20 + 5,
        "grace {grace} s against a drain of {drain} s + 20 s"
    );
    assert_eq!(
        c["args"],
        json!(["serve", "--config", "/etc/podmutator/config.yaml"])
    );
    assert_eq!(
        c["ports"][0]["containerPort"],
        effective["webhook"]["listenPort"]
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mounted = |path: &str| {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("nothing mounted at {path}"));
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap()
            .clone()
    };
    let config_volume = mounted("/etc/podmutator");
    let cm_name = config_volume["configMap"]["name"].as_str().unwrap();
    let cm = find(&docs, "ConfigMap", cm_name);
    let committed: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mounted_config: Value =
        serde_saphyr::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(mounted_config, committed);
    let certs = mounted(effective["webhook"]["certDir"].as_str().unwrap());
    assert_eq!(certs["secret"]["secretName"], "podmutator-tls");

    // Readiness, the scrape annotations and the NetworkPolicy all name the probe port the
    // configuration opens (plain HTTP, no path token).
    let metrics_port = &effective["webhook"]["metricsPort"];
    assert!(metrics_port.is_u64(), "{effective}");
    let named = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a container port named metrics");
    assert_eq!(&named["containerPort"], metrics_port);
    let ready = &c["readinessProbe"]["httpGet"];
    assert_eq!(ready["port"], "metrics");
    assert_eq!(ready["scheme"], "HTTP");
    assert_eq!(ready["path"], "/healthz");
    let annotations = &d["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], metrics_port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let policy = find(&docs, "NetworkPolicy", "podmutator");
    let admits = |port: &str| {
        policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rule| {
                rule["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"] == port))
            })
    };
    assert!(admits("webhook") && admits("metrics"), "{policy}");
}

/// kubernetes-validate has no cert-manager schemas: what cert-manager requires is checked here,
/// and that the serving certificate is the Secret mounted, for the Service's names, and the one
/// the CA injector reads.
#[test]
fn cert_manager_objects_have_what_cert_manager_requires() {
    let docs = render("overlays/cert-manager");
    for d in docs.iter().filter(|d| {
        d["apiVersion"]
            .as_str()
            .unwrap_or("")
            .starts_with("cert-manager.io/")
    }) {
        assert_eq!(d["apiVersion"], "cert-manager.io/v1");
        match d["kind"].as_str().unwrap() {
            "Issuer" => assert!(
                d["spec"]["selfSigned"].is_object() || d["spec"]["ca"]["secretName"].is_string(),
                "{d}"
            ),
            "Certificate" => {
                assert!(d["spec"]["secretName"].is_string(), "{d}");
                let issuer = d["spec"]["issuerRef"]["name"].as_str().unwrap();
                find(&docs, "Issuer", issuer);
            }
            other => panic!("unexpected cert-manager kind {other}"),
        }
    }
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    let from = registration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("the registration asks for the CA to be injected");
    let (ns, name) = from.split_once('/').unwrap();
    assert_eq!(ns, NAMESPACE);
    let serving = find(&docs, "Certificate", name);
    assert_eq!(serving["spec"]["secretName"], "podmutator-tls");
    let dns: Vec<&str> = serving["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        dns.contains(&format!("podmutator.{NAMESPACE}.svc").as_str()),
        "{dns:?}"
    );
    let ca_issuer = find(
        &docs,
        "Issuer",
        serving["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    let ca_cert = docs
        .iter()
        .find(|d| {
            d["kind"] == "Certificate"
                && d["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
        })
        .expect("the CA issuer's Secret comes from a Certificate");
    assert_eq!(ca_cert["spec"]["isCA"], true);
}

/// The provided CA reaches the registration as its `caBundle`, and the certificate the
/// Deployment mounts is the Secret made from the operator's files.
#[test]
fn provided_ca_is_the_registrations_ca_bundle() {
    use base64::Engine;
    let (dir, ca) = provided_ca_copy();
    let docs = render_dir("overlays/provided-ca", &dir);
    let secret = find(&docs, "Secret", "podmutator-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(secret["data"][key].is_string(), "no {key} in {secret}");
    }
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    for w in registration["webhooks"].as_array().unwrap() {
        // kustomize wraps long base64 at 76 characters; the API server's decoder (Go's
        // encoding/base64, as for every []byte field) skips the line breaks.
        let text: String = w["clientConfig"]["caBundle"]
            .as_str()
            .unwrap()
            .chars()
            .filter(|c| !matches!(c, '\n' | '\r'))
            .collect();
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(bundle, ca, "{}", w["name"]);
    }
}

/// A real `podmutator serve`, started with the base's `config.yaml` and the certificate files
/// the provided-ca Secret is made of, answers every path of the rendered registration over TLS
/// verified with the rendered `caBundle` for the Service's DNS name.
#[tokio::test]
async fn serve_answers_the_rendered_paths_with_the_rendered_ca() {
    use base64::Engine;
    use std::io::BufRead;
    let (dir, _) = provided_ca_copy();
    let docs = render_dir("overlays/provided-ca", &dir);
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    let port = common::free_port();
    // Only where it listens and reads its certificate differ from the committed file.
    let metrics_port = common::free_port();
    let overrides = json!({
        "webhook": {"certDir": dir, "listenPort": port, "metricsPort": metrics_port},
        "http": {"listenAddress": "127.0.0.1", "drainSeconds": 0}
    });
    let mut child = crate::common::bin()
        .args(["serve", "--config"])
        .arg(deploy_dir("base/config.yaml"))
        .env("PODMUTATOR_CONFIG", overrides.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("serve logs \"serving https\" within 30 s");
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        if v["message"] == "serving https" {
            break v;
        }
    };
    assert_eq!(started["certs_generated"], false, "{started}");
    let review =
        std::fs::read(common::root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"))
            .unwrap();
    let host = format!("podmutator.{NAMESPACE}.svc");
    for w in registration["webhooks"].as_array().unwrap() {
        let text: String = w["clientConfig"]["caBundle"]
            .as_str()
            .unwrap()
            .chars()
            .filter(|c| !matches!(c, '\n' | '\r'))
            .collect();
        let ca = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        let path = format!(
            "{}?timeout=10s",
            w["clientConfig"]["service"]["path"].as_str().unwrap()
        );
        let (status, body) = common::https_request(
            port,
            &ca,
            &host,
            "POST",
            &path,
            Some("application/json"),
            &review,
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}: TLS to {host} with the rendered caBundle: {e}",
                w["name"]
            )
        });
        assert_eq!(
            status,
            200,
            "{}: {}",
            w["name"],
            String::from_utf8_lossy(&body)
        );
        assert_eq!(common::response(&body)["allowed"], true, "{}", w["name"]);
    }
    // The rendered readiness probe, as the kubelet sends it, on the probe port; its /metrics
    // counted one admission per entry.
    let d = find(&docs, "Deployment", "podmutator");
    let ready = &d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"];
    let (status, body) = plain_get(metrics_port, ready["path"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{body}");
    let (status, metrics) = plain_get(metrics_port, "/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    let admitted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("podmutator_admissions_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        admitted as usize,
        registration["webhooks"].as_array().unwrap().len(),
        "{metrics}"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    assert!(child.wait().unwrap().success());
}

/// The path-token component over the provided CA: every rendered path is the base's under the
/// token, the caBundle and the namespace exclusion stay, the Deployment's configuration holds
/// the token's hash only; a real `serve` with what the rendered Deployment sets answers every
/// rendered path, refuses the same paths without the token, and is ready on the probe port.
#[tokio::test]
async fn path_token_component_puts_every_path_under_the_token_and_serve_holds_only_its_hash() {
    use base64::Engine;
    use sha2::Digest as _;
    let (dir, ca) = provided_ca_copy();
    let token = path_token_files(&dir);
    // The component over provided-ca, as an operator's overlay would combine them.
    let overlay = dir.join("../with-token");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../provided-ca\ncomponents:\n  - ../../components/path-token\n",
    )
    .unwrap();
    let docs = render_dir("overlays/with-token", &overlay);
    assert_valid("overlays/with-token", &docs);
    let base = render("base");
    let base_paths: Vec<String> =
        find(&base, "MutatingWebhookConfiguration", "podmutator")["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                w["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    let hooks = registration["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), base_paths.len());
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
    for (w, base_path) in hooks.iter().zip(&base_paths) {
        assert_eq!(
            w["clientConfig"]["service"]["path"],
            format!("/{token}{base_path}"),
            "{}",
            w["name"]
        );
        let bundle: String = w["clientConfig"]["caBundle"]
            .as_str()
            .unwrap()
            .chars()
            .filter(|c| !matches!(c, '\n' | '\r'))
            .collect();
        assert_eq!(bundle, ca_b64, "{}", w["name"]);
        let exprs = w["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap();
        assert!(exprs.contains(
            &json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]})
        ));
    }
    // The Deployment: the hash, never the token, and PODMUTATOR_CONFIG as the kubelet expands it.
    let d = find(&docs, "Deployment", "podmutator");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let rendered = serde_json::to_string(&docs).unwrap();
    assert!(
        !rendered
            .replace(&format!("/{token}/"), "")
            .contains(token.as_str()),
        "the token outside the registration's paths"
    );
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let hash = &env
        .iter()
        .find(|(k, _)| k == "PATH_TOKEN_SHA256")
        .unwrap()
        .1;
    assert_eq!(*hash, hex::encode(sha2::Sha256::digest(token.as_bytes())));
    let inline = env
        .iter()
        .find(|(k, _)| k == "PODMUTATOR_CONFIG")
        .unwrap()
        .1
        .replace("$(PATH_TOKEN_SHA256)", hash);
    let mut config: Value = serde_json::from_str(&inline).unwrap();
    let (port, metrics_port) = (common::free_port(), common::free_port());
    config["webhook"] = json!({"certDir": dir, "listenPort": port, "metricsPort": metrics_port});
    config["http"]["listenAddress"] = json!("127.0.0.1");
    config["http"]["drainSeconds"] = json!(0);

    let (mut child, log) = common::spawn_serve(
        crate::common::bin()
            .args(["serve", "--config"])
            .arg(deploy_dir("base/config.yaml"))
            .env("PODMUTATOR_CONFIG", config.to_string()),
    )
    .await;
    assert!(
        !log.lock().unwrap().contains("pathTokenDisabled is true"),
        "{}",
        log.lock().unwrap()
    );
    let review =
        std::fs::read(common::root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"))
            .unwrap();
    let host = format!("podmutator.{NAMESPACE}.svc");
    for (w, base_path) in hooks.iter().zip(&base_paths) {
        let path = w["clientConfig"]["service"]["path"].as_str().unwrap();
        for (path, wanted) in [(path, 200), (base_path.as_str(), 404)] {
            let (status, body) = common::https_request(
                port,
                &ca,
                &host,
                "POST",
                &format!("{path}?timeout=10s"),
                Some("application/json"),
                &review,
            )
            .await
            .unwrap();
            assert_eq!(
                status,
                wanted,
                "{}: {path}: {}",
                w["name"],
                String::from_utf8_lossy(&body)
            );
        }
    }
    // Readiness as the rendered probe asks for it, on the probe port, without the token.
    let ready = &c["readinessProbe"]["httpGet"];
    assert_eq!(ready["port"], "metrics");
    let (status, _) = plain_get(metrics_port, ready["path"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    assert!(child.wait().unwrap().success());
    assert!(
        !log.lock().unwrap().contains(&token),
        "the token in the log"
    );
}

/// The rendered RBAC `rules` grant `verb` on `resource` (group/resource) named `name`.
fn allows(rules: &Value, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    rules.as_array().unwrap().iter().any(|r| {
        let has = |field: &str, want: &str| {
            r[field]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == want))
        };
        has("apiGroups", group)
            && has("resources", resource)
            && has("verbs", verb)
            && match (r.get("resourceNames"), name) {
                (None, _) => true,
                (Some(_), Some(n)) => has("resourceNames", n),
                (Some(_), None) => false,
            }
    })
}

/// The self-managed-ca overlay: the Job and the CronJob run `certs` in the webhook's namespace
/// (which every registration entry skips, so they never wait for the webhook), restricted, with
/// the Deployment's image and the names the base renders. Their rendered arguments, run by the
/// real binary against a Kubernetes API holding the rendered registration, write exactly the
/// Secret the Deployment mounts and the CA Secret nothing mounts, and fill every caBundle (the
/// rendered one carries none); every request they made is one the rendered RBAC allows, and the
/// RBAC names nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_ca_jobs_write_what_the_deployment_mounts_within_their_rbac() {
    let docs = render("overlays/self-managed-ca");
    let service = find(&docs, "Service", "podmutator");
    let deployment = find(&docs, "Deployment", "podmutator");
    let registration = find(&docs, "MutatingWebhookConfiguration", "podmutator");
    for w in registration["webhooks"].as_array().unwrap() {
        assert!(w["clientConfig"].get("caBundle").is_none(), "{}", w["name"]);
    }
    let mounted: Vec<&Value> = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["secret"].is_object())
        .collect();
    assert_eq!(mounted.len(), 1, "{mounted:?}");
    let tls_secret = mounted[0]["secret"]["secretName"].as_str().unwrap();
    // Required: the Deployment's pods wait until the Job has written it.
    assert_ne!(mounted[0]["secret"]["optional"], true);

    let job = find(&docs, "Job", "podmutator-certs");
    let cron = find(&docs, "CronJob", "podmutator-certs");
    assert_eq!(cron["spec"]["concurrencyPolicy"], "Forbid");
    assert_eq!(
        cron["spec"]["schedule"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        5
    );
    let pods = [
        &job["spec"]["template"]["spec"],
        &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"],
    ];
    assert_eq!(
        pods[0], pods[1],
        "the install and the rotation run the same pod"
    );
    let pod = pods[0];
    let sa = pod["serviceAccountName"].as_str().unwrap();
    find(&docs, "ServiceAccount", sa);
    assert_eq!(job["metadata"]["namespace"], NAMESPACE);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    let webhook_container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], webhook_container["image"]);
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        c["env"][0],
        json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "certs");
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("no --{name} in {args:?}"))
    };
    assert_eq!(flag("service"), service["metadata"]["name"]);
    assert_eq!(flag("webhook-config"), registration["metadata"]["name"]);
    assert_eq!(flag("tls-secret"), tls_secret);
    let ca_secret = flag("ca-secret");
    assert_ne!(ca_secret, tls_secret);
    // The webhook's namespace is skipped by every entry: the job's pods are never admitted by
    // the webhook whose certificate they make.
    for w in registration["webhooks"].as_array().unwrap() {
        assert!(
            w["namespaceSelector"]["matchExpressions"]
                .as_array()
                .unwrap()
                .contains(&json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]})),
            "{}",
            w["name"]
        );
    }

    // RBAC: bound to the job's ServiceAccount; Secrets by name (create cannot be), the
    // registration by name.
    let role = find(&docs, "Role", "podmutator-certs");
    let cluster_role = find(&docs, "ClusterRole", "podmutator-certs");
    for (binding, role_kind, role_obj) in [
        (find(&docs, "RoleBinding", "podmutator-certs"), "Role", role),
        (
            find(&docs, "ClusterRoleBinding", "podmutator-certs"),
            "ClusterRole",
            cluster_role,
        ),
    ] {
        assert_eq!(binding["roleRef"]["kind"], role_kind);
        assert_eq!(binding["roleRef"]["name"], role_obj["metadata"]["name"]);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}])
        );
    }
    let mut secret_names: Vec<&str> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["resourceNames"].as_array())
        .flatten()
        .map(|n| n.as_str().unwrap())
        .collect();
    secret_names.sort();
    let mut written = vec![ca_secret, tls_secret];
    written.sort();
    assert_eq!(secret_names, written);
    let registration_names: Vec<&Value> = cluster_role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resourceNames"].as_array().unwrap())
        .collect();
    assert_eq!(registration_names, [&registration["metadata"]["name"]]);

    // The rendered arguments, run (twice: install, then a rotation run with nothing due).
    let api = crate::certs::FakeApi::start_with(registration.clone()).await;
    for _ in 0..2 {
        let out = api.run(&args[1..]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let requests = api.take_requests();
    assert!(
        requests.iter().any(|r| r.starts_with("PUT ")),
        "{requests:?}"
    );
    for r in &requests {
        let mut parts = r.split(' ');
        let (method, path) = (parts.next().unwrap(), parts.next().unwrap());
        let verb = match method {
            "GET" => "get",
            "POST" => "create",
            "PUT" => "update",
            other => panic!("{other}"),
        };
        let allowed = if let Some(rest) =
            path.strip_prefix(&format!("/api/v1/namespaces/{NAMESPACE}/secrets"))
        {
            let name = rest.strip_prefix('/');
            allows(&role["rules"], "", "secrets", verb, name)
        } else if let Some(name) = path
            .strip_prefix("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/")
        {
            allows(
                &cluster_role["rules"],
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                verb,
                Some(name),
            )
        } else {
            false
        };
        assert!(allowed, "{r}: not allowed by the rendered RBAC");
    }
    for name in [ca_secret, tls_secret] {
        assert!(api.secret(name)["data"].is_object(), "{name} not written");
    }
    let ca = api.secret(ca_secret)["data"]["ca.crt"].clone();
    for w in api.registration()["webhooks"].as_array().unwrap() {
        assert_eq!(w["clientConfig"]["caBundle"], ca, "{}", w["name"]);
    }
}

/// One plain HTTP/1.1 GET: (status, body).
async fn plain_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A connection a NetworkPolicy decides on: the other end (an address, and for a pod its
/// namespace's name) and the port on the policy's pods' side (ingress) or the other side
/// (egress).
struct Flow<'a> {
    ip: std::net::IpAddr,
    namespace: Option<&'a str>,
    port: &'a str,
    protocol: &'a str,
}

/// Whether one of `rules` (a policy's `ingress` or `egress`) admits `flow`, as the API defines
/// it: a rule without `ports` admits every port, without `from`/`to` every peer; a peer is an
/// `ipBlock` (its CIDR holding the address, outside `except`) or a `namespaceSelector` (by
/// `matchLabels` on `kubernetes.io/metadata.name`, the only label these policies use; the empty
/// selector is every namespace) with no `podSelector`.
fn admits(rules: &Value, peers: &str, flow: &Flow) -> bool {
    let in_cidr = |cidr: &str| {
        let (net, bits) = cidr.split_once('/').unwrap();
        let bits: u32 = bits.parse().unwrap();
        match (net.parse::<std::net::IpAddr>().unwrap(), flow.ip) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    };
    rules.as_array().into_iter().flatten().any(|rule| {
        let port_ok = rule["ports"].as_array().is_none_or(|ports| {
            ports.iter().any(|p| {
                let port = match &p["port"] {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return false,
                };
                port == flow.port && p["protocol"].as_str().unwrap_or("TCP") == flow.protocol
            })
        });
        let peer_ok = rule[peers].as_array().is_none_or(|list| {
            list.iter().any(|peer| {
                if let Some(block) = peer.get("ipBlock") {
                    return in_cidr(block["cidr"].as_str().unwrap())
                        && !block["except"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|e| in_cidr(e.as_str().unwrap()));
                }
                assert!(
                    peer.get("podSelector").is_none(),
                    "a podSelector: extend this reader: {peer}"
                );
                let Some(ns) = flow.namespace else {
                    return false;
                };
                let labels = &peer["namespaceSelector"]["matchLabels"];
                labels.as_object().is_none_or(|m| {
                    m.iter()
                        .all(|(k, v)| k == "kubernetes.io/metadata.name" && v == ns)
                })
            })
        });
        port_ok && peer_ok
    })
}

/// Issue 36: the probe port was open to every namespace, the webhook's egress blocked the EKS
/// Pod Identity agent (so in-cluster Embedded with Pod Identity had no credentials), and the
/// certs pods had no policy. The rendered policies, read as the API defines them: the probe
/// port admits the monitoring namespace (configurable) and no other; the webhook reaches DNS,
/// Secrets Manager and STS over HTTPS (IRSA), and the Pod Identity agent, but not the instance
/// metadata service (the node's role is not the webhook's); the certs pods admit nothing and
/// reach DNS and the Kubernetes API.
#[test]
fn network_policies_admit_what_each_pod_needs_and_nothing_else() {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let docs = render("overlays/self-managed-ca");
    let webhook = find(&docs, "NetworkPolicy", "podmutator");
    let flow = |addr: &'static str,
                namespace: Option<&'static str>,
                port: &'static str,
                protocol: &'static str| Flow {
        ip: ip(addr),
        namespace,
        port,
        protocol,
    };
    let ingress = &webhook["spec"]["ingress"];
    let egress = &webhook["spec"]["egress"];
    // Ingress: the webhook port from anywhere (the control plane matches no selector); the
    // probe port from the monitoring namespace only.
    assert!(admits(
        ingress,
        "from",
        &flow("10.0.7.9", None, "webhook", "TCP")
    ));
    assert!(admits(
        ingress,
        "from",
        &flow("10.0.3.4", Some("monitoring"), "metrics", "TCP")
    ));
    for tenant in [Some("flytesnacks-development"), Some("default"), None] {
        assert!(
            !admits(ingress, "from", &flow("10.0.3.5", tenant, "metrics", "TCP")),
            "{tenant:?}"
        );
    }
    // Egress: the credential paths.
    for (what, f, allowed) in [
        (
            "DNS",
            flow("10.100.0.10", Some("kube-system"), "53", "UDP"),
            true,
        ),
        (
            "Secrets Manager, STS (IRSA) over HTTPS",
            flow("52.94.133.131", None, "443", "TCP"),
            true,
        ),
        (
            "the EKS Pod Identity agent",
            flow("169.254.170.23", None, "80", "TCP"),
            true,
        ),
        (
            "the EKS Pod Identity agent (IPv6)",
            flow("fd00:ec2::23", None, "80", "TCP"),
            true,
        ),
        (
            "the instance metadata service",
            flow("169.254.169.254", None, "80", "TCP"),
            false,
        ),
        (
            "plain HTTP elsewhere",
            flow("10.0.9.9", None, "80", "TCP"),
            false,
        ),
    ] {
        assert_eq!(admits(egress, "to", &f), allowed, "{what}");
    }

    // The certs pods: the policy selects the Job's and the CronJob's pods.
    let certs = find(&docs, "NetworkPolicy", "podmutator-certs");
    let selector = certs["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (kind, template) in [
        (
            "Job",
            &find(&docs, "Job", "podmutator-certs")["spec"]["template"],
        ),
        (
            "CronJob",
            &find(&docs, "CronJob", "podmutator-certs")["spec"]["jobTemplate"]["spec"]["template"],
        ),
    ] {
        let labels = &template["metadata"]["labels"];
        assert!(
            selector.iter().all(|(k, v)| &labels[k] == v),
            "{kind}: {labels}"
        );
    }
    assert_eq!(certs["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let (ingress, egress) = (&certs["spec"]["ingress"], &certs["spec"]["egress"]);
    assert!(!admits(
        ingress,
        "from",
        &flow("10.0.3.4", Some("monitoring"), "8080", "TCP")
    ));
    for (what, f, allowed) in [
        (
            "DNS",
            flow("10.100.0.10", Some("kube-system"), "53", "UDP"),
            true,
        ),
        (
            "the kubernetes Service",
            flow("10.100.0.1", None, "443", "TCP"),
            true,
        ),
        (
            "an API server endpoint",
            flow("10.0.0.20", None, "6443", "TCP"),
            true,
        ),
        ("anything else", flow("10.0.9.9", None, "80", "TCP"), false),
    ] {
        assert_eq!(admits(egress, "to", &f), allowed, "certs: {what}");
    }

    // The monitoring namespace is a setting: the patch docs/deploy.md shows, in an overlay.
    let deploy = std::fs::read_to_string(common::root().join("docs/deploy.md")).unwrap();
    let start = deploy
        .find("```yaml\n# overlays/observability/kustomization.yaml")
        .expect("docs/deploy.md shows the overlay");
    let block = &deploy[start + "```yaml\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    let (dir, _) = provided_ca_copy();
    let overlay = dir.join("../observability");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(overlay.join("kustomization.yaml"), block).unwrap();
    let docs = render_dir("overlays/observability", &overlay);
    let ingress = &find(&docs, "NetworkPolicy", "podmutator")["spec"]["ingress"];
    assert!(admits(
        ingress,
        "from",
        &flow("10.0.3.4", Some("observability"), "metrics", "TCP")
    ));
    assert!(!admits(
        ingress,
        "from",
        &flow("10.0.3.4", Some("monitoring"), "metrics", "TCP")
    ));
}
