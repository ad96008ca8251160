//! Two connections per stripe server: connect, hello, reconnect, retry, renew.
//!
//! Block reads and writes travel on a server's *data* connection, everything
//! else (metadata, leases, `Renew`, recalls pushed by the server) on its
//! *control* connection. A loaded link queues megabytes of block replies in
//! the server's socket; on one shared connection a `Renew` answer waited
//! behind them for longer than a lease, and every lease from that server
//! lapsed (the hot-spot benchmark, docs/benchmarks.md). Both connections
//! are sessions of the same client id, so the server keeps one lease table
//! entry for them; pushes are taken from the control connection only.
//!
//! Every successful answer from server `i` records the instant its request was
//! *sent*; the client's leases on `i` are valid until that instant plus the
//! lease duration (less a margin). The server counts from when it *received*
//! the request, which is later, so the client always gives a lease up first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use morris_proto::auth::{Key, Keys};
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{ErrorCode, Push, Reply, Request, VolumeDescriptor, PROTOCOL_VERSION};
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::metrics::PoolMetrics;
use crate::{Error, Result};

impl From<RpcError> for Error {
    fn from(e: RpcError) -> Self {
        Error::new(e.code(), e.to_string())
    }
}

/// Which of a server's two connections a request travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Control,
    Data,
}

impl Lane {
    fn of(req: &Request) -> Lane {
        match req {
            Request::Read { .. }
            | Request::Write { .. }
            | Request::ReadCached { .. }
            | Request::FetchCached { .. } => Lane::Data,
            _ => Lane::Control,
        }
    }
}

/// One connection of a slot, made on first use and again after it closes.
#[derive(Default)]
struct Link {
    current: RwLock<Option<Arc<RpcClient>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl Link {
    fn open(&self) -> Option<Arc<RpcClient>> {
        self.current
            .read()
            .as_ref()
            .filter(|c| !c.is_closed())
            .cloned()
    }
}

struct Slot {
    addr: String,
    control: Link,
    data: Link,
    epoch: AtomicU64,
    /// Trust term of this server's leases: bumped when the server restarts
    /// (new epoch) or when it has not answered for a lease time (its leases
    /// may have been given to others). Cached leases carry the term they were
    /// granted in and are worthless in any other.
    term: AtomicU64,
    last_ok: AtomicU64,
    /// A renewal of this server is in flight (at most one at a time).
    renewing: std::sync::atomic::AtomicBool,
    /// When a copy request to this server last failed for want of an
    /// answer (ns since the pool started; 0: not since it last answered).
    down_since: AtomicU64,
    /// When a bounded metadata request there (`CreateInode`, `ScanStale`)
    /// last got no answer in time (0: not since it was last heard from).
    slow_since: AtomicU64,
    /// When connecting to this server was first refused since it last
    /// answered (ns since the pool started; 0: it answers).
    refused_since: AtomicU64,
}

/// How long copy requests to a server that just failed to answer fail at
/// once, without trying (`Pool::recently_down`): one cut-off server costs
/// the writes of each new file one timeout per this period, not one each.
const DOWN_HOLD: Duration = Duration::from_secs(10);

/// How long block requests wait for a server that refuses connections (a
/// restart takes about this long); once it has refused for longer, they
/// fail at once — with one copy there is nothing else to read — until it
/// answers again. Metadata requests wait longer: their range may be taken
/// over by a copy (`meta_window`).
const REFUSED_GRACE: Duration = Duration::from_secs(2);

/// The lease a data change (block write, truncate) is made under: it is
/// sent, and sent again after a lost connection, only while that lease may
/// still be trusted. A client stopped or cut off for longer than the trust
/// limit must not land a change the next holder may already have
/// overwritten (`Pool::call_fenced`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fence {
    /// The server that granted the lease.
    pub owner: u32,
    /// Its lease term when granted (`Slot::term`).
    pub term: u64,
}

/// Called with a server index whose lease table was lost (new epoch).
pub(crate) type EpochHook = Box<dyn Fn(u32) + Send + Sync>;

