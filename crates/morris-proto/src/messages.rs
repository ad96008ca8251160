//! Every request, reply and server push of the morris protocol.
//!
//! # Sessions and leases
//!
//! A connection starts with [`Request::Hello`], which names the volume (refused
//! with `WrongVolume` on mismatch) and a `client_id` chosen at random by the
//! client. Leases belong to the client id, not to the socket, so a client may
//! reconnect and keep them. **Any** request from a client renews all of its
//! leases on that server; a client with no traffic sends [`Request::Renew`]
//! every `lease_ms / 3`. A client silent for `lease_ms` loses every lease it
//! held on that server.
//!
//! Locks are multi-reader/single-writer leases on inodes, kept by the server
//! that owns the inode (`id mod k`). While a client holds a read lease on an
//! inode it may cache the inode, its data and (for a directory) its entries.
//! While it holds the write lease it is the only client that may change them.
//! To grant a conflicting lease the server pushes [`Push::Recall`] to each
//! holder and waits until the holder sends [`Request::Release`], or until the
//! holder has been silent for `lease_ms`, or `lease_ms` after the recall,
//! whichever comes first. A client that asks for a write lease while holding
//! the read lease gives up its read lease at that moment (so two upgrading
//! readers cannot deadlock). Waiting writers are served before later readers.
//!
//! Server restart loses the lease table; for `lease_ms` after it starts a
//! server answers every lease-taking request with `Grace`, so that leases
//! granted by its previous life have run out before new ones conflict with
//! them. A server's `epoch` (in the `Hello` reply) changes on every start; a
//! client that sees a new epoch drops every lease it held there.
//!
//! Which requests take a lease implicitly is written on each one below. Data
//! requests (`Read`, `Write`, `Truncate`, `DeleteData`, `Sync`) take none:
//! the stripe servers trust clients to hold the inode's lease at its owner.
//!
//! # Exactly once
//!
//! Requests whose repetition would not be harmless (`CreateInode`,
//! `DeleteInode`, `Link`, `Unlink`, `Rename`, `DropLink`, `SetOpen`, `Reap`)
//! carry an operation id `op`, unique per client id (a counter). The server
//! stores the outcome of a successful one under (client id, op) in the same
//! transaction as its change, in the metadata range's store (so it survives
//! `kill -9` and travels to the range's copies); the same (client id, op)
//! again — a client resending after a lost connection, a restart or a
//! takeover — gets the stored outcome and changes nothing. Outcomes are kept
//! ten minutes, far longer than any client resends. `op = 0` opts out.
//!
//! # Ordering (crash consistency)
//!
//! Every metadata request is committed to the server's store before it is
//! answered, so an answered request survives `kill -9` of the server. The
//! client orders multi-server operations so that a crash at any point leaves
//! no entry pointing to nothing: inode (and data) before the entry that names
//! it; entry removal before inode removal.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::home::{Binding, HomeRef, HomeStamp};
use crate::types::{
    Attr, DirEntry, FileId, FileKind, Handle, Inode, LockInfo, LockKind, QuotaLimit, RangeUsage,
    ServerStats, SetAttr, StaleCopy, Timestamp, VolumeDescriptor, Xattr, XattrHow,
};

/// The kind of lease a recall wants to make room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseMode {
    /// Shared: many clients may hold it.
    Read,
    /// Exclusive: one client, and no readers.
    Write,
}

