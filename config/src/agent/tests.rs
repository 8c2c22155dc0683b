//! proxy-agent config tests: the contract example, defaults, every rule, and how an agent proves its cluster.

use super::*;

/// The contract proxy-agent example, apiserver proxy part.
const CONTRACT: &str = r#"
admin: { listen: 127.0.0.1:9903 }
apiserver_proxy:
  listen: [10.1.2.3:443]
  gateway: api.seed.example.com:8443
  mode: proxy-protocol-v2            # proxy-protocol-v2 | http-connect
  destination: "outbound|443||kube-apiserver.shoot--a.svc.cluster.local"   # http-connect header value
"#;

fn problems(yaml: &str) -> Vec<String> {
    match parse(yaml, "f.yaml") {
        Ok(_) => vec![],
        Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
    }
}

/// `yaml` is refused with a problem that contains `needle`.
fn refused_with(yaml: &str, needle: &str) {
    let e = problems(yaml);
    assert!(e.iter().any(|p| p.contains(needle)), "{needle:?} not in {e:#?}");
}

#[test]
fn design_contract_example_parses_with_defaults() {
    let c = parse(CONTRACT, "agent.yaml").unwrap();
    let ap = c.apiserver_proxy.as_ref().unwrap();
    assert_eq!(ap.listen[0].to_string(), "10.1.2.3:443");
    assert_eq!(ap.gateway.to_string(), "api.seed.example.com:8443");
    assert_eq!(ap.mode, Mode::ProxyProtocolV2);
    assert_eq!(ap.destination.as_deref(), Some("outbound|443||kube-apiserver.shoot--a.svc.cluster.local"));
    assert_eq!(ap.destination_header, "X-Gardener-Destination");
    assert_eq!(ap.authority, None);
    assert_eq!(ap.retries, 3);
    assert_eq!(c.timeouts, Timeouts::default());
    assert_eq!(c.timeouts.idle, Dur::secs(3600));
    assert_eq!(c.drain_grace, Dur::secs(30));
    assert_eq!(c.limits.max_connections, 10_000);
}

#[test]
fn the_documented_section_with_every_default_spelled_out_parses() {
    let y = r#"
apiserver_proxy:
  listen: [10.1.2.3:443]
  gateway: api.seed.example.com:8443
  mode: proxy-protocol-v2            # proxy-protocol-v2 | http-connect
  destination: "outbound|443||kube-apiserver.shoot--a.svc.cluster.local"   # http-connect header value (required in that mode)
  destination_header: X-Gardener-Destination    # default
  authority: null                    # CONNECT request target; default = the listen address the client connected to
  retries: 3                         # connect attempts across the gateway's resolved addresses
"#;
    let explicit = parse(y, "f.yaml").unwrap();
    let implicit = parse(CONTRACT, "f.yaml").unwrap();
    // Compared as served by /config: the values, not the line numbers.
    let json = |c: AgentConfig| serde_json::to_value(c.apiserver_proxy.unwrap()).unwrap();
    assert_eq!(json(explicit), json(implicit));
}

#[test]
fn tunnel_identifiers() {
    let base = "tunnel:\n  servers: [a:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n";
    let c = parse(base, "f.yaml").unwrap();
    assert_eq!(c.tunnel.unwrap().identifiers, Identifiers::default());
    let y =
        format!("{base}  identifiers: {{ host: node-1, addresses: [10.250.0.7, 'fd00::7'], default_route: true }}\n");
    let i = parse(&y, "f.yaml").unwrap().tunnel.unwrap().identifiers.clone();
    assert_eq!(i.host.as_deref(), Some("node-1"));
    assert_eq!(i.addresses.unwrap().len(), 2);
    assert!(i.default_route);
    refused_with(
        &format!("{base}  identifiers: {{ host: 'a b', addresses: [node-1] }}\n"),
        "tunnel.identifiers.addresses",
    );
    refused_with(
        &format!("{base}  identifiers: {{ host: 'a b' }}\n"),
        "tunnel.identifiers.host: \"a b\" is not a node name",
    );
    refused_with(&format!("{base}  identifiers: {{ hostname: x }}\n"), "unknown field");
}

