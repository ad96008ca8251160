//! Read leases taken many at a time (`AcquireReadMany`): a FUSE listing's
//! batch of names has its objects' leases taken with one request per
//! owning range instead of an `AcquireRead` each, so that the lookups the
//! listing answers with find them cached. Each lease is registered,
//! installed and, if recalled on its way, given back exactly as
//! [`Leases::acquire`] does for one; what is not granted is left to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use morris_proto::messages::ReadLease;
use morris_proto::{FileId, Handle, Reply, Request};
use tracing::debug;

use super::{out_of_flight, Leases, Mode, ACQUIRE_SHARDS};

/// One lease asked for: its handle and the recall count when asked.
struct Asked {
    h: Handle,
    seq_before: u64,
}

impl Leases {
    /// Takes read leases on those of `handles` this client has no lease
    /// entry for, one `AcquireReadMany` per owning range, all at once.
    /// The owners recall what other clients hold, as for `AcquireRead`.
    /// Best effort: an object another acquire of this client is busy with
    /// or one with changes not stored yet is skipped, and an object not
    /// granted is left (a `get` then takes it alone and learns why), as is
    /// every object of a range whose request fails.
    pub(crate) async fn take_reads(self: &Arc<Self>, handles: &[Handle]) {
        // The acquire shards of the chosen objects, taken only if free
        // (never waiting while holding one: see `acquire`).
        let mut shards = HashMap::new();
        let mut by_range: BTreeMap<u32, Vec<Asked>> = BTreeMap::new();
        for &h in handles {
            if self.map.lock().contains_key(&h.id) || self.has_unstored(h.id) {
                continue;
            }
            let shard = (h.id as usize) % ACQUIRE_SHARDS;
            if let std::collections::hash_map::Entry::Vacant(v) = shards.entry(shard) {
                match self.acquiring[shard].try_lock() {
                    Ok(g) => {
                        v.insert(g);
                    }
                    Err(_) => continue,
                }
            }
            // Registered in flight with a last look at the map, under the
            // lock `on_recall` decides under (as `acquire` does).
            let seq_before = {
                let mut inflight = self.inflight.lock();
                if self.map.lock().contains_key(&h.id) || inflight.contains_key(&h.id) {
                    continue;
                }
                *inflight.entry(h.id).or_insert(0) += 1;
                self.recall_seq.lock().get(&h.id).copied().unwrap_or(0)
            };
            by_range
                .entry(self.layout.inode_server(h.id))
                .or_default()
                .push(Asked { h, seq_before });
        }
        if by_range.is_empty() {
            return;
        }
        let calls = by_range.into_iter().map(|(range, asked)| async move {
            let guess = self.pool.range_server(range);
            let epoch_before = self.pool.epoch(guess);
            let req = Request::AcquireReadMany {
                inos: asked.iter().map(|a| a.h).collect(),
            };
            let res = self.pool.call_range(range, req, Bytes::new()).await;
            self.install_many(&asked, res, guess, epoch_before);
        });
        futures::future::join_all(calls).await;
        drop(shards);
        self.maybe_evict();
    }

    /// Installs what one `AcquireReadMany` granted, and takes every asked
    /// object out of flight.
    fn install_many(
        self: &Arc<Self>,
        asked: &[Asked],
        res: crate::Result<(u32, Reply, Bytes)>,
        guess: u32,
        epoch_before: u64,
    ) {
        let done = |id: FileId| out_of_flight(&mut self.inflight.lock(), id);
        let (owner, granted) = match res {
            Ok((owner, Reply::ReadLeasedMany(v), _)) if v.len() == asked.len() => (owner, v),
            other => {
                match other {
                    Ok((_, reply, _)) => debug!(?reply, "unexpected answer to AcquireReadMany"),
                    Err(e) => debug!(error = %e, "leases not taken many at once"),
                }
                // Whatever the server granted of a request that failed on
                // its way back, it will recall; the recall finds no entry
                // and gives it back (`on_recall`).
                for a in asked {
                    done(a.h.id);
                }
                return;
            }
        };
        let epoch = self.pool.epoch(owner);
        if owner == guess && epoch_before != 0 && epoch != epoch_before {
            debug!(owner, "owner restarted during AcquireReadMany");
        }
        for (a, g) in asked.iter().zip(granted) {
            // Installed while still in flight, under the in-flight lock, so
            // that a recall sees one or the other (`on_recall`).
            let installed = {
                let mut inflight = self.inflight.lock();
                out_of_flight(&mut inflight, a.h.id);
                match g {
                    Some(ReadLease { inode, xattrs }) if inode.handle() == a.h => {
                        let recalled = self.recall_seq.lock().get(&a.h.id).copied().unwrap_or(0)
                            != a.seq_before;
                        let (entry, old) =
                            self.install(owner, epoch, Mode::Read, inode, 0, recalled);
                        if let Some(list) = xattrs {
                            entry.state.lock().xattrs = Some(Arc::new(list));
                        }
                        Some((entry, old, recalled))
                    }
                    // Not granted (or, against the protocol, another object).
                    _ => None,
                }
            };
            let Some((entry, old, recalled)) = installed else {
                continue;
            };
            debug!(
                ino = a.h.id,
                lease = entry.generation,
                recalled,
                "granted with others"
            );
            if let Some(old) = old {
                self.drop_caches(&old);
            }
            if recalled {
                // Granted and recalled at once: nobody uses it; give it back.
                let me = self.clone();
                tokio::spawn(async move { me.process_recall(entry).await });
            }
        }
    }
}
