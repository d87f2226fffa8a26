//! The Lambda adapter: API Gateway REST (payload v1), HTTP API and Function URLs (payload v2)
//! and ALB events, deserialised with `lambda_http`'s own event types.
//!
//! `lambda_http::run` would turn the event into an `http::Request` for us, but that conversion
//! panics on a body marked base64 that is not base64, and on a path or host it cannot parse
//! into a URL. A webhook must answer bad input with a clear 400, so the few fields we need are
//! read from the event directly, and the response is written in the shape the source expects.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use lambda_http::aws_lambda_events::alb::{AlbTargetGroupRequest, AlbTargetGroupResponse};
use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayProxyRequest, ApiGatewayProxyResponse, ApiGatewayV2httpRequest,
    ApiGatewayV2httpResponse,
};
use lambda_http::aws_lambda_events::encodings::Body;

use lambda_http::http::{HeaderMap, HeaderValue, header::CONTENT_TYPE};
use lambda_http::request::LambdaRequest;
use serde::Serialize;

use super::http::{Front, Routed, invalid};
use podmutator_core::admission::{Answer, Reply};
use podmutator_core::error::Error;
use podmutator_core::json;

/// The response, in the shape of the event's source.
#[derive(Debug)]
pub enum LambdaReply {
    ApiGatewayV1(Envelope<ApiGatewayProxyResponse>),
    ApiGatewayV2(Envelope<ApiGatewayV2httpResponse>),
    Alb(Envelope<AlbTargetGroupResponse>),
}

/// A response of the event's type, kept without its body (`head.body` is `None`), and the body
/// beside it: the head is written by its own derive, every field of it, and the body, nearly all
/// of a large reply, apart ([`LambdaReply`]'s `Serialize`).
#[derive(Debug)]
pub struct Envelope<R> {
    head: R,
    body: Body,
}

impl<R> Envelope<R> {
    fn new(head: R, body: Body) -> Self {
        Self { head, body }
    }
}

impl LambdaReply {
    pub fn status(&self) -> i64 {
        match self {
            Self::ApiGatewayV1(r) => r.head.status_code,
            Self::ApiGatewayV2(r) => r.head.status_code,
            Self::Alb(r) => r.head.status_code,
        }
    }

    pub fn body(&self) -> &[u8] {
        match self {
            Self::ApiGatewayV1(r) => r.body.as_ref(),
            Self::ApiGatewayV2(r) => r.body.as_ref(),
            Self::Alb(r) => r.body.as_ref(),
        }
    }
}

/// Written as the event types write themselves, but for a long body: nearly all of a large
/// reply, it is escaped here eight bytes at a time ([`json::push_str`]) instead of by serde_json a
/// byte at a time after a second UTF-8 check. The head comes from the event type's own
/// serialisation, the body goes in before its closing brace (last, where the derive writes it
/// before `isBase64Encoded`), and the whole is handed to the runtime as one raw JSON value. A
/// short body (most replies: an allow without a patch, a small one) costs less written by the
/// derive, the head copied with it.
impl Serialize for LambdaReply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        fn write<R: Clone + Serialize, S: serde::Serializer>(
            r: &Envelope<R>,
            slot: impl FnOnce(&mut R) -> &mut Option<Body>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            if r.body.as_ref().len() < RAW_FROM {
                let mut whole = r.head.clone();
                *slot(&mut whole) = Some(r.body.clone());
                return whole.serialize(serializer);
            }
            let head = serde_json::to_string(&r.head).map_err(S::Error::custom)?;
            let Some(head) = head.strip_suffix('}') else {
                return Err(S::Error::custom("the response's head is not a JSON object"));
            };
            // One allocation: the body, its quotes and room for an eighth more in escapes (a
            // reply is mostly base64, which has none). The raw value keeps it as it is, where
            // growing it would copy the body once more, and shrinking a doubled buffer again.
            let body_len = r.body.as_ref().len();
            let mut out = String::with_capacity(head.len() + body_len + body_len / 8 + 16);
            out.push_str(head);
            out.push_str(",\"body\":");
            match &r.body {
                Body::Text(text) => json::push_str(&mut out, text),
                other => out.push_str(&serde_json::to_string(other).map_err(S::Error::custom)?),
            }
            out.push('}');
            serde_json::value::RawValue::from_string(out)
                .map_err(S::Error::custom)?
                .serialize(serializer)
        }
        match self {
            Self::ApiGatewayV1(r) => write(r, |h| &mut h.body, serializer),
            Self::ApiGatewayV2(r) => write(r, |h| &mut h.body, serializer),
            Self::Alb(r) => write(r, |h| &mut h.body, serializer),
        }
    }
}

