//! The gateway's status monitor (NSM) side of lock recovery: which client
//! hosts locked through it, kept in a file (`--nlm-state`), its NSM state
//! number, the grace period after a restart, and the `SM_NOTIFY` calls
//! that tell those hosts to reclaim their locks.
//!
//! | event | what happens |
//! |---|---|
//! | a host's first lock here | the host (its name, its address, the gateway address it called) is added to the file, written whole (temporary file, fsync, rename) before the lock is answered |
//! | the gateway starts with hosts in the file | its state number goes up (odd: up); a grace period starts in which only reclaims are granted (`DENIED_GRACE_PERIOD` to other LOCKs and to TEST); each host's statd is sent `SM_NOTIFY` (found through the host's portmapper; tried every few seconds until the grace period ends) and the host is taken off the list once told |
//! | a reclaim in the grace period | waits for the lock (the old gateway's hold on it lasts until the servers drop its session, a lease time after it died) until the grace period ends |

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::xdr::{host_state, NSM_PROGRAM, NSM_V1};
use nfs3_types::xdr_codec::{Opaque, Void};

/// How long one `SM_NOTIFY` call may take.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two tries of telling a host.
const NOTIFY_RETRY: Duration = Duration::from_secs(3);

/// A client host that locked through the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Host {
    /// Its name as its lock manager gave it (`caller_name`).
    pub name: String,
    /// The address it called from (where its statd is told).
    pub addr: IpAddr,
    /// The gateway address it called (the name it knows the gateway by).
    pub server: IpAddr,
}

/// What the state file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Persisted {
    /// NSM state number: odd while the gateway runs.
    state: u32,
    hosts: Vec<Host>,
}

/// The status monitor of one gateway.
pub(crate) struct Monitor {
    path: Option<PathBuf>,
    inner: Mutex<Persisted>,
    grace_until: Option<Instant>,
}

/// Errors reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading, writing or renaming it failed.
    #[error("nlm state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// It is not what the gateway writes.
    #[error("nlm state file {path} is damaged ({source}); move it away to start without it")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What did not parse.
        source: serde_json::Error,
    },
}

fn write_whole(path: &Path, p: &Persisted) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(p).map_err(|e| io(std::io::Error::other(e)))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

impl Monitor {
    /// The monitor of a gateway starting now, with its state in `path`
    /// (`None`: kept in memory only, so a restart tells nobody). If hosts
    /// locked through the previous run, a grace period of `grace` starts
    /// and they are returned, to be told ([`notify_all`]), with the new
    /// state number.
    pub(crate) fn start(
        path: Option<PathBuf>,
        grace: Duration,
    ) -> Result<(Monitor, Vec<Host>, u32), StateError> {
        let mut p = Persisted::default();
        let mut existed = false;
        if let Some(path) = &path {
            match std::fs::read(path) {
                Ok(b) => {
                    p = serde_json::from_slice(&b).map_err(|source| StateError::Parse {
                        path: path.clone(),
                        source,
                    })?;
                    existed = true;
                }
                // Written once a host first locks: a gateway nobody locked
                // through leaves nothing behind.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StateError::Io {
                        path: path.clone(),
                        source,
                    })
                }
            }
        }
        // Up again: the next odd number.
        p.state = if p.state % 2 == 1 {
            p.state.wrapping_add(2)
        } else {
            p.state.wrapping_add(1)
        };
        if let Some(path) = path.as_ref().filter(|_| existed) {
            write_whole(path, &p)?;
        }
        let hosts = p.hosts.clone();
        let state = p.state;
        let grace_until = (!hosts.is_empty()).then(|| Instant::now() + grace);
        Ok((
            Monitor {
                path,
                inner: Mutex::new(p),
                grace_until,
            },
            hosts,
            state,
        ))
    }

    /// Whether the grace period after a restart is still on.
    pub(crate) fn in_grace(&self) -> bool {
        self.grace_until.is_some_and(|t| Instant::now() < t)
    }

    /// When the grace period ends (if there is one).
    pub(crate) fn grace_until(&self) -> Option<Instant> {
        self.grace_until
    }

    /// Records `host` as holding locks here, on disk before returning, if
    /// it is new.
    pub(crate) fn note(&self, host: Host) -> Result<(), StateError> {
        let mut p = self.inner.lock();
        if p.hosts.contains(&host) {
            return Ok(());
        }
        p.hosts.push(host);
        match &self.path {
            Some(path) => write_whole(path, &p),
            None => Ok(()),
        }
    }

    /// `host` was told of the restart: off the list.
    fn told(&self, host: &Host) {
        let mut p = self.inner.lock();
        p.hosts.retain(|h| h != host);
        if let Some(path) = &self.path {
            if let Err(e) = write_whole(path, &p) {
                warn!(error = %e, "cannot update the nlm state file");
            }
        }
    }
}

