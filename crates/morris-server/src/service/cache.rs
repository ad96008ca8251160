//! Cache mode on a stripe server: every server is a gateway to the homes
//! for what it keeps (docs/architecture.md, "Cache mode").
//!
//! | what | fetched here when | where |
//! |---|---|---|
//! | a name of a cached directory this server owns | `HomeLookup` misses it | [`Server::home_lookup`] |
//! | every name of such a directory | its first `ReadDir` from cookie 0 | [`Server::home_list`] |
//! | home's attributes of an object this server owns | `Revalidate` after the validity lag | [`Server::revalidate`] |
//! | a stripe unit this server holds | `ReadCached`/`FetchCached` finds it missing at the file's version | [`Server::ensure_unit`] (`cache_units.rs`, with prefetch, eviction, `Localize`, `Detach`) |
//!
//! A change found at home is applied under this server's own write lease on
//! the object (every client's lease on it is recalled first), so every
//! mount, FUSE or NFS, sees the new version at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use morris_home::{Home, HomeAttr, HomeError, HomeHandle, HomeKind, HomeOptions, HomeUrl};
use morris_proto::home::{cache_gen, cache_id, wall_ms, Binding, CacheMode, HomeLink, HomeStamp};
use morris_proto::messages::LeaseMode;
use morris_proto::{
    Attr, BindingStatus, DirEntry, ErrorCode, FileId, FileKind, Handle, Inode, Timestamp, WireError,
};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::{blocking, err, metadata, Server};
use crate::leases::ClientId;
use crate::store::{DirPage, Seed, Store};

/// The lease-table client id of this server's own changes to cached objects.
const SERVER_CLIENT: ClientId = 0;
/// The "connection" its lease waits are filed under.
const SERVER_CONN: u64 = u64::MAX;
/// Entries asked of home per listing page at first. Bigger pages were
/// slower, not faster, from nfs-ganesha on the emulated cluster (a
/// 100,000-entry listing: 1.0-1.1 s with pages of 64, 128 or 250 entries,
/// 1.2-1.5 s with 1,000, 1.7 s with 4,000); see [`LIST_SLOW_PAGE`].
const LIST_PAGE: usize = 256;
/// A listing page from home that takes longer than this makes the next
/// pages 4 times bigger (up to [`LIST_PAGE_MAX`]): on a long path to home
/// the round trip, not home's work, is what a page costs (256-entry pages
/// of 100,000 entries are 391 round trips: 12 s at 30 ms each).
const LIST_SLOW_PAGE: Duration = Duration::from_millis(20);
/// The most entries asked of home per listing page.
const LIST_PAGE_MAX: usize = 4096;
/// Pages of home's listing asked ahead of the one being made into seeds.
const LIST_AHEAD: usize = 2;
/// Names stored per transaction while a directory is listed from home.
const FILL_BATCH: usize = 10_000;
/// How long the first page of a listing waits for the listing from home to
/// end before it follows the fill (answering the names stored so far, each
/// next page waiting for more): small directories, filled within it, are
/// listed in one answer; big ones show their first names soon and the
/// client's listing runs while the rest is stored. On the emulated cluster
/// (client, servers and home on two shared cores) following at once
/// listed 100,000 home names in 1.23-1.26 s against 1.23-1.34 s when
/// waiting for the whole fill (docs/benchmarks.md); it was 2 s before,
/// when following lost there. Not at once, so that a small directory
/// stays one answer when the server is slow for a moment.
const LIST_WAIT: Duration = Duration::from_millis(200);
/// Most names known absent at home kept in memory (see `home_lookup`).
const ABSENT_KEEP: usize = 100_000;
/// Most comparison times kept in memory (see `mark_checked`).
const CHECKED_KEEP: usize = 1_000_000;
/// Units one server fetches from home at once (all bindings).
const UNIT_FETCHES: usize = 3;
/// Units one server fetches at once in the background (prefetch of the rest
/// of a file read sequentially), so that foreground misses keep most of
/// the link.
const BACKGROUND_FETCHES: usize = 2;
/// While home does not answer, one request in this long tries it again;
/// the others fail (misses) or are served from the cache (the rest) at once.
const PROBE_EVERY: Duration = Duration::from_secs(3);
/// A home that answered this recently is taken to answer still (a change
/// under `--on-disconnect block` does not ask it again).
const ANSWERED_RECENTLY: Duration = Duration::from_secs(2);
/// Longest a change under `--on-disconnect block` waits for home's answer
/// before it is refused (and asked again by the client).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// One binding as this server knows it.
pub(crate) struct Bound {
    pub(super) spec: Binding,
    /// The home, once opened (on first need; again after a failure).
    home: tokio::sync::Mutex<Option<Arc<dyn Home>>>,
    reachable: AtomicBool,
    /// When home last answered.
    last_ok: Mutex<Option<Instant>>,
    /// While home does not answer: since when, and when the next request
    /// may try it again.
    down: Mutex<Option<(Instant, Instant)>>,
    last_error: Mutex<Option<String>>,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) fetched_bytes: AtomicU64,
    pub(super) fetch_ms: AtomicU64,
    meta_requests: AtomicU64,
    pub(super) evictions: AtomicU64,
    /// The write-back's state (cache mode II).
    pub(super) wb: super::pusher::WbState,
}

impl Bound {
    fn new(spec: Binding) -> Bound {
        Bound {
            spec,
            home: tokio::sync::Mutex::new(None),
            reachable: AtomicBool::new(true),
            last_ok: Mutex::new(None),
            down: Mutex::new(None),
            last_error: Mutex::new(None),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            fetch_ms: AtomicU64::new(0),
            meta_requests: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            wb: super::pusher::WbState::default(),
        }
    }

