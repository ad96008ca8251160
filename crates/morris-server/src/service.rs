//! The request handler: dispatch of every [`Request`] to the store, the
//! block files and the lease table. Sessions are in `sessions.rs`, lease
//! grants, recalls and expiry in `leasing.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use morris_proto::auth::{Keys, Role as KeyRole};
use morris_proto::messages::LeaseMode;
use morris_proto::net::{Conn, ConnLimits, Service, ServiceFuture};
use morris_proto::{ErrorCode, FileId, Reply, Request, ResyncStatus, WireError, MAX_FILE_SIZE};
use parking_lot::{Mutex, RwLock};
use tracing::{debug, info, warn};

use crate::arbiter::{Arbiter, Etcd};
use crate::blocks::Blocks;
use crate::leases::{ClientId, LeaseTable, Millis};
use crate::load::{IoKind, Load};
use crate::ranges::{Range, Ranges, Role};
use crate::scrub::Scrubber;
use crate::store::{check_name, check_new_name, FormatOutcome, Formatted, OpKey, Store};
use leasing::{takes_lease, LeaseState};
use sessions::Sessions;

mod cache;
mod cache_units;
mod conflicts;
mod fencing;
mod leasing;
mod locking;
mod metrics;
mod orphans;
mod peer;
mod peer_calls;
mod push_names;
mod pusher;
mod quotas;
mod replace;
mod scrub_peers;
mod sessions;
mod space;
mod stats;

/// Longest a `ReadDir` waits for names of a directory being listed from
/// home before answering an empty page that is not the end.
const LIST_PAGE_WAIT: Duration = Duration::from_secs(2);

/// Every request name, in a fixed order, for the per-request counters.
const OPS: [&str; Request::NAMES.len()] = Request::NAMES;

/// The stripe server's state, shared by every connection.
pub(crate) struct Server {
    /// The volume's keys: connections prove one; the first connects to peers.
    pub(crate) keys: Keys,
    /// Limits of this server's connections and what they hold (`Status`).
    pub(crate) conn_limits: Arc<ConnLimits>,
    /// This server's own metadata store (its home range's copy, and the
    /// record of its local extent files).
    store: Arc<Store>,
    /// The metadata ranges kept here, once formatted.
    ranges: RwLock<Option<Arc<Ranges>>>,
    /// This server, for spawning its background tasks.
    this: OnceLock<Weak<Server>>,
    blocks: Arc<Blocks>,
    data_dir: PathBuf,
    lease_ms: u32,
    /// Changes on every start and whenever this server stops trusting the
    /// leases it granted (`peer::lapse_all`).
    epoch: AtomicU64,
    started: Instant,
    leases: Mutex<LeaseState>,
    sessions: Mutex<Sessions>,
    /// When each (non-admin) client was last heard from: whether its open
    /// records still count (`orphans.rs`).
    seen: Mutex<HashMap<ClientId, Millis>>,
    requests: AtomicU64,
    by_op: [AtomicU64; OPS.len()],
    /// Prometheus handles (`metrics.rs`).
    metrics: metrics::ServerMetrics,
    /// Block I/O in flight and its service times (`Status`).
    load: Load,
    /// This server's own resync progress, kept by whoever runs it.
    resync: Arc<Mutex<ResyncStatus>>,
    stopped: AtomicBool,
    /// Fault injection: server-to-server traffic is dropped both ways, as if
    /// the link between the two copies of a range were cut.
    peers_cut: AtomicBool,
    /// etcd endpoints deciding metadata ownership (empty: the two copies
    /// decide, `ranges.rs`).
    etcd: Vec<String>,
    /// How to reach etcd safely (TLS, client certificate, user).
    etcd_auth: crate::arbiter::EtcdAuth,
    /// Cache mode: bindings, fetches in flight (`cache.rs`).
    cache: cache::CacheState,
    /// The write-back pusher's connections to the other servers.
    pusher_conns: peer_calls::PeerConns,
    /// Scrub passes over the block data (`scrub.rs`).
    pub(crate) scrubber: Arc<Scrubber>,
    /// Damaged copies recorded stale for resync / found with no other copy
    /// (counted by whoever repairs, `ServerHandle::note_repair`).
    pub(crate) repairs: AtomicU64,
    pub(crate) unrepairable: AtomicU64,
    /// The newest write grant seen per file (`fences.rs`).
    pub(crate) fences: crate::fences::Fences,
    /// Byte-range locks of the files this server owns (`locks.rs`).
    locks: Mutex<morris_proto::locks::LockTable>,
    /// Woken whenever a lock goes (`locking.rs`).
    lock_changed: tokio::sync::Notify,
    /// Files whose copies may differ after a revoked writer (`fencing.rs`).
    diverged: Mutex<Vec<(FileId, u64, u64)>>,
    /// The wall clock, in microseconds, at `started`: write grants are
    /// numbered from it (`LeaseTable::fenced_from`).
    fence_base: u64,
    /// A replacement whose blocks are not yet all recorded stale: it reads
    /// none of them (`replace.rs`).
    rebuilding: AtomicBool,
    /// Who is over a quota, as this server last heard (`quotas.rs`).
    quota: quotas::QuotaVerdict,
}

type Outcome = (Result<Reply, WireError>, Bytes);

fn err(code: ErrorCode, msg: impl Into<String>) -> WireError {
    WireError::new(code, msg)
}

/// Runs blocking work (SQLite, file I/O). On a multi-threaded runtime it runs
/// in place, the worker handing its other tasks to the rest of the pool:
/// no thread hop on the request path. Elsewhere (single-threaded test
/// runtimes) it goes to the blocking pool.
async fn blocking<T, F>(f: F) -> Result<T, WireError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, WireError> + Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(f);
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(err(ErrorCode::Io, format!("server worker failed: {e}"))),
    }
}

/// Runs a metadata store operation right here on the async worker. These are
/// short (one indexed SQLite transaction, no fsync), and handing them to
/// another thread costs more in wake-ups than it saves; block I/O and scans
/// use [`blocking`].
fn metadata<T>(f: impl FnOnce() -> Result<T, WireError>) -> Result<T, WireError> {
    f()
}

