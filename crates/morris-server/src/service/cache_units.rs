//! Cache mode's data on a stripe server: the units of cached files this
//! server holds (fetched from home on a miss, prefetched, evicted under
//! the bindings' space limits) and a fetched file made the cache's own
//! before it is written (`Localize`, `Detach`). The names and attributes
//! half is `cache.rs`.
//!
//! A unit is fetched once however many readers ask for it at the same
//! time (one lock per unit: exclusive for a fetch or an eviction, shared
//! while a read copies the unit's bytes, so an eviction never punches a
//! unit out under a read).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use morris_home::HomeHandle;
use morris_proto::home::HomeRef;
use morris_proto::{ErrorCode, FileId, Handle, Inode, WireError};
use tracing::{debug, warn};

use super::cache::{Bound, UnitHold, UnitKey};
use super::{blocking, err, metadata, Server};
use crate::store::{Formatted, Store};

impl Server {
    /// Makes sure this server holds unit (`id`, copy `replica`, block
    /// `index`) at `home.version`, fetching it from home if not; returns
    /// the bytes fetched (0: it was here) and a shared hold on the unit:
    /// while it is kept, the unit is not evicted (read its bytes under it).
    pub(super) async fn ensure_unit(
        &self,
        vol: &Formatted,
        id: FileId,
        index: u64,
        replica: u8,
        home: &HomeRef,
    ) -> Result<(u64, UnitHold), WireError> {
        let key = (id, replica, index);
        let store = self.store.clone();
        let have = |store: &Store| -> Result<Option<bool>, WireError> {
            let Some(u) = store.unit(id, replica, index)? else {
                return Ok(None);
            };
            if u.tag == home.tag() {
                return Ok(Some(true));
            }
            match crate::store::is_own_for(u.tag, home.gen, home.version) {
                // Detached from home to be written: the cache's own now.
                Some(true) => Err(err(
                    ErrorCode::Stale,
                    format!("file {id} is the cache's own now; read it again"),
                )),
                // Home's version replaced the cache's since: fetched again.
                Some(false) => Ok(None),
                // The same object, a newer version than this read names.
                None if u.tag >> 32 == home.tag() >> 32 && u.tag > home.tag() => Err(err(
                    ErrorCode::Stale,
                    format!("file {id} changed at home since this read began; read it again"),
                )),
                None => Ok(None),
            }
        };
        // Read under the unit's shared lock, which the caller keeps while it
        // reads the bytes: an eviction (exclusive) cannot punch the unit out
        // between this check and that read.
        let lock = self.unit_lock(key);
        let shared = lock.clone().read_owned().await;
        if metadata(|| have(&store))?.is_some() {
            if let Ok(b) = self.bound(home.binding) {
                b.hits.fetch_add(1, Ordering::Relaxed);
            }
            self.cache.touched.lock().push(key);
            return Ok((0, shared));
        }
        drop(shared);
        let b = self.bound(home.binding)?;
        let one = lock.write_owned().await;
        let fetched = if metadata(|| have(&store))?.is_some() {
            b.hits.fetch_add(1, Ordering::Relaxed);
            0
        } else {
            b.misses.fetch_add(1, Ordering::Relaxed);
            let got = self.fetch_unit(vol, &b, id, index, replica, home).await?;
            self.maybe_prefetch(vol, id, index, replica, home);
            got
        };
        Ok((fetched, one.downgrade()))
    }

    /// The lock of a unit: a fetch or an eviction holds it exclusively (so
    /// that a fetch runs once however many ask at once), a read of the
    /// unit's bytes shared. Locks nobody holds are swept by `cache_tick`.
    fn unit_lock(&self, key: UnitKey) -> Arc<tokio::sync::RwLock<()>> {
        self.cache
            .units
            .lock()
            .entry(key)
            .or_insert_with(|| Arc::new(tokio::sync::RwLock::new(())))
            .clone()
    }

