//! `morris mount`: a FUSE mount of a volume, in the foreground or as a daemon
//! (its lifecycle, shared with `morris up`, is in `hold`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use morris_client::{Atime, ClientConfig, Keys};
use morris_fuse::MountOptions;
use tracing::info;

use crate::daemon::{self, Notifier};
use crate::hold::{self, connect, shutdown_client};
use crate::mountinfo;
use crate::runtime::{self, Terminate};
use crate::size::parse_size;

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
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// Tunables of a mount, shared with `morris up`.
#[derive(Debug, Clone, Args)]
pub struct MountTuning {
    /// FUSE request threads (default: the FUSE adapter's default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Worker threads of the mount's async runtime: it reads the servers'
    /// replies, finishes requests that had to wait for one, and runs
    /// background work (write-behind, lease renewals); a request answered
    /// at once never leaves its FUSE thread (default: one per CPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub runtime_threads: Option<u64>,
    /// Only the mounting user may access the mount (by default every user may,
    /// which needs root or `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub no_allow_other: bool,
    /// File system name shown by mount(8) and df(1) (default: the FUSE adapter's).
    #[arg(long, value_name = "NAME")]
    pub fsname: Option<String>,
    /// How long the kernel may cache attributes, in milliseconds (default:
    /// the volume's lease time; other clients' changes invalidate sooner).
    /// Names the kernel keeps while the client's directory lease protects
    /// them (Linux 6.16 and later; before, it asks the client each time).
    #[arg(long, value_name = "MS")]
    pub attr_ttl_ms: Option<u64>,
    /// List directories without attributes (plain `READDIR`): a program
    /// that lists without looking at what it lists (`find -name`) then
    /// takes no leases for it, but `ls -l`, `du` and the like look each
    /// name up one at a time.
    #[arg(long)]
    pub no_readdirplus: bool,
    /// Largest readahead window per open file (e.g. 64M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub readahead: Option<u64>,
    /// Most leases (locks) kept cached before the least recently used are given back.
    #[arg(long, value_name = "N")]
    pub max_leases: Option<usize>,
    /// Mount read-only: every change is refused (EROFS) by the kernel.
    /// `mount -o remount,rw` (or `,ro`) changes it later.
    #[arg(long)]
    pub read_only: bool,
    /// Honour set-user-ID and set-group-ID bits of programs run from the
    /// mount (default: ignored, `nosuid`). Only root may mount so.
    #[arg(long)]
    pub suid: bool,
    /// Let device nodes on the mount be opened as devices (default: not,
    /// `nodev`). Only root may mount so.
    #[arg(long)]
    pub dev: bool,
    /// Never update access times (default: `relatime`, as Linux: a read
    /// moves the access time when it is not later than the last change,
    /// or is a day old).
    #[arg(long, conflicts_with = "strictatime")]
    pub noatime: bool,
    /// Update access times on every read (at most once a second per file
    /// and mount; each update is a request to the file's server).
    #[arg(long)]
    pub strictatime: bool,
    /// Answer a create, unlink or rmdir only once the directory's server
    /// has stored the entry's change (default: a create and a removal at
    /// once, a create with a file id set aside ahead; the change follows at once, and
    /// `fsync` of the file or directory, another mount's look, and the
    /// unmount wait for it; a mount killed in between loses it).
    #[arg(long)]
    pub sync_names: bool,
    /// Append a line per FUSE request (time, caller, operation, inode,
    /// result, seconds taken) to FILE; `morris profile FILE` sums it up.
    #[arg(long, value_name = "FILE")]
    pub access_log: Option<PathBuf>,
}

impl MountTuning {
    /// The client configuration these options ask for.
    pub fn client_config(&self, name: String, keys: Keys) -> ClientConfig {
        let mut c = ClientConfig::new(keys);
        if let Some(r) = self.readahead {
            c.readahead_max = r;
        }
        if let Some(n) = self.max_leases {
            c.max_cached_leases = n;
        }
        c.atime = if self.noatime || self.read_only {
            Atime::Never
        } else if self.strictatime {
            Atime::Strict
        } else {
            Atime::Relative
        };
        c.name = name;
        // A mount keeps attribute changes with the size (`behind.rs`).
        c.attrs_behind = true;
        c.names_behind = !self.sync_names;
        c
    }

