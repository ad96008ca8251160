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
