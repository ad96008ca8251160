//! Server-side fencing of block changes: a data server remembers, per file,
//! the highest write-lease fence number a change has carried, and refuses a
//! change carrying a lower one. The lease's owner numbers every write grant
//! above all earlier ones (`LeaseTable::fence`), so once the next holder of
//! a file's write lease has changed a block here, a write or truncate the
//! previous holder made under its lost lease — delayed in the network, sent
//! by a client that was stopped, or by a buggy one — is refused with
//! `NoLease` instead of landing over the newer data (as pNFS layout
//! stateids and Ceph's OSD blocklist fence an evicted client).
//!
//! A lease taken by force is also fenced at once: its owner sends
//! `RaiseFence` to every server before the next grant is answered
//! (`service/fencing.rs`), and the answer says which blocks the revoked
//! grant changed here, so that copies it may have left different are made
//! equal. A server that `RaiseFence` did not reach still takes a late
//! change until the next holder's first change there; the client's own
//! check (`Pool::call_fenced`) is the fence for that. The table is in
//! memory and bounded: past [`PER_SHARD`] files per shard the
//! quarter with the oldest grants is forgotten (a file unwritten for that
//! long has no change of an older lease in flight in practice), and a
//! restart forgets it all (a restarted server's old connections, and what
//! was in flight on them, are gone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use morris_proto::auth::Role;
use morris_proto::{ErrorCode, FileId, WireError};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::warn;

const SHARDS: usize = 64;
/// Files remembered per shard (about a million in all, ~40 MB at most).
pub(crate) const PER_SHARD: usize = 16 * 1024;

/// Blocks `[lo, hi]` changed here under write grant `fence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub fence: u64,
    pub lo: u64,
    pub hi: u64,
}

/// One file's fence at this server.
#[derive(Debug, Clone, Copy)]
struct Fence {
    /// The highest grant number seen (or raised to): anything lower is refused.
    top: u64,
    /// The grant the changes in progress were admitted under.
    active: u64,
    /// Changes in progress (admitted, not yet done).
    inflight: u32,
    /// What the grant `active` changed here, and the one before it: a
    /// revoked grant's changes may have reached some copies of a block and
    /// not others (`Fences::raise` reports them).
    written: Option<Written>,
    before: Option<Written>,
}

impl Fence {
    fn new(fence: u64) -> Self {
        Fence {
            top: fence,
            active: fence,
            inflight: 0,
            written: None,
            before: None,
        }
    }

    /// Records blocks `[lo, hi]` changed under `fence` (the active grant).
    fn note(&mut self, fence: u64, lo: u64, hi: u64) {
        match &mut self.written {
            Some(w) if w.fence == fence => {
                w.lo = w.lo.min(lo);
                w.hi = w.hi.max(hi);
            }
            _ => {
                self.before = self.written.take();
                self.written = Some(Written { fence, lo, hi });
            }
        }
    }
}

/// The highest fence number seen per file, the changes in progress under
/// it, and what was refused.
pub(crate) struct Fences {
    shards: Vec<Mutex<HashMap<FileId, Fence>>>,
    /// Woken when a file of the shard has no change in progress any more.
    drained: Vec<Notify>,
    refused: AtomicU64,
}

impl Default for Fences {
    fn default() -> Self {
        Fences {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            drained: (0..SHARDS).map(|_| Notify::new()).collect(),
            refused: AtomicU64::new(0),
        }
    }
}

/// A change admitted under a fence; keep it until the change is done.
pub(crate) struct Admitted<'a> {
    fences: &'a Fences,
    id: Option<FileId>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let shard = shard_of(id);
        let mut m = self.fences.shards[shard].lock();
        if let Some(f) = m.get_mut(&id) {
            f.inflight = f.inflight.saturating_sub(1);
            if f.inflight == 0 {
                drop(m);
                self.fences.drained[shard].notify_waiters();
            }
        }
    }
}

