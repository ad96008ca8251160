//! Per-file server lists, and the plans that change them when a volume
//! grows or shrinks (issue 19; docs/architecture.md, "Placement that can
//! change").
//!
//! Today a block `(id, i)` lives on server `(id + i) mod k` ([`crate::layout`]).
//! Here the same arithmetic names a *position* of the file, and the file's
//! own list ([`FileServers`]) says which member holds each position: copy `r`
//! of block `i` is at position `(id + i + r) mod w` (`w` the list's width),
//! on member `list[position]`, in the same slot `(i - 1) div w` of that
//! member's extent file as now. The identity list `[0, 1, .., k)` is
//! exactly today's placement, so a volume whose files have no list of their
//! own reads as it always has.
//!
//! Adding a member never restripes a file: one position of some files is
//! handed to the new member (its extent files copied whole), and nothing
//! else moves. Draining a member hands each of its positions to another
//! member, the same way. Which positions move is planned here, as a pure
//! function of what each file holds where; carrying a plan out (copy,
//! switch the file's list under its lease, delete the old copy) is the
//! mover's business.

use std::collections::BTreeMap;

use crate::types::FileId;

/// Why a file's server list or a plan is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A list with no position.
    #[error("a file's server list is empty")]
    Empty,
    /// Two copies of one block would share a member.
    #[error("positions {first} and {second} hold copies of the same blocks on member {member}")]
    CopiesTogether {
        /// The member named twice within one block's copies.
        member: u32,
        /// One of its positions.
        first: u32,
        /// The other.
        second: u32,
    },
    /// Fewer members than copies: no placement keeps copies apart.
    #[error("{members} members cannot hold {replicas} copies of a block apart")]
    TooFewMembers {
        /// Members that would be left.
        members: usize,
        /// Copies of each block.
        replicas: u32,
    },
}

/// The members holding one file's stripe positions, in position order.
/// A list decoded from bytes is unchecked: [`FileServers::check`] it
/// before use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileServers(Vec<u32>);

impl FileServers {
    /// Today's placement on `k` servers: position `p` on member `p`.
    pub fn identity(k: u32) -> Self {
        FileServers((0..k.max(1)).collect())
    }

    /// A list of members by position, checked for `replicas` copies
    /// ([`FileServers::check`]).
    pub fn new(list: Vec<u32>, replicas: u32) -> Result<Self, PlacementError> {
        let f = FileServers(list);
        f.check(replicas)?;
        Ok(f)
    }

    /// The members by position.
    pub fn members(&self) -> &[u32] {
        &self.0
    }

    /// Number of positions (the file's stripe width).
    pub fn width(&self) -> u32 {
        self.0.len() as u32
    }

    /// The position holding copy `replica` of block `index` of file `id`.
    pub fn position(&self, id: FileId, index: u64, replica: u32) -> u32 {
        let w = u128::from(self.width().max(1));
        ((u128::from(id) + u128::from(index) + u128::from(replica)) % w) as u32
    }

