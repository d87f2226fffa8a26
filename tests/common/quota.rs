//! A Secrets Manager that enforces AWS's request quotas: an HTTP proxy on 127.0.0.1 in front of
//! moto with one token bucket per API at the published per-account, per-region rates. A request
//! over its API's rate is answered as AWS answers it (JSON 1.1: HTTP 400, `x-amzn-ErrorType:
//! ThrottlingException`, `{"__type":"ThrottlingException","message":"Rate exceeded"}`), so the
//! SDK's own retry and backoff decide what happens next.
//!
//! Written in Rust rather than as a Python proxy: on a 2-core machine the proxy must pass
//! ~10,000 GetSecretValue/s beside the simulated fleet, it runs inside `cargo test` for its own
//! test, and hyper is already a dependency.
//!
//! moto answers a few hundred requests per second, far below the quotas this models, so read
//! calls that moto has answered once are replayed from memory (secrets do not change during a
//! simulation; the key is the request body, which names the ids). Every answer, fresh or replayed,
//! leaves no sooner than `service` after its request arrived: the modelled service latency.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// AWS Secrets Manager's published request quotas (requests per second, per account and region).
/// From AWS's "AWS Secrets Manager quotas" page; docs/scale.md quotes them with their source.
pub const AWS_RATES: [(&str, f64); 4] = [
    ("GetSecretValue", 10_000.0),
    ("DescribeSecret", 40_000.0),
    ("BatchGetSecretValue", 100.0),
    ("ListSecrets", 100.0),
];

/// The body AWS sends with a throttled JSON 1.1 call.
pub const THROTTLE_BODY: &str = r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#;

