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
use morris_proto::home::{cache_id, is_cache_id, wall_ms, Binding};
use morris_proto::{
    DirEntry, ErrorCode, FileId, FileKind, Inode, Reply, Request, WbHome, WbMark, WireError,
};
use parking_lot::Mutex;
use tracing::{debug, warn};

use super::cache::Bound;
use super::{err, metadata, Server};
use crate::store::Formatted;
use crate::writeback::{identify, plan, AtHome, Named, Spot, Step};

/// Entries asked per `WbEntries` page, and per home listing page.
const PAGE: u32 = 1000;
/// Longest `Flush` waits before it answers "not yet" (at most a lease
/// time).
const FLUSH_WAIT: Duration = Duration::from_secs(10);
/// Objects one round makes or pushes at home at once.
const PARALLEL: usize = 16;
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
    /// Objects found in a state the pusher cannot push (counted, logged).
    pub(crate) skipped: AtomicU64,
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
}

/// What one round knows.
struct Round<'a> {
    binding: FileId,
    vol: Arc<Formatted>,
    home: Arc<dyn Home>,
    b: &'a Bound,
    /// Where home has the objects made in the cache: by object, by place.
    homes: HashMap<FileId, WbHome>,
    by_spot: HashMap<(FileId, Vec<u8>), FileId>,
    /// Inodes read this round (`None`: gone).
    inodes: HashMap<FileId, Option<Inode>>,
    /// The cache's entries of the directories with changed names.
    listings: HashMap<FileId, Vec<DirEntry>>,
    /// Where the cache names each object, in those directories.
    named_in: HashMap<FileId, Vec<(FileId, Vec<u8>)>>,
    /// Home's handles of directories, found this round.
    handles: HashMap<FileId, HomeHandle>,
    /// Files made at home this round with bytes (their data follows).
    made: HashSet<FileId>,
    /// Every object made at home this round (with its attributes as the
    /// round read them).
    created: HashSet<FileId>,
}

