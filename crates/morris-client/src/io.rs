//! File data: open files, reads with readahead, writes, flush and fsync.
//!
//! A read holds a use of the file's read (or write) lease, so it needs no lock
//! or inode request: only block requests go out (the paper's 6 messages per
//! READ become 2). While a reader stays sequential its readahead window grows
//! (up to `ClientConfig::readahead_max`), and the next stripe units are fetched
//! from several servers at once. Prefetched data is tagged with the lease it
//! was fetched under and dropped if the lease changes or this client writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use morris_proto::home::HomeRef;
use morris_proto::{
    inode_flags, ErrorCode, FileId, FileKind, Handle, Reply, Request, Timestamp, MAX_FILE_SIZE,
};

/// A block fetch in flight or done; cloneable so a block can serve two reads.
type Fetch = Shared<BoxFuture<'static, Result<Bytes>>>;

use crate::deferred::Step;
use crate::leases::{LeaseEntry, LeaseGuard, Mode};
use crate::pool::{unexpected, Pool};
use crate::{Atime, Client, Error, Result};

/// Where a file's blocks are read from: its stale-copy records, and for a
/// cached file, what a server fetches a missing unit from.
struct Source {
    stale: Vec<morris_proto::StaleCopy>,
    home: Option<Arc<HomeRef>>,
}

/// Per-open-file state.
pub(crate) struct OpenFile {
    pub id: FileId,
    pub h: Handle,
    pub write: bool,
    pub wrote: AtomicBool,
    /// Lowest block written through this handle since its last fsync
    /// (`u64::MAX`: none): where a copy server that cannot sync missed data.
    pub unsynced_from: AtomicU64,
    ra: tokio::sync::Mutex<ReadAhead>,
    /// Lock owners that took locks through this open file (`locks.rs`).
    pub lockers: parking_lot::Mutex<crate::locks::Lockers>,
    /// [`crate::behind::Behind::errors_now`] when it was opened: writes of
    /// the file lost after that are this open file's errors.
    pub errors_seen: u64,
    /// Whether the kernel may keep the pages it cached of the file at this
    /// open ([`Client::open_keeps_cache`]).
    pub keep_cache: bool,
}

#[cfg(test)]
impl OpenFile {
    /// An open file of `id` for unit tests, belonging to no client.
    pub(crate) fn for_test(id: FileId) -> Arc<OpenFile> {
        Arc::new(OpenFile {
            id,
            h: Handle { id, gen: 1 },
            write: true,
            wrote: AtomicBool::new(false),
            unsynced_from: AtomicU64::new(u64::MAX),
            ra: tokio::sync::Mutex::new(ReadAhead::default()),
            lockers: parking_lot::Mutex::new(Default::default()),
            errors_seen: 0,
            keep_cache: false,
        })
    }
}

/// How much of a stream's delivered rate its readahead may keep in flight.
const RA_QUEUE: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Default)]
struct ReadAhead {
    /// (size, mtime, ctime, local write count) of the file version the
    /// prefetched blocks belong to. Not the lease: a lease lost and taken
    /// again (a slow link, a restarted owner) over an unchanged file keeps
    /// its prefetched blocks. ctime is in it because a writer can put mtime
    /// back (`touch -r`, rsync), never ctime.
    tag: (u64, Timestamp, Timestamp, u64),
    /// When the current sequential stream started, and the bytes it has
    /// delivered since: its rate caps the window.
    stream_start: Option<std::time::Instant>,
    stream_bytes: u64,
    /// Where the next sequential read would start.
    next: u64,
    /// Current window in bytes (0: not sequential).
    window: u64,
    /// Consecutive non-sequential reads.
    misses: u32,
    /// Sequential reads since the stream started.
    stream_reads: u32,
    /// Whole blocks being fetched or fetched, by index.
    blocks: BTreeMap<u64, Fetch>,
    /// The furthest block this stream has fetched (read or prefetched):
    /// readahead never fetches at or below it again, so blocks that reads
    /// arriving out of order already consumed are not fetched twice.
    fetched_to: u64,
}

