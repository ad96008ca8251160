//! Byte-range locks as a table (the server's, and each client's copy of
//! what it holds, for reclaims), kept in memory: POSIX (`fcntl`),
//! OFD and `flock` locks in one domain, as Linux NFS clients have them
//! (`flock` is a write or read lock of the whole file owned by the open
//! file description). An owner is a client plus the kernel's lock owner
//! (a process's file table for POSIX locks, a file description for OFD and
//! `flock` locks); its locks on one file never overlap each other (a new
//! lock replaces what it covers, adjacent ones of the same kind merge).
//! Pure state: the server answers, waits and wakes
//! (`morris-server/src/service/locking.rs`).

use std::collections::HashMap;

use crate::FileId;

/// A client, as the server numbers its sessions.
pub type ClientId = u64;

/// Who holds a lock: the client and the kernel's lock owner there.
pub type Owner = (ClientId, u64);

/// Most locks one file may carry (each change scans the file's list).
pub const MAX_PER_FILE: usize = 10_000;

/// Most locks one client may hold on one server.
pub const MAX_PER_CLIENT: usize = 100_000;

/// Most locks one server keeps.
pub const MAX_LOCKS: usize = 1_000_000;

/// One held lock: bytes `start..=end` (`end` `u64::MAX`: to the end of
/// the file, however long it grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its owner.
    pub owner: Owner,
    /// The process that took it, for `F_GETLK` (informational).
    pub pid: u32,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
    /// A write (exclusive) lock; else a read (shared) lock.
    pub write: bool,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// Why a lock was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Another owner holds a conflicting lock (the first one found).
    Conflict(Held),
    /// The client or the server holds as many locks as allowed.
    TooMany,
}

/// Every lock this server keeps, and who waits for whom.
#[derive(Debug)]
pub struct LockTable {
    /// Caps: per file, per client, in all.
    caps: (usize, usize, usize),
    files: HashMap<FileId, Vec<Held>>,
    per_client: HashMap<ClientId, usize>,
    total: usize,
    /// A waiting owner → the owner whose lock it waits for, and when it
    /// last asked (ms): a waiter asks again every [`WAIT_ROUND_MS`] or so,
    /// and one that stopped asking (interrupted) waits no more.
    waits_for: HashMap<Owner, (Owner, u64)>,
}

/// A wait not renewed for this long is over.
pub const WAIT_ROUND_MS: u64 = 3_000;

impl Default for LockTable {
    fn default() -> Self {
        LockTable::with_caps(MAX_PER_FILE, MAX_PER_CLIENT, MAX_LOCKS)
    }
}

impl LockTable {
    /// An empty table with these caps on locks per file, per client and
    /// in all.
    pub fn with_caps(per_file: usize, per_client: usize, total: usize) -> Self {
        LockTable {
            caps: (per_file, per_client, total),
            files: HashMap::new(),
            per_client: HashMap::new(),
            total: 0,
            waits_for: HashMap::new(),
        }
    }

    /// The first lock of another owner that conflicts with a `write` (or
    /// read) lock of `owner` on `start..=end` of `id`.
    pub fn conflict(
        &self,
        id: FileId,
        owner: Owner,
        start: u64,
        end: u64,
        write: bool,
    ) -> Option<Held> {
        self.files
            .get(&id)?
            .iter()
            .copied()
            .find(|h| h.owner != owner && h.overlaps(start, end) && (write || h.write))
    }

    /// Locks `start..=end` of `id` for `owner` (`write` or read), replacing
    /// what `owner` held there; refused if another owner's lock conflicts.
    pub fn lock(
        &mut self,
        id: FileId,
        owner: Owner,
        pid: u32,
        (start, end): (u64, u64),
        write: bool,
    ) -> Result<(), Refused> {
        if let Some(h) = self.conflict(id, owner, start, end, write) {
            return Err(Refused::Conflict(h));
        }
        // Splitting one lock in two adds one; anything else adds at most one.
        let mine = self.per_client.get(&owner.0).copied().unwrap_or(0);
        let on_file = self.files.get(&id).map_or(0, Vec::len);
        let (per_file, per_client, total) = self.caps;
        if on_file + 2 > per_file || mine + 2 > per_client || self.total + 2 > total {
            return Err(Refused::TooMany);
        }
        let here = self.count_here(id, owner.0);
        self.cut(id, owner, start, end);
        let list = self.files.entry(id).or_default();
        list.push(Held {
            owner,
            pid,
            start,
            end,
            write,
        });
        Self::merge(list, owner);
        self.recount(id, owner.0, here);
        Ok(())
    }

    /// Unlocks `start..=end` of `id` for `owner`; true if it held any of it.
    pub fn unlock(&mut self, id: FileId, owner: Owner, (start, end): (u64, u64)) -> bool {
        let here = self.count_here(id, owner.0);
        let changed = self.cut(id, owner, start, end);
        if changed {
            self.recount(id, owner.0, here);
        }
        changed
    }

