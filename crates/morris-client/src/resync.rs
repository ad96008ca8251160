//! Bringing a server's stale copies back up to date.
//!
//! Run by (or for) the server whose copies missed changes while it was down
//! or cut off (`copies.rs` records them at each file's owner). One pass
//! lists every record naming the server at every owner and, per file:
//!
//! * takes the file's **read lease** (no writer can change the file while
//!   it is held; readers carry on);
//! * frees the server's blocks from the record's `from` on (`Truncate` at
//!   that block's start, so old data past a missed truncate cannot come
//!   back), then copies the non-zero blocks of the next chunk that the
//!   server holds from a current copy, and syncs them;
//! * while the lease is still valid, narrows the record past the chunk
//!   ([`Request::ResyncAdvance`], refused if the record changed since it
//!   was read) — or removes it after the last chunk — and goes on with the
//!   next chunk.
//!
//! A record of a deleted file (`from = 0`, or no inode any more) is settled
//! by deleting the server's blocks of it. Until a record is removed, every
//! reader skips the server for the blocks it covers, so a returning server
//! is never read from before it has caught up.

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use morris_proto::{ErrorCode, FileId, Handle, Inode, Reply, Request, ResyncStatus, StaleCopy};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::leases::Mode;
use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// Blocks copied under one hold of a file's read lease: bounds how long a
/// writer waiting for the file waits behind the resync.
const CHUNK_BLOCKS: u64 = 32;

/// The pace of resync and rebuild copies: at most so many bytes a second
/// (`ClientConfig::copy_rate`), counted in KiB, with a burst of a tenth of
/// a second's worth (one stripe unit at least); none without a limit.
pub(crate) struct CopyPace(Option<governor::DefaultDirectRateLimiter>);

