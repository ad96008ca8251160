//! What is mounted where (`/proc/self/mountinfo`), which kernel device a mount
//! point has, and the kernel readahead of that device.
//!
//! The FUSE connection's readahead window starts at the kernel default
//! (128 KiB) and the FUSE handshake can only lower it; it is raised through the
//! mount's backing-device entry in sysfs, `/sys/class/bdi/MAJOR:MINOR`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

/// A device number as `(major, minor)`.
pub type Dev = (u32, u32);

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount's id (reused by later mounts once this one is gone).
    pub id: u32,
    /// The id of the mount this one sits on (for a mount stacked on another
    /// at the same mount point: that one).
    pub parent: u32,
    /// Where it is mounted (octal escapes undone, bytes kept exactly).
    pub mount_point: PathBuf,
    /// File system type (`fuse`, `fuse.morris`, `ext4`, ...).
    pub fs_type: String,
    /// The mount source (for FUSE: the `fsname`).
    pub source: String,
    /// The device number, when the field parses.
    pub dev: Option<Dev>,
    /// The mount's own options (`rw,nosuid,nodev,relatime`, ...).
    pub options: String,
}

impl MountEntry {
    /// When reads should move access times on this mount, from its
    /// options: never on a read-only or `noatime` mount, `relatime`'s rule
    /// where the kernel shows it, else (`strictatime`) always.
    pub fn atime(&self) -> morris_client::Atime {
        let has = |o: &str| self.options.split(',').any(|x| x == o);
        if has("ro") || has("noatime") {
            morris_client::Atime::Never
        } else if has("relatime") {
            morris_client::Atime::Relative
        } else {
            morris_client::Atime::Strict
        }
    }

    /// True for FUSE mounts.
    pub fn is_fuse(&self) -> bool {
        self.fs_type == "fuse" || self.fs_type.starts_with("fuse.")
    }
}

/// Parses the text of a mountinfo file; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE ...
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if sep < 6 || fields.len() < sep + 3 {
            continue;
        }
        let (Ok(id), Ok(parent)) = (fields[0].parse(), fields[1].parse()) else {
            continue;
        };
        let dev = fields[2]
            .split_once(':')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        out.push(MountEntry {
            id,
            parent,
            mount_point: PathBuf::from(OsString::from_vec(unescape(fields[4]))),
            fs_type: fields[sep + 1].to_string(),
            source: String::from_utf8_lossy(&unescape(fields[sep + 2])).into_owned(),
            dev,
            options: fields[5].to_string(),
        });
    }
    out
}

/// The devices of the file systems mounted on `mountpoint`, bottom first
/// (the last one is the visible one), from the text of `/proc/self/mountinfo`.
#[cfg(test)]
pub(crate) fn devices_in(mountinfo: &str, mountpoint: &Path) -> Vec<Dev> {
    parse(mountinfo)
        .into_iter()
        .filter(|m| m.mount_point == mountpoint)
        .filter_map(|m| m.dev)
        .collect()
}

/// The mounts of device `dev` (one file system can be mounted at several
/// places, e.g. by bind mounts), each with whether another mount covers it.
pub(crate) fn mounts_of(mountinfo: &str, dev: Dev) -> Vec<(MountEntry, bool)> {
    let all = parse(mountinfo);
    all.iter()
        .filter(|m| m.dev == Some(dev))
        .map(|m| {
            let covered = all
                .iter()
                .any(|o| o.parent == m.id && o.mount_point == m.mount_point);
            (m.clone(), covered)
        })
        .collect()
}

/// The text of `/proc/self/mountinfo`, if readable.
pub(crate) fn read() -> Option<String> {
    std::fs::read_to_string("/proc/self/mountinfo").ok()
}

/// The device of the file system visible on `mountpoint` now.
#[cfg(test)]
pub(crate) fn device(mountpoint: &Path) -> Option<Dev> {
    devices_in(&read()?, mountpoint).last().copied()
}

