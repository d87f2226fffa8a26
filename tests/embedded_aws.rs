//! Embedded mode against a real AWS API emulator: moto server on 127.0.0.1, secrets created
//! through its API, the SDK pointed at it through a counting proxy. Proves the round-trip
//! budget (one batch per 20 ids cold, none warm) and that values, ENV_VAR and FILE, never reach
//! the logs in clear, base64-encoded at any alignment, or inside any base64 there
//! (`common::leaks`).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::aws::{CountingProxy, Moto, client, create_secret};
use common::*;
use podmutator_aws::secretsmanager::{AwsSource, CachePolicy, CachingSource};
use podmutator_core::config::{Config, FetchStrategy};
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use rstest::rstest;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
/// The Embedded file init container's variable of `<key>=<base64 value>` lines (README).
const ENV_SECRETS: &str = "SECRETS";

/// Moto (Python) is slow on a loaded machine, and these tests count calls, not time: the
/// admission's deadline is the most the config allows, and the caches (positive and negative:
/// the cascade's misses) outlive any stall between a cold and a warm admission.
fn config() -> Config {
    Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
    }, "embedded": {
        "organization": "flyte",
        "deadlineMs": 25000,
        "cacheTtlSeconds": 3600,
        "negativeCacheTtlSeconds": 3600
    }}))
    .unwrap()
    .config
}

fn task_pod(keys: &[String]) -> Value {
    task_pod_with_files(keys, &[])
}

/// A Flyte task pod asking for `env_keys` as ENV_VAR secrets and `file_keys` as FILE secrets.
fn task_pod_with_files(env_keys: &[String], file_keys: &[&str]) -> Value {
    let env = env_keys
        .iter()
        .map(|k| (k.as_str(), MountRequirement::EnvVar));
    let files = file_keys.iter().map(|k| (*k, MountRequirement::File));
    let secrets: Vec<Secret> = env
        .chain(files)
        .map(|(k, mount_requirement)| Secret {
            key: k.into(),
            mount_requirement,
            ..Default::default()
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "flytekit"}]}
    })
}

#[tokio::test]
async fn ten_secrets_cost_two_batch_calls_cold_and_none_warm() {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let keys: Vec<String> = (0..10).map(|i| format!("key{i}")).collect();
    // Half at org scope, half at project scope: the cascade needs every scope's answer.
    for (i, k) in keys.iter().enumerate() {
        let name = if i % 2 == 0 {
            format!("u__org__flyte__domain____project____key__{k}")
        } else {
            format!("u__org__flyte__domain__development__project__flytesnacks__key__{k}")
        };
        create_secret(&setup, &name, &format!("sentinel-value-{i}")).await;
    }
    let proxy = CountingProxy::start(moto.port).await;
    let source = CachingSource::new(
        AwsSource::new(client(&proxy.url()).await, 20),
        CachePolicy {
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            max_entries: 1000,
            max_bytes: 1 << 20,
        },
    );
    let app = webhook(&config(), Deps::offline().with_source(Arc::new(source)));
    let pod = task_pod(&keys);
    let body = serde_json::to_vec(&create_review(&pod, NS)).unwrap();

    let cold = app.review(Route::Secrets, &body).await;
    assert_eq!(cold.status, 200, "{}", String::from_utf8_lossy(&cold.body));
    assert_eq!(proxy.count("BatchGetSecretValue"), 2, "30 ids = 20 + 10");
    assert_eq!(proxy.total(), 2, "and nothing else");
    let out = apply(&pod, &patch_of(&response(&cold.body)));
    let env = out["spec"]["containers"][0]["env"].as_array().unwrap();
    for (i, k) in keys.iter().enumerate() {
        let name = format!("_UNION_{}", k.to_uppercase());
        let var = env.iter().find(|e| e["name"] == name.as_str()).unwrap();
        assert_eq!(var["value"], format!("sentinel-value-{i}"));
    }

    proxy.reset();
    let warm = app.review(Route::Secrets, &body).await;
    assert_eq!(warm.status, 200);
    assert_eq!(warm.body, cold.body, "same answer from the cache");
    assert_eq!(proxy.total(), 0, "warm admissions cost no call");
}

