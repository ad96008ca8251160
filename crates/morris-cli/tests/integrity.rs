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
