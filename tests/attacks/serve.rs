//! Attacks on `podmutator serve` by clients that hold connections without a token: idle TLS
//! sessions, a bare HTTP/2 preface, one source opening many connections, and large bodies sent
//! to a wrong token or over the body limit.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{TOKEN, config, read_until_closed, review_bytes};
use crate::common::*;
use podmutator::transport::server::Limits;

/// How long a real client waits before the test calls it a hang: far beyond the API server's
/// `timeoutSeconds` (10 s by default), so that only a server that does not answer at all fails
/// on time, not one stalled with the machine; the time it took is printed.
const HANG: Duration = Duration::from_secs(120);

const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

fn with_token() -> podmutator_core::config::Config {
    config(json!({"http": {"pathToken": TOKEN}}))
}

/// `n` connections that finish the TLS handshake, send `first` (if anything), and then nothing.
async fn idle_connections(s: &Running, n: usize, first: &[u8]) -> Vec<Tls> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let mut tls = tls_connect(s.port, &s.ca)
            .await
            .unwrap_or_else(|e| panic!("attacker connection {i}: {e}"));
        if !first.is_empty() {
            tls.write_all(first).await.unwrap();
            tls.flush().await.unwrap();
        }
        held.push(tls);
    }
    held
}

/// What the API server does: a whole AdmissionReview with the token, over a new connection.
async fn api_server_review(s: &Running) -> u16 {
    let started = Instant::now();
    let (status, reply) = tokio::time::timeout(
        HANG,
        https_request(
            s.port,
            &s.ca,
            "localhost",
            "POST",
            &format!("/{TOKEN}/mutate--v1-pod"),
            Some("application/json"),
            &review_bytes(),
        ),
    )
    .await
    .expect("the real client was answered (nothing in 120 s)")
    .unwrap();
    if status == 200 {
        assert!(response(&reply)["patch"].is_string());
    }
    eprintln!("real client answered in {:?}", started.elapsed());
    status
}

/// Which of `conns` the server has closed, once at least `want` of them are: waits on the
/// closes themselves (the guard, [`HANG`], ends only a hang).
async fn wait_closed(conns: &mut [Tls], want: usize) -> Vec<bool> {
    let started = Instant::now();
    let mut closed = vec![false; conns.len()];
    while closed.iter().filter(|c| **c).count() < want && started.elapsed() < HANG {
        for (c, done) in conns.iter_mut().zip(closed.iter_mut()) {
            if !*done
                && read_until_closed(c, Duration::from_millis(20))
                    .await
                    .is_some()
            {
                *done = true;
            }
        }
    }
    closed
}

/// Lets the in-process server (on this test's one-thread runtime) do everything it can before
/// the test goes on: each yield runs every task that is ready and polls the sockets, so what
/// was written to it is read, however slow the machine. No timer.
async fn settle() {
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
}

async fn stop(s: Running) {
    s.stop.send(()).unwrap();
    s.task.await.unwrap();
}