impl CopyPace {
    /// A pace of `rate` bytes a second (0: none) for copies of at most
    /// `unit` bytes.
    pub(crate) fn new(rate: u64, unit: u32) -> CopyPace {
        let kib = |b: u64| u32::try_from(b.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        CopyPace(
            std::num::NonZeroU32::new(if rate == 0 { 0 } else { kib(rate) }).map(|per_sec| {
                let burst = std::num::NonZeroU32::new(kib(u64::from(unit)).max(per_sec.get() / 10))
                    .unwrap_or(per_sec);
                governor::RateLimiter::direct(
                    governor::Quota::per_second(per_sec).allow_burst(burst),
                )
            }),
        )
    }

    /// Waits until `bytes` more may be copied.
    async fn take(&self, bytes: u64) {
        let Some(limit) = &self.0 else {
            return;
        };
        let n = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let n = std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
        if limit.until_n_ready(n).await.is_err() {
            // More than the burst at once (a unit larger than the one the
            // pace was made for): wait for it a KiB at a time.
            for _ in 0..n.get() {
                limit.until_ready().await;
            }
        }
    }
}
/// Block copies in flight at once.
const PARALLEL: usize = 8;
/// Records asked for per `ScanStale`.
const SCAN_PAGE: u32 = 512;

impl Client {
    /// Runs one resync pass for `server` (see the module docs), reporting
    /// progress in `status`. Returns the number of files caught up; an
    /// owner that cannot be reached leaves its records for the next pass
    /// (reported as an error after the others are done).
    pub async fn resync(&self, server: u32, status: &Mutex<ResyncStatus>) -> Result<u64> {
        let mut records: Vec<(FileId, StaleCopy, Option<Inode>)> = Vec::new();
        let mut first_err: Option<Error> = None;
        for owner in 0..self.layout.servers {
            match self.scan_stale(owner, server).await {
                Ok(mut r) => records.append(&mut r),
                Err(e) => {
                    warn!(owner, error = %e, "cannot list stale copies there; retrying later");
                    first_err = first_err.or(Some(e));
                }
            }
        }
        if records.is_empty() {
            return match first_err {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        info!(
            server,
            files = records.len(),
            "resync: catching up stale copies"
        );
        {
            let mut st = status.lock();
            st.running = true;
            st.files_total = records.len() as u64;
            st.files_done = 0;
            st.bytes_copied = 0;
            st.last_error = None;
        }
        let mut done = 0;
        for (id, rec, inode) in records {
            let r = match inode {
                Some(ino) if rec.from > 0 => self.resync_file(ino.handle(), server, status).await,
                _ => self.drop_leftover(id, server, rec.seq).await,
            };
            match r {
                Ok(()) => {
                    done += 1;
                    status.lock().files_done += 1;
                }
                Err(e) => {
                    warn!(id, server, error = %e, "resync of a file failed; retrying later");
                    first_err = first_err.or(Some(e));
                }
            }
        }
        self.leases.release_all().await;
        {
            let mut st = status.lock();
            st.running = false;
            st.passes += 1;
            st.last_error = first_err.as_ref().map(|e| e.to_string());
        }
        info!(server, files = done, "resync pass finished");
        match first_err {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Every record naming `server` kept by `owner`.
    async fn scan_stale(
        &self,
        owner: u32,
        server: u32,
    ) -> Result<Vec<(FileId, StaleCopy, Option<Inode>)>> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let req = Request::ScanStale {
                server,
                after,
                max: SCAN_PAGE,
            };
            // Bounded: an owner that is down is retried by the next pass.
            let page = match self.call_bounded(owner, req, Bytes::new(), None).await?.0 {
                Reply::Stale(p) => p,
                other => return Err(unexpected(&other)),
            };
            let Some((last, _, _)) = page.last() else {
                return Ok(out);
            };
            after = *last;
            out.extend(page);
        }
    }

    /// Deletes `server`'s blocks of a deleted file and clears its record.
    async fn drop_leftover(&self, id: FileId, server: u32, seq: u64) -> Result<()> {
        self.call(server, Request::DeleteData { id }).await?;
        self.advance(id, server, seq, None).await
    }

    async fn advance(&self, id: FileId, server: u32, seq: u64, upto: Option<u64>) -> Result<()> {
        let req = Request::ResyncAdvance {
            id,
            server,
            seq,
            upto,
        };
        match self.call_owner(id, req).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Catches `server`'s copies of one file up, chunk by chunk.
    async fn resync_file(
        &self,
        h: Handle,
        server: u32,
        status: &Mutex<ResyncStatus>,
    ) -> Result<()> {
        self.leases.learn(h);
        loop {
            let g = match self.leases.get(h, Mode::Read).await {
                Ok(g) => g,
                // Deleted meanwhile: its record now says "leftover"; the
                // next pass deletes the blocks.
                Err(e) if e.code == ErrorCode::Stale || e.code == ErrorCode::NotFound => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            };
            let ino = g.inode();
            let Some(rec) = ino.stale.iter().find(|r| r.server == server).copied() else {
                return Ok(());
            };
            let size = ino.attr.size;
            let last = if size == 0 {
                0
            } else {
                self.layout.block_of(size - 1).0
            };
            let from = rec.from.max(1);
            let end = from
                .saturating_add(CHUNK_BLOCKS)
                .min(last.saturating_add(1));
            // Old blocks from `from` on go first, so that what the copy
            // skips (holes) reads as zeros there too.
            let cut = self.layout.block_start(from).min(size);
            self.call(
                server,
                Request::Truncate {
                    id: h.id,
                    size: cut,
                    // Resync runs in a server (the volume key) under a
                    // read lease: no write grant to carry.
                    fence: 0,
                },
            )
            .await?;
            let wanted: Vec<(u64, u8)> = (from..end)
                .filter_map(|index| {
                    self.layout
                        .placement(h.id, index)
                        .into_iter()
                        .position(|s| s == server)
                        .map(|r| (index, r as u8))
                })
                .collect();
            let copied = stream::iter(wanted)
                .map(|(index, replica)| self.copy_block(&ino, server, index, replica))
                .buffer_unordered(PARALLEL)
                .collect::<Vec<_>>()
                .await;
            let mut bytes = 0;
            for c in copied {
                bytes += c?;
            }
            self.call(server, Request::Sync { id: Some(h.id) }).await?;
            status.lock().bytes_copied += bytes;
            if !self.leases.still_valid(&g) {
                // A writer may have had the file meanwhile: copy this chunk again.
                debug!(
                    id = h.id,
                    "resync: read lease lapsed during a chunk; repeating it"
                );
                continue;
            }
            let upto = (end <= last).then_some(end);
            match self.advance(h.id, server, rec.seq, upto).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::Stale => {
                    // A newer change was missed meanwhile: read the record again.
                    let fresh = match self
                        .call_owner(h.id, Request::GetInode { ino: h.id })
                        .await?
                    {
                        Reply::Inode(i) => i,
                        other => return Err(unexpected(&other)),
                    };
                    g.entry.state.lock().inode.stale = fresh.stale;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let mut st = g.entry.state.lock();
            match upto {
                None => {
                    st.inode.stale.retain(|r| r.server != server);
                    return Ok(());
                }
                Some(u) => {
                    for r in st.inode.stale.iter_mut().filter(|r| r.server == server) {
                        r.from = r.from.max(u);
                    }
                }
            }
        }
    }

    /// Copies block `index` of `ino` from a current copy to copy `replica`
    /// on `server`, unless it is all zeros (a hole there already). Returns
    /// the bytes written.
    async fn copy_block(&self, ino: &Inode, server: u32, index: u64, replica: u8) -> Result<u64> {
        let start = self.layout.block_start(index);
        let len = (ino.attr.size.saturating_sub(start)).min(u64::from(self.layout.unit)) as u32;
        if len == 0 {
            return Ok(0);
        }
        let sources: Vec<(u8, u32)> =
            crate::replicas::current_copies(&self.layout, &ino.stale, ino.id, index)
                .into_iter()
                .filter(|(_, s)| *s != server)
                .collect();
        if sources.is_empty() {
            return Err(Error::new(
                ErrorCode::Io,
                format!(
                    "block {index} of file {} has no current copy to resync from",
                    ino.id
                ),
            ));
        }
        self.copy_pace.take(u64::from(len)).await;
        let data: Bytes = crate::replicas::fetch_any(
            self.pool.clone(),
            self.loads.clone(),
            sources,
            ino.id,
            index,
            0,
            len,
        )
        .await?;
        if data.iter().all(|b| *b == 0) {
            return Ok(0);
        }
        let req = Request::Write {
            id: ino.id,
            index,
            replica,
            offset: 0,
            sync: false,
            fence: 0,
        };
        self.pool.call(server, req, data).await?;
        Ok(u64::from(len))
    }
}

#[cfg(test)]
mod tests {
    use super::CopyPace;
    use std::time::{Duration, Instant};

    /// At 10 MiB/s, 3 MiB in 64 KiB copies cannot all go in less than the
    /// 0.3 s they are worth, less the first burst (1 MiB); without a rate
    /// they wait for nothing. (A lower bound only: load makes it longer.)
    #[tokio::test]
    async fn copies_wait_for_their_rate() {
        let pace = CopyPace::new(10 << 20, 64 << 10);
        let start = Instant::now();
        for _ in 0..48 {
            pace.take(64 << 10).await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(190),
            "{:?}",
            start.elapsed()
        );
        let free = CopyPace::new(0, 64 << 10);
        assert!(free.0.is_none());
        free.take(u64::MAX).await;
        // A copy bigger than the burst still goes, a KiB at a time.
        let small = CopyPace::new(1 << 30, 4096);
        small.take(200 << 20).await;
    }
}
