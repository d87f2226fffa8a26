//! Oracles shared by the fuzz targets (`fuzz/fuzz_targets/*.rs`) and their regression tests
//! (`tests/fuzz_regressions.rs`, which includes this file with `#[path]`).
//!
//! Each public function runs one input through the webhook the way production does and panics
//! when a promise of the README does not hold: every reply is well-formed JSON, a review route
//! always answers with an AdmissionReview, errors are `allowed:false` with a message, a patch only
//! ever comes with a pod CREATE, applies to the pod the API server sent and is idempotent, the
//! path token is never bypassed, and no secret value reaches a message. Only crates that both the
//! fuzz crate and the main crate's dev-dependencies have may be used here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;
use lambda_http::request::LambdaRequest;
use podmutator::transport::http::{Front, Incoming};
use podmutator::transport::lambda::{LambdaReply, handle};
use podmutator_core::admission::{Answer, Reply};
use podmutator_core::config::Config;
use podmutator_core::metrics::Sink;
use podmutator_core::mutate::Route;
use podmutator_core::secrets::codec::{
    self, ANNOTATION_PREFIX, CodecError, MAX_ENCODED_LEN, MountRequirement, Secret,
};
use podmutator_core::secrets::source::{
    Api, BoxFuture, Fetched, SecretSource, SecretValue, SourceError, StaticSource,
};
use podmutator_core::{App, Deps};
use serde_json::{Value, json};

/// Values the fake Embedded source holds. Obviously fake; a reply must never contain one unless
/// the request itself did.
pub const FAKE_VALUES: [&str; 3] = [
    "FAKE-embedded-value-for-fuzzing-1f4c",
    "FAKE-second-value-for-fuzzing-9a07",
    "FAKE-file-value-for-fuzzing-c3d2",
];

/// The path token of the guarded app (fake, long enough for config validation).
pub const FAKE_TOKEN: &str = "fake-fuzz-token-0123456789abcdef0123";

/// The guarded app's body limit (the smallest the config accepts).
pub const SMALL_BODY_LIMIT: usize = 1024;

/// The scope of the Flyte fixture pod: organization/project/domain labels and namespace.
const ID_PREFIX: &str = "u__org__flyte__domain__development__project__flytesnacks__key__";

/// The webhook instances every oracle runs against, built once.
pub struct Apps {
    /// `Config::from_value({})`: K8s secrets, no mesh.
    pub default: Front,
    /// Embedded (fake source), Vault and AWS managers after Global; the mesh mutators on.
    pub rich: Front,
    /// Default chain behind a path token, with a 1 KiB body limit.
    pub guarded: Front,
    /// Metric lines of every app (drained after each input).
    pub metric_lines: Arc<Mutex<Vec<String>>>,
}

/// A fake Secrets Manager: the static values, and a backend failure for any id containing
/// `backend-down`.
struct FakeSource(StaticSource);

impl SecretSource for FakeSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        if ids.iter().any(|id| id.contains("backend-down")) {
            return Box::pin(async move {
                Err(SourceError::Call {
                    api: Api::GetSecretValue,
                    ids: ids.join(", "),
                    code: "InternalServiceError".into(),
                    source: "fake backend is down (fuzzing)".into(),
                })
            });
        }
        self.0.fetch_many(ids)
    }
}

fn fake_source() -> FakeSource {
    let mut source = StaticSource::default()
        .with(&format!("{ID_PREFIX}user_secret"), FAKE_VALUES[0])
        .with(&format!("{ID_PREFIX}k"), FAKE_VALUES[1])
        .with(
            "u__org__flyte__domain__development__project____key__org_wide",
            FAKE_VALUES[0],
        );
    source.values.insert(
        format!("{ID_PREFIX}file"),
        SecretValue {
            string: None,
            binary: Some(FAKE_VALUES[2].as_bytes().to_vec()),
        },
    );
    source.values.insert(
        format!("{ID_PREFIX}binary"),
        SecretValue {
            string: None,
            binary: Some(vec![0xff, 0xfe, 0x00, 0x80]),
        },
    );
    source.values.insert(
        format!("{ID_PREFIX}empty"),
        SecretValue {
            string: Some(String::new()),
            binary: None,
        },
    );
    FakeSource(source)
}

