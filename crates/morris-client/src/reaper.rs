//! Removing orphans: inodes whose last name is gone, once nobody has them open.
//!
//! `DropLink` leaves an inode that lost its last name in place (an orphan,
//! `store/orphans.rs` on the server); this module removes it later with
//! `Reap`, which the owner refuses while a live client has it open, and
//! then deletes its data blocks. Two paths:
//!
//! * the client that dropped the last name reaps it [`REAP_DELAY`] later
//!   (or at its last close here): an `open()` that looked the name up just
//!   before it was removed or replaced arrives a moment after the removal,
//!   and must still find the file (POSIX: it opens the old file), not get
//!   `ESTALE` or, worse, a file whose blocks are already gone;
//! * each server's background client ([`Client::reap_orphans`], run with
//!   the resync) reaps orphans of the ranges it serves that are older than
//!   [`ORPHAN_AGE`]: left by a client that died, or kept open by one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use morris_proto::{ErrorCode, FileId, FileKind, Handle, Inode, Reply, Request};
use tracing::{debug, warn};

use crate::pool::unexpected;
use crate::{Client, Result};

/// How long an orphan this client made waits before it reaps it: far
/// longer than an `open()` takes from its lookup to its open, short enough
/// that a removed file's space comes back soon (and a writer here that runs
/// out of space reaps at once, `io.rs`).
pub(crate) const REAP_DELAY: Duration = Duration::from_secs(1);
/// Orphans older than this are reaped by the servers' background clients.
pub const ORPHAN_AGE: Duration = Duration::from_secs(30);
/// Orphans one client reaps at once: a program removing thousands of
/// files must not send each server thousands of `DeleteData` at once
/// (they fill its connection's data slots, and its other requests wait).
pub(crate) const REAPS_AT_ONCE: usize = 16;
/// Orphans asked for per `ScanOrphans`.
const SCAN_PAGE: u32 = 1024;