/// A request from a client (or admin tool) to a stripe server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Opens a session. `volume: None` is for admin tools (format, status) and
    /// takes no leases. Answered by [`Reply::Hello`].
    Hello {
        /// The volume this client expects; `WrongVolume` if the server has another.
        volume: Option<Uuid>,
        /// Random id that owns this client's leases.
        client_id: u64,
        /// Free-form name for logs and `status` (e.g. `mount@host:/mnt`).
        client_name: String,
        /// Must equal [`crate::PROTOCOL_VERSION`].
        version: u32,
    },
    /// Writes the volume descriptor and this server's index. Refused with
    /// `WrongVolume` if the server already belongs to a different volume; a
    /// repeat with the same descriptor is a no-op. The server that owns
    /// [`crate::ROOT_ID`] creates the root directory (mode 0o755, uid/gid 0).
    Format {
        /// The descriptor.
        descriptor: VolumeDescriptor,
        /// This server's position in `descriptor.servers`.
        index: u32,
    },
    /// Makes this empty, unformatted server server `index` of an existing
    /// volume in place of one whose disk was lost (`morris volume
    /// replace`): it keeps every metadata range as a copy to be brought up
    /// to date (never as their primary), reads none of its data blocks
    /// until every file with blocks on it has them recorded stale (then
    /// resync rebuilds them from the other copies). Refused with
    /// `WrongVolume` if it belongs to another volume, `Invalid` if it is
    /// already formatted otherwise; a repeat is a no-op. [`Reply::Ok`].
    Replace {
        /// The volume's descriptor (from a running member).
        descriptor: VolumeDescriptor,
        /// This server's position in `descriptor.servers`.
        index: u32,
    },
    /// Counters for `morris status`. Answered by [`Reply::Status`].
    Status,
    /// Capacity of this server's disk. Answered by [`Reply::Statfs`].
    Statfs,
    /// Keeps this client's leases alive. Answered by [`Reply::Ok`].
    Renew,
    /// Takes the read lease on `ino` (paper: `acquire_read`) and returns the
    /// inode and, if they are few, its extended attributes
    /// ([`Reply::ReadLeased`]).
    AcquireRead {
        /// The inode.
        ino: Handle,
    },
    /// Takes the write lease on `ino` (paper: `acquire_write`) and returns the inode.
    AcquireWrite {
        /// The inode.
        ino: Handle,
    },
    /// Gives up whatever lease this client holds on `ino` (paper: `unlock`).
    /// Answered by [`Reply::Ok`] even if none was held.
    Release {
        /// The inode.
        ino: FileId,
    },
    /// Reads an inode without taking a lease (fsck, admin). [`Reply::Inode`].
    GetInode {
        /// The inode.
        ino: FileId,
    },
    /// Allocates a new file id owned by this server, stores the inode, and
    /// grants the caller the write lease on it. Directories start with nlink 2
    /// and `parent` as given. [`Reply::Inode`].
    CreateInode {
        /// Parent directory (recorded for directories).
        parent: FileId,
        /// Initial attributes (nlink is set by the server: 1, or 2 for a directory).
        attr: Attr,
        /// Symlink target.
        target: Option<Vec<u8>>,
        /// The binding the new object is made under (its parent is in a
        /// writable cache): it gets a local [`crate::home::HomeLink`].
        home: Option<FileId>,
        /// Operation id (see "Exactly once" above; 0: none).
        op: u64,
        /// Its first extended attributes: the POSIX ACLs it inherits from
        /// its directory's default ACL (the client computes them).
        xattrs: Vec<Xattr>,
    },
    /// Changes attributes; takes the write lease implicitly. ctime becomes now
    /// unless given. [`Reply::Inode`].
    SetAttr {
        /// The inode.
        ino: Handle,
        /// The changes.
        set: SetAttr,
    },
    /// Removes an inode; takes the write lease implicitly; a directory must be
    /// empty (`NotEmpty`). Data blocks are removed separately by `DeleteData`
    /// to every server. [`Reply::Ok`].
    DeleteInode {
        /// The inode.
        ino: Handle,
        /// Operation id (0: none).
        op: u64,
    },
    /// Looks a name up in a directory; takes the read lease on the directory
    /// implicitly. [`Reply::Entry`] (`None` when absent).
    Lookup {
        /// The directory.
        dir: Handle,
        /// The name.
        name: Vec<u8>,
    },
    /// Lists entries with cookie > `cookie`, in cookie order, at most `max`;
    /// takes the read lease on the directory implicitly. [`Reply::Entries`].
    /// In a cached directory, the listing from cookie 0 first brings every
    /// name from home if the directory is not listed whole yet (at its
    /// owner, once however many ask); while names are still coming, the
    /// end so far waits for more, and an empty page that is not the end
    /// means none came for a while (ask again).
    ReadDir {
        /// The directory.
        dir: Handle,
        /// Continue after this cookie (0: from the start).
        cookie: u64,
        /// Most entries to return (the server may return fewer).
        max: u32,
    },
    /// Adds `name → child` to `dir`, updating the directory's mtime, ctime,
    /// size and (for a directory child) nlink in the same transaction; takes the
    /// write lease on `dir` implicitly. If `name` exists it is replaced only when
    /// its child is `replace`, else `Exists`. [`Reply::Removed`] with the
    /// replaced entry and the updated directory inode.
    Link {
        /// The directory.
        dir: Handle,
        /// The new name.
        name: Vec<u8>,
        /// What it names.
        child: Handle,
        /// The child's kind (cached in the entry).
        kind: FileKind,
        /// Id of an existing entry's child that may be replaced.
        replace: Option<FileId>,
        /// Operation id (0: none).
        op: u64,
    },
    /// Removes `name` from `dir` (if `expect` is given, only if it names that
    /// child, else `NotFound`), updating mtime/ctime/size/nlink; write lease
    /// implicit. Does not touch the child's inode. [`Reply::Removed`].
    Unlink {
        /// The directory.
        dir: Handle,
        /// The name.
        name: Vec<u8>,
        /// The child the entry must name.
        expect: Option<FileId>,
        /// Operation id (0: none).
        op: u64,
    },
    /// Renames within one directory atomically; `to` may exist only if it names
    /// `replace`. Write lease implicit. [`Reply::Removed`] with the replaced entry.
    Rename {
        /// The directory.
        dir: Handle,
        /// Old name.
        from: Vec<u8>,
        /// New name.
        to: Vec<u8>,
        /// Id of the existing `to` entry's child that may be replaced.
        replace: Option<FileId>,
        /// Operation id (0: none).
        op: u64,
    },
    /// Reads `len` bytes at `offset` inside block `index` (>= 1) of file `id`.
    /// Answered by [`Reply::Data`] with the bytes as payload; the payload is
    /// shorter than `len` where the block ends before, and the missing tail
    /// reads as zeros.
    Read {
        /// The file.
        id: FileId,
        /// The block index (1-based; 0 is the inode).
        index: u64,
        /// Which copy (0-based position in `Layout::placement`); this server
        /// must hold it.
        replica: u8,
        /// Offset within the block.
        offset: u32,
        /// Bytes wanted; `offset + len` must not pass the stripe unit.
        len: u32,
    },
    /// Writes the payload at `offset` inside block `index` of file `id`;
    /// `sync` makes the server flush it to stable storage before answering.
    /// [`Reply::Ok`]. The payload must not pass the end of the block.
    Write {
        /// The file.
        id: FileId,
        /// The block index (1-based).
        index: u64,
        /// Which copy (0-based position in `Layout::placement`); this server
        /// must hold it. A client writes every copy before it answers.
        replica: u8,
        /// Offset within the block.
        offset: u32,
        /// Flush to stable storage before answering.
        sync: bool,
        /// The fence number of the write lease the change is made under
        /// ([`Reply::Leased`]); refused with `NoLease` if this server has
        /// already seen a higher one for the file. 0 (no lease) only from
        /// server and admin sessions (resync).
        fence: u64,
    },
    /// Frees this server's part of file `id` beyond `size` bytes. [`Reply::Ok`].
    Truncate {
        /// The file.
        id: FileId,
        /// The new size.
        size: u64,
        /// As in [`Request::Write`].
        fence: u64,
    },
    /// Removes every block of file `id` held by this server. [`Reply::Ok`].
    DeleteData {
        /// The file.
        id: FileId,
    },
    /// Flushes file `id`'s blocks (or, with `None`, everything) and the
    /// metadata store to stable storage. [`Reply::Ok`].
    Sync {
        /// The file, or all.
        id: Option<FileId>,
    },
    /// Lists inodes with id > `after`, ascending, at most `max`. [`Reply::Inodes`].
    ScanInodes {
        /// Continue after this id (0: from the start).
        after: FileId,
        /// Most to return.
        max: u32,
    },
    /// Lists the inodes of metadata range `range` with id > `after`,
    /// ascending, at most `max`, from the copy that serves the range
    /// (`NotOwner` from any other). [`Reply::Inodes`].
    ScanRange {
        /// The metadata range.
        range: u32,
        /// Continue after this id (0: from the start).
        after: FileId,
        /// Most to return.
        max: u32,
    },
    /// Lists directory entries after `(dir, cookie)`, ascending. [`Reply::ScanEntries`].
    ScanEntries {
        /// Continue after this directory ...
        after_dir: FileId,
        /// ... and this cookie within it.
        after_cookie: u64,
        /// Most to return.
        max: u32,
    },
    /// Lists files that have blocks here with id > `after`. [`Reply::DataFiles`].
    ScanData {
        /// Continue after this id.
        after: FileId,
        /// Most to return.
        max: u32,
    },
    /// Records at `ino`'s owner that `server`'s copies of its blocks `from`
    /// and above missed a write (mirrored volumes). Takes the write lease
    /// implicitly (the writer holds it). An existing record is widened to
    /// the lower `from` and gets a new `seq`. [`Reply::Inode`], whose
    /// `stale` lists every record. Sent before the write is answered.
    MarkStale {
        /// The file.
        ino: Handle,
        /// The server that missed the write.
        server: u32,
        /// Lowest block index it missed (>= 1).
        from: u64,
    },
    /// Records at `id`'s owner that `server` may still hold blocks of the
    /// deleted file `id` (its `DeleteData` failed). No lease. [`Reply::Ok`].
    NoteLeftover {
        /// The deleted file.
        id: FileId,
        /// The server that kept its blocks.
        server: u32,
    },
    /// Lists the stale-copy records kept here that name `server`, for files
    /// with id > `after`, ascending. No lease. [`Reply::Stale`].
    ScanStale {
        /// The server whose records are wanted.
        server: u32,
        /// Continue after this id.
        after: FileId,
        /// Most to return.
        max: u32,
    },
    /// A resync caught `server`'s copies of `id` up from the record's
    /// `from` to below `upto` (`None`: all of them; for a deleted file, its
    /// blocks are gone). Applied only if the record still has `seq`, else
    /// `Stale` (a newer write was missed meanwhile; copy again). The caller
    /// holds a read lease on the file, so no write ran while it copied.
    /// [`Reply::Ok`].
    ResyncAdvance {
        /// The file.
        id: FileId,
        /// The server caught up.
        server: u32,
        /// The record's `seq` when the copy started.
        seq: u64,
        /// First block not yet copied, or `None` when done.
        upto: Option<u64>,
    },
    /// Server to server, on a mirrored volume: the primary of metadata range
    /// `range` (generation `gen`) states where its copy is (`lineage`, `seq`)
    /// and renews its ownership lease at the receiver, the range's other copy.
    /// [`Reply::PeerState`]. The receiver refuses with `NotOwner` (in the
    /// reply's fields) if it serves the range itself at a higher generation.
    PeerSync {
        /// The metadata range.
        range: u32,
        /// The sender's ownership generation.
        gen: u64,
        /// The sender's change-stream identity (new every time it starts capturing).
        lineage: u64,
        /// The last change the sender has committed.
        seq: u64,
        /// The sender has ownership decided by etcd (`--etcd`); both copies
        /// of a range must agree, or it is refused with `Invalid`.
        etcd: bool,
        /// The receiver is the sender's *successor*: the one copy that may
        /// take the range over if the sender goes silent (with three
        /// copies the third only follows).
        candidate: bool,
    },
    /// Server to server: changes `first_seq..` of range `range`, as SQLite
    /// session changesets (payload: postcard `Vec<Vec<u8>>`), to be applied in
    /// order; renews the sender's ownership lease. `OutOfSync` if the receiver
    /// is not exactly at `first_seq - 1` of `lineage`. [`Reply::Ok`].
    Replicate {
        /// The metadata range.
        range: u32,
        /// The sender's ownership generation.
        gen: u64,
        /// The sender's change-stream identity.
        lineage: u64,
        /// Sequence number of the first changeset in the payload.
        first_seq: u64,
    },
    /// Server to server: a piece of a whole copy of range `range`'s
    /// metadata database (payload: the bytes at `offset`). The piece with
    /// `last` installs it, at position (`lineage`, `seq`). [`Reply::Ok`].
    SnapshotChunk {
        /// The metadata range.
        range: u32,
        /// The sender's ownership generation.
        gen: u64,
        /// The sender's change-stream identity.
        lineage: u64,
        /// The last change the snapshot includes.
        seq: u64,
        /// Byte offset of the payload in the database file.
        offset: u64,
        /// This is the final piece.
        last: bool,
    },
    /// Drops one link of `ino` after the caller removed an entry naming it;
    /// takes the write lease implicitly. `nlink` goes down by one (a
    /// directory's to 0). At 0 the inode becomes an **orphan**: unnamed,
    /// kept while any live client has it open ([`Request::SetOpen`]), until
    /// [`Request::Reap`] removes it. [`Reply::Inode`] after the change.
    DropLink {
        /// The inode.
        ino: Handle,
        /// Operation id (0: none).
        op: u64,
    },
    /// Records (`open: true`) or forgets that the calling client has `ino`
    /// open, so that an orphan stays while it is open anywhere. A record
    /// lives as long as its client keeps talking to this server (a client
    /// silent for a lease time loses it, as it loses its leases). No lease.
    /// `Stale` if the inode is gone. [`Reply::Ok`].
    SetOpen {
        /// The inode.
        ino: Handle,
        /// Open (record it) or closed (forget it).
        open: bool,
        /// Operation id (0: none).
        op: u64,
    },
    /// Removes `ino` if it is an orphan (nlink 0) that no live client has
    /// open; a directory must be empty. No lease. [`Reply::Reaped`] with the
    /// removed inode, whose data blocks the caller then deletes
    /// (`DeleteData`), or `None` if it stays (named again, or open).
    Reap {
        /// The inode.
        ino: Handle,
        /// Operation id (0: none).
        op: u64,
    },
    /// Lists the orphans kept here with id > `after`, ascending, at most
    /// `max`, over every range this server serves. No lease.
    /// [`Reply::Orphans`].
    ScanOrphans {
        /// Continue after this id.
        after: FileId,
        /// Most to return.
        max: u32,
    },
    // ---------------------------------------------------------------
    // Cache mode (docs/architecture.md, "Cache mode"). Requests that make
    // a server ask home name the binding (the bound directory's id); a
    // server that has not been told that binding's settings answers
    // `UnknownBinding`, and the client sends `OpenHome` and repeats.
    /// Makes the empty directory `dir` a cache of the home `binding.url`
    /// names (sent to the directory's owner, which reads home's root and
    /// stores the binding with the directory, recalling every lease on it).
    /// [`Reply::Inode`]: the directory, with its [`crate::home::HomeLink`].
    Bind {
        /// The directory.
        dir: Handle,
        /// The binding's settings.
        binding: Binding,
    },
    /// Removes the binding of `dir` (its cached entries must be gone).
    /// [`Reply::Inode`].
    Unbind {
        /// The bound directory.
        dir: Handle,
    },
    /// Tells this server the settings of the binding rooted at `binding`.
    /// Always [`Reply::Ok`]: the home itself is opened when first needed.
    OpenHome {
        /// The bound directory's id.
        binding: FileId,
        /// Its settings, as stored with it.
        spec: Binding,
    },
    /// Looks `name` up in the cached directory `dir` (at its owner): an
    /// entry it has is returned; in a directory not listed whole, a name
    /// it lacks is looked up at home and, if there, added with its seed.
    /// Takes no lease (the caller then looks up under its lease as usual).
    /// [`Reply::HomeEntry`]: the entry, with the seed of its object if the
    /// directory keeps one (so that the caller can take the object's lease
    /// with `AcquireCached` whether its inode exists yet or not).
    HomeLookup {
        /// The directory.
        dir: Handle,
        /// The name.
        name: Vec<u8>,
    },
    /// The seed of entry `dir/name`: the inode its home object will have,
    /// to be created at its owner with `CreateCached`. [`Reply::Inode`];
    /// `NotFound` if the entry was not fetched from home.
    Seed {
        /// The directory.
        dir: Handle,
        /// The name.
        name: Vec<u8>,
    },
    /// Creates a cached object's inode from its seed (at the owner of
    /// `inode.id`), unless it exists. [`Reply::Inode`]: as stored.
    CreateCached {
        /// The seed.
        inode: Inode,
    },
    /// `AcquireRead` of a cached object whose inode may not exist yet (a
    /// placeholder): at the owner of `seed.id`, the inode is created from
    /// the seed first if it is missing (as `CreateCached`), then the read
    /// lease on it is taken. [`Reply::Inode`]; `Stale` if the object at
    /// that id is not the seed's.
    AcquireCached {
        /// The seed (as `Seed` or `HomeLookup` returned it).
        seed: Inode,
    },
    /// Compares cached object `ino` with home (at its owner) if the
    /// binding's validity has passed since it was last compared: if home
    /// changed it, every lease on it is recalled and the new attributes
    /// (and, for a directory, its entries) are taken, with the next content
    /// version. Takes no lease. [`Reply::Inode`]: the object now.
    Revalidate {
        /// The object.
        ino: Handle,
    },
    /// `Read` of a cached file: a unit this server does not hold at
    /// `home.version` is fetched from home first (once, however many
    /// readers ask for it at once). [`Reply::Data`].
    ReadCached {
        /// The file.
        id: FileId,
        /// The block index (1-based).
        index: u64,
        /// Which copy this server holds.
        replica: u8,
        /// Offset within the block.
        offset: u32,
        /// Bytes wanted.
        len: u32,
        /// What to fetch it from.
        home: HomeRef,
    },
    /// Fetches the unit from home if this server does not hold it at
    /// `home.version`, without returning it (prefetch). [`Reply::Fetched`].
    FetchCached {
        /// The file.
        id: FileId,
        /// The block index (1-based).
        index: u64,
        /// Which copy this server holds.
        replica: u8,
        /// What to fetch it from.
        home: HomeRef,
    },
    /// Frees every unit of cached file `id` held here (it reads back from
    /// home when next read). [`Reply::Evicted`].
    Evict {
        /// The file.
        id: FileId,
    },
    /// This server's cache counters, per binding it knows. [`Reply::Cache`].
    CacheStatus,
    /// Removes every cached object of binding `binding` from the metadata
    /// ranges this server serves (entries, seeds, inodes, links) and every
    /// unit of it held here: the first step of `morris cache unbind`, sent
    /// to every server before `Unbind`. [`Reply::Ok`].
    ForgetBinding {
        /// The bound directory's id.
        binding: FileId,
    },
    // ---------------------------------------------------------------
    // Cache mode II, write-back (docs/architecture.md, "Cache mode II").
    // Sent by the server that pushes a binding (its bound directory's
    // owner) to the others; no lease is taken.
    /// The changes not yet pushed home of objects of `binding` in
    /// metadata range `range` (at the server that serves it now).
    /// [`Reply::WbMarks`].
    WbMarks {
        /// The bound directory's id.
        binding: FileId,
        /// The metadata range.
        range: u32,
        /// Only marks set at or before this time (ms since the epoch:
        /// those past the sync lag; `u64::MAX`: all).
        due_before: u64,
    },
    /// Clears marks that were pushed: each `(id, count)` only if the
    /// object's change count is still `count` (a change made during the
    /// push keeps its mark). [`Reply::Ok`].
    WbClear {
        /// Objects and the change counts that were pushed.
        marks: Vec<(FileId, u64)>,
    },
    /// Where home has the objects of `binding` in metadata range `range`
    /// that the write-back made or moved there. [`Reply::WbHomes`].
    WbHomes {
        /// The bound directory's id.
        binding: FileId,
        /// The metadata range.
        range: u32,
    },
    /// Records where home has object `home.id` (at its owner), and, when
    /// given, home's stamp of it just after the write-back made it there
    /// (`seen`: what a later push compares with to find a change made at
    /// home meanwhile). [`Reply::Ok`].
    WbSetHome {
        /// The bound directory's id.
        binding: FileId,
        /// The record.
        home: WbHome,
        /// Home's stamp of the object as the write-back left it.
        seen: Option<HomeStamp>,
    },
    /// Before an object fetched from home is moved in the cache: records
    /// that home has it at `home.dir`/`home.name` (at its owner), unless
    /// a record of where home has it exists already (one left by an
    /// earlier move not pushed yet); a file's detached record (by handle,
    /// `dir` 0) becomes this one. The write-back then moves it at home.
    /// [`Reply::Ok`].
    WbPlace {
        /// The bound directory's id.
        binding: FileId,
        /// Where home has the object now.
        home: WbHome,
    },
    /// Records home's stamp of object `id` just after the write-back
    /// pushed it (at its owner). [`Reply::Ok`].
    WbSeen {
        /// The object.
        id: FileId,
        /// Home's stamp of it as the push left it.
        seen: HomeStamp,
    },
    /// A conflict resolved for home (at the object's owner, every lease on
    /// it recalled first): object `id` becomes home's version of it
    /// (handle, stamp, attributes; a newer content version, so data
    /// fetched or written before is never served as home's), and its mark
    /// is dropped, only if its change count is still `count` (the
    /// cache's version, kept under `.conflicts/` at home, had every
    /// change). `place`: where home has it now (objects made in the
    /// cache). `now` `None`: home removed it; only the mark goes.
    /// [`Reply::Ok`], or `Stale` if the object changed meanwhile (the next
    /// round resolves it again).
    WbRebase {
        /// The bound directory's id.
        binding: FileId,
        /// The object.
        id: FileId,
        /// Its change count as the push read it (0: no mark); `None`:
        /// the mark stays (a directory merged with home's: its entries
        /// are still to push).
        count: Option<u64>,
        /// Where home has it (objects made in the cache).
        place: Option<WbHome>,
        /// Home's handle, stamp and attributes of it (`None`: home removed
        /// it).
        now: Option<(Vec<u8>, HomeStamp, Attr)>,
    },
    /// Names that objects fetched from home left in the cache (removed or
    /// replaced), by directory, in metadata range `range`: the write-back
    /// removes them at home. [`Reply::WbHomes`] (`id`: the object,
    /// `handle` empty).
    WbGone {
        /// The bound directory's id.
        binding: FileId,
        /// The metadata range.
        range: u32,
    },
    /// A name of object `id` in metadata range `range` (a directory kept
    /// there and the name; a scan: for the rare conflict, whose kept copy
    /// is named after it). [`Reply::WbHomes`] with at most one record.
    WbNameOf {
        /// The object.
        id: FileId,
        /// The metadata range.
        range: u32,
    },
    /// Forgets departed names (`(dir, name, id)`) home no longer has, at
    /// the owner of `at` (the records' range). [`Reply::Ok`].
    WbGoneClear {
        /// An id of the metadata range that keeps the records.
        at: FileId,
        /// The names.
        gone: Vec<(FileId, Vec<u8>, FileId)>,
    },
    /// Entries of directory `dir` after `cookie`, without a lease (the
    /// write-back's view: a change after it is marked again).
    /// [`Reply::Entries`].
    WbEntries {
        /// The directory.
        dir: FileId,
        /// Continue after this cookie (0: from the start).
        cookie: u64,
        /// Most entries.
        max: u32,
    },
    /// Writes the units of file `id` whose first copy this server holds
    /// to home's file `handle` (below `size`), and commits them.
    /// [`Reply::Pushed`] once home has them on stable storage.
    PushData {
        /// The bound directory's id.
        binding: FileId,
        /// Its settings (to open the home).
        spec: Binding,
        /// The file.
        id: FileId,
        /// Home's handle of it.
        handle: Vec<u8>,
        /// Its size in the cache.
        size: u64,
        /// Servers that do not answer: the units whose first copy is on
        /// one of them are pushed from their next copy instead.
        down: Vec<u32>,
        /// The file's stale-copy records: a copy they cover pushes
        /// nothing (the next current copy does).
        stale: Vec<StaleCopy>,
    },
    /// Before cached file `id` is first written in a writable cache: this
    /// server fetches every unit of it it holds a copy of that it does not
    /// hold at `home.version`, and makes them the cache's own (never
    /// evicted or fetched again; a `ReadCached` of them answers `Stale`).
    /// [`Reply::Fetched`].
    Localize {
        /// The file.
        id: FileId,
        /// What it is at home.
        home: HomeRef,
        /// The file is about to be emptied: nothing is fetched, the
        /// server's units of it are evicted instead.
        truncate: bool,
    },
    /// Detaches cached file `ino` from home's data (at its owner, every
    /// lease on it recalled first), after `Localize` at every server: its
    /// link becomes a local one, and the write-back pushes its data back
    /// to the same home file. [`Reply::Inode`].
    Detach {
        /// The file.
        ino: Handle,
        /// Emptied in the same step (after `Localize` with `truncate`),
        /// its data marked for the write-back.
        truncate: bool,
    },
    /// Waits until every change to `binding` made before this request is
    /// at home (at the binding's pusher, the bound directory's owner).
    /// [`Reply::Flushed`], after at most about ten seconds (ask again
    /// while it says not done).
    Flush {
        /// The bound directory's id.
        binding: FileId,
    },
    /// Starts (or, with `stop`, stops) a scrub pass of this server: every
    /// chunk of every extent file read and checked against its checksum,
    /// at most `rate` bytes a second (0: the server's own limit). A chunk
    /// that fails is handed to repair like one a read found. Progress is in
    /// `Status` (`integrity.scrub`). Volume key only. [`Reply::Ok`].
    Scrub {
        /// Bytes a second at most; 0 for the server's default.
        rate: u64,
        /// Stop the pass that runs instead of starting one.
        stop: bool,
    },
    /// Server to server: the write lease numbered `above` on file `id` was
    /// taken from its holder by force (silent, or deaf to a recall); refuse
    /// every change carrying that number or a lower one. Sent by the lease's
    /// owner to every server before the next grant is answered. Volume key
    /// only. [`Reply::FenceRaised`].
    RaiseFence {
        /// The file.
        id: FileId,
        /// The revoked grant's fence number.
        above: u64,
    },
    /// Every extended attribute of an object; takes the read lease on it
    /// implicitly (the caller may keep the answer while it holds a lease).
    /// [`Reply::Xattrs`].
    GetXattrs {
        /// The object.
        ino: Handle,
    },
    /// Sets (`value: Some`) or removes (`None`; `NoData` if absent) one
    /// extended attribute; takes the write lease implicitly; ctime becomes
    /// now. Names are 1..=[`crate::MAX_XATTR_NAME`] bytes without NUL,
    /// values at most [`crate::MAX_XATTR_VALUE`]; more than
    /// [`crate::MAX_XATTR_NAMES`] bytes of names or
    /// [`crate::MAX_XATTR_BYTES`] in all on one object is `NoSpace`. Not
    /// for objects cached from a home (`NotSupported`). [`Reply::Inode`].
    SetXattr {
        /// The object.
        ino: Handle,
        /// The attribute's name.
        name: Vec<u8>,
        /// Its new value; `None` removes it.
        value: Option<Vec<u8>>,
        /// Whether it must, or must not, be there already.
        how: XattrHow,
        /// Operation id (0: none).
        op: u64,
    },
    /// Locks (read or write) or unlocks bytes `start..=end` of a file for
    /// lock owner `owner` of this client (the kernel's: a process's file
    /// table, or an open file description), replacing what that owner held
    /// there. A conflicting lock of another owner answers `WouldBlock`, or
    /// with `wait`, the request waits for it (a few seconds at most, then
    /// [`Reply::LockPending`]: ask again) unless waiting would deadlock
    /// (`Deadlock`). Kept by the file's owner until unlocked, or until the
    /// client has not been heard from for a lease time. [`Reply::Ok`].
    Lock {
        /// The file.
        ino: Handle,
        /// The lock owner, as this client numbers them.
        owner: u64,
        /// The process asking (reported by `TestLock`).
        pid: u32,
        /// First byte.
        start: u64,
        /// Last byte, inclusive (`u64::MAX`: to the end of the file).
        end: u64,
        /// Read, write or unlock.
        kind: LockKind,
        /// Wait for a conflicting lock to go.
        wait: bool,
        /// A lock this client held before the file's owner restarted or
        /// its range moved (it asks for it again): allowed during the
        /// grace period that follows, when other locks are not.
        reclaim: bool,
    },
    /// Allocates (`punch: false`: space reserved, reading as zeros where
    /// nothing was written) or frees (`punch: true`: reading as zeros
    /// again) bytes `offset..offset + len` of file `id`, in the blocks this
    /// server keeps (every copy of them here). The file's size is the
    /// owner's business (`SetAttr`). Carries the write lease's fence
    /// number, as [`Request::Write`]. `NoSpace` if the space is not there.
    /// [`Reply::Ok`].
    Fallocate {
        /// The file.
        id: FileId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Free them instead of reserving them.
        punch: bool,
        /// The write lease's fence number.
        fence: u64,
    },
    /// The first lock of another owner that would conflict with a `write`
    /// (or read) lock of `owner` on `start..=end`. [`Reply::LockTest`].
    TestLock {
        /// The file.
        ino: Handle,
        /// The lock owner asking.
        owner: u64,
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: u64,
        /// A write lock would be asked for; else a read lock.
        write: bool,
    },
    /// Swaps what names `a` and `b` of directory `dir` point at, at once
    /// (`renameat2(RENAME_EXCHANGE)` within one directory); both must
    /// exist. Takes the write lease on the directory implicitly. Not in a
    /// directory cached from a home (`NotSupported`). [`Reply::Removed`]
    /// (no entry; the directory).
    Exchange {
        /// The directory.
        dir: Handle,
        /// One name.
        a: Vec<u8>,
        /// The other.
        b: Vec<u8>,
        /// Operation id (0: none).
        op: u64,
    },
    /// Moves the inode's access time forward to `atime` (never back; the
    /// ctime stays), without a lease: what a read under `relatime` asks
    /// for. Other clients see it when they next fetch the inode. Objects
    /// cached from a home are left alone. [`Reply::Ok`].
    TouchAtime {
        /// The inode.
        ino: Handle,
        /// The time of the read.
        atime: Timestamp,
    },
    /// `SEEK_DATA` / `SEEK_HOLE` among the blocks of file `id` whose copy
    /// `replica` this server keeps: the first byte of the file at or
    /// after `from` that those blocks hold as data (`hole: false`) or as
    /// a hole (`hole: true`; past the end of what is kept is a hole).
    /// Blocks kept elsewhere are the client's to ask about. No lease: the
    /// answer is as of now. [`Reply::Sought`].
    Seek {
        /// The file.
        id: FileId,
        /// Which copy's extent file to look in.
        replica: u8,
        /// Byte of the file to search from.
        from: u64,
        /// Look for a hole; else for data.
        hole: bool,
    },
    /// Moves the inode's status change time forward to `ctime` (never
    /// back), without a lease: what a rename does to the object it moves
    /// (the directories' owners commit the names). Other clients see it
    /// when they next fetch the inode. Objects cached from a home are left
    /// alone. [`Reply::Ok`].
    TouchCtime {
        /// The inode.
        ino: Handle,
        /// The time of the rename.
        ctime: Timestamp,
    },
    /// Server to server (a scrub comparing copies): the checksum entries of
    /// chunks `first..` of copy `replica`'s extent file of file `id` here,
    /// at most `max` of them, none past the end of that file. Volume key
    /// only. [`Reply::ChunkSums`].
    ChunkSums {
        /// The file.
        id: FileId,
        /// Which copy's extent file.
        replica: u8,
        /// The first 4 KiB chunk.
        first: u64,
        /// Most entries to answer.
        max: u32,
    },
    /// Bytes the disk of this server holds for the blocks of file `id`
    /// whose copy `replica` this server keeps (what `st_blocks` counts:
    /// holes take none). No lease: the answer is as of now.
    /// [`Reply::Allocated`].
    Allocated {
        /// The file.
        id: FileId,
        /// Which copy's extent file.
        replica: u8,
    },
    /// Who holds a lease on inode `ino` now (`morris info`): answered by
    /// the server serving the inode's metadata range. [`Reply::Holders`].
    Holders {
        /// The inode.
        ino: FileId,
    },
    /// Sets aside `count` (1..=1024) new file ids of this server's own
    /// metadata range for the caller, who may later create inodes with
    /// them ([`Request::CreateInodeAt`]); nobody else is given them.
    /// [`Reply::Ids`].
    ReserveIds {
        /// How many.
        count: u32,
    },
    /// [`Request::CreateInode`] with an id the caller reserved
    /// ([`Request::ReserveIds`]) and the generation it chose: stores the
    /// inode, unless the op was done already, and grants the caller the
    /// write lease on it. Sent to whoever serves the id's range.
    /// [`Reply::Leased`].
    CreateInodeAt {
        /// The reserved id.
        id: FileId,
        /// Its generation (not 0).
        gen: u32,
        /// Parent directory (recorded for directories).
        parent: FileId,
        /// Initial attributes, as for [`Request::CreateInode`].
        attr: Attr,
        /// Symlink target.
        target: Option<Vec<u8>>,
        /// Operation id (see "Exactly once" above; 0: none).
        op: u64,
        /// Its first extended attributes (inherited ACLs).
        xattrs: Vec<Xattr>,
    },
    /// What each user and group has stored in the metadata ranges this
    /// server serves (`morris quota`). [`Reply::Usage`].
    Usage,
    /// Sets (both 0: removes) a user's or a group's limits; kept with the
    /// root directory's range. Volume key only.
    SetQuota {
        /// The limits.
        limit: QuotaLimit,
    },
    /// Every limit set. [`Reply::Quotas`].
    Quotas,
    /// The seeds of the placeholders of cached directory `dir` whose
    /// entries' cookies lie in the block of [`SEED_BLOCK`] cookies holding
    /// `cookie` (a listing from home stores names at consecutive cookies,
    /// so that is up to `SEED_BLOCK` names listed together), in cookie
    /// order, at the directory's owner: a client that met one placeholder
    /// after a listing makes the next ones with one request each
    /// (`AcquireCached`), not three. [`Reply::Inodes`].
    Seeds {
        /// The directory.
        dir: Handle,
        /// A cookie of the block.
        cookie: u64,
    },
    /// Creates, at their owner (every seed's id must be one of its
    /// range), the inodes of those cached objects that have none, from
    /// their seeds, in one transaction (an object already made is left as
    /// it is). Sent in the background by a client that met placeholders
    /// of a block ([`Request::Seeds`]), so that the lookups of their names
    /// that follow take no write each. [`Reply::Ok`].
    CreateCachedMany {
        /// The seeds.
        seeds: Vec<Inode>,
    },
    /// Reads inodes without taking leases (a listing's attributes: the NFS
    /// gateway's READDIRPLUS), at their owner: every id must be of its
    /// range. [`Reply::Inodes`]: those found with the handle's generation,
    /// in the order asked (the others are gone or replaced: left out).
    GetInodes {
        /// The inodes.
        inos: Vec<Handle>,
    },
    /// Takes the read lease on each of `inos`, as an
    /// [`Request::AcquireRead`] of each would (recalling what other clients
    /// hold; answered once every lease is granted), at their owner: every
    /// id must be of its range. [`Reply::ReadLeasedMany`]. A FUSE
    /// listing's attributes (`READDIRPLUS`): one request per server for a
    /// batch of names instead of an `AcquireRead` each.
    AcquireReadMany {
        /// The inodes.
        inos: Vec<Handle>,
    },
}

