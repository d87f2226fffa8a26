//! Issue 36, "also found": a configuration path that is not a regular file was read until
//! memory ran out (`--flyte-config /dev/zero`) or forever (a FIFO). Every configuration file is
//! now looked at before it is opened, and read within a bound.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::temp_dir;

/// Runs `check-config` with `args` and `env`; its exit status and stderr, or a failure if it
/// is still running after a minute (it answers in milliseconds when it works).
fn check_config(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = crate::common::bin();
    cmd.arg("check-config")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return (status.code(), stderr);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("check-config {args:?} {env:?} still reading after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_configuration_path_that_is_not_a_bounded_regular_file_is_refused_without_reading_it() {
    let dir = temp_dir("attack-config-files");
    let fifo = dir.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let fifo = fifo.to_str().unwrap();
    let huge = dir.join("huge.yaml");
    std::fs::write(&huge, "#".repeat(5 << 20)).unwrap();
    let huge = huge.to_str().unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 6] = [
        (
            &["--flyte-config", "/dev/zero"],
            &[],
            "--flyte-config: cannot read /dev/zero: not a regular file",
        ),
        (
            &["--config", "/dev/zero"],
            &[],
            "--config: cannot read /dev/zero: not a regular file",
        ),
        (&["--config", fifo], &[], "not a regular file"),
        (
            &[],
            &[("PODMUTATOR_CONFIG_FILE", "/dev/zero")],
            "PODMUTATOR_CONFIG_FILE: cannot read /dev/zero",
        ),
        (
            &[],
            &[("PODMUTATOR_FLYTE_CONFIG_FILE", fifo)],
            "PODMUTATOR_FLYTE_CONFIG_FILE: cannot read",
        ),
        (&["--config", huge], &[], "larger than 4194304 bytes"),
    ];
    for (args, env, said) in cases {
        let (code, stderr) = check_config(args, env);
        assert_eq!(code, Some(1), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?} {env:?}: {stderr}");
    }
}
