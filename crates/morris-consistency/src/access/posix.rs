//! [`Access`] through real system calls on a local path: a FUSE mount of a
//! volume, or any local directory (the reference every workload must pass).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{Access, Attr, ErrCode, FsError, Handle};

/// A directory reached through system calls.
#[derive(Debug)]
pub struct PosixAccess {
    dir: PathBuf,
    label: String,
}

/// close(2) with its result (dropping a `File` ignores close's error, which
/// is where a failed write-back shows on some file systems).
pub fn close_checked(f: File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was taken out of the File, so we own it and close it once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads up to `len` bytes at `offset` with pread, looping over short reads;
/// fewer bytes only at end of file.
pub fn pread_full(f: &File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Reads a whole file through `f` from offset 0 (at most [`super::READ_LIMIT`]).
pub fn pread_all(f: &File) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let chunk = pread_full(f, out.len() as u64, 1 << 20)?;
        if chunk.is_empty() {
            return Ok(out);
        }
        out.extend_from_slice(&chunk);
        if out.len() > super::READ_LIMIT {
            return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
        }
    }
}

impl PosixAccess {
    /// Access to `dir`, which must exist.
    pub fn new(dir: PathBuf, label: String) -> Result<PosixAccess, FsError> {
        let md = std::fs::metadata(&dir)
            .map_err(|e| FsError::io("stat", &dir.display().to_string(), &e))?;
        if !md.is_dir() {
            return Err(FsError {
                op: "stat",
                name: dir.display().to_string(),
                code: ErrCode::other(libc::ENOTDIR, "not a directory"),
            });
        }
        Ok(PosixAccess { dir, label })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn file<'h>(h: &'h mut Handle, op: &'static str) -> Result<&'h File, FsError> {
    match h {
        Handle::Posix(f) => Ok(f),
        Handle::Nfs(_) => Err(FsError {
            op,
            name: String::new(),
            code: ErrCode::other(libc::EBADF, "an NFS handle given to POSIX access"),
        }),
    }
}

impl Access for PosixAccess {
    fn label(&self) -> &str {
        &self.label
    }

    fn is_nfs(&self) -> bool {
        false
    }

    fn create_excl(&mut self, name: &str) -> Result<Handle, FsError> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(self.path(name))
            .map(Handle::Posix)
            .map_err(|e| FsError::io("create(O_EXCL)", name, &e))
    }

    fn open_read(&mut self, name: &str) -> Result<Handle, FsError> {
        File::open(self.path(name))
            .map(Handle::Posix)
            .map_err(|e| FsError::io("open", name, &e))
    }

    fn write_at(&mut self, h: &mut Handle, offset: u64, data: &[u8]) -> Result<(), FsError> {
        file(h, "pwrite")?
            .write_all_at(data, offset)
            .map_err(|e| FsError::io("pwrite", "", &e))
    }

    fn read_at(&mut self, h: &mut Handle, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        pread_full(file(h, "pread")?, offset, len).map_err(|e| FsError::io("pread", "", &e))
    }

    fn sync(&mut self, h: &mut Handle) -> Result<(), FsError> {
        file(h, "fsync")?
            .sync_all()
            .map_err(|e| FsError::io("fsync", "", &e))
    }

    fn close(&mut self, h: Handle) -> Result<(), FsError> {
        match h {
            Handle::Posix(f) => close_checked(f).map_err(|e| FsError::io("close", "", &e)),
            Handle::Nfs(_) => Ok(()),
        }
    }

    fn attr(&mut self, h: &mut Handle) -> Result<Attr, FsError> {
        let md = file(h, "fstat")?
            .metadata()
            .map_err(|e| FsError::io("fstat", "", &e))?;
        Ok(Attr {
            size: md.len(),
            ino: md.ino(),
        })
    }

    fn stat(&mut self, name: &str) -> Result<Attr, FsError> {
        let md = std::fs::metadata(self.path(name)).map_err(|e| FsError::io("stat", name, &e))?;
        Ok(Attr {
            size: md.len(),
            ino: md.ino(),
        })
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        std::fs::rename(self.path(from), self.path(to))
            .map_err(|e| FsError::io("rename", &format!("{from} -> {to}"), &e))
    }

    fn remove(&mut self, name: &str) -> Result<(), FsError> {
        std::fs::remove_file(self.path(name)).map_err(|e| FsError::io("unlink", name, &e))
    }

    fn list(&mut self) -> Result<Vec<String>, FsError> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| FsError::io("opendir", "", &e))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| FsError::io("readdir", "", &e))?;
            out.push(ent.file_name().to_string_lossy().into_owned());
        }
        Ok(out)
    }

    fn mkdir(&mut self, name: &str) -> Result<(), FsError> {
        std::fs::create_dir(self.path(name)).map_err(|e| FsError::io("mkdir", name, &e))
    }

    fn rmdir(&mut self, name: &str) -> Result<(), FsError> {
        std::fs::remove_dir(self.path(name)).map_err(|e| FsError::io("rmdir", name, &e))
    }
}
