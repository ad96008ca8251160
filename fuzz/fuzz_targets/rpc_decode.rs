//! Feeds arbitrary bytes to the NFS gateway's RPC record reader and its
//! call/argument/handle decoders: they must reject, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    morris_nfs::fuzzing::decode_stream(data);
    morris_nfs::fuzzing::decode_record(data);
});
