//! The admission path: parse the review, decide whether it is ours, run the chain, diff, answer.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube_core::DynamicObject;
use kube_core::admission::{AdmissionRequest, AdmissionReview, Operation};
use serde::Serialize;

use crate::app::App;
use crate::error::{Denial, Error};
use crate::metrics::AdmissionFacts;
use crate::mutate::{Applied, PodCtx, Route, Tally};
use crate::secrets::embedded::DRY_RUN_PLACEHOLDER;
use crate::secrets::plan::Planned;
use crate::secrets::{Plan, ResolvedSecrets};

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

/// An HTTP answer: status and a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The facts of one admission, for the audit log line.
#[derive(Debug, Default)]
struct Audit {
    uid: String,
    namespace: String,
    pod: String,
    operation: &'static str,
    decision: &'static str,
    reason: &'static str,
    mutators: Vec<&'static str>,
    patch_ops: usize,
    secrets_fetched: usize,
    fetch_us: u64,
    cache_hits: u32,
    backend_calls: u32,
    throttles: u32,
    injected: Vec<(crate::config::SecretManagerType, u32)>,
    images: Vec<(crate::mutate::ImageCount, u32)>,
    patch_bytes: usize,
    /// The refusal's message (names ids and keys, never values).
    error: String,
}

impl App {
    /// Answers one AdmissionReview body that arrived by `route`. Never panics on bad input.
    pub async fn review(&self, route: Route, body: &[u8]) -> Reply {
        let started = Instant::now();
        let mut audit = Audit::default();
        let reply = match self.admit(route, body, &mut audit).await {
            Ok(reply) => reply,
            Err((err, api_version)) => {
                audit.decision = match err {
                    Error::Invalid(_) => "invalid",
                    Error::Denied(_) => "denied",
                    Error::Internal(_) => "error",
                };
                audit.reason = match &err {
                    Error::Denied(d) => d.reason,
                    other => other.reason(),
                };
                audit.error = err.to_string();
                error_reply(&err, &audit.uid, api_version)
            }
        };
        let duration_us = started.elapsed().as_micros() as u64;
        // One set of facts for both reports: the Prometheus counters and the EMF line.
        let facts = AdmissionFacts {
            route: route.as_str(),
            decision: audit.decision,
            reason: audit.reason,
            duration_us,
            patch_ops: audit.patch_ops,
            patch_bytes: audit.patch_bytes,
            mutators: &audit.mutators,
            injected: &audit.injected,
            images: &audit.images,
            fetch_ids: audit.secrets_fetched,
            backend_calls: audit.backend_calls,
            cache_hits: audit.cache_hits,
            throttles: audit.throttles,
        };
        self.counters.record(&facts);
        if let Some(m) = &self.metrics {
            m.emit(&facts);
        }
        // Strings as `&str` fields, not `%` (Display): the JSON layer then writes them without
        // formatting each into a temporary string first.
        let mutators = audit.mutators.join(",");
        match audit.decision {
            "invalid" => tracing::warn!(
                route = route.as_str(),
                uid = audit.uid.as_str(),
                decision = audit.decision,
                reason = audit.reason,
                error = audit.error.as_str(),
                status = reply.status,
                duration_us,
                "admission"
            ),
            "error" => tracing::error!(
                route = route.as_str(),
                uid = audit.uid.as_str(),
                namespace = audit.namespace.as_str(),
                pod = audit.pod.as_str(),
                operation = audit.operation,
                decision = audit.decision,
                error = audit.error.as_str(),
                status = reply.status,
                duration_us,
                "admission"
            ),
            _ => tracing::info!(
                route = route.as_str(),
                uid = audit.uid.as_str(),
                namespace = audit.namespace.as_str(),
                pod = audit.pod.as_str(),
                operation = audit.operation,
                decision = audit.decision,
                reason = (!audit.reason.is_empty()).then_some(audit.reason),
                error = (!audit.error.is_empty()).then_some(audit.error.as_str()),
                mutators = mutators.as_str(),
                patch_ops = audit.patch_ops,
                secrets_fetched = audit.secrets_fetched,
                cache_hits = audit.cache_hits,
                fetch_us = audit.fetch_us,
                duration_us,
                "admission"
            ),
        }
        reply
    }

