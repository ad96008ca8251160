//! The blocking file-system calls of a local home. Each function here runs
//! on a blocking thread (see `pool`), opens the home directory afresh and
//! finds its objects beneath it without following any symlink.

use std::ffi::CStr;
use std::fmt::Display;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use bytes::Bytes;
use rustix::fs::{
    self as rfs, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Statx, StatxFlags,
};
use rustix::io::Errno;

use super::handle::Decoded;
use crate::{
    DirPage, HomeAttr, HomeEntry, HomeError, HomeHandle, HomeKind, HomeTime, ReadReply, Result,
};

/// What a failed call was doing, which decides what some errnos mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doing {
    /// Finding the object a handle names: if its path no longer leads to
    /// an object (missing, through a symlink, out of the root), the object
    /// is gone as far as the handle goes.
    Handle,
    /// Looking a name up in a directory: a missing name is just missing.
    Name,
    /// Anything else on an object already found.
    Object,
}

/// The one translation of an errno into a [`HomeError`]; `what` names the
/// object, for the messages that carry text.
pub(crate) fn home_error(e: Errno, doing: Doing, what: &dyn Display) -> HomeError {
    match (e, doing) {
        (Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV, Doing::Handle) => {
            HomeError::Stale
        }
        (Errno::NOENT, Doing::Name) => HomeError::NotFound,
        (Errno::NOENT, Doing::Object) => HomeError::Stale,
        // A home below which an NFS file system is mounted.
        (Errno::STALE, _) => HomeError::Stale,
        (Errno::NOTDIR, _) => HomeError::NotDir,
        (Errno::ISDIR, _) => HomeError::IsDir,
        (Errno::ACCESS | Errno::PERM, _) => HomeError::Access,
        (Errno::EXIST, _) => HomeError::Exists,
        (Errno::NOTEMPTY, _) => HomeError::NotEmpty,
        (Errno::NOSPC | Errno::DQUOT, _) => HomeError::NoSpace,
        (Errno::ROFS, _) => HomeError::ReadOnly,
        (Errno::INVAL, _) => HomeError::Invalid(format!("{what}: {e}")),
        (Errno::NAMETOOLONG, _) => HomeError::Invalid(format!("{what}: {e}")),
        _ => HomeError::Io(format!("{what}: {e}")),
    }
}

/// The attributes every call asks statx for.
pub(super) fn mask() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::BTIME
}

/// How every path below the root is resolved.
pub(super) fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

pub(super) fn stat_fd(fd: impl AsFd, what: &dyn Display) -> Result<Statx> {
    rfs::statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        mask(),
    )
    .map_err(|e| home_error(e, Doing::Object, what))
}

/// The home directory, opened by its path (symlinks in the path itself
/// are followed: the path is the operator's, not home's). Opened afresh by
/// every call, so a directory replaced at home is seen as such.
pub(super) fn open_root(root: &Path) -> rustix::io::Result<OwnedFd> {
    rfs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Checks, when a home is opened, that its root is a directory.
pub(crate) fn check_root(root: &Path) -> Result<()> {
    let fd =
        rfs::open(root, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(|e| match e {
            Errno::NOENT | Errno::NOTDIR => {
                HomeError::Invalid(format!("home directory {} does not exist", root.display()))
            }
            e => home_error(e, Doing::Object, &root.display()),
        })?;
    let stx = stat_fd(&fd, &root.display())?;
    if kind(&stx) != HomeKind::Dir {
        return Err(HomeError::Invalid(format!(
            "home {} is not a directory",
            root.display()
        )));
    }
    Ok(())
}

/// The object `h` names, opened with `flags` (plus `O_NOFOLLOW`), and its
/// attributes; [`HomeError::Stale`] if its path no longer leads to it.
pub(super) fn find(root: &Path, h: &Decoded, flags: OFlags) -> Result<(OwnedFd, Statx)> {
    let what = Shown(root, &h.path);
    // The root gone (or no directory now): so is every object below it.
    let rootfd = open_root(root).map_err(|e| home_error(e, Doing::Handle, &what))?;
    let path: &[u8] = if h.path.is_empty() { b"." } else { &h.path };
    let fd = rfs::openat2(
        &rootfd,
        std::ffi::OsStr::from_bytes(path),
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )
    .map_err(|e| home_error(e, Doing::Handle, &what))?;
    let stx = stat_fd(&fd, &what)?;
    if !h.is(&stx) {
        tracing::debug!(%what, "handle names another object now");
        return Err(HomeError::Stale);
    }
    Ok((fd, stx))
}

/// Prints as the full path of an object below the root.
pub(crate) struct Shown<'a>(pub &'a Path, pub &'a [u8]);

impl Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.1.is_empty() {
            write!(f, "{}", self.0.display())
        } else {
            write!(
                f,
                "{}/{}",
                self.0.display(),
                Path::new(std::ffi::OsStr::from_bytes(self.1)).display()
            )
        }
    }
}

