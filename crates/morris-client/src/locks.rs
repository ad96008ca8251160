//! Byte-range locks (`fcntl`, OFD and `flock` locks, one domain, as Linux
//! NFS clients have them), kept by each file's owner server
//! (`morris-server/src/locks.rs`). A lock owner is the kernel's (a process's
//! file table, or an open file description); the server keys it with this
//! client's id. A waiting lock asks again each time the owner answers
//! `LockPending`. Locks go when their owner's file is closed: a process's
//! POSIX locks on a file at its close of any descriptor of that file
//! (`flush_locks`), OFD and flock locks at the last close of their open
//! file (`Client::do_release`); and all of a client's locks when its
//! servers stop hearing from it for a lease time.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use morris_proto::{ErrorCode, FileId, LockInfo, LockKind, Reply, Request};
use tracing::{info, warn};

use crate::io::OpenFile;
use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// The lock owners that locked through one open file (given up at its
/// last close).
pub(crate) type Lockers = HashSet<u64>;

/// Which (file, lock owner) may hold locks here, each with the number its
/// entry was made with: a wait whose entry went (the owner's locks were
/// given up at a close) or was made anew stops.
#[derive(Debug, Default)]
pub(crate) struct LockUsers {
    users: parking_lot::Mutex<HashMap<(FileId, u64), u64>>,
    next: AtomicU64,
}

