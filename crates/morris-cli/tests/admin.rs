//! `morris format`, `status`, `fsck` and `umount` against real server processes.

mod common;

use common::{both, morris, stderr, stdout, Cluster, ClusterOpts};

fn unformatted(n: usize) -> Cluster {
    Cluster::start(
        n,
        ClusterOpts {
            format: false,
            ..ClusterOpts::default()
        },
    )
}

fn status_json(addr: &str) -> serde_json::Value {
    let o = morris(&["status", addr, "--json", "--timeout", "2"]);
    assert!(o.status.success(), "status failed: {}", both(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", both(&o)))
}

#[test]
fn format_refuses_a_server_of_another_volume_and_writes_nothing() {
    let other = Cluster::start(1, ClusterOpts::default());
    let fresh = unformatted(2);
    let list = format!("{},{},{}", fresh.addr(0), fresh.addr(1), other.addr(0));
    let o = morris(&["format", "--servers", &list]);
    assert!(!o.status.success(), "format should refuse: {}", both(&o));
    let err = stderr(&o);
    assert!(
        err.contains(other.addr(0)) && err.contains(other.uuid()),
        "the error should name the server and its volume: {}",
        both(&o)
    );
    assert!(err.contains("nothing was written"), "{}", both(&o));
    // The unformatted servers were left alone.
    for i in 0..2 {
        let s = morris(&["status", fresh.addr(i)]);
        assert!(!s.status.success(), "{}", both(&s));
        assert!(stderr(&s).contains("not formatted"), "{}", both(&s));
    }
    // And the other volume still is what it was.
    let j = status_json(other.addr(0));
    assert_eq!(j["volume"]["uuid"], other.uuid());
}

#[test]
fn formatting_twice_is_refused_and_keeps_the_first_volume() {
    let mut c = unformatted(3);
    c.format();
    let first = c.uuid().to_string();
    let list = c.addrs().join(",");
    let o = morris(&["format", "--servers", &list]);
    assert!(
        !o.status.success(),
        "second format should fail: {}",
        both(&o)
    );
    assert!(stderr(&o).contains(&first), "{}", both(&o));
    let j = status_json(c.addr(2));
    assert_eq!(j["volume"]["uuid"], first.as_str());
    assert_eq!(j["volume"]["stripe_unit"], 65536);
    let servers = j["servers"].as_array().expect("servers array");
    assert_eq!(servers.len(), 3);
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s["state"], "up", "server {i}: {s}");
        assert_eq!(s["stats"]["volume"], first.as_str());
    }
}

