//! `morris info PATH...`: where a file or directory of a mount lives — its
//! id, the server holding its inode and the copies of that metadata, its
//! stripe unit and which servers hold each stripe unit and copy (summed
//! per server for big files), copies recorded stale, and who holds a lease
//! on it (issue 20). Read without taking a lease, so asking disturbs no
//! mount.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use morris_client::{Client, ClientConfig};
use morris_proto::layout::Layout;
use morris_proto::messages::LeaseMode;
use morris_proto::{FileKind, Inode, LeaseHolder, VolumeDescriptor};
use serde::Serialize;

use crate::runtime;
use crate::size::human;

/// Files with at most this many blocks list each one.
const LIST_BLOCKS: u64 = 16;

/// Arguments of `morris info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Files or directories on a morris mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// A server of the volume (default: from the mount's source,
    /// `morris@HOST:PORT`).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// Print JSON, one object per path.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub key: crate::key::KeyArg,
}

/// A server, by index and address.
#[derive(Debug, Serialize)]
pub struct ServerRef {
    /// Its index in the volume.
    pub index: u32,
    /// Its address.
    pub addr: String,
}

/// One block and the servers holding its copies.
#[derive(Debug, Serialize)]
pub struct BlockPlace {
    /// Block index (1-based).
    pub index: u64,
    /// First byte of the file in it.
    pub offset: u64,
    /// Server of each copy, copy 0 first.
    pub servers: Vec<u32>,
}

/// How much of a file one server holds.
#[derive(Debug, Serialize)]
pub struct ServerShare {
    /// The server.
    pub server: u32,
    /// Blocks of which it holds a copy.
    pub blocks: u64,
    /// Bytes of the file in those blocks (once per copy held).
    pub bytes: u64,
}

/// What `morris info` says of one path.
#[derive(Debug, Serialize)]
pub struct Info {
    /// The path asked about.
    pub path: String,
    /// The file's id (its inode number on every mount).
    pub id: u64,
    /// Its generation.
    pub gen: u32,
    /// `file`, `dir`, `symlink`, ...
    pub kind: String,
    /// Size as the mount reports it.
    pub size: u64,
    /// Size as its owner has stored it (a writer's newer size may not be
    /// stored yet).
    pub stored_size: u64,
    /// Bytes its data takes on the servers' disks (`st_blocks` × 512).
    pub disk_bytes: u64,
    /// Links.
    pub nlink: u32,
    /// The server holding its inode (and, for a directory, its entries).
    pub inode_server: ServerRef,
    /// Servers keeping a copy of that metadata, the serving one first.
    pub metadata_copies: Vec<u32>,
    /// Stripe unit, bytes.
    pub stripe_unit: u32,
    /// Copies of each block.
    pub replicas: u32,
    /// Blocks of data.
    pub blocks: u64,
    /// Each block's servers (files of at most 16 blocks).
    pub block_list: Vec<BlockPlace>,
    /// What each server holds of it.
    pub per_server: Vec<ServerShare>,
    /// Copies recorded stale: (server, from block); block 0 means the
    /// file's data there is to be deleted.
    pub stale: Vec<(u32, u64)>,
    /// Leases on it now.
    pub leases: Vec<LeaseHolder>,
    /// For an object cached from a home: the bound directory's id.
    pub home_binding: Option<u64>,
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "char device",
        FileKind::BlockDev => "block device",
    }
}

