//! Namespace steps finished after the operation has answered its caller.
//!
//! A create is `CreateInode` then `Link`, an unlink `Unlink` then
//! `DropLink`, usually at two servers. While this client holds the write
//! leases of the directory (and of the removed object), nobody else can
//! see what the later steps change, so a mount answers early and sends
//! them in a task that keeps a use of those leases until they land
//! (`fs.rs`: `link_later`, `unlink_later`, `drop_link_later`; the table
//! and the failure cases are in docs/architecture.md, "Steps finished
//! after the answer"). This module counts what is on its way, per inode
//! and kind ([`Step`]), for whoever must wait for it:
//!
//! | kind left behind | who waits for it |
//! |---|---|
//! | [`Step::Attrs`]: a link count still dropping | this client's `getattr`, lookup, open, `setattr`, link, listing attributes of the object; its `fsync` |
//! | [`Step::Entries`]: a directory's entries at its owner behind this client's | every request about the directory but a lookup (`Client::call_owner`); its `fsync` |
//! | [`Step::Named`]: a new object's name still on its way | its `fsync` |
//! | [`Step::Created`]: a new object's inode still on its way | every request about it (`Client::call_owner`, block writes, a stored size or change of attributes, the `Link` of a name in it) |
//!
//! Two changes of one name go in the order they were made ([`NameTurn`]);
//! the unmount waits for everything; at most [`MAX_PENDING`] steps are on
//! their way at once (a caller waits for room first).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::{FutureExt, Shared};
use morris_proto::FileId;
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};

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
    /// A new object whose inode is not stored yet (a create with an id
    /// reserved ahead: `CreateInodeAt`): no request about it may go out,
    /// and its write grant's fence number is not known yet.
    Created = 3,
}

/// The deferred steps of one client, counted per inode and kind.
pub(crate) struct Deferred {
    counts: Mutex<FastMap<FileId, [usize; 4]>>,
    total: AtomicUsize,
    done: Notify,
    room: Arc<Semaphore>,
    /// Files whose create answered but whose name never landed.
    lost: Mutex<HashSet<FileId>>,
    /// The last deferred change of each (directory, name) still on its
    /// way: the next one of the same name goes after it.
    names: Mutex<FastMap<(FileId, Vec<u8>), Done>>,
}

/// Resolves once a deferred change of a name has landed (or failed).
type Done = Shared<oneshot::Receiver<()>>;

/// A deferred change of one name: its place after the earlier changes of
/// the same name (a removal after the create it follows, a create after
/// the removal of the same name). Dropping it lets the next one go.
pub(crate) struct NameTurn {
    of: Arc<Deferred>,
    key: (FileId, Vec<u8>),
    prev: Option<Done>,
    done: Done,
    _mine: oneshot::Sender<()>,
}

impl NameTurn {
    /// Waits until the earlier changes of the same name have landed.
    pub(crate) async fn wait(&mut self) {
        if let Some(p) = self.prev.take() {
            // A dropped sender (`Err`) means landed, too.
            let _ = p.await;
        }
    }
}

impl Drop for NameTurn {
    fn drop(&mut self) {
        let mut m = self.of.names.lock();
        if m.get(&self.key).is_some_and(|d| d.ptr_eq(&self.done)) {
            m.remove(&self.key);
        }
    }
}

impl Default for Deferred {
    fn default() -> Self {
        Deferred {
            counts: Mutex::new(FastMap::default()),
            total: AtomicUsize::new(0),
            done: Notify::new(),
            room: Arc::new(Semaphore::new(MAX_PENDING)),
            lost: Mutex::new(HashSet::new()),
            names: Mutex::new(FastMap::default()),
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
                m.entry(id).or_insert([0; 4])[step as usize] += 1;
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

    /// Waits until `done()` holds, looked at after every step that lands.
    async fn wait_until(&self, done: impl Fn() -> bool) {
        // Nothing on its way (the usual case, and every block write and
        // stored size asks): no waiter registered.
        if done() {
            return;
        }
        loop {
            let landed = self.done.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            if done() {
                return;
            }
            landed.await;
        }
    }

    /// Waits until no step of the kinds `kinds` is pending on `id` (at
    /// once when none is).
    pub(crate) async fn settled_for(&self, id: FileId, kinds: &[Step]) {
        self.wait_until(|| !self.pending(id, kinds)).await;
    }

    /// Waits until the attributes cached for `id` are no longer behind.
    pub(crate) async fn settled(&self, id: FileId) {
        self.settled_for(id, &[Step::Attrs]).await;
    }

    /// Waits until no step is pending on any inode.
    pub(crate) async fn all_settled(&self) {
        self.wait_until(|| self.total.load(Ordering::SeqCst) == 0)
            .await;
    }

    /// Takes the next turn of `name` in `dir` (call in the order the
    /// changes were made: under the directory's `dir_locks`).
    pub(crate) fn turn(self: &Arc<Self>, dir: FileId, name: &[u8]) -> NameTurn {
        let (tx, rx) = oneshot::channel();
        let done = rx.shared();
        let key = (dir, name.to_vec());
        let prev = self.names.lock().insert(key.clone(), done.clone());
        NameTurn {
            of: self.clone(),
            key,
            prev,
            done,
            _mine: tx,
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
    async fn changes_of_one_name_go_in_turn_and_others_do_not_wait() {
        let d = Arc::new(Deferred::default());
        let first = d.turn(1, b"a");
        let mut second = d.turn(1, b"a");
        let mut other = d.turn(1, b"b");
        tokio::time::timeout(Duration::from_secs(1), other.wait())
            .await
            .unwrap();
        let waiter = tokio::spawn(async move {
            second.wait().await;
            second
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "a's second change waits for its first"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.names.lock().len(), 2, "a's second and b are on their way");
        drop(second);
        drop(other);
        assert!(d.names.lock().is_empty(), "nothing left once all landed");
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
