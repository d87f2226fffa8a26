//! The admission path through `App::handle`: routes, versions, and every kind of bad input.

use crate::common;

use common::*;
use podmutator_core::config::Config;
use rstest::rstest;
use serde_json::{Value, json};

fn app() -> Front {
    let loaded = Config::from_value(json!({})).unwrap();
    webhook(&loaded.config, Deps::offline())
}

async fn post(app: &Front, path: &str, content_type: Option<&str>, body: &[u8]) -> (u16, Value) {
    let reply = app
        .handle(Incoming {
            method: "POST",
            path,
            content_type,
            body,
        })
        .await;
    let v: Value = serde_json::from_slice(&reply.body).unwrap_or_else(|e| {
        panic!(
            "every reply is JSON ({e}): {}",
            String::from_utf8_lossy(&reply.body)
        )
    });
    (reply.status, v)
}

fn flyte_review() -> Value {
    read_json(&root().join("tests/fixtures/reviews/flyte-task-k8s-env.json"))
}

/// `v` with the member at `pointer` set (its parent must exist).
fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let key = key.replace("~1", "/").replace("~0", "~");
    v.pointer_mut(parent).unwrap()[key] = value;
    v
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// A pod nothing here applies to (no selector label, no other mutator configured) is allowed
/// from its metadata alone: its spec is never read into types, so a spec no Pod could have
/// (which the API server, the only sender, never sends) is the API server's to refuse. The
/// same pod with the label is read whole and refused with the spec's place named.
#[tokio::test]
async fn a_pod_nothing_applies_to_is_allowed_without_its_spec_being_read() {
    let broken = with(
        flyte_review(),
        "/request/object/spec/containers",
        json!("nope"),
    );
    let unselected = with(
        broken.clone(),
        "/request/object/metadata/labels",
        json!({"app": "x"}),
    );
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&unselected),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["response"]["allowed"], true, "{v}");
    assert!(v["response"].get("patch").is_none(), "{v}");
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&broken),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("request.object is not a valid Pod"),
        "{message}"
    );
    assert!(
        message.contains("(at request.object.spec.containers)"),
        "{message}"
    );
    // The metadata is read whole either way: a label of the wrong type is refused unselected.
    let bad_meta = with(
        unselected,
        "/request/object/metadata/labels/app",
        json!(true),
    );
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&bad_meta),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("(at request.object.metadata.labels.app)"),
        "{message}"
    );
}

#[rstest]
#[case::truncated_json(flyte_review().to_string().as_bytes()[..200].to_vec(), "not a valid AdmissionReview")]
#[case::wrong_api_version(bytes(&with(flyte_review(), "/apiVersion", json!("admission.k8s.io/v2"))), "unsupported apiVersion \"admission.k8s.io/v2\"")]
#[case::wrong_kind(bytes(&with(flyte_review(), "/kind", json!("Pod"))), "kind is \"Pod\"")]
#[case::missing_request(bytes(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})), "review has no request")]
#[case::object_not_a_pod(bytes(&with(flyte_review(), "/request/object", json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}))), "request.object is not a valid Pod")]
#[case::object_with_wrong_types(bytes(&with(flyte_review(), "/request/object/spec/containers", json!("nope"))), "(at request.object.spec.containers)")]
#[case::create_without_object(bytes(&with(flyte_review(), "/request/object", Value::Null)), "has no request.object")]
#[case::empty_body(Vec::new(), "empty body")]
#[case::whitespace_body(b"  \n ".to_vec(), "empty body")]
#[case::not_json(b"<AdmissionReview/>".to_vec(), "not a valid AdmissionReview")]
#[case::json_array(b"[1,2,3]".to_vec(), "not a valid AdmissionReview")]
#[case::non_utf8(
    {
        let mut b = bytes(&flyte_review());
        let at = b.windows(6).position(|w| w == b"CREATE").unwrap();
        b[at] = 0xff;
        b
    },
    "not a valid AdmissionReview"
)]
#[case::seven_megabytes(
    bytes(&with(flyte_review(), "/request/object/metadata/annotations/big", json!("x".repeat(7 << 20)))),
    "over the 6291456-byte limit"
)]
#[tokio::test]
async fn malformed_input_gets_400_and_a_message(#[case] body: Vec<u8>, #[case] expected: &str) {
    let (status, v) = post(&app(), "/mutate--v1-pod", Some("application/json"), &body).await;
    assert_eq!(status, 400, "{v}");
    let resp = &v["response"];
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 400);
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(message.contains(expected), "{message:?} lacks {expected:?}");
}

#[rstest]
#[case::no_content_type(None, "content-type must be application/json, got none")]
#[case::text_plain(Some("text/plain"), "got \"text/plain\"")]
#[tokio::test]
async fn a_non_json_content_type_is_refused(#[case] ct: Option<&str>, #[case] expected: &str) {
    let (status, v) = post(&app(), "/mutate--v1-pod", ct, &bytes(&flyte_review())).await;
    assert_eq!(status, 400);
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains(expected), "{message}");
}

#[tokio::test]
async fn json_content_type_with_parameters_is_accepted() {
    let (status, _) = post(
        &app(),
        "/mutate--v1-pod",
        Some("Application/JSON; charset=utf-8"),
        &bytes(&flyte_review()),
    )
    .await;
    assert_eq!(status, 200);
}

