//! The captures shipped in `captures/` and the independent fixtures.

mod common;
use common::hex;
use ferroce::apps::inspect::{analyse, Analysis, Summary};
use ferroce::pcap::capture;
use ferroce::pcap::golden::Golden;
use std::path::Path;

fn summarise(path: &Path) -> Summary {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut s = Summary::default();
    for fr in capture::open(std::io::BufReader::new(f)).unwrap() {
        s.add(&analyse(&fr.unwrap()));
    }
    s
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn golden_captures_are_reproducible() {
    for g in Golden::ALL {
        let mut fresh = Vec::new();
        ferroce::pcap::golden::write(g, &mut fresh).unwrap();
        let committed = std::fs::read(root().join("captures").join(g.file_name())).unwrap();
        assert!(
            fresh == committed,
            "{} differs from what `ferroce golden` writes now",
            g.file_name()
        );
    }
}

#[test]
fn golden_captures_cover_every_known_opcode_and_are_clean() {
    let mut seen = std::collections::BTreeSet::new();
    for g in Golden::ALL {
        let s = summarise(&root().join("captures").join(g.file_name()));
        assert!(s.clean(), "{}: {}", g.file_name(), s.line());
        assert_eq!(s.roce_packets, g.opcodes().len() as u64);
        seen.extend(s.opcodes.keys().cloned());
    }
    for op in ferroce::wire::Opcode::all_known() {
        if op.name() != "RD_RESYNC" {
            assert!(
                seen.contains(&op.to_string()),
                "{op} missing from the golden captures"
            );
        }
    }
}

#[test]
fn real_rxe_frames_all_verify() {
    // Frames made by Linux rdma_rxe, not by ferroce.
    let dir = root().join("captures/rxe-reference");
    let mut total = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pcap") {
            let s = summarise(&p);
            assert!(s.clean(), "{}", s.line());
            assert_eq!(s.icrc_ok, s.roce_packets, "{}", s.line());
            total += s.roce_packets;
        }
    }
    assert!(total > 5000, "only {total} rxe packets found");
}

#[test]
fn negative_fixture_verdicts_match_the_independent_checker() {
    // tests/oracle/README.md: 2 bad ICRCs, 2 malformed, 1 truncated.
    let f = std::fs::File::open(root().join("tests/oracle/fixtures/negative.pcap")).unwrap();
    let frames: Vec<_> = capture::open(f).unwrap().map(|r| r.unwrap()).collect();
    let kinds: Vec<&str> = frames
        .iter()
        .map(|fr| match analyse(fr) {
            Analysis::Roce(p) if p.icrc_ok() => "ok",
            Analysis::Roce(_) => "bad",
            Analysis::Malformed { .. } => "malformed",
            Analysis::Truncated { .. } => "truncated",
            Analysis::NotRoce => "not-roce",
        })
        .collect();
    assert_eq!(kinds, ["bad", "bad", "malformed", "truncated", "malformed"]);
}

#[test]
fn not_a_capture_is_a_typed_error() {
    assert!(matches!(
        capture::open(&b"hello world"[..]),
        Err(capture::CaptureError::NotACapture(_))
    ));
    assert!(matches!(
        capture::open(&b""[..]),
        Err(capture::CaptureError::NotACapture(_))
    ));
}

#[test]
fn pcapng_is_read_too() {
    // A pcapng file written by hand: SHB, IDB (Ethernet), one EPB holding the ConnectX-4 CNP.
    let cnp = hex(concat!(
        "e41d2dab2bc2 7cfe90643b32 0800 45c2003c718c400040119161 0a001101 0a001201 ",
        "0000 12b7 0028 0000 81 00 ffff 40 000118 00 000000 ",
        "00000000000000000000000000000000 82fd002a"
    ));
    let mut v = Vec::new();
    let block = |v: &mut Vec<u8>, ty: u32, body: &[u8]| {
        let len = 12 + body.len() as u32;
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(body);
        v.extend_from_slice(&len.to_le_bytes());
    };
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut v, 0x0a0d_0d0a, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&1u16.to_le_bytes());
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&65535u32.to_le_bytes());
    block(&mut v, 1, &idb);
    let mut epb = Vec::new();
    epb.extend_from_slice(&0u32.to_le_bytes());
    epb.extend_from_slice(&0u32.to_le_bytes());
    epb.extend_from_slice(&0u32.to_le_bytes());
    epb.extend_from_slice(&(cnp.len() as u32).to_le_bytes());
    epb.extend_from_slice(&(cnp.len() as u32).to_le_bytes());
    epb.extend_from_slice(&cnp);
    while epb.len() % 4 != 0 {
        epb.push(0);
    }
    block(&mut v, 6, &epb);
    let frames: Vec<_> = capture::open(&v[..]).unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(frames.len(), 1);
    match analyse(&frames[0]) {
        Analysis::Roce(p) => {
            assert!(p.icrc_ok());
            assert_eq!(p.repr.roce.bth.opcode, ferroce::wire::Opcode::CNP);
        }
        other => panic!("{other:?}"),
    }
}
