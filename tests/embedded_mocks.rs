//! Embedded mode through the real AWS SDK client with `aws-smithy-mocks` answering the
//! `BatchGetSecretValue` and `GetSecretValue` calls: every answer the service can give,
//! throttling included, as the admission (and its metrics) see it.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::operation::batch_get_secret_value::BatchGetSecretValueOutput;
use aws_sdk_secretsmanager::operation::get_secret_value::{
    GetSecretValueError, GetSecretValueOutput,
};
use aws_sdk_secretsmanager::types::error::ResourceNotFoundException;
use aws_sdk_secretsmanager::types::{ApiErrorType, SecretValueEntry};
use aws_smithy_mocks::{MockResponse, Rule, RuleMode, mock, mock_client};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::Blob;
use aws_smithy_types::body::SdkBody;
use common::*;
use podmutator_aws::secretsmanager::{AwsSource, CachePolicy, CachingSource};
use podmutator_core::config::{Config, FetchStrategy};
use podmutator_core::metrics::Sink;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use rstest::rstest;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";

fn id(domain: &str, project: &str, key: &str) -> String {
    format!("u__org__flyte__domain__{domain}__project__{project}__key__{key}")
}

#[derive(Clone)]
enum Stored {
    Text(&'static str),
    Bytes(&'static [u8]),
}

/// A Secrets Manager holding `store`, answering batches by name as the service does.
fn service(store: BTreeMap<String, Stored>) -> Rule {
    mock!(Client::batch_get_secret_value).then_compute_output(move |input| {
        let mut out = BatchGetSecretValueOutput::builder();
        for id in input.secret_id_list() {
            out = match store.get(id) {
                Some(v) => {
                    let entry = SecretValueEntry::builder()
                        .name(id)
                        .version_stages("AWSCURRENT");
                    out.secret_values(match v {
                        Stored::Text(t) => entry.secret_string(*t).build(),
                        Stored::Bytes(b) => entry.secret_binary(Blob::new(b.to_vec())).build(),
                    })
                }
                None => out.errors(
                    ApiErrorType::builder()
                        .secret_id(id)
                        .error_code("ResourceNotFoundException")
                        .message("Secrets Manager can't find the specified secret.")
                        .build(),
                ),
            };
        }
        out.build()
    })
}

fn app_over(client: Client) -> Front {
    let config = Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }, "embedded": {"organization": "flyte"}}))
    .unwrap()
    .config;
    let source = CachingSource::new(
        AwsSource::new(client, 20),
        CachePolicy {
            // Longer than any stall between two admissions: expiry is not what these test.
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            max_entries: 100,
            max_bytes: 1 << 20,
        },
    );
    webhook(&config, Deps::offline().with_source(Arc::new(source)))
}

fn pod(key: &str, mount: MountRequirement) -> Value {
    let s = Secret {
        key: key.into(),
        mount_requirement: mount,
        ..Default::default()
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "t", "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
                     "annotations": encode_annotations(&[s]).unwrap()},
        "spec": {"containers": [{"name": "main", "image": "x"}]}
    })
}

async fn admit(app: &Front, pod: &Value) -> (u16, Value) {
    let reply = app
        .review(
            Route::Secrets,
            &serde_json::to_vec(&create_review(pod, NS)).unwrap(),
        )
        .await;
    (reply.status, response(&reply.body))
}

fn first_env(pod: &Value, resp: &Value) -> Value {
    apply(pod, &patch_of(resp))["spec"]["containers"][0]["env"][0].clone()
}

