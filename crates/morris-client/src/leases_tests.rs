//! The lease cache against a real stripe server, driven step by step.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use morris_proto::messages::LeaseMode;
use morris_proto::net::RpcClient;
use morris_proto::{FileKind, Reply, Request, Timestamp, VolumeDescriptor, PROTOCOL_VERSION};

use super::{Mode, ACQUIRE_SHARDS};
use crate::{Caller, Client, ClientConfig, Key, Keys, ROOT_ID};

/// One formatted server (every inode is its), a client of it, and the
/// server's handle and data directory (kept alive).
async fn one_server() -> (Arc<Client>, morris_server::ServerHandle, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    let key = Key::generate();
    let keys = Keys::from_key(key.clone());
    let s = morris_server::start(morris_server::ServerConfig {
        data_dir: d.path().to_path_buf(),
        listen: "127.0.0.1:0".into(),
        lease_ms: 1500,
        etcd: Vec::new(),
        etcd_auth: Default::default(),
        keys: keys.clone(),
        max_connections: 4096,
        scrub_every: None,
        scrub_rate: 0,
    })
    .await
    .unwrap();
    let addr = s.local_addr().to_string();
    let desc = VolumeDescriptor {
        uuid: uuid::Uuid::new_v4(),
        servers: vec![addr.clone()],
        stripe_unit: 1 << 20,
        replicas: 1,
        created: Timestamp::now(),
    };
    let c = RpcClient::connect(&addr, &key, None).await.unwrap();
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
                descriptor: desc,
                index: 0,
            },
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(r, Reply::Ok);
    let client = Client::connect(&addr, ClientConfig::new(Keys::from_key(key.client_key())))
        .await
        .unwrap();
    (client, s, d)
}

/// A request holds a use of a directory and wants the lease of a file whose
/// id shares the directory's acquire lock; an acquire of the directory,
/// whose lease is being given back, holds that lock. The give-back waits
/// for the use, the use for the lock: the acquire must not hold the lock
/// while it waits for the give-back (it did, and the NFS gateway wedged).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_never_waits_for_a_give_back_holding_the_shared_lock() {
    let (client, _server, _dir) = one_server().await;
    let me = Caller::root();
    let d = client.mkdir(ROOT_ID, b"d", 0o755, &me).await.unwrap();
    let mut twin = None;
    for i in 0..2 * ACQUIRE_SHARDS {
        let f = client
            .create(
                d.id,
                format!("f{i}").as_bytes(),
                FileKind::File,
                0o644,
                0,
                true,
                &me,
            )
            .await
            .unwrap();
        if f.id % ACQUIRE_SHARDS as u64 == d.id % ACQUIRE_SHARDS as u64 {
            twin = Some(f);
            break;
        }
    }
    let twin = twin.expect("a file sharing the directory's acquire lock");
    let leases = client.leases.clone();
    // Nothing of the file cached: getting it must acquire.
    leases.forget(twin.id);
    leases.learn(twin.handle());
    // A use of the directory (a lookup in it, say).
    let use_of_dir = leases.get(d.handle(), Mode::Read).await.unwrap();
    // A recall of the directory arrives: its give-back waits for that use.
    leases.on_recall(0, d.id, LeaseMode::Write);
    // An acquire of the directory (an upgrade for a rename, say) starts.
    let (l2, dh) = (leases.clone(), d.handle());
    let upgrade = tokio::spawn(async move {
        l2.acquire(dh, Mode::Write, None, false)
            .await
            .map(|g| g.is_some())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The holder of the directory's use now needs the file's lease.
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        leases.get(twin.handle(), Mode::Read),
    )
    .await;
    assert!(
        got.is_ok(),
        "the file's lease waited for the shared lock held by an acquire waiting for a give-back"
    );
    drop(got);
    drop(use_of_dir);
    let done = tokio::time::timeout(Duration::from_secs(10), upgrade).await;
    assert!(done.is_ok(), "the directory's acquire never finished");
}

/// What a front end was told to drop.
#[derive(Default)]
struct Told {
    entries: parking_lot::Mutex<Vec<(u64, Vec<u8>)>>,
    all: std::sync::atomic::AtomicUsize,
}

impl crate::Invalidator for Told {
    fn inode(&self, _id: u64) {}

    fn entry(&self, dir: u64, name: &[u8]) {
        self.entries.lock().push((dir, name.to_vec()));
    }

    fn all_names(&self) {
        self.all.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A front end may keep a name only while this client keeps it under a
/// lease it can trust; the recall that ends the lease tells it to drop
/// the name, and an upgrade to write (which gives the read lease up at
/// the owner when it is sent) drops every name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_kept_for_a_front_end_only_under_a_trusted_lease() {
    use std::sync::atomic::Ordering;
    let (a, server, _dir) = one_server().await;
    let me = Caller::root();
    let told = Arc::new(Told::default());
    a.set_invalidator(told.clone());
    let b = Client::connect(
        &server.local_addr().to_string(),
        ClientConfig::new(a.config.keys.clone()),
    )
    .await
    .unwrap();
    let d = b.mkdir(ROOT_ID, b"d", 0o755, &me).await.unwrap();
    for n in [&b"f"[..], b"g"] {
        b.create(d.id, n, FileKind::File, 0o644, 0, true, &me)
            .await
            .unwrap();
    }
    b.fsync_dir(d.id).await.unwrap();
    b.fsync_dir(ROOT_ID).await.unwrap();

    a.lookup(ROOT_ID, b"d").await.unwrap();
    let f = a.lookup(d.id, b"f").await.unwrap();
    let ttl = a.name_ttl(d.id, b"f", f.handle());
    // lease_ms 1500: trusted for 7/8 of it after the server's last answer.
    assert!(
        ttl > Duration::ZERO && ttl <= Duration::from_millis(1313),
        "{ttl:?}"
    );
    let other = morris_proto::Handle {
        id: f.id,
        gen: f.gen.wrapping_add(1),
    };
    assert_eq!(a.name_ttl(d.id, b"f", other), Duration::ZERO);
    assert_eq!(a.name_ttl(d.id, b"absent", f.handle()), Duration::ZERO);
    // The object's attributes: as long as its lease is trusted.
    let t = a.attr_trust(f.id).expect("f's lease is held");
    assert!(
        t > Duration::ZERO && t <= Duration::from_millis(1313),
        "{t:?}"
    );
    // Not looked up here: not kept.
    let g = b.lookup(d.id, b"g").await.unwrap();
    assert_eq!(a.name_ttl(d.id, b"g", g.handle()), Duration::ZERO);
    assert_eq!(a.attr_trust(g.id), None);

    // Another client's removal recalls the directory's lease: the name
    // goes, from the front end first.
    b.unlink(d.id, b"f", &me).await.unwrap();
    b.fsync_dir(d.id).await.unwrap();
    assert_eq!(a.name_ttl(d.id, b"f", f.handle()), Duration::ZERO);
    assert!(told.entries.lock().contains(&(d.id, b"f".to_vec())));
    assert_eq!(told.all.load(Ordering::SeqCst), 0);

    // An upgrade of a directory whose names the front end keeps drops
    // them all before it is sent.
    let g = a.lookup(d.id, b"g").await.unwrap();
    assert!(a.name_ttl(d.id, b"g", g.handle()) > Duration::ZERO);
    a.create(d.id, b"h", FileKind::File, 0o644, 0, true, &me)
        .await
        .unwrap();
    assert_eq!(told.all.load(Ordering::SeqCst), 1);
}
