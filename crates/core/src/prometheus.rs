//! Prometheus counters for `podmutator serve`: the in-cluster counterpart of the EMF line.
//! Updated from the same [`AdmissionFacts`] the EMF line is written from (one derivation of
//! what an admission did), and from the front's refusals; read by the probe port's `/metrics`
//! in the text exposition format 0.0.4. Rendered here, not by an exporter crate: a dozen fixed
//! series need neither a registry nor its locking.
//!
//! Every count is an atomic. Labels are `&'static str` names the code itself chose (routes,
//! decisions, reasons, refusal kinds, mutator ids), so their number is bounded by the code and a
//! caller can never create a series.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::SecretManagerType;
use crate::metrics::AdmissionFacts;

/// The media type of what [`Counters::render`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds of the admission duration buckets, in microseconds: from a plain review (tens of
/// microseconds) to the API server's 30 s timeout.
const BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000, 30_000_000,
];

/// Counts by a label chosen in the code, in a fixed number of slots claimed on first use (no
/// lock). More distinct labels than slots would be a bug; they are then counted under `other`.
struct Labelled<K: 'static, V, const N: usize> {
    slots: [(OnceLock<K>, V); N],
    other: V,
}

impl<K: 'static, V: Default, const N: usize> Default for Labelled<K, V, N> {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| (OnceLock::new(), V::default())),
            other: V::default(),
        }
    }
}

impl<K: Copy + Ord + 'static, V, const N: usize> Labelled<K, V, N> {
    /// The value for `key`, its slot claimed if it has none yet.
    fn get(&self, key: K) -> &V {
        // An empty slot is claimed for `key`; one another thread claimed first is skipped.
        let slot = self
            .slots
            .iter()
            .find(|(name, _)| *name.get_or_init(|| key) == key);
        slot.map_or(&self.other, |(_, value)| value)
    }

    /// The claimed slots, by label.
    fn sorted(&self) -> Vec<(K, &V)> {
        let mut entries: Vec<_> = self
            .slots
            .iter()
            .filter_map(|(name, value)| name.get().map(|k| (*k, value)))
            .collect();
        entries.sort_by_key(|(k, _)| *k);
        entries
    }
}

#[derive(Default)]
struct Count(AtomicU64);

impl Count {
    fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// One duration histogram: a count per bucket (not cumulative; the last is above every bound)
/// and the sum.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, us: u64) {
        let i = BUCKETS_US.partition_point(|b| *b < us);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }
}

/// What `/metrics` reports.
#[derive(Default)]
pub struct Counters {
    admissions: Labelled<(&'static str, &'static str), Count, 40>,
    durations: Labelled<&'static str, Histogram, 8>,
    denials: Labelled<&'static str, Count, 64>,
    refusals: Labelled<&'static str, Count, 8>,
    mutators: Labelled<&'static str, Count, 16>,
    injected: [Count; SecretManagerType::ALL.len()],
    fetch_ids: Count,
    backend_calls: Count,
    cache_hits: Count,
    cache_misses: Count,
    throttles: Count,
    patch_ops: Count,
}

impl Counters {
    /// Counts one admission, from the facts its EMF line is written from.
    pub fn record(&self, f: &AdmissionFacts<'_>) {
        self.admissions.get((f.route, f.decision)).add(1);
        self.durations.get(f.route).observe(f.duration_us);
        if crate::metrics::is_denial(f.decision) {
            self.denials.get(f.reason).add(1);
        }
        for m in f.mutators {
            self.mutators.get(m).add(1);
        }
        for (t, n) in f.injected {
            // A variant's number is its place in `SecretManagerType::ALL`.
            self.injected[*t as usize].add(u64::from(*n));
        }
        self.patch_ops.add(f.patch_ops as u64);
        if f.fetch_ids > 0 {
            let (hits, misses) = crate::metrics::cache_split(f);
            self.fetch_ids.add(f.fetch_ids as u64);
            self.backend_calls.add(u64::from(f.backend_calls));
            self.cache_hits.add(hits);
            self.cache_misses.add(misses);
            self.throttles.add(u64::from(f.throttles));
        }
    }

