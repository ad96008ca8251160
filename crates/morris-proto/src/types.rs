//! Values that cross the wire.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A 64-bit file id. Ids are never reused; see [`crate::layout::Layout::allocate_id`].
pub type FileId = u64;

/// The file id of the volume's root directory.
pub const ROOT_ID: FileId = 1;

/// Longest directory entry name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Longest symlink target, in bytes.
pub const MAX_SYMLINK_LEN: usize = 4095;

/// Largest file size supported: 16 TiB (the issue asks for at least 1 TiB).
pub const MAX_FILE_SIZE: u64 = 1 << 44;

/// A file handle: a file id plus the generation it was created with.
///
/// A handle whose generation does not match the stored inode is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Handle {
    /// The file id.
    pub id: FileId,
    /// The generation number given at creation.
    pub gen: u32,
}

/// What kind of object an inode describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link; its target is stored in the inode.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device (rdev in the attributes).
    CharDev,
    /// A block device (rdev in the attributes).
    BlockDev,
}

/// Seconds and nanoseconds since the unix epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Timestamp {
    /// Whole seconds since the epoch (may be negative).
    pub secs: i64,
    /// Nanoseconds, below 1e9.
    pub nanos: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                Timestamp {
                    secs: -(d.as_secs() as i64),
                    nanos: 0,
                }
            }
        }
    }

    /// Converts to a `SystemTime`.
    pub fn to_system_time(self) -> std::time::SystemTime {
        let base = std::time::UNIX_EPOCH;
        if self.secs >= 0 {
            base + std::time::Duration::new(self.secs as u64, self.nanos.min(999_999_999))
        } else {
            base - std::time::Duration::from_secs(self.secs.unsigned_abs())
                + std::time::Duration::from_nanos(u64::from(self.nanos.min(999_999_999)))
        }
    }

    /// Converts from a `SystemTime`.
    pub fn from_system_time(t: std::time::SystemTime) -> Self {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let mut secs = -(d.as_secs() as i64);
                let mut nanos = 0;
                if d.subsec_nanos() > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - d.subsec_nanos();
                }
                Timestamp { secs, nanos }
            }
        }
    }
}

/// The attributes stored in an inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// The object's kind.
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (`0o7777` mask).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Number of directory entries naming this inode (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Size in bytes (files: content length; directories: entry count; symlinks: target length).
    pub size: u64,
    /// Access time. Not maintained on reads (as in the MORRIS paper); set by utimens.
    pub atime: Timestamp,
    /// Last content modification.
    pub mtime: Timestamp,
    /// Last inode change.
    pub ctime: Timestamp,
    /// Device number for character and block devices.
    pub rdev: u32,
    /// Inode flags (`chattr`), as Linux's `FS_IOC_GETFLAGS` numbers them;
    /// only those of [`inode_flags::KEPT`].
    pub flags: u32,
}

/// The inode flags a volume keeps ([`Attr::flags`], `chattr`/`lsattr`),
/// with Linux's `FS_*_FL` values.
pub mod inode_flags {
    /// `i`: nothing changes the object, its names or (a directory) its entries.
    pub const IMMUTABLE: u32 = 0x10;
    /// `a`: a file is only appended to; a directory's entries are only added.
    pub const APPEND: u32 = 0x20;
    /// `d`: `dump(8)` skips it (kept, not acted on).
    pub const NODUMP: u32 = 0x40;
    /// `A`: reads do not move the access time.
    pub const NOATIME: u32 = 0x80;
    /// Every flag kept; others are refused.
    pub const KEPT: u32 = IMMUTABLE | APPEND | NODUMP | NOATIME;
}

/// An inode: the "block 0" of a file, kept by the file's owning server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    /// The file id.
    pub id: FileId,
    /// Generation given at creation.
    pub gen: u32,
    /// For directories, the id of the parent directory (the root is its own parent);
    /// 0 for other kinds.
    pub parent: FileId,
    /// Attributes.
    pub attr: Attr,
    /// Symlink target, for symlinks.
    pub target: Option<Vec<u8>>,
    /// Servers whose copies of some of this file's blocks missed writes
    /// (mirrored volumes): never read those blocks there until a resync has
    /// caught them up. Empty when every copy is current.
    pub stale: Vec<StaleCopy>,
    /// Cache mode: the home object this inode caches, if it lies under a
    /// bound directory (`None` for ordinary files).
    pub home: Option<Box<crate::home::HomeLink>>,
    /// Bytes the file's data takes on the servers' disks (one copy; holes
    /// take none), as measured by the last writer that made it sparse or
    /// reserved space (`None`: never measured, and taken as the size
    /// rounded up to 4 KiB: a file written from start to end).
    pub alloc: Option<u64>,
}

