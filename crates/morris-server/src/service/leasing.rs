//! Leases as the server grants them: the lease table ([`LeaseTable`], pure
//! logic in `crate::leases`) under one lock with the acquires waiting on
//! it, grants (`Server::lease`), recalls pushed to their holders,
//! releases, expiry (`Server::tick`), and requests run under a lease
//! (`Server::leased`). The caps on how many leases one client, and the
//! server, may hold.

use std::collections::HashMap;
use std::sync::Arc;

use morris_proto::messages::LeaseMode;
use morris_proto::{ErrorCode, FileId, Handle, Push, Request, WireError};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::{err, fencing, metadata, Server};
use crate::leases::{Acquired, ClientId, Effects, LeaseTable, Recall, Ticket};
use crate::ranges::Range;

/// The lease table and what waits on it, under one lock (`Server::leases`).
pub(super) struct LeaseState {
    pub(super) table: LeaseTable,
    /// Waiting acquires: ticket → (connection id, wake-up).
    pub(super) waiters: HashMap<Ticket, (u64, oneshot::Sender<()>)>,
    /// Write leases revoked by force whose fence is being raised at every
    /// server: inode → (revoked fence number, done). A grant of the inode
    /// is answered only once that is done (`fencing::Granted`).
    pub(super) fencing: HashMap<FileId, (u64, tokio::sync::watch::Sender<bool>)>,
    /// Fences to raise, taken by the caller once the lock is let go.
    pub(super) to_fence: Vec<(FileId, u64)>,
    /// Ranges whose fence reservation this table numbers above: range →
    /// the range's generation then (a takeover raises it: read again).
    pub(super) floors: HashMap<u32, u64>,
}

impl LeaseState {
    pub(super) fn new(table: LeaseTable) -> Self {
        LeaseState {
            table,
            waiters: HashMap::new(),
            fencing: HashMap::new(),
            to_fence: Vec::new(),
            floors: HashMap::new(),
        }
    }
}

/// Most leases one client may hold at one server. A mount keeps at most
/// `max_cached_leases` (100,000 by default) in all, plus those with
/// changes not yet stored, so only a runaway or hostile client meets this.
const MAX_LEASES_PER_CLIENT: usize = 1_000_000;
/// Most leases one server grants in all (a few hundred bytes each).
const MAX_LEASES: u64 = 4_000_000;

/// Refuses a new lease past the caps (memory a key holder can make a
/// server spend).
pub(super) fn check_lease_caps(table: &LeaseTable, client: ClientId) -> Result<(), WireError> {
    match table.over_caps(client, MAX_LEASES_PER_CLIENT, MAX_LEASES) {
        None => Ok(()),
        Some(why) => {
            warn!(client, "lease refused: {why}");
            Err(err(ErrorCode::TooManyLeases, why))
        }
    }
}

/// An object's extended attributes as a read grant carries them: all of
/// them if they are few ([`morris_proto::messages::XATTRS_WITH_LEASE`]
/// bytes of names and values at most), else none (the client asks).
pub(super) fn with_lease(list: Vec<morris_proto::Xattr>) -> Option<Vec<morris_proto::Xattr>> {
    let bytes: usize = list.iter().map(|x| x.name.len() + x.value.len()).sum();
    (bytes <= morris_proto::messages::XATTRS_WITH_LEASE).then_some(list)
}

