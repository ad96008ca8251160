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
