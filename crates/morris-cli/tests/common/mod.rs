//! Integration-test harness: real `morris server` processes on free
//! 127.0.0.1 ports with temporary data directories, formatted through
//! `morris format`, and FUSE mounts through `morris mount`.
//!
//! Every process is killed by PID and every mount unmounted when its owner is
//! dropped. Servers also get `PR_SET_PDEATHSIG`, which fires when the *thread*
//! that started them ends: keep a `Cluster` on the test's own thread.
//!
//! Tests that mount need `/dev/fuse` and `fusermount3`; without them they
//! fail with a message saying so (they are never skipped).

#![allow(dead_code)]

use std::fs::File;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The `morris` binary under test.
pub const MORRIS: &str = env!("CARGO_BIN_EXE_morris");

/// The key files of every volume the tests of this process make (one
/// volume key and its client key; every cluster shares them).
pub struct TestKeys {
    /// The volume key: servers and admin commands.
    pub volume: PathBuf,
    /// The client key: mounts and NFS gateways.
    pub client: PathBuf,
}

/// The test key files, made once by `morris key new` under the target
/// directory (kept between runs; made again if missing).
pub fn keys() -> &'static TestKeys {
    static KEYS: std::sync::OnceLock<TestKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = base.join("test-keys");
        let keys = TestKeys {
            volume: dir.join("volume.key"),
            client: dir.join("client.key"),
        };
        if keys.volume.exists() && keys.client.exists() {
            return keys;
        }
        // Made aside and renamed into place: test binaries may race here.
        let tmp = base.join(format!("test-keys.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let o = Command::new(MORRIS)
            .arg("key")
            .arg("new")
            .arg(&tmp)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {MORRIS}: {e}"));
        assert!(o.status.success(), "morris key new failed: {}", both(&o));
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        assert!(
            keys.volume.exists() && keys.client.exists(),
            "no test keys in {}",
            dir.display()
        );
        keys
    })
}

/// A `morris` command that proves the volume key (as servers and admin
/// commands do); `--key` on its command line overrides it.
pub fn morris_cmd() -> Command {
    let mut c = Command::new(MORRIS);
    c.env("MORRIS_KEY", &keys().volume);
    c
}

/// The client key's file as an argument.
pub fn client_key() -> String {
    keys().client.display().to_string()
}

/// Runs `morris` with `args` (with the volume key) and returns its output.
pub fn morris(args: &[&str]) -> Output {
    morris_cmd()
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {MORRIS}: {e}"))
}

/// A command's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Both streams, for assertion messages.
pub fn both(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        stdout(o),
        stderr(o)
    )
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("cannot bind an ephemeral port");
    l.local_addr().expect("no local address").port()
}

/// A first port P such that P .. P+n are all free right now.
pub fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let p = free_port();
        if u32::from(p) + u32::from(n) > 65_000 {
            continue;
        }
        let all: Vec<_> = (p..p + n)
            .map(|q| TcpListener::bind(("127.0.0.1", q)))
            .collect();
        if all.iter().all(Result::is_ok) {
            return p;
        }
    }
    panic!("cannot find {n} consecutive free ports");
}

/// Panics unless FUSE can be used here.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs FUSE but /dev/fuse is missing (load the fuse module, or give the \
         container --device /dev/fuse --cap-add SYS_ADMIN)"
    );
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "this test needs fusermount3, which is not on PATH (run scripts/setup.sh: it installs fuse3)"
    );
}

/// True if the running user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True if `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy().replace(' ', "\\040");
    text.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == want))
}