/// A record that server `server` missed writes to its copies of a file's
/// blocks `from` and above (a copy write failed while it was down or cut
/// off). Kept with the inode at its owner; readers skip those copies and the
/// server's resync copies them from a current copy, then clears the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StaleCopy {
    /// The server index whose copies are stale.
    pub server: u32,
    /// Lowest stale block index (1-based; 0 means the file was deleted and
    /// the server may still hold its blocks).
    pub from: u64,
    /// Changes whenever the record is widened, so a resync that copied under
    /// an older record cannot clear a newer one.
    pub seq: u64,
}

impl StaleCopy {
    /// True if block `index` held by `server` may be stale under this record.
    pub fn covers(&self, server: u32, index: u64) -> bool {
        self.server == server && index >= self.from
    }
}

/// Progress of a server catching its stale copies up (`morris status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncStatus {
    /// A resync pass is copying now.
    pub running: bool,
    /// Completed passes since the server started.
    pub passes: u64,
    /// Files with stale copies here found by the current (or last) pass.
    pub files_total: u64,
    /// Of those, files caught up.
    pub files_done: u64,
    /// Bytes copied to this server by the current (or last) pass.
    pub bytes_copied: u64,
    /// Why the last pass stopped short, if it did.
    pub last_error: Option<String>,
}

impl Inode {
    /// Bytes the object's data takes on disk, as `st_blocks` and NFSv3's
    /// `used` count them: the last measure ([`Inode::alloc`]), else (and
    /// for an object cached from a home) the size rounded up to 4 KiB.
    pub fn disk_bytes(&self) -> u64 {
        let measured = self.alloc.filter(|_| self.home.is_none());
        measured.unwrap_or_else(|| {
            self.attr
                .size
                .checked_next_multiple_of(4096)
                .unwrap_or(u64::MAX)
        })
    }

    /// This inode's handle.
    pub fn handle(&self) -> Handle {
        Handle {
            id: self.id,
            gen: self.gen,
        }
    }
}

/// What one user or one group has stored in one metadata range
/// (`morris quota`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// A group (`gid`), not a user (`uid`).
    pub group: bool,
    /// The uid or gid (-1: inode records that do not decode).
    pub id: i64,
    /// Inodes it owns.
    pub inodes: i64,
    /// Bytes its regular files take on the servers' disks (one copy).
    pub bytes: i64,
}

/// A user's or a group's limits (`morris quota set`): 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLimit {
    /// A group (`gid`), not a user (`uid`).
    pub group: bool,
    /// The uid or gid.
    pub id: i64,
    /// Most inodes it may own.
    pub inodes: u64,
    /// Most bytes its regular files may take (one copy).
    pub bytes: u64,
}

/// One metadata range's [`UsageRow`]s, as the server serving it counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeUsage {
    /// The range (the index of the server whose ids it holds).
    pub range: u32,
    /// Its rows.
    pub rows: Vec<UsageRow>,
}

/// A partial attribute update: fields left `None` are unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (files only; the server also frees nothing: data truncation is a
    /// separate `Truncate` to every server).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<Timestamp>,
    /// New modification time.
    pub mtime: Option<Timestamp>,
    /// New change time (the server sets ctime to now on any change unless given).
    pub ctime: Option<Timestamp>,
    /// New link count.
    pub nlink: Option<u32>,
    /// New parent (directories moved between directories).
    pub parent: Option<FileId>,
    /// Bytes of data on the servers' disks, as just measured (see
    /// [`Inode::alloc`]). A new size of 0 without it forgets the last
    /// measure (an empty file has no holes).
    pub alloc: Option<u64>,
    /// New inode flags ([`Attr::flags`]).
    pub flags: Option<u32>,
}

/// Longest extended attribute name, with its namespace (`user.x`), in bytes.
pub const MAX_XATTR_NAME: usize = 255;

/// Largest extended attribute value, in bytes (Linux's `XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE: usize = 65_536;

