//! The morris client library: everything a mount needs, protocol-neutral.
//!
//! Front ends (FUSE, NFS) translate their calls into [`Client`] methods and map
//! [`Error`] codes to errno / NFS status once, at their boundary. All
//! file-system logic lives here:
//!
//! * `pool`: one connection per server, reconnect, lease renewal;
//! * `leases`: the client's lease cache and recall handling;
//! * `fs`: namespace operations and their write ordering;
//! * `io`: reads with readahead, writes, flush, fsync;
//! * `opens`: files open here, and their records at their owners;
//! * `reaper`: removing files whose last name is gone once nobody has them open;
//! * `perm`: POSIX permission checks for front ends that need them.

mod behind;
mod cache;
mod copies;
mod copy;
mod deferred;
mod dirlock;
mod dirpages;
mod flags;
mod fs;
mod ids;
mod io;
mod leases;
pub mod listing;
mod locks;
mod metrics;
mod opens;
pub mod perm;
mod pool;
mod quota;
mod reaper;
mod rebuild;
mod replicas;
mod resync;
mod slow;
mod snapshots;
mod space;
mod usage;
mod xattrs;

pub use copies::Repair;
pub use reaper::ORPHAN_AGE;
pub use space::Fallocate;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
pub use morris_proto::auth::{Key, Keys, Role};
use morris_proto::layout::Layout;
use morris_proto::Push;
pub use morris_proto::{
    DirEntry, ErrorCode, FileId, FileKind, Handle, Inode, QuotaLimit, ResyncStatus, SetAttr,
    StaleCopy, Timestamp, UsageRow, VolumeDescriptor, ROOT_ID,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

/// A client-library error: a protocol error class plus context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.describe())]
pub struct Error {
    /// The class; front ends map it to errno or NFS status.
    pub code: ErrorCode,
    /// Context for logs.
    pub message: String,
}

impl Error {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
}

/// Result type of the client library.
pub type Result<T> = std::result::Result<T, Error>;

/// Who is asking, for permission checks and ownership of new files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Enforce permission checks in the library. FUSE mounts with
    /// `default_permissions` let the kernel check and pass `false`; the NFS
    /// gateway passes `true`.
    pub check: bool,
    /// The creator's umask: taken from a new object's mode unless its
    /// directory has a default ACL (FUSE mounts with POSIX ACLs pass the
    /// process's; NFS clients apply theirs before asking: 0).
    pub umask: u32,
}

impl Caller {
    /// The superuser, unchecked (admin tools, tests).
    pub fn root() -> Self {
        Caller {
            uid: 0,
            gid: 0,
            groups: vec![],
            check: false,
            umask: 0,
        }
    }
}

/// Told when another client's change makes something this client handed out stale.
/// The FUSE front end turns these into kernel cache invalidations.
pub trait Invalidator: Send + Sync + 'static {
    /// The attributes and data of `id` may have changed.
    fn inode(&self, id: FileId);
    /// The entry `name` of directory `dir` may have changed.
    fn entry(&self, dir: FileId, name: &[u8]);
    /// Resolves once everything asked for so far has taken effect (`true`),
    /// or after `limit` (`false`: an invalidation may wait for a lock that a
    /// request of this very client holds). A lease is given back only after
    /// this, so that no cache still shows what another client is about to
    /// change.
    fn flush(&self, limit: std::time::Duration) -> futures::future::BoxFuture<'static, bool> {
        let _ = limit;
        Box::pin(std::future::ready(true))
    }
    /// Drops every name the front end caches, at once and without waiting
    /// for any lock: for a lease given back before its names' invalidations
    /// took effect. A front end that caches names (see
    /// [`Client::name_ttl`]) must implement it.
    fn all_names(&self) {}
}

/// Tunables of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The key this client proves on every connection (the volume's client
    /// key; the volume key works too).
    pub keys: Keys,
    /// Name shown in server logs and `status`.
    pub name: String,
    /// Largest readahead window per open file, in bytes.
    pub readahead_max: u64,
    /// Most leases kept cached before the least recently used are released.
    pub max_cached_leases: usize,
    /// When reads move access times.
    pub atime: Atime,
    /// Keep `chmod`, `chown`, `utimes` of a regular file this client holds
    /// the write lease on in the client, and store them with its size (at
    /// close, `fsync`, recall, or within a second: `behind.rs`), instead of
    /// one request each. A client killed in that second loses them, as it
    /// loses gathered writes. Off by default (the NFS gateway: NFSv3 wants
    /// SETATTR stored when answered); mounts turn it on.
    pub attrs_behind: bool,
    /// Answer a create (file, directory, symlink, device node) at once
    /// with a file id set aside ahead (`ids.rs`; else once its inode is
    /// stored), and an unlink or rmdir at once, and store the inode
    /// (`CreateInodeAt`) and the entry's change (`Link`, `Unlink`) right
    /// afterwards, under the directory's write lease (`deferred.rs`,
    /// `fs/reserved.rs`): no server round trip per create instead of two,
    /// none per removal instead of two. Another
    /// client sees the change at once (its lease recalls this one's, which
    /// waits for it); `fsync` of the file or its directory and unmount
    /// wait for it; a client killed in that moment loses it (a nameless
    /// inode, or a link count one too high, left for fsck). Off by default
    /// (the NFS gateway: NFSv3 wants CREATE and REMOVE stored when
    /// answered); mounts turn it on unless `--sync-names`.
    pub names_behind: bool,
    /// Bytes a second this client copies at most when it resyncs or
    /// rebuilds a server's copies (0: no limit), so that what others read
    /// keeps most of the disks and links.
    pub copy_rate: u64,
}

