//! `morris mount` (foreground and --background), `morris umount` and
//! `morris up`: these need FUSE and the client library.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    alive, both, free_ports, is_mounted, morris, read_log, require_fuse, signal, stderr, stdout,
    wait_timeout, Cluster, ClusterOpts, Mount,
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
    let o = common::morris_cmd()
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

/// Runs `morris up` (2 servers, short leases) until its mount appears;
/// returns the child and the stdout file.
fn start_up(dir: &Path, port: u16, tag: &str) -> (std::process::Child, std::path::PathBuf) {
    start_up_with(dir, port, tag, &["--servers", "2"], "info")
}

/// Runs `morris up --dir DIR/data --mount DIR/mnt --port PORT` with `args`
/// and `RUST_LOG=log` until its mount appears; stdout goes to
/// `DIR/up-TAG.out`, stderr to `DIR/up-TAG.err`.
fn start_up_with(
    dir: &Path,
    port: u16,
    tag: &str,
    args: &[&str],
    log: &str,
) -> (std::process::Child, std::path::PathBuf) {
    let out = dir.join(format!("up-{tag}.out"));
    let err = dir.join(format!("up-{tag}.err"));
    let mnt = dir.join("mnt");
    let mut cmd = common::morris_cmd();
    cmd.arg("up")
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
        .args(args)
        .env("RUST_LOG", log)
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

/// A child process killed (by its PID) and reaped when dropped.
struct Reaped(std::process::Child);

impl Reaped {
    fn spawn(cmd: &mut Command, what: &str) -> Reaped {
        Reaped(
            cmd.stdin(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {what}: {e}")),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process stopped with SIGSTOP until this is dropped (SIGCONT).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// A `morris up` under test; if a test fails midway it is stopped (SIGTERM,
/// up to three times, then SIGKILL) and its mount detached.
struct Up {
    child: Option<std::process::Child>,
    mnt: std::path::PathBuf,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Up {
    fn start(dir: &Path, port: u16, tag: &str, args: &[&str], log: &str) -> Up {
        let (child, out) = start_up_with(dir, port, tag, args, log);
        Up {
            child: Some(child),
            mnt: dir.join("mnt"),
            out,
            err: dir.join(format!("up-{tag}.err")),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// Both output files, for assertion messages.
    fn output(&self) -> String {
        format!(
            "--- stdout\n{}--- stderr\n{}",
            contents(&self.out),
            contents(&self.err)
        )
    }

    /// Waits for `morris up` to exit by itself.
    fn wait_exit(&mut self, limit: Duration, what: &str) -> std::process::ExitStatus {
        let status = self
            .child
            .as_mut()
            .and_then(|c| wait_timeout(c, limit))
            .unwrap_or_else(|| {
                panic!(
                    "{what}: morris up still running after {limit:?}:\n{}",
                    self.output()
                )
            });
        self.child = None;
        status
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            for _ in 0..3 {
                signal(c.id(), libc::SIGTERM);
                if wait_timeout(&mut c, Duration::from_secs(15)).is_some() {
                    break;
                }
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
    }
}

/// Runs a command that must succeed.
fn run(cmd: &mut Command, what: &str) {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(o.status.success(), "{what}: {}", both(&o));
}

/// Waits until the file at `path` contains `needle`; returns its text.
fn wait_for_text(path: &Path, needle: &str, limit: Duration, what: &str) -> String {
    common::wait_for(limit, what, || {
        let text = contents(path);
        if text.contains(needle) {
            Ok(text)
        } else {
            Err(format!(
                "{} does not say {needle:?}; it says:\n{text}",
                path.display()
            ))
        }
    })
}

/// Checks that `mp` is mounted and serves a write and a read.
fn assert_serves(mp: &Path, name: &str, logs: &[&Mount]) {
    let all: String = logs
        .iter()
        .map(|m| format!("--- {}\n{}", m.log.display(), read_log(&m.log)))
        .collect();
    assert!(
        is_mounted(mp),
        "{} is not mounted any more:\n{all}",
        mp.display()
    );
    let f = mp.join(name);
    std::fs::write(&f, name.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}\n{all}", f.display()));
    assert_eq!(
        std::fs::read(&f).unwrap_or_else(|e| panic!("read {}: {e}\n{all}", f.display())),
        name.as_bytes()
    );
}

/// Issue 13, 5a: a `morris mount` process owns exactly its own mount. After
/// its mount is unmounted from outside and a new `morris mount` mounts the
/// same directory, signalling the old process must leave the new mount
/// alone: whether its own mount is still alive (detached with a file open)
/// or already gone (the kernel then hands its device number to the next
/// mount, so even the device does not identify it).
#[test]
fn an_old_mount_process_leaves_a_newer_mount_alone() {
    require_fuse();
    let c = Cluster::start(1, ClusterOpts::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical");
    let mp = base.join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");

    // 1. The old mount detached from outside while a file is open on it.
    let mut old = Mount::start_at(c.addr(0), &mp, &base.join("old.log"), &[]);
    std::fs::write(mp.join("kept"), b"kept").expect("write through the old mount");
    let open = std::fs::File::open(mp.join("kept")).expect("open on the old mount");
    run(
        Command::new("umount").arg("-l").arg("-c").arg(&mp),
        "umount -l",
    );
    assert!(!is_mounted(&mp));
    let mut new = Mount::start_at(c.addr(0), &mp, &base.join("new.log"), &[]);
    signal(old.pid().expect("old pid"), libc::SIGTERM);
    let status = old.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "the old mount process ignored SIGTERM; log:\n{}",
            read_log(&old.log)
        )
    });
    assert!(status.success(), "old: {status}\n{}", read_log(&old.log));
    drop(open);
    assert_serves(&mp, "after-old-1", &[&old, &new]);

    // 2. The mount gone, and a newer mount on the directory, while its
    //    process was stopped and could not notice; then it is signalled.
    let stopped = Stopped::new(new.pid().expect("new pid"));
    run(Command::new("umount").arg("-c").arg(&mp), "umount");
    let newer = Mount::start_at(c.addr(0), &mp, &base.join("newer.log"), &[]);
    drop(stopped);
    signal(new.pid().expect("new pid"), libc::SIGTERM);
    let status = new.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "the second mount process did not exit; log:\n{}",
            read_log(&new.log)
        )
    });
    assert!(status.success(), "new: {status}\n{}", read_log(&new.log));
    assert_serves(&mp, "after-old-2", &[&new, &newer]);
    drop(newer);
    assert!(!is_mounted(&mp));
}

/// Issue 13, 5b: a mount unmounted from outside while a copy of it lives on
/// in another mount namespace (made while it was mounted: `unshare`, a
/// container, a service with a private /tmp) keeps its FUSE session alive
/// in the kernel with nothing using it. `morris mount` must exit anyway.
#[test]
fn a_mount_copied_into_another_namespace_still_ends_on_unmount() {
    require_fuse();
    let c = Cluster::start(1, ClusterOpts::default());
    let mut m = c.mount();
    std::fs::write(m.path.join("x"), b"x").expect("write through the mount");
    let mut cmd = Command::new("unshare");
    if !common::is_root() {
        cmd.arg("-r");
    }
    cmd.args(["-m", "--propagation", "private", "sleep", "600"]);
    let ns = Reaped::spawn(&mut cmd, "unshare");
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("our mount namespace");
    let want = m.path.display().to_string();
    common::wait_for(
        Duration::from_secs(30),
        "a mount namespace holding a copy of the mount",
        || {
            let theirs = std::fs::read_link(format!("/proc/{}/ns/mnt", ns.pid()))
                .map_err(|e| e.to_string())?;
            let table = std::fs::read_to_string(format!("/proc/{}/mountinfo", ns.pid()))
                .map_err(|e| e.to_string())?;
            if theirs != ours && table.lines().any(|l| l.split(' ').nth(4) == Some(&want)) {
                Ok(())
            } else {
                Err(format!(
                    "namespace {theirs:?} (ours {ours:?}) has no copy yet"
                ))
            }
        },
    );
    run(
        Command::new("fusermount3").arg("-u").arg(&m.path),
        "fusermount3 -u",
    );
    assert!(!is_mounted(&m.path));
    let status = m.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "morris mount still runs after fusermount3 -u; log:\n{}",
            read_log(&m.log)
        )
    });
    assert!(status.success(), "{status}\n{}", read_log(&m.log));
    let log = read_log(&m.log);
    assert!(log.contains("other mount namespaces"), "{log}");
}

/// Issue 13, 5d: a mount detached lazily from outside (`umount -l`) with
/// nothing open ends its process cleanly: unmounting what is already
/// detached is success, not "Unmount failed: Invalid argument".
#[test]
fn a_lazy_detach_from_outside_ends_the_mount_process_cleanly() {
    require_fuse();
    let c = Cluster::start(1, ClusterOpts::default());
    let mut m = c.mount();
    std::fs::write(m.path.join("x"), b"x").expect("write through the mount");
    run(
        Command::new("umount").arg("-l").arg("-c").arg(&m.path),
        "umount -l",
    );
    let status = m.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "morris mount still runs after umount -l; log:\n{}",
            read_log(&m.log)
        )
    });
    assert!(status.success(), "{status}\n{}", read_log(&m.log));
    let log = read_log(&m.log);
    assert!(
        !log.contains("Unmount failed") && !log.contains("Invalid argument"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" WARN ") || l.contains(" ERROR ")),
        "warnings after a clean lazy detach:\n{log}"
    );
}

