//! The lease table: multi-reader/single-writer leases on inodes, with recall.
//!
//! This is a pure state machine: it does no I/O and reads no clock. The caller
//! passes the current time (milliseconds on any monotonic scale) into every
//! call and acts on the [`Effects`] it gets back: wake the waiters whose
//! tickets were granted, push the recalls to the holders' connections.
//!
//! Rules (see `morris_proto::messages`):
//! * leases belong to a client id; every request from a client renews all of
//!   its leases ([`LeaseTable::touch`]); a client silent for `lease_ms` loses
//!   them all (on the next [`LeaseTable::tick`]);
//! * a conflicting request waits in the inode's FIFO queue; when it reaches the
//!   head, each conflicting holder is recalled once, and loses its lease when
//!   it releases, when it expires, or `lease_ms` after the recall;
//! * asking for the write lease while holding the read lease drops the read
//!   lease first, so two upgrading readers cannot deadlock;
//! * a request that finds the queue non-empty queues behind it, even a read
//!   that the holders would allow: waiting writers go before later readers;
//! * a client re-asking for a lease it already holds (or asking for the read
//!   lease while holding the write lease) is granted at once and keeps what it
//!   holds.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use morris_proto::messages::LeaseMode;
use morris_proto::FileId;

#[cfg(test)]
mod sim_tests;

/// The id a client chose in its `Hello`.
pub type ClientId = u64;
/// Names one waiting acquire.
pub type Ticket = u64;
/// Milliseconds on the caller's monotonic clock.
pub type Millis = u64;

/// The outcome of [`LeaseTable::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is held now.
    Granted,
    /// The request waits; its ticket shows up in [`Effects::granted`] when it is
    /// granted, unless it is [`LeaseTable::cancel`]led first.
    Waiting(Ticket),
}

/// A recall the caller must push to a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recall {
    /// The holder to tell.
    pub client: ClientId,
    /// The inode.
    pub ino: FileId,
    /// What the waiting client wants.
    pub want: LeaseMode,
}

/// What the caller must do after a call.
#[derive(Debug, Default)]
pub struct Effects {
    /// Tickets granted: wake their waiters.
    pub granted: Vec<Ticket>,
    /// Recalls to push.
    pub recalls: Vec<Recall>,
    /// Leases taken away without a release (holder expiry or forced revoke),
    /// as (client, inode); for logs.
    pub revoked: Vec<(ClientId, FileId)>,
    /// Of those, the write leases, as (inode, the grant's fence number):
    /// changes made under them may still be on their way to the data
    /// servers, which must be told to refuse them.
    pub fenced: Vec<(FileId, u64)>,
}

impl Effects {
    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty()
            && self.recalls.is_empty()
            && self.revoked.is_empty()
            && self.fenced.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    ticket: Ticket,
    client: ClientId,
    mode: LeaseMode,
}

#[derive(Debug, Default)]
struct InodeLeases {
    writer: Option<ClientId>,
    readers: BTreeSet<ClientId>,
    /// Holders already recalled, with the time their lease is taken by force.
    recalled: BTreeMap<ClientId, Millis>,
    queue: VecDeque<Waiter>,
    /// The fence number of the current write grant (see [`LeaseTable::fence`]).
    fence: u64,
}

impl InodeLeases {
    fn is_idle(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.queue.is_empty()
    }

    fn holds(&self, client: ClientId) -> Option<LeaseMode> {
        if self.writer == Some(client) {
            Some(LeaseMode::Write)
        } else if self.readers.contains(&client) {
            Some(LeaseMode::Read)
        } else {
            None
        }
    }

    fn compatible(&self, client: ClientId, mode: LeaseMode) -> bool {
        let writer_ok = self.writer.is_none() || self.writer == Some(client);
        match mode {
            LeaseMode::Read => writer_ok,
            LeaseMode::Write => writer_ok && self.readers.iter().all(|&r| r == client),
        }
    }

    fn conflicting(&self, client: ClientId, mode: LeaseMode) -> Vec<ClientId> {
        let mut out = Vec::new();
        if let Some(w) = self.writer {
            if w != client {
                out.push(w);
            }
        }
        if mode == LeaseMode::Write {
            out.extend(self.readers.iter().copied().filter(|&r| r != client));
        }
        out
    }
}

