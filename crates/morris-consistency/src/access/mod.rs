//! How workers reach the directory under test: one [`Access`] trait with
//! two implementations, so that one set of workloads runs over both.
//!
//! * [`posix::PosixAccess`]: real system calls on a path (a FUSE mount of a
//!   volume, or a local directory as the reference); a [`Handle`] is an
//!   open file descriptor with all its POSIX promises.
//! * [`nfs::NfsAccess`]: NFSv3 calls through the `nfs3_client` crate
//!   (MOUNT, LOOKUP walk, CREATE, WRITE FILE_SYNC, READ, GETATTR, RENAME,
//!   REMOVE, READDIRPLUS); a [`Handle`] is a file handle, which NFSv3 lets
//!   go stale once the file is removed (there is no open state).
//!
//! Errors are [`FsError`]s carrying an errno-like [`ErrCode`] (NFS
//! statuses map onto the errno of the same meaning), so workloads count
//! and judge them the same way whatever the access.

pub mod nfs;
pub mod posix;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// An errno-like error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrCode {
    /// The errno (`libc::ENOENT`, ...); 0 for a transport error.
    pub errno: i32,
    /// Its symbolic name (`ENOENT`, `ESTALE`, `RPC`, `NFS3ERR_JUKEBOX`, ...).
    pub name: String,
    /// The full text, for messages.
    pub text: String,
}

/// Symbolic name of an errno.
pub fn errno_name(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOLCK => "ENOLCK",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("errno{e}"),
    };
    n.to_string()
}

impl ErrCode {
    /// From an `std::io::Error` of a system call.
    pub fn from_io(e: &std::io::Error) -> ErrCode {
        match e.raw_os_error() {
            Some(n) => ErrCode {
                errno: n,
                name: errno_name(n),
                text: e.to_string(),
            },
            None => ErrCode {
                errno: 0,
                name: format!("{:?}", e.kind()),
                text: e.to_string(),
            },
        }
    }

    /// A code of our own (no system call behind it).
    pub fn other(errno: i32, text: impl Into<String>) -> ErrCode {
        ErrCode {
            errno,
            name: if errno == 0 {
                "ERROR".into()
            } else {
                errno_name(errno)
            },
            text: text.into(),
        }
    }

    /// True if this is errno `e`.
    pub fn is(&self, e: i32) -> bool {
        self.errno == e
    }
}

impl std::fmt::Display for ErrCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.text.contains(&self.name) {
            write!(f, "{}", self.text)
        } else {
            write!(f, "{} ({})", self.name, self.text)
        }
    }
}

/// A failed file-system operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{op} {name}: {code}")]
pub struct FsError {
    /// The operation (`open`, `rename`, `READ`, ...).
    pub op: &'static str,
    /// The name or names it was applied to.
    pub name: String,
    /// What went wrong.
    pub code: ErrCode,
}

impl FsError {
    /// An error of `op` on `name` from an `std::io::Error`.
    pub fn io(op: &'static str, name: &str, e: &std::io::Error) -> FsError {
        FsError {
            op,
            name: name.to_string(),
            code: ErrCode::from_io(e),
        }
    }

    /// True if the error is errno `e`.
    pub fn is(&self, e: i32) -> bool {
        self.code.is(e)
    }
}

/// What an open file (or file handle) says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Size in bytes.
    pub size: u64,
    /// Inode number (NFS: file id).
    pub ino: u64,
}

/// An open file: a descriptor (POSIX) or a file handle (NFS).
#[derive(Debug)]
pub enum Handle {
    /// An open file descriptor.
    Posix(std::fs::File),
    /// An NFSv3 file handle.
    Nfs(nfs::FileHandle),
}

impl Handle {
    /// The NFS file handle's bytes (`None` for a descriptor).
    pub fn nfs_fh(&self) -> Option<&[u8]> {
        match self {
            Handle::Nfs(f) => Some(f.fh.data.as_ref()),
            Handle::Posix(_) => None,
        }
    }

    /// The inode number an NFS LOOKUP or CREATE reported with the handle.
    pub fn known_ino(&self) -> Option<u64> {
        match self {
            Handle::Nfs(f) => f.attr.map(|a| a.ino),
            Handle::Posix(_) => None,
        }
    }
}

/// Largest file any workload reads whole (a broken size must not exhaust memory).
pub const READ_LIMIT: usize = 256 << 20;

