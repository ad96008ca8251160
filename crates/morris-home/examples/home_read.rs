//! Reads one whole file from a home, with N reads in flight, and says how
//! fast: what one stripe server's fetch path (`morris-home`) can pull from
//! home. Used by `bench/home.py`; a development tool, not part of morris.
//!
//! ```text
//! home_read URL PATH [--parallel N] [--chunk BYTES] [--timeout SECS] [--no-sum]
//!   URL    nfs://host[:port]/export[/dir][?mountport=N]  or  file:///dir
//!   PATH   the file, below the home's root (a/b/c)
//!   --parallel N   reads in flight, and HomeOptions::parallel (NFS: connections); default 1
//!   --chunk BYTES  bytes per read (default: the home's max_read; at most max_read; a multiple of 8)
//!   --timeout SECS bound of each request (default 30)
//!   --no-sum       do not checksum the data
//! ```
//!
//! Prints one human line on stderr and one JSON line on stdout:
//! `{"bytes":..,"secs":..,"mib_s":..,"open_secs":..,"parallel":..,"chunk":..,"max_read":..,
//! "reads":..,"sum":"..."}`. `secs` runs from the first read to the last
//! reply (the open, mount and lookups are `open_secs`). `sum` is a checksum
//! of the file's bytes that does not depend on the chunk size or the order
//! replies come in: the wrapping sum over the file's little-endian 8-byte
//! words `w_i` (the last one zero-padded) of `mix(w_i ^ i)`, where `mix` is
//! SplitMix64's finaliser. Reading the same file through `file:///` gives
//! the same sum, which is how the benchmark checks the bytes.

use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use morris_home::{Home, HomeHandle, HomeKind, HomeOptions, HomeUrl};

struct Args {
    url: HomeUrl,
    path: String,
    parallel: usize,
    chunk: Option<u32>,
    timeout: Duration,
    sum: bool,
}

const USAGE: &str =
    "usage: home_read URL PATH [--parallel N] [--chunk BYTES] [--timeout SECS] [--no-sum]";

fn parse_args() -> Result<Args, String> {
    let mut pos = Vec::new();
    let mut parallel = 1usize;
    let mut chunk = None;
    let mut timeout = Duration::from_secs(30);
    let mut sum = true;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--parallel" | "-p" => {
                parallel = value(&a)?.parse().map_err(|e| format!("--parallel: {e}"))?;
                if parallel == 0 {
                    return Err("--parallel must be at least 1".into());
                }
            }
            "--chunk" => {
                let c: u32 = value(&a)?.parse().map_err(|e| format!("--chunk: {e}"))?;
                if c == 0 || !c.is_multiple_of(8) {
                    return Err("--chunk must be a positive multiple of 8".into());
                }
                chunk = Some(c);
            }
            "--timeout" => {
                let s: f64 = value(&a)?.parse().map_err(|e| format!("--timeout: {e}"))?;
                if !(s > 0.0 && s.is_finite()) {
                    return Err("--timeout must be a positive number of seconds".into());
                }
                timeout = Duration::from_secs_f64(s);
            }
            "--no-sum" => sum = false,
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ => pos.push(a),
        }
    }
    let [url, path]: [String; 2] = pos
        .try_into()
        .map_err(|_| "expected URL and PATH".to_string())?;
    Ok(Args {
        url: HomeUrl::from_str(&url).map_err(|e| e.to_string())?,
        path,
        parallel,
        chunk,
        timeout,
        sum,
    })
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The checksum's share of `data`, which starts at byte `offset` (a
/// multiple of 8) of the file.
fn sum_at(offset: u64, data: &[u8]) -> u64 {
    let mut i = offset / 8;
    let mut s = 0u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        s = s.wrapping_add(mix(w ^ i));
        i += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        s = s.wrapping_add(mix(u64::from_le_bytes(b) ^ i));
    }
    s
}

/// What the workers did.
#[derive(Default)]
struct Tally {
    bytes: u64,
    reads: u64,
    sum: u64,
}

