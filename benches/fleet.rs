//! Fleet simulation: a burst of pod admissions spread over many independent webhook instances (as
//! Lambda runs them), all reading one Secrets Manager account that enforces AWS's request quotas.
//! Prints one JSON line per run; asserts nothing. `scripts/fleet-sim.sh` runs it and writes
//! docs/scale.md and its plots.
//!
//!     cargo bench --bench fleet -- --strategies batch --pods 500,2000 --seconds 10 --instances 200
//!
//! Each instance is what one Lambda execution environment holds: an `App` built by `App::build`
//! with its own SDK client and cache from `podmutator_aws::wiring::deps` (the code `podmutator` runs),
//! serving one admission at a time. An arrival takes an idle instance, else starts a new one
//! (cold: empty cache, new client), else, at the concurrency limit, is refused as Lambda refuses
//! it (429), which the API server treats as a failed webhook call.
//!
//! Secrets Manager is moto behind `tests/common/quota.rs` (token buckets at AWS's rates, AWS's
//! throttling answer, a modelled service latency); the SDK's retries are the app's own.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
use common::aws::{Moto, client, create_secret};
use common::create_review;
use common::quota::{AWS_RATES, QuotaProxy};
use podmutator_aws::secretsmanager::{CachePolicy, CachingSource};
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::embedded::secret_name;
use podmutator_core::secrets::source::{
    Api, BoxFuture, Fetched, Lookup, SecretRef, SecretSource, SourceError,
};
use podmutator_core::{App, Deps};
use serde_json::{Value, json};

const ORG: &str = "flyte";
const DOMAINS: [&str; 3] = ["development", "staging", "production"];
/// AWS's price for Secrets Manager API calls: $0.05 per 10,000.
const USD_PER_CALL: f64 = 0.05 / 10_000.0;

const USAGE: &str = "usage: fleet --strategies S[,S...] [--pods N[,N...]] [--seconds S] [--instances M]
             [--scale K] [--init-ms MS] [--service-ms MS] [--pod-start-ms MS] [--projects P]
             [--keys K] [--tasks T] [--seed N]
  --strategies  embedded.fetchStrategy values to run, each on the same traces: batch, parallel,
                hybrid, optionally with `:N` for embedded.maxCallsInFlightPerAdmission (parallel:16);
                `default` runs the configuration without the key (Config::default's strategy);
                `reference` runs embedded.delivery: reference (names resolved with DescribeSecret,
                as shipped; each admitted pod then fetches its values itself, --pod-start-ms
                later, with parallel GetSecretValue), `reference-batch` the same with
                fetchStrategy batch (the pods fetch with BatchGetSecretValue), `reference-list`
                the same as `reference` but resolving with ListSecrets name filters
  --pods        burst sizes: pods created over --seconds (default 2000)
  --seconds     length of each burst (default 10)
  --instances   concurrency limit: most instances alive at once (default 200)
  --scale       run 1/K of the fleet: pods, instances and every API's quota divided by K (default 1)
  --init-ms     modelled Lambda cold start (environment and runtime) before an instance builds (default 200)
  --service-ms  modelled Secrets Manager latency per call (default 20)
  --pod-start-ms  reference delivery: from a pod's admission to its fetcher's start (scheduling,
                the sandbox, the fetcher image already on the node; default 3000)
  --projects / --keys / --tasks: Flyte projects, secret keys per project, tasks (default 4/300/200)";

#[derive(Debug)]
struct Args {
    strategies: Vec<String>,
    pods: Vec<usize>,
    seconds: f64,
    instances: usize,
    scale: usize,
    init_ms: u64,
    service_ms: u64,
    pod_start_ms: u64,
    projects: usize,
    keys: usize,
    tasks: usize,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        strategies: Vec::new(),
        pods: vec![2000],
        seconds: 10.0,
        instances: 200,
        scale: 1,
        init_ms: 200,
        service_ms: 20,
        pod_start_ms: 3000,
        projects: 4,
        keys: 300,
        tasks: 200,
        seed: 17,
    };
    // `cargo bench` adds `--bench`; skip it.
    let raw: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| s != "--bench")
        .collect();
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let num = |v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number\n{USAGE}"))
        };
        match flag.as_str() {
            "--strategies" => {
                a.strategies = value()?.split(',').map(str::to_owned).collect();
            }
            "--pods" => {
                a.pods = value()?
                    .split(',')
                    .map(|p| num(p.to_owned()).map(|n| n as usize))
                    .collect::<Result<_, _>>()?;
            }
            "--seconds" => {
                let v = value()?;
                a.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .ok_or_else(|| format!("--seconds: {v:?} is not a positive number"))?;
            }
            "--instances" => a.instances = num(value()?)? as usize,
            "--scale" => a.scale = num(value()?)? as usize,
            "--init-ms" => a.init_ms = num(value()?)?,
            "--service-ms" => a.service_ms = num(value()?)?,
            "--pod-start-ms" => a.pod_start_ms = num(value()?)?,
            "--projects" => a.projects = num(value()?)? as usize,
            "--keys" => a.keys = num(value()?)? as usize,
            "--tasks" => a.tasks = num(value()?)? as usize,
            "--seed" => a.seed = num(value()?)?,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if a.strategies.is_empty() {
        return Ok(a);
    }
    if a.instances == 0 || a.projects == 0 || a.keys < 20 || a.tasks == 0 || a.scale == 0 {
        return Err(format!(
            "--instances, --scale, --projects and --tasks must be at least 1, --keys at least 20\n{USAGE}"
        ));
    }
    if a.instances < a.scale || a.pods.iter().any(|p| *p < a.scale) {
        return Err(format!(
            "--scale {} leaves no instance or no pod: it divides --instances and --pods\n{USAGE}",
            a.scale
        ));
    }
    Ok(a)
}