/// Calls per API for pod A (10 secrets, 30 ids) cold, pod A again, then pod B (10 other
/// secrets) on the same, now warm, instance. docs/secrets.md quotes these figures.
#[rstest]
#[case::batch(FetchStrategy::Batch, [(2, 0), (0, 0), (2, 0)])]
#[case::parallel(FetchStrategy::Parallel, [(0, 30), (0, 0), (0, 30)])]
#[case::hybrid(FetchStrategy::Hybrid, [(2, 0), (0, 0), (0, 30)])]
#[tokio::test]
async fn calls_per_strategy_for_ten_secrets_cold_warm_and_on_a_warm_instance(
    #[case] strategy: FetchStrategy,
    #[case] want: [(usize, usize); 3],
) {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let a: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    let b: Vec<String> = (0..10).map(|i| format!("b{i}")).collect();
    for k in a.iter().chain(&b) {
        let name = format!("u__org__flyte__domain____project____key__{k}");
        create_secret(&setup, &name, &format!("fake-{k}")).await;
    }
    let proxy = CountingProxy::start(moto.port).await;
    let cfg = config();
    let source = CachingSource::new(
        AwsSource::from_config(client(&proxy.url()).await, &cfg.embedded).with_strategy(strategy),
        CachePolicy::from_config(&cfg.embedded),
    );
    let app = webhook(&cfg, Deps::offline().with_source(Arc::new(source)));
    let mut seen = Vec::new();
    for keys in [&a, &a, &b] {
        proxy.reset();
        let body = serde_json::to_vec(&create_review(&task_pod(keys), NS)).unwrap();
        let reply = app.review(Route::Secrets, &body).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(response(&reply.body)["allowed"], true);
        seen.push((
            proxy.count("BatchGetSecretValue"),
            proxy.count("GetSecretValue"),
        ));
        assert_eq!(
            proxy.total(),
            seen.last().unwrap().0 + seen.last().unwrap().1
        );
    }
    println!(
        "{strategy:?}: (BatchGetSecretValue, GetSecretValue) A cold, A warm, B on a warm instance: {seen:?}"
    );
    assert_eq!(seen, want);
}

