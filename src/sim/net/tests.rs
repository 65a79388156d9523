//! Tests of the network simulator: exact timing, statistical checks of every impairment
//! against binomial bounds (fixed seeds, so they are reproducible, and tight enough to fail
//! on a wrong probability), frame-level checks of corruption and CE marking with real RoCE
//! frames, and property tests of determinism and conservation.

use super::*;
use crate::pcap::golden::{self, Framing, Golden};
use crate::wire::{parse_frame, FrameRepr, IpRepr, Opcode, RoceRepr, VlanTag};
use proptest::prelude::*;

fn t(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// A network of two endpoints with `cfg` on `a → b` (and a perfect `b → a`).
fn pair(seed: u64, cfg: LinkConfig) -> (Network, EndpointId, EndpointId) {
    let mut net = Network::new(seed);
    let a = net.add_endpoint();
    let b = net.add_endpoint();
    net.connect(a, b, cfg);
    net.connect(b, a, LinkConfig::default());
    (net, a, b)
}

/// Deliver everything, in order.
fn drain(net: &mut Network) -> Vec<Delivery> {
    let mut out = Vec::new();
    while let Some(now) = net.next_event() {
        while let Some(d) = net.poll_deliver(now) {
            assert!(d.at <= now);
            out.push(d);
        }
    }
    out
}

/// A non-IP frame of `len` bytes (at least 4) carrying `i` in its first four bytes.
fn tagged(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0x5a; len.max(4)];
    f[..4].copy_from_slice(&i.to_be_bytes());
    f
}

fn tag_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]])
}

fn emit(f: &FrameRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; f.buffer_len()];
    f.emit(&mut b, payload).unwrap();
    b
}

fn set_repr_ecn(f: &mut FrameRepr, ecn: Ecn) {
    match &mut f.ip {
        IpRepr::V4(r) => r.ecn = ecn,
        IpRepr::V6(r) => r.ecn = ecn,
    }
}

/// An RC SEND ONLY frame over IPv4 with `payload_len` bytes of payload and the given ECN.
fn send_only(payload_len: usize, ecn: Ecn) -> Vec<u8> {
    let (mut f, _) = golden::frame(Framing::Ipv4, 0, Opcode::RC_SEND_ONLY);
    f.roce = RoceRepr::new(f.roce.bth, f.roce.ext, payload_len);
    set_repr_ecn(&mut f, ecn);
    emit(&f, &vec![0xab; payload_len])
}

/// The four framings the marking tests cover: IPv4, IPv6, and each behind an 802.1Q tag.
fn framings() -> Vec<(&'static str, Framing, bool)> {
    vec![
        ("ipv4", Framing::Ipv4, false),
        ("ipv6", Framing::Ipv6, false),
        ("vlan-ipv4", Framing::VlanIpv4, false),
        ("vlan-ipv6", Framing::Ipv6, true),
    ]
}

fn framed(framing: Framing, extra_vlan: bool, i: usize, op: Opcode) -> (FrameRepr, Vec<u8>) {
    let (mut f, payload) = golden::frame(framing, i, op);
    if extra_vlan {
        if let Some(e) = &mut f.eth {
            e.vlan = Some(VlanTag {
                pcp: 5,
                dei: false,
                vid: 100,
            });
        }
    }
    (f, payload)
}

/// Every golden frame: every known opcode over IPv4, IPv6 and 802.1Q.
fn golden_frames() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for g in Golden::ALL {
        for (i, op) in g.opcodes().into_iter().enumerate() {
            let (f, payload) = golden::frame(g.framing, i, op);
            out.push(emit(&f, &payload));
        }
    }
    out
}

/// `count` successes out of `n` trials must be within five binomial standard deviations of
/// `n p` (exact when `p` is 0 or 1). With fixed seeds the outcome is reproducible; a rate off
/// by a few percent of `p` fails.
#[track_caller]
fn assert_binomial(count: u64, n: u64, p: f64, what: &str) {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    let dev = (count as f64 - mean).abs();
    assert!(
        dev <= 5.0 * sd,
        "{what}: {count} of {n}, expected {mean:.1} ± {:.1} (5 sd)",
        5.0 * sd
    );
}

fn hamming(a: &[u8], b: &[u8]) -> u32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
}

// ---------------------------------------------------------------------------------------
// The PRNG.

#[test]
fn splitmix64_helpers() {
    let mut r = SplitMix64::new(99);
    let mut hits = 0u64;
    let n = 100_000;
    for _ in 0..n {
        let f = r.next_f64();
        assert!((0.0..1.0).contains(&f));
        assert!(r.below(7) < 7);
        hits += u64::from(r.chance(0.3));
    }
    assert_binomial(hits, n, 0.3, "chance(0.3)");
    assert_eq!(r.below(0), 0);
    assert!(!r.chance(0.0) && !r.chance(-1.0) && !r.chance(f64::NAN));
    assert!(r.chance(1.0) && r.chance(2.0));
    let (mut x, mut y) = (SplitMix64::new(5), SplitMix64::new(5));
    let (mut bx, mut by) = ([0u8; 13], [0u8; 13]);
    x.fill_bytes(&mut bx);
    y.fill_bytes(&mut by);
    assert_eq!(bx, by);
    assert_ne!(bx, [0u8; 13]);
}

