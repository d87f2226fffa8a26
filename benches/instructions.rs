//! One admission case, run N times through the Lambda transport's path, for an instruction
//! count under `valgrind --tool=callgrind` (scripts/bench-instructions.sh runs it for N and 2N
//! and takes the difference, so start-up cancels out). Each review is what the runtime loop does
//! with one invocation once its body is read: the ALB event's bytes deserialised into
//! `lambda_http`'s `LambdaRequest`, [`podmutator::transport::lambda::handle`] (route, base64
//! decode, the admission, the response limit, the refusal log), and the reply serialised.
//!
//!     cargo build --profile instructions --no-default-features --bench instructions
//!     target/instructions/deps/instructions-<hash> --list
//!     target/instructions/deps/instructions-<hash> b_task_3_k8s 100
//!     target/instructions/deps/instructions-<hash> b_task_3_k8s:twin 100
//!     target/instructions/deps/instructions-<hash> bare --event > bare.json   # its ALB event
//!
//! `<case>:twin` is the same review with the selector label removed (parsed and allowed), the
//! case's floor. The cases are those of benches/admission.rs (see there), plus `bare` (a
//! one-container pod, unselected) and `wide_2000` (2,000 `{"name":"cN","image":"busybox"}`
//! containers, one ENV_VAR secret). Every case's first review is checked (status 200, allowed,
//! no warnings, a patch or none as the case says) before the N counted ones.

/// The binary's allocator (`src/main.rs`), so the counts are production's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod pods;

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use lambda_http::request::LambdaRequest;
use podmutator::transport::http::{
    Front, PATH_IMAGE_BUILDER, PATH_IMAGES, PATH_MANAGED_POD, PATH_SECRETS,
};
use podmutator::transport::lambda::handle;
use podmutator_core::config::Config;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::{App, Deps};
use serde_json::{Value, json};

use pods::{NS, embedded_first, secret, task_pod, three_k8s, twenty_mixed};

const SELECTOR: &str = "inject-flyte-secrets";

/// Every case, in the order the script reports them.
const CASES: &[&str] = &[
    "bare",
    "a_bare",
    "b_task_3_k8s",
    "b_task_3_k8s_logged",
    "c_task_20_mixed",
    "c_task_20_embedded",
    "d_maximal_pod",
    "d_maximal_pod_mesh",
    "f_images_builder_10",
    "f_images_rules_10",
    "wide_2000",
];

