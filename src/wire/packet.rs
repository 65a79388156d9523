//! Whole packets: the RoCE v2 transport part ([`RoceRepr`]: BTH, extension headers, payload,
//! pad, ICRC) and whole frames ([`FrameRepr`]: optional Ethernet, IPv4/IPv6, UDP, transport).
//!
//! [`decode_frame`] parses every layer and reports the ICRC without judging it (what
//! `ferroce inspect` wants); [`parse_frame`] additionally rejects a bad ICRC (what the receive
//! path wants). [`parse_roce`] does the same for a transport part whose IP and UDP headers
//! are given separately (the UDP-socket backend rebuilds them from the socket addresses).

use super::eth::{self, EthernetRepr};
use super::ip::{IpParsed, IpRepr, Ipv4Repr, Ipv6Repr};
use super::opcode::OpFlags;
use super::udp::{self, UdpRepr};
use super::{
    bth, icrc, need_room, BthRepr, Error, ExtRepr, Layer, Opcode, Psn, QpNumber, Result,
    ROCE_V2_PORT,
};
use core::ops::Range;

/// Bytes of pad needed after `payload_len` bytes to reach a multiple of four.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

/// The transport part of a RoCE v2 packet: everything inside UDP.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RoceRepr {
    /// The Base Transport Header.
    pub bth: BthRepr,
    /// The extension headers the opcode calls for.
    pub ext: ExtRepr,
    /// Payload bytes, not counting the pad.
    pub payload_len: usize,
}

impl RoceRepr {
    /// A transport part with the BTH pad count set for `payload_len`.
    pub fn new(mut bth: BthRepr, ext: ExtRepr, payload_len: usize) -> Self {
        bth.pad_count = pad_for(payload_len);
        RoceRepr {
            bth,
            ext,
            payload_len,
        }
    }

    /// BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        self.bth.opcode.info().header_len as usize
    }

    /// Bytes of the whole transport part, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(self.bth.pad_count) + icrc::LEN
    }

    /// Check payload and pad against the opcode's rules. Used by parse and by emit, so that
    /// ferroce never emits what it would reject.
    fn check_payload(&self) -> Result<()> {
        let op = self.bth.opcode;
        let info = op.info();
        let pad = self.bth.pad_count;
        let data = self.payload_len + usize::from(pad);
        if pad > 3 || data % 4 != 0 {
            return Err(Error::BadPadCount { pad, data });
        }
        if !info.flags.contains(OpFlags::PAYLOAD) {
            if self.payload_len != 0 {
                return Err(Error::BadPayloadLength {
                    opcode: op,
                    len: self.payload_len,
                });
            }
            if pad != 0 {
                return Err(Error::BadPadCount { pad, data });
            }
        }
        if info.flags.contains(OpFlags::FIXED8) && self.payload_len != 8 {
            return Err(Error::BadPayloadLength {
                opcode: op,
                len: self.payload_len,
            });
        }
        if info.flags.contains(OpFlags::FULL_MTU) && pad != 0 {
            return Err(Error::PadOnNonLast { opcode: op, pad });
        }
        Ok(())
    }

    /// Parse a transport part (BTH up to and including the ICRC, exactly the UDP payload).
    /// Returns the `Repr` and the byte range of the payload. The ICRC is not checked here.
    pub fn parse(t: &[u8]) -> Result<(RoceRepr, Range<usize>)> {
        let mut repr = RoceRepr::placeholder();
        let payload = repr.parse_in_place(t)?;
        Ok((repr, payload))
    }

    /// A value to parse into (a CNP to QP 0; every field is overwritten).
    fn placeholder() -> RoceRepr {
        RoceRepr::new(
            BthRepr::new(Opcode::CNP, QpNumber::new(0), Psn::new(0)),
            ExtRepr::default(),
            0,
        )
    }

    /// [`parse`](Self::parse) into `self` (whatever it held): the receive path decodes into
    /// the frame it returns instead of moving the large value through each layer. Returns
    /// where the payload is in `t`.
    pub(crate) fn parse_in_place(&mut self, t: &[u8]) -> Result<Range<usize>> {
        let bth = BthRepr::parse(t)?;
        let info = bth.opcode.info();
        if info.is_reserved() {
            return Err(Error::UnknownOpcode(bth.opcode.0));
        }
        self.ext = ExtRepr::default();
        let ext_len = self.ext.parse_into(bth.opcode, &t[bth::HEADER_LEN..])?;
        let hdr = bth::HEADER_LEN + ext_len;
        if t.len() < hdr + icrc::LEN {
            return Err(Error::Truncated {
                layer: Layer::Icrc,
                needed: hdr + icrc::LEN,
                had: t.len(),
            });
        }
        let data = t.len() - hdr - icrc::LEN;
        let pad = usize::from(bth.pad_count);
        if pad > data {
            return Err(Error::BadPadCount {
                pad: bth.pad_count,
                data,
            });
        }
        self.bth = bth;
        self.payload_len = data - pad;
        self.check_payload()?;
        Ok(hdr..hdr + self.payload_len)
    }

    /// Write BTH, extension headers, `payload` and zero pad into `buf`, and a zero ICRC
    /// placeholder (the ICRC needs the IP and UDP headers: see [`FrameRepr::emit`] or
    /// [`RoceRepr::emit_with_icrc`]). Returns the bytes written (`buffer_len()`).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::BadLength {
                layer: Layer::Payload,
                declared: self.payload_len,
                actual: payload.len(),
            });
        }
        if self.bth.opcode.info().is_reserved() {
            return Err(Error::UnknownOpcode(self.bth.opcode.0));
        }
        self.check_payload()?;
        let n = self.buffer_len();
        need_room(buf, n)?;
        self.bth.emit(buf)?;
        let hdr = bth::HEADER_LEN
            + self
                .ext
                .emit(self.bth.opcode, &mut buf[bth::HEADER_LEN..])?;
        buf[hdr..hdr + payload.len()].copy_from_slice(payload);
        buf[hdr + payload.len()..n].fill(0);
        Ok(n)
    }

    /// Emit and fill in the ICRC computed against the given IP and UDP headers.
    pub fn emit_with_icrc(
        &self,
        buf: &mut [u8],
        payload: &[u8],
        ip_hdr: &[u8],
        udp_hdr: &[u8],
    ) -> Result<usize> {
        let n = self.emit(buf, payload)?;
        let crc = icrc::compute(ip_hdr, udp_hdr, &buf[..n - icrc::LEN]);
        buf[n - icrc::LEN..n].copy_from_slice(&icrc::to_wire(crc));
        Ok(n)
    }
}

