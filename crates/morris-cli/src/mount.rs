//! `morris mount`: a FUSE mount of a volume, in the foreground or as a daemon;
//! and the mount lifecycle `morris up` shares.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use morris_client::{Client, ClientConfig};
use morris_fuse::{MountGuard, MountOptions};
use tokio::runtime::Runtime;
use tracing::{info, warn};

use crate::daemon::{self, Notifier};
use crate::mountinfo;
use crate::runtime::{self, Terminate};
use crate::size::parse_size;
use crate::umount::{self, UnmountError};

/// Arguments of `morris mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// Address HOST:PORT of any server of the volume.
    pub addr: String,
    /// Existing directory to mount the volume on.
    pub mountpoint: PathBuf,
    /// Detach and run as a daemon; returns once the mount is up (exit 0) or failed (exit 1).
    #[arg(long)]
    pub background: bool,
    /// With --background: append the daemon's log to FILE (default: discard it).
    #[arg(long, value_name = "FILE", requires = "background")]
    pub log: Option<PathBuf>,
    #[command(flatten)]
    pub tuning: MountTuning,
}

/// Tunables of a mount, shared with `morris up`.
#[derive(Debug, Clone, Args)]
pub struct MountTuning {
    /// FUSE request threads (default: the FUSE adapter's default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Only the mounting user may access the mount (by default every user may,
    /// which needs root or `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub no_allow_other: bool,
    /// File system name shown by mount(8) and df(1) (default: the FUSE adapter's).
    #[arg(long, value_name = "NAME")]
    pub fsname: Option<String>,
    /// How long the kernel may cache attributes and names, in milliseconds
    /// (default: the volume's lease time; other clients' changes invalidate sooner).
    #[arg(long, value_name = "MS")]
    pub attr_ttl_ms: Option<u64>,
    /// Largest readahead window per open file (e.g. 64M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub readahead: Option<u64>,
    /// Most leases (locks) kept cached before the least recently used are given back.
    #[arg(long, value_name = "N")]
    pub max_leases: Option<usize>,
}

impl MountTuning {
    /// The client configuration these options ask for.
    pub fn client_config(&self, name: String) -> ClientConfig {
        let mut c = ClientConfig::default();
        if let Some(r) = self.readahead {
            c.readahead_max = r;
        }
        if let Some(n) = self.max_leases {
            c.max_cached_leases = n;
        }
        c.name = name;
        c
    }

    /// The FUSE mount options these options ask for.
    pub fn mount_options(&self) -> MountOptions {
        let mut o = MountOptions::default();
        if let Some(t) = self.threads {
            o.threads = t as usize;
        }
        if let Some(n) = &self.fsname {
            o.fsname = n.clone();
        }
        if let Some(ms) = self.attr_ttl_ms {
            o.attr_ttl = Some(Duration::from_millis(ms));
        }
        o.allow_other = !self.no_allow_other;
        o
    }

    /// Fails early, with the fix, when `allow_other` cannot work for this user.
    pub fn check_permissions(&self) -> Result<()> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if self.no_allow_other || unsafe { libc::geteuid() } == 0 {
            return Ok(());
        }
        let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
        if conf.lines().any(|l| l.trim() == "user_allow_other") {
            return Ok(());
        }
        bail!(
            "mounting for all users (the default) as a non-root user needs the line \
             `user_allow_other` in /etc/fuse.conf (scripts/setup.sh adds it); \
             or pass --no-allow-other"
        )
    }
}

/// Checks `p` can be mounted on and returns it absolute.
pub fn prepare_mountpoint(p: &Path) -> Result<PathBuf> {
    let mp = mountinfo::absolute(p).with_context(|| format!("bad path {}", p.display()))?;
    match std::fs::metadata(&mp) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mount point {} is not a directory", mp.display()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{} is a dead mount (its mount process is gone); run `morris umount {}` first",
            mp.display(),
            mp.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("mount point {} does not exist", mp.display())
        }
        Err(e) => bail!("cannot use mount point {}: {e}", mp.display()),
    }
    if let Some(m) = mountinfo::find(&mp).context("cannot read the mount table")? {
        bail!(
            "{} is already mounted ({} from {})",
            mp.display(),
            m.fs_type,
            m.source
        );
    }
    Ok(mp)
}

/// This machine's name, for client names in server logs.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // when the name fits, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn is_mounted(mp: &Path) -> bool {
    matches!(mountinfo::find(mp), Ok(Some(_)))
}