pub(super) fn kind(stx: &Statx) -> HomeKind {
    match FileType::from_raw_mode(stx.stx_mode.into()) {
        FileType::RegularFile => HomeKind::File,
        FileType::Directory => HomeKind::Dir,
        FileType::Symlink => HomeKind::Symlink,
        FileType::BlockDevice => HomeKind::BlockDev,
        FileType::CharacterDevice => HomeKind::CharDev,
        FileType::Fifo => HomeKind::Fifo,
        FileType::Socket => HomeKind::Socket,
        // statx always reports one of the above; should a file system ever
        // report another, it is shown as the kind nothing reads or lists.
        FileType::Unknown => HomeKind::Socket,
    }
}

fn time(t: &rfs::StatxTimestamp) -> HomeTime {
    HomeTime {
        secs: t.tv_sec,
        nsecs: t.tv_nsec,
    }
}

/// The attributes statx reported, as a home reports them.
pub(crate) fn attr(stx: &Statx) -> HomeAttr {
    let kind = kind(stx);
    let dev = matches!(kind, HomeKind::BlockDev | HomeKind::CharDev);
    HomeAttr {
        kind,
        mode: u32::from(stx.stx_mode) & 0o7777,
        nlink: stx.stx_nlink,
        uid: stx.stx_uid,
        gid: stx.stx_gid,
        size: stx.stx_size,
        used: stx.stx_blocks.saturating_mul(512),
        rdev: if dev {
            (stx.stx_rdev_major, stx.stx_rdev_minor)
        } else {
            (0, 0)
        },
        fsid: rfs::makedev(stx.stx_dev_major, stx.stx_dev_minor),
        fileid: stx.stx_ino,
        atime: time(&stx.stx_atime),
        mtime: time(&stx.stx_mtime),
        ctime: time(&stx.stx_ctime),
    }
}

/// The root's handle and attributes.
pub(crate) fn root(root: &Path) -> Result<(HomeHandle, HomeAttr)> {
    let rootfd = open_root(root).map_err(|e| match e {
        Errno::NOENT | Errno::NOTDIR => {
            HomeError::Unreachable(format!("home directory {} is gone", root.display()))
        }
        e => home_error(e, Doing::Object, &root.display()),
    })?;
    let stx = stat_fd(&rootfd, &root.display())?;
    Ok((Decoded::of(&stx, Vec::new()).encode(), attr(&stx)))
}

/// The attributes of the object `h` names.
pub(crate) fn getattr(root: &Path, h: &Decoded) -> Result<HomeAttr> {
    let (_, stx) = find(root, h, OFlags::PATH)?;
    Ok(attr(&stx))
}

/// Looks `name` (already checked to be one name) up in directory `dir`.
pub(crate) fn lookup(root: &Path, dir: &Decoded, name: &[u8]) -> Result<(HomeHandle, HomeAttr)> {
    let (dfd, dstx) = find(root, dir, OFlags::PATH)?;
    if kind(&dstx) != HomeKind::Dir {
        return Err(HomeError::NotDir);
    }
    let path = dir.child_path(name);
    let what = Shown(root, &path);
    let fd = rfs::openat2(
        &dfd,
        std::ffi::OsStr::from_bytes(name),
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )
    .map_err(|e| home_error(e, Doing::Name, &what))?;
    let stx = stat_fd(&fd, &what)?;
    Ok((Decoded::of(&stx, path).encode(), attr(&stx)))
}

