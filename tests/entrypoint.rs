//! Reference delivery's ENTRYPOINT lookup against a fake OCI registry on 127.0.0.1 (HTTPS with a
//! test CA, the anonymous Bearer flow, blobs behind a redirect): a container with only `args`
//! is wrapped as `podmutator exec -- <ENTRYPOINT>`, keeping its args or taking the image's
//! CMD; answers are cached; an unlisted registry is never contacted; every failure is a denial
//! naming the container and the image, within the lookup's timeout.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::registry::{ECR_HOST, FakeRegistry, Faults, PlatformCmd};
use common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::pod::exec::EXEC_ENV_ENV;
use podmutator_core::pod::injector::{EXECUTABLE, RUN_DIR};
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::NameSource;
use serde_json::{Value, json};

const NS: &str = "flytesnacks-development";
const REPO: &str = "flyteorg/flytekit";
const ENTRYPOINT: [&str; 2] = ["/usr/bin/tini", "--"];
const FLYTE_ARGS: [&str; 3] = ["pyflyte-execute", "--inputs", "s3://bucket/inputs.pb"];

/// The lookup's and the admission's deadlines are far beyond what a loaded machine takes: only
/// the tests about a timeout set a short one (`extra`).
fn config(registries: &[String], ca: &std::path::Path, extra: Value) -> Config {
    let mut lookup = json!({"registries": registries, "caBundleFile": ca, "timeoutMs": 20000});
    for (k, v) in extra.as_object().unwrap() {
        lookup[k] = v.clone();
    }
    Config::from_value(json!({
        "webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "deadlineMs": 25000,
            "entrypointLookup": lookup
        }
    }))
    .unwrap()
    .config
}

fn app(registry: &FakeRegistry, extra: Value) -> Front {
    let cfg = config(&[registry.host()], &registry.ca_file, extra);
    webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::all())),
    )
}

/// A Flyte task pod: one ENV_VAR secret, a container with `args` only (when `args` is set).
fn task_pod(image: &str, args: Option<&[&str]>) -> Value {
    let secrets = [Secret {
        key: "api_key".into(),
        mount_requirement: MountRequirement::EnvVar,
        ..Default::default()
    }];
    let mut container = json!({"name": "task", "image": image});
    if let Some(a) = args {
        container["args"] = json!(a);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [container]}
    })
}

async fn admit(app: &Front, pod: &Value) -> Value {
    let body = serde_json::to_vec(&create_review(pod, NS)).unwrap();
    let reply = app.review(Route::Secrets, &body).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    response(&reply.body)
}

/// The admitted pod's container.
async fn admitted(app: &Front, pod: &Value) -> Value {
    let resp = admit(app, pod).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    apply(pod, &patch_of(&resp))["spec"]["containers"][0].clone()
}

/// The denial's message, checked to be a 400 `ContainerCommandRequired`.
async fn denied(app: &Front, pod: &Value) -> String {
    let resp = admit(app, pod).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 400, "{resp}");
    assert_eq!(
        resp["auditAnnotations"]["denial-reason"], "ContainerCommandRequired",
        "{resp}"
    );
    resp["status"]["message"].as_str().unwrap().to_owned()
}

fn wrapped(entrypoint: &[&str]) -> Value {
    let mut c = vec![EXECUTABLE, "exec", "--"];
    c.extend(entrypoint);
    json!(c)
}

