//! The demo: real seedgate binaries against stand-in kube-apiservers, real TLS clients, and a
//! report of what each client saw. Doubles as a smoke check (false = something expected failed).

use rustls::AlertDescription;
use std::fmt::Write as _;
use std::time::Duration;
use testbed::admin::{http_get, metric_sum};
use testbed::pki::{self, Ca};
use testbed::tls_client::{TlsFailure, http_get_request, tls_request};
use testbed::{Proc, TempDir, TlsHttpBackend, ensure_built, poll_until};

/// The binaries the demo runs; proxy-server and proxy-agent join when their paths are shown.
const BINARIES: &[&str] = &["sni-router"];

const SHOOT_A: &str = "api.shoot-a.example.com";
const SHOOT_B: &str = "api.shoot-b.example.com";
const NOBODY: &str = "api.nobody.example.com";
const CLIENT_CN: &str = "demo-client";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which build of the seedgate binaries to run (built first if missing or stale).
    #[arg(long, default_value = "release", value_parser = ["debug", "release"])]
    profile: String,
    /// Keep the temp dir (certificates, configs, process logs) and print its path.
    #[arg(long)]
    keep: bool,
}

/// Collects check results and prints one line each.
#[derive(Default)]
struct Report {
    failed: Vec<String>,
    passed: usize,
}

impl Report {
    fn heading(&self, title: &str) {
        println!("\n{title}");
    }

    fn check(&mut self, ok: bool, what: &str, saw: &str) {
        println!("  {} {what}: {saw}", if ok { "ok  " } else { "FAIL" });
        if ok {
            self.passed += 1;
        } else {
            self.failed.push(format!("{what}: {saw}"));
        }
    }
}

/// Run the demo; `Ok(false)` when an expected result did not happen.
pub async fn run(args: Args) -> anyhow::Result<bool> {
    let bins = ensure_built(&args.profile, BINARIES)?;
    let router_bin = &bins[0];
    let mut dir = TempDir::new("demo")?;
    if args.keep {
        dir.keep();
    }

    // PKI: one CA signs the stand-in apiservers and the demo client.
    let ca = Ca::new("seedgate demo CA")?;
    let cert_a = ca.server(&[SHOOT_A])?;
    let cert_b = ca.server(&[SHOOT_B])?;
    let client = ca.client(CLIENT_CN)?;
    let backend_a = TlsHttpBackend::start("shoot-a", &cert_a, None).await?;
    // shoot-b requires a client certificate: mTLS runs end to end through the router.
    let backend_b = TlsHttpBackend::start("shoot-b", &cert_b, Some(&ca)).await?;

    let config = format!(
        "\
admin: {{ listen: 127.0.0.1:0 }}
timeouts: {{ handshake: 5s, connect: 2s, idle: 5m }}
drain_grace: 2s
listeners:
  - name: gateway
    listen: 127.0.0.1:0
    routes:
      - name: shoot-a-api
        sni: [{SHOOT_A}]
        upstreams: [{}]
      - name: shoot-b
        sni: [\"*.shoot-b.example.com\"]
        upstreams: [{}]
",
        backend_a.addr(),
        backend_b.addr()
    );
    let config_path = dir.write("sni-router.yaml", &config)?;
    let (mut router, addrs) = Proc::start_seedgate(router_bin, &config_path, &[]).await?;
    let gateway = addrs.listener("gateway")?;
    let admin = addrs.admin()?;

    println!("seedgate demo: sni-router ({})", router_bin.display());
    println!("  router   gateway {gateway}, admin {admin}");
    println!("  backend  shoot-a {} (TLS, {SHOOT_A})", backend_a.addr());
    println!(
        "  backend  shoot-b {} (TLS, {SHOOT_B}, requires a client certificate)",
        backend_b.addr()
    );
    println!("  client   trusts the demo CA, presents CN={CLIENT_CN}, offers ALPN h2, http/1.1");

    let mut r = Report::default();
    // The client offers h2 first; the backends speak http/1.1 only, so seeing http/1.1 shows
    // the negotiation happened with the backend, through the router.
    let cfg = pki::client_config(&ca, Some(&client), &["h2", "http/1.1"])?;

    for (sni, title, backend, mtls) in [
        (SHOOT_A, "exact route shoot-a-api", "shoot-a", false),
        (
            SHOOT_B,
            "wildcard route *.shoot-b.example.com, mTLS to the backend",
            "shoot-b",
            true,
        ),
    ] {
        r.heading(&format!("P1 {sni}  ({title})"));
        match tls_request(gateway, Some(sni), cfg.clone(), &http_get_request(sni, "/version")).await {
            Ok(res) => {
                let cn = res.peer_cn.clone().unwrap_or_default();
                r.check(
                    cn == sni && res.peer_sans.iter().any(|s| s == sni),
                    "certificate",
                    &format!("CN={cn} SAN={}", res.peer_sans.join(",")),
                );
                r.check(
                    res.alpn.as_deref() == Some("http/1.1"),
                    "ALPN",
                    res.alpn.as_deref().unwrap_or("none"),
                );
                let body = res.body();
                let line = body.trim();
                let want_cn = if mtls { CLIENT_CN } else { "-" };
                r.check(
                    res.status() == Some(200)
                        && line.contains(&format!("backend={backend} "))
                        && line.contains(&format!("sni={sni} "))
                        && line.contains(&format!("client_cn={want_cn} ")),
                    "answered by",
                    line,
                );
            }
            Err(e) => r.check(false, "request", &format!("{e:#}")),
        }
    }

    r.heading(&format!("P1 {NOBODY}  (no route)"));
    match tls_request(
        gateway,
        Some(NOBODY),
        cfg.clone(),
        &http_get_request(NOBODY, "/version"),
    )
    .await
    {
        Ok(res) => r.check(
            false,
            "rejected",
            &format!("unexpectedly answered: {}", res.text().trim()),
        ),
        Err(e) => {
            let f = TlsFailure::of(&e);
            r.check(
                f.is_alert(AlertDescription::UnrecognisedName),
                "rejected",
                &f.to_string(),
            );
        }
    }

    r.heading(&format!("metrics  (GET http://{admin}/metrics)"));
    metrics(&mut r, admin).await;

    r.heading("shutdown  (SIGTERM)");
    router.signal(libc::SIGTERM)?;
    match router.wait_exit(Duration::from_secs(15)).await {
        Some(st) => r.check(
            st.success(),
            "exit status",
            &format!("{st}").replace("exit status: ", ""),
        ),
        None => r.check(false, "exit status", "still running 15s after SIGTERM"),
    }

    println!();
    if r.failed.is_empty() {
        println!("demo: all {} checks passed", r.passed);
        Ok(true)
    } else {
        println!(
            "demo: {} of {} checks FAILED:",
            r.failed.len(),
            r.failed.len() + r.passed
        );
        for f in &r.failed {
            println!("  - {f}");
        }
        let mut tail = String::new();
        for l in router
            .log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let _ = writeln!(tail, "    {l}");
        }
        println!("sni-router log (last lines):\n{tail}");
        Ok(false)
    }
}

