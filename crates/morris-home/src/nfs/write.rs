//! The write side of [`NfsHome`]: CREATE (GUARDED), MKDIR, SYMLINK, MKNOD,
//! WRITE (UNSTABLE) and COMMIT, SETATTR, REMOVE, RMDIR, RENAME and LINK,
//! each sent through the connection pool as the read side's requests are.
//!
//! A WRITE is not durable before a COMMIT, and a server that restarts in
//! between loses it: [`Verifiers`] keeps, per file, the write verifiers the
//! server answered since the file's last commit, so that a COMMIT answering
//! another one is reported as lost writes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use nfs3_client::nfs3_types::nfs3::{
    createhow3, devicedata3, diropargs3, filename3, mknoddata3, nfs_fh3, nfspath3, post_op_attr,
    post_op_fh3, sattr3, sattrguard3, specdata3, stable_how, symlinkdata3, COMMIT3args,
    CREATE3args, LINK3args, MKDIR3args, MKNOD3args, Nfs3Option, REMOVE3args, RENAME3args,
    RMDIR3args, SETATTR3args, SYMLINK3args, WRITE3args,
};
use nfs3_client::nfs3_types::xdr_codec::Opaque;

use super::convert::{check_live, check_name, handle_from_wire, handle_to_wire, live_attr, sattr};
use super::NfsHome;
use crate::{Home, HomeAttr, HomeError, HomeHandle, HomeKind, HomeNew, HomeSetAttr, Result};

/// The write verifiers of the UNSTABLE writes made to each file since its
/// last commit. A file has an entry from its first such write to the next
/// commit that settles it (or until it goes stale).
#[derive(Debug, Default)]
pub(crate) struct Verifiers {
    files: Mutex<HashMap<HomeHandle, Pending>>,
}

/// What [`Verifiers`] knows of one file.
#[derive(Debug, Default)]
struct Pending {
    /// The distinct verifiers the writes were answered with: one, unless
    /// the server restarted between them.
    verfs: Vec<[u8; 8]>,
    /// How many writes were recorded, to tell whether one came while a
    /// commit was under way.
    writes: u64,
}

impl Verifiers {
    fn files(&self) -> MutexGuard<'_, HashMap<HomeHandle, Pending>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an UNSTABLE write to `file` answered with `verf`.
    pub(crate) fn record(&self, file: &HomeHandle, verf: [u8; 8]) {
        let mut files = self.files();
        let p = files.entry(file.clone()).or_default();
        p.writes += 1;
        if !p.verfs.contains(&verf) {
            p.verfs.push(verf);
        }
    }

    /// The mark to give [`Verifiers::settle`] for a commit of `file` about
    /// to be sent.
    pub(crate) fn mark(&self, file: &HomeHandle) -> u64 {
        self.files().get(file).map_or(0, |p| p.writes)
    }

    /// Settles a commit of `file` sent at `mark` and answered with `verf`:
    /// `false` if a write recorded since the last commit was answered with
    /// another verifier (the server restarted, and may have lost it). Either
    /// way the writes recorded are forgotten, but those recorded while the
    /// commit was under way, which it may not cover, if they carry `verf`.
    pub(crate) fn settle(&self, file: &HomeHandle, mark: u64, verf: [u8; 8]) -> bool {
        let mut files = self.files();
        let Some(p) = files.get_mut(file) else {
            return true;
        };
        let kept = p.verfs.iter().all(|v| *v == verf);
        if p.writes == mark {
            files.remove(file);
        } else {
            p.verfs.retain(|v| *v == verf);
        }
        kept
    }

    /// Forgets `file` (it is gone at home).
    pub(crate) fn forget(&self, file: &HomeHandle) {
        self.files().remove(file);
    }
}

/// The fields of `want` that `have` does not show (the mode of a symlink
/// aside, which no home can change).
fn missing(want: &HomeSetAttr, have: &HomeAttr) -> HomeSetAttr {
    fn differ<T: PartialEq + Copy>(want: Option<T>, have: T) -> Option<T> {
        want.filter(|w| *w != have)
    }
    HomeSetAttr {
        mode: differ(want.mode, have.mode).filter(|_| have.kind != HomeKind::Symlink),
        uid: differ(want.uid, have.uid),
        gid: differ(want.gid, have.gid),
        size: differ(want.size, have.size),
        atime: differ(want.atime, have.atime),
        mtime: differ(want.mtime, have.mtime),
    }
}

