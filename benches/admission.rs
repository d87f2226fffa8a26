//! The full admission path (review bytes in -> response bytes out, [`App::review`]) beside two
//! floors: the old one, `serde_json` parse + serialise of the review into an untyped `Value`,
//! and the honest one, that plus parse + serialise of the response body this admission
//! returns (a large reply is work the old floor never counted). Prints criterion's usual
//! report, then one table of medians and both ratios per case. Asserts nothing about time
//! (targets are reported in docs/performance.md, never enforced).
//!
//!     CARGO_TARGET_DIR=/work/target-bench cargo bench --bench admission
//!     cargo bench --bench admission -- task_3_k8s        # one case (criterion filter)
//!     ADMISSION_SCALING=1 cargo bench --bench admission  # scaling curves as CSV (no criterion)
//!
//! Cases (all pod CREATE reviews, built with Flyte's annotation codec):
//! - `a_bare`: a pod no mutator selects (no secrets label) -> allowed, no patch;
//! - `b_task_3_k8s`: a Flyte task pod with 3 K8s secrets (2 env, 1 file), K8s manager only;
//!   `b_task_3_k8s_logged` is the same with production logging (JSON audit line) and the EMF
//!   metrics line, both written to memory/`io::sink` instead of stdout;
//! - `c_task_20_mixed`: 20 secrets through production's first-wins order `[AWS, Vault, K8s]`:
//!   the 14 FILE secrets get AWS fetcher init containers (listed first), the 6 ENV_VAR ones go
//!   to K8s (AWS and Vault refuse ENV_VAR);
//!   `c_task_20_embedded`: the same pod with Embedded listed first and the 6 env values in an
//!   in-memory `StaticSource` behind the production `CachingSource`, cache warm (the other 14
//!   are warm negative entries and fall through to the next manager, as in production);
//! - `d_maximal_pod`: Kubernetes' maximal Pod (every field set, 61 kB) selected for 3 K8s
//!   secrets; `d_maximal_pod_mesh`: the same with config/local.yaml (mesh mutators on), the pod
//!   labelled managed and sent to `/mutate/managed-pod`;
//! - `e_ten_thousand_containers`: the task pod of b with 10,000 containers and one ENV_VAR
//!   secret, which each of them gets (b's three would make an 11 MB reply, which the webhook
//!   refuses), `limits.maxObjectsPerReview` raised to admit it;
//!   `e_ten_thousand_unselected`: the same pod without the selector label (same size, parsed
//!   and allowed untouched), the yardstick for e;
//! - `f_images_builder_10`, `f_images_rules_10`: a pod with 10 containers whose images both
//!   image mutators rewrite (the Union image builder on `/mutate--v1-pod/image-builder`, the
//!   ECR pull-through rules on `/mutate/images`; one app has both enabled).

/// The binary's allocator (`src/main.rs`), so the figures are production's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod pods;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;
use criterion::Criterion;
use podmutator_core::config::Config;
use podmutator_core::metrics::Sink;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::{App, Deps};
use serde_json::{Value, json};

use pods::{NS, embedded_first, secret, task_pod, three_k8s, twenty_mixed};

