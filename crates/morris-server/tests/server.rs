//! End-to-end tests: a real server on 127.0.0.1, spoken to over the wire.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use morris_proto::auth::{Key, Keys};
use morris_proto::messages::LeaseMode;
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{
    Attr, DirEntry, ErrorCode, FileKind, Handle, Inode, Push, Reply, Request, SetAttr, Timestamp,
    VolumeDescriptor, PROTOCOL_VERSION, ROOT_ID,
};
use morris_server::{start, ServerConfig, ServerHandle};

/// The volume key of every test volume here.
static KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(Key::generate);
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use uuid::Uuid;

const LEASE_MS: u32 = 800;
const UNIT: u32 = 4096;

async fn server(dir: &std::path::Path) -> ServerHandle {
    start(ServerConfig {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".into(),
        lease_ms: LEASE_MS,
        etcd: Vec::new(),
        etcd_auth: Default::default(),
        keys: Keys::from_key(KEY.clone()),
        max_connections: 4096,
        scrub_every: None,
        scrub_rate: 0,
    })
    .await
    .expect("server starts")
}

fn descriptor(servers: Vec<String>) -> VolumeDescriptor {
    VolumeDescriptor {
        uuid: Uuid::new_v4(),
        servers,
        stripe_unit: UNIT,
        replicas: 1,
        created: Timestamp::now(),
    }
}

struct Client {
    rpc: RpcClient,
    pushes: mpsc::UnboundedReceiver<Push>,
}

async fn connect(h: &ServerHandle) -> Client {
    connect_with(h, &KEY).await
}

/// A connection that proves `key` (the volume key, or the client key).
async fn connect_with(h: &ServerHandle, key: &Key) -> Client {
    let (tx, rx) = mpsc::unbounded_channel();
    let rpc = RpcClient::connect(&h.local_addr().to_string(), key, Some(tx))
        .await
        .expect("connects");
    Client { rpc, pushes: rx }
}

impl Client {
    async fn call(&self, req: Request) -> Result<Reply, RpcError> {
        self.rpc.call(&req, Bytes::new()).await.map(|(r, _)| r)
    }

