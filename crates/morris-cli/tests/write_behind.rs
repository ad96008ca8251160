//! Write-behind (`crates/morris-client/src/behind.rs`): small writes that a
//! mount gathers before sending are never missed by anyone who looks —
//! another mount (through a lease recall), another descriptor of the same
//! mount, a truncation or hole punched after them, times set after them —
//! and a mount killed with gathered writes leaves the file as a prefix of
//! what was written, never a size that covers bytes the servers lack.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::{assert_same_bytes, close_checked, open_rw, pattern, read_log, Mount, TwoMounts};

type Two = TwoMounts;

fn same(got: &[u8], want: &[u8], what: &str, logs: impl FnOnce() -> String) {
    if got != want {
        assert_same_bytes(got, want, what, &logs());
    }
}

/// Writes `data` through `f` in `piece`-byte `write()` calls.
fn write_in_pieces(f: &mut File, data: &[u8], piece: usize, what: &str) {
    for (i, chunk) in data.chunks(piece).enumerate() {
        f.write_all(chunk)
            .unwrap_or_else(|e| panic!("{what}: write {i}: {e}"));
    }
}

#[test]
fn small_writes_of_a_file_still_open_are_read_whole_on_another_mount() {
    let t = Two::long_ttl();
    let path_a = t.a.path.join("log");
    let mut f = File::create(&path_a).expect("A: create");
    let mut want = pattern(1, 0, 13 * 20_000);
    write_in_pieces(&mut f, &want, 13, "A");
    // Not closed, not synced: B's open recalls A's write lease, and A
    // sends what it gathered before giving it back.
    let got = fs::read(t.b.path.join("log")).expect("B: read");
    same(&got, &want, "B reads A's open file", || t.logs());
    assert_eq!(
        fs::metadata(t.b.path.join("log")).expect("B: stat").len(),
        want.len() as u64
    );

    // A goes on through the same descriptor; B looks again.
    let more = pattern(2, 0, 7 * 5_000);
    write_in_pieces(&mut f, &more, 7, "A again");
    want.extend_from_slice(&more);
    let got = fs::read(t.b.path.join("log")).expect("B: read again");
    same(&got, &want, "B reads A's open file again", || t.logs());
    close_checked(f).expect("A: close");
    let got = fs::read(&path_a).expect("A: read");
    same(&got, &want, "A reads its own file", || t.logs());
}

#[test]
fn large_writes_in_flight_land_in_order_and_are_read_whole_on_another_mount() {
    // 1 MiB writes are sent without waiting for their answers (8 MiB per
    // file in flight): rewrites of ranges still in flight must land after
    // them, and another mount must see everything while the file is open.
    let t = Two::long_ttl();
    let mut f = File::create(t.a.path.join("big")).expect("A: create");
    let mut want = pattern(6, 0, 24 << 20);
    write_in_pieces(&mut f, &want, 1 << 20, "A: first pass");
    // Overwrite ranges just sent, some across stripe units, at once.
    for (i, (at, len)) in [
        (20u64 << 20, 1usize << 20),
        ((22 << 20) + 4096, 1 << 20),
        (23 << 20, 333_333),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(100 + i as u64, at, len);
        f.write_all_at(&data, at).expect("A: rewrite");
        want[at as usize..at as usize + len].copy_from_slice(&data);
    }
    let got = fs::read(t.b.path.join("big")).expect("B: read");
    same(&got, &want, "B reads A's open file", || t.logs());
    // And again after more writes in flight, through the same descriptor.
    let more = pattern(7, 0, 9 << 20);
    write_in_pieces(&mut f, &more, 1 << 20, "A: second pass");
    want.extend_from_slice(&more);
    close_checked(f).expect("A: close");
    let got = fs::read(t.b.path.join("big")).expect("B: read again");
    same(&got, &want, "B reads A's closed file", || t.logs());
}

