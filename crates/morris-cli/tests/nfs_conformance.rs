//! The NFSv3 gateway answers each procedure's cases as nfs-ganesha does:
//! the same calls (made with `nfs3_client`, a Rust NFSv3 client, as root
//! over AUTH_UNIX) go to a `morris nfs` gateway and to a real nfs-ganesha
//! exporting a local directory, on the same tree, and every status (and
//! what the objects are: attributes, bytes, names, a link's target, ACCESS
//! bits) is compared. Both runs are printed side by side; a difference fails the
//! test unless it is one the RFC allows and is listed in `ALLOWED` with the
//! reason.

mod common;
#[path = "../../morris-home/tests/ganesha/mod.rs"]
mod ganesha;
mod nfs_harness;

use common::{Cluster, ClusterOpts};
use nfs3_client::nfs3_types::nfs3::{
    createhow3, createverf3, diropargs3, filename3, ftype3, mknoddata3, nfs_fh3, nfspath3,
    nfstime3, sattr3, stable_how, symlinkdata3, ACCESS3args, COMMIT3args, CREATE3args, FSINFO3args,
    FSSTAT3args, GETATTR3args, LINK3args, LOOKUP3args, MKDIR3args, MKNOD3args, Nfs3Option,
    Nfs3Result, PATHCONF3args, READ3args, READDIR3args, READDIRPLUS3args, READLINK3args,
    REMOVE3args, RENAME3args, RMDIR3args, SETATTR3args, SYMLINK3args, WRITE3args,
};
use nfs3_client::nfs3_types::rpc::{auth_flavor, auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::{Opaque, Pack};
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{Nfs3Client, Nfs3ConnectionBuilder};
use nfs_harness::Gateway;
use tokio::net::TcpStream;

type Client = Nfs3Client<TokioIo<TcpStream>>;

/// Cases where the two servers may differ, with why.
const ALLOWED: &[(&str, &str)] = &[
    (
        "SETATTR size of a directory",
        "RFC 1813 names no error for it: ganesha BADTYPE, morris ISDIR as truncate(2)",
    ),
    (
        "LINK of a directory",
        "ganesha BADTYPE, morris PERM as link(2) and Linux's NFS server",
    ),
    (
        "CREATE name with a slash",
        "a name no server can hold; RFC 1813 leaves the error open: ganesha NOENT, \
         Linux's NFS server ACCES, morris INVAL",
    ),
    (
        "GETATTR removed file",
        "a file with no name left stays a few seconds for opens racing its removal \
         (docs/architecture.md, \"Files with no name left\"), then its handle is STALE \
         (nfs.rs, a_deleted_files_handle_is_stale)",
    ),
];

fn root_cred() -> opaque_auth<'static> {
    let a = auth_unix {
        stamp: 1,
        machinename: Opaque::owned(b"conformance".to_vec()),
        uid: 0,
        gid: 0,
        gids: vec![],
    };
    let mut body = Vec::new();
    a.pack(&mut body).expect("pack auth_unix");
    opaque_auth {
        flavor: auth_flavor::AUTH_UNIX,
        body: Opaque::owned(body),
    }
}

fn status<T, E>(r: Result<Nfs3Result<T, E>, nfs3_client::RpcError>) -> String {
    match r {
        Ok(Nfs3Result::Ok(_)) => "NFS3_OK".into(),
        Ok(Nfs3Result::Err((s, _))) => format!("{s:?}"),
        Err(e) => format!("rpc error: {e}"),
    }
}

fn name(s: &str) -> filename3<'static> {
    filename3(Opaque::owned(s.as_bytes().to_vec()))
}

fn at(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(m),
        ..Default::default()
    }
}

async fn lookup(c: &mut Client, dir: &nfs_fh3, n: &str) -> nfs_fh3 {
    match c.lookup(&LOOKUP3args { what: at(dir, n) }).await {
        Ok(Nfs3Result::Ok(ok)) => ok.object,
        other => panic!("LOOKUP {n}: {other:?}"),
    }
}

