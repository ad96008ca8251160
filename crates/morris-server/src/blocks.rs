//! Block data: one sparse extent file per file id.
//!
//! File `id`'s blocks held by this server live in `blocks/<fanout>/<id>`,
//! where `<fanout>` is two hex digits of a hash of the id (ids of one server
//! share their residue mod k, so the id's low bits would not spread them).
//! Block `i` sits at [`morris_proto::layout::Layout::local_offset`]; holes read
//! as zeros and take no space. A bounded LRU keeps recently used files open.
//!
//! Every method may block on the disk: call it from a blocking thread.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use morris_proto::{ErrorCode, FileId, WireError};
use parking_lot::Mutex;

use crate::store::Store;

/// Open files kept by default.
pub const DEFAULT_OPEN_FILES: usize = 512;

/// Maps an I/O failure to a wire error (`NoSpace` for a full disk or quota).
pub fn io_err(what: &str, e: &io::Error) -> WireError {
    let code = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorCode::NoSpace,
        Some(libc::EFBIG) => ErrorCode::FileTooBig,
        _ => ErrorCode::Io,
    };
    WireError::new(code, format!("{what}: {e}"))
}

fn fanout(id: FileId) -> u8 {
    // splitmix64 finalizer: every id bit affects the result.
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u8
}

/// One extent file: copy `.1` of file `.0`.
type Key = (FileId, u8);

pub use morris_proto::MAX_REPLICAS;

struct Lru {
    files: HashMap<Key, (Arc<File>, u64)>,
    order: BTreeMap<u64, Key>,
    clock: u64,
    cap: usize,
}

impl Lru {
    fn get(&mut self, id: Key) -> Option<Arc<File>> {
        let (f, stamp) = self.files.get_mut(&id)?;
        self.order.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.order.insert(self.clock, id);
        Some(f.clone())
    }

    /// Inserts `f` unless another thread got there first; returns the one kept.
    fn insert(&mut self, id: Key, f: Arc<File>) -> Arc<File> {
        if let Some(existing) = self.get(id) {
            return existing;
        }
        while self.files.len() >= self.cap {
            let Some((&stamp, &old)) = self.order.iter().next() else {
                break;
            };
            self.order.remove(&stamp);
            self.files.remove(&old);
        }
        self.clock += 1;
        self.order.insert(self.clock, id);
        self.files.insert(id, (f.clone(), self.clock));
        f
    }

    fn remove(&mut self, id: Key) {
        if let Some((_, stamp)) = self.files.remove(&id) {
            self.order.remove(&stamp);
        }
    }
}

/// The extent files of one server.
pub struct Blocks {
    root: PathBuf,
    open: Mutex<Lru>,
}

impl Blocks {
    /// Opens (creating) the block directory `root` with its fan-out directories.
    pub fn open(root: &Path, open_files: usize) -> io::Result<Blocks> {
        std::fs::create_dir_all(root)?;
        for i in 0..=255u8 {
            std::fs::create_dir_all(root.join(format!("{i:02x}")))?;
        }
        Ok(Blocks {
            root: root.to_path_buf(),
            open: Mutex::new(Lru {
                files: HashMap::new(),
                order: BTreeMap::new(),
                clock: 0,
                cap: open_files.max(1),
            }),
        })
    }

    fn dir_of(&self, id: FileId) -> PathBuf {
        self.root.join(format!("{:02x}", fanout(id)))
    }

    /// Where copy `replica` of file `id` lives: `<id>` for the first copy,
    /// `<id>.<replica>` for the others.
    pub fn path_of(&self, id: FileId, replica: u8) -> PathBuf {
        match replica {
            0 => self.dir_of(id).join(id.to_string()),
            r => self.dir_of(id).join(format!("{id}.{r}")),
        }
    }

    /// The open extent file of copy `replica` of `id`, or `None` if it does
    /// not exist.
    fn existing(&self, id: FileId, replica: u8) -> Result<Option<Arc<File>>, WireError> {
        if let Some(f) = self.open.lock().get((id, replica)) {
            return Ok(Some(f));
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path_of(id, replica))
        {
            Ok(f) => Ok(Some(self.open.lock().insert((id, replica), Arc::new(f)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&format!("open data of file {id}"), &e)),
        }
    }

    /// The extent file of `id`, created (and recorded in `store` first) if
    /// missing; the flag tells whether it was created now.
    fn create(
        &self,
        id: FileId,
        replica: u8,
        store: &Store,
    ) -> Result<(Arc<File>, bool), WireError> {
        if let Some(f) = self.existing(id, replica)? {
            return Ok((f, false));
        }
        // Recorded before it exists, so a crash cannot leave an unknown file.
        store.add_data_file(id)?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path_of(id, replica))
            .map_err(|e| io_err(&format!("create data of file {id}"), &e))?;
        Ok((self.open.lock().insert((id, replica), Arc::new(f)), true))
    }

