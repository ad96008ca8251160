//! The gateway's decoders allocate no more than the bytes a message really
//! carries: a length or count field claiming gigabytes is rejected without
//! asking the allocator for gigabytes (which aborts the process where memory
//! is short). A counting global allocator records the largest request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout, as the caller guarantees for `alloc`.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

/// Bytes a decoder may ask for at once while decoding a small message.
const LIMIT: usize = 4 << 20;

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn lying_lengths_do_not_allocate_what_they_claim() {
    // Found by `cargo fuzz run rpc_decode`: an AUTH_UNIX credential whose
    // gid count claims 3.6 billion entries.
    let found = include_bytes!("oom-auth-unix-gids.bin");
    // A GETATTR call whose file handle claims 4 GiB - 4 bytes.
    let mut handle = words(&[0x8000_0030, 1, 0, 2, 100_003, 3, 1, 0, 0, 0, 0]);
    handle.extend_from_slice(&words(&[0xffff_fffc, 1, 2, 3]));
    // A WRITE whose data claims 2 GiB.
    let mut write = words(&[0x8000_0040, 2, 0, 2, 100_003, 3, 7, 0, 0, 0, 0, 8, 1, 2]);
    write.extend_from_slice(&words(&[0, 0, 16, 0, 0x8000_0000, 7, 7]));
    for (what, input) in [
        ("auth_unix gids", &found[..]),
        ("file handle", &handle[..]),
        ("write data", &write[..]),
    ] {
        LARGEST.store(0, Ordering::Relaxed);
        morris_nfs::fuzzing::decode_stream(input);
        morris_nfs::fuzzing::decode_record(input);
        let record = input.get(4..).unwrap_or_default();
        morris_nfs::fuzzing::decode_record(record);
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= LIMIT,
            "{what}: a {}-byte message made the decoder ask for {largest} bytes",
            input.len()
        );
    }
}
