//! Cache mode in the client: what a mount does in a directory bound to a
//! home (docs/architecture.md, "Cache mode"). The client never talks to
//! home; it asks the servers, which fetch:
//!
//! * before looking a name up in a cached directory that is not listed
//!   whole, `HomeLookup` at the directory's owner (which asks home if it
//!   lacks the name); the first page of a listing of one not listed whole
//!   has the owner list it from home first (its pages then wait at the
//!   owner for the names still to come);
//! * a name whose object has no inode yet (a placeholder) is made real
//!   from its seed the first time it is looked up: `AcquireCached` at the
//!   object's owner makes the inode and takes its read lease in one
//!   request (the seed comes with `HomeLookup`, or for a name known from
//!   a listing with the seeds of the names listed with it, `Seeds` at the
//!   directory's owner, kept for the lookups that follow);
//! * after the binding's validity lag, the first lookup, `getattr`, `open`
//!   or listing of a cached object sends `Revalidate` to its owner, which
//!   compares it with home and, if home changed it, recalls every lease on
//!   it (so this client and every other drop what they cached);
//! * reads of a cached file go out as `ReadCached` (`io.rs`).
//!
//! None of these requests is sent while holding a lease guard: a change
//! found at home recalls the leases of every client, this one included.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use morris_proto::home::{is_cache_id, Binding, CacheMode, HomeLink, HomeRef, OnDisconnect};
use morris_proto::messages::SEED_BLOCK;
use morris_proto::{DirEntry, ErrorCode, FileId, Handle, Inode, Reply, Request};

use crate::leases::{FastMap, Mode};
use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// What this client knows of bindings and validations.
#[derive(Default)]
pub(crate) struct CacheView {
    /// Bindings' settings, by bound directory, and when they were read.
    specs: parking_lot::Mutex<HashMap<FileId, (Binding, Instant)>>,
    /// `--on-disconnect block` bindings every server was told of by this
    /// client (each server then refuses a change while home is down).
    told: parking_lot::Mutex<std::collections::HashSet<FileId>>,
    /// When this client last had each cached object compared with home.
    validated: parking_lot::Mutex<HashMap<FileId, Instant>>,
    /// Seeds of placeholders this client is about to look up (from
    /// `HomeLookup`, `Seed` or `Seeds`), by object id: the lookup's lease
    /// is taken with `AcquireCached`, which makes the inode if it is not
    /// made yet.
    seeds: parking_lot::Mutex<FastMap<FileId, KeptSeed>>,
    /// Blocks of seeds being fetched: (directory, first cookie).
    seeds_asked: parking_lot::Mutex<std::collections::HashSet<(FileId, u64)>>,
}

/// A seed kept for a lookup: with the directory it came from and that
/// directory's content version then. A directory found changed at home
/// gets a new version and new seeds; the old ones are not used (making an
/// object from one could put back what home replaced).
struct KeptSeed {
    seed: Inode,
    dir: FileId,
    version: u32,
}

impl CacheView {
    /// Keeps `seed` (an entry of `dir` at content version `version`) for
    /// the next lookup of its object.
    pub(crate) fn keep_seed(&self, seed: Inode, dir: FileId, version: u32) {
        let mut s = self.seeds.lock();
        if s.len() >= SEEDS_KEEP {
            s.clear();
        }
        s.insert(seed.id, KeptSeed { seed, dir, version });
    }

    /// The seed kept for `h` (same generation) from `dir` at `version`.
    pub(crate) fn take_seed(&self, h: Handle, dir: FileId, version: u32) -> Option<Inode> {
        let mut s = self.seeds.lock();
        if s.is_empty() {
            return None;
        }
        s.remove(&h.id)
            .filter(|k| k.seed.gen == h.gen && k.dir == dir && k.version == version)
            .map(|k| k.seed)
    }
}

/// What a cached read or fetch of file `i` (linked by `link`) names.
pub(crate) fn home_ref(i: &Inode, link: &HomeLink) -> HomeRef {
    HomeRef {
        binding: link.binding,
        handle: link.handle.clone(),
        gen: i.gen,
        version: link.version,
        size: i.attr.size,
    }
}

