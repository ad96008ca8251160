//! Cache mode II's write-back on a stripe server (docs/architecture.md,
//! "Cache mode II"): the server that serves a binding's bound directory
//! pushes the binding's changes home.
//!
//! | step of a round | where | what |
//! |---|---|---|
//! | gather | every server (`WbMarks`, `WbHomes`) | the marks of changed objects, where home has the objects made in the cache |
//! | names | here, directory by directory, parents first | [`crate::writeback::plan`] over the cache's entries and home's listing, its steps run at home |
//! | data | every server holding first copies (`PushData`), at once | each pushes the units of the file it holds, then commits |
//! | attributes | here | mode, owner, times (after the data) |
//! | clear | each object's owner (`WbClear`) | only marks whose change count is as read (a change made meanwhile keeps its mark) |
//!
//! A round runs every second for the marks older than the binding's sync
//! lag, and at once for all of them when `Flush` asks. Everything it does
//! can be done again after a crash: a step compares with home's state
//! first (the planner), marks stay until what they stand for is at home.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use morris_home::{Home, HomeError, HomeHandle, HomeKind, HomeNew, HomeSetAttr, HomeTime};
use morris_proto::home::{wall_ms, Binding, OnDisconnect};
use morris_proto::{
    DirEntry, ErrorCode, FileId, FileKind, Inode, Reply, Request, StaleCopy, WbHome, WbMark,
    WireError,
};
use parking_lot::Mutex;
use tracing::{debug, warn};

use super::cache::{attr_of, stamp_of, Bound};
use super::push_names::Departed;
use super::{err, metadata, Server};
use crate::store::{Formatted, Store};

/// Entries asked per `WbEntries` page, and per home listing page.
pub(super) const PAGE: u32 = 1000;
/// Longest `Flush` waits before it answers "not yet" (at most a lease
/// time).
const FLUSH_WAIT: Duration = Duration::from_secs(10);
/// Objects one round makes or pushes at home at once.
pub(super) const PARALLEL: usize = 16;
/// Units one server writes home at once for one file.
const PUSH_PARALLEL: usize = 4;

/// The write-back's state of one binding at this server.
#[derive(Default)]
pub(crate) struct WbState {
    /// One round at a time.
    round: tokio::sync::Mutex<()>,
    /// Rounds started (the number of the last one).
    started: AtomicU64,
    /// The last round that pushed everything it found (`Flush` waits for
    /// one started after it was asked).
    clean: Mutex<u64>,
    clean_tx: Mutex<Option<tokio::sync::watch::Sender<u64>>>,
    /// Flushes waiting: rounds up to this number push every mark at once.
    flush_upto: AtomicU64,
    /// Objects pushed (names, attributes or data) and data bytes pushed.
    pub(crate) pushed: AtomicU64,
    pub(crate) pushed_bytes: AtomicU64,
    pub(crate) rounds: AtomicU64,
    /// Time spent in rounds that pushed something, ms (`pushed_bytes` /
    /// this = the push rate while pushing).
    pub(crate) push_ms: AtomicU64,
    /// Objects found in a state the pusher cannot push (counted, logged).
    pub(crate) skipped: AtomicU64,
    /// Conflicts resolved (see `conflicts.rs`).
    pub(crate) conflicts: AtomicU64,
    pub(crate) last_error: Mutex<Option<String>>,
}

impl WbState {
    fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut g = self.clean_tx.lock();
        let tx = g.get_or_insert_with(|| tokio::sync::watch::channel(*self.clean.lock()).0);
        tx.subscribe()
    }

    fn finished_clean(&self, round: u64) {
        let mut c = self.clean.lock();
        if round > *c {
            *c = round;
        }
        if let Some(tx) = &*self.clean_tx.lock() {
            tx.send_replace(*c);
        }
    }
}

/// One object's push: its home handle, its size if its data goes too,
/// its attributes.
struct PushJob {
    id: FileId,
    h: HomeHandle,
    size: Option<u64>,
    attrs: HomeSetAttr,
    /// `iw`, an object whose data is the cache's own: once pushed it
    /// becomes home's again (so that home's later changes come in), its
    /// mark going with it if unchanged (the count as read). Also a file
    /// whose data is home's, changed at home, after the cache's
    /// attributes won: it reads home's new data after.
    attach: Option<u64>,
}

/// What one round knows.
pub(super) struct Round<'a> {
    pub(super) binding: FileId,
    pub(super) vol: Arc<Formatted>,
    pub(super) home: Arc<dyn Home>,
    pub(super) b: &'a Bound,
    /// Independent writers (`iw`): names home has that the cache does
    /// not know are another writer's, kept.
    pub(super) iw: bool,
    /// The change counts of the marks this round pushes.
    pub(super) counts: HashMap<FileId, u64>,
    /// Where home has the objects made in the cache: by object, by place.
    pub(super) homes: HashMap<FileId, WbHome>,
    pub(super) by_spot: HashMap<(FileId, Vec<u8>), FileId>,
    /// Names objects left in the cache with no other record (with the
    /// metadata range that keeps the record), by place.
    pub(super) gone: Departed,
    /// Inodes read this round (`None`: gone).
    pub(super) inodes: HashMap<FileId, Option<Inode>>,
    /// The cache's entries of the directories with changed names.
    pub(super) listings: HashMap<FileId, Vec<DirEntry>>,
    /// Where the cache names each object, in those directories.
    pub(super) named_in: HashMap<FileId, Vec<(FileId, Vec<u8>)>>,
    /// Home's handles of directories, found this round.
    pub(super) handles: HashMap<FileId, HomeHandle>,
    /// Files made at home this round with bytes (their data follows).
    pub(super) made: HashSet<FileId>,
    /// Every object made at home this round (with its attributes as the
    /// round read them).
    pub(super) created: HashSet<FileId>,
    /// Directories whose home copy a conflict's resolution changed: their
    /// attributes are pushed again at the end of the round.
    pub(super) touched: HashSet<FileId>,
    /// Home's `.conflicts/` directory, once found this round.
    pub(super) conflicts: Option<HomeHandle>,
    /// Objects whose conflict this round resolved (their marks are gone).
    pub(super) rebased: HashSet<FileId>,
}

