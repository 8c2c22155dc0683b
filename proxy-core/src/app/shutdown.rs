//! Shutdown: stop accepting, let live connections drain for a grace period, then close the rest.

use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shared by a server's accept loops and connection tasks.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Cancelled when accepting must stop (SIGTERM).
    pub stop: CancellationToken,
    /// Cancelled when the grace period is over: live connections close now.
    pub kill: CancellationToken,
    /// Every connection task, so the drain knows when all are gone.
    pub tracker: TaskTracker,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open when the grace period ran out (closed by force).
    pub forced: usize,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stop accepting and wait up to `grace` for the connection tasks; then close what is left.
    pub async fn drain(&self, grace: Duration) -> Drained {
        self.stop.cancel();
        self.tracker.close();
        let mut forced = 0;
        if tokio::time::timeout(grace, self.tracker.wait()).await.is_err() {
            forced = self.tracker.len();
            tracing::warn!(
                open = forced,
                grace_s = grace.as_secs_f64(),
                "drain grace period over, closing the remaining connections"
            );
            self.kill.cancel();
            // Tasks end promptly once killed; bound the wait anyway so exit is never blocked.
            let _ = tokio::time::timeout(Duration::from_secs(5), self.tracker.wait()).await;
        }
        Drained { forced }
    }
}

/// Completes on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called (not
/// when first polled), so call it before the process can be signalled, i.e. before binding.
/// Must be called inside a tokio runtime.
pub fn termination_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received, draining"),
                _ = int.recv() => tracing::info!("SIGINT received, draining"),
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot install SIGTERM/SIGINT handlers; stop the process with SIGKILL");
                std::future::pending::<()>().await
            }
        }
    }
}
