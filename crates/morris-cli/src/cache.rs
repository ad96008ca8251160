//! `morris cache`: bind a directory of a volume to a home file system, and
//! look after the cache (status, prefetch, evict).
//!
//! Paths name files and directories inside a `morris mount`; the command
//! finds the mount in `/proc/self/mountinfo`, reads the server address from
//! its source (`morris@HOST:PORT`, or `--server`), connects to the volume
//! as a client of its own and looks the path up from the volume's root.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use morris_client::{Client, ClientConfig, FileKind, Inode, ROOT_ID};
use morris_proto::home::{Binding, CacheMode, OnConflict, OnDisconnect};

use crate::mountinfo;
use crate::runtime;
use crate::size::{human, parse_size};

/// `morris cache ...`
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
    /// A server of the volume (default: from the mount's source,
    /// `morris@HOST:PORT`).
    #[arg(long, global = true, value_name = "HOST:PORT")]
    pub server: Option<String>,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Make an empty directory of a mounted volume a cache of a home file
    /// system (nfs://HOST[:PORT]/EXPORT[/DIR][?mountport=N&nfsport=N] or
    /// file:///PATH), read by the stripe servers on demand.
    Bind(BindArgs),
    /// Show every server's cache counters: home reachable, hits, misses,
    /// bytes fetched, fetch rate, cached bytes, evictions.
    Status(StatusArgs),
    /// Fetch whole files (directories: every file below) into the cache
    /// now, in parallel on every server.
    Prefetch(PathsArgs),
    /// Free the cached data of files (directories: every file below); it
    /// is fetched from home again when next read.
    Evict(PathsArgs),
    /// Remove a binding and everything cached under it (home is not
    /// touched); the directory is an ordinary empty directory again.
    /// A `sw` cache with changes not pushed yet is refused (flush it
    /// first, or `--discard-changes`).
    Unbind(UnbindArgs),
    /// Wait until home has every change made in a cache (`sw`) before
    /// this command started.
    Flush(FlushArgs),
}

