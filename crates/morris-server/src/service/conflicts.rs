//! Cache mode II's conflicts (docs/architecture.md, "Conflicts"): an
//! object changed both in the cache and at home since the write-back last
//! left it there, or a name made both in an independent-writer cache and
//! at home.
//!
//! | found by the push | home has | what happens |
//! |---|---|---|
//! | a file the cache changed | changed (size or mtime moved since the last push, and not to the cache's) | the cache's version is written to `.conflicts/` in home's bound directory; the cached object becomes home's version |
//! | a file the cache changed | nothing there any more (removed, or another object at its place) | the same, the cached object becoming the object now there; if none, only the mark goes (the name leaves the cache at the directory's next revalidation) |
//! | a name the cache made (`iw`) | another object under it, same kind (file) | as a changed file: the cache's object to `.conflicts/`, home's at the name |
//! | a name the cache made (`iw`) | a directory under it, the cache a directory too | merged: the cache's directory is home's from now on; both sides' entries stay |
//! | a name the cache made (`iw`) | another kind of object | home's object is moved into `.conflicts/` at home; the cache's takes the name |
//!
//! With `--on-conflict cache` the cache's version wins instead:
//!
//! | found by the push | home has | what happens |
//! |---|---|---|
//! | a file the cache changed | changed | home's version is copied to `.conflicts/`, then the cache's is pushed over it (data the cache wrote; for a file whose data is home's, only the attributes the cache changed, after which the cached object reads home's data again) |
//! | a file made in the cache | nothing at its place, or another object | that object (if any) is moved into `.conflicts/` at home; the cache's is made again at its place |
//! | a name the cache made (`iw`) | another file under it | home's file is moved into `.conflicts/`; the cache's takes the name |
//! | a file fetched from home, changed in the cache | removed at home | home's change wins (the cache may not hold all of its data): as the first table |
//!
//! A file removed in the cache (no name left, kept while open or until
//! reaped) is in no conflict: nothing of it is pushed; its directory's
//! push removes its name at home.
//!
//! The loser's version is never lost: it is at home before the winner's
//! replaces it. With home winning, the cache's version is at home before
//! the cached object changes, and the change (`WbRebase`, at the object's owner,
//! every lease on it recalled first) is refused if the object changed in
//! the cache since the push read its mark — the next round writes the
//! newer version to the same `.conflicts/` name. Every conflict is
//! counted in `morris cache status` and logged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use morris_home::{HomeAttr, HomeError, HomeHandle, HomeKind, HomeNew, HomeSetAttr, HomeTime};
use morris_proto::home::{HomeStamp, OnConflict};
use morris_proto::{Attr, FileId, FileKind, Inode, Reply, Request, WbHome, WireError};
use tracing::warn;

use super::cache::{attr_of, stamp_of};
use super::pusher::{home_failed, new_of, Round};
use super::{metadata, Server};
use crate::store::Store;

/// The directory, in home's bound directory, that keeps the cache's
/// versions of objects in conflict.
pub(super) const CONFLICTS_DIR: &[u8] = b".conflicts";

/// The stamp a file's link records while its data is being pushed: home's
/// state is then the push's, whatever it is (a push cut short by a crash
/// is no conflict; it is pushed again).
pub(super) fn pushing(kind: FileKind) -> HomeStamp {
    HomeStamp {
        kind,
        size: u64::MAX,
        mtime: morris_proto::Timestamp { secs: 0, nanos: 0 },
        ctime: morris_proto::Timestamp { secs: 0, nanos: 0 },
    }
}

/// Whether home's object, now `a`, changed since the write-back last left
/// it with stamp `seen`, to something else than the cache's version `i`.
/// Size and mtime are compared (home's ctime moves with every push of
/// attributes and every rename; an mtime is what writers change).
pub(super) fn changed_at_home(seen: &HomeStamp, i: &Inode, a: &HomeAttr) -> bool {
    if seen.size == u64::MAX {
        // A push of the data did not finish.
        return false;
    }
    let now = stamp_of(a);
    let moved = now.size != seen.size || now.mtime != seen.mtime || now.kind != seen.kind;
    let as_cache = now.size == i.attr.size && now.mtime == i.attr.mtime;
    moved && !as_cache
}

