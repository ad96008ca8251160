//! Identity on the wire, with real processes: a connection without the
//! volume's key, with another volume's key, or replaying a recorded
//! handshake is refused; a connection that proved only the client key
//! cannot send what only servers send, and its forged peer requests change
//! nothing.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{both, client_key, keys, morris, morris_cmd, status, stderr, Cluster};
use morris_proto::auth::handshake::{decode_hs, Hs};
use morris_proto::auth::Keys;
use morris_proto::net::{RpcClient, RpcError};
use morris_proto::{ErrorCode, Request, VolumeDescriptor, PROTOCOL_VERSION};

/// Reads one handshake message (4-byte length, body) or `None` at the end.
fn read_hs(s: &mut TcpStream) -> Option<Hs> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(decode_hs(&body).expect("a handshake message"))
}

/// True once the server has closed `s` (read returns 0 or fails).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => continue,
        }
    }
}

/// A TCP proxy for one connection that records what the client sent.
fn recording_proxy(to: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        let Ok(mut s) = TcpStream::connect(&to) else {
            return;
        };
        let (mut c2, mut s2) = (c.try_clone().expect("clone"), s.try_clone().expect("clone"));
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
            let _ = c2.shutdown(std::net::Shutdown::Both);
        });
        let mut buf = [0u8; 65536];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    rec.lock().expect("lock").extend_from_slice(&buf[..n]);
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    (addr, seen)
}

#[test]
fn connections_without_the_volumes_key_are_refused() {
    let c = Cluster::start(2, Default::default());
    let addr = c.addr(0).to_string();
    let m = c.mount();
    std::fs::write(m.path.join("kept"), b"stored before").expect("write");

    // No key at all: the command says how to get one.
    let o = morris_cmd()
        .env_remove("MORRIS_KEY")
        .args(["status", &addr])
        .output()
        .expect("run");
    assert!(!o.status.success(), "{}", both(&o));
    assert!(stderr(&o).contains("no key"), "{}", both(&o));

    // Another volume's keys: refused by the server, for admin commands and
    // mounts alike.
    let other = tempfile::tempdir().expect("tempdir");
    let o = morris(&["key", "new", &other.path().join("k").display().to_string()]);
    assert!(o.status.success(), "{}", both(&o));
    let other_volume = other.path().join("k/volume.key").display().to_string();
    let other_client = other.path().join("k/client.key").display().to_string();
    let o = morris(&["status", &addr, "--key", &other_volume]);
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        stderr(&o).contains("not a key of this volume"),
        "{}",
        both(&o)
    );
    let mp = other.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let o = morris_cmd()
        .args([
            "mount",
            &addr,
            &mp.display().to_string(),
            "--key",
            &other_client,
        ])
        .output()
        .expect("run");
    assert!(!o.status.success(), "{}", both(&o));
    assert!(
        stderr(&o).contains("not a key of this volume"),
        "{}",
        both(&o)
    );
    // A client key cannot run a server or format one.
    let o = morris(&["format", "--servers", &addr, "--key", &client_key()]);
    assert!(
        !o.status.success() && stderr(&o).contains("needs the volume key"),
        "{}",
        both(&o)
    );

    // A peer that skips the handshake (an older morris, or a port scanner)
    // sends a request frame first: closed without an answer.
    let mut s = TcpStream::connect(&addr).expect("connect");
    let hello = Request::Hello {
        volume: None,
        client_id: 1,
        client_name: "no handshake".into(),
        version: PROTOCOL_VERSION,
    };
    let head = morris_proto::frame::encode_frame_head(
        morris_proto::frame::FrameKind::Request,
        1,
        &hello,
        0,
    )
    .expect("encode");
    s.write_all(&head).expect("send");
    match read_hs(&mut s) {
        Some(Hs::Refused { reason }) => assert!(reason.contains("handshake"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(closed_by_server(&mut s));

    // A recorded handshake (and the session after it) replayed on a new
    // connection: the server's challenge is new, the recorded proof does
    // not match it, and nothing after it is read.
    let (proxy, seen) = recording_proxy(addr.clone());
    let o = morris(&["status", &proxy]);
    assert!(o.status.success(), "{}", both(&o));
    let recorded = seen.lock().expect("lock").clone();
    assert!(recorded.len() > 100, "nothing recorded");
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(&recorded).expect("replay");
    match read_hs(&mut s) {
        Some(Hs::Challenge { .. }) => {}
        other => panic!("expected a challenge, got {other:?}"),
    }
    match read_hs(&mut s) {
        Some(Hs::Refused { reason }) => assert!(reason.contains("wrong proof"), "{reason}"),
        other => panic!("expected a refusal of the replayed proof, got {other:?}"),
    }
    assert!(closed_by_server(&mut s));
    let log = c.logs();
    assert!(log.contains("handshake failed"), "{log}");

    // What was stored is still there, and the mount still works.
    assert_eq!(
        std::fs::read(m.path.join("kept")).expect("read"),
        b"stored before"
    );
    std::fs::write(m.path.join("after"), b"x").expect("write after");

    // And on the servers' disks it is theirs alone: data directories 0700,
    // everything in them 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let mut files = 0;
    for s in &c.servers {
        assert_eq!(mode(&s.data), 0o700, "{}", s.data.display());
        let mut stack = vec![s.data.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    assert_eq!(mode(&p) & 0o077, 0, "{} is open to others", p.display());
                    files += 1;
                }
            }
        }
    }
    assert!(files >= 3, "too few files looked at ({files})");
}

