//! Write-behind: writes of a file kept in the client a moment, so that a
//! `write()` does not wait for a server round trip.
//!
//! A program that writes a few bytes at a time (a log, `tar`'s 10 KiB
//! records, four-byte appends) would otherwise pay one server round trip
//! per `write()`, and one writing 1 MiB at a time would wait for each
//! stripe unit's server before sending the next. Under the file's write
//! lease no other client may read or write the file, so this client may
//! hold bytes back a moment, or send them without waiting for the answer.
//! Per file, one run of contiguous small writes is gathered, and up to
//! [`WINDOW`] bytes of writes are in flight (sent, not yet answered; with
//! copies, their stale-copy records are merged, never replaced, and made
//! one at a time: `copies.rs`):
//!
//! | state | event | next |
//! |---|---|---|
//! | nothing gathered | small write (< [`SMALL_WRITE`]) | gathered `[off, off+len)`; a timer starts |
//! | nothing gathered | large write | in flight |
//! | gathered `[a, b)` | small write at `b`, total ≤ [`MAX_GATHERED`] | gathered `[a, b+len)` |
//! | gathered `[a, b)` | any other write | the run in flight, then the write as from "nothing gathered" |
//! | gathered | run reaches [`MAX_GATHERED`], or the client holds [`MAX_TOTAL`] | in flight |
//! | gathered | [`AGE`] after the run started | in flight (the timer) |
//! | in flight | a new write overlaps it | the new write waits for its answer |
//! | in flight | the file's flights pass [`WINDOW`] bytes, or the client's [`MAX_FLYING`] | the next write waits for the oldest |
//! | any | read, `SEEK_DATA`, `fallocate`, `setattr` not kept (a size, ...) of the file here | everything sent and answered first |
//! | any | `chmod`/`chown`/`utimes` of a regular file ([`Client::set_behind`]) | kept with the size; stored with it, or [`AGE`] later |
//! | attributes kept | an ACL set or removed (`xattrs.rs`) | the kept attributes stored first (the owner sets the mode from the ACL) |
//! | any | close (flush), `fsync`, lease recalled or given up, unmount | everything sent and answered before the size is stored |
//!
//! Each write still moves the cached size and times at once (the kernel
//! and `stat` see them); the owner is told the size only after the data is
//! stored: every store of the size (`Leases::write_back` on close or
//! recall, `set_inode`) runs with the gathered bytes sent, every flight
//! answered and no new write let in ([`Client::drained`]). A send that
//! fails loses the bytes it held (as a kernel's failed writeback does);
//! the error is then returned by every later `write`, close (flush) and
//! `fsync` through each open file of it that was open when it happened,
//! until that open file is released; a later open starts clean. Sticky,
//! not reported once: a close sends a flush for every descriptor closed,
//! including copies a `fork` made and its `exec` closed, and reporting the
//! error once would tell a child that ignores it and not the program that
//! wrote.
//!
//! Lock order: a lease use, then the file's slot; nothing waits for a
//! lease while holding a slot.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use morris_proto::{ErrorCode, FileId};
use parking_lot::Mutex;

use crate::io::OpenFile;
use crate::leases::{Drain, LeaseEntry, LeaseGuard, Mode};
use crate::{Client, Error, Result};

/// Writes shorter than this are gathered; longer ones are sent at once.
pub(crate) const SMALL_WRITE: usize = 128 << 10;
/// Longest run gathered for one file before it is sent.
pub(crate) const MAX_GATHERED: usize = 1 << 20;
/// Most bytes gathered in one client, all files together; past it, writes
/// are sent at once.
pub(crate) const MAX_TOTAL: u64 = 256 << 20;
/// Longest a gathered byte waits for a reason to be sent.
pub(crate) const AGE: Duration = Duration::from_secs(1);
/// Most bytes of one file in flight at once.
pub(crate) const WINDOW: u64 = 8 << 20;
/// Most bytes in flight at once in one client, in KiB (a semaphore's
/// permits).
const MAX_FLYING_KIB: usize = 64 << 10;
/// Times a write, flush or drain takes a lapsed write lease again before
/// it fails.
pub(crate) const RETAKES: u32 = 3;