fn home_failed(b: &Bound, e: HomeError) -> WireError {
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
fn new_of(i: &Inode) -> (HomeNew, HomeSetAttr) {
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
        let (Request::WbMarks { binding, range, .. } | Request::WbHomes { binding, range }) = req
        else {
            return Err(err(ErrorCode::Protocol, "request routed wrongly"));
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
        if let Request::WbMarks { due_before, .. } = req {
            metadata(|| st.wb_marks(*binding, *due_before)).map(Reply::WbMarks)
        } else {
            metadata(|| st.wb_homes(*binding)).map(Reply::WbHomes)
        }
    }

    /// The marks of `binding` kept here (status): how many, the oldest's
    /// time.
    pub(super) fn wb_queue(&self, binding: FileId) -> (u64, Option<u64>) {
        let Ok(ranges) = self.ranges() else {
            return (0, None);
        };
        let (mut n, mut oldest) = (0, None::<u64>);
        for r in ranges.serving(self.now_ms()) {
            let st = r.store.clone();
            if let Ok((k, t)) = metadata(|| st.wb_queue(binding)) {
                n += k;
                if let Some(t) = t {
                    oldest = Some(oldest.map_or(t, |o| o.min(t)));
                }
            }
        }
        (n, oldest)
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
        let mut r = Round {
            binding,
            vol: vol.clone(),
            home,
            b,
            homes,
            by_spot,
            inodes: HashMap::new(),
            listings: HashMap::new(),
            named_in: HashMap::new(),
            handles: HashMap::new(),
            made: HashSet::new(),
            created: HashSet::new(),
        };
        let ok = self.run_round(&mut r, &due).await;
        let cleared: Vec<(FileId, u64)> = due
            .iter()
            .filter(|m| ok.contains(&m.id))
            .map(|m| (m.id, m.count))
            .collect();
        let failed = due.len() - cleared.len();
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

    /// Pushes what `due` marks; returns the objects done.
    async fn run_round(&self, r: &mut Round<'_>, due: &[WbMark]) -> HashSet<FileId> {
        let mut done = HashSet::new();
        // Directories with changed names, parents first.
        let mut dirs: Vec<(u32, FileId)> = Vec::new();
        for m in due.iter().filter(|m| m.names) {
            match self.depth(r, m.id).await {
                Ok(Some(d)) => dirs.push((d, m.id)),
                // Gone, or no longer under the binding: its removal is
                // its parent's change.
                Ok(None) => {
                    done.insert(m.id);
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
                r.home
                    .setattr(&h, &attrs_of(&i))
                    .await
                    .map(|_| ())
                    .map_err(|e| home_failed(r.b, e))
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
        done
    }

    /// Object `id`'s inode (read once per round).
    async fn inode(&self, r: &mut Round<'_>, id: FileId) -> Result<Option<Inode>, WireError> {
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
            if i.attr.kind != FileKind::Dir || i.home.as_ref().map(|l| l.binding) != Some(r.binding)
            {
                return Ok(None);
            }
            at = i.parent;
        }
        Err(err(ErrorCode::Invalid, "directory tree too deep"))
    }

    /// The cache's entries of directory `d`.
    async fn load_listing(&self, r: &mut Round<'_>, d: FileId) -> Result<(), WireError> {
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
    fn resolve<'a>(
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

    /// Home's handle of the object `rec` places, if home has it there.
    async fn find_at(
        &self,
        r: &mut Round<'_>,
        rec: &WbHome,
    ) -> Result<Option<HomeHandle>, WireError> {
        if rec.dir == 0 {
            // A file fetched from home and detached: by its handle (it
            // keeps its place at home).
            return Ok(Some(HomeHandle(rec.handle.clone())));
        }
        let Some(parent) = self.resolve(r, rec.dir).await? else {
            return Ok(None);
        };
        match r.home.lookup(&parent, &rec.name).await {
            Ok((h, a)) if a.fileid == rec.fileid => Ok(Some(h)),
            Ok(_) | Err(HomeError::NotFound | HomeError::Stale) => Ok(None),
            Err(e) => Err(home_failed(r.b, e)),
        }
    }

    /// Records where home has object `id` now.
    async fn place(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        dir: FileId,
        name: &[u8],
        h: &HomeHandle,
        fileid: u64,
    ) -> Result<(), WireError> {
        let rec = WbHome {
            id,
            dir,
            name: name.to_vec(),
            fileid,
            handle: h.0.clone(),
        };
        self.range_ask(
            &r.vol,
            id,
            &Request::WbSetHome {
                binding: r.binding,
                home: rec.clone(),
            },
        )
        .await?;
        note_place(r, rec);
        Ok(())
    }

    /// Makes home's directory `d` list what the cache's does.
    async fn reconcile_dir(&self, r: &mut Round<'_>, d: FileId) -> Result<(), WireError> {
        let Some(hd) = self.resolve(r, d).await? else {
            return Err(err(
                ErrorCode::NotFound,
                format!("directory {d} is not at home yet"),
            ));
        };
        // A directory fetched from home must hold every name home has
        // (clients list it before they change it): a name it never
        // fetched would otherwise be removed at home.
        let listed = self
            .inode(r, d)
            .await?
            .and_then(|i| i.home.map(|l| l.listed || l.is_local()))
            .unwrap_or(false);
        if !listed {
            r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(err(
                ErrorCode::Invalid,
                format!("directory {d} is not listed whole from home; its names are not pushed"),
            ));
        }
        // Home's entries.
        let mut at_home = Vec::new();
        let (mut cookie, mut verifier) = (0, [0u8; 8]);
        loop {
            let page = r
                .home
                .read_dir(&hd, cookie, verifier, PAGE as usize, true)
                .await
                .map_err(|e| home_failed(r.b, e))?;
            // Home answers (after a time down, requests go through again).
            r.b.ok();
            verifier = page.verifier;
            let eof = page.eof;
            for e in page.entries {
                cookie = e.cookie;
                at_home.push(e);
            }
            if eof {
                break;
            }
        }
        let fsid = match at_home
            .iter()
            .find_map(|e| e.plus.as_ref().map(|p| p.1.fsid))
        {
            Some(f) => f,
            None => {
                r.home
                    .getattr(&hd)
                    .await
                    .map_err(|e| home_failed(r.b, e))?
                    .fsid
            }
        };
        let cache = r.listings.get(&d).cloned().unwrap_or_default();
        let here_names: HashMap<&[u8], FileId> = cache
            .iter()
            .map(|e| (e.name.as_slice(), e.child.id))
            .collect();
        let mut named = Vec::with_capacity(cache.len());
        for e in &cache {
            let obj = e.child.id;
            let (home_at, still_there) = if is_cache_id(obj) {
                // Fetched from home: it keeps its place there.
                (
                    Some(Spot {
                        dir: d,
                        name: e.name.clone(),
                    }),
                    true,
                )
            } else {
                match r.homes.get(&obj) {
                    Some(rec) => {
                        let spot = Spot {
                            dir: rec.dir,
                            name: rec.name.clone(),
                        };
                        let still = match r.listings.get(&rec.dir) {
                            Some(l) => l.iter().any(|x| x.name == rec.name && x.child.id == obj),
                            // A directory whose names did not change
                            // still names it there.
                            None => true,
                        };
                        (Some(spot), still)
                    }
                    None => (None, false),
                }
            };
            named.push(Named {
                name: e.name.clone(),
                obj,
                home_at,
                still_there,
            });
        }
        let mut homes_list = Vec::with_capacity(at_home.len());
        for h in &at_home {
            let is_dir = match &h.plus {
                Some((_, a)) => a.kind == HomeKind::Dir,
                None => matches!(
                    r.home.lookup(&hd, &h.name).await,
                    Ok((_, a)) if a.kind == HomeKind::Dir
                ),
            };
            let same = here_names.get(h.name.as_slice()).copied().filter(|&o| {
                if is_cache_id(o) {
                    cache_id(r.binding, fsid, h.fileid) == o
                } else {
                    r.homes.get(&o).is_some_and(|rec| {
                        rec.fileid == h.fileid && rec.dir == d && rec.name == h.name
                    })
                }
            });
            let departed = r
                .by_spot
                .get(&(d, h.name.clone()))
                .copied()
                .filter(|o| r.homes.get(o).is_some_and(|rec| rec.fileid == h.fileid));
            let obj = identify(&h.name, same, departed);
            let moving = obj.is_some_and(|o| {
                !here_names.values().any(|&x| x == o)
                    && r.named_in
                        .get(&o)
                        .is_some_and(|v| v.iter().any(|(dir, _)| *dir != d))
            });
            homes_list.push(AtHome {
                name: h.name.clone(),
                is_dir,
                obj,
                moving,
            });
        }
        let steps = plan(d, &named, &homes_list);
        if !steps.is_empty() {
            debug!(dir = d, steps = steps.len(), "write-back: directory");
        }
        let mut steps = steps.into_iter().peekable();
        while let Some(s) = steps.next() {
            match s {
                // The creates of a directory are independent of each
                // other: made at once.
                Step::Create { obj, name } => {
                    let mut batch = vec![(obj, name)];
                    while let Some(Step::Create { .. }) = steps.peek() {
                        if let Some(Step::Create { obj, name }) = steps.next() {
                            batch.push((obj, name));
                        }
                    }
                    self.create_many(r, d, &hd, batch).await?;
                }
                s => self.run_step(r, d, &hd, s).await?,
            }
        }
        Ok(())
    }

    /// Makes the objects of `batch` at home in directory `d`, at once
    /// ([`PARALLEL`] at a time).
    async fn create_many(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        batch: Vec<(FileId, Vec<u8>)>,
    ) -> Result<(), WireError> {
        let vol = r.vol.clone();
        let missing: Vec<FileId> = batch
            .iter()
            .map(|b| b.0)
            .filter(|o| !is_cache_id(*o) && !r.inodes.contains_key(o))
            .collect();
        let asks: Vec<_> = missing
            .into_iter()
            .map(|id| {
                let vol = vol.clone();
                async move {
                    (
                        id,
                        self.range_ask(&vol, id, &Request::GetInode { ino: id })
                            .await,
                    )
                }
            })
            .collect();
        let got: Vec<(FileId, Result<Reply, WireError>)> = futures::stream::iter(asks)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (id, res) in got {
            match res {
                Ok(Reply::Inode(i)) => {
                    r.inodes.insert(id, Some(i));
                }
                Ok(other) => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
                Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale) => {
                    r.inodes.insert(id, None);
                }
                Err(e) => return Err(e),
            }
        }
        let mut jobs = Vec::new();
        for (obj, name) in batch {
            if is_cache_id(obj) {
                // Fetched from home and gone there: home's change wins.
                r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
                warn!(dir = d, name = %String::from_utf8_lossy(&name), "write-back: an object fetched from home is gone there; not made again");
                continue;
            }
            // `None`: removed from the cache since it was listed; the next
            // round sees its directory without it.
            if let Some(Some(i)) = r.inodes.get(&obj) {
                jobs.push((obj, name, i.clone()));
            }
        }
        let home = r.home.clone();
        let creates: Vec<_> = jobs
            .into_iter()
            .map(|(obj, name, i)| {
                let home = home.clone();
                async move {
                    let (what, attrs) = new_of(&i);
                    let res = home.create(hd, &name, &what, &attrs).await;
                    (obj, name, i, res)
                }
            })
            .collect();
        let made: Vec<_> = futures::stream::iter(creates)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut first_err = None;
        let mut placed = Vec::new();
        for (obj, name, i, res) in made {
            match res {
                Ok((h, a)) => placed.push((
                    WbHome {
                        id: obj,
                        dir: d,
                        name,
                        fileid: a.fileid,
                        handle: h.0,
                    },
                    i,
                )),
                Err(e) => {
                    let e = home_failed(r.b, e);
                    first_err.get_or_insert(e);
                }
            }
        }
        let binding = r.binding;
        let records: Vec<_> = placed
            .iter()
            .map(|(rec, _)| {
                let vol = vol.clone();
                async move {
                    let req = Request::WbSetHome {
                        binding,
                        home: rec.clone(),
                    };
                    self.range_ask(&vol, rec.id, &req).await
                }
            })
            .collect();
        let recorded: Vec<Result<Reply, WireError>> = futures::stream::iter(records)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for res in recorded {
            if let Err(e) = res {
                first_err.get_or_insert(e);
            }
        }
        for (rec, i) in placed {
            // A file with bytes has them pushed next (its attributes after
            // them); an empty one got its attributes with the create.
            if i.attr.kind == FileKind::File && i.attr.size > 0 {
                r.made.insert(rec.id);
            }
            r.created.insert(rec.id);
            note_place(r, rec);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One step of a directory's plan.
    async fn run_step(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        s: Step,
    ) -> Result<(), WireError> {
        let home = r.home.clone();
        let fail = |b: &Bound, e: HomeError| home_failed(b, e);
        match s {
            Step::Aside { name, temp, obj } => {
                home.rename(hd, &name, hd, &temp)
                    .await
                    .map_err(|e| fail(r.b, e))?;
                let (h, a) = home.lookup(hd, &temp).await.map_err(|e| fail(r.b, e))?;
                self.place(r, obj, d, &temp, &h, a.fileid).await
            }
            Step::Unlink { at, obj, now_at } => {
                let Some(ha) = self.resolve(r, at.dir).await? else {
                    return Ok(());
                };
                match home.remove(&ha, &at.name).await {
                    Ok(()) | Err(HomeError::NotFound) => {}
                    Err(e) => return Err(fail(r.b, e)),
                }
                let was_there = r
                    .homes
                    .get(&obj)
                    .is_some_and(|rec| rec.dir == at.dir && rec.name == at.name);
                if was_there && !is_cache_id(obj) {
                    let hn = self.resolve(r, now_at.dir).await?;
                    if let Some(hn) = hn {
                        let (h, a) = home
                            .lookup(&hn, &now_at.name)
                            .await
                            .map_err(|e| fail(r.b, e))?;
                        self.place(r, obj, now_at.dir, &now_at.name, &h, a.fileid)
                            .await?;
                    }
                }
                Ok(())
            }
            Step::Remove { name, is_dir } => {
                let r2 = if is_dir {
                    remove_tree(&*home, hd, &name).await
                } else {
                    home.remove(hd, &name).await
                };
                match r2 {
                    Ok(()) | Err(HomeError::NotFound) => Ok(()),
                    Err(e) => Err(fail(r.b, e)),
                }
            }
            Step::Rename { obj, from, name } => {
                let moved = match self.resolve(r, from.dir).await? {
                    Some(hf) => match home.rename(&hf, &from.name, hd, &name).await {
                        Ok(()) => true,
                        Err(HomeError::NotFound) => false,
                        Err(e) => return Err(fail(r.b, e)),
                    },
                    None => false,
                };
                if !moved {
                    // Home lost it on the way: made again.
                    return self.create(r, d, hd, obj, &name).await;
                }
                let (h, a) = home.lookup(hd, &name).await.map_err(|e| fail(r.b, e))?;
                self.place(r, obj, d, &name, &h, a.fileid).await
            }
            Step::Link { obj, from, name } => {
                let target = match self.resolve(r, from.dir).await? {
                    Some(hf) => match home.lookup(&hf, &from.name).await {
                        Ok((h, _)) => Some(h),
                        Err(HomeError::NotFound) => None,
                        Err(e) => return Err(fail(r.b, e)),
                    },
                    None => None,
                };
                match target {
                    Some(t) => match home.link(&t, hd, &name).await {
                        Ok(_) | Err(HomeError::Exists) => Ok(()),
                        Err(e) => Err(fail(r.b, e)),
                    },
                    None => self.create(r, d, hd, obj, &name).await,
                }
            }
            Step::Create { obj, name } => self.create(r, d, hd, obj, &name).await,
        }
    }

    /// Makes object `obj` at home as `name` in directory `d`.
    async fn create(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        obj: FileId,
        name: &[u8],
    ) -> Result<(), WireError> {
        if is_cache_id(obj) {
            // Fetched from home and gone there: home's change wins.
            r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
            warn!(dir = d, name = %String::from_utf8_lossy(name), "write-back: an object fetched from home is gone there; not made again");
            return Ok(());
        }
        let Some(i) = self.inode(r, obj).await? else {
            // Removed from the cache since it was listed: the next round
            // sees its directory without it.
            return Ok(());
        };
        let (what, attrs) = new_of(&i);
        let (h, a) = r
            .home
            .create(hd, name, &what, &attrs)
            .await
            .map_err(|e| home_failed(r.b, e))?;
        self.place(r, obj, d, name, &h, a.fileid).await?;
        if i.attr.kind == FileKind::File && i.attr.size > 0 {
            r.made.insert(obj);
        }
        r.created.insert(obj);
        Ok(())
    }

    /// What pushing object `id`'s data (a file) and attributes home takes,
    /// found with the round's maps (`None`: nothing to push).
    async fn prepare_push(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        data: bool,
    ) -> Result<Option<PushJob>, WireError> {
        let Some(i) = self.inode(r, id).await? else {
            return Ok(None);
        };
        let Some(link) = i.home.as_deref() else {
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
                None => {
                    return Err(err(
                        ErrorCode::NotFound,
                        format!("{id} is not where it was put at home"),
                    ))
                }
            }
        };
        // A fetched file's bytes are home's: only its attributes go back.
        let size =
            (data && i.attr.kind == FileKind::File && link.is_local()).then_some(i.attr.size);
        Ok(Some(PushJob {
            id,
            h,
            size,
            attrs: attrs_of(&i),
        }))
    }

    /// Pushes what `job` says: the size, then every server's units, then
    /// the attributes (mtime last).
    async fn run_push(&self, r: &Round<'_>, job: &PushJob) -> Result<(), WireError> {
        if let Some(size) = job.size {
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
        r.home
            .setattr(&job.h, &job.attrs)
            .await
            .map_err(|e| home_failed(r.b, e))?;
        r.b.ok();
        Ok(())
    }

    /// Has every server push its units of file `id`; the units of servers
    /// that do not answer are pushed from their next copy.
    async fn push_data(
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
        let mut down: Vec<u32> = Vec::new();
        let mut left: Vec<u32> = (0..k).collect();
        let mut total = 0;
        for _ in 0..vol.layout.replicas.max(1) {
            let req = |_: u32| Request::PushData {
                binding: r.binding,
                spec: r.b.spec.clone(),
                id,
                handle: h.0.clone(),
                size,
                down: down.clone(),
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
        down: Vec<u32>,
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
                let pl = vol.layout.placement(id, i);
                let (r, s) = pl.iter().enumerate().find(|(_, s)| !down.contains(s))?;
                (*s == vol.index).then_some((i, r as u8))
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

/// Notes in the round's maps where home has object `rec.id` now.
fn note_place(r: &mut Round<'_>, rec: WbHome) {
    let (id, spot) = (rec.id, (rec.dir, rec.name.clone()));
    if let Some(old) = r.homes.insert(id, rec) {
        r.by_spot.remove(&(old.dir, old.name));
    }
    r.by_spot.insert(spot, id);
    r.handles.remove(&id);
}

/// Removes `name` (a directory) in `dir` at home with everything in it.
fn remove_tree<'a>(
    home: &'a dyn Home,
    dir: &'a HomeHandle,
    name: &'a [u8],
) -> BoxFuture<'a, Result<(), HomeError>> {
    async move {
        let (h, _) = home.lookup(dir, name).await?;
        loop {
            let page = home.read_dir(&h, 0, [0; 8], PAGE as usize, true).await?;
            if page.entries.is_empty() {
                break;
            }
            for e in &page.entries {
                let is_dir = match &e.plus {
                    Some((_, a)) => a.kind == HomeKind::Dir,
                    None => home.lookup(&h, &e.name).await?.1.kind == HomeKind::Dir,
                };
                let r = if is_dir {
                    remove_tree(home, &h, &e.name).await
                } else {
                    home.remove(&h, &e.name).await
                };
                match r {
                    Ok(()) | Err(HomeError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        home.rmdir(dir, name).await
    }
    .boxed()
}