#[tokio::test]
async fn tls_connections_that_send_nothing_filling_the_cap_do_not_lock_out_the_api_server() {
    // No deadline closes a connection in the test's lifetime: only making room can.
    let limits = Limits {
        max_connections: 16,
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let mut held = idle_connections(&s, 16, b"").await;
    assert_eq!(api_server_review(&s).await, 200);
    // Room was made by closing an idle connection, not by waiting for a deadline.
    let closed = wait_closed(&mut held, 1).await;
    assert!(closed.contains(&true), "no idle connection was closed");
    stop(s).await;
}

#[tokio::test]
async fn http2_prefaces_that_send_nothing_more_filling_the_cap_do_not_lock_out_the_api_server() {
    let limits = Limits {
        max_connections: 16,
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let mut held = idle_connections(&s, 16, HTTP2_PREFACE).await;
    assert_eq!(api_server_review(&s).await, 200);
    let closed = wait_closed(&mut held, 1).await;
    assert!(closed.contains(&true), "no idle connection was closed");
    stop(s).await;
}

#[tokio::test]
async fn a_tls_connection_that_sends_no_request_is_closed_at_the_first_request_deadline() {
    // Only the first-request deadline can close it: every other limit is an hour.
    let limits = Limits {
        first_request: Duration::from_millis(800),
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    // Before the connection exists: the deadline cannot have started earlier.
    let started = Instant::now();
    let mut held = idle_connections(&s, 1, b"").await;
    assert!(
        read_until_closed(&mut held[0], HANG).await.is_some(),
        "still open 120 s after a first-request deadline of 0.8 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(800));
    stop(s).await;
}

#[tokio::test]
async fn an_http2_preface_with_no_request_is_closed_at_the_first_request_deadline() {
    let limits = Limits {
        first_request: Duration::from_millis(800),
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let started = Instant::now();
    let mut held = idle_connections(&s, 1, HTTP2_PREFACE).await;
    assert!(
        read_until_closed(&mut held[0], HANG).await.is_some(),
        "still open 120 s after a first-request deadline of 0.8 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(800));
    stop(s).await;
}

/// An HTTP/2 client connection; the task ends when the server closes it.
async fn h2_client(
    s: &Running,
) -> (
    hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tls = tls_connect(s.port, &s.ca).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

async fn h2_healthz(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
) -> hyper::Result<u16> {
    sender.ready().await?;
    let req = hyper::Request::get(format!("https://localhost/{TOKEN}/healthz"))
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(status)
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    // Only the idle timeout can close it: every other limit is an hour.
    let limits = Limits {
        idle: Duration::from_millis(800),
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    // Before the connection exists: the idle time cannot have started earlier.
    let started = Instant::now();
    let (mut sender, conn) = h2_client(&s).await;
    assert_eq!(h2_healthz(&mut sender).await.unwrap(), 200);
    tokio::time::timeout(HANG, conn)
        .await
        .expect("the server closed the idle HTTP/2 connection (still open after 120 s)")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(800));
    stop(s).await;
}

#[tokio::test]
async fn a_busy_http2_connection_is_closed_gracefully_at_its_maximum_age() {
    // Only the maximum age can close it: every other limit (idle included) is an hour.
    let limits = Limits {
        max_age: Duration::from_secs(1),
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    // A stall of the machine in the connection's first second can let the age pass before
    // three requests were made: that attempt proves nothing, and a new connection is tried. A
    // server that closes busy connections early fails every attempt; one that never closes
    // them fails on the guard; a stream opened and not answered fails at once.
    let mut answers = Vec::new();
    for _attempt in 0..5 {
        // Before the connection exists: its age cannot have started earlier.
        let started = Instant::now();
        let (mut sender, mut conn) = h2_client(&s).await;
        let mut answered = 0;
        loop {
            tokio::select! {
                _ = &mut conn => break,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            assert!(
                started.elapsed() < HANG,
                "still open 120 s after a maximum age of 1 s"
            );
            // After GOAWAY the client opens no new stream; every stream it did open is answered.
            match h2_healthz(&mut sender).await {
                Ok(status) => {
                    assert_eq!(status, 200);
                    answered += 1;
                }
                Err(e) => assert!(e.is_closed() || e.is_canceled(), "{e}"),
            }
        }
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "closed before its maximum age: {:?}",
            started.elapsed()
        );
        answers.push(answered);
        if answered >= 3 {
            break;
        }
    }
    assert!(
        answers.last().is_some_and(|a| *a >= 3),
        "requests answered before the close, by attempt: {answers:?}"
    );
    stop(s).await;
}

#[tokio::test]
async fn one_source_holding_idle_connections_keeps_at_most_its_cap_open() {
    // No deadline closes a connection in the test's lifetime (the survivors and the real
    // client's included): only the cap can.
    let limits = Limits {
        max_connections: 64,
        max_connections_per_source: 4,
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let mut held = idle_connections(&s, 12, b"").await;
    let closed = wait_closed(&mut held, 8).await;
    // The oldest went first; the newest are the ones left.
    assert_eq!(
        closed,
        [vec![true; 8], vec![false; 4]].concat(),
        "12 idle connections from one source, cap 4"
    );
    // The same source's real request still gets in, by closing one of its idle connections.
    assert_eq!(api_server_review(&s).await, 200);
    stop(s).await;
}

/// Bodies that never finish do not protect their connections: a source at its cap with four
/// of them gets room for a fifth connection by losing the one whose body has arrived least
/// (only a request wholly read and being answered is never closed; `src/transport/conns.rs`).
#[tokio::test]
async fn a_source_at_its_cap_with_slow_bodies_makes_room_by_closing_the_least_read() {
    // No deadline closes a connection in the test's lifetime: only making room can.
    let limits = Limits {
        max_connections: 64,
        max_connections_per_source: 4,
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    // Four requests with the token whose bodies never finish; the first has sent the least.
    let head = |sent: usize| {
        format!(
            "POST /{TOKEN}/mutate--v1-pod HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{}",
            " ".repeat(sent)
        )
    };
    let mut busy = Vec::new();
    for sent in [1, 50, 100, 150] {
        busy.extend(idle_connections(&s, 1, head(sent).as_bytes()).await);
    }
    // The server has read every head and what each body sent (else a head not yet read would
    // be the one closed, or two bodies would tie).
    settle().await;
    // From the same source: admitted, and answered.
    assert_eq!(api_server_review(&s).await, 200);
    let least = read_until_closed(&mut busy[0], HANG).await;
    assert!(
        least.is_some(),
        "the connection with the least of its body read was closed"
    );
    for (i, c) in busy.iter_mut().enumerate().skip(1) {
        assert!(
            read_until_closed(c, Duration::from_millis(200))
                .await
                .is_none(),
            "slow body {i} was closed too"
        );
    }
    drop(busy);
    stop(s).await;
}

/// A TLS connection whose socket send buffer is small, so a write completes only once the server
/// has taken the bytes: on loopback the kernel would otherwise accept megabytes that the
/// server's reset then throws away, and the body would never outrun the socket buffers.
async fn tls_connect_small_send_buffer(port: u16, ca_pem: &[u8]) -> std::io::Result<Tls> {
    use std::sync::Arc;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert?).map_err(std::io::Error::other)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_send_buffer_size(16 * 1024)?;
    let tcp = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await?;
    let name =
        rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Sends a body of `body_len` bytes to a wrong token over a new connection, written in full by
/// its own task while this one reads, and returns the status line the server sent back (empty if
/// the connection broke first) and whether the whole request was written without a reset.
async fn wrong_token_post(s: &Running, body_len: usize) -> (String, std::io::Result<()>) {
    large_post(
        s,
        "/wrong-token-0123456789abcdefghijklmn/mutate--v1-pod",
        body_len,
    )
    .await
}

/// [`wrong_token_post`] to any path.
async fn large_post(s: &Running, path: &str, body_len: usize) -> (String, std::io::Result<()>) {
    let tls = tls_connect_small_send_buffer(s.port, &s.ca).await.unwrap();
    let (mut rd, mut wr) = tokio::io::split(tls);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&vec![b' '; body_len]).await?;
        wr.flush().await?;
        // Keep the write half open until the reader is done.
        Ok::<_, std::io::Error>(wr)
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        // The guard ends only a hang: the server's linger is an hour, so it reads the body.
        match tokio::time::timeout(HANG, rd.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let written = writer.await.unwrap().map(drop);
    let text = String::from_utf8_lossy(&got);
    (text.lines().next().unwrap_or_default().to_owned(), written)
}

#[tokio::test]
async fn large_bodies_sent_to_a_wrong_token_are_read_to_the_end_and_all_get_their_404() {
    // The linger (and every other limit) is an hour: only a real reset can lose an answer.
    let s = start_server(&with_token(), patient_limits()).await;
    let mut lost = Vec::new();
    for i in 0..20 {
        let len = if i % 2 == 0 {
            300 * 1024
        } else {
            2 * 1024 * 1024
        };
        let (status, written) = wrong_token_post(&s, len).await;
        // A client that stops at a failed write (as the API server's may) never sees the
        // status: the body must be taken in full, not reset.
        if !status.starts_with("HTTP/1.1 404") || written.is_err() {
            lost.push((len, status, written.err().map(|e| e.to_string())));
        }
    }
    assert!(lost.is_empty(), "answers lost or requests reset: {lost:?}");
    stop(s).await;
}

/// The same with the right token and bodies over `http.maxBodyBytes` (refused from their
/// `Content-Length`, under twice the limit, so drained): every client reads its 400.
#[tokio::test]
async fn bodies_over_the_limit_sent_with_the_token_are_read_to_the_end_and_all_get_their_400() {
    const MAX: usize = 1024 * 1024;
    let s = start_server(
        &config(json!({"http": {"pathToken": TOKEN, "maxBodyBytes": MAX}})),
        patient_limits(),
    )
    .await;
    let path = format!("/{TOKEN}/mutate--v1-pod");
    let mut lost = Vec::new();
    for i in 0..20 {
        let len = if i % 2 == 0 {
            MAX + MAX / 5
        } else {
            2 * MAX - 4096
        };
        let (status, written) = large_post(&s, &path, len).await;
        if !status.starts_with("HTTP/1.1 400") || written.is_err() {
            lost.push((len, status, written.err().map(|e| e.to_string())));
        }
    }
    assert!(lost.is_empty(), "answers lost or requests reset: {lost:?}");
    stop(s).await;
}

/// An HTTP/2 connection from `source` whose client never opens a stream's window (initial
/// window 0), and the response head of a whole review with the token sent on it: the reply is
/// made and waits for a window the client never gives.
async fn untaken_reply(s: &Running, source: u8) -> Untaken {
    let tcp = tcp_connect_from(source, s.port).await.unwrap();
    let tls = tls_over(tcp, &s.ca, "localhost", None).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = hyper::Request::post(format!("https://localhost/{TOKEN}/mutate--v1-pod"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(review_bytes())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    Untaken {
        _sender: sender,
        _reply: resp,
        conn,
    }
}

/// The client's side of [`untaken_reply`], open while this lives, and the connection's task.
struct Untaken {
    _sender: hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
    _reply: hyper::Response<hyper::body::Incoming>,
    conn: tokio::task::JoinHandle<hyper::Result<()>>,
}

/// A client that never takes its reply (an HTTP/2 window it never opens) does not hold the
/// reply, nor its connection, past the body's deadline: the server closes the connection. Every
/// other limit is an hour.
#[tokio::test]
async fn a_reply_the_client_never_takes_closes_its_connection_at_the_body_deadline() {
    let limits = Limits {
        body: Duration::from_millis(500),
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let started = Instant::now();
    let mut untaken = untaken_reply(&s, 1).await;
    let ended = tokio::time::timeout(HANG, &mut untaken.conn)
        .await
        .expect("the server closed the connection whose reply was never taken (open after 120 s)");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{ended:?} after {:?}",
        started.elapsed()
    );
    drop(untaken);
    stop(s).await;
}

/// Replies left untaken at every connection the server allows, from two sources, do not lock
/// out the API server: a connection whose reply waits on its client is closed to make room, as
/// one whose body is still arriving is. The body's deadline is an hour: only that can free one.
#[tokio::test]
async fn untaken_replies_at_the_connection_cap_do_not_lock_out_a_real_review() {
    let limits = Limits {
        max_connections: 8,
        max_connections_per_source: 4,
        ..patient_limits()
    };
    let s = start_server(&with_token(), limits).await;
    let mut held = Vec::new();
    for source in [2, 3] {
        for _ in 0..4 {
            held.push(untaken_reply(&s, source).await);
        }
    }
    assert_eq!(api_server_review(&s).await, 200);
    drop(held);
    stop(s).await;
}