/// One file's gathered run of bytes.
pub(crate) struct Run {
    start: u64,
    data: BytesMut,
    /// The open file that started the run (its sync bookkeeping).
    writer: Arc<OpenFile>,
    /// Tells this run from a later one (the timer's).
    serial: u64,
    /// [`Behind::total`], which counts `data` until the run is sent or
    /// dropped.
    total: Arc<AtomicU64>,
}

impl Run {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    /// Takes the gathered bytes out (to be sent): no longer counted.
    fn take_data(&mut self) -> Bytes {
        let data = std::mem::take(&mut self.data);
        self.total.fetch_sub(data.len() as u64, Ordering::Relaxed);
        data.freeze()
    }
}

impl Drop for Run {
    /// Bytes dropped unsent (their file removed, or lost) are not counted
    /// any more, whoever drops them.
    fn drop(&mut self) {
        self.total
            .fetch_sub(self.data.len() as u64, Ordering::Relaxed);
    }
}

/// A write sent and not yet answered.
struct Flight {
    start: u64,
    end: u64,
    task: tokio::task::JoinHandle<Result<()>>,
}

/// What a file has in the client and not yet on its servers.
#[derive(Default)]
pub(crate) struct Pending {
    run: Option<Run>,
    flights: std::collections::VecDeque<Flight>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.run.is_none() && self.flights.is_empty()
    }

    fn flying(&self) -> u64 {
        self.flights.iter().map(|f| f.end - f.start).sum()
    }
}

/// A file's slot: what it has pending.
type Slot = Arc<tokio::sync::Mutex<Pending>>;

/// The write-behind state of one client.
pub(crate) struct Behind {
    /// Files with a slot: gathering, in flight, or being drained right now.
    slots: Mutex<HashMap<FileId, Slot>>,
    /// Bytes gathered, all files.
    total: Arc<AtomicU64>,
    serial: AtomicU64,
    /// The latest failed send per file, numbered from [`Behind::errors_now`]
    /// so that open files know whether it happened while they were open.
    errors: Mutex<HashMap<FileId, (u64, Error)>>,
    error_serial: AtomicU64,
    /// KiB in flight, all files.
    flying: Arc<tokio::sync::Semaphore>,
    /// Files with attribute changes kept here whose store is timed
    /// ([`Client::store_attrs_soon`]).
    attr_timers: Mutex<HashSet<FileId>>,
}

impl Default for Behind {
    fn default() -> Self {
        Behind {
            slots: Mutex::default(),
            total: Arc::new(AtomicU64::new(0)),
            serial: AtomicU64::new(0),
            errors: Mutex::default(),
            error_serial: AtomicU64::new(0),
            flying: Arc::new(tokio::sync::Semaphore::new(MAX_FLYING_KIB)),
            attr_timers: Mutex::default(),
        }
    }
}

impl Behind {
    /// Bytes gathered and not sent yet, and KiB in flight (sent, not yet
    /// answered), all files (for metrics).
    pub(crate) fn queued(&self) -> (u64, u64) {
        let flying = MAX_FLYING_KIB.saturating_sub(self.flying.available_permits());
        (self.total.load(Ordering::Relaxed), flying as u64)
    }

    /// Whether `id` may have gathered bytes here.
    pub(crate) fn holds(&self, id: FileId) -> bool {
        self.slots.lock().contains_key(&id)
    }

    fn slot(&self, id: FileId) -> Slot {
        self.slots.lock().entry(id).or_default().clone()
    }

