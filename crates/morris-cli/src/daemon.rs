//! Turning `morris mount --background` into a daemon whose parent exits only
//! once the mount is up (exit 0) or has failed (exit 1, with the reason).
//!
//! The parent forks before any thread or runtime exists; the child starts a
//! new session, forks again (so it can never regain a terminal), moves to
//! `/`, points its stdio at `/dev/null` and the log file, and reports through
//! a pipe.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{anyhow, Context, Result};

/// The daemon's end of the report pipe.
pub struct Notifier {
    pipe: File,
}

impl Notifier {
    /// Tells the waiting parent that the daemon is up; it prints `msg` and exits 0.
    pub fn ready(mut self, msg: &str) {
        let _ = write!(self.pipe, "ok\n{msg}");
    }

    /// Tells the waiting parent that the daemon failed; it prints `msg` and exits 1.
    pub fn failed(mut self, msg: &str) {
        let _ = write!(self.pipe, "err\n{msg}");
    }
}

fn last_error(what: &str) -> anyhow::Error {
    anyhow!("{what}: {}", std::io::Error::last_os_error())
}

/// Detaches into a daemon that logs to `log` (or nowhere). Returns only in the
/// daemon; the calling process waits for the daemon's report and exits.
///
/// Must be called while the process has a single thread.
pub fn daemonize(log: Option<&Path>) -> Result<Notifier> {
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("cannot open /dev/null")?;
    let out = match log {
        Some(p) => OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o644)
            .open(p)
            .with_context(|| format!("cannot open log file {}", p.display()))?,
        None => null.try_clone().context("cannot open /dev/null")?,
    };
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_error("pipe"));
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that we now own.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };

    // SAFETY: the caller guarantees a single-threaded process, so the child
    // may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(last_error("fork"));
    }
    if pid > 0 {
        drop(wr);
        wait_for_report(pid, File::from(rd), log);
    }
    drop(rd);
    // SAFETY: plain syscalls in the (single-threaded) child.
    unsafe {
        if libc::setsid() < 0 {
            libc::_exit(1);
        }
        match libc::fork() {
            0 => {}
            n if n > 0 => libc::_exit(0),
            _ => libc::_exit(1),
        }
    }
    // The daemon: no terminal, stdio to /dev/null and the log.
    std::env::set_current_dir("/").context("cannot change directory to /")?;
    for (src, dst) in [
        (null.as_raw_fd(), libc::STDIN_FILENO),
        (out.as_raw_fd(), libc::STDOUT_FILENO),
        (out.as_raw_fd(), libc::STDERR_FILENO),
    ] {
        // SAFETY: both descriptors are open; dup2 replaces dst atomically.
        if unsafe { libc::dup2(src, dst) } < 0 {
            return Err(last_error("dup2"));
        }
    }
    Ok(Notifier {
        pipe: File::from(wr),
    })
}

/// The parent: reap the first child, wait for the daemon's report, exit.
fn wait_for_report(child: libc::pid_t, mut pipe: File, log: Option<&Path>) -> ! {
    let mut status = 0;
    // SAFETY: `child` is our child; status is a valid out-pointer.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let mut buf = Vec::new();
    let _ = pipe.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let (kind, msg) = text.split_once('\n').unwrap_or((&text, ""));
    let code = match kind {
        "ok" => {
            println!("{msg}");
            0
        }
        "err" => {
            eprintln!("morris: error: {msg}");
            1
        }
        _ => {
            let hint = match log {
                Some(p) => format!("; see {}", p.display()),
                None => "; rerun with --log FILE, or without --background, to see why".into(),
            };
            eprintln!("morris: error: the mount daemon exited before reporting{hint}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
