//! The same webhook over HTTPS outside Lambda: local development, or in-cluster behind a
//! Service. TLS is rustls with the ring provider (one TLS stack for the whole binary); the
//! certificates come from [`super::tls`].
//!
//! Every resource a client can hold is bounded: connections (a cap, waited on before the next
//! accept), the TLS handshake, the request head, the whole request, HTTP/2 streams per
//! connection, and the body. A caller without the path token is answered from the request
//! head, before its body is read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming as HyperBody};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use super::http::{Front, Routed, body_too_large};
use super::tls::TlsError;
use crate::admission::Reply;

/// How the server bounds what one client can hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once; the next accept waits for one to close.
    pub max_connections: usize,
    /// Time to finish the TLS handshake.
    pub handshake: Duration,
    /// Time to send the request line and headers (HTTP/1).
    pub header_read: Duration,
    /// Time for a whole request: body read and admission.
    pub request: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams: u32,
    /// How long to pause accepting after an error such as EMFILE, so it cannot spin a core.
    pub accept_backoff: Duration,
    /// How long shutdown waits for in-flight admissions.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(5),
            // The API server gives up after timeoutSeconds (at most 30 s).
            request: Duration::from_secs(30),
            max_streams: 64,
            accept_backoff: Duration::from_millis(100),
            drain: Duration::from_secs(20),
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

async fn answer(front: &Front, req: Request<HyperBody>) -> Reply {
    let (parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let route = match front.route(parts.method.as_str(), parts.uri.path(), content_type) {
        Routed::Answer(reply) => return reply,
        Routed::Review(route) => route,
    };
    let max_body = front.max_body_bytes();
    match Limited::new(body, max_body).collect().await {
        Ok(collected) => front.app().review(route, &collected.to_bytes()).await,
        Err(_) => body_too_large(max_body),
    }
}

async fn respond(
    front: Arc<Front>,
    limit: Duration,
    req: Request<HyperBody>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = match tokio::time::timeout(limit, answer(&front, req)).await {
        Ok(reply) => reply,
        Err(_) => Reply {
            status: 408,
            body: br#"{"message":"request timed out: the body was not sent in time"}"#.to_vec(),
        },
    };
    let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(reply.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
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
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
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
        let (acceptor, front, watcher, builder) = (
            acceptor.clone(),
            front.clone(),
            graceful.watcher(),
            builder.clone(),
        );
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "tls handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "tls handshake timed out");
                    return;
                }
            };
            let service =
                hyper::service::service_fn(move |req| respond(front.clone(), limits.request, req));
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: connections still open after the drain timeout");
    }
    Ok(())
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
