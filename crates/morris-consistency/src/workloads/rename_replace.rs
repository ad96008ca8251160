//! `rename-replace`: one writer replaces `target` by writing a temporary
//! file and renaming it over `target`; readers on every mount read
//! `target` whole, again and again.
//!
//! The writer (one process per run) creates `tmp.N` (O_EXCL) with version N
//! of self-verifying content (header with version, length and checksum;
//! sizes from the seed: mostly a few KiB, sometimes hundreds of KiB,
//! sometimes several MiB), sometimes fsyncs it, closes it and renames it
//! over `target`. Readers loop open / read whole / (sometimes) re-read
//! from offset 0 / fstat / close.
//!
//! **Promises** (rename(2) is atomic: "a link named new shall remain
//! visible to other processes throughout the renaming operation and refer
//! either to the file referred to by new or old"; close-to-open and
//! read-after-write coherence):
//! * every open of `target` succeeds: it always exists (`open-failed`);
//! * every read returns one complete valid version: never zeros, never a
//!   mix of two versions, never short (`zero-read`, `mixed-versions`,
//!   `short-read`, ...), and fstat on the descriptor agrees with it;
//! * a descriptor keeps returning the same version when re-read from
//!   offset 0, even after `target` was replaced (`reread-changed`);
//! * every step of the writer succeeds, rename included (`rename-failed`
//!   says whether the rename had in fact been done);
//! * per reader, versions never go backwards (`version-backwards`);
//! * a reader whose open started after the writer's rename of version N
//!   returned sees a version >= N (`stale-read`; times from the shared
//!   `CLOCK_MONOTONIC`, checked by the coordinator);
//! * after the run, every mount reads the last version (`final-stale`).
//!
//! Over NFSv3 (no open state) a READ of a handle whose file was replaced
//! since the LOOKUP may answer NFS3ERR_STALE: that is allowed, unless the
//! name still leads to the same handle.

use serde::{Deserialize, Serialize};

use super::spread;
use crate::access::{Access, Handle};
use crate::clock::{now_ns, secs_since, Pacer};
use crate::content;
use crate::report::WorkerReport;
use crate::rng::Rng;
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// The name everyone reads.
const TARGET: &str = "target";
/// Most versions per second.
const VERSIONS_PER_SEC: u64 = 200;
/// Most reads per second per reader.
const READS_PER_SEC: u64 = 500;

/// Facts for the coordinator.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Facts {
    #[default]
    None,
    Writer {
        /// (version, CLOCK_MONOTONIC ns when its rename returned).
        renamed: Vec<(u64, u64)>,
        /// Versions whose rename failed (done or not).
        ambiguous: Vec<u64>,
    },
    Reader {
        /// Runs of reads of one version: (version, first open ns, last open ns, reads).
        runs: Vec<(u64, u64, u64, u64)>,
    },
}

/// Length of a version: mostly a few KiB, sometimes hundreds of KiB,
/// sometimes several MiB.
fn pick_len(rng: &mut Rng) -> usize {
    (match rng.below(100) {
        0..=1 => rng.range(1 << 20, 4 << 20),
        2..=9 => rng.range(16 << 10, 256 << 10),
        _ => rng.range(content::HEADER_LEN as u64, 16 << 10),
    }) as usize
}

/// Writes version 0 of `target`.
pub fn setup(
    ctx: &mut CoordCtx,
    home: &mut dyn Access,
) -> Result<serde_json::Value, crate::access::FsError> {
    let data = content::build(ctx.run_seed, 0, 0, 4096);
    let mut h = home.create_excl(TARGET)?;
    home.write_at(&mut h, 0, &data)?;
    home.close(h)?;
    Ok(serde_json::Value::Null)
}

/// One writer (on a target chosen by the seed), `procs` readers starting
/// on the next target.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let n = ctx.targets.len();
    let all: Vec<usize> = (0..n).collect();
    let wt = (ctx.run_seed % n as u64) as usize;
    let mut v = spread("writer", 1, &all, wt);
    v.extend(spread("reader", ctx.params.procs.max(1), &all, wt + 1));
    v
}