#[test]
fn a_client_key_cannot_send_what_only_servers_send() {
    let c = Cluster::start_mirrored(2);
    let addr = c.addr(0).to_string();
    let m = c.mount();
    std::fs::write(m.path.join("kept"), b"stored before").expect("write");
    let client = Keys::load(&keys().client).expect("client key").credential();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let rpc = RpcClient::connect(&addr, &client, None)
            .await
            .expect("a client key connects");
        let (reply, _) = rpc
            .call(
                &Request::Hello {
                    volume: None,
                    client_id: 99,
                    client_name: "forger".into(),
                    version: PROTOCOL_VERSION,
                },
                Bytes::new(),
            )
            .await
            .expect("hello");
        let morris_proto::Reply::Hello {
            descriptor: Some(d),
            ..
        } = reply
        else {
            panic!("no descriptor in {reply:?}")
        };
        let foreign = VolumeDescriptor {
            uuid: uuid::Uuid::new_v4(),
            ..d
        };
        // Each would take a metadata range offline or replace its store.
        let forged = [
            (
                Request::PeerSync {
                    range: 0,
                    gen: u64::MAX,
                    lineage: 1,
                    seq: u64::MAX,
                    etcd: false,
                    candidate: true,
                },
                Bytes::new(),
            ),
            (
                Request::SnapshotChunk {
                    range: 1,
                    gen: u64::MAX,
                    lineage: 1,
                    seq: 1,
                    offset: 0,
                    last: true,
                },
                Bytes::from_static(b"SQLite format 3\0 not really"),
            ),
            (
                Request::Replicate {
                    range: 1,
                    gen: u64::MAX,
                    lineage: 1,
                    first_seq: 1,
                },
                Bytes::new(),
            ),
            (
                Request::Format {
                    descriptor: foreign,
                    index: 0,
                },
                Bytes::new(),
            ),
            (
                Request::WbClear {
                    marks: vec![(1, 1)],
                },
                Bytes::new(),
            ),
        ];
        for (req, payload) in forged {
            match rpc.call(&req, payload).await {
                Err(RpcError::Remote(e)) if e.code == ErrorCode::Denied => {}
                other => panic!("{} from a client key: {other:?}", req.name()),
            }
        }
    });
    // Two lease times later the ranges are still served where they were:
    // the mount works and the volume is healthy.
    std::thread::sleep(Duration::from_millis(3_500));
    std::fs::write(m.path.join("after"), b"still served").expect("write after");
    assert_eq!(
        std::fs::read(m.path.join("kept")).expect("read"),
        b"stored before"
    );
    let s = status(&c);
    assert_eq!(s["health"], "healthy", "{s}");
    let log = c.logs();
    assert!(
        log.contains("refused: a request only servers send"),
        "{log}"
    );
}