fn shard_of(id: FileId) -> usize {
    (id as usize) % SHARDS
}

impl Fences {
    /// Admits a change to file `id` made under the write grant numbered
    /// `fence` (0: none, which only servers and admin tools may send, for
    /// resync and repairs); refuses one older than a grant already seen
    /// here. A change under a newer grant than the changes in progress
    /// waits for them to finish first, so an old change that was admitted
    /// never lands after a newer one.
    ///
    /// `blocks` are the blocks the change touches (`u64::MAX` as the end:
    /// all from the first on, a truncate).
    pub(crate) async fn admit(
        &self,
        id: FileId,
        fence: u64,
        role: Role,
        blocks: (u64, u64),
    ) -> Result<Admitted<'_>, WireError> {
        if fence == 0 {
            if role == Role::Server {
                return Ok(Admitted {
                    fences: self,
                    id: None,
                });
            }
            return Err(WireError::new(
                ErrorCode::Denied,
                "a block change from a client must carry the fence number of its write lease",
            ));
        }
        self.on_entry(id, fence, |f| {
            if fence < f.top {
                return Some(Err(f.top));
            }
            f.top = fence;
            if f.inflight == 0 || f.active == fence {
                f.active = fence;
                f.inflight += 1;
                f.note(fence, blocks.0, blocks.1);
                return Some(Ok(()));
            }
            // Changes of an older grant are in progress: let them finish.
            None
        })
        .await
        .map(|()| Admitted {
            fences: self,
            id: Some(id),
        })
        .map_err(|top| self.refuse(id, fence, top))
    }

    /// Runs `step` on `id`'s entry (made for grant `init` if there is none)
    /// under its shard's lock until it gives an answer; between tries,
    /// waits until some file of the shard has no change in progress.
    async fn on_entry<R>(
        &self,
        id: FileId,
        init: u64,
        mut step: impl FnMut(&mut Fence) -> Option<R>,
    ) -> R {
        let shard = shard_of(id);
        loop {
            let drained = self.drained[shard].notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let mut m = self.shards[shard].lock();
                if !m.contains_key(&id) && m.len() >= PER_SHARD {
                    forget_oldest(&mut m);
                }
                let f = m.entry(id).or_insert_with(|| Fence::new(init));
                if let Some(r) = step(f) {
                    return r;
                }
            }
            drained.await;
        }
    }

    fn refuse(&self, id: FileId, fence: u64, top: u64) -> WireError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        warn!(
            id,
            fence,
            newer = top,
            "refused a change made under a write lease that has passed on"
        );
        WireError::new(
            ErrorCode::NoLease,
            format!(
                "change to file {id} refused: its write lease ({fence}) has passed to another client ({top})"
            ),
        )
    }

    /// Refuses from now on every change to `id` carrying `above` or lower
    /// (that write grant was revoked); returns, once the changes of such a
    /// grant already in progress are done, the blocks grant `above` changed
    /// here (as far as this server remembers).
    pub(crate) async fn raise(&self, id: FileId, above: u64) -> Option<(u64, u64)> {
        let floor = above.saturating_add(1);
        self.on_entry(id, floor, |f| {
            f.top = f.top.max(floor);
            (f.inflight == 0 || f.active >= floor).then(|| {
                [f.written, f.before]
                    .into_iter()
                    .flatten()
                    .find(|w| w.fence == above)
                    .map(|w| (w.lo, w.hi))
            })
        })
        .await
    }

    /// Changes refused since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Forgets the quarter of `m` with the lowest (oldest) fence numbers,