/// The name the cache's version of `name` (object `id`) gets in
/// `.conflicts/`: the same for the same conflict (home's version's mtime
/// `secs`), so that a round run again after a crash writes it again in
/// place.
fn conflict_name(name: &[u8], id: FileId, secs: i64) -> Vec<u8> {
    let mut out: Vec<u8> = name.iter().copied().take(200).collect();
    out.extend_from_slice(format!(".conflict-{id:x}-{secs}").as_bytes());
    out
}

/// Whether the cache's version wins conflicts in this round's binding.
pub(super) fn cache_wins(r: &Round<'_>) -> bool {
    r.b.spec.on_conflict == OnConflict::Cache
}

impl Server {
    /// `WbRebase` at object `id`'s owner, under this server's own write
    /// lease on it.
    pub(super) async fn wb_rebase(
        &self,
        store: Arc<Store>,
        binding: FileId,
        id: FileId,
        count: Option<u64>,
        place: Option<WbHome>,
        now: Option<(Vec<u8>, HomeStamp, Attr)>,
    ) -> Result<(), WireError> {
        let _own = self.own_write_lease(id).await?;
        metadata(|| store.wb_rebase(id, count, binding, place.as_ref(), now.as_ref()))
    }

    /// Home's handle of `.conflicts/` in the bound directory (made if
    /// missing).
    async fn conflicts_dir(&self, r: &mut Round<'_>) -> Result<HomeHandle, WireError> {
        if let Some(h) = &r.conflicts {
            return Ok(h.clone());
        }
        let Some(root) = self.resolve(r, r.binding).await? else {
            return Err(home_failed(r.b, HomeError::NotFound));
        };
        let home = r.home.clone();
        let h = match home.lookup(&root, CONFLICTS_DIR).await {
            Ok((h, _)) => h,
            Err(HomeError::NotFound) => {
                let set = HomeSetAttr {
                    mode: Some(0o755),
                    ..HomeSetAttr::default()
                };
                match home.create(&root, CONFLICTS_DIR, &HomeNew::Dir, &set).await {
                    Ok((h, _)) => h,
                    Err(HomeError::Exists) => {
                        home.lookup(&root, CONFLICTS_DIR)
                            .await
                            .map_err(|e| home_failed(r.b, e))?
                            .0
                    }
                    Err(e) => return Err(home_failed(r.b, e)),
                }
            }
            Err(e) => return Err(home_failed(r.b, e)),
        };
        r.conflicts = Some(h.clone());
        Ok(h)
    }

    /// The name object `id` has in the cache, for its `.conflicts/` copy
    /// (a file keeps no parent: found in the round's maps, else by asking
    /// every range; `file` if every range answered and none names it). A
    /// range that does not answer fails the resolution (the next round
    /// tries again): the copy's name must not depend on who answered.
    async fn name_in_cache(&self, r: &Round<'_>, id: FileId) -> Result<Vec<u8>, WireError> {
        if let Some(rec) = r.homes.get(&id).filter(|rec| rec.dir != 0) {
            return Ok(rec.name.clone());
        }
        if let Some((_, n)) = r.named_in.get(&id).and_then(|v| v.first()) {
            return Ok(n.clone());
        }
        for range in 0..r.vol.layout.servers {
            let req = Request::WbNameOf { id, range };
            match self.range_ask_r(&r.vol, range, &req).await? {
                Reply::WbHomes(found) => {
                    if let Some(f) = found.into_iter().next() {
                        return Ok(f.name);
                    }
                }
                other => {
                    return Err(super::err(
                        morris_proto::ErrorCode::Protocol,
                        format!("unexpected {other:?}"),
                    ))
                }
            }
        }
        Ok(b"file".to_vec())
    }

