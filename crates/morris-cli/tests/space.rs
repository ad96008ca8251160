//! `fallocate` through a real mount: reserving space, punching holes and
//! zeroing ranges across stripe units, on plain and mirrored volumes.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::time::Duration;

use common::{pattern, Cluster, ClusterOpts};

const UNIT: u64 = 64 * 1024;

fn fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `p` made empty (or new) and opened for reading and writing.
fn fresh_file(p: &std::path::Path) -> fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .unwrap()
}

fn check(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {at} (unit {}, +{})",
            at as u64 / UNIT,
            at as u64 % UNIT
        );
    }
}

fn punch_and_zero(c: &Cluster) {
    let m = c.mount();
    let p = m.path.join("f");
    let mut want = pattern(3, 0, (10 * UNIT) as usize);
    fs::write(&p, &want).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    // A hole across three units, starting and ending inside units.
    let (a, n) = (UNIT + 1000, 2 * UNIT + 5000);
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        a,
        n,
    )
    .unwrap();
    want[a as usize..(a + n) as usize].fill(0);
    check(&fs::read(&p).unwrap(), &want, "after the punch");
    // Zeroing a range that ends past the end grows the file.
    let (z, zn) = (9 * UNIT + 7, 2 * UNIT);
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, z, zn).unwrap();
    want.truncate(z as usize);
    want.resize((z + zn) as usize, 0);
    check(&fs::read(&p).unwrap(), &want, "after the zeroed range");
    // ...unless told to keep the size.
    fallocate(
        &f,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        20 * UNIT,
    )
    .unwrap();
    want.fill(0);
    check(&fs::read(&p).unwrap(), &want, "after zeroing everything");
    drop(f);
}

#[test]
fn holes_and_zeroed_ranges_read_as_zeros_and_the_rest_is_kept() {
    let c = Cluster::start(4, ClusterOpts::default());
    punch_and_zero(&c);
}

#[test]
fn allocation_grows_the_file_or_keeps_its_size_and_too_much_is_enospc() {
    let c = Cluster::start(4, ClusterOpts::default());
    let m = c.mount();
    let p = m.path.join("big");
    let f = fresh_file(&p);
    fallocate(&f, 0, 0, 5 * UNIT + 3).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 5 * UNIT + 3);
    check(
        &fs::read(&p).unwrap(),
        &vec![0u8; (5 * UNIT + 3) as usize],
        "allocated",
    );
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 50 * UNIT).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 5 * UNIT + 3, "KEEP_SIZE");
    // The servers reserved it: their data directories grew.
    let used: u64 = (0..4)
        .map(|i| {
            let out = std::process::Command::new("du")
                .args(["-s", "-B1"])
                .arg(c.servers[i].data.join("blocks"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert!(
        used >= 50 * UNIT,
        "{used} bytes used on the servers after reserving {}",
        50 * UNIT
    );
    // More than the disks hold: ENOSPC, and the size is unchanged.
    let e = fallocate(&f, 0, 0, 10 << 40).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(fs::metadata(&p).unwrap().len(), 5 * UNIT + 3);
    // Modes this layout cannot do are refused.
    let e = fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, UNIT).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    // Writes into the reserved range land as usual.
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"hello", 3 * UNIT - 2).unwrap();
    let got = fs::read(&p).unwrap();
    assert_eq!(
        &got[(3 * UNIT - 2) as usize..(3 * UNIT + 3) as usize],
        b"hello"
    );
}

#[test]
fn a_punched_hole_is_in_both_copies_of_a_mirrored_volume() {
    let mut c = Cluster::start_mirrored(3);
    punch_and_zero(&c);
    // A server gone (one that does not serve the root's metadata, so a
    // mount comes up at once): the other copies read zeros too.
    for gone in [0, 2] {
        c.kill9(gone);
        let m = common::Mount::start(c.addr(1), &[]);
        // The file's metadata may be taken over meanwhile: reads fail
        // (EIO) until the copy serves it.
        let got = common::wait_for(Duration::from_secs(60), "reading the file", || {
            fs::read(m.path.join("f")).map_err(|e| e.to_string())
        });
        assert!(got.iter().all(|b| *b == 0), "with server {gone} down");
        drop(m);
        c.restart(gone);
        // Caught up (metadata and data) before the next one goes.
        common::wait_healthy(&c);
    }
}

/// A volume of `servers` servers keeping `replicas` copies.
fn with_copies(servers: usize, replicas: u8) -> Cluster {
    Cluster::start(
        servers,
        ClusterOpts {
            replicas,
            ..ClusterOpts::default()
        },
    )
}

/// `statvfs` of `p`: (bytes in all, bytes free, bytes available).
fn space_of(p: &std::path::Path) -> (u64, u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut v = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), v.as_mut_ptr()) }, 0);
    let v = unsafe { v.assume_init() };
    (
        v.f_blocks * v.f_frsize,
        v.f_bfree * v.f_frsize,
        v.f_bavail * v.f_frsize,
    )
}

#[test]
fn df_counts_a_shared_disk_once_and_divides_by_the_copies() {
    for replicas in [1u8, 2] {
        let c = with_copies(4, replicas);
        let m = c.mount();
        // Every server here keeps its data on the same disk.
        let disk = space_of(&c.servers[0].data);
        let vol = space_of(&m.path);
        let r = u64::from(replicas);
        let near = |a: u64, b: u64| a.abs_diff(b) <= b / 100 + 4 * UNIT;
        assert!(
            near(vol.0, disk.0 / r),
            "size {} for a disk of {} and {r} copies",
            vol.0,
            disk.0
        );
        assert!(
            near(vol.1, disk.1 / r),
            "free {} for {} free and {r} copies",
            vol.1,
            disk.1
        );
        assert!(
            near(vol.2, disk.2 / r),
            "available {} for {} and {r} copies",
            vol.2,
            disk.2
        );
    }
}

