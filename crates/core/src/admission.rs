//! The admission path, one way through for every review and both transports: parse, plan, one
//! fetch step, the chain, diff, reply. Each step returns what it did as a value; together they
//! make one [`Admission`], from which the reply, the audit line, the EMF line and the Prometheus
//! counters are all derived.

use std::borrow::Cow;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::DynamicObject;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::app::App;
use crate::error::{Denial, Error};
use crate::metrics::AdmissionFacts;
use crate::mutate::{Applied, Chain, Denied, Effects, PodCtx, Route};
use crate::patch::Patch;
use crate::secrets::embedded::DRY_RUN_PLACEHOLDER;
use crate::secrets::plan::Prepared;
use crate::secrets::{Plan, ResolvedSecrets};

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

/// An HTTP answer: status and a JSON body. Its body has one of two shapes: an AdmissionReview
/// (every answer to a review, [`Answer`]), or `{"message"}` for a request that never became
/// one (a wrong path, method or content type, a body too slow to arrive: 404, 405, 408), which
/// the API server reports with the status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The answer to one review, typed: its HTTP status, whose review it answers, how it ended,
/// and the AdmissionReview written for it (`body`, whose length is what the path back
/// carries). The one place an error becomes a reply is [`Answer::error`].
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// `request.uid`, echoed (empty when the review had none).
    pub uid: String,
    pub api_version: &'static str,
    pub outcome: Outcome,
    pub body: Vec<u8>,
}

/// How a review ended, as its response says.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `allowed: true`, with the JSON Patch when the pod changed.
    Allowed {
        patch: Option<Patch>,
        warnings: Vec<String>,
    },
    /// `allowed: false`: `status.code` and `status.message`.
    Refused { code: u16, message: String },
}

impl Answer {
    /// The answer for any error: a well-formed review with `allowed: false`, the HTTP status
    /// from the error table in [`crate::error`].
    pub fn error(err: &Error, uid: &str, api_version: &'static str) -> Self {
        let subject = Subject {
            uid: uid.to_owned(),
            ..Subject::default()
        };
        let admission = Admission::early(subject, api_version, Err(err.clone()));
        let reply = admission.reply();
        admission.into_answer(reply)
    }

    /// The JSON Patch's size, before base64 (0 when there is none).
    pub fn patch_bytes(&self) -> usize {
        match &self.outcome {
            Outcome::Allowed { patch: Some(p), .. } => p.as_json().len(),
            _ => 0,
        }
    }
}

impl From<Answer> for Reply {
    fn from(a: Answer) -> Self {
        Reply {
            status: a.status,
            body: a.body,
        }
    }
}

/// Who and what a review was about, for the audit line (names, never values).
#[derive(Debug, Default)]
struct Subject {
    uid: String,
    namespace: String,
    pod: String,
    operation: &'static str,
}

/// What the fetch step did.
#[derive(Debug, Default, Clone, Copy)]
struct Fetched {
    /// Secret ids and names asked for.
    ids: usize,
    us: u64,
    cache_hits: u32,
    backend_calls: u32,
    throttles: u32,
}

/// How a review that parsed ended, before it is written as a reply.
#[derive(Debug)]
enum Verdict {
    /// Not a review this route mutates (another kind, operation or subresource): allowed
    /// untouched.
    NotOurs,
    /// The chain ran; `patch` is `None` when it changed nothing.
    Ran {
        changed: Vec<&'static str>,
        patch: Option<Patch>,
        warnings: Vec<String>,
    },
}

/// One admission as its steps returned it.
#[derive(Debug)]
struct Admission {
    subject: Subject,
    api_version: &'static str,
    fetched: Fetched,
    /// What the mutators counted (on a denial too: the image builder's failure counts are the
    /// point of its metrics).
    effects: Effects,
    verdict: Result<Verdict, Error>,
}

impl Admission {
    /// An admission that ended before anything was fetched or run.
    fn early(subject: Subject, api_version: &'static str, verdict: Result<Verdict, Error>) -> Self {
        Self {
            subject,
            api_version,
            fetched: Fetched::default(),
            effects: Effects::default(),
            verdict,
        }
    }

    fn decision(&self) -> &'static str {
        match &self.verdict {
            Ok(Verdict::Ran { patch: Some(_), .. }) => "mutated",
            Ok(_) => "allowed",
            Err(Error::Invalid(_)) => "invalid",
            Err(Error::Denied(_)) => "denied",
            Err(Error::Internal(_)) => "error",
        }
    }

    fn reason(&self) -> &'static str {
        match &self.verdict {
            Ok(Verdict::NotOurs) => "NotAPodCreate",
            Ok(Verdict::Ran { .. }) => "",
            Err(e) => e.reason(),
        }
    }

    /// The reply: allowed, with the patch (if any) and warnings, or for an error a well-formed
    /// review with `allowed: false`, the HTTP status from the error table in [`crate::error`].
    fn reply(&self) -> Reply {
        let message;
        let mut review = ReviewOut {
            api_version: self.api_version,
            uid: &self.subject.uid,
            status: None,
            patch: None,
            denial_reason: None,
            warnings: &[],
        };
        match &self.verdict {
            Ok(Verdict::NotOurs) => {}
            Ok(Verdict::Ran {
                patch, warnings, ..
            }) => {
                review.patch = patch.as_ref().map(Patch::as_json);
                review.warnings = warnings;
            }
            Err(err) => {
                message = err.to_string();
                let code = err.review_code();
                review.status = Some(StatusOut {
                    status: "Failure",
                    code,
                    reason: standard_reason(code),
                    message: &message,
                });
                if let Error::Denied(d) = err {
                    review.denial_reason = Some(d.reason);
                }
            }
        }
        // Sized up front for the patch, so the body is not copied as it grows.
        let patch = review.patch.map_or(0, <[u8]>::len);
        let mut body = Vec::with_capacity(256 + review.uid.len() + patch.div_ceil(3) * 4);
        match review.write(&mut body) {
            Ok(()) => Reply {
                status: (self.verdict.as_ref()).map_or_else(Error::http_status, |_| 200),
                body,
            },
            // Writing into a `Vec` fails only if a size overflows; answer 500 rather than panic.
            Err(_) => Reply {
                status: 500,
                body: br#"{"message":"failed to serialise the response"}"#.to_vec(),
            },
        }
    }

    /// The typed answer, around the `reply` written for it.
    fn into_answer(self, reply: Reply) -> Answer {
        let outcome = match self.verdict {
            Ok(Verdict::NotOurs) => Outcome::Allowed {
                patch: None,
                warnings: Vec::new(),
            },
            Ok(Verdict::Ran {
                patch, warnings, ..
            }) => Outcome::Allowed { patch, warnings },
            Err(err) => Outcome::Refused {
                code: err.review_code(),
                message: err.to_string(),
            },
        };
        Answer {
            status: reply.status,
            uid: self.subject.uid,
            api_version: self.api_version,
            outcome,
            body: reply.body,
        }
    }
}

impl App {
    /// Answers one AdmissionReview body that arrived by `route`. Never panics on bad input.
    pub async fn review(&self, route: Route, body: &[u8]) -> Answer {
        self.review_within(route, body, None).await
    }

    /// [`App::review`], refusing (413, `ResponseTooLarge`) a review whose reply would not fit
    /// `limit` (`None`: `http.maxReplyBytes`, the app's own): from an estimate made before the
    /// patch is built, then on the reply built (the estimate is a floor: values, and what each
    /// item costs in the patch, are known only then).
    pub async fn review_within(
        &self,
        route: Route,
        body: &[u8],
        limit: Option<ReplyLimit>,
    ) -> Answer {
        let started = Instant::now();
        let limit = limit.unwrap_or(ReplyLimit {
            bytes: self.max_reply_bytes,
            reserve: 0,
            by: "http.maxReplyBytes puts on the webhook's replies",
            instead: "",
        });
        let mut admission = self.admit(route, body, limit).await;
        let mut reply = admission.reply();
        let room = limit.bytes.saturating_sub(limit.reserve);
        if reply.body.len() > room {
            let patch = match &admission.verdict {
                Ok(Verdict::Ran { patch: Some(p), .. }) => p.as_json().len().div_ceil(3) * 4,
                _ => 0,
            };
            let size = (reply.body.len() + limit.reserve) as u64;
            let denial = reply_too_large(size, Some(patch), limit);
            admission.verdict = Err(Error::Denied(denial));
            reply = admission.reply();
        }
        self.report(route, &admission, reply.status, started);
        admission.into_answer(reply)
    }