    /// Writes the cache's version of object `id` (inode `i`) to
    /// `.conflicts/` at home: a file with its data if the data is the
    /// cache's own, any other object as it is in the cache.
    async fn keep_cache_version(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        i: &Inode,
        home_mtime: i64,
    ) -> Result<Vec<u8>, WireError> {
        let cd = self.conflicts_dir(r).await?;
        let base = self.name_in_cache(r, id).await?;
        let name = conflict_name(&base, id, home_mtime);
        let (what, attrs) = new_of(i);
        let home = r.home.clone();
        let h = match home.create(&cd, &name, &what, &attrs).await {
            Ok((h, _)) => h,
            Err(HomeError::Exists) => {
                home.lookup(&cd, &name)
                    .await
                    .map_err(|e| home_failed(r.b, e))?
                    .0
            }
            Err(e) => return Err(home_failed(r.b, e)),
        };
        let own_data = i
            .home
            .as_ref()
            .is_some_and(|l| l.is_local() && i.attr.kind == FileKind::File);
        if own_data {
            let size = i.attr.size;
            let set = HomeSetAttr {
                size: Some(size),
                ..HomeSetAttr::default()
            };
            home.setattr(&h, &set)
                .await
                .map_err(|e| home_failed(r.b, e))?;
            let bytes = self.push_data(r, id, &h, size).await?;
            r.b.wb.pushed_bytes.fetch_add(bytes, Ordering::Relaxed);
            home.setattr(&h, &attrs)
                .await
                .map_err(|e| home_failed(r.b, e))?;
        }
        Ok(name)
    }

    /// Copies home's object `h` (attributes `a`), which the cache's
    /// version of object `id` is about to replace, to `.conflicts/` at
    /// home (the cache winning). Made again in place if a crash cut an
    /// earlier copy short.
    pub(super) async fn keep_home_version(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        h: &HomeHandle,
        a: &HomeAttr,
    ) -> Result<Vec<u8>, WireError> {
        let cd = self.conflicts_dir(r).await?;
        let base = self.name_in_cache(r, id).await?;
        let name = conflict_name(&base, id, a.mtime.secs);
        let home = r.home.clone();
        let failed = |e| home_failed(r.b, e);
        let what = match a.kind {
            HomeKind::File => HomeNew::File,
            HomeKind::Dir => HomeNew::Dir,
            HomeKind::Symlink => HomeNew::Symlink(home.read_link(h).await.map_err(failed)?),
            HomeKind::BlockDev | HomeKind::CharDev => HomeNew::Device(a.kind, a.rdev),
            HomeKind::Fifo => HomeNew::Fifo,
            HomeKind::Socket => HomeNew::Socket,
        };
        let set = HomeSetAttr {
            mode: (a.kind != HomeKind::Symlink).then_some(a.mode & 0o7777),
            ..HomeSetAttr::default()
        };
        let copy = match home.create(&cd, &name, &what, &set).await {
            Ok((c, _)) => c,
            Err(HomeError::Exists) => home.lookup(&cd, &name).await.map_err(failed)?.0,
            Err(e) => return Err(failed(e)),
        };
        if a.kind == HomeKind::File {
            let mut off = 0u64;
            let step = home.max_read().clamp(4096, 1 << 20);
            loop {
                let got = home.read(h, off, step).await.map_err(failed)?;
                let mut data: Bytes = got.data;
                let end = data.is_empty() || got.eof;
                while !data.is_empty() {
                    let n = home.write(&copy, off, data.clone()).await.map_err(failed)?;
                    if n == 0 {
                        return Err(failed(HomeError::Io("home took no bytes".into())));
                    }
                    let n = (n as usize).min(data.len());
                    off += n as u64;
                    data = data.slice(n..);
                }
                if end {
                    break;
                }
            }
            home.commit(&copy).await.map_err(failed)?;
            let trim = HomeSetAttr {
                size: Some(off),
                ..HomeSetAttr::default()
            };
            home.setattr(&copy, &trim).await.map_err(failed)?;
        }
        let times = HomeSetAttr {
            atime: Some(a.atime),
            mtime: Some(a.mtime),
            ..HomeSetAttr::default()
        };
        if a.kind != HomeKind::Symlink {
            home.setattr(&copy, &times).await.map_err(failed)?;
        }
        r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
        warn!(
            binding = r.binding,
            id,
            kept = %String::from_utf8_lossy(&name),
            "write-back: conflict (changed in the cache and at home): the cache's version wins, home's was copied to .conflicts/ at home"
        );
        Ok(name)
    }