/// splitmix64: a seeded generator, so every strategy sees the same trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s) over `n` ranks: a few popular items, a long tail.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf(cdf)
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.0.partition_point(|c| *c < u).min(self.0.len() - 1)
    }
}

/// Where a key's one secret lives: Flyte's cascade tries project, then domain, then organisation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Project,
    Domain,
    Org,
}

/// Half the keys per project, 30% per domain (shared by the projects), 20% organisation-wide.
fn scope_of(key: usize) -> Scope {
    match key % 10 {
        0..=4 => Scope::Project,
        5..=7 => Scope::Domain,
        _ => Scope::Org,
    }
}

fn key_name(key: usize) -> String {
    format!("s{key:03}")
}

/// A Flyte task: its project, domain and secret keys. Every pod of the task asks the same.
struct Task {
    project: String,
    domain: &'static str,
    keys: Vec<usize>,
    body: Vec<u8>,
}

impl Task {
    /// The names the webhook resolves for this task: the one scope each key lives in.
    fn resolved(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| {
                let key = key_name(*k);
                match scope_of(*k) {
                    Scope::Project => secret_name(ORG, self.domain, &self.project, &key),
                    Scope::Domain => secret_name(ORG, self.domain, "", &key),
                    Scope::Org => secret_name(ORG, "", "", &key),
                }
            })
            .collect()
    }
}

fn tasks(a: &Args, rng: &mut Rng) -> Vec<Task> {
    let popularity = Zipf::new(a.keys, 1.1);
    (0..a.tasks)
        .map(|t| {
            let project = format!("p{}", t % a.projects);
            let domain = DOMAINS[(t / a.projects) % DOMAINS.len()];
            let n = 3 + (rng.next() % 18) as usize;
            let mut keys = Vec::with_capacity(n);
            while keys.len() < n {
                let k = popularity.sample(rng);
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            let secrets: Vec<Secret> = keys
                .iter()
                .map(|k| Secret {
                    key: key_name(*k),
                    mount_requirement: MountRequirement::EnvVar,
                    ..Default::default()
                })
                .collect();
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("task-{t}"),
                    "labels": {"inject-flyte-secrets": "true", "organization": ORG, "project": project, "domain": domain},
                    "annotations": encode_annotations(&secrets).expect("encodable annotations")},
                "spec": {"containers": [{"name": "main", "image": "flytekit", "command": ["pyflyte-execute"]}]}
            });
            let body = serde_json::to_vec(&create_review(&pod, &format!("{project}-{domain}")))
                .expect("serialisable review");
            Task {
                project,
                domain,
                keys,
                body,
            }
        })
        .collect()
}