/// The inode or file a request is about, for logs.
fn subject(req: &Request) -> Option<FileId> {
    match req {
        Request::AcquireRead { ino }
        | Request::AcquireWrite { ino }
        | Request::SetAttr { ino, .. }
        | Request::GetXattrs { ino }
        | Request::SetXattr { ino, .. }
        | Request::Lock { ino, .. }
        | Request::TestLock { ino, .. }
        | Request::MarkStale { ino, .. }
        | Request::DeleteInode { ino, .. }
        | Request::DropLink { ino, .. }
        | Request::SetOpen { ino, .. }
        | Request::TouchAtime { ino, .. }
        | Request::TouchCtime { ino, .. }
        | Request::Reap { ino, .. } => Some(ino.id),
        Request::NoteLeftover { id, .. } | Request::ResyncAdvance { id, .. } => Some(*id),
        Request::Bind { dir, .. }
        | Request::Unbind { dir }
        | Request::HomeLookup { dir, .. }
        | Request::Seed { dir, .. }
        | Request::Seeds { dir, .. } => Some(dir.id),
        Request::Revalidate { ino } | Request::Detach { ino, .. } => Some(ino.id),
        Request::CreateCached { inode } => Some(inode.id),
        Request::CreateCachedMany { seeds } => seeds.first().map(|s| s.id),
        Request::GetInodes { inos } | Request::AcquireReadMany { inos } => {
            inos.first().map(|h| h.id)
        }
        Request::CreateInodeAt { id, .. } => Some(*id),
        Request::AcquireCached { seed } => Some(seed.id),
        // Kept with the root directory's range.
        Request::SetQuota { .. } | Request::Quotas => Some(morris_proto::ROOT_ID),
        Request::ReadCached { id, .. }
        | Request::FetchCached { id, .. }
        | Request::Evict { id } => Some(*id),
        Request::Release { ino } | Request::GetInode { ino } | Request::Holders { ino } => {
            Some(*ino)
        }
        Request::CreateInode { parent, .. } => Some(*parent),
        Request::Lookup { dir, .. }
        | Request::ReadDir { dir, .. }
        | Request::Link { dir, .. }
        | Request::Unlink { dir, .. }
        | Request::Rename { dir, .. }
        | Request::Exchange { dir, .. } => Some(dir.id),
        Request::Read { id, .. }
        | Request::Write { id, .. }
        | Request::Fallocate { id, .. }
        | Request::Seek { id, .. }
        | Request::Allocated { id, .. }
        | Request::ChunkSums { id, .. }
        | Request::Truncate { id, .. }
        | Request::DeleteData { id } => Some(*id),
        Request::Sync { id } => *id,
        Request::WbEntries { dir, .. } => Some(*dir),
        Request::WbSetHome { home, .. } | Request::WbPlace { home, .. } => Some(home.id),
        Request::WbSeen { id, .. } | Request::WbRebase { id, .. } => Some(*id),
        Request::WbClear { marks } => marks.first().map(|m| m.0),
        Request::WbGoneClear { at, .. } => Some(*at),
        _ => None,
    }
}

