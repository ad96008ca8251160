//! Kernel cache invalidation when another client changes what this mount cached.
//!
//! The client library calls [`KernelInvalidator`] from its own tasks (e.g.
//! while handling a lease recall). Telling the kernel may block: invalidating
//! an inode's pages waits for page locks that a FUSE read in flight holds, and
//! that read may be waiting for the very lease being recalled. So the calls
//! only queue a message; one dedicated thread per mount drains the queue into
//! the kernel, never a FUSE worker thread and never a runtime thread.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use std::thread::JoinHandle;

use futures::future::BoxFuture;

use fuser::{INodeNo, Notifier};
use morris_client::{FileId, Invalidator};

/// Where invalidations go: the kernel (through fuser's [`Notifier`]) or a test double.
pub(crate) trait KernelCache: Send + 'static {
    /// Drops the cached attributes and all cached data of `id`.
    fn inval_inode(&self, id: FileId) -> io::Result<()>;
    /// Drops the cached lookup of `name` in `dir` (positive or negative).
    fn inval_entry(&self, dir: FileId, name: &[u8]) -> io::Result<()>;
    /// Makes every cached name invalid at once, without waiting for a lock.
    fn inc_epoch(&self) -> io::Result<()>;
}

impl KernelCache for Notifier {
    fn inval_inode(&self, id: FileId) -> io::Result<()> {
        // Offset 0, length 0: the whole file.
        Notifier::inval_inode(self, INodeNo(id), 0, 0)
    }

    fn inval_entry(&self, dir: FileId, name: &[u8]) -> io::Result<()> {
        Notifier::inval_entry(self, INodeNo(dir), OsStr::from_bytes(name))
    }

    fn inc_epoch(&self) -> io::Result<()> {
        Notifier::inc_epoch(self)
    }
}

/// One queued invalidation.
#[derive(Debug, PartialEq, Eq)]
enum Msg {
    Inode(FileId),
    Entry(FileId, Vec<u8>),
    Stop,
}

/// How far the queue has been delivered: messages are numbered as they are
/// queued, and the thread publishes the number of the last one it handed
/// to the kernel.
#[derive(Debug)]
struct Progress {
    queued: AtomicU64,
    delivered: tokio::sync::watch::Sender<u64>,
}

/// Drops every name the kernel caches (`KernelCache::inc_epoch`), from
/// any thread.
type DropNames = Box<dyn Fn() -> io::Result<()> + Send + Sync>;

