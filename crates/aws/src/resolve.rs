//! Resolve, don't read: `reference` delivery asks AWS Secrets Manager which of a secret's scope
//! names exist with `DescribeSecret`, which returns metadata (name, ARN, dates) and never a
//! value. Every id of an admission is described at once, one call each, all in parallel: one
//! round trip per pod, whatever its number of secrets. [`crate::secretsmanager::CachingSource`] in
//! front of it remembers the answers with the TTL and the negative TTL.
//!
//! Why `DescribeSecret` and not `ListSecrets` with `name` filters (docs/secrets.md has the
//! figures): both answer in one round trip when issued in parallel, but `DescribeSecret`'s
//! account quota is 40,000 requests per second against `ListSecrets`' 100, and it can be
//! permitted on the `u__org__*` names only, while `ListSecrets` takes no resource and would
//! let the function list every secret name in the account. A `ListSecrets` name filter also
//! matches by prefix, so `...__key__db` would answer for `...__key__db2` too.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput;
use tokio::sync::Semaphore;

use podmutator_core::secrets::source::{
    Api, BoxFuture, Fetched, Lookup, SecretRef, SecretSource, SourceError,
};

use crate::secretsmanager::{ThrottleCounter, from_sdk};

/// `DescribeSecret` calls this process has in flight at most, all admissions together. Above a
/// pod's ids (`limits.maxSecretIdsPerAdmission` caps those): one admission still takes one
/// round trip, and a burst of admissions cannot open thousands of connections.
pub const DEFAULT_MAX_DESCRIBE_IN_FLIGHT: usize = 256;

/// AWS Secrets Manager metadata: whether each id exists, and its name and ARN.
#[derive(Clone)]
pub struct DescribeSource {
    client: Client,
    in_flight: Arc<Semaphore>,
}

impl DescribeSource {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            in_flight: Arc::new(Semaphore::new(DEFAULT_MAX_DESCRIBE_IN_FLIGHT)),
        }
    }

    async fn describe(
        self,
        throttles: ThrottleCounter,
        id: String,
    ) -> Result<(String, Lookup), SourceError> {
        // The semaphore is never closed; if it were, the call would go ahead unbounded.
        let _slot = self.in_flight.acquire_owned().await.ok();
        let sent = self
            .client
            .describe_secret()
            .secret_id(&id)
            .customize()
            .interceptor(throttles.clone())
            .send()
            .await;
        match sent {
            // A secret scheduled for deletion is still described, but its value can no longer
            // be read; one without an AWSCURRENT version (created without a value) has none to
            // read. For the pod neither exists, and the cascade goes on, as a value's fetch does.
            Ok(out) if out.deleted_date().is_some() || !has_current_version(&out) => {
                Ok((id, Lookup::NotFound))
            }
            Ok(out) => {
                let name = out.name().unwrap_or(&id).to_owned();
                let arn = out.arn().unwrap_or_default().to_owned();
                Ok((id, Lookup::Exists(SecretRef { name, arn })))
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Ok((id, Lookup::NotFound))
            }
            Err(e) => Err(from_sdk(Api::DescribeSecret, id, &throttles, e)),
        }
    }
}

impl SecretSource for DescribeSource {
    fn fetch_many<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<Fetched, SourceError>> {
        Box::pin(async move {
            // Dropping the set (first error, or the admission's deadline) aborts the calls
            // still waiting for a slot.
            let throttles = ThrottleCounter::default();
            let mut calls = tokio::task::JoinSet::new();
            for id in ids {
                calls.spawn(self.clone().describe(throttles.clone(), id.clone()));
            }
            let mut found = BTreeMap::new();
            while let Some(joined) = calls.join_next().await {
                let (id, lookup) = joined.map_err(|source| SourceError::Task {
                    ids: ids.join(", "),
                    source,
                })??;
                found.insert(id, lookup);
            }
            Ok(Fetched {
                values: found,
                cache_hits: 0,
                backend_ids: ids.len() as u32,
                backend_calls: ids.len() as u32,
                throttles: throttles.get(),
            })
        })
    }
}