/// The body length from which [`LambdaReply`] writes its body itself.
const RAW_FROM: usize = 2048;

/// Where an event came from, as far as its shape tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// API Gateway (REST or HTTP API) or a Function URL: an endpoint on the internet, whose
    /// only gate is the path token (named for the log and the reply).
    Public(&'static str),
    /// An ALB target group: the internal load balancer Terraform and SAM put in the cluster's
    /// VPC, reached by the control plane's security group alone.
    Alb,
}

/// The 500 for a review that would carry Embedded values out through a public endpoint. The
/// API server quotes the webhook's URL, path token included, in the errors it returns to
/// whoever creates a pod, so the token is no secret from cluster users; on the internet it
/// would hand every organisation's values to anyone who read one such error. Not a denial
/// (the pod did nothing wrong): the deployment is wrong, and `failurePolicy` decides, as for
/// an unreachable webhook.
fn public_values_refused(source: &'static str) -> Reply {
    tracing::error!(
        event_source = source,
        refused = "embedded value delivery through a public endpoint",
        "lambda"
    );
    Answer::error(
        &Error::Internal(format!(
            "this webhook writes Embedded secret values into its replies (embedded.delivery: value, or envVarDelivery: value) and will not answer through {source}, which is reachable from the internet while its path token appears in the API server's error messages; serve it through the internal ALB (Terraform endpoint = \"alb\", SAM EndpointType=alb), or set embedded.delivery: reference with envVarDelivery: exec"
        )),
        "",
        podmutator_core::admission::API_VERSION_V1,
    ).into()
}

/// The largest response an ALB takes from a Lambda target: 1 MB, the whole JSON response
/// included. A larger one becomes a 502 at the ALB, which the API server reports as an opaque
/// failure.
pub const ALB_RESPONSE_LIMIT: usize = 1 << 20;

/// The largest response of a synchronous Lambda invocation (API Gateway, Function URLs): 6 MB.
pub const LAMBDA_RESPONSE_LIMIT: usize = 6 << 20;

/// Room kept for the response's envelope around the body (status, headers, description).
const ENVELOPE_BYTES: usize = 1024;

impl Source {
    /// The response limit of the path back to the API server.
    fn response_limit(self) -> podmutator_core::admission::ReplyLimit {
        match self {
            Source::Alb => podmutator_core::admission::ReplyLimit {
                bytes: ALB_RESPONSE_LIMIT,
                reserve: ENVELOPE_BYTES,
                by: "an ALB puts on a Lambda function's response",
                instead: "API Gateway or a Function URL (6 MB, reference delivery only) or `podmutator serve` in the cluster",
            },
            Source::Public(_) => podmutator_core::admission::ReplyLimit {
                bytes: LAMBDA_RESPONSE_LIMIT,
                reserve: ENVELOPE_BYTES,
                by: "Lambda puts on a function's response",
                instead: "",
            },
        }
    }
}

