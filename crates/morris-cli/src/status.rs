//! `morris status`: the state and counters of every server of a volume.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Args;
use futures::future::join_all;
use morris_proto::{Reply, Request, ServerStats, Timestamp, VolumeDescriptor};
use serde::Serialize;

use crate::admin::{self, deadline, Session, CONNECT_TIMEOUT};
use crate::runtime;
use crate::size::human;
use morris_proto::auth::Key;

/// Arguments of `morris status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Address HOST:PORT of any server of the volume.
    pub addr: String,
    /// Also show how many requests of each kind every server has served.
    #[arg(long)]
    pub ops: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for each server before showing it as down.
    #[arg(long, default_value_t = 2.0, value_name = "SECS",
          value_parser = parse_secs)]
    pub timeout: f64,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 3600"
        )),
    }
}

/// One server's line of the report.
#[derive(Debug, Serialize)]
pub struct ServerReport {
    /// Position in the volume.
    pub index: usize,
    /// Address from the descriptor.
    pub address: String,
    /// `up`, `down`, `unformatted` or `wrong-volume`.
    pub state: &'static str,
    /// Why it is not `up`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its counters, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<ServerStats>,
    /// Files whose copies on this server missed changes (stale-copy records
    /// naming it, summed over every server that answered).
    pub stale_files: u64,
    /// `current`, `stale` (records exist, no resync running) or `resyncing`.
    pub copies: &'static str,
    /// Cache mode: this server's counters per binding it has used.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cache: Vec<morris_proto::BindingStatus>,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct VolumeReport {
    /// The volume descriptor as the first server gave it.
    pub volume: VolumeDescriptor,
    /// Every server, in layout order.
    pub servers: Vec<ServerReport>,
    /// `healthy` (every server up, every copy current), `resyncing` (a
    /// server is catching up copies it missed) or `degraded` (a server is
    /// down, or copies are stale and no resync is running).
    pub health: &'static str,
}

async fn probe(d: &VolumeDescriptor, key: &Key, index: usize, limit: Duration) -> ServerReport {
    let addr = &d.servers[index];
    let answer = deadline(limit, || format!("server {addr}"), async {
        let s = Session::open(
            addr,
            key,
            None,
            admin::random_client_id(),
            "morris-status",
            limit,
        )
        .await?;
        let st = match s.ask(&Request::Status).await? {
            Reply::Status(st) => *st,
            other => return Err(admin::unexpected(&Request::Status, addr, &other)),
        };
        // Cache counters: a server that predates them simply has none.
        let cache = match s.ask(&Request::CacheStatus).await {
            Ok(Reply::Cache(c)) => c,
            _ => Vec::new(),
        };
        Ok((s.descriptor, s.index, st, cache))
    })
    .await;
    let mut r = ServerReport {
        index,
        address: addr.clone(),
        state: "up",
        error: None,
        stats: None,
        stale_files: 0,
        copies: "current",
        cache: Vec::new(),
    };
    match answer {
        Err(e) => {
            r.state = "down";
            r.error = Some(format!("{e:#}"));
        }
        Ok((desc, idx, st, cache)) => {
            r.cache = cache;
            match desc {
                None => {
                    r.state = "unformatted";
                    r.error = Some("the server is not formatted".into());
                }
                Some(other) if other.uuid != d.uuid => {
                    r.state = "wrong-volume";
                    r.error = Some(format!("the server belongs to volume {}", other.uuid));
                }
                Some(_) if idx != Some(index as u32) => {
                    r.state = "wrong-volume";
                    r.error = Some(format!(
                        "the server thinks it is server {idx:?}, not {index}"
                    ));
                }
                Some(_) => {}
            }
            r.stats = Some(st);
        }
    }
    r
}

/// Asks `addr` for the volume, then every server for its counters.
pub async fn collect(addr: &str, key: &Key, limit: Duration) -> Result<VolumeReport> {
    let first = Session::open(
        addr,
        key,
        None,
        admin::random_client_id(),
        "morris-status",
        limit.max(CONNECT_TIMEOUT),
    )
    .await?;
    let volume = first
        .descriptor
        .ok_or_else(|| anyhow!("server {addr} is not formatted (see `morris format`)"))?;
    let servers = join_all((0..volume.servers.len()).map(|i| probe(&volume, key, i, limit))).await;
    let mut servers = servers;
    let mirrored = volume.replicas >= 2 && volume.servers.len() >= 2;
    let health = redundancy(&mut servers, mirrored);
    Ok(VolumeReport {
        volume,
        servers,
        health,
    })
}

