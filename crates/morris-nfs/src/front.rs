//! The listening socket. Every call is read here first: calls from hosts
//! outside `--export-allow` are refused, the procedures `nfs3_server` cannot
//! express are answered by `local`, and the rest are relayed to an
//! `nfs3_server` instance acting for the call's AUTH_UNIX credential (one
//! instance per distinct credential, on a loopback port), so that every
//! procedure is checked against the caller's real permissions.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use std::collections::{HashMap, HashSet};

use morris_client::Caller;
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, auth_flavor, auth_stat, auth_unix, msg_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::Unpack;
use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::export::ExportName;
use crate::fs::MorrisNfs;
use crate::local::{self, auth_error, is_local, refusal, rpc_error, Handles, Proc};

/// A source network allowed to use the export (`10.0.0.0/8`, `::1/128`, or
/// a bare address for one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// A malformed `--export-allow` entry.
#[derive(Debug, thiserror::Error)]
#[error("invalid network {0:?}: expected ADDRESS or ADDRESS/PREFIX")]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let bad = || CidrError(s.to_string());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses count
    /// as their IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Whether `ip` may use the export (`allow` empty: everyone may).
pub(crate) fn allowed(allow: &[Cidr], ip: IpAddr) -> bool {
    allow.is_empty() || allow.iter().any(|c| c.contains(ip))
}

/// Largest RPC record accepted from a client (a 1 MiB WRITE plus headers
/// fits); a larger one closes the connection instead of being buffered.
const MAX_RECORD: usize = 2 << 20;

/// Most distinct credentials with their own `nfs3_server` instance; past it
/// the least recently created is retired.
const MAX_CREDENTIALS: usize = 256;

/// A caller's identity as the key of its `nfs3_server` instance.
type CredKey = (u32, u32, Vec<u32>);

/// Who may do what through the gateway (`GatewayConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// uid 0 → nobody, gid 0 → nobody's group.
    pub(crate) squash_root: bool,
    /// Privileged source ports only.
    pub(crate) secure: bool,
    /// MKNOD may make device nodes.
    pub(crate) allow_devices: bool,
}

impl Policy {
    /// The identity a call's credential acts as.
    pub(crate) fn identity(&self, mut c: Caller) -> Caller {
        if self.squash_root {
            if c.uid == 0 {
                c.uid = NOBODY;
            }
            if c.gid == 0 {
                c.gid = NOBODY;
            }
            c.groups.retain(|&g| g != 0);
        }
        c
    }

    /// Whether a connection from `peer` may be served.
    pub(crate) fn port_ok(&self, peer: SocketAddr) -> bool {
        !self.secure || peer.port() < 1024
    }
}

/// What every connection shares.
pub(crate) struct Shared {
    /// The file system acting as root; instances per caller derive from it.
    pub(crate) nfs: MorrisNfs,
    pub(crate) handles: Handles,
    pub(crate) generation: u64,
    /// The write verifier of this gateway run.
    pub(crate) verifier: [u8; 8],
    pub(crate) allow: Vec<Cidr>,
    /// The named export (besides `/`).
    pub(crate) export: ExportName,
    pub(crate) policy: Policy,
    /// NFSv3 locking (NLM, NSM).
    pub(crate) nlm: Arc<crate::nlm::LockManager>,
    backends: tokio::sync::Mutex<Backends>,
    /// Each call's time (`metrics.rs`).
    pub(crate) metrics: Arc<crate::metrics::NfsMetrics>,
}

#[derive(Default)]
struct Backends {
    by_cred: HashMap<CredKey, (u16, u64, tokio::task::JoinHandle<()>)>,
    next: u64,
}

impl Drop for Backends {
    fn drop(&mut self) {
        for (_, _, task) in self.by_cred.values() {
            task.abort();
        }
    }
}

