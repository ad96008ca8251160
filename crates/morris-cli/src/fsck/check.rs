//! The consistency rules of a volume, as pure functions of a snapshot of every
//! server's inodes, directory entries and data files: what is wrong
//! ([`check`]) and what a repair would do about it ([`plan`]).
//!
//! Errors are what the client's write ordering must never leave behind
//! (an entry naming no inode) and counts that disagree with the entries.
//! Garbage (unreachable inodes, data without an inode) is what a crash in the
//! middle of a create or remove may leave; it is reclaimed only once its ctime
//! is older than the minimum age, so that creates in flight are not touched.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use morris_proto::{FileId, FileKind, Handle, Inode, Timestamp, ROOT_ID};

/// The parts of an inode the checks look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRec {
    /// File id.
    pub id: FileId,
    /// Generation.
    pub gen: u32,
    /// Kind.
    pub kind: FileKind,
    /// Recorded link count.
    pub nlink: u32,
    /// Recorded size (directories: entry count).
    pub size: u64,
    /// Recorded parent (directories).
    pub parent: FileId,
    /// Last change.
    pub ctime: Timestamp,
    /// Stale-copy records: (server, lowest stale block).
    pub stale: Vec<(u32, u64)>,
    /// A cached object (cache mode): its link count and a directory's
    /// size are home's, not counts of the entries here.
    pub cached: bool,
}

impl From<&Inode> for InodeRec {
    fn from(i: &Inode) -> Self {
        InodeRec {
            id: i.id,
            gen: i.gen,
            kind: i.attr.kind,
            nlink: i.attr.nlink,
            size: i.attr.size,
            parent: i.parent,
            ctime: i.attr.ctime,
            stale: i.stale.iter().map(|r| (r.server, r.from)).collect(),
            cached: i.home.is_some(),
        }
    }
}

impl InodeRec {
    /// The inode's handle.
    pub fn handle(&self) -> Handle {
        Handle {
            id: self.id,
            gen: self.gen,
        }
    }
}

/// A directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRec {
    /// The directory holding it.
    pub dir: FileId,
    /// Its name.
    pub name: Vec<u8>,
    /// What it names.
    pub child: Handle,
    /// The kind cached in the entry.
    pub kind: FileKind,
}

/// A file with blocks on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRec {
    /// Server index.
    pub server: u32,
    /// File id.
    pub id: FileId,
    /// Bytes allocated there.
    pub bytes: u64,
}

/// Everything the servers hold, as scanned.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Inodes by id.
    pub inodes: BTreeMap<FileId, InodeRec>,
    /// Every directory entry.
    pub entries: Vec<EntryRec>,
    /// Every (server, file) with data.
    pub data: Vec<DataRec>,
}

/// An entry whose child does not exist (or has another generation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dangling {
    /// The entry.
    pub entry: EntryRec,
    /// Generation of the inode with that id, if one exists.
    pub found_gen: Option<u32>,
}

/// An entry in a directory that does not exist or is not a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanEntry {
    /// The entry.
    pub entry: EntryRec,
    /// The kind of the inode with the directory's id, if any.
    pub dir_kind: Option<FileKind>,
}

/// A directory whose size or link count disagrees with its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirMismatch {
    /// The directory.
    pub id: FileId,
    /// Recorded size.
    pub size: u64,
    /// Number of entries.
    pub want_size: u64,
    /// Recorded nlink.
    pub nlink: u32,
    /// 2 + number of subdirectory entries.
    pub want_nlink: u32,
    /// Its ctime is older than the minimum age.
    pub aged: bool,
}

/// A non-directory whose link count disagrees with the entries naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlinkMismatch {
    /// The inode.
    pub id: FileId,
    /// Recorded nlink.
    pub nlink: u32,
    /// Entries naming it.
    pub want: u32,
    /// Its ctime is older than the minimum age.
    pub aged: bool,
}

/// A directory whose recorded parent is not the directory naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentMismatch {
    /// The directory.
    pub id: FileId,
    /// Recorded parent.
    pub parent: FileId,
    /// The directory holding its entry.
    pub want: FileId,
    /// Its ctime is older than the minimum age.
    pub aged: bool,
}

/// A directory named by more entries than one (the root: by any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirLinks {
    /// The directory.
    pub id: FileId,
    /// How many entries name it.
    pub names: usize,
}