#[test]
fn small_appends_kept_open_on_two_mounts_interleave_in_order() {
    let t = Two::long_ttl();
    File::create(t.a.path.join("log")).expect("create");
    let open = |m: &Mount| {
        OpenOptions::new()
            .append(true)
            .open(m.path.join("log"))
            .expect("open for append")
    };
    let (mut fa, mut fb) = (open(&t.a), open(&t.b));
    let mut want = Vec::new();
    for round in 0..150 {
        for (who, f) in [("A", &mut fa), ("B", &mut fb)] {
            // A few small appends per turn, so some are gathered together.
            for k in 0..3 {
                let line = format!("{who}{round}.{k}\n");
                f.write_all(line.as_bytes())
                    .unwrap_or_else(|e| panic!("{who}: append {round}.{k}: {e}"));
                want.extend_from_slice(line.as_bytes());
            }
        }
        if round % 10 == 0 {
            // Both still open: each mount reads what both appended.
            for (who, m) in [("A", &t.a), ("B", &t.b)] {
                let got = read_direct(&m.path.join("log"));
                same(
                    &got,
                    &want,
                    &format!("{who} reads the log, round {round}"),
                    || t.logs(),
                );
            }
        }
    }
    close_checked(fa).expect("A: close");
    close_checked(fb).expect("B: close");
    for m in [&t.a, &t.b] {
        let got = fs::read(m.path.join("log")).expect("read the log");
        same(&got, &want, "the log", || t.logs());
    }
}

#[test]
fn times_and_modes_set_after_small_writes_stay_set() {
    // What `tar x` and `cp -p` do: write the data in small pieces, then put
    // the times and mode back, then close.
    let t = Two::long_ttl();
    let p = t.a.path.join("restored");
    let mut f = File::create(&p).expect("create");
    let data = pattern(3, 0, 30_000);
    write_in_pieces(&mut f, &data, 1000, "write");
    let then = SystemTime::UNIX_EPOCH + Duration::from_secs(978_307_200); // 2001-01-01
    f.set_modified(then).expect("futimens");
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o640))
        .expect("fchmod");
    close_checked(f).expect("close");
    for (who, m) in [("A", &t.a), ("B", &t.b)] {
        let md = fs::metadata(m.path.join("restored")).expect("stat");
        assert_eq!(
            md.mtime(),
            978_307_200,
            "{who}: mtime put back before close\n{}",
            t.logs()
        );
        assert_eq!(md.mode() & 0o7777, 0o640, "{who}: mode");
        assert_eq!(md.len(), data.len() as u64, "{who}: size");
        let got = fs::read(m.path.join("restored")).expect("read");
        same(&got, &data, &format!("{who}: contents"), || t.logs());
    }
}

#[test]
fn owner_mode_and_times_set_after_close_are_seen_at_once_and_survive_a_kill() {
    // What `tar x` does as root after closing each file: chown, chmod,
    // utimes by path. The mount keeps them with the lease (`set_behind`):
    // another mount must see them at once, and they must be stored within
    // a second even if the mount is then killed with -9.
    let mut t = Two::long_ttl();
    let then = 978_307_200; // 2001-01-01
    let set = |name: &str, uid: u32, mode: u32| {
        let p = t.a.path.join(name);
        fs::write(&p, b"data").expect("write");
        std::os::unix::fs::chown(&p, Some(uid), Some(uid + 1)).expect("chown");
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode)).expect("chmod");
        let f = File::options().write(true).open(&p).expect("open");
        f.set_times(
            fs::FileTimes::new()
                .set_accessed(SystemTime::UNIX_EPOCH + Duration::from_secs(then + 1))
                .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(then)),
        )
        .expect("futimens");
        drop(f);
        // Changed again after the last close: only the timer stores this.
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode | 0o4))
            .expect("chmod after close");
    };
    let check =
        |m: &Mount, name: &str, uid: u32, mode: u32, who: &str, logs: &dyn Fn() -> String| {
            let md = fs::metadata(m.path.join(name)).expect("stat");
            assert_eq!(
                (
                    md.uid(),
                    md.gid(),
                    md.mode() & 0o7777,
                    md.mtime(),
                    md.atime(),
                    md.len()
                ),
                (uid, uid + 1, mode | 0o4, then as i64, then as i64 + 1, 4),
                "{who}: {name}: owner, group, mode, mtime, atime, size\n{}",
                logs()
            );
        };
    set("seen", 1234, 0o640);
    check(&t.a, "seen", 1234, 0o640, "A", &|| t.logs());
    check(&t.b, "seen", 1234, 0o640, "B", &|| t.logs());

    set("kept", 4321, 0o600);
    std::thread::sleep(Duration::from_millis(2500));
    let b_logs = read_log(&t.b.log);
    t.a.kill9();
    check(&t.b, "kept", 4321, 0o600, "B after A was killed", &|| {
        b_logs.clone()
    });
}

