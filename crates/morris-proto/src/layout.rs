//! Where blocks live (MORRIS paper §4.1).
//!
//! A block is named `(file id, index)`. Index 0 is the inode; indices 1.. are
//! the file's stripe units, unit `i` covering bytes `[(i-1)·u, i·u)`. Block
//! `(id, i)` lives on server `(id + i) mod k`, so the inode sits on server
//! `id mod k` and the data runs round-robin from the next server on.
//!
//! On a server the blocks of one file are kept in one sparse "extent" file:
//! block `i` sits at local slot `(i-1) / k`, so the `k` servers each hold every
//! k-th unit densely, holes read as zeros and take no space, and a truncate is
//! one `ftruncate` per server.
//!
//! With `replicas` copies (chained declustering, as in RAID-10 over a ring):
//! copy `r` of block `(id, i)` lives on server `(id + i + r) mod k`, in a
//! separate extent file per copy at the same slot, so a server's copy `r`
//! holds exactly what server `s - r` holds as copy 0. Neighbouring servers
//! mirror each other's blocks, so when one is slow or lost its load spreads
//! over its two neighbours rather than onto one partner.

use crate::types::FileId;

/// The layout parameters of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of servers `k` (at least 1).
    pub servers: u32,
    /// Stripe unit in bytes (a power of two).
    pub unit: u32,
    /// Copies of each block.
    pub replicas: u32,
}

/// First per-server counter value: ids start at `2k + s`, above [`crate::ROOT_ID`].
pub const FIRST_COUNTER: u64 = 2;

impl Layout {
    /// Builds a layout; `servers` and `unit` must be non-zero.
    pub fn new(servers: u32, unit: u32, replicas: u32) -> Self {
        Layout {
            servers: servers.max(1),
            unit: unit.max(1),
            replicas: replicas.clamp(1, servers.max(1)),
        }
    }

    fn k(&self) -> u64 {
        u64::from(self.servers)
    }

    /// The server holding file `id`'s inode, its lock and (for a directory) its entries.
    pub fn inode_server(&self, id: FileId) -> u32 {
        (id % self.k()) as u32
    }

    /// Copies of each metadata range: one per replica, at most three
    /// (1 when not mirrored).
    pub fn meta_copies(&self) -> u32 {
        if self.replicas >= 2 && self.servers >= 2 {
            self.replicas.min(3).min(self.servers)
        } else {
            1
        }
    }

    /// The servers holding copies of metadata range `range` (the inodes
    /// `id mod k == range`): the range's home first, then the next servers
    /// round the ring.
    pub fn meta_holders(&self, range: u32) -> Vec<u32> {
        (0..self.meta_copies())
            .map(|j| ((u64::from(range) + u64::from(j)) % self.k()) as u32)
            .collect()
    }

    /// The server holding block `index` of file `id` (first replica).
    pub fn block_server(&self, id: FileId, index: u64) -> u32 {
        ((u128::from(id) + u128::from(index)) % u128::from(self.k())) as u32
    }

    /// The ordered servers holding copies of block `index` of file `id`:
    /// the primary first, then the next servers round the ring.
    pub fn placement(&self, id: FileId, index: u64) -> Vec<u32> {
        let first = self.block_server(id, index);
        (0..self.replicas)
            .map(|r| ((u64::from(first) + u64::from(r)) % self.k()) as u32)
            .collect()
    }

    /// The block index (1-based) and offset within it of byte `offset`.
    pub fn block_of(&self, offset: u64) -> (u64, u32) {
        let u = u64::from(self.unit);
        (offset / u + 1, (offset % u) as u32)
    }

    /// The first byte of block `index` (1-based).
    pub fn block_start(&self, index: u64) -> u64 {
        index.saturating_sub(1).saturating_mul(u64::from(self.unit))
    }

    /// Byte position of block `index` inside its server's extent file.
    pub fn local_offset(&self, index: u64) -> u64 {
        (index.saturating_sub(1) / self.k()).saturating_mul(u64::from(self.unit))
    }

    /// The server holding copy `replica` of block `index` of file `id`
    /// (chained declustering: copy `r` sits `r` servers after the first).
    pub fn replica_server(&self, id: FileId, index: u64, replica: u32) -> u32 {
        ((u64::from(self.block_server(id, index)) + u64::from(replica)) % self.k()) as u32
    }

