//! `ferroce inspect` on the CM exchanges of the rxe reference captures: the text line and the
//! JSON record of each UD packet to QP1 show the MAD (class, method, attribute, transaction ID)
//! and the CM fields (communication IDs, QPN, starting PSN, service ID, the RDMA-CM header's
//! addresses) with the values tshark shows for the same frames (tools/check-captures compares
//! every such field with tshark; here a few are pinned to catch a change of format).
#![cfg(feature = "cli")]

use ferroce::apps::inspect::{analyse, packet_line, packet_record, verbose_dump, Analysis};
use ferroce::pcap::capture::{self, CapturedFrame};

fn frames(file: &str) -> Vec<CapturedFrame> {
    let path = format!(
        "{}/captures/rxe-reference/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    capture::open(std::fs::File::open(path).unwrap())
        .unwrap()
        .map(|f| f.unwrap())
        .collect()
}

#[test]
fn rping_req_line_and_record() {
    let fr = frames("rping.pcap");
    let f = &fr[13];
    assert_eq!(f.index, 14);
    let a = analyse(f);
    let line = packet_line(f, &a).unwrap();
    assert!(
        line.ends_with(
            "UD_SEND_ONLY qp=0x000001 psn=0 A deth[qkey=0x80010000 srcqp=0x000001] len=256 \
             mad[CM Send ConnectRequest tid=0x000000029b59a9ca] \
             cm[REQ lcid=0xcaa9599b sid=0x0000000001061c06 qpn=0x000011 psn=0x91d944 mtu=1024 \
             rr=1 id=1 retry=7 rnr=7 timeout=19 gid=10.77.0.12>10.77.0.11] \
             rdma_cm[TCP:7174 10.77.0.12:47214 > 10.77.0.11] icrc=ok"
        ),
        "{line}"
    );
    let rec = serde_json::to_value(packet_record(f, &a).unwrap()).unwrap();
    let mad = &rec["mad"];
    assert_eq!(mad["class"], 7);
    assert_eq!(mad["method"], 3);
    assert_eq!(mad["attr_id"], 0x10);
    assert_eq!(mad["tid"], 0x0000_0002_9b59_a9cau64);
    assert_eq!(mad["cm"]["local_comm_id"], 0xcaa9_599bu32);
    assert_eq!(mad["cm"]["service_id"], 0x0106_1c06u64);
    assert_eq!(mad["cm"]["local_qpn"], 0x11);
    assert_eq!(mad["cm"]["starting_psn"], 0x91d944);
    assert_eq!(mad["rdma_cm"]["src_ip"], "10.77.0.12");
    assert_eq!(mad["rdma_cm"]["dst_ip"], "10.77.0.11");
    assert_eq!(mad["rdma_cm"]["src_port"], 47214);
    assert_eq!(mad["rdma_cm"]["port_space"], "TCP");
    let Analysis::Roce(p) = &a else { panic!() };
    assert!(verbose_dump(p).contains("      MAD        mad[CM Send ConnectRequest"));
}

#[test]
fn every_qp1_packet_has_its_mad_decoded() {
    let mut seen = 0;
    for file in ["rping.pcap", "rdma-cm.pcap"] {
        for f in frames(file) {
            let a = analyse(&f);
            let Some(rec) = packet_record(&f, &a) else {
                continue;
            };
            let rec = serde_json::to_value(rec).unwrap();
            let line = packet_line(&f, &a).unwrap();
            if rec["qpn"] == 1 && rec["opcode"] == 0x64 {
                seen += 1;
                assert!(rec["mad"]["cm"]["msg"].is_string(), "{file} {}", f.index);
                assert!(
                    line.contains(" mad[CM Send ") && line.contains(" cm["),
                    "{line}"
                );
                assert!(rec["mad"].get("error").is_none());
            } else {
                assert!(rec.get("mad").is_none() && !line.contains("mad["), "{line}");
            }
        }
    }
    assert_eq!(seen, 29);
}

#[test]
fn rej_and_sidr_lines() {
    let fr = frames("rdma-cm.pcap");
    let line = |n: usize| packet_line(&fr[n - 1], &analyse(&fr[n - 1])).unwrap();
    assert!(line(21)
        .contains("cm[REJ lcid=0x00000000 rcid=0xd0a2c1c2 msg=REQ reason=8 (invalid service ID)]"));
    assert!(line(185).contains(
        "cm[SIDR_REQ reqid=0xd5a2c1c2 sid=0x0000000001114853] \
         rdma_cm[UDP:18515 10.77.0.12:41045 > 10.77.0.11]"
    ));
    assert!(line(186).contains(
        "cm[SIDR_REP reqid=0xd5a2c1c2 status=0 (success) qpn=0x000015 qkey=0x01234567 \
         sid=0x0000000001114853]"
    ));
    assert!(line(24).contains("rdma_cm[TCP:7174 [fd77::12]:44741 > fd77::11]"));
}
