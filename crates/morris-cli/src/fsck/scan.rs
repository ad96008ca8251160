//! Reading every server's inodes, entries and data files, page by page.

use std::time::Duration;

use anyhow::{bail, Result};
use futures::future::try_join_all;
use indicatif::ProgressBar;
use morris_proto::{Reply, Request};

use super::check::{DataRec, EntryRec, InodeRec, Snapshot};
use crate::admin::{self, deadline, Session};

/// Records asked for per page.
const PAGE: u32 = 1000;
/// Longest wait for one page.
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one server holds.
#[derive(Default)]
struct Part {
    inodes: Vec<InodeRec>,
    entries: Vec<EntryRec>,
    data: Vec<(u64, u64)>,
}

async fn page(s: &Session, req: Request) -> Result<Reply> {
    deadline(
        PAGE_TIMEOUT,
        || format!("{} on server {}", req.name(), s.addr),
        s.ask(&req),
    )
    .await
}

async fn scan_server(s: &Session, bar: &ProgressBar) -> Result<Part> {
    let mut part = Part::default();
    let mut after = 0;
    loop {
        let req = Request::ScanInodes { after, max: PAGE };
        let v = match page(s, req.clone()).await? {
            Reply::Inodes(v) => v,
            other => return Err(admin::unexpected(&req, &s.addr, &other)),
        };
        let Some(last) = v.last().map(|i| i.id) else {
            break;
        };
        if last <= after || v.windows(2).any(|w| w[0].id >= w[1].id) {
            bail!("server {} listed inodes out of order", s.addr);
        }
        bar.inc(v.len() as u64);
        part.inodes.extend(v.iter().map(InodeRec::from));
        after = last;
    }
    let (mut after_dir, mut after_cookie) = (0, 0);
    loop {
        let req = Request::ScanEntries {
            after_dir,
            after_cookie,
            max: PAGE,
        };
        let v = match page(s, req.clone()).await? {
            Reply::ScanEntries(v) => v,
            other => return Err(admin::unexpected(&req, &s.addr, &other)),
        };
        let Some(last) = v.last().map(|(d, e)| (*d, e.cookie)) else {
            break;
        };
        if last <= (after_dir, after_cookie)
            || v.windows(2)
                .any(|w| (w[0].0, w[0].1.cookie) >= (w[1].0, w[1].1.cookie))
        {
            bail!("server {} listed directory entries out of order", s.addr);
        }
        bar.inc(v.len() as u64);
        part.entries.extend(v.into_iter().map(|(dir, e)| EntryRec {
            dir,
            name: e.name,
            child: e.child,
            kind: e.kind,
        }));
        (after_dir, after_cookie) = last;
    }
    let mut after = 0;
    loop {
        let req = Request::ScanData { after, max: PAGE };
        let v = match page(s, req.clone()).await? {
            Reply::DataFiles(v) => v,
            other => return Err(admin::unexpected(&req, &s.addr, &other)),
        };
        let Some(last) = v.last().map(|d| d.0) else {
            break;
        };
        if last <= after || v.windows(2).any(|w| w[0].0 >= w[1].0) {
            bail!("server {} listed data files out of order", s.addr);
        }
        bar.inc(v.len() as u64);
        part.data.extend(v);
        after = last;
    }
    Ok(part)
}

/// Scans every server (`sessions[i]` is server `i`) into one snapshot.
pub async fn scan(sessions: &[Session], bar: &ProgressBar) -> Result<Snapshot> {
    let parts = try_join_all(sessions.iter().map(|s| scan_server(s, bar))).await?;
    let mut snap = Snapshot::default();
    for (server, part) in parts.into_iter().enumerate() {
        for ino in part.inodes {
            if let Some(prev) = snap.inodes.insert(ino.id, ino) {
                bail!(
                    "inode {} is stored on two servers (one of them is server {server})",
                    prev.id
                );
            }
        }
        snap.entries.extend(part.entries);
        snap.data
            .extend(part.data.into_iter().map(|(id, bytes)| DataRec {
                server: server as u32,
                id,
                bytes,
            }));
    }
    Ok(snap)
}

/// Records the servers report holding (for the progress bar's length).
pub async fn count(sessions: &[Session]) -> u64 {
    let mut total = 0;
    for s in sessions {
        if let Ok(Ok(Reply::Status(st))) =
            tokio::time::timeout(Duration::from_secs(10), s.call(&Request::Status)).await
        {
            total += st.inodes + st.entries + st.data_files;
        }
    }
    total
}
