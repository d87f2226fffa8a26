//! The same webhook over HTTPS outside Lambda: local development, or in-cluster behind a
//! Service. TLS is rustls with the ring provider (one TLS stack for the whole binary); the
//! certificates come from [`super::tls`].
//!
//! Every resource a client can hold is bounded: connections (a global cap and a cap per source
//! address), one deadline from accept to the first request head (TLS handshake and HTTP version
//! detection included), the request head, the body's arrival and the admission (each with a
//! deadline of its own), idle time between requests, the connection's age, HTTP/2 streams per
//! connection, the body's size, and the time a client has to take its reply (the body's deadline:
//! past it the connection is closed). When the cap is reached a connection is closed to make
//! room ([`super::conns`]: of the source holding the most; silent, then idle, then the slow body
//! least read or the reply not taken; never one whose admission is running), so clients that
//! only hold sockets, send bodies slowly or leave their replies, cannot lock out the API server.
//! A caller without the path token is answered from the request head, before its body is read;
//! the body is then drained (bounded) so the answer is not lost to a reset.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming as HyperBody};
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use super::conns::{Admit, Answering, InFlight, Registry, Release, Slot};
use super::http::{Front, Routed, message};
use podmutator_core::admission::Reply;

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
    /// Time for a request's body to arrive once its head has, and for the client to take its
    /// reply once it is made: a body that makes no progress, or a reply left untaken, holds its
    /// connection no longer than this.
    pub body: Duration,
    /// Time for the admission once the body is read.
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
            max_connections_per_source: 32,
            first_request: Duration::from_secs(10),
            header_read: Duration::from_secs(5),
            // The API server sends a review's few kilobytes at once.
            body: Duration::from_secs(5),
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
    pub fn from_config(http: &podmutator_core::config::HttpConfig) -> Self {
        Self {
            max_connections: http.max_connections,
            max_connections_per_source: http.max_connections_per_source,
            first_request: Duration::from_secs(http.first_request_timeout_seconds),
            body: Duration::from_secs(http.body_timeout_seconds),
            idle: Duration::from_secs(http.idle_timeout_seconds),
            max_age: Duration::from_secs(http.max_connection_age_seconds),
            ..Self::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("failed to install the SIGTERM and SIGINT handlers: {0}")]
    Signals(std::io::Error),
    #[error("failed to listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A listener on `addr`, and the address it is bound to (`addr` with port 0 gets one).
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let failed = |source| ServerError::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let local = listener.local_addr().map_err(failed)?;
    Ok((listener, local))
}

/// How often a full server looks again for a connection that went idle.
const FULL_RETRY: Duration = Duration::from_millis(20);

/// The reply, and the request body left unread when the reply did not need it. The body must
/// arrive within `limits.body` (its progress is reported to `in_flight`, so a slow body is the
/// first connection closed when the server is full); the admission then has `limits.request`.
async fn answer(
    front: &Front,
    peer: &str,
    limits: &Limits,
    in_flight: &mut InFlight,
    req: Request<HyperBody>,
) -> (Reply, Option<HyperBody>) {
    let (parts, mut body) = req.into_parts();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
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
        return (front.body_too_large(peer, method).into(), Some(body));
    }
    // Not `http_body_util::Limited`: each frame is also counted to the connection's in-flight
    // bytes, which a full port reads to choose the connection it closes to make room.
    let read = async {
        let mut collected = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(BodyRead::Failed)?;
            if let Some(data) = frame.data_ref() {
                if collected.len() + data.len() > max_body {
                    return Err(BodyRead::OverLimit);
                }
                in_flight.read(data.len());
                collected.extend_from_slice(data);
            }
        }
        Ok(collected)
    };
    let collected = match tokio::time::timeout(limits.body, read).await {
        Ok(Ok(collected)) => collected,
        Ok(Err(BodyRead::OverLimit)) => {
            return (front.body_too_large(peer, method).into(), Some(body));
        }
        // The client's connection ended or failed mid-body, or a chunk was malformed: nothing
        // more can be read, and the body is not over the limit.
        Ok(Err(BodyRead::Failed(e))) => {
            // hyper's own text is only "error reading a body from connection": its sources say
            // why (the connection closed before the body's length, an invalid chunk size).
            let why = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            return (front.body_read_failed(peer, method, &why).into(), None);
        }
        Err(_) => {
            let text = format!(
                "request timed out: the body was not sent within {} s (http.bodyTimeoutSeconds)",
                limits.body.as_secs()
            );
            return (message(408, &text), None);
        }
    };
    if !in_flight.answering() {
        // Chosen to make room before it was wholly read: the connection is closing.
        return (
            message(503, "the server was full and closed this connection"),
            None,
        );
    }
    match tokio::time::timeout(limits.request, front.review_in_budget(route, &collected)).await {
        Ok(answer) => (answer.into(), None),
        Err(_) => (message(500, "the admission did not finish in time"), None),
    }
}

