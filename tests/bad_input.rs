//! The bad-input corpus (`tests/fixtures/bad-input/`, format in its README): every case goes
//! through the real entry point, `App::handle` or, for Lambda events, `lambda::handle` after
//! the runtime's own `serde_json::from_slice::<LambdaRequest>`, and must get its expected status
//! and message, a well-formed JSON reply (an AdmissionReview on review routes), no panic, and
//! an answer whose work (allocations and bytes allocated, counted on the test's thread) is
//! linear in the bytes in and out ([`within_work_bound`]).
//!
//! Events the runtime cannot deserialise never reach our code: they are kept (the runtime must
//! fail them without a panic) but do not count toward the corpus' size. Every branch of
//! `src/transport/lambda.rs`, `src/transport/http.rs` and `crates/core/src/admission.rs` that input can reach must be reached
//! by some case, as shown by evidence in its reply ([`branches`]).
//!
//! Times in release are not asserted here (a debug build on a shared machine cannot give steady
//! milliseconds): `scripts/bench-bad-input.sh` runs [`release_timings`] alone, in release, and
//! reports every case against its budget.

use crate::common;

use crate::harness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::work::{self, Work};
use common::{Deps, Front, Incoming, root, webhook};
use k8s_openapi::api::core::v1::Pod;
use lambda_http::request::LambdaRequest;
use podmutator_core::config::Config;
use serde::Deserialize;
use serde_json::{Value, json};

/// The release budget of one case, checked by [`release_timings`]
/// (`scripts/bench-bad-input.sh`). A case may set its own (`budgetMs`) only when the README's
/// Performance section reports it as a missed target.
const BUDGET_MS: u64 = 100;

fn budget(case: &Case) -> Duration {
    Duration::from_millis(case.budget_ms.unwrap_or(BUDGET_MS))
}

/// The corpus must not shrink by accident: cases that reach our code (events the runtime
/// rejects before it do not count).
const MIN_CASES: usize = 138;

/// Work bound of one case: bytes allocated at most `BYTES_PER_BYTE` times the bytes in and out
/// plus `FIXED_BYTES`, and allocations at most `ALLOCATIONS_PER_KIB` per KiB in and out plus
/// `FIXED_ALLOCATIONS`. Linear in the input, so a super-linear path (a pod cloned per secret
/// request: 10,000 annotations then allocate 8 GB, 200 times this bound) fails it whatever the
/// machine's load. The factors are about four times what the corpus needs today (`--nocapture`
/// prints the heaviest cases: 35 bytes per byte for 10,000 containers, 450 allocations per KiB
/// for 10,000 secret annotations, each a few small strings and map nodes). Work that allocates
/// nothing (a quadratic scan) is not counted here: `scripts/bench-bad-input.sh` times it.
const BYTES_PER_BYTE: u64 = 150;
const FIXED_BYTES: u64 = 4 << 20;
const ALLOCATIONS_PER_KIB: u64 = 2_000;
const FIXED_ALLOCATIONS: u64 = 20_000;

fn within_work_bound(work: Work, bytes_in_and_out: usize) -> Result<(), String> {
    let n = bytes_in_and_out as u64;
    let max_bytes = BYTES_PER_BYTE * n + FIXED_BYTES;
    let max_allocations = ALLOCATIONS_PER_KIB * n / 1024 + FIXED_ALLOCATIONS;
    if work.bytes > max_bytes || work.allocations > max_allocations {
        return Err(format!(
            "{work} for {n} bytes in and out, over the linear bound ({max_allocations} \
             allocations, {max_bytes} bytes)"
        ));
    }
    Ok(())
}

fn corpus_dir() -> PathBuf {
    root().join("tests/fixtures/bad-input")
}

/// One `*.json` file under `tests/fixtures/bad-input/<category>/`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// What the case shows, in words.
    claim: String,
    /// Config merged over the defaults (`{}`), e.g. `{"http": {"pathToken": ...}}`.
    #[serde(default)]
    config: Option<Value>,
    /// The HTTP request line and content type (`App::handle` cases).
    #[serde(default)]
    request: Request,
    /// The body, for `App::handle` cases.
    #[serde(default)]
    body: Option<BodySpec>,
    /// A Lambda event instead of an HTTP request.
    #[serde(default)]
    event: Option<EventSpec>,
    expect: Expect,
    /// This case's release budget in ms, when it is over the usual 100 (see [`budget`]).
    #[serde(default, rename = "budgetMs")]
    budget_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Request {
    method: String,
    path: String,
    /// `null` sends no content type.
    content_type: Option<String>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            method: "POST".into(),
            path: "/mutate--v1-pod".into(),
            content_type: Some("application/json".into()),
        }
    }
}