#[rstest]
#[case::hit_at_project_scope(id("development", "flytesnacks", "k"), "fake-project")]
#[case::cascade_to_domain(id("development", "", "k"), "fake-domain")]
#[case::cascade_to_org(id("", "", "k"), "fake-org")]
#[tokio::test]
async fn the_value_of_the_most_specific_scope_is_injected(
    #[case] at: String,
    #[case] value: &'static str,
) {
    let rule = service([(at, Stored::Text(value))].into());
    let app = app_over(mock_client!(
        aws_sdk_secretsmanager,
        RuleMode::MatchAny,
        [&rule]
    ));
    let p = pod("k", MountRequirement::EnvVar);
    let (status, resp) = admit(&app, &p).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        first_env(&p, &resp),
        json!({"name": "_UNION_K", "value": value})
    );
    assert_eq!(rule.num_calls(), 1, "all three scopes in one call");

    // Warm: the cache answers, the service is not called again.
    let (_, again) = admit(&app, &p).await;
    assert_eq!(again, resp);
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn not_found_everywhere_is_denied_and_remembered_briefly() {
    let rule = service(BTreeMap::new());
    let app = app_over(mock_client!(
        aws_sdk_secretsmanager,
        RuleMode::MatchAny,
        [&rule]
    ));
    let p = pod("missing", MountRequirement::EnvVar);
    let (status, resp) = admit(&app, &p).await;
    assert_eq!(status, 200);
    assert_eq!(resp["allowed"], false);
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .contains("[SecretNotFoundAcrossAllScopes]")
    );
    admit(&app, &p).await;
    assert_eq!(rule.num_calls(), 1, "the negative answer is cached");
}

#[rstest]
#[case::binary_utf8_as_env(b"fake-utf8-bytes" as &'static [u8], MountRequirement::EnvVar, Some("fake-utf8-bytes"))]
#[case::binary_not_utf8_as_env(b"\xff\xfe\x00", MountRequirement::EnvVar, None)]
#[case::binary_not_utf8_as_file(b"\xff\xfe\x00", MountRequirement::File, Some("k=//4A"))]
#[tokio::test]
async fn binary_values(
    #[case] bytes: &'static [u8],
    #[case] mount: MountRequirement,
    #[case] want: Option<&str>,
) {
    let rule = service([(id("", "", "k"), Stored::Bytes(bytes))].into());
    let app = app_over(mock_client!(
        aws_sdk_secretsmanager,
        RuleMode::MatchAny,
        [&rule]
    ));
    let p = pod("k", mount);
    let (_, resp) = admit(&app, &p).await;
    match want {
        Some(v) => {
            let out = apply(&p, &patch_of(&resp)).to_string();
            assert!(out.contains(v), "{out}");
        }
        None => {
            assert_eq!(resp["allowed"], false);
            assert!(
                resp["status"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("not a valid UTF-8 string; mount as a file instead")
            );
        }
    }
}

fn throttled() -> HttpResponse {
    HttpResponse::new(
        400.try_into().unwrap(),
        SdkBody::from(
            r#"{"__type":"ThrottlingException","message":"Rate exceeded for arn:aws:iam::123456789012:role/podmutator"}"#,
        ),
    )
}

/// The SDK's standard retries, with a short backoff so the test does not meet the deadline.
fn fast_retries(
    c: aws_sdk_secretsmanager::config::Builder,
) -> aws_sdk_secretsmanager::config::Builder {
    c.retry_config(
        aws_sdk_secretsmanager::config::retry::RetryConfig::standard()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(1))
            .with_max_backoff(Duration::from_millis(2)),
    )
}

/// The app over `client` with `strategy` and a memory metrics sink.
fn metered(client: Client, strategy: FetchStrategy) -> (Front, Arc<Mutex<Vec<String>>>) {
    let config = Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }, "embedded": {"organization": "flyte"}}))
    .unwrap()
    .config;
    let source = CachingSource::new(
        AwsSource::from_config(client, &config.embedded).with_strategy(strategy),
        CachePolicy::from_config(&config.embedded),
    );
    let lines = Arc::new(Mutex::new(Vec::new()));
    let deps = Deps::offline()
        .with_source(Arc::new(source))
        .with_metrics(Some(Sink::Memory(lines.clone())));
    (webhook(&config, deps), lines)
}