/// Whether a version of the described secret is in stage `AWSCURRENT`, the one a value's
/// fetch reads.
fn has_current_version(out: &DescribeSecretOutput) -> bool {
    (out.version_ids_to_stages().into_iter().flatten())
        .any(|(_, stages)| stages.iter().any(|s| s == "AWSCURRENT"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_secretsmanager::operation::describe_secret::{
        DescribeSecretError, DescribeSecretOutput,
    };
    use aws_sdk_secretsmanager::types::error::{InternalServiceError, ResourceNotFoundException};
    use aws_smithy_mocks::{RuleMode, mock, mock_client};

    #[tokio::test]
    async fn existing_deleted_and_missing_secrets_are_told_apart_by_metadata_alone() {
        let exists = mock!(aws_sdk_secretsmanager::Client::describe_secret)
            .match_requests(|r| r.secret_id() == Some("a"))
            .then_output(|| {
                DescribeSecretOutput::builder()
                    .name("a")
                    .arn("arn:aws:secretsmanager:us-east-1:123456789012:secret:a-AbCdEf")
                    .version_ids_to_stages("v2", vec!["AWSCURRENT".into()])
                    .version_ids_to_stages("v1", vec!["AWSPREVIOUS".into()])
                    .build()
            });
        // Created without a value: described, with no version to read.
        let empty = mock!(aws_sdk_secretsmanager::Client::describe_secret)
            .match_requests(|r| r.secret_id() == Some("empty"))
            .then_output(|| DescribeSecretOutput::builder().name("empty").build());
        let pending = mock!(aws_sdk_secretsmanager::Client::describe_secret)
            .match_requests(|r| r.secret_id() == Some("pending"))
            .then_output(|| {
                DescribeSecretOutput::builder()
                    .name("pending")
                    .version_ids_to_stages("v1", vec!["AWSPENDING".into()])
                    .build()
            });
        let deleted = mock!(aws_sdk_secretsmanager::Client::describe_secret)
            .match_requests(|r| r.secret_id() == Some("gone"))
            .then_output(|| {
                DescribeSecretOutput::builder()
                    .name("gone")
                    .deleted_date(aws_smithy_types::DateTime::from_secs(1))
                    .build()
            });
        let missing = mock!(aws_sdk_secretsmanager::Client::describe_secret).then_error(|| {
            DescribeSecretError::ResourceNotFoundException(
                ResourceNotFoundException::builder().build(),
            )
        });
        let client = mock_client!(
            aws_sdk_secretsmanager,
            RuleMode::MatchAny,
            [&exists, &empty, &pending, &deleted, &missing]
        );
        let ids: Vec<String> = ["a", "empty", "pending", "gone", "none"]
            .map(String::from)
            .into();
        let got = DescribeSource::new(client).fetch_many(&ids).await.unwrap();
        assert_eq!(got.backend_calls, 5);
        assert_eq!(got.values["empty"], Lookup::NotFound);
        assert_eq!(got.values["pending"], Lookup::NotFound);
        assert_eq!(
            got.values["a"],
            Lookup::Exists(SecretRef {
                name: "a".into(),
                arn: "arn:aws:secretsmanager:us-east-1:123456789012:secret:a-AbCdEf".into()
            })
        );
        assert_eq!(got.values["gone"], Lookup::NotFound);
        assert_eq!(got.values["none"], Lookup::NotFound);
    }

    #[tokio::test]
    async fn a_failing_call_names_the_id_and_the_error_code() {
        let rule = mock!(aws_sdk_secretsmanager::Client::describe_secret).then_error(|| {
            DescribeSecretError::InternalServiceError(
                InternalServiceError::builder()
                    .message("service unavailable")
                    .build(),
            )
        });
        let client = mock_client!(aws_sdk_secretsmanager, RuleMode::MatchAny, [&rule]);
        let err = DescribeSource::new(client)
            .fetch_many(&["k".to_owned()])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("failed to fetch secret k: DescribeSecret failed with "),
            "{err}"
        );
        // The service's own words (which may name an account or role) stay in the log.
        assert!(!err.contains("service unavailable"), "{err}");
    }
}
