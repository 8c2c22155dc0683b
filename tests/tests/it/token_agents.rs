//! Agents that authenticate with a ServiceAccount token, reviewed by a stand-in kube-apiserver
//! (`authentication.k8s.io/v1` TokenReviews over TLS): sessions over HTTP/2 and QUIC, every
//! refusal with its reason (expired, wrong audience, wrong account, another cluster's token, no
//! token, no such cluster, an unreachable or slow kube-apiserver), the review of live sessions
//! when a token expires or is renewed, and a kube-apiserver that stops answering.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testbed::token_review::TokenReviewer;
use testbed::tunnel_kit::{
    AgentCert, AgentOpts, Dialer, Fe, FeKind, TunnelPki, agent_yaml, echo_line, inproc_agent, inproc_server,
    server_yaml,
};
use testbed::{InProc, TcpEcho, TempDir, metric_value, poll_until};

pub(crate) const DEADLINE: Duration = Duration::from_secs(30);
const TICK: Duration = Duration::from_millis(20);
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
pub(crate) const ACCOUNT: &str = "kube-system/proxy-agent";
pub(crate) const AUDIENCE: &[&str] = &["seedgate"];

pub(crate) fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

/// proxy-server whose agents may come with a token alone (`mtls_or_token`), reviews within
/// `1s`, a front end of shoot-a, and `clusters` as given (YAML lines under `clusters:`).
pub(crate) fn server(pki: &TunnelPki, clusters: &str) -> String {
    server_with(pki, "timeout: 1s", clusters)
}

/// [`server`] with `review` as the keys of `agents.token_review` (flow style, without braces).
pub(crate) fn server_with(pki: &TunnelPki, review: &str, clusters: &str) -> String {
    server_yaml(pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], &format!("clusters:\n{clusters}"))
        .replacen(
            "agents:\n",
            &format!(
                "agents:\n  auth: mtls_or_token\n  quic: {{ listen: 127.0.0.1:0 }}\n  token_review: {{ {review} }}\n"
            ),
            1,
        )
}

/// An agent of `cluster` (named in its config) with the token in `token_file` and no
/// certificate, over `transport`.
pub(crate) fn agent(
    pki: &TunnelPki,
    server: &InProc,
    cluster: &str,
    token_file: &Path,
    transport: &str,
) -> anyhow::Result<String> {
    let listener = if transport == "quic" { "agents-quic" } else { "agents" };
    let mut o = AgentOpts::new(cluster, server.listener(listener)?, &["127.0.0.0/8"]);
    o.cert = AgentCert::None;
    o.tunnel_extra =
        format!("  token_file: {}\n  cluster: {cluster}\n  transport: {transport}\n", token_file.display());
    agent_yaml(pki, &o)
}

pub(crate) fn write_token(dir: &Path, name: &str, token: &str) -> anyhow::Result<PathBuf> {
    let p = dir.join(name);
    let tmp = dir.join(format!("{name}.new"));
    std::fs::write(&tmp, format!("{token}\n"))?;
    std::fs::rename(&tmp, &p)?;
    Ok(p)
}

pub(crate) async fn wait_count(
    server: &InProc,
    name: &str,
    labels: &[(&str, &str)],
    at_least: f64,
) -> anyhow::Result<()> {
    poll_until(DEADLINE, TICK, || async {
        let have = value(&server.metrics(), name, labels);
        anyhow::ensure!(have >= at_least, "{name}{labels:?} = {have}, want at least {at_least}");
        Ok(())
    })
    .await
    .with_context(|| format!("server log:\n{}", server.log()))
}

pub(crate) async fn wait_connected(server: &InProc, cluster: &str, n: f64) -> anyhow::Result<()> {
    poll_until(DEADLINE, TICK, || async {
        let have = value(&server.metrics(), "seedgate_agents_connected", &[("cluster", cluster)]);
        anyhow::ensure!(have == n, "{have} agents of {cluster} connected, want {n}");
        Ok(())
    })
    .await
    .with_context(|| format!("server log:\n{}", server.log()))
}