/// Most bytes of extended attribute names one object may have, each
/// counted with its terminating NUL (Linux's `XATTR_LIST_MAX`: what one
/// `listxattr` can return).
pub const MAX_XATTR_NAMES: usize = 65_536;

/// Most bytes of extended attribute names and values one object may have.
pub const MAX_XATTR_BYTES: usize = 1 << 20;

/// One extended attribute of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    /// Its name, namespace included (`user.mime_type`).
    pub name: Vec<u8>,
    /// Its value (may be empty).
    pub value: Vec<u8>,
}

/// How [`crate::Request::SetXattr`] treats an attribute that is, or is not,
/// there already (`setxattr(2)`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrHow {
    /// Create it or replace it.
    Either,
    /// Create it; `Exists` if it is there (`XATTR_CREATE`).
    Create,
    /// Replace it; `NoData` if it is not there (`XATTR_REPLACE`).
    Replace,
}

/// What a [`crate::Request::Lock`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    /// A read (shared) lock.
    Read,
    /// A write (exclusive) lock.
    Write,
    /// Give the range up.
    Unlock,
}

/// A lock held by someone else, as [`crate::Request::TestLock`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`u64::MAX`: to the end of the file).
    pub end: u64,
    /// A write lock; else a read lock.
    pub write: bool,
    /// The process that took it (on its own host).
    pub pid: u32,
}

/// A directory entry as listed by `ReadDir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry name (no `/`, no NUL, 1..=255 bytes).
    pub name: Vec<u8>,
    /// The child's handle.
    pub child: Handle,
    /// The child's kind, cached in the entry.
    pub kind: FileKind,
    /// Position of this entry; listing again from this cookie continues after it.
    /// Cookies are stable for the life of the entry and never 0.
    pub cookie: u64,
}

/// The volume descriptor written to every server by `morris format`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDescriptor {
    /// Volume identity; every connection names it.
    pub uuid: Uuid,
    /// Ordered server addresses (`host:port`); index `i` is server `i` of the layout.
    pub servers: Vec<String>,
    /// Stripe unit in bytes: a power of two from 4 KiB to 64 MiB.
    pub stripe_unit: u32,
    /// Copies of every block (1 = no redundancy; more is the mirroring issue's work).
    pub replicas: u8,
    /// When the volume was formatted.
    pub created: Timestamp,
}

/// Smallest allowed stripe unit.
pub const MIN_STRIPE_UNIT: u32 = 4 << 10;
/// Largest allowed stripe unit.
pub const MAX_STRIPE_UNIT: u32 = 64 << 20;
/// Default stripe unit (see docs/benchmarks.md for the measurement behind it).
pub const DEFAULT_STRIPE_UNIT: u32 = 1 << 20;

impl VolumeDescriptor {
    /// Checks the descriptor's invariants; returns a message for humans on failure.
    pub fn validate(&self) -> Result<(), String> {
        if self.servers.is_empty() {
            return Err("a volume needs at least one server".into());
        }
        if self.servers.len() > 4096 {
            return Err("at most 4096 servers".into());
        }
        if !self.stripe_unit.is_power_of_two()
            || self.stripe_unit < MIN_STRIPE_UNIT
            || self.stripe_unit > MAX_STRIPE_UNIT
        {
            return Err(format!(
                "stripe unit {} is not a power of two from 4 KiB to 64 MiB",
                self.stripe_unit
            ));
        }
        if self.replicas == 0
            || usize::from(self.replicas) > self.servers.len()
            || self.replicas > crate::MAX_REPLICAS
        {
            return Err(format!(
                "replicas {} must be between 1 and the number of servers ({}), at most {}",
                self.replicas,
                self.servers.len(),
                crate::MAX_REPLICAS
            ));
        }
        Ok(())
    }
}

