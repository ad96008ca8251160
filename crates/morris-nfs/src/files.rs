//! Open files kept across NFS calls.
//!
//! NFS READ and WRITE name a file, not an open file. The gateway keeps one
//! `Client::open` handle per file id between calls, so that the client
//! library's readahead and write-behind work across a stream of READs or
//! WRITEs; handles idle for longer than the expiry are flushed and closed.
//!
//! A call holds its open file for as long as it uses it ([`FileUse`]): a
//! REMOVE, a failed call or the expiry that drops the file meanwhile only
//! takes it out of the cache, and the last call using it closes it. (Closed
//! under a READ in flight, the READ failed with "bad open-file number",
//! NFS3ERR_INVAL.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morris_client::{Client, FileId, Result};
use parking_lot::Mutex;

/// Open files kept at most; past it the least recently used is closed.
const MAX_OPEN: usize = 4096;

/// One cached open file.
#[derive(Debug, Clone, Copy)]
struct Open {
    fh: u64,
    write: bool,
    used: Instant,
}

/// What the cache holds, under one lock.
#[derive(Default)]
struct State {
    open: HashMap<FileId, Open>,
    /// Replaced open files (a read-only one upgraded to writable), closed
    /// once idle: a concurrent call may still be using them.
    retired: Vec<(FileId, u64, Instant)>,
    /// Calls using each open-file number now.
    users: HashMap<u64, usize>,
    /// Open-file numbers out of the cache, to be closed by their last user.
    doomed: HashMap<u64, FileId>,
}

impl State {
    /// One more user of `fh`.
    fn take(&mut self, fh: u64) {
        *self.users.entry(fh).or_default() += 1;
    }

    /// One user less of `fh`; if it was the last and `fh` is out of the
    /// cache, the file to close now.
    fn put_back(&mut self, fh: u64) -> Option<FileId> {
        match self.users.get_mut(&fh) {
            Some(n) if *n > 1 => {
                *n -= 1;
                None
            }
            _ => {
                self.users.remove(&fh);
                self.doomed.remove(&fh)
            }
        }
    }

    /// Of `fhs` (out of the cache now), those nobody uses: to be closed by
    /// the caller; the others are closed by their last user.
    fn unused(&mut self, fhs: Vec<(FileId, u64)>) -> Vec<(FileId, u64)> {
        let mut now = Vec::new();
        for (id, fh) in fhs {
            if self.users.contains_key(&fh) {
                self.doomed.insert(fh, id);
            } else {
                now.push((id, fh));
            }
        }
        now
    }
}

/// The cache of open files, by file id.
pub(crate) struct OpenFiles {
    client: Arc<Client>,
    state: Arc<Mutex<State>>,
    idle: Duration,
}

/// An open file in use by one call; closes it on drop if it left the
/// cache meanwhile and this was its last user.
pub(crate) struct FileUse {
    fh: u64,
    state: Arc<Mutex<State>>,
    client: Arc<Client>,
}

impl FileUse {
    /// The open-file number.
    pub(crate) fn fh(&self) -> u64 {
        self.fh
    }
}

impl Drop for FileUse {
    fn drop(&mut self) {
        let close = self.state.lock().put_back(self.fh);
        if let Some(id) = close {
            let (client, fh) = (self.client.clone(), self.fh);
            // Calls run on the gateway's runtime; without one (shutdown),
            // the client's own shutdown closes what is left.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { close_file(&client, id, fh).await });
            }
        }
    }
}

async fn close_file(client: &Client, id: FileId, fh: u64) {
    if let Err(e) = client.flush(fh).await {
        tracing::warn!(id, error = %e, "flush of an expired nfs open file failed");
    }
    if let Err(e) = client.release(fh).await {
        tracing::warn!(id, error = %e, "release of an nfs open file failed");
    }
}

impl OpenFiles {
    /// An empty cache whose entries close after `idle` without use.
    pub(crate) fn new(client: Arc<Client>, idle: Duration) -> Self {
        OpenFiles {
            client,
            state: Arc::new(Mutex::new(State::default())),
            idle,
        }
    }

    fn hold(&self, fh: u64) -> FileUse {
        FileUse {
            fh,
            state: self.state.clone(),
            client: self.client.clone(),
        }
    }

