//! The demo as a library: `bench demo` runs it too, as it did before it had a crate of its own.

mod demo;

pub use demo::{Args, run};
use std::process::ExitCode;

/// Run the demo on a tokio runtime of its own: success when every expected result happened.
pub fn main(args: Args) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
