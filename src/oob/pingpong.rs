//! `ibv_rc_pingpong`'s exchange (rdma-core `libibverbs/examples`, TCP port 18515):
//! 1. client → server: 52 bytes, `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the GID as 32 hex
//!    digits, NUL-terminated;
//! 2. server → client: the same format (the server moves its QP to RTR/RTS first);
//! 3. after the run, client → server: `"done\0"`.
//!
//! `ibv_uc_pingpong` and `ibv_ud_pingpong` exchange the same messages. `ibv_srq_pingpong`
//! sends [`SRQ_MSGS`] of them each way whatever its `-q`: one per QP, then all-zero ones
//! (`"0000:000000:000000:"` and 32 zeros) for the QPs it does not have; the client writes its
//! 256, reads the server's 256, then writes `"done\0"` ([`client_exchange_many`],
//! [`server_exchange_many`]).

use super::{gid_from_wire, gid_to_wire, read_exact, write_all, CmError};
use std::net::TcpStream;
use std::time::Duration;

/// Length of the connection message, NUL included.
pub const MSG_LEN: usize = 52;

/// One side's connection data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// GID (IPv4-mapped for IPv4).
    pub gid: [u8; 16],
}

impl Dest {
    /// The 52 bytes on the wire.
    pub fn to_wire(&self) -> [u8; MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            gid_to_wire(&self.gid)
        );
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parse the peer's message (as `sscanf("%x:%x:%x:%s")` plus the GID conversion would).
    pub fn from_wire(buf: &[u8]) -> Result<Dest, CmError> {
        let bad = |d: &str| CmError::Malformed {
            what: "ibv_rc_pingpong connection message",
            detail: d.to_string(),
        };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let s = std::str::from_utf8(&buf[..end]).map_err(|_| bad("not ASCII"))?;
        let mut it = s.split(':');
        let mut field = |name: &str| it.next().ok_or_else(|| bad(&format!("missing {name}")));
        let lid = u16::from_str_radix(field("LID")?, 16).map_err(|_| bad("LID"))?;
        let qpn = u32::from_str_radix(field("QPN")?, 16).map_err(|_| bad("QPN"))?;
        let psn = u32::from_str_radix(field("PSN")?, 16).map_err(|_| bad("PSN"))?;
        let gid = gid_from_wire(field("GID")?).ok_or_else(|| bad("GID"))?;
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad("QPN or PSN wider than 24 bits"));
        }
        Ok(Dest { lid, qpn, psn, gid })
    }
}

/// Client side: send ours, receive theirs.
pub fn client_exchange(s: &mut TcpStream, ours: &Dest, timeout: Duration) -> Result<Dest, CmError> {
    write_all(s, &ours.to_wire())?;
    let mut buf = [0u8; MSG_LEN];
    read_exact(s, &mut buf, "connection message", timeout)?;
    Dest::from_wire(&buf)
}

/// Server side: receive theirs, let `ready` connect our QP (RTR/RTS), then send ours.
pub fn server_exchange(
    s: &mut TcpStream,
    ours: &Dest,
    timeout: Duration,
    ready: impl FnOnce(&Dest) -> Result<(), CmError>,
) -> Result<Dest, CmError> {
    let mut buf = [0u8; MSG_LEN];
    read_exact(s, &mut buf, "connection message", timeout)?;
    let theirs = Dest::from_wire(&buf)?;
    ready(&theirs)?;
    write_all(s, &ours.to_wire())?;
    Ok(theirs)
}

/// `ibv_srq_pingpong`'s `MAX_QP`: the number of connection messages each side sends.
pub const SRQ_MSGS: usize = 256;

/// Our `ours.len()` messages followed by all-zero ones up to `n`.
fn padded(ours: &[Dest], n: usize) -> Vec<u8> {
    let zero = Dest {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: [0; 16],
    };
    (0..n)
        .flat_map(|i| ours.get(i).unwrap_or(&zero).to_wire())
        .collect()
}

fn read_many(s: &mut TcpStream, n: usize, timeout: Duration) -> Result<Vec<Dest>, CmError> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [0u8; MSG_LEN];
    for _ in 0..n {
        read_exact(s, &mut buf, "connection message", timeout)?;
        out.push(Dest::from_wire(&buf)?);
    }
    Ok(out)
}

