//! `--check` through the real binaries: every problem of a file reported at once (each naming
//! its key and file), certificate and key files loaded and matched, no socket bound, and a
//! start with the same config failing with the same messages.

use anyhow::Context as _;
use std::path::Path;
use std::process::Command;
use testbed::proc::ensure_built;
use testbed::tunnel_kit::{AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, server_yaml};
use testbed::{TempDir, bin_path};

/// Exit code for an invalid config.
const INVALID: i32 = 2;

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run `bin` with `yaml` as its config file (plus `args`) and wait for it to exit.
fn run(dir: &TempDir, bin: &str, yaml: &str, args: &[&str]) -> anyhow::Result<Outcome> {
    // Tests built in release run the release binaries.
    let p = bin_path(bin)?;
    let profile =
        if p.parent().and_then(Path::file_name).is_some_and(|n| n == "release") { "release" } else { "debug" };
    ensure_built(profile, &[bin])?;
    let cfg = dir.write(&format!("{bin}-{}.yaml", yaml.len()), yaml)?;
    let out = Command::new(bin_path(bin)?)
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .output()
        .with_context(|| format!("running {bin}"))?;
    Ok(Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn check(dir: &TempDir, bin: &str, yaml: &str) -> anyhow::Result<Outcome> {
    run(dir, bin, yaml, &["--check"])
}

/// The problem lines (one per problem) of an invalid config.
fn problems(o: &Outcome) -> Vec<&str> {
    o.stderr.lines().filter(|l| l.contains(".yaml")).collect()
}

fn server(pki: &TunnelPki, fe: &[Fe]) -> String {
    server_yaml(pki, "127.0.0.1:0", fe, "")
}

#[test]
fn a_missing_certificate_file_is_named_by_key_and_path() -> anyhow::Result<()> {
    let dir = TempDir::new("check-missing")?;
    let pki = TunnelPki::new(dir.path())?;
    let missing = dir.join("nowhere/server.crt");
    let yaml = server(&pki, &[]).replace(&pki.agents_cert.0.display().to_string(), &missing.display().to_string());
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 1, "{p:#?}");
    anyhow::ensure!(p[0].contains(": agents.tls.cert: ") && p[0].contains(&missing.display().to_string()), "{p:#?}");
    // A start with the same config fails the same way, before binding anything.
    let started = run(&dir, "proxy-server", &yaml, &[])?;
    anyhow::ensure!(started.code == INVALID, "exit {}: {}", started.code, started.stderr);
    anyhow::ensure!(problems(&started) == p, "start: {}\ncheck: {}", started.stderr, o.stderr);
    Ok(())
}

#[test]
fn a_missing_or_empty_proxy_token_file_is_named_by_key() -> anyhow::Result<()> {
    let dir = TempDir::new("check-proxy-token")?;
    let pki = TunnelPki::new(dir.path())?;
    let missing = dir.join("nowhere/token");
    let empty = dir.write("empty-token", "\n")?;
    let fe = |name: &str, port: u16, f: &Path| {
        format!(
            "  - name: {name}\n    listen: 127.0.0.1:{port}\n    cluster_from: proxy_authorization\n    proxy_token_file: {}\n",
            f.display()
        )
    };
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[], &(fe("a", 1, &missing) + &fe("b", 2, &empty)));
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 2, "{p:#?}");
    anyhow::ensure!(p[0].contains(": frontends[0].proxy_token_file: ") && p[0].contains("nowhere/token"), "{p:#?}");
    anyhow::ensure!(p[1].contains(": frontends[1].proxy_token_file: ") && p[1].contains("is empty"), "{p:#?}");
    Ok(())
}

