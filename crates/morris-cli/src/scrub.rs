//! `morris scrub`: has every server (or the ones named) read all the data it
//! keeps and check it against its checksums, with a progress bar; chunks
//! that fail are repaired from another copy by the servers themselves.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use futures::future::join_all;
use morris_proto::{Reply, Request, ScrubStatus};

use crate::admin::{self, Session, CONNECT_TIMEOUT};
use crate::progress::{Progress, Units};
use crate::runtime;
use crate::size::{human, parse_size};

/// Arguments of `morris scrub`.
#[derive(Debug, Args)]
pub struct ScrubArgs {
    /// Address HOST:PORT of any server of the volume.
    pub addr: String,
    /// Only these servers (by index; repeat or comma-separate). Default: all.
    #[arg(long = "server", value_name = "IDX", value_delimiter = ',')]
    pub servers: Vec<usize>,
    /// Bytes a second each server reads at most (e.g. 200M); default: the
    /// server's own `--scrub-rate`.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub rate: Option<u64>,
    /// Start the passes and return at once (`morris status` shows progress).
    #[arg(long)]
    pub no_wait: bool,
    /// Stop the passes that run instead of starting them.
    #[arg(long, conflicts_with = "no_wait")]
    pub stop: bool,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// Runs the command: 0 when every pass finished and found nothing, 1 when
/// damage was found (and handed to repair), an error when a pass failed.
pub fn run(args: ScrubArgs) -> Result<ExitCode> {
    let key = args.key.load_volume_key("morris scrub")?.credential();
    runtime::build()?.block_on(async move {
        let first = Session::open(
            &args.addr,
            &key,
            None,
            admin::random_client_id(),
            "morris-scrub",
            CONNECT_TIMEOUT,
        )
        .await?;
        let volume = first
            .descriptor
            .ok_or_else(|| anyhow!("server {} is not formatted (see `morris format`)", args.addr))?;
        let targets: Vec<usize> = if args.servers.is_empty() {
            (0..volume.servers.len()).collect()
        } else {
            args.servers.clone()
        };
        if let Some(bad) = targets.iter().find(|&&i| i >= volume.servers.len()) {
            bail!("the volume has no server {bad} (it has {})", volume.servers.len());
        }
        let sessions = join_all(targets.iter().map(|&i| {
            Session::open(
                &volume.servers[i],
                &key,
                None,
                admin::random_client_id(),
                "morris-scrub",
                CONNECT_TIMEOUT,
            )
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
        let req = Request::Scrub {
            rate: args.rate.unwrap_or(0),
            stop: args.stop,
        };
        for s in &sessions {
            match s.ask(&req).await? {
                Reply::Ok => {}
                other => return Err(admin::unexpected(&req, &s.addr, &other)),
            }
        }
        if args.stop {
            println!("asked {} server(s) to stop scrubbing", sessions.len());
            return Ok(ExitCode::SUCCESS);
        }
        if args.no_wait {
            println!(
                "scrub started on {} server(s); `morris status` shows its progress",
                sessions.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let mut bar = Progress::new("scrub", Units::Bytes);
        let last = loop {
            let mut all = Vec::with_capacity(sessions.len());
            for s in &sessions {
                match s.ask(&Request::Status).await? {
                    Reply::Status(st) => all.push(st.integrity.scrub),
                    other => return Err(admin::unexpected(&Request::Status, &s.addr, &other)),
                }
            }
            let sum = |f: fn(&ScrubStatus) -> u64| all.iter().map(f).sum::<u64>();
            bar.update(
                sum(|s| s.bytes_done),
                sum(|s| s.bytes_total),
                format!(
                "files {}/{}, bad chunks {}, blocks whose copies differ {}",
                sum(|s| s.files_done),
                sum(|s| s.files_total),
                sum(|s| s.bad_chunks),
                sum(|s| s.diverged_blocks)
                ),
            );
            if all.iter().all(|s| !s.running) {
                break all;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        bar.finish();
        let (mut bad_total, mut diverged_total) = (0, 0);
        let mut failed = Vec::new();
        for (s, (st, &i)) in sessions.iter().zip(last.iter().zip(&targets)) {
            bad_total += st.bad_chunks;
            diverged_total += st.diverged_blocks;
            println!(
                "server {i} ({}): {} files, {} checked, {} bad chunks, {} blocks whose copies differ{}",
                s.addr,
                st.files_done,
                human(st.bytes_done),
                st.bad_chunks,
                st.diverged_blocks,
                st.last_error
                    .as_ref()
                    .map(|e| format!(", stopped: {e}"))
                    .unwrap_or_default()
            );
            if let Some(e) = &st.last_error {
                failed.push(format!("server {i}: {e}"));
            }
        }
        if !failed.is_empty() {
            bail!("scrub did not finish: {}", failed.join("; "));
        }
        if diverged_total > 0 {
            println!(
                "{diverged_total} block(s) had copies that differ, each intact; resync rewrites them from the first copy under the file's write lease (server log: `scrub: a block's copies differ`)"
            );
        }
        if bad_total > 0 {
            println!(
                "{bad_total} chunk(s) failed their checksums; the servers record the damaged copies stale and resync rewrites them from another copy (see `morris status`)"
            );
        }
        if bad_total > 0 || diverged_total > 0 {
            return Ok(ExitCode::from(1));
        }
        println!("every chunk matched its checksum, and every copy the others");
        Ok(ExitCode::SUCCESS)
    })
}
