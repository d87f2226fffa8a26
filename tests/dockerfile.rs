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

#[test]
fn the_build_context_holds_every_workspace_crate() {
    let docker = dockerfile();
    let ignore = read(".dockerignore");
    let manifest = read("Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("Cargo.toml names the workspace members");
    assert!(
        members.contains("crates/"),
        "no member under crates/: {members}"
    );
    for member in members.split('"').filter(|m| m.starts_with("crates/")) {
        assert!(
            ignore.lines().any(|l| l == "!crates/"),
            ".dockerignore leaves out {member}"
        );
        assert!(
            docker.contains("COPY crates ./crates"),
            "the Dockerfile does not copy {member}"
        );
    }
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
