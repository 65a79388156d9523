// The parts the engine_pair and ud_uc harnesses share, included into each with `include!`
// (each harness is compiled alone, as a fuzz target and as a stable test). The including file
// provides the ferroce types it names (`Device`, `Pd`, `AccessFlags`, `MemoryRegion`, `Sge`,
// `LKey`, `RKey`, `Instant`, `VecDeque`, the wire representations, `Ipv4Addr`), `REGION`,
// and its `Side` with the fields `dev`, `mac`, `ip`, `taken`, `ro`, `local`, `other` and
// `images` (the bytes of those three at the start), plus
// the hooks `sent(&mut Side, frame)` (a frame taken from the side's device), `seen(&mut Side,
// frame, to_b, how)` (a frame leaving the link towards the side, whatever becomes of it) and
// `give(&mut Side, now, frame)` (a frame handed to the side's device).

/// Reads the fuzz input; zeros once it is exhausted.
pub struct Input<'a> {
    d: &'a [u8],
    i: usize,
}

impl<'a> Input<'a> {
    pub fn new(d: &'a [u8]) -> Self {
        Input { d, i: 0 }
    }
    pub fn done(&self) -> bool {
        self.i >= self.d.len()
    }
    pub fn u8(&mut self) -> u8 {
        let b = self.d.get(self.i).copied().unwrap_or(0);
        self.i += 1;
        b
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// A region of `REGION` bytes filled with `fill`.
fn region(dev: &mut Device, pd: Pd, access: AccessFlags, fill: u8) -> MemoryRegion {
    let mr = dev.reg_mr(pd, REGION, access).expect("reg_mr");
    mr.fill(fill);
    mr
}

/// An (rkey, address) read from the input: `pick(k)` (k < 16) names one of the peer's
/// regions, `None` a wild key and address; the address mostly inside the region's first
/// half, sometimes just before it or near the top of the address space.
fn target_in<'m>(
    inp: &mut Input,
    pick: impl FnOnce(u8) -> Option<&'m MemoryRegion>,
) -> (RKey, u64) {
    let k = inp.u8();
    let off = u64::from(inp.u16());
    let Some(mr) = pick(k % 16) else {
        return (RKey(inp.u32()), inp.u64());
    };
    let addr = match k >> 5 {
        0..=5 => mr.addr() + off % (REGION as u64 / 2),
        6 => mr.addr().wrapping_sub(off),
        _ => u64::MAX - off,
    };
    (mr.rkey(), addr)
}

/// A scatter/gather entry read from the input: `pick(k)` (k < 14) names the region, `len`
/// reads the length (cut at the region's end); k = 14 is a wild key, address and length,
/// k = 15 the whole region's length from an offset into `rw` (beyond its end).
fn sge_in<'m>(
    inp: &mut Input,
    rw: &MemoryRegion,
    len: impl FnOnce(&mut Input) -> u32,
    pick: impl FnOnce(u8) -> &'m MemoryRegion,
) -> Sge {
    let k = inp.u8();
    let off = u64::from(inp.u16()) % (REGION as u64 / 2);
    let len = len(inp);
    let mr = match k % 16 {
        14 => {
            return Sge {
                addr: inp.u64(),
                length: inp.u32(),
                lkey: LKey(inp.u32()),
            }
        }
        15 => {
            return Sge {
                addr: rw.addr() + off,
                length: REGION as u32,
                lkey: rw.lkey(),
            }
        }
        k => pick(k),
    };
    Sge {
        addr: mr.addr() + off,
        length: len.min((REGION as u64 - off) as u32),
        lkey: mr.lkey(),
    }
}