#[test]
fn link_stream_is_splitmix64_indexed() {
    let (a, b) = (EndpointId(3), EndpointId(8));
    let s = Stream::new(42, a, b);
    let mut r = SplitMix64::new(s.key);
    let seq: Vec<u64> = (0..3 * SLOTS).map(|_| r.next_u64()).collect();
    for n in 0..3u64 {
        assert_eq!(
            s.draw(n, Slot::Loss),
            seq[(n * SLOTS + Slot::Loss as u64) as usize]
        );
        assert_eq!(
            s.draw(n, Slot::CopyJitter),
            seq[(n * SLOTS + Slot::CopyJitter as u64) as usize]
        );
    }
    // Each direction and each seed has its own stream.
    assert_ne!(s.key, Stream::new(42, b, a).key);
    assert_ne!(s.key, Stream::new(43, a, b).key);
}

// ---------------------------------------------------------------------------------------
// Basics: ordering, polling, topology.

#[test]
fn perfect_link_delivers_at_send_time_in_order() {
    let (mut net, a, b) = pair(1, LinkConfig::default());
    assert_eq!(net.next_event(), None);
    for i in 0..3 {
        net.send(t(500), a, b, tagged(i, 60));
    }
    assert_eq!(net.in_flight(), 3);
    assert_eq!(net.next_event(), Some(t(500)));
    assert!(net.poll_deliver(t(499)).is_none());
    for i in 0..3 {
        let d = net.poll_deliver(t(500)).unwrap();
        assert_eq!((d.from, d.to, d.at, d.sent), (a, b, t(500), t(500)));
        assert_eq!(tag_of(&d.frame), i);
    }
    assert!(net.poll_deliver(t(10_000)).is_none());
    let s = net.stats(a, b);
    assert_eq!(
        (s.sent, s.delivered, s.bytes_sent, s.bytes_delivered),
        (3, 3, 180, 180)
    );
    assert_eq!(s.max_queue_bytes, 0);
    assert_eq!(net.stats(b, a), LinkStats::default());
}

#[test]
fn deliveries_interleave_by_time_then_send_order() {
    let mut net = Network::new(3);
    let [a, b, c] = [(); 3].map(|_| net.add_endpoint());
    net.connect(a, b, LinkConfig::default().latency(us(10)));
    net.connect(c, b, LinkConfig::default().latency(us(4)));
    net.connect(b, a, LinkConfig::default());
    net.send(t(0), a, b, tagged(1, 8)); // due 10 µs
    net.send(t(2_000), c, b, tagged(2, 8)); // due 6 µs
    net.send(t(6_000), c, b, tagged(3, 8)); // due 10 µs, scheduled after #1
    net.send(t(7_000), b, a, tagged(4, 8)); // due 7 µs
    let got: Vec<(u32, u64, EndpointId)> = drain(&mut net)
        .iter()
        .map(|d| (tag_of(&d.frame), d.at.as_nanos(), d.from))
        .collect();
    assert_eq!(
        got,
        vec![(2, 6_000, c), (4, 7_000, b), (1, 10_000, a), (3, 10_000, c)]
    );
    let total = net.total_stats();
    assert_eq!((total.sent, total.delivered), (4, 4));
}

#[test]
fn connect_again_replaces_config_and_keeps_counters() {
    let (mut net, a, b) = pair(1, LinkConfig::default());
    net.send(t(0), a, b, tagged(0, 10));
    net.connect(a, b, LinkConfig::default().latency(us(1)));
    assert_eq!(net.link(a, b).unwrap().latency, us(1));
    assert_eq!(net.stats(a, b).sent, 1);
    net.send(t(0), a, b, tagged(1, 10));
    let d = drain(&mut net);
    assert_eq!(d[1].at, t(1_000));
    assert!(net.link(a, a).is_none() && net.link_mut(a, a).is_none());
    assert_eq!(net.endpoint_count(), 2);
    assert_eq!(net.seed(), 1);
    assert_eq!(format!("{a} {b:?}"), "ep0 ep1");
    assert_eq!(b.index(), 1);
}

#[test]
#[should_panic(expected = "no link ep1 -> ep1")]
fn send_on_missing_link_panics() {
    let (mut net, _, b) = pair(1, LinkConfig::default());
    net.send(t(0), b, b, vec![0]);
}

#[test]
#[should_panic(expected = "unknown endpoint")]
fn connect_unknown_endpoint_panics() {
    let mut a = Network::new(0);
    let mut b = Network::new(0);
    let x = a.add_endpoint();
    b.add_endpoint();
    let z = b.add_endpoint();
    a.connect(x, z, LinkConfig::default());
}

// ---------------------------------------------------------------------------------------
// Determinism.

/// A busy three-endpoint run with every impairment on and feedback (b echoes to a and c).
fn busy_run(seed: u64) -> Vec<(u64, u64, EndpointId, EndpointId, Vec<u8>)> {
    let mut net = Network::new(seed);
    let [a, b, c] = [(); 3].map(|_| net.add_endpoint());
    let rough = LinkConfig::default()
        .latency(us(3))
        .jitter(Duration::from_nanos(700))
        .bandwidth_bps(10_000_000_000)
        .queue_limit_bytes(20_000)
        .loss(0.02)
        .duplicate(0.02)
        .reorder(0.02, us(2))
        .corrupt(0.02)
        .ce_mark(0.05)
        .red(Red::new(2_000, 10_000, 0.3));
    net.connect_both(a, b, rough);
    net.connect_both(
        b,
        c,
        rough
            .loss(0.1)
            .bandwidth_bps(1_000_000_000)
            .queue_limit_bytes(4_000),
    );
    let frames = golden_frames();
    let mut work = SplitMix64::new(seed ^ 0xfeed);
    let mut out = Vec::new();
    let mut now = Instant::ZERO;
    for i in 0..3_000u64 {
        now += Duration::from_nanos(work.below(800));
        let f = frames[work.below(frames.len() as u64) as usize].clone();
        let (from, to) = if i % 3 == 0 { (c, b) } else { (a, b) };
        net.send(now, from, to, f);
        while let Some(d) = net.poll_deliver(now) {
            if d.to == b && work.chance(0.5) {
                let back = if d.from == a { c } else { a };
                net.send(now, b, back, d.frame.clone());
            }
            out.push((d.at.as_nanos(), d.sent.as_nanos(), d.from, d.to, d.frame));
        }
    }
    for d in drain(&mut net) {
        out.push((d.at.as_nanos(), d.sent.as_nanos(), d.from, d.to, d.frame));
    }
    let s = net.total_stats();
    assert_eq!(
        s.sent + s.duplicated,
        s.delivered + s.dropped_loss + s.dropped_queue
    );
    assert!(
        s.dropped_queue > 0 && s.corrupted > 0 && s.ce_marked > 0 && s.reordered > 0,
        "{s:?}"
    );
    out
}

