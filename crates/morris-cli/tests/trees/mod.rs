//! Comparing file trees, for the cache tests: names, attributes, bytes.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What is compared of each object: kind, mode, owner, size, mtime, link
/// count, device number, symlink target.
#[derive(Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub nlink: u64,
    pub rdev: u64,
    pub target: Option<PathBuf>,
}

pub fn meta(p: &Path) -> Meta {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    let ft = m.file_type();
    use std::os::unix::fs::FileTypeExt;
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_file() {
        "file"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_char_device() {
        "chardev"
    } else if ft.is_block_device() {
        "blockdev"
    } else {
        "socket"
    };
    Meta {
        kind,
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        // A directory's size is the file system's own business.
        size: if ft.is_dir() { 0 } else { m.len() },
        mtime: (m.mtime(), m.mtime_nsec()),
        nlink: if ft.is_dir() { 0 } else { m.nlink() },
        rdev: m.rdev(),
        target: ft.is_symlink().then(|| fs::read_link(p).expect("readlink")),
    }
}

/// Every path below `root`, relative, sorted.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        for e in fs::read_dir(&abs).unwrap_or_else(|e| panic!("list {}: {e}", abs.display())) {
            let e = e.expect("dir entry");
            let r = rel.join(e.file_name());
            if e.file_type().expect("file type").is_dir() {
                stack.push(r.clone());
            }
            out.push(r);
        }
    }
    out.sort();
    out
}

/// Compares two files' bytes in 4 MiB pieces.
pub fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        File::open(a).expect("open a"),
        File::open(b).expect("open b"),
    );
    let (mut ba, mut bb) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

pub fn read_full(f: &mut File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => panic!("read: {e}"),
        }
    }
    n
}

/// Checks that `cache` shows exactly `home`: the same names, attributes
/// and bytes.
pub fn assert_same_tree(home: &Path, cache: &Path) {
    let want = walk(home);
    let got = walk(cache);
    assert_eq!(
        got.len(),
        want.len(),
        "number of objects under {}",
        cache.display()
    );
    assert!(got == want, "names differ under {}", cache.display());
    for rel in &want {
        let (h, c) = (home.join(rel), cache.join(rel));
        assert_eq!(meta(&c), meta(&h), "{}", rel.display());
        if meta(&h).kind == "file" {
            assert!(same_bytes(&h, &c), "{}: bytes differ", rel.display());
        }
    }
}

/// A temporary directory for a home.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("morris-home-")
        .tempdir()
        .expect("tempdir")
}