/// An inode not reachable from the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    /// The inode.
    pub id: FileId,
    /// Its generation.
    pub gen: u32,
    /// Its kind.
    pub kind: FileKind,
    /// Its ctime is older than the minimum age (it may be reclaimed).
    pub aged: bool,
    /// Its last name was removed (nlink 0): an orphan, kept by its owner
    /// while a client has it open, reclaimed only through `Reap`.
    pub orphan: bool,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The root directory does not exist (or is not a directory).
    pub root_missing: bool,
    /// Entries naming no inode: the error write ordering exists to prevent.
    pub dangling: Vec<Dangling>,
    /// Entries in directories that do not exist.
    pub orphan_entries: Vec<OrphanEntry>,
    /// Reachable directories with wrong size or nlink.
    pub dir_mismatches: Vec<DirMismatch>,
    /// Reachable files with wrong nlink.
    pub nlink_mismatches: Vec<NlinkMismatch>,
    /// Reachable directories with the wrong parent.
    pub parent_mismatches: Vec<ParentMismatch>,
    /// Directories with extra names.
    pub dir_links: Vec<DirLinks>,
    /// Garbage: inodes not reachable from the root.
    pub unreachable: Vec<Unreachable>,
    /// Garbage: data of files that have no inode.
    pub orphan_data: Vec<DataRec>,
    /// Degraded, not an error: copies that missed changes and wait for
    /// their server's resync, as (file, server, lowest stale block).
    pub stale_copies: Vec<(FileId, u32, u64)>,
}

impl Report {
    /// Number of errors (everything but garbage).
    pub fn errors(&self) -> usize {
        usize::from(self.root_missing)
            + self.dangling.len()
            + self.orphan_entries.len()
            + self.dir_mismatches.len()
            + self.nlink_mismatches.len()
            + self.parent_mismatches.len()
            + self.dir_links.len()
    }

    /// Number of mismatched counts (part of [`Report::errors`]).
    pub fn mismatches(&self) -> usize {
        self.dir_mismatches.len()
            + self.nlink_mismatches.len()
            + self.parent_mismatches.len()
            + self.dir_links.len()
    }

    /// Number of garbage items.
    pub fn garbage(&self) -> usize {
        self.unreachable.len() + self.orphan_data.len()
    }

    /// Keeps only the findings that `earlier` also had, so that a repair acts
    /// on nothing a scan saw only because a client was changing things.
    pub fn confirmed_by(mut self, earlier: &Report) -> Report {
        fn keep<T, K: Eq + std::hash::Hash>(v: &mut Vec<T>, earlier: &[T], key: impl Fn(&T) -> K) {
            let seen: HashSet<K> = earlier.iter().map(&key).collect();
            v.retain(|x| seen.contains(&key(x)));
        }
        self.root_missing &= earlier.root_missing;
        keep(&mut self.dangling, &earlier.dangling, |d| {
            (d.entry.dir, d.entry.name.clone(), d.entry.child.id)
        });
        keep(&mut self.orphan_entries, &earlier.orphan_entries, |o| {
            (o.entry.dir, o.entry.name.clone())
        });
        keep(&mut self.dir_mismatches, &earlier.dir_mismatches, |m| m.id);
        keep(&mut self.nlink_mismatches, &earlier.nlink_mismatches, |m| {
            m.id
        });
        keep(
            &mut self.parent_mismatches,
            &earlier.parent_mismatches,
            |m| m.id,
        );
        keep(&mut self.dir_links, &earlier.dir_links, |m| m.id);
        keep(&mut self.unreachable, &earlier.unreachable, |u| {
            (u.id, u.gen)
        });
        keep(&mut self.orphan_data, &earlier.orphan_data, |d| {
            (d.server, d.id)
        });
        self
    }
}

/// `now - min_age_secs`: changes at or after this are too recent to repair.
pub fn cutoff(now: Timestamp, min_age_secs: u64) -> Timestamp {
    Timestamp {
        secs: now
            .secs
            .saturating_sub(i64::try_from(min_age_secs).unwrap_or(i64::MAX)),
        nanos: now.nanos,
    }
}

