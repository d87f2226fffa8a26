//! The fetch plan: what the webhook writes into [`FETCH_PLAN_ENV`] for the `podmutator fetch`
//! init container of reference delivery, and the checks both sides apply to it. The fetcher
//! itself (AWS calls, files) lives in the `podmutator` binary.
//!
//! The plan is JSON in [`FETCH_PLAN_ENV`] ([`FetchPlan`]):
//!
//! ```json
//! {"root": "/podmutator",
//!  "region": "us-east-1",
//!  "secrets": [{"id": "u__org__o__domain__d__project__p__key__db", "file": "/podmutator/files/db"}],
//!  "copyExecutableTo": "/podmutator/bin/podmutator",
//!  "fetchStrategy": "parallel"}
//! ```
//!
//! Nothing is written unless every secret was fetched: the pod cannot start on a partial set
//! anyway (the init container exits non-zero and the pod stays in Init), and writing nothing
//! means no value of a failed pod lingers on the node, and a re-run never mixes old and new
//! files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::path_problem;
use crate::config::FetchStrategy;
use crate::secrets::source::{MAX_BATCH, SourceError};

/// The environment variable holding the init container's [`FetchPlan`] as JSON.
pub const FETCH_PLAN_ENV: &str = "PODMUTATOR_FETCH_PLAN";
/// Secret files: readable by their owner only (the init container must run as the user of the
/// containers that read them; the volume is mounted read-only there).
pub const FILE_MODE: u32 = 0o400;
/// Secret files of a plan [`FetchPlan::readable_by_all`]: as a Secret volume's files are.
pub const SHARED_FILE_MODE: u32 = 0o444;
/// Directories of a plan [`FetchPlan::readable_by_all`].
pub const SHARED_DIR_MODE: u32 = 0o755;
/// Directories the fetcher creates. Writable by the owner so that a re-run of the init container
/// (after a pod sandbox restart) can replace the files; the task containers mount the volume
/// read-only, so the write bit grants them nothing.
pub const DIR_MODE: u32 = 0o700;
/// The copied executable and its directories: any user of the pod may run it, as the wrapped
/// containers may run as another user than the init container. It holds no secret.
pub const EXECUTABLE_MODE: u32 = 0o555;
/// Calls one fetch has in flight at most: a pod's secrets up to this many go in one round trip
/// (the same as one `BatchGetSecretValue` call holds).
pub const MAX_IN_FLIGHT: usize = MAX_BATCH;
/// The whole fetch, credentials included. Far below what a pod waits for its init containers;
/// a failed attempt is retried by the kubelet with back-off, visibly.
pub const FETCH_BUDGET: Duration = Duration::from_secs(20);

/// What the init container fetches and where it writes it. The webhook writes this; it is
/// validated as untrusted input (whoever may create pods can write it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchPlan {
    /// The volume's mount point in the init container; every path of the plan is below it.
    pub root: PathBuf,
    /// The Secrets Manager region; absent: the SDK's default chain (`AWS_REGION`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub secrets: Vec<FetchItem>,
    /// Where to copy the exec wrapper ([`EXEC_WRAPPER`]), for containers wrapped with
    /// `podmutator exec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_executable_to: Option<PathBuf>,
    /// How the secrets are asked for: the webhook copies `embedded.fetchStrategy` here, because
    /// a burst of pods draws on the same account quota as a burst of admissions
    /// (`BatchGetSecretValue` 100 calls a second, `GetSecretValue` 10,000; docs/scale.md).
    /// Absent (plans written before the field existed): `batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_strategy: Option<FetchStrategy>,
    /// The files readable by every user ([`SHARED_FILE_MODE`]), as a Secret volume's are,
    /// rather than by the fetcher's user alone: set when the webhook cannot run the fetcher as
    /// the user of every container of the pod, because a container (or the fetcher) runs as its
    /// image's user, which the pod spec does not name (flytekit's images: `USER flytekit`).
    /// The volume is mounted only in the pod's own containers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readable_by_all: bool,
}

/// One secret to one file. The same id may go to several files (a secret requested both as a
/// file and as an env var); it is fetched once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchItem {
    /// The secret's resolved name or ARN.
    pub id: String,
    /// Absolute path below `root`.
    pub file: PathBuf,
}

