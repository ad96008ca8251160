//! Cache mode II's write-back, the names part of a round
//! (docs/architecture.md, "Cache mode II"): directory by directory, parents
//! first, [`crate::writeback::plan`] over the cache's entries and home's
//! listing, and its steps run at home (creates sixteen at a time); where
//! home has each object made in the cache is recorded at its owner
//! (`WbSetHome`). Conflicts between names (`iw`) go to `conflicts.rs`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use morris_home::{Home, HomeEntry, HomeError, HomeHandle, HomeKind};
use morris_proto::home::{cache_id, is_cache_id, HomeStamp};
use morris_proto::{
    DirEntry, ErrorCode, FileId, FileKind, Inode, Reply, Request, WbHome, WireError,
};
use tracing::{debug, warn};

use super::cache::{stamp_of, Bound};
use super::pusher::{home_failed, new_of, Round, PAGE, PARALLEL};
use super::{err, Server};
use crate::writeback::{identify, parse_temp, plan, AtHome, Named, Spot, Step};

/// Names objects left in the cache with no other record, by place, with
/// the metadata range that keeps each record (`WbGone`).
pub(super) type Departed = HashMap<(FileId, Vec<u8>), Vec<(u32, WbHome)>>;

impl Server {
    /// Home's handle of the object `rec` places, if home has it there.
    pub(super) async fn find_at(
        &self,
        r: &mut Round<'_>,
        rec: &WbHome,
    ) -> Result<Option<HomeHandle>, WireError> {
        if rec.dir == 0 {
            // A file fetched from home and detached: by its handle (it
            // keeps its place at home).
            return Ok(Some(HomeHandle(rec.handle.clone())));
        }
        let Some(parent) = self.resolve(r, rec.dir).await? else {
            return Ok(None);
        };
        match r.home.lookup(&parent, &rec.name).await {
            Ok((h, a)) if a.fileid == rec.fileid => Ok(Some(h)),
            Ok(_) | Err(HomeError::NotFound | HomeError::Stale) => Ok(None),
            Err(e) => Err(home_failed(r.b, e)),
        }
    }

