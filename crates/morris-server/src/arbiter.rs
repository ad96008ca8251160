//! etcd as the arbiter of metadata ownership (`morris server --etcd URL`).
//!
//! With two copies alone a primary cannot tell a dead secondary from a
//! cut-off one, so a *silent* secondary stops it (`ranges.rs`). With etcd,
//! a majority elsewhere decides instead:
//!
//! * `<prefix>/range/<r>/owner` = `"<server> <gen>"`, attached to the owner
//!   server's etcd lease (it disappears when that server stops renewing);
//! * `<prefix>/range/<r>/state` = `"<gen> <0|1>"`: the range's generation
//!   and whether its second copy is current.
//!
//! | who | does | only if (one etcd transaction) |
//! |---|---|---|
//! | primary | serve | it put the owner key under its own etcd lease, and that lease is alive: `now` < send time of the last answered keep-alive + TTL |
//! | primary | go on without a silent copy | it marks the copy not current: owner key still its own |
//! | primary | count on the copy again | the copy has a snapshot and every later change: it marks it current, owner key still its own |
//! | secondary | take over | no owner key (the primary's lease ran out), the stored generation is the one it follows, and the copy is marked current; it writes itself as owner and generation + 1 |
//!
//! A primary therefore never waits for a silent secondary longer than one
//! forwarding timeout, and a secondary never takes over with a copy that
//! missed an acknowledged change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::leases::Millis;

/// How a server checks etcd and proves itself to it (each part optional;
/// etcd's `--trusted-ca-file`/`--client-cert-auth` and `auth enable`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdAuth {
    /// PEM CA certificate(s) etcd's certificate must chain to; needed for
    /// `https://` endpoints.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and its key, for etcd's `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// User name and password, when etcd has authentication enabled.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl EtcdAuth {
    fn options(&self, opts: etcd_client::ConnectOptions) -> etcd_client::ConnectOptions {
        let mut opts = opts;
        if let Some((user, password)) = &self.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        if self.ca_pem.is_some() || self.identity.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &self.ca_pem {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        }
        opts
    }
}

/// A range's record in etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RangeRecord {
    /// Ownership generation.
    pub gen: u64,
    /// The second copy is current.
    pub copy_current: bool,
}

/// The outcome of [`Etcd::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This server owns the range now.
    Owned,
    /// Another server owns it (its lease is alive).
    Held,
    /// The range moved on to a newer generation: this copy is the secondary.
    Superseded(u64),
}

/// A connection to etcd and this server's etcd lease.
pub(crate) struct Etcd {
    client: Client,
    prefix: String,
    ttl_secs: i64,
    started: Instant,
    /// The current etcd lease.
    lease: Mutex<i64>,
    /// Until when (ms since `started`) the lease is certainly alive.
    valid_until: AtomicU64,
}

fn e2s(e: etcd_client::Error) -> String {
    e.to_string()
}

