//! A token session's renewals and re-reviews, driven by an agent written by hand (any control
//! line) against a stand-in kube-apiserver that answers as a real one does: an empty renewal
//! ends the session, the same token again is not reviewed and a burst of renewals costs one
//! review per gap, a `4xx` ends the session, an unanswered review (`401`, `403`, `429`, `5xx`)
//! keeps it only within the grace past its token's `exp`, a reload's rules apply at the next
//! review, refused tokens are not asked about again within the cache's time, and a flood of
//! unauthenticated reviews from one source leaves live sessions and other sources theirs.

use crate::token_agents::{ACCOUNT, AUDIENCE, DEADLINE, HOUR, server, server_with, value, wait_connected, wait_count};
use anyhow::Context as _;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testbed::raw_agent::{RawAgent, hello, renewal, tls};
use testbed::token_review::TokenReviewer;
use testbed::tunnel_kit::{TunnelPki, inproc_server};
use testbed::{InProc, TempDir, poll_until};

/// The least time between two reviews of one session (proxy-server's rule, documented in the
/// token-agents guide).
const GAP: Duration = Duration::from_secs(10);
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A hand-written agent from `from`, its hello sent: node `node`, cluster `cluster`, `token`.
async fn raw(server: &InProc, pki: &TunnelPki, from: IpAddr, cluster: &str, token: &str) -> anyhow::Result<RawAgent> {
    let mut a = RawAgent::connect(server.listener("agents-quic")?, from, tls(&pki.ca, None)?).await?;
    a.send_line(&hello("raw-node", cluster, token)).await?;
    Ok(a)
}

fn renewals(server: &InProc, cluster: &str, result: &str) -> f64 {
    value(&server.metrics(), "seedgate_token_renewals_total", &[("cluster", cluster), ("result", result)])
}

#[tokio::test]
async fn an_empty_renewal_ends_the_session_without_a_review() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-empty")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let token = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let mut a = raw(&server, &pki, LOCAL, "shoot-a", &token).await?;
    a.wait_admitted(DEADLINE).await.with_context(|| server.log())?;
    wait_connected(&server, "shoot-a", 1.0).await?;

    // The agent has no token any more: the session ends, told why, and nothing is reviewed.
    a.send_line(&renewal("")).await?;
    let ended = [("cluster", "shoot-a"), ("reason", "token_required")];
    wait_count(&server, "seedgate_agent_sessions_ended_total", &ended, 1.0).await?;
    let told = a.wait_line("\"type\":\"refused\"", DEADLINE).await?;
    anyhow::ensure!(told.contains("token_required") && told.contains("tunnel.token_file"), "{told}");
    a.wait_closed(DEADLINE).await?;
    wait_connected(&server, "shoot-a", 0.0).await?;
    anyhow::ensure!(kas.asked() == vec![token], "reviews asked: {:?}", kas.asked().len());
    anyhow::ensure!(renewals(&server, "shoot-a", "empty") == 1.0, "{}", server.metrics());
    Ok(())
}

#[tokio::test]
async fn the_same_token_is_not_reviewed_again_and_a_burst_costs_one_review_per_gap() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-burst")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters)).await?;
    let first = kas.issue(ACCOUNT, AUDIENCE, HOUR);
    let mut a = raw(&server, &pki, LOCAL, "shoot-a", &first).await?;
    a.wait_admitted(DEADLINE).await?;
    let admitted = Instant::now();

    for _ in 0..5 {
        a.send_line(&renewal(&first)).await?;
    }
    let burst: Vec<String> = (0..20).map(|_| kas.issue(ACCOUNT, AUDIENCE, HOUR)).collect();
    for t in &burst {
        a.send_line(&renewal(t)).await?;
    }
    // Every renewal is counted as it comes: the same token as unchanged, the others as
    // reviewed at once, deferred (too soon after the last review), or superseded (replaced by
    // a later one before it was looked at).
    poll_until(DEADLINE, Duration::from_millis(20), || async {
        let counted: f64 =
            ["unchanged", "review", "deferred", "superseded"].iter().map(|r| renewals(&server, "shoot-a", r)).sum();
        anyhow::ensure!(counted == 25.0, "{counted} renewals counted");
        Ok(())
    })
    .await?;
    // The burst's latest token is reviewed once the gap allows; the session goes on with it.
    let last = burst.last().context("a burst")?;
    poll_until(DEADLINE, Duration::from_millis(20), || async {
        anyhow::ensure!(kas.asked().last() == Some(last), "{} reviews asked", kas.asked().len());
        Ok(())
    })
    .await?;
    let asked = kas.asked();
    let elapsed = admitted.elapsed();
    anyhow::ensure!(asked.iter().filter(|t| **t == first).count() == 1, "the first token was asked again");
    // At most one review per gap since the admission's, and the one at its end.
    let allowed = 2 + (elapsed.as_secs_f64() / GAP.as_secs_f64()).floor() as usize;
    anyhow::ensure!(asked.len() <= allowed, "{} reviews in {elapsed:?}", asked.len());
    anyhow::ensure!(asked.len() < 1 + burst.len(), "every renewal was reviewed");
    wait_connected(&server, "shoot-a", 1.0).await?;
    Ok(())
}