    async fn ok(&self, req: Request) -> Reply {
        let name = req.name();
        match self.call(req).await {
            Ok(r) => r,
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    async fn code(&self, req: Request) -> ErrorCode {
        match self.call(req).await {
            Ok(r) => panic!("expected an error, got {r:?}"),
            Err(e) => e.code(),
        }
    }

    async fn hello(&self, volume: Option<Uuid>, client_id: u64) -> Result<Reply, RpcError> {
        self.call(Request::Hello {
            volume,
            client_id,
            client_name: format!("test-{client_id}"),
            version: PROTOCOL_VERSION,
        })
        .await
    }

    async fn inode(&self, req: Request) -> Inode {
        match self.ok(req).await {
            Reply::Inode(i)
            | Reply::Leased { inode: i, .. }
            | Reply::ReadLeased { inode: i, .. } => i,
            r => panic!("expected an inode, got {r:?}"),
        }
    }

    async fn root(&self) -> Handle {
        self.inode(Request::GetInode { ino: ROOT_ID })
            .await
            .handle()
    }

    /// Creates a file; returns it with the fence number of the write
    /// lease the create grants.
    async fn create_leased(&self) -> (Inode, u64) {
        match self
            .ok(Request::CreateInode {
                parent: ROOT_ID,
                attr: attr(FileKind::File),
                target: None,
                home: None,
                op: 0,
                xattrs: vec![],
            })
            .await
        {
            Reply::Leased { inode, fence } => (inode, fence),
            r => panic!("a create grants the write lease: {r:?}"),
        }
    }

    async fn create(&self, kind: FileKind) -> Inode {
        self.inode(Request::CreateInode {
            parent: ROOT_ID,
            attr: attr(kind),
            target: None,
            home: None,
            op: 0,
            xattrs: vec![],
        })
        .await
    }

    async fn link(&self, dir: Handle, name: &str, child: &Inode) -> Option<DirEntry> {
        match self
            .ok(Request::Link {
                dir,
                name: name.as_bytes().to_vec(),
                child: child.handle(),
                kind: child.attr.kind,
                replace: None,
                op: 0,
            })
            .await
        {
            Reply::Removed { entry: r, .. } => r,
            r => panic!("unexpected {r:?}"),
        }
    }

    async fn lookup(&self, dir: Handle, name: &str) -> Option<DirEntry> {
        match self
            .ok(Request::Lookup {
                dir,
                name: name.as_bytes().to_vec(),
            })
            .await
        {
            Reply::Entry(e) => e,
            r => panic!("unexpected {r:?}"),
        }
    }

    async fn write(&self, id: u64, index: u64, offset: u32, data: &[u8]) {
        let req = Request::Write {
            id,
            index,
            replica: 0,
            offset,
            sync: false,
            fence: 0,
        };
        match self.rpc.call(&req, Bytes::copy_from_slice(data)).await {
            Ok((Reply::Ok, _)) => {}
            other => panic!("write failed: {other:?}"),
        }
    }

    async fn read(&self, id: u64, index: u64, offset: u32, len: u32) -> Bytes {
        let req = Request::Read {
            id,
            index,
            replica: 0,
            offset,
            len,
        };
        match self.rpc.call(&req, Bytes::new()).await {
            Ok((Reply::Data { .. }, b)) => b,
            other => panic!("read failed: {other:?}"),
        }
    }

    async fn stats(&self) -> morris_proto::ServerStats {
        match self.ok(Request::Status).await {
            Reply::Status(s) => *s,
            r => panic!("unexpected {r:?}"),
        }
    }

    /// Waits for the next push (bounded).
    async fn push(&mut self, within: Duration) -> Option<Push> {
        tokio::time::timeout(within, self.pushes.recv())
            .await
            .ok()
            .flatten()
    }
}

fn attr(kind: FileKind) -> Attr {
    Attr {
        kind,
        mode: 0o644,
        uid: 1000,
        gid: 1000,
        nlink: 0,
        size: 0,
        atime: Timestamp::now(),
        mtime: Timestamp::now(),
        ctime: Timestamp::now(),
        rdev: 0,
        flags: 0,
    }
}

/// A server formatted as the only server of a fresh volume, and a client
/// with a session on it.
async fn formatted(
    dir: &std::path::Path,
    client_id: u64,
) -> (ServerHandle, VolumeDescriptor, Client) {
    let h = server(dir).await;
    let admin = connect(&h).await;
    let d = descriptor(vec![h.local_addr().to_string()]);
    admin
        .ok(Request::Format {
            descriptor: d.clone(),
            index: 0,
        })
        .await;
    let c = connect(&h).await;
    c.hello(Some(d.uuid), client_id).await.expect("hello");
    (h, d, c)
}

#[tokio::test]
async fn hello_format_and_volume_checks() {
    let dir = tempfile::tempdir().unwrap();
    let h = server(dir.path()).await;
    let c = connect(&h).await;
    // Nothing but Hello/Status/Statfs/Format before a Hello.
    assert_eq!(c.code(Request::Renew).await, ErrorCode::Protocol);
    assert_eq!(
        c.code(Request::GetInode { ino: ROOT_ID }).await,
        ErrorCode::Protocol
    );
    assert!(matches!(c.ok(Request::Statfs).await, Reply::Statfs { .. }));
    let s = c.stats().await;
    assert_eq!((s.index, s.volume), (None, None));
    // Unformatted: a client naming a volume is refused, an admin is not.
    let e = c.hello(Some(Uuid::new_v4()), 1).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::WrongVolume);
    match c.hello(None, 1).await.unwrap() {
        Reply::Hello {
            index, descriptor, ..
        } => assert_eq!((index, descriptor), (None, None)),
        r => panic!("unexpected {r:?}"),
    }
    assert_eq!(c.code(Request::Renew).await, ErrorCode::WrongVolume);
    // A bad descriptor and a bad index are refused.
    let d = descriptor(vec![h.local_addr().to_string()]);
    assert_eq!(
        c.code(Request::Format {
            descriptor: d.clone(),
            index: 1
        })
        .await,
        ErrorCode::Invalid
    );
    let mut bad = d.clone();
    bad.replicas = 2;
    assert_eq!(
        c.code(Request::Format {
            descriptor: bad,
            index: 0
        })
        .await,
        ErrorCode::Invalid
    );
    c.ok(Request::Format {
        descriptor: d.clone(),
        index: 0,
    })
    .await;
    // Again: a no-op. Another volume: refused, naming both.
    c.ok(Request::Format {
        descriptor: d.clone(),
        index: 0,
    })
    .await;
    let other = descriptor(vec![h.local_addr().to_string()]);
    match c
        .call(Request::Format {
            descriptor: other.clone(),
            index: 0,
        })
        .await
    {
        Err(RpcError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::WrongVolume);
            assert!(e.message.contains(&d.uuid.to_string()), "{}", e.message);
            assert!(e.message.contains(&other.uuid.to_string()), "{}", e.message);
        }
        r => panic!("unexpected {r:?}"),
    }
    // Hello checks.
    let c2 = connect(&h).await;
    match c2.hello(Some(other.uuid), 2).await {
        Err(RpcError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::WrongVolume);
            assert!(e.message.contains(&d.uuid.to_string()), "{}", e.message);
        }
        r => panic!("unexpected {r:?}"),
    }
    let e = c2
        .call(Request::Hello {
            volume: Some(d.uuid),
            client_id: 2,
            client_name: "old".into(),
            version: PROTOCOL_VERSION + 1,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Protocol);
    match c2.hello(Some(d.uuid), 2).await.unwrap() {
        Reply::Hello {
            index,
            epoch,
            descriptor,
            lease_ms,
        } => {
            assert_eq!(index, Some(0));
            assert_eq!(epoch, h.epoch());
            assert_eq!(descriptor, Some(d.clone()));
            assert_eq!(lease_ms, LEASE_MS);
        }
        r => panic!("unexpected {r:?}"),
    }
    // A fresh format needs no grace period; the root exists.
    let root = c2
        .inode(Request::AcquireRead {
            ino: c2.root().await,
        })
        .await;
    assert_eq!(root.id, ROOT_ID);
    assert_eq!(root.attr.mode, 0o755);
    assert_eq!(root.attr.nlink, 2);
    // The admin session (volume None) may not take leases.
    assert_eq!(
        c.code(Request::AcquireRead { ino: root.handle() }).await,
        ErrorCode::Protocol
    );
    h.shutdown().await;
}

