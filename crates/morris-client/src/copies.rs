//! Changing every copy of a file's blocks while a copy server may be lost
//! (volumes with `replicas > 1`).
//!
//! A write, truncate or fsync goes to every copy that is current. A copy
//! server that cannot be reached, or does not answer within half a lease,
//! has *missed* the change: before the change is answered, the client
//! records that at the inode's owner ([`Request::MarkStale`], under the
//! write lease it already holds), from the lowest block it missed. Readers
//! get the record with the inode and never read those blocks from that
//! server; later writes skip it; its resync (`resync.rs`) copies them back
//! and clears the record. A copy server that answers with an error (a
//! full disk, an I/O error) while another copy took the change is
//! recorded the same way, and the change fails with that error. A change
//! is refused only if a block would be left with no current copy, or the
//! record cannot be stored.
//! See docs/architecture.md ("Mirrored blocks").

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use morris_proto::{ErrorCode, FileId, Reply, Request, StaleCopy};
use tracing::warn;

use morris_proto::layout::Layout;

use crate::leases::{LeaseEntry, LeaseGuard, Mode};
use crate::pool::{unexpected, Fence};
use crate::{Client, Error, Result};

/// Lowest missed block per server.
pub(crate) type Missed = BTreeMap<u32, u64>;

/// Notes that `server` missed block `index` (keeps the lowest).
pub(crate) fn note_missed(missed: &mut Missed, server: u32, index: u64) {
    let e = missed.entry(server).or_insert(index);
    *e = (*e).min(index);
}

/// True if a record in `stale` already covers `server`'s block `index`
/// (nothing needs to reach it there: its resync copies the block).
pub(crate) fn covered(stale: &[StaleCopy], server: u32, index: u64) -> bool {
    stale.iter().any(|r| r.covers(server, index))
}

/// Takes into `fresh` (an owner's answer) the stale-copy records of `kept`
/// (this client's view): per server, the lower first block. Under a write
/// lease the owner's records of the file only grow — a resync clears them
/// under a read lease, which cannot be held meanwhile — so an answer that
/// lacks a record, or starts it higher, is older than one this client
/// already took (writes in flight make `MarkStale`s, and so their answers,
/// overlap), and must not narrow what readers here skip.
pub(crate) fn merge_stale(kept: &[StaleCopy], fresh: &mut Vec<StaleCopy>) {
    for k in kept {
        match fresh.iter_mut().find(|f| f.server == k.server) {
            Some(f) if k.from < f.from => {
                f.from = k.from;
                f.seq = f.seq.max(k.seq);
            }
            Some(_) => {}
            None => fresh.push(*k),
        }
    }
}

/// True if, with the servers in `down` not current, some block of a file
/// would have no current copy left (`replicas` ring neighbours all down).
fn loses_a_block(layout: &Layout, down: &HashSet<u32>) -> bool {
    let k = layout.servers;
    (0..k).any(|start| (0..layout.replicas).all(|r| down.contains(&((start + r) % k))))
}

/// What became of a damaged copy handed to [`Client::repair_damaged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// Recorded stale at the file's owner: resync rewrites it from another
    /// copy, and readers skip it until then.
    Recorded,
    /// The volume keeps one copy: nothing to repair it from.
    NoOtherCopy,
    /// The file no longer exists.
    Gone,
}

impl Client {
    /// Hands a copy that failed its checksum on `server` to resync: file
    /// `id`'s blocks on `server`, from the one held at byte `local_off` of
    /// its extent file on, are recorded stale at the file's owner under the
    /// file's write lease (so every reader learns it before it reads again),
    /// and the server's next resync rewrites them from a current copy.
    pub async fn repair_damaged(&self, id: FileId, server: u32, local_off: u64) -> Result<Repair> {
        if self.layout.replicas < 2 {
            return Ok(Repair::NoOtherCopy);
        }
        // Bytes [s·u, (s+1)·u) of an extent file hold blocks s·k+1 ..= s·k+k.
        let slot = local_off / u64::from(self.layout.unit.max(1));
        let from = slot * u64::from(self.layout.servers) + 1;
        let Some(g) = self.write_lease_of(id).await? else {
            return Ok(Repair::Gone);
        };
        let mut missed = Missed::new();
        note_missed(&mut missed, server, from);
        let r = self.mark_missed(&g.entry, &missed).await;
        drop(g);
        self.leases.release_all().await;
        r.map(|()| Repair::Recorded)
    }