/// Issue 13, 5c: a process killed while the kernel waits for this mount's
/// answer keeps the mount busy until the answer comes, though nothing is
/// open from its user's point of view. `morris up`'s Ctrl-C must say so and
/// unmount once the request is answered, without a second signal.
#[test]
fn up_unmounts_once_the_requests_in_flight_are_answered() {
    use std::os::unix::fs::MetadataExt;
    require_fuse();
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().canonicalize().expect("canonical");
    let port = free_ports(3);
    let mut up = Up::start(
        &dir,
        port,
        "1",
        &["--servers", "3"],
        "info,fuser::request=debug",
    );
    let f = up.mnt.join("f");
    std::fs::write(&f, common::pattern(1, 0, 1 << 20)).expect("write through up's mount");
    let direct_read = |what: &str| {
        let mut cmd = Command::new("dd");
        cmd.arg(format!("if={}", f.display())).args([
            "of=/dev/null",
            "bs=1M",
            "iflag=direct",
            "status=none",
        ]);
        (cmd, what.to_string())
    };
    let (mut cmd, what) = direct_read("a direct read with every server up");
    run(&mut cmd, &what);
    let ino = std::fs::metadata(&f).expect("stat").ino();
    let victim = common::copy_only_server(3, &[&f]);
    let pids = server_pids(&contents(&up.out));
    assert_eq!(pids.len(), 3, "{}", up.output());
    let stopped = Stopped::new(pids[victim]);
    let seen = contents(&up.err).len();
    let (mut cmd, what) = direct_read("a reader");
    let reader = Reaped::spawn(cmd.stderr(Stdio::null()), &what);
    // Bound again after the reader, so that on a failure the server is
    // continued before the reader (which cannot exit until then) is reaped.
    let stopped = stopped;
    // The kernel asks `morris up` for data that sits on the stopped server:
    // that request stays in flight.
    let read = format!("ino {ino:#018x} READ");
    common::wait_for(
        Duration::from_secs(30),
        "the reader's READ to reach morris up",
        || {
            let text = contents(&up.err);
            if text.get(seen..).is_some_and(|t| t.contains(&read)) {
                Ok(())
            } else {
                Err(format!("no {read:?} in the log yet"))
            }
        },
    );
    signal(reader.pid(), libc::SIGKILL);
    signal(up.pid(), libc::SIGINT);
    let log = wait_for_text(
        &up.err,
        "requests in flight",
        Duration::from_secs(30),
        "morris up to say that requests in flight keep the mount busy",
    );
    assert!(!log.contains("files are open"), "{log}");
    assert!(is_mounted(&up.mnt), "{}", up.output());
    drop(stopped);
    let status = up.wait_exit(
        Duration::from_secs(90),
        "after the request in flight was answered",
    );
    assert!(status.success(), "{status}\n{}", up.output());
    assert!(!is_mounted(&up.mnt));
    for p in &pids {
        assert!(!alive(*p), "server pid {p} survived");
    }
    drop(reader);
}

