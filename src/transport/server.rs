//! The same webhook over HTTPS outside Lambda: local development, or in-cluster behind a
//! Service. TLS is rustls with the ring provider (one TLS stack for the whole binary); the
//! certificates come from [`super::tls`].
//!
//! Every resource a client can hold is bounded: connections (a global cap and a cap per source
//! address), one deadline from accept to the first request head (TLS handshake and HTTP version
//! detection included), the request head, the whole request, idle time between requests, the
//! connection's age, HTTP/2 streams per connection, and the body. When the cap is reached the
//! connection that has been idle longest is closed to make room (one that never sent a request
//! head first), so clients that only hold sockets cannot lock out the API server. A caller
//! without the path token is answered from the request head, before its body is read; the body
//! is then drained (bounded) so the answer is not lost to a reset.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming as HyperBody};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use super::http::{Front, Routed};
use super::tls::TlsError;
use crate::admission::Reply;

/// How the server bounds what one client can hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once. When full, the idlest connection is closed to make room; only
    /// when every connection has a request in flight does the next accept wait.
    pub max_connections: usize,
    /// Connections open at once from one source address; past it that source's idlest
    /// connection is closed, or the new one refused when all of them are busy.
    pub max_connections_per_source: usize,
    /// Time from accept until the first request head is parsed: TLS handshake, HTTP version
    /// detection (HTTP/1 or the HTTP/2 preface) and the head itself.
    pub first_request: Duration,
    /// Time to send the request line and headers (HTTP/1), also between keep-alive requests.
    pub header_read: Duration,
    /// Time for a whole request: body read and admission.
    pub request: Duration,
    /// How long a connection may stay open with no request in flight after its first one
    /// (HTTP/2 has no other idle bound); it is then closed gracefully (GOAWAY).
    pub idle: Duration,
    /// Age at which a connection is asked to close gracefully (GOAWAY, or `Connection: close`
    /// after the request in flight); requests still in flight get `request` to finish.
    pub max_age: Duration,
    /// HTTP/2 PING interval, and how long an unanswered PING waits before the connection is
    /// closed: a peer that vanished does not hold its slot until `idle`.
    pub h2_keep_alive_interval: Duration,
    pub h2_keep_alive_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams: u32,
    /// After an answer given before the body was read (wrong token, body over the limit), how
    /// long the rest of the body is read and discarded, so that closing the connection does not
    /// reset it and lose the answer. At most twice `http.maxBodyBytes` is read in all.
    pub linger: Duration,
    /// How long to pause accepting after an error such as EMFILE, so it cannot spin a core.
    pub accept_backoff: Duration,
    /// How long shutdown waits for in-flight admissions.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_source: 256,
            first_request: Duration::from_secs(10),
            header_read: Duration::from_secs(5),
            // The API server gives up after timeoutSeconds (at most 30 s).
            request: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            max_age: Duration::from_secs(600),
            h2_keep_alive_interval: Duration::from_secs(20),
            h2_keep_alive_timeout: Duration::from_secs(10),
            max_streams: 64,
            linger: Duration::from_secs(5),
            accept_backoff: Duration::from_millis(100),
            drain: Duration::from_secs(20),
        }
    }
}