#[test]
fn a_key_of_another_certificate_is_refused_in_server_and_agent() -> anyhow::Result<()> {
    let dir = TempDir::new("check-mismatch")?;
    let pki = TunnelPki::new(dir.path())?;
    // The front end presents its own certificate with the agents listener's key.
    let fe = Fe::new("egress", "shoot-a", FeKind::Mtls);
    let (fe_key, agents_key) = (pki.frontend_cert.1.display().to_string(), pki.agents_cert.1.display().to_string());
    let yaml = server(&pki, &[fe]).replace(&format!("key: {fe_key}"), &format!("key: {agents_key}"));
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 1, "{p:#?}");
    anyhow::ensure!(
        p[0].contains(": frontends[0].tls.key: ") && p[0].contains("does not match the certificate"),
        "{p:#?}"
    );
    anyhow::ensure!(p[0].contains(&agents_key), "{p:#?}");

    let o = AgentOpts::new("shoot-a", "127.0.0.1:9", &["127.0.0.0/8"]);
    let yaml = agent_yaml(&pki, &o)?;
    let agent_key = dir.join("agent-shoot-a.key").display().to_string();
    let yaml = yaml.replace(&format!("key: {agent_key}"), &format!("key: {agents_key}"));
    let o = check(&dir, "proxy-agent", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 1 && p[0].contains(": tunnel.tls.key: ") && p[0].contains("does not match"), "{p:#?}");
    Ok(())
}

#[test]
fn a_file_that_is_not_pem_is_refused() -> anyhow::Result<()> {
    let dir = TempDir::new("check-garbage")?;
    let pki = TunnelPki::new(dir.path())?;
    let garbage = dir.write("garbage.pem", "not a certificate\n")?;
    let yaml = server(&pki, &[]).replace(&pki.ca_file.display().to_string(), &garbage.display().to_string());
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(
        p.len() == 1 && p[0].contains(": agents.tls.client_ca: ") && p[0].contains("garbage.pem"),
        "{p:#?}"
    );
    Ok(())
}

#[test]
fn four_bad_durations_are_four_problems() -> anyhow::Result<()> {
    let dir = TempDir::new("check-durations")?;
    let yaml = "timeouts: { handshake: 5, connect: fast, idle: 1 hour and a bit }\ndrain_grace: never\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: r\n        sni: [a.example.com]\n        upstreams: [127.0.0.1:9]\n";
    let o = check(&dir, "sni-router", yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 4, "{p:#?}");
    for key in ["timeouts.handshake", "timeouts.connect", "timeouts.idle", "drain_grace"] {
        anyhow::ensure!(p.iter().any(|l| l.contains(&format!(": {key}: invalid duration"))), "{key}: {p:#?}");
    }
    Ok(())
}

#[test]
fn two_documents_are_refused_with_advice() -> anyhow::Result<()> {
    let dir = TempDir::new("check-documents")?;
    let doc = "listeners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    default_route: r\n    routes:\n      - name: r\n        upstreams: [127.0.0.1:9]\n";
    let o = check(&dir, "sni-router", &format!("{doc}---\n{doc}"))?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 1, "{p:#?}");
    anyhow::ensure!(p[0].contains(":8:1: ") && p[0].contains("split the file"), "{p:#?}");
    anyhow::ensure!(!o.stderr.contains("from_str"), "no library function names: {}", o.stderr);
    Ok(())
}

#[test]
fn null_sections_and_busy_ports_are_fine() -> anyhow::Result<()> {
    let dir = TempDir::new("check-valid")?;
    let pki = TunnelPki::new(dir.path())?;
    // The process being replaced holds the ports: `--check` must not try to bind them.
    let busy = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = busy.local_addr()?.port();
    let yaml = server_yaml(&pki, &format!("127.0.0.1:{port}"), &[Fe::new("egress", "shoot-a", FeKind::Mtls)], "")
        .replace("admin: { listen: 127.0.0.1:0 }\n", "admin: null\ntimeouts: null\nclusters: null\n");
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == 0, "exit {}: {}", o.code, o.stderr);
    anyhow::ensure!(o.stdout.contains("valid"), "{}", o.stdout);
    let agent = agent_yaml(&pki, &AgentOpts::new("shoot-a", format!("127.0.0.1:{port}"), &["10.0.0.0/8"]))?
        .replace("admin: { listen: 127.0.0.1:0 }\n", "admin: null\n");
    let o = check(&dir, "proxy-agent", &agent)?;
    anyhow::ensure!(o.code == 0, "exit {}: {}", o.code, o.stderr);
    Ok(())
}