/// The connections of one client to every server of the volume.
pub(crate) struct Pool {
    uuid: Uuid,
    client_id: u64,
    name: String,
    /// What this client proves on each new connection (read at each one:
    /// a rotated key file takes effect on the next reconnect).
    keys: Keys,
    slots: Vec<Slot>,
    lease: Duration,
    start: Instant,
    push_tx: mpsc::UnboundedSender<(u32, Push)>,
    counters: Mutex<HashMap<&'static str, u64>>,
    /// Prometheus handles: each request's time, bytes by server.
    metrics: PoolMetrics,
    epoch_hook: OnceLock<EpochHook>,
    retry_window: Duration,
    /// Copies of each metadata range: range r is served by one of servers
    /// r .. r + meta_copies - 1 (1: not mirrored).
    meta_copies: u32,
    /// Which server last served each metadata range (`call_range`).
    route: Vec<AtomicU32>,
    /// How long a metadata request keeps looking for its range's server:
    /// long enough for a takeover (ownership lease, margin, grace).
    meta_window: Duration,
    /// The next operation id (exactly-once requests).
    next_op: AtomicU64,
    /// Renew every server, connected or not: this client keeps open
    /// records, which count only while it is heard from (`opens.rs`).
    keep_all: std::sync::atomic::AtomicBool,
}

/// Asks a server for its descriptor without joining the volume (admin hello).
pub(crate) async fn probe(addr: &str, key: &Key) -> Result<(VolumeDescriptor, u32)> {
    // A connection lost during the handshake or before the answer (a
    // server busy or restarting) is tried again a few times; a refused
    // connection or key is not.
    let mut wait = std::time::Duration::from_millis(200);
    let mut attempt = 1;
    let c = loop {
        let lost = match probe_once(addr, key).await {
            Ok(c) => break c,
            Err(e @ morris_proto::net::RpcError::Disconnected(_)) => e,
            Err(
                e @ morris_proto::net::RpcError::Auth {
                    source: morris_proto::auth::HandshakeError::Io(_),
                    ..
                },
            ) => e,
            Err(e) => return Err(e.into()),
        };
        if attempt == 5 {
            return Err(lost.into());
        }
        tracing::debug!(addr, attempt, error = %lost, "probing the volume again");
        tokio::time::sleep(wait).await;
        wait *= 2;
        attempt += 1;
    };
    let (reply, _) = c;
    match reply {
        Reply::Hello {
            descriptor: Some(d),
            lease_ms,
            ..
        } => Ok((d, lease_ms)),
        Reply::Hello {
            descriptor: None, ..
        } => Err(Error::new(
            ErrorCode::WrongVolume,
            format!("server {addr} is not formatted (run `morris format`)"),
        )),
        other => Err(unexpected(&other)),
    }
}

/// One `Hello` on a fresh connection to `addr`.
async fn probe_once(
    addr: &str,
    key: &Key,
) -> std::result::Result<(Reply, Bytes), morris_proto::net::RpcError> {
    let c = RpcClient::connect(addr, key, None).await?;
    c.call(
        &Request::Hello {
            volume: None,
            client_id: rand::random(),
            client_name: "probe".into(),
            version: PROTOCOL_VERSION,
        },
        Bytes::new(),
    )
    .await
}

pub(crate) fn unexpected(r: &Reply) -> Error {
    Error::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))
}

/// Requests that may be sent again after a lost connection without changing
/// their effect: those that read, those that set absolute values, and those
/// that carry an operation id, which the server runs at most once
/// (`morris_proto::messages`, "Exactly once").
fn retryable(req: &Request) -> bool {
    req.op() != 0
        || matches!(
            req,
            Request::Renew
                // (A lost answer only leaves a batch of ids unused.)
                | Request::ReserveIds { .. }
                | Request::Statfs
                | Request::Status
                | Request::AcquireRead { .. }
                | Request::AcquireReadMany { .. }
                | Request::AcquireWrite { .. }
                | Request::Release { .. }
                | Request::GetInode { .. }
                | Request::Lookup { .. }
                | Request::ReadDir { .. }
                | Request::Read { .. }
                | Request::ReadCached { .. }
                | Request::FetchCached { .. }
                | Request::Evict { .. }
                | Request::OpenHome { .. }
                | Request::CacheStatus
                | Request::HomeLookup { .. }
                | Request::Seed { .. }
                | Request::CreateCached { .. }
                | Request::AcquireCached { .. }
                | Request::Revalidate { .. }
                | Request::Write { .. }
                | Request::Truncate { .. }
                | Request::DeleteData { .. }
                | Request::Sync { .. }
                | Request::SetAttr { .. }
                | Request::MarkStale { .. }
                | Request::NoteLeftover { .. }
                | Request::ScanStale { .. }
                | Request::ScanOrphans { .. }
                | Request::GetXattrs { .. }
                | Request::Lock { .. }
                | Request::TestLock { .. }
                | Request::Fallocate { .. }
        )
}

