//! The volume's keys: what they are, how they are derived, and the key files
//! that hold them.
//!
//! A volume has one **volume key** (role [`Role::Server`]): stripe servers
//! hold it, and so do administrators (`morris format`, `fsck --repair`).
//! Mounts and NFS gateways hold the **client key** (role [`Role::Client`]),
//! which is derived from the volume key, so a server can check a client
//! without a second secret to distribute, and a client key cannot be turned
//! back into the volume key.
//!
//! A key file is text: comment lines (`#`) and one key per line,
//! `morris-key-v1 server|client BASE64`. The first key is the one used to
//! connect; every key is accepted from others (rotation, docs/operations.md).

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Bytes in a key's secret.
pub const KEY_LEN: usize = 32;

/// The word that starts every key line (and its format version).
const KEY_TAG: &str = "morris-key-v1";

/// What a key lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// A mount or an NFS gateway: every file-system request, none of the
    /// requests servers send each other, no formatting.
    Client,
    /// A stripe server or an administrator (the volume key): everything.
    Server,
}

impl Role {
    /// The word for the role in key files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Others may read the file.
    #[error("{path} holds a secret and may be read by other users (mode {mode:o}); run `chmod 600 {path}`")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is not a key file.
    #[error("key file {path}, line {line}: {why}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The file holds no key.
    #[error("key file {0} holds no key")]
    Empty(PathBuf),
}

/// One key: a role and a 32-byte secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    role: Role,
    secret: [u8; KEY_LEN],
    /// Connections made with this key run inside TLS (`--tls`).
    tls: bool,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        write!(f, "Key({} {})", self.role, self.id_hex())
    }
}

fn hmac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length: `new_from_slice` cannot fail here.
    let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

impl Key {
    /// A new volume key from the operating system's random source.
    pub fn generate() -> Key {
        let mut secret = [0u8; KEY_LEN];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
        Key {
            role: Role::Server,
            secret,
            tls: false,
        }
    }

    /// A key from its parts (tests, and the key file reader).
    pub fn from_parts(role: Role, secret: [u8; KEY_LEN]) -> Key {
        Key {
            role,
            secret,
            tls: false,
        }
    }

    /// Whether connections made with this key run inside TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// What this key lets its holder do.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The client key of this volume key (itself if it is a client key).
    pub fn client_key(&self) -> Key {
        match self.role {
            Role::Client => self.clone(),
            Role::Server => Key {
                role: Role::Client,
                secret: hmac(&self.secret, &[b"morris client key v1"]),
                tls: self.tls,
            },
        }
    }

    /// A public name for the key (not secret): which key a peer presents.
    pub fn id(&self) -> [u8; 8] {
        let h = hmac(
            &self.secret,
            &[b"morris key id v1", self.role.as_str().as_bytes()],
        );
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[..8]);
        id
    }

    /// [`Key::id`] in hex, for messages.
    pub fn id_hex(&self) -> String {
        hex_of(&self.id())
    }

    /// HMAC-SHA256 of `parts` under this key.
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        hmac(&self.secret, parts)
    }

    /// Checks a MAC in constant time.
    pub(crate) fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.secret) {
            Ok(m) => m,
            Err(_) => return false,
        };
        for p in parts {
            m.update(p);
        }
        m.verify_slice(tag).is_ok()
    }

    /// The key as one line of a key file.
    pub fn to_line(&self) -> String {
        format!(
            "{KEY_TAG} {} {}",
            self.role,
            base64::engine::general_purpose::STANDARD.encode(self.secret)
        )
    }
}