/// `lseek(fd, offset, whence)`.
fn seek(f: &File, offset: i64, whence: i32) -> std::io::Result<i64> {
    // SAFETY: lseek on a descriptor we own; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Reads all of `p` with `O_DIRECT`: every byte asked of the mount, none
/// from the kernel's page cache.
fn read_direct(p: &Path) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .expect("open O_DIRECT");
    let len = f.metadata().expect("fstat").len() as usize;
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = f.read_at(&mut out[at..], at as u64).expect("read O_DIRECT");
        assert!(n > 0, "O_DIRECT read ended at {at} of {len}");
        at += n;
    }
    out
}

#[test]
fn gathered_writes_come_before_a_truncation_a_punched_hole_and_a_seek() {
    let t = Two::long_ttl();
    let p = t.a.path.join("f");
    let mut f = open_rw(&p);
    let mut model = pattern(4, 0, 100_000);
    write_in_pieces(&mut f, &model, 100, "first");
    // Another descriptor of this mount reads past the kernel's cache.
    same(
        &read_direct(&p),
        &model,
        "read back on the same mount",
        || t.logs(),
    );

    write_in_pieces(&mut f, &pattern(5, 0, 10_000), 50, "second");
    model.extend_from_slice(&pattern(5, 0, 10_000));
    f.set_len(50_000).expect("ftruncate");
    model.truncate(50_000);
    // Past the end: a hole from 50,000, data at 200,000.
    f.write_all_at(b"tail", 200_000)
        .expect("write past the end");
    model.resize(200_000, 0);
    model.extend_from_slice(b"tail");
    let data_from = seek(&f, 60_000, libc::SEEK_DATA).expect("SEEK_DATA");
    assert!(
        (60_000..=200_000).contains(&data_from),
        "SEEK_DATA from 60,000 found {data_from}: the data at 200,000 was written after the hole"
    );
    // Small writes, then a hole punched over part of them.
    f.write_all_at(&[7u8; 300], 10_000).expect("overwrite");
    model[10_000..10_300].copy_from_slice(&[7u8; 300]);
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            10_100,
            100,
        )
    };
    assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
    model[10_100..10_200].fill(0);
    same(
        &read_direct(&p),
        &model,
        "after truncate, hole, punch",
        || t.logs(),
    );
    close_checked(f).expect("close");
    let got = fs::read(t.b.path.join("f")).expect("B: read");
    same(&got, &model, "B reads the result", || t.logs());
}

#[test]
fn a_mount_killed_with_gathered_writes_leaves_a_prefix_of_them() {
    // Four-byte counters appended in runs of 5,000, each run closed (its
    // size stored); the mount is killed with -9 at some point. What the
    // volume has afterwards must be counters 0, 1, 2, ... up to its size:
    // a size stored before the bytes under it would read as zeros.
    let mut t = Two::long_ttl();
    let p = t.a.path.join("counters");
    File::create(&p).expect("create");
    let writer = {
        let p = p.clone();
        std::thread::spawn(move || {
            let mut n: u32 = 0;
            for _ in 0..400 {
                let Ok(mut f) = OpenOptions::new().append(true).open(&p) else {
                    return n;
                };
                for _ in 0..5_000 {
                    if f.write_all(&n.to_le_bytes()).is_err() {
                        return n;
                    }
                    n += 1;
                }
                if close_checked(f).is_err() {
                    return n;
                }
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(2500));
    t.a.kill9();
    let written = writer.join().expect("writer thread");
    assert!(
        written > 5_000,
        "only {written} counters written before the kill\n{}",
        t.logs()
    );
    // A's leases lapse at the servers; B then reads what is stored.
    let got = fs::read(t.b.path.join("counters")).expect("B: read");
    assert_eq!(got.len() % 4, 0, "size {} is not whole counters", got.len());
    for (i, c) in got.chunks(4).enumerate() {
        let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        assert_eq!(
            v as usize,
            i,
            "counter {i} of {} reads {v} (of {written} written)\n{}",
            got.len() / 4,
            read_log(&t.b.log)
        );
    }
}