impl ReadAhead {
    /// Whether a read of `[offset, end)` (starting in block `first`)
    /// continues a sequential stream, or starts one.
    ///
    /// Pipelined readers (an NFS client with several READs in flight, FUSE
    /// with several threads) arrive out of order within the window: while
    /// a stream runs, a read landing anywhere in it, or on a block already
    /// being fetched, is still the same stream. With no stream running a
    /// read starts one only if it begins the file or lands within two of
    /// its own lengths of where the last read ended: a random reader's
    /// reads would otherwise often land within the two units a running
    /// stream's slack allows (or near the last block read) and each such
    /// read fetch whole units and the window ahead of them (4 KiB random
    /// reads of a 256 MiB file moved 137 KB each).
    fn is_sequential(&self, offset: u64, end: u64, first: u64, unit: u64) -> bool {
        if offset == 0 || self.blocks.contains_key(&first) {
            return true;
        }
        let streaming = self.window > 0;
        let slack = if streaming {
            self.window.max(2 * unit)
        } else {
            (end - offset).saturating_mul(2)
        };
        let near = self.next > 0
            && offset <= self.next.saturating_add(slack)
            && offset.saturating_add(slack) >= self.next;
        let behind = (slack / unit).max(2);
        let in_stream = streaming
            && self.fetched_to > 0
            && first <= self.fetched_to.saturating_add(1)
            && first.saturating_add(behind + 2) >= self.fetched_to;
        near || in_stream
    }

    /// Takes a read of `[offset, end)` (starting in block `first`) into
    /// the stream's state: a sequential one grows the window (up to
    /// [`ReadAhead::window_cap`] of `max` and `floor`); one that is not
    /// ends a stream of fewer than three reads, and a second in a row ends
    /// any stream. Returns whether it was sequential.
    fn observe(
        &mut self,
        offset: u64,
        end: u64,
        first: u64,
        unit: u64,
        max: u64,
        floor: u64,
    ) -> bool {
        let sequential = self.is_sequential(offset, end, first, unit);
        if sequential {
            self.misses = 0;
            self.stream_reads = self.stream_reads.saturating_add(1);
            if self.stream_start.is_none() {
                self.stream_start = Some(std::time::Instant::now());
            }
            self.stream_bytes += end - offset;
            let cap = self.window_cap(unit, max, floor);
            self.window = (self.window * 2).clamp(2 * unit, cap);
            self.next = self.next.max(end);
        } else {
            self.misses += 1;
            // A stream of one or two reads that a random read follows was
            // most likely random reads landing close by: it ends at once
            // instead of fetching whole units for the next read too.
            if self.misses >= 2 || self.stream_reads < 3 {
                self.window = 0;
                self.clear();
            }
            self.next = end;
            self.fetched_to = 0;
            self.stream_start = None;
            self.stream_bytes = 0;
        }
        sequential
    }

    /// After a read of blocks up to `last`: the blocks the window fetches
    /// ahead of it (none past `last_in_file`, none fetched before), noted
    /// as fetched.
    fn ahead(&mut self, last: u64, last_in_file: u64, unit: u64) -> std::ops::RangeInclusive<u64> {
        self.fetched_to = self.fetched_to.max(last);
        let from = self.fetched_to + 1;
        let stop = if self.window == 0 {
            self.fetched_to
        } else {
            last.saturating_add((self.window / unit).max(1))
                .min(last_in_file)
        };
        self.fetched_to = self.fetched_to.max(stop);
        from..=stop
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.stream_reads = 0;
        self.fetched_to = 0;
        self.stream_start = None;
        self.stream_bytes = 0;
    }

    /// The largest window worth keeping in flight: about `RA_QUEUE` of the
    /// stream's delivered rate, so that on a slow or shared link replies do
    /// not queue for seconds behind prefetched data (at 4 MiB/s a 64 MiB
    /// window is 16 s of queue, longer than a lease). Unlimited (`max`)
    /// once the stream is fast enough.
    /// `floor` units at least (two; for a cached file four per server, since
    /// its first reads each wait for a fetch from home and would otherwise
    /// hold the window small while the rate is being learnt).
    fn window_cap(&self, unit: u64, max: u64, floor: u64) -> u64 {
        let least = floor.max(2) * unit;
        let Some(start) = self.stream_start else {
            return least;
        };
        let secs = start.elapsed().as_secs_f64().max(0.25);
        let cap = (self.stream_bytes as f64 / secs * RA_QUEUE.as_secs_f64()) as u64;
        cap.clamp(least, max.max(least))
    }
}