/// Client side of `ibv_srq_pingpong`'s exchange: send `n` messages (ours, then zeros), read
/// the server's `n`, send `done`. Returns all `n` of theirs.
pub fn client_exchange_many(
    s: &mut TcpStream,
    ours: &[Dest],
    n: usize,
    timeout: Duration,
) -> Result<Vec<Dest>, CmError> {
    write_all(s, &padded(ours, n))?;
    let theirs = read_many(s, n, timeout)?;
    send_done(s)?;
    Ok(theirs)
}

/// Server side of `ibv_srq_pingpong`'s exchange: read the client's `n` messages, let `ready`
/// connect our QPs, send our `n`, wait for `done`. Returns all `n` of theirs.
pub fn server_exchange_many(
    s: &mut TcpStream,
    ours: &[Dest],
    n: usize,
    timeout: Duration,
    ready: impl FnOnce(&[Dest]) -> Result<(), CmError>,
) -> Result<Vec<Dest>, CmError> {
    let theirs = read_many(s, n, timeout)?;
    ready(&theirs)?;
    write_all(s, &padded(ours, n))?;
    wait_done(s, timeout)?;
    Ok(theirs)
}

/// The client's closing `done`.
pub fn send_done(s: &mut TcpStream) -> Result<(), CmError> {
    write_all(s, b"done\0")
}

/// The server waits for `done` before it reports.
pub fn wait_done(s: &mut TcpStream, timeout: Duration) -> Result<(), CmError> {
    let mut buf = [0u8; 5];
    read_exact(s, &mut buf, "done", timeout)?;
    if &buf[..4] != b"done" {
        return Err(CmError::Malformed {
            what: "done",
            detail: format!("{buf:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_captured_rxe_message() {
        // Captured from ibv_rc_pingpong (rdma-core 44) on Linux rxe (shared/rxe-vm/NOTES.md).
        let wire = b"0000:000011:670d5e:00000000000000000000ffff0a4d000c\0";
        assert_eq!(wire.len(), MSG_LEN);
        let d = Dest::from_wire(wire).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x11, 0x670d5e));
        assert_eq!(d.gid[10..], [0xff, 0xff, 10, 77, 0, 12]);
        assert_eq!(&d.to_wire()[..], &wire[..]);
    }

    #[test]
    fn srq_exchange_pads_to_256_messages_and_ends_with_done() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mine = [
            Dest::from_wire(b"0000:000011:670d5e:00000000000000000000ffff0a4d000c\0").unwrap(),
            Dest::from_wire(b"0000:000012:000001:00000000000000000000ffff0a4d000c\0").unwrap(),
        ];
        // A peer that behaves as srq_pingpong's server: reads 256, writes 256, reads done.
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = vec![0u8; SRQ_MSGS * MSG_LEN];
            s.read_exact(&mut got).unwrap();
            let mut reply = Vec::new();
            for i in 0..SRQ_MSGS {
                let m = format!(
                    "0000:{:06x}:000000:00000000000000000000ffff0a4d000d",
                    if i < 3 { 0x20 + i } else { 0 }
                );
                reply.extend_from_slice(m.as_bytes());
                reply.push(0);
            }
            s.write_all(&reply).unwrap();
            let mut done = [0u8; 5];
            s.read_exact(&mut done).unwrap();
            (got, done)
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let theirs = client_exchange_many(&mut s, &mine, SRQ_MSGS, Duration::from_secs(5)).unwrap();
        let (got, done) = peer.join().unwrap();
        assert_eq!(&got[..MSG_LEN], &mine[0].to_wire()[..]);
        assert_eq!(&got[MSG_LEN..2 * MSG_LEN], &mine[1].to_wire()[..]);
        // The rest: srq_pingpong's memset(my_dest, 0) entries, byte for byte.
        let zero = b"0000:000000:000000:00000000000000000000000000000000\0";
        for i in 2..SRQ_MSGS {
            assert_eq!(
                &got[i * MSG_LEN..(i + 1) * MSG_LEN],
                &zero[..],
                "message {i}"
            );
        }
        assert_eq!(&done, b"done\0");
        assert_eq!(theirs.len(), SRQ_MSGS);
        assert_eq!(
            theirs[..4].iter().map(|d| d.qpn).collect::<Vec<_>>(),
            [0x20, 0x21, 0x22, 0]
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &b"hello"[..],
            b"0000:000011",
            b"0000:zz0011:670d5e:00000000000000000000ffff0a4d000c\0",
            b"0000:1000000:0:00000000000000000000ffff0a4d000c\0",
            b"0000:11:22:00ff\0",
            &[0xff; 52],
        ] {
            assert!(Dest::from_wire(bad).is_err(), "{bad:?}");
        }
    }
}
