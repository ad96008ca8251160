//! `create-unlink`: one process creates and unlinks a few names in a loop
//! while others stat, open and read those names.
//!
//! The creator picks one of the names `cu.0..cu.3` at random: if it exists
//! (its own bookkeeping: it is the only one creating or unlinking) it
//! unlinks it, otherwise it creates it with O_EXCL, writes a new version of
//! self-verifying content (up to 64 KiB), fsyncs and closes it. Observers
//! on every mount stat, or open, fstat, read whole and close, random names.
//!
//! **Promises**:
//! * the creator's create (O_EXCL) and unlink always succeed: nobody else
//!   touches these names (`create-failed`, `unlink-failed`: ENOENT, EEXIST,
//!   EIO, ESTALE are all violations);
//! * observers may get ENOENT from stat or open (the name may be absent):
//!   allowed; any other error there, and any error at all through an open
//!   descriptor (read, fstat, close: ESTALE, EIO, ENOENT), is a violation —
//!   POSIX keeps an unlinked file readable through descriptors open on it;
//! * what a successful open reads is a prefix of one valid version of that
//!   name's content (never zeros, another name's bytes or garbage), and the
//!   whole of it when the open started after the creator's close of that
//!   version returned (`short-read`; checked by the coordinator from
//!   `CLOCK_MONOTONIC` times).
//!
//! Over NFSv3 (no open state) a READ may answer NFS3ERR_STALE once the file
//! was removed: allowed only if the creator's unlink of that very file (same
//! file id) had started by then. A stat or open by path is a LOOKUP and then
//! requests on the handle it returned: STALE there is allowed only if an
//! unlink of that name ran while the stat or open did.

use serde::{Deserialize, Serialize};

use super::spread;
use crate::access::Access;
use crate::clock::{now_ns, secs_since, Pacer};
use crate::content;
use crate::report::{Violation, WorkerReport};
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// How many names are cycled.
const NAMES: usize = 4;
/// Most creator steps per second.
const STEPS_PER_SEC: u64 = 300;
/// Most observer operations per second.
const LOOKS_PER_SEC: u64 = 500;
/// Most events an observer reports.
const MAX_EVENTS: usize = 20_000;

fn name(i: usize) -> String {
    format!("cu.{i}")
}

/// One created file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gen {
    stream: u32,
    version: u64,
    len: usize,
    ino: Option<u64>,
    t_create: u64,
    /// When close returned (None: some step failed).
    t_closed: Option<u64>,
    /// When its unlink was called.
    t_unlink: Option<u64>,
    /// When its unlink returned.
    #[serde(default)]
    t_unlinked: Option<u64>,
}

/// Something an observer saw that only the creator's times can judge.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    /// `short` (an incomplete version), `stale` (NFS READ answered STALE) or
    /// `lookup-stale` (NFS stat or open by path answered STALE).
    what: String,
    stream: u32,
    version: Option<u64>,
    ino: Option<u64>,
    t_open: u64,
    t_end: u64,
    len: usize,
    target: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Facts {
    #[default]
    None,
    Creator {
        gens: Vec<Gen>,
    },
    Observer {
        events: Vec<Event>,
    },
}

/// One creator on a target chosen by the seed, `procs` observers from the next.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let n = ctx.targets.len();
    let all: Vec<usize> = (0..n).collect();
    let ct = (ctx.run_seed % n as u64) as usize;
    let mut v = spread("creator", 1, &all, ct);
    v.extend(spread("observer", ctx.params.procs.max(1), &all, ct + 1));
    v
}

/// Runs the creator or an observer.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let Some(mut a) = w.connect(w.spec.target) else {
        return Ok(());
    };
    match w.spec.role.as_str() {
        "creator" => creator(w, a.as_mut()),
        "observer" => observer(w, a.as_mut()),
        r => anyhow::bail!("create-unlink has no role {r}"),
    }
}