/// Issue 13, 5c: a mount that is truly busy (a process's working directory)
/// is reported as busy, naming the process, and stays mounted and served;
/// once that process is gone `morris up` unmounts and exits by itself.
#[test]
fn up_names_what_keeps_its_mount_busy_and_unmounts_once_free() {
    require_fuse();
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().canonicalize().expect("canonical");
    let port = free_ports(2);
    let mut up = Up::start(&dir, port, "1", &["--servers", "2"], "info");
    let d = up.mnt.join("d");
    std::fs::create_dir(&d).expect("mkdir through up's mount");
    let sleeper = Reaped::spawn(Command::new("sleep").arg("600").current_dir(&d), "sleep");
    signal(up.pid(), libc::SIGINT);
    let needle = format!(
        "pid {} (sleep) has its working directory there",
        sleeper.pid()
    );
    wait_for_text(
        &up.err,
        &needle,
        Duration::from_secs(30),
        "morris up to name the process that keeps its mount busy",
    );
    assert!(is_mounted(&up.mnt), "{}", up.output());
    assert!(
        std::fs::metadata(&d).is_ok_and(|m| m.is_dir()),
        "a busy mount stays served"
    );
    assert!(alive(up.pid()));
    drop(sleeper);
    let status = up.wait_exit(Duration::from_secs(60), "after the busy process ended");
    assert!(status.success(), "{status}\n{}", up.output());
    assert!(!is_mounted(&up.mnt));
}