impl Limits {
    /// The defaults, with what `http` sets.
    pub fn from_config(http: &crate::config::HttpConfig) -> Self {
        Self {
            max_connections: http.max_connections,
            max_connections_per_source: http.max_connections_per_source,
            first_request: Duration::from_secs(http.first_request_timeout_seconds),
            idle: Duration::from_secs(http.idle_timeout_seconds),
            max_age: Duration::from_secs(http.max_connection_age_seconds),
            ..Self::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("failed to listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

/// One open connection as the registry sees it.
struct Slot {
    id: u64,
    source: IpAddr,
    accepted: Instant,
    /// Requests in flight in the low bits, [`SHED`] once the registry chose to close it: the
    /// two live in one word so a connection is never shed while a request is in flight.
    state: AtomicU64,
    /// A request head has been parsed on this connection.
    served: AtomicBool,
    /// When the last request finished, in milliseconds after `accepted`.
    idle_since_ms: AtomicU64,
    shed: Notify,
    /// A request ended: the connection's timers are looked at again.
    request_ended: Notify,
}

const SHED: u64 = 1 << 63;

/// How often a full server looks again for a connection that went idle.
const FULL_RETRY: Duration = Duration::from_millis(20);

impl Slot {
    fn idle_since(&self) -> Instant {
        self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed))
    }

    fn in_flight(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !SHED
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Relaxed);
        self.state.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Marks the connection for closing if nothing is in flight on it.
    fn try_shed(&self) -> bool {
        self.state
            .compare_exchange(0, SHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A request in flight on a slot; dropping it marks the connection idle from now.
struct InFlight(Arc<Slot>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let slot = &self.0;
        let ms = u64::try_from(slot.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        slot.idle_since_ms.store(ms, Ordering::Relaxed);
        slot.state.fetch_sub(1, Ordering::AcqRel);
        slot.request_ended.notify_one();
    }
}

#[derive(Default)]
struct Table {
    slots: HashMap<u64, Arc<Slot>>,
    per_source: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> bool {
        let Some(slot) = self.slots.remove(&id) else {
            return false;
        };
        if let Some(n) = self.per_source.get_mut(&slot.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&slot.source);
            }
        }
        true
    }

    /// Closes the idlest connection (from `source` only, if given) to make room: one that never
    /// sent a request head before one that did, then the one idle longest. Connections with a
    /// request in flight are never chosen.
    fn shed_one(&mut self, source: Option<IpAddr>) -> bool {
        let mut skip = Vec::new();
        loop {
            let victim = self
                .slots
                .values()
                .filter(|s| source.is_none_or(|src| s.source == src))
                .filter(|s| s.in_flight() == 0 && !skip.contains(&s.id))
                .min_by_key(|s| (s.served.load(Ordering::Relaxed), s.idle_since()))
                .cloned();
            let Some(victim) = victim else {
                return false;
            };
            if victim.try_shed() {
                self.remove(victim.id);
                victim.shed.notify_one();
                tracing::debug!(peer = %victim.source, served = victim.served.load(Ordering::Relaxed), "connection shed to make room");
                return true;
            }
            // A request arrived on it meanwhile: look again without it.
            skip.push(victim.id);
        }
    }
}

/// Every open connection, for the caps and for choosing which one to close when full.
struct Registry {
    table: Mutex<Table>,
    freed: Notify,
    max: usize,
    max_per_source: usize,
}

enum Admit {
    Open(Arc<Slot>),
    /// The source is at its cap and every connection it holds is busy.
    Refused,
    /// The server is at its cap and every connection is busy.
    Full,
}

impl Registry {
    fn new(limits: &Limits) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            freed: Notify::new(),
            max: limits.max_connections.max(1),
            max_per_source: limits.max_connections_per_source.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table holds counts only; a panic elsewhere cannot leave it half-updated.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn admit(&self, source: IpAddr) -> Admit {
        let mut t = self.lock();
        let from_source = t.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.max_per_source && !t.shed_one(Some(source)) {
            return Admit::Refused;
        }
        if t.slots.len() >= self.max && !t.shed_one(None) {
            return Admit::Full;
        }
        t.next_id += 1;
        let slot = Arc::new(Slot {
            id: t.next_id,
            source,
            accepted: Instant::now(),
            state: AtomicU64::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            shed: Notify::new(),
            request_ended: Notify::new(),
        });
        t.slots.insert(slot.id, slot.clone());
        *t.per_source.entry(source).or_insert(0) += 1;
        Admit::Open(slot)
    }

    fn release(&self, id: u64) {
        if self.lock().remove(id) {
            self.freed.notify_one();
        }
    }
}

/// Removes the slot from the registry when its connection task ends, however it ends.
struct Release(Arc<Registry>, u64);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// The reply, and the request body left unread when the reply did not need it.
async fn answer(front: &Front, peer: &str, req: Request<HyperBody>) -> (Reply, Option<HyperBody>) {
    let (parts, mut body) = req.into_parts();
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let peer = Some(peer);
    let route = match front.route(peer, parts.method.as_str(), parts.uri.path(), content_type) {
        Routed::Answer(reply) => return (reply, Some(body)),
        Routed::Review(route) => route,
    };
    let max_body = front.max_body_bytes();
    // A Content-Length over the limit is refused from the head.
    let method = parts.method.as_str();
    if usize::try_from(body.size_hint().lower()).map_or(true, |n| n > max_body) {
        return (front.body_too_large(peer, method), Some(body));
    }
    let mut collected = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return (front.body_too_large(peer, method), None);
        };
        if let Some(data) = frame.data_ref() {
            if collected.len() + data.len() > max_body {
                return (front.body_too_large(peer, method), Some(body));
            }
            collected.extend_from_slice(data);
        }
    }
    (front.review(route, &collected).await, None)
}

/// Reads and discards what is left of a body answered early, within `max_bytes` and `limit`:
/// closing a connection with unread data in its receive buffer sends a reset, which destroys
/// the answer still on its way to the client.
async fn linger(mut body: HyperBody, max_bytes: u64, limit: Duration) {
    if body.is_end_stream() || body.size_hint().lower() > max_bytes {
        return;
    }
    let drained = tokio::time::timeout(limit, async {
        let mut read = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > max_bytes {
                    return;
                }
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!("body of an early answer not finished within the linger time");
    }
}

async fn respond(
    front: Arc<Front>,
    limits: Limits,
    peer: SocketAddr,
    req: Request<HyperBody>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let http1 = req.version() <= hyper::Version::HTTP_11;
    let peer = peer.to_string();
    let (reply, unread) = match tokio::time::timeout(limits.request, answer(&front, &peer, req))
        .await
    {
        Ok(answered) => answered,
        Err(_) => (
            Reply {
                status: 408,
                body: br#"{"message":"request timed out: the body was not sent in time"}"#.to_vec(),
            },
            None,
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(reply.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Some(body) = unread.filter(|b| !b.is_end_stream()) {
        if http1 {
            // The connection ends once the body is drained: a caller answered early gets no
            // second request on it.
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        let max_bytes = u64::try_from(front.max_body_bytes())
            .unwrap_or(u64::MAX)
            .saturating_mul(2);
        tokio::spawn(linger(body, max_bytes, limits.linger));
    }
    Ok(resp)
}

/// Serves until `shutdown` resolves, then stops accepting and lets in-flight admissions finish.
pub async fn serve(
    front: Arc<Front>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .keep_alive_interval(limits.h2_keep_alive_interval)
        .keep_alive_timeout(limits.h2_keep_alive_timeout);
    let builder = Arc::new(builder);
    let registry = Arc::new(Registry::new(&limits));
    // A burst of refusals is reported when its window ends, not at the next refusal of its kind.
    let flusher = {
        let front = front.clone();
        tokio::spawn(async move {
            let period = Duration::from_millis(super::http::REFUSAL_SAMPLE_MS);
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                tick.tick().await;
                front.flush_refusals(false);
            }
        })
    };
    // Every connection task holds a receiver: `closed()` resolves once the last one ends.
    let (stopping_tx, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    'accept: loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors, or a peer gone before accept: pause, so the
                    // loop cannot spin a core on an error that repeats at once.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(limits.accept_backoff).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = loop {
            let freed = registry.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match registry.admit(peer.ip()) {
                Admit::Open(slot) => break slot,
                Admit::Refused => {
                    tracing::debug!(%peer, "connection refused: its source is at its connection cap");
                    continue 'accept;
                }
                // Every connection has a request in flight, each bounded by `request`: wait
                // for one to close, or look again soon for one that went idle.
                Admit::Full => tokio::select! {
                    () = freed => {},
                    () = tokio::time::sleep(FULL_RETRY) => {},
                    () = &mut shutdown => break 'accept,
                },
            }
        };
        let conn = Connection {
            tcp,
            peer,
            release: Release(registry.clone(), slot.id),
            slot,
            acceptor: acceptor.clone(),
            builder: builder.clone(),
            front: front.clone(),
            limits,
            stopping: stopping.clone(),
        };
        tokio::spawn(conn.run());
    }
    drop(listener);
    flusher.abort();
    front.flush_refusals(true);
    drop(stopping);
    let _ = stopping_tx.send(true);
    if tokio::time::timeout(limits.drain, stopping_tx.closed())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: connections still open after the drain timeout");
    }
    Ok(())
}

/// One accepted TCP connection and what it needs to be served.
struct Connection {
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
    release: Release,
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    front: Arc<Front>,
    limits: Limits,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    async fn run(self) {
        let Self {
            tcp,
            peer,
            slot,
            release: _release,
            acceptor,
            builder,
            front,
            limits,
            mut stopping,
        } = self;
        let first_request_by = slot.accepted + limits.first_request;
        let tls = tokio::select! {
            tls = tokio::time::timeout_at(first_request_by, acceptor.accept(tcp)) => match tls {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    front.tls_failed(peer, &e);
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "tls handshake timed out");
                    return;
                }
            },
            () = slot.shed.notified() => return,
            _ = stopping.changed() => return,
        };
        let on_request = slot.clone();
        let service = hyper::service::service_fn(move |req| {
            let in_flight = on_request.begin();
            let front = front.clone();
            async move {
                let resp = respond(front, limits, peer, req).await;
                drop(in_flight);
                resp
            }
        });
        let conn = builder.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(conn);
        let age_limit = slot.accepted + limits.max_age;
        // Set once the connection was asked to close: in-flight requests get `request` more.
        let mut closing: Option<Instant> = None;
        loop {
            let wake = match closing {
                Some(hard_stop) => hard_stop,
                None if !slot.served.load(Ordering::Relaxed) => first_request_by.min(age_limit),
                None if slot.in_flight() == 0 => (slot.idle_since() + limits.idle).min(age_limit),
                None => (Instant::now() + limits.idle).min(age_limit),
            };
            tokio::select! {
                ended = conn.as_mut() => {

                    if let Err(e) = ended {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = slot.shed.notified() => return,
                () = slot.request_ended.notified() => {}
                _ = stopping.changed(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(Instant::now() + limits.request);
                }
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if closing.is_some() {
                        tracing::debug!(%peer, "connection still open after its close was asked for");
                        return;
                    }
                    let served = slot.served.load(Ordering::Relaxed);
                    let idle = slot.in_flight() == 0;
                    if !served && idle && now >= first_request_by {
                        tracing::debug!(%peer, "no request head before the first-request deadline");
                        return;
                    }
                    let idle_too_long = served && idle && now >= slot.idle_since() + limits.idle;
                    if idle_too_long || now >= age_limit {
                        tracing::debug!(%peer, idle_too_long, "closing the connection gracefully");
                        conn.as_mut().graceful_shutdown();
                        closing = Some(now + limits.request);
                    }
                }
            }
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
