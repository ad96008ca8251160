//! Namespace operations and their write ordering.
//!
//! Ordering rules (MORRIS §3.1), so that a server killed at any point never
//! leaves an entry pointing to nothing:
//! * adding: the new inode is committed (`CreateInode`, or the `nlink` bump of
//!   a hard link) before the entry that names it (`Link`);
//! * removing: the entry goes first (`Unlink`), then the inode, then the data;
//! * moving between directories: the new entry first, then the old one is removed.
//!
//! Every operation that changes several inodes takes their write leases in
//! ascending id order ([`Leases::lock_many`]), the paper's fixed lock order.

use std::sync::Arc;

use bytes::Bytes;
use morris_proto::home::is_cache_id;
use morris_proto::{
    inode_flags, Attr, DirEntry, ErrorCode, FileId, FileKind, Handle, Inode, Reply, Request,
    SetAttr, Timestamp, MAX_NAME_LEN, MAX_SYMLINK_LEN, ROOT_ID,
};

use crate::deferred::Step;
use crate::leases::{pick, LeaseGuard, Mode};
use crate::perm::{check_delete, check_setattr, W_OK, X_OK};
use crate::pool::unexpected;
use crate::quota::Charge;
use crate::{Caller, Client, Error, FsStat, Result};

mod rename;
mod reserved;
mod tmpfile;

/// Most names a directory listing adds to the cache; past it the directory
/// is not cached whole (lookups still are).
const MAX_CACHED_NAMES: usize = 200_000;

/// How often a namespace operation restarts when another client changed the
/// directory between its lookup and its locking.
const RETRIES: usize = 8;

/// How long `statfs` waits for each server.
const STATFS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks a directory entry name.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::new(ErrorCode::Invalid, "empty, '.' or '..' name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::new(
            ErrorCode::NameTooLong,
            format!("name of {} bytes exceeds {MAX_NAME_LEN}", name.len()),
        ));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Error::new(ErrorCode::Invalid, "name contains '/' or NUL"));
    }
    Ok(())
}

/// Checks the name of an entry to be made: `.` and `..` exist already
/// (`EEXIST`, as `mkdir(2)`, `link(2)` and Linux's NFS server answer).
fn check_new_name(name: &[u8]) -> Result<()> {
    if name == b"." || name == b".." {
        return Err(Error::new(ErrorCode::Exists, "'.' and '..' exist"));
    }
    check_name(name)
}

/// Refuses moving (or linking) `obj` into directory `to`: across the edge
/// of a binding (a cache is a file system of its own: `mv` copies), or an
/// object whose data is home's unless `moves_at_home` (its home's handles
/// survive a rename there, as an NFS server's do: the write-back then
/// moves it at home; a local-directory home's handles are paths, and a
/// hard link of one is not built: `mv` and `cp` copy).
pub(crate) fn check_move(obj: &Inode, to: &Inode, moves_at_home: bool) -> Result<()> {
    let ob = obj.home.as_ref().map(|l| l.binding);
    let db = to.home.as_ref().map(|l| l.binding);
    if ob != db {
        return Err(Error::new(
            ErrorCode::CrossDevice,
            format!("{} and {} lie in different caches", obj.id, to.id),
        ));
    }
    if !moves_at_home && obj.home.as_ref().is_some_and(|l| !l.is_local()) {
        return Err(Error::new(
            ErrorCode::CrossDevice,
            format!("{} was fetched from home and keeps its place", obj.id),
        ));
    }
    Ok(())
}

pub(crate) fn inode_reply(r: Reply) -> Result<Inode> {
    match r {
        Reply::Inode(i) | Reply::Leased { inode: i, .. } | Reply::ReadLeased { inode: i, .. } => {
            Ok(i)
        }
        other => Err(unexpected(&other)),
    }
}

/// The guard on `id` out of `guards`; the others are dropped.
fn take(mut guards: Vec<LeaseGuard>, id: FileId) -> Result<LeaseGuard> {
    match guards.iter().position(|g| g.entry.id == id) {
        Some(at) => Ok(guards.swap_remove(at)),
        None => Err(Error::new(
            ErrorCode::NoLease,
            format!("no lease taken on {id}"),
        )),
    }
}

/// Applies to the cached directory under `g` what its owner's `Link`
/// (`now` is the new entry) or `Unlink` (`now` is `None`) of an object of
/// `kind` named `name` will do to it (`store.rs` `link`, `unlink`): the
/// name, the entry count, a subdirectory's link (never below 2), and
/// the times.
fn apply_entry_change(g: &LeaseGuard, name: &[u8], now: Option<DirEntry>, kind: FileKind) {
    let added = now.is_some();
    let mut st = g.entry.state.lock();
    st.changed();
    st.names.insert(name.to_vec(), now);
    let t = Timestamp::now();
    let a = &mut st.inode.attr;
    let subdir = u32::from(kind == FileKind::Dir);
    if added {
        a.size = a.size.saturating_add(1);
        a.nlink = a.nlink.saturating_add(subdir).max(2);
    } else {
        a.size = a.size.saturating_sub(1);
        a.nlink = a.nlink.saturating_sub(subdir).max(2);
    }
    a.mtime = t;
    a.ctime = t;
}