    async fn admit(
        &self,
        route: Route,
        body: &[u8],
        audit: &mut Audit,
    ) -> Result<Reply, (Error, &'static str)> {
        let parsed = parse(body, route).map_err(|e| (e, API_VERSION_V1))?;
        let (req, api_version) = match parsed {
            Parsed::Pod(req, v) => (req, v),
            Parsed::Other {
                uid,
                api_version,
                operation,
            } => {
                audit.uid = uid;
                audit.operation = operation;
                audit.decision = "allowed";
                audit.reason = "NotAPodCreate";
                return Ok(allowed_reply(&audit.uid, api_version));
            }
        };
        audit.uid = req.uid.clone();
        audit.operation = operation_str(&req.operation);
        audit.namespace = req.namespace.clone().unwrap_or_default();
        if let Some(pod) = req.object.as_ref().or(req.old_object.as_ref()) {
            audit.pod = pod
                .metadata
                .name
                .clone()
                .or_else(|| pod.metadata.generate_name.clone())
                .unwrap_or_default();
        }
        let is_pod = req.kind.group.is_empty() && req.kind.kind == "Pod";
        if !is_pod || !admits(route, &req.operation, req.sub_resource.as_deref()) {
            audit.decision = "allowed";
            audit.reason = "NotAPodCreate";
            return Ok(allowed_reply(&audit.uid, api_version));
        }
        if req.operation == Operation::Update {
            return self.admit_update(route, *req, api_version, audit);
        }
        let Some(mut pod) = req.object else {
            return Err((
                Error::Invalid(
                    "review of a pod CREATE has no request.object; only pod CREATE reviews are mutated"
                        .into(),
                ),
                api_version,
            ));
        };
        let namespace = review_namespace(req.namespace.as_deref(), &pod);
        audit.namespace.clone_from(&namespace);

        let groups = req.user_info.groups.clone().unwrap_or_default();
        let tally = Tally::new();
        let ctx = PodCtx {
            namespace: &namespace,
            route,
            username: req.user_info.username.as_deref().unwrap_or_default(),
            groups: &groups,
            dry_run: req.dry_run,
            tally: &tally,
            old: None,
        };
        let plan = self.secrets.plan(&ctx, &pod);
        let resolved = self
            .resolve(&plan, audit)
            .await
            .map_err(|e| (e, api_version))?;
        let secrets = Planned {
            mutator: &self.secrets,
            plan: &plan,
            resolved: &resolved,
        };
        let original = pod.clone();
        let applied = self
            .chain
            .apply_from(&ctx, &original, &mut pod, Some(&secrets));
        finish(audit, api_version, &ctx, applied, original, pod)
    }
}

impl App {
    /// A pod UPDATE, or an ephemeral container added through `pods/ephemeralcontainers` (whose
    /// review carries the whole Pod), on a route that checks them ([`admits`]): only the
    /// mutators that [`crate::mutate::PodMutator::checks_updates`] run, with the pod before
    /// the update beside it. Nothing is fetched: an UPDATE gets no secrets.
    fn admit_update(
        &self,
        route: Route,
        req: AdmissionRequest<Pod>,
        api_version: &'static str,
        audit: &mut Audit,
    ) -> Result<Reply, (Error, &'static str)> {
        let (Some(mut pod), Some(old)) = (req.object, req.old_object) else {
            return Err((
                Error::Invalid(
                    "review of a pod UPDATE needs both request.object and request.oldObject, as the API server sends them"
                        .into(),
                ),
                api_version,
            ));
        };
        let namespace = review_namespace(req.namespace.as_deref(), &pod);
        audit.namespace.clone_from(&namespace);
        let tally = Tally::new();
        let groups = req.user_info.groups.clone().unwrap_or_default();
        let ctx = PodCtx {
            namespace: &namespace,
            route,
            username: req.user_info.username.as_deref().unwrap_or_default(),
            groups: &groups,
            dry_run: req.dry_run,
            tally: &tally,
            old: Some(&old),
        };
        let original = pod.clone();
        let applied = self.chain.apply_update(&ctx, &original, &mut pod);
        finish(audit, api_version, &ctx, applied, original, pod)
    }
}