/// Waits for a child to exit, at most `limit`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            _ => return None,
        }
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a pid we started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// True if a process with this pid exists (zombies count as gone only once reaped).
pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// The contents of a file, or a note that it is unreadable.
pub fn read_log(path: &Path) -> String {
    let mut s = String::new();
    match File::open(path) {
        Ok(mut f) => {
            let _ = f.read_to_string(&mut s);
            s
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Makes a child die with the thread that started it.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// How a cluster is set up.
#[derive(Debug, Clone)]
pub struct ClusterOpts {
    /// The servers' lease duration.
    pub lease_ms: u32,
    /// `--stripe-unit` for format.
    pub stripe_unit: String,
    /// `--replicas` for format.
    pub replicas: u8,
    /// Run `morris format` (else the servers stay unformatted).
    pub format: bool,
    /// Extra `morris server` arguments, at every start and restart.
    pub server_args: Vec<String>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            lease_ms: 1500,
            stripe_unit: "64K".into(),
            replicas: 1,
            format: true,
            server_args: Vec::new(),
        }
    }
}

/// One server process.
pub struct ServerProc {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Its data directory.
    pub data: PathBuf,
    /// Its log file.
    pub log: PathBuf,
    child: Option<Child>,
}

impl ServerProc {
    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A set of running servers, formatted into one volume unless asked not to.
pub struct Cluster {
    /// The servers, in layout order.
    pub servers: Vec<ServerProc>,
    /// The volume uuid, once formatted.
    pub uuid: Option<String>,
    /// The options it was started with.
    pub opts: ClusterOpts,
    dir: TempDir,
}

fn spawn_server(
    data: &Path,
    log: &Path,
    addr: &str,
    lease_ms: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .expect("cannot open a server log");
    let err = out.try_clone().expect("cannot clone a file handle");
    let mut cmd = morris_cmd();
    cmd.arg("server")
        .arg("--data")
        .arg(data)
        .arg("--listen")
        .arg(addr)
        .arg("--lease-ms")
        .arg(lease_ms.to_string())
        .args(extra)
        .envs(env.iter().copied())
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    die_with_parent(&mut cmd);
    cmd.spawn().expect("cannot start morris server")
}

/// Waits until `addr` accepts connections; `Err` with the exit status if the
/// process exits first.
fn wait_listening(child: &mut Child, addr: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}"));
        }
        if TcpStream::connect_timeout(
            &addr.parse().expect("bad address"),
            Duration::from_millis(200),
        )
        .is_ok()
        {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err("not listening after 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

impl Cluster {
    /// Starts `n` servers and (unless `opts.format` is false) formats them.
    pub fn start(n: usize, opts: ClusterOpts) -> Cluster {
        Cluster::start_at(n, opts, None)
    }

    /// `n` servers formatted with `--replicas 2` (otherwise the defaults).
    pub fn start_mirrored(n: usize) -> Cluster {
        Cluster::start(
            n,
            ClusterOpts {
                replicas: 2,
                ..ClusterOpts::default()
            },
        )
    }

    /// Like [`Cluster::start`], but the servers' data directories are
    /// `data_root/server-<i>` (e.g. on a small tmpfs); logs stay in the
    /// cluster's temporary directory.
    pub fn start_with_data_root(n: usize, opts: ClusterOpts, data_root: &Path) -> Cluster {
        Cluster::start_at(n, opts, Some(data_root))
    }

    fn start_at(n: usize, opts: ClusterOpts, data_root: Option<&Path>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("morris-cluster-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut c = Cluster {
            servers: Vec::new(),
            uuid: None,
            opts,
            dir,
        };
        for i in 0..n {
            let data = data_root
                .unwrap_or(c.dir.path())
                .join(format!("server-{i}"));
            let log = c.dir.path().join(format!("server-{i}.log"));
            let mut last = String::new();
            let mut started = None;
            // A free port can be taken between finding and binding it: retry.
            for _ in 0..5 {
                let addr = format!("127.0.0.1:{}", free_port());
                let extra: Vec<&str> = c.opts.server_args.iter().map(String::as_str).collect();
                let mut child = spawn_server(&data, &log, &addr, c.opts.lease_ms, &extra, &[]);
                match wait_listening(&mut child, &addr) {
                    Ok(()) => {
                        started = Some((addr, child));
                        break;
                    }
                    Err(e) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        last = e;
                    }
                }
            }
            let Some((addr, child)) = started else {
                panic!(
                    "server {i} did not start ({last}); its log:\n{}",
                    read_log(&log)
                );
            };
            c.servers.push(ServerProc {
                addr,
                data,
                log,
                child: Some(child),
            });
        }
        if c.opts.format {
            c.format();
        }
        c
    }

    /// Formats the servers with `morris format`.
    pub fn format(&mut self) {
        let servers = self.addrs().join(",");
        let o = morris(&[
            "format",
            "--servers",
            &servers,
            "--stripe-unit",
            &self.opts.stripe_unit,
            "--replicas",
            &self.opts.replicas.to_string(),
        ]);
        assert!(o.status.success(), "morris format failed: {}", both(&o));
        let out = stdout(&o);
        let uuid = out
            .lines()
            .find_map(|l| l.strip_prefix("formatted volume "))
            .unwrap_or_else(|| panic!("no uuid in format output:\n{out}"));
        self.uuid = Some(uuid.trim().to_string());
    }

    /// Server addresses in layout order.
    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// Address of server `i`.
    pub fn addr(&self, i: usize) -> &str {
        &self.servers[i].addr
    }

    /// PIDs of the running servers (`None` for a killed one).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.servers.iter().map(ServerProc::pid).collect()
    }

    /// The cluster's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The volume uuid (panics if not formatted).
    pub fn uuid(&self) -> &str {
        self.uuid.as_deref().expect("the cluster is not formatted")
    }

    /// Kills server `i` with SIGKILL and reaps it.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its address and data (after `kill9`).
    pub fn restart(&mut self, i: usize) {
        self.restart_with(i, &[]);
    }

    /// Like [`Cluster::restart`], with extra `morris server` arguments.
    pub fn restart_with(&mut self, i: usize, extra: &[&str]) {
        self.restart_env(i, extra, &[]);
    }

    /// Like [`Cluster::restart_with`], with extra environment variables.
    pub fn restart_env(&mut self, i: usize, extra: &[&str], env: &[(&str, &str)]) {
        self.kill9(i);
        let s = &mut self.servers[i];
        let mut all: Vec<&str> = self.opts.server_args.iter().map(String::as_str).collect();
        all.extend_from_slice(extra);
        let mut child = spawn_server(&s.data, &s.log, &s.addr, self.opts.lease_ms, &all, env);
        if let Err(e) = wait_listening(&mut child, &s.addr) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "server {i} did not restart on {} ({e}); its log:\n{}",
                s.addr,
                read_log(&s.log)
            );
        }
        s.child = Some(child);
    }

    /// Mounts the volume with `morris mount ADDR DIR` (foreground child) and
    /// waits until the kernel lists the mount.
    pub fn mount(&self) -> Mount {
        Mount::start(self.addr(0), &[])
    }

    /// All server logs, for assertion messages.
    pub fn logs(&self) -> String {
        self.servers
            .iter()
            .enumerate()
            .map(|(i, s)| format!("--- server {i} log\n{}", read_log(&s.log)))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill9(i);
        }
    }
}