/// The client library's invalidation sink for one mount. Never blocks.
pub(crate) struct KernelInvalidator {
    tx: Sender<Msg>,
    progress: Arc<Progress>,
    /// `None`: the kernel cannot drop all names at once (before Linux
    /// 6.16), so it must not be given any to keep.
    drop_names: Option<DropNames>,
    /// Whether the kernel may be given names to keep: `drop_names` works.
    names: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for KernelInvalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelInvalidator")
            .field("progress", &self.progress)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl KernelInvalidator {
    fn send(&self, msg: Msg) {
        // Numbered under the same order as the channel: a flush waits for
        // at least every message queued before it.
        self.progress.queued.fetch_add(1, Ordering::SeqCst);
        // A send fails only once the mount is gone; nothing is cached then.
        if self.tx.send(msg).is_err() {
            self.progress.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Invalidator for KernelInvalidator {
    fn inode(&self, id: FileId) {
        self.send(Msg::Inode(id));
    }

    fn entry(&self, dir: FileId, name: &[u8]) {
        self.send(Msg::Entry(dir, name.to_vec()));
    }

    fn flush(&self, limit: Duration) -> BoxFuture<'static, bool> {
        let target = self.progress.queued.load(Ordering::SeqCst);
        let mut rx = self.progress.delivered.subscribe();
        Box::pin(async move {
            let reached = tokio::time::timeout(limit, rx.wait_for(|d| *d >= target)).await;
            if reached.is_err() {
                tracing::debug!(target, "kernel invalidations still queued; going on");
            }
            reached.is_ok()
        })
    }

    fn all_names(&self) {
        let Some(drop_names) = &self.drop_names else {
            return;
        };
        ::metrics::counter!("morris_fuse_names_dropped_total").increment(1);
        if let Err(e) = drop_names() {
            // Names handed out so far expire with their leases' trust;
            // no more are handed out.
            self.names.store(false, Ordering::SeqCst);
            tracing::warn!(error = %e, "kernel refused to drop its names; names are no longer cached");
        }
    }
}

/// The thread that passes queued invalidations to the kernel.
#[derive(Debug)]
pub(crate) struct Worker {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread; returns the sink to register with the client.
    /// Sets `names` if the kernel can drop all cached names at once (tried
    /// here once: a kernel without `FUSE_NOTIFY_INC_EPOCH` refuses it).
    pub(crate) fn start<K: KernelCache + Clone + Sync>(
        cache: K,
        names: Arc<std::sync::atomic::AtomicBool>,
    ) -> io::Result<(Arc<KernelInvalidator>, Worker)> {
        let drop_names: Option<DropNames> = match cache.inc_epoch() {
            Ok(()) => {
                let c = cache.clone();
                Some(Box::new(move || c.inc_epoch()))
            }
            Err(e) => {
                tracing::info!(error = %e, "the kernel cannot drop all names at once (Linux 6.16 can); it keeps none");
                None
            }
        };
        names.store(drop_names.is_some(), Ordering::SeqCst);
        let (tx, rx) = channel();
        let progress = Arc::new(Progress {
            queued: AtomicU64::new(0),
            delivered: tokio::sync::watch::channel(0).0,
        });
        let p2 = progress.clone();
        let thread = std::thread::Builder::new()
            .name("morris-inval".into())
            .spawn(move || run(&cache, &rx, &p2))?;
        Ok((
            Arc::new(KernelInvalidator {
                tx: tx.clone(),
                progress,
                drop_names,
                names,
            }),
            Worker {
                tx,
                thread: Some(thread),
            },
        ))
    }

    /// Delivers what is queued, then ends the thread and waits for it.
    pub(crate) fn stop(mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("invalidation thread panicked");
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Without joining: the kernel may still be holding the thread.
        if self.thread.is_some() {
            let _ = self.tx.send(Msg::Stop);
        }
    }
}

fn run<K: KernelCache>(cache: &K, rx: &Receiver<Msg>, progress: &Progress) {
    while let Ok(msg) = rx.recv() {
        let (what, id, res) = match &msg {
            Msg::Inode(id) => ("inode", *id, cache.inval_inode(*id)),
            Msg::Entry(dir, name) => ("entry", *dir, cache.inval_entry(*dir, name)),
            Msg::Stop => return,
        };
        progress.delivered.send_modify(|d| *d += 1);
        match res {
            Ok(()) => tracing::trace!(what, id, "invalidated"),
            // The kernel had nothing cached (fuser already hides ENOENT).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // The mount is going away.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENODEV | libc::ENOTCONN | libc::EBADF)
                ) =>
            {
                tracing::debug!(what, id, error = %e, "invalidation after unmount")
            }
            Err(e) => tracing::warn!(what, id, error = %e, "kernel refused an invalidation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Msg>>>, Epochs);

    /// How many times names were all dropped; `refuse`: as a kernel before
    /// Linux 6.16 would.
    #[derive(Clone, Default)]
    struct Epochs {
        count: Arc<AtomicU64>,
        refuse: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Epochs {
        fn bump(&self) -> io::Result<()> {
            if self.refuse.load(Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn names() -> Arc<std::sync::atomic::AtomicBool> {
        Arc::new(std::sync::atomic::AtomicBool::new(false))
    }

    impl KernelCache for Recorder {
        fn inval_inode(&self, id: FileId) -> io::Result<()> {
            self.0
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?
                .push(Msg::Inode(id));
            match id {
                404 => Err(io::Error::from_raw_os_error(libc::ENOENT)),
                500 => Err(io::Error::from_raw_os_error(libc::EINVAL)),
                _ => Ok(()),
            }
        }

        fn inval_entry(&self, dir: FileId, name: &[u8]) -> io::Result<()> {
            self.0
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?
                .push(Msg::Entry(dir, name.to_vec()));
            Ok(())
        }

        fn inc_epoch(&self) -> io::Result<()> {
            self.1.bump()
        }
    }

    #[test]
    fn delivers_in_order_and_survives_kernel_errors() {
        let rec = Recorder::default();
        let (inv, worker) = Worker::start(rec.clone(), names()).expect("thread");
        inv.inode(1);
        inv.inode(404);
        inv.entry(1, b"a\xff");
        inv.inode(500);
        inv.entry(7, b"b");
        worker.stop();
        let got = rec.0.lock().expect("lock");
        assert_eq!(
            *got,
            vec![
                Msg::Inode(1),
                Msg::Inode(404),
                Msg::Entry(1, b"a\xff".to_vec()),
                Msg::Inode(500),
                Msg::Entry(7, b"b".to_vec()),
            ]
        );
    }

    /// A kernel that holds every invalidation of inode 9 until told.
    #[derive(Clone)]
    struct Gated(Arc<Mutex<std::sync::mpsc::Receiver<()>>>);

    impl KernelCache for Gated {
        fn inval_inode(&self, id: FileId) -> io::Result<()> {
            if id == 9 {
                let rx = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
                let _ = rx.recv();
            }
            Ok(())
        }

        fn inval_entry(&self, _dir: FileId, _name: &[u8]) -> io::Result<()> {
            Ok(())
        }

        fn inc_epoch(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn flush_waits_for_what_was_queued_before_it_and_no_longer_than_asked() {
        let (open, gate) = std::sync::mpsc::channel();
        let (inv, worker) =
            Worker::start(Gated(Arc::new(Mutex::new(gate))), names()).expect("thread");
        // Nothing queued: at once.
        assert!(inv.flush(Duration::from_secs(60)).await);
        inv.inode(1);
        assert!(inv.flush(Duration::from_secs(60)).await);
        // Held in the kernel: the flush gives up after its limit, and says so.
        inv.inode(9);
        let start = std::time::Instant::now();
        assert!(!inv.flush(Duration::from_millis(100)).await);
        assert!(start.elapsed() >= Duration::from_millis(100));
        // Let go: a flush now returns once it is delivered.
        let waiting = inv.flush(Duration::from_secs(60));
        open.send(()).expect("gate");
        assert!(waiting.await);
        worker.stop();
    }

    #[test]
    fn names_are_kept_only_by_a_kernel_that_can_drop_them_all_at_once() {
        let rec = Recorder::default();
        let ok = names();
        let (inv, worker) = Worker::start(rec.clone(), ok.clone()).expect("thread");
        // Tried once at the start.
        assert!(ok.load(Ordering::SeqCst));
        assert_eq!(rec.1.count.load(Ordering::SeqCst), 1);
        // Dropped at once, not queued behind what the worker delivers.
        inv.all_names();
        assert_eq!(rec.1.count.load(Ordering::SeqCst), 2);
        // A kernel that stops taking it: no more names are handed out.
        rec.1.refuse.store(true, Ordering::SeqCst);
        inv.all_names();
        assert!(!ok.load(Ordering::SeqCst));
        worker.stop();

        let old = Recorder::default();
        old.1.refuse.store(true, Ordering::SeqCst);
        let ok = names();
        ok.store(true, Ordering::SeqCst);
        let (inv, worker) = Worker::start(old.clone(), ok.clone()).expect("thread");
        assert!(!ok.load(Ordering::SeqCst));
        inv.all_names();
        assert_eq!(old.1.count.load(Ordering::SeqCst), 0);
        worker.stop();
    }

    #[test]
    fn calls_after_stop_are_harmless() {
        let rec = Recorder::default();
        let (inv, worker) = Worker::start(rec.clone(), names()).expect("thread");
        worker.stop();
        inv.inode(3);
        inv.entry(3, b"x");
        assert!(rec.0.lock().expect("lock").is_empty());
    }
}