/// A whole RoCE v2 frame. `eth` is `None` for raw-IP framing (link type 101, or the IP packet
/// handed to a UDP socket).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FrameRepr {
    /// The Ethernet header (`None`: the frame starts with IP).
    pub eth: Option<EthernetRepr>,
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: UdpRepr,
    /// Everything inside UDP.
    pub roce: RoceRepr,
}

impl FrameRepr {
    /// Bytes the frame occupies (no Ethernet padding or FCS).
    pub fn buffer_len(&self) -> usize {
        self.eth.map_or(0, |e| e.buffer_len())
            + self.ip.buffer_len()
            + udp::HEADER_LEN
            + self.roce.buffer_len()
    }

    /// Emit the whole frame, ICRC included, into `buf`. Returns the bytes written. The
    /// Ethernet ethertype is taken from the IP version, whatever `eth.ethertype` says.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.roce.payload_len {
            return Err(Error::BadLength {
                layer: Layer::Payload,
                declared: self.roce.payload_len,
                actual: payload.len(),
            });
        }
        self.emit_with(buf, |dst| {
            dst.copy_from_slice(payload);
            Ok(())
        })
    }

    /// Emit the frame, letting `fill` write the `roce.payload_len` payload bytes in place (so
    /// a sender can gather them straight from memory into the transmit buffer: no staging
    /// copy). The pad, the ICRC and (if `udp_checksum` is set in `self.udp`) nothing else is
    /// computed afterwards. Returns the bytes written.
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<usize> {
        emit_frame_with(buf, self.eth, &self.ip, &self.udp, &self.roce, fill)
    }
}

/// Byte offsets of each layer within a parsed frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Offsets {
    /// Where the IP header starts.
    pub ip: usize,
    /// Where the UDP header starts.
    pub udp: usize,
    /// Where the BTH starts.
    pub bth: usize,
    /// Where the payload starts.
    pub payload: usize,
    /// Where the ICRC starts.
    pub icrc: usize,
    /// One past the ICRC (frame bytes after it are Ethernet padding).
    pub end: usize,
}

