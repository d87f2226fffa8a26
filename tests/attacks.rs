//! Attacks on the webhook, one test each, named after what the attacker tries. The security
//! model in `docs/security.md` names these tests; each fails if its hole comes back.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use lambda_http::request::LambdaRequest;
use podmutator::transport::lambda::handle;
use podmutator::transport::server::Limits;
use podmutator_core::config::Config;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "attack-test-token-0123456789abcdefghij";

fn config(v: Value) -> Config {
    Config::from_value(v).unwrap().config
}

fn review_bytes() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap()
}

/// Reads what the server sends until it closes or `limit` passes; `None` if it stayed open.
async fn read_until_closed<S: AsyncReadExt + Unpin>(s: &mut S, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + limit;
    loop {
        let left = end.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn a_caller_without_the_token_gets_404_before_sending_its_body() {
    // No deadline fires in the test's lifetime: a server waiting for the body would never
    // answer, and the guard (a hang) fails it.
    let s = start_server(
        &config(json!({"http": {"pathToken": TOKEN}})),
        patient_limits(),
    )
    .await;
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    // Announce a large body and send none of it: the answer must come from the head alone.
    tls.write_all(
        b"POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(120), tls.read(&mut buf))
        .await
        .expect("answered without the body (nothing in 120 s)")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_guessed_token_gets_404_and_the_right_one_is_admitted() {
    let s = start_server(
        &config(json!({"http": {"pathToken": TOKEN}})),
        Limits::default(),
    )
    .await;
    let body = review_bytes();
    let wrong = format!("/{}X/mutate--v1-pod", &TOKEN[..TOKEN.len() - 1]);
    for path in ["/mutate--v1-pod", wrong.as_str(), "/healthz"] {
        let (status, _) = https_request(
            s.port,
            &s.ca,
            "localhost",
            "POST",
            path,
            Some("application/json"),
            &body,
        )
        .await
        .unwrap();
        assert_eq!(status, 404, "{path}");
    }
    let (status, reply) = https_request(
        s.port,
        &s.ca,
        "localhost",
        "POST",
        &format!("/{TOKEN}/mutate--v1-pod"),
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(response(&reply)["patch"].is_string());
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn a_forged_lambda_event_without_the_token_is_refused() {
    // `aws lambda invoke` with a hand-made event reaches the function without the endpoint:
    // the token check in the function is what stops it.
    let front = webhook(
        &config(json!({"http": {"pathTokenSha256": hex_sha256(TOKEN)}})),
        Deps::offline(),
    );
    let mut event = read_json(&root().join("events/apigw-http-mutate.json"));
    let event_for =
        |event: &Value| -> LambdaRequest { serde_json::from_value(event.clone()).unwrap() };
    let reply = handle(&front, event_for(&event)).await;
    assert_eq!(reply.status(), 404);
    let with_token = format!("/{TOKEN}/mutate--v1-pod");
    event["rawPath"] = json!(with_token);
    let reply = handle(&front, event_for(&event)).await;
    assert_eq!(reply.status(), 200);
}

#[tokio::test]
async fn slow_loris_headers_are_cut_off_at_the_header_timeout() {
    // Only the header deadline can close the connection: every other limit is an hour.
    let limits = Limits {
        header_read: Duration::from_millis(500),
        ..patient_limits()
    };
    let s = start_server(&config(json!({})), limits).await;
    // Taken before the connection exists, so the deadline cannot have started earlier.
    let started = Instant::now();
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    tls.write_all(b"POST /mutate--v1-pod HTTP/1.1\r\nHost: local")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    // One byte now and then keeps a naive server waiting forever; the guard only ends a hang.
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if tls.write_all(b"h").await.is_err() || tls.flush().await.is_err() {
            closed = true;
            break;
        }
        if let Some(rest) = read_until_closed(&mut tls, Duration::from_millis(10)).await {
            let text = String::from_utf8_lossy(&rest);
            assert!(
                text.is_empty() || text.starts_with("HTTP/1.1 408"),
                "{text}"
            );
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "the connection was still open after 120 s of trickled headers"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "closed before the header deadline: {:?}",
        started.elapsed()
    );
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

/// The body has a deadline of its own (`http.bodyTimeoutSeconds`), apart from the admission's.
#[tokio::test]
async fn a_body_that_never_arrives_gets_408_at_the_body_timeout() {
    // Only the body deadline can answer: every other limit is an hour.
    let limits = Limits {
        body: Duration::from_millis(700),
        ..patient_limits()
    };
    let s = start_server(&config(json!({})), limits).await;
    let mut tls = tls_connect(s.port, &s.ca).await.unwrap();
    tls.write_all(
        b"POST /mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"a\":",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    // Without the body deadline the request would wait for ever (nothing else fires): the
    // guard ends only that hang. The reply names the limit that fired.
    let out = read_until_closed(&mut tls, Duration::from_secs(120))
        .await
        .expect("answered within 120 s");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("http.bodyTimeoutSeconds"), "{text}");
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn ten_thousand_idle_connections_do_not_take_the_server_down() {
    // No deadline closes a connection (the real client's handshake included, however slow the
    // machine): only eviction of the idlest can make room.
    let limits = Limits {
        max_connections: 256,
        ..patient_limits()
    };
    let s = start_server(&config(json!({})), limits).await;
    // Open 10,000 TCP connections that never start TLS, and hold them.
    let port = s.port;
    let attackers = tokio::spawn(async move {
        let mut held = Vec::with_capacity(10_000);
        let mut refused = 0usize;
        for _ in 0..10_000 {
            match tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            {
                Ok(Ok(c)) => held.push(c),
                _ => refused += 1,
            }
        }
        (held, refused)
    });
    let (held, refused) = attackers.await.unwrap();
    assert!(
        held.len() >= 1000,
        "only {} connections opened ({refused} refused)",
        held.len()
    );
    // While they are held, a real client still gets its answer: idle connections are closed to
    // make room, and the accept loop keeps running. The guard ends only a hang.
    let started = Instant::now();
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(300),
        https_request(s.port, &s.ca, "localhost", "GET", "/healthz", None, b""),
    )
    .await
    .expect("served within 300 s while 10,000 connections idle")
    .unwrap();
    assert_eq!(status, 200);
    let during = started.elapsed();
    drop(held);
    let (status, _) = https_request(s.port, &s.ca, "localhost", "GET", "/healthz", None, b"")
        .await
        .unwrap();
    assert_eq!(status, 200);
    eprintln!(
        "idle-connection attack: {} held, {refused} not accepted by the kernel; a real client waited {during:?}",
        10_000 - refused
    );
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[test]
fn the_binary_will_not_serve_without_a_path_token_unless_told_to() {
    let out = crate::common::bin()
        .arg("serve")
        .env(
            "PODMUTATOR_CONFIG",
            r#"{"http": {"listenAddress": "127.0.0.1"}}"#,
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.pathTokenSha256"), "{stderr}");
    assert!(stderr.contains("http.pathTokenDisabled"), "{stderr}");
}

// ---- What one request may cost, and whose secrets a pod may get ----

mod secrets_attacks {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::common::*;
    use podmutator_core::config::Config;
    use podmutator_core::mutate::Route;
    use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
    use podmutator_core::secrets::global::GlobalSecretSource;
    use podmutator_core::secrets::source::{
        Api, BoxFuture, Fetched, SecretSource, SecretValue, SourceError, StaticSource,
    };
    use serde_json::{Value, json};

    const NS: &str = "flytesnacks-development";
    const EXECUTOR: &str = "system:serviceaccount:flyte:flyte-executor";
    const PLACEHOLDER: &str = "<podmutator: value withheld from dry run>";

    fn id(org: &str, domain: &str, project: &str, key: &str) -> String {
        format!("u__org__{org}__domain__{domain}__project__{project}__key__{key}")
    }

    /// Embedded (plus Global, always first) with `extra` sections merged in.
    fn config(extra: Value) -> Config {
        let mut v = json!({"webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS"}
        }, "embedded": {"organization": "flyte"}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        if v["embedded"].get("organization").is_none() {
            v["embedded"]["organization"] = json!("flyte");
        }
        Config::from_value(v).unwrap().config
    }

    fn secret(group: &str, key: &str, mount: MountRequirement, env_var: &str) -> Secret {
        Secret {
            group: group.into(),
            key: key.into(),
            mount_requirement: mount,
            env_var: env_var.into(),
            ..Default::default()
        }
    }

    fn pod(secrets: &[Secret], project: &str, domain: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "task-pod",
                "labels": {
                    "inject-flyte-secrets": "true",
                    "organization": "flyte",
                    "project": project,
                    "domain": domain
                },
                "annotations": encode_annotations(secrets).unwrap()
            },
            "spec": {"containers": [{"name": "main", "image": "flytekit:latest"}]}
        })
    }

    async fn admit_as(
        app: &Front,
        pod: &Value,
        namespace: &str,
        username: &str,
        dry_run: bool,
    ) -> (u16, Value) {
        let mut review = create_review(pod, namespace);
        review["request"]["userInfo"]["username"] = json!(username);
        review["request"]["dryRun"] = json!(dry_run);
        let reply = app
            .review(Route::Secrets, &serde_json::to_vec(&review).unwrap())
            .await;
        (reply.status, response(&reply.body))
    }

    async fn admit(app: &Front, pod: &Value, namespace: &str) -> (u16, Value) {
        admit_as(app, pod, namespace, EXECUTOR, false).await
    }

    fn app(config: &Config, source: &StaticSource) -> Front {
        webhook(
            config,
            Deps::offline().with_source(Arc::new(StaticSource {
                values: source.values.clone(),
                calls: Arc::clone(&source.calls),
            })),
        )
    }

    fn denied(status: u16, resp: &Value, code: u16, reason: &str) -> String {
        assert_eq!(status, 200, "{resp}");
        assert_eq!(resp["allowed"], false, "{resp}");
        assert_eq!(resp["status"]["code"], code, "{resp}");
        assert_eq!(resp["auditAnnotations"]["denial-reason"], reason, "{resp}");
        resp["status"]["message"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn a_pod_with_more_secret_requests_than_the_cap_is_denied_before_any_fetch() {
        let source = StaticSource::default();
        let front = app(&config(json!({})), &source);
        let many: Vec<Secret> = (0..65)
            .map(|i| secret("", &format!("k{i}"), MountRequirement::EnvVar, ""))
            .collect();
        let (status, resp) = admit(&front, &pod(&many, "flytesnacks", "development"), NS).await;
        let msg = denied(status, &resp, 400, "TooManySecretRequests");
        assert!(msg.contains("65 secret requests"), "{msg}");
        assert!(
            msg.contains("cap of 64 (limits.maxSecretRequestsPerPod)"),
            "{msg}"
        );
        assert_eq!(source.calls.load(Ordering::Relaxed), 0, "nothing fetched");
        // At the cap the pod is planned and fetched (one call for its 192 ids).
        let (status, resp) =
            admit(&front, &pod(&many[..64], "flytesnacks", "development"), NS).await;
        assert_eq!(status, 200);
        assert_eq!(
            resp["auditAnnotations"]["denial-reason"], "SecretNotInjected",
            "{resp}"
        );
        assert_eq!(source.calls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_pod_needing_more_secret_ids_than_the_cap_is_denied_before_any_fetch() {
        let source =
            StaticSource::default().with(&id("flyte", "development", "flytesnacks", "a"), "x");
        let front = app(
            &config(json!({"limits": {"maxSecretIdsPerAdmission": 5}})),
            &source,
        );
        // Two Embedded requests try 3 ids each: 6 > 5.
        let two = [
            secret("", "a", MountRequirement::EnvVar, ""),
            secret("", "b", MountRequirement::EnvVar, ""),
        ];
        let (status, resp) = admit(&front, &pod(&two, "flytesnacks", "development"), NS).await;
        let msg = denied(status, &resp, 400, "TooManySecretIds");
        assert!(msg.contains("6 AWS Secrets Manager ids"), "{msg}");
        assert!(
            msg.contains("cap of 5 per admission (limits.maxSecretIdsPerAdmission)"),
            "{msg}"
        );
        assert_eq!(source.calls.load(Ordering::Relaxed), 0, "nothing fetched");
        let (status, resp) = admit(&front, &pod(&two[..1], "flytesnacks", "development"), NS).await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    }

    #[tokio::test]
    async fn a_namespace_that_reads_as_two_projects_gives_neither_its_secrets() {
        // `{{ project }}-{{ domain }}` renders ml-pre + prod and ml + pre-prod to one namespace.
        let source = StaticSource::default()
            .with(&id("flyte", "prod", "ml-pre", "k"), "ml-pre-secret")
            .with(&id("flyte", "pre-prod", "ml", "k"), "ml-secret");
        let req = [secret("", "k", MountRequirement::EnvVar, "")];
        // Flyte's domains: "prod" is none of them, so the claim is refused.
        let front = app(&config(json!({})), &source);
        let (status, resp) = admit(&front, &pod(&req, "ml-pre", "prod"), "ml-pre-prod").await;
        let msg = denied(status, &resp, 403, "EmbeddedScopeMismatch");
        assert!(msg.contains("is not one of embedded.domains"), "{msg}");
        // Both domains configured: the namespace has two readings, and both are refused.
        let both = config(json!({"embedded": {"domains": ["prod", "pre-prod"]}}));
        let front = app(&both, &source);
        for (project, domain) in [("ml-pre", "prod"), ("ml", "pre-prod")] {
            let (status, resp) = admit(&front, &pod(&req, project, domain), "ml-pre-prod").await;
            let msg = denied(status, &resp, 403, "EmbeddedScopeAmbiguous");
            assert!(msg.contains("project=\"ml-pre\" domain=\"prod\""), "{msg}");
            assert!(msg.contains("project=\"ml\" domain=\"pre-prod\""), "{msg}");
            assert!(msg.contains("embedded.domains"), "{msg}");
        }
        assert_eq!(source.calls.load(Ordering::Relaxed), 0, "nothing fetched");
        // A namespace with one reading still gets its own secret, and only its own.
        let (status, resp) = admit(&front, &pod(&req, "ml", "pre-prod"), "ml-prod").await;
        let msg = denied(status, &resp, 403, "EmbeddedScopeMismatch");
        assert!(msg.contains("belong to namespace \"ml-pre-prod\""), "{msg}");
        let source = StaticSource::default().with(&id("flyte", "prod", "ml", "k"), "ml-secret");
        let front = app(&both, &source);
        let (status, resp) = admit(&front, &pod(&req, "ml", "prod"), "ml-prod").await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
    }

    #[test]
    fn a_namespace_template_without_the_domain_is_refused_at_start() {
        for t in ["{{ project }}", "{{ organization }}-{{ project }}", "fixed"] {
            let err =
                Config::from_value(json!({"embedded": {"namespaceTemplate": t}})).unwrap_err();
            assert_eq!(err.key, "embedded.namespaceTemplate", "{t}");
            assert!(err.message.contains("{{ domain }}"), "{err}");
        }
        let err =
            Config::from_value(json!({"embedded": {"domains": ["development", "development"]}}))
                .unwrap_err();
        assert_eq!(err.key, "embedded.domains");
        Config::from_value(
            json!({"embedded": {"namespaceTemplate": "{{ domain }}-{{ project }}"}}),
        )
        .expect("a template with the domain loads");
        Config::from_value(json!({"embedded": {"namespaceTemplate": ""}}))
            .expect("an empty template turns the binding off");
    }

    /// A source that answers as `inner` does once the gate opens, and says when a fetch has
    /// reached it.
    struct Gated {
        inner: StaticSource,
        reached: tokio::sync::Notify,
        open: tokio::sync::Semaphore,
    }

    impl SecretSource for Gated {
        fn fetch_many<'a>(
            &'a self,
            ids: &'a [String],
        ) -> BoxFuture<'a, Result<Fetched, SourceError>> {
            Box::pin(async move {
                self.reached.notify_one();
                drop(self.open.acquire().await);
                self.inner.fetch_many(ids).await
            })
        }
    }

    /// An app whose Embedded source holds `db` of flytesnacks-development, behind a gate that
    /// is closed: a review that asks for it is held in its fetch. The deadline is the most
    /// allowed, so that a stalled machine does not time the held fetch out while the test
    /// watches the others.
    fn gated_app(limits: Value) -> (Arc<Gated>, Arc<Front>) {
        let gated = Arc::new(Gated {
            inner: StaticSource::default().with(
                &id("flyte", "development", "flytesnacks", "db"),
                "sentinel-budget-value-51c9",
            ),
            reached: tokio::sync::Notify::new(),
            open: tokio::sync::Semaphore::new(0),
        });
        let cfg = config(json!({"limits": limits, "embedded": {"deadlineMs": 25000}}));
        let front = Arc::new(webhook(&cfg, Deps::offline().with_source(gated.clone())));
        (gated, front)
    }

    /// The review of a task pod asking for `db`, with `containers` containers.
    fn db_review(containers: usize) -> Vec<u8> {
        let mut p = pod(
            &[secret("", "db", MountRequirement::EnvVar, "")],
            "flytesnacks",
            "development",
        );
        let containers: Vec<Value> = (0..containers)
            .map(|i| json!({"name": format!("c{i}"), "image": "flytekit:latest"}))
            .collect();
        p["spec"]["containers"] = json!(containers);
        executor_review(&p)
    }

    fn executor_review(p: &Value) -> Vec<u8> {
        let mut review = create_review(p, NS);
        review["request"]["userInfo"]["username"] = json!(EXECUTOR);
        serde_json::to_vec(&review).unwrap()
    }

    /// `review_in_budget` of `body`, on a task of its own.
    fn admit_in_budget(
        front: &Arc<Front>,
        body: Vec<u8>,
    ) -> tokio::task::JoinHandle<podmutator_core::admission::Answer> {
        let front = front.clone();
        tokio::spawn(async move { front.review_in_budget(Route::Secrets, &body).await })
    }

    /// Opens the gate; both held reviews are then admitted.
    async fn open_and_admit_both(
        gated: &Gated,
        first: tokio::task::JoinHandle<podmutator_core::admission::Answer>,
        second: tokio::task::JoinHandle<podmutator_core::admission::Answer>,
    ) {
        gated.open.add_permits(1);
        for answer in [first.await.unwrap(), second.await.unwrap()] {
            let resp = response(&answer.body);
            assert_eq!(
                (answer.status, &resp["allowed"]),
                (200, &json!(true)),
                "{resp}"
            );
        }
    }

    /// `serve` admits at once reviews that weigh together at most what one review may
    /// (`limits.maxObjectsPerReview`), so that many large reviews sent at once cannot exceed a
    /// replica's memory: two reviews of more than half that weight are admitted one after the
    /// other. The first is held in its fetch; the second waits for its share, fetching nothing,
    /// until the first ends.
    #[tokio::test]
    async fn reviews_weighing_more_than_one_review_may_are_admitted_one_after_the_other() {
        let (gated, front) = gated_app(json!({"maxObjectsPerReview": 1000}));
        // 70 containers, each counted as 8 objects: more than half of 1000.
        let body = db_review(70);
        let weight = front.app().weight(&body);
        assert!((501..=1000).contains(&weight), "{weight}");
        let first = admit_in_budget(&front, body.clone());
        gated.reached.notified().await;
        let second = admit_in_budget(&front, body);
        // The second waits for its share, or reaches the source: whichever comes first.
        while front.admissions_waiting() == 0 {
            tokio::select! {
                biased;
                () = gated.reached.notified() => panic!("the second review fetched while the first held more than half the budget"),
                () = tokio::task::yield_now() => {}
            }
        }
        assert_eq!(
            gated.inner.calls.load(Ordering::Relaxed),
            0,
            "nothing fetched yet"
        );
        open_and_admit_both(&gated, first, second).await;
        assert_eq!(front.admissions_waiting(), 0);
        // Each fetched for itself: the second only once the first had ended.
        assert_eq!(gated.inner.calls.load(Ordering::Relaxed), 2);
    }

    /// The queue of large reviews never holds up an ordinary one: while one review of more than
    /// half of `limits.maxObjectsPerReview` (the default) is held in its fetch and another waits
    /// for its share, an ordinary review is admitted and answered. And what counts is the
    /// bytes too, not only the objects: a review of strings weighs by its size.
    #[tokio::test]
    async fn a_queue_of_large_reviews_does_not_hold_up_an_ordinary_one() {
        let (gated, front) = gated_app(json!({}));
        let budget = front.app().max_objects();
        // 6,300 containers, each counted as 8 objects: more than half the default budget.
        let large = db_review(6_300);
        assert!(front.app().weight(&large) > budget / 2);
        let ordinary = executor_review(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "plain", "labels": {"inject-flyte-secrets": "true"}},
            "spec": {"containers": [{"name": "main", "image": "flytekit:latest"}]}}));
        assert!(front.app().weight(&ordinary) <= budget / 64);
        // 3 MB of empty strings: a handful of objects, as much memory as the largest reviews.
        let mut strings = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s"},
            "spec": {"containers": [{"name": "main", "image": "i"}]}});
        strings["spec"]["containers"][0]["args"] = json!(vec![""; 1_000_000]);
        let strings = executor_review(&strings);
        assert!(
            front.app().weight(&strings) >= 3_000_000 / 64,
            "weighed by its bytes"
        );

        let first = admit_in_budget(&front, large.clone());
        gated.reached.notified().await;
        let second = admit_in_budget(&front, large);
        while front.admissions_waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let answer = front.review_in_budget(Route::Secrets, &ordinary).await;
        assert_eq!(answer.status, 200);
        assert_eq!(response(&answer.body)["allowed"], true);
        assert_eq!(
            front.admissions_waiting(),
            1,
            "the second large review still waits"
        );
        open_and_admit_both(&gated, first, second).await;
    }

    /// A Global source that holds every group/key it is asked for.
    struct Everything;

    impl GlobalSecretSource for Everything {
        fn get(&self, group: &str, key: &str) -> Result<String, String> {
            Ok(format!("global-value-of-{group}-{key}"))
        }
    }

    #[tokio::test]
    async fn a_dry_run_gets_placeholders_and_nothing_is_fetched() {
        let value = "sentinel-dry-run-value-7f3a";
        let source = StaticSource::default()
            .with(&id("flyte", "development", "flytesnacks", "db"), value)
            .with(&id("flyte", "development", "flytesnacks", "cert"), value);
        let cfg = config(json!({}));
        let front = webhook(
            &cfg,
            Deps::offline()
                .with_global(Box::new(Everything))
                .with_source(Arc::new(StaticSource {
                    values: source.values.clone(),
                    calls: Arc::clone(&source.calls),
                })),
        );
        let reqs = [
            secret("", "db", MountRequirement::EnvVar, ""),
            secret("", "cert", MountRequirement::File, ""),
            secret("g", "k", MountRequirement::EnvVar, ""),
        ];
        let p = pod(&reqs, "flytesnacks", "development");
        let (status, resp) = admit_as(&front, &p, NS, EXECUTOR, true).await;
        assert_eq!((status, &resp["allowed"]), (200, &json!(true)), "{resp}");
        assert_eq!(
            source.calls.load(Ordering::Relaxed),
            0,
            "a dry run fetches nothing"
        );
        let dry = apply(&p, &patch_of(&resp));
        let text = dry.to_string();
        assert!(!text.contains(value), "{text}");
        assert!(!text.contains("global-value-of"), "{text}");
        let env = &dry["spec"]["containers"][0]["env"];
        let of = |name: &str| {
            env.as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == name)
                .unwrap_or_else(|| panic!("no {name} in {env}"))["value"]
                .clone()
        };
        assert_eq!(of("_UNION_DB"), PLACEHOLDER);
        assert_eq!(of("_UNION_G_K"), PLACEHOLDER);
        use base64::Engine;
        let line = format!(
            "cert={}\n",
            base64::engine::general_purpose::STANDARD.encode(PLACEHOLDER)
        );
        assert!(text.contains(&line.replace('\n', "\\n")), "{text}");
        let warnings = resp["warnings"].to_string();
        assert!(
            warnings.contains("dry run: secret values were withheld"),
            "{resp}"
        );
        // The real create gets the values (and the same names and paths).
        let (_, resp) = admit_as(&front, &p, NS, EXECUTOR, false).await;
        let real = apply(&p, &patch_of(&resp)).to_string();
        assert!(real.contains(value));
        assert!(resp.get("warnings").is_none(), "{resp}");
        assert_eq!(source.calls.load(Ordering::Relaxed), 1);
    }

    /// Reference delivery reads no value, dry run or not: its dry run says nothing was
    /// withheld, and its pod names the same secrets as the real create's.
    #[tokio::test]
    async fn a_reference_dry_run_withholds_nothing_so_it_warns_of_nothing() {
        let names = StaticSource::default()
            .with(&id("flyte", "development", "flytesnacks", "db"), "unused")
            .with(&id("flyte", "development", "flytesnacks", "cert"), "unused");
        let cfg = config(json!({"embedded": {
            "organization": "flyte",
            "delivery": "reference",
            "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        }}));
        let front = webhook(&cfg, Deps::offline().with_resolver(Arc::new(names)));
        let reqs = [
            secret("", "db", MountRequirement::EnvVar, ""),
            secret("", "cert", MountRequirement::File, ""),
        ];
        let mut p = pod(&reqs, "flytesnacks", "development");
        p["spec"]["containers"][0]["command"] = json!(["python", "task.py"]);
        let (status, dry) = admit_as(&front, &p, NS, EXECUTOR, true).await;
        assert_eq!((status, &dry["allowed"]), (200, &json!(true)), "{dry}");
        assert!(dry.get("warnings").is_none(), "{dry}");
        let dry_pod = apply(&p, &patch_of(&dry));
        assert!(!dry_pod.to_string().contains(PLACEHOLDER), "{dry_pod}");
        let (_, real) = admit_as(&front, &p, NS, EXECUTOR, false).await;
        assert_eq!(dry_pod, apply(&p, &patch_of(&real)));
    }

    #[test]
    fn a_global_env_prefix_that_captures_the_functions_credentials_is_refused_at_start() {
        for prefix in [
            "",
            "A",
            "AW",
            "AWS_",
            "AWS_SECRET_",
            "PODMUTATOR_",
            "LAMBDA_",
            "_HANDLER",
            "_",
        ] {
            let err =
                Config::from_value(json!({"secrets": {"env-prefix": prefix}})).expect_err(prefix);
            assert_eq!(err.key, "secrets.env-prefix", "{prefix:?}");
            assert!(err.message.contains("FLYTE_SECRET_"), "{err}");
        }
        Config::from_value(json!({"secrets": {"env-prefix": "MY_GLOBAL_"}}))
            .expect("an unrelated prefix loads");
    }

    /// A Global secrets directory that also holds what is not the pods' to read (the process's
    /// environment under `/proc/self/environ`, a service account token under `/run/secrets`,
    /// every file from the root) is refused at start; Flyte's default and a directory of its
    /// own load.
    #[test]
    fn a_global_secrets_directory_that_holds_the_processes_own_files_is_refused_at_start() {
        for prefix in [
            "/",
            "/proc",
            "/proc/self",
            "/run",
            "/run/secrets",
            "/var/run/secrets/kubernetes.io",
            "/sys",
            "/dev",
            "/etc",
            "/var",
            "/root",
            "/root/.aws",
            "/var/lib/kubelet/pods",
            "/var/task",
            "/etc/secrets/../..",
            "etc/secrets",
        ] {
            let err = Config::from_value(json!({"secrets": {"secrets-prefix": prefix}}))
                .expect_err(prefix);
            assert_eq!(err.key, "secrets.secrets-prefix", "{prefix:?}");
            assert!(err.message.contains("/etc/secrets"), "{err}");
        }
        for prefix in ["/etc/secrets", "/mnt/global-secrets", "/secrets"] {
            Config::from_value(json!({"secrets": {"secrets-prefix": prefix}})).expect(prefix);
        }
    }

    #[tokio::test]
    async fn a_user_outside_allowed_usernames_gets_no_global_secret() {
        let cfg = Config::from_value(json!({
            "webhook": {"secretManagerTypes": ["K8s"]},
            "embedded": {"allowedUsernames": ["system:serviceaccount:flyte:*"]}
        }))
        .unwrap()
        .config;
        /// Holds one Global secret, g/k.
        struct One;
        impl GlobalSecretSource for One {
            fn get(&self, group: &str, key: &str) -> Result<String, String> {
                ((group, key) == ("g", "k"))
                    .then(|| "global-secret".to_owned())
                    .ok_or_else(|| "not held".into())
            }
        }
        let front = webhook(&cfg, Deps::offline().with_global(Box::new(One)));
        let global = pod(
            &[secret("g", "k", MountRequirement::EnvVar, "")],
            "p",
            "development",
        );
        let (status, resp) = admit_as(&front, &global, "p-development", "alice", false).await;
        let msg = denied(status, &resp, 403, "GlobalUserNotAllowed");
        assert!(msg.contains("embedded.allowedUsernames"), "{msg}");
        assert!(!resp.to_string().contains("global-secret"));
        // The allowed user gets it; alice still gets what Global does not serve (a K8s Secret).
        let (_, resp) = admit_as(&front, &global, "p-development", EXECUTOR, false).await;
        assert_eq!(resp["allowed"], true, "{resp}");
        let k8s = pod(
            &[secret("other", "k", MountRequirement::EnvVar, "")],
            "p",
            "development",
        );
        let (_, resp) = admit_as(&front, &k8s, "p-development", "alice", false).await;
        assert_eq!(resp["allowed"], true, "{resp}");
    }

    /// Fails every fetch the way AWS does when the role may not read the secret.
    struct AccessDenied;

    const ACCOUNT: &str = "123456789012";

    impl SecretSource for AccessDenied {
        fn fetch_many<'a>(
            &'a self,
            ids: &'a [String],
        ) -> BoxFuture<'a, Result<Fetched, SourceError>> {
            Box::pin(async move {
                // As AwsSource reports it: the code from the error's metadata, the service's
                // own text (account, role, ARN) as the source.
                Err(SourceError::Call {
                    api: Api::BatchGetSecretValue,
                    ids: ids.join(", "),
                    code: "AccessDeniedException".to_owned(),
                    source: format!(
                        "service error: AccessDeniedException: User: arn:aws:sts::{ACCOUNT}:assumed-role/podmutator-fn-role/podmutator is not authorized to perform: secretsmanager:BatchGetSecretValue on resource: arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:x"
                    )
                    .into(),
                })
            })
        }
    }

    #[tokio::test]
    async fn an_aws_error_naming_the_account_and_role_reaches_the_log_not_the_reply() {
        let logs = Logs::default();
        let writer = logs.clone();
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_max_level(tracing::Level::ERROR)
                .finish(),
        );
        let front = webhook(
            &config(json!({})),
            Deps::offline().with_source(Arc::new(AccessDenied)),
        );
        let p = pod(
            &[secret("", "db", MountRequirement::EnvVar, "")],
            "flytesnacks",
            "development",
        );
        let (status, resp) = admit(&front, &p, NS).await;
        assert_eq!(status, 500, "{resp}");
        let msg = resp["status"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&id("flyte", "development", "flytesnacks", "db")),
            "{msg}"
        );
        assert!(
            msg.contains("AccessDeniedException (details in the function's log)"),
            "{msg}"
        );
        let reply = resp.to_string();
        for leak in ["arn:", ACCOUNT, "podmutator-fn-role"] {
            assert!(!reply.contains(leak), "{leak} in {reply}");
        }
        let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert!(
            logged.contains(&format!("arn:aws:sts::{ACCOUNT}:assumed-role")),
            "{logged}"
        );
    }

    const RULE: &str = "printable ASCII characters other than '='";

    /// Every manager that writes an env var refuses a name the API server would refuse,
    /// naming the annotation and the rule, before anything is fetched.
    #[tokio::test]
    async fn a_secret_whose_env_var_name_the_api_server_would_refuse_is_denied_naming_the_rule() {
        let source = StaticSource::default();
        let cases: Vec<(&str, Value, Box<dyn GlobalSecretSource>, Secret)> = vec![
            (
                "Embedded env_var with '='",
                json!(["Embedded"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret("", "db", MountRequirement::EnvVar, "A=B"),
            ),
            (
                "Embedded key with a control character",
                json!(["Embedded"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret("", "d\u{1}b", MountRequirement::Any, ""),
            ),
            (
                "Embedded FILE env_var with a tab",
                json!(["Embedded"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret("", "db", MountRequirement::File, "DB\tPATH"),
            ),
            (
                "Global group beyond ASCII",
                json!(["K8s"]),
                Box::new(Everything),
                secret("gr\u{fc}p", "k", MountRequirement::EnvVar, ""),
            ),
            (
                "K8s env_var with a newline",
                json!(["K8s"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret("g", "k", MountRequirement::Any, "X\nY"),
            ),
            (
                "K8s group with '='",
                json!(["K8s"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret("a=b", "k", MountRequirement::EnvVar, ""),
            ),
            (
                "AWS sidecar env_var",
                json!(["AWS"]),
                Box::new(podmutator_core::secrets::global::NoGlobalSecrets),
                secret(
                    "arn:aws:secretsmanager:us-east-1:1:secret:",
                    "db",
                    MountRequirement::Any,
                    "A=B",
                ),
            ),
        ];
        for (what, types, global, s) in cases {
            let cfg = Config::from_value(json!({"webhook": {
                "secretManagerTypes": types,
                "embeddedSecretManagerConfig": {"type": "AWS"}
            }, "embedded": {"organization": "flyte"}}))
            .unwrap()
            .config;
            let front = webhook(
                &cfg,
                Deps::offline()
                    .with_global(global)
                    .with_source(Arc::new(StaticSource {
                        values: BTreeMap::<String, SecretValue>::new(),
                        calls: Arc::clone(&source.calls),
                    })),
            );
            let (status, resp) = admit(&front, &pod(&[s], "flytesnacks", "development"), NS).await;
            assert_eq!(status, 200, "{what}: {resp}");
            assert_eq!(resp["allowed"], false, "{what}: {resp}");
            assert_eq!(resp["status"]["code"], 400, "{what}: {resp}");
            let msg = resp["status"]["message"].as_str().unwrap();
            assert!(msg.contains("flyte.secrets/s0"), "{what}: {msg}");
            assert!(msg.contains(RULE), "{what}: {msg}");
        }
        assert_eq!(source.calls.load(Ordering::Relaxed), 0, "nothing fetched");
    }
}

/// The oracle: whoever can send the webhook a review (the path token leaked, or a caller inside
/// the network) forges one for a pod asking for every scope's secrets. Against a value
/// deployment the reply carries the values; against a `reference` deployment, built with no
/// value source at all (as its role has no value-reading action), it carries names only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_review_to_a_reference_deployment_gets_names_only() {
    use common::aws::{Moto, client, create_secret};
    use podmutator_aws::resolve::DescribeSource;
    use podmutator_aws::secretsmanager::{AwsSource, CachePolicy, CachingSource};
    use podmutator_core::mutate::Route;
    use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
    use std::sync::Arc;

    let moto = Moto::start();
    let setup = client(&moto.url()).await;
    let stored = [
        (
            "u__org__flyte__domain__development__project__flytesnacks__key__db",
            "SENTINEL-2b9d6e10-project-db",
            MountRequirement::File,
        ),
        (
            "u__org__flyte__domain__development__project____key__tok",
            "SENTINEL-2b9d6e10-domain-tok",
            MountRequirement::Any,
        ),
        (
            "u__org__flyte__domain____project____key__api",
            "SENTINEL-2b9d6e10-org-api",
            MountRequirement::EnvVar,
        ),
    ];
    let mut secrets = Vec::new();
    for (name, value, mount) in stored {
        create_secret(&setup, name, value).await;
        secrets.push(Secret {
            key: name.rsplit("__").next().unwrap().into(),
            mount_requirement: mount,
            ..Default::default()
        });
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "forged",
            "labels": {"inject-flyte-secrets": "true", "organization": "flyte", "project": "flytesnacks", "domain": "development"},
            "annotations": encode_annotations(&secrets).unwrap()
        },
        "spec": {"containers": [{"name": "main", "image": "x", "command": ["sleep", "1"]}]}
    });
    let review = serde_json::to_vec(&create_review(&pod, "flytesnacks-development")).unwrap();
    let sentinels: Vec<(&str, &str)> = stored.iter().map(|(n, v, _)| (*n, *v)).collect();
    let embedded = |extra: Value| {
        let mut v = json!({"webhook": {
            "secretManagerTypes": ["Embedded"],
            "embeddedSecretManagerConfig": {"type": "AWS", "awsConfig": {"region": "us-east-1"}}
        }});
        v["embedded"] = extra;
        v["embedded"]["organization"] = json!("flyte");
        // Moto is slow on a loaded machine; the deadline is not what this test is about.
        v["embedded"]["deadlineMs"] = json!(25000);
        config(v)
    };

    // Control: the same forged review against a value deployment gets every value.
    let value = embedded(json!({}));
    let source = AwsSource::new(client(&moto.url()).await, 20);
    let app = webhook(&value, Deps::offline().with_source(Arc::new(source)));
    let reply = app.review(Route::Secrets, &review).await;
    assert_eq!(reply.status, 200);
    let hits = leaks::find(&reply.body, &sentinels);
    for (name, _) in &sentinels {
        assert!(
            hits.iter().any(|h| h.starts_with(name)),
            "the control should leak {name}: {hits:?}"
        );
    }

    // The reference deployment: metadata calls only, and no value source to call.
    let reference = embedded(json!({
        "delivery": "reference",
        "fetcherImage": "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
    }));
    let resolver = CachingSource::new(
        DescribeSource::new(client(&moto.url()).await),
        CachePolicy::from_config(&reference.embedded),
    );
    let app = webhook(
        &reference,
        Deps::offline().with_resolver(Arc::new(resolver)),
    );
    let reply = app.review(Route::Secrets, &review).await;
    assert_eq!(reply.status, 200);
    let resp = response(&reply.body);
    assert_eq!(resp["allowed"], true, "{resp}");
    let hits = leaks::find(&reply.body, &sentinels);
    assert!(hits.is_empty(), "a value reached the forger: {hits:?}");
    let out = apply(&pod, &patch_of(&resp)).to_string();
    for (name, _) in &sentinels {
        assert!(out.contains(name), "the reply names {name}");
    }
}
#[path = "attacks/config_files.rs"]
mod config_files;
#[path = "attacks/images.rs"]
mod images;
#[path = "attacks/lockout.rs"]
mod lockout;
#[path = "attacks/names.rs"]
mod names;
#[path = "attacks/org.rs"]
mod org;
#[path = "attacks/pod.rs"]
mod pod;
#[path = "attacks/public_endpoint.rs"]
mod public_endpoint;
#[path = "attacks/refusals.rs"]
mod refusals;
#[path = "attacks/reply_cost.rs"]
mod reply_cost;
#[path = "attacks/serve.rs"]
mod serve;
#[path = "attacks/serve_values.rs"]
mod serve_values;
#[path = "attacks/token.rs"]
mod token;
