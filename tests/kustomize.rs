//! The in-cluster install (`deploy/kubernetes/`): the base and each overlay render with
//! `kubectl kustomize` (kubectl is part of the machine image: missing is an error), every
//! built-in object passes `kubernetes-validate --strict`, the cert-manager objects carry what
//! cert-manager requires, and the registration is the renderer's, pointing at the Service and
//! the paths `serve` answers. Nothing renders until the image is pinned by digest, and the
//! registration renders apart from the webhook (`registration/<overlay>`), so the renders here
//! are of a copy of the tree with the install's image step done. `PODMUTATOR_BLESS=1 cargo test
//! --test integration kustomize::` rewrites `deploy/kubernetes/registration/base/registration.yaml`
//! from the renderer; review the diff.

use std::path::{Path, PathBuf};
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

/// What an install applies from `deploy/kubernetes/<rel>` (the base or an overlay), parsed into
/// its objects: its own render and its registration's (`registration/base` for the base,
/// `registration/<overlay>` for an overlay that has one). Rendered from a copy of the tree with
/// the image pinned as the install's first step pins it, a certificate made for the test in
/// `provided-ca` and, for `path-token`, the component's files, as an operator's would sit there.
fn render(rel: &str) -> Vec<Value> {
    let (dir, _) = provided_ca_copy();
    if rel == "overlays/path-token" {
        path_token_files(&dir);
    }
    render_install(&dir.join("../.."), rel)
}

/// [`render`] in the tree whose `deploy/kubernetes` is `kube`.
fn render_install(kube: &Path, rel: &str) -> Vec<Value> {
    let mut docs = render_dir(rel, &kube.join(rel));
    let registration = registration_of(rel);
    if kube.join(&registration).is_dir() {
        docs.extend(render_dir(&registration, &kube.join(&registration)));
    }
    docs
}

/// Where the registration of the base or an overlay renders.
fn registration_of(rel: &str) -> String {
    match rel.strip_prefix("overlays/") {
        Some(overlay) => format!("registration/{overlay}"),
        None => format!("registration/{rel}"),
    }
}

/// The install's first step as docs/deploy.md writes it, `kustomize edit set image
/// podmutator=<registry>/podmutator@sha256:<digest>`, with the placeholders filled: the image
/// it pins, and the `images:` entry `kustomize edit set image` writes for it (the name, then
/// `newName` and `digest` from `<newName>@<digest>`). kustomize itself is not installed here.
fn documented_image_step() -> (String, String) {
    let deploy = std::fs::read_to_string(common::root().join("docs/deploy.md")).unwrap();
    let line = deploy
        .lines()
        .find(|l| l.contains("kustomize edit set image podmutator=<registry>/"))
        .expect("docs/deploy.md shows the install's `kustomize edit set image` step");
    let command = line
        .strip_prefix("cd deploy/kubernetes/base && ")
        .expect("the step runs in deploy/kubernetes/base");
    let arg = command
        .strip_prefix("kustomize edit set image ")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .replace("<registry>", "registry.example.com/team")
        .replace("<digest>", &"a1b2c3d4e5f60789".repeat(4));
    let (name, image) = arg.split_once('=').unwrap();
    let (new_name, digest) = image.split_once('@').unwrap();
    assert_eq!(name, "podmutator");
    assert!(
        regex::Regex::new("^sha256:[0-9a-f]{64}$")
            .unwrap()
            .is_match(digest),
        "{digest}"
    );
    let entry = format!("images:\n- digest: {digest}\n  name: {name}\n  newName: {new_name}\n");
    (image.to_owned(), entry)
}

/// Appends `entry` (an `images:` list) to the copied base's kustomization.yaml, which holds
/// none as committed.
fn set_base_images(kube: &Path, entry: &str) {
    let file = kube.join("base/kustomization.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text.lines().any(|l| l.starts_with("images:")),
        "the committed base pins no image"
    );
    std::fs::write(&file, format!("{text}{entry}")).unwrap();
}

/// A copy of `deploy/kubernetes`, the image pinned as the install's first step does, with
/// `tls.crt`, `tls.key` and `ca.crt` in `provided-ca`; returns that overlay's directory and
/// the CA's PEM.
fn provided_ca_copy() -> (PathBuf, Vec<u8>) {
    let (dir, ca) = unpinned_copy();
    set_base_images(&dir.join("../.."), &documented_image_step().1);
    (dir, ca)
}