    /// Moves what home has under `name` in its directory `hd` (another
    /// writer's object, modified at `mtime`) into `.conflicts/` at home,
    /// for object `obj` of the cache to take the name.
    pub(super) async fn move_home_away(
        &self,
        r: &mut Round<'_>,
        hd: &HomeHandle,
        name: &[u8],
        obj: FileId,
        mtime: HomeTime,
    ) -> Result<Vec<u8>, WireError> {
        let cd = self.conflicts_dir(r).await?;
        let kept = conflict_name(name, obj, mtime.secs);
        match r.home.rename(hd, name, &cd, &kept).await {
            // Already moved (a round cut short after it).
            Ok(()) | Err(HomeError::NotFound) => {}
            Err(e) => return Err(home_failed(r.b, e)),
        }
        r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
        Ok(kept)
    }

    /// Resolves a conflict on object `id` (inode `i`): its version is kept
    /// under `.conflicts/` at home, then it becomes home's object `now`
    /// (placed at `place`, if the cache made it), or, with `now` `None`,
    /// only its mark goes. `Ok` once resolved.
    pub(super) async fn resolve_conflict(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        i: &Inode,
        now: Option<(HomeHandle, HomeAttr)>,
        place: Option<WbHome>,
    ) -> Result<(), WireError> {
        let secs = now
            .as_ref()
            .map_or(i.attr.mtime.secs, |(_, a)| a.mtime.secs);
        let kept = self.keep_cache_version(r, id, i, secs).await?;
        let count = r.counts.get(&id).copied().unwrap_or(0);
        let req = Request::WbRebase {
            binding: r.binding,
            id,
            count: Some(count),
            place,
            now: now.map(|(h, a)| (h.0, stamp_of(&a), attr_of(&a))),
        };
        match self.range_ask(&r.vol, id, &req).await? {
            Reply::Ok => {}
            other => {
                return Err(super::err(
                    morris_proto::ErrorCode::Protocol,
                    format!("unexpected {other:?}"),
                ))
            }
        }
        r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
        r.rebased.insert(id);
        warn!(
            binding = r.binding,
            id,
            kept = %String::from_utf8_lossy(&kept),
            "write-back: conflict (changed in the cache and at home): home's version kept, the cache's is in .conflicts/ at home"
        );
        Ok(())
    }