/// The pids `morris up` logged for restarts of server `i`, in order.
fn restarted_pids(log: &str, i: usize) -> Vec<u32> {
    let what = format!("server {i} restarted");
    log.lines()
        .filter(|l| l.contains(&what))
        .filter_map(|l| l.split(" pid=").nth(1))
        .filter_map(|s| s.split_whitespace().next())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Issue 13, 6b: `morris up` restarts a server that died (`kill -9`), with
/// back-off, says what the loss means (with replicas 2 the volume stays
/// available), keeps the volume usable, and restarts nothing while it shuts
/// down on Ctrl-C.
#[test]
fn up_restarts_a_killed_server_with_back_off() {
    require_fuse();
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().canonicalize().expect("canonical");
    let port = free_ports(2);
    let mut up = Up::start(
        &dir,
        port,
        "1",
        &["--servers", "2", "--replicas", "2"],
        "info",
    );
    std::fs::write(up.mnt.join("before"), b"before").expect("write through up's mount");
    let pids = server_pids(&contents(&up.out));
    assert_eq!(pids.len(), 2, "{}", up.output());

    signal(pids[1], libc::SIGKILL);
    let log = wait_for_text(
        &up.err,
        "server 1 restarted",
        Duration::from_secs(60),
        "morris up to restart the killed server",
    );
    assert!(
        log.contains("server 1 exited (signal: 9 (SIGKILL)); restarting it in 1 s"),
        "{log}"
    );
    assert!(log.contains("the volume stays available"), "{log}");
    assert!(!log.contains("until `morris up` is restarted"), "{log}");
    let first = restarted_pids(&log, 1);
    assert_eq!(first.len(), 1, "{log}");
    assert!(alive(first[0]) && first[0] != pids[1], "{log}");
    let addr = format!("127.0.0.1:{}", port + 1);
    common::wait_for(
        Duration::from_secs(30),
        "the restarted server to listen",
        || {
            std::net::TcpStream::connect(&addr)
                .map(drop)
                .map_err(|e| e.to_string())
        },
    );
    std::fs::write(up.mnt.join("after"), b"after").expect("write after the restart");
    assert_eq!(
        std::fs::read(up.mnt.join("before")).expect("read after the restart"),
        b"before"
    );

    // Killed again at once: the next restart waits longer.
    signal(first[0], libc::SIGKILL);
    let log = common::wait_for(
        Duration::from_secs(60),
        "morris up to restart the server a second time",
        || {
            let log = contents(&up.err);
            if restarted_pids(&log, 1).len() == 2 {
                Ok(log)
            } else {
                Err(log)
            }
        },
    );
    assert!(log.contains("restarting it in 2 s"), "{log}");
    let last = restarted_pids(&log, 1)[1];

    signal(up.pid(), libc::SIGINT);
    let status = up.wait_exit(Duration::from_secs(60), "after SIGINT");
    assert!(status.success(), "{status}\n{}", up.output());
    assert!(!is_mounted(&up.mnt));
    let log = contents(&up.err);
    assert_eq!(
        restarted_pids(&log, 1).len(),
        2,
        "a server was restarted while shutting down:\n{log}"
    );
    assert!(!log.contains("server 0 exited"), "{log}");
    for p in [pids[0], last] {
        assert!(!alive(p), "server pid {p} survived:\n{log}");
    }
}

#[test]
fn up_with_tls_serves_its_mount_and_its_servers_refuse_plain_clients() {
    require_fuse();
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().canonicalize().expect("canonical");
    let port = free_ports(2);
    let (mut up, out) = start_up_with(&dir, port, "tls", &["--servers", "2", "--tls"], "info");
    std::fs::write(dir.join("mnt/f"), b"inside TLS").expect("write through up's mount");
    assert_eq!(
        std::fs::read(dir.join("mnt/f")).expect("read"),
        b"inside TLS"
    );
    let key = dir.join("data/keys/volume.key");
    let key = key.to_str().expect("utf-8");
    let addr = format!("127.0.0.1:{port}");
    let plain = common::morris(&["status", &addr, "--key", key]);
    assert!(!plain.status.success(), "{}", common::both(&plain));
    assert!(
        common::stderr(&plain).contains("inside TLS only"),
        "{}",
        common::both(&plain)
    );
    let tls = common::morris(&["status", &addr, "--key", key, "--tls"]);
    assert!(tls.status.success(), "{}", common::both(&tls));
    signal(up.id(), libc::SIGINT);
    let status = wait_timeout(&mut up, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = up.kill();
        panic!("morris up ignored SIGINT:\n{}", contents(&out))
    });
    assert!(status.success(), "{}", contents(&out));
}