/// `reply`, or, when it would not fit through `source`'s response limit, a denial that fits
/// and says why: the alternative is the load balancer's 502, which the API server reports as
/// an opaque failure and `failurePolicy: Ignore` would turn into a pod created without what
/// it asked for.
fn fit(source: Source, answer: Answer) -> Reply {
    let limit = source.response_limit();
    let size = json::escaped_len(&answer.body) + ENVELOPE_BYTES;
    if size <= limit.bytes {
        return answer.into();
    }
    let (uid, api_version) = (answer.uid.as_str(), answer.api_version);
    // As the reply carries it: base64.
    let patch = answer.patch_bytes().div_ceil(3) * 4;
    tracing::error!(
        uid,
        response_bytes = size,
        patch_bytes = patch,
        limit = limit.bytes,
        "response over the limit of the path back"
    );
    let denial = podmutator_core::admission::reply_too_large(size as u64, Some(patch), limit);
    Answer::error(&Error::Denied(denial), uid, api_version).into()
}

/// One event in, one response out. The refusals counted and not yet reported are reported
/// before the invocation ends: the instance may be frozen or recycled after it.
pub async fn handle(front: &Front, event: LambdaRequest) -> LambdaReply {
    let reply = match event {
        LambdaRequest::ApiGatewayV1(req) => LambdaReply::ApiGatewayV1(rest(front, req).await),
        LambdaRequest::ApiGatewayV2(req) => LambdaReply::ApiGatewayV2(http_api(front, req).await),
        LambdaRequest::Alb(req) => LambdaReply::Alb(alb(front, req).await),
        // Only the features we compile in exist; this arm covers future variants of a
        // non-exhaustive enum.
        _ => {
            let reply = invalid("unsupported Lambda event source".into()).into();
            LambdaReply::ApiGatewayV2(v2_response(reply))
        }
    };
    front.flush_refusals(true);
    reply
}

/// The reply's body as the event's text body, without a copy: the admission writes UTF-8 JSON
/// (a body that were not would be replaced, not sent as is).
fn text(body: Vec<u8>) -> Body {
    Body::Text(
        String::from_utf8(body)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

/// The body as bytes (the event's own text, not a copy), or a 400 reply when it is marked
/// base64 and is not.
fn body_bytes(body: Option<&str>, base64: bool) -> Result<Cow<'_, [u8]>, Reply> {
    match body {
        None => Ok(Cow::Borrowed(&[])),
        Some(body) if !base64 => Ok(Cow::Borrowed(body.as_bytes())),
        Some(body) => STANDARD.decode(body).map(Cow::Owned).map_err(|e| {
            invalid(format!(
                "the event's body is marked isBase64Encoded but is not valid base64: {e}"
            ))
            .into()
        }),
    }
}

#[allow(clippy::too_many_arguments)]
async fn dispatch(
    front: &Front,
    source: Source,
    peer: Option<&str>,
    method: &str,
    path: &str,
    headers: &HeaderMap,
    body: Option<&str>,
    base64: bool,
) -> Reply {
    // Path token, route and method first: a caller without the token gets its 404 before
    // the body is even decoded.
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let route = match front.route(peer, method, path, content_type) {
        Routed::Answer(reply) => return reply,
        Routed::Review(route) => route,
    };
    // Every route: the secrets mutator runs on every entry for a pod it selects.
    if let Source::Public(name) = source
        && front.app().values_in_replies()
    {
        return public_values_refused(name);
    }
    // The estimate refuses what cannot fit before it is built; `fit` measures what was built.
    let limit = source.response_limit();
    match body_bytes(body, base64) {
        Ok(bytes) => fit(
            source,
            front.review_within(route, &bytes, Some(limit)).await,
        ),
        Err(reply) => reply,
    }
}

fn json_headers() -> HeaderMap {
    HeaderMap::from_iter([(CONTENT_TYPE, HeaderValue::from_static("application/json"))])
}

async fn rest(front: &Front, req: ApiGatewayProxyRequest) -> Envelope<ApiGatewayProxyResponse> {
    // REST APIs report the resource path without the stage.
    let path = req.path.as_deref().unwrap_or("/");
    let reply = dispatch(
        front,
        Source::Public("API Gateway (REST API)"),
        req.request_context.identity.source_ip.as_deref(),
        req.http_method.as_str(),
        path,
        &req.headers,
        req.body.as_deref(),
        req.is_base64_encoded,
    )
    .await;
    let mut out = ApiGatewayProxyResponse::default();
    out.status_code = i64::from(reply.status);
    out.headers = json_headers();
    Envelope::new(out, text(reply.body))
}

async fn http_api(
    front: &Front,
    req: ApiGatewayV2httpRequest,
) -> Envelope<ApiGatewayV2httpResponse> {
    // HTTP APIs put a named stage in front of the raw path; `$default` has none.
    let raw = req.raw_path.as_deref().unwrap_or("/");
    let path = match req.request_context.stage.as_deref() {
        Some(stage) if stage != "$default" => raw
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(stage))
            .filter(|p| p.starts_with('/'))
            .unwrap_or(raw),
        _ => raw,
    };
    // A Function URL's events have the HTTP API's shape; its domain tells them apart.
    let source = if req
        .request_context
        .domain_name
        .as_deref()
        .is_some_and(|d| d.contains(".lambda-url."))
    {
        "a Lambda Function URL"
    } else {
        "API Gateway (HTTP API)"
    };
    let reply = dispatch(
        front,
        Source::Public(source),
        req.request_context.http.source_ip.as_deref(),
        req.request_context.http.method.as_str(),
        path,
        &req.headers,
        req.body.as_deref(),
        req.is_base64_encoded,
    )
    .await;
    v2_response(reply)
}

