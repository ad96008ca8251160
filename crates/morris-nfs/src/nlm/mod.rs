//! NFSv3 locking: NLM v4 and the part of NSM a lock server needs, answered
//! on the gateway's one port.
//!
//! An NFS client's lock becomes a lock of the volume's own (the client
//! library's `Client::lock`, kept by the file's owner server), so it
//! excludes FUSE mounts' `fcntl`/`flock` locks and other gateways' NLM
//! locks on every host. Each NLM lock owner (client host name, client
//! address, `svid`) is one lock owner of this gateway's client; the gateway
//! keeps the file open while the owner holds any of it (closing it would
//! give the locks up).
//!
//! | call | what the gateway does |
//! |---|---|
//! | `TEST` | asks the file's owner server for a conflicting lock; the holder is named (a FUSE mount's: its process id as `svid`) |
//! | `LOCK` | takes the lock without waiting; if it conflicts and the client blocks, answers `BLOCKED` and waits for it in a task of its own, then calls the client's `GRANTED` (found through the client host's portmapper); a client that does not answer asks again, which finds the lock its own |
//! | `CANCEL` | ends that wait; a lock it got meanwhile is given back |
//! | `UNLOCK` | gives the range back; the file is closed once its owners hold nothing |
//! | `FREE_ALL`, NSM `SM_NOTIFY` | the host restarted: every lock and wait of its owners goes |
//!
//! A gateway that stops loses its locks with its client session (the
//! servers free them a lease time later); when it starts again it tells
//! the hosts that held locks through it, which reclaim them in a grace
//! period (`nsm.rs`).

pub(crate) mod nsm;
mod ranges;
pub(crate) mod xdr;

use std::collections::HashMap;
use std::io::Cursor;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use morris_client::{Client, ErrorCode, FileId};
use morris_proto::LockKind;
use nfs3_server::nfs3_types::nfs3::{nfs_fh3, nfsstat3};
use nfs3_server::nfs3_types::rpc::accept_stat_data;
use nfs3_types::xdr_codec::{Opaque, Unpack, Void};
use tracing::{debug, info, warn};

use crate::fs::MorrisNfs;
use crate::local::{rpc_error, success, Handles, Proc};
use ranges::Ranges;
use xdr::{
    host_state, nlm4_cancargs, nlm4_holder, nlm4_lock, nlm4_lockargs, nlm4_res, nlm4_stats,
    nlm4_testargs, nlm4_testres, nlm4_unlockargs, nsm_proc, proc4, NLM_PROGRAM, NLM_V4,
    NSM_PROGRAM, NSM_V1,
};

/// How long a `GRANTED` callback may take, each try.
const CALLBACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Tries of a `GRANTED` callback before leaving it to the client's own poll.
const CALLBACK_TRIES: u32 = 3;

/// Whether `p` is an NLM or NSM call (answered by [`LockManager::handle`]).
pub(crate) fn is_nlm(p: &Proc) -> bool {
    (p.prog == NLM_PROGRAM && p.vers == NLM_V4) || (p.prog == NSM_PROGRAM && p.vers == NSM_V1)
}

/// An NLM lock owner: client host name, client address, `svid`.
type OwnerKey = (Vec<u8>, IpAddr, u32);

/// The owner `l` names, called from `ip`.
fn owner_key(l: &nlm4_lock, ip: IpAddr) -> OwnerKey {
    (l.caller_name.to_vec(), ip, l.svid)
}

/// A lock waited for: owner, file, range, exclusive.
type WaitKey = (u64, FileId, u64, u64, bool);

/// One file some NLM owner locks or waits on.
struct FileLocks {
    /// The gateway's open file (its locks go with it).
    fh: u64,
    /// What each owner holds.
    held: HashMap<u64, Ranges>,
    /// Waits under way on the file.
    waiting: usize,
}

/// A blocked lock's wait.
struct Waiter {
    cancelled: AtomicBool,
}

#[derive(Default)]
struct State {
    owners: HashMap<OwnerKey, u64>,
    keys: HashMap<u64, OwnerKey>,
    next_owner: u64,
    files: HashMap<FileId, FileLocks>,
    waits: HashMap<WaitKey, Arc<Waiter>>,
}