/// Runs the writer or a reader.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let Some(mut a) = w.connect(w.spec.target) else {
        return Ok(());
    };
    match w.spec.role.as_str() {
        "writer" => writer(w, a.as_mut()),
        "reader" => reader(w, a.as_mut()),
        r => anyhow::bail!("rename-replace has no role {r}"),
    }
}

fn writer(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let mut renamed = Vec::new();
    let mut ambiguous = Vec::new();
    let mut pacer = Pacer::per_sec(VERSIONS_PER_SEC);
    let mut v = 1u64;
    while w.running() {
        pacer.wait();
        let len = pick_len(&mut w.rng);
        let data = content::build(w.spec.run_seed, 0, v, len);
        let tmp = format!("tmp.{v}");
        let mut h = match a.create_excl(&tmp) {
            Ok(h) => h,
            Err(e) => {
                w.fs_violation(
                    "create-failed",
                    &label,
                    &format!("create {tmp} (version {v})"),
                    &e,
                );
                v += 1;
                continue;
            }
        };
        w.report.op("create");
        if let Err(e) = a.write_at(&mut h, 0, &data) {
            w.fs_violation(
                "write-failed",
                &label,
                &format!("write {len} bytes to {tmp}"),
                &e,
            );
            let _ = a.close(h);
            let _ = a.remove(&tmp);
            v += 1;
            continue;
        }
        w.report.op("write");
        if w.rng.chance(1, 3) {
            w.report.op("fsync");
            if let Err(e) = a.sync(&mut h) {
                w.fs_violation("fsync-failed", &label, &format!("fsync {tmp}"), &e);
            }
        }
        w.report.op("close");
        if let Err(e) = a.close(h) {
            w.fs_violation("close-failed", &label, &format!("close {tmp}"), &e);
        }
        match a.rename(&tmp, TARGET) {
            Ok(()) => {
                renamed.push((v, now_ns()));
                w.report.op("rename");
            }
            Err(e) => {
                // Was it done anyway? tmp gone and target is version v.
                let tmp_gone = matches!(a.stat(&tmp), Err(ref s) if s.is(libc::ENOENT));
                let now_target = a
                    .open_read(TARGET)
                    .and_then(|mut h| {
                        let d = a.read_to_end(&mut h);
                        let _ = a.close(h);
                        d
                    })
                    .ok()
                    .and_then(|d| content::verify(w.spec.run_seed, Some(0), &d).ok());
                let done = tmp_gone && now_target.is_some_and(|i| i.version == v);
                ambiguous.push(v);
                w.report.error(&e);
                w.violation(
                    "rename-failed",
                    &label,
                    &format!("rename {tmp} -> {TARGET} (version {v})"),
                    format!(
                        "{e}; {}",
                        if done {
                            "yet it was done: tmp is gone and target is this version"
                        } else {
                            "and it was not done"
                        }
                    ),
                );
            }
        }
        v += 1;
    }
    w.report.data = serde_json::to_value(Facts::Writer { renamed, ambiguous })?;
    Ok(())
}

/// After an NFS READ answered STALE: does `target` still lead to this handle?
fn still_named(a: &mut dyn Access, h: &Handle) -> bool {
    match a.open_read(TARGET) {
        Ok(h2) => h2.nfs_fh().is_some() && h2.nfs_fh() == h.nfs_fh(),
        Err(_) => false,
    }
}

/// Handles an error of a read through an open target: STALE over NFS is
/// allowed once the file was replaced; anything else is a violation.
fn read_error(
    w: &mut WorkerCtx,
    a: &mut dyn Access,
    h: &Handle,
    what: &str,
    e: &crate::access::FsError,
) {
    let label = a.label().to_string();
    if a.is_nfs() && e.is(libc::ESTALE) {
        w.report.error(e);
        if still_named(a, h) {
            w.violation(
                "stale-handle",
                &label,
                what,
                format!("{e}, yet {TARGET} still leads to this very handle"),
            );
        } else {
            w.report
                .allowed("NFS ESTALE after target was replaced (no open state in NFSv3)");
        }
    } else {
        w.fs_violation("read-failed", &label, what, e);
    }
}

