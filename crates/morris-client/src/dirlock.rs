//! One namespace change at a time per directory, within this client.
//!
//! A directory's write lease keeps *other* clients out while this one checks
//! a name and changes it, but one client runs many requests at once under
//! one lease (the NFS gateway serves its clients' calls concurrently; FUSE
//! serializes most of them in the kernel, not all). Two of them could both
//! find a name absent and both link it, or both rename onto one name. The
//! check-and-change of `create`, `link`, `unlink`/`rmdir` and `rename` is
//! therefore done holding this client's lock on every directory it changes,
//! taken before the leases, in a fixed order (so two renames cannot wait for
//! each other).

use morris_proto::FileId;
use tokio::sync::{Mutex, MutexGuard};

/// How many locks the directories share (by id); two directories on one
/// shard only wait for each other, they never deadlock.
const SHARDS: usize = 256;

/// The per-directory mutation locks of one client.
pub(crate) struct DirLocks {
    shards: Vec<Mutex<()>>,
}

/// The locks of the directories one change touches; released on drop.
pub(crate) struct DirsLocked<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl DirLocks {
    pub(crate) fn new() -> DirLocks {
        DirLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Locks the directories `dirs` (in any order, repeats allowed) for one
    /// check-and-change; shards are taken in ascending order.
    pub(crate) async fn lock(&self, dirs: &[FileId]) -> DirsLocked<'_> {
        let mut idx: Vec<usize> = dirs.iter().map(|&d| (d as usize) % SHARDS).collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards = Vec::with_capacity(idx.len());
        for i in idx {
            guards.push(
                crate::slow::watch(
                    || format!("another change in directory (lock shard {i}) of {dirs:?}"),
                    self.shards[i].lock(),
                )
                .await,
            );
        }
        DirsLocked { _guards: guards }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn opposite_orders_do_not_deadlock_and_exclude() {
        let l = Arc::new(DirLocks::new());
        let busy = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let l = l.clone();
            let busy = busy.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    let dirs = if t % 2 == 0 { [1, 2] } else { [2, 1] };
                    let _g = l.lock(&dirs).await;
                    assert_eq!(busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                    tokio::task::yield_now().await;
                    busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            }));
        }
        let all = futures::future::join_all(tasks);
        let done = tokio::time::timeout(Duration::from_secs(10), all).await;
        assert!(done.is_ok(), "deadlock");
    }

    #[tokio::test]
    async fn the_same_directory_twice_is_one_lock() {
        let l = DirLocks::new();
        let g =
            tokio::time::timeout(Duration::from_secs(1), l.lock(&[7, 7, 7 + SHARDS as u64])).await;
        assert!(
            g.is_ok(),
            "a directory named twice (or two on one shard) waited for itself"
        );
    }
}