/// The webhook for `config`, built the one way every caller builds it.
fn front(config: &Config, deps: Deps) -> Front {
    let app = App::build(config, deps);
    Front::new(Arc::new(app), &config.http, None).expect("fuzz http config")
}

fn config(v: Value) -> Config {
    Config::from_value(v)
        .unwrap_or_else(|e| panic!("fuzz config is invalid: {e}"))
        .config
}

pub fn apps() -> &'static Apps {
    static APPS: OnceLock<Apps> = OnceLock::new();
    APPS.get_or_init(|| {
        let metric_lines = Arc::new(Mutex::new(Vec::new()));
        let sink = || Some(Sink::Memory(metric_lines.clone()));
        let default = config(json!({}));
        let mesh: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/mesh/config.json"))
                .expect("mesh fixture config is JSON");
        let rich = config(json!({
            "webhook": {
                "secretManagerTypes": ["Embedded", "Vault", "AWS"],
                "embeddedSecretManagerConfig": {"type": "AWS"}
            },
            "embedded": {"organization": "flyte"},
            "mesh": mesh,
        }));
        let guarded = config(json!({
            "http": {"pathToken": FAKE_TOKEN, "maxBodyBytes": SMALL_BODY_LIMIT}
        }));
        Apps {
            default: front(&default, Deps::offline().with_metrics(sink())),
            rich: front(
                &rich,
                Deps::offline()
                    .with_metrics(sink())
                    .with_source(Arc::new(fake_source())),
            ),
            guarded: front(&guarded, Deps::offline().with_metrics(sink())),
            metric_lines,
        }
    })
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("tokio runtime")
    })
    .block_on(f)
}

/// Every metric line written so far is one JSON object; the buffer is emptied.
fn drain_metrics() {
    let lines = std::mem::take(&mut *apps().metric_lines.lock().expect("metrics lock"));
    for line in lines {
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("metric line is not JSON ({e}): {line}"));
        assert!(v.is_object(), "metric line is not an object: {line}");
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    let mut from = 0;
    while let Some(at) = haystack[from..].iter().position(|&b| b == first) {
        if haystack[from + at..].starts_with(needle) {
            return true;
        }
        from += at + 1;
    }
    false
}

/// No fake secret value in `reply` unless `input` carried it already.
fn no_secret_value(input: &[u8], reply: &[u8]) {
    for value in FAKE_VALUES {
        if !contains(input, value.as_bytes()) {
            assert!(
                !contains(reply, value.as_bytes()),
                "a secret value reached the reply: {}",
                String::from_utf8_lossy(reply)
            );
        }
    }
}

/// The body of any reply: one JSON object.
fn json_object(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "reply is not JSON ({e}): {}",
            String::from_utf8_lossy(&body[..body.len().min(2000)])
        )
    });
    assert!(v.is_object(), "reply is not a JSON object: {v}");
    v
}

/// What a review reply says, after its shape has been checked.
pub struct ReviewReply {
    pub status: u16,
    pub allowed: bool,
    pub v: Value,
    /// The decoded JSON Patch, when there is one.
    pub patch: Option<Value>,
}