/// [`FrameRepr::emit_with`] from the layers' `Repr`s by reference: a sender that keeps the
/// transport part and the path apart (the device's transmit path) frames a packet without
/// first moving the large [`RoceRepr`] into a [`FrameRepr`].
pub fn emit_frame_with(
    buf: &mut [u8],
    eth: Option<EthernetRepr>,
    ip: &IpRepr,
    udp: &UdpRepr,
    roce: &RoceRepr,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<usize> {
    let t_len = roce.buffer_len();
    let n = eth.map_or(0, |e| e.buffer_len()) + ip.buffer_len() + udp::HEADER_LEN + t_len;
    need_room(buf, n)?;
    if roce.bth.opcode.info().is_reserved() {
        return Err(Error::UnknownOpcode(roce.bth.opcode.0));
    }
    roce.check_payload()?;
    let mut off = 0;
    if let Some(mut e) = eth {
        e.ethertype = ip.ethertype();
        off = e.emit(buf)?;
    }
    let ip_start = off;
    ip.emit(&mut buf[off..], udp::HEADER_LEN + t_len)?;
    off += ip.buffer_len();
    let udp_start = off;
    udp.emit(&mut buf[off..], t_len)?;
    off += udp::HEADER_LEN;
    let t = &mut buf[off..off + t_len];
    roce.bth.emit(t)?;
    let hdr = bth::HEADER_LEN + roce.ext.emit(roce.bth.opcode, &mut t[bth::HEADER_LEN..])?;
    fill(&mut t[hdr..hdr + roce.payload_len])?;
    // The pad (0-3 bytes; none in most packets: no memset call for an empty range).
    let pad = &mut t[hdr + roce.payload_len..t_len - icrc::LEN];
    if !pad.is_empty() {
        pad.fill(0);
    }
    // One CRC pass over the contiguous frame, the variant fields masked in place.
    let crc = icrc::compute_in_place(buf, ip_start, udp_start, off, off + t_len - icrc::LEN);
    buf[off + t_len - icrc::LEN..off + t_len].copy_from_slice(&icrc::to_wire(crc));
    Ok(n)
}

/// A decoded frame: the `Repr` of every layer, the payload in place, and the ICRC.
#[derive(Clone, Copy, Debug)]
pub struct ParsedFrame<'a> {
    /// Every layer's `Repr`.
    pub repr: FrameRepr,
    /// The payload, in place (without the pad).
    pub payload: &'a [u8],
    /// The ICRC on the wire.
    pub icrc_stored: u32,
    /// The ICRC computed over the frame.
    pub icrc_computed: u32,
    /// IPv4 header checksum valid (always true for IPv6). Not an error: routers fix it.
    pub ip_checksum_ok: bool,
    /// Where each layer starts.
    pub offsets: Offsets,
}

impl ParsedFrame<'_> {
    /// Whether the stored ICRC equals the computed one.
    pub fn icrc_ok(&self) -> bool {
        self.icrc_stored == self.icrc_computed
    }
}

/// A decoded transport part (see [`parse_roce`]).
#[derive(Clone, Copy, Debug)]
pub struct ParsedRoce<'a> {
    /// The transport headers.
    pub repr: RoceRepr,
    /// The payload, in place (without the pad).
    pub payload: &'a [u8],
}

/// Decode an IP packet carrying RoCE v2 (everything but the ICRC verdict).
pub fn decode_ip(packet: &[u8]) -> Result<ParsedFrame<'_>> {
    decode_at(packet, None, 0, true)
}

/// Decode an Ethernet frame carrying RoCE v2 (everything but the ICRC verdict).
pub fn decode_frame(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    let mut p = decode_frame_unchecked(frame)?;
    p.icrc_computed = frame_icrc(frame, &p.offsets);
    Ok(p)
}

/// [`decode_frame`] without the ICRC pass: `icrc_computed` is left 0. For a receiver that
/// drops what is not addressed to it before paying for the CRC; [`frame_icrc`] computes it
/// afterwards, from the same frame and the returned offsets.
pub fn decode_frame_unchecked(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    let (eth, off) = EthernetRepr::parse(frame)?;
    match eth.ethertype {
        eth::ETHERTYPE_IPV4 | eth::ETHERTYPE_IPV6 => decode_at(frame, Some(eth), off, false),
        et => Err(Error::NotIp(et)),
    }
}

/// The ICRC of the frame `buf` whose layers `o` locates (as [`decode_frame_unchecked`]
/// returned them): the value [`ParsedFrame::icrc_computed`] would hold. Offsets not from a
/// decode of `buf` give a meaningless value, never a panic.
pub fn frame_icrc(buf: &[u8], o: &Offsets) -> u32 {
    match (
        buf.get(o.ip..o.udp),
        buf.get(o.udp..o.bth),
        buf.get(o.bth..o.icrc),
    ) {
        (Some(ip), Some(udp), Some(t)) => icrc::compute(ip, udp, t),
        _ => 0,
    }
}

