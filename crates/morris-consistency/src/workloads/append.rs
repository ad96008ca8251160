//! `append`: O_APPEND writers on one file, from several processes spread
//! over the mounts. POSIX only.
//!
//! **Promise** (POSIX `write(2)`): with O_APPEND, "the file offset shall be
//! set to the end of the file prior to each write and no intervening file
//! modification operation shall occur between changing the file offset and
//! the write operation". So when P processes each append fixed-size
//! self-describing records (writer, seq, file, check value, newline), one
//! write(2) per record, every record whose write succeeded appears in the
//! file **exactly once, intact**, each writer's records **in its order**,
//! and nothing else is there (no zeros, no torn or overwritten records).
//! Writers move to a new file (`append.<n>`) every 5 s, opening it with
//! O_CREAT (not O_EXCL: concurrent creators must all succeed), in batches of
//! 1..50 records per open, sometimes with fsync before close.
//!
//! **Turn-taking variant** (`turns`): one process appends one line at a time
//! through each mount in turn, open/write/close each time, as
//! `for i in ..; do echo a >> M1/f; echo b >> M2/f; done` does: the file
//! has exactly as many lines as appends succeeded, in order.
//!
//! At the end the coordinator reads every file through every mount: all
//! mounts must return the same bytes, and the bytes must pass the checks.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{from_ranges, spread, to_ranges};
use crate::access::posix::close_checked;
use crate::access::{ErrCode, FsError, TargetSpec};
use crate::clock::{now_ns, Pacer};
use crate::records::{record, turn_line, verify_append, verify_turns, WriterExpect};
use crate::report::WorkerReport;
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// Seconds each `append.<n>` file is written to.
const ROUND_NS: u64 = 5_000_000_000;
/// Most records per second per writer (bounds the files on a fast file system).
const RECORDS_PER_SEC: u64 = 1000;
/// Most turn-taking appends per second.
const TURNS_PER_SEC: u64 = 200;
/// The turn-taking file.
const TURNS: &str = "turns";

/// What one writer did to one file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct FileFacts {
    written: Vec<(u64, u64)>,
    uncertain: Vec<(u64, u64)>,
}

/// A worker's facts for the final check.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Facts {
    Writer {
        writer: u32,
        files: BTreeMap<u32, FileFacts>,
    },
    Turns {
        count: u64,
        uncertain: bool,
    },
}

/// `procs` writers over the mounts, and one turn-taker.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let all: Vec<usize> = (0..ctx.targets.len()).collect();
    let mut v = spread("writer", ctx.params.procs.max(1), &all, 0);
    v.extend(spread("turns", 1, &all, 0));
    v
}

fn dir_of(t: &TargetSpec) -> Result<PathBuf, FsError> {
    match t {
        TargetSpec::Posix { dir } => Ok(dir.clone()),
        TargetSpec::Nfs { .. } => Err(FsError {
            op: "open(O_APPEND)",
            name: String::new(),
            code: ErrCode::other(libc::EINVAL, "append needs a POSIX target"),
        }),
    }
}

fn open_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
}

/// Runs a writer or the turn-taker.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    match w.spec.role.as_str() {
        "writer" => writer(w),
        "turns" => turns(w),
        r => anyhow::bail!("append has no role {r}"),
    }
}

fn file_index(w: &WorkerCtx) -> u32 {
    (now_ns().saturating_sub(w.spec.start_ns) / ROUND_NS) as u32
}

