//! Prometheus metrics (`--metrics`), `morris stats` and `morris info`
//! (issue 20), on real processes: servers, a FUSE mount and an NFS gateway
//! each serve their endpoint; what a test does through them shows up in the
//! numbers; `info` finds where a file's inode, blocks and leases are.

mod common;
mod nfs_harness;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::{both, morris, pattern, read_log, wait_for, Cluster, ClusterOpts, Mount};
use nfs_harness::{tool, write_local, Gateway};

/// A cluster of `n` servers keeping `replicas` copies, each serving metrics
/// on a port of its own.
fn metered(n: usize, replicas: u8) -> Cluster {
    Cluster::start(
        n,
        ClusterOpts {
            replicas,
            server_args: vec!["--metrics".into(), "127.0.0.1:0".into()],
            ..ClusterOpts::default()
        },
    )
}

/// The bytes of `path`, read from the servers: the page cache's copy is
/// dropped first.
fn read_past_cache(path: &Path) -> Vec<u8> {
    common::drop_kernel_pages(path);
    let mut f = std::fs::File::open(path).expect("open");
    let mut back = Vec::new();
    f.read_to_end(&mut back).expect("read");
    back
}

/// The endpoint address a process logged ("metrics at http://ADDR/metrics").
fn endpoint_in(log: &Path) -> String {
    wait_for(
        Duration::from_secs(20),
        "the metrics endpoint in the log",
        || {
            let text = read_log(log);
            text.split("metrics at http://")
                .nth(1)
                .and_then(|rest| rest.split("/metrics").next())
                .map(str::to_string)
                .ok_or_else(|| text.chars().rev().take(2000).collect::<String>())
        },
    )
}

/// The text of `http://ADDR/metrics` (HTTP/1.0 by hand: the test checks
/// the endpoint, not a client library).
fn scrape(addr: &str) -> String {
    let (head, body) = get(addr, "/metrics");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    body
}

/// `GET path` of `addr`: the head and the body of a 200 reply.
fn get(addr: &str, path: &str) -> (String, String) {
    try_get(addr, path).unwrap_or_else(|e| panic!("{e}"))
}

/// [`get`], or why not (not listening, or a reply other than 200: a
/// Prometheus that is still starting answers 503).
fn try_get(addr: &str, path: &str) -> Result<(String, String), String> {
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP reply: {out}"))?;
    if !(head.starts_with("HTTP/1.") && head.contains(" 200")) {
        return Err(head.to_string());
    }
    Ok((head.to_string(), body.to_string()))
}

/// Fails unless every `morris_` metric in `text` has a `# HELP` line.
fn all_described(text: &str) {
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE morris_") {
            let name = rest.split(' ').next().unwrap_or("");
            assert!(
                text.contains(&format!("# HELP morris_{name} ")),
                "morris_{name} has no HELP line:\n{text}"
            );
        }
    }
}

/// Sum of every sample of `name` whose labels include all of `want`.
fn total(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (key, value) = match line.rsplit_once(' ') {
            Some(kv) => kv,
            None => continue,
        };
        let (metric, labels) = match key.split_once('{') {
            Some((m, l)) => (m, l.trim_end_matches('}')),
            None => (key, ""),
        };
        if metric != name {
            continue;
        }
        let labels: HashMap<&str, &str> = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if want.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            sum += value.parse::<f64>().expect("a number");
        }
    }
    sum
}

