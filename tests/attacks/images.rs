//! Attacks on the image builder's organisation check and on the registry lookup, each through
//! the whole admission path: a review body in, the reply (and the patch, applied to the
//! original JSON) checked.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::common::registry::{ECR_HOST, FakeRegistry, Faults, TOKEN as REGISTRY_TOKEN};
use crate::common::*;
use podmutator_core::config::Config;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::NameSource;
use rstest::rstest;
use serde_json::{Value, json};

/// The organisation (namespace) of every pod here.
const ORG: &str = "acme";
const E: &str = "registry.union.example";
const R: &str = "cr.union.example";
/// The Embedded manager's file-mount init container, as configured by default.
const INIT_NAME: &str = "init-embedded-secret";
const BUSYBOX: &str = "public.ecr.aws/docker/library/busybox:latest";
/// An image of another organisation.
const FOREIGN: &str = "cr.union.example/orgs/other-org/private:1";

fn builder_config(extra_webhook: Value) -> Config {
    let mut webhook = json!({"imageBuilderConfig": {
        "enabled": true,
        "hostnameReplacement": {"existing": E, "replacement": R},
        "labelSelector": {"matchLabels": {"image-builder": "true"}}
    }});
    for (k, v) in extra_webhook.as_object().unwrap() {
        webhook[k] = v.clone();
    }
    Config::from_value(json!({ "webhook": webhook }))
        .unwrap()
        .config
}

fn builder(extra_webhook: Value) -> Front {
    webhook(&builder_config(extra_webhook), Deps::offline())
}

fn container(name: &str, image: &str) -> Value {
    json!({"name": name, "image": image})
}

/// A pod of `ORG` with an allowed app container and `init` as its init containers.
fn pod(init: Vec<Value>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": ORG, "labels": {"image-builder": "true"}},
        "spec": {"containers": [container("app", &format!("{R}/orgs/{ORG}/train:1"))]}
    });
    if !init.is_empty() {
        p["spec"]["initContainers"] = json!(init);
    }
    p
}

/// An UPDATE review from `old` to `new`, as the API server sends it (for `sub_resource`
/// `ephemeralcontainers` too: that review carries the whole Pod).
fn update_review(old: &Value, new: &Value, sub_resource: Option<&str>) -> Value {
    let mut r = create_review(new, ORG);
    r["request"]["operation"] = json!("UPDATE");
    r["request"]["oldObject"] = old.clone();
    r["request"]["options"] = json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"});
    if let Some(s) = sub_resource {
        r["request"]["subResource"] = json!(s);
        r["request"]["resource"]["resource"] = json!("pods");
        r["request"]["requestSubResource"] = json!(s);
    }
    r
}

/// The reply's `response` for `review` on `route`; every review here is answered 200.
async fn answer(front: &Front, route: Route, review: &Value) -> Value {
    let reply = front
        .review(route, &serde_json::to_vec(review).unwrap())
        .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    response(&reply.body)
}

/// Checks a 403 `ImageNotAuthorized` that names `image`.
fn assert_refused(resp: &Value, image: &str) {
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 403, "{resp}");
    assert_eq!(
        resp["auditAnnotations"]["denial-reason"], "ImageNotAuthorized",
        "{resp}"
    );
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("access to {image} is not authorized")),
        "{message}"
    );
}

/// A pod naming its own container `init-embedded-secret` (the default
/// `excludedContainerNames`) ran any image: only the init container the webhook injects, by
/// name and configured image, is exempt.
#[rstest]
#[case::an_init_container(json!({"initContainers": [container(INIT_NAME, FOREIGN)]}))]
#[case::an_app_container(json!({"containers": [container("app", &format!("{R}/orgs/{ORG}/train:1")), container(INIT_NAME, FOREIGN)]}))]
#[case::the_busybox_image_as_an_app_container(json!({"containers": [container(INIT_NAME, BUSYBOX)]}))]
#[tokio::test]
async fn an_attacker_naming_a_container_like_the_injected_init_container_runs_no_foreign_image(
    #[case] spec: Value,
) {
    let front = builder(json!({}));
    let mut p = pod(vec![]);
    for (k, v) in spec.as_object().unwrap() {
        p["spec"][k] = v.clone();
    }
    let image = if spec.to_string().contains(FOREIGN) {
        FOREIGN
    } else {
        BUSYBOX
    };
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_refused(&resp, image);
}