    /// Drops `id`'s slot if it is empty and nobody else has it.
    fn tidy(&self, id: FileId, slot: Slot) {
        let mut slots = self.slots.lock();
        // Two references: the map's and ours. Others clone under this lock.
        if Arc::strong_count(&slot) == 2 && slot.try_lock().is_ok_and(|p| p.is_empty()) {
            slots.remove(&id);
        }
    }

    /// The number of the latest lost write of any file: an open file
    /// records it when it is opened ([`Behind::error_since`]).
    pub(crate) fn errors_now(&self) -> u64 {
        self.error_serial.load(Ordering::Acquire)
    }

    /// The error of the latest lost write of `id`, if it happened after
    /// [`Behind::errors_now`] answered `seen`.
    pub(crate) fn error_since(&self, id: FileId, seen: u64) -> Option<Error> {
        match self.errors.lock().get(&id) {
            Some((n, e)) if *n > seen => Some(e.clone()),
            _ => None,
        }
    }

    /// `id`'s last open file here was released: its lost writes have been
    /// reported to every open file that was open when they happened.
    pub(crate) fn closed(&self, id: FileId) {
        self.errors.lock().remove(&id);
    }

    /// Forgets `id` (removed for good): its gathered bytes go nowhere.
    pub(crate) fn forget(&self, id: FileId) {
        if let Some(slot) = self.slots.lock().remove(&id) {
            // (Else whoever holds it sends or drops the run.)
            if let Ok(mut p) = slot.try_lock() {
                p.run = None;
            }
        }
        self.errors.lock().remove(&id);
    }

    /// Files with something pending.
    fn pending(&self) -> Vec<FileId> {
        self.slots.lock().keys().copied().collect()
    }
}

/// The hook [`crate::leases::Leases`] calls before giving a write lease
/// back.
pub(crate) struct DrainHook(pub std::sync::Weak<Client>);

impl Drain for DrainHook {
    fn drain<'a>(&'a self, entry: &'a Arc<LeaseEntry>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(c) => c.drained(entry, async { Ok(()) }).await,
                None => Ok(()),
            }
        })
    }
}

impl Client {
    /// Writes `data` at `offset` through open file `f` under write lease
    /// `g`: gathered if small, else sent without waiting for the answer
    /// (see the module's table).
    pub(crate) async fn write_behind(
        &self,
        f: &Arc<OpenFile>,
        g: &LeaseGuard,
        offset: u64,
        data: Bytes,
    ) -> Result<u32> {
        if let Some(e) = self.behind.error_since(f.id, f.errors_seen) {
            // An earlier write of this file was lost: say so now (and at
            // close), as an NFS client does.
            return Err(e);
        }
        let len = data.len();
        let end = offset + len as u64;
        let small = len < SMALL_WRITE
            && self.behind.total.load(Ordering::Relaxed) + len as u64 <= MAX_TOTAL;
        let slot = self.behind.slot(f.id);
        let r = {
            let mut p = slot.lock().await;
            self.gather(f, &g.entry, &mut p, offset, data, small).await
        };
        self.behind.tidy(f.id, slot);
        r?;
        self.grew(f, &g.entry, offset, end);
        Ok(len as u32)
    }

