//! `podmutator serve` as a cluster runs it: the probe port (`webhook.metricsPort`: Prometheus
//! `/metrics` and `/healthz`, never an admission) scraped after real admissions and refusals,
//! and the serving certificate replaced under a running server the way the kubelet updates a
//! mounted Secret.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use podmutator::transport::tls;
use serde_json::{Value, json};

const TOKEN: &str = "probe-test-token-0123456789abcdefghij";

fn review_bytes() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap()
}

/// The `podmutator serve` child, stopped (SIGTERM, then waited for) when dropped.
struct Serve {
    child: std::process::Child,
    log: Arc<crate::common::Captured>,
}

impl Serve {
    /// `config`, stopping at once on SIGTERM unless it sets `http.drainSeconds`.
    async fn start(config: &Value) -> Self {
        let mut config = config.clone();
        if config["http"].get("drainSeconds").is_none() {
            config["http"]["drainSeconds"] = json!(0);
        }
        let (child, log) = spawn_serve(
            crate::common::bin()
                .arg("serve")
                .env("PODMUTATOR_CONFIG", config.to_string()),
        )
        .await;
        Self { child, log }
    }

    /// `serve` on 127.0.0.1 with the path token, certificates generated into a new directory
    /// named after `name`, no probe port: (the child, that directory, its port).
    async fn with_token(name: &str) -> (Self, std::path::PathBuf, u16) {
        let dir = temp_dir(name);
        let port = free_port();
        let s = Self::start(&json!({
            "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator"},
            "http": {"listenAddress": "127.0.0.1", "pathToken": TOKEN}
        }))
        .await;
        (s, dir, port)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The first "tls handshake failed" line, once it is logged.
    async fn handshake_line(&self) -> String {
        wait_for(&self.log, "\"tls handshake failed", 1).await;
        let log = self.log();
        log.lines()
            .find(|l| l.contains("\"tls handshake failed"))
            .unwrap()
            .to_owned()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// One plain HTTP/1.1 request: (status, content type, body).
async fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, raw[split + 4..].to_vec())
}

/// A metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

type Labels = Vec<(String, String)>;

/// Parses `{k="v",...}` (the format's escapes `\\`, `\"`, `\n`), returning the labels and
/// what follows the closing brace.
fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut rest = s.strip_prefix('{').ok_or("no {")?;
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        if !labels.is_empty() {
            rest = rest.strip_prefix(',').ok_or("labels not separated by ,")?;
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !is_metric_name(name) || name.contains(':') {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (_, '\n') => return Err("newline in label value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.iter().any(|(n, _)| n == name) {
            return Err(format!("label {name} twice"));
        }
        labels.push((name.to_owned(), value));
        rest = &rest[end + 1..];
    }
}

