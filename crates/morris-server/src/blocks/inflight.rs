//! The changes to extent files in progress, kept in a small file so that a
//! server killed between writing a chunk and writing its checksum reseals
//! exactly those chunks when it starts again.
//!
//! `blocks/INFLIGHT` is an array of [`SLOTS`] fixed records. A change takes
//! a free slot and writes (file id, copy, first chunk, end chunk) into it
//! *before* it touches the extent file or its sums, and zeroes the slot
//! *after* both are written. The writes go through the page cache, which a
//! killed process does not lose, so after `kill -9` every chunk whose data
//! and checksum may disagree is named by a slot (no fsync: see
//! docs/architecture.md, "Checksums", for what holds after a power loss).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use morris_proto::FileId;
use parking_lot::{Condvar, Mutex};

/// Changes that can be in progress at once (more wait for a slot).
pub const SLOTS: usize = 2048;
const RECORD: usize = 32;
/// Marks a used slot (a zeroed slot is free).
const USED: u32 = 0x4d46_4c54; // "MFLT"

/// One change in progress: chunks `[first, end)` of copy `replica` of `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The file.
    pub id: FileId,
    /// Its copy.
    pub replica: u8,
    /// First chunk touched.
    pub first: u64,
    /// One past the last chunk touched.
    pub end: u64,
}

impl Change {
    fn encode(&self) -> [u8; RECORD] {
        let mut r = [0u8; RECORD];
        r[0..4].copy_from_slice(&USED.to_le_bytes());
        r[4] = self.replica;
        r[8..16].copy_from_slice(&self.id.to_le_bytes());
        r[16..24].copy_from_slice(&self.first.to_le_bytes());
        r[24..32].copy_from_slice(&self.end.to_le_bytes());
        r
    }

    fn decode(r: &[u8]) -> Option<Change> {
        let word = |a: usize| -> Option<u64> {
            Some(u64::from_le_bytes(r.get(a..a + 8)?.try_into().ok()?))
        };
        let tag = u32::from_le_bytes(r.get(0..4)?.try_into().ok()?);
        if tag != USED {
            return None;
        }
        Some(Change {
            id: word(8)?,
            replica: *r.get(4)?,
            first: word(16)?,
            end: word(24)?,
        })
    }
}

/// The journal of changes in progress.
pub struct Inflight {
    file: File,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
}

/// A taken slot: the change is complete when it is dropped.
pub struct Slot<'a> {
    journal: &'a Inflight,
    index: usize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.journal.done(self.index);
    }
}

impl Inflight {
    /// Opens (creating) the journal at `path` and returns it with the
    /// changes a previous run left in progress. The caller reseals them and
    /// then calls [`Inflight::clear`].
    pub fn open(path: &Path) -> io::Result<(Inflight, Vec<Change>)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let mut raw = Vec::new();
        io::Read::read_to_end(&mut &file, &mut raw)?;
        let left: Vec<Change> = raw
            .chunks_exact(RECORD)
            .filter_map(Change::decode)
            .collect();
        Ok((
            Inflight {
                file,
                free: Mutex::new((0..SLOTS).rev().collect()),
                freed: Condvar::new(),
            },
            left,
        ))
    }

    /// Forgets what a previous run left (once it is resealed), durably.
    pub fn clear(&self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.set_len((SLOTS * RECORD) as u64)?;
        self.file.sync_all()
    }

    /// Records `c` as in progress; waits while every slot is taken.
    pub fn begin(&self, c: Change) -> io::Result<Slot<'_>> {
        let i = {
            let mut free = self.free.lock();
            loop {
                if let Some(i) = free.pop() {
                    break i;
                }
                self.freed.wait(&mut free);
            }
        };
        if let Err(e) = self.file.write_all_at(&c.encode(), (i * RECORD) as u64) {
            self.release(i);
            return Err(e);
        }
        Ok(Slot {
            journal: self,
            index: i,
        })
    }

    /// Records that the change in slot `i` is complete. If the slot cannot
    /// be cleared it stays taken (the next start reseals it: harmless).
    fn done(&self, i: usize) {
        match self.file.write_all_at(&[0u8; RECORD], (i * RECORD) as u64) {
            Ok(()) => self.release(i),
            Err(e) => tracing::warn!(error = %e, "cannot clear a slot of the in-flight journal"),
        }
    }

    fn release(&self, i: usize) {
        self.free.lock().push(i);
        self.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_in_progress_is_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("INFLIGHT");
        let (j, left) = Inflight::open(&p).unwrap();
        assert!(left.is_empty());
        j.clear().unwrap();
        let a = Change {
            id: 77,
            replica: 1,
            first: 3,
            end: 9,
        };
        let b = Change {
            id: u64::MAX,
            replica: 0,
            first: 0,
            end: 1,
        };
        let sa = j.begin(a).unwrap();
        let sb = j.begin(b).unwrap();
        drop(sa);
        std::mem::forget(sb); // "killed" before it finished
        drop(j);
        let (j, left) = Inflight::open(&p).unwrap();
        assert_eq!(left, vec![b]);
        j.clear().unwrap();
        let (_, left) = Inflight::open(&p).unwrap();
        assert!(left.is_empty());
    }

    #[test]
    fn garbage_is_not_a_change() {
        assert_eq!(Change::decode(&[0xff; RECORD]), None);
        assert_eq!(Change::decode(&[0; 3]), None);
    }
}