fn v2_response(reply: Reply) -> Envelope<ApiGatewayV2httpResponse> {
    let mut out = ApiGatewayV2httpResponse::default();
    out.status_code = i64::from(reply.status);
    out.headers = json_headers();
    Envelope::new(out, text(reply.body))
}

async fn alb(front: &Front, req: AlbTargetGroupRequest) -> Envelope<AlbTargetGroupResponse> {
    // With multi-value headers enabled on the target group, ALB sends and expects
    // `multiValueHeaders` only.
    let multi = !req.multi_value_headers.is_empty();
    let headers = if multi {
        &req.multi_value_headers
    } else {
        &req.headers
    };
    // The ALB appends the address it accepted the connection from to X-Forwarded-For.
    let peer = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .next_back()
        .and_then(|v| v.rsplit(',').next())
        .map(str::trim);
    let reply = dispatch(
        front,
        Source::Alb,
        peer,
        req.http_method.as_str(),
        req.path.as_deref().unwrap_or("/"),
        headers,
        req.body.as_deref(),
        req.is_base64_encoded,
    )
    .await;
    let mut out = AlbTargetGroupResponse::default();
    out.status_code = i64::from(reply.status);
    out.status_description = Some(status_description(reply.status));
    if multi {
        out.multi_value_headers = json_headers();
    } else {
        out.headers = json_headers();
    }
    Envelope::new(out, text(reply.body))
}

/// ALB wants "200 OK"-style descriptions.
fn status_description(status: u16) -> String {
    let text = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Internal Server Error",
    };
    format!("{status} {text}")
}

/// The variables the Lambda runtime sets and `lambda_runtime` reads at start (it panics on a
/// missing one); checked first so that `podmutator lambda` outside Lambda says what is missing.
pub const RUNTIME_ENV: [&str; 4] = [
    "AWS_LAMBDA_RUNTIME_API",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_FUNCTION_VERSION",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
];