/// A strict reader of the text exposition format 0.0.4 as `/metrics` writes it: every family
/// has one TYPE (before its samples) and one HELP; every sample belongs to the family declared
/// last (a histogram's as `_bucket`, `_sum`, `_count`, buckets with `le`, cumulative and ending
/// at `+Inf` equal to `_count`); no series twice; values are numbers; the document ends with a
/// newline. Returns `name{labels}` -> value.
fn parse_exposition(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let body = text.strip_suffix('\n').ok_or("no final newline")?;
    let mut series = BTreeMap::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = std::collections::BTreeSet::new();
    let mut family: Option<(String, String)> = None;
    // Per histogram series (labels without `le`): the last cumulative bucket, and +Inf's.
    let mut last_bucket: BTreeMap<String, (f64, Option<f64>)> = BTreeMap::new();
    for (n, line) in body.split('\n').enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let (kw, rest) = rest
                .split_once(' ')
                .ok_or_else(|| at("bad comment".into()))?;
            let (name, value) = rest.split_once(' ').ok_or_else(|| at("no text".into()))?;
            if !is_metric_name(name) {
                return Err(at(format!("bad name {name:?}")));
            }
            match kw {
                "HELP" => {
                    if !helped.insert(name.to_owned()) || value.is_empty() {
                        return Err(at("HELP twice or empty".into()));
                    }
                }
                "TYPE" => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&value) {
                        return Err(at(format!("unknown type {value}")));
                    }
                    if typed.insert(name.to_owned(), value.to_owned()).is_some() {
                        return Err(at("TYPE twice".into()));
                    }
                    family = Some((name.to_owned(), value.to_owned()));
                }
                _ => return Err(at("a comment that is neither HELP nor TYPE".into())),
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(at(format!("bad name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("no space before the value".into()))?;
        if value.contains(' ') {
            return Err(at("a timestamp or trailing text".into()));
        }
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| at(format!("value {v:?}")))?,
        };
        let (fname, kind) = family
            .as_ref()
            .ok_or_else(|| at("sample before any TYPE".into()))?;
        if !helped.contains(fname) {
            return Err(at("family without HELP".into()));
        }
        let suffix = name
            .strip_prefix(fname.as_str())
            .ok_or_else(|| at(format!("sample outside its family {fname}")))?;
        let allowed: &[&str] = match kind.as_str() {
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        if !allowed.contains(&suffix) {
            return Err(at(format!("{kind} sample {name}")));
        }
        if kind == "counter" && !fname.ends_with("_total") {
            return Err(at("a counter not named _total".into()));
        }
        if kind == "counter" && value < 0.0 {
            return Err(at("a negative counter".into()));
        }
        let key_of = |labels: &[(String, String)]| {
            let mut sorted = labels.to_vec();
            sorted.sort();
            let inner: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            format!("{{{}}}", inner.join(","))
        };
        if kind == "histogram" {
            let without_le: Vec<_> = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
            let id = format!("{fname}{}", key_of(&without_le));
            let le = labels.iter().find(|(k, _)| k == "le").map(|(_, v)| v);
            match (suffix, le) {
                ("_bucket", Some(le)) => {
                    let entry = last_bucket.entry(id).or_insert((0.0, None));
                    if value < entry.0 {
                        return Err(at("buckets not cumulative".into()));
                    }
                    entry.0 = value;
                    if le == "+Inf" {
                        entry.1 = Some(value);
                    } else {
                        le.parse::<f64>().map_err(|_| at(format!("le {le:?}")))?;
                    }
                }
                ("_bucket", None) => return Err(at("a bucket without le".into())),
                ("_count", None) => {
                    if last_bucket.get(&id).and_then(|b| b.1) != Some(value) {
                        return Err(at("_count is not the +Inf bucket".into()));
                    }
                }
                ("_sum", None) => {}
                _ => return Err(at("le outside a bucket".into())),
            }
        }
        let key = format!("{name}{}", key_of(&labels));
        if series.insert(key, value).is_some() {
            return Err(at("a series twice".into()));
        }
    }
    for name in typed.keys() {
        if !helped.contains(name) {
            return Err(format!("{name} has TYPE without HELP"));
        }
    }
    Ok(series)
}

/// `series` with its labels as `name{k="v",...}` sorted, or 0 when absent (a counter not yet
/// incremented is not written).
fn value(series: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sorted: Vec<_> = labels.to_vec();
    sorted.sort();
    let inner: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    series
        .get(&format!("{name}{{{}}}", inner.join(",")))
        .copied()
        .unwrap_or(0.0)
}

async fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, content_type, body) = http(port, "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let text = String::from_utf8(body).unwrap();
    parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\nin:\n{text}"))
}

#[test]
fn the_exposition_reader_refuses_what_prometheus_would() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"v\"} 1\n";
    assert!(parse_exposition(good).is_ok());
    for bad in [
        "# TYPE a_total counter\na_total 1\n", // no HELP
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1", // no final newline
        "# HELP a_total A.\n# TYPE a_total counter\na_total{k=v} 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"v\"} x\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n",
        "# HELP a_total A.\n# TYPE a_total counter\nb_total 1\n",
        "# HELP h A.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
        "# HELP h A.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 1\n",
    ] {
        assert!(parse_exposition(bad).is_err(), "{bad}");
    }
}

