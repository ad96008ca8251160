//! The frame encoding.
//!
//! On the socket every frame is a 4-byte big-endian length followed by that
//! many bytes of body (`tokio_util`'s `LengthDelimitedCodec`). The body is:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | kind: 0 request, 1 response, 2 push |
//! | 8 | request id (big-endian; 0 for pushes) |
//! | 4 | header length `h` (big-endian) |
//! | h | header: postcard-encoded [`Request`], `Result<Reply, WireError>` or [`Push`] |
//! | rest | payload (block data), carried as `Bytes` without copying |
//!
//! [`decode_frame`] checks every length and never panics; it is the fuzz target.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};

use crate::error::WireError;
use crate::messages::{Push, Reply, Request};

/// Largest frame body accepted: the largest stripe unit plus room for a header.
pub const MAX_FRAME: usize = (64 << 20) + (1 << 20);
/// Largest header accepted.
pub const MAX_HEADER: usize = 1 << 20;
/// Bytes before the header.
pub const PREFIX_LEN: usize = 1 + 8 + 4;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Client to server.
    Request,
    /// Server to client, answering a request id.
    Response,
    /// Server to client, unasked.
    Push,
}

impl FrameKind {
    fn to_u8(self) -> u8 {
        match self {
            FrameKind::Request => 0,
            FrameKind::Response => 1,
            FrameKind::Push => 2,
        }
    }
}

/// A decoded frame body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: FrameKind,
    /// The request id it belongs to.
    pub id: u64,
    /// The encoded header.
    pub header: Bytes,
    /// The payload.
    pub payload: Bytes,
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than the fixed prefix.
    #[error("frame of {0} bytes is shorter than its {PREFIX_LEN}-byte prefix")]
    Short(usize),
    /// The kind byte is not 0, 1 or 2.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The header length passes the end of the frame or the limit.
    #[error("header length {0} does not fit the frame")]
    BadHeaderLen(usize),
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// The header is not a valid message.
    #[error("undecodable header: {0}")]
    Header(String),
}

/// Splits a frame body into its parts without copying the payload.
pub fn decode_frame(mut body: Bytes) -> Result<Frame, FrameError> {
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    if body.len() < PREFIX_LEN {
        return Err(FrameError::Short(body.len()));
    }
    let kind = match body.get_u8() {
        0 => FrameKind::Request,
        1 => FrameKind::Response,
        2 => FrameKind::Push,
        k => return Err(FrameError::UnknownKind(k)),
    };
    let id = body.get_u64();
    let hlen = body.get_u32() as usize;
    if hlen > MAX_HEADER || hlen > body.len() {
        return Err(FrameError::BadHeaderLen(hlen));
    }
    let header = body.split_to(hlen);
    Ok(Frame {
        kind,
        id,
        header,
        payload: body,
    })
}

/// Encodes the length prefix, fixed prefix and header of a frame whose payload
/// (`payload_len` bytes) the caller writes right after the returned bytes.
pub fn encode_frame_head<T: Serialize>(
    kind: FrameKind,
    id: u64,
    header: &T,
    payload_len: usize,
) -> Result<Bytes, FrameError> {
    let h = postcard::to_stdvec(header).map_err(|e| FrameError::Header(e.to_string()))?;
    if h.len() > MAX_HEADER {
        return Err(FrameError::BadHeaderLen(h.len()));
    }
    let body_len = PREFIX_LEN + h.len() + payload_len;
    if body_len > MAX_FRAME {
        return Err(FrameError::TooLarge(body_len));
    }
    let mut out = BytesMut::with_capacity(4 + PREFIX_LEN + h.len());
    out.put_u32(body_len as u32);
    out.put_u8(kind.to_u8());
    out.put_u64(id);
    out.put_u32(h.len() as u32);
    out.put_slice(&h);
    Ok(out.freeze())
}

fn decode_header<T: DeserializeOwned>(header: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(header).map_err(|e| FrameError::Header(e.to_string()))
}

/// Decodes a request header.
pub fn decode_request(header: &[u8]) -> Result<Request, FrameError> {
    decode_header(header)
}

/// Decodes a response header.
pub fn decode_response(header: &[u8]) -> Result<Result<Reply, WireError>, FrameError> {
    decode_header(header)
}

/// Decodes a push header.
pub fn decode_push(header: &[u8]) -> Result<Push, FrameError> {
    decode_header(header)
}

/// Decodes a whole frame body of any kind down to its message; the fuzz entry point.
pub fn decode_any(body: &[u8]) -> Result<(), FrameError> {
    let f = decode_frame(Bytes::copy_from_slice(body))?;
    match f.kind {
        FrameKind::Request => decode_request(&f.header).map(|_| ()),
        FrameKind::Response => decode_response(&f.header).map(|_| ()),
        FrameKind::Push => decode_push(&f.header).map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Handle;

    #[test]
    fn round_trip_request_with_payload() {
        let req = Request::Write {
            id: 7,
            index: 3,
            replica: 1,
            offset: 12,
            sync: true,
            fence: 9,
        };
        let head = encode_frame_head(FrameKind::Request, 42, &req, 5).unwrap();
        let mut wire = BytesMut::from(&head[..]);
        wire.put_slice(b"hello");
        let len = (&wire[..4]).get_u32() as usize;
        assert_eq!(len, wire.len() - 4);
        let f = decode_frame(wire.freeze().slice(4..)).unwrap();
        assert_eq!(f.kind, FrameKind::Request);
        assert_eq!(f.id, 42);
        assert_eq!(decode_request(&f.header).unwrap(), req);
        assert_eq!(&f.payload[..], b"hello");
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(matches!(
            decode_frame(Bytes::new()),
            Err(FrameError::Short(0))
        ));
        let mut b = BytesMut::new();
        b.put_u8(9);
        b.put_u64(1);
        b.put_u32(0);
        assert!(matches!(
            decode_frame(b.freeze()),
            Err(FrameError::UnknownKind(9))
        ));
        let mut b = BytesMut::new();
        b.put_u8(0);
        b.put_u64(1);
        b.put_u32(1000);
        b.put_slice(&[0; 10]);
        assert!(matches!(
            decode_frame(b.freeze()),
            Err(FrameError::BadHeaderLen(1000))
        ));
        // An unknown opcode: a variant index far past the enum.
        assert!(decode_request(&[200, 1]).is_err());
        // A truncated header.
        let h = postcard::to_stdvec(&Request::AcquireRead {
            ino: Handle { id: 1, gen: 1 },
        })
        .unwrap();
        assert!(decode_request(&h[..h.len() - 1]).is_err());
        // A huge declared vector length must not allocate or panic.
        assert!(decode_request(&[12, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