/// Fetches `len` bytes at `off` of copy `replica` of block `index` from
/// `server`, zero-filling past what the server holds (holes and the block's
/// unwritten tail read as zeros). `once`: no reconnect loop (another copy
/// can serve the read instead). The load the server reports on its reply
/// goes into `loads`, if given.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn fetch_copy(
    pool: &Pool,
    loads: Option<&crate::replicas::Loads>,
    server: u32,
    id: FileId,
    index: u64,
    replica: u8,
    off: u32,
    len: u32,
    once: bool,
    home: Option<&HomeRef>,
) -> Result<Bytes> {
    let req = match home {
        None => Request::Read {
            id,
            index,
            replica,
            offset: off,
            len,
        },
        Some(h) => Request::ReadCached {
            id,
            index,
            replica,
            offset: off,
            len,
            home: h.clone(),
        },
    };
    let (reply, data) = if once {
        pool.call_once(server, req, Bytes::new(), None).await?
    } else {
        pool.call(server, req, Bytes::new()).await?
    };
    let Reply::Data { queue, service_us } = reply else {
        return Err(unexpected(&reply));
    };
    if let Some(l) = loads {
        l.report(server, queue, service_us);
    }
    if data.len() == len as usize {
        return Ok(data);
    }
    if data.len() > len as usize {
        return Err(Error::new(
            ErrorCode::Protocol,
            "server returned more than asked",
        ));
    }
    let mut b = BytesMut::with_capacity(len as usize);
    b.extend_from_slice(&data);
    b.resize(len as usize, 0);
    Ok(b.freeze())
}