/// Admissions and refusals through the webhook port move the counters the probe port reports;
/// the probe port itself answers no admission, with or without the token.
#[tokio::test]
async fn metrics_count_admissions_and_refusals_and_the_probe_port_never_admits() {
    let dir = temp_dir("probe-metrics");
    let (port, metrics_port) = (free_port(), free_port());
    let s = Serve::start(&json!({
        "webhook": {"certDir": dir, "listenPort": port, "metricsPort": metrics_port, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathToken": TOKEN}
    }))
    .await;
    assert!(
        s.log()
            .contains(&format!("\"metrics_addr\":\"127.0.0.1:{metrics_port}\"")),
        "{}",
        s.log()
    );
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let before = scrape(metrics_port).await;
    assert_eq!(
        value(
            &before,
            "podmutator_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );

    let review = review_bytes();
    let admit = |path: String, method: &'static str, ct: &'static str, body: Vec<u8>| {
        let ca = ca.clone();
        async move {
            https_request(port, &ca, "localhost", method, &path, Some(ct), &body)
                .await
                .unwrap()
                .0
        }
    };
    let json_ct = "application/json";
    let secrets = format!("/{TOKEN}/mutate--v1-pod");
    for _ in 0..2 {
        assert_eq!(
            admit(secrets.clone(), "POST", json_ct, review.clone()).await,
            200
        );
    }
    assert_eq!(
        admit(secrets.clone(), "POST", json_ct, b"{not json".to_vec()).await,
        400
    );
    // Refusals of each kind the front answers from the head.
    let wrong = "/wrong-token-0123456789abcdefghijklmnopq/mutate--v1-pod".to_owned();
    assert_eq!(admit(wrong, "POST", json_ct, review.clone()).await, 404);
    assert_eq!(
        admit(format!("/{TOKEN}/nope"), "POST", json_ct, vec![]).await,
        404
    );
    assert_eq!(admit(secrets.clone(), "GET", json_ct, vec![]).await, 405);
    assert_eq!(
        admit(secrets.clone(), "POST", "text/plain", review.clone()).await,
        400
    );

    // The probe port: no admission path, however it is asked.
    for path in [
        "/mutate--v1-pod".to_owned(),
        secrets.clone(),
        format!("/{TOKEN}/healthz"),
        "/mutate/images".to_owned(),
    ] {
        let (status, _, body) = http(metrics_port, "POST", &path, &review).await;
        assert_eq!(status, 404, "{path}");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(body.get("response").is_none(), "{body}");
    }
    assert_eq!(http(metrics_port, "POST", "/metrics", b"").await.0, 405);
    let (status, _, body) = http(metrics_port, "GET", "/healthz", b"").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"message": "ok", "version": env!("CARGO_PKG_VERSION")})
    );

    let after = scrape(metrics_port).await;
    let moved = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    let admissions = "podmutator_admissions_total";
    assert_eq!(
        moved(admissions, &[("route", "secrets"), ("decision", "mutated")]),
        2.0
    );
    assert_eq!(
        moved(admissions, &[("route", "secrets"), ("decision", "invalid")]),
        1.0
    );
    let total: f64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("podmutator_admissions_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 3.0, "only the webhook port's admissions: {after:?}");
    assert_eq!(
        moved(
            "podmutator_admission_duration_seconds_count",
            &[("route", "secrets")]
        ),
        3.0
    );
    assert!(
        moved(
            "podmutator_admission_duration_seconds_sum",
            &[("route", "secrets")]
        ) > 0.0
    );
    assert_eq!(
        moved("podmutator_denials_total", &[("reason", "BadRequest")]),
        1.0
    );
    assert_eq!(
        moved(
            "podmutator_mutator_applied_total",
            &[("mutator", "secrets")]
        ),
        2.0
    );
    assert!(moved("podmutator_secrets_injected_total", &[("manager", "K8s")]) >= 2.0);
    for kind in ["PathToken", "NotFound", "Method", "ContentType"] {
        assert_eq!(
            moved("podmutator_refusals_total", &[("refusal", kind)]),
            1.0,
            "{kind}"
        );
    }
    // Counters the probe port's own requests do not move.
    assert_eq!(
        value(
            &scrape(metrics_port).await,
            admissions,
            &[("route", "secrets"), ("decision", "mutated")]
        ),
        value(
            &after,
            admissions,
            &[("route", "secrets"), ("decision", "mutated")]
        )
    );
    // Prometheus reads these counters: no CloudWatch EMF line is written beside them. And the
    // start line lists the mutators as a JSON array.
    let log = s.log();
    assert!(
        !log.contains("\"_aws\""),
        "EMF lines with a probe port: {log}"
    );
    let start: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "serving https")
        .unwrap();
    assert_eq!(start["mutators"], json!(["secrets"]), "{start}");
}

/// Without a probe port, `serve` writes the EMF lines, as the Lambda does (a log shipper may
/// carry them to CloudWatch).
#[tokio::test]
async fn without_a_probe_port_serve_writes_emf_lines() {
    let (s, dir, port) = Serve::with_token("probe-emf").await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let (status, _) = https_request(
        port,
        &ca,
        "localhost",
        "POST",
        &format!("/{TOKEN}/mutate--v1-pod"),
        Some("application/json"),
        &review_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    wait_for(&s.log, "\"_aws\"", 1).await;
}

/// Publishes `files` into `dir` the way the kubelet updates a Secret volume: a new timestamped
/// directory, `..data` switched to it by one rename, each name a link through `..data`.
fn kubelet_publish(dir: &Path, files: &[(&str, &[u8])]) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let version = format!("..version_{}", N.fetch_add(1, Ordering::Relaxed));
    std::fs::create_dir_all(dir.join(&version)).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(&version).join(name), bytes).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// The leaf certificate a new TLS connection to `port` is served.
