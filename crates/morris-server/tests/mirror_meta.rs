//! Mirrored metadata over the wire: real servers on 127.0.0.1, raw protocol.
//! Changes reach the other copy before they are answered; a lost primary's
//! range is taken over; a cut between the two copies never lets two
//! servers grant conflicting write leases; a returning primary becomes the
//! copy and catches up.

use std::time::{Duration, Instant};

use bytes::Bytes;
use morris_proto::auth::{Key, Keys};
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{
    Attr, ErrorCode, FileKind, Handle, Inode, RangeStatus, Reply, Request, ServerStats, Timestamp,
    VolumeDescriptor, PROTOCOL_VERSION, ROOT_ID,
};
use morris_server::{start, ServerConfig, ServerHandle};

/// The volume key of every test volume here.
static KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(Key::generate);
use uuid::Uuid;

const LEASE_MS: u32 = 1000;
const K: u32 = 2;

async fn server(dir: &std::path::Path, listen: &str) -> ServerHandle {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match start(ServerConfig {
            data_dir: dir.to_path_buf(),
            listen: listen.into(),
            lease_ms: LEASE_MS,
            etcd: Vec::new(),
            etcd_auth: Default::default(),
            keys: Keys::from_key(KEY.clone()),
            max_connections: 4096,
            scrub_every: None,
            scrub_rate: 0,
        })
        .await
        {
            Ok(h) => return h,
            // The previous run of this data directory is still letting go.
            Err(e) if Instant::now() < deadline => {
                eprintln!("restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("server does not start: {e}"),
        }
    }
}

struct Vol {
    dirs: Vec<tempfile::TempDir>,
    addrs: Vec<String>,
    servers: Vec<Option<ServerHandle>>,
    uuid: Uuid,
}

async fn volume() -> Vol {
    volume_of(K, 2).await
}

/// `k` servers formatted as one volume with `replicas` copies.
async fn volume_of(k: u32, replicas: u8) -> Vol {
    let dirs: Vec<_> = (0..k)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let mut servers = Vec::new();
    for d in &dirs {
        servers.push(Some(server(d.path(), "127.0.0.1:0").await));
    }
    let addrs: Vec<String> = servers
        .iter()
        .map(|h| {
            h.as_ref()
                .map(|h| h.local_addr().to_string())
                .unwrap_or_default()
        })
        .collect();
    let desc = VolumeDescriptor {
        uuid: Uuid::new_v4(),
        servers: addrs.clone(),
        stripe_unit: 4096,
        replicas,
        created: Timestamp::now(),
    };
    for (i, a) in addrs.iter().enumerate() {
        let c = admin(a).await;
        c.call(&Request::Format {
            descriptor: desc.clone(),
            index: i as u32,
        })
        .await
        .expect("format");
    }
    let v = Vol {
        dirs,
        addrs,
        servers,
        uuid: desc.uuid,
    };
    for i in 0..k {
        v.wait_range(i, |r| r.primary && r.ready).await;
    }
    v
}

async fn admin(addr: &str) -> Conn {
    let c = RpcClient::connect(addr, &KEY, None).await.expect("connect");
    c.call(
        &Request::Hello {
            volume: None,
            client_id: rand_id(),
            client_name: "test-admin".into(),
            version: PROTOCOL_VERSION,
        },
        Bytes::new(),
    )
    .await
    .expect("hello");
    Conn(c)
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

struct Conn(RpcClient);

impl Conn {
    async fn call(&self, req: &Request) -> Result<Reply, RpcError> {
        self.0.call(req, Bytes::new()).await.map(|(r, _)| r)
    }
}

impl Vol {
    /// A client session with server `i` (`None` if it does not answer).
    async fn client(&self, i: u32, id: u64) -> Option<Conn> {
        let c = RpcClient::connect(&self.addrs[i as usize], &KEY.client_key(), None)
            .await
            .ok()?;
        c.call(
            &Request::Hello {
                volume: Some(self.uuid),
                client_id: id,
                client_name: format!("test-{id}"),
                version: PROTOCOL_VERSION,
            },
            Bytes::new(),
        )
        .await
        .ok()?;
        Some(Conn(c))
    }

    async fn status(&self, i: u32) -> Option<ServerStats> {
        let c = RpcClient::connect(&self.addrs[i as usize], &KEY.client_key(), None)
            .await
            .ok()?;
        let hello = Request::Hello {
            volume: None,
            client_id: 7,
            client_name: "status".into(),
            version: PROTOCOL_VERSION,
        };
        c.call(&hello, Bytes::new()).await.ok()?;
        match c.call(&Request::Status, Bytes::new()).await.ok()?.0 {
            Reply::Status(s) => Some(*s),
            _ => None,
        }
    }

    /// Waits until server `i`'s copy of range `range` satisfies `f`.
    async fn wait_copy(&self, i: u32, range: u32, f: impl Fn(&RangeStatus) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status(i).await;
            let r = s
                .as_ref()
                .and_then(|s| s.ranges.iter().find(|r| r.range == range).cloned());
            if r.as_ref().is_some_and(&f) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server {i}, range {range}: still {r:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until server `i`'s home range satisfies `f`.
    async fn wait_range(&self, i: u32, f: impl Fn(&RangeStatus) -> bool) {
        self.wait_copy(i, i, f).await
    }

    /// Stops server `i` as a crash would: it answers nothing more.
    async fn kill(&mut self, i: u32) {
        if let Some(h) = self.servers[i as usize].take() {
            h.shutdown().await;
        }
    }

    async fn restart(&mut self, i: u32) {
        let h = server(self.dirs[i as usize].path(), &self.addrs[i as usize]).await;
        self.servers[i as usize] = Some(h);
    }

    /// Restarts the servers `back`, which must come back as current copies
    /// of range `range`, served by `primary` with every copy current.
    async fn restart_as_copies(&mut self, range: u32, back: &[u32], primary: u32) {
        for &i in back {
            self.restart(i).await;
        }
        for &i in back {
            self.wait_copy(i, range, |x| !x.primary && x.ready).await;
        }
        self.wait_copy(primary, range, |x| x.primary && x.ready && x.peer_in_sync)
            .await;
    }

    fn handle(&self, i: u32) -> &ServerHandle {
        self.servers[i as usize].as_ref().expect("running")
    }
}

fn attr(kind: FileKind) -> Attr {
    let now = Timestamp::now();
    Attr {
        kind,
        mode: 0o644,
        uid: 0,
        gid: 0,
        nlink: 1,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        rdev: 0,
        flags: 0,
    }
}

/// Retries `req` on server `i` through `NotOwner`, `Grace` and a lost
/// connection for up to 20 s (a takeover), with a fresh session each try.
async fn call_until(v: &Vol, i: u32, id: u64, req: &Request) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = v.client(i, id).await {
            match c.call(req).await {
                Ok(r) => return r,
                Err(e) => {
                    let code = e.code();
                    assert!(
                        matches!(
                            code,
                            ErrorCode::NotOwner | ErrorCode::Grace | ErrorCode::Unavailable
                        ),
                        "{} on server {i}: {e}",
                        req.name()
                    );
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never served by server {i}",
            req.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn inode(r: Reply) -> Inode {
    match r {
        Reply::Inode(i) | Reply::Leased { inode: i, .. } => i,
        other => panic!("expected an inode, got {other:?}"),
    }
}

/// The root directory is in range `ROOT_ID mod K`, served by that server.
fn root_range() -> u32 {
    (ROOT_ID % u64::from(K)) as u32
}

async fn root(v: &Vol, at: u32) -> Handle {
    inode(call_until(v, at, 1, &Request::GetInode { ino: ROOT_ID }).await).handle()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primarys_range_is_served_by_its_copy_with_every_answered_change() {
    let mut v = volume().await;
    let r = root_range();
    let other = (r + 1) % K;
    v.wait_copy(other, r, |x| !x.primary && x.ready).await;
    let root = root(&v, r).await;
    // A file whose inode lives in the other range, named in the root.
    let c = v.client(other, 11).await.expect("client");
    let f = inode(
        c.call(&Request::CreateInode {
            parent: ROOT_ID,
            attr: attr(FileKind::File),
            target: None,
            home: None,
            op: 0,
            xattrs: vec![],
        })
        .await
        .expect("create"),
    );
    let c = v.client(r, 11).await.expect("client");
    for i in 0..50 {
        c.call(&Request::Link {
            dir: root,
            name: format!("f{i}").into_bytes(),
            child: f.handle(),
            kind: FileKind::File,
            replace: None,
            op: 0,
        })
        .await
        .expect("link");
    }
    c.call(&Request::Unlink {
        dir: root,
        name: b"f7".to_vec(),
        expect: None,
        op: 0,
    })
    .await
    .expect("unlink");
    drop(c);

    // The root's server dies; its copy takes the range over after the
    // ownership lease and serves every change that was answered.
    v.kill(r).await;
    let lookup = |name: &str| Request::Lookup {
        dir: root,
        name: name.as_bytes().to_vec(),
    };
    for i in 0..50 {
        let got = call_until(&v, other, 12, &lookup(&format!("f{i}"))).await;
        let Reply::Entry(e) = got else {
            panic!("{got:?}")
        };
        if i == 7 {
            assert!(e.is_none(), "f7 was unlinked before the crash");
        } else {
            assert_eq!(e.map(|e| e.child), Some(f.handle()), "f{i}");
        }
    }
    v.wait_copy(other, r, |x| x.primary && x.ready && x.gen >= 2)
        .await;
    // Changes go on at the new primary.
    let c = v.client(other, 13).await.expect("client");
    c.call(&Request::Link {
        dir: root,
        name: b"after".to_vec(),
        child: f.handle(),
        kind: FileKind::File,
        replace: None,
        op: 0,
    })
    .await
    .expect("link at the new primary");
    drop(c);

    // The old primary returns: it learns the higher generation, keeps the
    // copy, and is brought up to date (including "after").
    v.restart(r).await;
    v.wait_range(r, |x| !x.primary && x.ready).await;
    let c = v.client(r, 14).await.expect("client");
    let refused = c.call(&lookup("after")).await;
    assert!(
        matches!(&refused, Err(e) if e.code() == ErrorCode::NotOwner),
        "the old primary must not serve its range: {refused:?}"
    );
    // Now the new primary dies: the returned server takes the range back,
    // with the change made while it was away.
    v.kill(other).await;
    let got = call_until(&v, r, 15, &lookup("after")).await;
    expect_entry(&got, &f, "");
}

/// The write lease on the root as seen by a client of one server: the
/// instants (ms since `t0`) at which its requests that were answered under
/// the session that holds the lease were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_between_the_copies_never_gives_two_writers() {
    let v = volume().await;
    let r = root_range();
    let other = (r + 1) % K;
    v.wait_copy(other, r, |x| !x.primary && x.ready).await;
    let root = root(&v, r).await;
    let t0 = Instant::now();
    let ms = |t: Instant| t.duration_since(t0).as_millis() as u64;

    // Client A takes the write lease at the primary and keeps it alive.
    let a = v.client(r, 100).await.expect("client A");
    let sent = Instant::now();
    inode(
        a.call(&Request::AcquireWrite { ino: root })
            .await
            .expect("A takes the write lease"),
    );
    let mut a_last = ms(sent);

    // Before the cut, the copy refuses to serve the range.
    let b = v.client(other, 200).await.expect("client B");
    let e = b
        .call(&Request::AcquireWrite { ino: root })
        .await
        .expect_err("the copy must not grant");
    assert_eq!(e.code(), ErrorCode::NotOwner);

    v.handle(r).cut_peers(true);
    v.handle(other).cut_peers(true);

    // A renews every 50 ms for as long as the server answers this session;
    // B asks the copy (and the old primary) until one grants it.
    let mut b_granted: Option<(u32, u64)> = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut a_alive = true;
    while b_granted.is_none() {
        assert!(Instant::now() < deadline, "no server ever granted B");
        if a_alive {
            let sent = Instant::now();
            match a.call(&Request::Renew).await {
                Ok(_) => a_last = ms(sent),
                Err(_) => a_alive = false,
            }
        }
        for s in [other, r] {
            let Some(b) = v.client(s, 200).await else {
                continue;
            };
            let sent = Instant::now();
            match b.call(&Request::AcquireWrite { ino: root }).await {
                Ok(Reply::Inode(_) | Reply::Leased { .. }) => {
                    b_granted = Some((s, ms(sent)));
                    break;
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(e) => assert!(
                    matches!(
                        e.code(),
                        ErrorCode::NotOwner | ErrorCode::Grace | ErrorCode::Unavailable
                    ),
                    "B at server {s}: {e}"
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (granter, b_at) = b_granted.expect("granted");
    assert_eq!(granter, other, "only the copy may take the range over");
    // A trusts its lease until its last answered request's send time plus
    // 7/8 of a lease (the client's rule): that must end before B's grant.
    let a_trust_end = a_last + u64::from(LEASE_MS) * 7 / 8;
    assert!(
        a_trust_end <= b_at,
        "A trusted its write lease until {a_trust_end} ms, B was granted at {b_at} ms"
    );
    // A's session at the old primary is gone (its leases with it), and the
    // old primary refuses the range.
    if let Some(a2) = v.client(r, 100).await {
        let e = a2
            .call(&Request::AcquireWrite { ino: root })
            .await
            .expect_err("old primary must refuse");
        assert!(matches!(e.code(), ErrorCode::NotOwner | ErrorCode::Grace));
    }

    // Healed: the old primary learns it was replaced and keeps the copy.
    v.handle(r).cut_peers(false);
    v.handle(other).cut_peers(false);
    v.wait_range(r, |x| !x.primary && x.ready).await;
    v.wait_copy(other, r, |x| x.primary && x.ready && x.peer_in_sync)
        .await;
}

/// A four-server volume with three copies of every metadata range, the
/// root's range (`a`) served by `a` with `b` its candidate and `c3` the
/// third copy, both current; with the root's handle and a file inode
/// (created at `c3`) to name in it.
async fn three_copies() -> (Vol, u32, u32, u32, Handle, Inode) {
    let k = 4;
    let v = volume_of(k, 3).await;
    let a = (ROOT_ID % u64::from(k)) as u32;
    let (b, c3) = ((a + 1) % k, (a + 2) % k);
    v.wait_copy(b, a, |x| !x.primary && x.ready && x.candidate)
        .await;
    v.wait_copy(c3, a, |x| !x.primary && x.ready && !x.candidate)
        .await;
    let root = root(&v, a).await;
    let f = inode(
        call_until(
            &v,
            c3,
            20,
            &Request::CreateInode {
                parent: ROOT_ID,
                attr: attr(FileKind::File),
                target: None,
                home: None,
                op: 0,
                xattrs: vec![],
            },
        )
        .await,
    );
    (v, a, b, c3, root, f)
}

/// `Link` of `f` as `name` in `dir`.
fn link_req(dir: Handle, name: &str, f: &Inode) -> Request {
    Request::Link {
        dir,
        name: name.as_bytes().to_vec(),
        child: f.handle(),
        kind: FileKind::File,
        replace: None,
        op: 0,
    }
}

/// Panics unless `got` is a `Lookup` answer naming `f`.
fn expect_entry(got: &Reply, f: &Inode, what: &str) {
    assert!(
        matches!(got, Reply::Entry(Some(e)) if e.child == f.handle()),
        "{what}: {got:?}"
    );
}

/// `Lookup` of `name` in `dir`.
fn lookup_req(dir: Handle, name: &str) -> Request {
    Request::Lookup {
        dir,
        name: name.as_bytes().to_vec(),
    }
}

/// With three copies a range survives losing two of its servers one after
/// the other: the first primary's successor takes over, brings the third
/// copy up to date, and when it dies too the third copy takes over with
/// every answered change. The two returning servers become copies, and the
/// one named candidate takes over when the third server dies as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_copies_survive_two_lost_servers_in_turn() {
    let (mut v, a, b, c3, root, f) = three_copies().await;
    let st = v.status(a).await.expect("status");
    assert_eq!(
        st.ranges.len(),
        3,
        "a server keeps three ranges: {:?}",
        st.ranges
    );
    let link = |name: &str| link_req(root, name, &f);
    let lookup = |name: &str| lookup_req(root, name);
    let cl = v.client(a, 22).await.expect("client");
    for i in 0..20 {
        cl.call(&link(&format!("f{i}"))).await.expect("link");
    }
    drop(cl);

    // The first primary dies: its successor takes over and sends the
    // third copy a snapshot of its own stream.
    v.kill(a).await;
    call_until(&v, b, 23, &link("after-a")).await;
    v.wait_copy(c3, a, |x| !x.primary && x.ready && x.gen >= 2)
        .await;
    call_until(&v, b, 24, &link("after-a-2")).await;

    // The second dies too: the third copy takes over with everything.
    v.kill(b).await;
    for name in (0..20)
        .map(|i| format!("f{i}"))
        .chain(["after-a".into(), "after-a-2".into()])
    {
        let got = call_until(&v, c3, 25, &lookup(&name)).await;
        expect_entry(&got, &f, &name);
    }
    v.wait_copy(c3, a, |x| x.primary && x.ready && x.gen >= 3)
        .await;
    call_until(&v, c3, 26, &link("after-b")).await;

    // Both come back as copies and catch up; neither serves the range.
    v.restart_as_copies(a, &[a, b], c3).await;
    for at in [a, b] {
        let cl = v.client(at, 27).await.expect("client");
        let refused = cl.call(&lookup("after-b")).await;
        assert!(
            matches!(&refused, Err(e) if e.code() == ErrorCode::NotOwner),
            "server {at} must not serve the range: {refused:?}"
        );
    }
    // Whichever of them the primary named its candidate holds the last
    // change and takes the range over when the third server dies.
    let cand = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut named = Vec::new();
            for at in [a, b] {
                let st = v.status(at).await.expect("status");
                if st
                    .ranges
                    .iter()
                    .any(|x| x.range == a && x.candidate && x.ready)
                {
                    named.push(at);
                }
            }
            if let [one] = named[..] {
                break one;
            }
            assert!(Instant::now() < deadline, "candidates: {named:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    v.kill(c3).await;
    let got = call_until(&v, cand, 28, &lookup("after-b")).await;
    expect_entry(&got, &f, "");
}

/// Only the primary's successor may take its range over: with the
/// primary and the third copy both cut off from every other server, the
/// successor takes over, and the third copy, which hears from nobody,
/// never serves the range. Healed, it follows the new primary, and the
/// old primary becomes a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_copies_only_the_successor_takes_over() {
    let (v, a, b, c3, _, _) = three_copies().await;
    v.handle(a).cut_peers(true);
    v.handle(c3).cut_peers(true);
    v.wait_copy(b, a, |x| x.primary && x.ready && x.gen >= 2)
        .await;
    // Well past the time the third copy would have needed to take over.
    let until = Instant::now() + Duration::from_millis(u64::from(LEASE_MS) * 4);
    while Instant::now() < until {
        let st = v.status(c3).await.expect("status");
        let copy = st.ranges.iter().find(|x| x.range == a).expect("copy of a");
        assert!(
            !copy.primary,
            "the third copy took the range over: {copy:?}"
        );
        let st = v.status(a).await.expect("status");
        let own = st.ranges.iter().find(|x| x.range == a).expect("own range");
        assert!(
            !(own.primary && own.ready),
            "the cut-off primary still serves: {own:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    v.handle(c3).cut_peers(false);
    v.wait_copy(c3, a, |x| !x.primary && x.ready && x.gen >= 2)
        .await;
    v.handle(a).cut_peers(false);
    v.wait_copy(a, a, |x| !x.primary && x.ready && x.gen >= 2)
        .await;
    v.wait_copy(b, a, |x| x.primary && x.ready && x.peer_in_sync)
        .await;
}

/// With three copies, a candidate seen dead (connection refused) is
/// replaced by the third copy, so the range goes on after its primary
/// dies too: the third copy takes over with every answered change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_copies_a_dead_candidate_is_replaced() {
    let (mut v, a, b, c3, root, f) = three_copies().await;
    let link = |name: &str| link_req(root, name, &f);
    call_until(&v, a, 32, &link("before")).await;

    v.kill(b).await;
    v.wait_copy(c3, a, |x| !x.primary && x.ready && x.candidate)
        .await;
    call_until(&v, a, 33, &link("without-b")).await;
    v.kill(a).await;
    for name in ["before", "without-b"] {
        let got = call_until(&v, c3, 34, &lookup_req(root, name)).await;
        expect_entry(&got, &f, name);
    }
    v.wait_copy(c3, a, |x| x.primary && x.ready).await;
    v.restart_as_copies(a, &[a, b], c3).await;
}

/// A restarted primary whose candidate is dead does not name the third
/// copy candidate: the dead candidate may have taken the range over and
/// answered changes the third copy never saw. Here the third copy is cut
/// off while the candidate takes over and answers a change alone, then the
/// candidate dies: the returning first primary must not serve (it would
/// serve without that change) until the candidate is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_waits_for_a_candidate_that_may_have_taken_over() {
    let (mut v, a, b, c3, root, f) = three_copies().await;
    let lookup = |name: &str| lookup_req(root, name);
    v.handle(c3).cut_peers(true);
    v.kill(a).await;
    call_until(&v, b, 42, &link_req(root, "by-b", &f)).await;
    v.kill(b).await;
    v.handle(c3).cut_peers(false);
    v.restart(a).await;
    let until = Instant::now() + Duration::from_millis(u64::from(LEASE_MS) * 4);
    while Instant::now() < until {
        if let Some(c) = v.client(a, 43).await {
            match c.call(&lookup("by-b")).await {
                Err(e) => assert!(
                    matches!(
                        e.code(),
                        ErrorCode::NotOwner | ErrorCode::Grace | ErrorCode::Unavailable
                    ),
                    "{e}"
                ),
                Ok(r) => {
                    panic!("the returned primary serves without the candidate's change: {r:?}")
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    v.restart(b).await;
    let got = call_until(&v, b, 44, &lookup("by-b")).await;
    expect_entry(&got, &f, "");
    v.wait_copy(a, a, |x| !x.primary && x.ready).await;
}
