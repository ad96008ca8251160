//! Block data: one sparse extent file per file id, with a checksum per 4 KiB.
//!
//! File `id`'s blocks held by this server live in `blocks/<fanout>/<id>`,
//! where `<fanout>` is two hex digits of a hash of the id (ids of one server
//! share their residue mod k, so the id's low bits would not spread them).
//! Block `i` sits at [`morris_proto::layout::Layout::local_offset`]; holes read
//! as zeros and take no space. A bounded LRU keeps recently used files open.
//!
//! Every extent file has a sums file beside it ([`sums`]: a CRC-32C per
//! 4 KiB chunk). Every read checks the chunks it returns and answers
//! [`ErrorCode::Corrupt`] for a chunk that fails (noted for repair, see
//! [`Blocks::take_damage`]); every change writes the data, then the sums of
//! the chunks it touched, inside a slot of the in-flight journal
//! ([`inflight`]) so that a server killed in between reseals exactly those
//! chunks when it starts. Changes to the same chunks are serialized by a
//! small table of region locks; reads take no lock and look again under it
//! only when a chunk fails.
//!
//! Every method may block on the disk: call it from a blocking thread.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hash};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use morris_proto::{ErrorCode, FileId, WireError};
use parking_lot::{Mutex, MutexGuard};
use tracing::{error, info, warn};

use crate::store::Store;

mod inflight;
pub mod sums;

use inflight::{Change, Inflight};
use sums::{CHUNK, ENTRY};

/// Open files kept by default.
pub const DEFAULT_OPEN_FILES: usize = 512;

/// Region locks (changes to chunks of one region are serialized).
const LOCKS: usize = 256;
/// Chunks per region lock (1 MiB).
const REGION_CHUNKS: u64 = 256;
/// Damaged extent files remembered for repair at most.
const MAX_DAMAGE: usize = 65_536;
/// Written once every extent file has its sums (checksums format 1).
const SEALED_MARKER: &str = "SUMS-1";
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

/// An open extent file and its sums file.
struct Extent {
    data: File,
    sums: File,
}

struct Lru {
    files: HashMap<Key, (Arc<Extent>, u64)>,
    order: BTreeMap<u64, Key>,
    clock: u64,
    cap: usize,
}

impl Lru {
    fn get(&mut self, id: Key) -> Option<Arc<Extent>> {
        let (f, stamp) = self.files.get_mut(&id)?;
        self.order.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.order.insert(self.clock, id);
        Some(f.clone())
    }

    /// Inserts `f` unless another thread got there first; returns the one kept.
    fn insert(&mut self, id: Key, f: Arc<Extent>) -> Arc<Extent> {
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

/// Checksum counters of one server (since it started).
#[derive(Debug, Default)]
pub struct SumStats {
    /// Chunks found not to match their checksum (each finding counts).
    pub bad_chunks: AtomicU64,
    /// Bytes checked by reads and scrubs.
    pub checked_bytes: AtomicU64,
    /// Chunks resealed at start after a change was cut short.
    pub resealed_chunks: AtomicU64,
}

/// The extent files of one server.
pub struct Blocks {
    root: PathBuf,
    open: Mutex<Lru>,
    journal: Inflight,
    locks: Vec<Mutex<()>>,
    creating: Vec<Mutex<()>>,
    hasher: foldhash::fast::FixedState,
    damage: Mutex<BTreeMap<Key, u64>>,
    damage_found: Arc<tokio::sync::Notify>,
    /// Files whose extent files were removed; their records go once the
    /// removals are durable ([`Blocks::settle_deletes`]).
    deleted: Mutex<Vec<FileId>>,
    stats: SumStats,
}

impl Blocks {
    /// Opens (creating) the block directory `root` with its fan-out
    /// directories, and reseals the chunks of changes a previous run left
    /// in progress.
    pub fn open(root: &Path, open_files: usize) -> io::Result<Blocks> {
        std::fs::create_dir_all(root)?;
        for i in 0..=255u8 {
            std::fs::create_dir_all(root.join(format!("{i:02x}")))?;
        }
        let (journal, left) = Inflight::open(&root.join("INFLIGHT"))?;
        let blocks = Blocks {
            root: root.to_path_buf(),
            open: Mutex::new(Lru {
                files: HashMap::new(),
                order: BTreeMap::new(),
                clock: 0,
                cap: open_files.max(1),
            }),
            journal,
            locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
            creating: (0..LOCKS).map(|_| Mutex::new(())).collect(),
            hasher: foldhash::fast::FixedState::with_seed(0x6d6f_7272_6973),
            damage: Mutex::new(BTreeMap::new()),
            damage_found: Arc::new(tokio::sync::Notify::new()),
            deleted: Mutex::new(Vec::new()),
            stats: SumStats::default(),
        };
        for c in &left {
            let n = blocks.reseal(c)?;
            blocks.stats.resealed_chunks.fetch_add(n, Ordering::Relaxed);
            warn!(
                id = c.id,
                copy = c.replica,
                chunks = n,
                "a change was cut short (the server was killed): its chunks' checksums taken from the data"
            );
        }
        blocks.journal.clear()?;
        Ok(blocks)
    }

    /// The checksum counters.
    pub fn sum_stats(&self) -> &SumStats {
        &self.stats
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

    /// Where the sums of copy `replica` of file `id` live.
    pub fn sums_path_of(&self, id: FileId, replica: u8) -> PathBuf {
        let mut p = self.path_of(id, replica).into_os_string();
        p.push(".sum");
        PathBuf::from(p)
    }

    fn open_sums(&self, id: FileId, replica: u8, fresh: bool) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(fresh)
            .mode(0o600)
            .open(self.sums_path_of(id, replica))
    }

    /// The open extent file of copy `replica` of `id`, or `None` if it does
    /// not exist. (A missing sums file is made empty: every chunk that is
    /// not zeros then fails, and is repaired from another copy.)
    fn existing(&self, id: FileId, replica: u8) -> Result<Option<Arc<Extent>>, WireError> {
        if let Some(f) = self.open.lock().get((id, replica)) {
            return Ok(Some(f));
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path_of(id, replica))
        {
            Ok(data) => {
                let sums = self
                    .open_sums(id, replica, false)
                    .map_err(|e| io_err(&format!("open checksums of file {id}"), &e))?;
                let ext = Arc::new(Extent { data, sums });
                Ok(Some(self.open.lock().insert((id, replica), ext)))
            }
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
    ) -> Result<(Arc<Extent>, bool), WireError> {
        if let Some(f) = self.existing(id, replica)? {
            return Ok((f, false));
        }
        let _creating = self.creating[self.lock_index((id, replica), 0)].lock();
        if let Some(f) = self.existing(id, replica)? {
            return Ok((f, false));
        }
        // Recorded before it exists, so a crash cannot leave an unknown file.
        store.add_data_file(id)?;
        // Sums first, emptied: one left by a delete cut short is not this
        // file's.
        let what = format!("create data of file {id}");
        let sums = self
            .open_sums(id, replica, true)
            .map_err(|e| io_err(&what, &e))?;
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path_of(id, replica))
            .map_err(|e| io_err(&what, &e))?;
        let ext = Arc::new(Extent { data, sums });
        Ok((self.open.lock().insert((id, replica), ext), true))
    }

    fn lock_index(&self, key: Key, region: u64) -> usize {
        let mut h = self.hasher.build_hasher();
        (key, region).hash(&mut h);
        (std::hash::Hasher::finish(&h) % LOCKS as u64) as usize
    }

    /// Locks the regions of chunks `[first, end)` of `key`, in one global
    /// order (so two changes never wait for each other crosswise).
    fn lock_chunks(&self, key: Key, first: u64, end: u64) -> Vec<MutexGuard<'_, ()>> {
        let (r0, r1) = (
            first / REGION_CHUNKS,
            end.max(first + 1).div_ceil(REGION_CHUNKS),
        );
        let mut idx: Vec<usize> = if r1 - r0 >= LOCKS as u64 {
            (0..LOCKS).collect()
        } else {
            (r0..r1).map(|r| self.lock_index(key, r)).collect()
        };
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.locks[i].lock()).collect()
    }

