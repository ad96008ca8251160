//! `morris volume`: changes to the servers of a running volume.
//!
//! `replace ADDR IDX`: an empty server started at the address of server
//! `IDX` (whose disk was lost) is made that server again. It takes the
//! metadata it keeps a copy of from the ranges' primaries and rebuilds its
//! data blocks from the other copies by itself; until it has recorded them
//! all stale it answers no read of them (`Request::Replace`).

use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use morris_proto::{Reply, Request};

use crate::admin::{self, Session, CONNECT_TIMEOUT};
use crate::runtime;

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
        Ok(ExitCode::SUCCESS)
    })
}
