//! bench: the command line; each subcommand (the demo, the benchmark scenarios) lives in its own module.

mod fleet_agents;
mod host;
mod load;
mod load_worker;
mod memcpy;
mod report;
mod scenarios;
mod systems;

use clap::{Parser, Subcommand};
use scenarios::Scenario;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(about = "seedgate demo topology and side-by-side benchmarks")]
struct Cli {
    #[command(flatten)]
    opts: scenarios::Opts,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start the real binaries against stand-in kube-apiservers, send real TLS traffic through
    /// them and report what the clients saw. Exits 1 if anything expected did not happen.
    Demo(demo::Args),
    /// Every benchmark scenario below, in this order (soak only with --soak-minutes).
    All,
    /// A real ClientHello with SNI, then bulk bytes to a sink, 1 and 64 streams (Gbit/s):
    /// direct, sni-router, haproxy (with and without splice-auto), nginx ssl_preread.
    SniBulk,
    /// New connections/s with full TLS handshakes through SNI routing, and time to first
    /// response byte (p50/p99/p99.9) at saturation and at a fixed offered rate.
    SniConnrate,
    /// Connections/s through a PROXY-v2 listener routing by destination, with the header sent
    /// by the harness and by real senders (proxy-agent, haproxy send-proxy-v2).
    ProxyProtocol,
    /// HTTP CONNECT open rate and open latency, and bulk through one CONNECT tunnel:
    /// sni-router vs squid, tinyproxy and nginx+njs.
    Connect,
    /// The reverse tunnel (proxy-server + proxy-agent, h2 and quic transports side by side) vs
    /// rathole and ssh -R: bulk, CPU per GB, new connections/s, CONNECT through a tunnel (vs
    /// squid behind rathole), 1k/10k concurrent streams, head-of-line blocking.
    Tunnel,
    /// RSS per established idle proxied connection, for every system.
    IdleMemory,
    /// With 10,000 routes loaded: time from a config change to the new route serving, and
    /// connections reset by the reload (sni-router vs haproxy -sf and nginx reload).
    Reload,
    /// With thousands of clients that sent three bytes of a TLS record and stalled: time for a
    /// real client to be served through SNI routing, with the same cap of 1,000 client
    /// connections: sni-router, haproxy (maxconn) and nginx ssl_preread (worker_connections).
    Slowloris,
    /// Shoot B's time to first byte through SNI routing (p50/p99), quiet and while shoot A's
    /// clients hold the gateway at its connection limit: sni-router (default route share),
    /// haproxy (per-backend server maxconn + queue) and nginx ssl_preread, each capped at 1,000.
    NoisyNeighbour,
    /// N connections (--leak-connections, default 100,000) of every kind — complete, client
    /// reset, stalled until the handshake deadline, refused dial — through every path (SNI,
    /// PROXY v2, CONNECT, tunnel CONNECT, forward proxy): open fds, tokio tasks and RSS of each
    /// seedgate process before and after.
    Leak,
    /// proxy-server replicas behind one sni-router route and one proxy-agent: time from a
    /// replica's start to the agent's first session (after a SIGKILL), and the CONNECT success
    /// rate while every replica is restarted in turn (seedgate only).
    Ha,
    /// A shoot's control plane moved between two seeds of three proxy-server replicas each
    /// (network namespaces, root; etcd): failed requests during the move, time until every h2
    /// and QUIC agent is on the new seed, and a live etcd watch's gap (seedgate only).
    Migration,
    /// N agents (--agents, default 1,000) of ten clusters through one sni-router to three
    /// proxy-server replicas, over h2 and over QUIC: memory per session, time for the fleet to
    /// connect, and the reconnect storm after a replica's SIGKILL (seedgate only).
    Fleet,
    /// The gateway and the tunnel given N = 1, 2, 4, … CPUs (--scaling-cpus), beside haproxy
    /// (nbthread N) and nginx (worker_processes N), with load from one process per other CPU:
    /// full-TLS connections/s, SNI bulk, PROXY-v2 connections/s, CONNECT opens/s, tunnel CONNECT
    /// opens/s and bulk; scaling efficiency and what /proc shows of each window.
    Scaling,
    /// The reverse tunnel across an emulated WAN link (two network namespaces, a user-space
    /// link with delay, rate limit, bottleneck queue and loss): one stream up and down, 16 and 64
    /// streams down, a 1-byte round trip behind a bulk stream, memory: direct TCP (BBR, Cubic),
    /// seedgate h2 and QUIC, rathole, ssh -R; 50/150/300 ms at two rates, 50 ms with loss.
    Wan,
    /// Minutes (--soak-minutes, default 10) of the leak scenario's mix at a fixed rate: RSS, fds
    /// and tasks of each process sampled every second, start, end and slope per minute.
    Soak,
    /// This machine's copy speed for 16 KiB blocks by destination - source distance modulo 4
    /// KiB, in this process's environment: whether glibc's `rep movsb` has the cliff that
    /// `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576` avoids (about a second).
    Memcpy,
    /// Print the Markdown of a results file (--json, default bench/results/latest.json) and
    /// rewrite its chart (--svg), without running anything.
    Report,
    /// (internal) Serve many proxy-agent instances in this process for the fleet scenario.
    #[command(hide = true)]
    FleetAgents(fleet_agents::Args),
    /// (internal) One load process of the scaling scenario: backends and generators on one CPU.
    #[command(hide = true)]
    LoadWorker(load_worker::Args),
    /// (internal) Serve TCP echo on 127.0.0.1 for the harness; writes the address to a file.
    #[command(hide = true)]
    ServeEcho {
        #[arg(long)]
        addr_file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let which = match cli.cmd {
        Cmd::Demo(a) => return demo::main(a),
        Cmd::ServeEcho { addr_file } => {
            return match load::run_echo_helper(&addr_file) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bench serve-echo: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::FleetAgents(a) => {
            return match fleet_agents::main(a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bench fleet-agents: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::LoadWorker(a) => {
            return match load_worker::main(a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bench load-worker: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::Report => return scenarios::report_main(cli.opts),
        Cmd::Memcpy => {
            memcpy::main();
            return ExitCode::SUCCESS;
        }
        Cmd::All => {
            let mut v = Scenario::ALL.to_vec();
            if cli.opts.soak_minutes.is_some() {
                v.push(Scenario::Soak);
            }
            v
        }
        Cmd::SniBulk => vec![Scenario::SniBulk],
        Cmd::SniConnrate => vec![Scenario::SniConnrate],
        Cmd::ProxyProtocol => vec![Scenario::ProxyProtocol],
        Cmd::Connect => vec![Scenario::Connect],
        Cmd::Tunnel => vec![Scenario::Tunnel],
        Cmd::IdleMemory => vec![Scenario::IdleMemory],
        Cmd::Reload => vec![Scenario::Reload],
        Cmd::Slowloris => vec![Scenario::Slowloris],
        Cmd::NoisyNeighbour => vec![Scenario::NoisyNeighbour],
        Cmd::Leak => vec![Scenario::Leak],
        Cmd::Ha => vec![Scenario::Ha],
        Cmd::Migration => vec![Scenario::Migration],
        Cmd::Fleet => vec![Scenario::Fleet],
        Cmd::Scaling => vec![Scenario::Scaling],
        Cmd::Soak => vec![Scenario::Soak],
        Cmd::Wan => vec![Scenario::Wan],
    };
    scenarios::main(cli.opts, which)
}