    fn begin(
        &self,
        id: FileId,
        replica: u8,
        first: u64,
        end: u64,
    ) -> Result<inflight::Slot<'_>, WireError> {
        self.journal
            .begin(Change {
                id,
                replica,
                first,
                end,
            })
            .map_err(|e| io_err("record a change in progress", &e))
    }

    /// Notes that chunk `chunk` of copy `replica` of `id` failed its
    /// checksum, and returns the error for the caller.
    fn damaged(&self, id: FileId, replica: u8, chunk: u64) -> WireError {
        self.stats.bad_chunks.fetch_add(1, Ordering::Relaxed);
        let at = chunk * CHUNK;
        error!(
            id,
            copy = replica,
            offset = at,
            "data failed its checksum on this server's disk; not served"
        );
        let mut d = self.damage.lock();
        if d.len() < MAX_DAMAGE || d.contains_key(&(id, replica)) {
            let e = d.entry((id, replica)).or_insert(at);
            *e = (*e).min(at);
        }
        self.damage_found.notify_one();
        WireError::new(
            ErrorCode::Corrupt,
            format!("file {id}, copy {replica}: the chunk at byte {at} of this server's extent file failed its checksum"),
        )
    }

    /// Woken when damage is noted ([`Blocks::take_damage`]).
    pub fn damage_found(&self) -> Arc<tokio::sync::Notify> {
        self.damage_found.clone()
    }

    /// True if the chunk holding byte `at` of copy `replica` of `id` still
    /// fails its checksum (it may have been rewritten, or fetched again,
    /// since it was noted). Notes nothing; an error counts as still bad.
    pub fn still_damaged(&self, id: FileId, replica: u8, at: u64) -> bool {
        let Ok(Some(f)) = self.existing(id, replica) else {
            return false;
        };
        let c = sums::chunk_of(at);
        let _l = self.lock_chunks((id, replica), c, c + 1);
        match self.read_checked(&f, id, c, CHUNK as usize) {
            Ok((_, bad)) => !bad.is_empty(),
            Err(_) => true,
        }
    }

    /// The extent files found damaged since the last call, as (file, copy,
    /// lowest damaged byte of the extent file).
    pub fn take_damage(&self) -> Vec<(FileId, u8, u64)> {
        std::mem::take(&mut *self.damage.lock())
            .into_iter()
            .map(|((id, r), at)| (id, r, at))
            .collect()
    }

    /// Reads up to `len` bytes at `pos` of `id`'s extent file; stops early at
    /// its end (a missing file reads as empty). `Corrupt` if a chunk fails
    /// its checksum.
    pub fn read(&self, id: FileId, replica: u8, pos: u64, len: usize) -> Result<Bytes, WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(Bytes::new());
        };
        if len == 0 {
            return Ok(Bytes::new());
        }
        let (first, end) = sums::chunks(pos, len as u64);
        let start = first * CHUNK;
        let span = ((end - first) * CHUNK) as usize;
        let (mut buf, bad) = self.read_checked(&f, id, first, span)?;
        if let Some(&c) = bad.first() {
            // A change to these chunks may have been under way: look again
            // once it is done.
            let _l = self.lock_chunks((id, replica), first, end);
            let (again, bad) = self.read_checked(&f, id, first, span)?;
            if let Some(&c) = bad.first() {
                return Err(self.damaged(id, replica, c));
            }
            tracing::debug!(
                id,
                chunk = c,
                "checksum raced a change; fine on a second look"
            );
            buf = again;
        }
        let from = ((pos - start) as usize).min(buf.len());
        let to = (from + len).min(buf.len());
        Ok(buf.slice(from..to))
    }

    /// Reads `span` bytes from chunk `first` on (stopping at the end of the
    /// file) and checks them; every chunk that fails, in order.
    fn read_checked(
        &self,
        f: &Extent,
        id: FileId,
        first: u64,
        span: usize,
    ) -> Result<(Bytes, Vec<u64>), WireError> {
        let buf = read_upto(&f.data, first * CHUNK, span)
            .map_err(|e| io_err(&format!("read data of file {id}"), &e))?;
        let n = (buf.len() as u64).div_ceil(CHUNK) as usize;
        let expected = sums::read_entries(&f.sums, first, n)
            .map_err(|e| io_err(&format!("read checksums of file {id}"), &e))?;
        self.stats
            .checked_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        let bad = sums::mismatches(&buf, first, &expected);
        Ok((buf, bad))
    }

    /// The bytes of chunk `c` as they are now (up to the end of the file),
    /// checked against its entry.
    fn chunk_checked(
        &self,
        f: &Extent,
        id: FileId,
        replica: u8,
        c: u64,
    ) -> Result<Vec<u8>, WireError> {
        let old = read_upto(&f.data, c * CHUNK, CHUNK as usize)
            .map_err(|e| io_err(&format!("read data of file {id}"), &e))?;
        if !old.is_empty() {
            let e = sums::read_entries(&f.sums, c, 1)
                .map_err(|e| io_err(&format!("read checksums of file {id}"), &e))?;
            if sums::entry(&old) != e[0] {
                return Err(self.damaged(id, replica, c));
            }
        }
        Ok(old.to_vec())
    }

    /// Writes `data` at `pos` of `id`'s extent file; with `sync`, flushes it
    /// (and a new file's directory entry) to stable storage first. A chunk
    /// the write covers only in part is checked first: `Corrupt` if it fails
    /// (its good bytes must come from another copy, not be sealed anew).
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
        if !data.is_empty() {
            self.write_summed(&f, id, replica, pos, data)?;
        }
        if sync {
            let what = format!("flush data of file {id}");
            let started = std::time::Instant::now();
            f.data.sync_data().map_err(|e| io_err(&what, &e))?;
            f.sums.sync_data().map_err(|e| io_err(&what, &e))?;
            metrics::histogram!("morris_server_fsync_seconds")
                .record(started.elapsed().as_secs_f64());
            if created {
                self.sync_dir(id)?;
            }
        }
        Ok(())
    }

    fn write_summed(
        &self,
        f: &Extent,
        id: FileId,
        replica: u8,
        pos: u64,
        data: &[u8],
    ) -> Result<(), WireError> {
        let len = data.len() as u64;
        let (first, end) = sums::chunks(pos, len);
        let _l = self.lock_chunks((id, replica), first, end);
        let mut entries = Vec::with_capacity((end - first) as usize);
        for c in first..end {
            let (cs, ce) = (c * CHUNK, (c + 1) * CHUNK);
            if pos <= cs && pos + len >= ce {
                let at = (cs - pos) as usize;
                entries.push(sums::entry(&data[at..at + CHUNK as usize]));
                continue;
            }
            // Covered in part: the chunk as it is, with the new bytes over it.
            let mut chunk = self.chunk_checked(f, id, replica, c)?;
            let (from, to) = (pos.max(cs), (pos + len).min(ce));
            let need = (to - cs) as usize;
            if chunk.len() < need {
                chunk.resize(need, 0);
            }
            chunk[(from - cs) as usize..need]
                .copy_from_slice(&data[(from - pos) as usize..(to - pos) as usize]);
            entries.push(sums::entry(&chunk));
        }
        self.changing(f, id, replica, (first, end), || {
            f.data
                .write_all_at(data, pos)
                .map_err(|e| io_err(&format!("write data of file {id}"), &e))?;
            sums::write_entries(&f.sums, first, &entries)
                .map_err(|e| io_err(&format!("write checksums of file {id}"), &e))
        })
    }

    /// Runs `change` of chunks `[first, end)` of `f` inside a slot of the
    /// in-flight journal. If it fails half way (a full disk), the chunks'
    /// sums are taken from the data as it is then (or, failing that too,
    /// the slot is left for the next start to reseal): an unanswered
    /// change may leave old or new bytes, never a false checksum failure.
    fn changing<T>(
        &self,
        f: &Extent,
        id: FileId,
        replica: u8,
        (first, end): (u64, u64),
        change: impl FnOnce() -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let slot = self.begin(id, replica, first, end)?;
        match change() {
            Ok(v) => Ok(v),
            Err(e) => {
                match reseal_files(&f.data, &f.sums, first, end) {
                    Ok(_) => drop(slot),
                    Err(re) => {
                        warn!(id, copy = replica, error = %re, "cannot reseal a failed change now; the next start will");
                        std::mem::forget(slot);
                    }
                }
                Err(e)
            }
        }
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
        let cur = f.data.metadata().map_err(|e| io_err(&what, &e))?.len();
        if len >= cur {
            return Ok(());
        }
        let (first, end) = (sums::chunk_of(len), cur.div_ceil(CHUNK));
        let _l = self.lock_chunks((id, replica), first, end);
        let tail = if !len.is_multiple_of(CHUNK) {
            let mut chunk = self.chunk_checked(&f, id, replica, first)?;
            chunk.truncate((len % CHUNK) as usize);
            Some(sums::entry(&chunk))
        } else {
            None
        };
        self.changing(&f, id, replica, (first, end), || {
            f.data.set_len(len).map_err(|e| io_err(&what, &e))?;
            if let Some(e) = tail {
                sums::write_entries(&f.sums, first, &[e]).map_err(|e| io_err(&what, &e))?;
            }
            f.sums
                .set_len(len.div_ceil(CHUNK) * ENTRY)
                .map_err(|e| io_err(&what, &e))
        })
    }

    /// Frees `len` bytes at `pos` of copy `replica` of `id` (they read as
    /// zeros again; the file keeps its length). A missing file is fine.
    pub fn punch(&self, id: FileId, replica: u8, pos: u64, len: u64) -> Result<(), WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(());
        };
        let (off, n) = off_range(pos, len)?;
        if len == 0 {
            return Ok(());
        }
        let what = format!("free data of file {id}");
        let cur = f.data.metadata().map_err(|e| io_err(&what, &e))?.len();
        // Space reserved past the end (`allocate` keeps the length) is not
        // freed by a punch there (ext4 punches up to the end only): the
        // extent file is first made long enough to hold what the range
        // has reserved, which reads as zeros either way.
        let grow_to = match pos.checked_add(len) {
            Some(to) if to > cur => reserved_end(&f.data, pos.max(cur), to)
                .map_err(|e| io_err(&what, &e))?
                .filter(|&g| g > cur),
            _ => None,
        };
        let cur = grow_to.unwrap_or(cur);
        let (first, end) = sums::chunks(pos, len);
        let end = end.min(cur.div_ceil(CHUNK));
        let _l = self.lock_chunks((id, replica), first, end.max(first + 1));
        // The chunks at either end, if covered in part: checked before.
        let partial: Vec<u64> = [first, end.saturating_sub(1)]
            .into_iter()
            .filter(|&c| c < end && !(pos <= c * CHUNK && pos + len >= (c + 1) * CHUNK))
            .collect();
        for &c in &partial {
            self.chunk_checked(&f, id, replica, c)?;
        }
        self.changing(&f, id, replica, (first, end), || {
            if let Some(g) = grow_to {
                f.data.set_len(g).map_err(|e| io_err(&what, &e))?;
            }
            // SAFETY: `f.data` is an open descriptor for the duration of the call.
            let r = unsafe {
                libc::fallocate(
                    std::os::fd::AsRawFd::as_raw_fd(&f.data),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    n,
                )
            };
            if r != 0 {
                return Err(io_err(&what, &io::Error::last_os_error()));
            }
            // Whole chunks are zeros now (entry 0), in pieces of 1 MiB of entries.
            let mut c = first;
            while c < end {
                let upto = (c + 256 * 1024).min(end);
                let mut entries = vec![0u32; (upto - c) as usize];
                for &p in &partial {
                    if (c..upto).contains(&p) {
                        let now = read_upto(&f.data, p * CHUNK, CHUNK as usize)
                            .map_err(|e| io_err(&what, &e))?;
                        entries[(p - c) as usize] = sums::entry(&now);
                    }
                }
                sums::write_entries(&f.sums, c, &entries).map_err(|e| io_err(&what, &e))?;
                c = upto;
            }
            Ok(())
        })
    }

    /// The first byte at or after `pos` of copy `replica` of `id` that is
    /// data (`hole: false`; `None` if there is none) or a hole (`hole:
    /// true`; the end of the extent file counts, and a missing file is
    /// all hole), by the file system's `SEEK_DATA` / `SEEK_HOLE`.
    pub fn seek(
        &self,
        id: FileId,
        replica: u8,
        pos: u64,
        hole: bool,
    ) -> Result<Option<u64>, WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(if hole { Some(pos) } else { None });
        };
        let Ok(at) = libc::off_t::try_from(pos) else {
            return Ok(if hole { Some(pos) } else { None });
        };
        let whence = if hole {
            libc::SEEK_HOLE
        } else {
            libc::SEEK_DATA
        };
        // SAFETY: `f.data` is an open descriptor for the duration of the
        // call; the file's offset is not used by anything else (reads and
        // writes are positional).
        let r = unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&f.data), at, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // At or past the end: no data, and a hole.
            Some(libc::ENXIO) => Ok(if hole { Some(pos) } else { None }),
            _ => Err(io_err(&format!("seek in data of file {id}"), &e)),
        }
    }

    /// Reserves `len` bytes at `pos` of copy `replica` of `id` (created if
    /// missing), without changing its length: later writes there cannot
    /// fail for want of space. What was not written reads as zeros, as a
    /// hole does, so the checksums stand.
    pub fn allocate(
        &self,
        id: FileId,
        replica: u8,
        pos: u64,
        len: u64,
        store: &Store,
    ) -> Result<(), WireError> {
        let (off, n) = off_range(pos, len)?;
        if len == 0 {
            return Ok(());
        }
        let (f, _) = self.create(id, replica, store)?;
        // SAFETY: `f.data` is an open descriptor for the duration of the call.
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f.data),
                libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        };
        if r != 0 {
            return Err(io_err(
                &format!("reserve space for file {id}"),
                &io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Removes every extent file of `id` (the volume keeps `copies` copies).
    /// Its record goes later, once the removal is durable
    /// ([`Blocks::settle_deletes`]): a power loss in between leaves a
    /// recorded extent file (garbage `fsck` reclaims), never an unrecorded
    /// one.
    pub fn delete(&self, id: FileId, copies: u8) -> Result<(), WireError> {
        for r in 0..copies.min(MAX_REPLICAS) {
            self.open.lock().remove((id, r));
            // Data first: sums without data are ignored (and emptied when
            // the file is made again), data without sums would fail.
            for p in [self.path_of(id, r), self.sums_path_of(id, r)] {
                match std::fs::remove_file(p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&format!("remove data of file {id}"), &e)),
                }
            }
        }
        self.deleted.lock().push(id);
        Ok(())
    }

    /// True if removals wait for [`Blocks::settle_deletes`].
    pub fn has_deletes(&self) -> bool {
        !self.deleted.lock().is_empty()
    }

    /// Makes the removals of [`Blocks::delete`] durable (one flush per
    /// block directory they touched, however many files) and then forgets
    /// the removed files in `store`, except those made again meanwhile
    /// (cache mode reuses ids). Returns how many were forgotten.
    pub fn settle_deletes(&self, store: &Store) -> Result<usize, WireError> {
        let ids = std::mem::take(&mut *self.deleted.lock());
        if ids.is_empty() {
            return Ok(0);
        }
        let back = |ids: Vec<FileId>| self.deleted.lock().extend(ids);
        let dirs: std::collections::BTreeSet<u8> = ids.iter().map(|&id| fanout(id)).collect();
        for d in dirs {
            let dir = self.root.join(format!("{d:02x}"));
            if let Err(e) = File::open(&dir).and_then(|f| f.sync_all()) {
                back(ids);
                return Err(io_err("flush block directory", &e));
            }
        }
        // No file of these ids is made while their fate is decided.
        let mut idx: Vec<usize> = ids
            .iter()
            .flat_map(|&id| (0..MAX_REPLICAS).map(move |r| (id, r)))
            .map(|k| self.lock_index(k, 0))
            .collect();
        idx.sort_unstable();
        idx.dedup();
        let _creating: Vec<_> = idx.into_iter().map(|i| self.creating[i].lock()).collect();
        let gone: Vec<FileId> = ids
            .iter()
            .copied()
            .filter(|&id| (0..MAX_REPLICAS).all(|r| !self.path_of(id, r).exists()))
            .collect();
        if let Err(e) = store.remove_data_files(&gone) {
            back(ids);
            return Err(e);
        }
        Ok(gone.len())
    }

    /// Flushes every extent file of `id` (of `copies` copies), its sums and
    /// its directory entry.
    pub fn sync_file(&self, id: FileId, copies: u8) -> Result<(), WireError> {
        let mut any = false;
        for r in 0..copies.min(MAX_REPLICAS) {
            if let Some(f) = self.existing(id, r)? {
                let what = format!("flush data of file {id}");
                let started = std::time::Instant::now();
                f.data.sync_all().map_err(|e| io_err(&what, &e))?;
                f.sums.sync_all().map_err(|e| io_err(&what, &e))?;
                metrics::histogram!("morris_server_fsync_seconds")
                    .record(started.elapsed().as_secs_f64());
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
            if let Some(bytes) = self.allocated_copy(id, r)? {
                total = Some(total.unwrap_or(0u64).saturating_add(bytes));
            }
        }
        Ok(total)
    }

    /// Bytes allocated on disk for copy `replica`'s extent file of `id`;
    /// `None` if there is none.
    pub fn allocated_copy(&self, id: FileId, replica: u8) -> Result<Option<u64>, WireError> {
        match std::fs::metadata(self.path_of(id, replica)) {
            Ok(m) => Ok(Some(m.blocks().saturating_mul(512))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&format!("stat data of file {id}"), &e)),
        }
    }

    /// The length of copy `replica`'s extent file of `id` (0 if there is
    /// none) and the checksum entries of its chunks `first..`, at most
    /// `max`, none for a chunk that starts at or past that length.
    pub fn chunk_sums(
        &self,
        id: FileId,
        replica: u8,
        first: u64,
        max: u32,
    ) -> Result<(u64, Vec<u32>), WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok((0, Vec::new()));
        };
        let len = f
            .data
            .metadata()
            .map_err(|e| io_err(&format!("stat data of file {id}"), &e))?
            .len();
        let n = len
            .div_ceil(CHUNK)
            .saturating_sub(first)
            .min(u64::from(max)) as usize;
        let entries = sums::read_entries(&f.sums, first, n)
            .map_err(|e| io_err(&format!("read checksums of file {id}"), &e))?;
        Ok((len, entries))
    }

    /// Reads every chunk of copy `replica` of `id` and checks it; each
    /// chunk that fails is noted for repair. `progress` is told the bytes
    /// of each piece read and says whether to go on. Returns the chunks
    /// that failed.
    pub fn verify_file(
        &self,
        id: FileId,
        replica: u8,
        mut progress: impl FnMut(u64) -> bool,
    ) -> Result<u64, WireError> {
        let Some(f) = self.existing(id, replica)? else {
            return Ok(0);
        };
        let what = format!("read data of file {id}");
        let len = f.data.metadata().map_err(|e| io_err(&what, &e))?.len();
        let span = (REGION_CHUNKS * CHUNK) as usize;
        let (mut at, mut bad) = (0u64, 0u64);
        while at < len {
            let first = at / CHUNK;
            let (buf, mut failed) = self.read_checked(&f, id, first, span)?;
            if !failed.is_empty() {
                // Look again once a change under way is done.
                let _l = self.lock_chunks((id, replica), first, first + REGION_CHUNKS);
                failed = self.read_checked(&f, id, first, span)?.1;
            }
            for c in &failed {
                self.damaged(id, replica, *c);
            }
            bad += failed.len() as u64;
            let n = buf.len() as u64;
            if n == 0 || !progress(n) {
                break;
            }
            at += n;
        }
        Ok(bad)
    }

    /// Takes the checksums of chunks `[c.first, c.end)` of a change cut
    /// short from the data as it is; returns the chunks resealed.
    fn reseal(&self, c: &Change) -> io::Result<u64> {
        let data = match File::open(self.path_of(c.id, c.replica)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let sums = self.open_sums(c.id, c.replica, false)?;
        let n = reseal_files(&data, &sums, c.first, c.end)?;
        sums.sync_all()?;
        Ok(n)
    }

    /// Gives every extent file made before checksums existed its sums (a
    /// volume upgraded to protocol 14: each file's data is read once). Runs
    /// before the server serves; a marker file says it is done.
    pub fn seal_unsealed(&self, store: &Store) -> Result<(), WireError> {
        let marker = self.root.join(SEALED_MARKER);
        if marker.exists() {
            return Ok(());
        }
        let (mut files, mut bytes, mut after) = (0u64, 0u64, 0);
        loop {
            let ids = store.scan_data_files(after, 1024)?;
            let Some(&last) = ids.last() else { break };
            after = last;
            for id in ids {
                for r in 0..MAX_REPLICAS {
                    let sums = self.sums_path_of(id, r);
                    if sums.exists() {
                        continue;
                    }
                    let data = match File::open(self.path_of(id, r)) {
                        Ok(f) => f,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io_err(&format!("open data of file {id}"), &e)),
                    };
                    bytes += seal_file(&data, &sums)
                        .map_err(|e| io_err(&format!("checksum data of file {id}"), &e))?;
                    files += 1;
                    if files % 1000 == 0 {
                        info!(
                            files,
                            bytes, "sealing the data of an older volume with checksums"
                        );
                    }
                }
            }
        }
        self.sync_all()?;
        File::create(&marker)
            .and_then(|f| f.sync_all())
            .and_then(|()| File::open(&self.root))
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("write the checksum marker", &e))?;
        if files > 0 {
            info!(files, bytes, "every extent file now has checksums");
        }
        Ok(())
    }
}