    /// Records where home has object `id` now (and, for an object just
    /// made there, home's stamp of it: `seen`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn place(
        &self,
        r: &mut Round<'_>,
        id: FileId,
        dir: FileId,
        name: &[u8],
        h: &HomeHandle,
        fileid: u64,
        seen: Option<HomeStamp>,
    ) -> Result<(), WireError> {
        let rec = WbHome {
            id,
            dir,
            name: name.to_vec(),
            fileid,
            handle: h.0.clone(),
        };
        self.range_ask(
            &r.vol,
            id,
            &Request::WbSetHome {
                binding: r.binding,
                home: rec.clone(),
                seen,
            },
        )
        .await?;
        note_place(r, rec);
        Ok(())
    }

    /// Makes home's directory `d` list what the cache's does.
    pub(super) async fn reconcile_dir(
        &self,
        r: &mut Round<'_>,
        d: FileId,
    ) -> Result<(), WireError> {
        let Some(hd) = self.resolve(r, d).await? else {
            return Err(err(
                ErrorCode::NotFound,
                format!("directory {d} is not at home yet"),
            ));
        };
        // A directory fetched from home must hold every name home has
        // (clients list it before they change it): a name it never
        // fetched would otherwise be removed at home.
        let listed = self
            .inode(r, d)
            .await?
            .and_then(|i| i.home.map(|l| l.listed || l.is_local()))
            .unwrap_or(false);
        if !listed {
            r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(err(
                ErrorCode::Invalid,
                format!("directory {d} is not listed whole from home; its names are not pushed"),
            ));
        }
        // Home's entries.
        let mut at_home = list_home(&*r.home, &hd)
            .await
            .map_err(|e| home_failed(r.b, e))?;
        // Home answers (after a time down, requests go through again).
        r.b.ok();
        let fsid = match at_home
            .iter()
            .find_map(|e| e.plus.as_ref().map(|p| p.1.fsid))
        {
            Some(f) => f,
            None => {
                r.home
                    .getattr(&hd)
                    .await
                    .map_err(|e| home_failed(r.b, e))?
                    .fsid
            }
        };
        let cache = r.listings.get(&d).cloned().unwrap_or_default();
        if r.iw {
            self.collisions(r, d, &hd, &cache, &mut at_home).await?;
        }
        let here_names: HashMap<&[u8], FileId> = cache
            .iter()
            .map(|e| (e.name.as_slice(), e.child.id))
            .collect();
        // The names of each object here (one pass: a directory losing many
        // names asks this for each).
        let mut names_here: HashMap<FileId, Vec<&[u8]>> = HashMap::new();
        for (&n, &o) in &here_names {
            names_here.entry(o).or_default().push(n);
        }
        let mut named = Vec::with_capacity(cache.len());
        for e in &cache {
            let obj = e.child.id;
            // A fetched object keeps its place at home unless it was
            // moved in the cache (`WbPlace`: a record with a directory).
            let placed = r.homes.get(&obj).is_some_and(|rec| rec.dir != 0);
            let (home_at, still_there) = if is_cache_id(obj) && !placed {
                (
                    Some(Spot {
                        dir: d,
                        name: e.name.clone(),
                    }),
                    true,
                )
            } else {
                match r.homes.get(&obj) {
                    Some(rec) => {
                        let spot = Spot {
                            dir: rec.dir,
                            name: rec.name.clone(),
                        };
                        let still = match r.listings.get(&rec.dir) {
                            Some(l) => l.iter().any(|x| x.name == rec.name && x.child.id == obj),
                            // A directory whose names did not change
                            // still names it there.
                            None => true,
                        };
                        (Some(spot), still)
                    }
                    None => (None, false),
                }
            };
            named.push(Named {
                name: e.name.clone(),
                obj,
                home_at,
                still_there,
            });
        }
        let home_fileids: HashMap<&[u8], u64> = at_home
            .iter()
            .map(|h| (h.name.as_slice(), h.fileid))
            .collect();
        let mut homes_list = Vec::with_capacity(at_home.len());
        for h in &at_home {
            let is_dir = match &h.plus {
                Some((_, a)) => a.kind == HomeKind::Dir,
                None => matches!(
                    r.home.lookup(&hd, &h.name).await,
                    Ok((_, a)) if a.kind == HomeKind::Dir
                ),
            };
            let same = here_names.get(h.name.as_slice()).copied().filter(|&o| {
                if is_cache_id(o) {
                    cache_id(r.binding, fsid, h.fileid) == o
                } else {
                    r.homes.get(&o).is_some_and(|rec| {
                        rec.fileid == h.fileid && rec.dir == d && rec.name == h.name
                    })
                }
            });
            if let Some(o) = same.filter(|&o| {
                is_cache_id(o)
                    && r.homes
                        .get(&o)
                        .is_some_and(|rec| rec.dir != 0 && (rec.dir != d || rec.name != h.name))
            }) {
                // A fetched object home has where the cache names it, its
                // record elsewhere (its move was made at home, the record
                // lost to a crash): the record follows.
                let hh = match &h.plus {
                    Some((hh, _)) => hh.clone(),
                    None => {
                        r.home
                            .lookup(&hd, &h.name)
                            .await
                            .map_err(|e| home_failed(r.b, e))?
                            .0
                    }
                };
                self.place(r, o, d, &h.name, &hh, h.fileid, None).await?;
            }
            let departed = departed(r, d, &h.name, h.fileid);
            let obj = identify(&h.name, same, departed);
            let mut moving = false;
            if let Some(o) = obj.filter(|o| here_names.get(h.name.as_slice()) != Some(o)) {
                // Named elsewhere (here under another name home does not
                // have for it yet, or in another directory): moved there by
                // a rename, not removed here. (Under a name home has for it
                // too, this name is an extra link: removed.)
                let renamed_here = names_here.get(&o).is_some_and(|ns| {
                    ns.iter()
                        .any(|n| home_fileids.get(n).is_none_or(|&f| f != h.fileid))
                });
                moving = renamed_here
                    || r.named_in
                        .get(&o)
                        .is_some_and(|v| v.iter().any(|(dir, _)| *dir != d));
                if !moving && is_cache_id(o) && r.homes.get(&o).is_some_and(|rec| rec.dir == d) {
                    // Fetched, moved away from here in the cache, named
                    // in a directory this round does not push: left for
                    // that directory's push to move (removing it here
                    // would lose what of it the cache does not hold).
                    moving = self.inode(r, o).await?.is_some_and(|i| i.attr.nlink > 0);
                }
            }
            homes_list.push(AtHome {
                name: h.name.clone(),
                is_dir,
                obj,
                moving,
            });
        }
        let steps = plan(d, &named, &homes_list, r.iw);
        if !steps.is_empty() {
            debug!(dir = d, steps = steps.len(), "write-back: directory");
        }
        let mut steps = steps.into_iter().peekable();
        while let Some(s) = steps.next() {
            match s {
                // The creates of a directory are independent of each
                // other: made at once.
                Step::Create { obj, name } => {
                    let mut batch = vec![(obj, name)];
                    while let Some(Step::Create { .. }) = steps.peek() {
                        if let Some(Step::Create { obj, name }) = steps.next() {
                            batch.push((obj, name));
                        }
                    }
                    self.create_many(r, d, &hd, batch).await?;
                }
                s => self.run_step(r, d, &hd, s).await?,
            }
        }
        Ok(())
    }

    /// Names both the cache (objects never pushed) and home made in
    /// directory `d` since the cache last pushed it (`iw`): resolved
    /// (`conflicts.rs`); an entry of home's moved away leaves `at_home`.
    async fn collisions(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        cache: &[DirEntry],
        at_home: &mut Vec<morris_home::HomeEntry>,
    ) -> Result<(), WireError> {
        let mut moved = Vec::new();
        for e in cache {
            let obj = e.child.id;
            if is_cache_id(obj) || r.homes.contains_key(&obj) {
                continue;
            }
            let Some(h) = at_home.iter().find(|h| h.name == e.name) else {
                continue;
            };
            if departed(r, d, &h.name, h.fileid).is_some() || parse_temp(&h.name).is_some() {
                continue;
            }
            let Some(i) = self.inode(r, obj).await? else {
                continue;
            };
            let home_obj = match &h.plus {
                Some(p) => p.clone(),
                None => r
                    .home
                    .lookup(hd, &h.name)
                    .await
                    .map_err(|e| home_failed(r.b, e))?,
            };
            if self
                .resolve_collision(r, d, hd, obj, &i, &e.name, home_obj)
                .await?
            {
                moved.push(e.name.clone());
            }
        }
        at_home.retain(|h| !moved.contains(&h.name));
        Ok(())
    }

    /// Makes the objects of `batch` at home in directory `d`, at once
    /// ([`PARALLEL`] at a time).
    async fn create_many(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        batch: Vec<(FileId, Vec<u8>)>,
    ) -> Result<(), WireError> {
        let vol = r.vol.clone();
        let missing: Vec<FileId> = batch
            .iter()
            .map(|b| b.0)
            .filter(|o| !is_cache_id(*o) && !r.inodes.contains_key(o))
            .collect();
        let asks: Vec<_> = missing
            .into_iter()
            .map(|id| {
                let vol = vol.clone();
                async move {
                    (
                        id,
                        self.range_ask(&vol, id, &Request::GetInode { ino: id })
                            .await,
                    )
                }
            })
            .collect();
        let got: Vec<(FileId, Result<Reply, WireError>)> = futures::stream::iter(asks)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (id, res) in got {
            match res {
                Ok(Reply::Inode(i)) => {
                    r.inodes.insert(id, Some(i));
                }
                Ok(other) => return Err(err(ErrorCode::Protocol, format!("unexpected {other:?}"))),
                Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale) => {
                    r.inodes.insert(id, None);
                }
                Err(e) => return Err(e),
            }
        }
        let mut jobs = Vec::new();
        for (obj, name) in batch {
            if is_cache_id(obj) {
                // Fetched from home and gone there: home's change wins.
                r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
                warn!(dir = d, name = %String::from_utf8_lossy(&name), "write-back: an object fetched from home is gone there; not made again");
                continue;
            }
            // `None`: removed from the cache since it was listed; the next
            // round sees its directory without it.
            if let Some(Some(i)) = r.inodes.get(&obj) {
                jobs.push((obj, name, i.clone()));
            }
        }
        let home = r.home.clone();
        let creates: Vec<_> = jobs
            .into_iter()
            .map(|(obj, name, i)| {
                let home = home.clone();
                async move {
                    let (what, attrs) = new_of(&i);
                    let res = home.create(hd, &name, &what, &attrs).await;
                    (obj, name, i, res)
                }
            })
            .collect();
        let made: Vec<_> = futures::stream::iter(creates)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut first_err = None;
        let mut placed = Vec::new();
        for (obj, name, i, res) in made {
            match res {
                Ok((h, a)) => {
                    let seen = seen_made(&i, &a);
                    placed.push((
                        WbHome {
                            id: obj,
                            dir: d,
                            name,
                            fileid: a.fileid,
                            handle: h.0,
                        },
                        i,
                        seen,
                    ))
                }
                Err(e) => {
                    let e = home_failed(r.b, e);
                    first_err.get_or_insert(e);
                }
            }
        }
        let binding = r.binding;
        let records: Vec<_> = placed
            .iter()
            .map(|(rec, _, seen)| {
                let vol = vol.clone();
                async move {
                    let req = Request::WbSetHome {
                        binding,
                        home: rec.clone(),
                        seen: Some(*seen),
                    };
                    self.range_ask(&vol, rec.id, &req).await
                }
            })
            .collect();
        let recorded: Vec<Result<Reply, WireError>> = futures::stream::iter(records)
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for res in recorded {
            if let Err(e) = res {
                first_err.get_or_insert(e);
            }
        }
        for (rec, i, _) in placed {
            // A file with bytes has them pushed next (its attributes after
            // them); an empty one got its attributes with the create.
            if i.attr.kind == FileKind::File && i.attr.size > 0 {
                r.made.insert(rec.id);
            }
            r.created.insert(rec.id);
            note_place(r, rec);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One step of a directory's plan.
    async fn run_step(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        s: Step,
    ) -> Result<(), WireError> {
        let home = r.home.clone();
        let fail = |b: &Bound, e: HomeError| home_failed(b, e);
        match s {
            Step::Aside { name, temp, obj } => {
                home.rename(hd, &name, hd, &temp)
                    .await
                    .map_err(|e| fail(r.b, e))?;
                let (h, a) = home.lookup(hd, &temp).await.map_err(|e| fail(r.b, e))?;
                self.place(r, obj, d, &temp, &h, a.fileid, None).await
            }
            Step::Unlink { at, obj, now_at } => {
                let Some(ha) = self.resolve(r, at.dir).await? else {
                    return Ok(());
                };
                match home.remove(&ha, &at.name).await {
                    Ok(()) | Err(HomeError::NotFound) => {}
                    Err(e) => return Err(fail(r.b, e)),
                }
                let was_there = r
                    .homes
                    .get(&obj)
                    .is_some_and(|rec| rec.dir == at.dir && rec.name == at.name);
                if was_there {
                    let hn = self.resolve(r, now_at.dir).await?;
                    if let Some(hn) = hn {
                        let (h, a) = home
                            .lookup(&hn, &now_at.name)
                            .await
                            .map_err(|e| fail(r.b, e))?;
                        self.place(r, obj, now_at.dir, &now_at.name, &h, a.fileid, None)
                            .await?;
                    }
                }
                Ok(())
            }
            Step::Remove { name, is_dir } => {
                let r2 = if is_dir && r.iw {
                    // Only what the cache knew: another writer's names in
                    // it stay, and so does the directory then.
                    match home.lookup(hd, &name).await {
                        Ok((h, a)) => match departed(r, d, &name, a.fileid) {
                            Some(obj) => remove_known(r, obj, hd, &h, &name).await,
                            None => Ok(()),
                        },
                        Err(e) => Err(e),
                    }
                } else if is_dir {
                    remove_tree(&*home, hd, &name).await
                } else {
                    home.remove(hd, &name).await
                };
                match r2 {
                    Ok(()) | Err(HomeError::NotFound) => Ok(()),
                    Err(e) => Err(fail(r.b, e)),
                }
            }
            Step::Rename { obj, from, name } => {
                let moved = match self.resolve(r, from.dir).await? {
                    Some(hf) => match home.rename(&hf, &from.name, hd, &name).await {
                        Ok(()) => true,
                        Err(HomeError::NotFound) => false,
                        Err(e) => return Err(fail(r.b, e)),
                    },
                    None => false,
                };
                if !moved {
                    // Home lost it on the way: made again.
                    return self.create(r, d, hd, obj, &name).await;
                }
                let (h, a) = home.lookup(hd, &name).await.map_err(|e| fail(r.b, e))?;
                self.place(r, obj, d, &name, &h, a.fileid, None).await
            }
            Step::Link { obj, from, name } => {
                let target = match self.resolve(r, from.dir).await? {
                    Some(hf) => match home.lookup(&hf, &from.name).await {
                        Ok((h, _)) => Some(h),
                        Err(HomeError::NotFound) => None,
                        Err(e) => return Err(fail(r.b, e)),
                    },
                    None => None,
                };
                match target {
                    Some(t) => match home.link(&t, hd, &name).await {
                        Ok(_) | Err(HomeError::Exists) => Ok(()),
                        Err(e) => Err(fail(r.b, e)),
                    },
                    None => self.create(r, d, hd, obj, &name).await,
                }
            }
            Step::Create { obj, name } => self.create(r, d, hd, obj, &name).await,
        }
    }

    /// Makes object `obj` at home as `name` in directory `d`.
    pub(super) async fn create(
        &self,
        r: &mut Round<'_>,
        d: FileId,
        hd: &HomeHandle,
        obj: FileId,
        name: &[u8],
    ) -> Result<(), WireError> {
        if is_cache_id(obj) {
            // Fetched from home and gone there: home's change wins.
            r.b.wb.skipped.fetch_add(1, Ordering::Relaxed);
            warn!(dir = d, name = %String::from_utf8_lossy(name), "write-back: an object fetched from home is gone there; not made again");
            return Ok(());
        }
        let Some(i) = self.inode(r, obj).await? else {
            // Removed from the cache since it was listed: the next round
            // sees its directory without it.
            return Ok(());
        };
        let (what, attrs) = new_of(&i);
        let (h, a) = r
            .home
            .create(hd, name, &what, &attrs)
            .await
            .map_err(|e| home_failed(r.b, e))?;
        self.place(r, obj, d, name, &h, a.fileid, Some(seen_made(&i, &a)))
            .await?;
        if i.attr.kind == FileKind::File && i.attr.size > 0 {
            r.made.insert(obj);
        }
        r.created.insert(obj);
        Ok(())
    }
}