fn two_platforms(arm_entrypoint: &[&'static str]) -> Vec<PlatformCmd> {
    vec![
        ("amd64", Some(ENTRYPOINT.to_vec()), Some(vec!["python"])),
        ("arm64", Some(arm_entrypoint.to_vec()), Some(vec!["python"])),
    ]
}

#[tokio::test]
async fn a_flytekit_pod_with_only_args_gets_the_images_entrypoint_and_keeps_its_args() {
    let registry = FakeRegistry::start(
        &[(REPO, "py3.12", two_platforms(&ENTRYPOINT))],
        Faults {
            bearer: true,
            redirect_blobs: true,
            ..Default::default()
        },
    )
    .await;
    let app = app(&registry, json!({}));
    let image = format!("{}/{REPO}:py3.12", registry.host());
    let pod = task_pod(&image, Some(&FLYTE_ARGS));
    let c = admitted(&app, &pod).await;
    assert_eq!(c["command"], wrapped(&ENTRYPOINT), "{c}");
    assert_eq!(c["args"], json!(FLYTE_ARGS), "the pod's args are untouched");
    let asked = registry.requests();
    assert!(
        asked.iter().any(|r| r.starts_with("GET /token?")),
        "{asked:?}"
    );
    assert!(
        asked.iter().any(|r| r.starts_with("GET /storage/")),
        "{asked:?}"
    );
    // Unpinned: both linux platforms were read (and agree); the attestation entry was not.
    assert_eq!(
        asked.iter().filter(|r| r.contains("/blobs/")).count(),
        2,
        "{asked:?}"
    );

    // The patched pod, admitted again, changes nothing and asks nobody.
    registry.reset();
    let patched = apply(&pod, &patch_of(&admit(&app, &pod).await));
    let again = admit(&app, &patched).await;
    assert_eq!(again["allowed"], true);
    assert!(again.get("patch").is_none(), "{again}");
    assert_eq!(registry.count(), 0, "{:?}", registry.requests());
}

#[tokio::test]
async fn without_args_the_images_cmd_becomes_the_args() {
    let registry = FakeRegistry::start(
        &[
            (
                "app/entry",
                "1",
                vec![(
                    "amd64",
                    Some(vec!["/entry.sh"]),
                    Some(vec!["serve", "--port=80"]),
                )],
            ),
            (
                "app/cmd-only",
                "1",
                vec![("amd64", None, Some(vec!["python", "main.py"]))],
            ),
            ("app/nothing", "1", vec![("amd64", None, None)]),
        ],
        Faults::default(),
    )
    .await;
    let app = app(&registry, json!({}));
    let host = registry.host();
    let c = admitted(&app, &task_pod(&format!("{host}/app/entry:1"), None)).await;
    assert_eq!(c["command"], wrapped(&["/entry.sh"]));
    assert_eq!(c["args"], json!(["serve", "--port=80"]));
    // No ENTRYPOINT: the program is the first word of CMD, which `exec --` runs.
    let c = admitted(&app, &task_pod(&format!("{host}/app/cmd-only:1"), None)).await;
    assert_eq!(c["command"], wrapped(&[]));
    assert_eq!(c["args"], json!(["python", "main.py"]));
    let c = admitted(
        &app,
        &task_pod(&format!("{host}/app/cmd-only:1"), Some(&["python", "x.py"])),
    )
    .await;
    assert_eq!(c["command"], wrapped(&[]));
    assert_eq!(c["args"], json!(["python", "x.py"]));
    let message = denied(&app, &task_pod(&format!("{host}/app/nothing:1"), None)).await;
    assert!(message.contains("neither ENTRYPOINT nor CMD"), "{message}");
    assert!(message.contains("container \"task\""), "{message}");
}

#[tokio::test]
async fn a_digest_pinned_image_is_read_by_its_digest_alone() {
    let registry = FakeRegistry::start(
        &[(
            REPO,
            "1.0",
            vec![("amd64", Some(ENTRYPOINT.to_vec()), None)],
        )],
        Faults::default(),
    )
    .await;
    let app = app(&registry, json!({}));
    let digest = registry.digest(REPO, "1.0");
    let image = format!("{}/{REPO}@{digest}", registry.host());
    let c = admitted(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
    assert_eq!(c["command"], wrapped(&ENTRYPOINT));
    let asked = registry.requests();
    assert!(
        !asked.iter().any(|r| r.contains("/manifests/1.0")),
        "no tag lookup: {asked:?}"
    );
    assert!(
        asked
            .iter()
            .any(|r| r.contains(&format!("/manifests/{digest}"))),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_pinned_arch_picks_its_platform_and_unpinned_platforms_must_agree() {
    let registry = FakeRegistry::start(
        &[(REPO, "split", two_platforms(&["/arm/entry"]))],
        Faults::default(),
    )
    .await;
    let app = app(&registry, json!({}));
    let image = format!("{}/{REPO}:split", registry.host());
    let pod = task_pod(&image, Some(&FLYTE_ARGS));
    let message = denied(&app, &pod).await;
    assert!(message.contains("run different commands"), "{message}");
    assert!(
        message.contains("linux/amd64") && message.contains("linux/arm64"),
        "{message}"
    );
    assert!(message.contains("kubernetes.io/arch"), "{message}");
    assert!(message.contains(&image), "{message}");

    let mut arm = pod.clone();
    arm["spec"]["nodeSelector"] = json!({"kubernetes.io/arch": "arm64"});
    registry.reset();
    let c = admitted(&app, &arm).await;
    assert_eq!(c["command"], wrapped(&["/arm/entry"]));
    assert_eq!(
        registry
            .requests()
            .iter()
            .filter(|r| r.contains("/blobs/"))
            .count(),
        1,
        "only the pinned platform is read"
    );

    let mut amd = pod.clone();
    amd["spec"]["nodeSelector"] = json!({"kubernetes.io/arch": "amd64"});
    let c = admitted(&app, &amd).await;
    assert_eq!(c["command"], wrapped(&ENTRYPOINT));

    let mut s390 = pod;
    s390["spec"]["nodeSelector"] = json!({"kubernetes.io/arch": "s390x"});
    let message = denied(&app, &s390).await;
    assert!(message.contains("no linux/s390x platform"), "{message}");
}

#[tokio::test]
async fn a_second_admission_asks_the_registry_nothing_until_the_tag_expires() {
    let registry = FakeRegistry::start(
        &[(REPO, "py3.12", two_platforms(&ENTRYPOINT))],
        Faults::default(),
    )
    .await;
    let image = format!("{}/{REPO}:py3.12", registry.host());
    let pod = task_pod(&image, Some(&FLYTE_ARGS));
    // Warm, with a TTL no stall of the machine outlasts: nothing is asked.
    let fresh = app(&registry, json!({"tagTtlSeconds": 3600}));
    let cold = admit(&fresh, &pod).await;
    assert!(registry.count() >= 5, "{:?}", registry.requests());
    registry.reset();
    let warm = admit(&fresh, &pod).await;
    assert_eq!(warm["patch"], cold["patch"]);
    assert_eq!(registry.count(), 0, "{:?}", registry.requests());

    // Past the tag's TTL (a 1 s TTL, then a sleep longer than it: a stall only makes it
    // later): the tag is asked again; its digest's command is still known.
    let expiring = app(&registry, json!({"tagTtlSeconds": 1}));
    registry.reset();
    let cold = admit(&expiring, &pod).await;
    assert!(registry.count() >= 5, "{:?}", registry.requests());
    registry.reset();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later = admit(&expiring, &pod).await;
    assert_eq!(later["patch"], cold["patch"]);
    assert_eq!(
        registry.requests(),
        vec![format!("GET /v2/{REPO}/manifests/py3.12")]
    );
}

/// Counts TCP connections to a loopback port that is not a registry.
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, count)
}

/// Pod creators choose image names: an image naming an internal host, the instance metadata
/// address or any registry the configuration does not list is refused, and nothing is
/// contacted.
#[tokio::test]
async fn an_image_on_an_unlisted_registry_is_refused_without_a_connection() {
    let registry = FakeRegistry::start(&[], Faults::default()).await;
    let app = app(&registry, json!({}));
    let (port, connections) = counting_listener().await;
    for image in [
        format!("127.0.0.1:{port}/internal/admin:1"),
        format!("localhost:{port}/x:1"),
        "169.254.169.254/latest/meta-data:1".to_owned(),
        "python:3.12".to_owned(),
    ] {
        let message = denied(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
        assert!(message.contains("container \"task\""), "{message}");
        assert!(message.contains(&image), "{message}");
        assert!(
            message.contains("embedded.entrypointLookup.registries does not list"),
            "{message}"
        );
        assert!(
            message.contains("set the container's `command`"),
            "{message}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a connection was made"
    );
    assert_eq!(registry.count(), 0);
}

#[tokio::test]
async fn with_the_lookup_off_a_container_without_command_is_refused_as_before() {
    let cfg = Config::from_value(json!({
        "webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}},
        "embedded": {"organization": "flyte", "delivery": "reference", "fetcherImage": "registry.example/podmutator:1"}
    }))
    .unwrap()
    .config;
    let app = webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::all())),
    );
    let message = denied(&app, &task_pod("python:3.12", Some(&FLYTE_ARGS))).await;
    assert!(
        message.contains("embedded.entrypointLookup.registries is empty"),
        "{message}"
    );
}

/// Each failure: a 400 naming the container, the image and the cause, within the timeout.
#[tokio::test]
async fn a_registry_that_fails_is_a_denial_naming_the_container_and_the_image() {
    let images = [(REPO, "1", vec![("amd64", Some(ENTRYPOINT.to_vec()), None)])];
    let cases: Vec<(&str, Faults, &str)> = vec![
        (
            "slow",
            // Far longer than any stall of a loaded machine, so that being answered before it
            // ends proves the timeout cut the lookup.
            Faults {
                delay: Some(Duration::from_secs(120)),
                ..Default::default()
            },
            "took longer than embedded.entrypointLookup.timeoutMs (300 ms)",
        ),
        (
            "oversize",
            Faults {
                oversize: true,
                ..Default::default()
            },
            "more than 4194304 bytes",
        ),
        (
            "corrupt",
            Faults {
                corrupt_blobs: true,
                ..Default::default()
            },
            "does not match its digest",
        ),
    ];
    for (name, faults, want) in cases {
        let registry = FakeRegistry::start(&images, faults).await;
        // A short timeout where the timeout is the point; elsewhere one a loaded machine's
        // stalls cannot reach, so the fault itself is what answers.
        let timeout = if name == "slow" { 300 } else { 20000 };
        let app = app(&registry, json!({"timeoutMs": timeout}));
        let image = format!("{}/{REPO}:1", registry.host());
        let started = Instant::now();
        let message = denied(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: took {:?}",
            started.elapsed()
        );
        assert!(message.contains(want), "{name}: {message}");
        assert!(message.contains("container \"task\""), "{name}: {message}");
        assert!(message.contains(&image), "{name}: {message}");
        assert!(
            message.contains("set the container's `command`"),
            "{name}: {message}"
        );
    }

    // Not found, and nobody listening.
    let registry = FakeRegistry::start(&images, Faults::default()).await;
    let app = app(&registry, json!({}));
    let image = format!("{}/{REPO}:no-such-tag", registry.host());
    let message = denied(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
    assert!(message.contains("not found (HTTP 404)"), "{message}");
    let port = free_port();
    let down = format!("localhost:{port}");
    let cfg = config(std::slice::from_ref(&down), &registry.ca_file, json!({}));
    let app = webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::all())),
    );
    let image = format!("{down}/{REPO}:1");
    let message = denied(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
    assert!(
        message.contains(&format!("cannot reach {down}")),
        "{message}"
    );
}