    /// The member holding copy `replica` of block `index` of file `id`.
    pub fn server(&self, id: FileId, index: u64, replica: u32) -> u32 {
        self.0
            .get(self.position(id, index, replica) as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Whether every block's `replicas` copies sit on distinct members:
    /// any `replicas` consecutive positions (round the list) name distinct
    /// members. A member may hold several positions of one file only far
    /// enough apart.
    pub fn check(&self, replicas: u32) -> Result<(), PlacementError> {
        let w = self.0.len();
        if w == 0 {
            return Err(PlacementError::Empty);
        }
        let r = (replicas.max(1) as usize).min(w);
        if replicas as usize > w {
            return Err(PlacementError::TooFewMembers {
                members: w,
                replicas,
            });
        }
        for p in 0..w {
            for d in 1..r {
                let q = (p + d) % w;
                if self.0[p] == self.0[q] {
                    return Err(PlacementError::CopiesTogether {
                        member: self.0[p],
                        first: p as u32,
                        second: q as u32,
                    });
                }
            }
        }
        Ok(())
    }

    /// The same list with position `position` held by `member`.
    pub fn with(&self, position: u32, member: u32) -> FileServers {
        let mut l = self.0.clone();
        if let Some(slot) = l.get_mut(position as usize) {
            *slot = member;
        }
        FileServers(l)
    }

    /// Which of a member's extent-file sets a position uses: 0 for the
    /// member's first position in the list (the extent files `<id>.<r>`
    /// every file has today), `n` for its `n`-th later one (a member that
    /// holds two positions of a file keeps them apart, since both use the
    /// same slots).
    pub fn extent_set(&self, position: u32) -> u32 {
        let p = position as usize;
        match self.0.get(p) {
            Some(m) => self.0[..p].iter().filter(|x| *x == m).count() as u32,
            None => 0,
        }
    }

    /// Blocks of a `size`-byte file at `position` (copy 0), with
    /// `unit`-byte blocks.
    pub fn blocks_at(&self, id: FileId, position: u32, size: u64, unit: u32) -> u64 {
        let w = u64::from(self.width().max(1));
        let blocks = size.div_ceil(u64::from(unit.max(1)));
        // Block i (1-based) is at position (id + i) mod w: the first such
        // i is ((position - id - 1) mod w) + 1.
        let first = (u64::from(position) % w + w - (id % w + 1) % w) % w + 1;
        if first > blocks {
            0
        } else {
            (blocks - first) / w + 1
        }
    }

    /// Bytes (every copy, whole blocks) the member at `position` stores
    /// for this file: copy `r` of the blocks at position `position - r`.
    pub fn bytes_at(&self, file: &FileUse, position: u32, replicas: u32) -> u64 {
        let w = self.width().max(1);
        (0..replicas.max(1).min(w))
            .map(|r| {
                let base = (position % w + w - r % w) % w;
                self.blocks_at(file.id, base, file.size, file.unit)
            })
            .sum::<u64>()
            .saturating_mul(u64::from(file.unit))
    }
}

/// One extent file a member keeps for a file: copy `copy` of the blocks at
/// base position `base`, held because the member is at `position` (the
/// `set`-th of its positions in the file's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The member's position in the list.
    pub position: u32,
    /// Which copy.
    pub copy: u32,
    /// The member's extent-file set ([`FileServers::extent_set`]).
    pub set: u32,
    /// The position whose blocks it holds (`position - copy`).
    pub base: u32,
}

/// Where one file's blocks live: the volume's stripe unit and copy count
/// with the file's own list (the identity over the volume's servers when
/// it has none). [`Layout`](crate::layout::Layout)'s block functions are
/// this with the identity list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLayout {
    /// The file.
    pub id: FileId,
    /// Stripe unit in bytes.
    pub unit: u32,
    /// Copies of each block.
    pub replicas: u32,
    /// Its members by position.
    pub servers: FileServers,
}

impl FileLayout {
    /// File `id` on `layout`'s volume, with `servers` (`None`: the identity).
    pub fn new(layout: &crate::layout::Layout, id: FileId, servers: Option<&FileServers>) -> Self {
        FileLayout {
            id,
            unit: layout.unit.max(1),
            replicas: layout.replicas.max(1),
            servers: servers
                .cloned()
                .unwrap_or_else(|| FileServers::identity(layout.servers)),
        }
    }

    fn w(&self) -> u64 {
        u64::from(self.servers.width().max(1))
    }

    /// The member holding copy `replica` of block `index`.
    pub fn server(&self, index: u64, replica: u32) -> u32 {
        self.servers.server(self.id, index, replica)
    }

    /// The members holding the copies of block `index`, copy 0 first.
    pub fn placement(&self, index: u64) -> Vec<u32> {
        (0..self.replicas).map(|r| self.server(index, r)).collect()
    }