#[test]
fn a_writer_stopped_past_its_lease_does_not_land_its_write_over_the_next_writers() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const UNIT: usize = 64 << 10;
    let mut c = Cluster::start(2, Default::default());
    let a = c.mount();
    let b = c.mount();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(a.path.join("f"))
        .expect("create");
    f.write_all_at(&vec![b'a'; 2 * UNIT], 0).expect("write");
    f.sync_all().expect("fsync");
    // The file's first block (index 1) lives on the server that does not
    // own the inode (`(id + index) mod k`, owner `id mod k`).
    let ino = f.metadata().expect("stat").ino();
    let data_server = ((ino + 1) % 2) as usize;
    // The write to that server finds it gone and keeps trying to reach it.
    c.kill9(data_server);
    drop(f);
    // In a process of its own: a thread of this one blocked in the stopped
    // mount would hold this process's memory map, and fork (restarting the
    // server) would wait for it.
    let writer = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c 4096 /dev/zero | tr '\\0' A | dd of={} bs=4096 conv=notrunc,fsync status=none",
            a.path.join("f").display(),
        ))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the writer");
    std::thread::sleep(Duration::from_millis(300));
    // The writer's mount stops (SIGSTOP: a stalled or cut-off host) past
    // its lease; the server comes back; another client takes the lease
    // and writes the same bytes.
    let pid = a.pid().expect("mount pid");
    common::signal(pid, libc::SIGSTOP);
    c.restart(data_server);
    {
        let g = std::fs::OpenOptions::new()
            .write(true)
            .open(b.path.join("f"))
            .expect("open through the other mount");
        g.write_all_at(&[b'B'; 4096], 0).expect("the other writer");
        g.sync_all().expect("fsync");
    }
    common::signal(pid, libc::SIGCONT);
    // The stopped writer's change is not sent after its lease ran out: its
    // write fails, and the other writer's bytes stay.
    let out = writer.wait_with_output().expect("writer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Input/output error"),
        "a write under a lapsed lease must fail with EIO: {} {err}",
        out.status
    );
    let fresh = c.mount();
    let got = std::fs::read(fresh.path.join("f")).expect("read");
    assert_eq!(got.len(), 2 * UNIT);
    assert!(
        got[..4096].iter().all(|&x| x == b'B'),
        "the late write landed over the next writer's: {:?}",
        &got[..8]
    );
    let log = std::fs::read_to_string(&a.log).unwrap_or_default();
    assert!(log.contains("not sent: the lease"), "{log}");
}

/// libfaketime's preload library (Debian `faketime`).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Seconds since the epoch of the last timestamped line of a server log
/// (`2026-11-27T03:57:53.271701Z  INFO ...`), read with GNU `date`.
fn last_log_time(log: &std::path::Path) -> i64 {
    let text = common::read_log(log);
    let stamp = text
        .lines()
        .rev()
        .filter_map(|l| l.split_whitespace().next())
        .find(|w| w.len() > 20 && w.ends_with('Z') && w.as_bytes()[10] == b'T')
        .expect("a timestamped line in the server's log")
        .to_owned();
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &stamp, "+%s"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("date prints seconds")
}

