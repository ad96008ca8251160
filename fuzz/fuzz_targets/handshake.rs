//! Feeds arbitrary bytes to the server's side of the handshake (as the
//! first message, and as the proof after a valid first message): it must
//! refuse, never panic or accept.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    morris_proto::auth::handshake::fuzz_server(data);
});