/// Why the fetch failed. Names secret ids and paths, never values.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "{FETCH_PLAN_ENV} is not set: `podmutator fetch` runs as the init container the webhook adds, which sets it"
    )]
    NoPlan,
    #[error("{FETCH_PLAN_ENV} is not a valid fetch plan: {0}")]
    BadPlan(String),
    #[error(
        "secret {} not found in AWS Secrets Manager: the webhook resolved it at admission; if it was deleted or renamed since, recreate it, or delete the pod so that it is resolved again",
        .0.join(", ")
    )]
    NotFound(Vec<String>),
    #[error(
        "{0} (check the pod's IAM role allows secretsmanager:BatchGetSecretValue and GetSecretValue on it)"
    )]
    Source(#[from] SourceError),
    #[error(
        "fetching secret {ids} took more than {}s: check the pod's route to Secrets Manager (VPC endpoint, proxy) and its AWS identity (EKS Pod Identity association or IRSA)",
        FETCH_BUDGET.as_secs()
    )]
    Timeout { ids: String },
    #[error(
        "{root} is not a directory: mount the secrets volume there (the plan's root) before fetching"
    )]
    NoRoot { root: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot copy the exec wrapper to {path}: {source}")]
    Copy {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// What a fetch did, for its one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchSummary {
    pub secrets: usize,
    pub files: usize,
    pub calls: u32,
    /// What was copied for `exec`, if the plan asked for a copy.
    pub copied: Option<Copied>,
}

/// The program copied to `copyExecutableTo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// [`EXEC_WRAPPER`] (true), or this whole executable where the image has no wrapper.
    pub wrapper: bool,
    pub bytes: u64,
}

/// The exec wrapper's file name, beside this executable in the fetcher image. The copy lands
/// on the pod's memory-backed volume, counted against the pod's memory limit, so the copy is
/// the small wrapper (std and serde_json) rather than this binary, when the image has it.
pub const EXEC_WRAPPER: &str = "podmutator-exec";

/// Secrets Manager's name alphabet; an ARN adds `:`. The API's limits: a name of 1-512
/// characters, an ARN of at most 2048.
fn secret_id_problem(id: &str) -> Option<String> {
    let is_arn = id.starts_with("arn:");
    let (max, extra) = if is_arn { (2048, ":") } else { (512, "") };
    let ok = !id.is_empty()
        && id.len() <= max
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_+=.@-".contains(c) || extra.contains(c));
    if !ok {
        return Some(format!(
            "secret id {id:?} must be a Secrets Manager name (1-512 letters, digits and /_+=.@-) or ARN"
        ));
    }
    if is_arn && !id.contains(":secretsmanager:") {
        return Some(format!("secret id {id:?} is not a Secrets Manager ARN"));
    }
    None
}

impl FetchPlan {
    /// The modes of the files and of the directories this plan writes.
    pub fn modes(&self) -> (u32, u32) {
        if self.readable_by_all {
            (SHARED_FILE_MODE, SHARED_DIR_MODE)
        } else {
            (FILE_MODE, DIR_MODE)
        }
    }

    /// Parses and validates a plan, naming the field or entry at fault.
    pub fn parse(json: &str) -> Result<Self, FetchError> {
        let de = &mut serde_json::Deserializer::from_str(json);
        let plan: FetchPlan = serde_path_to_error::deserialize(de)
            .map_err(|e| FetchError::BadPlan(format!("at {}: {}", e.path(), e.inner())))?;
        plan.validate()?;
        Ok(plan)
    }

    /// The plan as JSON for [`FETCH_PLAN_ENV`], after the same validation the fetcher applies.
    pub fn to_json(&self) -> Result<String, FetchError> {
        self.validate()?;
        serde_json::to_string(self).map_err(|e| FetchError::BadPlan(e.to_string()))
    }