/// When a read moves a file's access time (the mount options of the same
/// names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Atime {
    /// `relatime`, Linux's default: when the access time is not later than
    /// the modification or change time, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: on every read, at most once a second per file and
    /// mount (each update is a request to the file's owner).
    Strict,
    /// `noatime`: never.
    Never,
}

impl ClientConfig {
    /// The default tunables, with `keys`.
    pub fn new(keys: Keys) -> Self {
        ClientConfig {
            keys,
            name: "morris-client".into(),
            readahead_max: 64 << 20,
            max_cached_leases: 100_000,
            atime: Atime::Relative,
            attrs_behind: false,
            names_behind: false,
            copy_rate: 0,
        }
    }
}

/// How `rename` treats an existing target (Linux `renameat2` flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists.
    pub noreplace: bool,
    /// Swap source and target atomically.
    pub exchange: bool,
    /// Leave a whiteout (a character device 0:0, as overlayfs wants) at
    /// the source name.
    pub whiteout: bool,
}

/// Volume capacity for statfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    /// Bytes the volume can hold: its servers' disks, each counted once
    /// however many servers share it, divided by the copies kept.
    pub total: u64,
    /// Of those, bytes free.
    pub free: u64,
    /// Of those, bytes free to unprivileged users (the disks' root
    /// reserve left out).
    pub avail: u64,
    /// Inodes in use.
    pub files: u64,
    /// Files that can still be made ([`files_free`]).
    pub files_free: u64,
    /// Stripe unit (preferred I/O size).
    pub block_size: u32,
}

/// Smallest space a file with data takes on a data server's disk, per copy
/// (a 4 KiB block of its extent; its checksums take another inode).
const FILE_BYTES: u64 = 4096;

/// How many more files a volume can hold (`df -i`'s free inodes): as many
/// as both its space (`avail` bytes, after copies) and its servers' file
/// systems' free inodes (`inodes`, summed over the disks, each counted
/// once; `None` if one makes inodes as needed) allow, at one 4 KiB block
/// and two inodes (extent and checksums) per copy of a file with data. An
/// empty file takes neither (only a few hundred bytes of metadata), so
/// this is the floor of what can be made, as a disk's own count is.
pub fn files_free(inodes: Option<u64>, avail: u64, copies: u64) -> u64 {
    let by_space = avail / FILE_BYTES;
    match inodes {
        Some(n) => by_space.min(n / (2 * copies.max(1))),
        None => by_space,
    }
}

/// Counters for `stats` and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests sent, by name.
    pub requests: Vec<(String, u64)>,
    /// Leases held now.
    pub leases: u64,
    /// Recalls received.
    pub recalls: u64,
}

/// How long after a lookup an `open()` of the file it found counts as
/// following it (`Client::opened_by_name`): a FUSE open comes right after
/// its lookup; the reaper removes a nameless file a second after its
/// last name, so this rarely matters beyond that.
const LOOKED_UP_FOR: std::time::Duration = std::time::Duration::from_secs(5);
/// Files looked up in the last [`LOOKED_UP_FOR`] or two: the current
/// period's and the previous one's, the older dropped whole when a period
/// ends (no scan per lookup, whatever the rate).
#[derive(Default)]
pub(crate) struct RecentLookups {
    current: HashMap<Handle, std::time::Instant>,
    previous: HashMap<Handle, std::time::Instant>,
    since: Option<std::time::Instant>,
}

impl RecentLookups {
    fn insert(&mut self, h: Handle) {
        let now = std::time::Instant::now();
        match self.since {
            Some(t) if now.duration_since(t) < LOOKED_UP_FOR => {}
            _ => {
                self.previous = std::mem::take(&mut self.current);
                self.since = Some(now);
            }
        }
        self.current.insert(h, now);
    }

    fn recent(&self, h: Handle) -> bool {
        self.current
            .get(&h)
            .or_else(|| self.previous.get(&h))
            .is_some_and(|t| t.elapsed() < LOOKED_UP_FOR)
    }
}

