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
    let _ = match format {
        // Colours only on a terminal: log files and collectors want plain key=value.
        LogFormat::Text => {
            text_subscriber(std::io::stderr, std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init()
        }
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter())
            .with(fmt::layer().json().flatten_event(true).with_current_span(true).with_writer(std::io::stderr))
            .try_init(),
    };
}

/// The text logs of [`init`], written to `writer`: in-process tests give each binary its own
/// writer (and so its own log, as a process has).
pub fn text_subscriber<W>(writer: W, ansi: bool) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(filter())
        .with(fmt::layer().with_writer(writer).with_target(true).with_ansi(ansi))
}

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}
