//! `morris volume`: changes to the servers of a running volume.
//!
//! `replace ADDR IDX`: an empty server started at the address of server
//! `IDX` (whose disk was lost) is made that server again. It takes the
//! metadata it keeps a copy of from the ranges' primaries and rebuilds its
//! data blocks from the other copies by itself; until it has recorded them
//! all stale it answers no read of them (`Request::Replace`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use morris_proto::auth::Key;
use morris_proto::{Reply, Request};

use crate::admin::{self, Session, CONNECT_TIMEOUT};
use crate::progress::{Progress, Units};
use crate::runtime;
use crate::size::human;
use crate::status;

/// Arguments of `morris volume`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
    /// Make an empty server, started at the address of lost server IDX,
    /// that server again: it copies the metadata it keeps and rebuilds its
    /// data from the other copies (--replicas 2 or 3).
    Replace(ReplaceArgs),
}

/// Arguments of `morris volume replace`.
#[derive(Debug, Args)]
pub struct ReplaceArgs {
    /// Address HOST:PORT of any running server of the volume.
    pub addr: String,
    /// The index of the lost server (as `morris status` lists it); the
    /// empty server must already run at its address, on an empty data
    /// directory.
    pub index: u32,
    /// Wait until the volume is healthy again, showing the rebuild's
    /// progress (a bar with an ETA in a terminal, a line every 10 s
    /// otherwise). Ctrl-C stops waiting, not the rebuild.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// Runs the command.
pub fn run(args: VolumeArgs) -> Result<ExitCode> {
    match args.command {
        VolumeCommand::Replace(a) => replace(a),
    }
}

fn replace(args: ReplaceArgs) -> Result<ExitCode> {
    let key = args
        .key
        .load_volume_key("morris volume replace")?
        .credential();
    runtime::build()?.block_on(async move {
        let open = |addr: String| {
            let key = key.clone();
            async move {
                Session::open(
                    &addr,
                    &key,
                    None,
                    admin::random_client_id(),
                    "morris-volume",
                    CONNECT_TIMEOUT,
                )
                .await
            }
        };
        let member = open(args.addr.clone()).await?;
        let volume = member
            .descriptor
            .ok_or_else(|| anyhow!("server {} is not formatted: name a running server of the volume", args.addr))?;
        let Some(target) = volume.servers.get(args.index as usize).cloned() else {
            bail!(
                "volume {} has no server {} (it has {})",
                volume.uuid,
                args.index,
                volume.servers.len()
            );
        };
        if volume.replicas < 2 {
            bail!(
                "volume {} keeps one copy of everything (--replicas 1): what server {} held cannot be rebuilt",
                volume.uuid,
                args.index
            );
        }
        let new = open(target.clone())
            .await
            .map_err(|e| anyhow!("the replacement must run at {target} (on an empty data directory): {e:#}"))?;
        if let Some(d) = &new.descriptor {
            if d.uuid != volume.uuid {
                bail!(
                    "the server at {target} belongs to volume {}; start the replacement on an empty data directory",
                    d.uuid
                );
            }
        }
        let req = Request::Replace {
            descriptor: volume.clone(),
            index: args.index,
        };
        match new.ask(&req).await? {
            Reply::Ok => {}
            other => return Err(admin::unexpected(&req, &target, &other)),
        }
        println!(
            "server {} ({target}) of volume {} is a replacement: it copies its metadata from the other servers \
             and rebuilds its data from the other copies; `morris status` shows the progress \
             (COPIES: resyncing, then current; the volume healthy)",
            args.index, volume.uuid
        );
        if args.wait {
            wait_rebuilt(&args.addr, &key, args.index as usize).await?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Follows server `index`'s rebuild until the volume is healthy.
async fn wait_rebuilt(addr: &str, key: &Key, index: usize) -> Result<()> {
    let started = std::time::Instant::now();
    let mut progress = Progress::new(&format!("rebuild of server {index}"), Units::Count);
    loop {
        // A server of the volume that is down now is not an error: the
        // next look may find it back.
        let report = match status::collect(addr, key, Duration::from_secs(2)).await {
            Ok(r) => r,
            Err(e) => {
                progress.update(0, 0, format!("cannot read the volume's state: {e:#}"));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let server = report.servers.get(index);
        let (done, total, copied, rebuilding) =
            server
                .and_then(|s| s.stats.as_ref())
                .map_or((0, 0, 0, true), |st| {
                    (
                        st.resync.files_done,
                        st.resync.files_total,
                        st.resync.bytes_copied,
                        st.rebuilding,
                    )
                });
        let state = server.map_or("unknown", |s| s.copies);
        let stage = if rebuilding {
            "recording what to rebuild".to_string()
        } else {
            format!("{} copied, copies {state}", human(copied))
        };
        progress.update(done, total, format!("{stage}; volume {}", report.health));
        if report.health == "healthy" {
            progress.finish();
            println!(
                "server {index} is rebuilt: the volume is healthy ({} copied, {})",
                human(copied),
                humantime::format_duration(Duration::from_secs(started.elapsed().as_secs()))
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
