//! Write-behind: small writes of a file gathered in the client and sent to
//! the servers as one.
//!
//! A program that writes a few bytes at a time (a log, `tar`'s 10 KiB
//! records, four-byte appends) would otherwise pay one server round trip
//! per `write()`. Under the file's write lease no other client may read or
//! write it, so this client may hold the bytes back a moment and send one
//! larger write instead. Per file, one run of contiguous bytes is gathered:
//!
//! | state | event | next |
//! |---|---|---|
//! | nothing gathered | small write (< [`SMALL_WRITE`]) | gathered `[off, off+len)`; a timer starts |
//! | nothing gathered | large write | sent at once |
//! | gathered `[a, b)` | small write at `b`, total ≤ [`MAX_GATHERED`] | gathered `[a, b+len)` |
//! | gathered `[a, b)` | any other write | gathered sent, then the write as from "nothing gathered" |
//! | gathered | run reaches [`MAX_GATHERED`], or the client holds [`MAX_TOTAL`] | sent |
//! | gathered | read, `SEEK_DATA`, `fallocate`, `setattr` of the file here | sent first |
//! | gathered | close (flush), `fsync`, lease recalled or given up, unmount | sent before the size is stored |
//! | gathered | [`AGE`] after the run started | sent by the timer |
//!
//! Each write still moves the cached size and times at once (the kernel
//! and `stat` see them); the owner is told the size only after the data is
//! stored: every store of the size (`Leases::write_back` on close or
//! recall, `set_inode`) runs with the gathered bytes sent and no new ones
//! let in ([`Client::drained`]). A send that fails loses the bytes it held
//! (as a kernel's failed writeback does) and the error is reported by the
//! file's next close or `fsync` here.
//!
//! Lock order: a lease use, then the file's gathering slot; nothing waits
//! for a lease while holding a slot.

use std::collections::HashMap;
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

/// One file's gathered run of bytes.
pub(crate) struct Run {
    start: u64,
    data: BytesMut,
    /// The open file that started the run (its sync bookkeeping).
    writer: Arc<OpenFile>,
    /// Tells this run from a later one (the timer's).
    serial: u64,
}

impl Run {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

/// A file's gathering slot: its run, if any.
type Slot = Arc<tokio::sync::Mutex<Option<Run>>>;

/// The write-behind state of one client.
#[derive(Default)]
pub(crate) struct Behind {
    /// Files with a slot: gathering, or being sent or drained right now.
    slots: Mutex<HashMap<FileId, Slot>>,
    /// Bytes gathered, all files.
    total: AtomicU64,
    serial: AtomicU64,
    /// The first failed send per file, for its next close or `fsync`.
    errors: Mutex<HashMap<FileId, Error>>,
}

impl Behind {
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
        if Arc::strong_count(&slot) == 2 && slot.try_lock().is_ok_and(|r| r.is_none()) {
            slots.remove(&id);
        }
    }

    /// Takes the failure of a send of `id`'s gathered bytes, if one failed.
    pub(crate) fn take_error(&self, id: FileId) -> Option<Error> {
        self.errors.lock().remove(&id)
    }

    /// Forgets `id` (removed for good): its gathered bytes go nowhere.
    pub(crate) fn forget(&self, id: FileId) {
        if let Some(slot) = self.slots.lock().remove(&id) {
            if let Ok(mut r) = slot.try_lock() {
                if let Some(run) = r.take() {
                    self.total
                        .fetch_sub(run.data.len() as u64, Ordering::Relaxed);
                }
            }
        }
        self.errors.lock().remove(&id);
    }

    /// Files with gathered bytes and the handle of an open file of each.
    fn gathering(&self) -> Vec<FileId> {
        self.slots.lock().keys().copied().collect()
    }
}

/// The hook [`crate::leases::Leases`] calls before giving a write lease
/// back.
pub(crate) struct DrainHook(pub std::sync::Weak<Client>);

