//! The consistency checker (`morris-consistency`, crates/morris-consistency)
//! run against real morris volumes: four `morris server` processes, two FUSE
//! mounts (two `morris mount` processes) and, for the workloads that have an
//! NFS meaning, the NFS gateway — each workload ~20 s with a fixed seed,
//! with `--replicas 1`, and with `--replicas 2` while the test kills one
//! server with SIGKILL and restarts it (the checker itself never kills). The
//! checker must find zero violations.
//!
//! Also: every workload against a local directory (the checker's own
//! false-positive check, no morris involved), and end-to-end proof that the
//! checker can fail (a file replaced by zeros behind its back, a name
//! nobody made); its verifiers are unit-tested in the crate itself.
//!
//! On 28353db (issue 13) every volume test failed in every run but sqlite,
//! which failed now and then. The checker
//! binary is built here with cargo (same profile and target directory) when
//! the test binary is built without it.

mod common;
mod nfs_harness;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{read_log, wait_timeout, Cluster, ClusterOpts, Mount, MORRIS};
use nfs_harness::Gateway;

/// Seconds each workload runs on a volume.
const SECONDS: u64 = 20;
/// The seed of every volume run (printed with any violation, to replay).
const SEED: u64 = 20_261_125;

/// The `morris-consistency` binary, built once per test binary with the
/// cargo that builds this test (same profile, same target directory).
fn checker() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin_dir = Path::new(MORRIS)
            .parent()
            .expect("the morris binary has a directory");
        let target_dir = bin_dir.parent().expect("a target directory");
        let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
        cmd.args([
            "build",
            "-q",
            "-p",
            "morris-consistency",
            "--bin",
            "morris-consistency",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
        if bin_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let o = cmd
            .output()
            .expect("cannot run cargo to build morris-consistency");
        assert!(
            o.status.success(),
            "cannot build morris-consistency: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let bin = bin_dir.join("morris-consistency");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

/// A running checker: its stdout and stderr go to files.
struct Run {
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

/// What a finished checker said.
struct Outcome {
    status: ExitStatus,
    summaries: Vec<serde_json::Value>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// The whole output, for assertion messages.
    fn text(&self) -> String {
        format!(
            "checker exit {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    fn violations(&self) -> u64 {
        self.summaries
            .iter()
            .map(|s| s["violations"].as_u64().unwrap_or(0))
            .sum()
    }

    fn summary(&self, workload: &str) -> &serde_json::Value {
        self.summaries
            .iter()
            .find(|s| s["workload"] == workload)
            .unwrap_or_else(|| panic!("no summary of {workload}:\n{}", self.text()))
    }
}

impl Run {
    fn start(args: &[String]) -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("stdout");
        let err = dir.path().join("stderr");
        let child = Command::new(checker())
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .spawn()
            .expect("cannot start morris-consistency");
        Run {
            child: Some(child),
            out,
            err,
            args: args.to_vec(),
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Waits for the checker, at most `limit` (then kills it: its workers
    /// die with it).
    fn finish(mut self, limit: Duration) -> Outcome {
        let mut child = self.child.take().expect("started");
        let status = match wait_timeout(&mut child, limit) {
            Some(s) => s,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "morris-consistency {:?} still running after {limit:?}; killed. stderr:\n{}",
                    self.args,
                    read_log(&self.err)
                );
            }
        };
        let stdout = read_log(&self.out);
        let summaries = stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).expect("a JSON summary line"))
            .collect();
        Outcome {
            status,
            summaries,
            stdout,
            stderr: read_log(&self.err),
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------- local

/// Every workload on a local directory, given as two "mounts" (the same
/// directory twice): no violation. Run on the temporary directory's file
/// system and, where there is one, on tmpfs.
#[test]
fn every_workload_passes_on_a_local_directory() {
    let mut roots = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        roots.push(PathBuf::from("/dev/shm"));
    }
    for root in roots {
        let dir = tempfile::Builder::new()
            .prefix("morris-consistency-local-")
            .tempdir_in(&root)
            .expect("tempdir");
        let d = dir.path().display().to_string();
        let run = Run::start(&strings(&[
            "--workload",
            "all",
            "--dir",
            &d,
            "--dir",
            &d,
            "--seconds",
            "3",
            "--seed",
            "7",
            "--procs",
            "3",
            "--sqlite-all-mounts",
        ]));
        let o = run.finish(Duration::from_secs(300));
        assert!(o.status.success(), "on {}: {}", root.display(), o.text());
        assert_eq!(o.violations(), 0, "on {}: {}", root.display(), o.text());
        for w in [
            "append",
            "rename-replace",
            "create-unlink",
            "open-unlinked",
            "listing",
            "sqlite",
        ] {
            let s = o.summary(w);
            assert!(s["skipped"].is_null(), "{w} skipped: {}", o.text());
            assert!(
                s["ops"].as_u64().unwrap_or(0) > 0,
                "{w} did nothing on {}: {}",
                root.display(),
                o.text()
            );
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("readdir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(left.is_empty(), "run directories left behind: {left:?}");
    }
}

/// The run directory of `workload` started by the checker with `pid`.
fn run_dir(base: &Path, workload: &str, seed: u64, pid: u32) -> PathBuf {
    base.join(format!("mc-{workload}-{seed}-{pid}"))
}

/// Waits until `p` exists (the checker made it), at most 30 s.
fn wait_exists(p: &Path) {
    let start = Instant::now();
    while !p.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The checker can fail: while rename-replace runs on a local directory,
/// the test keeps renaming a file of 4096 zero bytes over `target` (what
/// users saw on morris). The readers must report it, the exit status must
/// be 1 and the replay command printed.
#[test]
fn the_checker_reports_a_target_replaced_by_zeros() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let run = Run::start(&strings(&[
        "--workload",
        "rename-replace",
        "--dir",
        &d,
        "--seconds",
        "3",
        "--seed",
        "5",
        "--procs",
        "2",
    ]));
    let rd = run_dir(dir.path(), "rename-replace", 5, run.pid());
    wait_exists(&rd.join("target"));
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(2500) {
        let z = rd.join(format!("zeros.{n}"));
        if std::fs::write(&z, vec![0u8; 4096]).is_ok() {
            let _ = std::fs::rename(&z, rd.join("target"));
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = run.finish(Duration::from_secs(200));
    assert_eq!(o.status.code(), Some(1), "{}", o.text());
    let s = o.summary("rename-replace");
    assert!(
        s["violations_by_kind"]["zero-read"].as_u64().unwrap_or(0) > 0,
        "no zero-read reported: {}",
        o.text()
    );
    assert!(o.stderr.contains("4096 zero bytes"), "{}", o.text());
    assert!(
        o.stderr.contains("replay: ") && o.stderr.contains("--seed 5"),
        "{}",
        o.text()
    );
}

/// The checker can fail: a name nobody made shows up in the listed
/// directory (the test creates it behind the checker's back).
#[test]
fn the_checker_reports_a_name_nobody_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let run = Run::start(&strings(&[
        "--workload",
        "listing",
        "--dir",
        &d,
        "--seconds",
        "2",
        "--seed",
        "6",
        "--procs",
        "1",
    ]));
    let rd = run_dir(dir.path(), "listing", 6, run.pid());
    wait_exists(&rd.join("r.0099"));
    std::fs::write(rd.join("intruder"), b"x").expect("create the intruder");
    let o = run.finish(Duration::from_secs(200));
    assert_eq!(o.status.code(), Some(1), "{}", o.text());
    let s = o.summary("listing");
    for kind in ["unknown-name", "final-listing"] {
        assert!(
            s["violations_by_kind"][kind].as_u64().unwrap_or(0) > 0,
            "no {kind} reported: {}",
            o.text()
        );
    }
}

// ---------------------------------------------------------------- volumes

/// A four-server volume, two FUSE mounts (through different servers) and
/// the gateway (through a third).
struct Volume {
    a: Mount,
    b: Mount,
    gw: Gateway,
    dir: String,
    c: Cluster,
}

impl Volume {
    fn new(replicas: u8) -> Volume {
        let c = Cluster::start(
            4,
            ClusterOpts {
                replicas,
                ..ClusterOpts::default()
            },
        );
        let a = Mount::start(c.addr(0), &[]);
        let b = Mount::start(c.addr(2), &[]);
        let gw = Gateway::start(c.addr(1), &["--no-rpcbind"]);
        std::fs::create_dir(a.path.join("t")).expect("mkdir t");
        Volume {
            a,
            b,
            gw,
            dir: "t".into(),
            c,
        }
    }

    fn logs(&self) -> String {
        let tail = |p: &Path| {
            let s = read_log(p);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(60)..].join("\n")
        };
        format!(
            "--- mount A log (tail)\n{}\n--- mount B log (tail)\n{}\n--- gateway log (tail)\n{}\n",
            tail(&self.a.log),
            tail(&self.b.log),
            tail(&self.gw.log)
        )
    }

    /// The server owning the test directory's inode (and so its entries).
    fn dir_owner(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(self.a.path.join(&self.dir))
            .expect("stat t")
            .ino();
        (ino % self.c.servers.len() as u64) as usize
    }
}

/// How a volume run is disturbed.
#[derive(Clone, Copy)]
enum Chaos {
    /// Nothing happens to the servers.
    None,
    /// One server (the test directory's owner) is killed with SIGKILL a
    /// third of the way in and restarted at two thirds.
    KillAndRestart,
}

/// Runs `workload` on a fresh volume through both mounts (and the gateway
/// if `nfs`) and asserts that the checker found nothing.
fn on_volume(workload: &str, replicas: u8, chaos: Chaos, nfs: bool) {
    let mut v = Volume::new(replicas);
    let mut args = strings(&["--workload", workload]);
    for m in [&v.a, &v.b] {
        args.push("--dir".into());
        args.push(m.path.join(&v.dir).display().to_string());
    }
    if nfs {
        args.push("--nfs".into());
        args.push(format!("127.0.0.1:{}/{}", v.gw.port, v.dir));
    }
    args.extend(strings(&[
        "--seconds",
        &SECONDS.to_string(),
        "--seed",
        &SEED.to_string(),
        "--procs",
        "3",
    ]));
    let run = Run::start(&args);
    let mut events = String::new();
    if let Chaos::KillAndRestart = chaos {
        let victim = v.dir_owner();
        std::thread::sleep(Duration::from_secs(SECONDS / 3));
        v.c.kill9(victim);
        events.push_str(&format!("server {victim} killed at ~{} s; ", SECONDS / 3));
        std::thread::sleep(Duration::from_secs(SECONDS / 3));
        v.c.restart(victim);
        events.push_str(&format!("restarted at ~{} s", 2 * SECONDS / 3));
    }
    let o = run.finish(Duration::from_secs(SECONDS + 300));
    assert!(
        o.violations() == 0 && o.status.success(),
        "{workload} with --replicas {replicas} ({events}): {}\n{}",
        o.text(),
        v.logs()
    );
    let s = o.summary(workload);
    assert!(
        s["ops"].as_u64().unwrap_or(0) > 0 && s["skipped"].is_null(),
        "{workload} did nothing: {}",
        o.text()
    );
}

#[test]
fn append_replicas_1() {
    on_volume("append", 1, Chaos::None, false);
}

#[test]
fn append_replicas_2_with_a_server_killed() {
    on_volume("append", 2, Chaos::KillAndRestart, false);
}

#[test]
fn rename_replace_replicas_1() {
    on_volume("rename-replace", 1, Chaos::None, true);
}

#[test]
fn rename_replace_replicas_2_with_a_server_killed() {
    on_volume("rename-replace", 2, Chaos::KillAndRestart, true);
}

#[test]
fn create_unlink_replicas_1() {
    on_volume("create-unlink", 1, Chaos::None, true);
}

#[test]
fn create_unlink_replicas_2_with_a_server_killed() {
    on_volume("create-unlink", 2, Chaos::KillAndRestart, true);
}

#[test]
fn open_unlinked_replicas_1() {
    on_volume("open-unlinked", 1, Chaos::None, true);
}

#[test]
fn open_unlinked_replicas_2_with_a_server_killed() {
    on_volume("open-unlinked", 2, Chaos::KillAndRestart, true);
}

#[test]
fn listing_replicas_1() {
    on_volume("listing", 1, Chaos::None, true);
}

#[test]
fn listing_replicas_2_with_a_server_killed() {
    on_volume("listing", 2, Chaos::KillAndRestart, true);
}

#[test]
fn sqlite_replicas_1() {
    on_volume("sqlite", 1, Chaos::None, false);
}

#[test]
fn sqlite_replicas_2_with_a_server_killed() {
    on_volume("sqlite", 2, Chaos::KillAndRestart, false);
}