/// A FUSE mount served by a foreground `morris mount` child process.
pub struct Mount {
    /// The mount point.
    pub path: PathBuf,
    /// The mount process's log (stdout and stderr).
    pub log: PathBuf,
    child: Option<Child>,
    _dir: Option<TempDir>,
}

impl Mount {
    /// Runs `morris mount ADDR <tempdir> EXTRA...` and waits for the mount.
    pub fn start(addr: &str, extra: &[&str]) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("morris-mount-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let path = dir
            .path()
            .canonicalize()
            .expect("cannot resolve a temporary directory")
            .join("mnt");
        std::fs::create_dir(&path).expect("cannot create the mount point");
        let log = dir.path().join("mount.log");
        let mut m = Mount::start_at(addr, &path, &log, extra);
        m._dir = Some(dir);
        m
    }

    /// Runs `morris mount ADDR PATH EXTRA...` (an existing, absolute
    /// directory), logging to `log`, and waits until it says it has mounted
    /// and `path` is a mount point.
    pub fn start_at(addr: &str, path: &Path, log: &Path, extra: &[&str]) -> Mount {
        require_fuse();
        let out = File::create(log).expect("cannot create the mount log");
        let err = out.try_clone().expect("cannot clone a file handle");
        let mut cmd = morris_cmd();
        cmd.arg("mount")
            .arg(addr)
            .arg(path)
            .arg("--key")
            .arg(&keys().client)
            .args(extra);
        if !is_root() {
            cmd.arg("--no-allow-other");
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("cannot start morris mount");
        let start = Instant::now();
        while !(is_mounted(path) && read_log(log).contains("mounted volume")) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "morris mount exited with {status} before mounting; its log:\n{}",
                    read_log(log)
                );
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} not mounted after 30 s; morris mount log:\n{}",
                    path.display(),
                    read_log(log)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Mount {
            path: path.to_path_buf(),
            log: log.to_path_buf(),
            child: Some(child),
            _dir: None,
        }
    }

    /// The mount process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits (at most `limit`) for the mount process to exit on its own.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let status = wait_timeout(child, limit);
        if status.is_some() {
            self.child = None;
        }
        status
    }
}