pub(super) fn home_failed(b: &Bound, e: HomeError) -> WireError {
    b.failed(e)
}

/// The (major, minor) of a device number as Linux's `makedev` encodes it.
fn dev_parts(rdev: u32) -> (u32, u32) {
    ((rdev >> 8) & 0xfff, (rdev & 0xff) | ((rdev >> 12) & !0xff))
}

fn home_time(t: morris_proto::Timestamp) -> HomeTime {
    HomeTime {
        secs: t.secs,
        nsecs: t.nanos,
    }
}

/// What home needs to make object `i`, and the attributes to give it.
pub(super) fn new_of(i: &Inode) -> (HomeNew, HomeSetAttr) {
    let a = &i.attr;
    let what = match a.kind {
        FileKind::File => HomeNew::File,
        FileKind::Dir => HomeNew::Dir,
        FileKind::Symlink => HomeNew::Symlink(i.target.clone().unwrap_or_default()),
        FileKind::BlockDev => HomeNew::Device(HomeKind::BlockDev, dev_parts(a.rdev)),
        FileKind::CharDev => HomeNew::Device(HomeKind::CharDev, dev_parts(a.rdev)),
        FileKind::Fifo => HomeNew::Fifo,
        FileKind::Socket => HomeNew::Socket,
    };
    (what, attrs_of(i))
}

/// The attributes of `i` to set at home (a symlink's mode stays).
fn attrs_of(i: &Inode) -> HomeSetAttr {
    let a = &i.attr;
    HomeSetAttr {
        mode: (a.kind != FileKind::Symlink).then_some(a.mode & 0o7777),
        uid: Some(a.uid),
        gid: Some(a.gid),
        size: None,
        atime: Some(home_time(a.atime)),
        mtime: Some(home_time(a.mtime)),
    }
}

impl Server {
    /// `WbMarks` / `WbHomes` at this server, for a range it serves.
    pub(super) fn wb_local(&self, req: &Request) -> Result<Reply, WireError> {
        let (binding, range) = match req {
            Request::WbMarks { binding, range, .. }
            | Request::WbHomes { binding, range }
            | Request::WbGone { binding, range } => (*binding, range),
            Request::WbNameOf { range, .. } => (0, range),
            _ => return Err(err(ErrorCode::Protocol, "request routed wrongly")),
        };
        let st = self
            .ranges()?
            .serving(self.now_ms())
            .into_iter()
            .find(|r| r.range == *range)
            .map(|r| r.store.clone())
            .ok_or_else(|| {
                err(
                    ErrorCode::NotOwner,
                    format!("metadata range {range} is not served here"),
                )
            })?;
        match req {
            Request::WbMarks { due_before, .. } => {
                metadata(|| st.wb_marks(binding, *due_before)).map(Reply::WbMarks)
            }
            Request::WbGone { .. } => metadata(|| st.wb_gone(binding)).map(Reply::WbHomes),
            Request::WbNameOf { id, .. } => metadata(|| st.wb_name_of(*id)).map(Reply::WbHomes),
            _ => metadata(|| st.wb_homes(binding)).map(Reply::WbHomes),
        }
    }

    /// `--on-disconnect block`: refuses (`HomeDown`, which the client asks
    /// again until it passes) a change under a binding whose home does not
    /// answer now. Nothing to do unless such a binding is known here.
    pub(super) async fn wait_for_home(
        &self,
        store: &Store,
        req: &Request,
    ) -> Result<(), WireError> {
        let binding_of = |id: FileId| {
            store
                .get_inode(id)
                .ok()
                .flatten()
                .and_then(|i| i.home.map(|l| l.binding))
        };
        let changed = match req {
            Request::Link { dir, .. }
            | Request::Unlink { dir, .. }
            | Request::Rename { dir, .. } => Some(dir.id),
            Request::SetAttr { ino, .. } => Some(ino.id),
            Request::CreateInode { home: Some(_), .. } => Some(0),
            _ => None,
        };
        let Some(changed) = changed else {
            return Ok(());
        };
        let blocking: Vec<(FileId, Arc<Bound>)> = self
            .known_bindings()
            .into_iter()
            .filter(|(_, b)| b.spec.on_disconnect == OnDisconnect::Block && b.spec.writable())
            .collect();
        if blocking.is_empty() {
            return Ok(());
        }
        let binding = match req {
            Request::CreateInode { home, .. } => *home,
            _ => binding_of(changed),
        };
        let Some((_, b)) = binding.and_then(|x| blocking.iter().find(|(id, _)| *id == x)) else {
            return Ok(());
        };
        if b.answers().await {
            Ok(())
        } else {
            Err(err(
                ErrorCode::HomeDown,
                format!(
                    "home {} does not answer; changes under its binding wait for it (--on-disconnect block)",
                    b.spec.url
                ),
            ))
        }
    }