/// Takes the sums of chunks `[first, end)` from `data` as it is (and cuts
/// the sums past its end); returns the chunks resealed.
fn reseal_files(data: &File, sums: &File, first: u64, end: u64) -> io::Result<u64> {
    let len = data.metadata()?.len();
    let last = len.div_ceil(CHUNK);
    let mut n = 0;
    let mut at = first;
    while at < end.min(last) {
        let upto = (at + REGION_CHUNKS).min(end).min(last);
        let buf = read_upto(data, at * CHUNK, ((upto - at) * CHUNK) as usize)?;
        sums::write_entries(sums, at, &sums::entries_of(&buf))?;
        n += upto - at;
        at = upto;
    }
    if sums.metadata()?.len() > last * ENTRY {
        sums.set_len(last * ENTRY)?;
    }
    Ok(n)
}

/// Writes the sums of `data` to `sums` (through a temporary file renamed
/// into place, so a crash leaves none or all); returns the bytes read.
fn seal_file(data: &File, sums: &Path) -> io::Result<u64> {
    let mut tmp = sums.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let len = data.metadata()?.len();
    let piece = (REGION_CHUNKS * CHUNK) as usize;
    let mut at = 0u64;
    while at < len {
        let buf = read_upto(data, at, piece)?;
        if buf.is_empty() {
            break;
        }
        sums::write_entries(&out, at / CHUNK, &sums::entries_of(&buf))?;
        at += buf.len() as u64;
    }
    out.sync_all()?;
    std::fs::rename(&tmp, sums)?;
    Ok(at)
}

