//! `sqlite`: several processes run write transactions on one SQLite
//! database in rollback-journal mode (`journal_mode=DELETE`). POSIX only.
//!
//! Each process loops: `BEGIN IMMEDIATE`; increment one of 16 counters;
//! insert (process, seq) into a log table; `COMMIT` — with a 30 s
//! busy_timeout; sometimes it also reads its own count back. SQLite's
//! correctness here rests on POSIX byte-range locks (fcntl) and on
//! write/fsync/unlink of the journal doing what POSIX says.
//!
//! **Promises**:
//! * no statement fails except with SQLITE_BUSY (allowed: the lock was not
//!   had within the busy timeout; the transaction is rolled back): no
//!   SQLITE_IOERR ("disk I/O error"), SQLITE_CORRUPT, SQLITE_NOTADB, ...;
//! * a process always sees its own committed transactions;
//! * afterwards, through every mount: `PRAGMA integrity_check` is `ok`, the
//!   counters sum to the number of log rows, and the log holds exactly the
//!   committed transactions (those whose COMMIT failed may or may not be
//!   there).
//!
//! By default every process uses the first mount: morris's FUSE mounts do
//! not implement POSIX locks, so the kernel keeps fcntl locks per mount and
//! processes on two mounts would not exclude each other (on a local
//! directory given twice they do). `--sqlite-all-mounts` spreads them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};
use serde::{Deserialize, Serialize};

use super::{from_ranges, spread, to_ranges};
use crate::access::{Access, ErrCode, FsError, TargetSpec};
use crate::clock::Pacer;
use crate::report::WorkerReport;
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// The database file.
const DB: &str = "db.sqlite";
/// Counters in the table.
const COUNTERS: u64 = 16;
/// Most transactions per second per process.
const TX_PER_SEC: u64 = 100;

fn db_path(t: &TargetSpec) -> Option<PathBuf> {
    match t {
        TargetSpec::Posix { dir } => Some(dir.join(DB)),
        TargetSpec::Nfs { .. } => None,
    }
}

/// What the summary says about where the processes ran.
pub fn note(ctx: &CoordCtx) -> String {
    let n = ctx.params.procs.max(1);
    if ctx.params.sqlite_all_mounts || ctx.targets.len() == 1 {
        format!(
            "{n} processes over {} mount(s)",
            if ctx.params.sqlite_all_mounts {
                ctx.targets.len()
            } else {
                1
            }
        )
    } else {
        format!(
            "{n} processes, all on {}; --sqlite-all-mounts spreads them over every mount \
             (for file systems whose POSIX locks hold across mounts, as morris's do); \
             the result is still checked through every mount",
            ctx.labels[0]
        )
    }
}

fn sql_err(op: &'static str, e: &rusqlite::Error) -> FsError {
    FsError {
        op,
        name: DB.into(),
        code: ErrCode::other(libc::EIO, e.to_string()),
    }
}

/// Creates the database: 16 counters at 0, an empty log.
pub fn setup(ctx: &mut CoordCtx, _home: &mut dyn Access) -> Result<serde_json::Value, FsError> {
    let Some(path) = db_path(&ctx.targets[0]) else {
        return Err(FsError {
            op: "sqlite",
            name: DB.into(),
            code: ErrCode::other(libc::EINVAL, "sqlite needs a POSIX target"),
        });
    };
    let c = Connection::open(&path).map_err(|e| sql_err("open", &e))?;
    c.query_row("PRAGMA journal_mode=DELETE", [], |r| r.get::<_, String>(0))
        .map_err(|e| sql_err("journal_mode", &e))?;
    c.execute_batch(
        "CREATE TABLE counters(id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
         CREATE TABLE log(proc INTEGER NOT NULL, seq INTEGER NOT NULL, counter INTEGER NOT NULL,
                          PRIMARY KEY(proc, seq));",
    )
    .map_err(|e| sql_err("create tables", &e))?;
    for id in 1..=COUNTERS {
        c.execute("INSERT INTO counters(id, n) VALUES (?1, 0)", [id as i64])
            .map_err(|e| sql_err("insert", &e))?;
    }
    drop(c);
    Ok(serde_json::Value::Null)
}

/// `procs` processes, all on the first target unless asked otherwise.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let targets: Vec<usize> = if ctx.params.sqlite_all_mounts {
        (0..ctx.targets.len()).collect()
    } else {
        vec![0]
    };
    spread("client", ctx.params.procs.max(1), &targets, 0)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Facts {
    proc_id: u64,
    committed: Vec<(u64, u64)>,
    uncertain: Vec<(u64, u64)>,
}

