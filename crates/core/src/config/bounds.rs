//! The range of every numeric setting that has one, in one table: each section's check reads
//! its bounds here, `podmutator config-schema` publishes them (`minimum`, `maximum`), and the
//! IaC tests hold Terraform's and SAM's variables inside them, so that no value the IaC accepts
//! is refused at start. Bounds that depend on another setting (`maxCallsInFlightPerAdmission`
//! at most `maxCallsInFlight`) are checked by the section on top.

use super::ConfigError;

/// A setting's allowed values, `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The dotted key.
    pub key: &'static str,
    pub min: u64,
    pub max: u64,
}

/// No upper bound.
const ANY: u64 = u64::MAX;

/// Declares each bound, `NAME = "dotted.key", min, max;`, and [`ALL`], every one in order.
macro_rules! bounds {
    ($($(#[$doc:meta])* $name:ident = $key:literal, $min:expr, $max:expr;)+) => {
        $($(#[$doc])* pub const $name: Bound = Bound { key: $key, min: $min, max: $max };)+
        /// Every bound, for the schema and the IaC tests.
        pub const ALL: [Bound; [$($key),+].len()] = [$($name),+];
    };
}

bounds! {
    /// Under 100 ms no Secrets Manager call completes from a cold function; over 25 s the API
    /// server (30 s at most) would time out before the function's own answer.
    DEADLINE_MS = "embedded.deadlineMs", 100, 25_000;
    BATCH_SIZE = "embedded.batchSize", 1, 20;
    /// Far over what Secrets Manager's quotas let one process use (`GetSecretValue`, 10,000 a
    /// second for the whole account): a bound of podmutator's (without one, a value past 2^61
    /// overflowed the semaphore that holds them).
    MAX_CALLS_IN_FLIGHT = "embedded.maxCallsInFlight", 1, 1024;
    MAX_CALLS_IN_FLIGHT_PER_ADMISSION = "embedded.maxCallsInFlightPerAdmission", 1, ANY;
    MAX_VALUE_BYTES = "embedded.maxValueBytes", 1, ANY;
    LOOKUP_TIMEOUT_MS = "embedded.entrypointLookup.timeoutMs", 1, ANY;
    MAX_SECRET_REQUESTS_PER_POD = "limits.maxSecretRequestsPerPod", 1, ANY;
    MAX_SECRET_IDS_PER_ADMISSION = "limits.maxSecretIdsPerAdmission", 1, ANY;
    MAX_OBJECTS_PER_REVIEW = "limits.maxObjectsPerReview", 64, 400_000;
    LISTEN_PORT = "webhook.listenPort", 1, 65_535;
    METRICS_PORT = "webhook.metricsPort", 1, 65_535;
    /// The API server sends at most a few MiB (etcd's object limit, twice for an update); Lambda
    /// takes at most 6 MiB.
    MAX_BODY_BYTES = "http.maxBodyBytes", 1024, 64 * 1024 * 1024;
    /// Building a reply costs some tens of times its size in memory, and the in-cluster
    /// Deployment's limit is 256 MiB.
    MAX_REPLY_BYTES = "http.maxReplyBytes", 4096, 6 * 1024 * 1024;
    MAX_CONNECTIONS = "http.maxConnections", 1, 1_000_000;
    MAX_CONNECTIONS_PER_SOURCE = "http.maxConnectionsPerSource", 1, 1_000_000;
    /// An hour for a request to arrive, a day idle, a week old: bounds of podmutator's (without
    /// them, a value near 2^63 overflowed the clock, and the server panicked on every connection).
    FIRST_REQUEST_TIMEOUT_SECONDS = "http.firstRequestTimeoutSeconds", 1, 3_600;
    BODY_TIMEOUT_SECONDS = "http.bodyTimeoutSeconds", 1, 3_600;
    IDLE_TIMEOUT_SECONDS = "http.idleTimeoutSeconds", 1, 86_400;
    MAX_CONNECTION_AGE_SECONDS = "http.maxConnectionAgeSeconds", 1, 604_800;
    DRAIN_SECONDS = "http.drainSeconds", 0, 120;
    /// A day: a value cached longer would outlive any rotation runbook.
    CACHE_TTL_SECONDS = "embedded.cacheTtlSeconds", 0, 86_400;
    /// A year: a bound of podmutator's (its cache refuses over a thousand years, at start).
    TAG_TTL_SECONDS = "embedded.entrypointLookup.tagTtlSeconds", 0, 31_536_000;
}

impl Bound {
    pub const fn contains(&self, value: u64) -> bool {
        self.min <= value && value <= self.max
    }

    /// `Ok` within the bound; else an error naming the key, with `why` (what the value is
    /// and what to use).
    pub fn check(&self, value: u64, why: impl FnOnce(&Self) -> String) -> Result<(), ConfigError> {
        ensure!(self.contains(value), self.key, "{}", why(self));
        Ok(())
    }

    /// The bound's upper end, or `None` when there is none.
    pub fn max(&self) -> Option<u64> {
        (self.max != ANY).then_some(self.max)
    }
}

/// Every bound as `{key: {"minimum": min, "maximum": max}}` (no `maximum` when there is none):
/// `terraform/config-bounds.json`, which Terraform's variables are validated against.
pub fn to_json() -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for b in ALL {
        let mut range = serde_json::Map::new();
        range.insert("minimum".into(), b.min.into());
        if let Some(max) = b.max() {
            range.insert("maximum".into(), max.into());
        }
        out.insert(b.key.into(), range.into());
    }
    out.into()
}

/// `schema` (the configuration's JSON Schema) with each bound's `minimum` and `maximum` on its
/// key's property.
pub fn publish(schema: &mut serde_json::Value) {
    for b in ALL {
        let Some(property) = property(schema, b.key) else {
            continue;
        };
        property["minimum"] = b.min.into();
        if let Some(max) = b.max() {
            property["maximum"] = max.into();
        }
    }
}

/// The schema of `key`'s property: through each section's `properties`, following `$ref`s into
/// `$defs`, and past `anyOf`'s `null` of an optional value.
fn property<'a>(schema: &'a mut serde_json::Value, key: &str) -> Option<&'a mut serde_json::Value> {
    let defs = schema.get("$defs").cloned().unwrap_or_default();
    // The pointer into the document as stored: each `$ref` step restarts at `$defs`.
    let mut pointer = String::new();
    let mut at = &*schema;
    for part in key.split('.') {
        let mut node = at;
        while let Some(name) = node.get("$ref").and_then(|r| r.as_str()) {
            let name = name.rsplit('/').next()?;
            pointer = format!("/$defs/{name}");
            node = defs.get(name)?;
        }
        at = node.get("properties")?.get(part)?;
        pointer += &format!("/properties/{part}");
    }
    let node = schema.pointer_mut(&pointer)?;
    Some(match node.get("anyOf") {
        Some(_) => node
            .get_mut("anyOf")?
            .as_array_mut()?
            .iter_mut()
            .find(|s| s.get("type").and_then(|t| t.as_str()) != Some("null"))?,
        None => node,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(key: &str) -> String {
        key.split('.').map(|k| format!("/{k}")).collect()
    }

    #[test]
    fn every_bound_is_a_key_whose_default_is_within_it_and_whose_ends_load() {
        let defaults = serde_json::to_value(crate::config::Config::default()).unwrap();
        for b in ALL {
            let default = defaults.pointer(&pointer(b.key));
            assert!(default.is_some(), "{} is not a key", b.key);
            if let Some(v) = default.and_then(|v| v.as_u64()) {
                assert!(b.contains(v), "{}'s default {v} is outside {b:?}", b.key);
            }
        }
        // Each end of each bound loads (the rest of the configuration left at its defaults but
        // what a dependent bound needs), and one past it is refused naming the key.
        let load = |key: &str, value: u64| {
            let mut v = serde_json::json!({"embedded": {"maxCallsInFlightPerAdmission": 1}});
            let mut at = &mut v;
            for part in key.split('.') {
                if at.get(part).is_none() {
                    at[part] = serde_json::json!({});
                }
                at = &mut at[part];
            }
            *at = value.into();
            if key == LOOKUP_TIMEOUT_MS.key {
                v["embedded"]["deadlineMs"] = 25_000.into();
                v["embedded"]["entrypointLookup"]["registries"] = serde_json::json!(["r.example"]);
            }
            if key == METRICS_PORT.key {
                v["webhook"]["listenPort"] = 9443.into();
            }
            crate::config::Config::from_value(v)
        };
        for b in ALL {
            let default = defaults.pointer(&pointer(b.key)).and_then(|v| v.as_u64());
            let top = b.max().or(default).unwrap_or(b.min);
            for ok in [b.min.max(u64::from(b.key == LOOKUP_TIMEOUT_MS.key)), top] {
                if let Err(e) = load(b.key, ok) {
                    panic!("{} = {ok} is refused: {e}", b.key);
                }
            }
            let mut outside = vec![];
            if b.min > 0 {
                outside.push(b.min - 1);
            }
            if let Some(max) = b.max().filter(|m| *m < u64::from(u16::MAX)) {
                outside.push(max + 1);
            }
            for bad in outside {
                let e = load(b.key, bad).expect_err(&format!("{} = {bad} loads", b.key));
                assert_eq!(e.key, b.key, "{e}");
            }
        }
    }

    #[cfg(feature = "schema")]
    #[test]
    fn the_schema_carries_every_bound() {
        let schema = crate::config::json_schema();
        let mut copy = schema.clone();
        for b in ALL {
            let p =
                property(&mut copy, b.key).unwrap_or_else(|| panic!("{} not in the schema", b.key));
            assert_eq!(p["minimum"], b.min, "{}", b.key);
            assert_eq!(
                p.get("maximum").and_then(|m| m.as_u64()),
                b.max(),
                "{}",
                b.key
            );
        }
    }
}