#[test]
fn servers_and_a_mount_count_what_a_file_costs() {
    common::require_fuse();
    let c = metered(3, 1);
    let servers: Vec<String> = c.servers.iter().map(|s| endpoint_in(&s.log)).collect();
    let m = Mount::start(c.addr(0), &["--metrics", "127.0.0.1:0"]);
    let mount = endpoint_in(&m.log);

    let data = pattern(3, 0, (1 << 20) + 4321);
    std::fs::write(m.path.join("f"), &data).expect("write");
    // Read back past the page cache, so that the bytes come from servers.
    assert!(read_past_cache(&m.path.join("f")) == data);

    let mtext = scrape(&mount);
    assert_eq!(
        total(&mtext, "morris_build_info", &[("role", "mount")]),
        1.0,
        "{mtext}"
    );
    // Every byte of the file went to the servers once (one copy), and came back.
    let sent = total(&mtext, "morris_client_sent_bytes_total", &[]);
    assert_eq!(sent, data.len() as f64, "{mtext}");
    assert!(total(&mtext, "morris_client_received_bytes_total", &[]) >= data.len() as f64);
    for op in ["create", "write", "read", "release"] {
        assert!(
            total(
                &mtext,
                "morris_fuse_request_duration_seconds_count",
                &[("op", op)]
            ) >= 1.0,
            "no FUSE {op} counted:\n{mtext}"
        );
    }
    assert!(
        total(
            &mtext,
            "morris_client_request_duration_seconds_count",
            &[("op", "CreateInode")]
        ) >= 1.0
    );
    // Buckets are cumulative and end at +Inf with the count.
    let count = total(
        &mtext,
        "morris_fuse_request_duration_seconds_count",
        &[("op", "write")],
    );
    let inf = total(
        &mtext,
        "morris_fuse_request_duration_seconds_bucket",
        &[("op", "write"), ("le", "+Inf")],
    );
    assert_eq!(count, inf, "{mtext}");
    assert!(mtext.contains("morris_client_leases "), "{mtext}");
    all_described(&mtext);

    let mut written = 0.0;
    let mut read = 0.0;
    for s in &servers {
        let text = scrape(s);
        assert_eq!(
            total(&text, "morris_build_info", &[("role", "server")]),
            1.0,
            "{text}"
        );
        written += total(&text, "morris_server_written_bytes_total", &[("copy", "0")]);
        read += total(&text, "morris_server_read_bytes_total", &[]);
        assert!(text.contains("morris_server_disk_size_bytes "), "{text}");
        assert!(text.contains("morris_server_range_primary{"), "{text}");
        assert!(
            text.contains("morris_server_store_commit_seconds_count"),
            "{text}"
        );
        assert!(
            total(&text, "morris_server_connections", &[]) >= 1.0,
            "{text}"
        );
        all_described(&text);
    }
    assert_eq!(written, data.len() as f64);
    assert!(read >= data.len() as f64);
    let creates: f64 = servers
        .iter()
        .map(|s| {
            total(
                &scrape(s),
                "morris_server_request_duration_seconds_count",
                &[("op", "CreateInode")],
            )
        })
        .sum();
    assert_eq!(creates, 1.0);

    // A server's status page: the volume's state and this server's graphs.
    let (head, page) = get(&servers[1], "/");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/html"),
        "{head}"
    );
    assert!(page.contains("<h2>Volume: healthy</h2>"), "{page}");
    assert!(page.contains(c.addr(2)), "every server is listed: {page}");
    assert!(
        page.contains("<svg") && page.contains("requests served"),
        "{page}"
    );

    // `morris stats` reads the same endpoints.
    let o = morris(&[
        "stats",
        "--once",
        "--json",
        "--interval",
        "200ms",
        &mount,
        &servers[0],
    ]);
    assert!(o.status.success(), "{}", both(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", both(&o));
    assert_eq!(lines[0]["role"], "mount");
    assert_eq!(lines[1]["role"], "server");
    assert!(lines[0]["leases"].as_f64().is_some());
    // Over an interval in which a known file is written, stats counts its
    // bytes and its FUSE writes.
    let watcher = common::morris_cmd()
        .args(["stats", "--once", "--json", "--interval", "6s", &mount])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run morris stats");
    std::thread::sleep(Duration::from_secs(1));
    let known = pattern(5, 0, 3 << 20);
    std::fs::write(m.path.join("known"), &known).expect("write");
    let o = watcher.wait_with_output().expect("morris stats");
    assert!(o.status.success(), "{}", both(&o));
    let l: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON line");
    assert_eq!(l["written_bytes"], known.len(), "{l}");
    assert!(
        l["ops"].as_u64() >= Some(3),
        "create, write(s), release: {l}"
    );

    // A mount point stands for its mount's endpoint.
    let o = morris(&[
        "stats",
        "--once",
        "--json",
        "--interval",
        "200ms",
        &m.path.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(
        common::stdout(&o).contains(&format!("\"endpoint\":\"{mount}\"")),
        "{}",
        both(&o)
    );
    let o = morris(&["stats", "--once", "/tmp"]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        common::stderr(&o).contains("not a morris mount started with --metrics"),
        "{}",
        both(&o)
    );
    let o = morris(&["stats", "--once", "--interval", "200ms", &mount]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mount"),
        "{}",
        both(&o)
    );
}

#[test]
fn the_nfs_gateway_times_each_procedure() {
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &["--metrics", "127.0.0.1:0"]);
    let addr = endpoint_in(&gw.log);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("in.bin");
    let data = pattern(9, 0, 300_000);
    write_local(&src, &data);
    tool(
        &gw,
        "nfs-cp",
        &[&src.display().to_string(), &gw.file_url("x.bin")],
    );
    let cat = tool(&gw, "nfs-cat", &[&gw.file_url("x.bin")]);
    assert!(cat.stdout == data);
    let text = scrape(&addr);
    assert_eq!(
        total(&text, "morris_build_info", &[("role", "nfs")]),
        1.0,
        "{text}"
    );
    for op in ["write", "read", "mount", "lookup"] {
        assert!(
            total(
                &text,
                "morris_nfs_request_duration_seconds_count",
                &[("op", op)]
            ) >= 1.0,
            "no NFS {op} counted:\n{text}"
        );
    }
    assert_eq!(
        total(&text, "morris_client_sent_bytes_total", &[]),
        data.len() as f64,
        "{text}"
    );
    all_described(&text);
}

#[test]
fn a_taken_metrics_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = common::keys();
    let o = morris(&[
        "server",
        "--data",
        &dir.path().join("d").display().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--key",
        &keys.volume.display().to_string(),
        "--metrics",
        &addr,
    ]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        common::stderr(&o).contains(&format!("cannot listen for metrics on {addr}")),
        "{}",
        both(&o)
    );
    let o = morris(&["stats", "--once", &addr]);
    assert!(!o.status.success(), "{}", both(&o));
    drop(taken);
}

#[test]
fn info_says_where_a_file_lives_and_who_holds_it() {
    common::require_fuse();
    let mut c = metered(4, 2);
    let endpoints: Vec<String> = c.servers.iter().map(|s| endpoint_in(&s.log)).collect();
    let m = Mount::start(c.addr(0), &[]);
    let big = m.path.join("big");
    let small = m.path.join("small");
    // 64 KiB units: 56 blocks and a short last one; 2 blocks.
    std::fs::write(&big, pattern(1, 0, (7 << 19) + 100)).expect("write big");
    std::fs::write(&small, pattern(2, 0, 100_000)).expect("write small");
    let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&big).expect("stat"));
    // Kept open for writing: this mount holds the write lease.
    let open = std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .expect("open big");

    let o = morris(&[
        "info",
        "--json",
        &big.display().to_string(),
        &small.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", both(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(v.len(), 2, "{out}");
    let (b, s) = (&v[0], &v[1]);
    assert_eq!(b["id"], id, "{out}");
    assert_eq!(b["inode_server"]["index"], id % 4, "{out}");
    assert_eq!(
        b["inode_server"]["addr"],
        c.addr((id % 4) as usize),
        "{out}"
    );
    assert_eq!(
        b["metadata_copies"].as_array().map(Vec::len),
        Some(2),
        "{out}"
    );
    assert_eq!(b["blocks"], 57, "{out}");
    assert_eq!(b["block_list"].as_array().map(Vec::len), Some(0), "{out}");
    let held: u64 = b["per_server"]
        .as_array()
        .expect("per_server")
        .iter()
        .map(|x| x["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(held, 2 * ((7 << 19) + 100), "{out}");
    let leases = b["leases"].as_array().expect("leases");
    assert!(
        leases.iter().any(|l| l["mode"] == "Write"
            && l["client"]
                .as_str()
                .is_some_and(|c| c.starts_with("mount@"))),
        "{out}"
    );
    assert_eq!(s["blocks"], 2, "{out}");
    let list = s["block_list"].as_array().expect("block_list");
    assert_eq!(list.len(), 2, "{out}");
    assert_eq!(list[1]["offset"], 65536, "{out}");
    let sid = s["id"].as_u64().expect("id");
    assert_eq!(
        list[0]["servers"],
        serde_json::json!([(sid + 1) % 4, (sid + 2) % 4]),
        "{out}"
    );
    // What info says each server holds is what each server wrote: the
    // stripe units really are on the servers it names.
    for (i, e) in endpoints.iter().enumerate() {
        let said: u64 = [b, s]
            .iter()
            .flat_map(|f| f["per_server"].as_array().cloned().unwrap_or_default())
            .filter(|x| x["server"] == i)
            .map(|x| x["bytes"].as_u64().expect("bytes"))
            .sum();
        let wrote = total(&scrape(e), "morris_server_written_bytes_total", &[]);
        assert_eq!(wrote, said as f64, "server {i}: {out}");
    }
    drop(open);

    // A copy server lost during a write: its copies are recorded stale, and
    // info says so.
    // Not server 0 (the mount's and info's way in) nor a metadata copy of
    // the file's inode.
    let owner = id % 4;
    let victim = (0..4u64)
        .find(|s| ![0, owner, (owner + 1) % 4].contains(s))
        .expect("a server to kill") as usize;
    c.kill9(victim);
    std::fs::write(&big, pattern(3, 0, 1 << 20)).expect("write with a server down");
    let o = morris(&["info", &big.display().to_string()]);
    assert!(o.status.success(), "{}", both(&o));
    let text = common::stdout(&o);
    assert!(
        text.contains(&format!("stale copies: server {victim}, blocks ")),
        "{text}"
    );
    assert!(
        text.contains(&format!("inode on server {} (", id % 4)),
        "{text}"
    );
    let o = morris(&["info", "/"]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        common::stderr(&o).contains("not inside a morris mount"),
        "{}",
        both(&o)
    );
}

#[test]
fn the_access_log_has_a_line_per_request_and_profile_sums_it() {
    common::require_fuse();
    let c = Cluster::start(2, ClusterOpts::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let m = Mount::start(c.addr(0), &["--access-log", &log.display().to_string()]);
    let root = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&m.path).expect("stat root"));
    std::fs::write(m.path.join("f"), b"hello").expect("write");
    let id =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(m.path.join("f")).expect("stat"));
    assert!(std::fs::metadata(m.path.join("missing")).is_err());
    assert_eq!(std::fs::read(m.path.join("f")).expect("read"), b"hello");
    let text = wait_for(Duration::from_secs(10), "the access log's lines", || {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if t.contains(&format!("lookup ({root}): ENOENT <"))
            && t.contains(&format!("read ({id}): OK <"))
        {
            Ok(t)
        } else {
            Err(t)
        }
    });
    for want in [
        format!("create ({root}): OK <"),
        format!("write ({id}): OK <"),
        format!("release ({id}): OK <"),
    ] {
        assert!(text.contains(&want), "no {want:?} in:\n{text}");
    }
    // The kernel names the calling thread (this test's).
    // SAFETY: gettid has no preconditions.
    let pid = unsafe { libc::gettid() };
    assert!(
        text.contains(&format!(",pid:{pid}] write ({id})")),
        "{text}"
    );

    let o = morris(&["profile", "--json", &log.display().to_string()]);
    assert!(o.status.success(), "{}", both(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let ops = p["ops"].as_array().expect("ops");
    let lookup = ops
        .iter()
        .find(|x| x["key"] == "lookup")
        .expect("lookups counted");
    assert!(lookup["errors"].as_u64() >= Some(1), "{p}");
    assert!(
        ops.iter()
            .any(|x| x["key"] == "write" && x["count"].as_u64() >= Some(1)),
        "{p}"
    );
    let o = morris(&["profile", &log.display().to_string()]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(common::stdout(&o).contains("OPERATION"), "{}", both(&o));
}

/// Panics unless `tool` is on PATH (installed by scripts/setup.sh).
fn require(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test needs {tool} (Debian package {package}; scripts/setup.sh installs it)"
    );
}

/// A `morris up` cluster whose servers and mount serve metrics; stopped
/// (SIGINT, which unmounts) when dropped.
struct Up {
    child: std::process::Child,
    dir: tempfile::TempDir,
    /// The metrics endpoints: the servers', then the mount's.
    endpoints: Vec<String>,
}

impl Up {
    fn start(servers: u16) -> Up {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = common::free_ports(servers);
        let metrics = common::free_ports(servers + 1);
        let out = dir.path().join("up.out");
        let mut child = common::morris_cmd()
            .args([
                "up",
                "--servers",
                &servers.to_string(),
                "--lease-ms",
                "1500",
            ])
            .arg("--dir")
            .arg(dir.path().join("data"))
            .arg("--mount")
            .arg(dir.path().join("mnt"))
            .args([
                "--port",
                &port.to_string(),
                "--metrics-port",
                &metrics.to_string(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(dir.path().join("up.err")).expect("stderr file"))
            .spawn()
            .expect("start morris up");
        let mnt = dir.path().join("mnt");
        wait_for(Duration::from_secs(60), "morris up to mount", || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "morris up exited with {st}: {}",
                    read_log(&dir.path().join("up.err"))
                );
            }
            let text = read_log(&out);
            if common::is_mounted(&mnt) && text.contains("Ctrl-C") {
                Ok(())
            } else {
                Err(text)
            }
        });
        let endpoints = (0..=servers)
            .map(|i| format!("127.0.0.1:{}", metrics + i))
            .collect();
        Up {
            child,
            dir,
            endpoints,
        }
    }

    fn mnt(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        common::signal(self.child.id(), libc::SIGINT);
        if common::wait_timeout(&mut self.child, Duration::from_secs(30)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(self.mnt())
                .status();
        }
    }
}

/// Runs a PromQL query against the Prometheus at `port`.
fn promql(port: u16, expr: &str) -> serde_json::Value {
    try_promql(port, expr).unwrap_or_else(|e| panic!("{e}"))
}

/// [`promql`], or why not (Prometheus not ready yet).
fn try_promql(port: u16, expr: &str) -> Result<serde_json::Value, String> {
    let q: String = expr
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (_, body) = try_get(
        &format!("127.0.0.1:{port}"),
        &format!("/api/v1/query?query={q}"),
    )?;
    serde_json::from_str(&body).map_err(|e| format!("not a Prometheus API answer ({e}): {body}"))
}

#[test]
fn a_real_prometheus_scrapes_every_server_and_sees_a_read() {
    require("prometheus", "prometheus");
    require("promtool", "prometheus");
    common::require_fuse();
    let up = Up::start(3);
    // Every endpoint's text passes Prometheus's own parser and linter.
    for e in &up.endpoints {
        let text = scrape(e);
        let mut check = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run promtool");
        check
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("feed promtool");
        let o = check.wait_with_output().expect("promtool");
        assert!(
            o.status.success(),
            "promtool check metrics of {e}: {}",
            both(&o)
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let targets: Vec<String> = up.endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: morris\n    static_configs: [{{targets: [{}]}}]\n",
            targets.join(", ")
        ),
    )
    .expect("config");
    let mut prom = std::process::Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::fs::File::create(dir.path().join("prom.log")).expect("log"))
        .stderr(std::fs::File::create(dir.path().join("prom.err")).expect("log"))
        .spawn()
        .expect("start prometheus");
    let result = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(60),
            "Prometheus to scrape all four endpoints",
            || {
                // Not listening, then not ready (503), at first.
                let v = try_promql(port, "sum(up{job=\"morris\"})")?;
                match v["data"]["result"][0]["value"][1].as_str() {
                    Some("4") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        );
        // Written, then read past the page cache: every server serves some.
        let data = pattern(11, 0, 8 << 20);
        std::fs::write(up.mnt().join("f"), &data).expect("write");
        assert!(read_past_cache(&up.mnt().join("f")) == data);
        wait_for(
            Duration::from_secs(30),
            "a read rate at every server",
            || {
                let v = promql(
                    port,
                    "sum by (instance) (rate(morris_server_read_bytes_total[1m])) > 0",
                );
                let n = v["data"]["result"].as_array().map_or(0, Vec::len);
                if n == 3 {
                    Ok(())
                } else {
                    Err(v.to_string())
                }
            },
        );
        // And the mount's side: its FUSE reads (once Prometheus has
        // scraped the mount after the read).
        wait_for(Duration::from_secs(30), "the mount's FUSE reads", || {
            let v = promql(
                port,
                "sum(increase(morris_fuse_request_duration_seconds_count{op=\"read\"}[1m])) > 0",
            );
            match v["data"]["result"].as_array().map(Vec::len) {
                Some(1) => Ok(()),
                _ => Err(v.to_string()),
            }
        });
    });
    let _ = prom.kill();
    let _ = prom.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// Headless Chromium's DOM of `url` (after the page loaded), or a
/// screenshot of it into `png`.
fn chromium(url: &str, png: Option<&Path>) -> String {
    let profile = tempfile::tempdir().expect("tempdir");
    let mut cmd = std::process::Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match png {
        Some(p) => cmd
            .arg(format!("--screenshot={}", p.display()))
            .arg("--window-size=1500,1000"),
        None => cmd.arg("--dump-dom"),
    };
    let o = cmd.arg(url).output().expect("run chromium");
    assert!(o.status.success(), "chromium {url}: {}", both(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The state column of `addr`'s row in the status page's table.
fn state_in_page(dom: &str, addr: &str) -> Option<String> {
    dom.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(addr))
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
}

#[test]
fn chromium_shows_every_server_and_a_killed_one_down() {
    require("chromium", "chromium");
    let mut c = metered(3, 1);
    let page = format!("http://{}/", endpoint_in(&c.servers[0].log));
    let dom = chromium(&page, None);
    assert!(dom.contains("Volume: healthy"), "{dom}");
    for i in 0..3 {
        assert_eq!(
            state_in_page(&dom, c.addr(i)).as_deref(),
            Some("up"),
            "server {i}: {dom}"
        );
    }
    c.kill9(2);
    // The page asks every server at each view: the next refresh (10 s)
    // shows the killed one down.
    let asked = std::time::Instant::now();
    let dom = chromium(&page, None);
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "the page took {:?}",
        asked.elapsed()
    );
    assert_eq!(
        state_in_page(&dom, c.addr(2)).as_deref(),
        Some("down"),
        "{dom}"
    );
    assert_eq!(
        state_in_page(&dom, c.addr(1)).as_deref(),
        Some("up"),
        "{dom}"
    );
    assert!(dom.contains("Volume: degraded"), "{dom}");
    let dir = tempfile::tempdir().expect("tempdir");
    let png = dir.path().join("page.png");
    chromium(&page, Some(&png));
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG"),
        "{} bytes",
        bytes.len()
    );
}

#[test]
fn a_cache_binding_counts_misses_hits_and_bytes_fetched() {
    common::require_fuse();
    let c = metered(2, 1);
    let endpoints: Vec<String> = c.servers.iter().map(|s| endpoint_in(&s.log)).collect();
    let home = tempfile::tempdir().expect("home");
    let data = pattern(21, 0, 300_000);
    std::fs::write(home.path().join("h"), &data).expect("write at home");
    let m = c.mount();
    std::fs::create_dir(m.path.join("c")).expect("mkdir");
    let url = format!("file://{}", home.path().display());
    let o = morris(&[
        "cache",
        "bind",
        &m.path.join("c").display().to_string(),
        &url,
    ]);
    assert!(o.status.success(), "{}", both(&o));
    assert!(std::fs::read(m.path.join("c/h")).expect("read, a miss") == data);
    // Read again past the page cache: a hit at the servers.
    assert!(read_past_cache(&m.path.join("c/h")) == data);
    let texts: Vec<String> = endpoints.iter().map(|e| scrape(e)).collect();
    let sum = |name: &str| texts.iter().map(|t| total(t, name, &[])).sum::<f64>();
    assert_eq!(
        sum("morris_server_cache_fetched_bytes_total"),
        data.len() as f64,
        "{texts:?}"
    );
    assert!(sum("morris_server_cache_misses_total") >= 1.0, "{texts:?}");
    assert!(sum("morris_server_cache_hits_total") >= 1.0, "{texts:?}");
    assert_eq!(
        sum("morris_server_cache_bytes"),
        data.len() as f64,
        "{texts:?}"
    );
    assert_eq!(sum("morris_server_cache_home_reachable"), 2.0, "{texts:?}");
}
