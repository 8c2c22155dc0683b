//! The async driver of one slot (it performs the machine's notes and actions, and feeds it what happens) and the loop that adds slots as a name's replicas grow.

use super::establish::EstablishError;
use super::machine::Machine;
use super::machine::events::{Action, Event, Failure, QueryId, SessionId, Settings, Slot};
use super::machine::notes::{Log, Note};
use super::metrics::SlotMetrics;
use super::session::{Launcher, Running};
use super::{Name, Tunnel};
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

/// A configured name's loop, as the tunnel starts it when the name is configured and forgets it
/// when the name goes (the tunnel decides when; the loops and their series are this file's).
impl Tunnel {
    /// Start the loop that keeps a session to each replica behind `server`.
    pub(super) fn add_name(self: &Arc<Self>, server: HostPort, stop: &CancellationToken, tracker: &TaskTracker) {
        let name = server.to_string();
        let m = &self.metrics.session;
        let replicas = Arc::new(Replicas::new(
            name.clone(),
            m.server_sessions.with_label_values(&[&name]),
            m.server_sessions_expected.with_label_values(&[&name]),
        ));
        let stop = stop.child_token();
        self.names.lock().push(Name { configured: server.clone(), replicas: replicas.clone(), stop: stop.clone() });
        tokio::spawn(name_loop(self.clone(), replicas, server, stop, tracker.clone()));
    }

    /// A removed name's gauges go (its counters stay: they are history).
    pub(super) fn forget_metrics(&self, n: &Name) {
        let m = &self.metrics.session;
        let name = n.configured.to_string();
        let _ = m.server_sessions.remove_label_values(&[&name]);
        let _ = m.server_sessions_expected.remove_label_values(&[&name]);
        for slot in 0..n.replicas.slots() {
            let label = slot_label(&name, slot);
            let _ = m.sessions.remove_label_values(&[&label]);
            for transport in ["h2", "quic"] {
                let _ = m.transport.remove_label_values(&[&label, transport]);
            }
        }
    }
}

/// How a slot is named in logs and metrics: the configured name, then `name#1`, `name#2`, ...
pub(crate) fn slot_label(name: &str, slot: usize) -> String {
    if slot == 0 { name.to_owned() } else { format!("{name}#{slot}") }
}