    /// The body of [`Client::write_behind`] with the file's slot held.
    async fn gather(
        &self,
        f: &Arc<OpenFile>,
        e: &Arc<LeaseEntry>,
        p: &mut Pending,
        offset: u64,
        data: Bytes,
        small: bool,
    ) -> Result<()> {
        let len = data.len();
        if let Some(r) = p.run.as_mut() {
            if small && r.end() == offset && r.data.len() + len <= MAX_GATHERED {
                r.data.extend_from_slice(&data);
                self.behind.total.fetch_add(len as u64, Ordering::Relaxed);
                f.unsynced_from
                    .fetch_min(self.layout.block_of(offset).0, Ordering::Relaxed);
                if r.data.len() == MAX_GATHERED {
                    return match self.launch_run(e, p).await {
                        // Taken, and kept gathered: sent under the next lease.
                        Err(err) if self.lapsed(&err, e) => Ok(()),
                        r => r,
                    };
                }
                return Ok(());
            }
            self.launch_run(e, p).await?;
        }
        if !small {
            return self.launch(e, p, f.clone(), offset, data).await;
        }
        let serial = self.behind.serial.fetch_add(1, Ordering::Relaxed);
        let mut buf = BytesMut::with_capacity(len.max(4096));
        buf.extend_from_slice(&data);
        self.behind.total.fetch_add(len as u64, Ordering::Relaxed);
        f.unsynced_from
            .fetch_min(self.layout.block_of(offset).0, Ordering::Relaxed);
        p.run = Some(Run {
            start: offset,
            data: buf,
            writer: f.clone(),
            serial,
            total: self.behind.total.clone(),
        });
        self.send_when_old(f.clone(), serial);
        Ok(())
    }

    /// Puts the gathered run (if any) in flight. If that cannot be done
    /// now (an earlier flight failed, or `e` lapsed while it waited for
    /// room), the run stays gathered, for a send under the next lease.
    async fn launch_run(&self, e: &Arc<LeaseEntry>, p: &mut Pending) -> Result<()> {
        let Some((start, end)) = p.run.as_ref().map(|r| (r.start, r.end())) else {
            return Ok(());
        };
        if e.mode != Mode::Write {
            let err = self.no_write_lease(e);
            p.run = None;
            return Err(err);
        }
        let permit = self.room(e, p, start, end).await?;
        self.check_lapsed(e)?;
        let Some(mut r) = p.run.take() else {
            return Ok(());
        };
        let data = r.take_data();
        self.fly(e, p, r.writer.clone(), r.start, data, permit)
    }

    /// The error of bytes written under a lease that is not a write lease
    /// (callers take one first; a read lease's fence is no grant's): they
    /// are lost.
    fn no_write_lease(&self, e: &LeaseEntry) -> Error {
        let err = Error::new(
            ErrorCode::NoLease,
            format!("writes of file {} without a write lease", e.id),
        );
        self.lost(e.id, &err);
        err
    }

