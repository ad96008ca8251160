//! Feeds arbitrary bytes to the POSIX ACL decoder (the value of a
//! `system.posix_acl_*` attribute a client sends): it must reject or
//! decode, never panic; what it decodes encodes back to the same bytes
//! and survives a chmod, an inheritance and an access decision.
#![no_main]

use libfuzzer_sys::fuzz_target;
use morris_proto::acl::Acl;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(a)) = Acl::decode(data) {
        assert_eq!(a.encode(), data);
        let mode = u32::from(data.len() as u16) & 0o7777;
        let (mut b, _) = a.inherit(mode);
        b.chmod(mode);
        let _ = b.permits(1, 2, 3, |g| g == 2, 4);
        assert_eq!(Acl::decode(&b.encode()).ok().flatten(), Some(b));
    }
});