    /// Counts one request refused before the admission (`kind`: the EMF line's `Refusal`).
    pub fn refused(&self, kind: &'static str) {
        self.refusals.get(kind).add(1);
    }

    /// The text exposition format 0.0.4: each family's HELP and TYPE once, then its samples.
    pub fn render(&self) -> String {
        let mut out = Out(String::with_capacity(4096), "");
        out.family(
            "podmutator_build_info",
            "gauge",
            "The release answering (always 1).",
        );
        out.sample("", &[("version", crate::metrics::VERSION)], 1);

        out.family(
            "podmutator_admissions_total",
            "counter",
            "Admission reviews answered, by route and decision (allowed, mutated, denied, invalid, error).",
        );
        for ((route, decision), n) in self.admissions.sorted() {
            out.sample("", &[("route", route), ("decision", decision)], n.get());
        }

        out.family(
            "podmutator_admission_duration_seconds",
            "histogram",
            "Time from the review's body to its answer, by route.",
        );
        for (route, h) in self.durations.sorted() {
            let mut cumulative = 0;
            let bounds = BUCKETS_US.iter().map(|b| seconds(*b));
            for (bucket, le) in h.buckets.iter().zip(bounds.chain(["+Inf".into()])) {
                cumulative += bucket.load(Relaxed);
                out.sample("_bucket", &[("route", route), ("le", &le)], cumulative);
            }
            out.raw_sample(
                "_sum",
                &[("route", route)],
                &seconds(h.sum_us.load(Relaxed)),
            );
            // The buckets' total, not a separate count: a scrape during an update stays
            // consistent (count equals the +Inf bucket).
            out.sample("_count", &[("route", route)], cumulative);
        }

        out.labelled(
            "podmutator_denials_total",
            "Admissions denied, invalid or failed, by reason (the EMF line's Reason).",
            "reason",
            &self.denials,
        );
        out.labelled(
            "podmutator_refusals_total",
            "Requests refused before the admission, by kind (PathToken, NotFound, Method, ContentType, BodyTooLarge, BodyReadFailed, TlsHandshake).",
            "refusal",
            &self.refusals,
        );
        out.labelled(
            "podmutator_mutator_applied_total",
            "Admissions each mutator changed the pod in.",
            "mutator",
            &self.mutators,
        );

        let help = "Secrets injected, by secret manager.";
        out.family("podmutator_secrets_injected_total", "counter", help);
        for (t, n) in SecretManagerType::ALL.iter().zip(&self.injected) {
            out.sample("", &[("manager", t.as_str())], n.get());
        }
        for (name, help, n) in [
            (
                "podmutator_patch_ops_total",
                "JSON patch operations returned.",
                &self.patch_ops,
            ),
            (
                "podmutator_embedded_fetch_ids_total",
                "Embedded secret ids an admission needed a value or name for.",
                &self.fetch_ids,
            ),
            (
                "podmutator_secrets_manager_calls_total",
                "AWS Secrets Manager calls made for admissions.",
                &self.backend_calls,
            ),
            (
                "podmutator_secrets_manager_throttles_total",
                "AWS Secrets Manager attempts answered with ThrottlingException, retried or not.",
                &self.throttles,
            ),
            (
                "podmutator_cache_hits_total",
                "Embedded secret ids answered from the cache.",
                &self.cache_hits,
            ),
            (
                "podmutator_cache_misses_total",
                "Embedded secret ids not in the cache.",
                &self.cache_misses,
            ),
        ] {
            out.family(name, "counter", help);
            out.sample("", &[], n.get());
        }
        out.0
    }
}