#[test]
fn bad_values_and_bad_files_are_reported_in_one_run() -> anyhow::Result<()> {
    let dir = TempDir::new("check-all")?;
    let pki = TunnelPki::new(dir.path())?;
    let missing = dir.join("gone.key");
    let yaml = server(&pki, &[])
        .replace(&pki.agents_cert.1.display().to_string(), &missing.display().to_string())
        .replace("interval: 500ms", "interval: soon");
    let o = check(&dir, "proxy-server", &yaml)?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(p.len() == 2, "{p:#?}");
    anyhow::ensure!(p[0].contains(": agents.keepalive.interval: invalid duration"), "{p:#?}");
    anyhow::ensure!(p[1].contains(": agents.tls.key: ") && p[1].contains("gone.key"), "{p:#?}");
    Ok(())
}

/// `(line, column)`, 1-based, of where `text` starts in the first line of `yaml` that has it;
/// with `key: value`, of the value.
fn position(yaml: &str, text: &str) -> anyhow::Result<(usize, usize)> {
    let (n, line) = yaml.lines().enumerate().find(|(_, l)| l.contains(text)).context(text.to_owned())?;
    let skip = text.split_once(": ").map_or(0, |(key, _)| key.len() + 2);
    Ok((n + 1, line.find(text).unwrap_or_default() + skip + 1))
}

/// Problems found after the parse (bounds, rules between keys) point at the line and column of
/// the key they name, in both binaries that share the session keys; one about a key left out
/// (its default) points at its section and says so.
#[test]
fn problems_after_the_parse_point_at_their_lines() -> anyhow::Result<()> {
    let dir = TempDir::new("check-lines")?;
    let pki = TunnelPki::new(dir.path())?;
    let session = |yaml: String| yaml.replace("timeout: 2s }", "timeout: 0s }\n  stream_window: 65534");
    let server = session(server(&pki, &[]))
        + "limits:\n  max_connections: 0\nclusters:\n  shoot-a:\n    state: active\n    agent_auth: mtls_and_token\n";
    let agent = session(agent_yaml(&pki, &AgentOpts::new("shoot-a", "127.0.0.1:1", &["10.0.0.0/8"]))?);
    for (bin, yaml, section) in [("proxy-server", &server, "agents"), ("proxy-agent", &agent, "tunnel")] {
        let o = check(&dir, bin, yaml)?;
        anyhow::ensure!(o.code == INVALID, "{bin}: exit {}: {}", o.code, o.stderr);
        let p = problems(&o);
        let mut want = vec![
            (position(yaml, "timeout: 0s")?, format!("{section}.keepalive.timeout: must be positive")),
            (position(yaml, "stream_window: 65534")?, format!("{section}.stream_window: must be between 65535")),
        ];
        if bin == "proxy-server" {
            want.push((position(yaml, "max_connections: 0")?, "limits.max_connections: must be at least 1".into()));
            want.push((
                position(yaml, "shoot-a:")?,
                "clusters.shoot-a.token_review: agent_auth mtls_and_token needs the kube-apiserver that reviews the \
                 agents' tokens (not in the file: shown at clusters.shoot-a)"
                    .into(),
            ));
        }
        for ((line, column), w) in &want {
            let w = format!(":{line}:{column}: {w}");
            anyhow::ensure!(p.iter().any(|l| l.contains(&w)), "{bin}: {w:?} in {p:#?}");
        }
        anyhow::ensure!(p.len() == want.len(), "{bin}: {p:#?}");
    }
    Ok(())
}

#[test]
fn a_socket_path_taken_by_a_regular_file_is_reported() -> anyhow::Result<()> {
    let dir = TempDir::new("check-socket")?;
    let pki = TunnelPki::new(dir.path())?;
    let taken = dir.write("egress.sock", "not a socket")?;
    let free = dir.join("free.sock");
    let fes =
        [Fe::new("a", "shoot-a", FeKind::Unix(free.clone())), Fe::new("b", "shoot-a", FeKind::Unix(taken.clone()))];
    let o = check(&dir, "proxy-server", &server(&pki, &fes))?;
    anyhow::ensure!(o.code == INVALID, "exit {}: {}", o.code, o.stderr);
    let p = problems(&o);
    anyhow::ensure!(
        p.len() == 1 && p[0].contains(": frontends[1].unix: ") && p[0].contains("is not a socket"),
        "{p:#?}"
    );
    anyhow::ensure!(!free.exists() && std::fs::read_to_string(&taken)? == "not a socket", "--check changed nothing");
    Ok(())
}