    /// Byte position of block `index` inside the extent file holding it.
    pub fn local_offset(&self, index: u64) -> u64 {
        (index.saturating_sub(1) / self.w()).saturating_mul(u64::from(self.unit))
    }

    /// The extent file holding copy `replica` of block `index` on its member.
    pub fn extent_of(&self, index: u64, replica: u32) -> Extent {
        let position = self.servers.position(self.id, index, replica);
        let w = self.servers.width().max(1);
        Extent {
            position,
            copy: replica,
            set: self.servers.extent_set(position),
            base: (position % w + w - replica % w) % w,
        }
    }

    /// Every extent file `member` keeps for this file.
    pub fn extents_of(&self, member: u32) -> Vec<Extent> {
        let w = self.servers.width().max(1);
        let mut out = Vec::new();
        for (p, m) in self.servers.members().iter().enumerate() {
            if *m != member {
                continue;
            }
            let p = p as u32;
            for copy in 0..self.replicas.min(w) {
                out.push(Extent {
                    position: p,
                    copy,
                    set: self.servers.extent_set(p),
                    base: (p + w - copy % w) % w,
                });
            }
        }
        out
    }

    /// The block index kept in slot `slot` of an extent of base position `base`.
    fn index_in_slot(&self, base: u32, slot: u64) -> u64 {
        let w = self.w();
        let first = (u64::from(base) % w + w - (self.id % w + 1) % w) % w;
        slot.saturating_mul(w).saturating_add(1 + first)
    }

    /// The length an extent of base position `base` needs for a file of
    /// `size` bytes: the end of the last byte below `size` it holds.
    pub fn local_len(&self, base: u32, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let w = self.w();
        let u = u64::from(self.unit);
        let last = (size - 1) / u + 1;
        let r = (u64::from(base) % w + w - self.id % w) % w;
        let back = (last % w + w - r) % w;
        if back >= last {
            return 0;
        }
        let i = last - back;
        let within = if i == last { size - (last - 1) * u } else { u };
        self.local_offset(i) + within
    }

    /// Where a search from byte `from` starts in an extent of base
    /// position `base`: at `from` if that extent holds the block with it,
    /// else at the start of the next block it holds.
    pub fn local_start(&self, base: u32, from: u64) -> u64 {
        let u = u64::from(self.unit);
        let index = from / u + 1;
        let within = from % u;
        let slot = (index - 1) / self.w();
        let here = self.index_in_slot(base, slot);
        match here.cmp(&index) {
            std::cmp::Ordering::Equal => slot * u + within,
            std::cmp::Ordering::Greater => slot * u,
            std::cmp::Ordering::Less => (slot + 1).saturating_mul(u),
        }
    }

    /// The file's byte at byte `local` of an extent of base position `base`.
    pub fn global_of_local(&self, base: u32, local: u64) -> u64 {
        let u = u64::from(self.unit);
        let index = self.index_in_slot(base, local / u);
        index
            .saturating_sub(1)
            .saturating_mul(u)
            .saturating_add(local % u)
    }
}

/// What a plan needs to know of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileUse {
    /// The file.
    pub id: FileId,
    /// Its size in bytes.
    pub size: u64,
    /// Its stripe unit.
    pub unit: u32,
    /// Its members by position.
    pub servers: FileServers,
}

/// One position of one file handed from one member to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The file.
    pub id: FileId,
    /// The position that changes hands.
    pub position: u32,
    /// Its member now.
    pub from: u32,
    /// Its member after the move.
    pub to: u32,
    /// Bytes to copy (every copy the position holds, whole blocks).
    pub bytes: u64,
}

/// Bytes each member stores for `files` (members holding nothing absent).
pub fn bytes_by_member(files: &[FileUse], replicas: u32) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for f in files {
        for (p, m) in f.servers.members().iter().enumerate() {
            *out.entry(*m).or_insert(0) += f.servers.bytes_at(f, p as u32, replicas);
        }
    }
    out
}