/// A registry whose certificate is not trusted is a denial too (the test CA is not given).
#[tokio::test]
async fn a_registry_with_an_untrusted_certificate_is_not_read() {
    let registry = FakeRegistry::start(
        &[(REPO, "1", vec![("amd64", Some(ENTRYPOINT.to_vec()), None)])],
        Faults::default(),
    )
    .await;
    let cfg = Config::from_value(json!({
        "webhook": {"secretManagerTypes": ["Embedded"], "embeddedSecretManagerConfig": {"type": "AWS"}},
        "embedded": {"organization": "flyte", "delivery": "reference", "fetcherImage": "registry.example/podmutator:1",
            "entrypointLookup": {"registries": [registry.host()]}}
    }))
    .unwrap()
    .config;
    let app = webhook(
        &cfg,
        Deps::offline().with_resolver(Arc::new(NameSource::all())),
    );
    let image = format!("{}/{REPO}:1", registry.host());
    let message = denied(&app, &task_pod(&image, Some(&FLYTE_ARGS))).await;
    assert!(message.contains("TLS"), "{message}");
    assert_eq!(registry.count(), 0, "no request was sent");
}

/// The wrapped container runs: the real `podmutator exec`, given the container's command and
/// args from the patch (the image's ENTRYPOINT `sh -c` and CMD), sets the variable from its
/// file and runs the image's program.
#[tokio::test]
async fn the_wrapped_image_entrypoint_runs_under_podmutator_exec_with_the_variable() {
    let registry = FakeRegistry::start(
        &[(
            "tools/sh",
            "1",
            vec![(
                "amd64",
                Some(vec!["sh", "-c"]),
                Some(vec!["printf '%s' \"$_UNION_API_KEY\""]),
            )],
        )],
        Faults::default(),
    )
    .await;
    let app = app(&registry, json!({}));
    let c = admitted(
        &app,
        &task_pod(&format!("{}/tools/sh:1", registry.host()), None),
    )
    .await;
    let command: Vec<String> = serde_json::from_value(c["command"].clone()).unwrap();
    let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
    assert_eq!(command[..3], [EXECUTABLE, "exec", "--"]);
    // What the init container would have written, in a scratch directory for the volume.
    let run = temp_dir("entrypoint-run");
    std::fs::create_dir_all(run.join("env")).unwrap();
    std::fs::write(run.join("env/_UNION_API_KEY"), "fake-api-key-from-file").unwrap();
    let plan = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == EXEC_ENV_ENV)
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .replace(RUN_DIR, &run.display().to_string());
    let out = crate::common::bin()
        .args(&command[1..])
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(EXEC_ENV_ENV, plan)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "fake-api-key-from-file"
    );
}

