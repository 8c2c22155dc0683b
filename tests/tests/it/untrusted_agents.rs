//! What an unauthenticated peer at the agents listener can make proxy-server log or say: a hello
//! whose fields hold newlines, ANSI escapes and 60 KiB reaches the text log escaped and cut,
//! after admission only; a refusal names its reason code and the agent's key to set, never the
//! kube-apiserver's address, a TLS error or what the kube-apiserver answered; the log has those
//! details, naming the config key to fix; a token whose `exp` is out of any range is refused.

use crate::token_agents::{ACCOUNT, AUDIENCE, DEADLINE, HOUR, server, value, wait_count};
use anyhow::Context as _;
use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;
use testbed::raw_agent::{RawAgent, hello, tls};
use testbed::token_review::TokenReviewer;
use testbed::tunnel_kit::{TunnelPki, inproc_server};
use testbed::{InProc, TempDir};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// A log line an attacker would like proxy-server to write.
const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO proxy_server::agents: agent session up peer=10.9.9.9:1 cluster=shoot-b session=999 transport=quic account=kube-system/proxy-agent";

async fn raw(server: &InProc, pki: &TunnelPki, line: &str) -> anyhow::Result<RawAgent> {
    let mut a = RawAgent::connect(server.listener("agents-quic")?, LOCAL, tls(&pki.ca, None)?).await?;
    a.send_line(line).await?;
    Ok(a)
}

/// A hello field an attacker writes: `marker`, a forged log line, ANSI escapes, and 60 KiB.
fn hostile(marker: &str) -> String {
    format!("{marker}\n{FORGED}\n\u{1b}[2J\u{1b}[31mred\u{9b}31m\r{}", "A".repeat(60 * 1024))
}

#[tokio::test]
async fn a_hello_reaches_the_log_escaped_cut_and_only_once_admitted() -> anyhow::Result<()> {
    let dir = TempDir::new("untrusted-hello")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;

    // Refused (a token nobody issued): nothing of its hello is logged at info.
    let refused = raw(&server, &pki, &hello(&hostile("refused-marker"), "shoot-a", "garbage")).await?;
    refused.wait_line("\"type\":\"refused\"", DEADLINE).await?;
    // Naming a cluster that is all of it.
    let named = raw(&server, &pki, &hello("n", &hostile("cluster-marker"), "garbage")).await?;
    named.wait_line("\"type\":\"refused\"", DEADLINE).await?;
    // Admitted: its hello is logged, escaped and cut.
    let token = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let admitted = raw(&server, &pki, &hello(&hostile("admitted-marker"), "shoot-a", &token)).await?;
    admitted.wait_admitted(DEADLINE).await?;
    let up = server.wait_log_line(&["agent hello", "admitted-marker"], DEADLINE).await?;

    let log = server.log();
    for line in log.lines() {
        anyhow::ensure!(!line.starts_with("2026-01-01T00:00:00"), "a forged line in the log:\n{line}");
        anyhow::ensure!(!line.contains(['\u{1b}', '\u{9b}', '\r']), "a raw control character in:\n{line:?}");
        anyhow::ensure!(line.len() < 4096, "a line of {} bytes: {}...", line.len(), line.get(..200).unwrap_or(line));
        let info = line.contains(" INFO ") || line.contains(" WARN ") || line.contains(" ERROR ");
        anyhow::ensure!(!(info && line.contains("refused-marker")), "a refused peer's hello logged:\n{line}");
        // A claimed cluster is the refusal's reason: in it, escaped and cut.
        if info && line.contains("cluster-marker") {
            anyhow::ensure!(
                line.contains("agent refused") && line.contains("cluster-marker\\n2026-01-01") && line.len() < 1024,
                "a claimed cluster logged:\n{line}"
            );
        }
    }
    anyhow::ensure!(up.contains("admitted-marker\\n2026-01-01T00:00:00"), "the node is not escaped: {up}");
    Ok(())
}

