//! The metadata store: volume descriptor, inodes and directory entries, in SQLite.
//!
//! The database runs in WAL mode with `synchronous=NORMAL`: a commit appends
//! to the write-ahead log with a plain `write`, so a committed transaction
//! survives `kill -9` of the server (the bytes are in the kernel) without an
//! fsync per commit. Power loss may lose the last commits; [`Store::sync`]
//! makes everything committed so far durable by committing one marker row with
//! `synchronous=FULL`, which fsyncs the log (and with it every earlier frame).
//!
//! Tables:
//! * `volume`: one row: descriptor (postcard), this server's index, the id
//!   counter (the next value for [`Layout::allocate_id`]);
//! * `inodes`: id → generation, postcard-encoded [`Inode`], and for
//!   directories the next entry cookie;
//! * `entries`: (dir, name) → cookie, child id, child generation, kind, with a
//!   unique index on (dir, cookie) so a listing continues with an index seek;
//! * `data_files`: the ids of files whose extent file exists on this server
//!   (recorded before the file is created);
//! * `stale_copies`: (file id, server) → lowest stale block, seq: the copies
//!   another server missed while it was away (mirrored volumes; `stale.rs`);
//! * `replies`: outcomes of operations with an id, for exactly-once
//!   repeats (`once.rs`);
//! * `orphans`, `opens`: inodes with no name left and who has them open
//!   (`orphans.rs`);
//! * `id_reserve`: one row, the counter value below which ids may have been
//!   handed out; raised by [`ID_BATCH`] at a time and made durable (fsync)
//!   before an id past the old value is used, so that an id is never given
//!   twice even after power loss (which may lose the counter's last
//!   updates: a store that opens hands out ids from its reservation on).
//!   This server's own: not mirrored.
//! * `fence_reserve`: one row, the number below which the range's write
//!   grants may have been numbered (`fences.rs`); mirrored, so a server
//!   that takes the range over numbers above it.
//!
//! Entry cookies are a hash of the name (`cookies.rs`), so a name keeps its
//! place in listings however often it is replaced or re-created.
//!
//! Every method is synchronous and may block on the disk: call it from a
//! blocking thread. Writes go through one connection; reads use a small pool.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use morris_proto::layout::{Layout, FIRST_COUNTER};
use morris_proto::{
    Attr, DirEntry, ErrorCode, FileId, FileKind, Handle, Inode, SetAttr, Timestamp,
    VolumeDescriptor, WireError, MAX_FILE_SIZE, MAX_NAME_LEN, ROOT_ID,
};
use parking_lot::{Mutex, MutexGuard, RwLock};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

/// Most bytes of encoded entries or inodes one listing reply carries, so a
/// reply stays well below the protocol's header limit.
const REPLY_BUDGET: usize = 768 << 10;
/// Most items one listing reply carries.
const MAX_PAGE: u32 = 4096;