fn writer(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let label = w.label(w.spec.target);
    let dir = dir_of(&w.spec.targets[w.spec.target])?;
    let id = w.spec.index as u32;
    let mut files: BTreeMap<u32, (BTreeSet<u64>, BTreeSet<u64>)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut pacer = Pacer::per_sec(RECORDS_PER_SEC);
    while w.running() {
        let f = file_index(w);
        let name = format!("append.{f}");
        let mut file = match open_append(&dir.join(&name)) {
            Ok(file) => file,
            Err(e) => {
                let e = FsError::io("open(O_WRONLY|O_APPEND|O_CREAT)", &name, &e);
                w.fs_violation("open-failed", &label, "open the append file", &e);
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
        };
        w.report.op("open");
        let (written, uncertain) = files.entry(f).or_default();
        let batch = w.rng.range(1, 50);
        let mut this = Vec::new();
        let mut broken = false;
        for _ in 0..batch {
            if !w.running() || file_index(w) != f {
                break;
            }
            pacer.wait();
            let rec = record(w.spec.run_seed, id, seq, f);
            match file.write(&rec) {
                Ok(n) if n == rec.len() => {
                    written.insert(seq);
                    this.push(seq);
                    w.report.op("append");
                }
                Ok(n) => {
                    uncertain.insert(seq);
                    w.violation(
                        "short-append",
                        &label,
                        &format!("write(O_APPEND) of record {seq} to {name}"),
                        format!("wrote {n} of {} bytes", rec.len()),
                    );
                    broken = true;
                }
                Err(e) => {
                    uncertain.insert(seq);
                    let e = FsError::io("write(O_APPEND)", &name, &e);
                    w.fs_violation("append-failed", &label, &format!("append record {seq}"), &e);
                    broken = true;
                }
            }
            seq += 1;
            if broken {
                break;
            }
        }
        if !broken && w.rng.chance(1, 4) {
            w.report.op("fsync");
            if let Err(e) = file.sync_all() {
                let e = FsError::io("fsync", &name, &e);
                w.fs_violation("fsync-failed", &label, "fsync the append file", &e);
            }
        }
        w.report.op("close");
        if let Err(e) = close_checked(file) {
            let e = FsError::io("close", &name, &e);
            w.fs_violation("close-failed", &label, "close the append file", &e);
            // What the batch wrote may not have reached the file.
            for s in this {
                written.remove(&s);
                uncertain.insert(s);
            }
        }
    }
    let files = files
        .into_iter()
        .map(|(f, (wr, un))| {
            (
                f,
                FileFacts {
                    written: to_ranges(&wr),
                    uncertain: to_ranges(&un),
                },
            )
        })
        .collect();
    w.report.data = serde_json::to_value(Facts::Writer { writer: id, files })?;
    Ok(())
}

fn turns(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let dirs: Vec<PathBuf> = w
        .spec
        .targets
        .iter()
        .map(dir_of)
        .collect::<Result<_, _>>()?;
    let n = dirs.len() as u64;
    let mut i = 0u64;
    let mut uncertain = false;
    let mut pacer = Pacer::per_sec(TURNS_PER_SEC);
    while w.running() {
        pacer.wait();
        let m = (i % n) as usize;
        let label = w.label(m);
        let op = format!("echo line {i} >> {TURNS} (open O_APPEND, write, close)");
        let mut f = match open_append(&dirs[m].join(TURNS)) {
            Ok(f) => f,
            Err(e) => {
                let e = FsError::io("open(O_APPEND)", TURNS, &e);
                w.fs_violation("open-failed", &label, &op, &e);
                break;
            }
        };
        let line = turn_line(w.spec.run_seed, i, m as u32);
        let wrote = f.write(&line);
        let closed = close_checked(f);
        match (wrote, closed) {
            (Ok(k), Ok(())) if k == line.len() => {
                w.report.op("turn-append");
                i += 1;
            }
            (Ok(k), Ok(())) => {
                w.violation(
                    "short-append",
                    &label,
                    &op,
                    format!("wrote {k} of {} bytes", line.len()),
                );
                uncertain = true;
                break;
            }
            (Err(e), _) | (Ok(_), Err(e)) => {
                let e = FsError::io("write/close", TURNS, &e);
                w.fs_violation("append-failed", &label, &op, &e);
                uncertain = true;
                break;
            }
        }
    }
    w.report.data = serde_json::to_value(Facts::Turns {
        count: i,
        uncertain,
    })?;
    Ok(())
}

/// Reads `name` through every target; reports targets that cannot read it
/// or disagree with the first. Returns the first target's bytes.
fn read_everywhere(ctx: &mut CoordCtx, name: &str) -> Option<Vec<u8>> {
    let mut first: Option<Vec<u8>> = None;
    for k in 0..ctx.targets.len() {
        let label = ctx.labels[k].clone();
        let Ok(dir) = dir_of(&ctx.targets[k]) else {
            continue;
        };
        match std::fs::read(dir.join(name)) {
            Ok(d) => match &first {
                None => first = Some(d),
                Some(f) if *f != d => {
                    let at = f
                        .iter()
                        .zip(&d)
                        .position(|(a, b)| a != b)
                        .unwrap_or(f.len().min(d.len()));
                    ctx.violation(
                        "mounts-disagree",
                        &label,
                        &format!("read {name} after the run"),
                        format!(
                            "{} bytes here, {} through {}; first difference at offset {at}",
                            d.len(),
                            f.len(),
                            ctx.labels[0]
                        ),
                    );
                }
                Some(_) => {}
            },
            Err(e) => {
                let e = FsError::io("read", name, &e);
                ctx.violation(
                    "read-failed",
                    &label,
                    &format!("read {name} after the run"),
                    e.to_string(),
                );
            }
        }
    }
    first
}

/// Reads every file back through every mount and checks it.
pub fn verify(ctx: &mut CoordCtx, reports: &[WorkerReport]) {
    let mut per_file: BTreeMap<u32, BTreeMap<u32, WriterExpect>> = BTreeMap::new();
    let mut turn_facts = None;
    for r in reports {
        match serde_json::from_value::<Facts>(r.data.clone()) {
            Ok(Facts::Writer { writer, files }) => {
                for (f, facts) in files {
                    per_file.entry(f).or_default().insert(
                        writer,
                        WriterExpect {
                            written: from_ranges(&facts.written),
                            uncertain: from_ranges(&facts.uncertain),
                        },
                    );
                }
            }
            Ok(Facts::Turns { count, uncertain }) => turn_facts = Some((count, uncertain)),
            Err(_) => {}
        }
    }
    let home = ctx.labels[0].clone();
    for (f, expect) in &per_file {
        let name = format!("append.{f}");
        let Some(data) = read_everywhere(ctx, &name) else {
            continue;
        };
        let check = verify_append(ctx.run_seed, *f, &data, expect);
        ctx.report.op("records-checked");
        for finding in check.findings {
            let at = finding
                .offset
                .map(|o| format!(" at offset {o}"))
                .unwrap_or_default();
            ctx.violation(
                finding.kind,
                &home,
                &format!(
                    "check {name} ({} bytes, {} valid records){at}",
                    data.len(),
                    check.records
                ),
                finding.detail,
            );
        }
    }
    if let Some((count, uncertain)) = turn_facts {
        if count > 0 || uncertain {
            if let Some(data) = read_everywhere(ctx, TURNS) {
                let n = ctx.targets.len() as u32;
                for finding in verify_turns(ctx.run_seed, &data, count, n, uncertain) {
                    let at = finding
                        .offset
                        .map(|o| format!(" at offset {o}"))
                        .unwrap_or_default();
                    ctx.violation(
                        finding.kind,
                        &home,
                        &format!("check {TURNS} ({} bytes){at}", data.len()),
                        finding.detail,
                    );
                }
            }
        }
    }
}
