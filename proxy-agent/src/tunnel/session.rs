//! One running tunnel session, from its establishment ([`super::establish`]) to its end, in its own task, with the handler that reports what it sees (its streams, control messages, the hello it sends) to its slot.

use super::Tunnel;
use super::establish::{EstablishError, establish, establish_quic, hinted, settings};
use super::machine::events::{Carrier, Event, Failure, SessionId};
use super::stream::serve_stream;
use proxy_core::tunnel::session::{AgentSession, SessionError, run_agent_session};
use proxy_core::tunnel::{AgentHandler, AgentHello, BoxFuture, ControlMsg, Incoming, Secret, ServerInfo};
use seedgate_config::HostPort;
use seedgate_config::agent::{Transport, Tunnel as TunnelCfg};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The node this agent runs on, one name for both of its uses: which earlier session a new one
/// supersedes (a new run of the same node), and — when it comes from `identifiers.host` or
/// `$NODE_NAME` — the name `dest_host` dials find the node by. `tunnel.node_name`, else
/// `tunnel.identifiers.host`, else `$NODE_NAME`, else the host name (which agents in network
/// namespaces of one host share: they name their nodes by `identifiers.host`).
pub(crate) fn node_name(cfg: &TunnelCfg, env: impl Fn(&str) -> Option<String>) -> String {
    cfg.node_name
        .clone()
        .or_else(|| cfg.identifiers.host.clone())
        .or_else(|| env("NODE_NAME"))
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_owned()))
        .unwrap_or_default()
}

/// The hello: the node name, the version and the identifiers, from the config in force or,
/// where it leaves them out, from `env` (the downward API's variables).
fn hello(cfg: &TunnelCfg, env: impl Fn(&str) -> Option<String>) -> AgentHello {
    let ids = &cfg.identifiers;
    let host = ids.host.clone().or_else(|| env("NODE_NAME")).unwrap_or_default();
    let addresses: Vec<String> = match &ids.addresses {
        Some(a) => a.iter().map(ToString::to_string).collect(),
        None => {
            // `status.hostIPs` renders as a comma-separated list; `status.hostIP` is its first.
            let list = env("HOST_IPS").filter(|v| !v.trim().is_empty()).or_else(|| env("HOST_IP")).unwrap_or_default();
            let parsed =
                list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(|a| a.parse::<std::net::IpAddr>());
            parsed
                .filter_map(|a| {
                    a.inspect_err(|e| tracing::warn!(error = %e, %list, "HOST_IPS/HOST_IP: not an address; ignored"))
                        .ok()
                })
                .map(|a| a.to_string())
                .collect()
        }
    };
    AgentHello {
        node: node_name(cfg, &env),
        version: env!("CARGO_PKG_VERSION").into(),
        host,
        addresses,
        default_route: ids.default_route,
        cluster: cfg.cluster.clone().unwrap_or_default(),
        ..AgentHello::default()
    }
}

/// Starts the sessions of one slot; what they share.
pub(super) struct Launcher {
    pub t: Arc<Tunnel>,
    pub label: String,
    /// Where every session's handler sends the move notices it gets.
    pub moves: mpsc::Sender<Event>,
    /// The slot's stop: GOAWAY on its sessions.
    pub stop: CancellationToken,
    pub tracker: TaskTracker,
}

impl Launcher {
    /// Establish a session to `target` over `over` (each step within `patience`, if given) and
    /// run it, in its own task.
    pub(super) async fn launch(
        &self,
        id: SessionId,
        target: HostPort,
        over: Carrier,
        patience: Option<std::time::Duration>,
    ) -> Result<Running, EstablishError> {
        let cfg = self.t.cfg.load_full();
        let within = |d: std::time::Duration| patience.map_or(d, |p| p.min(d));
        let (conn, peer) = match over {
            Carrier::H2 => establish(&self.t, &target, within(cfg.dial_timeout.get())).await?,
            Carrier::Quic => {
                // Under `auto`, QUIC is tried first or probed from h2: it gets the (short) QUIC timeout.
                let timeout =
                    if cfg.transport == Transport::Auto { cfg.quic_timeout.get() } else { cfg.dial_timeout.get() };
                establish_quic(&self.t, &target, within(timeout)).await?
            }
        };
        let stop = self.stop.child_token();
        let kill = self.t.kill.child_token();
        let (state_tx, state) = watch::channel(SessionState::default());
        let handler: Arc<dyn AgentHandler> = Arc::new(Handler {
            t: self.t.clone(),
            server: self.label.clone(),
            moves: self.moves.clone(),
            kill: kill.clone(),
            state: state_tx,
        });
        let settings = settings(&cfg);
        let (st, tracker) = (stop.clone(), self.tracker.clone());
        let done = tokio::spawn(async move {
            let session = AgentSession { settings: &settings, handler, stop: st, tracker };
            // With TLS 1.3 the server checks our certificate after our side of the handshake is
            // done: its refusal arrives as an alert on the session's first read.
            run_agent_session(conn, session).await
        });
        tracing::debug!(server = %self.label, target = %target, %peer, transport = over.as_str(), "TLS up; waiting for the seed's first stream");
        Ok(Running { id, target, peer, stop, kill, done, state, seen: SessionState::default(), handler_gone: false })
    }
}

