//! `NfsHome` against the conformance suite: nfs-ganesha (FSAL VFS, its
//! attribute cache off) exports the same fixture tree `LocalHome` is
//! checked on, and the one suite runs over it.
//!
//! Needs root and nfs-ganesha (scripts/setup.sh installs it); fails, never
//! skips, if ganesha cannot start.

mod common;
mod ganesha;

use std::time::Instant;

use common::{build_tree, conformance};
use ganesha::Ganesha;
use morris_home::HomeOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_home_passes_the_conformance_suite() {
    let tmp = match tempfile::Builder::new()
        .prefix("morris-home-nfs-")
        .tempdir_in("/var/tmp")
    {
        Ok(d) => d,
        Err(e) => panic!("tempdir in /var/tmp: {e}"),
    };
    let export = tmp.path().join("export");
    let work = tmp.path().join("ganesha");
    for d in [&export, &work] {
        if let Err(e) = std::fs::create_dir_all(d) {
            panic!("mkdir {}: {e}", d.display());
        }
    }
    let t = Instant::now();
    let tree = build_tree(&export);
    eprintln!("fixture built in {:?}", t.elapsed());
    let g = Ganesha::start_new(&export, &work);
    let url = g.url();
    let home = match morris_home::open(&url, HomeOptions::default()).await {
        Ok(h) => h,
        Err(e) => panic!("open {url}: {e}"),
    };
    conformance(home.clone(), &tree).await;
    // Once more: the suite leaves the tree as it found it.
    conformance(home, &tree).await;
    drop(g);
}
