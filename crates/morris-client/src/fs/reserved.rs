//! Creates with reserved ids: a mount answers a create without a server
//! round trip.
//!
//! A create is `CreateInode` (the inode's server picks the id) then
//! `Link`. With ids of every server's range set aside ahead (`ids.rs`), a
//! mount that defers entry changes (`ClientConfig::names_behind`) makes
//! the inode itself: it picks the generation, installs the object with
//! its write lease as its owner will grant it, adds the name to its
//! cached directory, and answers. A task then stores the inode
//! (`CreateInodeAt`, which grants the write lease and its fence number)
//! and only then the name (`Link`): inode before entry, as always, so a
//! `kill -9` at any point leaves no name pointing at nothing.
//!
//! Until the inode is stored, nobody else can reach the object (no name
//! and no handle of it has left this client), and everything of this
//! client that would send a request about it waits
//! ([`crate::deferred::Step::Created`]): requests to its owner, block
//! writes (which carry the grant's fence number), a size or attribute
//! change stored, the `Link` of a name made in a new directory. What is
//! answered from the cache (`stat`, lookups, reads of the empty file,
//! writes gathered here) does not wait.

use std::sync::Arc;

use morris_proto::{ErrorCode, FileId, FileKind, Inode, Request, Xattr};

use super::{forget_name, leased_reply};
use crate::deferred::{Pending, Step};
use crate::leases::{LeaseGuard, Mode};
use crate::{Client, Error, Result};

/// A new object whose inode is still to be stored (`CreateInodeAt`).
pub(crate) struct Unstored {
    req: Request,
    /// A use of its write lease: the fence number is set on it.
    cg: LeaseGuard,
    /// Its [`Step::Created`], done once the inode is stored (or not).
    created: Pending,
}

impl Client {
    /// Waits until object `id`'s inode is stored, if it was made with a
    /// reserved id (at once otherwise).
    pub(crate) async fn created(&self, id: FileId) {
        self.deferred.settled_for(id, &[Step::Created]).await;
    }