/// A change to one object not yet pushed home (cache mode II), kept by the
/// server that owns the object, in the transaction of the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WbMark {
    /// The object.
    pub id: FileId,
    /// Its names changed (a directory: entries made, removed, renamed).
    pub names: bool,
    /// Its attributes changed (mode, owner, times).
    pub attrs: bool,
    /// Its data changed (a file: written or truncated).
    pub data: bool,
    /// Changes counted since the mark was set: a mark is cleared only if
    /// this is unchanged since the push read it.
    pub count: u64,
    /// When the mark was set (wall clock, ms since the epoch).
    pub since_ms: u64,
}

/// Where home has an object the write-back made or moved there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WbHome {
    /// The object (its id in the cache).
    pub id: FileId,
    /// The cache directory whose home directory holds it.
    pub dir: FileId,
    /// Its name there.
    pub name: Vec<u8>,
    /// Home's file number of it.
    pub fileid: u64,
    /// Home's handle of it.
    pub handle: Vec<u8>,
}

impl Request {
    /// The operation id of a request that carries one (0: none).
    pub fn op(&self) -> u64 {
        match self {
            Request::CreateInode { op, .. }
            | Request::CreateInodeAt { op, .. }
            | Request::DeleteInode { op, .. }
            | Request::Link { op, .. }
            | Request::Unlink { op, .. }
            | Request::Rename { op, .. }
            | Request::Exchange { op, .. }
            | Request::DropLink { op, .. }
            | Request::SetOpen { op, .. }
            | Request::SetXattr { op, .. }
            | Request::Reap { op, .. } => *op,
            _ => 0,
        }
    }