/// A forged frame from `from`'s MAC (with IPv4 source `src`) to `to`, CE-marked or ECT(0),
/// carrying `bth`, `ext` and `payload` with a valid ICRC; `None` for a combination the wire
/// layer refuses to emit (payload rules): not a frame.
#[allow(clippy::too_many_arguments)]
fn forged_frame(
    to: &Side,
    from: &Side,
    src: Ipv4Addr,
    ce: bool,
    sport: u8,
    bth: BthRepr,
    ext: ExtRepr,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let frame = FrameRepr {
        eth: Some(EthernetRepr {
            dst: to.mac,
            src: from.mac,
            vlan: None,
            ethertype: 0x0800,
        }),
        ip: IpRepr::V4(Ipv4Repr {
            src,
            dst: to.ip,
            dscp: 0,
            ecn: if ce { Ecn::Ce } else { Ecn::Ect0 },
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: 0xc000 | u16::from(sport),
            dst_port: 4791,
            checksum: 0,
        },
        roce: RoceRepr::new(bth, ext, payload.len()),
    };
    let mut buf = vec![0u8; frame.buffer_len()];
    frame.emit(&mut buf, payload).ok()?;
    Some(buf)
}

/// The link: frames in flight each way (at most 4,096 each; beyond that they are lost).
struct Link {
    ab: VecDeque<Vec<u8>>,
    ba: VecDeque<Vec<u8>>,
    now: Instant,
    buf: Vec<u8>,
}

impl Link {
    fn new() -> Link {
        Link {
            ab: VecDeque::new(),
            ba: VecDeque::new(),
            now: Instant::ZERO,
            buf: vec![0u8; 9000],
        }
    }

    /// Take what both devices have to send.
    fn pull(&mut self, a: &mut Side, b: &mut Side) {
        for (s, q) in [(&mut *a, &mut self.ab), (&mut *b, &mut self.ba)] {
            while let Some(n) = s
                .dev
                .poll_transmit(self.now, &mut self.buf)
                .expect("buffer fits")
            {
                s.taken += 1;
                let f = &self.buf[..n];
                sent(s, f);
                if q.len() < 4096 {
                    q.push_back(f.to_vec());
                }
            }
        }
    }

    /// Deliver one frame from the queue `ab` (towards b) or `ba`, by `how`: lose it,
    /// duplicate it, move it to the back, or deliver it.
    fn deliver(&mut self, a: &mut Side, b: &mut Side, to_b: bool, how: u8) {
        let (q, to) = if to_b {
            (&mut self.ab, b)
        } else {
            (&mut self.ba, a)
        };
        let Some(f) = q.pop_front() else { return };
        seen(to, &f, to_b, how);
        match how % 8 {
            0 => {} // lost
            1 => {
                give(to, self.now, &f);
                give(to, self.now, &f);
            }
            2 => q.push_back(f),
            _ => give(to, self.now, &f),
        }
    }
}

/// The checks of a side's device after every action: the regions nobody may write are
/// unchanged, no CQ overran, `tx_frames` is the frames taken, the drops are at most the
/// frames received, no async event was lost (the events are then discarded).
fn check_device(s: &mut Side, who: &str) {
    for (mr, img) in [&s.ro, &s.local, &s.other].into_iter().zip(&s.images) {
        assert!(
            mr.with_bytes(|b| b == &img[..]),
            "{who}: a region nobody may write changed: {mr:?}"
        );
    }
    let (dc, _) = s.dev.counters();
    assert_eq!(
        dc.cq_overruns, 0,
        "{who}: CQ overrun with a CQ deeper than the queues"
    );
    assert_eq!(
        dc.tx_frames, s.taken,
        "{who}: tx_frames is not the frames taken"
    );
    let drops = dc.icrc_drops
        + dc.malformed_drops
        + dc.not_roce
        + dc.unknown_qp_drops
        + dc.address_drops
        + dc.header_drops;
    assert!(
        drops <= dc.rx_frames,
        "{who}: more drops than frames: {dc:?}"
    );
    assert_eq!(s.dev.async_events_lost(), 0, "{who}: async events lost");
    while s.dev.get_async_event().is_some() {}
}
