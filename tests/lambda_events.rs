//! Real Lambda event envelopes (events/*.json) through `lambda_http`'s event types and our
//! adapter, as the runtime would deliver them: every source, text and base64 bodies, and broken
//! envelopes that must still get a well-formed answer.

use crate::common;

use common::*;
use lambda_http::request::LambdaRequest;
use podmutator::transport::lambda::{LambdaReply, handle};
use podmutator_core::config::Config;
use rstest::rstest;
use serde_json::{Value, json};

fn app() -> Front {
    webhook(
        &Config::from_value(json!({})).unwrap().config,
        Deps::offline(),
    )
}

fn event(name: &str) -> Value {
    read_json(&root().join("events").join(name))
}

/// Deserialises like the runtime does, then handles and serialises the reply.
async fn invoke(app: &Front, event: &Value) -> (LambdaReply, Value) {
    let req: LambdaRequest = serde_json::from_value(event.clone())
        .unwrap_or_else(|e| panic!("lambda_http rejects the event: {e}"));
    let reply = handle(app, req).await;
    let wire = serde_json::to_value(&reply).unwrap();
    (reply, wire)
}

fn review_of(event: &Value) -> Value {
    use base64::Engine;
    let body = event["body"].as_str().unwrap();
    if event["isBase64Encoded"] == true {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    } else {
        serde_json::from_str(body).unwrap()
    }
}

#[rstest]
#[case::api_gateway_rest("apigw-rest-mutate.json", "ApiGatewayV1")]
#[case::api_gateway_http("apigw-http-mutate.json", "ApiGatewayV2")]
#[case::alb_base64("alb-mutate.json", "Alb")]
#[case::function_url_base64("function-url-mutate.json", "ApiGatewayV2")]
#[tokio::test]
async fn every_event_source_gets_its_patch(#[case] file: &str, #[case] shape: &str) {
    let ev = event(file);
    let (reply, wire) = invoke(&app(), &ev).await;
    let got_shape = match reply {
        LambdaReply::ApiGatewayV1(_) => "ApiGatewayV1",
        LambdaReply::ApiGatewayV2(_) => "ApiGatewayV2",
        LambdaReply::Alb(_) => "Alb",
    };
    assert_eq!(got_shape, shape);
    assert_eq!(wire["statusCode"], 200, "{wire}");
    assert_eq!(wire["isBase64Encoded"], false);
    assert_eq!(wire["headers"]["content-type"], "application/json");
    if shape == "Alb" {
        assert_eq!(wire["statusDescription"], "200 OK");
    }
    let review = review_of(&ev);
    let resp = response(wire["body"].as_str().unwrap().as_bytes());
    assert_eq!(resp["uid"], review["request"]["uid"]);
    assert_eq!(resp["allowed"], true);
    let pod = apply(&review["request"]["object"], &patch_of(&resp));
    assert_eq!(
        pod["spec"]["containers"][0]["env"][0],
        json!({"name": "FLYTE_SECRETS_ENV_PREFIX", "value": "_UNION_"})
    );
}

#[tokio::test]
async fn healthz_over_http_api() {
    let (_, wire) = invoke(&app(), &event("apigw-http-healthz.json")).await;
    assert_eq!(wire["statusCode"], 200);
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"message": "ok", "version": env!("CARGO_PKG_VERSION")})
    );
}

#[tokio::test]
async fn garbage_base64_body_gets_400_not_a_crash() {
    let mut ev = event("alb-mutate.json");
    ev["body"] = json!("%%% not base64 %%%");
    let (_, wire) = invoke(&app(), &ev).await;
    assert_eq!(wire["statusCode"], 400);
    assert_eq!(wire["statusDescription"], "400 Bad Request");
    let msg = response(wire["body"].as_str().unwrap().as_bytes())["status"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("isBase64Encoded but is not valid base64"),
        "{msg}"
    );
}

#[rstest]
#[case::unparseable_path(|e: &mut Value| e["path"] = json!("/mutate--v1-pod with spaces/{}"), 404)]
#[case::bad_host_header(|e: &mut Value| { e["headers"]["Host"] = json!("bad host:99999"); e["multiValueHeaders"]["Host"] = json!(["bad host:99999"]); }, 200)]
#[case::no_body(|e: &mut Value| e["body"] = Value::Null, 400)]
#[case::no_content_type(|e: &mut Value| { e["headers"].as_object_mut().unwrap().remove("Content-Type"); e["multiValueHeaders"].as_object_mut().unwrap().remove("Content-Type"); }, 400)]
#[case::get_instead_of_post(|e: &mut Value| e["httpMethod"] = json!("GET"), 405)]
#[tokio::test]
async fn broken_rest_envelopes_get_a_well_formed_answer(
    #[case] breakage: fn(&mut Value),
    #[case] status: i64,
) {
    let mut ev = event("apigw-rest-mutate.json");
    breakage(&mut ev);
    let (_, wire) = invoke(&app(), &ev).await;
    assert_eq!(wire["statusCode"], status, "{wire}");
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    assert!(body.is_object());
}

