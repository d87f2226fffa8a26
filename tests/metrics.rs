//! CloudWatch Embedded Metric Format lines, parsed back the way CloudWatch reads them.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use podmutator_aws::secretsmanager::{CachePolicy, CachingSource};
use podmutator_core::config::Config;
use podmutator_core::metrics::Sink;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::StaticSource;
use serde_json::{Value, json};

fn app(config: Value) -> (Front, Arc<Mutex<Vec<String>>>) {
    app_with(config, Deps::offline())
}

fn app_with(config: Value, deps: Deps) -> (Front, Arc<Mutex<Vec<String>>>) {
    let config = Config::from_value(config).unwrap().config;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let deps = deps.with_metrics(Some(Sink::Memory(lines.clone())));
    (webhook(&config, deps), lines)
}

fn flyte_review() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap()
}

/// Every metric a directive declares must be a number at the top level, and every dimension a
/// string: otherwise CloudWatch drops the line.
fn check_emf(line: &str) -> Value {
    let v: Value = serde_json::from_str(line).unwrap();
    let aws = &v["_aws"];
    assert!(aws["Timestamp"].as_u64().unwrap() > 1_700_000_000_000);
    for d in aws["CloudWatchMetrics"].as_array().unwrap() {
        assert!(d["Namespace"].is_string());
        for set in d["Dimensions"].as_array().unwrap() {
            for dim in set.as_array().unwrap() {
                assert!(
                    v[dim.as_str().unwrap()].is_string(),
                    "dimension {dim} in {line}"
                );
            }
        }
        for m in d["Metrics"].as_array().unwrap() {
            let name = m["Name"].as_str().unwrap();
            assert!(v[name].is_number(), "metric {name} in {line}");
        }
    }
    v
}