/// Reads chunks `next`, `next + chunk`, ... until `size`; each chunk whole
/// (asking again after a short reply).
async fn worker(
    home: Arc<dyn Home>,
    file: HomeHandle,
    size: u64,
    chunk: u32,
    next: Arc<AtomicU64>,
    sum: bool,
) -> Result<Tally, String> {
    let mut t = Tally::default();
    loop {
        let off = next.fetch_add(u64::from(chunk), Ordering::Relaxed);
        if off >= size {
            return Ok(t);
        }
        let len = (size - off).min(u64::from(chunk));
        let mut got = 0u64;
        // Replies of one chunk, kept until it is whole only if there are
        // several (the checksum needs 8-byte-aligned pieces).
        let mut pieces = Vec::new();
        while got < len {
            // len - got <= chunk, a u32.
            let r = home
                .read(&file, off + got, (len - got) as u32)
                .await
                .map_err(|e| format!("read at {}: {e}", off + got))?;
            t.reads += 1;
            if r.data.is_empty() {
                return Err(format!(
                    "home returned no bytes at {} of {size} (eof {})",
                    off + got,
                    r.eof
                ));
            }
            got += r.data.len() as u64;
            pieces.push(r.data);
        }
        if got > len {
            return Err(format!("home returned {got} bytes for {len} at {off}"));
        }
        if sum {
            if pieces.len() == 1 {
                t.sum = t.sum.wrapping_add(sum_at(off, &pieces[0]));
            } else {
                let whole: Vec<u8> = pieces.concat();
                t.sum = t.sum.wrapping_add(sum_at(off, &whole));
            }
        }
        t.bytes += len;
    }
}

async fn run(a: Args) -> Result<(), String> {
    let t_open = Instant::now();
    let options = HomeOptions {
        timeout: a.timeout,
        parallel: a.parallel,
        ..HomeOptions::default()
    };
    let home = morris_home::open(&a.url, options)
        .await
        .map_err(|e| format!("opening {}: {e}", a.url))?;
    let (mut handle, mut attr) = home.root().await.map_err(|e| format!("root: {e}"))?;
    for comp in a.path.split('/').filter(|c| !c.is_empty()) {
        (handle, attr) = home
            .lookup(&handle, comp.as_bytes())
            .await
            .map_err(|e| format!("lookup {comp:?}: {e}"))?;
    }
    if attr.kind != HomeKind::File {
        return Err(format!("{} is a {:?}, not a file", a.path, attr.kind));
    }
    let max_read = home.max_read();
    let chunk = a.chunk.unwrap_or(max_read).min(max_read) & !7;
    if chunk == 0 {
        return Err(format!("the home's max_read ({max_read}) is below 8 bytes"));
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    let size = attr.size;
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..a.parallel {
        set.spawn(worker(
            home.clone(),
            handle.clone(),
            size,
            chunk,
            next.clone(),
            a.sum,
        ));
    }
    let mut total = Tally::default();
    while let Some(r) = set.join_next().await {
        let t = r.map_err(|e| format!("a reader task failed: {e}"))??;
        total.bytes += t.bytes;
        total.reads += t.reads;
        total.sum = total.sum.wrapping_add(t.sum);
    }
    let secs = t0.elapsed().as_secs_f64();
    if total.bytes != size {
        return Err(format!("read {} bytes of {size}", total.bytes));
    }
    let mib_s = total.bytes as f64 / f64::from(1u32 << 20) / secs;
    let sum = if a.sum {
        format!("{:016x}", total.sum)
    } else {
        String::new()
    };
    eprintln!(
        "{} bytes in {secs:.3} s = {mib_s:.1} MiB/s ({} reads of up to {chunk} B, {} in flight; open {open_secs:.3} s){}",
        total.bytes,
        total.reads,
        a.parallel,
        if a.sum { format!("; sum {sum}") } else { String::new() },
    );
    println!(
        "{{\"bytes\":{},\"secs\":{secs:.6},\"mib_s\":{mib_s:.3},\"open_secs\":{open_secs:.6},\"parallel\":{},\"chunk\":{chunk},\"max_read\":{max_read},\"reads\":{},\"sum\":\"{sum}\"}}",
        total.bytes, a.parallel, total.reads,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("home_read: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("home_read: {e}");
            ExitCode::FAILURE
        }
    }
}