/// Ids reserved at a time (one fsync per this many creates); a store that
/// opens skips what is left of its reservation.
pub const ID_BATCH: u64 = 4096;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS volume (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    descriptor BLOB NOT NULL,
    own_index INTEGER NOT NULL,
    counter INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS inodes (
    id INTEGER PRIMARY KEY,
    gen INTEGER NOT NULL,
    data BLOB NOT NULL,
    next_cookie INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS entries (
    dir INTEGER NOT NULL,
    name BLOB NOT NULL,
    cookie INTEGER NOT NULL,
    child INTEGER NOT NULL,
    gen INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    PRIMARY KEY (dir, name)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_cookie ON entries (dir, cookie);
CREATE TABLE IF NOT EXISTS data_files (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS sync_marker (one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stale_copies (
    id INTEGER NOT NULL,
    server INTEGER NOT NULL,
    from_block INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (id, server)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS stale_by_server ON stale_copies (server, id);
CREATE TABLE IF NOT EXISTS replies (
    client INTEGER NOT NULL,
    op INTEGER NOT NULL,
    at INTEGER NOT NULL,
    outcome BLOB NOT NULL,
    PRIMARY KEY (client, op)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS replies_by_age ON replies (at);
CREATE TABLE IF NOT EXISTS orphans (ino INTEGER PRIMARY KEY, since INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS id_reserve (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    hw INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fence_reserve (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    hw INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS opens (
    ino INTEGER NOT NULL,
    client INTEGER NOT NULL,
    PRIMARY KEY (ino, client)
) WITHOUT ROWID;
";

/// The store format this code reads and writes (`PRAGMA user_version`).
/// Format 1 stores lack tables format 2 added; opening one adds them (the
/// schema is `CREATE ... IF NOT EXISTS`). Format 3 adds `rebuild` (a
/// replacement's mark, `store/rebuild.rs`: a server of format 2 would
/// ignore it and answer zeros for the blocks it lacks). Format 4 may hold
/// inode records that end with their data's measured size (`stored.rs`
/// `MeasuredInode`: format 3 code would drop it). Format 5 may hold
/// records with `chattr` flags (`FlaggedInode`), and counts what each user
/// and group stores (`usage`, kept by triggers: format 4 code would write
/// inodes without counting them). Format 6 keeps cached placeholders'
/// seeds by their entry's cookie (`cache_seeds_at`; format 5 code would
/// find none and answer their names as missing); opening an older store
/// moves them there. A store of a later
/// format is refused: this code could misread it.
pub const STORE_FORMAT: i64 = 6;

/// Refuses inode flags the volume does not keep.
pub(crate) fn check_flags(flags: u32) -> Result<(), WireError> {
    let other = flags & !morris_proto::inode_flags::KEPT;
    if other != 0 {
        return Err(WireError::new(
            ErrorCode::NotSupported,
            format!("inode flags {other:#x} are not kept"),
        ));
    }
    Ok(())
}

/// A failure opening the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused.
    #[error("metadata store {path}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// The cause.
        source: rusqlite::Error,
    },
    /// The stored volume record cannot be decoded.
    #[error("metadata store {path}: corrupt volume record: {message}")]
    Corrupt {
        /// The database file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The store was written by a later morris, in a format this one does
    /// not know.
    #[error(
        "metadata store {path} is in format {found}, written by a later morris; \
         this one reads formats up to {supported}: run the newer binary"
    )]
    TooNew {
        /// The database file.
        path: String,
        /// Its format.
        found: i64,
        /// The latest format this code reads.
        supported: i64,
    },
}

/// What this server knows about its volume once formatted.
#[derive(Debug, Clone, PartialEq)]
pub struct Formatted {
    /// The descriptor.
    pub descriptor: VolumeDescriptor,
    /// This server's index.
    pub index: u32,
    /// The layout derived from the descriptor.
    pub layout: Layout,
}

impl Formatted {
    /// Server `index` of the volume `descriptor` describes.
    pub fn new(descriptor: VolumeDescriptor, index: u32) -> Self {
        let layout = Layout::new(
            descriptor.servers.len() as u32,
            descriptor.stripe_unit,
            u32::from(descriptor.replicas),
        );
        Formatted {
            descriptor,
            index,
            layout,
        }
    }
}

/// The outcome of [`Store::format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatOutcome {
    /// The store was empty and is now formatted.
    Formatted,
    /// The store already held this very descriptor and index.
    AlreadyFormatted,
}

/// `execute` and `query_row` through the connection's statement cache, so
/// that a statement run per request is parsed once, not on every call
/// (parsing was ~5 % of a server's time in a create-and-write loop).
pub(crate) trait Cached {
    /// [`Connection::execute`], cached.
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// [`Connection::query_row`], cached.
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Maps a SQLite failure to a wire error (`NoSpace` for a full disk).
pub fn db_err(e: rusqlite::Error) -> WireError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => {
            WireError::new(ErrorCode::NoSpace, format!("metadata store: {e}"))
        }
        _ => WireError::new(ErrorCode::Io, format!("metadata store: {e}")),
    }
}

/// Ids are stored as SQLite integers (i64) with the same bits.
fn sql_id(id: FileId) -> i64 {
    id as i64
}

fn from_sql_id(v: i64) -> FileId {
    v as u64
}

fn kind_code(k: FileKind) -> i64 {
    match k {
        FileKind::File => 0,
        FileKind::Dir => 1,
        FileKind::Symlink => 2,
        FileKind::Fifo => 3,
        FileKind::Socket => 4,
        FileKind::CharDev => 5,
        FileKind::BlockDev => 6,
    }
}

fn kind_from(code: i64) -> Option<FileKind> {
    Some(match code {
        0 => FileKind::File,
        1 => FileKind::Dir,
        2 => FileKind::Symlink,
        3 => FileKind::Fifo,
        4 => FileKind::Socket,
        5 => FileKind::CharDev,
        6 => FileKind::BlockDev,
        _ => return None,
    })
}

/// Checks a name for storing or looking up.
pub fn check_name(name: &[u8]) -> Result<(), WireError> {
    if name.is_empty() {
        return Err(WireError::new(ErrorCode::Invalid, "empty name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(WireError::new(
            ErrorCode::NameTooLong,
            format!("name of {} bytes (limit {MAX_NAME_LEN})", name.len()),
        ));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(WireError::new(
            ErrorCode::Invalid,
            "name contains '/' or NUL",
        ));
    }
    Ok(())
}

/// Checks a name a new entry would get: as [`check_name`], and not `.` or `..`.
pub fn check_new_name(name: &[u8]) -> Result<(), WireError> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(WireError::new(
            ErrorCode::Invalid,
            "'.' and '..' cannot be linked",
        ));
    }
    Ok(())
}

/// A directory inode loaded inside a write transaction.
struct DirRow {
    inode: Inode,
    next_cookie: u64,
}

/// A stored directory entry row (without its directory).
fn entry_from_row(row: &rusqlite::Row<'_>, name_col: usize) -> rusqlite::Result<DirEntry> {
    let name: Vec<u8> = row.get(name_col)?;
    let cookie: i64 = row.get(name_col + 1)?;
    let child: i64 = row.get(name_col + 2)?;
    let gen: i64 = row.get(name_col + 3)?;
    let kind: i64 = row.get(name_col + 4)?;
    let kind = kind_from(kind).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            name_col + 4,
            rusqlite::types::Type::Integer,
            format!("unknown kind code {kind}").into(),
        )
    })?;
    Ok(DirEntry {
        name,
        child: Handle {
            id: from_sql_id(child),
            gen: gen as u32,
        },
        kind,
        cookie: cookie as u64,
    })
}

/// Approximate encoded size of an entry, for reply budgets.
fn entry_cost(e: &DirEntry) -> usize {
    e.name.len() + 32
}

/// The metadata store of one server.
pub struct Store {
    /// The one connection: this process is the database's only user, so it
    /// holds the lock for good (`locking_mode=EXCLUSIVE`: no file locking per
    /// transaction, WAL index in memory) and reads share the writer's cache.
    write: Mutex<Connection>,
    formatted: RwLock<Option<Arc<Formatted>>>,
    inodes: AtomicU64,
    entries: AtomicU64,
    data_files: AtomicU64,
    /// Change capture for mirroring (`replica.rs`).
    capture: replica::Capture,
    /// Outcomes stored since start (`once.rs` prunes every so many).
    ops_stored: AtomicU64,
    /// The counter value up to which ids are reserved durably.
    reserved: AtomicU64,
    /// The reservation when the store opened: no new id below it.
    first_id: u64,
    /// The fence reservation known to be durable (`fences.rs`).
    fence_reserved_upto: AtomicU64,
    /// The connection's count of changed rows (`total_changes`) right
    /// after the last [`Store::sync`] (`u64::MAX`: none yet): while it is
    /// unchanged, everything committed is on disk already.
    synced_changes: AtomicU64,
    /// Syncs that flushed the database ([`Store::sync`] with something to
    /// make durable).
    #[cfg(test)]
    flushes: AtomicU64,
}

