//! Reference delivery end to end, with the real binary against moto on 127.0.0.1 behind the
//! counting proxy, whose gate holds the requests of a step until all of them are in flight at
//! once (calls made one after another never fill it), so "one round trip" is proven without a
//! clock:
//!
//! 1. `podmutator serve` with `embedded.delivery: reference` admits a pod with 10 secret
//!    requests (FILE, ANY and ENV_VAR, at every scope): 30 `DescribeSecret` calls (3 scope names
//!    each) in one round trip cold, none warm, and no other call; no value in the reply, the
//!    patch or any log line.
//! 2. `podmutator fetch` runs the init container's plan from that patch with the pod's
//!    credentials: 10 `GetSecretValue` calls in flight together (the default
//!    `embedded.fetchStrategy: parallel`, copied into the plan), exactly the files the patch
//!    promises, each holding its value, mode 0400, and the executable copied for `exec`; the
//!    same plan with `fetchStrategy: batch` takes one `BatchGetSecretValue` call and writes the
//!    same files.
//! 3. The copied `podmutator exec` runs the wrapped container's command with that container's
//!    plan: the child sees the three variables.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::aws::{CountingProxy, Moto, client, create_secret};
use common::*;
use podmutator_core::pod::exec::EXEC_ENV_ENV;
use podmutator_core::pod::injector::{INIT_CONTAINER, INIT_ROOT, RUN_DIR, promised_files};
use podmutator_core::pod::plan::FETCH_PLAN_ENV;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
const TOKEN: &str = "tok_5f0e2a7c91d84b3e6a0f1c2d3e4b5a69";

/// Ten requests: FILE f0-f3, ANY a0-a2 (files), ENV_VAR e0-e2 (exec); scopes rotate project,
/// domain, organisation. Returns the requests and (secret name, sentinel value) pairs.
fn requests() -> (Vec<Secret>, Vec<(String, String)>) {
    let mut secrets = Vec::new();
    let mut stored = Vec::new();
    let kinds = [
        ("f", 4, MountRequirement::File),
        ("a", 3, MountRequirement::Any),
        ("e", 3, MountRequirement::EnvVar),
    ];
    let mut i = 0;
    for (prefix, n, mount) in kinds {
        for j in 0..n {
            let key = format!("{prefix}{j}");
            let name = match i % 3 {
                0 => {
                    format!("u__org__flyte__domain__development__project__flytesnacks__key__{key}")
                }
                1 => format!("u__org__flyte__domain__development__project____key__{key}"),
                _ => format!("u__org__flyte__domain____project____key__{key}"),
            };
            stored.push((name, format!("SENTINEL-7c1e04b9-{key}-value")));
            secrets.push(Secret {
                key,
                mount_requirement: mount,
                ..Default::default()
            });
            i += 1;
        }
    }
    (secrets, stored)
}

fn task_pod(secrets: &[Secret]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(secrets).unwrap()
        },
        "spec": {"containers": [{
            "name": "main", "image": "flytekit",
            "command": ["sh", "-c"],
            "args": ["printf '%s|%s|%s' \"$_UNION_E0\" \"$_UNION_E1\" \"$_UNION_E2\""]
        }]}
    })
}

fn env_of<'a>(container: &'a Value, name: &str) -> &'a str {
    container["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .and_then(|v| v["value"].as_str())
        .unwrap_or_else(|| panic!("{} has no {name}", container["name"]))
}

fn files_under(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.insert(path.display().to_string());
        }
    }
}