impl Shared {
    /// State shared by the connections of one gateway run.
    pub(crate) fn new(
        nfs: MorrisNfs,
        generation: u64,
        allow: Vec<Cidr>,
        export: ExportName,
        policy: Policy,
        monitor: Arc<crate::nlm::nsm::Monitor>,
    ) -> Self {
        // Differs between runs: clients resend UNSTABLE writes a restart lost.
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id());
        let handles = Handles::new(generation);
        Shared {
            nlm: crate::nlm::LockManager::new(nfs.client.clone(), handles, monitor),
            nfs,
            handles,
            generation,
            verifier: boot.to_be_bytes(),
            allow,
            export,
            policy,
            backends: tokio::sync::Mutex::new(Backends::default()),
            metrics: Arc::new(crate::metrics::NfsMetrics::new()),
        }
    }

    /// The loopback port of the `nfs3_server` instance acting for `caller`,
    /// started on first use.
    async fn backend(&self, caller: &Caller) -> std::io::Result<u16> {
        let key: CredKey = (caller.uid, caller.gid, caller.groups.clone());
        let mut b = self.backends.lock().await;
        if let Some((port, _, _)) = b.by_cred.get(&key) {
            return Ok(*port);
        }
        if b.by_cred.len() >= MAX_CREDENTIALS {
            let oldest = b
                .by_cred
                .iter()
                .min_by_key(|(_, (_, n, _))| *n)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                if let Some((_, _, task)) = b.by_cred.remove(&k) {
                    task.abort();
                }
            }
        }
        let fs = self.nfs.for_caller(caller.clone());
        let listener =
            NFSTcpListener::bind_with_generation("127.0.0.1:0", fs, self.generation).await?;
        let port = listener.get_listen_port();
        let task = tokio::spawn(async move {
            if let Err(e) = listener.handle_forever().await {
                tracing::warn!(error = %e, "an nfs backend stopped accepting");
            }
        });
        b.next += 1;
        let n = b.next;
        b.by_cred.insert(key, (port, n, task));
        tracing::debug!(
            uid = caller.uid,
            gid = caller.gid,
            port,
            "nfs backend started"
        );
        Ok(port)
    }
}

/// Accepts connections forever.
pub(crate) async fn accept_loop(front: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    loop {
        let (sock, peer) = match front.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors and the like: keep serving the others.
                tracing::warn!(error = %e, "accepting an nfs connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let admitted = if !allowed(&shared.allow, peer.ip()) {
            tracing::warn!(%peer, "nfs connection from a host outside --export-allow: refusing its calls");
            Admitted::No
        } else if !shared.policy.port_ok(peer) {
            tracing::warn!(%peer, "nfs connection from an unprivileged port (not below 1024): refusing its calls (--insecure allows them)");
            Admitted::InsecurePort
        } else {
            tracing::debug!(%peer, "nfs connection admitted");
            Admitted::Yes
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            match connection(sock, peer, admitted, shared).await {
                Ok(()) => tracing::debug!(%peer, "nfs connection closed"),
                Err(e) => tracing::debug!(%peer, error = %e, "nfs connection ended"),
            }
        });
    }
}

/// Reads one RPC record (all fragments); `None` at a clean end of stream.
pub(crate) async fn read_record(
    rd: &mut (impl AsyncRead + Unpin),
) -> std::io::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match rd.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && record.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        let mark = u32::from_be_bytes(mark);
        let len = (mark & 0x7fff_ffff) as usize;
        if record.len() + len > MAX_RECORD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("rpc record larger than {MAX_RECORD} bytes"),
            ));
        }
        let start = record.len();
        record.resize(start + len, 0);
        rd.read_exact(&mut record[start..]).await?;
        if mark & 0x8000_0000 != 0 {
            return Ok(Some(record));
        }
    }
}

/// A record with a single-fragment record mark in front.
fn framed(record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(record.len() + 4);
    let len = u32::try_from(record.len()).unwrap_or(u32::MAX) & 0x7fff_ffff;
    out.extend_from_slice(&(0x8000_0000 | len).to_be_bytes());
    out.extend_from_slice(record);
    out
}

/// A parsed call header: the procedure, the caller (`None`: a credential
/// flavor the gateway does not accept) and where the arguments start.
pub(crate) fn parse_call(record: &[u8]) -> Option<(Proc, Option<Caller>, usize)> {
    let mut c = std::io::Cursor::new(record);
    let (msg, _) = rpc_msg::unpack(&mut c).ok()?;
    let msg_body::CALL(call) = msg.body else {
        return None;
    };
    let p = Proc {
        xid: msg.xid,
        prog: call.prog,
        vers: call.vers,
        proc_: call.proc,
    };
    let caller = match call.cred.flavor {
        auth_flavor::AUTH_UNIX => {
            let body: &[u8] = call.cred.body.as_ref();
            auth_unix::unpack(&mut std::io::Cursor::new(body))
                .ok()
                .map(|(a, _)| Caller {
                    uid: a.uid,
                    gid: a.gid,
                    groups: a.gids,
                    check: true,
                    umask: 0,
                })
        }
        auth_flavor::AUTH_NULL => Some(Caller {
            uid: NOBODY,
            gid: NOBODY,
            groups: vec![],
            check: true,
            umask: 0,
        }),
        _ => None,
    };
    let pos = usize::try_from(c.position()).ok()?;
    Some((p, caller, pos))
}

/// Xids of relayed WRITE and COMMIT calls whose replies get this run's verifier.
type Verifying = Arc<parking_lot::Mutex<HashSet<u32>>>;

