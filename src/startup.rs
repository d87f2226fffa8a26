//! The one start-up gate: every check `serve` and `lambda` make before their first request,
//! and the whole of what `check-config` runs, so the three refuse exactly the same
//! configurations with the same key and message. The configuration arrives validated
//! ([`Config::load`](podmutator_core::config::Config)); here the webhook is put together from it
//! ([`podmutator_aws::wiring::deps`], [`App::build`], [`Front::new`]) and, for the commands that
//! serve, the path token is read from Secrets Manager.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::DisplayErrorContext;
use podmutator_aws::secretsmanager::SharedAws;
use podmutator_core::config::{Config, ConfigError};
use podmutator_core::{App, Deps};

use crate::transport::http::Front;

/// Why the webhook did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("invalid configuration: http.pathTokenSecretId: cannot read the path token {id}")]
    ReadPathToken {
        id: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid configuration: http.pathTokenSecretId: secret {id} has no string value")]
    PathTokenNotText { id: String },
    #[error(
        "podmutator serve will not write Embedded secret values into its replies (embedded.delivery: value, or envVarDelivery: value) to callers it cannot authenticate: any pod that reaches its port can send a review, and the path token is no secret from whoever creates pods (the API server quotes it in its errors). Set embedded.delivery: reference with envVarDelivery: exec, which serves names only; or, where the API server can present a client certificate (its admission configuration's kubeconfig: a self-managed control plane; EKS cannot), set http.clientCaFile to the CA that signs it (docs/deploy.md, \"Embedded values in the cluster\")"
    )]
    ValuesToUnauthenticated,
    #[error("failed to start the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// Who starts the webhook, which decides what start-up reads and where metric lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter {
    /// The Lambda runtime loop: EMF lines on stdout, for CloudWatch.
    Lambda,
    /// `serve`: with a probe port (`webhook.metricsPort`) no EMF lines, since Prometheus reads
    /// the same counters there and nothing reads EMF outside CloudWatch.
    Serve,
    /// `check-config`: no network call, so `http.pathTokenSecretId` is left unread.
    CheckConfig,
}

/// What `serve` refuses and `lambda` serves: Embedded values in replies to callers `serve`
/// cannot authenticate (in the cluster every pod can reach its port, and the path token is no
/// secret from whoever creates pods). `check-config` warns of it, not knowing which will run.
pub fn serve_refusal(config: &Config) -> Option<StartError> {
    (config.embedded_reads().values && config.http.client_ca_file.is_none())
        .then_some(StartError::ValuesToUnauthenticated)
}

/// The app behind its HTTP front, for `starter`.
pub async fn front(config: &Config, starter: Starter) -> Result<Front, StartError> {
    let h = &config.http;
    if let Some(refusal) = serve_refusal(config).filter(|_| starter == Starter::Serve) {
        return Err(refusal);
    }
    // Read by `serve` only (Lambda's callers come through its endpoint), and checked here so
    // `check-config` refuses the file `serve` would.
    #[cfg(feature = "serve")]
    if starter != Starter::Lambda
        && let Some(path) = h.client_ca_file.as_deref()
    {
        crate::transport::tls::client_roots(std::path::Path::new(path))
            .map_err(|m| ConfigError::new("http.clientCaFile", format!("{path}: {m}")))?;
    }
    if h.path_token.is_none()
        && h.path_token_sha256.is_none()
        && h.path_token_secret_id.is_none()
        && !h.path_token_disabled
    {
        return Err(ConfigError::new("http", "no path token: set http.pathTokenSha256 (the SHA-256 of the token in the registration URL), http.pathToken or http.pathTokenSecretId; or set http.pathTokenDisabled: true to serve every route to anyone who reaches it").into());
    }
    // One AWS configuration for the process: the token's read, Embedded's clients and ECR's.
    let region = podmutator_aws::wiring::region(config);
    let aws = SharedAws::new(region);
    let token = match h.path_token_secret_id.as_deref() {
        // The token lives in the function's own region (Lambda sets AWS_REGION), which may not
        // be the region Embedded secrets are read from.
        Some(id) if starter != Starter::CheckConfig => {
            let own = std::env::var("AWS_REGION").unwrap_or_default();
            let token_region = if own.is_empty() { region } else { &own };
            let budget = Duration::from_millis(config.embedded.deadline_ms);
            let client = aws.secrets_manager(token_region, budget).await;
            Some(read_path_token(&client, id).await?)
        }
        _ => None,
    };
    let mut deps = Deps::process(config);
    if starter == Starter::Serve && config.webhook.metrics_port.is_some() {
        deps.metrics = None;
    }
    let deps = podmutator_aws::wiring::deps(config, &aws, deps)?;
    let app = App::build(config, deps);
    Ok(Front::new(Arc::new(app), h, token.as_deref())?)
}

async fn read_path_token(client: &Client, id: &str) -> Result<String, StartError> {
    let out = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| StartError::ReadPathToken {
            id: id.to_owned(),
            // The SDK's own Display is terse ("service error"); its context names the cause.
            source: DisplayErrorContext(e).to_string().into(),
        })?;
    out.secret_string()
        .map(|token| token.trim().to_owned())
        .ok_or_else(|| StartError::PathTokenNotText { id: id.to_owned() })
}

/// The async runtime of a command: `serve`'s on every core, the others' on this thread.
pub fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, StartError> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(StartError::Runtime)
}