/// The pod's credentials: what the SDK's default chain finds in the pod (here static keys and
/// the emulator's endpoint), and nothing of this process's environment.
fn pod_env<'c>(cmd: &'c mut Command, proxy: &CountingProxy) -> &'c mut Command {
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_ENDPOINT_URL", proxy.url())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_secrets_are_resolved_in_one_round_trip_and_the_pod_fetches_exactly_what_the_patch_promises()
 {
    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let (secrets, stored) = requests();
    for (name, value) in &stored {
        create_secret(&setup, name, value).await;
    }
    // Decoys at the other scopes of one key: the cascade must pick the most specific.
    create_secret(
        &setup,
        "u__org__flyte__domain____project____key__f0",
        "SENTINEL-7c1e04b9-f0-org-decoy",
    )
    .await;
    let proxy = CountingProxy::start(moto.port).await;

    let dir = temp_dir("reference-serve");
    let port = free_port();
    let cfg = json!({
        "webhook": {
            "certDir": dir.join("certs"), "listenPort": port,
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            // The most allowed: the gate holds the cold calls until all 30 are sent, and a
            // stalled machine must not time them out first (attempts get half of it).
            "deadlineMs": 25000
        },
        "http": {"pathToken": TOKEN, "listenAddress": "127.0.0.1", "drainSeconds": 0}
    });
    let mut server = crate::common::bin();
    pod_env(&mut server, &proxy)
        .arg("serve")
        .env("PODMUTATOR_CONFIG", cfg.to_string())
        .env("RUST_LOG", "trace");
    let (mut child, logs) = spawn_serve(&mut server).await;
    let ca = std::fs::read(dir.join("certs/ca.crt")).unwrap();
    let pod = task_pod(&secrets);
    let body = serde_json::to_vec(&create_review(&pod, NS)).unwrap();
    let path = format!("/{TOKEN}/mutate--v1-pod");
    let admit = || {
        https_request(
            port,
            &ca,
            "localhost",
            "POST",
            &path,
            Some("application/json"),
            &body,
        )
    };

    // 1. Cold: 30 metadata calls, together in one round trip (the gate lets none through
    // until all 30 are in flight); then none.
    proxy.gate(30);
    let (status, cold) = admit().await.unwrap();
    assert_eq!(
        status,
        200,
        "{} (calls in flight at once: {})",
        String::from_utf8_lossy(&cold),
        proxy.most_at_once()
    );
    assert_eq!(
        proxy.count("DescribeSecret"),
        30,
        "3 scope names for each of 10 secrets"
    );
    assert_eq!(proxy.total(), 30, "and no value-reading call");
    assert_eq!(
        proxy.most_at_once(),
        30,
        "the 30 calls were in flight together: one round trip"
    );
    proxy.reset();
    let (status, warm) = admit().await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(warm, cold, "the same answer from the cache");
    assert_eq!(proxy.total(), 0, "a warm admission makes no call");

    let sentinels: Vec<(&str, &str)> = stored
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .chain([("decoy", "SENTINEL-7c1e04b9-f0-org-decoy")])
        .collect();
    let hits = leaks::find(&cold, &sentinels);
    assert!(hits.is_empty(), "a value reached the reply: {hits:?}");
    let out = apply(&pod, &patch_of(&response(&cold)));

    // 2. The init container's plan, run by the real binary with the pod's credentials, the
    // plan's root moved to a scratch directory (the volume mounts of the pod).
    let init = out["spec"]["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == INIT_CONTAINER))
        .expect("the fetcher init container");
    assert_eq!(init["command"], json!(["/podmutator", "fetch"]));
    let root = temp_dir("reference-volumes");
    let root_s = root.display().to_string();
    let plan = env_of(init, FETCH_PLAN_ENV).replace(INIT_ROOT, &root_s);
    std::fs::create_dir_all(root.join("files")).unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    let mut fetch = crate::common::bin();
    pod_env(&mut fetch, &proxy)
        .arg("fetch")
        .env(FETCH_PLAN_ENV, &plan);
    proxy.reset();
    proxy.gate(10);
    let fetched = fetch.output().unwrap();
    let fetch_err = String::from_utf8_lossy(&fetched.stderr).into_owned();
    assert!(
        fetched.status.success(),
        "fetch failed (calls in flight at once: {}): {fetch_err}",
        proxy.most_at_once()
    );
    assert!(plan.contains(r#""fetchStrategy":"parallel""#), "{plan}");
    assert_eq!(proxy.count("GetSecretValue"), 10, "one call per secret");
    assert_eq!(proxy.total(), 10, "and nothing else");
    assert_eq!(
        proxy.most_at_once(),
        10,
        "the 10 calls were in flight together: one round trip"
    );

    // The same plan with `fetchStrategy: batch`: one call, the same files.
    proxy.reset();
    let batch_root = temp_dir("reference-volumes-batch");
    let batch_s = batch_root.display().to_string();
    std::fs::create_dir_all(batch_root.join("files")).unwrap();
    std::fs::create_dir_all(batch_root.join("run")).unwrap();
    let batch_plan = plan
        .replace(
            r#""fetchStrategy":"parallel""#,
            r#""fetchStrategy":"batch""#,
        )
        .replace(&root_s, &batch_s);
    let mut fetch = crate::common::bin();
    pod_env(&mut fetch, &proxy)
        .arg("fetch")
        .env(FETCH_PLAN_ENV, &batch_plan);
    let batched = fetch.output().unwrap();
    assert!(
        batched.status.success(),
        "batch fetch failed: {}",
        String::from_utf8_lossy(&batched.stderr)
    );
    assert_eq!(
        proxy.count("BatchGetSecretValue"),
        1,
        "one call for 10 secrets"
    );
    assert_eq!(proxy.total(), 1, "and nothing else");
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    files_under(&root, &mut a);
    files_under(&batch_root, &mut b);
    let relative = |set: BTreeSet<String>, r: &str| -> BTreeSet<String> {
        set.into_iter().map(|p| p.replacen(r, "", 1)).collect()
    };
    assert_eq!(relative(a, &root_s), relative(b, &batch_s));

    // Exactly the files the patch promises, by the paths the task containers see.
    let promised = promised_files(&serde_json::from_value(out.clone()).unwrap()).unwrap();
    assert_eq!(promised.len(), 10, "{promised:?}");
    let seen_as = |p: &str| {
        p.replace(&format!("{root_s}/files"), "/etc/flyte/secrets")
            .replace(&format!("{root_s}/run"), RUN_DIR)
    };
    let mut written = BTreeSet::new();
    files_under(&root, &mut written);
    let exe = format!("{root_s}/run/bin/podmutator");
    assert!(
        written.remove(&exe),
        "the executable was copied: {written:?}"
    );
    let written_seen: BTreeSet<String> = written.iter().map(|p| seen_as(p)).collect();
    assert_eq!(
        written_seen,
        promised.keys().cloned().collect::<BTreeSet<_>>()
    );
    for file in &written {
        let id = &promised[&seen_as(file)];
        let want = &stored.iter().find(|(n, _)| n == id).unwrap().1;
        assert_eq!(&std::fs::read_to_string(file).unwrap(), want, "{file}");
        // The pod names no user: its containers run as their images' users, which may not be
        // the fetcher's, so the files are readable by every user, as a Secret volume's are.
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444, "{file}");
    }
    // The SDK paths: FILE at /etc/flyte/secrets/<key>, ANY at flytekit's path (no group).
    for key in ["f0", "f3", "a0", "a2"] {
        assert!(
            promised.contains_key(&format!("/etc/flyte/secrets/{key}")),
            "{key}"
        );
    }
    assert!(
        promised["/etc/flyte/secrets/f0"].contains("__project__flytesnacks__"),
        "the project scope wins over the organisation decoy"
    );

    // 3. The wrapped container, run by the copied executable, as another user than the fetch
    // ran as (flytekit's images run as `USER flytekit`, 1000): the child sees the variables.
    let main = &out["spec"]["containers"][0];
    let command: Vec<String> = serde_json::from_value(main["command"].clone()).unwrap();
    assert_eq!(command[..3], ["/podmutator/bin/podmutator", "exec", "--"]);
    let args: Vec<String> = serde_json::from_value(main["args"].clone()).unwrap();
    let exec_plan = env_of(main, EXEC_ENV_ENV).replace(RUN_DIR, &format!("{root_s}/run"));
    let ran = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .arg(&exe)
        .args(&command[1..])
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(EXEC_ENV_ENV, exec_plan)
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout),
        "SENTINEL-7c1e04b9-e0-value|SENTINEL-7c1e04b9-e1-value|SENTINEL-7c1e04b9-e2-value"
    );

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let logs = logs.lock().unwrap().clone();
    assert!(logs.lines().count() > 5, "trace logging was on:\n{logs}");
    for (what, text) in [("server log", logs.as_str()), ("fetch output", &fetch_err)] {
        let hits = leaks::find(text.as_bytes(), &sentinels);
        assert!(hits.is_empty(), "a value reached the {what}: {hits:?}");
    }
}
