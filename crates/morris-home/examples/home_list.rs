//! Lists one home directory whole, as a cached directory's owner does
//! (pages of `--page` entries, with attributes), and says how long it took:
//! what a listing miss costs before anything is stored. A development tool
//! for `bench/cache.py`'s part (b), not part of morris.
//!
//! ```text
//! home_list URL PATH [--page N] [--names]
//!   URL    nfs://host[:port]/export[/dir][?mountport=N]  or  file:///dir
//!   PATH   the directory, below the home's root (a/b/c; "" for the root)
//!   --page N   entries asked for per request (default 1000, the owner's)
//!   --no-plus  names only (READDIR), not names with attributes
//! ```
//!
//! Prints `{"entries":..,"secs":..,"pages":..,"open_secs":..}` on stdout.

use std::process::ExitCode;
use std::time::Instant;

use morris_home::{HomeOptions, HomeUrl};

async fn run(args: Vec<String>) -> Result<(), String> {
    let mut it = args.into_iter();
    let url = it
        .next()
        .ok_or("usage: home_list URL PATH [--page N] [--no-plus]")?;
    let path = it.next().ok_or("no PATH")?;
    let (mut page, mut plus) = (1000usize, true);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--page" => {
                page = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--page needs a number")?
            }
            "--no-plus" => plus = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let url: HomeUrl = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let t_open = Instant::now();
    let home = morris_home::open(&url, HomeOptions::default())
        .await
        .map_err(|e| format!("opening {url}: {e}"))?;
    let (mut handle, _) = home.root().await.map_err(|e| format!("root: {e}"))?;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        handle = home
            .lookup(&handle, comp.as_bytes())
            .await
            .map_err(|e| format!("lookup {comp:?}: {e}"))?
            .0;
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    let t = Instant::now();
    let (mut cookie, mut verifier, mut entries, mut pages) = (0u64, [0u8; 8], 0usize, 0usize);
    loop {
        let p = home
            .read_dir(&handle, cookie, verifier, page, plus)
            .await
            .map_err(|e| format!("read_dir: {e}"))?;
        pages += 1;
        entries += p.entries.len();
        if p.eof {
            break;
        }
        let last = p.entries.last().ok_or("an empty page before the end")?;
        cookie = last.cookie;
        verifier = p.verifier;
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{entries} entries in {secs:.3} s, {pages} pages (open {open_secs:.3} s)");
    println!("{{\"entries\":{entries},\"secs\":{secs:.6},\"pages\":{pages},\"open_secs\":{open_secs:.6}}}");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("home_list: {e}");
            ExitCode::FAILURE
        }
    }
}
