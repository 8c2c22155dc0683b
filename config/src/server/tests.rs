//! Tests of `server`.

#[test]
fn cluster_files() {
    let c = parse_cluster_file("clusters:\n  shoot-a: { state: fenced }\n", "a.yaml").unwrap();
    assert_eq!(c["shoot-a"].state, ClusterMode::Fenced);
    let e = parse_cluster_file("clusters:\n  a: { state: active, move_to: [x:1] }\n", "a.yaml").unwrap_err();
    assert!(e.to_string().contains("a.yaml:2:23: clusters.a.move_to: move_to only applies"), "{e}");
    assert!(parse_cluster_file("clusterz: {}\n", "a.yaml").is_err());
}

use super::*;

const CONTRACT: &str = r#"
admin: { listen: 127.0.0.1:9902 }
agents:
  listen: 0.0.0.0:8132
  tls: { cert: server.crt, key: server.key, client_ca: agents-ca.crt }   # cluster = agent cert's CN
frontends:
  - name: shoot-a-egress
    listen: 0.0.0.0:9443             # or  unix: /run/seedgate/shoot-a.sock  (then no tls)
    tls: { cert: frontend.crt, key: frontend.key, client_ca: apiserver-ca.crt }
    cluster: shoot-a
clusters:                            # per-cluster state (migration); absent = active
  shoot-a: { state: active }         # active | draining | fenced
  shoot-b: { state: draining, move_to: [proxy.seed-b.example.com:8132], drain_deadline: 30s }
"#;

#[test]
fn design_contract_example_parses() {
    let c = parse(CONTRACT, "server.yaml").unwrap();
    assert_eq!(c.frontends[0].cluster.as_deref(), Some("shoot-a"));
    assert_eq!(c.clusters["shoot-b"].state, ClusterMode::Draining);
    assert_eq!(c.clusters["shoot-b"].move_to[0].port, 8132);
    assert_eq!(c.agents.keepalive.interval, Dur::secs(5));
}

#[test]
fn frontend_rules() {
    let y = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\nfrontends:\n  - name: a\n    unix: /tmp/x.sock\n    tls: { cert: c, key: k }\n    cluster: x\n  - name: a\n    cluster: x\n  - name: b\n    listen: 127.0.0.1:2\n";
    let e = parse(y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("frontends[0].tls: a unix socket front end takes no TLS"), "{e}");
    assert!(e.contains("s.yaml:7:11: frontends[1].name: duplicate"), "{e}");
    assert!(e.contains("frontends[1]: give listen"), "{e}");
    assert!(e.contains("frontends[2].cluster"), "{e}");
}

#[test]
fn cluster_from_proxy_authorization_needs_a_token_file_and_no_cluster() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\nfrontends:\n";
    let y = format!(
        "{base}  - name: prom\n    listen: 127.0.0.1:2\n    cluster_from: proxy_authorization\n    proxy_token_file: /t\n"
    );
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.frontends[0].cluster_from, ClusterFrom::ProxyAuthorization);
    assert_eq!(serde_json::to_value(&c).unwrap()["frontends"][0]["cluster_from"], "proxy_authorization");
    let y = format!(
        "{base}  - name: a\n    listen: 127.0.0.1:2\n    cluster_from: proxy_authorization\n    cluster: x\n  - name: b\n    listen: 127.0.0.1:3\n    cluster: x\n    proxy_token_file: /t\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("frontends[0].cluster_from: give cluster or"), "{e}");
    assert!(e.contains("frontends[0].proxy_token_file: cluster_from: proxy_authorization needs"), "{e}");
    assert!(e.contains("frontends[1].proxy_token_file: only with"), "{e}");
    assert!(!e.contains("set tls.client_ca"), "{e}");
}

