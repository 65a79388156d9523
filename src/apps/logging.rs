//! `RUST_LOG`: the library's `tracing` events on standard error.
//!
//! Off by default: without `RUST_LOG` no subscriber is installed, and every `tracing` macro in
//! the library costs one relaxed load of tracing's global "max level" (nothing is formatted).
//! With it, the value is an [`EnvFilter`] directive list, e.g. `RUST_LOG=ferroce=debug` or
//! `RUST_LOG=ferroce::runtime=trace,ferroce::io=debug`.

use tracing_subscriber::EnvFilter;

/// Why logging could not be turned on.
#[derive(Debug, thiserror::Error)]
pub enum LogInitError {
    /// A directive that does not parse.
    #[error("{ENV}={filter:?}: {err}")]
    Filter {
        /// The directives.
        filter: String,
        /// What is wrong.
        #[source]
        err: tracing_subscriber::filter::ParseError,
    },
    /// A subscriber was already installed.
    #[error("{0}")]
    Installed(String),
}

/// The environment variable that turns logging on.
pub const ENV: &str = "RUST_LOG";

/// Install a subscriber that prints events matching `$RUST_LOG` to standard error, if the
/// variable is set and not empty. Returns whether logging is on.
///
/// # Errors
/// A directive that does not parse (the message names it); nothing is installed then.
pub fn init_from_env() -> Result<bool, LogInitError> {
    match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => init(&v).map(|()| true),
        _ => Ok(false),
    }
}

/// Install a subscriber for the directives `filter` (see [`EnvFilter`]); events go to
/// standard error, with colours only when it is a terminal.
///
/// # Errors
/// A directive that does not parse, or a subscriber already installed.
pub fn init(filter: &str) -> Result<(), LogInitError> {
    let filter = EnvFilter::try_new(filter).map_err(|err| LogInitError::Filter {
        filter: filter.to_string(),
        err,
    })?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_thread_names(true)
        .try_init()
        .map_err(|e| LogInitError::Installed(e.to_string()))
}