/// Checks a snapshot. Inodes whose ctime is before `cutoff` are "aged".
pub fn check(snap: &Snapshot, cutoff: Timestamp) -> Report {
    let mut r = Report::default();
    let aged = |i: &InodeRec| i.ctime < cutoff;
    let is_dir = |id: FileId| {
        snap.inodes
            .get(&id)
            .is_some_and(|i| i.kind == FileKind::Dir)
    };

    // Entries in directories that exist, by directory; and which name a live inode.
    let mut by_dir: HashMap<FileId, Vec<&EntryRec>> = HashMap::new();
    let mut names: HashMap<FileId, Vec<&EntryRec>> = HashMap::new();
    for e in &snap.entries {
        if !is_dir(e.dir) {
            r.orphan_entries.push(OrphanEntry {
                entry: e.clone(),
                dir_kind: snap.inodes.get(&e.dir).map(|i| i.kind),
            });
            continue;
        }
        by_dir.entry(e.dir).or_default().push(e);
        match snap.inodes.get(&e.child.id) {
            Some(c) if c.gen == e.child.gen => names.entry(c.id).or_default().push(e),
            // A placeholder of cache mode: a name fetched from home whose
            // inode is made on first use (from the seed kept beside it).
            _ if morris_proto::home::is_cache_id(e.child.id) => {}
            other => r.dangling.push(Dangling {
                entry: e.clone(),
                found_gen: other.map(|c| c.gen),
            }),
        }
    }

    // Reachability from the root through live entries.
    let mut reached: HashSet<FileId> = HashSet::new();
    if is_dir(ROOT_ID) {
        let mut queue = VecDeque::from([ROOT_ID]);
        reached.insert(ROOT_ID);
        while let Some(d) = queue.pop_front() {
            for e in by_dir.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
                let live = snap
                    .inodes
                    .get(&e.child.id)
                    .is_some_and(|c| c.gen == e.child.gen);
                if live && reached.insert(e.child.id) && is_dir(e.child.id) {
                    queue.push_back(e.child.id);
                }
            }
        }
    } else {
        r.root_missing = true;
    }

    for (&id, ino) in &snap.inodes {
        if !reached.contains(&id) {
            r.unreachable.push(Unreachable {
                id,
                gen: ino.gen,
                kind: ino.kind,
                aged: aged(ino),
                orphan: ino.nlink == 0,
            });
            continue;
        }
        let naming = names.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        if ino.cached {
            // Counts are home's; a cached directory's entries are home's names.
            continue;
        }
        if ino.kind == FileKind::Dir {
            let entries = by_dir.get(&id).map(Vec::as_slice).unwrap_or(&[]);
            let want_size = entries.len() as u64;
            let subdirs = entries.iter().filter(|e| e.kind == FileKind::Dir).count();
            let want_nlink = u32::try_from(2 + subdirs).unwrap_or(u32::MAX);
            if ino.size != want_size || ino.nlink != want_nlink {
                r.dir_mismatches.push(DirMismatch {
                    id,
                    size: ino.size,
                    want_size,
                    nlink: ino.nlink,
                    want_nlink,
                    aged: aged(ino),
                });
            }
            let allowed = if id == ROOT_ID { 0 } else { 1 };
            if naming.len() > allowed {
                r.dir_links.push(DirLinks {
                    id,
                    names: naming.len(),
                });
            }
            let want_parent = if id == ROOT_ID {
                Some(ROOT_ID)
            } else if naming.len() == 1 {
                Some(naming[0].dir)
            } else {
                None
            };
            if let Some(want) = want_parent.filter(|&p| p != ino.parent) {
                r.parent_mismatches.push(ParentMismatch {
                    id,
                    parent: ino.parent,
                    want,
                    aged: aged(ino),
                });
            }
        } else {
            let want = u32::try_from(naming.len()).unwrap_or(u32::MAX);
            if ino.nlink != want {
                r.nlink_mismatches.push(NlinkMismatch {
                    id,
                    nlink: ino.nlink,
                    want,
                    aged: aged(ino),
                });
            }
        }
    }

    for d in &snap.data {
        if !snap.inodes.contains_key(&d.id) {
            r.orphan_data.push(*d);
        }
    }
    for ino in snap.inodes.values() {
        for &(server, from) in &ino.stale {
            r.stale_copies.push((ino.id, server, from));
        }
    }
    r
}

/// Why an entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveWhy {
    /// It names no inode.
    Dangling,
    /// It is in an unreachable directory being reclaimed.
    Garbage,
}

/// Remove one entry (`Unlink` with `expect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveEntry {
    /// The directory.
    pub dir: Handle,
    /// The name.
    pub name: Vec<u8>,
    /// The child it must name.
    pub child: Handle,
    /// Why.
    pub why: RemoveWhy,
}