/// The secrets that exist: for each key used, the one scope it lives in.
fn existing(tasks: &[Task]) -> Vec<String> {
    let mut names: Vec<String> = tasks.iter().flat_map(Task::resolved).collect();
    names.sort();
    names.dedup();
    names
}

/// Every name an admission can ask: the three cascade scopes of each key of each task.
fn candidates(tasks: &[Task]) -> Vec<String> {
    let mut names: Vec<String> = tasks
        .iter()
        .flat_map(|t| {
            t.keys.iter().flat_map(|k| {
                let key = key_name(*k);
                [
                    secret_name(ORG, t.domain, &t.project, &key),
                    secret_name(ORG, t.domain, "", &key),
                    secret_name(ORG, "", "", &key),
                ]
            })
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Arrival offsets and the task of each pod: uniform over the burst, tasks Zipf (map tasks make
/// most of a burst).
fn trace(pods: usize, seconds: f64, tasks: usize, rng: &mut Rng) -> Vec<(Duration, usize)> {
    let pick = Zipf::new(tasks, 1.0);
    let mut t: Vec<(Duration, usize)> = (0..pods)
        .map(|_| {
            (
                Duration::from_secs_f64(rng.unit() * seconds),
                pick.sample(rng),
            )
        })
        .collect();
    t.sort();
    t
}

/// How an instance answers an Embedded secret: values (`embedded.delivery: value`, the
/// strategies), or reference delivery's name resolution with one of the two metadata APIs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Resolution {
    Values,
    /// `DescribeSecret`, one call per id: what `podmutator` ships (`podmutator_aws::wiring::deps`).
    Describe,
    /// `ListSecrets` with `name` filters, ten names a call: the alternative it was weighed
    /// against ([`ListSource`]).
    List,
}

impl Resolution {
    /// Any other name is an `embedded.fetchStrategy`, which the configuration checks.
    fn of(strategy: &str) -> Self {
        match strategy {
            "reference" | "reference-batch" => Resolution::Describe,
            "reference-list" => Resolution::List,
            _ => Resolution::Values,
        }
    }
}

/// Reference delivery's resolution done with `ListSecrets`: the ids go ten to a call (the most
/// values one `name` filter takes), the calls in parallel (one round trip), every page read.
/// The filter matches names by prefix, so only an exact name counts as found. Measured here
/// against the shipped `DescribeSecret` resolver; not part of the webhook (its IAM permission
/// cannot be scoped to resources, and its quota is 100 calls a second).
struct ListSource {
    client: aws_sdk_secretsmanager::Client,
}

impl ListSource {
    async fn new(config: &Config) -> Self {
        let region = &config
            .webhook
            .embedded_secret_manager_config
            .aws_config
            .region;
        let budget = Duration::from_millis(config.embedded.deadline_ms);
        Self {
            client: podmutator_aws::secretsmanager::aws_client(region, budget).await,
        }
    }

    async fn list(
        client: aws_sdk_secretsmanager::Client,
        chunk: Vec<String>,
    ) -> Result<(BTreeMap<String, Lookup>, u32), SourceError> {
        use aws_sdk_secretsmanager::types::{Filter, FilterNameStringType};
        let filter = Filter::builder()
            .key(FilterNameStringType::Name)
            .set_values(Some(chunk.clone()))
            .build();
        let mut found: BTreeMap<String, Lookup> = chunk
            .iter()
            .map(|id| (id.clone(), Lookup::NotFound))
            .collect();
        let (mut calls, mut next) = (0u32, None);
        loop {
            calls += 1;
            let sent = client
                .list_secrets()
                .filters(filter.clone())
                .max_results(100)
                .set_next_token(next.take())
                .send()
                .await;
            let out = match sent {
                Ok(out) => out,
                Err(e) => {
                    let code = e.code().unwrap_or("an error without a code").to_owned();
                    let (ids, source) = (chunk.join(", "), e.into());
                    return Err(if code == "ThrottlingException" {
                        SourceError::Throttled {
                            api: Api::ListSecrets,
                            ids,
                            throttles: 1,
                            source,
                        }
                    } else {
                        SourceError::Call {
                            api: Api::ListSecrets,
                            ids,
                            code,
                            source,
                        }
                    });
                }
            };
            for entry in out.secret_list() {
                let Some(name) = entry.name() else { continue };
                if entry.deleted_date().is_none()
                    && let Some(slot) = found.get_mut(name)
                {
                    *slot = Lookup::Exists(SecretRef {
                        name: name.to_owned(),
                        arn: entry.arn().unwrap_or_default().to_owned(),
                    });
                }
            }
            match out.next_token() {
                Some(t) if !t.is_empty() => next = Some(t.to_owned()),
                _ => return Ok((found, calls)),
            }
        }
    }
}

impl SecretSource for ListSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            let mut calls = tokio::task::JoinSet::new();
            for chunk in ids.chunks(10) {
                calls.spawn(Self::list(self.client.clone(), chunk.to_vec()));
            }
            let mut fetched = Fetched {
                backend_ids: ids.len() as u32,
                ..Fetched::default()
            };
            while let Some(joined) = calls.join_next().await {
                let (found, n) = joined.map_err(|source| SourceError::Task {
                    ids: ids.join(", "),
                    source,
                })??;
                fetched.values.extend(found);
                fetched.backend_calls += n;
            }
            Ok(fetched)
        })
    }
}

