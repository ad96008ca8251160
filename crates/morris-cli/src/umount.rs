//! `morris umount`, and the unmount used by `mount` and `up` on a signal.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use crate::mountinfo;

/// Arguments of `morris umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The mount point of a morris (FUSE) mount.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open (lazy unmount); the mount goes away
    /// when the last file is closed.
    #[arg(long, short = 'z')]
    pub lazy: bool,
}

/// Why an unmount did not happen.
#[derive(Debug)]
pub enum UnmountError {
    /// Nothing is mounted there.
    NotMounted,
    /// Files are open on the mount.
    Busy,
    /// Anything else.
    Other(anyhow::Error),
}

impl std::fmt::Display for UnmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmountError::NotMounted => write!(f, "not mounted"),
            UnmountError::Busy => write!(
                f,
                "busy: files are open on it (close them, or use `morris umount --lazy`)"
            ),
            UnmountError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts the FUSE mount at `path` (already absolute): `umount2` as root,
/// else `fusermount3 -u`. Refuses mounts that are not FUSE.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), UnmountError> {
    let entry = mountinfo::find(path)
        .map_err(|e| UnmountError::Other(anyhow!("cannot read mount table: {e}")))?
        .ok_or(UnmountError::NotMounted)?;
    if !entry.is_fuse() {
        return Err(UnmountError::Other(anyhow!(
            "{} is a {} mount, not a morris (FUSE) mount; refusing to unmount it",
            path.display(),
            entry.fs_type
        )));
    }
    if is_root() {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| UnmountError::Other(anyhow!("path contains a NUL byte")))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        let rc = unsafe { libc::umount2(c.as_ptr(), flags) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EBUSY) => UnmountError::Busy,
            Some(libc::EINVAL) | Some(libc::ENOENT) => UnmountError::NotMounted,
            _ => UnmountError::Other(anyhow!("umount2 {}: {err}", path.display())),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(path).output().map_err(|e| {
        UnmountError::Other(anyhow!(
            "cannot run fusermount3 (install the fuse3 package): {e}"
        ))
    })?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(if msg.contains("busy") {
        UnmountError::Busy
    } else if msg.contains("not found") || msg.contains("not mounted") {
        UnmountError::NotMounted
    } else {
        UnmountError::Other(anyhow!("fusermount3 -u {}: {msg}", path.display()))
    })
}

/// Runs `morris umount`.
pub fn run(args: UmountArgs) -> Result<ExitCode> {
    let path = mountinfo::absolute(&args.mountpoint)
        .with_context(|| format!("bad path {}", args.mountpoint.display()))?;
    match unmount(&path, args.lazy) {
        Ok(()) => {
            println!("unmounted {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(UnmountError::NotMounted) => bail!("{} is not mounted", path.display()),
        Err(e) => bail!("cannot unmount {}: {e}", path.display()),
    }
}