#[test]
fn pending_budget_keys_defaults_and_bounds() {
    let agents = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\n";
    let c = parse(agents, "s.yaml").unwrap();
    assert_eq!((c.limits.max_pending, c.limits.pending_per_source), (2000, 0));
    assert_eq!((c.limits.source_prefix_v4, c.limits.source_prefix_v6), (32, 64));
    assert_eq!(c.timeouts.handshake_floor, Dur::millis(500));
    let y = format!(
        "{agents}limits: {{ max_pending: 0, source_prefix_v4: 33, source_prefix_v6: 129 }}\ntimeouts: {{ handshake_floor: 0s }}\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    for key in ["limits.max_pending", "limits.source_prefix_v4", "limits.source_prefix_v6", "timeouts.handshake_floor"]
    {
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn unix_socket_mode_and_group() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\nfrontends:\n";
    let y = format!(
        "{base}  - name: a\n    unix: /run/seedgate/a.sock\n    unix_mode: \"0660\"\n    unix_group: \"1000\"\n    cluster: x\n"
    );
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.frontends[0].unix_mode, Some(crate::common::FileMode(0o660)));
    assert_eq!(serde_json::to_value(&c).unwrap()["frontends"][0]["unix_mode"], "0660");
    let y = format!(
        "{base}  - name: a\n    listen: 127.0.0.1:2\n    unix_mode: \"0999\"\n    unix_group: a b\n    cluster: x\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("frontends[0].unix_mode: invalid file mode"), "{e}");
    assert!(e.contains("frontends[0].unix_group: only a unix socket front end"), "{e}");
    assert!(e.contains("frontends[0].unix_group: \"a b\" is neither"), "{e}");
}

#[test]
fn unknown_clusters_are_accepted_unless_refused() {
    let y = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\n";
    assert!(parse(y, "s.yaml").unwrap().agents.accept_unknown_clusters);
    let y =
        "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca }, accept_unknown_clusters: false }\n";
    assert!(!parse(y, "s.yaml").unwrap().agents.accept_unknown_clusters);
}

#[test]
fn replica_keys() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca }";
    let c = parse(&format!("{base} }}\n"), "s.yaml").unwrap();
    assert_eq!((c.agents.server_id, c.agents.server_count, c.agents.peers), (None, None, None));
    let c = parse(&format!("{base}, server_id: r1, server_count: 3 }}\n"), "s.yaml").unwrap();
    assert_eq!((c.agents.server_id.as_deref(), c.agents.server_count), (Some("r1"), Some(3)));
    let c = parse(&format!("{base}, peers: 'ps.seed.svc:8132', peers_interval: 2s }}\n"), "s.yaml").unwrap();
    assert_eq!(c.agents.peers.unwrap().to_string(), "ps.seed.svc:8132");
    for (bad, key) in [
        ("server_count: 0", "agents.server_count"),
        ("server_count: 65", "agents.server_count"),
        ("server_count: 2, peers: 'a:1'", "agents.peers"),
        ("server_id: 'a b'", "agents.server_id"),
        ("peers: 'a:1', peers_interval: 10ms", "agents.peers_interval"),
    ] {
        let e = parse(&format!("{base}, {bad} }}\n"), "s.yaml").unwrap_err().to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}

#[test]
fn settle_time_and_hibernated_clusters() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca }";
    let c = parse(&format!("{base} }}\nclusters:\n  a: {{ state: active }}\n"), "s.yaml").unwrap();
    assert_eq!(c.agents.settle_time.get(), Duration::from_secs(30));
    assert_eq!(c.clusters["a"].hibernated, None);
    let y =
        format!("{base}, settle_time: 0s }}\nclusters:\n  a: {{ hibernated: true }}\n  b: {{ hibernated: false }}\n");
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.agents.settle_time.get(), Duration::ZERO);
    assert_eq!((c.clusters["a"].hibernated, c.clusters["b"].hibernated), (Some(true), Some(false)));
    let e = parse(&format!("{base} }}\nclusters:\n  a: {{ hibernated: yes please }}\n"), "s.yaml").unwrap_err();
    assert!(e.to_string().contains("hibernated"), "{e}");
}

