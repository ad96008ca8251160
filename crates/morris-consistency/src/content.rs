//! Self-verifying file contents ("blobs") for the workloads that replace or
//! recreate whole files: a 48-byte header (magic, stream, version, length,
//! body checksum, header checksum) and a body that is a pure function of
//! (run seed, stream, version, offset). Any byte of any version can be
//! regenerated, so a verifier tells a complete valid version from zeros, a
//! short file, a mix of two versions or garbage, and says where.
//!
//! Everything here is pure (no I/O): unit-tested, including the cases a
//! broken file system produces.

use crate::rng::mix64;

/// First bytes of every blob.
pub const MAGIC: &[u8; 4] = b"MCV1";
/// Length of the header; every blob is at least this long.
pub const HEADER_LEN: usize = 48;

/// The body key of one version of one stream.
fn key(run_seed: u64, stream: u32, version: u64) -> u64 {
    mix64(mix64(run_seed ^ 0x5eed_b10b) ^ mix64(u64::from(stream) << 32) ^ mix64(version))
}

/// Byte `pos` (file offset) of the body with key `k`.
fn body_byte(k: u64, pos: u64) -> u8 {
    mix64(k ^ (pos / 8).wrapping_mul(0xA24B_AED4_963E_E407)).to_le_bytes()[(pos % 8) as usize]
}

/// Fills `out` with the body bytes of key `k` starting at file offset `from`.
fn fill_body(k: u64, from: u64, out: &mut [u8]) {
    let mut pos = from;
    let mut i = 0;
    while i < out.len() {
        let word = mix64(k ^ (pos / 8).wrapping_mul(0xA24B_AED4_963E_E407)).to_le_bytes();
        let start = (pos % 8) as usize;
        let take = (8 - start).min(out.len() - i);
        out[i..i + take].copy_from_slice(&word[start..start + take]);
        i += take;
        pos += take as u64;
    }
}

/// Checksum of a body (FNV-1a over its bytes, then mixed).
fn checksum(body: &[u8]) -> u64 {
    let h = body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    mix64(h)
}

fn header_sum(h: &[u8]) -> u64 {
    checksum(&h[..32]) ^ 0x4845_4144
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Builds version `version` of stream `stream`, `len` bytes long (at least
/// [`HEADER_LEN`]).
pub fn build(run_seed: u64, stream: u32, version: u64, len: usize) -> Vec<u8> {
    let len = len.max(HEADER_LEN);
    let mut out = vec![0u8; len];
    fill_body(
        key(run_seed, stream, version),
        HEADER_LEN as u64,
        &mut out[HEADER_LEN..],
    );
    let sum = checksum(&out[HEADER_LEN..]);
    out[0..4].copy_from_slice(MAGIC);
    out[4..8].copy_from_slice(&stream.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    out[16..24].copy_from_slice(&(len as u64).to_le_bytes());
    out[24..32].copy_from_slice(&sum.to_le_bytes());
    let hs = header_sum(&out);
    out[32..40].copy_from_slice(&hs.to_le_bytes());
    out[40..48].copy_from_slice(b"--------");
    out
}

/// What a valid blob (or valid prefix of one) says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobInfo {
    /// The stream (file name index) it was written for.
    pub stream: u32,
    /// Its version (generation).
    pub version: u64,
    /// Its full length according to its header.
    pub len: u64,
}

/// Why some bytes are not a valid blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    /// Nothing was read.
    #[error("empty (0 bytes)")]
    Empty,
    /// Every byte read is zero.
    #[error("{len} zero bytes (no header; all zeros)")]
    Zeros {
        /// How many bytes were read.
        len: usize,
    },
    /// Fewer bytes than a header.
    #[error("only {got} bytes, less than a {HEADER_LEN}-byte header: {hex}")]
    ShortHeader {
        /// How many bytes were read.
        got: usize,
        /// Those bytes, in hex.
        hex: String,
    },
    /// The header is not a blob header.
    #[error("no valid header: first bytes {hex}{zeros}", zeros = if *zeros_after { " (zeros follow)" } else { "" })]
    BadHeader {
        /// The first bytes, in hex.
        hex: String,
        /// Whether the bytes after the header are all zero.
        zeros_after: bool,
    },
    /// The header is valid but names another stream.
    #[error("header of stream {got} (version {version}), expected stream {want}")]
    WrongStream {
        /// Stream expected.
        want: u32,
        /// Stream found.
        got: u32,
        /// Its version.
        version: u64,
    },
    /// The length read differs from the header's.
    #[error("version {version}: read {got} bytes but its header says {header_len} ({what})", what = if (*got as u64) < *header_len { "short" } else { "too long" })]
    Length {
        /// Version in the header.
        version: u64,
        /// Length in the header.
        header_len: u64,
        /// Bytes read.
        got: usize,
    },
    /// Body bytes differ from the version's.
    #[error("version {version} ({header_len} bytes): {differing} bytes differ, first at offset {offset}: got {got_hex}, want {want_hex}{zeros}{other}",
        zeros = if *zeros_there { " (zeros there)" } else { "" },
        other = other_version.map(|v| format!(" (matches version {v} there: a mix of versions)")).unwrap_or_default())]
    Body {
        /// Version in the header.
        version: u64,
        /// Length in the header.
        header_len: u64,
        /// First differing file offset.
        offset: usize,
        /// Number of differing bytes.
        differing: usize,
        /// Bytes found there (hex, up to 16).
        got_hex: String,
        /// Bytes expected there (hex, up to 16).
        want_hex: String,
        /// Whether the bytes found there are zeros.
        zeros_there: bool,
        /// A nearby version whose bytes are there instead.
        other_version: Option<u64>,
    },
}