/// Tells Lambda why the function did not start (`POST /runtime/init/error`), so that an
/// invocation's error says it (`aws lambda invoke`, Terraform's pre-traffic check) rather than
/// `Runtime.ExitError` alone. The process exits after it, as before.
pub async fn report_init_error(message: &str) {
    use lambda_runtime_api_client::{PooledClient, build_request};
    const KIND: &str = "Runtime.ConfigurationError";
    let body = serde_json::json!({"errorType": KIND, "errorMessage": message}).to_string();
    let request = build_request()
        .method("POST")
        .uri("/2018-06-01/runtime/init/error")
        .header("lambda-runtime-function-error-type", KIND)
        .header("content-type", "application/json")
        .body(body.into());
    let sent = match request {
        Ok(request) => PooledClient::builder().build().call(request).await,
        Err(e) => Err(e.into()),
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "the start error could not be reported to the Runtime API");
    }
}

/// The runtime variables that are missing or unusable, `; `-joined, or `Ok` when all are set.
pub fn check_runtime_env(get: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let problems: Vec<String> = RUNTIME_ENV
        .into_iter()
        .filter_map(|name| match get(name) {
            None => Some(format!("{name} is not set")),
            Some(v) if name == "AWS_LAMBDA_FUNCTION_MEMORY_SIZE" && v.parse::<i32>().is_err() => {
                Some(format!("{name} is not a whole number of MB: {v:?}"))
            }
            Some(_) => None,
        })
        .collect();
    problems
        .is_empty()
        .then_some(())
        .ok_or_else(|| problems.join("; "))
}

/// Runs the Lambda runtime loop until the process is stopped.
pub async fn run(front: std::sync::Arc<Front>) -> Result<(), lambda_http::Error> {
    use lambda_http::lambda_runtime::{LambdaEvent, service_fn};
    lambda_http::lambda_runtime::run(service_fn(move |event: LambdaEvent<LambdaRequest>| {
        let front = front.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&front, event.payload).await) }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past [`RAW_FROM`], the long strings are written by [`LambdaReply`] itself.
    const _: () = assert!(RAW_FROM <= 2048);

    /// The written response is the event type's own serialisation, field for field, whatever
    /// the body, short or long: the event types' derive stays the reference.
    #[test]
    fn each_response_is_written_as_its_event_type_writes_it() {
        let mut bodies = vec![
            Body::Empty,
            Body::Binary(vec![0, 1, 2, 255]),
            Body::Binary(vec![0xfe; RAW_FROM * 2]),
        ];
        bodies.extend(json::testing::tricky_strings().into_iter().map(Body::Text));
        for body in bodies {
            let mut v1 = ApiGatewayProxyResponse::default();
            v1.status_code = 200;
            v1.headers = json_headers();
            let mut v2 = ApiGatewayV2httpResponse::default();
            v2.status_code = 400;
            v2.headers = json_headers();
            v2.cookies = vec!["a=b".into()];
            let mut alb = AlbTargetGroupResponse::default();
            alb.status_code = 404;
            alb.status_description = Some(status_description(404));
            alb.headers = json_headers();
            let mut multi = AlbTargetGroupResponse::default();
            multi.status_code = 500;
            multi.multi_value_headers = json_headers();
            multi.is_base64_encoded = true;
            let whole = |mut r: serde_json::Value| {
                r["body"] = serde_json::to_value(&body).unwrap();
                r
            };
            let want = [
                whole(serde_json::to_value(&v1).unwrap()),
                whole(serde_json::to_value(&v2).unwrap()),
                whole(serde_json::to_value(&alb).unwrap()),
                whole(serde_json::to_value(&multi).unwrap()),
            ];
            let got = [
                LambdaReply::ApiGatewayV1(Envelope::new(v1, body.clone())),
                LambdaReply::ApiGatewayV2(Envelope::new(v2, body.clone())),
                LambdaReply::Alb(Envelope::new(alb, body.clone())),
                LambdaReply::Alb(Envelope::new(multi, body.clone())),
            ]
            .map(|r| {
                let wire = String::from_utf8(serde_json::to_vec(&r).unwrap()).unwrap();
                assert_eq!(wire.matches("\"body\":").count(), 1, "{wire}");
                serde_json::from_str::<serde_json::Value>(&wire).unwrap()
            });
            assert_eq!(got, want);
        }
    }
}