/// How long a binding's settings are used before they are read again (a
/// directory unbound and bound again elsewhere by another client).
const SPEC_FOR: Duration = Duration::from_secs(30);

/// Most validation times kept before the old ones are dropped.
const VALIDATED_KEEP: usize = 100_000;

/// Most seeds kept for lookups under way (a seed not used is only a lost
/// shortcut: the lookup then asks for it again).
const SEEDS_KEEP: usize = 65_536;

impl Client {
    /// The settings of the binding rooted at `binding` (read once from the
    /// bound directory's inode).
    pub(crate) async fn binding_spec(&self, binding: FileId) -> Result<Binding> {
        if let Some((b, at)) = self.cache.specs.lock().get(&binding) {
            if at.elapsed() < SPEC_FOR {
                return Ok(b.clone());
            }
        }
        // Under a lease the bound directory's copy is current: a binding
        // is made or removed under the directory's write lease.
        let i = match self.leases.current_inode(binding) {
            Some(i) if i.home.as_ref().is_some_and(|l| l.bound.is_some()) => i,
            _ => {
                let r = self
                    .call_owner(binding, Request::GetInode { ino: binding })
                    .await?;
                let Reply::Inode(i) = r else {
                    return Err(unexpected(&r));
                };
                i
            }
        };
        let spec = i.home.and_then(|l| l.bound).ok_or_else(|| {
            Error::new(ErrorCode::Io, format!("{binding} is not bound to a home"))
        })?;
        self.cache
            .specs
            .lock()
            .insert(binding, (spec.clone(), Instant::now()));
        Ok(spec)
    }

