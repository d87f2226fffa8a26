//! CloudWatch Embedded Metric Format: one JSON line per admission on stdout, which CloudWatch
//! Logs turns into metrics without an API call (and without a metrics agent on Lambda).
//! Namespace and extra dimensions come from the `metrics` config section.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use crate::config::SecretManagerType;
pub use crate::config::metrics::MetricsConfig;

/// What one admission did, in the terms the metrics report.
#[derive(Debug, Clone, Default)]
pub struct AdmissionFacts<'a> {
    pub route: &'a str,
    pub decision: &'a str,
    pub reason: &'a str,
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

/// Where metric lines go.
#[derive(Clone)]
pub enum Sink {
    Stdout,
    /// For tests.
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

    /// The EMF document for one admission.
    pub fn document(&self, f: &AdmissionFacts<'_>, timestamp_ms: u64) -> Value {
        let fixed: Vec<&str> = self.config.dimensions.keys().map(String::as_str).collect();
        let with = |extra: &[&'static str]| -> Vec<String> {
            fixed
                .iter()
                .map(|s| s.to_string())
                .chain(extra.iter().map(|s| s.to_string()))
                .collect()
        };
        let mut root = Map::new();
        for (k, v) in &self.config.dimensions {
            root.insert(k.clone(), json!(v));
        }
        root.insert("Route".into(), json!(f.route));
        root.insert("Decision".into(), json!(f.decision));

        let mut metrics = vec![
            ("Admissions", "Count", json!(1)),
            ("Duration", "Microseconds", json!(f.duration_us)),
            ("PatchOps", "Count", json!(f.patch_ops)),
            ("PatchBytes", "Bytes", json!(f.patch_bytes)),
            ("MutatorsApplied", "Count", json!(f.mutators.len())),
        ];
        let mut named: Vec<(String, Value)> = f
            .mutators
            .iter()
            .map(|m| (format!("Mutator_{m}"), json!(1)))
            .collect();
        let injected: u32 = f.injected.iter().map(|(_, n)| n).sum();
        metrics.push(("SecretsInjected", "Count", json!(injected)));
        named.extend(
            f.injected
                .iter()
                .map(|(t, n)| (format!("SecretsInjected_{t}"), json!(n))),
        );
        // The Union fork's image-builder counters (§5.6: attempts, failures, replacements by
        // version and type, container validations); its `round_time` is `Duration` of the
        // image-builder route.
        named.extend(
            f.images
                .iter()
                .map(|(c, n)| (c.metric().to_owned(), json!(n))),
        );
        if f.fetch_ids > 0 {
            metrics.push(("EmbeddedFetchIds", "Count", json!(f.fetch_ids)));
            metrics.push(("EmbeddedFetchCalls", "Count", json!(f.backend_calls)));
            metrics.push(("CacheHits", "Count", json!(f.cache_hits)));
            metrics.push((
                "CacheMisses",
                "Count",
                json!(f.fetch_ids.saturating_sub(f.cache_hits as usize)),
            ));
            // The Terraform and SAM alarms sum this name over the namespace.
            metrics.push(("SecretsManagerThrottles", "Count", json!(f.throttles)));
        }
        let mut defs: Vec<Value> = metrics
            .iter()
            .map(|(n, u, _)| json!({"Name": n, "Unit": u}))
            .collect();
        for (n, _, v) in metrics {
            root.insert(n.into(), v);
        }
        for (n, v) in named {
            defs.push(json!({"Name": n, "Unit": "Count"}));
            root.insert(n, v);
        }
        let mut directives = vec![json!({
            "Namespace": self.config.namespace,
            "Dimensions": [with(&["Route", "Decision"]), with(&["Decision"])],
            "Metrics": defs,
        })];
        if matches!(f.decision, "denied" | "invalid" | "error") {
            root.insert("Reason".into(), json!(f.reason));
            root.insert("Denials".into(), json!(1));
            directives.push(json!({
                "Namespace": self.config.namespace,
                "Dimensions": [with(&["Reason"])],
                "Metrics": [{"Name": "Denials", "Unit": "Count"}],
            }));
        }
        root.insert(
            "_aws".into(),
            json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": directives}),
        );
        Value::Object(root)
    }

    pub fn emit(&self, f: &AdmissionFacts<'_>) {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let line = self.document(f, ts).to_string();
        match &self.sink {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
            }
            Sink::Memory(lines) => {
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
            }
        }
    }
}
