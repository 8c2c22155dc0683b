//! Tests of `router`.

use super::*;

const CONTRACT: &str = r#"
admin: { listen: 127.0.0.1:9901 }
timeouts: { handshake: 5s, connect: 5s, idle: 1h }   # handshake = whole pre-routing phase
drain_grace: 30s
listeners:
  - name: gateway
    listen: 0.0.0.0:443
    proxy_protocol: off              # off | optional | required
    trusted_proxies: []              # CIDRs allowed to send PROXY headers
    default_route: null              # name of the route for unmatched connections, or null
    routes:
      - name: shoot-a-api
        sni: [api.shoot-a.example.com, "*.shoot-a.internal.example.com"]
        upstreams: [10.0.1.5:443]
        send_proxy_protocol: off     # off | v1 | v2
        allowed_sources: []          # empty = any; CIDRs matched on the real client address
        drain_deadline: 30s          # live connections of a changed or removed route end after this
      - name: shoot-a-legacy
        destination: [10.1.2.3/32:443]                  # PROXY header destination
        upstreams: [10.0.1.5:443]
      - name: shoot-a-connect
        connect: { header: X-Gardener-Destination,
                   values: ["outbound|443||kube-apiserver.shoot--a.svc.cluster.local"] }
        upstreams: [10.0.1.5:443]
"#;

#[test]
fn default_client_hello_cap_is_one_maximal_record_on_the_wire() {
    let c = parse("listeners: [{ name: a, listen: 127.0.0.1:1 }]\n", "f.yaml").unwrap();
    assert_eq!(c.limits.client_hello_max, 16389);
    assert_eq!(c.limits.client_hello_max, CLIENT_HELLO_ONE_RECORD);
    let c = parse("limits: { client_hello_max: 16389 }\nlisteners: [{ name: a, listen: 127.0.0.1:1 }]\n", "f.yaml")
        .unwrap();
    assert_eq!(c.limits, Limits::default());
}

#[test]
fn design_contract_example_parses() {
    let c = parse(CONTRACT, "router.yaml").unwrap();
    assert_eq!(c.listeners[0].routes.len(), 3);
    assert_eq!(c.listeners[0].routes[0].drain_deadline, Some(Dur::secs(30)));
    assert_eq!(c.listeners[0].routes[1].destination[0].port, Some(443));
    assert_eq!(c.timeouts.idle, Dur::secs(3600));
}

#[test]
fn pending_budget_keys_defaults_and_bounds() {
    let c = parse("listeners: [{ name: a, listen: 127.0.0.1:1 }]\n", "f.yaml").unwrap();
    assert_eq!(
        (c.limits.max_pending, c.limits.pending_per_source, c.limits.source_prefix_v4, c.limits.source_prefix_v6),
        (2000, 64, 32, 64)
    );
    assert_eq!(c.timeouts.handshake_floor, Dur::millis(500));
    let y = "limits: { max_pending: 10, pending_per_source: 0, source_prefix_v4: 24, source_prefix_v6: 48 }\ntimeouts: { handshake_floor: 1s }\nlisteners: [{ name: a, listen: 127.0.0.1:1 }]\n";
    let c = parse(y, "f.yaml").unwrap();
    assert_eq!((c.limits.max_pending, c.limits.pending_per_source), (10, 0));
    assert_eq!(c.timeouts.handshake_floor, Dur::secs(1));
    let e = problems(
        "limits: { max_pending: 0, source_prefix_v4: 33, source_prefix_v6: 129 }\ntimeouts: { handshake_floor: 0s }\nlisteners: [{ name: a, listen: 127.0.0.1:1 }]\n",
    );
    for key in ["limits.max_pending", "limits.source_prefix_v4", "limits.source_prefix_v6", "timeouts.handshake_floor"]
    {
        assert!(e.iter().any(|p| p.contains(key)), "{key}: {e:#?}");
    }
}

