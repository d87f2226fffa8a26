//! The quota-enforcing Secrets Manager the fleet simulation (`benches/fleet.rs`) runs against:
//! its token bucket, its throttling answer as AWS sends it and as the SDK reads it, and what the
//! webhook's own source (its SDK client's retries) makes of it in front of moto.

use crate::common;

use std::time::{Duration, Instant};

use aws_sdk_secretsmanager::config::retry::RetryConfig;
use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};
use common::aws::{Moto, client, create_secret};
use common::free_port;
use common::quota::{Bucket, QuotaProxy, Second, THROTTLE_BODY};
use podmutator_aws::secretsmanager::{AwsSource, retry_config};
use podmutator_core::secrets::source::{Api, FetchStrategy, Lookup, SecretSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn a_bucket_allows_its_capacity_at_once_then_only_its_rate() {
    let t0 = Instant::now();
    let mut b = Bucket::new(100.0, 100.0, t0);
    assert_eq!((0..150).filter(|_| b.take(t0)).count(), 100);
    // 50 ms at 100/s refills 5 tokens.
    let t1 = t0 + Duration::from_millis(50);
    assert_eq!((0..20).filter(|_| b.take(t1)).count(), 5);
    // A long pause refills to capacity, never past it.
    let t2 = t1 + Duration::from_secs(60);
    assert_eq!((0..500).filter(|_| b.take(t2)).count(), 100);
}

/// A rate so low that one call empties the bucket for the whole test. The upstream port is
/// closed: the first (allowed) call gets the proxy's 502; only the throttle answer matters here.
async fn proxy_allowing_one(op: &str) -> QuotaProxy {
    QuotaProxy::start(free_port(), &[(op, 0.001)], Duration::ZERO).await
}

async fn raw_call(port: u16, target: &str) -> (String, String) {
    let body = r#"{"SecretId":"a"}"#;
    let req = format!(
        "POST / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-amz-target: {target}\r\ncontent-type: application/x-amz-json-1.1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.to_ascii_lowercase(), body.to_owned())
}

#[tokio::test]
async fn over_the_rate_the_answer_is_aws_throttling_exception() {
    let proxy = proxy_allowing_one("GetSecretValue").await;
    let (first, _) = raw_call(proxy.port, "secretsmanager.GetSecretValue").await;
    assert!(first.starts_with("http/1.1 502"), "{first}");
    let (head, body) = raw_call(proxy.port, "secretsmanager.GetSecretValue").await;
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(
        head.contains("\r\nx-amzn-errortype: throttlingexception"),
        "{head}"
    );
    assert!(
        head.contains("\r\ncontent-type: application/x-amz-json-1.1"),
        "{head}"
    );
    assert_eq!(body, THROTTLE_BODY);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"__type": "ThrottlingException", "message": "Rate exceeded"})
    );
    // Another API has its own bucket (here: none, so no quota).
    let (other, _) = raw_call(proxy.port, "secretsmanager.DescribeSecret").await;
    assert!(other.starts_with("http/1.1 502"), "{other}");
    let seen = proxy.seconds();
    let total = |op: &str| {
        seen[op].iter().fold(Second::default(), |a, s| Second {
            allowed: a.allowed + s.allowed,
            throttled: a.throttled + s.throttled,
        })
    };
    assert_eq!(
        total("GetSecretValue"),
        Second {
            allowed: 1,
            throttled: 1
        }
    );
    assert_eq!(
        total("DescribeSecret"),
        Second {
            allowed: 1,
            throttled: 0
        }
    );
}

