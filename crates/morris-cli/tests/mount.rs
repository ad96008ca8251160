//! `morris mount` (foreground and --background), `morris umount` and
//! `morris up`: these need FUSE and the client library.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    alive, both, free_ports, is_mounted, morris, read_log, require_fuse, signal, stderr, stdout,
    wait_timeout, Cluster, ClusterOpts, Mount, MORRIS,
};

#[test]
fn foreground_mount_serves_files_and_exits_after_umount() {
    let c = Cluster::start(2, ClusterOpts::default());
    let mut m = c.mount();
    let f = m.path.join("hello.txt");
    std::fs::write(&f, b"hello morris").expect("write through the mount");
    assert_eq!(std::fs::read(&f).expect("read back"), b"hello morris");

    let o = morris(&["umount", &m.path.display().to_string()]);
    assert!(o.status.success(), "umount: {}", both(&o));
    assert!(!is_mounted(&m.path));
    let status = m
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("mount process still running; log:\n{}", read_log(&m.log)));
    assert!(
        status.success(),
        "mount exited with {status}; log:\n{}",
        read_log(&m.log)
    );

    // The data outlived the mount.
    let again = c.mount();
    assert_eq!(
        std::fs::read(again.path.join("hello.txt")).expect("read after remount"),
        b"hello morris"
    );
}

#[test]
fn sigterm_unmounts_a_foreground_mount() {
    let c = Cluster::start(1, ClusterOpts::default());
    let mut m = Mount::start(c.addr(0), &[]);
    signal(m.pid().expect("pid"), libc::SIGTERM);
    let status = m
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("mount process ignored SIGTERM; log:\n{}", read_log(&m.log)));
    assert!(status.success(), "log:\n{}", read_log(&m.log));
    assert!(!is_mounted(&m.path));
}

#[test]
fn background_mount_reports_success_and_failure() {
    require_fuse();
    let c = Cluster::start(2, ClusterOpts::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let mp = dir.path().canonicalize().expect("canonical").join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let log = dir.path().join("daemon.log");
    let mut args = vec![
        "mount".to_string(),
        c.addr(1).to_string(),
        mp.display().to_string(),
        "--background".into(),
        "--log".into(),
        log.display().to_string(),
    ];
    if !common::is_root() {
        args.push("--no-allow-other".into());
    }
    let start = Instant::now();
    let o = Command::new(MORRIS)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("run morris mount --background");
    assert!(o.status.success(), "{}\nlog:\n{}", both(&o), read_log(&log));
    assert!(start.elapsed() < Duration::from_secs(60));
    // The parent returned only once the mount was up.
    assert!(
        is_mounted(&mp),
        "not mounted after the parent exited: {}",
        both(&o)
    );
    let out = stdout(&o);
    assert!(out.contains("mounted volume"), "{out}");
    let pid: u32 = out
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {out:?}"));
    assert!(alive(pid));
    std::fs::write(mp.join("x"), b"1").expect("write through the daemon's mount");

    let u = morris(&["umount", &mp.display().to_string()]);
    assert!(u.status.success(), "{}", both(&u));
    let t = Instant::now();
    while alive(pid) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(pid),
        "daemon still running after umount; log:\n{}",
        read_log(&log)
    );

    // A volume that is not there: the parent prints the daemon's error, exits 1.
    let port = common::free_port();
    let o = morris(&[
        "mount",
        &format!("127.0.0.1:{port}"),
        &mp.display().to_string(),
        "--background",
    ]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        stderr(&o).contains("cannot connect to the volume"),
        "{}",
        both(&o)
    );
    assert!(!is_mounted(&mp));
}

