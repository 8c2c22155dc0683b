//! sni-router binary: flags, logging, config, then `bind` and `run` until SIGTERM.

use clap::Parser;
use proxy_core::cli::{self, CommonArgs};
use std::path::PathBuf;

/// The seed's ingress gateway: routes TLS by SNI, PROXY-protocol destination or HTTP CONNECT
/// header to shoot kube-apiservers without terminating TLS.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// After binding (and after each reload), write the bound addresses as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    write_addresses: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    proxy_core::telemetry::init(args.common.log_format);
    let cfg = cli::load_or_exit(&args.common, seedgate_config::router::parse);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        // Handlers first: the addresses file below tells others we are up and may be signalled.
        let signal = proxy_core::shutdown::termination_signal();
        let opts = sni_router::Options {
            config_path: Some(args.common.config.clone()),
            write_addresses: args.write_addresses,
            registry: None,
        };
        let bound = sni_router::bind(cfg, opts).await?;
        bound.run(signal).await;
        anyhow::Ok(())
    })
}
