//! CloudWatch Embedded Metric Format: one JSON line per admission on stdout, which CloudWatch
//! Logs turns into metrics without an API call (and without a metrics agent on Lambda).
//! Namespace and extra dimensions come from the `metrics` config section.
//! Written field by field, not through serde: one line per admission, without an intermediate
//! `serde_json::Value` and its allocations on the admission's path.

use std::fmt::Write as _;
use std::io::Write;
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex};

use crate::config::SecretManagerType;

/// This build's version (the workspace's): in every metric line, the start-up log line and
/// `/healthz`, since which release answered is the first question about any failure.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub use crate::config::metrics::MetricsConfig;

/// What one admission did, in the terms the metrics report.
#[derive(Debug, Clone, Default)]
pub struct AdmissionFacts<'a> {
    pub route: &'static str,
    pub decision: &'static str,
    pub reason: &'static str,
    pub duration_us: u64,
    pub patch_ops: usize,
    pub patch_bytes: usize,
    pub mutators: &'a [&'static str],
    pub injected: &'a [(SecretManagerType, u32)],
    /// The image mutators' counts (only non-zero ones).
    pub images: &'a [(crate::mutate::ImageCount, u32)],
    pub fetch_ids: usize,
    pub backend_calls: u32,
    pub cache_hits: u32,
    /// Secrets Manager attempts answered with `ThrottlingException`, retried or not.
    pub throttles: u32,
}

/// Whether an admission's decision counts as a denial (`Denials`, and its `Reason`).
pub fn is_denial(decision: &str) -> bool {
    matches!(decision, "denied" | "invalid" | "error")
}

/// The secret ids of an admission answered from the cache, and those that were not.
pub fn cache_split(f: &AdmissionFacts<'_>) -> (u64, u64) {
    let hits = u64::from(f.cache_hits);
    (hits, (f.fetch_ids as u64).saturating_sub(hits))
}

/// Milliseconds since the Unix epoch (0 before it): a metric line's `Timestamp`, and the clock
/// of the front's refusal sampling.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where metric lines go.
#[derive(Clone)]
pub enum Sink {
    Stdout,
    /// Lines kept in memory, for tests and benchmarks.
    #[cfg(any(test, feature = "testing"))]
    Memory(Arc<Mutex<Vec<String>>>),
}

#[derive(Clone)]
pub struct Metrics {
    config: MetricsConfig,
    sink: Sink,
}

impl Metrics {
    pub fn new(config: MetricsConfig, sink: Sink) -> Self {
        Self { config, sink }
    }

    /// The EMF line for one admission, written field by field: this runs on every admission,
    /// and building it as a `serde_json::Value` cost more than the JSON floor of a small review.
    /// Keys in a fixed order: the configured dimensions, ours, the version, the metrics, then
    /// `_aws`.
    pub fn line(&self, f: &AdmissionFacts<'_>, timestamp_ms: u64) -> String {
        let injected: u32 = f.injected.iter().map(|(_, n)| n).sum();
        let fetch = f.fetch_ids > 0;
        let denial = is_denial(f.decision);
        let mut out = self.open(1024);
        out.field_str("Route", f.route);
        out.field_str("Decision", f.decision);
        // A property, not a dimension: searchable in Logs Insights and shown beside every
        // metric's samples, without doubling the metric series at each release.
        out.field_str("Version", VERSION);
        // (name, unit, value) of every metric, in the order the directive lists them.
        let fixed = [
            ("Admissions", "Count", 1),
            ("Duration", "Microseconds", f.duration_us),
            ("PatchOps", "Count", f.patch_ops as u64),
            ("PatchBytes", "Bytes", f.patch_bytes as u64),
            ("MutatorsApplied", "Count", f.mutators.len() as u64),
            ("SecretsInjected", "Count", u64::from(injected)),
        ];
        let (cache_hits, cache_misses) = cache_split(f);
        let fetched = [
            ("EmbeddedFetchIds", "Count", f.fetch_ids as u64),
            ("EmbeddedFetchCalls", "Count", u64::from(f.backend_calls)),
            ("CacheHits", "Count", cache_hits),
            ("CacheMisses", "Count", cache_misses),
            // The Terraform and SAM alarms sum this name over the namespace.
            ("SecretsManagerThrottles", "Count", u64::from(f.throttles)),
        ];
        let fetched: &[_] = if fetch { &fetched } else { &[] };
        for (name, _, value) in fixed.iter().chain(fetched) {
            out.field_num("", name, *value);
        }
        // Counts by name: each mutator that applied, secrets by manager, and the Union fork's
        // image-builder counters (§5.6: attempts, failures, replacements by version and type,
        // container validations; its `round_time` is `Duration` of the image-builder route).
        for m in f.mutators {
            out.field_num("Mutator_", m, 1);
        }
        for (t, n) in f.injected {
            out.field_num("SecretsInjected_", t.as_str(), u64::from(*n));
        }
        for (c, n) in f.images {
            out.field_num("", c.metric(), u64::from(*n));
        }
        if denial {
            out.field_str("Reason", f.reason);
            out.field_num("", "Denials", 1);
        }
        self.directive(
            &mut out,
            timestamp_ms,
            &[&["Route", "Decision"], &["Decision"]],
        );
        out.0.push_str(",\"Metrics\":[");
        for (name, unit, _) in fixed.iter().chain(fetched) {
            out.definition("", name, unit);
        }
        for m in f.mutators {
            out.definition("Mutator_", m, "Count");
        }
        for (t, _) in f.injected {
            out.definition("SecretsInjected_", t.as_str(), "Count");
        }
        for (c, _) in f.images {
            out.definition("", c.metric(), "Count");
        }
        out.0.pop(); // the last definition's comma; there is always one (Admissions)
        out.0.push_str("]}");
        if denial {
            out.0.push(',');
            self.dimensions(&mut out, &[&["Reason"]]);
            out.0
                .push_str(",\"Metrics\":[{\"Name\":\"Denials\",\"Unit\":\"Count\"}]}");
        }
        out.0.push_str("]}}");
        out.0
    }