/// [`provided_ca_copy`] without the image: the tree as committed, and the certificate files.
fn unpinned_copy() -> (PathBuf, Vec<u8>) {
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

/// A container's `env` as the kubelet sets it: in each `value`, `$(NAME)` is the value of the
/// variable `NAME` defined above it, `$$` a literal `$`, and a reference to no such variable
/// stays as written. Literal values only: the objects here use no `valueFrom`.
fn kubelet_env(container: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let mut rest = e["value"].as_str().expect("a literal value (no valueFrom)");
        let mut value = String::new();
        while let Some(i) = rest.find('$') {
            value.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                value.push('$');
                rest = tail;
            } else if let (true, Some(end)) = (after.starts_with('('), after.find(')')) {
                let var = &after[1..end];
                match out.iter().rev().find(|(k, _)| k == var) {
                    Some((_, v)) => value.push_str(v),
                    None => value.push_str(&rest[i..i + end + 2]),
                }
                rest = &after[end + 1..];
            } else {
                value.push('$');
                rest = after;
            }
        }
        value.push_str(rest);
        out.push((name, value));
    }
    out
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
    let path = deploy_dir("registration/base/registration.yaml");
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
    let docs = render_install(&dir.join("../.."), "overlays/provided-ca");
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
    let docs = render_install(&dir.join("../.."), "overlays/provided-ca");
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
    // Waits on the line itself: serve's stdout ending first (it exited) fails at once; only a
    // serve that neither logs it nor exits for five minutes (a hang) fails on time.
    let mut seen = Vec::new();
    let started = loop {
        let line = match rx.recv_timeout(std::time::Duration::from_secs(300)) {
            Ok(line) => line,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.kill();
                panic!(
                    "serve exited ({:?}) before \"serving https\"; it logged {seen:#?}",
                    child.wait()
                )
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no \"serving https\", nor an exit, in 300 s; it logged {seen:#?}")
            }
        };
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        if v["message"] == "serving https" {
            break v;
        }
        seen.push(line);
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
    // The component over provided-ca and its registration, in one render: what an operator's
    // two overlays apply, the first without the registration, the second with it alone.
    let overlay = dir.join("../with-token");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../provided-ca\n  - ../../registration/provided-ca\ncomponents:\n  - ../../components/path-token\n",
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
        // Compared, never printed: the token stays out of a failure's message.
        let registered = w["clientConfig"]["service"]["path"].as_str().unwrap();
        assert!(
            registered == format!("/{token}{base_path}"),
            "{}: {} is not the token followed by {base_path}",
            w["name"],
            registered.replace(token.as_str(), "<token>")
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
    let env = kubelet_env(c);
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in the Deployment's env"))
    };
    let hash = var("PATH_TOKEN_SHA256");
    assert_eq!(hash, hex::encode(sha2::Sha256::digest(token.as_bytes())));
    let mut config: Value = serde_json::from_str(&var("PODMUTATOR_CONFIG")).unwrap();
    // No rotation under way: the previous hash is the current one.
    assert_eq!(config["http"]["pathTokenSha256"], json!([hash, hash]));
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
                "{}: {}: {}",
                w["name"],
                path.replace(token.as_str(), "<token>"),
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

/// The probe port was open to every namespace, the webhook's egress blocked the EKS
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