/// Whether a request takes a lease (and so waits out the grace period).
pub(super) fn takes_lease(req: &Request) -> bool {
    matches!(
        req,
        Request::AcquireRead { .. }
            | Request::AcquireReadMany { .. }
            | Request::AcquireWrite { .. }
            | Request::CreateInode { .. }
            | Request::CreateInodeAt { .. }
            | Request::SetAttr { .. }
            | Request::TouchAtime { .. }
            | Request::TouchCtime { .. }
            | Request::GetXattrs { .. }
            | Request::SetXattr { .. }
            | Request::Lock { .. }
            | Request::TestLock { .. }
            | Request::MarkStale { .. }
            | Request::DeleteInode { .. }
            | Request::Lookup { .. }
            | Request::ReadDir { .. }
            | Request::Link { .. }
            | Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::Exchange { .. }
            | Request::DropLink { .. }
            // Not a lease, but its judgement of which clients are alive
            // needs them to have renewed since this server (or range) started.
            | Request::Reap { .. }
            // Cache mode: changes found at home recall every lease on the
            // object, which needs the lease table of a whole lease time.
            | Request::Bind { .. }
            | Request::Unbind { .. }
            | Request::HomeLookup { .. }
            | Request::CreateCached { .. }
            | Request::AcquireCached { .. }
            | Request::Revalidate { .. }
            | Request::Detach { .. }
    )
}

impl Server {
    /// Wakes granted waiters; returns the recalls to push once unlocked.
    pub(super) fn settle(st: &mut LeaseState, fx: Effects) -> Vec<Recall> {
        // Before any grant is woken: its answer waits for the fence.
        for (ino, fence) in fx.fenced {
            st.fencing
                .insert(ino, (fence, tokio::sync::watch::channel(false).0));
            st.to_fence.push((ino, fence));
        }
        for t in fx.granted {
            if let Some((_, tx)) = st.waiters.remove(&t) {
                // The waiter may be gone; its lease then runs out unused.
                let _ = tx.send(());
            }
        }
        for (client, ino) in &fx.revoked {
            debug!(
                client,
                ino, "lease revoked (holder silent or recall overdue)"
            );
        }
        fx.recalls
    }

    pub(super) fn push_recalls(&self, recalls: Vec<Recall>) {
        self.raise_fences();
        if recalls.is_empty() {
            return;
        }
        let sessions = self.sessions.lock();
        for r in recalls {
            let msg = Push::Recall {
                ino: r.ino,
                want: r.want,
            };
            let mut sent = 0;
            if let Some(conns) = sessions.by_client.get(&r.client) {
                for (_, c) in conns {
                    if let Some(c) = c.upgrade() {
                        if c.push(&msg) {
                            sent += 1;
                        }
                    }
                }
            }
            debug!(client = r.client, ino = r.ino, want = ?r.want, sent, "recall");
        }
    }

    pub(super) fn cancel_ticket(&self, t: Ticket) {
        let recalls = {
            let mut st = self.leases.lock();
            st.waiters.remove(&t);
            let mut fx = Effects::default();
            let now = self.now_ms();
            st.table.cancel(t, now, &mut fx);
            Self::settle(&mut st, fx)
        };
        self.push_recalls(recalls);
    }

    /// Takes `mode` on `ino` for `client`, waiting for conflicting holders;
    /// the grant's fence number (0 for a read lease), within the range's
    /// durable fence reservation.
    pub(super) async fn lease(
        &self,
        client: ClientId,
        conn_id: u64,
        ino: FileId,
        mode: LeaseMode,
    ) -> Result<u64, WireError> {
        let range = match mode {
            LeaseMode::Write => self.fence_range(ino),
            LeaseMode::Read => None,
        };
        if let Some(r) = &range {
            self.number_above_reservation(r)?;
        }
        let fence = self.grant(client, conn_id, ino, mode).await?;
        if let Some(r) = range.filter(|_| fence != 0) {
            self.reserve_fence(&r, fence).await?;
        }
        Ok(fence)
    }

    /// The copy of `ino`'s metadata range kept here, if any.
    fn fence_range(&self, ino: FileId) -> Option<Arc<Range>> {
        let ranges = self.ranges().ok()?;
        let r = (ino % u64::from(ranges.k.max(1))) as u32;
        ranges.of_range(r).cloned()
    }