/// The control: the init container the webhook injects (its configured name and image) is
/// still exempt, with the default image (also pinned to a digest) and with a configured one;
/// the default image is not exempt once another is configured, nor another repository pinned.
#[tokio::test]
async fn the_injected_init_container_is_exempt_by_its_configured_name_and_image() {
    let front = builder(json!({}));
    let p = pod(vec![container(INIT_NAME, BUSYBOX)]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(patch_of(&resp), json!([]), "{resp}");
    // Pinned to a digest by a policy engine's webhook since: still the one we inject.
    let digest = format!("sha256:{}", "9d".repeat(32));
    let p = pod(vec![container(INIT_NAME, &format!("{BUSYBOX}@{digest}"))]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let other = "public.ecr.aws/docker/library/busybox2";
    let p = pod(vec![container(INIT_NAME, &format!("{other}@{digest}"))]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_refused(&resp, &format!("{other}@{digest}"));

    let mirror = format!("{R}/mirror/busybox:1.36");
    let front = builder(json!({"embeddedSecretManagerConfig": {
        "type": "AWS",
        "fileMountInitContainer": {"image": mirror}
    }}));
    let p = pod(vec![container(INIT_NAME, &mirror)]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let p = pod(vec![container(INIT_NAME, BUSYBOX)]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_refused(&resp, BUSYBOX);
}

/// The image builder, the images entry, then the image builder again, as the API server calls
/// them (`reinvocationPolicy: IfNeeded`) when the images entry rewrote what the builder had
/// allowed: the injected init container and `excludedImagePrefixes` images under their
/// mirrors (also prefixes in Docker Hub's short form) are still allowed, and the last pass
/// changes nothing; a foreign image is still refused on the first pass. (The second builder
/// pass refused them all.)
#[tokio::test]
async fn the_builder_called_again_after_the_images_entry_allows_what_it_allowed() {
    let mut config = builder_config(json!({"imageBuilderConfig": {
        "enabled": true,
        "hostnameReplacement": {"existing": E, "replacement": R},
        "labelSelector": {"matchLabels": {"image-builder": "true"}},
        // Docker Hub's short forms: the mirrors' sources are named `docker.io/...`.
        "excludedImagePrefixes": ["ghcr.io/aether/", "bitnami/", "nginx", "redis:7"]
    }}));
    config.images = serde_json::from_value(json!({"enabled": true, "rules": [
        {"match": "public.ecr.aws", "replace": format!("{ECR_HOST}/ecr-public")},
        {"match": "ghcr.io", "replace": format!("{ECR_HOST}/github")},
        {"match": "docker.io", "replace": format!("{ECR_HOST}/docker-hub")}
    ]}))
    .unwrap();
    let front = webhook(&config, Deps::offline());
    let mut p = pod(vec![
        container(INIT_NAME, BUSYBOX),
        container("mesh-gate", "ghcr.io/aether/gate:1"),
    ]);
    p["spec"]["containers"].as_array_mut().unwrap().extend([
        container("cache", "bitnami/redis:7"),
        container("web", "nginx:1.27"),
        container("queue", "redis:7.2"),
    ]);
    let first = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(first["allowed"], true, "{first}");
    let p = as_stored(&apply(&p, &patch_of(&first)));
    let images = answer(&front, Route::Images, &create_review(&p, ORG)).await;
    let p = as_stored(&apply(&p, &patch_of(&images)));
    assert_eq!(
        p["spec"]["initContainers"][1]["image"],
        format!("{ECR_HOST}/github/aether/gate:1")
    );
    assert_eq!(
        p["spec"]["containers"][1]["image"],
        format!("{ECR_HOST}/docker-hub/bitnami/redis:7")
    );
    let again = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(again["allowed"], true, "{again}");
    assert_eq!(patch_of(&again), json!([]), "{again}");

    let p = pod(vec![container(
        "tool",
        &format!("{ECR_HOST}/github/other/tool:1"),
    )]);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_refused(&resp, &format!("{ECR_HOST}/github/other/tool:1"));
}

/// A pod heavy enough that the review of its UPDATE (the pod twice, `object` and `oldObject`)
/// weighs over `limits.maxObjectsPerReview`, though each pod is under it: created, and then
/// updated (the Job controller removing its finalizer, which graceful deletion waits on). So is
/// a pod stored heavier than the limit, its image changes still checked; an UPDATE whose
/// metadata alone is over the limit is still refused. (Both updates were refused
/// `TooManyObjects`: such a pod could not be deleted.)
#[tokio::test]
async fn a_pod_admitted_at_creation_can_be_updated_however_heavy() {
    let mut config = builder_config(json!({}));
    config.limits.max_objects_per_review = 100;
    let front = webhook(&config, Deps::offline());
    // 8 per container: with the review around it, some 60 of the 100.
    let app = container("app", &format!("{R}/orgs/{ORG}/train:1"));
    let mut p = pod(vec![]);
    p["spec"]["containers"] = json!(vec![app; 6]);
    for (i, c) in p["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        c["name"] = json!(format!("c{i}"));
    }
    let created = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    assert_eq!(created["allowed"], true, "{created}");

    let mut old = p.clone();
    old["metadata"]["finalizers"] = json!(["batch.kubernetes.io/job-tracking"]);
    old["metadata"]["deletionTimestamp"] = json!("2026-12-05T08:00:00Z");
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!([]);
    let updated = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &new, None),
    )
    .await;
    assert_eq!(updated["allowed"], true, "{updated}");
    assert_eq!(patch_of(&updated), json!([]), "{updated}");

    // A pod the API server holds whatever its weight (created while the webhook was off, or
    // before the limit was lowered): 20 env vars in each of its 6 containers, 168 of the 100
    // with them. Of an UPDATE only the containers' names and images are read, and weighed.
    let mut stored = old.clone();
    for c in stored["spec"]["containers"].as_array_mut().unwrap() {
        c["env"] = json!(
            (0..20)
                .map(|i| json!({"name": format!("E{i}"), "value": "v"}))
                .collect::<Vec<_>>()
        );
    }
    let heavy = answer(&front, Route::ImageBuilder, &create_review(&stored, ORG)).await;
    assert_eq!(
        heavy["auditAnnotations"]["denial-reason"], "TooManyObjects",
        "{heavy}"
    );
    let mut released = stored.clone();
    released["metadata"]["finalizers"] = json!([]);
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&stored, &released, None),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(patch_of(&resp), json!([]), "{resp}");
    // Its images are still checked, and rewritten in place, at the container's own index.
    let mut swapped = stored.clone();
    swapped["spec"]["containers"][4]["image"] = json!(FOREIGN);
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&stored, &swapped, None),
    )
    .await;
    assert_refused(&resp, FOREIGN);
    let mut own = stored.clone();
    own["spec"]["containers"][4]["image"] = json!(format!("{E}/{ORG}/train:2"));
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&stored, &own, None),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let mut expected = own.clone();
    expected["spec"]["containers"][4]["image"] = json!(format!("{R}/orgs/{ORG}/train:2"));
    assert_eq!(apply(&own, &patch_of(&resp)), expected, "{resp}");

    // What is read into types is still weighed: metadata of 120 owner references.
    let mut heavier = new.clone();
    heavier["metadata"]["ownerReferences"] = json!(
        (0..120)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("o{i}"), "uid": format!("u{i}")}))
            .collect::<Vec<_>>()
    );
    let refused = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &heavier, None),
    )
    .await;
    assert_eq!(refused["allowed"], false, "{refused}");
    assert_eq!(
        refused["auditAnnotations"]["denial-reason"], "TooManyObjects",
        "{refused}"
    );
}

