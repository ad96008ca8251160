//! The blocking calls that change a local home (the write side of
//! [`crate::Home`], which cache mode II's write-back replays). Like the
//! read side, each call opens the home directory afresh and finds its
//! objects beneath it without following any symlink.
//!
//! Changes to names are durable when a call returns, as an NFSv3 server's
//! are: the directories they touch are fsynced. Writes to a file are
//! durable after [`commit`] (fsync), as NFS's unstable writes are.
//!
//! Attributes are set by name in the object's parent directory, after
//! checking that the name still leads to the object the handle names (the
//! mode of a fifo or a device cannot be set through an `O_PATH`
//! descriptor, and opening one is what this module must never do). A home
//! changing the same name at that very moment can slip between the check
//! and the call; the next revalidation sees the result.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{
    self as rfs, AtFlags, FileType, Mode, OFlags, Statx, Timespec, Timestamps, UTIME_OMIT,
};
use rustix::io::Errno;

use super::handle::{valid_name, Decoded};
use super::ops::{attr, beneath, find, home_error, kind, mask, open_file, open_root, Doing, Shown};
use crate::{HomeAttr, HomeError, HomeHandle, HomeKind, HomeNew, HomeSetAttr, HomeTime, Result};

/// Mode of a new object when the caller sets none.
const DEFAULT_FILE_MODE: u32 = 0o644;
const DEFAULT_DIR_MODE: u32 = 0o755;

fn check_name(name: &[u8]) -> Result<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(HomeError::Invalid(format!(
            "{:?} is not a name",
            String::from_utf8_lossy(name)
        )))
    }
}

fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

/// The directory `dir` names, opened `O_PATH`.
fn dir_fd(root: &Path, dir: &Decoded) -> Result<OwnedFd> {
    let (fd, stx) = find(root, dir, OFlags::PATH)?;
    if kind(&stx) != HomeKind::Dir {
        return Err(HomeError::NotDir);
    }
    Ok(fd)
}

