//! Hole 7 of issue 25, the pod side of reference delivery: what `podmutator exec` reads and
//! where `podmutator fetch` writes, against a plan or a volume an attacker shaped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::temp_dir;
use podmutator::pod::fetch::write_files;
use podmutator_core::pod::exec::{EXEC_ENV_ENV, MAX_ENV_STRING};
use podmutator_core::pod::plan::{FetchItem, FetchPlan};

/// Runs `cmd` and waits at most `limit`; a process still running then is killed and the test
/// fails: a read that never ends must not hang the suite. (A bound on a hang, not a claim
/// about speed.)
fn run_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let end = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?}: the value file is being read to its end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `podmutator exec -- true` with a plan of one variable read from `file`.
fn exec_with(file: &Path) -> Output {
    let plan = serde_json::json!({ "DB_PASSWORD": file });
    let mut cmd = crate::common::bin();
    cmd.args(["exec", "--", "true"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(EXEC_ENV_ENV, plan.to_string());
    run_within(cmd, Duration::from_secs(60))
}

#[test]
fn an_exec_plan_naming_dev_zero_is_refused_without_reading_it() {
    let out = exec_with(Path::new("/dev/zero"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/dev/zero for DB_PASSWORD is a character device, not a regular file"),
        "{stderr}"
    );
}

#[test]
fn an_exec_value_file_of_a_terabyte_is_refused_after_reading_one_byte_past_the_limit() {
    let dir = temp_dir("attack-exec-huge");
    let huge = dir.join("value");
    // Sparse: a terabyte of zeros that costs no disk, and hours and all the memory to read.
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let out = exec_with(&huge);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{} for DB_PASSWORD holds more than {MAX_ENV_STRING} bytes",
            huge.display()
        )),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Another container of the pod (a native sidecar, an earlier init container) leaves
/// `files -> <somewhere>` in the volume before the fetcher runs: the secret, and the copied
/// executable, must not land at the link's target.
#[test]
fn a_symlinked_directory_in_the_fetch_volume_is_refused_and_its_target_never_written() {
    let base = temp_dir("attack-fetch-link");
    let root = base.join("podmutator");
    let target = base.join("hostpath");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("existing"), "untouched").unwrap();
    std::os::unix::fs::symlink(&target, root.join("files")).unwrap();
    std::os::unix::fs::symlink(&target, root.join("bin")).unwrap();
    let values = BTreeMap::from([(
        "u__org__o__domain__d__project__p__key__db",
        b"fake-secret".to_vec(),
    )]);
    let item = |file: PathBuf| FetchItem {
        id: "u__org__o__domain__d__project__p__key__db".into(),
        file,
    };
    let plans = [
        // The secret's directory is the link.
        FetchPlan {
            root: root.clone(),
            region: None,
            secrets: vec![item(root.join("files/db"))],
            copy_executable_to: None,
            fetch_strategy: None,
            readable_by_all: false,
        },
        // The secret is written where it should be; the executable's directory is the link.
        FetchPlan {
            root: root.clone(),
            region: None,
            secrets: vec![item(root.join("env/0"))],
            copy_executable_to: Some(root.join("bin/podmutator")),
            fetch_strategy: None,
            readable_by_all: false,
        },
    ];
    for (plan, link) in plans.iter().zip(["files", "bin"]) {
        plan.validate().unwrap();
        let e = write_files(plan, &values).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} is a symbolic link", root.join(link).display())),
            "{e}"
        );
        assert_eq!(names(&target), vec!["existing"], "written through {link}");
        assert_eq!(
            std::fs::read_to_string(target.join("existing")).unwrap(),
            "untouched"
        );
    }
    std::fs::remove_dir_all(&base).unwrap();
}