/// The stamp to record for object `i` just made at home (attributes `a`):
/// home's, or, for a file whose data follows, [`super::conflicts::pushing`].
fn seen_made(i: &Inode, a: &morris_home::HomeAttr) -> HomeStamp {
    if i.attr.kind == FileKind::File && i.attr.size > 0 {
        super::conflicts::pushing(FileKind::File)
    } else {
        stamp_of(a)
    }
}

/// The cache object that left name `name` of directory `d`, if home's
/// entry there (file number `fileid`) is still it: an object the
/// write-back placed there, or one fetched from home under that name.
fn departed(r: &Round<'_>, d: FileId, name: &[u8], fileid: u64) -> Option<FileId> {
    let key = (d, name.to_vec());
    r.by_spot
        .get(&key)
        .copied()
        .filter(|o| r.homes.get(o).is_some_and(|rec| rec.fileid == fileid))
        .or_else(|| {
            r.gone
                .get(&key)
                .and_then(|v| v.iter().find(|g| g.1.fileid == fileid))
                .map(|g| g.1.id)
        })
}

/// Notes in the round's maps where home has object `rec.id` now.
pub(super) fn note_place(r: &mut Round<'_>, rec: WbHome) {
    let (id, spot) = (rec.id, (rec.dir, rec.name.clone()));
    if let Some(old) = r.homes.insert(id, rec) {
        r.by_spot.remove(&(old.dir, old.name));
    }
    r.by_spot.insert(spot, id);
    r.handles.remove(&id);
}

