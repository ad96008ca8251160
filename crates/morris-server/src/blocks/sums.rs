//! Checksums of block data: one CRC-32C per 4 KiB chunk of an extent file.
//!
//! Extent file `<id>` (or `<id>.<copy>`) has a sums file beside it,
//! `<id>.sum` (`<id>.<copy>.sum`): entry `c` (4 bytes, little endian, at
//! offset `4·c`) covers bytes `[c·4096, (c+1)·4096)` of the extent file, the
//! bytes past its end counted as zeros. An entry holds the chunk's CRC-32C
//! XOR the CRC-32C of a chunk of zeros, so that a chunk of zeros has the
//! entry 0: holes in the extent file and holes in the sums file agree, and
//! neither takes space. Chunks that start at or past the end of the extent
//! file are never checked (they read as zeros whatever their entry says).
//!
//! Pure helpers; the file handling and the ordering rules are in the parent
//! module.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// Bytes covered by one checksum.
pub const CHUNK: u64 = 4096;

/// Bytes of one entry in a sums file.
pub const ENTRY: u64 = 4;

static ZEROS: [u8; CHUNK as usize] = [0; CHUNK as usize];

fn zero_crc() -> u32 {
    static Z: OnceLock<u32> = OnceLock::new();
    *Z.get_or_init(|| crc_fast::crc32_iscsi(&ZEROS))
}

/// The entry for a chunk holding `data` followed by zeros up to [`CHUNK`]
/// bytes (`data` may be shorter than a chunk; longer is cut).
pub fn entry(data: &[u8]) -> u32 {
    // CRC-32C (Castagnoli, "iSCSI"). `crc_fast` folds with carry-less
    // multiplies: ~60 GB/s on 4 KiB chunks here against ~28 for the `crc32c`
    // crate's CRC instructions, and every byte read is checked.
    let crc = if data.len() >= CHUNK as usize {
        crc_fast::crc32_iscsi(&data[..CHUNK as usize])
    } else {
        let mut padded = [0u8; CHUNK as usize];
        padded[..data.len()].copy_from_slice(data);
        crc_fast::crc32_iscsi(&padded)
    };
    crc ^ zero_crc()
}

/// The chunk holding byte `pos`.
pub fn chunk_of(pos: u64) -> u64 {
    pos / CHUNK
}

/// Chunks `[first, end)` that bytes `[pos, pos + len)` touch (empty when
/// `len` is 0).
pub fn chunks(pos: u64, len: u64) -> (u64, u64) {
    if len == 0 {
        return (chunk_of(pos), chunk_of(pos));
    }
    (
        chunk_of(pos),
        chunk_of(pos.saturating_add(len - 1)).saturating_add(1),
    )
}

/// Reads the entries of chunks `[first, first + n)` (entries past the end of
/// the sums file are 0).
pub fn read_entries(sums: &File, first: u64, n: usize) -> io::Result<Vec<u32>> {
    let mut raw = vec![0u8; n * ENTRY as usize];
    let mut got = 0;
    while got < raw.len() {
        match sums.read_at(&mut raw[got..], first * ENTRY + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(raw
        .chunks_exact(ENTRY as usize)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// Writes `entries` for chunks `[first, first + entries.len())`.
pub fn write_entries(sums: &File, first: u64, entries: &[u32]) -> io::Result<()> {
    let raw: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    sums.write_all_at(&raw, first * ENTRY)
}

/// The entries of `data`, which starts at a chunk boundary (its last chunk
/// may be short: the extent file ends there).
pub fn entries_of(data: &[u8]) -> Vec<u32> {
    data.chunks(CHUNK as usize).map(entry).collect()
}

/// Every chunk of `data` (starting at chunk `first`) whose entry differs
/// from `expected`.
pub fn mismatches(data: &[u8], first: u64, expected: &[u32]) -> Vec<u64> {
    data.chunks(CHUNK as usize)
        .zip(expected)
        .enumerate()
        .filter(|(_, (c, e))| entry(c) != **e)
        .map(|(i, _)| first + i as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_have_entry_zero_whatever_their_length() {
        assert_eq!(entry(&[]), 0);
        assert_eq!(entry(&[0; 100]), 0);
        assert_eq!(entry(&ZEROS), 0);
    }

    #[test]
    fn a_short_chunk_counts_as_padded_with_zeros() {
        let mut full = vec![0u8; CHUNK as usize];
        full[..5].copy_from_slice(b"hello");
        assert_eq!(entry(b"hello"), entry(&full));
        assert_ne!(entry(b"hello"), entry(b"hellp"));
        assert_ne!(entry(b"hello"), 0);
    }

    #[test]
    fn every_flipped_bit_is_seen() {
        let data: Vec<u8> = (0..CHUNK as usize).map(|i| (i * 7 + 3) as u8).collect();
        let good = entries_of(&data);
        for byte in [0usize, 1, 2047, 4095] {
            for bit in 0..8 {
                let mut bad = data.clone();
                bad[byte] ^= 1 << bit;
                assert_eq!(mismatches(&bad, 9, &good), vec![9], "byte {byte} bit {bit}");
            }
        }
        assert!(mismatches(&data, 9, &good).is_empty());
        let mut two = [data.clone(), data.clone(), data.clone()].concat();
        two[5] ^= 1;
        two[2 * CHUNK as usize + 9] ^= 1;
        let good3 = [good.clone(), good.clone(), good].concat();
        assert_eq!(mismatches(&two, 4, &good3), vec![4, 6]);
    }

    #[test]
    fn entries_are_crc32c_of_the_padded_chunk() {
        // The CRC-32C check value ("123456789"), so entries written by any
        // earlier build (the `crc32c` crate) still match.
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xe306_9283);
        assert_eq!(zero_crc(), 0x98f9_4189);
        let mut padded = vec![0u8; CHUNK as usize];
        padded[..9].copy_from_slice(b"123456789");
        assert_eq!(entry(b"123456789"), entry(&padded));
        // As the `crc32c` crate computed it for this chunk.
        assert_eq!(entry(&padded), 0xe371_e60b ^ 0x98f9_4189);
    }

    #[test]
    fn chunk_ranges() {
        assert_eq!(chunks(0, 0), (0, 0));
        assert_eq!(chunks(0, 1), (0, 1));
        assert_eq!(chunks(0, 4096), (0, 1));
        assert_eq!(chunks(4095, 2), (0, 2));
        assert_eq!(chunks(8192, 4097), (2, 4));
    }

    #[test]
    fn entries_round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("s"))
            .unwrap();
        write_entries(&f, 3, &[1, 2, 0xdead_beef]).unwrap();
        assert_eq!(
            read_entries(&f, 2, 5).unwrap(),
            vec![0, 1, 2, 0xdead_beef, 0]
        );
    }
}