/// How to build a body. Exactly one source (`file`, `text`, `review` or `nest` alone); then, in
/// this order, `set`, `remove`, `containers`, `secretAnnotations`, `fill` edit the review, it is
/// serialised compactly, `nest` is spliced in and `padTo` appends spaces.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BodySpec {
    /// Raw bytes, relative to the case file.
    file: Option<String>,
    text: Option<String>,
    /// A review fixture, relative to `tests/fixtures/bad-input/`.
    review: Option<String>,
    /// JSON pointer -> new value (the parent must exist).
    #[serde(default)]
    set: BTreeMap<String, Value>,
    #[serde(default)]
    remove: Vec<String>,
    /// Replaces the containers with `count` copies of the first one.
    containers: Option<Copies>,
    /// Replaces the annotations with `flyte.secrets/s0` .. `s<count-1>`, all `s0`'s value.
    secret_annotations: Option<usize>,
    /// Sets the string at `at` to `bytes` times `char`.
    fill: Option<Fill>,
    /// `depth` times `open`, then `close`: the whole body, or spliced in as the value at `at`.
    nest: Option<Nest>,
    /// Appends spaces (valid JSON whitespace) up to this many bytes.
    pad_to: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Copies {
    count: usize,
    /// Suffix each copy's name with its index (otherwise all share the first one's name).
    unique_names: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fill {
    at: String,
    bytes: usize,
    #[serde(default = "fill_char")]
    char: char,
}

fn fill_char() -> char {
    'a'
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Nest {
    at: Option<String>,
    open: String,
    close: String,
    depth: usize,
    /// What sits at the bottom of the nesting (default: nothing).
    #[serde(default)]
    inner: String,
}

/// A Lambda event: one of `events/*.json` (`file`, relative to the crate root) with edits, or
/// raw `text`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventSpec {
    file: Option<String>,
    text: Option<String>,
    /// Replaces the event's body: as base64 when the event says `isBase64Encoded`, else as text.
    body: Option<BodySpec>,
    /// Applied after `body`.
    #[serde(default)]
    set: BTreeMap<String, Value>,
    #[serde(default)]
    remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Expect {
    /// HTTP status (absent only with `rejectedByRuntime`).
    status: Option<u16>,
    /// A substring of `response.status.message` (reviews) or `message` (other replies).
    message: Option<String>,
    /// `response.allowed` of a review reply.
    #[serde(default)]
    allowed: bool,
    /// `response.status.code` when it differs from the HTTP status (denials: 400 or 403).
    code: Option<u16>,
    /// `response.auditAnnotations.denial-reason`.
    denial_reason: Option<String>,
    /// Whether the reply carries a patch (only checked when set).
    patched: Option<bool>,
    /// A substring of one of `response.warnings` (what `kubectl` prints for an admitted pod).
    warning: Option<String>,
    /// The reply's `apiVersion` (only checked when set).
    api_version: Option<String>,
    /// The Lambda runtime cannot deserialise the event (the invocation fails; no panic).
    #[serde(default)]
    rejected_by_runtime: bool,
}

/// Replaces the value at `pointer` (creating the last member), or removes it.
fn edit(doc: &mut Value, pointer: &str, value: Option<Value>) {
    let (parent, key) = pointer
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("bad pointer {pointer:?}"));
    let key = key.replace("~1", "/").replace("~0", "~");
    let parent = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no parent for {pointer:?}"));
    match (parent, value) {
        (Value::Object(m), Some(v)) => {
            m.insert(key, v);
        }
        (Value::Object(m), None) => {
            m.remove(&key)
                .unwrap_or_else(|| panic!("nothing at {pointer:?}"));
        }
        (Value::Array(a), Some(v)) => a[key.parse::<usize>().expect("array index")] = v,
        (Value::Array(a), None) => {
            a.remove(key.parse::<usize>().expect("array index"));
        }
        (other, _) => panic!("{pointer:?}: parent is {other}"),
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Splices raw JSON text in as the value at `pointer` of `doc`.
fn splice(mut doc: Value, pointer: &str, raw: &str) -> Vec<u8> {
    const MARK: &str = "\u{1}splice-here\u{1}";
    edit(&mut doc, pointer, Some(json!(MARK)));
    let text = serde_json::to_string(&doc).expect("serialise");
    let quoted = serde_json::to_string(MARK).expect("serialise");
    assert_eq!(text.matches(&quoted).count(), 1);
    text.replacen(&quoted, raw, 1).into_bytes()
}

fn build_body(spec: &BodySpec, case_dir: &Path) -> Vec<u8> {
    let nest_text = |n: &Nest| {
        format!(
            "{}{}{}",
            n.open.repeat(n.depth),
            n.inner,
            n.close.repeat(n.depth)
        )
    };
    let mut bytes = if let Some(file) = &spec.file {
        read(&case_dir.join(file))
    } else if let Some(text) = &spec.text {
        text.clone().into_bytes()
    } else if let Some(review) = &spec.review {
        let mut doc: Value = serde_json::from_slice(&read(&corpus_dir().join(review)))
            .expect("review fixture is JSON");
        for (pointer, value) in &spec.set {
            edit(&mut doc, pointer, Some(value.clone()));
        }
        for pointer in &spec.remove {
            edit(&mut doc, pointer, None);
        }
        if let Some(c) = &spec.containers {
            let containers = doc
                .pointer_mut("/request/object/spec/containers")
                .expect("containers");
            let first = containers[0].clone();
            *containers = (0..c.count)
                .map(|i| {
                    let mut copy = first.clone();
                    if c.unique_names {
                        copy["name"] = json!(format!("{}-{i}", first["name"].as_str().unwrap()));
                    }
                    copy
                })
                .collect();
        }
        if let Some(count) = spec.secret_annotations {
            let annotations = doc
                .pointer_mut("/request/object/metadata/annotations")
                .expect("annotations");
            let value = annotations["flyte.secrets/s0"].clone();
            *annotations = (0..count)
                .map(|i| (format!("flyte.secrets/s{i}"), value.clone()))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        if let Some(f) = &spec.fill {
            edit(
                &mut doc,
                &f.at,
                Some(json!(f.char.to_string().repeat(f.bytes))),
            );
        }
        match &spec.nest {
            Some(n) => splice(doc, n.at.as_deref().expect("nest.at"), &nest_text(n)),
            None => serde_json::to_vec(&doc).expect("serialise"),
        }
    } else if let Some(n) = &spec.nest {
        assert!(n.at.is_none(), "nest.at needs a review");
        nest_text(n).into_bytes()
    } else {
        panic!("a body needs file, text, review or nest");
    };
    if let Some(len) = spec.pad_to {
        assert!(bytes.len() <= len, "body is already {} bytes", bytes.len());
        bytes.resize(len, b' ');
    }
    bytes
}

fn build_event(spec: &EventSpec, case_dir: &Path) -> Vec<u8> {
    if let Some(text) = &spec.text {
        return text.clone().into_bytes();
    }
    let file = spec.file.as_deref().expect("event needs file or text");
    let mut ev: Value = serde_json::from_slice(&read(&root().join(file))).expect("event is JSON");
    if let Some(body) = &spec.body {
        let bytes = build_body(body, case_dir);
        ev["body"] = if ev["isBase64Encoded"] == true {
            json!(base64::engine::general_purpose::STANDARD.encode(&bytes))
        } else {
            json!(String::from_utf8(bytes).expect("a text body must be UTF-8"))
        };
    }
    for (pointer, value) in &spec.set {
        edit(&mut ev, pointer, Some(value.clone()));
    }
    for pointer in &spec.remove {
        edit(&mut ev, pointer, None);
    }
    serde_json::to_vec(&ev).expect("serialise")
}

/// What came back for one case.
struct Outcome {
    /// `None`: the runtime rejected the event before our code ran.
    status: Option<u16>,
    body: Vec<u8>,
    elapsed: Duration,
    /// What our code did, counted on the thread that ran it.
    work: Work,
    /// Bytes in (the body or event) and out (the reply).
    bytes_in_and_out: usize,
    /// The event's source as the runtime parsed it (`rest`, `http`, `alb`), for events.
    source: Option<&'static str>,
    /// The Lambda reply as it goes on the wire, for events.
    wire: Option<Value>,
}

/// Runs the request or event of a case, off the test's task so that a panic is reported as
/// this case's failure instead of ending the run.
async fn run(app: Arc<Front>, case: &Case, case_dir: &Path) -> Result<Outcome, String> {
    if let Some(spec) = &case.event {
        let bytes = build_event(spec, case_dir);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let counted = work::now();
            let event = match serde_json::from_slice::<LambdaRequest>(&bytes) {
                Ok(event) => event,
                Err(e) => {
                    return Outcome {
                        status: None,
                        body: e.to_string().into_bytes(),
                        elapsed: started.elapsed(),
                        work: work::since(counted),
                        bytes_in_and_out: bytes.len(),
                        source: None,
                        wire: None,
                    };
                }
            };
            let source = match &event {
                LambdaRequest::ApiGatewayV1(_) => "rest",
                LambdaRequest::ApiGatewayV2(_) => "http",
                LambdaRequest::Alb(_) => "alb",
                _ => "other",
            };
            let reply = podmutator::transport::lambda::handle(&app, event).await;
            let wire = serde_json::to_value(&reply).expect("a Lambda reply serialises");
            let elapsed = started.elapsed();
            let work = work::since(counted);
            assert_eq!(wire["statusCode"], reply.status());
            // ALB with multi-value headers answers in multiValueHeaders only.
            let content_type = match wire["headers"].get("content-type") {
                Some(ct) => ct.clone(),
                None => wire["multiValueHeaders"]["content-type"][0].clone(),
            };
            assert_eq!(content_type, "application/json", "{wire}");
            Outcome {
                status: Some(u16::try_from(reply.status()).expect("HTTP status")),
                body: reply.body().to_vec(),
                elapsed,
                work,
                bytes_in_and_out: bytes.len() + reply.body().len(),
                source: Some(source),
                wire: Some(wire),
            }
        });
        return task.await.map_err(|e| format!("panicked: {e}"));
    }
    let body = build_body(case.body.as_ref().unwrap_or(&BodySpec::default()), case_dir);
    let Request {
        method,
        path,
        content_type,
    } = &case.request;
    let (method, path, content_type) = (method.clone(), path.clone(), content_type.clone());
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let counted = work::now();
        let reply = app
            .handle(Incoming {
                method: &method,
                path: &path,
                content_type: content_type.as_deref(),
                body: &body,
            })
            .await;
        let elapsed = started.elapsed();
        let work = work::since(counted);
        Outcome {
            status: Some(reply.status),
            bytes_in_and_out: body.len() + reply.body.len(),
            body: reply.body,
            elapsed,
            work,
            source: None,
            wire: None,
        }
    });
    task.await.map_err(|e| format!("panicked: {e}"))
}

