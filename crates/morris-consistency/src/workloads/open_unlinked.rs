//! `open-unlinked`: a file held open on one mount is unlinked, or renamed
//! over, through another mount (or the same one, or the NFS gateway).
//!
//! Each holder (a process on a POSIX target A) repeats: create `ou.H.R`
//! on A with self-verifying content (4 KiB .. 2 MiB), open it (read-only or
//! read-write), read part of it; then, through a random target M (A
//! itself, another mount, or NFS), either unlink it or rename a new file
//! over it; pause 0..30 ms; then keep using the descriptor.
//!
//! **Promises** (POSIX `unlink(2)`: "if one or more processes have the file
//! open when the last link is removed, ... the removal of the file contents
//! shall be postponed until all references to the file are closed"; the
//! same holds for a file replaced by `rename(2)`):
//! * through the descriptor, the whole original content reads back exactly
//!   (`fd-read-failed` for ESTALE/EIO/ENOENT, `fd-wrong-bytes`), fstat
//!   still reports its size, and a read-write descriptor can still write
//!   (pwrite, then pread returns what was written); close succeeds;
//! * the unlink or rename itself succeeds;
//! * afterwards the name is gone on A and M (unlink) or names the new file
//!   (rename), as the operation that returned says.
//!
//! Over NFS there is no open state, so NFS targets only play M.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::spread;
use crate::access::posix::{close_checked, pread_all, pread_full};
use crate::access::{Access, FsError, TargetSpec};
use crate::clock::Pacer;
use crate::content;
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// Most rounds per second per holder.
const ROUNDS_PER_SEC: u64 = 20;

/// `procs` holders over the POSIX targets.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let posix: Vec<usize> = (0..ctx.targets.len())
        .filter(|i| !ctx.targets[*i].is_nfs())
        .collect();
    spread("holder", ctx.params.procs.max(1), &posix, 0)
}

/// Describes bytes read back through the descriptor that differ from the
/// original content.
fn describe(seed: u64, got: &[u8], want: &[u8], stream: u32) -> String {
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let what = match content::verify(seed, None, got) {
        Ok(i) if i.stream == stream + 1 => format!(
            "the content of the file that replaced it (version {})",
            i.version
        ),
        Ok(i) => format!("a valid blob of stream {} version {}", i.stream, i.version),
        Err(e) => e.to_string(),
    };
    format!(
        "expected the original {} bytes, got {} bytes, first difference at offset {at}: {what}",
        want.len(),
        got.len()
    )
}

/// Runs one holder.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let own = w.spec.target;
    let TargetSpec::Posix { dir } = w.spec.targets[own].clone() else {
        anyhow::bail!("a holder needs a POSIX target");
    };
    let mut acc = w.connect_all();
    if acc.get(own).is_none_or(Option::is_none) {
        return Ok(());
    }
    let usable: Vec<usize> = (0..acc.len()).filter(|i| acc[*i].is_some()).collect();
    let mut pacer = Pacer::per_sec(ROUNDS_PER_SEC);
    let mut r = 0u64;
    while w.running() {
        pacer.wait();
        round(w, &dir, own, &usable, &mut acc, r);
        r += 1;
    }
    Ok(())
}