fn throttle_metric(lines: &Mutex<Vec<String>>) -> Value {
    let line: Value = serde_json::from_str(lines.lock().unwrap().last().unwrap()).unwrap();
    let declared = line["_aws"]["CloudWatchMetrics"][0]["Metrics"].to_string();
    assert!(
        declared.contains("\"SecretsManagerThrottles\""),
        "{declared}"
    );
    line["SecretsManagerThrottles"].clone()
}

#[rstest]
#[case::parallel(
    FetchStrategy::Parallel,
    "GetSecretValue allows 10,000 requests per second per account and region"
)]
#[case::batch(
    FetchStrategy::Batch,
    "BatchGetSecretValue allows 100 requests per second per account and region"
)]
#[tokio::test]
async fn throttling_that_outlasts_the_sdk_retries_fails_naming_the_quota_and_is_counted(
    #[case] strategy: FetchStrategy,
    #[case] quota: &str,
) {
    let get = mock!(Client::get_secret_value).then_http_response(throttled);
    let batch = mock!(Client::batch_get_secret_value).then_http_response(throttled);
    let client = mock_client!(
        aws_sdk_secretsmanager,
        RuleMode::MatchAny,
        [&get, &batch],
        fast_retries
    );
    let (app, lines) = metered(client, strategy);
    let (status, resp) = admit(&app, &pod("k", MountRequirement::EnvVar)).await;
    assert_eq!(status, 500, "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(msg.contains("throttled by AWS Secrets Manager"), "{msg}");
    assert!(msg.contains(quota), "{msg}");
    assert!(
        !msg.contains("arn:") && !msg.contains("123456789012"),
        "no account or role in the reply: {msg}"
    );
    // The id that failed was answered ThrottlingException three times (the SDK's attempts);
    // the first failure aborts the admission's other calls, whose answers may never be read.
    let calls = get.num_calls() + batch.num_calls();
    let counted = throttle_metric(&lines).as_u64().unwrap();
    assert!(
        (3..=calls as u64).contains(&counted),
        "{counted} throttles counted of {calls} calls"
    );
}

#[tokio::test]
async fn a_throttle_the_retry_absorbs_admits_the_pod_and_is_counted() {
    let store: BTreeMap<String, Stored> = [(id("", "", "k"), Stored::Text("fake-org"))].into();
    // The SDK retries on the rule that took the first attempt, so the throttled id's rule
    // answers the retry too: not found at project scope.
    let project = id("development", "flytesnacks", "k");
    let get = mock!(Client::get_secret_value)
        .match_requests(move |input| input.secret_id() == Some(project.as_str()))
        .sequence()
        .http_response(throttled)
        .http_status(
            400,
            Some(r#"{"__type":"ResourceNotFoundException","message":"none"}"#.into()),
        )
        .build();
    let answers = mock!(Client::get_secret_value).then_compute_response(move |input| {
        let id = input.secret_id().unwrap_or_default();
        match store.get(id) {
            Some(Stored::Text(t)) => MockResponse::Output(
                GetSecretValueOutput::builder()
                    .name(id)
                    .secret_string(*t)
                    .build(),
            ),
            _ => MockResponse::Error(GetSecretValueError::ResourceNotFoundException(
                ResourceNotFoundException::builder().message("none").build(),
            )),
        }
    });
    let client = mock_client!(
        aws_sdk_secretsmanager,
        RuleMode::MatchAny,
        [&get, &answers],
        fast_retries
    );
    let (app, lines) = metered(client, FetchStrategy::Parallel);
    let p = pod("k", MountRequirement::EnvVar);
    let (status, resp) = admit(&app, &p).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        first_env(&p, &resp),
        json!({"name": "_UNION_K", "value": "fake-org"})
    );
    assert_eq!(get.num_calls(), 2, "the throttled attempt and its retry");
    assert_eq!(answers.num_calls(), 2, "the other two scopes");
    assert_eq!(throttle_metric(&lines), json!(1));
}
