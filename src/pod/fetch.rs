//! `podmutator fetch`: the init container of reference delivery. Fetches every secret of its
//! plan with the pod's own AWS identity in one round trip (parallel `GetSecretValue` calls, or
//! `BatchGetSecretValue` calls of up to 20 ids, as the plan's `fetchStrategy` says) and writes
//! each to a file, mode 0400, on an in-memory volume.
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

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::ffi::{OsStr, OsString};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use aws_sdk_secretsmanager::Client;

use podmutator_aws::secretsmanager::{AwsSource, aws_client};
use podmutator_core::config::FetchStrategy;
use podmutator_core::secrets::source::{Lookup, MAX_BATCH, SecretSource};

use podmutator_core::pod::plan::*;

/// Fetches every secret of `plan` through `client` in one round trip: `parallel`, one
/// `GetSecretValue` per id, up to [`MAX_IN_FLIGHT`] at once; `batch` (or no strategy),
/// `BatchGetSecretValue` with up to 20 ids a call, the calls in parallel; `hybrid` batches, as
/// a pod's one fetch is always its first. Then writes the files and copies the executable.
/// Writes nothing unless every secret was found.
pub async fn fetch(plan: &FetchPlan, client: Client) -> Result<FetchSummary, FetchError> {
    let ids = plan.ids();
    let source = AwsSource::new(client, MAX_BATCH)
        .with_strategy(plan.fetch_strategy.unwrap_or(FetchStrategy::Batch))
        .with_limits(MAX_IN_FLIGHT, MAX_IN_FLIGHT);
    let fetched = tokio::time::timeout(FETCH_BUDGET, source.fetch_many(&ids))
        .await
        .map_err(|_| FetchError::Timeout {
            ids: ids.join(", "),
        })??;
    let mut values = BTreeMap::new();
    let mut missing = Vec::new();
    for id in &ids {
        match fetched.values.get(id) {
            Some(Lookup::Found(v)) => {
                values.insert(id.as_str(), v.bytes().unwrap_or_default().to_vec());
            }
            _ => missing.push(id.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(FetchError::NotFound(missing));
    }
    let copied = write_files(plan, &values)?;
    Ok(FetchSummary {
        secrets: ids.len(),
        files: plan.secrets.len(),
        calls: fetched.backend_calls,
        copied,
    })
}

/// `podmutator fetch`: reads the plan from [`FETCH_PLAN_ENV`], builds a client from the SDK's
/// default chain (EKS Pod Identity, IRSA, environment; `AWS_ENDPOINT_URL` for emulators) and
/// runs [`fetch`].
pub fn run_fetch() -> Result<FetchSummary, FetchError> {
    let json = std::env::var(FETCH_PLAN_ENV).map_err(|_| FetchError::NoPlan)?;
    let plan = FetchPlan::parse(&json)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(FetchError::Runtime)?;
    runtime.block_on(async {
        let client = aws_client(plan.region.as_deref().unwrap_or(""), FETCH_BUDGET).await;
        fetch(&plan, client).await
    })
}

/// Writes every file of `plan` from `values` (by id), all or nothing: each goes to a temporary
/// file beside its target first, and only when all are written are they renamed into place;
/// then the exec wrapper is copied, if the plan asks for it. Nothing below the root is reached
/// through a symbolic link ([`Dir`]).
pub fn write_files(
    plan: &FetchPlan,
    values: &BTreeMap<&str, Vec<u8>>,
) -> Result<Option<Copied>, FetchError> {
    let root = Dir::root(&plan.root).map_err(|_| FetchError::NoRoot {
        root: plan.root.display().to_string(),
    })?;
    let mut dirs = Dirs::from([(PathBuf::new(), Rc::new(root))]);
    // Each secret's file under its temporary name, recorded (with the directory it is in, the
    // name to rename it to and its path) so that a failure can remove what was written.
    let mut staged = Vec::new();
    let result = plan.secrets.iter().try_for_each(|item| {
        let bytes = values.get(item.id.as_str()).map_or(&[][..], Vec::as_slice);
        let err = |source| FetchError::Write {
            path: item.file.display().to_string(),
            source,
        };
        let (file_mode, dir_mode) = plan.modes();
        let (dir, name) = parent_of(&mut dirs, &item.file, dir_mode).map_err(err)?;
        let tmp = temp_name(&name);
        write_new(&dir, &tmp, bytes, file_mode).map_err(err)?;
        staged.push((dir, tmp, name, &item.file));
        Ok(())
    });
    if let Err(e) = result {
        for (dir, tmp, ..) in &staged {
            let _ = std::fs::remove_file(dir.at(tmp));
        }
        return Err(e);
    }
    for (dir, tmp, name, dest) in &staged {
        std::fs::rename(dir.at(tmp), dir.at(name)).map_err(|source| FetchError::Write {
            path: dest.display().to_string(),
            source,
        })?;
    }
    match &plan.copy_executable_to {
        Some(to) => copy_executable(&mut dirs, to).map(Some),
        None => Ok(None),
    }
}

/// Copies the program `exec` runs from to `to`: [`EXEC_WRAPPER`] beside this executable, or
/// this executable (which answers `exec` the same way) in an image without the wrapper.
fn copy_executable(dirs: &mut Dirs, to: &Path) -> Result<Copied, FetchError> {
    let err = |source| FetchError::Copy {
        path: to.display().to_string(),
        source,
    };
    let me = std::env::current_exe().map_err(err)?;
    let beside = me.with_file_name(EXEC_WRAPPER);
    let wrapper = beside.is_file();
    let bytes = std::fs::read(if wrapper { &beside } else { &me }).map_err(err)?;
    // Directories on the way must be searchable by every user that runs the copy.
    let (dir, name) = parent_of(dirs, to, EXECUTABLE_MODE | 0o200).map_err(err)?;
    let tmp = temp_name(&name);
    write_new(&dir, &tmp, &bytes, EXECUTABLE_MODE).map_err(err)?;
    std::fs::rename(dir.at(&tmp), dir.at(&name)).map_err(err)?;
    Ok(Copied {
        wrapper,
        bytes: bytes.len() as u64,
    })
}

/// `.<name>.podmutator-tmp`: in the same directory as `name`, so the rename is atomic.
fn temp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(".podmutator-tmp");
    tmp
}

/// A directory held open; the names below it are resolved from it, not from a path.
///
/// Why: a symbolic link below the plan's root (left in the volume by another container of the
/// pod) must not take a secret, or this executable, anywhere else. Checking each component
/// with `symlink_metadata` and then writing by path would leave a window in which a checked
/// directory is swapped for a link; opening each component from the one before, with
/// `O_NOFOLLOW | O_DIRECTORY`, leaves none. std has no `openat`, so a name is resolved
/// through `/proc/self/fd/<fd>/<name>`: the kernel jumps to the open directory itself, then
/// looks the one name up in it, which is what `openat` does (and keeps `unsafe` out).
struct Dir {
    file: std::fs::File,
    /// The path it was reached by, for messages.
    shown: PathBuf,
}

impl Dir {
    /// The plan's root, following links: it is the volume's mount point, which the pod spec
    /// places; what must not redirect a write is a link inside the volume.
    fn root(root: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)?;
        Ok(Self {
            file,
            shown: root.to_owned(),
        })
    }

    /// `name` in this directory, as a path that resolves from the open directory.
    fn at(&self, name: &OsStr) -> PathBuf {
        let mut path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        path.push(name);
        path
    }

    /// The directory `name` in this one, created with `mode` if it is missing. A symbolic
    /// link there is refused, never followed.
    fn subdir(&self, name: &OsStr, mode: u32) -> std::io::Result<Self> {
        let shown = self.shown.join(name);
        // A link there also exists; the open below refuses it.
        if let Err(e) = std::fs::DirBuilder::new().mode(mode).create(self.at(name))
            && e.kind() != ErrorKind::AlreadyExists
        {
            return Err(e);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.at(name))
            .map_err(|e| refuse_link(e, &self.at(name), &shown))?;
        Ok(Self { file, shown })
    }
}

