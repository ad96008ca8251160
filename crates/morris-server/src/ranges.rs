//! Metadata ranges and who serves them: **where metadata ownership moves**.
//!
//! The inodes with `id mod k == r` (their directory entries, stale-copy
//! records and leases) form *range r*. Without mirroring, server r keeps and
//! serves range r alone. On a mirrored volume range r has one copy per
//! replica (at most three): at server r (its *home*, file `meta.sqlite`),
//! at server r+1 (file `mirror.sqlite`) and, with `--replicas 3`, at server
//! r+2 (`mirror2.sqlite`). One copy is the **primary** (serves clients,
//! ships every committed change to every other copy before answering:
//! `peer.rs`), the others are **secondaries**. Of the secondaries, the
//! primary's *successor* (the next holder after it: r+1 for r, r+2 for r+1,
//! r for r+2) is its **candidate**, the only copy that may take the range
//! over; the primary tells each secondary in `PeerSync` whether it is the
//! candidate. A third copy only follows (it keeps every answered change, so
//! two lost servers lose nothing) until a primary names it candidate: after
//! a takeover, or when the candidate was seen dead (`peer.rs` `follow`). In
//! the rules below "the secondary" is the candidate.
//!
//! Safety rule (no two servers serve a range at once, even across a network
//! split), the static two-copy rule (with `--etcd`, etcd decides instead:
//! `arbiter.rs`):
//!
//! | who | may | only while |
//! |---|---|---|
//! | primary | serve the range | it has confirmed its role with the secondary in this process life (`established`), and either the secondary's copy cannot be current (`!peer_in_sync`: the secondary's process was seen dead — connection refused — or it never received a snapshot in its own process life) or its *ownership lease* holds: `now < own_until`, renewed by every answer of the secondary, counted from when the request was sent |
//! | secondary | take the range over | its copy is current (`in_sync`: a snapshot and every later change from the primary arrived in *this* process life) and the primary has been silent for the ownership lease plus a margin (`own_ms + margin` after the last message it received) |
//!
//! A takeover raises the range's generation and persists it before
//! anything is served; the old primary, when it comes back, learns of the
//! higher generation in its first `PeerSync` and becomes the secondary (a
//! snapshot then brings its copy up to date). A primary whose ownership
//! lease runs out stops serving: its lease table is dropped, every session
//! closed, its epoch changed (clients drop its leases, as after a restart),
//! and every range it serves gets a new grace period. A server that takes a
//! range over serves it only after a lease time of grace, so leases granted
//! by the old primary have run out first.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use morris_proto::{ErrorCode, FileId, RangeStatus, WireError};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::arbiter::Arbiter;
use crate::leases::Millis;
use crate::store::Store;

/// Who serves a range copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Serves the range (once established).
    Primary,
    /// Keeps a copy; may take over.
    Secondary,
}

/// The mutable state of one range copy.
#[derive(Debug)]
pub(crate) struct RangeState {
    pub role: Role,
    /// Ownership generation (persisted).
    pub gen: u64,
    /// Primary: the role was confirmed with the secondary (or taken over)
    /// in this process life.
    pub established: bool,
    /// Primary: per secondary (in `Range::peers` order), its copy may be
    /// current. For the candidate (first) this means it could take over and
    /// the ownership lease is needed; for every secondary, that answers
    /// wait for it.
    pub peer_in_sync: Vec<bool>,
    /// Primary: ownership lease end (ms since the server started).
    pub own_until: Millis,
    /// Primary: the ownership lease ran out; not serving until confirmed again.
    pub lapsed: bool,
    /// Lease-taking requests before this time get `Grace`.
    pub grace_until: Millis,
    /// Secondary: copy is current as of (`lineage`, `seq`).
    pub in_sync: bool,
    /// The change stream this copy follows (primary: the one it sends).
    pub lineage: u64,
    /// Secondary: last change applied.
    pub seq: u64,
    /// Secondary: when the primary was last heard from.
    pub last_heard: Millis,
    /// Takeovers by this server since start.
    pub takeovers: u64,
    /// Secondary with an arbiter: a takeover is being asked for.
    pub taking_over: bool,
    /// Secondary: the current primary named this copy its candidate (in
    /// this process life).
    pub candidate: bool,
    /// Primary: the index in `Range::peers` of its candidate (its successor
    /// at first; the next copy once the candidate was seen dead).
    pub cand: usize,
}

