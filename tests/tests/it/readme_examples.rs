//! The documentation's YAML examples (README.md and the book under docs/) are real configs: each
//! block marked `<!-- example: NAME (KINDS) -->` parses with the parser of the binary it documents
//! (the annotated "every key" files included), and the third-party examples (kube-apiserver egress
//! selector, Prometheus) carry the fields that connect them to proxy-server.

use serde_json::Value;
use testbed::docs::{documents, example as marked};

/// The YAML of the block marked `name`.
fn example(name: &str) -> String {
    marked(name).yaml
}

fn generic(yaml: &str, what: &str) -> Value {
    serde_saphyr::from_str::<Value>(yaml).unwrap_or_else(|e| panic!("{what} is not valid YAML: {e}\n{yaml}"))
}

fn show<E: std::fmt::Display>(r: Result<impl Sized, E>, what: &str, yaml: &str) {
    if let Err(e) = r {
        panic!("{what} does not parse:\n{e}\n--- the block ---\n{yaml}");
    }
}

#[test]
fn p2_proxy_protocol_example() {
    let docs = documents(&example("p2-proxy-protocol"));
    assert_eq!(docs.len(), 2, "agent part, then router part");
    let agent = seedgate_config::agent::parse(&docs[0], "docs p2-proxy-protocol (agent)")
        .unwrap_or_else(|e| panic!("{e}\n{}", docs[0]));
    let ap = agent.apiserver_proxy.as_deref().expect("the agent part configures apiserver_proxy");
    assert_eq!(ap.mode, seedgate_config::agent::Mode::ProxyProtocolV2);
    let router = seedgate_config::router::parse(&docs[1], "docs p2-proxy-protocol (router)")
        .unwrap_or_else(|e| panic!("{e}\n{}", docs[1]));
    let l = &router.listeners[0];
    assert_eq!(l.proxy_protocol, seedgate_config::router::ProxyProtocolMode::Required);
    // The router's destination route names the address the agent listens on.
    let listen = ap.listen[0].socket_addr().expect("the agent listens on ip:port");
    assert!(
        l.routes.iter().any(|r| r.destination.iter().any(|d| d.matches_ip_port(listen.ip(), listen.port()))),
        "a destination route must match the agent's listen address {listen}"
    );
}

#[test]
fn p2_http_connect_example() {
    let docs = documents(&example("p2-http-connect"));
    assert_eq!(docs.len(), 2, "agent part, then router part");
    let agent = seedgate_config::agent::parse(&docs[0], "docs p2-http-connect (agent)")
        .unwrap_or_else(|e| panic!("{e}\n{}", docs[0]));
    let ap = agent.apiserver_proxy.as_deref().expect("the agent part configures apiserver_proxy");
    assert_eq!(ap.mode, seedgate_config::agent::Mode::HttpConnect);
    let dest = ap.destination.clone().expect("http-connect needs destination");
    let router = seedgate_config::router::parse(&docs[1], "docs p2-http-connect (router)")
        .unwrap_or_else(|e| panic!("{e}\n{}", docs[1]));
    let routes = &router.listeners[0].routes;
    // The agent's header value is one the router lists, under the same header name.
    assert!(
        routes.iter().any(|r| r.connect.as_ref().is_some_and(|c| {
            c.header.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(&ap.destination_header))
                && c.values.contains(&dest)
        })),
        "no CONNECT route lists {dest:?}"
    );
    // The reversed-VPN route's regex matches the value OpenVPN sends.
    let vpn = routes.iter().find_map(|r| r.connect.as_ref().filter(|c| c.header.as_deref() == Some("Reversed-VPN")));
    let re = vpn.and_then(|c| c.regex.clone()).expect("a Reversed-VPN regex route");
    let re = regex_lite_match(&re, "outbound|1194||vpn-seed-server.shoot--a.svc.cluster.local");
    assert!(re, "the Reversed-VPN regex must match the OpenVPN header value");
}

