//! The morris stripe server.
//!
//! A stripe server keeps, for the volume it was formatted into:
//! * the inodes it owns (`id mod k`) and the entries of the directories among
//!   them, in a SQLite store ([`store`]: WAL mode, every metadata request
//!   committed before it is answered);
//! * the data blocks placed on it, one sparse extent file per file
//!   ([`blocks`]);
//! * the leases (multi-reader/single-writer locks with recall) on its inodes
//!   ([`leases`], a pure state machine driven by the request handler).
//!
//! [`start`] binds the listener, opens the store and serves in the background;
//! [`run`] does the same and never returns while the server runs. The request
//! semantics are those documented in `morris_proto::messages`.
//!
//! On disk, `data_dir` holds `meta.sqlite` (with its `-wal` and `-shm`),
//! `blocks/<2 hex digits>/<file id>` with its checksums beside it
//! (`<file id>.sum`), `blocks/INFLIGHT` (the block changes in progress) and
//! a `LOCK` file that keeps a second server off the same directory.

#![warn(missing_docs)]

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use morris_proto::auth::Keys;
use morris_proto::auth::Role;
use morris_proto::net::ConnLimits;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

mod arbiter;
mod blocks;
mod fences;
mod leases;
mod load;
mod ranges;
mod scrub;
mod service;
mod store;
pub mod writeback;

pub use arbiter::EtcdAuth;
use service::Server;
pub use store::StoreError;

/// Lease duration used when none is configured, in milliseconds.
pub const DEFAULT_LEASE_MS: u32 = 10_000;

/// How a stripe server is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Directory holding the metadata store and the block files (created if missing).
    pub data_dir: PathBuf,
    /// Address to listen on, `host:port`; port 0 picks a free port.
    pub listen: String,
    /// Lease duration in milliseconds (also the grace period after a restart).
    pub lease_ms: u32,
    /// etcd endpoints (`http://host:port`) that decide which copy of a
    /// metadata range serves it, on a mirrored volume; empty: the two copies
    /// decide between themselves (the static rule, `ranges.rs`). Every
    /// server of a volume must be started the same way.
    pub etcd: Vec<String>,
    /// TLS and credentials for those endpoints.
    pub etcd_auth: EtcdAuth,
    /// The volume's keys: every connection must prove it holds one (or the
    /// client key derived from one); the first connects to other servers.
    pub keys: Keys,
    /// Most connections served at once; more are closed at once.
    pub max_connections: usize,
    /// Start a scrub pass when the last complete one is this old (`None`:
    /// only when asked, `morris scrub`).
    pub scrub_every: Option<Duration>,
    /// Bytes a second a scrub pass reads at most, unless it is asked for
    /// with another rate (0: [`DEFAULT_SCRUB_RATE`]).
    pub scrub_rate: u64,
}

/// Scrub rate when none is configured, bytes a second.
pub const DEFAULT_SCRUB_RATE: u64 = scrub::DEFAULT_RATE;