impl Server {
    // The parts a server is made of, each built by `start`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: Arc<Store>,
        blocks: Arc<Blocks>,
        data_dir: PathBuf,
        lease_ms: u32,
        etcd: Vec<String>,
        etcd_auth: crate::arbiter::EtcdAuth,
        keys: Keys,
        conn_limits: Arc<ConnLimits>,
        scrubber: Arc<Scrubber>,
    ) -> Server {
        let epoch = loop {
            let e: u64 = rand::random();
            if e != 0 {
                break e;
            }
        };
        // An unreadable mark counts as set: reading none of the blocks is
        // safe, answering zeros for them is not.
        let rebuilding = store.rebuild_pending().unwrap_or(true);
        let started = Instant::now();
        let fence_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Server {
            keys,
            conn_limits,
            store,
            ranges: RwLock::new(None),
            this: OnceLock::new(),
            blocks,
            data_dir,
            lease_ms,
            epoch: AtomicU64::new(epoch),
            started,
            leases: Mutex::new(LeaseState::new(
                LeaseTable::new(Millis::from(lease_ms)).fenced_from(fence_base),
            )),
            sessions: Mutex::new(Sessions::default()),
            seen: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            by_op: std::array::from_fn(|_| AtomicU64::new(0)),
            metrics: metrics::ServerMetrics::new(),
            load: Load::default(),
            resync: Arc::new(Mutex::new(ResyncStatus::default())),
            stopped: AtomicBool::new(false),
            peers_cut: AtomicBool::new(false),
            etcd,
            etcd_auth,
            cache: cache::CacheState::default(),
            pusher_conns: peer_calls::PeerConns::default(),
            scrubber,
            repairs: AtomicU64::new(0),
            unrepairable: AtomicU64::new(0),
            locks: Mutex::new(morris_proto::locks::LockTable::default()),
            lock_changed: tokio::sync::Notify::new(),
            fences: Default::default(),
            diverged: Mutex::new(Vec::new()),
            quota: quotas::QuotaVerdict::default(),
            fence_base,
            rebuilding: AtomicBool::new(rebuilding),
        }
    }

    /// Forgets the extent files deleted since the last call, once their
    /// removal is durable (`Blocks::settle_deletes`). Run once a second.
    pub(crate) async fn settle_deletes(&self) {
        if !self.blocks.has_deletes() {
            return;
        }
        let (blocks, store) = (self.blocks.clone(), self.store.clone());
        if let Err(e) = blocking(move || blocks.settle_deletes(&store)).await {
            warn!(error = %e, "cannot settle deleted extent files yet");
        }
    }

    /// This server's extent files.
    pub(crate) fn blocks(&self) -> &Blocks {
        &self.blocks
    }

    /// Starts a scrub pass whenever the last complete one is `every` old
    /// (never, with `None`); looks once a minute.
    pub(crate) async fn scrub_schedule(self: Arc<Self>, every: Option<Duration>) {
        let Some(every) = every else { return };
        let mut iv = tokio::time::interval(Duration::from_secs(60).min(every));
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            iv.tick().await;
            let Some(vol) = self.store.formatted() else {
                continue;
            };
            // Not on a replacement not yet rebuilt: its comparison would
            // take its empty copies for the first ones.
            if self.scrubber.due(every) && !self.rebuild_pending() {
                self.scrubber.start(
                    self.blocks.clone(),
                    self.store.clone(),
                    vol.descriptor.replicas,
                    self.scrub_peers(),
                    0,
                );
            }
        }
    }

    /// What a scrub pass compares this server's copies with.
    fn scrub_peers(&self) -> Arc<dyn crate::scrub::OtherCopies> {
        Arc::new(scrub_peers::ScrubPeers {
            server: self.this.get().cloned().unwrap_or_default(),
            rt: tokio::runtime::Handle::current(),
        })
    }

    /// Where this server's resync progress is kept (shown by `Status`).
    pub(crate) fn resync_status(&self) -> Arc<Mutex<ResyncStatus>> {
        self.resync.clone()
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Fault injection: drops (or stops dropping) all server-to-server traffic.
    pub(crate) fn cut_peers(&self, cut: bool) {
        self.peers_cut.store(cut, Ordering::SeqCst);
        warn!(cut, "fault injection: link to the other metadata copies");
    }

    /// The ranges kept here; `WrongVolume` before the server is formatted.
    fn ranges(&self) -> Result<Arc<Ranges>, WireError> {
        self.ranges
            .read()
            .clone()
            .ok_or_else(|| err(ErrorCode::WrongVolume, "this server is not formatted"))
    }

    /// Sets up the metadata ranges of a formatted server (at start, or
    /// right after `Format`) and starts shipping the changes of the ranges
    /// it is primary of. `grace`: lease-taking requests wait until then
    /// (ms since start), so leases of a previous life have run out.
    pub(crate) fn init_ranges(self: &Arc<Self>, grace: Millis) -> Result<(), WireError> {
        let _ = self.this.set(Arc::downgrade(self));
        let Some(vol) = self.store.formatted() else {
            return Ok(());
        };
        let k = vol.layout.servers;
        let me = vol.index;
        let mirrored = vol.layout.replicas >= 2 && k >= 2;
        let addr = |i: u32| vol.descriptor.servers[i as usize].clone();
        let arbiter = (mirrored && !self.etcd.is_empty()).then(|| {
            let a = Arc::new(Arbiter {
                cell: OnceLock::new(),
            });
            let (a2, endpoints, uuid) = (a.clone(), self.etcd.clone(), vol.descriptor.uuid);
            let auth = self.etcd_auth.clone();
            let (lease_ms, started) = (self.lease_ms, self.started);
            tokio::spawn(async move {
                loop {
                    match Etcd::connect(&endpoints, &auth, uuid, lease_ms, started).await {
                        Ok(e) => {
                            let _ = a2.cell.set(e.clone());
                            e.keep_alive().await;
                        }
                        Err(e) => {
                            warn!(error = %e, endpoints = ?endpoints, "cannot reach etcd; metadata ranges wait for it");
                            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        }
                    }
                }
            });
            a
        });
        // Copies of each metadata range: one per replica, at most three,
        // at servers r, r+1, r+2 (`ranges.rs`).
        let copies = vol.layout.meta_copies();
        // The other holders of range r, this server's successor first.
        let peers_of = |r: u32| -> Vec<(u32, String)> {
            let pos = (me + k - r) % k;
            (1..copies)
                .map(|j| (r + (pos + j) % copies) % k)
                .map(|s| (s, addr(s)))
                .collect()
        };
        let mut list = Vec::new();
        list.push(Arc::new(Range::open(
            me,
            peers_of(me),
            self.store.clone(),
            self.data_dir.join(replace::range_state_file(0)),
            Role::Primary,
            grace,
            arbiter.clone(),
        )?));
        for back in 1..copies {
            let r = (me + k - back) % k;
            let suffix = if back == 1 {
                String::new()
            } else {
                back.to_string()
            };
            let path = self.data_dir.join(format!("mirror{suffix}.sqlite"));
            let mirror = Store::open(&path).map_err(|e| err(ErrorCode::Io, e.to_string()))?;
            list.push(Arc::new(Range::open(
                r,
                peers_of(r),
                Arc::new(mirror),
                self.data_dir.join(replace::range_state_file(back)),
                Role::Secondary,
                grace,
                arbiter.clone(),
            )?));
        }
        let ranges = Arc::new(Ranges { k, me, list });
        *self.ranges.write() = Some(ranges.clone());
        if mirrored {
            for r in &ranges.list {
                if r.st.lock().role == Role::Primary {
                    tokio::spawn(self.clone().forward(r.clone()));
                }
            }
        }
        info!(
            range = me,
            mirrored,
            arbiter = if arbiter.is_some() { "etcd" } else { "copies" },
            "metadata ranges ready"
        );
        Ok(())
    }

    fn now_ms(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    /// Refuses every later request and wakes every waiter.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.scrubber.stop();
        self.leases.lock().waiters.clear();
        let mut s = self.sessions.lock();
        s.by_conn.clear();
        s.by_client.clear();
    }

    // -------------------------------------------------------------- dispatch

    async fn handle(self: Arc<Self>, conn: Arc<Conn>, req: Request, payload: Bytes) -> Outcome {
        let op = req.name();
        self.requests.fetch_add(1, Ordering::Relaxed);
        // One look-up serves the counters and the timers (both in
        // `Request::NAMES` order).
        let at = OPS.iter().position(|&n| n == op);
        if let Some(i) = at {
            self.by_op[i].fetch_add(1, Ordering::Relaxed);
        }
        let ino = subject(&req);
        let peer = conn.peer;
        if self.stopped.load(Ordering::SeqCst) {
            return (
                Err(err(ErrorCode::Unavailable, "server is shutting down")),
                Bytes::new(),
            );
        }
        let data = metrics::data_op(&req);
        let sent = payload.len();
        let started = std::time::Instant::now();
        let out = self.dispatch(&conn, req, payload).await;
        self.metrics
            .request(at, op, started.elapsed(), out.0.is_err());
        if let (Some((write, copy)), Ok(_)) = (data, &out.0) {
            let bytes = if write { sent } else { out.1.len() };
            self.metrics.data(write, copy, bytes);
        }
        match &out.0 {
            Ok(_) => debug!(%peer, op, ino, "served"),
            Err(e) if matches!(e.code, ErrorCode::Io | ErrorCode::NoSpace) => {
                warn!(%peer, op, ino, error = %e, "request failed")
            }
            Err(e) => debug!(%peer, op, ino, error = %e, "request refused"),
        }
        out
    }

    async fn dispatch(&self, conn: &Arc<Conn>, req: Request, payload: Bytes) -> Outcome {
        let plain = |r: Result<Reply, WireError>| (r, Bytes::new());
        if req.server_only() && conn.role != KeyRole::Server {
            warn!(peer = %conn.peer, op = req.name(), role = %conn.role,
                "refused: a request only servers send, from a connection with the client key");
            return plain(Err(err(
                ErrorCode::Denied,
                format!(
                    "{} needs the volume key; this connection proved the client key",
                    req.name()
                ),
            )));
        }
        match req {
            Request::Hello {
                volume,
                client_id,
                client_name,
                version,
            } => return plain(self.hello(conn, volume, client_id, client_name, version)),
            Request::Format { descriptor, index } => {
                let store = self.store.clone();
                let gen = random_gen();
                let r = blocking(move || store.format(&descriptor, index, gen)).await;
                if let Ok(FormatOutcome::Formatted) = r {
                    info!(index, "formatted");
                    // Never formatted before: no lease of a previous life to wait out.
                    if let Some(me) = self.this.get().and_then(Weak::upgrade) {
                        if let Err(e) = me.init_ranges(0) {
                            return plain(Err(e));
                        }
                    }
                }
                return plain(r.map(|_| Reply::Ok));
            }
            Request::Replace { descriptor, index } => {
                return plain(self.replace(descriptor, index).await);
            }
            Request::Status => {
                return plain(self.status().await.map(|s| Reply::Status(Box::new(s))))
            }
            Request::Statfs => return plain(self.statfs().await),
            Request::Usage => return plain(self.usage().await),
            _ => {}
        }
        let session = self
            .sessions
            .lock()
            .by_conn
            .get(&conn.id)
            .map(|(s, _)| (s.client_id, s.admin));
        let (client, admin) = match session {
            Some(x) => x,
            None => {
                return plain(Err(err(
                    ErrorCode::Protocol,
                    "send Hello before any other request",
                )))
            }
        };
        if matches!(
            req,
            Request::PeerSync { .. } | Request::Replicate { .. } | Request::SnapshotChunk { .. }
        ) {
            return plain(self.peer_request(req, payload).await);
        }
        if let Request::RaiseFence { id, above } = req {
            let written = self.fences.raise(id, above).await;
            return plain(Ok(Reply::FenceRaised { written }));
        }
        // Lapse or take over first, so nothing is answered under an
        // ownership lease that has run out.
        self.check_ownership();
        let now = self.now_ms();
        if !admin {
            self.leases.lock().table.touch(client, now);
            self.seen.lock().insert(client, now);
        }
        let Some(vol) = self.store.formatted() else {
            return plain(Err(err(
                ErrorCode::WrongVolume,
                "this server is not formatted",
            )));
        };
        if let Some(e) = self.refuse_while_rebuilding(&req) {
            return plain(Err(e));
        }
        // Grace is checked with the request's range, in `metadata_op`.
        if admin && takes_lease(&req) {
            return plain(Err(err(
                ErrorCode::Protocol,
                "an admin session (Hello without a volume) cannot take leases",
            )));
        }
        // Held until the change is done (`fences.rs`).
        let touched = match &req {
            Request::Write {
                id, index, fence, ..
            } => Some((*id, *fence, (*index, *index))),
            Request::Truncate { id, size, fence } => {
                Some((*id, *fence, (vol.layout.block_of(*size).0, u64::MAX)))
            }
            Request::Fallocate {
                id,
                offset,
                len,
                fence,
                ..
            } => Some((
                *id,
                *fence,
                (
                    vol.layout.block_of(*offset).0,
                    vol.layout
                        .block_of(offset.saturating_add(len.saturating_sub(1)))
                        .0,
                ),
            )),
            _ => None,
        };
        let _admitted = match touched {
            Some((id, fence, blocks)) => {
                match self.fences.admit(id, fence, conn.role, blocks).await {
                    Ok(a) => Some(a),
                    Err(e) => return plain(Err(e)),
                }
            }
            None => None,
        };
        match req {
            Request::Read {
                id,
                index,
                replica,
                offset,
                len,
            } => self.data_reply(self.read(&vol, id, index, replica, offset, len).await),
            Request::ReadCached {
                id,
                index,
                replica,
                offset,
                len,
                home,
            } => {
                let r = async {
                    Self::block_pos(&vol, id, index, replica, offset, u64::from(len))?;
                    // Read while the unit is held: it cannot be evicted
                    // between the check and the read.
                    let (_, held) = self.ensure_unit(&vol, id, index, replica, &home).await?;
                    match self.read(&vol, id, index, replica, offset, len).await {
                        // A unit fetched from home that fails its checksum
                        // is fetched again (home has the bytes).
                        Err(e) if e.code == ErrorCode::Corrupt => {
                            drop(held);
                            warn!(
                                id,
                                index,
                                copy = replica,
                                "a cached unit failed its checksum: fetching it from home again"
                            );
                            self.evict_unit(&vol, id, replica, index, 0).await?;
                            let (_, _held) =
                                self.ensure_unit(&vol, id, index, replica, &home).await?;
                            // The damage noted is dropped by the repair loop
                            // (`Blocks::still_damaged`): it is gone now.
                            self.read(&vol, id, index, replica, offset, len).await
                        }
                        r => r,
                    }
                }
                .await;
                self.data_reply(r)
            }
            Request::FetchCached {
                id,
                index,
                replica,
                home,
            } => plain(
                async {
                    Self::block_pos(&vol, id, index, replica, 0, 0)?;
                    let (bytes, _) = self.ensure_unit(&vol, id, index, replica, &home).await?;
                    Ok(Reply::Fetched { bytes })
                }
                .await,
            ),
            Request::Evict { id } => plain(
                self.evict(&vol, id)
                    .await
                    .map(|bytes| Reply::Evicted { bytes }),
            ),
            Request::OpenHome { binding, spec } => {
                self.open_home(binding, spec);
                plain(Ok(Reply::Ok))
            }
            Request::CacheStatus => plain(self.cache_status().map(Reply::Cache)),
            Request::ForgetBinding { binding } => {
                plain(self.forget_binding(binding).await.map(|()| Reply::Ok))
            }
            req @ (Request::WbMarks { .. }
            | Request::WbHomes { .. }
            | Request::WbGone { .. }
            | Request::WbNameOf { .. }) => plain(self.wb_local(&req)),
            Request::PushData {
                binding,
                spec,
                id,
                handle,
                size,
                down,
                stale,
            } => plain(
                self.push_data_here(&vol, binding, spec, id, handle, size, (&down, &stale))
                    .await,
            ),
            Request::Flush { binding } => plain(self.flush(binding).await),
            Request::Scrub { rate, stop } => {
                if stop {
                    self.scrubber.stop();
                } else if self.scrubber.start(
                    self.blocks.clone(),
                    self.store.clone(),
                    vol.descriptor.replicas,
                    self.scrub_peers(),
                    rate,
                ) {
                    info!(rate, "scrub pass asked for");
                }
                plain(Ok(Reply::Ok))
            }
            Request::Localize { id, home, truncate } => plain(
                self.localize(&vol, id, &home, truncate)
                    .await
                    .map(|bytes| Reply::Fetched { bytes }),
            ),
            other => plain(
                self.metadata_op(&vol, client, conn.id, other, payload)
                    .await,
            ),
        }
    }

    /// The answer to a block read: its bytes as payload, with this
    /// server's block I/O load (choice among copies).
    fn data_reply(&self, r: Result<Bytes, WireError>) -> Outcome {
        match r {
            Ok(data) => {
                let load = Reply::Data {
                    queue: u32::try_from(self.load.inflight()).unwrap_or(u32::MAX),
                    service_us: u32::try_from(self.load.service_us().0).unwrap_or(u32::MAX),
                };
                (Ok(load), data)
            }
            Err(e) => (Err(e), Bytes::new()),
        }
    }

    /// Takes `client`'s read lease on `ino` and answers it with the inode
    /// and, when they are few, its extended attributes (read in the
    /// inode's transaction), so that the `getxattr` a listing's `ls -l`
    /// sends for each file needs no request of its own.
    async fn read_leased(
        &self,
        store: Arc<Store>,
        client: ClientId,
        conn_id: u64,
        ino: morris_proto::Handle,
    ) -> Result<Reply, WireError> {
        let ((inode, list), _) = self
            .leased_fenced(client, conn_id, ino, LeaseMode::Read, move || {
                store.get_xattrs(ino)
            })
            .await?;
        Ok(Reply::ReadLeased {
            inode,
            xattrs: leasing::with_lease(list),
        })
    }

    fn check_owner(vol: &Formatted, id: FileId) -> Result<(), WireError> {
        let owner = vol.layout.inode_server(id);
        if owner != vol.index {
            return Err(err(
                ErrorCode::Invalid,
                format!(
                    "inode {id} belongs to server {owner}; this is server {}",
                    vol.index
                ),
            ));
        }
        Ok(())
    }

    /// Checks a block address and returns its position in the extent file.
    fn block_pos(
        vol: &Formatted,
        id: FileId,
        index: u64,
        replica: u8,
        offset: u32,
        len: u64,
    ) -> Result<u64, WireError> {
        let unit = u64::from(vol.layout.unit);
        if u32::from(replica) >= vol.layout.replicas {
            return Err(err(
                ErrorCode::Invalid,
                format!(
                    "copy {replica} asked for; the volume keeps {}",
                    vol.layout.replicas
                ),
            ));
        }
        if index == 0 {
            return Err(err(ErrorCode::Invalid, "block index 0 is the inode"));
        }
        if u64::from(offset) + len > unit {
            return Err(err(
                ErrorCode::Invalid,
                format!("offset {offset} + length {len} passes the {unit}-byte stripe unit"),
            ));
        }
        let end = vol
            .layout
            .block_start(index)
            .saturating_add(u64::from(offset))
            .saturating_add(len);
        if end > MAX_FILE_SIZE || index > MAX_FILE_SIZE / unit + 1 {
            return Err(err(
                ErrorCode::FileTooBig,
                format!("block {index} lies past the largest file size {MAX_FILE_SIZE}"),
            ));
        }
        let server = vol.layout.replica_server(id, index, u32::from(replica));
        if server != vol.index {
            return Err(err(
                ErrorCode::Invalid,
                format!(
                    "copy {replica} of block {index} of file {id} belongs to server {server}; this is server {}",
                    vol.index
                ),
            ));
        }
        Ok(vol.layout.local_offset(index) + u64::from(offset))
    }

    async fn read(
        &self,
        vol: &Formatted,
        id: FileId,
        index: u64,
        replica: u8,
        offset: u32,
        len: u32,
    ) -> Result<Bytes, WireError> {
        let pos = Self::block_pos(vol, id, index, replica, offset, u64::from(len))?;
        let blocks = self.blocks.clone();
        let _busy = self.load.begin(IoKind::Read);
        blocking(move || blocks.read(id, replica, pos, len as usize)).await
    }

    /// Runs a request other than Hello/Format/Status/Statfs/Read on the copy
    /// of the metadata range it concerns (refused with `NotOwner` if this
    /// server does not serve that range now), and answers a change only once
    /// it has reached the range's other copy.
    async fn metadata_op(
        &self,
        vol: &Formatted,
        client: ClientId,
        conn_id: u64,
        req: Request,
        payload: Bytes,
    ) -> Result<Reply, WireError> {
        let ranges = self.ranges()?;
        let now = self.now_ms();
        match &req {
            Request::ScanInodes { .. }
            | Request::ScanEntries { .. }
            | Request::ScanStale { .. }
            | Request::ScanOrphans { .. } => {
                return self.scan_ranges(&ranges, req).await;
            }
            Request::Release { ino } => {
                self.release(client, *ino);
                return Ok(Reply::Ok);
            }
            Request::ScanRange { range, after, max } => {
                // Only from the copy serving the range: another (one that
                // is behind, or empty) would answer a short list.
                let store = ranges.serving_id(FileId::from(*range), now)?.store.clone();
                let (after, max) = (*after, *max);
                return blocking(move || store.scan_inodes(after, max))
                    .await
                    .map(Reply::Inodes);
            }
            _ => {}
        }
        let range = match &req {
            Request::CreateInode { .. } | Request::ReserveIds { .. } => {
                match ranges.home().refusal(now) {
                    None => Some(ranges.home().clone()),
                    Some(e) => return Err(e),
                }
            }
            Request::AcquireRead { .. }
            | Request::AcquireWrite { .. }
            | Request::GetInode { .. }
            | Request::GetInodes { .. }
            | Request::AcquireReadMany { .. }
            | Request::Holders { .. }
            | Request::CreateInodeAt { .. }
            | Request::SetAttr { .. }
            | Request::GetXattrs { .. }
            | Request::SetXattr { .. }
            | Request::Lock { .. }
            | Request::TestLock { .. }
            | Request::MarkStale { .. }
            | Request::NoteLeftover { .. }
            | Request::ResyncAdvance { .. }
            | Request::DeleteInode { .. }
            | Request::Lookup { .. }
            | Request::ReadDir { .. }
            | Request::Link { .. }
            | Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::Exchange { .. }
            | Request::DropLink { .. }
            | Request::SetOpen { .. }
            | Request::Reap { .. }
            | Request::Bind { .. }
            | Request::Unbind { .. }
            | Request::SetQuota { .. }
            | Request::Quotas
            | Request::HomeLookup { .. }
            | Request::Seed { .. }
            | Request::Seeds { .. }
            | Request::CreateCached { .. }
            | Request::CreateCachedMany { .. }
            | Request::AcquireCached { .. }
            | Request::Revalidate { .. }
            | Request::Detach { .. }
            | Request::WbEntries { .. }
            | Request::WbSetHome { .. }
            | Request::WbPlace { .. }
            | Request::WbSeen { .. }
            | Request::WbRebase { .. }
            | Request::WbGoneClear { .. }
            | Request::WbClear { .. } => match subject(&req) {
                Some(id) => Some(ranges.serving_id(id, now)?.clone()),
                None => None,
            },
            _ => None,
        };
        let mutating = matches!(
            req,
            Request::CreateInode { .. }
                | Request::ReserveIds { .. }
                | Request::CreateInodeAt { .. }
                | Request::SetAttr { .. }
                | Request::TouchAtime { .. }
                | Request::TouchCtime { .. }
                | Request::SetXattr { .. }
                | Request::MarkStale { .. }
                | Request::NoteLeftover { .. }
                | Request::ResyncAdvance { .. }
                | Request::DeleteInode { .. }
                | Request::Link { .. }
                | Request::Unlink { .. }
                | Request::Rename { .. }
                | Request::Exchange { .. }
                | Request::DropLink { .. }
                | Request::SetOpen { .. }
                | Request::Reap { .. }
                | Request::Bind { .. }
                | Request::Unbind { .. }
                | Request::SetQuota { .. }
                | Request::HomeLookup { .. }
                | Request::CreateCached { .. }
                | Request::CreateCachedMany { .. }
                | Request::AcquireCached { .. }
                | Request::Revalidate { .. }
                | Request::Detach { .. }
                | Request::WbSetHome { .. }
                | Request::WbPlace { .. }
                | Request::WbSeen { .. }
                | Request::WbRebase { .. }
                | Request::WbGoneClear { .. }
                | Request::WbClear { .. }
        );
        let Some(range) = range else {
            return self
                .metadata_inner(vol, self.store.clone(), client, conn_id, req, payload)
                .await;
        };
        // Locks held before a restart or takeover are asked for again
        // during the grace period, before anyone else's.
        let reclaim = matches!(req, Request::Lock { reclaim: true, .. });
        if takes_lease(&req) && !reclaim {
            if let Some(left) = range.grace_left(now) {
                return Err(err(
                    ErrorCode::Grace,
                    format!("lease grace period ends in {left} ms"),
                ));
            }
        }
        let rvol = range.store.formatted().ok_or_else(|| {
            err(
                ErrorCode::NotOwner,
                format!("metadata range {} has no copy here yet", range.range),
            )
        })?;
        // The first page of a cached directory may have brought its names
        // from home: if anything was stored meanwhile, its copies get it
        // before the names are shown.
        let listing = matches!(req, Request::ReadDir { cookie: 0, .. });
        let seq_before = range.store.committed_seq();
        let reply = self
            .metadata_inner(&rvol, range.store.clone(), client, conn_id, req, payload)
            .await?;
        let filled = listing && range.store.committed_seq() != seq_before;
        if (mutating || filled) && !range.peers.is_empty() {
            self.wait_replicated(&range, range.store.committed_seq())
                .await?;
        }
        Ok(reply)
    }

    /// `ScanInodes`, `ScanEntries`, `ScanStale` over every range this
    /// server serves, merged in key order (`merge_pages`).
    async fn scan_ranges(&self, ranges: &Ranges, req: Request) -> Result<Reply, WireError> {
        let live = self.liveness();
        let stores: Vec<Arc<Store>> = ranges
            .serving(self.now_ms())
            .into_iter()
            .map(|r| r.store.clone())
            .collect();
        blocking(move || match req {
            Request::ScanInodes { after, max } => {
                let pages = stores
                    .iter()
                    .map(|s| s.scan_inodes(after, max))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Reply::Inodes(merge_pages(pages, |i| i.id, max)))
            }
            Request::ScanEntries {
                after_dir,
                after_cookie,
                max,
            } => {
                let pages = stores
                    .iter()
                    .map(|s| s.scan_entries(after_dir, after_cookie, max))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Reply::ScanEntries(merge_pages(
                    pages,
                    |(d, e)| (*d, e.cookie),
                    max,
                )))
            }
            Request::ScanStale { server, after, max } => {
                let pages = stores
                    .iter()
                    .map(|s| s.scan_stale(server, after, max))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Reply::Stale(merge_pages(pages, |(id, _, _)| *id, max)))
            }
            Request::ScanOrphans { after, max } => {
                let pages = stores
                    .iter()
                    .map(|s| s.scan_orphans(after, max, &live))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Reply::Orphans(merge_pages(pages, |o| o.inode.id, max)))
            }
            _ => Err(err(ErrorCode::Protocol, "not a scan")),
        })
        .await
    }

    async fn metadata_inner(
        &self,
        vol: &Formatted,
        store: Arc<Store>,
        client: ClientId,
        conn_id: u64,
        req: Request,
        payload: Bytes,
    ) -> Result<Reply, WireError> {
        self.wait_for_home(&store, &req).await?;
        match req {
            Request::Renew => Ok(Reply::Ok),
            Request::Release { ino } => {
                self.release(client, ino);
                Ok(Reply::Ok)
            }
            Request::SetQuota { limit } => {
                Self::check_owner(vol, morris_proto::ROOT_ID)?;
                metadata(move || store.set_quota(&limit)).map(|()| Reply::Ok)
            }
            Request::Quotas => {
                Self::check_owner(vol, morris_proto::ROOT_ID)?;
                metadata(move || store.quotas()).map(Reply::Quotas)
            }
            Request::AcquireRead { ino } => {
                Self::check_owner(vol, ino.id)?;
                self.read_leased(store, client, conn_id, ino).await
            }
            Request::AcquireReadMany { inos } => {
                for h in &inos {
                    Self::check_owner(vol, h.id)?;
                }
                self.read_leased_many(&store, client, conn_id, &inos)
                    .await
                    .map(Reply::ReadLeasedMany)
            }
            Request::AcquireWrite { ino } => {
                Self::check_owner(vol, ino.id)?;
                let (inode, fence) = self
                    .leased_fenced(client, conn_id, ino, LeaseMode::Write, move || {
                        store.get_handle(ino)
                    })
                    .await?;
                Ok(Reply::Leased { inode, fence })
            }
            Request::Holders { ino } => {
                Self::check_owner(vol, ino)?;
                Ok(Reply::Holders(self.holders(ino)))
            }
            Request::GetInodes { inos } => {
                for h in &inos {
                    Self::check_owner(vol, h.id)?;
                }
                metadata(move || store.get_inodes(&inos)).map(Reply::Inodes)
            }
            Request::GetInode { ino } => {
                Self::check_owner(vol, ino)?;
                match metadata(move || store.get_inode(ino))? {
                    Some(i) => Ok(Reply::Inode(i)),
                    None => Err(err(ErrorCode::NotFound, format!("no inode {ino}"))),
                }
            }
            Request::CreateInode {
                parent,
                attr,
                target,
                home,
                op,
                xattrs,
            } => {
                let gen = random_gen();
                let op = OpKey::new(client, op);
                self.check_inode_quota_unless_repeat(&store, op, &attr)?;
                let inode = metadata(move || {
                    store.create_inode_with(
                        parent,
                        &attr,
                        target.as_deref(),
                        gen,
                        home,
                        op,
                        &xattrs,
                    )
                })?;
                // A fresh id: nobody else can hold or wait for it.
                let fence = self
                    .lease(client, conn_id, inode.id, LeaseMode::Write)
                    .await?;
                Ok(Reply::Leased { inode, fence })
            }
            Request::ReserveIds { count } => {
                metadata(move || store.reserve_ids(count)).map(Reply::Ids)
            }
            Request::CreateInodeAt {
                id,
                gen,
                parent,
                attr,
                target,
                op,
                xattrs,
            } => {
                Self::check_owner(vol, id)?;
                let op = OpKey::new(client, op);
                self.check_inode_quota_unless_repeat(&store, op, &attr)?;
                let inode = metadata(move || {
                    store.create_inode_at(id, parent, &attr, target.as_deref(), gen, op, &xattrs)
                })?;
                // Reserved for this client: nobody else has named it.
                let fence = self
                    .lease(client, conn_id, inode.id, LeaseMode::Write)
                    .await?;
                Ok(Reply::Leased { inode, fence })
            }
            Request::SetAttr { ino, set } => {
                Self::check_owner(vol, ino.id)?;
                self.leased(client, conn_id, ino, LeaseMode::Write, move || {
                    store.set_attr(ino, &set)
                })
                .await
                .map(Reply::Inode)
            }
            Request::TouchAtime { ino, atime } => {
                Self::check_owner(vol, ino.id)?;
                metadata(move || store.touch_atime(ino, atime))?;
                Ok(Reply::Ok)
            }
            Request::TouchCtime { ino, ctime } => {
                Self::check_owner(vol, ino.id)?;
                metadata(move || store.touch_ctime(ino, ctime))?;
                Ok(Reply::Ok)
            }
            Request::Lock {
                ino,
                owner,
                pid,
                start,
                end,
                kind,
                wait,
                reclaim,
            } => {
                Self::check_owner(vol, ino.id)?;
                // A reclaim does not wait: the lock is there to be had, or lost.
                let wait = wait && !reclaim;
                self.lock(&store, client, ino, (owner, pid), (start, end), kind, wait)
                    .await
            }
            Request::TestLock {
                ino,
                owner,
                start,
                end,
                write,
            } => {
                Self::check_owner(vol, ino.id)?;
                self.test_lock(&store, client, ino, owner, (start, end), write)
            }
            Request::GetXattrs { ino } => {
                Self::check_owner(vol, ino.id)?;
                self.leased(client, conn_id, ino, LeaseMode::Read, move || {
                    store.get_xattrs(ino).map(|(_, list)| list)
                })
                .await
                .map(Reply::Xattrs)
            }
            Request::SetXattr {
                ino,
                name,
                value,
                how,
                op,
            } => {
                Self::check_owner(vol, ino.id)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, ino, LeaseMode::Write, move || {
                    store.set_xattr(ino, &name, value.as_deref(), how, op)
                })
                .await
                .map(Reply::Inode)
            }
            Request::MarkStale { ino, server, from } => {
                Self::check_owner(vol, ino.id)?;
                self.leased(client, conn_id, ino, LeaseMode::Write, move || {
                    store.mark_stale(ino, server, from)
                })
                .await
                .map(Reply::Inode)
            }
            Request::NoteLeftover { id, server } => {
                Self::check_owner(vol, id)?;
                blocking(move || store.note_leftover(id, server)).await?;
                Ok(Reply::Ok)
            }
            Request::ScanStale { server, after, max } => {
                blocking(move || store.scan_stale(server, after, max))
                    .await
                    .map(Reply::Stale)
            }
            Request::ResyncAdvance {
                id,
                server,
                seq,
                upto,
            } => {
                Self::check_owner(vol, id)?;
                blocking(move || store.resync_advance(id, server, seq, upto)).await?;
                Ok(Reply::Ok)
            }
            Request::DeleteInode { ino, op } => {
                Self::check_owner(vol, ino.id)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, ino, LeaseMode::Write, move || {
                    store.delete_inode(ino, op)
                })
                .await?;
                // The inode is gone; so is any lease on it.
                self.release(client, ino.id);
                Ok(Reply::Ok)
            }
            Request::Lookup { dir, name } => {
                Self::check_owner(vol, dir.id)?;
                check_name(&name)?;
                self.leased(client, conn_id, dir, LeaseMode::Read, move || {
                    store.lookup(dir, &name)
                })
                .await
                .map(Reply::Entry)
            }
            Request::ReadDir { dir, cookie, max } => {
                Self::check_owner(vol, dir.id)?;
                let mut filling = self.fill_progress(dir.id);
                let st = store.clone();
                let mut page = self
                    .leased(client, conn_id, dir, LeaseMode::Read, move || {
                        st.read_dir_page(dir, cookie, max)
                    })
                    .await?;
                // A cached directory not listed whole: the first page of a
                // listing has it listed from home first (or follows the
                // listing under way), then reads the page again.
                if cookie == 0 && page.unlisted && filling.is_none() {
                    self.home_list(store.clone(), dir).await?;
                    filling = self.fill_progress(dir.id);
                    let st = store.clone();
                    page = metadata(move || st.read_dir_page(dir, cookie, max))?;
                }
                // Well within the client's patience for an answer.
                let wait = Duration::from_millis(u64::from(self.lease_ms)).min(LIST_PAGE_WAIT);
                self.read_dir_filling(store, dir, (cookie, max), page, filling, wait)
                    .await
                    .map(|(entries, eof)| Reply::Entries { entries, eof })
            }
            Request::Link {
                dir,
                name,
                child,
                kind,
                replace,
                op,
            } => {
                Self::check_owner(vol, dir.id)?;
                check_new_name(&name)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, dir, LeaseMode::Write, move || {
                    store.link(dir, &name, child, kind, replace, op)
                })
                .await
                .map(|(entry, dir)| Reply::Removed { entry, dir })
            }
            Request::Unlink {
                dir,
                name,
                expect,
                op,
            } => {
                Self::check_owner(vol, dir.id)?;
                check_name(&name)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, dir, LeaseMode::Write, move || {
                    store.unlink(dir, &name, expect, op)
                })
                .await
                .map(|(entry, dir)| Reply::Removed { entry, dir })
            }
            Request::Rename {
                dir,
                from,
                to,
                replace,
                op,
            } => {
                Self::check_owner(vol, dir.id)?;
                check_name(&from)?;
                check_new_name(&to)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, dir, LeaseMode::Write, move || {
                    store.rename(dir, &from, &to, replace, op)
                })
                .await
                .map(|(entry, dir)| Reply::Removed { entry, dir })
            }
            Request::Exchange { dir, a, b, op } => {
                Self::check_owner(vol, dir.id)?;
                let op = OpKey::new(client, op);
                self.leased(client, conn_id, dir, LeaseMode::Write, move || {
                    store.exchange(dir, &a, &b, op)
                })
                .await
                .map(|dir| Reply::Removed { entry: None, dir })
            }
            Request::Write {
                id,
                index,
                replica,
                offset,
                sync,
                ..
            } => {
                let pos = Self::block_pos(vol, id, index, replica, offset, payload.len() as u64)?;
                self.check_reserve(payload.len() as u64)?;
                let blocks = self.blocks.clone();
                let _busy = self.load.begin(IoKind::Write);
                blocking(move || blocks.write(id, replica, pos, &payload, sync, &store)).await?;
                Ok(Reply::Ok)
            }
            Request::Fallocate {
                id,
                offset,
                len,
                punch,
                ..
            } => {
                self.fallocate_here(vol, &store, id, (offset, len), punch)
                    .await
            }
            Request::Seek {
                id,
                replica,
                from,
                hole,
            } => self.seek_here(vol, id, replica, from, hole).await,
            Request::Allocated { id, replica } => {
                if u32::from(replica) >= vol.layout.replicas.max(1) {
                    return Err(WireError::new(ErrorCode::Invalid, "no such copy"));
                }
                let blocks = self.blocks.clone();
                blocking(move || blocks.allocated_copy(id, replica))
                    .await
                    .map(|bytes| Reply::Allocated(bytes.unwrap_or(0)))
            }
            Request::ChunkSums {
                id,
                replica,
                first,
                max,
            } => {
                let blocks = self.blocks.clone();
                let max = max.min(crate::scrub::SUMS_PAGE);
                blocking(move || {
                    let (len, entries) = blocks.chunk_sums(id, replica, first, max)?;
                    let cached = store.has_cache_units(id)?;
                    Ok(Reply::ChunkSums {
                        len,
                        entries,
                        cached,
                    })
                })
                .await
            }
            Request::Truncate { id, size, .. } => {
                self.truncate_here(vol, id, size).await?;
                Ok(Reply::Ok)
            }
            Request::DeleteData { id } => {
                let blocks = self.blocks.clone();
                let copies = vol.descriptor.replicas;
                blocking(move || {
                    // A cached file's records of the units it held go
                    // first: should the object come back (same id, same
                    // generation), its units are fetched again, never
                    // read from data that is gone.
                    if morris_proto::home::is_cache_id(id) {
                        store.drop_units_of(id)?;
                    }
                    blocks.delete(id, copies)
                })
                .await?;
                Ok(Reply::Ok)
            }
            Request::Sync { id } => {
                let blocks = self.blocks.clone();
                let copies = vol.descriptor.replicas;
                // Every metadata copy kept here (the home store first).
                let others: Vec<Arc<Store>> = self
                    .ranges()
                    .map(|r| r.list.iter().skip(1).map(|x| x.store.clone()).collect())
                    .unwrap_or_default();
                blocking(move || {
                    match id {
                        Some(id) => blocks.sync_file(id, copies)?,
                        None => blocks.sync_all()?,
                    }
                    store.sync()?;
                    for s in others {
                        s.sync()?;
                    }
                    Ok(())
                })
                .await?;
                Ok(Reply::Ok)
            }
            Request::ScanInodes { after, max } | Request::ScanRange { after, max, .. } => {
                blocking(move || store.scan_inodes(after, max))
                    .await
                    .map(Reply::Inodes)
            }
            Request::ScanEntries {
                after_dir,
                after_cookie,
                max,
            } => blocking(move || store.scan_entries(after_dir, after_cookie, max))
                .await
                .map(Reply::ScanEntries),
            Request::ScanData { after, max } => {
                let blocks = self.blocks.clone();
                let copies = vol.descriptor.replicas;
                blocking(move || {
                    let mut out = Vec::new();
                    for id in store.scan_data_files(after, max)? {
                        if let Some(bytes) = blocks.allocated(id, copies)? {
                            out.push((id, bytes));
                        }
                    }
                    Ok(out)
                })
                .await
                .map(Reply::DataFiles)
            }
            Request::DropLink { .. } | Request::SetOpen { .. } | Request::Reap { .. } => {
                self.orphan_op(vol, store, client, conn_id, req).await
            }
            Request::ScanOrphans { after, max } => {
                let live = self.liveness();
                blocking(move || store.scan_orphans(after, max, &live))
                    .await
                    .map(Reply::Orphans)
            }
            Request::Bind { dir, binding } => {
                Self::check_owner(vol, dir.id)?;
                self.bind(store, dir, binding).await.map(Reply::Inode)
            }
            Request::Unbind { dir } => {
                Self::check_owner(vol, dir.id)?;
                self.unbind(store, dir).await.map(Reply::Inode)
            }
            Request::HomeLookup { dir, name } => {
                Self::check_owner(vol, dir.id)?;
                let entry = self.home_lookup(store.clone(), dir, name).await?;
                let seed = match &entry {
                    Some(e) => Self::seed_of(&store, dir, e)?,
                    None => None,
                };
                Ok(Reply::HomeEntry { entry, seed })
            }
            Request::Seed { dir, name } => {
                Self::check_owner(vol, dir.id)?;
                match metadata(|| store.seed(dir, &name))? {
                    Some(i) => Ok(Reply::Inode(i)),
                    None => Err(err(ErrorCode::NotFound, "no seed: not fetched from home")),
                }
            }
            Request::Seeds { dir, cookie } => {
                Self::check_owner(vol, dir.id)?;
                let from = cookie - cookie % morris_proto::messages::SEED_BLOCK;
                let to = from.saturating_add(morris_proto::messages::SEED_BLOCK);
                metadata(|| store.seeds_between(dir, from, to)).map(Reply::Inodes)
            }
            Request::CreateCached { inode } => {
                Self::check_owner(vol, inode.id)?;
                self.create_cached(store, inode).await.map(Reply::Inode)
            }
            Request::CreateCachedMany { seeds } => {
                for s in &seeds {
                    Self::check_owner(vol, s.id)?;
                }
                let made = metadata(|| store.create_cached_many(&seeds))?;
                tracing::debug!(asked = seeds.len(), made, "cached objects made from seeds");
                Ok(Reply::Ok)
            }
            Request::AcquireCached { seed } => {
                Self::check_owner(vol, seed.id)?;
                let ino = seed.handle();
                self.create_cached(store.clone(), seed).await?;
                self.read_leased(store, client, conn_id, ino).await
            }
            Request::Revalidate { ino } => {
                Self::check_owner(vol, ino.id)?;
                self.revalidate(store, ino).await.map(Reply::Inode)
            }
            Request::Detach { ino, truncate } => {
                Self::check_owner(vol, ino.id)?;
                self.detach(store, ino, truncate).await.map(Reply::Inode)
            }
            Request::WbEntries { dir, cookie, max } => {
                Self::check_owner(vol, dir)?;
                let h = metadata(|| store.get_inode(dir))?
                    .ok_or_else(|| err(ErrorCode::NotFound, format!("no directory {dir}")))?
                    .handle();
                let page = metadata(move || store.read_dir_page(h, cookie, max))?;
                Ok(Reply::Entries {
                    entries: page.entries,
                    eof: page.eof,
                })
            }
            Request::WbSetHome {
                binding,
                home,
                seen,
            } => {
                Self::check_owner(vol, home.id)?;
                metadata(move || store.wb_set_home(binding, &home, seen)).map(|()| Reply::Ok)
            }
            Request::WbPlace { binding, home } => {
                Self::check_owner(vol, home.id)?;
                metadata(move || store.wb_place(binding, &home)).map(|()| Reply::Ok)
            }
            Request::WbSeen { id, seen } => {
                Self::check_owner(vol, id)?;
                metadata(move || store.wb_seen(id, seen)).map(|()| Reply::Ok)
            }
            Request::WbRebase {
                binding,
                id,
                count,
                place,
                now,
            } => {
                Self::check_owner(vol, id)?;
                self.wb_rebase(store, binding, id, count, place, now)
                    .await
                    .map(|()| Reply::Ok)
            }
            Request::WbGoneClear { gone, .. } => {
                metadata(move || store.wb_gone_clear(&gone)).map(|()| Reply::Ok)
            }
            Request::WbClear { marks } => {
                metadata(move || store.wb_clear(&marks)).map(|_| Reply::Ok)
            }
            Request::Hello { .. }
            | Request::Format { .. }
            | Request::Replace { .. }
            | Request::Status
            | Request::Statfs
            | Request::Usage
            | Request::Read { .. }
            | Request::ReadCached { .. }
            | Request::FetchCached { .. }
            | Request::Evict { .. }
            | Request::OpenHome { .. }
            | Request::CacheStatus
            | Request::ForgetBinding { .. }
            | Request::WbMarks { .. }
            | Request::WbHomes { .. }
            | Request::WbGone { .. }
            | Request::WbNameOf { .. }
            | Request::PushData { .. }
            | Request::Flush { .. }
            | Request::Scrub { .. }
            | Request::RaiseFence { .. }
            | Request::Localize { .. }
            | Request::PeerSync { .. }
            | Request::Replicate { .. }
            | Request::SnapshotChunk { .. } => {
                Err(err(ErrorCode::Protocol, "request routed wrongly"))
            }
        }
    }

    /// Refuses a data write that would eat into the space kept for metadata:
    /// the last 1 % of the disk (at least 16 MiB or an eighth of a smaller
    /// disk, at most 1 GiB) stays free so that a full volume can still
    /// commit the unlinks that empty it.
    /// At least 16 MiB because the check sees neither the writes admitted
    /// with it nor other processes' (a client keeps up to 8 MiB of a file's
    /// writes in flight, and a `morris up` volume's servers share one
    /// disk): with 1 MiB, writes admitted together filled the disk and the
    /// metadata store then refused the removals that would empty it.
    fn check_reserve(&self, len: u64) -> Result<(), WireError> {
        let (total, free) = self.disk();
        if total == 0 {
            return Ok(());
        }
        let reserve = (total / 100).max((16 << 20).min(total / 8)).min(1 << 30);
        if free < reserve.saturating_add(len) {
            return Err(err(
                ErrorCode::NoSpace,
                format!(
                    "disk nearly full: {free} bytes free, the last {reserve} are kept for metadata"
                ),
            ));
        }
        Ok(())
    }
}