impl BlobError {
    /// A short class for counting: `zero-read`, `short-read`, `mixed-versions`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            BlobError::Empty => "empty-read",
            BlobError::Zeros { .. } => "zero-read",
            BlobError::ShortHeader { .. } => "short-read",
            BlobError::BadHeader { .. } => "bad-header",
            BlobError::WrongStream { .. } => "wrong-file",
            BlobError::Length {
                version: _,
                header_len,
                got,
            } => {
                if (*got as u64) < *header_len {
                    "short-read"
                } else {
                    "long-read"
                }
            }
            BlobError::Body {
                other_version: Some(_),
                ..
            } => "mixed-versions",
            BlobError::Body {
                zeros_there: true, ..
            } => "zeros-in-read",
            BlobError::Body { .. } => "wrong-bytes",
        }
    }
}

/// Hex of up to 16 bytes of `b` from `at`.
pub fn hex_at(b: &[u8], at: usize) -> String {
    let end = (at + 16).min(b.len());
    b.get(at..end)
        .unwrap_or(&[])
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Parses and checks a header (the first [`HEADER_LEN`] bytes).
fn parse_header(data: &[u8]) -> Result<BlobInfo, BlobError> {
    let h = &data[..HEADER_LEN];
    if &h[0..4] != MAGIC || u64_at(h, 32) != header_sum(h) {
        return Err(BlobError::BadHeader {
            hex: hex_at(data, 0),
            zeros_after: data[HEADER_LEN..].iter().all(|b| *b == 0),
        });
    }
    let mut s = [0u8; 4];
    s.copy_from_slice(&h[4..8]);
    Ok(BlobInfo {
        stream: u32::from_le_bytes(s),
        version: u64_at(h, 8),
        len: u64_at(h, 16),
    })
}

/// Compares the body bytes present in `data` with those of `info`.
fn check_body(run_seed: u64, info: BlobInfo, data: &[u8]) -> Result<(), BlobError> {
    let k = key(run_seed, info.stream, info.version);
    let mut want = vec![0u8; data.len() - HEADER_LEN];
    fill_body(k, HEADER_LEN as u64, &mut want);
    let got = &data[HEADER_LEN..];
    let Some(first) = got.iter().zip(&want).position(|(a, b)| a != b) else {
        return Ok(());
    };
    let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    let offset = HEADER_LEN + first;
    let span = (data.len() - offset).min(16);
    let zeros_there = data[offset..offset + span].iter().all(|b| *b == 0);
    // Which nearby version wrote these bytes, if any: a mix of versions.
    let other_version = (1..=16u64)
        .flat_map(|d| [info.version.wrapping_add(d), info.version.wrapping_sub(d)])
        .find(|v| {
            let ko = key(run_seed, info.stream, *v);
            (0..span).all(|i| body_byte(ko, (offset + i) as u64) == data[offset + i])
        });
    Err(BlobError::Body {
        version: info.version,
        header_len: info.len,
        offset,
        differing,
        got_hex: hex_at(data, offset),
        want_hex: hex_at(&want, first),
        zeros_there,
        other_version,
    })
}

fn not_a_header(data: &[u8]) -> BlobError {
    if data.is_empty() {
        BlobError::Empty
    } else if data.iter().all(|b| *b == 0) {
        BlobError::Zeros { len: data.len() }
    } else {
        BlobError::ShortHeader {
            got: data.len(),
            hex: hex_at(data, 0),
        }
    }
}

/// Checks that `data` is one complete, valid version (of `stream`, if
/// given): header, exact length, every body byte.
pub fn verify(run_seed: u64, stream: Option<u32>, data: &[u8]) -> Result<BlobInfo, BlobError> {
    if data.len() < HEADER_LEN {
        return Err(not_a_header(data));
    }
    if data.iter().all(|b| *b == 0) {
        return Err(BlobError::Zeros { len: data.len() });
    }
    let info = parse_header(data)?;
    if let Some(want) = stream {
        if info.stream != want {
            return Err(BlobError::WrongStream {
                want,
                got: info.stream,
                version: info.version,
            });
        }
    }
    if data.len() as u64 != info.len {
        // Check what is there first: zeros or another version's bytes
        // explain a short read better than its length alone.
        let upto = data
            .len()
            .min(usize::try_from(info.len).unwrap_or(usize::MAX))
            .max(HEADER_LEN);
        check_body(run_seed, info, &data[..upto])?;
        return Err(BlobError::Length {
            version: info.version,
            header_len: info.len,
            got: data.len(),
        });
    }
    check_body(run_seed, info, data)?;
    Ok(info)
}

/// Checks that `data` is a prefix (possibly empty, possibly all) of a valid
/// version of `stream`: what a reader may see of a file still being written.
/// Returns the header's information once the header is complete.
pub fn verify_prefix(
    run_seed: u64,
    stream: u32,
    data: &[u8],
) -> Result<Option<BlobInfo>, BlobError> {
    if data.len() < HEADER_LEN {
        let mut want = Vec::with_capacity(8);
        want.extend_from_slice(MAGIC);
        want.extend_from_slice(&stream.to_le_bytes());
        let n = data.len().min(8);
        if data[..n] != want[..n] {
            return Err(not_a_header(data));
        }
        return Ok(None);
    }
    let info = parse_header(data)?;
    if info.stream != stream {
        return Err(BlobError::WrongStream {
            want: stream,
            got: info.stream,
            version: info.version,
        });
    }
    if data.len() as u64 > info.len {
        return Err(BlobError::Length {
            version: info.version,
            header_len: info.len,
            got: data.len(),
        });
    }
    check_body(run_seed, info, data)?;
    Ok(Some(info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_blob_verifies() {
        for len in [0usize, 48, 49, 100, 4096, 65_537] {
            let b = build(9, 3, 17, len);
            let info = verify(9, Some(3), &b).expect("valid");
            assert_eq!(info.version, 17);
            assert_eq!(info.len, b.len() as u64);
            assert_eq!(verify_prefix(9, 3, &b).expect("prefix"), Some(info));
        }
    }

    #[test]
    fn zeros_are_reported_as_zeros() {
        let z = vec![0u8; 4096];
        assert_eq!(verify(1, None, &z), Err(BlobError::Zeros { len: 4096 }));
        assert_eq!(verify(1, None, &[]), Err(BlobError::Empty));
    }

    #[test]
    fn a_short_read_is_reported() {
        let b = build(1, 0, 5, 10_000);
        match verify(1, None, &b[..4096]) {
            Err(BlobError::Length {
                version: 5,
                header_len: 10_000,
                got: 4096,
            }) => {}
            other => panic!("{other:?}"),
        }
        // A prefix is fine for verify_prefix.
        assert!(verify_prefix(1, 0, &b[..4096]).is_ok());
        assert!(verify_prefix(1, 0, &b[..5]).is_ok());
    }

    #[test]
    fn a_zero_filled_tail_is_found() {
        let mut b = build(1, 0, 5, 10_000);
        for x in &mut b[4096..] {
            *x = 0;
        }
        match verify(1, None, &b) {
            Err(BlobError::Body {
                offset,
                zeros_there: true,
                ..
            }) => assert!((4096..4096 + 8).contains(&offset), "{offset}"),
            other => panic!("{other:?}"),
        }
        assert!(verify_prefix(1, 0, &b).is_err());
    }

    #[test]
    fn a_mix_of_two_versions_is_named() {
        let a = build(1, 0, 5, 10_000);
        let b = build(1, 0, 6, 10_000);
        let mut mixed = a.clone();
        mixed[6000..].copy_from_slice(&b[6000..]);
        match verify(1, None, &mixed) {
            Err(BlobError::Body {
                version: 5,
                other_version: Some(6),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let msg = verify(1, None, &mixed).unwrap_err().to_string();
        assert!(msg.contains("mix of versions"), "{msg}");
    }

    #[test]
    fn one_flipped_byte_is_found() {
        let mut b = build(2, 1, 1, 3000);
        b[2999] ^= 1;
        assert!(matches!(
            verify(2, None, &b),
            Err(BlobError::Body {
                offset: 2999,
                differing: 1,
                ..
            })
        ));
        let mut h = build(2, 1, 1, 3000);
        h[9] ^= 1; // the version field: the header checksum catches it
        assert!(matches!(
            verify(2, None, &h),
            Err(BlobError::BadHeader { .. })
        ));
    }

    #[test]
    fn another_stream_or_seed_is_refused() {
        let b = build(1, 2, 1, 500);
        assert!(matches!(
            verify(1, Some(3), &b),
            Err(BlobError::WrongStream {
                want: 3,
                got: 2,
                ..
            })
        ));
        assert!(verify(2, Some(2), &b).is_err());
        assert!(verify_prefix(1, 3, &b[..6]).is_err());
    }
}
