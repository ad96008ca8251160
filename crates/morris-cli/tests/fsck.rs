//! `morris fsck` against real servers whose store was damaged on purpose
//! through raw protocol requests (no client library involved).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{both, morris, stdout, Cluster, ClusterOpts};
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{
    ErrorCode, FileId, FileKind, Handle, Inode, Reply, Request, SetAttr, PROTOCOL_VERSION, ROOT_ID,
};

/// A session with one server, joined to the volume.
struct Raw {
    rpc: RpcClient,
}

impl Raw {
    async fn open(addr: &str, uuid: &str) -> Raw {
        let key = morris_proto::auth::Keys::load(&common::keys().client)
            .expect("client key")
            .credential();
        let rpc = RpcClient::connect(addr, &key, None).await.expect("connect");
        let volume = Some(uuid.parse().expect("uuid"));
        let hello = Request::Hello {
            volume,
            client_id: 0x7e57,
            client_name: "fsck-test".into(),
            version: PROTOCOL_VERSION,
        };
        rpc.call(&hello, Bytes::new()).await.expect("hello");
        Raw { rpc }
    }

    /// Calls, riding out the grace period of a freshly started server.
    async fn call(&self, req: Request, payload: Bytes) -> Result<(Reply, Bytes), RpcError> {
        for _ in 0..100 {
            match self.rpc.call(&req, payload.clone()).await {
                Err(RpcError::Remote(e)) if e.code == ErrorCode::Grace => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => return other,
            }
        }
        panic!("{} still in grace after 10 s", req.name());
    }

    async fn inode(&self, req: Request) -> Inode {
        match self.call(req, Bytes::new()).await.expect("inode request") {
            (Reply::Inode(i) | Reply::Leased { inode: i, .. }, _) => i,
            (other, _) => panic!("unexpected {other:?}"),
        }
    }

    async fn ok(&self, req: Request) {
        self.call(req, Bytes::new()).await.expect("request");
    }

    async fn create_file(&self) -> Inode {
        self.inode(Request::CreateInode {
            parent: ROOT_ID,
            attr: common::new_file_attr(0, 0),
            target: None,
            home: None,
            op: 0,
            xattrs: vec![],
        })
        .await
    }

    async fn write(&self, id: FileId, data: &'static [u8]) {
        let req = Request::Write {
            id,
            index: 1,
            replica: 0,
            offset: 0,
            sync: false,
            // Any grant: these servers have seen no change to the file.
            fence: 1,
        };
        self.call(req, Bytes::from_static(data))
            .await
            .expect("write");
    }

    async fn release(&self, ino: FileId) {
        self.ok(Request::Release { ino }).await;
    }
}

fn fsck(args: &[&str]) -> (bool, String, String) {
    let o = morris(args);
    (o.status.success(), stdout(&o), both(&o))
}

#[test]
fn fsck_finds_and_repairs_damage_but_keeps_live_files() {
    // Two servers: the root (id 1) lives on server 1, even ids on server 0.
    let c = Cluster::start(2, ClusterOpts::default());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (live, garbage) = rt.block_on(async {
        let s0 = Raw::open(c.addr(0), c.uuid()).await;
        let s1 = Raw::open(c.addr(1), c.uuid()).await;
        let root = s1.inode(Request::GetInode { ino: ROOT_ID }).await.handle();
        let link = |name: &str, child: Handle| Request::Link {
            dir: root,
            name: name.as_bytes().to_vec(),
            child,
            kind: FileKind::File,
            replace: None,
            op: 0,
        };

        // A healthy file with data (block 1 of an even id lives on server 1).
        let live = s0.create_file().await;
        s1.write(live.id, b"live data").await;
        s0.ok(Request::SetAttr {
            ino: live.handle(),
            set: SetAttr {
                size: Some(9),
                ..SetAttr::default()
            },
        })
        .await;
        s1.ok(link("live", live.handle())).await;

        // A dangling entry: names an inode that was never created.
        s1.ok(link("ghost", Handle { id: 1000, gen: 1 })).await;

        // An unreachable inode with data: a create that crashed before linking.
        let garbage = s0.create_file().await;
        s1.write(garbage.id, b"garbage").await;

        // Data of a file that has no inode at all.
        s1.write(7776, b"orphan").await;

        // A file whose link count is wrong.
        let wrong = s0.create_file().await;
        s1.ok(link("wrong", wrong.handle())).await;
        s0.ok(Request::SetAttr {
            ino: wrong.handle(),
            set: SetAttr {
                nlink: Some(3),
                ..SetAttr::default()
            },
        })
        .await;

        for id in [live.id, garbage.id, wrong.id] {
            s0.release(id).await;
        }
        s1.release(ROOT_ID).await;
        (live, garbage)
    });

    // Check only: errors are reported and the exit code says so.
    let (ok, out, all) = fsck(&["fsck", c.addr(0), "--all"]);
    // Not a terminal: progress as plain lines.
    assert!(all.contains("fsck scanning: "), "{all}");
    assert!(!ok, "damage must fail fsck: {all}");
    assert!(out.contains("\"ghost\" names inode 1000"), "{all}");
    assert!(out.contains("nlink 3 but 1 entries"), "{all}");
    assert!(
        out.contains(&format!("inode {} (File) changed recently", garbage.id)),
        "{all}"
    );
    assert!(out.contains("file 7776 on server 1"), "{all}");
    assert!(out.contains(" 2 errors (1 dangling entries"), "{all}");

    // Repair with the default minimum age: the dangling entry goes; the young
    // garbage and the just-changed link count are left alone.
    let (ok, out, all) = fsck(&["fsck", "--repair", c.addr(1)]);
    assert!(!ok, "the young link count is still wrong: {all}");
    assert!(out.contains("after repair:"), "{all}");
    assert!(out.contains("0 dangling entries"), "{all}");
    assert!(out.contains("changed within the minimum age"), "{all}");

    // Repair everything.
    let (ok, out, all) = fsck(&["fsck", "--repair", "--min-age", "0", c.addr(0)]);
    assert!(ok, "repair should leave no errors: {all}");
    assert!(
        out.contains("after repair:") && out.contains(" 0 errors"),
        "{all}"
    );

    let (ok, out, all) = fsck(&["fsck", c.addr(0)]);
    assert!(ok, "{all}");
    assert!(out.contains(" 0 errors"), "{all}");
    assert!(out.contains("0 unreachable inodes"), "{all}");
    assert!(out.contains("0 orphan data files"), "{all}");
    // Root, live, wrong.
    assert!(out.contains("3 inodes, 2 entries"), "{all}");

    // The live file and its data are intact; the garbage is gone.
    rt.block_on(async {
        let s0 = Raw::open(c.addr(0), c.uuid()).await;
        let s1 = Raw::open(c.addr(1), c.uuid()).await;
        let i = s0.inode(Request::GetInode { ino: live.id }).await;
        assert_eq!(i.attr.nlink, 1);
        let req = Request::Read {
            id: live.id,
            index: 1,
            replica: 0,
            offset: 0,
            len: 9,
        };
        let (_, data) = s1.call(req, Bytes::new()).await.expect("read");
        assert_eq!(&data[..], b"live data");
        let gone = s0
            .call(Request::GetInode { ino: garbage.id }, Bytes::new())
            .await;
        assert!(gone.is_err(), "garbage inode still there: {gone:?}");
    });
}