impl Drain for DrainHook {
    fn drain<'a>(&'a self, entry: &'a LeaseEntry) -> BoxFuture<'a, Result<()>> {
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
    /// `g`: gathered if small (see the module's table), else sent now.
    pub(crate) async fn write_behind(
        &self,
        f: &Arc<OpenFile>,
        g: &LeaseGuard,
        offset: u64,
        data: Bytes,
    ) -> Result<u32> {
        let len = data.len();
        let end = offset + len as u64;
        let small = len < SMALL_WRITE
            && self.behind.total.load(Ordering::Relaxed) + len as u64 <= MAX_TOTAL;
        if !small && !self.behind.holds(f.id) {
            self.write_or_reap(f, &g.entry, offset, data).await?;
            self.grew(f, &g.entry, end);
            return Ok(len as u32);
        }
        let slot = self.behind.slot(f.id);
        let r = {
            let mut run = slot.lock().await;
            self.gather(f, &g.entry, &mut run, offset, data, small)
                .await
        };
        self.behind.tidy(f.id, slot);
        r?;
        self.grew(f, &g.entry, end);
        Ok(len as u32)
    }

    /// The body of [`Client::write_behind`] with the file's slot held.
    async fn gather(
        &self,
        f: &Arc<OpenFile>,
        e: &LeaseEntry,
        run: &mut Option<Run>,
        offset: u64,
        data: Bytes,
        small: bool,
    ) -> Result<()> {
        let len = data.len();
        if let Some(r) = run.as_mut() {
            if small && r.end() == offset && r.data.len() + len <= MAX_GATHERED {
                r.data.extend_from_slice(&data);
                self.behind.total.fetch_add(len as u64, Ordering::Relaxed);
                f.unsynced_from
                    .fetch_min(self.layout.block_of(offset).0, Ordering::Relaxed);
                if r.data.len() == MAX_GATHERED {
                    return self.send_run(e, run).await;
                }
                return Ok(());
            }
            self.send_run(e, run).await?;
        }
        if !small {
            return self.write_or_reap(f, e, offset, data).await;
        }
        let serial = self.behind.serial.fetch_add(1, Ordering::Relaxed);
        let mut buf = BytesMut::with_capacity(len.max(4096));
        buf.extend_from_slice(&data);
        self.behind.total.fetch_add(len as u64, Ordering::Relaxed);
        f.unsynced_from
            .fetch_min(self.layout.block_of(offset).0, Ordering::Relaxed);
        *run = Some(Run {
            start: offset,
            data: buf,
            writer: f.clone(),
            serial,
        });
        self.send_when_old(f.clone(), serial);
        Ok(())
    }

    /// Sends the run in `run` (if any) under write lease `e`; a failure is
    /// also kept for the file's next close or `fsync`.
    async fn send_run(&self, e: &LeaseEntry, run: &mut Option<Run>) -> Result<()> {
        let Some(r) = run.take() else {
            return Ok(());
        };
        let n = r.data.len() as u64;
        self.behind.total.fetch_sub(n, Ordering::Relaxed);
        if e.mode != Mode::Write {
            // Callers take a write lease first; a read lease cannot carry
            // data (its fence is no grant's).
            let err = Error::new(
                ErrorCode::NoLease,
                format!("gathered writes of file {} without a write lease", e.id),
            );
            self.behind.errors.lock().entry(e.id).or_insert(err.clone());
            return Err(err);
        }
        tracing::trace!(
            id = e.id,
            offset = r.start,
            len = n,
            "sending gathered writes"
        );
        let res = self
            .write_or_reap(&r.writer, e, r.start, r.data.freeze())
            .await;
        if let Err(err) = &res {
            tracing::warn!(id = e.id, offset = r.start, len = n, error = %err, "gathered writes lost");
            self.behind.errors.lock().entry(e.id).or_insert(err.clone());
        }
        res
    }

    /// Runs `then` with every byte of `e`'s file gathered here sent, and no
    /// new write gathered until it is done: what `then` stores of the size
    /// covers only data the servers have.
    pub(crate) async fn drained<T>(
        &self,
        e: &LeaseEntry,
        then: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let slot = self.behind.slot(e.id);
        let r = {
            let mut run = slot.lock().await;
            match self.send_run(e, &mut run).await {
                Ok(()) => then.await,
                Err(err) => Err(err),
            }
        };
        self.behind.tidy(e.id, slot);
        r
    }

    /// Sends what is gathered of open file `f`'s file, if anything (a read
    /// or a change of it here comes next).
    pub(crate) async fn drain_file(&self, f: &OpenFile) -> Result<()> {
        if !self.behind.holds(f.id) {
            return Ok(());
        }
        let g = self.leases.get(f.h, Mode::Write).await?;
        self.drained(&g.entry, async { Ok(()) }).await
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
                    let mut run = slot.lock().await;
                    if run.as_ref().is_some_and(|r| r.serial == serial) {
                        c.send_run(&g.entry, &mut run).await
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

    /// Sends everything gathered in this client (unmount).
    pub(crate) async fn drain_all(&self) {
        for id in self.behind.gathering() {
            let Some(slot) = self.behind.slots.lock().get(&id).cloned() else {
                continue;
            };
            let writer = slot.lock().await.as_ref().map(|r| r.writer.clone());
            drop(slot);
            if let Some(f) = writer {
                if let Err(e) = self.drain_file(&f).await {
                    tracing::warn!(id, error = %e, "gathered writes not sent at unmount");
                }
            }
        }
    }
}