    /// What admitting `body` may cost in memory, in the objects [`limits.maxObjectsPerReview`]
    /// counts (a container as several, [`objects_in`]) plus one a [`BYTES_PER_OBJECT`] of the
    /// body, from 1 to that limit: the share of a server's admission budget this review waits
    /// for. The bytes count because what is not an object costs memory too: a 6 MB review of
    /// strings or map entries (2 million `args`, 560,000 annotations) counts some 25 objects
    /// and took 165 to 187 MB, as much as the largest review of objects.
    ///
    /// [`limits.maxObjectsPerReview`]: crate::config::LimitsConfig::max_objects_per_review
    pub fn weight(&self, body: &[u8]) -> usize {
        (objects_in(body).all + body.len() / BYTES_PER_OBJECT).clamp(1, self.max_objects)
    }

    /// The one report of an admission: the Prometheus counters, the EMF line and the audit
    /// line, from the same facts.
    fn report(&self, route: Route, a: &Admission, status: u16, started: Instant) {
        let duration_us = started.elapsed().as_micros() as u64;
        let decision = a.decision();
        let reason = a.reason();
        let (mutators, patch_ops, patch_bytes) = match &a.verdict {
            Ok(Verdict::Ran { changed, patch, .. }) => (
                &changed[..],
                patch.as_ref().map_or(0, Patch::len),
                patch.as_ref().map_or(0, |p| p.as_json().len()),
            ),
            _ => (&[][..], 0, 0),
        };
        let (injected, images) = (a.effects.injected(), a.effects.images());
        let facts = AdmissionFacts {
            route: route.as_str(),
            decision,
            reason,
            duration_us,
            patch_ops,
            patch_bytes,
            mutators,
            injected: &injected,
            images: &images,
            fetch_ids: a.fetched.ids,
            backend_calls: a.fetched.backend_calls,
            cache_hits: a.fetched.cache_hits,
            throttles: a.fetched.throttles,
        };
        self.counters.record(&facts);
        if let Some(m) = &self.metrics {
            m.emit(&facts);
        }
        let error = a.verdict.as_ref().err().map(ToString::to_string);
        let mutators = mutators.join(",");
        let non_empty = |s: &'static str| (!s.is_empty()).then_some(s);
        // One line, its level by the decision: a refused body is the sender's problem (warn),
        // a failure ours (error). Strings as `&str` fields, not `%` (Display): the JSON layer
        // then writes them without formatting each into a temporary string first.
        macro_rules! audit_line {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    route = route.as_str(),
                    uid = a.subject.uid.as_str(),
                    namespace = a.subject.namespace.as_str(),
                    pod = a.subject.pod.as_str(),
                    operation = non_empty(a.subject.operation),
                    decision,
                    reason = non_empty(reason),
                    error = error.as_deref(),
                    mutators = mutators.as_str(),
                    patch_ops,
                    secrets_fetched = a.fetched.ids,
                    cache_hits = a.fetched.cache_hits,
                    fetch_us = a.fetched.us,
                    status,
                    duration_us,
                    "admission"
                )
            };
        }
        match decision {
            "invalid" => audit_line!(tracing::Level::WARN),
            "error" => audit_line!(tracing::Level::ERROR),
            _ => audit_line!(tracing::Level::INFO),
        }
    }

    /// The request stays in its box, the pod and the one before an UPDATE inside it until the
    /// chain runs: what this future holds across the fetch's await is a pointer, not the 5 KB
    /// request, and every future above it (the transports') moves what it holds.
    async fn admit(&self, route: Route, body: &[u8], limit: ReplyLimit) -> Admission {
        let whole = match self.weigh(body) {
            Ok(whole) => whole,
            Err(too_many) => return *too_many,
        };
        let (mut req, api_version) = match parse(body, route, whole) {
            Ok(Parsed::Pod(req, v)) => (req, v),
            Ok(Parsed::Other {
                uid,
                api_version,
                operation,
            }) => {
                let subject = Subject {
                    uid,
                    operation,
                    ..Subject::default()
                };
                return Admission::early(subject, api_version, Ok(Verdict::NotOurs));
            }
            Err(e) => return Admission::early(Subject::default(), API_VERSION_V1, Err(e)),
        };
        let subject = Subject::of(&req);
        if !admits(route, &req) {
            return Admission::early(subject, api_version, Ok(Verdict::NotOurs));
        }
        let update = req.operation == Operation::Update;
        let req = &mut *req;
        let (object, old) = (req.object.take(), req.old_object.take());
        let ctx = PodCtx {
            namespace: &subject.namespace,
            route,
            username: req.user_info.username.as_deref().unwrap_or_default(),
            groups: req.user_info.groups.as_deref().unwrap_or_default(),
            dry_run: req.dry_run,
            old: None,
            prepared: None,
        };
        let mut fetched = Fetched::default();
        let ran = async {
            if update {
                // Only the mutators that check updates, with the pod before the update beside
                // it, both read down to their containers' names and images. Nothing is
                // fetched: an UPDATE gets no secrets.
                let (Some(object), Some(old)) = (object, old) else {
                    let e = Error::Invalid(
                        "review of a pod UPDATE needs both request.object and request.oldObject, as the API server sends them"
                            .into(),
                    );
                    return Err(e.into());
                };
                if !self.chain.applies(&ctx, &object.metadata, true) {
                    return passed_by();
                }
                let pod = names_and_images(object, "object")?;
                let old = names_and_images(old, "oldObject")?;
                let ctx = PodCtx {
                    old: Some(&old),
                    ..ctx
                };
                return run(&self.chain, &ctx, pod, true);
            }
            let Some(object) = object else {
                let e = Error::Invalid(
                    "review of a pod CREATE has no request.object; only pod CREATE reviews are mutated"
                        .into(),
                );
                return Err(e.into());
            };
            // Told from the metadata: a pod no member applies to (the secrets mutator, before
            // its plan: one it does not select) is allowed as it came, its spec never read
            // into types.
            if !self.chain.applies(&ctx, &object.metadata, false) {
                return passed_by();
            }
            let pod = object.into_pod(body, whole)?;
            let plan = self.secrets.plan(&ctx, &pod);
            // Before any fetch or injection: a reply that cannot be sent is not built.
            let spec = pod.spec.as_ref();
            let containers = spec.map_or(0, |s| {
                s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len)
            });
            let estimate = plan.reply_estimate(&self.secrets.injectors, containers);
            if estimate > limit.bytes.saturating_sub(limit.reserve) as u64 {
                return Err(Error::Denied(reply_too_large(estimate, None, limit)).into());
            }
            let resolved;
            (fetched, resolved) = self.resolve(&plan).await;
            let prepared = Prepared {
                plan,
                resolved: resolved?,
            };
            let ctx = PodCtx {
                prepared: Some(&prepared),
                ..ctx
            };
            if !self.chain.applies(&ctx, &pod.metadata, false) {
                return passed_by();
            }
            run(&self.chain, &ctx, pod, false)
        }
        .await;
        let (effects, verdict) = match ran {
            Ok((verdict, effects)) => (effects, Ok(verdict)),
            Err(Ran::Denied(Denied { denial, effects })) => (*effects, Err(Error::Denied(denial))),
            Err(Ran::Failed(e)) => (Effects::default(), Err(e)),
        };
        Admission {
            subject,
            api_version,
            fetched,
            effects,
            verdict,
        }
    }
}