/// `morris cache flush`.
#[derive(Debug, Args)]
pub struct FlushArgs {
    /// The bound directory, or any path in it, inside a morris mount.
    pub dir: PathBuf,
    /// Give up after this long (exit status 1).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `morris cache unbind`.
#[derive(Debug, Args)]
pub struct UnbindArgs {
    /// The bound directory inside a morris mount.
    pub dir: PathBuf,
    /// Unbind a `sw` cache even with changes not pushed home yet (they
    /// are lost); without it such an unbind is refused.
    #[arg(long)]
    pub discard_changes: bool,
}

/// `morris cache bind`.
#[derive(Debug, Args)]
pub struct BindArgs {
    /// The directory (empty) inside a morris mount.
    pub dir: PathBuf,
    /// The home: nfs://HOST[:PORT]/EXPORT[/DIR][?mountport=N&nfsport=N] or file:///PATH.
    pub url: String,
    /// ro: read-only cache (changes answer EROFS). sw: single writer,
    /// changes are pushed home after the sync lag. iw: independent
    /// writers, as sw, and home's own changes come into the cache; an
    /// object changed on both sides keeps home's version, the cache's
    /// goes to .conflicts/ at home (or the opposite: --on-conflict
    /// cache). lu: local updates, never pushed.
    #[arg(long, default_value = "ro", value_parser = parse_mode)]
    pub mode: CacheMode,
    /// sw, iw: how long a change waits before it is pushed home (later
    /// changes of the same object within it go with it).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub sync_lag: Duration,
    /// sw, iw, lu: what a change does while home does not answer: local
    /// (made and queued, pushed when home is back) or block (waits until
    /// home answers, as on a hard NFS mount).
    #[arg(long, default_value = "local", value_parser = parse_on_disconnect)]
    pub on_disconnect: OnDisconnect,
    /// sw, iw: whose version of an object changed both in the cache and
    /// at home keeps its path at home: home (the cache's is written to
    /// .conflicts/ at home, the cached object becomes home's) or cache
    /// (home's is copied to .conflicts/, the cache's pushed over it).
    #[arg(long, default_value = "home", value_parser = parse_on_conflict)]
    pub on_conflict: OnConflict,
    /// How long what was checked against home is trusted (e.g. 15s, 500ms;
    /// 0: every open and lookup asks home).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub validity: Duration,
    /// Longest one request to home may take; past it a miss fails with EIO.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Most bytes of home's data to keep (e.g. 100G; 0: no limit); the
    /// least recently read is evicted past it.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub max_bytes: u64,
}

/// `morris cache status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A path inside the mount (default: the current directory).
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `morris cache prefetch` and `evict`.
#[derive(Debug, Args)]
pub struct PathsArgs {
    /// Files or directories inside a morris mount.
    #[arg(required_unless_present = "list")]
    pub paths: Vec<PathBuf>,
    /// A file listing more paths, one per line (AFM's prefetch lists).
    #[arg(long, value_name = "FILE")]
    pub list: Option<PathBuf>,
    /// Units fetched at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub parallel: usize,
}

fn parse_mode(s: &str) -> Result<CacheMode, String> {
    CacheMode::parse(s).ok_or_else(|| format!("{s:?} is not a cache mode (ro, sw, iw, lu)"))
}

fn parse_on_disconnect(s: &str) -> Result<OnDisconnect, String> {
    OnDisconnect::parse(s).ok_or_else(|| format!("{s:?} is not local or block"))
}

fn parse_on_conflict(s: &str) -> Result<OnConflict, String> {
    OnConflict::parse(s).ok_or_else(|| format!("{s:?} is not home or cache"))
}

/// The morris mount holding `path`, the path's components inside it, and
/// the address in the mount's source.
pub(crate) fn locate(path: &Path) -> Result<(PathBuf, Vec<Vec<u8>>, Option<String>)> {
    use std::os::unix::ffi::OsStrExt;
    let abs = mountinfo::absolute(path).with_context(|| format!("bad path {}", path.display()))?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let mount = mountinfo::parse(&text)
        .into_iter()
        .filter(|m| m.fs_type.contains("morris") && abs.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .ok_or_else(|| anyhow!("{} is not inside a morris mount", abs.display()))?;
    let rel = abs.strip_prefix(&mount.mount_point).map_err(|_| {
        anyhow!(
            "{} is not below {}",
            abs.display(),
            mount.mount_point.display()
        )
    })?;
    let parts = rel
        .components()
        .map(|c| c.as_os_str().as_bytes().to_vec())
        .collect();
    let addr = mount.source.strip_prefix("morris@").map(str::to_string);
    Ok((mount.mount_point, parts, addr))
}

async fn resolve(client: &Client, parts: &[Vec<u8>]) -> Result<Inode> {
    let mut cur = client.getattr(ROOT_ID).await?;
    for p in parts {
        cur = client
            .lookup(cur.id, p)
            .await
            .map_err(|e| anyhow!("{}: {e}", String::from_utf8_lossy(p)))?;
    }
    Ok(cur)
}

fn server_of(args: &CacheArgs, found: Option<String>, mp: &Path) -> Result<String> {
    args.server.clone().or(found).ok_or_else(|| {
        anyhow!(
            "cannot tell which server the mount at {} uses (its source is not morris@HOST:PORT): pass --server",
            mp.display()
        )
    })
}

async fn connect(args: &CacheArgs, addr: &str) -> Result<Arc<Client>> {
    let cfg = ClientConfig {
        name: format!("cache@{}", crate::mount::hostname()),
        ..ClientConfig::new(args.key.load()?)
    };
    Client::connect(addr, cfg)
        .await
        .map_err(|e| anyhow!("cannot connect to the volume through {addr}: {e}"))
}

/// Runs `morris cache`.
pub fn run(args: CacheArgs) -> Result<ExitCode> {
    let rt = runtime::build()?;
    rt.block_on(async {
        match &args.command {
            CacheCommand::Bind(b) => bind(&args, b).await,
            CacheCommand::Status(s) => status(&args, s).await,
            CacheCommand::Prefetch(p) => each_file(&args, p, true).await,
            CacheCommand::Evict(p) => each_file(&args, p, false).await,
            CacheCommand::Unbind(u) => unbind(&args, u).await,
            CacheCommand::Flush(f) => flush(&args, f).await,
        }
    })
}

async fn bind(args: &CacheArgs, b: &BindArgs) -> Result<ExitCode> {
    let (mp, parts, found) = locate(&b.dir)?;
    let client = connect(args, &server_of(args, found, &mp)?).await?;
    let dir = resolve(&client, &parts).await?;
    if dir.attr.kind != FileKind::Dir {
        bail!("{} is not a directory", b.dir.display());
    }
    let binding = Binding {
        url: b.url.clone(),
        mode: b.mode,
        validity_ms: u64::try_from(b.validity.as_millis()).unwrap_or(u64::MAX),
        timeout_ms: u64::try_from(b.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        max_bytes: b.max_bytes,
        sync_lag_ms: u64::try_from(b.sync_lag.as_millis()).unwrap_or(u64::MAX),
        on_disconnect: b.on_disconnect,
        on_conflict: b.on_conflict,
    };
    client
        .bind(dir.id, binding)
        .await
        .map_err(|e| anyhow!("binding {} to {}: {e}", b.dir.display(), b.url))?;
    println!(
        "{} now caches {} (mode {}{}, validity {}, timeout {}, max {})",
        b.dir.display(),
        b.url,
        b.mode.name(),
        if matches!(b.mode, CacheMode::Sw | CacheMode::Iw) {
            format!(
                ", sync lag {}, on disconnect {}, on conflict {}",
                humantime::format_duration(b.sync_lag),
                b.on_disconnect.name(),
                b.on_conflict.name()
            )
        } else {
            String::new()
        },
        humantime::format_duration(b.validity),
        humantime::format_duration(b.timeout),
        if b.max_bytes == 0 {
            "unlimited".to_string()
        } else {
            human(b.max_bytes)
        }
    );
    client.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn flush(args: &CacheArgs, f: &FlushArgs) -> Result<ExitCode> {
    let (mp, parts, found) = locate(&f.dir)?;
    let client = connect(args, &server_of(args, found, &mp)?).await?;
    let r = async {
        let ino = resolve(&client, &parts).await?;
        let binding = client
            .binding_of(ino.id)
            .await
            .map_err(|e| anyhow!("{}: {e}", f.dir.display()))?;
        let started = std::time::Instant::now();
        loop {
            let (done, queued, last_error) = client
                .flush_once(binding)
                .await
                .map_err(|e| anyhow!("flushing {}: {e}", f.dir.display()))?;
            if done {
                println!(
                    "{}: home has every change ({:.1} s)",
                    f.dir.display(),
                    started.elapsed().as_secs_f64()
                );
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!(
                "{}: {queued} changed objects still to push{}",
                f.dir.display(),
                last_error
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            );
            if started.elapsed() >= f.timeout {
                eprintln!(
                    "{}: gave up after {}",
                    f.dir.display(),
                    humantime::format_duration(f.timeout)
                );
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    .await;
    client.shutdown().await;
    r
}

async fn unbind(args: &CacheArgs, u: &UnbindArgs) -> Result<ExitCode> {
    let (mp, parts, found) = locate(&u.dir)?;
    let client = connect(args, &server_of(args, found, &mp)?).await?;
    let dir = resolve(&client, &parts).await?;
    let r = client.unbind(dir.id, u.discard_changes).await;
    client.shutdown().await;
    r.map_err(|e| anyhow!("unbinding {}: {e}", u.dir.display()))?;
    println!(
        "{} is no longer a cache (an empty directory)",
        u.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn status(args: &CacheArgs, s: &StatusArgs) -> Result<ExitCode> {
    let addr = match &args.server {
        Some(a) => a.clone(),
        None => {
            let (mp, _, found) = locate(&s.path)?;
            server_of(args, found, &mp)?
        }
    };
    let client = connect(args, &addr).await?;
    let per_server = client.cache_status().await;
    client.shutdown().await;
    if s.json {
        let v: Vec<serde_json::Value> = per_server
            .iter()
            .map(|(i, r)| match r {
                Ok(b) => serde_json::json!({ "server": i, "bindings": b.iter().map(|x| serde_json::json!({
                    "binding": x.binding, "url": x.url, "reachable": x.reachable,
                    "last_error": x.last_error, "hits": x.hits, "misses": x.misses,
                    "fetched_bytes": x.fetched_bytes, "fetch_ms": x.fetch_ms,
                    "meta_requests": x.meta_requests, "evictions": x.evictions,
                    "cached_bytes": x.cached_bytes, "mode": x.mode,
                    "queued": x.queued, "oldest_ms": x.oldest_ms, "dirty_bytes": x.dirty_bytes,
                    "pushed": x.pushed, "pushed_bytes": x.pushed_bytes, "push_ms": x.push_ms,
                    "rounds": x.rounds, "skipped": x.skipped,
                    "conflicts": x.conflicts,
                })).collect::<Vec<_>>() }),
                Err(e) => serde_json::json!({ "server": i, "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<6} {:<9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9}  HOME",
        "SERVER", "HOME-UP", "HITS", "MISSES", "FETCHED", "RATE", "CACHED", "EVICTED"
    );
    let mut failed = false;
    for (i, r) in &per_server {
        match r {
            Ok(list) if list.is_empty() => println!("{i:<6} (no binding used here yet)"),
            Ok(list) => {
                for b in list {
                    let rate = match b.fetched_bytes.saturating_mul(1000).checked_div(b.fetch_ms) {
                        Some(r) => format!("{}/s", human(r)),
                        None => "-".into(),
                    };
                    println!(
                        "{:<6} {:<9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9}  {}{}",
                        i,
                        if b.reachable { "yes" } else { "NO" },
                        b.hits,
                        b.misses,
                        human(b.fetched_bytes),
                        rate,
                        human(b.cached_bytes),
                        b.evictions,
                        b.url,
                        b.last_error
                            .as_ref()
                            .map(|e| format!("  (last error: {e})"))
                            .unwrap_or_default()
                    );
                }
            }
            Err(e) => {
                failed = true;
                println!("{i:<6} down: {e}");
            }
        }
    }
    let writable: Vec<(u32, &morris_proto::BindingStatus)> = per_server
        .iter()
        .filter_map(|(i, r)| r.as_ref().ok().map(|l| (*i, l)))
        .flat_map(|(i, l)| l.iter().filter(|b| b.mode != "ro").map(move |b| (i, b)))
        .collect();
    if !writable.is_empty() {
        println!();
        println!(
            "{:<6} {:<4} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10} {:>7} {:>9}  HOME",
            "SERVER",
            "MODE",
            "QUEUED",
            "DIRTY",
            "OLDEST",
            "PUSHED",
            "PUSHED-B",
            "PUSH-RATE",
            "ROUNDS",
            "CONFLICTS"
        );
        for (i, b) in writable {
            let rate = match b.pushed_bytes.saturating_mul(1000).checked_div(b.push_ms) {
                Some(r) => format!("{}/s", human(r)),
                None => "-".into(),
            };
            println!(
                "{:<6} {:<4} {:>8} {:>10} {:>9} {:>9} {:>10} {:>10} {:>7} {:>9}  {}",
                i,
                b.mode,
                b.queued,
                human(b.dirty_bytes),
                if b.queued == 0 {
                    "-".to_string()
                } else {
                    format!("{:.1}s", b.oldest_ms as f64 / 1000.0)
                },
                b.pushed,
                human(b.pushed_bytes),
                rate,
                b.rounds,
                b.conflicts,
                b.url
            );
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Every regular file at or below `ino`.
async fn files_below(client: &Client, ino: Inode, out: &mut Vec<Inode>) -> Result<()> {
    let mut stack = vec![ino];
    while let Some(i) = stack.pop() {
        match i.attr.kind {
            FileKind::File => out.push(i),
            FileKind::Dir => {
                let mut cookie = 0;
                loop {
                    let (entries, eof) = client.readdir(i.id, cookie, 1024).await?;
                    for e in &entries {
                        if matches!(e.kind, FileKind::File | FileKind::Dir) {
                            stack.push(client.lookup(i.id, &e.name).await?);
                        }
                    }
                    match entries.last() {
                        Some(l) if !eof => cookie = l.cookie,
                        _ => break,
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

async fn each_file(args: &CacheArgs, p: &PathsArgs, prefetch: bool) -> Result<ExitCode> {
    let mut paths = p.paths.clone();
    if let Some(list) = &p.list {
        let text =
            std::fs::read_to_string(list).with_context(|| format!("reading {}", list.display()))?;
        paths.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(PathBuf::from),
        );
    }
    let Some(first) = paths.first() else {
        bail!("no paths");
    };
    let (mp, _, found) = locate(first)?;
    let client = connect(args, &server_of(args, found, &mp)?).await?;
    let mut files = Vec::new();
    for path in &paths {
        let (m, parts, _) = locate(path)?;
        if m != mp {
            bail!(
                "{} is in another mount than {}",
                path.display(),
                first.display()
            );
        }
        let ino = resolve(&client, &parts)
            .await
            .with_context(|| format!("{}", path.display()))?;
        files_below(&client, ino, &mut files).await?;
    }
    // Files made in a writable cache are the cache's own: nothing to fetch
    // or evict.
    files.retain(|f| f.home.as_ref().is_some_and(|l| !l.is_local()));
    let total: u64 = files.iter().map(|f| f.attr.size).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(if prefetch { "prefetch" } else { "evict" });
    let started = std::time::Instant::now();
    let mut moved = 0u64;
    let mut errors = 0;
    for f in &files {
        let r = if prefetch {
            client.prefetch(f.id, p.parallel).await
        } else {
            client.evict(f.id).await
        };
        match r {
            Ok(n) => moved += n,
            Err(e) => {
                errors += 1;
                bar.println(format!("file {}: {e}", f.id));
            }
        }
        bar.inc(f.attr.size);
    }
    bar.finish_and_clear();
    client.shutdown().await;
    let secs = started.elapsed().as_secs_f64();
    if prefetch {
        println!(
            "prefetched {} files ({}): {} fetched from home in {:.1} s ({}/s){}",
            files.len(),
            human(total),
            human(moved),
            secs,
            human((moved as f64 / secs.max(1e-3)) as u64),
            if errors > 0 {
                format!(", {errors} failed")
            } else {
                String::new()
            }
        );
    } else {
        println!("evicted {} files: {} freed", files.len(), human(moved));
    }
    Ok(if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