/// Most WRITE/COMMIT calls awaiting their reply per connection.
const MAX_VERIFYING: usize = 65_536;

const NFS_PROGRAM: u32 = 100_003;
const NFSPROC3_WRITE: u32 = 7;
const NFSPROC3_COMMIT: u32 = 21;

/// Puts `verifier` into a successful WRITE or COMMIT reply, whose last 8
/// bytes are the write verifier (RFC 1813 WRITE3resok / COMMIT3resok).
/// `nfs3_server` would send its handle generation there, which must not
/// change across restarts (handles stay valid) while the verifier must.
pub(crate) fn patch_verifier(rec: &mut [u8], verifier: &[u8; 8]) {
    let word = |at: usize| -> Option<u32> {
        rec.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    // xid, REPLY, MSG_ACCEPTED, verf flavor, verf length.
    if word(4) != Some(1) || word(8) != Some(0) {
        return;
    }
    let Some(vlen) = word(16) else { return };
    let at = 20 + (vlen as usize).div_ceil(4) * 4;
    // accept_stat SUCCESS, then nfsstat3 NFS3_OK.
    if word(at) != Some(0) || word(at + 4) != Some(0) || rec.len() < at + 8 + 8 {
        return;
    }
    let n = rec.len();
    rec[n - 8..].copy_from_slice(verifier);
}

/// The user and group AUTH_NULL callers act as.
const NOBODY: u32 = 65_534;

/// Whether a connection's calls are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    Yes,
    /// Its host is outside `--export-allow`.
    No,
    /// It comes from an unprivileged source port (`secure`).
    InsecurePort,
}

/// Serves one client connection: local procedures here, the rest relayed to
/// the `nfs3_server` instance of the call's credential; replies of both are
/// written back as they complete (RPC replies are matched by xid).
async fn connection(
    sock: TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let local = sock.local_addr()?;
    let (mut rd, mut wr) = sock.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        while let Some(buf) = rx.recv().await {
            if wr.write_all(&buf).await.is_err() {
                break;
            }
        }
    });
    let mut backends: HashMap<CredKey, OwnedWriteHalf> = HashMap::new();
    // Calls answered here and relays of backends' replies; finished ones
    // are reaped as calls come in, so a long connection does not keep them.
    let mut tasks = tokio::task::JoinSet::new();
    let verifying: Verifying = Arc::new(parking_lot::Mutex::new(HashSet::new()));
    let pending = crate::metrics::Pending::default();
    let result = loop {
        let record = match read_record(&mut rd).await {
            Ok(Some(r)) => r,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let Some((p, caller, args_at)) = parse_call(&record) else {
            break Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "garbage rpc call",
            ));
        };
        while tasks.try_join_next().is_some() {}
        let caller = match (admitted, caller) {
            (Admitted::Yes, Some(c)) => shared.policy.identity(c),
            // Outside the allow-list; an unprivileged port; a credential
            // flavor the gateway does not take.
            (admitted, _) => {
                let no = if admitted == Admitted::No {
                    refusal(&p)
                } else {
                    auth_error(p.xid, auth_stat::AUTH_TOOWEAK)
                };
                if tx.send(no).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        let started = std::time::Instant::now();
        let name = crate::metrics::proc_name(&p);
        if crate::nlm::is_nlm(&p) {
            let shared = shared.clone();
            let tx = tx.clone();
            tasks.spawn(async move {
                let nfs = shared.nfs.for_caller(caller);
                let out = shared
                    .nlm
                    .handle(
                        &nfs,
                        p,
                        &record[args_at..],
                        crate::nlm::Conn { peer, local },
                    )
                    .await;
                shared.metrics.answered(name, started);
                let _ = tx.send(out).await;
            });
            continue;
        }
        if is_local(&p) {
            let shared = shared.clone();
            let tx = tx.clone();
            tasks.spawn(async move {
                let nfs = shared.nfs.for_caller(caller);
                let out = local::handle(&nfs, &shared, p, &record[args_at..]).await;
                shared.metrics.answered(name, started);
                let _ = tx.send(out).await;
            });
            continue;
        }
        let key: CredKey = (caller.uid, caller.gid, caller.groups.clone());
        if !backends.contains_key(&key) {
            match open_backend(
                &shared,
                &caller,
                tx.clone(),
                (verifying.clone(), pending.clone()),
                &mut tasks,
            )
            .await
            {
                Ok(w) => {
                    backends.insert(key.clone(), w);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start an nfs backend");
                    let _ = tx
                        .send(rpc_error(p.xid, accept_stat_data::SYSTEM_ERR))
                        .await;
                    continue;
                }
            }
        }
        if p.prog == NFS_PROGRAM
            && p.vers == 3
            && matches!(p.proc_, NFSPROC3_WRITE | NFSPROC3_COMMIT)
        {
            let mut v = verifying.lock();
            if v.len() >= MAX_VERIFYING {
                // Calls the backend never answered (retransmissions it dropped).
                v.clear();
            }
            v.insert(p.xid);
        }
        pending.sent(p.xid, name);
        let sent = match backends.get_mut(&key) {
            Some(w) => w.write_all(&framed(&record)).await,
            None => Ok(()),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "relaying an nfs call failed");
            backends.remove(&key);
            let _ = tx
                .send(rpc_error(p.xid, accept_stat_data::SYSTEM_ERR))
                .await;
        }
    };
    drop(backends);
    tasks.abort_all();
    drop(tx);
    let _ = writer.await;
    result
}

