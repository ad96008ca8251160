//! Checksums: a byte flipped in a server's extent file (bit rot, a torn
//! write, tampering) is never served. With two copies the other copy is
//! read, the damaged one is recorded stale and rewritten by resync; with
//! one copy the read fails with EIO. `morris scrub` finds damage nobody
//! has read yet.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{both, morris, pattern, read_all, status, stdout, wait_for, wait_healthy, Cluster};

/// Every extent file of file `id` on server `i`: `(path, copy)`.
fn extent_files(c: &Cluster, i: usize, id: u64) -> Vec<(PathBuf, u8)> {
    let mut out = Vec::new();
    let root = c.servers[i].data.join("blocks");
    for d in std::fs::read_dir(&root).expect("blocks dir").flatten() {
        if !d.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(d.path()).expect("fan-out dir").flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name == id.to_string() {
                out.push((f.path(), 0));
            } else if let Some(r) = name.strip_prefix(&format!("{id}.")) {
                if let Ok(r) = r.parse::<u8>() {
                    out.push((f.path(), r));
                }
            }
        }
    }
    out
}

fn byte_at(p: &Path, at: u64) -> u8 {
    let f = std::fs::File::open(p).expect("open extent file");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read extent file");
    b[0]
}

/// Flips one bit of byte `at` of `p`, as bit rot would; returns the old byte.
fn flip(p: &Path, at: u64) -> u8 {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .expect("open extent file");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read extent file");
    f.write_all_at(&[b[0] ^ 0x04], at)
        .expect("write extent file");
    b[0]
}

fn integrity(c: &Cluster, i: usize) -> serde_json::Value {
    status(c)["servers"][i]["stats"]["integrity"].clone()
}

