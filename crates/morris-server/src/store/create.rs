//! Creating inodes: ids picked here (`CreateInode`), ids set aside for a
//! client ahead (`ReserveIds`) and inodes made with one (`CreateInodeAt`).
//!
//! Ids are `counter·k + index` (`Layout::allocate_id`): the counter lives
//! in table `volume` (mirrored with the range), and `id_reserve` holds a
//! durable high-water mark past every counter value handed out (see the
//! store's module description), so that no id is given twice, even after
//! power loss or to two clients.

use std::sync::atomic::Ordering;

use morris_proto::home::HomeLink;
use morris_proto::layout::FIRST_COUNTER;
use morris_proto::{
    Attr, ErrorCode, FileId, FileKind, Inode, WireError, Xattr, MAX_FILE_SIZE, MAX_SYMLINK_LEN,
};
use rusqlite::{params, Transaction};

use super::once::OpKey;
use super::{
    cached, db_err, encode_inode, load_inode, sql_id, wb, xattrs, Cached, Store, ID_BATCH,
};

impl Store {
    /// Allocates an id, stores a new inode and returns it.
    #[cfg(test)]
    pub fn create_inode(
        &self,
        parent: FileId,
        attr: &Attr,
        target: Option<&[u8]>,
        gen: u32,
        home: Option<FileId>,
        op: Option<OpKey>,
    ) -> Result<Inode, WireError> {
        self.create_inode_with(parent, attr, target, gen, home, op, &[])
    }

    /// `create_inode`, with the new object's first extended attributes
    /// (the ACLs it inherits from its directory).
    #[allow(clippy::too_many_arguments)]
    pub fn create_inode_with(
        &self,
        parent: FileId,
        attr: &Attr,
        target: Option<&[u8]>,
        gen: u32,
        home: Option<FileId>,
        op: Option<OpKey>,
        first: &[Xattr],
    ) -> Result<Inode, WireError> {
        self.create_inode_in(None, parent, attr, target, gen, home, op, first)
    }