/// Tiny matcher for the example's regex, which only escapes `|` and `.`: compare it with the
/// value after unescaping (keeps the regex crate out of the test dependencies).
fn regex_lite_match(re: &str, value: &str) -> bool {
    let mut out = String::new();
    let mut chars = re.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '|' | '.' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '^' | '$' => return false,
            c => out.push(c),
        }
    }
    out == value
}

#[test]
fn config_references_parse() {
    let y = example("reference-sni-router");
    show(seedgate_config::router::parse(&y, "docs reference-sni-router"), "the sni-router reference", &y);
    let y = example("reference-proxy-agent");
    show(seedgate_config::agent::parse(&y, "docs reference-proxy-agent"), "the proxy-agent reference", &y);
    let y = example("reference-proxy-server");
    show(seedgate_config::server::parse(&y, "docs reference-proxy-server"), "the proxy-server reference", &y);
}

#[test]
fn per_shoot_file_examples_parse() {
    let routes = seedgate_config::router::parse_route_file(&example("route-file"), "route-file").unwrap();
    assert_eq!(routes[0].listener.as_deref().map(String::as_str), Some("gateway"));
    let clusters = seedgate_config::server::parse_cluster_file(&example("cluster-file"), "cluster-file").unwrap();
    assert!(clusters.contains_key("shoot-b"));
}

#[test]
fn egress_selector_example() {
    let v = generic(&example("egress-selector"), "egress-selector");
    assert_eq!(v["kind"], "EgressSelectorConfiguration");
    assert_eq!(v["apiVersion"], "apiserver.k8s.io/v1beta1");
    let sel = &v["egressSelections"][0];
    assert_eq!(sel["name"], "cluster");
    assert_eq!(sel["connection"]["proxyProtocol"], "HTTPConnect");
    let uds = sel["connection"]["transport"]["uds"]["udsName"].as_str().expect("uds.udsName");
    assert!(uds.starts_with('/') && uds.ends_with(".sock"), "{uds}");
    // The socket is one a proxy-server front end can listen on (the reference's example path).
    let server_ref = example("reference-proxy-server");
    assert!(server_ref.contains(uds), "the proxy-server reference should show unix: {uds}");
}

/// The mTLS TCP variant: an `https://` URL whose port a TLS front end of the accompanying proxy-server
/// config listens on, the three `tlsConfig` files, and a front end that takes the cluster from the
/// client certificate (the rule the guide states next to it).
#[test]
fn egress_selector_tcp_example() {
    let v = generic(&example("egress-selector-tcp"), "egress-selector-tcp");
    assert_eq!(v["kind"], "EgressSelectorConfiguration");
    assert_eq!(v["apiVersion"], "apiserver.k8s.io/v1beta1");
    let sel = &v["egressSelections"][0];
    assert_eq!(sel["name"], "cluster");
    assert_eq!(sel["connection"]["proxyProtocol"], "HTTPConnect");
    let tcp = &sel["connection"]["transport"]["tcp"];
    assert!(sel["connection"]["transport"]["uds"].is_null(), "one transport only");
    let url = tcp["url"].as_str().expect("transport.tcp.url");
    let hostport = url.strip_prefix("https://").expect("an mTLS front end: https://");
    let (host, port) = hostport.rsplit_once(':').expect("host:port");
    let port: u16 = port.parse().expect("a port");
    assert!(!host.is_empty() && !host.contains('/'), "{url}");
    for k in ["caBundle", "clientCert", "clientKey"] {
        let f = tcp["tlsConfig"][k].as_str().unwrap_or_else(|| panic!("tlsConfig.{k}"));
        assert!(f.starts_with('/'), "tlsConfig.{k}: {f}");
    }
    let y = example("egress-tcp-frontend");
    let c = seedgate_config::server::parse(&y, "docs egress-tcp-frontend").unwrap_or_else(|e| panic!("{e}\n{y}"));
    let fe = c
        .frontends
        .iter()
        .find(|f| f.listen.as_ref().is_some_and(|l| l.port == port))
        .unwrap_or_else(|| panic!("no front end of egress-tcp-frontend listens on port {port} ({url})"));
    let tls = fe.tls.as_ref().expect("the front end behind an https:// URL has tls");
    assert!(tls.client_ca.is_some(), "kube-apiserver's clientCert needs the front end's tls.client_ca");
    assert!(fe.cluster.is_none(), "the example shows the client certificate's CN naming the cluster");
    // The front end's certificate is named for the URL's host.
    assert!(y.contains(&format!("SANs: {host}")), "the example says the front end's SANs include {host}");
}