/// A page of a directory listing ([`Store::read_dir_page`]).
#[derive(Debug)]
pub struct DirPage {
    /// The entries, in cookie order.
    pub entries: Vec<DirEntry>,
    /// No entry follows the last one.
    pub eof: bool,
    /// The directory is cached and not yet listed whole from home.
    pub unlisted: bool,
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let shown = path.display().to_string();
        let err = |source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        };
        let write = Connection::open(path).map_err(err)?;
        write
            .execute_batch("PRAGMA locking_mode = EXCLUSIVE;")
            .map_err(err)?;
        let mode: String = write
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt {
                path: shown,
                message: format!("cannot switch to WAL mode (got {mode})"),
            });
        }
        write
            .execute_batch(
                "PRAGMA synchronous = NORMAL;
                 PRAGMA busy_timeout = 10000;
                 PRAGMA cache_size = -32768;",
            )
            .map_err(err)?;
        let found: i64 = write
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        if found > STORE_FORMAT {
            return Err(StoreError::TooNew {
                path: shown,
                found,
                supported: STORE_FORMAT,
            });
        }
        usage::register(&write).map_err(err)?;
        write.execute_batch(SCHEMA).map_err(err)?;
        write.execute_batch(cached::SCHEMA).map_err(err)?;
        write.execute_batch(wb::SCHEMA).map_err(err)?;
        write.execute_batch(xattrs::SCHEMA).map_err(err)?;
        write.execute_batch(rebuild::SCHEMA).map_err(err)?;
        write.execute_batch(usage::SCHEMA).map_err(err)?;
        write.execute_batch(usage::LIMITS_SCHEMA).map_err(err)?;
        if found < 5 {
            // Before the counts were kept: count every inode once.
            write
                .execute_batch(&format!("BEGIN IMMEDIATE; {} COMMIT;", usage::RECOUNT))
                .map_err(err)?;
        }
        let seeds_by_name: bool = write
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'cache_seeds'",
                [],
                |r| r.get(0),
            )
            .map_err(err)?;
        if seeds_by_name {
            write
                .execute_batch(&format!(
                    "BEGIN IMMEDIATE; {} COMMIT;",
                    cached::SEEDS_BY_COOKIE
                ))
                .map_err(err)?;
        }
        if found < STORE_FORMAT {
            write
                .execute_batch(&format!("PRAGMA user_version = {STORE_FORMAT};"))
                .map_err(err)?;
        }
        write.set_prepared_statement_cache_capacity(256);
        let volume: Option<(Vec<u8>, i64)> = write
            .query_row(
                "SELECT descriptor, own_index FROM volume WHERE one = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(err)?;
        let formatted = match volume {
            None => None,
            Some((blob, index)) => {
                let descriptor: VolumeDescriptor =
                    postcard::from_bytes(&blob).map_err(|e| StoreError::Corrupt {
                        path: shown.clone(),
                        message: e.to_string(),
                    })?;
                let index = u32::try_from(index).map_err(|_| StoreError::Corrupt {
                    path: shown.clone(),
                    message: format!("index {index}"),
                })?;
                Some(Arc::new(Formatted::new(descriptor, index)))
            }
        };
        let count = |sql: &str| -> Result<u64, StoreError> {
            let n: i64 = write.query_row(sql, [], |r| r.get(0)).map_err(err)?;
            Ok(n.max(0) as u64)
        };
        let inodes = count("SELECT count(*) FROM inodes")?;
        let entries = count("SELECT count(*) FROM entries")?;
        let data_files = count("SELECT count(*) FROM data_files")?;
        // What is committed now is made durable (it may be a reservation
        // that a `kill -9` cut before its fsync); new ids start at the
        // reservation, as power loss may have lost the counter's last
        // updates (the counter itself is not moved here: on a mirror copy
        // that would make the primary's changes conflict).
        write
            .execute_batch(
                "PRAGMA synchronous = FULL;
                 INSERT INTO sync_marker (one, seq) VALUES (1, 1)
                     ON CONFLICT (one) DO UPDATE SET seq = seq + 1;
                 PRAGMA synchronous = NORMAL;",
            )
            .map_err(err)?;
        let reserved = count("SELECT coalesce(max(hw), 0) FROM id_reserve")?;
        Ok(Store {
            write: Mutex::new(write),
            formatted: RwLock::new(formatted),
            inodes: AtomicU64::new(inodes),
            entries: AtomicU64::new(entries),
            data_files: AtomicU64::new(data_files),
            capture: replica::Capture::default(),
            ops_stored: AtomicU64::new(0),
            reserved: AtomicU64::new(reserved),
            first_id: reserved,
            fence_reserved_upto: AtomicU64::new(0),
            synced_changes: AtomicU64::new(u64::MAX),
            #[cfg(test)]
            flushes: AtomicU64::new(0),
        })
    }

    /// The volume this server belongs to, if formatted.
    pub fn formatted(&self) -> Option<Arc<Formatted>> {
        self.formatted.read().clone()
    }

    /// Inodes stored.
    pub fn inode_count(&self) -> u64 {
        self.inodes.load(Ordering::Relaxed)
    }

    /// Directory entries stored.
    pub fn entry_count(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Files with an extent file recorded here.
    pub fn data_file_count(&self) -> u64 {
        self.data_files.load(Ordering::Relaxed)
    }

    /// The connection, locked. A caller that would have to wait for it
    /// (a snapshot, a checkpoint or an fsync holds it) waits off the async
    /// worker thread it runs on (`block_in_place`: the worker's other tasks,
    /// lease renewals first of all, move to another thread meanwhile).
    /// Store calls run inline on the async workers (`service::metadata`),
    /// so without this a snapshot of a few seconds stopped every worker.
    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        if let Some(g) = self.write.try_lock() {
            return g;
        }
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.write.lock())
            }
            _ => self.write.lock(),
        }
    }

    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        let c = self.conn();
        f(&c)
    }

    fn write_txn<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let mut conn = self.conn();
        self.txn_locked(&mut conn, f)
    }

    /// Runs `f` in an IMMEDIATE transaction on the locked write connection,
    /// capturing its changes when capture is on.
    fn txn_locked<T>(
        &self,
        conn: &mut Connection,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        if self.capture.is_on() {
            return self.captured_txn(conn, f);
        }
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db_err)?;
        let out = f(&tx)?;
        commit(tx)?;
        Ok(out)
    }

    fn layout_and_index(&self) -> Result<(Layout, u32), WireError> {
        match &*self.formatted.read() {
            Some(f) => Ok((f.layout, f.index)),
            None => Err(WireError::new(
                ErrorCode::WrongVolume,
                "this server is not formatted",
            )),
        }
    }

    /// Writes the descriptor and index; creates the root directory (with
    /// generation `root_gen`) if this server owns it.
    pub fn format(
        &self,
        descriptor: &VolumeDescriptor,
        index: u32,
        root_gen: u32,
    ) -> Result<FormatOutcome, WireError> {
        self.format_as(descriptor, index, root_gen, false)
    }

    /// [`Store::format`] for a server taking the place of a lost one
    /// (`Replace`): no root directory (it comes with the metadata copied
    /// from the range's primary), and the rebuild mark set in the same
    /// transaction (`rebuild.rs`).
    pub fn format_replacement(
        &self,
        descriptor: &VolumeDescriptor,
        index: u32,
    ) -> Result<FormatOutcome, WireError> {
        self.format_as(descriptor, index, 0, true)
    }

    fn format_as(
        &self,
        descriptor: &VolumeDescriptor,
        index: u32,
        root_gen: u32,
        replacement: bool,
    ) -> Result<FormatOutcome, WireError> {
        descriptor
            .validate()
            .map_err(|m| WireError::new(ErrorCode::Invalid, m))?;
        if index as usize >= descriptor.servers.len() {
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!(
                    "index {index} out of range for {} servers",
                    descriptor.servers.len()
                ),
            ));
        }
        // Hold the write lock across the check and the write so two formats
        // cannot interleave.
        let mut conn = self.conn();
        let mut slot = self.formatted.write();
        if let Some(f) = &*slot {
            if f.descriptor.uuid != descriptor.uuid {
                return Err(WireError::new(
                    ErrorCode::WrongVolume,
                    format!(
                        "server already belongs to volume {}; refusing to format it for volume {}",
                        f.descriptor.uuid, descriptor.uuid
                    ),
                ));
            }
            if f.descriptor == *descriptor && f.index == index {
                return Ok(FormatOutcome::AlreadyFormatted);
            }
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!(
                    "server is already server {} of volume {} with a different descriptor; \
                     a volume's layout cannot change",
                    f.index, f.descriptor.uuid
                ),
            ));
        }
        let blob = postcard::to_stdvec(descriptor)
            .map_err(|e| WireError::new(ErrorCode::Invalid, e.to_string()))?;
        let formatted = Formatted::new(descriptor.clone(), index);
        let owns_root = formatted.layout.inode_server(ROOT_ID) == index && !replacement;
        self.txn_locked(&mut conn, |tx| {
            tx.exec(
                "INSERT INTO volume (one, descriptor, own_index, counter) VALUES (1, ?1, ?2, ?3)",
                params![blob, i64::from(index), FIRST_COUNTER as i64],
            )
            .map_err(db_err)?;
            if replacement {
                rebuild::mark(tx)?;
            }
            if owns_root {
                let now = Timestamp::now();
                let root = Inode {
                    id: ROOT_ID,
                    gen: root_gen,
                    parent: ROOT_ID,
                    attr: Attr {
                        kind: FileKind::Dir,
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        nlink: 2,
                        size: 0,
                        atime: now,
                        mtime: now,
                        ctime: now,
                        rdev: 0,
                        flags: 0,
                    },
                    stale: Vec::new(),
                    alloc: None,
                    home: None,
                    target: None,
                };
                tx.exec(
                    "INSERT INTO inodes (id, gen, data, next_cookie) VALUES (?1, ?2, ?3, 1)",
                    params![sql_id(ROOT_ID), i64::from(root_gen), encode_inode(&root)?],
                )
                .map_err(db_err)?;
            }
            Ok(())
        })?;
        if owns_root {
            self.inodes.fetch_add(1, Ordering::Relaxed);
        }
        *slot = Some(Arc::new(formatted));
        Ok(FormatOutcome::Formatted)
    }

    /// Reads inode `id`.
    pub fn get_inode(&self, id: FileId) -> Result<Option<Inode>, WireError> {
        self.with_reader(|c| load_inode(c, id))
    }

    /// The inodes of `handles` that exist with the handle's generation, in
    /// the order given (one read transaction).
    pub fn get_inodes(&self, handles: &[Handle]) -> Result<Vec<Inode>, WireError> {
        self.with_reader(|c| {
            let tx = c.unchecked_transaction().map_err(db_err)?;
            let mut out = Vec::with_capacity(handles.len());
            for h in handles {
                if let Some(i) = load_inode(&tx, h.id)? {
                    if i.gen == h.gen {
                        out.push(i);
                    }
                }
            }
            tx.finish().map_err(db_err)?;
            Ok(out)
        })
    }

    /// Reads the inode a handle names; `Stale` if it is gone or was reused.
    pub fn get_handle(&self, h: Handle) -> Result<Inode, WireError> {
        check_handle(h, self.get_inode(h.id)?)
    }

    /// Moves the access time of the inode `h` names forward to `atime`
    /// (never back; nothing else changes). Objects cached from a home are
    /// left alone.
    pub fn touch_atime(&self, h: Handle, atime: Timestamp) -> Result<(), WireError> {
        self.touch_time(h, atime, |a| &mut a.atime)
    }

    /// Moves the status change time of `h` forward to `ctime` (a rename of
    /// it); never back, and not for objects cached from a home.
    pub fn touch_ctime(&self, h: Handle, ctime: Timestamp) -> Result<(), WireError> {
        self.touch_time(h, ctime, |a| &mut a.ctime)
    }

    /// Moves the time `field` picks out of `h`'s attributes forward to `t`.
    fn touch_time(
        &self,
        h: Handle,
        t: Timestamp,
        field: fn(&mut Attr) -> &mut Timestamp,
    ) -> Result<(), WireError> {
        self.write_txn(|tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.home.is_some() {
                return Ok(());
            }
            let at = field(&mut ino.attr);
            if *at >= t {
                return Ok(());
            }
            *at = t;
            tx.exec(
                "UPDATE inodes SET data = ?2 WHERE id = ?1",
                params![sql_id(ino.id), encode_inode(&ino)?],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Changes attributes of the inode `h` names.
    pub fn set_attr(&self, h: Handle, set: &SetAttr) -> Result<Inode, WireError> {
        self.write_txn(|tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            let a = &mut ino.attr;
            if let Some(size) = set.size {
                match a.kind {
                    FileKind::File => {}
                    FileKind::Dir => {
                        return Err(WireError::new(
                            ErrorCode::IsDir,
                            "cannot set the size of a directory",
                        ))
                    }
                    _ => {
                        return Err(WireError::new(
                            ErrorCode::Invalid,
                            "only regular files have a settable size",
                        ))
                    }
                }
                if size > MAX_FILE_SIZE {
                    return Err(WireError::new(
                        ErrorCode::FileTooBig,
                        format!("size {size} exceeds {MAX_FILE_SIZE}"),
                    ));
                }
                a.size = size;
            }
            if let Some(p) = set.parent {
                if a.kind != FileKind::Dir {
                    return Err(WireError::new(
                        ErrorCode::Invalid,
                        "only directories record a parent",
                    ));
                }
                ino.parent = p;
            }
            let a = &mut ino.attr;
            if let Some(m) = set.mode {
                a.mode = m & 0o7777;
                xattrs::chmod_acl(tx, ino.id, m)?;
            }
            if let Some(u) = set.uid {
                a.uid = u;
            }
            if let Some(g) = set.gid {
                a.gid = g;
            }
            if let Some(t) = set.atime {
                a.atime = t;
            }
            if let Some(t) = set.mtime {
                a.mtime = t;
            }
            if let Some(n) = set.nlink {
                a.nlink = n;
            }
            if let Some(f) = set.flags {
                check_flags(f)?;
                if ino.home.is_some() && f != 0 {
                    return Err(WireError::new(
                        ErrorCode::NotSupported,
                        "inode flags are not kept for objects cached from a home",
                    ));
                }
                ino.attr.flags = f;
            }
            let a = &mut ino.attr;
            a.ctime = set.ctime.unwrap_or_else(Timestamp::now);
            if ino.attr.kind == FileKind::File && ino.home.is_none() {
                let dense = ino.attr.size.checked_next_multiple_of(4096);
                match set.alloc {
                    // What a file written whole takes: no measure needed
                    // any more (a file filled in out of order, say).
                    Some(bytes) if Some(bytes) == dense => ino.alloc = None,
                    Some(bytes) => ino.alloc = Some(bytes),
                    // Emptied: no holes left to count.
                    None if set.size == Some(0) => ino.alloc = None,
                    None => {}
                }
            }
            tx.exec(
                "UPDATE inodes SET data = ?2 WHERE id = ?1",
                params![sql_id(ino.id), encode_inode(&ino)?],
            )
            .map_err(db_err)?;
            if let Some(l) = &ino.home {
                // Only a file made in the cache has data of the cache's
                // own (a fetched one's bytes are home's).
                let data = ino.attr.kind == FileKind::File
                    && l.is_local()
                    && (set.size.is_some() || set.mtime.is_some());
                wb::mark(
                    tx,
                    ino.id,
                    l.binding,
                    wb::Changed {
                        attrs: true,
                        data,
                        ..Default::default()
                    },
                )?;
            }
            Ok(ino)
        })
    }

    /// Removes the inode `h` names; a directory must be empty.
    pub fn delete_inode(&self, h: Handle, op: Option<OpKey>) -> Result<(), WireError> {
        if h.id == ROOT_ID {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "the root directory cannot be deleted",
            ));
        }
        let ((), replayed) = self.write_txn_once(op, |tx| {
            let ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.attr.kind == FileKind::Dir {
                let any: Option<i64> = tx
                    .prepare_cached("SELECT 1 FROM entries WHERE dir = ?1 LIMIT 1")
                    .and_then(|mut s| s.query_row(params![sql_id(h.id)], |r| r.get(0)).optional())
                    .map_err(db_err)?;
                if any.is_some() {
                    return Err(WireError::new(
                        ErrorCode::NotEmpty,
                        format!("directory {} is not empty", h.id),
                    ));
                }
            }
            for sql in [
                "DELETE FROM inodes WHERE id = ?1",
                "DELETE FROM orphans WHERE ino = ?1",
                "DELETE FROM opens WHERE ino = ?1",
            ] {
                tx.exec(sql, params![sql_id(h.id)]).map_err(db_err)?;
            }
            cached::forget_inode(tx, h.id)?;
            wb::forget(tx, h.id)?;
            xattrs::forget(tx, h.id)?;
            Ok(())
        })?;
        if !replayed {
            self.inodes.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Looks `name` up in the directory `dir` names.
    pub fn lookup(&self, dir: Handle, name: &[u8]) -> Result<Option<DirEntry>, WireError> {
        check_name(name)?;
        self.with_reader(|c| {
            let tx = c.unchecked_transaction().map_err(db_err)?;
            check_dir(check_handle(dir, load_inode(&tx, dir.id)?)?)?;
            let e = find_entry(&tx, dir.id, name)?;
            tx.finish().map_err(db_err)?;
            Ok(e)
        })
    }

    /// Lists entries of `dir` with cookie > `cookie`; returns them and whether
    /// the listing is complete.
    #[cfg(test)]
    pub fn read_dir(
        &self,
        dir: Handle,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool), WireError> {
        self.read_dir_page(dir, cookie, max)
            .map(|p| (p.entries, p.eof))
    }

    /// [`Store::read_dir`], saying also whether `dir` is a cached directory
    /// not yet listed whole from home (its end so far is not its end).
    pub fn read_dir_page(&self, dir: Handle, cookie: u64, max: u32) -> Result<DirPage, WireError> {
        let max = max.clamp(1, MAX_PAGE);
        self.with_reader(|c| {
            let tx = c.unchecked_transaction().map_err(db_err)?;
            let d = check_dir(check_handle(dir, load_inode(&tx, dir.id)?)?)?;
            let unlisted = d.home.as_ref().is_some_and(|l| !l.listed);
            let mut stmt = tx
                .prepare_cached(
                    "SELECT name, cookie, child, gen, kind FROM entries
                     WHERE dir = ?1 AND cookie > ?2 ORDER BY cookie LIMIT ?3",
                )
                .map_err(db_err)?;
            let cookie = i64::try_from(cookie).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map(params![sql_id(dir.id), cookie, i64::from(max) + 1], |r| {
                    entry_from_row(r, 0)
                })
                .map_err(db_err)?;
            let mut out = Vec::new();
            let mut budget = REPLY_BUDGET;
            let mut eof = true;
            for row in rows {
                let e = row.map_err(db_err)?;
                if out.len() >= max as usize || entry_cost(&e) > budget {
                    eof = false;
                    break;
                }
                budget -= entry_cost(&e);
                out.push(e);
            }
            drop(stmt);
            tx.finish().map_err(db_err)?;
            Ok(DirPage {
                entries: out,
                eof,
                unlisted,
            })
        })
    }

    /// Adds `name → child` to `dir`, replacing an entry naming `replace`.
    /// Returns the replaced entry.
    pub fn link(
        &self,
        dir: Handle,
        name: &[u8],
        child: Handle,
        kind: FileKind,
        replace: Option<FileId>,
        op: Option<OpKey>,
    ) -> Result<(Option<DirEntry>, Inode), WireError> {
        check_new_name(name)?;
        if child.id == 0 {
            return Err(WireError::new(
                ErrorCode::Invalid,
                "file id 0 is not a file",
            ));
        }
        let (removed, replayed) = self.write_txn_once(op, |tx| {
            let mut d = load_dir_row(tx, dir)?;
            let existing = find_entry(tx, dir.id, name)?;
            if let Some(e) = &existing {
                if replace != Some(e.child.id) {
                    return Err(WireError::new(
                        ErrorCode::Exists,
                        format!("{} exists", String::from_utf8_lossy(name)),
                    ));
                }
                wb::depart(tx, dir.id, name, e.child.id)?;
                // Replaced in place: the name keeps its cookie.
                cookies::repoint(tx, dir.id, name, child, kind)?;
            } else {
                cookies::insert(tx, dir.id, name, child, kind)?;
            }
            let a = &mut d.inode.attr;
            if existing.is_none() {
                a.size = a.size.saturating_add(1);
            }
            let mut nlink = i64::from(a.nlink);
            if kind == FileKind::Dir {
                nlink += 1;
            }
            if existing.as_ref().is_some_and(|e| e.kind == FileKind::Dir) {
                nlink -= 1;
            }
            a.nlink = u32::try_from(nlink.max(2))
                .map_err(|_| WireError::new(ErrorCode::TooManyLinks, "too many subdirectories"))?;
            touch_dir(a);
            store_dir_row(tx, &d)?;
            mark_names(tx, &d.inode)?;
            Ok((existing, d.inode))
        })?;
        if removed.0.is_none() && !replayed {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
        Ok(removed)
    }

    /// Removes `name` from `dir` (only if it names `expect`, when given).
    pub fn unlink(
        &self,
        dir: Handle,
        name: &[u8],
        expect: Option<FileId>,
        op: Option<OpKey>,
    ) -> Result<(Option<DirEntry>, Inode), WireError> {
        check_name(name)?;
        let (removed, replayed) = self.write_txn_once(op, |tx| {
            let mut d = load_dir_row(tx, dir)?;
            let not_found = || {
                WireError::new(
                    ErrorCode::NotFound,
                    format!("no entry {}", String::from_utf8_lossy(name)),
                )
            };
            let e = find_entry(tx, dir.id, name)?.ok_or_else(not_found)?;
            if expect.is_some_and(|x| x != e.child.id) {
                return Err(WireError::new(
                    ErrorCode::NotFound,
                    format!(
                        "{} names file {}, not the expected one",
                        String::from_utf8_lossy(name),
                        e.child.id
                    ),
                ));
            }
            wb::depart(tx, dir.id, name, e.child.id)?;
            delete_entry(tx, dir.id, name)?;
            let a = &mut d.inode.attr;
            a.size = a.size.saturating_sub(1);
            if e.kind == FileKind::Dir {
                // Never below 2 while the directory has a name: a directory
                // listed from home counts no subdirectories it was given.
                a.nlink = a.nlink.saturating_sub(1).max(2);
            }
            touch_dir(a);
            store_dir_row(tx, &d)?;
            mark_names(tx, &d.inode)?;
            Ok((e, d.inode))
        })?;
        if !replayed {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        Ok((Some(removed.0), removed.1))
    }

    /// Renames `from` to `to` within `dir`; `to` may exist only if it names
    /// `replace`. Returns the replaced entry.
    pub fn rename(
        &self,
        dir: Handle,
        from: &[u8],
        to: &[u8],
        replace: Option<FileId>,
        op: Option<OpKey>,
    ) -> Result<(Option<DirEntry>, Inode), WireError> {
        check_name(from)?;
        check_new_name(to)?;
        let (removed, replayed) = self.write_txn_once(op, |tx| {
            let mut d = load_dir_row(tx, dir)?;
            let src = find_entry(tx, dir.id, from)?.ok_or_else(|| {
                WireError::new(
                    ErrorCode::NotFound,
                    format!("no entry {}", String::from_utf8_lossy(from)),
                )
            })?;
            if from == to {
                return Ok((None, d.inode));
            }
            let dst = find_entry(tx, dir.id, to)?;
            if let Some(t) = &dst {
                if t.child == src.child {
                    // Two names of one file: POSIX says do nothing.
                    return Ok((None, d.inode));
                }
                if replace != Some(t.child.id) {
                    return Err(WireError::new(
                        ErrorCode::Exists,
                        format!("{} exists", String::from_utf8_lossy(to)),
                    ));
                }
            }
            // The source's entry goes; `to` keeps its cookie if it existed,
            // else gets its own: a listing never meets one name twice.
            delete_entry(tx, dir.id, from)?;
            if let Some(t) = &dst {
                wb::depart(tx, dir.id, to, t.child.id)?;
                cookies::repoint(tx, dir.id, to, src.child, src.kind)?;
            } else {
                cookies::insert(tx, dir.id, to, src.child, src.kind)?;
            }
            let a = &mut d.inode.attr;
            if let Some(t) = &dst {
                a.size = a.size.saturating_sub(1);
                if t.kind == FileKind::Dir {
                    a.nlink = a.nlink.saturating_sub(1).max(2);
                }
            }
            touch_dir(a);
            store_dir_row(tx, &d)?;
            mark_names(tx, &d.inode)?;
            Ok((dst, d.inode))
        })?;
        if removed.0.is_some() && !replayed {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(removed)
    }

    /// Inodes with id > `after`, ascending.
    pub fn scan_inodes(&self, after: FileId, max: u32) -> Result<Vec<Inode>, WireError> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let max = max.clamp(1, MAX_PAGE);
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT id, data FROM inodes WHERE id > ?1 ORDER BY id LIMIT ?2")
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![after, i64::from(max)], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
                })
                .map_err(db_err)?;
            let mut out = Vec::new();
            let mut budget = REPLY_BUDGET;
            for row in rows {
                let (id, data) = row.map_err(db_err)?;
                let mut ino = decode_inode(from_sql_id(id), &data)?;
                ino.stale = stale::records_of(c, ino.id)?;
                ino.home = cached::link_of(c, ino.id)?;
                // Each record encodes in at most 3 varints of 10 bytes; a
                // home link in at most its handle and 120 bytes.
                let cost = data.len()
                    + 16
                    + 30 * ino.stale.len()
                    + ino.home.as_ref().map_or(0, |l| l.handle.len() + 120);
                if cost > budget && !out.is_empty() {
                    break;
                }
                budget = budget.saturating_sub(cost);
                out.push(ino);
            }
            Ok(out)
        })
    }

    /// Entries after `(after_dir, after_cookie)`, ascending.
    pub fn scan_entries(
        &self,
        after_dir: FileId,
        after_cookie: u64,
        max: u32,
    ) -> Result<Vec<(FileId, DirEntry)>, WireError> {
        let Ok(after_dir) = i64::try_from(after_dir) else {
            return Ok(Vec::new());
        };
        let after_cookie = i64::try_from(after_cookie).unwrap_or(i64::MAX);
        let max = max.clamp(1, MAX_PAGE);
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT dir, name, cookie, child, gen, kind FROM entries
                     WHERE (dir, cookie) > (?1, ?2) ORDER BY dir, cookie LIMIT ?3",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![after_dir, after_cookie, i64::from(max)], |r| {
                    Ok((from_sql_id(r.get(0)?), entry_from_row(r, 1)?))
                })
                .map_err(db_err)?;
            let mut out = Vec::new();
            let mut budget = REPLY_BUDGET;
            for row in rows {
                let (dir, e) = row.map_err(db_err)?;
                let cost = entry_cost(&e) + 10;
                if cost > budget {
                    break;
                }
                budget -= cost;
                out.push((dir, e));
            }
            Ok(out)
        })
    }

    /// Records that file `id` has an extent file here (before creating it).
    pub fn add_data_file(&self, id: FileId) -> Result<(), WireError> {
        let n = self.write_txn(|tx| {
            tx.prepare_cached("INSERT OR IGNORE INTO data_files (id) VALUES (?1)")
                .and_then(|mut s| s.execute(params![sql_id(id)]))
                .map_err(db_err)
        })?;
        if n > 0 {
            self.data_files.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Forgets the extent files of `ids` (after removing them), in one
    /// transaction.
    pub fn remove_data_files(&self, ids: &[FileId]) -> Result<(), WireError> {
        if ids.is_empty() {
            return Ok(());
        }
        let n = self.write_txn(|tx| {
            let mut stmt = tx
                .prepare_cached("DELETE FROM data_files WHERE id = ?1")
                .map_err(db_err)?;
            let mut n = 0;
            for &id in ids {
                n += stmt.execute(params![sql_id(id)]).map_err(db_err)?;
            }
            Ok(n)
        })?;
        self.data_files.fetch_sub(n as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Ids of files with extent files here, > `after`, ascending.
    pub fn scan_data_files(&self, after: FileId, max: u32) -> Result<Vec<FileId>, WireError> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let max = max.clamp(1, MAX_PAGE * 4);
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT id FROM data_files WHERE id > ?1 ORDER BY id LIMIT ?2")
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![after, i64::from(max)], |r| r.get::<_, i64>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map(from_sql_id).map_err(db_err)).collect()
        })
    }

    /// Makes every committed transaction durable against power loss.
    ///
    /// A no-op when nothing was committed since the last sync: that one's
    /// flush of the write-ahead log covered everything before it (every
    /// change goes through the one connection, whose count of changed
    /// rows says whether anything was; an `fsync` of a file asks every
    /// server, most of which hold nothing of it).
    pub fn sync(&self) -> Result<(), WireError> {
        let conn = self.conn();
        if conn.total_changes() == self.synced_changes.load(Ordering::Acquire) {
            return Ok(());
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(db_err)?;
        let r = conn.exec(
            "INSERT INTO sync_marker (one, seq) VALUES (1, 1)
             ON CONFLICT (one) DO UPDATE SET seq = seq + 1",
            [],
        );
        let back = conn.pragma_update(None, "synchronous", "NORMAL");
        r.map_err(db_err)?;
        back.map_err(db_err)?;
        self.synced_changes
            .store(conn.total_changes(), Ordering::Release);
        metrics::counter!("morris_server_store_flushes_total").increment(1);
        #[cfg(test)]
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Syncs so far that had something to flush ([`Store::sync`]).
    #[cfg(test)]
    pub(crate) fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

fn check_handle(h: Handle, ino: Option<Inode>) -> Result<Inode, WireError> {
    match ino {
        Some(i) if i.gen == h.gen => Ok(i),
        Some(i) => Err(WireError::new(
            ErrorCode::Stale,
            format!(
                "file {} has generation {}, handle has {}",
                h.id, i.gen, h.gen
            ),
        )),
        None => Err(WireError::new(
            ErrorCode::Stale,
            format!("file {} does not exist", h.id),
        )),
    }
}

fn check_dir(ino: Inode) -> Result<Inode, WireError> {
    if ino.attr.kind != FileKind::Dir {
        return Err(WireError::new(
            ErrorCode::NotDir,
            format!("file {} is not a directory", ino.id),
        ));
    }
    Ok(ino)
}

fn load_inode(c: &Connection, id: FileId) -> Result<Option<Inode>, WireError> {
    if sql_id(id) < 0 {
        return Ok(None);
    }
    let data: Option<Vec<u8>> = c
        .prepare_cached("SELECT data FROM inodes WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![sql_id(id)], |r| r.get(0)).optional())
        .map_err(db_err)?;
    let Some(d) = data else { return Ok(None) };
    let mut ino = decode_inode(id, &d)?;
    if ino.attr.kind == FileKind::File {
        ino.stale = stale::records_of(c, id)?;
    }
    ino.home = cached::link_of(c, id)?;
    Ok(Some(ino))
}

fn load_dir_row(tx: &Transaction<'_>, dir: Handle) -> Result<DirRow, WireError> {
    if sql_id(dir.id) < 0 {
        return Err(WireError::new(
            ErrorCode::Stale,
            format!("file {} does not exist", dir.id),
        ));
    }
    let row: Option<(Vec<u8>, i64)> = tx
        .prepare_cached("SELECT data, next_cookie FROM inodes WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![sql_id(dir.id)], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(db_err)?;
    let (inode, next_cookie) = match row {
        Some((data, next)) => {
            let mut ino = decode_inode(dir.id, &data)?;
            ino.home = cached::link_of(tx, dir.id)?;
            (Some(ino), next)
        }
        None => (None, 1),
    };
    let inode = check_dir(check_handle(dir, inode)?)?;
    Ok(DirRow {
        inode,
        next_cookie: (next_cookie as u64).max(1),
    })
}

/// Marks the names of cached directory `d` changed (for the write-back).
fn mark_names(tx: &Transaction<'_>, d: &Inode) -> Result<(), WireError> {
    match &d.home {
        Some(l) => wb::mark(
            tx,
            d.id,
            l.binding,
            wb::Changed {
                names: true,
                ..Default::default()
            },
        ),
        None => Ok(()),
    }
}

fn store_dir_row(tx: &Transaction<'_>, d: &DirRow) -> Result<(), WireError> {
    let data = encode_inode(&d.inode)?;
    tx.prepare_cached("UPDATE inodes SET data = ?2, next_cookie = ?3 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![sql_id(d.inode.id), data, d.next_cookie as i64]))
        .map_err(db_err)?;
    Ok(())
}

fn find_entry(c: &Connection, dir: FileId, name: &[u8]) -> Result<Option<DirEntry>, WireError> {
    c.prepare_cached(
        "SELECT name, cookie, child, gen, kind FROM entries WHERE dir = ?1 AND name = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![sql_id(dir), name], |r| entry_from_row(r, 0))
            .optional()
    })
    .map_err(db_err)
}

/// Removes entry `dir/name` and the seed at its cookie (cache mode), in
/// one visit of the entry.
fn delete_entry(tx: &Transaction<'_>, dir: FileId, name: &[u8]) -> Result<(), WireError> {
    let cookie: Option<i64> = tx
        .prepare_cached("DELETE FROM entries WHERE dir = ?1 AND name = ?2 RETURNING cookie")
        .and_then(|mut s| {
            s.query_row(params![sql_id(dir), name], |r| r.get(0))
                .optional()
        })
        .map_err(db_err)?;
    if let Some(cookie) = cookie {
        cached::forget_seed_at(tx, dir, cookie)?;
    }
    Ok(())
}

fn touch_dir(a: &mut Attr) {
    let now = Timestamp::now();
    a.mtime = now;
    a.ctime = now;
}

mod backup;
mod cached;
#[cfg(test)]
mod cached_tests;
mod cookies;
mod create;
mod exchange;
mod fences;
#[cfg(test)]
mod format_tests;
mod once;
mod orphans;
mod rebuild;
mod replica;
#[cfg(test)]
mod replica_tests;
mod stale;
mod stored;

#[cfg(test)]
mod tests;
mod usage;
mod wb;
mod xattrs;

pub use cached::Seed;
#[cfg(test)]
pub use cached::UnitRec;
pub use cached::{is_own_for, local_tag};
pub use once::OpKey;
pub use replica::Captured;
use stored::{decode_inode, encode_inode};
pub use wb::WbQueue;

/// Commits `tx`, recording how long the commit took
/// (`morris_server_store_commit_seconds`).
pub(crate) fn commit(tx: Transaction<'_>) -> Result<(), WireError> {
    let started = std::time::Instant::now();
    tx.commit().map_err(db_err)?;
    metrics::histogram!("morris_server_store_commit_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(())
}