    /// Sets the operation id of a request that carries one; others are
    /// returned unchanged.
    pub fn with_op(mut self, id: u64) -> Request {
        match &mut self {
            Request::CreateInode { op, .. }
            | Request::CreateInodeAt { op, .. }
            | Request::DeleteInode { op, .. }
            | Request::Link { op, .. }
            | Request::Unlink { op, .. }
            | Request::Rename { op, .. }
            | Request::Exchange { op, .. }
            | Request::DropLink { op, .. }
            | Request::SetOpen { op, .. }
            | Request::SetXattr { op, .. }
            | Request::Reap { op, .. } => *op = id,
            _ => {}
        }
        self
    }
}

impl Request {
    /// True for the requests only servers send each other (metadata
    /// mirroring, the write-back's bookkeeping) and for `Format`: a
    /// connection that proved only the client key may not send them.
    pub fn server_only(&self) -> bool {
        matches!(
            self,
            Request::Format { .. }
                | Request::Replace { .. }
                | Request::PeerSync { .. }
                | Request::Replicate { .. }
                | Request::SnapshotChunk { .. }
                | Request::PushData { .. }
                | Request::WbMarks { .. }
                | Request::WbClear { .. }
                | Request::WbHomes { .. }
                | Request::WbSetHome { .. }
                | Request::WbSeen { .. }
                | Request::WbRebase { .. }
                | Request::WbGone { .. }
                | Request::WbNameOf { .. }
                | Request::WbGoneClear { .. }
                | Request::WbEntries { .. }
                | Request::Scrub { .. }
                | Request::RaiseFence { .. }
                | Request::ChunkSums { .. }
                | Request::SetQuota { .. }
        )
    }

