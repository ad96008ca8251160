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

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use morris_proto::FileId;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::leases::FastMap;

/// Deferred steps in flight at once per client.
pub(crate) const MAX_PENDING: usize = 256;

/// What a deferred step leaves behind on an inode until it lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Its link count is lowered after the answer (`DropLink`): the
    /// attributes cached here are behind.
    Attrs = 0,
    /// A directory whose entries at its owner are behind this client's
    /// (a create's `Link`): every other request about it waits.
    Entries = 1,
    /// A file whose first name is not stored yet (a create's `Link`).
    Named = 2,
}

/// The deferred steps of one client, counted per inode and kind.
pub(crate) struct Deferred {
    counts: Mutex<FastMap<FileId, [usize; 3]>>,
    total: AtomicUsize,
    done: Notify,
    room: Arc<Semaphore>,
    /// Files whose create answered but whose name never landed.
    lost: Mutex<HashSet<FileId>>,
}

impl Default for Deferred {
    fn default() -> Self {
        Deferred {
            counts: Mutex::new(FastMap::default()),
            total: AtomicUsize::new(0),
            done: Notify::new(),
            room: Arc::new(Semaphore::new(MAX_PENDING)),
            lost: Mutex::new(HashSet::new()),
        }
    }
}

/// One deferred step; dropping it marks the step done.
pub(crate) struct Pending {
    of: Arc<Deferred>,
    on: Vec<(FileId, Step)>,
    _room: Option<OwnedSemaphorePermit>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        {
            let mut m = self.of.counts.lock();
            for &(id, step) in &self.on {
                if let Some(n) = m.get_mut(&id) {
                    n[step as usize] = n[step as usize].saturating_sub(1);
                    if n.iter().all(|&c| c == 0) {
                        m.remove(&id);
                    }
                }
            }
        }
        self.of.total.fetch_sub(1, Ordering::SeqCst);
        self.of.done.notify_waiters();
    }
}

impl Deferred {
    /// Registers a step that leaves `on` behind, once there is room for
    /// one more.
    pub(crate) async fn begin(self: &Arc<Self>, on: &[(FileId, Step)]) -> Pending {
        // (The semaphore is never closed: `None` cannot happen.)
        let room = self.room.clone().acquire_owned().await.ok();
        self.total.fetch_add(1, Ordering::SeqCst);
        {
            let mut m = self.counts.lock();
            for &(id, step) in on {
                m.entry(id).or_insert([0; 3])[step as usize] += 1;
            }
        }
        Pending {
            of: self.clone(),
            on: on.to_vec(),
            _room: room,
        }
    }

    /// Steps of the kinds `kinds` still pending on `id`.
    fn pending(&self, id: FileId, kinds: &[Step]) -> bool {
        if self.total.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let m = self.counts.lock();
        m.get(&id)
            .is_some_and(|n| kinds.iter().any(|&k| n[k as usize] > 0))
    }

    /// Waits until no step of the kinds `kinds` is pending on `id` (at
    /// once when none is).
    pub(crate) async fn settled_for(&self, id: FileId, kinds: &[Step]) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.pending(id, kinds) {
                return;
            }
            done.await;
        }
    }

    /// Waits until the attributes cached for `id` are no longer behind.
    pub(crate) async fn settled(&self, id: FileId) {
        self.settled_for(id, &[Step::Attrs]).await;
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

    /// Records that the create of `id` answered but its name never landed.
    pub(crate) fn mark_lost(&self, id: FileId) {
        self.lost.lock().insert(id);
    }

    /// Whether `id`'s create answered but its name never landed (its
    /// `fsync` and close then fail).
    pub(crate) fn is_lost(&self, id: FileId) -> bool {
        self.lost.lock().contains(&id)
    }

    /// Forgets `id` (its last close).
    pub(crate) fn forget_lost(&self, id: FileId) {
        self.lost.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn settled_waits_for_the_inodes_own_steps_only() {
        let d = Arc::new(Deferred::default());
        let a = d.begin(&[(7, Step::Attrs)]).await;
        let b = d.begin(&[(7, Step::Attrs)]).await;
        let other = d.begin(&[(8, Step::Attrs)]).await;
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
    async fn each_kind_is_waited_for_by_its_own_waiters() {
        let d = Arc::new(Deferred::default());
        let create = d.begin(&[(1, Step::Entries), (2, Step::Named)]).await;
        // The directory's attributes are not behind: no wait.
        tokio::time::timeout(Duration::from_secs(1), d.settled(1))
            .await
            .unwrap();
        let dir = {
            let d = d.clone();
            tokio::spawn(async move { d.settled_for(1, &[Step::Entries]).await })
        };
        let file = {
            let d = d.clone();
            tokio::spawn(async move { d.settled_for(2, &[Step::Named, Step::Attrs]).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!dir.is_finished() && !file.is_finished());
        drop(create);
        for w in [dir, file] {
            tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .unwrap()
                .unwrap();
        }
        d.mark_lost(2);
        assert!(d.is_lost(2) && !d.is_lost(1));
        d.forget_lost(2);
        assert!(!d.is_lost(2));
    }

    #[tokio::test]
    async fn a_caller_waits_for_room() {
        let d = Arc::new(Deferred::default());
        let mut held = Vec::new();
        for i in 0..MAX_PENDING {
            held.push(d.begin(&[(i as u64, Step::Attrs)]).await);
        }
        let next = {
            let d = d.clone();
            tokio::spawn(async move { d.begin(&[(1_000_000, Step::Attrs)]).await })
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