    /// Tells every server the settings of binding `binding`.
    async fn open_home_everywhere(&self, binding: FileId) -> Result<()> {
        let spec = self.binding_spec(binding).await?;
        let calls = (0..self.layout.servers).map(|s| {
            self.pool.call(
                s,
                Request::OpenHome {
                    binding,
                    spec: spec.clone(),
                },
                Bytes::new(),
            )
        });
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(_) => {}
                // A server that is down learns it when it is asked again.
                Err(e) if e.code == ErrorCode::Unavailable => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Runs `call` (a request naming binding `binding`); if a server has
    /// not heard of the binding, tells every server and runs it again.
    pub(crate) async fn with_binding<T, F, Fut>(&self, binding: FileId, call: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        for _ in 0..3 {
            match call().await {
                Err(e) if e.code == ErrorCode::UnknownBinding => {
                    self.open_home_everywhere(binding).await?;
                }
                other => return other,
            }
        }
        call().await
    }

    /// Refuses a change to `i` if it lies in a read-only cache (`ro`).
    pub(crate) async fn check_change(&self, i: &Inode) -> Result<()> {
        let Some(l) = &i.home else {
            return Ok(());
        };
        let spec = self.binding_spec(l.binding).await?;
        if spec.writable() {
            if spec.on_disconnect == OnDisconnect::Block && self.cache.told.lock().insert(l.binding)
            {
                if let Err(e) = self.open_home_everywhere(l.binding).await {
                    self.cache.told.lock().remove(&l.binding);
                    return Err(e);
                }
            }
            Ok(())
        } else {
            Err(Error::new(
                ErrorCode::ReadOnly,
                format!("{} lies in a read-only cache of a home", i.id),
            ))
        }
    }

    /// Before file `id` is opened for writing or truncated: if it was
    /// fetched from home into a writable cache, every server fetches the
    /// units of it that it lacks and keeps them as the cache's own
    /// (`Localize`), then its owner detaches it from home's data
    /// (`Detach`): from then on it is written and read as a file of the
    /// volume, and the write-back pushes it back to the same home file.
    /// Called without a lease on `id` held (the owner recalls them). If
    /// `empties` says so of the file as it is (it is emptied next, by a
    /// caller allowed to) nothing is fetched: the servers drop what they
    /// hold of it and the owner empties it.
    pub(crate) async fn make_local(
        &self,
        id: FileId,
        empties: impl FnOnce(&Inode) -> bool,
    ) -> Result<()> {
        if self
            .leases
            .cached_inode(id)
            .is_some_and(|i| i.home.as_ref().is_none_or(|l| l.is_local()))
        {
            // The common case costs nothing: an ordinary file, or one
            // already the cache's own.
            return Ok(());
        }
        let i = self.do_getattr(id).await?;
        let Some(link) = i.home.as_deref().filter(|l| !l.is_local()) else {
            return Ok(());
        };
        if i.attr.kind != morris_proto::FileKind::File
            || !self.binding_spec(link.binding).await?.writable()
        {
            return Ok(());
        }
        let truncate = empties(&i);
        let home = home_ref(&i, link);
        let calls = (0..self.layout.servers).map(|s| {
            let home = home.clone();
            async move {
                self.with_binding(link.binding, || {
                    let home = home.clone();
                    async move {
                        self.pool
                            .call(s, Request::Localize { id, home, truncate }, Bytes::new())
                            .await
                            .map(|(r, _)| r)
                    }
                })
                .await
            }
        });
        for r in futures::future::join_all(calls).await {
            // Home no longer has it: this object is stale (a kernel looks
            // its name up again; an `open(O_CREAT)` then makes it anew).
            r.map_err(|e| match e.code {
                ErrorCode::NotFound => Error::new(ErrorCode::Stale, e.message),
                _ => e,
            })?;
        }
        let r = self
            .call_owner(
                id,
                Request::Detach {
                    ino: i.handle(),
                    truncate,
                },
            )
            .await?;
        let Reply::Inode(_) = r else {
            return Err(unexpected(&r));
        };
        self.leases.attr_changed(id);
        tracing::debug!(id, "fetched file detached from home to be written");
        Ok(())
    }

    /// Before the names of cached directory `dir` of a writable binding
    /// change: has every name home has listed into it first. The
    /// write-back makes home's directory list what the cache's lists, so
    /// the cache must know all of home's names (or the names it never
    /// fetched would be removed at home), and a name removed here must not
    /// be fetched from home again before the write-back removes it there.
    pub(crate) async fn ensure_listed(&self, dir: FileId) -> Result<()> {
        if self
            .leases
            .cached_inode(dir)
            .is_some_and(|i| i.home.as_ref().is_none_or(|l| l.listed || l.is_local()))
        {
            // An ordinary directory (or one listed whole) whose lease is
            // held: no request.
            return Ok(());
        }
        let (_, Some(link)) = self.cached_link(dir).await? else {
            return Ok(());
        };
        if link.listed || !self.binding_spec(link.binding).await?.writable() {
            return Ok(());
        }
        let mut cookie = 0;
        loop {
            let (entries, eof) = self.do_readdir(dir, cookie, 4096).await?;
            match entries.last() {
                Some(e) if !eof => cookie = e.cookie,
                _ => return Ok(()),
            }
        }
    }

    /// Whether cached object `i`, if its data is home's, may be moved in
    /// the cache: its home's handles survive a rename there (an NFS
    /// home's do; a local directory's are paths).
    pub(crate) async fn moves_at_home(&self, i: &Inode) -> Result<bool> {
        match i.home.as_deref() {
            Some(l) if !l.is_local() => Ok(self
                .binding_spec(l.binding)
                .await?
                .url
                .starts_with("nfs://")),
            _ => Ok(true),
        }
    }

    /// Before object `i`, fetched from home, leaves its name `name` in
    /// directory `dir`: its owner records that home has it there (unless
    /// an earlier move not pushed yet did), so that the write-back moves
    /// it at home rather than take its new name for a new object.
    pub(crate) async fn place_before_move(
        &self,
        i: &Inode,
        dir: FileId,
        name: &[u8],
    ) -> Result<()> {
        let Some(l) = i.home.as_deref() else {
            return Ok(());
        };
        if !is_cache_id(i.id) {
            // Made in the cache: the write-back's records say where.
            return Ok(());
        }
        let req = Request::WbPlace {
            binding: l.binding,
            home: morris_proto::WbHome {
                id: i.id,
                dir,
                name: name.to_vec(),
                fileid: l.fileid,
                handle: l.handle.clone(),
            },
        };
        match self.call_owner(i.id, req).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Whether this client should compare cached object `id` with home now.
    async fn due(&self, id: FileId, link: &HomeLink) -> Result<bool> {
        let spec = self.binding_spec(link.binding).await?;
        if (spec.writable() && spec.mode != CacheMode::Iw) || link.is_local() {
            // Home changes only through this cache (`sw`, `lu`); an object
            // made or written here is the cache's until it is pushed.
            return Ok(false);
        }
        let validity = Duration::from_millis(spec.validity_ms);
        Ok(match self.cache.validated.lock().get(&id) {
            Some(t) => validity.is_zero() || t.elapsed() >= validity,
            None => !link.fresh(spec.validity_ms),
        })
    }

    /// Has the owner compare `h` (cached under `link`) with home if the
    /// validity lag has passed for this client.
    async fn revalidate_if_due(&self, h: Handle, link: &HomeLink) -> Result<()> {
        if !self.due(h.id, link).await? {
            return Ok(());
        }
        let started = Instant::now();
        let r = self
            .with_binding(link.binding, || {
                self.call_owner(h.id, Request::Revalidate { ino: h })
            })
            .await?;
        let Reply::Inode(now) = r else {
            return Err(unexpected(&r));
        };
        if now.home.as_ref().map(|l| l.version) != Some(link.version) {
            // Changed at home: the owner recalled every lease on it (ours
            // too); what we cached of it is gone. Our cached inode may
            // still be the old one for a moment: drop it.
            self.leases.attr_changed(h.id);
        }
        let mut v = self.cache.validated.lock();
        if v.len() >= VALIDATED_KEEP {
            v.clear();
        }
        v.insert(h.id, started);
        Ok(())
    }

    /// The inode of `id` under a read lease, and its home link if cached.
    /// An ordinary object costs no request when its lease is cached: a
    /// binding or a home link never appears or changes without a recall.
    /// A cached one is refetched if the server changed it behind our copy
    /// (its `listed` flag).
    async fn cached_link(&self, id: FileId) -> Result<(Handle, Option<HomeLink>)> {
        let h = self.leases.handle(id)?;
        let g = self.leases.get(h, Mode::Read).await?;
        let mut i = g.inode();
        if i.home.as_ref().is_some_and(|l| !l.is_local()) {
            i = self.fresh(&g).await?;
        }
        Ok((i.handle(), i.home.map(|l| *l).filter(|l| !l.is_local())))
    }

    /// Cache work before a front end's lookup of `name` in `dir`: the
    /// directory revalidated if due, the name fetched from home if the
    /// directory is cached, not listed whole and does not know it.
    pub(crate) async fn before_lookup(&self, dir: FileId, name: &[u8]) -> Result<()> {
        let (h, Some(link)) = self.cached_link(dir).await? else {
            return Ok(());
        };
        self.revalidate_if_due(h, &link).await?;
        let (h, Some(link)) = self.cached_link(dir).await? else {
            return Ok(());
        };
        if link.listed || self.leases.knows_name(dir, name) {
            return Ok(());
        }
        let held = self.leases.held_entry(dir);
        let r = self
            .with_binding(link.binding, || {
                self.call_owner(
                    dir,
                    Request::HomeLookup {
                        dir: h,
                        name: name.to_vec(),
                    },
                )
            })
            .await?;
        let Reply::HomeEntry { entry, seed } = r else {
            return Err(unexpected(&r));
        };
        // The answer is the lookup's (the lookup that follows needs no
        // request), and the seed lets it take the object's lease and make
        // its inode in one request.
        if let (Some(e), Some(seed)) = (&entry, seed) {
            if seed.handle() == e.child {
                self.cache.keep_seed(seed, dir, link.version);
            }
        }
        if let Some(before) = held {
            self.leases.note_name(&before, name, entry);
        }
        Ok(())
    }

    /// The seed `dir` keeps for its entry `name`, if it is one of the
    /// object at `child`'s id (`child` a cached object's id).
    pub(crate) async fn seed_of(
        &self,
        dir: FileId,
        name: &[u8],
        child: Handle,
    ) -> Result<Option<Inode>> {
        if !is_cache_id(child.id) {
            return Ok(None);
        }
        let dh = self.leases.handle(dir)?;
        let r = self
            .call_owner(
                dir,
                Request::Seed {
                    dir: dh,
                    name: name.to_vec(),
                },
            )
            .await;
        match r {
            Ok(Reply::Inode(seed)) => Ok((seed.id == child.id).then_some(seed)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) if e.code == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The seed of entry `e` of `dir` (at content version `version`), if it
    /// names a placeholder: read with the seeds of the names listed beside
    /// it (one `Seeds` for up to [`SEED_BLOCK`] names), which are kept for
    /// their lookups, so that a program stat'ing a listed directory name
    /// by name sends one request per name (`AcquireCached`), not three.
    pub(crate) async fn seed_near(
        &self,
        dir: FileId,
        version: u32,
        e: &DirEntry,
    ) -> Result<Option<Inode>> {
        if !is_cache_id(e.child.id) {
            return Ok(None);
        }
        // Another lookup reading this block, or no block to read: ask for
        // this one alone.
        let seeds = match self.seeds_block_once(dir, e.cookie).await {
            Some(Ok(seeds)) => seeds,
            Some(Err(err)) => {
                tracing::debug!(dir, error = %err, "seeds not read; this one by name");
                return self.seed_of(dir, &e.name, e.child).await;
            }
            None => return self.seed_of(dir, &e.name, e.child).await,
        };
        self.make_cached_behind(&seeds);
        let mut mine = None;
        for s in seeds {
            if s.id == e.child.id && mine.is_none() {
                mine = Some(s);
            } else {
                self.cache.keep_seed(s, dir, version);
            }
        }
        match mine {
            Some(s) => Ok(Some(s)),
            // Stored apart from its block (fetched by name): by name.
            None => self.seed_of(dir, &e.name, e.child).await,
        }
    }

    /// Keeps the seeds of the placeholders among `entries` of `dir` (at
    /// content version `version`) that this client holds nothing of, for
    /// their lookups: one `Seeds` per block of names they are in.
    pub(crate) async fn keep_seeds_of(&self, dir: FileId, version: u32, entries: &[DirEntry]) {
        let blocks: std::collections::BTreeMap<u64, u64> = entries
            .iter()
            .filter(|e| {
                is_cache_id(e.child.id)
                    && e.cookie != 0
                    && self.leases.cached_inode(e.child.id).is_none()
            })
            .map(|e| (e.cookie - e.cookie % SEED_BLOCK, e.cookie))
            .collect();
        for cookie in blocks.into_values() {
            match self.seeds_block_once(dir, cookie).await {
                Some(Ok(seeds)) => {
                    for s in seeds {
                        self.cache.keep_seed(s, dir, version);
                    }
                }
                // Only a shortcut lost: each lookup asks for its own.
                Some(Err(err)) => tracing::debug!(dir, error = %err, "seeds not read"),
                None => {}
            }
        }
    }

    /// Has the owners of `seeds` make their objects (those not made yet)
    /// in the background, one request per owner: a program that looks up
    /// one placeholder of a listing is likely to look up the names listed
    /// with it, and each lookup then takes a lease on an existing object
    /// instead of writing one. Failures only lose the shortcut.
    fn make_cached_behind(&self, seeds: &[Inode]) {
        let mut by_owner: std::collections::BTreeMap<u32, Vec<Inode>> = Default::default();
        for s in seeds {
            if self.leases.cached_inode(s.id).is_none() {
                by_owner
                    .entry(self.layout.inode_server(s.id))
                    .or_default()
                    .push(s.clone());
            }
        }
        for (range, seeds) in by_owner {
            let pool = self.pool.clone();
            tokio::spawn(async move {
                let n = seeds.len();
                let req = Request::CreateCachedMany { seeds };
                if let Err(e) = pool.call_range(range, req, Bytes::new()).await {
                    tracing::debug!(range, seeds = n, error = %e, "placeholders not made ahead");
                }
            });
        }
    }

    /// [`Client::fetch_seeds`], unless this client is reading that block
    /// already or `cookie` is 0 (`None`: the caller asks for its own seed).
    pub(crate) async fn seeds_block_once(
        &self,
        dir: FileId,
        cookie: u64,
    ) -> Option<Result<Vec<Inode>>> {
        let block = cookie - cookie % SEED_BLOCK;
        if cookie == 0 || !self.cache.seeds_asked.lock().insert((dir, block)) {
            return None;
        }
        let r = self.fetch_seeds(dir, cookie).await;
        self.cache.seeds_asked.lock().remove(&(dir, block));
        Some(r)
    }

    /// `Seeds` of the block of `dir`'s cookies holding `cookie`.
    async fn fetch_seeds(&self, dir: FileId, cookie: u64) -> Result<Vec<Inode>> {
        let dh = self.leases.handle(dir)?;
        match self
            .call_owner(dir, Request::Seeds { dir: dh, cookie })
            .await?
        {
            Reply::Inodes(v) => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// How long what this client has of cached object `i` may still go
    /// without being compared with home ([`Duration::MAX`]: for good — not
    /// from home, or a binding whose home changes only through this cache;
    /// zero when unknown). Front ends keep names no longer than that.
    pub(crate) fn unchecked_left(&self, i: &Inode) -> Duration {
        self.unchecked_left_of(i.id, i.home.as_deref())
    }

    /// [`Client::unchecked_left`] of object `id`, linked by `link`.
    pub(crate) fn unchecked_left_of(&self, id: FileId, link: Option<&HomeLink>) -> Duration {
        let Some(link) = link.filter(|l| !l.is_local()) else {
            return Duration::MAX;
        };
        let Some(spec) = self
            .cache
            .specs
            .lock()
            .get(&link.binding)
            .filter(|(_, at)| at.elapsed() < SPEC_FOR)
            .map(|(b, _)| b.clone())
        else {
            return Duration::ZERO;
        };
        if spec.writable() && spec.mode != CacheMode::Iw {
            return Duration::MAX;
        }
        let validity = Duration::from_millis(spec.validity_ms);
        if let Some(t) = self.cache.validated.lock().get(&id) {
            return validity.saturating_sub(t.elapsed());
        }
        let age =
            Duration::from_millis(morris_proto::home::wall_ms().saturating_sub(link.checked_ms));
        validity.saturating_sub(age)
    }

    /// Cache work after a lookup or `getattr` found `i`: revalidated if
    /// due; returns the inode as it is now.
    pub(crate) async fn after_find(&self, i: Inode) -> Result<Inode> {
        let Some(link) = i.home.as_deref().filter(|l| !l.is_local()) else {
            return Ok(i);
        };
        if !self.due(i.id, link).await? {
            return Ok(i);
        }
        let version = link.version;
        self.revalidate_if_due(i.handle(), &link.clone()).await?;
        let now = self.do_getattr(i.id).await?;
        if now.home.as_ref().map(|l| l.version) != Some(version) {
            tracing::debug!(id = i.id, "changed at home");
        }
        Ok(now)
    }

    /// Cache work before listing `dir` from its start: revalidated if due.
    /// (A directory not listed whole yet is listed from home by its owner
    /// when the listing's first page is asked for.)
    pub(crate) async fn before_list(&self, dir: FileId) -> Result<()> {
        let (h, Some(link)) = self.cached_link(dir).await? else {
            return Ok(());
        };
        self.revalidate_if_due(h, &link).await
    }

    /// Creates the inode of placeholder `dir/name` (naming `child`) from
    /// its seed, if `child` is a cached object's id; `false` if it is not.
    pub(crate) async fn materialize(
        &self,
        dir: FileId,
        name: &[u8],
        child: Handle,
    ) -> Result<bool> {
        let Some(seed) = self.seed_of(dir, name, child).await? else {
            return Ok(false);
        };
        self.make_cached(seed).await?;
        Ok(true)
    }

    /// Creates a cached object's inode from `seed` at its owner (an object
    /// of another generation at that id is replaced there, its leases
    /// recalled).
    pub(crate) async fn make_cached(&self, seed: Inode) -> Result<()> {
        let r = self
            .call_owner(seed.id, Request::CreateCached { inode: seed })
            .await?;
        let Reply::Inode(i) = r else {
            return Err(unexpected(&r));
        };
        self.leases.learn(i.handle());
        Ok(())
    }

    /// Has the servers fetch every unit of cached file `id` that they do
    /// not hold (`morris cache prefetch`), `parallel` at a time; returns
    /// the bytes fetched from home.
    pub async fn prefetch(&self, id: FileId, parallel: usize) -> Result<u64> {
        let i = self.getattr(id).await?;
        let Some(link) = i.home.as_deref().filter(|l| !l.is_local()) else {
            return Err(Error::new(ErrorCode::Invalid, "not a cached file"));
        };
        if i.attr.kind != morris_proto::FileKind::File || i.attr.size == 0 {
            return Ok(0);
        }
        let home = home_ref(&i, link);
        let last = self.layout.block_of(i.attr.size - 1).0;
        let stale = i.stale.clone();
        let one = |index: u64| {
            let home = home.clone();
            let stale = stale.clone();
            async move {
                let copies = crate::replicas::current_copies(&self.layout, &stale, id, index);
                let mut last_err = None;
                for (r, s) in copies {
                    let req = Request::FetchCached {
                        id,
                        index,
                        replica: r,
                        home: home.clone(),
                    };
                    let out = self
                        .with_binding(home.binding, || {
                            self.pool.call(s, req.clone(), Bytes::new())
                        })
                        .await;
                    match out {
                        Ok((Reply::Fetched { bytes }, _)) => return Ok(bytes),
                        Ok((other, _)) => return Err(unexpected(&other)),
                        Err(e) if e.code == ErrorCode::Unavailable => last_err = Some(e),
                        Err(e) => return Err(e),
                    }
                }
                Err(last_err.unwrap_or_else(|| Error::new(ErrorCode::Io, "no current copy")))
            }
        };
        use futures::stream::{self, StreamExt, TryStreamExt};
        stream::iter(1..=last)
            .map(one)
            .buffer_unordered(parallel.max(1))
            .try_fold(0u64, |acc, b| async move { Ok(acc + b) })
            .await
    }

    /// Frees every server's units of cached file `id` (`morris cache
    /// evict`); returns the bytes freed. Its data reads back from home.
    pub async fn evict(&self, id: FileId) -> Result<u64> {
        let i = self.getattr(id).await?;
        if i.home.as_ref().is_none_or(|l| l.is_local()) {
            return Err(Error::new(ErrorCode::Invalid, "not a cached file"));
        }
        let calls = (0..self.layout.servers)
            .map(|s| self.pool.call(s, Request::Evict { id }, Bytes::new()));
        let mut freed = 0;
        for r in futures::future::join_all(calls).await {
            match r? {
                (Reply::Evicted { bytes }, _) => freed += bytes,
                (other, _) => return Err(unexpected(&other)),
            }
        }
        Ok(freed)
    }

    /// Makes the empty directory `dir` a cache of the home `binding.url`
    /// names (`morris cache bind`).
    pub async fn bind(&self, dir: FileId, binding: Binding) -> Result<Inode> {
        let h = self.leases.handle(dir)?;
        let r = self
            .call_owner(
                dir,
                Request::Bind {
                    dir: h,
                    binding: binding.clone(),
                },
            )
            .await?;
        let Reply::Inode(i) = r else {
            return Err(unexpected(&r));
        };
        self.cache
            .specs
            .lock()
            .insert(dir, (binding, Instant::now()));
        self.open_home_everywhere(dir).await?;
        self.leases.attr_changed(dir);
        Ok(i)
    }

    /// The binding `id` lies under (it is the bound directory, or cached
    /// below one).
    pub async fn binding_of(&self, id: FileId) -> Result<FileId> {
        let i = self.do_getattr(id).await?;
        i.home.as_ref().map(|l| l.binding).ok_or_else(|| {
            Error::new(
                ErrorCode::Invalid,
                format!("{id} lies in no cache of a home"),
            )
        })
    }

    /// Asks binding `binding`'s pusher to push every change made before
    /// now (`morris cache flush`); answers after at most about ten
    /// seconds: whether home has them all, how many objects wait, and the
    /// last push error.
    pub async fn flush_once(&self, binding: FileId) -> Result<(bool, u64, Option<String>)> {
        // Writes gathered here are changes made before now too.
        self.drain_all().await;
        let r = self
            .with_binding(binding, || {
                self.call_owner(binding, Request::Flush { binding })
            })
            .await?;
        match r {
            Reply::Flushed {
                done,
                queued,
                last_error,
            } => Ok((done, queued, last_error)),
            other => Err(unexpected(&other)),
        }
    }

    /// Removes the binding of `dir` and everything cached under it
    /// (`morris cache unbind`): every server forgets the binding's objects
    /// and data, then the directory's owner removes the binding. `dir` is
    /// an ordinary empty directory afterwards. Every server must be up.
    /// Programs with files open under it get `ESTALE`.
    pub async fn unbind(&self, dir: FileId, discard_changes: bool) -> Result<Inode> {
        let i = self.do_getattr(dir).await?;
        let Some(spec) = i.home.as_ref().and_then(|l| l.bound.clone()) else {
            return Err(Error::new(
                ErrorCode::Invalid,
                "the directory is not bound to a home",
            ));
        };
        if spec.pushes() && !discard_changes {
            // Changes not at home yet would be lost with the binding.
            let mut queued = 0;
            for (s, r) in self.cache_status().await {
                let list = r.map_err(|e| {
                    Error::new(
                        e.code,
                        format!("server {s} cannot say what it has not pushed yet ({e})"),
                    )
                })?;
                queued += list
                    .iter()
                    .filter(|b| b.binding == dir)
                    .map(|b| b.queued)
                    .sum::<u64>();
            }
            if queued > 0 {
                return Err(Error::new(
                    ErrorCode::NotEmpty,
                    format!(
                        "{queued} changed objects are not at home yet: run `morris cache flush` first (or unbind with --discard-changes)"
                    ),
                ));
            }
        }
        let calls = (0..self.layout.servers).map(|s| async move {
            (
                s,
                self.pool
                    .call(s, Request::ForgetBinding { binding: dir }, Bytes::new())
                    .await,
            )
        });
        for (s, r) in futures::future::join_all(calls).await {
            if let Err(e) = r {
                return Err(Error::new(
                    e.code,
                    format!("server {s} could not forget the binding ({e}); run unbind again when it is up"),
                ));
            }
        }
        let r = self
            .call_owner(dir, Request::Unbind { dir: i.handle() })
            .await?;
        let Reply::Inode(i) = r else {
            return Err(unexpected(&r));
        };
        self.cache.specs.lock().remove(&dir);
        self.leases.attr_changed(dir);
        Ok(i)
    }

    /// Every server's cache counters (`morris cache status`), by server.
    pub async fn cache_status(&self) -> Vec<(u32, Result<Vec<morris_proto::BindingStatus>>)> {
        let calls = (0..self.layout.servers).map(|s| async move {
            let r = self
                .pool
                .call_once(s, Request::CacheStatus, Bytes::new(), None)
                .await;
            let r = match r {
                Ok((Reply::Cache(v), _)) => Ok(v),
                Ok((other, _)) => Err(unexpected(&other)),
                Err(e) => Err(e),
            };
            (s, r)
        });
        futures::future::join_all(calls).await
    }
}
