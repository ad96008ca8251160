//! The client's lease cache: where a lease is taken, cached, recalled and given back.
//!
//! A [`LeaseGuard`] is a *use* of a cached lease: while any guard on an inode
//! is alive, a recall of that inode waits. Recall handling (stop new uses, wait
//! for current ones, write back the dirty inode, drop caches, tell the front
//! end, send `Release`) runs in its own task.
//!
//! Deadlock rule: an operation that needs several leases takes them in
//! ascending file id order and never waits for a lease while holding a guard
//! on a higher id (see [`Leases::lock_many`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use morris_proto::home::HomeLink;
use morris_proto::layout::Layout;
use morris_proto::messages::LeaseMode;
use morris_proto::{
    DirEntry, ErrorCode, FileId, Handle, Inode, Reply, Request, SetAttr, Timestamp,
};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{OwnedRwLockReadGuard, RwLock as AsyncRwLock};
use tracing::{debug, warn};

use crate::opens::Opens;
use crate::pool::{unexpected, Pool};
use crate::{Error, Invalidator, Result};

/// A hash map for the big per-directory and per-file tables a listing fills
/// (a name and a generation per entry): foldhash, seeded per process, is
/// several times cheaper per key than the standard SipHash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Shared or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// What the client knows under a lease.
pub(crate) struct EntryState {
    /// The inode as last seen (and, under a write lease, as changed locally).
    pub inode: Inode,
    /// False when the server changed the inode behind our copy (e.g. a
    /// directory's mtime after Link); the next getattr refetches.
    pub attr_valid: bool,
    /// Size and mtime changed locally and not yet stored at the owner.
    pub dirty: bool,
    /// Directory entry cache: name → entry, `None` for known-absent.
    pub names: FastMap<Vec<u8>, Option<DirEntry>>,
    /// `names` holds every entry of the directory (answers absent names
    /// without asking the server).
    pub complete: bool,
    /// While listing from cookie 0 under this lease: the last cookie seen.
    pub listed_upto: Option<u64>,
    /// Bumped by every local write, so read-ahead data fetched before it is dropped.
    pub local_writes: u64,
    /// Bumped whenever this client applies a change to the state (an
    /// answer to its own Link/Unlink/Rename/SetAttr, a local write). A
    /// refetch of the inode sent before may describe the state before that
    /// change, so it is cached only if the version is still the one it was
    /// sent under. (Names are guarded per name: `fs.rs` `entry_in`.)
    pub version: u64,
    /// The object's extended attributes, once read under this lease.
    pub xattrs: Option<std::sync::Arc<Vec<morris_proto::Xattr>>>,
    /// The file was opened under this grant before and nothing this
    /// client wrote since went past the kernel's page cache (`O_APPEND`
    /// writes do): whatever the kernel cached of it is current, and the
    /// next open may keep it (`io.rs` `do_open`). A new grant starts
    /// without it: what the kernel cached before may be another mount's
    /// past.
    pub kernel_pages: bool,
    recalled: bool,
    released: bool,
}

impl EntryState {
    /// Records that a change was applied (see `version`).
    pub fn changed(&mut self) {
        self.version = self.version.wrapping_add(1);
    }
}

/// One cached lease.
pub(crate) struct LeaseEntry {
    pub id: FileId,
    pub owner: u32,
    pub mode: Mode,
    epoch: u64,
    /// Changes with every grant; data cached under another generation is stale.
    pub generation: u64,
    /// The owner's fence number of this write grant (0 for a read lease):
    /// every block change made under it carries it, and data servers refuse
    /// it once a newer grant's change has reached them (`Reply::Leased`).
    fence: AtomicU64,
    uses: Arc<AsyncRwLock<()>>,
    pub state: Mutex<EntryState>,
    /// Becomes true once the lease has been given back (or dropped).
    gone: tokio::sync::watch::Sender<bool>,
    /// Requests of this client waiting for the give-back to finish, and a
    /// wake-up when one starts waiting (`give_back` then stops waiting for
    /// the kernel: that request may hold the very lock the kernel's
    /// invalidation needs).
    waiting: std::sync::atomic::AtomicUsize,
    waited: tokio::sync::Notify,
    /// One stale-copy record of the file made at a time (`copies.rs`
    /// `mark_missed`): whether a block would be left with no current copy
    /// is decided on every record made before.
    pub marking: tokio::sync::Mutex<()>,
}

impl LeaseEntry {
    /// The owner's fence number of this write grant (0 for a read lease):
    /// every block change made under it carries it, and data servers
    /// refuse it once a newer grant's change has reached them. For an
    /// object created with a reserved id, known once its inode is stored
    /// (`deferred::Step::Created`).
    pub fn fence_no(&self) -> u64 {
        self.fence.load(Ordering::Acquire)
    }

    /// Records the fence number of the grant that came with a reserved
    /// id's inode (`CreateInodeAt`).
    pub(crate) fn set_fence_no(&self, n: u64) {
        self.fence.store(n, Ordering::Release);
    }

    /// The lease changes made under this entry are fenced by.
    pub fn fence(&self) -> crate::pool::Fence {
        crate::pool::Fence {
            owner: self.owner,
            term: self.epoch,
        }
    }

    /// The handle of the leased inode.
    pub fn handle(&self) -> Handle {
        self.state.lock().inode.handle()
    }