/// Fills every server's stale-copy count and copy state from the records
/// the servers reported; returns the volume's health.
fn redundancy(servers: &mut [ServerReport], mirrored: bool) -> &'static str {
    let mut stale = vec![0u64; servers.len()];
    for st in servers.iter().filter_map(|s| s.stats.as_ref()) {
        for &(server, files) in &st.stale_by_server {
            if let Some(n) = stale.get_mut(server as usize) {
                *n += files;
            }
        }
    }
    let mut resyncing = false;
    for (s, n) in servers.iter_mut().zip(stale) {
        s.stale_files = n;
        let running = s.stats.as_ref().is_some_and(|st| st.resync.running);
        let rebuilding = s.stats.as_ref().is_some_and(|st| st.rebuilding);
        s.copies = match (n, running) {
            _ if rebuilding => "rebuilding",
            (0, _) => "current",
            (_, true) => "resyncing",
            (_, false) => "stale",
        };
        resyncing |= n > 0 && running;
    }
    // A replacement not yet rebuilt holds copies nobody may read yet.
    let rebuilding = servers.iter().any(|s| s.copies == "rebuilding");
    if servers.iter().any(|s| s.state != "up") || !metadata_whole(servers, mirrored) || rebuilding {
        "degraded"
    } else if resyncing {
        "resyncing"
    } else if servers.iter().any(|s| s.stale_files > 0) {
        "degraded"
    } else {
        "healthy"
    }
}

/// True if every metadata range is served by a primary and, on a mirrored
/// volume, its other copies are current: the primary says so and so does
/// every copy. (Both are asked: a copy that restarted is not current until
/// its primary has spoken with it again, and a primary learns of the
/// restart only when it next calls.)
fn metadata_whole(servers: &[ServerReport], mirrored: bool) -> bool {
    let copies: Vec<&morris_proto::RangeStatus> = servers
        .iter()
        .filter_map(|s| s.stats.as_ref())
        .flat_map(|st| st.ranges.iter())
        .collect();
    (0..servers.len() as u32).all(|r| {
        copies
            .iter()
            .any(|c| c.range == r && c.primary && c.ready && (!mirrored || c.peer_in_sync))
            && (!mirrored || copies.iter().all(|c| c.range != r || c.primary || c.ready))
    })
}

/// The METADATA column: the ranges a server keeps and their state
/// (`0:primary` serving with a current copy elsewhere, `0:primary/alone`
/// serving with no current copy, `0:primary/not-serving`, `3:copy`
/// current and ready to take over, `3:copy/behind`).
fn metadata_cell(s: &ServerReport) -> String {
    let Some(st) = &s.stats else {
        return "-".into();
    };
    let mirrored = st.ranges.len() > 1;
    let cells: Vec<String> = st
        .ranges
        .iter()
        .map(|r| {
            let what = match (r.primary, r.ready) {
                (true, true) if !mirrored || r.peer_in_sync => "primary",
                (true, true) => "primary/alone",
                (true, false) => "primary/not-serving",
                (false, true) => "copy",
                (false, false) => "copy/behind",
            };
            format!("{}:{what}", r.range)
        })
        .collect();
    cells.join(" ")
}

/// The CHECKSUMS column: `ok`, chunks found bad since the server started
/// (and how many damaged copies went to repair), or how far a scrub is.
fn checksums_cell(s: &ServerReport) -> String {
    let Some(st) = &s.stats else {
        return "-".into();
    };
    let i = &st.integrity;
    let scrub = if i.scrub.running {
        let pct = (i.scrub.bytes_done * 100)
            .checked_div(i.scrub.bytes_total)
            .unwrap_or(0)
            .min(100);
        format!(" scrubbing {pct}%")
    } else {
        String::new()
    };
    let scrub = match i.scrub.diverged_blocks {
        0 => scrub,
        n => format!(", {n} blocks' copies differed{scrub}"),
    };
    if i.bad_chunks == 0 {
        return format!("ok{scrub}");
    }
    let mut out = format!("{} bad, {} repairs", i.bad_chunks, i.repairs);
    if i.unrepairable > 0 {
        out.push_str(&format!(", {} unrepairable", i.unrepairable));
    }
    out + &scrub
}

/// The COPIES column: current, or how far the server's resync is.
fn copies_cell(s: &ServerReport) -> String {
    match (s.copies, &s.stats) {
        ("resyncing", Some(st)) => format!(
            "resyncing {}/{} files, {} copied",
            st.resync.files_done,
            st.resync.files_total,
            human(st.resync.bytes_copied)
        ),
        ("stale", _) => format!("stale: {} files", s.stale_files),
        (c, _) => c.to_string(),
    }
}