#[test]
fn same_seed_same_run_byte_for_byte() {
    let x = busy_run(42);
    let y = busy_run(42);
    assert!(x.len() > 3_000);
    assert_eq!(x, y);
    let z = busy_run(43);
    assert_ne!(x, z);
}

#[test]
fn links_draw_independent_streams() {
    // The fate of a → b frames depends neither on traffic elsewhere nor on the other
    // impairments enabled (common random numbers).
    let lossy = LinkConfig::default().loss(0.3).latency(us(1));
    let fates = |extra_traffic: bool, cfg: LinkConfig| {
        let mut net = Network::new(9);
        let [a, b, c] = [(); 3].map(|_| net.add_endpoint());
        net.connect(a, b, cfg);
        net.connect(a, c, lossy);
        for i in 0..2_000 {
            if extra_traffic {
                net.send(t(i * 10), a, c, tagged(0, 64));
            }
            net.send(t(i * 10), a, b, tagged(i as u32, 64));
        }
        drain(&mut net)
            .into_iter()
            .filter(|d| d.to == b)
            .map(|d| tag_of(&d.frame))
            .collect::<Vec<_>>()
    };
    let base = fates(false, lossy);
    assert_eq!(base, fates(true, lossy));
    // Enabling marking (a no-op on these non-IP frames) or a zero-delay reordering draws
    // other slots of the stream and moves no loss.
    let with_more = fates(false, lossy.ce_mark(0.5).reorder(0.5, Duration::ZERO));
    assert_eq!(base, with_more);
    // Raising the loss rate only adds losses.
    let worse = fates(false, lossy.loss(0.5));
    assert!(worse.iter().all(|i| base.contains(i)));
    assert!(worse.len() < base.len());
}

// ---------------------------------------------------------------------------------------
// Timing.

#[test]
fn bandwidth_spaces_frames_exactly() {
    const N: u64 = 1_000;
    const L: usize = 1_500;
    let cfg = LinkConfig::default()
        .bandwidth_bps(1_000_000_000)
        .latency(us(10));
    let (mut net, a, b) = pair(1, cfg);
    for i in 0..N {
        net.send(t(0), a, b, tagged(i as u32, L));
    }
    let ser = (L * 8) as u64; // ns at 1 Gb/s
    assert_eq!(net.busy_until(a, b), t(N * ser));
    assert_eq!(net.stats(a, b).max_queue_bytes, N * L as u64);
    let d = drain(&mut net);
    assert_eq!(d.len() as u64, N);
    for (i, d) in d.iter().enumerate() {
        assert_eq!(tag_of(&d.frame), i as u32);
        assert_eq!(d.at, t(10_000 + (i as u64 + 1) * ser));
    }
    for w in d.windows(2) {
        assert_eq!(w[1].at - w[0].at, Duration::from_nanos(ser));
    }
    assert_eq!(d.last().unwrap().at, t(10_000 + N * ser));

    // A sender paced below the line rate never queues.
    let (mut net, a, b) = pair(1, cfg);
    for i in 0..100 {
        net.send(t(i * 20_000), a, b, tagged(i as u32, L));
    }
    for (i, d) in drain(&mut net).iter().enumerate() {
        assert_eq!(d.at, t(i as u64 * 20_000 + ser + 10_000));
    }
    assert_eq!(net.stats(a, b).max_queue_bytes, L as u64);
}

#[test]
fn fractional_rate_does_not_drift() {
    // 100 B at 3 Gb/s is 266.67 ns: the k-th frame of a burst ends at floor(k * 800 / 3).
    let (mut net, a, b) = pair(1, LinkConfig::default().bandwidth_bps(3_000_000_000));
    for i in 0..1_000 {
        net.send(t(0), a, b, tagged(i, 100));
    }
    let d = drain(&mut net);
    for (k, d) in d.iter().enumerate() {
        assert_eq!(d.at, t((k as u64 + 1) * 800 / 3), "frame {k}");
    }
    assert_eq!(d.last().unwrap().at, t(266_666));
}

#[test]
fn latency_and_jitter_bounds() {
    let cfg = LinkConfig::default().latency(us(50)).jitter(us(10));
    let (mut net, a, b) = pair(77, cfg);
    let n = 20_000u64;
    for i in 0..n {
        net.send(t(i * 1_000), a, b, tagged(i as u32, 64));
    }
    let d = drain(&mut net);
    assert_eq!(d.len() as u64, n);
    let delays: Vec<u64> = d
        .iter()
        .map(|d| (d.at - d.sent).as_nanos() as u64)
        .collect();
    let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
    assert!(*min >= 50_000 && *max <= 60_000, "{min}..{max}");
    assert!(
        *min < 50_010 && *max > 59_990,
        "jitter does not span its range"
    );
    // Uniform on 0..=10_000 ns: mean 5_000, sd 2_887; the mean of n is within 5 sd/sqrt(n).
    let mean = delays.iter().sum::<u64>() as f64 / n as f64 - 50_000.0;
    let tol = 5.0 * 2_887.0 / (n as f64).sqrt();
    assert!((mean - 5_000.0).abs() < tol, "mean jitter {mean}");
    // Jitter larger than the gap between frames reorders some of them.
    assert!(d
        .windows(2)
        .any(|w| tag_of(&w[1].frame) < tag_of(&w[0].frame)));
}

