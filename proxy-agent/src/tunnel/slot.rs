//! The async driver of one slot (it performs the machine's actions and feeds it what happens) and the loop that adds slots as a name's replicas grow.

use super::Tunnel;
use super::dial::{Dialer, Running};
use super::establish::EstablishError;
use super::machine::{Action, Event, Machine, QueryId, SessionId, Settings, Slot};
use super::metrics::SlotMetrics;
use crate::replicas::Replicas;
use seedgate_config::HostPort;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a slot is named in logs and metrics: the configured name, then `name#1`, `name#2`, ...
pub(crate) fn slot_label(name: &str, slot: usize) -> String {
    if slot == 0 { name.to_owned() } else { format!("{name}#{slot}") }
}

/// Keep as many slots for one configured name as its replicas announce (up to the maximum).
pub(super) async fn name_loop(
    t: Arc<Tunnel>,
    replicas: Arc<Replicas>,
    configured: HostPort,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let mut changed = replicas.subscribe();
    loop {
        for slot in replicas.grow() {
            let (t, replicas, configured) = (t.clone(), replicas.clone(), configured.clone());
            tokio::spawn(slot_loop(t, replicas, slot, configured, stop.clone(), tracker.clone()));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = changed.changed() => if r.is_err() { return },
        }
    }
}

/// Keep one session of a configured name up while the name's replicas want one more: the
/// machine decides, this loop performs its actions and feeds it events until the slot stops.
async fn slot_loop(
    t: Arc<Tunnel>,
    replicas: Arc<Replicas>,
    slot: usize,
    configured: HostPort,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let label = slot_label(&configured.to_string(), slot);
    let (moves, moves_rx) = mpsc::channel(4);
    let metrics = SlotMetrics::new(&t.metrics.session, &label, &replicas.name);
    let settings = Settings::from(&**t.cfg.load());
    let me = Slot { index: slot, label: label.clone(), configured, replicas: replicas.clone(), metrics };
    let mut machine = Machine::new(Instant::now(), me, settings, Box::new(rand::random::<f64>));
    let dialer = Arc::new(Dialer { t, label, moves, stop: stop.clone(), tracker });
    let mut io =
        Io { dialer, sessions: Vec::new(), in_flight: Vec::new(), moves_rx, wanted: replicas.subscribe(), stop };
    loop {
        machine.configure(Settings::from(&**io.dialer.t.cfg.load()));
        let event = io.next_event(machine.poll_timeout()).await;
        let stopping = matches!(event, Event::Stop);
        for action in machine.handle(Instant::now(), event) {
            io.perform(action);
        }
        let (phase, retry_at) = machine.phase();
        replicas.phase(slot, phase, retry_at);
        if stopping {
            // The sessions' stop tokens are the slot's children: they get GOAWAY, and their
            // streams run to their end under the tracker.
            return;
        }
    }
}

/// A dial or a resolution under way.
type InFlight = Pin<Box<dyn Future<Output = Done> + Send>>;

/// A dial or a resolution finished.
enum Done {
    Dialed(SessionId, Result<Running, EstablishError>),
    Resolved(QueryId, Option<Vec<SocketAddr>>),
}

/// What woke the driver.
enum Wake {
    Stop,
    Timer,
    Done(Done),
    /// From a session: up, announced, ended; or a move notice from any of them.
    Session(Event),
    Wanted,
}

/// The slot's I/O: its sessions, the dials and resolutions under way, its inputs.
struct Io {
    dialer: Arc<Dialer>,
    /// The sessions not retired: the live one and the one that may replace it.
    sessions: Vec<Running>,
    /// The dials and resolutions under way.
    in_flight: Vec<InFlight>,
    moves_rx: mpsc::Receiver<Event>,
    wanted: watch::Receiver<u64>,
    stop: CancellationToken,
}