#[tokio::test]
async fn directory_operations_and_paged_listing() {
    let dir = tempfile::tempdir().unwrap();
    let (h, _, c) = formatted(dir.path(), 7).await;
    let root = c.root().await;
    let file = c.create(FileKind::File).await;
    assert_eq!(file.attr.nlink, 1);
    assert_ne!(file.gen, 0);
    let sub = c.create(FileKind::Dir).await;
    assert_eq!((sub.attr.nlink, sub.parent), (2, ROOT_ID));
    assert_eq!(c.link(root, "sub", &sub).await, None);
    let r = c.inode(Request::GetInode { ino: ROOT_ID }).await;
    assert_eq!((r.attr.size, r.attr.nlink), (1, 3));
    // 2,000 entries in the subdirectory, listed in pages of 100.
    for i in 0..2000 {
        c.link(sub.handle(), &format!("f{i:04}"), &file).await;
    }
    let mut cookie = 0;
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let (entries, eof) = match c
            .ok(Request::ReadDir {
                dir: sub.handle(),
                cookie,
                max: 100,
            })
            .await
        {
            Reply::Entries { entries, eof } => (entries, eof),
            r => panic!("unexpected {r:?}"),
        };
        pages += 1;
        assert!(entries.len() <= 100);
        for e in entries {
            assert!(e.cookie > cookie);
            assert_eq!(e.child, file.handle());
            cookie = e.cookie;
            names.push(String::from_utf8(e.name).unwrap());
        }
        if eof {
            break;
        }
    }
    assert_eq!(pages, 20);
    // In cookie order, which is the order of the names' hashes.
    names.sort();
    let want: Vec<String> = (0..2000).map(|i| format!("f{i:04}")).collect();
    assert!(names == want, "every name once");
    let s = c.inode(Request::GetInode { ino: sub.id }).await;
    assert_eq!(s.attr.size, 2000);
    // Rename, with and without replacing.
    let rn = |from: &str, to: &str, replace| Request::Rename {
        dir: sub.handle(),
        from: from.as_bytes().to_vec(),
        to: to.as_bytes().to_vec(),
        replace,
        op: 0,
    };
    assert!(matches!(
        c.ok(rn("f0000", "zero", None)).await,
        Reply::Removed { entry: None, .. }
    ));
    assert!(c.lookup(sub.handle(), "f0000").await.is_none());
    assert_eq!(
        c.lookup(sub.handle(), "zero").await.unwrap().child,
        file.handle()
    );
    let other = c.create(FileKind::File).await;
    c.link(sub.handle(), "other", &other).await;
    assert_eq!(c.code(rn("zero", "other", None)).await, ErrorCode::Exists);
    match c.ok(rn("zero", "other", Some(other.id))).await {
        Reply::Removed { entry: Some(e), .. } => assert_eq!(e.child, other.handle()),
        r => panic!("unexpected {r:?}"),
    }
    // Unlink.
    let unlink = |name: &str, expect| Request::Unlink {
        dir: sub.handle(),
        name: name.as_bytes().to_vec(),
        expect,
        op: 0,
    };
    assert_eq!(
        c.code(unlink("other", Some(other.id))).await,
        ErrorCode::NotFound
    );
    match c.ok(unlink("other", Some(file.id))).await {
        Reply::Removed { entry: Some(e), .. } => assert_eq!(e.name, b"other"),
        r => panic!("unexpected {r:?}"),
    }
    assert_eq!(c.code(unlink("other", None)).await, ErrorCode::NotFound);
    let s = c.inode(Request::GetInode { ino: sub.id }).await;
    assert_eq!(s.attr.size, 1999);
    // A non-empty directory cannot be deleted; SetAttr works.
    assert_eq!(
        c.code(Request::DeleteInode {
            ino: sub.handle(),
            op: 0
        })
        .await,
        ErrorCode::NotEmpty
    );
    let set = c
        .inode(Request::SetAttr {
            ino: file.handle(),
            set: SetAttr {
                size: Some(12345),
                mode: Some(0o600),
                ..SetAttr::default()
            },
        })
        .await;
    assert_eq!((set.attr.size, set.attr.mode), (12345, 0o600));
    c.ok(Request::DeleteInode {
        ino: other.handle(),
        op: 0,
    })
    .await;
    assert_eq!(
        c.code(Request::AcquireRead {
            ino: other.handle()
        })
        .await,
        ErrorCode::Stale
    );
    assert_eq!(
        c.code(Request::GetInode { ino: other.id }).await,
        ErrorCode::NotFound
    );
    // Scans.
    match c.ok(Request::ScanInodes { after: 0, max: 10 }).await {
        Reply::Inodes(v) => assert_eq!(v.len(), 3),
        r => panic!("unexpected {r:?}"),
    }
    match c
        .ok(Request::ScanEntries {
            after_dir: 0,
            after_cookie: 0,
            max: 5,
        })
        .await
    {
        Reply::ScanEntries(v) => {
            assert_eq!(v.len(), 5);
            assert_eq!(v[0].0, ROOT_ID);
        }
        r => panic!("unexpected {r:?}"),
    }
    let st = c.stats().await;
    assert_eq!(st.inodes, 3);
    assert_eq!(st.entries, 2000);
    assert_eq!(st.sessions, 1);
    assert!(st.requests > 2000);
    let links = st
        .requests_by_op
        .iter()
        .find(|(n, _)| n == "Link")
        .map(|x| x.1);
    assert_eq!(links, Some(2002));
    h.shutdown().await;
}