/// Where `inode` (of size `size`) lives on `desc`'s servers.
pub fn describe(
    path: &Path,
    desc: &VolumeDescriptor,
    inode: &Inode,
    size: u64,
    leases: Vec<LeaseHolder>,
) -> Info {
    let layout = Layout::new(
        desc.servers.len() as u32,
        desc.stripe_unit,
        u32::from(desc.replicas),
    );
    let id = inode.id;
    let owner = layout.inode_server(id);
    let unit = u64::from(desc.stripe_unit);
    let has_data = inode.attr.kind == FileKind::File;
    let blocks = if has_data { size.div_ceil(unit) } else { 0 };
    let mut shares: Vec<ServerShare> = (0..layout.servers)
        .map(|s| ServerShare {
            server: s,
            blocks: 0,
            bytes: 0,
        })
        .collect();
    // Round-robin: every k consecutive blocks visit each server once per copy.
    let k = u64::from(layout.servers);
    for first in 1..=blocks.min(k) {
        let count = (blocks - first) / k + 1;
        // Bytes of those blocks: all full but possibly the file's last.
        let last = first + (count - 1) * k;
        let last_len = size - (last - 1) * unit;
        let bytes = (count - 1) * unit + last_len.min(unit);
        for s in layout.placement(id, first) {
            if let Some(sh) = shares.get_mut(s as usize) {
                sh.blocks += count;
                sh.bytes += bytes;
            }
        }
    }
    let block_list = if blocks <= LIST_BLOCKS {
        (1..=blocks)
            .map(|i| BlockPlace {
                index: i,
                offset: layout.block_start(i),
                servers: layout.placement(id, i),
            })
            .collect()
    } else {
        Vec::new()
    };
    Info {
        path: path.display().to_string(),
        id,
        gen: inode.gen,
        kind: kind_name(inode.attr.kind).to_string(),
        size,
        stored_size: inode.attr.size,
        disk_bytes: inode.disk_bytes(),
        nlink: inode.attr.nlink,
        inode_server: ServerRef {
            index: owner,
            addr: desc
                .servers
                .get(owner as usize)
                .cloned()
                .unwrap_or_default(),
        },
        metadata_copies: layout.meta_holders(owner),
        stripe_unit: desc.stripe_unit,
        replicas: u32::from(desc.replicas),
        blocks,
        block_list,
        per_server: shares.into_iter().filter(|s| s.blocks > 0).collect(),
        stale: inode.stale.iter().map(|s| (s.server, s.from)).collect(),
        leases,
        home_binding: inode.home.as_ref().map(|h| h.binding),
    }
}