async fn served_leaf(port: u16, trusted: &[u8]) -> Vec<u8> {
    let tls = tls_connect(port, trusted).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn leaf_der(pem: &str) -> Vec<u8> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// A rotated Secret is served to new connections without a restart; a broken update (a
/// certificate with another pair's key) is refused with an error and the previous pair served.
#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = temp_dir("probe-reload");
    let names = tls::serving_names("podmutator", "flyte");
    let (ca1, cert1, key1) = tls::generate_certs(&names).unwrap();
    kubelet_publish(
        &dir,
        &[
            ("ca.crt", ca1.as_bytes()),
            ("tls.crt", cert1.as_bytes()),
            ("tls.key", key1.as_bytes()),
        ],
    );
    let port = free_port();
    let s = Serve::start(&json!({
        "webhook": {"certDir": dir, "listenPort": port, "localCert": false, "serviceName": "podmutator"},
        "http": {"listenAddress": "127.0.0.1", "pathTokenDisabled": true}
    }))
    .await;
    let (ca2, cert2, key2) = tls::generate_certs(&names).unwrap();
    // The client trusts both CAs (a registration's caBundle during a rotation).
    let trusted = format!("{ca1}{ca2}");
    assert_eq!(
        served_leaf(port, trusted.as_bytes()).await,
        leaf_der(&cert1)
    );

    kubelet_publish(
        &dir,
        &[
            ("ca.crt", ca2.as_bytes()),
            ("tls.crt", cert2.as_bytes()),
            ("tls.key", key2.as_bytes()),
        ],
    );
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = served_leaf(port, trusted.as_bytes()).await;
        if seen == leaf_der(&cert2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, leaf_der(&cert2), "the new certificate within 10 s");
    wait_for(&s.log, "serving certificate reloaded", 1).await;
    let (status, body) = https_request(
        port,
        ca2.as_bytes(),
        "podmutator.flyte.svc",
        "POST",
        "/mutate--v1-pod",
        Some("application/json"),
        &review_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(response(&body)["allowed"], true);

    // A certificate with the previous pair's key: refused, the served pair kept.
    let (_, cert3, _) = tls::generate_certs(&names).unwrap();
    kubelet_publish(
        &dir,
        &[
            ("ca.crt", ca2.as_bytes()),
            ("tls.crt", cert3.as_bytes()),
            ("tls.key", key2.as_bytes()),
        ],
    );
    for _ in 0..50 {
        if s.log().contains("serving certificate not reloaded") {
            break;
        }
        // Each handshake after the interval is what looks at the files again.
        assert_eq!(
            served_leaf(port, trusted.as_bytes()).await,
            leaf_der(&cert2)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(s.log().contains("do not form a usable pair"), "{}", s.log());
    assert_eq!(
        served_leaf(port, trusted.as_bytes()).await,
        leaf_der(&cert2)
    );
    assert!(!s.log().contains(&key2), "a key in the log");
}

/// A serving key the webhook may read but not change (another user's, readable by others, as
/// an init container or an agent writes it) is served, with a WARN saying so: the start used to
/// stop on the chmod it may not make. Run as user 65532 (the image's) by `setpriv`.
#[tokio::test]
async fn a_key_it_may_not_make_private_is_served_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("probe-foreign-key");
    let (ca, cert, key) = tls::generate_certs(&tls::serving_names("podmutator", "flyte")).unwrap();
    for (name, bytes, mode) in [("tls.crt", &cert, 0o644), ("tls.key", &key, 0o644)] {
        std::fs::write(dir.join(name), bytes).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = free_port();
    let config = json!({
        "webhook": {"certDir": dir, "listenPort": port, "serviceName": "podmutator", "localCert": false},
        "http": {"listenAddress": "127.0.0.1", "pathToken": TOKEN, "drainSeconds": 0}
    });
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=65532", "--regid=65532", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_podmutator"))
        .arg("serve")
        .env("PODMUTATOR_CONFIG", config.to_string());
    let (mut child, log) = spawn_serve(&mut cmd).await;
    let text = log.lock().unwrap().clone();
    assert!(
        text.contains("is not this process's to make private"),
        "{text}"
    );
    assert_eq!(served_leaf(port, ca.as_bytes()).await, leaf_der(&cert));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    assert_eq!(
        std::fs::metadata(dir.join("tls.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
}

/// A connection closed before it sends a byte (the kubelet's tcpSocket liveness probe on the
/// webhook port, every 10 s in deploy/kubernetes) is no failed handshake: no WARN line naming
/// the caBundle, no `TlsHandshake` refusal. A real failed handshake still is one.
#[tokio::test]
async fn a_tcp_probe_is_no_failed_handshake() {
    let (s, dir, port) = Serve::with_token("probe-tcp-probe").await;
    let (other_ca, _, _) = tls::generate_certs(&tls::serving_names("podmutator", "flyte")).unwrap();
    tls_connect(port, other_ca.as_bytes()).await.unwrap_err();
    wait_for(&s.log, "\"tls handshake failed", 1).await;
    for _ in 0..3 {
        drop(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
    }
    // Accepted after the probes: by its answer they were accepted and read.
    let trusted = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    served_leaf(port, trusted.as_bytes()).await;
    // At shutdown the refusals counted since the line above are reported: none.
    let log = s.log.clone();
    drop(s);
    wait_for(&log, "\"shut down", 1).await;
    let text = log.lock().unwrap().clone();
    assert_eq!(text.matches("\"tls handshake failed").count(), 1, "{text}");
    assert!(!text.contains("handshake eof"), "{text}");
}

/// The probe port runs on a thread and a runtime of its own (as `serve` starts it): it answers
/// while the runtime that started it runs nothing at all, as when every worker of the webhook's
/// runtime is busy with admissions. Here that runtime's only thread is this test's, blocked in
/// a plain socket read of the probe's answer.
#[test]
fn the_probe_port_answers_while_the_runtime_that_started_it_is_blocked() {
    use std::io::{Read, Write};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = runtime
        .block_on(async {
            podmutator::transport::probe::serve_on_own_thread(
                Default::default(),
                Default::default(),
                listener,
                async {
                    let _ = stopped.await;
                },
            )
        })
        .unwrap();
    let mut probe = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // Only a hang ends here: the answer comes at once or never.
    probe
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    probe.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    stop.send(()).unwrap();
    thread.join().unwrap();
}

/// A client that offers HTTP/1.0 alone in ALPN (`curl --http1.0`) is answered, in HTTP/1.0;
/// a plain-HTTP request to the HTTPS port is a failed handshake whose line says so, not one
/// that blames the caBundle.
#[tokio::test]
async fn http_1_0_is_answered_and_plain_http_is_named_for_what_it_is() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, dir, port) = Serve::with_token("probe-http10").await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let mut config = client_config(&ca, None).unwrap();
    config.alpn_protocols = vec![b"http/1.0".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tls_with(tcp, config, "localhost").await.unwrap();
    let review =
        std::fs::read(root().join("tests/fixtures/reviews/flyte-task-k8s-env.json")).unwrap();
    let head = format!(
        "POST /{TOKEN}/mutate--v1-pod HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        review.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&review).await.unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");

    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let line = s.handshake_line().await;
    assert!(line.contains("plain-HTTP request"), "{line}");
    assert!(!line.contains("caBundle"), "{line}");
}

/// An API server that does not trust the serving certificate (a registration whose caBundle
/// holds another CA) fails every call in the TLS handshake: `serve` says so at the default level,
/// naming the caBundle, once per sample window however many calls fail.
#[tokio::test]
async fn a_failed_tls_handshake_is_logged_at_warn_naming_the_ca_bundle() {
    let (s, _, port) = Serve::with_token("probe-tls-fail").await;
    // A CA that did not sign the serving certificate, as a stale caBundle holds.
    let (other_ca, _, _) = tls::generate_certs(&tls::serving_names("podmutator", "flyte")).unwrap();
    for _ in 0..3 {
        let err = tls_connect(port, other_ca.as_bytes()).await.unwrap_err();
        assert!(
            err.to_string().to_lowercase().contains("certificate"),
            "{err}"
        );
    }
    let line: Value = serde_json::from_str(&s.handshake_line().await).unwrap();
    let log = s.log();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["refusal"], "TlsHandshake", "{line}");
    assert!(
        line["message"].as_str().unwrap().contains("caBundle"),
        "{line}"
    );
    assert!(
        line["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{line}"
    );
    // Sampled: three failures within the window are one line.
    assert_eq!(log.matches("\"tls handshake failed").count(), 1, "{log}");
}