/// Names a refused link: `O_NOFOLLOW` on a symbolic link fails with `ELOOP`, or `ENOTDIR`
/// with `O_DIRECTORY` too, neither of which says what happened here. The refusal is made by
/// the open; `at` is looked at again only to word the message.
fn refuse_link(e: std::io::Error, at: &Path, shown: &Path) -> std::io::Error {
    let refused = matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR));
    if refused && std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_symlink()) {
        std::io::Error::other(format!(
            "{} is a symbolic link: nothing below the plan's root is written through a link; remove it, or mount an empty volume",
            shown.display()
        ))
    } else {
        e
    }
}

/// The directories opened while writing one plan, by their path below the root: each is
/// opened (and created) once.
type Dirs = BTreeMap<PathBuf, Rc<Dir>>;

/// The open directory that holds `file` (below the root, as the plan was validated), with the
/// missing directories on the way created with `mode`, and the file's name in it.
fn parent_of(dirs: &mut Dirs, file: &Path, mode: u32) -> std::io::Result<(Rc<Dir>, OsString)> {
    let mut at = PathBuf::new();
    let mut dir = Rc::clone(&dirs[&at]);
    let invalid = || std::io::Error::other("the path is not below the plan's root");
    let rel = file.strip_prefix(&dir.shown).map_err(|_| invalid())?;
    let name = rel.file_name().ok_or_else(invalid)?.to_owned();
    for part in rel.parent().into_iter().flat_map(Path::iter) {
        at.push(part);
        dir = match dirs.entry(at.clone()) {
            Entry::Occupied(open) => Rc::clone(open.get()),
            Entry::Vacant(slot) => Rc::clone(slot.insert(Rc::new(dir.subdir(part, mode)?))),
        };
    }
    Ok((dir, name))
}