/// A UTC date and time, `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ts: Timestamp) -> String {
    let days = ts.secs.div_euclid(86_400);
    let rem = ts.secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Renders rows under headers; columns listed in `left` are left-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let mut width: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let w = width.get(i).copied().unwrap_or(0);
            if left.contains(&i) {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("{c:>w$}"));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// A service time for the table: `-` before any request, else µs or ms.
fn micros(us: u64) -> String {
    match us {
        0 => "-".to_string(),
        1..=9_999 => format!("{us}us"),
        _ => format!("{:.1}ms", us as f64 / 1000.0),
    }
}

/// The human-readable report.
pub fn render(r: &VolumeReport, ops: bool) -> String {
    let d = &r.volume;
    let up = r.servers.iter().filter(|s| s.state == "up").count();
    let mut out = format!(
        "volume {}: {}, {} of {} servers up; stripe unit {}, replicas {}, created {}\n\n",
        d.uuid,
        r.health,
        up,
        r.servers.len(),
        human(u64::from(d.stripe_unit)),
        d.replicas,
        utc(d.created)
    );
    let headers = [
        "IDX",
        "ADDRESS",
        "STATE",
        "COPIES",
        "CHECKSUMS",
        "METADATA",
        "INODES",
        "DATA-FILES",
        "DATA",
        "LEASES",
        "SESSIONS",
        "REQUESTS",
        "RECALLS",
        "IO-QUEUE",
        "READ-SVC",
        "WRITE-SVC",
        "DISK-FREE",
        "UPTIME",
    ];
    let rows: Vec<Vec<String>> = r
        .servers
        .iter()
        .map(|s| {
            let mut row = vec![
                s.index.to_string(),
                s.address.clone(),
                s.state.to_string(),
                copies_cell(s),
                checksums_cell(s),
                metadata_cell(s),
            ];
            match &s.stats {
                Some(st) => row.extend([
                    st.inodes.to_string(),
                    st.data_files.to_string(),
                    human(st.data_bytes),
                    st.leases.to_string(),
                    st.sessions.to_string(),
                    st.requests.to_string(),
                    st.recalls.to_string(),
                    st.io_inflight.to_string(),
                    micros(st.read_service_us),
                    micros(st.write_service_us),
                    human(st.disk_free),
                    duration(st.uptime_secs),
                ]),
                None => row.extend(std::iter::repeat_n("-".to_string(), 12)),
            }
            row
        })
        .collect();
    out.push_str(&table(&headers, &rows, &[1, 2, 3, 4, 5]));
    for s in r.servers.iter().filter(|s| s.error.is_some()) {
        out.push_str(&format!(
            "server {} ({}) {}: {}\n",
            s.index,
            s.address,
            s.state,
            s.error.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&render_cache(r));
    if ops {
        out.push('\n');
        out.push_str(&render_ops(r));
    }
    out
}

/// Cache mode: one line per binding, summed over the servers that use it.
fn render_cache(r: &VolumeReport) -> String {
    /// One binding summed over the servers.
    #[derive(Default)]
    struct Sum {
        url: String,
        servers: usize,
        down: usize,
        hits: u64,
        misses: u64,
        fetched: u64,
        cached: u64,
    }
    let mut by: BTreeMap<u64, Sum> = BTreeMap::new();
    for s in &r.servers {
        for b in &s.cache {
            let e = by.entry(b.binding).or_default();
            e.url.clone_from(&b.url);
            e.servers += 1;
            if !b.reachable {
                e.down += 1;
            }
            e.hits += b.hits;
            e.misses += b.misses;
            e.fetched += b.fetched_bytes;
            e.cached += b.cached_bytes;
        }
    }
    if by.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = by
        .iter()
        .map(|(id, e)| {
            vec![
                id.to_string(),
                if e.down == 0 {
                    "up".into()
                } else {
                    format!("DOWN on {} of {}", e.down, e.servers)
                },
                e.hits.to_string(),
                e.misses.to_string(),
                human(e.fetched),
                human(e.cached),
                e.url.clone(),
            ]
        })
        .collect();
    let mut out = String::from("\ncache bindings (morris cache status for details):\n");
    out.push_str(&table(
        &[
            "BINDING", "HOME", "HITS", "MISSES", "FETCHED", "CACHED", "URL",
        ],
        &rows,
        &[1, 6],
    ));
    out
}

fn render_ops(r: &VolumeReport) -> String {
    let mut by_op: BTreeMap<String, Vec<Option<u64>>> = BTreeMap::new();
    let n = r.servers.len();
    for s in &r.servers {
        if let Some(st) = &s.stats {
            for (op, count) in &st.requests_by_op {
                let row = by_op.entry(op.clone()).or_insert_with(|| vec![None; n]);
                row[s.index] = Some(row[s.index].unwrap_or(0) + count);
            }
        }
    }
    let mut ops: Vec<(String, Vec<Option<u64>>, u64)> = by_op
        .into_iter()
        .map(|(op, v)| {
            let total = v.iter().flatten().sum();
            (op, v, total)
        })
        .collect();
    ops.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let names: Vec<String> = (0..n).map(|i| format!("S{i}")).collect();
    let mut headers = vec!["OP"];
    headers.extend(names.iter().map(String::as_str));
    headers.push("TOTAL");
    let rows: Vec<Vec<String>> = ops
        .into_iter()
        .map(|(op, v, total)| {
            let mut row = vec![op];
            row.extend(
                v.into_iter()
                    .map(|c| c.map_or_else(|| "-".to_string(), |c| c.to_string())),
            );
            row.push(total.to_string());
            row
        })
        .collect();
    if rows.is_empty() {
        return "no requests counted\n".into();
    }
    table(&headers, &rows, &[0])
}

/// Runs `morris status`.
pub fn run(args: StatusArgs) -> Result<ExitCode> {
    let rt = runtime::build()?;
    let key = args.key.load()?.credential();
    let report = rt.block_on(collect(
        &args.addr,
        &key,
        Duration::from_secs_f64(args.timeout),
    ))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, args.ops));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(
            utc(Timestamp { secs: 0, nanos: 0 }),
            "1970-01-01 00:00:00 UTC"
        );
        assert_eq!(
            utc(Timestamp {
                secs: 951_782_400,
                nanos: 0
            }),
            "2000-02-29 00:00:00 UTC"
        );
        assert_eq!(
            utc(Timestamp {
                secs: 1_700_000_000,
                nanos: 0
            }),
            "2023-11-14 22:13:20 UTC"
        );
        assert_eq!(
            utc(Timestamp { secs: -1, nanos: 0 }),
            "1969-12-31 23:59:59 UTC"
        );
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["A", "NAME", "N"],
            &[
                vec!["0".into(), "x".into(), "100".into()],
                vec!["10".into(), "long".into(), "2".into()],
            ],
            &[1],
        );
        assert_eq!(t, " A  NAME    N\n 0  x     100\n10  long    2\n");
    }

    fn report() -> VolumeReport {
        let volume = VolumeDescriptor {
            uuid: uuid::Uuid::nil(),
            servers: vec!["h:1".into(), "h:2".into()],
            stripe_unit: 1 << 20,
            replicas: 1,
            created: Timestamp { secs: 0, nanos: 0 },
        };
        let stats = ServerStats {
            ranges: vec![serving(0, false)],
            inodes: 7,
            requests: 12,
            requests_by_op: vec![("Read".into(), 10), ("Hello".into(), 2)],
            ..ServerStats::default()
        };
        VolumeReport {
            volume,
            servers: vec![
                ServerReport {
                    index: 0,
                    address: "h:1".into(),
                    state: "up",
                    error: None,
                    stats: Some(stats),
                    stale_files: 0,
                    copies: "current",
                    cache: vec![morris_proto::BindingStatus {
                        binding: 9,
                        url: "nfs://filer/export".into(),
                        reachable: false,
                        hits: 5,
                        misses: 2,
                        fetched_bytes: 2 << 20,
                        cached_bytes: 3 << 20,
                        ..Default::default()
                    }],
                },
                ServerReport {
                    index: 1,
                    address: "h:2".into(),
                    state: "down",
                    error: Some("cannot connect".into()),
                    stats: None,
                    stale_files: 0,
                    copies: "current",
                    cache: Vec::new(),
                },
            ],
            health: "degraded",
        }
    }

    fn serving(range: u32, peer_in_sync: bool) -> morris_proto::RangeStatus {
        morris_proto::RangeStatus {
            range,
            primary: true,
            ready: true,
            gen: 1,
            peer_in_sync,
            ..Default::default()
        }
    }

    #[test]
    fn metadata_ranges_without_a_current_copy_make_the_volume_degraded() {
        let mut r = report();
        r.volume.replicas = 2;
        let copy = |range| morris_proto::RangeStatus {
            range,
            ready: true,
            gen: 1,
            ..Default::default()
        };
        r.servers[1].state = "up";
        r.servers[1].error = None;
        r.servers[0].stats.as_mut().unwrap().ranges = vec![serving(0, true), copy(1)];
        r.servers[1].stats = Some(ServerStats {
            ranges: vec![serving(1, true), copy(0)],
            ..ServerStats::default()
        });
        assert_eq!(redundancy(&mut r.servers, true), "healthy");
        // A replacement not yet rebuilt: degraded, whatever else holds.
        r.servers[1].stats.as_mut().unwrap().rebuilding = true;
        assert_eq!(redundancy(&mut r.servers, true), "degraded");
        assert_eq!(copies_cell(&r.servers[1]), "rebuilding");
        r.servers[1].stats.as_mut().unwrap().rebuilding = false;
        assert_eq!(redundancy(&mut r.servers, true), "healthy");
        assert_eq!(metadata_cell(&r.servers[0]), "0:primary 1:copy");
        // Server 0 restarted and server 1 has not called it yet: server 1
        // still counts the copy current, the copy knows it is not.
        r.servers[0].stats.as_mut().unwrap().ranges = vec![
            serving(0, true),
            morris_proto::RangeStatus {
                ready: false,
                ..copy(1)
            },
        ];
        assert_eq!(redundancy(&mut r.servers, true), "degraded");
        r.servers[0].stats.as_mut().unwrap().ranges = vec![serving(0, true), copy(1)];
        // Server 1 took range 0 over (server 0 lost it): one copy only.
        r.servers[0].stats.as_mut().unwrap().ranges = vec![
            morris_proto::RangeStatus {
                ready: false,
                ..copy(0)
            },
            copy(1),
        ];
        r.servers[1].stats.as_mut().unwrap().ranges = vec![serving(1, true), serving(0, false)];
        assert_eq!(redundancy(&mut r.servers, true), "degraded");
        assert_eq!(metadata_cell(&r.servers[0]), "0:copy/behind 1:copy");
        assert_eq!(metadata_cell(&r.servers[1]), "1:primary 0:primary/alone");
        // Nobody serves range 0.
        r.servers[1].stats.as_mut().unwrap().ranges = vec![serving(1, true)];
        assert_eq!(redundancy(&mut r.servers, true), "degraded");
    }

    #[test]
    fn stale_copies_make_the_volume_degraded_then_resyncing() {
        let mut r = report();
        r.servers[1].state = "up";
        r.servers[1].error = None;
        r.servers[1].stats = Some(ServerStats {
            ranges: vec![serving(1, false)],
            ..ServerStats::default()
        });
        assert_eq!(redundancy(&mut r.servers, false), "healthy");
        // Server 0 keeps records of 3 files whose copies on server 1 are stale.
        if let Some(st) = r.servers[0].stats.as_mut() {
            st.stale_by_server = vec![(1, 3)];
        }
        assert_eq!(redundancy(&mut r.servers, false), "degraded");
        assert_eq!(r.servers[1].stale_files, 3);
        assert_eq!(copies_cell(&r.servers[1]), "stale: 3 files");
        if let Some(st) = r.servers[1].stats.as_mut() {
            st.resync = morris_proto::ResyncStatus {
                running: true,
                files_total: 3,
                files_done: 1,
                bytes_copied: 5 << 20,
                ..Default::default()
            };
        }
        r.health = redundancy(&mut r.servers, false);
        assert_eq!(r.health, "resyncing");
        let text = render(&r, false);
        assert!(text.contains(": resyncing, 2 of 2 servers up"), "{text}");
        assert!(text.contains("resyncing 1/3 files, 5 MiB copied"), "{text}");
        r.servers[1].state = "down";
        assert_eq!(redundancy(&mut r.servers, false), "degraded");
    }

    #[test]
    fn renders_down_servers_and_ops() {
        let text = render(&report(), true);
        assert!(text.contains("1 of 2 servers up"), "{text}");
        let down = text.lines().find(|l| l.contains("h:2")).unwrap();
        assert!(down.contains("down"), "{text}");
        assert!(
            text.contains("server 1 (h:2) down: cannot connect"),
            "{text}"
        );
        let read = text.lines().find(|l| l.starts_with("Read")).unwrap();
        assert_eq!(
            read.split_whitespace().collect::<Vec<_>>(),
            ["Read", "10", "-", "10"]
        );
        let cache = text
            .lines()
            .find(|l| l.contains("nfs://filer/export"))
            .unwrap();
        assert_eq!(
            cache.split_whitespace().collect::<Vec<_>>(),
            [
                "9",
                "DOWN",
                "on",
                "1",
                "of",
                "1",
                "5",
                "2",
                "2",
                "MiB",
                "3",
                "MiB",
                "nfs://filer/export"
            ],
            "{text}"
        );
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["servers"][1]["state"], "down");
        assert_eq!(json["servers"][0]["cache"][0]["misses"], 2);
        assert_eq!(json["servers"][0]["stats"]["inodes"], 7);
    }
}