impl App {
    /// The denial of a review holding more JSON objects than `limits.maxObjectsPerReview`
    /// ([`objects_in`]), decided on its bytes before any of it is read into Kubernetes types (a
    /// container is a struct of 2 KB: a 1 MB review of 30,000 of them took 280 MB). Only a body
    /// long enough to hold that many (two bytes each, `{}`, a heavy one among them counting
    /// [`HEAVY`]) is counted. Otherwise whether the whole review is within the limit: only then
    /// may an error be located by reading all of it ([`parse`], [`LazyPod::into_pod`]).
    fn weigh(&self, body: &[u8]) -> Result<bool, Box<Admission>> {
        if body.len().saturating_mul(HEAVY) / 2 <= self.max_objects {
            return Ok(true);
        }
        let w = objects_in(body);
        if w.all <= self.max_objects {
            return Ok(true);
        }
        // A CREATE's `oldObject`, if any, is read only down to its metadata.
        let create = (w.all - w.old.all).max(w.old.meta);
        if create <= self.max_objects {
            return Ok(false);
        }
        // Answered as a denial of this review, so the API server shows its message: the uid
        // and version are read without the rest (serde skips what no field asks for).
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Head {
            api_version: String,
            request: HeadRequest,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct HeadRequest {
            uid: String,
            namespace: String,
            operation: String,
        }
        let head: Head = serde_json::from_slice(body).unwrap_or_default();
        // Both pods of an UPDATE are read down to their metadata and their containers' names
        // and images ([`names_and_images`]): that is what is weighed, each pod on its own, so a
        // pod the API server holds can be updated (a label, a finalizer removed) however heavy
        // its env or volumes were when stored (before a limit was lowered, or while the
        // webhook was off).
        let objects = match head.request.operation.as_str() {
            "UPDATE" => {
                let rest = w.all - w.new.all - w.old.all;
                (rest + w.new.meta + w.new.containers).max(w.old.meta + w.old.containers)
            }
            _ => create,
        };
        if objects <= self.max_objects {
            return Ok(false);
        }
        let api_version =
            api_version_of(&head.api_version, "AdmissionReview").unwrap_or(API_VERSION_V1);
        let subject = Subject {
            uid: head.request.uid,
            namespace: head.request.namespace,
            ..Subject::default()
        };
        let denial = Denial {
            code: 413,
            reason: "TooManyObjects",
            message: format!(
                "the review's pod holds the weight of {objects} JSON objects (a container counts 8, a volume 16, each other object 1), over the {} of limits.maxObjectsPerReview: read into Kubernetes types it would take more memory than a replica has; split the pod, or raise the limit with the replica's memory",
                self.max_objects
            ),
        };
        Err(Box::new(Admission::early(
            subject,
            api_version,
            Err(Error::Denied(denial)),
        )))
    }
}

/// Elements of these lists are read into Kubernetes types of 2 to 3 KB each (`Container`
/// 2,120 bytes, `EphemeralContainer` 2,144, `Volume` 3,208); every other object into one of
/// at most some 400. Each counts as many objects as given here in [`objects_in`].
const HEAVY_LISTS: [(&[u8], usize); 4] = [
    (b"containers", CONTAINER),
    (b"initContainers", CONTAINER),
    (b"ephemeralContainers", CONTAINER),
    (b"volumes", 16),
];
/// What a container counts.
const CONTAINER: usize = 8;
/// The bytes of a body that [`App::weight`] counts as one object: 6 MB of anything weighs
/// about the default `limits.maxObjectsPerReview`.
const BYTES_PER_OBJECT: usize = 64;
/// The most any one object counts.
const HEAVY: usize = 16;

/// What [`objects_in`] counts: all of a review's objects, and of them those of its
/// `request.object` and of `request.oldObject`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Weights {
    all: usize,
    new: PodWeight,
    old: PodWeight,
}

/// A pod's objects: all of them, those of its `metadata`, and its containers of every kind
/// (the elements of those lists, not what they hold).
#[derive(Debug, Default, PartialEq, Eq)]
struct PodWeight {
    all: usize,
    meta: usize,
    containers: usize,
}

/// The JSON objects in `body`, an element of a [`HEAVY_LISTS`] list counting as listed there: a
/// bound, proportional to the memory its Kubernetes types take, made in one pass over the bytes
/// (strings skipped eight bytes a step, keys compared only against those few names, as serde
/// reads them: a key with escapes is compared unescaped).
fn objects_in(body: &[u8]) -> Weights {
    // Per open array or object: what each of its elements counts.
    let mut weight: Vec<usize> = Vec::with_capacity(16);
    let mut w = Weights::default();
    // The pod the scan is in (`request.object` or `request.oldObject`), and whether in its
    // metadata.
    let (mut pod, mut in_meta): (Option<bool>, bool) = (None, false);
    // The string just closed; the key of the value about to start.
    let (mut last_string, mut key): (Cow<'_, [u8]>, Cow<'_, [u8]>) = Default::default();
    let mut i = 0;
    while let Some(&b) = body.get(i) {
        i += 1;
        match b {
            b'"' => {
                let start = i;
                let mut escaped = false;
                // To the closing quote, over escaped characters (and control characters,
                // which are no JSON: the parser refuses them).
                loop {
                    i = crate::json::next_escape(body, i.min(body.len()));
                    match body.get(i) {
                        Some(b'"') | None => break,
                        Some(b'\\') => (i, escaped) = (i + 2, true),
                        Some(_) => i += 1,
                    }
                }
                let raw = &body[start..i.min(body.len())];
                last_string = match escaped {
                    false => Cow::Borrowed(raw),
                    true => Cow::Owned(unescaped(raw)),
                };
                i += 1;
            }
            b':' => key = last_string.clone(),
            b'{' => {
                // The review, its request, then the request's fields.
                if weight.len() == 2 {
                    pod = match &*key {
                        b"object" => Some(false),
                        b"oldObject" => Some(true),
                        _ => None,
                    };
                }
                in_meta |= pod.is_some() && weight.len() == 3 && *key == *b"metadata";
                let n = weight.last().copied().unwrap_or(1);
                w.all += n;
                if let Some(old) = pod {
                    let part = if old { &mut w.old } else { &mut w.new };
                    part.all += n;
                    part.meta += if in_meta { n } else { 0 };
                    part.containers += if n == CONTAINER { n } else { 0 };
                }
                weight.push(1);
                key = Cow::Borrowed(b"");
            }
            b'[' => {
                let heavy = HEAVY_LISTS.iter().find(|(name, _)| **name == *key);
                weight.push(heavy.map_or(1, |(_, w)| *w));
                key = Cow::Borrowed(b"");
            }
            b']' | b'}' => {
                weight.pop();
                pod = pod.filter(|_| weight.len() > 2);
                in_meta &= weight.len() > 3;
            }
            b',' => key = Cow::Borrowed(b""),
            _ => {}
        }
    }
    w
}

/// A JSON string's text (without its quotes) as serde reads it, escapes undone; as it is if it
/// is no valid string (the parser refuses the body then).
fn unescaped(raw: &[u8]) -> Vec<u8> {
    let quoted = [&b"\""[..], raw, b"\""].concat();
    serde_json::from_slice::<String>(&quoted).map_or_else(|_| raw.to_vec(), String::into_bytes)
}