    /// Every lock of `client` (it is gone); the files whose locks changed.
    pub fn drop_client(&mut self, client: ClientId) -> Vec<FileId> {
        let mut changed = Vec::new();
        self.files.retain(|&id, list| {
            let before = list.len();
            list.retain(|h| h.owner.0 != client);
            if list.len() != before {
                changed.push(id);
            }
            !list.is_empty()
        });
        let gone = self.per_client.remove(&client).unwrap_or(0);
        self.total = self.total.saturating_sub(gone);
        self.waits_for
            .retain(|w, (h, _)| w.0 != client && h.0 != client);
        changed
    }

    /// Every lock kept, by file.
    pub fn all(&self) -> Vec<(FileId, Held)> {
        self.files
            .iter()
            .flat_map(|(&id, l)| l.iter().map(move |h| (id, *h)))
            .collect()
    }

    /// The clients holding locks here.
    pub fn clients(&self) -> Vec<ClientId> {
        self.per_client.keys().copied().collect()
    }

    /// How many locks are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.total
    }

    /// Records that `waiter` waits for a lock `holder` holds (at time
    /// `now`, ms), unless that would close a cycle of waiting owners (a
    /// deadlock): then false.
    pub fn wait_for(&mut self, waiter: Owner, holder: Owner, now: u64) -> bool {
        let mut at = holder;
        for _ in 0..=self.waits_for.len() {
            if at == waiter {
                return false;
            }
            match self.waits_for.get(&at) {
                Some(&(next, asked)) if now.saturating_sub(asked) < WAIT_ROUND_MS => at = next,
                _ => break,
            }
        }
        self.waits_for.insert(waiter, (holder, now));
        true
    }

    /// `waiter` waits no more.
    pub fn stop_waiting(&mut self, waiter: Owner) {
        self.waits_for.remove(&waiter);
    }

    /// Removes `owner`'s locks of `id` within `start..=end`, keeping the
    /// parts outside it; true if anything changed.
    fn cut(&mut self, id: FileId, owner: Owner, start: u64, end: u64) -> bool {
        let Some(list) = self.files.get_mut(&id) else {
            return false;
        };
        let mut changed = false;
        let mut kept = Vec::with_capacity(list.len() + 1);
        for h in list.drain(..) {
            if h.owner != owner || !h.overlaps(start, end) {
                kept.push(h);
                continue;
            }
            changed = true;
            if h.start < start {
                kept.push(Held {
                    end: start - 1,
                    ..h
                });
            }
            if h.end > end {
                kept.push(Held {
                    start: end + 1,
                    ..h
                });
            }
        }
        if kept.is_empty() {
            self.files.remove(&id);
        } else {
            *list = kept;
        }
        changed
    }

    /// Merges `owner`'s overlapping or adjacent locks of the same kind.
    fn merge(list: &mut Vec<Held>, owner: Owner) {
        list.sort_by_key(|h| (h.owner != owner, h.start));
        let mut out: Vec<Held> = Vec::with_capacity(list.len());
        for h in list.drain(..) {
            if let Some(last) = out.last_mut() {
                if last.owner == owner
                    && h.owner == owner
                    && last.write == h.write
                    && h.start <= last.end.saturating_add(1)
                {
                    last.end = last.end.max(h.end);
                    continue;
                }
            }
            out.push(h);
        }
        *list = out;
    }

    /// How many locks `client` holds on `id`.
    fn count_here(&self, id: FileId, client: ClientId) -> usize {
        self.files
            .get(&id)
            .map_or(0, |l| l.iter().filter(|h| h.owner.0 == client).count())
    }

    /// Brings the counts up to date after a change to `client`'s locks on
    /// `id`, of which it held `before` until then.
    fn recount(&mut self, id: FileId, client: ClientId, before: usize) {
        let now = self.count_here(id, client);
        let mine = self.per_client.entry(client).or_insert(0);
        *mine = (*mine + now).saturating_sub(before);
        if *mine == 0 {
            self.per_client.remove(&client);
        }
        self.total = (self.total + now).saturating_sub(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = (1, 10);
    const A2: Owner = (1, 11);
    const B: Owner = (2, 10);
    const EOF: u64 = u64::MAX;

    fn held(t: &LockTable, id: FileId) -> Vec<(Owner, u64, u64, bool)> {
        let mut v: Vec<_> = t
            .files
            .get(&id)
            .map(|l| {
                l.iter()
                    .map(|h| (h.owner, h.start, h.end, h.write))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn readers_share_writers_exclude_and_owners_are_client_and_lock_owner() {
        let mut t = LockTable::default();
        t.lock(7, A, 1, (0, 99), false).unwrap();
        t.lock(7, B, 2, (50, 149), false).unwrap();
        // Same lock owner number on another client is another owner.
        match t.lock(7, B, 2, (0, 10), true) {
            Err(Refused::Conflict(h)) => {
                assert_eq!((h.owner, h.pid, h.start, h.end), (A, 1, 0, 99))
            }
            other => panic!("{other:?}"),
        }
        // Another owner of the same client conflicts too.
        assert!(t.lock(7, A2, 3, (120, 130), true).is_err());
        assert!(t.lock(7, A2, 3, (150, 200), true).is_ok());
        // Another file is another matter.
        assert!(t.lock(8, B, 2, (0, EOF), true).is_ok());
        assert_eq!(t.conflict(7, B, 0, 0, false), None);
        assert_eq!(t.conflict(7, B, 0, 0, true).map(|h| h.owner), Some(A));
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn a_new_lock_replaces_what_it_covers_and_neighbours_merge() {
        let mut t = LockTable::default();
        t.lock(1, A, 1, (0, 99), true).unwrap();
        // A read lock in the middle splits the write lock in three.
        t.lock(1, A, 1, (40, 59), false).unwrap();
        assert_eq!(
            held(&t, 1),
            vec![(A, 0, 39, true), (A, 40, 59, false), (A, 60, 99, true)]
        );
        assert_eq!(t.len(), 3);
        // Writing it back merges the three into one.
        t.lock(1, A, 1, (40, 59), true).unwrap();
        assert_eq!(held(&t, 1), vec![(A, 0, 99, true)]);
        // Adjacent locks of the same kind merge; up to EOF works.
        t.lock(1, A, 1, (100, EOF), true).unwrap();
        assert_eq!(held(&t, 1), vec![(A, 0, EOF, true)]);
        // Unlocking a hole splits, unlocking everything empties.
        assert!(t.unlock(1, A, (10, 19)));
        assert_eq!(held(&t, 1), vec![(A, 0, 9, true), (A, 20, EOF, true)]);
        assert!(
            !t.unlock(1, B, (0, EOF)),
            "another owner's unlock changes nothing"
        );
        assert!(t.unlock(1, A, (0, EOF)));
        assert!(held(&t, 1).is_empty());
        assert_eq!(t.len(), 0);
        assert!(t.clients().is_empty());
    }

    #[test]
    fn a_gone_client_loses_every_lock_and_its_waits() {
        let mut t = LockTable::default();
        t.lock(1, A, 1, (0, 0), true).unwrap();
        t.lock(2, A2, 1, (0, 0), true).unwrap();
        t.lock(2, B, 2, (5, 5), true).unwrap();
        assert!(t.wait_for(B, A, 0));
        let mut changed = t.drop_client(1);
        changed.sort();
        assert_eq!(changed, vec![1, 2]);
        assert_eq!(held(&t, 2), vec![(B, 5, 5, true)]);
        assert_eq!(t.len(), 1);
        assert!(t.waits_for.is_empty());
    }

    #[test]
    fn a_wait_that_closes_a_cycle_is_a_deadlock() {
        let mut t = LockTable::default();
        let c: Owner = (3, 1);
        assert!(t.wait_for(A, B, 0));
        assert!(t.wait_for(B, c, 0));
        // c waiting for A would close A -> B -> c -> A.
        assert!(!t.wait_for(c, A, 10));
        t.stop_waiting(B);
        assert!(t.wait_for(c, A, 10));
        // A wait not asked again for a while is over.
        let mut t = LockTable::default();
        assert!(t.wait_for(A, B, 0));
        assert!(!t.wait_for(B, A, WAIT_ROUND_MS - 1));
        assert!(t.wait_for(B, A, WAIT_ROUND_MS));
    }

    #[test]
    fn locks_are_counted_and_capped_per_file_client_and_server() {
        let mut t = LockTable::with_caps(50, 20, 30);
        for i in 0..19u64 {
            t.lock(i % 2, A, 1, (2 * i, 2 * i), true).unwrap();
        }
        assert_eq!(t.len(), 19);
        assert_eq!(t.lock(1, A, 1, (1000, 1000), true), Err(Refused::TooMany));
        // Another client still may, up to the server's cap.
        for i in 0..10u64 {
            t.lock(5, B, 1, (2 * i, 2 * i), true).unwrap();
        }
        assert_eq!(t.lock(6, B, 1, (0, 0), true), Err(Refused::TooMany));
        assert_eq!(t.drop_client(1).len(), 2);
        assert_eq!(t.len(), 10);
        let mut one = LockTable::with_caps(2, 100, 100);
        one.lock(1, A, 1, (0, 0), true).unwrap();
        assert_eq!(one.lock(1, B, 1, (5, 5), true), Err(Refused::TooMany));
        assert!(one.lock(2, B, 1, (5, 5), true).is_ok());
    }
}