/// Checks the shape every AdmissionReview reply must have, whatever the input.
pub fn check_review_reply(status: u16, body: &[u8]) -> ReviewReply {
    assert!(
        matches!(status, 200 | 400 | 500),
        "review route answered HTTP {status}"
    );
    let v = json_object(body);
    assert_eq!(v["kind"], "AdmissionReview", "{v}");
    assert!(
        matches!(
            v["apiVersion"].as_str(),
            Some("admission.k8s.io/v1" | "admission.k8s.io/v1beta1")
        ),
        "{v}"
    );
    let resp = &v["response"];
    assert!(
        resp["uid"].is_string(),
        "response.uid must be a string: {v}"
    );
    let allowed = resp["allowed"]
        .as_bool()
        .unwrap_or_else(|| panic!("response.allowed must be a bool: {v}"));
    if status != 200 {
        assert!(!allowed, "HTTP {status} with allowed:true: {v}");
        assert_eq!(resp["status"]["code"], status, "{v}");
    }
    if !allowed {
        let message = resp["status"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("a refusal without a message: {v}"));
        assert!(!message.trim().is_empty(), "empty message: {v}");
        let code = resp["status"]["code"].as_u64().unwrap_or_default();
        assert!(matches!(code, 400 | 403 | 500), "status.code {code}: {v}");
        if status == 200 {
            assert!(
                resp["auditAnnotations"]["denial-reason"].is_string(),
                "a denial without auditAnnotations.denial-reason: {v}"
            );
        }
        assert!(resp.get("patch").is_none(), "a refusal with a patch: {v}");
    }
    let patch = match (resp.get("patch"), resp.get("patchType")) {
        (None, None) => None,
        (Some(Value::String(b64)), Some(t)) if t == "JSONPatch" => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_else(|e| panic!("patch is not base64 ({e}): {v}"));
            let patch: Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("patch is not JSON ({e}): {v}"));
            assert!(
                patch.as_array().is_some_and(|ops| !ops.is_empty()),
                "a patch must be a non-empty array: {patch}"
            );
            Some(patch)
        }
        _ => panic!("patch and patchType must come together, patchType JSONPatch: {v}"),
    };
    ReviewReply {
        status,
        allowed,
        v,
        patch,
    }
}

/// `body` as a JSON value, the way the API server (Go's `encoding/json`) reads it: UTF-8 is
/// required, and an escaped lone surrogate (`\ud800`, which RFC 8259's grammar allows but a
/// Rust `String` cannot hold) reads as U+FFFD. `None` when it is not JSON.
fn as_sent(body: &[u8]) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice(body) {
        return Some(v);
    }
    let text = std::str::from_utf8(body).ok()?;
    serde_json::from_str(&replace_lone_surrogates(text)).ok()
}

/// `text` with every `\uXXXX` escape of a surrogate that is not half of a pair replaced by
/// `\ufffd`, inside JSON strings only.
fn replace_lone_surrogates(text: &str) -> String {
    fn escape_at(b: &[u8], i: usize) -> Option<u16> {
        let hex = b.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut in_string, mut start) = (0, false, 0);
    while i < b.len() {
        match b[i] {
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'\\' if in_string => match escape_at(b, i) {
                Some(0xd800..=0xdbff)
                    if escape_at(b, i + 6).is_some_and(|lo| (0xdc00..=0xdfff).contains(&lo)) =>
                {
                    i += 12;
                }
                Some(0xd800..=0xdfff) => {
                    out.push_str(&text[start..i]);
                    out.push_str("\\ufffd");
                    i += 6;
                    start = i;
                }
                _ => i += 2,
            },
            _ => i += 1,
        }
    }
    out.push_str(&text[start..]);
    out
}