/// Undoes the kernel's octal escaping of spaces, tabs, newlines and
/// backslashes in mountinfo paths.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Sets the kernel readahead window of a FUSE mount's device, in bytes
/// (rounded down to KiB).
pub(crate) fn set_readahead(dev: Dev, bytes: u32) -> std::io::Result<()> {
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", dev.0, dev.1);
    std::fs::write(path, format!("{}\n", bytes / 1024))
}

/// The kernel readahead window of a device, in bytes.
#[cfg(test)]
pub(crate) fn readahead(dev: Dev) -> std::io::Result<u64> {
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", dev.0, dev.1);
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse::<u64>()
        .map(|kb| kb * 1024)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:31 / /mnt/a rw,nosuid,nodev,relatime shared:9 - fuse.morris morris rw,user_id=0,group_id=0,default_permissions,allow_other
36 22 0:32 / /mnt/with\\040space rw - fuse.morris morris rw
37 35 0:33 / /mnt/a rw - fuse.morris other rw
38 22 0:34 / /mnt/back\\134slash rw - tmpfs tmpfs rw
garbage line
39 22 bad / /mnt/bad rw - tmpfs tmpfs rw
";

    #[test]
    fn finds_mounts_bottom_first() {
        assert_eq!(devices_in(SAMPLE, Path::new("/")), [(8, 1)]);
        // Two mounts on /mnt/a: the later one hides the earlier.
        assert_eq!(devices_in(SAMPLE, Path::new("/mnt/a")), [(0, 31), (0, 33)]);
        assert_eq!(devices_in(SAMPLE, Path::new("/mnt/with space")), [(0, 32)]);
        assert_eq!(devices_in(SAMPLE, Path::new("/mnt/back\\slash")), [(0, 34)]);
        assert!(devices_in(SAMPLE, Path::new("/mnt/bad")).is_empty());
        assert!(devices_in(SAMPLE, Path::new("/mnt")).is_empty());
        assert!(devices_in("", Path::new("/")).is_empty());
    }

    #[test]
    fn mounts_of_a_device_and_what_covers_them() {
        let a = mounts_of(SAMPLE, (0, 31));
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].0.mount_point, Path::new("/mnt/a"));
        assert_eq!((a[0].0.id, a[0].0.parent), (35, 22));
        assert!(a[0].1, "mount 37 sits on 35 at the same path");
        let top = mounts_of(SAMPLE, (0, 33));
        assert_eq!(top.len(), 1);
        assert!(!top[0].1);
        assert!(mounts_of(SAMPLE, (0, 99)).is_empty());
    }

    #[test]
    fn access_time_rule_from_the_mount_options() {
        use morris_client::Atime;
        let at = |options: &str| {
            MountEntry {
                id: 1,
                parent: 0,
                mount_point: "/m".into(),
                fs_type: "fuse.morris".into(),
                source: "morris".into(),
                dev: None,
                options: options.into(),
            }
            .atime()
        };
        assert_eq!(at("rw,nosuid,nodev,relatime"), Atime::Relative);
        assert_eq!(at("rw,nosuid,nodev"), Atime::Strict);
        assert_eq!(at("rw,noatime"), Atime::Never);
        assert_eq!(at("ro,nosuid,nodev,relatime"), Atime::Never);
        assert_eq!(at("ro"), Atime::Never);
        // Options are whole words: "nodiratime" is not "noatime".
        assert_eq!(at("rw,nodiratime"), Atime::Strict);
        let parsed = parse(SAMPLE);
        assert_eq!(parsed[1].options, "rw,nosuid,nodev,relatime");
        assert_eq!(parsed[1].atime(), Atime::Relative);
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\040b"), b"a b");
        assert_eq!(unescape("a\\011b\\012c"), b"a\tb\nc");
        assert_eq!(unescape("\\777"), b"\\777");
        assert_eq!(unescape("tail\\04"), b"tail\\04");
        assert_eq!(unescape("\\"), b"\\");
        assert_eq!(unescape("\\x41"), b"\\x41");
    }

    #[test]
    fn the_root_file_system_is_found() {
        if read().is_some() {
            assert!(device(Path::new("/")).is_some());
        }
    }
}
