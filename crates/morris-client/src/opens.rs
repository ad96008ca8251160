//! Which files this client has open, and the open records it keeps at
//! their owners so that a file stays while it is open here, whatever other
//! clients do to its names (POSIX: an open file outlives its names).
//!
//! The owner keeps an inode whose last name is gone (an *orphan*) while a
//! live client has recorded it open (`SetOpen`, `store/orphans.rs` on the
//! server). Recording every open would cost a round trip per `open(2)`, so
//! a client records an open only when the owner could otherwise forget it:
//!
//! | event while the file is open here | why a record is needed | where |
//! |---|---|---|
//! | the lease is recalled (another client wants to change the inode, e.g. unlink it) | the other client cannot see our open otherwise | `leases.rs` `process_recall`, before `Release` |
//! | the lease is lost without a recall (owner restarted, or silent for a lease time) | the owner's lease table no longer shows our interest | `leases.rs` `discard` |
//! | this client drops the last name (`DropLink`) | same-client unlink of an open file | `fs.rs` `drop_link` |
//! | the file opened is already an orphan (opened through a name that was just removed) | nobody else knows it is open | `io.rs` `do_open` |
//!
//! Per inode the wanted state (`want`: a record should exist while the
//! file is open) and the recorded state converge in [`Opens::reconcile`],
//! one reconciliation per inode at a time; the last close forgets the
//! record. While any record exists the client renews every server, so the
//! owners keep counting it as alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use morris_proto::layout::Layout;
use morris_proto::{FileId, Handle, Reply, Request};
use parking_lot::Mutex;

use crate::pool::{unexpected, Pool};
use crate::Result;

const SHARDS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct OpenEntry {
    h: Handle,
    /// Open-file handles on it here.
    count: usize,
    /// A record is wanted while it is open.
    want: bool,
    /// A record exists at the owner.
    recorded: bool,
}

/// The open files of one client.
pub(crate) struct Opens {
    pool: Arc<Pool>,
    layout: Layout,
    map: Mutex<HashMap<FileId, OpenEntry>>,
    /// One reconciliation per inode (shard) at a time.
    locks: Vec<tokio::sync::Mutex<()>>,
    recorded: AtomicUsize,
}

/// What the last close of a file left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed {
    /// No open-file handle on it is left here.
    pub last: bool,
    /// A record of it was kept at its owner (someone else may have removed
    /// its last name meanwhile).
    pub recorded: bool,
}

impl Opens {
    pub(crate) fn new(pool: Arc<Pool>, layout: Layout) -> Arc<Self> {
        Arc::new(Opens {
            pool,
            layout,
            map: Mutex::new(HashMap::new()),
            locks: (0..SHARDS).map(|_| tokio::sync::Mutex::new(())).collect(),
            recorded: AtomicUsize::new(0),
        })
    }

    /// Counts one more open of `h` (call while holding a use of its lease,
    /// so a recall of that lease sees it). `orphan`: it has no name left,
    /// so it must be recorded before it is used. Returns whether a record
    /// is wanted and missing (then call [`Opens::reconcile`]).
    pub(crate) fn open(&self, h: Handle, orphan: bool) -> bool {
        let mut map = self.map.lock();
        let e = map.entry(h.id).or_insert(OpenEntry {
            h,
            count: 0,
            want: false,
            recorded: false,
        });
        e.count += 1;
        e.want |= orphan;
        e.want && !e.recorded
    }

    /// Counts one open of `id` down.
    pub(crate) fn close(&self, id: FileId) -> Closed {
        let mut map = self.map.lock();
        let Some(e) = map.get_mut(&id) else {
            return Closed {
                last: true,
                recorded: false,
            };
        };
        e.count = e.count.saturating_sub(1);
        let out = Closed {
            last: e.count == 0,
            recorded: e.recorded,
        };
        if e.count == 0 && !e.recorded {
            map.remove(&id);
        }
        out
    }

    /// True while `id` is open here.
    pub(crate) fn is_open(&self, id: FileId) -> bool {
        self.map.lock().get(&id).is_some_and(|e| e.count > 0)
    }

    /// If `id` is open here, asks for a record of it; returns whether one
    /// is wanted and missing (then call [`Opens::reconcile`]).
    pub(crate) fn want_record(&self, id: FileId) -> bool {
        let mut map = self.map.lock();
        match map.get_mut(&id) {
            Some(e) if e.count > 0 => {
                e.want = true;
                !e.recorded
            }
            _ => false,
        }
    }

    /// Brings `id`'s record at its owner in line with what is wanted: made
    /// while it is open and wanted, forgotten once it is closed. An error
    /// leaves the record as it was (a later reconciliation tries again).
    pub(crate) async fn reconcile(&self, id: FileId) -> Result<()> {
        let _one = self.locks[(id as usize) % SHARDS].lock().await;
        loop {
            let (h, make) = {
                let mut map = self.map.lock();
                let Some(e) = map.get(&id).copied() else {
                    return Ok(());
                };
                let wanted = e.count > 0 && e.want;
                if wanted == e.recorded {
                    if e.count == 0 {
                        map.remove(&id);
                    }
                    return Ok(());
                }
                (e.h, wanted)
            };
            let req = Request::SetOpen {
                ino: h,
                open: make,
                op: self.pool.next_op(),
            };
            let range = self.layout.inode_server(id);
            let r = self.pool.call_range(range, req, Bytes::new()).await;
            let gone = matches!(&r, Err(e) if e.code == morris_proto::ErrorCode::Stale);
            match r {
                Ok((_, Reply::Ok, _)) => {}
                Ok((_, other, _)) => return Err(unexpected(&other)),
                // Forgetting a record of a file that is gone: nothing to forget.
                Err(_) if gone && !make => {}
                Err(e) => return Err(e),
            }
            let mut map = self.map.lock();
            if let Some(e) = map.get_mut(&id) {
                if e.recorded != make {
                    e.recorded = make;
                    let n = if make {
                        self.recorded.fetch_add(1, Ordering::Relaxed) + 1
                    } else {
                        self.recorded.fetch_sub(1, Ordering::Relaxed) - 1
                    };
                    self.pool.keep_all(n > 0);
                }
            }
        }
    }

    /// Forgets every record (shutdown).
    pub(crate) async fn close_all(&self) {
        let ids: Vec<FileId> = {
            let mut map = self.map.lock();
            for e in map.values_mut() {
                e.count = 0;
            }
            map.keys().copied().collect()
        };
        for id in ids {
            if let Err(e) = self.reconcile(id).await {
                tracing::debug!(id, error = %e, "could not forget an open record");
            }
        }
    }
}