#[tokio::test]
async fn a_token_agent_carries_streams_over_h2_and_quic_and_the_token_stays_out_of_logs() -> anyhow::Result<()> {
    let dir = TempDir::new("token-agents")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, saddrs) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let echo = TcpEcho::start().await?;
    let fe = Dialer::Tcp(saddrs.listener("egress")?);
    let token = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let file = write_token(dir.path(), "token", &token)?;
    let mut logs = Vec::new();
    for (i, transport) in ["h2", "quic"].into_iter().enumerate() {
        let (a, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &file, transport)?).await?;
        wait_connected(&server, "shoot-a", 1.0).await.with_context(|| a.log())?;
        echo_line(&fe, echo.addr()).await?;
        let m = server.metrics();
        let accepted = value(&m, "seedgate_agent_sessions_total", &[("cluster", "shoot-a"), ("result", "accepted")]);
        anyhow::ensure!(accepted == (i + 1) as f64, "{transport}: {accepted} sessions accepted");
        logs.push(a.log());
        drop(a);
        wait_connected(&server, "shoot-a", 0.0).await?;
    }
    // The first session asked the kube-apiserver; the second reused its answer.
    let m = server.metrics();
    let asked = value(&m, "seedgate_token_reviews_total", &[("cluster", "shoot-a"), ("result", "authenticated")]);
    let cached = value(&m, "seedgate_token_reviews_total", &[("cluster", "shoot-a"), ("result", "cached")]);
    anyhow::ensure!(asked == 1.0 && cached == 1.0 && kas.reviews() == 1, "asked {asked}, cached {cached}");
    let log = server.log();
    anyhow::ensure!(log.contains("account=kube-system/proxy-agent"), "the session's account is logged:\n{log}");
    logs.push(log);
    for l in &logs {
        anyhow::ensure!(!l.contains(&token), "a log carries the token:\n{l}");
    }
    Ok(())
}

#[tokio::test]
async fn every_refused_token_is_counted_with_its_reason_and_the_agent_told_why() -> anyhow::Result<()> {
    let dir = TempDir::new("token-refusals")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas_a = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let kas_b = TokenReviewer::start(&pki.ca, dir.path(), "shoot-b-kas").await?;
    let slow = TokenReviewer::start(&pki.ca, dir.path(), "shoot-slow-kas").await?;
    slow.set_delay(Duration::from_secs(3));
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let gone = kas_a.section("").replace(&kas_a.url(), &format!("https://127.0.0.1:{}", closed.port()));
    let clusters = format!(
        "  shoot-a: {{ agent_auth: token, token_review: {} }}\n  shoot-b: {{ agent_auth: token, token_review: {} }}\n  shoot-gone: {{ agent_auth: token, token_review: {gone} }}\n  shoot-slow: {{ agent_auth: token, token_review: {} }}\n  shoot-certs: {{ agent_auth: mtls }}\n",
        kas_a.section(""),
        kas_b.section(""),
        slow.section("")
    );
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let a_token = kas_a.issue(ACCOUNT, AUDIENCE, HOUR);
    let cases: Vec<(&str, String, &str, &str, &str)> = vec![
        // (named cluster, token, counted as cluster, reason, what proxy-server logs)
        ("shoot-a", kas_a.issue(ACCOUNT, AUDIENCE, Duration::ZERO), "shoot-a", "token_invalid", "token has expired"),
        (
            "shoot-a",
            kas_a.issue(ACCOUNT, &["other"], HOUR),
            "shoot-a",
            "token_invalid",
            "invalid for the target audiences",
        ),
        (
            "shoot-a",
            kas_a.issue("default/nobody", AUDIENCE, HOUR),
            "shoot-a",
            "token_account",
            "system:serviceaccount:default:nobody",
        ),
        ("shoot-b", a_token.clone(), "shoot-b", "token_invalid", "does not authenticate the token"),
        ("shoot-a", String::new(), "shoot-a", "token_required", "set tunnel.token_file"),
        ("shoot-z", a_token.clone(), "-", "token_cluster_unknown", "\"shoot-z\" has no token_review"),
        ("shoot-certs", a_token.clone(), "-", "token_cluster_unknown", "\"shoot-certs\" has no token_review"),
        ("shoot-gone", a_token.clone(), "shoot-gone", "token_review_unavailable", "connect 127.0.0.1"),
        ("shoot-slow", a_token.clone(), "shoot-slow", "token_review_unavailable", "no answer within 1s"),
    ];
    for (i, (named, token, counted, reason, logged)) in cases.into_iter().enumerate() {
        let file = write_token(dir.path(), &format!("token-{i}"), &token)?;
        let (a, _) = inproc_agent(&dir, &agent(&pki, &server, named, &file, "h2")?).await?;
        wait_count(&server, "seedgate_agent_sessions_total", &[("cluster", counted), ("result", reason)], 1.0)
            .await
            .with_context(|| format!("case {i} ({named}, {reason}); agent log:\n{}", a.log()))?;
        // The agent is told the reason; proxy-server's log has the details.
        a.wait_log_line(&["proxy-server refused this agent's session", &format!("{reason}: ")], DEADLINE)
            .await
            .with_context(|| format!("case {i} ({named}, {reason})"))?;
        server
            .wait_log_line(&["agent refused", logged], DEADLINE)
            .await
            .with_context(|| format!("case {i} ({named}, {reason})"))?;
        drop(a);
    }
    let m = server.metrics();
    for cluster in ["shoot-a", "shoot-b", "shoot-gone", "shoot-slow"] {
        let accepted = value(&m, "seedgate_agent_sessions_total", &[("cluster", cluster), ("result", "accepted")]);
        anyhow::ensure!(accepted == 0.0, "{cluster}: {accepted} sessions accepted");
    }
    // Shoot-a's token went to shoot-b's kube-apiserver only because the agent named shoot-b:
    // and there it is nobody's.
    anyhow::ensure!(kas_b.answers().iter().all(|a| a != "authenticated"), "{:?}", kas_b.answers());
    Ok(())
}

