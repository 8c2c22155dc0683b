//! demo: the command line (the demo itself is the library's).

use clap::Parser;
use std::process::ExitCode;

/// Start the real binaries against stand-in kube-apiservers, send real TLS traffic through them
/// and report what the clients saw. Exits 1 if anything expected did not happen.
#[derive(Debug, Parser)]
#[command(name = "demo")]
struct Cli {
    #[command(flatten)]
    args: demo::Args,
}

fn main() -> ExitCode {
    demo::main(Cli::parse().args)
}
