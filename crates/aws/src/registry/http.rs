//! The one HTTP stack of the registry lookups: hyper's pooled client (hyper-util) on rustls with
//! ring, the TLS stack the AWS SDK's own client uses, with `url` for every URL. Registries and
//! ECR's API share it, so a lookup's requests reuse one connection per host instead of a TCP
//! and TLS handshake each.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use tokio_rustls::rustls;
use url::Url;

use podmutator_core::registry::error::{LookupError, MAX_BODY};

/// Idle connections kept per host, and for how long: a lookup is a few requests to one host
/// (manifest, config blob, maybe a token), then the answer is cached.
const IDLE_PER_HOST: usize = 4;
const IDLE_FOR: Duration = Duration::from_secs(30);

type Connector = hyper_rustls::HttpsConnector<HttpConnector<Resolve>>;

/// The HTTPS client: its TLS configuration (the system's roots and `caBundleFile`) and its
/// connection pool are made on the first request, so a start that never looks up an image
/// loads no certificate store.
pub struct Http {
    extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    resolve: Arc<Vec<(String, IpAddr)>>,
    client: OnceLock<Client<Connector, Full<Bytes>>>,
}

/// What [`Http::send`] read.
pub struct Answer {
    pub status: StatusCode,
    pub location: Option<String>,
    pub challenge: Option<String>,
    pub body: Bytes,
}

impl Http {
    /// A client trusting the system's roots and `extra_roots`.
    pub fn new(extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>) -> Self {
        Self {
            extra_roots,
            resolve: Arc::new(Vec::new()),
            client: OnceLock::new(),
        }
    }

    /// Connects to `ip` for `host` instead of asking DNS (`curl --resolve`); before the first
    /// request.
    #[must_use]
    pub fn resolving(mut self, host: &str, ip: IpAddr) -> Self {
        Arc::make_mut(&mut self.resolve).push((host.to_owned(), ip));
        self
    }

    fn client(&self) -> &Client<Connector, Full<Bytes>> {
        self.client.get_or_init(|| {
            let mut http = HttpConnector::new_with_resolver(Resolve(Arc::clone(&self.resolve)));
            // The scheme is checked by the connector below (and by the callers: registries are
            // HTTPS only).
            http.enforce_http(false);
            http.set_nodelay(true);
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(self.tls())
                .https_or_http()
                .enable_http1()
                .wrap_connector(http);
            Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(IDLE_FOR)
                .pool_max_idle_per_host(IDLE_PER_HOST)
                .build(https)
        })
    }

    fn tls(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        // Certificates the system store cannot parse are skipped, as every TLS client does.
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        roots.add_parsable_certificates(self.extra_roots.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// One request (HTTP/1.1, TLS unless `url` is an `http://` API endpoint from the AWS
    /// configuration) on a pooled connection, its body read to [`MAX_BODY`] at most.
    pub async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: &[(header::HeaderName, String)],
        body: Bytes,
        what: &str,
    ) -> Result<Answer, LookupError> {
        let connect = |reason: String| LookupError::Connect {
            host: authority(url),
            reason,
        };
        let mut req = Request::builder().method(method).uri(url.as_str()).header(
            header::USER_AGENT,
            concat!("podmutator/", env!("CARGO_PKG_VERSION")),
        );
        for (name, value) in headers {
            req = req.header(name, value.as_str());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| connect(e.to_string()))?;
        let resp = self
            .client()
            .request(req)
            .await
            .map_err(|e| connect(reason(&e)))?;
        let status = resp.status();
        let text = |name: header::HeaderName| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let location = text(header::LOCATION);
        let challenge = text(header::WWW_AUTHENTICATE);
        if text(header::CONTENT_LENGTH)
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > MAX_BODY as u64)
        {
            return Err(LookupError::TooLarge { what: what.into() });
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<LengthLimitError>().is_some() {
                    LookupError::TooLarge { what: what.into() }
                } else {
                    connect(e.to_string())
                }
            })?
            .to_bytes();
        Ok(Answer {
            status,
            location,
            challenge,
            body,
        })
    }
}

/// `host[:port]` of `url`, as its `Host` header has it.
pub fn authority(url: &Url) -> String {
    url[url::Position::BeforeHost..url::Position::AfterPort].to_owned()
}

/// Why a request failed, its causes joined; a TLS failure is named as one, with the fix for the
/// usual cause.
fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut tls = false;
    for err in std::iter::successors(Some(e), |e| e.source()) {
        tls |= is_tls(err);
        let text = err.to_string();
        if !parts.iter().any(|p: &String| p.contains(&text)) {
            parts.push(text);
        }
    }
    let text = parts.join(": ");
    if tls {
        format!(
            "TLS: {text} (a registry with a private CA needs embedded.entrypointLookup.caBundleFile)"
        )
    } else {
        text
    }
}

/// A rustls error, itself or inside I/O errors (the TLS stream reports one as an `io::Error`,
/// which the connector wraps in another; `io::Error::source` skips what it wraps).
fn is_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    err.is::<rustls::Error>()
        || err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| is_tls(inner as &(dyn std::error::Error + 'static)))
}

/// DNS, except for the host names the configuration answers itself (`curl --resolve`).
#[derive(Clone)]
struct Resolve(Arc<Vec<(String, IpAddr)>>);

impl tower_service::Service<Name> for Resolve {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        // Port 0: the connector puts the URL's port in.
        let fixed = self
            .0
            .iter()
            .find(|(h, _)| h == name.as_str())
            .map(|(_, ip)| SocketAddr::new(*ip, 0));
        Box::pin(async move {
            match fixed {
                Some(addr) => Ok(vec![addr].into_iter()),
                None => Ok(tokio::net::lookup_host((name.as_str(), 0))
                    .await?
                    .collect::<Vec<_>>()
                    .into_iter()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A plain HTTP/1.1 server on loopback that answers every request with `200 ok` and keeps
    /// the connection open; it counts the connections it accepts.
    async fn keep_alive_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if conn.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn requests_to_one_host_share_a_pooled_connection() {
        let (addr, accepted) = keep_alive_server().await;
        let http = Http::new(Vec::new()).resolving("registry.test", addr.ip());
        let url = Url::parse(&format!("http://registry.test:{}/v2/", addr.port())).unwrap();
        for _ in 0..3 {
            let answer = http
                .send(Method::GET, &url, &[], Bytes::new(), "test")
                .await
                .unwrap();
            assert_eq!(
                (answer.status, &answer.body[..]),
                (StatusCode::OK, &b"ok"[..])
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for three requests"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_host_and_is_not_a_tls_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = Url::parse(&format!("http://127.0.0.1:{port}/v2/")).unwrap();
        let err = Http::new(Vec::new())
            .send(Method::GET, &url, &[], Bytes::new(), "test")
            .await
            .err()
            .expect("nothing listens");
        let LookupError::Connect { host, reason } = err else {
            panic!("{err:?}")
        };
        assert_eq!(host, format!("127.0.0.1:{port}"));
        assert!(!reason.starts_with("TLS"), "{reason}");
    }
}
