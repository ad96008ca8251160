//! Renames: `rename(2)` and `renameat2(2)`'s flags (`RENAME_NOREPLACE`,
//! `RENAME_EXCHANGE`, `RENAME_WHITEOUT`).
//!
//! The ordering rules of [`super`] hold: a new entry before the old one
//! goes, a new inode (a whiteout) before the entry naming it, and no step
//! leaves an object without a name.

use morris_proto::{
    DirEntry, ErrorCode, FileId, FileKind, Handle, Inode, Request, SetAttr, Timestamp,
};

use super::{check_move, check_name, RETRIES};
use crate::leases::{pick, LeaseGuard, Mode};
use crate::perm::{check_delete, W_OK, X_OK};
use crate::{Caller, Client, Error, RenameFlags, Result};

impl Client {
    pub(crate) async fn do_rename(
        &self,
        sdir: FileId,
        sname: &[u8],
        ddir: FileId,
        dname: &[u8],
        flags: RenameFlags,
        caller: &Caller,
    ) -> Result<()> {
        check_name(sname)?;
        check_name(dname)?;
        if flags.exchange {
            if flags.noreplace || flags.whiteout {
                return Err(Error::new(
                    ErrorCode::Invalid,
                    "RENAME_EXCHANGE with another flag",
                ));
            }
            if sdir != ddir {
                return self.exchange_across(sdir, sname, ddir, dname, caller).await;
            }
            return self.exchange(sdir, sname, dname, caller).await;
        }
        if sdir == ddir && sname == dname {
            return Ok(());
        }
        self.ensure_listed(sdir).await?;
        self.ensure_listed(ddir).await?;
        let sh = self.leases.handle(sdir)?;
        let dh = self.leases.handle(ddir)?;
        let _changing = self.dir_locks.lock(&[sdir, ddir]).await;
        for _ in 0..RETRIES {
            let Some(s) = self.peek(sdir, sname).await? else {
                return Err(Error::new(ErrorCode::NotFound, "no such entry"));
            };
            let d = self.peek(ddir, dname).await?;
            if let Some(d) = &d {
                if d.child == s.child {
                    return Ok(()); // both names are links to one file: nothing to do
                }
                if flags.noreplace {
                    return Err(Error::new(ErrorCode::Exists, "target exists"));
                }
                match (s.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                    (true, false) => {
                        return Err(Error::new(ErrorCode::NotDir, "target is not a directory"))
                    }
                    (false, true) => {
                        return Err(Error::new(ErrorCode::IsDir, "target is a directory"))
                    }
                    _ => {}
                }
            }
            let moving_dir = s.kind == FileKind::Dir && sdir != ddir;
            if moving_dir && (ddir == s.child.id || self.is_ancestor(s.child.id, ddir).await?) {
                return Err(Error::new(
                    ErrorCode::Invalid,
                    "cannot move a directory into itself",
                ));
            }
            let mut hs = vec![sh, dh];
            if moving_dir {
                hs.push(s.child);
            }
            if let Some(d) = &d {
                hs.push(d.child);
            }
            let gs = match self.leases.lock_many(&hs).await {
                Ok(gs) => gs,
                Err(err) if err.code == ErrorCode::Stale => continue,
                Err(err) => return Err(err),
            };
            let sg = pick(&gs, sdir)?;
            let dg = pick(&gs, ddir)?;
            if dg.inode().attr.kind != FileKind::Dir {
                return Err(Error::new(ErrorCode::NotDir, "target directory"));
            }
            // Re-check both names under the write leases.
            let s_now = self.entry_in(sg, sname).await?;
            let d_now = self.entry_in(dg, dname).await?;
            if s_now.as_ref().map(|e| e.child) != Some(s.child)
                || d_now.as_ref().map(|e| e.child) != d.as_ref().map(|e| e.child)
            {
                continue;
            }
            self.check_change(&sg.inode()).await?;
            self.check_change(&dg.inode()).await?;
            crate::flags::may_add(&dg.inode())?;
            let s_inode = self.do_getattr_nolease(s.child).await?;
            let moves_at_home = self.moves_at_home(&s_inode).await?;
            check_move(&s_inode, &dg.inode(), moves_at_home)?;
            let s_acl = self.acl_under(sg, &sg.inode(), caller).await?;
            check_delete(&sg.inode(), s_acl.as_ref(), &s_inode, caller)?;
            let d_acl = self.acl_under(dg, &dg.inode(), caller).await?;
            crate::perm::check_access_acl(&dg.inode(), d_acl.as_ref(), caller, W_OK | X_OK)?;
            if let Some(d) = &d {
                let tg = pick(&gs, d.child.id)?;
                check_delete(&dg.inode(), d_acl.as_ref(), &tg.inode(), caller)?;
                if d.kind == FileKind::Dir && !self.is_empty_dir(tg).await? {
                    return Err(Error::new(
                        ErrorCode::NotEmpty,
                        "target directory not empty",
                    ));
                }
            }
            // Home has an object fetched from it at its old name until
            // the write-back moves it there: recorded first.
            self.place_before_move(&s_inode, sdir, sname).await?;
            // RENAME_WHITEOUT: the object that takes the old name is made
            // first (adding: inode before entry).
            let whiteout = match flags.whiteout {
                true => Some(self.make_whiteout(sg, caller).await?),
                false => None,
            };
            // The object's status change time moves, as on Linux file
            // systems (a moved directory's, with its parent, below).
            let touch = async {
                if !moving_dir {
                    self.touch_ctime(s.child, Timestamp::now()).await;
                }
            };
            let steps = self.rename_steps(
                sg,
                dg,
                &gs,
                (sname, &s),
                d.as_ref(),
                dname,
                whiteout.as_ref(),
                moving_dir,
            );
            let (moved_res, ()) = tokio::join!(steps, touch);
            if let (Err(_), Some(w)) = (&moved_res, &whiteout) {
                // Nothing names it (its entry is the last step).
                self.delete_unnamed(w).await;
            }
            moved_res?;
            if let Some(inv) = self.leases.invalidator() {
                inv.entry(sdir, sname);
                inv.entry(ddir, dname);
            }
            if let Some(d) = &d {
                // The replaced object's link count follows (`deferred.rs`).
                return self.drop_link_later(super::take(gs, d.child.id)?).await;
            }
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::Unavailable,
            "directories keep changing",
        ))
    }

    /// The entry changes of a rename whose leases `gs` are held: `s`, named
    /// `sname` in `sg`'s directory, becomes `dname` in `dg`'s, replacing
    /// `d`; the old name then names `whiteout`, or nothing.
    #[allow(clippy::too_many_arguments)]
    async fn rename_steps(
        &self,
        sg: &LeaseGuard,
        dg: &LeaseGuard,
        gs: &[LeaseGuard],
        (sname, s): (&[u8], &DirEntry),
        d: Option<&DirEntry>,
        dname: &[u8],
        whiteout: Option<&Inode>,
        moving_dir: bool,
    ) -> Result<()> {
        let (sdir, ddir) = (sg.inode().id, dg.inode().id);
        let (sh, dh) = (sg.handle(), dg.handle());
        let replace = d.map(|e| e.child.id);
        let mut moved = s.clone();
        moved.name = dname.to_vec();
        if sdir == ddir {
            let reply = self
                .dir_call(
                    sg,
                    Request::Rename {
                        dir: sh,
                        from: sname.to_vec(),
                        to: dname.to_vec(),
                        replace,
                        op: 0,
                    },
                )
                .await?;
            Self::dir_changed(sg, reply, dname, Some(moved))?;
            sg.entry.state.lock().names.insert(sname.to_vec(), None);
            if let Some(w) = whiteout {
                let reply = self.dir_call(sg, link_req(sh, sname, w, None)).await?;
                Self::dir_changed(sg, reply, sname, Some(entry_of(sname, w)))?;
            }
        } else {
            // Moving between directories: add the new entry, then remove the old.
            let reply = self
                .dir_call(
                    dg,
                    Request::Link {
                        dir: dh,
                        name: dname.to_vec(),
                        child: s.child,
                        kind: s.kind,
                        replace,
                        op: 0,
                    },
                )
                .await?;
            Self::dir_changed(dg, reply, dname, Some(moved))?;
            let reply = match whiteout {
                // The whiteout replaces the old entry in one step.
                Some(w) => {
                    let req = link_req(sh, sname, w, Some(s.child.id));
                    let reply = self.dir_call(sg, req).await?;
                    Self::dir_changed(sg, reply, sname, Some(entry_of(sname, w)))?
                }
                None => {
                    let req = Request::Unlink {
                        dir: sh,
                        name: sname.to_vec(),
                        expect: Some(s.child.id),
                        op: 0,
                    };
                    let reply = self.dir_call(sg, req).await?;
                    Self::dir_changed(sg, reply, sname, None)?
                }
            };
            drop(reply);
            if moving_dir {
                let cg = pick(gs, s.child.id)?;
                self.set_inode(
                    cg,
                    SetAttr {
                        parent: Some(ddir),
                        ctime: Some(Timestamp::now()),
                        ..SetAttr::default()
                    },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)` of names `a` and `b` of `dir`.
    async fn exchange(&self, dir: FileId, a: &[u8], b: &[u8], caller: &Caller) -> Result<()> {
        if a == b {
            return Ok(());
        }
        self.ensure_listed(dir).await?;
        let _changing = self.dir_locks.lock(&[dir]).await;
        let missing = || Error::new(ErrorCode::NotFound, "no such entry");
        // Under the directory's write lease its names are this client's.
        let g = self.dir_guard(dir, Mode::Write).await?;
        let ea = self.entry_in(&g, a).await?.ok_or_else(missing)?;
        let eb = self.entry_in(&g, b).await?.ok_or_else(missing)?;
        if ea.child == eb.child {
            return Ok(());
        }
        self.check_change(&g.inode()).await?;
        for e in [&ea, &eb] {
            let child = self.do_getattr_nolease(e.child).await?;
            crate::flags::may_remove(&g.inode(), &child)?;
        }
        if caller.check {
            // Each name is removed and made again: write and search here,
            // and the sticky rule for both objects.
            let acl = self.acl_under(&g, &g.inode(), caller).await?;
            for e in [&ea, &eb] {
                let child = self.do_getattr_nolease(e.child).await?;
                check_delete(&g.inode(), acl.as_ref(), &child, caller)?;
            }
        }
        let req = Request::Exchange {
            dir: g.handle(),
            a: a.to_vec(),
            b: b.to_vec(),
            op: 0,
        };
        let now = Timestamp::now();
        let touch = async {
            self.touch_ctime(ea.child, now).await;
            self.touch_ctime(eb.child, now).await;
        };
        let (reply, ()) = tokio::join!(self.dir_call(&g, req), touch);
        let reply = reply?;
        let swapped = |name: &[u8], to: &DirEntry| DirEntry {
            name: name.to_vec(),
            child: to.child,
            kind: to.kind,
            cookie: 0,
        };
        Self::dir_changed(&g, reply, a, Some(swapped(a, &eb)))?;
        g.entry
            .state
            .lock()
            .names
            .insert(b.to_vec(), Some(swapped(b, &ea)));
        if let Some(inv) = self.leases.invalidator() {
            inv.entry(dir, a);
            inv.entry(dir, b);
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)` of `sdir/sname` and `ddir/dname`, two
    /// directories: each object takes the other's name. Under the write
    /// leases of both directories (and of a directory that moves: its
    /// parent changes) no other client sees a step; a client killed midway
    /// leaves no object without a name, because the swap goes through a
    /// third name in `ddir`: `S` named there too, `sname` repointed to `D`,
    /// `dname` repointed to `S`, the third name removed. What such a crash
    /// can leave is an extra name (`.morris-exchange-*`, or a second name
    /// of D), which fsck reports as a link count not matching the names.
    async fn exchange_across(
        &self,
        sdir: FileId,
        sname: &[u8],
        ddir: FileId,
        dname: &[u8],
        caller: &Caller,
    ) -> Result<()> {
        self.ensure_listed(sdir).await?;
        self.ensure_listed(ddir).await?;
        let sh = self.leases.handle(sdir)?;
        let dh = self.leases.handle(ddir)?;
        let _changing = self.dir_locks.lock(&[sdir, ddir]).await;
        let missing = || Error::new(ErrorCode::NotFound, "no such entry");
        for _ in 0..RETRIES {
            let s = self.peek(sdir, sname).await?.ok_or_else(missing)?;
            let d = self.peek(ddir, dname).await?.ok_or_else(missing)?;
            if s.child == d.child {
                return Ok(());
            }
            // A directory may not end up inside itself.
            for (obj, into) in [(&s, ddir), (&d, sdir)] {
                if obj.kind == FileKind::Dir
                    && (into == obj.child.id || self.is_ancestor(obj.child.id, into).await?)
                {
                    return Err(Error::new(
                        ErrorCode::Invalid,
                        "cannot move a directory into itself",
                    ));
                }
            }
            let mut hs = vec![sh, dh];
            hs.extend(
                [&s, &d]
                    .iter()
                    .filter(|e| e.kind == FileKind::Dir)
                    .map(|e| e.child),
            );
            let gs = match self.leases.lock_many(&hs).await {
                Ok(gs) => gs,
                Err(err) if err.code == ErrorCode::Stale => continue,
                Err(err) => return Err(err),
            };
            let sg = pick(&gs, sdir)?;
            let dg = pick(&gs, ddir)?;
            for g in [sg, dg] {
                let i = g.inode();
                if i.attr.kind != FileKind::Dir {
                    return Err(Error::new(ErrorCode::NotDir, "not a directory"));
                }
                if i.home.is_some() {
                    return Err(Error::new(
                        ErrorCode::NotSupported,
                        "exchanging names between directories cached from a home",
                    ));
                }
                self.check_change(&i).await?;
            }
            if self.entry_in(sg, sname).await?.map(|e| e.child) != Some(s.child)
                || self.entry_in(dg, dname).await?.map(|e| e.child) != Some(d.child)
            {
                continue;
            }
            let s_inode = self.do_getattr_nolease(s.child).await?;
            let d_inode = self.do_getattr_nolease(d.child).await?;
            check_move(&s_inode, &dg.inode(), false)?;
            check_move(&d_inode, &sg.inode(), false)?;
            crate::flags::may_remove(&sg.inode(), &s_inode)?;
            crate::flags::may_remove(&dg.inode(), &d_inode)?;
            if caller.check {
                // Each object leaves one directory and enters the other.
                let s_acl = self.acl_under(sg, &sg.inode(), caller).await?;
                let d_acl = self.acl_under(dg, &dg.inode(), caller).await?;
                check_delete(&sg.inode(), s_acl.as_ref(), &s_inode, caller)?;
                check_delete(&dg.inode(), d_acl.as_ref(), &d_inode, caller)?;
            }
            let third = format!(".morris-exchange-{:016x}", rand::random::<u64>()).into_bytes();
            let entry = |name: &[u8], e: &DirEntry| DirEntry {
                name: name.to_vec(),
                child: e.child,
                kind: e.kind,
                cookie: 0,
            };
            let link =
                |dir: Handle, name: &[u8], e: &DirEntry, replace: Option<FileId>| Request::Link {
                    dir,
                    name: name.to_vec(),
                    child: e.child,
                    kind: e.kind,
                    replace,
                    op: 0,
                };
            let reply = self.dir_call(dg, link(dh, &third, &s, None)).await?;
            Self::dir_changed(dg, reply, &third, Some(entry(&third, &s)))?;
            let reply = self
                .dir_call(sg, link(sh, sname, &d, Some(s.child.id)))
                .await?;
            Self::dir_changed(sg, reply, sname, Some(entry(sname, &d)))?;
            let reply = self
                .dir_call(dg, link(dh, dname, &s, Some(d.child.id)))
                .await?;
            Self::dir_changed(dg, reply, dname, Some(entry(dname, &s)))?;
            let unlink = Request::Unlink {
                dir: dh,
                name: third.clone(),
                expect: Some(s.child.id),
                op: 0,
            };
            let reply = self.dir_call(dg, unlink).await?;
            Self::dir_changed(dg, reply, &third, None)?;
            for (obj, parent) in [(&s, ddir), (&d, sdir)] {
                if obj.kind == FileKind::Dir {
                    let set = SetAttr {
                        parent: Some(parent),
                        ctime: Some(Timestamp::now()),
                        ..SetAttr::default()
                    };
                    self.set_inode(pick(&gs, obj.child.id)?, set).await?;
                } else {
                    self.touch_ctime(obj.child, Timestamp::now()).await;
                }
            }
            if let Some(inv) = self.leases.invalidator() {
                inv.entry(sdir, sname);
                inv.entry(ddir, dname);
            }
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::Unavailable,
            "directories keep changing",
        ))
    }

    /// A renamed object's status change time moves to `t`: at its owner,
    /// without a lease (`TouchCtime`), and in this client's copy. Not
    /// stored if the owner cannot be reached: the rename goes on.
    async fn touch_ctime(&self, h: Handle, t: Timestamp) {
        self.leases.touch_ctime(h.id, t);
        let req = Request::TouchCtime { ino: h, ctime: t };
        if let Err(e) = self.call_owner(h.id, req).await {
            tracing::debug!(ino = h.id, error = %e, "a rename's ctime not stored");
        }
    }

    /// A whiteout for `RENAME_WHITEOUT` (overlayfs): a character device
    /// 0:0 of the caller, made in `sg`'s directory but not yet named.
    async fn make_whiteout(&self, sg: &LeaseGuard, caller: &Caller) -> Result<Inode> {
        let dir = sg.inode();
        if dir.home.is_some() {
            return Err(Error::new(
                ErrorCode::NotSupported,
                "whiteouts in a directory cached from a home",
            ));
        }
        let attr = Self::new_attr(FileKind::CharDev, 0, 0, &dir, caller);
        let (inode, fence) = self
            .create_inode(Request::CreateInode {
                parent: dir.id,
                attr,
                target: None,
                home: None,
                op: self.pool.next_op(),
                xattrs: Vec::new(),
            })
            .await?;
        self.leases
            .install_granted(Mode::Write, inode.clone(), fence, Vec::new());
        Ok(inode)
    }

    /// Removes inode `i`, which nothing names (else fsck would).
    async fn delete_unnamed(&self, i: &Inode) {
        let req = Request::DeleteInode {
            ino: i.handle(),
            op: self.pool.next_op(),
        };
        if let Err(e) = self.call_owner(i.id, req).await {
            tracing::debug!(ino = i.id, error = %e, "unnamed inode left for fsck");
        }
        self.leases.forget(i.id);
    }
}

/// `Link` of `name` in `dir` to inode `i`, replacing the entry naming `replace`.
fn link_req(dir: Handle, name: &[u8], i: &Inode, replace: Option<FileId>) -> Request {
    Request::Link {
        dir,
        name: name.to_vec(),
        child: i.handle(),
        kind: i.attr.kind,
        replace,
        op: 0,
    }
}

/// The cached entry `name` → `i`.
fn entry_of(name: &[u8], i: &Inode) -> DirEntry {
    DirEntry {
        name: name.to_vec(),
        child: i.handle(),
        kind: i.attr.kind,
        cookie: 0,
    }
}
