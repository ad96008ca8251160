//! `--access-log FILE`: one line per FUSE request the mount answers, in
//! the shape of JuiceFS's `.accesslog` (issue 20), read by `morris profile`:
//!
//! ```text
//! 2026-11-28T01:40:00.123456Z [uid:0,gid:0,pid:4403] write (4101): OK <0.000022>
//! 2026-11-28T01:40:00.123501Z [uid:0,gid:0,pid:4403] lookup (1): ENOENT <0.000041>
//! ```
//!
//! The time is when the request arrived, the number in parentheses the
//! inode it names (a directory for lookup, create, mkdir, unlink, ...), and
//! the last field how long the answer took, in seconds. Lines go through a
//! bounded queue to a writer thread, so a request never waits for the disk;
//! when the queue is full, lines are dropped and counted in the next line
//! written (`# N lines dropped`).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 65_536;
/// The writer flushes when no line came for this long.
const FLUSH_AFTER: Duration = Duration::from_millis(200);

/// A mount's access log.
pub struct AccessLog {
    tx: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// Appends to `path` (made if missing) from a writer thread of its own.
    pub fn open(path: &Path) -> io::Result<AccessLog> {
        let file = File::options().create(true).append(true).open(path)?;
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let lost = dropped.clone();
        std::thread::Builder::new()
            .name("morris-access-log".into())
            .spawn(move || {
                let mut out = BufWriter::new(file);
                loop {
                    let r = match rx.recv_timeout(FLUSH_AFTER) {
                        Ok(line) => {
                            let n = lost.swap(0, Ordering::Relaxed);
                            let note = if n > 0 {
                                writeln!(out, "# {n} lines dropped (the log could not keep up)")
                            } else {
                                Ok(())
                            };
                            note.and_then(|()| out.write_all(line.as_bytes()))
                        }
                        Err(RecvTimeoutError::Timeout) => out.flush(),
                        Err(RecvTimeoutError::Disconnected) => {
                            let _ = out.flush();
                            return;
                        }
                    };
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "access log: cannot write; no more lines");
                        return;
                    }
                }
            })?;
        Ok(AccessLog { tx, dropped })
    }

    /// Queues the line of one answered request.
    pub(crate) fn record(
        &self,
        (uid, gid, pid): (u32, u32, u32),
        op: &str,
        ino: u64,
        errno: i32,
        took: Duration,
    ) {
        let at = SystemTime::now()
            .checked_sub(took)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let line = format!(
            "{} [uid:{uid},gid:{gid},pid:{pid}] {op} ({ino}): {} <{:.6}>\n",
            humantime::format_rfc3339_micros(at),
            outcome(errno),
            took.as_secs_f64()
        );
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// `OK`, or the errno's name.
fn outcome(errno: i32) -> String {
    if errno == 0 {
        return "OK".to_string();
    }
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOLCK => "ENOLCK",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(&path).unwrap();
        log.record((1, 2, 3), "write", 4101, 0, Duration::from_micros(22));
        log.record(
            (0, 0, 9),
            "lookup",
            1,
            libc::ENOENT,
            Duration::from_micros(41),
        );
        drop(log);
        // The writer thread flushes when the queue closes.
        let mut text = String::new();
        for _ in 0..200 {
            text = std::fs::read_to_string(&path).unwrap();
            if text.lines().count() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with("[uid:1,gid:2,pid:3] write (4101): OK <0.000022>"),
            "{text}"
        );
        assert!(
            lines[1].ends_with("lookup (1): ENOENT <0.000041>"),
            "{text}"
        );
        assert_eq!(outcome(1234), "errno 1234");
    }
}