#[derive(Debug)]
struct ClientLeases {
    last_seen: Millis,
    held: BTreeSet<FileId>,
}

/// Every lease granted by one server, and the requests waiting for one.
#[derive(Debug)]
pub struct LeaseTable {
    lease_ms: Millis,
    inodes: HashMap<FileId, InodeLeases>,
    clients: HashMap<ClientId, ClientLeases>,
    /// Forced-revoke deadlines: (deadline, inode, holder).
    deadlines: BTreeSet<(Millis, FileId, ClientId)>,
    /// Where each waiting ticket waits.
    waiting: HashMap<Ticket, FileId>,
    next_ticket: Ticket,
    leases: u64,
    recalls_sent: u64,
    /// Microseconds of the wall clock at `now` = 0, for fence numbers.
    fence_base: u64,
    /// The last fence number handed out.
    last_fence: u64,
}

impl LeaseTable {
    /// An empty table whose leases last `lease_ms` without renewal.
    pub fn new(lease_ms: Millis) -> Self {
        LeaseTable {
            lease_ms: lease_ms.max(1),
            inodes: HashMap::new(),
            clients: HashMap::new(),
            deadlines: BTreeSet::new(),
            waiting: HashMap::new(),
            next_ticket: 1,
            leases: 0,
            recalls_sent: 0,
            fence_base: 0,
            last_fence: 0,
        }
    }

    /// The same table, numbering its write grants from the wall clock:
    /// `base_us` is the wall clock, in microseconds, at `now` = 0. Fence
    /// numbers then keep growing across a restart or a takeover by another
    /// server (which grants nothing for a lease time) as long as the
    /// servers' clocks agree to within that time.
    pub fn fenced_from(mut self, base_us: u64) -> Self {
        self.fence_base = base_us;
        self
    }

    /// The fence number of the write lease `client` holds on `ino`, if it
    /// holds that. Every write grant gets a number higher than any before it
    /// on this server; data servers refuse a change that carries a lower
    /// number than one they have already seen for the file (a late write
    /// from a holder whose lease passed to another client).
    pub fn fence(&self, client: ClientId, ino: FileId) -> Option<u64> {
        self.inodes
            .get(&ino)
            .filter(|s| s.writer == Some(client))
            .map(|s| s.fence)
    }

    /// Numbers every later write grant above `floor` (the durable fence
    /// reservation of a range this table starts granting for: numbers a
    /// previous life or another server may have handed out).
    pub fn raise_fence_floor(&mut self, floor: u64) {
        self.last_fence = self.last_fence.max(floor);
    }

    fn next_fence(&mut self, now: Millis) -> u64 {
        let clock = self.fence_base.saturating_add(now.saturating_mul(1000));
        self.last_fence = clock.max(self.last_fence + 1);
        self.last_fence
    }

    /// Leases granted now (one per client and inode).
    pub fn lease_count(&self) -> u64 {
        self.leases
    }

    /// Why one more lease for `client` would pass a cap (`per_client`
    /// leases held by one client, `total` in all), if it would.
    pub fn over_caps(&self, client: ClientId, per_client: usize, total: u64) -> Option<String> {
        let mine = self.clients.get(&client).map_or(0, |c| c.held.len());
        if mine >= per_client {
            return Some(format!(
                "this client holds {mine} leases here, the most allowed; give some back"
            ));
        }
        if self.leases >= total {
            return Some(format!(
                "this server holds {} leases, the most it allows",
                self.leases
            ));
        }
        None
    }

    /// Requests waiting now.
    #[cfg(test)]
    pub fn waiter_count(&self) -> usize {
        self.waiting.len()
    }

    /// Recalls issued since the table was made.
    pub fn recalls_sent(&self) -> u64 {
        self.recalls_sent
    }

    /// The lease `client` holds on `ino`.
    /// Every lease on `ino` now: the writer, then the readers.
    pub fn holders(&self, ino: FileId) -> Vec<(ClientId, LeaseMode)> {
        let Some(i) = self.inodes.get(&ino) else {
            return Vec::new();
        };
        let mut out: Vec<(ClientId, LeaseMode)> = i
            .writer
            .map(|w| (w, LeaseMode::Write))
            .into_iter()
            .collect();
        out.extend(
            i.readers
                .iter()
                .filter(|&&r| Some(r) != i.writer)
                .map(|&r| (r, LeaseMode::Read)),
        );
        out
    }