/// `R/cloud/task` is the build task's repository: a longer name is another repository.
#[rstest]
#[case::a_longer_repository(format!("{R}/cloud/task-other-team/private:1"), false)]
#[case::a_longer_v1_repository(format!("{R}/v1/cloud/task-other-team/private:1"), false)]
#[case::a_longer_name_without_tag(format!("{R}/cloud/tasks"), false)]
#[case::the_task_with_a_tag(format!("{R}/cloud/task:1.2"), true)]
#[case::the_task_with_a_digest(format!("{R}/cloud/task@sha256:{}", "a".repeat(64)), true)]
#[case::a_path_below_the_task(format!("{R}/cloud/task/builder:1"), true)]
#[case::the_v1_task_with_a_tag(format!("{R}/v1/cloud/task:1"), true)]
#[case::the_bare_task(format!("{R}/cloud/task"), true)]
#[tokio::test]
async fn an_attacker_using_a_repository_that_starts_like_the_build_task_is_refused(
    #[case] image: String,
    #[case] allowed: bool,
) {
    let front = builder(json!({}));
    let mut p = pod(vec![]);
    p["spec"]["containers"][0]["image"] = json!(image);
    let resp = answer(&front, Route::ImageBuilder, &create_review(&p, ORG)).await;
    if allowed {
        assert_eq!(resp["allowed"], true, "{image}: {resp}");
        assert_eq!(patch_of(&resp), json!([]), "{image}: {resp}");
    } else {
        assert_refused(&resp, &image);
    }
}

