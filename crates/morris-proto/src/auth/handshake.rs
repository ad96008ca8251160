//! The handshake that opens every connection: both ends prove they hold a
//! key of the volume, before any request is read.
//!
//! | step | from → to | message | what the receiver checks |
//! |---|---|---|---|
//! | 1 | client → server | `Hi { version, role, key_id, client_nonce }` | it knows a key of that role and id; otherwise `Refused` |
//! | 2 | server → client | `Challenge { server_nonce, proof = MAC(key, "server" ‖ transcript) }` | the server holds the key (a fake server is refused) |
//! | 3 | client → server | `Proof { proof = MAC(key, "client" ‖ transcript) }` | the client holds the key; otherwise `Refused` |
//! | 4 | server → client | `Welcome` or `Refused { reason }` | |
//!
//! The transcript is the version, role, key id and both 32-byte nonces; the
//! MAC is HMAC-SHA256 (the `hmac` and `sha2` crates). A recorded handshake
//! cannot be replayed: the server's nonce is new on every connection, so
//! the recorded client proof does not match it. The two proofs are labelled
//! apart, so one cannot stand for the other. Each message is a 4-byte
//! big-endian length and a postcard body of at most [`MAX_HS_FRAME`] bytes,
//! read with exact reads (no byte of the session that follows is consumed).
//!
//! What the handshake does not do: bind the rest of the connection. An
//! attacker who can rewrite packets between two hosts can take over a TCP
//! connection once it is open (the threat table in docs/architecture.md).

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::keys::{hex_of, Key, Keys, Role};

/// Version of the handshake.
pub const HANDSHAKE_VERSION: u16 = 1;
/// Identifies a morris handshake (and not, say, an old client's request).
const MAGIC: [u8; 8] = *b"morrisHS";
/// Largest handshake message.
pub const MAX_HS_FRAME: usize = 512;

/// One handshake message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hs {
    /// Step 1.
    Hi {
        /// The bytes `morrisHS`.
        magic: [u8; 8],
        /// [`HANDSHAKE_VERSION`].
        version: u16,
        /// The role of the key the client presents.
        role: Role,
        /// Which key.
        key_id: [u8; 8],
        /// Fresh random bytes.
        nonce: [u8; 32],
    },
    /// Step 2.
    Challenge {
        /// Fresh random bytes.
        nonce: [u8; 32],
        /// The server's proof.
        proof: [u8; 32],
    },
    /// Step 3.
    Proof {
        /// The client's proof.
        proof: [u8; 32],
    },
    /// Step 4: the session may start.
    Welcome,
    /// The connection is refused, and why.
    Refused {
        /// Why.
        reason: String,
    },
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The other end refused us.
    #[error("refused: {0}")]
    Refused(String),
    /// The other end is not who it should be, or broke the protocol.
    #[error("{0}")]
    Bad(String),
    /// The connection failed or ended.
    #[error("connection lost during the handshake: {0}")]
    Io(String),
}

/// Decodes one handshake message body; never panics.
pub fn decode_hs(body: &[u8]) -> Result<Hs, HandshakeError> {
    if body.len() > MAX_HS_FRAME {
        return Err(HandshakeError::Bad("handshake message too long".into()));
    }
    match postcard::from_bytes::<Hs>(body) {
        Ok(Hs::Refused { reason }) => Ok(Hs::Refused {
            reason: reason.chars().take(200).collect(),
        }),
        Ok(m) => Ok(m),
        Err(e) => Err(HandshakeError::Bad(format!(
            "not a morris handshake message ({e}); is the other end a morris server of this version?"
        ))),
    }
}