impl State {
    /// The gateway-wide owner number of `key`, made on first use.
    fn owner(&mut self, key: OwnerKey) -> u64 {
        if let Some(&n) = self.owners.get(&key) {
            return n;
        }
        self.next_owner += 1;
        let n = self.next_owner;
        self.owners.insert(key.clone(), n);
        self.keys.insert(n, key);
        n
    }

    /// `owner` no longer holds `start..=end` of `id`.
    fn released(&mut self, id: FileId, owner: u64, (start, end): (u64, u64)) {
        if let Some(f) = self.files.get_mut(&id) {
            if let Some(r) = f.held.get_mut(&owner) {
                r.remove(start, end);
                if r.is_empty() {
                    f.held.remove(&owner);
                }
            }
        }
    }

    /// Forgets `owner` if it holds and waits for nothing any more.
    fn forget_if_idle(&mut self, owner: u64) {
        let busy = self.files.values().any(|f| f.held.contains_key(&owner))
            || self.waits.keys().any(|k| k.0 == owner);
        if !busy {
            if let Some(k) = self.keys.remove(&owner) {
                self.owners.remove(&k);
            }
        }
    }

    /// Takes `id` out of the table if nobody holds or waits on it: the
    /// open file to close.
    fn idle_file(&mut self, id: FileId) -> Option<u64> {
        let idle = self
            .files
            .get(&id)
            .is_some_and(|f| f.held.is_empty() && f.waiting == 0);
        if idle {
            self.files.remove(&id).map(|f| f.fh)
        } else {
            None
        }
    }
}

/// The NLM lock server of one gateway.
pub(crate) struct LockManager {
    client: Arc<Client>,
    handles: Handles,
    monitor: Arc<nsm::Monitor>,
    state: tokio::sync::Mutex<State>,
}

/// The two ends of the connection a call came on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conn {
    /// The client.
    pub peer: SocketAddr,
    /// The gateway's address it called.
    pub local: SocketAddr,
}

/// The byte range `l_offset`, `l_len` names, inclusive (`l_len` 0: to the
/// end of the file).
pub(crate) fn range_of(l: &nlm4_lock) -> (u64, u64) {
    let end = if l.l_len == 0 {
        u64::MAX
    } else {
        l.l_offset.saturating_add(l.l_len - 1)
    };
    (l.l_offset, end)
}

/// What an error of the client library is to an NLM client.
fn stat_of(e: &morris_client::Error) -> nlm4_stats {
    match e.code {
        // Interrupted: a reclaim that found the lock held past the grace period.
        ErrorCode::WouldBlock | ErrorCode::Interrupted => nlm4_stats::NLM4_DENIED,
        ErrorCode::Deadlock => nlm4_stats::NLM4_DEADLCK,
        ErrorCode::NotFound | ErrorCode::Stale => nlm4_stats::NLM4_STALE_FH,
        ErrorCode::ReadOnly => nlm4_stats::NLM4_ROFS,
        _ => nlm4_stats::NLM4_FAILED,
    }
}

/// Unpacks arguments, or `None` if they are garbage.
fn args<T: Unpack>(body: &[u8]) -> Option<T> {
    let mut c = Cursor::new(body);
    let (v, _) = T::unpack(&mut c).ok()?;
    (c.position() == body.len() as u64).then_some(v)
}