impl Client {
    pub(crate) fn open_file(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.files
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| Error::new(ErrorCode::Invalid, format!("bad open-file number {fh}")))
    }

    /// Whether the kernel may keep what it has cached of open file `fh`'s
    /// pages rather than drop them as it opens it (`FOPEN_KEEP_CACHE`):
    /// the file was opened under the same lease grant before, so no other
    /// mount has changed it since the kernel cached them.
    pub fn open_keeps_cache(&self, fh: u64) -> bool {
        self.open_file(fh).is_ok_and(|f| f.keep_cache)
    }

    /// Whether open file `fh` is a cached file (cache mode).
    pub(crate) fn open_file_is_cached(&self, fh: u64) -> bool {
        self.open_file(fh)
            .is_ok_and(|f| morris_proto::home::is_cache_id(f.id))
    }

    pub(crate) async fn do_open(
        &self,
        id: FileId,
        write: bool,
        truncate: bool,
        append: bool,
    ) -> Result<u64> {
        if write {
            self.make_local(id, |_| truncate).await?;
        }
        let h = self.leases.handle(id)?;
        let (empty, record, keep_cache) = {
            let g = self
                .leases
                .get(h, if write { Mode::Write } else { Mode::Read })
                .await?;
            if g.inode().attr.kind == FileKind::Dir && write {
                return Err(Error::new(ErrorCode::IsDir, "open a directory for writing"));
            }
            if write {
                self.check_change(&g.inode()).await?;
                crate::flags::may_write(&g.inode(), append && !truncate)?;
            }
            // Opened to read: reads the kernel serves from its page cache
            // never reach this client, so `relatime` counts the open (as an
            // NFS server counts the uncached READs). The kernel learns a
            // moved access time only when it reads from the mount again
            // (it then asks for the attributes anew): such an open drops
            // the pages it kept.
            let moved = !write && g.inode().attr.kind == FileKind::File && self.relatime(&g);
            // Counted while the lease is in use, so a recall of it (another
            // client about to remove the last name) sees this open.
            let orphan = g.inode().attr.nlink == 0;
            if orphan && !self.orphan_reachable(h) && !self.opened_by_name(h) {
                // Reached through a name another client removed, and not
                // by a lookup of this client a moment ago (a kernel entry
                // not yet invalidated, a handle kept): the kernel looks
                // the name up again on ESTALE and opens what it names now.
                return Err(Error::new(
                    ErrorCode::Stale,
                    format!("file {id} has no name left"),
                ));
            }
            let record = self.opens.open(h, orphan);
            let mut st = g.entry.state.lock();
            // Pages the kernel cached under this very grant are current (a
            // change by another mount recalls the grant first); a
            // truncating open changes them.
            let keep = st.kernel_pages && !truncate && !moved;
            st.kernel_pages = !(write && append);
            let empty = st.inode.attr.size == 0;
            if empty && truncate && write {
                // Truncating an empty file only touches its times: do that
                // under the write lease, stored with the size at close (the
                // common O_CREAT|O_TRUNC of a new file costs no round trip).
                let now = Timestamp::now();
                st.inode.attr.mtime = now;
                st.inode.attr.ctime = now;
                self.leases.local_change(id, &mut st);
            }
            (empty, record, keep)
        };
        if record {
            // Opened through a name that was just removed: the owner must
            // know it is open before anything is read (or it may go).
            if let Err(e) = self.opens.reconcile(id).await {
                self.opens.close(id);
                return Err(e);
            }
        }
        if truncate && write && !empty {
            let r = self
                .do_setattr(
                    id,
                    morris_proto::SetAttr {
                        size: Some(0),
                        ..Default::default()
                    },
                    &crate::Caller::root(),
                )
                .await;
            if let Err(e) = r {
                self.forget_open(h).await;
                return Err(e);
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(
            fh,
            Arc::new(OpenFile {
                id,
                h,
                write,
                wrote: AtomicBool::new(truncate && write),
                unsynced_from: AtomicU64::new(u64::MAX),
                ra: tokio::sync::Mutex::new(ReadAhead::default()),
                lockers: parking_lot::Mutex::new(Default::default()),
                errors_seen: self.behind.errors_now(),
                keep_cache,
            }),
        );
        Ok(fh)
    }

    /// Counts an open of `h` down; at the last close here, forgets its
    /// record at the owner and reaps it if it has no name left.
    async fn forget_open(&self, h: Handle) {
        let closed = self.opens.close(h.id);
        if !closed.last {
            return;
        }
        self.deferred.forget_lost(h.id);
        self.behind.closed(h.id);
        self.linkable.lock().remove(&h.id);
        if closed.recorded {
            if let Err(e) = self.opens.reconcile(h.id).await {
                tracing::warn!(id = h.id, error = %e, "could not forget an open record; it lapses with this client");
            }
        }
        let orphan = self
            .leases
            .cached_inode(h.id)
            .is_some_and(|i| i.attr.nlink == 0);
        if orphan || closed.recorded {
            // Someone removed its last name while it was open (the record
            // was kept for that), or this client did.
            self.schedule_reap(h);
        }
    }

    /// After a read of the object `g` holds a lease on, its access time
    /// moves to now as the mount's [`Atime`] says (`relatime`: if it is not
    /// later than its modification or change time, or is a day old). Sent
    /// in the background without a lease (`TouchAtime`: the owner only
    /// moves it forward); this client sees the new time at once, others
    /// when they next fetch the inode. Returns whether it moved.
    pub(crate) fn relatime(&self, g: &LeaseGuard) -> bool {
        let atime = *self.atime.lock();
        if atime == Atime::Never {
            return false;
        }
        let now = Timestamp::now();
        let h = {
            let mut st = g.entry.state.lock();
            let a = &st.inode.attr;
            if a.flags & inode_flags::NOATIME != 0 {
                // `chattr +A`.
                return false;
            }
            let stale = match atime {
                Atime::Strict => now.secs > a.atime.secs,
                _ => {
                    a.atime <= a.mtime
                        || a.atime <= a.ctime
                        || now.secs.saturating_sub(a.atime.secs) >= 24 * 3600
                }
            };
            if !stale || st.inode.home.is_some() {
                return false;
            }
            st.inode.attr.atime = now;
            if self.leases.pending_attrs(g.entry.id).atime.is_some() {
                // An access time set here and not stored yet (`set_behind`)
                // would put it back when stored: it moves too.
                let moved = crate::leases::PendingAttrs {
                    atime: Some(now),
                    ..Default::default()
                };
                self.leases.local_attrs(g.entry.id, &mut st, moved);
            }
            st.inode.handle()
        };
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return true;
        };
        tokio::spawn(async move {
            let req = Request::TouchAtime { ino: h, atime: now };
            if let Err(e) = me.call_owner(h.id, req).await {
                tracing::debug!(ino = h.id, error = %e, "access time not stored");
            }
        });
        true
    }

    pub(crate) async fn do_read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes> {
        let f = self.open_file(fh)?;
        self.drain_file(&f).await?;
        let g = self.leases.get(f.h, Mode::Read).await?;
        let _ = self.relatime(&g);
        let (file_size, mtime, ctime, local_writes, src) = {
            let st = g.entry.state.lock();
            let a = &st.inode.attr;
            (
                a.size,
                a.mtime,
                a.ctime,
                st.local_writes,
                Source {
                    stale: st.inode.stale.clone(),
                    home: st
                        .inode
                        .home
                        .as_ref()
                        .filter(|l| !l.is_local())
                        .map(|l| Arc::new(crate::cache::home_ref(&st.inode, l))),
                },
            )
        };
        if size == 0 || offset >= file_size {
            return Ok(Bytes::new());
        }
        let end = file_size.min(offset.saturating_add(u64::from(size)));
        let unit = u64::from(self.layout.unit);
        let first = self.layout.block_of(offset).0;
        let last = self.layout.block_of(end - 1).0;
        let last_in_file = self.layout.block_of(file_size - 1).0;
        let block_len = |i: u64| -> u32 {
            let start = self.layout.block_start(i);
            (file_size - start).min(unit) as u32
        };
        // Decide what to fetch under the readahead lock; wait outside it.
        let mut parts: Vec<(u64, u64, Fetch)> = Vec::new();
        {
            let mut ra = f.ra.lock().await;
            let tag = (file_size, mtime, ctime, local_writes);
            if ra.tag != tag {
                ra.clear();
                ra.tag = tag;
            }
            let behind = (ra.window.max(2 * unit) / unit).max(2);
            let floor = if src.home.is_some() {
                4 * u64::from(self.layout.servers)
            } else {
                2
            };
            ra.observe(offset, end, first, unit, self.config.readahead_max, floor);
            // Drop blocks well behind the reader; those just behind may
            // still be wanted by reads that arrive late.
            ra.blocks = ra.blocks.split_off(&first.saturating_sub(behind));
            for i in first..=last {
                let bstart = self.layout.block_start(i);
                let from = offset.max(bstart) - bstart;
                let to = end.min(bstart + unit) - bstart;
                let whole = u64::from(block_len(i));
                if let Some(h) = ra.blocks.get(&i).cloned() {
                    if to >= whole {
                        ra.blocks.remove(&i);
                    }
                    parts.push((from, to, h));
                } else if ra.window > 0 {
                    // Sequential: fetch the whole block (the next read wants the rest).
                    let h = self.spawn_fetch(f.id, i, 0, block_len(i), &src);
                    if to < whole {
                        ra.blocks.insert(i, h.clone());
                    }
                    parts.push((from, to, h));
                } else {
                    // Random: fetch just what was asked.
                    let h = self.spawn_fetch(f.id, i, from as u32, (to - from) as u32, &src);
                    parts.push((0, to - from, h));
                }
            }
            for i in ra.ahead(last, last_in_file, unit) {
                if let std::collections::btree_map::Entry::Vacant(v) = ra.blocks.entry(i) {
                    v.insert(self.spawn_fetch(f.id, i, 0, block_len(i), &src));
                }
            }
        }
        drop(g);
        if parts.len() == 1 {
            let (from, to, h) = parts
                .pop()
                .ok_or_else(|| Error::new(ErrorCode::Io, "no part"))?;
            let data = h.await?;
            return slice(&data, from, to);
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for (from, to, h) in parts {
            let data = h.await?;
            out.extend_from_slice(&slice(&data, from, to)?);
        }
        Ok(out.freeze())
    }

    /// Starts fetching part of a block from a copy that is current under the
    /// file's stale-copy records (`src.stale`); a cached file's block from
    /// its copies in placement order, so that the first copy's server
    /// fetches it from home, once.
    fn spawn_fetch(&self, id: FileId, index: u64, off: u32, len: u32, src: &Source) -> Fetch {
        let pool = self.pool.clone();
        let stale = &src.stale;
        let task = if let Some(home) = src.home.clone() {
            let copies = crate::replicas::current_copies(&self.layout, stale, id, index);
            tokio::spawn(async move {
                let mut last = None;
                let n = copies.len();
                for (i, (r, s)) in copies.into_iter().enumerate() {
                    let once = i + 1 < n;
                    match fetch_copy(&pool, None, s, id, index, r, off, len, once, Some(&home))
                        .await
                    {
                        Ok(d) => return Ok(d),
                        Err(e) if e.code == ErrorCode::Unavailable => last = Some(e),
                        Err(e) => return Err(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    Error::new(
                        ErrorCode::Io,
                        format!("block {index} of file {id} has no current copy"),
                    )
                }))
            })
        } else if self.layout.replicas > 1 {
            let copies = crate::replicas::current_copies(&self.layout, stale, id, index);
            tokio::spawn(crate::replicas::fetch_any(
                pool,
                self.loads.clone(),
                copies,
                id,
                index,
                off,
                len,
            ))
        } else {
            let server = self.layout.block_server(id, index);
            tokio::spawn(async move {
                fetch_copy(&pool, None, server, id, index, 0, off, len, false, None).await
            })
        };
        async move {
            match task.await {
                Ok(r) => r,
                Err(e) => Err(Error::new(ErrorCode::Io, format!("read task failed: {e}"))),
            }
        }
        .boxed()
        .shared()
    }

    pub(crate) async fn do_write(&self, fh: u64, offset: u64, data: Bytes) -> Result<u32> {
        let f = self.open_file(fh)?;
        if !f.write {
            return Err(Error::new(ErrorCode::Invalid, "file not open for writing"));
        }
        let len = data.len() as u64;
        offset
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::new(ErrorCode::FileTooBig, "write past the largest file size"))?;
        if len == 0 {
            return Ok(0);
        }
        let mut tries = 0;
        loop {
            let g = self.leases.get(f.h, Mode::Write).await?;
            let (flags, size, uid, gid) = {
                let a = &g.entry.state.lock().inode.attr;
                (a.flags, a.size, a.uid, a.gid)
            };
            if flags & (inode_flags::IMMUTABLE | inode_flags::APPEND) != 0 {
                // Made so after this open.
                crate::flags::may_write(&g.inode(), false)?;
            }
            if offset + len > size {
                self.check_quota(uid, gid, crate::quota::Charge::Bytes)
                    .await?;
            }
            match self.write_behind(&f, &g, offset, data.clone()).await {
                // The lease lapsed (its owner silent for a lease time: a
                // takeover, a restart) before this write or the bytes
                // gathered before it could be sent: nothing was sent under
                // it; they go under the next one.
                Err(err) if self.again_after_lapse(g, &err, &mut tries).await => {}
                r => return r,
            }
        }
    }

    /// Stores `data` at `offset` on the servers under a held write lease
    /// (`e`); a server out of space first gets the room of the files this
    /// client removed and has not reaped yet (`rm big; write` on a full
    /// volume must work), then the write is tried once more. The inode is
    /// not touched: see [`Client::grew`].
    pub(crate) async fn write_or_reap(
        &self,
        f: &OpenFile,
        e: &LeaseEntry,
        offset: u64,
        data: Bytes,
    ) -> Result<()> {
        let round = self.reap_rounds.load(Ordering::SeqCst);
        match self.store_data(f, e, offset, data.clone()).await {
            Err(err) if err.code == ErrorCode::NoSpace => {
                // Several writes of this client may be out of space at
                // once: one removes the orphans, the others wait for it;
                // all try again if a round of removals ended meanwhile.
                if !self.room_made(round).await {
                    return Err(err);
                }
                self.store_data(f, e, offset, data).await
            }
            r => r,
        }
    }

    /// Writes `data` at the end of the file as this client's write lease
    /// shows it (`O_APPEND`): the offset the kernel computed from its own
    /// cached size may be stale when another mount appended meanwhile, so
    /// it is not used. Appends of one inode here go one at a time, and the
    /// lease is held from reading the size to growing it, so no other
    /// client can write between. Returns where the data went.
    pub(crate) async fn do_append(&self, fh: u64, data: Bytes, expected: u64) -> Result<u64> {
        let f = self.open_file(fh)?;
        if !f.write {
            return Err(Error::new(ErrorCode::Invalid, "file not open for writing"));
        }
        let _one = self.appending[(f.id as usize) % self.appending.len()]
            .lock()
            .await;
        let g = self.leases.get(f.h, Mode::Write).await?;
        let (offset, flags, uid, gid) = {
            let mut st = g.entry.state.lock();
            // Written past the kernel's page cache (`FOPEN_DIRECT_IO`).
            st.kernel_pages = false;
            let a = &st.inode.attr;
            (a.size, a.flags, a.uid, a.gid)
        };
        if flags & inode_flags::IMMUTABLE != 0 {
            crate::flags::may_write(&g.inode(), true)?;
        }
        self.check_quota(uid, gid, crate::quota::Charge::Bytes)
            .await?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::new(
                ErrorCode::FileTooBig,
                "append past the largest file size",
            ));
        }
        tracing::debug!(
            id = f.id,
            offset,
            len = data.len(),
            expected,
            lease = g.entry.generation,
            "append"
        );
        if !data.is_empty() {
            self.write_behind(&f, &g, offset, data).await?;
        }
        if offset != expected {
            // The kernel placed it elsewhere in its own view of the file.
            if let Some(inv) = self.leases.invalidator() {
                inv.inode(f.id);
            }
        }
        Ok(offset)
    }

    /// Sends `data` at `offset` to every server that keeps a part of it,
    /// under write lease `e`.
    async fn store_data(
        &self,
        f: &OpenFile,
        e: &LeaseEntry,
        offset: u64,
        data: Bytes,
    ) -> Result<()> {
        // (Its fence number comes with its inode.)
        self.created(f.id).await;
        let end = offset + data.len() as u64;
        let unit = u64::from(self.layout.unit);
        let mut pieces = Vec::new();
        let mut pos = offset;
        while pos < end {
            let (index, within) = self.layout.block_of(pos);
            let n = (unit - u64::from(within)).min(end - pos);
            pieces.push((
                index,
                within,
                data.slice((pos - offset) as usize..(pos - offset + n) as usize),
            ));
            pos += n;
        }
        if let Some((first, _, _)) = pieces.first() {
            f.unsynced_from.fetch_min(*first, Ordering::Relaxed);
        }
        if self.layout.replicas > 1 {
            // Every current copy before the write is answered; a lost copy
            // server is recorded as stale (copies.rs).
            self.write_copies(e, f.id, pieces).await
        } else {
            let fence = Some(e.fence());
            let calls = pieces.into_iter().map(|(index, within, piece)| {
                self.pool.call_fenced(
                    self.layout.block_server(f.id, index),
                    Request::Write {
                        id: f.id,
                        index,
                        replica: 0,
                        offset: within,
                        sync: false,
                        fence: e.fence_no(),
                    },
                    piece,
                    fence,
                )
            });
            for r in futures::future::join_all(calls).await {
                r?;
            }
            Ok(())
        }
    }

    /// A write through `f` of bytes up to `end` was taken (stored, or
    /// gathered to be): the cached size grows to cover it, and the times
    /// move, as of now. The owner learns them at close or recall, after
    /// the data is stored (ordering rule).
    pub(crate) fn grew(&self, f: &OpenFile, e: &LeaseEntry, start: u64, end: u64) {
        {
            let mut st = e.state.lock();
            if start > st.inode.attr.size && st.inode.alloc.is_none() && st.inode.home.is_none() {
                // A write past the end leaves a hole: what is on disk is
                // measured when the size is stored (`write_back`); until
                // then, what was there.
                st.inode.alloc = Some(st.inode.attr.size.next_multiple_of(4096));
            }
            let now = Timestamp::now();
            st.inode.attr.size = st.inode.attr.size.max(end);
            st.inode.attr.mtime = now;
            st.inode.attr.ctime = now;
            st.local_writes += 1;
            self.leases.local_change(f.id, &mut st);
        }
        f.wrote.store(true, Ordering::Relaxed);
    }

    /// Stores the size and times this client changed (close-to-open). If the
    /// lease they were made under was lost (owner restarted, expired), takes
    /// the write lease again first: a successful close means they are stored.
    /// Writes gathered here are sent first (`behind.rs`); a send of them
    /// that failed while `fh` was open is this flush's error (every
    /// flush's, until `fh` is released).
    pub(crate) async fn do_flush(&self, fh: u64) -> Result<()> {
        let f = self.open_file(fh)?;
        self.check_named(f.id)?;
        let mut tries = 0;
        let stored = loop {
            if !self.leases.has_unstored(f.id) && !self.behind.holds(f.id) {
                break Ok(());
            }
            let g = self.leases.get(f.h, Mode::Write).await?;
            let r = self
                .drained(&g.entry, self.leases.write_back(&g.entry))
                .await;
            match r {
                Err(err) if self.again_after_lapse(g, &err, &mut tries).await => {}
                r => break r,
            }
        };
        match self.behind.error_since(f.id, f.errors_seen) {
            Some(e) => Err(e),
            None => stored,
        }
    }

    /// `EIO` for a file whose create answered but whose name never landed
    /// (`deferred.rs`): what was written to it is gone with it.
    fn check_named(&self, id: FileId) -> Result<()> {
        if self.deferred.is_lost(id) {
            return Err(Error::new(
                ErrorCode::Io,
                format!("file {id} was created but its name could not be stored; it was removed"),
            ));
        }
        Ok(())
    }

    pub(crate) async fn do_fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let f = self.open_file(fh)?;
        // Its link count and, for a file just made, its name, as on a
        // local file system whose fsync commits the create with it.
        self.deferred
            .settled_for(f.id, &[Step::Attrs, Step::Named])
            .await;
        self.do_flush(fh).await?;
        if (f.wrote.load(Ordering::Relaxed) || f.write) && self.layout.replicas > 1 {
            let from = f.unsynced_from.swap(u64::MAX, Ordering::Relaxed);
            let g = self.leases.get(f.h, Mode::Write).await?;
            let r = self
                .to_every_copy_server(&g, from.clamp(1, MAX_FILE_SIZE), |_| Request::Sync {
                    id: Some(f.id),
                })
                .await;
            if r.is_err() {
                f.unsynced_from.fetch_min(from, Ordering::Relaxed);
            }
            r?;
        } else if f.wrote.load(Ordering::Relaxed) || f.write {
            let calls =
                (0..self.layout.servers).map(|s| self.call(s, Request::Sync { id: Some(f.id) }));
            for r in futures::future::join_all(calls).await {
                r?;
            }
        } else if !datasync {
            self.call_owner(f.id, Request::Sync { id: Some(f.id) })
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn do_release(&self, fh: u64) -> Result<()> {
        let flushed = self.do_flush(fh).await;
        let f = self.files.lock().remove(&fh);
        if let Some(f) = f {
            // The last descriptor of this open file is gone: so are the
            // OFD and flock locks taken through it (POSIX ones went at
            // each close's flush).
            let unlocked = self.unlock_all_through(&f).await;
            self.forget_open(f.h).await;
            return flushed.and(unlocked);
        }
        flushed
    }
}

