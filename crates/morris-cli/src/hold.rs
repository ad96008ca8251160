//! The life of a mount process's mount, shared by `morris mount` and
//! `morris up`: serve it until the kernel ends its FUSE session (unmounted
//! from outside), or until a signal asks to unmount it.
//!
//! The process owns exactly its own mount ([`MountGuard`]): it never acts
//! on whatever else is mounted at the same path, and it learns that its
//! mount is gone from the kernel (the session ends), not from the path.
//!
//! * SIGINT/SIGTERM: unmount; while the kernel says busy, retry every tick,
//!   saying why (requests in flight, or which processes use it); a second
//!   signal detaches it lazily. A signal while the mount is detached (files
//!   still open on it) ends the session at once.
//! * Unmounted or detached from outside: the process goes on while the kernel
//!   still uses the session for open files (a lazy unmount), and ends it
//!   when nothing uses it any more although the kernel keeps it (copies of
//!   the mount in other mount namespaces).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use morris_client::Client;
use morris_fuse::{MountGuard, MountOptions, MountState, UnmountError};
use tokio::runtime::Runtime;
use tracing::{info, warn};

use crate::runtime::Terminate;

/// How often the mount is looked at (and `tick` runs).
const TICK: Duration = Duration::from_millis(250);

/// How often the processes using a busy or detached mount are looked up.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Scans in a row that must find a detached mount unused before its
/// session is ended.
const IDLE_SCANS: u32 = 2;

/// Mounts `client` at `mp`.
pub fn start(
    rt: &Runtime,
    client: Arc<Client>,
    mp: &std::path::Path,
    opts: &MountOptions,
) -> Result<MountGuard> {
    morris_fuse::mount(client, rt.handle().clone(), mp, opts)
        .with_context(|| format!("cannot mount on {}", mp.display()))
}

/// What `hold` is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Serving; nobody asked to stop.
    Serving,
    /// A signal asked to unmount; retried until the kernel lets go.
    Unmounting { lazy: bool },
    /// Gone from this mount namespace; the kernel still uses the session.
    Detached { idle_scans: u32 },
}

enum Event {
    Ended,
    Signal(&'static str),
    Tick,
}

/// Says things once: a message is logged again only when it changes.
#[derive(Default)]
struct Said {
    last: Option<String>,
    scanned: Option<Instant>,
}

impl Said {
    /// True if it is time to look up the processes using the mount again.
    fn scan_due(&mut self) -> bool {
        let due = self.scanned.is_none_or(|t| t.elapsed() >= SCAN_EVERY);
        if due {
            self.scanned = Some(Instant::now());
        }
        due
    }