    /// Makes the copies of blocks `from..=to` of file `id` (`to` may be
    /// `u64::MAX`: to the end) equal to each block's first current copy,
    /// under the file's write lease: a writer whose lease was revoked may
    /// have stopped between writing one copy of a block and the next
    /// (`ServerHandle::take_diverged`). Neither version was acknowledged
    /// to the writer's application, so either is right; what matters is
    /// that every reader sees the same one. A range that ends at `u64::MAX`
    /// (the writer truncated) also cuts every copy at the file's size.
    pub async fn reconcile_copies(&self, id: FileId, from: u64, to: u64) -> Result<Repair> {
        if self.layout.replicas < 2 {
            return Ok(Repair::NoOtherCopy);
        }
        let Some(g) = self.write_lease_of(id).await? else {
            return Ok(Repair::Gone);
        };
        if g.inode().attr.kind != morris_proto::FileKind::File {
            drop(g);
            self.leases.release_all().await;
            return Ok(Repair::Gone);
        }
        let r = self.reconcile_under(&g, from, to).await;
        drop(g);
        self.leases.release_all().await;
        r.map(|()| Repair::Recorded)
    }

    /// The write lease on file `id`, known only by its id (resync and
    /// repair learn of files from servers); `None` if it is gone.
    async fn write_lease_of(&self, id: FileId) -> Result<Option<LeaseGuard>> {
        let gone = |e: &Error| matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale);
        let inode = match self.call_owner(id, Request::GetInode { ino: id }).await {
            Ok(Reply::Inode(i)) => i,
            Ok(other) => return Err(unexpected(&other)),
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let h = inode.handle();
        self.leases.learn(h);
        match self.leases.get(h, Mode::Write).await {
            Ok(g) => Ok(Some(g)),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn reconcile_under(&self, g: &LeaseGuard, from: u64, to: u64) -> Result<()> {
        let ino = self.fresh(g).await?;
        let (id, size) = (ino.id, ino.attr.size);
        let unit = u64::from(self.layout.unit);
        self.created(g.entry.id).await;
        let fence = g.entry.fence_no();
        let last = if size == 0 {
            0
        } else {
            self.layout.block_of(size - 1).0
        };
        let mut copied = 0u64;
        for index in from.max(1)..=to.min(last) {
            let copies = crate::replicas::current_copies(&self.layout, &ino.stale, id, index);
            let Some((&first, others)) = copies.split_first() else {
                continue;
            };
            if others.is_empty() {
                continue;
            }
            let start = self.layout.block_start(index);
            let len = size.saturating_sub(start).min(unit) as u32;
            // The first copy, or, if its server cannot answer, any other.
            let fetch = |from: Vec<(u8, u32)>| {
                crate::replicas::fetch_any(
                    self.pool.clone(),
                    self.loads.clone(),
                    from,
                    id,
                    index,
                    0,
                    len,
                )
            };
            let got = match fetch(vec![first]).await {
                Ok(b) => b,
                Err(e) if e.code == ErrorCode::Unavailable => fetch(others.to_vec()).await?,
                Err(e) => return Err(e),
            };
            // What the first copy lacks (a hole, a short extent) reads as
            // zeros: the others must read the same.
            let mut data = got.to_vec();
            data.resize(len as usize, 0);
            // To every current copy, the first too (the same bytes again):
            // a copy that cannot be written is recorded stale, as any copy
            // write that misses is.
            self.write_copies(&g.entry, id, vec![(index, 0, Bytes::from(data))])
                .await?;
            copied += 1;
        }
        if to == u64::MAX {
            let from = self.layout.block_of(size).0;
            self.to_every_copy_server(g, from, |_| Request::Truncate { id, size, fence })
                .await?;
        }
        tracing::info!(
            id,
            from,
            to,
            blocks = copied,
            "copies made equal after a revoked writer"
        );
        Ok(())
    }

    /// Sends `req` to `server` once: no reconnect loop, and an answer within
    /// half a lease. `Unavailable` when it cannot be reached or stays silent,
    /// and at once, without trying, for a while after that happened. For
    /// requests that can do without that server: copy writes (the copy is
    /// then recorded as missed), deletes, choosing where to create an inode.
    pub(crate) async fn call_bounded(
        &self,
        server: u32,
        req: Request,
        payload: Bytes,
        fence: Option<Fence>,
    ) -> Result<(Reply, Bytes)> {
        // A metadata request that gets no answer in time says the server's
        // metadata range is stalled (e.g. waiting for a silent copy), not
        // that its blocks cannot be written: it only sends the next
        // metadata requests of this kind elsewhere for a while.
        let metadata = matches!(req, Request::CreateInode { .. } | Request::ScanStale { .. });
        if self.pool.recently_down(server) || (metadata && self.pool.recently_metadata_slow(server))
        {
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!("server {server} did not answer recently"),
            ));
        }
        // A flush to disk may take long on a busy disk (every server's
        // fsync waits for the same journal) without its server being gone:
        // it gets two lease times before its copies count as missed.
        let limit = if matches!(req, Request::Sync { .. }) {
            self.pool.lease() * 2
        } else {
            self.pool.lease() / 2
        };
        // Two more tries if the connection was closed under the request
        // while the server itself answers (a server that stops trusting its
        // leases closes every session: `lapse_all`); a dead server refuses
        // them at once, a silent one runs into the time limit.
        let attempt = async {
            let mut tries = 0;
            loop {
                tries += 1;
                match self
                    .pool
                    .call_once(server, req.clone(), payload.clone(), fence)
                    .await
                {
                    Err(e) if e.code == ErrorCode::Unavailable && tries < 3 => {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    r => break r,
                }
            }
        };
        let r = match tokio::time::timeout(limit, attempt).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorCode::Unavailable,
                format!("server {server} did not answer within {limit:?}"),
            )),
        };
        if matches!(&r, Err(e) if e.code == ErrorCode::Unavailable) {
            if metadata {
                self.pool.mark_metadata_slow(server);
            } else {
                self.pool.mark_down(server);
            }
        }
        r
    }

    /// Records at the owner of `g`'s file that each server in `missed` missed
    /// blocks from the given index on, and takes the owner's records into the
    /// cached inode. Runs under the write lease, before the change is answered.
    pub(crate) async fn mark_missed(&self, g: &LeaseEntry, missed: &Missed) -> Result<()> {
        if missed.is_empty() {
            return Ok(());
        }
        // Writes of the file in flight together miss servers together: one
        // decides at a time, on the records the others made.
        let _one = g.marking.lock().await;
        let h = g.handle();
        let mut down: HashSet<u32> = missed.keys().copied().collect();
        down.extend(g.state.lock().inode.stale.iter().map(|r| r.server));
        if loses_a_block(&self.layout, &down) {
            // Recording them would leave blocks with no current copy at all:
            // fail the change instead (the volume has lost more than it can
            // stand; the copies keep what they had).
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!(
                    "servers {:?} are unreachable and hold every copy of some blocks of file {}",
                    missed.keys().collect::<Vec<_>>(),
                    h.id
                ),
            ));
        }
        for (&server, &from) in missed {
            warn!(
                id = h.id,
                server,
                from_block = from,
                "copy server missed a change; recording its copies as stale"
            );
            let reply = self
                .call_owner(
                    h.id,
                    Request::MarkStale {
                        ino: h,
                        server,
                        from: from.max(1),
                    },
                )
                .await?;
            let Reply::Inode(inode) = reply else {
                return Err(unexpected(&reply));
            };
            let mut st = g.state.lock();
            let mut stale = inode.stale;
            merge_stale(&st.inode.stale, &mut stale);
            st.inode.stale = stale;
        }
        Ok(())
    }

    /// Writes `pieces` (block index, offset in the block, bytes) of file `id`
    /// to every current copy; records the copies that missed them.
    pub(crate) async fn write_copies(
        &self,
        g: &LeaseEntry,
        id: FileId,
        pieces: Vec<(u64, u32, Bytes)>,
    ) -> Result<()> {
        let stale = g.state.lock().inode.stale.clone();
        let mut calls = Vec::new();
        for (index, within, piece) in &pieces {
            for (replica, server) in self.layout.placement(id, *index).into_iter().enumerate() {
                if covered(&stale, server, *index) {
                    continue;
                }
                let req = Request::Write {
                    id,
                    index: *index,
                    replica: replica as u8,
                    offset: *within,
                    sync: false,
                    fence: g.fence_no(),
                };
                let (index, piece) = (*index, piece.clone());
                let fence = Some(g.fence());
                calls.push(async move {
                    (
                        index,
                        server,
                        self.call_bounded(server, req, piece, fence).await,
                    )
                });
            }
        }
        let results = futures::future::join_all(calls).await;
        let stored: HashSet<u64> = results
            .iter()
            .filter(|(_, _, r)| r.is_ok())
            .map(|(index, _, _)| *index)
            .collect();
        let mut missed = Missed::new();
        let mut failed: Option<Error> = None;
        for (index, server, r) in results {
            match r {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::Unavailable => {
                    tracing::debug!(id, server, index, error = %e, "copy write missed");
                    note_missed(&mut missed, server, index)
                }
                // Fenced: the lease has passed on; nothing may be recorded
                // under it any more.
                Err(e) if e.code == ErrorCode::NoLease => failed = failed.or(Some(e)),
                Err(e) => {
                    if stored.contains(&index) {
                        // Another copy took the block and this one did not
                        // (a full disk, an I/O error): they differ now, so
                        // this one is stale, though the write fails.
                        warn!(id, server, index, error = %e, "copy write failed");
                        note_missed(&mut missed, server, index);
                    }
                    failed = failed.or(Some(e));
                }
            }
        }
        // Copies that took the data while others did not must not be read
        // as equals, even when the write as a whole fails.
        self.mark_missed(g, &missed).await?;
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some((index, _, _)) = pieces.iter().find(|(i, _, _)| !stored.contains(i)) {
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!("no copy of block {index} of file {id} could be written"),
            ));
        }
        Ok(())
    }

    /// Sends `req` (built per server) to every server that holds a current
    /// copy of block `from` or above of `g`'s file; records those that
    /// missed it from block `from`.
    pub(crate) async fn to_every_copy_server(
        &self,
        g: &LeaseGuard,
        from: u64,
        req: impl Fn(u32) -> Request,
    ) -> Result<()> {
        let stale = g.entry.state.lock().inode.stale.clone();
        let servers: Vec<u32> = (0..self.layout.servers)
            .filter(|s| !covered(&stale, *s, from))
            .collect();
        let calls = servers
            .iter()
            .map(|&s| self.call_bounded(s, req(s), Bytes::new(), Some(g.fence())));
        let results = futures::future::join_all(calls).await;
        let some_took = results.iter().any(|r| r.is_ok());
        let mut missed = Missed::new();
        let mut failed: Option<Error> = None;
        for (s, r) in servers.iter().zip(results) {
            match r {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::Unavailable => note_missed(&mut missed, *s, from),
                // Fenced: the lease has passed on; nothing may be recorded
                // under it any more.
                Err(e) if e.code == ErrorCode::NoLease => failed = failed.or(Some(e)),
                Err(e) => {
                    if some_took {
                        // Others took the change, this server did not:
                        // its copies from `from` on are stale.
                        warn!(server = *s, from, error = %e, "copy change failed");
                        note_missed(&mut missed, *s, from);
                    }
                    failed = failed.or(Some(e));
                }
            }
        }
        self.mark_missed(&g.entry, &missed).await?;
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(server: u32, from: u64, seq: u64) -> StaleCopy {
        StaleCopy { server, from, seq }
    }

    #[test]
    fn an_older_answer_never_narrows_the_records_kept() {
        // Kept: server 2 from block 178 (a later answer came first).
        let kept = vec![rec(2, 178, 7), rec(3, 40, 2)];
        // The older answer: server 2 from 226 only.
        let mut fresh = vec![rec(2, 226, 5)];
        merge_stale(&kept, &mut fresh);
        fresh.sort_by_key(|r| r.server);
        assert_eq!(fresh, vec![rec(2, 178, 7), rec(3, 40, 2)]);
        assert!(covered(&fresh, 2, 200), "block 200 of server 2 is stale");
    }

    #[test]
    fn a_newer_answer_widens_what_is_kept() {
        let kept = vec![rec(1, 50, 3)];
        let mut fresh = vec![rec(1, 10, 4), rec(0, 5, 6)];
        merge_stale(&kept, &mut fresh);
        fresh.sort_by_key(|r| r.server);
        assert_eq!(fresh, vec![rec(0, 5, 6), rec(1, 10, 4)]);
    }
}
