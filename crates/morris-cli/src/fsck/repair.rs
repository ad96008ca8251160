//! Carrying out a repair [`Plan`] against the servers.
//!
//! Every action re-reads what it is about to change and does nothing if that
//! changed since the scan; lease-taking requests ride out a server's grace
//! period; every lease taken is given back at once.

use std::time::Duration;

use anyhow::{anyhow, Result};
use morris_proto::layout::Layout;
use morris_proto::net::RpcError;
use morris_proto::{ErrorCode, FileId, Handle, Inode, Reply, Request, SetAttr, Timestamp};
use tracing::{info, warn};

use super::check::{FixDir, Plan, Reclaim, RemoveEntry, RemoveWhy, SetNlink, SetParent};
use crate::admin::Session;
use crate::size::human;

/// What happened to each action.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Actions carried out.
    pub done: usize,
    /// Actions not needed any more, with the reason.
    pub skipped: Vec<String>,
    /// Actions that failed, with the error.
    pub failed: Vec<String>,
}

/// The servers of a volume, with sessions that may take leases.
pub struct Repairer<'a> {
    sessions: &'a [Session],
    layout: Layout,
    grace: Duration,
    cutoff: Timestamp,
}

fn is_gone(e: &RpcError) -> bool {
    matches!(e.code(), ErrorCode::NotFound | ErrorCode::Stale)
}

impl<'a> Repairer<'a> {
    /// `sessions[i]` is server `i`, opened with the volume's uuid. Inodes
    /// changed at or after `cutoff` are not reclaimed.
    pub fn new(sessions: &'a [Session], layout: Layout, cutoff: Timestamp) -> Self {
        let lease_ms = sessions.iter().map(|s| s.lease_ms).max().unwrap_or(10_000);
        Repairer {
            sessions,
            layout,
            grace: Duration::from_millis(u64::from(lease_ms) * 2) + Duration::from_secs(5),
            cutoff,
        }
    }

    /// Sends `req` about inode `id` to the server that serves its metadata
    /// range (through a restart's grace): its home, or on a mirrored volume
    /// the first of the range's other copies that does not answer
    /// `NotOwner` (one of them took the range over). Returns that server
    /// with its answer.
    async fn at_owner(&self, id: FileId, req: &Request) -> (&Session, Result<Reply, RpcError>) {
        let home = self.layout.inode_server(id);
        let mut s = &self.sessions[home as usize];
        let mut r = s.call_through_grace(req, self.grace).await;
        for h in self.layout.meta_holders(home).into_iter().skip(1) {
            if !matches!(&r, Err(e) if e.code() == ErrorCode::NotOwner) {
                break;
            }
            s = &self.sessions[h as usize];
            r = s.call_through_grace(req, self.grace).await;
        }
        (s, r)
    }

    /// Reads an inode; `None` if it does not exist.
    async fn get(&self, id: FileId) -> Result<Option<Inode>> {
        let req = Request::GetInode { ino: id };
        let (s, r) = self.at_owner(id, &req).await;
        match r {
            Ok(Reply::Inode(i)) => Ok(Some(i)),
            Ok(other) => Err(crate::admin::unexpected(&req, &s.addr, &other)),
            Err(e) if is_gone(&e) => Ok(None),
            Err(e) => Err(anyhow!("GetInode {id} on {}: {e}", s.addr)),
        }
    }

    /// Sends a lease-taking request to `ino`'s owner, then gives the lease back.
    async fn leased(&self, ino: FileId, req: Request) -> Result<Reply, RpcError> {
        let (s, r) = self.at_owner(ino, &req).await;
        if let Err(e) = s.call(&Request::Release { ino }).await {
            warn!(ino, error = %e, "cannot release a lease");
        }
        r
    }

    async fn remove_entry(&self, a: &RemoveEntry) -> Result<Option<String>> {
        let name = String::from_utf8_lossy(&a.name);
        if a.why == RemoveWhy::Dangling {
            if let Some(i) = self.get(a.child.id).await? {
                if i.gen == a.child.gen {
                    return Ok(Some(format!(
                        "entry {name:?} in directory {}: inode {} exists now (created during the scan)",
                        a.dir.id, a.child.id
                    )));
                }
            }
        }
        let req = Request::Unlink {
            dir: a.dir,
            name: a.name.clone(),
            expect: Some(a.child.id),
            op: 0,
        };
        match self.leased(a.dir.id, req).await {
            Ok(_) => {
                info!(dir = a.dir.id, name = %name, child = a.child.id, why = ?a.why, "removed entry");
                Ok(None)
            }
            Err(e) if e.code() == ErrorCode::NotFound => Ok(Some(format!(
                "entry {name:?} in directory {} is already gone",
                a.dir.id
            ))),
            Err(e) => Err(anyhow!(
                "removing {name:?} from directory {}: {e}",
                a.dir.id
            )),
        }
    }

    async fn set_attr(&self, ino: Handle, set: SetAttr) -> Result<()> {
        match self.leased(ino.id, Request::SetAttr { ino, set }).await {
            Ok(_) => Ok(()),
            Err(e) => Err(anyhow!("SetAttr on inode {}: {e}", ino.id)),
        }
    }

    async fn set_nlink(&self, a: &SetNlink) -> Result<Option<String>> {
        let Some(i) = self.get(a.ino.id).await? else {
            return Ok(Some(format!("inode {} is gone", a.ino.id)));
        };
        if i.gen != a.ino.gen || i.attr.nlink != a.from {
            return Ok(Some(format!(
                "link count of inode {} changed since the scan",
                a.ino.id
            )));
        }
        if a.from == a.to {
            return Ok(Some(format!("link count of inode {} is right", a.ino.id)));
        }
        let set = SetAttr {
            nlink: Some(a.to),
            ..SetAttr::default()
        };
        self.set_attr(a.ino, set).await?;
        info!(ino = a.ino.id, from = a.from, to = a.to, "set link count");
        Ok(None)
    }

