//! proxy-server binary: flags, logging, config, then `bind` and `run` until SIGTERM.

use clap::Parser;
use proxy_core::cli::{self, CommonArgs};
use std::path::PathBuf;

/// The seed end of seedgate's reverse tunnel: agents in the shoots dial in; kube-apiserver
/// (egress selector, HTTP CONNECT) and Prometheus (proxy_url) reach the shoots through them.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// After binding, write the bound addresses as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    write_addresses: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    proxy_core::telemetry::init(args.common.log_format);
    let cfg = cli::load_or_exit(&args.common, seedgate_config::server::parse);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        // Handlers first: the addresses file below tells others we are up and may be signalled.
        let signal = proxy_core::shutdown::termination_signal();
        let opts = proxy_server::Options {
            config_path: Some(args.common.config.clone()),
            write_addresses: args.write_addresses,
            registry: None,
        };
        let bound = proxy_server::bind(cfg, opts).await?;
        bound.run(signal).await;
        anyhow::Ok(())
    })
}