    /// The marks of `binding` kept here (status): how many, the oldest's
    /// time.
    pub(super) fn wb_queue(&self, binding: FileId) -> crate::store::WbQueue {
        let mut q = crate::store::WbQueue::default();
        let Ok(ranges) = self.ranges() else {
            return q;
        };
        for r in ranges.serving(self.now_ms()) {
            let st = r.store.clone();
            if let Ok(k) = metadata(|| st.wb_queue(binding)) {
                q.objects += k.objects;
                q.dirty_bytes = q.dirty_bytes.saturating_add(k.dirty_bytes);
                if let Some(t) = k.oldest_ms {
                    q.oldest_ms = Some(q.oldest_ms.map_or(t, |o| o.min(t)));
                }
            }
        }
        q
    }

    /// Every range's marks of `binding` set at or before `due_before`, and
    /// whether every range answered.
    async fn all_marks(
        &self,
        vol: &Formatted,
        binding: FileId,
        due_before: u64,
    ) -> Result<(Vec<WbMark>, bool), WireError> {
        let mut marks = Vec::new();
        let mut complete = true;
        for range in 0..vol.layout.servers {
            match self
                .range_ask_r(
                    vol,
                    range,
                    &Request::WbMarks {
                        binding,
                        range,
                        due_before,
                    },
                )
                .await
            {
                Ok(Reply::WbMarks(m)) => marks.extend(m),
                Ok(other) => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
                Err(e) => {
                    debug!(binding, range, error = %e, "marks not read");
                    complete = false;
                }
            }
        }
        Ok((marks, complete))
    }

    /// The pusher's tick: a round for every binding whose bound directory
    /// this server serves, pushing the marks older than its sync lag (all
    /// of them while a flush waits).
    pub(crate) async fn push_tick(&self) {
        let now = self.now_ms();
        let Ok(ranges) = self.ranges() else { return };
        // A range taken over (or served again) may hold bound directories
        // no client told this server of: learn them from their links.
        for range in ranges.serving(now) {
            let key = (range.range, Arc::as_ptr(&range.store) as usize);
            if !self.pusher_conns.learnt.lock().insert(key) {
                continue;
            }
            let st = range.store.clone();
            match metadata(|| st.bound_dirs()) {
                Ok(found) => {
                    for (binding, spec) in found {
                        if self.bound(binding).is_err() {
                            self.open_home(binding, spec);
                        }
                    }
                }
                Err(e) => {
                    self.pusher_conns.learnt.lock().remove(&key);
                    debug!(range = range.range, error = %e, "bindings of a range not read");
                }
            }
        }
        for (binding, b) in self.known_bindings() {
            if ranges.serving_id(binding, now).is_err() {
                continue;
            }
            if let Err(e) = self.push_round(binding, &b).await {
                debug!(binding, error = %e, "write-back round failed");
                *b.wb.last_error.lock() = Some(e.to_string());
            }
        }
    }

    /// `Flush`: waits until a round started after this request pushed
    /// everything it found, or [`FLUSH_WAIT`].
    pub(super) async fn flush(&self, binding: FileId) -> Result<Reply, WireError> {
        let b = self.bound(binding)?;
        let mut rx = b.wb.watch();
        let want = b.wb.started.load(Ordering::SeqCst) + 1;
        b.wb.flush_upto.fetch_max(want, Ordering::SeqCst);
        self.pusher_conns.wake.notify_one();
        // Within a lease time: a client leaves a request silent for longer
        // to the range's other copy.
        let wait = FLUSH_WAIT.min(Duration::from_millis(u64::from(self.lease_ms)));
        let done = tokio::time::timeout(wait, rx.wait_for(|c| *c >= want))
            .await
            .is_ok_and(|r| r.is_ok());
        let queued = if done {
            0
        } else {
            let vol = self.vol()?;
            self.all_marks(&vol, binding, u64::MAX).await?.0.len() as u64
        };
        let last_error = b.wb.last_error.lock().clone();
        Ok(Reply::Flushed {
            done,
            queued,
            last_error,
        })
    }

    fn vol(&self) -> Result<Arc<Formatted>, WireError> {
        self.store
            .formatted()
            .ok_or_else(|| err(ErrorCode::WrongVolume, "this server is not formatted"))
    }