    pub fn holds(&self, client: ClientId, ino: FileId) -> Option<LeaseMode> {
        self.inodes.get(&ino).and_then(|s| s.holds(client))
    }

    /// True while `ticket` waits.
    #[cfg(test)]
    pub fn is_waiting(&self, ticket: Ticket) -> bool {
        self.waiting.contains_key(&ticket)
    }

    /// Records that `client` was heard from at `now`, renewing all its leases.
    pub fn touch(&mut self, client: ClientId, now: Millis) {
        if let Some(c) = self.clients.get_mut(&client) {
            c.last_seen = c.last_seen.max(now);
        }
    }

    /// Asks for `mode` on `ino` for `client`.
    pub fn acquire(
        &mut self,
        client: ClientId,
        ino: FileId,
        mode: LeaseMode,
        now: Millis,
        fx: &mut Effects,
    ) -> Acquired {
        self.touch(client, now);
        let held = self.holds(client, ino);
        match (held, mode) {
            (Some(LeaseMode::Write), _) | (Some(LeaseMode::Read), LeaseMode::Read) => {
                return Acquired::Granted;
            }
            (Some(LeaseMode::Read), LeaseMode::Write) => {
                // Upgrade: give up the read lease first.
                self.drop_lease(client, ino);
            }
            (None, _) => {}
        }
        let st = self.inodes.entry(ino).or_default();
        if st.queue.is_empty() && st.compatible(client, mode) {
            self.grant(client, ino, mode, now);
            // The upgrade may have unblocked nobody (the queue was empty).
            return Acquired::Granted;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        st.queue.push_back(Waiter {
            ticket,
            client,
            mode,
        });
        self.waiting.insert(ticket, ino);
        self.pump(ino, now, fx);
        if let Some(pos) = fx.granted.iter().position(|&t| t == ticket) {
            fx.granted.swap_remove(pos);
            return Acquired::Granted;
        }
        Acquired::Waiting(ticket)
    }

    /// Gives up `client`'s lease on `ino` (nothing if none is held).
    pub fn release(&mut self, client: ClientId, ino: FileId, now: Millis, fx: &mut Effects) {
        self.touch(client, now);
        if self.drop_lease(client, ino) {
            self.pump(ino, now, fx);
        }
    }

    /// Withdraws a waiting request (its connection closed).
    pub fn cancel(&mut self, ticket: Ticket, now: Millis, fx: &mut Effects) {
        let Some(ino) = self.waiting.remove(&ticket) else {
            return;
        };
        if let Some(st) = self.inodes.get_mut(&ino) {
            st.queue.retain(|w| w.ticket != ticket);
        }
        self.pump(ino, now, fx);
    }

    /// Takes every lease of `client` away at once (it is gone for good).
    pub fn drop_client(&mut self, client: ClientId, now: Millis, fx: &mut Effects) {
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        let inos: Vec<FileId> = c.held.iter().copied().collect();
        for ino in inos {
            if self.revoke(client, ino, fx) {
                self.pump(ino, now, fx);
            }
        }
    }

    /// Takes `client`'s lease on `ino` away without its release; true if
    /// it held one. Does not pump the queue.
    fn revoke(&mut self, client: ClientId, ino: FileId, fx: &mut Effects) -> bool {
        let fence = self.fence(client, ino);
        if !self.drop_lease(client, ino) {
            return false;
        }
        fx.revoked.push((client, ino));
        if let Some(f) = fence {
            fx.fenced.push((ino, f));
        }
        true
    }

    /// Expires silent clients and overdue recalls as of `now`.
    pub fn tick(&mut self, now: Millis, fx: &mut Effects) {
        let lease_ms = self.lease_ms;
        let expired: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| now.saturating_sub(c.last_seen) >= lease_ms)
            .map(|(&id, _)| id)
            .collect();
        for client in expired {
            // A grant made while expiring an earlier client renews this one:
            // that lease was just handed out and must not vanish unannounced.
            let silent = self
                .clients
                .get(&client)
                .is_some_and(|c| now.saturating_sub(c.last_seen) >= lease_ms);
            if silent {
                self.drop_client(client, now, fx);
            }
        }
        while let Some(&(deadline, ino, client)) = self.deadlines.iter().next() {
            if deadline > now {
                break;
            }
            self.deadlines.remove(&(deadline, ino, client));
            self.revoke(client, ino, fx);
            self.pump(ino, now, fx);
        }
    }