#[test]
fn grpc_front_ends_and_proxy_strategies() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca }";
    let c = parse(&format!("{base} }}\n"), "s.yaml").unwrap();
    assert_eq!(c.agents.proxy_strategies, vec![ProxyStrategy::Default]);
    let y = format!(
        "{base}, proxy_strategies: [dest_host, default_route, default] }}\nfrontends:\n  - name: kas\n    unix: /run/k.sock\n    protocol: grpc\n    cluster: a\nclusters:\n  a: {{ proxy_strategies: [dest_host] }}\n"
    );
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.frontends[0].protocol, FrontendProtocol::Grpc);
    assert_eq!(serde_json::to_value(&c).unwrap()["frontends"][0]["protocol"], "grpc");
    assert_eq!(c.agents.proxy_strategies.len(), 3);
    assert_eq!(c.clusters["a"].proxy_strategies, Some(vec![ProxyStrategy::DestHost]));
    let y = format!(
        "{base}, proxy_strategies: [] }}\nfrontends:\n  - name: p\n    listen: 127.0.0.1:2\n    protocol: grpc\n    cluster_from: proxy_authorization\n    proxy_token_file: /t\nclusters:\n  a: {{ proxy_strategies: [default, default] }}\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("agents.proxy_strategies: give at least one"), "{e}");
    assert!(e.contains("clusters.a.proxy_strategies: a strategy is listed twice"), "{e}");
    assert!(e.contains("frontends[0].cluster_from: a grpc front end has no proxy credentials"), "{e}");
    let e = parse(&format!("{base}, proxy_strategies: [dest_ip] }}\n"), "s.yaml").unwrap_err().to_string();
    assert!(e.contains("agents.proxy_strategies"), "{e}");
    let e = parse(
        &format!("{base} }}\nfrontends:\n  - {{ name: a, listen: 127.0.0.1:2, cluster: a, protocol: http2 }}\n"),
        "s.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("frontends[0].protocol"), "{e}");
}

#[test]
fn port_forwards_need_a_target_and_only_they_have_one() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca } }\nfrontends:\n";
    let y = format!(
        "{base}  - {{ name: kubelet, unix: /run/k.sock, cluster: a, protocol: tcp, target: '10.250.0.7:10250' }}\n"
    );
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.frontends[0].protocol, FrontendProtocol::Tcp);
    assert_eq!(c.frontends[0].target.as_ref().map(ToString::to_string).as_deref(), Some("10.250.0.7:10250"));
    let y = format!(
        "{base}  - {{ name: a, listen: 127.0.0.1:2, cluster: a, protocol: tcp }}\n  - {{ name: b, listen: 127.0.0.1:3, cluster: a, target: 'x:1' }}\n  - {{ name: c, listen: 127.0.0.1:4, protocol: tcp, target: 'x:1', cluster_from: proxy_authorization, proxy_token_file: /t }}\n  - {{ name: d, listen: 127.0.0.1:5, cluster: a, protocol: tcp, target: 'no-port' }}\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("frontends[0].target: a port forward (protocol: tcp) needs its target"), "{e}");
    assert!(e.contains("frontends[1].target: only a port forward"), "{e}");
    assert!(e.contains("frontends[2].cluster_from: a port forward"), "{e}");
    assert!(e.contains("frontends[3].target"), "{e}");
}

#[test]
fn sessions_per_cluster_have_a_default_and_a_cluster_s_own_limit() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k, client_ca: ca }";
    let c = parse(&format!("{base} }}\n"), "s.yaml").unwrap();
    assert_eq!(c.agents.max_sessions_per_cluster, 4096);
    let y = format!("{base}, max_sessions_per_cluster: 10 }}\nclusters:\n  a: {{ limits: {{ max_sessions: 3 }} }}\n");
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!((c.agents.max_sessions_per_cluster, c.clusters["a"].limits.unwrap().max_sessions), (10, Some(3)));
    let y = format!("{base}, max_sessions_per_cluster: 0 }}\nclusters:\n  a: {{ limits: {{ max_sessions: 0 }} }}\n");
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    assert!(e.contains("agents.max_sessions_per_cluster") && e.contains("clusters.a.limits.max_sessions"), "{e}");
}

