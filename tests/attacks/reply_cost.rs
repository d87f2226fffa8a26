//! Hole 4 of issue 36: a review's cost was unbounded until after it was built. Each of up to
//! 64 secret requests is written into every container, and nothing bounded containers × items
//! before the patch existed: one 1 MB review made a 273 MB reply in `serve` (peak RSS over
//! 700 MB against the Deployment's 256Mi limit), and in Lambda the 413 came only after the
//! same memory was spent (against the 256 MB the IaC gives the function). Now the reply's size
//! is estimated once the secrets are planned, before anything is fetched or injected, and a
//! review whose reply would not fit the path back is refused then. Peak memory of the real
//! binary is measured (VmHWM) for the worst shapes.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use serde_json::{Value, json};

use super::TOKEN;
use crate::common::runtime_api::{Seen, runtime_api};
use crate::common::*;

/// The Deployment's memory limit (deploy/kubernetes/base/deployment.yaml) and the function's
/// default MemorySize (Terraform, SAM) are 256 MiB each; the peak must leave a quarter of it
/// spare, measured on the debug binary these tests run (which starts some 20 MB heavier than
/// the release build) over the worst reviews one after another, fragmentation included.
const BUDGET: u64 = 192 << 20;

/// A CREATE review of `containers` one-line containers and 64 requests (the per-pod cap) of
/// `mount`, each group and key name `pad` characters longer than the shortest (`g00`, `k00`).
fn wide_review(containers: usize, mount: MountRequirement, pad: usize) -> Vec<u8> {
    let secrets: Vec<Secret> = (0..64)
        .map(|i| Secret {
            group: format!("g{i:02}{}", "a".repeat(pad)),
            key: format!("k{i:02}{}", "b".repeat(pad)),
            mount_requirement: mount,
            ..Default::default()
        })
        .collect();
    let containers: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i:06}"), "image": "b"}))
        .collect();
    let review = create_review(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "wide", "labels": {"inject-flyte-secrets": "true"},
                "annotations": encode_annotations(&secrets).unwrap()},
            "spec": {"containers": containers}}),
        "flytesnacks-development",
    );
    serde_json::to_vec(&review).unwrap()
}

/// [`wide_review`] with long valid names (63 characters).
fn worst_review(containers: usize, mount: MountRequirement) -> Vec<u8> {
    wide_review(containers, mount, 60)
}

/// [`wide_review`] of ENV_VAR requests with the shortest names: the estimate made before the
/// patch is built is under the limit, the patch built is over it (each container's 64 env vars,
/// about 90 bytes each with their references).
fn short_names_review(containers: usize) -> Vec<u8> {
    wide_review(containers, MountRequirement::EnvVar, 0)
}

/// A child process killed when dropped: a failed assertion leaves no server running.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The containers of a review of at most `bytes` ([`worst_review`]'s take 30 bytes each).
fn filling(bytes: usize) -> usize {
    (bytes - 16_384) / 32
}

/// A review of one container asking for 64 ENV_VAR secrets, whose pod also holds `volumes`
/// volumes and `env` env vars: the heaviest shapes within the object limit that are admitted.
fn heavy_but_admitted(volumes: usize, env: usize) -> Vec<u8> {
    let secrets: Vec<Secret> = (0..64)
        .map(|i| Secret {
            group: format!("g{i:02}"),
            key: format!("k{i:02}"),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        })
        .collect();
    let env: Vec<Value> = (0..env)
        .map(|i| json!({"name": format!("E{i:06}")}))
        .collect();
    let volumes: Vec<Value> = (0..volumes)
        .map(|i| json!({"name": format!("v{i:06}"), "emptyDir": {}}))
        .collect();
    let review = create_review(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "heavy", "labels": {"inject-flyte-secrets": "true"},
                "annotations": encode_annotations(&secrets).unwrap()},
            "spec": {"containers": [{"name": "main", "image": "b", "env": env}], "volumes": volumes}}),
        "flytesnacks-development",
    );
    serde_json::to_vec(&review).unwrap()
}

/// The peak resident memory of process `pid` (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// The answer of `serve` on `port` to `review`, sent as the API server sends it.
async fn review_through(port: u16, ca: &[u8], review: &[u8]) -> Value {
    review_on(port, ca, "mutate--v1-pod", review).await
}

