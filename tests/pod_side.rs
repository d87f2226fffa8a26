//! The pod side of reference delivery, as real processes: `podmutator fetch` against moto
//! behind the counting proxy, and `podmutator exec` replacing itself with a real child.
//!
//! The processes are this test binary itself: run with `PODMUTATOR_TEST_ROLE=fetch|exec`, the
//! test `pod_side_process` calls [`run_fetch`]/[`run_exec`] as `main` will, and `exec` replaces
//! the whole test process with the child, so its pid, signals and exit code are the child's.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::aws::{CountingProxy, Moto, client, create_secret};
use common::{exec_wrapper, temp_dir};
use podmutator::pod::fetch::{fetch, run_fetch};
use podmutator_core::pod::exec::{EXEC_ENV_ENV, run_exec};
use podmutator_core::pod::plan::{FETCH_PLAN_ENV, FetchItem, FetchPlan};

const ROLE: &str = "PODMUTATOR_TEST_ROLE";
const ARGV: &str = "PODMUTATOR_TEST_ARGV";

/// The child side: a no-op unless [`ROLE`] is set. Reports errors the way `main` does.
#[test]
fn pod_side_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let code = match role.as_str() {
        "fetch" => match run_fetch() {
            Ok(s) => {
                eprintln!(
                    "podmutator: fetched {} secrets into {} files in {} calls",
                    s.secrets, s.files, s.calls
                );
                0
            }
            Err(e) => {
                eprintln!("podmutator: {e}");
                1
            }
        },
        "exec" => {
            let argv: Vec<String> = serde_json::from_str(&std::env::var(ARGV).unwrap()).unwrap();
            let Err(e) = run_exec(argv);
            eprintln!("podmutator: {e}");
            1
        }
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

/// This test binary as `podmutator <role>`, with a clean environment but for `env`.
fn pod_side(role: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "pod_side::pod_side_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn exec_cmd(vars: &BTreeMap<&str, PathBuf>, argv: &[&str]) -> Command {
    pod_side(
        "exec",
        &[
            (EXEC_ENV_ENV, serde_json::to_string(vars).unwrap()),
            (ARGV, serde_json::to_string(argv).unwrap()),
        ],
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Secret names as the webhook resolves them: the project scope of `u__org__…`.
fn secret_name(i: usize) -> String {
    format!("u__org__acme__domain__development__project__flytesnacks__key__k{i}")
}

fn plan(root: &Path, secrets: &[(String, &str)]) -> FetchPlan {
    FetchPlan {
        root: root.to_owned(),
        region: Some("us-east-1".into()),
        secrets: secrets
            .iter()
            .map(|(id, file)| FetchItem {
                id: id.clone(),
                file: root.join(file),
            })
            .collect(),
        copy_executable_to: None,
        fetch_strategy: None,
        readable_by_all: false,
    }
}

/// Every file under `dir`, relative.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_secrets_are_fetched_in_one_batch_call_into_0400_files() {
    let moto = Moto::start();
    let admin = client(&moto.url()).await;
    let mut secrets = Vec::new();
    for i in 0..19 {
        create_secret(&admin, &secret_name(i), &format!("fake-value-{i}")).await;
        secrets.push((secret_name(i), format!("files/k{i}")));
    }
    // A binary secret: bytes that are not UTF-8 go to the file unchanged.
    admin
        .create_secret()
        .name("u__org__acme__domain____project____key__cert")
        .secret_binary(aws_smithy_types::Blob::new(vec![0xff, 0x00, 0xfe]))
        .send()
        .await
        .unwrap();
    secrets.push((
        "u__org__acme__domain____project____key__cert".into(),
        "files/nested/cert".into(),
    ));
    // The same secret as a file and as an env var's file: fetched once, written twice.
    secrets.push((secret_name(0), "env/0".into()));
    let proxy = CountingProxy::start(moto.port).await;
    let root = temp_dir("fetch-twenty");
    let refs: Vec<(String, &str)> = secrets
        .iter()
        .map(|(i, f)| (i.clone(), f.as_str()))
        .collect();
    let plan = plan(&root, &refs);
    assert_eq!(plan.ids().len(), 20);

    let summary = fetch(&plan, client(&proxy.url()).await).await.unwrap();

    assert_eq!(
        proxy.count("BatchGetSecretValue"),
        1,
        "one round trip for 20 ids"
    );
    assert_eq!(proxy.total(), 1, "and no other call");
    assert_eq!((summary.secrets, summary.files, summary.calls), (20, 21, 1));
    for i in 0..19 {
        let file = root.join(format!("files/k{i}"));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("fake-value-{i}")
        );
        assert_eq!(mode(&file), 0o400, "{}", file.display());
    }
    assert_eq!(
        std::fs::read(root.join("files/nested/cert")).unwrap(),
        vec![0xff, 0x00, 0xfe]
    );
    assert_eq!(
        std::fs::read_to_string(root.join("env/0")).unwrap(),
        "fake-value-0"
    );
    for dir in ["files", "files/nested", "env"] {
        assert_eq!(mode(&root.join(dir)), 0o700, "{dir}");
    }
    assert_eq!(
        files_under(&root).len(),
        21,
        "exactly the promised files, no temporary ones"
    );
}

/// What the webhook writes by default (`embedded.fetchStrategy: parallel`): one
/// `GetSecretValue` per distinct id, no batch, the same files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parallel_strategy_fetches_each_id_once_with_get_secret_value() {
    let moto = Moto::start();
    let admin = client(&moto.url()).await;
    for i in 0..5 {
        create_secret(&admin, &secret_name(i), &format!("fake-value-{i}")).await;
    }
    let proxy = CountingProxy::start(moto.port).await;
    let root = temp_dir("fetch-parallel");
    let files: Vec<(String, String)> = (0..5)
        .map(|i| (secret_name(i), format!("files/k{i}")))
        .chain([(secret_name(0), "env/K0".to_owned())])
        .collect();
    let refs: Vec<(String, &str)> = files.iter().map(|(i, f)| (i.clone(), f.as_str())).collect();
    let mut plan = plan(&root, &refs);
    plan.fetch_strategy = Some(podmutator_core::config::FetchStrategy::Parallel);
    // The field survives the plan's JSON, as the init container reads it.
    let plan = FetchPlan::parse(&plan.to_json().unwrap()).unwrap();
    assert_eq!(
        plan.fetch_strategy,
        Some(podmutator_core::config::FetchStrategy::Parallel)
    );

    let summary = fetch(&plan, client(&proxy.url()).await).await.unwrap();

    assert_eq!(proxy.count("GetSecretValue"), 5, "one call per distinct id");
    assert_eq!(proxy.total(), 5, "and no batch");
    assert_eq!((summary.secrets, summary.files, summary.calls), (5, 6, 5));
    for i in 0..5 {
        let file = root.join(format!("files/k{i}"));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("fake-value-{i}")
        );
        assert_eq!(mode(&file), 0o400, "{}", file.display());
    }
    assert_eq!(
        std::fs::read_to_string(root.join("env/K0")).unwrap(),
        "fake-value-0"
    );
    assert_eq!(files_under(&root).len(), 6);
}