impl Io {
    async fn next_event(&mut self, deadline: Option<Instant>) -> Event {
        match self.wake(deadline).await {
            Wake::Stop => Event::Stop,
            Wake::Timer => Event::Timer,
            Wake::Wanted => Event::Wanted,
            Wake::Session(event) => {
                if let Event::Ended { id, .. } = &event {
                    self.sessions.retain(|s| s.id != *id);
                }
                event
            }
            Wake::Done(Done::Dialed(id, Ok(session))) => {
                let peer = session.peer;
                self.sessions.push(session);
                Event::Dialed { id, result: Ok(peer) }
            }
            Wake::Done(Done::Dialed(id, Err(e))) => Event::Dialed { id, result: Err(e) },
            Wake::Done(Done::Resolved(query, addrs)) => Event::Resolved { query, addrs },
        }
    }

    async fn wake(&mut self, deadline: Option<Instant>) -> Wake {
        let timer = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let mut reports: Vec<_> = self.sessions.iter_mut().map(|s| Box::pin(s.next())).collect();
        tokio::select! {
            _ = self.stop.cancelled() => Wake::Stop,
            _ = timer => Wake::Timer,
            done = first(&mut self.in_flight) => Wake::Done(done),
            event = first(&mut reports) => Wake::Session(event),
            Some(event) = self.moves_rx.recv() => Wake::Session(event),
            // The sender lives in the replica set, which this slot holds: it never closes.
            r = self.wanted.changed() => if r.is_ok() { Wake::Wanted } else { Wake::Stop },
        }
    }

    fn perform(&mut self, action: Action) {
        match action {
            Action::Dial { id, target, over, patience } => {
                let dialer = self.dialer.clone();
                self.in_flight
                    .push(Box::pin(async move { Done::Dialed(id, dialer.connect(id, target, over, patience).await) }));
            }
            Action::Resolve { query, name } => {
                let timeout = self.dialer.t.cfg.load().dial_timeout.get();
                self.in_flight.push(Box::pin(async move {
                    let addrs = tokio::time::timeout(timeout, proxy_core::net::resolve(&name)).await;
                    Done::Resolved(query, addrs.ok().and_then(Result::ok))
                }));
            }
            Action::Retire { id, drain, open, why } => {
                if let Some(i) = self.sessions.iter().position(|s| s.id == id) {
                    retire(&self.dialer.label, self.sessions.swap_remove(i), drain, open, why);
                }
            }
        }
    }
}

/// The first of `futures` to finish (it is removed); pending while there are none.
async fn first<F: Future + Unpin>(futures: &mut Vec<F>) -> F::Output {
    std::future::poll_fn(|cx| {
        for i in 0..futures.len() {
            if let Poll::Ready(out) = Pin::new(&mut futures[i]).poll(cx) {
                futures.swap_remove(i);
                return Poll::Ready(out);
            }
        }
        Poll::Pending
    })
    .await
}

/// End a replaced session make-before-break: GOAWAY now (the seed can open no new stream on
/// it; with `open`, only when `drain` is over), let its streams finish for `drain` (or until
/// the server ends them, with `None`), then end what is left and close it.
fn retire(label: &str, old: Running, drain: Option<Duration>, open: bool, why: &'static str) {
    let label = label.to_owned();
    let id = old.server_id();
    tracing::info!(server = %label, target = %old.target, peer = %old.peer, %id, drain = ?drain, open, "{why}");
    if !open {
        old.stop.cancel();
    }
    tokio::spawn(async move {
        let mut done = old.done;
        let finished = match drain {
            Some(d) => tokio::time::timeout(d, &mut done).await.is_ok(),
            None => {
                let _ = (&mut done).await;
                true
            }
        };
        if !finished {
            old.stop.cancel();
            old.kill.cancel();
            if tokio::time::timeout(Duration::from_secs(5), &mut done).await.is_err() {
                // Bounded: the session is dropped (its TLS connection closed) regardless.
                done.abort();
            }
        }
        tracing::info!(server = %label, target = %old.target, %id, "retired tunnel session closed");
    });
}
