//! The full receive-side parse path on arbitrary bytes: Ethernet frames, raw IP packets and
//! bare transport parts. Invariants: no panic; whatever parses re-emits to a frame that parses
//! back to the same `Repr`, and the emitted length equals `buffer_len()`.
#![no_main]

use ferroce::wire::{self, packet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for r in [packet::decode_frame(data), packet::decode_ip(data)] {
        if let Ok(p) = r {
            assert!(p.offsets.end <= data.len());
            assert_eq!(p.payload.len(), p.repr.roce.payload_len);
            let mut out = vec![0u8; p.repr.buffer_len()];
            let n = p.repr.emit(&mut out, p.payload).expect("a decoded frame re-emits");
            assert_eq!(n, out.len());
            let back = if p.repr.eth.is_some() { packet::parse_frame(&out) } else { packet::parse_ip(&out) }
                .expect("our own emission parses with a good ICRC");
            let mut expect = p.repr;
            if let Some(e) = expect.eth.as_mut() {
                e.ethertype = p.repr.ip.ethertype();
            }
            assert_eq!(back.repr, expect);
        }
    }
    let _ = packet::parse_frame(data);
    let split = data.first().map_or(0, |b| usize::from(*b) % 48).min(data.len());
    let (hdrs, t) = data.split_at(split);
    let _ = wire::parse_roce(&hdrs[..hdrs.len().min(40)], &hdrs[hdrs.len().min(40)..], t);
});
