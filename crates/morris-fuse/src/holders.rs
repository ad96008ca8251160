//! Which processes keep a mount in use: working and root directories, open
//! files and memory mappings on its device, as `/proc` shows them.
//!
//! Looked up without asking the file system: `statx` with
//! `AT_STATX_DONT_SYNC` answers from the kernel's cache, so a scan never
//! waits for the mount being examined (which may be the caller's own, with a
//! server down).

use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::mountinfo::Dev;

/// How a process uses a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Its working directory is on the mount.
    WorkingDirectory,
    /// Its root directory (chroot) is on the mount.
    RootDirectory,
    /// It has a file or directory open there.
    OpenFile,
    /// It has a file there mapped into memory.
    Mapping,
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Use::WorkingDirectory => "its working directory",
            Use::RootDirectory => "its root directory",
            Use::OpenFile => "open files",
            Use::Mapping => "mapped files",
        })
    }
}

/// A process that keeps a mount in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub command: String,
    /// What it holds there (at least one).
    pub uses: Vec<Use>,
}

/// The result of a scan of `/proc`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// The processes found using the mount.
    pub holders: Vec<Holder>,
    /// False if some process could not be examined (another user's, when
    /// not root): then an empty `holders` proves nothing.
    pub complete: bool,
}

impl Holders {
    /// True if the scan saw every process and none uses the mount.
    pub fn none(&self) -> bool {
        self.complete && self.holders.is_empty()
    }
}

impl fmt::Display for Holders {
    /// E.g. `pid 12 (bash) has its working directory there; pid 40 (cat)
    /// has open files there` (the first five processes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 5;
        if self.holders.is_empty() {
            return f.write_str(if self.complete {
                "no process has files, directories or mappings there"
            } else {
                "no process that may be examined has files, directories or mappings there"
            });
        }
        for (i, h) in self.holders.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let uses: Vec<String> = h.uses.iter().map(Use::to_string).collect();
            write!(
                f,
                "pid {} ({}) has {} there",
                h.pid,
                h.command,
                uses.join(" and ")
            )?;
        }
        if self.holders.len() > SHOWN {
            write!(f, "; and {} more processes", self.holders.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// The device of what `path` (a `/proc` magic link) points at, from the
/// kernel's cache.
fn device_of(path: &Path) -> Option<Dev> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx is plain data; all-zero is a valid initial value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st a valid out-buffer, both live
    // across the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut st,
        )
    };
    (rc == 0).then_some((st.stx_dev_major, st.stx_dev_minor))
}

/// Whether a `/proc/PID/maps` text maps a file of `dev`.
fn maps_device(maps: &str, dev: Dev) -> bool {
    maps.lines().any(|l| {
        l.split_whitespace()
            .nth(3)
            .and_then(|d| d.split_once(':'))
            .and_then(|(a, b)| {
                Some((
                    u32::from_str_radix(a, 16).ok()?,
                    u32::from_str_radix(b, 16).ok()?,
                ))
            })
            == Some(dev)
    })
}

/// What process `pid` holds on `dev`; `Err(())` if it could not be examined.
fn uses_of(pid: &str, dev: Dev) -> Result<Vec<Use>, ()> {
    let base = Path::new("/proc").join(pid);
    let mut uses = Vec::new();
    if device_of(&base.join("cwd")) == Some(dev) {
        uses.push(Use::WorkingDirectory);
    }
    if device_of(&base.join("root")) == Some(dev) {
        uses.push(Use::RootDirectory);
    }
    match std::fs::read_dir(base.join("fd")) {
        Ok(fds) => {
            if fds.flatten().any(|e| device_of(&e.path()) == Some(dev)) {
                uses.push(Use::OpenFile);
            }
        }
        // Gone meanwhile: it holds nothing.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(_) => return Err(()),
    }
    if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
        if maps_device(&maps, dev) {
            uses.push(Use::Mapping);
        }
    }
    Ok(uses)
}

/// Every process that uses device `dev`.
pub(crate) fn scan(dev: Dev) -> Holders {
    let mut out = Holders {
        holders: Vec::new(),
        complete: true,
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        out.complete = false;
        return out;
    };
    for entry in procs.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        match uses_of(pid, dev) {
            Ok(uses) if !uses.is_empty() => {
                let command = std::fs::read_to_string(entry.path().join("comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into());
                out.holders.push(Holder {
                    pid: pid.parse().unwrap_or(0),
                    command,
                    uses,
                });
            }
            Ok(_) => {}
            Err(()) => out.complete = false,
        }
    }
    out.holders.sort_by_key(|h| h.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_name_their_device() {
        let maps = "\
55d0c2a00000-55d0c2a02000 r--p 00000000 fe:00 1234 /usr/bin/cat
7f0000000000-7f0000001000 rw-s 00000000 00:2a 9 /mnt/x/file
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
        assert!(maps_device(maps, (0, 42)));
        assert!(maps_device(maps, (254, 0)));
        assert!(!maps_device(maps, (0, 41)));
        assert!(!maps_device("", (0, 0)));
    }

    #[test]
    fn our_working_directory_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = device_of(dir.path()).expect("statx");
        let file = std::fs::File::create(dir.path().join("f")).expect("create");
        let me = std::process::id();
        let found = scan(dev);
        let mine = found
            .holders
            .iter()
            .find(|h| h.pid == me)
            .expect("this process holds a file on the temporary directory's device");
        assert!(mine.uses.contains(&Use::OpenFile), "{found}");
        drop(file);
    }

    #[test]
    fn descriptions() {
        let h = Holders {
            holders: vec![Holder {
                pid: 7,
                command: "bash".into(),
                uses: vec![Use::WorkingDirectory, Use::OpenFile],
            }],
            complete: true,
        };
        assert_eq!(
            h.to_string(),
            "pid 7 (bash) has its working directory and open files there"
        );
        assert!(!h.none());
        assert!(Holders {
            holders: vec![],
            complete: true
        }
        .none());
        assert!(!Holders::default().none());
    }
}