fn reader(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let seed = w.spec.run_seed;
    let mut runs: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut last: Option<u64> = None;
    let mut pacer = Pacer::per_sec(READS_PER_SEC);
    while w.running() {
        pacer.wait();
        let t_open = now_ns();
        let mut h = match a.open_read(TARGET) {
            Ok(h) => h,
            Err(e) => {
                let kind = if e.is(libc::ENOENT) {
                    "open-enoent"
                } else {
                    "open-failed"
                };
                w.fs_violation(
                    kind,
                    &label,
                    &format!("open {TARGET} (it always exists)"),
                    &e,
                );
                continue;
            }
        };
        w.report.op("open");
        let data = match a.read_to_end(&mut h) {
            Ok(d) => d,
            Err(e) => {
                read_error(w, a, &h, &format!("read {TARGET} whole"), &e);
                let _ = a.close(h);
                continue;
            }
        };
        w.report.op("read");
        match content::verify(seed, Some(0), &data) {
            Err(be) => {
                let size = a
                    .attr(&mut h)
                    .map(|x| format!("fstat size {}", x.size))
                    .unwrap_or_else(|e| format!("fstat failed: {e}"));
                w.violation(
                    be.kind(),
                    &label,
                    &format!("read {TARGET} whole"),
                    format!(
                        "expected one complete version, got {} bytes: {be} ({size})",
                        data.len()
                    ),
                );
            }
            Ok(info) => {
                if let Some(prev) = last {
                    if info.version < prev {
                        w.violation(
                            "version-backwards",
                            &label,
                            &format!("read {TARGET} whole"),
                            format!(
                                "read version {} after having read version {prev}",
                                info.version
                            ),
                        );
                    }
                }
                last = Some(last.map_or(info.version, |p| p.max(info.version)));
                match runs.last_mut() {
                    Some(r) if r.0 == info.version => {
                        r.2 = t_open;
                        r.3 += 1;
                    }
                    _ => runs.push((info.version, t_open, t_open, 1)),
                }
                check_open_file(w, a, &mut h, &data, info.version, info.len);
            }
        }
        if let Err(e) = a.close(h) {
            w.fs_violation("close-failed", &label, &format!("close {TARGET}"), &e);
        }
    }
    w.report.data = serde_json::to_value(Facts::Reader { runs })?;
    Ok(())
}

/// fstat agrees with the version read, and (sometimes, after a pause) a
/// re-read from offset 0 through the same descriptor returns it again.
fn check_open_file(
    w: &mut WorkerCtx,
    a: &mut dyn Access,
    h: &mut Handle,
    data: &[u8],
    version: u64,
    len: u64,
) {
    let label = a.label().to_string();
    match a.attr(h) {
        Ok(at) if at.size != len => w.violation(
            "size-mismatch",
            &label,
            &format!("fstat {TARGET}"),
            format!(
                "size {} but the descriptor's content is version {version} of {len} bytes",
                at.size
            ),
        ),
        Ok(_) => w.report.op("fstat"),
        Err(e) => read_error(w, a, h, &format!("fstat {TARGET}"), &e),
    }
    if !w.rng.chance(1, 3) {
        return;
    }
    let pause = w.rng.below(20);
    std::thread::sleep(std::time::Duration::from_millis(pause));
    match a.read_to_end(h) {
        Ok(d2) if d2 == data => w.report.op("reread"),
        Ok(d2) => {
            let what = match content::verify(w.spec.run_seed, Some(0), &d2) {
                Ok(i) => format!("version {} ({} bytes)", i.version, d2.len()),
                Err(be) => format!("{} bytes: {be}", d2.len()),
            };
            w.violation(
                "reread-changed",
                &label,
                &format!(
                    "re-read {TARGET} from offset 0 through the same descriptor after {pause} ms"
                ),
                format!(
                    "first read version {version} ({} bytes), then {what}",
                    data.len()
                ),
            );
        }
        Err(e) => read_error(
            w,
            a,
            h,
            &format!("re-read {TARGET} through the same descriptor"),
            &e,
        ),
    }
}