/// After creation, an UPDATE may change an image (`kubectl set image`): it is checked, and
/// rewritten as at creation; an UPDATE that changes no image is allowed whatever the pod
/// already ran.
#[tokio::test]
async fn an_attacker_swapping_in_another_organisations_image_by_update_is_refused() {
    let front = builder(json!({}));
    let old = pod(vec![]);
    let mut swapped = old.clone();
    swapped["spec"]["containers"][0]["image"] = json!(FOREIGN);
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &swapped, None),
    )
    .await;
    assert_refused(&resp, FOREIGN);

    let mut own = old.clone();
    own["spec"]["containers"][0]["image"] = json!(format!("{E}/{ORG}/train:2"));
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &own, None),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let patched = apply(&own, &patch_of(&resp));
    assert_eq!(
        patched["spec"]["containers"][0]["image"],
        format!("{R}/orgs/{ORG}/train:2")
    );

    // A pod admitted before the check (or with the check off) keeps running: relabelling it
    // changes no image and is not refused.
    let mut legacy = old.clone();
    legacy["spec"]["containers"][0]["image"] = json!(FOREIGN);
    let mut relabelled = legacy.clone();
    relabelled["metadata"]["labels"]["team"] = json!("ml");
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&legacy, &relabelled, None),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(patch_of(&resp), json!([]), "{resp}");
}

/// `kubectl debug` adds an ephemeral container through `pods/ephemeralcontainers`, an UPDATE
/// whose review carries the whole Pod: its image is checked too.
#[tokio::test]
async fn an_attacker_adding_an_ephemeral_container_with_another_organisations_image_is_refused() {
    let front = builder(json!({}));
    let old = pod(vec![]);
    let mut debug = old.clone();
    debug["spec"]["ephemeralContainers"] =
        json!([{"name": "debug", "image": FOREIGN, "targetContainerName": "app"}]);
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &debug, Some("ephemeralcontainers")),
    )
    .await;
    assert_refused(&resp, FOREIGN);

    let mut public = old.clone();
    public["spec"]["ephemeralContainers"] = json!([
        {"name": "debug", "image": format!("{E}/v1/unionai/debug:1"), "targetContainerName": "app"}
    ]);
    let resp = answer(
        &front,
        Route::ImageBuilder,
        &update_review(&old, &public, Some("ephemeralcontainers")),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let patched = apply(&public, &patch_of(&resp));
    assert_eq!(
        patched["spec"]["ephemeralContainers"][0]["image"],
        format!("{R}/union/debug:1")
    );
}

