//! One connected agent session: its identity, its stream opener, its hello, and its standing for new dials — whether a dial trusts it: one superseded by its restarted agent, or one gone silent, is tried last until it shows life again — as methods that mark, count and log it.
//!
//! Its standing is the session's own: the dial path asks [`Session::standing`] and
//! [`Session::suspect`], an attempt that went unanswered marks it [`Session::doubt_silent`], a new
//! run of its agent marks it [`Session::superseded_by`], and readiness shows it; the marks
//! themselves are [`Liveness`].
//!
//! A session can die without a word: a QUIC agent killed by SIGKILL (UDP brings no reset), a
//! node that loses power (no TCP RST either). Its keepalive ends it only after
//! `agents.keepalive.timeout`; until then two things keep dials off it. An agent says in its
//! hello which run of it this is (its instance): a later session of the same cluster and node
//! with another instance supersedes the earlier ones at once. And a stream open that a session
//! does not answer within `agents.open_timeout`, with no other sign of life either (HTTP/2: no
//! PING answer; QUIC: no acknowledgement), is retried on another session of the cluster within
//! the dial deadline, the silent session marked suspect. Neither doubt closes anything (a
//! stream still flowing keeps flowing); either ends when the session shows life again: then it
//! was only slow, or — superseded — another live agent claims the same node name.
//!
//! Before any dial notices, the session's own keepalive does: a PING (QUIC: anything that asks
//! for an acknowledgement) unanswered for `agents.keepalive.suspect_after` makes it suspect
//! (counted and logged as it turns so). A suspect session takes no new dial at all — a dial
//! goes to another session of the cluster, or is refused with `no_agent` and the reason — while
//! its open streams wait for the path until `agents.keepalive.timeout`; its next sign of life
//! clears it.

use super::tally::Tally;
use crate::metrics::ServerMetrics;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::{AgentHello, Opener, Quiet};
use seedgate_config::server::ClusterMode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One connected agent.
pub(crate) struct Session {
    pub id: u64,
    pub cluster: String,
    pub peer: String,
    pub opener: Arc<dyn Opener>,
    /// What its agent said about itself, once its hello came.
    pub hello: Arc<OnceLock<AgentHello>>,
    /// Cancel to end the session (GOAWAY and close).
    pub stop: CancellationToken,
    /// Whether dials trust it (superseded, suspect).
    pub liveness: Liveness,
    /// Who the agent proved to be.
    pub identity: Identity,
    /// `h2` or `quic`.
    pub transport: &'static str,
    /// When it was filed.
    pub since: Instant,
    /// What the status page shows of it besides: its streams' bytes, its last failed dial.
    pub tally: Arc<Tally>,
}

/// What an agent's session is filed with ([`SessionDirectory::add`](super::SessionDirectory::add)).
pub(crate) struct Filed {
    pub peer: String,
    /// `h2` or `quic`.
    pub transport: &'static str,
    pub opener: Arc<dyn Opener>,
    pub hello: Arc<OnceLock<AgentHello>>,
    pub stop: CancellationToken,
    pub identity: Identity,
}

/// What an agent proved about itself when its session was admitted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// The client certificate it was verified with, if it presented one (a revocation list
    /// loaded later is checked against it).
    pub cert: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The ServiceAccount a token review named, if it came with a token.
    pub account: Option<String>,
}

impl Session {
    /// Session `id` of `cluster`, filed now.
    pub(crate) fn new(id: u64, cluster: &str, f: Filed) -> Self {
        let Filed { peer, transport, opener, hello, stop, identity } = f;
        let (cluster, since, tally) = (cluster.to_owned(), Instant::now(), Arc::default());
        Self {
            id,
            cluster,
            peer,
            opener,
            hello,
            stop,
            liveness: Liveness::default(),
            identity,
            transport,
            since,
            tally,
        }
    }

    /// The node its agent named (empty before its hello, or when it named none).
    pub(crate) fn node(&self) -> String {
        self.hello.get().map(|h| h.node.clone()).unwrap_or_default()
    }

    /// How it stands for new dials now (a doubt it outlived is cleared and noted).
    pub(crate) fn standing(&self, metrics: &ServerMetrics) -> Standing {
        let (standing, cleared) = self.liveness.standing(|| self.opener.heard());
        self.revived(cleared, metrics);
        standing
    }