    /// A line's start: `{` and the configured dimensions, as properties.
    fn open(&self, capacity: usize) -> Line {
        let mut out = Line(String::with_capacity(capacity));
        out.0.push('{');
        for (k, v) in &self.config.dimensions {
            out.field_str(k, v);
        }
        out
    }

    /// `"_aws":{"Timestamp":<ms>,"CloudWatchMetrics":[`, then the first directive's namespace
    /// and dimension `sets` ([`Self::dimensions`]).
    fn directive(&self, out: &mut Line, timestamp_ms: u64, sets: &[&[&str]]) {
        out.0.push_str("\"_aws\":{\"Timestamp\":");
        let _ = write!(out.0, "{timestamp_ms}");
        out.0.push_str(",\"CloudWatchMetrics\":[");
        self.dimensions(out, sets);
    }

    /// `{"Namespace":<namespace>,"Dimensions":[...]`: each of `sets` as
    /// `["<configured>", ..., "<own>", ...]`.
    fn dimensions(&self, out: &mut Line, sets: &[&[&str]]) {
        out.0.push_str("{\"Namespace\":");
        out.str(&self.config.namespace);
        out.0.push_str(",\"Dimensions\":[");
        for own in sets {
            out.0.push('[');
            for k in (self.config.dimensions.keys().map(String::as_str)).chain(own.iter().copied())
            {
                out.str(k);
                out.0.push(',');
            }
            out.0.pop();
            out.0.push_str("],");
        }
        out.0.pop();
        out.0.push(']');
    }

    /// The EMF line for `count` requests refused before the admission, by `kind` (the
    /// `Refusal` dimension): `Refusals`, which the Terraform and SAM alarm on for `PathToken`.
    pub fn refusals_line(&self, kind: &str, count: u64, timestamp_ms: u64) -> String {
        let mut out = self.open(256);
        out.field_str("Refusal", kind);
        out.field_str("Version", VERSION);
        out.field_num("", "Refusals", count);
        self.directive(&mut out, timestamp_ms, &[&["Refusal"]]);
        out.0
            .push_str(",\"Metrics\":[{\"Name\":\"Refusals\",\"Unit\":\"Count\"}]}]}}");
        out.0
    }

    pub fn emit_refusals(&self, kind: &str, count: u64) {
        self.write(self.refusals_line(kind, count, now_ms()));
    }

    pub fn emit(&self, f: &AdmissionFacts<'_>) {
        self.write(self.line(f, now_ms()));
    }

    fn write(&self, line: String) {
        match &self.sink {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
            }
            #[cfg(any(test, feature = "testing"))]
            Sink::Memory(lines) => {
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
            }
        }
    }
}

/// A JSON object being written, every member followed by a comma until the last; strings are
/// escaped as serde_json escapes them ([`crate::json`]).
struct Line(String);

impl Line {
    /// A JSON string, as serde_json writes it.
    fn str(&mut self, s: &str) {
        crate::json::push_str(&mut self.0, s);
    }