#[test]
fn wan_settings_default_and_parse() {
    let base = "tunnel:\n  servers: [a:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n";
    let tunnel = |extra: &str| parse(&format!("{base}{extra}"), "f.yaml").unwrap().tunnel.unwrap();
    let t = tunnel("");
    assert_eq!(
        (
            t.quic_congestion_control,
            t.max_stream_window,
            t.tcp_notsent_lowat,
            t.h2_adaptive_window,
            t.tcp_inflight_bound
        ),
        (CongestionControl::LossTolerant, 16 * 1024 * 1024, 128 * 1024, true, true)
    );
    let t = tunnel(
        "  quic_congestion_control: bbr\n  max_stream_window: 524288\n  tcp_notsent_lowat: 0\n  h2_adaptive_window: false\n  tcp_inflight_bound: false\n",
    );
    assert_eq!(
        (
            t.quic_congestion_control,
            t.max_stream_window,
            t.tcp_notsent_lowat,
            t.h2_adaptive_window,
            t.tcp_inflight_bound
        ),
        (CongestionControl::Bbr, 524_288, 0, false, false)
    );
    assert_eq!(tunnel("  quic_congestion_control: new_reno\n").quic_congestion_control, CongestionControl::NewReno);
    assert_eq!(tunnel("  quic_congestion_control: cubic\n").quic_congestion_control, CongestionControl::Cubic);
    refused_with(&format!("{base}  quic_congestion_control: vegas\n"), "unknown variant");
    refused_with(&format!("{base}  max_stream_window: 65534\n"), "tunnel.max_stream_window: must be between");
}

#[test]
fn stream_windows_default_per_transport_and_a_given_one_holds_for_both() {
    let base = "tunnel:\n  servers: [a:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n";
    let windows = |extra: &str| {
        let c = parse(&format!("{base}{extra}"), "f.yaml").unwrap();
        let t = c.tunnel.unwrap();
        t.session().stream_windows()
    };
    assert_eq!(windows(""), (512 * 1024, 1024 * 1024), "h2 and QUIC defaults");
    assert_eq!(windows("  stream_window: 65535\n"), (65_535, 65_535));
    assert_eq!(windows("  stream_window: null\n"), (512 * 1024, 1024 * 1024));
    assert_eq!(windows("  connection_window: 786432\n"), (512 * 1024, 768 * 1024), "never above the session's");
    assert_eq!(windows("  connection_window: 65535\n"), (65_535, 65_535));
    refused_with(&format!("{base}  stream_window: 65534\n"), "tunnel.stream_window: must be between");
    refused_with(
        &format!("{base}  stream_window: 2097152\n  connection_window: 1048576\n"),
        "tunnel.connection_window: must be at least stream_window",
    );
    refused_with(&format!("{base}  connection_window: 65534\n"), "tunnel.connection_window");
}

#[test]
fn empty_file_gives_defaults_and_no_proxy() {
    let c = parse("{}", "f.yaml").unwrap();
    assert_eq!(c.admin, AdminConfig::on(9903));
    assert!(c.apiserver_proxy.is_none());
}

#[test]
fn every_key_of_the_brief_parses() {
    let c = parse(
        "apiserver_proxy:\n  listen: [10.1.2.3:443, '[fd00::1]:443']\n  gateway: 10.0.0.1:8443\n  mode: http-connect\n  destination: 'outbound|443||kube-apiserver.shoot--a.svc.cluster.local'\n  destination_header: X-Route\n  authority: kubernetes.default.svc:443\n  retries: 1\ntimeouts: { handshake: 1s, connect: 250ms, idle: 10m }\ndrain_grace: 5s\nlimits: { max_connections: 5 }\n",
        "f.yaml",
    )
    .unwrap();
    let ap = c.apiserver_proxy.unwrap().value;
    assert_eq!(ap.mode, Mode::HttpConnect);
    assert_eq!(ap.authority.unwrap().to_string(), "kubernetes.default.svc:443");
    assert_eq!(ap.listen[1].socket_addr(), Some("[fd00::1]:443".parse().unwrap()));
    assert_eq!(c.timeouts.connect, Dur::millis(250));
}