impl ServerConfig {
    /// A configuration with the default lease duration.
    pub fn new(data_dir: impl Into<PathBuf>, listen: impl Into<String>, keys: Keys) -> Self {
        ServerConfig {
            data_dir: data_dir.into(),
            listen: listen.into(),
            lease_ms: DEFAULT_LEASE_MS,
            etcd: Vec::new(),
            etcd_auth: EtcdAuth::default(),
            keys,
            max_connections: morris_proto::net::DEFAULT_MAX_CONNECTIONS,
            scrub_every: None,
            scrub_rate: DEFAULT_SCRUB_RATE,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// A file or directory under the data directory could not be used.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Another server process uses the data directory.
    #[error("data directory {0} is in use by another morris server")]
    Locked(String),
    /// The metadata store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// What a scrape of a server's metrics reads its state from
/// ([`ServerHandle::metrics`]).
#[derive(Clone)]
pub struct MetricsSource {
    server: Arc<Server>,
}

impl MetricsSource {
    /// Sets every state gauge (inodes, leases, connections, disk space,
    /// stale copies, resync, metadata ranges, checksums) from now.
    pub async fn export(&self) {
        self.server.export_gauges().await;
    }

    /// Requests served, block bytes read and written, since start.
    pub fn totals(&self) -> (u64, u64, u64) {
        self.server.totals()
    }
}

/// A running server. [`ServerHandle::shutdown`] stops it and waits until the
/// data directory is released; dropping the handle stops it without waiting.
pub struct ServerHandle {
    addr: SocketAddr,
    epoch: u64,
    server: Arc<Server>,
    stop: Option<oneshot::Sender<()>>,
    accept: JoinHandle<()>,
    ticker: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the server listens on (with the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where this server's resync progress is kept: whoever runs the resync
    /// (the `morris server` command) updates it, `Status` reports it.
    pub fn resync_status(&self) -> Arc<parking_lot::Mutex<morris_proto::ResyncStatus>> {
        self.server.resync_status()
    }

    /// Serves until the server is stopped (it never stops by itself; an
    /// error here means the accept loop failed).
    pub async fn serve(&mut self) {
        if let Err(e) = (&mut self.accept).await {
            warn!(error = %e, "accept loop ended abnormally");
        }
    }

    /// This run's lease epoch, as returned in `Hello`.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Where the copies this server found damaged wait for repair.
    pub fn damage(&self) -> Damage {
        Damage {
            server: self.server.clone(),
        }
    }

    /// Sets the server's state gauges for a Prometheus scrape (issue 20;
    /// the request histograms and byte counters are kept as requests run).
    pub fn metrics(&self) -> MetricsSource {
        MetricsSource {
            server: self.server.clone(),
        }
    }

    /// Fault injection for tests: drops all traffic between this server and
    /// the other servers (metadata mirroring), both ways, while `cut`.
    pub fn cut_peers(&self, cut: bool) {
        self.server.cut_peers(cut);
    }

    /// Stops accepting, closes every connection, abandons waiting lease
    /// requests, and returns once the data directory is released.
    pub async fn shutdown(mut self) {
        self.stop_now();
        if let Err(e) = (&mut self.accept).await {
            if !e.is_cancelled() {
                warn!(error = %e, "accept loop ended abnormally");
            }
        }
        let _ = (&mut self.ticker).await;
        // Deletes answered since the last settling: their records go now.
        self.server.settle_deletes().await;
        info!(addr = %self.addr, "stripe server stopped");
    }

    fn stop_now(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.ticker.abort();
        self.server.stop();
    }
}

/// The copies a server found damaged (by reads or a scrub), for whoever
/// repairs them: the `morris server` command, through a client of the
/// volume, records them stale so that resync rewrites them.
#[derive(Clone)]
pub struct Damage {
    server: Arc<Server>,
}

impl Damage {
    /// The copies found damaged since the last call, as (file, copy, lowest
    /// damaged byte of this server's extent file of that copy).
    /// (Not among them: damage gone meanwhile — the chunk rewritten, or
    /// fetched again — and a damaged unit of a cached file, which is simply
    /// fetched from home again.)
    pub fn take(&self) -> Vec<(morris_proto::FileId, u8, u64)> {
        self.server
            .blocks()
            .take_damage()
            .into_iter()
            .filter(|&(id, copy, at)| self.server.blocks().still_damaged(id, copy, at))
            .filter(|&(id, copy, at)| !self.server.refetch_damaged(id, copy, at))
            .collect()
    }

    /// Files whose copies may differ since the last call, as (file, first
    /// block, last block; `u64::MAX`: to the end): a writer's lease was
    /// revoked (it stopped or was cut off) while its changes may have
    /// reached some copies of a block and not others. Resync makes each
    /// block's copies equal to its first copy (`Client::reconcile_copies`).
    pub fn take_diverged(&self) -> Vec<(morris_proto::FileId, u64, u64)> {
        self.server.take_diverged()
    }

    /// Woken when damage is found (and when copies may have diverged).
    pub fn found(&self) -> Arc<tokio::sync::Notify> {
        self.server.blocks().damage_found()
    }

    /// Whether this server replaces a lost one and its blocks are not yet
    /// all recorded stale (`Request::Replace`): the resync loop then
    /// records them (`Client::record_rebuild`) and says so with
    /// [`Damage::rebuild_recorded`].
    pub fn rebuild_pending(&self) -> bool {
        self.server.rebuild_pending()
    }

    /// Every file with blocks on this server is recorded stale: it serves
    /// reads again.
    pub fn rebuild_recorded(&self) -> Result<(), morris_proto::WireError> {
        self.server.rebuild_recorded()
    }

    /// Counts a damaged copy handed to resync (`repaired`), or left as it is
    /// for want of another copy, for `Status`.
    pub fn note_repair(&self, repaired: bool) {
        let c = if repaired {
            &self.server.repairs
        } else {
            &self.server.unrepairable
        };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn io_ctx(context: String) -> impl FnOnce(std::io::Error) -> ServerError {
    move |source| ServerError::Io { context, source }
}

fn lock_dir(cfg: &ServerConfig) -> Result<File, ServerError> {
    let path = cfg.data_dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_ctx(format!("open {}", path.display())))?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let r = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(ServerError::Locked(cfg.data_dir.display().to_string()));
        }
        return Err(ServerError::Io {
            context: format!("lock {}", path.display()),
            source: e,
        });
    }
    Ok(f)
}

/// Makes `dir` reachable by its owner only (0700): it holds every file's
/// data and the metadata; says so when it was open to others.
fn private_dir(dir: &std::path::Path) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(dir).map_err(io_ctx(format!("stat {}", dir.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_ctx(format!("chmod 700 {}", dir.display())))?;
        info!(dir = %dir.display(), was = format!("{mode:o}"), "data directory made private (0700)");
    }
    Ok(())
}

/// Binds the listener, opens the store under `cfg.data_dir` and serves in the
/// background; returns once the server accepts connections.
pub async fn start(cfg: ServerConfig) -> Result<ServerHandle, ServerError> {
    if cfg.lease_ms == 0 {
        return Err(ServerError::Config("lease_ms must be positive".into()));
    }
    if cfg.keys.credential().role() != Role::Server {
        return Err(ServerError::Config(format!(
            "a server needs the volume key; {} holds a client key",
            cfg.keys
                .path()
                .map_or_else(|| "the key given".to_string(), |p| p.display().to_string())
        )));
    }
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(io_ctx(format!("create {}", cfg.data_dir.display())))?;
    private_dir(&cfg.data_dir)?;
    let lock = lock_dir(&cfg)?;
    let db = cfg.data_dir.join("meta.sqlite");
    let block_dir = cfg.data_dir.join("blocks");
    let (store, blocks) = tokio::task::spawn_blocking(move || {
        let store = store::Store::open(&db)?;
        let blocks = blocks::Blocks::open(&block_dir, blocks::DEFAULT_OPEN_FILES)
            .map_err(io_ctx(format!("open {}", block_dir.display())))?;
        blocks.seal_unsealed(&store).map_err(|e| ServerError::Io {
            context: format!("give the data under {} checksums", block_dir.display()),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok::<_, ServerError>((store, blocks))
    })
    .await
    .map_err(|e| ServerError::Io {
        context: "open the data directory".into(),
        source: std::io::Error::other(e.to_string()),
    })??;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: cfg.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: cfg.listen.clone(),
        source,
    })?;
    let formatted = store.formatted();
    let limits = ConnLimits::new(cfg.max_connections);
    let scrubber = Arc::new(scrub::Scrubber::new(
        &cfg.data_dir.join("blocks"),
        cfg.scrub_rate,
    ));
    let server = Arc::new(Server::new(
        Arc::new(store),
        Arc::new(blocks),
        cfg.data_dir.clone(),
        cfg.lease_ms,
        cfg.etcd.clone(),
        cfg.etcd_auth.clone(),
        cfg.keys.clone(),
        limits.clone(),
        scrubber,
    ));
    // A formatted server may have granted leases in a previous life: they
    // must run out (a lease time) before it grants new ones.
    server
        .init_ranges(u64::from(cfg.lease_ms))
        .map_err(|e| ServerError::Config(format!("metadata ranges: {e}")))?;
    server.load_bindings();
    info!(
        %addr,
        data_dir = %cfg.data_dir.display(),
        lease_ms = cfg.lease_ms,
        epoch = server.epoch(),
        volume = ?formatted.as_ref().map(|f| f.descriptor.uuid),
        index = ?formatted.as_ref().map(|f| f.index),
        "stripe server listening"
    );
    let (stop_tx, stop_rx) = oneshot::channel();
    let accept = tokio::spawn(accept_loop(
        listener,
        server.clone(),
        stop_rx,
        lock,
        cfg.keys.clone(),
        limits,
    ));
    let tick_every = Duration::from_millis(u64::from(cfg.lease_ms / 10).clamp(5, 200));
    let ticking = server.clone();
    let ticker = tokio::spawn(async move {
        let mut iv = tokio::time::interval(tick_every);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Cache mode: space limits and read times, once a second, in its
        // own task (an eviction must not delay lease expiry).
        let caching = ticking.clone();
        let _cache = tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_secs(1));
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                iv.tick().await;
                caching.cache_tick().await;
                caching.settle_deletes().await;
            }
        });
        let _stop_cache = AbortOnDrop(_cache);
        // Cache mode II: the write-back of the bindings served here.
        let _push = tokio::spawn(ticking.clone().push_loop());
        let _stop_push = AbortOnDrop(_push);
        // Scrub passes on a schedule, if asked for.
        let _scrub = tokio::spawn(ticking.clone().scrub_schedule(cfg.scrub_every));
        let _stop_scrub = AbortOnDrop(_scrub);
        // Who is over a quota (`service/quotas.rs`).
        let _quota = tokio::spawn(Server::quota_loop(Arc::downgrade(&ticking)));
        let _stop_quota = AbortOnDrop(_quota);
        loop {
            iv.tick().await;
            ticking.tick();
        }
    });
    Ok(ServerHandle {
        addr,
        epoch: server.epoch(),
        server,
        stop: Some(stop_tx),
        accept,
        ticker,
    })
}

/// Starts the server and serves until the process ends (the caller handles
/// ctrl-c, e.g. by racing this future against `tokio::signal::ctrl_c`).
pub async fn run(cfg: ServerConfig) -> Result<(), ServerError> {
    let mut handle = start(cfg).await?;
    // The accept loop only ends when stopped, which nothing here does.
    handle.serve().await;
    Ok(())
}

/// Accepts and serves connections until told to stop; holds the data
/// directory's lock for as long as it runs.
async fn accept_loop(
    listener: TcpListener,
    server: Arc<Server>,
    mut stop: oneshot::Receiver<()>,
    lock: File,
    keys: Keys,
    limits: Arc<ConnLimits>,
) {
    let mut conns = JoinSet::new();
    let mut next_id: u64 = 1;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let id = next_id;
                    next_id += 1;
                    if !limits.admit() {
                        warn!(%peer, "connection refused: too many connections (--max-connections)");
                        continue;
                    }
                    conns.spawn(morris_proto::net::serve_connection(
                        stream,
                        peer,
                        id,
                        server.clone(),
                        keys.clone(),
                        limits.clone(),
                    ));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
    drop(listener);
    drop(lock);
}

/// Aborts a task when dropped (the ticker's helper tasks end with it).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