    /// How it stands, as a look that changes nothing (the admin pages): a doubt it outlived reads
    /// healthy, and is cleared and counted by the next dial that asks [`Session::standing`].
    pub(crate) fn looked_at(&self) -> Standing {
        self.liveness.looked_at(|| self.opener.heard())
    }

    /// How it stands as the status page names it, in its cluster's `mode`: `fenced`,
    /// `draining` (its agent or its cluster is going away), `suspect` (its keepalive unanswered:
    /// no new dials), `doubted` (dials try it last; second, why: `silent` or `superseded`), or
    /// `active`.
    pub(crate) fn shown(&self, mode: ClusterMode) -> (&'static str, Option<&'static str>) {
        match mode {
            ClusterMode::Fenced => return ("fenced", None),
            ClusterMode::Draining => return ("draining", None),
            ClusterMode::Active => {}
        }
        if self.opener.is_closed() {
            return ("draining", None);
        }
        if self.suspect() {
            return ("suspect", None);
        }
        match self.looked_at() {
            Standing::Healthy => ("active", None),
            Standing::Suspect => ("doubted", Some("silent")),
            Standing::Superseded => ("doubted", Some("superseded")),
        }
    }

    /// Its keepalive went unanswered for the suspect time: it takes no new dials.
    pub(crate) fn suspect(&self) -> bool {
        self.opener.quiet().is_some_and(Quiet::is_silent)
    }

    /// It left an open unanswered, with no sign the agent got it, for `open_timeout` (`heard`:
    /// its signs of life when the open was sent): it is tried last until it shows life (counted
    /// and logged once per doubt).
    pub(crate) fn doubt_silent(&self, heard: Option<u64>, open_timeout: Duration, metrics: &ServerMetrics) {
        if self.liveness.doubt(Standing::Suspect, heard) {
            metrics.sessions_doubted.with_label_values(&[&self.cluster, "silent"]).inc();
            tracing::warn!(cluster = %self.cluster, session = self.id, peer = %self.peer, node = %self.node(), ?open_timeout, "agent session silent: no answer to a stream open and no sign that the agent got it; tried last until it shows life");
        }
    }

    /// `new`'s agent said who it is (`hello`): this session, if of an earlier run of the same
    /// agent (registered before it, same node, another instance), is superseded. It is gone in
    /// all likelihood (a restart, a node that lost power) but not known to be until its
    /// keepalive times out: until then dials try it last, and nothing on it is cut.
    pub(crate) fn superseded_by(&self, new: &Session, hello: &AgentHello, metrics: &ServerMetrics) {
        if self.id >= new.id || !self.hello.get().is_some_and(|was| supersedes(hello, was)) {
            return;
        }
        if self.liveness.doubt(Standing::Superseded, self.opener.heard()) {
            metrics.sessions_doubted.with_label_values(&[&new.cluster, "superseded"]).inc();
            tracing::info!(
                cluster = %new.cluster, node = %hello.node, old = self.id, new = new.id, old_peer = %self.peer, peer = %new.peer,
                "agent restarted (a new run of its node connected): its earlier session is superseded, tried last until it ends"
            );
        }
    }

    /// Note a doubt that [`Liveness::standing`] cleared, if any: counted, and logged — a
    /// superseded session that shows life is another live agent with the same node name.
    fn revived(&self, cleared: Option<Standing>, metrics: &ServerMetrics) {
        let Some(was) = cleared else { return };
        let reason = if was == Standing::Superseded { "superseded" } else { "silent" };
        metrics.sessions_revived.with_label_values(&[&self.cluster, reason]).inc();
        let node = self.node();
        match was {
            Standing::Superseded => tracing::warn!(
                cluster = %self.cluster, session = self.id, peer = %self.peer, %node,
                "a session superseded by a new run of its node is alive: two agents claim node {node:?} (give each its own tunnel.identifiers.host or tunnel.node_name); both take dials"
            ),
            _ => {
                tracing::info!(cluster = %self.cluster, session = self.id, peer = %self.peer, %node, "suspect agent session showed life again")
            }
        }
    }