/// Every entry of home's directory `h`, page by page.
async fn list_home(home: &dyn Home, h: &HomeHandle) -> Result<Vec<HomeEntry>, HomeError> {
    let mut entries = Vec::new();
    let (mut cookie, mut verifier) = (0, [0u8; 8]);
    loop {
        let page = home
            .read_dir(h, cookie, verifier, PAGE as usize, true)
            .await?;
        verifier = page.verifier;
        let eof = page.eof;
        for e in page.entries {
            cookie = e.cookie;
            entries.push(e);
        }
        if eof {
            return Ok(entries);
        }
    }
}

/// Removes directory `name` (handle `h`, the cache's object `obj`) in
/// `dir` at home with what in it the cache knew (names it left, objects
/// it placed, aside names), depth first; names another writer made in it
/// stay, and so does the directory then (its removal is undone in the
/// cache by the next listing of its parent: counted as a conflict).
fn remove_known<'a>(
    r: &'a Round<'_>,
    obj: FileId,
    dir: &'a HomeHandle,
    h: &'a HomeHandle,
    name: &'a [u8],
) -> BoxFuture<'a, Result<(), HomeError>> {
    async move {
        let home = &*r.home;
        let entries = list_home(home, h).await?;
        for e in entries {
            let known = departed(r, obj, &e.name, e.fileid).or_else(|| parse_temp(&e.name));
            let Some(child) = known else {
                continue;
            };
            let (ch, a) = match &e.plus {
                Some(p) => p.clone(),
                None => match home.lookup(h, &e.name).await {
                    Ok(x) => x,
                    Err(HomeError::NotFound) => continue,
                    Err(err) => return Err(err),
                },
            };
            let res = if a.kind == HomeKind::Dir {
                remove_known(r, child, h, &ch, &e.name).await
            } else {
                home.remove(h, &e.name).await
            };
            match res {
                Ok(()) | Err(HomeError::NotFound) => {}
                Err(err) => return Err(err),
            }
        }
        match home.rmdir(dir, name).await {
            Err(HomeError::NotEmpty) => {
                r.b.wb.conflicts.fetch_add(1, Ordering::Relaxed);
                warn!(
                    name = %String::from_utf8_lossy(name),
                    "write-back: a directory removed in the cache holds another writer's names at home: kept"
                );
                Ok(())
            }
            other => other,
        }
    }
    .boxed()
}

/// Removes `name` (a directory) in `dir` at home with everything in it.
fn remove_tree<'a>(
    home: &'a dyn Home,
    dir: &'a HomeHandle,
    name: &'a [u8],
) -> BoxFuture<'a, Result<(), HomeError>> {
    async move {
        let (h, _) = home.lookup(dir, name).await?;
        loop {
            let page = home.read_dir(&h, 0, [0; 8], PAGE as usize, true).await?;
            if page.entries.is_empty() {
                break;
            }
            for e in &page.entries {
                let is_dir = match &e.plus {
                    Some((_, a)) => a.kind == HomeKind::Dir,
                    None => home.lookup(&h, &e.name).await?.1.kind == HomeKind::Dir,
                };
                let r = if is_dir {
                    remove_tree(home, &h, &e.name).await
                } else {
                    home.remove(&h, &e.name).await
                };
                match r {
                    Ok(()) | Err(HomeError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        home.rmdir(dir, name).await
    }
    .boxed()
}