/// Checks an outcome against the case's expectations; `Err` says what is wrong.
fn check(case: &Case, out: &Outcome) -> Result<(), String> {
    let e = &case.expect;
    let Some(status) = out.status else {
        return if e.rejected_by_runtime {
            Ok(())
        } else {
            Err(format!(
                "the runtime rejected the event: {}",
                String::from_utf8_lossy(&out.body)
            ))
        };
    };
    if e.rejected_by_runtime {
        return Err(format!(
            "expected the runtime to reject the event, got HTTP {status}"
        ));
    }
    let expected = e.status.ok_or("expect.status is missing")?;
    let v: Value = serde_json::from_slice(&out.body).map_err(|err| {
        format!(
            "reply is not JSON ({err}): {}",
            String::from_utf8_lossy(&out.body)
        )
    })?;
    let shown = || {
        let mut s = v.to_string();
        s.truncate(1500);
        s
    };
    if status != expected {
        return Err(format!("HTTP {status}, expected {expected}: {}", shown()));
    }
    let message = if v.get("response").is_some() {
        let r = std::panic::catch_unwind(|| harness::check_review_reply(status, &out.body))
            .map_err(|_| format!("malformed AdmissionReview reply: {}", shown()))?;
        if r.allowed != e.allowed {
            return Err(format!(
                "allowed is {}, expected {}: {}",
                r.allowed,
                e.allowed,
                shown()
            ));
        }
        let resp = &v["response"];
        if let Some(code) = e.code.or((!e.allowed).then_some(expected))
            && resp["status"]["code"] != code
        {
            return Err(format!("status.code is not {code}: {}", shown()));
        }
        if let Some(reason) = &e.denial_reason
            && resp["auditAnnotations"]["denial-reason"] != *reason
        {
            return Err(format!("denial-reason is not {reason}: {}", shown()));
        }
        if let Some(patched) = e.patched
            && r.patch.is_some() != patched
        {
            return Err(format!("patched should be {patched}: {}", shown()));
        }
        if let Some(needle) = &e.warning
            && !resp["warnings"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|w| w.as_str().is_some_and(|w| w.contains(needle.as_str())))
        {
            return Err(format!("no warning contains {needle:?}: {}", shown()));
        }
        if let Some(version) = &e.api_version
            && v["apiVersion"] != version.as_str()
        {
            return Err(format!("apiVersion is not {version}: {}", shown()));
        }
        resp["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    } else {
        // Only routing answers (not found, wrong method, health) are plain messages.
        if !matches!(status, 200 | 404 | 405) || !v["message"].is_string() {
            return Err(format!("expected an AdmissionReview: {}", shown()));
        }
        v["message"].as_str().unwrap_or_default().to_owned()
    };
    if let Some(needle) = &e.message
        && !message.contains(needle.as_str())
    {
        return Err(format!("message {message:?} lacks {needle:?}"));
    }
    Ok(())
}

/// Every case file, sorted: (category, name, path).
/// `BAD_INPUT_ONLY=<substring>` runs only the matching cases (for triage and profiling).
fn case_files() -> Vec<(String, String, PathBuf)> {
    let only = std::env::var("BAD_INPUT_ONLY").unwrap_or_default();
    let mut out = Vec::new();
    for dir in std::fs::read_dir(corpus_dir()).expect("corpus dir") {
        let dir = dir.expect("dir entry").path();
        if !dir.is_dir() || dir.file_name().is_some_and(|n| n == "bodies") {
            continue;
        }
        let category = dir.file_name().unwrap().to_string_lossy().into_owned();
        for path in common::json_files(&dir) {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if format!("{category}/{name}").contains(&only) {
                out.push((category.clone(), name, path));
            }
        }
    }
    out.sort();
    out
}

fn app_for(config: Option<&Value>, cache: &mut BTreeMap<String, Arc<Front>>) -> Arc<Front> {
    let config = config.cloned().unwrap_or_else(|| json!({}));
    cache
        .entry(config.to_string())
        .or_insert_with(|| {
            let loaded = Config::from_value(config).expect("case config is valid");
            // The core alone, with nothing from outside (not `common::webhook`): an Embedded
            // case meets the admission's own answer to a missing secret source.
            let app = common::App::build(&loaded.config, Deps::offline());
            Arc::new(Front::new(Arc::new(app), &loaded.config.http, None).expect("a front"))
        })
        .clone()
}

/// What one case showed: the outcome, its reply and what was sent.
struct Seen<'a> {
    case: &'a Case,
    out: &'a Outcome,
    /// The reply as JSON (`Null` if it is not).
    reply: Value,
    /// `response.status.message` of a review, or `message` of a routing answer.
    message: String,
    /// The event as sent, for Lambda cases.
    event: Option<Value>,
    /// The review body our code was given (the event's body, decoded), as bytes.
    review_bytes: Option<Vec<u8>>,
}

