//! Certificates for the HTTPS server: `certDir` (`tls.crt`, `tls.key`, and `ca.crt` for the
//! `caBundle`). With `localCert` the webhook creates a CA and a serving certificate there the
//! first time and reuses them on every later start, so a restart never invalidates a registered
//! `caBundle` (Flyte v2 regenerates its CA on each start, which breaks every replica but the
//! last one to write).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio_rustls::rustls::pki_types::UnixTime;
use tokio_rustls::rustls::server::{ClientHello, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, RootCertStore};

pub const CA_CERT: &str = "ca.crt";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// Generated certificates are valid this long; delete the files to rotate earlier.
const VALIDITY_DAYS: i64 = 3650;

/// A certificate directory the server cannot use.
#[derive(Debug, thiserror::Error)]
#[error("certificate directory {dir}: {message}")]
pub struct TlsError {
    pub dir: String,
    pub message: String,
}

fn certs_err(dir: &Path, message: impl Into<String>) -> TlsError {
    TlsError {
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
pub fn ensure_certs(dir: &Path, generate: bool, names: &[String]) -> Result<CertFiles, TlsError> {
    let mut files = CertFiles {
        ca: dir.join(CA_CERT),
        cert: dir.join(TLS_CERT),
        key: dir.join(TLS_KEY),
        generated: false,
    };
    if files.cert.is_file() && files.key.is_file() {
        // A key someone else wrote (a mounted Secret, an earlier tool) is made private too.
        restrict(&files.key, 0o600)?;
        return Ok(files);
    }
    if !generate {
        let missing: Vec<&str> = [(TLS_CERT, &files.cert), (TLS_KEY, &files.key)]
            .into_iter()
            .filter(|(_, path)| !path.is_file())
            .map(|(name, _)| name)
            .collect();
        let verb = if missing.len() == 1 { "is" } else { "are" };
        return Err(certs_err(
            dir,
            format!(
                "{} {verb} missing; mount the serving certificate's Secret there ({TLS_CERT} and {TLS_KEY}), or outside a cluster set webhook.localCert: true to generate them",
                missing.join(" and ")
            ),
        ));
    }
    // Private from creation: the key is written here, and a directory others can write to
    // would let them swap files under the server. An existing directory is left as it is.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| certs_err(dir, format!("cannot create: {e}")))?;
    let (ca_pem, cert_pem, key_pem) =
        generate_certs(names).map_err(|e| certs_err(dir, format!("cannot generate: {e}")))?;
    write_file(&files.ca, ca_pem.as_bytes(), 0o644)?;
    write_file(&files.cert, cert_pem.as_bytes(), 0o644)?;
    write_file(&files.key, key_pem.as_bytes(), 0o600)?;
    files.generated = true;
    Ok(files)
}

fn restrict(path: &Path, mode: u32) -> Result<(), TlsError> {
    let current = std::fs::metadata(path)
        .map_err(|e| certs_err(path.parent().unwrap_or(Path::new(".")), e.to_string()))?
        .permissions()
        .mode();
    if current & 0o777 == mode {
        return Ok(());
    }
    // A read-only mount (a Kubernetes Secret volume) cannot be changed: keep it as it is. Nor
    // can a file of another user's that this process may read (a key of group 65532, 0440):
    // said, and served.
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(30) => Ok(()), // EROFS
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", current & 0o777),
                "the serving key is readable by others than its owner and is not this process's to make private (mode 600); served as it is"
            );
            Ok(())
        }
        Err(e) => Err(certs_err(
            path.parent().unwrap_or(Path::new(".")),
            format!(
                "cannot make {} private (mode {mode:o}): {e}",
                path.display()
            ),
        )),
    }
}