    /// Every request name [`Request::name`] returns (for metrics).
    pub const NAMES: [&'static str; 89] = [
        "Hello",
        "Format",
        "Replace",
        "Status",
        "Statfs",
        "Renew",
        "AcquireRead",
        "AcquireWrite",
        "Release",
        "GetInode",
        "CreateInode",
        "SetAttr",
        "DeleteInode",
        "Lookup",
        "ReadDir",
        "Link",
        "Unlink",
        "Rename",
        "Read",
        "Write",
        "Truncate",
        "DeleteData",
        "Sync",
        "ScanInodes",
        "ScanRange",
        "ScanEntries",
        "ScanData",
        "MarkStale",
        "NoteLeftover",
        "ScanStale",
        "ResyncAdvance",
        "PeerSync",
        "Replicate",
        "SnapshotChunk",
        "DropLink",
        "SetOpen",
        "Reap",
        "ScanOrphans",
        "Bind",
        "Unbind",
        "OpenHome",
        "HomeLookup",
        "Seed",
        "CreateCached",
        "AcquireCached",
        "Revalidate",
        "ReadCached",
        "FetchCached",
        "Evict",
        "CacheStatus",
        "ForgetBinding",
        "WbMarks",
        "WbClear",
        "WbHomes",
        "WbSetHome",
        "WbPlace",
        "WbSeen",
        "WbRebase",
        "WbGone",
        "WbNameOf",
        "WbGoneClear",
        "WbEntries",
        "PushData",
        "Flush",
        "Localize",
        "Detach",
        "Scrub",
        "RaiseFence",
        "GetXattrs",
        "SetXattr",
        "Lock",
        "Fallocate",
        "TestLock",
        "Seek",
        "TouchAtime",
        "TouchCtime",
        "Exchange",
        "ChunkSums",
        "Allocated",
        "Holders",
        "ReserveIds",
        "CreateInodeAt",
        "Usage",
        "SetQuota",
        "Quotas",
        "Seeds",
        "CreateCachedMany",
        "GetInodes",
        "AcquireReadMany",
    ];

