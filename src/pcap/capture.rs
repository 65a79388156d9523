//! Capture files: a streaming reader for pcap and pcapng (via the `pcap-file` crate) and a
//! pcap writer used by the golden captures and the pcap tap.

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;
use std::io::{Read, Write};
use std::time::Duration;

/// Link-layer types ferroce understands, as numbered in the tcpdump link-type registry.
pub mod linktype {
    /// Ethernet II.
    pub const ETHERNET: u32 = 1;
    /// Raw IP (IPv4 or IPv6).
    pub const RAW: u32 = 101;
    /// Raw IP as DLT 12 (written by some systems instead of 101).
    pub const RAW_OPENBSD: u32 = 12;
    /// Raw IP as DLT 14 (written by others).
    pub const RAW_ALT: u32 = 14;
    /// Linux cooked capture (`tcpdump -i any`).
    pub const LINUX_SLL: u32 = 113;
    /// Raw IPv4.
    pub const IPV4: u32 = 228;
    /// Raw IPv6.
    pub const IPV6: u32 = 229;
    /// Linux cooked capture v2.
    pub const LINUX_SLL2: u32 = 276;
}

/// One frame from a capture file.
#[derive(Debug, Clone)]
pub struct CapturedFrame {
    /// 1-based position in the file.
    pub index: usize,
    /// Time since the Unix epoch.
    pub ts: Duration,
    /// Link-layer type (tcpdump registry number).
    pub linktype: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
    /// Length on the wire; larger than `data.len()` when the capture was cut at a snaplen.
    pub orig_len: u32,
}

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Reading (or writing) failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file starts with neither a pcap nor a pcapng header (the first bytes, in hex).
    #[error("not a pcap or pcapng capture (first bytes {0})")]
    NotACapture(String),
    /// A block or record is inconsistent.
    #[error("corrupt capture: {0}")]
    Corrupt(String),
}

enum Inner<R: Read> {
    Pcap(PcapReader<R>),
    PcapNg(PcapNgReader<R>),
}

/// A streaming reader over a pcap or pcapng file.
pub struct CaptureReader<R: Read> {
    inner: Inner<R>,
    index: usize,
    /// Link types of the pcapng interfaces of the current section.
    ifaces: Vec<u32>,
}

const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// A reader opened by [`open`]: the sniffed magic bytes are replayed in front of the rest.
pub type Opened<R> = CaptureReader<std::io::Chain<std::io::Cursor<Vec<u8>>, R>>;

/// Open a capture from any reader.
pub fn open<R: Read>(mut r: R) -> Result<Opened<R>, CaptureError> {
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut magic[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let head = magic[..got].to_vec();
    let hex: String = head.iter().map(|b| format!("{b:02x}")).collect();
    let chained = std::io::Cursor::new(head).chain(r);
    let inner = if got == 4 && PCAP_MAGICS.contains(&magic) {
        Inner::Pcap(PcapReader::new(chained).map_err(|e| CaptureError::Corrupt(e.to_string()))?)
    } else if got == 4 && magic == PCAPNG_MAGIC {
        Inner::PcapNg(PcapNgReader::new(chained).map_err(|e| CaptureError::Corrupt(e.to_string()))?)
    } else {
        return Err(CaptureError::NotACapture(if hex.is_empty() {
            "none: empty file".into()
        } else {
            hex
        }));
    };
    Ok(CaptureReader {
        inner,
        index: 0,
        ifaces: Vec::new(),
    })
}

impl<R: Read> CaptureReader<R> {
    /// The next frame, `None` at the end, or an error for a corrupt or cut-off file.
    pub fn next_frame(&mut self) -> Option<Result<CapturedFrame, CaptureError>> {
        match &mut self.inner {
            Inner::Pcap(r) => {
                let lt = u32::from(r.header().datalink);
                let p = match r.next_packet()? {
                    Ok(p) => p,
                    Err(e) => return Some(Err(CaptureError::Corrupt(e.to_string()))),
                };
                self.index += 1;
                Some(Ok(CapturedFrame {
                    index: self.index,
                    ts: p.timestamp,
                    linktype: lt,
                    data: p.data.into_owned(),
                    orig_len: p.orig_len,
                }))
            }
            Inner::PcapNg(r) => loop {
                let block = match r.next_block()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(CaptureError::Corrupt(e.to_string()))),
                };
                let lt_of = |id: usize| self.ifaces.get(id).copied().unwrap_or(linktype::ETHERNET);
                let (lt, ts, data, orig) = match block {
                    Block::SectionHeader(_) => {
                        self.ifaces.clear();
                        continue;
                    }
                    Block::InterfaceDescription(idb) => {
                        self.ifaces.push(u32::from(idb.linktype));
                        continue;
                    }
                    Block::EnhancedPacket(epb) => (
                        lt_of(epb.interface_id as usize),
                        epb.timestamp,
                        epb.data.into_owned(),
                        epb.original_len,
                    ),
                    Block::SimplePacket(spb) => (
                        lt_of(0),
                        Duration::ZERO,
                        spb.data.into_owned(),
                        spb.original_len,
                    ),
                    Block::Packet(pb) => (
                        lt_of(usize::from(pb.interface_id)),
                        Duration::from_micros(pb.timestamp),
                        pb.data.into_owned(),
                        pb.original_len,
                    ),
                    _ => continue,
                };
                self.index += 1;
                return Some(Ok(CapturedFrame {
                    index: self.index,
                    ts,
                    linktype: lt,
                    data,
                    orig_len: orig,
                }));
            },
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<CapturedFrame, CaptureError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame()
    }
}

/// A pcap writer (microsecond timestamps, Ethernet link type unless told otherwise).
pub struct PcapSink<W: Write> {
    w: PcapWriter<W>,
}

impl<W: Write> PcapSink<W> {
    /// A writer for Ethernet frames.
    pub fn new(w: W) -> Result<Self, CaptureError> {
        Self::with_linktype(w, linktype::ETHERNET)
    }
    /// A writer for another link type.
    pub fn with_linktype(w: W, lt: u32) -> Result<Self, CaptureError> {
        let header = PcapHeader {
            datalink: DataLink::from(lt),
            snaplen: 65535,
            ..Default::default()
        };
        let w =
            PcapWriter::with_header(w, header).map_err(|e| CaptureError::Corrupt(e.to_string()))?;
        Ok(PcapSink { w })
    }
    /// Append one frame.
    pub fn write(&mut self, ts: Duration, frame: &[u8]) -> Result<(), CaptureError> {
        let len = u32::try_from(frame.len())
            .map_err(|_| CaptureError::Corrupt("frame too long".into()))?;
        self.w
            .write_packet(&PcapPacket::new(ts, len, frame))
            .map_err(|e| CaptureError::Corrupt(e.to_string()))?;
        Ok(())
    }
    /// Flush and return the underlying writer.
    pub fn into_inner(self) -> W {
        self.w.into_writer()
    }
}