    /// `prefix` and `s` as one JSON string.
    fn str_parts(&mut self, prefix: &str, s: &str) {
        self.0.push('"');
        crate::json::push_escaped(&mut self.0, prefix);
        crate::json::push_escaped(&mut self.0, s);
        self.0.push('"');
    }

    /// A number under the key `prefix` and `name`.
    fn field_num(&mut self, prefix: &str, name: &str, n: u64) {
        self.str_parts(prefix, name);
        self.0.push(':');
        self.num(n);
    }

    fn num(&mut self, n: u64) {
        let _ = write!(self.0, "{n},");
    }

    fn field_str(&mut self, k: &str, v: &str) {
        self.str(k);
        self.0.push(':');
        self.str(v);
        self.0.push(',');
    }

    fn definition(&mut self, prefix: &str, name: &str, unit: &str) {
        self.0.push_str("{\"Name\":");
        self.str_parts(prefix, name);
        self.0.push_str(",\"Unit\":");
        self.str(unit);
        self.0.push_str("},");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every key of the line's top object once, strings escaped, and the document CloudWatch
    /// reads: each declared metric a number, each dimension a string.
    #[test]
    fn the_line_is_one_json_object_with_unique_keys_and_escaped_strings() {
        let config = MetricsConfig {
            enabled: true,
            namespace: "Team \"A\"/Webhook".into(),
            dimensions: BTreeMap::from([
                ("Cluster".to_string(), "prod\\eks \u{e9}\n".to_string()),
                ("Account".to_string(), "123".to_string()),
            ]),
        };
        let m = Metrics::new(config, Sink::Memory(Default::default()));
        let images = [(crate::mutate::ImageCount::RuleRewrites, 3)];
        for (decision, fetch_ids) in [("mutated", 4), ("denied", 0), ("allowed", 0)] {
            let facts = AdmissionFacts {
                route: "secrets",
                decision,
                reason: "SecretNotFound",
                duration_us: 17,
                patch_ops: 2,
                patch_bytes: 300,
                mutators: &["secrets", "mesh"],
                injected: &[
                    (SecretManagerType::K8s, 2),
                    (SecretManagerType::Embedded, 1),
                ],
                images: &images,
                fetch_ids,
                backend_calls: 1,
                cache_hits: 1,
                throttles: 0,
            };
            let line = m.line(&facts, 1_800_000_000_000);
            // The distinct top-level keys (a key written twice would be one pair here, and
            // counted twice in the text below).
            let pairs: Vec<(String, serde_json::Value)> =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&line)
                    .unwrap()
                    .into_iter()
                    .collect();
            let keys = line.matches("\":").count();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["Cluster"], "prod\\eks \u{e9}\n");
            assert_eq!(
                v["_aws"]["CloudWatchMetrics"][0]["Namespace"],
                "Team \"A\"/Webhook"
            );
            assert_eq!(v["Mutator_mesh"], 1);
            assert_eq!(v["SecretsInjected"], 3);
            assert_eq!(v["SecretsInjected_Embedded"], 1);
            assert_eq!(v["ImageRuleRewrites"], 3);
            assert_eq!(v["Duration"], 17);
            assert_eq!(v["Version"], env!("CARGO_PKG_VERSION"));
            assert_eq!(v["_aws"]["Timestamp"], 1_800_000_000_000u64);
            assert_eq!(v.get("CacheMisses").is_some(), fetch_ids > 0);
            if fetch_ids > 0 {
                assert_eq!(v["CacheMisses"], 3);
            }
            assert_eq!(v.get("Reason").is_some(), decision == "denied");
            let directives = v["_aws"]["CloudWatchMetrics"].as_array().unwrap();
            assert_eq!(directives.len(), 1 + usize::from(decision == "denied"));
            assert_eq!(
                directives[0]["Dimensions"],
                serde_json::json!([
                    ["Account", "Cluster", "Route", "Decision"],
                    ["Account", "Cluster", "Decision"]
                ])
            );
            let mut declared = 0;
            for d in directives {
                for metric in d["Metrics"].as_array().unwrap() {
                    declared += 1;
                    let name = metric["Name"].as_str().unwrap();
                    assert!(v[name].is_number(), "{name} in {line}");
                }
            }
            // Top-level pairs = dimensions + Route + Decision + Version + metrics + _aws; every
            // key in the text (top level and nested) counted once, so none was written twice.
            assert_eq!(
                pairs.len(),
                2 + 3
                    + directives[0]["Metrics"].as_array().unwrap().len()
                    + usize::from(decision == "denied") * 2
                    + 1
            );
            let nested = 2 + directives.len() * 3 + declared * 2;
            assert_eq!(keys, pairs.len() + nested, "{line}");
        }
    }
}