    /// A push round went through: home answers.
    pub(super) fn ok_pushing(&self) {
        self.ok();
        *self.wb.last_error.lock() = None;
    }

    fn options(&self) -> HomeOptions {
        HomeOptions {
            timeout: Duration::from_millis(self.spec.timeout_ms.max(100)),
            ..HomeOptions::default()
        }
    }

    /// Fails at once while home is known not to answer, but lets one
    /// request through every [`PROBE_EVERY`] to find out whether it is back.
    fn check_up(&self) -> Result<(), WireError> {
        let mut down = self.down.lock();
        let Some((since, next)) = *down else {
            return Ok(());
        };
        let now = Instant::now();
        if now >= next {
            // This request is the probe; the others keep failing fast
            // until it has had its time.
            *down = Some((since, now + self.options().timeout + PROBE_EVERY));
            return Ok(());
        }
        let last = self.last_error.lock().clone().unwrap_or_default();
        Err(err(
            ErrorCode::Io,
            format!(
                "home {} unreachable for {} s ({last})",
                self.spec.url,
                since.elapsed().as_secs()
            ),
        ))
    }

    /// The opened home; opens it if needed. Fails at once while home is
    /// known to be down (see [`Bound::check_up`]).
    pub(super) async fn home(&self) -> Result<Arc<dyn Home>, WireError> {
        self.check_up()?;
        let mut g = self.home.lock().await;
        if let Some(h) = &*g {
            return Ok(h.clone());
        }
        let url: HomeUrl = self
            .spec
            .url
            .parse()
            .map_err(|e| err(ErrorCode::Invalid, format!("{e}")))?;
        let opts = self.options();
        let limit = opts.timeout + Duration::from_secs(1);
        let opened = tokio::time::timeout(limit, morris_home::open(&url, opts))
            .await
            .unwrap_or_else(|_| Err(HomeError::Unreachable("opening timed out".into())));
        match opened {
            Ok(h) => {
                info!(url = %self.spec.url, "home opened");
                *g = Some(h.clone());
                self.ok();
                Ok(h)
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Whether home answers now: it did within [`ANSWERED_RECENTLY`], or
    /// a look at its root now goes through (`--on-disconnect block`).
    pub(super) async fn answers(&self) -> bool {
        if self
            .last_ok
            .lock()
            .is_some_and(|t| t.elapsed() < ANSWERED_RECENTLY)
        {
            return true;
        }
        let Ok(home) = self.home().await else {
            return false;
        };
        // Not longer than a client waits for an answer, whatever the
        // binding's `--timeout`.
        match tokio::time::timeout(ANSWER_WITHIN, home.root()).await {
            Ok(Ok(_)) => {
                self.ok();
                true
            }
            Ok(Err(e)) => {
                self.failed(e);
                false
            }
            Err(_) => false,
        }
    }

    pub(super) fn ok(&self) {
        *self.last_ok.lock() = Some(Instant::now());
        self.reachable.store(true, Ordering::Relaxed);
        if let Some((since, _)) = self.down.lock().take() {
            info!(url = %self.spec.url, down_secs = since.elapsed().as_secs(), "home answers again");
        }
    }

    /// Records a failure talking to home; returns it as a wire error.
    pub(super) fn failed(&self, e: HomeError) -> WireError {
        if matches!(e, HomeError::Unreachable(_) | HomeError::Io(_)) {
            self.reachable.store(false, Ordering::Relaxed);
            *self.last_error.lock() = Some(e.to_string());
            warn!(url = %self.spec.url, error = %e, "home request failed");
        }
        if matches!(e, HomeError::Unreachable(_)) {
            let now = Instant::now();
            let mut down = self.down.lock();
            let since = down.map_or(now, |(s, _)| s);
            *down = Some((since, now + PROBE_EVERY));
        }
        home_err(&self.spec.url, e)
    }

    fn status(&self, cached_bytes: u64) -> BindingStatus {
        BindingStatus {
            binding: 0,
            url: self.spec.url.clone(),
            reachable: self.reachable.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            fetch_ms: self.fetch_ms.load(Ordering::Relaxed),
            meta_requests: self.meta_requests.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            cached_bytes,
            ..BindingStatus::default()
        }
    }
}

/// A failure at home, as the client sees it: a missing object is
/// `NotFound`, an unreachable home `Io` naming it.
fn home_err(url: &str, e: HomeError) -> WireError {
    match e {
        HomeError::NotFound | HomeError::Stale => {
            err(ErrorCode::NotFound, format!("gone at home {url}"))
        }
        HomeError::NotDir => err(ErrorCode::NotDir, "not a directory at home"),
        HomeError::IsDir => err(ErrorCode::IsDir, "a directory at home"),
        HomeError::Access => err(ErrorCode::Access, format!("home {url} refused access")),
        HomeError::Invalid(m) => err(ErrorCode::Io, format!("home {url}: {m}")),
        HomeError::BadCookie => err(ErrorCode::Io, format!("home {url}: listing changed")),
        HomeError::Unreachable(m) => err(ErrorCode::Io, format!("home {url} unreachable: {m}")),
        HomeError::Exists => err(ErrorCode::Exists, format!("exists at home {url}")),
        HomeError::NotEmpty => err(ErrorCode::NotEmpty, format!("not empty at home {url}")),
        HomeError::NoSpace => err(ErrorCode::NoSpace, format!("no space left at home {url}")),
        HomeError::ReadOnly => err(ErrorCode::ReadOnly, format!("home {url} is read-only")),
        HomeError::Io(m) => err(ErrorCode::Io, format!("home {url}: {m}")),
    }
}

/// A unit of a cached file held here: (file, copy, block).
pub(super) type UnitKey = (FileId, u8, u64);

/// A directory's listing from home: its outcome once done.
type ListSlot = tokio::sync::Mutex<Option<Result<(), WireError>>>;

/// How far a directory's listing from home has come, for the listings of
/// it that go on meanwhile ([`Server::read_dir_filling`]).
#[derive(Clone, Debug)]
pub(crate) enum Fill {
    /// Names are being stored (each batch announced again).
    Going,
    /// Every name is stored and the directory marked listed.
    Done,
    /// The listing stopped short.
    Failed(WireError),
}

/// A name in a directory.
type DirName = (FileId, Vec<u8>);

/// A shared hold on a unit held here (see `ensure_unit`).
pub(super) type UnitHold = tokio::sync::OwnedRwLockReadGuard<()>;

/// What this server keeps for cache mode.
pub(crate) struct CacheState {
    bound: Mutex<HashMap<FileId, Arc<Bound>>>,
    /// Per unit (file, copy, block): one fetch or eviction at a time,
    /// reads of its bytes beside each other.
    pub(super) units: Mutex<HashMap<UnitKey, Arc<tokio::sync::RwLock<()>>>>,
    /// One listing at a time per directory, and its outcome.
    lists: Mutex<HashMap<FileId, Arc<ListSlot>>>,
    /// The progress of the listings from home under way.
    fills: Mutex<HashMap<FileId, Arc<tokio::sync::watch::Sender<Fill>>>>,
    /// When each object was last compared with home here.
    checked: Mutex<HashMap<FileId, Instant>>,
    /// Names home said it lacks, in directories not listed whole: (dir,
    /// name) → the directory's content version then, and when.
    absent: Mutex<HashMap<DirName, (u32, Instant)>>,
    /// Units read since the last flush of their use times.
    pub(super) touched: Mutex<Vec<UnitKey>>,
    /// Files (and copy) whose units this server is prefetching.
    pub(super) prefetching: Mutex<std::collections::HashSet<(FileId, u8)>>,
    /// Background unit fetches in flight.
    pub(super) background: Arc<tokio::sync::Semaphore>,
    /// This server's own changes, one at a time per inode (sharded).
    own: Vec<Arc<tokio::sync::Mutex<()>>>,
    /// Unit fetches from home in flight on this server.
    pub(super) fetching: tokio::sync::Semaphore,
}

/// Shards of [`CacheState::own`].
const OWN_SHARDS: usize = 64;

impl Default for CacheState {
    fn default() -> Self {
        CacheState {
            bound: Mutex::default(),
            units: Mutex::default(),
            lists: Mutex::default(),
            fills: Mutex::default(),
            checked: Mutex::default(),
            absent: Mutex::default(),
            touched: Mutex::default(),
            prefetching: Mutex::default(),
            background: Arc::new(tokio::sync::Semaphore::new(BACKGROUND_FETCHES)),
            own: (0..OWN_SHARDS)
                .map(|_| Arc::new(tokio::sync::Mutex::new(())))
                .collect(),
            fetching: tokio::sync::Semaphore::new(UNIT_FETCHES),
        }
    }
}

/// The kind of a home object here.
pub(super) fn kind_of(k: HomeKind) -> FileKind {
    match k {
        HomeKind::File => FileKind::File,
        HomeKind::Dir => FileKind::Dir,
        HomeKind::Symlink => FileKind::Symlink,
        HomeKind::BlockDev => FileKind::BlockDev,
        HomeKind::CharDev => FileKind::CharDev,
        HomeKind::Fifo => FileKind::Fifo,
        HomeKind::Socket => FileKind::Socket,
    }
}

fn time_of(t: morris_home::HomeTime) -> Timestamp {
    Timestamp {
        secs: t.secs,
        nanos: t.nsecs.min(999_999_999),
    }
}

/// Linux's device number encoding (`makedev`), as `stat` reports it.
fn makedev(major: u32, minor: u32) -> u32 {
    ((major & 0xfff) << 8) | (minor & 0xff) | ((minor & !0xff) << 12)
}

/// What revalidation compares, from home's attributes.
pub(crate) fn stamp_of(a: &HomeAttr) -> HomeStamp {
    HomeStamp {
        kind: kind_of(a.kind),
        size: a.size,
        mtime: time_of(a.mtime),
        ctime: time_of(a.ctime),
    }
}

/// Home's attributes as a cached inode's.
pub(crate) fn attr_of(a: &HomeAttr) -> Attr {
    let kind = kind_of(a.kind);
    Attr {
        kind,
        mode: a.mode & 0o7777,
        uid: a.uid,
        gid: a.gid,
        nlink: a.nlink.max(1),
        size: if kind == FileKind::Dir { 0 } else { a.size },
        atime: time_of(a.atime),
        mtime: time_of(a.mtime),
        ctime: time_of(a.ctime),
        rdev: makedev(a.rdev.0, a.rdev.1),
        flags: 0,
    }
}

/// The inode a home object will have in the cache, under `parent`.
fn seed_inode(
    home: &dyn Home,
    binding: FileId,
    parent: FileId,
    h: HomeHandle,
    a: &HomeAttr,
    target: Option<Vec<u8>>,
) -> Inode {
    let attr = attr_of(a);
    let kind = attr.kind;
    Inode {
        id: cache_id(binding, a.fsid, a.fileid),
        gen: cache_gen(home.identity(&h)),
        parent: if kind == FileKind::Dir { parent } else { 0 },
        attr,
        target,
        stale: Vec::new(),
        alloc: None,
        home: Some(Box::new(HomeLink {
            binding,
            handle: h.0,
            fileid: a.fileid,
            seen: stamp_of(a),
            checked_ms: wall_ms(),
            version: 1,
            listed: false,
            bound: None,
        })),
    }
}

fn link_of(ino: &Inode) -> Result<&HomeLink, WireError> {
    ino.home.as_deref().ok_or_else(|| {
        err(
            ErrorCode::Invalid,
            format!("{} is not cached from a home", ino.id),
        )
    })
}

/// Releases this server's own lease on drop.
pub(super) struct OwnLease<'a> {
    server: &'a Server,
    ino: FileId,
    /// One change of this server's at a time per inode: the lease table
    /// counts one holder (client 0), so a second change must not start
    /// under the first one's lease and outlive its release.
    _one: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for OwnLease<'_> {
    fn drop(&mut self) {
        self.server.release(SERVER_CLIENT, self.ino);
    }
}

impl Server {
    /// Takes this server's own write lease on `ino` (every client's lease
    /// on it is recalled first), for a change found at home.
    pub(super) async fn own_write_lease(&self, ino: FileId) -> Result<OwnLease<'_>, WireError> {
        let one = self.cache.own[(ino % OWN_SHARDS as u64) as usize]
            .clone()
            .lock_owned()
            .await;
        self.lease(SERVER_CLIENT, SERVER_CONN, ino, LeaseMode::Write)
            .await?;
        Ok(OwnLease {
            server: self,
            ino,
            _one: one,
        })
    }

    /// The binding rooted at `binding`; `UnknownBinding` if no client has
    /// told this server of it yet.
    pub(super) fn bound(&self, binding: FileId) -> Result<Arc<Bound>, WireError> {
        self.cache
            .bound
            .lock()
            .get(&binding)
            .cloned()
            .ok_or_else(|| {
                err(
                    ErrorCode::UnknownBinding,
                    format!("binding {binding} is not known here yet"),
                )
            })
    }

    /// `OpenHome`: keeps the settings of a binding (a changed one replaces
    /// the old, and its home is opened again when next needed).
    pub(super) fn open_home(&self, binding: FileId, spec: Binding) {
        {
            let mut b = self.cache.bound.lock();
            if b.get(&binding).is_some_and(|old| old.spec == spec) {
                return;
            }
            info!(binding, url = %spec.url, mode = spec.mode.name(), "binding learnt");
            b.insert(binding, Arc::new(Bound::new(spec.clone())));
        }
        // Kept, so that after a restart this server knows it at once. A
        // failure costs only that: clients tell it again when it asks.
        if let Err(e) = self.store.remember_binding(binding, &spec) {
            warn!(binding, error = %e, "binding settings not kept");
        }
    }

    /// At start: the bindings this server was told of before (their homes
    /// are opened when first needed).
    pub(crate) fn load_bindings(&self) {
        let known = match self.store.known_bindings() {
            Ok(k) => k,
            Err(e) => {
                warn!(error = %e, "kept binding settings not read");
                return;
            }
        };
        let mut b = self.cache.bound.lock();
        for (binding, spec) in known {
            match spec {
                Ok(spec) => {
                    debug!(binding, url = %spec.url, "binding known from before");
                    b.insert(binding, Arc::new(Bound::new(spec)));
                }
                Err(e) => {
                    warn!(binding, error = %e, "kept binding settings unreadable; a client will tell them again")
                }
            }
        }
    }

    /// `Bind`: makes the empty directory `dir` (owned here) a cache of
    /// `spec.url`.
    pub(super) async fn bind(
        &self,
        store: Arc<Store>,
        dir: Handle,
        spec: Binding,
    ) -> Result<Inode, WireError> {
        let _: HomeUrl = spec
            .url
            .parse()
            .map_err(|e| err(ErrorCode::Invalid, format!("{e}")))?;
        let b = Arc::new(Bound::new(spec.clone()));
        let home = b.home().await?;
        let (h, a) = home.root().await.map_err(|e| b.failed(e))?;
        if a.kind != HomeKind::Dir {
            return Err(err(ErrorCode::NotDir, "home's root is not a directory"));
        }
        let link = HomeLink {
            binding: dir.id,
            handle: h.0,
            fileid: a.fileid,
            seen: stamp_of(&a),
            checked_ms: wall_ms(),
            version: 1,
            listed: false,
            bound: Some(spec.clone()),
        };
        let _own = self.own_write_lease(dir.id).await?;
        let ino = metadata(|| store.bind(dir, &link))?;
        self.cache.bound.lock().insert(dir.id, b);
        if let Err(e) = self.store.remember_binding(dir.id, &spec) {
            warn!(binding = dir.id, error = %e, "binding settings not kept");
        }
        self.mark_checked(dir.id, Instant::now());
        info!(dir = dir.id, url = %spec.url, "bound to a home");
        Ok(ino)
    }

    /// `ForgetBinding`: removes every object of `binding` from the metadata
    /// ranges this server serves and every unit of it held here.
    pub(super) async fn forget_binding(&self, binding: FileId) -> Result<(), WireError> {
        let stores: Vec<Arc<Store>> = self
            .ranges()?
            .serving(self.now_ms())
            .into_iter()
            .map(|r| r.store.clone())
            .collect();
        for st in stores {
            let (entries, inodes) = blocking(move || st.purge_binding(binding)).await?;
            info!(binding, entries, inodes, "cached objects removed");
        }
        let store = self.store.clone();
        let blocks = self.blocks.clone();
        let copies = self.store.formatted().map_or(1, |f| f.descriptor.replicas);
        let freed = blocking(move || {
            let files = store.unit_files_of(binding)?;
            for &id in &files {
                // Records first: a crash in between leaves data with no
                // record (fetched again if ever needed), never a record of
                // data that is gone.
                store.drop_units_of(id)?;
                blocks.delete(id, copies)?;
            }
            Ok(files.len())
        })
        .await?;
        info!(binding, files = freed, "cached data removed");
        self.cache.bound.lock().remove(&binding);
        metadata(|| self.store.forget_binding_spec(binding))?;
        Ok(())
    }

    /// `Unbind`.
    pub(super) async fn unbind(&self, store: Arc<Store>, dir: Handle) -> Result<Inode, WireError> {
        let _own = self.own_write_lease(dir.id).await?;
        let ino = metadata(|| store.unbind(dir))?;
        self.cache.bound.lock().remove(&dir.id);
        Ok(ino)
    }

    /// `HomeLookup`: the entry `dir/name`, fetched from home if the
    /// directory has not got it and is not listed whole.
    pub(super) async fn home_lookup(
        &self,
        store: Arc<Store>,
        dir: Handle,
        name: Vec<u8>,
    ) -> Result<Option<DirEntry>, WireError> {
        crate::store::check_name(&name)?;
        let d = metadata(|| store.get_handle(dir))?;
        if d.attr.kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, "not a directory"));
        }
        let link = link_of(&d)?.clone();
        if let Some(e) = metadata(|| store.lookup(dir, &name))? {
            return Ok(Some(e));
        }
        if link.listed {
            return Ok(None);
        }
        let b = self.bound(link.binding)?;
        // A name home lacked a moment ago is trusted absent for the
        // validity lag, as attributes are (programs that search a path
        // probe many names that do not exist): unless the directory's
        // content changed since (a revalidation raises its version).
        let validity = Duration::from_millis(b.spec.validity_ms);
        let key = (dir.id, name.clone());
        if let Some(&(version, at)) = self.cache.absent.lock().get(&key) {
            if version == link.version && at.elapsed() < validity {
                return Ok(None);
            }
        }
        let home = b.home().await?;
        b.meta_requests.fetch_add(1, Ordering::Relaxed);
        let asked = Instant::now();
        let found = home.lookup(&HomeHandle(link.handle.clone()), &name).await;
        let (h, a) = match found {
            Ok(x) => x,
            Err(HomeError::NotFound) => {
                b.ok();
                if !validity.is_zero() {
                    let mut absent = self.cache.absent.lock();
                    if absent.len() >= ABSENT_KEEP {
                        absent.clear();
                    }
                    absent.insert(key, (link.version, asked));
                }
                return Ok(None);
            }
            Err(e) => return Err(b.failed(e)),
        };
        self.cache.absent.lock().remove(&key);
        b.ok();
        let target = self.target_of(&b, &home, &h, &a).await?;
        let seed = Seed {
            name: name.clone(),
            inode: seed_inode(&*home, link.binding, dir.id, h, &a, target),
        };
        metadata(|| store.fill(dir, std::slice::from_ref(&seed), false))?;
        metadata(|| store.lookup(dir, &name))
    }

    /// A symlink's target from home (`None` for other kinds).
    async fn target_of(
        &self,
        b: &Bound,
        home: &Arc<dyn Home>,
        h: &HomeHandle,
        a: &HomeAttr,
    ) -> Result<Option<Vec<u8>>, WireError> {
        if a.kind != HomeKind::Symlink {
            return Ok(None);
        }
        b.meta_requests.fetch_add(1, Ordering::Relaxed);
        match home.read_link(h).await {
            Ok(t) if !t.is_empty() => Ok(Some(t)),
            Ok(_) => Err(err(
                ErrorCode::Io,
                "home has a symlink with an empty target",
            )),
            Err(e) => Err(b.failed(e)),
        }
    }

    /// Every entry of home directory `handle`, as seeds for `dir`, one
    /// call of `page_done` per page of home's listing.
    ///
    /// Home's pages come one after another (each is asked from the last
    /// one's cookie), so the listing runs as two stages joined by a short
    /// queue: the next page is asked as soon as a page has come, and the
    /// page before is made into seeds (and handed on) while home works on
    /// it.
    async fn list_home(
        &self,
        b: &Bound,
        binding: FileId,
        dir: FileId,
        handle: &[u8],
        mut page_done: impl FnMut(Vec<Seed>) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        let home = b.home().await?;
        let hh = HomeHandle(handle.to_vec());
        let (tx, mut rx) = tokio::sync::mpsc::channel::<morris_home::DirPage>(LIST_AHEAD);
        let fetch = async {
            // Owned here: the queue ends when this stage does.
            let tx = tx;
            let mut cookie = 0;
            let mut verifier = [0u8; 8];
            let mut restarts = 0;
            let mut page_len = LIST_PAGE;
            loop {
                b.meta_requests.fetch_add(1, Ordering::Relaxed);
                let asked = Instant::now();
                let page = home.read_dir(&hh, cookie, verifier, page_len, true).await;
                if asked.elapsed() > LIST_SLOW_PAGE {
                    page_len = (page_len * 4).min(LIST_PAGE_MAX);
                }
                let page = match page {
                    Ok(p) => p,
                    Err(HomeError::BadCookie) if restarts < 3 => {
                        // The directory changed under the listing: start
                        // again (names already added stay; `fill` skips
                        // them).
                        restarts += 1;
                        cookie = 0;
                        verifier = [0; 8];
                        continue;
                    }
                    Err(e) => return Err(b.failed(e)),
                };
                b.ok();
                let next = match (page.eof, page.entries.last()) {
                    (true, _) => None,
                    (false, Some(last)) => Some((last.cookie, page.verifier)),
                    (false, None) => {
                        return Err(err(
                            ErrorCode::Io,
                            "home listed an empty page before its end",
                        ))
                    }
                };
                if tx.send(page).await.is_err() {
                    // The seeds' stage stopped, with its own error.
                    return Ok(());
                }
                match next {
                    Some((c, v)) => (cookie, verifier) = (c, v),
                    None => return Ok(()),
                }
            }
        };
        let seeds = async {
            while let Some(page) = rx.recv().await {
                let mut seeds = Vec::with_capacity(page.entries.len());
                for e in &page.entries {
                    let (h, a) = match &e.plus {
                        Some((h, a)) => (h.clone(), a.clone()),
                        None => {
                            b.meta_requests.fetch_add(1, Ordering::Relaxed);
                            match home.lookup(&hh, &e.name).await {
                                Ok(x) => x,
                                // Gone since the listing was made.
                                Err(HomeError::NotFound) | Err(HomeError::Stale) => continue,
                                Err(err) => return Err(b.failed(err)),
                            }
                        }
                    };
                    if crate::store::check_new_name(&e.name).is_err() {
                        debug!(dir, "home name not usable here; left out");
                        continue;
                    }
                    let target = match self.target_of(b, &home, &h, &a).await {
                        Ok(t) => t,
                        Err(e) if e.code == ErrorCode::NotFound => continue,
                        Err(e) => return Err(e),
                    };
                    seeds.push(Seed {
                        name: e.name.clone(),
                        inode: seed_inode(&*home, binding, dir, h, &a, target),
                    });
                }
                page_done(seeds)?;
            }
            Ok(())
        };
        // The first error stops both stages; a fetch that ended early (its
        // error) ends the queue, so the seeds' stage ends too.
        tokio::try_join!(fetch, seeds)?;
        Ok(())
    }

    /// Fills directory `dir` with every name home has, once (later callers
    /// wait for the first). Answers `true` once every name is stored,
    /// `false` if that takes longer than [`LIST_WAIT`]: listings of `dir`
    /// then go on meanwhile, each page waiting for names still to come
    /// ([`Server::read_dir_filling`]). Run by the first page of a listing
    /// of a cached directory not listed whole (`ReadDir` from cookie 0).
    pub(super) async fn home_list(
        &self,
        store: Arc<Store>,
        dir: Handle,
    ) -> Result<bool, WireError> {
        let d = metadata(|| store.get_handle(dir))?;
        if d.attr.kind != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, "not a directory"));
        }
        let link = link_of(&d)?.clone();
        if link.listed {
            return Ok(true);
        }
        let b = self.bound(link.binding)?;
        let slot = self
            .cache
            .lists
            .lock()
            .entry(dir.id)
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(None)))
            .clone();
        let progress = self
            .cache
            .fills
            .lock()
            .entry(dir.id)
            .or_insert_with(|| Arc::new(tokio::sync::watch::channel(Fill::Going).0))
            .clone();
        let Some(me) = self.this.get().and_then(std::sync::Weak::upgrade) else {
            return Err(err(ErrorCode::Unavailable, "server is stopping"));
        };
        // The listing runs in its own task, so a caller that gives up does
        // not stop it.
        let task = tokio::spawn(async move {
            let mut g = slot.lock().await;
            let r = match &*g {
                Some(Ok(())) => Ok(()),
                _ => me.fill_from_home(&b, &link, store, dir, &progress).await,
            };
            // Whoever follows the listing learns how it ended; the next
            // listing from cookie 0 after a failure starts a new one.
            progress.send_replace(match &r {
                Ok(()) => Fill::Done,
                Err(e) => Fill::Failed(e.clone()),
            });
            {
                let mut fills = me.cache.fills.lock();
                if fills
                    .get(&dir.id)
                    .is_some_and(|p| Arc::ptr_eq(p, &progress))
                {
                    fills.remove(&dir.id);
                }
            }
            if r.is_ok() {
                me.cache.lists.lock().remove(&dir.id);
            }
            // A failure is not kept: the next caller tries again.
            *g = r.as_ref().ok().map(|()| Ok(()));
            r
        });
        tokio::select! {
            r = task => match r {
                Ok(Ok(())) => Ok(true),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(err(ErrorCode::Io, format!("listing task failed: {e}"))),
            },
            () = tokio::time::sleep(LIST_WAIT) => Ok(false),
        }
    }

    /// Lists home directory `link` into `dir`: home's pages are stored by a
    /// blocking task of their own while the next pages are fetched, in
    /// batches of whatever has come meanwhile (up to [`FILL_BATCH`]
    /// names: the store's cost is mostly per transaction), each batch
    /// announced on `progress`.
    async fn fill_from_home(
        &self,
        b: &Bound,
        link: &HomeLink,
        store: Arc<Store>,
        dir: Handle,
        progress: &Arc<tokio::sync::watch::Sender<Fill>>,
    ) -> Result<(), WireError> {
        let started = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<Vec<Seed>>>();
        let announce = progress.clone();
        let filler = tokio::task::spawn_blocking(move || {
            let mut added = 0;
            let mut batch: Vec<Seed> = Vec::new();
            while let Some(msg) = rx.blocking_recv() {
                // While home is faster than the store the batches grow,
                // while it is slower each page is stored as it comes.
                let mut done = msg.is_none();
                batch.extend(msg.unwrap_or_default());
                while !done && batch.len() < FILL_BATCH {
                    match rx.try_recv() {
                        Ok(Some(page)) => batch.extend(page),
                        Ok(None) => done = true,
                        Err(_) => break,
                    }
                }
                added += store.fill(dir, &batch, done)?;
                batch.clear();
                if done {
                    // The listing is whole, and marked `listed`.
                    return Ok(added);
                }
                announce.send_replace(Fill::Going);
            }
            // Stopped short: what came is kept, not marked listed.
            store.fill(dir, &batch, false)?;
            Err(err(
                ErrorCode::Io,
                format!("listing from home stopped short ({added} names stored)"),
            ))
        });
        let listed = self
            .list_home(b, link.binding, dir.id, &link.handle, |seeds| {
                tx.send(Some(seeds))
                    .map_err(|_| err(ErrorCode::Io, "storing the listing failed"))
            })
            .await
            .and_then(|()| {
                tx.send(None)
                    .map_err(|_| err(ErrorCode::Io, "storing the listing failed"))
            });
        let fetched_ms = started.elapsed().as_millis() as u64;
        drop(tx);
        let stored = match filler.await {
            Ok(r) => r,
            Err(e) => Err(err(
                ErrorCode::Io,
                format!("listing store task failed: {e}"),
            )),
        };
        match (listed, stored) {
            (Ok(()), Ok(added)) => {
                info!(
                    dir = dir.id,
                    added,
                    fetched_ms,
                    ms = started.elapsed().as_millis() as u64,
                    "listed from home"
                );
                Ok(())
            }
            (Err(e), _) | (Ok(()), Err(e)) => {
                warn!(dir = dir.id, error = %e, "listing from home failed");
                Err(e)
            }
        }
    }

    /// The progress of `dir`'s listing from home, if one is under way: taken
    /// before the first read of a `ReadDir`, so that a listing that ends
    /// between the two is seen ended (its last names and `listed` are one
    /// transaction).
    pub(super) fn fill_progress(&self, dir: FileId) -> Option<tokio::sync::watch::Receiver<Fill>> {
        self.cache.fills.lock().get(&dir).map(|p| p.subscribe())
    }

    /// The answer to a `ReadDir` of `dir` from `cookie` whose store read
    /// gave `page`: if that is the end so far of a directory still being
    /// listed from home, the names that come next, waiting for them (at
    /// most `wait`: the client asks again after an empty page that is not
    /// the end). A cached directory that is neither listed whole nor being
    /// listed never ends: that listing fails, and the next one starts over.
    pub(super) async fn read_dir_filling(
        &self,
        store: Arc<Store>,
        dir: Handle,
        (cookie, max): (u64, u32),
        mut page: DirPage,
        filling: Option<tokio::sync::watch::Receiver<Fill>>,
        wait: Duration,
    ) -> Result<(Vec<DirEntry>, bool), WireError> {
        let Some(mut rx) = filling else {
            if page.eof && page.unlisted {
                return Err(err(
                    ErrorCode::Io,
                    "the listing from home did not finish; list the directory again",
                ));
            }
            return Ok((page.entries, page.eof));
        };
        let mut done = false;
        loop {
            if !page.eof || !page.unlisted || !page.entries.is_empty() {
                // A page of names, or the real end: an unlisted
                // directory's end so far is not its end.
                let end = page.eof && !page.unlisted;
                return Ok((page.entries, end));
            }
            let state = rx.borrow_and_update().clone();
            match state {
                Fill::Failed(e) => return Err(e),
                Fill::Done if done => {
                    return Err(err(ErrorCode::Io, "listed from home, yet not whole"))
                }
                Fill::Done => done = true,
                Fill::Going => match tokio::time::timeout(wait, rx.changed()).await {
                    Ok(Ok(())) => {}
                    // Nothing yet (the client asks again), or the listing's
                    // task is gone (the next ask fails).
                    Ok(Err(_)) | Err(_) => return Ok((Vec::new(), false)),
                },
            }
            let st = store.clone();
            page = metadata(move || st.read_dir_page(dir, cookie, max))?;
        }
    }

    /// `CreateCached`, at the seed's owner. An inode at that id caching
    /// another object is replaced under this server's own write lease, so
    /// that every client drops what it cached of the old object.
    pub(super) async fn create_cached(
        &self,
        store: Arc<Store>,
        seed: Inode,
    ) -> Result<Inode, WireError> {
        let link = link_of(&seed)?;
        let replacing = match metadata(|| store.get_inode(seed.id))? {
            Some(old)
                if old.gen == seed.gen
                    && old.attr.nlink > 0
                    && old.home.as_ref().is_some_and(|l| l.binding == link.binding) =>
            {
                // Made already (by this client's earlier ask or another's).
                return Ok(old);
            }
            // Another object on its id, or this one removed in the cache
            // and listed from home again: every client's view of it goes.
            Some(_) => true,
            None => false,
        };
        let _own = if replacing {
            Some(self.own_write_lease(seed.id).await?)
        } else {
            None
        };
        metadata(|| store.create_cached(&seed))
    }

    /// The seed `dir` keeps for its entry `e`, if `e` names a cached
    /// object and the seed is that object's (same id and generation).
    pub(super) fn seed_of(
        store: &Store,
        dir: Handle,
        e: &DirEntry,
    ) -> Result<Option<Inode>, WireError> {
        if !morris_proto::home::is_cache_id(e.child.id) {
            return Ok(None);
        }
        Ok(metadata(|| store.seed(dir, &e.name))?
            .filter(|s| s.id == e.child.id && s.gen == e.child.gen))
    }

    /// `Revalidate`: compares `h` with home if the validity lag has passed
    /// since it was compared here, and takes home's change if there is one.
    /// A home that cannot be reached leaves the cached object as it is.
    pub(super) async fn revalidate(
        &self,
        store: Arc<Store>,
        h: Handle,
    ) -> Result<Inode, WireError> {
        let ino = metadata(|| store.get_handle(h))?;
        let Some(link) = ino.home.as_deref().cloned() else {
            return Ok(ino);
        };
        if link.is_local() {
            return Ok(ino);
        }
        let b = self.bound(link.binding)?;
        if b.spec.writable() {
            // `sw`/`lu`: home changes only through this cache; what the
            // cache has is what counts (and a comparison would take the
            // write-back's own changes at home for changes of home's).
            if b.spec.mode != CacheMode::Iw {
                return Ok(ino);
            }
            // `iw`: an object with changes not yet pushed is the cache's
            // until its push (which finds a change of home's meanwhile:
            // a conflict); the others take home's changes as `ro` does.
            let st = store.clone();
            if metadata(|| st.wb_marked(h.id))? {
                return Ok(ino);
            }
        }
        let validity = Duration::from_millis(b.spec.validity_ms);
        match self.cache.checked.lock().get(&h.id) {
            Some(t) if validity > Duration::ZERO && t.elapsed() < validity => return Ok(ino),
            None if link.fresh(b.spec.validity_ms) => return Ok(ino),
            _ => {}
        }
        let home = match b.home().await {
            Ok(home) => home,
            Err(e) => {
                debug!(id = h.id, error = %e, "revalidation: home not reachable; cached copy served");
                return Ok(ino);
            }
        };
        b.meta_requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let now = match home.getattr(&HomeHandle(link.handle.clone())).await {
            Ok(a) => a,
            Err(e @ (HomeError::Unreachable(_) | HomeError::Io(_))) => {
                b.failed(e);
                return Ok(ino);
            }
            Err(e) => return Err(b.failed(e)),
        };
        b.ok();
        if stamp_of(&now) == link.seen && ino.attr.kind == kind_of(now.kind) {
            self.mark_checked(h.id, started);
            return Ok(ino);
        }
        debug!(id = h.id, "changed at home");
        let _own = self.own_write_lease(h.id).await?;
        // Another revalidation may have taken this very change meanwhile.
        let ino = metadata(|| store.get_handle(h))?;
        if ino.home.as_ref().is_some_and(|l| l.seen == stamp_of(&now)) {
            self.mark_checked(h.id, started);
            return Ok(ino);
        }
        let attr = attr_of(&now);
        let out = if ino.attr.kind == FileKind::Dir && now.kind == HomeKind::Dir {
            let mut seeds = Vec::new();
            self.list_home(&b, link.binding, h.id, &link.handle, |page| {
                seeds.extend(page);
                Ok(())
            })
            .await?;
            let (ino, what) = metadata(|| store.refresh_dir(h, &seeds, stamp_of(&now), &attr))?;
            info!(
                dir = h.id,
                added = what.added,
                removed = what.removed,
                replaced = what.replaced,
                "directory changed at home"
            );
            ino
        } else if ino.attr.kind == kind_of(now.kind) {
            let target = self
                .target_of(&b, &home, &HomeHandle(link.handle.clone()), &now)
                .await?;
            metadata(|| store.home_changed(h, &attr, stamp_of(&now), target))?
        } else {
            return Err(err(
                ErrorCode::NotFound,
                "the object changed kind at home: look its name up again",
            ));
        };
        self.mark_checked(h.id, started);
        Ok(out)
    }

    /// Records that `id` was compared with home at `at` (the record of
    /// all objects is dropped whole past [`CHECKED_KEEP`]: they are then
    /// simply compared again at their next use).
    fn mark_checked(&self, id: FileId, at: Instant) {
        let mut c = self.cache.checked.lock();
        if c.len() >= CHECKED_KEEP {
            c.clear();
        }
        c.insert(id, at);
    }

    /// The bindings this server knows, with their state.
    pub(super) fn known_bindings(&self) -> Vec<(FileId, Arc<Bound>)> {
        self.cache
            .bound
            .lock()
            .iter()
            .map(|(id, b)| (*id, b.clone()))
            .collect()
    }

    /// `CacheStatus`.
    pub(super) fn cache_status(&self) -> Result<Vec<BindingStatus>, WireError> {
        let bound = self.known_bindings();
        let mut out = Vec::with_capacity(bound.len());
        for (id, b) in bound {
            let store = self.store.clone();
            let (_, bytes) = metadata(|| store.cached_bytes_of(id))?;
            let mut s = b.status(bytes);
            s.binding = id;
            s.mode = b.spec.mode.name().to_string();
            let q = self.wb_queue(id);
            s.queued = q.objects;
            s.oldest_ms = q.oldest_ms.map_or(0, |t| wall_ms().saturating_sub(t));
            s.dirty_bytes = q.dirty_bytes;
            s.push_ms = b.wb.push_ms.load(Ordering::Relaxed);
            s.pushed = b.wb.pushed.load(Ordering::Relaxed);
            s.pushed_bytes = b.wb.pushed_bytes.load(Ordering::Relaxed);
            s.rounds = b.wb.rounds.load(Ordering::Relaxed);
            s.skipped = b.wb.skipped.load(Ordering::Relaxed);
            s.conflicts = b.wb.conflicts.load(Ordering::Relaxed);
            if s.last_error.is_none() {
                s.last_error = b.wb.last_error.lock().clone();
            }
            out.push(s);
        }
        out.sort_by_key(|s| s.binding);
        Ok(out)
    }
}