#[tokio::test]
async fn a_live_session_is_reviewed_again_when_its_token_expires_or_is_renewed() -> anyhow::Result<()> {
    let dir = TempDir::new("token-rereview")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    // Two agents with tokens that expire in seconds: one renews its token, the other does not.
    let renewing = write_token(dir.path(), "renewing", &kas.issue(ACCOUNT, AUDIENCE, Duration::from_secs(4)))?;
    let lapsing = write_token(dir.path(), "lapsing", &kas.issue(ACCOUNT, AUDIENCE, Duration::from_secs(4)))?;
    let (r, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &renewing, "h2")?).await?;
    let (l, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &lapsing, "quic")?).await?;
    wait_connected(&server, "shoot-a", 2.0).await?;
    let renewed = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    write_token(dir.path(), "renewing", &renewed)?;
    // The renewed token is reviewed as it arrives; the lapsed one at its expiry, and that
    // session ends (its agent, with the same expired token, cannot come back).
    wait_count(
        &server,
        "seedgate_agent_sessions_ended_total",
        &[("cluster", "shoot-a"), ("reason", "token_invalid")],
        1.0,
    )
    .await?;
    l.wait_log_line(&["proxy-server refused this agent's session", "token has expired"], DEADLINE).await?;
    let m = server.metrics();
    let asked = value(&m, "seedgate_token_reviews_total", &[("cluster", "shoot-a"), ("result", "authenticated")]);
    anyhow::ensure!(asked >= 3.0, "{asked} reviews: two sessions and the renewed token");
    wait_connected(&server, "shoot-a", 1.0).await.with_context(|| r.log())?;
    let ended =
        value(&m, "seedgate_agent_sessions_ended_total", &[("cluster", "shoot-a"), ("reason", "token_invalid")]);
    anyhow::ensure!(ended == 1.0, "only the lapsed session ended, not the renewed one ({ended})");

    // A renewed token the kube-apiserver refuses ends the session at once.
    write_token(dir.path(), "renewing", &kas.issue("default/nobody", AUDIENCE, HOUR))?;
    wait_count(
        &server,
        "seedgate_agent_sessions_ended_total",
        &[("cluster", "shoot-a"), ("reason", "token_account")],
        1.0,
    )
    .await?;
    wait_connected(&server, "shoot-a", 0.0).await?;
    Ok(())
}