/// Hex of a short byte string.
pub fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses key file text (`path` for messages only).
pub fn parse_keys(path: &Path, text: &str) -> Result<Vec<Key>, KeyError> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: String| KeyError::Syntax {
            path: path.to_path_buf(),
            line: n + 1,
            why,
        };
        let mut words = line.split_whitespace();
        let (Some(tag), Some(role), Some(secret), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(bad(format!("expected `{KEY_TAG} server|client BASE64`")));
        };
        if tag != KEY_TAG {
            return Err(bad(format!(
                "unknown key format `{tag}` (expected {KEY_TAG})"
            )));
        }
        let role = match role {
            "server" => Role::Server,
            "client" => Role::Client,
            other => return Err(bad(format!("unknown role `{other}` (server or client)"))),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(secret)
            .map_err(|e| bad(format!("the secret is not base64: {e}")))?;
        let secret: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            bad(format!(
                "the secret has {} bytes, not {KEY_LEN}",
                bytes.len()
            ))
        })?;
        keys.push(Key {
            role,
            secret,
            tls: false,
        });
    }
    if keys.is_empty() {
        return Err(KeyError::Empty(path.to_path_buf()));
    }
    Ok(keys)
}

/// Writes `keys` to a new file readable by its owner only (never over an
/// existing file).
pub fn write_key_file(path: &Path, keys: &[Key], comment: &str) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    let mut text = String::new();
    for l in comment.lines() {
        text.push_str("# ");
        text.push_str(l);
        text.push('\n');
    }
    for k in keys {
        text.push_str(&k.to_line());
        text.push('\n');
    }
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(())
}

/// Identity of a file's contents as far as re-reading is concerned.
type Stamp = (SystemTime, u64, u64);

struct Loaded {
    stamp: Option<Stamp>,
    /// The key that connects.
    first: Key,
    /// Keys accepted besides it.
    rest: Vec<Key>,
}

impl Loaded {
    fn all(&self) -> impl Iterator<Item = &Key> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }
}

/// The keys a process holds: the first connects, all are accepted. Read from
/// a key file (read again when the file changes, so a rotation needs no
/// restart) or given in memory.
#[derive(Clone)]
pub struct Keys {
    path: Option<PathBuf>,
    loaded: Arc<Mutex<Loaded>>,
    /// Connect inside TLS, and (a server) accept only connections inside TLS.
    tls: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.loaded.lock();
        f.debug_struct("Keys")
            .field("path", &self.path)
            .field("keys", &l.all().collect::<Vec<_>>())
            .finish()
    }
}

impl PartialEq for Keys {
    fn eq(&self, other: &Self) -> bool {
        if Arc::ptr_eq(&self.loaded, &other.loaded) {
            // One lock: taking it twice would wait forever.
            return true;
        }
        let (a, b) = (self.loaded.lock(), other.loaded.lock());
        self.path == other.path && self.tls == other.tls && a.all().eq(b.all())
    }
}
impl Eq for Keys {}

/// Reads a file that holds a secret (a key, a password): refused if users
/// other than its owner may read it.
pub fn read_secret(path: &Path) -> Result<(std::fs::Metadata, Vec<u8>), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    Ok((meta, bytes))
}

fn read_file(path: &Path) -> Result<(Stamp, Key, Vec<Key>), KeyError> {
    let (meta, bytes) = read_secret(path)?;
    let text = String::from_utf8(bytes).map_err(|e| KeyError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let mut keys = parse_keys(path, &text)?.into_iter();
    let first = keys
        .next()
        .ok_or_else(|| KeyError::Empty(path.to_path_buf()))?;
    let stamp = (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
        meta.ino(),
    );
    Ok((stamp, first, keys.collect()))
}

fn stamp_of(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        m.len(),
        m.ino(),
    ))
}

impl Keys {
    /// Reads a key file (refused if others may read it).
    pub fn load(path: &Path) -> Result<Keys, KeyError> {
        let (stamp, first, rest) = read_file(path)?;
        Ok(Keys {
            path: Some(path.to_path_buf()),
            loaded: Arc::new(Mutex::new(Loaded {
                stamp: Some(stamp),
                first,
                rest,
            })),
            tls: false,
        })
    }

    /// One key held in memory only (tests, in-process servers).
    pub fn from_key(key: Key) -> Keys {
        let tls = key.tls;
        Keys {
            path: None,
            loaded: Arc::new(Mutex::new(Loaded {
                stamp: None,
                first: key,
                rest: Vec::new(),
            })),
            tls,
        }
    }

