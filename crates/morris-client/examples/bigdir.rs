//! Large-directory benchmark: creates N files in one directory through the
//! client library (many creates in flight), reporting the create rate per
//! slice of N/10 so that any slow-down with directory size shows; then
//! looks up random names and lists the whole directory with cookies.
//!
//! `cargo run --release -p morris-client --example bigdir -- ADDR [N] [IN_FLIGHT]`
//! (bench/bigdir.sh starts a cluster and runs it.)

use std::sync::Arc;
use std::time::Instant;

use morris_client::{Caller, Client, ClientConfig, FileKind, Keys, ROOT_ID};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .ok_or("usage: MORRIS_KEY=CLIENT_KEY_FILE bigdir ADDR [N] [IN_FLIGHT]")?;
    let key_file = std::env::var_os("MORRIS_KEY").ok_or("set MORRIS_KEY to a key file")?;
    let keys = Keys::load(std::path::Path::new(&key_file))?;
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let inflight: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(32);
    let cl = Client::connect(&addr, ClientConfig::new(keys.clone())).await?;
    let me = Caller::root();
    let name = format!("bigdir-{}", std::process::id());
    let dir = cl.mkdir(ROOT_ID, name.as_bytes(), 0o755, &me).await?;
    let slice = (n / 10).max(1);
    println!("creating {n} files in one directory, {inflight} in flight");
    let mut done = 0u64;
    while done < n {
        let end = (done + slice).min(n);
        let t = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicU64::new(done));
        let mut tasks = Vec::new();
        for _ in 0..inflight {
            let cl = cl.clone();
            let next = next.clone();
            let me = me.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= end {
                        return Ok::<(), morris_client::Error>(());
                    }
                    cl.create(
                        dir.id,
                        format!("f{i:09}").as_bytes(),
                        FileKind::File,
                        0o644,
                        0,
                        true,
                        &me,
                    )
                    .await?;
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        let rate = (end - done) as f64 / t.elapsed().as_secs_f64();
        println!("entries {done:>9}..{end:<9} create {rate:>8.0}/s");
        done = end;
    }
    // Lookups of random names from a second client (nothing cached).
    let cl2 = Client::connect(&addr, ClientConfig::new(keys)).await?;
    let dir = cl2.lookup(ROOT_ID, name.as_bytes()).await?;
    let t = Instant::now();
    let lookups = 2000u64;
    let mut x = 88172645463325252u64;
    for _ in 0..lookups {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = x % n;
        cl2.lookup(dir.id, format!("f{i:09}").as_bytes()).await?;
    }
    println!(
        "lookup (uncached) {:>8.0}/s",
        lookups as f64 / t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let (mut cookie, mut count, mut pages) = (0u64, 0u64, 0u64);
    let mut worst = std::time::Duration::ZERO;
    loop {
        let tp = Instant::now();
        let (es, eof) = cl2.readdir(dir.id, cookie, 4096).await?;
        worst = worst.max(tp.elapsed());
        pages += 1;
        count += es.len() as u64;
        if let Some(e) = es.last() {
            cookie = e.cookie;
        }
        if eof || es.is_empty() {
            break;
        }
    }
    println!(
        "readdir {count} entries in {pages} pages: {:.2} s, slowest page {:.1} ms",
        t.elapsed().as_secs_f64(),
        worst.as_secs_f64() * 1e3
    );
    if count != n {
        return Err(format!("listed {count} entries, created {n}").into());
    }
    Ok(())
}