// ---------------------------------------------------------------------------------------
// Statistical checks of the impairments.

#[test]
fn loss_fraction_is_binomial() {
    let n = 100_000u64;
    for (seed, p) in [(1, 0.01), (2, 0.1), (3, 0.5), (4, 0.0), (5, 1.0)] {
        let (mut net, a, b) = pair(seed, LinkConfig::default().loss(p));
        for i in 0..n {
            net.send(t(i), a, b, tagged(i as u32, 64));
        }
        let delivered = drain(&mut net).len() as u64;
        let s = net.stats(a, b);
        assert_eq!(s.sent, n);
        assert_eq!(delivered + s.dropped_loss, n);
        assert_binomial(s.dropped_loss, n, p, &format!("loss {p}"));
    }
}

#[test]
fn impairment_fractions_are_binomial() {
    let n = 100_000u64;
    let (pd, pr, pc, pm) = (0.05, 0.02, 0.03, 0.2);
    let cfg = LinkConfig::default()
        .duplicate(pd)
        .reorder(pr, us(1))
        .corrupt(pc)
        .ce_mark(pm);
    let (mut net, a, b) = pair(11, cfg);
    let frame = send_only(16, Ecn::Ect0);
    for i in 0..n {
        net.send(t(i * 100), a, b, frame.clone());
    }
    let d = drain(&mut net);
    let s = net.stats(a, b);
    assert_eq!(d.len() as u64, n + s.duplicated);
    assert_binomial(s.duplicated, n, pd, "duplicate");
    assert_binomial(s.reordered, n, pr, "reorder");
    assert_binomial(s.corrupted, n, pc, "corrupt");
    assert_binomial(s.ce_marked, n, pm, "ce_mark");
    let marked = d
        .iter()
        .filter(|d| read_ecn(&d.frame[14..]) == Some(Ecn::Ce))
        .count() as u64;
    assert!(marked >= s.ce_marked, "{marked} < {}", s.ce_marked);
    let bad = d.iter().filter(|d| parse_frame(&d.frame).is_err()).count() as u64;
    assert!(bad >= s.corrupted && bad <= 2 * s.corrupted);
}

#[test]
fn duplicates_are_exact_copies() {
    let cfg = LinkConfig::default()
        .duplicate(0.3)
        .latency(us(5))
        .jitter(us(3))
        .corrupt(0.1)
        .ce_mark(0.5);
    let (mut net, a, b) = pair(5, cfg);
    let n = 10_000u32;
    let frames = golden_frames();
    for i in 0..n {
        // The index goes in trailing bytes (Ethernet padding), which corruption never touches.
        let mut f = frames[i as usize % frames.len()].clone();
        f.extend_from_slice(&i.to_be_bytes()); // trailing bytes: Ethernet padding
        net.send(t(u64::from(i) * 100), a, b, f);
    }
    let d = drain(&mut net);
    let mut by_index: BTreeMap<u32, Vec<&Delivery>> = BTreeMap::new();
    for x in &d {
        let k = x.frame.len();
        let i = u32::from_be_bytes(x.frame[k - 4..].try_into().unwrap());
        by_index.entry(i).or_default().push(x);
    }
    let s = net.stats(a, b);
    assert_eq!(by_index.len() as u32, n);
    let twice: Vec<_> = by_index.values().filter(|v| v.len() == 2).collect();
    assert!(by_index.values().all(|v| v.len() <= 2));
    assert_eq!(twice.len() as u64, s.duplicated);
    assert_binomial(s.duplicated, u64::from(n), 0.3, "duplicate");
    let mut apart = 0;
    for v in twice {
        assert_eq!(v[0].frame, v[1].frame, "a copy differs from its original");
        assert_eq!(v[0].sent, v[1].sent);
        apart += usize::from(v[0].at != v[1].at);
    }
    assert!(apart > 0, "copies never got their own jitter");
}

#[test]
fn reordering_overtakes() {
    let p = 0.05;
    let cfg = LinkConfig::default().latency(us(2)).reorder(p, us(20));
    let (mut net, a, b) = pair(8, cfg);
    let n = 20_000u32;
    for i in 0..n {
        net.send(t(u64::from(i) * 1_000), a, b, tagged(i, 64));
    }
    let d = drain(&mut net);
    let order: Vec<u32> = d.iter().map(|d| tag_of(&d.frame)).collect();
    let held: Vec<u32> = d
        .iter()
        .filter(|d| d.at - d.sent == us(22))
        .map(|d| tag_of(&d.frame))
        .collect();
    assert!(d.iter().all(|d| [us(2), us(22)].contains(&(d.at - d.sent))));
    let s = net.stats(a, b);
    assert_eq!(held.len() as u64, s.reordered);
    assert_binomial(s.reordered, u64::from(n), p, "reorder");
    // A frame is overtaken (a later one is delivered before it) exactly when it was held
    // back, short of the last few whose successors were all held too.
    let mut seen_max = None;
    let mut overtaken = Vec::new();
    for &k in &order {
        if seen_max.is_some_and(|m| m > k) {
            overtaken.push(k);
        }
        seen_max = seen_max.max(Some(k));
    }
    let mut held_sorted = held.clone();
    held_sorted.sort_unstable();
    overtaken.sort_unstable();
    let tail = held_sorted.iter().filter(|&&k| k + 21 >= n).count();
    assert!(overtaken.iter().all(|k| held_sorted.contains(k)));
    assert!(
        overtaken.len() + tail >= held.len(),
        "{} of {}",
        overtaken.len(),
        held.len()
    );
    assert!(overtaken.len() > 900);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    assert_ne!(order, sorted);
}