impl RangeState {
    /// Primary: the candidate's copy may be current (it could take over).
    pub fn candidate_in_sync(&self) -> bool {
        self.peer_in_sync.get(self.cand).copied().unwrap_or(false)
    }
}

/// Another server holding a copy of a range.
pub(crate) struct Peer {
    /// Its index.
    pub server: u32,
    /// Its address.
    pub addr: String,
    /// Highest change it has applied (while this copy is primary).
    pub acked: watch::Sender<u64>,
}

/// One copy of one metadata range kept by this server.
pub(crate) struct Range {
    /// The range number.
    pub range: u32,
    /// The other servers holding this range, this server's successor
    /// (its candidate when primary) first; empty when not mirrored.
    pub peers: Vec<Peer>,
    /// The copy.
    pub store: Arc<Store>,
    /// Role file (`<gen> <primary|secondary>`).
    state_path: PathBuf,
    /// State; never held across an await.
    pub st: Mutex<RangeState>,
    /// Bumped whenever the range's role or peer state changes (wakes waiters).
    pub changed: watch::Sender<u64>,
    /// Secondary: one `Replicate` / `SnapshotChunk` applied at a time.
    pub apply: tokio::sync::Mutex<()>,
    /// etcd decides ownership instead of the two copies (`arbiter.rs`).
    pub arbiter: Option<Arc<Arbiter>>,
}

/// The ranges this server keeps: its home range first.
pub(crate) struct Ranges {
    /// Servers in the volume.
    pub k: u32,
    /// This server's index.
    pub me: u32,
    /// Home range (index 0) and, on mirrored volumes, the predecessor's (1).
    pub list: Vec<Arc<Range>>,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> WireError {
    WireError::new(ErrorCode::Io, format!("{what} {}: {e}", path.display()))
}

/// Reads a role file; `None` if it does not exist.
fn load_role(path: &Path) -> Result<Option<(u64, Role)>, WireError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", path, e)),
    };
    let mut it = text.split_whitespace();
    let gen = it.next().and_then(|g| g.parse::<u64>().ok());
    let role = match it.next() {
        Some("primary") => Some(Role::Primary),
        Some("secondary") => Some(Role::Secondary),
        _ => None,
    };
    match (gen, role) {
        (Some(g), Some(r)) => Ok(Some((g, r))),
        _ => Err(WireError::new(
            ErrorCode::Io,
            format!("{}: unreadable role file {text:?}", path.display()),
        )),
    }
}

/// Writes a role file durably (temp file, fsync, rename, fsync directory).
pub(crate) fn save_role(path: &Path, gen: u64, role: Role) -> Result<(), WireError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let text = format!(
        "{gen} {}\n",
        match role {
            Role::Primary => "primary",
            Role::Secondary => "secondary",
        }
    );
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err("create", &tmp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("rename", path, e))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("sync", dir, e))?;
    }
    Ok(())
}

impl Range {
    /// A range copy with its persisted role (or `default` if none was saved).
    pub fn open(
        range: u32,
        peers: Vec<(u32, String)>,
        store: Arc<Store>,
        state_path: PathBuf,
        default: Role,
        grace_until: Millis,
        arbiter: Option<Arc<Arbiter>>,
    ) -> Result<Range, WireError> {
        let (gen, role) = load_role(&state_path)?.unwrap_or((1, default));
        let unmirrored = peers.is_empty();
        let n = peers.len();
        let peers = peers
            .into_iter()
            .map(|(server, addr)| Peer {
                server,
                addr,
                acked: watch::channel(0).0,
            })
            .collect();
        Ok(Range {
            range,
            peers,
            store,
            state_path,
            st: Mutex::new(RangeState {
                role: if unmirrored { Role::Primary } else { role },
                gen,
                // Without a copy there is nobody to confirm with.
                established: unmirrored,
                peer_in_sync: vec![false; n],
                own_until: 0,
                lapsed: false,
                grace_until,
                in_sync: false,
                lineage: 0,
                seq: 0,
                last_heard: 0,
                takeovers: 0,
                taking_over: false,
                candidate: false,
                cand: 0,
            }),
            changed: watch::channel(0).0,
            apply: tokio::sync::Mutex::new(()),
            arbiter,
        })
    }