impl LockManager {
    /// A lock server acting through `client`; file handles as `handles`
    /// makes them.
    pub(crate) fn new(
        client: Arc<Client>,
        handles: Handles,
        monitor: Arc<nsm::Monitor>,
    ) -> Arc<LockManager> {
        Arc::new(LockManager {
            client,
            handles,
            monitor,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    /// Answers an NLM or NSM call ([`is_nlm`]) from `peer` whose arguments
    /// are `body`: a framed reply.
    pub(crate) async fn handle(
        self: &Arc<Self>,
        nfs: &MorrisNfs,
        p: Proc,
        body: &[u8],
        conn: Conn,
    ) -> Vec<u8> {
        let peer = conn.peer;
        let garbage = || rpc_error(p.xid, accept_stat_data::GARBAGE_ARGS);
        let res = |cookie, stat| success(p.xid, &nlm4_res { cookie, stat });
        if p.prog == NSM_PROGRAM {
            return match p.proc_ {
                nsm_proc::NULL => success(p.xid, &Void),
                nsm_proc::NOTIFY => match args::<host_state>(body) {
                    Some(a) => {
                        self.host_restarted(a.name.as_ref(), Some(peer.ip())).await;
                        success(p.xid, &Void)
                    }
                    None => garbage(),
                },
                // MON, UNMON and the rest are a host's own lockd talking
                // to its own statd, not calls for a lock server.
                _ => rpc_error(p.xid, accept_stat_data::PROC_UNAVAIL),
            };
        }
        match p.proc_ {
            proc4::NULL => success(p.xid, &Void),
            proc4::TEST => match args::<nlm4_testargs>(body) {
                Some(a) => success(p.xid, &self.test(nfs, a, peer).await),
                None => garbage(),
            },
            proc4::LOCK => match args::<nlm4_lockargs>(body) {
                Some(a) => {
                    let cookie = a.cookie.clone();
                    res(cookie, self.lock(nfs, a, conn).await)
                }
                None => garbage(),
            },
            proc4::CANCEL => match args::<nlm4_cancargs>(body) {
                Some(a) => {
                    let cookie = a.cookie.clone();
                    res(cookie, self.cancel(a, peer).await)
                }
                None => garbage(),
            },
            proc4::UNLOCK => match args::<nlm4_unlockargs>(body) {
                Some(a) => {
                    let cookie = a.cookie.clone();
                    res(cookie, self.unlock(a, peer).await)
                }
                None => garbage(),
            },
            proc4::FREE_ALL => match args::<host_state>(body) {
                Some(a) => {
                    self.host_restarted(a.name.as_ref(), None).await;
                    success(p.xid, &Void)
                }
                None => garbage(),
            },
            // GRANTED is a server's call to a client; the asynchronous
            // `_MSG`/`_RES` forms, DOS share modes (SHARE, UNSHARE) and
            // unmonitored locks (NM_LOCK) are not served: Linux and BSD
            // NFSv3 clients use none of them.
            _ => rpc_error(p.xid, accept_stat_data::PROC_UNAVAIL),
        }
    }

    /// The file `l.fh` names, if it is one of the volume's and still there.
    async fn file_of(&self, nfs: &MorrisNfs, l: &nlm4_lock) -> Result<FileId, nlm4_stats> {
        let fh = nfs_fh3 {
            data: Opaque::owned(l.fh.as_ref().to_vec()),
        };
        let h = self
            .handles
            .decode(&fh)
            .map_err(|_| nlm4_stats::NLM4_STALE_FH)?;
        nfs.inode("nlm", &h)
            .await
            .map(|i| i.id)
            .map_err(|e| match e {
                nfsstat3::NFS3ERR_STALE | nfsstat3::NFS3ERR_BADHANDLE => nlm4_stats::NLM4_STALE_FH,
                _ => nlm4_stats::NLM4_FAILED,
            })
    }

    /// The open file of `id` in `st`, opened if the table has none.
    async fn open(&self, st: &mut State, id: FileId) -> Result<u64, nlm4_stats> {
        if let Some(f) = st.files.get(&id) {
            return Ok(f.fh);
        }
        let fh = self
            .client
            .open(id, false, false)
            .await
            .map_err(|e| stat_of(&e))?;
        st.files.insert(
            id,
            FileLocks {
                fh,
                held: HashMap::new(),
                waiting: 0,
            },
        );
        Ok(fh)
    }

    /// Closes `id`'s open file if nobody holds or waits on it any more.
    async fn close_if_idle(&self, st: &mut State, id: FileId) {
        if let Some(fh) = st.idle_file(id) {
            if let Err(e) = self.client.release(fh).await {
                warn!(id, error = %e, "closing a file nlm locked failed");
            }
        }
    }

    async fn test(&self, nfs: &MorrisNfs, a: nlm4_testargs, peer: SocketAddr) -> nlm4_testres {
        let cookie = a.cookie.clone();
        let answer = |stat, holder| nlm4_testres {
            cookie: cookie.clone(),
            stat,
            holder,
        };
        if self.monitor.in_grace() {
            return answer(nlm4_stats::NLM4_DENIED_GRACE_PERIOD, None);
        }
        let id = match self.file_of(nfs, &a.alock).await {
            Ok(id) => id,
            Err(s) => return answer(s, None),
        };
        let mut st = self.state.lock().await;
        let owner = st.owner(owner_key(&a.alock, peer.ip()));
        let out = match self.open(&mut st, id).await {
            Ok(fh) => {
                match self
                    .client
                    .test_lock(fh, owner, range_of(&a.alock), a.exclusive)
                    .await
                {
                    Ok(None) => answer(nlm4_stats::NLM4_GRANTED, None),
                    Ok(Some(l)) => answer(
                        nlm4_stats::NLM4_DENIED,
                        Some(nlm4_holder {
                            exclusive: l.write,
                            svid: l.pid,
                            oh: Opaque::owned(Vec::new()),
                            l_offset: l.start,
                            l_len: if l.end == u64::MAX {
                                0
                            } else {
                                l.end - l.start + 1
                            },
                        }),
                    ),
                    Err(e) => answer(stat_of(&e), None),
                }
            }
            Err(s) => answer(s, None),
        };
        self.close_if_idle(&mut st, id).await;
        st.forget_if_idle(owner);
        out
    }

    async fn lock(self: &Arc<Self>, nfs: &MorrisNfs, a: nlm4_lockargs, conn: Conn) -> nlm4_stats {
        let peer = conn.peer;
        // After a restart only reclaims, and reclaims only then (a lock
        // reclaimed later may have been someone else's meanwhile).
        let grace = self.monitor.in_grace();
        if grace != a.reclaim {
            return nlm4_stats::NLM4_DENIED_GRACE_PERIOD;
        }
        let id = match self.file_of(nfs, &a.alock).await {
            Ok(id) => id,
            Err(s) => return s,
        };
        // Known before it holds anything, so that a restart tells it.
        let host = nsm::Host {
            name: String::from_utf8_lossy(a.alock.caller_name.as_ref()).into_owned(),
            addr: peer.ip(),
            server: conn.local.ip(),
        };
        if let Err(e) = self.monitor.note(host) {
            warn!(error = %e, "cannot record an nfs client's host; its lock is refused");
            return nlm4_stats::NLM4_DENIED_NOLOCKS;
        }
        let (start, end) = range_of(&a.alock);
        let kind = if a.exclusive {
            LockKind::Write
        } else {
            LockKind::Read
        };
        let mut st = self.state.lock().await;
        let owner = st.owner(owner_key(&a.alock, peer.ip()));
        let key: WaitKey = (owner, id, start, end, a.exclusive);
        if st.waits.contains_key(&key) {
            // Asked again while the wait goes on.
            return nlm4_stats::NLM4_BLOCKED;
        }
        let fh = match self.open(&mut st, id).await {
            Ok(fh) => fh,
            Err(s) => {
                st.forget_if_idle(owner);
                return s;
            }
        };
        let r = if a.reclaim {
            // A reclaim waits for the previous run's hold on the lock to
            // lapse (its session's end, a lease time after it stopped), up
            // to the end of the grace period, with the table free meanwhile.
            if let Some(f) = st.files.get_mut(&id) {
                f.waiting += 1;
            }
            drop(st);
            let until = self.monitor.grace_until();
            let r = self
                .client
                .lock(fh, owner, a.alock.svid, (start, end), kind, true, || {
                    until.is_none_or(|t| std::time::Instant::now() >= t)
                })
                .await;
            st = self.state.lock().await;
            if let Some(f) = st.files.get_mut(&id) {
                f.waiting = f.waiting.saturating_sub(1);
            }
            r
        } else {
            self.client
                .lock(fh, owner, a.alock.svid, (start, end), kind, false, || false)
                .await
        };
        match r {
            Ok(()) => {
                if let Some(f) = st.files.get_mut(&id) {
                    f.held.entry(owner).or_default().add(start, end);
                }
                debug!(
                    id,
                    owner,
                    start,
                    end,
                    exclusive = a.exclusive,
                    "nlm lock granted"
                );
                nlm4_stats::NLM4_GRANTED
            }
            Err(e) if e.code == ErrorCode::WouldBlock && a.block => {
                let waiter = Arc::new(Waiter {
                    cancelled: AtomicBool::new(false),
                });
                st.waits.insert(key, waiter.clone());
                if let Some(f) = st.files.get_mut(&id) {
                    f.waiting += 1;
                }
                let me = self.clone();
                tokio::spawn(async move {
                    me.wait_for(fh, key, a, kind, peer, waiter).await;
                });
                nlm4_stats::NLM4_BLOCKED
            }
            Err(e) => {
                let s = stat_of(&e);
                if s == nlm4_stats::NLM4_FAILED {
                    warn!(id, error = %e, "nlm lock failed");
                }
                self.close_if_idle(&mut st, id).await;
                st.forget_if_idle(owner);
                s
            }
        }
    }

    /// A blocked lock's wait: once granted, the client is told (`GRANTED`).
    async fn wait_for(
        self: Arc<Self>,
        fh: u64,
        key: WaitKey,
        a: nlm4_lockargs,
        kind: LockKind,
        peer: SocketAddr,
        waiter: Arc<Waiter>,
    ) {
        let (owner, id, start, end, _) = key;
        let r = self
            .client
            .lock(fh, owner, a.alock.svid, (start, end), kind, true, || {
                waiter.cancelled.load(Ordering::Relaxed)
            })
            .await;
        let granted = {
            let mut st = self.state.lock().await;
            st.waits.remove(&key);
            if let Some(f) = st.files.get_mut(&id) {
                f.waiting = f.waiting.saturating_sub(1);
            }
            let cancelled = waiter.cancelled.load(Ordering::Relaxed);
            let granted = match r {
                Ok(()) if cancelled => {
                    // Cancelled as it was granted: give it back.
                    self.give_back(fh, owner, (start, end)).await;
                    false
                }
                Ok(()) => {
                    if let Some(f) = st.files.get_mut(&id) {
                        f.held.entry(owner).or_default().add(start, end);
                    }
                    true
                }
                Err(e) => {
                    debug!(id, owner, error = %e, "nlm wait ended without the lock");
                    false
                }
            };
            if !granted {
                self.close_if_idle(&mut st, id).await;
                st.forget_if_idle(owner);
            }
            granted
        };
        if !granted {
            return;
        }
        info!(id, owner, start, end, client = %peer.ip(), "blocked nlm lock granted");
        let args = nlm4_testargs {
            cookie: a.cookie.clone(),
            exclusive: a.exclusive,
            alock: a.alock.clone(),
        };
        match granted_callback(peer.ip(), &args).await {
            Some(nlm4_stats::NLM4_GRANTED) => {}
            Some(s) => {
                // The client no longer waits for it.
                debug!(id, owner, stat = ?s, "the client refused a granted nlm lock; giving it back");
                let mut st = self.state.lock().await;
                self.give_back(fh, owner, (start, end)).await;
                st.released(id, owner, (start, end));
                self.close_if_idle(&mut st, id).await;
                st.forget_if_idle(owner);
            }
            // Unreachable: the client asks again by itself and finds the
            // lock its own.
            None => {}
        }
    }

    /// Unlocks `range` of open file `fh` for `owner`.
    async fn give_back(&self, fh: u64, owner: u64, range: (u64, u64)) {
        if let Err(e) = self
            .client
            .lock(fh, owner, 0, range, LockKind::Unlock, false, || false)
            .await
        {
            warn!(owner, error = %e, "giving an nlm lock back failed");
        }
    }

    async fn cancel(&self, a: nlm4_cancargs, peer: SocketAddr) -> nlm4_stats {
        let st = self.state.lock().await;
        let Some(&owner) = st.owners.get(&owner_key(&a.alock, peer.ip())) else {
            return nlm4_stats::NLM4_GRANTED;
        };
        let (start, end) = range_of(&a.alock);
        for (k, w) in &st.waits {
            if k.0 == owner && (k.2, k.3, k.4) == (start, end, a.exclusive) {
                w.cancelled.store(true, Ordering::Relaxed);
            }
        }
        nlm4_stats::NLM4_GRANTED
    }

    async fn unlock(&self, a: nlm4_unlockargs, peer: SocketAddr) -> nlm4_stats {
        let mut st = self.state.lock().await;
        let Some(&owner) = st.owners.get(&owner_key(&a.alock, peer.ip())) else {
            // Holds nothing here.
            return nlm4_stats::NLM4_GRANTED;
        };
        let (start, end) = range_of(&a.alock);
        let fh3 = nfs_fh3 {
            data: Opaque::owned(a.alock.fh.as_ref().to_vec()),
        };
        let Ok(h) = self.handles.decode(&fh3) else {
            return nlm4_stats::NLM4_STALE_FH;
        };
        let id = h.id();
        let Some(fh) = st.files.get(&id).map(|f| f.fh) else {
            return nlm4_stats::NLM4_GRANTED;
        };
        let r = self
            .client
            .lock(
                fh,
                owner,
                a.alock.svid,
                (start, end),
                LockKind::Unlock,
                false,
                || false,
            )
            .await;
        if let Err(e) = r {
            warn!(id, error = %e, "nlm unlock failed");
            return nlm4_stats::NLM4_FAILED;
        }
        st.released(id, owner, (start, end));
        self.close_if_idle(&mut st, id).await;
        st.forget_if_idle(owner);
        nlm4_stats::NLM4_GRANTED
    }

    /// Host `name` (or, from NSM, the host at `addr`) restarted: its
    /// owners' locks and waits go.
    async fn host_restarted(&self, name: &[u8], addr: Option<IpAddr>) {
        let mut st = self.state.lock().await;
        let gone: Vec<u64> = st
            .keys
            .iter()
            .filter(|(_, k)| k.0 == name || Some(k.1) == addr)
            .map(|(&n, _)| n)
            .collect();
        if gone.is_empty() {
            return;
        }
        for w in st
            .waits
            .iter()
            .filter(|(k, _)| gone.contains(&k.0))
            .map(|(_, w)| w)
        {
            w.cancelled.store(true, Ordering::Relaxed);
        }
        let mut files = Vec::new();
        for (&id, f) in &st.files {
            for owner in &gone {
                if f.held.contains_key(owner) {
                    files.push((id, f.fh, *owner));
                }
            }
        }
        for &(id, fh, owner) in &files {
            self.give_back(fh, owner, (0, u64::MAX)).await;
            if let Some(f) = st.files.get_mut(&id) {
                f.held.remove(&owner);
            }
        }
        for &(id, _, _) in &files {
            self.close_if_idle(&mut st, id).await;
        }
        for owner in gone {
            st.forget_if_idle(owner);
        }
        info!(
            host = %String::from_utf8_lossy(name),
            locks = files.len(),
            "an nfs client restarted: its locks are given up"
        );
    }
}

/// Calls `NLM4_GRANTED` at the client host `ip` (its lock manager's port
/// from its portmapper): the client's answer, or `None` if it could not be
/// reached.
async fn granted_callback(ip: IpAddr, args: &nlm4_testargs) -> Option<nlm4_stats> {
    use nfs3_client::nfs3_types::portmap::IPPROTO_TCP;
    use nfs3_client::rpc::RpcClient;
    use nfs3_client::tokio::TokioIo;
    use nfs3_client::PortmapperClient;
    use tokio::net::TcpStream;

    for attempt in 0..CALLBACK_TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let r = tokio::time::timeout(CALLBACK_TIMEOUT, async {
            let pm = TcpStream::connect(SocketAddr::new(ip, 111)).await.ok()?;
            let mut pm = PortmapperClient::new(TokioIo::new(pm));
            let port = pm.getport(NLM_PROGRAM, NLM_V4, IPPROTO_TCP).await.ok()?;
            if port == 0 {
                return None;
            }
            let s = TcpStream::connect(SocketAddr::new(ip, port)).await.ok()?;
            let mut rpc = RpcClient::new(TokioIo::new(s));
            rpc.call::<nlm4_testargs, nlm4_res>(NLM_PROGRAM, NLM_V4, proc4::GRANTED, args)
                .await
                .ok()
                .map(|r| r.stat)
        })
        .await;
        if let Ok(Some(s)) = r {
            return Some(s);
        }
    }
    debug!(client = %ip, "the nlm GRANTED callback found no lock manager");
    None
}
