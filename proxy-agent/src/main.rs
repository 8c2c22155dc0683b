//! The proxy-agent binary: flags, tracing, config, bind, serve until SIGTERM/SIGINT, drain, exit 0.

use anyhow::Context as _;
use clap::Parser;
use proxy_core::cli::{self, CommonArgs};
use proxy_core::shutdown::{Shutdown, termination_signal};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// seedgate proxy-agent: the shoot end. Runs the node-local apiserver proxy, which forwards
/// in-cluster connections for the kube-apiserver's advertised address to the seed gateway.
#[derive(Debug, Parser)]
#[command(name = "proxy-agent", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// After binding, write the bound addresses to FILE as JSON (atomically, via FILE.tmp):
    /// {"admin": "ip:port" or null, "listeners": {"<name>": "ip:port", ...}}.
    #[arg(long, value_name = "FILE")]
    write_addresses: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    proxy_core::telemetry::init(args.common.log_format);
    let cfg = cli::load_or_exit(&args.common, seedgate_config::agent::parse);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(async move {
        let shutdown = Shutdown::new();
        // Install the signal handlers before anyone can learn our addresses (and signal us).
        let signal = termination_signal();
        let bound = proxy_agent::bind(cfg, shutdown.clone()).await?.reload_from(args.common.config.clone());
        if let Some(file) = &args.write_addresses {
            write_addresses(file, &bound.local_addrs().to_json())?;
        }
        let stop = shutdown.stop.clone();
        tokio::spawn(async move {
            signal.await;
            stop.cancel();
        });
        bound.run().await;
        anyhow::Ok(())
    });
    // A DNS lookup still running on a blocking thread must not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Write via a temporary file and rename, so a reader never sees a partial file.
fn write_addresses(file: &Path, json: &serde_json::Value) -> anyhow::Result<()> {
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{json}\n")).with_context(|| format!("writing {}", Path::new(&tmp).display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("renaming to {}", file.display()))?;
    Ok(())
}