#[tokio::test]
async fn block_data() {
    let dir = tempfile::tempdir().unwrap();
    let (h, _, c) = formatted(dir.path(), 7).await;
    let f = c.create(FileKind::File).await;
    let id = f.id;
    // Nothing written yet: reads are empty (all zeros for the client).
    assert!(c.read(id, 1, 0, UNIT).await.is_empty());
    // Block 3 only: blocks 1 and 2 are a hole that reads as zeros.
    let block: Vec<u8> = (0..UNIT).map(|i| (i % 251) as u8).collect();
    c.write(id, 3, 0, &block).await;
    let hole = c.read(id, 1, 0, UNIT).await;
    assert_eq!(hole.len(), UNIT as usize);
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(c.read(id, 3, 0, UNIT).await, Bytes::from(block.clone()));
    assert_eq!(
        c.read(id, 3, 100, 10).await,
        Bytes::from(block[100..110].to_vec())
    );
    // Past the end: a short read.
    assert!(c.read(id, 4, 0, UNIT).await.is_empty());
    c.write(id, 4, 0, b"tail").await;
    assert_eq!(&c.read(id, 4, 0, UNIT).await[..], b"tail");
    // Partial overwrite inside a block.
    c.write(id, 3, 10, b"XYZ").await;
    let b3 = c.read(id, 3, 8, 7).await;
    assert_eq!(
        &b3[..],
        &[block[8], block[9], b'X', b'Y', b'Z', block[13], block[14]]
    );
    // Bad addresses.
    let bad_read = |index, offset, len| Request::Read {
        id,
        index,
        replica: 0,
        offset,
        len,
    };
    assert_eq!(c.code(bad_read(0, 0, 1)).await, ErrorCode::Invalid);
    assert_eq!(c.code(bad_read(1, UNIT, 1)).await, ErrorCode::Invalid);
    assert_eq!(c.code(bad_read(1, 1, UNIT)).await, ErrorCode::Invalid);
    assert_eq!(c.code(bad_read(1, 0, u32::MAX)).await, ErrorCode::Invalid);
    // A copy the volume does not keep.
    let other_copy = Request::Read {
        id,
        index: 1,
        replica: 1,
        offset: 0,
        len: 1,
    };
    assert_eq!(c.code(other_copy).await, ErrorCode::Invalid);
    assert_eq!(
        c.code(bad_read(u64::MAX, 0, 1)).await,
        ErrorCode::FileTooBig
    );
    let too_long = Request::Write {
        id,
        index: 1,
        replica: 0,
        offset: 1,
        sync: true,
        fence: 0,
    };
    let e = c
        .rpc
        .call(&too_long, Bytes::from(vec![0u8; UNIT as usize]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
    // A synchronous write and Sync.
    let sw = Request::Write {
        id,
        index: 2,
        replica: 0,
        offset: 0,
        sync: true,
        fence: 0,
    };
    c.rpc
        .call(&sw, Bytes::from_static(b"durable"))
        .await
        .unwrap();
    c.ok(Request::Sync { id: Some(id) }).await;
    c.ok(Request::Sync { id: None }).await;
    assert_eq!(&c.read(id, 2, 0, 7).await[..], b"durable");
    // Status and ScanData see the file's allocation.
    let st = c.stats().await;
    assert_eq!(st.data_files, 1);
    assert!(st.data_bytes >= u64::from(UNIT), "{}", st.data_bytes);
    match c.ok(Request::ScanData { after: 0, max: 10 }).await {
        Reply::DataFiles(v) => {
            assert_eq!(v.len(), 1);
            assert_eq!(v[0].0, id);
            assert!(v[0].1 >= u64::from(UNIT));
        }
        r => panic!("unexpected {r:?}"),
    }
    // Truncate to 2.5 blocks: block 3 keeps its first half, block 4 is gone.
    let size = 2 * u64::from(UNIT) + u64::from(UNIT / 2);
    c.ok(Request::Truncate { id, size, fence: 0 }).await;
    assert_eq!(c.read(id, 3, 0, UNIT).await.len(), (UNIT / 2) as usize);
    assert!(c.read(id, 4, 0, UNIT).await.is_empty());
    assert_eq!(&c.read(id, 2, 0, 7).await[..], b"durable");
    // Truncate never grows the extent file; reading past stays short.
    c.ok(Request::Truncate {
        id,
        size: 1 << 30,
        fence: 0,
    })
    .await;
    assert!(c.read(id, 5, 0, UNIT).await.is_empty());
    // DeleteData removes everything; again is fine.
    c.ok(Request::DeleteData { id }).await;
    c.ok(Request::DeleteData { id }).await;
    assert!(c.read(id, 2, 0, UNIT).await.is_empty());
    // Its record goes once the removal is flushed (within a second or so).
    let mut st = c.stats().await;
    for _ in 0..50 {
        if st.data_files == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        st = c.stats().await;
    }
    assert_eq!((st.data_files, st.data_bytes), (0, 0));
    // Large block-sized payloads round-trip.
    let mut big = BytesMut::with_capacity(UNIT as usize);
    big.resize(UNIT as usize, 0xab);
    c.write(id, 9, 0, &big).await;
    assert_eq!(c.read(id, 9, 0, UNIT).await, big.freeze());
    h.shutdown().await;
}

#[tokio::test]
async fn inodes_and_blocks_of_other_servers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let h = server(dir.path()).await;
    let c = connect(&h).await;
    // Server 0 of 2: ROOT_ID (1) belongs to server 1.
    let d = descriptor(vec![h.local_addr().to_string(), "127.0.0.1:9".into()]);
    c.ok(Request::Format {
        descriptor: d.clone(),
        index: 0,
    })
    .await;
    c.hello(Some(d.uuid), 3).await.unwrap();
    // Metadata of another server's range: `NotOwner` (a client then asks
    // the range's other copy, on a mirrored volume).
    assert_eq!(
        c.code(Request::GetInode { ino: ROOT_ID }).await,
        ErrorCode::NotOwner
    );
    let root = Handle {
        id: ROOT_ID,
        gen: 1,
    };
    assert_eq!(
        c.code(Request::Lookup {
            dir: root,
            name: b"x".to_vec()
        })
        .await,
        ErrorCode::NotOwner
    );
    let f = c.create(FileKind::File).await;
    assert_eq!(f.id % 2, 0);
    // Block 1 of an even id lives on server 1; block 2 here.
    assert_eq!(
        c.code(Request::Read {
            id: f.id,
            index: 1,
            replica: 0,
            offset: 0,
            len: 1
        })
        .await,
        ErrorCode::Invalid
    );
    c.write(f.id, 2, 0, b"ok").await;
    assert_eq!(&c.read(f.id, 2, 0, 2).await[..], b"ok");
    h.shutdown().await;
}

#[tokio::test]
async fn recall_flow_between_two_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, mut a) = formatted(dir.path(), 100).await;
    let b = connect(&h).await;
    b.hello(Some(d.uuid), 200).await.unwrap();
    let root = a.root().await;
    // A reads the root (Lookup takes the read lease implicitly).
    assert!(a.lookup(root, "x").await.is_none());
    // B wants to write it: A is recalled, B waits.
    let b_task = {
        let rpc = b.rpc;
        tokio::spawn(async move {
            let t = Instant::now();
            let r = rpc
                .call(&Request::AcquireWrite { ino: root }, Bytes::new())
                .await;
            (r.map(|x| x.0), t.elapsed(), rpc)
        })
    };
    let p = a.push(Duration::from_secs(5)).await.expect("recall push");
    assert_eq!(
        p,
        Push::Recall {
            ino: ROOT_ID,
            want: LeaseMode::Write
        }
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !b_task.is_finished(),
        "B granted while A still holds the read lease"
    );
    a.ok(Request::Release { ino: ROOT_ID }).await;
    let (r, waited, b_rpc) = b_task.await.unwrap();
    match r {
        Ok(Reply::Leased { inode: i, .. }) => assert_eq!(i.id, ROOT_ID),
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        waited < Duration::from_millis(u64::from(LEASE_MS)),
        "{waited:?}"
    );
    // Now A's read waits for B, and B is recalled for a read.
    let mut b = Client {
        rpc: b_rpc,
        pushes: b.pushes,
    };
    let a_rpc = a.rpc;
    let a_task = tokio::spawn(async move {
        let r = a_rpc
            .call(
                &Request::ReadDir {
                    dir: root,
                    cookie: 0,
                    max: 10,
                },
                Bytes::new(),
            )
            .await;
        (r.map(|x| x.0), a_rpc)
    });
    let p = b.push(Duration::from_secs(5)).await.expect("recall push");
    assert_eq!(
        p,
        Push::Recall {
            ino: ROOT_ID,
            want: LeaseMode::Read
        }
    );
    b.ok(Request::Release { ino: ROOT_ID }).await;
    let (r, _a_rpc) = a_task.await.unwrap();
    assert!(matches!(r, Ok(Reply::Entries { .. })), "{r:?}");
    let st = b.stats().await;
    assert_eq!(st.recalls, 2);
    assert_eq!(st.sessions, 2);
    assert_eq!(st.leases, 1);
    h.shutdown().await;
}