#[test]
fn format_rejects_bad_arguments_before_contacting_anyone() {
    for args in [
        &["format", "--servers", "127.0.0.1:1", "--stripe-unit", "3K"][..],
        &[
            "format",
            "--servers",
            "127.0.0.1:1",
            "--stripe-unit",
            "128M",
        ][..],
        &["format", "--servers", "127.0.0.1:1,127.0.0.1:1"][..],
        &["format", "--servers", "127.0.0.1:1", "--replicas", "2"][..],
        &["format", "--servers", "nohost"][..],
    ] {
        let o = morris(args);
        assert!(!o.status.success(), "{args:?} should fail: {}", both(&o));
        assert!(!stderr(&o).is_empty());
    }
    // A server that is not there: a clear error, nothing panics.
    let port = common::free_port();
    let o = morris(&["format", "--servers", &format!("127.0.0.1:{port}")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot reach server"), "{}", both(&o));
}

#[test]
fn status_shows_every_server_and_a_killed_one_as_down() {
    let mut c = Cluster::start(3, ClusterOpts::default());
    let o = morris(&["status", c.addr(1), "--ops"]);
    assert!(o.status.success(), "{}", both(&o));
    let text = stdout(&o);
    assert!(text.contains("3 of 3 servers up"), "{text}");
    assert!(text.contains("Format"), "per-op counts missing: {text}");
    for a in c.addrs() {
        let line = text
            .lines()
            .find(|l| l.contains(&a))
            .unwrap_or_else(|| panic!("no row for {a}: {text}"));
        assert!(line.contains(" up "), "{line}");
    }

    c.kill9(2);
    let o = morris(&["status", c.addr(0), "--timeout", "2"]);
    assert!(
        o.status.success(),
        "a down server must not fail status: {}",
        both(&o)
    );
    let text = stdout(&o);
    assert!(text.contains("2 of 3 servers up"), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(c.addr(2)) && !l.starts_with("server"))
        .unwrap_or_else(|| panic!("no row for the killed server: {text}"));
    assert!(row.contains("down"), "{row}");
    let j = status_json(c.addr(0));
    assert_eq!(j["servers"][2]["state"], "down");
    assert_eq!(j["servers"][0]["state"], "up");

    c.restart(2);
    let j = status_json(c.addr(0));
    assert_eq!(j["servers"][2]["state"], "up", "{j}");
}

#[test]
fn status_of_an_unreachable_address_fails_clearly() {
    let port = common::free_port();
    let o = morris(&["status", &format!("127.0.0.1:{port}")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot connect"), "{}", both(&o));
}

#[test]
fn fsck_of_a_fresh_volume_is_clean() {
    let c = Cluster::start(3, ClusterOpts::default());
    let o = morris(&["fsck", c.addr(0)]);
    assert!(o.status.success(), "fsck failed: {}", both(&o));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("fsck: volume {}", c.uuid())),
        "{text}"
    );
    assert!(
        text.contains("1 inodes"),
        "only the root should exist: {text}"
    );
    assert!(text.contains(" 0 errors"), "{text}");
    assert!(text.contains("0 unreachable inodes"), "{text}");
    // --repair on a clean volume changes nothing and succeeds.
    let o = morris(&["fsck", "--repair", c.addr(1)]);
    assert!(o.status.success(), "{}", both(&o));
}

#[test]
fn fsck_needs_every_server() {
    let mut c = Cluster::start(2, ClusterOpts::default());
    c.kill9(1);
    let o = morris(&["fsck", c.addr(0)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("fsck needs every server") && stderr(&o).contains(c.addr(1)),
        "{}",
        both(&o)
    );
}

#[test]
fn umount_of_something_not_mounted_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = morris(&["umount", &dir.path().display().to_string()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is not mounted"), "{}", both(&o));
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "server", "format", "mount", "umount", "up", "status", "fsck",
    ] {
        let o = morris(&[sub, "--help"]);
        assert!(o.status.success(), "{sub} --help: {}", both(&o));
        assert!(stdout(&o).contains("Usage: morris"), "{}", both(&o));
    }
}

#[test]
fn status_shows_each_servers_io_load() {
    let c = Cluster::start(2, ClusterOpts::default());
    let j = status_json(c.addr(0));
    for s in j["servers"].as_array().expect("servers") {
        assert_eq!(s["stats"]["read_service_us"], 0, "{s}");
        assert_eq!(s["stats"]["io_inflight"], 0, "{s}");
    }
    let m = c.mount();
    // 4 stripe units: blocks on both servers.
    let data = common::pattern(3, 0, 4 << 20);
    std::fs::write(m.path.join("f"), &data).expect("write");
    drop(m);
    let m = c.mount();
    assert!(std::fs::read(m.path.join("f")).expect("read") == data);
    let j = status_json(c.addr(0));
    for s in j["servers"].as_array().expect("servers") {
        let st = &s["stats"];
        assert!(
            st["read_service_us"].as_u64().is_some_and(|v| v > 0)
                && st["write_service_us"].as_u64().is_some_and(|v| v > 0),
            "no service times after reads and writes: {s}"
        );
        assert_eq!(st["io_inflight"], 0, "{s}");
    }
    let o = morris(&["status", c.addr(0)]);
    assert!(o.status.success(), "{}", both(&o));
    let text = common::stdout(&o);
    assert!(
        text.contains("IO-QUEUE") && text.contains("READ-SVC") && text.contains("WRITE-SVC"),
        "{text}"
    );
}

/// (kind, id) → (inodes, bytes), as `morris quota report --json` says.
type Usage = std::collections::BTreeMap<(String, i64), (i64, i64)>;

/// `morris quota report --json`, or why it failed (a range still in its
/// grace after a restart, say).
fn usage(addr: &str) -> Result<Usage, String> {
    let o = morris(&["quota", "report", addr, "--json"]);
    if !o.status.success() {
        return Err(format!("quota report failed: {}", both(&o)));
    }
    Ok(stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON ({e}): {l}"));
            let n = |k: &str| v[k].as_i64().unwrap_or_else(|| panic!("no {k} in {l}"));
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            ((kind, n("id")), (n("inodes"), n("bytes")))
        })
        .collect())
}

#[test]
fn quota_report_counts_each_owner_across_servers_copies_and_restarts() {
    use std::os::unix::fs::chown;
    let mut c = Cluster::start_mirrored(3);
    let m = c.mount();
    std::fs::create_dir(m.path.join("u")).expect("mkdir");
    chown(m.path.join("u"), Some(1000), Some(100)).expect("chown u");
    for i in 0..6 {
        let p = m.path.join(format!("u/f{i}"));
        std::fs::write(&p, vec![7u8; 10_000 * (i + 1)]).expect("write");
        chown(&p, Some(1000), Some(100)).expect("chown");
    }
    std::fs::write(m.path.join("big"), vec![1u8; 1 << 20]).expect("write big");
    // Each file counts its pages of 4 KiB: 10,000 bytes are 3 of them.
    let pages: i64 = (1..=6u64)
        .map(|i| ((i * 10_000).div_ceil(4096) * 4096) as i64)
        .sum();
    let want_user = (7, pages);
    // (An owner change of a file open a moment ago reaches its server a
    // moment later: the mount keeps it under its write lease first.)
    common::wait_for(
        std::time::Duration::from_secs(30),
        "counts of new files",
        || {
            let got = usage(c.addr(0))?;
            let want = [
                (("user".to_string(), 1000), want_user),
                (("group".to_string(), 100), want_user),
                (("user".to_string(), 0), (2, 1 << 20)),
            ];
            if want.iter().all(|(k, v)| got.get(k) == Some(v)) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    );
    // A chown moves the file's count; a removal takes it away.
    chown(m.path.join("big"), Some(1000), None).expect("chown big");
    std::fs::remove_file(m.path.join("u/f0")).expect("unlink f0");
    let want = (7, pages - 12_288 + (1 << 20));
    // Waits until `addr` reports `want` for user 1000.
    let counts = |addr: &str, what: &str| {
        common::wait_for(std::time::Duration::from_secs(60), what, || {
            let got = usage(addr)?;
            if got.get(&("user".into(), 1000)) == Some(&want) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
    };
    counts(c.addr(1), "counts after chown and unlink");
    // The same with a server down (its range answered by its copy), and
    // after every server restarted.
    c.kill9(2);
    counts(c.addr(0), "counts with server 2 down");
    for i in 0..3 {
        if i != 2 {
            c.kill9(i);
        }
        c.restart(i);
    }
    counts(c.addr(0), "counts after restarts");
    let o = morris(&["quota", "report", c.addr(0), "--user", "1000"]);
    assert!(o.status.success(), "{}", both(&o));
    assert_eq!(
        stdout(&o).lines().count(),
        2,
        "a header and one line: {}",
        both(&o)
    );
}

/// Runs `script` with `sh -c` as uid 1000, gid 100 (no other groups).
fn as_user(script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "1000",
            "--regid",
            "100",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("run setpriv")
}

#[test]
fn quota_limits_refuse_new_inodes_and_growth_on_every_mount() {
    use std::os::unix::fs::chown;
    if !common::is_root() {
        panic!("this test runs as root (it acts as uid 1000 with setpriv)");
    }
    let c = Cluster::start(3, ClusterOpts::default());
    let a = c.mount();
    let b = c.mount();
    std::fs::create_dir(a.path.join("u")).expect("mkdir");
    chown(a.path.join("u"), Some(1000), Some(100)).expect("chown");
    let set = |args: &[&str]| {
        let mut all = vec!["quota", "set", c.addr(0)];
        all.extend_from_slice(args);
        let o = morris(&all);
        assert!(o.status.success(), "quota set: {}", both(&o));
    };
    // A client key may not set limits.
    let key = common::client_key();
    let o = morris(&[
        "quota",
        "set",
        c.addr(0),
        "--user",
        "1000",
        "--inodes",
        "1",
        "--key",
        &key,
    ]);
    assert!(
        !o.status.success(),
        "a client key set a quota: {}",
        both(&o)
    );
    // At most 4 inodes (the directory is one): one create every 0.5 s on
    // the other mount runs into EDQUOT, a few past the limit at most (the
    // verdict is at most 2 s old).
    set(&["--user", "1000", "--inodes", "4"]);
    let dir = b.path.join("u");
    let o = as_user(&format!(
        "for i in $(seq 1 20); do touch {d}/f$i || exit 3; sleep 0.5; done",
        d = dir.display()
    ));
    assert_eq!(o.status.code(), Some(3), "never refused: {}", both(&o));
    assert!(stderr(&o).contains("quota"), "not EDQUOT: {}", both(&o));
    let made = std::fs::read_dir(&dir).expect("list").count();
    assert!(
        (3..=8).contains(&made),
        "{made} files made under a limit of 4 inodes"
    );
    // Giving a file to a user at its inode limit is charging it one more
    // (ext4's chown answers EDQUOT too); to another user it is not.
    let given = a.path.join("given");
    std::fs::write(&given, b"x").expect("create as root");
    // (This mount's verdict is from before the limit: it is refreshed
    // within 10 s.)
    common::wait_for(
        std::time::Duration::from_secs(30),
        "EDQUOT on chown",
        || match chown(&given, Some(1000), None) {
            Err(e) if e.raw_os_error() == Some(libc::EDQUOT) => Ok(()),
            Err(e) => panic!("chown to a user at its limit: {e}"),
            Ok(()) => {
                chown(&given, Some(0), None).expect("chown back");
                Err("allowed".to_string())
            }
        },
    );
    // Someone not allowed the change is told that, not the quota.
    let o = as_user(&format!("chown 1000 {}", given.display()));
    assert!(
        !o.status.success() && stderr(&o).contains("not permitted"),
        "chown by a non-owner: {}",
        both(&o)
    );
    chown(&given, Some(1001), None).expect("chown to a user with no limit");
    std::fs::remove_file(&given).expect("remove");
    // Bytes: the group over 1 MiB cannot grow a file, on either mount.
    set(&["--user", "1000"]);
    set(&["--group", "100", "--bytes", "1M"]);
    let big = dir.join("f1");
    let o = as_user(&format!("head -c 2000000 /dev/zero > {}", big.display()));
    assert!(
        o.status.success(),
        "the first write is under the limit: {}",
        both(&o)
    );
    common::wait_for(
        std::time::Duration::from_secs(30),
        "EDQUOT on growth",
        || {
            // (`head` says why a write failed; the shell's `echo` says EIO.)
            let o = as_user(&format!(
                "head -c 5 /dev/zero >> {}",
                a.path.join("u/f1").display()
            ));
            if !o.status.success() && stderr(&o).contains("quota") {
                Ok(())
            } else {
                Err(both(&o))
            }
        },
    );
    // Rewriting inside the file is no growth; removing the limit lets it grow.
    let o = as_user(&format!(
        "printf x | dd of={} bs=1 seek=10 conv=notrunc status=none",
        big.display()
    ));
    assert!(o.status.success(), "a write inside the file: {}", both(&o));
    set(&["--group", "100"]);
    common::wait_for(
        std::time::Duration::from_secs(30),
        "growth allowed again",
        || {
            let o = as_user(&format!("head -c 5 /dev/zero >> {}", big.display()));
            if o.status.success() {
                Ok(())
            } else {
                Err(both(&o))
            }
        },
    );
    let o = morris(&["quota", "report", c.addr(0), "--json"]);
    assert!(o.status.success(), "{}", both(&o));
}

/// The servers hold a client that does not check quotas (raw protocol
/// requests, no client library) to the inode limits too.
#[test]
fn servers_refuse_new_inodes_over_a_quota_to_a_client_that_does_not_check() {
    use bytes::Bytes;
    use morris_proto::net::{RpcClient, RpcError};
    use morris_proto::{ErrorCode, Reply, Request, PROTOCOL_VERSION, ROOT_ID};
    use std::time::{Duration, Instant};

    let c = Cluster::start(2, ClusterOpts::default());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let key = morris_proto::auth::Keys::load(&common::keys().client)
        .expect("client key")
        .credential();
    let rpc = rt.block_on(async {
        let rpc = RpcClient::connect(c.addr(0), &key, None)
            .await
            .expect("connect");
        let hello = Request::Hello {
            volume: Some(c.uuid().parse().expect("uuid")),
            client_id: 0x9107a,
            client_name: "no-quota-checks".into(),
            version: PROTOCOL_VERSION,
        };
        rpc.call(&hello, Bytes::new()).await.expect("hello");
        rpc
    });
    // A new inode of `uid` (unnamed: the servers reap it later), as
    // operation `op` of this client (0: none); its id.
    let create = |uid: u32, op: u64| {
        let req = Request::CreateInode {
            parent: ROOT_ID,
            attr: common::new_file_attr(uid, uid),
            target: None,
            home: None,
            op,
            xattrs: vec![],
        };
        rt.block_on(async {
            loop {
                match rpc.call(&req, Bytes::new()).await {
                    Err(RpcError::Remote(e)) if e.code == ErrorCode::Grace => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok((Reply::Leased { inode, .. }, _)) => return Ok(inode.id),
                    Ok((other, _)) => panic!("unexpected {other:?}"),
                    Err(RpcError::Remote(e)) => return Err(e),
                    Err(e) => panic!("create: {e}"),
                }
            }
        })
    };
    let o = morris(&["quota", "set", c.addr(0), "--user", "1000", "--inodes", "3"]);
    assert!(o.status.success(), "quota set: {}", both(&o));
    let start = Instant::now();
    let mut made = Vec::new();
    let refused = loop {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} inodes made under a limit of 3, none refused",
            made.len()
        );
        match create(1000, made.len() as u64 + 1) {
            Ok(id) => made.push(id),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(refused.code, ErrorCode::QuotaExceeded, "{refused}");
    // One create every 0.3 s, a verdict at most 2 s old.
    assert!(
        (3..=12).contains(&made.len()),
        "{} made under a limit of 3",
        made.len()
    );
    // A create resent after the verdict turned (its answer lost) gets the
    // inode its first try made, not a refusal.
    let last = made.len() as u64;
    assert_eq!(
        create(1000, last).expect("a repeat of a create that ran"),
        made[made.len() - 1]
    );
    create(1001, 0).expect("another user is not over");
    let o = morris(&["quota", "set", c.addr(0), "--user", "1000"]);
    assert!(o.status.success(), "quota set: {}", both(&o));
    common::wait_for(Duration::from_secs(30), "creates allowed again", || {
        create(1000, 0).map(drop).map_err(|e| e.to_string())
    });
}