/// The namespace a pod review is for: the request's, else the pod's own.
fn review_namespace(request: Option<&str>, pod: &Pod) -> String {
    request
        .or(pod.metadata.namespace.as_deref())
        .unwrap_or_default()
        .to_owned()
}

/// The end of a chain run, CREATE or UPDATE: what the run counted goes into the audit (on a
/// denial too: the image builder's failure counts are the point), its notes follow the
/// mutators' warnings, and the reply carries the patch from `original` to `pod`.
fn finish(
    audit: &mut Audit,
    api_version: &'static str,
    ctx: &PodCtx<'_>,
    applied: Result<Applied, crate::error::Denial>,
    original: Pod,
    pod: Pod,
) -> Result<Reply, (Error, &'static str)> {
    audit.images = ctx.tally.images();
    let Applied {
        changed,
        mut warnings,
    } = applied.map_err(|d| (Error::Denied(d), api_version))?;
    warnings.extend(ctx.tally.notes());
    audit.mutators.clone_from(&changed);
    audit.injected = ctx.tally.injected();
    // Only where a value was left out: reference delivery never reads one, dry run or not.
    if ctx.dry_run && ctx.tally.any_withheld() {
        warnings.push(format!(
            "dry run: secret values were withheld; the patched pod carries {DRY_RUN_PLACEHOLDER:?} where a created pod gets each value"
        ));
    }
    patched_reply(audit, api_version, &changed, original, pod, &warnings)
}