/// The moves that bring member `new` (just added) its share when the
/// volume's members become `members` (which includes `new`): at most one
/// position per file goes to `new`, from whichever member is furthest
/// above the even share, biggest files first, as long as a move brings
/// both closer to it. Only bytes bound for `new` move, so what is moved is
/// close to `1 / members.len()` of everything.
pub fn plan_add(files: &[FileUse], replicas: u32, members: &[u32], new: u32) -> Vec<Move> {
    let mut have = bytes_by_member(files, replicas);
    for m in members {
        have.entry(*m).or_insert(0);
    }
    let total: u64 = have.values().sum();
    let n = members.len().max(1) as u64;
    let target = total / n;
    let order = biggest_first(files);
    let mut moves = Vec::new();
    for f in order {
        if have.get(&new).copied().unwrap_or(0) >= target {
            break;
        }
        if f.servers.members().contains(&new) {
            continue;
        }
        // The position whose member is furthest above the share.
        let best = (0..f.servers.width())
            .map(|p| {
                let m = f.servers.members()[p as usize];
                (p, m, have.get(&m).copied().unwrap_or(0))
            })
            .max_by(|a, b| a.2.cmp(&b.2).then(b.0.cmp(&a.0)));
        let Some((p, from, from_has)) = best else {
            continue;
        };
        let b = f.servers.bytes_at(f, p, replicas);
        let new_has = have.get(&new).copied().unwrap_or(0);
        if b == 0 || !improves(from_has, new_has, b, target) {
            continue;
        }
        moves.push(shift(&mut have, f.id, p, (from, new), b));
    }
    moves
}

/// The moves that take every position of member `drained` to the other
/// members `remaining` (which excludes `drained`): each position goes to
/// the member storing least so far among those that keep the block's
/// copies apart, preferring members the file does not use yet (so it
/// keeps its parallelism); then [`plan_balance`] evens out what copies
/// kept apart made uneven. Files of any size move, empty ones too (their
/// list must stop naming `drained`).
pub fn plan_drain(
    files: &[FileUse],
    replicas: u32,
    remaining: &[u32],
    drained: u32,
) -> Result<Vec<Move>, PlacementError> {
    if (remaining.len() as u32) < replicas.max(1) {
        return Err(PlacementError::TooFewMembers {
            members: remaining.len(),
            replicas,
        });
    }
    let mut have = bytes_by_member(files, replicas);
    have.remove(&drained);
    for m in remaining {
        have.entry(*m).or_insert(0);
    }
    let order = biggest_first(files);
    let mut moves = Vec::new();
    for f in order {
        let mut list = f.servers.clone();
        for p in 0..list.width() {
            if list.members()[p as usize] != drained {
                continue;
            }
            let b = list.bytes_at(f, p, replicas);
            let pick = remaining
                .iter()
                .filter(|m| **m != drained)
                .filter(|m| list.with(p, **m).check(replicas).is_ok())
                .min_by_key(|m| {
                    (
                        list.members().contains(m),
                        have.get(m).copied().unwrap_or(0),
                        **m,
                    )
                })
                .copied();
            let Some(to) = pick else {
                return Err(PlacementError::TooFewMembers {
                    members: remaining.len(),
                    replicas,
                });
            };
            // (`have` holds nothing for `drained`: no count to lower.)
            moves.push(shift(&mut have, f.id, p, (drained, to), b));
            list = list.with(p, to);
        }
    }
    let after = apply(files, &moves);
    let even = plan_balance(&after, replicas, remaining);
    Ok(merge(moves, even))
}