impl Etcd {
    /// Connects and takes an etcd lease of about `lease_ms` (at least 2 s).
    pub async fn connect(
        endpoints: &[String],
        auth: &EtcdAuth,
        volume: uuid::Uuid,
        lease_ms: u32,
        started: Instant,
    ) -> Result<Arc<Etcd>, String> {
        let opts = auth.options(
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_millis(u64::from(lease_ms).clamp(500, 5000))),
        );
        let client = Client::connect(endpoints, Some(opts)).await.map_err(e2s)?;
        let ttl_secs = i64::from(lease_ms.div_ceil(1000).max(2));
        let e = Etcd {
            client,
            prefix: format!("/morris/{volume}"),
            ttl_secs,
            started,
            lease: Mutex::new(0),
            valid_until: AtomicU64::new(0),
        };
        e.grant().await?;
        info!(endpoints = ?endpoints, ttl_secs, "metadata ownership decided by etcd");
        Ok(Arc::new(e))
    }

    fn now_ms(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    async fn grant(&self) -> Result<(), String> {
        let sent = self.now_ms();
        let mut c = self.client.clone();
        let r = c.lease_grant(self.ttl_secs, None).await.map_err(e2s)?;
        *self.lease.lock() = r.id();
        self.valid_until
            .store(sent + (r.ttl().max(0) as u64) * 1000, Ordering::SeqCst);
        Ok(())
    }

    /// True while this server's etcd lease is certainly alive.
    pub fn valid(&self, now: Millis) -> bool {
        now < self.valid_until.load(Ordering::SeqCst)
    }

    /// Renews the lease every quarter TTL, for ever; takes a new one when
    /// it is lost (whatever it held is gone with it: owners re-claim).
    pub async fn keep_alive(self: Arc<Self>) {
        let period = Duration::from_millis((self.ttl_secs as u64) * 250);
        loop {
            tokio::time::sleep(period).await;
            let id = *self.lease.lock();
            let sent = self.now_ms();
            let mut c = self.client.clone();
            let renewed = async {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await.map_err(e2s)?;
                keeper.keep_alive().await.map_err(e2s)?;
                match stream.message().await.map_err(e2s)? {
                    Some(r) => Ok(r.ttl()),
                    None => Err("keep-alive stream ended".to_string()),
                }
            };
            match tokio::time::timeout(period * 2, renewed).await {
                Ok(Ok(ttl)) if ttl > 0 => {
                    self.valid_until
                        .fetch_max(sent + (ttl as u64) * 1000, Ordering::SeqCst);
                }
                Ok(Ok(_)) => {
                    warn!("etcd lease expired; taking a new one");
                    if let Err(e) = self.grant().await {
                        warn!(error = %e, "cannot take an etcd lease");
                    }
                }
                Ok(Err(e)) => debug!(error = %e, "etcd keep-alive failed"),
                Err(_) => debug!("etcd keep-alive unanswered"),
            }
        }
    }

    fn key(&self, range: u32, what: &str) -> String {
        format!("{}/range/{range}/{what}", self.prefix)
    }

    async fn get(&self, key: &str) -> Result<Option<(String, i64)>, String> {
        let mut c = self.client.clone();
        let r = c.get(key, None).await.map_err(e2s)?;
        Ok(r.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
            )
        }))
    }

    /// The range's stored record (`None` before anyone claimed it) and its
    /// revision.
    async fn record(&self, range: u32) -> Result<Option<(RangeRecord, i64)>, String> {
        let Some((v, rev)) = self.get(&self.key(range, "state")).await? else {
            return Ok(None);
        };
        let mut it = v.split_whitespace();
        let gen = it.next().and_then(|g| g.parse().ok());
        let cur = it.next();
        match (gen, cur) {
            (Some(gen), Some(c)) => Ok(Some((
                RangeRecord {
                    gen,
                    copy_current: c == "1",
                },
                rev,
            ))),
            _ => Err(format!("unreadable range record {v:?}")),
        }
    }

    fn state_value(gen: u64, copy_current: bool) -> String {
        format!("{gen} {}", u8::from(copy_current))
    }

    fn owner_value(me: u32, gen: u64) -> String {
        format!("{me} {gen}")
    }

    async fn txn(&self, t: Txn) -> Result<bool, String> {
        let mut c = self.client.clone();
        Ok(c.txn(t).await.map_err(e2s)?.succeeded())
    }

    /// Claims range `range` for server `me`, which keeps it at generation
    /// `gen`: it must be unowned (or owned by `me`) and its stored
    /// generation must not be newer.
    pub async fn claim(&self, range: u32, me: u32, gen: u64) -> Result<Claim, String> {
        let owner = self.key(range, "owner");
        let state = self.key(range, "state");
        let record = self.record(range).await?;
        let mut when = Vec::new();
        let mut ops = Vec::new();
        match record {
            Some((r, _)) if r.gen > gen => return Ok(Claim::Superseded(r.gen)),
            Some((_, rev)) => {
                when.push(Compare::mod_revision(state.as_str(), CompareOp::Equal, rev))
            }
            None => when.push(Compare::version(state.as_str(), CompareOp::Equal, 0)),
        }
        // The copy counts as current only once this owner has brought it up
        // to date (`set_copy_current`).
        ops.push(TxnOp::put(
            state.as_str(),
            Self::state_value(gen, false),
            None,
        ));
        let lease = *self.lease.lock();
        let mine = Self::owner_value(me, gen);
        ops.push(TxnOp::put(
            owner.as_str(),
            mine.clone(),
            Some(PutOptions::new().with_lease(lease)),
        ));
        // Unowned...
        let mut unowned = when.clone();
        unowned.push(Compare::version(owner.as_str(), CompareOp::Equal, 0));
        if self
            .txn(Txn::new().when(unowned).and_then(ops.clone()))
            .await?
        {
            return Ok(Claim::Owned);
        }
        // ... or already ours (re-attached to the current lease).
        let mut ours = when;
        ours.push(Compare::value(owner.as_str(), CompareOp::Equal, mine));
        if self.txn(Txn::new().when(ours).and_then(ops)).await? {
            return Ok(Claim::Owned);
        }
        Ok(Claim::Held)
    }

    /// Records whether the second copy of `range` is current; only while
    /// `me` owns the range at `gen`. False if it does not.
    pub async fn set_copy_current(
        &self,
        range: u32,
        me: u32,
        gen: u64,
        current: bool,
    ) -> Result<bool, String> {
        let owner = self.key(range, "owner");
        let t = Txn::new()
            .when([Compare::value(
                owner.as_str(),
                CompareOp::Equal,
                Self::owner_value(me, gen),
            )])
            .and_then([TxnOp::put(
                self.key(range, "state").as_str(),
                Self::state_value(gen, current),
                None,
            )]);
        self.txn(t).await
    }

    /// Takes `range` over for `me`: only if nobody owns it, its stored
    /// generation is `gen` and its copy is marked current. Writes `me` as
    /// owner at `gen + 1`, the copy (the old primary) not current.
    pub async fn take_over(&self, range: u32, me: u32, gen: u64) -> Result<bool, String> {
        let owner = self.key(range, "owner");
        let state = self.key(range, "state");
        let lease = *self.lease.lock();
        let t = Txn::new()
            .when([
                Compare::version(owner.as_str(), CompareOp::Equal, 0),
                Compare::value(
                    state.as_str(),
                    CompareOp::Equal,
                    Self::state_value(gen, true),
                ),
            ])
            .and_then([
                TxnOp::put(state.as_str(), Self::state_value(gen + 1, false), None),
                TxnOp::put(
                    owner.as_str(),
                    Self::owner_value(me, gen + 1),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ]);
        self.txn(t).await
    }
}

/// The etcd arbiter of a server started with `--etcd`, once connected.
pub(crate) struct Arbiter {
    /// Set by the task that connects.
    pub cell: std::sync::OnceLock<Arc<Etcd>>,
}

impl Arbiter {
    /// The connection, if made.
    pub fn get(&self) -> Option<&Arc<Etcd>> {
        self.cell.get()
    }

    /// True while this server's etcd lease is certainly alive.
    pub fn valid(&self, now: Millis) -> bool {
        self.get().is_some_and(|e| e.valid(now))
    }
}