#[test]
fn unix_socket_examples() {
    let y = example("unix-frontend");
    let c = seedgate_config::server::parse(&y, "docs unix-frontend").unwrap_or_else(|e| panic!("{e}\n{y}"));
    let f = &c.frontends[0];
    assert_eq!(f.unix_mode, Some(seedgate_config::FileMode(0o660)));
    let group = f.unix_group.clone().expect("unix_group");
    let dir = f.unix.as_deref().and_then(|p| p.rsplit_once('/')).map(|(d, _)| d.to_owned()).expect("unix path");
    // The pod fragment mounts one emptyDir at the socket's directory in both containers, and its
    // fsGroup is the socket's group.
    let pod = generic(&example("unix-socket-pod"), "unix-socket-pod");
    assert_eq!(pod["spec"]["securityContext"]["fsGroup"].as_u64().map(|g| g.to_string()), Some(group));
    let vol = pod["spec"]["volumes"][0]["name"].as_str().expect("a volume");
    assert!(pod["spec"]["volumes"][0]["emptyDir"].is_object(), "an emptyDir");
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2);
    for c in containers {
        let m = &c["volumeMounts"][0];
        assert_eq!((m["name"].as_str(), m["mountPath"].as_str()), (Some(vol), Some(dir.as_str())), "{c}");
    }
}

#[test]
fn prometheus_proxy_url_example() {
    let v = generic(&example("prometheus-proxy-url"), "prometheus-proxy-url");
    let job = &v["scrape_configs"][0];
    let url = job["proxy_url"].as_str().expect("proxy_url");
    assert!(url.starts_with("http://") && url.rsplit(':').next().is_some_and(|p| p.parse::<u16>().is_ok()), "{url}");
    let target = job["static_configs"][0]["targets"][0].as_str().expect("a target");
    assert!(target.parse::<std::net::SocketAddr>().is_ok(), "{target}");
}

/// The Prometheus example with proxy credentials: its user name is a cluster name, its port that of a
/// front end of the accompanying config that takes the cluster from the credentials.
#[test]
fn proxy_credentials_examples() {
    let y = example("proxy-credentials-frontend");
    let c =
        seedgate_config::server::parse(&y, "docs proxy-credentials-frontend").unwrap_or_else(|e| panic!("{e}\n{y}"));
    let v = generic(&example("prometheus-proxy-credentials"), "prometheus-proxy-credentials");
    let url = v["scrape_configs"][0]["proxy_url"].as_str().expect("proxy_url");
    let rest = url.strip_prefix("http://").expect("http:// proxy_url");
    let (userinfo, hostport) = rest.split_once('@').expect("user:password@ in proxy_url");
    let (user, password) = userinfo.split_once(':').expect("user:password");
    assert!(seedgate_config::server::valid_cluster_name(user) && !password.is_empty(), "{url}");
    let port: u16 = hostport.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("a port");
    let fe = c
        .frontends
        .iter()
        .find(|f| f.listen.as_ref().is_some_and(|l| l.port == port))
        .expect("a front end on the port");
    assert_eq!(fe.cluster_from, seedgate_config::server::ClusterFrom::ProxyAuthorization);
    assert!(fe.cluster.is_none() && fe.proxy_token_file.is_some());
}