/// A pod of an UPDATE as the mutators that check updates read it (the new one, and the one
/// before it, [`PodCtx::old`]): its metadata, and its containers of each kind by name and
/// image, read from the review's bytes without the rest of the spec (serde skips what no field
/// asks for). Neither spec is weighed against `limits.maxObjectsPerReview` nor read whole, so
/// a pod admitted before a limit was lowered, or while the webhook was off, can still be
/// updated. `what` names it in an error.
fn names_and_images(pod: LazyPod<'_>, what: &str) -> Result<Pod, Error> {
    use k8s_openapi::api::core::v1::{Container, EphemeralContainer, PodSpec};
    #[derive(serde::Deserialize)]
    struct NameImage {
        name: String,
        #[serde(default)]
        image: Option<String>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Images {
        containers: Vec<NameImage>,
        init_containers: Option<Vec<NameImage>>,
        ephemeral_containers: Option<Vec<NameImage>>,
    }
    let images: Option<Images> = pod
        .spec
        .map(|r| serde_json::from_slice(r.get().as_bytes()))
        .transpose()
        .map_err(|e| Error::Invalid(format!("request.{what} is not a valid Pod: {e}")))?;
    let container = |c: NameImage| Container {
        name: c.name,
        image: c.image,
        ..Container::default()
    };
    let spec = images.map(|s| PodSpec {
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: s
            .init_containers
            .map(|l| l.into_iter().map(container).collect()),
        ephemeral_containers: s.ephemeral_containers.map(|l| {
            l.into_iter()
                .map(|c| EphemeralContainer {
                    name: c.name,
                    image: c.image,
                    ..EphemeralContainer::default()
                })
                .collect()
        }),
        ..PodSpec::default()
    });
    Ok(Pod {
        metadata: pod.metadata,
        spec,
        status: None,
    })
}

/// Why a chain run gave no verdict: a mutator refused the pod (with what was counted on the way),
/// or something failed.
enum Ran {
    Denied(Denied),
    Failed(Error),
}

impl From<Error> for Ran {
    fn from(e: Error) -> Self {
        Ran::Failed(e)
    }
}

/// No member of the chain applied: the pod allowed as it came.
fn passed_by() -> Result<(Verdict, Effects), Ran> {
    let verdict = Verdict::Ran {
        changed: Vec::new(),
        patch: None,
        warnings: Vec::new(),
    };
    Ok((verdict, Effects::default()))
}

/// The chain on `pod` (of an UPDATE: `update`), then the patch from the pod as it came in.
/// Called only where a member applies ([`crate::mutate::Chain::applies`]): otherwise the pod is
/// allowed as it came ([`passed_by`]), without the copy the patch is diffed against.
fn run(
    chain: &Chain,
    ctx: &PodCtx<'_>,
    mut pod: Pod,
    update: bool,
) -> Result<(Verdict, Effects), Ran> {
    let original = pod.clone();
    let Applied {
        changed,
        mut warnings,
        effects,
    } = chain
        .apply(ctx, &original, &mut pod, update)
        .map_err(Ran::Denied)?;
    // Only where a value was left out: reference delivery never reads one, dry run or not.
    if ctx.dry_run && effects.any_withheld() {
        warnings.push(format!(
            "dry run: secret values were withheld; the patched pod carries {DRY_RUN_PLACEHOLDER:?} where a created pod gets each value"
        ));
    }
    let patch = if changed.is_empty() {
        None
    } else {
        let patch = crate::patch::diff_pods(original, pod)
            .map_err(|e| Ran::Failed(internal("failed to serialise the pod", e)))?;
        (!patch.is_empty()).then_some(patch)
    };
    let verdict = Verdict::Ran {
        changed,
        patch,
        warnings,
    };
    Ok((verdict, effects))
}

impl Subject {
    fn of(req: &AdmissionRequest<LazyPod<'_>>) -> Self {
        let meta = (req.object.as_ref().or(req.old_object.as_ref())).map(|p| &p.metadata);
        Self {
            uid: req.uid.clone(),
            // A pod being created often has no namespace of its own yet: the request's first.
            namespace: req
                .namespace
                .as_deref()
                .or_else(|| req.object.as_ref()?.metadata.namespace.as_deref())
                .unwrap_or_default()
                .to_owned(),
            pod: meta
                .and_then(|m| m.name.as_ref().or(m.generate_name.as_ref()))
                .cloned()
                .unwrap_or_default(),
            operation: operation_str(&req.operation),
        }
    }
}

/// Whether a review by `route` is one that is mutated: of a pod, with an operation and
/// subresource it mutates. Every route mutates pod CREATEs; the image builder's also checks
/// UPDATEs of the pod and of its `ephemeralcontainers` (the only ways to change an image or add
/// a container later: its organisation check would otherwise end at creation). Anything else is
/// allowed untouched.
fn admits<T: kube_core::Resource>(route: Route, req: &AdmissionRequest<T>) -> bool {
    let is_pod = req.kind.group.is_empty() && req.kind.kind == "Pod";
    is_pod
        && match (&req.operation, req.sub_resource.as_deref()) {
            (Operation::Create, None) => true,
            (Operation::Update, None | Some("ephemeralcontainers")) => route == Route::ImageBuilder,
            _ => false,
        }
}

impl App {
    /// The only network I/O: every secret value the chain will need, in one batch, within the
    /// deadline, and what that cost. Failures are internal errors (HTTP 500), so
    /// `failurePolicy` decides.
    async fn resolve(&self, plan: &Plan) -> (Fetched, Result<ResolvedSecrets, Error>) {
        let ids = plan.ids();
        let refs = plan.resolve_ids();
        let images = plan.images();
        let mut fetched = Fetched {
            ids: ids.len() + refs.len(),
            ..Fetched::default()
        };
        if ids.is_empty() && refs.is_empty() && images.is_empty() {
            return (fetched, Ok(ResolvedSecrets::default()));
        }
        let missing = |what: &str, ids: &[String]| {
            Error::Internal(format!(
                "no secret source is configured to {what} {}",
                ids.join(", ")
            ))
        };
        if self.source.is_none() && !ids.is_empty() {
            return (fetched, Err(missing("fetch", &ids)));
        }
        if self.resolver.is_none() && !refs.is_empty() {
            return (fetched, Err(missing("resolve", &refs)));
        }
        if self.entrypoints.is_none() && !images.is_empty() {
            let e =
                Error::Internal("no registry client is configured to read image commands".into());
            return (fetched, Err(e));
        }
        let started = Instant::now();
        // Values, names and image commands in parallel: still one round trip for the pod.
        let all = async {
            let values = fetch_from(self.source.as_deref(), &ids);
            let names = fetch_from(self.resolver.as_deref(), &refs);
            // Each image's answer is the command or why not: the injector refuses, naming the
            // container, so a registry's failure is a denial, not an error.
            let commands = async {
                match &self.entrypoints {
                    Some(e) if !images.is_empty() => crate::registry::lookup_all(e, images).await,
                    _ => crate::registry::Entrypoints::new(),
                }
            };
            let (values, names, commands) = tokio::join!(values, names, commands);
            Ok::<_, crate::secrets::source::SourceError>((values?, names?, commands))
        };
        let result = tokio::time::timeout(self.deadline, all).await;
        fetched.us = started.elapsed().as_micros() as u64;
        let result = match result {
            Ok(Ok((values, names, commands))) => {
                let mut resolved = ResolvedSecrets::default();
                resolved.entrypoints = commands;
                for f in [values, names].into_iter().flatten() {
                    fetched.cache_hits += f.cache_hits;
                    fetched.backend_calls += f.backend_calls;
                    fetched.throttles += f.throttles;
                    resolved.merge(f.values);
                }
                Ok(resolved)
            }
            Ok(Err(e)) => {
                fetched.throttles = e.throttles();
                // The SDK's own text (the error's source) names the account, the role and the
                // secret's ARN: the log gets it; the reply gets the ids, the API and the code.
                let detail = error_chain(&e);
                tracing::error!(
                    error = %e,
                    %detail,
                    "fetching secrets from AWS Secrets Manager failed"
                );
                Err(Error::Internal(if self.errors_in_replies {
                    format!("{detail}{}", credentials_hint(&detail))
                } else {
                    format!("{e} (details in the function's log)")
                }))
            }
            Err(_) => Err(Error::Internal(format!(
                "deadline of {} ms (embedded.deadlineMs) passed while fetching secret {}",
                self.deadline.as_millis(),
                ids.iter()
                    .chain(&refs)
                    .cloned()
                    .chain(
                        images
                            .iter()
                            .map(|q| format!("(the command of image {})", q.image))
                    )
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
        (fetched, result)
    }
}

/// What `source` answers for `ids`; `None` when there is nothing to ask.
async fn fetch_from(
    source: Option<&dyn crate::secrets::source::SecretSource>,
    ids: &[String],
) -> Result<Option<crate::secrets::source::Fetched>, crate::secrets::source::SourceError> {
    match source {
        Some(s) if !ids.is_empty() => s.fetch_many(ids).await.map(Some),
        _ => Ok(None),
    }
}

/// An error and its sources, one after another, for the log (never for a reply).
fn error_chain(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// What to do about a failure whose text says the caller's AWS credentials are the cause: the
/// SDK's own words for it are spread over a chain of sources.
fn credentials_hint(detail: &str) -> &'static str {
    let d = detail.to_ascii_lowercase();
    if d.contains("expiredtoken") || d.contains("token included in the request is expired") {
        " (your AWS credentials have expired: renew them, e.g. aws sso login, and run again)"
    } else if d.contains("no aws credentials") || d.contains("provided credentials") {
        " (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run aws sso login, and run again)"
    } else {
        ""
    }
}

/// The most a reply may hold, what sets it and where a larger one could go (named in the
/// denial): the limit of the path back to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimit {
    pub bytes: usize,
    /// Of `bytes`, what the transport wraps around the reply (a Lambda response's envelope):
    /// the reply itself gets the rest.
    pub reserve: usize,
    /// What puts the limit on what, for the message ("an ALB puts on a Lambda function's
    /// response").
    pub by: &'static str,
    /// Where the webhook could be served with a larger limit, if anywhere.
    pub instead: &'static str,
}

/// A pod CREATE review around `pod` in `namespace`, as the API server sends it, from Flyte's
/// executor: the one review `inject`, the tests and the benches build (each changes what it
/// needs: `inject` its requester and `dryRun`).
pub fn create_review(pod: &serde_json::Value, namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": API_VERSION_V1,
        "kind": "AdmissionReview",
        "request": {
            "uid": "e911857d-c318-11e8-bbad-025000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:flyte:flyte-executor", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// The 413 for a reply over `limit`: `size` measured on the reply built, with its patch's
/// size, or (`patch: None`) estimated before the patch was built. Not an internal error: the
/// pod asks for more than the path back can carry, and a load balancer's 502 would report it
/// as an opaque failure.
pub fn reply_too_large(size: u64, patch: Option<usize>, limit: ReplyLimit) -> crate::error::Denial {
    let size = match patch {
        Some(patch) => format!("is {size} bytes (a JSON Patch of {patch} bytes in base64)"),
        None => format!("would be at least {size} bytes (estimated before its patch was built)"),
    };
    let instead = if limit.instead.is_empty() {
        String::new()
    } else {
        format!(
            ", or serve this webhook where the limit is larger: {}",
            limit.instead
        )
    };
    crate::error::Denial {
        code: 413,
        reason: "ResponseTooLarge",
        message: format!(
            "the webhook's answer for this pod {size}, over the {}-byte limit {}, so it was not sent and the pod is not mutated; make the patch smaller (an ENV_VAR secret is written into every container: a pod with many containers is better served by FILE mounts, or by fewer secrets){instead}",
            limit.bytes, limit.by
        ),
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

fn operation_str(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

enum Parsed<'a> {
    Pod(Box<AdmissionRequest<LazyPod<'a>>>, &'static str),
    Other {
        uid: String,
        api_version: &'static str,
        operation: &'static str,
    },
}

fn api_version_of(v: &str, kind: &str) -> Result<&'static str, Error> {
    if kind != "AdmissionReview" {
        return Err(Error::Invalid(format!(
            "kind is {kind:?}, expected \"AdmissionReview\": the body must be an AdmissionReview sent by the API server"
        )));
    }
    match v {
        API_VERSION_V1 => Ok(API_VERSION_V1),
        API_VERSION_V1BETA1 => Ok(API_VERSION_V1BETA1),
        other => Err(Error::Invalid(format!(
            "unsupported apiVersion {other:?}: expected \"admission.k8s.io/v1\" or \"admission.k8s.io/v1beta1\" (set admissionReviewVersions: [v1] in the MutatingWebhookConfiguration)"
        ))),
    }
}

/// An AdmissionReview as it arrives: kube-core's `AdmissionReview` with its `TypeMeta` as plain
/// fields. kube-core's flattens it (`#[serde(flatten)]`), which makes serde buffer the whole
/// review into an untyped tree before reading any of it: for a pod of 30,000 containers that
/// tree held some 150 MB, about 150 times the body, before the first typed field was read.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReview<T: kube_core::Resource> {
    api_version: String,
    kind: String,
    request: Option<AdmissionRequest<T>>,
    #[serde(default)]
    #[allow(dead_code)]
    response: Option<AdmissionResponse>,
}

impl<T: kube_core::Resource> AdmissionReview<T> {
    /// The request of a review that parsed from `body`, with its checked version.
    fn checked(self, body: &[u8]) -> Result<(AdmissionRequest<T>, &'static str), Error> {
        utf8(body)?;
        let api_version = api_version_of(&self.api_version, &self.kind)?;
        let req = self
            .request
            .ok_or_else(|| Error::Invalid("review has no request: nothing to admit".into()))?;
        Ok((req, api_version))
    }
}

/// One pass for the common case: the review with its pod as a [`LazyPod`] (the metadata typed,
/// the spec kept as its bytes). Where that fails, the review is read again as a Pod and
/// untyped, for the error and to tell "someone else's object" (allowed untouched) from
/// "broken pod" (invalid), but only if the `whole` review is within
/// `limits.maxObjectsPerReview` ([`App::weigh`]): otherwise its error is the answer.
fn parse(body: &[u8], route: Route, whole: bool) -> Result<Parsed<'_>, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Invalid(
            "empty body: expected an AdmissionReview (admission.k8s.io/v1) as JSON".into(),
        ));
    }
    let lazy_err = match serde_json::from_slice::<AdmissionReview<LazyPod<'_>>>(body) {
        Ok(review) => {
            let (req, api_version) = review.checked(body)?;
            return Ok(Parsed::Pod(Box::new(req), api_version));
        }
        Err(e) if !whole => {
            return Err(Error::Invalid(format!(
                "body is not a valid AdmissionReview of a Pod: {}",
                located(body, &e)
            )));
        }
        Err(e) => e,
    };
    // Read as a Pod (what the error says, where it is) and then untyped, to tell "someone
    // else's object" (allowed untouched) from "broken pod" (invalid). [`LazyPod`] accepts what
    // [`Pod`] does and more, but for the bytes of a spec field no type knows, which serde_json
    // skips unchecked and a raw spec must hold as UTF-8: refused as the body's whole.
    let typed_err = match serde_json::from_slice::<AdmissionReview<Pod>>(body) {
        Ok(_) => {
            utf8(body)?;
            lazy_err
        }
        Err(e) => e,
    };
    match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
        Ok(review) => {
            let (req, api_version) = review.checked(body)?;
            if admits(route, &req) {
                return Err(not_a_pod(body, &typed_err));
            }
            Ok(Parsed::Other {
                uid: req.uid,
                api_version,
                operation: operation_str(&req.operation),
            })
        }
        // Not even a review of any object: report what breaks the review itself (a
        // Deployment's bad labels, nesting too deep), not what makes it no Pod.
        Err(untyped_err) => Err(Error::Invalid(format!(
            "body is not a valid AdmissionReview: {}",
            located(body, &untyped_err)
        ))),
    }
}