fn slice(data: &Bytes, from: u64, to: u64) -> Result<Bytes> {
    let (from, to) = (from as usize, to as usize);
    if from > to || to > data.len() {
        return Err(Error::new(ErrorCode::Io, "short block"));
    }
    Ok(data.slice(from..to))
}

#[cfg(test)]
mod tests {
    use super::ReadAhead;
    use std::time::{Duration, Instant};

    const MIB: u64 = 1 << 20;

    #[test]
    fn window_follows_the_streams_rate() {
        let mut ra = ReadAhead::default();
        assert_eq!(ra.window_cap(MIB, 64 * MIB, 2), 2 * MIB, "no stream yet");
        // 8 MiB delivered in 2 s: 4 MiB/s, so about 4 MiB in flight.
        ra.stream_start = Instant::now().checked_sub(Duration::from_secs(2));
        ra.stream_bytes = 8 * MIB;
        let cap = ra.window_cap(MIB, 64 * MIB, 2);
        assert!((3 * MIB..=4 * MIB).contains(&cap), "{cap}");
        // A fast stream is held only by the configured maximum.
        ra.stream_bytes = 4096 * MIB;
        assert_eq!(ra.window_cap(MIB, 64 * MIB, 2), 64 * MIB);
        // Never below two units, or the floor asked for (a cached file).
        ra.stream_bytes = 1;
        assert_eq!(ra.window_cap(MIB, 64 * MIB, 2), 2 * MIB);
        assert_eq!(ra.window_cap(MIB, 64 * MIB, 8), 8 * MIB);
    }