fn encode_hs(m: &Hs) -> Vec<u8> {
    let body = postcard::to_allocvec(m).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// What both proofs cover: the version, role, key id, both nonces and, on
/// a TLS connection, the TLS session's exported keying material (so the
/// proofs are valid on that session only: a man in the middle who ends
/// TLS on each side has two sessions with different bindings).
fn transcript<'a>(
    label: &'a [u8],
    role: Role,
    key_id: &'a [u8; 8],
    cn: &'a [u8; 32],
    sn: &'a [u8; 32],
    binding: &'a [u8],
) -> Vec<&'a [u8]> {
    let role: &'static [u8] = match role {
        Role::Client => b"C",
        Role::Server => b"S",
    };
    let mut parts: Vec<&[u8]> = vec![label, &[0, 1], role, key_id, cn, sn];
    if !binding.is_empty() {
        parts.extend([b"tls".as_slice(), binding]);
    }
    parts
}

const SERVER_LABEL: &[u8] = b"morris handshake v1: server proof";
const CLIENT_LABEL: &[u8] = b"morris handshake v1: client proof";

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut n);
    n
}

/// A server between steps 2 and 3.
pub struct Challenged {
    key: Key,
    client_nonce: [u8; 32],
    server_nonce: [u8; 32],
    binding: Vec<u8>,
}

/// Server, step 1 → 2: the answer to a `Hi` (a `Challenge`, or the reason to
/// refuse). Pure, so it can be fuzzed.
/// `binding` is the TLS session's exported keying material (empty on a
/// plain connection).
pub fn server_on_hi(keys: &Keys, body: &[u8], binding: &[u8]) -> Result<(Challenged, Hs), String> {
    let (version, role, key_id, cn) = match decode_hs(body) {
        Ok(Hs::Hi {
            magic,
            version,
            role,
            key_id,
            nonce,
        }) if magic == MAGIC => (version, role, key_id, nonce),
        Ok(_) | Err(_) => {
            return Err(
                "expected a morris handshake (is this client older than protocol 13?)".into(),
            )
        }
    };
    if version != HANDSHAKE_VERSION {
        return Err(format!(
            "handshake version {version} is not supported (this server speaks {HANDSHAKE_VERSION})"
        ));
    }
    let Some(key) = keys.find(role, &key_id) else {
        return Err(format!(
            "{role} key {} is not a key of this volume",
            hex_of(&key_id)
        ));
    };
    let sn = nonce();
    let proof = key.mac(&transcript(SERVER_LABEL, role, &key_id, &cn, &sn, binding));
    Ok((
        Challenged {
            key,
            client_nonce: cn,
            server_nonce: sn,
            binding: binding.to_vec(),
        },
        Hs::Challenge { nonce: sn, proof },
    ))
}

/// Server, step 3: the client's proof checked; the role it holds.
pub fn server_on_proof(c: &Challenged, body: &[u8]) -> Result<Role, String> {
    let Ok(Hs::Proof { proof }) = decode_hs(body) else {
        return Err("expected the client's proof".into());
    };
    let role = c.key.role();
    let id = c.key.id();
    if c.key.verify(
        &transcript(
            CLIENT_LABEL,
            role,
            &id,
            &c.client_nonce,
            &c.server_nonce,
            &c.binding,
        ),
        &proof,
    ) {
        Ok(role)
    } else {
        Err(format!(
            "wrong proof for {role} key {}: the client does not hold it",
            hex_of(&id)
        ))
    }
}