    /// A reserved id of the next server in turn, if this client holds one
    /// (asking that server for more when they run low). `None`: the create
    /// goes the usual way (`CreateInode`), e.g. while the first batch is
    /// on its way, or the server is slow to answer metadata requests, or
    /// has not answered this client for half a lease time (the lease this
    /// client takes as granted must stay trusted until the inode is
    /// stored; the usual create refreshes that).
    pub(crate) fn reserved_id(&self) -> Option<FileId> {
        // Not on mirrored metadata: a range that moves to its copy while a
        // new object's inode is on its way leaves the lease taken as
        // granted by the wrong server, and taking it again loses the
        // writes gathered under it (`tests/consistency.rs`, a server
        // killed); creates there go the usual way until that is solved.
        if self.layout.replicas > 1 {
            return None;
        }
        let s = self.pick_server();
        // Whoever serves its range now (its copy after a takeover).
        let by = self.pool.range_server(s);
        if self.pool.recently_metadata_slow(by)
            || self.pool.recently_down(by)
            || self.pool.refusing(by)
            || !self.pool.answered_lately(by)
        {
            return None;
        }
        let (id, ask) = self.ids.take(s);
        if ask {
            if let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) {
                tokio::spawn(async move {
                    let req = Request::ReserveIds {
                        count: crate::ids::BATCH,
                    };
                    let got = match me.call(s, req).await {
                        Ok(morris_proto::Reply::Ids(ids)) => Some(ids),
                        Ok(other) => {
                            tracing::warn!(server = s, reply = ?other, "unexpected answer to ReserveIds");
                            None
                        }
                        Err(e) => {
                            tracing::debug!(server = s, error = %e, "no ids reserved");
                            None
                        }
                    };
                    me.ids.asked(s, got);
                });
            } else {
                self.ids.asked(s, None);
            }
        }
        id
    }

    /// Makes a new object named `name` in the directory `g` holds with the
    /// reserved id `id`, and answers it at once: the inode and then the
    /// name are stored by a task (see the module's description). `attr`,
    /// `target` and `xattrs` are as for `CreateInode`, checked already.
    /// Gives `g` back if the new object's lease cannot be used at once
    /// (the caller then creates it the usual way).
    pub(crate) async fn create_reserved(
        self: Arc<Self>,
        g: LeaseGuard,
        name: &[u8],
        id: FileId,
        attr: &morris_proto::Attr,
        target: Option<&[u8]>,
        xattrs: &[Xattr],
    ) -> std::result::Result<Inode, LeaseGuard> {
        let dir = g.entry.id;
        let gen = loop {
            let n = rand::random::<u32>();
            if n != 0 {
                break n;
            }
        };
        // The inode as the server will store it (`create_inode_at`).
        let mut attr = attr.clone();
        let target = target.map(<[u8]>::to_vec);
        let xattrs = xattrs.to_vec();
        attr.mode &= 0o7777;
        let is_dir = attr.kind == FileKind::Dir;
        attr.nlink = if is_dir { 2 } else { 1 };
        attr.size = match (attr.kind, &target) {
            (FileKind::Symlink, Some(t)) => t.len() as u64,
            (FileKind::Dir, _) => 0,
            _ => attr.size,
        };
        let inode = Inode {
            id,
            gen,
            parent: if is_dir { dir } else { 0 },
            attr: attr.clone(),
            target: target.clone(),
            stale: Vec::new(),
            alloc: None,
            home: None,
        };
        let created = self.deferred.begin(&[(id, Step::Created)]).await;
        // As granted by whoever serves the id's range now (a copy after a
        // takeover); its fence number comes with the stored inode.
        let by = self.pool.range_server(self.layout.inode_server(id));
        self.leases
            .install_granted_by(by, Mode::Write, inode.clone(), 0, xattrs.clone());
        let req = Request::CreateInodeAt {
            id,
            gen,
            parent: dir,
            attr,
            target,
            op: self.pool.next_op(),
            xattrs,
        };
        let cg = match self.leases.get(inode.handle(), Mode::Write).await {
            Ok(cg) => cg,
            Err(e) => {
                // (Just installed and trusted: not expected.) Nothing has
                // seen the object: it is forgotten, its id left unused.
                tracing::warn!(ino = id, error = %e, "a new object's lease could not be used; creating it the usual way");
                self.leases.forget(id);
                return Err(g);
            }
        };
        let first = Unstored { req, cg, created };
        self.link_later(g, name, &inode, Some(first)).await;
        Ok(inode)
    }

    /// Stores a new object's inode (`CreateInodeAt`) and records its write
    /// grant's fence number.
    pub(crate) async fn store_reserved(&self, u: Unstored) -> Result<()> {
        let Unstored { req, cg, created } = u;
        let id = cg.entry.id;
        let h = cg.handle();
        let range = self.layout.inode_server(id);
        let call = |req| self.pool.call_range(range, req, bytes::Bytes::new());
        let reply = match call(req).await {
            // Stored by an earlier sending whose answer was lost, and its
            // outcome no longer kept (`store/once.rs`): it is ours if the
            // generation says so.
            Err(e) if e.code == ErrorCode::Exists => call(Request::AcquireWrite { ino: h }).await,
            r => r,
        };
        let stored = reply.and_then(|(by, reply, _)| {
            let (inode, fence) = leased_reply(reply)?;
            if inode.gen != h.gen {
                return Err(Error::new(
                    ErrorCode::Exists,
                    format!("file id {id} is in use by another object"),
                ));
            }
            cg.entry.set_fence_no(fence);
            Ok(by)
        });
        let stored = match stored {
            // The range moved to another copy meanwhile: the lease was
            // taken as granted by the wrong server, whose restarts and
            // silence its trust follows. Taken again on its next use.
            Ok(by) if by != cg.entry.owner => {
                tracing::info!(
                    ino = id,
                    by,
                    "a new object's lease came from another copy; taking it again"
                );
                self.leases.distrust(&cg.entry);
                Ok(())
            }
            r => r.map(|_| ()),
        };
        drop(cg);
        drop(created);
        stored
    }

    /// A created object whose inode or name could not be stored: its name
    /// goes from the cached directory (and the kernel's), and its `fsync`
    /// and close fail with `EIO`.
    pub(crate) fn name_lost(&self, g: &LeaseGuard, name: &[u8], id: FileId) {
        forget_name(g, name);
        self.deferred.mark_lost(id);
        if let Some(inv) = self.leases.invalidator() {
            inv.entry(g.entry.id, name);
        }
    }
}