/// Names of SQLITE_IOERR's extended codes (`SQLITE_IOERR | n << 8`).
const IOERR_NAMES: [&str; 27] = [
    "",
    "READ",
    "SHORT_READ",
    "WRITE",
    "FSYNC",
    "DIR_FSYNC",
    "TRUNCATE",
    "FSTAT",
    "UNLOCK",
    "RDLOCK",
    "DELETE",
    "BLOCKED",
    "NOMEM",
    "ACCESS",
    "CHECKRESERVEDLOCK",
    "LOCK",
    "CLOSE",
    "DIR_CLOSE",
    "SHMOPEN",
    "SHMSIZE",
    "SHMLOCK",
    "SHMMAP",
    "SEEK",
    "DELETE_NOENT",
    "MMAP",
    "GETTEMPPATH",
    "CONVPATH",
];

/// An extended result code in words (`SQLITE_IOERR_FSTAT, extended code 1802`).
fn extended(ext: i32) -> String {
    if ext & 0xff == 10 {
        let name = usize::try_from(ext >> 8)
            .ok()
            .and_then(|i| IOERR_NAMES.get(i))
            .copied()
            .unwrap_or("?");
        format!("SQLITE_IOERR_{name}, extended code {ext}")
    } else {
        format!("extended code {ext}")
    }
}

/// A SQLite error with its extended code and the errno of the system call
/// that failed (what a file-system engineer needs to find the cause).
fn describe(e: &rusqlite::Error, c: &Connection) -> String {
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return e.to_string();
    };
    let code = extended(f.extended_code);
    // SAFETY: sqlite3_system_errno only reads a field of the connection,
    // which is open and used by this thread alone.
    let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(c.handle()) };
    if errno != 0 {
        format!("{e} ({code}; errno {})", crate::access::errno_name(errno))
    } else {
        format!("{e} ({code})")
    }
}

/// `Some(allowed?)`: how a SQLite error counts.
fn classify(e: &rusqlite::Error) -> (&'static str, bool) {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => ("SQLITE_BUSY", true),
        Some(ErrorCode::SystemIoFailure) => ("sqlite-ioerr", false),
        Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => {
            ("sqlite-corrupt", false)
        }
        _ => ("sqlite-error", false),
    }
}

/// Runs one SQLite client process.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let label = w.label(w.spec.target);
    let Some(path) = db_path(&w.spec.targets[w.spec.target]) else {
        anyhow::bail!("sqlite needs a POSIX target");
    };
    let me = w.spec.index as u64;
    let c = match Connection::open(&path) {
        Ok(c) => c,
        Err(e) => {
            w.violation(classify(&e).0, &label, "open the database", e.to_string());
            return Ok(());
        }
    };
    if let Err(e) = c.busy_timeout(Duration::from_secs(30)) {
        w.violation(classify(&e).0, &label, "busy_timeout", e.to_string());
    }
    if let Err(e) = c.query_row("PRAGMA journal_mode=DELETE", [], |r| r.get::<_, String>(0)) {
        w.violation(
            classify(&e).0,
            &label,
            "PRAGMA journal_mode=DELETE",
            e.to_string(),
        );
    }
    let mut committed = BTreeSet::new();
    let mut uncertain = BTreeSet::new();
    let mut pacer = Pacer::per_sec(TX_PER_SEC);
    let mut seq = 0u64;
    let err = |w: &mut WorkerCtx, what: &str, e: &rusqlite::Error, c: &Connection| {
        let (kind, allowed) = classify(e);
        *w.report
            .counters
            .errors
            .entry(kind.to_string())
            .or_default() += 1;
        if allowed {
            w.report
                .allowed("SQLITE_BUSY after the busy timeout (rolled back)");
        } else {
            w.violation(kind, &label, what, describe(e, c));
        }
    };
    while w.running() {
        pacer.wait();
        let counter = w.rng.range(1, COUNTERS);
        if let Err(e) = c.execute_batch("BEGIN IMMEDIATE") {
            err(w, "BEGIN IMMEDIATE", &e, &c);
            seq += 1;
            continue;
        }
        let body = c
            .execute(
                "UPDATE counters SET n = n + 1 WHERE id = ?1",
                [counter as i64],
            )
            .and_then(|_| {
                c.execute(
                    "INSERT INTO log(proc, seq, counter) VALUES (?1, ?2, ?3)",
                    [me as i64, seq as i64, counter as i64],
                )
            });
        match body {
            Err(e) => {
                err(w, &format!("UPDATE/INSERT of transaction {seq}"), &e, &c);
                let _ = c.execute_batch("ROLLBACK");
            }
            Ok(_) => match c.execute_batch("COMMIT") {
                Ok(()) => {
                    committed.insert(seq);
                    w.report.op("commit");
                }
                Err(e) => {
                    uncertain.insert(seq);
                    err(w, &format!("COMMIT of transaction {seq}"), &e, &c);
                    // A COMMIT that failed may leave the transaction open.
                    let _ = c.execute_batch("ROLLBACK");
                }
            },
        }
        seq += 1;
        if w.rng.chance(1, 10) {
            let mine: rusqlite::Result<i64> = c.query_row(
                "SELECT count(*) FROM log WHERE proc = ?1",
                [me as i64],
                |r| r.get(0),
            );
            match mine {
                Ok(n) if n < committed.len() as i64 => w.violation(
                    "sqlite-lost-commit",
                    &label,
                    "count my log rows",
                    format!(
                        "{n} rows, but {} of my transactions committed",
                        committed.len()
                    ),
                ),
                Ok(_) => w.report.op("read"),
                Err(e) => err(w, "SELECT count(*)", &e, &c),
            }
        }
    }
    drop(c);
    w.report.data = serde_json::to_value(Facts {
        proc_id: me,
        committed: to_ranges(&committed),
        uncertain: to_ranges(&uncertain),
    })?;
    Ok(())
}