fn creator(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let mut present = [false; NAMES];
    let mut last_gen: [Option<usize>; NAMES] = [None; NAMES];
    let mut gens: Vec<Gen> = Vec::new();
    let mut v = 1u64;
    let mut pacer = Pacer::per_sec(STEPS_PER_SEC);
    while w.running() {
        pacer.wait();
        let i = w.rng.index(NAMES);
        let n = name(i);
        if present[i] {
            let t = now_ns();
            match a.remove(&n) {
                Ok(()) => {
                    let done = now_ns();
                    w.report.op("unlink");
                    present[i] = false;
                    if let Some(g) = last_gen[i].and_then(|g| gens.get_mut(g)) {
                        g.t_unlink = Some(t);
                        g.t_unlinked = Some(done);
                    }
                }
                Err(e) => {
                    let gone = matches!(a.stat(&n), Err(ref s) if s.is(libc::ENOENT));
                    if gone {
                        present[i] = false;
                        if let Some(g) = last_gen[i].and_then(|g| gens.get_mut(g)) {
                            g.t_unlink = Some(t);
                            g.t_unlinked = Some(now_ns());
                        }
                    }
                    w.report.error(&e);
                    w.violation(
                        "unlink-failed",
                        &label,
                        &format!("unlink {n}"),
                        format!(
                            "{e} ({})",
                            if gone {
                                "the name is gone anyway"
                            } else {
                                "the name is still there"
                            }
                        ),
                    );
                }
            }
            continue;
        }
        let t_create = now_ns();
        let mut h = match a.create_excl(&n) {
            Ok(h) => h,
            Err(e) => {
                if e.is(libc::EEXIST) {
                    present[i] = true;
                }
                w.fs_violation(
                    "create-failed",
                    &label,
                    &format!("create {n} (O_EXCL; it was unlinked)"),
                    &e,
                );
                continue;
            }
        };
        w.report.op("create");
        present[i] = true;
        let len = w.rng.range(content::HEADER_LEN as u64, 64 << 10) as usize;
        let data = content::build(w.spec.run_seed, i as u32, v, len);
        let mut ok = true;
        if let Err(e) = a.write_at(&mut h, 0, &data) {
            w.fs_violation(
                "write-failed",
                &label,
                &format!("write {len} bytes to {n}"),
                &e,
            );
            ok = false;
        }
        if ok {
            if let Err(e) = a.sync(&mut h) {
                w.fs_violation("fsync-failed", &label, &format!("fsync {n}"), &e);
                ok = false;
            }
        }
        let ino = match a.attr(&mut h) {
            Ok(at) => Some(at.ino),
            Err(e) => {
                w.fs_violation("fstat-failed", &label, &format!("fstat {n}"), &e);
                None
            }
        };
        if let Err(e) = a.close(h) {
            w.fs_violation("close-failed", &label, &format!("close {n}"), &e);
            ok = false;
        }
        last_gen[i] = Some(gens.len());
        gens.push(Gen {
            stream: i as u32,
            version: v,
            len,
            ino,
            t_create,
            t_closed: ok.then(now_ns),
            t_unlink: None,
            t_unlinked: None,
        });
        v += 1;
    }
    w.report.data = serde_json::to_value(Facts::Creator { gens })?;
    Ok(())
}

fn observer(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let mut events = Vec::new();
    let mut pacer = Pacer::per_sec(LOOKS_PER_SEC);
    while w.running() {
        pacer.wait();
        let i = w.rng.index(NAMES);
        let n = name(i);
        let t_open = now_ns();
        // Over NFSv3 a path is a LOOKUP, then requests on the handle it
        // gave: a removal in between answers STALE. Judged later, against
        // the creator's unlink times.
        let lookup_stale =
            |events: &mut Vec<Event>, w: &mut WorkerCtx, e: &crate::access::FsError| {
                w.report.error(e);
                if events.len() < MAX_EVENTS {
                    events.push(Event {
                        what: "lookup-stale".into(),
                        stream: i as u32,
                        version: None,
                        ino: None,
                        t_open,
                        t_end: now_ns(),
                        len: 0,
                        target: label.clone(),
                    });
                }
            };
        if w.rng.chance(1, 3) {
            match a.stat(&n) {
                Ok(_) => w.report.op("stat"),
                Err(e) if e.is(libc::ENOENT) => {
                    w.report.error(&e);
                    w.report.allowed("stat ENOENT (the name may be absent)");
                }
                Err(e) if a.is_nfs() && e.is(libc::ESTALE) => lookup_stale(&mut events, w, &e),
                Err(e) => w.fs_violation("stat-failed", &label, &format!("stat {n}"), &e),
            }
            continue;
        }
        let mut h = match a.open_read(&n) {
            Ok(h) => h,
            Err(e) if e.is(libc::ENOENT) => {
                w.report.error(&e);
                w.report.allowed("open ENOENT (the name may be absent)");
                continue;
            }
            Err(e) if a.is_nfs() && e.is(libc::ESTALE) => {
                lookup_stale(&mut events, w, &e);
                continue;
            }
            Err(e) => {
                w.fs_violation("open-failed", &label, &format!("open {n}"), &e);
                continue;
            }
        };
        w.report.op("open");
        let ino = if a.is_nfs() {
            h.known_ino()
        } else {
            match a.attr(&mut h) {
                Ok(at) => Some(at.ino),
                Err(e) => {
                    w.fs_violation(
                        "fstat-failed",
                        &label,
                        &format!("fstat {n} through an open descriptor"),
                        &e,
                    );
                    None
                }
            }
        };
        match a.read_to_end(&mut h) {
            Err(e) if a.is_nfs() && e.is(libc::ESTALE) => {
                w.report.error(&e);
                if events.len() < MAX_EVENTS {
                    events.push(Event {
                        what: "stale".into(),
                        stream: i as u32,
                        version: None,
                        ino,
                        t_open,
                        t_end: now_ns(),
                        len: 0,
                        target: label.clone(),
                    });
                }
            }
            Err(e) => w.fs_violation(
                "read-failed",
                &label,
                &format!("read {n} through an open descriptor"),
                &e,
            ),
            Ok(data) => match content::verify_prefix(w.spec.run_seed, i as u32, &data) {
                Err(be) => w.violation(
                    be.kind(),
                    &label,
                    &format!("read {n} whole"),
                    format!(
                        "expected (a prefix of) a valid version of {n}, got {} bytes: {be}",
                        data.len()
                    ),
                ),
                Ok(Some(info)) if data.len() as u64 == info.len => w.report.op("read-complete"),
                Ok(info) => {
                    w.report.op("read-partial");
                    if events.len() < MAX_EVENTS {
                        events.push(Event {
                            what: "short".into(),
                            stream: i as u32,
                            version: info.map(|x| x.version),
                            ino,
                            t_open,
                            t_end: now_ns(),
                            len: data.len(),
                            target: label.clone(),
                        });
                    }
                }
            },
        }
        if let Err(e) = a.close(h) {
            w.fs_violation("close-failed", &label, &format!("close {n}"), &e);
        }
    }
    w.report.data = serde_json::to_value(Facts::Observer { events })?;
    Ok(())
}