fn not_a_pod(body: &[u8], typed_err: &serde_json::Error) -> Error {
    Error::Invalid(format!(
        "request.object is not a valid Pod: {}",
        located(body, typed_err)
    ))
}

/// A pod as a review carries it, read only as far as deciding whether anything here applies:
/// its metadata typed, its spec left as the bytes it is in the body (checked to be JSON, not
/// read into types), its status skipped. A pod nothing applies to is allowed from this alone:
/// for a pod of 2,000 containers, most of the work of the answer. It accepts what [`Pod`]'s
/// own deserialiser does (the same `apiVersion` and `kind` checks, a repeated key's last
/// value), and more only inside `spec` (read by [`LazyPod::into_pod`] when a mutator runs) and
/// `status` (never read).
struct LazyPod<'a> {
    metadata: ObjectMeta,
    spec: Option<&'a RawValue>,
}

impl LazyPod<'_> {
    /// The pod read into types, but for its status: no mutator reads or writes a status, the
    /// patch is diffed without it, and the API server resets it on create. Where the spec is no
    /// valid Pod's, the error is the one the whole review read as a Pod gives, at its place in
    /// the body (`body`, from which this pod was read), if the `whole` body is within
    /// `limits.maxObjectsPerReview` ([`App::weigh`]).
    fn into_pod(self, body: &[u8], whole: bool) -> Result<Pod, Error> {
        // From bytes, as the whole review is read: from a `&str` would build every Kubernetes
        // type's deserialiser a second time, for serde_json's other reader.
        let spec = (self.spec)
            .map(|r| serde_json::from_slice(r.get().as_bytes()))
            .transpose()
            .map_err(|e| {
                // Read alone, a spec is less deeply nested than in the review: the whole
                // review never reads where its part did not.
                if whole && let Err(whole) = serde_json::from_slice::<AdmissionReview<Pod>>(body) {
                    return not_a_pod(body, &whole);
                }
                Error::Invalid(format!("request.object is not a valid Pod: {e}"))
            })?;
        Ok(Pod {
            metadata: self.metadata,
            spec,
            status: None,
        })
    }
}