#[test]
fn design_contract_tunnel_section_parses() {
    let y = "admin: { listen: 127.0.0.1:9903 }\ntunnel:\n  servers: [proxy.seed.example.com:8132]\n  tls: { cert: agent.crt, key: agent.key, ca: server-ca.crt, server_name: proxy.seed.example.com }\n  allow: [10.250.0.0/16, 100.96.0.0/11, 100.64.0.0/13]\n";
    let c = parse(y, "agent.yaml").unwrap();
    let t = c.tunnel.unwrap();
    assert_eq!(t.servers[0].port, 8132);
    assert_eq!(t.allow.len(), 3);
    assert_eq!(t.keepalive.interval, Dur::secs(5));
    assert_eq!(t.max_streams, 16_384);
}

#[test]
fn tunnel_problems_are_reported() {
    let e =
        problems("tunnel:\n  servers: []\n  tls: { cert: c, key: k, ca: a }\n  reconnect: { initial: 10s, max: 1s }\n");
    assert!(e.iter().any(|p| p.contains("tunnel.servers")), "{e:?}");
    assert!(e.iter().any(|p| p.contains("tunnel.allow")), "{e:?}");
    assert!(e.iter().any(|p| p.contains("tunnel.reconnect.max")), "{e:?}");
}

#[test]
fn unknown_field_in_section_is_located() {
    let e =
        problems("apiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: a:1\n  mode: http-connect\n  destinaton: x\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("f.yaml:5:3"), "{e:?}");
    assert!(e[0].contains("unknown field `destinaton`"), "{e:?}");
}

#[test]
fn bad_values_are_located() {
    let e = problems("apiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: nowhere\n  mode: proxy-protocol-v2\n");
    assert!(e[0].starts_with("f.yaml:3:"), "{e:?}");
    let e = problems("apiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: a:1\n  mode: proxy-protocol-v1\n");
    assert!(e[0].starts_with("f.yaml:4:") && e[0].contains("unknown variant"), "{e:?}");
    let e = problems("timeouts:\n  idle: forever\n");
    assert!(e[0].starts_with("f.yaml:2:") && e[0].contains("invalid duration"), "{e:?}");
    let e = problems("apiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: a:1\n");
    assert!(e[0].contains("missing field `mode`"), "{e:?}");
}

#[test]
fn semantic_errors_are_all_reported_with_lines_and_fields() {
    let y = "limits: { max_connections: 0 }\ntimeouts: { handshake: 0s }\napiserver_proxy:\n  listen:\n    - 10.1.2.3:443\n    - api.local:443\n    - 10.1.2.3:443\n  gateway: a:1\n  mode: http-connect\n  destination_header: 'Bad Header'\n  retries: 0\n";
    let e = problems(y);
    let has = |s: &str| e.iter().any(|p| p.contains(s));
    assert!(!has("api.local"), "a host name is a valid listen address: {e:#?}");
    assert!(has("f.yaml:7:7: apiserver_proxy.listen[2]: 10.1.2.3:443 is listed twice"), "{e:#?}");
    assert!(has("f.yaml:3:1: apiserver_proxy.destination: required in http-connect"), "{e:#?}");
    assert!(has("(not in the file: shown at apiserver_proxy)"), "a default is shown at its section: {e:#?}");
    assert!(has("f.yaml:10:23: apiserver_proxy.destination_header: \"Bad Header\""), "{e:#?}");
    assert!(has("f.yaml:11:12: apiserver_proxy.retries: must be between 1 and 16"), "{e:#?}");
    assert!(has("f.yaml:1:28: limits.max_connections"), "{e:#?}");
    assert!(has("f.yaml:2:24: timeouts.handshake: must be positive"), "{e:#?}");
    assert_eq!(e.len(), 6, "{e:#?}");
}

#[test]
fn every_bad_value_is_reported_even_inside_located_sections() {
    let y = "apiserver_proxy:\n  listen: [10.1.2.3:443, nowhere]\n  gateway: a:1\n  mode: proxy-protocol-v2\ntunnel:\n  servers: [a:1]\n  tls: { cert: c, key: k, ca: a }\n  allow: [10.0.0.0/8, 10.0.0.1/8]\n  reconnect: { initial: soon }\n";
    let e = problems(y);
    let has = |s: &str| e.iter().any(|p| p.contains(s));
    assert!(has("f.yaml:2:26: apiserver_proxy.listen[1]: invalid address"), "{e:#?}");
    assert!(has("tunnel.allow[1]: invalid"), "{e:#?}");
    assert!(has("tunnel.reconnect.initial: invalid duration"), "{e:#?}");
    assert_eq!(e.len(), 3, "{e:#?}");
}

#[test]
fn header_injection_is_refused() {
    let base = "apiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: a:1\n  mode: http-connect\n";
    let e = problems(&format!("{base}  destination: \"a\\r\\nX-Evil: 1\"\n"));
    assert!(e.iter().any(|p| p.contains("apiserver_proxy.destination")), "{e:?}");
    let e = problems(&format!("{base}  destination: x\n  destination_header: Host\n"));
    assert!(e.iter().any(|p| p.contains("destination_header") && p.contains("choose another")), "{e:?}");
    assert!(problems(&format!("{base}  destination: 'outbound|443||x.svc'\n")).is_empty());
}

#[test]
fn listener_names() {
    assert_eq!(ApiserverProxy::listener_name(0), "apiserver-proxy");
    assert_eq!(ApiserverProxy::listener_name(2), "apiserver-proxy-2");
}

#[test]
fn config_serializes_for_the_admin_endpoint() {
    let c = parse(CONTRACT, "agent.yaml").unwrap();
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(j["apiserver_proxy"]["listen"][0], "10.1.2.3:443");
    assert_eq!(j["apiserver_proxy"]["mode"], "proxy-protocol-v2");
    assert_eq!(j["timeouts"]["handshake"], "5s");
}

mod identity {
    use super::super::parse;

    const TUNNEL: &str = "tunnel:\n  servers: [a:1]\n  allow: [10.0.0.0/8]\n";

    #[test]
    fn an_agent_has_a_certificate_a_token_or_both() {
        for tls in [
            "  tls: { ca: ca }\n  token_file: /var/run/secrets/seedgate/token\n  cluster: shoot-a\n",
            "  tls: { cert: c, key: k, ca: ca }\n",
            "  tls: { cert: c, key: k, ca: ca, crl: l.pem }\n  token_file: /t\n",
        ] {
            let c = parse(&format!("{TUNNEL}{tls}"), "a.yaml").unwrap_or_else(|e| panic!("{tls}: {e}"));
            let t = c.tunnel.expect("tunnel");
            assert_eq!(t.tls.identity().is_some(), t.tls.cert.is_some());
        }
        let c = parse(&format!("{TUNNEL}  tls: {{ ca: ca }}\n  token_file: /t\n"), "a.yaml").unwrap();
        assert_eq!(c.token_files(), vec![("tunnel.token_file".to_owned(), "/t".to_owned())]);
        for (tls, want) in [
            ("  tls: { ca: ca }\n", "tunnel.tls.cert: the agent needs an identity"),
            ("  tls: { cert: c, ca: ca }\n", "tunnel.tls.key: give the key"),
            ("  tls: { key: k, ca: ca }\n  token_file: /t\n", "tunnel.tls.cert: give the certificate"),
            ("  tls: { ca: ca }\n  token_file: /t\n  cluster: 'a b'\n", "tunnel.cluster"),
        ] {
            let e = parse(&format!("{TUNNEL}{tls}"), "a.yaml").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