/// The UPDATE of [`heavy_but_admitted`]'s pod that adds a label: the pod twice.
fn heavy_update(volumes: usize, env: usize) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&heavy_but_admitted(volumes, env)).unwrap();
    let request = &mut review["request"];
    request["operation"] = json!("UPDATE");
    request["oldObject"] = request["object"].clone();
    request["object"]["metadata"]["labels"]["team"] = json!("a");
    serde_json::to_vec(&review).unwrap()
}

/// `serve` on a free port of 127.0.0.1, with its CA, as the memory tests run it: the K8s
/// manager and the image builder (registered for UPDATE: its reviews carry the pod twice), one
/// worker thread.
async fn measured_serve(name: &str) -> (Killed, u16, Vec<u8>) {
    let dir = temp_dir(name);
    let port = free_port();
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator", "secretManagerTypes": ["K8s"],
            "imageBuilderConfig": {"enabled": true, "hostnameReplacement": {"existing": "e.example", "replacement": "r.example", "disableVerification": true}}},
        // The 6 MB review is sent from a machine that may be loaded: the body deadline (another
        // test's subject) must not be what answers it.
        "http": {"listenAddress": "127.0.0.1", "pathToken": TOKEN, "bodyTimeoutSeconds": 300}
    });
    let (child, _) = spawn_serve(
        crate::common::bin()
            .arg("serve")
            .env("PODMUTATOR_CONFIG", config.to_string())
            // One worker: what each review costs, one after another. With two, which thread
            // frees what the other allocated decides how much mimalloc keeps, and on a loaded
            // machine the same reviews peaked anywhere from 146 to 206 MB (137 to 143 with one).
            .env("TOKIO_WORKER_THREADS", "1"),
    )
    .await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    (Killed(child), port, ca)
}

/// Reviews that would slip objects past `limits.maxObjectsPerReview` ([`smuggled_reviews`]):
/// the weight of an UPDATE lies in what is read of its two pods, and an error is located by
/// reading the review whole only when all of it is within the limit. Each was read into types
/// unweighed (peaks of 250 MB to over 1 GB); a fresh `serve` answers them one after another
/// within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_that_would_slip_objects_past_the_count_are_refused_within_a_replicas_memory() {
    let (child, port, ca) = measured_serve("attack-reply-cost-smuggled").await;
    for (n, (path, review, refused_as)) in smuggled_reviews().into_iter().enumerate() {
        let (status, body) = https_request(
            port,
            &ca,
            "localhost",
            "POST",
            &format!("/{TOKEN}/{path}"),
            Some("application/json"),
            &review,
        )
        .await
        .unwrap();
        let reply: Value = serde_json::from_slice(&body).unwrap();
        let response = &reply["response"];
        assert_eq!(response["allowed"], false, "review {n}: {status} {reply}");
        match refused_as {
            Some(reason) => assert_eq!(
                response["auditAnnotations"]["denial-reason"], reason,
                "review {n}: {response}"
            ),
            None => assert_eq!(response["status"]["code"], 400, "review {n}: {response}"),
        }
        let peak = peak_rss(child.0.id());
        eprintln!("review {n}, {} bytes: peak RSS {peak}", review.len());
        assert!(
            peak < BUDGET,
            "review {n} ({} bytes) took the peak to {peak} bytes",
            review.len()
        );
    }
}