    /// `NoLease` if `e` may have passed to another client (its owner has
    /// not answered for a lease time): nothing more is sent under it. The
    /// caller takes the write lease again and retries ([`Client::lapsed`]); bytes
    /// not yet sent are kept.
    fn check_lapsed(&self, e: &LeaseEntry) -> Result<()> {
        let f = e.fence();
        if self.pool.lease_valid(f.owner, f.term) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::NoLease,
            format!(
                "the write lease on file {} lapsed before its writes could be sent; \
                 taking it again",
                e.id
            ),
        ))
    }

    /// True if `err` says that `e` lapsed before what was to be sent under
    /// it was sent: the caller takes the write lease again
    /// ([`Client::retake`]) and retries.
    pub(crate) fn lapsed(&self, err: &Error, e: &LeaseEntry) -> bool {
        err.code == ErrorCode::NoLease && self.check_lapsed(e).is_err()
    }

    /// Whether what failed with `err` under `g` is to be tried again under
    /// a new write lease: `g`'s lapsed before it could send, fewer than
    /// [`RETAKES`] times so far (counted in `tries`). `g` is given up
    /// first, and what is in flight under it landed ([`Client::retake`]).
    pub(crate) async fn again_after_lapse(
        &self,
        g: LeaseGuard,
        err: &Error,
        tries: &mut u32,
    ) -> bool {
        if *tries >= RETAKES || !self.lapsed(err, &g.entry) {
            return false;
        }
        *tries += 1;
        let e = g.entry.clone();
        drop(g);
        self.retake(&e).await;
        true
    }

    /// After [`Client::lapsed`]: waits for the answers of what is in flight
    /// of `e`'s file under it (sent while it held), so that nothing under
    /// the old lease lands after writes under the next.
    async fn retake(&self, e: &LeaseEntry) {
        let slot = self.behind.slot(e.id);
        {
            let mut p = slot.lock().await;
            // Failures are kept for the file's next write, close or fsync.
            let _ = self.land(e.id, &mut p, usize::MAX).await;
        }
        self.behind.tidy(e.id, slot);
        tracing::info!(
            id = e.id,
            "write lease lapsed under pending writes; taking it again"
        );
    }

    /// Sends `data` at `start` under write lease `e` without waiting for the
    /// answer: first waits for room ([`Client::room`]).
    async fn launch(
        &self,
        e: &Arc<LeaseEntry>,
        p: &mut Pending,
        writer: Arc<OpenFile>,
        start: u64,
        data: Bytes,
    ) -> Result<()> {
        if e.mode != Mode::Write {
            return Err(self.no_write_lease(e));
        }
        let end = start + data.len() as u64;
        let permit = self.room(e, p, start, end).await?;
        self.check_lapsed(e)?;
        self.fly(e, p, writer, start, data, permit)
    }

    /// Waits for the flights that `[start, end)` overlaps (their bytes
    /// must land before its own) and for room in the file's and the
    /// client's windows; the client's room is the permit returned.
    async fn room(
        &self,
        e: &Arc<LeaseEntry>,
        p: &mut Pending,
        start: u64,
        end: u64,
    ) -> Result<tokio::sync::OwnedSemaphorePermit> {
        if let Some(last) = p
            .flights
            .iter()
            .rposition(|fl| fl.start < end && start < fl.end)
        {
            self.land(e.id, p, last + 1).await?;
        }
        while !p.flights.is_empty() && p.flying() + (end - start) > WINDOW {
            self.land(e.id, p, 1).await?;
        }
        let len = usize::try_from(end - start).unwrap_or(usize::MAX);
        let kib = u32::try_from(len.div_ceil(1024).clamp(1, MAX_FLYING_KIB)).unwrap_or(u32::MAX);
        self.behind
            .flying
            .clone()
            .acquire_many_owned(kib)
            .await
            .map_err(|_| Error::new(ErrorCode::Io, "client shutting down"))
    }

    /// Puts `data` at `start` in flight under `e`, holding `permit`.
    fn fly(
        &self,
        e: &Arc<LeaseEntry>,
        p: &mut Pending,
        writer: Arc<OpenFile>,
        start: u64,
        data: Bytes,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<()> {
        let end = start + data.len() as u64;
        let me = self
            .me
            .get()
            .and_then(|w| w.upgrade())
            .ok_or_else(|| Error::new(ErrorCode::Io, "client shutting down"))?;
        let entry = e.clone();
        tracing::trace!(id = e.id, start, len = end - start, "write in flight");
        let task = tokio::spawn(async move {
            let r = me.write_or_reap(&writer, &entry, start, data).await;
            drop(permit);
            r
        });
        p.flights.push_back(Flight { start, end, task });
        Ok(())
    }

    /// Waits for the answers of the `n` oldest flights of file `id`; the
    /// first failure is returned (and kept for the file's next write,
    /// close or `fsync`).
    async fn land(&self, id: FileId, p: &mut Pending, n: usize) -> Result<()> {
        let mut first = None;
        for _ in 0..n {
            let Some(fl) = p.flights.pop_front() else {
                break;
            };
            let r = match fl.task.await {
                Ok(r) => r,
                Err(e) => Err(Error::new(ErrorCode::Io, format!("write task failed: {e}"))),
            };
            if let Err(err) = r {
                tracing::warn!(id, offset = fl.start, len = fl.end - fl.start, error = %err, "written bytes lost");
                self.lost(id, &err);
                first = first.or(Some(err));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn lost(&self, id: FileId, err: &Error) {
        let mut errors = self.behind.errors.lock();
        let n = self.behind.error_serial.fetch_add(1, Ordering::AcqRel) + 1;
        errors.insert(id, (n, err.clone()));
    }

    /// Everything pending of `e`'s file sent and answered.
    async fn settle(&self, e: &Arc<LeaseEntry>, p: &mut Pending) -> Result<()> {
        let launched = self.launch_run(e, p).await;
        let landed = self.land(e.id, p, usize::MAX).await;
        launched.and(landed)
    }

    /// Runs `then` with every byte of `e`'s file written here on its
    /// servers, and no new write taken until it is done: what `then`
    /// stores of the size covers only data the servers have.
    pub(crate) async fn drained<T>(
        &self,
        e: &Arc<LeaseEntry>,
        then: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        // A file made with a reserved id: its inode (and the fence number
        // its writes carry) first.
        self.created(e.id).await;
        let slot = self.behind.slot(e.id);
        let r = {
            let mut p = slot.lock().await;
            match self.settle(e, &mut p).await {
                Ok(()) => then.await,
                Err(err) => Err(err),
            }
        };
        self.behind.tidy(e.id, slot);
        r
    }

    /// Sends what is pending of open file `f`'s file, if anything, and
    /// waits for it (a read or a change of it here comes next).
    pub(crate) async fn drain_file(&self, f: &OpenFile) -> Result<()> {
        if !self.behind.holds(f.id) {
            return Ok(());
        }
        let mut tries = 0;
        loop {
            let g = self.leases.get(f.h, Mode::Write).await?;
            match self.drained(&g.entry, async { Ok(()) }).await {
                Err(err) if self.again_after_lapse(g, &err, &mut tries).await => {}
                r => return r,
            }
        }
    }

    /// Sends the run numbered `serial` of `f`'s file once it is [`AGE`]
    /// old, if it is still gathered then.
    fn send_when_old(&self, f: Arc<OpenFile>, serial: u64) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(AGE).await;
            let Some(c) = me.upgrade() else { return };
            let Some(slot) = c.behind.slots.lock().get(&f.id).cloned() else {
                return;
            };
            let gone = slot
                .lock()
                .await
                .run
                .as_ref()
                .is_none_or(|r| r.serial != serial);
            if gone {
                return;
            }
            drop(slot);
            let r = async {
                let g = c.leases.get(f.h, Mode::Write).await?;
                let slot = c.behind.slot(f.id);
                let r = {
                    let mut p = slot.lock().await;
                    if p.run.as_ref().is_some_and(|r| r.serial == serial) {
                        c.settle(&g.entry, &mut p).await
                    } else {
                        Ok(())
                    }
                };
                c.behind.tidy(f.id, slot);
                r
            };
            if let Err(e) = r.await {
                tracing::debug!(id = f.id, error = %e, "gathered writes not sent on time");
            }
        });
    }

    /// `setattr` of a regular file under write lease `g`, kept here
    /// (`ClientConfig::attrs_behind`): mode, owners and times change in the
    /// cached inode at once and are stored with the size — at close,
    /// `fsync`, recall or give-back of the lease, or [`AGE`] later — so a
    /// program that sets owner, mode and times of each file it writes
    /// (`tar`, `cp -p`, `rsync`) pays no request for them. `None` when the
    /// change must be stored now: a size change (data is cut), a directory
    /// or other kind, an object cached from a home (its changes queue for
    /// home), a `chmod` of a file with an access ACL (the owner rewrites
    /// the ACL).
    pub(crate) async fn set_behind(
        &self,
        g: &LeaseGuard,
        set: &morris_proto::SetAttr,
        caller: &crate::Caller,
    ) -> Result<Option<morris_proto::Inode>> {
        if !self.config.attrs_behind
            || g.entry.mode != Mode::Write
            || set.size.is_some()
            || set.alloc.is_some()
            || set.nlink.is_some()
            || set.parent.is_some()
            || set.flags.is_some()
        {
            return Ok(None);
        }
        let cur = self.fresh(g).await?;
        if cur.attr.kind != morris_proto::FileKind::File || cur.home.is_some() {
            return Ok(None);
        }
        let acl = self.acl_under(g, &cur, caller).await?;
        let set = crate::perm::check_setattr(&cur, acl.as_ref(), set, caller)?;
        if set.mode.is_some() {
            let list = self.xattrs_under(g).await?;
            if list.iter().any(|x| x.name == morris_proto::acl::ACCESS) {
                return Ok(None);
            }
        }
        let attrs = crate::leases::PendingAttrs {
            mode: set.mode,
            uid: set.uid,
            gid: set.gid,
            atime: set.atime,
        };
        {
            let mut st = g.entry.state.lock();
            if let Some(t) = set.mtime {
                st.inode.attr.mtime = t;
            }
            st.inode.attr.ctime = set.ctime.unwrap_or_else(morris_proto::Timestamp::now);
            self.leases.local_attrs(g.entry.id, &mut st, attrs);
        }
        self.store_attrs_soon(g.entry.state.lock().inode.handle());
        Ok(Some(g.inode()))
    }

    /// Stores `h`'s changes kept here [`AGE`] from now, if they are still
    /// kept then (one timer per file at a time).
    fn store_attrs_soon(&self, h: morris_proto::Handle) {
        if !self.behind.attr_timers.lock().insert(h.id) {
            return;
        }
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(AGE).await;
            let Some(c) = me.upgrade() else { return };
            c.behind.attr_timers.lock().remove(&h.id);
            if !c.leases.has_unstored(h.id) {
                return;
            }
            let r = async {
                let g = c.leases.get(h, Mode::Write).await?;
                c.drained(&g.entry, c.leases.write_back(&g.entry)).await
            };
            if let Err(e) = r.await {
                tracing::debug!(id = h.id, error = %e, "attribute changes not stored on time");
            }
        });
    }

    /// Sends everything pending in this client and waits for it (unmount).
    pub(crate) async fn drain_all(&self) {
        for id in self.behind.pending() {
            let r = async {
                let h = self.leases.handle(id)?;
                let g = self.leases.get(h, Mode::Write).await?;
                self.drained(&g.entry, async { Ok(()) }).await
            };
            if let Err(e) = r.await {
                tracing::warn!(id, error = %e, "written bytes not sent at unmount");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(b: &Behind, id: FileId, bytes: &[u8]) -> Run {
        b.total.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Run {
            start: 0,
            data: BytesMut::from(bytes),
            writer: OpenFile::for_test(id),
            serial: 0,
            total: b.total.clone(),
        }
    }

    #[tokio::test]
    async fn a_removed_files_gathered_bytes_stop_counting_whoever_holds_them() {
        let b = Behind::default();
        // Forgotten while nobody holds its slot: dropped at once.
        let slot = b.slot(1);
        slot.lock().await.run = Some(run_of(&b, 1, b"abcd"));
        drop(slot);
        b.forget(1);
        assert_eq!(b.total.load(Ordering::Relaxed), 0);
        // Forgotten while a writer holds its slot: dropped with the slot.
        let slot = b.slot(2);
        let mut p = slot.lock().await;
        p.run = Some(run_of(&b, 2, b"efgh"));
        b.forget(2);
        assert_eq!(b.total.load(Ordering::Relaxed), 4);
        drop(p);
        drop(slot);
        assert_eq!(b.total.load(Ordering::Relaxed), 0);
        // Sent: counted no more, and not twice.
        let slot = b.slot(3);
        let mut p = slot.lock().await;
        p.run = Some(run_of(&b, 3, b"ijkl"));
        let mut r = p.run.take().unwrap();
        assert_eq!(&r.take_data()[..], b"ijkl");
        drop(r);
        assert_eq!(b.total.load(Ordering::Relaxed), 0);
    }
}