impl Seen<'_> {
    fn status(&self) -> u16 {
        self.out.status.unwrap_or_default()
    }
    fn has(&self, needle: &str) -> bool {
        self.message.contains(needle)
    }
    fn is_review(&self) -> bool {
        self.reply.get("response").is_some()
    }
    fn allowed(&self) -> bool {
        self.reply["response"]["allowed"] == true
    }
    fn patched(&self) -> bool {
        self.reply["response"]["patch"].is_string()
    }
    fn token(&self) -> Option<&str> {
        self.case.config.as_ref()?["http"]["pathToken"].as_str()
    }
    /// The request path of an HTTP case.
    fn http_path(&self) -> Option<&str> {
        self.event
            .is_none()
            .then_some(self.case.request.path.as_str())
    }
    fn http_content_type(&self) -> Option<&str> {
        self.event.is_none().then_some(())?;
        self.case.request.content_type.as_deref()
    }
    fn event_str(&self, pointer: &str) -> Option<&str> {
        self.event.as_ref()?.pointer(pointer)?.as_str()
    }
    fn event_base64(&self) -> bool {
        self.event
            .as_ref()
            .is_some_and(|e| e["isBase64Encoded"] == true)
    }
    fn event_content_type(&self) -> Option<&Value> {
        let e = self.event.as_ref()?;
        ["headers", "multiValueHeaders"].iter().find_map(|h| {
            e[h].as_object()?
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v)
        })
    }
    fn source(&self) -> Option<&str> {
        self.out.source
    }
    fn wire(&self, pointer: &str) -> Option<&Value> {
        self.out.wire.as_ref()?.pointer(pointer)
    }
    fn stage(&self) -> Option<&str> {
        self.event_str("/requestContext/stage")
    }
    fn named_stage(&self) -> Option<&str> {
        self.stage().filter(|s| *s != "$default")
    }
    /// The review our code read, parsed leniently (invalid UTF-8 replaced).
    fn review(&self) -> Option<Value> {
        let bytes = self.review_bytes.as_ref()?;
        serde_json::from_str(&String::from_utf8_lossy(bytes)).ok()
    }
    fn review_kind(&self) -> Option<String> {
        Some(
            self.review()?["request"]["kind"]["kind"]
                .as_str()?
                .to_owned(),
        )
    }
    fn review_is_a_typed_pod_review(&self) -> bool {
        self.review_bytes.as_ref().is_some_and(|b| {
            serde_json::from_slice::<kube_core::admission::AdmissionReview<Pod>>(b).is_ok()
        })
    }
    fn is_pod_create(&self) -> bool {
        self.review().is_some_and(|r| {
            let req = &r["request"];
            req["kind"]["kind"] == "Pod"
                && req["kind"]["group"] == ""
                && req["operation"] == "CREATE"
                && req["subResource"].is_null()
        })
    }
}

