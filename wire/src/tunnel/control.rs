//! The control stream: one JSON object per line, the agent's hello and notices one way, the seed's messages the other.
//!
//! The agent writes its [`AgentHello`] as the stream's first line (with its ServiceAccount token,
//! if it has one), then at most the notices of [`AgentMsg`] (a renewed token; going away, QUIC
//! only: HTTP/2 has GOAWAY for it); the seed writes [`ControlMsg`] lines.
//! A line is at most [`CONTROL_LINE_MAX`] bytes before its newline; a longer one ends the
//! stream's use (its framing is lost). A line that is not a message the reader knows is skipped,
//! so either end may learn new messages without breaking the other.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use crate::lines::{LineFramer, TooLong};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest control line accepted (bytes before its newline).
pub const CONTROL_LINE_MAX: usize = 64 * 1024;
/// Longest hello field the seed keeps (bytes; a DNS name's longest): `node`, `version`,
/// `instance`, `host`, `cluster`, each address.
pub const HELLO_FIELD_MAX: usize = 253;
/// Most addresses the seed keeps from a hello.
pub const HELLO_ADDRESSES_MAX: usize = 32;

/// Messages from the seed to an agent on the control stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlMsg {
    /// This server stops serving the cluster: open a session to `to` (or re-resolve the
    /// configured server names when empty), move new streams there, let old ones finish within
    /// `drain_deadline_ms`, then close this session.
    Move { to: Vec<String>, drain_deadline_ms: u64 },
    /// This server does not serve the agent's cluster and is about to close the session; the
    /// agent logs `reason` (the session is not used for dials meanwhile).
    Refused { reason: String },
    /// Who this server is: sent when the session is registered and again whenever the count or
    /// the draining flag changes. The agent keeps sessions to `count` distinct server ids behind
    /// the name it dialled.
    Server(ServerInfo),
}

/// A proxy-server replica as it announces itself to its agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The replica's identity (distinct per replica).
    pub id: String,
    /// How many replicas the agent should reach behind the name it dialled.
    pub count: u32,
    /// When this replica's `count` took its value (Unix milliseconds). Replicas may disagree
    /// for a while (one reloaded, another not yet): the agent trusts the newest.
    #[serde(default)]
    pub since_ms: u64,
    /// The replica is shutting down: its live streams continue until its drain deadline, new
    /// streams should go elsewhere, and the agent looks for a session to a replacement.
    #[serde(default)]
    pub draining: bool,
}

/// What an agent says about itself when the control stream opens (its first line).
///
/// The identifiers (`host`, `addresses`, `default_route`) and `instance` came later: they are
/// left out when empty, so an agent without them sends the line of version 1 unchanged; a server that does not
/// know them skips them (unknown fields are ignored), and a hello without them reads as an agent
/// with no identifiers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    /// The node the agent runs on (with the cluster its certificate names: which agent it is).
    pub node: String,
    pub version: String,
    /// Which run of the agent this is: random, drawn once per process start and the same on all
    /// its sessions. A session of the same cluster and node with another instance is a restarted
    /// agent's: it supersedes the sessions of the earlier run (they may be dead without a word).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// The agent's node name, matched against a dial's host (`dest_host`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// The node's addresses, matched against a dial's host (`dest_host`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The agent offers a default route: dials no other agent claims may come here
    /// (`default_route`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default_route: bool,
    /// The cluster the agent says it belongs to: a claim, not an identity. With a token, the
    /// seed asks only this cluster's kube-apiserver about it; with a certificate, it must
    /// equal the certificate's cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The agent's ServiceAccount token, if it has one (the seed takes it out before it keeps
    /// the hello).
    #[serde(default, skip_serializing_if = "Secret::is_empty")]
    pub token: Secret,
}

impl AgentHello {
    /// The hello as the seed keeps it: each field cut to [`HELLO_FIELD_MAX`] bytes (at a
    /// character's boundary) and the first [`HELLO_ADDRESSES_MAX`] addresses, so what an
    /// unauthenticated peer sends cannot make the seed keep or log 64 KiB. No name a node, host
    /// or cluster has is longer; a cut one matches nothing a real agent announces.
    pub fn bounded(mut self) -> Self {
        for f in [&mut self.node, &mut self.version, &mut self.instance, &mut self.host, &mut self.cluster] {
            cut(f, HELLO_FIELD_MAX);
        }
        self.addresses.truncate(HELLO_ADDRESSES_MAX);
        for a in &mut self.addresses {
            cut(a, HELLO_FIELD_MAX);
        }
        self
    }
}

/// `s` cut to at most `max` bytes, at a character's boundary.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let at = s.floor_char_boundary(max);
        s.truncate(at);
    }
}

