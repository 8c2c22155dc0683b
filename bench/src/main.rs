//! bench: the command line; the scenarios' subcommands come from their table
//! ([`scenarios::SCENARIOS`]), the other subcommands are listed here.

mod charts;
mod fleet_agents;
mod host;
mod load;
mod load_worker;
mod memcpy;
mod report;
mod scenarios;
mod systems;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use scenarios::{SCENARIOS, Scenario};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    about = "seedgate side-by-side benchmarks (and the demo)",
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(flatten)]
    opts: scenarios::Opts,
}

// The subcommands that are not a scenario (a doc comment here would be the bench's help).
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start the real binaries against stand-in kube-apiservers, send real TLS traffic through
    /// them and report what the clients saw (the `demo` crate; `cargo run -p demo` runs it too).
    /// Exits 1 if anything expected did not happen.
    Demo(demo::Args),
    /// Every benchmark scenario below, in this order (soak only with --soak-minutes).
    All,
    /// This machine's copy speed for 16 KiB blocks by destination - source distance modulo 4
    /// KiB, in this process's environment: whether glibc's `rep movsb` has the cliff that
    /// `GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576` avoids (about a second).
    #[command(display_order = 1000)]
    Memcpy,
    /// Print the Markdown of a results file (--json, default bench/results/latest.json) and
    /// rewrite its chart (--svg), without running anything.
    #[command(display_order = 1001)]
    Report {
        /// Also draw the README's small charts (gateway.svg, tunnel.svg, wan.svg, faults.svg)
        /// into this directory: those whose figures the results hold (e.g. docs/images).
        #[arg(long)]
        charts: Option<PathBuf>,
    },
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

/// What the command line asks for.
#[derive(Debug)]
enum Parsed {
    Scenarios(scenarios::Opts, Vec<&'static Scenario>),
    Other(scenarios::Opts, Cmd),
}

/// The command line: [`Cli`]'s options, [`Cmd`]'s subcommands and one per scenario of the table.
fn command() -> clap::Command {
    SCENARIOS
        .iter()
        .fold(Cmd::augment_subcommands(Cli::command()), |c, s| c.subcommand(clap::Command::new(s.name).about(s.about)))
}

fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Parsed, clap::Error> {
    let m = command().try_get_matches_from(args)?;
    let opts = Cli::from_arg_matches(&m)?.opts;
    if let Some(sc) = m.subcommand_name().and_then(Scenario::by_name) {
        return Ok(Parsed::Scenarios(opts, vec![sc]));
    }
    match Cmd::from_arg_matches(&m)? {
        Cmd::All => {
            let all = Scenario::all(&opts);
            Ok(Parsed::Scenarios(opts, all))
        }
        cmd => Ok(Parsed::Other(opts, cmd)),
    }
}

fn main() -> ExitCode {
    let (opts, cmd) = match parse(std::env::args_os()) {
        Ok(Parsed::Scenarios(opts, which)) => return scenarios::main(opts, which),
        Ok(Parsed::Other(opts, cmd)) => (opts, cmd),
        Err(e) => e.exit(),
    };
    let (what, r) = match cmd {
        Cmd::Demo(a) => return demo::main(a),
        Cmd::Report { charts } => return scenarios::report_main(opts, charts.as_deref()),
        Cmd::Memcpy => {
            memcpy::main();
            return ExitCode::SUCCESS;
        }
        Cmd::All => unreachable!("parse() turns `all` into its scenarios"),
        Cmd::ServeEcho { addr_file } => ("serve-echo", load::run_echo_helper(&addr_file)),
        Cmd::FleetAgents(a) => ("fleet-agents", fleet_agents::main(a)),
        Cmd::LoadWorker(a) => ("load-worker", load_worker::main(a)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench {what}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(line: &str) -> Result<Parsed, clap::Error> {
        parse(std::iter::once("bench").chain(line.split_whitespace()).map(Into::into))
    }

    fn names(line: &str) -> Vec<&'static str> {
        match parse_words(line) {
            Ok(Parsed::Scenarios(_, which)) => which.iter().map(|s| s.name).collect(),
            other => panic!("{line:?} is not a run of scenarios: {other:?}"),
        }
    }

    #[test]
    fn every_scenario_of_the_table_is_a_subcommand_and_all_runs_them_in_order() {
        for s in SCENARIOS {
            assert_eq!(names(s.name), [s.name]);
            assert_eq!(names(&format!("--smoke {} --json /tmp/x.json --merge", s.name)), [s.name]);
        }
        let all = names("--smoke --debug --seedgate-only all");
        let expected: Vec<&str> = SCENARIOS.iter().map(|s| s.name).filter(|n| *n != "soak").collect();
        assert_eq!(all, expected);
        assert_eq!(names("all --soak-minutes 1").last(), Some(&"soak"));
        let Ok(Parsed::Scenarios(o, _)) = parse_words("--smoke --debug --seedgate-only all") else { unreachable!() };
        assert!(o.smoke && o.debug && o.seedgate_only);
    }

    #[test]
    fn the_other_subcommands_parse_as_before() {
        for (line, want) in [
            ("demo --profile debug --keep", "Demo"),
            ("report --json /tmp/x.json", "Report { charts: None }"),
            ("report --charts docs/images", "Report { charts: Some(\"docs/images\") }"),
            ("memcpy", "Memcpy"),
            ("serve-echo --addr-file /tmp/a", "ServeEcho"),
            ("fleet-agents --help", ""),
            ("load-worker --help", ""),
        ] {
            match parse_words(line) {
                Ok(Parsed::Other(_, cmd)) => assert!(format!("{cmd:?}").starts_with(want), "{line}: {cmd:?}"),
                Err(e) if want.is_empty() => assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(parse_words("no-such-scenario").is_err());
        assert!(parse_words("").is_err(), "a subcommand is required");
    }

    #[test]
    fn the_readme_lists_the_scenarios_of_the_table_in_its_order() {
        let readme = include_str!("../README.md");
        let table: Vec<&str> =
            readme.lines().filter_map(|l| l.strip_prefix("| `")?.split_once('`').map(|(name, _)| name)).collect();
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        let mut in_order = names.clone();
        // The README's table gives the soak with the leak scenario it repeats.
        in_order.retain(|n| table.contains(n));
        assert_eq!(table, in_order, "bench/README.md's scenario table");
        assert!(names.iter().all(|n| table.contains(n) || readme.contains(&format!("`{n}`"))), "{names:?}");
        let one = readme.lines().find(|l| l.contains("# one scenario (")).expect("the README's one-scenario line");
        assert!(one.contains(&names.join(", ")), "{one}");
    }
}