#[tokio::test]
async fn the_binary_behind_a_path_token_injects_values_that_never_reach_its_logs() {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let token = "tok_0123456789abcdef0123456789abcdef";
    create_secret(&setup, "podmutator/path-token", token).await;
    let keys = vec!["db_password".to_owned(), "api_key".to_owned()];
    let sentinels = ["SENTINEL-0f3c9b2e-db", "SENTINEL-7a41d5c8-api"];
    create_secret(
        &setup,
        "u__org__flyte__domain__development__project__flytesnacks__key__db_password",
        sentinels[0],
    )
    .await;
    create_secret(
        &setup,
        "u__org__flyte__domain____project____key__api_key",
        sentinels[1],
    )
    .await;
    // FILE secrets too, one per scope: their values travel base64-encoded in the init
    // container's SECRETS, which must not be logged either, encoded or not.
    let file_keys = ["tls_key", "ssh_key"];
    let file_sentinels = ["SENTINEL-5e0b7d21-tls-file", "SENTINEL-c4a9e316-ssh-file"];
    create_secret(
        &setup,
        "u__org__flyte__domain__development__project__flytesnacks__key__tls_key",
        file_sentinels[0],
    )
    .await;
    create_secret(
        &setup,
        "u__org__flyte__domain____project____key__ssh_key",
        file_sentinels[1],
    )
    .await;
    let proxy = CountingProxy::start(moto.port).await;

    let dir = temp_dir("embedded-binary");
    let port = free_port();
    // Value delivery under `serve`: the API server authenticates with a client certificate.
    let api_server = ClientCert::new();
    let client_ca_file = dir.join("client-ca.crt");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&client_ca_file, &api_server.ca).unwrap();
    let cfg = json!({
        "webhook": {
            "certDir": dir, "listenPort": port,
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        // Moto is slow on a loaded machine; the deadline is not what this test is about.
        "embedded": {"organization": "flyte", "deadlineMs": 25000},
        "http": {"pathTokenSecretId": "podmutator/path-token", "listenAddress": "127.0.0.1", "drainSeconds": 0,
            "clientCaFile": client_ca_file}
    });
    let (mut child, logs) = spawn_serve(&mut serve_with_aws(&cfg, &proxy.url())).await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let pod = task_pod_with_files(&keys, &file_keys);
    let body = serde_json::to_vec(&create_review(&pod, NS)).unwrap();

    let (status, _) = https_request_as(
        Some(&api_server),
        port,
        &ca,
        "localhost",
        "POST",
        "/mutate--v1-pod",
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 404, "without the token the webhook is not there");
    let (status, reply) = https_request_as(
        Some(&api_server),
        port,
        &ca,
        "localhost",
        "POST",
        &format!("/{token}/mutate--v1-pod"),
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let out = apply(&pod, &patch_of(&response(&reply)));
    let env = out["spec"]["containers"][0]["env"].to_string();
    for (i, s) in sentinels.iter().enumerate() {
        assert!(env.contains(s), "ENV_VAR value {i} injected");
    }
    // FILE values: `<key>=<base64 value>` lines in the init container's SECRETS, not in clear.
    let init = &out["spec"]["initContainers"][0];
    let lines = init["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == ENV_SECRETS))
        .and_then(|v| v["value"].as_str())
        .expect("the init container carries SECRETS");
    for (key, value) in file_keys.iter().zip(file_sentinels) {
        let line = lines
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no SECRETS line for {key}"));
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(line)
            .expect("a SECRETS line is base64");
        assert!(
            decoded == value.as_bytes(),
            "{key}: the line decodes to its value"
        );
        assert!(
            !out.to_string().contains(value),
            "{key} travels encoded only"
        );
    }
    // Positive control on this very reply: the probe finds every value, the FILE ones two
    // base64 layers down (the patch, then the SECRETS line), so it would find them in the logs.
    let labelled: Vec<(&str, &str)> = ["env-db", "env-api", "file-tls", "file-ssh"]
        .into_iter()
        .zip(sentinels.iter().chain(&file_sentinels).copied())
        .chain([("path-token", token)])
        .collect();
    let hits = leaks::find(&reply, &labelled);
    for (label, _) in &labelled[..4] {
        assert!(
            hits.iter()
                .any(|h| h.starts_with(&format!("{label} in clear in base64"))),
            "{label} not found in the reply: {hits:?}"
        );
    }
    assert_eq!(
        proxy.count("GetSecretValue"),
        1 + 12,
        "the token, once at start, then 4 keys x 3 scopes, one get each (embedded.fetchStrategy: parallel, the default)"
    );
    assert_eq!(proxy.count("BatchGetSecretValue"), 0);
    wait_for(&logs, "\"decision\":\"mutated\"", 1).await;

    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let logs = logs.lock().unwrap().clone();
    assert!(logs.lines().count() > 5, "trace logging was on:\n{logs}");
    let hits = leaks::find(logs.as_bytes(), &labelled);
    assert!(hits.is_empty(), "a secret value reached the logs: {hits:?}");
    // The token's read at start and Embedded's client on the first fetch: one AWS
    // configuration for the process, loaded once.
    assert_eq!(
        logs.matches("AWS configuration loaded").count(),
        1,
        "one load for the process:\n{}",
        logs.lines()
            .filter(|l| l.contains("AWS configuration"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The most one pod may cost: 64 secret requests
/// (`limits.maxSecretRequestsPerPod`), each looked up at three scopes, is 192 ids, under
/// `limits.maxSecretIdsPerAdmission` (200). With the default strategy that is 192
/// `GetSecretValue` calls cold, at most `embedded.maxCallsInFlightPerAdmission` at a time, and
/// none warm; one request more is refused before any call. docs/security.md quotes the
/// printed times.
#[tokio::test]
async fn the_worst_allowed_pod_costs_192_calls_cold_none_warm_and_one_more_request_none() {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    // What this test counts is calls, not time: moto answers 192 gets in 0.4 to 1.3 s on an idle
    // 2-core machine and more beside other tests, so the deadline is the most the config allows
    // (as `config` sets it).
    let cfg = config();
    assert_eq!(cfg.embedded.deadline_ms, 25_000);
    let max = cfg.limits.max_secret_requests_per_pod;
    assert_eq!(max, 64);
    let keys: Vec<String> = (0..=max).map(|i| format!("w{i}")).collect();
    for k in &keys {
        let name = format!("u__org__flyte__domain____project____key__{k}");
        create_secret(&setup, &name, &format!("fake-{k}")).await;
    }
    let proxy = CountingProxy::start(moto.port).await;
    let source = CachingSource::new(
        AwsSource::from_config(client(&proxy.url()).await, &cfg.embedded),
        CachePolicy::from_config(&cfg.embedded),
    );
    let app = webhook(&cfg, Deps::offline().with_source(Arc::new(source)));

    let body = serde_json::to_vec(&create_review(&task_pod(&keys[..max]), NS)).unwrap();
    let started = std::time::Instant::now();
    let cold = app.review(Route::Secrets, &body).await;
    let cold_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(cold.status, 200, "{}", String::from_utf8_lossy(&cold.body));
    assert_eq!(response(&cold.body)["allowed"], true);
    assert_eq!(
        proxy.count("GetSecretValue"),
        3 * max,
        "each request at 3 scopes"
    );
    assert_eq!(proxy.total(), 3 * max, "and nothing else");

    proxy.reset();
    let started = std::time::Instant::now();
    let warm = app.review(Route::Secrets, &body).await;
    let warm_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(warm.body, cold.body);
    assert_eq!(proxy.total(), 0, "warm: no call");

    let over = serde_json::to_vec(&create_review(&task_pod(&keys), NS)).unwrap();
    let refused = app.review(Route::Secrets, &over).await;
    let out = response(&refused.body);
    assert_eq!(out["allowed"], false, "{out}");
    assert_eq!(out["status"]["code"], 400, "{out}");
    let msg = out["status"]["message"].as_str().unwrap();
    assert!(msg.contains("limits.maxSecretRequestsPerPod"), "{msg}");
    assert_eq!(proxy.total(), 0, "refused before any call");
    println!(
        "worst allowed pod ({max} requests, {} ids): {} GetSecretValue calls, cold {cold_ms:.1} ms, warm {warm_ms:.1} ms (moto on loopback, debug build)",
        3 * max,
        3 * max
    );
}

/// Every AWS use of a process shares one configuration ([`SharedAws`]): Embedded's values and
/// reference delivery's names (`DescribeSecret`) each load it through the handle they are
/// given, not before the first call needs it; together with a direct client they load it once.
/// (The binary's own count, process-wide, is in the test above.)
#[tokio::test]
async fn values_names_and_clients_of_a_process_share_one_aws_configuration_load() {
    use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};
    use podmutator_aws::secretsmanager::SharedAws;
    use podmutator_core::secrets::source::Lookup;
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let id = "u__org__flyte__domain____project____key__shared";
    create_secret(&setup, id, "fake-shared-value").await;
    let shared = || {
        SharedAws::with_loader(
            aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new("us-east-1"))
                .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
                .endpoint_url(moto.url()),
        )
    };
    // Reference delivery with env vars by value reads both values and names.
    let cfg = Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
    }, "embedded": {"organization": "flyte", "delivery": "reference", "envVarDelivery": "value",
        "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"}}))
    .unwrap()
    .config;
    let wired = |aws: &SharedAws| podmutator_aws::wiring::deps(&cfg, aws, Deps::offline()).unwrap();
    let ids = vec![id.to_owned()];

    // Each path loads through its handle.
    let aws = shared();
    let values = wired(&aws).source.expect("values are read");
    assert_eq!(aws.loads(), 0, "loaded before any call needed it");
    let got = values.fetch_many(&ids).await.unwrap();
    assert!(matches!(got.values.get(id), Some(Lookup::Found(_))));
    assert_eq!(aws.loads(), 1, "the values' client came from the handle");
    let aws = shared();
    let names = wired(&aws).resolver.expect("names are resolved");
    let got = names.fetch_many(&ids).await.unwrap();
    assert!(matches!(got.values.get(id), Some(Lookup::Exists(_))));
    assert_eq!(aws.loads(), 1, "the names' client came from the handle");

    // All of them on one handle: one load.
    let aws = shared();
    let deps = wired(&aws);
    let (values, names) = (deps.source.unwrap(), deps.resolver.unwrap());
    values.fetch_many(&ids).await.unwrap();
    names.fetch_many(&ids).await.unwrap();
    let direct = aws.secrets_manager("", Duration::from_secs(5)).await;
    direct.describe_secret().secret_id(id).send().await.unwrap();
    assert_eq!(aws.loads(), 1, "values, names and a client: one load");
}