    /// One round for `binding`.
    async fn push_round(&self, binding: FileId, b: &Arc<Bound>) -> Result<(), WireError> {
        let _one = b.wb.round.lock().await;
        let seq = b.wb.started.fetch_add(1, Ordering::SeqCst) + 1;
        let all = b.wb.flush_upto.load(Ordering::SeqCst) >= seq;
        let vol = self.vol()?;
        // While home is down, only its probe (one round in a few seconds)
        // gathers the queue: a long queue is not read every second for
        // nothing.
        let home = if b.spec.pushes() {
            Some(b.home().await?)
        } else {
            None
        };
        // Every range's marks past the sync lag (all of them for a flush:
        // a server's clock a little ahead of this one's must not leave a
        // change out).
        let due_before = if all {
            u64::MAX
        } else {
            wall_ms().saturating_sub(b.spec.sync_lag_ms)
        };
        let (mut due, complete) = self.all_marks(&vol, binding, due_before).await?;
        let mut seen = HashSet::new();
        due.retain(|m| seen.insert(m.id));
        if due.is_empty() {
            if complete && all {
                b.wb.finished_clean(seq);
            }
            return if complete {
                Ok(())
            } else {
                Err(err(
                    ErrorCode::Unavailable,
                    "a server's marks could not be read",
                ))
            };
        }
        b.wb.rounds.fetch_add(1, Ordering::Relaxed);
        let Some(home) = home else {
            // `lu`: changes stay here.
            let cleared: Vec<(FileId, u64)> = due.iter().map(|m| (m.id, m.count)).collect();
            self.clear_marks(&vol, &cleared).await?;
            let gone = self.all_gone(&vol, binding).await?;
            self.clear_gone(&vol, gone.into_values().flatten().collect())
                .await?;
            if complete && all {
                b.wb.finished_clean(seq);
            }
            return Ok(());
        };
        let mut homes = HashMap::new();
        for range in 0..vol.layout.servers {
            // Every place record is needed to tell the cache's objects at
            // home from others: no round without all of them.
            match self
                .range_ask_r(&vol, range, &Request::WbHomes { binding, range })
                .await?
            {
                Reply::WbHomes(h) => {
                    for r in h {
                        homes.insert(r.id, r);
                    }
                }
                other => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
            }
        }
        let by_spot = homes
            .values()
            .map(|h| ((h.dir, h.name.clone()), h.id))
            .collect();
        let gone = self.all_gone(&vol, binding).await?;
        let mut r = Round {
            binding,
            vol: vol.clone(),
            home,
            b,
            iw: b.spec.mode == morris_proto::home::CacheMode::Iw,
            counts: due.iter().map(|m| (m.id, m.count)).collect(),
            homes,
            by_spot,
            gone,
            conflicts: None,
            rebased: HashSet::new(),
            inodes: HashMap::new(),
            listings: HashMap::new(),
            named_in: HashMap::new(),
            handles: HashMap::new(),
            made: HashSet::new(),
            created: HashSet::new(),
            touched: HashSet::new(),
        };
        let started = std::time::Instant::now();
        let (ok, names_ok, left) = self.run_round(&mut r, &due).await;
        let spent = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        b.wb.push_ms.fetch_add(spent, Ordering::Relaxed);
        let cleared: Vec<(FileId, u64)> = due
            .iter()
            .filter(|m| ok.contains(&m.id) && !r.rebased.contains(&m.id))
            .map(|m| (m.id, m.count))
            .collect();
        // Departed names home no longer has: those of directories pushed
        // whole, and those of directories removed at home with them.
        let departed: Vec<&(u32, WbHome)> = r.gone.values().flatten().collect();
        let mut cleared_ids = HashSet::new();
        let mut done_gone = Vec::new();
        let mut taken = vec![false; departed.len()];
        for (k, g) in departed.iter().enumerate() {
            if names_ok.contains(&g.1.dir) && !left.contains(&g.1.dir) {
                taken[k] = true;
                cleared_ids.insert(g.1.id);
                done_gone.push((*g).clone());
            }
        }
        loop {
            let mut more = false;
            for (k, g) in departed.iter().enumerate() {
                if !taken[k] && cleared_ids.contains(&g.1.dir) {
                    taken[k] = true;
                    more = true;
                    cleared_ids.insert(g.1.id);
                    done_gone.push((*g).clone());
                }
            }
            if !more {
                break;
            }
        }
        self.clear_gone(&vol, done_gone).await?;
        let failed = due.iter().filter(|m| !ok.contains(&m.id)).count();
        self.clear_marks(&vol, &cleared).await?;
        b.wb.pushed
            .fetch_add(cleared.len() as u64, Ordering::Relaxed);
        if failed == 0 {
            b.ok_pushing();
            if complete && all {
                b.wb.finished_clean(seq);
            }
            Ok(())
        } else {
            Err(err(
                ErrorCode::Io,
                format!("{failed} changed objects not pushed yet"),
            ))
        }
    }

    /// Every range's departed names of `binding`, by place (every range
    /// must answer: a name not known to be the cache's would be taken
    /// for another writer's).
    async fn all_gone(&self, vol: &Formatted, binding: FileId) -> Result<Departed, WireError> {
        let mut gone = Departed::new();
        for range in 0..vol.layout.servers {
            match self
                .range_ask_r(vol, range, &Request::WbGone { binding, range })
                .await?
            {
                Reply::WbHomes(h) => {
                    for g in h {
                        gone.entry((g.dir, g.name.clone()))
                            .or_default()
                            .push((range, g));
                    }
                }
                other => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
            }
        }
        Ok(gone)
    }