    /// The block index server `primary` keeps (copy 0) in slot `slot` of
    /// its extent file of file `id` (slot `j` is bytes `j·unit..(j+1)·unit`).
    fn index_in_slot(&self, id: FileId, primary: u32, slot: u64) -> u64 {
        let k = self.k();
        let first = (u64::from(primary) % k + k - (id % k + 1) % k) % k;
        slot.saturating_mul(k).saturating_add(1 + first)
    }

    /// Where a search from byte `from` of file `id` starts in the extent
    /// file of server `primary`'s blocks (its copy 0, or the same slots of
    /// another copy): at `from` if that server keeps the block holding
    /// it, else at the start of the next block it keeps.
    pub fn local_start(&self, id: FileId, primary: u32, from: u64) -> u64 {
        let u = u64::from(self.unit);
        let (index, within) = self.block_of(from);
        let slot = (index - 1) / self.k();
        let here = self.index_in_slot(id, primary, slot);
        match here.cmp(&index) {
            std::cmp::Ordering::Equal => slot * u + u64::from(within),
            std::cmp::Ordering::Greater => slot * u,
            std::cmp::Ordering::Less => (slot + 1).saturating_mul(u),
        }
    }

    /// The byte of file `id` at byte `local` of server `primary`'s extent
    /// file (the inverse of [`Layout::local_start`] where it is exact).
    pub fn global_of_local(&self, id: FileId, primary: u32, local: u64) -> u64 {
        let u = u64::from(self.unit);
        let index = self.index_in_slot(id, primary, local / u);
        self.block_start(index).saturating_add(local % u)
    }

    /// The length server `server`'s extent file of copy `replica` of file
    /// `id` needs for a file of `size` bytes. Copy `r` on server `s` holds
    /// exactly the blocks copy 0 holds on server `s - r`, at the same slots.
    pub fn replica_local_len(&self, id: FileId, server: u32, replica: u32, size: u64) -> u64 {
        let k = self.k();
        let shifted = (u64::from(server) % k + k - u64::from(replica) % k) % k;
        self.local_len_for_size(id, shifted as u32, size)
    }

    /// The length server `server`'s extent file of file `id` needs for a file of
    /// `size` bytes: the end of the last byte below `size` stored there (0 if none).
    pub fn local_len_for_size(&self, id: FileId, server: u32, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let k = self.k();
        let u = u64::from(self.unit);
        let last = (size - 1) / u + 1; // last block index holding data
                                       // Indices i with (id + i) mod k == server, i.e. i ≡ r (mod k).
        let r = (u64::from(server) % k + k - id % k) % k;
        // Largest i <= last with i ≡ r (mod k).
        let back = (last % k + k - r) % k;
        if back >= last {
            return 0;
        }
        let i = last - back;
        if i == 0 {
            return 0;
        }
        let within = if i == last { size - (last - 1) * u } else { u };
        self.local_offset(i) + within
    }

