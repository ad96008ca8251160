//! Metadata ownership decided by etcd (`morris server --etcd URL`): a real
//! single-member etcd from Debian's `etcd-server`, four real servers with
//! `--replicas 2` (and 3), a FUSE mount. What etcd adds over the two copies alone:
//! a *silent* server (here `SIGSTOP`: connected, answering nothing) stops
//! neither the metadata range it keeps a copy of nor, after a takeover, the
//! range it serves.

mod common;

use std::time::Duration;

use common::{
    fsck_clean, pattern, read_all, status, wait_for, wait_healthy, Cluster, EtcdProc, EtcdTls,
};

const K: u32 = 4;
/// The root directory (id 1) is metadata range 1: server 1 serves it,
/// server 2 keeps its copy.
const ROOT_RANGE: u32 = 1;

fn cluster(etcd: &EtcdProc, replicas: u8) -> Cluster {
    Cluster::start(
        K as usize,
        common::ClusterOpts {
            replicas,
            server_args: vec!["--etcd".into(), etcd.url.clone()],
            ..common::ClusterOpts::default()
        },
    )
}

/// Server `i`'s view of metadata range `range` (`stats.ranges`).
fn copy_of(s: &serde_json::Value, i: usize, range: u32) -> serde_json::Value {
    s["servers"][i]["stats"]["ranges"]
        .as_array()
        .and_then(|v| v.iter().find(|r| r["range"] == range).cloned())
        .unwrap_or_default()
}

/// Creates and writes `n` files under `dir` and reads them back.
fn write_files(dir: &std::path::Path, tag: &str, n: usize, seed: u64) -> Result<(), String> {
    for i in 0..n {
        let p = dir.join(format!("{tag}-{i}"));
        let data = pattern(seed + i as u64, 0, 200_000 + i * 1000);
        std::fs::write(&p, &data).map_err(|e| format!("write {}: {e}", p.display()))?;
        let back = std::fs::read(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
        if back != data {
            return Err(format!("{} differs", p.display()));
        }
    }
    Ok(())
}

/// With server `stopped` SIGSTOPped, writes `n` files "during-i" (seeds
/// from `seed`) through `m`; returns the volume's status taken before the
/// server is woken. Panics, with the logs, if a write fails.
fn write_while_stopped(
    c: &Cluster,
    m: &common::Mount,
    stopped: usize,
    n: usize,
    seed: u64,
) -> serde_json::Value {
    let pid = c.pids()[stopped].expect("running");
    common::signal(pid, libc::SIGSTOP);
    let wrote = write_files(&m.path, "during", n, seed);
    let s = status(c);
    common::signal(pid, libc::SIGCONT);
    if let Err(e) = wrote {
        panic!(
            "writing with server {stopped} stopped failed: {e}; mount log:\n{}\nserver logs:\n{}",
            common::read_log(&m.log),
            c.logs()
        );
    }
    s
}

/// The `n` files written by `write_while_stopped` read back equal through
/// a fresh mount.
fn files_read_back(c: &Cluster, n: usize, seed: u64) {
    let m = c.mount();
    for i in 0..n {
        let p = m.path.join(format!("during-{i}"));
        assert!(
            read_all(&p) == pattern(seed + i as u64, 0, 200_000 + i * 1000),
            "{} differs",
            p.display()
        );
    }
}

#[test]
fn a_silent_copy_server_does_not_stop_the_range_it_copies() {
    silent_copy(2)
}

/// With three copies the silent server is the primary's candidate; the
/// third copy keeps following.
#[test]
fn with_three_copies_a_silent_candidate_does_not_stop_the_range() {
    silent_copy(3)
}

fn silent_copy(replicas: u8) {
    let etcd = EtcdProc::start();
    let c = cluster(&etcd, replicas);
    wait_healthy(&c);
    let m = c.mount();
    write_files(&m.path, "before", 4, 70).expect("write before");
    // Server 2 keeps the copy of the root's range; it goes silent.
    // Names keep being created in the root (range 1) and files written:
    // server 1 records in etcd that its copy is not current and goes on.
    let s = write_while_stopped(&c, &m, (ROOT_RANGE + 1) as usize, 6, 80);
    let served = copy_of(&s, ROOT_RANGE as usize, ROOT_RANGE);
    assert_eq!(served["primary"], true, "{s}");
    assert_eq!(served["ready"], true, "{s}");
    assert_eq!(served["peer_in_sync"], false, "{s}");
    drop(m);
    // Back: the copy gets a snapshot and is recorded current again.
    wait_healthy(&c);
    fsck_clean(&c);
    files_read_back(&c, 6, 80);
}

#[test]
fn a_silent_primary_is_taken_over_and_demoted_when_it_wakes() {
    silent_primary(2)
}

#[test]
fn with_three_copies_a_silent_primary_is_taken_over_by_its_candidate() {
    silent_primary(3)
}

fn silent_primary(replicas: u8) {
    let etcd = EtcdProc::start();
    let c = cluster(&etcd, replicas);
    wait_healthy(&c);
    let m = c.mount();
    write_files(&m.path, "before", 4, 90).expect("write before");
    // Server 1 (the root's range) goes silent: its etcd lease runs out, its
    // owner key goes, and server 2 (copy current in etcd) takes over.
    let primary = ROOT_RANGE as usize;
    let s = write_while_stopped(&c, &m, primary, 4, 100);
    let taken = copy_of(&s, primary + 1, ROOT_RANGE);
    assert_eq!(taken["primary"], true, "server 2 did not take over: {s}");
    assert!(taken["gen"].as_u64().unwrap_or(0) >= 2, "{s}");
    drop(m);
    // Awake, server 1 finds its etcd lease gone and a newer generation: it
    // keeps the copy. Nobody serves the range twice.
    wait_for(Duration::from_secs(60), "server 1 to keep the copy", || {
        let s = status(&c);
        let old = copy_of(&s, primary, ROOT_RANGE);
        let new = copy_of(&s, primary + 1, ROOT_RANGE);
        if old["primary"] == false && old["ready"] == true && new["primary"] == true {
            Ok(())
        } else {
            Err(format!("{old} / {new}"))
        }
    });
    wait_healthy(&c);
    fsck_clean(&c);
    files_read_back(&c, 4, 100);
}

/// A CA, a certificate for etcd (127.0.0.1) and one for its clients,
/// written as PEM files under `dir`.
fn make_tls(dir: &std::path::Path) -> EtcdTls {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write a PEM file");
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        p
    };
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "morris test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca, &ca_key).expect("certificate");
        (cert.pem(), key.serialize_pem())
    };
    let (sc, sk) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        "etcd",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (cc, ck) = leaf(Vec::new(), "morris", ExtendedKeyUsagePurpose::ClientAuth);
    EtcdTls {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("etcd.pem", sc),
        server_key: write("etcd.key", sk),
        client_cert: write("client.pem", cc),
        client_key: write("client.key", ck),
    }
}