/// `AcquireReadMany` takes every lease of its batch as an `AcquireRead` of
/// each would: the recalls go out together and the answer waits until the
/// holder gave back; an object replaced (another generation) is answered
/// `None`.
#[tokio::test]
async fn read_leases_taken_many_at_once_wait_for_their_holders() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, mut a) = formatted(dir.path(), 100).await;
    let b = connect(&h).await;
    b.hello(Some(d.uuid), 200).await.unwrap();
    // A holds the write leases of f1 and f2 (a create grants it).
    let (f1, _) = a.create_leased().await;
    let (f2, _) = a.create_leased().await;
    let own = b.create(FileKind::File).await;
    let other = b.create(FileKind::File).await;
    let replaced = Handle {
        id: other.id,
        gen: other.gen + 1,
    };
    let inos = vec![f1.handle(), own.handle(), f2.handle(), replaced];
    let b_task = {
        let rpc = b.rpc;
        tokio::spawn(async move {
            let r = rpc
                .call(&Request::AcquireReadMany { inos }, Bytes::new())
                .await;
            r.map(|x| x.0)
        })
    };
    let mut recalled = Vec::new();
    for _ in 0..2 {
        match a.push(Duration::from_secs(5)).await.expect("recall push") {
            Push::Recall {
                ino,
                want: LeaseMode::Read,
            } => recalled.push(ino),
            p => panic!("unexpected push {p:?}"),
        }
    }
    recalled.sort();
    assert_eq!(recalled, vec![f1.id, f2.id]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!b_task.is_finished(), "answered while A held f1 and f2");
    a.ok(Request::Release { ino: f1.id }).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!b_task.is_finished(), "answered while A held f2");
    a.ok(Request::Release { ino: f2.id }).await;
    let got = match b_task.await.unwrap() {
        Ok(Reply::ReadLeasedMany(v)) => v,
        other => panic!("unexpected {other:?}"),
    };
    let ids: Vec<Option<u64>> = got.iter().map(|g| g.as_ref().map(|l| l.inode.id)).collect();
    assert_eq!(ids, vec![Some(f1.id), Some(own.id), Some(f2.id), None]);
    assert!(got.iter().flatten().all(|l| l.xattrs == Some(vec![])));
    // An id nobody made: no lease, no error.
    let b2 = connect(&h).await;
    b2.hello(Some(d.uuid), 300).await.unwrap();
    let none = Handle {
        id: f1.id + 1000,
        gen: 1,
    };
    match b2
        .ok(Request::AcquireReadMany {
            inos: vec![none, f1.handle()],
        })
        .await
    {
        Reply::ReadLeasedMany(v) => {
            assert!(v[0].is_none());
            assert_eq!(v[1].as_ref().map(|l| l.inode.id), Some(f1.id));
        }
        r => panic!("unexpected {r:?}"),
    }
    h.shutdown().await;
}

/// A block change carries the fence number of the write grant it was made
/// under; once the next holder's change has reached a data server, a late
/// change of the previous holder is refused there (server-side fencing).
#[tokio::test]
async fn a_change_under_a_write_lease_that_passed_on_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, _admin) = formatted(dir.path(), 1).await;
    let client_key = KEY.client_key();
    let a = connect_with(&h, &client_key).await;
    a.hello(Some(d.uuid), 11).await.unwrap();
    let b = connect_with(&h, &client_key).await;
    b.hello(Some(d.uuid), 12).await.unwrap();
    let write = |id, fence, byte: u8| {
        (
            Request::Write {
                id,
                index: 1,
                replica: 0,
                offset: 0,
                sync: false,
                fence,
            },
            Bytes::from(vec![byte; 16]),
        )
    };
    // A creates the file (and so holds its write lease) and writes.
    let (f, fa) = a.create_leased().await;
    assert!(fa > 0);
    let (req, data) = write(f.id, fa, b'a');
    a.rpc.call(&req, data).await.expect("the holder writes");
    // A goes silent past its lease (a stopped or cut-off host); B takes
    // the write lease, with a higher fence number, and writes.
    tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) * 3 / 2)).await;
    let fb = match b.ok(Request::AcquireWrite { ino: f.handle() }).await {
        Reply::Leased { fence, .. } => fence,
        r => panic!("AcquireWrite answers with the grant's fence: {r:?}"),
    };
    assert!(fb > fa, "{fb} after {fa}");
    let (req, data) = write(f.id, fb, b'b');
    b.rpc.call(&req, data).await.expect("the new holder writes");
    // A's late write (made under its lost lease) and truncate are refused.
    let (req, data) = write(f.id, fa, b'a');
    let e = a.rpc.call(&req, data).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoLease, "{e}");
    let e = a
        .call(Request::Truncate {
            id: f.id,
            size: 0,
            fence: fa,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoLease, "{e}");
    // A client must name a grant; only servers (resync) may change blocks
    // without one.
    let (req, data) = write(f.id, 0, b'a');
    let e = a.rpc.call(&req, data).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Denied, "{e}");
    assert_eq!(&b.read(f.id, 1, 0, 16).await[..], &[b'b'; 16]);
    assert_eq!(b.stats().await.integrity.fenced, 2);
    // The holder again: B's next change goes on.
    let (req, data) = write(f.id, fb, b'c');
    b.rpc
        .call(&req, data)
        .await
        .expect("the holder writes again");
    h.shutdown().await;
}