/// Operations on the files of one directory. Names are single path
/// components inside that directory.
pub trait Access {
    /// Which target this is, for messages (`mount#1 /mnt/b/dir`, `nfs ...`).
    fn label(&self) -> &str;
    /// True for NFSv3 (no open state: handles may go stale once removed).
    fn is_nfs(&self) -> bool;
    /// Creates `name` exclusively (O_CREAT|O_EXCL; NFS: CREATE GUARDED), open for writing.
    fn create_excl(&mut self, name: &str) -> Result<Handle, FsError>;
    /// Opens `name` for reading (NFS: LOOKUP).
    fn open_read(&mut self, name: &str) -> Result<Handle, FsError>;
    /// Writes all of `data` at `offset` (NFS: WRITE FILE_SYNC).
    fn write_at(&mut self, h: &mut Handle, offset: u64, data: &[u8]) -> Result<(), FsError>;
    /// Reads up to `len` bytes at `offset`; fewer only at end of file.
    fn read_at(&mut self, h: &mut Handle, offset: u64, len: usize) -> Result<Vec<u8>, FsError>;
    /// fsync (NFS: COMMIT).
    fn sync(&mut self, h: &mut Handle) -> Result<(), FsError>;
    /// Closes the file, reporting close's error (NFS: nothing to do).
    fn close(&mut self, h: Handle) -> Result<(), FsError>;
    /// fstat (NFS: GETATTR).
    fn attr(&mut self, h: &mut Handle) -> Result<Attr, FsError>;
    /// stat of a name (NFS: LOOKUP).
    fn stat(&mut self, name: &str) -> Result<Attr, FsError>;
    /// Renames `from` to `to` in the directory, replacing `to`.
    fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError>;
    /// Unlinks `name` (NFS: REMOVE).
    fn remove(&mut self, name: &str) -> Result<(), FsError>;
    /// The names in the directory, from one pass (opendir..closedir; NFS:
    /// READDIRPLUS from cookie 0 to eof), in the order returned.
    fn list(&mut self) -> Result<Vec<String>, FsError>;
    /// Makes directory `name`.
    fn mkdir(&mut self, name: &str) -> Result<(), FsError>;
    /// Removes empty directory `name`.
    fn rmdir(&mut self, name: &str) -> Result<(), FsError>;

    /// Reads the whole file from offset 0 to end of file.
    fn read_to_end(&mut self, h: &mut Handle) -> Result<Vec<u8>, FsError> {
        let mut out = Vec::new();
        loop {
            let chunk = self.read_at(h, out.len() as u64, 1 << 20)?;
            if chunk.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&chunk);
            if out.len() > READ_LIMIT {
                return Err(FsError {
                    op: "read",
                    name: String::new(),
                    code: ErrCode::other(libc::EFBIG, format!("more than {READ_LIMIT} bytes")),
                });
            }
        }
    }
}

/// Where a target is: a local path, or a directory of an NFSv3 export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetSpec {
    /// A directory reached through system calls.
    Posix {
        /// Its path.
        dir: PathBuf,
    },
    /// A directory of the NFSv3 server at `addr` (NFS and MOUNT on one
    /// port), `path` below the export `/` (components separated by `/`).
    Nfs {
        /// Server address.
        addr: SocketAddr,
        /// Path inside the export, e.g. `test/run-1`; empty for the root.
        path: String,
    },
}

impl TargetSpec {
    /// Parses `HOST:PORT[/path/in/export]`.
    pub fn parse_nfs(s: &str) -> Result<TargetSpec, String> {
        let (hp, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let addr = hp
            .to_socket_addrs()
            .map_err(|e| format!("--nfs {s}: cannot resolve {hp:?} (want HOST:PORT[/path]): {e}"))?
            .next()
            .ok_or_else(|| format!("--nfs {s}: {hp:?} resolves to no address"))?;
        let path = path
            .split('/')
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        Ok(TargetSpec::Nfs { addr, path })
    }

    /// The same target's subdirectory `name`.
    pub fn child(&self, name: &str) -> TargetSpec {
        match self {
            TargetSpec::Posix { dir } => TargetSpec::Posix {
                dir: dir.join(name),
            },
            TargetSpec::Nfs { addr, path } => TargetSpec::Nfs {
                addr: *addr,
                path: if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}/{name}")
                },
            },
        }
    }

    /// True for an NFS target.
    pub fn is_nfs(&self) -> bool {
        matches!(self, TargetSpec::Nfs { .. })
    }

    /// A label for messages: `mount#<i> <path>` or `nfs#<i> <addr>/<path>`.
    pub fn label(&self, index: usize) -> String {
        match self {
            TargetSpec::Posix { dir } => format!("mount#{index} {}", dir.display()),
            TargetSpec::Nfs { addr, path } => format!("nfs#{index} {addr}/{path}"),
        }
    }

    /// How to write it on a command line (`--dir P` or `--nfs A/P`).
    pub fn cli_args(&self) -> [String; 2] {
        match self {
            TargetSpec::Posix { dir } => ["--dir".into(), dir.display().to_string()],
            TargetSpec::Nfs { addr, path } => ["--nfs".into(), format!("{addr}/{path}")],
        }
    }

    /// Connects: checks a POSIX directory exists, or mounts the NFS export
    /// and looks the path up.
    pub fn open(&self, index: usize) -> Result<Box<dyn Access>, FsError> {
        let label = self.label(index);
        match self {
            TargetSpec::Posix { dir } => Ok(Box::new(posix::PosixAccess::new(dir.clone(), label)?)),
            TargetSpec::Nfs { addr, path } => {
                Ok(Box::new(nfs::NfsAccess::connect(*addr, path, label)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfs_targets_parse() {
        let t = TargetSpec::parse_nfs("127.0.0.1:2050/a//b/").expect("parse");
        assert_eq!(
            t,
            TargetSpec::Nfs {
                addr: "127.0.0.1:2050".parse().expect("addr"),
                path: "a/b".into()
            }
        );
        assert_eq!(
            t.child("c"),
            TargetSpec::Nfs {
                addr: "127.0.0.1:2050".parse().expect("addr"),
                path: "a/b/c".into()
            }
        );
        assert!(TargetSpec::parse_nfs("nohostport").is_err());
        assert_eq!(errno_name(libc::ESTALE), "ESTALE");
    }
}