/// One pod's fetcher, as `podmutator fetch` runs it: a new process (so a new SDK client from
/// the environment, which points at the quota proxy), the plan the webhook would write, files on
/// a scratch volume. Returns its time and, on failure, whether Secrets Manager throttled it (the
/// fetcher then exits 1 and the kubelet retries it after its back-off).
async fn pod_fetch(
    ids: Vec<String>,
    strategy: podmutator_core::config::FetchStrategy,
) -> (f64, Result<(), bool>) {
    use podmutator::pod::fetch::fetch;
    use podmutator_core::pod::plan::{FETCH_BUDGET, FetchItem, FetchPlan};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join(format!(
        "fleet-pod-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let t = Instant::now();
    let plan = FetchPlan {
        secrets: ids
            .iter()
            .enumerate()
            .map(|(i, id)| FetchItem {
                id: id.clone(),
                file: root.join(format!("s{i}")),
            })
            .collect(),
        root: root.clone(),
        region: Some("us-east-1".into()),
        copy_executable_to: None,
        fetch_strategy: Some(strategy),
        readable_by_all: false,
    };
    let _ = std::fs::create_dir_all(&root);
    let client = podmutator_aws::secretsmanager::aws_client("us-east-1", FETCH_BUDGET).await;
    let result = fetch(&plan, client).await.map(|_| ()).map_err(|e| {
        matches!(
            e,
            podmutator_core::pod::plan::FetchError::Source(SourceError::Throttled { .. })
        )
    });
    let _ = std::fs::remove_dir_all(&root);
    (t.elapsed().as_secs_f64() * 1e3, result)
}

#[derive(Default)]
struct Outcomes {
    /// Reference delivery: each admitted pod's own fetch, from its start to the files written.
    fetch_ms: Vec<f64>,
    fetch_failed: usize,
    fetch_throttled: usize,
    latencies_ms: Vec<f64>,
    ok: usize,
    failed: usize,
    late: usize,
    refused: usize,
    cold_starts: usize,
    max_lag_ms: f64,
}

/// Idle instances and how many exist.
struct Fleet {
    config: Config,
    idle: Mutex<Vec<Arc<App>>>,
    alive: AtomicUsize,
    max: usize,
}

async fn run(
    a: &Args,
    strategy: &str,
    config: Config,
    resolution: Resolution,
    tasks: &[Task],
    arrivals: &[(Duration, usize)],
    proxy: &QuotaProxy,
) -> Value {
    let fleet = Arc::new(Fleet {
        config,
        idle: Mutex::new(Vec::new()),
        alive: AtomicUsize::new(0),
        max: a.instances / a.scale,
    });
    let init = Duration::from_millis(a.init_ms);
    let deadline = Duration::from_millis(fleet.config.embedded.deadline_ms);
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(tasks.iter().map(|t| t.body.clone()).collect());
    proxy.reset();
    let pod_fetches = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
    let start = tokio::time::Instant::now();
    let wall = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for (offset, task) in arrivals {
        let due = start + *offset;
        tokio::time::sleep_until(due).await;
        let lag = due.elapsed().as_secs_f64() * 1e3;
        let warm = fleet.idle.lock().unwrap().pop();
        let cold = warm.is_none();
        if cold {
            // Lambda starts an environment only under its concurrency limit.
            let n = fleet.alive.fetch_add(1, Ordering::SeqCst);
            if n >= fleet.max {
                fleet.alive.fetch_sub(1, Ordering::SeqCst);
                let mut o = outcomes.lock().unwrap();
                o.refused += 1;
                o.max_lag_ms = o.max_lag_ms.max(lag);
                continue;
            }
        }
        let (fleet, outcomes, bodies, task) =
            (fleet.clone(), outcomes.clone(), bodies.clone(), *task);
        let pod_secrets = (resolution != Resolution::Values).then(|| tasks[task].resolved());
        let pod_fetches = pod_fetches.clone();
        let pod_start = Duration::from_millis(a.pod_start_ms);
        let pod_strategy = fleet.config.embedded.fetch_strategy;
        running.spawn(async move {
            let app = match warm {
                Some(app) => app,
                None => {
                    // Lambda starts the environment and the runtime before our code runs.
                    tokio::time::sleep(init).await;
                    // Each instance is its own process: its own AWS configuration.
                    let aws = podmutator_aws::secretsmanager::SharedAws::new(
                        &fleet
                            .config
                            .webhook
                            .embedded_secret_manager_config
                            .aws_config
                            .region,
                    );
                    let given = match resolution {
                        Resolution::List => {
                            Deps::offline().with_resolver(Arc::new(CachingSource::new(
                                ListSource::new(&fleet.config).await,
                                CachePolicy::from_config(&fleet.config.embedded),
                            )))
                        }
                        Resolution::Values | Resolution::Describe => Deps::offline(),
                    };
                    let deps = podmutator_aws::wiring::deps(&fleet.config, &aws, given)
                        .expect("configuration accepted at start");
                    Arc::new(App::build(&fleet.config, deps))
                }
            };
            let reply = app.review(Route::Secrets, &bodies[task]).await;
            let took = due.elapsed();
            fleet.idle.lock().unwrap().push(app);
            let allowed = reply.status == 200
                && serde_json::from_slice::<Value>(&reply.body)
                    .ok()
                    .and_then(|v| v["response"]["allowed"].as_bool())
                    == Some(true);
            let mut o = outcomes.lock().unwrap();
            o.latencies_ms.push(took.as_secs_f64() * 1e3);
            o.max_lag_ms = o.max_lag_ms.max(lag);
            o.cold_starts += usize::from(cold);
            match (allowed, took > deadline) {
                (false, _) => o.failed += 1,
                (true, true) => o.late += 1,
                (true, false) => o.ok += 1,
            }
            drop(o);
            // Reference delivery: the admitted pod's init container fetches its values with the
            // pod's own identity, in the same account (so against the same quotas).
            if let (true, Some(ids)) = (allowed, pod_secrets) {
                let outcomes = outcomes.clone();
                pod_fetches.lock().unwrap().spawn(async move {
                    tokio::time::sleep_until(due + pod_start).await;
                    let (ms, result) = pod_fetch(ids, pod_strategy).await;
                    let mut o = outcomes.lock().unwrap();
                    o.fetch_ms.push(ms);
                    match result {
                        Ok(()) => {}
                        Err(throttled) => {
                            o.fetch_failed += 1;
                            o.fetch_throttled += usize::from(throttled);
                        }
                    }
                });
            }
        });
    }
    while running.join_next().await.is_some() {}
    let mut fetches = std::mem::take(&mut *pod_fetches.lock().unwrap());
    while fetches.join_next().await.is_some() {}
    let wall_s = wall.elapsed().as_secs_f64();
    let seconds = proxy.seconds();
    let mut o = std::mem::take(&mut *outcomes.lock().unwrap());
    o.latencies_ms.sort_by(f64::total_cmp);
    o.fetch_ms.sort_by(f64::total_cmp);
    let pct_of = |v: &[f64], p: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len());
        v[i - 1]
    };
    let pct = |p: f64| pct_of(&o.latencies_ms, p);
    // Counts are of the whole fleet: what 1/scale of it measured, times scale.
    let k = a.scale as u64;
    let mut apis = serde_json::Map::new();
    let (mut calls, mut throttles) = (0u64, 0u64);
    for (op, row) in &seconds {
        let allowed: u64 = row.iter().map(|s| u64::from(s.allowed)).sum();
        let throttled: u64 = row.iter().map(|s| u64::from(s.throttled)).sum();
        let active = row
            .iter()
            .rposition(|s| s.allowed + s.throttled > 0)
            .map_or(1, |i| i + 1);
        calls += allowed;
        throttles += throttled;
        apis.insert(
            op.clone(),
            json!({
                "calls": allowed * k,
                "throttled": throttled * k,
                "peak_per_s": u64::from(row.iter().map(|s| s.allowed + s.throttled).max().unwrap_or(0)) * k,
                "mean_per_s": (allowed + throttled) as f64 * k as f64 / active as f64,
                "per_s": row.iter().map(|s| u64::from(s.allowed + s.throttled) * k).collect::<Vec<_>>(),
            }),
        );
    }
    let k = a.scale;
    json!({
        "strategy": strategy,
        "scale": k,
        "simulated_pods": arrivals.len(),
        "pods": arrivals.len() * k,
        "seconds": a.seconds,
        "pods_per_s": (arrivals.len() * k) as f64 / a.seconds,
        "max_instances": a.instances,
        "instances": fleet.alive.load(Ordering::SeqCst) * k,
        "init_ms": a.init_ms,
        "service_ms": a.service_ms,
        "deadline_ms": deadline.as_millis() as u64,
        "ok": o.ok * k,
        "failed": o.failed * k,
        "late": o.late * k,
        "refused": o.refused * k,
        "misses": (o.failed + o.late + o.refused) * k,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": pct(1.0),
        "calls": calls * k as u64,
        "throttles": throttles * k as u64,
        "cost_usd": (calls * k as u64) as f64 * USD_PER_CALL,
        "apis": apis,
        "pod_fetches": (o.fetch_ms.len() * k),
        "pod_fetch_failed": (o.fetch_failed * k),
        "pod_fetch_throttled": (o.fetch_throttled * k),
        "pod_fetch_p50_ms": pct_of(&o.fetch_ms, 0.50),
        "pod_fetch_p99_ms": pct_of(&o.fetch_ms, 0.99),
        "max_dispatch_lag_ms": o.max_lag_ms,
        "wall_s": wall_s,
        "peak_rss_mb": peak_rss_mb(),
    })
}