/// What the database holds after the run: integrity_check's answer, the
/// counters' sum and the log's (process, seq) rows.
type FinalState = (String, i64, Vec<(u64, u64)>);

/// Integrity and sums through every mount.
pub fn verify(ctx: &mut CoordCtx, reports: &[WorkerReport], _home: &mut dyn Access) {
    let mut expect: BTreeMap<u64, (BTreeSet<u64>, BTreeSet<u64>)> = BTreeMap::new();
    for r in reports {
        if let Ok(f) = serde_json::from_value::<Facts>(r.data.clone()) {
            if r.worker != "coordinator" {
                expect.insert(
                    f.proc_id,
                    (from_ranges(&f.committed), from_ranges(&f.uncertain)),
                );
            }
        }
    }
    for k in 0..ctx.targets.len() {
        let label = ctx.labels[k].clone();
        let Some(path) = db_path(&ctx.targets[k]) else {
            continue;
        };
        let check = || -> rusqlite::Result<FinalState> {
            let c = Connection::open(&path)?;
            c.busy_timeout(Duration::from_secs(30))?;
            let ic: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
            let sum: i64 =
                c.query_row("SELECT coalesce(sum(n), 0) FROM counters", [], |r| r.get(0))?;
            let mut st = c.prepare("SELECT proc, seq FROM log")?;
            let rows = st
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((ic, sum, rows))
        };
        ctx.report.op("final-check");
        let (ic, sum, rows) = match check() {
            Ok(x) => x,
            Err(e) => {
                ctx.violation(
                    classify(&e).0,
                    &label,
                    "check the database after the run",
                    e.to_string(),
                );
                continue;
            }
        };
        if ic != "ok" {
            ctx.violation(
                "sqlite-corrupt",
                &label,
                "PRAGMA integrity_check",
                ic.chars().take(500).collect(),
            );
        }
        if sum != rows.len() as i64 {
            ctx.violation(
                "sqlite-torn-transaction",
                &label,
                "sum the counters",
                format!("counters sum to {sum}, the log has {} rows (each transaction adds one of each)", rows.len()),
            );
        }
        let mut got: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for (p, s) in rows {
            got.entry(p).or_default().insert(s);
        }
        for (p, (committed, uncertain)) in &expect {
            let have = got.remove(p).unwrap_or_default();
            let lost: Vec<u64> = committed.difference(&have).copied().collect();
            let extra: Vec<u64> = have
                .iter()
                .filter(|s| !committed.contains(s) && !uncertain.contains(s))
                .copied()
                .collect();
            if !lost.is_empty() {
                ctx.violation(
                    "sqlite-lost-commit",
                    &label,
                    "compare the log with the committed transactions",
                    format!(
                        "process {p}: {} committed transactions missing, e.g. seq {:?}",
                        lost.len(),
                        &lost[..lost.len().min(10)]
                    ),
                );
            }
            if !extra.is_empty() {
                ctx.violation(
                    "sqlite-phantom-commit",
                    &label,
                    "compare the log with the committed transactions",
                    format!(
                        "process {p}: {} transactions there that did not commit, e.g. seq {:?}",
                        extra.len(),
                        &extra[..extra.len().min(10)]
                    ),
                );
            }
        }
        for (p, s) in got {
            ctx.violation(
                "sqlite-phantom-commit",
                &label,
                "compare the log with the committed transactions",
                format!("{} rows of process {p}, which never ran", s.len()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_named() {
        assert_eq!(
            extended(10 | 7 << 8),
            "SQLITE_IOERR_FSTAT, extended code 1802"
        );
        assert_eq!(
            extended(10 | 10 << 8),
            "SQLITE_IOERR_DELETE, extended code 2570"
        );
        assert_eq!(extended(5), "extended code 5");
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert_eq!(classify(&busy), ("SQLITE_BUSY", true));
        let io = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(10 | 7 << 8), None);
        assert_eq!(classify(&io), ("sqlite-ioerr", false));
    }
}
