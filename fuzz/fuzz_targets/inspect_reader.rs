//! `ferroce inspect`'s capture reader and analysis on arbitrary files (pcap and pcapng).
#![no_main]

use ferroce::apps::inspect;
use ferroce::pcap::capture;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(rd) = capture::open(data) else { return };
    let mut sum = inspect::Summary::default();
    for item in rd.take(10_000) {
        let Ok(frame) = item else { break };
        let a = inspect::analyse(&frame);
        sum.add(&a);
        let _ = inspect::packet_line(&frame, &a);
        let _ = inspect::packet_record(&frame, &a);
        if let inspect::Analysis::Roce(p) = &a {
            let _ = inspect::verbose_dump(p);
        }
    }
    let _ = sum.line();
});
