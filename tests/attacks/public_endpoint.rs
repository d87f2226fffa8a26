//! Hole 10 of issue 25: the path token is no secret from cluster users (the API server quotes
//! the webhook's URL, token included, in the errors it returns to whoever creates a pod), so a
//! webhook that writes secret values into its replies must never answer through an endpoint
//! on the internet. Driven with the real Lambda event envelopes of `events/`, through
//! `lambda_http`'s own types, as the runtime hands them to the function.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use base64::Engine;
use lambda_http::request::LambdaRequest;
use podmutator::transport::lambda::handle;
use podmutator_core::config::Config;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::StaticSource;
use serde_json::{Value, json};

use super::common::*;

const TOKEN: &str = "public-endpoint-test-token-0123456789abcdef";
const VALUE: &str = "SENTINEL-public-7d2a-value";
const ID: &str = "u__org__flyte__domain__development__project__flytesnacks__key__db";
const FETCHER: &str = "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The internet-facing sources, by their event file, and how the refusal names them.
const PUBLIC: [(&str, &str); 3] = [
    ("events/apigw-http-mutate.json", "API Gateway (HTTP API)"),
    ("events/apigw-rest-mutate.json", "API Gateway (REST API)"),
    ("events/function-url-mutate.json", "a Lambda Function URL"),
];
const ALB: &str = "events/alb-mutate.json";

fn config(embedded: Value) -> Config {
    let mut e = embedded;
    e["organization"] = json!("flyte");
    Config::from_value(json!({
        "webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}},
        "http": {"pathTokenSha256": hex_sha256(TOKEN)},
        "embedded": e
    }))
    .unwrap_or_else(|e| panic!("{e}"))
    .config
}

/// A task pod asking for `db` as an env var, as the API server sends its review.
fn review() -> Vec<u8> {
    let secrets = [Secret {
        key: "db".into(),
        mount_requirement: MountRequirement::EnvVar,
        ..Default::default()
    }];
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit:1", "command": ["python", "task.py"]}]}
    });
    serde_json::to_vec(&create_review(&pod, "flytesnacks-development")).unwrap()
}

/// `file`'s event addressed to `path`, carrying `body` as the source encodes it.
fn event(file: &str, path: &str, body: &[u8]) -> LambdaRequest {
    let mut ev = read_json(&root().join(file));
    for key in ["rawPath", "path"] {
        if ev.get(key).is_some() {
            ev[key] = json!(path);
        }
    }
    ev["body"] = if ev["isBase64Encoded"] == true {
        json!(base64::engine::general_purpose::STANDARD.encode(body))
    } else {
        json!(String::from_utf8(body.to_vec()).unwrap())
    };
    serde_json::from_value(ev).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn shared(s: &StaticSource) -> Arc<StaticSource> {
    Arc::new(StaticSource {
        values: s.values.clone(),
        calls: Arc::clone(&s.calls),
    })
}

/// Every route runs the secrets mutator on a pod it selects (the chain is one for all entries),
/// so the refusal holds on every path, not only on the secrets entry's.
#[tokio::test]
async fn a_value_delivery_review_through_a_public_event_source_gets_500_and_no_value() {
    let path = format!("/{TOKEN}/mutate--v1-pod");
    for embedded in [
        json!({}),
        json!({"delivery": "reference", "envVarDelivery": "value", "fetcherImage": FETCHER}),
    ] {
        let values = StaticSource::default().with(ID, VALUE);
        let front = webhook(
            &config(embedded.clone()),
            Deps::offline()
                .with_source(shared(&values))
                .with_resolver(shared(&values)),
        );
        let every_path = podmutator::transport::http::ROUTES.map(|(p, _)| format!("/{TOKEN}{p}"));
        for ((file, named), path) in PUBLIC
            .iter()
            .flat_map(|public| every_path.iter().map(move |p| (*public, p)))
        {
            let reply = handle(&front, event(file, path, &review())).await;
            let body = String::from_utf8_lossy(reply.body()).into_owned();
            assert!(
                !body.contains(VALUE),
                "{embedded} {file} {path}: a value in the reply"
            );
            let resp = response(reply.body());
            assert!(
                !resp["patch"].is_string() || !patch_of(&resp).to_string().contains(VALUE),
                "{embedded} {file} {path}: a value in the reply's patch"
            );
            assert_eq!(reply.status(), 500, "{embedded} {file} {path}");
            let msg = response(reply.body())["status"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(msg.contains(named), "{file}: {msg}");
            assert!(msg.contains("internal ALB"), "{file}: {msg}");
            assert!(
                msg.contains("embedded.delivery: reference"),
                "{file}: {msg}"
            );
            // A wrong token still learns nothing, not even that the deployment is wrong.
            let wrong = handle(&front, event(file, "/guess/mutate--v1-pod", &review())).await;
            assert_eq!(wrong.status(), 404, "{file}");
        }
        assert_eq!(
            values.calls.load(Ordering::Relaxed),
            0,
            "{embedded}: nothing fetched or resolved"
        );
        // Control: the internal ALB serves the same review, value included.
        let reply = handle(&front, event(ALB, &path, &review())).await;
        assert_eq!(reply.status(), 200, "{embedded}");
        let resp = response(reply.body());
        assert_eq!(resp["allowed"], true, "{embedded}: {}", resp["status"]);
        let patch = patch_of(&resp).to_string();
        assert!(
            patch.contains(VALUE),
            "{embedded}: the ALB control got no value"
        );
    }
}

/// What a public endpoint may serve: reference delivery, whose replies name secrets and never
/// carry a value.
#[tokio::test]
async fn reference_delivery_through_a_public_event_source_is_served_names_only() {
    let names = StaticSource::default().with(ID, VALUE);
    let front = webhook(
        &config(json!({"delivery": "reference", "fetcherImage": FETCHER})),
        Deps::offline().with_resolver(shared(&names)),
    );
    let path = format!("/{TOKEN}/mutate--v1-pod");
    for (file, _) in PUBLIC {
        let reply = handle(&front, event(file, &path, &review())).await;
        let body = String::from_utf8_lossy(reply.body()).into_owned();
        assert!(!body.contains(VALUE), "{file}: a value in the reply");
        assert_eq!(reply.status(), 200, "{file}: {body}");
        let resp = response(reply.body());
        assert_eq!(resp["allowed"], true, "{file}: {resp}");
        let patch = patch_of(&resp).to_string();
        assert!(patch.contains(ID), "{file}: the reply names the secret");
        assert!(!patch.contains(VALUE) && !body.contains(VALUE), "{file}");
    }
}
