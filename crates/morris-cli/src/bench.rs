//! `morris bench`: a quick throughput check of any directory (a morris mount,
//! or a local disk beside it for comparison), in the spirit of `juicefs bench`.
//! The full side-by-side benchmark lives in `bench/throughput.py`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::progress::{plain_lines, Units};

use crate::size::parse_size;

/// Arguments of `morris bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Directory to benchmark (a scratch subdirectory is made and removed).
    pub dir: PathBuf,
    /// Size of the big file written and read sequentially.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub big_size: u64,
    /// Number of small files.
    #[arg(long, default_value_t = 1000)]
    pub small_files: u32,
    /// Size of each small file.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub small_size: u64,
    /// I/O size of each read and write call.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub block: u64,
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::new(len)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template("{msg:<18} [{bar:30}] {percent:>3}% {eta}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// Drops the kernel's cached pages of `f` so the next read goes to the file system.
fn drop_cache(f: &File) {
    // SAFETY: posix_fadvise only reads its integer arguments.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

fn big_file(dir: &Path, size: u64, block: usize) -> Result<(f64, f64)> {
    let path = dir.join("big");
    let buf: Vec<u8> = (0..block).map(|i| (i * 7 + 3) as u8).collect();
    let pb = bar(size, "big file write");
    let _plain = plain_lines(&pb, "big file write", Units::Bytes);
    let t = Instant::now();
    let mut f = File::create(&path).with_context(|| format!("create {}", path.display()))?;
    let mut left = size;
    while left > 0 {
        let n = left.min(block as u64) as usize;
        f.write_all(&buf[..n]).context("write")?;
        left -= n as u64;
        pb.inc(n as u64);
    }
    f.sync_all().context("fsync")?;
    drop(f);
    let write = size as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let mut f = File::open(&path)?;
    drop_cache(&f);
    let pb = bar(size, "big file read");
    let _plain = plain_lines(&pb, "big file read", Units::Bytes);
    let mut rbuf = vec![0u8; block];
    let t = Instant::now();
    let mut total = 0u64;
    loop {
        let n = f.read(&mut rbuf).context("read")?;
        if n == 0 {
            break;
        }
        total += n as u64;
        pb.inc(n as u64);
    }
    let read = total as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    if total != size {
        bail!("read {total} bytes back, wrote {size}");
    }
    fs::remove_file(&path)?;
    Ok((write, read))
}

fn small_files(dir: &Path, n: u32, size: u64) -> Result<[f64; 4]> {
    let d = dir.join("small");
    fs::create_dir(&d)?;
    let data = vec![0x5au8; size as usize];
    let names: Vec<PathBuf> = (0..n).map(|i| d.join(format!("f{i:07}"))).collect();
    let rate = |t: Instant| f64::from(n) / t.elapsed().as_secs_f64();
    let pb = bar(u64::from(n), "small file write");
    let _plain = plain_lines(&pb, "small file write", Units::Count);
    let t = Instant::now();
    for p in &names {
        let mut f = OpenOptions::new().write(true).create_new(true).open(p)?;
        f.write_all(&data)?;
        pb.inc(1);
    }
    let w = rate(t);
    pb.finish_and_clear();
    let pb = bar(u64::from(n), "small file read");
    let _plain = plain_lines(&pb, "small file read", Units::Count);
    let mut buf = Vec::with_capacity(size as usize);
    let t = Instant::now();
    for p in &names {
        let mut f = File::open(p)?;
        drop_cache(&f);
        buf.clear();
        f.read_to_end(&mut buf)?;
        if buf.len() as u64 != size {
            bail!("{} has {} bytes, wrote {size}", p.display(), buf.len());
        }
        pb.inc(1);
    }
    let r = rate(t);
    pb.finish_and_clear();
    let t = Instant::now();
    for p in &names {
        fs::metadata(p)?;
    }
    let s = rate(t);
    let t = Instant::now();
    for p in &names {
        fs::remove_file(p)?;
    }
    let del = rate(t);
    fs::remove_dir(&d)?;
    Ok([w, r, s, del])
}

/// Runs `morris bench`.
pub fn run(a: BenchArgs) -> Result<ExitCode> {
    if a.block == 0 || a.block > (64 << 20) {
        bail!("--block must be between 1 byte and 64 MiB");
    }
    let scratch = a.dir.join(format!(".morris-bench-{}", std::process::id()));
    fs::create_dir(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let result = (|| {
        let (w, r) = big_file(&scratch, a.big_size, a.block as usize)?;
        let small = small_files(&scratch, a.small_files, a.small_size)?;
        Ok::<_, anyhow::Error>((w, r, small))
    })();
    let _ = fs::remove_dir_all(&scratch);
    let (w, r, [sw, sr, st, sd]) = result?;
    println!("benchmark of {}", a.dir.display());
    println!(
        "  big file write   {w:>10.1} MiB/s  ({} MiB, fsync at end)",
        a.big_size >> 20
    );
    println!("  big file read    {r:>10.1} MiB/s  (client page cache dropped first)");
    println!(
        "  small write      {sw:>10.1} files/s ({} x {} KiB)",
        a.small_files,
        a.small_size >> 10
    );
    println!("  small read       {sr:>10.1} files/s");
    println!("  stat             {st:>10.1} files/s");
    println!("  delete           {sd:>10.1} files/s");
    Ok(ExitCode::SUCCESS)
}
