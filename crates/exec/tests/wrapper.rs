//! The wrapper binary as a pod runs it: copied to `/podmutator/bin/podmutator` and started as
//! `podmutator exec -- <command> [args...]` with `PODMUTATOR_EXEC_ENV` naming the value files.

use std::path::PathBuf;
use std::process::{Command, Output};

const WRAPPER: &str = env!("CARGO_BIN_EXE_podmutator-exec");

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("podmutator-exec-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wrapper(args: &[&str], plan: Option<&str>) -> Output {
    let mut cmd = Command::new(WRAPPER);
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin");
    if let Some(plan) = plan {
        cmd.env("PODMUTATOR_EXEC_ENV", plan);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn exec_sets_each_variable_from_its_file_and_becomes_the_command() {
    let d = dir("run");
    std::fs::write(d.join("db"), "fake-db-value\n").unwrap();
    std::fs::write(d.join("api"), "fake-api-value").unwrap();
    let plan =
        serde_json::json!({"DB_PASSWORD": d.join("db"), "API_KEY": d.join("api")}).to_string();
    // The child prints both values and whether the plan itself reached it, then exits 7: the
    // exit code is the command's own, because the wrapper replaced itself with it.
    let script =
        r#"printf '%s|%s|%s' "$DB_PASSWORD" "$API_KEY" "${PODMUTATOR_EXEC_ENV-unset}"; exit 7"#;
    for argv in [
        &["exec", "--", "sh", "-c", script][..],
        &["--", "sh", "-c", script][..],
        &["exec", "sh", "-c", script][..],
    ] {
        let out = wrapper(argv, Some(&plan));
        assert_eq!(out.status.code(), Some(7), "{argv:?}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "fake-db-value\n|fake-api-value|unset",
            "{argv:?}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn failures_exit_1_with_the_full_binarys_message_and_run_nothing() {
    let d = dir("fail");
    let marker = d.join("ran");
    let touch = format!("touch {}", marker.display());
    let cases = [
        (None, "PODMUTATOR_EXEC_ENV is not set"),
        (
            Some("[1]".to_owned()),
            "PODMUTATOR_EXEC_ENV is not a valid exec plan",
        ),
        (
            Some(r#"{"A=B": "/f"}"#.to_owned()),
            "\"A=B\" is not an environment variable name",
        ),
        (
            Some(serde_json::json!({"DB": d.join("absent")}).to_string()),
            "for DB: No such file or directory",
        ),
    ];
    for (plan, want) in cases {
        let out = wrapper(&["exec", "--", "sh", "-c", &touch], plan.as_deref());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.starts_with("podmutator: exec failed: "), "{err}");
        assert!(err.contains(want), "{err:?} should contain {want:?}");
        assert_eq!(
            err.matches("os error").count().max(1),
            1,
            "the cause twice: {err}"
        );
        assert!(!marker.exists(), "the command ran although the plan failed");
    }
    let out = wrapper(&["exec", "--", "/nonexistent/command"], Some("{}"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot run /nonexistent/command"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn other_commands_are_refused_with_usage_and_help_and_version_answer() {
    for (args, code, want) in [
        (
            &["fetch"][..],
            2,
            "`fetch` is not a command of the exec wrapper",
        ),
        (&[][..], 2, "usage: podmutator exec -- <command>"),
        (&["exec"][..], 1, "no command to run"),
    ] {
        let out = wrapper(args, Some("{}"));
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
    }
    let out = wrapper(&["--help"], None);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("PODMUTATOR_EXEC_ENV"));
    let out = wrapper(&["--version"], None);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("podmutator-exec {}", env!("CARGO_PKG_VERSION"))
    );
}