/// A credential on the control stream: its text on the wire, never shown by `Debug`, so no log
/// line or panic message can carry it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The credential itself, for the one place that must send or check it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// What the agent writes on the control stream after its hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMsg {
    /// The agent shuts down: no new streams on this session (QUIC's GOAWAY), `{"type":"going_away"}`.
    GoingAway,
    /// The agent's ServiceAccount token was renewed (the kubelet rotates it): the seed reviews
    /// the session's identity with this one from now on, `{"type":"token","token":"..."}`.
    Token { token: Secret },
}

/// `msg` as one control line: its JSON and the newline.
pub fn encode_line<T: Serialize>(msg: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    Ok(line)
}

/// One line of a control stream, read as a `T`.
#[derive(Debug)]
pub enum Line<T> {
    Msg(T),
    /// Not a `T` (another version's message, or garbage): skipped, the stream goes on.
    Unknown(serde_json::Error),
}

/// Reads a control stream as its bytes come: [`LineFramer`] at [`CONTROL_LINE_MAX`], then
/// each line decoded as the message the caller expects next.
#[derive(Debug, Clone)]
pub struct ControlReader {
    framer: LineFramer,
}

impl Default for ControlReader {
    fn default() -> Self {
        Self::new(CONTROL_LINE_MAX)
    }
}

impl ControlReader {
    /// `limit`: the longest line accepted ([`CONTROL_LINE_MAX`] on the wire).
    pub fn new(limit: usize) -> Self {
        Self { framer: LineFramer::new(limit) }
    }

    /// Bytes received. Call [`ControlReader::next_msg`] until it returns `Ok(None)` before pushing more.
    pub fn push(&mut self, chunk: &[u8]) {
        self.framer.push(chunk);
    }