/// An ECR registry answers anonymous requests with a Basic challenge: the webhook asks
/// `ecr:GetAuthorizationToken` (signed with the function's credentials, here against moto) and
/// sends its token; the token is reused for the next image. Without AWS the pod is refused,
/// naming the challenge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ecr_image_is_read_with_a_token_from_get_authorization_token() {
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use common::aws::{CountingProxy, Moto};
    use podmutator_aws::registry::client::RegistryClient;

    let moto = Moto::start();
    let proxy = CountingProxy::start(moto.port).await;
    let one = vec![("amd64", Some(ENTRYPOINT.to_vec()), None)];
    let registry = FakeRegistry::start(
        &[("team/task", "1", one.clone()), ("team/task", "2", one)],
        Faults {
            basic: true,
            ..Default::default()
        },
    )
    .await;
    let host = format!("{ECR_HOST}:{}", registry.port);
    let cfg = config(std::slice::from_ref(&host), &registry.ca_file, json!({}));
    let aws = podmutator_aws::secretsmanager::SharedAws::with_loader(
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(proxy.url())
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "testing", "testing", None, None, "test",
            ))),
    );
    let client = RegistryClient::new(&cfg.embedded.entrypoint_lookup)
        .unwrap()
        .with_ecr(aws)
        .resolving(ECR_HOST, "127.0.0.1".parse().unwrap());
    let app = webhook(
        &cfg,
        Deps::offline()
            .with_resolver(Arc::new(NameSource::all()))
            .with_entrypoints(Arc::new(client)),
    );
    let c = admitted(
        &app,
        &task_pod(&format!("{host}/team/task:1"), Some(&FLYTE_ARGS)),
    )
    .await;
    assert_eq!(c["command"], wrapped(&ENTRYPOINT));
    assert_eq!(proxy.total(), 1, "one GetAuthorizationToken call");
    let auths = registry.authorizations();
    assert!(!auths.is_empty());
    for a in &auths {
        use base64::Engine;
        let token = a.strip_prefix("Basic ").expect("Basic credentials");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token)
            .unwrap();
        assert!(decoded.starts_with(b"AWS:"), "{a}");
    }
    let c = admitted(
        &app,
        &task_pod(&format!("{host}/team/task:2"), Some(&FLYTE_ARGS)),
    )
    .await;
    assert_eq!(c["command"], wrapped(&ENTRYPOINT));
    assert_eq!(proxy.total(), 1, "the token is reused");

    // The same registry without AWS credentials to ask with.
    let anonymous = RegistryClient::new(&cfg.embedded.entrypoint_lookup)
        .unwrap()
        .resolving(ECR_HOST, "127.0.0.1".parse().unwrap());
    let app = webhook(
        &cfg,
        Deps::offline()
            .with_resolver(Arc::new(NameSource::all()))
            .with_entrypoints(Arc::new(anonymous)),
    );
    let message = denied(
        &app,
        &task_pod(&format!("{host}/team/task:1"), Some(&FLYTE_ARGS)),
    )
    .await;
    assert!(message.contains("asks for credentials (Basic"), "{message}");
}