impl<'de> serde::Deserialize<'de> for LazyPod<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use k8s_openapi::Resource as _;
        use serde::de::{Error as _, IgnoredAny, MapAccess, Unexpected};
        #[derive(serde::Deserialize)]
        #[serde(field_identifier, rename_all = "camelCase")]
        enum Field {
            ApiVersion,
            Kind,
            Metadata,
            Spec,
            Status,
            #[serde(other)]
            Other,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = LazyPod<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(Pod::KIND)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut metadata: Option<ObjectMeta> = None;
                let mut spec = None;
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::ApiVersion | Field::Kind => {
                            let got = map.next_value::<String>()?;
                            let kind = matches!(key, Field::Kind);
                            let want = if kind { Pod::KIND } else { Pod::API_VERSION };
                            if got != want {
                                return Err(A::Error::invalid_value(Unexpected::Str(&got), &want));
                            }
                        }
                        Field::Metadata => metadata = map.next_value()?,
                        Field::Spec => spec = map.next_value()?,
                        Field::Status | Field::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(LazyPod {
                    metadata: metadata.unwrap_or_default(),
                    spec,
                })
            }
        }
        d.deserialize_struct(
            Pod::KIND,
            &["apiVersion", "kind", "metadata", "spec", "status"],
            Visitor,
        )
    }
}