/// One review through `app`, checked against the request it answers. Returns the checked reply.
fn review_once(app: &Front, route: Route, body: &[u8]) -> ReviewReply {
    let Answer {
        status, body: out, ..
    } = block_on(app.app().review(route, body));
    drain_metrics();
    no_secret_value(body, &out);
    let r = check_review_reply(status, &out);
    // The request as the API server's JSON reader sees it (see `as_sent`). A 200 needs a body
    // that is JSON (RFC 8259) everywhere, unknown fields included: UTF-8 and the grammar.
    let input = as_sent(body);
    if status == 200 {
        assert!(
            std::str::from_utf8(body).is_ok(),
            "HTTP 200 for a body that is not UTF-8: {}",
            r.v
        );
        let input = input
            .as_ref()
            .unwrap_or_else(|| panic!("HTTP 200 for a body that is not JSON: {}", r.v));
        assert_eq!(r.v["apiVersion"], input["apiVersion"], "{}", r.v);
        assert_eq!(r.v["response"]["uid"], input["request"]["uid"], "{}", r.v);
    }
    if let (Some(patch), Some(input)) = (&r.patch, input) {
        let req = &input["request"];
        assert_eq!(req["operation"], "CREATE", "patched a non-CREATE: {}", r.v);
        assert_eq!(req["kind"]["kind"], "Pod", "patched a non-Pod: {}", r.v);
        assert_eq!(req["kind"]["group"], "", "patched a non-core kind: {}", r.v);
        assert!(
            req.get("subResource").is_none_or(Value::is_null),
            "patched a subresource: {}",
            r.v
        );
        let ops: json_patch::Patch = serde_json::from_value(patch.clone())
            .unwrap_or_else(|e| panic!("not an RFC 6902 patch ({e}): {patch}"));
        // Applied to the object exactly as sent (with or without `metadata`).
        let mut pod = req["object"].clone();
        json_patch::patch(&mut pod, &ops).unwrap_or_else(|e| {
            panic!("the patch does not apply to the pod the API server sent ({e}): {patch}")
        });
        // Re-admitting the mutated pod changes nothing.
        let mut again = input.clone();
        again["request"]["object"] = pod;
        let again = serde_json::to_vec(&again).expect("serialise");
        let Answer {
            status, body: out, ..
        } = block_on(app.app().review(route, &again));
        drain_metrics();
        let second = check_review_reply(status, &out);
        assert!(
            second.allowed && second.patch.is_none(),
            "re-admitting the mutated pod is not a no-op: first patch {patch}, second reply {}",
            second.v
        );
    }
    r
}

/// `review` target: the bytes as a review body, through the default app on Flyte's route and
/// through the rich app on a route chosen by the length.
pub fn review(body: &[u8]) {
    let apps = apps();
    review_once(&apps.default, Route::Secrets, body);
    let route = match body.len() % 3 {
        0 => Route::Secrets,
        1 => Route::ManagedPod,
        _ => Route::ManagedNamespace,
    };
    review_once(&apps.rich, route, body);
}

/// `handler` target input: `METHOD\nPATH\nCONTENT-TYPE\nBODY` (an empty content-type line means
/// no header; missing lines are empty).
pub struct HttpInput<'a> {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body: &'a [u8],
}

impl<'a> HttpInput<'a> {
    pub fn parse(data: &'a [u8]) -> Self {
        let mut rest = data;
        let mut line = || {
            let cut = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            let (head, tail) = rest.split_at(cut);
            rest = tail.get(1..).unwrap_or_default();
            String::from_utf8_lossy(head).into_owned()
        };
        let method = line();
        let path = line();
        let content_type = Some(line()).filter(|c| !c.is_empty());
        HttpInput {
            method,
            path,
            content_type,
            body: rest,
        }
    }
}

fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The route of `path` relative to the routing table, or `None` for "not found".
fn route_of(path: &str) -> Option<Option<Route>> {
    match path {
        "/healthz" => Some(None),
        "/mutate--v1-pod" => Some(Some(Route::Secrets)),
        "/mutate/managed-pod" => Some(Some(Route::ManagedPod)),
        "/mutate/managed-namespace" => Some(Some(Route::ManagedNamespace)),
        _ => None,
    }
}