#[test]
fn read_only_dev_and_suid_mounts_do_what_they_say() {
    let c = Cluster::start(2, ClusterOpts::default());
    let rw = c.mount();
    std::fs::write(rw.path.join("f"), b"data").unwrap();
    // A device node (/dev/null's numbers) and a set-user-ID program.
    let null = std::ffi::CString::new(rw.path.join("null").to_str().unwrap()).unwrap();
    let dev = libc::makedev(1, 3);
    assert_eq!(
        unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, dev) },
        0
    );
    // Without --dev, opening it is refused.
    let e = std::fs::File::open(rw.path.join("null")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");

    let ro = Mount::start(c.addr(0), &["--read-only"]);
    assert_eq!(std::fs::read(ro.path.join("f")).unwrap(), b"data");
    for r in [
        std::fs::write(ro.path.join("f"), b"x"),
        std::fs::write(ro.path.join("new"), b"x"),
        std::fs::create_dir(ro.path.join("d")),
        std::fs::remove_file(ro.path.join("f")),
    ] {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    }
    // Remounted read-write, it writes.
    let o = Command::new("mount")
        .args(["-i", "-o", "remount,rw"])
        .arg(&ro.path)
        .output()
        .unwrap();
    assert!(o.status.success(), "remount,rw: {}", common::both(&o));
    std::fs::write(ro.path.join("new"), b"x").unwrap();

    let devs = Mount::start(c.addr(1), &["--dev", "--suid"]);
    let mut buf = Vec::new();
    std::fs::File::open(devs.path.join("null"))
        .expect("a device node on a --dev mount opens")
        .read_to_end(&mut buf)
        .unwrap();
    assert!(buf.is_empty());
    let opts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(devs.path.to_str().unwrap()))
        .expect("the mount in mountinfo");
    assert!(
        !line.contains("nosuid") && !line.contains("nodev"),
        "{line}"
    );
}