    /// Persists `gen` and `role`.
    pub fn persist(&self, gen: u64, role: Role) -> Result<(), WireError> {
        save_role(&self.state_path, gen, role)
    }

    /// Wakes whoever waits on this range's state.
    pub fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Why this copy may not serve requests now, if it may not.
    pub fn refusal(&self, now: Millis) -> Option<WireError> {
        let st = self.st.lock();
        let why = if st.role != Role::Primary {
            "this server keeps the other copy of metadata range"
        } else if !st.established {
            "this server has not yet confirmed its ownership of metadata range"
        } else if self.ownership_ended(&st, now) {
            "this server's ownership lease lapsed for metadata range"
        } else {
            return None;
        };
        Some(WireError::new(
            ErrorCode::NotOwner,
            format!("{why} {}", self.range),
        ))
    }

    /// True if the primary's ownership ran out: its etcd lease (with an
    /// arbiter) or its ownership lease from the copy (without).
    pub fn ownership_ended(&self, st: &RangeState, now: Millis) -> bool {
        st.lapsed
            || match &self.arbiter {
                Some(a) => !a.valid(now),
                None => st.candidate_in_sync() && now >= st.own_until,
            }
    }

    /// Remaining grace (ms), if any.
    pub fn grace_left(&self, now: Millis) -> Option<Millis> {
        let g = self.st.lock().grace_until;
        (now < g).then(|| g - now)
    }

    /// True if this copy is the primary and serving.
    pub fn serving(&self, now: Millis) -> bool {
        self.refusal(now).is_none()
    }

    /// What `morris status` shows of this copy.
    pub fn status(&self, now: Millis) -> RangeStatus {
        let serving = self.serving(now);
        let st = self.st.lock();
        RangeStatus {
            range: self.range,
            primary: st.role == Role::Primary,
            ready: if st.role == Role::Primary {
                serving
            } else {
                st.in_sync
            },
            gen: st.gen,
            peer_in_sync: st.role == Role::Primary
                && !st.peer_in_sync.is_empty()
                && st.peer_in_sync.iter().all(|x| *x),
            candidate: st.role == Role::Secondary && st.candidate,
            inodes: self.store.inode_count(),
            takeovers: st.takeovers,
        }
    }
}

impl Ranges {
    /// The copy of range `r`, if this server keeps one.
    pub fn of_range(&self, r: u32) -> Option<&Arc<Range>> {
        self.list.iter().find(|x| x.range == r)
    }

    /// The home range (this server's own inode ids).
    pub fn home(&self) -> &Arc<Range> {
        &self.list[0]
    }

    /// The copy that serves `id`'s range here, or why there is none.
    pub fn serving_id(&self, id: FileId, now: Millis) -> Result<&Arc<Range>, WireError> {
        let r = (id % u64::from(self.k.max(1))) as u32;
        let Some(range) = self.of_range(r) else {
            return Err(WireError::new(
                ErrorCode::NotOwner,
                format!(
                    "server {} keeps no copy of metadata range {r} (inode {id})",
                    self.me
                ),
            ));
        };
        match range.refusal(now) {
            None => Ok(range),
            Some(e) => Err(e),
        }
    }

    /// The copies this server serves now.
    pub fn serving(&self, now: Millis) -> Vec<Arc<Range>> {
        self.list
            .iter()
            .filter(|r| r.serving(now))
            .cloned()
            .collect()
    }
}