/// The counters the demo's traffic must have moved: (what, met?).
fn counter_checks(t: &str) -> [(&'static str, bool); 4] {
    let sum = |name, labels: &[(&str, &str)]| metric_sum(t, name, labels);
    [
        (
            "connections counted per route",
            sum(
                "seedgate_connections_total",
                &[("route", "shoot-a-api"), ("result", "ok")],
            ) >= 1.0
                && sum("seedgate_connections_total", &[("route", "shoot-b"), ("result", "ok")]) >= 1.0,
        ),
        (
            "unknown name counted as a reject",
            sum("seedgate_rejects_total", &[]) >= 1.0,
        ),
        (
            "bytes counted both ways",
            sum("seedgate_proxied_bytes_total", &[("direction", "to_upstream")]) > 0.0
                && sum("seedgate_proxied_bytes_total", &[("direction", "to_client")]) > 0.0,
        ),
        // Only routed handshakes are guaranteed an observation; rejects may not be.
        (
            "handshakes timed",
            sum("seedgate_handshake_duration_seconds_count", &[]) >= 2.0,
        ),
    ]
}

/// Print the `seedgate_` series the demo exercised, and check they moved. Counters are updated
/// when a connection closes, which may trail the client by a moment: poll, don't sleep.
async fn metrics(r: &mut Report, admin: std::net::SocketAddr) {
    let polled = poll_until(Duration::from_secs(5), Duration::from_millis(50), || async {
        let (status, text) = http_get(admin, "/metrics").await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        anyhow::ensure!(
            counter_checks(&text).iter().all(|(_, ok)| *ok),
            "counters have not moved yet"
        );
        Ok(text)
    })
    .await;
    // On timeout, judge the last page anyway so the report names what is missing.
    let text = match polled {
        Ok(t) => t,
        Err(e) => match http_get(admin, "/metrics").await {
            Ok((_, t)) => t,
            Err(_) => return r.check(false, "GET /metrics", &format!("{e:#}")),
        },
    };
    print_series(&text);
    for (what, ok) in counter_checks(&text) {
        r.check(ok, what, if ok { "yes" } else { "no" });
    }
}

fn print_series(text: &str) {
    const SHOWN: &[&str] = &[
        "seedgate_connections_total",
        "seedgate_rejects_total",
        "seedgate_proxied_bytes_total",
        "seedgate_handshake_duration_seconds_count",
    ];
    for l in text.lines().filter(|l| SHOWN.iter().any(|s| l.starts_with(s))) {
        println!("       {l}");
    }
}