#[tokio::test]
async fn http_api_named_stage_is_stripped_from_the_path() {
    let mut ev = event("apigw-http-mutate.json");
    ev["rawPath"] = json!("/prod/mutate--v1-pod");
    ev["requestContext"]["stage"] = json!("prod");
    let (_, wire) = invoke(&app(), &ev).await;
    assert_eq!(wire["statusCode"], 200, "{wire}");
}

#[test]
fn an_event_that_is_not_http_is_rejected_by_deserialisation_not_by_a_panic() {
    // The runtime reports this to Lambda as an invocation error; the process keeps running.
    let err = serde_json::from_value::<LambdaRequest>(json!({"Records": []})).unwrap_err();
    assert!(!err.to_string().is_empty());
}

/// `file`'s event carrying `review` as its source encodes bodies.
fn event_with(file: &str, review: &Value) -> Value {
    use base64::Engine;
    let mut ev = event(file);
    let body = serde_json::to_vec(review).unwrap();
    ev["body"] = if ev["isBase64Encoded"] == true {
        json!(base64::engine::general_purpose::STANDARD.encode(&body))
    } else {
        json!(String::from_utf8(body).unwrap())
    };
    ev
}

/// A wide pod (3,500 containers) asking for two ENV_VAR secrets: each container gets both, so
/// the answer outgrows the review ten times over (0.14 MB in, about 1.5 MB out).
fn wide_review() -> Value {
    wide_review_with(3_500, &["db", "api"])
}

/// A pod of `containers` containers asking for `keys` as ENV_VAR secrets (each container gets
/// every one of them).
fn wide_review_with(containers: usize, keys: &[&str]) -> Value {
    use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
    let secrets: Vec<Secret> = keys
        .iter()
        .map(|key| Secret {
            group: "team-secrets".into(),
            key: (*key).into(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        })
        .collect();
    let containers: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i:04}"), "image": "busybox:1"}))
        .collect();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "wide",
            "namespace": "flytesnacks-development",
            "labels": {"inject-flyte-secrets": "true"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": containers}
    });
    create_review(&pod, "flytesnacks-development")
}

/// An ALB takes at most 1 MB back from a Lambda target and turns a larger answer into a 502,
/// which the API server reports as an opaque failure. The answer that would not fit becomes a
/// denial that fits and names the limit, the patch's size and what to do; through API
/// Gateway (6 MB) the same pod is admitted with its patch.
#[tokio::test]
async fn an_answer_over_the_albs_one_megabyte_is_a_denial_that_fits_and_says_why() {
    let app = webhook(
        &Config::from_value(json!({"webhook": {"secretManagerTypes": ["K8s"]}}))
            .unwrap()
            .config,
        Deps::offline(),
    );
    let review = wide_review();
    let uid = review["request"]["uid"].clone();

    let (_, wire) = invoke(&app, &event_with("alb-mutate.json", &review)).await;
    let whole = serde_json::to_vec(&wire).unwrap().len();
    assert!(
        whole <= podmutator::transport::lambda::ALB_RESPONSE_LIMIT,
        "{whole} bytes"
    );
    assert_eq!(wire["statusCode"], 200);
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    let resp = &body["response"];
    assert_eq!(resp["uid"], uid, "the denial answers this review");
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 413);
    let message = resp["status"]["message"].as_str().unwrap();
    for says in [
        "1048576-byte limit an ALB",
        "JSON Patch of",
        "FILE mounts",
        "podmutator serve",
    ] {
        assert!(message.contains(says), "{says}: {message}");
    }
    assert!(resp.get("patch").is_none());

    // Through API Gateway the same answer fits Lambda's 6 MB and is sent as it is.
    let (_, wire) = invoke(&app, &event_with("apigw-http-mutate.json", &review)).await;
    let whole = serde_json::to_vec(&wire).unwrap().len();
    assert!(
        whole > podmutator::transport::lambda::ALB_RESPONSE_LIMIT,
        "the case must outgrow the ALB: {whole} bytes"
    );
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        body["response"]["allowed"], true,
        "{}",
        body["response"]["status"]
    );
    assert!(body["response"]["patch"].is_string());
}