/// Checks one HTTP answer against an independent model of the routing table.
fn check_http(app_name: &str, input: &HttpInput<'_>, path: &str, limit: usize, reply: &Reply) {
    let v = json_object(&reply.body);
    let Some(route) = route_of(path) else {
        assert_eq!(reply.status, 404, "{app_name}: unknown path {path:?}: {v}");
        return;
    };
    let Some(_) = route else {
        let expected = if matches!(input.method.as_str(), "GET" | "HEAD") {
            200
        } else {
            405
        };
        assert_eq!(reply.status, expected, "{app_name}: healthz: {v}");
        return;
    };
    if input.method != "POST" {
        assert_eq!(
            reply.status, 405,
            "{app_name}: {} {path}: {v}",
            input.method
        );
        assert!(v["message"].is_string(), "{v}");
        return;
    }
    let r = check_review_reply(reply.status, &reply.body);
    let message = r.v["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    if !is_json(input.content_type.as_deref()) {
        assert_eq!(r.status, 400, "{app_name}: non-JSON content type: {}", r.v);
        assert!(message.contains("content-type"), "{message}");
    } else if input.body.len() > limit {
        assert_eq!(r.status, 400, "{app_name}: body over the limit: {}", r.v);
        assert!(message.contains("-byte limit"), "{message}");
    }
}

/// `handler` target: one HTTP request through `Front::handle` of the default and the guarded app.
pub fn handler(data: &[u8]) {
    let input = HttpInput::parse(data);
    let apps = apps();
    let req = Incoming {
        method: &input.method,
        path: &input.path,
        content_type: input.content_type.as_deref(),
        body: input.body,
    };
    let reply = block_on(apps.default.handle(req));
    drain_metrics();
    no_secret_value(data, &reply.body);
    check_http(
        "default",
        &input,
        &input.path,
        podmutator_core::config::DEFAULT_MAX_BODY_BYTES,
        &reply,
    );

    let reply = block_on(apps.guarded.handle(req));
    drain_metrics();
    no_secret_value(data, &reply.body);
    let token_prefix = format!("/{FAKE_TOKEN}");
    match input.path.strip_prefix(&token_prefix) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            check_http("guarded", &input, rest, SMALL_BODY_LIMIT, &reply);
        }
        _ => {
            assert_eq!(
                reply.status, 404,
                "the path token was bypassed by {:?}",
                input.path
            );
            let v = json_object(&reply.body);
            assert_eq!(v, json!({"message": "not found"}));
        }
    }
}

/// `lambda_event` target: the bytes as a Lambda event, deserialised as the runtime does; one
/// that does not deserialise is rejected by the runtime (not our code), which is fine.
pub fn lambda_event(data: &[u8]) {
    let Ok(event) = serde_json::from_slice::<LambdaRequest>(data) else {
        return;
    };
    let source = match &event {
        LambdaRequest::ApiGatewayV1(_) => "rest",
        LambdaRequest::ApiGatewayV2(_) => "http",
        LambdaRequest::Alb(_) => "alb",
        _ => "other",
    };
    let reply = block_on(handle(&apps().default, event));
    drain_metrics();
    let shape = match &reply {
        LambdaReply::ApiGatewayV1(_) => "rest",
        LambdaReply::ApiGatewayV2(_) => "http",
        LambdaReply::Alb(_) => "alb",
    };
    if source != "other" {
        assert_eq!(
            shape, source,
            "answered a {source} event in the {shape} shape"
        );
    }
    let status = reply.status();
    assert!(
        matches!(status, 200 | 400 | 404 | 405 | 500),
        "HTTP {status}"
    );
    let wire = serde_json::to_value(&reply).expect("the reply serialises");
    assert_eq!(wire["statusCode"], status);
    assert_eq!(wire["isBase64Encoded"], false, "{wire}");
    let ct = match wire["headers"]["content-type"].as_str() {
        Some(ct) => ct.to_owned(),
        None => wire["multiValueHeaders"]["content-type"][0]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    };
    assert_eq!(ct, "application/json", "{wire}");
    if shape == "alb" {
        let description = wire["statusDescription"].as_str().unwrap_or_default();
        assert!(
            description.starts_with(&format!("{status} ")),
            "statusDescription {description:?} for {status}"
        );
    }
    let body = reply.body();
    no_secret_value(data, body);
    let v = json_object(body);
    if v.get("response").is_some() {
        check_review_reply(status as u16, body);
    } else {
        assert!(v["message"].is_string(), "{v}");
    }
}

