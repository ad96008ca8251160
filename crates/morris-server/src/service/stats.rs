//! What a server reports about itself: disk space (`Statfs`, the space
//! kept for metadata) and its counters (`Status`).

use std::sync::atomic::Ordering;

use morris_proto::{IntegrityStatus, RangeUsage, Reply, ServerStats, WireError};
use tracing::warn;

use super::{blocking, Server, OPS};

impl Server {
    /// Bytes in all and bytes available on the data directory's disk.
    pub(super) fn disk(&self) -> (u64, u64) {
        let d = self.disk_space();
        (d.total, d.avail)
    }

    fn disk_space(&self) -> DiskSpace {
        match statvfs(&self.data_dir) {
            Ok(v) => v,
            Err(e) => {
                warn!(error = %e, dir = %self.data_dir.display(), "statvfs failed");
                DiskSpace::default()
            }
        }
    }

    pub(super) async fn statfs(&self) -> Result<Reply, WireError> {
        let DiskSpace {
            total,
            free,
            avail,
            inodes_free,
            fsid,
        } = self.disk_space();
        let disk = disk_id(fsid);
        let files = match self.ranges() {
            Ok(r) => r
                .serving(self.now_ms())
                .iter()
                .map(|x| x.store.inode_count())
                .sum(),
            Err(_) => self.store.inode_count(),
        };
        Ok(Reply::Statfs {
            total,
            free,
            avail,
            files,
            inodes_free,
            disk,
        })
    }

    /// What each user and group stores in the ranges served here now.
    pub(super) async fn usage(&self) -> Result<Reply, WireError> {
        let serving = self.ranges()?.serving(self.now_ms());
        blocking(move || {
            serving
                .iter()
                .map(|r| {
                    Ok(RangeUsage {
                        range: r.range,
                        rows: r.store.usage()?,
                    })
                })
                .collect::<Result<Vec<_>, WireError>>()
                .map(Reply::Usage)
        })
        .await
    }

    pub(super) async fn status(&self) -> Result<ServerStats, WireError> {
        let data_bytes = self.data_bytes().await?;
        self.snapshot(data_bytes).await
    }

    /// Bytes of block data held on this server's disk. Walks every data
    /// file: O(files), for an admin command (and a metrics scrape now and
    /// then, `metrics.rs`).
    pub(super) async fn data_bytes(&self) -> Result<u64, WireError> {
        let formatted = self.store.formatted();
        let store = self.store.clone();
        let blocks = self.blocks.clone();
        let copies = formatted.as_ref().map_or(1, |f| f.descriptor.replicas);
        blocking(move || {
            let mut total = 0u64;
            let mut after = 0;
            loop {
                let ids = store.scan_data_files(after, 16384)?;
                let Some(&last) = ids.last() else { break };
                for id in ids {
                    total = total.saturating_add(blocks.allocated(id, copies)?.unwrap_or(0));
                }
                after = last;
            }
            Ok(total)
        })
        .await
    }

    /// The server's counters and state now, with `data_bytes` as given.
    pub(super) async fn snapshot(&self, data_bytes: u64) -> Result<ServerStats, WireError> {
        let formatted = self.store.formatted();
        let (disk_total, disk_free) = self.disk();
        let (leases, recalls) = {
            let st = self.leases.lock();
            (st.table.lease_count(), st.table.recalls_sent())
        };
        let sessions = self.sessions.lock().by_client.len() as u64;
        let store = self.store.clone();
        let stale_by_server = if formatted.is_some() {
            blocking(move || store.stale_counts()).await?
        } else {
            Vec::new()
        };
        let net = self.conn_limits.counters();
        Ok(ServerStats {
            index: formatted.as_ref().map(|f| f.index),
            volume: formatted.as_ref().map(|f| f.descriptor.uuid),
            inodes: self.store.inode_count(),
            entries: self.store.entry_count(),
            data_files: self.store.data_file_count(),
            data_bytes,
            leases,
            sessions,
            requests: self.requests.load(Ordering::Relaxed),
            requests_by_op: OPS
                .iter()
                .zip(&self.by_op)
                .map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)))
                .filter(|(_, c)| *c > 0)
                .collect(),
            recalls,
            uptime_secs: self.started.elapsed().as_secs(),
            disk_free,
            disk_total,
            io_inflight: self.load.inflight(),
            read_service_us: self.load.service_us().0,
            write_service_us: self.load.service_us().1,
            stale_by_server,
            resync: self.resync.lock().clone(),
            rebuilding: self.rebuild_pending(),
            ranges: self
                .ranges()
                .map(|r| r.list.iter().map(|x| x.status(self.now_ms())).collect())
                .unwrap_or_default(),
            connections: net.open,
            reply_bytes: net.reply_bytes,
            connections_refused: net.refused,
            connections_stalled: net.stalled,
            integrity: {
                let s = self.blocks.sum_stats();
                IntegrityStatus {
                    bad_chunks: s.bad_chunks.load(Ordering::Relaxed),
                    checked_bytes: s.checked_bytes.load(Ordering::Relaxed),
                    resealed_chunks: s.resealed_chunks.load(Ordering::Relaxed),
                    repairs: self.repairs.load(Ordering::Relaxed),
                    unrepairable: self.unrepairable.load(Ordering::Relaxed),
                    fenced: self.fences.refused(),
                    scrub: self.scrubber.status(),
                }
            },
        })
    }
}

/// (total, free-for-unprivileged) bytes of the file system holding `path`.
// The statvfs field types are u32 or u64 depending on the platform.
#[allow(clippy::useless_conversion)]
/// What `statvfs` says of a disk.
#[derive(Debug, Default, Clone, Copy)]
struct DiskSpace {
    total: u64,
    free: u64,
    avail: u64,
    /// `f_favail`, or `u64::MAX` if the file system does not count inodes.
    inodes_free: u64,
    fsid: u64,
}

/// The disk `fsid` of this host, as one number: the same for every server
/// of this host on that disk (the host's machine id, or its name, and the
/// file system id, hashed).
fn disk_id(fsid: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let host = std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (host, fsid).hash(&mut h);
    h.finish()
}

fn statvfs(path: &std::path::Path) -> std::io::Result<DiskSpace> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut v = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `v` points to writable
    // memory of the right size; statvfs fills it on success.
    let r = unsafe { libc::statvfs(c.as_ptr(), v.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so the struct is initialized.
    let v = unsafe { v.assume_init() };
    // 64-bit Linux: every field is a u64 already.
    let frsize = v.f_frsize;
    Ok(DiskSpace {
        total: v.f_blocks.saturating_mul(frsize),
        free: v.f_bfree.saturating_mul(frsize),
        avail: v.f_bavail.saturating_mul(frsize),
        inodes_free: if v.f_files == 0 { u64::MAX } else { v.f_favail },
        fsid: v.f_fsid,
    })
}