/// What kube-core's [`AdmissionRequest`] asks of its object: a Pod's type information.
impl kube_core::Resource for LazyPod<'_> {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube_core::Resource>::kind(&())
    }
    fn group((): &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube_core::Resource>::group(&())
    }
    fn version((): &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube_core::Resource>::version(&())
    }
    fn plural((): &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube_core::Resource>::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// serde_json checks UTF-8 only in the strings it reads (with the JSON path in its error): the
/// bytes of a field no type knows are skipped unchecked. JSON is UTF-8 (RFC 8259 §8.1), so a body
/// that parsed is checked whole.
fn utf8(body: &[u8]) -> Result<(), Error> {
    std::str::from_utf8(body).map(drop).map_err(|e| {
        Error::Invalid(format!(
            "body is not a valid AdmissionReview: not JSON (invalid UTF-8 at byte {}, in a field \
             no Kubernetes type knows)",
            e.valid_up_to()
        ))
    })
}

/// The serde error with the JSON path of what it is about, `(at request.object.spec.containers[0])`
/// (computed only on the error path). The path is read off the body's bytes up to where
/// serde_json stopped ([`json_path_at`]), not by parsing the body again through a path-tracking
/// deserialiser: that would build a second copy of every Kubernetes type's deserialiser into the
/// binary (a fifth of the Lambda build's code) for the error path alone.
fn located(body: &[u8], err: &serde_json::Error) -> String {
    let message = err.to_string();
    // A syntax error's position counts the byte serde_json looked at and refused: the path is
    // where that byte is.
    let column = match err.classify() {
        serde_json::error::Category::Syntax => err.column().saturating_sub(1),
        _ => err.column(),
    };
    // A list read as something else is refused as soon as its `[` is read: the error is about
    // the list, not about an element (which, unless it is a list itself, would have been read).
    let about_list = message.starts_with("invalid type: sequence");
    match json_path_at(body, err.line(), column, about_list) {
        Some(path) if !path.is_empty() => format!("{message} (at {path})"),
        _ => message,
    }
}

/// The JSON path (`a.b[0].c`, keys unescaped) of the place at `line`/`column` of `body` where
/// serde_json stopped (its position: `column` bytes into `line`, 1-based), `None` where there is
/// no position. serde_json places an error after the value it is about (a struct's, such as a
/// missing field, after its closing brace), or before one it would not read: either way that
/// value is the path's last step. Inside an object between values (a key seen twice), the path
/// ends at the object.
fn json_path_at(body: &[u8], line: usize, column: usize, about_list: bool) -> Option<String> {
    if line == 0 {
        return None;
    }
    // Where `line` starts: at 0, or after the newline that ends the one before it.
    let newlines = body.iter().enumerate().filter(|(_, b)| **b == b'\n');
    let start = std::iter::once(0)
        .chain(newlines.map(|(i, _)| i + 1))
        .nth(line - 1)?;
    let at = (start + column).min(body.len());
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        /// An object: expecting a key, in it, or after it (before `:`).
        Key,
        /// An object: after `:`, its value not started.
        Colon,
        /// A list: expecting an element.
        Element,
        /// A value begun (a scalar or string being read) or read.
        Value,
    }
    // Per open container: whether it is a list, its state, its current key (byte range) or
    // element index.
    struct Frame {
        list: bool,
        state: In,
        key: (usize, usize),
        index: usize,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let (mut in_string, mut escaped, mut string_start) = (false, false, 0usize);
    // The last byte read outside a string that is not blank.
    let mut last = 0u8;
    for (i, &b) in body[..at].iter().enumerate() {
        if !in_string && !b.is_ascii_whitespace() {
            last = b;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if let Some(f) = stack.last_mut()
                    && !f.list
                    && f.state == In::Key
                {
                    f.key = (string_start, i);
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string_start = i + 1;
                if let Some(f) = stack.last_mut()
                    && f.state != In::Key
                {
                    f.state = In::Value;
                }
            }
            b'{' | b'[' => {
                if let Some(f) = stack.last_mut() {
                    f.state = In::Value;
                }
                stack.push(Frame {
                    list: b == b'[',
                    state: if b == b'[' { In::Element } else { In::Key },
                    key: (0, 0),
                    index: 0,
                });
            }
            b'}' | b']' => {
                stack.pop();
            }
            b' ' | b'\n' | b'\r' | b'\t' => {}
            _ => {
                if let Some(f) = stack.last_mut() {
                    f.state = match b {
                        b':' => In::Colon,
                        b',' if f.list => {
                            f.index += 1;
                            In::Element
                        }
                        b',' => In::Key,
                        _ => In::Value,
                    };
                }
            }
        }
    }
    // What serde_json looks at next: a value about to be read there is in the path.
    let next = body[at..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .copied();
    // In a list, anything but its end is read as an element.
    let starts_value = next.is_some_and(|b| b != b']');
    let list_refused = about_list && last == b'[' && next != Some(b'[');
    let mut path = String::new();
    let innermost = stack.len().saturating_sub(1);
    for (n, f) in stack.iter().enumerate() {
        let included = n < innermost
            || match f.state {
                In::Key => false,
                In::Element => starts_value && !(f.index == 0 && list_refused),
                In::Colon | In::Value => true,
            };
        if !included {
            break;
        }
        if f.list {
            path.push_str(&format!("[{}]", f.index));
        } else {
            if !path.is_empty() {
                path.push('.');
            }
            let raw = &body[f.key.0..f.key.1];
            let key = match raw.contains(&b'\\') {
                false => String::from_utf8_lossy(raw),
                true => serde_json::from_slice(&body[f.key.0 - 1..=f.key.1]).unwrap_or_default(),
            };
            path.push_str(&key);
        }
    }
    Some(path)
}

/// The one reply type: every answer, allowed or not, is this, written once by
/// [`ReviewOut::write`].
struct ReviewOut<'a> {
    api_version: &'a str,
    uid: &'a str,
    /// For `allowed: false`; none when allowed.
    status: Option<StatusOut<'a>>,
    /// The JSON Patch, written as base64 (as the API documents it; kube-core would write a
    /// number array), with `patchType: JSONPatch`.
    patch: Option<&'a [u8]>,
    /// The one audit annotation, `denial-reason`.
    denial_reason: Option<&'static str>,
    warnings: &'a [String],
}

#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

impl ReviewOut<'_> {
    /// The review as JSON, fields in the API's order, each value written by serde; the patch's
    /// base64 is encoded straight into the body. (Through serde's string writer it would be
    /// scanned byte by byte for escapes base64 cannot contain: 2.7 times the cost, 17 µs on a
    /// 19 kB patch, 7 ms on the 10,000-container pod's.)
    fn write(&self, body: &mut Vec<u8>) -> std::io::Result<()> {
        use base64::Engine;
        body.extend_from_slice(b"{\"apiVersion\":");
        serde_json::to_writer(&mut *body, self.api_version)?;
        body.extend_from_slice(b",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":");
        serde_json::to_writer(&mut *body, self.uid)?;
        body.extend_from_slice(if self.status.is_none() {
            b",\"allowed\":true"
        } else {
            b",\"allowed\":false"
        });
        if let Some(status) = &self.status {
            body.extend_from_slice(b",\"status\":");
            serde_json::to_writer(&mut *body, status)?;
        }
        if let Some(json) = self.patch {
            body.extend_from_slice(b",\"patch\":\"");
            let at = body.len();
            body.resize(at + base64::encoded_len(json.len(), true).unwrap_or(0), 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(json, &mut body[at..])
                .map_err(std::io::Error::other)?;
            body.truncate(at + written);
            body.extend_from_slice(b"\",\"patchType\":\"JSONPatch\"");
        }
        if let Some(reason) = self.denial_reason {
            body.extend_from_slice(b",\"auditAnnotations\":{\"denial-reason\":");
            serde_json::to_writer(&mut *body, reason)?;
            body.push(b'}');
        }
        if !self.warnings.is_empty() {
            body.extend_from_slice(b",\"warnings\":");
            serde_json::to_writer(&mut *body, self.warnings)?;
        }
        body.extend_from_slice(b"}}");
        Ok(())
    }
}

/// `status.reason` must be one of Kubernetes' `StatusReason`s; ours goes to the audit annotation.
fn standard_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        413 => "RequestEntityTooLarge",
        _ => "InternalError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply allowing a pod, with `patch` and `warnings`.
    fn allowed_reply(
        uid: &str,
        api_version: &'static str,
        patch: Option<&Patch>,
        warnings: &[String],
    ) -> Reply {
        let verdict = Verdict::Ran {
            changed: Vec::new(),
            patch: patch.cloned(),
            warnings: warnings.to_vec(),
        };
        let subject = Subject {
            uid: uid.to_owned(),
            ..Subject::default()
        };
        Admission::early(subject, api_version, Ok(verdict)).reply()
    }

    /// The reply for `err`.
    fn error_reply(err: &Error, uid: &str, api_version: &'static str) -> Reply {
        Answer::error(err, uid, api_version).into()
    }

    /// The path [`located`] reads off the bytes is the one a parse tracking it
    /// (serde_path_to_error, which the error path used to run) gives, for every error a review
    /// can have: each value of three reviews replaced by a value of every JSON type, or removed,
    /// written compact and pretty (errors on later lines), a key twice, and the bodies cut short
    /// or with a stray byte (syntax errors), for the Pod parse and the any-object parse.
    #[test]
    fn error_paths_read_off_the_bytes_are_the_ones_a_tracking_parse_gives() {
        fn tracked<T: serde::de::DeserializeOwned>(body: &[u8], err: &serde_json::Error) -> String {
            let mut de = serde_json::Deserializer::from_slice(body);
            match serde_path_to_error::deserialize::<_, T>(&mut de) {
                Err(e) if e.path().to_string() != "." => format!("{} (at {})", e.inner(), e.path()),
                _ => err.to_string(),
            }
        }
        // The same path, or one that goes on from it to the value the error is about (a
        // Kubernetes type that checks a field once the whole object is read reports the object;
        // the bytes show which of its values it was).
        fn agree(ours: &str, tracked: &str, body: &[u8]) {
            let body = &body[..body.len().min(400)];
            // `?` alone: the tracking parse lost its place (a key being read at the top, or in an
            // object it had buffered); the bytes still say where.
            if tracked.ends_with(" (at ?)") {
                assert!(
                    ours.starts_with(tracked.trim_end_matches(" (at ?)")),
                    "{ours}"
                );
                return;
            }
            let (Some(o), Some(t)) = (ours.split_once(" (at "), tracked.split_once(" (at ")) else {
                assert_eq!(ours, tracked, "{}", String::from_utf8_lossy(body));
                return;
            };
            assert_eq!(o.0, t.0);
            let (o, t) = (o.1.trim_end_matches(')'), t.1.trim_end_matches(')'));
            // `?`: a key being read, which the tracking parse cannot name; the path is its object.
            let t = t.trim_end_matches('?').trim_end_matches('.');
            assert!(
                o == t || o.starts_with(&format!("{t}.")) || o.starts_with(&format!("{t}[")),
                "ours {o:?}, tracked {t:?}: {}",
                String::from_utf8_lossy(body)
            );
        }
        fn check(body: &[u8], checked: &mut usize) {
            if let Err(e) = serde_json::from_slice::<AdmissionReview<Pod>>(body) {
                *checked += 1;
                agree(
                    &located(body, &e),
                    &tracked::<AdmissionReview<Pod>>(body, &e),
                    body,
                );
            }
            if let Err(e) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
                *checked += 1;
                agree(
                    &located(body, &e),
                    &tracked::<AdmissionReview<DynamicObject>>(body, &e),
                    body,
                );
            }
        }
        fn pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, child) in m {
                        let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                        out.push(p.clone());
                        pointers(child, p, out);
                    }
                }
                serde_json::Value::Array(a) => {
                    for (i, child) in a.iter().enumerate() {
                        let p = format!("{at}/{i}");
                        out.push(p.clone());
                        pointers(child, p, out);
                    }
                }
                _ => {}
            }
        }
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");
        let read = |p: &str| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(format!("{fixtures}/{p}")).unwrap()).unwrap()
        };
        let maximal = create_review(&read("kubernetes-api/k8s-v1.33.0-core.v1.Pod.json"), "ns");
        let bases = [
            read("bad-input/base-review.json"),
            read("reviews/flyte-task-k8s-env.json"),
            maximal,
        ];
        let replacements = [
            serde_json::json!(5),
            serde_json::json!(-1.5),
            serde_json::json!("x"),
            serde_json::json!(true),
            serde_json::json!(null),
            serde_json::json!([]),
            serde_json::json!([1]),
            serde_json::json!({}),
            serde_json::json!({"a": 1}),
        ];
        let mut checked = 0;
        for (n, base) in bases.iter().enumerate() {
            let mut all = Vec::new();
            pointers(base, String::new(), &mut all);
            // Every value of the small reviews; of the maximal pod's, one in thirty-one.
            for (i, p) in all.iter().enumerate() {
                if n == 2 && i % 31 != 0 {
                    continue;
                }
                let mut variants: Vec<serde_json::Value> = replacements
                    .iter()
                    .map(|r| {
                        let mut v = base.clone();
                        *v.pointer_mut(p).unwrap() = r.clone();
                        v
                    })
                    .collect();
                let (parent, last) = p.split_at(p.rfind('/').unwrap());
                let mut removed = base.clone();
                match removed.pointer_mut(parent).unwrap() {
                    serde_json::Value::Object(m) => {
                        m.shift_remove(&last[1..].replace("~1", "/").replace("~0", "~"));
                    }
                    serde_json::Value::Array(a) => {
                        a.remove(last[1..].parse::<usize>().unwrap());
                    }
                    _ => {}
                }
                variants.push(removed);
                for v in &variants {
                    check(&serde_json::to_vec(v).unwrap(), &mut checked);
                    check(&serde_json::to_vec_pretty(v).unwrap(), &mut checked);
                }
            }
            // A key twice, and the body cut short or with a stray byte every so often.
            let body = serde_json::to_vec(base).unwrap();
            let text = String::from_utf8(body.clone()).unwrap();
            for key in ["\"uid\":", "\"name\":", "\"containers\":", "\"image\":"] {
                if let Some(at) = text.find(key) {
                    let twice = format!("{}{key}\"dup\",{}", &text[..at], &text[at..]);
                    check(twice.as_bytes(), &mut checked);
                }
            }
            for at in (1..body.len()).step_by(if n == 2 { 401 } else { 37 }) {
                check(&body[..at], &mut checked);
                for stray in [b'x', b'}', b']', b',', b'"'] {
                    let mut bad = body.clone();
                    bad.insert(at, stray);
                    check(&bad, &mut checked);
                }
            }
        }
        assert!(checked > 4_000, "{checked} errors compared");
    }

    /// The count a byte at a time, as it was before strings were skipped a word at a time.
    fn objects_bytewise(body: &[u8]) -> usize {
        let mut weight: Vec<usize> = Vec::new();
        let (mut objects, mut in_string, mut escaped) = (0usize, false, false);
        let (mut string_start, mut last_string, mut key): (usize, &[u8], &[u8]) = (0, b"", b"");
        for (i, &b) in body.iter().enumerate() {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                    last_string = &body[string_start..i];
                }
                continue;
            }
            match b {
                b'"' => (in_string, string_start) = (true, i + 1),
                b':' => key = last_string,
                b'{' => {
                    objects += weight.last().copied().unwrap_or(1);
                    weight.push(1);
                    key = b"";
                }
                b'[' => {
                    let heavy = HEAVY_LISTS.iter().find(|(name, _)| *name == key);
                    weight.push(heavy.map_or(1, |(_, w)| *w));
                    key = b"";
                }
                b']' | b'}' => drop(weight.pop()),
                b',' => key = b"",
                _ => {}
            }
        }
        objects
    }

    proptest::proptest! {
        /// Skipping strings a word at a time counts what the byte-at-a-time scan counted, on
        /// text made of the bytes that matter (quotes, escapes, brackets, heavy names, control
        /// characters), well-formed or not.
        #[test]
        fn skipping_strings_by_words_counts_as_the_bytewise_scan(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "\"", "\\", "\\\"", "{", "}", "[", "]", ":", ",", "a", "\n", "\u{1}",
                "\"containers\"", "\"volumes\":", "\"initContainers\": [", "é", " ", "0123456789",
            ]), 0..80)
        ) {
            let body = parts.concat();
            proptest::prop_assert_eq!(objects_in(body.as_bytes()).all, objects_bytewise(body.as_bytes()));
        }
    }

    /// Every fixture of the repository (reviews, pods, the bad-input corpus' bodies).
    #[test]
    fn the_fixtures_count_as_the_bytewise_scan() {
        fn walk(dir: &std::path::Path, seen: &mut usize) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, seen);
                } else if path.extension().is_some_and(|e| e == "json" || e == "body") {
                    let body = std::fs::read(&path).unwrap();
                    let (a, b) = (objects_in(&body).all, objects_bytewise(&body));
                    assert_eq!(a, b, "{}", path.display());
                    *seen += 1;
                }
            }
        }
        let mut seen = 0;
        walk(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")),
            &mut seen,
        );
        assert!(seen > 100, "{seen} fixtures");
    }

    #[test]
    fn objects_are_counted_outside_strings_with_containers_and_volumes_heavy() {
        let all = |body: &[u8]| {
            let w = objects_in(body);
            assert_eq!(
                (&w.new, &w.old),
                (&PodWeight::default(), &PodWeight::default())
            );
            w.all
        };
        assert_eq!(all(br#"{"a": {"b": [{}, {}]}}"#), 4);
        assert_eq!(all(br#"{"s": "{{{\"{", "t": "\\"}"#), 1);
        let pod = br#"{"spec": {"containers": [{"name": "a", "env": [{"name": "x"}]}, {"name": "b"}], "volumes": [{"name": "v", "emptyDir": {}}], "initContainers": []}}"#;
        // The pod and its spec; two containers (8 each) and a volume (16); an env var and an
        // emptyDir.
        assert_eq!(all(pod), 2 + 2 * 8 + 16 + 2);
        // A key named like a heavy list inside a string, or a value that is not a list.
        assert_eq!(all(br#"{"x": "containers", "containers": {"a": {}}}"#), 3);
        // A key with escapes, as serde reads it.
        assert_eq!(
            all(br#"{"c\u006fntainers": [{}], "v\u006flumes": [{}]}"#),
            1 + 8 + 16
        );
        // An UPDATE's pods, each counted apart with its metadata and containers: the review,
        // its request and the new pod (the pod, its metadata, labels and spec, a container of 8
        // and its `metadata`: 13, its metadata 2, its container 8) and the old pod (the same,
        // its `metadata` key escaped); an `object` or `oldObject` deeper in, or a `metadata`
        // deeper in a pod, is part of what holds it.
        let pod = r#"{"metadata": {"labels": {}}, "spec": {"containers": [{"name": "a", "metadata": {}}]}}"#;
        let update = format!(
            r#"{{"request": {{"object": {pod}, "oldObject": {}, "x": {{"oldObject": {{}}, "object": {{}}}}}}}}"#,
            pod.replacen("metadata", "m\\u0065tadata", 1)
        );
        let w = objects_in(update.as_bytes());
        assert_eq!(
            w,
            Weights {
                all: 2 + 13 + 13 + 3,
                new: PodWeight {
                    all: 13,
                    meta: 2,
                    containers: 8
                },
                old: PodWeight {
                    all: 13,
                    meta: 2,
                    containers: 8
                }
            }
        );
    }
    use base64::Engine;

    #[test]
    fn the_reply_carries_the_patch_as_base64_and_escapes_what_needs_it() {
        // Long, with escapes and non-ASCII in the values and paths, and a uid that needs
        // escaping.
        let env: Vec<serde_json::Value> = (0..500)
            .map(|i| serde_json::json!({"name": "K\"ey\\é", "value": format!("v\n{i}")}))
            .collect();
        let patch = crate::patch::tests::diff_values(
            &serde_json::json!({"env": [], "a/b~c": 1}),
            &serde_json::json!({"env": env}),
        )
        .unwrap();
        assert_eq!(patch.len(), 501);
        assert!(patch.as_json().len() > 3 * 8 * 1024);
        let warnings = ["a \"quoted\" warning".to_owned()];
        let uid = "uid-\"1\"\u{7}";
        for (patch, warnings) in [
            (None, &[][..]),
            (None, &warnings[..]),
            (Some(&patch), &[][..]),
            (Some(&patch), &warnings[..]),
        ] {
            let reply = allowed_reply(uid, API_VERSION_V1BETA1, patch, warnings);
            assert_eq!(reply.status, 200);
            let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            let mut want = serde_json::json!({
                "apiVersion": API_VERSION_V1BETA1,
                "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": true},
            });
            if let Some(p) = patch {
                want["response"]["patch"] = base64::engine::general_purpose::STANDARD
                    .encode(p.as_json())
                    .into();
                want["response"]["patchType"] = "JSONPatch".into();
            }
            if !warnings.is_empty() {
                want["response"]["warnings"] = serde_json::json!(warnings);
            }
            assert!(
                v == want,
                "reply differs: {}",
                String::from_utf8_lossy(&reply.body)
            );
        }
        // Every length modulo 3 ends the base64 correctly (its padding).
        for n in 1..=4 {
            let small = crate::patch::tests::diff_values(
                &serde_json::json!({"x".repeat(n): 1}),
                &serde_json::json!({}),
            )
            .unwrap();
            let reply = allowed_reply("u", API_VERSION_V1, Some(&small), &[]);
            let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(v["response"]["patch"].as_str().unwrap())
                .unwrap();
            assert_eq!(decoded, small.as_json());
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&decoded).unwrap(),
                serde_json::json!([{"op": "remove", "path": "/".to_owned() + &"x".repeat(n)}])
            );
        }
    }

    #[test]
    fn an_error_reply_carries_the_status_and_the_denial_reason() {
        let denied = Error::Denied(Denial::forbidden("ImageNotAuthorized", "not \"yours\""));
        let reply = error_reply(&denied, "u\n1", API_VERSION_V1);
        assert_eq!(reply.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": API_VERSION_V1,
                "kind": "AdmissionReview",
                "response": {
                    "uid": "u\n1",
                    "allowed": false,
                    "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "not \"yours\""},
                    "auditAnnotations": {"denial-reason": "ImageNotAuthorized"},
                },
            })
        );
        // What the API server reads, by kube-core's own type.
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&reply.body).unwrap();
        let response = review.response.unwrap();
        assert!(!response.allowed);
        assert_eq!(response.result.code, 403);

        let invalid = error_reply(&Error::Invalid("bad".into()), "", API_VERSION_V1BETA1);
        assert_eq!(invalid.status, 400);
        let v: serde_json::Value = serde_json::from_slice(&invalid.body).unwrap();
        assert_eq!(v["apiVersion"], API_VERSION_V1BETA1);
        assert_eq!(v["response"]["status"]["code"], 400);
        assert!(v["response"].get("auditAnnotations").is_none());
    }

    #[test]
    fn only_the_ids_and_the_aws_error_code_of_a_failed_fetch_reach_the_reply() {
        let sdk_text = "AccessDeniedException: User: arn:aws:sts::123456789012:assumed-role/r/f is not authorized";
        let e = crate::secrets::source::SourceError::Call {
            api: crate::secrets::source::Api::GetSecretValue,
            ids: "u__org__o__domain__d__project__p__key__k".to_owned(),
            code: "AccessDeniedException".to_owned(),
            source: sdk_text.into(),
        };
        let reply = e.to_string();
        assert_eq!(
            reply,
            "failed to fetch secret u__org__o__domain__d__project__p__key__k: GetSecretValue failed with AccessDeniedException"
        );
        assert!(!reply.contains("arn:") && !reply.contains("123456789012"));
        let logged = error_chain(&e);
        assert!(
            logged.ends_with(sdk_text),
            "the log keeps the detail: {logged}"
        );
    }
}