#[tokio::test]
async fn a_mutated_admission_reports_mutators_and_secrets_by_manager() {
    let (app, lines) = app(
        json!({"metrics": {"namespace": "Flyte/Webhook", "dimensions": {"Cluster": "prod-eks"}}}),
    );
    app.review(Route::Secrets, &flyte_review()).await;
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 1);
    let v = check_emf(&lines[0]);
    let d = &v["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(d["Namespace"], "Flyte/Webhook");
    assert_eq!(
        d["Dimensions"],
        json!([["Cluster", "Route", "Decision"], ["Cluster", "Decision"]])
    );
    assert_eq!(v["Cluster"], "prod-eks");
    assert_eq!(v["Route"], "secrets");
    assert_eq!(v["Decision"], "mutated");
    // The release that answered: a property of every line, not a dimension.
    assert_eq!(v["Version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["Admissions"], 1);
    assert_eq!(v["MutatorsApplied"], 1);
    assert_eq!(v["Mutator_secrets"], 1);
    assert_eq!(v["SecretsInjected"], 1);
    assert_eq!(v["SecretsInjected_K8s"], 1);
    assert_eq!(v["PatchOps"], 2);
    assert!(v["PatchBytes"].as_u64().unwrap() > 100);
    assert!(v["Duration"].is_u64());
    assert!(v.get("Denials").is_none());
}

#[tokio::test]
async fn a_denial_is_counted_by_reason() {
    let (app, lines) = app(json!({}));
    let mut review: Value = serde_json::from_slice(&flyte_review()).unwrap();
    review["request"]["object"]["metadata"]["annotations"]["flyte.secrets/s0"] = json!("!!");
    app.review(Route::Secrets, &serde_json::to_vec(&review).unwrap())
        .await;
    app.review(Route::Secrets, b"{not json").await;
    let lines = lines.lock().unwrap();
    let denied = check_emf(&lines[0]);
    assert_eq!(denied["Decision"], "denied");
    assert_eq!(denied["Reason"], "BadSecretAnnotation");
    assert_eq!(denied["Denials"], 1);
    assert_eq!(
        denied["_aws"]["CloudWatchMetrics"][1]["Dimensions"],
        json!([["Reason"]])
    );
    let invalid = check_emf(&lines[1]);
    assert_eq!(invalid["Decision"], "invalid");
    assert_eq!(invalid["Reason"], "BadRequest");
}

#[tokio::test]
async fn embedded_fetches_and_cache_hits_are_reported_and_values_are_not() {
    let config = json!({"webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}}, "embedded": {"organization": "flyte"}});
    let source = CachingSource::new(
        StaticSource::default().with(
            "u__org__flyte__domain____project____key__token",
            "SENTINEL-metrics-value",
        ),
        CachePolicy {
            // Longer than any stall between the cold and the warm admission.
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            max_entries: 100,
            max_bytes: 1 << 20,
        },
    );
    let (app, lines) = app_with(config, Deps::offline().with_source(Arc::new(source)));
    let secret = Secret {
        key: "token".into(),
        mount_requirement: MountRequirement::EnvVar,
        ..Default::default()
    };
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "t", "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
                     "annotations": encode_annotations(&[secret]).unwrap()},
        "spec": {"containers": [{"name": "main", "image": "x"}]}
    });
    let body = serde_json::to_vec(&create_review(&pod, "flytesnacks-development")).unwrap();
    app.review(Route::Secrets, &body).await;
    app.review(Route::Secrets, &body).await;
    let lines = lines.lock().unwrap();
    let cold = check_emf(&lines[0]);
    let warm = check_emf(&lines[1]);
    assert_eq!(cold["SecretsInjected_Embedded"], 1);
    assert_eq!(
        (
            cold["EmbeddedFetchIds"].as_u64(),
            cold["EmbeddedFetchCalls"].as_u64(),
            cold["CacheHits"].as_u64(),
            cold["CacheMisses"].as_u64()
        ),
        (Some(3), Some(1), Some(0), Some(3))
    );
    assert_eq!(cold["SecretsManagerThrottles"], 0);
    assert_eq!(
        (
            warm["EmbeddedFetchCalls"].as_u64(),
            warm["CacheHits"].as_u64(),
            warm["CacheMisses"].as_u64()
        ),
        (Some(0), Some(3), Some(0))
    );
    for l in lines.iter() {
        assert!(!l.contains("SENTINEL"), "a value reached the metrics");
    }
}

#[test]
fn metrics_config_is_validated() {
    for (bad, key) in [
        (json!({"metrics": {"namespace": ""}}), "metrics.namespace"),
        (
            json!({"metrics": {"dimensions": {"Route": "x"}}}),
            "metrics.dimensions.Route",
        ),
        // The version property would be written twice too.
        (
            json!({"metrics": {"dimensions": {"Version": "x"}}}),
            "metrics.dimensions.Version",
        ),
        (
            json!({"metrics": {"dimensions": {"Team": ""}}}),
            "metrics.dimensions.Team",
        ),
        // A metric's name would be written twice on the line, and CloudWatch keeps one.
        (
            json!({"metrics": {"dimensions": {"Duration": "x"}}}),
            "metrics.dimensions.Duration",
        ),
        (
            json!({"metrics": {"dimensions": {"Mutator_mesh": "x"}}}),
            "metrics.dimensions.Mutator_mesh",
        ),
    ] {
        let err = Config::from_value(bad).unwrap_err();
        assert_eq!(err.key, key);
    }
}

/// The Union image builder's counters (§5.6 of the spec: attempts, failures, replacements by
/// version and type, container validations), as EMF metrics of the image-builder route, on a
/// denial as on a rewrite.
#[tokio::test]
async fn the_image_builder_reports_its_counters_on_rewrites_and_denials() {
    let (app, lines) = app(json!({"webhook": {"imageBuilderConfig": {"enabled": true,
        "hostnameReplacement": {"existing": "e.example", "replacement": "r.example"},
        "labelSelector": {"matchLabels": {"image-builder": "true"}}}}}));
    let pod = |images: &[&str]| {
        json!({"metadata": {"name": "p", "labels": {"image-builder": "true"}}, "spec": {"containers":
            images.iter().enumerate().map(|(i, image)| json!({"name": format!("c{i}"), "image": image})).collect::<Vec<_>>()}})
    };
    let review = |p: Value| serde_json::to_vec(&create_review(&p, "acme")).unwrap();
    app.review(
        Route::ImageBuilder,
        &review(pod(&["e.example/acme/a:1", "e.example/v1/unionai/b:1"])),
    )
    .await;
    app.review(Route::ImageBuilder, &review(pod(&["e.example/globex/a:1"])))
        .await;
    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 2);
    let (ok, denied) = (check_emf(&lines[0]), check_emf(&lines[1]));
    assert_eq!(ok["Route"], "image-builder");
    assert_eq!(ok["Mutator_image-builder"], 1);
    assert_eq!(ok["ImageBuilderAttempts"], 1);
    assert_eq!(ok["ImageBuilderReplacements_org_none"], 1);
    assert_eq!(ok["ImageBuilderReplacements_public_v1"], 1);
    assert_eq!(ok["ImageBuilderV1ContainerValidationAttempts"], 2);
    assert!(ok.get("ImageBuilderFailures").is_none(), "{ok}");
    assert_eq!(denied["Decision"], "denied");
    assert_eq!(denied["Reason"], "ImageNotAuthorized");
    assert_eq!(denied["ImageBuilderFailures"], 1);
    assert_eq!(denied["ImageBuilderV1ContainerValidationFailures"], 1);
    assert_eq!(denied["ImageBuilderReplacements_org_none"], 1);
}