    /// After a miss on unit `index` of a file this server also holds the
    /// previous unit of (`index - k`, same content), or the next one
    /// (`index + k`: a reader's read-ahead asks for several at once, and
    /// they may land in any order): the file is read sequentially, so the
    /// rest of this server's units of it are fetched in the background
    /// ([`BACKGROUND_FETCHES`] at a time per server), unless that would
    /// pass the cache's space limit. Every server does the same for its
    /// own units, so the whole file comes in, striped. Of two neighbours
    /// fetched at once, the one stored second sees the other.
    fn maybe_prefetch(&self, vol: &Formatted, id: FileId, index: u64, replica: u8, home: &HomeRef) {
        let k = u64::from(vol.layout.servers.max(1));
        let store = self.store.clone();
        let held =
            |i: u64| matches!(store.unit(id, replica, i), Ok(Some(u)) if u.tag == home.tag());
        let sequential = (index > k && held(index - k)) || held(index.saturating_add(k));
        if !sequential || home.size == 0 {
            return;
        }
        if !self.cache.prefetching.lock().insert((id, replica)) {
            return;
        }
        let Some(me) = self.this.get().and_then(std::sync::Weak::upgrade) else {
            self.cache.prefetching.lock().remove(&(id, replica));
            return;
        };
        let vol = vol.clone();
        let home = home.clone();
        let last = vol.layout.block_of(home.size - 1).0;
        tokio::spawn(async move {
            let mut next = index + k;
            let mut fetched = 0u64;
            while next <= last {
                if me.over_budget(home.binding) {
                    break;
                }
                let Ok(_slot) = me.cache.background.clone().acquire_owned().await else {
                    break;
                };
                match me
                    .ensure_unit(&vol, id, next, replica, &home)
                    .await
                    .map(|(n, _)| n)
                {
                    Ok(n) => fetched += n,
                    Err(e) => {
                        debug!(id, block = next, error = %e, "background prefetch stopped");
                        break;
                    }
                }
                next += k;
            }
            debug!(id, replica, bytes = fetched, "background prefetch done");
            me.cache.prefetching.lock().remove(&(id, replica));
        });
    }

    /// Whether this server holds as much of binding `binding`'s data as
    /// its share of the binding's space limit allows (never, without one).
    fn over_budget(&self, binding: FileId) -> bool {
        let Ok(b) = self.bound(binding) else {
            return false;
        };
        let Some(share) = self.share_of(&b) else {
            return false;
        };
        let store = self.store.clone();
        metadata(|| store.cached_bytes_of(binding)).is_ok_and(|(_, held)| held >= share)
    }

    /// This server's share of binding `b`'s space limit (the limit divided
    /// evenly among the servers; `None`: no limit).
    fn share_of(&self, b: &Bound) -> Option<u64> {
        let vol = self.store.formatted()?;
        if b.spec.max_bytes == 0 {
            return None;
        }
        let k = u64::from(vol.layout.servers.max(1));
        Some(b.spec.max_bytes.div_ceil(k))
    }