/// One case, built: the webhook, the ALB event's bytes, what the reply must be.
struct Built {
    front: Front,
    event: Vec<u8>,
    mutated: bool,
    logged: bool,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn config(v: Value) -> Config {
    Config::from_value(v).expect("bench config is valid").config
}

fn local_yaml() -> Config {
    let text = std::fs::read_to_string(root().join("config/local.yaml")).unwrap();
    Config::load(Some(("config/local.yaml", &text)), None)
        .expect("config/local.yaml loads")
        .config
}

fn maximal_pod() -> Value {
    let path = root().join("tests/fixtures/kubernetes-api/k8s-HEAD-core.v1.Pod.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `pod` with `labels` and the annotations of `secrets` added.
fn select(mut pod: Value, labels: &[(&str, &str)], secrets: &[Secret]) -> Value {
    let meta = &mut pod["metadata"];
    for (k, v) in labels {
        meta["labels"][*k] = json!(v);
    }
    for (k, v) in encode_annotations(secrets).unwrap() {
        meta["annotations"][k] = json!(v);
    }
    pod
}

/// `pod` without the labels `keys` (the twin: the same review, unselected).
fn unlabel(mut pod: Value, keys: &[&str]) -> Value {
    if let Some(labels) = pod["metadata"]["labels"].as_object_mut() {
        for k in keys {
            labels.remove(*k);
        }
    }
    pod
}

/// The webhook for `config` as the Lambda builds it (no path token in these configurations).
fn front(config: &Config, deps: Deps) -> Front {
    let app = App::build(config, deps);
    Front::new(Arc::new(app), &config.http, None).expect("bench front builds")
}

/// An ALB target group's event for a review of `pod` on `path`, as events/alb-mutate.json.
fn alb_event(path: &str, pod: &Value, namespace: &str) -> Vec<u8> {
    let review = podmutator_core::admission::create_review(pod, namespace);
    let body = serde_json::to_vec(&review).unwrap();
    let event = json!({
        "requestContext": {"elb": {"targetGroupArn":
            "arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/lambda-279XGJDqGZ5rsrHC2Fjr/49e9d65c45c6791a"}},
        "httpMethod": "POST",
        "path": path,
        "queryStringParameters": {"timeout": "10s"},
        "headers": {
            "accept": "application/json, */*",
            "content-length": body.len().to_string(),
            "content-type": "application/json",
            "host": "lambda-alb-123578498.us-east-2.elb.amazonaws.com",
            "user-agent": "kube-apiserver-admission",
            "x-amzn-trace-id": "Root=1-6740a2f1-3c1e5b7d9f0a2c4e6b8d0f13",
            "x-forwarded-for": "203.0.113.10",
            "x-forwarded-port": "443",
            "x-forwarded-proto": "https"
        },
        "body": base64::engine::general_purpose::STANDARD.encode(&body),
        "isBase64Encoded": true
    });
    serde_json::to_vec(&event).unwrap()
}

/// The case `name`, or its twin (`twin`): the same review with the selector label removed.
fn build(name: &str, twin: bool) -> Built {
    let k8s = || config(json!({"webhook": {"secretManagerTypes": ["K8s"]}}));
    let plain = |front: Front, path: &str, pod: Value, ns: &str| Built {
        front,
        event: alb_event(path, &pod, ns),
        mutated: !twin,
        logged: false,
    };
    let task = |secrets: &[Secret]| {
        let pod = task_pod(secrets);
        if twin { unlabel(pod, &[SELECTOR]) } else { pod }
    };
    match name {
        "bare" => {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "bare", "namespace": NS},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
            Built {
                mutated: false,
                ..plain(front(&k8s(), Deps::offline()), PATH_SECRETS, pod, NS)
            }
        }
        "a_bare" => Built {
            mutated: false,
            ..plain(
                front(&k8s(), Deps::offline()),
                PATH_SECRETS,
                task_pod(&[]),
                NS,
            )
        },
        "b_task_3_k8s" => plain(
            front(&k8s(), Deps::offline()),
            PATH_SECRETS,
            task(&three_k8s()),
            NS,
        ),
        "b_task_3_k8s_logged" => Built {
            logged: true,
            ..plain(
                front(&k8s(), Deps::offline()),
                PATH_SECRETS,
                task(&three_k8s()),
                NS,
            )
        },
        "c_task_20_mixed" => {
            let mixed = config(json!({"webhook": {"secretManagerTypes": ["AWS", "Vault", "K8s"]}}));
            plain(
                front(&mixed, Deps::offline()),
                PATH_SECRETS,
                task(&twenty_mixed()),
                NS,
            )
        }
        "c_task_20_embedded" => {
            let (embedded, cached) = embedded_first();
            let embedded = config(embedded);
            plain(
                front(&embedded, Deps::offline().with_source(Arc::new(cached))),
                PATH_SECRETS,
                task(&twenty_mixed()),
                NS,
            )
        }
        "d_maximal_pod" => {
            let mut pod = select(maximal_pod(), &[(SELECTOR, "true")], &three_k8s());
            if twin {
                pod = unlabel(pod, &[SELECTOR]);
            }
            plain(
                front(&k8s(), Deps::offline()),
                PATH_SECRETS,
                pod,
                "namespaceValue",
            )
        }
        "d_maximal_pod_mesh" => {
            let local = local_yaml();
            let managed = local.mesh.managed_label.clone();
            let mut pod = select(
                maximal_pod(),
                &[(SELECTOR, "true"), (&managed, "true")],
                &three_k8s(),
            );
            if twin {
                pod = unlabel(pod, &[SELECTOR, &managed]);
            }
            plain(
                front(&local, Deps::offline()),
                PATH_MANAGED_POD,
                pod,
                "namespaceValue",
            )
        }
        "f_images_builder_10" | "f_images_rules_10" => {
            let ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
            let images = config(json!({
                "webhook": {"imageBuilderConfig": {"enabled": true,
                    "hostnameReplacement": {"existing": "registry.union.example", "replacement": "cr.union.example"},
                    "labelSelector": {"matchLabels": {"image-builder": "true"}}}},
                "images": {"enabled": true, "rules": [
                    {"match": "docker.io", "replace": format!("{ecr}/docker-hub")},
                    {"match": "quay.io", "replace": format!("{ecr}/quay")},
                    {"match": "ghcr.io", "replace": format!("{ecr}/github")}]}
            }));
            let ten = |image: &dyn Fn(usize) -> String| -> Value {
                let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "ten", "namespace": NS, "labels": {"image-builder": "true"}},
                    "spec": {"containers": (0..10).map(|i| json!({"name": format!("c{i}"), "image": image(i)})).collect::<Vec<_>>()}});
                if twin {
                    pod = unlabel(pod, &["image-builder"]);
                }
                pod
            };
            if name == "f_images_builder_10" {
                // The builder's labelSelector is the API server's: the twin's images are
                // already in the replacement registry (nothing to rewrite, verified).
                let registry = if twin {
                    "cr.union.example/orgs"
                } else {
                    "registry.union.example"
                };
                let pod = ten(&|i| format!("{registry}/{NS}/task-{i}:v1"));
                plain(front(&images, Deps::offline()), PATH_IMAGE_BUILDER, pod, NS)
            } else {
                // images.rules select by image, not label (the registration's podSelector is
                // the API server's): the twin's images, as long, match no rule.
                let sources = [
                    "nginx:1.27",
                    "quay.io/prometheus/node-exporter:v1.8.0",
                    "ghcr.io/example/app:v2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                ];
                let pod = ten(&|i| {
                    let image = sources[i % sources.len()];
                    if !twin {
                        image.to_owned()
                    } else if let Some(rest) = image.strip_prefix("quay.io") {
                        format!("quay.xx{rest}")
                    } else if let Some(rest) = image.strip_prefix("ghcr.io") {
                        format!("ghcr.xx{rest}")
                    } else {
                        // A bare name is docker.io's: name a registry no rule matches.
                        format!("r.xx/{image}")
                    }
                });
                plain(front(&images, Deps::offline()), PATH_IMAGES, pod, NS)
            }
        }
        "wide_2000" => {
            let secrets = [secret("app-db", "", "password", MountRequirement::EnvVar)];
            let mut pod = task(&secrets);
            pod["spec"]["containers"] = (0..2000)
                .map(|i| json!({"name": format!("c{i}"), "image": "busybox"}))
                .collect();
            plain(front(&k8s(), Deps::offline()), PATH_SECRETS, pod, NS)
        }
        other => panic!("no case {other:?}; --list lists them"),
    }
}