/// Tells every host in `hosts` that the gateway restarted (state `state`),
/// each until it answers or the grace period ends.
pub(crate) async fn notify_all(monitor: Arc<Monitor>, hosts: Vec<Host>, state: u32) {
    let until = monitor
        .grace_until()
        .unwrap_or_else(|| Instant::now() + NOTIFY_RETRY);
    let mut tasks = tokio::task::JoinSet::new();
    for host in hosts {
        let monitor = monitor.clone();
        tasks.spawn(async move {
            loop {
                match sm_notify(&host, state).await {
                    Ok(()) => {
                        info!(host = %host.name, addr = %host.addr, "told an nfs client to reclaim its locks");
                        monitor.told(&host);
                        return;
                    }
                    Err(e) if Instant::now() + NOTIFY_RETRY < until => {
                        debug!(host = %host.name, error = %e, "SM_NOTIFY failed; trying again");
                        tokio::time::sleep(NOTIFY_RETRY).await;
                    }
                    Err(e) => {
                        warn!(host = %host.name, addr = %host.addr, error = %e,
                              "could not tell an nfs client that the gateway restarted; its locks are lost");
                        return;
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One `SM_NOTIFY` to `host`'s statd: "the server `host.server` is up
/// with state `state`".
async fn sm_notify(host: &Host, state: u32) -> Result<(), String> {
    use nfs3_client::nfs3_types::portmap::IPPROTO_TCP;
    use nfs3_client::rpc::RpcClient;
    use nfs3_client::tokio::TokioIo;
    use nfs3_client::PortmapperClient;
    use tokio::net::TcpStream;

    let call = async {
        let pm = TcpStream::connect(SocketAddr::new(host.addr, 111))
            .await
            .map_err(|e| format!("portmapper: {e}"))?;
        let mut pm = PortmapperClient::new(TokioIo::new(pm));
        let port = pm
            .getport(NSM_PROGRAM, NSM_V1, IPPROTO_TCP)
            .await
            .map_err(|e| format!("portmapper: {e}"))?;
        if port == 0 {
            return Err("no statd registered".to_string());
        }
        let s = TcpStream::connect(SocketAddr::new(host.addr, port))
            .await
            .map_err(|e| format!("statd: {e}"))?;
        let mut rpc = RpcClient::new(TokioIo::new(s));
        let args = host_state {
            name: Opaque::owned(host.server.to_string().into_bytes()),
            state,
        };
        rpc.call::<host_state, Void>(NSM_PROGRAM, NSM_V1, super::xdr::nsm_proc::NOTIFY, &args)
            .await
            .map(|_| ())
            .map_err(|e| format!("statd: {e}"))
    };
    match tokio::time::timeout(NOTIFY_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err("no answer".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_keeps_hosts_and_counts_restarts_in_odd_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/nlm.json");
        let (m, hosts, state) = Monitor::start(Some(path.clone()), Duration::from_secs(5)).unwrap();
        assert!(hosts.is_empty());
        assert_eq!(state, 1);
        assert!(!m.in_grace(), "nobody to reclaim: no grace period");
        let h = Host {
            name: "client1".into(),
            addr: "10.0.0.5".parse().unwrap(),
            server: "10.0.0.1".parse().unwrap(),
        };
        m.note(h.clone()).unwrap();
        m.note(h.clone()).unwrap();
        drop(m);
        let (m, hosts, state) = Monitor::start(Some(path.clone()), Duration::from_secs(5)).unwrap();
        assert_eq!(hosts, vec![h.clone()]);
        assert_eq!(state, 3);
        assert!(m.in_grace());
        m.told(&h);
        drop(m);
        let (_, hosts, state) = Monitor::start(Some(path.clone()), Duration::from_secs(5)).unwrap();
        assert!(hosts.is_empty());
        assert_eq!(state, 5);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            Monitor::start(Some(path), Duration::from_secs(5)),
            Err(StateError::Parse { .. })
        ));
    }
}