#[test]
fn a_flipped_byte_is_served_from_the_other_copy_and_repaired() {
    let c = Cluster::start_mirrored(2);
    let data = pattern(7, 0, 1 << 20);
    let id = {
        let m = c.mount();
        let f = m.path.join("f");
        std::fs::write(&f, &data).expect("write");
        std::fs::File::open(&f)
            .and_then(|f| f.sync_all())
            .expect("fsync");
        std::fs::metadata(&f).expect("stat").ino()
    };
    // Server 0's first copy of the file: the block at its start.
    let files = extent_files(&c, 0, id);
    let (victim, _) = files
        .iter()
        .find(|(_, r)| *r == 0)
        .cloned()
        .unwrap_or_else(|| panic!("no first copy on server 0: {files:?}"));
    let good = flip(&victim, 100);

    // Fresh mounts (nothing cached) read the right bytes all the same. A
    // reader picks the less loaded copy, so it may never ask server 0:
    // a few tries, then a scrub of server 0 finds the damage instead.
    let mut m = c.mount();
    let mut found_by_read = false;
    for _ in 0..5 {
        assert!(read_all(&m.path.join("f")) == data, "damaged copy served");
        if integrity(&c, 0)["bad_chunks"].as_u64() >= Some(1) {
            found_by_read = true;
            break;
        }
        m = c.mount();
    }
    if !found_by_read {
        eprintln!("the reads went to the other copy; scrubbing server 0");
        let o = morris(&["scrub", c.addr(0), "--server", "0"]);
        assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    }

    // The damage was found, handed to resync, and rewritten on disk.
    wait_for(
        Duration::from_secs(60),
        "the damaged copy to be rewritten",
        || {
            let i = integrity(&c, 0);
            if i["bad_chunks"].as_u64() >= Some(1)
                && i["repairs"].as_u64() >= Some(1)
                && byte_at(&victim, 100) == good
            {
                Ok(())
            } else {
                Err(format!("{i} byte {:#x}", byte_at(&victim, 100)))
            }
        },
    );
    wait_healthy(&c);
    assert!(read_all(&m.path.join("f")) == data);

    // A scrub now finds nothing.
    let o = morris(&["scrub", c.addr(1)]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(stdout(&o).contains("every chunk matched"), "{}", both(&o));

    // Damage nobody reads is found by a scrub, and repaired too.
    let files = extent_files(&c, 1, id);
    let (victim, _) = files.first().cloned().expect("an extent file on server 1");
    let good = flip(&victim, 70_000);
    let o = morris(&["scrub", c.addr(0), "--rate", "512M"]);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(stdout(&o).contains("1 bad chunks"), "{}", both(&o));
    wait_for(
        Duration::from_secs(60),
        "the scrubbed copy to be rewritten",
        || {
            if byte_at(&victim, 70_000) == good {
                Ok(())
            } else {
                Err(integrity(&c, 1).to_string())
            }
        },
    );
    wait_healthy(&c);
    let o = morris(&["scrub", c.addr(0)]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(read_all(&m.path.join("f")) == data);
    let st = integrity(&c, 1);
    assert_eq!(st["scrub"]["passes"].as_u64(), Some(3), "{st}");
    common::fsck_clean(&c);
}

#[test]
fn with_one_copy_a_flipped_byte_reads_as_an_io_error() {
    let c = Cluster::start(1, common::ClusterOpts::default());
    let data = pattern(8, 0, 256 << 10);
    let id = {
        let m = c.mount();
        let f = m.path.join("f");
        std::fs::write(&f, &data).expect("write");
        std::fs::metadata(&f).expect("stat").ino()
    };
    let files = extent_files(&c, 0, id);
    let (victim, _) = files.first().cloned().expect("the extent file");
    flip(&victim, 5000);
    let m = c.mount();
    // The block holding byte 5000 fails (EIO, never other bytes); blocks
    // elsewhere in the file still read.
    let e = std::fs::read(m.path.join("f")).expect_err("damaged chunk served");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let f = std::fs::File::open(m.path.join("f")).expect("open");
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 200 << 10)
        .expect("a block elsewhere");
    assert!(buf == data[200 << 10..(200 << 10) + 4096]);
    wait_for(Duration::from_secs(30), "the damage to be reported", || {
        let i = integrity(&c, 0);
        if i["bad_chunks"].as_u64() >= Some(1) && i["unrepairable"].as_u64() >= Some(1) {
            Ok(())
        } else {
            Err(i.to_string())
        }
    });
    let o = morris(&["status", c.addr(0)]);
    assert!(stdout(&o).contains("unrepairable"), "{}", both(&o));
    // Rewriting the chunk makes it whole again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.path.join("f"))
        .and_then(|w| w.write_all_at(&data[4096..8192], 4096))
        .expect("rewrite the damaged chunk");
    drop(f);
    drop(m);
    let m = c.mount();
    assert!(read_all(&m.path.join("f")) == data);
}

#[test]
fn a_damaged_unit_of_a_cached_file_is_fetched_from_home_again() {
    let home = tempfile::tempdir().expect("tempdir");
    let data = pattern(9, 0, 200 << 10);
    std::fs::write(home.path().join("f"), &data).expect("write at home");
    let c = Cluster::start(1, common::ClusterOpts::default());
    let id = {
        let m = c.mount();
        let dir = m.path.join("c");
        std::fs::create_dir(&dir).expect("mkdir");
        let url = format!("file://{}", home.path().display());
        let o = morris(&["cache", "bind", dir.to_str().expect("utf-8"), &url]);
        assert!(o.status.success(), "cache bind: {}", both(&o));
        assert!(read_all(&dir.join("f")) == data, "first read (a miss)");
        std::fs::metadata(dir.join("f")).expect("stat").ino()
    };
    let files = extent_files(&c, 0, id);
    let (victim, _) = files
        .first()
        .cloned()
        .expect("the cached unit's extent file");
    let good = flip(&victim, 1234);
    let m = c.mount();
    assert!(read_all(&m.path.join("c/f")) == data, "damaged unit served");
    assert_eq!(byte_at(&victim, 1234), good, "the unit was fetched again");
    let i = integrity(&c, 0);
    assert!(i["bad_chunks"].as_u64() >= Some(1), "{i}");

    // Damage in another unit, found by a scrub before anyone reads it: the
    // unit is forgotten and fetched from home at the next read (not taken
    // for data with no other copy).
    let good = flip(&victim, 70_000);
    let o = morris(&["scrub", c.addr(0)]);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    drop(m);
    let m = c.mount();
    assert!(read_all(&m.path.join("c/f")) == data, "damaged unit served");
    assert_eq!(byte_at(&victim, 70_000), good, "the unit was fetched again");
    let i = integrity(&c, 0);
    assert_eq!(i["unrepairable"].as_u64(), Some(0), "{i}");
}

/// Writes `A`s over block 1's first copy of file `id` only, as a client
/// that takes the write lease and then either goes silent for good
/// (`release: false`) or gives the lease back cleanly (`release: true`,
/// as if the inode's owner had lost what the grant changed).
fn write_first_copy_only(c: &Cluster, id: u64, release: bool) {
    use morris_proto::net::RpcClient;
    use morris_proto::{Reply, Request, PROTOCOL_VERSION};
    let uuid: uuid::Uuid = c.uuid().parse().expect("uuid");
    let key = morris_proto::auth::Keys::load(&common::keys().client)
        .expect("client key")
        .credential();
    let addrs: Vec<String> = (0..2).map(|i| c.addr(i).to_string()).collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut s = Vec::new();
        for a in &addrs {
            let rpc = RpcClient::connect(a, &key, None).await.expect("connect");
            let hello = Request::Hello {
                volume: Some(uuid),
                client_id: 0x5151,
                client_name: "stops-between-copies".into(),
                version: PROTOCOL_VERSION,
            };
            rpc.call(&hello, bytes::Bytes::new()).await.expect("hello");
            s.push(rpc);
        }
        let owner = &s[(id % 2) as usize];
        let h = match owner
            .call(&Request::GetInode { ino: id }, bytes::Bytes::new())
            .await
            .expect("inode")
            .0
        {
            Reply::Inode(i) => i.handle(),
            r => panic!("unexpected {r:?}"),
        };
        let fence = match owner
            .call(&Request::AcquireWrite { ino: h }, bytes::Bytes::new())
            .await
            .expect("write lease")
            .0
        {
            Reply::Leased { fence, .. } => fence,
            r => panic!("unexpected {r:?}"),
        };
        // Block 1's first copy only, on whichever server holds it.
        let write = Request::Write {
            id,
            index: 1,
            replica: 0,
            offset: 0,
            sync: true,
            fence,
        };
        let mut wrote = 0;
        for rpc in &s {
            if rpc
                .call(&write, bytes::Bytes::from(vec![b'A'; 4096]))
                .await
                .is_ok()
            {
                wrote += 1;
            }
        }
        assert_eq!(wrote, 1, "exactly one server holds block 1's first copy");
        if release {
            owner
                .call(&Request::Release { ino: id }, bytes::Bytes::new())
                .await
                .expect("release");
        }
    });
}

