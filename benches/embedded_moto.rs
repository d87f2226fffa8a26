//! Requests and added latency per admission for Embedded mode against moto (a local AWS API
//! emulator), cold and warm, beside Flyte's strategy (one GetSecretValue per secret and scope,
//! in sequence, stopping at the first scope that has it). Prints a table; asserts nothing.
//!
//!     cargo bench --bench embedded_moto
//!
//! Secrets are spread evenly over the project, domain and organisation scopes, so Flyte's
//! strategy needs two calls per secret on average.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::aws::{CountingProxy, Moto, client, create_secret};
use common::create_review;
use podmutator_aws::secretsmanager::{AwsSource, CachePolicy, CachingSource};
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::embedded::cascade;
use podmutator_core::{App, Deps};
use serde_json::json;

const NS: &str = "flytesnacks-development";
const ROUNDS: usize = 15;

fn pod(keys: &[String]) -> serde_json::Value {
    let secrets: Vec<Secret> = keys
        .iter()
        .map(|k| Secret {
            key: k.clone(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "task", "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
                     "annotations": encode_annotations(&secrets).unwrap()},
        "spec": {"containers": [{"name": "main", "image": "flytekit"}]}
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let proxy = CountingProxy::start(moto.port).await;
    let config = Config::from_value(json!({"webhook": {
        "secretManagerTypes": ["Embedded"],
        "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
    }, "embedded": {"organization": "flyte"}}))
    .unwrap()
    .config;
    let baseline_app = App::build(&Config::default(), Deps::offline());

    println!("Embedded mode against moto on 127.0.0.1, {ROUNDS} rounds each, medians");
    println!(
        "{:>8} | {:>13} {:>12} | {:>13} {:>12} | {:>13} {:>12} | {:>9}",
        "secrets",
        "batch reqs",
        "batch ms",
        "warm reqs",
        "warm ms",
        "flyte reqs",
        "flyte ms",
        "no-secret"
    );
    let mut created = 0usize;
    for n in [1usize, 10, 40] {
        let keys: Vec<String> = (0..n).map(|i| format!("bench{n}k{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            let [project, domain, org] = cascade("flyte", "development", "flytesnacks", k);
            let name = [project, domain, org][i % 3].clone();
            create_secret(&setup, &name, "fake-bench-value").await;
            created += 1;
        }
        let body = serde_json::to_vec(&create_review(&pod(&keys), NS)).unwrap();

        // Baseline: the same pod with no secret manager able to fetch (admission cost alone).
        let mut base = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let _ = baseline_app.review(Route::Secrets, &body).await;
            base.push(t.elapsed());
        }

        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        let (mut cold_reqs, mut warm_reqs) = (0, 0);
        // One SDK client (and connection pool) for both strategies, as in a warm Lambda.
        let shared = client(&proxy.url()).await;
        for _ in 0..ROUNDS {
            // A fresh cache per round: every round is a cold start of the cache.
            let source = CachingSource::new(
                AwsSource::new(shared.clone(), 20),
                CachePolicy {
                    ttl: Duration::from_secs(300),
                    negative_ttl: Duration::from_secs(10),
                    max_entries: 10_000,
                    max_bytes: 16 << 20,
                },
            );
            let app = App::build(&config, Deps::offline().with_source(Arc::new(source)));
            proxy.reset();
            let t = Instant::now();
            let r = app.review(Route::Secrets, &body).await;
            cold.push(t.elapsed());
            assert_eq!(r.status, 200);
            cold_reqs = proxy.total();
            proxy.reset();
            let t = Instant::now();
            app.review(Route::Secrets, &body).await;
            warm.push(t.elapsed());
            warm_reqs = proxy.total();
        }

        // Flyte: per secret, GetSecretValue on project, then domain, then org scope.
        let flyte_client = shared.clone();
        let mut flyte = Vec::new();
        let mut flyte_reqs = 0;
        for _ in 0..ROUNDS {
            proxy.reset();
            let t = Instant::now();
            for k in &keys {
                for id in cascade("flyte", "development", "flytesnacks", k) {
                    let found = flyte_client
                        .get_secret_value()
                        .secret_id(&id)
                        .version_stage("AWSCURRENT")
                        .send()
                        .await
                        .is_ok();
                    if found {
                        break;
                    }
                }
            }
            flyte.push(t.elapsed());
            flyte_reqs = proxy.total();
        }
        let base = median(base);
        let added = |d: Duration| d.saturating_sub(base);
        println!(
            "{:>8} | {:>13} {:>12} | {:>13} {:>12} | {:>13} {:>12} | {:>9}",
            n,
            cold_reqs,
            ms(added(median(cold))),
            warm_reqs,
            ms(added(median(warm))),
            flyte_reqs,
            ms(median(flyte)),
            ms(base),
        );
    }
    println!(
        "batch/warm ms: latency added to the admission by fetching; flyte ms: the fetch calls alone; no-secret: admission without fetching. {created} secrets in moto."
    );
}