/// Writes `bytes` to `path` by way of a new file in the same directory, created with `mode` (so
/// a key is never readable by others, not even for a moment), synced, then renamed over `path`.
/// Whatever `path` was (a stale file with looser permissions, a symlink) is replaced, never
/// written through: `create_new` refuses to follow a link, and rename replaces the link itself.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let cannot =
        |e: std::io::Error| certs_err(dir, format!("cannot write {}: {e}", path.display()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself lasts once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(cannot)
}

/// A CA and a serving certificate signed by it (ECDSA P-256), as PEM: (ca, cert, key).
pub fn generate_certs(names: &[String]) -> Result<(String, String, String), rcgen::Error> {
    let not_after = OffsetDateTime::now_utc() + time::Duration::days(VALIDITY_DAYS);
    let (ca_pem, ca_key_pem) = generate_ca(not_after)?;
    issue_leaf(&ca_pem, &ca_key_pem, names, not_after).map(|(cert, key)| (ca_pem, cert, key))
}

/// Backdated a day: a node or API server whose clock runs behind still accepts a new
/// certificate.
fn not_before() -> OffsetDateTime {
    OffsetDateTime::now_utc() - time::Duration::days(1)
}

/// A new CA (ECDSA P-256) valid until `not_after`: (certificate PEM, key PEM). Its subject is
/// fixed words and the first bytes of its public key's SHA-256, so that two CAs (the current
/// one and the one it replaced, both in a `caBundle`) have different names.
pub fn generate_ca(not_after: OffsetDateTime) -> Result<(String, String), rcgen::Error> {
    use rcgen::PublicKeyData as _;
    let key = KeyPair::generate()?;
    let id = Sha256::digest(key.subject_public_key_info());
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::OrganizationName, "podmutator");
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("podmutator webhook CA {}", hex::encode(&id[..6])),
    );
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before();
    ca.not_after = not_after;
    Ok((ca.self_signed(&key)?.pem(), key.serialize_pem()))
}

/// A serving certificate for `names` (DNS names or IPs; the last is also the common name),
/// valid until `not_after`, signed by the CA `ca_pem` whose key is `ca_key_pem` (one of
/// [`generate_ca`]'s, or any other: the issuer's name is read from the CA): (certificate PEM,
/// key PEM).
pub fn issue_leaf(
    ca_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    not_after: OffsetDateTime,
) -> Result<(String, String), rcgen::Error> {
    let issuer = Issuer::from_ca_cert_pem(ca_pem, KeyPair::from_pem(ca_key_pem)?)?;
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
    leaf.not_before = not_before();
    leaf.not_after = not_after;
    let key = KeyPair::generate()?;
    Ok((leaf.signed_by(&key, &issuer)?.pem(), key.serialize_pem()))
}

/// `t` as RFC 3339 in UTC, to the second (`2026-12-06T01:02:03Z`).
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The `notAfter` of the first certificate in `pem`; `None` when it is not a certificate.
pub fn not_after(pem: &[u8]) -> Option<OffsetDateTime> {
    der_not_after(&rustls_pemfile::certs(&mut &pem[..]).next()?.ok()?)
}

/// The `notAfter` of the certificate `der`.
fn der_not_after(der: &[u8]) -> Option<OffsetDateTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.to_datetime())
}

/// The `notAfter` of `pem` when it is exactly one CA certificate (basic constraints `cA`, and
/// `keyCertSign` if it says what its key may do); else why not. What `certs` puts in a
/// registration's `caBundle` must be a CA: the API server trusts whatever the bundle holds.
pub fn ca_not_after(pem: &[u8]) -> Result<OffsetDateTime, String> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    let [der] = certs.as_slice() else {
        return Err(format!("{} certificates where one CA belongs", certs.len()));
    };
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("not a certificate: {e}"))?;
    let is_ca = cert
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    if !is_ca {
        return Err("not a CA certificate (no basic constraints with cA)".into());
    }
    if let Ok(Some(usage)) = cert.key_usage()
        && !usage.value.key_cert_sign()
    {
        return Err("a CA certificate whose key may not sign certificates".into());
    }
    Ok(cert.validity().not_after.to_datetime())
}

/// Whether the first certificate of `leaf_pem` is a serving certificate for every one of
/// `names`, signed by one of the certificates of `roots_pem`, and valid at `at` — checked as a
/// TLS client checks it (rustls' webpki verifier); the error says why not.
pub fn verify_leaf(
    roots_pem: &[u8],
    leaf_pem: &[u8],
    names: &[String],
    at: SystemTime,
) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier as _;
    let roots = root_store(roots_pem, "the CA is not PEM", "the CA is not usable")?;
    let leaf = rustls_pemfile::certs(&mut &leaf_pem[..])
        .next()
        .ok_or("no certificate")?
        .map_err(|e| format!("not PEM: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| e.to_string())?;
    let at = UnixTime::since_unix_epoch(at.duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?);
    for name in names {
        let server = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("{name}: {e}"))?;
        verifier
            .verify_server_cert(&leaf, &[], &server, &[], at)
            .map_err(|e| format!("for {name}: {e}"))?;
    }
    Ok(())
}

