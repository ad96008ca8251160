//! `morris fsck`: checks a volume's namespace against its inodes and data,
//! and with `--repair` fixes what it safely can.

mod check;
mod repair;
mod scan;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use futures::future::join_all;
use indicatif::{ProgressBar, ProgressStyle};
use morris_proto::layout::Layout;
use morris_proto::{Timestamp, VolumeDescriptor};

use crate::admin::{self, Session, CONNECT_TIMEOUT};
use crate::runtime;
use crate::size::human;
use check::{Report, Snapshot};

/// Arguments of `morris fsck`.
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Address HOST:PORT of any server of the volume.
    pub addr: String,
    /// Fix what can be fixed: remove dangling entries, correct link counts and
    /// directory counts, reclaim garbage older than --min-age.
    #[arg(long)]
    pub repair: bool,
    /// Only garbage (and counts) whose ctime is older than this many seconds
    /// is repaired, so that creates in flight on live clients are not touched.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub min_age: u64,
    /// List every finding (by default the first 20 of each kind).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// Opens a session with every server of `d`; fsck needs them all.
async fn open_all(
    d: &VolumeDescriptor,
    key: &morris_proto::auth::Key,
    join: bool,
) -> Result<Vec<Session>> {
    let id = admin::random_client_id();
    let volume = join.then_some(d.uuid);
    let opened = join_all(
        d.servers
            .iter()
            .map(|a| Session::open(a, key, volume, id, "morris-fsck", CONNECT_TIMEOUT)),
    )
    .await;
    let mut out = Vec::new();
    for (i, s) in opened.into_iter().enumerate() {
        let s = s.with_context(|| {
            format!(
                "fsck needs every server, and server {i} ({}) is unavailable",
                d.servers[i]
            )
        })?;
        match &s.descriptor {
            Some(x) if x.uuid == d.uuid && s.index == Some(i as u32) => out.push(s),
            _ => {
                return Err(anyhow!(
                    "server {i} ({}) does not hold volume {} as server {i}",
                    d.servers[i],
                    d.uuid
                ))
            }
        }
    }
    Ok(out)
}

fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {msg} [{bar:30}] {pos}/{len} records ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Reads every server, while the same servers serve the same metadata
/// ranges before and after (a scan during a takeover could miss a range).
async fn scan_all(sessions: &[Session], what: &str) -> Result<Snapshot> {
    for _ in 0..3 {
        let before = serving_wait(sessions).await?;
        let total = scan::count(sessions).await;
        let bar = progress(total, what);
        let plain = crate::progress::plain_lines(
            &bar,
            &format!("fsck {what}"),
            crate::progress::Units::Count,
        );
        let snap = scan::scan(sessions, &bar).await;
        bar.finish_and_clear();
        drop(plain);
        let snap = snap?;
        if serving_wait(sessions).await? == before {
            return Ok(snap);
        }
        eprintln!(
            "fsck: a metadata range changed hands while the servers were read; reading again"
        );
    }
    anyhow::bail!(
        "metadata ranges kept changing hands while fsck read the servers; nothing was changed, try again"
    )
}