    /// Forgets departed names in the ranges that keep them (the
    /// directory's owner's, or the departed object's).
    async fn clear_gone(&self, vol: &Formatted, gone: Vec<(u32, WbHome)>) -> Result<(), WireError> {
        // Per range: an id of it (to route by) and its records.
        type Names = Vec<(FileId, Vec<u8>, FileId)>;
        let mut by_range: BTreeMap<u32, (FileId, Names)> = BTreeMap::new();
        for (range, g) in gone {
            let at = if vol.layout.inode_server(g.dir) == range {
                g.dir
            } else {
                g.id
            };
            by_range
                .entry(range)
                .or_insert_with(|| (at, Vec::new()))
                .1
                .push((g.dir, g.name, g.id));
        }
        for (_, (at, gs)) in by_range {
            for chunk in gs.chunks(10_000) {
                self.range_ask(
                    vol,
                    at,
                    &Request::WbGoneClear {
                        at,
                        gone: chunk.to_vec(),
                    },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Clears marks at their owners.
    async fn clear_marks(&self, vol: &Formatted, marks: &[(FileId, u64)]) -> Result<(), WireError> {
        let mut by_range: BTreeMap<u32, Vec<(FileId, u64)>> = BTreeMap::new();
        for &(id, c) in marks {
            by_range
                .entry(vol.layout.inode_server(id))
                .or_default()
                .push((id, c));
        }
        for (_, ms) in by_range {
            for chunk in ms.chunks(10_000) {
                let first = chunk[0].0;
                self.range_ask(
                    vol,
                    first,
                    &Request::WbClear {
                        marks: chunk.to_vec(),
                    },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Pushes what `due` marks; returns the objects done, the directories
    /// whose names were pushed, and those gone from the binding.
    async fn run_round(
        &self,
        r: &mut Round<'_>,
        due: &[WbMark],
    ) -> (HashSet<FileId>, HashSet<FileId>, HashSet<FileId>) {
        let mut done = HashSet::new();
        // Directories gone from the binding (their departed names need no
        // push).
        let mut left = HashSet::new();
        // Directories with changed names, parents first.
        let mut dirs: Vec<(u32, FileId)> = Vec::new();
        for m in due.iter().filter(|m| m.names) {
            match self.depth(r, m.id).await {
                Ok(Some(d)) => dirs.push((d, m.id)),
                // Gone, or no longer under the binding: its removal is
                // its parent's change.
                Ok(None) => {
                    done.insert(m.id);
                    left.insert(m.id);
                }
                Err(e) => warn!(dir = m.id, error = %e, "write-back: directory not placed"),
            }
        }
        dirs.sort();
        for &(_, d) in &dirs {
            if let Err(e) = self.load_listing(r, d).await {
                warn!(dir = d, error = %e, "write-back: directory not read");
            }
        }
        let mut names_ok: HashSet<FileId> = HashSet::new();
        for &(_, d) in &dirs {
            if !r.listings.contains_key(&d) {
                continue;
            }
            match self.reconcile_dir(r, d).await {
                Ok(()) => {
                    names_ok.insert(d);
                }
                Err(e) => {
                    warn!(dir = d, error = %e, "write-back: directory not pushed");
                    *r.b.wb.last_error.lock() = Some(e.to_string());
                }
            }
        }
        // Data and attributes, and the files made at home just now.
        let mut objs: Vec<(FileId, bool, bool)> = due
            .iter()
            .filter(|m| m.attrs || m.data)
            .map(|m| (m.id, m.data, m.attrs))
            .collect();
        for &id in &r.made {
            if !objs.iter().any(|o| o.0 == id) {
                objs.push((id, true, true));
            }
        }
        let mut objs_ok = HashSet::new();
        let mut jobs = Vec::new();
        for (id, data, _) in objs {
            let data = data || r.made.contains(&id);
            if r.created.contains(&id) && !r.made.contains(&id) {
                // Made empty just now, with its attributes.
                objs_ok.insert(id);
                continue;
            }
            match self.prepare_push(r, id, data).await {
                Ok(Some(job)) => jobs.push(job),
                Ok(None) => {
                    objs_ok.insert(id);
                }
                Err(e) => {
                    warn!(id, error = %e, "write-back: object not pushed");
                    *r.b.wb.last_error.lock() = Some(e.to_string());
                }
            }
        }
        // Files are independent of each other: pushed at once.
        let rr: &Round<'_> = r;
        let pushes: Vec<_> = jobs
            .into_iter()
            .map(|job| async move { (job.id, self.run_push(rr, &job).await) })
            .collect();
        let pushed: Vec<(FileId, Result<(), WireError>)> = futures::stream::iter(pushes)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (id, res) in pushed {
            match res {
                Ok(()) => {
                    objs_ok.insert(id);
                }
                Err(e) => {
                    warn!(id, error = %e, "write-back: object not pushed");
                    *r.b.wb.last_error.lock() = Some(e.to_string());
                }
            }
        }
        // Directories' own attributes last: every step above may have
        // changed their times at home.
        let mut dir_attrs: Vec<FileId> = names_ok.iter().copied().collect();
        dir_attrs.extend(due.iter().filter(|m| m.attrs && !m.names).map(|m| m.id));
        dir_attrs.extend(r.touched.iter().copied());
        dir_attrs.sort_unstable();
        dir_attrs.dedup();
        for d in dir_attrs {
            let r2 = async {
                let Some(i) = self.inode(r, d).await? else {
                    return Ok(());
                };
                if i.attr.kind != FileKind::Dir {
                    return Ok(());
                }
                let Some(h) = self.resolve(r, d).await? else {
                    return Err(err(
                        ErrorCode::NotFound,
                        format!("directory {d} is not at home"),
                    ));
                };
                let a = r
                    .home
                    .setattr(&h, &attrs_of(&i))
                    .await
                    .map_err(|e| home_failed(r.b, e))?;
                if r.iw && i.home.as_ref().is_some_and(|l| l.is_local()) {
                    // A directory made in the cache becomes home's (its
                    // mark is cleared as pushed): its next revalidation
                    // lists home into it, so that another writer's names
                    // come in. Its stamp is one no listing has.
                    let mut stamp = stamp_of(&a);
                    stamp.size = u64::MAX;
                    let req = Request::WbRebase {
                        binding: r.binding,
                        id: d,
                        count: None,
                        place: None,
                        now: Some((h.0.clone(), stamp, attr_of(&a))),
                    };
                    self.range_ask(&r.vol, d, &req).await?;
                }
                Ok(())
            }
            .await;
            if let Err(e) = r2 {
                warn!(dir = d, error = %e, "write-back: directory attributes not pushed");
                names_ok.remove(&d);
                objs_ok.remove(&d);
            }
        }
        for m in due {
            let names = !m.names || names_ok.contains(&m.id) || done.contains(&m.id);
            let rest = !(m.attrs || m.data) || objs_ok.contains(&m.id);
            if names && rest {
                done.insert(m.id);
            }
        }
        (done, names_ok, left)
    }

    /// Object `id`'s inode (read once per round).
    pub(super) async fn inode(
        &self,
        r: &mut Round<'_>,
        id: FileId,
    ) -> Result<Option<Inode>, WireError> {
        if let Some(i) = r.inodes.get(&id) {
            return Ok(i.clone());
        }
        let i = match self
            .range_ask(&r.vol, id, &Request::GetInode { ino: id })
            .await
        {
            Ok(Reply::Inode(i)) => Some(i),
            Ok(other) => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale) => None,
            Err(e) => return Err(e),
        };
        r.inodes.insert(id, i.clone());
        Ok(i)
    }

    /// How far directory `d` is below the bound directory (`None`: it is
    /// gone, or not under the binding).
    async fn depth(&self, r: &mut Round<'_>, d: FileId) -> Result<Option<u32>, WireError> {
        let mut at = d;
        for n in 0..4096 {
            if at == r.binding {
                return Ok(Some(n));
            }
            let Some(i) = self.inode(r, at).await? else {
                return Ok(None);
            };
            // Removed (kept while open: an orphan has no link), or not
            // under the binding.
            if i.attr.kind != FileKind::Dir
                || i.attr.nlink == 0
                || i.home.as_ref().map(|l| l.binding) != Some(r.binding)
            {
                return Ok(None);
            }
            at = i.parent;
        }
        Err(err(ErrorCode::Invalid, "directory tree too deep"))
    }

    /// The cache's entries of directory `d`.
    pub(super) async fn load_listing(&self, r: &mut Round<'_>, d: FileId) -> Result<(), WireError> {
        let mut all = Vec::new();
        let mut cookie = 0;
        loop {
            let req = Request::WbEntries {
                dir: d,
                cookie,
                max: PAGE,
            };
            let Reply::Entries { entries, eof } = self.range_ask(&r.vol, d, &req).await? else {
                return Err(err(ErrorCode::Protocol, "unexpected reply to WbEntries"));
            };
            let last = entries.last().map(|e| e.cookie);
            all.extend(entries);
            match last {
                Some(c) if !eof => cookie = c,
                _ => break,
            }
        }
        for e in &all {
            r.named_in
                .entry(e.child.id)
                .or_default()
                .push((d, e.name.clone()));
        }
        r.listings.insert(d, all);
        Ok(())
    }

    /// Home's handle of cache directory `d`, if home has it.
    pub(super) fn resolve<'a>(
        &'a self,
        r: &'a mut Round<'_>,
        d: FileId,
    ) -> BoxFuture<'a, Result<Option<HomeHandle>, WireError>> {
        async move {
            if let Some(h) = r.handles.get(&d) {
                return Ok(Some(h.clone()));
            }
            let Some(i) = self.inode(r, d).await? else {
                return Ok(None);
            };
            let Some(link) = i.home.as_deref() else {
                return Ok(None);
            };
            let h = if !link.is_local() {
                Some(HomeHandle(link.handle.clone()))
            } else if let Some(rec) = r.homes.get(&d).cloned() {
                self.find_at(r, &rec).await?
            } else {
                None
            };
            if let Some(h) = &h {
                r.handles.insert(d, h.clone());
            }
            Ok(h)
        }
        .boxed()
    }

    /// What pushing object `id`'s data (a file) and attributes home takes,
    /// found with the round's maps (`None`: nothing to push).
    async fn prepare_push(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        data: bool,
    ) -> Result<Option<PushJob>, WireError> {
        if r.rebased.contains(&id) {
            return Ok(None);
        }
        let Some(i) = self.inode(r, id).await? else {
            return Ok(None);
        };
        if i.attr.nlink == 0 {
            // Removed in the cache, kept while open or until reaped: it
            // has no name, so nothing of it goes home (its directory's
            // push removes its name there; pushed, its changes would be
            // taken for a conflict with that removal).
            return Ok(None);
        }
        let Some(link) = i.home.as_deref().cloned() else {
            return Ok(None);
        };
        if i.attr.kind == FileKind::Dir {
            // Its attributes go last in the round.
            return Ok(None);
        }
        let h = if !link.is_local() {
            HomeHandle(link.handle.clone())
        } else {
            let Some(rec) = r.homes.get(&id).cloned() else {
                return Err(err(ErrorCode::NotFound, format!("{id} is not at home yet")));
            };
            match self.find_at(r, &rec).await? {
                Some(h) => h,
                None if rec.dir != 0 => {
                    // Home removed it, or put another object at its place.
                    let hd = self.resolve(r, rec.dir).await?;
                    let now = match &hd {
                        Some(hd) => match r.home.lookup(hd, &rec.name).await {
                            Ok(x) => Some(x),
                            Err(HomeError::NotFound) => None,
                            Err(e) => return Err(home_failed(r.b, e)),
                        },
                        None => None,
                    };
                    if let (Some(hd), true) = (hd, super::conflicts::cache_wins(r)) {
                        // The cache's version wins: made again at its
                        // place, what home has there moved away.
                        match &now {
                            Some((_, a)) => {
                                self.move_home_away(r, &hd, &rec.name, id, a.mtime).await?;
                            }
                            None => {
                                r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        self.create(r, rec.dir, &hd, id, &rec.name).await?;
                        r.touched.insert(rec.dir);
                        warn!(binding = r.binding, id, name = %String::from_utf8_lossy(&rec.name), "write-back: conflict (changed in the cache, removed or replaced at home): the cache's version made again at home");
                        match r.homes.get(&id) {
                            Some(p) if r.created.contains(&id) => HomeHandle(p.handle.clone()),
                            // Removed from the cache meanwhile.
                            _ => return Ok(None),
                        }
                    } else {
                        // Home's change wins, the cache's version is kept.
                        let place = now.as_ref().map(|(h, a)| WbHome {
                            fileid: a.fileid,
                            handle: h.0.clone(),
                            ..rec.clone()
                        });
                        self.resolve_conflict(r, id, &i, now, place).await?;
                        return Ok(None);
                    }
                }
                None => {
                    return Err(err(
                        ErrorCode::NotFound,
                        format!("{id} is not where it was put at home"),
                    ))
                }
            }
        };
        let mut rebase_after = false;
        if !r.created.contains(&id) {
            // Changed at home too since the last push?
            match r.home.getattr(&h).await {
                Ok(a) if super::conflicts::changed_at_home(&link.seen, &i, &a) => {
                    if !super::conflicts::cache_wins(r) {
                        self.resolve_conflict(r, id, &i, Some((h, a)), None).await?;
                        return Ok(None);
                    }
                    self.keep_home_version(r, id, &h, &a).await?;
                    // Home's data stays under the cache's attributes when
                    // the cache did not write the data: read again after.
                    rebase_after = !link.is_local();
                }
                Ok(_) => {}
                Err(HomeError::NotFound | HomeError::Stale) => {
                    self.resolve_conflict(r, id, &i, None, None).await?;
                    return Ok(None);
                }
                Err(e) => return Err(home_failed(r.b, e)),
            }
        }
        // A fetched file's bytes are home's: only its attributes go back.
        // One made again at home just now (a conflict the cache won) takes
        // its data whatever changed.
        let data = data || r.made.contains(&id);
        let size =
            (data && i.attr.kind == FileKind::File && link.is_local()).then_some(i.attr.size);
        let attach = ((r.iw && link.is_local()) || rebase_after)
            .then(|| r.counts.get(&id).copied().unwrap_or(0));
        Ok(Some(PushJob {
            id,
            h,
            size,
            attrs: attrs_of(&i),
            attach,
        }))
    }

    /// Pushes what `job` says: the size, then every server's units, then
    /// the attributes (mtime last).
    async fn run_push(&self, r: &Round<'_>, job: &PushJob) -> Result<(), WireError> {
        if let Some(size) = job.size {
            if !r.created.contains(&job.id) {
                // Home's state is the push's until it ends.
                let req = Request::WbSeen {
                    id: job.id,
                    seen: super::conflicts::pushing(FileKind::File),
                };
                self.range_ask(&r.vol, job.id, &req).await?;
            }
            let set = HomeSetAttr {
                size: Some(size),
                ..HomeSetAttr::default()
            };
            r.home
                .setattr(&job.h, &set)
                .await
                .map_err(|e| home_failed(r.b, e))?;
            let bytes = self.push_data(r, job.id, &job.h, size).await?;
            r.b.wb.pushed_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        let a = r
            .home
            .setattr(&job.h, &job.attrs)
            .await
            .map_err(|e| home_failed(r.b, e))?;
        r.b.ok();
        // What a later push compares with to see a change made at home.
        let req = Request::WbSeen {
            id: job.id,
            seen: stamp_of(&a),
        };
        self.range_ask(&r.vol, job.id, &req).await?;
        if let Some(count) = job.attach {
            let req = Request::WbRebase {
                binding: r.binding,
                id: job.id,
                count: Some(count),
                place: None,
                now: Some((job.h.0.clone(), stamp_of(&a), attr_of(&a))),
            };
            match self.range_ask(&r.vol, job.id, &req).await {
                // Changed again meanwhile: attached after its next push.
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::Stale => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Has every server push its units of file `id`; the units of servers
    /// that do not answer are pushed from their next copy.
    pub(super) async fn push_data(
        &self,
        r: &Round<'_>,
        id: FileId,
        h: &HomeHandle,
        size: u64,
    ) -> Result<u64, WireError> {
        if size == 0 {
            return Ok(0);
        }
        let vol = r.vol.clone();
        let k = vol.layout.servers;
        // Read now, not when the round began: a copy recorded stale since
        // (a server back from an outage, a replacement being rebuilt)
        // must not push its units.
        let stale = match self
            .range_ask(&vol, id, &Request::GetInode { ino: id })
            .await?
        {
            Reply::Inode(i) => i.stale,
            other => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
        };
        let mut down: Vec<u32> = Vec::new();
        let mut left: Vec<u32> = (0..k).collect();
        let mut total = 0;
        for _ in 0..vol.layout.replicas.max(1) {
            if let Some(i) = uncovered(&vol.layout, id, size, &down, &stale) {
                return Err(err(
                    ErrorCode::Unavailable,
                    format!(
                        "block {i} of file {id} has no current copy that answers; not pushed yet"
                    ),
                ));
            }
            let req = |_: u32| Request::PushData {
                binding: r.binding,
                spec: r.b.spec.clone(),
                id,
                handle: h.0.clone(),
                size,
                down: down.clone(),
                stale: stale.clone(),
            };
            let calls = left.iter().map(|&s| {
                let req = req(s);
                let vol = vol.clone();
                async move { (s, self.peer_ask(&vol, s, &req).await) }
            });
            let results = futures::future::join_all(calls).await;
            let mut failed = Vec::new();
            for (s, res) in results {
                match res {
                    Ok(Reply::Pushed { bytes }) => total += bytes,
                    Ok(other) => {
                        return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}")))
                    }
                    Err(e) if e.code == ErrorCode::Unavailable => failed.push(s),
                    Err(e) => return Err(e),
                }
            }
            if failed.is_empty() {
                return Ok(total);
            }
            down.extend(&failed);
            // The others push the failed servers' units from their copies.
            left = (0..k).filter(|s| !down.contains(s)).collect();
        }
        Err(err(
            ErrorCode::Unavailable,
            format!("servers {down:?} do not answer; file {id}'s data not pushed"),
        ))
    }

    /// `PushData` at this server: writes the units of `id` this server
    /// pushes (their first copy not on a server in `down`) to home.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn push_data_here(
        &self,
        vol: &Formatted,
        binding: FileId,
        spec: Binding,
        id: FileId,
        handle: Vec<u8>,
        size: u64,
        (down, stale): (&[u32], &[StaleCopy]),
    ) -> Result<Reply, WireError> {
        if self.bound(binding).is_err() {
            self.open_home(binding, spec);
        }
        let b = self.bound(binding)?;
        let home = b.home().await?;
        let h = HomeHandle(handle);
        let unit = u64::from(vol.layout.unit);
        let blocks = size.div_ceil(unit);
        let mine: Vec<(u64, u8)> = (1..=blocks)
            .filter_map(|i| {
                let (r, s) = pusher_of(&vol.layout, id, i, down, stale)?;
                (s == vol.index).then_some((i, r))
            })
            .collect();
        if mine.is_empty() {
            return Ok(Reply::Pushed { bytes: 0 });
        }
        let max_write = u64::from(home.max_write().max(4096));
        let pushed = futures::stream::iter(mine.into_iter().map(|(i, copy)| {
            let home = home.clone();
            let h = h.clone();
            let b = b.clone();
            async move {
                let start = vol.layout.block_start(i);
                let len = unit.min(size - start) as u32;
                let data = self.read(vol, id, i, copy, 0, len).await?;
                let mut data = data.to_vec();
                // A hole or a short block reads as zeros.
                data.resize(len as usize, 0);
                let data = Bytes::from(data);
                let mut off = 0u64;
                while off < u64::from(len) {
                    let end = (off + max_write).min(u64::from(len));
                    let part = data.slice(off as usize..end as usize);
                    let n = home
                        .write(&h, start + off, part)
                        .await
                        .map_err(|e| b.failed(e))?;
                    if n == 0 {
                        return Err(err(ErrorCode::Io, "home took no bytes"));
                    }
                    off += u64::from(n);
                }
                Ok::<u64, WireError>(u64::from(len))
            }
        }))
        .buffer_unordered(PUSH_PARALLEL);
        let results: Vec<Result<u64, WireError>> = pushed.collect().await;
        let mut bytes = 0;
        for r in results {
            bytes += r?;
        }
        home.commit(&h).await.map_err(|e| b.failed(e))?;
        b.ok();
        debug!(id, bytes, "write-back: data pushed");
        Ok(Reply::Pushed { bytes })
    }

    /// Runs the pusher every second until the server stops.
    pub(crate) async fn push_loop(self: Arc<Self>) {
        let mut iv = tokio::time::interval(Duration::from_secs(1));
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = iv.tick() => {}
                () = self.pusher_conns.wake.notified() => {}
            }
            self.push_tick().await;
        }
    }
}

/// The copy (its number and server) that pushes block `i` of file `id`:
/// the first one on a server not `down` and not recorded stale for it.
fn pusher_of(
    l: &morris_proto::layout::Layout,
    id: FileId,
    i: u64,
    down: &[u32],
    stale: &[StaleCopy],
) -> Option<(u8, u32)> {
    l.placement(id, i)
        .into_iter()
        .enumerate()
        .find(|&(_, s)| !down.contains(&s) && !stale.iter().any(|rec| rec.covers(s, i)))
        .map(|(r, s)| (r as u8, s))
}

/// A block of the first `size` bytes of file `id` that no copy can push
/// ([`pusher_of`]), if any.
fn uncovered(
    l: &morris_proto::layout::Layout,
    id: FileId,
    size: u64,
    down: &[u32],
    stale: &[StaleCopy],
) -> Option<u64> {
    let blocks = size.div_ceil(u64::from(l.unit.max(1)));
    (1..=blocks).find(|&i| pusher_of(l, id, i, down, stale).is_none())
}

#[cfg(test)]
mod tests {
    use super::{pusher_of, uncovered};
    use morris_proto::layout::Layout;
    use morris_proto::StaleCopy;

    #[test]
    fn a_stale_or_down_copy_pushes_nothing_and_a_block_without_a_current_copy_is_not_pushed() {
        let l = Layout::new(4, 1 << 20, 2);
        let id = 8;
        let first = l.placement(id, 3);
        assert_eq!(pusher_of(&l, id, 3, &[], &[]), Some((0, first[0])));
        // The first copy recorded stale from block 2 on: the second pushes.
        let stale = [StaleCopy {
            server: first[0],
            from: 2,
            seq: 1,
        }];
        assert_eq!(pusher_of(&l, id, 3, &[], &stale), Some((1, first[1])));
        // ... and below its `from`, the first still does.
        let b1 = l.placement(id, 1);
        if b1[0] == first[0] {
            assert_eq!(pusher_of(&l, id, 1, &[], &stale), Some((0, b1[0])));
        }
        // Its other copy down as well: block 3 has no copy to push it.
        assert_eq!(pusher_of(&l, id, 3, &[first[1]], &stale), None);
        assert_eq!(uncovered(&l, id, 4 << 20, &[first[1]], &stale), Some(3));
        assert_eq!(uncovered(&l, id, 4 << 20, &[], &stale), None);
        assert_eq!(uncovered(&l, id, 0, &[first[0], first[1]], &[]), None);
    }
}