type Evidence = fn(&Seen<'_>) -> bool;

/// Every branch of our entry code that some input can reach, with the evidence in a reply that
/// the branch ran. Not listed, because no input reaches them: `lambda::handle`'s fallback arm
/// (the enum's other variants need `lambda_http` features we do not compile), `to_reply`'s
/// serialisation failure and the "failed to serialise" internal errors (plain structs always
/// serialise), a chain that reports a change the diff does not see, and the namespace taken
/// from the pod when the request has none (visible only in the audit line). `resolve`'s
/// fetch failure and deadline need a secret source: `tests/embedded.rs` covers them.
fn branches() -> Vec<(&'static str, Evidence)> {
    fn b(name: &'static str, evidence: Evidence) -> (&'static str, Evidence) {
        (name, evidence)
    }
    vec![
        // src/transport/lambda.rs
        b("lambda::handle: REST API event", |s| {
            s.source() == Some("rest")
        }),
        b("lambda::handle: HTTP API or Function URL event", |s| {
            s.source() == Some("http")
        }),
        b("lambda::handle: ALB event", |s| s.source() == Some("alb")),
        b("lambda::body_bytes: no body", |s| {
            s.event.as_ref().is_some_and(|e| e["body"].is_null()) && s.has("empty body")
        }),
        b("lambda::body_bytes: text body", |s| {
            s.event_str("/body").is_some_and(|b| !b.trim().is_empty())
                && !s.event_base64()
                && s.is_review()
                && !s.has("empty body")
        }),
        b("lambda::body_bytes: base64 body decoded", |s| {
            s.event_base64() && s.is_review() && !s.has("not valid base64")
        }),
        b("lambda::body_bytes: invalid base64", |s| {
            s.event_base64()
                && s.has("the event's body is marked isBase64Encoded but is not valid base64")
        }),
        b("lambda::content_type: no content-type header", |s| {
            s.event.is_some() && s.event_content_type().is_none() && s.has("got none")
        }),
        b(
            "lambda::content_type: a header that is not visible ASCII",
            |s| s.event_content_type().is_some() && s.has("got none"),
        ),
        b("lambda::rest: no path", |s| {
            s.source() == Some("rest") && s.event_str("/path").is_none() && s.status() == 404
        }),
        b(
            "lambda::http_api: named stage stripped from the path",
            |s| {
                s.named_stage().is_some_and(|stage| {
                    s.event_str("/rawPath")
                        .is_some_and(|p| p.starts_with(&format!("/{stage}/")))
                }) && s.status() != 404
            },
        ),
        b("lambda::http_api: named stage not in the path", |s| {
            s.named_stage().is_some_and(|stage| {
                s.event_str("/rawPath")
                    .is_some_and(|p| !p.starts_with(&format!("/{stage}")))
            }) && s.status() != 404
        }),
        b("lambda::http_api: path only starts like the stage", |s| {
            s.named_stage().is_some_and(|stage| {
                s.event_str("/rawPath").is_some_and(|p| {
                    p.strip_prefix(&format!("/{stage}"))
                        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
                })
            }) && s.status() == 404
        }),
        b("lambda::http_api: path is the stage alone", |s| {
            s.named_stage()
                .is_some_and(|stage| s.event_str("/rawPath") == Some(format!("/{stage}").as_str()))
                && s.status() == 404
        }),
        b("lambda::http_api: $default stage", |s| {
            s.stage() == Some("$default") && s.status() != 404
        }),
        b("lambda::http_api: no rawPath", |s| {
            s.source() == Some("http") && s.event_str("/rawPath").is_none() && s.status() == 404
        }),
        b("lambda::alb: single-value headers", |s| {
            s.source() == Some("alb")
                && s.wire("/headers/content-type")
                    .is_some_and(|v| v == "application/json")
        }),
        b("lambda::alb: multi-value headers", |s| {
            s.source() == Some("alb")
                && s.wire("/multiValueHeaders/content-type/0")
                    .is_some_and(|v| v == "application/json")
        }),
        b("lambda::alb: no path", |s| {
            s.source() == Some("alb") && s.event_str("/path").is_none() && s.status() == 404
        }),
        b("lambda::status_description: 200 OK", |s| {
            s.wire("/statusDescription").is_some_and(|d| d == "200 OK")
        }),
        b("lambda::status_description: 400 Bad Request", |s| {
            s.wire("/statusDescription")
                .is_some_and(|d| d == "400 Bad Request")
        }),
        b("lambda::status_description: 404 Not Found", |s| {
            s.wire("/statusDescription")
                .is_some_and(|d| d == "404 Not Found")
        }),
        b("lambda::status_description: 405 Method Not Allowed", |s| {
            s.wire("/statusDescription")
                .is_some_and(|d| d == "405 Method Not Allowed")
        }),
        b("lambda::status_description: any other status", |s| {
            s.wire("/statusDescription")
                .is_some_and(|d| d == "500 Internal Server Error")
        }),
        // src/transport/http.rs
        b("http::route_path: no path token", |s| {
            s.token().is_none() && s.status() != 404
        }),
        b("http::route_path: path token stripped", |s| {
            s.token().is_some() && s.status() != 404
        }),
        b("http::route_path: wrong path token", |s| {
            s.token().is_some()
                && s.http_path().is_some_and(|p| p.starts_with('/'))
                && s.status() == 404
        }),
        b("http::route_path: path without a leading slash", |s| {
            s.token().is_some()
                && s.http_path().is_some_and(|p| !p.starts_with('/'))
                && s.status() == 404
        }),
        b("http::dispatch: health check", |s| {
            s.status() == 200
                && s.reply == json!({"message": "ok", "version": env!("CARGO_PKG_VERSION")})
        }),
        b("http::dispatch: health check, wrong method", |s| {
            s.status() == 405 && s.has("use GET for /healthz")
        }),
        b("http::dispatch: Flyte's route", |s| {
            s.http_path()
                .is_some_and(|p| p.ends_with("/mutate--v1-pod"))
                && s.is_review()
        }),
        b("http::dispatch: managed-pod route", |s| {
            s.http_path()
                .is_some_and(|p| p.ends_with("/mutate/managed-pod"))
                && s.is_review()
        }),
        b("http::dispatch: managed-namespace route", |s| {
            s.http_path()
                .is_some_and(|p| p.ends_with("/mutate/managed-namespace"))
                && s.is_review()
        }),
        b("http::dispatch: unknown path", |s| {
            s.token().is_none() && s.status() == 404 && s.reply == json!({"message": "not found"})
        }),
        b("http::dispatch: not a POST", |s| {
            s.status() == 405 && s.has("the API server POSTs AdmissionReviews")
        }),
        b("http::dispatch: no content type", |s| {
            s.has("content-type must be application/json, got none")
        }),
        b("http::dispatch: another content type", |s| {
            s.has("content-type must be application/json, got \"")
        }),
        b("http::dispatch: JSON with parameters", |s| {
            s.http_content_type().is_some_and(|c| c.contains(';'))
                && s.is_review()
                && !s.has("content-type")
        }),
        b("http::dispatch: body over the limit", |s| {
            s.has("-byte limit (http.maxBodyBytes)")
        }),
        // crates/core/src/admission.rs
        b("admission::parse: empty or blank body", |s| {
            s.has("empty body: expected an AdmissionReview")
        }),
        b(
            "admission::parse: a Pod review with invalid UTF-8 where no type looks",
            |s| s.has("invalid UTF-8 at byte") && s.review_kind().as_deref() == Some("Pod"),
        ),
        b(
            "admission::parse: another kind's review with invalid UTF-8 where no type looks",
            |s| s.has("invalid UTF-8 at byte") && s.review_kind().is_some_and(|k| k != "Pod"),
        ),
        b(
            "admission::api_version_of: kind is not AdmissionReview",
            |s| s.has("expected \"AdmissionReview\""),
        ),
        b("admission::api_version_of: unsupported apiVersion", |s| {
            s.has("unsupported apiVersion")
        }),
        b("admission::api_version_of: admission.k8s.io/v1beta1", |s| {
            s.reply["apiVersion"] == "admission.k8s.io/v1beta1"
        }),
        b("admission::parse: no request", |s| {
            s.has("review has no request")
        }),
        b(
            "admission::parse: a pod CREATE whose object is no Pod",
            |s| s.has("request.object is not a valid Pod"),
        ),
        b("admission::parse: another kind, untyped", |s| {
            s.allowed()
                && !s.patched()
                && s.review_kind().is_some_and(|k| k != "Pod")
                && !s.review_is_a_typed_pod_review()
        }),
        b("admission::parse: not a review of any object", |s| {
            s.has("body is not a valid AdmissionReview")
        }),
        b("admission::located: error with its JSON path", |s| {
            s.has("body is not a valid AdmissionReview") && s.has(" (at ")
        }),
        b("admission::located: error without a path", |s| {
            s.has("body is not a valid AdmissionReview") && !s.has(" (at ")
        }),
        b("admission::admit: another kind, typed", |s| {
            s.allowed()
                && !s.patched()
                && s.review_kind().is_some_and(|k| k != "Pod")
                && s.review_is_a_typed_pod_review()
        }),
        b("admission::admit: not a CREATE", |s| {
            s.allowed()
                && !s.patched()
                && s.review().is_some_and(|r| {
                    r["request"]["kind"]["kind"] == "Pod" && r["request"]["operation"] != "CREATE"
                })
        }),
        b("admission::admit: a subresource", |s| {
            s.allowed()
                && !s.patched()
                && s.review()
                    .is_some_and(|r| r["request"]["subResource"].is_string())
        }),
        b("admission::admit: pod CREATE without an object", |s| {
            s.has("has no request.object")
        }),
        b("admission::resolve: values needed, no source", |s| {
            s.status() == 500 && s.has("no secret source is configured")
        }),
        b("admission::admit: denied by the chain", |s| {
            s.status() == 200 && s.is_review() && !s.allowed()
        }),
        b("admission::admit: nothing to change", |s| {
            s.allowed() && !s.patched() && s.is_pod_create()
        }),
        b("admission::admit: mutated", |s| s.patched()),
    ]
}

/// The review body our code gets from a Lambda event: its body, decoded when it says base64.
fn event_review_bytes(event: &Value) -> Option<Vec<u8>> {
    let body = event["body"].as_str()?;
    if event["isBase64Encoded"] == true {
        base64::engine::general_purpose::STANDARD.decode(body).ok()
    } else {
        Some(body.as_bytes().to_vec())
    }
}

fn seen<'a>(case: &'a Case, out: &'a Outcome, dir: &Path) -> Seen<'a> {
    let reply: Value = serde_json::from_slice(&out.body).unwrap_or(Value::Null);
    let message = reply["response"]["status"]["message"]
        .as_str()
        .or(reply["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    let event = case.event.as_ref().map(|spec| {
        serde_json::from_slice::<Value>(&build_event(spec, dir)).unwrap_or(Value::Null)
    });
    let review_bytes = match &event {
        Some(e) => event_review_bytes(e),
        None => Some(build_body(
            case.body.as_ref().unwrap_or(&BodySpec::default()),
            dir,
        )),
    };
    Seen {
        case,
        out,
        reply,
        message,
        event,
        review_bytes,
    }
}

/// Loads every case: (id, case, its directory).
fn load_cases() -> Vec<(String, Case, PathBuf)> {
    case_files()
        .into_iter()
        .map(|(category, name, path)| {
            let id = format!("{category}/{name}");
            let case: Case = serde_json::from_slice(&read(&path))
                .unwrap_or_else(|e| panic!("{id}: not a case descriptor: {e}"));
            assert!(
                !case.claim.trim().is_empty(),
                "{id}: say what the case claims"
            );
            assert!(
                case.event.is_none() || case.body.is_none(),
                "{id}: an event case carries its body in event.body"
            );
            (id, case, path.parent().unwrap().to_path_buf())
        })
        .collect()
}

#[tokio::test]
async fn every_bad_input_gets_its_status_and_message_without_a_panic_in_linear_work() {
    let cases = load_cases();
    let only = std::env::var_os("BAD_INPUT_ONLY").is_some();
    let mut apps = BTreeMap::new();
    let mut failures = Vec::new();
    let mut per_category: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let branches = branches();
    let mut reached: BTreeMap<&str, Vec<String>> = branches
        .iter()
        .map(|(name, _)| (*name, Vec::new()))
        .collect();
    let mut heaviest = Vec::new();
    for (id, case, dir) in &cases {
        let category = id.split('/').next().unwrap().to_owned();
        let app = app_for(case.config.as_ref(), &mut apps);
        let out = match run(app, case, dir).await {
            Err(panic) => {
                failures.push(format!("{id}: {panic}"));
                continue;
            }
            Ok(out) => out,
        };
        let counts = per_category.entry(category).or_default();
        if out.status.is_some() {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
        if let Err(why) = check(case, &out) {
            failures.push(format!("{id}: {why}\n    claim: {}", case.claim));
        }
        if out.status.is_none() {
            // Rejected by the runtime: none of our code ran, and nothing to bound.
            continue;
        }
        if let Err(why) = within_work_bound(out.work, out.bytes_in_and_out) {
            failures.push(format!("{id}: {why}"));
        }
        heaviest.push((
            out.work.bytes as f64 / out.bytes_in_and_out.max(1) as f64,
            out.work,
            id.clone(),
        ));
        let s = seen(case, &out, dir);
        for (name, evidence) in &branches {
            if evidence(&s) {
                reached.get_mut(name).unwrap().push(id.clone());
            }
        }
    }
    let ours: usize = per_category.values().map(|c| c.0).sum();
    let runtime: usize = per_category.values().map(|c| c.1).sum();
    println!(
        "bad-input cases per category (reaching our code, rejected by the runtime): {per_category:?}"
    );
    println!("{ours} cases reach our code; {runtime} stop in the runtime's deserialiser");
    heaviest.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("most bytes allocated per byte in and out:");
    for (ratio, w, id) in heaviest.iter().take(5) {
        println!("  {ratio:>8.1}  {w}  {id}");
    }
    heaviest.sort_by_key(|h| std::cmp::Reverse(h.1.allocations));
    println!("most allocations:");
    for (_, w, id) in heaviest.iter().take(3) {
        println!("  {w}  {id}");
    }
    for (name, ids) in &reached {
        println!("  {:>3}  {name}", ids.len());
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad-input cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    if !only {
        assert!(
            ours >= MIN_CASES,
            "only {ours} cases reach our code (at least {MIN_CASES}; {runtime} more stop in the runtime)"
        );
        let missed: Vec<&&str> = reached
            .iter()
            .filter(|(_, ids)| ids.is_empty())
            .map(|(name, _)| name)
            .collect();
        assert!(missed.is_empty(), "branches no case reaches: {missed:#?}");
    }
}

/// The time budget of every case, in release, measured alone: run by
/// `scripts/bench-bad-input.sh` (`cargo test --release --test integration -- --ignored
/// --test-threads=1`), which reports each case against its budget. Not part of `cargo test`:
/// milliseconds in a debug build on a shared machine are not a steady signal.
#[tokio::test]
#[ignore = "release timings: scripts/bench-bad-input.sh"]
async fn release_timings() {
    // BENCH_QUICK=1 (scripts/bench/quick.sh): the script's smoke run in the test build, every
    // case answered and reported, no budget checked.
    let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| v == "1");
    if cfg!(debug_assertions) && !quick {
        panic!("timings are only meaningful in release: run scripts/bench-bad-input.sh");
    }
    let mut apps = BTreeMap::new();
    let mut over = Vec::new();
    let mut timings = Vec::new();
    for (id, case, dir) in load_cases() {
        let app = app_for(case.config.as_ref(), &mut apps);
        // Best of three: the first run pays for first-touch page faults.
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let out = run(app.clone(), &case, &dir).await.expect("no panic");
            best = best.min(out.elapsed);
        }
        let budget = budget(&case);
        if best > budget {
            over.push(format!("{id}: {best:?}, over its {budget:?} budget"));
        }
        timings.push((best, budget, id));
    }
    timings.sort();
    let total: Duration = timings.iter().map(|(t, ..)| *t).sum();
    println!("bad-input timings, release, best of 3 (total {total:?}); slowest:");
    for (t, budget, id) in timings.iter().rev().take(10) {
        println!("  {t:>12.3?}  (budget {budget:?})  {id}");
    }
    if quick {
        println!("BENCH_QUICK=1: a smoke run, the budgets not checked");
        return;
    }
    assert!(over.is_empty(), "over budget:\n{}", over.join("\n"));
}

#[tokio::test]
async fn the_base_review_is_mutated_so_each_case_fails_only_by_its_own_edit() {
    let app = webhook(
        &Config::from_value(json!({})).unwrap().config,
        Deps::offline(),
    );
    let body = read(&corpus_dir().join("base-review.json"));
    let reply = app
        .handle(Incoming {
            method: "POST",
            path: "/mutate--v1-pod",
            content_type: Some("application/json"),
            body: &body,
        })
        .await;
    let r = harness::check_review_reply(reply.status, &reply.body);
    assert!(r.allowed && r.patch.is_some(), "{}", r.v);
}