fn problems(yaml: &str) -> Vec<String> {
    match parse(yaml, "f.yaml") {
        Ok(_) => vec![],
        Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn unknown_field_names_line_and_field() {
    let e = problems("listeners:\n  - name: a\n    listen: 127.0.0.1:1\n    routez: []\n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("f.yaml:4:5"), "{e:?}");
    assert!(e[0].contains("unknown field `routez`"), "{e:?}");
}

#[test]
fn semantic_errors_are_all_reported_with_lines() {
    let y = "listeners:\n  - name: a\n    listen: 127.0.0.1:1\n    default_route: nope\n    routes:\n      - name: r\n        sni: [a.example, 'bad name']\n        upstreams: []\n      - name: r\n        sni: [A.example.]\n        upstreams: [x:1]\n";
    let e = problems(y);
    assert!(e.iter().any(|p| p.contains("f.yaml:8:9: listeners[0].routes[0].upstreams")), "{e:#?}");
    assert!(e.iter().any(|p| p.contains("f.yaml:7:26: listeners[0].routes[0].sni[1]")), "{e:#?}");
    assert!(e.iter().any(|p| p.contains("f.yaml:9:15: listeners[0].routes[1].name: duplicate")), "{e:#?}");
    assert!(
        e.iter().any(|p| p.contains("f.yaml:10:15: listeners[0].routes[1].sni[0]") && p.contains("another route")),
        "{e:#?}"
    );
    assert!(e.iter().any(|p| p.contains("f.yaml:4:20: listeners[0].default_route: no route")), "{e:#?}");
}

#[test]
fn bad_values_are_located() {
    let e = problems("timeouts: { handshake: 5 }\nlisteners: []\n");
    assert!(e[0].starts_with("f.yaml:1:"), "{e:?}");
    assert!(e[0].contains("invalid duration"), "{e:?}");
    let e = problems("listeners:\n  - name: a\n    listen: nowhere\n");
    assert!(e[0].starts_with("f.yaml:3:"), "{e:?}");
    let e = problems("listeners:\n  - name: a\n    listen: 127.0.0.1:1\n    proxy_protocol: maybe\n");
    assert!(e[0].contains("unknown variant"), "{e:?}");
}

#[test]
fn proxy_protocol_needs_trusted_peers() {
    let e = problems("listeners:\n  - name: a\n    listen: 127.0.0.1:1\n    proxy_protocol: required\n");
    assert!(e[0].contains("trusted_proxies"), "{e:?}");
}

#[test]
fn sni_patterns() {
    assert_eq!(normalize_sni_pattern("API.Example.COM.").as_deref(), Some("api.example.com"));
    assert_eq!(normalize_sni_pattern("*.x.y").as_deref(), Some("*.x.y"));
    assert_eq!(normalize_sni_pattern("a.*.y"), None);
    assert_eq!(normalize_sni_pattern("*"), None);
    assert_eq!(normalize_sni_pattern("a..b"), None);
}

const FILE_MAIN: &str = "listeners:\n  - name: gw\n    listen: 127.0.0.1:1\n    routes:\n      - name: main\n        sni: [main.example]\n        upstreams: [x:1]\n";

#[test]
fn route_files_are_validated_alone_then_cross_checked() {
    let main = parse(FILE_MAIN, "router.yaml").unwrap();
    let mut claims = Claims::of_config(&main, "router.yaml");
    let a = parse_route_file(
        "routes:\n  - listener: gw\n    name: a\n    sni: [a.example]\n    upstreams: [x:1]\n",
        "a.yaml",
    )
    .unwrap();
    claims.check(&a, "a.yaml").unwrap();
    claims.insert(&a, "a.yaml");
    // The same file again (changed in place) does not collide with itself.
    claims.check(&a, "a.yaml").unwrap();
    let b = "routes:\n  - listener: gw\n    name: a\n    sni: [main.example, b.example]\n    upstreams: [x:1]\n  - listener: nope\n    name: c\n    sni: [c.example]\n    upstreams: [x:1]\n";
    let e = claims.check(&parse_route_file(b, "b.yaml").unwrap(), "b.yaml").unwrap_err().to_string();
    assert!(e.contains("b.yaml:3:11: routes[0].name: route \"a\" of listener \"gw\" is already in a.yaml"), "{e}");
    assert!(e.contains("routes[0].sni[0]: \"main.example\" is routed by a route in router.yaml"), "{e}");
    assert!(e.contains("b.yaml:6:15: routes[1].listener: no listener named \"nope\""), "{e}");
    claims.remove(&a, "a.yaml");
    let b = "routes:\n  - listener: gw\n    name: a\n    sni: [b.example]\n    upstreams: [x:1]\n";
    claims.check(&parse_route_file(b, "b.yaml").unwrap(), "b.yaml").unwrap();
}

#[test]
fn route_file_problems() {
    let e =
        parse_route_file("routes:\n  - name: a\n    sni: [a.example]\n    upstreams: [x:1]\n", "f.yaml").unwrap_err();
    assert!(e.to_string().contains("f.yaml:2:5: routes[0].listener: name the listener this route belongs to (not in the file: shown at routes[0])"), "{e}");
    let y = "routes:\n  - listener: gw\n    name: a\n    sni: [a.example]\n    upstreams: [x:1]\n  - listener: gw\n    name: a\n    sni: [a.example]\n    upstreams: []\n";
    let e = parse_route_file(y, "f.yaml").unwrap_err().to_string();
    assert!(e.contains("f.yaml:7:11: routes[1].name: duplicate route name"), "{e}");
    assert!(e.contains("routes[1].sni[0]"), "{e}");
    assert!(e.contains("routes[1].upstreams"), "{e}");
    assert!(parse_route_file("routez: []\n", "f.yaml").is_err());
    assert!(parse_route_file("", "f.yaml").unwrap().is_empty());
    let e = problems(
        "listeners:\n  - name: a\n    listen: 127.0.0.1:1\n    routes:\n      - name: r\n        listener: a\n        sni: [a.example]\n        upstreams: [x:1]\n",
    );
    assert!(e.iter().any(|p| p.contains("routes[0].listener: only routes in the files")), "{e:?}");
}

#[test]
fn udp_listeners_default_keys_and_bounds() {
    let c = parse("listeners: [{ name: a, listen: 127.0.0.1:1 }]\n", "f.yaml").unwrap();
    assert_eq!(c.listeners[0].protocol, ListenerProtocol::Tcp);
    assert_eq!((c.limits.udp_flows, c.limits.udp_socket_buffer), (10_000, 4 * 1024 * 1024));
    assert_eq!(c.timeouts.udp_idle, Dur::secs(30));
    // TCP and UDP on the same port are two listeners, not a collision.
    let y = "limits: { udp_flows: 5, udp_socket_buffer: 65536 }\ntimeouts: { udp_idle: 2m }\nlisteners:\n  - { name: t, listen: 127.0.0.1:443 }\n  - name: q\n    listen: 127.0.0.1:443\n    protocol: udp\n    default_route: d\n    routes:\n      - { name: r, sni: [a.example], upstreams: [x:443], allowed_sources: [10.0.0.0/8] }\n      - { name: d, upstreams: [y:443] }\n";
    let c = parse(y, "f.yaml").unwrap();
    assert_eq!(c.listeners[1].protocol, ListenerProtocol::Udp);
    assert_eq!((c.limits.udp_flows, c.limits.udp_socket_buffer), (5, 65536));
    assert_eq!(c.timeouts.udp_idle, Dur::secs(120));
    let e = problems(
        "limits: { udp_flows: 0, udp_socket_buffer: 1000 }\ntimeouts: { udp_idle: 0s }\nlisteners: [{ name: a, listen: 127.0.0.1:1 }]\n",
    );
    for key in ["limits.udp_flows", "limits.udp_socket_buffer", "timeouts.udp_idle"] {
        assert!(e.iter().any(|p| p.contains(key)), "{key}: {e:#?}");
    }
    let e = problems("listeners:\n  - { name: a, listen: 127.0.0.1:1, protocol: sctp }\n");
    assert!(e[0].contains("unknown variant"), "{e:?}");
    let e = problems(
        "listeners:\n  - { name: a, listen: 127.0.0.1:1, protocol: udp }\n  - { name: b, listen: 127.0.0.1:1, protocol: udp }\n",
    );
    assert!(e.iter().any(|p| p.contains("listeners[1].listen")), "{e:?}");
}

#[test]
fn udp_listeners_refuse_what_quic_cannot_carry() {
    let y = "listeners:\n  - name: q\n    listen: 127.0.0.1:1\n    protocol: udp\n    proxy_protocol: required\n    trusted_proxies: [10.0.0.0/8]\n    max_connections: 5\n    routes:\n      - name: d\n        destination: [10.1.2.3:443]\n        upstreams: [x:1]\n      - name: c\n        connect: { authority: ['k:443'] }\n        upstreams: [x:1]\n      - name: p\n        sni: [p.example]\n        send_proxy_protocol: v2\n        upstreams: [x:1]\n";
    let e = problems(y);
    for key in [
        "listeners[0].proxy_protocol: a udp listener takes no PROXY protocol",
        "listeners[0].max_connections: a udp listener has flows",
        "f.yaml:10:9: listeners[0].routes[0].destination: a udp listener routes by SNI only",
        "listeners[0].routes[1].connect: a udp listener routes by SNI only",
        "listeners[0].routes[2].send_proxy_protocol",
    ] {
        assert!(e.iter().any(|p| p.contains(key)), "{key}: {e:#?}");
    }
    // Route files: checked against the listener's protocol.
    let main = parse("listeners:\n  - { name: q, listen: 127.0.0.1:1, protocol: udp }\n", "router.yaml").unwrap();
    let claims = Claims::of_config(&main, "router.yaml");
    let f = "routes:\n  - { listener: q, name: a, sni: [a.example], upstreams: [x:1] }\n  - { listener: q, name: b, destination: [10.0.0.1:443], upstreams: [x:1] }\n";
    let e = claims.check(&parse_route_file(f, "a.yaml").unwrap(), "a.yaml").unwrap_err().to_string();
    assert!(e.contains("routes[1].destination: listener \"q\" is udp: a udp listener routes by SNI only"), "{e}");
    assert!(!e.contains("routes[0]"), "{e}");
}

#[test]
fn config_serializes_for_the_admin_endpoint() {
    let c = parse(CONTRACT, "router.yaml").unwrap();
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(j["listeners"][0]["routes"][0]["name"], "shoot-a-api");
    assert_eq!(j["timeouts"]["handshake"], "5s");
}
