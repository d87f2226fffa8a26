//! The `metrics` section: CloudWatch Embedded Metric Format lines on stdout.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    #[default(true)]
    pub enabled: bool,
    #[default("podmutator".into())]
    pub namespace: String,
    /// Fixed dimensions added to every metric (e.g. `{"Cluster": "prod-eks"}`).
    pub dimensions: BTreeMap<String, String>,
}

/// Names we set ourselves at the top of each line; a configured dimension may not shadow them.
const OWN_NAMES: [&str; 17] = [
    "Route",
    "Decision",
    "Version",
    "Reason",
    "Admissions",
    "Duration",
    "PatchOps",
    "PatchBytes",
    "MutatorsApplied",
    "SecretsInjected",
    "EmbeddedFetchIds",
    "EmbeddedFetchCalls",
    "CacheHits",
    "CacheMisses",
    "SecretsManagerThrottles",
    "Denials",
    "_aws",
];
/// Prefixes of the per-mutator, per-manager and image counters.
const OWN_PREFIXES: [&str; 4] = ["Mutator_", "SecretsInjected_", "ImageBuilder", "ImageRule"];

impl MetricsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        ensure!(
            !self.namespace.is_empty()
                && self.namespace.len() <= 255
                && !self.namespace.starts_with(':'),
            "metrics.namespace",
            "must be 1 to 255 characters and must not start with ':'"
        );
        // CloudWatch allows 30 dimensions per metric; we use up to two of our own.
        ensure!(
            self.dimensions.len() <= 28,
            "metrics.dimensions",
            "at most 28 fixed dimensions (CloudWatch allows 30 per metric)"
        );
        for (k, v) in &self.dimensions {
            ensure!(
                !OWN_NAMES.contains(&k.as_str()) && !OWN_PREFIXES.iter().any(|p| k.starts_with(p)),
                format!("metrics.dimensions.{k}"),
                "is set by podmutator itself; choose another name"
            );
            ensure!(
                !k.is_empty() && k.len() <= 255 && !v.is_empty() && v.len() <= 1024,
                format!("metrics.dimensions.{k}"),
                "names must be 1-255 characters and values 1-1024"
            );
        }
        Ok(())
    }
}