/// The certificates of `pem` as trust anchors; the error is `not_pem` or `unusable`, then
/// rustls' reason. Empty when `pem` holds none.
pub fn root_store(pem: &[u8], not_pem: &str, unusable: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| format!("{not_pem}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{unusable}: {e}"))?;
    }
    Ok(roots)
}

/// Whether `cert_pem` and `key_pem` form a usable pair (the key is the certificate's).
pub fn is_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
    certified_key(Path::new("."), cert_pem, key_pem)
        .map(|_| ())
        .map_err(|e| e.message)
}

/// How often the serving certificate's files are looked at again, at most: a handshake after
/// that reads them (a few kilobytes) and compares them with what is being served.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The certificate and key in `cert_pem` and `key_pem`, checked to form a pair.
fn certified_key(
    dir: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| certs_err(dir, format!("{TLS_CERT} is not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(certs_err(dir, format!("{TLS_CERT} holds no certificate")));
    }
    // Every client would refuse it: served, it fails each admission while the webhook looks
    // ready.
    if let Some(end) = der_not_after(&certs[0]).filter(|end| *end <= OffsetDateTime::now_utc()) {
        return Err(certs_err(
            dir,
            format!(
                "{TLS_CERT} expired at {}: every client refuses it; renew it (cert-manager: the Certificate's status; the self-managed CA: run the certs Job), or with localCert delete the files to make new ones",
                rfc3339(end)
            ),
        ));
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| certs_err(dir, format!("{TLS_KEY} is not PEM: {e}")))?
        .ok_or_else(|| certs_err(dir, format!("{TLS_KEY} holds no private key")))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(certs, key, &provider)
        .map(Arc::new)
        .map_err(|e| {
            certs_err(
                dir,
                format!("{TLS_CERT} and {TLS_KEY} do not form a usable pair: {e}"),
            )
        })
}

/// The serving certificate of `certDir`, read again when its files change: a Secret updated by
/// cert-manager or a rotation (the kubelet swaps a mounted Secret's files at once) is served to
/// new connections without a restart. A new pair that does not load is logged and the one
/// being served is kept, so a half-written or mismatched update never stops the webhook.
pub struct ReloadingCert {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    current: RwLock<Arc<CertifiedKey>>,
    /// When the files were last read, and the SHA-256 of the cert and key read then (served, or
    /// refused: a bad pair is reported once, not at every look).
    checked: Mutex<(Instant, [u8; 32])>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn digest(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert_pem.len() as u64).to_be_bytes());
    h.update(cert_pem);
    h.update(key_pem);
    h.finalize().into()
}

impl ReloadingCert {
    /// Loads the pair now; an error here stops the start.
    pub fn load(files: &CertFiles, every: Duration) -> Result<Self, TlsError> {
        let dir = files.cert.parent().unwrap_or(Path::new(".")).to_path_buf();
        let (cert_pem, key_pem) = Self::read(&dir, &files.cert, &files.key)?;
        let current = certified_key(&dir, &cert_pem, &key_pem)?;
        Ok(Self {
            checked: Mutex::new((Instant::now(), digest(&cert_pem, &key_pem))),
            dir,
            cert: files.cert.clone(),
            key: files.key.clone(),
            every,
            current: RwLock::new(current),
        })
    }

    fn read(dir: &Path, cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| certs_err(dir, format!("cannot read {}: {e}", p.display())))
        };
        Ok((read(cert)?, read(key)?))
    }

    /// The pair being served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        super::unpoisoned(self.current.read()).clone()
    }

    /// Reads the files again if `every` has passed since the last look (one caller at a time;
    /// the others go on with the pair being served) and serves a changed pair that loads.
    fn refresh(&self) {
        let mut checked = match self.checked.try_lock() {
            Ok(checked) => checked,
            // A panic under the lock must not stop every later reload.
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if checked.0.elapsed() < self.every {
            return;
        }
        checked.0 = Instant::now();
        let loaded = Self::read(&self.dir, &self.cert, &self.key).and_then(|(c, k)| {
            let seen = digest(&c, &k);
            if seen == checked.1 {
                return Ok(None);
            }
            checked.1 = seen;
            certified_key(&self.dir, &c, &k).map(Some)
        });
        match loaded {
            Ok(None) => {}
            Ok(Some(pair)) => {
                *super::unpoisoned(self.current.write()) = pair;
                tracing::info!(cert_dir = %self.dir.display(), "serving certificate reloaded");
            }
            Err(e) => tracing::error!(
                error = %e,
                "serving certificate not reloaded: the previous one is still served"
            ),
        }
    }
}