/// Makes the tree under `root` and runs every case: (case, status).
async fn cases(c: &mut Client, root: &nfs_fh3) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    // The tree: d/ {f ("hello"), l -> f, e/, full/ {x}}.
    let s = status(
        c.mkdir(&MKDIR3args {
            where_: at(root, "d"),
            attributes: mode(0o755),
        })
        .await,
    );
    out.push(("setup: MKDIR d", s));
    let d = lookup(c, root, "d").await;
    let s = status(
        c.create(&CREATE3args {
            where_: at(&d, "f"),
            how: createhow3::UNCHECKED(mode(0o644)),
        })
        .await,
    );
    out.push(("setup: CREATE d/f", s));
    let f = lookup(c, &d, "f").await;
    let s = status(
        c.write(&WRITE3args {
            file: f.clone(),
            offset: 0,
            count: 5,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(b"hello".to_vec()),
        })
        .await,
    );
    out.push(("setup: WRITE d/f", s));
    let s = status(
        c.symlink(&SYMLINK3args {
            where_: at(&d, "l"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::owned(b"f".to_vec())),
            },
        })
        .await,
    );
    out.push(("setup: SYMLINK d/l", s));
    for dir in ["e", "full"] {
        let s = status(
            c.mkdir(&MKDIR3args {
                where_: at(&d, dir),
                attributes: mode(0o755),
            })
            .await,
        );
        out.push(("setup: MKDIR d/e, d/full", s));
    }
    let full = lookup(c, &d, "full").await;
    let s = status(
        c.create(&CREATE3args {
            where_: at(&full, "x"),
            how: createhow3::UNCHECKED(mode(0o644)),
        })
        .await,
    );
    out.push(("setup: CREATE d/full/x", s));
    let l = lookup(c, &d, "l").await;
    let e = lookup(c, &d, "e").await;

    // What the objects are, not only that the calls succeed: kind, mode,
    // links, owner and (for all but directories, whose sizes are each file
    // system's own) size; a file's bytes and end; a listing's names; a
    // link's target; what root may do.
    for (label, fh) in [
        ("attributes of d", &d),
        ("attributes of d/f", &f),
        ("attributes of d/l", &l),
        ("attributes of d/e", &e),
        ("attributes of d/full", &full),
    ] {
        let v = match c.getattr(&GETATTR3args { object: fh.clone() }).await {
            Ok(Nfs3Result::Ok(ok)) => {
                let a = ok.obj_attributes;
                let size = if matches!(a.type_, ftype3::NF3DIR) {
                    "-".to_string()
                } else {
                    a.size.to_string()
                };
                format!(
                    "{:?} {:o} nlink {} uid {} gid {} size {size}",
                    a.type_, a.mode, a.nlink, a.uid, a.gid
                )
            }
            other => status(other),
        };
        out.push((label, v));
    }
    let v = match c
        .read(&READ3args {
            file: f.clone(),
            offset: 1,
            count: 100,
        })
        .await
    {
        Ok(Nfs3Result::Ok(ok)) => format!(
            "{} bytes {:?} eof {}",
            ok.count,
            String::from_utf8_lossy(ok.data.as_ref()),
            ok.eof
        ),
        other => status(other),
    };
    out.push(("READ d/f from 1: what comes", v));
    let v = match c.readlink(&READLINK3args { symlink: l.clone() }).await {
        Ok(Nfs3Result::Ok(ok)) => String::from_utf8_lossy(ok.data.0.as_ref()).into_owned(),
        other => status(other),
    };
    out.push(("READLINK d/l: the target", v));
    let v = match c
        .readdir(&READDIR3args {
            dir: d.clone(),
            cookie: 0,
            cookieverf: Default::default(),
            count: 8192,
        })
        .await
    {
        Ok(Nfs3Result::Ok(ok)) => {
            let mut names: Vec<String> = ok
                .reply
                .entries
                .0
                .iter()
                .map(|e| String::from_utf8_lossy(e.name.0.as_ref()).into_owned())
                .collect();
            names.sort();
            format!("{} eof {}", names.join(" "), ok.reply.eof)
        }
        other => status(other),
    };
    out.push(("READDIR d: the names", v));
    let v = match c
        .access(&ACCESS3args {
            object: f.clone(),
            access: 0x3f,
        })
        .await
    {
        Ok(Nfs3Result::Ok(ok)) => format!("{:#x}", ok.access),
        other => status(other),
    };
    out.push(("ACCESS d/f as root: the bits", v));

    let garbage = nfs_fh3 {
        // Shorter than any handle of either server (a longer one would be
        // read by morris as a generation, older or newer than the volume's
        // random one: STALE or BADHANDLE by chance).
        data: Opaque::owned(vec![0xab; 4]),
    };

    macro_rules! case {
        ($label:expr, $call:expr) => {{
            let s = status($call.await);
            out.push(($label, s));
        }};
    }
    case!(
        "GETATTR file",
        c.getattr(&GETATTR3args { object: f.clone() })
    );
    case!(
        "GETATTR garbage handle",
        c.getattr(&GETATTR3args {
            object: garbage.clone()
        })
    );
    case!(
        "LOOKUP missing name",
        c.lookup(&LOOKUP3args {
            what: at(&d, "missing")
        })
    );
    case!(
        "LOOKUP in a file",
        c.lookup(&LOOKUP3args { what: at(&f, "x") })
    );
    case!(
        "LOOKUP 256-byte name",
        c.lookup(&LOOKUP3args {
            what: at(&d, &"a".repeat(256))
        })
    );
    case!("LOOKUP ..", c.lookup(&LOOKUP3args { what: at(&d, "..") }));
    case!(
        "ACCESS file",
        c.access(&ACCESS3args {
            object: f.clone(),
            access: 0x3f
        })
    );
    case!(
        "READLINK symlink",
        c.readlink(&READLINK3args { symlink: l.clone() })
    );
    case!(
        "READLINK file",
        c.readlink(&READLINK3args { symlink: f.clone() })
    );
    case!(
        "READ file",
        c.read(&READ3args {
            file: f.clone(),
            offset: 0,
            count: 100
        })
    );
    case!(
        "READ directory",
        c.read(&READ3args {
            file: d.clone(),
            offset: 0,
            count: 100
        })
    );
    case!(
        "WRITE directory",
        c.write(&WRITE3args {
            file: d.clone(),
            offset: 0,
            count: 1,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(b"x".to_vec()),
        })
    );
    case!(
        "CREATE GUARDED existing",
        c.create(&CREATE3args {
            where_: at(&d, "f"),
            how: createhow3::GUARDED(mode(0o644))
        })
    );
    case!(
        "CREATE UNCHECKED existing",
        c.create(&CREATE3args {
            where_: at(&d, "f"),
            how: createhow3::UNCHECKED(sattr3::default())
        })
    );
    case!(
        "CREATE EXCLUSIVE over a file made otherwise",
        c.create(&CREATE3args {
            where_: at(&d, "f"),
            how: createhow3::EXCLUSIVE(createverf3([7; 8]))
        })
    );
    case!(
        "CREATE in a file",
        c.create(&CREATE3args {
            where_: at(&f, "y"),
            how: createhow3::UNCHECKED(mode(0o644))
        })
    );
    case!(
        "MKDIR existing dir",
        c.mkdir(&MKDIR3args {
            where_: at(&d, "e"),
            attributes: mode(0o755)
        })
    );
    case!(
        "MKDIR over a file",
        c.mkdir(&MKDIR3args {
            where_: at(&d, "f"),
            attributes: mode(0o755)
        })
    );
    case!(
        "SYMLINK existing",
        c.symlink(&SYMLINK3args {
            where_: at(&d, "l"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::owned(b"g".to_vec())),
            },
        })
    );
    case!(
        "REMOVE missing",
        c.remove(&REMOVE3args {
            object: at(&d, "missing")
        })
    );
    case!(
        "RMDIR non-empty",
        c.rmdir(&RMDIR3args {
            object: at(&d, "full")
        })
    );
    case!(
        "RMDIR file",
        c.rmdir(&RMDIR3args {
            object: at(&d, "f")
        })
    );
    case!(
        "RMDIR missing",
        c.rmdir(&RMDIR3args {
            object: at(&d, "missing")
        })
    );
    case!(
        "RMDIR .",
        c.rmdir(&RMDIR3args {
            object: at(&d, ".")
        })
    );
    case!(
        "RENAME missing source",
        c.rename(&RENAME3args {
            from: at(&d, "missing"),
            to: at(&d, "z")
        })
    );
    case!(
        "RENAME dir over non-empty dir",
        c.rename(&RENAME3args {
            from: at(&d, "e"),
            to: at(&d, "full")
        })
    );
    case!(
        "RENAME file over dir",
        c.rename(&RENAME3args {
            from: at(&d, "f"),
            to: at(&d, "e")
        })
    );
    case!(
        "RENAME dir over file",
        c.rename(&RENAME3args {
            from: at(&d, "e"),
            to: at(&d, "f")
        })
    );
    case!(
        "RENAME dir into itself",
        c.rename(&RENAME3args {
            from: at(&d, "full"),
            to: at(&full, "sub")
        })
    );
    case!(
        "RENAME onto itself",
        c.rename(&RENAME3args {
            from: at(&d, "f"),
            to: at(&d, "f")
        })
    );
    case!(
        "LINK existing name",
        c.link(&LINK3args {
            file: f.clone(),
            link: at(&d, "l")
        })
    );
    case!(
        "LINK in a file",
        c.link(&LINK3args {
            file: f.clone(),
            link: at(&f, "h")
        })
    );
    case!(
        "READDIR file",
        c.readdir(&READDIR3args {
            dir: f.clone(),
            cookie: 0,
            cookieverf: Default::default(),
            count: 4096
        })
    );
    case!(
        "READDIR directory",
        c.readdir(&READDIR3args {
            dir: d.clone(),
            cookie: 0,
            cookieverf: Default::default(),
            count: 4096
        })
    );
    case!(
        "READDIRPLUS file",
        c.readdirplus(&READDIRPLUS3args {
            dir: f.clone(),
            cookie: 0,
            cookieverf: Default::default(),
            dircount: 4096,
            maxcount: 8192,
        })
    );
    case!(
        "SETATTR guard mismatch",
        c.setattr(&SETATTR3args {
            object: f.clone(),
            new_attributes: mode(0o600),
            guard: Nfs3Option::Some(nfstime3 {
                seconds: 1,
                nseconds: 0
            }),
        })
    );
    case!(
        "SETATTR size of a directory",
        c.setattr(&SETATTR3args {
            object: e.clone(),
            new_attributes: sattr3 {
                size: Nfs3Option::Some(0),
                ..Default::default()
            },
            guard: Nfs3Option::None,
        })
    );
    case!(
        "SETATTR mode of a file",
        c.setattr(&SETATTR3args {
            object: f.clone(),
            new_attributes: mode(0o640),
            guard: Nfs3Option::None
        })
    );
    case!(
        "LINK of a directory",
        c.link(&LINK3args {
            file: e.clone(),
            link: at(&d, "hd")
        })
    );
    case!(
        "LINK of a symlink",
        c.link(&LINK3args {
            file: l.clone(),
            link: at(&d, "hl")
        })
    );
    case!(
        "MKNOD fifo",
        c.mknod(&MKNOD3args {
            where_: at(&d, "fifo"),
            what: mknoddata3::NF3FIFO(mode(0o644)),
        })
    );
    case!(
        "READ symlink",
        c.read(&READ3args {
            file: l.clone(),
            offset: 0,
            count: 10
        })
    );
    case!(
        "READ past the end",
        c.read(&READ3args {
            file: f.clone(),
            offset: 1000,
            count: 10
        })
    );
    case!(
        "LOOKUP empty name",
        c.lookup(&LOOKUP3args { what: at(&d, "") })
    );
    case!(
        "CREATE name with a slash",
        c.create(&CREATE3args {
            where_: at(&d, "a/b"),
            how: createhow3::UNCHECKED(mode(0o644))
        })
    );
    case!(
        "MKDIR named ..",
        c.mkdir(&MKDIR3args {
            where_: at(&d, ".."),
            attributes: mode(0o755)
        })
    );
    case!(
        "RENAME to .",
        c.rename(&RENAME3args {
            from: at(&d, "f"),
            to: at(&d, ".")
        })
    );
    case!(
        "REMOVE ..",
        c.remove(&REMOVE3args {
            object: at(&d, "..")
        })
    );
    case!(
        "COMMIT directory",
        c.commit(&COMMIT3args {
            file: d.clone(),
            offset: 0,
            count: 0
        })
    );
    case!(
        "SETATTR mode of a symlink",
        c.setattr(&SETATTR3args {
            object: l.clone(),
            new_attributes: mode(0o600),
            guard: Nfs3Option::None
        })
    );
    case!("FSSTAT", c.fsstat(&FSSTAT3args { fsroot: d.clone() }));
    case!("FSINFO", c.fsinfo(&FSINFO3args { fsroot: d.clone() }));
    case!("PATHCONF", c.pathconf(&PATHCONF3args { object: f.clone() }));
    case!(
        "COMMIT file",
        c.commit(&COMMIT3args {
            file: f.clone(),
            offset: 0,
            count: 0
        })
    );
    case!(
        "REMOVE directory",
        c.remove(&REMOVE3args {
            object: at(&d, "e")
        })
    );
    case!(
        "REMOVE file",
        c.remove(&REMOVE3args {
            object: at(&d, "f")
        })
    );
    case!(
        "GETATTR removed file",
        c.getattr(&GETATTR3args { object: f.clone() })
    );
    case!(
        "RMDIR empty dir",
        c.rmdir(&RMDIR3args {
            object: at(&d, "e")
        })
    );
    out
}

