//! `scripts/release.sh` without its four release builds: the artefact names, the checks it runs
//! on each artefact, `SHA256SUMS`, and the Terraform input it prints. Its `--from` mode packages
//! builds already made; here the `podmutator` this test run built stands in for the x86_64
//! builds (a real zip, made by `zip`, of a real binary that answers `--version`), and its checks
//! must refuse what a release must not ship. The builds themselves are `cargo lambda build`
//! (covered by `sam-build-check.sh` and `bench-size.sh`) and `scripts/pod-image.sh`; `--image`'s
//! build and push run against a stand-in `docker`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use common::*;
use rstest::rstest;
use sha2::{Digest, Sha256};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn release(args: &[&str], arches: &str) -> Output {
    Command::new(root().join("scripts/release.sh"))
        .args(args)
        .env("ARCHES", arches)
        .output()
        .expect("scripts/release.sh runs")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The layout the builds leave (`lambda/<arch>/podmutator/bootstrap.zip`,
/// `pod-image/<arch>/{podmutator,podmutator-exec}/bootstrap`), with this test run's binaries in
/// every slot of `arches`; `extra` is added to each zip beside `bootstrap`.
fn builds(arches: &[&str], extra: Option<&str>) -> PathBuf {
    let from = temp_dir("release-from");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_podmutator"));
    for arch in arches {
        let lambda = from.join("lambda").join(arch).join("podmutator");
        std::fs::create_dir_all(&lambda).unwrap();
        let staged = lambda.join("bootstrap");
        std::fs::copy(&binary, &staged).unwrap();
        // Stored, not compressed: the debug binary is large and the bytes are all that matter.
        let mut zip = Command::new("zip");
        zip.arg("-jqX0")
            .arg(lambda.join("bootstrap.zip"))
            .arg(&staged);
        if let Some(name) = extra {
            let path = lambda.join(name);
            std::fs::write(&path, b"not part of a release\n").unwrap();
            zip.arg(path);
        }
        let status = zip
            .status()
            .expect("`zip` is needed to build the test's zips (apt-get install zip)");
        assert!(status.success(), "zip failed");
        std::fs::remove_file(&staged).unwrap();
        let pod = from.join("pod-image").join(arch).join("podmutator");
        std::fs::create_dir_all(&pod).unwrap();
        std::fs::copy(&binary, pod.join("bootstrap")).unwrap();
        let wrapper = from.join("pod-image").join(arch).join("podmutator-exec");
        std::fs::create_dir_all(&wrapper).unwrap();
        std::fs::copy(exec_wrapper(), wrapper.join("bootstrap")).unwrap();
    }
    from
}

#[test]
fn a_dry_run_names_every_artefact_by_the_crate_version_and_writes_nothing() {
    let out_dir = temp_dir("release-dry");
    let out = release(
        &["--dry-run", "--out", out_dir.to_str().unwrap()],
        "arm64 x86_64",
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        stdout.starts_with(&format!("version {VERSION}\n")),
        "{}",
        text(&out)
    );
    let artefacts: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("artefact: "))
        .collect();
    let expected: Vec<String> = [
        format!("podmutator-{VERSION}-lambda-arm64.zip"),
        format!("podmutator-{VERSION}-linux-arm64"),
        format!("podmutator-exec-{VERSION}-linux-arm64"),
        format!("podmutator-{VERSION}-lambda-x86_64.zip"),
        format!("podmutator-{VERSION}-linux-x86_64"),
        format!("podmutator-exec-{VERSION}-linux-x86_64"),
        "SHA256SUMS".to_owned(),
    ]
    .iter()
    .map(|n| out_dir.join(n).display().to_string())
    .collect();
    assert_eq!(artefacts, expected, "{}", text(&out));
    // One Lambda build per architecture with cargo-lambda's flag for it, then the pod image's.
    let builds: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("build: "))
        .collect();
    assert_eq!(builds.len(), 3, "{}", text(&out));
    assert!(builds[0].contains(" --arm64 ") && builds[0].contains("--output-format zip"));
    assert!(builds[1].contains(" --x86-64 ") && builds[1].contains("--output-format zip"));
    assert!(builds[2].ends_with("scripts/pod-image.sh"), "{}", builds[2]);
    assert!(names_in(&out_dir).is_empty(), "a dry run wrote files");
}

