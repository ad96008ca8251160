//! The client library against real stripe servers on loopback (no FUSE).

use std::sync::Arc;

use bytes::Bytes;
use morris_client::{
    Caller, Client, ClientConfig, ErrorCode, FileKind, Key, Keys, RenameFlags, ROOT_ID,
};
use morris_proto::net::RpcClient;
use morris_proto::{Reply, Request, Timestamp, VolumeDescriptor, PROTOCOL_VERSION};
use morris_server::{ServerConfig, ServerHandle};

/// The volume key of every test volume here (servers and formatting).
static KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(Key::generate);

fn server_keys() -> Keys {
    Keys::from_key(KEY.clone())
}

fn client_keys() -> Keys {
    Keys::from_key(KEY.client_key())
}

struct Cluster {
    _dirs: Vec<tempfile::TempDir>,
    _servers: Vec<ServerHandle>,
    addrs: Vec<String>,
}

async fn cluster(k: usize, unit: u32) -> Cluster {
    cluster_with(k, unit, 1500, false).await.0
}

/// `k` servers formatted as one volume with lease time `lease_ms`; with
/// `proxied`, the volume names a [`Proxy`] in front of each server, so that
/// clients reach the servers only through them.
async fn cluster_with(k: usize, unit: u32, lease_ms: u32, proxied: bool) -> (Cluster, Vec<Proxy>) {
    let mut dirs = Vec::new();
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..k {
        let d = tempfile::tempdir().unwrap();
        let s = morris_server::start(ServerConfig {
            data_dir: d.path().to_path_buf(),
            listen: "127.0.0.1:0".into(),
            lease_ms,
            etcd: Vec::new(),
            etcd_auth: Default::default(),
            keys: server_keys(),
            max_connections: 4096,
            scrub_every: None,
            scrub_rate: 0,
        })
        .await
        .unwrap();
        let real = s.local_addr().to_string();
        if proxied {
            let p = Proxy::start(real.clone()).await;
            addrs.push(p.addr.clone());
            proxies.push(p);
        } else {
            addrs.push(real);
        }
        servers.push(s);
        dirs.push(d);
    }
    let desc = VolumeDescriptor {
        uuid: uuid::Uuid::new_v4(),
        servers: addrs.clone(),
        stripe_unit: unit,
        replicas: 1,
        created: Timestamp::now(),
    };
    for (i, a) in addrs.iter().enumerate() {
        let c = RpcClient::connect(a, &KEY, None).await.unwrap();
        c.call(
            &Request::Hello {
                volume: None,
                client_id: 1,
                client_name: "test-format".into(),
                version: PROTOCOL_VERSION,
            },
            Bytes::new(),
        )
        .await
        .unwrap();
        let (r, _) = c
            .call(
                &Request::Format {
                    descriptor: desc.clone(),
                    index: i as u32,
                },
                Bytes::new(),
            )
            .await
            .unwrap();
        assert_eq!(r, Reply::Ok);
    }
    let c = Cluster {
        _dirs: dirs,
        _servers: servers,
        addrs,
    };
    (c, proxies)
}

