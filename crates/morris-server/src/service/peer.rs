//! Metadata mirroring between the servers of a range: the primary's
//! forwarder (one follower task per secondary: ships every committed change
//! before it is answered; the candidate's answers renew the ownership
//! lease), the secondary's side of `PeerSync` / `Replicate` /
//! `SnapshotChunk`, takeover and lapse. The rules are in `ranges.rs`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{ErrorCode, Reply, Request, WireError, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{blocking, err, LeaseState, Server};
use crate::arbiter::Claim;
use crate::leases::{LeaseTable, Millis};
use crate::ranges::{Range, Role};
use crate::store::Captured;

/// Bytes of a snapshot per `SnapshotChunk`.
const CHUNK: u64 = 4 << 20;
/// Most changeset bytes per `Replicate`.
const BATCH_BYTES: usize = 4 << 20;

/// The outcome of a `PeerSync` exchange, seen from the primary.
enum Hand {
    /// The secondary's copy is exactly ours.
    InSync,
    /// The secondary needs a whole snapshot.
    NeedSnapshot,
    /// The other server serves the range at a higher generation: we are
    /// the secondary now.
    Demoted,
}

/// Why the forwarder's connection is gone.
enum Lost {
    /// The peer's process is not running (connection refused), or the
    /// process at its address holds no copy of this volume (it answers
    /// `WrongVolume`: unformatted — an empty replacement not yet made a
    /// member — or another volume's). Either way the copy that process
    /// kept is gone with it.
    Refused,
    /// Anything else (timeout, reset, refusal of a request).
    Other(String),
}

fn lost(e: RpcError) -> Lost {
    match &e {
        RpcError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused =>
        {
            Lost::Refused
        }
        RpcError::Remote(w) if w.code == ErrorCode::WrongVolume => Lost::Refused,
        _ => Lost::Other(e.to_string()),
    }
}

/// Refuses changes for a copy that is not a secondary, or that follows a
/// newer generation than the sender's.
fn from_current_primary(st: &crate::ranges::RangeState, r: u32, gen: u64) -> Result<(), WireError> {
    if st.role == Role::Primary || gen < st.gen {
        return Err(err(
            ErrorCode::NotOwner,
            format!("range {r}: generation {gen} is not current"),
        ));
    }
    Ok(())
}

impl Server {
    /// The margin a secondary waits past the ownership lease before taking
    /// over (clock-rate differences, the primary's tick).
    pub(super) fn takeover_margin(&self) -> Millis {
        Millis::from(self.lease_ms / 4) + 250
    }

