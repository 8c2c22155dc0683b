//! Tracing setup: text or JSON logs on stderr, filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Install the global subscriber. Safe to call twice (the second call does nothing), which
/// in-process tests rely on.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(true)
                    // Colours only on a terminal: log files and collectors want plain key=value.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().flatten_event(true).with_current_span(true).with_writer(std::io::stderr))
            .try_init(),
    };
}
