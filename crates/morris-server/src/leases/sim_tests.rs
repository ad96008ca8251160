//! Seeded randomized simulation of the lease table.
//!
//! Several clients acquire, release, renew, ignore recalls, crash and come
//! back, in random interleavings, while time advances in random steps. After
//! every step the simulation checks, against its own independent model of who
//! holds what:
//! * never a write lease together with any other lease on the same inode;
//! * the table reports exactly the holdings the model derived from the grants,
//!   releases and revocations it was told about;
//! * every waiting request is granted within a bound (one lease period plus one
//!   time step per request queued ahead of it, plus one), unless its client
//!   crashed and the request was cancelled.

use std::collections::{BTreeMap, HashMap};

use super::*;

/// A small deterministic generator (splitmix64), so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const LEASE: Millis = 100;
const MAX_STEP: Millis = 25;
const CLIENTS: u64 = 5;
const INODES: u64 = 3;

struct Pending {
    client: ClientId,
    ino: FileId,
    mode: LeaseMode,
    deadline: Millis,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    mode: LeaseMode,
    /// When the holder was first told to give this lease back.
    recalled_at: Option<Millis>,
}

#[derive(Default)]
struct ClientModel {
    /// Crashed until this time (silent, no requests); `None` when alive.
    down_until: Option<Millis>,
    /// Ignores recalls (a buggy or hung client).
    deaf: bool,
    /// Scheduled releases answering recalls: (time, inode).
    releases: Vec<(Millis, FileId)>,
}