    fn peer_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.lease_ms / 2).max(100))
    }

    async fn peer_call(
        &self,
        c: &RpcClient,
        req: &Request,
        payload: Bytes,
    ) -> Result<(Reply, Bytes), Lost> {
        if self.peers_cut.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(self.peer_timeout()).await;
            return Err(Lost::Other("link cut (fault injection)".into()));
        }
        match tokio::time::timeout(self.peer_timeout(), c.call(req, payload)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(lost(e)),
            Err(_) => Err(Lost::Other("no answer in time".into())),
        }
    }

    async fn peer_connect(&self, range: &Range, i: usize) -> Result<RpcClient, Lost> {
        if self.peers_cut.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(self.peer_timeout()).await;
            return Err(Lost::Other("link cut (fault injection)".into()));
        }
        let uuid = self
            .store
            .formatted()
            .map(|f| f.descriptor.uuid)
            .ok_or_else(|| Lost::Other("not formatted".into()))?;
        let c = match tokio::time::timeout(
            self.peer_timeout(),
            RpcClient::connect(&range.peers[i].addr, &self.keys.credential(), None),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(lost(e)),
            Err(_) => return Err(Lost::Other("connect timed out".into())),
        };
        let hello = Request::Hello {
            volume: Some(uuid),
            client_id: rand::random(),
            client_name: format!("peer: range {} copy", range.range),
            version: PROTOCOL_VERSION,
        };
        self.peer_call(&c, &hello, Bytes::new()).await?;
        Ok(c)
    }

    /// Secondary `i` answered a request sent at `sent`: if it is the
    /// candidate, the ownership lease runs from then. (Any answered request
    /// bounds that copy's takeover: it heard from us after `sent`.)
    fn confirm(&self, range: &Range, i: usize, sent: Millis) {
        let mut st = range.st.lock();
        if st.cand != i {
            return;
        }
        st.own_until = st.own_until.max(sent + self.own_ms());
        // With an arbiter, only a claim in etcd establishes (`claim`).
        if range.arbiter.is_none() && (!st.established || st.lapsed) {
            info!(range = range.range, gen = st.gen, "serving metadata range");
            st.established = true;
            st.lapsed = false;
        }
        drop(st);
        range.bump();
    }

    pub(super) fn own_ms(&self) -> Millis {
        Millis::from(self.lease_ms)
    }

    /// `PeerSync` to secondary `i`: tells it that its copy should be at
    /// `seq` of `lineage` and whether it is the candidate, renews the
    /// ownership lease (candidate only), learns whether it is.
    async fn handshake(
        &self,
        range: &Range,
        i: usize,
        c: &RpcClient,
        lineage: u64,
        seq: u64,
    ) -> Result<Hand, Lost> {
        let gen = range.st.lock().gen;
        let sent = self.now_ms();
        let req = Request::PeerSync {
            range: range.range,
            gen,
            lineage,
            seq,
            etcd: range.arbiter.is_some(),
            candidate: range.st.lock().cand == i,
        };
        let (reply, _) = self.peer_call(c, &req, Bytes::new()).await?;
        match reply {
            Reply::PeerState {
                primary: true,
                gen: theirs,
                ..
            } => {
                if theirs >= gen {
                    self.demote(range, theirs);
                    Ok(Hand::Demoted)
                } else {
                    Err(Lost::Other(format!(
                        "peer claims range {} at older generation {theirs}",
                        range.range
                    )))
                }
            }
            // A secondary that follows a newer primary.
            Reply::PeerState { gen: theirs, .. } if theirs > gen => {
                self.demote(range, theirs);
                Ok(Hand::Demoted)
            }
            Reply::PeerState { in_sync, .. } => {
                self.confirm(range, i, sent);
                if !in_sync {
                    range.st.lock().peer_in_sync[i] = false;
                    range.bump();
                }
                Ok(if in_sync {
                    Hand::InSync
                } else {
                    Hand::NeedSnapshot
                })
            }
            other => Err(Lost::Other(format!("unexpected reply {other:?}"))),
        }
    }

    /// This server's index.
    fn me(&self) -> u32 {
        self.ranges().map_or(0, |r| r.me)
    }

    /// With etcd: records there that `range`'s copy is not current, then
    /// stops waiting for it (changes are answered with one copy). Does
    /// nothing if etcd cannot be told: the primary then waits, and lapses
    /// when its etcd lease runs out.
    async fn go_on_alone(&self, range: &Range) {
        let Some(e) = range.arbiter.as_ref().and_then(|a| a.get()) else {
            return;
        };
        let gen = range.st.lock().gen;
        match e.set_copy_current(range.range, self.me(), gen, false).await {
            Ok(true) => {
                let cand = {
                    let mut st = range.st.lock();
                    let c = st.cand;
                    st.peer_in_sync[c] = false;
                    c
                };
                range.bump();
                warn!(range = range.range, peer = %range.peers[cand].addr,
                    "metadata copy not answering; recorded in etcd, serving without it");
            }
            Ok(false) => debug!(range = range.range, "no longer the owner in etcd"),
            Err(e) => debug!(range = range.range, error = %e, "cannot reach etcd"),
        }
    }

    /// With etcd: takes or confirms ownership of `range` there. `Ok(true)`:
    /// serving; `Ok(false)`: not (yet); `Err(())`: another server serves
    /// it at a newer generation (this copy was demoted).
    async fn claim(&self, range: &Range) -> Result<bool, ()> {
        let Some(e) = range.arbiter.as_ref().and_then(|a| a.get()) else {
            return Ok(false);
        };
        if !e.valid(self.now_ms()) {
            return Ok(false);
        }
        let gen = range.st.lock().gen;
        match e.claim(range.range, self.me(), gen).await {
            Ok(Claim::Owned) => {
                {
                    let mut st = range.st.lock();
                    st.established = true;
                    st.lapsed = false;
                    // The claim recorded the copy as not current.
                    st.peer_in_sync.fill(false);
                }
                range.bump();
                info!(
                    range = range.range,
                    gen, "serving metadata range (owner in etcd)"
                );
                Ok(true)
            }
            Ok(Claim::Superseded(newer)) => {
                self.demote(range, newer);
                Err(())
            }
            Ok(Claim::Held) => Ok(false),
            Err(e) => {
                debug!(range = range.range, error = %e, "cannot claim the range in etcd");
                Ok(false)
            }
        }
    }

    /// This copy becomes the secondary of a range another server serves at
    /// generation `gen`.
    pub(super) fn demote(&self, range: &Range, gen: u64) {
        let was_serving = range.serving(self.now_ms());
        {
            let mut st = range.st.lock();
            if let Err(e) = range.persist(gen, Role::Secondary) {
                warn!(range = range.range, error = %e, "cannot record the secondary role");
            }
            st.role = Role::Secondary;
            st.gen = gen;
            st.established = false;
            st.peer_in_sync.fill(false);
            st.in_sync = false;
            st.candidate = false;
            st.cand = 0;
        }
        range.store.stop_capture();
        range.bump();
        warn!(
            range = range.range,
            gen, "another server serves this metadata range; keeping its copy"
        );
        if was_serving {
            self.lapse_all("demoted");
        }
    }

    async fn send_snapshot(
        &self,
        range: &Range,
        i: usize,
        c: &RpcClient,
        lineage: u64,
        pending: &mut VecDeque<Captured>,
        rx: &mut mpsc::UnboundedReceiver<Captured>,
    ) -> Result<u64, Lost> {
        let path = self.data_dir.join(format!(
            "snapshot-out-{}-{}.sqlite",
            range.range, range.peers[i].server
        ));
        let _ = std::fs::remove_file(&path);
        let store = range.store.clone();
        let p2 = path.clone();
        let seq = blocking(move || store.snapshot_to(&p2))
            .await
            .map_err(|e| Lost::Other(e.to_string()))?;
        while let Ok(x) = rx.try_recv() {
            pending.push_back(x);
        }
        pending.retain(|x| x.seq > seq);
        let len = std::fs::metadata(&path)
            .map_err(|e| Lost::Other(e.to_string()))?
            .len();
        // From the last piece on the copy is current (the candidate could
        // take over: from now on this server serves only under the
        // ownership lease), and answers wait for it.
        range.st.lock().peer_in_sync[i] = true;
        range.bump();
        let gen = range.st.lock().gen;
        let mut offset = 0u64;
        let r = loop {
            let n = CHUNK.min(len - offset);
            let p3 = path.clone();
            let chunk = blocking(move || {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::open(&p3)
                    .map_err(|e| err(ErrorCode::Io, format!("{}: {e}", p3.display())))?;
                let mut buf = vec![0u8; n as usize];
                f.read_exact_at(&mut buf, offset)
                    .map_err(|e| err(ErrorCode::Io, format!("{}: {e}", p3.display())))?;
                Ok(buf)
            })
            .await
            .map_err(|e| Lost::Other(e.to_string()))?;
            let last = offset + n >= len;
            let req = Request::SnapshotChunk {
                range: range.range,
                gen,
                lineage,
                seq,
                offset,
                last,
            };
            let sent = self.now_ms();
            if let Err(e) = self.peer_call(c, &req, Bytes::from(chunk)).await {
                break Err(e);
            }
            self.confirm(range, i, sent);
            offset += n;
            if last {
                break Ok(());
            }
        };
        let _ = std::fs::remove_file(&path);
        r?;
        range.peers[i].acked.send_modify(|a| *a = (*a).max(seq));
        range.bump();
        info!(
            range = range.range,
            peer = %range.peers[i].addr,
            seq,
            bytes = len,
            "metadata copy sent whole"
        );
        Ok(seq)
    }

    /// Ships `range`'s changes to every other copy for as long as this
    /// server is the range's primary: one follower task per secondary, fed
    /// the same captured changes.
    pub(super) async fn forward(self: Arc<Self>, range: Arc<Range>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Captured>();
        let lineage = loop {
            let l: u64 = rand::random();
            if l != 0 {
                break l;
            }
        };
        let base = range.store.start_capture(tx);
        range.st.lock().lineage = lineage;
        let mut feeds = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..range.peers.len() {
            range.peers[i].acked.send_modify(|a| *a = (*a).max(base));
            let (ftx, frx) = mpsc::unbounded_channel::<Captured>();
            feeds.push(ftx);
            tasks.push(tokio::spawn(self.clone().follow(
                range.clone(),
                i,
                lineage,
                base,
                frx,
            )));
        }
        info!(
            range = range.range,
            copies = range.peers.len() + 1,
            "shipping metadata changes"
        );
        let fan = tokio::spawn(async move {
            while let Some(x) = rx.recv().await {
                for f in &feeds {
                    let _ = f.send(x.clone());
                }
            }
        });
        for t in tasks {
            let _ = t.await;
        }
        range.store.stop_capture();
        fan.abort();
        info!(range = range.range, "stopped shipping metadata changes");
    }

    /// Ships `range`'s changes to its secondary `i`.
    async fn follow(
        self: Arc<Self>,
        range: Arc<Range>,
        i: usize,
        lineage: u64,
        base: u64,
        mut rx: mpsc::UnboundedReceiver<Captured>,
    ) {
        // Whether this copy is the candidate now (it can change: below).
        let is_cand = || range.st.lock().cand == i;
        let peer_addr = range.peers[i].addr.clone();
        let beat = Duration::from_millis(u64::from(self.lease_ms / 4).max(20));
        let pause = Duration::from_millis(200);
        // Changes captured and not yet at the peer, in order.
        let mut pending: VecDeque<Captured> = VecDeque::new();
        // The last change the peer holds in this lineage (a new lineage
        // starts unknown to it: the first handshake asks for a snapshot).
        let mut at_peer = base;
        let mut conn: Option<RpcClient> = None;
        let mut need_snapshot = false;
        // With etcd: the copy is recorded there as current.
        let mut etcd_marked = false;
        // A secondary that is not the candidate cannot take over: when it
        // does not answer, answers stop waiting for it at once (it gets a
        // snapshot when it is back).
        let drop_follower = |pending: &mut VecDeque<Captured>| {
            let was = std::mem::replace(&mut range.st.lock().peer_in_sync[i], false);
            if was {
                warn!(range = range.range, peer = %peer_addr,
                    "metadata copy not answering; serving without it");
            }
            range.bump();
            pending.clear();
        };
        loop {
            if self.stopped.load(std::sync::atomic::Ordering::SeqCst)
                || range.st.lock().role != Role::Primary
            {
                break;
            }
            if range.arbiter.is_some() {
                let unclaimed = {
                    let st = range.st.lock();
                    !st.established || st.lapsed
                };
                if unclaimed {
                    // Only the candidate's task claims the range in etcd.
                    let claimed = if is_cand() {
                        self.claim(&range).await
                    } else {
                        Ok(false)
                    };
                    match claimed {
                        Ok(true) => etcd_marked = false,
                        Ok(false) => {
                            pending.clear();
                            while rx.try_recv().is_ok() {}
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                        Err(()) => break,
                    }
                }
            }
            while let Ok(x) = rx.try_recv() {
                pending.push_back(x);
            }
            let c = match conn.take().filter(|c| !c.is_closed()) {
                Some(c) => c,
                None => {
                    let attempt = match self.peer_connect(&range, i).await {
                        Ok(c) => self
                            .handshake(&range, i, &c, lineage, at_peer)
                            .await
                            .map(|h| (c, h)),
                        Err(e) => Err(e),
                    };
                    match attempt {
                        Ok((_, Hand::Demoted)) => break,
                        Ok((c, Hand::InSync)) => {
                            if !range.st.lock().peer_in_sync[i] {
                                // Back after we went on without it: current
                                // only if nothing was answered meanwhile.
                                if pending.is_empty() && range.store.committed_seq() == at_peer {
                                    range.st.lock().peer_in_sync[i] = true;
                                    range.bump();
                                    if is_cand() {
                                        etcd_marked = self.mark_current(&range).await;
                                    }
                                } else {
                                    need_snapshot = true;
                                }
                            }
                            c
                        }
                        Ok((c, Hand::NeedSnapshot)) => {
                            need_snapshot = true;
                            c
                        }
                        Err(e) => {
                            let peer_dead = matches!(e, Lost::Refused);
                            if let Lost::Other(m) = &e {
                                debug!(range = range.range, peer = %peer_addr, error = %m, "metadata copy unreachable");
                            }
                            if !is_cand() {
                                drop_follower(&mut pending);
                                tokio::time::sleep(pause).await;
                                continue;
                            }
                            if range.arbiter.is_some() {
                                if range.st.lock().peer_in_sync[i] {
                                    self.go_on_alone(&range).await;
                                }
                                etcd_marked = false;
                                if !range.st.lock().peer_in_sync[i] {
                                    pending.clear();
                                }
                                tokio::time::sleep(pause).await;
                                continue;
                            }
                            let in_sync = {
                                let mut st = range.st.lock();
                                // Serving now, under this candidate's lease
                                // (or without needing it): then the dead
                                // candidate never took over — it would have
                                // had to wait out that lease.
                                let serving =
                                    st.established && !range.ownership_ended(&st, self.now_ms());
                                if peer_dead && st.peer_in_sync[i] {
                                    // Its process is gone, and with it any
                                    // claim that its copy is current.
                                    st.peer_in_sync[i] = false;
                                    warn!(range = range.range, peer = %peer_addr,
                                        "metadata copy server is down; serving without it");
                                }
                                if peer_dead && serving && range.peers.len() > 1 {
                                    // A dead candidate cannot take over (its
                                    // in-sync state died with it): the next
                                    // copy becomes the candidate. Its lease
                                    // counts from its first answer to a
                                    // request sent after this; its takeover
                                    // from its last message received, which
                                    // is later. Not while this copy is not
                                    // serving (restarted, lapsed): the dead
                                    // candidate may have taken the range over
                                    // and answered changes the third copy
                                    // never saw, so only it can say.
                                    st.cand = (i + 1) % range.peers.len();
                                    warn!(range = range.range, candidate = %range.peers[st.cand].addr,
                                        "candidate copy is down; naming the next copy candidate");
                                }
                                st.peer_in_sync[i]
                            };
                            range.bump();
                            if !in_sync {
                                // A snapshot will carry these.
                                pending.clear();
                            }
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                }
            };
            if need_snapshot {
                match self
                    .send_snapshot(&range, i, &c, lineage, &mut pending, &mut rx)
                    .await
                {
                    Ok(seq) => {
                        need_snapshot = false;
                        at_peer = seq;
                        if is_cand() {
                            etcd_marked = self.mark_current(&range).await;
                        }
                        conn = Some(c);
                    }
                    Err(e) => {
                        if let Lost::Other(m) = e {
                            warn!(range = range.range, peer = %peer_addr, error = %m, "sending the metadata copy failed");
                        }
                        if !is_cand() {
                            drop_follower(&mut pending);
                        }
                        tokio::time::sleep(pause).await;
                    }
                }
                continue;
            }
            pending.retain(|x| x.seq > at_peer);
            if pending.is_empty() {
                tokio::select! {
                    x = rx.recv() => match x {
                        Some(x) => pending.push_back(x),
                        None => break,
                    },
                    _ = tokio::time::sleep(beat) => {
                        match self.handshake(&range, i, &c, lineage, at_peer).await {
                            Ok(Hand::InSync) => {
                                if is_cand() && !etcd_marked && range.st.lock().peer_in_sync[i] {
                                    etcd_marked = self.mark_current(&range).await;
                                }
                            }
                            Ok(Hand::NeedSnapshot) => need_snapshot = true,
                            Ok(Hand::Demoted) => break,
                            Err(_) => {
                                if !is_cand() {
                                    drop_follower(&mut pending);
                                }
                                continue;
                            }
                        }
                    }
                }
                conn = Some(c);
                continue;
            }
            let first = pending.front().map_or(0, |x| x.seq);
            if first != at_peer + 1 {
                // A gap (changes dropped while the copy was away).
                need_snapshot = true;
                conn = Some(c);
                continue;
            }
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let mut bytes = 0usize;
            for x in &pending {
                if !batch.is_empty() && bytes + x.changeset.len() > BATCH_BYTES {
                    break;
                }
                bytes += x.changeset.len();
                batch.push(x.changeset.clone());
            }
            let last = first + batch.len() as u64 - 1;
            let payload = match postcard::to_stdvec(&batch) {
                Ok(p) => p,
                Err(e) => {
                    warn!(error = %e, "cannot encode metadata changes");
                    need_snapshot = true;
                    conn = Some(c);
                    continue;
                }
            };
            let gen = range.st.lock().gen;
            let req = Request::Replicate {
                range: range.range,
                gen,
                lineage,
                first_seq: first,
            };
            let sent = self.now_ms();
            match self.peer_call(&c, &req, Bytes::from(payload)).await {
                Ok(_) => {
                    self.confirm(&range, i, sent);
                    at_peer = last;
                    range.peers[i].acked.send_modify(|a| *a = (*a).max(last));
                    conn = Some(c);
                }
                Err(e) => {
                    if let Lost::Other(m) = e {
                        debug!(range = range.range, peer = %peer_addr, error = %m, "changes not applied by the copy");
                    }
                    if !is_cand() {
                        drop_follower(&mut pending);
                    } else if range.arbiter.is_some() {
                        // Do not keep clients waiting for a silent copy.
                        self.go_on_alone(&range).await;
                        etcd_marked = false;
                    }
                    // Reconnect: the handshake tells where the copy is.
                }
            }
        }
    }

    /// With etcd: records that the copy is current (it has a snapshot and
    /// every later change is waited for). True if recorded (or no etcd).
    async fn mark_current(&self, range: &Range) -> bool {
        let Some(e) = range.arbiter.as_ref().and_then(|a| a.get()) else {
            return range.arbiter.is_none();
        };
        let gen = range.st.lock().gen;
        match e.set_copy_current(range.range, self.me(), gen, true).await {
            Ok(ok) => ok,
            Err(e) => {
                debug!(range = range.range, error = %e, "cannot reach etcd");
                false
            }
        }
    }

    /// Waits until the change `seq` of `range` is at every secondary whose
    /// copy may be current. Fails if the ownership lease runs out first:
    /// the change is then not acknowledged.
    pub(super) async fn wait_replicated(&self, range: &Range, seq: u64) -> Result<(), WireError> {
        let mut acked: Vec<_> = range.peers.iter().map(|p| p.acked.subscribe()).collect();
        let mut changed = range.changed.subscribe();
        loop {
            if range.refusal(self.now_ms()).is_some() {
                return Err(err(
                    ErrorCode::Unavailable,
                    format!(
                        "metadata range {}: ownership ended before the change reached its copies",
                        range.range
                    ),
                ));
            }
            let waiting = {
                let st = range.st.lock();
                acked
                    .iter_mut()
                    .enumerate()
                    .position(|(i, a)| st.peer_in_sync[i] && *a.borrow_and_update() < seq)
            };
            let Some(i) = waiting else {
                return Ok(());
            };
            tokio::select! {
                _ = acked[i].changed() => {}
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// The secondary's side of the peer requests.
    pub(super) async fn peer_request(
        &self,
        req: Request,
        payload: Bytes,
    ) -> Result<Reply, WireError> {
        if self.peers_cut.load(std::sync::atomic::Ordering::SeqCst) {
            // The request is lost on the cut link: no answer in time.
            tokio::time::sleep(self.peer_timeout() * 2).await;
            return Err(err(ErrorCode::Unavailable, "link cut (fault injection)"));
        }
        let ranges = self.ranges()?;
        let r = match &req {
            Request::PeerSync { range, .. }
            | Request::Replicate { range, .. }
            | Request::SnapshotChunk { range, .. } => *range,
            _ => return Err(err(ErrorCode::Protocol, "not a peer request")),
        };
        let Some(range) = ranges.of_range(r).cloned() else {
            return Err(err(
                ErrorCode::NotOwner,
                format!("this server keeps no copy of metadata range {r}"),
            ));
        };
        let now = self.now_ms();
        match req {
            Request::PeerSync {
                gen,
                lineage,
                seq,
                etcd,
                candidate,
                ..
            } => {
                if etcd != range.arbiter.is_some() {
                    warn!(
                        range = r,
                        peer_etcd = etcd,
                        "the other copy of this range is started with a different --etcd setting"
                    );
                    return Err(err(
                        ErrorCode::Invalid,
                        "the servers of one volume must all use etcd (--etcd) or none",
                    ));
                }
                let (mine, role) = {
                    let st = range.st.lock();
                    (st.gen, st.role)
                };
                if role == Role::Primary {
                    if gen <= mine {
                        return Ok(Reply::PeerState {
                            primary: true,
                            gen: mine,
                            in_sync: false,
                        });
                    }
                    self.demote(&range, gen);
                }
                let mut st = range.st.lock();
                if gen < st.gen {
                    // A primary of an older generation (a newer one took
                    // over): it is not heard, and learns it is behind.
                    return Ok(Reply::PeerState {
                        primary: false,
                        gen: st.gen,
                        in_sync: false,
                    });
                }
                if gen > st.gen {
                    range
                        .persist(gen, Role::Secondary)
                        .map_err(|e| err(ErrorCode::Io, e.message))?;
                    st.gen = gen;
                }
                st.last_heard = now;
                st.candidate = candidate;
                let in_sync = st.in_sync && st.lineage == lineage && st.seq == seq;
                if !in_sync {
                    st.in_sync = false;
                }
                Ok(Reply::PeerState {
                    primary: false,
                    gen: st.gen,
                    in_sync,
                })
            }
            Request::Replicate {
                gen,
                lineage,
                first_seq,
                ..
            } => {
                let _one = range.apply.lock().await;
                {
                    let mut st = range.st.lock();
                    from_current_primary(&st, r, gen)?;
                    st.last_heard = now;
                    if !(st.in_sync && st.lineage == lineage && st.seq + 1 == first_seq) {
                        st.in_sync = false;
                        return Err(err(
                            ErrorCode::OutOfSync,
                            format!("range {r}: send a snapshot"),
                        ));
                    }
                }
                let batch: Vec<Vec<u8>> = postcard::from_bytes(&payload)
                    .map_err(|e| err(ErrorCode::Protocol, format!("bad change batch: {e}")))?;
                let n = batch.len() as u64;
                let store = range.store.clone();
                let applied = blocking(move || {
                    for cs in &batch {
                        store.apply_changeset(cs)?;
                    }
                    Ok(())
                })
                .await;
                let mut st = range.st.lock();
                match applied {
                    Ok(()) => {
                        st.seq = first_seq + n.saturating_sub(1);
                        st.last_heard = st.last_heard.max(now);
                        Ok(Reply::Ok)
                    }
                    Err(e) => {
                        warn!(range = r, error = %e, "cannot apply metadata changes; asking for a snapshot");
                        st.in_sync = false;
                        Err(err(ErrorCode::OutOfSync, e.message))
                    }
                }
            }
            Request::SnapshotChunk {
                gen,
                lineage,
                seq,
                offset,
                last,
                ..
            } => {
                let _one = range.apply.lock().await;
                {
                    let mut st = range.st.lock();
                    from_current_primary(&st, r, gen)?;
                    st.in_sync = false;
                    st.last_heard = now;
                }
                let path = self.data_dir.join(format!("snapshot-in-{r}.sqlite"));
                let store = range.store.clone();
                blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let io =
                        |e: std::io::Error| err(ErrorCode::Io, format!("{}: {e}", path.display()));
                    let f = std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(offset == 0)
                        .write(true)
                        .open(&path)
                        .map_err(io)?;
                    f.write_all_at(&payload, offset).map_err(io)?;
                    if last {
                        drop(f);
                        store.install_snapshot(&path)?;
                        let _ = std::fs::remove_file(&path);
                    }
                    Ok(())
                })
                .await?;
                if last {
                    let mut st = range.st.lock();
                    st.in_sync = true;
                    st.lineage = lineage;
                    st.seq = seq;
                    st.last_heard = st.last_heard.max(now);
                    info!(range = r, seq, "metadata copy is current");
                }
                Ok(Reply::Ok)
            }
            _ => Err(err(ErrorCode::Protocol, "not a peer request")),
        }
    }

    /// Takes over ranges whose primary went silent, and stops serving
    /// ranges whose ownership lease ran out. Called from `tick` and before
    /// every request.
    pub(super) fn check_ownership(&self) {
        let Ok(ranges) = self.ranges() else { return };
        if ranges.home().peers.is_empty() {
            // Not mirrored: one copy, nothing to lapse or take over.
            return;
        }
        let now = self.now_ms();
        for range in &ranges.list {
            let (due_lapse, due_takeover) = {
                let st = range.st.lock();
                let lapse = st.role == Role::Primary
                    && st.established
                    && !st.lapsed
                    && range.ownership_ended(&st, now);
                let take = st.role == Role::Secondary
                    && st.in_sync
                    && st.candidate
                    && now >= st.last_heard + self.own_ms() + self.takeover_margin();
                (lapse, take)
            };
            if due_lapse {
                range.st.lock().lapsed = true;
                range.bump();
                let cand = range.st.lock().cand;
                warn!(range = range.range, peer = %range.peers[cand].addr,
                    "no answer from the metadata copy for a lease time; ownership lapsed");
                self.lapse_all("ownership lapsed");
            }
            if due_takeover {
                match &range.arbiter {
                    None => self.take_over(range),
                    Some(_) => self.ask_etcd_to_take_over(range),
                }
            }
        }
    }

    /// With etcd: a takeover happens only if etcd agrees (the primary's
    /// owner key is gone and the copy is recorded current).
    fn ask_etcd_to_take_over(&self, range: &Arc<Range>) {
        let Some(e) = range.arbiter.as_ref().and_then(|a| a.get()).cloned() else {
            return;
        };
        let gen = {
            let mut st = range.st.lock();
            if st.taking_over {
                return;
            }
            st.taking_over = true;
            st.gen
        };
        let Some(me) = self.this.get().and_then(|w| w.upgrade()) else {
            return;
        };
        let range = range.clone();
        tokio::spawn(async move {
            let took = e.take_over(range.range, me.me(), gen).await;
            range.st.lock().taking_over = false;
            match took {
                Ok(true) => me.take_over(&range),
                Ok(false) => debug!(
                    range = range.range,
                    "etcd: the range is still owned, or its copy not current"
                ),
                Err(err) => debug!(range = range.range, error = %err, "cannot reach etcd"),
            }
        });
    }

    fn take_over(&self, range: &Arc<Range>) {
        let gen = range.st.lock().gen + 1;
        if let Err(e) = range.persist(gen, Role::Primary) {
            warn!(range = range.range, error = %e, "cannot record the takeover; not taking over");
            return;
        }
        if let Err(e) = range.store.recount() {
            warn!(range = range.range, error = %e, "cannot count the taken-over range");
        }
        {
            let mut st = range.st.lock();
            st.role = Role::Primary;
            st.gen = gen;
            st.established = true;
            st.lapsed = false;
            st.peer_in_sync.fill(false);
            st.in_sync = false;
            st.candidate = false;
            st.cand = 0;
            st.grace_until = self.now_ms() + Millis::from(self.lease_ms);
            st.takeovers += 1;
        }
        range.bump();
        warn!(
            range = range.range,
            gen, "metadata range's primary silent past its ownership lease; took it over"
        );
        if let Some(me) = self.this.get().and_then(|w| w.upgrade()) {
            tokio::spawn(me.forward(range.clone()));
        }
    }

    /// Stops trusting every lease this server granted, as a restart would:
    /// a new lease table, a new epoch, every session closed, a grace period
    /// on every range.
    pub(super) fn lapse_all(&self, why: &str) {
        let epoch = loop {
            let e: u64 = rand::random();
            if e != 0 {
                break e;
            }
        };
        self.epoch.store(epoch, std::sync::atomic::Ordering::SeqCst);
        {
            let mut st = self.leases.lock();
            *st = LeaseState::new(
                LeaseTable::new(Millis::from(self.lease_ms)).fenced_from(self.fence_base),
            );
        }
        let grace = self.now_ms() + Millis::from(self.lease_ms);
        if let Ok(ranges) = self.ranges() {
            for r in &ranges.list {
                let mut st = r.st.lock();
                st.grace_until = st.grace_until.max(grace);
            }
        }
        let conns: Vec<_> = {
            let mut s = self.sessions.lock();
            s.by_client.clear();
            s.by_conn.drain().map(|(_, (_, c))| c).collect()
        };
        for c in conns.iter().filter_map(|c| c.upgrade()) {
            c.close();
        }
        warn!(
            why,
            epoch,
            sessions = conns.len(),
            "dropped every lease and session"
        );
    }
}