/// The outcome of a `Link` or `Unlink` sent by a deferred step.
fn entry_changed(r: Result<Reply>) -> Result<()> {
    match r? {
        Reply::Removed { .. } => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// The cached directory under `g` forgets what it knew of `name` and of
/// its own attributes (a deferred change of that name failed): both are
/// asked of its owner again.
fn forget_name(g: &LeaseGuard, name: &[u8]) {
    let mut st = g.entry.state.lock();
    st.changed();
    st.names.remove(name);
    st.complete = false;
    st.attr_valid = false;
}

/// The guards on `a` and `b` out of `guards`; the others are dropped.
fn take_two(mut guards: Vec<LeaseGuard>, a: FileId, b: FileId) -> Result<(LeaseGuard, LeaseGuard)> {
    let at = guards.iter().position(|g| g.entry.id == a);
    let ga = at.map(|i| guards.swap_remove(i));
    let gb = take(guards, b)?;
    match ga {
        Some(ga) => Ok((ga, gb)),
        None => Err(Error::new(
            ErrorCode::NoLease,
            format!("no lease taken on {a}"),
        )),
    }
}

/// The inode and fence number of a write grant (`CreateInode`).
fn leased_reply(r: Reply) -> Result<(Inode, u64)> {
    match r {
        Reply::Leased { inode, fence } => Ok((inode, fence)),
        other => Err(unexpected(&other)),
    }
}

impl Client {
    pub(crate) async fn call(&self, server: u32, req: Request) -> Result<Reply> {
        Ok(self.pool.call(server, req, Bytes::new()).await?.0)
    }

    /// Sends a metadata request about `id` to the server that serves its
    /// range now (`Pool::call_range`). A directory whose new names this
    /// client is still storing gets every other request after them
    /// (`deferred.rs`); a lookup need not wait, as the names on their way
    /// are answered here.
    pub(crate) async fn call_owner(&self, id: FileId, req: Request) -> Result<Reply> {
        if !matches!(req, Request::Lookup { .. }) {
            self.deferred
                .settled_for(id, &[Step::Entries, Step::Created])
                .await;
        }
        self.call_owner_now(id, req).await
    }

    /// [`Client::call_owner`] without waiting for deferred steps (they
    /// send their own requests with it).
    pub(crate) async fn call_owner_now(&self, id: FileId, req: Request) -> Result<Reply> {
        let range = self.layout.inode_server(id);
        Ok(self.pool.call_range(range, req, Bytes::new()).await?.1)
    }

    /// A use of the lease on directory `dir`.
    async fn dir_guard(&self, dir: FileId, mode: Mode) -> Result<LeaseGuard> {
        let h = self.leases.handle(dir)?;
        let g = self.leases.get(h, mode).await?;
        if g.inode().attr.kind != FileKind::Dir {
            return Err(Error::new(
                ErrorCode::NotDir,
                format!("{dir} is not a directory"),
            ));
        }
        Ok(g)
    }

    /// Looks `name` up under a lease on the directory, using the entry cache.
    async fn entry_in(&self, g: &LeaseGuard, name: &[u8]) -> Result<Option<DirEntry>> {
        {
            let st = g.entry.state.lock();
            if let Some(hit) = st.names.get(name) {
                return Ok(hit.clone());
            }
            if st.complete {
                return Ok(None);
            }
        }
        let e = self.server_entry(g, name).await?;
        if let Some(e) = &e {
            self.leases.learn(e.child);
        }
        let mut st = g.entry.state.lock();
        // If the name was cached while the lookup was on its way, that is
        // this client's own change to it (or a lookup answered no earlier):
        // the answer may predate the change (a late "absent" over a name
        // just created here), so it does not replace it.
        Ok(st
            .names
            .entry(name.to_vec())
            .or_insert_with(|| e.clone())
            .clone())
    }

    /// The entry `name` of the directory under `g` as its server has it now
    /// (never from the cache; waits for the server to come back).
    async fn server_entry(&self, g: &LeaseGuard, name: &[u8]) -> Result<Option<DirEntry>> {
        let r = self
            .call_owner(
                g.entry.id,
                Request::Lookup {
                    dir: g.handle(),
                    name: name.to_vec(),
                },
            )
            .await?;
        match r {
            Reply::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `Link`, `Unlink` or `Rename` to the directory under `g` with a
    /// fresh operation id: if the connection is lost after sending, the
    /// request is sent again with the same id, and the server, having kept
    /// the outcome of the first, answers without applying it twice.
    async fn dir_call(&self, g: &LeaseGuard, req: Request) -> Result<Reply> {
        self.call_owner(g.entry.id, req.with_op(self.pool.next_op()))
            .await
    }

    /// Applies the answer of `Link`/`Unlink`/`Rename` to the cached directory:
    /// `name` now maps to `now`, and the directory inode is the server's.
    fn dir_changed(
        g: &LeaseGuard,
        reply: Reply,
        name: &[u8],
        now: Option<DirEntry>,
    ) -> Result<Option<DirEntry>> {
        let Reply::Removed { entry, dir } = reply else {
            return Err(unexpected(&reply));
        };
        let mut st = g.entry.state.lock();
        st.changed();
        if dir.id == st.inode.id {
            st.inode = dir;
            st.attr_valid = true;
        } else {
            st.attr_valid = false;
        }
        // Every name the kernel may hold a dentry for is kept (so a recall can
        // invalidate it); only listings are capped (see do_readdir).
        st.names.insert(name.to_vec(), now);
        Ok(entry)
    }

    /// The inode under `g`, refetched if the server changed it behind our copy.
    pub(crate) async fn fresh(&self, g: &LeaseGuard) -> Result<Inode> {
        for _ in 0..RETRIES {
            let (valid, h, version) = {
                let st = g.entry.state.lock();
                (st.attr_valid, st.inode.handle(), st.version)
            };
            if valid {
                return Ok(g.inode());
            }
            // We hold the lease, so this answers at once with the current inode.
            let req = match g.entry.mode {
                Mode::Read => Request::AcquireRead { ino: h },
                Mode::Write => Request::AcquireWrite { ino: h },
            };
            let mut inode = inode_reply(self.call_owner(g.entry.id, req).await?)?;
            {
                let mut st = g.entry.state.lock();
                // A change of ours applied meanwhile is newer: ask again.
                if st.version == version {
                    if st.dirty {
                        // Local changes not yet stored win over the server's copy.
                        let local = st.inode.attr.clone();
                        self.leases.keep_local(g.entry.id, &local, &mut inode.attr);
                    }
                    if g.entry.mode == Mode::Write {
                        crate::copies::merge_stale(&st.inode.stale, &mut inode.stale);
                    }
                    st.inode = inode.clone();
                    st.attr_valid = true;
                    return Ok(inode);
                }
            }
        }
        Ok(g.inode())
    }

    /// Attributes of `id`.
    pub(crate) async fn do_getattr(&self, id: FileId) -> Result<Inode> {
        // A link count this client is still changing (`deferred.rs`).
        self.deferred.settled(id).await;
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Read).await?;
        self.fresh(&g).await
    }

    pub(crate) async fn do_lookup(&self, dir: FileId, name: &[u8]) -> Result<Inode> {
        if name == b"." {
            return self.do_getattr(dir).await;
        }
        if name == b".." {
            let d = self.do_getattr(dir).await?;
            let parent = if dir == ROOT_ID { ROOT_ID } else { d.parent };
            if parent == 0 {
                return Err(Error::new(ErrorCode::NotDir, "not a directory"));
            }
            if self.leases.handle(parent).is_err() {
                // A parent we never looked up: its generation comes with GetInode.
                let p = inode_reply(
                    self.call_owner(parent, Request::GetInode { ino: parent })
                        .await?,
                )?;
                self.leases.learn(p.handle());
            }
            return self.do_getattr(parent).await;
        }
        if name.is_empty() {
            return Err(Error::new(
                ErrorCode::NotFound,
                "no entry has an empty name",
            ));
        }
        check_name(name)?;
        for _ in 0..RETRIES {
            let (entry, version) = {
                let g = self.dir_guard(dir, Mode::Read).await?;
                let version = g.inode().home.map_or(0, |l| l.version);
                (self.entry_in(&g, name).await?, version)
            };
            let Some(e) = entry else {
                return Err(Error::new(ErrorCode::NotFound, "no such entry"));
            };
            // Another name of it removed a moment ago (`deferred.rs`).
            self.deferred.settled(e.child.id).await;
            let seed = self.cache.take_seed(e.child, dir, version);
            let tried_seed = seed.is_some();
            match self
                .leases
                .get_seeded(e.child, Mode::Read, seed.as_ref())
                .await
            {
                Ok(g) if is_cache_id(e.child.id) && g.entry.state.lock().inode.attr.nlink == 0 => {
                    // Removed here, named again by home's listing (an `iw`
                    // cache's removal that home did not take): made live
                    // again from its seed by its owner.
                    drop(g);
                    if let Some(seed) = self.seed_of(dir, name, e.child).await? {
                        if seed.handle() == e.child && seed.attr.nlink > 0 {
                            let g = self
                                .leases
                                .get_seeded(e.child, Mode::Read, Some(&seed))
                                .await?;
                            return self.fresh(&g).await;
                        }
                    }
                    let g = self.leases.get(e.child, Mode::Read).await?;
                    return self.fresh(&g).await;
                }
                Ok(g) => return self.fresh(&g).await,
                // The entry changed under us (removed, replaced): look again.
                Err(err) if err.code == ErrorCode::Stale || err.code == ErrorCode::NotFound => {
                    // Or it names a cached object whose inode is not made
                    // yet (a placeholder): take its lease with its seed. Or
                    // one that replaced another object at the same id (this
                    // client may still hold the old one's lease): make it
                    // from its seed, which recalls the old one's leases.
                    let seed = if tried_seed {
                        self.seed_of(dir, name, e.child).await?
                    } else {
                        self.seed_near(dir, version, &e).await?
                    };
                    if let Some(seed) = seed {
                        if !tried_seed
                            && seed.handle() == e.child
                            && !self.leases.holds_other(e.child)
                        {
                            self.cache.keep_seed(seed, dir, version);
                        } else {
                            self.make_cached(seed).await?;
                        }
                        continue;
                    }
                    self.leases.attr_changed(dir);
                    continue;
                }
                Err(err) => return Err(err),
            }
        }
        Err(Error::new(
            ErrorCode::Unavailable,
            "directory keeps changing",
        ))
    }

    pub(crate) async fn do_access(&self, id: FileId, mask: u32, caller: &Caller) -> Result<()> {
        let i = self.do_getattr(id).await?;
        self.permit(&i, caller, mask).await
    }

    /// Sends `CreateInode` to the next server in turn. One that cannot be
    /// reached, stays silent for half a lease, or is in its restart grace is
    /// passed over for the next, so creates go on while a server is down or
    /// cut off; the last one tried is waited for. A reply lost after a server created the inode leaves an
    /// unreachable inode, which fsck reclaims (as after a client crash).
    async fn create_inode(&self, req: Request) -> Result<(Inode, u64)> {
        let k = self.layout.servers;
        let first = self.pick_server();
        // Mirrored metadata: a server that does not serve its own range now
        // (taken over, or not yet confirmed) answers `NotOwner`; keep going
        // round for as long as a takeover takes.
        let rounds = if self.layout.replicas > 1 { 40 } else { 1 };
        let attempts = rounds * k;
        for n in 0..attempts - 1 {
            let server = (first + n) % k;
            let res = loop {
                match self
                    .call_bounded(server, req.clone(), Bytes::new(), None)
                    .await
                {
                    // `--on-disconnect block`: the create waits for home.
                    Err(e) if e.code == ErrorCode::HomeDown => {
                        tracing::debug!(server, error = %e, "create waits for home");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    r => break r,
                }
            };
            match res {
                Ok((reply, _)) => return leased_reply(reply),
                Err(e)
                    if matches!(
                        e.code,
                        ErrorCode::Unavailable | ErrorCode::Grace | ErrorCode::NotOwner
                    ) =>
                {
                    tracing::debug!(server, error = %e, "creating the inode elsewhere");
                }
                Err(e) => return Err(e),
            }
            if (n + 1) % k == 0 {
                // A full round refused: wait a little before the next.
                tokio::time::sleep(self.pool.lease() / 8).await;
            }
        }
        // The last one tried is waited for.
        leased_reply(self.call((first + attempts - 1) % k, req).await?)
    }

    fn pick_server(&self) -> u32 {
        let n = self
            .next_server
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        n % self.layout.servers
    }

    fn new_attr(kind: FileKind, mode: u32, rdev: u32, dir: &Inode, c: &Caller) -> Attr {
        let now = Timestamp::now();
        let mut mode = mode & 0o7777;
        let gid = if dir.attr.mode & 0o2000 != 0 {
            if kind == FileKind::Dir {
                mode |= 0o2000;
            }
            dir.attr.gid
        } else {
            c.gid
        };
        Attr {
            kind,
            mode,
            uid: c.uid,
            gid,
            nlink: 1,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev,
            // As ext4: what reads and backups should do is inherited.
            flags: dir.attr.flags & (inode_flags::NODUMP | inode_flags::NOATIME),
        }
    }

    /// Creates an inode and then the entry naming it (inode first: ordering rule).
    async fn make(
        &self,
        dir: FileId,
        name: &[u8],
        mut attr_of: impl FnMut(&Inode) -> Attr,
        target: Option<Vec<u8>>,
        exclusive: bool,
        caller: &Caller,
    ) -> Result<Inode> {
        check_new_name(name)?;
        self.ensure_listed(dir).await?;
        let _changing = self.dir_locks.lock(&[dir]).await;
        let g = self.dir_guard(dir, Mode::Write).await?;
        let dir_inode = g.inode();
        self.check_change(&dir_inode).await?;
        crate::flags::may_add(&dir_inode)?;
        self.permit_under(&g, &dir_inode, caller, W_OK | X_OK)
            .await?;
        if let Some(e) = self.entry_in(&g, name).await? {
            if exclusive {
                return Err(Error::new(ErrorCode::Exists, "name exists"));
            }
            drop(g);
            return self.do_getattr(e.child.id).await;
        }
        let mut attr = attr_of(&dir_inode);
        self.check_quota(attr.uid, attr.gid, Charge::Inode).await?;
        let xattrs = self.inherit(&g, &dir_inode, &mut attr, caller).await?;
        let kind = attr.kind;
        let mut g = g;
        if self.config.names_behind
            && dir_inode.home.is_none()
            && !self.inode_limited(attr.uid, attr.gid)
        {
            if let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) {
                if let Some(id) = self.reserved_id() {
                    match me
                        .create_reserved(g, name, id, &attr, target.as_deref(), &xattrs)
                        .await
                    {
                        Ok(inode) => return Ok(inode),
                        Err(back) => g = back,
                    }
                }
            }
        }
        let (inode, fence) = self
            .create_inode(Request::CreateInode {
                parent: dir,
                attr,
                target,
                home: dir_inode.home.as_ref().map(|l| l.binding),
                op: self.pool.next_op(),
                xattrs: xattrs.clone(),
            })
            .await?;
        self.leases
            .install_granted(Mode::Write, inode.clone(), fence, xattrs);
        let me = self.me.get().and_then(std::sync::Weak::upgrade);
        if let Some(me) = me.filter(|_| self.config.names_behind && dir_inode.home.is_none()) {
            me.link_later(g, name, &inode, None).await;
            return Ok(inode);
        }
        let linked = self
            .dir_call(
                &g,
                Request::Link {
                    dir: g.handle(),
                    name: name.to_vec(),
                    child: inode.handle(),
                    kind,
                    replace: None,
                    op: 0,
                },
            )
            .await;
        let reply = match linked {
            Ok(r) => r,
            Err(e) => {
                // Nothing names the new inode; remove it (fsck would otherwise).
                self.remove_unnamed(&inode).await;
                if e.code == ErrorCode::Exists && !exclusive {
                    // Made by another client after this one's write lease
                    // was lost on the way (requests of this client wait for
                    // each other: `dir_locks`): O_CREAT without O_EXCL opens
                    // that one.
                    if let Some(found) = self.server_entry(&g, name).await? {
                        g.entry
                            .state
                            .lock()
                            .names
                            .insert(name.to_vec(), Some(found.clone()));
                        drop(g);
                        return self.do_getattr(found.child.id).await;
                    }
                }
                return Err(e);
            }
        };
        let entry = DirEntry {
            name: name.to_vec(),
            child: inode.handle(),
            kind,
            cookie: 0,
        };
        Self::dir_changed(&g, reply, name, Some(entry))?;
        Ok(inode)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn do_create(
        &self,
        dir: FileId,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        exclusive: bool,
        caller: &Caller,
    ) -> Result<Inode> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(Error::new(ErrorCode::Invalid, "use mkdir or symlink"));
        }
        let i = self
            .make(
                dir,
                name,
                |d| Self::new_attr(kind, mode, rdev, d, caller),
                None,
                exclusive,
                caller,
            )
            .await?;
        if i.attr.kind == FileKind::Dir {
            return Err(Error::new(ErrorCode::IsDir, "name is a directory"));
        }
        Ok(i)
    }

    pub(crate) async fn do_mkdir(
        &self,
        dir: FileId,
        name: &[u8],
        mode: u32,
        caller: &Caller,
    ) -> Result<Inode> {
        self.make(
            dir,
            name,
            |d| Self::new_attr(FileKind::Dir, mode, 0, d, caller),
            None,
            true,
            caller,
        )
        .await
    }

    pub(crate) async fn do_symlink(
        &self,
        dir: FileId,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> Result<Inode> {
        if target.is_empty() || target.len() > MAX_SYMLINK_LEN || target.contains(&0) {
            return Err(Error::new(ErrorCode::Invalid, "bad symlink target"));
        }
        let len = target.len() as u64;
        self.make(
            dir,
            name,
            |d| {
                let mut a = Self::new_attr(FileKind::Symlink, 0o777, 0, d, caller);
                a.size = len;
                a
            },
            Some(target.to_vec()),
            true,
            caller,
        )
        .await
    }

    pub(crate) async fn do_link(
        &self,
        id: FileId,
        new_dir: FileId,
        new_name: &[u8],
        caller: &Caller,
    ) -> Result<Inode> {
        check_new_name(new_name)?;
        // Its link count, as this client may still be changing it.
        self.deferred.settled(id).await;
        self.ensure_listed(new_dir).await?;
        let child = self.leases.handle(id)?;
        let dir = self.leases.handle(new_dir)?;
        let _changing = self.dir_locks.lock(&[new_dir]).await;
        let gs = self.leases.lock_many(&[dir, child]).await?;
        let dg = pick(&gs, new_dir)?;
        let cg = pick(&gs, id)?;
        let d = dg.inode();
        if d.attr.kind != FileKind::Dir {
            return Err(Error::new(ErrorCode::NotDir, "target is not a directory"));
        }
        self.check_change(&d).await?;
        crate::flags::may_add(&d)?;
        let c = self.fresh(cg).await?;
        self.check_change(&c).await?;
        crate::flags::may_name(&c)?;
        check_move(&c, &d, false)?;
        if c.attr.kind == FileKind::Dir {
            return Err(Error::new(ErrorCode::Perm, "hard link to a directory"));
        }
        let relink = c.attr.nlink == 0;
        if relink && !self.may_relink(id) {
            // linkat(2) of a file whose last name is gone.
            return Err(Error::new(ErrorCode::NotFound, "file has no name left"));
        }
        if c.attr.nlink >= 65_000 {
            return Err(Error::new(ErrorCode::TooManyLinks, "too many links"));
        }
        self.permit_under(dg, &d, caller, W_OK | X_OK).await?;
        if self.entry_in(dg, new_name).await?.is_some() {
            return Err(Error::new(ErrorCode::Exists, "name exists"));
        }
        // Count the link before the entry exists (adding: inode first).
        let bumped = self
            .set_inode(
                cg,
                SetAttr {
                    nlink: Some(c.attr.nlink + 1),
                    ctime: Some(Timestamp::now()),
                    ..SetAttr::default()
                },
            )
            .await?;
        let r = self
            .dir_call(
                dg,
                Request::Link {
                    dir,
                    name: new_name.to_vec(),
                    child,
                    kind: c.attr.kind,
                    replace: None,
                    op: 0,
                },
            )
            .await;
        let reply = match r {
            Ok(r) => r,
            Err(e) => {
                let _ = self
                    .set_inode(
                        cg,
                        SetAttr {
                            nlink: Some(c.attr.nlink),
                            ..SetAttr::default()
                        },
                    )
                    .await;
                return Err(e);
            }
        };
        let entry = DirEntry {
            name: new_name.to_vec(),
            child,
            kind: c.attr.kind,
            cookie: 0,
        };
        if relink {
            // Named once, as the kernel allows (`I_LINKABLE` goes too).
            self.linkable.lock().remove(&id);
        }
        Self::dir_changed(dg, reply, new_name, Some(entry))?;
        Ok(bumped)
    }

    /// SetAttr under a held write lease; merges unsaved local size/mtime.
    pub(crate) async fn set_inode(&self, g: &LeaseGuard, set: SetAttr) -> Result<Inode> {
        if g.entry.mode == Mode::Write {
            // The size it stores covers only data the servers have.
            self.drained(&g.entry, self.set_inode_now(g, set)).await
        } else {
            self.set_inode_now(g, set).await
        }
    }

    async fn set_inode_now(&self, g: &LeaseGuard, mut set: SetAttr) -> Result<Inode> {
        let _one_at_a_time = self.leases.store_lock(g.entry.id).await;
        let (h, seq) = {
            let st = g.entry.state.lock();
            if st.dirty {
                set.size.get_or_insert(st.inode.attr.size);
                set.mtime.get_or_insert(st.inode.attr.mtime);
                self.leases.pending_attrs(g.entry.id).fill(&mut set);
            }
            (st.inode.handle(), self.leases.unstored_seq(g.entry.id))
        };
        let chmod = set.mode.is_some();
        let inode = inode_reply(
            self.call_owner(g.entry.id, Request::SetAttr { ino: h, set })
                .await?,
        )?;
        self.leases.stored(&g.entry, inode, seq);
        if chmod {
            // The owner rewrote the access ACL (if any) to the new mode.
            let mut st = g.entry.state.lock();
            let has_acl = st
                .xattrs
                .as_ref()
                .is_some_and(|l| l.iter().any(|x| x.name == morris_proto::acl::ACCESS));
            if has_acl {
                st.xattrs = None;
            }
        }
        Ok(g.inode())
    }

    /// One directory entry of `child` is gone: count its link down at its
    /// owner (`DropLink`). A file left with no name stays as an orphan while
    /// any client has it open (this one first records its own open), and
    /// is reaped a moment later, or at its last close (`reaper.rs`).
    async fn drop_link(&self, cg: &LeaseGuard) -> Result<()> {
        let id = cg.entry.id;
        if self.opens.want_record(id) {
            self.opens.reconcile(id).await?;
        }
        let _one_at_a_time = self.leases.store_lock(id).await;
        let req = Request::DropLink {
            ino: cg.handle(),
            op: self.pool.next_op(),
        };
        let inode = inode_reply(self.call_owner_now(id, req).await?)?;
        let orphan = inode.attr.nlink == 0;
        let h = inode.handle();
        self.leases.refreshed(&cg.entry, inode);
        if orphan {
            self.schedule_reap(h);
        }
        Ok(())
    }

    /// The entry naming a new object, stored after the create has answered
    /// (`deferred.rs`): this client's cached directory has it at once
    /// (with the directory's size and times moved as its owner moves
    /// them), and a task keeps the use `g` of the directory's write lease
    /// until the owner has stored it, so another client that asks for the
    /// directory waits for it. If it never lands (this client lost its
    /// lease and another took the name meanwhile), the new inode is
    /// removed and the file's `fsync` and close fail with `EIO`.
    ///
    /// With `first` (a create with a reserved id: `reserved.rs`), the
    /// task stores the inode first; if that fails, the name is taken back
    /// and the file's `fsync` and close fail with `EIO`.
    async fn link_later(
        self: Arc<Self>,
        g: LeaseGuard,
        name: &[u8],
        inode: &Inode,
        first: Option<reserved::Unstored>,
    ) {
        let (dir, child, kind) = (g.entry.id, inode.handle(), inode.attr.kind);
        let entry = DirEntry {
            name: name.to_vec(),
            child,
            kind,
            cookie: 0,
        };
        apply_entry_change(&g, name, Some(entry), kind);
        let pending = self
            .deferred
            .begin(&[(dir, Step::Entries), (child.id, Step::Named)])
            .await;
        let mut turn = self.deferred.turn(dir, name);
        let req = Request::Link {
            dir: g.handle(),
            name: name.to_vec(),
            child,
            kind,
            replace: None,
            op: self.pool.next_op(),
        };
        let name = name.to_vec();
        let me = self;
        tokio::spawn(async move {
            if let Some(first) = first {
                if let Err(e) = me.store_reserved(first).await {
                    tracing::error!(
                        dir,
                        ino = child.id,
                        name = %String::from_utf8_lossy(&name),
                        error = %e,
                        "a created file's inode was not stored: its name is taken back, its fsync and close fail"
                    );
                    me.name_lost(&g, &name, child.id);
                    return;
                }
            }
            turn.wait().await;
            // (A name in a directory made the same way goes after it.)
            me.created(dir).await;
            let res = entry_changed(me.call_owner_now(dir, req).await);
            drop(turn);
            if let Err(e) = res {
                tracing::error!(
                    dir,
                    ino = child.id,
                    name = %String::from_utf8_lossy(&name),
                    error = %e,
                    "a created file's name was not stored: the file is removed, its fsync and close fail"
                );
                me.name_lost(&g, &name, child.id);
                let _ = me
                    .call_owner_now(
                        child.id,
                        Request::DeleteInode {
                            ino: child,
                            op: me.pool.next_op(),
                        },
                    )
                    .await;
            }
            drop(g);
            drop(pending);
        });
    }

    /// An entry removed after the unlink or rmdir has answered
    /// (`deferred.rs`): this client's cached directory has lost it at once
    /// (with the directory's size, link count and times moved as its owner
    /// moves them), and a task keeps the uses `dg` and `cg` of the
    /// directory's and the object's write leases until the owners have
    /// stored the removal (`Unlink`) and then the link count (`DropLink`),
    /// after any earlier change of the same name.
    async fn unlink_later(
        self: Arc<Self>,
        dg: LeaseGuard,
        cg: LeaseGuard,
        name: &[u8],
        kind: FileKind,
    ) {
        let (dir, child) = (dg.entry.id, cg.entry.id);
        apply_entry_change(&dg, name, None, kind);
        if let Some(inv) = self.leases.invalidator() {
            inv.entry(dir, name);
        }
        let pending = self
            .deferred
            .begin(&[(dir, Step::Entries), (child, Step::Attrs)])
            .await;
        let mut turn = self.deferred.turn(dir, name);
        let req = Request::Unlink {
            dir: dg.handle(),
            name: name.to_vec(),
            expect: Some(child),
            op: self.pool.next_op(),
        };
        let name = name.to_vec();
        let me = self;
        tokio::spawn(async move {
            turn.wait().await;
            let res = entry_changed(me.call_owner_now(dir, req).await);
            drop(turn);
            match res {
                Ok(()) => {
                    drop(dg);
                    me.drop_link_or_log(&cg).await;
                }
                Err(e) => {
                    tracing::error!(
                        dir,
                        ino = child,
                        name = %String::from_utf8_lossy(&name),
                        error = %e,
                        "a removed name was not removed at its directory's server"
                    );
                    forget_name(&dg, &name);
                }
            }
            drop(cg);
            drop(pending);
        });
    }

    /// [`Client::drop_link`] after the caller has its answer, in a task
    /// that keeps the use of `cg`'s lease until the owner has answered
    /// (`deferred.rs`). A failure there is logged: the inode then keeps a
    /// link count one too high, with no entry naming it, until fsck.
    async fn drop_link_later(&self, cg: LeaseGuard) -> Result<()> {
        let pending = self.deferred.begin(&[(cg.entry.id, Step::Attrs)]).await;
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return self.drop_link(&cg).await;
        };
        tokio::spawn(async move {
            me.drop_link_or_log(&cg).await;
            drop(cg);
            drop(pending);
        });
        Ok(())
    }

    /// [`Client::drop_link`] in a deferred step: a failure is logged (the
    /// inode then keeps a link count one too high until fsck).
    async fn drop_link_or_log(&self, cg: &LeaseGuard) {
        if let Err(e) = self.drop_link(cg).await {
            tracing::warn!(
                ino = cg.entry.id,
                error = %e,
                "the link count of a removed entry's inode was not lowered: fsck reclaims it"
            );
        }
    }

    async fn is_empty_dir(&self, g: &LeaseGuard) -> Result<bool> {
        let r = self
            .call_owner(
                g.entry.id,
                Request::ReadDir {
                    dir: g.handle(),
                    cookie: 0,
                    max: 1,
                },
            )
            .await?;
        match r {
            Reply::Entries { entries, .. } => Ok(entries.is_empty()),
            other => Err(unexpected(&other)),
        }
    }

    /// Looks `name` up in `dir` under a short read lease use.
    async fn peek(&self, dir: FileId, name: &[u8]) -> Result<Option<DirEntry>> {
        let g = self.dir_guard(dir, Mode::Read).await?;
        self.entry_in(&g, name).await
    }

    /// Removes an entry (`want_dir`: rmdir semantics).
    pub(crate) async fn do_remove(
        &self,
        dir: FileId,
        name: &[u8],
        want_dir: bool,
        caller: &Caller,
    ) -> Result<()> {
        if want_dir && name == b".." {
            return Err(Error::new(ErrorCode::NotEmpty, "'..'"));
        }
        if !want_dir && (name == b"." || name == b"..") {
            // Directories, as unlink(2) says.
            return Err(Error::new(ErrorCode::IsDir, "'.' and '..' are directories"));
        }
        check_name(name)?;
        self.ensure_listed(dir).await?;
        let dh = self.leases.handle(dir)?;
        let _changing = self.dir_locks.lock(&[dir]).await;
        for _ in 0..RETRIES {
            let Some(e) = self.peek(dir, name).await? else {
                return Err(Error::new(ErrorCode::NotFound, "no such entry"));
            };
            match (want_dir, e.kind == FileKind::Dir) {
                (true, false) => return Err(Error::new(ErrorCode::NotDir, "not a directory")),
                (false, true) => return Err(Error::new(ErrorCode::IsDir, "is a directory")),
                _ => {}
            }
            let gs = match self.leases.lock_many(&[dh, e.child]).await {
                Ok(gs) => gs,
                Err(err) if err.code == ErrorCode::Stale => continue,
                Err(err) => return Err(err),
            };
            let dg = pick(&gs, dir)?;
            let cg = pick(&gs, e.child.id)?;
            // Re-check under the write lease: another client may have changed it.
            match self.entry_in(dg, name).await? {
                Some(now) if now.child == e.child => {}
                _ => continue,
            }
            self.check_change(&dg.inode()).await?;
            let acl = self.acl_under(dg, &dg.inode(), caller).await?;
            check_delete(&dg.inode(), acl.as_ref(), &cg.inode(), caller)?;
            if want_dir && !self.is_empty_dir(cg).await? {
                return Err(Error::new(ErrorCode::NotEmpty, "directory not empty"));
            }
            let me = self.me.get().and_then(std::sync::Weak::upgrade);
            if let Some(me) = me.filter(|_| self.config.names_behind && dg.inode().home.is_none()) {
                let (dg, cg) = take_two(gs, dir, e.child.id)?;
                me.unlink_later(dg, cg, name, e.kind).await;
                return Ok(());
            }
            // Removing: the entry first.
            let reply = self
                .dir_call(
                    dg,
                    Request::Unlink {
                        dir: dh,
                        name: name.to_vec(),
                        expect: Some(e.child.id),
                        op: 0,
                    },
                )
                .await?;
            Self::dir_changed(dg, reply, name, None)?;
            if let Some(inv) = self.leases.invalidator() {
                inv.entry(dir, name);
            }
            // The name is gone for everyone: answer now, and let the
            // inode's link count follow (`deferred.rs`).
            return self.drop_link_later(take(gs, e.child.id)?).await;
        }
        Err(Error::new(
            ErrorCode::Unavailable,
            "directory keeps changing",
        ))
    }

    /// Inode without taking a lease (only for checks that tolerate a race).
    pub(crate) async fn do_getattr_nolease(&self, h: Handle) -> Result<Inode> {
        let i = inode_reply(
            self.call_owner(h.id, Request::GetInode { ino: h.id })
                .await?,
        )?;
        if i.gen != h.gen {
            return Err(Error::new(ErrorCode::Stale, "replaced"));
        }
        Ok(i)
    }

    /// True if `dir` is `anc` or below it. Walks parent pointers without leases:
    /// a concurrent move elsewhere can race this check (as in many distributed
    /// file systems without a global rename lock).
    async fn is_ancestor(&self, anc: FileId, mut dir: FileId) -> Result<bool> {
        for _ in 0..4096 {
            if dir == anc {
                return Ok(true);
            }
            if dir == ROOT_ID || dir == 0 {
                return Ok(false);
            }
            let i = inode_reply(self.call_owner(dir, Request::GetInode { ino: dir }).await?)?;
            dir = i.parent;
        }
        Err(Error::new(ErrorCode::Invalid, "directory tree too deep"))
    }

    pub(crate) async fn do_setattr(
        &self,
        id: FileId,
        set: SetAttr,
        caller: &Caller,
    ) -> Result<Inode> {
        self.deferred.settled(id).await;
        if let Some(size) = set.size {
            // Emptied without fetching home's bytes first, but only by a
            // caller allowed to (checked again under the lease below).
            self.make_local(id, |cur| {
                // (Objects cached from a home have no ACLs.)
                size == 0 && check_setattr(cur, None, &set, caller).is_ok()
            })
            .await?;
        }
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Write).await?;
        if (set.uid.is_some() || set.gid.is_some()) && self.quota_limits_set().await {
            // A caller not allowed the change hears that, not the quota
            // (checked again below, with the rest of the change).
            let cur = self.fresh(&g).await?;
            let acl = self.acl_under(&g, &cur, caller).await?;
            check_setattr(&cur, acl.as_ref(), &set, caller)?;
            self.check_chown_quota(&cur, &set).await?;
        }
        if let Some(inode) = self.set_behind(&g, &set, caller).await? {
            return Ok(inode);
        }
        // Gathered writes land before a truncation (`behind.rs`).
        self.drained(&g.entry, async { Ok(()) }).await?;
        let cur = self.fresh(&g).await?;
        self.check_change(&cur).await?;
        let acl = self.acl_under(&g, &cur, caller).await?;
        let mut set = check_setattr(&cur, acl.as_ref(), &set, caller)?;
        if let Some(size) = set.size {
            match cur.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(Error::new(ErrorCode::IsDir, "truncate a directory")),
                _ => return Err(Error::new(ErrorCode::Invalid, "truncate a special file")),
            }
            if size > morris_proto::MAX_FILE_SIZE {
                return Err(Error::new(ErrorCode::FileTooBig, "size too large"));
            }
            if size < cur.attr.size {
                // Free the data beyond the new end on every server first.
                if self.layout.replicas > 1 {
                    let from = self.layout.block_of(size).0;
                    let fence = g.entry.fence_no();
                    self.to_every_copy_server(&g, from, |_| Request::Truncate { id, size, fence })
                        .await?;
                } else {
                    let fence = Some(g.fence());
                    let calls = (0..self.layout.servers).map(|s| {
                        self.pool.call_fenced(
                            s,
                            Request::Truncate {
                                id,
                                size,
                                fence: g.entry.fence_no(),
                            },
                            Bytes::new(),
                            fence,
                        )
                    });
                    for r in futures::future::join_all(calls).await {
                        r?;
                    }
                }
                g.entry.state.lock().local_writes += 1;
            }
            if set.mtime.is_none() {
                set.mtime = Some(Timestamp::now());
            }
            // Growing leaves a hole, and a file with holes may have lost
            // some: what is on disk now is measured (`st_blocks`).
            if size > 0 && (size > cur.attr.size || cur.alloc.is_some()) && cur.home.is_none() {
                set.alloc = self.leases.measure(id, &cur.stale).await;
            }
            // Our own size wins over the unsaved one.
            g.entry.state.lock().inode.attr.size = size;
        }
        self.set_inode(&g, set).await
    }

    pub(crate) async fn do_readlink(&self, id: FileId) -> Result<Vec<u8>> {
        let i = self.do_getattr(id).await?;
        match (i.attr.kind, i.target) {
            (FileKind::Symlink, Some(t)) => Ok(t),
            _ => Err(Error::new(ErrorCode::Invalid, "not a symlink")),
        }
    }

    pub(crate) async fn do_readdir(
        &self,
        dir: FileId,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let g = self.dir_guard(dir, Mode::Read).await?;
        let max = max.clamp(1, 4096);
        let generation = g.entry.generation;
        let version = g.entry.state.lock().version;
        if let Some(page) = self
            .dir_pages
            .take(dir, cookie, generation, version, max as usize)
        {
            return Ok(page);
        }
        // A directory being listed from home answers an empty page that is
        // not the end while no new name has come for a while: ask again.
        // (Its first page has the owner list it from home, which needs the
        // owner to know the binding.)
        let binding = g.entry.state.lock().inode.home.as_ref().map(|l| l.binding);
        let (entries, eof) = loop {
            let req = Request::ReadDir {
                dir: g.handle(),
                cookie,
                max: max.max(crate::dirpages::PAGE),
            };
            let call = || self.call_owner(g.entry.id, req.clone());
            let r = match binding {
                Some(b) => self.with_binding(b, call).await?,
                None => call().await?,
            };
            match r {
                Reply::Entries { entries, eof } if !entries.is_empty() || eof => {
                    break (entries, eof)
                }
                Reply::Entries { .. } => continue,
                other => return Err(unexpected(&other)),
            }
        };
        for e in &entries {
            self.leases.learn(e.child);
        }
        let mut st = g.entry.state.lock();
        // A listing that runs from cookie 0 to the end under this one lease
        // has seen every name: the cache becomes complete.
        let contiguous = cookie == 0 || st.listed_upto == Some(cookie);
        st.listed_upto = if contiguous {
            entries.last().map(|e| e.cookie).or(Some(cookie))
        } else {
            None
        };
        if st.names.len() + entries.len() > MAX_CACHED_NAMES {
            // Too big to hold whole: stop collecting the listing. (Names the
            // kernel looked up stay: recalls must invalidate them.)
            st.complete = false;
            st.listed_upto = None;
        } else {
            // Names this client changed while the page was on its way are
            // already cached as they are now; the page may predate that.
            st.names.reserve(entries.len());
            for e in &entries {
                if !st.names.contains_key(&e.name) {
                    st.names.insert(e.name.clone(), Some(e.clone()));
                }
            }
            if contiguous && eof {
                st.complete = true;
            }
        }
        drop(st);
        Ok(self
            .dir_pages
            .split(dir, cookie, entries, eof, generation, version, max as usize))
    }

    /// `req` to every server at once, each answer (or why none came within
    /// `wait`: a server down or cut off is not waited for longer).
    pub(crate) async fn ask_every_server(
        &self,
        req: &Request,
        wait: std::time::Duration,
    ) -> Vec<Result<Reply>> {
        let calls = (0..self.layout.servers).map(|s| async move {
            match tokio::time::timeout(
                wait,
                self.pool.call_once(s, req.clone(), Bytes::new(), None),
            )
            .await
            {
                Ok(r) => r.map(|(reply, _)| reply),
                Err(_) => Err(Error::new(
                    ErrorCode::Unavailable,
                    format!("server {s} did not answer {} in time", req.name()),
                )),
            }
        });
        futures::future::join_all(calls).await
    }

    /// Capacity summed over the servers that answer within [`STATFS_WAIT`];
    /// servers that do not (down, cut off) are left out rather than waited
    /// for: `df` must not hang on one lost server (`morris status` names
    /// it). Fails only when none answers.
    pub(crate) async fn do_statfs(&self) -> Result<FsStat> {
        let replies = self.ask_every_server(&Request::Statfs, STATFS_WAIT).await;
        let mut st = FsStat {
            total: 0,
            free: 0,
            avail: 0,
            files: 0,
            files_free: 0,
            block_size: self.layout.unit,
        };
        // Free inodes of the servers' file systems, each disk once; `None`
        // once one does not count them.
        let mut inodes: Option<u64> = Some(0);
        let mut answered = 0;
        let mut last_err = None;
        let mut disks = std::collections::HashSet::new();
        for r in replies {
            match r {
                Ok(Reply::Statfs {
                    total,
                    free,
                    avail,
                    files,
                    inodes_free,
                    disk,
                }) => {
                    // Servers sharing a disk share its space.
                    if disks.insert(disk) {
                        st.total += total;
                        st.free += free;
                        st.avail += avail;
                        inodes = match inodes_free {
                            u64::MAX => None,
                            n => inodes.map(|sum| sum.saturating_add(n)),
                        };
                    }
                    st.files += files;
                    answered += 1;
                }
                Ok(other) => last_err = Some(unexpected(&other)),
                Err(e) => last_err = Some(e),
            }
        }
        if answered == 0 {
            return Err(last_err.unwrap_or_else(|| Error::new(ErrorCode::Unavailable, "no server")));
        }
        if let Some(e) = last_err {
            tracing::debug!(answered, error = %e, "statfs without every server");
        }
        // Every byte is kept `replicas` times.
        let copies = u64::from(self.layout.replicas.max(1));
        st.total /= copies;
        st.free /= copies;
        st.avail /= copies;
        st.files_free = crate::files_free(inodes, st.avail, copies);
        Ok(st)
    }
}
