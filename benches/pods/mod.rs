//! The Flyte task pods and secret lists benches/admission.rs and benches/instructions.rs both
//! measure, in one place so that both measure the same reviews.

use std::time::Duration;

use podmutator_aws::secretsmanager::{CachePolicy, CachingSource};
use podmutator_core::secrets::codec::{MountRequirement, Secret, encode_annotations};
use podmutator_core::secrets::source::StaticSource;
use serde_json::{Value, json};

pub const NS: &str = "flytesnacks-development";
pub const SCOPE: (&str, &str, &str) = ("flyte", "flytesnacks", "development");

pub fn secret(group: &str, version: &str, key: &str, mount: MountRequirement) -> Secret {
    Secret {
        group: group.into(),
        group_version: version.into(),
        key: key.into(),
        mount_requirement: mount,
        ..Default::default()
    }
}

/// A Flyte task pod as flytepropeller creates it; `secrets` become `flyte.secrets/s<N>`.
pub fn task_pod(secrets: &[Secret]) -> Value {
    let mut labels = json!({"organization": SCOPE.0, "project": SCOPE.1, "domain": SCOPE.2});
    let mut annotations = json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"});
    if !secrets.is_empty() {
        labels["inject-flyte-secrets"] = json!("true");
        for (k, v) in encode_annotations(secrets).unwrap() {
            annotations[k] = json!(v);
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "a8f3k2-n0-0-",
            "namespace": NS,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "flyte.lyft.com/v1alpha1", "kind": "flyteworkflow",
                "name": "a8f3k2", "uid": "0b8a5b33-3e4c-4bde-9a0c-0f3a0d7f0d11",
                "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "default",
            "containers": [{
                "name": "a8f3k2-n0-0",
                "image": "cr.flyte.org/flyteorg/flytekit:py3.11-1.14.0",
                "args": ["pyflyte-fast-execute", "--additional-distribution", "s3://bucket/fast/abc.tar.gz",
                         "--", "pyflyte-execute", "--inputs", "s3://bucket/metadata/inputs.pb",
                         "--output-prefix", "s3://bucket/metadata/n0/data/0", "--resolver",
                         "flytekit.core.python_auto_container.default_task_resolver", "--",
                         "task-module", "workflows.example", "task-name", "say_hello"],
                "env": [
                    {"name": "FLYTE_INTERNAL_EXECUTION_WORKFLOW", "value": "flytesnacks:development:workflows.example.wf"},
                    {"name": "FLYTE_INTERNAL_EXECUTION_ID", "value": "a8f3k2"},
                    {"name": "FLYTE_INTERNAL_EXECUTION_PROJECT", "value": "flytesnacks"},
                    {"name": "FLYTE_INTERNAL_EXECUTION_DOMAIN", "value": "development"},
                    {"name": "FLYTE_ATTEMPT_NUMBER", "value": "0"}
                ],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
                "terminationMessagePolicy": "FallbackToLogsOnError"
            }]
        }
    })
}

pub fn three_k8s() -> Vec<Secret> {
    vec![
        secret("app-db", "", "password", MountRequirement::EnvVar),
        secret("app-db", "", "username", MountRequirement::EnvVar),
        secret("app-tls", "", "tls.key", MountRequirement::File),
    ]
}

/// 6 ENV_VAR + 14 FILE secrets (Vault paths, AWS ARNs, K8s Secrets), interleaved as a task
/// might list them.
pub fn twenty_mixed() -> Vec<Secret> {
    let mut out = Vec::new();
    for i in 0..5 {
        out.push(secret(
            "app-db",
            "",
            &format!("env-key-{i}"),
            MountRequirement::EnvVar,
        ));
        out.push(secret(
            &format!("secret/data/flyte/svc{i}"),
            "kv2",
            &format!("vault-key-{i}"),
            MountRequirement::File,
        ));
        out.push(secret(
            &format!("arn:aws:secretsmanager:us-east-1:123456789012:secret:flyte/svc{i}"),
            "",
            &format!("aws-key-{i}"),
            MountRequirement::File,
        ));
        if i < 4 {
            out.push(secret(
                "app-files",
                "",
                &format!("file-key-{i}"),
                MountRequirement::File,
            ));
        }
    }
    out.push(secret("app-api", "", "token", MountRequirement::EnvVar));
    assert_eq!(out.len(), 20);
    out
}

/// Case c with Embedded first: the configuration, and a cache already holding the six ENV_VAR
/// values of `twenty_mixed` under their Embedded names (the 14 FILE secrets fall through: an
/// Embedded FILE secret beside an AWS fetcher is refused, both want /etc/flyte/secrets).
pub fn embedded_first() -> (Value, CachingSource<StaticSource>) {
    let config = json!({"webhook": {
        "secretManagerTypes": ["Embedded", "AWS", "Vault", "K8s"],
        "embeddedSecretManagerConfig": {"type": "AWS"}
    }, "embedded": {"organization": "flyte"}});
    let mut source = StaticSource::default();
    let (org, project, domain) = SCOPE;
    for key in [
        "env-key-0",
        "env-key-1",
        "env-key-2",
        "env-key-3",
        "env-key-4",
        "token",
    ] {
        let id = format!("u__org__{org}__domain__{domain}__project__{project}__key__{key}");
        source = source.with(&id, "fake-bench-value-0123456789abcdef");
    }
    let cached = CachingSource::new(
        source,
        CachePolicy {
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            max_entries: 10_000,
            max_bytes: 16 << 20,
        },
    );
    (config, cached)
}