#[tokio::test]
async fn a_4xx_ends_the_session_and_an_unanswered_review_keeps_it_only_for_the_grace() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-status")?;
    let pki = TunnelPki::new(dir.path())?;
    // (cluster, the status its kube-apiserver answers once the session is up, how it ends)
    let cases = [
        ("shoot-422", 422, "token_invalid"),
        ("shoot-401", 401, "token_review_unavailable"),
        ("shoot-403", 403, "token_review_unavailable"),
        ("shoot-429", 429, "token_review_unavailable"),
        ("shoot-503", 503, "token_review_unavailable"),
    ];
    let mut kases = Vec::new();
    let mut clusters = String::new();
    for (cluster, _, _) in cases {
        let kas = TokenReviewer::start(&pki.ca, dir.path(), &format!("{cluster}-kas")).await?;
        clusters += &format!("  {cluster}: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
        kases.push(kas);
    }
    let (server, _) = inproc_server(&dir, &server_with(&pki, "timeout: 1s, grace: 2s", &clusters)).await?;
    // Tokens that expire after the first gap: their expiry review is the first after the
    // admission's, and it is answered with the case's status.
    let mut agents = Vec::new();
    for ((cluster, _, _), kas) in cases.iter().zip(&kases) {
        let token = kas.issue(ACCOUNT, AUDIENCE, GAP + Duration::from_secs(2));
        let a = raw(&server, &pki, LOCAL, cluster, &token).await?;
        a.wait_admitted(DEADLINE).await.with_context(|| server.log())?;
        agents.push(a);
    }
    for ((_, status, _), kas) in cases.iter().zip(&kases) {
        kas.set_status(Some((*status, "refused by the test")));
    }
    for ((cluster, status, reason), kas) in cases.iter().zip(&kases) {
        let ended = [("cluster", *cluster), ("reason", *reason)];
        wait_count(&server, "seedgate_agent_sessions_ended_total", &ended, 1.0)
            .await
            .with_context(|| format!("{cluster} ({status}): answers {:?}", kas.answers()))?;
        anyhow::ensure!(kas.answers().contains(&status.to_string()), "{cluster}: {:?}", kas.answers());
        wait_connected(&server, cluster, 0.0).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_reload_applies_at_the_next_review_and_a_removed_token_review_ends_its_sessions() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-reload")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas_a = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let kas_b = TokenReviewer::start(&pki.ca, dir.path(), "shoot-b-kas").await?;
    let clusters = |a_accounts: &str, b: &str, c: &str| {
        format!(
            "  shoot-a: {{ agent_auth: token, token_review: {} }}\n  shoot-b: {b}\n  shoot-c: {c}\n",
            kas_a.section(a_accounts)
        )
    };
    let tokens = format!("{{ token_review: {} }}", kas_b.section(""));
    let (server, _) = inproc_server(&dir, &server(&pki, &clusters("", &tokens, &tokens))).await?;
    let admin = server.admin()?;
    let mut a = raw(&server, &pki, LOCAL, "shoot-a", &kas_a.issue(ACCOUNT, AUDIENCE, HOUR)).await?;
    let b = raw(&server, &pki, LOCAL, "shoot-b", &kas_b.issue(ACCOUNT, AUDIENCE, HOUR)).await?;
    let c = raw(&server, &pki, LOCAL, "shoot-c", &kas_b.issue(ACCOUNT, AUDIENCE, HOUR)).await?;
    for agent in [&a, &b, &c] {
        agent.wait_admitted(DEADLINE).await?;
    }

    // shoot-a now accepts another account only; shoot-b has no token_review any more; shoot-c
    // wants certificates now.
    let reloaded = clusters(", service_accounts: [other/*]", "{}", "{ agent_auth: mtls }");
    server.files.reload_with(&crate::token_agents::server(&pki, &reloaded)).await?;
    server.files.wait_reloads(admin, "success", 1.0).await?;
    let b_ended = [("cluster", "shoot-b"), ("reason", "token_cluster_unknown")];
    wait_count(&server, "seedgate_agent_sessions_ended_total", &b_ended, 1.0).await?;
    b.wait_line("token_cluster_unknown", DEADLINE).await?;
    let c_ended = [("cluster", "shoot-c"), ("reason", "certificate_required")];
    wait_count(&server, "seedgate_agent_sessions_ended_total", &c_ended, 1.0).await?;
    c.wait_line("certificate_required", DEADLINE).await?;

    // shoot-a's next review (its renewal) asks with the new rules: the account is refused.
    a.send_line(&renewal(&kas_a.issue(ACCOUNT, AUDIENCE, HOUR))).await?;
    let a_ended = [("cluster", "shoot-a"), ("reason", "token_account")];
    wait_count(&server, "seedgate_agent_sessions_ended_total", &a_ended, 1.0).await?;
    wait_connected(&server, "shoot-a", 0.0).await?;
    Ok(())
}

#[tokio::test]
async fn a_refused_token_is_not_asked_about_again_within_the_cache_ttl() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-negative")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let (server, _) = inproc_server(&dir, &server_with(&pki, "timeout: 1s, cache_ttl: 1h", &clusters)).await?;
    let garbage = "not.a-token.at-all";
    for i in 0..5 {
        let a = raw(&server, &pki, LOCAL, "shoot-a", garbage).await?;
        let told = a.wait_line("\"type\":\"refused\"", DEADLINE).await?;
        anyhow::ensure!(told.contains("token_invalid"), "attempt {i}: {told}");
    }
    let refused = [("cluster", "shoot-a"), ("result", "token_invalid")];
    wait_count(&server, "seedgate_agent_sessions_total", &refused, 5.0).await?;
    anyhow::ensure!(kas.asked() == vec![garbage.to_owned()], "{} reviews asked", kas.asked().len());
    let m = server.metrics();
    let cached = value(&m, "seedgate_token_reviews_total", &[("cluster", "shoot-a"), ("result", "cached_refused")]);
    anyhow::ensure!(cached == 4.0, "{cached} refusals reused");
    Ok(())
}