    /// The FUSE mount options these options ask for, for a volume reached
    /// through `addr` (the default file system name is `morris@ADDR`, which
    /// `morris cache` reads back from the mount table).
    pub fn mount_options(&self, addr: &str) -> MountOptions {
        let mut o = MountOptions::default();
        if let Some(t) = self.threads {
            o.threads = t as usize;
        }
        match &self.fsname {
            Some(n) => o.fsname = n.clone(),
            None if !addr.contains([',', '\0']) => o.fsname = format!("morris@{addr}"),
            None => {}
        }
        if let Some(ms) = self.attr_ttl_ms {
            o.attr_ttl = Some(Duration::from_millis(ms));
        }
        o.allow_other = !self.no_allow_other;
        o.read_only = self.read_only;
        o.suid = self.suid;
        o.dev = self.dev;
        o.noatime = self.noatime;
        o.strictatime = self.strictatime;
        o.access_log.clone_from(&self.access_log);
        o.readdirplus = !self.no_readdirplus;
        o
    }

    /// Fails early, with the fix, when `allow_other` cannot work for this user.
    pub fn check_permissions(&self) -> Result<()> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if (self.suid || self.dev) && !root {
            bail!("--suid and --dev need root (the fusermount3 helper always mounts nosuid,nodev)");
        }
        if self.no_allow_other || root {
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

/// Connects, mounts, reports readiness, serves until stopped.
fn serve(args: &MountArgs, keys: Keys, mp: &Path, notifier: &mut Option<Notifier>) -> Result<()> {
    let rt = runtime::build_mount(args.tuning.runtime_threads.map(|n| n as usize))?;
    let mut term = {
        let _enter = rt.enter();
        Terminate::install()?
    };
    let name = format!("mount@{}:{}", hostname(), mp.display());
    let cfg = args.tuning.client_config(name, keys);
    let exporter = rt.block_on(crate::exporter::maybe_start(
        args.metrics.as_deref(),
        "mount",
    ))?;
    let client = rt.block_on(connect(&mut term, &args.addr, cfg))?;
    if let Some(x) = &exporter {
        crate::exporter::scrape_client(x, &client);
    }
    let guard = match hold::start(
        &rt,
        client.clone(),
        mp,
        &args.tuning.mount_options(&args.addr),
    ) {
        Ok(g) => g,
        Err(e) => {
            shutdown_client(&rt, &client, &mut term);
            return Err(e);
        }
    };
    let _note = exporter
        .as_ref()
        .and_then(|x| crate::exporter::note_mount(guard.device(), mp, x));
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
    let held = hold::hold(&rt, &mut term, guard, || {});
    shutdown_client(&rt, &client, &mut term);
    rt.shutdown_timeout(Duration::from_secs(5));
    held
}

/// Runs `morris mount`. `log_default` is the log filter when `RUST_LOG` is unset.
pub fn run(mut args: MountArgs, log_default: &str) -> Result<ExitCode> {
    let mp = prepare_mountpoint(&args.mountpoint)?;
    // Absolute: a background mount leaves the working directory.
    if let Some(p) = &args.tuning.access_log {
        let abs = mountinfo::absolute(p).with_context(|| format!("bad path {}", p.display()))?;
        args.tuning.access_log = Some(abs);
    }
    args.tuning.check_permissions()?;
    // Read before a daemon leaves the working directory.
    let keys = args.key.load()?;
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
    let result = serve(&args, keys, &mp, &mut notifier);
    if let (Err(e), Some(n)) = (&result, notifier.take()) {
        n.failed(&format!("{e:#}"));
    }
    result.map(|()| ExitCode::SUCCESS)
}