    /// Waits until a recall or discard of this entry has finished.
    async fn wait_gone(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.waited.notify_waiters();
        let mut rx = self.gone.subscribe();
        let _ = rx.wait_for(|g| *g).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Finds the guard of `id` among guards returned by [`Leases::lock_many`].
pub(crate) fn pick(guards: &[LeaseGuard], id: FileId) -> Result<&LeaseGuard> {
    guards
        .iter()
        .find(|g| g.entry.id == id)
        .ok_or_else(|| Error::new(ErrorCode::NoLease, format!("no lease taken on {id}")))
}

/// A use of a lease; keep it alive while relying on what the lease protects.
pub(crate) struct LeaseGuard {
    pub entry: Arc<LeaseEntry>,
    _use: OwnedRwLockReadGuard<()>,
}

impl LeaseGuard {
    /// The lease changes made under this guard are fenced by.
    pub fn fence(&self) -> crate::pool::Fence {
        self.entry.fence()
    }

    /// A copy of the cached inode.
    pub fn inode(&self) -> Inode {
        self.entry.state.lock().inode.clone()
    }
    /// The handle of the leased inode.
    pub fn handle(&self) -> Handle {
        self.entry.handle()
    }
}

/// Sends what the client gathered of a file's writes and has not sent yet
/// (`behind.rs`), under a write lease about to be given back: set by the
/// client, called by [`Leases`] before it stores the size.
pub(crate) trait Drain: Send + Sync {
    /// Sends the writes of `entry`'s file gathered here, under `entry`.
    fn drain<'a>(
        &'a self,
        entry: &'a Arc<LeaseEntry>,
    ) -> futures::future::BoxFuture<'a, Result<()>>;
}

const ACQUIRE_SHARDS: usize = 256;

/// Leases given back at once when the client shuts down.
const RELEASES_AT_ONCE: usize = 256;

/// Longest wait for the front end's caches to be invalidated before a lease
/// is given back (`Invalidator::flush`). Usually they are in microseconds;
/// but a kernel invalidation waits for the directory or page locks that a
/// request of this very mount holds, and that request may be waiting for
/// a lease being given back (this one: the wait stops at once, see
/// `give_back`; or another one: the wait runs out). The kernel may then
/// show the old name a moment longer; the client answers `ESTALE` for a
/// file with no name left, and the kernel looks the name up again.
const INVALIDATION_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Size and times changed locally under a write lease and not yet stored at
/// the owner. Kept outside the lease entries, so that losing a lease (owner
/// restart, expiry, a failed write-back on recall) cannot lose them: the next
/// write lease on the inode starts from them, and close stores them.
#[derive(Debug, Clone, Copy)]
struct Unstored {
    size: u64,
    mtime: morris_proto::Timestamp,
    ctime: morris_proto::Timestamp,
    /// Mode, owners and access time changed here and not yet stored.
    attrs: PendingAttrs,
    seq: u64,
}

/// Attribute changes beyond size and times that a client made under a write
/// lease and has not stored yet (`fs.rs` `set_behind`): stored with the
/// size, at close, `fsync`, recall, give-back, or a second after they were
/// made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PendingAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<morris_proto::Timestamp>,
}

impl PendingAttrs {
    /// Puts these changes into `a`.
    pub(crate) fn apply(&self, a: &mut morris_proto::Attr) {
        if let Some(m) = self.mode {
            a.mode = m & 0o7777;
        }
        if let Some(u) = self.uid {
            a.uid = u;
        }
        if let Some(g) = self.gid {
            a.gid = g;
        }
        if let Some(t) = self.atime {
            a.atime = t;
        }
    }

    /// Adds `newer`'s changes (they win).
    fn merge(&mut self, newer: PendingAttrs) {
        self.mode = newer.mode.or(self.mode);
        self.uid = newer.uid.or(self.uid);
        self.gid = newer.gid.or(self.gid);
        self.atime = newer.atime.or(self.atime);
    }

    /// Adds these changes to `set` where it does not set the field itself.
    pub(crate) fn fill(&self, set: &mut SetAttr) {
        set.mode = set.mode.or(self.mode);
        set.uid = set.uid.or(self.uid);
        set.gid = set.gid.or(self.gid);
        set.atime = set.atime.or(self.atime);
    }
}

/// The lease cache of one client.
pub(crate) struct Leases {
    pool: Arc<Pool>,
    /// Files open here: their records must outlive a lost or given-up lease.
    opens: Arc<Opens>,
    layout: Layout,
    map: Mutex<HashMap<FileId, Arc<LeaseEntry>>>,
    /// Generation numbers of every file handed out, to rebuild handles by id.
    gens: Mutex<FastMap<FileId, u32>>,
    /// Recalls received per inode; an acquire that sees this change while its
    /// request was in flight treats the fresh grant as already recalled.
    recall_seq: Mutex<HashMap<FileId, u64>>,
    /// Acquires in flight, per inode.
    inflight: Mutex<HashMap<FileId, usize>>,
    acquiring: Vec<tokio::sync::Mutex<()>>,
    /// Serializes attribute stores per inode: two SetAttrs of one inode in
    /// flight at once could be applied by the server in either order.
    storing: Vec<tokio::sync::Mutex<()>>,
    unstored: Mutex<HashMap<FileId, Unstored>>,
    next_seq: AtomicU64,
    next_generation: AtomicU64,
    pub recalls: AtomicU64,
    inv: RwLock<Option<Arc<dyn Invalidator>>>,
    drain: RwLock<Option<Arc<dyn Drain>>>,
    max_cached: usize,
}