#[test]
fn token_agents_and_revocation_lists() {
    let base = "agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k";
    let review = "{ url: 'https://kas.shoot-a:6443', ca: ca.crt, token_file: /t }";
    let y = format!("{base} }}, auth: token }}\nclusters:\n  a: {{ token_review: {review} }}\n");
    let c = parse(&y, "s.yaml").unwrap();
    assert_eq!(c.agents.auth, AgentAuth::Token);
    assert_eq!(c.clusters["a"].token_review.as_ref().unwrap().authority(), Some(("kas.shoot-a".into(), 6443)));
    assert_eq!(c.agents.token_review.audiences, ["seedgate"]);
    assert_eq!(c.agents.token_review.grace.get(), std::time::Duration::from_secs(300));
    let y = format!(
        "{base}, crl: l.pem }}, token_review: {{ audiences: [], service_accounts: [nobody], grace: 25h }} }}\nclusters:\n  a: {{ agent_auth: token }}\n  b: {{ agent_auth: mtls_and_token, token_review: {{ url: 'http://x', ca: c, token_file: t, cert: c, key: k }} }}\n"
    );
    let e = parse(&y, "s.yaml").unwrap_err().to_string();
    for want in [
        "agents.tls.client_ca: agents authenticate with client certificates",
        "agents.tls.crl: revocation lists apply to client certificates",
        "agents.token_review.audiences",
        "agents.token_review.service_accounts: \"nobody\"",
        "agents.token_review.grace: must be at most 24h",
        "clusters.a.agent_auth: the agents listener requires a client certificate",
        "clusters.a.token_review: agent_auth token needs",
        "clusters.b.token_review.url",
        "clusters.b.token_review.token_file: give token_file or cert and key, not both",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn agents_need_a_client_ca() {
    let e = parse("agents: { listen: 127.0.0.1:1, tls: { cert: c, key: k } }\n", "s.yaml").unwrap_err().to_string();
    assert!(e.contains("agents.tls.client_ca"), "{e}");
}

mod every_problem {
    use crate::server::parse;

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml, "s.yaml") {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    const AGENTS: &str = "agents:\n  listen: 127.0.0.1:1\n  tls: { cert: c, key: k, client_ca: ca }\n";

    #[test]
    fn four_bad_durations_are_four_problems_each_naming_its_key() {
        let y = format!(
            "{AGENTS}  keepalive: {{ interval: fast, timeout: soon }}\ntimeouts:\n  dial: 10\n  idle: forever\ndrain_grace: 30s\n"
        );
        let e = problems(&y);
        assert_eq!(e.len(), 4, "{e:#?}");
        for key in ["agents.keepalive.interval", "agents.keepalive.timeout", "timeouts.dial", "timeouts.idle"] {
            assert!(e.iter().any(|p| p.contains(&format!(": {key}: invalid duration"))), "{key}: {e:#?}");
        }
        assert!(e[2].starts_with("s.yaml:6:9: timeouts.dial"), "{e:#?}");
    }

    #[test]
    fn bad_values_and_rule_violations_are_reported_together() {
        let y = format!(
            "{AGENTS}timeouts: {{ idle: forever }}\nlimits: {{ max_connections: 0 }}\nfrontends:\n  - name: a\n    listen: nowhere\n    cluster: x\n"
        );
        let e = problems(&y);
        assert!(e.iter().any(|p| p.contains("timeouts.idle: invalid duration")), "{e:#?}");
        assert!(e.iter().any(|p| p.contains("frontends[0].listen: invalid address")), "{e:#?}");
        assert!(e.iter().any(|p| p.contains("limits.max_connections: must be at least 1")), "{e:#?}");
        assert_eq!(e.len(), 3, "{e:#?}");
    }

    /// Problems found after the parse (bounds, rules between keys) point at the key they name,
    /// in every section; one about a key left out (its default) points at the nearest section
    /// that is in the file and says so.
    #[test]
    fn problems_found_after_the_parse_point_at_their_keys() {
        let y = "limits:\n  max_connections: 0\n  tenant_share: 2\nagents:\n  listen: 127.0.0.1:1\n  tls: { cert: c, key: k, client_ca: ca }\n  keepalive:\n    timeout: 0s\n  stream_window: 65534\n  token_review: { cache_size: 0 }\n  peers_interval: 10ms\nclusters:\n  shoot-a:\n    state: active\n    move_to: [seed-b:8132]\n    agent_auth: mtls_and_token\n";
        let e = problems(y);
        for want in [
            "s.yaml:2:20: limits.max_connections: must be at least 1",
            "s.yaml:3:17: limits.tenant_share: must be a fraction",
            "s.yaml:8:14: agents.keepalive.timeout: must be positive",
            "s.yaml:9:18: agents.stream_window: must be between",
            "s.yaml:10:31: agents.token_review.cache_size: must be between",
            "s.yaml:11:19: agents.peers_interval: must be at least 1s",
            "s.yaml:15:5: clusters.shoot-a.move_to: move_to only applies to state draining",
            "s.yaml:13:3: clusters.shoot-a.token_review: agent_auth mtls_and_token needs the kube-apiserver that reviews \
             the agents' tokens (not in the file: shown at clusters.shoot-a)",
        ] {
            assert!(e.iter().any(|p| p.starts_with(want)), "{want}: {e:#?}");
        }
        assert_eq!(e.len(), 8, "{e:#?}");
    }

    #[test]
    fn a_second_document_is_named_as_such() {
        let e = problems(&format!("{AGENTS}---\n{AGENTS}"));
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].starts_with("s.yaml:4:"), "{e:#?}");
        assert!(e[0].contains("second YAML document") && e[0].contains("split the file"), "{e:#?}");
        assert!(!e[0].contains("from_multiple") && !e[0].contains("from_str"), "{e:#?}");
    }

    #[test]
    fn null_sections_mean_absent() {
        let y = format!(
            "admin: null\ntimeouts: null\nlimits:\nfrontends: null\nclusters: null\n{AGENTS}  keepalive: null\n"
        );
        let c = parse(&y, "s.yaml").unwrap();
        assert_eq!(c.admin, crate::common::AdminConfig::on(9902));
        assert_eq!(c.timeouts, super::Timeouts::default());
        assert!(c.frontends.is_empty());
    }

    #[test]
    fn structural_errors_name_their_key() {
        let e = problems(&format!("{AGENTS}  keepalive: {{ intervall: 1s }}\n"));
        assert!(e[0].contains("agents.keepalive.intervall: unknown field"), "{e:#?}");
        let e = problems("agents:\n  listen: 127.0.0.1:1\n");
        assert!(e[0].contains(": agents: missing field `tls`"), "{e:#?}");
    }
}

#[cfg(test)]
mod document_edges {
    use super::parse;

    const AGENTS: &str = "agents:\n  listen: 127.0.0.1:1\n  tls: { cert: c, key: k, client_ca: ca }\n";

    #[test]
    fn explicit_start_and_trailing_separator() {
        assert!(parse(&format!("---\n{AGENTS}"), "s.yaml").is_ok());
        assert!(parse(&format!("# comment\n---\n{AGENTS}"), "s.yaml").is_ok());
        assert!(parse(&format!("{AGENTS}---\n"), "s.yaml").is_ok(), "an empty document after the config");
        assert!(parse(&format!("{AGENTS}---\n# nothing\n---\n"), "s.yaml").is_ok());
        assert!(parse(&format!("{AGENTS}...\n"), "s.yaml").is_ok());
        let e = parse(&format!("{AGENTS}---\n---\n{AGENTS}"), "s.yaml").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml:5:1: a second YAML document"), "{e}");
        assert!(parse(&format!("admin: ~\ntimeouts:\n{AGENTS}"), "s.yaml").is_ok());
    }
}