/// Reads up to `len` bytes at `pos` of `f`, fewer at its end.
fn read_upto(f: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    // Read into uninitialized memory: zeroing a block-sized buffer first
    // cost as much CPU as checking its checksums (perf, 1 GiB reads).
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let n = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..len - n];
        let off = libc::off_t::try_from(pos + n as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: pread writes at most `spare.len()` bytes into `spare`,
        // memory this buffer owns and nothing else refers to.
        let r = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(f),
                spare.as_mut_ptr().cast(),
                spare.len(),
                off,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            break;
        }
        // SAFETY: the kernel initialized the `r` bytes after the first `n`
        // (`r` <= `spare.len()`, so within the capacity).
        unsafe { buf.set_len(n + r as usize) };
    }
    Ok(buf.freeze())
}

/// `pos` and `len` as `off_t`s for a system call.
/// The end of the last block `data` has allocated within `from..to`,
/// clipped to `to` (by FIEMAP, which also lists what is reserved past the
/// file's end); `None` if there is none there, or the file system cannot
/// say (no FIEMAP: tmpfs, say).
fn reserved_end(data: &File, from: u64, to: u64) -> io::Result<Option<u64>> {
    let mut end = None;
    for extent in fiemap::Fiemap::new(data) {
        let e = match extent {
            Ok(e) => e,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOTTY)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if e.fe_logical >= to {
            break;
        }
        let e_end = e.fe_logical.saturating_add(e.fe_length).min(to);
        if e_end > from {
            end = Some(e_end);
        }
    }
    Ok(end)
}

