//! `podmutator exec -- <command> <args>`: the wrapper of a container that asks for secrets as
//! environment variables in reference delivery (bank-vaults' `vault-env` shape). It reads each
//! variable's value from the file the init container wrote (`podmutator fetch`), sets them in
//! its environment and replaces itself with the original command, so the values live only in
//! that process's memory: never in the pod spec, so never in etcd or `kubectl get pod`.
//!
//! The plan is JSON in [`EXEC_ENV_ENV`], variable name to file:
//! `{"_UNION_DB_PASSWORD": "/podmutator/env/0"}`.
//!
//! Why files from the init container rather than a fetch here: the pod's secrets cost one
//! `BatchGetSecretValue` round trip for the whole pod instead of one per container start; a
//! failed fetch keeps the pod in Init (visible in `kubectl describe`) instead of crash-looping
//! the task; and the wrapped command starts without waiting on the network. The files sit on
//! an in-memory volume mounted, read-only, only into the containers that need them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

pub mod names;

use names::{ENV_VAR_NAME_RULE, is_env_var_name, path_problem};

/// The environment variable holding a wrapped container's [`ExecPlan`] as JSON.
pub const EXEC_ENV_ENV: &str = "PODMUTATOR_EXEC_ENV";
/// Linux's limit for one `NAME=value` string of a new process (`MAX_ARG_STRLEN`, 32 pages):
/// a longer value would fail the `exec` with a bare "Argument list too long".
pub const MAX_ENV_STRING: usize = 32 * 4096;

/// Variable name to the file holding its value.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ExecPlan {
    pub vars: BTreeMap<String, PathBuf>,
}

/// Why the command was not started. Names variables and files, never values.
#[derive(Debug)]
pub enum ExecError {
    NoCommand,
    NoPlan,
    BadPlan(String),
    Read {
        var: String,
        path: String,
        source: std::io::Error,
    },
    NotText {
        var: String,
        path: String,
    },
    NotAFile {
        var: String,
        path: String,
        kind: &'static str,
    },
    TooLong {
        var: String,
        path: String,
    },
    Exec {
        program: String,
        source: std::io::Error,
    },
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoCommand => {
                f.write_str("no command to run: use `podmutator exec -- <command> [args...]`")
            }
            Self::NoPlan => write!(
                f,
                "{EXEC_ENV_ENV} is not set: `podmutator exec` wraps the command of a container the webhook rewrote, and the webhook sets it"
            ),
            Self::BadPlan(why) => write!(f, "{EXEC_ENV_ENV} is not a valid exec plan: {why}"),
            Self::Read { var, path, source } => {
                let hint = if source.kind() == std::io::ErrorKind::PermissionDenied {
                    "the init container wrote it as another user than this container runs as: set runAsUser in the pod's securityContext, or on this container and the first one, so that the webhook runs it as this user"
                } else {
                    "the init container writes it; is the secrets volume mounted in this container, and did the fetch succeed?"
                };
                write!(f, "cannot read {path} for {var}: {source} ({hint})")
            }
            Self::NotText { var, path } => write!(
                f,
                "{path} for {var} is not UTF-8 text without NUL bytes: a binary secret can only be mounted as a file (mount_requirement: FILE)"
            ),
            Self::NotAFile { var, path, kind } => write!(
                f,
                "{path} for {var} is {kind}, not a regular file: the init container writes each value to a regular file, so this plan names none of its files"
            ),
            Self::TooLong { var, path } => write!(
                f,
                "{path} for {var} holds more than {MAX_ENV_STRING} bytes, Linux's limit for one environment variable: mount it as a file (mount_requirement: FILE)"
            ),
            Self::Exec { program, source } => write!(f, "cannot run {program}: {source}"),
        }
    }
}

/// Each message names its cause itself, so there is no `source` to print again after it.
impl std::error::Error for ExecError {}

impl ExecPlan {
    /// Parses and validates a plan: names per the API server's env-var rule, files absolute
    /// and clean.
    pub fn parse(json: &str) -> Result<Self, ExecError> {
        let plan: ExecPlan =
            serde_json::from_str(json).map_err(|e| ExecError::BadPlan(e.to_string()))?;
        for (var, file) in &plan.vars {
            if !is_env_var_name(var) {
                return Err(ExecError::BadPlan(format!(
                    "{var:?} is not an environment variable name: {ENV_VAR_NAME_RULE}"
                )));
            }
            if var == EXEC_ENV_ENV {
                return Err(ExecError::BadPlan(format!(
                    "{var} cannot be set from a file"
                )));
            }
            if let Some(p) = path_problem(file) {
                return Err(ExecError::BadPlan(format!("{var}: {p}")));
            }
        }
        Ok(plan)
    }