    /// The request's name, for counters and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::Format { .. } => "Format",
            Request::Replace { .. } => "Replace",
            Request::Status => "Status",
            Request::Statfs => "Statfs",
            Request::Renew => "Renew",
            Request::AcquireRead { .. } => "AcquireRead",
            Request::AcquireWrite { .. } => "AcquireWrite",
            Request::Release { .. } => "Release",
            Request::GetInode { .. } => "GetInode",
            Request::CreateInode { .. } => "CreateInode",
            Request::SetAttr { .. } => "SetAttr",
            Request::DeleteInode { .. } => "DeleteInode",
            Request::Lookup { .. } => "Lookup",
            Request::ReadDir { .. } => "ReadDir",
            Request::Link { .. } => "Link",
            Request::Unlink { .. } => "Unlink",
            Request::Rename { .. } => "Rename",
            Request::Read { .. } => "Read",
            Request::Write { .. } => "Write",
            Request::Truncate { .. } => "Truncate",
            Request::DeleteData { .. } => "DeleteData",
            Request::Sync { .. } => "Sync",
            Request::ScanInodes { .. } => "ScanInodes",
            Request::ScanRange { .. } => "ScanRange",
            Request::ScanEntries { .. } => "ScanEntries",
            Request::ScanData { .. } => "ScanData",
            Request::MarkStale { .. } => "MarkStale",
            Request::NoteLeftover { .. } => "NoteLeftover",
            Request::ScanStale { .. } => "ScanStale",
            Request::ResyncAdvance { .. } => "ResyncAdvance",
            Request::PeerSync { .. } => "PeerSync",
            Request::Replicate { .. } => "Replicate",
            Request::SnapshotChunk { .. } => "SnapshotChunk",
            Request::DropLink { .. } => "DropLink",
            Request::SetOpen { .. } => "SetOpen",
            Request::Reap { .. } => "Reap",
            Request::ScanOrphans { .. } => "ScanOrphans",
            Request::Bind { .. } => "Bind",
            Request::Unbind { .. } => "Unbind",
            Request::OpenHome { .. } => "OpenHome",
            Request::HomeLookup { .. } => "HomeLookup",
            Request::Seed { .. } => "Seed",
            Request::CreateCached { .. } => "CreateCached",
            Request::AcquireCached { .. } => "AcquireCached",
            Request::Revalidate { .. } => "Revalidate",
            Request::ReadCached { .. } => "ReadCached",
            Request::FetchCached { .. } => "FetchCached",
            Request::Evict { .. } => "Evict",
            Request::CacheStatus => "CacheStatus",
            Request::ForgetBinding { .. } => "ForgetBinding",
            Request::WbMarks { .. } => "WbMarks",
            Request::WbClear { .. } => "WbClear",
            Request::WbHomes { .. } => "WbHomes",
            Request::WbSetHome { .. } => "WbSetHome",
            Request::WbPlace { .. } => "WbPlace",
            Request::WbSeen { .. } => "WbSeen",
            Request::WbRebase { .. } => "WbRebase",
            Request::WbGone { .. } => "WbGone",
            Request::WbNameOf { .. } => "WbNameOf",
            Request::WbGoneClear { .. } => "WbGoneClear",
            Request::WbEntries { .. } => "WbEntries",
            Request::PushData { .. } => "PushData",
            Request::Flush { .. } => "Flush",
            Request::Localize { .. } => "Localize",
            Request::Detach { .. } => "Detach",
            Request::Scrub { .. } => "Scrub",
            Request::RaiseFence { .. } => "RaiseFence",
            Request::GetXattrs { .. } => "GetXattrs",
            Request::SetXattr { .. } => "SetXattr",
            Request::Lock { .. } => "Lock",
            Request::Fallocate { .. } => "Fallocate",
            Request::TestLock { .. } => "TestLock",
            Request::Seek { .. } => "Seek",
            Request::TouchAtime { .. } => "TouchAtime",
            Request::TouchCtime { .. } => "TouchCtime",
            Request::Exchange { .. } => "Exchange",
            Request::ChunkSums { .. } => "ChunkSums",
            Request::Allocated { .. } => "Allocated",
            Request::Holders { .. } => "Holders",
            Request::ReserveIds { .. } => "ReserveIds",
            Request::CreateInodeAt { .. } => "CreateInodeAt",
            Request::Usage => "Usage",
            Request::SetQuota { .. } => "SetQuota",
            Request::Quotas => "Quotas",
            Request::Seeds { .. } => "Seeds",
            Request::CreateCachedMany { .. } => "CreateCachedMany",
            Request::GetInodes { .. } => "GetInodes",
            Request::AcquireReadMany { .. } => "AcquireReadMany",
        }
    }
}