/// The creation an event is about: by version, else by name and inode
/// (the latest such creation before the open).
fn find_gen<'g>(gens: &'g [Gen], e: &Event) -> Option<&'g Gen> {
    if let Some(v) = e.version {
        return gens.iter().find(|g| g.version == v);
    }
    let ino = e.ino?;
    gens.iter()
        .filter(|g| g.stream == e.stream && g.ino == Some(ino) && g.t_create <= e.t_end)
        .max_by_key(|g| g.t_create)
}

/// Judges partial reads and NFS STALE answers against the creator's times.
pub fn verify(ctx: &mut CoordCtx, reports: &[WorkerReport]) {
    let mut gens = Vec::new();
    for r in reports {
        if let Ok(Facts::Creator { gens: g }) = serde_json::from_value(r.data.clone()) {
            gens = g;
        }
    }
    let start = ctx.start_ns;
    for r in reports {
        let Ok(Facts::Observer { events }) = serde_json::from_value::<Facts>(r.data.clone()) else {
            continue;
        };
        for e in events {
            let n = name(e.stream as usize);
            if e.what == "lookup-stale" {
                // Some creation of this name was removed while the lookup ran.
                let removed_meanwhile = gens.iter().any(|g| {
                    g.stream == e.stream
                        && g.t_unlink.is_some_and(|tu| tu <= e.t_end)
                        && g.t_unlinked.is_none_or(|td| td >= e.t_open)
                });
                if removed_meanwhile {
                    ctx.report.allowed(
                        "NFS ESTALE: the name was removed between LOOKUP and the next request",
                    );
                } else {
                    ctx.report.violation(Violation {
                        kind: "stale-handle".into(),
                        worker: r.worker.clone(),
                        target: e.target.clone(),
                        op: format!("stat or open {n}"),
                        detail: format!(
                            "ESTALE between t={:.3}s and t={:.3}s, but no unlink of {n} ran then",
                            secs_since(start, e.t_open),
                            secs_since(start, e.t_end)
                        ),
                        t: secs_since(start, e.t_end),
                    });
                }
                continue;
            }
            let Some(g) = find_gen(&gens, &e) else {
                ctx.report
                    .allowed("partial read or STALE not attributable to a creation");
                continue;
            };
            let mut bad = |kind: &str, op: String, detail: String, t: u64| {
                ctx.report.violation(Violation {
                    kind: kind.into(),
                    worker: r.worker.clone(),
                    target: e.target.clone(),
                    op,
                    detail,
                    t: secs_since(start, t),
                });
            };
            match e.what.as_str() {
                "short" => match g.t_closed {
                    Some(tc) if tc < e.t_open => bad(
                        "short-read",
                        format!("open+read {n}"),
                        format!(
                            "opened at t={:.3}s, after the creator's close of version {} ({} bytes) had returned \
                             (t={:.3}s), but read only {} bytes",
                            secs_since(start, e.t_open),
                            g.version,
                            g.len,
                            secs_since(start, tc),
                            e.len
                        ),
                        e.t_open,
                    ),
                    _ => ctx.report.allowed("partial read of a file still being written"),
                },
                "stale" => match g.t_unlink {
                    Some(tu) if tu <= e.t_end => {
                        ctx.report.allowed("NFS ESTALE after the file was removed (no open state in NFSv3)")
                    }
                    _ => bad(
                        "stale-handle",
                        format!("READ {n}"),
                        format!(
                            "ESTALE at t={:.3}s, but version {} of {n} (file id {:?}) was {}",
                            secs_since(start, e.t_end),
                            g.version,
                            g.ino,
                            match g.t_unlink {
                                Some(tu) => format!("only unlinked at t={:.3}s", secs_since(start, tu)),
                                None => "never unlinked".into(),
                            }
                        ),
                        e.t_end,
                    ),
                },
                _ => {}
            }
        }
    }
}
