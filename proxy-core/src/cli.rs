//! Command-line flags every binary takes, and the `--check` behaviour (print problems, exit 2).

use crate::telemetry::LogFormat;
use std::path::PathBuf;

/// Flags common to sni-router, proxy-server and proxy-agent.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// YAML config file. It is reloaded on SIGHUP and when the file changes.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Validate the config, print every problem with file, line and field, and exit:
    /// 0 when valid, 2 when not.
    #[arg(long)]
    pub check: bool,
    /// Log format on stderr. The level comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// After binding (and after every reload), write the bound addresses as JSON to FILE
    /// (atomically): {"admin": "ip:port" or null, "listeners": {"<name>": "ip:port", ...}}.
    #[arg(long, value_name = "FILE")]
    pub write_addresses: Option<PathBuf>,
}

impl CommonArgs {
    /// Parse the process arguments for the binary `name`; `--help` shows `about`.
    pub fn parse_for(name: &'static str, about: &'static str) -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = Self::augment_args(clap::Command::new(name).about(about).version(env!("CARGO_PKG_VERSION")));
        Self::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
    }
}

/// Exit code of `--check` and of a start with an invalid config.
pub const EXIT_INVALID_CONFIG: i32 = 2;

/// Load the config for `--check` or start-up; on error print every problem and exit 2.
pub fn load_or_exit<T>(args: &CommonArgs, parse: fn(&str, &str) -> Result<T, seedgate_config::ConfigError>) -> T {
    match seedgate_config::load(&args.config, parse) {
        Ok(cfg) => {
            if args.check {
                println!("{}: valid", args.config.display());
                std::process::exit(0);
            }
            cfg
        }
        Err(e) => {
            for p in &e.problems {
                eprintln!("{p}");
            }
            std::process::exit(EXIT_INVALID_CONFIG);
        }
    }
}