/// A connection to a volume; one per mount or gateway. Cheap to share (`Arc`).
pub struct Client {
    pub(crate) pool: Arc<pool::Pool>,
    pub(crate) leases: Arc<leases::Leases>,
    pub(crate) layout: Layout,
    desc: VolumeDescriptor,
    pub(crate) config: ClientConfig,
    pub(crate) files: Mutex<HashMap<u64, Arc<io::OpenFile>>>,
    pub(crate) next_fh: AtomicU64,
    /// Files open here and their open records (`opens.rs`).
    pub(crate) opens: Arc<opens::Opens>,
    /// Orphans waiting for their reap (`reaper.rs`).
    pub(crate) reaps: Mutex<HashSet<Handle>>,
    /// Who is over a quota, as this client last heard (`quota.rs`).
    pub(crate) quota: quota::QuotaState,
    /// Files made here without a name that `linkat(2)` may still name
    /// (`O_TMPFILE` without `O_EXCL`: `fs/tmpfile.rs`).
    pub(crate) linkable: Mutex<HashSet<FileId>>,
    /// Reaps running at once (`reaper.rs`).
    pub(crate) reaping: tokio::sync::Semaphore,
    /// One round of removing this client's pending orphans at a time, and
    /// how many rounds have removed something (`reaper.rs`): writes out of
    /// space wait for a round and try again after one.
    pub(crate) reap_gate: tokio::sync::Mutex<()>,
    pub(crate) reap_rounds: AtomicU64,
    /// Files a front end looked up a moment ago, and when: an `open()`
    /// that follows such a lookup may open the file even if another
    /// mount has removed its name since (`Client::opened_by_name`).
    pub(crate) looked_up: Mutex<RecentLookups>,
    /// This client, for the tasks it starts.
    pub(crate) me: OnceLock<Weak<Client>>,
    /// Cache mode: bindings' settings, validation times (`cache.rs`).
    pub(crate) cache: cache::CacheView,
    /// One namespace change at a time per directory (`dirlock.rs`).
    pub(crate) dir_locks: dirlock::DirLocks,
    /// Listing pages read ahead (`dirpages.rs`).
    pub(crate) dir_pages: dirpages::DirPages,
    /// One append at a time per inode (sharded).
    pub(crate) appending: Vec<tokio::sync::Mutex<()>>,
    pub(crate) next_server: AtomicU32,
    /// Per-server data load seen by this client (choice among copies).
    pub(crate) loads: Arc<replicas::Loads>,
    /// The locks this client holds, as granted (`locks.rs`): asked for
    /// again when their server loses its lease table.
    pub(crate) held_locks: Mutex<morris_proto::locks::LockTable>,
    /// Which (file, lock owner) may hold locks here (`locks.rs`).
    pub(crate) lock_users: locks::LockUsers,
    /// The pace of resync and rebuild copies (`resync.rs`).
    pub(crate) copy_pace: resync::CopyPace,
    /// When reads move access times now (`ClientConfig::atime`, then
    /// [`Client::set_atime`]).
    pub(crate) atime: Mutex<Atime>,
    /// Small writes gathered and not sent yet (`behind.rs`).
    pub(crate) behind: behind::Behind,
    /// Namespace steps finished after their operation answered (`deferred.rs`).
    pub(crate) deferred: Arc<deferred::Deferred>,
    /// File ids set aside for this client's creates (`ids.rs`).
    pub(crate) ids: ids::Ids,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Client {
    /// Connects to the volume through any one of its servers (`host:port`).
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<Arc<Client>> {
        let (desc, lease_ms) = pool::probe(addr, &config.keys.credential()).await?;
        desc.validate()
            .map_err(|m| Error::new(ErrorCode::WrongVolume, m))?;
        let (push_tx, mut push_rx) = mpsc::unbounded_channel::<(u32, Push)>();
        let pool = Arc::new(pool::Pool::new(
            &desc,
            lease_ms,
            config.name.clone(),
            config.keys.clone(),
            push_tx,
        ));
        let layout = Layout::new(
            desc.servers.len() as u32,
            desc.stripe_unit,
            u32::from(desc.replicas),
        );
        let opens = opens::Opens::new(pool.clone(), layout);
        let leases = leases::Leases::new(
            pool.clone(),
            opens.clone(),
            layout,
            config.max_cached_leases,
        );
        let weak = Arc::downgrade(&leases);
        let (lost_tx, mut lost_rx) = mpsc::unbounded_channel::<u32>();
        pool.set_epoch_hook(Box::new(move |i| {
            if let Some(l) = weak.upgrade() {
                l.drop_server(i);
            }
            let _ = lost_tx.send(i);
        }));
        let copy_pace = resync::CopyPace::new(config.copy_rate, layout.unit);
        let client = Arc::new(Client {
            copy_pace,
            pool: pool.clone(),
            leases: leases.clone(),
            layout,
            desc,
            atime: Mutex::new(config.atime),
            config,
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            opens,
            reaps: Mutex::new(HashSet::new()),
            linkable: Mutex::new(HashSet::new()),
            quota: quota::QuotaState::default(),
            reaping: tokio::sync::Semaphore::new(reaper::REAPS_AT_ONCE),
            reap_gate: tokio::sync::Mutex::new(()),
            reap_rounds: AtomicU64::new(0),
            looked_up: Mutex::new(RecentLookups::default()),
            me: OnceLock::new(),
            cache: cache::CacheView::default(),
            dir_locks: dirlock::DirLocks::new(),
            dir_pages: dirpages::DirPages::default(),
            appending: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            next_server: AtomicU32::new(rand::random::<u32>()),
            loads: Arc::new(replicas::Loads::new(layout.servers)),
            held_locks: Mutex::new(morris_proto::locks::LockTable::with_caps(
                usize::MAX,
                usize::MAX,
                usize::MAX,
            )),
            lock_users: locks::LockUsers::default(),
            behind: behind::Behind::default(),
            deferred: Arc::default(),
            ids: ids::Ids::new(layout.servers),
            tasks: Mutex::new(Vec::new()),
        });
        let _ = client.me.set(Arc::downgrade(&client));
        leases.set_drain(Arc::new(behind::DrainHook(Arc::downgrade(&client))));
        let weak = Arc::downgrade(&leases);
        let pushes = tokio::spawn(async move {
            while let Some((from, push)) = push_rx.recv().await {
                let Some(l) = weak.upgrade() else { break };
                match push {
                    Push::Recall { ino, want } => l.on_recall(from, ino, want),
                }
            }
        });
        let weak_pool = Arc::downgrade(&pool);
        let weak_leases = Arc::downgrade(&leases);
        let period = pool.lease() / 4;
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(p) = weak_pool.upgrade() else { break };
                p.renew_quiet();
                if let Some(l) = weak_leases.upgrade() {
                    l.expire_stale();
                }
            }
        });
        // A server that lost its lease table lost its locks too: ask again.
        let weak_client = Arc::downgrade(&client);
        let reclaims = tokio::spawn(async move {
            while let Some(i) = lost_rx.recv().await {
                let Some(c) = weak_client.upgrade() else {
                    break;
                };
                tokio::spawn(async move { c.reclaim_locks(i).await });
            }
        });
        client.tasks.lock().extend([pushes, renew, reclaims]);
        pool.warm_up();
        // The root's generation, so that every later call can name it.
        let root = client
            .call_owner(ROOT_ID, morris_proto::Request::GetInode { ino: ROOT_ID })
            .await?;
        let root = match root {
            morris_proto::Reply::Inode(i) => i.handle(),
            other => return Err(pool::unexpected(&other)),
        };
        leases.learn(root);
        // Every path starts at the root: its read lease is taken now, in
        // the background, rather than by the mount's first request.
        let l = leases.clone();
        tokio::spawn(async move {
            if let Err(e) = l.get(root, leases::Mode::Read).await {
                tracing::debug!(error = %e, "root lease not taken ahead of use");
            }
        });
        Ok(client)
    }

    /// The volume descriptor.
    pub fn descriptor(&self) -> &VolumeDescriptor {
        &self.desc
    }

    /// The volume's lease time: how long this client may trust what it caches
    /// without hearing from the servers.
    pub fn lease_duration(&self) -> std::time::Duration {
        self.pool.lease()
    }

    /// Registers the front end's invalidation sink.
    pub fn set_invalidator(&self, inv: Arc<dyn Invalidator>) {
        self.leases.set_invalidator(inv);
    }

    /// Changes when reads move access times from now on (a front end
    /// whose mount was remounted `ro`, `noatime`, `strictatime`, ...).
    pub fn set_atime(&self, atime: Atime) {
        let mut a = self.atime.lock();
        if *a != atime {
            tracing::info!(?atime, "access time updates changed");
            *a = atime;
        }
    }

    /// Makes a handle handed out earlier nameable by its id again (an NFS file
    /// handle presented after a gateway restart). Nothing is trusted: the
    /// owning server still checks the generation, and a known generation is
    /// never replaced.
    pub fn learn(&self, h: Handle) {
        self.leases.learn_if_unknown(h);
    }

    /// Attributes of `id` named by its id alone, as a kernel decoding a
    /// file handle presents it after a remount (`open_by_handle_at`, an
    /// NFS re-export): a generation this client has not seen comes from the
    /// id's owner, and the caller compares it with the one in its handle.
    /// A file with no name left is `Stale` unless open here (a handle is
    /// not a name: unlike [`Client::getattr`], a name this client removed
    /// a moment ago does not keep it reachable).
    pub async fn getattr_by_id(&self, id: FileId) -> Result<Inode> {
        if self.leases.handle(id).is_err() {
            let i = fs::inode_reply(
                self.call_owner(id, morris_proto::Request::GetInode { ino: id })
                    .await?,
            )?;
            self.leases.learn_if_unknown(i.handle());
        }
        let i = self.do_getattr(id).await?;
        let i = self.after_find_by_id(i).await?;
        if i.attr.nlink == 0 && !self.opens.is_open(id) {
            return Err(Error::new(
                ErrorCode::Stale,
                format!("file {id} has no name left and is not open here"),
            ));
        }
        Ok(i)
    }

    /// What `id`'s owner has stored, without a lease (`morris info`): a
    /// mount holding a write lease may have newer attributes not yet
    /// stored. Nothing here is cached or kept fresh.
    pub async fn inode_as_stored(&self, id: FileId) -> Result<Inode> {
        fs::inode_reply(
            self.call_owner(id, morris_proto::Request::GetInode { ino: id })
                .await?,
        )
    }

    /// Who holds a lease on `id` now, as its owner says (`morris info`).
    pub async fn lease_holders(&self, id: FileId) -> Result<Vec<morris_proto::LeaseHolder>> {
        match self
            .call_owner(id, morris_proto::Request::Holders { ino: id })
            .await?
        {
            morris_proto::Reply::Holders(h) => Ok(h),
            other => Err(pool::unexpected(&other)),
        }
    }

    /// Attributes of `id` (cached while the read lease is held). A file
    /// whose last name is gone answers `Stale` unless it is open here (or
    /// this client removed that name a moment ago): only an open
    /// descriptor reaches it, and a kernel that asks by a cached name has
    /// a stale entry to drop and look up again (`stat` then says ENOENT).
    pub async fn getattr(&self, id: FileId) -> Result<Inode> {
        let i = self.do_getattr(id).await?;
        let i = self.after_find_by_id(i).await?;
        if i.attr.nlink == 0 && !self.orphan_reachable(i.handle()) {
            return Err(Error::new(
                ErrorCode::Stale,
                format!("file {id} has no name left and is not open here"),
            ));
        }
        Ok(i)
    }

    /// Whether the orphan `h` may still be used here: it is open on this
    /// client, or this client removed its last name a moment ago (an
    /// `open()` that looked the name up just before arrives now).
    pub(crate) fn orphan_reachable(&self, h: Handle) -> bool {
        self.opens.is_open(h.id) || self.reaps.lock().contains(&h)
    }

    /// A snapshot of `h`'s attributes for a listing, without taking a
    /// lease: the cached ones while a lease is held (or local changes are
    /// unstored), else read once from the owner. Unlike `getattr`, nothing
    /// keeps them fresh afterwards.
    pub async fn getattr_snapshot(&self, h: Handle) -> Result<Inode> {
        self.deferred.settled(h.id).await;
        if let Some(i) = self.leases.cached_inode(h.id) {
            if i.gen != h.gen {
                return Err(Error::new(ErrorCode::Stale, "replaced"));
            }
            return Ok(i);
        }
        if self.leases.has_unstored(h.id) {
            self.leases.learn_if_unknown(h);
            return self.do_getattr(h.id).await;
        }
        self.do_getattr_nolease(h).await
    }

    /// Like [`Client::getattr_snapshot`] for entry `e` of directory `dir`
    /// (a listing with attributes): a cached object that has no inode yet
    /// (cache mode's placeholder) gets it from its seed first, so that its
    /// handle can be used at once.
    pub async fn entry_snapshot(&self, dir: FileId, e: &DirEntry) -> Result<Inode> {
        match self.getattr_snapshot(e.child).await {
            Err(err)
                if matches!(err.code, ErrorCode::Stale | ErrorCode::NotFound)
                    && morris_proto::home::is_cache_id(e.child.id) =>
            {
                if self.materialize(dir, &e.name, e.child).await? {
                    self.getattr_snapshot(e.child).await
                } else {
                    Err(err)
                }
            }
            r => r,
        }
    }

    /// How long a front end may cache `dir`'s entry `name`, which names
    /// `child`, without asking again: zero unless the name is cached under
    /// this client's lease on `dir`, whose recall drops it from the front
    /// end ([`Invalidator::entry`], or [`Invalidator::all_names`] when
    /// that cannot be waited for); never longer than the lease may be
    /// trusted without hearing from its server. Under a cache binding,
    /// never longer than the directory and the object may go without
    /// being compared with home (a lookup after that compares them).
    pub fn name_ttl(&self, dir: FileId, name: &[u8], child: Handle) -> std::time::Duration {
        let ttl = self.leases.name_ttl(dir, name, child);
        if ttl.is_zero() {
            return ttl;
        }
        // (The home link only: no copy of the inode per lookup answer.)
        let left = |id| {
            self.leases
                .cached_home(id)
                .map_or(std::time::Duration::ZERO, |l| {
                    self.unchecked_left_of(id, l.as_ref())
                })
        };
        ttl.min(left(dir)).min(left(child.id))
    }

    /// How long a front end may keep `id`'s attributes without asking
    /// again, at most: while this client's lease on it may be trusted
    /// without hearing from its server (its recall drops the front end's
    /// copy); `None` if this client holds no lease on it.
    pub fn attr_trust(&self, id: FileId) -> Option<std::time::Duration> {
        self.leases.trust_left(id)
    }

    /// Looks `name` up in `dir` (`.` and `..` included).
    pub async fn lookup(&self, dir: FileId, name: &[u8]) -> Result<Inode> {
        if name != b"." && name != b".." {
            self.before_lookup(dir, name).await?;
        }
        let i = self.do_lookup(dir, name).await?;
        let i = self.after_find(i).await?;
        if i.attr.kind == morris_proto::FileKind::File {
            self.looked_up.lock().insert(i.handle());
        }
        Ok(i)
    }

    /// Whether an `open()` of the orphan `h` continues a lookup of its
    /// name: this client found the file by name a moment ago. Another
    /// mount removed or replaced the name between that lookup and the
    /// open; the open is then ordered before the removal and opens the
    /// file it named (as on a local file system, where the lookup and
    /// the open are one step), instead of failing with `ESTALE` — which
    /// the kernel retries only once, so a name removed and made again in
    /// a loop could make `open()` fail.
    pub(crate) fn opened_by_name(&self, h: Handle) -> bool {
        self.looked_up.lock().recent(h)
    }

    /// Checks `mask` (R_OK=4, W_OK=2, X_OK=1) for `caller` on `id`.
    pub async fn access(&self, id: FileId, mask: u32, caller: &Caller) -> Result<()> {
        self.do_access(id, mask, caller).await
    }

    /// Changes attributes; a size change truncates or extends the file.
    pub async fn setattr(&self, id: FileId, set: SetAttr, caller: &Caller) -> Result<Inode> {
        self.do_setattr(id, set, caller).await
    }

    /// Sets the inode flags of `id` (`chattr`: [`morris_proto::inode_flags`]).
    pub async fn set_flags(&self, id: FileId, flags: u32, caller: &Caller) -> Result<Inode> {
        let set = SetAttr {
            flags: Some(flags),
            ..SetAttr::default()
        };
        self.do_setattr(id, set, caller).await
    }

    /// Clears the set-user-ID bit of `id` (not a directory) and, if it is
    /// group-executable, its set-group-ID bit, if they are set: what
    /// Linux does on a write or truncate by a caller without
    /// `CAP_FSETID`, and on any change of owner or group.
    pub async fn clear_setid(&self, id: FileId) -> Result<()> {
        let i = self.do_getattr(id).await?;
        let mode = i.attr.mode;
        let mut cleared = mode & !0o4000;
        if mode & 0o2010 == 0o2010 {
            cleared &= !0o2000;
        }
        if matches!(i.attr.kind, FileKind::Dir | FileKind::Symlink) || cleared == mode {
            return Ok(());
        }
        let set = SetAttr {
            mode: Some(cleared),
            ..SetAttr::default()
        };
        self.do_setattr(id, set, &Caller::root()).await.map(|_| ())
    }

    /// Creates a non-directory, non-symlink object (`File`, `Fifo`, `Socket`,
    /// devices). `exclusive`: fail with `Exists` if the name exists (else the
    /// existing file is returned, as O_CREAT without O_EXCL).
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        dir: FileId,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        exclusive: bool,
        caller: &Caller,
    ) -> Result<Inode> {
        let round = self.reap_rounds.load(Ordering::SeqCst);
        match self
            .do_create(dir, name, kind, mode, rdev, exclusive, caller)
            .await
        {
            // Room that a removal here is about to give back.
            Err(e) if e.code == ErrorCode::NoSpace && self.room_made(round).await => {
                self.do_create(dir, name, kind, mode, rdev, exclusive, caller)
                    .await
            }
            r => r,
        }
    }

    /// Creates a directory.
    pub async fn mkdir(
        &self,
        dir: FileId,
        name: &[u8],
        mode: u32,
        caller: &Caller,
    ) -> Result<Inode> {
        let round = self.reap_rounds.load(Ordering::SeqCst);
        match self.do_mkdir(dir, name, mode, caller).await {
            Err(e) if e.code == ErrorCode::NoSpace && self.room_made(round).await => {
                self.do_mkdir(dir, name, mode, caller).await
            }
            r => r,
        }
    }

    /// Creates a symlink.
    pub async fn symlink(
        &self,
        dir: FileId,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> Result<Inode> {
        self.do_symlink(dir, name, target, caller).await
    }

    /// Makes a regular file without a name in directory `dir` and opens it
    /// (`open(2)` with `O_TMPFILE`): it goes at its last close unless
    /// [`Client::link`] names it first, which only a `linkable` one allows
    /// (`O_TMPFILE` without `O_EXCL`). Returns it and its open-file handle.
    pub async fn tmpfile(
        &self,
        dir: FileId,
        mode: u32,
        write: bool,
        linkable: bool,
        caller: &Caller,
    ) -> Result<(Inode, u64)> {
        self.do_tmpfile(dir, mode, write, linkable, caller).await
    }

    /// Adds a hard link to `id` as `new_dir/new_name`.
    pub async fn link(
        &self,
        id: FileId,
        new_dir: FileId,
        new_name: &[u8],
        caller: &Caller,
    ) -> Result<Inode> {
        self.do_link(id, new_dir, new_name, caller).await
    }

    /// Removes a non-directory entry.
    pub async fn unlink(&self, dir: FileId, name: &[u8], caller: &Caller) -> Result<()> {
        self.do_remove(dir, name, false, caller).await
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, dir: FileId, name: &[u8], caller: &Caller) -> Result<()> {
        self.do_remove(dir, name, true, caller).await
    }

    /// Renames `dir/name` to `new_dir/new_name`, replacing a compatible target.
    pub async fn rename(
        &self,
        dir: FileId,
        name: &[u8],
        new_dir: FileId,
        new_name: &[u8],
        flags: RenameFlags,
        caller: &Caller,
    ) -> Result<()> {
        self.do_rename(dir, name, new_dir, new_name, flags, caller)
            .await
    }

    /// A symlink's target.
    pub async fn readlink(&self, id: FileId) -> Result<Vec<u8>> {
        self.do_readlink(id).await
    }

    /// Lists entries after `cookie` (0: from the start); returns them and
    /// whether the listing is complete. Continuing from a cookie costs the same
    /// wherever it is in the directory.
    pub async fn readdir(
        &self,
        dir: FileId,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        if cookie == 0 {
            self.before_list(dir).await?;
        }
        self.do_readdir(dir, cookie, max).await
    }

    /// [`Client::readdir`] with each entry's inode as a lookup of its name
    /// would find it (taking its read lease, so that a front end may keep
    /// its attributes as after a lookup). `None` for an entry whose object
    /// this client holds a lease on already (it was looked up before: the
    /// front end has been given it), for one that could not be looked up
    /// or names another object by now, for every entry of a cached
    /// directory's first reply (from cookie 0), and for a cached object
    /// due to be compared with home (its lookup would ask; the lookups
    /// here never do).
    /// The lookups of one batch run at once.
    pub async fn readdir_plus(
        &self,
        dir: FileId,
        cookie: u64,
        max: u32,
    ) -> Result<(Vec<(DirEntry, Option<Inode>)>, bool)> {
        let (entries, complete) = self.readdir(dir, cookie, max).await?;
        let link = self
            .leases
            .cached_inode(dir)
            .and_then(|d| d.home.filter(|l| !l.is_local()));
        if let Some(link) = &link {
            // A listing's first reply names no object of a cached
            // directory: making objects from their seeds costs more than a
            // listing of names, and most listings do not look further (a
            // program that does, looking names up as it lists, gets the
            // next replies with attributes).
            if cookie == 0 {
                return Ok((entries.into_iter().map(|e| (e, None)).collect(), complete));
            }
            // The placeholders' seeds, a block at a time, so that each
            // lookup below is one request.
            self.keep_seeds_of(dir, link.version, &entries).await;
        }
        let cached = link.is_some();
        // Objects this mount knew before go without attributes (the kernel
        // has them, and would drop their cached ACLs on being given them).
        let known: Vec<bool> = entries
            .iter()
            .map(|e| self.leases.cached_inode(e.child.id).is_some())
            .collect();
        if !cached {
            // The others' leases with one request per server: each lookup
            // below then finds its lease here.
            let handles: Vec<Handle> = entries
                .iter()
                .zip(&known)
                .filter(|(e, known)| !**known && e.name != b"." && e.name != b"..")
                .map(|(e, _)| e.child)
                .collect();
            self.leases.take_reads(&handles).await;
        }
        let lookups = entries.iter().zip(known).map(|(e, known)| async move {
            if known {
                return None;
            }
            let found = if cached {
                // As `lookup`, less the comparisons with home: an object
                // due for one is left for the front end to look up.
                self.do_lookup(dir, &e.name)
                    .await
                    .map(|i| (!self.unchecked_left(&i).is_zero()).then_some(i))
            } else {
                self.lookup(dir, &e.name).await.map(Some)
            };
            match found {
                Ok(Some(i)) if i.handle() == e.child => {
                    if cached && i.attr.kind == morris_proto::FileKind::File {
                        self.looked_up.lock().insert(i.handle());
                    }
                    Some(i)
                }
                Ok(_) => None,
                Err(err) => {
                    tracing::debug!(dir, name = ?String::from_utf8_lossy(&e.name), error = %err, "listed entry not looked up");
                    None
                }
            }
        });
        let inodes = futures::future::join_all(lookups).await;
        Ok((entries.into_iter().zip(inodes).collect(), complete))
    }

    /// Opens `id`; `write` takes the write lease, `truncate` empties the file.
    /// Returns an open-file number for read/write/flush/fsync/release.
    pub async fn open(&self, id: FileId, write: bool, truncate: bool) -> Result<u64> {
        self.open_with(id, write, truncate, false).await
    }

    /// [`Client::open`], `append` saying whether writes go to the end
    /// (`O_APPEND`: the only writes an append-only file takes).
    pub async fn open_with(
        &self,
        id: FileId,
        write: bool,
        truncate: bool,
        append: bool,
    ) -> Result<u64> {
        // Whether it still has a name decides whether its open is recorded.
        self.deferred.settled(id).await;
        if let Some(i) = self.leases.cached_inode(id) {
            if i.home.as_ref().is_some_and(|l| !l.is_local()) {
                self.after_find_by_id(i).await?;
            }
        }
        self.do_open(id, write, truncate, append).await
    }

    /// [`Client::after_find`] for an operation on an object rather than a
    /// name: a cached object that home no longer has is a stale handle
    /// (`ESTALE`, so that a kernel looks its name up again, finds it gone
    /// and, for an `open(O_CREAT)`, makes it anew), not `ENOENT`.
    async fn after_find_by_id(&self, i: Inode) -> Result<Inode> {
        self.after_find(i).await.map_err(|e| {
            if e.code == ErrorCode::NotFound {
                Error::new(ErrorCode::Stale, e.message)
            } else {
                e
            }
        })
    }

    /// Reads up to `size` bytes at `offset` (short only at end of file).
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes> {
        match self.do_read(fh, offset, size).await {
            // A cached file that changed at home while this read was on its
            // way (a server holds a newer version than our inode names):
            // its lease was recalled; read again under the new one.
            Err(e) if e.code == ErrorCode::Stale && self.open_file_is_cached(fh) => {
                self.do_read(fh, offset, size).await
            }
            r => r,
        }
    }

    /// Writes `data` at `offset`; returns the count taken. A small write
    /// may be gathered with the next ones, and a large one sent without
    /// waiting for its answer (`behind.rs`): it is on every server holding
    /// a part of it once `flush` or `fsync` of the file returns, or
    /// another client uses the file. A failed earlier write of the file is
    /// this call's error.
    pub async fn write(&self, fh: u64, offset: u64, data: Bytes) -> Result<u32> {
        self.do_write(fh, offset, data).await
    }

    /// Appends `data` at the end of the file as the volume has it now
    /// (`O_APPEND`), whatever offset the caller computed (`expected`, the
    /// kernel's idea of the end, which may be stale); returns the offset
    /// it went to. Two clients appending at once never overwrite each other.
    pub async fn append(&self, fh: u64, data: Bytes, expected: u64) -> Result<u64> {
        self.do_append(fh, data, expected).await
    }

    /// Stores this open file's size and times at the inode's owner (close).
    /// When it returns, the data survives `kill -9` of every server.
    pub async fn flush(&self, fh: u64) -> Result<()> {
        self.do_flush(fh).await
    }

    /// Like flush, and makes data (and, unless `datasync`, metadata) durable on disk.
    pub async fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        self.do_fsync(fh, datasync).await
    }

    /// Makes the names made and removed in directory `dir` durable
    /// (`fsync` of a directory): waits for the entries this client is
    /// still storing there (`ClientConfig::names_behind`); every other
    /// change of a directory is stored before it is answered.
    pub async fn fsync_dir(&self, dir: FileId) -> Result<()> {
        self.deferred
            .settled_for(dir, &[deferred::Step::Entries])
            .await;
        Ok(())
    }

    /// Closes an open file.
    pub async fn release(&self, fh: u64) -> Result<()> {
        self.do_release(fh).await
    }

    /// Volume capacity.
    pub async fn statfs(&self) -> Result<FsStat> {
        self.do_statfs().await
    }

    /// Client counters.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            requests: self.pool.counters(),
            leases: self.leases.held(),
            recalls: self.leases.recalls.load(Ordering::Relaxed),
        }
    }

    /// Sets this client's state gauges for a Prometheus scrape (issue 20):
    /// leases held, recalls received, open files, bytes gathered for
    /// write-behind. Request times and bytes are kept as requests run.
    pub fn export_metrics(&self) {
        ::metrics::gauge!("morris_client_leases").set(self.leases.held() as f64);
        ::metrics::counter!("morris_client_lease_recalls_total")
            .absolute(self.leases.recalls.load(Ordering::Relaxed));
        ::metrics::gauge!("morris_client_open_files").set(self.files.lock().len() as f64);
        let (gathered, flying_kib) = self.behind.queued();
        ::metrics::gauge!("morris_client_write_behind_gathered_bytes").set(gathered as f64);
        ::metrics::gauge!("morris_client_write_behind_inflight_bytes")
            .set((flying_kib * 1024) as f64);
    }

    /// Writes back everything, releases all leases, forgets this client's
    /// open records and removes the orphans it was waiting to remove.
    pub async fn shutdown(&self) {
        self.deferred.all_settled().await;
        self.drain_all().await;
        for e in self.leases.dirty_entries() {
            let _ = self.leases.write_back(&e).await;
        }
        self.leases.release_all().await;
        self.opens.close_all().await;
        self.reap_pending().await;
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::files_free;

    #[test]
    fn free_files_are_bounded_by_space_and_by_the_disks_inodes() {
        // 1 GiB free: 262,144 files of one 4 KiB block.
        assert_eq!(files_free(None, 1 << 30, 1), 262_144);
        // Inodes scarcer than space: two per copy of a file.
        assert_eq!(files_free(Some(1000), 1 << 30, 1), 500);
        assert_eq!(files_free(Some(1000), 1 << 30, 2), 250);
        // Space scarcer than inodes.
        assert_eq!(files_free(Some(u64::MAX - 1), 8192, 1), 2);
        assert_eq!(files_free(Some(0), 1 << 30, 1), 0);
        assert_eq!(files_free(Some(7), 1 << 30, 0), 3);
    }
}