/// A successful answer. Errors travel as [`crate::WireError`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Done; nothing to return.
    Ok,
    /// Answer to `Hello`.
    Hello {
        /// This server's index, if formatted.
        index: Option<u32>,
        /// Random per process start; a change means the lease table was lost.
        epoch: u64,
        /// The volume descriptor, if formatted.
        descriptor: Option<VolumeDescriptor>,
        /// Lease duration in milliseconds.
        lease_ms: u32,
    },
    /// Answer to `Status`.
    Status(Box<ServerStats>),
    /// Answer to `Statfs`.
    Statfs {
        /// Bytes on the data directory's file system.
        total: u64,
        /// Bytes free there.
        free: u64,
        /// Of those, bytes an unprivileged user may use (not the root
        /// reserve).
        avail: u64,
        /// Inodes stored on this server.
        files: u64,
        /// Inodes free to unprivileged users on the data directory's file
        /// system (`f_favail`): each file with data takes two of them per
        /// copy (its extent and its checksums). `u64::MAX` when that file
        /// system does not count them (`f_files` 0: it makes them as
        /// needed).
        inodes_free: u64,
        /// Names the file system the data directory is on (its `f_fsid`
        /// and the host's machine id, hashed): servers sharing a disk
        /// answer the same, and it is counted once.
        disk: u64,
    },
    /// An inode.
    Inode(Inode),
    /// Answer to `AcquireWrite` and `CreateInode`: the inode, and the fence
    /// number of the write lease held on it, which every block change made
    /// under that lease carries ([`Request::Write`]).
    Leased {
        /// The inode.
        inode: Inode,
        /// Higher than that of every earlier write grant of its server.
        fence: u64,
    },
    /// Answer to `Lookup`.
    Entry(Option<DirEntry>),
    /// Answer to `ReadDir`.
    Entries {
        /// The entries, in cookie order.
        entries: Vec<DirEntry>,
        /// No entries follow the last one.
        eof: bool,
    },
    /// Answer to `Link`, `Unlink`, `Rename`: the entry that was removed or
    /// replaced, and the directory's inode as the change left it (so the
    /// caller's cached copy needs no second round trip).
    Removed {
        /// The removed or replaced entry.
        entry: Option<DirEntry>,
        /// The directory after the change.
        dir: Inode,
    },
    /// Answer to `Read`; the bytes are the frame's payload. The server's
    /// block I/O load as it answered rides along, so that clients choosing
    /// between copies see load they did not cause themselves.
    Data {
        /// Block reads and writes the server was serving when it answered
        /// (other than this one).
        queue: u32,
        /// Its moving-average block read service time, µs.
        service_us: u32,
    },
    /// Answer to `ScanInodes`, [`Request::Seeds`] and [`Request::GetInodes`].
    Inodes(Vec<Inode>),
    /// Answer to `ScanEntries`: (directory id, entry).
    ScanEntries(Vec<(FileId, DirEntry)>),
    /// Answer to `ScanData`: (file id, bytes allocated here).
    DataFiles(Vec<(FileId, u64)>),
    /// Answer to `ScanStale`: (file id, the record, the inode if the file
    /// still exists).
    Stale(Vec<(FileId, StaleCopy, Option<Inode>)>),
    /// Answer to [`Request::PeerSync`]: the receiver's view of the range.
    PeerState {
        /// The receiver serves the range itself (the sender must become its copy).
        primary: bool,
        /// The receiver's ownership generation.
        gen: u64,
        /// The receiver's copy is exactly at the sender's (`lineage`, `seq`).
        in_sync: bool,
    },
    /// Answer to [`Request::Reap`]: the removed inode, or `None` if it stays.
    Reaped(Option<Inode>),
    /// Answer to [`Request::ScanOrphans`].
    Orphans(Vec<Orphan>),
    /// Answer to [`Request::HomeLookup`].
    HomeEntry {
        /// The entry, if the name exists (here or at home).
        entry: Option<DirEntry>,
        /// The seed of the entry's object, if the directory keeps it.
        seed: Option<Inode>,
    },
    /// Answer to [`Request::FetchCached`]: bytes fetched from home for it
    /// (0: the unit was here already).
    Fetched {
        /// Bytes fetched.
        bytes: u64,
    },
    /// Answer to [`Request::Evict`]: bytes freed.
    Evicted {
        /// Bytes freed.
        bytes: u64,
    },
    /// Answer to [`Request::CacheStatus`].
    Cache(Vec<BindingStatus>),
    /// Answer to [`Request::WbMarks`].
    WbMarks(Vec<WbMark>),
    /// Answer to [`Request::WbHomes`].
    WbHomes(Vec<WbHome>),
    /// Answer to [`Request::PushData`].
    Pushed {
        /// Bytes written to home.
        bytes: u64,
    },
    /// Answer to [`Request::RaiseFence`]: the blocks (first, last; last
    /// `u64::MAX`: all from the first on) the revoked grant changed on this
    /// server, if it changed any that this server remembers.
    FenceRaised {
        /// `(first, last)` block index.
        written: Option<(u64, u64)>,
    },
    /// Answer to [`Request::Flush`].
    Flushed {
        /// Every change made before the request is at home.
        done: bool,
        /// Objects with changes not yet at home, when the answer was made.
        queued: u64,
        /// Why the last push failed, if it did.
        last_error: Option<String>,
    },
    /// Answer to [`Request::GetXattrs`]: every extended attribute, in name
    /// order.
    Xattrs(Vec<Xattr>),
    /// Answer to a waiting [`Request::Lock`] not granted yet: ask again.
    LockPending,
    /// Answer to [`Request::TestLock`]: the conflicting lock, if any.
    LockTest(Option<LockInfo>),
    /// Answer to [`Request::Seek`]: the byte of the file found, if any.
    Sought(Option<u64>),
    /// Answer to [`Request::ChunkSums`].
    ChunkSums {
        /// The extent file's length (0 if there is none).
        len: u64,
        /// Entries of the chunks asked for that start below `len`.
        entries: Vec<u32>,
        /// The file is cached from a home here (its units are fetched per
        /// copy, so its copies may differ by design).
        cached: bool,
    },
    /// Answer to [`Request::Allocated`]: bytes allocated on disk.
    Allocated(u64),
    /// Answer to [`Request::Holders`]: each lease on the inode.
    Holders(Vec<LeaseHolder>),
    /// Answer to [`Request::ReserveIds`]: the ids set aside.
    Ids(Vec<FileId>),
    /// Answer to [`Request::Usage`]: each range served here.
    Usage(Vec<RangeUsage>),
    /// Answer to [`Request::Quotas`].
    Quotas(Vec<QuotaLimit>),
    /// Answer to [`Request::AcquireRead`]: the inode, and its extended
    /// attributes as [`Request::GetXattrs`] would answer them under this
    /// lease when they are few ([`XATTRS_WITH_LEASE`] bytes of names and
    /// values at most; else `None`: ask for them).
    ReadLeased {
        /// The inode.
        inode: Inode,
        /// Every extended attribute, in name order, if they are few.
        xattrs: Option<Vec<Xattr>>,
    },
    /// Answer to [`Request::AcquireReadMany`], in the order asked: the
    /// read lease granted with what [`Reply::ReadLeased`] carries, or
    /// `None` where no lease was granted (refused, or the object is gone
    /// or replaced: `AcquireRead` says why).
    ReadLeasedMany(Vec<Option<ReadLease>>),
}