    /// Feeds `reads` (offset, length) of a file of `size` bytes in units
    /// of `unit` to a stream; returns how many were taken as sequential
    /// and how many blocks the window fetched ahead.
    fn replay(reads: &[(u64, u64)], size: u64, unit: u64) -> (usize, u64) {
        let mut ra = ReadAhead::default();
        let (mut sequential, mut ahead) = (0, 0);
        let last_in_file = (size - 1) / unit + 1;
        for &(offset, len) in reads {
            let end = offset + len;
            let (first, last) = (offset / unit + 1, (end - 1) / unit + 1);
            if ra.observe(offset, end, first, unit, 64 * MIB, 2) {
                sequential += 1;
            }
            ahead += ra.ahead(last, last_in_file, unit).count() as u64;
        }
        (sequential, ahead)
    }

    #[test]
    fn random_reads_start_no_stream() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let size = 256 * MIB;
        for len in [4096, 128 * 1024, MIB] {
            let reads: Vec<(u64, u64)> = (0..20_000)
                .map(|_| (rng.gen_range(1..size / len) * len, len))
                .collect();
            let (sequential, ahead) = replay(&reads, size, MIB);
            // Before: 2.5 % of 4 KiB ones landed near the last read or its
            // block, each fetching whole units and the window ahead.
            let most = 20_000 * 6 * len / size + 10;
            assert!(
                sequential as u64 <= most,
                "{len}: {sequential} of 20000 taken as sequential"
            );
            assert!(ahead <= 3 * most, "{len}: {ahead} blocks fetched ahead");
        }
    }

    #[test]
    fn sequential_reads_keep_a_stream_even_out_of_order() {
        let size = 64 * MIB;
        let chunk = 128 * 1024;
        // From the start, in order.
        let inorder: Vec<(u64, u64)> = (0..size / chunk).map(|i| (i * chunk, chunk)).collect();
        let (sequential, ahead) = replay(&inorder, size, MIB);
        assert_eq!(sequential, inorder.len());
        assert!(ahead >= 60, "{ahead}");
        // From the middle, pairs swapped (two READs in flight), the first
        // read of the stream alone not sequential.
        let base = 10 * MIB;
        let mut swapped: Vec<(u64, u64)> = (0..64).map(|i| (base + i * chunk, chunk)).collect();
        for p in swapped.chunks_mut(2).skip(1) {
            p.swap(0, 1);
        }
        let (sequential, ahead) = replay(&swapped, size, MIB);
        assert!(
            sequential >= swapped.len() - 1,
            "{sequential} of {}",
            swapped.len()
        );
        assert!(ahead >= 8, "{ahead}");
    }
}