/// Freshness of every reader's reads against the writer's renames, and the
/// final version on every mount.
pub fn verify(ctx: &mut CoordCtx, reports: &[WorkerReport]) {
    let mut renamed: Vec<(u64, u64)> = Vec::new();
    let mut ambiguous: Vec<u64> = Vec::new();
    for r in reports {
        if let Ok(Facts::Writer {
            renamed: rn,
            ambiguous: am,
        }) = serde_json::from_value(r.data.clone())
        {
            renamed = rn;
            ambiguous = am;
        }
    }
    renamed.sort_by_key(|(_, t)| *t);
    let start = ctx.start_ns;
    for r in reports {
        let Ok(Facts::Reader { runs }) = serde_json::from_value::<Facts>(r.data.clone()) else {
            continue;
        };
        for (v, first, last, reads) in runs {
            let known = v == 0 || ambiguous.contains(&v) || renamed.iter().any(|(x, _)| *x == v);
            if !known {
                ctx.report.violation(crate::report::Violation {
                    kind: "phantom-version".into(),
                    worker: r.worker.clone(),
                    target: r.target.clone(),
                    op: format!("read {TARGET}"),
                    detail: format!("read version {v}, which was never renamed into place"),
                    t: secs_since(start, first),
                });
            }
            // The newest rename that returned before this run's last open began.
            let i = renamed.partition_point(|(_, t)| *t < last);
            if let Some((nv, t_ret)) = i.checked_sub(1).and_then(|i| renamed.get(i)) {
                if *nv > v {
                    ctx.report.violation(crate::report::Violation {
                        kind: "stale-read".into(),
                        worker: r.worker.clone(),
                        target: r.target.clone(),
                        op: format!("open+read {TARGET}"),
                        detail: format!(
                            "opened at t={:.3}s, after the rename of version {nv} had returned (t={:.3}s), \
                             but read version {v} ({reads} reads of it from t={:.3}s)",
                            secs_since(start, last),
                            secs_since(start, *t_ret),
                            secs_since(start, first)
                        ),
                        t: secs_since(start, last),
                    });
                }
            }
        }
    }
    // After the run every mount must read the last version.
    let last = renamed.iter().map(|(v, _)| *v).max().unwrap_or(0);
    for k in 0..ctx.targets.len() {
        let label = ctx.labels[k].clone();
        let Some(mut a) = ctx.connect(k) else {
            continue;
        };
        let got = a.open_read(TARGET).and_then(|mut h| {
            let d = a.read_to_end(&mut h);
            let _ = a.close(h);
            d
        });
        ctx.report.op("final-read");
        match got {
            Err(e) => ctx.violation(
                "read-failed",
                &label,
                &format!("read {TARGET} after the run"),
                e.to_string(),
            ),
            Ok(d) => match content::verify(ctx.run_seed, Some(0), &d) {
                Err(be) => ctx.violation(
                    be.kind(),
                    &label,
                    &format!("read {TARGET} after the run"),
                    be.to_string(),
                ),
                Ok(i) if i.version < last => ctx.violation(
                    "final-stale",
                    &label,
                    &format!("read {TARGET} after the run"),
                    format!(
                        "version {}, but version {last} was the last renamed into place",
                        i.version
                    ),
                ),
                Ok(_) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_cover_small_medium_and_large() {
        let mut rng = Rng::new(3);
        let lens: Vec<usize> = (0..2000).map(|_| pick_len(&mut rng)).collect();
        assert!(lens
            .iter()
            .all(|l| *l >= content::HEADER_LEN && *l <= 4 << 20));
        assert!(lens.iter().any(|l| *l > 1 << 20));
        assert!(lens.iter().any(|l| (16 << 10..256 << 10).contains(l)));
        assert!(lens.iter().filter(|l| **l <= 16 << 10).count() > 1500);
    }

    #[test]
    fn blob_error_kinds_name_what_readers_saw() {
        assert_eq!(content::BlobError::Zeros { len: 4096 }.kind(), "zero-read");
        let b = content::build(1, 0, 3, 9000);
        assert_eq!(
            content::verify(1, Some(0), &b[..100]).map_err(|e| e.kind()),
            Err("short-read")
        );
    }
}