/// Through API Gateway the limit is Lambda's own, 6 MB: an answer over it (the wide pod with
/// twelve ENV_VAR secrets, about 7 MB) is a denial that fits and names that limit, in the HTTP
/// API's envelope.
#[tokio::test]
async fn an_answer_over_lambdas_six_megabytes_is_a_denial_that_fits_and_says_why() {
    use podmutator::transport::lambda::LAMBDA_RESPONSE_LIMIT;
    let app = webhook(
        &Config::from_value(json!({"webhook": {"secretManagerTypes": ["K8s"]}}))
            .unwrap()
            .config,
        Deps::offline(),
    );
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let review = wide_review_with(3_500, &keys);
    let uid = review["request"]["uid"].clone();
    let event = event_with("apigw-http-mutate.json", &review);
    assert!(
        event["body"].as_str().unwrap().len() < LAMBDA_RESPONSE_LIMIT,
        "the review itself is within the request limit"
    );

    let (_, wire) = invoke(&app, &event).await;
    let whole = serde_json::to_vec(&wire).unwrap().len();
    assert!(whole <= LAMBDA_RESPONSE_LIMIT, "{whole} bytes");
    assert_eq!(wire["statusCode"], 200);
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    let resp = &body["response"];
    assert_eq!(resp["uid"], uid, "the denial answers this review");
    assert_eq!(resp["allowed"], false, "an answer of {whole} bytes");
    assert_eq!(resp["status"]["code"], 413);
    assert_eq!(
        resp["auditAnnotations"]["denial-reason"],
        "ResponseTooLarge"
    );
    let message = resp["status"]["message"].as_str().unwrap();
    for says in ["6291456-byte limit Lambda", "JSON Patch of", "FILE mounts"] {
        assert!(message.contains(says), "{says}: {message}");
    }
    // The size it names is over the limit: the case really outgrew it.
    let size: usize = message
        .strip_prefix("the webhook's answer for this pod is ")
        .and_then(|m| m.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in: {message}"));
    assert!(size > LAMBDA_RESPONSE_LIMIT, "{size}");
    assert!(resp.get("patch").is_none());
}

/// The event Terraform's pre-traffic check sends each new version before the `live` alias moves
/// (terraform/pre-traffic-event.json, the token put in its path as pre-traffic.tf does) gets
/// what the check's postcondition requires from the real handler: status 200, the review's uid
/// and `allowed: true`. And through the wrong token it gets the 404 the check reports.
#[tokio::test]
async fn the_pre_traffic_event_is_answered_allowed_by_the_real_handler() {
    let template =
        std::fs::read_to_string(root().join("terraform/pre-traffic-event.json")).unwrap();
    let token = "k3H9pre7traffic0check4token2example8value1";
    let config = Config::from_value(json!({"http": {"pathTokenSha256": hex_sha256(token)}}))
        .unwrap()
        .config;
    let app = webhook(&config, Deps::offline());
    let event: Value =
        serde_json::from_str(&template.replace("/PATH_TOKEN/", &format!("/{token}/"))).unwrap();
    let uid = review_of(&event)["request"]["uid"].clone();
    assert_eq!(uid, "podmutator-pre-traffic-check");
    let (_, wire) = invoke(&app, &event).await;
    assert_eq!(wire["statusCode"], 200, "{wire}");
    let body: Value = serde_json::from_str(wire["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["response"]["uid"], uid, "{body}");
    assert_eq!(body["response"]["allowed"], true, "{body}");

    let wrong: Value =
        serde_json::from_str(&template.replace("/PATH_TOKEN/", "/another-token-entirely-0000000/"))
            .unwrap();
    let (_, wire) = invoke(&app, &wrong).await;
    assert_eq!(wire["statusCode"], 404, "{wire}");
}

/// A function that cannot start (a configuration it refuses) tells Lambda why, on the Runtime
/// API's init error route, before it exits 1: an invocation's error then carries the reason
/// (`aws lambda invoke`, Terraform's pre-traffic check), where it said `Runtime.ExitError`
/// alone. The real binary, against the Runtime API on 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_configuration_is_reported_as_the_init_error() {
    use common::runtime_api::{Seen, runtime_api};
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Seen::default()));
    let port = runtime_api("{}".into(), seen.clone()).await;
    let out = tokio::process::Command::from(common::bin())
        .arg("lambda")
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"http": {"pathTokenDisabled": true}, "mutators": {"secretz": {}}}"#,
        )
        .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
        .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_REGION", "us-east-1")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.nexts, 0, "it asked for work it cannot do");
    let [error] = &seen.errors[..] else {
        panic!("{:?}\n{stderr}", seen.errors);
    };
    let (path, body) = error.split_once(": ").unwrap();
    assert_eq!(path, "/2018-06-01/runtime/init/error");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["errorType"], "Runtime.ConfigurationError");
    let message = body["errorMessage"].as_str().unwrap();
    assert!(
        message.contains("unknown mutator `secretz`: did you mean `secrets`?"),
        "{message}"
    );
    assert!(stderr.contains(message), "{stderr}");
}