    /// A name `name` of directory `d` that both the cache (object `obj`,
    /// inode `i`, never pushed) and home (`hh`, `ha`) made
    /// (independent-writer caches): resolved as the table above says.
    /// `true`: home's object was moved away from the name.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn resolve_collision(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        obj: FileId,
        i: &Inode,
        name: &[u8],
        home_obj: (HomeHandle, HomeAttr),
    ) -> Result<bool, WireError> {
        let (hh, ha) = home_obj;
        let place = WbHome {
            id: obj,
            dir: d,
            name: name.to_vec(),
            fileid: ha.fileid,
            handle: hh.0.clone(),
        };
        let home_kind = super::cache::kind_of(ha.kind);
        if i.attr.kind == FileKind::Dir && home_kind == FileKind::Dir {
            // Merged: the cache's directory is home's from now on (its
            // mark stays: its entries are still to push). Its stamp is
            // one no listing has, so its next revalidation lists home's
            // entries into it.
            let mut stamp = stamp_of(&ha);
            stamp.size = u64::MAX;
            let req = Request::WbRebase {
                binding: r.binding,
                id: obj,
                count: None,
                place: Some(place.clone()),
                now: Some((hh.0.clone(), stamp, attr_of(&ha))),
            };
            self.range_ask(&r.vol, obj, &req).await?;
            super::push_names::note_place(r, place);
            r.handles.insert(obj, hh);
            r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
            warn!(dir = d, name = %String::from_utf8_lossy(name), "write-back: a directory made both in the cache and at home: merged");
            return Ok(false);
        }
        let files = i.attr.kind == FileKind::File && home_kind == FileKind::File;
        if files && !cache_wins(r) {
            self.resolve_conflict(r, obj, i, Some((hh, ha)), Some(place.clone()))
                .await?;
            super::push_names::note_place(r, place);
            return Ok(false);
        }
        // Different kinds, or the cache's file winning: home's object
        // goes into `.conflicts/` at home, the cache's takes the name.
        let kept = self.move_home_away(r, hd, name, obj, ha.mtime).await?;
        warn!(dir = d, name = %String::from_utf8_lossy(name), kept = %String::from_utf8_lossy(&kept), "write-back: a name made both in the cache and at home: home's object moved to .conflicts/");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_home::{HomeKind, HomeTime};
    use morris_proto::Timestamp;

    fn home_attr(size: u64, mtime: i64) -> HomeAttr {
        let t = HomeTime {
            secs: mtime,
            nsecs: 0,
        };
        HomeAttr {
            kind: HomeKind::File,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            used: size,
            rdev: (0, 0),
            fsid: 1,
            fileid: 7,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    fn inode(size: u64, mtime: i64) -> Inode {
        let mut a = attr_of(&home_attr(size, mtime));
        a.mtime = Timestamp {
            secs: mtime,
            nanos: 0,
        };
        Inode {
            id: 1,
            gen: 1,
            parent: 0,
            attr: a,
            target: None,
            stale: Vec::new(),
            alloc: None,
            home: None,
        }
    }

    #[test]
    fn a_home_left_as_pushed_is_no_conflict() {
        let seen = stamp_of(&home_attr(10, 100));
        // The cache changed the file since; home did not.
        assert!(!changed_at_home(
            &seen,
            &inode(20, 200),
            &home_attr(10, 100)
        ));
    }

    #[test]
    fn a_home_changed_to_something_else_is_a_conflict() {
        let seen = stamp_of(&home_attr(10, 100));
        assert!(changed_at_home(&seen, &inode(20, 200), &home_attr(10, 300)));
        assert!(changed_at_home(&seen, &inode(20, 200), &home_attr(11, 100)));
    }

    #[test]
    fn a_home_that_already_has_the_caches_version_is_no_conflict() {
        // A push whose stamp was not recorded (a crash just after it).
        let seen = stamp_of(&home_attr(10, 100));
        assert!(!changed_at_home(
            &seen,
            &inode(20, 200),
            &home_attr(20, 200)
        ));
    }

    #[test]
    fn a_push_cut_short_is_no_conflict() {
        let seen = pushing(FileKind::File);
        assert!(!changed_at_home(&seen, &inode(20, 200), &home_attr(7, 300)));
    }

    #[test]
    fn conflict_names_are_stable_and_bounded() {
        let long = vec![b'a'; 255];
        let n = conflict_name(&long, 0xabc, 1700000000);
        assert!(n.len() <= 255);
        assert_eq!(n, conflict_name(&long, 0xabc, 1700000000));
        assert!(n.ends_with(b".conflict-abc-1700000000"));
    }
}