impl Leases {
    pub(crate) fn new(
        pool: Arc<Pool>,
        opens: Arc<Opens>,
        layout: Layout,
        max_cached: usize,
    ) -> Arc<Self> {
        Arc::new(Leases {
            pool,
            opens,
            layout,
            map: Mutex::new(HashMap::new()),
            gens: Mutex::new(FastMap::default()),
            recall_seq: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            acquiring: (0..ACQUIRE_SHARDS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            storing: (0..ACQUIRE_SHARDS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            unstored: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(1),
            next_generation: AtomicU64::new(1),
            recalls: AtomicU64::new(0),
            inv: RwLock::new(None),
            drain: RwLock::new(None),
            max_cached: max_cached.max(16),
        })
    }

    pub(crate) fn set_invalidator(&self, inv: Arc<dyn Invalidator>) {
        *self.inv.write() = Some(inv);
    }

    pub(crate) fn invalidator(&self) -> Option<Arc<dyn Invalidator>> {
        self.inv.read().clone()
    }

    pub(crate) fn set_drain(&self, d: Arc<dyn Drain>) {
        *self.drain.write() = Some(d);
    }

    pub(crate) fn held(&self) -> u64 {
        self.map.lock().len() as u64
    }

    /// Remembers the generation of `id`.
    pub(crate) fn learn(&self, h: Handle) {
        self.gens.lock().insert(h.id, h.gen);
    }

    /// Remembers the generation of `id` unless one is known already.
    pub(crate) fn learn_if_unknown(&self, h: Handle) {
        self.gens.lock().entry(h.id).or_insert(h.gen);
    }

    /// Forgets a deleted file.
    pub(crate) fn forget(&self, id: FileId) {
        self.gens.lock().remove(&id);
        self.map.lock().remove(&id);
        self.unstored.lock().remove(&id);
    }

    /// Records that the cached inode in `st` (of `id`) changed locally: it is
    /// dirty until a write-back that saw this change succeeds.
    pub(crate) fn local_change(&self, id: FileId, st: &mut EntryState) {
        self.local_attrs(id, st, PendingAttrs::default());
    }

    /// [`Leases::local_change`] that also changes the attributes `attrs`
    /// names (already applied to nothing: applied here).
    pub(crate) fn local_attrs(&self, id: FileId, st: &mut EntryState, attrs: PendingAttrs) {
        attrs.apply(&mut st.inode.attr);
        st.dirty = true;
        st.changed();
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let mut unstored = self.unstored.lock();
        let mut all = unstored.get(&id).map(|u| u.attrs).unwrap_or_default();
        all.merge(attrs);
        unstored.insert(
            id,
            Unstored {
                size: st.inode.attr.size,
                mtime: st.inode.attr.mtime,
                ctime: st.inode.attr.ctime,
                attrs: all,
                seq,
            },
        );
    }

    /// The attribute changes of `id` not yet stored, beyond size and times.
    pub(crate) fn pending_attrs(&self, id: FileId) -> PendingAttrs {
        self.unstored
            .lock()
            .get(&id)
            .map(|u| u.attrs)
            .unwrap_or_default()
    }

    /// Puts what this client changed of `id` and has not stored (`local`'s
    /// size and times, the pending attributes) into `server`, an inode the
    /// owner sent.
    pub(crate) fn keep_local(
        &self,
        id: FileId,
        local: &morris_proto::Attr,
        server: &mut morris_proto::Attr,
    ) {
        server.size = local.size;
        server.mtime = local.mtime;
        server.ctime = local.ctime;
        self.pending_attrs(id).apply(server);
    }

    /// True while `id` has local changes not yet stored at its owner.
    pub(crate) fn has_unstored(&self, id: FileId) -> bool {
        self.unstored.lock().contains_key(&id)
    }

    /// The change sequence a write-back of `id` covers (taken before sending).
    pub(crate) fn unstored_seq(&self, id: FileId) -> Option<u64> {
        self.unstored.lock().get(&id).map(|u| u.seq)
    }

    /// Takes the owner's answer to a SetAttr that carried the local changes
    /// up to `seq`: clean if nothing changed meanwhile, else keep the newer
    /// local size and times (still dirty).
    pub(crate) fn stored(&self, entry: &LeaseEntry, inode: Inode, seq: Option<u64>) {
        let mut st = entry.state.lock();
        let mut unstored = self.unstored.lock();
        let now = unstored.get(&entry.id).map(|u| u.seq);
        let keep = st.inode.attr.clone();
        let mut inode = inode;
        if entry.mode == Mode::Write {
            crate::copies::merge_stale(&st.inode.stale, &mut inode.stale);
        }
        st.inode = inode;
        st.attr_valid = true;
        st.changed();
        if now.is_some() && now != seq {
            st.inode.attr.size = keep.size;
            st.inode.attr.mtime = keep.mtime;
            st.inode.attr.ctime = keep.ctime;
            if let Some(u) = unstored.get(&entry.id) {
                u.attrs.apply(&mut st.inode.attr);
            }
            st.dirty = true;
        } else {
            unstored.remove(&entry.id);
            st.dirty = false;
        }
    }

    /// Takes an inode the owner sent back after a change that did not store
    /// this client's size and times (e.g. `DropLink`): local changes not
    /// yet stored stay.
    pub(crate) fn refreshed(&self, entry: &LeaseEntry, mut inode: Inode) {
        let mut st = entry.state.lock();
        if st.dirty {
            let local = st.inode.attr.clone();
            self.keep_local(entry.id, &local, &mut inode.attr);
            // A hole made here is measured when the size is stored.
            inode.alloc = inode.alloc.or(st.inode.alloc);
        }
        if entry.mode == Mode::Write {
            crate::copies::merge_stale(&st.inode.stale, &mut inode.stale);
        }
        st.inode = inode;
        st.attr_valid = true;
        st.changed();
    }

    /// The handle of a file id handed out before.
    pub(crate) fn handle(&self, id: FileId) -> Result<Handle> {
        if id == morris_proto::ROOT_ID {
            if let Some(g) = self.gens.lock().get(&id) {
                return Ok(Handle { id, gen: *g });
            }
        }
        match self.gens.lock().get(&id) {
            Some(g) => Ok(Handle { id, gen: *g }),
            None => Err(Error::new(
                ErrorCode::Stale,
                format!("file id {id} is unknown to this client"),
            )),
        }
    }

    /// Moves the cached status change time of `id` forward to `t` (its
    /// owner did so without a lease: a rename).
    pub(crate) fn touch_ctime(&self, id: FileId, t: Timestamp) {
        let Some(e) = self.map.lock().get(&id).cloned() else {
            return;
        };
        let mut st = e.state.lock();
        if st.inode.attr.ctime < t {
            st.inode.attr.ctime = t;
        }
    }

    /// The inode under a usable cached lease on `id`, without waiting.
    pub(crate) fn cached_inode(&self, id: FileId) -> Option<Inode> {
        let e = self.map.lock().get(&id).cloned()?;
        if !self.usable(&e, Mode::Read) {
            return None;
        }
        let inode = e.state.lock().inode.clone();
        Some(inode)
    }

    /// The home link of `id`'s cached inode, if its lease is usable:
    /// `Some(None)` for an object not cached from a home (no copy made).
    pub(crate) fn cached_home(&self, id: FileId) -> Option<Option<HomeLink>> {
        let e = self.map.lock().get(&id).cloned()?;
        if !self.usable(&e, Mode::Read) {
            return None;
        }
        let home = e.state.lock().inode.home.as_deref().cloned();
        Some(home)
    }

    /// The inode of `id` if its lease is cached and the copy is current
    /// (the server changed nothing behind it).
    pub(crate) fn current_inode(&self, id: FileId) -> Option<Inode> {
        let e = self.map.lock().get(&id).cloned()?;
        if !self.usable(&e, Mode::Read) {
            return None;
        }
        let st = e.state.lock();
        st.attr_valid.then(|| st.inode.clone())
    }

    /// Whether this client has a lease entry for `h.id` that is another
    /// object's (another generation): [`Leases::get`] of `h` answers
    /// `Stale` until it is gone.
    pub(crate) fn holds_other(&self, h: Handle) -> bool {
        self.map
            .lock()
            .get(&h.id)
            .is_some_and(|e| e.state.lock().inode.gen != h.gen)
    }

    /// The cached lease entry of `id`, if usable for reading: captured
    /// before a request that takes no lease, so that its answer can be
    /// cached under the lease afterwards ([`Leases::note_name`]).
    pub(crate) fn held_entry(&self, id: FileId) -> Option<Arc<LeaseEntry>> {
        let e = self.map.lock().get(&id).cloned()?;
        self.usable(&e, Mode::Read).then_some(e)
    }

    /// How long the lease this client holds on `id` may still be trusted
    /// without hearing from its server; `None` if it holds none.
    pub(crate) fn trust_left(&self, id: FileId) -> Option<std::time::Duration> {
        let e = self.held_entry(id)?;
        Some(self.pool.trust_left(e.owner, e.epoch))
    }

    /// How long a front end may keep `dir`'s entry `name` (naming `child`)
    /// without asking again: while this client's lease on `dir` may still
    /// be trusted, if the name is cached under that lease (so that giving
    /// the lease back tells the front end to drop it); else zero.
    pub(crate) fn name_ttl(&self, dir: FileId, name: &[u8], child: Handle) -> std::time::Duration {
        let zero = std::time::Duration::ZERO;
        // Being upgraded: the read lease may be gone at the owner already.
        if self.inflight.lock().contains_key(&dir) {
            return zero;
        }
        let Some(e) = self.held_entry(dir) else {
            return zero;
        };
        {
            let st = e.state.lock();
            if !matches!(st.names.get(name), Some(Some(d)) if d.child == child) {
                return zero;
            }
        }
        self.pool.trust_left(e.owner, e.epoch)
    }

    /// Caches `entry` as directory `dir`'s answer for `name`, as a lookup
    /// under the lease would: only if `before` (held when the request was
    /// sent) is still the lease in use, so the server could not change the
    /// directory between the answer and now. A name cached meanwhile (this
    /// client's own change) is kept.
    pub(crate) fn note_name(&self, before: &Arc<LeaseEntry>, name: &[u8], entry: Option<DirEntry>) {
        let same = self
            .map
            .lock()
            .get(&before.id)
            .is_some_and(|e| Arc::ptr_eq(e, before));
        if !same || !self.usable(before, Mode::Read) {
            return;
        }
        if let Some(e) = &entry {
            self.learn(e.child);
        }
        let mut st = before.state.lock();
        if st.released || st.recalled {
            return;
        }
        st.names.entry(name.to_vec()).or_insert(entry);
    }

    fn usable(&self, e: &LeaseEntry, want: Mode) -> bool {
        let st = e.state.lock();
        !st.recalled && !st.released && e.mode >= want && self.pool.lease_valid(e.owner, e.epoch)
    }

    /// Returns a use of a lease of at least `want` on `h`, taking it from the
    /// owning server if it is not cached (one round trip, which also returns
    /// the inode).
    pub(crate) async fn get(self: &Arc<Self>, h: Handle, want: Mode) -> Result<LeaseGuard> {
        self.get_seeded(h, want, None).await
    }

    /// [`Leases::get`] of a cached object whose inode may not exist yet:
    /// if a read lease must be taken, `AcquireCached` creates the inode from
    /// `seed` first (one round trip for a placeholder's first use).
    pub(crate) async fn get_seeded(
        self: &Arc<Self>,
        h: Handle,
        want: Mode,
        seed: Option<&Inode>,
    ) -> Result<LeaseGuard> {
        // Local changes not yet stored must carry over into the next lease,
        // which only a write lease can hold (a read lease would show the
        // owner's older size).
        let want = if want == Mode::Read && self.has_unstored(h.id) {
            Mode::Write
        } else {
            want
        };
        loop {
            let cached = self.map.lock().get(&h.id).cloned();
            if let Some(e) = cached {
                if e.state.lock().inode.gen != h.gen {
                    return Err(Error::new(
                        ErrorCode::Stale,
                        format!("file {} was replaced", h.id),
                    ));
                }
                // Removed here (no name left), and named again from home's
                // listing (an `iw` cache's removal home did not take): the
                // owner makes it live again, recalling this lease first.
                let revived = seed.is_some_and(|s| {
                    s.handle() == h && s.attr.nlink > 0 && e.state.lock().inode.attr.nlink == 0
                });
                if revived && want == Mode::Read {
                    match self.acquire(h, want, seed, true).await? {
                        Some(g) => return Ok(g),
                        None => continue,
                    }
                }
                if self.usable(&e, want) {
                    let g = crate::slow::watch(
                        || format!("a use of the lease on {} ({want:?})", h.id),
                        e.uses.clone().read_owned(),
                    )
                    .await;
                    if self.usable(&e, want) {
                        return Ok(LeaseGuard { entry: e, _use: g });
                    }
                    continue;
                }
                let recalled = e.state.lock().recalled;
                if recalled {
                    // A recall is giving it back; asking again before its
                    // Release reaches the server would be undone by that Release.
                    crate::slow::watch(
                        || format!("the give-back of the lease on {}", h.id),
                        e.wait_gone(),
                    )
                    .await;
                    continue;
                }
                // Expired or too weak: drop what it protected before asking again.
                if !self.pool.lease_valid(e.owner, e.epoch) {
                    self.discard(&e);
                }
            }
            match self.acquire(h, want, seed, false).await? {
                Some(g) => return Ok(g),
                // Given back before it could be used: ask again.
                None => continue,
            }
        }
    }

    /// Takes the lease from its owner and returns a use of it; `None` if a
    /// recall gave it back before the use could be taken (ask again).
    /// `revive`: ask even though a lease is cached (see `get_seeded`).
    async fn acquire(
        self: &Arc<Self>,
        h: Handle,
        want: Mode,
        seed: Option<&Inode>,
        revive: bool,
    ) -> Result<Option<LeaseGuard>> {
        let _serial = crate::slow::watch(
            || format!("another acquire of (an inode sharing a lock with) {}", h.id),
            self.acquiring[(h.id as usize) % ACQUIRE_SHARDS].lock(),
        )
        .await;
        // Someone else may have taken it while we waited. Nothing here may
        // wait for a give-back while holding the shard lock: the shard is
        // shared with other inodes, and a request of this client that holds
        // a use of the inode being given back (a directory) may be waiting
        // for this very shard to acquire another one (a child whose id falls
        // in it) — the give-back would wait for that use, the use for the
        // shard, the shard for the give-back (the checker saw the NFS
        // gateway wedged this way). So: take a use only if one is free at
        // once, and otherwise let go of the shard and start again.
        let cached = self.map.lock().get(&h.id).cloned().filter(|_| !revive);
        if let Some(e) = cached {
            if self.usable(&e, want) {
                if let Ok(g) = e.uses.clone().try_read_owned() {
                    if self.usable(&e, want) {
                        return Ok(Some(LeaseGuard { entry: e, _use: g }));
                    }
                }
                drop(_serial);
                return Ok(None);
            }
        }
        let range = self.layout.inode_server(h.id);
        // Registered in flight in one step with a last look at the cached
        // entry, under the lock `on_recall` decides under: either that
        // recall sees this acquire (and sends no Release, which could reach
        // the server after this grant and give *it* back), or this acquire
        // sees the entry marked recalled and waits for its give-back.
        let seq_before = {
            let mut inflight = self.inflight.lock();
            let giving_back = self
                .map
                .lock()
                .get(&h.id)
                .filter(|e| e.state.lock().recalled)
                .cloned();
            if let Some(e) = giving_back {
                drop(inflight);
                drop(_serial);
                crate::slow::watch(
                    || format!("the give-back of the lease on {}", h.id),
                    e.wait_gone(),
                )
                .await;
                return Ok(None);
            }
            *inflight.entry(h.id).or_insert(0) += 1;
            self.recall_seq.lock().get(&h.id).copied().unwrap_or(0)
        };
        let req = match (want, seed) {
            (Mode::Read, Some(seed)) if seed.handle() == h => {
                Request::AcquireCached { seed: seed.clone() }
            }
            (Mode::Read, _) => Request::AcquireRead { ino: h },
            (Mode::Write, _) => Request::AcquireWrite { ino: h },
        };
        if want == Mode::Write {
            // The owner drops this client's read lease on it when the
            // request arrives, so others may change it from then on: names
            // the front end keeps under that lease go now (an invalidation
            // of each could wait for the lock of the request asking).
            let named = self
                .map
                .lock()
                .get(&h.id)
                .is_some_and(|e| !e.state.lock().names.is_empty());
            if named {
                if let Some(inv) = self.invalidator() {
                    inv.all_names();
                }
            }
        }
        let guess = self.pool.range_server(range);
        let epoch_before = self.pool.epoch(guess);
        let res = self.pool.call_range(range, req, Bytes::new()).await;
        // The acquire counts as in flight until its grant is installed: a
        // recall handled in between must see one or the other (`on_recall`).
        let (entry, old, recalled) = {
            let mut inflight = self.inflight.lock();
            out_of_flight(&mut inflight, h.id);
            let (owner, reply, _) = res?;
            let (inode, fence, xattrs) = match reply {
                Reply::Inode(inode) => (inode, 0, None),
                Reply::Leased { inode, fence } => (inode, fence, None),
                Reply::ReadLeased { inode, xattrs } => (inode, 0, xattrs),
                other => return Err(unexpected(&other)),
            };
            let epoch = self.pool.epoch(owner);
            if owner == guess && epoch_before != 0 && epoch != epoch_before {
                debug!(ino = h.id, "owner restarted during acquire");
            }
            let recalled = self.recall_seq.lock().get(&h.id).copied().unwrap_or(0) != seq_before;
            let (entry, old) = self.install(owner, epoch, want, inode, fence, recalled);
            // Read with the inode under this lease: kept with it, as a
            // `GetXattrs` under it would be (`xattrs.rs`).
            if let Some(list) = xattrs {
                entry.state.lock().xattrs = Some(Arc::new(list));
            }
            debug!(
                ino = h.id,
                ?want,
                lease = entry.generation,
                recalled,
                "granted"
            );
            (entry, old, recalled)
        };
        if let Some(old) = old {
            // Upgrading from read (or replacing an expired entry): whatever was
            // cached under the old lease may be stale now.
            self.drop_caches(&old);
        }
        let g = entry.uses.clone().read_owned().await;
        if entry.state.lock().released {
            // A recall that arrived between the grant and this use took the
            // entry first and gave it back (the server no longer counts it):
            // using it now would write under a lease someone else may hold.
            return Ok(None);
        }
        if recalled {
            // Granted and recalled at once: use it for this operation, then give it back.
            let me = self.clone();
            let e2 = entry.clone();
            tokio::spawn(async move { me.process_recall(e2).await });
        }
        self.maybe_evict();
        Ok(Some(LeaseGuard { entry, _use: g }))
    }

    /// Records a lease granted by a request other than Acquire* (e.g.
    /// `CreateInode` grants the write lease on the new inode).
    pub(crate) fn install_granted(
        &self,
        mode: Mode,
        inode: Inode,
        fence: u64,
        xattrs: Vec<morris_proto::Xattr>,
    ) {
        let owner = self.layout.inode_server(inode.id);
        self.install_granted_by(owner, mode, inode, fence, xattrs);
    }

    /// [`Leases::install_granted`] for a lease granted (or to be granted)
    /// by server `owner`: its trust follows that server's answers.
    pub(crate) fn install_granted_by(
        &self,
        owner: u32,
        mode: Mode,
        inode: Inode,
        fence: u64,
        xattrs: Vec<morris_proto::Xattr>,
    ) {
        let epoch = self.pool.epoch(owner);
        let new_dir = inode.attr.kind == morris_proto::FileKind::Dir;
        let (e, _) = self.install(owner, epoch, mode, inode, fence, false);
        let mut st = e.state.lock();
        if new_dir {
            // A directory we just created is empty and ours alone.
            st.complete = true;
        }
        // A new object has only the attributes it was made with (the ACLs
        // it inherited, as the server keeps them): the kernel's questions
        // before its first write (`security.capability`, its ACL) need no
        // request.
        let mut xattrs = xattrs;
        xattrs.sort_by(|a, b| a.name.cmp(&b.name));
        st.xattrs = Some(std::sync::Arc::new(xattrs));
    }

    fn install(
        &self,
        owner: u32,
        epoch: u64,
        mode: Mode,
        inode: Inode,
        fence: u64,
        recalled: bool,
    ) -> (Arc<LeaseEntry>, Option<Arc<LeaseEntry>>) {
        self.learn(inode.handle());
        let id = inode.id;
        let entry = Arc::new(LeaseEntry {
            id,
            owner,
            mode,
            epoch,
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            fence: AtomicU64::new(fence),
            uses: Arc::new(AsyncRwLock::new(())),
            state: Mutex::new(EntryState {
                inode,
                attr_valid: true,
                dirty: false,
                names: FastMap::default(),
                complete: false,
                listed_upto: None,
                local_writes: 0,
                version: 0,
                xattrs: None,
                kernel_pages: false,
                recalled,
                released: false,
            }),
            gone: tokio::sync::watch::channel(false).0,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            marking: tokio::sync::Mutex::new(()),
            waited: tokio::sync::Notify::new(),
        });
        if mode == Mode::Write {
            if let Some(u) = self.unstored.lock().get(&id).copied() {
                // A lease lost before its changes were stored: they carry over.
                let mut st = entry.state.lock();
                st.inode.attr.size = u.size;
                st.inode.attr.mtime = u.mtime;
                st.inode.attr.ctime = u.ctime;
                u.attrs.apply(&mut st.inode.attr);
                st.dirty = true;
            }
        }
        let old = self.map.lock().insert(id, entry.clone());
        (entry, old)
    }

    /// True while the lease `g` uses may still be trusted (its owner has
    /// answered within the trust limit and has not restarted).
    pub(crate) fn still_valid(&self, g: &LeaseGuard) -> bool {
        self.pool.lease_valid(g.entry.owner, g.entry.epoch)
    }

    /// Marks the cached copy of `id`'s attributes as out of date.
    /// Whether this client knows, under a usable lease on directory `dir`,
    /// that `name` is there (or every name of it, listed whole).
    pub(crate) fn knows_name(&self, dir: FileId, name: &[u8]) -> bool {
        let Some(e) = self.map.lock().get(&dir).cloned() else {
            return false;
        };
        if !self.usable(&e, Mode::Read) {
            return false;
        }
        let st = e.state.lock();
        st.complete || matches!(st.names.get(name), Some(Some(_)))
    }

    pub(crate) fn attr_changed(&self, id: FileId) {
        if let Some(e) = self.map.lock().get(&id) {
            e.state.lock().attr_valid = false;
        }
    }

    /// Takes write leases on several inodes in ascending id order (no deadlock
    /// between clients doing the same). Duplicates are taken once; find a
    /// guard with [`pick`].
    pub(crate) async fn lock_many(self: &Arc<Self>, handles: &[Handle]) -> Result<Vec<LeaseGuard>> {
        let mut hs: Vec<Handle> = handles.to_vec();
        hs.sort_by_key(|h| h.id);
        hs.dedup_by_key(|h| h.id);
        let mut out = Vec::with_capacity(hs.len());
        for h in hs {
            out.push(self.get(h, Mode::Write).await?);
        }
        Ok(out)
    }

    /// Handles a recall pushed by server `from`.
    pub(crate) fn on_recall(self: &Arc<Self>, from: u32, ino: FileId, want: LeaseMode) {
        self.recalls.fetch_add(1, Ordering::Relaxed);
        // Held while looking: an acquire installs its grant under it.
        let inflight = self.inflight.lock();
        let acquiring = inflight.contains_key(&ino);
        *self.recall_seq.lock().entry(ino).or_insert(0) += 1;
        let entry = self.map.lock().get(&ino).cloned();
        // Marked recalled before the lock is let go: an acquire starting
        // now (a read lease's upgrade, say) must wait for this give-back's
        // Release rather than race it to the server (`acquire`).
        if let Some(e) = entry.as_ref().filter(|e| e.owner == from) {
            e.state.lock().recalled = true;
        }
        drop(inflight);
        debug!(ino, server = from, ?want, acquiring, "recall");
        let Some(entry) = entry else {
            // Not cached. If no acquire of it is in flight, the server still
            // counts a lease we gave up locally (e.g. it expired on our side
            // first): give it back now rather than make the other client wait.
            if !acquiring {
                let me = self.clone();
                tokio::spawn(async move {
                    // Not while an acquire of it is on its way (the server
                    // might grant that first and then take it back for this
                    // Release); and not at all once one has been granted.
                    let _serial = me.acquiring[(ino as usize) % ACQUIRE_SHARDS].lock().await;
                    if me.map.lock().contains_key(&ino) {
                        return;
                    }
                    let _ = me
                        .pool
                        .call(from, Request::Release { ino }, Bytes::new())
                        .await;
                });
            }
            return;
        };
        if entry.owner != from {
            return;
        }
        // With an acquire on its way, the cached entry is a read lease being
        // upgraded: the server dropped it when the AcquireWrite arrived, and
        // the recall is for it or for the grant on its way (which
        // `recall_seq` marks as recalled at once). A Release for the old
        // entry could reach the server after the new grant and give *that*
        // back while this client still relies on it; so none is sent.
        let release = !acquiring;
        let me = self.clone();
        tokio::spawn(async move { me.give_back(entry, release).await });
    }

    async fn process_recall(self: Arc<Self>, entry: Arc<LeaseEntry>) {
        self.give_back(entry, true).await
    }

    /// Stops using a recalled lease, writes back, records open files,
    /// drops caches, and (if `release`) tells the server.
    async fn give_back(self: Arc<Self>, entry: Arc<LeaseEntry>, release: bool) {
        let uses = entry.uses.clone();
        let _all = crate::slow::watch(
            || {
                format!(
                    "this client's uses of {} before giving its lease back",
                    entry.id
                )
            },
            uses.write(),
        )
        .await;
        if entry.state.lock().released {
            entry.gone.send_replace(true);
            return;
        }
        // Gathered writes first: the size stored next covers them.
        let drain = self.drain.read().clone();
        if let (Some(d), Mode::Write) = (drain, entry.mode) {
            if let Err(e) = d.drain(&entry).await {
                warn!(ino = entry.id, error = %e, "could not send gathered writes on recall");
            }
        }
        if let Err(e) = self.write_back(&entry).await {
            warn!(ino = entry.id, error = %e, "could not write back inode on recall");
        }
        // Whoever recalled it may remove its last name: an open file must
        // outlive that, so the owner learns it is open here first.
        if self.opens.want_record(entry.id) {
            if let Err(e) = self.opens.reconcile(entry.id).await {
                warn!(ino = entry.id, error = %e, "could not record an open file at its owner");
            }
        }
        // Nothing may use it from here on; but it stays in the map, marked
        // recalled, until the Release is answered: a new acquire of the
        // inode waits for that (`wait_gone`). The server runs the requests
        // of a connection concurrently, so an AcquireWrite sent while the
        // Release is on its way could be granted first (as a lease already
        // held) and then given back by the Release — leaving this client
        // sure of a write lease that another client is granted too.
        entry.state.lock().released = true;
        let named = self.drop_caches(&entry);
        // The kernel's copies first: once the server hears Release, another
        // client's change may complete, and a stat here must not then find
        // the old name or attributes in the kernel's caches.
        if let Some(inv) = self.invalidator() {
            // Not while a request of this client waits for this lease: it
            // may hold the kernel lock an invalidation needs, and is itself
            // answered afresh once the lease is back at the server.
            let arrived = entry.waited.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let flushed = entry.waiting.load(Ordering::SeqCst) == 0
                && tokio::select! {
                    done = inv.flush(INVALIDATION_WAIT) => done,
                    () = &mut arrived => false,
                };
            // Names whose invalidation is still on its way: every name the
            // kernel keeps goes at once instead (it needs no lock).
            if !flushed && named {
                inv.all_names();
            }
        }
        if release {
            // One try, bounded: an owner that is down or cut off needs no
            // Release (the lease expires there), and waiting out its
            // reconnect window would hold up an unmount by two lease times.
            let call = self.pool.call_once(
                entry.owner,
                Request::Release { ino: entry.id },
                Bytes::new(),
                None,
            );
            match tokio::time::timeout(self.pool.lease() / 2, call).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    debug!(ino = entry.id, error = %e, "release failed; the lease will expire")
                }
                Err(_) => debug!(ino = entry.id, "release unanswered; the lease will expire"),
            }
        }
        self.discard(&entry);
        entry.gone.send_replace(true);
    }