/// What a session's handler has seen: the handshake passed, the replica's announcement, whether
/// its keepalive is unanswered now, and whether it carried a stream.
#[derive(Debug, Clone, Default, PartialEq)]
struct SessionState {
    up: bool,
    info: Option<ServerInfo>,
    quiet: bool,
    carried: bool,
}

/// A session being served in its own task.
pub(super) struct Running {
    pub id: SessionId,
    pub target: HostPort,
    pub peer: SocketAddr,
    /// Cancel to send GOAWAY: the seed opens no new stream; streams in flight continue.
    pub stop: CancellationToken,
    /// Cancel to end the session's streams now.
    pub kill: CancellationToken,
    pub done: tokio::task::JoinHandle<Result<(), SessionError>>,
    /// What the handler reports.
    state: watch::Receiver<SessionState>,
    /// The part of `state` already reported to the slot.
    seen: SessionState,
    /// The handler (the sender of `state`) is dropped: nothing more will change.
    handler_gone: bool,
}

impl Running {
    /// What the session reports next: it is up, its replica announced itself, or it ended
    /// (after which it must not be asked again).
    pub(super) async fn next(&mut self) -> Event {
        loop {
            let now = self.state.borrow_and_update().clone();
            if now.up && !self.seen.up {
                self.seen.up = true;
                return Event::Up(self.id);
            }
            if now.carried && !self.seen.carried {
                self.seen.carried = true;
                return Event::Carried(self.id);
            }
            if now.quiet != self.seen.quiet {
                self.seen.quiet = now.quiet;
                return Event::Quiet { id: self.id, silent: now.quiet };
            }
            if let Some(info) = now.info.filter(|i| self.seen.info.as_ref() != Some(i)) {
                self.seen.info = Some(info.clone());
                return Event::Announced(self.id, info);
            }
            tokio::select! {
                biased;
                r = self.state.changed(), if !self.handler_gone => self.handler_gone = r.is_err(),
                r = &mut self.done => {
                    let error = match r {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(Failure::Ended(hinted(&e))),
                        Err(e) => Some(Failure::Ended(format!("the session's task failed: {e}"))),
                    };
                    return Event::Ended { id: self.id, error };
                }
            }
        }
    }

    /// The id its replica announced (empty if none did).
    pub(super) fn server_id(&self) -> String {
        self.seen.info.as_ref().map(|i| i.id.clone()).unwrap_or_default()
    }
}

struct Handler {
    t: Arc<Tunnel>,
    server: String,
    moves: mpsc::Sender<Event>,
    /// Ends this session's streams (re-homing drain deadline, or the shutdown grace).
    kill: CancellationToken,
    /// What the slot acts on: the session is up, the replica announced itself.
    state: watch::Sender<SessionState>,
}