/// Microseconds as seconds, exactly (`1500` -> `0.0015`).
fn seconds(us: u64) -> String {
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return format!("{whole}");
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// The document being written, and the name of the family being written.
struct Out(String, &'static str);

impl Out {
    fn family(&mut self, name: &'static str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        self.1 = name;
    }

    /// A sample of the family, its name followed by `suffix` (`_bucket`, `_sum`, `_count`).
    fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: u64) {
        self.raw_sample(suffix, labels, &value.to_string());
    }

    fn raw_sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: &str) {
        self.0.push_str(self.1);
        self.0.push_str(suffix);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                self.0.push_str(k);
                self.0.push_str("=\"");
                // The format's three escapes in a label value.
                for c in v.chars() {
                    match c {
                        '\\' => self.0.push_str("\\\\"),
                        '"' => self.0.push_str("\\\""),
                        '\n' => self.0.push_str("\\n"),
                        c => self.0.push(c),
                    }
                }
                self.0.push('"');
            }
            self.0.push('}');
        }
        self.0.push(' ');
        self.0.push_str(value);
        self.0.push('\n');
    }

    fn labelled<const N: usize>(
        &mut self,
        name: &'static str,
        help: &str,
        label: &str,
        counts: &Labelled<&'static str, Count, N>,
    ) {
        self.family(name, "counter", help);
        for (k, n) in counts.sorted() {
            self.sample("", &[(label, k)], n.get());
        }
        let other = counts.other.get();
        if other > 0 {
            self.sample("", &[(label, "other")], other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(route: &'static str, decision: &'static str, us: u64) -> AdmissionFacts<'static> {
        AdmissionFacts {
            route,
            decision,
            reason: if decision == "denied" {
                "SecretNotFound"
            } else {
                ""
            },
            duration_us: us,
            mutators: &["secrets"],
            ..Default::default()
        }
    }

    #[test]
    fn admissions_durations_and_denials_are_counted_by_their_labels() {
        let c = Counters::default();
        c.record(&facts("secrets", "mutated", 150));
        c.record(&facts("secrets", "mutated", 2_000_000));
        c.record(&facts("images", "denied", 40));
        c.refused("PathToken");
        c.refused("PathToken");
        let text = c.render();
        for line in [
            "podmutator_admissions_total{route=\"secrets\",decision=\"mutated\"} 2\n",
            "podmutator_admissions_total{route=\"images\",decision=\"denied\"} 1\n",
            "podmutator_admission_duration_seconds_bucket{route=\"secrets\",le=\"0.0001\"} 0\n",
            "podmutator_admission_duration_seconds_bucket{route=\"secrets\",le=\"0.00025\"} 1\n",
            "podmutator_admission_duration_seconds_bucket{route=\"secrets\",le=\"1\"} 1\n",
            "podmutator_admission_duration_seconds_bucket{route=\"secrets\",le=\"5\"} 2\n",
            "podmutator_admission_duration_seconds_bucket{route=\"secrets\",le=\"+Inf\"} 2\n",
            "podmutator_admission_duration_seconds_sum{route=\"secrets\"} 2.00015\n",
            "podmutator_admission_duration_seconds_count{route=\"secrets\"} 2\n",
            "podmutator_denials_total{reason=\"SecretNotFound\"} 1\n",
            "podmutator_refusals_total{refusal=\"PathToken\"} 2\n",
            "podmutator_mutator_applied_total{mutator=\"secrets\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn more_labels_than_slots_are_counted_under_other() {
        let l: Labelled<&'static str, Count, 2> = Labelled::default();
        for k in ["a", "b", "c", "a", "d"] {
            l.get(k).add(1);
        }
        let got: Vec<_> = l.sorted().into_iter().map(|(k, n)| (k, n.get())).collect();
        assert_eq!(got, [("a", 2), ("b", 1)]);
        assert_eq!(l.other.get(), 2);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Out(String::new(), "m");
        out.sample("", &[("k", "a\"b\\c\nd")], 1);
        assert_eq!(out.0, "m{k=\"a\\\"b\\\\c\\nd\"} 1\n");
    }

    #[test]
    fn seconds_are_exact() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(100), "0.0001");
        assert_eq!(seconds(1_500), "0.0015");
        assert_eq!(seconds(30_000_000), "30");
        assert_eq!(seconds(2_000_150), "2.00015");
    }
}