    /// Gives `client` `mode` on `ino`; the caller checked it is compatible.
    fn grant(&mut self, client: ClientId, ino: FileId, mode: LeaseMode, now: Millis) {
        let fence = match mode {
            LeaseMode::Write => self.next_fence(now),
            LeaseMode::Read => 0,
        };
        let st = self.inodes.entry(ino).or_default();
        let before = st.holds(client);
        match mode {
            LeaseMode::Write => {
                st.readers.remove(&client);
                if st.writer != Some(client) {
                    st.fence = fence;
                }
                st.writer = Some(client);
                // A read lease turned into a write lease is a new grant: a
                // recall of the read lease no longer applies to it.
                if let Some(d) = st.recalled.remove(&client) {
                    self.deadlines.remove(&(d, ino, client));
                }
            }
            LeaseMode::Read => {
                if st.writer != Some(client) {
                    st.readers.insert(client);
                }
            }
        }
        if before.is_none() {
            self.leases += 1;
        }
        let c = self.clients.entry(client).or_insert(ClientLeases {
            last_seen: now,
            held: BTreeSet::new(),
        });
        // The lease runs from the grant: the reply leaves now.
        c.last_seen = c.last_seen.max(now);
        c.held.insert(ino);
    }

    /// Removes whatever `client` holds on `ino`; true if it held something.
    /// Does not pump the queue.
    fn drop_lease(&mut self, client: ClientId, ino: FileId) -> bool {
        let Some(st) = self.inodes.get_mut(&ino) else {
            return false;
        };
        let had = if st.writer == Some(client) {
            st.writer = None;
            true
        } else {
            st.readers.remove(&client)
        };
        if let Some(deadline) = st.recalled.remove(&client) {
            self.deadlines.remove(&(deadline, ino, client));
        }
        if st.is_idle() {
            // No holder and no waiter: recall records are moot too.
            for (c, d) in std::mem::take(&mut st.recalled) {
                self.deadlines.remove(&(d, ino, c));
            }
            self.inodes.remove(&ino);
        }
        if had {
            self.leases = self.leases.saturating_sub(1);
            if let Some(c) = self.clients.get_mut(&client) {
                c.held.remove(&ino);
                if c.held.is_empty() {
                    self.clients.remove(&client);
                }
            }
        }
        had
    }

    /// Grants from the head of `ino`'s queue while possible, then recalls the
    /// holders that block the new head.
    fn pump(&mut self, ino: FileId, now: Millis, fx: &mut Effects) {
        loop {
            let Some(st) = self.inodes.get_mut(&ino) else {
                return;
            };
            let Some(&head) = st.queue.front() else {
                break;
            };
            if !st.compatible(head.client, head.mode) {
                let blockers = st.conflicting(head.client, head.mode);
                for h in blockers {
                    if let std::collections::btree_map::Entry::Vacant(v) = st.recalled.entry(h) {
                        let deadline = now.saturating_add(self.lease_ms);
                        v.insert(deadline);
                        self.deadlines.insert((deadline, ino, h));
                        self.recalls_sent += 1;
                        fx.recalls.push(Recall {
                            client: h,
                            ino,
                            want: head.mode,
                        });
                    }
                }
                return;
            }
            st.queue.pop_front();
            self.waiting.remove(&head.ticket);
            self.grant(head.client, ino, head.mode, now);
            fx.granted.push(head.ticket);
        }
        if let Some(st) = self.inodes.get(&ino) {
            if st.is_idle() {
                for (&c, &d) in &st.recalled {
                    self.deadlines.remove(&(d, ino, c));
                }
                self.inodes.remove(&ino);
            }
        }
    }