/// `kubectl kustomize` of `dir`, which must fail: its error output.
fn render_error(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl (1.32+, with kustomize) is required on PATH");
    assert!(
        !out.status.success(),
        "kubectl kustomize {} rendered",
        dir.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every install directory: each overlay and each registration.
fn install_dirs(kube: &Path) -> Vec<String> {
    let mut dirs = Vec::new();
    for parent in ["overlays", "registration"] {
        for e in std::fs::read_dir(kube.join(parent)).unwrap() {
            let e = e.unwrap();
            if e.path().join("kustomization.yaml").is_file() {
                dirs.push(format!("{parent}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    dirs.sort();
    dirs
}

/// Every overlay rendered `podmutator:latest`, an image nobody publishes, so an install
/// that followed the table ran into ImagePullBackOff behind a live `Fail` registration. Now the
/// tree as committed renders nothing an install would apply (the base's replacement reads the
/// digest back from the placeholder image, which has none), nor does an image pinned by tag
/// only; docs/deploy.md's `kustomize edit set image` step makes every overlay render, and every
/// container of ours then runs exactly that digest.
#[test]
fn nothing_renders_until_the_image_is_pinned_by_digest() {
    let (dir, _) = unpinned_copy();
    path_token_files(&dir);
    let kube = dir.join("../..");
    let dirs = install_dirs(&kube);
    assert!(dirs.len() >= OVERLAYS.len() + 3, "{dirs:?}");
    let placeholder = "podmutator:unset-pin-it-by-digest-see-docs-deploy-md";
    // Unpinned: whatever runs our image fails to render (the base's check is in its render),
    // naming the placeholder; a registration alone holds no image and renders.
    let unpinned: Vec<(String, Option<String>)> = dirs
        .iter()
        .chain(std::iter::once(&"base".to_owned()))
        .map(|rel| {
            let out = Command::new("kubectl")
                .arg("kustomize")
                .arg(kube.join(rel))
                .output()
                .expect("kubectl (1.32+, with kustomize) is required on PATH");
            let err =
                (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned());
            (rel.clone(), err)
        })
        .collect();
    for (rel, err) in &unpinned {
        if let Some(err) = err {
            assert!(
                err.contains(&format!(
                    "options.index 1 is out of bounds for value {placeholder}"
                )),
                "{rel}: {err}"
            );
        }
    }

    // Pinned by tag only: refused the same way, naming what was given.
    let (tagged, _) = unpinned_copy();
    let tagged = tagged.join("../..");
    set_base_images(
        &tagged,
        "images:\n- name: podmutator\n  newName: registry.example.com/team/podmutator\n  newTag: \"1.0\"\n",
    );
    let err = render_error(&tagged.join("overlays/cert-manager"));
    assert!(
        err.contains("out of bounds for value registry.example.com/team/podmutator:1.0"),
        "{err}"
    );

    // The documented step: everything renders, every container of ours on the digest; what
    // holds one, and every overlay, failed above.
    let (image, entry) = documented_image_step();
    set_base_images(&kube, &entry);
    for (rel, err) in &unpinned {
        let docs = render_dir(rel, &kube.join(rel));
        let runs_ours = docs
            .iter()
            .any(|d| matches!(d["kind"].as_str(), Some("Deployment" | "Job" | "CronJob")));
        assert!(
            err.is_some() || !runs_ours,
            "{rel}: rendered unpinned, with our image to run"
        );
        assert!(
            err.is_some() || rel.starts_with("registration/"),
            "{rel}: rendered unpinned"
        );
        for d in &docs {
            let pod = match d["kind"].as_str().unwrap() {
                "Deployment" | "Job" => &d["spec"]["template"]["spec"],
                "CronJob" => &d["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                _ => continue,
            };
            for c in pod["containers"].as_array().unwrap() {
                assert_eq!(
                    c["image"], image,
                    "{rel}: {} {}",
                    d["kind"], d["metadata"]["name"]
                );
            }
        }
    }
}

/// The registration went live with the rest of an overlay, before any replica could
/// answer, so under `Fail` it refused every pod it matched until the Deployment was available
/// (for ever, with an image that cannot be pulled). Now each overlay renders without it and
/// `registration/<overlay>` renders it alone, with what the overlay adds; docs/deploy.md's
/// install table applies the webhook, waits for the rollout, then applies the registration.
/// `self-managed-ca` is the exception the table names: its Job writes into the registration
/// before it issues the certificate the Deployment waits for.
#[test]
fn the_registration_is_rendered_apart_and_applied_after_the_deployment() {
    use base64::Engine;
    let (dir, ca) = provided_ca_copy();
    let token = path_token_files(&dir);
    let kube = dir.join("../..");
    let base = render_dir("registration/base", &kube.join("registration/base"));
    assert_eq!(base.len(), 1);
    let base = find(&base, "MutatingWebhookConfiguration", "podmutator");
    let names = |r: &Value| -> Vec<Value> {
        r["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].clone())
            .collect()
    };

    let deploy = std::fs::read_to_string(common::root().join("docs/deploy.md")).unwrap();
    let header = "| overlay | before | 1. the webhook | 2. wait | 3. the registration |";
    let table = &deploy[deploy
        .find(header)
        .expect("docs/deploy.md has the install table")..];
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let mut listed: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
    listed.sort();
    let mut overlays = OVERLAYS.to_vec();
    overlays.sort();
    assert_eq!(listed, overlays, "the table has a row per overlay");
    let wait = "`kubectl -n podmutator rollout status deployment/podmutator --timeout=5m`";
    for row in &rows {
        let overlay = row[0].trim_matches('`');
        assert_eq!(row.len(), 5, "{overlay}: {row:?}");
        let workload = format!("overlays/{overlay}");
        assert!(
            row[2].starts_with(&format!("`kubectl apply -k deploy/kubernetes/{workload}`")),
            "{overlay}: {}",
            row[2]
        );
        assert!(row[3].contains(wait), "{overlay}: {}", row[3]);
        let docs = render_dir(&workload, &kube.join(&workload));
        let registration = registration_of(&workload);
        if overlay == "self-managed-ca" {
            // The exception: the registration is applied with the rest, and none is left for 3.
            assert_eq!(row[4], "none: applied in 1", "{overlay}");
            assert!(row[2].contains("the registration included"), "{overlay}");
            assert!(!kube.join(&registration).exists(), "{overlay}");
            find(&docs, "MutatingWebhookConfiguration", "podmutator");
            continue;
        }
        assert_eq!(
            row[4],
            format!("`kubectl apply -k deploy/kubernetes/{registration}`"),
            "{overlay}"
        );
        assert!(
            !docs
                .iter()
                .any(|d| d["kind"] == "MutatingWebhookConfiguration"),
            "{workload} renders a registration"
        );
        find(&docs, "Deployment", "podmutator");
        let alone = render_dir(&registration, &kube.join(&registration));
        let kinds: Vec<&Value> = alone.iter().map(|d| &d["kind"]).collect();
        assert_eq!(kinds, ["MutatingWebhookConfiguration"], "{registration}");
        let r = &alone[0];
        assert_eq!(r["metadata"]["name"], "podmutator");
        assert_eq!(names(r), names(base), "{registration}");
        // What each overlay adds to the registration, and nothing of the rest.
        let inject = &r["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
        let bundles: Vec<String> = r["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                w["clientConfig"]["caBundle"]
                    .as_str()
                    .unwrap_or_default()
                    .replace(['\n', '\r'], "")
            })
            .collect();
        let under_token = r["webhooks"].as_array().unwrap().iter().all(|w| {
            w["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap()
                .starts_with(&format!("/{token}/"))
        });
        match overlay {
            "cert-manager" | "path-token" => {
                assert_eq!(inject, "podmutator/podmutator-serving", "{registration}");
                assert!(bundles.iter().all(String::is_empty), "{registration}");
            }
            "provided-ca" => {
                assert!(inject.is_null(), "{registration}");
                let want = base64::engine::general_purpose::STANDARD.encode(&ca);
                assert!(bundles.iter().all(|b| *b == want), "{registration}");
            }
            other => panic!("an overlay this test does not know: {other}"),
        }
        assert_eq!(under_token, overlay == "path-token", "{registration}");
    }
}

/// A stand-in `kubectl` and `kustomize`, in a new directory beside a `podmutator` (the test
/// build), to put first on PATH: each kubectl call adds its arguments as a line to
/// `<log>/calls`; `apply -k DIR` also writes what that applies, the real `kubectl kustomize
/// DIR`, to `<log>/<n>.yaml`, n the call's number from 0. Returns (the directory, the log).
fn stand_in_kubectl() -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .expect("kubectl (1.32+, with kustomize) is required on PATH");
    let bin = common::temp_dir("kustomize-stand-in-bin");
    let log = common::temp_dir("kustomize-stand-in-log");
    std::fs::write(log.join("calls"), "").unwrap();
    let script = format!(
        "#!/bin/sh\nn=$(($(wc -l < '{log}/calls')))\necho \"$*\" >> '{log}/calls'\n\
         if [ \"$1\" = apply ] && [ \"$2\" = -k ]; then exec '{real}' kustomize \"$3\" > '{log}/'$n.yaml; fi\n",
        log = log.display(),
        real = real.display()
    );
    std::fs::write(bin.join("kubectl"), script).unwrap();
    std::fs::set_permissions(bin.join("kubectl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // kustomize itself is not installed here: its pinning step (tests/iac/fake_kustomize.py).
    common::stand_in(&bin, "kustomize", "fake_kustomize.py");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podmutator"), bin.join("podmutator")).unwrap();
    (bin, log)
}

/// One `serve` replica, killed when dropped (a failed assertion leaves none running).
struct Replica {
    child: std::process::Child,
    port: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubectl call the stand-in recorded, with the render of an `apply -k`.
type Call = (String, Option<Vec<Value>>);

/// The webhook's apply of the rotation: `overlays/path-token`, without the registration; its
/// Deployment's configuration as the kubelet hands it to `serve`.
fn rotation_workload(call: &Call, what: &str) -> Value {
    assert!(
        call.0.starts_with("apply -k ") && call.0.ends_with("overlays/path-token"),
        "{what}: {}",
        call.0
    );
    let docs = call.1.as_ref().unwrap();
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "MutatingWebhookConfiguration"),
        "{what}: the webhook's apply holds the registration"
    );
    let d = find(docs, "Deployment", "podmutator");
    let env = kubelet_env(&d["spec"]["template"]["spec"]["containers"][0]);
    let inline = &env
        .iter()
        .find(|(k, _)| k == "PODMUTATOR_CONFIG")
        .unwrap()
        .1;
    serde_json::from_str(inline).unwrap()
}

/// The registration's apply of the rotation: `registration/path-token`, that object alone; its
/// webhooks' names and paths.
fn rotation_registration(call: &Call, what: &str) -> Vec<(String, String)> {
    assert!(
        call.0.starts_with("apply -k ") && call.0.ends_with("registration/path-token"),
        "{what}: {}",
        call.0
    );
    let docs = call.1.as_ref().unwrap();
    assert_eq!(docs.len(), 1, "{what}: the registration's apply holds more");
    docs[0]["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap().to_owned(),
                w["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect()
}

/// The SHA-256 of the one token every path of a registration is under.
fn token_hash(paths: &[(String, String)]) -> String {
    use sha2::Digest as _;
    let tokens: std::collections::BTreeSet<&str> = paths
        .iter()
        .map(|(_, p)| p.trim_start_matches('/').split('/').next().unwrap())
        .collect();
    assert_eq!(tokens.len(), 1, "one token in every path");
    hex::encode(sha2::Sha256::digest(tokens.first().unwrap().as_bytes()))
}

/// The `sh` block of docs/deploy.md that starts with `start`, cut into its steps: a step begins
/// at each line starting with one of `markers`.
fn deploy_steps(start: &str, markers: &[&str]) -> Vec<String> {
    let deploy = std::fs::read_to_string(common::root().join("docs/deploy.md")).unwrap();
    let at = deploy
        .find(start)
        .unwrap_or_else(|| panic!("docs/deploy.md has a block starting {start:?}"));
    let text = &deploy[at + "```sh\n".len()..];
    let block = &text[..text.find("```").unwrap()];
    let mut steps: Vec<String> = Vec::new();
    for line in block.lines() {
        if markers.iter().any(|p| line.starts_with(p)) || steps.is_empty() {
            steps.push(String::new());
        }
        let step = steps.last_mut().unwrap();
        step.push_str(line);
        step.push('\n');
    }
    steps
}

/// Runs documented commands with `sh -e`, the stand-in `kubectl` and the test build as
/// `podmutator` first on PATH, no `PODMUTATOR_*` of this process; each run returns the kubectl
/// calls it made, with what each `apply -k` rendered.
struct DocRunner {
    path: String,
    log: PathBuf,
    seen: usize,
}

impl DocRunner {
    fn new() -> Self {
        let (bin, log) = stand_in_kubectl();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Self { path, log, seen: 0 }
    }

    fn run(&mut self, what: &str, commands: &str, cwd: &Path) -> Vec<Call> {
        let mut sh = Command::new("sh");
        sh.args(["-ec", commands])
            .current_dir(cwd)
            .env("PATH", &self.path);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PODMUTATOR_") {
                sh.env_remove(name);
            }
        }
        let out = sh.output().unwrap();
        assert!(
            out.status.success(),
            "{what} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let calls = std::fs::read_to_string(self.log.join("calls")).unwrap_or_default();
        let calls: Vec<String> = calls.lines().map(str::to_owned).collect();
        let new = (self.seen..calls.len())
            .map(|n| {
                let render = std::fs::read_to_string(self.log.join(format!("{n}.yaml")))
                    .ok()
                    .map(|y| serde_saphyr::from_multiple::<Value>(&y).unwrap());
                (calls[n].clone(), render)
            })
            .collect();
        self.seen = calls.len();
        new
    }
}

/// What a replica of a rollout test answers with: its certificate's directory and CA, the
/// review. A new replica runs [`Rotation::start`].
fn rollout_replicas(what: &str) -> Rotation {
    let certs = common::temp_dir(what);
    let files = podmutator::transport::tls::ensure_certs(
        &certs,
        true,
        &[format!("podmutator.{NAMESPACE}.svc")],
    )
    .unwrap();
    Rotation {
        ca: std::fs::read(&files.ca).unwrap(),
        certs,
        review: std::fs::read(
            common::root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"),
        )
        .unwrap(),
    }
}

/// What the rotation's replicas share: their certificate's directory and CA, and the review.
struct Rotation {
    certs: PathBuf,
    ca: Vec<u8>,
    review: Vec<u8>,
}

impl Rotation {
    /// A replica running `config` (a rendered Deployment's), on ports of its own.
    async fn start(&self, config: &Value) -> Replica {
        let mut config = config.clone();
        let (port, metrics_port) = (common::free_port(), common::free_port());
        config["webhook"] =
            json!({"certDir": self.certs, "listenPort": port, "metricsPort": metrics_port});
        config["http"]["listenAddress"] = json!("127.0.0.1");
        config["http"]["drainSeconds"] = json!(0);
        let (child, _) = common::spawn_serve(
            crate::common::bin()
                .args(["serve", "--config"])
                .arg(deploy_dir("base/config.yaml"))
                .env("PODMUTATOR_CONFIG", config.to_string()),
        )
        .await;
        Replica { child, port }
    }

    /// Every path of `paths` answered `want` (200 with `allowed: true`, or 404) by each replica,
    /// named by the hashes it holds. Failures name the webhook, never the path.
    async fn check(
        &self,
        step: &str,
        replicas: &[(&str, &Replica)],
        paths: &[(String, String)],
        want: u16,
    ) {
        let host = format!("podmutator.{NAMESPACE}.svc");
        for (state, replica) in replicas {
            for (webhook, path) in paths {
                let (status, body) = common::https_request(
                    replica.port,
                    &self.ca,
                    &host,
                    "POST",
                    &format!("{path}?timeout=10s"),
                    Some("application/json"),
                    &self.review,
                )
                .await
                .unwrap_or_else(|e| panic!("{step}: {webhook}: TLS to the replica: {e}"));
                assert_eq!(
                    status, want,
                    "{step}: {webhook} on the replica holding {state}"
                );
                if want == 200 {
                    assert_eq!(
                        common::response(&body)["allowed"],
                        true,
                        "{step}: {webhook} on the replica holding {state}"
                    );
                }
            }
        }
    }
}

/// Rotating the in-cluster path token (one `kubectl apply -k` that moved the
/// registration and the Deployment at once) refused pods for a rollout, the registration calling
/// with the new token while old replicas answered it 404. docs/deploy.md's path-token install
/// and its three rotation steps, run as written with the test build as `podmutator` and a
/// stand-in `kubectl` that renders each `apply -k`; each rendered Deployment's configuration
/// (`PODMUTATOR_CONFIG` as the kubelet expands it) starts a real `serve`. At every step, every
/// replica state of that step answers 200 to every path of the registration applied by then;
/// after the last step the old token gets 404. No path (it holds a token) is ever printed.
#[tokio::test]
async fn path_token_rotation_in_three_applies_never_refuses_a_review() {
    let (dir, _) = provided_ca_copy();
    let root = dir.join("../../../..");
    let component = dir.join("../../components/path-token");
    let mut docs = DocRunner::new();
    let install = deploy_steps(
        "```sh\ncd deploy/kubernetes/components/path-token\nopenssl rand",
        &[],
    )
    .concat();
    let steps = deploy_steps("```sh\n# 1. ", &["# 1. ", "# 2. ", "# 3. "]);
    assert_eq!(steps.len(), 3, "three steps");
    let wait = "-n podmutator rollout status deployment/podmutator --timeout=5m";
    let rotation = rollout_replicas("kustomize-rotation-certs");

    // The install: the webhook, the wait, then the registration.
    let calls = docs.run("the path-token install", &install, &root);
    let commands: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(commands.len(), 3, "{commands:?}");
    assert_eq!(commands[1], wait, "the install waits for the rollout");
    let c0 = rotation_workload(&calls[0], "install");
    let r0 = rotation_registration(&calls[2], "install");
    let h0 = token_hash(&r0);
    assert_eq!(c0["http"]["pathTokenSha256"], json!([h0, h0]));
    let old = rotation.start(&c0).await;
    rotation
        .check("installed", &[("[old, old]", &old)], &r0, 200)
        .await;

    // 1. The webhook accepts both tokens; the registration keeps the old one.
    let calls = docs.run("step 1", &steps[0], &component);
    assert_eq!(calls.len(), 2, "step 1 applies the webhook and waits");
    assert_eq!(calls[1].0, wait, "step 1 waits for the rollout");
    let c1 = rotation_workload(&calls[0], "step 1");
    let h1 = c1["http"]["pathTokenSha256"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(h1, h0, "step 1 made a new token");
    assert_eq!(c1["http"]["pathTokenSha256"], json!([h1, h0]));
    let both = rotation.start(&c1).await;
    rotation
        .check(
            "step 1, rolling out",
            &[("[old, old]", &old), ("[new, old]", &both)],
            &r0,
            200,
        )
        .await;
    drop(old);

    // 2. The registration moves to the new token; while every API server catches up, either
    // registration calls.
    let calls = docs.run("step 2", &steps[1], &component);
    assert_eq!(calls.len(), 1, "step 2 applies the registration alone");
    let r1 = rotation_registration(&calls[0], "step 2");
    assert_eq!(token_hash(&r1), h1, "the registration holds the new token");
    for paths in [&r0, &r1] {
        rotation
            .check("step 2", &[("[new, old]", &both)], paths, 200)
            .await;
    }

    // 3. The old hash goes.
    let calls = docs.run("step 3", &steps[2], &component);
    assert_eq!(calls.len(), 2, "step 3 applies the webhook and waits");
    assert_eq!(calls[1].0, wait, "step 3 waits for the rollout");
    let c2 = rotation_workload(&calls[0], "step 3");
    assert_eq!(c2["http"]["pathTokenSha256"], json!([h1, h1]));
    let new = rotation.start(&c2).await;
    rotation
        .check(
            "step 3, rolling out",
            &[("[new, old]", &both), ("[new, new]", &new)],
            &r1,
            200,
        )
        .await;
    drop(both);
    rotation
        .check("after step 3", &[("[new, new]", &new)], &r0, 404)
        .await;
}

/// Turning the in-cluster path token on (from a plain install) refused pods for a
/// rollout, since `serve` answered token paths or plain ones, never both. docs/deploy.md's
/// "Turning the token on" block, run as written as the rotation's test runs its block: before,
/// the replicas serve plain paths; at every step every replica state answers 200 to every path
/// of the registration applied by then; after the last, a plain path gets 404.
#[tokio::test]
async fn turning_the_path_token_on_in_three_applies_never_refuses_a_review() {
    let (dir, _) = provided_ca_copy();
    let component = dir.join("../../components/path-token");
    let mut docs = DocRunner::new();
    let steps = deploy_steps("```sh\n# 0. ", &["# 0. ", "# 1. ", "# 2. ", "# 3. "]);
    assert_eq!(steps.len(), 4, "a preparation and three steps");
    let wait = "-n podmutator rollout status deployment/podmutator --timeout=5m";
    let replicas = rollout_replicas("kustomize-turn-on-certs");

    // Before: the base's configuration, plain paths only.
    let plain = replicas.start(&json!({"http": {}})).await;

    // 0. Files only: nothing is applied.
    assert!(
        docs.run("step 0", &steps[0], &component).is_empty(),
        "step 0 applies nothing"
    );

    // 1. The webhook answers both; the registration keeps the plain paths.
    let calls = docs.run("step 1", &steps[1], &component);
    assert_eq!(calls.len(), 2, "step 1 applies the webhook and waits");
    assert_eq!(calls[1].0, wait, "step 1 waits for the rollout");
    let c1 = rotation_workload(&calls[0], "step 1");
    assert_eq!(c1["http"]["acceptPlainPaths"], true);
    let switching = replicas.start(&c1).await;

    // 2. The registration moves to the token.
    let calls = docs.run("step 2", &steps[2], &component);
    assert_eq!(calls.len(), 1, "step 2 applies the registration alone");
    let tokened = rotation_registration(&calls[0], "step 2");
    let h = token_hash(&tokened);
    assert_eq!(c1["http"]["pathTokenSha256"], json!([h, h]));
    // The registration before: the same entries, each path without its token.
    let plain_paths: Vec<(String, String)> = tokened
        .iter()
        .map(|(w, p)| {
            let rest = p.trim_start_matches('/');
            (w.clone(), rest[rest.find('/').unwrap()..].to_owned())
        })
        .collect();
    replicas
        .check(
            "step 1, rolling out",
            &[("plain paths", &plain), ("both", &switching)],
            &plain_paths,
            200,
        )
        .await;
    drop(plain);
    for paths in [&plain_paths, &tokened] {
        replicas
            .check("step 2", &[("both", &switching)], paths, 200)
            .await;
    }

    // 3. The plain paths go.
    let calls = docs.run("step 3", &steps[3], &component);
    assert_eq!(calls.len(), 2, "step 3 applies the webhook and waits");
    assert_eq!(calls[1].0, wait, "step 3 waits for the rollout");
    let c2 = rotation_workload(&calls[0], "step 3");
    assert_eq!(c2["http"]["acceptPlainPaths"], false);
    assert_eq!(c2["http"]["pathTokenSha256"], json!([h, h]));
    let token_only = replicas.start(&c2).await;
    replicas
        .check(
            "step 3, rolling out",
            &[("both", &switching), ("the token", &token_only)],
            &tokened,
            200,
        )
        .await;
    drop(switching);
    replicas
        .check(
            "after step 3",
            &[("the token", &token_only)],
            &plain_paths,
            404,
        )
        .await;
}

/// docs/deploy.md's in-cluster day two, each block run as written (the placeholders filled) in a
/// copy of the tree, with the stand-in `kubectl` and `kustomize`: the install's pin writes the
/// base's `images:` and applies nothing; an upgrade and a rollback pin
/// their digest in the base and apply the webhook alone (its Deployment running that digest, no
/// registration), then wait for the rollout; the incident's undo waits too; the removal deletes
/// the registration before the rest (with self-managed-ca, the CronJob too); a reinstall
/// applies the webhook, waits, and applies the registration, alone, last.
#[test]
fn in_cluster_upgrade_rollback_removal_and_reinstall_run_as_written() {
    let (dir, _) = unpinned_copy();
    let root = dir.join("../../../..");
    let mut docs = DocRunner::new();
    let block = |start: &str| deploy_steps(&format!("```sh\n{start}"), &[]).concat();
    let release = block(
        "cd deploy/kubernetes/base && kustomize edit set image podmutator=<registry>/podmutator@sha256:<digest> && cd -\nkubectl apply -k deploy/kubernetes/overlays/cert-manager\n",
    );
    let wait = "-n podmutator rollout status deployment/podmutator --timeout=5m";
    let overlay = "apply -k deploy/kubernetes/overlays/cert-manager";
    let image_of = |call: &Call| -> String {
        let docs = call.1.as_ref().unwrap();
        assert!(
            !docs
                .iter()
                .any(|d| d["kind"] == "MutatingWebhookConfiguration"),
            "the webhook's apply holds the registration"
        );
        let d = find(docs, "Deployment", "podmutator");
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (previous, next) = ("0a".repeat(32), "1b".repeat(32));
    // The install's pin (its own block, the same line alone) pins the base and applies nothing.
    let install = block(
        "cd deploy/kubernetes/base && kustomize edit set image podmutator=<registry>/podmutator@sha256:<digest> && cd -\n```",
    );
    let calls = docs.run(
        "the install's pin",
        &install
            .replace("<registry>", "registry.example.com/team")
            .replace("<digest>", &previous),
        &root,
    );
    assert!(calls.is_empty(), "the install's pin applied {calls:?}");
    let base =
        std::fs::read_to_string(root.join("deploy/kubernetes/base/kustomization.yaml")).unwrap();
    assert!(
        base.contains(&format!("sha256:{previous}"))
            && base.contains("newName: registry.example.com/team/podmutator"),
        "the install's pin is not in the base:\n{base}"
    );
    for (what, digest) in [
        ("the first pin", &previous),
        ("the upgrade", &next),
        ("the rollback", &previous),
    ] {
        let commands = release
            .replace("<registry>", "registry.example.com/team")
            .replace("<digest>", digest);
        let calls = docs.run(what, &commands, &root);
        let names: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(names, [overlay, wait], "{what}");
        assert_eq!(
            image_of(&calls[0]),
            format!("registry.example.com/team/podmutator@sha256:{digest}"),
            "{what}"
        );
    }

    let calls = docs.run(
        "the incident's undo",
        &block("kubectl -n podmutator rollout undo"),
        &root,
    );
    let names: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        names,
        ["-n podmutator rollout undo deployment/podmutator", wait]
    );

    let calls = docs.run(
        "the removal",
        &block("kubectl delete mutatingwebhookconfiguration podmutator\n"),
        &root,
    );
    let names: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "delete mutatingwebhookconfiguration podmutator",
            "delete -k deploy/kubernetes/overlays/cert-manager --ignore-not-found"
        ],
        "the registration goes first"
    );

    // overlays/self-managed-ca's removal: the registration and the CronJob that would set its
    // caBundle again, then the rest, whose rendering holds that CronJob, the cluster-scoped RBAC
    // `delete -k` is said to remove and (this overlay holds it) the registration already gone.
    let calls = docs.run(
        "the self-managed-ca removal",
        &block(
            "kubectl delete mutatingwebhookconfiguration podmutator\nkubectl -n podmutator delete cronjob podmutator-certs",
        ),
        &root,
    );
    let names: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "delete mutatingwebhookconfiguration podmutator",
            "-n podmutator delete cronjob podmutator-certs --ignore-not-found",
            "delete -k deploy/kubernetes/overlays/self-managed-ca --ignore-not-found"
        ],
        "the registration and the CronJob go first"
    );
    let rest = render_dir(
        "overlays/self-managed-ca",
        &root.join("deploy/kubernetes/overlays/self-managed-ca"),
    );
    assert_eq!(
        find(&rest, "CronJob", "podmutator-certs")["metadata"]["namespace"],
        NAMESPACE
    );
    for kind in ["ClusterRole", "ClusterRoleBinding"] {
        find(&rest, kind, "podmutator-certs");
    }

    let calls = docs.run(
        "the reinstall",
        &block(&format!("kubectl {overlay}\nkubectl {wait}\n")),
        &root,
    );
    let names: Vec<&str> = calls.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        names,
        [
            overlay,
            wait,
            "apply -k deploy/kubernetes/registration/cert-manager"
        ]
    );
    assert_eq!(
        image_of(&calls[0]),
        format!("registry.example.com/team/podmutator@sha256:{previous}"),
        "the reinstall runs the pinned image"
    );
    let registration = calls[2].1.as_ref().unwrap();
    let kinds: Vec<&Value> = registration.iter().map(|d| &d["kind"]).collect();
    assert_eq!(kinds, ["MutatingWebhookConfiguration"]);
}
