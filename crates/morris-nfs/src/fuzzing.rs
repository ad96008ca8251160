//! Entry point for the fuzzer (`fuzz/fuzz_targets/rpc_decode.rs`): runs
//! every decoder the gateway applies to bytes from the network (NFS,
//! MOUNT, NLM, NSM), without a volume behind it. Not part of the supported API.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use nfs3_server::nfs3_types::mount::dirpath;
use nfs3_server::nfs3_types::nfs3::{
    nfs_fh3, ACCESS3args, COMMIT3args, CREATE3args, FSINFO3args, FSSTAT3args, GETATTR3args,
    LINK3args, LOOKUP3args, MKDIR3args, MKNOD3args, PATHCONF3args, READ3args, READDIR3args,
    READDIRPLUS3args, READLINK3args, REMOVE3args, RENAME3args, RMDIR3args, SETATTR3args,
    SYMLINK3args, WRITE3args,
};
use nfs3_server::nfs3_types::xdr_codec::{Opaque, Unpack};

use crate::export::ExportName;
use crate::front::{parse_call, patch_verifier, read_record};
use crate::local::Handles;
use crate::nlm::xdr::{host_state, nlm4_cancargs, nlm4_lockargs, nlm4_testargs, nlm4_unlockargs};

fn unpack<T: Unpack>(body: &[u8]) {
    let mut c = std::io::Cursor::new(body);
    let _ = T::unpack(&mut c);
}

/// Reads `stream` as RPC records the way a connection does, and decodes
/// each call header, its arguments (by program and procedure) and any file
/// handle in them. Must return, never panic, whatever the bytes.
pub fn decode_stream(stream: &[u8]) {
    let mut rd = stream;
    loop {
        // A byte slice never waits: the record future completes when polled.
        let mut fut = std::pin::pin!(read_record(&mut rd));
        let mut cx = Context::from_waker(Waker::noop());
        let record = match fut.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(Some(r))) => r,
            _ => return,
        };
        decode_record(&record);
    }
}

/// Decodes one RPC record: header, arguments, handle; also runs the reply
/// patching on it as if it were a reply.
pub fn decode_record(record: &[u8]) {
    let mut copy = record.to_vec();
    patch_verifier(&mut copy, &[7; 8]);
    let Some((p, _caller, at)) = parse_call(record) else {
        return;
    };
    let body = record.get(at..).unwrap_or_default();
    match (p.prog, p.proc_) {
        (100_005, _) => {
            // MNT's path, then how it resolves against the exports.
            let mut c = std::io::Cursor::new(body);
            if let Ok((path, _)) = dirpath::unpack(&mut c) {
                let _ = ExportName::default().volume_path(path.0.as_ref());
            }
        }
        (100_003, 1) => unpack::<GETATTR3args>(body),
        (100_003, 2) => unpack::<SETATTR3args>(body),
        (100_003, 3) => unpack::<LOOKUP3args>(body),
        (100_003, 4) => unpack::<ACCESS3args>(body),
        (100_003, 5) => unpack::<READLINK3args>(body),
        (100_003, 6) => unpack::<READ3args>(body),
        (100_003, 7) => unpack::<WRITE3args>(body),
        (100_003, 8) => unpack::<CREATE3args>(body),
        (100_003, 9) => unpack::<MKDIR3args>(body),
        (100_003, 10) => unpack::<SYMLINK3args>(body),
        (100_003, 11) => unpack::<MKNOD3args>(body),
        (100_003, 12) => unpack::<REMOVE3args>(body),
        (100_003, 13) => unpack::<RMDIR3args>(body),
        (100_003, 14) => unpack::<RENAME3args>(body),
        (100_003, 15) => unpack::<LINK3args>(body),
        (100_003, 16) => unpack::<READDIR3args>(body),
        (100_003, 17) => unpack::<READDIRPLUS3args>(body),
        (100_003, 18) => unpack::<FSSTAT3args>(body),
        (100_003, 19) => unpack::<FSINFO3args>(body),
        (100_003, 20) => unpack::<PATHCONF3args>(body),
        (100_003, 21) => unpack::<COMMIT3args>(body),
        (100_021, 1) => unpack::<nlm4_testargs>(body),
        (100_021, 2) => {
            let mut c = std::io::Cursor::new(body);
            if let Ok((a, _)) = nlm4_lockargs::unpack(&mut c) {
                // The range and the file handle, as a LOCK uses them.
                let _ = crate::nlm::range_of(&a.alock);
                let fh = nfs_fh3 {
                    data: Opaque::owned(a.alock.fh.to_vec()),
                };
                let _ = Handles::new(u64::from(p.xid)).decode(&fh);
            }
        }
        (100_021, 3) => unpack::<nlm4_cancargs>(body),
        (100_021, 4) => unpack::<nlm4_unlockargs>(body),
        (100_021, 23) | (100_024, 6) => unpack::<host_state>(body),
        _ => {}
    }
    // Every NFS call starts with a file handle.
    let mut c = std::io::Cursor::new(body);
    if let Ok((fh, _)) = nfs_fh3::unpack(&mut c) {
        let _ = Handles::new(u64::from(p.xid)).decode(&fh);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn decoders_survive_truncated_and_garbage_records() {
        // A valid GETATTR call, then every truncation of it, then junk.
        let mut call = Vec::new();
        for w in [0x8000_0034u32, 9, 0, 2, 100_003, 3, 1, 0, 0, 0, 0, 16] {
            call.extend_from_slice(&w.to_be_bytes());
        }
        call.extend_from_slice(&[1; 16]);
        super::decode_stream(&call);
        for n in 0..call.len() {
            super::decode_stream(&call[..n]);
            super::decode_record(&call[4..4 + n.min(call.len() - 4)]);
        }
        // A MOUNT MNT call whose path goes through the export resolution.
        let mut mnt = Vec::new();
        for w in [0x8000_003cu32, 9, 0, 2, 100_005, 3, 1, 0, 0, 0, 0, 16] {
            mnt.extend_from_slice(&w.to_be_bytes());
        }
        mnt.extend_from_slice(b"/morris//a/../x\xff");
        super::decode_stream(&mnt);
        for n in 0..mnt.len() {
            super::decode_stream(&mnt[..n]);
        }
        super::decode_stream(&[0xff; 64]);
        super::decode_stream(&[0x80, 0, 0, 0]);
    }
}
