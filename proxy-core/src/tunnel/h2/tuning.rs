//! An HTTP/2 session's stream window on its way from the keepalive loop's samples ([`WindowTuner`]) to the connection, as `SETTINGS_INITIAL_WINDOW_SIZE`.

use super::window::{WindowTuner, stream_window_cap};
use crate::tunnel::TunnelSettings;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the keepalive loop needs to let a session's stream window follow its path
/// ([`WindowTuner`]): the bytes the session received so far, and where a new window goes (the
/// connection's driver sends it as `SETTINGS_INITIAL_WINDOW_SIZE`).
pub(super) struct Tuning {
    pub(super) tuner: WindowTuner,
    received: Arc<AtomicU64>,
    pub(super) apply: watch::Sender<u32>,
}

impl Tuning {
    pub(super) fn new(settings: &TunnelSettings, received: Arc<AtomicU64>) -> (Self, Windows) {
        let cap = if settings.h2_adaptive_window {
            stream_window_cap(settings.stream_window, settings.max_stream_window, settings.connection_window)
        } else {
            settings.stream_window
        };
        let (apply, windows) = watch::channel(settings.stream_window);
        (Self { tuner: WindowTuner::new(settings.stream_window, cap), received, apply }, Windows::new(windows))
    }

    pub(super) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// The windows [`Tuning`] chooses, on their way to the connection as `SETTINGS_INITIAL_WINDOW_SIZE`
/// (every stream of the session, new and open). h2 refuses new SETTINGS while the last await
/// their acknowledgement, a round trip behind whatever the peer has queued; a refused window
/// is tried again after [`APPLY_RETRY`], since the growth to the cap has no later one to carry it.
pub(super) struct Windows {
    chosen: watch::Receiver<u32>,
    retry: Option<Instant>,
}

/// How soon a window h2 refused is offered again.
const APPLY_RETRY: Duration = Duration::from_millis(50);

impl Windows {
    fn new(chosen: watch::Receiver<u32>) -> Self {
        Self { chosen, retry: None }
    }

    /// The window to apply next: a newly chosen one, or the latest once a retry is due. Pending
    /// for good once the chooser is gone with nothing left to retry.
    pub(super) async fn due(&mut self) -> u32 {
        let retry = self.retry;
        let again = async {
            match retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Ok(()) = self.chosen.changed() => {}
            () = again => {}
        }
        *self.chosen.borrow_and_update()
    }

    /// Apply `window` with `set`, or schedule a retry when it is refused.
    pub(super) fn apply<E: std::fmt::Display>(&mut self, window: u32, set: impl FnOnce(u32) -> Result<(), E>) {
        self.retry = match set(window) {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(window, error = %e, "stream window not applied yet");
                Some(Instant::now() + APPLY_RETRY)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use h2::{client, server};

    #[test]
    fn a_session_window_grows_only_when_adaptive_windows_are_on() {
        let received = Arc::new(AtomicU64::new(0));
        let off = TunnelSettings { h2_adaptive_window: false, ..TunnelSettings::default() };
        let (mut t, _) = Tuning::new(&off, received.clone());
        assert!(!t.tuner.growing(), "off: the window is the configured one");
        assert_eq!(t.tuner.sample(Duration::from_millis(150), 1 << 20), None);

        let on = TunnelSettings::default();
        assert!(on.h2_adaptive_window, "on by default");
        let (mut t, _) = Tuning::new(&on, received);
        assert!(t.tuner.growing());
        // A window's worth per 150 ms round trip: the window is the limit and it doubles.
        assert_eq!(t.tuner.sample(Duration::from_millis(150), u64::from(on.stream_window)), Some(2 * on.stream_window));
    }

    const MIB: u32 = 1024 * 1024;

    #[tokio::test(start_paused = true)]
    async fn a_window_refused_while_settings_await_their_acknowledgement_is_applied_on_retry() {
        let (chosen, rx) = watch::channel(MIB / 2);
        let mut windows = Windows::new(rx);
        chosen.send(8 * MIB).unwrap();
        let w = windows.due().await;
        assert_eq!(w, 8 * MIB);
        windows.apply(w, |_| Ok::<_, &str>(()));
        // The growth to the cap comes before the peer acknowledged the last SETTINGS; none follows it.
        chosen.send(16 * MIB).unwrap();
        let w = windows.due().await;
        windows.apply(w, |_| Err("settings pending"));
        let again =
            tokio::time::timeout(Duration::from_secs(1), windows.due()).await.expect("the refused window comes again");
        assert_eq!(again, 16 * MIB);
        let mut applied = None;
        windows.apply(again, |w| {
            applied = Some(w);
            Ok::<_, &str>(())
        });
        assert_eq!(applied, Some(16 * MIB));
        assert!(tokio::time::timeout(Duration::from_secs(60), windows.due()).await.is_err(), "nothing left to apply");
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_chosen_while_a_retry_waits_replaces_the_refused_one() {
        let (chosen, rx) = watch::channel(MIB / 2);
        let mut windows = Windows::new(rx);
        chosen.send(4 * MIB).unwrap();
        let w = windows.due().await;
        windows.apply(w, |_| Err("settings pending"));
        chosen.send(8 * MIB).unwrap();
        let before = Instant::now();
        assert_eq!(windows.due().await, 8 * MIB);
        assert_eq!(before.elapsed(), Duration::ZERO, "at once, not at the retry");
        windows.apply(8 * MIB, |_| Ok::<_, &str>(()));
        assert!(
            tokio::time::timeout(Duration::from_secs(60), windows.due()).await.is_err(),
            "the refused one is not retried"
        );
    }

    /// Offer `window` to the agent's end, driving it between tries, until taken (true) or 10 s pass.
    async fn take(agent: &mut server::Connection<tokio::io::DuplexStream, Bytes>, window: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if agent.set_initial_window_size(window).is_ok() {
                return true;
            }
            let _ = tokio::time::timeout(Duration::from_millis(10), agent.accept()).await;
        }
        false
    }

    /// What [`Windows`] retries for: h2 refuses a second window until the peer acknowledged the first.
    #[tokio::test]
    async fn h2_refuses_new_settings_until_the_last_are_acknowledged() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let seed = tokio::spawn(async move {
            let (send, conn) = client::handshake(a).await.unwrap();
            let driven = tokio::spawn(conn);
            (send, driven)
        });
        let mut agent = server::handshake(b).await.unwrap();
        let (_send, driven) = seed.await.unwrap();
        // The handshake's own SETTINGS await their acknowledgement too: drive the agent's end
        // until a window is taken, then ask for another at once.
        assert!(take(&mut agent, MIB).await, "the seed never acknowledged the handshake's SETTINGS");
        assert!(agent.set_initial_window_size(2 * MIB).is_err(), "refused while the first is unacknowledged");
        assert!(take(&mut agent, 2 * MIB).await, "taken once the seed acknowledged the first");
        driven.abort();
    }
}