/// An UPDATE the image builder cannot read is refused (400), not allowed unchecked: the entry
/// fails closed, as a CREATE does.
#[tokio::test]
async fn an_update_the_image_builder_cannot_read_is_invalid_not_allowed() {
    let front = builder(json!({}));
    let old = pod(vec![]);
    let mut new = old.clone();
    new["spec"]["containers"][0]["image"] = json!(FOREIGN);
    let mut without_old = update_review(&old, &new, None);
    without_old["request"]["oldObject"] = Value::Null;
    let mut broken = update_review(&old, &new, Some("ephemeralcontainers"));
    broken["request"]["object"]["spec"]["ephemeralContainers"] = json!("not a list");
    for (what, review, want) in [
        (
            "no oldObject",
            without_old,
            "needs both request.object and request.oldObject",
        ),
        ("a broken pod", broken, "request.object is not a valid Pod"),
    ] {
        let reply = front
            .review(Route::ImageBuilder, &serde_json::to_vec(&review).unwrap())
            .await;
        assert_eq!(
            reply.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let resp = response(&reply.body);
        assert_eq!(resp["allowed"], false, "{what}: {resp}");
        let message = resp["status"]["message"].as_str().unwrap();
        assert!(message.contains(want), "{what}: {message}");
    }
}

/// Only the image builder's route checks UPDATEs: on every other route a pod UPDATE, and the
/// subresource, stay allowed untouched (only pod CREATE is mutated there).
#[rstest]
#[case::secrets(Route::Secrets, None)]
#[case::secrets_subresource(Route::Secrets, Some("ephemeralcontainers"))]
#[case::images(Route::Images, None)]
#[case::managed_pod(Route::ManagedPod, None)]
#[tokio::test]
async fn other_routes_still_mutate_only_pod_creates(
    #[case] route: Route,
    #[case] sub_resource: Option<&str>,
) {
    let mut cfg = builder_config(json!({}));
    cfg.images = serde_json::from_value(json!({"enabled": true, "rules": [
        {"match": "cr.union.example", "replace": "mirror.example/union"}
    ]}))
    .unwrap();
    let front = webhook(&cfg, Deps::offline());
    let old = pod(vec![]);
    let mut new = old.clone();
    new["spec"]["containers"][0]["image"] = json!(FOREIGN);
    let resp = answer(&front, route, &update_review(&old, &new, sub_resource)).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert!(resp.get("patch").is_none(), "{resp}");
}

// ---------------------------------------------------------------------------------------------
// The registry lookup (`embedded.entrypointLookup`).
// ---------------------------------------------------------------------------------------------

const NS: &str = "flytesnacks-development";
const REPO: &str = "flyteorg/flytekit";
const ENTRYPOINT: [&str; 2] = ["/usr/bin/tini", "--"];

fn lookup_config(registry: &FakeRegistry) -> Config {
    Config::from_value(json!({
        "webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        },
        "embedded": {
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            // Far beyond what a loaded machine takes: the attacks here are not about time.
            "deadlineMs": 25000,
            "entrypointLookup": {"registries": [registry.host()], "caBundleFile": registry.ca_file, "timeoutMs": 20000}
        }
    }))
    .unwrap()
    .config
}

/// A Flyte task pod with one ENV_VAR secret and a container with `args` only: its image's
/// ENTRYPOINT is read from the registry.
fn task_pod(image: &str) -> Value {
    let secrets = [Secret {
        key: "api_key".into(),
        mount_requirement: MountRequirement::EnvVar,
        ..Default::default()
    }];
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "task",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "task", "image": image, "args": ["pyflyte-execute"]}]}
    })
}