/// A TCP relay in front of one server that can stop passing the server's
/// bytes on one connection: what a link full of queued block replies does
/// to everything behind them on that connection.
struct Proxy {
    addr: String,
    conns: Arc<parking_lot::Mutex<Vec<Arc<Relayed>>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One relayed connection.
struct Relayed {
    /// Bytes passed from the server to the client.
    down: std::sync::atomic::AtomicU64,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn start(server: String) -> Proxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let conns: Arc<parking_lot::Mutex<Vec<Arc<Relayed>>>> = Arc::default();
        let list = conns.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let Ok(upstream) = tokio::net::TcpStream::connect(&server).await else {
                    continue;
                };
                let r = Arc::new(Relayed {
                    down: Default::default(),
                    frozen: tokio::sync::watch::channel(false).0,
                });
                list.lock().push(r.clone());
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    let _ = sw.shutdown().await;
                });
                tokio::spawn(async move {
                    let mut frozen = r.frozen.subscribe();
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        if frozen.wait_for(|f| !*f).await.is_err() {
                            break;
                        }
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        r.down
                            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = cw.shutdown().await;
                });
            }
        });
        Proxy { addr, conns, task }
    }

    /// Stops passing server bytes on the connection that has carried the
    /// most of them; returns how many connections the proxy has relayed.
    fn freeze_busiest(&self) -> usize {
        let conns = self.conns.lock();
        let busiest = conns
            .iter()
            .max_by_key(|r| r.down.load(std::sync::atomic::Ordering::Relaxed))
            .unwrap();
        busiest.frozen.send_replace(true);
        conns.len()
    }

    fn thaw(&self) {
        for r in self.conns.lock().iter() {
            r.frozen.send_replace(false);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connect(c: &Cluster) -> Arc<Client> {
    // A freshly started server is in its grace period; the client retries.
    Client::connect(&c.addrs[0], ClientConfig::new(client_keys()))
        .await
        .unwrap()
}

fn me() -> Caller {
    Caller::root()
}

/// Waits until `id`, whose last name is gone, is removed: at once it has
/// no link left, and it goes a moment later (an open racing the removal
/// could still find it until then).
async fn wait_gone(cl: &Client, id: u64, what: &str) {
    for _ in 0..100 {
        match cl.getattr(id).await {
            Ok(i) => assert_eq!(i.attr.nlink, 0, "{what} still has a name"),
            Err(_) => return,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{what} still exists after 10 s");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_are_striped_and_read_back() {
    let c = cluster(4, 64 << 10).await;
    let cl = connect(&c).await;
    let f = cl
        .create(ROOT_ID, b"big", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    let fh = cl.open(f.id, true, false).await.unwrap();
    let data = pattern(1_000_000, 7);
    // Unaligned writes spanning several stripe units.
    let mut off = 0;
    for chunk in data.chunks(100_003) {
        let n = cl
            .write(fh, off, Bytes::copy_from_slice(chunk))
            .await
            .unwrap();
        assert_eq!(n as usize, chunk.len());
        off += n as u64;
    }
    cl.flush(fh).await.unwrap();
    cl.release(fh).await.unwrap();
    let fh = cl.open(f.id, false, false).await.unwrap();
    let mut got = Vec::new();
    loop {
        let b = cl.read(fh, got.len() as u64, 131_072).await.unwrap();
        if b.is_empty() {
            break;
        }
        got.extend_from_slice(&b);
    }
    assert_eq!(got.len(), data.len());
    assert!(got == data, "content differs");
    // Random reads.
    for &(o, l) in &[
        (5u64, 10u32),
        (65_530, 20),
        (999_990, 100),
        (400_000, 200_000),
    ] {
        let b = cl.read(fh, o, l).await.unwrap();
        let end = (o as usize + l as usize).min(data.len());
        assert_eq!(&b[..], &data[o as usize..end]);
    }
    cl.release(fh).await.unwrap();
    // Every server holds part of it.
    for a in &c.addrs {
        let r = RpcClient::connect(a, &KEY.client_key(), None)
            .await
            .unwrap();
        let (reply, _) = r.call(&Request::Status, Bytes::new()).await.unwrap();
        let Reply::Status(s) = reply else { panic!() };
        assert!(s.data_files >= 1, "server {a} holds no data");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_out_of_order_reads_fetch_each_block_once() {
    let c = cluster(4, 64 << 10).await;
    let cl = connect(&c).await;
    let f = cl
        .create(ROOT_ID, b"pipe", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    let fh = cl.open(f.id, true, false).await.unwrap();
    let data = pattern(8 << 20, 3);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        cl.write(fh, (i << 20) as u64, Bytes::copy_from_slice(chunk))
            .await
            .unwrap();
    }
    cl.release(fh).await.unwrap();
    let reads_before = |cl: &Client| {
        cl.stats()
            .requests
            .iter()
            .find(|(n, _)| n == "Read")
            .map_or(0, |(_, c)| *c)
    };
    let before = reads_before(&cl);
    let fh = cl.open(f.id, false, false).await.unwrap();
    // 64 KiB reads, 8 in flight, each group issued in reverse order (as a
    // pipelined NFS client's READs may arrive).
    let chunk = 64u64 << 10;
    let mut got = vec![0u8; data.len()];
    for group in (0..data.len() as u64 / chunk).collect::<Vec<_>>().chunks(8) {
        let reads = group.iter().rev().map(|&i| {
            let cl = cl.clone();
            async move { (i, cl.read(fh, i * chunk, chunk as u32).await.unwrap()) }
        });
        for (i, b) in futures::future::join_all(reads).await {
            got[(i * chunk) as usize..((i + 1) * chunk) as usize].copy_from_slice(&b);
        }
    }
    cl.release(fh).await.unwrap();
    assert!(got == data, "content differs");
    let blocks = data.len() as u64 / chunk;
    let sent = reads_before(&cl) - before;
    assert!(
        sent <= blocks + blocks / 8,
        "{sent} Read requests for {blocks} blocks read once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sparse_files_and_truncate() {
    let c = cluster(3, 16 << 10).await;
    let cl = connect(&c).await;
    let f = cl
        .create(ROOT_ID, b"sparse", FileKind::File, 0o600, 0, true, &me())
        .await
        .unwrap();
    let fh = cl.open(f.id, true, false).await.unwrap();
    cl.write(fh, 1 << 30, Bytes::from_static(b"end"))
        .await
        .unwrap();
    cl.flush(fh).await.unwrap();
    assert_eq!(cl.getattr(f.id).await.unwrap().attr.size, (1 << 30) + 3);
    let hole = cl.read(fh, 12345, 4096).await.unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(&cl.read(fh, 1 << 30, 10).await.unwrap()[..], b"end");
    // Shrink then grow: the old bytes must not come back.
    cl.write(fh, 0, Bytes::from(vec![9u8; 50_000]))
        .await
        .unwrap();
    let set = morris_client::SetAttr {
        size: Some(10),
        ..Default::default()
    };
    cl.setattr(f.id, set, &me()).await.unwrap();
    let set = morris_client::SetAttr {
        size: Some(50_000),
        ..Default::default()
    };
    cl.setattr(f.id, set, &me()).await.unwrap();
    let b = cl.read(fh, 0, 50_000).await.unwrap();
    assert_eq!(b.len(), 50_000);
    assert!(b[..10].iter().all(|&x| x == 9));
    assert!(b[10..].iter().all(|&x| x == 0), "truncated data came back");
    cl.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_operations() {
    let c = cluster(4, 1 << 20).await;
    let cl = connect(&c).await;
    let d = cl.mkdir(ROOT_ID, b"d", 0o755, &me()).await.unwrap();
    let e = cl.mkdir(ROOT_ID, b"e", 0o755, &me()).await.unwrap();
    assert_eq!(cl.getattr(ROOT_ID).await.unwrap().attr.nlink, 4);
    let f = cl
        .create(d.id, b"f", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    assert_eq!(
        cl.create(d.id, b"f", FileKind::File, 0o644, 0, true, &me())
            .await
            .unwrap_err()
            .code,
        ErrorCode::Exists
    );
    // Bad names.
    for bad in [&b"a/b"[..], b"", b".", b"..", b"x\0y"] {
        assert!(cl
            .create(d.id, bad, FileKind::File, 0o644, 0, true, &me())
            .await
            .is_err());
    }
    let long = vec![b'a'; 256];
    assert_eq!(
        cl.mkdir(d.id, &long, 0o755, &me()).await.unwrap_err().code,
        ErrorCode::NameTooLong
    );
    // Symlink and hard link.
    let s = cl.symlink(d.id, b"s", b"../e", &me()).await.unwrap();
    assert_eq!(cl.readlink(s.id).await.unwrap(), b"../e");
    let l = cl.link(f.id, e.id, b"f2", &me()).await.unwrap();
    assert_eq!(l.attr.nlink, 2);
    // Rename across directories, over an existing file.
    let g = cl
        .create(e.id, b"g", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    cl.rename(d.id, b"f", e.id, b"g", RenameFlags::default(), &me())
        .await
        .unwrap();
    assert_eq!(cl.lookup(e.id, b"g").await.unwrap().id, f.id);
    assert_eq!(
        cl.lookup(d.id, b"f").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    wait_gone(&cl, g.id, "the replaced file").await;
    // Directory moves: into itself is refused; elsewhere updates '..'.
    let sub = cl.mkdir(d.id, b"sub", 0o755, &me()).await.unwrap();
    assert_eq!(
        cl.rename(ROOT_ID, b"d", sub.id, b"x", RenameFlags::default(), &me())
            .await
            .unwrap_err()
            .code,
        ErrorCode::Invalid
    );
    cl.rename(d.id, b"sub", e.id, b"sub", RenameFlags::default(), &me())
        .await
        .unwrap();
    assert_eq!(cl.lookup(sub.id, b"..").await.unwrap().id, e.id);
    // rmdir of a non-empty directory fails; unlink of a dir fails.
    assert_eq!(
        cl.rmdir(ROOT_ID, b"e", &me()).await.unwrap_err().code,
        ErrorCode::NotEmpty
    );
    assert_eq!(
        cl.unlink(e.id, b"sub", &me()).await.unwrap_err().code,
        ErrorCode::IsDir
    );
    cl.rmdir(e.id, b"sub", &me()).await.unwrap();
    cl.unlink(e.id, b"g", &me()).await.unwrap();
    assert_eq!(cl.getattr(f.id).await.unwrap().attr.nlink, 1);
    cl.unlink(e.id, b"f2", &me()).await.unwrap();
    wait_gone(&cl, f.id, "a file whose last name was removed").await;
    // readdir pages with cookies.
    for i in 0..250 {
        cl.create(
            d.id,
            format!("n{i}").as_bytes(),
            FileKind::File,
            0o644,
            0,
            true,
            &me(),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let (es, eof) = cl.readdir(d.id, cookie, 64).await.unwrap();
        for e in &es {
            names.push(String::from_utf8(e.name.clone()).unwrap());
            cookie = e.cookie;
        }
        if eof || es.is_empty() {
            break;
        }
    }
    assert_eq!(names.len(), 251); // 250 + the symlink
    let st = cl.statfs().await.unwrap();
    assert!(st.total > 0 && st.files >= 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_stay_coherent() {
    let c = cluster(2, 64 << 10).await;
    let a = connect(&c).await;
    let b = connect(&c).await;
    let f = a
        .create(ROOT_ID, b"shared", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    // b looks it up and reads it (takes read leases, caches attrs).
    let bf = b.lookup(ROOT_ID, b"shared").await.unwrap();
    assert_eq!(bf.attr.size, 0);
    // a writes and closes: b must see the new size and bytes.
    let fh = a.open(f.id, true, false).await.unwrap();
    a.write(fh, 0, Bytes::from_static(b"hello world"))
        .await
        .unwrap();
    a.release(fh).await.unwrap();
    assert_eq!(b.getattr(f.id).await.unwrap().attr.size, 11);
    let bfh = b.open(f.id, false, false).await.unwrap();
    assert_eq!(&b.read(bfh, 0, 100).await.unwrap()[..], b"hello world");
    // a overwrites while b keeps its file open: b's next read sees it.
    let fh = a.open(f.id, true, false).await.unwrap();
    a.write(fh, 0, Bytes::from_static(b"HELLO")).await.unwrap();
    a.release(fh).await.unwrap();
    assert_eq!(&b.read(bfh, 0, 100).await.unwrap()[..], b"HELLO world");
    b.release(bfh).await.unwrap();
    // Namespace: b caches a negative lookup, a creates the name.
    assert!(b.lookup(ROOT_ID, b"later").await.is_err());
    a.mkdir(ROOT_ID, b"later", 0o755, &me()).await.unwrap();
    assert!(b.lookup(ROOT_ID, b"later").await.is_ok());
    assert!(b.stats().recalls > 0 || a.stats().recalls > 0);
}

/// Lease traffic must not queue behind block data: with the connection
/// that carries a file's blocks stalled (its replies stuck, as behind
/// megabytes of queued reads on a loaded link), the client's renewals still
/// get through and its read lease stays valid for longer than a lease time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewals_do_not_wait_behind_block_replies() {
    let lease_ms = 3000;
    let (c, proxies) = cluster_with(1, 1 << 20, lease_ms, true).await;
    let cl = connect(&c).await;
    let f = cl
        .create(ROOT_ID, b"f", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    let fh = cl.open(f.id, true, false).await.unwrap();
    let data = pattern(4 << 20, 3);
    cl.write(fh, 0, Bytes::from(data.clone())).await.unwrap();
    cl.release(fh).await.unwrap();
    let fh = cl.open(f.id, false, false).await.unwrap();
    let first = cl.read(fh, 0, 1 << 20).await.unwrap();
    assert_eq!(&first[..], &data[..1 << 20]);
    let conns = proxies[0].freeze_busiest();
    eprintln!("{conns} connections to the server; the busiest is stalled");
    let acquires = |cl: &Client| {
        cl.stats()
            .requests
            .iter()
            .filter(|(n, _)| n.starts_with("Acquire"))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    let before = acquires(&cl);
    // A read of the next block waits on the stalled connection (unless
    // readahead fetched it already).
    let cl2 = cl.clone();
    let stuck = tokio::spawn(async move { cl2.read(fh, 1 << 20, 1 << 20).await });
    tokio::time::sleep(std::time::Duration::from_millis(
        u64::from(lease_ms) * 5 / 2,
    ))
    .await;
    // The read lease was renewed meanwhile: attributes come from it.
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), cl.getattr(f.id))
        .await
        .expect("getattr waited behind the stalled block connection")
        .unwrap();
    assert_eq!(got.attr.size, data.len() as u64);
    assert_eq!(
        acquires(&cl),
        before,
        "the read lease lapsed and was taken again"
    );
    proxies[0].thaw();
    let second = stuck.await.unwrap().unwrap();
    assert_eq!(&second[..], &data[1 << 20..2 << 20]);
    cl.release(fh).await.unwrap();
}

/// A listing in progress never meets a name twice, however the name is
/// replaced behind it: by a rename of another file over it, or by an
/// unlink and a create (issue 13: `ls` showed a file twice while a program
/// rename-replaced it). Deterministic: the listing stops right after the
/// name, the name is replaced, the listing goes on from its cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_never_meets_a_replaced_name_twice() {
    let c = cluster(2, 64 << 10).await;
    let a = connect(&c).await;
    let b = connect(&c).await;
    let d = a.mkdir(ROOT_ID, b"d", 0o755, &me()).await.unwrap();
    for i in 0..50 {
        let name = format!("f{i:02}");
        a.create(d.id, name.as_bytes(), FileKind::File, 0o644, 0, true, &me())
            .await
            .unwrap();
    }
    assert_eq!(b.lookup(ROOT_ID, b"d").await.unwrap().id, d.id);
    for round in 0..10 {
        // b lists up to and including some name, then a replaces that name.
        let (page, eof) = b.readdir(d.id, 0, 5 + round).await.unwrap();
        assert!(!eof);
        let last = page.last().unwrap().clone();
        let name = last.name.clone();
        if round % 2 == 0 {
            let tmp = format!("tmp{round}");
            a.create(d.id, tmp.as_bytes(), FileKind::File, 0o644, 0, true, &me())
                .await
                .unwrap();
            a.rename(
                d.id,
                tmp.as_bytes(),
                d.id,
                &name,
                RenameFlags::default(),
                &me(),
            )
            .await
            .unwrap();
        } else {
            a.unlink(d.id, &name, &me()).await.unwrap();
            a.create(d.id, &name, FileKind::File, 0o644, 0, true, &me())
                .await
                .unwrap();
        }
        let mut seen: Vec<Vec<u8>> = page.iter().map(|e| e.name.clone()).collect();
        let mut cookie = last.cookie;
        loop {
            let (more, eof) = b.readdir(d.id, cookie, 7).await.unwrap();
            for e in &more {
                seen.push(e.name.clone());
                cookie = e.cookie;
            }
            if eof {
                break;
            }
        }
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            seen.len(),
            "round {round}: {:?} listed twice",
            String::from_utf8_lossy(&name)
        );
        assert_eq!(seen.len(), 50, "round {round}: every name once");
    }
}

/// One client running many namespace changes on one directory at once (as
/// the NFS gateway does for its clients) never sees the effect of its own
/// concurrent requests as an error: renames onto one name all succeed,
/// links of one name give exactly one winner and `Exists` for the rest,
/// `O_CREAT` without `O_EXCL` always succeeds and all open one file, with
/// `O_EXCL` exactly one succeeds, and unlinks of one name give exactly one
/// success. Before the per-directory lock, renames answered `Exists` (the
/// server saw a target our check had not) and creates could link twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_changes_of_one_client_in_one_directory() {
    let c = cluster(4, 1 << 20).await;
    let cl = connect(&c).await;
    let d = cl.mkdir(ROOT_ID, b"d", 0o755, &me()).await.unwrap();
    for round in 0..5 {
        // Renames of 16 temp files onto one target, all at once.
        let mut temps = Vec::new();
        for i in 0..16 {
            let name = format!("tmp-{round}-{i}");
            cl.create(d.id, name.as_bytes(), FileKind::File, 0o644, 0, true, &me())
                .await
                .unwrap();
            temps.push(name);
        }
        let renames = temps.iter().map(|t| {
            let cl = cl.clone();
            let t = t.clone();
            async move {
                cl.rename(
                    d.id,
                    t.as_bytes(),
                    d.id,
                    b"target",
                    RenameFlags::default(),
                    &me(),
                )
                .await
            }
        });
        for r in futures::future::join_all(renames).await {
            r.unwrap();
        }
        let listed = cl.readdir(d.id, 0, 1000).await.unwrap();
        let names: Vec<_> = listed.0.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names, vec![b"target".to_vec()], "round {round}");

        // O_CREAT without O_EXCL: all succeed, one file.
        let name = format!("c-{round}");
        let creates = (0..16).map(|_| {
            let cl = cl.clone();
            let name = name.clone();
            async move {
                cl.create(
                    d.id,
                    name.as_bytes(),
                    FileKind::File,
                    0o644,
                    0,
                    false,
                    &me(),
                )
                .await
            }
        });
        let ids: Vec<u64> = futures::future::join_all(creates)
            .await
            .into_iter()
            .map(|r| r.unwrap().id)
            .collect();
        assert!(
            ids.iter().all(|&i| i == ids[0]),
            "creates opened different files: {ids:?}"
        );

        // O_EXCL: exactly one.
        let name = format!("x-{round}");
        let creates = (0..16).map(|_| {
            let cl = cl.clone();
            let name = name.clone();
            async move {
                cl.create(d.id, name.as_bytes(), FileKind::File, 0o644, 0, true, &me())
                    .await
            }
        });
        let results = futures::future::join_all(creates).await;
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "exclusive creates that succeeded");
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.code, ErrorCode::Exists);
            }
        }

        // Hard links onto one name: exactly one.
        let links = (0..16).map(|_| {
            let cl = cl.clone();
            let name = format!("l-{round}");
            let src = ids[0];
            async move { cl.link(src, d.id, name.as_bytes(), &me()).await }
        });
        let results = futures::future::join_all(links).await;
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "links that succeeded"
        );
        assert_eq!(cl.getattr(ids[0]).await.unwrap().attr.nlink, 2);

        // Unlinks of one name: exactly one.
        let unlinks = (0..16).map(|_| {
            let cl = cl.clone();
            let name = format!("l-{round}");
            async move { cl.unlink(d.id, name.as_bytes(), &me()).await }
        });
        let results = futures::future::join_all(unlinks).await;
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "unlinks that succeeded"
        );
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.code, ErrorCode::NotFound);
            }
        }
        assert_eq!(cl.getattr(ids[0]).await.unwrap().attr.nlink, 1);
        for n in [
            format!("c-{round}"),
            format!("x-{round}"),
            "target".to_string(),
        ] {
            cl.unlink(d.id, n.as_bytes(), &me()).await.unwrap();
        }
    }
}

/// An `open()` that follows this client's lookup of a name opens the file
/// that lookup found, even if another client removed the name in between
/// (the open is ordered before the removal, as a local file system's
/// lookup-and-open is one step); a file reached by its id alone, with no
/// lookup of its name here, answers `Stale` once its name is gone, so
/// that the kernel looks the name up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_after_a_lookup_opens_the_file_whose_name_went_meanwhile() {
    let c = cluster(4, 1 << 20).await;
    let a = connect(&c).await;
    let b = connect(&c).await;
    let f = b
        .create(ROOT_ID, b"f", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();
    let fh = b.open(f.id, true, false).await.unwrap();
    b.write(fh, 0, Bytes::from_static(b"old bytes"))
        .await
        .unwrap();
    b.release(fh).await.unwrap();
    let g = b
        .create(ROOT_ID, b"g", FileKind::File, 0o644, 0, true, &me())
        .await
        .unwrap();

    let found = a.lookup(ROOT_ID, b"f").await.unwrap();
    assert_eq!(found.id, f.id);
    a.learn(g.handle()); // known to `a` by its handle only (an NFS handle kept)
    a.getattr(g.id).await.unwrap();
    b.unlink(ROOT_ID, b"f", &me()).await.unwrap();
    b.unlink(ROOT_ID, b"g", &me()).await.unwrap();

    let fh = a.open(f.id, false, false).await.unwrap();
    assert_eq!(&a.read(fh, 0, 100).await.unwrap()[..], b"old bytes");
    assert_eq!(
        a.open(g.id, false, false).await.unwrap_err().code,
        ErrorCode::Stale
    );
    // Held open, it outlives the reaper.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(&a.read(fh, 0, 100).await.unwrap()[..], b"old bytes");
    a.release(fh).await.unwrap();
    wait_gone(&a, f.id, "the removed file").await;
}