#[tokio::test]
async fn a_flood_from_one_source_leaves_live_sessions_and_other_sources_their_reviews() -> anyhow::Result<()> {
    let dir = TempDir::new("renewal-flood")?;
    let pki = TunnelPki::new(dir.path())?;
    let kas = TokenReviewer::start(&pki.ca, dir.path(), "shoot-a-kas").await?;
    let clusters = format!("  shoot-a: {{ agent_auth: token, token_review: {} }}\n", kas.section(""));
    let review = "timeout: 3s, max_in_flight: 2, cache_ttl: 0s";
    let (server, _) = inproc_server(&dir, &server_with(&pki, review, &clusters)).await?;
    let mut live = raw(&server, &pki, LOCAL, "shoot-a", &kas.issue(ACCOUNT, AUDIENCE, HOUR)).await?;
    live.wait_admitted(DEADLINE).await?;
    // Every review takes a second from now on.
    kas.set_delay(Duration::from_secs(1));

    // The flood: garbage tokens, each new, from 127.0.0.3, as fast as sessions open.
    let flooding = Arc::new(AtomicBool::new(true));
    let mut flood = Vec::new();
    for f in 0..8 {
        let (flooding, addr, tls) = (flooding.clone(), server.listener("agents-quic")?, tls(&pki.ca, None)?);
        flood.push(tokio::spawn(async move {
            let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
            let mut n = 0u64;
            // Bounded by the test: it stops the flood before it returns.
            while flooding.load(Ordering::Relaxed) && n < 10_000 {
                n += 1;
                let Ok(mut a) = RawAgent::connect(addr, from, tls.clone()).await else { continue };
                let _ = a.send_line(&hello("flood", "shoot-a", &format!("garbage-{f}-{n}"))).await;
                let _ = a.wait_closed(Duration::from_secs(10)).await;
            }
        }));
    }
    let busy = [("cluster", "shoot-a"), ("limit", "per_source")];
    wait_count(&server, "seedgate_token_review_budget_refused_total", &busy, 5.0).await?;

    // Meanwhile: the live session's renewal is reviewed, and a new agent from another source
    // gets in.
    live.send_line(&renewal(&kas.issue(ACCOUNT, AUDIENCE, HOUR))).await?;
    let other =
        raw(&server, &pki, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), "shoot-a", &kas.issue(ACCOUNT, AUDIENCE, HOUR))
            .await?;
    other.wait_admitted(DEADLINE).await.with_context(|| server.log())?;
    let authenticated = [("cluster", "shoot-a"), ("result", "authenticated")];
    // The live session's, the new agent's, and the renewal's.
    wait_count(&server, "seedgate_token_reviews_total", &authenticated, 3.0).await?;
    flooding.store(false, Ordering::Relaxed);
    for f in flood {
        f.abort();
    }
    let m = server.metrics();
    let unavailable =
        value(&m, "seedgate_token_reviews_total", &[("cluster", "shoot-a"), ("result", "token_review_unavailable")]);
    anyhow::ensure!(unavailable == 0.0, "{unavailable} reviews found no slot or no answer");
    anyhow::ensure!(!live.is_closed() && !other.is_closed(), "a real agent lost its session");
    Ok(())
}
