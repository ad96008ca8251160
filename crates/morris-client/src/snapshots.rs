//! Attributes for listings, read without leases: a batch of a
//! directory's entries asked of each owner at once (the NFS gateway's
//! READDIRPLUS), placeholders of a cached directory made first.

use std::collections::{BTreeMap, HashMap};

use morris_proto::messages::SEED_BLOCK;
use morris_proto::{DirEntry, FileId, Handle, Inode, Reply, Request};

use crate::Client;

impl Client {
    /// [`Client::entry_snapshot`] for a batch of `dir`'s entries (a
    /// listing with attributes: the NFS gateway's READDIRPLUS), asking each
    /// owner once for the objects this client holds no lease on
    /// (`GetInodes`), and making a cached directory's placeholders from
    /// their seeds, a block of names and an owner at a time (`Seeds`,
    /// `CreateCachedMany`). `None` for an entry gone or replaced meanwhile.
    pub async fn entries_snapshot(&self, dir: FileId, entries: &[DirEntry]) -> Vec<Option<Inode>> {
        let mut out: Vec<Option<Inode>> = vec![None; entries.len()];
        let mut ask = Vec::new();
        for (k, e) in entries.iter().enumerate() {
            self.deferred.settled(e.child.id).await;
            if let Some(i) = self.leases.cached_inode(e.child.id) {
                out[k] = (i.gen == e.child.gen).then_some(i);
            } else if self.leases.has_unstored(e.child.id) {
                out[k] = self.getattr_snapshot(e.child).await.ok();
            } else {
                ask.push(k);
            }
        }
        self.snapshots_into(entries, &ask, &mut out).await;
        // Placeholders of a cached directory: no inode yet.
        let missing: Vec<usize> = ask
            .into_iter()
            .filter(|&k| out[k].is_none() && morris_proto::home::is_cache_id(entries[k].child.id))
            .collect();
        if missing.is_empty() {
            return out;
        }
        let mut blocks = BTreeMap::new();
        for &k in &missing {
            let c = entries[k].cookie;
            blocks.insert(c - c % SEED_BLOCK, c);
        }
        let fetched =
            futures::future::join_all(blocks.values().map(|&c| self.seeds_block_once(dir, c)))
                .await;
        let mut seeds: HashMap<FileId, Inode> = HashMap::new();
        for r in fetched {
            match r {
                Some(Ok(v)) => seeds.extend(v.into_iter().map(|s| (s.id, s))),
                Some(Err(err)) => tracing::debug!(dir, error = %err, "seeds not read"),
                // Being read by another listing: these go one at a time below.
                None => {}
            }
        }
        let mut by_owner: BTreeMap<u32, Vec<Inode>> = Default::default();
        for &k in &missing {
            if let Some(s) = seeds
                .get(&entries[k].child.id)
                .filter(|s| s.handle() == entries[k].child)
            {
                by_owner
                    .entry(self.layout.inode_server(s.id))
                    .or_default()
                    .push(s.clone());
            }
        }
        let made = by_owner.into_values().map(|seeds| {
            let id = seeds.first().map_or(0, |s| s.id);
            self.call_owner_now(id, Request::CreateCachedMany { seeds })
        });
        for r in futures::future::join_all(made).await {
            if let Err(err) = r {
                tracing::debug!(dir, error = %err, "placeholders not made");
            }
        }
        self.snapshots_into(entries, &missing, &mut out).await;
        // What is still missing (another object on the id; no seed): one
        // at a time, as a lookup would.
        let rest = missing
            .into_iter()
            .filter(|&k| out[k].is_none())
            .map(|k| async move { (k, self.entry_snapshot(dir, &entries[k]).await.ok()) });
        for (k, i) in futures::future::join_all(rest).await {
            out[k] = i;
        }
        out
    }

    /// Reads the inodes of `entries[k]` for each `k` in `which` into
    /// `out[k]`, one `GetInodes` per owner, all at once.
    async fn snapshots_into(
        &self,
        entries: &[DirEntry],
        which: &[usize],
        out: &mut [Option<Inode>],
    ) {
        let mut by_owner: BTreeMap<u32, Vec<Handle>> = Default::default();
        for &k in which {
            let h = entries[k].child;
            by_owner
                .entry(self.layout.inode_server(h.id))
                .or_default()
                .push(h);
        }
        let asks = by_owner.into_values().map(|inos| {
            let id = inos.first().map_or(0, |h| h.id);
            self.call_owner_now(id, Request::GetInodes { inos })
        });
        let mut found: HashMap<FileId, Inode> = HashMap::new();
        for r in futures::future::join_all(asks).await {
            match r {
                Ok(Reply::Inodes(v)) => found.extend(v.into_iter().map(|i| (i.id, i))),
                Ok(other) => tracing::debug!(reply = ?other, "unexpected answer to GetInodes"),
                Err(err) => tracing::debug!(error = %err, "inodes not read"),
            }
        }
        for &k in which {
            if let Some(i) = found.get(&entries[k].child.id) {
                if i.gen == entries[k].child.gen {
                    out[k] = Some(i.clone());
                }
            }
        }
    }
}