/// Longest error message the codec may produce (its messages quote at most 40 characters).
const MAX_CODEC_MESSAGE: usize = 400;

fn check_codec_error(e: &CodecError) {
    let message = e.to_string();
    assert!(
        !message.is_empty() && message.len() <= MAX_CODEC_MESSAGE,
        "codec message of {} bytes: {message:?}",
        message.len()
    );
}

/// `codec` target, bytes part: base32, text format and annotation values never panic, their
/// messages stay short, and whatever decodes re-encodes to the same thing.
pub fn codec_bytes(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match codec::decode_base32(&text) {
        Ok(bytes) => {
            let again = codec::decode_base32(&codec::encode_base32(&bytes));
            assert_eq!(again.as_ref(), Ok(&bytes), "base32 round trip");
        }
        Err(e) => check_codec_error(&e),
    }
    match codec::decode_secret(&text) {
        Ok(secret) => codec_secret(&secret),
        Err(e) => check_codec_error(&e),
    }
    match codec::unmarshal_text(data) {
        Ok(secret) => codec_secret(&secret),
        Err(e) => check_codec_error(&e),
    }
}

/// `codec` target, structured part: any `Secret` survives text and annotation round trips, and
/// encoding fails exactly where Flyte's does.
pub fn codec_secret(secret: &Secret) {
    let text = codec::marshal_text(secret);
    assert!(
        text.bytes()
            .all(|b| b == b'\n' || (0x20..0x7f).contains(&b)),
        "marshalled text is not printable ASCII lines: {text:?}"
    );
    assert_eq!(
        codec::unmarshal_text(text.as_bytes()).as_ref(),
        Ok(secret),
        "text round trip of {text:?}"
    );
    match codec::encode_secret(secret) {
        Ok(value) => {
            assert!(value.len() <= MAX_ENCODED_LEN);
            assert_eq!(
                codec::decode_secret(&value).as_ref(),
                Ok(secret),
                "annotation round trip"
            );
        }
        Err(CodecError::InvalidMountRequirement(n)) => {
            assert_eq!(secret.mount_requirement, MountRequirement::Unknown(n));
        }
        Err(CodecError::TooLong { len }) => assert!(len > MAX_ENCODED_LEN),
        Err(other) => panic!("encode_secret failed unexpectedly: {other}"),
    }
}

/// `codec` target, annotation maps: decoding is sorted by index, one request per index, each
/// key canonical, each value decoded as [`codec::decode_secret`] does.
pub fn codec_annotations(annotations: &BTreeMap<String, String>) {
    match codec::decode_annotations(annotations) {
        Ok(decoded) => {
            for pair in decoded.windows(2) {
                assert!(pair[0].index < pair[1].index, "not sorted or repeated");
            }
            for d in &decoded {
                assert_eq!(d.annotation, format!("{ANNOTATION_PREFIX}{}", d.index));
                let value = &annotations[&d.annotation];
                assert_eq!(codec::decode_secret(value).as_ref(), Ok(&d.secret));
            }
            let expected = annotations
                .keys()
                .filter(|k| k.starts_with(ANNOTATION_PREFIX))
                .count();
            assert_eq!(decoded.len(), expected, "a secret annotation was dropped");
        }
        Err(e) => {
            assert!(annotations.contains_key(&e.annotation), "{e}");
            let message = e.to_string();
            assert!(
                message.len() <= MAX_CODEC_MESSAGE + format!("{:?}", e.annotation).len(),
                "{message}"
            );
        }
    }
}
