//! `morris server`: runs one stripe server until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tracing::info;

use crate::runtime::{self, Terminate};

/// Arguments of `morris server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Directory holding this server's metadata store and block files (created if missing).
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Address to listen on, HOST:PORT (e.g. 0.0.0.0:7700).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: String,
    /// Lease duration in milliseconds: how long a silent client keeps its locks,
    /// and how long the server refuses new leases after a restart.
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u32).range(100..=3_600_000))]
    pub lease_ms: u32,
}

/// Runs the server.
pub fn run(args: ServerArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create data directory {}", args.data.display()))?;
    let rt = runtime::build()?;
    let listen = args.listen.clone();
    let result = rt.block_on(async {
        let mut term = Terminate::install()?;
        let cfg = morris_server::ServerConfig {
            data_dir: args.data.clone(),
            listen: args.listen.clone(),
            lease_ms: args.lease_ms,
        };
        tokio::select! {
            r = morris_server::run(cfg) => {
                r.with_context(|| format!("server on {listen} stopped"))
            }
            sig = term.recv() => {
                info!(signal = sig, listen = %listen, "stopping server");
                Ok(())
            }
        }
    });
    // Blocking store work finishes or is abandoned within this bound; every
    // answered request is already committed.
    rt.shutdown_timeout(Duration::from_secs(10));
    result.map(|()| ExitCode::SUCCESS)
}
