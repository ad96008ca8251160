//! The stripe server processes of `morris up`: started, restarted when one
//! dies (with back-off), and stopped at the end.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use morris_proto::VolumeDescriptor;
use tracing::{info, warn};

use crate::admin::{self, Session};
use crate::runtime::Terminate;
use morris_proto::auth::{Key, Keys};

/// Restart delays of one server: 1 s, doubling up to 30 s; back to 1 s
/// once a run has lasted [`Backoff::STABLE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Self::FIRST }
    }
}

impl Backoff {
    /// The first delay.
    pub const FIRST: Duration = Duration::from_secs(1);
    /// The longest delay.
    pub const MAX: Duration = Duration::from_secs(30);
    /// A run at least this long resets the delay.
    pub const STABLE: Duration = Duration::from_secs(60);

    /// The delay before restarting a server that exited after running for
    /// `ran`.
    pub fn after_exit(&mut self, ran: Duration) -> Duration {
        if ran >= Self::STABLE {
            self.next = Self::FIRST;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }
}

/// What servers being down (`down[i]`) means for a volume with `replicas`
/// copies of every block and metadata range (on servers `i .. i+replicas`,
/// round the ring): available unless `replicas` neighbours are all down.
pub fn availability(down: &[bool], replicas: u8) -> String {
    let n = down.len();
    let r = usize::from(replicas.max(1)).min(n.max(1));
    let lost: Vec<usize> = (0..n)
        .filter(|&i| (0..r).all(|j| down[(i + j) % n]))
        .collect();
    let list = |v: &[usize]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let down_list: Vec<usize> = (0..n).filter(|&i| down[i]).collect();
    if down_list.is_empty() {
        return "every server is up".into();
    }
    if lost.is_empty() {
        return format!(
            "the volume stays available (replicas {replicas}: every block and metadata range \
             has a copy on a running server; the metadata of server {} pauses for a few lease \
             times while its next server takes it over)",
            list(&down_list)
        );
    }
    if r == 1 {
        return format!(
            "files with data or metadata on server {} are unavailable until it is back \
             (replicas 1: one copy of everything)",
            list(&down_list)
        );
    }
    format!(
        "data whose {r} copies all sit on down servers (the copies starting at server {}) is \
         unavailable until one of them is back",
        list(&lost)
    )
}

/// One server process slot.
struct ServerProc {
    addr: String,
    data: PathBuf,
    log: PathBuf,
    /// The running process; `None` while it waits to be restarted, or once
    /// stopped.
    child: Option<Child>,
    /// When the running process was started.
    started: Instant,
    backoff: Backoff,
    /// When to start it again after it died.
    restart_at: Option<Instant>,
    restarts: u32,
}

/// The server processes `up` runs; stopped when dropped.
pub struct ServerSet {
    exe: PathBuf,
    lease_ms: u32,
    /// The volume key file the servers prove (and `up` connects with).
    key_file: PathBuf,
    key: Key,
    procs: Vec<ServerProc>,
    /// Each server's metrics port (`--metrics 127.0.0.1:PORT`), if any.
    metrics: Option<Vec<u16>>,
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let Ok(f) = File::open(path) else {
        return String::new();
    };
    let all: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    let start = all.len().saturating_sub(lines);
    all[start..].join("\n")
}

impl ServerSet {
    /// Starts `n` servers of `exe` on 127.0.0.1 ports `port..port+n`, with
    /// data and logs in `dir`.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        exe: &Path,
        dir: &Path,
        port: u16,
        n: u16,
        lease_ms: u32,
        key_file: &Path,
        tls: bool,
        metrics: Option<Vec<u16>>,
    ) -> Result<Self> {
        let key = Keys::load(key_file)?.with_tls(tls).credential();
        let mut set = ServerSet {
            exe: exe.to_path_buf(),
            lease_ms,
            key_file: key_file.to_path_buf(),
            key,
            procs: Vec::new(),
            metrics,
        };
        for i in 0..n {
            set.procs.push(ServerProc {
                addr: format!("127.0.0.1:{}", port + i),
                data: dir.join(format!("server-{i}")),
                log: dir.join(format!("server-{i}.log")),
                child: None,
                started: Instant::now(),
                backoff: Backoff::default(),
                restart_at: None,
                restarts: 0,
            });
            let child = set.start(usize::from(i))?;
            info!(index = i, addr = %set.procs[usize::from(i)].addr, pid = child.id(), "server started");
            set.procs[usize::from(i)].child = Some(child);
        }
        Ok(set)
    }