/// One read lease granted by [`Request::AcquireReadMany`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLease {
    /// The inode.
    pub inode: Inode,
    /// Every extended attribute, in name order, if they are few (as
    /// [`Reply::ReadLeased`]).
    pub xattrs: Option<Vec<Xattr>>,
}

/// Most bytes of names and values a [`Reply::ReadLeased`] carries.
pub const XATTRS_WITH_LEASE: usize = 4096;

/// How many consecutive cookies of a cached directory one
/// [`Request::Seeds`] covers.
pub const SEED_BLOCK: u64 = 512;

/// One lease on an inode and the client holding it ([`Reply::Holders`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The client's name as it said `Hello` (e.g. `mount@host:/mnt`), or
    /// its id if it has no connection now.
    pub client: String,
    /// The kind of lease.
    pub mode: LeaseMode,
}

/// One server's view of one binding (`morris cache status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingStatus {
    /// The bound directory's id.
    pub binding: FileId,
    /// The home URL.
    pub url: String,
    /// The last request to home succeeded (or none failed since start).
    pub reachable: bool,
    /// The last failure talking to home, if any.
    pub last_error: Option<String>,
    /// Cached unit reads answered from what was here.
    pub hits: u64,
    /// Unit reads that had to fetch from home.
    pub misses: u64,
    /// Bytes fetched from home.
    pub fetched_bytes: u64,
    /// Time spent fetching units, ms (bytes / time = this server's fetch rate).
    pub fetch_ms: u64,
    /// Metadata requests made to home (lookups, listings, attributes).
    pub meta_requests: u64,
    /// Units evicted to stay under the binding's space limit, and by hand.
    pub evictions: u64,
    /// Bytes of this binding's data held here.
    pub cached_bytes: u64,
    /// The binding's mode (`ro`, `sw`, `iw`, `lu`).
    pub mode: String,
    /// Objects with changes not yet pushed home, kept here.
    pub queued: u64,
    /// Age of the oldest of them, ms.
    pub oldest_ms: u64,
    /// Sizes of the files among them whose data changed (what their
    /// pushes write home).
    pub dirty_bytes: u64,
    /// Objects pushed home by this server (names, attributes or data).
    pub pushed: u64,
    /// Bytes of data pushed home by this server.
    pub pushed_bytes: u64,
    /// Push rounds this server ran as the binding's pusher.
    pub rounds: u64,
    /// Time those rounds took, ms (`pushed_bytes` / this = the push rate
    /// while pushing).
    pub push_ms: u64,
    /// Objects its pushes found in a state they cannot push (an object
    /// fetched from home and gone there; a directory not listed whole),
    /// logged as warnings.
    pub skipped: u64,
    /// Conflicts resolved (an object changed both in the cache and at
    /// home): home's version kept at its path, the cache's under
    /// `.conflicts/` at home's bound directory.
    pub conflicts: u64,
}

/// An orphan: an inode whose last name is gone, kept while a client has it open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Orphan {
    /// The inode.
    pub inode: Inode,
    /// Seconds since it lost its last name (by this server's clock).
    pub age_secs: u64,
    /// A live client has it open now.
    pub open: bool,
}

/// A message the server sends unasked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Push {
    /// Give back your lease on `ino`: another client wants `want`. The client
    /// stops using the lease at once, finishes what is in flight, writes back
    /// what it changed, invalidates its caches, and sends `Release`.
    Recall {
        /// The inode.
        ino: FileId,
        /// What the other client asked for.
        want: LeaseMode,
    },
}