/// Fence numbers come from the wall clock, but never go back: the
/// inode's metadata server restarted with its clock an hour behind still
/// numbers the next write grant above the one the data server saw, so the
/// next writer's writes go on (before the durable fence reservation, they
/// failed with EIO until the clock caught up).
#[test]
fn a_server_restarted_with_its_clock_set_back_still_numbers_grants_above_the_old_ones() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const UNIT: usize = 64 << 10;
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} missing: install Debian's faketime (scripts/setup.sh does)"
    );
    let mut c = Cluster::start(2, Default::default());
    let (ino, owner) = {
        let m = c.mount();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.path.join("f"))
            .expect("create");
        f.write_all_at(&vec![b'a'; 2 * UNIT], 0).expect("write");
        f.sync_all().expect("fsync");
        let ino = f.metadata().expect("stat").ino();
        (ino, (ino % 2) as usize)
    };
    // Offset 0 is block index 1, on the other server (`(id + 1) mod 2`),
    // which keeps the write grant's number. The inode's owner comes back
    // with its wall clock one hour behind (monotonic clock untouched).
    c.restart_env(
        owner,
        &[],
        &[
            ("LD_PRELOAD", FAKETIME_LIB),
            ("FAKETIME", "-3600"),
            ("DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let behind = now - last_log_time(&c.servers[owner].log);
    assert!(
        (3000..4200).contains(&behind),
        "the restarted server's clock is {behind} s behind, not an hour: faketime not in effect"
    );
    let m = c.mount();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path.join("f"))
        .expect("open after the restart");
    assert_eq!(f.metadata().expect("stat").ino(), ino);
    f.write_all_at(&[b'b'; 4096], 0)
        .and_then(|()| f.sync_all())
        .expect("a write under a grant of the restarted server must not be fenced");
    drop(f);
    let fresh = c.mount();
    let got = std::fs::read(fresh.path.join("f")).expect("read");
    assert_eq!(&got[..4096], &[b'b'; 4096][..]);
    assert!(got[4096..].iter().all(|&x| x == b'a'));
    let data_log = common::read_log(&c.servers[1 - owner].log);
    assert!(
        !data_log.contains("refused a change made under a write lease"),
        "{data_log}"
    );
}

#[test]
fn a_client_that_stops_reading_holds_a_bounded_amount_of_the_servers_memory() {
    use morris_proto::frame::{encode_frame_head, FrameKind};
    use std::os::unix::fs::MetadataExt;
    use tokio::io::AsyncWriteExt;
    let c = Cluster::start(
        1,
        common::ClusterOpts {
            stripe_unit: "1M".into(),
            ..Default::default()
        },
    );
    let addr = c.addr(0).to_string();
    let m = c.mount();
    std::fs::write(m.path.join("big"), vec![7u8; 4 << 20]).expect("write");
    let id = std::fs::metadata(m.path.join("big")).expect("stat").ino();
    let uuid: uuid::Uuid = c.uuid().parse().expect("uuid");
    let client = Keys::load(&keys().client).expect("client key").credential();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A client that asks for 2,000 blocks of 1 MiB and never reads a reply.
    let flood = rt.spawn(async move {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        morris_proto::auth::handshake::connect(&mut s, &client, &[])
            .await
            .expect("handshake");
        let hello = Request::Hello {
            volume: Some(uuid),
            client_id: 4242,
            client_name: "never reads".into(),
            version: PROTOCOL_VERSION,
        };
        let head = encode_frame_head(FrameKind::Request, 1, &hello, 0).expect("encode");
        s.write_all(&head).await.expect("hello");
        for n in 0..2000u64 {
            let read = Request::Read {
                id,
                index: n % 4,
                replica: 0,
                offset: 0,
                len: 1 << 20,
            };
            let head = encode_frame_head(FrameKind::Request, n + 2, &read, 0).expect("encode");
            if s.write_all(&head).await.is_err() {
                break;
            }
        }
        // Keep the socket open (and unread) until the server gives up on it.
        tokio::time::sleep(Duration::from_secs(600)).await;
        drop(s);
    });
    let stats = || {
        let s = status(&c);
        s["servers"][0]["stats"].clone()
    };
    // The replies in progress stay within the per-connection budget while
    // the peer reads nothing; and they did fill it (the bound is what held).
    let budget = morris_proto::net::REPLY_BUDGET as u64;
    let mut most = 0;
    for _ in 0..40 {
        let st = stats();
        let held = st["reply_bytes"].as_u64().expect("reply_bytes");
        most = most.max(held);
        assert!(held <= budget, "{held} bytes of replies held: {st}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        most > budget / 2,
        "the budget was never approached ({most} bytes)"
    );
    // The server closes the connection once its writes make no progress.
    common::wait_for(
        morris_proto::net::WRITE_STALL + Duration::from_secs(60),
        "the stalled connection to be closed",
        || {
            let st = stats();
            // What is left is the `Status` asking (a data request itself).
            let held = st["reply_bytes"].as_u64().unwrap_or(u64::MAX);
            if st["connections_stalled"].as_u64() >= Some(1) && held < 1 << 20 {
                Ok(())
            } else {
                Err(st.to_string())
            }
        },
    );
    flood.abort();
    // And the volume serves on.
    assert_eq!(
        std::fs::read(m.path.join("big")).expect("read").len(),
        4 << 20
    );
}

#[test]
fn with_tls_nothing_travels_in_clear_and_plain_clients_are_refused() {
    let c = Cluster::start(
        2,
        common::ClusterOpts {
            format: false,
            server_args: vec!["--tls".into()],
            ..common::ClusterOpts::default()
        },
    );
    let servers = c.addrs().join(",");
    let o = morris(&["format", "--servers", &servers, "--tls"]);
    assert!(o.status.success(), "format --tls: {}", both(&o));

    // A client outside TLS is told why it is refused.
    let o = morris(&["status", c.addr(0)]);
    assert!(!o.status.success(), "a plain client got in: {}", both(&o));
    assert!(stderr(&o).contains("inside TLS only"), "{}", both(&o));

    // Inside TLS: what the client sends is a TLS stream, and neither its
    // key's public id nor its Hello's client name shows in it.
    let (proxy, seen) = recording_proxy(c.addr(0).to_string());
    let o = morris(&["status", &proxy, "--tls", "--json"]);
    assert!(o.status.success(), "status --tls: {}", both(&o));
    let recorded = seen.lock().expect("lock").clone();
    assert!(recorded.len() > 200, "nothing recorded");
    assert_eq!(recorded[0], 0x16, "not a TLS handshake record");
    let id = Keys::load(&keys().volume).expect("keys").credential().id();
    let has = |needle: &[u8]| recorded.windows(needle.len()).any(|w| w == needle);
    assert!(!has(&id), "the key id travels in clear");
    assert!(!has(b"morris-status"), "the Hello travels in clear");

    // A mount inside TLS works as any other.
    let m = common::Mount::start(c.addr(0), &["--tls"]);
    let data = common::pattern(3, 0, 3 << 20);
    std::fs::write(m.path.join("f"), &data).expect("write");
    drop(m);
    let m = common::Mount::start(c.addr(1), &["--tls"]);
    assert!(common::read_all(&m.path.join("f")) == data);
}