// ---------------------------------------------------------------------------------------
// Corruption.

#[test]
fn corruption_flips_one_bit_and_roce_receiver_rejects() {
    let frames = golden_frames();
    assert!(frames.len() > 100);
    for seed in 0..8 {
        let (mut net, a, b) = pair(seed, LinkConfig::default().corrupt(1.0));
        for (i, f) in frames.iter().enumerate() {
            assert!(parse_frame(f).is_ok());
            net.send(t(i as u64), a, b, f.clone());
        }
        let d = drain(&mut net);
        assert_eq!(d.len(), frames.len());
        assert_eq!(net.stats(a, b).corrupted, frames.len() as u64);
        let mut bad_icrc = 0;
        for (orig, got) in frames.iter().zip(&d) {
            assert_eq!(hamming(orig, &got.frame), 1);
            match parse_frame(&got.frame) {
                Ok(p) => panic!("corrupted frame accepted: {:?}", p.repr),
                Err(crate::wire::Error::BadIcrc { .. }) => bad_icrc += 1,
                Err(_) => {}
            }
        }
        // Most bits are plain ICRC-covered data: the ICRC check is what catches them.
        assert!(
            bad_icrc * 2 > frames.len(),
            "{bad_icrc} of {}",
            frames.len()
        );
    }
}

#[test]
fn corruption_of_other_frames_flips_one_bit_anywhere() {
    let (mut net, a, b) = pair(4, LinkConfig::default().corrupt(1.0));
    let n = 20_000u32;
    let len = 16;
    let mut hits = [0u32; 16 * 8];
    for i in 0..n {
        net.send(t(u64::from(i)), a, b, vec![0u8; len]);
    }
    for d in drain(&mut net) {
        assert_eq!(hamming(&d.frame, &[0u8; 16]), 1);
        let byte = d.frame.iter().position(|&x| x != 0).unwrap();
        hits[byte * 8 + d.frame[byte].trailing_zeros() as usize] += 1;
    }
    // Every bit position is hit at about n / 128.
    for (bit, &h) in hits.iter().enumerate() {
        assert_binomial(
            u64::from(h),
            u64::from(n),
            1.0 / 128.0,
            &format!("bit {bit}"),
        );
    }
    // An empty frame cannot be corrupted.
    net.send(t(n.into()), a, b, Vec::new());
    assert_eq!(drain(&mut net)[0].frame, Vec::<u8>::new());
    assert_eq!(net.stats(a, b).corrupted, u64::from(n));
}

// ---------------------------------------------------------------------------------------
// ECN marking.

#[test]
fn ce_marking_marks_only_ect_and_keeps_frames_valid() {
    let ops = [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_WRITE_FIRST,
        Opcode::RC_ACK,
        Opcode::UD_SEND_ONLY,
        Opcode::CNP,
    ];
    for (name, framing, extra_vlan) in framings() {
        let (mut net, a, b) = pair(2, LinkConfig::default().ce_mark(1.0));
        let mut sent = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            for ecn in [Ecn::NotEct, Ecn::Ect0, Ecn::Ect1, Ecn::Ce] {
                let (mut f, payload) = framed(framing, extra_vlan, i, *op);
                set_repr_ecn(&mut f, ecn);
                let bytes = emit(&f, &payload);
                net.send(t(0), a, b, bytes.clone());
                sent.push((f, payload, bytes));
            }
        }
        let d = drain(&mut net);
        let mut ect = 0;
        for ((f, payload, bytes), got) in sent.iter().zip(&d) {
            let p = parse_frame(&got.frame).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(p.ip_checksum_ok, "{name}: IPv4 checksum broken");
            assert_eq!(p.payload, &payload[..]);
            let was = f.ip.ecn();
            if matches!(was, Ecn::Ect0 | Ecn::Ect1) {
                ect += 1;
                let mut want = *f;
                set_repr_ecn(&mut want, Ecn::Ce);
                let mut want_repr = parse_frame(bytes).unwrap().repr;
                set_repr_ecn(&mut want_repr, Ecn::Ce);
                assert_eq!(p.repr, want_repr, "{name}");
                assert_eq!(got.frame, emit(&want, payload), "{name}");
            } else {
                assert_eq!(&got.frame, bytes, "{name}: {was:?} frame changed");
            }
        }
        assert_eq!(net.stats(a, b).ce_marked, ect, "{name}");
        assert_eq!(ect, 2 * ops.len() as u64);
    }
}