    /// The first write grant for range `r` since this lease table began,
    /// or since the range's generation changed (a takeover), is numbered
    /// above the range's durable reservation: above every number handed
    /// out for it before, whatever this server's clock says.
    fn number_above_reservation(&self, r: &Range) -> Result<(), WireError> {
        let gen = r.st.lock().gen;
        if self.leases.lock().floors.get(&r.range) == Some(&gen) {
            return Ok(());
        }
        let floor = metadata(|| r.store.fence_floor())?;
        let mut st = self.leases.lock();
        st.table.raise_fence_floor(floor);
        st.floors.insert(r.range, gen);
        debug!(
            range = r.range,
            gen, floor, "write grants numbered above the range's reservation"
        );
        Ok(())
    }

    /// Makes `fence` durable within range `r`'s reservation before it is
    /// answered: at most one commit (and fsync, and copy) per
    /// `FENCE_RESERVE_US` of numbers.
    async fn reserve_fence(&self, r: &Range, fence: u64) -> Result<(), WireError> {
        let Some(upto) = metadata(|| r.store.reserve_fence(fence))? else {
            return Ok(());
        };
        if !r.peers.is_empty() {
            self.wait_replicated(r, r.store.committed_seq()).await?;
        }
        r.store.fences_reserved(upto);
        debug!(range = r.range, upto, "fence numbers reserved");
        Ok(())
    }

    /// [`Server::lease`] without the reservation.
    async fn grant(
        &self,
        client: ClientId,
        conn_id: u64,
        ino: FileId,
        mode: LeaseMode,
    ) -> Result<u64, WireError> {
        let (wait, recalls) = {
            let mut st = self.leases.lock();
            if st.table.holds(client, ino).is_none() {
                check_lease_caps(&st.table, client)?;
            }
            let mut fx = Effects::default();
            let now = self.now_ms();
            let wait = match st.table.acquire(client, ino, mode, now, &mut fx) {
                Acquired::Granted => Err(Self::granted(&st, client, ino)),
                Acquired::Waiting(t) => {
                    let (tx, rx) = oneshot::channel();
                    st.waiters.insert(t, (conn_id, tx));
                    Ok((t, rx))
                }
            };
            (wait, Self::settle(&mut st, fx))
        };
        self.push_recalls(recalls);
        let (ticket, rx) = match wait {
            Ok(w) => w,
            Err(granted) => return Ok(granted.answer().await),
        };
        debug!(client, ino, ?mode, ticket, "lease request waits");
        let mut guard = WaitGuard {
            server: self,
            ticket: Some(ticket),
        };
        let r = rx.await;
        guard.ticket = None;
        match r {
            Ok(()) => {
                let granted = Self::granted(&self.leases.lock(), client, ino);
                Ok(granted.answer().await)
            }
            Err(_) => Err(err(
                ErrorCode::Unavailable,
                "lease request abandoned (connection closed or server stopping)",
            )),
        }
    }

    /// What a grant of `ino` to `client` answers with: its fence number (0
    /// for a read lease), once a fence being raised on `ino` is up.
    pub(super) fn granted(st: &LeaseState, client: ClientId, ino: FileId) -> fencing::Granted {
        fencing::Granted {
            fence: st.table.fence(client, ino).unwrap_or(0),
            raising: st.fencing.get(&ino).map(|(_, done)| done.subscribe()),
        }
    }

    /// Who holds a lease on `ino` now, by the names clients gave at `Hello`.
    pub(super) fn holders(&self, ino: FileId) -> Vec<morris_proto::LeaseHolder> {
        let held = self.leases.lock().table.holders(ino);
        let sessions = self.sessions.lock();
        held.into_iter()
            .map(|(client, mode)| morris_proto::LeaseHolder {
                client: sessions
                    .by_conn
                    .values()
                    .find(|(s, _)| s.client_id == client)
                    .map_or_else(|| format!("client {client:016x}"), |(s, _)| s.name.clone()),
                mode,
            })
            .collect()
    }