impl LockUsers {
    /// The entry of (`id`, `owner`), made if missing.
    fn enter(&self, id: FileId, owner: u64) -> u64 {
        *self
            .users
            .lock()
            .entry((id, owner))
            .or_insert_with(|| self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether the entry is still the one numbered `n`.
    fn still(&self, id: FileId, owner: u64, n: u64) -> bool {
        self.users.lock().get(&(id, owner)) == Some(&n)
    }

    /// Removes the entry; true if there was one.
    fn leave(&self, id: FileId, owner: u64) -> bool {
        self.users.lock().remove(&(id, owner)).is_some()
    }
}

impl Client {
    /// Locks (`Read`, `Write`) or unlocks bytes `start..=end` (`u64::MAX`:
    /// to the end of the file) of open file `fh` for lock owner `owner`.
    /// A conflicting lock of another owner, on any mount, is `WouldBlock`,
    /// or with `wait`, waited for (`Deadlock` if the wait would close a
    /// cycle the owner can see). A wait ends with `WouldBlock` if the
    /// owner's locks are given up meanwhile (its file was closed), and
    /// with `Interrupted` if `interrupted()` says so between two asks (at
    /// most a second apart), the owner's locks then as they were.
    #[allow(clippy::too_many_arguments)]
    pub async fn lock(
        &self,
        fh: u64,
        owner: u64,
        pid: u32,
        (start, end): (u64, u64),
        kind: LockKind,
        wait: bool,
        interrupted: impl Fn() -> bool,
    ) -> Result<()> {
        let f = self.open_file(fh)?;
        if kind != LockKind::Unlock {
            f.lockers.lock().insert(owner);
        }
        let entry = (kind != LockKind::Unlock).then(|| self.lock_users.enter(f.id, owner));
        let req = Request::Lock {
            ino: f.h,
            owner,
            pid,
            start,
            end,
            kind,
            wait,
            reclaim: false,
        };
        loop {
            let reply = self.call_owner(f.id, req.clone()).await?;
            let closed = entry.is_some_and(|n| !self.lock_users.still(f.id, owner, n));
            match reply {
                Reply::Ok if closed && kind != LockKind::Unlock => {
                    // Granted after the owner's file was closed: nobody
                    // will ever unlock it; give it back now.
                    self.send_unlock(&f, owner).await?;
                    return Err(Error::new(
                        ErrorCode::WouldBlock,
                        "the file was closed while the lock was waited for",
                    ));
                }
                Reply::Ok => {
                    self.note_lock(f.id, owner, pid, (start, end), kind);
                    return Ok(());
                }
                Reply::LockPending if closed => {
                    return Err(Error::new(
                        ErrorCode::WouldBlock,
                        "the file was closed while the lock was waited for",
                    ))
                }
                Reply::LockPending if interrupted() => {
                    return Err(Error::new(
                        ErrorCode::Interrupted,
                        "interrupted while waiting for a lock",
                    ))
                }
                Reply::LockPending => continue,
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// The first lock of another owner that a `write` (or read) lock of
    /// `owner` on `start..=end` of open file `fh` would conflict with.
    pub async fn test_lock(
        &self,
        fh: u64,
        owner: u64,
        (start, end): (u64, u64),
        write: bool,
    ) -> Result<Option<LockInfo>> {
        let f = self.open_file(fh)?;
        let req = Request::TestLock {
            ino: f.h,
            owner,
            start,
            end,
            write,
        };
        match self.call_owner(f.id, req).await? {
            Reply::LockTest(found) => Ok(found),
            other => Err(unexpected(&other)),
        }
    }

    /// A descriptor of open file `fh` was closed by lock owner `owner` (a
    /// process): its POSIX locks on the file go, whichever descriptor they
    /// were taken through. Nothing is sent unless it locked the file here.
    pub async fn flush_locks(&self, fh: u64, owner: u64) -> Result<()> {
        let Ok(f) = self.open_file(fh) else {
            return Ok(());
        };
        self.unlock_owner(&f, owner).await
    }

    /// Every lock taken through open file `f` goes (its last close).
    pub(crate) async fn unlock_all_through(&self, f: &OpenFile) -> Result<()> {
        let owners: Vec<u64> = f.lockers.lock().iter().copied().collect();
        let mut out = Ok(());
        for owner in owners {
            if let Err(e) = self.unlock_owner(f, owner).await {
                out = Err(e);
            }
        }
        out
    }

    /// Gives up `owner`'s locks of `f`'s file, if it may hold any, and
    /// ends its waits there.
    async fn unlock_owner(&self, f: &OpenFile, owner: u64) -> Result<()> {
        if !self.lock_users.leave(f.id, owner) {
            return Ok(());
        }
        self.send_unlock(f, owner).await
    }

    /// Unlocks the whole of `f`'s file for `owner`.
    async fn send_unlock(&self, f: &OpenFile, owner: u64) -> Result<()> {
        let req = Request::Lock {
            ino: f.h,
            owner,
            pid: 0,
            start: 0,
            end: u64::MAX,
            kind: LockKind::Unlock,
            wait: false,
            reclaim: false,
        };
        match self.call_owner(f.id, req).await? {
            Reply::Ok => {
                self.note_lock(f.id, owner, 0, (0, u64::MAX), LockKind::Unlock);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Keeps this client's copy of the locks it holds (what it asks for
    /// again after a restart) in step with a granted change.
    fn note_lock(&self, id: FileId, owner: u64, pid: u32, range: (u64, u64), kind: LockKind) {
        let mut held = self.held_locks.lock();
        match kind {
            LockKind::Unlock => {
                held.unlock(id, (0, owner), range);
            }
            LockKind::Read | LockKind::Write => {
                // Granted by the owner, so no conflict here; a full table
                // only means a later reclaim may miss this lock.
                let _ = held.lock(id, (0, owner), pid, range, kind == LockKind::Write);
            }
        }
    }

    /// Server `server` lost its lease table (it restarted, or did not
    /// answer for a lease time and may have been replaced by its copy):
    /// asks again, as reclaims, for every lock this client holds on files
    /// whose metadata range it serves or may have served. A lock someone
    /// else took meanwhile is lost, and logged.
    pub(crate) async fn reclaim_locks(&self, server: u32) {
        let k = self.layout.servers;
        let copies = self.layout.meta_copies();
        let mine: Vec<_> = self
            .held_locks
            .lock()
            .all()
            .into_iter()
            .filter(|(id, _)| {
                let range = self.layout.inode_server(*id);
                (server + k - range) % k < copies
            })
            .collect();
        if mine.is_empty() {
            return;
        }
        info!(
            server,
            locks = mine.len(),
            "asking again for the locks held on files it serves"
        );
        for (id, h) in mine {
            let Ok(ino) = self.leases.handle(id) else {
                continue;
            };
            let req = Request::Lock {
                ino,
                owner: h.owner.1,
                pid: h.pid,
                start: h.start,
                end: h.end,
                kind: if h.write {
                    LockKind::Write
                } else {
                    LockKind::Read
                },
                wait: false,
                reclaim: true,
            };
            match self.call_owner(id, req).await {
                Ok(Reply::Ok) => {}
                Ok(other) => warn!(id, reply = ?other, "unexpected answer to a reclaimed lock"),
                Err(e) => {
                    warn!(id, owner = h.owner.1, start = h.start, end = h.end, error = %e,
                        "a lock held here was lost (taken by another owner, or its server refused it)");
                    self.held_locks.lock().unlock(id, h.owner, (h.start, h.end));
                }
            }
        }
    }
}