/// The walk-through's three configs: each is one whole document for its binary's parser, and they
/// are wired together as a seed is: the agent dials sni-router's tunnel listener with the SNI its
/// route passes through to proxy-server's agents listener, and its apiserver proxy sends the header
/// value a gateway route lists.
#[test]
fn walkthrough_configs() {
    let whole = |name: &str| {
        let y = example(name);
        assert_eq!(documents(&y).len(), 1, "{name} must be one YAML document (copied whole into one file)");
        y
    };
    let (server_y, router_y, agent_y) =
        (whole("walkthrough-proxy-server"), whole("walkthrough-sni-router"), whole("walkthrough-proxy-agent"));
    let server = seedgate_config::server::parse(&server_y, "docs walkthrough-proxy-server")
        .unwrap_or_else(|e| panic!("{e}\n{server_y}"));
    let router = seedgate_config::router::parse(&router_y, "docs walkthrough-sni-router")
        .unwrap_or_else(|e| panic!("{e}\n{router_y}"));
    let agent = seedgate_config::agent::parse(&agent_y, "docs walkthrough-proxy-agent")
        .unwrap_or_else(|e| panic!("{e}\n{agent_y}"));

    let tunnel = agent.tunnel.as_deref().expect("the agent configures tunnel");
    let server_name = tunnel.tls.server_name.clone().expect("tunnel.tls.server_name");
    let dialled = tunnel.servers[0].to_string();
    let via = router.listeners.iter().find(|l| l.listen.to_string() == dialled).unwrap_or_else(|| {
        panic!("the agent dials {dialled}, which is no sni-router listener (it must not dial proxy-server directly)")
    });
    let route =
        via.routes.iter().find(|r| r.sni.contains(&server_name)).unwrap_or_else(|| {
            panic!("sni-router listener {} has no route for the agent's SNI {server_name}", *via.name)
        });
    assert_eq!(
        route.upstreams.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [server.agents.listen.to_string()],
        "the tunnel route passes through to proxy-server's agents listener"
    );

    let ap = agent.apiserver_proxy.as_deref().expect("the agent configures apiserver_proxy");
    let dest = ap.destination.clone().expect("http-connect needs destination");
    let gateway = router.listeners.iter().find(|l| l.listen == ap.gateway).expect("the agent's gateway is a listener");
    assert!(
        gateway.routes.iter().any(|r| r.connect.as_ref().is_some_and(|c| c.values.contains(&dest))),
        "no CONNECT route on {} lists {dest:?}",
        *gateway.name
    );

    // Every fixed port is used once, so the processes can run side by side.
    let mut ports = vec![server.agents.listen.port];
    ports.extend(server.frontends.iter().filter_map(|f| f.listen.as_ref().map(|l| l.port)));
    ports.extend(router.listeners.iter().map(|l| l.listen.port));
    ports.extend(ap.listen.iter().map(|l| l.port));
    ports.extend([&server.admin, &router.admin, &agent.admin].iter().filter_map(|a| a.listen.as_ref().map(|l| l.port)));
    let mut unique = ports.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ports.len(), "a port is used twice: {ports:?}");
}

/// The book's table of contents (docs/SUMMARY.md) lists every page of the book once, and nothing
/// else: a page is never left out of the book, nor listed twice.
#[test]
fn contents_lists_every_page_once() {
    let summary = testbed::docs::read("docs/SUMMARY.md");
    let mut listed: Vec<String> =
        testbed::docs::links(&summary).into_iter().map(|(_, t)| format!("docs/{t}")).collect();
    let mut pages: Vec<String> = testbed::docs::markdown_files()
        .into_iter()
        .map(|p| p.display().to_string())
        .filter(|p| p.starts_with("docs/") && p != "docs/SUMMARY.md")
        .collect();
    listed.sort();
    let twice: Vec<&String> = listed.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    assert!(twice.is_empty(), "docs/SUMMARY.md lists these twice: {twice:?}");
    pages.sort();
    assert_eq!(listed, pages, "docs/SUMMARY.md must list every page under docs/ (and only those)");
}