impl rustls::server::ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        Some(self.current())
    }
}

/// rustls server config from PEM files, offering HTTP/2 and HTTP/1.1; the certificate is
/// reloaded when its files change ([`ReloadingCert`], looked at every [`RELOAD_EVERY`]). With
/// `client_ca` (a PEM file), every client must present a certificate signed by one of its CAs:
/// a handshake without one, or with another, fails.
pub fn tls_config(
    files: &CertFiles,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let resolver = Arc::new(ReloadingCert::load(files, RELOAD_EVERY)?);
    let dir = files.cert.parent().unwrap_or(Path::new("."));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| certs_err(dir, e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let roots = client_roots(path).map_err(|m| client_ca_err(path, m))?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| client_ca_err(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    // HTTP/1.0 too: `curl --http1.0` offers it alone, and is answered as HTTP/1.0 clients are.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    Ok(Arc::new(config))
}

/// What a failed handshake most likely means, by how it failed: the line an operator reads
/// first, so it names the fix for the cause it saw rather than for the most common one.
pub fn handshake_hint(error: &std::io::Error) -> &'static str {
    use rustls::{AlertDescription as Alert, Error as E};
    match error.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        Some(E::AlertReceived(
            Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::UnsupportedCertificate,
        )) => {
            "the client does not trust the serving certificate: if the peer is the API server, the registration's caBundle does not hold the CA that signed it (docs/troubleshooting.md)"
        }
        Some(E::NoCertificatesPresented | E::InvalidCertificate(_)) => {
            "the client presented no certificate, or one no CA in http.clientCaFile signed (docs/troubleshooting.md)"
        }
        Some(E::NoApplicationProtocol) => {
            "the client offered no protocol this server speaks (ALPN: h2, http/1.1, http/1.0)"
        }
        Some(E::InvalidMessage(_)) => {
            "the client does not speak TLS: a plain-HTTP request to the HTTPS port? (the URL must be https://)"
        }
        Some(E::PeerIncompatible(_)) => {
            "the client's TLS is older or weaker than this server accepts (TLS 1.2 or 1.3, current cipher suites)"
        }
        _ => "see the error (docs/troubleshooting.md)",
    }
}

/// The CA certificates of `http.clientCaFile`: a bounded regular file of PEM certificates,
/// at least one; the error says what is wrong with it. The start-up gate reads it too, so
/// `check-config` refuses the file `serve` would.
pub fn client_roots(path: &Path) -> Result<RootCertStore, String> {
    let pem = podmutator_core::config::read_file(path).map_err(|e| format!("cannot read: {e}"))?;
    let roots = root_store(pem.as_bytes(), "not PEM", "not a CA certificate")?;
    if roots.is_empty() {
        return Err("holds no certificate".into());
    }
    Ok(roots)
}