/// Connects to the backend of `caller` and relays its replies to `tx`.
async fn open_backend(
    shared: &Shared,
    caller: &Caller,
    tx: mpsc::Sender<Vec<u8>>,
    (verifying, pending): (Verifying, crate::metrics::Pending),
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<OwnedWriteHalf> {
    let verifier = shared.verifier;
    let metrics = shared.metrics.clone();
    let port = shared.backend(caller).await?;
    let sock = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let _ = sock.set_nodelay(true);
    let (mut rd, w) = sock.into_split();
    tasks.spawn(async move {
        while let Ok(Some(mut rec)) = read_record(&mut rd).await {
            if rec.len() >= 4 {
                let xid = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
                if verifying.lock().remove(&xid) {
                    patch_verifier(&mut rec, &verifier);
                }
                if let Some((name, started)) = pending.answered(xid) {
                    metrics.answered(name, started);
                }
            }
            if tx.send(framed(&rec)).await.is_err() {
                break;
            }
        }
    });
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_match() {
        let n: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains("10.1.2.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.9.9".parse().unwrap()));
        let h: Cidr = "127.0.0.1".parse().unwrap();
        assert!(h.contains("127.0.0.1".parse().unwrap()));
        assert!(!h.contains("127.0.0.2".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!(allowed(&[], "1.2.3.4".parse().unwrap()));
        assert!(!allowed(&[h], "1.2.3.4".parse().unwrap()));
    }

    #[test]
    fn verifier_is_patched_only_in_successful_replies() {
        let mut ok: Vec<u8> = Vec::new();
        for w in [5u32, 1, 0, 0, 0, 0, 0] {
            ok.extend_from_slice(&w.to_be_bytes());
        }
        ok.extend_from_slice(&[0u8; 16]); // attributes, count, committed (abridged)
        ok.extend_from_slice(&[9u8; 8]);
        let mut failed = ok.clone();
        failed[27] = 13; // nfsstat3 = NFS3ERR_ACCES
        patch_verifier(&mut ok, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&ok[ok.len() - 8..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        patch_verifier(&mut failed, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&failed[failed.len() - 8..], &[9u8; 8]);
        let mut short = vec![0u8; 10];
        patch_verifier(&mut short, &[1; 8]);
        assert_eq!(short, vec![0u8; 10]);
    }

    #[test]
    fn framing_and_call_parsing() {
        // A MOUNT NULL call with AUTH_UNIX uid 1000 gid 100 groups [4, 27].
        let mut call: Vec<u8> = Vec::new();
        for w in [7u32, 0, 2, 100_005, 3, 0, 1] {
            call.extend_from_slice(&w.to_be_bytes());
        }
        let mut cred = Vec::new();
        for w in [0u32, 0, 1000, 100, 2, 4, 27] {
            cred.extend_from_slice(&w.to_be_bytes());
        }
        call.extend_from_slice(&(cred.len() as u32).to_be_bytes());
        call.extend_from_slice(&cred);
        call.extend_from_slice(&[0; 8]);
        let (p, caller, at) = parse_call(&call).unwrap();
        assert_eq!((p.xid, p.prog, p.vers, p.proc_), (7, 100_005, 3, 0));
        let c = caller.unwrap();
        assert_eq!((c.uid, c.gid, c.groups.clone()), (1000, 100, vec![4, 27]));
        assert!(c.check);
        assert_eq!(at, call.len());
        assert!(parse_call(&call[..10]).is_none());
        let f = framed(&call);
        assert_eq!(&f[..4], &(0x8000_0000u32 | call.len() as u32).to_be_bytes());
        // The refusal of an NFS GETATTR: accepted reply, status NFS3ERR_ACCES.
        let r = refusal(&Proc {
            xid: 9,
            prog: 100_003,
            vers: 3,
            proc_: 1,
        });
        assert_eq!(&r[4..8], &9u32.to_be_bytes());
        assert_eq!(&r[r.len() - 4..], &13u32.to_be_bytes());
    }
}