async fn read_msg<S: AsyncRead + Unpin>(s: &mut S) -> Result<Vec<u8>, HandshakeError> {
    let io = |e: std::io::Error| HandshakeError::Io(e.to_string());
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(io)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_HS_FRAME {
        return Err(HandshakeError::Bad(format!(
            "a handshake message of {len} bytes (at most {MAX_HS_FRAME}): is the other end a morris of this version?"
        )));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.map_err(io)?;
    Ok(body)
}

async fn write_msg<S: AsyncWrite + Unpin>(s: &mut S, m: &Hs) -> Result<(), HandshakeError> {
    let io = |e: std::io::Error| HandshakeError::Io(e.to_string());
    s.write_all(&encode_hs(m)).await.map_err(io)?;
    s.flush().await.map_err(io)
}

/// Runs the server's side on a new connection: the role the client proved.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    keys: &Keys,
    binding: &[u8],
) -> Result<Role, HandshakeError> {
    let hi = read_msg(s).await?;
    let (state, challenge) = match server_on_hi(keys, &hi, binding) {
        Ok(x) => x,
        Err(reason) => {
            let _ = write_msg(
                s,
                &Hs::Refused {
                    reason: reason.clone(),
                },
            )
            .await;
            return Err(HandshakeError::Refused(reason));
        }
    };
    write_msg(s, &challenge).await?;
    let proof = read_msg(s).await?;
    match server_on_proof(&state, &proof) {
        Ok(role) => {
            write_msg(s, &Hs::Welcome).await?;
            Ok(role)
        }
        Err(reason) => {
            let _ = write_msg(
                s,
                &Hs::Refused {
                    reason: reason.clone(),
                },
            )
            .await;
            Err(HandshakeError::Refused(reason))
        }
    }
}

/// Reads a client's `Hi` and refuses it with `reason` (a server that takes
/// no connection of this kind, e.g. one outside TLS).
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    reason: &str,
) -> Result<(), HandshakeError> {
    let _ = read_msg(s).await?;
    write_msg(
        s,
        &Hs::Refused {
            reason: reason.to_string(),
        },
    )
    .await
}

/// Runs the client's side with `key`: Ok once the server proved it holds
/// the key and accepted ours.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &Key,
    binding: &[u8],
) -> Result<(), HandshakeError> {
    let cn = nonce();
    let role = key.role();
    let id = key.id();
    write_msg(
        s,
        &Hs::Hi {
            magic: MAGIC,
            version: HANDSHAKE_VERSION,
            role,
            key_id: id,
            nonce: cn,
        },
    )
    .await?;
    let (sn, server_proof) = match decode_hs(&read_msg(s).await?)? {
        Hs::Challenge { nonce, proof } => (nonce, proof),
        Hs::Refused { reason } => return Err(HandshakeError::Refused(reason)),
        other => {
            return Err(HandshakeError::Bad(format!(
                "unexpected handshake message {other:?}"
            )))
        }
    };
    if !key.verify(
        &transcript(SERVER_LABEL, role, &id, &cn, &sn, binding),
        &server_proof,
    ) {
        return Err(HandshakeError::Bad(format!(
            "the server does not hold {role} key {}: not a server of this volume",
            hex_of(&id)
        )));
    }
    let proof = key.mac(&transcript(CLIENT_LABEL, role, &id, &cn, &sn, binding));
    write_msg(s, &Hs::Proof { proof }).await?;
    match decode_hs(&read_msg(s).await?)? {
        Hs::Welcome => Ok(()),
        Hs::Refused { reason } => Err(HandshakeError::Refused(reason)),
        other => Err(HandshakeError::Bad(format!(
            "unexpected handshake message {other:?}"
        ))),
    }
}