/// Set a file's nlink to `to`, if it is still `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetNlink {
    /// The inode.
    pub ino: Handle,
    /// The value scanned.
    pub from: u32,
    /// The value wanted after the entry removals.
    pub to: u32,
}

/// Set a directory's nlink to match its entries. (Its size cannot be set
/// through the protocol: the server keeps it as entries come and go.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixDir {
    /// The directory.
    pub ino: Handle,
    /// 2 + subdirectory entries after the removals.
    pub nlink: u32,
}

/// Set a directory's parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetParent {
    /// The directory.
    pub ino: Handle,
    /// The directory holding its entry.
    pub parent: FileId,
}

/// Reclaim an unreachable inode and its data on every server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaim {
    /// The inode.
    pub ino: Handle,
    /// Its kind.
    pub kind: FileKind,
    /// Its ctime when scanned.
    pub ctime: Timestamp,
}

/// What a repair does, in order: remove entries, fix counts, reclaim inodes,
/// reclaim orphan data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Entries to remove.
    pub remove_entries: Vec<RemoveEntry>,
    /// Link counts to set.
    pub set_nlink: Vec<SetNlink>,
    /// Directory link counts to set.
    pub fix_dirs: Vec<FixDir>,
    /// Directory parents to set.
    pub set_parent: Vec<SetParent>,
    /// Inodes to reclaim.
    pub reclaim: Vec<Reclaim>,
    /// Orphan data to delete.
    pub delete_data: Vec<DataRec>,
    /// Findings left alone, and why.
    pub skipped: Vec<String>,
}