/// A token mismatch after a rotation, a wrong path in the registration, a wrong method: each
/// refusal kind is logged (WARN, one line per kind per 10 s, with the count) and counted
/// (`Refusals` by `Refusal`), and a refused path token is never written anywhere.
#[tokio::test]
async fn requests_refused_before_the_admission_are_logged_and_counted_by_kind() {
    use podmutator::transport::http::Routed;
    let token = "refusal-test-token-0123456789abcdefghijk";
    let guess = "guessed-token-0123456789abcdefghijklmnopq";
    let (front, lines) = app(json!({"http": {"pathToken": token}}));
    let logs = Logs::default();
    let writer = logs.clone();
    let _guard = tracing::subscriber::set_default(podmutator::logging::json_subscriber(
        move || writer.clone(),
        podmutator::logging::log_filter("info").unwrap(),
    ));
    let json = Some("application/json");
    for _ in 0..3 {
        let r = front.route(None, "POST", &format!("/{guess}/mutate--v1-pod"), json);
        assert!(matches!(r, Routed::Answer(ref a) if a.status == 404));
    }
    let r = front.route(None, "POST", &format!("/{token}/mutate--v2-pod"), json);
    assert!(matches!(r, Routed::Answer(ref a) if a.status == 404));
    let r = front.route(None, "GET", &format!("/{token}/mutate--v1-pod"), json);
    assert!(matches!(r, Routed::Answer(ref a) if a.status == 405));
    let r = front.route(
        None,
        "POST",
        &format!("/{token}/mutate--v1-pod"),
        Some("text/plain"),
    );
    assert!(matches!(r, Routed::Answer(ref a) if a.status == 400));
    let r = front.route(None, "POST", &format!("/{token}/mutate--v1-pod"), json);
    assert!(
        matches!(r, Routed::Review(_)),
        "the right token is no refusal"
    );

    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warned: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["message"] == "request refused before the admission")
        .collect();
    let kinds: Vec<&str> = warned
        .iter()
        .map(|v| v["refusal"].as_str().unwrap())
        .collect();
    // The first of each kind, at once; the next two token refusals wait for the next window.
    assert_eq!(
        kinds,
        ["PathToken", "NotFound", "Method", "ContentType"],
        "{logged}"
    );
    assert!(warned.iter().all(|v| v["level"] == "WARN"));
    assert_eq!(warned[0]["count"], 1);
    assert_eq!(
        warned[1]["path"], "/mutate--v2-pod",
        "the path after the token"
    );
    assert!(
        !logged.contains(guess) && !logged.contains(token),
        "{logged}"
    );

    let emitted: Vec<Value> = lines.lock().unwrap().iter().map(|l| check_emf(l)).collect();
    let refusals: Vec<(&str, u64)> = emitted
        .iter()
        .filter(|v| v.get("Refusals").is_some())
        .map(|v| {
            (
                v["Refusal"].as_str().unwrap(),
                v["Refusals"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("PathToken", 1),
            ("NotFound", 1),
            ("Method", 1),
            ("ContentType", 1)
        ]
    );
    let all_lines = lines.lock().unwrap().join("\n");
    assert!(!all_lines.contains(guess) && !all_lines.contains(token));
}

/// A body over `http.maxBodyBytes` is refused before the admission like the others: a WARN
/// line (once per window, without the path, which would hold the token) and `Refusals` with
/// `Refusal=BodyTooLarge`; the caller's 400 names the limit.
#[tokio::test]
async fn a_body_over_the_limit_is_logged_and_counted_as_a_refusal() {
    let token = "refusal-test-token-0123456789abcdefghijk";
    let (front, lines) = app(json!({"http": {"pathToken": token, "maxBodyBytes": 2048}}));
    let logs = Logs::default();
    let writer = logs.clone();
    let _guard = tracing::subscriber::set_default(podmutator::logging::json_subscriber(
        move || writer.clone(),
        podmutator::logging::log_filter("info").unwrap(),
    ));
    for _ in 0..2 {
        let reply = front.body_too_large(None, "POST");
        assert_eq!(reply.status, 400);
        let body = String::from_utf8_lossy(&reply.body);
        assert!(
            body.contains("2048-byte limit (http.maxBodyBytes)"),
            "{body}"
        );
    }

    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warned: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["message"] == "request refused before the admission")
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "the second waits for the next window: {logged}"
    );
    let line = &warned[0];
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["refusal"], "BodyTooLarge", "{line}");
    assert_eq!(line["method"], "POST", "{line}");
    assert_eq!(line["count"], 1, "{line}");
    assert!(!logged.contains(token), "{logged}");

    let emitted: Vec<Value> = lines.lock().unwrap().iter().map(|l| check_emf(l)).collect();
    let refusals: Vec<(&str, u64)> = emitted
        .iter()
        .filter(|v| v.get("Refusals").is_some())
        .map(|v| {
            (
                v["Refusal"].as_str().unwrap(),
                v["Refusals"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(refusals, [("BodyTooLarge", 1)]);
}

/// The `Refusals` metric of a window that ends with refusals pending (issue 36, hole 6): the
/// first of a burst is sent at once, the rest when the window is flushed (serve's timer, or the
/// end of a Lambda invocation), so the metric's sum is the burst, not its first request.
#[tokio::test]
async fn a_flushed_window_sends_the_rest_of_its_burst_to_the_refusals_metric() {
    let token = "refusal-test-token-0123456789abcdefghijk";
    let (front, lines) = app(json!({"http": {"pathToken": token}}));
    for _ in 0..5 {
        let podmutator::transport::http::Routed::Answer(reply) =
            front.route(Some("10.0.0.9:4000"), "POST", "/wrong/mutate--v1-pod", None)
        else {
            panic!("a wrong token is answered from the head");
        };
        assert_eq!(reply.status, 404);
    }
    let sent = |lines: &Arc<Mutex<Vec<String>>>| -> Vec<u64> {
        lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| check_emf(l))
            .filter(|v| v["Refusal"] == "PathToken")
            .map(|v| v["Refusals"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(sent(&lines), [1], "the first at once, the rest pending");
    front.flush_refusals(true);
    assert_eq!(sent(&lines), [1, 4], "the rest when the window is flushed");
}