    /// The key file, if the keys came from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again if it changed since it was read; a file that
    /// became unreadable or invalid keeps the keys read before (and says so).
    fn refresh(&self) {
        let Some(path) = &self.path else { return };
        let now = stamp_of(path);
        if now.is_some() && now == self.loaded.lock().stamp {
            return;
        }
        match read_file(path) {
            Ok((stamp, first, rest)) => {
                tracing::info!(path = %path.display(), keys = 1 + rest.len(), "key file read again");
                let mut l = self.loaded.lock();
                l.stamp = Some(stamp);
                l.first = first;
                l.rest = rest;
            }
            Err(e) => {
                tracing::warn!(error = %e, "key file changed but cannot be used; keeping the keys read before")
            }
        }
    }

    /// The key this process connects with (the first of the file).
    pub fn credential(&self) -> Key {
        self.refresh();
        let mut k = self.loaded.lock().first.clone();
        k.tls = self.tls;
        k
    }

    /// These keys with connections inside TLS (`--tls`): every connection
    /// made with them runs in TLS, and a server holding them refuses
    /// connections that do not.
    pub fn with_tls(mut self, tls: bool) -> Keys {
        self.tls = tls;
        self
    }

    /// Whether connections run inside TLS ([`Keys::with_tls`]).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The key that a peer presenting `role` and `id` must hold, if it is
    /// one this process accepts: its own keys, and the client keys of its
    /// volume keys.
    pub fn find(&self, role: Role, id: &[u8; 8]) -> Option<Key> {
        self.refresh();
        let l = self.loaded.lock();
        let found = l
            .all()
            .flat_map(|k| {
                [
                    Some(k.clone()),
                    (k.role == Role::Server).then(|| k.client_key()),
                ]
            })
            .flatten()
            .find(|k| k.role == role && &k.id() == id);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_round_trips_and_refuses_bad_lines() {
        let k = Key::generate();
        let text = format!(
            "# comment\n\n{}\n{}\n",
            k.to_line(),
            k.client_key().to_line()
        );
        let keys = parse_keys(Path::new("k"), &text).unwrap();
        assert_eq!(keys, vec![k.clone(), k.client_key()]);
        for bad in [
            "morris-key-v1 server",
            "morris-key-v2 server AAAA",
            "morris-key-v1 admin AAAA",
            "morris-key-v1 server !!!",
            "morris-key-v1 server AAAA",
            "morris-key-v1 server AAAA extra",
            "# only a comment",
        ] {
            assert!(parse_keys(Path::new("k"), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_server_accepts_its_client_key_but_a_client_accepts_no_server_key() {
        let v = Key::generate();
        let c = v.client_key();
        assert_ne!(v.id(), c.id());
        let server = Keys::from_key(v.clone());
        assert_eq!(server.find(Role::Client, &c.id()), Some(c.clone()));
        assert_eq!(server.find(Role::Server, &v.id()), Some(v.clone()));
        // A client id presented as a server's (or the reverse) is unknown.
        assert_eq!(server.find(Role::Server, &c.id()), None);
        let client = Keys::from_key(c.clone());
        assert_eq!(client.find(Role::Server, &v.id()), None);
        assert_eq!(client.credential(), c);
        // A clone shares the keys (and compares equal without waiting on itself).
        assert_eq!(client.clone(), client);
    }

    #[test]
    fn a_key_file_readable_by_others_is_refused_and_a_changed_one_read_again() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("volume.key");
        let a = Key::generate();
        write_key_file(&p, std::slice::from_ref(&a), "test").unwrap();
        let keys = Keys::load(&p).unwrap();
        assert_eq!(keys.credential(), a);
        // Rotation: a new key first, the old one still accepted.
        let b = Key::generate();
        std::fs::remove_file(&p).unwrap();
        write_key_file(&p, &[b.clone(), a.clone()], "test").unwrap();
        assert_eq!(keys.credential(), b);
        assert!(keys.find(Role::Server, &a.id()).is_some());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Keys::load(&p), Err(KeyError::Exposed { .. })));
    }
}