    /// Holds the per-inode store lock: one attribute store of `id` at a time.
    pub(crate) async fn store_lock(&self, id: FileId) -> tokio::sync::MutexGuard<'_, ()> {
        self.storing[(id as usize) % ACQUIRE_SHARDS].lock().await
    }

    /// Stores a dirty inode's size and times at its owner (and, for a file
    /// with holes, how much of it is on disk now: its data is stored first).
    pub(crate) async fn write_back(&self, entry: &LeaseEntry) -> Result<()> {
        let _one_at_a_time = self.store_lock(entry.id).await;
        let (h, mut set, seq, measure) = {
            let st = entry.state.lock();
            if !st.dirty || entry.mode != Mode::Write {
                return Ok(());
            }
            let mut set = SetAttr {
                size: Some(st.inode.attr.size),
                mtime: Some(st.inode.attr.mtime),
                ctime: Some(st.inode.attr.ctime),
                ..SetAttr::default()
            };
            self.pending_attrs(entry.id).fill(&mut set);
            // (A file cached from a home counts as its size: its blocks
            // here are whatever was fetched.)
            let measure =
                (st.inode.alloc.is_some() && st.inode.attr.size > 0 && st.inode.home.is_none())
                    .then(|| st.inode.stale.clone());
            (st.inode.handle(), set, self.unstored_seq(entry.id), measure)
        };
        if let Some(stale) = measure {
            set.alloc = self.measure(entry.id, &stale).await;
        }
        // To whoever serves the inode's range now: after a takeover that
        // is the copy, not the server that granted the lease.
        let range = self.layout.inode_server(entry.id);
        let (_, reply, _) = self
            .pool
            .call_range(range, Request::SetAttr { ino: h, set }, Bytes::new())
            .await?;
        let Reply::Inode(inode) = reply else {
            return Err(unexpected(&reply));
        };
        self.stored(entry, inode, seq);
        Ok(())
    }

    /// Bytes file `id`'s data takes on the servers' disks: one copy of
    /// each block, each server's first copy or, where that one is recorded
    /// stale (`stale`) or its server does not answer, the next. `None` if
    /// some server's blocks had no copy that answered (the last measure is
    /// then kept).
    pub(crate) async fn measure(
        &self,
        id: FileId,
        stale: &[morris_proto::StaleCopy],
    ) -> Option<u64> {
        let l = self.layout;
        let k = l.servers.max(1);
        let limit = self.pool.lease() / 2;
        let asks = (0..k).map(|primary| async move {
            for r in 0..l.replicas.max(1) {
                let s = (primary + r) % k;
                if stale.iter().any(|rec| rec.server == s) || self.pool.recently_down(s) {
                    continue;
                }
                let req = Request::Allocated {
                    id,
                    replica: r as u8,
                };
                match tokio::time::timeout(limit, self.pool.call(s, req, Bytes::new())).await {
                    Ok(Ok((Reply::Allocated(bytes), _))) => return Some(bytes),
                    Ok(Ok((other, _))) => {
                        debug!(server = s, reply = ?other, "unexpected answer to Allocated")
                    }
                    Ok(Err(e)) => debug!(server = s, error = %e, "Allocated: trying another copy"),
                    Err(_) => debug!(server = s, "Allocated: no answer, trying another copy"),
                }
            }
            None
        });
        let mut total = 0u64;
        for bytes in futures::future::join_all(asks).await {
            total = total.saturating_add(bytes?);
        }
        Some(total)
    }

    /// Stops trusting `entry` (it was taken as granted by another server
    /// than the one that granted it): the next use takes the lease again
    /// from whoever serves the inode.
    pub(crate) fn distrust(&self, entry: &Arc<LeaseEntry>) {
        self.discard(entry);
    }

    /// Removes an entry and tells the front end to drop what it cached under it.
    fn discard(&self, entry: &Arc<LeaseEntry>) {
        {
            let mut map = self.map.lock();
            if map.get(&entry.id).is_some_and(|e| Arc::ptr_eq(e, entry)) {
                map.remove(&entry.id);
            }
        }
        let recalled = {
            let mut st = entry.state.lock();
            st.released = true;
            st.recalled
        };
        if !recalled {
            entry.gone.send_replace(true);
        }
        // Given up without a recall (expired, its server restarted): no
        // one waits for the invalidations, so names go all at once.
        if self.drop_caches(entry) {
            if let Some(inv) = self.invalidator() {
                inv.all_names();
            }
        }
    }

    /// Tells the front end to drop what it cached under `entry`; whether
    /// that included names.
    fn drop_caches(&self, entry: &LeaseEntry) -> bool {
        let names: Vec<Vec<u8>> = {
            let mut st = entry.state.lock();
            st.names.drain().map(|(k, _)| k).collect()
        };
        let named = !names.is_empty();
        if let Some(inv) = self.invalidator() {
            inv.inode(entry.id);
            for n in names {
                inv.entry(entry.id, &n);
            }
        }
        named
    }

    /// Drops every lease this client can no longer trust (its server has not
    /// answered for a lease time: a partition, or this process was paused),
    /// telling the front end to drop what it cached under them. The server
    /// may have given them to others meanwhile without reaching us.
    pub(crate) fn expire_stale(&self) {
        let stale: Vec<Arc<LeaseEntry>> = self
            .map
            .lock()
            .values()
            .filter(|e| !self.pool.lease_valid(e.owner, e.epoch))
            .cloned()
            .collect();
        for e in stale {
            debug!(
                ino = e.id,
                server = e.owner,
                "lease expired here; dropping its caches"
            );
            self.discard(&e);
            self.record_if_open(e.id);
        }
    }

    /// After a lease was lost without a recall: if the file is open here,
    /// records that at its owner, so that it is kept while open.
    fn record_if_open(&self, id: FileId) {
        if self.opens.want_record(id) {
            let opens = self.opens.clone();
            tokio::spawn(async move {
                if let Err(e) = opens.reconcile(id).await {
                    warn!(ino = id, error = %e, "could not record an open file at its owner");
                }
            });
        }
    }

    /// Drops every lease granted by server `i` (it restarted).
    pub(crate) fn drop_server(&self, i: u32) {
        let victims: Vec<Arc<LeaseEntry>> = self
            .map
            .lock()
            .values()
            .filter(|e| e.owner == i)
            .cloned()
            .collect();
        for e in victims {
            self.discard(&e);
            self.record_if_open(e.id);
        }
    }

    /// Gives back the least recently granted unused leases above the cap.
    fn maybe_evict(self: &Arc<Self>) {
        let excess = {
            // Chosen and marked under the lock acquires register under: an
            // entry being upgraded is not given back (its Release could
            // reach the server after the new grant and give that back).
            let inflight = self.inflight.lock();
            let map = self.map.lock();
            if map.len() <= self.max_cached {
                return;
            }
            let mut v: Vec<Arc<LeaseEntry>> = map
                .values()
                .filter(|e| !inflight.contains_key(&e.id) && !e.state.lock().dirty)
                .cloned()
                .collect();
            v.sort_by_key(|e| e.generation);
            v.truncate(map.len() - self.max_cached + self.max_cached / 8);
            for e in &v {
                e.state.lock().recalled = true;
            }
            v
        };
        for e in excess {
            let me = self.clone();
            tokio::spawn(async move { me.process_recall(e).await });
        }
    }

    /// Writes back every dirty inode and releases every lease.
    pub(crate) async fn release_all(self: &Arc<Self>) {
        use futures::StreamExt;
        let all: Vec<Arc<LeaseEntry>> = self.map.lock().values().cloned().collect();
        // A bounded number at once: each Release waits a bounded time for
        // its answer, and a hundred thousand sent together would wait
        // behind one another past it, leaving their leases to expire at
        // the servers (and whoever wants them next to wait that long).
        futures::stream::iter(all)
            .for_each_concurrent(RELEASES_AT_ONCE, |e| {
                let me = self.clone();
                e.state.lock().recalled = true;
                async move { me.process_recall(e).await }
            })
            .await;
    }

    /// Every dirty entry (for syncfs-like flushes).
    pub(crate) fn dirty_entries(&self) -> Vec<Arc<LeaseEntry>> {
        self.map
            .lock()
            .values()
            .filter(|e| e.state.lock().dirty)
            .cloned()
            .collect()
    }
}

/// One acquire of `id` fewer in flight.
fn out_of_flight(inflight: &mut HashMap<FileId, usize>, id: FileId) {
    if let Some(n) = inflight.get_mut(&id) {
        *n -= 1;
        if *n == 0 {
            inflight.remove(&id);
        }
    }
}

#[path = "leases_many.rs"]
mod many;

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