fn off_range(pos: u64, len: u64) -> Result<(libc::off_t, libc::off_t), WireError> {
    match (libc::off_t::try_from(pos), libc::off_t::try_from(len)) {
        (Ok(off), Ok(n)) => Ok((off, n)),
        _ => Err(WireError::new(
            ErrorCode::Invalid,
            "range past the largest offset",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_upto_stops_at_the_end_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(&read_upto(&f, 0, 10_000).unwrap()[..], &data[..]);
        assert_eq!(&read_upto(&f, 9_000, 4_096).unwrap()[..], &data[9_000..]);
        assert_eq!(&read_upto(&f, 100, 50).unwrap()[..], &data[100..150]);
        assert!(read_upto(&f, 20_000, 4_096).unwrap().is_empty());
        assert!(read_upto(&f, 0, 0).unwrap().is_empty());
    }

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
        let mk = |n: &str| {
            Arc::new(Extent {
                data: File::create(dir.path().join(n)).unwrap(),
                sums: File::create(dir.path().join(format!("{n}.sum"))).unwrap(),
            })
        };
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

    fn setup() -> (tempfile::TempDir, Blocks, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("m.sqlite")).unwrap();
        let blocks = Blocks::open(&dir.path().join("blocks"), 16).unwrap();
        (dir, blocks, store)
    }

    fn flip(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 0x10;
        f.write_all_at(&b, at).unwrap();
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn reads_back_what_any_mix_of_writes_left() {
        let (_d, b, st) = setup();
        let mut model = vec![0u8; 0];
        let writes: [(u64, usize, u8); 7] = [
            (0, 10_000, 1),
            (5, 3, 2),        // inside one chunk
            (4090, 20, 3),    // across a chunk boundary
            (20_000, 100, 4), // past the end: a hole before it
            (8192, 4096, 5),  // one whole chunk
            (12_000, 9_000, 6),
            (20_099, 4, 7), // a 4-byte append
        ];
        for (pos, len, seed) in writes {
            let data = pattern(len, seed);
            b.write(9, 0, pos, &data, false, &st).unwrap();
            let end = pos as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[pos as usize..end].copy_from_slice(&data);
            let got = b.read(9, 0, 0, model.len() + 50).unwrap();
            assert_eq!(&got[..], &model[..], "after write at {pos}");
        }
        // Unaligned reads inside.
        let got = b.read(9, 0, 4095, 3).unwrap();
        assert_eq!(&got[..], &model[4095..4098]);
        assert_eq!(b.read(9, 0, 1 << 20, 10).unwrap().len(), 0);
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_flipped_byte_is_refused_and_noted() {
        let (_d, b, st) = setup();
        let data = pattern(64 * 1024, 3);
        b.write(5, 1, 0, &data, true, &st).unwrap();
        flip(&b.path_of(5, 1), 40_000);
        let e = b.read(5, 1, 0, data.len()).unwrap_err();
        assert_eq!(e.code, ErrorCode::Corrupt);
        assert_eq!(b.verify_file(5, 1, |_| true).unwrap(), 1);
        assert_eq!(
            b.verify_file(5, 0, |_| true).unwrap(),
            0,
            "no such copy here"
        );
        // Other chunks still read.
        assert_eq!(&b.read(5, 1, 0, 36_864).unwrap()[..], &data[..36_864]);
        assert_eq!(
            b.read(5, 1, 36_864, 10).unwrap_err().code,
            ErrorCode::Corrupt
        );
        assert_eq!(b.take_damage(), vec![(5, 1, 36_864)]);
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 3);
        assert!(b.take_damage().is_empty());
        // A partial write over the bad chunk does not seal it anew...
        assert_eq!(
            b.write(5, 1, 40_001, b"x", false, &st).unwrap_err().code,
            ErrorCode::Corrupt
        );
        assert!(b.still_damaged(5, 1, 40_000));
        assert!(!b.still_damaged(5, 1, 100), "another chunk");
        // ...a whole-chunk write (a repair) does.
        b.write(5, 1, 36_864, &data[36_864..40_960], false, &st)
            .unwrap();
        assert!(!b.still_damaged(5, 1, 40_000));
        assert_eq!(&b.read(5, 1, 0, data.len()).unwrap()[..], &data[..]);
    }

    #[test]
    fn truncate_and_punch_keep_the_sums_right() {
        let (_d, b, st) = setup();
        let data = pattern(50_000, 9);
        b.write(2, 0, 0, &data, false, &st).unwrap();
        b.truncate(2, 0, 30_001).unwrap();
        assert_eq!(&b.read(2, 0, 0, 60_000).unwrap()[..], &data[..30_001]);
        // Growing again past a truncated tail: the gap reads as zeros.
        b.write(2, 0, 45_000, b"end", false, &st).unwrap();
        let got = b.read(2, 0, 0, 60_000).unwrap();
        assert_eq!(&got[..30_001], &data[..30_001]);
        assert!(got[30_001..45_000].iter().all(|&x| x == 0));
        assert_eq!(&got[45_000..], b"end");
        b.punch(2, 0, 1000, 20_000).unwrap();
        let got = b.read(2, 0, 0, 60_000).unwrap();
        assert_eq!(&got[..1000], &data[..1000]);
        assert!(got[1000..21_000].iter().all(|&x| x == 0));
        assert_eq!(&got[21_000..30_001], &data[21_000..30_001]);
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
    }

    /// A reservation past the end of the extent file is given back by a
    /// punch of it (ext4 punches only up to the end), as far as the punch
    /// goes; what was written and what is reserved beyond stay.
    #[test]
    fn a_punch_frees_what_was_reserved_past_the_end() {
        let (d, b, st) = setup();
        let data = pattern(8192, 3);
        b.write(4, 0, 0, &data, false, &st).unwrap();
        b.allocate(4, 0, 1 << 20, 8 << 20, &st).unwrap();
        let before = b.allocated_copy(4, 0).unwrap().unwrap_or(0);
        assert!(
            before >= (8 << 20) + 8192,
            "{before} bytes after the reservation"
        );
        b.punch(4, 0, 1 << 20, 4 << 20).unwrap();
        let after = b.allocated_copy(4, 0).unwrap().unwrap_or(0);
        let on_fiemap_fs = fiemap::Fiemap::new(File::open(b.path_of(4, 0)).unwrap())
            .next()
            .is_some_and(|e| e.is_ok());
        if on_fiemap_fs {
            assert!(
                after <= before - (4 << 20),
                "{after} bytes after punching 4 MiB of {before} ({:?})",
                d.path()
            );
            assert!(
                after >= (4 << 20) + 8192,
                "the rest of the reservation stays"
            );
        }
        let got = b.read(4, 0, 0, 6 << 20).unwrap();
        assert_eq!(&got[..8192], &data[..]);
        assert!(got[8192..].iter().all(|&x| x == 0));
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
        // Writing after the punched range still reads back.
        b.write(4, 0, 7 << 20, b"tail", false, &st).unwrap();
        assert_eq!(&b.read(4, 0, 7 << 20, 4).unwrap()[..], b"tail");
    }

    #[test]
    fn a_change_cut_short_is_resealed_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let st = Store::open(&dir.path().join("m.sqlite")).unwrap();
        let root = dir.path().join("blocks");
        let data = pattern(20_000, 4);
        {
            let b = Blocks::open(&root, 16).unwrap();
            b.write(3, 0, 0, &data, false, &st).unwrap();
            // As if killed between the data and its sums: the data is new,
            // the sums old, and the journal names the chunks.
            let slot = b.begin(3, 0, 1, 3).unwrap();
            b.existing(3, 0)
                .unwrap()
                .unwrap()
                .data
                .write_all_at(&[7u8; 5000], 4096)
                .unwrap();
            assert_eq!(
                b.read(3, 0, 0, 20_000).unwrap_err().code,
                ErrorCode::Corrupt
            );
            std::mem::forget(slot);
        }
        let b = Blocks::open(&root, 16).unwrap();
        assert_eq!(b.sum_stats().resealed_chunks.load(Ordering::Relaxed), 2);
        let got = b.read(3, 0, 0, 20_000).unwrap();
        assert_eq!(&got[4096..9096], &[7u8; 5000][..]);
        assert_eq!(&got[9096..], &data[9096..]);
    }

    #[test]
    fn a_change_that_fails_half_way_leaves_no_false_checksum_failure() {
        let (_d, b, st) = setup();
        let data = pattern(10_000, 2);
        b.write(8, 0, 0, &data, false, &st).unwrap();
        let f = b.existing(8, 0).unwrap().unwrap();
        // As a full disk would: the data half written, the sums not.
        let r: Result<(), WireError> = b.changing(&f, 8, 0, (0, 3), || {
            f.data.write_all_at(&[9u8; 5000], 0).unwrap();
            Err(WireError::new(ErrorCode::NoSpace, "disk full"))
        });
        assert_eq!(r.unwrap_err().code, ErrorCode::NoSpace);
        let got = b.read(8, 0, 0, 10_000).unwrap();
        assert_eq!(&got[..5000], &[9u8; 5000][..]);
        assert_eq!(&got[5000..], &data[5000..]);
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn files_from_before_checksums_are_sealed_once() {
        let dir = tempfile::tempdir().unwrap();
        let st = Store::open(&dir.path().join("m.sqlite")).unwrap();
        let root = dir.path().join("blocks");
        let data = pattern(300_000, 1);
        let b = Blocks::open(&root, 16).unwrap();
        b.write(11, 0, 0, &data, true, &st).unwrap();
        b.write(12, 2, 4096, b"abc", true, &st).unwrap();
        drop(b);
        // An older server: no sums at all.
        std::fs::remove_file(root.join(format!("{:02x}", fanout(11))).join("11.sum")).unwrap();
        std::fs::remove_file(root.join(format!("{:02x}", fanout(12))).join("12.2.sum")).unwrap();
        let b = Blocks::open(&root, 16).unwrap();
        b.seal_unsealed(&st).unwrap();
        assert!(root.join(SEALED_MARKER).exists());
        assert_eq!(&b.read(11, 0, 0, 400_000).unwrap()[..], &data[..]);
        assert_eq!(&b.read(12, 2, 4096, 10).unwrap()[..], b"abc");
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_deleted_files_record_goes_once_the_removal_is_flushed() {
        let (_d, b, st) = setup();
        b.write(40, 0, 0, b"a", false, &st).unwrap();
        b.write(41, 1, 0, b"b", false, &st).unwrap();
        assert_eq!(st.data_file_count(), 2);
        b.delete(40, 2).unwrap();
        b.delete(41, 2).unwrap();
        assert!(!b.path_of(40, 0).exists() && !b.sums_path_of(41, 1).exists());
        assert_eq!(st.data_file_count(), 2, "recorded until settled");
        // Made again before the settling (cache mode reuses ids): kept.
        b.write(41, 0, 0, b"c", false, &st).unwrap();
        assert_eq!(b.settle_deletes(&st).unwrap(), 1);
        assert_eq!(st.scan_data_files(0, 10).unwrap(), vec![41]);
        assert_eq!(&b.read(41, 0, 0, 10).unwrap()[..], b"c");
        assert_eq!(b.settle_deletes(&st).unwrap(), 0);
    }

    #[test]
    fn concurrent_writes_to_one_chunk_leave_it_consistent() {
        let (_d, b, st) = setup();
        let (b, st) = (Arc::new(b), Arc::new(st));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let (b, st) = (b.clone(), st.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        b.write(1, 0, u64::from(t) * 100 + i % 50, &[t; 7], false, &st)
                            .unwrap();
                        b.read(1, 0, 0, 4096).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        b.read(1, 0, 0, 4096).unwrap();
        assert_eq!(b.sum_stats().bad_chunks.load(Ordering::Relaxed), 0);
    }
}