/// Keep as many slots for one configured name as its replicas announce (up to the maximum).
async fn name_loop(
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
    let me = Slot { index: slot, configured, replicas: replicas.clone() };
    let mut machine = Machine::new(Instant::now(), me, settings, Box::new(rand::random::<f64>));
    let launcher = Arc::new(Launcher { t, label, moves, stop: stop.clone(), tracker });
    let mut io =
        Io { launcher, sessions: Vec::new(), in_flight: Vec::new(), moves_rx, wanted: replicas.subscribe(), stop };
    loop {
        machine.configure(Settings::from(&**io.launcher.t.cfg.load()));
        let event = io.next_event(machine.poll_timeout()).await;
        let stopping = matches!(event, Event::Stop);
        let step = machine.handle(Instant::now(), event);
        for note in step.notes {
            match note {
                Note::Metric(m) => metrics.record(m),
                Note::Log(l) => log(&io.launcher.label, l),
            }
        }
        for action in step.actions {
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

/// The machine's account of a failed establishment: nothing answered (the slot probes), or it
/// failed otherwise (the slot backs off).
fn failure(e: &EstablishError) -> Failure {
    if e.silent() { Failure::Unanswered(e.to_string()) } else { Failure::Failed(e.to_string()) }
}

/// The targets the machine's log lines had when it wrote them itself, kept so that the lines and
/// the filters that name them (`RUST_LOG=proxy_agent::tunnel::machine=debug`) stay as they were.
const MACHINE: &str = "proxy_agent::tunnel::machine";
const ERRANDS: &str = "proxy_agent::tunnel::machine::errands";

/// Write one of the machine's log notes, as the slot `server`.
fn log(server: &str, note: Log) {
    match note {
        Log::Up { target, peer, over } => {
            tracing::info!(target: MACHINE, %server, %target, %peer, transport = over.as_str(), "tunnel session up")
        }
        Log::FallBack { target, error } => {
            tracing::info!(target: MACHINE, %server, %target, %error, "transport auto: QUIC did not get through; using h2")
        }
        Log::Failed { target, error } => {
            tracing::warn!(target: MACHINE, %server, %target, %error, "tunnel session failed")
        }
        Log::StillNoAnswer { target, error, tries } => {
            tracing::debug!(target: MACHINE, %server, %target, %error, tries, "tunnel session failed: still no answer")
        }
        Log::Suspect { target, peer } => {
            tracing::warn!(target: MACHINE, %server, %target, %peer, "tunnel session suspect: its keepalive went unanswered (the path is quiet); dialing a replacement beside it, its open streams wait for the path")
        }
        Log::AnswersAgain { target, peer } => {
            tracing::info!(target: MACHINE, %server, %target, %peer, "suspect tunnel session answers again")
        }
        Log::Duplicate { id } => {
            tracing::info!(target: MACHINE, %server, %id, "session reached a replica another session holds; closing it and dialing again")
        }
        Log::Announced { id, count, draining } => {
            tracing::info!(target: MACHINE, %server, %id, count, draining, "server replica announced")
        }
        Log::Draining { target } => {
            tracing::info!(target: MACHINE, %server, %target, "replica is draining: keeping its live streams, looking for a replacement")
        }
        Log::Closed => tracing::info!(target: MACHINE, %server, "tunnel session closed"),
        // TLS passed on our side but the seed never spoke the transport's protocol: typically it
        // refused our certificate (its verdict comes after our handshake).
        Log::FailedBeforeUp { error } => {
            tracing::warn!(target: MACHINE, %server, %error, "tunnel session failed before it was up (is this agent's certificate accepted by the server?)")
        }
        Log::Ended { error } => tracing::warn!(target: MACHINE, %server, %error, "tunnel session ended"),
        Log::Unproven { lived } => {
            tracing::info!(target: MACHINE, %server, ?lived, "tunnel session ended before it proved itself (lived tunnel.reconnect.max or carried a stream): backing off")
        }
        Log::AlreadyThere { to } => {
            tracing::info!(target: ERRANDS, %server, %to, "move notice: already connected there")
        }
        Log::Rehoming { from, to } => tracing::info!(target: ERRANDS, %server, %from, %to, "move notice: re-homing"),
        Log::NameMoved { name, old, new } => {
            tracing::info!(target: ERRANDS, %server, %name, %old, ?new, "server name resolves elsewhere: re-homing")
        }
        Log::Rejected { id } => {
            tracing::debug!(target: ERRANDS, %server, ?id, "candidate session reached a replica already held or draining, or did not come up")
        }
        Log::RehomeFailed { target, error } => {
            tracing::warn!(target: ERRANDS, %server, %target, %error, "cannot reach the new server; staying on the current session")
        }
        Log::NoReplacement { error } => {
            tracing::debug!(target: ERRANDS, %server, %error, "no replacement session yet; trying again later")
        }
        Log::StillOnH2 { target, error } => {
            tracing::debug!(target: ERRANDS, %server, %target, %error, "transport auto: QUIC still does not get through; staying on h2")
        }
        Log::NoRescue { target, error } => {
            tracing::debug!(target: ERRANDS, %server, %target, %error, "no replacement for the suspect session yet; trying again")
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
    launcher: Arc<Launcher>,
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
            Wake::Done(Done::Dialed(id, Err(e))) => Event::Dialed { id, result: Err(failure(&e)) },
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
                let launcher = self.launcher.clone();
                self.in_flight
                    .push(Box::pin(async move { Done::Dialed(id, launcher.launch(id, target, over, patience).await) }));
            }
            Action::Resolve { query, name } => {
                let timeout = self.launcher.t.cfg.load().dial_timeout.get();
                self.in_flight.push(Box::pin(async move {
                    let addrs = tokio::time::timeout(timeout, proxy_core::net::resolve(&name)).await;
                    Done::Resolved(query, addrs.ok().and_then(Result::ok))
                }));
            }
            Action::Retire { id, drain, open, why } => {
                if let Some(i) = self.sessions.iter().position(|s| s.id == id) {
                    retire(&self.launcher.label, self.sessions.swap_remove(i), drain, open, why);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine probes a server that answers nothing and backs off from one that refuses:
    /// which is which comes from how the establishment failed, its message kept.
    #[test]
    fn an_establishment_nothing_answered_is_unanswered_and_a_refusal_failed() {
        let target: HostPort = "192.0.2.1:8132".parse().expect("host:port");
        let connect = |kind| EstablishError::Connect { target: target.clone(), source: std::io::Error::from(kind) };
        let addr = SocketAddr::from(([192, 0, 2, 1], 8132));
        for silent in [connect(std::io::ErrorKind::TimedOut), EstablishError::QuicTimeout { addr }] {
            assert_eq!(failure(&silent), Failure::Unanswered(silent.to_string()));
        }
        for answered in [connect(std::io::ErrorKind::ConnectionRefused), EstablishError::TlsTimeout { addr }] {
            assert_eq!(failure(&answered), Failure::Failed(answered.to_string()));
        }
    }
}