/// A token bucket: `rate` tokens a second, holding at most `capacity`.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Full at `now`. AWS publishes rates, not burst sizes; one second's worth is the assumption.
    pub fn new(rate: f64, capacity: f64, now: Instant) -> Self {
        Self {
            rate,
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes one token if there is one at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Calls one API received in one second of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    pub allowed: u32,
    pub throttled: u32,
}

struct State {
    buckets: HashMap<String, Bucket>,
    rates: Vec<(String, f64)>,
    started: Instant,
    /// Per API (the `X-Amz-Target` operation), per second since `started`.
    seconds: BTreeMap<String, Vec<Second>>,
}

/// The quota-enforcing proxy. Dropping it stops it.
pub struct QuotaProxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for QuotaProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Replies = Arc<Mutex<HashMap<(String, Bytes), Upstream>>>;

#[derive(Clone)]
struct Upstream {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

impl QuotaProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards allowed calls to `upstream` (a moto port).
    /// Runs on the current tokio runtime.
    pub async fn start(upstream: u16, rates: &[(&str, f64)], service: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local addr").port();
        let now = Instant::now();
        let state = Arc::new(Mutex::new(State {
            buckets: HashMap::new(),
            rates: rates.iter().map(|(k, r)| ((*k).to_owned(), *r)).collect(),
            started: now,
            seconds: BTreeMap::new(),
        }));
        state.lock().unwrap().refill(now);
        let replies: Replies = Arc::default();
        // moto is a threaded Python server: bound what reaches it at once.
        let moto_slots = Arc::new(tokio::sync::Semaphore::new(8));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let (state, replies, slots) = (shared.clone(), replies.clone(), moto_slots.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (state, replies, slots) =
                            (state.clone(), replies.clone(), slots.clone());
                        async move {
                            Ok::<_, Infallible>(
                                handle(req, upstream, &state, &replies, &slots, service).await,
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        QuotaProxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts a new run: full buckets, no counts, second 0 is now.
    pub fn reset(&self) {
        let mut s = self.state.lock().unwrap();
        let now = Instant::now();
        s.refill(now);
        s.started = now;
        s.seconds.clear();
    }

    /// Calls per API per second since the last [`QuotaProxy::reset`].
    pub fn seconds(&self) -> BTreeMap<String, Vec<Second>> {
        self.state.lock().unwrap().seconds.clone()
    }
}

impl State {
    fn refill(&mut self, now: Instant) {
        self.buckets = self
            .rates
            .iter()
            .map(|(k, r)| (k.clone(), Bucket::new(*r, r.max(1.0), now)))
            .collect();
    }

    /// Whether `op` may go ahead now; counts it either way.
    fn admit(&mut self, op: &str) -> bool {
        let now = Instant::now();
        let allowed = self.buckets.get_mut(op).is_none_or(|b| b.take(now));
        let sec = now.saturating_duration_since(self.started).as_secs() as usize;
        let row = self.seconds.entry(op.to_owned()).or_default();
        if row.len() <= sec {
            row.resize(sec + 1, Second::default());
        }
        if allowed {
            row[sec].allowed += 1;
        } else {
            row[sec].throttled += 1;
        }
        allowed
    }
}

/// The throttling answer, as AWS's JSON 1.1 services send it.
pub fn throttled() -> Response<Full<Bytes>> {
    Response::builder()
        .status(400)
        .header("content-type", "application/x-amz-json-1.1")
        .header("x-amzn-errortype", "ThrottlingException")
        .header("x-amzn-requestid", "00000000-0000-0000-0000-000000000000")
        .body(Full::new(Bytes::from_static(THROTTLE_BODY.as_bytes())))
        .expect("static response")
}

fn plain(status: u16, text: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(text.to_owned())))
        .expect("static response")
}

async fn handle(
    req: Request<Incoming>,
    upstream: u16,
    state: &Mutex<State>,
    replies: &Replies,
    slots: &tokio::sync::Semaphore,
    service: Duration,
) -> Response<Full<Bytes>> {
    let arrived = tokio::time::Instant::now();
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let op = target.rsplit('.').next().unwrap_or_default().to_owned();
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return plain(400, "quota proxy: unreadable request body");
    };
    let allowed = state.lock().unwrap().admit(&op);
    let response = if !allowed {
        throttled()
    } else {
        let cacheable = AWS_RATES.iter().any(|(k, _)| *k == op);
        let key = (op.clone(), body.clone());
        let cached = cacheable
            .then(|| replies.lock().unwrap().get(&key).cloned())
            .flatten();
        let answer = match cached {
            Some(a) => Ok(a),
            None => {
                let _slot = slots.acquire().await;
                let a = forward(upstream, &parts, &body).await;
                if let (true, Ok(a)) = (cacheable, &a) {
                    replies.lock().unwrap().insert(key, a.clone());
                }
                a
            }
        };
        match answer {
            Ok(a) => {
                let mut b = Response::builder().status(a.status);
                for (k, v) in &a.headers {
                    b = b.header(k.as_str(), v.as_slice());
                }
                b.body(Full::new(a.body))
                    .unwrap_or_else(|_| plain(502, "quota proxy: bad upstream header"))
            }
            Err(e) => plain(502, &format!("quota proxy: upstream: {e}")),
        }
    };
    tokio::time::sleep_until(arrived + service).await;
    response
}

/// One request to moto over a fresh connection (its server closes after each answer anyway).
async fn forward(
    upstream: u16,
    parts: &hyper::http::request::Parts,
    body: &Bytes,
) -> std::io::Result<Upstream> {
    let mut head = format!(
        "{} {} HTTP/1.1\r\n",
        parts.method,
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    )
    .into_bytes();
    for (k, v) in &parts.headers {
        if matches!(
            k.as_str(),
            "connection" | "content-length" | "transfer-encoding"
        ) {
            continue;
        }
        head.extend_from_slice(k.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(v.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await?;
    s.write_all(&head).await?;
    s.write_all(body).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    parse_response(&raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad HTTP response"))
}

fn parse_response(raw: &[u8]) -> Option<Upstream> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    let mut chunked = false;
    for line in lines {
        let (k, v) = line.split_once(':')?;
        let k = k.trim().to_ascii_lowercase();
        let v = v.trim();
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
        if matches!(
            k.as_str(),
            "connection" | "content-length" | "transfer-encoding" | "date" | "server"
        ) {
            continue;
        }
        headers.push((k, v.as_bytes().to_vec()));
    }
    let rest = &raw[split + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(Upstream {
        status,
        headers,
        body: Bytes::from(body),
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}
