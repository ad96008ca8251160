//! The morris wire protocol.
//!
//! This crate is the bottom of the workspace: the stripe server and the client
//! library both depend on it and on nothing of each other. It holds
//!
//! * [`types`]: the values that cross the wire (file handles, inodes, attributes,
//!   the volume descriptor);
//! * [`messages`]: every request, reply and server push, with the rules each
//!   one obeys (which lease it takes, what it orders);
//! * [`frame`]: the length-framed binary encoding, whose decoder never panics;
//! * [`net`]: a multiplexed RPC connection on tokio (many requests in flight,
//!   server pushes on the same socket) and the server-side accept loop;
//! * [`acl`]: POSIX ACLs in their extended-attribute form, as pure functions;
//! * [`auth`]: the volume's keys and the handshake that opens every connection;
//! * [`layout`]: where a block lives (`(file id + index) mod k`), as pure functions.
//! * [`placement`]: per-file server lists, and the plans that change them when members are added or drained.

pub mod acl;
pub mod auth;
pub mod error;
pub mod frame;
pub mod home;
pub mod layout;
pub mod locks;
pub mod messages;
pub mod net;
pub mod observe;
pub mod placement;
pub mod quota;
pub mod tls;
pub mod types;

pub use error::{ErrorCode, WireError};
pub use messages::{BindingStatus, LeaseHolder, Orphan, Push, Reply, Request, WbHome, WbMark};
pub use types::*;

/// Most copies of each block a volume may keep.
pub const MAX_REPLICAS: u8 = 3;

/// Version of the wire protocol; a `Hello` with another version is refused.
pub const PROTOCOL_VERSION: u32 = 28;
