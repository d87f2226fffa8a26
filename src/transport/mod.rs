//! The edges around the core: HTTP routing ([`http::Front`]), the Lambda adapter, and the
//! HTTPS server with its certificates, and the probe port (`/metrics`, `/healthz`). Each holds an `Arc<App>` and calls `App::review`.

#[cfg(feature = "serve")]
pub mod conns;
pub mod http;
pub mod lambda;
#[cfg(feature = "serve")]
pub mod probe;
#[cfg(feature = "serve")]
pub mod server;
#[cfg(feature = "serve")]
pub mod tls;

/// The guard of a lock, whether or not a panic elsewhere poisoned it: what these locks hold
/// (connection counts, the last refusal of each kind, the certificate served) is never left
/// half-written.
pub(crate) fn unpoisoned<G>(locked: std::sync::LockResult<G>) -> G {
    locked.unwrap_or_else(std::sync::PoisonError::into_inner)
}