#[test]
fn mount_refuses_bad_mount_points() {
    let missing = morris(&["mount", "127.0.0.1:1", "/nonexistent/morris-mnt"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("does not exist"),
        "{}",
        both(&missing)
    );
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    let o = morris(&["mount", "127.0.0.1:1", &file.path().display().to_string()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a directory"), "{}", both(&o));
}

/// Reads what a child wrote to a file so far.
fn contents(p: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(p) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// Runs `morris up` with `extra` args until its mount appears; returns the
/// child and the stdout file.
fn start_up(dir: &Path, port: u16, tag: &str) -> (std::process::Child, std::path::PathBuf) {
    let out = dir.join(format!("up-{tag}.out"));
    let err = dir.join(format!("up-{tag}.err"));
    let mnt = dir.join("mnt");
    let mut cmd = Command::new(MORRIS);
    cmd.arg("up")
        .arg("--servers")
        .arg("2")
        .arg("--dir")
        .arg(dir.join("data"))
        .arg("--mount")
        .arg(&mnt)
        .arg("--port")
        .arg(port.to_string())
        .arg("--lease-ms")
        .arg("1500")
        .arg("--stripe-unit")
        .arg("64K")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    if !common::is_root() {
        cmd.arg("--no-allow-other");
    }
    let mut child = cmd.spawn().expect("start morris up");
    let start = Instant::now();
    while !(is_mounted(&mnt) && contents(&out).contains("Ctrl-C")) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "morris up exited with {status}:\n{}\n{}",
                contents(&out),
                contents(&err)
            );
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
            panic!(
                "morris up did not come up:\n{}\n{}",
                contents(&out),
                contents(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, out)
}

fn server_pids(out: &str) -> Vec<u32> {
    out.lines()
        .filter_map(|l| l.split("pid ").nth(1))
        .filter_map(|s| s.split_whitespace().next())
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn volume_uuid(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("volume "))
        .unwrap_or_else(|| panic!("no volume line in {out}"))
        .trim()
        .to_string()
}

#[test]
fn up_starts_everything_and_cleans_up_on_a_signal() {
    require_fuse();
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().canonicalize().expect("canonical");
    let port = free_ports(2);
    let mnt = dir.join("mnt");

    let (mut up, out) = start_up(&dir, port, "1");
    let text = contents(&out);
    assert!(text.contains("formatted a new volume"), "{text}");
    let uuid = volume_uuid(&text);
    let pids = server_pids(&text);
    assert_eq!(pids.len(), 2, "{text}");
    assert!(pids.iter().all(|&p| alive(p)));
    assert!(dir.join("data/server-0.log").exists() && dir.join("data/server-1").is_dir());
    std::fs::write(mnt.join("kept.txt"), b"still here").expect("write through up's mount");

    signal(up.id(), libc::SIGINT);
    let status = wait_timeout(&mut up, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = up.kill();
        panic!("morris up ignored SIGINT:\n{}", contents(&out))
    });
    assert!(
        status.success(),
        "morris up exited with {status}:\n{}",
        contents(&out)
    );
    assert!(!is_mounted(&mnt), "still mounted after up exited");
    for p in &pids {
        assert!(!alive(*p), "server pid {p} survived");
    }

    // Rerunning reuses the volume and its data; SIGTERM also cleans up.
    let (mut up, out) = start_up(&dir, port, "2");
    let text = contents(&out);
    assert!(text.contains("reusing the volume"), "{text}");
    assert_eq!(volume_uuid(&text), uuid);
    assert_eq!(
        std::fs::read(mnt.join("kept.txt")).expect("read after restart"),
        b"still here"
    );
    let pids = server_pids(&text);
    signal(up.id(), libc::SIGTERM);
    let status = wait_timeout(&mut up, Duration::from_secs(60)).expect("up exits on SIGTERM");
    assert!(status.success(), "{}", contents(&out));
    assert!(!is_mounted(&mnt));
    assert!(pids.iter().all(|&p| !alive(p)));
}

#[test]
fn up_names_a_taken_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let o = morris(&[
        "up",
        "--servers",
        "1",
        "--dir",
        &dir.path().join("data").display().to_string(),
        "--mount",
        &dir.path().join("mnt").display().to_string(),
        "--port",
        &port.to_string(),
        "--no-allow-other",
    ]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        stderr(&o).contains(&format!("port {port} on 127.0.0.1 is already in use")),
        "{}",
        both(&o)
    );
}
