//! The tokio runtime and termination signals shared by the subcommands.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Builds the multi-threaded runtime every subcommand runs on.
pub fn build() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("morris-rt")
        .build()
        .context("cannot start the async runtime")
}

/// SIGINT and SIGTERM, installed once so that none is lost between waits.
pub struct Terminate {
    int: Signal,
    term: Signal,
}

impl Terminate {
    /// Installs the handlers; must run inside a runtime.
    pub fn install() -> Result<Self> {
        Ok(Terminate {
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}
