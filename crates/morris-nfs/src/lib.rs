//! The morris NFSv3 gateway: serves a volume over NFSv3 (RFC 1813) and
//! MOUNT v3 on one TCP port, through the same `morris_client::Client` a FUSE
//! mount uses.
//!
//! Most procedures are served by the `nfs3_server` crate, whose file-system
//! traits `fs` implements over the client. In front of it, `front` reads
//! every RPC call: it refuses hosts outside `--export-allow`, answers the
//! procedures the crate cannot express itself (`local`: MOUNT MNT and
//! EXPORT, ACCESS, FSSTAT, PATHCONF, MKDIR, REMOVE, RMDIR, LINK, MKNOD),
//! relays the rest to one crate instance per caller credential (so
//! permissions are checked for the real caller) and puts a per-run write
//! verifier into WRITE/COMMIT replies. `export` resolves MOUNT paths against
//! the exports (`/` and `--export`), `cookies` numbers directory entries
//! after `.` and `..`, `files` keeps open files between READ/WRITE calls;
//! `status` maps error classes to NFS status once. See
//! docs/architecture.md ("NFS gateway").

mod cookies;
mod export;
mod files;
mod front;
mod fs;
#[doc(hidden)]
pub mod fuzzing;
mod local;
mod metrics;
mod nlm;
pub mod portmap;
mod status;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use morris_client::Client;

pub use export::{ExportName, ExportNameError};
pub use front::{Cidr, CidrError};
pub use fs::NfsHandle;
pub use status::nfsstat;

/// The port `morris nfs` listens on by default (2049 is the NFS port; one
/// above it needs no privilege clash with a kernel NFS server on the host).
pub const DEFAULT_PORT: u16 = 2050;

/// How long an open file cached between READ/WRITE calls stays open unused.
pub const DEFAULT_OPEN_IDLE: Duration = Duration::from_secs(30);

/// Longest the gateway waits for its open files to close when it stops.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);