    /// Reads up to `len` bytes at `pos` of `id`'s extent file; stops early at
    /// its end (a missing file reads as empty).
    pub fn read(&self, id: FileId, replica: u8, pos: u64, len: usize) -> Result<Bytes, WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(Bytes::new());
        };
        let mut buf = BytesMut::zeroed(len);
        let mut n = 0;
        while n < len {
            match f.read_at(&mut buf[n..], pos + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&format!("read data of file {id}"), &e)),
            }
        }
        buf.truncate(n);
        Ok(buf.freeze())
    }

    /// Writes `data` at `pos` of `id`'s extent file; with `sync`, flushes it
    /// (and a new file's directory entry) to stable storage first.
    pub fn write(
        &self,
        id: FileId,
        replica: u8,
        pos: u64,
        data: &[u8],
        sync: bool,
        store: &Store,
    ) -> Result<(), WireError> {
        let (f, created) = self.create(id, replica, store)?;
        f.write_all_at(data, pos)
            .map_err(|e| io_err(&format!("write data of file {id}"), &e))?;
        if sync {
            f.sync_data()
                .map_err(|e| io_err(&format!("flush data of file {id}"), &e))?;
            if created {
                self.sync_dir(id)?;
            }
        }
        Ok(())
    }

    fn sync_dir(&self, id: FileId) -> Result<(), WireError> {
        File::open(self.dir_of(id))
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("flush block directory", &e))
    }

    /// Shrinks `id`'s extent file to `len` bytes if it is longer. Never grows
    /// it: bytes past the end read as zeros anyway.
    pub fn truncate(&self, id: FileId, replica: u8, len: u64) -> Result<(), WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(());
        };
        let what = format!("truncate data of file {id}");
        let cur = f.metadata().map_err(|e| io_err(&what, &e))?.len();
        if len < cur {
            f.set_len(len).map_err(|e| io_err(&what, &e))?;
        }
        Ok(())
    }

    /// Frees `len` bytes at `pos` of copy `replica` of `id` (they read as
    /// zeros again; the file keeps its length). A missing file is fine.
    pub fn punch(&self, id: FileId, replica: u8, pos: u64, len: u64) -> Result<(), WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(());
        };
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(pos), libc::off_t::try_from(len)) else {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "range past the largest offset",
            ));
        };
        // SAFETY: `f` is an open descriptor for the duration of the call.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&*f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        };
        if r != 0 {
            return Err(io_err(
                &format!("free data of file {id}"),
                &io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Removes every extent file of `id` (the volume keeps `copies` copies)
    /// and its record.
    pub fn delete(&self, id: FileId, copies: u8, store: &Store) -> Result<(), WireError> {
        for r in 0..copies.min(MAX_REPLICAS) {
            self.open.lock().remove((id, r));
            match std::fs::remove_file(self.path_of(id, r)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&format!("remove data of file {id}"), &e)),
            }
        }
        store.remove_data_file(id)
    }

    /// Flushes every extent file of `id` (of `copies` copies) and its
    /// directory entry.
    pub fn sync_file(&self, id: FileId, copies: u8) -> Result<(), WireError> {
        let mut any = false;
        for r in 0..copies.min(MAX_REPLICAS) {
            if let Some(f) = self.existing(id, r)? {
                f.sync_all()
                    .map_err(|e| io_err(&format!("flush data of file {id}"), &e))?;
                any = true;
            }
        }
        if any {
            self.sync_dir(id)?;
        }
        Ok(())
    }

    /// Flushes the whole file system holding the blocks (`syncfs`).
    pub fn sync_all(&self) -> Result<(), WireError> {
        let d = File::open(&self.root).map_err(|e| io_err("open block directory", &e))?;
        // SAFETY: `d` is an open descriptor for the duration of the call.
        let r = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) };
        if r != 0 {
            return Err(io_err("syncfs", &io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Bytes allocated on disk for `id`'s extent files (of `copies` copies);
    /// `None` if there are none.
    pub fn allocated(&self, id: FileId, copies: u8) -> Result<Option<u64>, WireError> {
        let mut total = None;
        for r in 0..copies.min(MAX_REPLICAS) {
            match std::fs::metadata(self.path_of(id, r)) {
                Ok(m) => {
                    total = Some(
                        total
                            .unwrap_or(0u64)
                            .saturating_add(m.blocks().saturating_mul(512)),
                    )
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&format!("stat data of file {id}"), &e)),
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fanout_spreads_one_servers_ids() {
        // Ids of server 3 of 256: all ≡ 3 mod 256.
        let mut seen = std::collections::HashSet::new();
        for c in 2..2000u64 {
            seen.insert(fanout(c * 256 + 3));
        }
        assert!(seen.len() > 200, "only {} buckets used", seen.len());
    }

    #[test]
    fn lru_evicts_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |n: &str| Arc::new(File::create(dir.path().join(n)).unwrap());
        let mut l = Lru {
            files: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            cap: 2,
        };
        l.insert((1, 0), mk("a"));
        l.insert((2, 0), mk("b"));
        assert!(l.get((1, 0)).is_some());
        l.insert((3, 0), mk("c"));
        assert!(l.get((2, 0)).is_none(), "least recently used was evicted");
        assert!(l.get((1, 0)).is_some());
        assert!(l.get((3, 0)).is_some());
        assert_eq!(l.files.len(), 2);
        assert_eq!(l.order.len(), 2);
        l.remove((1, 0));
        assert_eq!(l.files.len(), 1);
        assert_eq!(l.order.len(), 1);
    }
}
