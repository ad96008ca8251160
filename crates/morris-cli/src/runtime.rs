//! The tokio runtime and termination signals shared by the subcommands.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Builds the multi-threaded runtime every subcommand runs on (one worker
/// per CPU).
pub fn build() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("morris-rt")
        .build()
        .context("cannot start the async runtime")
}

/// Builds the runtime of a mount: `threads` workers, by default one per
/// CPU. A mount's requests start on its FUSE threads; the runtime reads
/// replies, finishes the requests that waited for one and runs background
/// work (lease renewals and recalls among it). Fewer workers save thread
/// switches (tokio wakes a second idle worker whenever one finds work:
/// docs/benchmarks.md, "A mount's runtime threads") but leave that work
/// fewer threads.
pub fn build_mount(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    b.enable_all()
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