/// The process's peak resident memory (Linux), to show what the machine could hold.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The configuration for `strategy` (`name` or `name:N`): Embedded on, the strategy set (unless
/// `default`), and with `:N` at most N calls in flight per admission.
fn config_for(strategy: &str) -> Result<Config, String> {
    let mut v = json!({
        "webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {"organization": "flyte"}
    });
    if Resolution::of(strategy) != Resolution::Values {
        v["embedded"] = json!({
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        });
        if strategy == "reference-batch" {
            v["embedded"]["fetchStrategy"] = json!("batch");
        }
        return Config::from_value(v)
            .map(|l| l.config)
            .map_err(|e| format!("strategy {strategy:?}: the configuration is refused: {e}"));
    }
    let (name, per_admission) = match strategy.split_once(':') {
        Some((name, n)) => (
            name,
            Some(n.parse::<usize>().map_err(|_| {
                format!("strategy {strategy:?}: {n:?} is not a number of calls in flight")
            })?),
        ),
        None => (strategy, None),
    };
    if name != "default" {
        v["embedded"]["fetchStrategy"] = json!(name);
    }
    if let Some(n) = per_admission {
        v["embedded"]["maxCallsInFlightPerAdmission"] = json!(n);
        v["embedded"]["maxCallsInFlight"] = json!(n.max(16));
    }
    Config::from_value(v).map(|l| l.config).map_err(|e| {
        format!(
            "strategy {strategy:?}: the configuration is refused: {e}\n(`default` runs the build's only strategy when embedded.fetchStrategy does not exist yet)"
        )
    })
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::exit(2);
        }
    };
    if a.strategies.is_empty() {
        // `cargo bench` runs every bench without arguments; this one takes minutes a strategy.
        eprintln!("fleet: no --strategies, nothing run; scripts/fleet-sim.sh runs the simulation");
        return;
    }
    let configs: Vec<(String, Config)> = match a
        .strategies
        .iter()
        .map(|s| config_for(s).map(|c| (s.clone(), c)))
        .collect()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::exit(2);
        }
    };
    let moto = Moto::start();
    // Each instance loads its AWS configuration the way the Lambda does (`aws_client`): from the
    // environment. Point it at the proxy with dummy credentials, and keep the SDK off the
    // instance-metadata endpoint and the user's AWS files. Set before any other thread exists.
    let service = Duration::from_millis(a.service_ms);
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("proxy runtime");
    // 1/scale of the fleet against 1/scale of every quota: the same pressure on each.
    let rates: Vec<(&str, f64)> = AWS_RATES
        .iter()
        .map(|(api, r)| (*api, r / a.scale as f64))
        .collect();
    let proxy = proxy_rt.block_on(QuotaProxy::start(moto.port, &rates, service));
    // SAFETY of set_var: the proxy's runtime thread does not read the environment.
    unsafe {
        for (k, v) in [
            ("AWS_ENDPOINT_URL", proxy.url().as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ] {
            std::env::set_var(k, v);
        }
        std::env::remove_var("AWS_PROFILE");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("fleet runtime");
    rt.block_on(async {
        let mut rng = Rng(a.seed);
        let tasks = tasks(&a, &mut rng);
        let names = existing(&tasks);
        let setup = client(&moto.url()).await;
        let t = Instant::now();
        let mut creating = tokio::task::JoinSet::new();
        for chunk in names.chunks(names.len().div_ceil(8).max(1)) {
            let (setup, chunk) = (setup.clone(), chunk.to_vec());
            creating.spawn(async move {
                for name in chunk {
                    create_secret(&setup, &name, "fleet-sim-value").await;
                }
            });
        }
        while creating.join_next().await.is_some() {}
        let distinct_keys: std::collections::BTreeSet<_> =
            tasks.iter().flat_map(|t| t.keys.iter()).collect();
        eprintln!(
            "fleet: {} secrets in moto ({} keys used by {} tasks) in {:.1}s",
            names.len(),
            distinct_keys.len(),
            tasks.len(),
            t.elapsed().as_secs_f64()
        );
        let mut scopes = BTreeMap::new();
        for k in &distinct_keys {
            *scopes
                .entry(match scope_of(**k) {
                    Scope::Project => "project",
                    Scope::Domain => "domain",
                    Scope::Org => "org",
                })
                .or_insert(0) += 1;
        }
        eprintln!("fleet: keys by the scope that holds them: {scopes:?}");
        // moto answers a few hundred calls a second; the proxy replays what it has answered
        // once. Ask every name once through the proxy (found or not), so that no run waits on
        // moto for a GetSecretValue; batches, whose id lists vary, still reach moto.
        let t = Instant::now();
        let via_proxy = client(&proxy.url()).await;
        let names = candidates(&tasks);
        let resolutions: Vec<Resolution> = a.strategies.iter().map(|s| Resolution::of(s)).collect();
        let describe = resolutions.contains(&Resolution::Describe);
        let mut priming = tokio::task::JoinSet::new();
        for chunk in names.chunks(names.len().div_ceil(8).max(1)) {
            let (c, chunk) = (via_proxy.clone(), chunk.to_vec());
            priming.spawn(async move {
                for name in chunk {
                    // Not found is an answer too; the proxy keeps it.
                    // Reference delivery's pods read values too.
                    let _ = c.get_secret_value().secret_id(&name).send().await;
                    if describe {
                        let _ = c.describe_secret().secret_id(&name).send().await;
                    }
                }
            });
        }
        while priming.join_next().await.is_some() {}
        eprintln!(
            "fleet: {} names primed through the proxy in {:.1}s",
            names.len(),
            t.elapsed().as_secs_f64()
        );
        for pods in &a.pods {
            let arrivals = trace(
                *pods / a.scale,
                a.seconds,
                tasks.len(),
                &mut Rng(a.seed ^ *pods as u64),
            );
            for (strategy, config) in &configs {
                let resolution = Resolution::of(strategy);
                let line = run(
                    &a,
                    strategy,
                    config.clone(),
                    resolution,
                    &tasks,
                    &arrivals,
                    &proxy,
                )
                .await;
                println!("{line}");
                // Let the account's buckets and the moto threads settle before the next run.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    drop(proxy);
    proxy_rt.shutdown_timeout(Duration::from_secs(1));
}