    /// The next complete line as a `T`; `Ok(None)` until one has arrived. `Err` is final: a
    /// line was longer than the limit and the stream has lost its framing.
    pub fn next_msg<T: DeserializeOwned>(&mut self) -> Result<Option<Line<T>>, TooLong> {
        Ok(self.framer.next_line()?.map(|line| match serde_json::from_slice(&line) {
            Ok(msg) => Line::Msg(msg),
            Err(e) => Line::Unknown(e),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all<T: DeserializeOwned>(r: &mut ControlReader) -> Vec<Option<T>> {
        let mut out = Vec::new();
        while let Ok(Some(line)) = r.next_msg::<T>() {
            out.push(match line {
                Line::Msg(m) => Some(m),
                Line::Unknown(_) => None,
            });
        }
        out
    }

    #[test]
    fn a_hello_is_kept_within_its_limits() {
        let long = "é".repeat(200);
        let h = AgentHello {
            node: long.clone(),
            version: "v1".into(),
            instance: long.clone(),
            host: "node-1".into(),
            addresses: vec![long.clone(); 100],
            cluster: long.clone(),
            ..AgentHello::default()
        }
        .bounded();
        for f in [&h.node, &h.instance, &h.cluster] {
            assert_eq!(f.len(), 252, "cut at the character before byte 253");
            assert!(long.starts_with(f.as_str()));
        }
        assert_eq!((h.version.as_str(), h.host.as_str()), ("v1", "node-1"), "short fields stay");
        assert_eq!(h.addresses.len(), HELLO_ADDRESSES_MAX);
        assert!(h.addresses.iter().all(|a| a.len() <= HELLO_FIELD_MAX));
        assert_eq!(h.clone().bounded(), h, "bounding twice changes nothing");
    }

    /// The bytes on the wire are version 1's: agents and servers of the previous version read them.
    #[test]
    fn lines_are_the_wire_format_of_version_1() {
        let server = ControlMsg::Server(ServerInfo { id: "r0".into(), count: 3, since_ms: 17, draining: false });
        assert_eq!(
            encode_line(&server).ok().as_deref(),
            Some(&b"{\"type\":\"server\",\"id\":\"r0\",\"count\":3,\"since_ms\":17,\"draining\":false}\n"[..])
        );
        let moved = ControlMsg::Move { to: vec!["b:8132".into()], drain_deadline_ms: 30_000 };
        assert_eq!(
            encode_line(&moved).ok().as_deref(),
            Some(&b"{\"type\":\"move\",\"to\":[\"b:8132\"],\"drain_deadline_ms\":30000}\n"[..])
        );
        let refused = ControlMsg::Refused { reason: "no".into() };
        assert_eq!(encode_line(&refused).ok().as_deref(), Some(&b"{\"type\":\"refused\",\"reason\":\"no\"}\n"[..]));
        assert_eq!(encode_line(&AgentMsg::GoingAway).ok().as_deref(), Some(&b"{\"type\":\"going_away\"}\n"[..]));
        let hello = AgentHello { node: "n".into(), version: "1".into(), ..AgentHello::default() };
        assert_eq!(encode_line(&hello).ok().as_deref(), Some(&b"{\"node\":\"n\",\"version\":\"1\"}\n"[..]));
    }

    /// The identifiers travel in the hello; a hello without them (an older agent) reads as no
    /// identifiers, and a reader that predates them skips them.
    #[test]
    fn hello_identifiers_are_a_compatible_addition() {
        let hello = AgentHello {
            node: "n".into(),
            version: "2".into(),
            host: "node-1".into(),
            addresses: vec!["10.250.0.7".into(), "fd00::7".into()],
            default_route: true,
            instance: "7f3a09".into(),
            ..AgentHello::default()
        };
        let line = encode_line(&hello).ok().unwrap_or_default();
        assert_eq!(
            line,
            b"{\"node\":\"n\",\"version\":\"2\",\"instance\":\"7f3a09\",\"host\":\"node-1\",\"addresses\":[\"10.250.0.7\",\"fd00::7\"],\"default_route\":true}\n"
        );
        let mut r = ControlReader::default();
        r.push(&line);
        r.push(b"{\"node\":\"old\",\"version\":\"1\"}\n");
        let old = AgentHello { node: "old".into(), version: "1".into(), ..AgentHello::default() };
        assert_eq!(read_all::<AgentHello>(&mut r), vec![Some(hello), Some(old)]);

        /// The hello as a reader before the identifiers knew it.
        #[derive(Debug, PartialEq, Deserialize)]
        struct HelloV1 {
            node: String,
            version: String,
        }
        r.push(&line);
        assert_eq!(read_all::<HelloV1>(&mut r), vec![Some(HelloV1 { node: "n".into(), version: "2".into() })]);
    }

    /// The token and the cluster claim are left out when empty (an agent with a certificate only
    /// sends the line it sent before), and the token never shows in `Debug`.
    #[test]
    fn the_token_travels_in_the_hello_and_in_its_renewal_but_never_in_debug() {
        let hello = AgentHello {
            node: "n".into(),
            version: "3".into(),
            cluster: "shoot-a".into(),
            token: Secret::new("eyJhbGciOi.x.y"),
            ..AgentHello::default()
        };
        let line = encode_line(&hello).ok().unwrap_or_default();
        assert_eq!(line, b"{\"node\":\"n\",\"version\":\"3\",\"cluster\":\"shoot-a\",\"token\":\"eyJhbGciOi.x.y\"}\n");
        let shown = format!("{hello:?}");
        assert!(!shown.contains("eyJ") && shown.contains("Secret(14 bytes)"), "{shown}");
        let renewed = AgentMsg::Token { token: Secret::new("t2") };
        assert_eq!(encode_line(&renewed).ok().as_deref(), Some(&b"{\"type\":\"token\",\"token\":\"t2\"}\n"[..]));
        assert!(!format!("{renewed:?}").contains("t2"));
        let mut r = ControlReader::default();
        r.push(&line);
        assert_eq!(read_all::<AgentHello>(&mut r), vec![Some(hello)]);
    }

    /// An announcement of a server before `since_ms` and `draining` existed still reads.
    #[test]
    fn an_older_servers_announcement_reads_with_defaults() {
        let mut r = ControlReader::default();
        r.push(b"{\"type\":\"server\",\"id\":\"r1\",\"count\":2}\n");
        let want = ControlMsg::Server(ServerInfo { id: "r1".into(), count: 2, since_ms: 0, draining: false });
        assert_eq!(read_all::<ControlMsg>(&mut r), vec![Some(want)]);
    }

    #[test]
    fn unknown_lines_are_skipped_and_the_stream_goes_on() {
        let mut r = ControlReader::default();
        r.push(b"{\"type\":\"reboot\"}\nnot json\n{\"type\":\"refused\",\"reason\":\"x\"}\n{\"type\":");
        let got = read_all::<ControlMsg>(&mut r);
        assert_eq!(got, vec![None, None, Some(ControlMsg::Refused { reason: "x".into() })]);
        r.push(b"\"refused\",\"reason\":\"y\"}\n");
        assert_eq!(read_all::<ControlMsg>(&mut r), vec![Some(ControlMsg::Refused { reason: "y".into() })]);
    }

    #[test]
    fn a_line_over_the_limit_ends_the_stream_for_good() {
        let mut r = ControlReader::new(8);
        r.push(b"{\"type\":\"going_away\"}\n{}\n");
        assert!(r.next_msg::<AgentMsg>().is_err());
        r.push(b"{}\n");
        assert!(r.next_msg::<AgentMsg>().is_err(), "no resynchronisation on a later newline");
    }
}