/// Writes `bytes` to a fresh `tmp` in `dir` with `mode`.
fn write_new(dir: &Dir, tmp: &OsStr, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    // A temporary file left by a run that died is ours to replace (unlink removes a link
    // itself, never its target).
    if let Err(e) = std::fs::remove_file(dir.at(tmp))
        && e.kind() != ErrorKind::NotFound
    {
        return Err(e);
    }
    // `create_new` (O_EXCL) refuses a link in the name's place as well.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.at(tmp))?;
    // The process umask may have narrowed `mode`; the contract is the mode itself. Set on
    // the open file, not through a path.
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)));
    if written.is_err() {
        // Part of a value must not stay on the node (a full volume, a file size limit).
        let _ = std::fs::remove_file(dir.at(tmp));
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn nothing_is_written_when_one_file_cannot_be() {
        let root =
            std::env::temp_dir().join(format!("podmutator-fetch-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("blocked")).unwrap();
        // A directory where a file must go: the second write fails after the first succeeded.
        std::fs::create_dir_all(root.join("blocked/.b.podmutator-tmp")).unwrap();
        let p = FetchPlan {
            root: root.clone(),
            region: None,
            secrets: vec![
                FetchItem {
                    id: "a".into(),
                    file: root.join("a"),
                },
                FetchItem {
                    id: "b".into(),
                    file: root.join("blocked/b"),
                },
            ],
            copy_executable_to: None,
            fetch_strategy: None,
            readable_by_all: false,
        };
        let values = BTreeMap::from([("a", b"fake-a".to_vec()), ("b", b"fake-b".to_vec())]);
        let e = write_files(&p, &values).unwrap_err();
        assert!(e.to_string().contains("blocked/b"), "{e}");
        assert!(!root.join("a").exists(), "a was written although b failed");
        assert!(
            !root.join(".a.podmutator-tmp").exists(),
            "a's temporary file was left"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A write that fails midway (here the file size limit, `ulimit -f`, with SIGXFSZ
    /// ignored so the write returns EFBIG) leaves no part of the value behind. The test runs
    /// itself again in a shell that sets the limit, which would otherwise hold for every test.
    #[test]
    fn a_write_that_fails_midway_leaves_no_part_of_the_value() {
        const CHILD: &str = "PODMUTATOR_FETCH_TEST_UNDER_FSIZE_LIMIT";
        let name = "pod::fetch::tests::a_write_that_fails_midway_leaves_no_part_of_the_value";
        let Some(root) = std::env::var_os(CHILD).map(PathBuf::from) else {
            let root =
                std::env::temp_dir().join(format!("podmutator-fetch-efbig-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            let out = std::process::Command::new("sh")
                .args(["-c", "trap '' XFSZ; ulimit -f 64; exec \"$0\" \"$@\""])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", name, "--nocapture", "--test-threads=1"])
                .env(CHILD, &root)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::remove_dir_all(&root).unwrap();
            return;
        };
        // 64 blocks is at most 64 KiB: a 1 MiB value cannot be written whole.
        let values = BTreeMap::from([("a", vec![b'v'; 1 << 20])]);
        let e = write_files(&one_file(&root, false), &values).unwrap_err();
        assert!(e.to_string().contains("files/db"), "{e}");
        assert_eq!(entries(&root.join("files")), Vec::<String>::new());
    }

    /// A plan of one secret at `root/files/db`, and one copy of this executable at
    /// `root/bin/podmutator` when `exe`.
    fn one_file(root: &Path, exe: bool) -> FetchPlan {
        FetchPlan {
            root: root.to_owned(),
            region: None,
            secrets: vec![FetchItem {
                id: "a".into(),
                file: root.join("files/db"),
            }],
            copy_executable_to: exe.then(|| root.join("bin/podmutator")),
            fetch_strategy: None,
            readable_by_all: false,
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[rstest::rstest]
    #[case::secret_directory("files", false)]
    #[case::executable_directory("bin", true)]
    fn a_symlinked_directory_below_the_root_is_refused_and_its_target_untouched(
        #[case] linked: &str,
        #[case] exe: bool,
    ) {
        let base = std::env::temp_dir().join(format!(
            "podmutator-fetch-link-{linked}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let target = base.join("elsewhere");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join(linked)).unwrap();
        let values = BTreeMap::from([("a", b"fake-a".to_vec())]);
        let e = write_files(&one_file(&root, exe), &values).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("symbolic link"), "{m}");
        assert!(m.contains(&root.join(linked).display().to_string()), "{m}");
        assert_eq!(
            entries(&target),
            Vec::<String>::new(),
            "written through the link"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_symlinked_directory_deeper_below_the_root_is_refused_too() {
        let base =
            std::env::temp_dir().join(format!("podmutator-fetch-deep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let target = base.join("elsewhere");
        std::fs::create_dir_all(root.join("files")).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join("files/team")).unwrap();
        let mut plan = one_file(&root, false);
        plan.secrets[0].file = root.join("files/team/db");
        let values = BTreeMap::from([("a", b"fake-a".to_vec())]);
        let e = write_files(&plan, &values).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(entries(&target), Vec::<String>::new());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn files_are_written_below_a_linked_mount_point_and_replace_a_link_in_their_place() {
        let base =
            std::env::temp_dir().join(format!("podmutator-fetch-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        // The root itself may be reached through a link: it is the mount point, not the volume.
        let real = base.join("volume");
        std::fs::create_dir_all(&real).unwrap();
        let root = base.join("mount");
        std::os::unix::fs::symlink(&real, &root).unwrap();
        // A link in the file's own place is replaced, not written through.
        std::fs::create_dir_all(real.join("files")).unwrap();
        let decoy = base.join("decoy");
        std::fs::write(&decoy, "untouched").unwrap();
        std::os::unix::fs::symlink(&decoy, real.join("files/db")).unwrap();
        let values = BTreeMap::from([("a", b"fake-a".to_vec())]);
        write_files(&one_file(&root, false), &values).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::read(real.join("files/db")).unwrap(), b"fake-a");
        assert_eq!(mode(&real.join("files/db")), FILE_MODE);
        assert_eq!(std::fs::read_to_string(&decoy).unwrap(), "untouched");
        assert_eq!(entries(&real), vec!["files"]);
        assert_eq!(entries(&real.join("files")), vec!["db"]);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
