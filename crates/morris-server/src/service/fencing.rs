//! Raising a file's fence at every server when its write lease is taken by
//! force: the next grant is answered only once every server refuses the
//! old holder's changes (or could not be told within [`FENCE_WAIT`]).
//! See `fences.rs` for the data servers' side and docs/architecture.md,
//! "Leases", for the rule.

use std::sync::Weak;
use std::time::Duration;

use morris_proto::{ErrorCode, FileId, FileKind, Reply, Request, WireError};
use tracing::{debug, info, warn};

use super::Server;

/// Longest a grant waits for one server to take a raised fence. A server
/// that cannot be told in time (down, cut off) is left as it is: it still
/// refuses the old holder's changes once the next holder has written there,
/// and the old holder's own check stops it from sending after its lease.
const FENCE_WAIT: Duration = Duration::from_secs(2);

impl Server {
    /// Starts raising the fences the lease table asked for (write leases
    /// revoked by force). Called after every change of the lease table,
    /// once its lock is let go.
    pub(super) fn raise_fences(&self) {
        // Outside the runtime (a drop at shutdown) the work waits for the
        // next call (every tick makes one).
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(me) = self.this.get().and_then(Weak::upgrade) else {
            return;
        };
        let todo = std::mem::take(&mut self.leases.lock().to_fence);
        for (id, above) in todo {
            let me = me.clone();
            rt.spawn(async move { me.raise_fence(id, above).await });
        }
    }

    /// Tells every server to refuse changes to `id` made under grants
    /// numbered `above` or lower, then lets the inode's next grant answer.
    /// On a mirrored volume, the blocks the revoked grant changed may
    /// differ between their copies (its holder stopped between one copy
    /// and the next): they are handed to resync to make equal
    /// ([`Server::take_diverged`]).
    async fn raise_fence(&self, id: FileId, above: u64) {
        let mut written = self.fences.raise(id, above).await;
        let mut unknown = false;
        if let Some(vol) = self.store.formatted() {
            let req = Request::RaiseFence { id, above };
            let calls = (0..vol.layout.servers)
                .filter(|&i| i != vol.index)
                .map(|i| {
                    let (vol, req) = (&vol, &req);
                    async move {
                        let r = tokio::time::timeout(FENCE_WAIT, self.peer_ask(vol, i, req)).await;
                        (i, r)
                    }
                });
            for (server, r) in futures::future::join_all(calls).await {
                match r {
                    Ok(Ok(Reply::FenceRaised { written: w })) => written = union(written, w),
                    Ok(Ok(_)) => unknown = true,
                    Ok(Err(e)) => {
                        unknown = true;
                        warn!(id, server, error = %e, "could not raise a revoked lease's fence there")
                    }
                    Err(_) => {
                        unknown = true;
                        warn!(
                            id,
                            server,
                            "could not raise a revoked lease's fence there: no answer in time"
                        )
                    }
                }
            }
            if vol.layout.replicas >= 2 {
                // A server that did not say what the grant changed there
                // may hold any of it.
                let suspect = if unknown {
                    Some((1, u64::MAX))
                } else {
                    written
                };
                if let Some((lo, hi)) = suspect {
                    info!(
                        id,
                        from = lo,
                        to = hi,
                        "a revoked writer's blocks may differ between copies: handed to resync"
                    );
                    self.note_diverged(id, lo, hi);
                }
            }
            self.trim_revoked_tail(&vol, id, if unknown { None } else { Some(written) })
                .await;
        }
        debug!(
            id,
            above, "fence raised: the revoked write lease's changes are refused"
        );
        let mut st = self.leases.lock();
        if st.fencing.get(&id).is_some_and(|(f, _)| *f == above) {
            if let Some((_, done)) = st.fencing.remove(&id) {
                done.send_replace(true);
            }
        }
    }

    /// Cuts `id`'s data at its saved size on every server, if the revoked
    /// grant changed blocks at or past it (`written`: what it changed, as
    /// far as every server said; `None`: some server did not say). A
    /// writer that stopped between storing data past the end and saving
    /// the new size (a mount killed, cut off) left bytes that were never
    /// part of the file; unless they go, a later extension (`truncate`, a
    /// write past the end) would show them where the gap must read as
    /// zeros. Runs after the fence is raised everywhere, so none of the
    /// old holder's changes can land after it, and before the next grant
    /// is answered.
    async fn trim_revoked_tail(
        &self,
        vol: &crate::store::Formatted,
        id: FileId,
        written: Option<Option<(u64, u64)>>,
    ) {
        let inode = match self.ranges().and_then(|r| {
            let store = r.serving_id(id, self.now_ms())?.store.clone();
            store.get_inode(id)
        }) {
            Ok(Some(i)) if i.attr.kind == FileKind::File => i,
            Ok(_) => return,
            Err(e) => {
                warn!(id, error = %e, "a revoked writer's tail not checked: the inode could not be read");
                return;
            }
        };
        let size = inode.attr.size;
        let first = vol.layout.block_of(size).0;
        match written {
            Some(None) => return,
            Some(Some((_, hi))) if hi < first => return,
            _ => {}
        }
        let req = Request::Truncate { id, size, fence: 0 };
        let calls = (0..vol.layout.servers).map(|i| {
            let req = &req;
            async move {
                let r = if i == vol.index {
                    self.truncate_here(vol, id, size).await.map(|()| Reply::Ok)
                } else {
                    match tokio::time::timeout(FENCE_WAIT, self.peer_ask(vol, i, req)).await {
                        Ok(r) => r,
                        Err(_) => Err(WireError::new(ErrorCode::Unavailable, "no answer in time")),
                    }
                };
                (i, r)
            }
        });
        let mut all = true;
        for (server, r) in futures::future::join_all(calls).await {
            if let Err(e) = r {
                all = false;
                warn!(id, server, size, error = %e,
                    "a revoked writer's data past the saved size may stay there");
            }
        }
        if all {
            info!(
                id,
                size, "a revoked writer's data past the saved size cut off"
            );
        }
    }

    /// Hands blocks `first..=last` of `id`, whose copies may differ, to
    /// the resync loop to make equal ([`Server::take_diverged`]).
    pub(crate) fn note_diverged(&self, id: FileId, first: u64, last: u64) {
        self.diverged.lock().push((id, first, last));
        self.blocks.damage_found().notify_one();
    }

    /// Files whose copies may differ after a revoked writer, as (file,
    /// first block, last block), since the last call.
    pub(crate) fn take_diverged(&self) -> Vec<(FileId, u64, u64)> {
        std::mem::take(&mut *self.diverged.lock())
    }
}

/// A grant about to be answered (`Server::granted`): its fence number, and
/// the fence of the inode being raised, if one is (a grant made right
/// after a forced revoke is answered only once every server has it).
pub(super) struct Granted {
    pub(super) fence: u64,
    pub(super) raising: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Granted {
    /// The fence number, once no fence of the inode is being raised.
    pub(super) async fn answer(self) -> u64 {
        if let Some(mut rx) = self.raising {
            let _ = rx.wait_for(|done| *done).await;
        }
        self.fence
    }
}

/// The smallest range holding both.
fn union(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((l1, h1)), Some((l2, h2))) => Some((l1.min(l2), h1.max(h2))),
        (x, None) | (None, x) => x,
    }
}