/// Moves between the members `members` that bring each closer to an even
/// share, for files whose lists leave little choice: after a drain, a
/// file as wide as the volume keeps its copies apart only by giving the
/// drained position to a member not next to it, so on a mirrored volume
/// the drained bytes land on some members only. Positions of members above
/// the share go to the member furthest below it among those that keep
/// copies apart, biggest files first, while that brings both closer.
pub fn plan_balance(files: &[FileUse], replicas: u32, members: &[u32]) -> Vec<Move> {
    let mut have = bytes_by_member(files, replicas);
    for m in members {
        have.entry(*m).or_insert(0);
    }
    let total: u64 = have.values().sum();
    let target = total / members.len().max(1) as u64;
    let order = biggest_first(files);
    let mut moves = Vec::new();
    for f in order {
        let mut list = f.servers.clone();
        for p in 0..list.width() {
            let from = list.members()[p as usize];
            let from_has = have.get(&from).copied().unwrap_or(0);
            if from_has <= target {
                continue;
            }
            let b = list.bytes_at(f, p, replicas);
            let pick = members
                .iter()
                .filter(|m| **m != from)
                .filter(|m| list.with(p, **m).check(replicas).is_ok())
                .min_by_key(|m| (have.get(m).copied().unwrap_or(0), **m))
                .copied();
            let Some(to) = pick else { continue };
            let to_has = have.get(&to).copied().unwrap_or(0);
            if b == 0 || !improves(from_has, to_has, b, target) {
                continue;
            }
            moves.push(shift(&mut have, f.id, p, (from, to), b));
            list = list.with(p, to);
        }
    }
    moves
}

/// `first` then `then` as one plan: a position moved twice moves once,
/// from where it was to where it ends (and not at all if that is where it
/// was).
pub fn merge(first: Vec<Move>, then: Vec<Move>) -> Vec<Move> {
    let mut out: Vec<Move> = Vec::with_capacity(first.len() + then.len());
    let mut at: BTreeMap<(FileId, u32), usize> = BTreeMap::new();
    for m in first.into_iter().chain(then) {
        match at.get(&(m.id, m.position)) {
            Some(&i) => out[i].to = m.to,
            None => {
                at.insert((m.id, m.position), out.len());
                out.push(m);
            }
        }
    }
    out.retain(|m| m.from != m.to);
    out
}

/// Files by size, biggest first (ties by id): a plan places the big
/// pieces while there is still room to even out with small ones.
fn biggest_first(files: &[FileUse]) -> Vec<&FileUse> {
    let mut order: Vec<&FileUse> = files.iter().collect();
    order.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
    order
}

/// Counts `bytes` of position `position` of file `id` as moved from one
/// member to another in `have`, and names the move.
fn shift(
    have: &mut BTreeMap<u32, u64>,
    id: FileId,
    position: u32,
    (from, to): (u32, u32),
    bytes: u64,
) -> Move {
    if let Some(h) = have.get_mut(&from) {
        *h = h.saturating_sub(bytes);
    }
    *have.entry(to).or_insert(0) += bytes;
    Move {
        id,
        position,
        from,
        to,
        bytes,
    }
}

/// Whether moving `b` bytes from a member holding `from` to one holding
/// `to` brings the two, together, closer to `target` each.
fn improves(from: u64, to: u64, b: u64, target: u64) -> bool {
    let d = |x: u64| x.abs_diff(target);
    let before = d(from) + d(to);
    let after = d(from.saturating_sub(b)) + d(to + b);
    after < before
}

/// Applies `moves` to `files`' lists (a plan's outcome, for checking it).
pub fn apply(files: &[FileUse], moves: &[Move]) -> Vec<FileUse> {
    let mut by_id: BTreeMap<FileId, FileUse> = files.iter().map(|f| (f.id, f.clone())).collect();
    for m in moves {
        if let Some(f) = by_id.get_mut(&m.id) {
            f.servers = f.servers.with(m.position, m.to);
        }
    }
    files
        .iter()
        .filter_map(|f| by_id.get(&f.id).cloned())
        .collect()
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