/// `dir/name`, to put on the wire as often as a request is sent.
struct At {
    dir: nfs_fh3,
    name: Vec<u8>,
}

impl At {
    fn wire(&self) -> diropargs3<'static> {
        diropargs3 {
            dir: self.dir.clone(),
            name: filename3::from(self.name.clone()),
        }
    }
}

fn dirop(dir: &nfs_fh3, name: &[u8]) -> At {
    At {
        dir: dir.clone(),
        name: name.to_vec(),
    }
}

impl NfsHome {
    /// [`Home::create`]: CREATE (GUARDED), MKDIR, SYMLINK or MKNOD, then a
    /// SETATTR of what the server left out of the attributes asked for.
    pub(super) async fn create_at(
        &self,
        dir: &HomeHandle,
        name: &[u8],
        what: &HomeNew,
        set: &HomeSetAttr,
    ) -> Result<(HomeHandle, HomeAttr)> {
        check_name(name)?;
        let dirfh = handle_to_wire(dir)?;
        let (op, kind) = match what {
            HomeNew::File => ("CREATE", HomeKind::File),
            HomeNew::Dir => ("MKDIR", HomeKind::Dir),
            HomeNew::Symlink(_) => ("SYMLINK", HomeKind::Symlink),
            HomeNew::Device(k @ (HomeKind::BlockDev | HomeKind::CharDev), _) => ("MKNOD", *k),
            HomeNew::Device(k, _) => {
                return Err(HomeError::Invalid(format!(
                    "a device node is a block or character device, not {k:?}"
                )))
            }
            HomeNew::Fifo => ("MKNOD", HomeKind::Fifo),
            HomeNew::Socket => ("MKNOD", HomeKind::Socket),
        };
        if set.size.is_some() && kind != HomeKind::File {
            return Err(HomeError::Invalid(format!(
                "only a regular file has a size to set, not a {kind:?}"
            )));
        }
        let sa = sattr(set, kind != HomeKind::Symlink)?;
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), op, ?set, "create at home");
        let (fh, a) = self.make(op, &dirfh, name, what, sa).await?;
        let (h, a) = match fh {
            Nfs3Option::Some(fh) => {
                let h = handle_from_wire(op, fh)?;
                let a = self.attr_or_getattr(a, &h).await?;
                (h, a)
            }
            // The server may leave the handle out: look the name up.
            Nfs3Option::None => self.lookup(dir, name).await?,
        };
        if a.kind != kind {
            return Err(HomeError::Io(format!(
                "{op} made a {kind:?}, the server reports a {:?}",
                a.kind
            )));
        }
        let left = missing(set, &a);
        if left == HomeSetAttr::default() {
            return Ok((h, a));
        }
        // Servers may ignore part of the attributes on create (times, an
        // owner other than the caller): set them now.
        tracing::debug!(handle = ?h, op, ?left, "the server left attributes out of a create; setting them");
        let a = self.set_attrs(&h, &left, set.mode, &a).await?;
        Ok((h, a))
    }

    /// The create request proper: the new object's handle and attributes,
    /// as the reply carries them.
    async fn make(
        &self,
        op: &'static str,
        dir: &nfs_fh3,
        name: &[u8],
        what: &HomeNew,
        sa: sattr3,
    ) -> Result<(post_op_fh3, post_op_attr)> {
        let at = dirop(dir, name);
        Ok(match what {
            HomeNew::File => {
                let ok = self
                    .pool
                    .call(op, move |c| {
                        let args = CREATE3args {
                            where_: at.wire(),
                            how: createhow3::GUARDED(sa.clone()),
                        };
                        Box::pin(async move { c.create(&args).await })
                    })
                    .await?;
                (ok.obj, ok.obj_attributes)
            }
            HomeNew::Dir => {
                let ok = self
                    .pool
                    .call(op, move |c| {
                        let args = MKDIR3args {
                            where_: at.wire(),
                            attributes: sa.clone(),
                        };
                        Box::pin(async move { c.mkdir(&args).await })
                    })
                    .await?;
                (ok.obj, ok.obj_attributes)
            }
            HomeNew::Symlink(target) => {
                if target.is_empty() {
                    return Err(HomeError::Invalid("a symlink's target is not empty".into()));
                }
                let target = target.clone();
                let ok = self
                    .pool
                    .call(op, move |c| {
                        let args = SYMLINK3args {
                            where_: at.wire(),
                            symlink: symlinkdata3 {
                                symlink_attributes: sa.clone(),
                                symlink_data: nfspath3::from(target.clone()),
                            },
                        };
                        Box::pin(async move { c.symlink(&args).await })
                    })
                    .await?;
                (ok.obj, ok.obj_attributes)
            }
            HomeNew::Device(..) | HomeNew::Fifo | HomeNew::Socket => {
                let what = what.clone();
                let ok = self
                    .pool
                    .call(op, move |c| {
                        let data = match &what {
                            HomeNew::Device(kind, (major, minor)) => {
                                let dev = devicedata3 {
                                    dev_attributes: sa.clone(),
                                    spec: specdata3 {
                                        specdata1: *major,
                                        specdata2: *minor,
                                    },
                                };
                                match kind {
                                    HomeKind::BlockDev => mknoddata3::NF3BLK(dev),
                                    _ => mknoddata3::NF3CHR(dev),
                                }
                            }
                            HomeNew::Socket => mknoddata3::NF3SOCK(sa.clone()),
                            _ => mknoddata3::NF3FIFO(sa.clone()),
                        };
                        let args = MKNOD3args {
                            where_: at.wire(),
                            what: data,
                        };
                        Box::pin(async move { c.mknod(&args).await })
                    })
                    .await?;
                (ok.obj, ok.obj_attributes)
            }
        })
    }

    /// [`Home::write`]: one UNSTABLE WRITE, its verifier recorded.
    pub(super) async fn write_at(
        &self,
        file: &HomeHandle,
        offset: u64,
        data: Bytes,
    ) -> Result<u32> {
        let count = match u32::try_from(data.len()) {
            Ok(n) if n <= self.max_write => n,
            _ => {
                return Err(HomeError::Invalid(format!(
                    "a write of {} bytes (home takes at most {} at once)",
                    data.len(),
                    self.max_write
                )))
            }
        };
        if offset.checked_add(u64::from(count)).is_none() {
            return Err(HomeError::Invalid(format!(
                "a write of {count} bytes at {offset} ends beyond 2^64"
            )));
        }
        let fh = handle_to_wire(file)?;
        let ok = self
            .pool
            .call("WRITE", move |c| {
                let (fh, data) = (fh.clone(), data.clone());
                Box::pin(async move {
                    let args = WRITE3args {
                        file: fh,
                        offset,
                        count,
                        stable: stable_how::UNSTABLE,
                        data: Opaque::borrowed(&data),
                    };
                    c.write(&args).await
                })
            })
            .await
            .inspect_err(|e| self.forget_if_stale(file, e))?;
        tracing::trace!(?file, offset, count, took = ok.count, committed = %ok.committed, "WRITE");
        if ok.count > count || (ok.count == 0 && count > 0) {
            return Err(HomeError::Io(format!(
                "WRITE: {count} bytes sent, the server took {}",
                ok.count
            )));
        }
        if ok.committed == stable_how::UNSTABLE {
            self.verifiers.record(file, ok.verf.0);
        }
        check_live(&ok.file_wcc.after).inspect_err(|e| self.forget_if_stale(file, e))?;
        Ok(ok.count)
    }

    /// [`Home::commit`]: COMMIT of the whole file, its verifier checked
    /// against those of the writes since the last commit.
    pub(super) async fn commit_file(&self, file: &HomeHandle) -> Result<()> {
        let fh = handle_to_wire(file)?;
        let mark = self.verifiers.mark(file);
        let ok = self
            .pool
            .call("COMMIT", move |c| {
                let args = COMMIT3args {
                    file: fh.clone(),
                    offset: 0,
                    count: 0,
                };
                Box::pin(async move { c.commit(&args).await })
            })
            .await
            .inspect_err(|e| self.forget_if_stale(file, e))?;
        tracing::trace!(?file, verf = ?ok.verf.0, "COMMIT");
        check_live(&ok.file_wcc.after).inspect_err(|e| self.forget_if_stale(file, e))?;
        if !self.verifiers.settle(file, mark, ok.verf.0) {
            tracing::warn!(?file, verf = ?ok.verf.0, "home restarted between writes and their commit: they may be lost");
            return Err(HomeError::Io(
                "home restarted before the writes since the last commit were durable \
                 (COMMIT's write verifier changed): write again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Forgets the writes to `file` if `e` says it is gone.
    fn forget_if_stale(&self, file: &HomeHandle, e: &HomeError) {
        if *e == HomeError::Stale {
            self.verifiers.forget(file);
        }
    }

    /// [`Home::setattr`]: SETATTR without a guard (without the mode, for a
    /// symlink).
    pub(super) async fn setattr_of(&self, h: &HomeHandle, set: &HomeSetAttr) -> Result<HomeAttr> {
        if *set == HomeSetAttr::default() {
            return self.getattr(h).await;
        }
        match set.mode {
            // Only the mode depends on the kind: ask it only then.
            Some(_) => {
                let now = self.getattr(h).await?;
                self.set_attrs(h, set, set.mode, &now).await
            }
            None => self.send_setattr(h, set, false).await,
        }
    }

    /// Sets `set` on `h`, whose attributes were `now`, so that its mode is
    /// `mode` if given: one SETATTR, and one more of the mode alone if a
    /// change of owner lost it (chown clears set-uid and set-gid, and the
    /// server may apply it after the mode).
    async fn set_attrs(
        &self,
        h: &HomeHandle,
        set: &HomeSetAttr,
        mode: Option<u32>,
        now: &HomeAttr,
    ) -> Result<HomeAttr> {
        let with_mode = now.kind != HomeKind::Symlink;
        let a = self.send_setattr(h, set, with_mode).await?;
        match mode {
            Some(m) if with_mode && a.mode != m && (set.uid.is_some() || set.gid.is_some()) => {
                tracing::debug!(handle = ?h, asked = m, got = a.mode, "mode lost to a change of owner; setting it again");
                let again = HomeSetAttr {
                    mode: Some(m),
                    ..HomeSetAttr::default()
                };
                self.send_setattr(h, &again, true).await
            }
            _ => Ok(a),
        }
    }

    /// One SETATTR of `set` (its mode only if `with_mode`): the attributes
    /// after, from the reply or GETATTR.
    async fn send_setattr(
        &self,
        h: &HomeHandle,
        set: &HomeSetAttr,
        with_mode: bool,
    ) -> Result<HomeAttr> {
        let sa = sattr(set, with_mode)?;
        let fh = handle_to_wire(h)?;
        tracing::trace!(handle = ?h, ?set, with_mode, "SETATTR");
        let ok = self
            .pool
            .call("SETATTR", move |c| {
                let args = SETATTR3args {
                    object: fh.clone(),
                    new_attributes: sa.clone(),
                    guard: sattrguard3::None,
                };
                Box::pin(async move { c.setattr(&args).await })
            })
            .await?;
        self.attr_or_getattr(ok.obj_wcc.after, h).await
    }

    /// [`Home::remove`] (`rmdir` false) and [`Home::rmdir`] (true).
    pub(super) async fn remove_at(&self, dir: &HomeHandle, name: &[u8], rmdir: bool) -> Result<()> {
        check_name(name)?;
        let at = dirop(&handle_to_wire(dir)?, name);
        tracing::trace!(?dir, name = %String::from_utf8_lossy(name), rmdir, "remove at home");
        if rmdir {
            self.pool
                .call("RMDIR", move |c| {
                    let args = RMDIR3args { object: at.wire() };
                    Box::pin(async move { c.rmdir(&args).await })
                })
                .await?;
        } else {
            self.pool
                .call("REMOVE", move |c| {
                    let args = REMOVE3args { object: at.wire() };
                    Box::pin(async move { c.remove(&args).await })
                })
                .await?;
        }
        Ok(())
    }

    /// [`Home::rename`]: RENAME.
    pub(super) async fn rename_at(
        &self,
        from_dir: &HomeHandle,
        from: &[u8],
        to_dir: &HomeHandle,
        to: &[u8],
    ) -> Result<()> {
        check_name(from)?;
        check_name(to)?;
        let from_at = dirop(&handle_to_wire(from_dir)?, from);
        let to_at = dirop(&handle_to_wire(to_dir)?, to);
        tracing::trace!(?from_dir, from = %String::from_utf8_lossy(from), ?to_dir, to = %String::from_utf8_lossy(to), "RENAME");
        self.pool
            .call("RENAME", move |c| {
                let args = RENAME3args {
                    from: from_at.wire(),
                    to: to_at.wire(),
                };
                Box::pin(async move { c.rename(&args).await })
            })
            .await
            // A rename replaces what `to` names; only a directory that is
            // not empty stops it (rename(2) answers EEXIST or ENOTEMPTY).
            .map_err(|e| match e {
                HomeError::Exists => HomeError::NotEmpty,
                e => e,
            })?;
        Ok(())
    }

    /// [`Home::link`]: LINK; the object keeps its handle under every name.
    pub(super) async fn link_at(
        &self,
        target: &HomeHandle,
        dir: &HomeHandle,
        name: &[u8],
    ) -> Result<(HomeHandle, HomeAttr)> {
        check_name(name)?;
        let file = handle_to_wire(target)?;
        let at = dirop(&handle_to_wire(dir)?, name);
        tracing::trace!(?target, ?dir, name = %String::from_utf8_lossy(name), "LINK");
        let ok = self
            .pool
            .call("LINK", move |c| {
                let args = LINK3args {
                    file: file.clone(),
                    link: at.wire(),
                };
                Box::pin(async move { c.link(&args).await })
            })
            .await?;
        let a = match ok.file_attributes {
            Nfs3Option::Some(a) => live_attr(&a)?,
            Nfs3Option::None => self.getattr(target).await?,
        };
        Ok((target.clone(), a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HomeTime;

    fn h(n: u8) -> HomeHandle {
        HomeHandle(vec![n; 8])
    }

    #[test]
    fn commits_check_the_verifiers_of_writes_since_the_last() {
        let v = Verifiers::default();
        // No write: any verifier will do.
        assert!(v.settle(&h(1), v.mark(&h(1)), [9; 8]));
        v.record(&h(1), [1; 8]);
        v.record(&h(1), [1; 8]);
        v.record(&h(2), [1; 8]);
        assert!(v.settle(&h(1), v.mark(&h(1)), [1; 8]));
        // Settled: forgotten, so a restart now loses nothing of ours.
        assert!(v.settle(&h(1), v.mark(&h(1)), [7; 8]));
        // A restart between writes, then a commit: lost, and forgotten.
        v.record(&h(1), [1; 8]);
        v.record(&h(1), [2; 8]);
        assert!(!v.settle(&h(1), v.mark(&h(1)), [2; 8]));
        assert!(v.settle(&h(1), v.mark(&h(1)), [3; 8]));
        // The other file still has its write.
        assert!(!v.settle(&h(2), v.mark(&h(2)), [2; 8]));
    }

    #[test]
    fn writes_during_a_commit_wait_for_the_next() {
        let v = Verifiers::default();
        v.record(&h(1), [1; 8]);
        let mark = v.mark(&h(1));
        v.record(&h(1), [1; 8]);
        assert!(v.settle(&h(1), mark, [1; 8]));
        // Still recorded: a restart before the next commit is seen.
        assert!(!v.settle(&h(1), v.mark(&h(1)), [2; 8]));
        v.record(&h(1), [1; 8]);
        v.forget(&h(1));
        assert!(v.settle(&h(1), v.mark(&h(1)), [2; 8]));
    }

    #[test]
    fn missing_attributes_are_those_that_differ() {
        let t = |secs| HomeTime { secs, nsecs: 5 };
        let have = HomeAttr {
            kind: HomeKind::File,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 0,
            used: 0,
            rdev: (0, 0),
            fsid: 1,
            fileid: 2,
            atime: t(10),
            mtime: t(10),
            ctime: t(10),
        };
        let want = HomeSetAttr {
            mode: Some(0o644),
            uid: Some(7),
            gid: Some(0),
            size: None,
            atime: Some(t(10)),
            mtime: Some(t(3)),
        };
        assert_eq!(
            missing(&want, &have),
            HomeSetAttr {
                uid: Some(7),
                mtime: Some(t(3)),
                ..HomeSetAttr::default()
            }
        );
        let sym = HomeAttr {
            kind: HomeKind::Symlink,
            mode: 0o777,
            ..have
        };
        let want = HomeSetAttr {
            mode: Some(0o600),
            ..HomeSetAttr::default()
        };
        assert_eq!(missing(&want, &sym), HomeSetAttr::default());
    }
}