/// The text form of `info`.
pub fn render(i: &Info, desc: &VolumeDescriptor) -> String {
    let addr = |s: u32| desc.servers.get(s as usize).cloned().unwrap_or_default();
    let mut out = format!("{}\n", i.path);
    out += &format!(
        "  id {} (generation {}), {}, {} bytes{}, {} on disk, {} link{}\n",
        i.id,
        i.gen,
        i.kind,
        i.size,
        if i.stored_size == i.size {
            String::new()
        } else {
            format!(" ({} stored so far)", i.stored_size)
        },
        human(i.disk_bytes),
        i.nlink,
        if i.nlink == 1 { "" } else { "s" }
    );
    out += &format!(
        "  inode on server {} ({}); metadata copies on server{} {}\n",
        i.inode_server.index,
        i.inode_server.addr,
        if i.metadata_copies.len() == 1 {
            ""
        } else {
            "s"
        },
        i.metadata_copies
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    if i.kind == "file" {
        out += &format!(
            "  stripe unit {}, {} cop{} of each block, {} block{}\n",
            human(u64::from(i.stripe_unit)),
            i.replicas,
            if i.replicas == 1 { "y" } else { "ies" },
            i.blocks,
            if i.blocks == 1 { "" } else { "s" }
        );
        for b in &i.block_list {
            out += &format!(
                "    block {:>2} at {:>10}: server{} {}\n",
                b.index,
                b.offset,
                if b.servers.len() == 1 { "" } else { "s" },
                b.servers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for s in &i.per_server {
            out += &format!(
                "    server {} ({}): {} block{}, {}\n",
                s.server,
                addr(s.server),
                s.blocks,
                if s.blocks == 1 { "" } else { "s" },
                human(s.bytes)
            );
        }
    }
    if i.stale.is_empty() {
        out += "  stale copies: none\n";
    }
    for (s, from) in &i.stale {
        if *from == 0 {
            out += &format!("  stale copies: server {s} still holds data to delete\n");
        } else {
            out += &format!("  stale copies: server {s}, blocks {from} and after\n");
        }
    }
    if i.leases.is_empty() {
        out += "  leases: none\n";
    }
    for l in &i.leases {
        let mode = match l.mode {
            LeaseMode::Write => "write",
            LeaseMode::Read => "read",
        };
        out += &format!("  lease: {mode}, held by {}\n", l.client);
    }
    if let Some(b) = i.home_binding {
        out += &format!("  cached from a home (bound directory id {b})\n");
    }
    out
}

/// Runs `morris info`.
pub fn run(args: InfoArgs) -> Result<ExitCode> {
    let mut found: Vec<(PathBuf, u64, u64)> = Vec::new();
    let mut server = args.server.clone();
    for p in &args.paths {
        let (mp, _, addr) = crate::cache::locate(p)?;
        let m = std::fs::symlink_metadata(p).with_context(|| format!("{}", p.display()))?;
        found.push((p.clone(), m.ino(), m.size()));
        if server.is_none() {
            server = addr;
        }
        if server.is_none() {
            return Err(anyhow!(
                "cannot tell which server the mount at {} uses (its source is not morris@HOST:PORT): pass --server",
                mp.display()
            ));
        }
    }
    let addr = server.ok_or_else(|| anyhow!("no path given"))?;
    let keys = args.key.load()?;
    let rt = runtime::build()?;
    rt.block_on(async {
        let cfg = ClientConfig {
            name: format!("info@{}", crate::mount::hostname()),
            ..ClientConfig::new(keys)
        };
        let client = Client::connect(&addr, cfg).await.map_err(|e| {
            anyhow!(
                "cannot connect to the volume through {addr}: {e} (--server names another \
                     server of the volume)"
            )
        })?;
        let desc = client.descriptor().clone();
        let mut failed = false;
        for (path, id, size) in &found {
            let res = async {
                let inode = client.inode_as_stored(*id).await?;
                let leases = client.lease_holders(*id).await?;
                Ok::<_, morris_client::Error>(describe(path, &desc, &inode, *size, leases))
            }
            .await;
            match res {
                Ok(i) if args.json => println!("{}", serde_json::to_string(&i)?),
                Ok(i) => print!("{}", render(&i, &desc)),
                Err(e) => {
                    eprintln!("morris: {}: {e}", path.display());
                    failed = true;
                }
            }
        }
        client.shutdown().await;
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::{Attr, Timestamp};

    fn inode(id: u64, size: u64) -> Inode {
        let now = Timestamp::now();
        Inode {
            id,
            gen: 1,
            parent: 1,
            attr: Attr {
                kind: FileKind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                nlink: 1,
                size,
                atime: now,
                mtime: now,
                ctime: now,
                rdev: 0,
                flags: 0,
            },
            target: None,
            stale: Vec::new(),
            home: None,
            alloc: None,
        }
    }

    fn desc(k: usize, replicas: u8) -> VolumeDescriptor {
        VolumeDescriptor {
            uuid: uuid::Uuid::nil(),
            servers: (0..k).map(|i| format!("h{i}:1")).collect(),
            stripe_unit: 1 << 20,
            replicas,
            created: Timestamp::now(),
        }
    }

    #[test]
    fn every_byte_of_every_copy_is_counted_once_per_server() {
        for (k, r, size) in [
            (4, 1, 10u64 << 20),
            (4, 2, (10 << 20) + 5),
            (3, 3, 1),
            (5, 2, 0),
        ] {
            let d = desc(k, r);
            let i = describe(Path::new("/m/f"), &d, &inode(4101, size), size, Vec::new());
            let bytes: u64 = i.per_server.iter().map(|s| s.bytes).sum();
            let blocks: u64 = i.per_server.iter().map(|s| s.blocks).sum();
            assert_eq!(bytes, size * u64::from(r), "k={k} r={r} size={size}");
            assert_eq!(blocks, size.div_ceil(1 << 20) * u64::from(r));
        }
        let d = desc(4, 2);
        let i = describe(
            Path::new("/m/f"),
            &d,
            &inode(4101, 3 << 20),
            3 << 20,
            Vec::new(),
        );
        assert_eq!(i.inode_server.index, 4101 % 4);
        assert_eq!(i.metadata_copies, vec![1, 2]);
        // Block 1 of file 4101 is on server (4101 + 1) mod 4 = 2, its copy on 3.
        assert_eq!(i.block_list[0].servers, vec![2, 3]);
        assert_eq!(i.block_list.len(), 3);
        assert!(render(&i, &d).contains("block  1 at          0: servers 2, 3"));
    }
}
