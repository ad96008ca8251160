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
