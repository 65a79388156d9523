//! The out-of-band exchange parsers on arbitrary bytes (the first byte chooses): perftest's
//! key message (text and rdma_cm `pingpong_dest`), the bandwidth report, ibv_rc_pingpong's
//! connection message and the GID text. Invariants: no panic; whatever parses re-emits to
//! bytes that parse back to the same value.
#![no_main]

use ferroce::oob::perftest::{BwReport, KeyMsg};
use ferroce::oob::pingpong::Dest;
use ferroce::oob::{gid_from_wire, gid_to_wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => {
            if let Ok(k) = KeyMsg::from_wire(msg) {
                // Fields wider than the wire's are cut on parse (as perftest's sscanf into
                // narrower types); the value that parsed round-trips.
                assert_eq!(KeyMsg::from_wire(&k.to_wire()).unwrap(), k);
            }
        }
        1 => {
            if let Ok(d) = Dest::from_wire(msg) {
                assert_eq!(Dest::from_wire(&d.to_wire()).unwrap(), d);
            }
        }
        2 => {
            if let Ok(k) = KeyMsg::from_dest(msg) {
                assert_eq!(KeyMsg::from_dest(&k.to_dest(0)).unwrap(), k);
            }
        }
        3 => {
            if let Ok(b) = <&[u8; 40]>::try_from(msg) {
                // Integers and doubles as bits: the bytes come back unchanged (NaNs included).
                assert_eq!(&BwReport::from_wire(b).to_wire(), b);
            }
        }
        _ => {
            if let Ok(s) = std::str::from_utf8(msg) {
                if let Some(g) = gid_from_wire(s) {
                    assert_eq!(gid_from_wire(&gid_to_wire(&g)), Some(g));
                }
            }
        }
    }
});