    /// Starts server `i`'s process.
    fn start(&self, i: usize) -> Result<Child> {
        let p = &self.procs[i];
        let out = File::options()
            .create(true)
            .append(true)
            .open(&p.log)
            .with_context(|| format!("cannot open {}", p.log.display()))?;
        let err = out
            .try_clone()
            .context("cannot duplicate a log file handle")?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("server")
            .arg("--data")
            .arg(&p.data)
            .arg("--listen")
            .arg(&p.addr)
            .arg("--lease-ms")
            .arg(self.lease_ms.to_string())
            .arg("--key")
            .arg(&self.key_file)
            .args(self.key.tls().then_some("--tls"))
            .args(
                self.metrics
                    .as_ref()
                    .and_then(|m| m.get(i))
                    .map(|p| ["--metrics".to_string(), format!("127.0.0.1:{p}")])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Own process group: a terminal Ctrl-C reaches `up` only, which
            // unmounts first and then stops the servers.
            .process_group(0);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure only makes async-signal-safe syscalls.
        unsafe {
            cmd.pre_exec(move || {
                // Die with `up` even if it is killed without a chance to
                // clean up (the signal comes when the thread that started it
                // ends: `up` starts servers from its main thread only).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            });
        }
        cmd.spawn()
            .with_context(|| format!("cannot start {} server", self.exe.display()))
    }

    /// The servers' addresses, in order.
    pub fn addrs(&self) -> Vec<String> {
        self.procs.iter().map(|p| p.addr.clone()).collect()
    }

    /// `(pid, data directory, log)` of each server (pid 0 if not running).
    pub fn describe(&self) -> Vec<(u32, &Path, &Path)> {
        self.procs
            .iter()
            .map(|p| {
                (
                    p.child.as_ref().map_or(0, Child::id),
                    p.data.as_path(),
                    p.log.as_path(),
                )
            })
            .collect()
    }

    /// Waits until every server answers hello; returns their (descriptor, index).
    pub async fn wait_ready(
        &mut self,
        term: &mut Terminate,
    ) -> Result<Vec<(Option<VolumeDescriptor>, Option<u32>)>> {
        let id = admin::random_client_id();
        let mut out = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            let start = Instant::now();
            loop {
                if let Some(child) = p.child.as_mut() {
                    if let Some(status) = child.try_wait().context("cannot check a server")? {
                        p.child = None;
                        bail!(
                            "server {i} ({}) exited with {status} before answering; its log {} ends:\n{}",
                            p.addr,
                            p.log.display(),
                            tail(&p.log, 15)
                        );
                    }
                }
                let attempt = tokio::select! {
                    r = Session::open(&p.addr, &self.key, None, id, "morris-up", Duration::from_secs(2)) => r,
                    sig = term.recv() => bail!("{sig} while starting the servers"),
                };
                match attempt {
                    Ok(s) => {
                        out.push((s.descriptor, s.index));
                        break;
                    }
                    Err(e) if start.elapsed() > Duration::from_secs(30) => bail!(
                        "server {i} did not answer on {} within 30 s ({e:#}); see {}",
                        p.addr,
                        p.log.display()
                    ),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Ok(out)
    }

    /// Reaps servers that exited on their own, says what that means for a
    /// volume with `replicas` copies, and restarts each once its back-off
    /// delay has passed. Call it often (it never blocks).
    pub fn supervise(&mut self, replicas: u8) {
        let now = Instant::now();
        let mut exited: Vec<(usize, ExitStatus, Duration, Duration)> = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            let Some(child) = p.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let ran = p.started.elapsed();
                    let delay = p.backoff.after_exit(ran);
                    p.child = None;
                    p.restart_at = Some(now + delay);
                    exited.push((i, status, ran, delay));
                }
                Ok(None) => {}
                Err(e) => warn!(index = i, addr = %p.addr, error = %e, "cannot check a server"),
            }
        }
        if !exited.is_empty() {
            let down: Vec<bool> = self.procs.iter().map(|p| p.child.is_none()).collect();
            let meaning = availability(&down, replicas);
            for (i, status, ran, delay) in exited {
                let p = &self.procs[i];
                warn!(
                    index = i,
                    addr = %p.addr,
                    %status,
                    ran_s = ran.as_secs(),
                    restart_in_s = delay.as_secs(),
                    log = %p.log.display(),
                    "server {i} exited ({status}); restarting it in {} s; {meaning}",
                    delay.as_secs()
                );
            }
        }
        for i in 0..self.procs.len() {
            let due = self.procs[i].restart_at.is_some_and(|t| t <= now);
            if !due {
                continue;
            }
            match self.start(i) {
                Ok(child) => {
                    let p = &mut self.procs[i];
                    p.restarts += 1;
                    p.started = Instant::now();
                    p.restart_at = None;
                    info!(index = i, addr = %p.addr, pid = child.id(), restarts = p.restarts, "server {i} restarted");
                    p.child = Some(child);
                }
                Err(e) => {
                    let p = &mut self.procs[i];
                    let delay = p.backoff.after_exit(Duration::ZERO);
                    p.restart_at = Some(Instant::now() + delay);
                    warn!(index = i, addr = %p.addr, error = %format!("{e:#}"), "cannot restart server {i}; trying again in {} s", delay.as_secs());
                }
            }
        }
    }

    /// SIGTERM to every server, then SIGKILL to those still running after
    /// 10 s. Nothing is restarted afterwards.
    pub fn stop(&mut self) {
        for p in &mut self.procs {
            p.restart_at = None;
            if let Some(child) = &p.child {
                if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                    // SAFETY: `pid` is our own child, not yet reaped.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
            }
        }
        let start = Instant::now();
        loop {
            let mut running = 0;
            for p in &mut self.procs {
                if let Some(child) = p.child.as_mut() {
                    match child.try_wait() {
                        Ok(Some(_)) | Err(_) => p.child = None,
                        Ok(None) => running += 1,
                    }
                }
            }
            if running == 0 {
                return;
            }
            if start.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in &mut self.procs {
            if let Some(mut child) = p.child.take() {
                warn!(addr = %p.addr, "server ignored SIGTERM; killing it");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for ServerSet {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_to_a_cap_and_resets_after_a_stable_run() {
        let mut b = Backoff::default();
        let quick = Duration::from_secs(2);
        let delays: Vec<u64> = (0..7).map(|_| b.after_exit(quick).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.after_exit(Backoff::STABLE), Backoff::FIRST);
        assert_eq!(b.after_exit(quick), Duration::from_secs(2));
    }

    #[test]
    fn availability_tells_the_truth() {
        assert_eq!(availability(&[false; 4], 2), "every server is up");
        let one = availability(&[false, true, false, false], 1);
        assert!(
            one.contains("server 1 are unavailable until it is back"),
            "{one}"
        );
        let two = availability(&[false, true, false, false], 2);
        assert!(two.starts_with("the volume stays available"), "{two}");
        // Two down but not neighbours: every block still has a copy.
        let apart = availability(&[true, false, true, false], 2);
        assert!(apart.starts_with("the volume stays available"), "{apart}");
        // Neighbours 1 and 2: blocks with copies on 1 and 2 are lost.
        let next = availability(&[false, true, true, false], 2);
        assert!(
            next.contains("unavailable") && next.contains("starting at server 1"),
            "{next}"
        );
        // Ring: 3 and 0 are neighbours.
        let ring = availability(&[true, false, false, true], 2);
        assert!(ring.contains("starting at server 3"), "{ring}");
        let three = availability(&[false, true, true, false], 3);
        assert!(three.starts_with("the volume stays available"), "{three}");
        assert!(availability(&[true], 1).contains("server 0"));
    }
}