/// etcd connection options with TLS (and, if given, a user).
fn etcd_options(tls: &EtcdTls, user: Option<(&str, &str)>) -> etcd_client::ConnectOptions {
    let read = |p: &std::path::Path| std::fs::read(p).expect("read a PEM file");
    let mut opts = etcd_client::ConnectOptions::new().with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)))
            .identity(etcd_client::Identity::from_pem(
                read(&tls.client_cert),
                read(&tls.client_key),
            )),
    );
    if let Some((u, p)) = user {
        opts = opts.with_user(u, p);
    }
    opts
}

/// etcd as a careful site runs it: clients only over TLS with a
/// certificate from the site's CA, and authentication on. The servers
/// reach it with `--etcd-ca`, `--etcd-cert`/`--etcd-key` and
/// `--etcd-user`/`--etcd-password-file`; their range records are there,
/// readable with the credentials and not without.
#[test]
fn servers_reach_an_etcd_that_wants_tls_a_client_certificate_and_a_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = make_tls(dir.path());
    let password = "s3cret-for-morris";
    let pw_file = dir.path().join("etcd.password");
    std::fs::write(&pw_file, format!("{password}\n")).expect("password file");
    std::fs::set_permissions(
        &pw_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let etcd = EtcdProc::start_tls(&tls);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c =
            etcd_client::Client::connect([etcd.url.as_str()], Some(etcd_options(&tls, None)))
                .await
                .expect("connect to etcd over TLS");
        c.user_add("root", password, None).await.expect("user add");
        c.user_grant_role("root", "root").await.expect("grant root");
        c.auth_enable().await.expect("auth enable");
    });
    let p = |x: &std::path::Path| x.display().to_string();
    let c = Cluster::start(
        K as usize,
        common::ClusterOpts {
            replicas: 2,
            server_args: vec![
                "--etcd".into(),
                etcd.url.clone(),
                "--etcd-ca".into(),
                p(&tls.ca),
                "--etcd-cert".into(),
                p(&tls.client_cert),
                "--etcd-key".into(),
                p(&tls.client_key),
                "--etcd-user".into(),
                "root".into(),
                "--etcd-password-file".into(),
                p(&pw_file),
            ],
            ..common::ClusterOpts::default()
        },
    );
    wait_healthy(&c);
    let m = c.mount();
    write_files(&m.path, "tls", 3, 40).expect("write through a volume arbitrated by etcd");
    // The range records, read with and without the password.
    let records = |user| {
        rt.block_on(async {
            let mut c =
                etcd_client::Client::connect([etcd.url.as_str()], Some(etcd_options(&tls, user)))
                    .await
                    .expect("connect to etcd over TLS");
            c.get(
                "/morris/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .map(|r| r.kvs().len())
        })
    };
    let with = records(Some(("root", password))).expect("read the range records");
    let without = records(None).is_ok();
    assert!(with >= K as usize, "{with} range records in etcd");
    assert!(!without, "etcd answered a client without the password");
}