/// The allowed reply for a chain run that changed `changed` (the patch from `original` to
/// `pod`, if any), with the audit's decision and patch facts filled in.
fn patched_reply(
    audit: &mut Audit,
    api_version: &'static str,
    changed: &[&'static str],
    original: Pod,
    pod: Pod,
    warnings: &[String],
) -> Result<Reply, (Error, &'static str)> {
    let patch = if changed.is_empty() {
        None
    } else {
        let patch = crate::patch::diff_pods(original, pod)
            .map_err(|e| (internal("failed to serialise the pod", e), api_version))?;
        (!patch.is_empty()).then_some(patch)
    };
    audit.patch_ops = patch.as_ref().map_or(0, crate::patch::Patch::len);
    audit.decision = if patch.is_some() {
        "mutated"
    } else {
        "allowed"
    };
    let (reply, patch_bytes) = write_allowed(&audit.uid, api_version, patch.as_ref(), warnings)
        .map_err(|e| (internal("failed to serialise the patch", e), api_version))?;
    audit.patch_bytes = patch_bytes;
    Ok(reply)
}

/// Whether a pod review by `route` with this operation and subresource is mutated. Every route
/// mutates pod CREATEs; the image builder's also checks UPDATEs of the pod and of its
/// `ephemeralcontainers` (the only ways to change an image or add a container later: its
/// organisation check would otherwise end at creation). Anything else is allowed untouched.
fn admits(route: Route, operation: &Operation, sub_resource: Option<&str>) -> bool {
    match (operation, sub_resource) {
        (Operation::Create, None) => true,
        (Operation::Update, None | Some("ephemeralcontainers")) => route == Route::ImageBuilder,
        _ => false,
    }
}

impl App {
    /// The only network I/O: every secret value the chain will need, in one batch, within the
    /// deadline. Failures are internal errors (HTTP 500), so `failurePolicy` decides.
    async fn resolve(&self, plan: &Plan, audit: &mut Audit) -> Result<ResolvedSecrets, Error> {
        let ids = plan.ids();
        let refs = plan.resolve_ids();
        let images = plan.images();
        if ids.is_empty() && refs.is_empty() && images.is_empty() {
            return Ok(ResolvedSecrets::default());
        }
        audit.secrets_fetched = ids.len() + refs.len();
        let missing = |what: &str, ids: &[String]| {
            Error::Internal(format!(
                "no secret source is configured to {what} {}",
                ids.join(", ")
            ))
        };
        let source = match &self.source {
            Some(s) => Some(s),
            None if ids.is_empty() => None,
            None => return Err(missing("fetch", &ids)),
        };
        let resolver = match &self.resolver {
            Some(r) => Some(r),
            None if refs.is_empty() => None,
            None => return Err(missing("resolve", &refs)),
        };
        let entrypoints = match &self.entrypoints {
            Some(e) => Some(e),
            None if images.is_empty() => None,
            None => {
                return Err(Error::Internal(
                    "no registry client is configured to read image commands".into(),
                ));
            }
        };
        let started = Instant::now();
        // Values, names and image commands in parallel: still one round trip for the pod.
        let both = async {
            let values = async {
                match source {
                    Some(s) if !ids.is_empty() => s.fetch_many(&ids).await.map(Some),
                    _ => Ok(None),
                }
            };
            let names = async {
                match resolver {
                    Some(r) if !refs.is_empty() => r.fetch_many(&refs).await.map(Some),
                    _ => Ok(None),
                }
            };
            // Each image's answer is the command or why not: the injector refuses, naming the
            // container, so a registry's failure is a denial, not an error.
            let commands = async {
                match entrypoints {
                    Some(e) if !images.is_empty() => crate::registry::lookup_all(e, images).await,
                    _ => crate::registry::Entrypoints::new(),
                }
            };
            let (values, names, commands) = tokio::join!(values, names, commands);
            Ok::<_, crate::secrets::source::SourceError>((values?, names?, commands))
        };
        let fetched = tokio::time::timeout(self.deadline, both).await;
        audit.fetch_us = started.elapsed().as_micros() as u64;
        match fetched {
            Ok(Ok((values, names, commands))) => {
                let mut resolved = ResolvedSecrets::default();
                resolved.entrypoints = commands;
                for f in [values, names].into_iter().flatten() {
                    audit.cache_hits += f.cache_hits;
                    audit.backend_calls += f.backend_calls;
                    audit.throttles += f.throttles;
                    resolved.merge(f.values);
                }
                Ok(resolved)
            }
            Ok(Err(e)) => {
                audit.throttles = e.throttles();
                // The SDK's own text (the error's source) names the account, the role and the
                // secret's ARN: the log gets it; the reply gets the ids, the API and the code.
                tracing::error!(
                    error = %e,
                    detail = %error_chain(&e),
                    "fetching secrets from AWS Secrets Manager failed"
                );
                Err(Error::Internal(format!(
                    "{e} (details in the function's log)"
                )))
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
        }
    }
}

/// An error and its sources, one after another, for the log (never for a reply).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
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

enum Parsed {
    Pod(Box<AdmissionRequest<Pod>>, &'static str),
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

/// Typed parse first (the common case, one pass); a review whose object is not a Pod is parsed
/// again untyped to tell "someone else's object" (allowed untouched) from "broken pod" (invalid).
fn parse(body: &[u8], route: Route) -> Result<Parsed, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Invalid(
            "empty body: expected an AdmissionReview (admission.k8s.io/v1) as JSON".into(),
        ));
    }
    match serde_json::from_slice::<AdmissionReview<Pod>>(body) {
        Ok(review) => {
            utf8(body)?;
            let api_version = api_version_of(&review.types.api_version, &review.types.kind)?;
            let req = review
                .request
                .ok_or_else(|| Error::Invalid("review has no request: nothing to admit".into()))?;
            Ok(Parsed::Pod(Box::new(req), api_version))
        }
        Err(typed_err) => match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
            Ok(review) => {
                utf8(body)?;
                let api_version = api_version_of(&review.types.api_version, &review.types.kind)?;
                let req = review.request.ok_or_else(|| {
                    Error::Invalid("review has no request: nothing to admit".into())
                })?;
                let is_pod = req.kind.group.is_empty() && req.kind.kind == "Pod";
                if is_pod && admits(route, &req.operation, req.sub_resource.as_deref()) {
                    return Err(Error::Invalid(format!(
                        "request.object is not a valid Pod: {}",
                        located::<AdmissionReview<Pod>>(body, typed_err)
                    )));
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
                located::<AdmissionReview<DynamicObject>>(body, untyped_err)
            ))),
        },
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

/// The serde error with the JSON path where it happened (computed only on the error path).
fn located<T: serde::de::DeserializeOwned>(body: &[u8], fallback: serde_json::Error) -> String {
    let mut de = serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(e) if e.path().to_string() != "." => format!("{} (at {})", e.inner(), e.path()),
        _ => fallback.to_string(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
    /// Base64 of the JSON Patch, as the API documents it (kube-core would write a number array).
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: BTreeMap<&'static str, &'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

fn to_reply(status: u16, review: &ReviewOut<'_>) -> Reply {
    match serde_json::to_vec(review) {
        Ok(body) => Reply { status, body },
        // Serialising these plain structs cannot fail; answer 500 rather than panic if it did.
        Err(_) => Reply {
            status: 500,
            body: br#"{"message":"failed to serialise the response"}"#.to_vec(),
        },
    }
}

/// An allowed response without a patch or warnings.
fn allowed_reply(uid: &str, api_version: &str) -> Reply {
    match write_allowed(uid, api_version, None, &[]) {
        Ok((reply, _)) => reply,
        // Writing two strings into a `Vec` cannot fail; answer 500 rather than panic if it did.
        Err(_) => to_reply(
            500,
            &ReviewOut {
                api_version,
                kind: "AdmissionReview",
                response: ResponseOut {
                    uid,
                    allowed: true,
                    status: None,
                    patch: None,
                    patch_type: None,
                    audit_annotations: BTreeMap::new(),
                    warnings: &[],
                },
            },
        ),
    }
}

/// An allowed response, written by hand in the field order of [`ReviewOut`]: the patch's JSON,
/// written once by the diff, is base64-encoded straight into the body, which is sized for it up
/// front. No base64 string, no escape scan of base64 (it has nothing to escape), and no copy of
/// the body as it grows: on a 10,000-container pod each of those was 10 MB. Returns the reply
/// and the size of the patch JSON (for the audit line and the `PatchBytes` metric).
fn write_allowed(
    uid: &str,
    api_version: &str,
    patch: Option<&crate::patch::Patch>,
    warnings: &[String],
) -> std::io::Result<(Reply, usize)> {
    use base64::Engine;
    let engine = &base64::engine::general_purpose::STANDARD;
    let json = patch.map_or(&[][..], crate::patch::Patch::as_json);
    let encoded = base64::encoded_len(json.len(), true).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::OutOfMemory, "patch too large to encode")
    })?;
    let mut body = Vec::with_capacity(256 + uid.len() + encoded);
    body.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut body, api_version)?;
    body.extend_from_slice(b",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":");
    serde_json::to_writer(&mut body, uid)?;
    body.extend_from_slice(b",\"allowed\":true");
    if patch.is_some() {
        body.extend_from_slice(b",\"patch\":\"");
        let at = body.len();
        body.resize(at + encoded, 0);
        let written = engine
            .encode_slice(json, &mut body[at..])
            .map_err(std::io::Error::other)?;
        body.truncate(at + written);
        body.extend_from_slice(b"\",\"patchType\":\"JSONPatch\"");
    }
    if !warnings.is_empty() {
        body.extend_from_slice(b",\"warnings\":");
        serde_json::to_writer(&mut body, warnings)?;
    }
    body.extend_from_slice(b"}}");
    Ok((Reply { status: 200, body }, json.len()))
}