fn client_ca_err(path: &Path, message: impl std::fmt::Display) -> TlsError {
    certs_err(path, format!("http.clientCaFile: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("podmutator-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn names() -> Vec<String> {
        serving_names("podmutator", "flyte")
    }

    #[test]
    fn a_stale_world_readable_key_is_replaced_by_a_private_one() {
        let dir = scratch("stale");
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join(TLS_KEY);
        std::fs::write(&key, "stale").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let files = ensure_certs(&dir, true, &names()).unwrap();
        assert!(files.generated);
        assert_eq!(mode(&key), 0o600);
        let pem = std::fs::read_to_string(&key).unwrap();
        assert!(pem.contains("PRIVATE KEY"), "the new key was written");
        tls_config(&files, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlinked_key_is_replaced_and_its_target_left_untouched() {
        let dir = scratch("symlink");
        std::fs::create_dir_all(&dir).unwrap();
        let outside = scratch("symlink-target");
        std::fs::create_dir_all(&outside).unwrap();
        let target = outside.join("elsewhere");
        std::fs::write(&target, "not yours").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let key = dir.join(TLS_KEY);
        std::os::unix::fs::symlink(&target, &key).unwrap();
        ensure_certs(&dir, true, &names()).unwrap();
        // Compared without printing: on failure the target would hold a private key.
        assert!(
            std::fs::read_to_string(&target).unwrap() == "not yours",
            "the link's target was written"
        );
        assert_eq!(mode(&target), 0o644);
        let meta = std::fs::symlink_metadata(&key).unwrap();
        assert!(
            meta.file_type().is_file(),
            "the link was replaced by a file"
        );
        assert_eq!(mode(&key), 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_changed_pair_is_served_and_a_broken_one_keeps_the_previous() {
        let dir = scratch("reload");
        let files = ensure_certs(&dir, true, &names()).unwrap();
        let served = ReloadingCert::load(&files, std::time::Duration::ZERO).unwrap();
        let first = served.current().cert[0].clone();
        served.refresh();
        assert_eq!(
            served.current().cert[0],
            first,
            "unchanged files, same pair"
        );

        // Even after a panic under the lock of the last look (its mutex poisoned).
        let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = served.checked.lock();
            panic!("under the lock");
        }));
        assert!(poisoned.is_err() && served.checked.is_poisoned());
        let (_, cert, key) = generate_certs(&names()).unwrap();
        write_file(&files.cert, cert.as_bytes(), 0o644).unwrap();
        write_file(&files.key, key.as_bytes(), 0o600).unwrap();
        served.refresh();
        let second = served.current().cert[0].clone();
        assert_ne!(second, first, "the new pair is served");

        // A certificate with another pair's key, then a key that is not PEM: neither is served.
        let (_, other_cert, _) = generate_certs(&names()).unwrap();
        write_file(&files.cert, other_cert.as_bytes(), 0o644).unwrap();
        served.refresh();
        assert_eq!(served.current().cert[0], second);
        write_file(&files.cert, cert.as_bytes(), 0o644).unwrap();
        write_file(&files.key, b"not a key", 0o600).unwrap();
        served.refresh();
        assert_eq!(served.current().cert[0], second);
        // An expired pair, well formed: not served either.
        let (expired_cert, expired_key) = expired_pair();
        write_file(&files.cert, expired_cert.as_bytes(), 0o644).unwrap();
        write_file(&files.key, expired_key.as_bytes(), 0o600).unwrap();
        served.refresh();
        assert_eq!(served.current().cert[0], second);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_named_alone() {
        let dir = scratch("half");
        std::fs::create_dir_all(&dir).unwrap();
        let err = ensure_certs(&dir, false, &names()).unwrap_err();
        assert!(
            err.message.starts_with("tls.crt and tls.key are missing;"),
            "{err}"
        );
        write_file(&dir.join(TLS_CERT), b"cert", 0o644).unwrap();
        let err = ensure_certs(&dir, false, &names()).unwrap_err();
        assert!(
            err.message
                .starts_with("tls.key is missing; mount the serving certificate's Secret"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A CA of the operator's own (another subject than [`generate_ca`]'s, say an
    /// organisation's) signs leaves that verify against it: the issuer is read from the CA.
    #[test]
    fn a_ca_made_elsewhere_issues_leaves_that_verify() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "Example Corp internal CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = params.self_signed(&key).unwrap().pem();
        let until = time::OffsetDateTime::now_utc() + time::Duration::days(1);
        let (leaf, _) = issue_leaf(&ca, &key.serialize_pem(), &names(), until).unwrap();
        verify_leaf(
            ca.as_bytes(),
            leaf.as_bytes(),
            &names(),
            std::time::SystemTime::now(),
        )
        .unwrap();
    }

    /// A serving certificate and its key that expired an hour ago.
    fn expired_pair() -> (String, String) {
        let now = time::OffsetDateTime::now_utc();
        let (ca, ca_key) = generate_ca(now + time::Duration::days(1)).unwrap();
        issue_leaf(&ca, &ca_key, &names(), now - time::Duration::hours(1)).unwrap()
    }

    #[test]
    fn an_expired_certificate_stops_the_start_naming_when_it_expired() {
        let dir = scratch("expired");
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = expired_pair();
        write_file(&dir.join(TLS_CERT), cert.as_bytes(), 0o644).unwrap();
        write_file(&dir.join(TLS_KEY), key.as_bytes(), 0o600).unwrap();
        let files = ensure_certs(&dir, true, &names()).unwrap();
        assert!(!files.generated, "a pair that exists is the operator's");
        let err = ReloadingCert::load(&files, std::time::Duration::ZERO).unwrap_err();
        let end = rfc3339(not_after(cert.as_bytes()).unwrap());
        assert!(
            err.to_string().contains(&format!(
                "tls.crt expired at {end}: every client refuses it"
            )),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_files_are_not_read_again_before_the_interval() {
        let dir = scratch("interval");
        let files = ensure_certs(&dir, true, &names()).unwrap();
        let served = ReloadingCert::load(&files, std::time::Duration::from_secs(3600)).unwrap();
        let first = served.current().cert[0].clone();
        let (_, cert, key) = generate_certs(&names()).unwrap();
        write_file(&files.cert, cert.as_bytes(), 0o644).unwrap();
        write_file(&files.key, key.as_bytes(), 0o600).unwrap();
        served.refresh();
        assert_eq!(served.current().cert[0], first);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn not_after_is_read_from_the_certificate_in_either_time_form() {
        // UTCTime before 2050, GeneralizedTime from 2050 on (RFC 5280), as rcgen writes them.
        for at in ["2031-04-05 06:07:08", "2061-12-31 23:59:59"] {
            let want = time::PrimitiveDateTime::new(
                time::Date::from_calendar_date(
                    at[..4].parse().unwrap(),
                    time::Month::try_from(at[5..7].parse::<u8>().unwrap()).unwrap(),
                    at[8..10].parse().unwrap(),
                )
                .unwrap(),
                time::Time::from_hms(
                    at[11..13].parse().unwrap(),
                    at[14..16].parse().unwrap(),
                    at[17..19].parse().unwrap(),
                )
                .unwrap(),
            )
            .assume_utc();
            let (ca, key) = generate_ca(want).unwrap();
            assert_eq!(not_after(ca.as_bytes()), Some(want), "{at}");
            let (leaf, _) = issue_leaf(&ca, &key, &names(), want).unwrap();
            assert_eq!(not_after(leaf.as_bytes()), Some(want), "{at}");
        }
        assert_eq!(not_after(b"not a certificate"), None);
        let (ca, _) = generate_ca(time::OffsetDateTime::now_utc()).unwrap();
        let der = rustls_pemfile::certs(&mut ca.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        for cut in [1, 10, der.len() / 2, der.len() - 1] {
            let pem = format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                base64_encode(&der[..cut])
            );
            assert_eq!(not_after(pem.as_bytes()), None, "cut at {cut}");
        }
    }

    fn base64_encode(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn a_leaf_verifies_against_its_ca_only_for_its_names_and_in_its_validity() {
        let now = time::OffsetDateTime::now_utc();
        let until = now + time::Duration::hours(1);
        let (ca, key) = generate_ca(until).unwrap();
        let (other_ca, _) = generate_ca(until).unwrap();
        assert_ne!(ca, other_ca);
        let names = vec!["podmutator.flyte.svc".to_owned()];
        let (leaf, leaf_key) = issue_leaf(&ca, &key, &names, until).unwrap();
        let at = std::time::SystemTime::now();
        verify_leaf(ca.as_bytes(), leaf.as_bytes(), &names, at).unwrap();
        // Either CA of a bundle holding both will do.
        let bundle = format!("{other_ca}{ca}");
        verify_leaf(bundle.as_bytes(), leaf.as_bytes(), &names, at).unwrap();
        assert!(verify_leaf(other_ca.as_bytes(), leaf.as_bytes(), &names, at).is_err());
        let other_name = vec!["podmutator.other.svc".to_owned()];
        assert!(verify_leaf(ca.as_bytes(), leaf.as_bytes(), &other_name, at).is_err());
        let later = at + std::time::Duration::from_secs(7200);
        assert!(verify_leaf(ca.as_bytes(), leaf.as_bytes(), &names, later).is_err());
        is_pair(leaf.as_bytes(), leaf_key.as_bytes()).unwrap();
        assert!(is_pair(leaf.as_bytes(), key.as_bytes()).is_err());
    }

    #[test]
    fn a_new_cert_directory_is_private_and_holds_no_leftovers() {
        let parent = scratch("newdir");
        let dir = parent.join("certs");
        ensure_certs(&dir, true, &names()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(TLS_KEY)), 0o600);
        let mut listed: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        listed.sort();
        assert_eq!(listed, [CA_CERT, TLS_CERT, TLS_KEY]);
        std::fs::remove_dir_all(&parent).unwrap();
    }

    /// `http.clientCaFile` is read like every file a configuration names: a device or a FIFO is
    /// refused unread.
    #[test]
    fn a_client_ca_file_that_is_no_regular_file_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("podmutator-client-ca-{}", std::process::id()));
        let files = ensure_certs(&dir, true, &["localhost".to_owned()]).unwrap();
        let err = tls_config(&files, Some(Path::new("/dev/zero"))).expect_err("refused");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