#[test]
fn packaged_artefacts_are_named_by_version_and_sha256sums_lists_each_once() {
    let from = builds(&["x86_64"], None);
    let out_dir = temp_dir("release-out");
    // An earlier release's leftovers: dist/ holds one release, which SHA256SUMS describes.
    std::fs::write(out_dir.join("podmutator-0.0.9-lambda-x86_64.zip"), b"old").unwrap();
    std::fs::write(out_dir.join("SHA256SUMS"), b"stale\n").unwrap();

    let out = release(
        &[
            "--from",
            from.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ],
        "x86_64",
    );
    assert!(out.status.success(), "{}", text(&out));

    let zip_name = format!("podmutator-{VERSION}-lambda-x86_64.zip");
    let bin_name = format!("podmutator-{VERSION}-linux-x86_64");
    let exec_name = format!("podmutator-exec-{VERSION}-linux-x86_64");
    let mut expected = vec![
        "SHA256SUMS".to_owned(),
        zip_name.clone(),
        bin_name.clone(),
        exec_name.clone(),
    ];
    expected.sort();
    assert_eq!(names_in(&out_dir), expected);

    // The artefacts are the builds, byte for byte; the binary stays executable.
    let zip = std::fs::read(out_dir.join(&zip_name)).unwrap();
    let source_zip = from.join("lambda/x86_64/podmutator/bootstrap.zip");
    // Compared by hash: a failure then prints two lines, not the bytes.
    assert_eq!(
        sha256_hex(&zip),
        sha256_hex(&std::fs::read(&source_zip).unwrap()),
        "the zip is not the build's"
    );
    let bin = std::fs::read(out_dir.join(&bin_name)).unwrap();
    assert_eq!(
        sha256_hex(&bin),
        sha256_hex(&std::fs::read(env!("CARGO_BIN_EXE_podmutator")).unwrap()),
        "the pod binary is not the build's"
    );
    let mode = std::fs::metadata(out_dir.join(&bin_name))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "mode {mode:o}");

    // `sha256sum -c` format: 64 lowercase hex digits, two spaces, the file name; sorted by
    // name; each artefact once, its hash recomputed here.
    let sums = std::fs::read_to_string(out_dir.join("SHA256SUMS")).unwrap();
    let line = regex::Regex::new(r"^([0-9a-f]{64})  (\S+)$").unwrap();
    let mut listed = Vec::new();
    for l in sums.lines() {
        let caps = line
            .captures(l)
            .unwrap_or_else(|| panic!("SHA256SUMS line {l:?} is not `<sha256>  <name>`"));
        let name = caps[2].to_owned();
        let bytes = std::fs::read(out_dir.join(&name)).unwrap();
        assert_eq!(&caps[1], sha256_hex(&bytes), "{name}");
        listed.push(name);
    }
    assert!(sums.ends_with('\n'));
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "not sorted by name");
    let wrapper = std::fs::read(out_dir.join(&exec_name)).unwrap();
    assert_eq!(
        sha256_hex(&wrapper),
        sha256_hex(&std::fs::read(exec_wrapper()).unwrap()),
        "the exec wrapper is not the build's"
    );
    let mut artefacts = vec![zip_name.clone(), bin_name, exec_name];
    artefacts.sort();
    assert_eq!(listed, artefacts);

    // The Terraform input it prints is the zip's base64 SHA-256, as lambda_zip_base64sha256
    // takes it, next to the path to give lambda_zip_path.
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&zip));
    assert!(
        stdout.contains(&format!("lambda_zip_base64sha256 = \"{b64}\"")),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains(&format!(
            "lambda_zip_path = \"{}\"",
            out_dir.join(&zip_name).display()
        )),
        "{}",
        text(&out)
    );
}