    /// Count and log its keepalive turning suspect and back, until the session is gone. Holds it
    /// weakly: the watch ends when the session (and its transport) is dropped.
    pub(crate) fn watch_suspect(self: &Arc<Self>, metrics: ServerMetrics) {
        let Some(mut quiet) = self.opener.quiet().map(Quiet::watch) else { return };
        let (weak, cluster, id, peer) = (Arc::downgrade(self), self.cluster.clone(), self.id, self.peer.clone());
        let gauge = metrics.sessions_suspect.with_label_values(&[&cluster]);
        tokio::spawn(async move {
            let mut since: Option<tokio::time::Instant> = None;
            while quiet.changed().await.is_ok() {
                let silent = *quiet.borrow_and_update();
                let Some(s) = weak.upgrade() else { break };
                match (silent, since) {
                    (true, None) => {
                        since = Some(tokio::time::Instant::now());
                        gauge.inc();
                        metrics.sessions_suspect_total.with_label_values(&[&cluster]).inc();
                        let streams = s.opener.active_streams();
                        tracing::warn!(%cluster, session = id, %peer, node = %s.node(), streams, "agent session suspect: its keepalive went unanswered (the path is quiet); no new dials go to it, its open streams wait for the path");
                    }
                    (false, Some(at)) => {
                        since = None;
                        gauge.dec();
                        let streams = s.opener.active_streams();
                        metrics.streams_survived.with_label_values(&[&cluster]).inc_by(streams as u64);
                        tracing::info!(%cluster, session = id, %peer, quiet = ?at.elapsed(), streams, "suspect agent session answers again: it takes dials, its open streams rode out the outage");
                    }
                    _ => {}
                }
            }
            if since.is_some() {
                gauge.dec();
            }
        });
    }
}

/// How a session stands for new dials, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    Healthy,
    /// It did not answer a stream open in time and gave no other sign of life.
    Suspect,
    /// A new run of its agent connected.
    Superseded,
}

impl Standing {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Standing::Healthy => "healthy",
            Standing::Suspect => "suspect",
            Standing::Superseded => "superseded",
        }
    }
}

/// A session's doubt, with the signs of life it had given when doubted: any later sign clears
/// it.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    mark: Mutex<Option<(Standing, u64)>>,
    /// `mark` is set: a dial reads this alone for the (usual) healthy session.
    doubted: AtomicBool,
}

impl Liveness {
    /// The standing now, given the session's signs of life so far (`heard`; `None`: its
    /// transport cannot tell). A doubt the session has outlived is cleared and returned second.
    pub(crate) fn standing(&self, heard: impl FnOnce() -> Option<u64>) -> (Standing, Option<Standing>) {
        if !self.doubted.load(Ordering::Acquire) {
            return (Standing::Healthy, None);
        }
        let mut mark = self.mark.lock();
        let Some((standing, at)) = *mark else { return (Standing::Healthy, None) };
        if heard().is_some_and(|now| now != at) {
            *mark = None;
            self.doubted.store(false, Ordering::Release);
            return (Standing::Healthy, Some(standing));
        }
        (standing, None)
    }

    /// The standing [`Liveness::standing`] would return, without clearing anything.
    pub(crate) fn looked_at(&self, heard: impl FnOnce() -> Option<u64>) -> Standing {
        if !self.doubted.load(Ordering::Acquire) {
            return Standing::Healthy;
        }
        match *self.mark.lock() {
            Some((standing, at)) if heard().is_none_or(|now| now == at) => standing,
            _ => Standing::Healthy,
        }
    }

    /// Doubt the session as `why` (suspect or superseded) with `heard` its signs of life so
    /// far; superseded stays superseded. False when it was doubted so already, or cannot be
    /// (a transport that cannot tell would never be cleared).
    pub(crate) fn doubt(&self, why: Standing, heard: Option<u64>) -> bool {
        let Some(heard) = heard else { return false };
        let mut mark = self.mark.lock();
        match *mark {
            Some((now, _)) if now >= why => false,
            _ => {
                *mark = Some((why, heard));
                self.doubted.store(true, Ordering::Release);
                true
            }
        }
    }
}

/// The candidates a dial chooses among: those of the best standing present.
pub(crate) fn preferred(standings: &[Standing]) -> Vec<usize> {
    let Some(best) = standings.iter().min() else { return Vec::new() };
    standings.iter().enumerate().filter(|(_, s)| *s == best).map(|(i, _)| i).collect()
}

/// Whether a session whose agent said `new` supersedes one whose agent said `old` (of the same
/// cluster: both certificates name it): the same node, both instances known, and different.
/// Without a node name or an instance nothing is superseded. Nor is a session whose agent
/// claims a host (`dest_host`'s name for it) by one that does not claim the same: that is
/// another node whatever its node name says, and the dials `dest_host` sends to the old one's
/// host must not lose it to a supersession they know nothing of.
pub(crate) fn supersedes(new: &AgentHello, old: &AgentHello) -> bool {
    !new.node.is_empty()
        && new.node == old.node
        && !new.instance.is_empty()
        && !old.instance.is_empty()
        && new.instance != old.instance
        && (old.host.is_empty() || same_host(&new.host, &old.host))
}