impl Drop for Mount {
    /// Unmounts (by path) and ends the process, if it still runs; a process
    /// that has exited by itself is not asked about, nor is its path,
    /// where something else may be mounted by now.
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        for attempt in 0..20 {
            if !is_mounted(&self.path) {
                break;
            }
            let mut cmd = Command::new("fusermount3");
            cmd.arg("-u");
            if attempt >= 10 {
                cmd.arg("-z");
            }
            let _ = cmd.arg(&self.path).stderr(Stdio::null()).status();
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(mut child) = self.child.take() {
            if wait_timeout(&mut child, Duration::from_secs(20)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Mount {
    /// Kills the mount process with SIGKILL (as a crash would), reaps it and
    /// lazily detaches its now dead mount point.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            if wait_timeout(&mut child, Duration::from_secs(3)).is_none() {
                // A thread of it is stuck in the kernel: an invalidation
                // waiting for a directory lock that a request to this very
                // mount holds, which nobody will answer now. The process
                // cannot end, so its FUSE connection does not either, until
                // it is aborted: a forced unmount does that.
                eprintln!(
                    "mount process {} not gone 3 s after SIGKILL: aborting its FUSE connection",
                    child.id()
                );
                let _ = Command::new("umount")
                    .arg("-f")
                    .arg(&self.path)
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = child.wait();
        }
        for _ in 0..50 {
            if !is_mounted(&self.path) {
                return;
            }
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.path)
                .stderr(Stdio::null())
                .status();
            if is_mounted(&self.path) {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&self.path)
                    .stderr(Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{} is still mounted after killing its mount process",
            self.path.display()
        );
    }

    /// Lets every user reach the mount point: the temporary directory that
    /// holds it is created 0700.
    pub fn open_to_all_users(&self) {
        use std::os::unix::fs::PermissionsExt;
        let parent = self
            .path
            .parent()
            .expect("a mount point has a parent directory");
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", parent.display()));
    }
}

/// Asserts that `r` failed with errno `want`; `what` names the operation.
pub fn expect_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    let wanted = std::io::Error::from_raw_os_error(want);
    match r {
        Ok(v) => panic!("{what}: expected the error \"{wanted}\", but it succeeded with {v:?}"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(want),
            "{what}: expected the error \"{wanted}\", got \"{e}\""
        ),
    }
}

/// Calls `f` until it returns `Ok`, at most for `limit`; panics with a
/// message naming `what` (and the last thing `f` reported) if it never does.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    let mut last;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        if start.elapsed() > limit {
            panic!("{what}: still failing after {limit:?}; last error: {last}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Closes `f` with close(2) and returns its result (dropping a `File`
/// ignores the error a close can report, e.g. a failed write-back).
pub fn close_checked(f: File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: we own `fd` (taken out of the File) and close it once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A deterministic pseudo-random byte pattern: byte `i` of stream `seed`.
/// Cheap to regenerate for any offset, so big files need not be kept in memory.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = offset;
    while out.len() < len {
        let word = pos / 8;
        let mut x =
            (seed ^ word.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(0x632B_E59B_D9B4_E019);
        x ^= x >> 30;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        let bytes = x.to_le_bytes();
        let start = (pos % 8) as usize;
        let take = (8 - start).min(len - out.len());
        out.extend_from_slice(&bytes[start..start + take]);
        pos += take as u64;
    }
    out
}

/// Runs `morris fsck ADDR` and returns (exit success, stdout, everything for messages).
pub fn fsck(addr: &str) -> (bool, String, String) {
    let o = morris(&["fsck", addr, "--all"]);
    (o.status.success(), stdout(&o), both(&o))
}

/// A server of a `k`-server volume that owns neither the inodes of `paths`
/// nor the root directory: tests that kill it lose only data-block copies
/// and the secondary copy of metadata (`kill -9` refuses connections, so
/// the metadata primaries go on without it).
pub fn copy_only_server(k: u32, paths: &[&Path]) -> usize {
    use std::os::unix::fs::MetadataExt;
    let mut owners = vec![(1 % u64::from(k)) as u32];
    for p in paths {
        let ino = std::fs::metadata(p).expect("stat").ino();
        owners.push((ino % u64::from(k)) as u32);
    }
    (0..k)
        .find(|s| !owners.contains(s))
        .expect("a server besides the owners") as usize
}

/// A server of a mirrored `k`-server volume whose *silence* (`SIGSTOP`, a
/// cut link) costs only data-block copies: it is neither the primary (`id
/// mod k`) nor the secondary (the next server) of the metadata range of the
/// root or of `paths`. A silent secondary stops its primary (the static
/// two-copy rule: a secondary that cannot be told from a cut-off one might
/// take over), so such tests must not pick one.
pub fn quiet_server(k: u32, paths: &[&Path]) -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    let mut busy = vec![1 % k, 2 % k];
    for p in paths {
        let o = (std::fs::metadata(p).expect("stat").ino() % u64::from(k)) as u32;
        busy.push(o);
        busy.push((o + 1) % k);
    }
    (0..k).find(|s| !busy.contains(s)).map(|s| s as usize)
}

/// Creates empty files `dir/name`, `dir/name.1`, ... until one leaves a
/// [`quiet_server`]; returns that file and the server.
pub fn create_with_quiet_server(k: u32, dir: &Path, name: &str) -> (PathBuf, usize) {
    for i in 0..4 * k {
        let p = if i == 0 {
            dir.join(name)
        } else {
            dir.join(format!("{name}.{i}"))
        };
        std::fs::write(&p, b"").expect("create");
        if let Some(v) = quiet_server(k, &[&p]) {
            return (p, v);
        }
    }
    panic!("no file in {} leaves a quiet server", dir.display());
}

/// A single-member etcd (Debian's `etcd-server`) on free loopback ports,
/// in a temporary directory; killed when dropped.
pub struct EtcdProc {
    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub url: String,
    child: Child,
    _dir: TempDir,
}

/// The certificates of an etcd reached over TLS (`EtcdProc::start_tls`).
pub struct EtcdTls {
    /// PEM files: the CA, etcd's certificate and key, a client's
    /// certificate and key.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl EtcdProc {
    /// Starts etcd and waits until it answers.
    pub fn start() -> EtcdProc {
        Self::start_with(None)
    }

    /// Starts etcd serving clients over TLS only and asking them for a
    /// certificate signed by `tls.ca` (`--client-cert-auth`).
    pub fn start_tls(tls: &EtcdTls) -> EtcdProc {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&EtcdTls>) -> EtcdProc {
        let etcd = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("etcd not found: install Debian's etcd-server (scripts/setup.sh does)");
        let dir = tempfile::Builder::new()
            .prefix("morris-etcd-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://127.0.0.1:{client}");
        let log = File::create(dir.path().join("etcd.log")).expect("etcd log");
        let mut cmd = Command::new(etcd);
        cmd.arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&url)
            .arg("--advertise-client-urls")
            .arg(&url)
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{peer}"))
            .arg("--initial-cluster")
            .arg(format!("test=http://127.0.0.1:{peer}"))
            // /health in plain HTTP, whatever the client side speaks.
            .arg("--listen-metrics-urls")
            .arg(format!("http://127.0.0.1:{metrics}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone"))
            .stderr(log);
        if let Some(t) = tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("cannot start etcd");
        let addr = format!("127.0.0.1:{metrics}");
        let start = Instant::now();
        loop {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                use std::io::Write;
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
                let mut body = String::new();
                let _ = s.read_to_string(&mut body);
                if body.contains("\"health\":\"true\"") {
                    break;
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "etcd exited with {st}:\n{}",
                    read_log(&dir.path().join("etcd.log"))
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd not healthy after 30 s:\n{}",
                read_log(&dir.path().join("etcd.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        EtcdProc {
            url,
            child,
            _dir: dir,
        }
    }
}

impl Drop for EtcdProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The whole content of `path` (panics with the path on failure).
pub fn read_all(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut out))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    out
}

/// The address of a server that is running (server 0 may be the lost one).
pub fn live(c: &Cluster) -> &str {
    let i = c
        .pids()
        .iter()
        .position(Option::is_some)
        .expect("a running server");
    c.addr(i)
}

/// `morris status --json` through a running server.
pub fn status(c: &Cluster) -> serde_json::Value {
    let o = morris(&["status", live(c), "--json"]);
    assert!(o.status.success(), "{}", both(&o));
    serde_json::from_slice(&o.stdout).expect("status json")
}

/// Waits until `morris status` calls the volume healthy (the resync done).
/// Requests of `op` served so far, summed over the servers.
pub fn served(c: &Cluster, op: &str) -> u64 {
    let st = status(c);
    st["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .flat_map(|s| {
            s["stats"]["requests_by_op"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|p| p[0] == op)
        .filter_map(|p| p[1].as_u64())
        .sum()
}

/// Drops what the page cache holds of `path` (as memory pressure would),
/// so that the next read reaches the mount: a mount's kernel keeps a
/// file's pages across opens while its lease on the file stays.
pub fn drop_kernel_pages(path: &Path) {
    let f = std::fs::File::open(path).expect("open to drop its pages");
    // SAFETY: posix_fadvise has no memory-safety preconditions.
    let r = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(r, 0, "posix_fadvise DONTNEED of {}", path.display());
}

/// Requests of each op in `ops` served while `f` ran.
pub fn served_during(
    c: &Cluster,
    ops: &[&str],
    f: impl FnOnce(),
) -> std::collections::BTreeMap<String, u64> {
    let before: Vec<u64> = ops.iter().map(|op| served(c, op)).collect();
    f();
    ops.iter()
        .zip(before)
        .map(|(op, b)| (op.to_string(), served(c, op) - b))
        .collect()
}

pub fn wait_healthy(c: &Cluster) {
    wait_for(
        Duration::from_secs(90),
        "the volume to be healthy again",
        || {
            let s = status(c);
            if s["health"] == "healthy" {
                Ok(())
            } else {
                Err(serde_json::to_string(&s["servers"]).unwrap_or_default())
            }
        },
    );
}

/// Runs `morris fsck` and checks it found nothing wrong.
pub fn fsck_clean(c: &Cluster) {
    let (ok, out, all) = fsck(c.addr(0));
    assert!(ok, "fsck failed:\n{all}");
    for want in ["0 errors", "0 orphan data files", "0 stale copies"] {
        assert!(out.contains(want), "fsck is not clean ({want}):\n{all}");
    }
}

// fcntl locks, for the lock tests (locks.rs, nfs.rs).

/// A `struct flock` for `typ` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) over
/// `len` bytes from `start` (`len` 0: to the end of the file).
pub fn flock_struct(typ: i32, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: typ as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

/// `fcntl(F_SETLK)`, or `F_SETLKW` with `wait`.
pub fn setlk(f: &File, typ: i32, start: i64, len: i64, wait: bool) -> std::io::Result<()> {
    let mut fl = flock_struct(typ, start, len);
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    let r = unsafe { libc::fcntl(std::os::unix::io::AsRawFd::as_raw_fd(f), cmd, &mut fl) };
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `fcntl(F_GETLK)`: the first conflicting lock, or `F_UNLCK`.
pub fn getlk(f: &File, typ: i32, start: i64, len: i64) -> libc::flock {
    let mut fl = flock_struct(typ, start, len);
    let r = unsafe {
        libc::fcntl(
            std::os::unix::io::AsRawFd::as_raw_fd(f),
            libc::F_GETLK,
            &mut fl,
        )
    };
    assert_eq!(r, 0, "F_GETLK: {}", std::io::Error::last_os_error());
    fl
}

/// Opens (creating) `p` for reading and writing.
pub fn open_rw(p: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

/// Panics unless `r` failed with `EAGAIN` (or `EACCES`, which POSIX allows).
pub fn would_block(r: std::io::Result<()>, what: &str) {
    match r {
        Err(e)
            if e.raw_os_error() == Some(libc::EAGAIN) || e.raw_os_error() == Some(libc::EACCES) => {
        }
        other => panic!("{what}: expected EAGAIN, got {other:?}"),
    }
}

/// `renameat2(2)` of two paths with `flags` (`RENAME_EXCHANGE`,
/// `RENAME_NOREPLACE`, ...).
pub fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL");
    let (f, t) = (cstr(from), cstr(to));
    // SAFETY: two valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A four-server volume and two mounts of it (two `morris mount`
/// processes, so two clients), through servers 0 and 2.
pub struct TwoMounts {
    pub a: Mount,
    pub b: Mount,
    pub c: Cluster,
}

impl TwoMounts {
    /// Starts the volume with `opts` and both mounts with `extra` options.
    pub fn start(opts: ClusterOpts, extra: &[&str]) -> TwoMounts {
        let c = Cluster::start(4, opts);
        let a = Mount::start(c.addr(0), extra);
        let b = Mount::start(c.addr(2), extra);
        TwoMounts { a, b, c }
    }

    /// Both mounts with the kernel's caches kept for ten minutes: what each
    /// sees of the other's changes can only come from lease recalls
    /// invalidating them.
    pub fn long_ttl() -> TwoMounts {
        TwoMounts::start(ClusterOpts::default(), &["--attr-ttl-ms", "600000"])
    }

    /// Both mounts' logs and the servers', for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- mount A log\n{}--- mount B log\n{}{}",
            read_log(&self.a.log),
            read_log(&self.b.log),
            self.c.logs()
        )
    }
}

/// The first offset at which `got` and `want` differ (the shorter one's
/// length if one is a prefix of the other).
pub fn first_difference(got: &[u8], want: &[u8]) -> usize {
    got.iter()
        .zip(want)
        .position(|(x, y)| x != y)
        .unwrap_or(got.len().min(want.len()))
}

/// Panics unless `got == want`, naming the first differing offset and the
/// bytes around it, followed by `context` (logs).
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str, context: &str) {
    if got != want {
        let first = first_difference(got, want);
        let around = |d: &[u8]| {
            let from = first.saturating_sub(16).min(d.len());
            let to = (first + 48).min(d.len());
            format!("{:?}", String::from_utf8_lossy(&d[from..to]))
        };
        panic!(
            "{what}: got {} bytes, want {} bytes, first difference at offset {first}\n\
             got  (from offset {}): {}\nwant (from offset {}): {}\n{context}",
            got.len(),
            want.len(),
            first.saturating_sub(16),
            around(got),
            first.saturating_sub(16),
            around(want),
        );
    }
}

/// The attributes of a new empty regular file of `uid` and `gid`, mode
/// 0644, for raw `CreateInode` requests.
pub fn new_file_attr(uid: u32, gid: u32) -> morris_proto::Attr {
    let now = morris_proto::Timestamp::now();
    morris_proto::Attr {
        kind: morris_proto::FileKind::File,
        mode: 0o644,
        uid,
        gid,
        nlink: 1,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        rdev: 0,
        flags: 0,
    }
}