/// The entry `name` of the directory `dfd` (not followed); `None` if missing.
fn stat_at(dfd: impl AsFd, name: &[u8], what: &dyn std::fmt::Display) -> Result<Option<Statx>> {
    match rfs::statx(dfd, os(name), AtFlags::SYMLINK_NOFOLLOW, mask()) {
        Ok(stx) => Ok(Some(stx)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(home_error(e, Doing::Object, what)),
    }
}

/// The parent directory of the object `h` names and the object's name in
/// it, checked to lead to that object; for the root, the root and `.`.
fn parent_of(root: &Path, h: &Decoded) -> Result<(OwnedFd, Vec<u8>, Statx)> {
    let what = Shown(root, &h.path);
    let rootfd = open_root(root).map_err(|e| home_error(e, Doing::Handle, &what))?;
    let (pfd, name) = match h.path.iter().rposition(|&c| c == b'/') {
        None if h.path.is_empty() => (rootfd, b".".to_vec()),
        None => (rootfd, h.path.clone()),
        Some(i) => {
            let fd = rfs::openat2(
                &rootfd,
                os(&h.path[..i]),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                beneath(),
            )
            .map_err(|e| home_error(e, Doing::Handle, &what))?;
            (fd, h.path[i + 1..].to_vec())
        }
    };
    let stx = stat_at(&pfd, &name, &what)?.ok_or(HomeError::Stale)?;
    if !h.is(&stx) {
        tracing::debug!(%what, "handle names another object now");
        return Err(HomeError::Stale);
    }
    Ok((pfd, name, stx))
}

fn timespec(t: Option<HomeTime>) -> Timespec {
    match t {
        Some(t) => Timespec {
            tv_sec: t.secs,
            tv_nsec: i64::from(t.nsecs),
        },
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
    }
}

/// Sets `set` on the entry `name` of `dfd`, whose kind is `k`: owner first
/// (a chown clears set-uid and set-gid), then mode, size, and the times
/// last (a truncate sets mtime).
fn apply(dfd: &OwnedFd, name: &[u8], k: HomeKind, set: &HomeSetAttr, what: &Shown) -> Result<()> {
    let fail = |e| home_error(e, Doing::Object, what);
    if set.uid.is_some() || set.gid.is_some() {
        let uid = set.uid.map(rfs::Uid::from_raw);
        let gid = set.gid.map(rfs::Gid::from_raw);
        rfs::chownat(dfd, os(name), uid, gid, AtFlags::SYMLINK_NOFOLLOW).map_err(fail)?;
    }
    if let Some(mode) = set.mode {
        // A symlink's mode is not its own to set (Linux has no lchmod).
        if k != HomeKind::Symlink {
            rfs::chmodat(
                dfd,
                os(name),
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(fail)?;
        }
    }
    if let Some(size) = set.size {
        if k != HomeKind::File {
            return Err(HomeError::Invalid(format!(
                "{what}: only a regular file has a size to set, this is a {k:?}"
            )));
        }
        let fd = rfs::openat2(
            dfd,
            os(name),
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
        .map_err(fail)?;
        rfs::ftruncate(&fd, size).map_err(fail)?;
    }
    if set.atime.is_some() || set.mtime.is_some() {
        let times = Timestamps {
            last_access: timespec(set.atime),
            last_modification: timespec(set.mtime),
        };
        rfs::utimensat(dfd, os(name), &times, AtFlags::SYMLINK_NOFOLLOW).map_err(fail)?;
    }
    Ok(())
}

/// Makes `dir/name`; see [`crate::Home::create`].
pub(crate) fn create(
    root: &Path,
    dir: &Decoded,
    name: &[u8],
    what: &HomeNew,
    set: &HomeSetAttr,
) -> Result<(HomeHandle, HomeAttr)> {
    check_name(name)?;
    let dfd = dir_fd(root, dir)?;
    let path = dir.child_path(name);
    let shown = Shown(root, &path);
    let fail = |e| home_error(e, Doing::Object, &shown);
    let default = if *what == HomeNew::Dir {
        DEFAULT_DIR_MODE
    } else {
        DEFAULT_FILE_MODE
    };
    // Made private to us; the mode asked for is set once it exists (the
    // process umask would otherwise take bits off it).
    let first = Mode::from_raw_mode(0o600);
    let k = match what {
        HomeNew::File => {
            rfs::openat2(
                &dfd,
                os(name),
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                first,
                beneath(),
            )
            .map_err(fail)?;
            HomeKind::File
        }
        HomeNew::Dir => {
            rfs::mkdirat(&dfd, os(name), Mode::from_raw_mode(0o700)).map_err(fail)?;
            HomeKind::Dir
        }
        HomeNew::Symlink(target) => {
            if target.is_empty() || target.contains(&0) {
                return Err(HomeError::Invalid(format!(
                    "{shown}: a symlink target is not empty and has no NUL"
                )));
            }
            rfs::symlinkat(os(target), &dfd, os(name)).map_err(fail)?;
            HomeKind::Symlink
        }
        HomeNew::Device(k, (major, minor)) => {
            let ft = match k {
                HomeKind::BlockDev => FileType::BlockDevice,
                HomeKind::CharDev => FileType::CharacterDevice,
                k => {
                    return Err(HomeError::Invalid(format!(
                        "{shown}: a device node is a block or character device, not a {k:?}"
                    )))
                }
            };
            rfs::mknodat(&dfd, os(name), ft, first, rfs::makedev(*major, *minor)).map_err(fail)?;
            *k
        }
        HomeNew::Fifo => {
            rfs::mknodat(&dfd, os(name), FileType::Fifo, first, 0).map_err(fail)?;
            HomeKind::Fifo
        }
        HomeNew::Socket => {
            rfs::mknodat(&dfd, os(name), FileType::Socket, first, 0).map_err(fail)?;
            HomeKind::Socket
        }
    };
    let mut set = set.clone();
    set.mode.get_or_insert(default);
    if let Err(e) = apply(&dfd, name, k, &set, &shown) {
        // Not half made: a create fails whole, so that it can be replayed.
        let flags = if k == HomeKind::Dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let _ = rfs::unlinkat(&dfd, os(name), flags);
        return Err(e);
    }
    sync_dir(&dfd, &shown)?;
    let stx = stat_at(&dfd, name, &shown)?.ok_or(HomeError::Stale)?;
    Ok((Decoded::of(&stx, path).encode(), attr(&stx)))
}

/// Makes the names in directory `dfd` durable.
fn sync_dir(dfd: &OwnedFd, what: &Shown) -> Result<()> {
    let fd = rfs::openat(
        dfd,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| home_error(e, Doing::Object, what))?;
    rfs::fsync(&fd).map_err(|e| home_error(e, Doing::Object, what))
}

/// Writes `data` at `offset` of regular file `h`; returns the bytes written.
pub(crate) fn write(root: &Path, h: &Decoded, offset: u64, data: &[u8]) -> Result<u32> {
    let what = Shown(root, &h.path);
    let (fd, _) = open_file(root, h, OFlags::WRONLY)?;
    let mut done = 0;
    while done < data.len() {
        let at = offset.saturating_add(done as u64);
        match rustix::io::pwrite(&fd, &data[done..], at) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(Errno::INTR) => continue,
            Err(e) if done > 0 => {
                tracing::debug!(%what, error = %e, done, "short write");
                break;
            }
            Err(e) => return Err(home_error(e, Doing::Object, &what)),
        }
    }
    u32::try_from(done).map_err(|_| HomeError::Invalid(format!("{what}: write too large")))
}

/// Makes the writes to regular file `h` durable.
pub(crate) fn commit(root: &Path, h: &Decoded) -> Result<()> {
    let what = Shown(root, &h.path);
    let (fd, _) = open_file(root, h, OFlags::RDONLY)?;
    rfs::fsync(&fd).map_err(|e| home_error(e, Doing::Object, &what))
}

/// Sets `set` on the object `h` names; returns its attributes after.
pub(crate) fn setattr(root: &Path, h: &Decoded, set: &HomeSetAttr) -> Result<HomeAttr> {
    let what = Shown(root, &h.path);
    let (pfd, name, stx) = parent_of(root, h)?;
    apply(&pfd, &name, kind(&stx), set, &what)?;
    let stx = stat_at(&pfd, &name, &what)?.ok_or(HomeError::Stale)?;
    Ok(attr(&stx))
}

/// Removes `dir/name`: a directory (`rmdir`) or anything else.
pub(crate) fn remove(root: &Path, dir: &Decoded, name: &[u8], rmdir: bool) -> Result<()> {
    check_name(name)?;
    let dfd = dir_fd(root, dir)?;
    let path = dir.child_path(name);
    let shown = Shown(root, &path);
    let stx = stat_at(&dfd, name, &shown)?.ok_or(HomeError::NotFound)?;
    match (rmdir, kind(&stx) == HomeKind::Dir) {
        (true, false) => return Err(HomeError::NotDir),
        (false, true) => return Err(HomeError::IsDir),
        _ => {}
    }
    let flags = if rmdir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    rfs::unlinkat(&dfd, os(name), flags).map_err(|e| match e {
        Errno::EXIST | Errno::NOTEMPTY => HomeError::NotEmpty,
        e => home_error(e, Doing::Name, &shown),
    })?;
    sync_dir(&dfd, &shown)
}

/// Renames `from_dir/from` to `to_dir/to`.
pub(crate) fn rename(
    root: &Path,
    from_dir: &Decoded,
    from: &[u8],
    to_dir: &Decoded,
    to: &[u8],
) -> Result<()> {
    check_name(from)?;
    check_name(to)?;
    let ffd = dir_fd(root, from_dir)?;
    let tfd = dir_fd(root, to_dir)?;
    let path = from_dir.child_path(from);
    let shown = Shown(root, &path);
    rfs::renameat(&ffd, os(from), &tfd, os(to)).map_err(|e| match e {
        Errno::EXIST | Errno::NOTEMPTY => HomeError::NotEmpty,
        e => home_error(e, Doing::Name, &shown),
    })?;
    sync_dir(&tfd, &shown)?;
    if from_dir.path != to_dir.path {
        sync_dir(&ffd, &shown)?;
    }
    Ok(())
}

/// Gives the object `target` names the new name `dir/name`.
pub(crate) fn link(
    root: &Path,
    target: &Decoded,
    dir: &Decoded,
    name: &[u8],
) -> Result<(HomeHandle, HomeAttr)> {
    check_name(name)?;
    let (tfd, tstx) = find(root, target, OFlags::PATH)?;
    if kind(&tstx) == HomeKind::Dir {
        return Err(HomeError::IsDir);
    }
    let dfd = dir_fd(root, dir)?;
    let path = dir.child_path(name);
    let shown = Shown(root, &path);
    // Through the descriptor's /proc link, which links the object it was
    // opened on (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
    let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&tfd));
    rfs::linkat(
        rfs::CWD,
        proc.as_str(),
        &dfd,
        os(name),
        AtFlags::SYMLINK_FOLLOW,
    )
    .map_err(|e| home_error(e, Doing::Object, &shown))?;
    sync_dir(&dfd, &shown)?;
    let stx = stat_at(&dfd, name, &shown)?.ok_or(HomeError::Stale)?;
    Ok((Decoded::of(&stx, path).encode(), attr(&stx)))
}
