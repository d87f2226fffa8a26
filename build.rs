//! Records the commit a binary is built from, for `podmutator version`: `PODMUTATOR_COMMIT` when
//! set (a build from a source archive, which has no Git metadata), else `git rev-parse HEAD` of
//! this checkout, else "unknown". Only the commit is read, so the build stays reproducible.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PODMUTATOR_COMMIT");
    // A new commit (HEAD moves, or the branch it names does) is a new answer.
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("PODMUTATOR_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PODMUTATOR_COMMIT={commit}");
}