#[tokio::test]
async fn a_refusal_names_its_reason_never_an_address_a_tls_error_or_an_answer() -> anyhow::Result<()> {
    let dir = TempDir::new("untrusted-refusals")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let failing = TokenReviewer::start(&pki.ca, dir.path(), "shoot-500-kas").await?;
    failing.set_status(Some((500, "etcd at 10.1.2.3:2379 said SECRET-DETAIL")));
    let leaf_ca = TokenReviewer::start_ca_as_leaf(dir.path(), "shoot-tls-kas").await?;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let gone = kas.section("").replace(&kas.url(), &format!("https://127.0.0.1:{}", closed.port()));
    let clusters = format!(
        "  shoot-a: {{ agent_auth: token, token_review: {} }}\n  shoot-gone: {{ agent_auth: token, token_review: {gone} }}\n  shoot-500: {{ agent_auth: token, token_review: {} }}\n  shoot-tls: {{ agent_auth: token, token_review: {} }}\n",
        kas.section(""),
        failing.section(""),
        leaf_ca.section("")
    );
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let token = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let leaks = [
        "127.0.0.1",
        &closed.port().to_string(),
        "onnect",
        "refused (os error",
        "SECRET-DETAIL",
        "10.1.2.3",
        "CaUsedAsEndEntity",
        "certificate",
        "square/go-jose",
    ];
    // (named cluster, token, the reason told)
    let cases = [
        ("shoot-gone", token.as_str(), "token_review_unavailable"),
        ("shoot-500", token.as_str(), "token_review_unavailable"),
        ("shoot-tls", token.as_str(), "token_review_unavailable"),
        ("shoot-a", "garbage", "token_invalid"),
        ("shoot-a", "", "token_required"),
    ];
    for (cluster, token, reason) in cases {
        let a = raw(&server, &pki, &hello("n", cluster, token)).await?;
        let told = a.wait_line("\"type\":\"refused\"", DEADLINE).await.with_context(|| server.log())?;
        anyhow::ensure!(told.contains(reason), "{cluster}: {told}");
        for leak in leaks {
            anyhow::ensure!(!told.contains(leak), "{cluster}: the refusal tells {leak:?}: {told}");
        }
    }
    // The agent's key to set, where it is the agent's to fix.
    let a = raw(&server, &pki, &hello("n", "shoot-a", "")).await?;
    let told = a.wait_line("\"type\":\"refused\"", DEADLINE).await?;
    anyhow::ensure!(told.contains("tunnel.token_file"), "{told}");
    // The details are in proxy-server's log, with what to fix.
    server.wait_log_line(&["shoot-tls", "clusters.shoot-tls.token_review.ca", "CaUsedAsEndEntity"], DEADLINE).await?;
    server.wait_log_line(&["shoot-500", "500", "SECRET-DETAIL"], DEADLINE).await?;
    server.wait_log_line(&["shoot-gone", &closed.port().to_string()], DEADLINE).await?;
    Ok(())
}

#[tokio::test]
async fn a_token_whose_exp_is_out_of_range_is_refused() -> anyhow::Result<()> {
    let dir = TempDir::new("untrusted-exp")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let valid = SystemTime::now() + HOUR;
    let exps = ["9223372036854775808", "18446744073709551615", "1e30", "-1", "\"tomorrow\""];
    for (i, exp) in exps.iter().enumerate() {
        let token = kas.issue_with_exp(ACCOUNT, AUDIENCE, valid, exp);
        let a = raw(&server, &pki, &hello("n", "shoot-a", &token)).await?;
        let told = a.wait_line("\"type\":\"refused\"", DEADLINE).await.with_context(|| server.log())?;
        anyhow::ensure!(told.contains("token_invalid"), "exp {exp}: {told}");
        let refused = [("cluster", "shoot-a"), ("result", "token_invalid")];
        wait_count(&server, "seedgate_agent_sessions_total", &refused, (i + 1) as f64).await?;
    }
    // A float in range is a time like any other.
    let exp = (valid.duration_since(SystemTime::UNIX_EPOCH)?.as_secs() as f64 + 0.5).to_string();
    let a = raw(&server, &pki, &hello("n", "shoot-a", &kas.issue_with_exp(ACCOUNT, AUDIENCE, valid, &exp))).await?;
    a.wait_admitted(DEADLINE).await.with_context(|| server.log())?;
    let accepted =
        value(&server.metrics(), "seedgate_agent_sessions_total", &[("cluster", "shoot-a"), ("result", "accepted")]);
    anyhow::ensure!(accepted == 1.0, "{accepted} accepted");
    Ok(())
}
