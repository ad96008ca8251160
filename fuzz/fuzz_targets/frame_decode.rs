//! Feeds arbitrary bytes to the wire decoder: it must return an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = morris_proto::frame::decode_any(data);
});