/// Mounts `path` at 127.0.0.1 (`port` for MOUNT and NFS) and runs the cases.
async fn run(port: u16, mount_port: u16, path: &str) -> Vec<(&'static str, String)> {
    let conn = Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", path)
        .mount_port(mount_port)
        .nfs3_port(port)
        .credential(root_cred())
        .mount()
        .await
        .unwrap_or_else(|e| panic!("cannot mount {path} on port {port}: {e}"));
    let root = conn.root_nfs_fh3();
    let mut c = conn.into_nfs3_client();
    cases(&mut c, &root).await
}

#[test]
fn each_nfs_procedure_answers_as_nfs_ganesha_does() {
    let work = tempfile::tempdir().expect("tempdir");
    let export = work.path().join("export");
    std::fs::create_dir_all(&export).expect("export dir");
    let g = ganesha::Ganesha::start_new(&export, &work.path().join("ganesha"));
    let c = Cluster::start(2, ClusterOpts::default());
    let gw = Gateway::start(c.addr(0), &["--insecure"]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let theirs = rt.block_on(run(g.port(), g.mount_port(), "/export"));
    let ours = rt.block_on(run(gw.port, gw.port, "/"));

    let mut table = String::from("| case | nfs-ganesha | morris |\n|---|---|---|\n");
    let mut wrong = Vec::new();
    assert_eq!(theirs.len(), ours.len());
    for ((case, t), (_, o)) in theirs.iter().zip(&ours) {
        let mark = if t == o { "" } else { " **differs**" };
        table.push_str(&format!("| {case} | {t} | {o}{mark} |\n"));
        if t != o && !ALLOWED.iter().any(|(c, _)| c == case) {
            wrong.push(*case);
        }
    }
    println!("{table}");
    assert!(
        wrong.is_empty(),
        "the gateway answers differently from nfs-ganesha in: {wrong:?}\n{table}"
    );
}