impl AgentHandler for Handler {
    fn incoming(&self, inc: Incoming) -> BoxFuture<'static, ()> {
        self.state.send_if_modified(|s| !std::mem::replace(&mut s.carried, true));
        Box::pin(serve_stream(self.t.clone(), self.server.clone(), self.kill.clone(), inc))
    }

    fn control(&self, msg: ControlMsg) {
        match msg {
            ControlMsg::Refused { reason } => {
                tracing::error!(server = %self.server, %reason, "proxy-server refused this agent's session");
            }
            ControlMsg::Server(info) => self.state.send_modify(|s| s.info = Some(info)),
            ControlMsg::Move { to, drain_deadline_ms } => {
                tracing::info!(server = %self.server, ?to, drain_deadline_ms, "control message: move");
                if self.moves.try_send(Event::Move { to, drain_deadline_ms }).is_err() {
                    tracing::warn!(server = %self.server, "control message dropped: a move is already being handled");
                }
            }
        }
    }

    fn hello(&self) -> AgentHello {
        // From the config in force: a reload of `node_name` or the identifiers shows in the next
        // session's hello. The instance is this process's; the token is read for this session
        // (and becomes the one live sessions hold, so no renewal sends an older one after it).
        let cfg = self.t.cfg.load();
        let token = self.t.current_token(true);
        AgentHello { instance: self.t.instance.clone(), token, ..hello(&cfg, |k| std::env::var(k).ok()) }
    }

    fn token_renewals(&self) -> Option<tokio::sync::watch::Receiver<Secret>> {
        self.t.token_renewals()
    }

    fn established(&self) {
        self.state.send_modify(|s| s.up = true);
    }

    fn quiet(&self, silent: bool) {
        self.state.send_if_modified(|s| std::mem::replace(&mut s.quiet, silent) != silent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(identifiers: &str) -> TunnelCfg {
        cfg_named("  node_name: n1\n", identifiers)
    }

    fn cfg_named(node_name: &str, identifiers: &str) -> TunnelCfg {
        let y = format!(
            "tunnel:\n  servers: [a:1]\n  tls: {{ cert: c, key: k, ca: ca }}\n  allow: [10.0.0.0/8]\n{node_name}{identifiers}"
        );
        let c = seedgate_config::agent::parse(&y, "a.yaml").expect("valid");
        c.tunnel.expect("tunnel").value
    }

    /// One node name for supersession and `dest_host`: without `node_name`, the node is named
    /// by `identifiers.host`, else `$NODE_NAME` (agents in network namespaces of one host share
    /// its host name, not their nodes).
    #[test]
    fn the_node_is_named_by_node_name_else_identifiers_host_else_node_name_env() {
        let env = |k: &str| (k == "NODE_NAME").then(|| "node-env".to_owned());
        let by_host = cfg_named("", "  identifiers: { host: node-2 }\n");
        assert_eq!(node_name(&by_host, env), "node-2");
        let h = hello(&by_host, env);
        assert_eq!((h.node.as_str(), h.host.as_str()), ("node-2", "node-2"));
        assert_eq!(node_name(&cfg_named("", ""), env), "node-env");
        let both = cfg_named("  node_name: vm\n", "  identifiers: { host: node-2 }\n");
        let h = hello(&both, env);
        assert_eq!((h.node.as_str(), h.host.as_str()), ("vm", "node-2"), "node_name set: it names the node");
    }

    #[test]
    fn identifiers_come_from_the_config_else_the_downward_api() {
        let env = |k: &str| match k {
            "NODE_NAME" => Some("node-env".to_owned()),
            "HOST_IPS" => Some("10.250.0.7, fd00::7".to_owned()),
            "HOST_IP" => Some("10.250.0.9".to_owned()),
            _ => None,
        };
        let h = hello(&cfg(""), env);
        assert_eq!((h.node.as_str(), h.host.as_str()), ("n1", "node-env"));
        assert_eq!(h.addresses, ["10.250.0.7", "fd00::7"]);
        assert!(!h.default_route);
        let only_ip = |k: &str| (k == "HOST_IP").then(|| "10.250.0.9".to_owned());
        let h = hello(&cfg(""), only_ip);
        assert_eq!((h.host.as_str(), h.addresses.as_slice()), ("", &["10.250.0.9".to_owned()][..]));
        let h = hello(&cfg("  identifiers: { host: node-cfg, addresses: ['10.1.0.1'], default_route: true }\n"), env);
        assert_eq!(
            (h.host.as_str(), h.addresses.as_slice(), h.default_route),
            ("node-cfg", &["10.1.0.1".to_owned()][..], true)
        );
        let garbage = |k: &str| (k == "HOST_IPS").then(|| "10.0.0.1,not-an-ip".to_owned());
        assert_eq!(hello(&cfg(""), garbage).addresses, ["10.0.0.1"]);
        let none = hello(&cfg("  identifiers: { addresses: [] }\n"), env);
        assert!(none.addresses.is_empty(), "an explicit empty list is no addresses, not the environment's");
    }
}
