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
