//! The fetcher image's `Dockerfile` against what this repository tests. No Docker daemon runs
//! here, so `scripts/pod-image.sh` runs the Dockerfile's build command itself and tries the
//! static binary it makes; these checks keep the two, and the pinned tools, from drifting apart.

use std::collections::BTreeMap;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `name==version` pins of a requirements file or of `pip install` words.
fn pins(text: &str) -> BTreeMap<String, String> {
    text.split_whitespace()
        .filter_map(|w| w.split_once("=="))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim_end_matches('\\').to_owned()))
        .collect()
}

/// The Dockerfile with its line continuations joined, so one `RUN` is one line.
fn dockerfile() -> String {
    read("Dockerfile").replace("\\\n", " ")
}

#[test]
fn the_build_tools_are_pinned_as_the_tests_pin_them() {
    let docker = dockerfile();
    let install = docker
        .lines()
        .find(|l| l.contains("pip3 install"))
        .expect("the build stage installs its tools with pip");
    let image = pins(install);
    let tested = pins(&read("scripts/requirements/venv.txt"));
    for tool in ["cargo-lambda", "ziglang"] {
        assert!(
            image.contains_key(tool),
            "the Dockerfile does not pin {tool}"
        );
        assert_eq!(
            image.get(tool),
            tested.get(tool),
            "{tool}: the Dockerfile and scripts/requirements/venv.txt pin different versions"
        );
    }
}

#[test]
fn the_image_is_built_by_the_command_the_script_checks() {
    let docker = dockerfile();
    let script = read("scripts/pod-image.sh");
    // Both build the one binary with cargo-lambda for a musl target, locked and released.
    for word in [
        "cargo lambda build",
        "--release",
        "--locked",
        "--bin podmutator ",
        "--bin podmutator-exec",
        // The image runs `serve` in the cluster: the features a Lambda build leaves out.
        "--features podmutator/serve,podmutator/tools",
        "--target",
        "--lambda-dir",
    ] {
        assert!(
            docker.contains(word),
            "the Dockerfile's build lacks {word:?}"
        );
        assert!(
            script.contains(word),
            "scripts/pod-image.sh's build lacks {word:?}"
        );
    }
    for target in ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"] {
        assert!(
            docker.contains(target),
            "the Dockerfile does not build {target}"
        );
        assert!(
            script.contains(target),
            "scripts/pod-image.sh does not build {target}"
        );
    }
    assert!(
        docker.contains("/out/podmutator/bootstrap /podmutator"),
        "the image must ship what cargo lambda built"
    );
    // fetch copies the wrapper from beside its own executable (`/podmutator`).
    assert!(
        docker.contains("/out/podmutator-exec/bootstrap /podmutator-exec")
            && docker.contains("COPY --from=build /podmutator-exec /podmutator-exec"),
        "the image must ship the exec wrapper at /podmutator-exec, beside /podmutator"
    );
}

/// Whether `path` (relative to the repository) reaches the build stage: admitted by
/// `.dockerignore` (`*`, then `!` lines, the last matching line deciding, as Docker reads it)
/// and under the source of one of the build stage's `COPY` lines.
fn in_build_stage(path: &str, ignore: &str, docker: &str) -> bool {
    let covers = |pattern: &str| {
        let pattern = pattern.trim_end_matches('/');
        pattern == "*" || path == pattern || path.starts_with(&format!("{pattern}/"))
    };
    let admitted = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .fold(true, |kept, line| match line.strip_prefix('!') {
            Some(pattern) if covers(pattern) => true,
            None if covers(line) => false,
            _ => kept,
        });
    let copied = docker.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&"COPY")
            && !words.iter().any(|w| w.starts_with("--from"))
            && words[1..words.len() - 1].iter().any(|src| covers(src))
    });
    admitted && copied
}

/// Every file cargo needs to build the workspace (each package's manifest, and every target
/// but tests and examples: libraries, binaries, build scripts, benches) is in the build stage:
/// a file left out fails the image build only where Docker runs, which is not here.
#[test]
fn the_build_context_holds_every_file_the_build_reads() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (docker, ignore) = (dockerfile(), read(".dockerignore"));
    let mut checked = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        let manifest = package["manifest_path"].as_str().unwrap();
        if manifest.contains("/fuzz/") {
            continue; // its own workspace, not built by the image
        }
        let mut files = vec![manifest.to_owned()];
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if !kinds.iter().any(|k| k == "test" || k == "example") {
                files.push(target["src_path"].as_str().unwrap().to_owned());
            }
        }
        for file in files {
            let rel = file.strip_prefix(&format!("{root}/")).unwrap().to_owned();
            assert!(
                in_build_stage(&rel, &ignore, &docker),
                "{rel} is not in the image's build stage: add it to .dockerignore (!{rel}) and a COPY line"
            );
            checked.push(rel);
        }
    }
    for needed in [
        "Cargo.toml",
        "build.rs",
        "src/main.rs",
        "crates/exec/src/main.rs",
    ] {
        assert!(
            checked.iter().any(|f| f == needed),
            "{needed} not among {checked:?}"
        );
    }
    assert!(!in_build_stage("tests/integration.rs", &ignore, &docker));
}

#[test]
fn the_image_runs_the_static_binary_as_a_non_root_user() {
    let docker = dockerfile();
    let stages: Vec<&str> = docker
        .lines()
        .filter(|l| l.trim_start().starts_with("FROM "))
        .collect();
    let last = stages.last().expect("a FROM line");
    assert!(
        last.contains("distroless/static") && last.contains(":nonroot"),
        "the final stage must be distroless/static:nonroot (no libc, no shell): {last}"
    );
    let after_last = docker.rsplit_once(last).map(|(_, rest)| rest).unwrap();
    let user = after_last
        .lines()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("the final stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER must be a numeric non-root uid (runAsNonRoot checks it): {user}"
    );
    assert!(after_last.contains(r#"ENTRYPOINT ["/podmutator"]"#));
    assert!(after_last.contains(r#"CMD ["fetch"]"#));
}
