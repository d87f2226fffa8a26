//! `podmutator serve`: the webhook over HTTPS (local and in the cluster), with the probe port
//! when `webhook.metricsPort` is set. The configuration goes through the start-up gate
//! ([`crate::startup`]) before any certificate is touched; on SIGTERM readiness fails at once
//! while the webhook port answers for `http.drainSeconds`, then both stop and what is in flight
//! finishes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use podmutator_core::config::Config;
use podmutator_core::metrics::VERSION;

use crate::startup::{self, StartError, Starter};
use crate::transport::{probe, server, tls};

/// Why `serve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Server(#[from] server::ServerError),
}

/// Serves until SIGTERM, then drains (above). `namespace` is the Service's, named in a
/// generated certificate.
pub fn run(config: &Config, namespace: &str) -> Result<(), ServeError> {
    let w = &config.webhook;
    let dir = PathBuf::from(w.cert_dir_expanded());
    let addr = SocketAddr::from((config.http.listen_address, w.listen_port));
    let client_ca = config.http.client_ca_file.as_deref().map(Path::new);
    startup::runtime(true)?.block_on(async move {
        // The gate first: a configuration `check-config` refuses touches no certificate.
        let front = Arc::new(startup::front(config, Starter::Serve).await?);
        let files = tls::ensure_certs(
            &dir,
            w.local_cert.unwrap_or(true),
            &tls::serving_names(&w.service_name, namespace),
        )?;
        let tls = tls::tls_config(&files, client_ca)?;
        let (listener, local) = server::bind(addr).await?;
        // Bound after the HTTPS port, so a ready probe port means the webhook's is listening.
        let probe = match w.metrics_port {
            Some(port) => Some(server::bind((config.http.listen_address, port).into()).await?),
            None => None,
        };
        let mut fields = serde_json::json!({
            "version": VERSION,
            "addr": local.to_string(),
            "cert_dir": dir.display().to_string(),
            "certs_generated": files.generated,
            "ca": files.ca.display().to_string(),
            "mutators": front.app().chain().ids(),
        });
        if let Some((_, a)) = &probe {
            fields["metrics_addr"] = a.to_string().into();
        }
        // Caught from here on: once the start line is out, a SIGTERM drains.
        let mut shutdown = server::Shutdown::install().map_err(server::ServerError::Signals)?;
        crate::logging::start_line("serving https", fields);
        // On SIGTERM the pod is leaving its Service: readiness fails at once, while the webhook
        // port keeps answering for http.drainSeconds, as long as the endpoint's removal takes to
        // reach every API server; then both listeners stop and what is in flight finishes.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = std::time::Duration::from_secs(config.http.drain_seconds);
        let signalled = draining.clone();
        tokio::spawn(async move {
            shutdown.recv().await;
            signalled.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(
                drain_seconds = drain.as_secs(),
                "draining: readiness fails, the webhook port answers until the drain ends"
            );
            // A second signal (Ctrl-C again) ends the drain at once.
            tokio::select! {
                () = tokio::time::sleep(drain) => {},
                () = shutdown.recv() => tracing::info!("second signal: the drain ends now"),
            }
            let _ = stop_tx.send(true);
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        if let Some((listener, addr)) = probe {
            let counters = front.app().counters().clone();
            let failed = |source| server::ServerError::Listen { addr, source };
            let listener = listener.into_std().map_err(failed)?;
            probe::serve_on_own_thread(counters, draining, listener, stopped(stop_rx.clone()))
                .map_err(failed)?;
        }
        server::serve(
            front,
            listener,
            tls,
            server::Limits::from_config(&config.http),
            stopped(stop_rx),
        )
        .await?;
        tracing::info!("shut down");
        Ok(())
    })
}
