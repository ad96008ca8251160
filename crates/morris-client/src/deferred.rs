//! Namespace steps finished after the operation has answered its caller.
//!
//! An unlink is two ordered changes on (usually) two servers: the entry
//! goes at the directory's owner (`Unlink`), then the inode's link count
//! at the inode's owner (`DropLink`, `fs.rs` `drop_link`). Once the entry
//! is gone the name is gone for everyone, so the caller is answered then
//! and the `DropLink` follows in a task of its own ([`Client::defer`]):
//! an `rm -rf` waits for one server round trip per file, not two.
//!
//! What keeps that invisible:
//!
//! | who could see the link count before the `DropLink` lands | what makes them wait |
//! |---|---|
//! | another client (it needs a lease on the inode) | the task holds a use of this client's write lease on the inode until the `DropLink` is answered, so the recall, and the other client, wait for it (`leases.rs`) |
//! | this client: `getattr`, `setattr`, a listing's attributes, a new hard link, a rename | they wait for the inode's pending steps first ([`Deferred::settled`]) |
//! | `fsync` of the file, unmount | the same; unmount waits for every pending step |
//!
//! A crash between the two steps leaves what it always did: an inode no
//! entry names, with a link count one too high, which `morris fsck`
//! reclaims. The steps of one inode run in the order they were deferred
//! (one task per inode at a time, `store_lock`), and at most
//! [`MAX_PENDING`] run at once: a caller waits for a free place first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use morris_proto::FileId;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::leases::FastMap;

/// Deferred steps in flight at once per client.
pub(crate) const MAX_PENDING: usize = 256;

/// The deferred steps of one client, counted per inode.
pub(crate) struct Deferred {
    counts: Mutex<FastMap<FileId, usize>>,
    total: AtomicUsize,
    done: Notify,
    room: Arc<Semaphore>,
}

impl Default for Deferred {
    fn default() -> Self {
        Deferred {
            counts: Mutex::new(FastMap::default()),
            total: AtomicUsize::new(0),
            done: Notify::new(),
            room: Arc::new(Semaphore::new(MAX_PENDING)),
        }
    }
}

/// One deferred step on an inode; dropping it marks the step done.
pub(crate) struct Pending {
    of: Arc<Deferred>,
    id: FileId,
    _room: Option<OwnedSemaphorePermit>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        {
            let mut m = self.of.counts.lock();
            if let Some(n) = m.get_mut(&self.id) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&self.id);
                }
            }
        }
        self.of.total.fetch_sub(1, Ordering::SeqCst);
        self.of.done.notify_waiters();
    }
}

impl Deferred {
    /// Registers a step on `id`, once there is room for one more.
    pub(crate) async fn begin(self: &Arc<Self>, id: FileId) -> Pending {
        // (The semaphore is never closed: `None` cannot happen.)
        let room = self.room.clone().acquire_owned().await.ok();
        self.total.fetch_add(1, Ordering::SeqCst);
        *self.counts.lock().entry(id).or_insert(0) += 1;
        Pending {
            of: self.clone(),
            id,
            _room: room,
        }
    }

    /// Steps still pending on `id`.
    fn pending(&self, id: FileId) -> bool {
        self.total.load(Ordering::SeqCst) > 0 && self.counts.lock().contains_key(&id)
    }

    /// Waits until no step is pending on `id` (at once when none is).
    pub(crate) async fn settled(&self, id: FileId) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.pending(id) {
                return;
            }
            done.await;
        }
    }

    /// Waits until no step is pending on any inode.
    pub(crate) async fn all_settled(&self) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.total.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn settled_waits_for_the_inodes_own_steps_only() {
        let d = Arc::new(Deferred::default());
        let a = d.begin(7).await;
        let b = d.begin(7).await;
        let other = d.begin(8).await;
        // Nothing pending on 9.
        tokio::time::timeout(Duration::from_secs(1), d.settled(9))
            .await
            .unwrap();
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.settled(7).await })
        };
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one step of 7 is still pending");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        let all = {
            let d = d.clone();
            tokio::spawn(async move { d.all_settled().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!all.is_finished(), "8 is still pending");
        drop(other);
        tokio::time::timeout(Duration::from_secs(1), all)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_caller_waits_for_room() {
        let d = Arc::new(Deferred::default());
        let mut held = Vec::new();
        for i in 0..MAX_PENDING {
            held.push(d.begin(i as u64).await);
        }
        let next = {
            let d = d.clone();
            tokio::spawn(async move { d.begin(1_000_000).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!next.is_finished(), "no room until one step ends");
        held.pop();
        let p = tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .unwrap()
            .unwrap();
        drop(p);
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), d.all_settled())
            .await
            .unwrap();
    }
}