fn round(
    w: &mut WorkerCtx,
    dir: &Path,
    own: usize,
    usable: &[usize],
    acc: &mut [Option<Box<dyn Access>>],
    r: u64,
) {
    let seed = w.spec.run_seed;
    let h = w.spec.index;
    let stream = (h * 2) as u32;
    let name = format!("ou.{h}.{r}");
    let newname = format!("{name}.new");
    let la = w.label(own);
    let len = if w.rng.chance(1, 8) {
        w.rng.range(256 << 10, 2 << 20)
    } else {
        w.rng.range(4 << 10, 256 << 10)
    } as usize;
    let mut data = content::build(seed, stream, r, len);
    // Create and close it on A.
    let path = dir.join(&name);
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .and_then(|f| {
            f.write_all_at(&data, 0)?;
            close_checked(f)
        });
    if let Err(e) = created {
        w.fs_violation(
            "create-failed",
            &la,
            &format!("create and write {name}"),
            &FsError::io("create", &name, &e),
        );
        return;
    }
    w.report.op("create");
    let rw = w.rng.chance(1, 2);
    let fd = match OpenOptions::new().read(true).write(rw).open(&path) {
        Ok(f) => f,
        Err(e) => {
            w.fs_violation(
                "open-failed",
                &la,
                &format!("open {name}"),
                &FsError::io("open", &name, &e),
            );
            return;
        }
    };
    w.report.op("open");
    let k = w.rng.range(1, len as u64) as usize;
    match pread_full(&fd, 0, k) {
        Ok(d) if d[..] == data[..k] => w.report.op("read"),
        Ok(d) => w.violation(
            "wrong-bytes",
            &la,
            &format!("read {k} bytes of {name} before anything happened to it"),
            describe(seed, &d, &data[..k], stream),
        ),
        Err(e) => w.fs_violation(
            "read-failed",
            &la,
            &format!("read {name}"),
            &FsError::io("pread", &name, &e),
        ),
    }
    // Unlink it, or rename a new file over it, through M.
    let m = usable[w.rng.index(usable.len())];
    let lm = w.label(m);
    let unlink = w.rng.chance(1, 2);
    let how = if unlink {
        format!("unlinked through {lm}")
    } else {
        format!("renamed over through {lm}")
    };
    let Some(am) = acc[m].as_mut() else { return };
    let new =
        (!unlink).then(|| content::build(seed, stream + 1, r, w.rng.range(100, 8192) as usize));
    let mutated: Result<(), (&str, String, FsError)> = match &new {
        None => am
            .remove(&name)
            .map_err(|e| ("unlink-failed", format!("unlink {name}"), e)),
        Some(new) => match am.create_excl(&newname).and_then(|mut nh| {
            am.write_at(&mut nh, 0, new)?;
            am.close(nh)
        }) {
            Err(e) => Err(("create-failed", format!("create {newname}"), e)),
            Ok(()) => am
                .rename(&newname, &name)
                .map_err(|e| ("rename-failed", format!("rename {newname} -> {name}"), e)),
        },
    };
    let mutated_ok = mutated.is_ok();
    match mutated {
        Ok(()) => w.report.op(if unlink { "unlink" } else { "rename-over" }),
        Err((kind, op, e)) => w.fs_violation(kind, &lm, &op, &e),
    }
    let pause = w.rng.below(30);
    std::thread::sleep(std::time::Duration::from_millis(pause));
    // Keep using the descriptor.
    let ctx_op = |what: &str| {
        format!("{what} {name} through a descriptor opened on {la} before it was {how} ({pause} ms before)")
    };
    match pread_all(&fd) {
        Ok(d) if d == data => w.report.op("fd-read"),
        Ok(d) => w.violation(
            "fd-wrong-bytes",
            &la,
            &ctx_op("read whole"),
            describe(seed, &d, &data, stream),
        ),
        Err(e) => w.fs_violation(
            "fd-read-failed",
            &la,
            &ctx_op("read whole"),
            &FsError::io("pread", &name, &e),
        ),
    }
    match fd.metadata() {
        Ok(md) if md.len() == len as u64 => w.report.op("fd-fstat"),
        Ok(md) => w.violation(
            "fd-size",
            &la,
            &ctx_op("fstat"),
            format!("size {}, expected {len}", md.len()),
        ),
        Err(e) => w.fs_violation(
            "fd-fstat-failed",
            &la,
            &ctx_op("fstat"),
            &FsError::io("fstat", &name, &e),
        ),
    }
    if rw {
        let off = w.rng.below(len as u64) as usize;
        let plen = w.rng.range(1, (len - off).min(8192) as u64) as usize;
        let patch: Vec<u8> = (0..plen).map(|_| w.rng.next_u64() as u8).collect();
        match fd.write_all_at(&patch, off as u64) {
            Ok(()) => {
                w.report.op("fd-write");
                data[off..off + plen].copy_from_slice(&patch);
                match pread_all(&fd) {
                    Ok(d) if d == data => w.report.op("fd-read"),
                    Ok(d) => w.violation(
                        "fd-wrong-bytes",
                        &la,
                        &ctx_op(&format!("pwrite {plen} bytes at {off}, then read whole")),
                        describe(seed, &d, &data, stream),
                    ),
                    Err(e) => w.fs_violation(
                        "fd-read-failed",
                        &la,
                        &ctx_op("read after pwrite"),
                        &FsError::io("pread", &name, &e),
                    ),
                }
            }
            Err(e) => w.fs_violation(
                "fd-write-failed",
                &la,
                &ctx_op("pwrite"),
                &FsError::io("pwrite", &name, &e),
            ),
        }
    }
    if let Err(e) = close_checked(fd) {
        w.fs_violation(
            "close-failed",
            &la,
            &ctx_op("close"),
            &FsError::io("close", &name, &e),
        );
    }
    // The name now says what the operation that returned said.
    if mutated_ok {
        check_name(w, acc, own, m, &name, unlink, seed, stream + 1, r);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_name(
    w: &mut WorkerCtx,
    acc: &mut [Option<Box<dyn Access>>],
    own: usize,
    m: usize,
    name: &str,
    unlinked: bool,
    seed: u64,
    new_stream: u32,
    r: u64,
) {
    let mut seen = vec![own];
    if m != own {
        seen.push(m);
    }
    for t in seen {
        let label = w.label(t);
        let Some(a) = acc[t].as_mut() else { continue };
        if unlinked {
            match a.stat(name) {
                Err(e) if e.is(libc::ENOENT) => w.report.op("stat-gone"),
                Err(e) => w.fs_violation(
                    "stat-failed",
                    &label,
                    &format!("stat {name} after its unlink returned"),
                    &e,
                ),
                Ok(at) => w.violation(
                    "unlinked-name-visible",
                    &label,
                    &format!("stat {name} after its unlink returned"),
                    format!(
                        "the name still exists (inode {}, {} bytes)",
                        at.ino, at.size
                    ),
                ),
            }
        } else {
            let got = a.open_read(name).and_then(|mut h| {
                let d = a.read_to_end(&mut h);
                let _ = a.close(h);
                d
            });
            match got {
                Ok(d) => match content::verify(seed, Some(new_stream), &d) {
                    Ok(i) if i.version == r => w.report.op("read-new"),
                    Ok(i) => w.violation(
                        "rename-not-visible",
                        &label,
                        &format!("read {name} after the rename over it returned"),
                        format!(
                            "version {} of the replacing stream, expected {r}",
                            i.version
                        ),
                    ),
                    Err(e) => w.violation(
                        "rename-not-visible",
                        &label,
                        &format!("read {name} after the rename over it returned"),
                        format!("expected the replacing file, got {} bytes: {e}", d.len()),
                    ),
                },
                Err(e) => w.fs_violation(
                    "read-failed",
                    &label,
                    &format!("read {name} after the rename over it returned"),
                    &e,
                ),
            }
        }
    }
    if !unlinked {
        let label = w.label(own);
        if let Some(a) = acc[own].as_mut() {
            if let Err(e) = a.remove(name) {
                w.fs_violation(
                    "unlink-failed",
                    &label,
                    &format!("unlink {name} (the replacing file)"),
                    &e,
                );
            }
        }
    }
}