/// `lseek(fd, from, whence)`: the offset, or the errno.
fn seek(f: &fs::File, from: u64, whence: i32) -> Result<u64, i32> {
    let r = unsafe { libc::lseek(f.as_raw_fd(), from as libc::off_t, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as u64)
    }
}

#[test]
fn seek_data_and_seek_hole_answer_what_ext4_answers() {
    use std::os::unix::fs::FileExt;
    let local_dir = tempfile::Builder::new()
        .prefix("morris-seek-")
        .tempdir_in("/var/tmp")
        .unwrap();
    for replicas in [1u8, 2] {
        let c = with_copies(3, replicas);
        let m = c.mount();
        let ours = fresh_file(&m.path.join("sparse"));
        let theirs = fresh_file(&local_dir.path().join(format!("sparse{replicas}")));
        // Whole 4 KiB pieces (ext4's block), so both keep the same holes:
        // data in unit 0, across units 3-4, at the end of unit 8, a punched
        // hole inside unit 12's data, and a hole to the end.
        let b = 4096u64;
        let writes = [
            (0, b),
            (3 * UNIT + b, UNIT),
            (9 * UNIT - b, b),
            (12 * UNIT, UNIT),
        ];
        for f in [&ours, &theirs] {
            f.set_len(20 * UNIT).unwrap();
            for (at, n) in writes {
                f.write_all_at(&vec![7u8; n as usize], at).unwrap();
            }
            fallocate(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                12 * UNIT + 2 * b,
                3 * b,
            )
            .unwrap();
        }
        for from in (0..=20 * UNIT + b).step_by(b as usize / 2) {
            for (whence, name) in [
                (libc::SEEK_DATA, "SEEK_DATA"),
                (libc::SEEK_HOLE, "SEEK_HOLE"),
            ] {
                assert_eq!(
                    seek(&ours, from, whence),
                    seek(&theirs, from, whence),
                    "{name} from {from} (unit {}, +{}), {replicas} copies",
                    from / UNIT,
                    from % UNIT
                );
            }
        }
        // The data found reads back as written.
        let at = seek(&ours, UNIT, libc::SEEK_DATA).unwrap();
        let mut buf = [0u8; 4];
        ours.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(buf, [7; 4]);
    }
}

/// `st_blocks` of `p` (in 512-byte blocks), asked afresh.
fn blocks_of(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).unwrap().blocks()
}

/// `st_blocks` counts what the servers' disks hold, as ext4 does: a file
/// grown by `truncate` takes nothing, a write into its hole takes what it
/// wrote, a reservation its length, a punched hole gives back what was
/// written or reserved there; a file written from start to end is its size. Another
/// mount sees the same (the measure is stored with the inode).
#[test]
fn st_blocks_counts_what_the_disks_hold_not_the_size() {
    use std::os::unix::fs::FileExt;
    const MIB: u64 = 1 << 20;
    // Each server's disk may round its extent files up a little (one
    // 4 KiB block per unit boundary at most here).
    let near = |got: u64, want_bytes: u64, what: &str| {
        let want = want_bytes / 512;
        assert!(
            got >= want && got <= want + 3 * 64,
            "{what}: {got} blocks, want about {want}"
        );
    };
    for replicas in [1u8, 2] {
        let c = with_copies(3, replicas);
        let m = c.mount();
        let other = c.mount();
        let p = m.path.join("sparse");
        let seen_there = other.path.join("sparse");
        let f = fresh_file(&p);
        f.set_len(1 << 30).unwrap();
        assert_eq!(blocks_of(&p), 0, "after truncate -s 1G, {replicas} copies");
        f.write_all_at(&vec![5u8; MIB as usize], 100 * MIB).unwrap();
        f.sync_all().unwrap();
        near(blocks_of(&p), MIB, "a MiB written into the hole");
        fallocate(&f, 0, 512 * MIB, 100 * MIB).unwrap();
        near(blocks_of(&p), 101 * MIB, "100 MiB reserved");
        let punch = |at: u64, n: u64| {
            fallocate(
                &f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                n,
            )
            .unwrap()
        };
        punch(512 * MIB, 50 * MIB);
        near(blocks_of(&p), 51 * MIB, "half the reservation punched out");
        punch(100 * MIB, MIB);
        near(blocks_of(&p), 50 * MIB, "the MiB written punched out");
        drop(f);
        near(blocks_of(&seen_there), 50 * MIB, "from another mount");
        assert_eq!(fs::metadata(&seen_there).unwrap().len(), 1 << 30);
        // A write past the end leaves a hole, measured when it is stored.
        let q = m.path.join("appended");
        let g = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&q)
            .unwrap();
        g.write_all_at(&[1u8; 4096], 0).unwrap();
        g.write_all_at(&[2u8; 4096], 300 * MIB).unwrap();
        drop(g);
        near(
            blocks_of(&other.path.join("appended")),
            8192,
            "two 4 KiB writes 300 MiB apart",
        );
        // Emptied and written whole: its size again, without measuring.
        fs::write(&q, vec![3u8; (10 * MIB) as usize]).unwrap();
        assert_eq!(blocks_of(&q), 10 * MIB / 512, "rewritten whole");
        assert_eq!(blocks_of(&other.path.join("appended")), 10 * MIB / 512);
        let small = m.path.join("small");
        fs::write(&small, b"x").unwrap();
        assert_eq!(blocks_of(&small), 8, "one byte takes a 4 KiB block");
    }
}