/// A write lease taken by force has its fence raised at every server
/// before the next grant is answered: the old holder's late change is
/// refused at a data server the next holder has not written to, and what
/// it wrote past the saved size is gone.
#[tokio::test]
async fn a_revoked_write_lease_is_fenced_at_every_server_before_the_next_grant() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let hs = [server(dirs[0].path()).await, server(dirs[1].path()).await];
    let d = descriptor(hs.iter().map(|h| h.local_addr().to_string()).collect());
    for (i, h) in hs.iter().enumerate() {
        connect(h)
            .await
            .ok(Request::Format {
                descriptor: d.clone(),
                index: i as u32,
            })
            .await;
    }
    let client_key = KEY.client_key();
    let session = |i: usize, id: u64| {
        let (h, key, uuid) = (&hs[i], client_key.clone(), d.uuid);
        async move {
            let c = connect_with(h, &key).await;
            c.hello(Some(uuid), id).await.unwrap();
            c
        }
    };
    let (a0, a1, b0) = (
        session(0, 21).await,
        session(1, 21).await,
        session(0, 22).await,
    );
    let (f, fa) = a0.create_leased().await;
    // Owner: server 0 (an even id); block 1 lives on server 1.
    assert_eq!(f.id % 2, 0);
    let write = |fence| Request::Write {
        id: f.id,
        index: 1,
        replica: 0,
        offset: 0,
        sync: false,
        fence,
    };
    a1.rpc
        .call(&write(fa), Bytes::from_static(b"aaaa"))
        .await
        .expect("the holder writes");
    // A goes silent; B's grant comes after A's lease is revoked.
    tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) * 3 / 2)).await;
    let fb = match b0.ok(Request::AcquireWrite { ino: f.handle() }).await {
        Reply::Leased { fence, .. } => fence,
        r => panic!("unexpected {r:?}"),
    };
    assert!(fb > fa);
    // B has written nothing anywhere, yet server 1 refuses A's late write.
    let e = a1
        .rpc
        .call(&write(fa), Bytes::from_static(b"late"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoLease, "{e}");
    // What A wrote past the size it saved (it saved none) was cut off
    // before B's grant: it was never part of the file (`fencing.rs`).
    assert!(a1.read(f.id, 1, 0, 4).await.is_empty());
    let admin1 = connect(&hs[1]).await;
    assert_eq!(admin1.stats().await.integrity.fenced, 1);
    for h in hs {
        h.shutdown().await;
    }
}

#[tokio::test]
async fn silent_and_deaf_holders_lose_their_leases() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, mut a) = formatted(dir.path(), 1).await;
    let b = connect(&h).await;
    b.hello(Some(d.uuid), 2).await.unwrap();
    let f = a.create(FileKind::File).await; // A holds the write lease.
                                            // A goes silent for longer than a lease: B gets the lease at once and
                                            // no recall is needed.
    tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) * 3 / 2)).await;
    let t = Instant::now();
    b.inode(Request::AcquireWrite { ino: f.handle() }).await;
    assert!(t.elapsed() < Duration::from_millis(u64::from(LEASE_MS) / 2));
    assert!(a.push(Duration::from_millis(50)).await.is_none());
    // B now keeps renewing but ignores the recall: it is revoked lease_ms
    // after the recall.
    let b_rpc = std::sync::Arc::new(b.rpc);
    let renewer = {
        let rpc = b_rpc.clone();
        tokio::spawn(async move {
            loop {
                if rpc.call(&Request::Renew, Bytes::new()).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) / 8)).await;
            }
        })
    };
    let t = Instant::now();
    let got = a.inode(Request::AcquireRead { ino: f.handle() }).await;
    let waited = t.elapsed();
    assert_eq!(got.id, f.id);
    assert!(
        waited >= Duration::from_millis(u64::from(LEASE_MS) * 8 / 10),
        "granted after {waited:?}, before the recall ran out"
    );
    assert!(
        waited < Duration::from_millis(u64::from(LEASE_MS) * 3),
        "{waited:?}"
    );
    renewer.abort();
    h.shutdown().await;
}

#[tokio::test]
async fn a_dropped_waiter_does_not_block_others() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, a) = formatted(dir.path(), 1).await;
    let f = a.create(FileKind::File).await;
    let b = connect(&h).await;
    b.hello(Some(d.uuid), 2).await.unwrap();
    let c = connect(&h).await;
    c.hello(Some(d.uuid), 3).await.unwrap();
    let handle = f.handle();
    let b_rpc = b.rpc;
    let waiting = tokio::spawn(async move {
        let _ = b_rpc
            .call(&Request::AcquireWrite { ino: handle }, Bytes::new())
            .await;
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // B's connection goes away while it waits.
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.ok(Request::Release { ino: f.id }).await;
    let t = Instant::now();
    c.inode(Request::AcquireRead { ino: handle }).await;
    assert!(
        t.elapsed() < Duration::from_millis(u64::from(LEASE_MS) / 2),
        "C waited {:?} behind an abandoned request",
        t.elapsed()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn restart_keeps_data_and_answers_grace() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, c) = formatted(dir.path(), 1).await;
    let root = c.root().await;
    let f = c.create(FileKind::File).await;
    c.link(root, "kept", &f).await;
    c.write(f.id, 1, 0, b"persisted bytes").await;
    let old_epoch = h.epoch();
    let addr = h.local_addr();
    h.shutdown().await;
    drop(c);
    // Same directory, same port if it is still free (any port otherwise).
    let h = match start(ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: addr.to_string(),
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
        Ok(h) => h,
        Err(_) => server(dir.path()).await,
    };
    assert_ne!(h.epoch(), old_epoch);
    let c = connect(&h).await;
    match c.hello(Some(d.uuid), 1).await.unwrap() {
        Reply::Hello { epoch, .. } => assert_eq!(epoch, h.epoch()),
        r => panic!("unexpected {r:?}"),
    }
    // In grace: lease-taking requests are refused, others are served.
    assert_eq!(
        c.code(Request::Lookup {
            dir: root,
            name: b"kept".to_vec()
        })
        .await,
        ErrorCode::Grace
    );
    assert_eq!(
        c.code(Request::CreateInode {
            parent: ROOT_ID,
            attr: attr(FileKind::File),
            target: None,
            home: None,
            op: 0,
            xattrs: vec![],
        })
        .await,
        ErrorCode::Grace
    );
    assert_eq!(c.inode(Request::GetInode { ino: f.id }).await, f);
    assert_eq!(&c.read(f.id, 1, 0, 15).await[..], b"persisted bytes");
    tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) + 100)).await;
    let e = c.lookup(root, "kept").await.unwrap();
    assert_eq!(e.child, f.handle());
    // Ids keep counting from where they were.
    let g = c.create(FileKind::File).await;
    assert!(g.id > f.id);
    h.shutdown().await;
}