/// Why a request body was not read whole.
enum BodyRead {
    /// More than `http.maxBodyBytes` arrived; the rest is left unread.
    OverLimit,
    /// Reading failed partway: the connection ended or failed, or the framing was malformed.
    Failed(hyper::Error),
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
    mut in_flight: InFlight,
    req: Request<HyperBody>,
) -> Result<Response<Answering>, std::convert::Infallible> {
    let http1 = req.version() <= hyper::Version::HTTP_11;
    let peer = peer.to_string();
    let (reply, unread) = answer(&front, &peer, &limits, &mut in_flight, req).await;
    // In flight until the connection has taken the answer, which it must within `body`.
    let mut resp = Answering::response(
        reply.status,
        "application/json",
        reply.body,
        in_flight,
        limits.body,
    );
    if let Some(body) = unread.filter(|b| !b.is_end_stream()) {
        if http1 {
            // The connection ends once the body is drained: a caller answered early gets no
            // second request on it.
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        let max_bytes = (front.max_body_bytes() as u64).saturating_mul(2);
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
    let registry = Arc::new(Registry::new(
        "webhook port",
        limits.max_connections,
        limits.max_connections_per_source,
    ));
    // A burst of refusals is reported when its window ends, not at the next refusal of its kind.
    let refusals = front.clone();
    let flusher = tokio::spawn(async move {
        let period = Duration::from_millis(super::http::REFUSAL_SAMPLE_MS);
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        loop {
            tick.tick().await;
            refusals.flush_refusals(false);
        }
    });
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
        let release = registry.release_on_drop(&slot);
        tokio::spawn(connection(
            tcp,
            peer,
            slot,
            release,
            acceptor.clone(),
            builder.clone(),
            front.clone(),
            limits,
            stopping.clone(),
        ));
        // The new connection's task starts its handshake before the next accept, so a burst
        // waiting in the backlog cannot make room by closing it before it is read.
        tokio::task::yield_now().await;
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

/// Serves one accepted TCP connection; `_release` frees its slot when this ends.
#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
    _release: Release,
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    front: Arc<Front>,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
) {
    let first_request_by = slot.accepted + limits.first_request;
    // A connection closed (or reset) before its first byte is a TCP probe (the kubelet's
    // tcpSocket liveness check, a load balancer's), not a handshake that failed.
    let handshake = async {
        match tcp.peek(&mut [0u8; 1]).await {
            Ok(n) if n > 0 => Some(acceptor.accept(tcp).await),
            _ => None,
        }
    };
    let tls = tokio::select! {
        tls = tokio::time::timeout_at(first_request_by, handshake) => match tls {
            Ok(Some(Ok(tls))) => tls,
            Ok(Some(Err(e))) => {
                front.tls_failed(peer, &e, super::tls::handshake_hint(&e));
                return;
            }
            Ok(None) => return,
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
        respond(front.clone(), limits, peer, in_flight, req)
    });
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let age_limit = slot.accepted + limits.max_age;
    // Set once the connection was asked to close: in-flight requests get `request` more.
    let mut closing: Option<Instant> = None;
    loop {
        let wake = match closing {
            Some(hard_stop) => hard_stop,
            None if !slot.served() => first_request_by.min(age_limit),
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
                let served = slot.served();
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

/// SIGTERM and Ctrl-C, caught from the moment [`Shutdown::install`] returns: a signal that
/// arrives before [`Shutdown::recv`] is first awaited is kept, where a handler installed on
/// first poll would leave a SIGTERM sent just after start-up to the default action (death, no
/// drain). `serve` installs it before its start line.
pub struct Shutdown {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Shutdown {
    /// Installs the handlers; must be called inside the runtime.
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on the next SIGTERM or Ctrl-C since [`Shutdown::install`] or the last call.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.interrupt.recv() => {},
        }
    }
}