/// Block 1's first 4 KiB in each of its two copies' extent files.
fn block_one_copies(c: &Cluster, id: u64) -> Vec<Vec<u8>> {
    (0..2)
        .flat_map(|i| extent_files(c, i, id))
        .map(|(p, _)| {
            let f = std::fs::File::open(&p).expect("open extent file");
            let mut b = vec![0u8; 4096];
            f.read_exact_at(&mut b, 0).expect("read extent file");
            b
        })
        .collect()
}

/// Waits until block 1's copies are equal (and all `A`s).
fn wait_copies_equal(c: &Cluster, id: u64, what: &str) {
    wait_for(Duration::from_secs(60), what, || {
        let now = block_one_copies(c, id);
        if now[0] == now[1] {
            Ok(())
        } else {
            Err("the copies still differ".to_string())
        }
    });
    assert!(block_one_copies(c, id)[0].iter().all(|&b| b == b'A'));
}

/// A writer whose lease is revoked (it stopped, or was cut off) may have
/// written one copy of a block and not the other: the owner learns which
/// blocks it changed when it fences it out, and resync makes those
/// blocks' copies equal, so no two readers see different bytes.
#[test]
fn copies_a_revoked_writer_left_different_are_made_equal() {
    let c = Cluster::start_mirrored(2);
    let m = c.mount();
    let path = m.path.join("f");
    std::fs::write(&path, vec![b'x'; 4096]).expect("write");
    let id = std::fs::metadata(&path).expect("stat").ino();
    write_first_copy_only(&c, id, false);
    let before = block_one_copies(&c, id);
    assert_eq!(before.len(), 2, "two copies of block 1");
    assert_ne!(before[0], before[1], "the copies differ before resync");
    wait_copies_equal(&c, id, "resync to make the copies equal");
    drop(m);
    let fresh = c.mount();
    assert_eq!(read_all(&fresh.path.join("f")), vec![b'A'; 4096]);
}

/// Copies that differ with nothing on record (the writer gave its lease
/// back, as if the owner that would have fenced it had died with it) are
/// found by a scrub comparing the copies' checksums, and made equal from
/// the first copy.
#[test]
fn a_scrub_finds_copies_that_differ_unseen_and_makes_them_equal() {
    let c = Cluster::start_mirrored(2);
    let id = {
        let m = c.mount();
        let path = m.path.join("f");
        std::fs::write(&path, vec![b'x'; 4096]).expect("write");
        std::fs::metadata(&path).expect("stat").ino()
    };
    write_first_copy_only(&c, id, true);
    assert_eq!(block_one_copies(&c, id).len(), 2, "two copies of block 1");
    // Nothing else notices: after two lease times they still differ.
    std::thread::sleep(Duration::from_millis(2 * 1500));
    let before = block_one_copies(&c, id);
    assert_ne!(before[0], before[1], "the copies differ before the scrub");
    let o = morris(&["scrub", c.addr(0), "--rate", "512M"]);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(
        stdout(&o).contains("1 block(s) had copies that differ"),
        "{}",
        both(&o)
    );
    wait_copies_equal(&c, id, "resync to make the scrubbed copies equal");
    let fresh = c.mount();
    assert_eq!(read_all(&fresh.path.join("f")), vec![b'A'; 4096]);
    // Equal now: a second scrub finds nothing.
    let o = morris(&["scrub", c.addr(0)]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(stdout(&o).contains("every copy the others"), "{}", both(&o));
}
