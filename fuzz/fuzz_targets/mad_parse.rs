//! The MAD parsers on arbitrary bytes: the common header, every CM message, ClassPortInfo and
//! the RDMA-CM private-data header. Invariants: no panic; whatever parses re-emits to 256 bytes
//! that parse back to the same `Repr`, and emitting again gives the same bytes.
#![no_main]

use ferroce::wire::mad::cm::{CmMadRepr, CmMessage};
use ferroce::wire::mad::rdma_cm::HeaderRepr;
use ferroce::wire::mad::{AttrId, Mad, MadHeaderRepr, MAD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = MadHeaderRepr::parse(data);
    if let Ok(r) = CmMadRepr::parse(data) {
        let out = r.to_bytes();
        assert_eq!(out.len(), MAD_LEN);
        let back = CmMadRepr::parse(&out).expect("our own emission parses");
        assert_eq!(back, r);
        assert_eq!(back.to_bytes(), out);
        if let CmMessage::Req(q) = r.msg {
            if let Ok(h) = HeaderRepr::parse(&q.private_data) {
                let mut b = [0u8; 36];
                h.emit(&mut b).expect("a parsed header re-emits");
                assert_eq!(HeaderRepr::parse(&b).unwrap(), h);
            }
        }
    }
    if let Ok(m) = Mad::new_checked(data) {
        // Every attribute parser on the same data, whatever the header says.
        for a in 0..=0x1bu16 {
            let _ = CmMessage::parse(AttrId(a), m.data());
        }
    }
    let _ = HeaderRepr::parse(data);
});