    /// Sets aside `count` new ids of this store's range (`ReserveIds`):
    /// counted as handed out, and durable before they are returned, so no
    /// create here or elsewhere ever uses them.
    pub fn reserve_ids(&self, count: u32) -> Result<Vec<FileId>, WireError> {
        if count == 0 || count > 1024 {
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!("{count} ids asked for (1..=1024)"),
            ));
        }
        let (layout, index) = self.layout_and_index()?;
        let n = u64::from(count);
        let first = self.write_txn(|tx| self.take_counters(tx, layout, index, n))?;
        self.reserved_durably(first + n - 1)?;
        Ok((first..first + n)
            .map(|c| layout.allocate_id(index, c))
            .collect())
    }

    /// `create_inode_with` for an id reserved before (`reserve_ids`) and a
    /// generation the caller chose: `Invalid` for an id of another range
    /// or never handed out, `Exists` for one in use.
    #[allow(clippy::too_many_arguments)]
    pub fn create_inode_at(
        &self,
        id: FileId,
        parent: FileId,
        attr: &Attr,
        target: Option<&[u8]>,
        gen: u32,
        op: Option<OpKey>,
        first: &[Xattr],
    ) -> Result<Inode, WireError> {
        if gen == 0 {
            return Err(WireError::new(ErrorCode::Invalid, "generation 0"));
        }
        self.create_inode_in(Some(id), parent, attr, target, gen, None, op, first)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_inode_in(
        &self,
        at: Option<FileId>,
        parent: FileId,
        attr: &Attr,
        target: Option<&[u8]>,
        gen: u32,
        home: Option<FileId>,
        op: Option<OpKey>,
        first: &[Xattr],
    ) -> Result<Inode, WireError> {
        if home.is_some() && !first.is_empty() {
            return Err(WireError::new(
                ErrorCode::NotSupported,
                "extended attributes are not kept for objects cached from a home",
            ));
        }
        let (layout, index) = self.layout_and_index()?;
        let mut attr = attr.clone();
        attr.mode &= 0o7777;
        super::check_flags(attr.flags)?;
        if home.is_some() {
            attr.flags = 0;
        }
        match (attr.kind, target) {
            (FileKind::Symlink, Some(t)) => {
                if t.is_empty() || t.len() > MAX_SYMLINK_LEN {
                    return Err(WireError::new(
                        ErrorCode::NameTooLong,
                        format!(
                            "symlink target of {} bytes (1..={MAX_SYMLINK_LEN})",
                            t.len()
                        ),
                    ));
                }
                attr.size = t.len() as u64;
            }
            (FileKind::Symlink, None) => {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    "symlink without a target",
                ));
            }
            (_, Some(_)) => {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    "only symlinks have a target",
                ));
            }
            (FileKind::Dir, None) => attr.size = 0,
            (_, None) => {}
        }
        if attr.size > MAX_FILE_SIZE {
            return Err(WireError::new(
                ErrorCode::FileTooBig,
                format!("size {} exceeds {MAX_FILE_SIZE}", attr.size),
            ));
        }
        let is_dir = attr.kind == FileKind::Dir;
        attr.nlink = if is_dir { 2 } else { 1 };
        let mut used = 0;
        let (inode, replayed) = self.write_txn_once(op, |tx| {
            if let Some(id) = at {
                let counter = self.counter(tx)?;
                // Handed out by `reserve_ids` (durable then): only its
                // range, below the counter, and not in use.
                let k = u64::from(layout.servers.max(1));
                let n = id / k;
                if id % k != u64::from(index) || n < FIRST_COUNTER || n >= counter {
                    return Err(WireError::new(
                        ErrorCode::Invalid,
                        format!("file id {id} was not reserved here"),
                    ));
                }
                if sql_id(id) < 0 || load_inode(tx, id)?.is_some() {
                    return Err(WireError::new(
                        ErrorCode::Exists,
                        format!("file id {id} is in use"),
                    ));
                }
                return store_new_inode(tx, id, gen, parent, is_dir, &attr, target, home, first);
            }
            let counter = self.take_counters(tx, layout, index, 1)?;
            let id = layout.allocate_id(index, counter);
            used = counter;
            store_new_inode(tx, id, gen, parent, is_dir, &attr, target, home, first)
        })?;
        if !replayed {
            self.inodes.fetch_add(1, Ordering::Relaxed);
        } else {
            // Answered again: its reservation may not have reached the
            // disk the first time (a failed fsync).
            used = (inode.id.saturating_sub(u64::from(index))) / u64::from(layout.servers.max(1));
        }
        self.reserved_durably(used)?;
        Ok(inode)
    }

    /// The id counter as a create sees it: past every id handed out, also
    /// before a restart that lost its last updates.
    fn counter(&self, tx: &Transaction) -> Result<u64, WireError> {
        let counter: i64 = tx
            .row("SELECT counter FROM volume WHERE one = 1", [], |r| r.get(0))
            .map_err(db_err)?;
        Ok((counter as u64).max(FIRST_COUNTER).max(self.first_id))
    }

    /// Takes the counter values `[c, c + n)` in a create's transaction and
    /// returns `c`: the counter moves past them, and the reservation too if
    /// they reach it (the next batch; made durable by
    /// [`Store::reserved_durably`] before an id of them is answered).
    fn take_counters(
        &self,
        tx: &Transaction,
        layout: morris_proto::layout::Layout,
        index: u32,
        n: u64,
    ) -> Result<u64, WireError> {
        let counter = self.counter(tx)?;
        let last = counter + n - 1;
        let id = layout.allocate_id(index, last);
        if id == FileId::MAX || sql_id(id) < 0 {
            return Err(WireError::new(ErrorCode::NoSpace, "file ids exhausted"));
        }
        tx.exec(
            "UPDATE volume SET counter = ?1 WHERE one = 1",
            params![(counter + n) as i64],
        )
        .map_err(db_err)?;
        tx.exec(
            "INSERT INTO id_reserve (one, hw) VALUES (1, ?1)
             ON CONFLICT (one) DO UPDATE SET hw = ?1 WHERE hw <= ?2",
            params![(last + ID_BATCH) as i64, last as i64],
        )
        .map_err(db_err)?;
        Ok(counter)
    }

    /// Every commit so far, the reservation covering counter value `used`
    /// with them, on disk before an id of it is answered.
    fn reserved_durably(&self, used: u64) -> Result<(), WireError> {
        if used >= self.reserved.load(Ordering::Acquire) {
            self.sync()?;
            self.reserved
                .fetch_max(used.saturating_add(ID_BATCH), Ordering::AcqRel);
        }
        Ok(())
    }
}

/// Stores a new inode `id` (a create's transaction).
#[allow(clippy::too_many_arguments)]
fn store_new_inode(
    tx: &Transaction,
    id: FileId,
    gen: u32,
    parent: FileId,
    is_dir: bool,
    attr: &Attr,
    target: Option<&[u8]>,
    home: Option<FileId>,
    first: &[Xattr],
) -> Result<Inode, WireError> {
    let inode = Inode {
        id,
        gen,
        parent: if is_dir { parent } else { 0 },
        attr: attr.clone(),
        target: target.map(<[u8]>::to_vec),
        stale: Vec::new(),
        alloc: None,
        home: None,
    };
    tx.exec(
        "INSERT INTO inodes (id, gen, data, next_cookie) VALUES (?1, ?2, ?3, 1)",
        params![sql_id(id), i64::from(gen), encode_inode(&inode)?],
    )
    .map_err(db_err)?;
    xattrs::put_initial(tx, &inode, first)?;
    let mut inode = inode;
    if let Some(binding) = home {
        // Made in a writable cache: the cache's own object until
        // the write-back makes it at home.
        let link = HomeLink::local(binding, inode.attr.kind);
        cached::put_link(tx, id, &link)?;
        wb::mark(
            tx,
            id,
            binding,
            wb::Changed {
                attrs: true,
                ..Default::default()
            },
        )?;
        inode.home = Some(Box::new(link));
    }
    Ok(inode)
}
