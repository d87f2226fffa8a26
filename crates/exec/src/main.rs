//! The program a pod copies. The fetch init container puts it where the webhook's patch runs
//! the wrapper (`/podmutator/bin/podmutator exec -- <command> [args...]`), so it answers to the
//! same `exec` word, with the same messages and exit codes, as the full `podmutator` binary.

use std::process::ExitCode;

const USAGE: &str = "usage: podmutator exec -- <command> [args...]\n\n\
    Sets the environment variables that PODMUTATOR_EXEC_ENV maps to files, then replaces itself \
    with the command.\nThis is podmutator's in-pod exec wrapper; the webhook, fetch and the other \
    commands are in the full podmutator binary.";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1).peekable();
    let first = args.peek().map(|a| a.to_string_lossy().into_owned());
    match first.as_deref() {
        Some("exec") => {
            args.next();
        }
        // `podmutator-exec -- <command>`, run by its own name.
        Some("--") => {}
        Some("--version" | "-V") => {
            println!("podmutator-exec {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("podmutator: `{other}` is not a command of the exec wrapper\n\n{USAGE}");
            return ExitCode::from(2);
        }
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    }
    let Err(err) = podmutator_exec::run_exec(args);
    // Each message names its cause itself (`ExecError` has no source): the full binary's
    // chain of sources prints the same line.
    eprintln!("podmutator: exec failed: {err}");
    ExitCode::FAILURE
}