/// One invocation's work: the event's bytes in, the reply's bytes out.
fn invoke(rt: &tokio::runtime::Runtime, front: &Front, event: &[u8]) -> Vec<u8> {
    let req: LambdaRequest = serde_json::from_slice(event).expect("lambda_http reads the event");
    // Pinned where it is made: `block_on` boxes a future of over 16 KB (tokio's
    // BOX_FUTURE_THRESHOLD), so a few bytes more in the handler's future would add a copy of
    // all of it to every count, a step no change to the admission itself made.
    let reply = handle(front, req);
    tokio::pin!(reply);
    let reply = rt.block_on(reply);
    serde_json::to_vec(&reply).unwrap()
}

/// Checks the first reply: 200, allowed, no warnings, a patch exactly when `mutated`.
fn check(name: &str, wire: &[u8], mutated: bool) {
    let v: Value = serde_json::from_slice(wire).unwrap();
    let body: Value = serde_json::from_str(v["body"].as_str().unwrap_or("null")).unwrap();
    let resp = &body["response"];
    let ok = v["statusCode"] == 200
        && resp["allowed"] == true
        && resp["warnings"].as_array().is_none_or(|w| w.is_empty())
        && resp["patch"].is_string() == mutated;
    assert!(
        ok,
        "{name}: expected {} reply, got {}",
        if mutated { "a patched" } else { "an unpatched" },
        String::from_utf8_lossy(&wire[..wire.len().min(2000)])
    );
}

/// A `/proc/self/status` figure in KiB (0 where there is none).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak resident set size to the current one and returns it, in KiB; `None` where
/// the mark cannot be reset (the figure would hold set-up's own peak).
fn reset_peak_rss_kib() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    Some(status_kib("VmRSS:"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` and `cargo test --benches` pass `--bench`: nothing to count there.
    if args.is_empty() || args.iter().any(|a| a == "--bench") {
        eprintln!("usage: instructions <case>[:twin] <N> | <case>[:twin] --event | --list");
        return;
    }
    if args[0] == "--list" {
        for case in CASES {
            println!("{case}");
        }
        return;
    }
    let (name, twin) = match args[0].split_once(':') {
        Some((n, "twin")) => (n, true),
        _ => (args[0].as_str(), false),
    };
    if args.get(1).map(String::as_str) == Some("--event") {
        // The case's ALB event, for the whole Lambda loop (scripts/bench-loop-instructions.sh).
        use std::io::Write;
        let event = build(name, twin).event;
        std::io::stdout().write_all(&event).unwrap();
        return;
    }
    let n: usize = args
        .get(1)
        .and_then(|n| n.parse().ok())
        .expect("the number of reviews");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let case = build(name, twin);
    let run = || {
        // What the first review adds to the resident set at its peak: the high-water mark is
        // reset (`5` into clear_refs) after the case is built, so set-up's own peak is not it.
        let start = reset_peak_rss_kib();
        let first = invoke(&rt, &case.front, &case.event);
        let peak = start.map_or_else(
            || "unknown (no /proc/self/clear_refs)".to_owned(),
            |start| format!("+{} KiB", status_kib("VmHWM:").saturating_sub(start)),
        );
        check(&args[0], &first, case.mutated);
        for _ in 0..n {
            black_box(invoke(&rt, &case.front, black_box(&case.event)));
        }
        eprintln!(
            "{}: {} reviews, event {} B, reply {} B, peak RSS {peak}",
            args[0],
            n,
            case.event.len(),
            first.len()
        );
    };
    if case.logged {
        // Production's JSON audit line at INFO, written to a sink.
        let subscriber = podmutator::logging::json_subscriber(
            std::io::sink,
            podmutator::logging::log_filter("info").unwrap(),
        );
        tracing::subscriber::with_default(subscriber, run);
    } else {
        run();
    }
}