#[tokio::test]
async fn a_second_server_cannot_share_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let h = server(dir.path()).await;
    let second = start(ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".into(),
        lease_ms: LEASE_MS,
        etcd: Vec::new(),
        etcd_auth: Default::default(),
        keys: Keys::from_key(KEY.clone()),
        max_connections: 4096,
        scrub_every: None,
        scrub_rate: 0,
    })
    .await;
    assert!(matches!(second, Err(morris_server::ServerError::Locked(_))));
    h.shutdown().await;
    let again = server(dir.path()).await;
    again.shutdown().await;
}

#[tokio::test]
async fn garbage_frames_do_not_hurt_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (h, _, c) = formatted(dir.path(), 1).await;
    let addr = h.local_addr();
    // Random bytes.
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut junk = vec![0u8; 4096];
    for b in junk.iter_mut() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
    let mut s1 = TcpStream::connect(addr).await.unwrap();
    let _ = s1.write_all(&junk).await;
    // An oversized length prefix.
    let mut s2 = TcpStream::connect(addr).await.unwrap();
    s2.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    // A well-framed request whose header is not a request (after a good
    // handshake; the two above never get past theirs).
    let mut s3 = TcpStream::connect(addr).await.unwrap();
    morris_proto::auth::handshake::connect(&mut s3, &KEY, &[])
        .await
        .unwrap();
    let mut frame = Vec::new();
    let header = [250u8, 1, 2, 3];
    let body_len = 1 + 8 + 4 + header.len();
    frame.extend_from_slice(&(body_len as u32).to_be_bytes());
    frame.push(0);
    frame.extend_from_slice(&42u64.to_be_bytes());
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
    frame.extend_from_slice(&header);
    s3.write_all(&frame).await.unwrap();
    // The oversized and the random ones are closed by the server.
    for s in [&mut s1, &mut s2] {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "server kept a garbage connection open");
    }
    // The undecodable request gets a Protocol error answer.
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s3.read_exact(&mut len))
        .await
        .unwrap()
        .unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s3.read_exact(&mut body).await.unwrap();
    let f = morris_proto::frame::decode_frame(Bytes::from(body)).unwrap();
    assert_eq!(f.id, 42);
    match morris_proto::frame::decode_response(&f.header).unwrap() {
        Err(e) => assert_eq!(e.code, ErrorCode::Protocol),
        Ok(r) => panic!("unexpected {r:?}"),
    }
    // Everyone else is still served.
    let root = c.root().await;
    assert!(c.lookup(root, "nothing").await.is_none());
    let st = c.stats().await;
    assert!(st.requests > 0);
    h.shutdown().await;
}

#[tokio::test]
async fn requests_in_flight_on_one_connection_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let (h, _, c) = formatted(dir.path(), 1).await;
    let root = c.root().await;
    let f = c.create(FileKind::File).await;
    let rpc = std::sync::Arc::new(c.rpc);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let rpc = rpc.clone();
        let child = f.handle();
        tasks.push(tokio::spawn(async move {
            let req = Request::Link {
                dir: root,
                name: format!("p{i}").into_bytes(),
                child,
                kind: FileKind::File,
                replace: None,
                op: 0,
            };
            rpc.call(&req, Bytes::new()).await.map(|x| x.0)
        }));
    }
    for t in futures::future::join_all(tasks).await {
        assert!(matches!(
            t.unwrap().unwrap(),
            Reply::Removed { entry: None, .. }
        ));
    }
    match rpc
        .call(&Request::GetInode { ino: ROOT_ID }, Bytes::new())
        .await
        .unwrap()
        .0
    {
        Reply::Inode(r) => assert_eq!(r.attr.size, 64),
        r => panic!("unexpected {r:?}"),
    }
    h.shutdown().await;
}

