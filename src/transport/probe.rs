//! The probe port of `podmutator serve` (`webhook.metricsPort`): plain HTTP/1.1 with two
//! routes, `GET /metrics` (Prometheus) and `GET /healthz` (readiness), and nothing else. It
//! needs no path token because it never admits: no admission path is routed here, so a probe
//! or a scraper reaches it without the token, and the token never has to appear in a pod spec.
//! It holds no secret: counts, route and reason names, and the version.
//!
//! The readiness probe is on this port, and the NetworkPolicy may admit other clients to it
//! (Prometheus, wherever it runs), so clients that only hold sockets must not starve it: a
//! full port closes a connection to make room for a new one (one that sent nothing first, then
//! the idlest; [`super::conns`]), and one source holds a few connections at most, so a probe's
//! new connection is always admitted and answered at once.

use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::conns::{Admit, Answering, Registry};
use super::http::{health, message};
use podmutator_core::prometheus::Counters;

/// Connections open at once: a kubelet and a scraper or two need a handful.
pub const MAX_CONNECTIONS: usize = 32;
/// Connections open at once from one source address (a kubelet, a scraper).
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 4;
/// Time to send a request head.
const HEADER_READ: Duration = Duration::from_secs(5);
/// A connection's whole life: probes and scrapes are one short request each.
const MAX_AGE: Duration = Duration::from_secs(30);

/// `(status, content type, body)` for a request line; `/healthz` is 503 once `draining`.
fn answer(
    counters: &Counters,
    draining: bool,
    method: &str,
    path: &str,
) -> (u16, &'static str, Vec<u8>) {
    const JSON: &str = "application/json";
    let body_for = |m: &str, body: Vec<u8>| if m == "HEAD" { Vec::new() } else { body };
    let json = |r: podmutator_core::admission::Reply| (r.status, JSON, r.body);
    match (path, method) {
        ("/metrics", "GET" | "HEAD") => (
            200,
            podmutator_core::prometheus::CONTENT_TYPE,
            body_for(method, counters.render().into_bytes()),
        ),
        ("/healthz", "GET" | "HEAD") => {
            let (status, text) = if draining {
                (503, "draining: this replica is stopping")
            } else {
                (200, "ok")
            };
            (status, JSON, body_for(method, health(text)))
        }
        ("/metrics" | "/healthz", _) => json(message(405, "method not allowed: use GET")),
        _ => json(message(
            404,
            "not found: this port serves /metrics and /healthz only; admissions are on webhook.listenPort",
        )),
    }
}

/// [`serve`] on a thread and a runtime of its own, which it ends with: the kubelet's probes
/// are answered however busy the webhook's runtime is. An admission is CPU work from its
/// parse to its reply, and a few large ones at once hold every worker thread of that runtime;
/// the readiness and liveness probes (1 s) would then fail, and the kubelet would take a busy
/// replica for a dead one. `listener` must be in non-blocking mode, as tokio's `into_std`
/// leaves it.
pub fn serve_on_own_thread(
    counters: Arc<Counters>,
    draining: Arc<std::sync::atomic::AtomicBool>,
    listener: std::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("probe-port".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve(counters, draining, listener, shutdown).await,
                    Err(e) => {
                        tracing::error!(error = %e, "metrics port: cannot serve the listener")
                    }
                }
            });
        })
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown` resolves.
pub async fn serve(
    counters: Arc<Counters>,
    draining: Arc<std::sync::atomic::AtomicBool>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let registry = Arc::new(Registry::new(
        "probe port",
        MAX_CONNECTIONS,
        MAX_CONNECTIONS_PER_SOURCE,
    ));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics port: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        // Every connection here answers at once, so one is always there to close for a new
        // one; only a source at its cap with all of them answering is turned away.
        let Admit::Open(slot) = registry.admit(peer.ip()) else {
            tracing::debug!(%peer, "metrics port: connection refused, every connection answering");
            continue;
        };
        let release = registry.release_on_drop(&slot);
        let (counters, draining) = (counters.clone(), draining.clone());
        tokio::spawn(async move {
            let _release = release;
            let on_request = slot.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                // No body to wait for: answered now.
                let mut in_flight = on_request.begin();
                in_flight.answering();
                let draining = draining.load(std::sync::atomic::Ordering::SeqCst);
                let (status, content_type, body) =
                    answer(&counters, draining, req.method().as_str(), req.uri().path());
                let resp = Answering::response(status, content_type, body, in_flight, HEADER_READ);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ)
                .serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                ended = tokio::time::timeout(MAX_AGE, conn) => {
                    if ended.is_err() {
                        tracing::debug!(%peer, "metrics port: connection closed at its age limit");
                    }
                }
                () = slot.shed.notified() => {}
            }
        });
        // The new connection's task reads its request before the next accept: a burst waiting
        // in the backlog (a process that stalled, a flood) cannot make room by closing it
        // before its request, already sent, is read and answered.
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metrics_and_healthz_are_answered() {
        let c = Counters::default();
        assert_eq!(answer(&c, false, "GET", "/metrics").0, 200);
        assert_eq!(answer(&c, false, "GET", "/healthz").0, 200);
        assert!(answer(&c, false, "HEAD", "/healthz").2.is_empty());
        assert_eq!(answer(&c, false, "POST", "/metrics").0, 405);
        for path in ["/mutate--v1-pod", "/", "/metrics/", "/x/healthz"] {
            assert_eq!(answer(&c, false, "POST", path).0, 404, "{path}");
            assert_eq!(answer(&c, false, "GET", path).0, 404, "{path}");
        }
        // Draining: not ready, still scraped.
        assert_eq!(answer(&c, true, "GET", "/healthz").0, 503);
        assert_eq!(answer(&c, true, "GET", "/metrics").0, 200);
    }
}