/// Log lines written while the guard lives.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A registry (listed, but whose answers the pod's creator may influence, or a compromised
/// one) answers a manifest with text of its choosing where the parser quotes it: the reply
/// names the container, the image and the kind of failure; the registry's words go to the
/// log only.
#[tokio::test]
async fn a_registry_body_quoted_by_the_parser_reaches_the_log_not_the_reply() {
    const MARKER: &str = "registry-says-7f3a9c-visit-evil.example";
    let registry = FakeRegistry::start(
        &[(REPO, "1", vec![("amd64", Some(ENTRYPOINT.to_vec()), None)])],
        Faults {
            // serde quotes a string found where an object belongs.
            manifest_body: Some(format!(r#"{{"schemaVersion":2,"config":"{MARKER}"}}"#).into()),
            ..Default::default()
        },
    )
    .await;
    let logs = Logs::default();
    let writer = logs.clone();
    // The lookups run as tasks of this (current-thread) runtime, so they log here.
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .finish(),
    );
    let front = webhook(
        &lookup_config(&registry),
        Deps::offline().with_resolver(Arc::new(NameSource::all())),
    );
    let image = format!("{}/{REPO}:1", registry.host());
    let body = serde_json::to_vec(&create_review(&task_pod(&image), NS)).unwrap();
    let reply = front.review(Route::Secrets, &body).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, 200, "{text}");
    let resp = response(&reply.body);
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 400, "{resp}");
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(message.contains("container \"task\""), "{message}");
    assert!(message.contains(&image), "{message}");
    assert!(
        message.contains("not a valid image manifest, index, config or token response"),
        "{message}"
    );
    assert!(
        !text.contains(MARKER) && !text.contains("invalid type"),
        "the registry's text is in the reply: {text}"
    );
    let logged = logs.text();
    assert!(
        logged.contains(MARKER) && logged.contains(&image),
        "the log keeps the detail: {logged}"
    );
}

/// What the registry-lookup row of docs/security.md claims about hosts other than the listed
/// registry: the Bearer realm and a redirect to another host are contacted (they are not on
/// the list), but never with the registry's token, which goes to the registry's host only.
#[tokio::test]
async fn the_registry_token_goes_to_the_registry_host_only_not_to_its_realm_or_an_off_host_redirect()
 {
    // The same server answers as a second host: the blob storage the registry redirects to.
    let registry = FakeRegistry::start(
        &[(REPO, "1", vec![("amd64", Some(ENTRYPOINT.to_vec()), None)])],
        Faults {
            bearer: true,
            redirect_blobs: true,
            redirect_host: Some(ECR_HOST.into()),
            ..Default::default()
        },
    )
    .await;
    let storage = format!("{ECR_HOST}:{}", registry.port);
    let cfg = lookup_config(&registry);
    let client =
        podmutator_aws::registry::client::RegistryClient::new(&cfg.embedded.entrypoint_lookup)
            .unwrap()
            .resolving(ECR_HOST, "127.0.0.1".parse().unwrap());
    let front = webhook(
        &cfg,
        Deps::offline()
            .with_resolver(Arc::new(NameSource::all()))
            .with_entrypoints(Arc::new(client)),
    );
    let image = format!("{}/{REPO}:1", registry.host());
    let resp = answer(
        &front,
        Route::Secrets,
        &create_review(&task_pod(&image), NS),
    )
    .await;
    assert_eq!(resp["allowed"], true, "{resp}");

    let exchanges = registry.exchanges();
    let bearer = format!("Bearer {REGISTRY_TOKEN}");
    let on = |pred: &dyn Fn(&str) -> bool| -> Vec<_> {
        exchanges
            .iter()
            .filter(|e| pred(&e.request))
            .cloned()
            .collect()
    };
    let realm = on(&|r| r.starts_with("GET /token"));
    let stored = on(&|r| r.starts_with("GET /storage/"));
    let registry_calls = on(&|r| r.starts_with("GET /v2/"));
    assert_eq!(realm.len(), 1, "{exchanges:?}");
    assert_eq!(
        stored.len(),
        1,
        "the blob came from the other host: {exchanges:?}"
    );
    assert_eq!(stored[0].host, storage, "{exchanges:?}");
    for e in realm.iter().chain(&stored) {
        assert_eq!(e.authorization, None, "{e:?}");
    }
    assert!(
        registry_calls
            .iter()
            .any(|e| e.authorization.as_deref() == Some(bearer.as_str())
                && e.host == registry.host()),
        "the token is used on the registry's host: {exchanges:?}"
    );
    assert!(
        registry_calls.iter().all(|e| e.host == registry.host()),
        "{exchanges:?}"
    );
}