    /// Whether `msg` is new (and remembers it).
    fn fresh(&mut self, msg: &str) -> bool {
        if self.last.as_deref() == Some(msg) {
            return false;
        }
        self.last = Some(msg.to_string());
        true
    }
}

/// Why a busy mount is busy, in words.
fn busy_reason(guard: &MountGuard, in_flight: usize) -> String {
    let holders = guard.holders();
    if in_flight > 0 {
        format!(
            "{in_flight} FUSE requests in flight (a process waiting for an answer keeps the \
             mount busy even after it was killed; a server may be slow or down); {holders}"
        )
    } else {
        holders.to_string()
    }
}

/// Tries to unmount; says why not.
fn attempt(guard: &MountGuard, lazy: bool, said: &mut Said) {
    let mp = guard.mountpoint();
    match guard.unmount(lazy) {
        Ok(()) => {}
        Err(UnmountError::Busy { in_flight, .. }) => {
            if !said.scan_due() && said.last.is_some() {
                return;
            }
            let reason = busy_reason(guard, in_flight);
            if said.fresh(&reason) {
                warn!(
                    mountpoint = %mp.display(),
                    in_flight,
                    "{} is busy: {reason}; it is unmounted as soon as the kernel lets go \
                     (signal again to detach it lazily now)",
                    mp.display()
                );
            }
        }
        Err(e) => {
            let msg = e.to_string();
            if said.fresh(&msg) {
                warn!(mountpoint = %mp.display(), error = %msg, "cannot unmount; signal again to end the FUSE session");
            }
        }
    }
}

/// Serves the mount until its FUSE session ends or a signal asks to stop
/// (see the module documentation). `tick` runs about four times a second.
pub fn hold(
    rt: &Runtime,
    term: &mut Terminate,
    guard: MountGuard,
    mut tick: impl FnMut(),
) -> Result<()> {
    let mp = guard.mountpoint().to_path_buf();
    let mut phase = Phase::Serving;
    let mut said = Said::default();
    let ended = loop {
        let ev = rt.block_on(async {
            tokio::select! {
                biased;
                () = guard.ended() => Event::Ended,
                sig = term.recv() => Event::Signal(sig),
                () = tokio::time::sleep(TICK) => Event::Tick,
            }
        });
        match ev {
            Event::Ended => break true,
            Event::Signal(sig) => match (phase, guard.state()) {
                (_, MountState::Ended) => break true,
                // Detached already (from outside, or by a lazy unmount):
                // what is left is files still open on it.
                (_, MountState::Detached) | (Phase::Unmounting { lazy: true }, _) => {
                    warn!(signal = sig, mountpoint = %mp.display(), "ending the FUSE session now: files still open on the detached mount fail from now on");
                    break false;
                }
                (Phase::Serving | Phase::Detached { .. }, MountState::Mounted) => {
                    info!(signal = sig, mountpoint = %mp.display(), "unmounting");
                    phase = Phase::Unmounting { lazy: false };
                    attempt(&guard, false, &mut said);
                }
                (Phase::Unmounting { lazy: false }, MountState::Mounted) => {
                    info!(signal = sig, mountpoint = %mp.display(), "detaching lazily: the mount goes away when the last file on it is closed");
                    phase = Phase::Unmounting { lazy: true };
                    said = Said::default();
                    attempt(&guard, true, &mut said);
                }
            },
            Event::Tick => {
                tick();
                match guard.state() {
                    MountState::Ended => break true,
                    MountState::Mounted => {
                        if let Phase::Unmounting { lazy } = phase {
                            attempt(&guard, lazy, &mut said);
                        }
                    }
                    MountState::Detached => {
                        if phase == Phase::Serving {
                            info!(mountpoint = %mp.display(), "unmounted from outside; the kernel still uses the FUSE session");
                        }
                        let idle = match phase {
                            Phase::Detached { idle_scans } => idle_scans,
                            _ => {
                                said = Said::default();
                                0
                            }
                        };
                        phase = Phase::Detached { idle_scans: idle };
                        if !said.scan_due() {
                            continue;
                        }
                        let in_flight = guard.requests_in_flight();
                        let holders = guard.holders();
                        if in_flight == 0 && holders.none() {
                            if idle + 1 >= IDLE_SCANS {
                                info!(
                                    mountpoint = %mp.display(),
                                    "{} is unmounted here and nothing uses it, but the kernel \
                                     keeps its FUSE session: copies of the mount remain in other \
                                     mount namespaces (made while it was mounted, e.g. by unshare \
                                     or a service with a private /tmp); ending the session (those \
                                     copies fail with ENOTCONN from now on)",
                                    mp.display()
                                );
                                break false;
                            }
                            phase = Phase::Detached {
                                idle_scans: idle + 1,
                            };
                        } else {
                            phase = Phase::Detached { idle_scans: 0 };
                            let msg = format!(
                                "{} is detached but still in use: {}; serving it until they \
                                 are done (signal to end it now)",
                                mp.display(),
                                if in_flight > 0 {
                                    format!("{in_flight} requests in flight; {holders}")
                                } else {
                                    holders.to_string()
                                }
                            );
                            if said.fresh(&msg) {
                                info!(mountpoint = %mp.display(), in_flight, "{msg}");
                            }
                        }
                    }
                }
            }
        }
    };
    if ended {
        info!(mountpoint = %mp.display(), "unmounted");
        return guard
            .join()
            .with_context(|| format!("FUSE session on {} ended with an error", mp.display()));
    }
    end_now(guard);
    Ok(())
}

/// Ends the session without waiting for what still uses it.
fn end_now(guard: MountGuard) {
    let mp = guard.mountpoint().to_path_buf();
    match guard.abort() {
        Ok(()) => {
            if guard.wait_ended(Duration::from_secs(2)) {
                if let Err(e) = guard.join() {
                    warn!(mountpoint = %mp.display(), error = %e, "FUSE session ended with an error");
                }
                return;
            }
        }
        Err(e) => {
            tracing::debug!(mountpoint = %mp.display(), error = %e, "no FUSE control file system; the session ends with the process")
        }
    }
    guard.abandon();
}

/// Writes back and releases everything the client holds, within a bound;
/// a signal cuts it short.
pub fn shutdown_client(rt: &Runtime, client: &Client, term: &mut Terminate) {
    rt.block_on(async {
        tokio::select! {
            done = tokio::time::timeout(Duration::from_secs(60), client.shutdown()) => {
                if done.is_err() {
                    warn!("client shutdown did not finish within 60 s; exiting anyway");
                }
            }
            sig = term.recv() => {
                warn!(signal = sig, "client shutdown cut short: leases this client holds expire on the servers by themselves");
            }
        }
    });
}

/// Connects a client to the volume through `addr`, giving up on a signal.
pub async fn connect(
    term: &mut Terminate,
    addr: &str,
    cfg: morris_client::ClientConfig,
) -> Result<Arc<Client>> {
    tokio::select! {
        r = Client::connect(addr, cfg) => {
            r.map_err(|e| anyhow!("cannot connect to the volume through {addr}: {e}"))
        }
        sig = term.recv() => Err(anyhow!("{sig} while connecting to {addr}")),
    }
}