/// Reviews of up to 3.3 MB whose objects a weight of the review's bytes would miss, with the
/// entry each is sent to and its denial reason (`None`: invalid, code 400): an UPDATE of
/// 40,000 containers, each only a name and an image, in each pod; an UPDATE whose pods of
/// 100,000 volumes each were read again whole to locate a broken field after them; a CREATE
/// whose `oldObject` of 150,000 volumes (read only down to its metadata) was read whole to
/// locate what breaks the `object` after it; an UPDATE whose `metadata` key is escaped, over
/// 1.1 million `managedFields`. Written as text, not with `create_review`: they carry escaped
/// keys and broken fields that no typed builder writes.
fn smuggled_reviews() -> Vec<(&'static str, Vec<u8>, Option<&'static str>)> {
    let list = |n: usize, item: &str| vec![item; n].join(",");
    let review = |op: &str, pods: &str| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"namespace":"ns","operation":"{op}","userInfo":{{}},{pods}}}}}"#
        )
        .into_bytes()
    };
    let pod = |meta: &str, spec: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p"{meta}}},"spec":{spec}}}"#
        )
    };
    let named = list(40_000, r#"{"name":"c","image":"r.example/app:1"}"#);
    let (old, new) = (
        pod("", &format!(r#"{{"containers":[{named}]}}"#)),
        pod(
            "",
            &format!(
                r#"{{"containers":[{}]}}"#,
                named.replacen("app:1", "app:2", 1)
            ),
        ),
    );
    let volumes = |n: usize| {
        pod(
            "",
            &format!(
                r#"{{"containers":[],"volumes":[{}]}}"#,
                list(n, r#"{"name":"v"}"#)
            ),
        )
    };
    let (stored, created) = (volumes(100_000), volumes(150_000));
    let selected = pod(
        r#","labels":{"inject-flyte-secrets":"true"}"#,
        r#"{"containers":5}"#,
    );
    let escaped = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","m\u0065tadata":{{"name":"p","managedFields":[{}]}},"spec":{{"containers":[]}}}}"#,
        list(1_100_000, "{}")
    );
    vec![
        (
            "mutate--v1-pod/image-builder",
            review("UPDATE", &format!(r#""object":{new},"oldObject":{old}"#)),
            Some("TooManyObjects"),
        ),
        (
            "mutate--v1-pod",
            review(
                "UPDATE",
                &format!(r#""object":{stored},"oldObject":{stored},"dryRun":"x""#),
            ),
            None,
        ),
        (
            "mutate--v1-pod",
            review(
                "CREATE",
                &format!(r#""oldObject":{created},"object":{selected}"#),
            ),
            None,
        ),
        (
            "mutate--v1-pod/image-builder",
            review(
                "UPDATE",
                &format!(r#""object":{escaped},"oldObject":{}"#, pod("", "{}")),
            ),
            Some("TooManyObjects"),
        ),
    ]
}

/// The answer of `serve` on `port` to `review` on entry `path`.
async fn review_on(port: u16, ca: &[u8], path: &str, review: &[u8]) -> Value {
    let (status, body) = https_request(
        port,
        ca,
        "localhost",
        "POST",
        &format!("/{TOKEN}/{path}"),
        Some("application/json"),
        review,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// A 413 denial of the review for `reason`, whose message says `says`.
fn assert_refused(reply: &Value, reason: &str, says: &[&str]) {
    let response = &reply["response"];
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 413, "{response}");
    assert_eq!(response["status"]["reason"], "RequestEntityTooLarge");
    assert_eq!(response["auditAnnotations"]["denial-reason"], reason);
    let message = response["status"]["message"].as_str().unwrap();
    for s in says {
        assert!(message.contains(s), "{s}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_reviews_are_refused_within_a_replicas_memory() {
    let (child, port, ca) = measured_serve("attack-reply-cost").await;
    let mut peaks = Vec::new();
    // Within the object limit, a reply that would be far over http.maxReplyBytes (11,500
    // containers × 64 requests), ENV_VAR and FILE; over it, an ALB's whole request (1 MB, some
    // 32,000 containers) and the body limit (6 MB).
    let estimated = ["estimated before its patch was built", "http.maxReplyBytes"];
    let objects = ["JSON objects", "limits.maxObjectsPerReview"];
    for (containers, mount, reason, says) in [
        (
            11_500,
            MountRequirement::EnvVar,
            "ResponseTooLarge",
            &estimated[..],
        ),
        (
            11_500,
            MountRequirement::File,
            "ResponseTooLarge",
            &estimated[..],
        ),
        (
            filling(1 << 20),
            MountRequirement::EnvVar,
            "TooManyObjects",
            &objects[..],
        ),
        (
            filling(6 << 20),
            MountRequirement::EnvVar,
            "TooManyObjects",
            &objects[..],
        ),
    ] {
        let review = worst_review(containers, mount);
        let reply = review_through(port, &ca, &review).await;
        assert_refused(&reply, reason, says);
        assert_eq!(
            reply["response"]["uid"], "e911857d-c318-11e8-bbad-025000000001",
            "answers this review"
        );
        peaks.push((review.len(), containers, mount, peak_rss(child.0.id())));
    }
    // Under the estimate, over the limit once built: measured on the reply built, and refused
    // with the same 413 (the patch is some 11 MB against http.maxReplyBytes' 6 MB).
    let review = short_names_review(1_360);
    let reply = review_through(port, &ca, &review).await;
    assert_refused(
        &reply,
        "ResponseTooLarge",
        &["a JSON Patch of", "http.maxReplyBytes"],
    );
    peaks.push((
        review.len(),
        1_360,
        MountRequirement::EnvVar,
        peak_rss(child.0.id()),
    ));
    // The heaviest pods within the limit are admitted, and mutated, within the same memory:
    // 5,500 volumes (each a 3 KB type, with its emptyDir), then 90,000 env vars in one container.
    for (volumes, env) in [(5_500, 0), (0, 90_000)] {
        let review = heavy_but_admitted(volumes, env);
        let reply = review_through(port, &ca, &review).await;
        assert_eq!(
            reply["response"]["allowed"], true,
            "{}",
            reply["response"]["status"]
        );
        assert!(reply["response"]["patch"].is_string());
        peaks.push((
            review.len(),
            volumes.max(env),
            MountRequirement::EnvVar,
            peak_rss(child.0.id()),
        ));
    }
    // Each updated on the image builder's entry (registered for UPDATE), which reads both
    // pods down to their containers' names and images.
    for (volumes, env) in [(5_500, 0), (0, 90_000)] {
        let review = heavy_update(volumes, env);
        let reply = review_on(port, &ca, "mutate--v1-pod/image-builder", &review).await;
        assert_eq!(
            reply["response"]["allowed"], true,
            "{}",
            reply["response"]["status"]
        );
        peaks.push((
            review.len(),
            volumes.max(env),
            MountRequirement::EnvVar,
            peak_rss(child.0.id()),
        ));
    }
    drop(child);
    eprintln!("serve, peak RSS after each review (cumulative): {peaks:?}");
    for (len, containers, mount, peak) in &peaks {
        assert!(
            *peak < BUDGET,
            "serve: a {len}-byte review ({containers} containers, {mount:?}) took the peak to {peak} bytes"
        );
    }

    // The Lambda loop, one instance per review: 11,500 containers × 64 requests through an ALB
    // event (refused against the ALB's 1 MB before it is built); through an HTTP API event
    // (Lambda's 6 MB), the short names' patch (refused once built) and the heaviest pod that is
    // admitted (90,000 env vars in one container).
    let cases = [
        (
            "events/alb-mutate.json",
            worst_review(11_500, MountRequirement::EnvVar),
            Some(&["estimated before its patch was built", "an ALB"][..]),
        ),
        (
            "events/apigw-http-mutate.json",
            short_names_review(1_360),
            Some(&["a JSON Patch of", "Lambda puts on a function's response"][..]),
        ),
        (
            "events/apigw-http-mutate.json",
            heavy_but_admitted(0, 90_000),
            None,
        ),
    ];
    for (event_file, review, refused) in cases {
        let (answer, peak) = through_the_lambda_loop(event_file, &review).await;
        match refused {
            Some(says) => assert_refused(&answer, "ResponseTooLarge", says),
            None => assert_eq!(
                answer["response"]["allowed"], true,
                "{}",
                answer["response"]["status"]
            ),
        }
        eprintln!(
            "lambda, {event_file}, a {}-byte review: peak RSS {peak}",
            review.len()
        );
        assert!(
            peak < BUDGET,
            "lambda: a {}-byte review through {event_file} took the peak to {peak} bytes",
            review.len()
        );
    }
}

/// `review` as the body of the Lambda event in `event_file` (base64), answered by a fresh
/// `podmutator lambda` through a loopback Runtime API: the admission's answer and the
/// instance's peak RSS once it has answered.
async fn through_the_lambda_loop(event_file: &str, review: &[u8]) -> (Value, u64) {
    use base64::Engine;
    let mut event: Value =
        serde_json::from_slice(&std::fs::read(root().join(event_file)).unwrap()).unwrap();
    event["body"] = json!(base64::engine::general_purpose::STANDARD.encode(review));
    event["isBase64Encoded"] = json!(true);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api = runtime_api(event.to_string(), seen.clone()).await;
    let mut lambda = Killed(
        crate::common::bin()
            .arg("lambda")
            .env(
                "PODMUTATOR_CONFIG",
                json!({"http": {"pathTokenDisabled": true}}).to_string(),
            )
            .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{api}"))
            .env("AWS_LAMBDA_FUNCTION_NAME", "podmutator")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_REGION", "us-east-1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Until the response is posted (or the instance exits, which fails below).
    while seen.lock().unwrap().responses.is_empty() {
        assert!(
            lambda.0.try_wait().unwrap().is_none(),
            "the instance exited without a response: {:?}",
            seen.lock().unwrap().errors
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peak = peak_rss(lambda.0.id());
    drop(lambda);
    let reply: Value = serde_json::from_str(&seen.lock().unwrap().responses[0]).unwrap();
    assert_eq!(reply["statusCode"], 200);
    let answer: Value = serde_json::from_str(reply["body"].as_str().unwrap()).unwrap();
    (answer, peak)
}