    /// Each variable with its file's content, verbatim (a trailing newline is kept, as Flyte's
    /// file secrets keep it). Fails on the first file that cannot be an environment value.
    pub fn load(&self) -> Result<Vec<(String, String)>, ExecError> {
        let mut out = Vec::with_capacity(self.vars.len());
        for (var, file) in &self.vars {
            let (var, path) = (var.clone(), file.display().to_string());
            // `NAME=value` must fit in one argument string of the new process.
            let room = MAX_ENV_STRING.saturating_sub(var.len() + 1);
            let bytes = match read_bounded(file, room) {
                Ok(Bounded::Within(bytes)) => bytes,
                Ok(Bounded::Over) => return Err(ExecError::TooLong { var, path }),
                Ok(Bounded::NotAFile(kind)) => return Err(ExecError::NotAFile { var, path, kind }),
                Err(source) => return Err(ExecError::Read { var, path, source }),
            };
            match String::from_utf8(bytes) {
                Ok(text) if !text.contains('\0') => out.push((var, text)),
                _ => return Err(ExecError::NotText { var, path }),
            }
        }
        Ok(out)
    }
}

/// What [`read_bounded`] found.
#[derive(Debug, PartialEq, Eq)]
enum Bounded {
    /// The whole content, at most the limit.
    Within(Vec<u8>),
    /// More than the limit; what was read is dropped.
    Over,
    /// A device, FIFO, socket or directory: what it would yield is not a file's content
    /// (`/dev/zero` never ends, a FIFO waits for a writer).
    NotAFile(&'static str),
}

/// Reads `file` if it is a regular file of at most `limit` bytes, reading at most `limit + 1`
/// whatever its size: a value file is never read to its end before the limit is checked.
fn read_bounded(file: &Path, limit: usize) -> std::io::Result<Bounded> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, before the
    // type check below could refuse it. It changes nothing for a regular file.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(file)?;
    // The type of what was opened (fstat), not of what the path named a moment before.
    let kind = f.metadata()?.file_type();
    if !kind.is_file() {
        let named = [
            (kind.is_dir(), "a directory"),
            (kind.is_fifo(), "a FIFO"),
            (kind.is_char_device(), "a character device"),
            (kind.is_block_device(), "a block device"),
            (kind.is_socket(), "a socket"),
        ];
        let what = named.into_iter().find(|(is, _)| *is);
        return Ok(Bounded::NotAFile(
            what.map_or("something else", |(_, name)| name),
        ));
    }
    let mut bytes = Vec::new();
    f.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    Ok(if bytes.len() > limit {
        Bounded::Over
    } else {
        Bounded::Within(bytes)
    })
}