/// The reply for any error: a well-formed review with `allowed:false`, the HTTP status from the
/// error table in [`crate::error`].
pub fn error_reply(err: &Error, uid: &str, api_version: &str) -> Reply {
    let message = err.to_string();
    let code = err.review_code();
    let mut audit_annotations = BTreeMap::new();
    if let Error::Denied(Denial { reason, .. }) = err {
        audit_annotations.insert("denial-reason", *reason);
    }
    to_reply(
        err.http_status(),
        &ReviewOut {
            api_version,
            kind: "AdmissionReview",
            response: ResponseOut {
                uid,
                allowed: false,
                status: Some(StatusOut {
                    status: "Failure",
                    code,
                    reason: standard_reason(code),
                    message: &message,
                }),
                patch: None,
                patch_type: None,
                audit_annotations,
                warnings: &[],
            },
        },
    )
}

/// `status.reason` must be one of Kubernetes' `StatusReason`s; ours goes to the audit annotation.
fn standard_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        _ => "InternalError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    /// What `serde_json` writes for the same reply through [`ReviewOut`]: the hand-written
    /// envelope must be byte for byte the same.
    fn derived(uid: &str, patch: Option<&crate::patch::Patch>, warnings: &[String]) -> Vec<u8> {
        let patch = patch.map(|p| {
            base64::engine::general_purpose::STANDARD
                .encode(serde_json::to_vec(&p.to_ops().unwrap()).unwrap())
        });
        to_reply(
            200,
            &ReviewOut {
                api_version: API_VERSION_V1BETA1,
                kind: "AdmissionReview",
                response: ResponseOut {
                    uid,
                    allowed: true,
                    status: None,
                    patch_type: patch.as_ref().map(|_| "JSONPatch"),
                    patch,
                    audit_annotations: BTreeMap::new(),
                    warnings,
                },
            },
        )
        .body
    }

    #[test]
    fn the_written_reply_is_the_derived_one() {
        // Long, with escapes and non-ASCII in the values and paths, and a uid that needs
        // escaping.
        let env: Vec<serde_json::Value> = (0..500)
            .map(|i| serde_json::json!({"name": "K\"ey\\é", "value": format!("v\n{i}")}))
            .collect();
        let patch = crate::patch::diff(
            &serde_json::json!({"env": [], "a/b~c": 1}),
            &serde_json::json!({"env": env}),
        )
        .unwrap();
        assert_eq!(patch.len(), 501);
        let json_len = patch.as_json().len();
        assert!(json_len > 3 * 8 * 1024);
        let warnings = ["a \"quoted\" warning".to_owned()];
        let uid = "uid-\"1\"\u{7}";
        for (patch, warnings) in [
            (None, &[][..]),
            (None, &warnings[..]),
            (Some(&patch), &[][..]),
            (Some(&patch), &warnings[..]),
        ] {
            let (reply, bytes) = write_allowed(uid, API_VERSION_V1BETA1, patch, warnings).unwrap();
            assert_eq!(reply.status, 200);
            let want = derived(uid, patch, warnings);
            // Where they part, not the 20 kB of base64 around it.
            let at = reply.body.iter().zip(&want).position(|(a, b)| a != b);
            assert!(
                reply.body == want,
                "written and derived replies differ at byte {at:?} (lengths {} and {})",
                reply.body.len(),
                want.len()
            );
            assert_eq!(bytes, patch.map_or(0, |_| json_len));
        }
        // Every length modulo 3 ends the base64 correctly (padding written by `finish`).
        for n in 1..=4 {
            let small = crate::patch::diff(
                &serde_json::json!({"x".repeat(n): 1}),
                &serde_json::json!({}),
            )
            .unwrap();
            let (reply, _) = write_allowed("u", API_VERSION_V1, Some(&small), &[]).unwrap();
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