/// What a release must not ship is refused, naming the file and the fix, and leaves no
/// `SHA256SUMS` behind (a directory with checksums is a finished release).
#[rstest]
#[case::a_missing_pod_binary("x86_64", "no pod binary for x86_64", "scripts/pod-image.sh")]
#[case::a_missing_exec_wrapper("x86_64", "no exec wrapper for x86_64", "scripts/pod-image.sh")]
#[case::the_full_binary_as_the_exec_wrapper("x86_64", "says 'podmutator", "not 'podmutator-exec")]
#[case::an_x86_64_build_in_the_arm64_slots(
    "arm64",
    "is for 'Advanced Micro Devices X86-64', not arm64",
    "bootstrap"
)]
#[case::a_zip_with_more_than_bootstrap(
    "x86_64",
    "must hold exactly one file, bootstrap",
    "extra.txt"
)]
fn a_build_a_release_must_not_ship_is_refused(
    #[case] arch: &str,
    #[case] message: &str,
    #[case] names: &str,
) {
    let from = match message {
        m if m.starts_with("no pod binary") => {
            let from = builds(&[arch], None);
            std::fs::remove_dir_all(from.join("pod-image")).unwrap();
            from
        }
        m if m.starts_with("no exec wrapper") => {
            let from = builds(&[arch], None);
            std::fs::remove_dir_all(from.join("pod-image").join(arch).join("podmutator-exec"))
                .unwrap();
            from
        }
        m if m.starts_with("says") => {
            let from = builds(&[arch], None);
            let slot = from
                .join("pod-image")
                .join(arch)
                .join("podmutator-exec/bootstrap");
            std::fs::copy(env!("CARGO_BIN_EXE_podmutator"), slot).unwrap();
            from
        }
        m if m.starts_with("must hold") => builds(&[arch], Some("extra.txt")),
        _ => builds(&[arch], None),
    };
    let out_dir = temp_dir("release-refused");
    let out = release(
        &[
            "--from",
            from.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ],
        arch,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("release: "), "{}", text(&out));
    assert!(stderr.contains(message), "{}", text(&out));
    assert!(stderr.contains(names), "{}", text(&out));
    assert!(names_in(&out_dir).is_empty(), "{:?}", names_in(&out_dir));
}

#[test]
fn an_unknown_architecture_is_refused_before_anything_runs() {
    let out = release(&["--dry-run"], "arm64 amd64");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("unknown arch amd64 in ARCHES (arm64 or x86_64)"),
        "{}",
        text(&out)
    );
}

