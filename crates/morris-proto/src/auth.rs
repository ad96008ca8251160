//! Identity on the wire: the volume's keys ([`keys`]) and the handshake
//! that proves a connection holds one ([`handshake`]), run by
//! [`crate::net`] before any request is read.

pub mod handshake;
pub mod keys;

pub use handshake::{HandshakeError, HANDSHAKE_VERSION};
pub use keys::{Key, KeyError, Keys, Role};
