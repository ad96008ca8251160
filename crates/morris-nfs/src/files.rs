//! Open files kept across NFS calls.
//!
//! NFS READ and WRITE name a file, not an open file. The gateway keeps one
//! `Client::open` handle per file id between calls, so that the client
//! library's readahead and write-behind work across a stream of READs or
//! WRITEs; handles idle for longer than the expiry are flushed and closed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morris_client::{Client, FileId, Result};
use parking_lot::Mutex;

/// One cached open file.
#[derive(Debug, Clone, Copy)]
struct Open {
    fh: u64,
    write: bool,
    used: Instant,
}

/// The cache of open files, by file id.
pub(crate) struct OpenFiles {
    client: Arc<Client>,
    open: Mutex<HashMap<FileId, Open>>,
    /// Replaced open files (a read-only one upgraded to writable), closed
    /// once idle: a concurrent call may still be using them.
    retired: Mutex<Vec<(FileId, u64, Instant)>>,
    idle: Duration,
}

impl OpenFiles {
    /// An empty cache whose entries close after `idle` without use.
    pub(crate) fn new(client: Arc<Client>, idle: Duration) -> Self {
        OpenFiles {
            client,
            open: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            idle,
        }
    }

    /// An open-file number for `id`, opened for writing if `write`.
    pub(crate) async fn get(&self, id: FileId, write: bool) -> Result<u64> {
        if let Some(o) = self.open.lock().get_mut(&id) {
            if o.write || !write {
                o.used = Instant::now();
                return Ok(o.fh);
            }
        }
        let fh = self.client.open(id, write, false).await?;
        let now = Instant::now();
        let raced = {
            let mut map = self.open.lock();
            match map.get_mut(&id) {
                // Another call opened it meanwhile, well enough: use theirs.
                Some(o) if o.write || !write => {
                    o.used = now;
                    Some(o.fh)
                }
                _ => {
                    let new = Open {
                        fh,
                        write,
                        used: now,
                    };
                    if let Some(old) = map.insert(id, new) {
                        self.retired.lock().push((id, old.fh, now));
                    }
                    None
                }
            }
        };
        match raced {
            Some(theirs) => {
                self.close(id, fh).await;
                Ok(theirs)
            }
            None => Ok(fh),
        }
    }

    /// The cached writable open-file number of `id`, if there is one.
    pub(crate) fn writer(&self, id: FileId) -> Option<u64> {
        self.open.lock().get(&id).filter(|o| o.write).map(|o| o.fh)
    }

    /// Forgets and closes `id`'s open files (after a REMOVE or a failure).
    pub(crate) async fn drop_file(&self, id: FileId) {
        let mut fhs: Vec<u64> = self
            .open
            .lock()
            .remove(&id)
            .map(|o| o.fh)
            .into_iter()
            .collect();
        self.retired.lock().retain(|(rid, fh, _)| {
            if *rid == id {
                fhs.push(*fh);
                false
            } else {
                true
            }
        });
        for fh in fhs {
            self.close(id, fh).await;
        }
    }

    async fn close(&self, id: FileId, fh: u64) {
        if let Err(e) = self.client.flush(fh).await {
            tracing::warn!(id, error = %e, "flush of an expired nfs open file failed");
        }
        if let Err(e) = self.client.release(fh).await {
            tracing::warn!(id, error = %e, "release of an nfs open file failed");
        }
    }

    /// Closes every open file idle for longer than the expiry.
    pub(crate) async fn expire(&self) {
        let now = Instant::now();
        let idle: Vec<(FileId, u64)> = {
            let mut map = self.open.lock();
            let ids: Vec<FileId> = map
                .iter()
                .filter(|(_, o)| now.duration_since(o.used) >= self.idle)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| map.remove(&id).map(|o| (id, o.fh)))
                .collect()
        };
        let retired: Vec<(FileId, u64)> = {
            let mut r = self.retired.lock();
            let (old, young): (Vec<_>, Vec<_>) = r
                .drain(..)
                .partition(|(_, _, at)| now.duration_since(*at) >= self.idle);
            *r = young;
            old.into_iter().map(|(id, fh, _)| (id, fh)).collect()
        };
        for (id, fh) in idle.into_iter().chain(retired) {
            self.close(id, fh).await;
        }
    }

    /// Closes every open file (shutdown).
    pub(crate) async fn close_all(&self) {
        let mut all: Vec<(FileId, u64)> =
            self.open.lock().drain().map(|(id, o)| (id, o.fh)).collect();
        all.extend(self.retired.lock().drain(..).map(|(id, fh, _)| (id, fh)));
        for (id, fh) in all {
            self.close(id, fh).await;
        }
    }
}