    /// The file id for a server's `counter`-th allocation: `counter·k + server`,
    /// so ids never collide across servers and the id's inode lands on `server`.
    pub fn allocate_id(&self, server: u32, counter: u64) -> FileId {
        counter
            .max(FIRST_COUNTER)
            .saturating_mul(self.k())
            .saturating_add(u64::from(server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_after_the_inode() {
        let l = Layout::new(4, 1 << 20, 1);
        let id = 10; // inode on server 2
        assert_eq!(l.inode_server(id), 2);
        let servers: Vec<u32> = (1..=8).map(|i| l.block_server(id, i)).collect();
        assert_eq!(servers, vec![3, 0, 1, 2, 3, 0, 1, 2]);
        assert_eq!(l.block_of(0), (1, 0));
        assert_eq!(l.block_of((1 << 20) + 5), (2, 5));
        assert_eq!(l.block_start(2), 1 << 20);
    }

    #[test]
    fn local_slots_are_dense_and_distinct() {
        let l = Layout::new(3, 4096, 1);
        for id in 0..7u64 {
            for s in 0..3u32 {
                let slots: Vec<u64> = (1..=30u64)
                    .filter(|&i| l.block_server(id, i) == s)
                    .map(|i| l.local_offset(i) / 4096)
                    .collect();
                let want: Vec<u64> = (0..slots.len() as u64).collect();
                assert_eq!(slots, want, "id {id} server {s}");
            }
        }
    }

    #[test]
    fn local_len_matches_brute_force() {
        for k in 1..=5u32 {
            let l = Layout::new(k, 16, 1);
            for id in 0..6u64 {
                for s in 0..k {
                    for size in 0..200u64 {
                        let mut want = 0;
                        for off in 0..size {
                            let (i, w) = l.block_of(off);
                            if l.block_server(id, i) == s {
                                want = want.max(l.local_offset(i) + u64::from(w) + 1);
                            }
                        }
                        assert_eq!(
                            l.local_len_for_size(id, s, size),
                            want,
                            "k {k} id {id} s {s} size {size}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ids_do_not_collide_and_land_on_their_server() {
        let l = Layout::new(4, 4096, 1);
        let mut seen = std::collections::HashSet::new();
        for s in 0..4 {
            for c in FIRST_COUNTER..100 {
                let id = l.allocate_id(s, c);
                assert_eq!(l.inode_server(id), s);
                assert!(id != crate::ROOT_ID);
                assert!(seen.insert(id));
            }
        }
        let one = Layout::new(1, 4096, 1);
        assert!(one.allocate_id(0, 0) > crate::ROOT_ID);
    }

    #[test]
    fn replica_slots_are_dense_and_lengths_match_brute_force() {
        for k in 2..=5u32 {
            for r in 1..=k.min(3) {
                let l = Layout::new(k, 16, r);
                for id in 0..6u64 {
                    for i in 1..=40u64 {
                        let p = l.placement(id, i);
                        let mut d = p.clone();
                        d.sort_unstable();
                        d.dedup();
                        assert_eq!(d.len(), r as usize, "copies on distinct servers");
                        for (rep, s) in p.iter().enumerate() {
                            assert_eq!(l.replica_server(id, i, rep as u32), *s);
                        }
                    }
                    for s in 0..k {
                        for rep in 0..r {
                            // Blocks of copy `rep` on server `s` fill slots 0, 1, 2, ...
                            let slots: Vec<u64> = (1..=40u64)
                                .filter(|&i| l.replica_server(id, i, rep) == s)
                                .map(|i| l.local_offset(i) / 16)
                                .collect();
                            let want: Vec<u64> = (0..slots.len() as u64).collect();
                            assert_eq!(slots, want, "k {k} id {id} s {s} copy {rep}");
                            for size in 0..120u64 {
                                let mut want = 0;
                                for off in 0..size {
                                    let (i, w) = l.block_of(off);
                                    if l.replica_server(id, i, rep) == s {
                                        want = want.max(l.local_offset(i) + u64::from(w) + 1);
                                    }
                                }
                                assert_eq!(l.replica_local_len(id, s, rep, size), want);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn placement_is_distinct_servers() {
        let l = Layout::new(4, 4096, 2);
        let p = l.placement(5, 3);
        assert_eq!(p, vec![0, 1]);
    }

    #[test]
    fn local_and_global_positions_map_both_ways() {
        for (k, id) in [(1u32, 5u64), (3, 7), (4, 8), (5, 1234)] {
            let l = Layout::new(k, 4096, 1);
            for from in (0..40 * 4096u64).step_by(1000) {
                let (index, _) = l.block_of(from);
                let owner = l.block_server(id, index);
                for p in 0..k {
                    let local = l.local_start(id, p, from);
                    let g = l.global_of_local(id, p, local);
                    if p == owner {
                        assert_eq!(g, from, "k={k} id={id} from={from}");
                        assert_eq!(local, l.local_offset(index) + from % 4096);
                    } else {
                        // The start of the next block this server keeps.
                        assert!(
                            g > from && g.is_multiple_of(4096),
                            "k={k} p={p} from={from} g={g}"
                        );
                        assert_eq!(l.block_server(id, g / 4096 + 1), p);
                        assert!(g - from < u64::from(k) * 4096);
                    }
                }
            }
        }
    }
}
