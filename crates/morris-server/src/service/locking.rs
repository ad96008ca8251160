//! `Lock` and `TestLock` at a file's owner: the lock table (`locks.rs`)
//! answered, waited on and expired.
//!
//! A waiting `Lock` sleeps on `lock_changed` (woken by every unlock and
//! every expiry) for at most [`LOCK_WAIT`], then answers `LockPending` and
//! the client asks again: no request stays in the server for long, and a
//! client that stops asking (its process was interrupted, the mount died)
//! leaves nothing behind.

use std::time::Duration;

use morris_proto::{ErrorCode, Handle, LockInfo, LockKind, Reply, WireError};
use tracing::debug;

use super::{err, Server};
use crate::leases::ClientId;
use crate::store::Store;
use morris_proto::locks::{Owner, Refused};

/// Longest a waiting `Lock` is held before `LockPending` (the client
/// checks between two asks whether its caller was interrupted).
const LOCK_WAIT: Duration = Duration::from_secs(1);

impl Server {
    /// `Lock`: locks or unlocks a range of `ino` for (`client`, `owner`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lock(
        &self,
        store: &Store,
        client: ClientId,
        ino: Handle,
        (owner, pid): (u64, u32),
        (start, end): (u64, u64),
        kind: LockKind,
        wait: bool,
    ) -> Result<Reply, WireError> {
        if start > end {
            return Err(err(
                ErrorCode::Invalid,
                "a lock range that ends before it starts",
            ));
        }
        // The file must exist (a stale handle is refused, not locked).
        store.get_handle(ino)?;
        let who: Owner = (client, owner);
        let write = match kind {
            LockKind::Unlock => {
                if self.locks.lock().unlock(ino.id, who, (start, end)) {
                    self.lock_changed.notify_waiters();
                }
                return Ok(Reply::Ok);
            }
            LockKind::Read => false,
            LockKind::Write => true,
        };
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            // Registered before trying, so an unlock between the try and
            // the wait is not missed.
            let changed = self.lock_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let holder = {
                let mut t = self.locks.lock();
                match t.lock(ino.id, who, pid, (start, end), write) {
                    Ok(()) => {
                        t.stop_waiting(who);
                        return Ok(Reply::Ok);
                    }
                    Err(Refused::TooMany) => {
                        t.stop_waiting(who);
                        return Err(err(
                            ErrorCode::TooManyLeases,
                            "this server holds as many locks as it allows",
                        ));
                    }
                    Err(Refused::Conflict(h)) => {
                        if !wait {
                            t.stop_waiting(who);
                            return Err(err(ErrorCode::WouldBlock, "a conflicting lock is held"));
                        }
                        if !t.wait_for(who, h.owner, self.now_ms()) {
                            t.stop_waiting(who);
                            return Err(err(
                                ErrorCode::Deadlock,
                                "the holder waits for a lock this owner holds",
                            ));
                        }
                        h.owner
                    }
                }
            };
            debug!(id = ino.id, client, owner, holder = ?holder, "lock waits");
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                // Still waiting (it asks again at once): the entry stays,
                // so a cycle closed meanwhile is seen.
                return Ok(Reply::LockPending);
            }
        }
    }

    /// `TestLock`: the first conflicting lock of another owner.
    pub(super) fn test_lock(
        &self,
        store: &Store,
        client: ClientId,
        ino: Handle,
        owner: u64,
        (start, end): (u64, u64),
        write: bool,
    ) -> Result<Reply, WireError> {
        store.get_handle(ino)?;
        let found = self
            .locks
            .lock()
            .conflict(ino.id, (client, owner), start, end, write);
        Ok(Reply::LockTest(found.map(|h| LockInfo {
            start: h.start,
            end: h.end,
            write: h.write,
            pid: h.pid,
        })))
    }

    /// Drops the locks of clients not heard from for a lease time (their
    /// mount is gone or cut off: it dropped its leases, and with them
    /// its claim to the locks, at the same moment). Run from `tick`.
    pub(super) fn expire_locks(&self) {
        let now = self.now_ms();
        let holders = self.locks.lock().clients();
        if holders.is_empty() {
            return;
        }
        let silent: Vec<ClientId> = {
            let seen = self.seen.lock();
            holders
                .into_iter()
                .filter(|c| {
                    seen.get(c)
                        .is_none_or(|&t| now.saturating_sub(t) >= u64::from(self.lease_ms))
                })
                .collect()
        };
        if silent.is_empty() {
            return;
        }
        let mut t = self.locks.lock();
        for c in silent {
            let files = t.drop_client(c);
            tracing::info!(
                client = c,
                files = files.len(),
                "locks of a silent client dropped"
            );
        }
        drop(t);
        self.lock_changed.notify_waiters();
    }
}