    /// Checks the table's internal invariants; returns a description of the
    /// first one broken. Used by tests.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut count = 0u64;
        for (&ino, st) in &self.inodes {
            if let Some(w) = st.writer {
                if !st.readers.is_empty() {
                    return Err(format!(
                        "inode {ino}: writer {w} together with readers {:?}",
                        st.readers
                    ));
                }
                count += 1;
                if !self.clients.get(&w).is_some_and(|c| c.held.contains(&ino)) {
                    return Err(format!("inode {ino}: writer {w} not in its client's set"));
                }
            }
            for r in &st.readers {
                count += 1;
                if !self.clients.get(r).is_some_and(|c| c.held.contains(&ino)) {
                    return Err(format!("inode {ino}: reader {r} not in its client's set"));
                }
            }
            for w in &st.queue {
                if self.waiting.get(&w.ticket) != Some(&ino) {
                    return Err(format!(
                        "ticket {} queued on {ino} but not indexed",
                        w.ticket
                    ));
                }
            }
            for (&c, &d) in &st.recalled {
                if !self.deadlines.contains(&(d, ino, c)) {
                    return Err(format!("recall of {c} on {ino} has no deadline entry"));
                }
            }
            if st.is_idle() {
                return Err(format!("idle inode {ino} kept"));
            }
        }
        if count != self.leases {
            return Err(format!("lease count {} but {count} held", self.leases));
        }
        for (&c, cl) in &self.clients {
            if cl.held.is_empty() {
                return Err(format!("client {c} kept with nothing held"));
            }
            for ino in &cl.held {
                if self.holds(c, *ino).is_none() {
                    return Err(format!("client {c} lists {ino} but holds nothing there"));
                }
            }
        }
        for &(_, ino, c) in &self.deadlines {
            if !self
                .inodes
                .get(&ino)
                .is_some_and(|s| s.recalled.contains_key(&c))
            {
                return Err(format!("stale deadline for {c} on {ino}"));
            }
        }
        let queued: usize = self.inodes.values().map(|s| s.queue.len()).sum();
        if queued != self.waiting.len() {
            return Err(format!(
                "{queued} queued but {} indexed waiters",
                self.waiting.len()
            ));
        }
        Ok(())
    }

    /// Position of `ticket` in its queue (0 = head), for tests.
    #[cfg(test)]
    pub fn queue_position(&self, ticket: Ticket) -> Option<usize> {
        let ino = self.waiting.get(&ticket)?;
        self.inodes
            .get(ino)?
            .queue
            .iter()
            .position(|w| w.ticket == ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LeaseMode::{Read, Write};

    const L: Millis = 1000;

    fn fx() -> Effects {
        Effects::default()
    }

    #[test]
    fn readers_share_writer_excludes() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        assert_eq!(t.acquire(1, 10, Read, 0, &mut e), Acquired::Granted);
        assert_eq!(t.acquire(2, 10, Read, 0, &mut e), Acquired::Granted);
        assert!(e.is_empty());
        assert_eq!(t.lease_count(), 2);
        let Acquired::Waiting(tk) = t.acquire(3, 10, Write, 1, &mut e) else {
            panic!("write granted over readers");
        };
        let mut recalled: Vec<ClientId> = e.recalls.iter().map(|r| r.client).collect();
        recalled.sort();
        assert_eq!(recalled, vec![1, 2]);
        assert!(e.recalls.iter().all(|r| r.want == Write && r.ino == 10));
        assert_eq!(t.recalls_sent(), 2);
        let mut e = fx();
        t.release(1, 10, 2, &mut e);
        assert!(e.granted.is_empty());
        t.release(2, 10, 3, &mut e);
        assert_eq!(e.granted, vec![tk]);
        assert_eq!(t.holds(3, 10), Some(Write));
        assert_eq!(t.lease_count(), 1);
        t.check().unwrap();
    }

    #[test]
    fn recall_is_sent_once_per_holder() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 5, Write, 0, &mut e);
        t.acquire(2, 5, Read, 0, &mut e);
        t.acquire(3, 5, Read, 0, &mut e);
        assert_eq!(e.recalls.len(), 1);
        assert_eq!(
            e.recalls[0],
            Recall {
                client: 1,
                ino: 5,
                want: Read
            }
        );
        let mut e = fx();
        t.release(1, 5, 1, &mut e);
        assert_eq!(e.granted.len(), 2);
        assert_eq!(t.holds(2, 5), Some(Read));
        assert_eq!(t.holds(3, 5), Some(Read));
    }

    #[test]
    fn silent_holder_expires_and_waiter_is_granted() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 7, Write, 0, &mut e);
        // Client 2 keeps talking; client 1 goes silent.
        let Acquired::Waiting(tk) = t.acquire(2, 7, Write, 100, &mut e) else {
            panic!()
        };
        let mut e = fx();
        t.tick(999, &mut e);
        assert!(e.granted.is_empty());
        t.tick(1000, &mut e);
        assert_eq!(e.granted, vec![tk]);
        assert_eq!(e.revoked, vec![(1, 7)]);
        assert_eq!(t.holds(1, 7), None);
        t.check().unwrap();
    }

    #[test]
    fn renewal_keeps_leases_and_recall_deadline_forces_revoke() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 7, Read, 0, &mut e);
        for now in (100..3000).step_by(100) {
            t.touch(1, now);
            t.tick(now, &mut e);
        }
        assert_eq!(t.holds(1, 7), Some(Read));
        // A recall at 3000: client 1 keeps renewing but never releases.
        let Acquired::Waiting(tk) = t.acquire(2, 7, Write, 3000, &mut e) else {
            panic!()
        };
        let mut e = fx();
        for now in (3100..=4000).step_by(100) {
            t.touch(1, now);
            t.tick(now, &mut e);
            if now < 4000 {
                assert!(e.granted.is_empty(), "granted early at {now}");
            }
        }
        assert_eq!(e.granted, vec![tk]);
        assert_eq!(t.holds(1, 7), None);
        assert_eq!(t.holds(2, 7), Some(Write));
    }

    #[test]
    fn upgrading_readers_do_not_deadlock() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 9, Read, 0, &mut e);
        t.acquire(2, 9, Read, 0, &mut e);
        let Acquired::Waiting(a) = t.acquire(1, 9, Write, 1, &mut e) else {
            panic!()
        };
        assert_eq!(t.holds(1, 9), None, "upgrade drops the read lease");
        let mut e = fx();
        let Acquired::Waiting(b) = t.acquire(2, 9, Write, 2, &mut e) else {
            panic!()
        };
        // Client 2 dropped its read lease, so client 1's write is granted...
        assert_eq!(e.granted, vec![a]);
        // ... and client 1 is recalled for client 2.
        assert_eq!(
            e.recalls,
            vec![Recall {
                client: 1,
                ino: 9,
                want: Write
            }]
        );
        let mut e = fx();
        t.release(1, 9, 3, &mut e);
        assert_eq!(e.granted, vec![b]);
        t.check().unwrap();
    }

    #[test]
    fn sole_reader_upgrades_at_once() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 9, Read, 0, &mut e);
        assert_eq!(t.acquire(1, 9, Write, 1, &mut e), Acquired::Granted);
        assert_eq!(t.holds(1, 9), Some(Write));
        assert_eq!(t.lease_count(), 1);
        // Read while holding write keeps write.
        assert_eq!(t.acquire(1, 9, Read, 2, &mut e), Acquired::Granted);
        assert_eq!(t.holds(1, 9), Some(Write));
        assert!(e.is_empty());
    }

    #[test]
    fn waiting_writer_goes_before_later_readers() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 4, Read, 0, &mut e);
        let Acquired::Waiting(w) = t.acquire(2, 4, Write, 1, &mut e) else {
            panic!()
        };
        // A new reader would be compatible with reader 1 but must queue.
        let Acquired::Waiting(r) = t.acquire(3, 4, Read, 2, &mut e) else {
            panic!("later reader jumped the waiting writer")
        };
        assert_eq!(t.queue_position(w), Some(0));
        assert_eq!(t.queue_position(r), Some(1));
        // Client 1 already holds read: re-asking is granted without queueing.
        assert_eq!(t.acquire(1, 4, Read, 3, &mut e), Acquired::Granted);
        let mut e = fx();
        t.release(1, 4, 4, &mut e);
        assert_eq!(e.granted, vec![w]);
        // The writer now blocks the reader: it is recalled for a read.
        assert_eq!(
            e.recalls,
            vec![Recall {
                client: 2,
                ino: 4,
                want: Read
            }]
        );
        let mut e = fx();
        t.release(2, 4, 5, &mut e);
        assert_eq!(e.granted, vec![r]);
        t.check().unwrap();
    }

    #[test]
    fn cancelled_head_unblocks_the_rest() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.acquire(1, 4, Read, 0, &mut e);
        let Acquired::Waiting(w) = t.acquire(2, 4, Write, 1, &mut e) else {
            panic!()
        };
        let Acquired::Waiting(r) = t.acquire(3, 4, Read, 2, &mut e) else {
            panic!()
        };
        let mut e = fx();
        t.cancel(w, 3, &mut e);
        assert_eq!(e.granted, vec![r]);
        assert!(!t.is_waiting(w));
        assert_eq!(t.waiter_count(), 0);
        t.check().unwrap();
    }

    #[test]
    fn drop_client_frees_everything() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        for ino in 1..=5 {
            t.acquire(1, ino, Write, 0, &mut e);
        }
        let Acquired::Waiting(tk) = t.acquire(2, 3, Read, 0, &mut e) else {
            panic!()
        };
        let mut e = fx();
        t.drop_client(1, 1, &mut e);
        assert_eq!(e.granted, vec![tk]);
        assert_eq!(e.revoked.len(), 5);
        assert_eq!(t.lease_count(), 1);
        t.check().unwrap();
    }

    #[test]
    fn release_of_nothing_is_harmless() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        t.release(1, 1, 0, &mut e);
        t.cancel(99, 0, &mut e);
        t.tick(10_000, &mut e);
        assert!(e.is_empty());
        t.check().unwrap();
    }

    #[test]
    fn lease_caps_count_per_client_and_in_all() {
        let mut t = LeaseTable::new(L);
        let mut e = fx();
        for ino in 1..=3 {
            t.acquire(1, ino, LeaseMode::Read, 0, &mut e);
        }
        assert!(t.over_caps(1, 3, 100).is_some());
        assert!(t.over_caps(2, 3, 100).is_none());
        assert!(t.over_caps(2, 3, 3).is_some());
        t.release(1, 2, 0, &mut e);
        assert!(t.over_caps(1, 3, 100).is_none());
    }

    #[test]
    fn each_write_grant_is_fenced_above_every_earlier_one() {
        let mut t = LeaseTable::new(L).fenced_from(5_000_000);
        let mut e = fx();
        assert_eq!(
            t.acquire(1, 7, LeaseMode::Write, 0, &mut e),
            Acquired::Granted
        );
        let a = t.fence(1, 7).unwrap();
        assert_eq!(a, 5_000_000);
        // Re-asking keeps the grant and its number; a reader has none.
        t.acquire(1, 7, LeaseMode::Write, 1, &mut e);
        assert_eq!(t.fence(1, 7), Some(a));
        assert_eq!(t.fence(2, 7), None);
        // Client 1 goes silent; client 2 gets the lease after the revoke,
        // with a higher number, even within the same millisecond.
        let Acquired::Waiting(_) = t.acquire(2, 7, LeaseMode::Write, 2, &mut e) else {
            panic!("must wait for the holder");
        };
        t.tick(2 + L, &mut e);
        let b = t.fence(2, 7).unwrap();
        assert!(b > a);
        // The revoked write lease is reported with its number, to be fenced.
        assert_eq!(e.fenced, vec![(7, a)]);
        assert_eq!(t.fence(1, 7), None);
        t.release(2, 7, 2 + L, &mut e);
        t.acquire(3, 7, LeaseMode::Write, 2 + L, &mut e);
        assert!(t.fence(3, 7).unwrap() > b);
        // A new table (a restart, after its grace) numbers above the old one.
        let mut t2 = LeaseTable::new(L).fenced_from(5_000_000);
        t2.acquire(4, 7, LeaseMode::Write, 3 * L, &mut e);
        assert!(t2.fence(4, 7).unwrap() > t.fence(3, 7).unwrap());
        t.check().unwrap();
    }

    #[test]
    fn a_clock_set_back_numbers_above_the_raised_floor() {
        // The previous life handed out numbers up to (its reservation)
        // 9,000,000; this one's clock reads 5,000,000.
        let mut t = LeaseTable::new(L).fenced_from(5_000_000);
        t.raise_fence_floor(9_000_000);
        t.raise_fence_floor(1_000); // never lowers it
        let mut e = fx();
        t.acquire(1, 7, LeaseMode::Write, 0, &mut e);
        assert_eq!(t.fence(1, 7), Some(9_000_001));
        t.acquire(2, 8, LeaseMode::Write, 0, &mut e);
        assert_eq!(t.fence(2, 8), Some(9_000_002));
        // Once the clock passes the floor, numbers follow the clock again.
        t.acquire(3, 9, LeaseMode::Write, 5_000, &mut e);
        assert_eq!(t.fence(3, 9), Some(10_000_000));
    }
}