#[test]
fn a_plan_names_a_known_fetch_strategy_or_is_refused() {
    let base = r#"{"root": "/r", "secrets": [{"id": "a", "file": "/r/a"}]"#;
    for (strategy, want) in [
        ("batch", podmutator_core::config::FetchStrategy::Batch),
        ("parallel", podmutator_core::config::FetchStrategy::Parallel),
        ("hybrid", podmutator_core::config::FetchStrategy::Hybrid),
    ] {
        let plan =
            FetchPlan::parse(&format!(r#"{base}, "fetchStrategy": "{strategy}"}}"#)).unwrap();
        assert_eq!(plan.fetch_strategy, Some(want));
    }
    assert_eq!(
        FetchPlan::parse(&format!("{base}}}"))
            .unwrap()
            .fetch_strategy,
        None
    );
    let err = FetchPlan::parse(&format!(r#"{base}, "fetchStrategy": "serial"}}"#))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fetchStrategy") && err.contains("serial"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_fails_naming_it_and_nothing_is_written() {
    let moto = Moto::start();
    let admin = client(&moto.url()).await;
    create_secret(&admin, &secret_name(1), "fake-value-1").await;
    create_secret(&admin, &secret_name(3), "fake-value-3").await;
    let proxy = CountingProxy::start(moto.port).await;
    let root = temp_dir("fetch-missing");
    let plan = plan(
        &root,
        &[
            (secret_name(1), "a"),
            (secret_name(2), "b"),
            (secret_name(3), "c"),
        ],
    );

    let e = fetch(&plan, client(&proxy.url()).await)
        .await
        .unwrap_err()
        .to_string();

    assert!(e.contains(&secret_name(2)), "{e}");
    assert!(
        !e.contains(&secret_name(1)) && !e.contains("fake-value"),
        "{e}"
    );
    assert_eq!(proxy.count("BatchGetSecretValue"), 1);
    assert_eq!(
        files_under(&root),
        Vec::<String>::new(),
        "nothing written on failure"
    );
}

#[test]
fn fetch_as_a_process_uses_the_default_chain_and_copies_itself() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let moto = Moto::start();
    let proxy = rt.block_on(async {
        let admin = client(&moto.url()).await;
        create_secret(&admin, &secret_name(0), "fake-value-0").await;
        CountingProxy::start(moto.port).await
    });
    let root = temp_dir("fetch-process");
    let mut ok = plan(&root, &[(secret_name(0), "files/k0")]);
    ok.copy_executable_to = Some(root.join("bin/podmutator"));
    // Credentials and endpoint from the environment: the SDK's default chain, as in a pod
    // (where EKS Pod Identity or IRSA provides them).
    let env = |plan: &FetchPlan| {
        vec![
            (FETCH_PLAN_ENV, plan.to_json().unwrap()),
            ("AWS_ENDPOINT_URL", proxy.url()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ]
    };

    let out = pod_side("fetch", &env(&ok)).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(root.join("files/k0")).unwrap(),
        "fake-value-0"
    );
    let copy = root.join("bin/podmutator");
    assert_eq!(mode(&copy), 0o555);
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(std::env::current_exe().unwrap()).unwrap()
    );
    assert_eq!(proxy.count("BatchGetSecretValue"), 1);

    let missing = plan(
        &temp_dir("fetch-process-missing"),
        &[(secret_name(9), "k9")],
    );
    let out = pod_side("fetch", &env(&missing)).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(&secret_name(9)), "{}", stderr(&out));

    let out = pod_side(
        "fetch",
        &[(
            FETCH_PLAN_ENV,
            r#"{"root": "/r", "secrets": [{"id": "a", "file": "/etc/passwd"}]}"#.to_owned(),
        )],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("secrets[0].file"), "{}", stderr(&out));
}

/// Files as `podmutator fetch` leaves them.
fn env_files(name: &str, values: &[(&str, &str)]) -> (PathBuf, BTreeMap<String, PathBuf>) {
    let dir = temp_dir(name);
    let mut vars = BTreeMap::new();
    for (i, (var, value)) in values.iter().enumerate() {
        let file = dir.join(i.to_string());
        std::fs::write(&file, value).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
        vars.insert((*var).to_owned(), file);
    }
    (dir, vars)
}

fn as_refs(vars: &BTreeMap<String, PathBuf>) -> BTreeMap<&str, PathBuf> {
    vars.iter().map(|(k, v)| (k.as_str(), v.clone())).collect()
}

#[test]
fn the_child_sees_the_variables_and_not_the_plan() {
    let (_dir, vars) = env_files(
        "exec-vars",
        &[
            ("_UNION_DB_PASSWORD", "fake-db-password"),
            ("API_TOKEN", "fake token\nline 2\n"),
        ],
    );
    let out = exec_cmd(
        &as_refs(&vars),
        &["sh", "-c", r#"printf '%s|%s|%s' "$_UNION_DB_PASSWORD" "$API_TOKEN" "${PODMUTATOR_EXEC_ENV-unset}""#],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.ends_with("fake-db-password|fake token\nline 2\n|unset"),
        "child printed {stdout:?}"
    );
}

#[test]
fn the_exit_code_is_the_childs() {
    let (_dir, vars) = env_files("exec-code", &[("A", "fake-a")]);
    let out = exec_cmd(&as_refs(&vars), &["--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
}

#[test]
fn the_child_replaces_the_wrapper_so_sigterm_reaches_it() {
    let (_dir, vars) = env_files("exec-signal", &[("A", "fake-a")]);
    let mut child = exec_cmd(
        &as_refs(&vars),
        &[
            "sh",
            "-c",
            r#"trap 'exit 42' TERM; echo "pid $$"; while :; do sleep 0.05; done"#,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The harness's own "test pod_side_process ... " has no newline, so the pid may share its line.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid = loop {
        let line = lines.next().expect("the child prints its pid").unwrap();
        if let Some(pid) = line.split("pid ").nth(1) {
            break pid.to_owned();
        }
    };
    assert_eq!(
        pid,
        child.id().to_string(),
        "the command runs in the wrapper's process"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(42),
        "the child's TERM trap ran and chose the exit code"
    );
}

#[test]
fn a_missing_file_fails_naming_it_before_the_child_starts() {
    let (dir, mut vars) = env_files("exec-missing", &[("A", "fake-a")]);
    vars.insert("B_SECRET".into(), dir.join("never-written"));
    let marker = dir.join("started");
    let script = format!("touch {}", marker.display());
    let out = exec_cmd(&as_refs(&vars), &["sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("never-written") && err.contains("B_SECRET"),
        "{err}"
    );
    assert!(!err.contains("fake-a"), "{err}");
    assert!(
        !marker.exists(),
        "the child ran although a value was missing"
    );
}

#[test]
fn exec_without_a_command_or_plan_says_how_to_use_it() {
    let out = exec_cmd(&BTreeMap::new(), &["--"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("podmutator exec -- <command>"),
        "{}",
        stderr(&out)
    );
    let out = pod_side("exec", &[(ARGV, r#"["true"]"#.to_owned())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(EXEC_ENV_ENV), "{}", stderr(&out));
}

/// The fetcher image's layout, with the real binaries: `fetch` copies the small exec wrapper
/// beside it (not itself) to `copyExecutableTo`, says so, and the copy, run as the patch runs
/// it (`/podmutator/bin/podmutator exec -- ...`), starts the command with the fetched value.
/// Without the wrapper beside it, fetch copies itself and says that the image lacks it.
#[test]
fn fetch_copies_the_exec_wrapper_from_beside_it_and_the_copy_runs_the_command() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let moto = Moto::start();
    rt.block_on(async {
        let admin = client(&moto.url()).await;
        create_secret(&admin, &secret_name(0), "fake-value-0").await;
    });
    let wrapper = exec_wrapper();
    let full = Path::new(env!("CARGO_BIN_EXE_podmutator"));

    for with_wrapper in [true, false] {
        let image = temp_dir(&format!("fetcher-image-{with_wrapper}"));
        std::fs::copy(full, image.join("podmutator")).unwrap();
        if with_wrapper {
            std::fs::copy(&wrapper, image.join("podmutator-exec")).unwrap();
        }
        let root = temp_dir(&format!("fetcher-volume-{with_wrapper}"));
        let mut p = plan(&root, &[(secret_name(0), "env/DB")]);
        p.copy_executable_to = Some(root.join("bin/podmutator"));
        let out = Command::new(image.join("podmutator"))
            .arg("fetch")
            .env_clear()
            .env(FETCH_PLAN_ENV, p.to_json().unwrap())
            .env("AWS_ENDPOINT_URL", moto.url())
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let copy = root.join("bin/podmutator");
        let expected = if with_wrapper { &wrapper } else { full };
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            std::fs::read(expected).unwrap(),
            "with_wrapper={with_wrapper}"
        );
        assert_eq!(mode(&copy), 0o555);
        let said = stderr(&out);
        if with_wrapper {
            assert!(
                said.contains("copied the exec wrapper (podmutator-exec"),
                "{said}"
            );
        } else {
            assert!(
                said.contains("the image has no podmutator-exec beside it"),
                "{said}"
            );
        }

        let vars = BTreeMap::from([("DB", root.join("env/DB"))]);
        let run = Command::new(&copy)
            .args(["exec", "--", "sh", "-c", r#"printf %s "$DB"; exit 3"#])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env(EXEC_ENV_ENV, serde_json::to_string(&vars).unwrap())
            .output()
            .unwrap();
        assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
        assert_eq!(String::from_utf8_lossy(&run.stdout), "fake-value-0");
    }
    // The wrapper is the point: a fraction of the full binary (the release sizes are in
    // scripts/bench-size.sh; this holds in the debug build too).
    let (small, big) = (
        std::fs::metadata(&wrapper).unwrap().len(),
        std::fs::metadata(full).unwrap().len(),
    );
    assert!(
        small * 4 < big,
        "wrapper {small} bytes, podmutator {big} bytes"
    );
}
