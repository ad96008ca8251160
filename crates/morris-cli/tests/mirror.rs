//! `--replicas 2`: every data block has two copies on neighbouring servers;
//! reads go to the better copy, around a lost (`kill -9`) or stopped
//! (`SIGSTOP`) server, and stay correct through truncates. Inodes are not
//! mirrored yet, so the servers stopped here never hold the file's inode or
//! the root directory.

mod common;

use common::{copy_only_server, pattern, read_all, signal, Cluster};

const K: u32 = 4;

fn data_bytes(c: &Cluster) -> u64 {
    let o = common::morris(&["status", c.addr(0), "--json"]);
    assert!(o.status.success(), "{}", common::both(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status json");
    j["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| s["stats"]["data_bytes"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn every_block_has_two_copies_and_reads_survive_a_killed_server() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = c.mount();
    let f = m.path.join("big");
    // 24 MiB of 64 KiB units: many blocks on every server.
    let data = pattern(41, 0, 24 << 20);
    std::fs::write(&f, &data).expect("write");
    let stored = data_bytes(&c);
    assert!(
        stored >= 2 * data.len() as u64,
        "{stored} bytes stored for {} bytes of data with 2 copies",
        data.len()
    );
    let v = copy_only_server(K, &[&f]);
    drop(m);

    // Cold client; one copy-holding server gone for good.
    let m = c.mount();
    let f = m.path.join("big");
    c.kill9(v);
    assert!(read_all(&f) == data, "read with server {v} killed differs");
    // Small reads at every block boundary, too (random-read path).
    let file = std::fs::File::open(&f).expect("open");
    for i in [0u64, 1, 7, 100, 383] {
        let off = i * 65_536 - u64::from(i > 0) * 10;
        let mut buf = vec![0u8; 20];
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut buf, off).expect("pread");
        assert_eq!(&buf[..], &data[off as usize..off as usize + 20], "at {off}");
    }
}

#[test]
fn a_stopped_server_is_read_around() {
    let c = Cluster::start_mirrored(K as usize);
    let m = c.mount();
    let (f, v) = common::create_with_quiet_server(K, &m.path, "big");
    let data = pattern(42, 0, 16 << 20);
    std::fs::write(&f, &data).expect("write");
    drop(m);
    let m = c.mount();
    let f = m.path.join(f.file_name().expect("name"));
    let pid = c.pids()[v].expect("victim running");
    // The server stays connected but answers nothing: only hedged reads to
    // the other copies let the read finish.
    signal(pid, libc::SIGSTOP);
    let got = read_all(&f);
    signal(pid, libc::SIGCONT);
    assert!(got == data, "read with server {v} stopped differs");
}

#[test]
fn truncated_and_regrown_files_read_zeros_from_either_copy() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = c.mount();
    let f = m.path.join("t");
    let data = pattern(43, 0, 3 << 20);
    std::fs::write(&f, &data).expect("write");
    let v = copy_only_server(K, &[&f]);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .expect("open");
    let cut = (1 << 20) + 12_345;
    file.set_len(cut).expect("truncate");
    file.set_len(3 << 20).expect("regrow");
    drop(file);
    let mut want = data[..cut as usize].to_vec();
    want.resize(3 << 20, 0);
    drop(m);
    // Read everything once with all copies, once with server `v` gone:
    // the copies that remain must agree on the zeros.
    let m = c.mount();
    assert!(read_all(&m.path.join("t")) == want, "regrown file differs");
    drop(m);
    let m = c.mount();
    c.kill9(v);
    assert!(
        read_all(&m.path.join("t")) == want,
        "regrown file differs with server {v} killed"
    );
}

/// A server whose disk died comes back empty at its address (`--replicas
/// 2`) and `morris volume replace` makes it a member again: no read
/// returns the zeros of its empty disk (also for files written since,
/// whose extent files there have holes), a kill -9 in the middle of its
/// rebuild does not stop it, fsck finds the volume clean, and then its
/// copies stand in for a different lost server.
#[test]
fn an_empty_replacement_server_serves_no_zeros_and_is_rebuilt() {
    let mut c = Cluster::start_mirrored(K as usize);
    let m = c.mount();
    // Files in every metadata range, the lost server's own included, some
    // of them never written again.
    let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = Vec::new();
    let mut ranges = std::collections::BTreeSet::new();
    for i in 0..64u64 {
        if ranges.len() == K as usize && files.len() >= 12 {
            break;
        }
        let d = pattern(70 + i, 0, (3 << 20) + 12_345 * i as usize);
        let p = m.path.join(format!("f{i}"));
        std::fs::write(&p, &d).expect("write");
        use std::os::unix::fs::MetadataExt;
        ranges.insert(std::fs::metadata(&p).expect("stat").ino() % u64::from(K));
        files.push((p, d));
    }
    assert_eq!(ranges.len(), K as usize, "files in every range: {ranges:?}");
    drop(m);
    c.kill9(1);
    std::fs::remove_dir_all(&c.servers[1].data).expect("wipe server 1");
    c.restart(1);
    // Until it is made a member, the empty server holds no copy: the range
    // it kept a copy of goes on without it, as with its process gone
    // (before, its primary stopped serving within ten lease times).
    std::thread::sleep(std::time::Duration::from_millis(10 * 1500));
    let st = common::status(&c);
    let range0 = st["servers"][0]["stats"]["ranges"]
        .as_array()
        .expect("ranges")
        .iter()
        .find(|r| r["range"] == 0)
        .cloned()
        .expect("range 0 at server 0");
    assert!(
        range0["primary"] == true && range0["ready"] == true,
        "range 0 not served while an empty server answers at server 1's address: {range0}"
    );
    // A mount starts and reads meanwhile, as with server 1 down.
    let m = c.mount();
    let (p, d) = &files[0];
    assert!(
        read_all(&m.path.join(p.file_name().expect("name"))) == *d,
        "read before the replacement"
    );
    drop(m);
    // `--wait` follows the rebuild to the end, through the restart below.
    let mut waiting = common::morris_cmd()
        .args(["volume", "replace", c.addr(0), "1", "--wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run morris volume replace --wait");
    let mut out = std::io::BufReader::new(waiting.stdout.take().expect("stdout"));
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).expect("read its first line");
    assert!(
        first.contains("is a replacement"),
        "volume replace: {first}"
    );
    // Killed before its rebuild could finish: it goes on after a restart.
    c.kill9(1);
    c.restart(1);
    let m = c.mount();
    // Written now, these blocks land on the replacement too: its extent
    // files then have holes where the older blocks were. (Not the files of
    // the lost server's own range: those the replacement must find itself,
    // in a range nobody serves yet.)
    for (i, (p, d)) in files.iter_mut().enumerate() {
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(m.path.join(p.file_name().expect("name")))
            .expect("stat")
            .ino()
            % u64::from(K)
            == 1
        {
            continue;
        }
        use std::io::Write;
        let more = pattern(90 + i as u64, d.len() as u64, 300_000);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.path.join(p.file_name().expect("name")))
            .expect("open");
        f.write_all(&more).expect("append");
        f.sync_all().expect("fsync");
        d.extend_from_slice(&more);
    }
    read_back(&m.path, &files, "right after the replacement");
    drop(m);
    common::wait_healthy(&c);
    let status = common::wait_timeout(&mut waiting, std::time::Duration::from_secs(60))
        .expect("volume replace --wait ends once the volume is healthy");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read its output");
    let mut err = String::new();
    if let Some(mut e) = waiting.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).expect("read its errors");
    }
    assert!(status.success(), "volume replace --wait: {rest}\n{err}");
    assert!(
        rest.contains("server 1 is rebuilt: the volume is healthy"),
        "{rest}\n{err}"
    );
    // Not a terminal: plain progress lines.
    assert!(err.contains("rebuild of server 1: "), "{rest}\n{err}");
    // The replacement holds its share again.
    let st = common::status(&c);
    let per: Vec<u64> = st["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| s["stats"]["data_bytes"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        per[1] * 5 >= per[0] * 4,
        "server 1 holds {} bytes, server 0 {}: not rebuilt",
        per[1],
        per[0]
    );
    common::fsck_clean(&c);
    c.kill9(2);
    let m = c.mount();
    read_back(&m.path, &files, "with server 2 lost after the rebuild");
}

/// Reads every one of `files` (paths of another mount, and their bytes)
/// through the mount at `mnt`.
fn read_back(mnt: &std::path::Path, files: &[(std::path::PathBuf, Vec<u8>)], when: &str) {
    for (p, d) in files {
        let p = mnt.join(p.file_name().expect("name"));
        assert!(read_all(&p) == *d, "{} differs {when}", p.display());
    }
}