/// `podmutator exec`: `args` are what follows `exec` (a leading `--` is skipped). Reads
/// [`EXEC_ENV_ENV`], loads every value before anything starts, then replaces this process with
/// the command (same pid, so signals and the exit code are the command's own). Returns only on
/// failure.
pub fn run_exec<I, S>(args: I) -> Result<Infallible, ExecError>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let mut args = args.into_iter().map(Into::into).peekable();
    if args.peek().is_some_and(|a| a == "--") {
        args.next();
    }
    let program = args.next().ok_or(ExecError::NoCommand)?;
    let json = std::env::var(EXEC_ENV_ENV).map_err(|_| ExecError::NoPlan)?;
    let values = ExecPlan::parse(&json)?.load()?;
    let mut command = std::process::Command::new(&program);
    command.args(args).env_remove(EXEC_ENV_ENV).envs(values);
    let source = command.exec();
    Err(ExecError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(json: &str) -> String {
        match ExecPlan::parse(json) {
            Err(ExecError::BadPlan(m)) => m,
            other => panic!("expected a bad plan, got {other:?}"),
        }
    }

    #[rstest::rstest]
    #[case::not_an_object(r#"["A"]"#, "at")]
    #[case::bad_name(r#"{"A=B": "/f"}"#, "not an environment variable name")]
    #[case::relative_file(r#"{"A": "f"}"#, "absolute")]
    #[case::escaping_file(r#"{"A": "/p/../etc/shadow"}"#, "clean")]
    #[case::itself(r#"{"PODMUTATOR_EXEC_ENV": "/f"}"#, "cannot be set from a file")]
    fn bad_plans_are_refused_naming_the_variable(#[case] json: &str, #[case] want: &str) {
        let m = bad(json);
        assert!(m.contains(want), "{m:?} should contain {want:?}");
    }

    /// A file the init container wrote as another user is named as such: the fix is the
    /// pod's user, not the volume or the fetch.
    #[test]
    fn a_file_this_user_may_not_read_names_the_user_mismatch() {
        let read = |kind| {
            ExecError::Read {
                var: "_UNION_DB".into(),
                path: "/podmutator/env/0".into(),
                source: std::io::Error::from(kind),
            }
            .to_string()
        };
        let denied = read(std::io::ErrorKind::PermissionDenied);
        assert!(denied.contains("as another user"), "{denied}");
        assert!(denied.contains("runAsUser"), "{denied}");
        let missing = read(std::io::ErrorKind::NotFound);
        assert!(
            missing.contains("is the secrets volume mounted"),
            "{missing}"
        );
    }

    #[test]
    fn values_are_read_verbatim_and_refused_when_they_cannot_be_env_values() {
        let dir = std::env::temp_dir().join(format!("podmutator-exec-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("text"), "fake-line\n").unwrap();
        std::fs::write(dir.join("binary"), [0xff, 0xfe, 0x00]).unwrap();
        std::fs::write(dir.join("big"), vec![b'x'; MAX_ENV_STRING]).unwrap();
        let plan = |var: &str, file: &str| ExecPlan {
            vars: BTreeMap::from([(var.to_owned(), dir.join(file))]),
        };
        assert_eq!(
            plan("A", "text").load().unwrap(),
            vec![("A".to_owned(), "fake-line\n".to_owned())]
        );
        let e = plan("B", "binary").load().unwrap_err();
        assert!(matches!(e, ExecError::NotText { .. }), "{e}");
        let e = plan("C", "big").load().unwrap_err();
        assert!(matches!(e, ExecError::TooLong { .. }), "{e}");
        let e = plan("D", "absent").load().unwrap_err().to_string();
        assert!(e.contains("absent") && e.contains("D"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `load` on a thread and waits at most `limit`: a read that never ends fails the
    /// test by this timeout instead of hanging the suite (no claim about speed).
    fn load_within(
        plan: ExecPlan,
        limit: std::time::Duration,
    ) -> Result<Vec<(String, String)>, ExecError> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(plan.load());
        });
        rx.recv_timeout(limit)
            .expect("load did not return: the value file is being read to its end")
    }

    #[rstest::rstest]
    #[case::dev_zero("/dev/zero", "a character device")]
    #[case::directory("/", "a directory")]
    fn a_value_file_that_is_not_a_regular_file_is_refused_naming_it(
        #[case] file: &str,
        #[case] kind: &str,
    ) {
        let plan = ExecPlan {
            vars: BTreeMap::from([("DB".to_owned(), PathBuf::from(file))]),
        };
        let e = load_within(plan, std::time::Duration::from_secs(60)).unwrap_err();
        assert!(matches!(e, ExecError::NotAFile { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains(file) && m.contains("DB") && m.contains(kind),
            "{m}"
        );
    }

    #[test]
    fn a_fifo_as_a_value_file_is_refused_without_waiting_for_a_writer() {
        let dir = std::env::temp_dir().join(format!("podmutator-exec-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("value");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let plan = ExecPlan {
            vars: BTreeMap::from([("DB".to_owned(), fifo.clone())]),
        };
        let e = load_within(plan, std::time::Duration::from_secs(60)).unwrap_err();
        assert!(
            matches!(e, ExecError::NotAFile { kind: "a FIFO", .. }),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_huge_value_file_is_refused_after_reading_one_byte_past_the_limit() {
        let dir = std::env::temp_dir().join(format!("podmutator-exec-huge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A sparse terabyte: read to its end, it would take hours and all the memory.
        let huge = dir.join("value");
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let plan = ExecPlan {
            vars: BTreeMap::from([("DB".to_owned(), huge.clone())]),
        };
        let e = load_within(plan, std::time::Duration::from_secs(60)).unwrap_err();
        assert!(matches!(e, ExecError::TooLong { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains(&huge.display().to_string()) && m.contains(&MAX_ENV_STRING.to_string()),
            "{m}"
        );
        // The bound itself: at the limit the value is read whole, one byte more is refused.
        let at = dir.join("at");
        std::fs::write(&at, vec![b'x'; 100]).unwrap();
        assert_eq!(
            read_bounded(&at, 100).unwrap(),
            Bounded::Within(vec![b'x'; 100])
        );
        assert_eq!(read_bounded(&at, 99).unwrap(), Bounded::Over);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
