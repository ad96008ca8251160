//! Making and removing the kernel mount, with our own `/dev/fuse` descriptor.
//!
//! The mount is made here, not by fuser: by `mount(2)` when privileged, else
//! through the setuid `fusermount3` helper, which mounts and hands the
//! descriptor back over a socket (`_FUSE_COMMFD`, as libfuse does). fuser
//! then only serves that descriptor (`Session::from_fd`) and never unmounts
//! anything. (fuser 0.18 unmounts *by path* when its session ends: whatever
//! is mounted there by then — a newer mount of the same directory — or,
//! when nothing is, it logs "Unmount failed: Invalid argument".)
//!
//! Unmounting goes through [`unmount`], which the caller points at a mount it
//! has identified as its own (see `MountGuard::unmount`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::mountinfo::Dev;
use crate::{MountError, UnmountError};

/// The setuid helpers, in order of preference.
const HELPERS: [&str; 2] = ["fusermount3", "fusermount"];

/// How the kernel mount is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// `mount(2)` with our descriptor (needs `CAP_SYS_ADMIN`).
    Direct,
    /// The setuid `fusermount3` helper (or `fusermount`).
    Helper,
}

/// What the mount asks of the kernel, besides the descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// Source name shown by mount(8) and df(1).
    pub(crate) fsname: String,
    /// `allow_other`: every user may use the mount.
    pub(crate) allow_other: bool,
    /// `ro`.
    pub(crate) read_only: bool,
    /// Without `nosuid` (direct mounts only; the helper forces it).
    pub(crate) suid: bool,
    /// Without `nodev` (direct mounts only; the helper forces it).
    pub(crate) dev: bool,
    /// `noatime` (shown only: access times are the library's business).
    pub(crate) noatime: bool,
    /// `strictatime` (shown only, likewise).
    pub(crate) strictatime: bool,
}

impl Request {
    /// Options common to both methods (the type becomes `fuse.morris`).
    fn common_options(&self) -> String {
        let mut o = String::from("subtype=morris,default_permissions");
        if self.allow_other {
            o.push_str(",allow_other");
        }
        o
    }

    /// The `mount(2)` data string for descriptor `fd` and root mode `rootmode`.
    pub(crate) fn kernel_data(&self, fd: RawFd, rootmode: u32) -> String {
        // SAFETY: getuid/getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        format!(
            "fd={fd},rootmode={rootmode:o},user_id={uid},group_id={gid},{}",
            self.common_options()
        )
    }

    /// The helper's `-o` argument.
    pub(crate) fn helper_options(&self) -> String {
        format!(
            "fsname={},{}{}{}nosuid,nodev,{}",
            self.fsname,
            if self.read_only { "ro," } else { "" },
            if self.noatime { "noatime," } else { "" },
            if self.strictatime { "strictatime," } else { "" },
            self.common_options()
        )
    }

    /// The `mount(2)` flags.
    pub(crate) fn flags(&self) -> libc::c_ulong {
        let mut f = 0;
        if self.read_only {
            f |= libc::MS_RDONLY;
        }
        if !self.suid {
            f |= libc::MS_NOSUID;
        }
        if !self.dev {
            f |= libc::MS_NODEV;
        }
        if self.noatime {
            f |= libc::MS_NOATIME;
        }
        if self.strictatime {
            f |= libc::MS_STRICTATIME;
        }
        f
    }
}