/// Errors starting or running the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The volume could not be reached.
    #[error("cannot reach the volume: {0}")]
    Client(#[from] morris_client::Error),
    /// Accepting connections failed.
    #[error("gateway stopped: {0}")]
    Io(#[from] std::io::Error),
    /// The settings are unsafe or contradictory.
    #[error("{0}")]
    Config(String),
    /// The lock recovery state file cannot be used.
    #[error(transparent)]
    NlmState(#[from] nlm::nsm::StateError),
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Address to serve NFS and MOUNT on (`host:port`).
    pub listen: String,
    /// Source networks allowed to use the exports; empty: everyone.
    pub allow: Vec<Cidr>,
    /// The named export, served next to `/` (both are the volume's root).
    pub export: ExportName,
    /// Idle time after which a cached open file is closed.
    pub open_idle: Duration,
    /// Register NFS and MOUNT with the local portmapper (rpcbind) while
    /// serving, when one answers on 127.0.0.1:111.
    pub register: bool,
    /// Calls from uid 0 act as nobody (65534), and group 0 as nobody's
    /// group (NFS `root_squash`).
    pub squash_root: bool,
    /// Only calls from privileged source ports (below 1024) are served
    /// (NFS `secure`): an unprivileged user of an allowed host cannot
    /// speak for another user.
    pub secure: bool,
    /// MKNOD may make character and block device nodes.
    pub allow_devices: bool,
    /// Where the NFS client hosts that hold locks are kept, so that a
    /// restarted gateway tells them to reclaim (`None`: in memory only).
    pub nlm_state: Option<std::path::PathBuf>,
    /// The grace period after a restart in which only reclaims are
    /// granted (at least the servers' lease time and 2 s more).
    pub nlm_grace: Duration,
}

/// The default grace period for lock reclaims after a gateway restart.
pub const DEFAULT_NLM_GRACE: Duration = Duration::from_secs(45);

impl GatewayConfig {
    /// The defaults of `morris nfs` for `listen`: root squashed, privileged
    /// ports only, no device nodes, everyone who can reach `listen` allowed
    /// (which `Gateway::bind` accepts only for a loopback address).
    pub fn new(listen: impl Into<String>) -> Self {
        GatewayConfig {
            listen: listen.into(),
            allow: Vec::new(),
            export: ExportName::default(),
            open_idle: DEFAULT_OPEN_IDLE,
            register: true,
            squash_root: true,
            secure: true,
            allow_devices: false,
            nlm_state: None,
            nlm_grace: DEFAULT_NLM_GRACE,
        }
    }
}

/// A bound, not yet running NFS gateway.
pub struct Gateway {
    front: tokio::net::TcpListener,
    shared: Arc<front::Shared>,
    files: Arc<files::OpenFiles>,
    open_idle: Duration,
    register: bool,
    /// Hosts to tell of the restart, with the new NSM state.
    recovery: Option<(Arc<nlm::nsm::Monitor>, Vec<nlm::nsm::Host>, u32)>,
}

impl Gateway {
    /// Binds the listening socket for `client`'s volume.
    pub async fn bind(client: Arc<Client>, config: GatewayConfig) -> Result<Gateway, GatewayError> {
        let files = Arc::new(files::OpenFiles::new(client.clone(), config.open_idle));
        export::warn_if_shadowed(&client, &config.export).await;
        let nfs = fs::MorrisNfs::new(client.clone(), files.clone()).await?;
        // nfs3_server prefixes handles with a generation number of its own
        // (by default its start time); one fixed per volume keeps handles
        // valid across gateway restarts.
        let uuid = client.descriptor().uuid.as_bytes();
        let mut b = [0u8; 8];
        b.copy_from_slice(&uuid[8..]);
        let generation = u64::from_be_bytes(b);
        let front = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|source| GatewayError::Bind {
                addr: config.listen.clone(),
                source,
            })?;
        let bound = front.local_addr()?;
        if config.allow.is_empty() && !bound.ip().is_loopback() {
            return Err(GatewayError::Config(format!(
                "--listen {} is reachable from other hosts: name the hosts allowed with \
                 --export-allow CIDR,... (0.0.0.0/0,::/0 for everyone)",
                config.listen
            )));
        }
        let grace = config
            .nlm_grace
            .max(client.lease_duration() + Duration::from_secs(2));
        let (monitor, reclaimers, nsm_state) = nlm::nsm::Monitor::start(config.nlm_state, grace)?;
        let monitor = Arc::new(monitor);
        if !reclaimers.is_empty() {
            tracing::info!(
                hosts = reclaimers.len(),
                grace_secs = grace.as_secs(),
                "nfs clients held locks through this gateway before it restarted: telling them to reclaim"
            );
        }
        Ok(Gateway {
            front,
            recovery: Some((monitor.clone(), reclaimers, nsm_state)),
            shared: Arc::new(front::Shared::new(
                nfs,
                generation,
                config.allow,
                config.export,
                front::Policy {
                    squash_root: config.squash_root,
                    secure: config.secure,
                    allow_devices: config.allow_devices,
                },
                monitor,
            )),
            files,
            open_idle: config.open_idle,
            register: config.register,
        })
    }

    /// The address NFS and MOUNT answer on.
    pub fn local_addr(&self) -> Result<SocketAddr, GatewayError> {
        Ok(self.front.local_addr()?)
    }

    /// Serves until `shutdown` completes, then closes every cached open file.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), GatewayError> {
        let port = self.front.local_addr()?.port();
        let registered = self.register && announce(port).await;
        let recovery = self.recovery.take().map(|(monitor, hosts, state)| {
            tokio::spawn(nlm::nsm::notify_all(monitor, hosts, state))
        });
        let files = self.files.clone();
        let period = (self.open_idle / 2).max(Duration::from_millis(100));
        let expiry = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                files.expire().await;
            }
        });
        let result = tokio::select! {
            r = front::accept_loop(self.front, self.shared.clone()) => r.map_err(GatewayError::from),
            () = shutdown => Ok(()),
        };
        expiry.abort();
        if let Some(r) = recovery {
            r.abort();
        }
        if registered {
            if let Err(e) = portmap::unregister(port).await {
                tracing::warn!(error = %e, "removing the portmapper registration failed");
            }
        }
        // An unreachable volume must not keep the gateway from stopping.
        if tokio::time::timeout(SHUTDOWN_LIMIT, self.files.close_all())
            .await
            .is_err()
        {
            tracing::warn!("closing the gateway's open files timed out; unstored sizes are lost");
        }
        result
    }
}

/// Registers with the local portmapper if one runs; true if registered.
/// A failure is logged, not fatal: clients naming the port still work.
async fn announce(port: u16) -> bool {
    match portmap::register(port).await {
        Ok(portmap::Registration::Registered) => {
            tracing::info!(port, "registered nfs v3, mount v3 and the lock programs (nlm v4, nsm v1) with the portmapper");
            true
        }
        Ok(portmap::Registration::NoPortmapper) => {
            tracing::info!("no portmapper on 127.0.0.1:111; clients must name the port");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot register with the portmapper; clients must name the port");
            false
        }
    }
}