    /// An open file of `id` for this call, opened for writing if `write`.
    pub(crate) async fn get(&self, id: FileId, write: bool) -> Result<FileUse> {
        {
            let mut st = self.state.lock();
            if let Some(o) = st.open.get_mut(&id) {
                if o.write || !write {
                    o.used = Instant::now();
                    let fh = o.fh;
                    st.take(fh);
                    return Ok(self.hold(fh));
                }
            }
        }
        let fh = self.client.open(id, write, false).await?;
        let now = Instant::now();
        let mut evicted = Vec::new();
        let raced = {
            let mut st = self.state.lock();
            let theirs = match st.open.get_mut(&id) {
                // Another call opened it meanwhile, well enough: use theirs.
                Some(o) if o.write || !write => {
                    o.used = now;
                    Some(o.fh)
                }
                _ => None,
            };
            match theirs {
                Some(t) => {
                    st.take(t);
                    Some(t)
                }
                None => {
                    let new = Open {
                        fh,
                        write,
                        used: now,
                    };
                    if let Some(old) = st.open.insert(id, new) {
                        st.retired.push((id, old.fh, now));
                    }
                    st.take(fh);
                    // Over the cap: the least recently used goes (closed
                    // now if no call uses it, else by its last user).
                    if st.open.len() > MAX_OPEN {
                        let oldest = st
                            .open
                            .iter()
                            .filter(|(k, _)| **k != id)
                            .min_by_key(|(_, o)| o.used)
                            .map(|(k, o)| (*k, o.fh));
                        if let Some((k, old)) = oldest {
                            st.open.remove(&k);
                            evicted = st.unused(vec![(k, old)]);
                        }
                    }
                    None
                }
            }
        };
        for (k, old) in evicted {
            close_file(&self.client, k, old).await;
        }
        match raced {
            Some(theirs) => {
                close_file(&self.client, id, fh).await;
                Ok(self.hold(theirs))
            }
            None => Ok(self.hold(fh)),
        }
    }

    /// The cached writable open file of `id`, if there is one.
    pub(crate) fn writer(&self, id: FileId) -> Option<FileUse> {
        let mut st = self.state.lock();
        let fh = st.open.get(&id).filter(|o| o.write).map(|o| o.fh)?;
        st.take(fh);
        Some(self.hold(fh))
    }

    /// Takes `id`'s open files out of the cache (after a REMOVE or a
    /// failure) and closes those no call is using; the others are closed
    /// when their calls end.
    pub(crate) async fn drop_file(&self, id: FileId) {
        let now = {
            let mut st = self.state.lock();
            let mut fhs: Vec<(FileId, u64)> = st
                .open
                .remove(&id)
                .map(|o| (id, o.fh))
                .into_iter()
                .collect();
            st.retired.retain(|(rid, fh, _)| {
                if *rid == id {
                    fhs.push((id, *fh));
                    false
                } else {
                    true
                }
            });
            st.unused(fhs)
        };
        for (id, fh) in now {
            close_file(&self.client, id, fh).await;
        }
    }

    /// Closes every open file idle for longer than the expiry.
    pub(crate) async fn expire(&self) {
        let now = Instant::now();
        let closing = {
            let mut st = self.state.lock();
            let ids: Vec<FileId> = st
                .open
                .iter()
                .filter(|(_, o)| now.duration_since(o.used) >= self.idle)
                .map(|(id, _)| *id)
                .collect();
            let mut fhs: Vec<(FileId, u64)> = ids
                .into_iter()
                .filter_map(|id| st.open.remove(&id).map(|o| (id, o.fh)))
                .collect();
            let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut st.retired)
                .into_iter()
                .partition(|(_, _, at)| now.duration_since(*at) >= self.idle);
            st.retired = young;
            fhs.extend(old.into_iter().map(|(id, fh, _)| (id, fh)));
            st.unused(fhs)
        };
        for (id, fh) in closing {
            close_file(&self.client, id, fh).await;
        }
    }

    /// Closes every open file (shutdown).
    pub(crate) async fn close_all(&self) {
        let all = {
            let mut st = self.state.lock();
            let mut all: Vec<(FileId, u64)> = st.open.drain().map(|(id, o)| (id, o.fh)).collect();
            all.extend(st.retired.drain(..).map(|(id, fh, _)| (id, fh)));
            // Files in use at shutdown are closed here too: their calls'
            // answers no longer matter.
            all.extend(st.doomed.drain().map(|(fh, id)| (id, fh)));
            all
        };
        for (id, fh) in all {
            close_file(&self.client, id, fh).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_file_in_use_is_closed_by_its_last_user_not_by_its_dropper() {
        let mut st = State::default();
        st.take(5);
        st.take(5);
        // REMOVE (or the expiry) takes files 5 and 6 out of the cache: 6 is
        // unused and closed now, 5 is left to its users.
        assert_eq!(st.unused(vec![(1, 5), (2, 6)]), vec![(2, 6)]);
        assert_eq!(st.doomed.get(&5), Some(&1));
        assert_eq!(st.put_back(5), None, "one user left");
        assert_eq!(st.put_back(5), Some(1), "the last user closes it");
        // A file still cached is not closed by its last user.
        st.take(7);
        assert_eq!(st.put_back(7), None);
        assert!(st.users.is_empty() && st.doomed.is_empty());
    }
}
