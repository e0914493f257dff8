//! Signals: SIGINT or SIGTERM resolve [`signal`] (the server fans it out to every listener so each stops
//! accepting and finishes the calls it has); SIGHUP runs a reload ([`on_hangup`]).

/// Resolves on the first SIGINT or SIGTERM.
pub async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the server");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Runs `reload` on a blocking thread at every SIGHUP, until the returned task is aborted. `None` when
/// SIGHUP cannot be watched (logged).
pub fn on_hangup<F>(reload: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn() + Send + Sync + 'static,
{
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP; datasets are listed again only on the interval");
            return None;
        }
    };
    let reload = std::sync::Arc::new(reload);
    Some(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let r = reload.clone();
            let _ = tokio::task::spawn_blocking(move || r()).await;
        }
    }))
}