/// Restarts the server of `dir` (same port if still free) and waits out its grace.
async fn restarted(h: ServerHandle, dir: &std::path::Path) -> ServerHandle {
    let addr = h.local_addr();
    h.shutdown().await;
    let h = match start(ServerConfig {
        data_dir: dir.to_path_buf(),
        listen: addr.to_string(),
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
        Ok(h) => h,
        Err(_) => server(dir).await,
    };
    tokio::time::sleep(Duration::from_millis(u64::from(LEASE_MS) + 100)).await;
    h
}

#[tokio::test]
async fn a_resent_operation_is_answered_from_its_outcome_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, c) = formatted(dir.path(), 1).await;
    let root = c.root().await;
    let f = c.create(FileKind::File).await;
    let link = Request::Link {
        dir: root,
        name: b"x".to_vec(),
        child: f.handle(),
        kind: FileKind::File,
        replace: None,
        op: 10,
    };
    let unlink = Request::Unlink {
        dir: root,
        name: b"x".to_vec(),
        expect: Some(f.id),
        op: 11,
    };
    c.ok(link.clone()).await;
    let first = c.ok(unlink.clone()).await;
    // The link again, as a client resends it after losing the reply: the
    // stored outcome, and the name stays gone.
    match c.ok(link.clone()).await {
        Reply::Removed { entry: None, .. } => {}
        r => panic!("unexpected {r:?}"),
    }
    assert_eq!(c.lookup(root, "x").await, None);
    // The unlink again: its outcome, not NotFound.
    assert_eq!(c.ok(unlink.clone()).await, first);
    drop(c);
    // Outcomes are committed with their changes: a restart keeps them.
    let h = restarted(h, dir.path()).await;
    let c = connect(&h).await;
    c.hello(Some(d.uuid), 1).await.expect("hello");
    assert_eq!(c.ok(unlink.clone()).await, first);
    // The same op id from another client is another operation.
    let other = connect(&h).await;
    other.hello(Some(d.uuid), 2).await.expect("hello");
    assert_eq!(other.code(unlink).await, ErrorCode::NotFound);
    h.shutdown().await;
}

#[tokio::test]
async fn an_orphan_is_kept_while_a_live_client_has_it_open() {
    let dir = tempfile::tempdir().unwrap();
    let (h, d, a) = formatted(dir.path(), 1).await;
    let b = connect(&h).await;
    b.hello(Some(d.uuid), 2).await.expect("hello");
    let root = a.root().await;
    let f = a.create(FileKind::File).await;
    a.link(root, "f", &f).await;
    // b has it open (it would record that when its lease is recalled).
    b.ok(Request::SetOpen {
        ino: f.handle(),
        open: true,
        op: 1,
    })
    .await;
    // a removes the last name.
    a.ok(Request::Unlink {
        dir: root,
        name: b"f".to_vec(),
        expect: Some(f.id),
        op: 0,
    })
    .await;
    let orphan = a
        .inode(Request::DropLink {
            ino: f.handle(),
            op: 0,
        })
        .await;
    assert_eq!(orphan.attr.nlink, 0);
    let reap = Request::Reap {
        ino: f.handle(),
        op: 0,
    };
    // b is alive: kept, and listed as an open orphan.
    assert_eq!(a.ok(reap.clone()).await, Reply::Reaped(None));
    match a.ok(Request::ScanOrphans { after: 0, max: 10 }).await {
        Reply::Orphans(o) => {
            assert_eq!(o.len(), 1);
            assert!(o[0].open);
            assert_eq!(o[0].inode.id, f.id);
        }
        r => panic!("unexpected {r:?}"),
    }
    // b goes silent (a client that died with the file open): after two
    // lease times its record no longer counts.
    drop(b);
    tokio::time::sleep(Duration::from_millis(2 * u64::from(LEASE_MS) + 300)).await;
    match a.ok(reap).await {
        Reply::Reaped(Some(i)) => assert_eq!(i.id, f.id),
        r => panic!("unexpected {r:?}"),
    }
    assert_eq!(
        a.code(Request::AcquireRead { ino: f.handle() }).await,
        ErrorCode::Stale
    );
    h.shutdown().await;
}

/// `Replace` makes an empty server a member again without serving what it
/// lacks: its ranges are copies (never a primary on an empty store), it
/// answers no read of block data until its copies are recorded stale, and
/// both survive a restart.
#[tokio::test]
async fn a_replacement_reads_no_block_and_holds_no_range_until_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let h = server(dir.path()).await;
    let admin = connect(&h).await;
    admin.hello(None, 1).await.expect("hello");
    let mut d = descriptor(vec![h.local_addr().to_string(), "127.0.0.1:9".into()]);
    let one = d.clone();
    assert_eq!(
        admin
            .code(Request::Replace {
                descriptor: one,
                index: 0
            })
            .await,
        ErrorCode::Invalid,
        "a volume with one copy has nothing to rebuild from"
    );
    d.replicas = 2;
    let replace = Request::Replace {
        descriptor: d.clone(),
        index: 0,
    };
    admin.ok(replace.clone()).await;
    admin.ok(replace.clone()).await;
    for f in ["range-home.state", "range-mirror.state"] {
        let text = std::fs::read_to_string(dir.path().join(f)).expect(f);
        assert_eq!(text.trim(), "0 secondary", "{f}");
    }
    let l = morris_proto::layout::Layout::new(2, UNIT, 2);
    let id = 4242;
    let replica = l
        .placement(id, 1)
        .iter()
        .position(|&s| s == 0)
        .expect("a copy here") as u8;
    let read = Request::Read {
        id,
        index: 1,
        replica,
        offset: 0,
        len: 16,
    };
    let c = connect(&h).await;
    c.hello(Some(d.uuid), 2).await.expect("hello");
    assert_eq!(c.code(read.clone()).await, ErrorCode::Unavailable);
    // Its ranges are not served: it holds no copy of them yet. A list of a
    // range's inodes comes only from the copy serving it (where a scan of
    // every range served here answers an empty list).
    assert_eq!(
        c.code(Request::GetInode { ino: ROOT_ID }).await,
        ErrorCode::NotOwner
    );
    for range in 0..2 {
        assert_eq!(
            c.code(Request::ScanRange {
                range,
                after: 0,
                max: 10
            })
            .await,
            ErrorCode::NotOwner
        );
    }
    match c.ok(Request::ScanInodes { after: 0, max: 10 }).await {
        Reply::Inodes(v) => assert!(v.is_empty()),
        r => panic!("unexpected {r:?}"),
    }
    drop((c, admin));
    let h = restarted(h, dir.path()).await;
    let c = connect(&h).await;
    c.hello(Some(d.uuid), 3).await.expect("hello");
    assert_eq!(c.code(read).await, ErrorCode::Unavailable);
    // Not a new volume's server either: formatting it is refused.
    assert_eq!(
        c.code(Request::Replace {
            descriptor: descriptor(vec![h.local_addr().to_string()]),
            index: 0
        })
        .await,
        ErrorCode::WrongVolume
    );
    h.shutdown().await;
}