#[tokio::test]
async fn the_sdk_reads_the_answer_as_a_throttling_error() {
    let proxy = proxy_allowing_one("BatchGetSecretValue").await;
    let conf = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .endpoint_url(proxy.url())
        .http_client(podmutator_aws::secretsmanager::http_client())
        // One attempt: what the SDK makes of the answer, before its retry policy acts on it.
        .retry_config(RetryConfig::standard().with_max_attempts(1))
        .build();
    let client = aws_sdk_secretsmanager::Client::from_conf(conf);
    let call = || client.batch_get_secret_value().secret_id_list("a").send();
    let _ = call().await;
    let err = call().await.expect_err("throttled");
    let service = err.into_service_error();
    assert_eq!(
        aws_sdk_secretsmanager::error::ProvideErrorMetadata::code(&service),
        Some("ThrottlingException")
    );
    assert_eq!(
        aws_sdk_secretsmanager::error::ProvideErrorMetadata::message(&service),
        Some("Rate exceeded")
    );
}

fn total(proxy: &QuotaProxy, op: &str) -> Second {
    proxy
        .seconds()
        .get(op)
        .into_iter()
        .flatten()
        .fold(Second::default(), |a, s| Second {
            allowed: a.allowed + s.allowed,
            throttled: a.throttled + s.throttled,
        })
}

#[tokio::test]
async fn a_burst_passes_the_bucket_then_only_its_rate() {
    // 5 a second, holding 5: a burst of 40 gets the 5 held plus what refills meanwhile.
    let proxy = QuotaProxy::start(free_port(), &[("GetSecretValue", 5.0)], Duration::ZERO).await;
    let started = Instant::now();
    for _ in 0..40 {
        raw_call(proxy.port, "secretsmanager.GetSecretValue").await;
    }
    let refilled = (started.elapsed().as_secs_f64() * 5.0).floor() as u32;
    let seen = total(&proxy, "GetSecretValue");
    assert_eq!(seen.allowed + seen.throttled, 40);
    assert!(
        (5..=5 + refilled).contains(&seen.allowed),
        "{seen:?}, {refilled} tokens refilled during the burst"
    );
}

/// The webhook's SDK client as `aws_client` builds it (its retry policy for the default
/// 2,000 ms deadline), pointed at `endpoint`.
fn app_client(endpoint: &str) -> aws_sdk_secretsmanager::Client {
    let conf = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .endpoint_url(endpoint)
        .http_client(podmutator_aws::secretsmanager::http_client())
        .retry_config(retry_config(Duration::from_millis(2000)))
        .build();
    aws_sdk_secretsmanager::Client::from_conf(conf)
}

#[rstest::rstest]
#[case::parallel(FetchStrategy::Parallel, Api::GetSecretValue)]
#[case::batch(FetchStrategy::Batch, Api::BatchGetSecretValue)]
#[tokio::test]
async fn over_the_quota_the_sdk_retries_then_the_admission_fails_naming_it(
    #[case] strategy: FetchStrategy,
    #[case] api: Api,
) {
    let moto = Moto::start();
    create_secret(&client(&moto.url()).await, "k", "fake-quota-value").await;
    // One call's worth of quota for the whole test.
    let proxy = QuotaProxy::start(moto.port, &[(&api.to_string(), 0.001)], Duration::ZERO).await;
    let source = AwsSource::new(app_client(&proxy.url()), 20).with_strategy(strategy);
    let ids = ["k".to_owned()];

    let first = source.fetch_many(&ids).await.expect("within the quota");
    assert!(
        matches!(&first.values["k"], Lookup::Found(v) if v.string.as_deref() == Some("fake-quota-value"))
    );
    assert_eq!((first.backend_calls, first.throttles), (1, 0));

    let err = source.fetch_many(&ids).await.expect_err("over the quota");
    let msg = err.to_string();
    assert!(
        msg.starts_with("throttled by AWS Secrets Manager while fetching secret k: "),
        "{msg}"
    );
    assert!(msg.contains(&api.quota()), "{msg}");
    assert!(!msg.contains("fake-quota-value"), "{msg}");
    // The SDK's standard policy: the first attempt and two retries, each answered
    // ThrottlingException by the proxy, each counted for the metric.
    assert_eq!(err.throttles(), 3, "{msg}");
    assert_eq!(
        total(&proxy, &api.to_string()),
        Second {
            allowed: 1,
            throttled: 3
        }
    );
}