/// Per-server counters reported by `Status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// This server's index in the volume, if formatted.
    pub index: Option<u32>,
    /// The volume, if formatted.
    pub volume: Option<Uuid>,
    /// Inodes stored here.
    pub inodes: u64,
    /// Directory entries stored here.
    pub entries: u64,
    /// Files with data blocks stored here.
    pub data_files: u64,
    /// Bytes of block data stored here (allocated on disk).
    pub data_bytes: u64,
    /// Leases currently granted by this server.
    pub leases: u64,
    /// Client sessions connected.
    pub sessions: u64,
    /// Requests served since start, in total.
    pub requests: u64,
    /// Requests served since start, by request name (`"Read"`, `"AcquireRead"`, ...).
    pub requests_by_op: Vec<(String, u64)>,
    /// Lease recalls sent since start.
    pub recalls: u64,
    /// Seconds since the server process started.
    pub uptime_secs: u64,
    /// Bytes free on the data directory's file system.
    pub disk_free: u64,
    /// Total bytes of the data directory's file system.
    pub disk_total: u64,
    /// Block reads and writes being served now.
    pub io_inflight: u64,
    /// Moving average (last ~8 requests) of block read service time, µs.
    pub read_service_us: u64,
    /// Moving average (last ~8 requests) of block write service time, µs.
    pub write_service_us: u64,
    /// Stale-copy records kept here (for inodes this server owns), counted
    /// by the server whose copies they name: `(server index, files)`.
    pub stale_by_server: Vec<(u32, u64)>,
    /// This server's own resync (catching up copies it missed).
    pub resync: ResyncStatus,
    /// The metadata ranges this server keeps a copy of (mirrored volumes:
    /// its own and its one or two predecessors'; otherwise its own).
    pub ranges: Vec<RangeStatus>,
    /// Connections open now.
    pub connections: u64,
    /// Bytes of data replies in progress over every connection (bounded
    /// per connection: what a peer that stops reading can pin).
    pub reply_bytes: u64,
    /// Connections refused at the connection cap since start.
    pub connections_refused: u64,
    /// Connections closed because the peer stopped reading, since start.
    pub connections_stalled: u64,
    /// Checksums of the data kept here: what failed, what was repaired.
    pub integrity: IntegrityStatus,
    /// A replacement for a lost server whose copies are not yet all
    /// recorded stale: it answers no read of its blocks (`Replace`).
    pub rebuilding: bool,
}

/// What a server's checksums found (`morris status`, `morris scrub`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntegrityStatus {
    /// 4 KiB chunks found not to match their checksum since start (by reads
    /// and scrubs; a chunk found twice counts twice).
    pub bad_chunks: u64,
    /// Bytes checked against their checksums since start.
    pub checked_bytes: u64,
    /// Chunks whose checksums were taken from the data at start because a
    /// change to them was cut short (the server was killed).
    pub resealed_chunks: u64,
    /// Damaged copies recorded stale for resync to rewrite from another
    /// copy, since start.
    pub repairs: u64,
    /// Damaged copies that could not be repaired (no other current copy:
    /// a volume of one copy), since start.
    pub unrepairable: u64,
    /// Block changes refused since start because they were made under a
    /// write lease that had passed to another client (fencing).
    pub fenced: u64,
    /// The current or last scrub pass.
    pub scrub: ScrubStatus,
}

/// Progress of a scrub pass (every chunk read and checked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubStatus {
    /// A pass runs now.
    pub running: bool,
    /// Passes completed since start.
    pub passes: u64,
    /// Extent files in this pass (known when it starts).
    pub files_total: u64,
    /// Of those, checked.
    pub files_done: u64,
    /// Bytes allocated to those files when the pass started.
    pub bytes_total: u64,
    /// Bytes read and checked by this pass.
    pub bytes_done: u64,
    /// Chunks that failed in this pass.
    pub bad_chunks: u64,
    /// Blocks whose copies this pass found different from this server's
    /// first copy (both intact), handed over to be made equal.
    pub diverged_blocks: u64,
    /// The pass's limit, bytes a second.
    pub rate: u64,
    /// When the last complete pass ended (seconds since the Unix epoch; 0:
    /// none yet).
    pub last_done_unix: u64,
    /// Why the last pass stopped short, if it did.
    pub last_error: Option<String>,
}

/// One metadata range (the inodes `id mod k == range`) as kept by one server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeStatus {
    /// The range number.
    pub range: u32,
    /// This server serves the range's inodes, entries and leases.
    pub primary: bool,
    /// Primary: serving now (ownership confirmed, not lapsed).
    /// Secondary: its copy is current (it could take over).
    pub ready: bool,
    /// Ownership generation: raised by every takeover.
    pub gen: u64,
    /// Primary of a mirrored range: every other copy is current.
    pub peer_in_sync: bool,
    /// Secondary: its primary named it the candidate (the copy that takes
    /// the range over if the primary goes silent).
    pub candidate: bool,
    /// Inodes in this copy.
    pub inodes: u64,
    /// Takeovers of ranges by this server since it started.
    pub takeovers: u64,
}