fn decode_at(
    buf: &[u8],
    eth: Option<EthernetRepr>,
    ip_off: usize,
    with_icrc: bool,
) -> Result<ParsedFrame<'_>> {
    let ip_buf = &buf[ip_off..];
    let version = ip_buf.first().map(|b| b >> 4);
    let (ip, parsed): (IpRepr, IpParsed) = match version {
        Some(4) => {
            let (r, p) = Ipv4Repr::parse(ip_buf)?;
            (IpRepr::V4(r), p)
        }
        Some(6) => {
            let (r, p) = Ipv6Repr::parse(ip_buf)?;
            (IpRepr::V6(r), p)
        }
        Some(v) => return Err(Error::BadIpVersion(v)),
        None => {
            return Err(Error::Truncated {
                layer: Layer::Ipv4,
                needed: 20,
                had: 0,
            })
        }
    };
    if let Some(e) = eth {
        if e.ethertype != ip.ethertype() {
            return Err(Error::BadIpVersion(version.unwrap_or(0)));
        }
    }
    let udp_off = ip_off + parsed.header_len;
    let ip_end = udp_off + parsed.payload_len;
    let (udp_repr, udp_len) = UdpRepr::parse(&buf[udp_off..ip_end])?;
    if udp_repr.dst_port != ROCE_V2_PORT {
        return Err(Error::NotRoceV2Port(udp_repr.dst_port));
    }
    if udp_len != parsed.payload_len {
        return Err(Error::BadLength {
            layer: Layer::Udp,
            declared: udp_len,
            actual: parsed.payload_len,
        });
    }
    let bth_off = udp_off + udp::HEADER_LEN;
    let t = &buf[bth_off..ip_end];
    let icrc_off = ip_end - icrc::LEN;
    // The transport part is parsed into the frame in place (not moved in: it is large).
    let mut p = ParsedFrame {
        repr: FrameRepr {
            eth,
            ip,
            udp: udp_repr,
            roce: RoceRepr::placeholder(),
        },
        payload: &[],
        icrc_stored: icrc::stored(t).unwrap_or(0),
        icrc_computed: 0,
        ip_checksum_ok: parsed.checksum_ok,
        offsets: Offsets {
            ip: ip_off,
            udp: udp_off,
            bth: bth_off,
            payload: bth_off,
            icrc: icrc_off,
            end: ip_end,
        },
    };
    let pr = p.repr.roce.parse_in_place(t)?;
    if with_icrc {
        p.icrc_computed = icrc::compute(
            &buf[ip_off..udp_off],
            &buf[udp_off..bth_off],
            &t[..t.len() - icrc::LEN],
        );
    }
    p.payload = &t[pr.clone()];
    p.offsets.payload = bth_off + pr.start;
    Ok(p)
}

fn verdict(p: ParsedFrame<'_>) -> Result<ParsedFrame<'_>> {
    if p.icrc_ok() || cfg!(fuzzing) {
        Ok(p)
    } else {
        Err(Error::BadIcrc {
            expected: p.icrc_computed,
            found: p.icrc_stored,
        })
    }
}

/// Parse an Ethernet frame and verify its ICRC: the receive path's entry point.
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    verdict(decode_frame(frame)?)
}

/// Parse a raw IP packet and verify its ICRC.
pub fn parse_ip(packet: &[u8]) -> Result<ParsedFrame<'_>> {
    verdict(decode_ip(packet)?)
}

/// Parse a transport part (the UDP payload) and verify its ICRC against the given IP and UDP
/// headers (as rebuilt by a backend that does not see them).
pub fn parse_roce<'a>(
    ip_hdr: &[u8],
    udp_hdr: &[u8],
    transport: &'a [u8],
) -> Result<ParsedRoce<'a>> {
    let (repr, pr) = RoceRepr::parse(transport)?;
    let stored = icrc::stored(transport).unwrap_or(0);
    let computed = icrc::compute(ip_hdr, udp_hdr, &transport[..transport.len() - icrc::LEN]);
    if stored != computed && !cfg!(fuzzing) {
        return Err(Error::BadIcrc {
            expected: computed,
            found: stored,
        });
    }
    Ok(ParsedRoce {
        repr,
        payload: &transport[pr],
    })
}