/// A stand-in `docker` for `--image`: records its arguments (one a line) beside itself and, as
/// buildx does after a push, writes the metadata file with `metadata` (`{}` leaves the digest
/// out); `fail` makes the build fail. Returns the directory to put first on PATH.
fn stand_in_docker(metadata: &str, fail: bool) -> PathBuf {
    let bin = temp_dir("release-docker");
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$(dirname \"$0\")/args\"\n{}\
         while [ $# -gt 0 ]; do\n  if [ \"$1\" = --metadata-file ]; then printf '%s' '{metadata}' > \"$2\"; fi\n  shift\ndone\n",
        if fail {
            "echo 'ERROR: failed to push' >&2\nexit 1\n"
        } else {
            ""
        }
    );
    let path = bin.join("docker");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn release_with_docker(args: &[&str], docker: &Path) -> Output {
    let path = format!(
        "{}:{}",
        docker.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(root().join("scripts/release.sh"))
        .args(args)
        .env("ARCHES", "x86_64")
        .env("PATH", path)
        .output()
        .expect("scripts/release.sh runs")
}

/// No image was published, so the in-cluster install ran `podmutator:latest`, which
/// nobody can pull. `--image` builds the Dockerfile for the release's architectures, pushes it
/// tagged with the version, and records the digest buildx reports for the push (the artefact
/// `podmutator-<version>-image`, in SHA256SUMS) with the install's `kustomize edit set image`
/// line. Docker runs no build here (no daemon, no registry): a stand-in answers as buildx does,
/// so what is checked is the command given and what is made of its answer.
#[test]
fn an_image_release_records_the_pushed_digest_and_prints_the_pinned_install_step() {
    let digest = format!("sha256:{}", sha256_hex(b"the image index"));
    // buildx's metadata file, as it writes it after `--push` (indented JSON).
    let metadata = format!(
        "{{\n  \"buildx.build.ref\": \"builder/builder0/x\",\n  \"containerimage.descriptor\": {{\"digest\": \"sha256:{}\"}},\n  \"containerimage.digest\": \"{digest}\",\n  \"image.name\": \"registry.example.com/team/podmutator:{VERSION}\"\n}}",
        sha256_hex(b"another descriptor")
    );
    let docker = stand_in_docker(&metadata, false);
    let from = builds(&["x86_64"], None);
    let out_dir = temp_dir("release-image");
    let repository = "registry.example.com/team/podmutator";
    let out = release_with_docker(
        &[
            "--from",
            from.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "--image",
            repository,
        ],
        &docker,
    );
    assert!(out.status.success(), "{}", text(&out));
    let args = std::fs::read_to_string(docker.join("args")).unwrap();
    let args: Vec<&str> = args.lines().collect();
    // The commit `podmutator version` names: the build context has no Git metadata.
    let commit = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(root())
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let commit = commit.trim();
    let metadata_file = args
        .iter()
        .position(|a| *a == "--metadata-file")
        .map(|i| args[i + 1])
        .expect("buildx is asked for its metadata file");
    assert_eq!(
        args,
        [
            "buildx",
            "build",
            "--platform",
            "linux/amd64",
            "--tag",
            &format!("{repository}:{VERSION}"),
            "--push",
            "--metadata-file",
            metadata_file,
            "--build-arg",
            &format!("PODMUTATOR_COMMIT={commit}"),
            root().to_str().unwrap(),
        ],
        "{}",
        text(&out)
    );
    let name = format!("podmutator-{VERSION}-image");
    let pinned = format!("{repository}@{digest}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join(&name)).unwrap(),
        format!("{pinned}\n")
    );
    let sums = std::fs::read_to_string(out_dir.join("SHA256SUMS")).unwrap();
    assert!(
        sums.lines().any(|l| l.ends_with(&format!("  {name}"))),
        "{sums}"
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        stdout.contains(&format!(
            "cd deploy/kubernetes/base && kustomize edit set image podmutator={pinned}\n"
        )),
        "{}",
        text(&out)
    );

    // The dry run names the build and the artefact.
    let out = release(
        &[
            "--dry-run",
            "--out",
            out_dir.to_str().unwrap(),
            "--image",
            repository,
        ],
        "arm64 x86_64",
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        stdout.contains(&format!(
            "build: docker buildx build --platform linux/arm64,linux/amd64 --tag {repository}:{VERSION} --push --metadata-file "
        )),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains(&format!("artefact: {}\n", out_dir.join(&name).display())),
        "{}",
        text(&out)
    );
}

/// What would leave the install without a digest to pin is refused and leaves no release: a
/// repository given with a tag or a digest (the digest is the push's), a failed build or push,
/// and buildx metadata without `containerimage.digest`.
#[rstest]
#[case::a_tag(
    "registry.example.com/podmutator:1.0",
    "{}",
    false,
    "without a tag or digest"
)]
#[case::a_digest(
    "registry.example.com/podmutator@sha256:0123",
    "{}",
    false,
    "without a tag or digest"
)]
#[case::a_failed_push(
    "registry.example.com:5000/podmutator",
    "{}",
    true,
    "docker buildx build of registry.example.com:5000/podmutator:"
)]
#[case::no_digest_in_the_metadata(
    "registry.example.com/podmutator",
    "{\"image.name\": \"registry.example.com/podmutator\"}",
    false,
    "holds no containerimage.digest"
)]
fn an_image_release_without_a_digest_to_pin_is_refused(
    #[case] repository: &str,
    #[case] metadata: &str,
    #[case] fail: bool,
    #[case] message: &str,
) {
    let docker = stand_in_docker(metadata, fail);
    let from = builds(&["x86_64"], None);
    let out_dir = temp_dir("release-image-refused");
    let out = release_with_docker(
        &[
            "--from",
            from.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "--image",
            repository,
        ],
        &docker,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(message), "{}", text(&out));
    assert!(names_in(&out_dir).is_empty(), "{:?}", names_in(&out_dir));
}