/// Mounts `client` at `mp` and waits until the kernel lists the mount.
pub fn start(
    rt: &Runtime,
    client: Arc<Client>,
    mp: &Path,
    opts: &MountOptions,
) -> Result<MountGuard> {
    let guard = morris_fuse::mount(client, rt.handle().clone(), mp, opts)
        .with_context(|| format!("cannot mount on {}", mp.display()))?;
    let start = Instant::now();
    while !is_mounted(mp) {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = guard.unmount();
            bail!(
                "the mount on {} did not appear in the mount table",
                mp.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(guard)
}

enum Event {
    Signal(&'static str),
    Tick,
}

/// Serves the mount until it is unmounted from outside or a signal arrives
/// (then unmounts it: a busy mount is reported and detached lazily on the
/// next signal). `tick` runs every half second.
pub fn hold(
    rt: &Runtime,
    term: &mut Terminate,
    guard: MountGuard,
    mp: &Path,
    mut tick: impl FnMut(),
) -> Result<()> {
    let mut lazy = false;
    loop {
        let ev = rt.block_on(async {
            tokio::select! {
                sig = term.recv() => Event::Signal(sig),
                _ = tokio::time::sleep(Duration::from_millis(500)) => Event::Tick,
            }
        });
        match ev {
            Event::Tick => {
                tick();
                if !is_mounted(mp) {
                    info!(mountpoint = %mp.display(), "unmounted from outside");
                    break;
                }
            }
            Event::Signal(sig) => {
                info!(signal = sig, mountpoint = %mp.display(), lazy, "unmounting");
                match umount::unmount(mp, lazy) {
                    Ok(()) | Err(UnmountError::NotMounted) => break,
                    Err(UnmountError::Busy) => {
                        warn!(
                            mountpoint = %mp.display(),
                            "mount is busy (files are open); close them, or signal again \
                             to detach it lazily"
                        );
                        lazy = true;
                    }
                    Err(UnmountError::Other(e)) => {
                        warn!(error = %format!("{e:#}"), "unmount failed; stopping the FUSE session");
                        return guard.unmount();
                    }
                }
            }
        }
    }
    // The kernel has let go (or will, once open files close, after a lazy
    // unmount); wait for the FUSE session to end, unless told to stop now.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("morris-unmount".into())
        .spawn(move || {
            let _ = tx.send(guard.join());
        })
        .context("cannot start a thread")?;
    rt.block_on(async {
        tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(anyhow!("the FUSE session thread vanished"))),
            sig = term.recv() => Err(anyhow!(
                "{sig} while waiting for open files on {} to close; exiting anyway",
                mp.display()
            )),
        }
    })
}

/// Writes back and releases everything the client holds, within a bound.
pub fn shutdown_client(rt: &Runtime, client: &Client) {
    let done = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), client.shutdown()).await });
    if done.is_err() {
        warn!("client shutdown did not finish within 60 s; exiting anyway");
    }
}

/// Connects a client to the volume through `addr`, giving up on a signal.
pub async fn connect(term: &mut Terminate, addr: &str, cfg: ClientConfig) -> Result<Arc<Client>> {
    tokio::select! {
        r = Client::connect(addr, cfg) => {
            r.map_err(|e| anyhow!("cannot connect to the volume through {addr}: {e}"))
        }
        sig = term.recv() => Err(anyhow!("{sig} while connecting to {addr}")),
    }
}

/// Connects, mounts, reports readiness, serves until stopped.
fn serve(args: &MountArgs, mp: &Path, notifier: &mut Option<Notifier>) -> Result<()> {
    let rt = runtime::build()?;
    let mut term = {
        let _enter = rt.enter();
        Terminate::install()?
    };
    let name = format!("mount@{}:{}", hostname(), mp.display());
    let cfg = args.tuning.client_config(name);
    let client = rt.block_on(connect(&mut term, &args.addr, cfg))?;
    let guard = match start(&rt, client.clone(), mp, &args.tuning.mount_options()) {
        Ok(g) => g,
        Err(e) => {
            shutdown_client(&rt, &client);
            return Err(e);
        }
    };
    let volume = client.descriptor().uuid;
    info!(addr = %args.addr, mountpoint = %mp.display(), %volume, "mounted");
    let msg = format!(
        "mounted volume {volume} from {} at {} (pid {})",
        args.addr,
        mp.display(),
        std::process::id()
    );
    match notifier.take() {
        Some(n) => n.ready(&msg),
        None => println!("{msg}"),
    }
    let held = hold(&rt, &mut term, guard, mp, || {});
    shutdown_client(&rt, &client);
    rt.shutdown_timeout(Duration::from_secs(5));
    held
}

/// Runs `morris mount`. `log_default` is the log filter when `RUST_LOG` is unset.
pub fn run(args: MountArgs, log_default: &str) -> Result<ExitCode> {
    let mp = prepare_mountpoint(&args.mountpoint)?;
    args.tuning.check_permissions()?;
    let mut notifier = None;
    if args.background {
        let log = match &args.log {
            Some(l) => {
                Some(mountinfo::absolute(l).with_context(|| format!("bad path {}", l.display()))?)
            }
            None => None,
        };
        notifier = Some(daemon::daemonize(log.as_deref())?);
        crate::init_logging(log_default);
    }
    let result = serve(&args, &mp, &mut notifier);
    if let (Err(e), Some(n)) = (&result, notifier.take()) {
        n.failed(&format!("{e:#}"));
    }
    result.map(|()| ExitCode::SUCCESS)
}