/// Mounts a FUSE file system on `mountpoint` (absolute, a directory) and
/// returns the connection's descriptor. A direct mount refused for lack of
/// privilege falls back to the helper.
pub(crate) fn mount(
    mountpoint: &Path,
    req: &Request,
    method: Method,
) -> Result<OwnedFd, MountError> {
    if method == Method::Direct {
        match mount_direct(mountpoint, req) {
            Err(MountError::Mount { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
                tracing::debug!("mount(2) not permitted; trying the fusermount3 helper");
            }
            other => return other,
        }
    }
    mount_helper(mountpoint, req)
}

fn mount_direct(mountpoint: &Path, req: &Request) -> Result<OwnedFd, MountError> {
    let meta = std::fs::metadata(mountpoint).map_err(|source| MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        source,
    })?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(MountError::Device)?;
    let fd = OwnedFd::from(dev);
    let data = req.kernel_data(fd.as_raw_fd(), meta.mode() & libc::S_IFMT);
    let cstr = |s: &[u8]| CString::new(s).map_err(|_| MountError::Nul);
    let source = cstr(req.fsname.as_bytes())?;
    let target = cstr(mountpoint.as_os_str().as_bytes())?;
    let fstype = cstr(b"fuse")?;
    let cdata = cstr(data.as_bytes())?;
    // SAFETY: all four strings are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            req.flags(),
            cdata.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(MountError::Mount {
            path: mountpoint.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(fd)
}

fn mount_helper(mountpoint: &Path, req: &Request) -> Result<OwnedFd, MountError> {
    let mut missing = None;
    for helper in HELPERS {
        let (ours, theirs) = UnixStream::pair().map_err(MountError::Socket)?;
        let child_fd = theirs.as_raw_fd();
        let mut cmd = Command::new(helper);
        cmd.arg("-o")
            .arg(req.helper_options())
            .arg("--")
            .arg(mountpoint)
            .env("_FUSE_COMMFD", child_fd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: only fcntl, which is async-signal-safe, runs between fork
        // and exec; it lets the helper inherit its end of the socket.
        unsafe {
            cmd.pre_exec(move || {
                let flags = libc::fcntl(child_fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(child_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing = Some(e);
                continue;
            }
            Err(e) => {
                return Err(MountError::Helper {
                    helper,
                    message: e.to_string(),
                })
            }
        };
        drop(theirs);
        let received = receive_fd(&ours);
        drop(ours);
        let out = child.wait_with_output();
        let stderr = out
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_default();
        return match (received, out) {
            (Ok(Some(fd)), Ok(o)) if o.status.success() => Ok(fd),
            (Err(e), _) => Err(MountError::Helper {
                helper,
                message: format!("no descriptor received: {e}; {stderr}"),
            }),
            (_, Ok(o)) if !o.status.success() => Err(MountError::Helper {
                helper,
                message: if stderr.is_empty() {
                    o.status.to_string()
                } else {
                    stderr
                },
            }),
            _ => Err(MountError::Helper {
                helper,
                message: format!("exited without passing a descriptor; {stderr}"),
            }),
        };
    }
    Err(MountError::NoHelper(missing.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "no fusermount3 or fusermount")
    })))
}

/// Receives one descriptor (`SCM_RIGHTS`) from the helper; `None` if it
/// closed the socket without sending one.
fn receive_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // Room for a few descriptors, aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: msg points at live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let mut found = None;
    // SAFETY: the CMSG_* helpers walk the control buffer the kernel filled,
    // within msg_controllen; every descriptor they yield is ours to own.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = data.add(i).read_unaligned();
                    if fd >= 0 {
                        let owned = OwnedFd::from_raw_fd(fd);
                        if found.is_none() {
                            found = Some(owned);
                        }
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(found)
}

/// Why [`unmount`] did not unmount.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The kernel says the mount is in use.
    Busy,
    /// Nothing (any more) mounted there.
    NotMounted,
    /// Anything else.
    Other(UnmountError),
}

/// Unmounts the mount on top of `path` (`MNT_DETACH` if `lazy`):
/// `umount2` when privileged, else the helper. The caller has checked that
/// this mount is its own.
pub(crate) fn unmount(path: &Path, lazy: bool) -> Result<(), Failure> {
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Failure::Other(UnmountError::Nul(path.to_path_buf())))?;
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: cpath is NUL-terminated and outlives the call.
    if unsafe { libc::umount2(cpath.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => Err(Failure::Busy),
        Some(libc::EINVAL | libc::ENOENT) => Err(Failure::NotMounted),
        // Not privileged: the setuid helper unmounts mounts of its user.
        Some(libc::EPERM) => unmount_helper(path, lazy),
        _ => Err(Failure::Other(UnmountError::Io {
            path: path.to_path_buf(),
            source: err,
        })),
    }
}

fn unmount_helper(path: &Path, lazy: bool) -> Result<(), Failure> {
    let mut missing = None;
    for helper in HELPERS {
        let mut cmd = Command::new(helper);
        cmd.arg(if lazy { "-uz" } else { "-u" })
            .arg("--")
            .arg(path)
            .stdin(Stdio::null());
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing = Some(e);
                continue;
            }
            Err(e) => {
                return Err(Failure::Other(UnmountError::Helper {
                    path: path.to_path_buf(),
                    helper,
                    message: e.to_string(),
                }))
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(if msg.contains("busy") {
            Failure::Busy
        } else if [
            "not found",
            "not mounted",
            "Invalid argument",
            "No such file",
        ]
        .iter()
        .any(|m| msg.contains(m))
        {
            // The caller looks at the mount table again.
            Failure::NotMounted
        } else {
            Failure::Other(UnmountError::Helper {
                path: path.to_path_buf(),
                helper,
                message: msg,
            })
        });
    }
    Err(Failure::Other(UnmountError::Io {
        path: path.to_path_buf(),
        source: missing.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
    }))
}

/// Whether the FUSE connection behind `fd` is alive. The kernel reports
/// `POLLERR` on it from the moment the connection is aborted, which an
/// unmount does before it returns (when the file system's last mount and
/// file are gone); a dead connection's device number and mount ids may
/// already belong to a newer mount.
pub(crate) fn connected(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n >= 0 {
            return p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) == 0;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // Cannot tell; the session threads will say so when it ends.
            return true;
        }
    }
}

/// Asks the kernel to abort the FUSE connection of device `dev` through the
/// FUSE control file system (`/sys/fs/fuse/connections`), when it is
/// mounted and we may write to it.
pub(crate) fn abort(dev: Dev) -> io::Result<()> {
    // The directory is named after the kernel's dev_t (major << 20 | minor).
    let id = (u64::from(dev.0) << 20) | u64::from(dev.1);
    std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), b"1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_strings() {
        let r = Request {
            fsname: "morris@x".into(),
            allow_other: true,
            read_only: false,
            suid: false,
            dev: false,
            noatime: false,
            strictatime: false,
        };
        assert_eq!(r.flags(), libc::MS_NOSUID | libc::MS_NODEV);
        let data = r.kernel_data(7, 0o40000);
        assert!(data.starts_with("fd=7,rootmode=40000,user_id="), "{data}");
        assert!(
            data.ends_with(",subtype=morris,default_permissions,allow_other"),
            "{data}"
        );
        assert_eq!(
            r.helper_options(),
            "fsname=morris@x,nosuid,nodev,subtype=morris,default_permissions,allow_other"
        );
        let owner = Request {
            fsname: "m".into(),
            allow_other: false,
            read_only: true,
            suid: true,
            dev: true,
            noatime: true,
            strictatime: false,
        };
        assert!(!owner.helper_options().contains("allow_other"));
        assert!(owner
            .helper_options()
            .starts_with("fsname=m,ro,noatime,nosuid,nodev,"));
        assert_eq!(owner.flags(), libc::MS_RDONLY | libc::MS_NOATIME);
    }

    #[test]
    fn a_socket_without_descriptors_yields_none() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        drop(b);
        assert!(receive_fd(&a).expect("recvmsg").is_none());
    }
}