struct Sim {
    rng: Rng,
    now: Millis,
    table: LeaseTable,
    /// The model: inode -> client -> lease.
    held: BTreeMap<FileId, BTreeMap<ClientId, Held>>,
    /// When each client last sent a request or was granted a lease.
    last_heard: Vec<Millis>,
    trace: bool,
    pending: HashMap<Ticket, Pending>,
    clients: Vec<ClientModel>,
    grants: u64,
    recalls: u64,
    revokes: u64,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let clients = (0..CLIENTS)
            .map(|_| ClientModel {
                deaf: rng.chance(15),
                ..ClientModel::default()
            })
            .collect();
        Sim {
            rng,
            now: 0,
            table: LeaseTable::new(LEASE),
            held: BTreeMap::new(),
            last_heard: vec![0; CLIENTS as usize],
            trace: std::env::var("SIM_TRACE").is_ok(),
            pending: HashMap::new(),
            clients,
            grants: 0,
            recalls: 0,
            revokes: 0,
        }
    }

    fn model_grant(&mut self, client: ClientId, ino: FileId, mode: LeaseMode) {
        self.grants += 1;
        self.last_heard[client as usize] = self.now;
        let m = self.held.entry(ino).or_default();
        let fresh = Held {
            mode,
            recalled_at: None,
        };
        match (m.get(&client).map(|h| h.mode), mode) {
            // Already held at least as strongly: the same lease continues.
            (Some(LeaseMode::Write), _) | (Some(LeaseMode::Read), LeaseMode::Read) => {}
            _ => {
                m.insert(client, fresh);
            }
        }
    }

    fn heard(&mut self, client: ClientId) {
        self.last_heard[client as usize] = self.now;
    }

    fn model_drop(&mut self, client: ClientId, ino: FileId) {
        if let Some(m) = self.held.get_mut(&ino) {
            m.remove(&client);
            if m.is_empty() {
                self.held.remove(&ino);
            }
        }
    }

    fn apply(&mut self, fx: Effects) {
        self.apply_with(fx, false);
    }

    /// Applies effects; `forced` when the caller dropped a client on purpose.
    fn apply_with(&mut self, fx: Effects, forced: bool) {
        if self.trace && !fx.is_empty() {
            eprintln!("  t={} fx {:?}", self.now, fx);
        }
        for (client, ino) in fx.revoked {
            self.revokes += 1;
            let Some(h) = self.held.get(&ino).and_then(|m| m.get(&client)).copied() else {
                panic!("revoked a lease the model does not know: client {client} ino {ino}");
            };
            // A lease may only be taken away from a client that was silent
            // for a lease period, or that was recalled a lease period ago.
            let silent = self.now - self.last_heard[client as usize] >= LEASE;
            let overdue = h.recalled_at.is_some_and(|t| self.now - t >= LEASE);
            assert!(
                forced || silent || overdue,
                "lease of client {client} on {ino} revoked at {} too early: {h:?}, last heard {}",
                self.now,
                self.last_heard[client as usize]
            );
            self.model_drop(client, ino);
        }
        for t in fx.granted {
            let p = self
                .pending
                .remove(&t)
                .unwrap_or_else(|| panic!("granted unknown ticket {t}"));
            if self.trace {
                eprintln!(
                    "    grant {t}: client {} ino {} {:?}",
                    p.client, p.ino, p.mode
                );
            }
            self.model_grant(p.client, p.ino, p.mode);
        }
        for r in fx.recalls {
            self.recalls += 1;
            let now = self.now;
            let Some(h) = self.held.get_mut(&r.ino).and_then(|m| m.get_mut(&r.client)) else {
                panic!("recall sent to a non-holder: {r:?}");
            };
            h.recalled_at.get_or_insert(now);
            let c = &mut self.clients[r.client as usize];
            if c.down_until.is_none() && !c.deaf {
                let delay = self.rng.below(2 * LEASE);
                c.releases.push((self.now + delay, r.ino));
            }
        }
    }

    fn alive(&self, c: ClientId) -> bool {
        self.clients[c as usize].down_until.is_none()
    }

    fn step(&mut self) {
        let c = self.rng.below(CLIENTS);
        let action = self.rng.below(100);
        if self.trace {
            eprintln!(
                "t={} client {c} action {action} held {:?}",
                self.now, self.held
            );
        }
        match action {
            0..=29 => {
                let dt = 1 + self.rng.below(MAX_STEP);
                self.now += dt;
                // Live clients renew now and then (as a client sends Renew
                // every lease_ms / 3); crashed ones come back after a while.
                for id in 0..CLIENTS {
                    let model = &mut self.clients[id as usize];
                    match model.down_until {
                        Some(t) if t <= self.now => model.down_until = None,
                        Some(_) => continue,
                        None => {}
                    }
                    if self.rng.chance(60) {
                        self.table.touch(id, self.now);
                        self.heard(id);
                    }
                }
                // Scheduled recall answers.
                for id in 0..CLIENTS {
                    let due: Vec<(Millis, FileId)> = {
                        let model = &mut self.clients[id as usize];
                        let now = self.now;
                        let (due, rest) = model.releases.drain(..).partition(|r| r.0 <= now);
                        model.releases = rest;
                        due
                    };
                    for (_, ino) in due {
                        if self.alive(id) {
                            self.heard(id);
                            let mut fx = Effects::default();
                            self.table.release(id, ino, self.now, &mut fx);
                            self.model_drop(id, ino);
                            self.apply(fx);
                        }
                    }
                }
                let mut fx = Effects::default();
                self.table.tick(self.now, &mut fx);
                self.apply(fx);
            }
            30..=64 if self.alive(c) => {
                let ino = self.rng.below(INODES);
                let mode = if self.rng.chance(40) {
                    LeaseMode::Write
                } else {
                    LeaseMode::Read
                };
                let mut fx = Effects::default();
                self.heard(c);
                if mode == LeaseMode::Write
                    && self.held.get(&ino).and_then(|m| m.get(&c)).map(|h| h.mode)
                        == Some(LeaseMode::Read)
                {
                    // The upgrade gives the read lease up first.
                    self.model_drop(c, ino);
                }
                match self.table.acquire(c, ino, mode, self.now, &mut fx) {
                    Acquired::Granted => self.model_grant(c, ino, mode),
                    Acquired::Waiting(t) => {
                        let ahead = self
                            .table
                            .queue_position(t)
                            .unwrap_or_else(|| panic!("ticket {t} not queued"))
                            as u64;
                        let deadline = self.now + (ahead + 1) * (LEASE + MAX_STEP) + MAX_STEP;
                        self.pending.insert(
                            t,
                            Pending {
                                client: c,
                                ino,
                                mode,
                                deadline,
                            },
                        );
                    }
                }
                self.apply(fx);
            }
            65..=84 if self.alive(c) => {
                let ino = self.rng.below(INODES);
                let mut fx = Effects::default();
                self.heard(c);
                self.table.release(c, ino, self.now, &mut fx);
                self.model_drop(c, ino);
                self.apply(fx);
            }
            85..=89 if self.alive(c) => {
                // Crash: the connection closes (waiters cancelled), the client
                // goes silent and forgets its scheduled releases.
                let mine: Vec<Ticket> = self
                    .pending
                    .iter()
                    .filter(|(_, p)| p.client == c)
                    .map(|(&t, _)| t)
                    .collect();
                for t in mine {
                    let mut fx = Effects::default();
                    self.table.cancel(t, self.now, &mut fx);
                    assert!(!self.table.is_waiting(t));
                    self.pending.remove(&t);
                    self.apply(fx);
                }
                let down = self.rng.below(4 * LEASE);
                let model = &mut self.clients[c as usize];
                model.down_until = Some(self.now + down);
                model.releases.clear();
            }
            90..=91 if self.alive(c) => {
                // A client that is gone for good and says so (admin reset).
                let mut fx = Effects::default();
                self.table.drop_client(c, self.now, &mut fx);
                self.apply_with(fx, true);
            }
            _ => {}
        }
        self.verify();
    }

    fn verify(&self) {
        if let Err(e) = self.table.check() {
            panic!("table invariant broken at {}: {e}", self.now);
        }
        for (ino, m) in &self.held {
            let writers = m.values().filter(|h| h.mode == LeaseMode::Write).count();
            assert!(
                writers == 0 || m.len() == 1,
                "inode {ino}: a write lease together with other leases: {m:?}"
            );
        }
        for ino in 0..INODES {
            for c in 0..CLIENTS {
                let model = self.held.get(&ino).and_then(|m| m.get(&c)).map(|h| h.mode);
                assert_eq!(
                    self.table.holds(c, ino),
                    model,
                    "client {c} inode {ino} at {}",
                    self.now
                );
            }
        }
        let count: usize = self.held.values().map(|m| m.len()).sum();
        assert_eq!(self.table.lease_count(), count as u64);
        assert_eq!(self.table.waiter_count(), self.pending.len());
        for (t, p) in &self.pending {
            assert!(
                self.now <= p.deadline,
                "ticket {t} ({:?} on {} for client {}) still waits at {} past its bound {}",
                p.mode,
                p.ino,
                p.client,
                self.now,
                p.deadline
            );
            assert!(self.table.is_waiting(*t));
        }
    }
}

#[test]
fn random_interleavings_keep_the_invariants() {
    let mut totals = (0u64, 0u64, 0u64);
    for seed in 0..150u64 {
        let mut sim = Sim::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xfeed);
        for _ in 0..3000 {
            sim.step();
        }
        // Drain: no new requests, time runs on; everyone waiting is served.
        for _ in 0..200 {
            sim.now += MAX_STEP;
            let mut fx = Effects::default();
            sim.table.tick(sim.now, &mut fx);
            sim.apply(fx);
            sim.verify();
        }
        assert!(
            sim.pending.is_empty(),
            "seed {seed}: waiters left after drain"
        );
        totals.0 += sim.grants;
        totals.1 += sim.recalls;
        totals.2 += sim.revokes;
    }
    eprintln!(
        "grants {}, recalls {}, revokes {}",
        totals.0, totals.1, totals.2
    );
    // The runs must have exercised the interesting paths, not just idled.
    assert!(totals.0 > 50_000, "grants {}", totals.0);
    assert!(totals.1 > 10_000, "recalls {}", totals.1);
    assert!(totals.2 > 5_000, "revokes {}", totals.2);
}
