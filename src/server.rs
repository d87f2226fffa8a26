//! The same webhook over HTTPS outside Lambda: local development, or in-cluster behind a Service.
//!
//! TLS is rustls with the ring provider (one TLS stack for the whole binary). Certificates come
//! from `certDir` (`tls.crt`, `tls.key`, and `ca.crt` for the `caBundle`); with `localCert` the
//! webhook creates a CA and a serving certificate there the first time and reuses them on every
//! later start, so a restart never invalidates a registered `caBundle` (Flyte v2 regenerates its
//! CA on each start, which breaks every replica but the last one to write).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming as HyperBody};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::admission::App;
use crate::http::Incoming;

pub const CA_CERT: &str = "ca.crt";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// How long a client may take to finish the TLS handshake, and how long shutdown waits for
/// in-flight admissions.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Generated certificates are valid this long; delete the files to rotate earlier.
const VALIDITY_DAYS: i64 = 3650;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("certificate directory {dir}: {message}")]
    Certs { dir: String, message: String },
    #[error("failed to listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("failed to accept a connection: {0}")]
    Accept(std::io::Error),
}

fn certs_err(dir: &Path, message: impl Into<String>) -> ServerError {
    ServerError::Certs {
        dir: dir.display().to_string(),
        message: message.into(),
    }
}

/// The DNS names and IPs the serving certificate is valid for.
pub fn serving_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        "localhost".into(),
        "127.0.0.1".into(),
        service.into(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
    ]
}

/// Paths of the files in `certDir`.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// True when this call created them.
    pub generated: bool,
}

/// Uses `tls.crt`/`tls.key` from `dir` when both exist; otherwise, if `generate`, creates a CA
/// and a serving certificate for `names` there (key files mode 0600).
pub fn ensure_certs(
    dir: &Path,
    generate: bool,
    names: &[String],
) -> Result<CertFiles, ServerError> {
    let files = CertFiles {
        ca: dir.join(CA_CERT),
        cert: dir.join(TLS_CERT),
        key: dir.join(TLS_KEY),
        generated: false,
    };
    if files.cert.is_file() && files.key.is_file() {
        return Ok(files);
    }
    if !generate {
        return Err(certs_err(
            dir,
            format!(
                "{TLS_CERT} and {TLS_KEY} are missing; mount them there or set webhook.localCert: true to generate them"
            ),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| certs_err(dir, format!("cannot create: {e}")))?;
    let (ca_pem, cert_pem, key_pem) =
        generate_certs(names).map_err(|e| certs_err(dir, format!("cannot generate: {e}")))?;
    write_file(&files.ca, ca_pem.as_bytes(), 0o644)?;
    write_file(&files.cert, cert_pem.as_bytes(), 0o644)?;
    write_file(&files.key, key_pem.as_bytes(), 0o600)?;
    Ok(CertFiles {
        generated: true,
        ..files
    })
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| certs_err(dir, format!("cannot write {}: {e}", path.display())))?;
    f.write_all(bytes)
        .map_err(|e| certs_err(dir, format!("cannot write {}: {e}", path.display())))
}

/// A CA and a serving certificate signed by it (ECDSA P-256), as PEM: (ca, cert, key).
pub fn generate_certs(names: &[String]) -> Result<(String, String, String), rcgen::Error> {
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::days(1);
    let not_after = now + time::Duration::days(VALIDITY_DAYS);

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::OrganizationName, "podmutator");
    ca.distinguished_name
        .push(DnType::CommonName, "podmutator webhook CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(Vec::<String>::new())?;
    leaf.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    leaf.distinguished_name
        .push(DnType::OrganizationName, "podmutator");
    if let Some(cn) = names.last() {
        leaf.distinguished_name.push(DnType::CommonName, cn.clone());
    }
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_key = KeyPair::generate()?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;
    Ok((ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem()))
}

/// rustls server config from PEM files, offering HTTP/2 and HTTP/1.1.
pub fn tls_config(files: &CertFiles) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let dir = files.cert.parent().unwrap_or(Path::new("."));
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| certs_err(dir, format!("cannot read {}: {e}", p.display())))
    };
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| certs_err(dir, format!("{TLS_CERT} is not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(certs_err(dir, format!("{TLS_CERT} holds no certificate")));
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| certs_err(dir, format!("{TLS_KEY} is not PEM: {e}")))?
        .ok_or_else(|| certs_err(dir, format!("{TLS_KEY} holds no private key")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| certs_err(dir, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            certs_err(
                dir,
                format!("{TLS_CERT} and {TLS_KEY} do not form a usable pair: {e}"),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

async fn respond(
    app: Arc<App>,
    max_body: usize,
    req: Request<HyperBody>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let reply = match Limited::new(body, max_body).collect().await {
        Ok(collected) => {
            let bytes = collected.to_bytes();
            app.handle(Incoming {
                method: parts.method.as_str(),
                path: parts.uri.path(),
                content_type: content_type.as_deref(),
                body: &bytes,
            })
            .await
        }
        Err(_) => crate::http::body_too_large(max_body),
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
    app: Arc<App>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    max_body: usize,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Per-connection failures (e.g. the peer reset before accept) are not fatal.
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
                Err(e) => return Err(ServerError::Accept(e)),
            },
            () = &mut shutdown => break,
        };
        let (acceptor, app, watcher, builder) = (
            acceptor.clone(),
            app.clone(),
            graceful.watcher(),
            builder.clone(),
        );
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
                hyper::service::service_fn(move |req| respond(app.clone(), max_body, req));
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: connections still open after the drain timeout");
    }
    Ok(())
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || e.raw_os_error() == Some(24) // EMFILE: back off by retrying on the next connection
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