#[tokio::test]
async fn a_kube_apiserver_that_stops_answering_leaves_live_sessions_and_refuses_new_ones() -> anyhow::Result<()> {
    let dir = TempDir::new("token-unanswered")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, saddrs) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let echo = TcpEcho::start().await?;
    let live = write_token(dir.path(), "live", &kas.issue(ACCOUNT, AUDIENCE, HOUR))?;
    let (_live_agent, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &live, "h2")?).await?;
    wait_connected(&server, "shoot-a", 1.0).await?;

    kas.set_down(true);
    // The live agent's renewed token cannot be reviewed: its session stays.
    write_token(dir.path(), "live", &kas.issue(ACCOUNT, AUDIENCE, HOUR))?;
    let unanswered = [("cluster", "shoot-a"), ("result", "token_review_unavailable")];
    wait_count(&server, "seedgate_token_reviews_total", &unanswered, 1.0).await?;
    // A new agent is refused, saying why.
    let new = write_token(dir.path(), "new", &kas.issue(ACCOUNT, AUDIENCE, HOUR))?;
    let (new_agent, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &new, "quic")?).await?;
    wait_count(&server, "seedgate_agent_sessions_total", &unanswered, 1.0).await?;
    new_agent
        .wait_log_line(&["proxy-server refused this agent's session", "did not review the token"], DEADLINE)
        .await?;
    wait_connected(&server, "shoot-a", 1.0).await?;
    echo_line(&Dialer::Tcp(saddrs.listener("egress")?), echo.addr()).await?;
    let ended = value(
        &server.metrics(),
        "seedgate_agent_sessions_ended_total",
        &[("cluster", "shoot-a"), ("reason", "token_invalid")],
    );
    anyhow::ensure!(ended == 0.0, "a session ended while the kube-apiserver was down");

    // Back: the new agent gets in at its next attempt.
    kas.set_down(false);
    wait_connected(&server, "shoot-a", 2.0).await.with_context(|| new_agent.log())?;
    Ok(())
}

#[tokio::test]
async fn an_emptied_token_file_ends_the_session_and_its_old_token_is_never_presented() -> anyhow::Result<()> {
    let dir = TempDir::new("token-emptied")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let token = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let file = write_token(dir.path(), "token", &token)?;
    let (a, _) = inproc_agent(&dir, &agent(&pki, &server, "shoot-a", &file, "h2")?).await?;
    wait_connected(&server, "shoot-a", 1.0).await?;

    // The file no longer holds a token: the live session ends, and the sessions the agent opens
    // while it is empty present none.
    write_token(dir.path(), "token", "")?;
    let ended = [("cluster", "shoot-a"), ("reason", "token_required")];
    wait_count(&server, "seedgate_agent_sessions_ended_total", &ended, 1.0).await.with_context(|| a.log())?;
    let refused = [("cluster", "shoot-a"), ("result", "token_required")];
    wait_count(&server, "seedgate_agent_sessions_total", &refused, 2.0).await.with_context(|| a.log())?;
    let m = server.metrics();
    let accepted = value(&m, "seedgate_agent_sessions_total", &[("cluster", "shoot-a"), ("result", "accepted")]);
    anyhow::ensure!(accepted == 1.0, "{accepted} sessions accepted while the file was empty:\n{}", server.log());
    anyhow::ensure!(kas.asked() == vec![token.clone()], "{} reviews asked", kas.asked().len());

    // A token again: the next session is admitted with it.
    let renewed = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    write_token(dir.path(), "token", &renewed)?;
    wait_connected(&server, "shoot-a", 1.0).await.with_context(|| a.log())?;
    anyhow::ensure!(kas.asked().iter().filter(|t| **t == token).count() == 1, "the old token was presented again");
    Ok(())
}

#[test]
fn an_agent_whose_token_file_is_missing_or_empty_at_start_does_not_start() -> anyhow::Result<()> {
    testbed::tunnel_kit::ensure_binaries()?;
    let dir = TempDir::new("token-at-start")?;
    let pki = TunnelPki::new(dir.path())?;
    let empty = write_token(dir.path(), "empty", "")?;
    let missing = dir.path().join("nowhere/token");
    for (file, says) in [(&empty, "is empty"), (&missing, "nowhere/token")] {
        let mut o = AgentOpts::new("shoot-a", "127.0.0.1:9", &["127.0.0.0/8"]);
        o.cert = AgentCert::None;
        o.tunnel_extra = format!("  token_file: {}\n  cluster: shoot-a\n", file.display());
        let cfg = dir.write(&format!("agent-{}.yaml", file.display().to_string().len()), &agent_yaml(&pki, &o)?)?;
        let mut child = std::process::Command::new(testbed::bin_path("proxy-agent")?)
            .arg("--config")
            .arg(&cfg)
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let deadline = std::time::Instant::now() + DEADLINE;
        // Bounded by the deadline: a config error exits at once.
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("proxy-agent with {} still runs", file.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().context("stderr")?, &mut stderr)?;
        anyhow::ensure!(status.code() == Some(2), "{status}: {stderr}");
        anyhow::ensure!(stderr.contains("tunnel.token_file") && stderr.contains(says), "{stderr}");
    }
    Ok(())
}