/// For fuzzing: the server's steps on arbitrary bytes (never panics).
pub fn fuzz_server(data: &[u8]) {
    let key = Key::from_parts(Role::Server, [7; 32]);
    let keys = Keys::from_key(key.clone());
    let _ = decode_hs(data);
    let _ = server_on_hi(&keys, data, &[]);
    // A valid Hi, then the bytes as the proof.
    let hi = encode_hs(&Hs::Hi {
        magic: MAGIC,
        version: HANDSHAKE_VERSION,
        role: Role::Client,
        key_id: key.client_key().id(),
        nonce: [1; 32],
    });
    if let Ok((state, _)) = server_on_hi(&keys, &hi[4..], &[]) {
        let _ = server_on_proof(&state, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(
        server_keys: Keys,
        client_key: Key,
    ) -> (Result<Role, HandshakeError>, Result<(), HandshakeError>) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let srv = tokio::spawn(async move { accept(&mut a, &server_keys, &[]).await });
        let cli = connect(&mut b, &client_key, &[]).await;
        (srv.await.unwrap(), cli)
    }

    #[tokio::test]
    async fn the_right_keys_get_their_roles_and_others_are_refused() {
        let v = Key::generate();
        let keys = Keys::from_key(v.clone());
        let (s, c) = pair(keys.clone(), v.client_key()).await;
        assert_eq!((s, c), (Ok(Role::Client), Ok(())));
        let (s, c) = pair(keys.clone(), v.clone()).await;
        assert_eq!((s, c), (Ok(Role::Server), Ok(())));
        // Another volume's key.
        let (s, c) = pair(keys.clone(), Key::generate().client_key()).await;
        assert!(matches!(s, Err(HandshakeError::Refused(_))));
        assert!(
            matches!(c, Err(HandshakeError::Refused(r)) if r.contains("not a key of this volume"))
        );
        // The right id with a wrong secret (a forged key id).
        let forged = Key::from_parts(Role::Client, [9; 32]);
        let hi_id = v.client_key().id();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let srv = tokio::spawn(async move { accept(&mut a, &keys, &[]).await });
        write_msg(
            &mut b,
            &Hs::Hi {
                magic: MAGIC,
                version: HANDSHAKE_VERSION,
                role: Role::Client,
                key_id: hi_id,
                nonce: [3; 32],
            },
        )
        .await
        .unwrap();
        let Hs::Challenge { nonce, .. } = decode_hs(&read_msg(&mut b).await.unwrap()).unwrap()
        else {
            panic!("no challenge")
        };
        let proof = forged.mac(&transcript(
            CLIENT_LABEL,
            Role::Client,
            &hi_id,
            &[3; 32],
            &nonce,
            &[],
        ));
        write_msg(&mut b, &Hs::Proof { proof }).await.unwrap();
        assert!(matches!(
            decode_hs(&read_msg(&mut b).await.unwrap()).unwrap(),
            Hs::Refused { .. }
        ));
        assert!(srv.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn proofs_made_on_another_tls_session_fail() {
        // A man in the middle ending TLS on both sides relays the morris
        // handshake between two sessions with different bindings.
        let v = Key::generate();
        let keys = Keys::from_key(v.clone());
        let (mut a, mut b) = tokio::io::duplex(4096);
        let srv = tokio::spawn(async move { accept(&mut a, &keys, &[1; 32]).await });
        let cli = connect(&mut b, &v.client_key(), &[2; 32]).await;
        assert!(
            cli.is_err(),
            "the client believed a proof from another session"
        );
        drop(b);
        assert!(srv.await.unwrap().is_err());
        // The same binding on both ends: accepted.
        let keys = Keys::from_key(v.clone());
        let (mut a, mut b) = tokio::io::duplex(4096);
        let srv = tokio::spawn(async move { accept(&mut a, &keys, &[5; 32]).await });
        connect(&mut b, &v.client_key(), &[5; 32]).await.unwrap();
        assert_eq!(srv.await.unwrap().unwrap(), Role::Client);
    }

    #[tokio::test]
    async fn a_server_without_the_key_is_not_believed() {
        // The server knows a key with the client's id? It cannot: ids come
        // from secrets. A server that answers with some proof is refused.
        let v = Key::generate();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let fake = tokio::spawn(async move {
            let _ = read_msg(&mut a).await;
            write_msg(
                &mut a,
                &Hs::Challenge {
                    nonce: [5; 32],
                    proof: [6; 32],
                },
            )
            .await
        });
        let r = connect(&mut b, &v.client_key(), &[]).await;
        assert!(
            matches!(r, Err(HandshakeError::Bad(m)) if m.contains("not a server of this volume"))
        );
        let _ = fake.await;
    }

    #[test]
    fn fuzz_entry_takes_any_bytes() {
        for data in [&b""[..], &[0xff; 600], &[0, 0, 0, 0], b"morrisHS"] {
            fuzz_server(data);
        }
    }
}