    async fn fix_dir(&self, a: &FixDir) -> Result<Option<String>> {
        let Some(i) = self.get(a.ino.id).await? else {
            return Ok(Some(format!("directory {} is gone", a.ino.id)));
        };
        if i.attr.nlink == a.nlink {
            return Ok(Some(format!(
                "link count of directory {} is right now",
                a.ino.id
            )));
        }
        let set = SetAttr {
            nlink: Some(a.nlink),
            ..SetAttr::default()
        };
        self.set_attr(a.ino, set).await?;
        info!(
            dir = a.ino.id,
            nlink = a.nlink,
            "fixed directory link count"
        );
        Ok(None)
    }

    async fn set_parent(&self, a: &SetParent) -> Result<Option<String>> {
        let set = SetAttr {
            parent: Some(a.parent),
            ..SetAttr::default()
        };
        self.set_attr(a.ino, set).await?;
        info!(dir = a.ino.id, parent = a.parent, "set parent");
        Ok(None)
    }

    async fn reclaim(&self, a: &Reclaim) -> Result<Option<String>> {
        let Some(i) = self.get(a.ino.id).await? else {
            return Ok(Some(format!("inode {} is already gone", a.ino.id)));
        };
        if i.gen != a.ino.gen || i.attr.ctime != a.ctime || i.attr.ctime >= self.cutoff {
            return Ok(Some(format!("inode {} changed since the scan", a.ino.id)));
        }
        if i.attr.nlink == 0 {
            // An orphan: its owner removes it only if no live client has it
            // open (then its data goes); an open one stays.
            let (_, r) = self
                .at_owner(a.ino.id, &Request::Reap { ino: a.ino, op: 0 })
                .await;
            match r {
                Ok(Reply::Reaped(Some(_))) => {}
                Ok(Reply::Reaped(None)) => {
                    return Ok(Some(format!(
                        "inode {} has no name but is open on a client; it stays",
                        a.ino.id
                    )))
                }
                Ok(other) => return Err(anyhow!("Reap {}: unexpected {other:?}", a.ino.id)),
                Err(e) if is_gone(&e) => {
                    return Ok(Some(format!("inode {} is already gone", a.ino.id)))
                }
                Err(e) => return Err(anyhow!("Reap {}: {e}", a.ino.id)),
            }
            for s in self.sessions {
                match s.call(&Request::DeleteData { id: a.ino.id }).await {
                    Ok(_) => {}
                    Err(e) if is_gone(&e) => {}
                    Err(e) => return Err(anyhow!("DeleteData {} on {}: {e}", a.ino.id, s.addr)),
                }
            }
            info!(ino = a.ino.id, kind = ?a.kind, "reclaimed an orphan");
            return Ok(None);
        }
        for s in self.sessions {
            match s.call(&Request::DeleteData { id: a.ino.id }).await {
                Ok(_) => {}
                Err(e) if is_gone(&e) => {}
                Err(e) => return Err(anyhow!("DeleteData {} on {}: {e}", a.ino.id, s.addr)),
            }
        }
        match self
            .leased(a.ino.id, Request::DeleteInode { ino: a.ino, op: 0 })
            .await
        {
            Ok(_) => {
                info!(ino = a.ino.id, kind = ?a.kind, "reclaimed unreachable inode");
                Ok(None)
            }
            Err(e) if is_gone(&e) => Ok(Some(format!("inode {} is already gone", a.ino.id))),
            Err(e) => Err(anyhow!("DeleteInode {}: {e}", a.ino.id)),
        }
    }

    async fn delete_data(&self, server: u32, id: FileId, bytes: u64) -> Result<Option<String>> {
        if self.get(id).await?.is_some() {
            return Ok(Some(format!(
                "data of file {id} on server {server}: its inode exists now"
            )));
        }
        let s = self
            .sessions
            .get(server as usize)
            .ok_or_else(|| anyhow!("no server {server}"))?;
        match s.call(&Request::DeleteData { id }).await {
            Ok(_) => {
                info!(id, server, bytes = %human(bytes), "deleted orphan data");
                Ok(None)
            }
            Err(e) if is_gone(&e) => Ok(Some(format!("data of file {id} is already gone"))),
            Err(e) => Err(anyhow!("DeleteData {id} on {}: {e}", s.addr)),
        }
    }

    /// Carries out `plan` in order, recording what happened to each action.
    pub async fn run(&self, plan: &Plan) -> Outcome {
        let mut out = Outcome::default();
        let mut record = |r: Result<Option<String>>| match r {
            Ok(None) => out.done += 1,
            Ok(Some(why)) => out.skipped.push(why),
            Err(e) => out.failed.push(format!("{e:#}")),
        };
        for a in &plan.remove_entries {
            record(self.remove_entry(a).await);
        }
        for a in &plan.set_nlink {
            record(self.set_nlink(a).await);
        }
        for a in &plan.fix_dirs {
            record(self.fix_dir(a).await);
        }
        for a in &plan.set_parent {
            record(self.set_parent(a).await);
        }
        for a in &plan.reclaim {
            record(self.reclaim(a).await);
        }
        for d in &plan.delete_data {
            record(self.delete_data(d.server, d.id, d.bytes).await);
        }
        out
    }
}