/// [`serving`], waiting up to a few lease times for every range to be
/// served (after a restart or a takeover).
async fn serving_wait(sessions: &[Session]) -> Result<Vec<(usize, u64)>> {
    let lease = sessions.first().map_or(10_000, |s| u64::from(s.lease_ms));
    let until = std::time::Instant::now() + Duration::from_millis(4 * lease + 5_000);
    loop {
        match serving(sessions).await {
            Ok(v) => return Ok(v),
            Err(e) if std::time::Instant::now() >= until => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Which server serves each metadata range, and at which generation. A
/// server lists the inodes and entries of the ranges it serves; one that
/// nobody serves (a takeover or a lapsed ownership under way) would be
/// missing from the scan, its entries' inodes taken for lost: fsck
/// refuses to go on then.
async fn serving(sessions: &[Session]) -> Result<Vec<(usize, u64)>> {
    let mut all = Vec::with_capacity(sessions.len());
    for s in sessions {
        let req = morris_proto::Request::Status;
        match s.ask(&req).await? {
            morris_proto::Reply::Status(st) => all.push(st.ranges),
            other => return Err(admin::unexpected(&req, &s.addr, &other)),
        }
    }
    served_by(&all)
}

/// [`serving`] from each server's ranges (in server order).
fn served_by(servers: &[Vec<morris_proto::RangeStatus>]) -> Result<Vec<(usize, u64)>> {
    let mut by_range: Vec<Option<(usize, u64)>> = vec![None; servers.len()];
    for (i, ranges) in servers.iter().enumerate() {
        for r in ranges.iter().filter(|r| r.primary && r.ready) {
            if let Some(slot) = by_range.get_mut(r.range as usize) {
                if slot.is_some() {
                    anyhow::bail!(
                        "metadata range {} is served by two servers at once by their word; nothing was changed, try again",
                        r.range
                    );
                }
                *slot = Some((i, r.gen));
            }
        }
    }
    by_range
        .into_iter()
        .enumerate()
        .map(|(r, x)| {
            x.ok_or_else(|| {
                anyhow!(
                    "metadata range {r} is served by no server now (a takeover, or a primary whose ownership lapsed): its inodes and entries cannot be read; nothing was changed, try again when `morris status` shows it served"
                )
            })
        })
        .collect()
}

fn name(n: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(n))
}

/// Lists the findings, at most `limit` of each kind.
fn render(r: &Report, limit: usize) -> String {
    let mut out = String::new();
    fn section<T>(
        out: &mut String,
        title: &str,
        items: &[T],
        limit: usize,
        f: impl Fn(&T) -> String,
    ) {
        if items.is_empty() {
            return;
        }
        out.push_str(&format!("{title} ({}):\n", items.len()));
        for it in items.iter().take(limit) {
            out.push_str(&format!("  {}\n", f(it)));
        }
        if items.len() > limit {
            out.push_str(&format!(
                "  ... and {} more (--all lists them)\n",
                items.len() - limit
            ));
        }
    }
    if r.root_missing {
        out.push_str("ERROR: the root directory is missing\n");
    }
    section(
        &mut out,
        "ERROR dangling entries",
        &r.dangling,
        limit,
        |d| {
            format!(
                "directory {} entry {} names inode {} gen {}, {}",
                d.entry.dir,
                name(&d.entry.name),
                d.entry.child.id,
                d.entry.child.gen,
                match d.found_gen {
                    None => "which does not exist".to_string(),
                    Some(g) => format!("which has gen {g}"),
                }
            )
        },
    );
    section(
        &mut out,
        "ERROR entries of missing directories",
        &r.orphan_entries,
        limit,
        |o| {
            format!(
                "entry {} in {} {} names inode {}",
                name(&o.entry.name),
                match o.dir_kind {
                    None => "missing directory".to_string(),
                    Some(k) => format!("non-directory ({k:?})"),
                },
                o.entry.dir,
                o.entry.child.id
            )
        },
    );
    section(
        &mut out,
        "ERROR directory counts",
        &r.dir_mismatches,
        limit,
        |m| {
            format!(
                "directory {}: size {} but {} entries, nlink {} but {} expected",
                m.id, m.size, m.want_size, m.nlink, m.want_nlink
            )
        },
    );
    section(
        &mut out,
        "ERROR link counts",
        &r.nlink_mismatches,
        limit,
        |m| {
            format!(
                "inode {}: nlink {} but {} entries name it",
                m.id, m.nlink, m.want
            )
        },
    );
    section(
        &mut out,
        "ERROR directory parents",
        &r.parent_mismatches,
        limit,
        |m| {
            format!(
                "directory {}: parent {} but its entry is in {}",
                m.id, m.parent, m.want
            )
        },
    );
    section(
        &mut out,
        "ERROR directories with extra names",
        &r.dir_links,
        limit,
        |m| format!("directory {} is named by {} entries", m.id, m.names),
    );
    section(
        &mut out,
        "garbage: unreachable inodes",
        &r.unreachable,
        limit,
        |u| {
            format!(
                "inode {} ({:?}){}{}",
                u.id,
                u.kind,
                if u.orphan {
                    " no name left (kept while a client has it open)"
                } else {
                    ""
                },
                if u.aged { "" } else { " changed recently" }
            )
        },
    );
    section(
        &mut out,
        "garbage: data without an inode",
        &r.orphan_data,
        limit,
        |d| format!("file {} on server {}: {}", d.id, d.server, human(d.bytes)),
    );
    section(
        &mut out,
        "degraded: stale copies waiting for their server's resync",
        &r.stale_copies,
        limit,
        |(id, server, from)| format!("file {id}: server {server}, blocks {from} and above"),
    );
    out
}

fn summary(d: &VolumeDescriptor, snap: &Snapshot, r: &Report) -> String {
    let reclaimable = r.unreachable.iter().filter(|u| u.aged).count();
    let orphan_bytes: u64 = r.orphan_data.iter().map(|x| x.bytes).sum();
    format!(
        "fsck: volume {}: {} inodes, {} entries, {} data files on {} servers; \
         {} errors ({} dangling entries, {} entries of missing directories, {} mismatches{}); \
         garbage: {} unreachable inodes ({} older than the minimum age), {} orphan data files ({}); \
         redundancy: {} stale copies",
        d.uuid,
        snap.inodes.len(),
        snap.entries.len(),
        snap.data.len(),
        d.servers.len(),
        r.errors(),
        r.dangling.len(),
        r.orphan_entries.len(),
        r.mismatches(),
        if r.root_missing { ", root missing" } else { "" },
        r.unreachable.len(),
        reclaimable,
        r.orphan_data.len(),
        human(orphan_bytes),
        r.stale_copies.len()
    )
}

async fn fsck(args: &FsckArgs) -> Result<ExitCode> {
    // Repairs are an administrator's: they need the volume key.
    let key = if args.repair {
        args.key.load_volume_key("morris fsck --repair")?
    } else {
        args.key.load()?
    }
    .credential();
    let first = Session::open(
        &args.addr,
        &key,
        None,
        admin::random_client_id(),
        "morris-fsck",
        CONNECT_TIMEOUT,
    )
    .await?;
    let d = first
        .descriptor
        .clone()
        .ok_or_else(|| anyhow!("server {} is not formatted", args.addr))?;
    drop(first);
    let sessions = open_all(&d, &key, args.repair).await?;
    let layout = Layout::new(d.servers.len() as u32, d.stripe_unit, u32::from(d.replicas));
    let limit = if args.all { usize::MAX } else { 20 };

    let snap = scan_all(&sessions, "scanning").await?;
    let report = check::check(&snap, check::cutoff(Timestamp::now(), args.min_age));
    print!("{}", render(&report, limit));
    println!("{}", summary(&d, &snap, &report));
    if !args.repair || report.errors() + report.garbage() == 0 {
        return Ok(if report.errors() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }

    // Act only on what a second scan confirms: a client changing things
    // during the first one can make a finding appear that is not real.
    let snap2 = scan_all(&sessions, "re-scanning to confirm").await?;
    let cutoff = check::cutoff(Timestamp::now(), args.min_age);
    let confirmed = check::check(&snap2, cutoff).confirmed_by(&report);
    let plan = check::plan(&snap2, &confirmed);
    for s in &plan.skipped {
        println!("not repaired: {s}");
    }
    if plan.is_empty() {
        println!(
            "repair: nothing to do safely ({} errors confirmed by a second scan)",
            confirmed.errors()
        );
        return Ok(if confirmed.errors() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    println!("repairing: {} actions", plan.len());
    let outcome = repair::Repairer::new(&sessions, layout, cutoff)
        .run(&plan)
        .await;
    for s in &outcome.skipped {
        println!("skipped: {s}");
    }
    for f in &outcome.failed {
        println!("FAILED: {f}");
    }
    println!(
        "repair: {} actions done, {} skipped, {} failed",
        outcome.done,
        outcome.skipped.len(),
        outcome.failed.len()
    );
    let after = scan_all(&sessions, "verifying").await?;
    let left = check::check(&after, check::cutoff(Timestamp::now(), args.min_age));
    println!("after repair: {}", summary(&d, &after, &left));
    Ok(if left.errors() == 0 && outcome.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs `morris fsck`: exit 0 when no errors (garbage alone is not an error)
/// remain, 1 otherwise.
pub fn run(args: FsckArgs) -> Result<ExitCode> {
    let rt = runtime::build()?;
    rt.block_on(fsck(&args))
}

#[cfg(test)]
mod tests {
    use super::served_by;
    use morris_proto::RangeStatus;

    fn primary(range: u32, gen: u64, ready: bool) -> RangeStatus {
        RangeStatus {
            range,
            primary: true,
            ready,
            gen,
            ..Default::default()
        }
    }

    #[test]
    fn every_range_must_have_one_serving_primary() {
        let copy = RangeStatus {
            range: 0,
            ready: true,
            ..Default::default()
        };
        let ok = vec![
            vec![primary(0, 1, true)],
            vec![primary(1, 2, true), copy.clone()],
        ];
        assert_eq!(served_by(&ok).unwrap(), vec![(0, 1), (1, 2)]);
        // Range 1's primary not serving yet (restarted, lapsed): refused.
        let gap = vec![vec![primary(0, 1, true)], vec![primary(1, 2, false), copy]];
        assert!(served_by(&gap).unwrap_err().to_string().contains("range 1"));
        // Taken over: the new server and generation differ from before.
        let moved = vec![vec![primary(0, 1, true), primary(1, 3, true)], vec![]];
        assert_ne!(served_by(&moved).unwrap(), served_by(&ok).unwrap());
        // Two at once by their word: refused.
        let two = vec![
            vec![primary(0, 1, true)],
            vec![primary(0, 2, true), primary(1, 1, true)],
        ];
        assert!(served_by(&two).is_err());
    }
}