impl Client {
    /// Reaps `h` after [`REAP_DELAY`], unless it is open here then.
    pub(crate) fn schedule_reap(&self, h: Handle) {
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        if !self.reaps.lock().insert(h) {
            return;
        }
        tokio::spawn(async move {
            tokio::time::sleep(REAP_DELAY).await;
            let Ok(_slot) = me.reaping.acquire().await else {
                return;
            };
            if me.reaps.lock().remove(&h) {
                me.reap_now(h).await;
                // A write out of space waiting for room counts it
                // (`io.rs` `write_or_reap`).
                me.reap_rounds
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }

    /// After a change refused for want of room (`NoSpace`) that began when
    /// `reap_rounds` was `round`: removes this client's orphans still
    /// waiting for their delay and waits for those being removed in the
    /// background; true if a round of removals ended since `round`, so
    /// that trying again may succeed (`rm big; write` or `rm big; touch
    /// new` on a full volume must work, though removal is deferred).
    pub(crate) async fn room_made(&self, round: u64) -> bool {
        let _one_round = self.reap_gate.lock().await;
        if !self.reaps.lock().is_empty() {
            debug!("out of space: removing orphans first");
            self.reap_pending_gated().await;
        }
        let all = u32::try_from(REAPS_AT_ONCE).unwrap_or(u32::MAX);
        drop(self.reaping.acquire_many(all).await);
        self.reap_rounds.load(std::sync::atomic::Ordering::SeqCst) != round
    }

    /// Reaps every orphan waiting for its delay (shutdown).
    pub(crate) async fn reap_pending(&self) {
        let _one_round = self.reap_gate.lock().await;
        self.reap_pending_gated().await;
    }

    /// [`Client::reap_pending`] with `reap_gate` held; counts the round in
    /// `reap_rounds` if it had anything to do.
    pub(crate) async fn reap_pending_gated(&self) {
        let pending: Vec<Handle> = self.reaps.lock().drain().collect();
        if pending.is_empty() {
            return;
        }
        for h in pending {
            self.reap_now(h).await;
        }
        self.reap_rounds
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Asks the owner to remove the orphan `h` and deletes its data if it did.
    /// If it is open here it stays, recorded as open, until its last close.
    pub(crate) async fn reap_now(&self, h: Handle) {
        if self.opens.want_record(h.id) {
            if let Err(e) = self.opens.reconcile(h.id).await {
                warn!(id = h.id, error = %e, "could not record an open orphan");
            }
            return;
        }
        if self.opens.is_open(h.id) {
            return;
        }
        match self.reap(h).await {
            Ok(Some(_)) | Ok(None) => {}
            Err(e) if e.code == ErrorCode::Stale => self.leases.forget(h.id),
            Err(e) => {
                debug!(id = h.id, error = %e, "orphan not reaped; the servers' reaper will")
            }
        }
    }

    /// `Reap`, then the data of a removed file.
    async fn reap(&self, h: Handle) -> Result<Option<Inode>> {
        let req = Request::Reap {
            ino: h,
            op: self.pool.next_op(),
        };
        let gone = match self.call_owner(h.id, req).await? {
            Reply::Reaped(gone) => gone,
            other => return Err(unexpected(&other)),
        };
        if let Some(inode) = &gone {
            self.leases.forget(h.id);
            self.behind.forget(h.id);
            self.delete_blocks(inode).await;
        }
        Ok(gone)
    }

    /// Reaps the orphans that server `server` keeps (the ranges it serves)
    /// and that are older than [`ORPHAN_AGE`] and open nowhere. Returns how
    /// many were removed. For the servers' background client.
    pub async fn reap_orphans(self: &Arc<Self>, server: u32) -> Result<u64> {
        let mut after: FileId = 0;
        let mut removed = 0;
        loop {
            let req = Request::ScanOrphans {
                after,
                max: SCAN_PAGE,
            };
            let page = match self.call(server, req).await? {
                Reply::Orphans(o) => o,
                other => return Err(unexpected(&other)),
            };
            let Some(last) = page.last() else {
                return Ok(removed);
            };
            after = last.inode.id;
            for o in page {
                if o.open || o.age_secs < ORPHAN_AGE.as_secs() {
                    continue;
                }
                match self.reap(o.inode.handle()).await {
                    Ok(Some(i)) => {
                        removed += 1;
                        debug!(id = i.id, kind = ?i.attr.kind, "reaped an old orphan");
                    }
                    Ok(None) => {}
                    Err(e) if e.code == ErrorCode::Stale => {}
                    Err(e) => warn!(id = o.inode.id, error = %e, "cannot reap an orphan"),
                }
            }
        }
    }

    /// Deletes the data blocks of the removed file `inode` on every server
    /// that holds some below its size. A server that misses the delete is
    /// recorded as holding leftovers (its resync removes them); anything
    /// past the size (a writer that died before storing it) is garbage that
    /// fsck reclaims.
    pub(crate) async fn delete_blocks(&self, inode: &Inode) {
        let h = inode.handle();
        let mut servers: Vec<u32> = Vec::new();
        if inode.attr.kind == FileKind::File && inode.attr.size > 0 {
            let last = self.layout.block_of(inode.attr.size - 1).0;
            for i in 1..=last.min(u64::from(self.layout.servers)) {
                for s in self.layout.placement(h.id, i) {
                    if !servers.contains(&s) {
                        servers.push(s);
                    }
                }
            }
        }
        let data = futures::future::join_all(servers.into_iter().map(|s| async move {
            (
                s,
                self.call_bounded(s, Request::DeleteData { id: h.id }, Bytes::new(), None)
                    .await,
            )
        }))
        .await;
        for (server, r) in data {
            if let Err(e) = r {
                warn!(id = h.id, server, error = %e, "could not delete data; leaving it to that server's resync");
                let note = Request::NoteLeftover { id: h.id, server };
                if let Err(e) = self.call_owner(h.id, note).await {
                    warn!(id = h.id, server, error = %e, "could not record leftover data (fsck reports it)");
                }
            }
        }
    }
}