/// One benchmark case: an app, a route and a review body.
struct Case {
    name: &'static str,
    what: &'static str,
    app: App,
    route: Route,
    body: Vec<u8>,
    /// Production logging + metrics (to memory / `io::sink`) while this case runs.
    logged: Option<Arc<Mutex<Vec<String>>>>,
    /// Whether the reply carries a patch (checked before timing).
    mutated: bool,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A pod CREATE review around `pod`, as the API server sends it.
fn create_review(pod: &Value, namespace: &str) -> Vec<u8> {
    serde_json::to_vec(&podmutator_core::admission::create_review(pod, namespace)).unwrap()
}

fn config(v: Value) -> Config {
    Config::from_value(v).expect("bench config is valid").config
}

/// The production app for `config`, built by `App::build`, metrics off.
fn app(config: &Config) -> App {
    App::build(config, Deps::offline())
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

fn maximal_pod() -> Value {
    let path = root().join("tests/fixtures/kubernetes-api/k8s-HEAD-core.v1.Pod.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn local_yaml() -> Config {
    let path = root().join("config/local.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    Config::load(Some(("config/local.yaml", &text)), None)
        .expect("config/local.yaml loads")
        .config
}

fn cases() -> Vec<Case> {
    let k8s = config(json!({"webhook": {"secretManagerTypes": ["K8s"]}}));
    let mut out = vec![
        Case {
            name: "a_bare",
            what: "bare pod, no mutator selects it",
            app: app(&k8s),
            route: Route::Secrets,
            body: create_review(&task_pod(&[]), NS),
            logged: None,
            mutated: false,
        },
        Case {
            name: "b_task_3_k8s",
            what: "Flyte task pod, 3 K8s secrets (2 env, 1 file)",
            app: app(&k8s),
            route: Route::Secrets,
            body: create_review(&task_pod(&three_k8s()), NS),
            logged: None,
            mutated: true,
        },
    ];
    let lines = Arc::new(Mutex::new(Vec::new()));
    out.push(Case {
        name: "b_task_3_k8s_logged",
        what: "b + JSON audit log line + EMF metrics line (to memory)",
        app: App::build(
            &k8s,
            Deps::offline().with_metrics(Some(Sink::Memory(lines.clone()))),
        ),
        route: Route::Secrets,
        body: create_review(&task_pod(&three_k8s()), NS),
        logged: Some(lines),
        mutated: true,
    });

    let mixed = config(json!({"webhook": {"secretManagerTypes": ["AWS", "Vault", "K8s"]}}));
    out.push(Case {
        name: "c_task_20_mixed",
        what: "20 secrets: 6 K8s env, 4 K8s file, 5 Vault, 5 AWS fetcher",
        app: app(&mixed),
        route: Route::Secrets,
        body: create_review(&task_pod(&twenty_mixed()), NS),
        logged: None,
        mutated: true,
    });

    let (embedded, cached) = embedded_first();
    let embedded = config(embedded);
    out.push(Case {
        name: "c_task_20_embedded",
        what: "c with Embedded first: 6 env values from a warm cache, 14 fall through",
        app: App::build(&embedded, Deps::offline().with_source(Arc::new(cached))),
        route: Route::Secrets,
        body: create_review(&task_pod(&twenty_mixed()), NS),
        logged: None,
        mutated: true,
    });

    let maximal = select(
        maximal_pod(),
        &[("inject-flyte-secrets", "true")],
        &three_k8s(),
    );
    out.push(Case {
        name: "d_maximal_pod",
        what: "Kubernetes' maximal Pod, 3 K8s secrets",
        app: app(&k8s),
        route: Route::Secrets,
        body: create_review(&maximal, "namespaceValue"),
        logged: None,
        mutated: true,
    });
    let local = local_yaml();
    assert!(local.mesh.enabled, "config/local.yaml turns the mesh on");
    let managed = select(
        maximal_pod(),
        &[
            ("inject-flyte-secrets", "true"),
            (&local.mesh.managed_label, "true"),
        ],
        &three_k8s(),
    );
    out.push(Case {
        name: "d_maximal_pod_mesh",
        what: "d with config/local.yaml (mesh on), managed, /mutate/managed-pod",
        app: app(&local),
        route: Route::ManagedPod,
        body: create_review(&managed, "namespaceValue"),
        logged: None,
        mutated: true,
    });
    // One ENV_VAR secret: with b's three in each of 10,000 containers the reply would be 11 MB,
    // which the webhook refuses (over http.maxReplyBytes' 6 MB). The containers weigh 160,014
    // JSON objects (limits.maxObjectsPerReview's count): over the default 100,000, which refuses
    // the review before it is read, so the limit is raised, as an installation that admits such
    // pods raises it.
    let wide = widen(
        task_pod(&[secret("app-db", "", "password", MountRequirement::EnvVar)]),
        10_000,
    );
    let k8s_wide = config(json!({
        "webhook": {"secretManagerTypes": ["K8s"]},
        "limits": {"maxObjectsPerReview": 400_000}
    }));
    out.push(Case {
        name: "e_ten_thousand_containers",
        what: "b's pod with 10,000 containers and one ENV_VAR secret",
        app: app(&k8s_wide),
        route: Route::Secrets,
        body: create_review(&wide, NS),
        logged: None,
        mutated: true,
    });
    let mut unselected = wide;
    // Same length, so the same bytes to parse: the label's value no longer says "true".
    unselected["metadata"]["labels"]["inject-flyte-secrets"] = json!("none");
    out.push(Case {
        name: "e_ten_thousand_unselected",
        what: "e with the selector label off (same size, allowed untouched)",
        app: app(&k8s_wide),
        route: Route::Secrets,
        body: create_review(&unselected, NS),
        logged: None,
        mutated: false,
    });
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
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ten", "namespace": NS, "labels": {"image-builder": "true"}},
            "spec": {"containers": (0..10).map(|i| json!({"name": format!("c{i}"), "image": image(i)})).collect::<Vec<_>>()}})
    };
    let builder_pod = ten(&|i| format!("registry.union.example/{NS}/task-{i}:v1"));
    out.push(Case {
        name: "f_images_builder_10",
        what: "10 containers rewritten and verified by the Union image builder",
        app: app(&images),
        route: Route::ImageBuilder,
        body: create_review(&builder_pod, NS),
        logged: None,
        mutated: true,
    });
    let sources = [
        "nginx:1.27",
        "quay.io/prometheus/node-exporter:v1.8.0",
        "ghcr.io/example/app:v2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ];
    let rules_pod = ten(&|i| sources[i % sources.len()].to_owned());
    out.push(Case {
        name: "f_images_rules_10",
        what: "10 containers rewritten by images.rules (ECR pull-through)",
        app: app(&images),
        route: Route::Images,
        body: create_review(&rules_pod, NS),
        logged: None,
        mutated: true,
    });
    out
}

/// `pod` with its one container repeated `n` times (names `task-<i>`).
fn widen(mut pod: Value, n: usize) -> Value {
    let first = pod["spec"]["containers"][0].clone();
    pod["spec"]["containers"] = (0..n)
        .map(|i| {
            let mut c = first.clone();
            c["name"] = json!(format!("task-{i}"));
            c
        })
        .collect();
    pod
}

/// The JSON Patch of a reply, decoded.
fn patch_ops(reply: &[u8]) -> (bool, Vec<Value>, Vec<String>) {
    let v: Value = serde_json::from_slice(reply).expect("reply is JSON");
    let resp = &v["response"];
    let ops = resp["patch"].as_str().map_or_else(Vec::new, |b64| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    });
    let warnings = resp["warnings"]
        .as_array()
        .map(|w| w.iter().map(|x| x.to_string()).collect())
        .unwrap_or_default();
    (resp["allowed"] == true, ops, warnings)
}

/// The floor: parse the same bytes into an untyped `Value` and write it back.
fn floor(body: &[u8]) -> Vec<u8> {
    let v: Value = serde_json::from_slice(body).unwrap();
    serde_json::to_vec(&v).unwrap()
}

fn output_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    // <target>/<profile>/deps/admission-<hash>
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(|t| t.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// Criterion's median estimate for `group/id`, in nanoseconds, if this run (started at
/// `since`) measured it.
fn median_ns(dir: &Path, group: &str, id: &str, since: SystemTime) -> Option<f64> {
    let path = dir.join(group).join(id).join("new/estimates.json");
    if std::fs::metadata(&path).ok()?.modified().ok()? < since {
        return None; // left over from an earlier run (e.g. filtered out this time)
    }
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn main() {
    let started = SystemTime::now();
    let dir = output_dir();
    // BENCH_QUICK=1 (scripts/bench/quick.sh): a smoke run, criterion's fewest samples, each
    // taken once; every case is still checked first.
    let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| v == "1");
    let (warm_up, measure, samples) = if quick { (1, 1, 10) } else { (2000, 4000, 60) };
    let mut c = Criterion::default()
        .output_directory(&dir)
        .warm_up_time(Duration::from_millis(warm_up))
        .measurement_time(Duration::from_millis(measure))
        .sample_size(samples)
        .configure_from_args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cases = cases();

    // Check every case does what its name says before timing it.
    let mut facts = Vec::new();
    let mut replies = Vec::new();
    for case in &cases {
        let reply = rt.block_on(case.app.review(case.route, &case.body));
        let (allowed, ops, warnings) = patch_ops(&reply.body);
        assert!(
            reply.status == 200 && allowed && warnings.is_empty(),
            "{}: {} {}",
            case.name,
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(!ops.is_empty(), case.mutated, "{}", case.name);
        facts.push((case.body.len(), reply.body.len(), ops.len()));
        replies.push(reply.body);
    }

    if std::env::var_os("ADMISSION_SCALING").is_some() {
        scaling(&rt);
        return;
    }

    // Profiling mode (no criterion): `ADMISSION_PROFILE=<case>[:floor] ADMISSION_ITERS=N`, e.g.
    // under `valgrind --tool=callgrind`, runs one case's review (or its floor) N times.
    if let Ok(spec) = std::env::var("ADMISSION_PROFILE") {
        let (name, floor_only) = match spec.split_once(':') {
            Some((n, "floor")) => (n.to_owned(), true),
            _ => (spec.clone(), false),
        };
        let iters: usize = std::env::var("ADMISSION_ITERS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1000);
        let case = cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        let run = || {
            for _ in 0..iters {
                if floor_only {
                    black_box(floor(black_box(&case.body)));
                } else {
                    black_box(rt.block_on(case.app.review(case.route, black_box(&case.body))));
                    if let Some(lines) = &case.logged {
                        lines.lock().unwrap().clear();
                    }
                }
            }
        };
        match &case.logged {
            Some(_) => tracing::subscriber::with_default(audit_subscriber(), run),
            None => run(),
        }
        return;
    }

    for (case, reply) in cases.iter().zip(&replies) {
        let mut group = c.benchmark_group(case.name);
        if quick {
            group.sampling_mode(criterion::SamplingMode::Flat);
        }
        let run = |group: &mut criterion::BenchmarkGroup<'_, _>| {
            group.bench_function("review", |b| {
                b.iter(|| {
                    let reply = rt.block_on(case.app.review(case.route, black_box(&case.body)));
                    if let Some(lines) = &case.logged {
                        lines.lock().unwrap().clear();
                    }
                    reply
                })
            });
        };
        match &case.logged {
            Some(_) => tracing::subscriber::with_default(audit_subscriber(), || run(&mut group)),
            None => run(&mut group),
        }
        group.bench_function("json_floor", |b| b.iter(|| floor(black_box(&case.body))));
        group.bench_function("reply_floor", |b| b.iter(|| floor(black_box(reply))));
        group.finish();
    }
    c.final_summary();

    let table: Vec<_> = cases
        .iter()
        .zip(&facts)
        .map(|(case, fact)| {
            let review = median_ns(&dir, case.name, "review", started);
            let floor = median_ns(&dir, case.name, "json_floor", started);
            let reply = median_ns(&dir, case.name, "reply_floor", started);
            (case, fact, review, floor, reply)
        })
        .filter(|(_, _, r, f, p)| r.is_some() || f.is_some() || p.is_some())
        .collect();
    if table.is_empty() {
        return; // `cargo test --benches` or a filter that ran nothing: no table.
    }
    let us = |ns: Option<f64>| ns.map_or("n/a".into(), |ns| format!("{:.1}", ns / 1e3));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "n/a".into(),
    };
    println!();
    println!(
        "admission path vs its floors (criterion medians; old floor = request parse + serialise, \
         new floor = old + the same for the reply; target: review <= 2x the new floor)"
    );
    println!(
        "{:<26} | {:>8} {:>8} {:>5} | {:>10} {:>10} {:>10} | {:>8} {:>8} | what",
        "case", "in B", "out B", "ops", "review us", "old fl us", "new fl us", "x old", "x new"
    );
    for (case, (inb, outb, ops), review, floor, reply) in table {
        let new_floor = floor.zip(reply).map(|(f, r)| f + r);
        println!(
            "{:<26} | {:>8} {:>8} {:>5} | {:>10} {:>10} {:>10} | {:>8} {:>8} | {}",
            case.name,
            inb,
            outb,
            ops,
            us(review),
            us(floor),
            us(new_floor),
            ratio(review, floor),
            ratio(review, new_floor),
            case.what
        );
    }
}

/// The production log subscriber (`logging::init_logging`'s JSON lines at INFO), writing to a sink.
fn audit_subscriber() -> impl tracing::Subscriber + Send + Sync {
    podmutator::logging::json_subscriber(
        std::io::sink,
        podmutator::logging::log_filter("info").unwrap(),
    )
}

/// Median of `f`'s wall time in microseconds: 3 warm-up calls, then at least 7 timed calls and
/// at least 0.3 s of them.
fn median_us(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut times = Vec::new();
    let started = std::time::Instant::now();
    while times.len() < 7 || started.elapsed() < Duration::from_millis(300) {
        let t = std::time::Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The scaling curves (`ADMISSION_SCALING=1`): admission time and its new floor against the
/// number of secrets, of containers, and the pod's size, as CSV on stdout
/// (`series,x,in_bytes,out_bytes,review_us,floor_us`). scripts/bench-scaling.sh plots them.
fn scaling(rt: &tokio::runtime::Runtime) {
    // The cap on secret requests (`limits`) raised past the largest point: the curve measures
    // what 1,000 requests cost, not their refusal.
    let k8s = config(json!({
        "webhook": {"secretManagerTypes": ["K8s"]},
        "limits": {"maxSecretRequestsPerPod": 1000, "maxObjectsPerReview": 400_000}
    }));
    let app = app(&k8s);
    let mut points: Vec<(&str, usize, Vec<u8>)> = Vec::new();
    for n in [1, 3, 10, 30, 100, 300, 1000] {
        // Half env vars, half files, all keys of one K8s Secret.
        let secrets: Vec<_> = (0..n)
            .map(|i| {
                let mount = if i % 2 == 0 {
                    MountRequirement::EnvVar
                } else {
                    MountRequirement::File
                };
                secret("app-db", "", &format!("key-{i}"), mount)
            })
            .collect();
        points.push(("secrets", n, create_review(&task_pod(&secrets), NS)));
    }
    // One ENV_VAR secret in every container: with b's three, 10,000 containers make an 11 MB
    // reply, which the webhook refuses (http.maxReplyBytes).
    let one = [secret("app-db", "", "password", MountRequirement::EnvVar)];
    for n in [1, 10, 100, 1000, 10_000] {
        let pod = widen(task_pod(&one), n);
        points.push(("containers", n, create_review(&pod, NS)));
    }
    // The task pod of b, its container's args replaced by 100-byte ones up to the size (1 kB,
    // the pod without args, to etcd's 1.5 MB).
    for kb in [1usize, 4, 16, 64, 256, 1024, 1536] {
        let mut pod = task_pod(&three_k8s());
        pod["spec"]["containers"][0]["args"] = json!([]);
        let mut size = create_review(&pod, NS).len();
        let mut args = Vec::new();
        while size + 100 <= kb * 1024 {
            args.push(json!(format!("--arg-{:0>90}", args.len())));
            size += 97;
        }
        pod["spec"]["containers"][0]["args"] = json!(args);
        points.push(("pod_bytes", kb * 1024, create_review(&pod, NS)));
    }
    println!("series,x,in_bytes,out_bytes,review_us,floor_us");
    for (series, x, body) in points {
        let reply = rt.block_on(app.review(Route::Secrets, &body));
        let (allowed, ops, _) = patch_ops(&reply.body);
        assert!(
            allowed && !ops.is_empty(),
            "{series} {x}: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(400)])
        );
        let review = median_us(|| {
            black_box(rt.block_on(app.review(Route::Secrets, black_box(&body))));
        });
        let floor_us = median_us(|| {
            black_box(floor(black_box(&body)));
            black_box(floor(black_box(&reply.body)));
        });
        println!(
            "{series},{x},{},{},{review:.2},{floor_us:.2}",
            body.len(),
            reply.body.len()
        );
    }
}
