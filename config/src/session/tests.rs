//! Tests of `session`: both ends read the session keys alike.

use super::*;

/// The agent's `tunnel` and proxy-server's `agents`, each with what it requires and as many lines
/// before the session keys, so that a problem is at the same line and column in both.
const AGENT: &str = "tunnel:\n  servers: [a:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n";
const SERVER: &str = "agents:\n  listen: 127.0.0.1:1\n  tls: { cert: c, key: k, client_ca: ca }\n  server_count: 1\n";

/// The session settings each end reads from `keys` (lines under its section), or its problems
/// with the section's name taken out of the key paths.
fn both(keys: &str) -> (Result<SessionSettings, Vec<String>>, Result<SessionSettings, Vec<String>>) {
    let problems = |e: crate::ConfigError, section: &str| {
        e.problems.iter().map(|p| p.to_string().replace(&format!(": {section}."), ": <section>.")).collect()
    };
    let agent = crate::agent::parse(&format!("{AGENT}{keys}"), "f.yaml");
    let server = crate::server::parse(&format!("{SERVER}{keys}"), "f.yaml");
    (
        agent.map(|c| c.tunnel.expect("tunnel").session()).map_err(|e| problems(e, "tunnel")),
        server.map(|c| c.agents.session()).map_err(|e| problems(e, "agents")),
    )
}

#[test]
fn both_ends_accept_the_same_session_keys_with_the_same_values() {
    let d = SessionSettings::default();
    let ka = |interval, suspect_after, timeout| Keepalive {
        interval: Dur::millis(interval),
        suspect_after: Dur::millis(suspect_after),
        timeout: Dur::millis(timeout),
    };
    for (keys, want) in [
        ("", d),
        ("  keepalive: null\n  stream_window: null\n", d),
        (
            "  keepalive: { interval: 500ms, suspect_after: 2s, timeout: 2s }\n",
            SessionSettings { keepalive: ka(500, 2_000, 2_000), ..d },
        ),
        ("  keepalive:\n    timeout: 10s\n", SessionSettings { keepalive: ka(5_000, 3_000, 10_000), ..d }),
        (
            "  stream_window: 65535\n  connection_window: 65535\n",
            SessionSettings { stream_window: Some(65_535), connection_window: 65_535, ..d },
        ),
        (
            "  max_stream_window: 2147483647\n  h2_adaptive_window: false\n  tcp_notsent_lowat: 0\n  tcp_inflight_bound: false\n",
            SessionSettings {
                max_stream_window: (1 << 31) - 1,
                h2_adaptive_window: false,
                tcp_notsent_lowat: 0,
                tcp_inflight_bound: false,
                ..d
            },
        ),
    ] {
        let (agent, server) = both(keys);
        assert_eq!(agent, Ok(want), "agent, {keys:?}");
        assert_eq!(server, Ok(want), "server, {keys:?}");
    }
}

#[test]
fn both_ends_refuse_the_same_session_keys_with_the_same_problems() {
    for (keys, want) in [
        ("  keepalive: { interval: 0s }\n", &[":5:26: <section>.keepalive.interval: must be positive"][..]),
        (
            "  keepalive:\n    timeout: 0s\n    suspect_after: 0s\n",
            &[
                ":6:14: <section>.keepalive.timeout: must be positive",
                ":7:20: <section>.keepalive.suspect_after: must be positive",
            ],
        ),
        ("  keepalive: { interval: soon }\n", &[":5:26: <section>.keepalive.interval: invalid duration"]),
        ("  keepalive: { intervall: 1s }\n", &[":5:16: <section>.keepalive.intervall: unknown field"]),
        ("  stream_window: 65534\n", &[":5:18: <section>.stream_window: must be between 65535 and 2147483647"]),
        (
            "  stream_window: 2097152\n  connection_window: 1048576\n",
            &[":6:22: <section>.connection_window: must be at least stream_window"],
        ),
        ("  connection_window: 2147483648\n", &[":5:22: <section>.connection_window: must be at least"]),
        ("  max_stream_window: 65534\n", &[":5:22: <section>.max_stream_window: must be between"]),
        ("  h2_adaptive_window: maybe\n", &[":5:23: "]),
        ("  tcp_notsent_lowat: -1\n", &[":5:22: "]),
    ] {
        let (agent, server) = both(keys);
        let agent = agent.expect_err(keys);
        assert_eq!(Err(agent.clone()), server, "{keys:?}");
        assert_eq!(agent.len(), want.len(), "{keys:?}: {agent:#?}");
        for (got, want) in agent.iter().zip(want) {
            assert!(got.starts_with("f.yaml") && got.contains(want), "{keys:?}: {want:?} not in {got:?}");
        }
    }
}

#[test]
fn stream_windows_default_per_transport_and_a_given_one_holds_for_both() {
    let d = SessionSettings::default();
    let windows =
        |stream_window, connection_window| SessionSettings { stream_window, connection_window, ..d }.stream_windows();
    assert_eq!(windows(None, d.connection_window), (512 * 1024, 1024 * 1024), "h2 and QUIC defaults");
    assert_eq!(windows(Some(65_535), d.connection_window), (65_535, 65_535));
    assert_eq!(windows(None, 768 * 1024), (512 * 1024, 768 * 1024), "never above the session's");
    assert_eq!(windows(None, 65_535), (65_535, 65_535));
}