/// except files with changes in progress.
fn forget_oldest(m: &mut HashMap<FileId, Fence>) {
    let mut v: Vec<u64> = m.values().map(|f| f.top).collect();
    let cut = v.len() / 4;
    let (_, &mut limit, _) = v.select_nth_unstable(cut);
    m.retain(|_, f| f.top > limit || f.inflight > 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ok(r: Result<Admitted<'_>, WireError>) {
        drop(r.unwrap());
    }

    impl Fences {
        async fn admit_w(
            &self,
            id: FileId,
            fence: u64,
            role: Role,
        ) -> Result<Admitted<'_>, WireError> {
            self.admit(id, fence, role, (1, 1)).await
        }
    }

    #[tokio::test]
    async fn a_raise_reports_what_the_revoked_grant_changed_here() {
        let f = Fences::default();
        ok(f.admit(4, 10, Role::Client, (3, 3)).await);
        ok(f.admit(4, 10, Role::Client, (7, 9)).await);
        assert_eq!(f.raise(4, 10).await, Some((3, 9)));
        // The next holder wrote before the raise came: still known.
        ok(f.admit(5, 10, Role::Client, (2, 2)).await);
        ok(f.admit(5, 20, Role::Client, (8, 8)).await);
        assert_eq!(f.raise(5, 10).await, Some((2, 2)));
        // Nothing of that grant here.
        assert_eq!(f.raise(6, 10).await, None);
    }

    #[tokio::test]
    async fn an_older_grant_is_refused_once_a_newer_one_changed_the_file() {
        let f = Fences::default();
        ok(f.admit_w(7, 100, Role::Client).await);
        ok(f.admit_w(7, 100, Role::Client).await);
        ok(f.admit_w(7, 200, Role::Client).await);
        let e = f.admit_w(7, 100, Role::Client).await.err().unwrap();
        assert_eq!(e.code, ErrorCode::NoLease);
        assert_eq!(f.refused(), 1);
        // Other files are their own.
        ok(f.admit_w(8, 100, Role::Client).await);
        // No fence: servers (resync) only.
        ok(f.admit_w(7, 0, Role::Server).await);
        let e = f.admit_w(7, 0, Role::Client).await.err().unwrap();
        assert_eq!(e.code, ErrorCode::Denied);
        ok(f.admit_w(7, 200, Role::Client).await);
        // A revoked grant: refused without any newer change seen.
        ok(f.admit_w(9, 300, Role::Client).await);
        f.raise(9, 300).await;
        assert!(f.admit_w(9, 300, Role::Client).await.is_err());
        ok(f.admit_w(9, 301, Role::Client).await);
        f.raise(9, 100).await;
        ok(f.admit_w(9, 301, Role::Client).await);
    }

    #[tokio::test]
    async fn a_newer_grant_waits_for_the_older_changes_in_progress() {
        let f = Arc::new(Fences::default());
        let old = f.admit_w(5, 10, Role::Client).await.unwrap();
        // The next holder's change waits while the old one is in progress.
        let f2 = f.clone();
        let newer = tokio::spawn(async move {
            let _g = f2.admit_w(5, 20, Role::Client).await.unwrap();
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!newer.is_finished());
        // Meanwhile no more old changes are admitted.
        assert!(f.admit_w(5, 10, Role::Client).await.is_err());
        drop(old);
        newer.await.unwrap();
        // So does raising the fence over a change in progress.
        let old = f.admit_w(6, 10, Role::Client).await.unwrap();
        let f3 = f.clone();
        let raised = tokio::spawn(async move { f3.raise(6, 10).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!raised.is_finished());
        drop(old);
        raised.await.unwrap();
        assert!(f.admit_w(6, 10, Role::Client).await.is_err());
    }

    #[tokio::test]
    async fn the_table_stays_bounded_and_keeps_the_newest_grants() {
        let f = Fences::default();
        let n = (SHARDS * PER_SHARD * 2) as u64;
        for id in 0..n {
            ok(f.admit_w(id, id + 1, Role::Client).await);
        }
        let total: usize = f.shards.iter().map(|s| s.lock().len()).sum();
        assert!(total <= SHARDS * PER_SHARD, "{total}");
        // The newest files are still fenced.
        assert!(f.admit_w(n - 1, 1, Role::Client).await.is_err());
    }
}
