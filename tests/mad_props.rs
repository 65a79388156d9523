//! Property tests of the MAD views (src/wire/mad): arbitrary bytes never panic any parser or
//! view getter; whatever parses re-emits to bytes that parse back to the same `Repr`; and
//! `parse` then `emit` changes nothing but reserved bits (emit is idempotent).

use ferroce::wire::mad::class_port_info::ClassPortInfoRepr;
use ferroce::wire::mad::cm::{self, CmMadRepr, CmMessage};
use ferroce::wire::mad::rdma_cm::{Header, HeaderRepr};
use ferroce::wire::mad::{AttrId, Mad, MadHeaderRepr, DATA_LEN, HEADER_LEN, MAD_LEN};
use proptest::prelude::*;

/// Attribute IDs worth generating: every CM attribute, ClassPortInfo, and some unknown ones.
fn arb_attr() -> impl Strategy<Value = u16> {
    prop_oneof![
        8 => 0x0010u16..=0x001a,
        1 => Just(0x0001u16),
        1 => any::<u16>(),
    ]
}

/// A 256-byte MAD of the CM class with a chosen attribute and otherwise arbitrary bytes.
fn arb_cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec(any::<u8>(), MAD_LEN), arb_attr()).prop_map(|(mut b, a)| {
        b[1] = 0x07;
        b[16..18].copy_from_slice(&a.to_be_bytes());
        b
    })
}

fn touch_views(data: &[u8]) {
    if let Ok(v) = cm::Req::new_checked(data) {
        let _ = (v.local_qpn(), v.primary(), v.alternate(), v.private_data());
        let _ = (
            v.service_id(),
            v.path_mtu(),
            v.transport(),
            v.starting_psn(),
        );
    }
    if let Ok(v) = cm::Rep::new_checked(data) {
        let _ = (
            v.local_qpn(),
            v.starting_psn(),
            v.target_ack_delay(),
            v.private_data(),
        );
    }
    if let Ok(v) = cm::Rej::new_checked(data) {
        let _ = (v.reason(), v.ari(), v.private_data(), v.reject_info_len());
    }
    if let Ok(v) = cm::SidrRep::new_checked(data) {
        let _ = (v.qpn(), v.qkey(), v.status(), v.additional_info());
    }
    if let Ok(v) = Header::new_checked(data) {
        let _ = (
            v.version(),
            v.ip_version(),
            v.src_port(),
            v.src_raw(),
            v.dst_raw(),
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = MadHeaderRepr::parse(&b);
        let _ = CmMadRepr::parse(&b);
        if let Ok(m) = Mad::new_checked(&b[..]) {
            let _ = (m.method(), m.attr_id(), m.transaction_id(), m.status(), m.data());
            for a in 0..=0x1bu16 {
                let _ = CmMessage::parse(AttrId(a), m.data());
            }
        }
        let _ = ClassPortInfoRepr::parse(&b);
        let _ = HeaderRepr::parse(&b);
        touch_views(&b);
        if b.len() > HEADER_LEN {
            touch_views(&b[HEADER_LEN..]);
        }
    }

    #[test]
    fn parse_emit_parse_is_identity(b in arb_cm_mad()) {
        let r = CmMadRepr::parse(&b).expect("256 bytes of the CM class parse");
        let out = r.to_bytes();
        let back = CmMadRepr::parse(&out).unwrap();
        prop_assert_eq!(back, r);
        // Emit is idempotent, and only reserved bits were changed: the bytes that differ from
        // the input are bytes the message leaves (partly) reserved.
        prop_assert_eq!(back.to_bytes(), out);
        for i in 0..MAD_LEN {
            prop_assert_eq!(out[i] & !b[i], 0, "emit set a bit the input did not have at {}", i);
        }
    }

    #[test]
    fn well_formed_mads_round_trip_exactly(b in arb_cm_mad()) {
        // Clear the reserved bits by one emit: then parse → emit gives back those bytes.
        let clean = CmMadRepr::parse(&b).unwrap().to_bytes();
        prop_assert_eq!(CmMadRepr::parse(&clean).unwrap().to_bytes(), clean);
    }

    #[test]
    fn truncated_mads_are_errors(b in arb_cm_mad(), cut in 0usize..MAD_LEN) {
        prop_assert!(CmMadRepr::parse(&b[..cut]).is_err());
    }

    #[test]
    fn emit_never_writes_past_the_mad(b in arb_cm_mad(), extra in 1usize..16) {
        let r = CmMadRepr::parse(&b).unwrap();
        let mut buf = vec![0xeeu8; MAD_LEN + extra];
        r.emit(&mut buf).unwrap();
        prop_assert!(buf[MAD_LEN..].iter().all(|&x| x == 0xee));
        let mut short = vec![0u8; MAD_LEN - extra.min(MAD_LEN)];
        prop_assert!(r.emit(&mut short).is_err());
        let mut d = vec![0u8; DATA_LEN - 1];
        prop_assert!(r.msg.emit(&mut d).is_err());
    }

    #[test]
    fn rdma_cm_header_round_trips(
        v6 in any::<bool>(), s in any::<[u8; 16]>(), d in any::<[u8; 16]>(), port in any::<u16>()
    ) {
        let (src_ip, dst_ip) = if v6 {
            (std::net::Ipv6Addr::from(s).into(), std::net::Ipv6Addr::from(d).into())
        } else {
            (
                std::net::Ipv4Addr::new(s[0], s[1], s[2], s[3]).into(),
                std::net::Ipv4Addr::new(d[0], d[1], d[2], d[3]).into(),
            )
        };
        let h = HeaderRepr { src_ip, src_port: port, dst_ip };
        let mut b = [0u8; 36];
        h.emit(&mut b).unwrap();
        prop_assert_eq!(HeaderRepr::parse(&b).unwrap(), h);
    }
}