    /// Fetches one unit from home into this server's extent file.
    async fn fetch_unit(
        &self,
        vol: &Formatted,
        b: &Bound,
        id: FileId,
        index: u64,
        replica: u8,
        r: &HomeRef,
    ) -> Result<u64, WireError> {
        let unit = u64::from(vol.layout.unit);
        let start = vol.layout.block_start(index);
        let end = r.size.min(start.saturating_add(unit));
        let want = end.saturating_sub(start);
        let home = b.home().await?;
        // A few units at a time, first come first served: the units a
        // reader asked for first arrive first (eight fetched at once would
        // share this server's link and all arrive late), and a few in
        // flight keep the link busy across home's round trips.
        let _turn = self
            .cache
            .fetching
            .acquire()
            .await
            .map_err(|_| err(ErrorCode::Unavailable, "server is stopping"))?;
        let t0 = Instant::now();
        let mut data = bytes::BytesMut::with_capacity(want as usize);
        let hh = HomeHandle(r.handle.clone());
        while (data.len() as u64) < want {
            let off = start + data.len() as u64;
            let len = u32::try_from((want - data.len() as u64).min(u64::from(home.max_read())))
                .unwrap_or(u32::MAX)
                .max(1);
            match home.read(&hh, off, len).await {
                Ok(rep) => {
                    if rep.data.is_empty() {
                        // Home's file is shorter than the size we hold:
                        // it changed; the rest reads as zeros until the
                        // next revalidation sees it.
                        break;
                    }
                    data.extend_from_slice(&rep.data);
                    if rep.eof {
                        break;
                    }
                }
                Err(e) => return Err(b.failed(e)),
            }
        }
        b.ok();
        data.truncate(want as usize);
        let got = data.len() as u64;
        let pos = vol.layout.local_offset(index);
        let store = self.store.clone();
        let blocks = self.blocks.clone();
        let tag = r.tag();
        let binding = r.binding;
        let data: Bytes = data.freeze();
        blocking(move || {
            // A unit of zeros (a hole at home) takes no space here. The
            // bytes are on disk before the record that says they are
            // held: after a power loss a record never names bytes that
            // did not make it (they would be read as good data).
            if data.iter().any(|&x| x != 0) {
                blocks.write(id, replica, pos, &data, true, &store)?;
            } else {
                blocks.punch(id, replica, pos, unit)?;
                blocks.sync_file(id, replica.saturating_add(1))?;
            }
            store.put_unit(id, replica, index, tag, got, binding)?;
            Ok(())
        })
        .await?;
        b.fetched_bytes.fetch_add(got, Ordering::Relaxed);
        b.fetch_ms
            .fetch_add(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        debug!(
            id,
            index,
            bytes = got,
            ms = t0.elapsed().as_millis() as u64,
            "unit fetched from home"
        );
        Ok(got)
    }

    /// `Evict`: frees every unit of `id` held here.
    pub(super) async fn evict(&self, vol: &Formatted, id: FileId) -> Result<u64, WireError> {
        let store = self.store.clone();
        let units = metadata(|| store.units_of(id))?;
        let mut freed = 0;
        for u in units {
            freed += self.evict_unit(vol, u.id, u.copy, u.block, u.bytes).await?;
        }
        Ok(freed)
    }

    /// A copy of a cached file found damaged at byte `at` of this server's
    /// extent file: the unit fetched from home that holds it is forgotten,
    /// so the next read fetches it again (and its checksums with it); true
    /// if there was one (nothing else to repair then). Another copy of a
    /// cached file may not hold the unit at all, so resync must not copy
    /// it from there.
    pub(crate) fn refetch_damaged(&self, id: FileId, copy: u8, at: u64) -> bool {
        if !morris_proto::home::is_cache_id(id) {
            return false;
        }
        let Some(vol) = self.store.formatted() else {
            return false;
        };
        let unit = u64::from(vol.layout.unit);
        let units = match self.store.units_of(id) {
            Ok(u) => u,
            Err(e) => {
                warn!(id, error = %e, "cannot list a damaged cached file's units");
                return false;
            }
        };
        let mut found = false;
        for u in units.into_iter().filter(|u| u.copy == copy) {
            let start = vol.layout.local_offset(u.block);
            if (start..start + unit).contains(&at) {
                if let Err(e) = self.store.drop_unit(id, copy, u.block) {
                    warn!(id, error = %e, "cannot forget a damaged cached unit");
                    return false;
                }
                warn!(id, copy, block = u.block, "a cached unit failed its checksum: it is fetched from home again when next read");
                found = true;
            }
        }
        found
    }

    pub(super) async fn evict_unit(
        &self,
        vol: &Formatted,
        id: FileId,
        copy: u8,
        block: u64,
        bytes: u64,
    ) -> Result<u64, WireError> {
        let lock = self.unit_lock((id, copy, block));
        let _one = lock.write().await;
        let pos = vol.layout.local_offset(block);
        let unit = u64::from(vol.layout.unit);
        let store = self.store.clone();
        let blocks = self.blocks.clone();
        blocking(move || {
            // The record goes first: a crash in between leaves data that
            // is simply fetched again, never a record without data.
            store.drop_unit(id, copy, block)?;
            blocks.punch(id, copy, pos, unit)
        })
        .await?;
        Ok(bytes)
    }

    /// Keeps the units held here under the bindings' space limits (their
    /// `max_bytes` split evenly among the servers), evicting the least
    /// recently read first; flushes read times. Run periodically.
    pub(crate) async fn cache_tick(&self) {
        let touched = std::mem::take(&mut *self.cache.touched.lock());
        if !touched.is_empty() {
            let store = self.store.clone();
            if let Err(e) = metadata(|| store.touch_units(&touched)) {
                debug!(error = %e, "recording unit reads failed");
            }
        }
        self.cache
            .units
            .lock()
            .retain(|_, l| Arc::strong_count(l) > 1);
        let Some(vol) = self.store.formatted() else {
            return;
        };
        // Each binding within its own share, its least recently read units
        // first: one binding's reads never evict another's data.
        let bound = self.known_bindings();
        for (binding, b) in bound {
            let Some(share) = self.share_of(&b) else {
                continue;
            };
            let store = self.store.clone();
            let Ok((_, mut held)) = metadata(|| store.cached_bytes_of(binding)) else {
                return;
            };
            while held > share {
                let store = self.store.clone();
                let Ok(cold) = metadata(|| store.coldest_units_of(binding, 64)) else {
                    return;
                };
                if cold.is_empty() {
                    break;
                }
                for u in cold {
                    if held <= share {
                        break;
                    }
                    match self.evict_unit(&vol, u.id, u.copy, u.block, u.bytes).await {
                        Ok(n) => {
                            held = held.saturating_sub(n);
                            b.evictions.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            warn!(binding, error = %e, "eviction failed");
                            return;
                        }
                    }
                }
            }
        }
    }

    /// `Localize`: every unit of `id` this server holds a copy of, fetched
    /// if missing and made the cache's own.
    pub(super) async fn localize(
        &self,
        vol: &Formatted,
        id: FileId,
        home: &HomeRef,
        truncate: bool,
    ) -> Result<u64, WireError> {
        if truncate {
            // Emptied next: home's bytes are not needed (nor home, which
            // may have lost the file meanwhile); what is held goes.
            self.evict(vol, id).await?;
            return Ok(0);
        }
        let unit = u64::from(vol.layout.unit);
        let mut fetched = 0;
        for index in 1..=home.size.div_ceil(unit) {
            for replica in 0..vol.layout.replicas {
                if vol.layout.replica_server(id, index, replica) != vol.index {
                    continue;
                }
                let replica = replica as u8;
                let store = self.store.clone();
                if metadata(|| store.unit(id, replica, index))?.is_some_and(|u| {
                    crate::store::is_own_for(u.tag, home.gen, home.version) == Some(true)
                }) {
                    continue;
                }
                // Held (shared) while the record changes: no eviction
                // comes between.
                let (n, _held) = self.ensure_unit(vol, id, index, replica, home).await?;
                fetched += n;
                let store = self.store.clone();
                let tag = crate::store::local_tag(home.gen, home.version);
                metadata(|| store.make_unit_local(id, replica, index, tag))?;
            }
        }
        Ok(fetched)
    }

    /// `Detach`: cached file `h` becomes the cache's own (see
    /// [`Store::detach`]), under this server's write lease on it (every
    /// client's is recalled first: a reader must not go on reading it as
    /// home's); emptied with `truncate`.
    pub(super) async fn detach(
        &self,
        store: Arc<Store>,
        h: Handle,
        truncate: bool,
    ) -> Result<Inode, WireError> {
        let _own = self.own_write_lease(h.id).await?;
        metadata(|| store.detach(h, truncate))
    }
}