/// One page of directory `dir`'s listing.
///
/// Cookies are the directory stream's own positions: the `d_off` getdents64
/// gives each entry (where the stream continues after it), which is what
/// `telldir` returns and what knfsd and nfs-ganesha hand out as NFSv3
/// cookies. A page seeks there (`lseek` on the directory, i.e. `seekdir`)
/// and reads on, so a page costs what the file system's seek costs (a hash
/// or index look-up on ext4, xfs, btrfs, tmpfs), not a relisting. rustix's
/// `Dir` is used because it exposes exactly that (`DirEntry::offset`,
/// `Dir::seek`) over an fd we opened ourselves, where std's `ReadDir` hides
/// both.
pub(crate) fn read_dir(
    root: &Path,
    dir: &Decoded,
    cookie: u64,
    max_entries: usize,
    plus: bool,
) -> Result<DirPage> {
    let what = Shown(root, &dir.path);
    let (pfd, stx) = find(root, dir, OFlags::PATH)?;
    if kind(&stx) != HomeKind::Dir {
        return Err(HomeError::NotDir);
    }
    // Opened from the O_PATH descriptor found above: the same directory,
    // with no second path walk.
    let dfd = rfs::openat(
        &pfd,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| home_error(e, Doing::Object, &what))?;
    let mut stream = Dir::new(dfd).map_err(|e| home_error(e, Doing::Object, &what))?;
    if cookie != 0 {
        let pos = i64::try_from(cookie).map_err(|_| HomeError::BadCookie)?;
        stream.seek(pos).map_err(|e| match e {
            Errno::INVAL => HomeError::BadCookie,
            e => home_error(e, Doing::Object, &what),
        })?;
    }
    let max_entries = max_entries.max(1);
    let mut entries = Vec::new();
    let mut eof = true;
    while let Some(next) = stream.read() {
        let ent = next.map_err(|e| home_error(e, Doing::Object, &what))?;
        let name = ent.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if entries.len() == max_entries {
            // One entry past the page: the listing goes on.
            eof = false;
            break;
        }
        let cookie = u64::try_from(ent.offset())
            .map_err(|_| HomeError::Io(format!("{what}: negative directory offset")))?;
        let mut entry = HomeEntry {
            name: name.to_bytes().to_vec(),
            fileid: ent.ino(),
            cookie,
            plus: None,
        };
        if plus {
            match plus_of(&stream, dir, name, &what)? {
                Some((h, a)) => {
                    entry.fileid = a.fileid;
                    entry.plus = Some((h, a));
                }
                // Removed since the listing read it.
                None => continue,
            }
        }
        entries.push(entry);
    }
    Ok(DirPage {
        entries,
        verifier: [0; 8],
        eof,
    })
}

/// The handle and attributes of entry `name` of the directory `stream`
/// reads; `None` if it is gone.
fn plus_of(
    stream: &Dir,
    dir: &Decoded,
    name: &CStr,
    what: &dyn Display,
) -> Result<Option<(HomeHandle, HomeAttr)>> {
    let dfd = stream
        .fd()
        .map_err(|e| home_error(e, Doing::Object, what))?;
    match rfs::statx(dfd, name, AtFlags::SYMLINK_NOFOLLOW, mask()) {
        Ok(stx) => {
            let path = dir.child_path(name.to_bytes());
            Ok(Some((Decoded::of(&stx, path).encode(), attr(&stx))))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(home_error(e, Doing::Object, what)),
    }
}

/// The regular file `h` names, opened with `flags`, and its attributes.
/// A fifo or a device is never opened (opening a fifo blocks until the
/// other end comes; opening a device may act): the kind is checked first
/// without opening, and the open is `O_NONBLOCK`, so that should a fifo
/// have taken the file's place since, its open does not wait (and `find`
/// refuses it: another inode).
pub(super) fn open_file(root: &Path, h: &Decoded, flags: OFlags) -> Result<(OwnedFd, Statx)> {
    let (_, stx) = find(root, h, OFlags::PATH)?;
    match kind(&stx) {
        HomeKind::File => {}
        HomeKind::Dir => return Err(HomeError::IsDir),
        k => {
            return Err(HomeError::Invalid(format!(
                "{}: only regular files are read or written, this is a {k:?}",
                Shown(root, &h.path)
            )))
        }
    }
    let (fd, stx) = find(root, h, flags | OFlags::NONBLOCK | OFlags::NOCTTY)?;
    if kind(&stx) != HomeKind::File {
        return Err(HomeError::Stale);
    }
    Ok((fd, stx))
}

/// Up to `len` bytes of regular file `h` from `offset`.
pub(crate) fn read(root: &Path, h: &Decoded, offset: u64, len: u32) -> Result<ReadReply> {
    let what = Shown(root, &h.path);
    let (fd, stx) = open_file(root, h, OFlags::RDONLY)?;
    let want = usize::try_from(len).unwrap_or(usize::MAX);
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        let at = offset.saturating_add(got as u64);
        match rustix::io::pread(&fd, &mut buf[got..], at) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(home_error(e, Doing::Object, &what)),
        }
    }
    buf.truncate(got);
    let eof = got < want || offset.saturating_add(got as u64) >= stx.stx_size;
    Ok(ReadReply {
        data: Bytes::from(buf),
        eof,
    })
}

/// The target of symlink `h`.
pub(crate) fn read_link(root: &Path, h: &Decoded) -> Result<Vec<u8>> {
    let what = Shown(root, &h.path);
    let (fd, stx) = find(root, h, OFlags::PATH)?;
    if kind(&stx) != HomeKind::Symlink {
        return Err(HomeError::Invalid(format!("{what}: not a symbolic link")));
    }
    let target =
        rfs::readlinkat(&fd, c"", Vec::new()).map_err(|e| home_error(e, Doing::Object, &what))?;
    Ok(target.into_bytes())
}