/// Two host names as `dest_host` compares them (case and a trailing dot aside).
fn same_host(a: &str, b: &str) -> bool {
    a.trim_end_matches('.').eq_ignore_ascii_case(b.trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(node: &str, instance: &str) -> AgentHello {
        AgentHello { node: node.into(), version: "1".into(), instance: instance.into(), ..AgentHello::default() }
    }

    fn on_host(node: &str, instance: &str, host: &str) -> AgentHello {
        AgentHello { host: host.into(), ..hello(node, instance) }
    }

    /// Agents that share a node name (e.g. the host name of network namespaces on one machine)
    /// but claim different hosts are different nodes: `dest_host` keeps each one's dials.
    #[test]
    fn a_session_claiming_a_host_is_superseded_only_by_one_claiming_the_same() {
        assert!(supersedes(&on_host("vm", "b", "node-1"), &on_host("vm", "a", "NODE-1.")));
        assert!(!supersedes(&on_host("vm", "b", "node-2"), &on_host("vm", "a", "node-1")), "another host");
        assert!(!supersedes(&on_host("vm", "b", ""), &on_host("vm", "a", "node-1")), "the new run claims none");
        assert!(supersedes(&on_host("vm", "b", "node-1"), &hello("vm", "a")), "the old one claimed none");
    }

    #[test]
    fn a_new_run_of_the_same_node_supersedes_and_nothing_else_does() {
        assert!(supersedes(&hello("n1", "b"), &hello("n1", "a")));
        assert!(!supersedes(&hello("n1", "a"), &hello("n1", "a")), "the same run: another replica's slot");
        assert!(!supersedes(&hello("n2", "b"), &hello("n1", "a")), "another node");
        assert!(!supersedes(&hello("", "b"), &hello("", "a")), "no node name: nothing to go by");
        assert!(!supersedes(&hello("n1", "b"), &hello("n1", "")), "an older agent says no instance");
        assert!(!supersedes(&hello("n1", ""), &hello("n1", "a")));
    }

    #[test]
    fn dials_prefer_the_best_standing_present() {
        use Standing::*;
        assert_eq!(preferred(&[]), Vec::<usize>::new());
        assert_eq!(preferred(&[Suspect, Healthy, Superseded, Healthy]), vec![1, 3]);
        assert_eq!(preferred(&[Superseded, Suspect, Suspect]), vec![1, 2], "suspect before superseded");
        assert_eq!(preferred(&[Superseded]), vec![0], "a doubted session is still better than none");
    }

    #[test]
    fn a_doubt_lasts_until_the_session_shows_life() {
        let l = Liveness::default();
        assert_eq!(l.standing(|| Some(5)), (Standing::Healthy, None));
        assert!(l.doubt(Standing::Suspect, Some(5)));
        assert!(!l.doubt(Standing::Suspect, Some(5)), "counted once");
        assert_eq!(l.standing(|| Some(5)), (Standing::Suspect, None), "nothing heard since");
        assert_eq!(l.looked_at(|| Some(6)), Standing::Healthy, "a look sees the sign of life");
        assert_eq!(l.looked_at(|| Some(5)), Standing::Suspect, "and clears nothing");
        assert_eq!(l.standing(|| Some(6)), (Standing::Healthy, Some(Standing::Suspect)), "a sign of life clears it");
        assert_eq!(l.standing(|| Some(6)), (Standing::Healthy, None), "cleared once");

        assert!(l.doubt(Standing::Suspect, Some(6)));
        assert!(l.doubt(Standing::Superseded, Some(6)), "superseded is the stronger doubt");
        assert!(!l.doubt(Standing::Suspect, Some(6)), "and stays");
        assert_eq!(l.standing(|| Some(6)).0, Standing::Superseded);
        assert_eq!(l.standing(|| Some(9)), (Standing::Healthy, Some(Standing::Superseded)));

        let blind = Liveness::default();
        assert!(!blind.doubt(Standing::Suspect, None), "a transport that cannot tell is never doubted");
        assert_eq!(blind.standing(|| None), (Standing::Healthy, None));
    }
}