/// Merges pages of a cursor scan, each in key order and each possibly cut
/// short by its store's reply budget, into one page: a prefix of the union
/// that ends at the smallest last key of any page (so nothing a shorter page
/// left out is skipped by the caller's next cursor), at most `max` items and
/// about one store reply's worth of bytes.
fn merge_pages<T: serde::Serialize, K: Ord + Copy>(
    pages: Vec<Vec<T>>,
    key: impl Fn(&T) -> K,
    max: u32,
) -> Vec<T> {
    let cutoff = pages.iter().filter_map(|p| p.last().map(&key)).min();
    let Some(cutoff) = cutoff else {
        return Vec::new();
    };
    let mut all: Vec<T> = pages
        .into_iter()
        .flatten()
        .filter(|x| key(x) <= cutoff)
        .collect();
    all.sort_by_key(|x| key(x));
    let mut bytes = 0usize;
    let mut keep = 0usize;
    for x in &all {
        bytes += postcard::to_stdvec(x).map_or(64, |v| v.len());
        if keep > 0 && (bytes > MERGED_BUDGET || keep >= max.max(1) as usize) {
            break;
        }
        keep += 1;
    }
    all.truncate(keep);
    all
}

/// Most bytes of one merged scan reply (below the protocol's header limit).
const MERGED_BUDGET: usize = 768 << 10;

/// A random non-zero generation number.
fn random_gen() -> u32 {
    loop {
        let g: u32 = rand::random();
        if g != 0 {
            return g;
        }
    }
}

impl Service for Server {
    fn call(self: Arc<Self>, conn: Arc<Conn>, req: Request, payload: Bytes) -> ServiceFuture {
        Box::pin(self.handle(conn, req, payload))
    }

    fn disconnected(&self, conn: &Conn) {
        self.disconnect(conn);
    }

    fn max_frame(&self, role: KeyRole) -> usize {
        // Servers send metadata snapshots and changesets in big pieces;
        // clients send at most one block and a header.
        match (role, self.store.formatted()) {
            (KeyRole::Client, Some(f)) => f.descriptor.stripe_unit as usize + (2 << 20),
            _ => morris_proto::frame::MAX_FRAME,
        }
    }
}