#[rstest]
#[case::unknown_path("POST", "/mutate", 404)]
#[case::trailing_slash("POST", "/mutate--v1-pod/", 404)]
#[case::get_on_mutate("GET", "/mutate--v1-pod", 405)]
#[case::post_on_healthz("POST", "/healthz", 405)]
#[case::healthz("GET", "/healthz", 200)]
#[tokio::test]
async fn routes_and_methods(#[case] method: &str, #[case] path: &str, #[case] status: u16) {
    let reply = app()
        .handle(Incoming {
            method,
            path,
            content_type: Some("application/json"),
            body: b"{}",
        })
        .await;
    assert_eq!(reply.status, status);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(v["message"].is_string());
}

#[tokio::test]
async fn flyte_task_pod_gets_k8s_secret_env_vars() {
    let review = flyte_review();
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert_eq!(status, 200);
    let resp = &v["response"];
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(resp["uid"], review["request"]["uid"]);
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let pod = apply(&review["request"]["object"], &patch_of(resp));
    let secret_ref =
        json!({"secretKeyRef": {"name": "user-info", "key": "user_secret", "optional": true}});
    assert_eq!(
        pod["spec"]["containers"][0]["env"],
        json!([
            {"name": "FLYTE_SECRETS_ENV_PREFIX", "value": "_UNION_"},
            {"name": "_UNION_USER-INFO_USER_SECRET", "valueFrom": secret_ref},
            {"name": "FLYTE_INTERNAL_EXECUTION_ID", "value": "a8f3k2"}
        ])
    );
}

#[tokio::test]
async fn v1beta1_reviews_are_answered_in_v1beta1() {
    let review = with(
        flyte_review(),
        "/apiVersion",
        json!("admission.k8s.io/v1beta1"),
    );
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(v["response"]["uid"], review["request"]["uid"]);
    assert!(v["response"]["patch"].is_string());
}

#[rstest]
#[case::pod_update(with(flyte_review(), "/request/operation", json!("UPDATE")))]
#[case::pod_delete(with(with(flyte_review(), "/request/operation", json!("DELETE")), "/request/object", Value::Null))]
#[case::status_subresource(with(with(flyte_review(), "/request/operation", json!("UPDATE")), "/request/subResource", json!("status")))]
#[case::deployment_create({
    let mut r = with(flyte_review(), "/request/kind", json!({"group": "apps", "version": "v1", "kind": "Deployment"}));
    r["request"]["object"] = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {}});
    r
})]
#[case::pod_exec_connect({
    let mut r = with(flyte_review(), "/request/operation", json!("CONNECT"));
    r["request"]["subResource"] = json!("exec");
    r["request"]["object"] = json!({"apiVersion": "v1", "kind": "PodExecOptions", "command": ["sh"]});
    r
})]
#[tokio::test]
async fn anything_but_a_pod_create_is_allowed_untouched(#[case] review: Value) {
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let resp = &v["response"];
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["uid"], review["request"]["uid"]);
    assert!(resp.get("patch").is_none());
    assert!(resp.get("patchType").is_none());
}

#[tokio::test]
async fn a_pod_without_the_label_is_allowed_without_a_patch() {
    let mut review = flyte_review();
    review["request"]["object"]["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("inject-flyte-secrets");
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());
}

#[tokio::test]
async fn a_bad_secret_annotation_is_denied_with_http_200() {
    let review = with(
        flyte_review(),
        "/request/object/metadata/annotations/flyte.secrets~1s0",
        json!("not-base32!"),
    );
    let (status, v) = post(
        &app(),
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert_eq!(status, 200);
    let resp = &v["response"];
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 400);
    assert_eq!(resp["status"]["reason"], "BadRequest");
    assert_eq!(
        resp["auditAnnotations"]["denial-reason"],
        "BadSecretAnnotation"
    );
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("[secrets] "), "{message}");
    assert!(message.contains("flyte.secrets/s0"), "{message}");
}

#[tokio::test]
async fn path_token_guards_every_route() {
    let token = "0123456789abcdef0123456789abcdef";
    let loaded = Config::from_value(json!({"http": {"pathToken": token}})).unwrap();
    let app = webhook(&loaded.config, Deps::offline());
    let review = bytes(&flyte_review());
    let (status, _) = post(&app, "/mutate--v1-pod", Some("application/json"), &review).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        &app,
        &format!("/{token}/mutate--v1-pod"),
        Some("application/json"),
        &review,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &app,
        "/0123456789abcdef0123456789abcdeX/mutate--v1-pod",
        Some("application/json"),
        &review,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_selector_label_is_configurable() {
    let loaded = Config::from_value(
        json!({"secretsSelector": {"label": "example.com/secrets", "value": "on"}}),
    )
    .unwrap();
    let app = webhook(&loaded.config, Deps::offline());
    let review = flyte_review();
    let (_, v) = post(
        &app,
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&review),
    )
    .await;
    assert!(
        v["response"].get("patch").is_none(),
        "Flyte's label no longer selects"
    );
    let relabelled = with(
        review,
        "/request/object/metadata/labels/example.com~1secrets",
        json!("on"),
    );
    let (_, v) = post(
        &app,
        "/mutate--v1-pod",
        Some("application/json"),
        &bytes(&relabelled),
    )
    .await;
    assert!(v["response"]["patch"].is_string());
}
