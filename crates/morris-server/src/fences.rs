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
//! What it does not do: a late change to a block the next holder has not
//! changed *here* still lands (nothing told this server of the new grant);
//! the client's own check (`Pool::call_fenced`) is the fence for that. The
//! table is in memory and bounded: past [`PER_SHARD`] files per shard the
//! quarter with the oldest grants is forgotten (a file unwritten for that
//! long has no change of an older lease in flight in practice), and a
//! restart forgets it all (a restarted server's old connections, and what
//! was in flight on them, are gone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use morris_proto::auth::Role;
use morris_proto::{ErrorCode, FileId, WireError};
use parking_lot::Mutex;
use tracing::warn;

const SHARDS: usize = 64;
/// Files remembered per shard (about a million in all, ~40 MB at most).
pub(crate) const PER_SHARD: usize = 16 * 1024;

/// The highest fence number seen per file, and what was refused.
pub(crate) struct Fences {
    shards: Vec<Mutex<HashMap<FileId, u64>>>,
    refused: AtomicU64,
}

impl Default for Fences {
    fn default() -> Self {
        Fences {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            refused: AtomicU64::new(0),
        }
    }
}

impl Fences {
    /// Admits a change to file `id` made under the write grant numbered
    /// `fence` (0: none, which only servers and admin tools may send, for
    /// resync and repairs), remembering it; refuses one older than a grant
    /// already seen here.
    pub(crate) fn check(&self, id: FileId, fence: u64, role: Role) -> Result<(), WireError> {
        if fence == 0 {
            if role == Role::Server {
                return Ok(());
            }
            return Err(WireError::new(
                ErrorCode::Denied,
                "a block change from a client must carry the fence number of its write lease",
            ));
        }
        let mut m = self.shards[(id as usize) % SHARDS].lock();
        match m.get_mut(&id) {
            Some(top) if fence < *top => {
                let top = *top;
                drop(m);
                self.refused.fetch_add(1, Ordering::Relaxed);
                warn!(
                    id,
                    fence,
                    newer = top,
                    "refused a change made under a write lease that has passed on"
                );
                Err(WireError::new(
                    ErrorCode::NoLease,
                    format!(
                        "change to file {id} refused: its write lease ({fence}) has passed to another client ({top})"
                    ),
                ))
            }
            Some(top) => {
                *top = fence;
                Ok(())
            }
            None => {
                if m.len() >= PER_SHARD {
                    forget_oldest(&mut m);
                }
                m.insert(id, fence);
                Ok(())
            }
        }
    }

    /// Refuses from now on every change to `id` carrying `above` or lower
    /// (that write grant was revoked).
    pub(crate) fn raise(&self, id: FileId, above: u64) {
        let floor = above.saturating_add(1);
        let mut m = self.shards[(id as usize) % SHARDS].lock();
        match m.get_mut(&id) {
            Some(top) => *top = (*top).max(floor),
            None => {
                if m.len() >= PER_SHARD {
                    forget_oldest(&mut m);
                }
                m.insert(id, floor);
            }
        }
    }

    /// Changes refused since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Forgets the quarter of `m` with the lowest (oldest) fence numbers.
fn forget_oldest(m: &mut HashMap<FileId, u64>) {
    let mut v: Vec<u64> = m.values().copied().collect();
    let cut = v.len() / 4;
    let (_, &mut limit, _) = v.select_nth_unstable(cut);
    m.retain(|_, f| *f > limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_grant_is_refused_once_a_newer_one_changed_the_file() {
        let f = Fences::default();
        f.check(7, 100, Role::Client).unwrap();
        f.check(7, 100, Role::Client).unwrap();
        f.check(7, 200, Role::Client).unwrap();
        let e = f.check(7, 100, Role::Client).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoLease);
        assert_eq!(f.refused(), 1);
        // Other files are their own.
        f.check(8, 100, Role::Client).unwrap();
        // No fence: servers (resync) only.
        f.check(7, 0, Role::Server).unwrap();
        assert_eq!(
            f.check(7, 0, Role::Client).unwrap_err().code,
            ErrorCode::Denied
        );
        f.check(7, 200, Role::Client).unwrap();
        // A revoked grant: refused without any newer change seen.
        f.check(9, 300, Role::Client).unwrap();
        f.raise(9, 300);
        assert!(f.check(9, 300, Role::Client).is_err());
        f.check(9, 301, Role::Client).unwrap();
        f.raise(9, 100);
        f.check(9, 301, Role::Client).unwrap();
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_the_newest_grants() {
        let f = Fences::default();
        let n = (SHARDS * PER_SHARD * 2) as u64;
        for id in 0..n {
            f.check(id, id + 1, Role::Client).unwrap();
        }
        let total: usize = f.shards.iter().map(|s| s.lock().len()).sum();
        assert!(total <= SHARDS * PER_SHARD, "{total}");
        // The newest files are still fenced.
        assert!(f.check(n - 1, 1, Role::Client).is_err());
    }
}