impl Pool {
    pub(crate) fn new(
        desc: &VolumeDescriptor,
        lease_ms: u32,
        name: String,
        keys: Keys,
        push_tx: mpsc::UnboundedSender<(u32, Push)>,
    ) -> Self {
        let lease = Duration::from_millis(u64::from(lease_ms.max(100)));
        Pool {
            uuid: desc.uuid,
            client_id: rand::random(),
            name,
            keys,
            slots: desc
                .servers
                .iter()
                .map(|a| Slot {
                    addr: a.clone(),
                    control: Link::default(),
                    data: Link::default(),
                    epoch: AtomicU64::new(0),
                    term: AtomicU64::new(1),
                    last_ok: AtomicU64::new(0),
                    renewing: std::sync::atomic::AtomicBool::new(false),
                    down_since: AtomicU64::new(0),
                    slow_since: AtomicU64::new(0),
                    refused_since: AtomicU64::new(0),
                })
                .collect(),
            lease,
            start: Instant::now(),
            push_tx,
            counters: Mutex::new(HashMap::new()),
            metrics: PoolMetrics::new(desc.servers.len()),
            epoch_hook: OnceLock::new(),
            retry_window: (lease * 2).max(Duration::from_secs(5)),
            meta_copies: morris_proto::layout::Layout::new(
                desc.servers.len() as u32,
                desc.stripe_unit,
                u32::from(desc.replicas),
            )
            .meta_copies(),
            route: (0..desc.servers.len() as u32).map(AtomicU32::new).collect(),
            meta_window: lease * 4 + Duration::from_secs(5),
            next_op: AtomicU64::new(1),
            keep_all: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A fresh operation id for a request the server must run at most once.
    pub(crate) fn next_op(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the renewal task keeps every server renewed (see `keep_all`).
    pub(crate) fn keep_all(&self, on: bool) {
        self.keep_all.store(on, Ordering::Relaxed);
    }

    pub(crate) fn set_epoch_hook(&self, hook: EpochHook) {
        let _ = self.epoch_hook.set(hook);
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The current lease term of server `i` (see `Slot::term`).
    pub(crate) fn epoch(&self, i: u32) -> u64 {
        self.slots
            .get(i as usize)
            .map(|s| s.term.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    fn trust_limit(&self) -> u64 {
        (self.lease - self.lease / 8).as_nanos() as u64
    }

    /// True while leases granted by server `i` in term `term` may still be used.
    pub(crate) fn lease_valid(&self, i: u32, term: u64) -> bool {
        let Some(s) = self.slots.get(i as usize) else {
            return false;
        };
        if s.term.load(Ordering::SeqCst) != term {
            return false;
        }
        let last = s.last_ok.load(Ordering::SeqCst);
        self.now_ns().saturating_sub(last) < self.trust_limit()
    }

    /// How much longer leases granted by server `i` in term `term` may be
    /// trusted if it never answers again (zero once they may not be).
    pub(crate) fn trust_left(&self, i: u32, term: u64) -> Duration {
        let Some(s) = self.slots.get(i as usize) else {
            return Duration::ZERO;
        };
        if s.term.load(Ordering::SeqCst) != term {
            return Duration::ZERO;
        }
        let since = self
            .now_ns()
            .saturating_sub(s.last_ok.load(Ordering::SeqCst));
        Duration::from_nanos(self.trust_limit().saturating_sub(since))
    }

    /// True if server `i` answered within the last half lease time: a
    /// lease taken as granted by it now stays trusted for a while.
    pub(crate) fn answered_lately(&self, i: u32) -> bool {
        let Some(s) = self.slots.get(i as usize) else {
            return false;
        };
        let last = s.last_ok.load(Ordering::SeqCst);
        last != 0 && self.now_ns().saturating_sub(last) < (self.lease / 2).as_nanos() as u64
    }

    /// Before talking to server `i` again: if it has not answered for a lease
    /// time, whatever leases it granted us may be someone else's now, even if
    /// the next answer makes the clock look fresh again. End their term.
    fn check_lapse(&self, i: u32) {
        let Some(s) = self.slots.get(i as usize) else {
            return;
        };
        let last = s.last_ok.load(Ordering::SeqCst);
        if last == 0 || self.now_ns().saturating_sub(last) < self.trust_limit() {
            return;
        }
        let term = s.term.load(Ordering::SeqCst);
        // Refresh the clock first so that only one caller ends the term.
        if s.last_ok
            .compare_exchange(last, self.now_ns(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            s.term.store(term + 1, Ordering::SeqCst);
            info!(server = i, addr = %s.addr, "no answer for a lease time; dropping its leases");
            ::metrics::counter!("morris_client_lease_lapses_total", "server" => i.to_string())
                .increment(1);
            if let Some(h) = self.epoch_hook.get() {
                h(i);
            }
        }
    }

    /// Opens the connections to every server in the background, so that a
    /// fresh mount's first request to each does not wait for a connection
    /// and its `Hello`. A server that cannot be reached now is connected
    /// to when first needed, as before.
    pub(crate) fn warm_up(self: &Arc<Self>) {
        for i in 0..self.slots.len() as u32 {
            for lane in [Lane::Control, Lane::Data] {
                let pool = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = pool.conn_on(i, lane).await {
                        debug!(server = i, error = %e, "not connected ahead of use");
                    }
                });
            }
        }
    }

    /// The connection to server `i` that `req` travels on.
    async fn conn(&self, i: u32, req: &Request) -> Result<Arc<RpcClient>> {
        self.conn_on(i, Lane::of(req)).await
    }

    /// The connection to server `i` of lane `lane`, made if there is none.
    async fn conn_on(&self, i: u32, lane: Lane) -> Result<Arc<RpcClient>> {
        let slot = self
            .slots
            .get(i as usize)
            .ok_or_else(|| Error::new(ErrorCode::Invalid, format!("no server {i}")))?;
        let link = match lane {
            Lane::Control => &slot.control,
            Lane::Data => &slot.data,
        };
        if let Some(c) = link.open() {
            return Ok(c);
        }
        let _g = link.connecting.lock().await;
        if let Some(c) = link.open() {
            return Ok(c);
        }
        let c = if lane == Lane::Control {
            let (ptx, mut prx) = mpsc::unbounded_channel::<Push>();
            let c = RpcClient::connect(&slot.addr, &self.keys.credential(), Some(ptx)).await?;
            let main = self.push_tx.clone();
            tokio::spawn(async move {
                while let Some(p) = prx.recv().await {
                    if main.send((i, p)).is_err() {
                        break;
                    }
                }
            });
            c
        } else {
            // The server pushes recalls on every connection of a client;
            // the copy on the data connection may arrive late, behind
            // block replies, and would recall a lease granted since.
            RpcClient::connect(&slot.addr, &self.keys.credential(), None).await?
        };
        let c = Arc::new(c);
        let sent = self.now_ns();
        let (reply, _) = c
            .call(
                &Request::Hello {
                    volume: Some(self.uuid),
                    client_id: self.client_id,
                    client_name: self.name.clone(),
                    version: PROTOCOL_VERSION,
                },
                Bytes::new(),
            )
            .await?;
        let Reply::Hello { epoch, index, .. } = reply else {
            return Err(unexpected(&reply));
        };
        if index != Some(i) {
            return Err(Error::new(
                ErrorCode::WrongVolume,
                format!(
                    "server {} answers as index {index:?}, expected {i}",
                    slot.addr
                ),
            ));
        }
        let old = slot.epoch.swap(epoch, Ordering::SeqCst);
        if old != 0 && old != epoch {
            slot.term.fetch_add(1, Ordering::SeqCst);
            info!(server = i, addr = %slot.addr, "server restarted; dropping its leases");
            if let Some(h) = self.epoch_hook.get() {
                h(i);
            }
        }
        slot.last_ok.fetch_max(sent, Ordering::SeqCst);
        slot.refused_since.store(0, Ordering::Relaxed);
        debug!(server = i, addr = %slot.addr, ?lane, "connected");
        *link.current.write() = Some(c.clone());
        Ok(c)
    }

    /// Sends `req` to server `i`; retries idempotent requests across reconnects
    /// and every request through a restarted server's grace period.
    pub(crate) async fn call(
        &self,
        i: u32,
        req: Request,
        payload: Bytes,
    ) -> Result<(Reply, Bytes)> {
        self.call_fenced(i, req, payload, None).await
    }

    /// Fails with `NoLease` if the lease `fence` names may no longer be
    /// trusted: what was to be sent under it is not sent.
    fn check_fence(&self, fence: Option<Fence>, i: u32, req: &Request) -> Result<()> {
        match fence {
            Some(f) if !self.lease_valid(f.owner, f.term) => {
                warn!(
                    server = i,
                    op = req.name(),
                    owner = f.owner,
                    "not sent: the lease it was made under may have passed to another client"
                );
                Err(Error::new(
                    ErrorCode::NoLease,
                    format!(
                        "{} not sent: the file's lease (server {}) lapsed before it could be",
                        req.name(),
                        f.owner
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// [`Pool::call`] for a change made under the lease `fence`: each
    /// sending (the first, and again after a lost connection) first checks
    /// that the lease may still be trusted.
    pub(crate) async fn call_fenced(
        &self,
        i: u32,
        req: Request,
        payload: Bytes,
        fence: Option<Fence>,
    ) -> Result<(Reply, Bytes)> {
        *self.counters.lock().entry(req.name()).or_insert(0) += 1;
        tracing::trace!(server = i, op = req.name(), ?req, "call");
        let deadline = Instant::now() + self.retry_window;
        let mut backoff = Duration::from_millis(20);
        loop {
            self.check_fence(fence, i, &req)?;
            self.check_lapse(i);
            let conn = match self.conn(i, &req).await {
                Ok(c) => c,
                Err(e) => {
                    if Lane::of(&req) == Lane::Data && self.refused_for(i, &e) > REFUSED_GRACE {
                        debug!(server = i, op = req.name(), "server down: failing at once");
                        return Err(e);
                    }
                    // Nothing was sent: any request may wait for the server.
                    if Instant::now() < deadline {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                        continue;
                    }
                    return Err(e);
                }
            };
            let sent = self.now_ns();
            match self.timed(i, &conn, &req, payload.clone()).await {
                Ok(r) => {
                    self.touch(i, sent);
                    return Ok(r);
                }
                Err(RpcError::Remote(w)) if w.code == ErrorCode::Grace => {
                    self.touch(i, sent);
                    if Instant::now() >= deadline {
                        return Err(Error::new(w.code, w.message));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(RpcError::Remote(w)) if w.code == ErrorCode::HomeDown => {
                    // `--on-disconnect block`: the change waits for home,
                    // however long it takes.
                    self.touch(i, sent);
                    home_down_wait(req.name(), &w.message).await;
                }
                Err(RpcError::Remote(w)) => {
                    self.touch(i, sent);
                    return Err(Error::new(w.code, w.message));
                }
                Err(e @ RpcError::Disconnected(_)) => {
                    warn!(server = i, op = req.name(), "connection lost");
                    if retryable(&req) && Instant::now() < deadline {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                        continue;
                    }
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The server that serves metadata range `range`, as far as this client
    /// knows (on a mirrored volume: the range's home or one of the next servers).
    pub(crate) fn range_server(&self, range: u32) -> u32 {
        self.route
            .get(range as usize)
            .map_or(range, |r| r.load(Ordering::Relaxed))
    }

    /// Sends a metadata request about range `range` to the server that
    /// serves it; returns that server with the answer. On a mirrored volume
    /// a server that cannot be reached, closes the connection, or answers
    /// `NotOwner` is followed by the range's next copy, round its copies
    /// (with backoff) for up to a takeover's time. Requests that are not
    /// idempotent are not sent again after a lost connection (the caller
    /// settles them).
    pub(crate) async fn call_range(
        &self,
        range: u32,
        req: Request,
        payload: Bytes,
    ) -> Result<(u32, Reply, Bytes)> {
        let k = self.slots.len() as u32;
        if self.meta_copies < 2 || range >= k {
            let (r, p) = self.call(range, req, payload).await?;
            return Ok((range, r, p));
        }
        *self.counters.lock().entry(req.name()).or_insert(0) += 1;
        let deadline = Instant::now() + self.meta_window;
        let mut backoff = Duration::from_millis(20);
        // The next copy of the range after `from`, round its holders.
        let switch = |from: u32| {
            let pos = (from + k - range) % k;
            let to = (range + (pos + 1) % self.meta_copies) % k;
            if let Some(r) = self.route.get(range as usize) {
                let _ = r.compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
            }
        };
        loop {
            let s = self.range_server(range);
            self.check_lapse(s);
            let failure = match self.conn(s, &req).await {
                Err(e) => e,
                Ok(conn) => {
                    let sent = self.now_ns();
                    // A server that stays silent (hung, stopped, cut off)
                    // is left for the other copy after the longest a
                    // request may legitimately wait there (a recall).
                    let answer = tokio::time::timeout(
                        self.lease * 2 + Duration::from_secs(1),
                        self.timed(s, &conn, &req, payload.clone()),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(RpcError::Disconnected(format!(
                            "{} (no answer in time)",
                            self.slots[s as usize].addr
                        )))
                    });
                    match answer {
                        Ok((r, p)) => {
                            self.touch(s, sent);
                            return Ok((s, r, p));
                        }
                        Err(RpcError::Remote(w)) => {
                            self.touch(s, sent);
                            match w.code {
                                ErrorCode::Grace => {}
                                ErrorCode::HomeDown => {
                                    home_down_wait(req.name(), &w.message).await;
                                    continue;
                                }
                                // Not serving the range (or shutting down).
                                ErrorCode::NotOwner | ErrorCode::Unavailable => switch(s),
                                _ => return Err(Error::new(w.code, w.message)),
                            }
                            Error::new(w.code, w.message)
                        }
                        Err(e @ RpcError::Disconnected(_)) => {
                            if !retryable(&req) {
                                return Err(e.into());
                            }
                            switch(s);
                            e.into()
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            if matches!(
                failure.code,
                ErrorCode::Unavailable | ErrorCode::WrongVolume
            ) {
                // Not reachable, or a process there that holds nothing of
                // this volume (an empty server not yet made a member): its
                // range may have moved to the other copy.
                switch(s);
            }
            if Instant::now() >= deadline {
                return Err(failure);
            }
            debug!(range, server = s, error = %failure, "metadata range: trying again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Sends `req` to server `i` once: no reconnect loop, no waiting out a
    /// restart. For reads that another copy can serve instead.
    pub(crate) async fn call_once(
        &self,
        i: u32,
        req: Request,
        payload: Bytes,
        fence: Option<Fence>,
    ) -> Result<(Reply, Bytes)> {
        *self.counters.lock().entry(req.name()).or_insert(0) += 1;
        self.check_fence(fence, i, &req)?;
        self.check_lapse(i);
        let conn = self.conn(i, &req).await?;
        let sent = self.now_ns();
        match self.timed(i, &conn, &req, payload).await {
            Ok(r) => {
                self.touch(i, sent);
                Ok(r)
            }
            Err(RpcError::Remote(w)) => {
                self.touch(i, sent);
                Err(Error::new(w.code, w.message))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One request on `conn` to server `i`, timed and counted (`metrics.rs`).
    async fn timed(
        &self,
        i: u32,
        conn: &RpcClient,
        req: &Request,
        payload: Bytes,
    ) -> std::result::Result<(Reply, Bytes), RpcError> {
        let started = Instant::now();
        let sent = payload.len();
        let out = conn.call(req, payload).await;
        self.metrics
            .call(i, req.name(), started.elapsed(), sent, &out);
        out
    }

    fn touch(&self, i: u32, sent: u64) {
        if let Some(s) = self.slots.get(i as usize) {
            s.last_ok.fetch_max(sent, Ordering::SeqCst);
            s.down_since.store(0, Ordering::Relaxed);
            s.slow_since.store(0, Ordering::Relaxed);
            s.refused_since.store(0, Ordering::Relaxed);
        }
    }

    /// How long server `i` has been refusing connections, given that a
    /// connection attempt just failed with `e` (zero unless it was refused).
    fn refused_for(&self, i: u32, e: &Error) -> Duration {
        let Some(s) = self.slots.get(i as usize) else {
            return Duration::ZERO;
        };
        if e.code != ErrorCode::Unavailable {
            return Duration::ZERO;
        }
        let now = self.now_ns().max(1);
        let since =
            match s
                .refused_since
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(t) => t,
            };
        Duration::from_nanos(now.saturating_sub(since))
    }

    /// Records that a copy request to server `i` got no answer.
    pub(crate) fn mark_down(&self, i: u32) {
        if let Some(s) = self.slots.get(i as usize) {
            s.down_since.store(self.now_ns().max(1), Ordering::Relaxed);
        }
    }

    /// Records that a bounded metadata request at server `i` got no answer
    /// in time. A server whose metadata range waits for a silent copy
    /// answers those late but its block writes at once, so this is not
    /// [`Pool::mark_down`], which makes copy writes pass the server over.
    pub(crate) fn mark_metadata_slow(&self, i: u32) {
        if let Some(s) = self.slots.get(i as usize) {
            s.slow_since.store(self.now_ns().max(1), Ordering::Relaxed);
        }
    }

    /// True if a bounded metadata request at server `i` got no answer
    /// within the last `DOWN_HOLD` and nothing has been heard from it since.
    pub(crate) fn recently_metadata_slow(&self, i: u32) -> bool {
        let Some(s) = self.slots.get(i as usize) else {
            return false;
        };
        let since = s.slow_since.load(Ordering::Relaxed);
        since != 0 && self.now_ns().saturating_sub(since) < DOWN_HOLD.as_nanos() as u64
    }

    /// True if server `i` refused a connection and has not been reached
    /// since (its process is not running).
    pub(crate) fn refusing(&self, i: u32) -> bool {
        self.slots
            .get(i as usize)
            .is_some_and(|s| s.refused_since.load(Ordering::Relaxed) != 0)
    }

    /// True if a copy request to server `i` got no answer within the last
    /// `DOWN_HOLD` and nothing has been heard from it since.
    pub(crate) fn recently_down(&self, i: u32) -> bool {
        let Some(s) = self.slots.get(i as usize) else {
            return false;
        };
        let since = s.down_since.load(Ordering::Relaxed);
        since != 0 && self.now_ns().saturating_sub(since) < DOWN_HOLD.as_nanos() as u64
    }

    /// Sends `Renew` to every connected server that has been quiet for a
    /// quarter of the lease (each in its own task). Run periodically.
    pub(crate) fn renew_quiet(self: &Arc<Self>) {
        let quarter = (self.lease / 4).as_nanos() as u64;
        let all = self.keep_all.load(Ordering::Relaxed);
        for (i, s) in self.slots.iter().enumerate() {
            let alive = all || s.control.open().is_some();
            let quiet = self
                .now_ns()
                .saturating_sub(s.last_ok.load(Ordering::SeqCst))
                > quarter;
            // One task per server, not awaited here: a server slow to answer
            // (its reply queued behind bulk data on a saturated link) must
            // not hold up the renewal of the others.
            if alive && quiet && !s.renewing.swap(true, Ordering::SeqCst) {
                let pool = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = pool.call(i as u32, Request::Renew, Bytes::new()).await {
                        debug!(server = i, error = %e, "renew failed");
                    }
                    if let Some(s) = pool.slots.get(i) {
                        s.renewing.store(false, Ordering::SeqCst);
                    }
                });
            }
        }
    }

    pub(crate) fn counters(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .counters
            .lock()
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect();
        v.sort();
        v
    }
}

/// Waits before a change refused while its home does not answer
/// (`--on-disconnect block`) is asked again.
async fn home_down_wait(op: &str, why: &str) {
    debug!(op, why, "change waits for home");
    tokio::time::sleep(HOME_DOWN_RETRY).await;
}

/// How often a change waiting for its home (`--on-disconnect block`) is
/// asked again.
const HOME_DOWN_RETRY: Duration = Duration::from_secs(1);