    /// Every path absolute, clean and strictly below `root`; no file twice, and no file where
    /// another needs a directory; every id a Secrets Manager name or ARN.
    pub fn validate(&self) -> Result<(), FetchError> {
        let bad = |m: String| Err(FetchError::BadPlan(m));
        if let Some(p) = path_problem(&self.root) {
            return bad(format!("root: {p}"));
        }
        if self.secrets.is_empty() {
            return bad(
                "secrets: the list is empty; a pod with nothing to fetch needs no fetcher".into(),
            );
        }
        if let Some(region) = &self.region
            && (region.is_empty()
                || !region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            return bad(format!(
                "region {region:?} is not an AWS region name such as us-east-1"
            ));
        }
        let mut files: Vec<&Path> = Vec::new();
        for (i, item) in self.secrets.iter().enumerate() {
            if let Some(p) = secret_id_problem(&item.id) {
                return bad(format!("secrets[{i}]: {p}"));
            }
            self.check_below_root(&format!("secrets[{i}].file"), &item.file)?;
            files.push(&item.file);
        }
        if let Some(exe) = &self.copy_executable_to {
            self.check_below_root("copyExecutableTo", exe)?;
            files.push(exe);
        }
        for (i, a) in files.iter().enumerate() {
            for b in &files[i + 1..] {
                if a == b {
                    return bad(format!("{} is written twice", a.display()));
                }
                let (short, long) = if a.starts_with(b) { (b, a) } else { (a, b) };
                if long.starts_with(short) {
                    return bad(format!(
                        "{} is a file, so it cannot hold {}",
                        short.display(),
                        long.display()
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_below_root(&self, field: &str, path: &Path) -> Result<(), FetchError> {
        if let Some(p) = path_problem(path) {
            return Err(FetchError::BadPlan(format!("{field}: {p}")));
        }
        if path == self.root || !path.starts_with(&self.root) {
            return Err(FetchError::BadPlan(format!(
                "{field}: {} is not below the root {}",
                path.display(),
                self.root.display()
            )));
        }
        Ok(())
    }

    /// The distinct ids, in plan order: each is fetched once.
    pub fn ids(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        let ids = self.secrets.iter().map(|item| &item.id);
        ids.filter(|id| seen.insert(*id)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: serde_json::Value) -> Result<FetchPlan, FetchError> {
        FetchPlan::parse(&json.to_string())
    }

    fn problem(json: serde_json::Value) -> String {
        match plan(json) {
            Err(FetchError::BadPlan(m)) => m,
            other => panic!("expected a bad plan, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_plan_round_trips_and_fetches_each_id_once() {
        let p = plan(serde_json::json!({
            "root": "/podmutator",
            "region": "eu-west-1",
            "secrets": [
                {"id": "u__org__o__domain__d__project__p__key__db", "file": "/podmutator/files/db"},
                {"id": "u__org__o__domain__d__project__p__key__db", "file": "/podmutator/env/0"},
                {"id": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:api-AbCdEf", "file": "/podmutator/env/1"}
            ],
            "copyExecutableTo": "/podmutator/bin/podmutator"
        }))
        .unwrap();
        assert_eq!(p.ids().len(), 2);
        assert_eq!(FetchPlan::parse(&p.to_json().unwrap()).unwrap(), p);
    }

    #[rstest::rstest]
    #[case::unknown_field(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r/a", "mode": 1}]}), "secrets[0]")]
    #[case::no_secrets(serde_json::json!({"root": "/r", "secrets": []}), "empty")]
    #[case::relative_root(serde_json::json!({"root": "r", "secrets": [{"id": "a", "file": "/r/a"}]}), "root")]
    #[case::outside_root(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/etc/a"}]}), "not below the root")]
    #[case::the_root_itself(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r"}]}), "not below the root")]
    #[case::sibling_prefix(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/rr/a"}]}), "not below the root")]
    #[case::escape(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r/../etc/a"}]}), "secrets[0].file")]
    #[case::twice(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r/a"}, {"id": "b", "file": "/r/a"}]}), "written twice")]
    #[case::file_as_dir(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r/a"}, {"id": "b", "file": "/r/a/b"}]}), "cannot hold")]
    #[case::bad_id(serde_json::json!({"root": "/r", "secrets": [{"id": "a b", "file": "/r/a"}]}), "secrets[0]: secret id")]
    #[case::not_secrets_manager(serde_json::json!({"root": "/r", "secrets": [{"id": "arn:aws:s3:::bucket", "file": "/r/a"}]}), "not a Secrets Manager ARN")]
    #[case::bad_region(serde_json::json!({"root": "/r", "region": "US East", "secrets": [{"id": "a", "file": "/r/a"}]}), "region")]
    #[case::executable_outside(serde_json::json!({"root": "/r", "secrets": [{"id": "a", "file": "/r/a"}], "copyExecutableTo": "/bin/sh"}), "copyExecutableTo")]
    fn bad_plans_are_refused_naming_the_entry(#[case] json: serde_json::Value, #[case] want: &str) {
        let m = problem(json);
        assert!(m.contains(want), "{m:?} should contain {want:?}");
    }
}