impl Plan {
    /// Number of actions.
    pub fn len(&self) -> usize {
        self.remove_entries.len()
            + self.set_nlink.len()
            + self.fix_dirs.len()
            + self.set_parent.len()
            + self.reclaim.len()
            + self.delete_data.len()
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Plans the repair of `report`'s findings in `snap`. Counts changed within
/// the minimum age are left alone; nothing unreachable is reclaimed when the
/// root is missing, and no inode is reclaimed while an entry still names it.
pub fn plan(snap: &Snapshot, report: &Report) -> Plan {
    let mut p = Plan::default();
    let mut removed: HashSet<(FileId, Vec<u8>)> = HashSet::new();
    let handle = |id: FileId| snap.inodes.get(&id).map(InodeRec::handle);

    for d in &report.dangling {
        if let Some(dir) = handle(d.entry.dir) {
            if removed.insert((d.entry.dir, d.entry.name.clone())) {
                p.remove_entries.push(RemoveEntry {
                    dir,
                    name: d.entry.name.clone(),
                    child: d.entry.child,
                    why: RemoveWhy::Dangling,
                });
            }
        }
    }
    if !report.orphan_entries.is_empty() {
        p.skipped.push(format!(
            "{} entries in missing directories cannot be removed through the protocol",
            report.orphan_entries.len()
        ));
    }
    if report.root_missing {
        p.skipped.push(
            "the root directory is missing: nothing is reclaimed (everything would be)".into(),
        );
    }
    let reclaimable: Vec<&Unreachable> = if report.root_missing {
        Vec::new()
    } else {
        report.unreachable.iter().filter(|u| u.aged).collect()
    };
    let young = report.unreachable.len() - reclaimable.len();
    if young > 0 && !report.root_missing {
        p.skipped.push(format!(
            "{young} unreachable inodes changed within the minimum age (creates in flight?)"
        ));
    }
    let garbage_dirs: HashSet<FileId> = reclaimable
        .iter()
        .filter(|u| u.kind == FileKind::Dir)
        .map(|u| u.id)
        .collect();
    for e in snap
        .entries
        .iter()
        .filter(|e| garbage_dirs.contains(&e.dir))
    {
        if let Some(dir) = handle(e.dir) {
            if removed.insert((e.dir, e.name.clone())) {
                p.remove_entries.push(RemoveEntry {
                    dir,
                    name: e.name.clone(),
                    child: e.child,
                    why: RemoveWhy::Garbage,
                });
            }
        }
    }

    // Entries that remain after the removals.
    let remaining: Vec<&EntryRec> = snap
        .entries
        .iter()
        .filter(|e| !removed.contains(&(e.dir, e.name.clone())))
        .collect();
    let mut names_left: HashMap<FileId, u32> = HashMap::new();
    let mut removed_names: HashMap<FileId, u32> = HashMap::new();
    for e in &snap.entries {
        let live = snap
            .inodes
            .get(&e.child.id)
            .is_some_and(|c| c.gen == e.child.gen)
            && snap
                .inodes
                .get(&e.dir)
                .is_some_and(|d| d.kind == FileKind::Dir);
        if !live {
            continue;
        }
        if removed.contains(&(e.dir, e.name.clone())) {
            *removed_names.entry(e.child.id).or_default() += 1;
        } else {
            *names_left.entry(e.child.id).or_default() += 1;
        }
    }

    // Link counts of reachable files.
    let unreachable: HashSet<FileId> = report.unreachable.iter().map(|u| u.id).collect();
    let mismatched: HashMap<FileId, &NlinkMismatch> =
        report.nlink_mismatches.iter().map(|m| (m.id, m)).collect();
    for (&id, ino) in &snap.inodes {
        if ino.kind == FileKind::Dir || unreachable.contains(&id) {
            continue;
        }
        let to = names_left.get(&id).copied().unwrap_or(0);
        match mismatched.get(&id) {
            Some(m) if !m.aged => p.skipped.push(format!(
                "link count of inode {id} changed within the minimum age"
            )),
            Some(_) => p.set_nlink.push(SetNlink {
                ino: ino.handle(),
                from: ino.nlink,
                to,
            }),
            None if removed_names.contains_key(&id) => p.set_nlink.push(SetNlink {
                ino: ino.handle(),
                from: ino.nlink,
                to,
            }),
            None => {}
        }
    }

    // Directory counts.
    for m in &report.dir_mismatches {
        let Some(ino) = snap.inodes.get(&m.id) else {
            continue;
        };
        if !m.aged {
            p.skipped.push(format!(
                "counts of directory {} changed within the minimum age",
                m.id
            ));
            continue;
        }
        if m.size != m.want_size {
            p.skipped.push(format!(
                "size of directory {} ({}, but {} entries) cannot be set through the protocol",
                m.id, m.size, m.want_size
            ));
        }
        if m.nlink != m.want_nlink {
            let subdirs = remaining
                .iter()
                .filter(|e| e.dir == m.id && e.kind == FileKind::Dir)
                .count();
            p.fix_dirs.push(FixDir {
                ino: ino.handle(),
                nlink: u32::try_from(2 + subdirs).unwrap_or(u32::MAX),
            });
        }
    }
    for m in &report.parent_mismatches {
        match snap.inodes.get(&m.id) {
            Some(ino) if m.aged => p.set_parent.push(SetParent {
                ino: ino.handle(),
                parent: m.want,
            }),
            Some(_) => p.skipped.push(format!(
                "parent of directory {} changed within the minimum age",
                m.id
            )),
            None => {}
        }
    }
    if !report.dir_links.is_empty() {
        p.skipped.push(format!(
            "{} directories with more than one name are left for a person to sort out",
            report.dir_links.len()
        ));
    }

    // Reclaim unreachable inodes that no remaining entry names.
    let named: HashSet<FileId> = remaining.iter().map(|e| e.child.id).collect();
    for u in reclaimable {
        let Some(ino) = snap.inodes.get(&u.id) else {
            continue;
        };
        if named.contains(&u.id) {
            p.skipped.push(format!(
                "unreachable inode {} is still named from a recently changed directory",
                u.id
            ));
            continue;
        }
        p.reclaim.push(Reclaim {
            ino: ino.handle(),
            kind: u.kind,
            ctime: ino.ctime,
        });
    }
    p.delete_data = report.orphan_data.clone();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp {
        secs: 10_000,
        nanos: 0,
    };
    const OLD: Timestamp = Timestamp {
        secs: 100,
        nanos: 0,
    };
    const CUT: Timestamp = Timestamp {
        secs: 9_700,
        nanos: 0,
    };

    struct Vol(Snapshot);

    impl Vol {
        fn new() -> Self {
            let mut v = Vol(Snapshot::default());
            v.dir(ROOT_ID, ROOT_ID, 2, 0);
            v
        }
        fn ino(&mut self, id: FileId, kind: FileKind, nlink: u32, size: u64, parent: FileId) {
            self.0.inodes.insert(
                id,
                InodeRec {
                    id,
                    gen: 1,
                    kind,
                    nlink,
                    size,
                    parent,
                    ctime: OLD,
                    stale: Vec::new(),
                    cached: false,
                },
            );
        }
        fn dir(&mut self, id: FileId, parent: FileId, nlink: u32, size: u64) {
            self.ino(id, FileKind::Dir, nlink, size, parent);
        }
        fn file(&mut self, id: FileId, nlink: u32) {
            self.ino(id, FileKind::File, nlink, 0, 0);
        }
        fn link(&mut self, dir: FileId, name: &str, child: FileId, kind: FileKind) {
            self.0.entries.push(EntryRec {
                dir,
                name: name.as_bytes().to_vec(),
                child: Handle { id: child, gen: 1 },
                kind,
            });
        }
        fn young(&mut self, id: FileId) {
            if let Some(i) = self.0.inodes.get_mut(&id) {
                i.ctime = NOW;
            }
        }
        fn report(&self) -> Report {
            check(&self.0, CUT)
        }
    }

    /// root/{a (file, 2 links), d/ {b (file), a (same file)}}
    fn healthy() -> Vol {
        let mut v = Vol::new();
        v.0.inodes.get_mut(&ROOT_ID).unwrap().nlink = 3;
        v.0.inodes.get_mut(&ROOT_ID).unwrap().size = 2;
        v.file(10, 2);
        v.dir(11, ROOT_ID, 2, 2);
        v.file(12, 1);
        v.link(ROOT_ID, "a", 10, FileKind::File);
        v.link(ROOT_ID, "d", 11, FileKind::Dir);
        v.link(11, "b", 12, FileKind::File);
        v.link(11, "a", 10, FileKind::File);
        v.0.data.push(DataRec {
            server: 0,
            id: 10,
            bytes: 4096,
        });
        v
    }

    #[test]
    fn cutoff_subtracts_the_minimum_age() {
        assert_eq!(cutoff(NOW, 300), CUT);
        assert_eq!(cutoff(NOW, u64::MAX).secs, 10_000 - i64::MAX);
    }

    #[test]
    fn a_healthy_volume_is_clean() {
        let r = healthy().report();
        assert_eq!(r, Report::default());
        assert_eq!(r.errors() + r.garbage(), 0);
        assert!(plan(&healthy().0, &r).is_empty());
        let empty = Vol::new().report();
        assert_eq!(empty, Report::default());
    }

    #[test]
    fn cache_placeholders_and_cached_counts_are_not_errors() {
        use morris_proto::home::CACHE_ID_BASE;
        let mut v = healthy();
        // A bound directory with a name fetched from home (no inode yet),
        // and a cached file whose link count is home's.
        v.dir(21, ROOT_ID, 2, 0);
        v.link(ROOT_ID, "cache", 21, FileKind::Dir);
        v.link(21, "placeholder", CACHE_ID_BASE + 5, FileKind::File);
        v.file(CACHE_ID_BASE + 6, 3);
        v.0.inodes.get_mut(&(CACHE_ID_BASE + 6)).unwrap().cached = true;
        v.link(21, "cached", CACHE_ID_BASE + 6, FileKind::File);
        v.0.inodes.get_mut(&21).unwrap().cached = true;
        v.0.inodes.get_mut(&ROOT_ID).unwrap().size += 1;
        v.0.inodes.get_mut(&ROOT_ID).unwrap().nlink += 1;
        let r = v.report();
        assert!(r.dangling.is_empty(), "{r:?}");
        assert!(r.nlink_mismatches.is_empty(), "{r:?}");
        assert!(r.dir_mismatches.is_empty(), "{r:?}");
        assert_eq!(r.errors(), 0, "{r:?}");
        assert!(plan(&v.0, &r).remove_entries.is_empty());
    }

    #[test]
    fn dangling_entries_are_errors_and_get_removed() {
        let mut v = healthy();
        v.link(ROOT_ID, "ghost", 99, FileKind::File);
        v.0.entries.push(EntryRec {
            dir: 11,
            name: b"stale".to_vec(),
            child: Handle { id: 12, gen: 7 },
            kind: FileKind::File,
        });
        // Sizes count the stored entries, dangling or not.
        v.0.inodes.get_mut(&ROOT_ID).unwrap().size = 3;
        v.0.inodes.get_mut(&11).unwrap().size = 3;
        let r = v.report();
        assert_eq!(r.dangling.len(), 2, "{r:?}");
        assert_eq!(r.dangling[0].found_gen, None);
        assert_eq!(r.dangling[1].found_gen, Some(1));
        assert_eq!(r.errors(), 2);
        assert_eq!(r.mismatches(), 0);
        let p = plan(&v.0, &r);
        assert_eq!(p.remove_entries.len(), 2);
        assert!(p
            .remove_entries
            .iter()
            .all(|e| e.why == RemoveWhy::Dangling));
        assert_eq!(
            p.remove_entries[0].dir,
            Handle {
                id: ROOT_ID,
                gen: 1
            }
        );
        assert_eq!(p.remove_entries[0].child.id, 99);
        // Removing them changes no link count of a live file.
        assert!(p.set_nlink.is_empty() && p.fix_dirs.is_empty(), "{p:?}");
    }

    #[test]
    fn unreachable_inodes_and_orphan_data_are_garbage() {
        let mut v = healthy();
        v.file(20, 1); // created, never linked (crash between inode and entry)
        v.file(21, 0);
        v.young(21); // a create in flight
        v.0.data.push(DataRec {
            server: 1,
            id: 30,
            bytes: 100,
        });
        let r = v.report();
        assert_eq!(r.errors(), 0, "{r:?}");
        assert_eq!(r.garbage(), 3);
        assert_eq!(
            r.unreachable
                .iter()
                .map(|u| (u.id, u.aged))
                .collect::<Vec<_>>(),
            vec![(20, true), (21, false)]
        );
        assert_eq!(r.orphan_data[0].id, 30);
        let p = plan(&v.0, &r);
        assert_eq!(
            p.reclaim.iter().map(|x| x.ino.id).collect::<Vec<_>>(),
            vec![20]
        );
        assert_eq!(p.delete_data, r.orphan_data);
        assert!(p
            .skipped
            .iter()
            .any(|s| s.contains("1 unreachable inodes changed")));
        assert!(p.remove_entries.is_empty() && p.set_nlink.is_empty());
    }

    #[test]
    fn unreachable_subtrees_are_emptied_then_reclaimed() {
        let mut v = healthy();
        // An unreachable directory 40 holding a file 41 and a second name of
        // the live file 12 (nlink 2 counts both names).
        v.dir(40, ROOT_ID, 2, 2);
        v.file(41, 1);
        v.link(40, "x", 41, FileKind::File);
        v.link(40, "b2", 12, FileKind::File);
        v.0.inodes.get_mut(&12).unwrap().nlink = 2;
        let r = v.report();
        assert_eq!(r.errors(), 0, "{r:?}");
        assert_eq!(
            r.unreachable.iter().map(|u| u.id).collect::<Vec<_>>(),
            vec![40, 41]
        );
        let p = plan(&v.0, &r);
        let mut names: Vec<_> = p.remove_entries.iter().map(|e| e.name.clone()).collect();
        names.sort();
        assert_eq!(names, vec![b"b2".to_vec(), b"x".to_vec()]);
        assert!(p.remove_entries.iter().all(|e| e.why == RemoveWhy::Garbage));
        // The live file loses a name.
        assert_eq!(
            p.set_nlink,
            vec![SetNlink {
                ino: Handle { id: 12, gen: 1 },
                from: 2,
                to: 1
            }]
        );
        let mut ids: Vec<_> = p.reclaim.iter().map(|x| x.ino.id).collect();
        ids.sort();
        assert_eq!(ids, vec![40, 41]);
    }

    #[test]
    fn recently_changed_unreachable_directories_are_left_alone() {
        let mut v = healthy();
        v.dir(40, ROOT_ID, 2, 1);
        v.young(40);
        v.file(41, 1); // aged, but still named from the young directory
        v.link(40, "x", 41, FileKind::File);
        let r = v.report();
        let p = plan(&v.0, &r);
        assert!(p.remove_entries.is_empty(), "{p:?}");
        assert!(p.reclaim.is_empty(), "{p:?}");
        assert!(p
            .skipped
            .iter()
            .any(|s| s.contains("inode 41 is still named")));
    }

    #[test]
    fn count_mismatches_are_errors_and_fixed_when_aged() {
        let mut v = healthy();
        v.0.inodes.get_mut(&10).unwrap().nlink = 5; // file with 2 names
        v.0.inodes.get_mut(&11).unwrap().size = 7; // directory with 2 entries
        v.0.inodes.get_mut(&ROOT_ID).unwrap().nlink = 2; // has one subdirectory
        v.0.inodes.get_mut(&11).unwrap().parent = 99;
        let r = v.report();
        assert_eq!(r.nlink_mismatches.len(), 1);
        assert_eq!(r.nlink_mismatches[0].want, 2);
        assert_eq!(
            r.dir_mismatches
                .iter()
                .map(|m| (m.id, m.want_size, m.want_nlink))
                .collect::<Vec<_>>(),
            vec![(ROOT_ID, 2, 3), (11, 2, 2)]
        );
        assert_eq!(r.parent_mismatches.len(), 1);
        assert_eq!(r.parent_mismatches[0].want, ROOT_ID);
        assert_eq!(r.errors(), 4);
        let p = plan(&v.0, &r);
        assert_eq!(
            p.set_nlink,
            vec![SetNlink {
                ino: Handle { id: 10, gen: 1 },
                from: 5,
                to: 2
            }]
        );
        assert_eq!(
            p.fix_dirs,
            vec![FixDir {
                ino: Handle {
                    id: ROOT_ID,
                    gen: 1
                },
                nlink: 3
            }]
        );
        assert!(
            p.skipped.iter().any(|s| s.contains("size of directory 11")),
            "{p:?}"
        );
        assert_eq!(p.set_parent[0].parent, ROOT_ID);

        v.young(10);
        let r = v.report();
        let p = plan(&v.0, &r);
        assert!(p.set_nlink.is_empty());
        assert!(p.skipped.iter().any(|s| s.contains("inode 10")));
    }

    #[test]
    fn directories_with_two_names_are_reported() {
        let mut v = healthy();
        v.link(ROOT_ID, "d2", 11, FileKind::Dir);
        v.0.inodes.get_mut(&ROOT_ID).unwrap().size = 3;
        v.0.inodes.get_mut(&ROOT_ID).unwrap().nlink = 4;
        let r = v.report();
        assert_eq!(r.dir_links, vec![DirLinks { id: 11, names: 2 }]);
        assert_eq!(r.errors(), 1, "{r:?}");
    }

    #[test]
    fn entries_of_missing_directories_are_orphans() {
        let mut v = healthy();
        v.link(77, "lost", 12, FileKind::File);
        v.link(10, "in-a-file", 12, FileKind::File);
        let r = v.report();
        assert_eq!(r.orphan_entries.len(), 2);
        assert_eq!(r.orphan_entries[0].dir_kind, None);
        assert_eq!(r.orphan_entries[1].dir_kind, Some(FileKind::File));
        // Orphan entries do not count as names of their child.
        assert!(r.nlink_mismatches.is_empty(), "{r:?}");
        let p = plan(&v.0, &r);
        assert!(p.remove_entries.is_empty());
        assert!(!p.skipped.is_empty());
    }

    #[test]
    fn a_missing_root_reclaims_nothing() {
        let mut v = healthy();
        v.0.inodes.remove(&ROOT_ID);
        let r = v.report();
        assert!(r.root_missing);
        assert!(r.errors() >= 1);
        // Everything hangs off the missing root; all of it is unreachable.
        assert_eq!(r.unreachable.len(), 3);
        let p = plan(&v.0, &r);
        assert!(p.reclaim.is_empty() && p.remove_entries.is_empty(), "{p:?}");
    }

    #[test]
    fn cycles_do_not_hang_reachability() {
        let mut v = healthy();
        // 11 names the root: a loop back up, and a second name of the root.
        v.link(11, "up", ROOT_ID, FileKind::Dir);
        v.0.inodes.get_mut(&11).unwrap().size = 3;
        v.0.inodes.get_mut(&11).unwrap().nlink = 3;
        let r = v.report();
        assert_eq!(
            r.dir_links,
            vec![DirLinks {
                id: ROOT_ID,
                names: 1
            }]
        );
        assert!(r.unreachable.is_empty());
    }

    #[test]
    fn only_confirmed_findings_survive() {
        let mut v = healthy();
        v.file(20, 1);
        v.link(ROOT_ID, "ghost", 99, FileKind::File);
        v.0.inodes.get_mut(&ROOT_ID).unwrap().size = 3;
        let first = v.report();
        // By the second scan the ghost's inode showed up (it was being created).
        v.file(99, 1);
        v.file(21, 1);
        let second = v.report();
        let c = second.clone().confirmed_by(&first);
        assert!(c.dangling.is_empty());
        assert_eq!(
            c.unreachable.iter().map(|u| u.id).collect::<Vec<_>>(),
            vec![20]
        );
        assert!(second.unreachable.iter().any(|u| u.id == 21));
    }
}