#[test]
fn ce_marking_leaves_non_ip_and_short_frames_alone() {
    let (mut net, a, b) = pair(2, LinkConfig::default().ce_mark(1.0));
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    arp[14] = 0x46; // would look like ECT(1) IPv4 if it were IP
    arp[15] = 0x01;
    let mut short = send_only(0, Ecn::Ect0);
    short.truncate(14 + 10); // IPv4 header cut short
    let mut mismatch = send_only(0, Ecn::Ect0);
    mismatch[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let frames = [arp, short, mismatch, vec![], vec![1, 2, 3]];
    for f in &frames {
        net.send(t(0), a, b, f.clone());
    }
    let d = drain(&mut net);
    for (f, got) in frames.iter().zip(&d) {
        assert_eq!(f, &got.frame);
    }
    assert_eq!(net.stats(a, b).ce_marked, 0);
}

#[test]
fn ip_offset_handles_tags() {
    let mut f = vec![0u8; 64];
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    assert_eq!(ip_offset(&f), Some((14, false)));
    f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
    f[16..18].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    assert_eq!(ip_offset(&f), Some((18, true)));
    f[12..14].copy_from_slice(&ETHERTYPE_QINQ.to_be_bytes());
    f[16..18].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
    f[20..22].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    assert_eq!(ip_offset(&f), Some((22, false)));
    f[20..22].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
    assert_eq!(ip_offset(&f), None, "three tags");
    assert_eq!(ip_offset(&f[..13]), None);
    // QinQ + ECT(0) IPv4: marked, checksum fixed.
    let inner = send_only(0, Ecn::Ect0);
    let mut q = inner[..12].to_vec();
    q.extend_from_slice(&[0x88, 0xa8, 0x00, 0x0a, 0x81, 0x00, 0x00, 0x14]);
    q.extend_from_slice(&inner[12..]);
    assert!(mark_ce(&mut q));
    assert_eq!(read_ecn(&q[22..]), Some(Ecn::Ce));
    assert_eq!(crate::wire::ip::internet_checksum(&q[22..42]), 0);
}

#[test]
fn red_profile() {
    let r = Red::new(1_000, 5_000, 0.2);
    assert_eq!(r.probability(0), 0.0);
    assert_eq!(r.probability(1_000), 0.0);
    assert!((r.probability(3_000) - 0.1).abs() < 1e-12);
    assert!((r.probability(5_000) - 0.2).abs() < 1e-12);
    assert_eq!(r.probability(5_001), 1.0);
    let step = Red::new(1_000, 1_000, 0.5);
    assert_eq!(step.probability(1_000), 0.0);
    assert_eq!(step.probability(1_001), 1.0);
    let inverted = Red::new(2_000, 1_000, 0.5);
    assert_eq!(inverted.probability(1_500), 0.0);
    assert_eq!(inverted.probability(2_001), 1.0);
}

#[test]
fn red_marking_follows_queue_depth() {
    const BURST: usize = 64;
    const ROUNDS: u64 = 2_000;
    let frame = send_only(940, Ecn::Ect1);
    let s = frame.len();
    let red = Red::new(10 * s, 50 * s, 0.2);
    let cfg = LinkConfig::default().bandwidth_bps(10_000_000_000).red(red);
    let (mut net, a, b) = pair(21, cfg);
    let mut marks = [0u64; BURST];
    for r in 0..ROUNDS {
        let now = t(r * 100_000);
        for _ in 0..BURST {
            net.send(now, a, b, frame.clone());
        }
        // The k-th frame of the burst found k frames queued.
        assert_eq!(net.queue_bytes(a, b, now), (BURST * s) as u64);
        let mut k = 0;
        while let Some(d) = net.poll_deliver(t((r + 1) * 100_000)) {
            let ecn = read_ecn(&d.frame[14..]).unwrap();
            assert!(matches!(ecn, Ecn::Ce | Ecn::Ect1));
            marks[k] += u64::from(ecn == Ecn::Ce);
            assert!(parse_frame(&d.frame).is_ok());
            k += 1;
        }
        assert_eq!(k, BURST);
    }
    for (k, &m) in marks.iter().enumerate() {
        let p = red.probability(k * s);
        assert_binomial(m, ROUNDS, p, &format!("depth {k} frames, p {p:.3}"));
    }
    assert_eq!(marks[..=10], [0; 11]);
    assert!(marks[51..].iter().all(|&m| m == ROUNDS));
    assert_eq!(net.stats(a, b).ce_marked, marks.iter().sum::<u64>());

    // Not-ECT frames are never marked, however deep the queue.
    let (mut net, a, b) = pair(21, cfg);
    for _ in 0..BURST {
        net.send(t(0), a, b, send_only(940, Ecn::NotEct));
    }
    assert!(drain(&mut net)
        .iter()
        .all(|d| read_ecn(&d.frame[14..]) == Some(Ecn::NotEct)));
    assert_eq!(net.stats(a, b).ce_marked, 0);
}

// ---------------------------------------------------------------------------------------
// Queueing.

#[test]
fn queue_limit_tail_drops_and_backlog_drains() {
    let cfg = LinkConfig::default()
        .bandwidth_bps(1_000_000_000)
        .queue_limit_bytes(10_000);
    let (mut net, a, b) = pair(1, cfg);
    for i in 0..100 {
        net.send(t(0), a, b, tagged(i, 1_000));
    }
    let s = net.stats(a, b);
    assert_eq!(
        (s.sent, s.dropped_queue, s.max_queue_bytes),
        (100, 90, 10_000)
    );
    // 8 µs per frame; the frame on the wire counts until its last bit has left.
    assert_eq!(net.queue_bytes(a, b, t(0)), 10_000);
    assert_eq!(net.queue_bytes(a, b, t(7_999)), 10_000);
    assert_eq!(net.queue_bytes(a, b, t(8_000)), 9_000);
    assert_eq!(net.queue_bytes(a, b, t(20_000)), 8_000);
    assert_eq!(net.queue_bytes(a, b, t(80_000)), 0);
    // At 24 µs three frames have left: three of five new ones fit.
    for i in 100..105 {
        net.send(t(24_000), a, b, tagged(i, 1_000));
    }
    assert_eq!(net.stats(a, b).dropped_queue, 92);
    assert_eq!(net.queue_bytes(a, b, t(24_000)), 10_000);
    let d = drain(&mut net);
    let got: Vec<(u32, u64)> = d
        .iter()
        .map(|d| (tag_of(&d.frame), d.at.as_nanos()))
        .collect();
    let mut want: Vec<(u32, u64)> = (0..10).map(|i| (i, (u64::from(i) + 1) * 8_000)).collect();
    want.extend((0..3).map(|j| (100 + j, 80_000 + (u64::from(j) + 1) * 8_000)));
    assert_eq!(got, want);

    // A limit below one frame: only a frame that finds the link idle gets through.
    let (mut net, a, b) = pair(1, cfg.queue_limit_bytes(0));
    for i in 0..5 {
        net.send(t(0), a, b, tagged(i, 1_000));
    }
    net.send(t(8_000), a, b, tagged(5, 1_000));
    let got: Vec<u32> = drain(&mut net).iter().map(|d| tag_of(&d.frame)).collect();
    assert_eq!(got, vec![0, 5]);

    // Without a bandwidth limit nothing ever queues, so nothing is tail-dropped.
    let (mut net, a, b) = pair(1, LinkConfig::default().queue_limit_bytes(10));
    for i in 0..100 {
        net.send(t(0), a, b, tagged(i, 1_000));
    }
    assert_eq!(drain(&mut net).len(), 100);
    assert_eq!(net.queue_bytes(a, b, t(0)), 0);
}

#[test]
fn link_conditions_change_mid_run() {
    let (mut net, a, b) = pair(6, LinkConfig::default().latency(us(1)));
    for i in 0..100 {
        net.send(t(i * 100), a, b, tagged(i as u32, 64));
    }
    let cfg = net.link_mut(a, b).unwrap();
    cfg.loss = 1.0;
    cfg.latency = us(3);
    for i in 100..200 {
        net.send(t(i * 100), a, b, tagged(i as u32, 64));
    }
    *net.link_mut(a, b).unwrap() = LinkConfig::default().latency(us(5));
    for i in 200..300 {
        net.send(t(i * 100), a, b, tagged(i as u32, 64));
    }
    let d = drain(&mut net);
    assert_eq!(d.len(), 200);
    assert!(d[..100].iter().all(|d| d.at - d.sent == us(1)));
    assert!(d[100..]
        .iter()
        .all(|d| d.at - d.sent == us(5) && tag_of(&d.frame) >= 200));
    assert_eq!(net.stats(a, b).dropped_loss, 100);
}

#[test]
fn a_million_frames() {
    // Send and deliver interleaved, recycling the delivered buffers, as a benchmark would.
    let cfg = LinkConfig::default()
        .latency(us(1))
        .jitter(Duration::from_nanos(100))
        .bandwidth_bps(100_000_000_000)
        .loss(0.01)
        .duplicate(0.001)
        .reorder(0.001, us(1));
    let (mut net, a, b) = pair(1_000_000, cfg);
    let n = 1_000_000u64;
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut delivered = 0u64;
    let mut last = Instant::ZERO;
    for i in 0..n {
        let now = t(i * 10);
        let mut f = spare.pop().unwrap_or_else(|| vec![0u8; 64]);
        f.resize(64, 0);
        net.send(now, a, b, f);
        while let Some(d) = net.poll_deliver(now) {
            assert!(d.at >= last);
            last = d.at;
            delivered += 1;
            spare.push(d.frame);
        }
    }
    delivered += drain(&mut net).len() as u64;
    let s = net.stats(a, b);
    assert_eq!(s.delivered, delivered);
    assert_eq!(s.sent + s.duplicated, delivered + s.dropped_loss);
    assert_binomial(s.dropped_loss, n, 0.01, "loss");
    assert!(spare.len() < 1_000, "buffers are recycled");
}

// ---------------------------------------------------------------------------------------
// Properties.

fn arb_config() -> impl Strategy<Value = LinkConfig> {
    (
        (0u64..20_000, 0u64..5_000),
        prop::option::of(100_000_000u64..100_000_000_000),
        prop::option::of(0usize..20_000),
        (0.0..0.5f64, 0.0..0.3f64, 0.0..0.3f64, 0u64..10_000),
        (0.0..0.3f64, 0.0..0.5f64),
        prop::option::of((0usize..10_000, 0usize..30_000, 0.0..1.0f64)),
    )
        .prop_map(
            |((lat, jit), bw, limit, (loss, dup, re, re_d), (cor, ce), red)| LinkConfig {
                latency: Duration::from_nanos(lat),
                jitter: Duration::from_nanos(jit),
                bandwidth_bps: bw,
                queue_limit_bytes: limit,
                loss,
                duplicate: dup,
                reorder: re,
                reorder_delay: Duration::from_nanos(re_d),
                corrupt: cor,
                ce_mark: ce,
                red: red.map(|(lo, hi, p)| Red::new(lo, hi, p)),
            },
        )
}

/// Sends: (gap before it in ns, frame length or a golden-frame index, direction).
fn arb_schedule() -> impl Strategy<Value = Vec<(u64, usize, bool)>> {
    prop::collection::vec((0u64..3_000, 0usize..1_600, any::<bool>()), 0..200)
}

type Trace = Vec<(u64, u64, EndpointId, Vec<u8>)>;

fn run_schedule(seed: u64, cfg: LinkConfig, schedule: &[(u64, usize, bool)]) -> (Trace, Network) {
    let frames = golden_frames();
    let (mut net, a, b) = pair(seed, cfg);
    net.connect(b, a, cfg);
    let mut now = Instant::ZERO;
    let mut trace = Vec::new();
    for (i, &(gap, len, dir)) in schedule.iter().enumerate() {
        now += Duration::from_nanos(gap);
        let (from, to) = if dir { (a, b) } else { (b, a) };
        let f = if len % 2 == 0 {
            frames[len % frames.len()].clone()
        } else {
            tagged(i as u32, len)
        };
        net.send(now, from, to, f);
        while let Some(d) = net.poll_deliver(now) {
            trace.push((d.at.as_nanos(), d.sent.as_nanos(), d.from, d.frame));
        }
    }
    for d in drain(&mut net) {
        trace.push((d.at.as_nanos(), d.sent.as_nanos(), d.from, d.frame));
    }
    (trace, net)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_deterministic_and_conserving(
        seed in any::<u64>(),
        cfg in arb_config(),
        schedule in arb_schedule(),
    ) {
        let (x, net) = run_schedule(seed, cfg, &schedule);
        let (y, _) = run_schedule(seed, cfg, &schedule);
        prop_assert_eq!(&x, &y);
        let s = net.total_stats();
        prop_assert_eq!(s.sent, schedule.len() as u64);
        prop_assert_eq!(s.sent + s.duplicated, s.delivered + s.dropped_loss + s.dropped_queue);
        prop_assert_eq!(s.delivered, x.len() as u64);
        prop_assert_eq!(net.in_flight(), 0);
        let lat = cfg.latency.as_nanos() as u64;
        let mut prev = 0;
        for (at, sent, ..) in &x {
            prop_assert!(*at >= sent + lat);
            prop_assert!(*at >= prev, "delivered out of time order");
            prev = *at;
            if cfg.bandwidth_bps.is_none() {
                let most = lat + cfg.jitter.as_nanos() as u64 + cfg.reorder_delay.as_nanos() as u64;
                prop_assert!(*at <= sent + most);
            }
        }
    }

    #[test]
    fn prop_fifo_without_jitter_or_reordering(
        seed in any::<u64>(),
        cfg in arb_config(),
        schedule in arb_schedule(),
    ) {
        let cfg = LinkConfig { jitter: Duration::ZERO, reorder: 0.0, corrupt: 0.0, ..cfg };
        let (mut net, a, b) = pair(seed, cfg);
        let mut now = Instant::ZERO;
        for (i, &(gap, len, _)) in schedule.iter().enumerate() {
            now += Duration::from_nanos(gap);
            net.send(now, a, b, tagged(i as u32, len));
        }
        let tags: Vec<u32> = drain(&mut net).iter().map(|d| tag_of(&d.frame)).collect();
        prop_assert!(tags.windows(2).all(|w| w[0] <= w[1]), "{:?}", tags);
        let s = net.stats(a, b);
        if let (Some(limit), Some(_)) = (cfg.queue_limit_bytes, cfg.bandwidth_bps) {
            let biggest = schedule.iter().map(|x| x.1.max(4)).max().unwrap_or(0) as u64;
            prop_assert!(s.max_queue_bytes <= (limit as u64).max(biggest));
        }
    }

    #[test]
    fn prop_corruption_flips_exactly_one_bit(
        seed in any::<u64>(),
        frame in prop::collection::vec(any::<u8>(), 1..300),
    ) {
        let (mut net, a, b) = pair(seed, LinkConfig::default().corrupt(1.0));
        net.send(Instant::ZERO, a, b, frame.clone());
        let d = net.poll_deliver(Instant::ZERO).unwrap();
        prop_assert_eq!(hamming(&frame, &d.frame), 1);
    }

    #[test]
    fn prop_golden_corruption_is_rejected(seed in any::<u64>(), pick in any::<prop::sample::Index>()) {
        let frames = golden_frames();
        let f = &frames[pick.index(frames.len())];
        let (mut net, a, b) = pair(seed, LinkConfig::default().corrupt(1.0));
        net.send(Instant::ZERO, a, b, f.clone());
        let d = net.poll_deliver(Instant::ZERO).unwrap();
        prop_assert_eq!(hamming(f, &d.frame), 1);
        prop_assert!(parse_frame(&d.frame).is_err());
    }

    #[test]
    fn prop_ce_marking(
        seed in any::<u64>(),
        which in 0usize..4,
        pick in any::<prop::sample::Index>(),
        ecn in prop::sample::select(vec![Ecn::NotEct, Ecn::Ect0, Ecn::Ect1, Ecn::Ce]),
    ) {
        let (name, framing, extra_vlan) = framings()[which];
        let ops: Vec<Opcode> = Opcode::all_known().filter(|o| o.transport() != crate::wire::Transport::Rd).collect();
        let op = ops[pick.index(ops.len())];
        let (mut f, payload) = framed(framing, extra_vlan, 3, op);
        set_repr_ecn(&mut f, ecn);
        let bytes = emit(&f, &payload);
        let (mut net, a, b) = pair(seed, LinkConfig::default().ce_mark(1.0));
        net.send(Instant::ZERO, a, b, bytes.clone());
        let d = net.poll_deliver(Instant::ZERO).unwrap();
        let p = parse_frame(&d.frame).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
        prop_assert!(p.ip_checksum_ok);
        let want = if matches!(ecn, Ecn::Ect0 | Ecn::Ect1) { Ecn::Ce } else { ecn };
        prop_assert_eq!(p.repr.ip.ecn(), want);
        prop_assert_eq!(net.stats(a, b).ce_marked, u64::from(want != ecn));
        if want == ecn {
            prop_assert_eq!(d.frame, bytes);
        }
    }
}
