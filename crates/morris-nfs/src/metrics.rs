//! What the NFS gateway exports to Prometheus (issue 20): each call's time,
//! from the moment the gateway has read it to the moment its reply is
//! handed to the connection, by procedure (`read`, `write`, `mount`, `nlm`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use morris_proto::observe::OpTimers;
use parking_lot::Mutex;

use crate::local::Proc;

const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;
const NLM_PROGRAM: u32 = 100_021;
const NSM_PROGRAM: u32 = 100_024;

/// NFSv3's procedures by number (RFC 1813).
const NFS3_PROCS: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

/// Calls relayed and not yet answered, per connection; more than this
/// (replies a backend never sent) and the oldest are forgotten.
const MAX_PENDING: usize = 4096;

/// The label of a call: its NFSv3 procedure, or its program.
pub(crate) fn proc_name(p: &Proc) -> &'static str {
    match (p.prog, p.vers) {
        (NFS_PROGRAM, 3) => NFS3_PROCS.get(p.proc_ as usize).copied().unwrap_or("other"),
        (MOUNT_PROGRAM, _) => "mount",
        (NLM_PROGRAM, _) => "nlm",
        (NSM_PROGRAM, _) => "nsm",
        _ => "other",
    }
}

/// The gateway's call timers.
pub(crate) struct NfsMetrics {
    timers: OpTimers,
}

impl NfsMetrics {
    pub(crate) fn new() -> Self {
        let mut names = NFS3_PROCS.to_vec();
        names.extend(["mount", "nlm", "nsm", "other"]);
        NfsMetrics {
            timers: OpTimers::new("morris_nfs_request_duration_seconds", None, &names),
        }
    }

    /// Records a call answered `started` ago.
    pub(crate) fn answered(&self, name: &'static str, started: Instant) {
        self.timers.record(name, started.elapsed(), false);
    }
}

/// One connection's relayed calls waiting for their replies, by xid.
#[derive(Clone, Default)]
pub(crate) struct Pending(Arc<Mutex<HashMap<u32, (&'static str, Instant)>>>);

impl Pending {
    /// Notes a call relayed now.
    pub(crate) fn sent(&self, xid: u32, name: &'static str) {
        let mut m = self.0.lock();
        if m.len() >= MAX_PENDING {
            m.clear();
        }
        m.insert(xid, (name, Instant::now()));
    }

    /// The call a reply with `xid` answers, if it was noted.
    pub(crate) fn answered(&self, xid: u32) -> Option<(&'static str, Instant)> {
        self.0.lock().remove(&xid)
    }
}
