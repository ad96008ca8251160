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

/// Builds the runtime of a mount: `threads` workers, by default
/// [`mount_threads`].
pub fn build_mount(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.unwrap_or_else(mount_threads).max(1))
        .enable_all()
        .thread_name("morris-rt")
        .build()
        .context("cannot start the async runtime")
}

/// A mount's default runtime workers: a quarter of the CPUs, at least one.
/// A mount's requests start on its FUSE threads; the runtime reads
/// replies, finishes the requests that waited for one and runs background
/// work. Every idle worker beyond what that needs is woken for each reply
/// (tokio wakes a second worker whenever one finds work), two more thread
/// switches per server request (docs/benchmarks.md, "A mount's runtime
/// threads").
pub fn mount_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))
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