    pub(super) fn release(&self, client: ClientId, ino: FileId) {
        let recalls = {
            let mut st = self.leases.lock();
            let mut fx = Effects::default();
            let now = self.now_ms();
            st.table.release(client, ino, now, &mut fx);
            Self::settle(&mut st, fx)
        };
        self.push_recalls(recalls);
    }

    /// `AcquireReadMany`: the read lease on each of `inos`, all asked at
    /// once (the recalls they need go out together; the answer waits for
    /// every grant, as a client's concurrent `AcquireRead`s of them would
    /// each wait for their own), each with its inode and (if few) its
    /// extended attributes as `AcquireRead` answers; `None` for an object
    /// not granted (its lease refused, or the object gone or replaced: the
    /// client asks `AcquireRead` for the reason).
    pub(super) async fn read_leased_many(
        &self,
        store: &crate::store::Store,
        client: ClientId,
        conn_id: u64,
        inos: &[Handle],
    ) -> Result<Vec<Option<morris_proto::messages::ReadLease>>, WireError> {
        let grants = futures::future::join_all(
            inos.iter()
                .map(|h| self.lease(client, conn_id, h.id, LeaseMode::Read)),
        )
        .await;
        let mut out = Vec::with_capacity(inos.len());
        for (h, granted) in inos.iter().zip(grants) {
            if let Err(e) = granted {
                debug!(client, ino = h.id, error = %e, "lease of a batch not granted");
                out.push(None);
                continue;
            }
            match metadata(|| store.get_xattrs(*h)) {
                Ok((inode, list)) => {
                    out.push(Some(morris_proto::messages::ReadLease {
                        inode,
                        xattrs: with_lease(list),
                    }));
                }
                Err(e) if matches!(e.code, ErrorCode::Stale | ErrorCode::NotFound) => {
                    // Gone or replaced: nobody needs a lease on it (unless
                    // the batch names its id again).
                    if inos.iter().filter(|x| x.id == h.id).count() == 1 {
                        self.release(client, h.id);
                    }
                    out.push(None);
                }
                // The store failed. The leases granted stay: this
                // client may have held some before, and one it does not
                // know it holds is given back when it is recalled.
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Expires silent clients and overdue recalls; run periodically.
    pub(crate) fn tick(&self) {
        self.check_ownership();
        self.expire_locks();
        let recalls = {
            let mut st = self.leases.lock();
            let mut fx = Effects::default();
            let now = self.now_ms();
            st.table.tick(now, &mut fx);
            if fx.is_empty() {
                drop(st);
                self.raise_fences();
                return;
            }
            Self::settle(&mut st, fx)
        };
        self.push_recalls(recalls);
    }

    /// Takes the lease, runs `op` on the blocking pool, and gives a lease on a
    /// handle found stale back (the file is gone; nobody needs it).
    pub(super) async fn leased<T, F>(
        &self,
        client: ClientId,
        conn_id: u64,
        ino: Handle,
        mode: LeaseMode,
        op: F,
    ) -> Result<T, WireError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, WireError> + Send + 'static,
    {
        self.leased_fenced(client, conn_id, ino, mode, op)
            .await
            .map(|(t, _)| t)
    }

    /// [`Server::leased`], with the grant's fence number (0 for a read lease).
    pub(super) async fn leased_fenced<T, F>(
        &self,
        client: ClientId,
        conn_id: u64,
        ino: Handle,
        mode: LeaseMode,
        op: F,
    ) -> Result<(T, u64), WireError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, WireError> + Send + 'static,
    {
        let fence = self.lease(client, conn_id, ino.id, mode).await?;
        let r = metadata(op);
        if let Err(e) = &r {
            if e.code == ErrorCode::Stale {
                self.release(client, ino.id);
            }
        }
        r.map(|t| (t, fence))
    }
}

/// Cancels a waiting acquire if its request is abandoned.
struct WaitGuard<'a> {
    server: &'a Server,
    ticket: Option<Ticket>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.server.cancel_ticket(t);
        }
    }
}
