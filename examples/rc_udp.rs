//! Two processes, one RC connection over the UDP-socket backend on the loopback interface:
//! the client does an RDMA WRITE, an RDMA READ and two atomics on the server's memory and
//! checks every byte. No root, no setup.
//!
//! ```text
//! cargo run --example rc_udp                    # starts the server process itself, then the client
//! cargo run --example rc_udp -- server [IP]      # the server alone (default 127.0.0.1)
//! cargo run --example rc_udp -- client [SERVER_IP [LOCAL_IP]]   # default 127.0.0.1, 127.0.0.2
//! ```
//!
//! Each process runs a [`Nic`]: a [`Device`](ferroce::verbs::Device) driven by an engine thread
//! over a [`UdpDevice`] bound to `IP:4791` (RoCE v2's port, so each end needs its own loopback
//! address: 127.0.0.1 and 127.0.0.2; all of 127/8 is loopback on Linux). The two ends exchange
//! their QP numbers, PSNs, GIDs and the server's memory key over TCP with perftest's exchange
//! ([`ferroce::oob::perftest`], port 18600 here), connect their QPs (`connect_rc`: RESET → INIT
//! → RTR → RTS) and meet at a barrier; the client then works on the server's memory region
//! while the server's CPU does nothing but wait for the closing barrier, after which it checks
//! what the client wrote.

use ferroce::io::{UdpConfig, UdpDevice};
use ferroce::oob::perftest::{KeyMsg, Role, Session};
use ferroce::runtime::{Nic, NicOptions};
use ferroce::verbs::{
    AccessFlags, Cq, DeviceConfig, MemoryRegion, Mtu, QpCap, QpInitAttr, RcParams, RemoteQp,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};
use ferroce::wire::{MacAddr, QpNumber};
use std::error::Error;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The TCP port of the out-of-band exchange.
const OOB_PORT: u16 = 18600;
/// The server's region: [0, 1024) is written by the client, [1024, 2048) is read by it,
/// the 8 bytes at COUNTER are the atomics' target.
const REGION: usize = 4096;
const WRITE_AT: usize = 0;
const READ_AT: usize = 1024;
const LEN: usize = 1024;
const COUNTER: usize = 4088;
/// The counter's initial value, and what the client's FETCH_ADD and CMP_SWAP do with it.
const START: u64 = 41;
const SWAPPED: u64 = 1000;
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the client writes, and what the server offers to be read: distinct, recognisable.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ip = |i: usize, default: &str| -> Result<IpAddr> {
        Ok(args.get(i).map_or(default, String::as_str).parse()?)
    };
    match args.first().map(String::as_str) {
        None => both(),
        Some("server") => server(ip(1, "127.0.0.1")?),
        Some("client") => client(ip(1, "127.0.0.1")?, ip(2, "127.0.0.2")?),
        Some(other) => Err(format!("unknown mode {other:?}: expected server or client").into()),
    }
}

/// The default: this program again as the server process, then the client here.
fn both() -> Result<()> {
    let mut srv = Command::new(std::env::current_exe()?)
        .args(["server", "127.0.0.1"])
        .stdout(Stdio::piped())
        .spawn()?;
    // The server says when it listens.
    let mut line = String::new();
    let out = srv.stdout.take().ok_or("no server stdout")?;
    let mut out = BufReader::new(out);
    out.read_line(&mut line)?;
    print!("server: {line}");
    let relay = std::thread::spawn(move || {
        for l in out.lines().map_while(std::result::Result::ok) {
            println!("server: {l}");
        }
    });
    let r = client("127.0.0.1".parse()?, "127.0.0.2".parse()?);
    let status = srv.wait()?;
    let _ = relay.join();
    r?;
    if !status.success() {
        return Err(format!("the server process failed: {status}").into());
    }
    println!("both processes checked every byte");
    Ok(())
}

/// One end: a NIC on the UDP backend, a PD, a CQ, an RC QP and a memory region.
struct End {
    nic: Nic,
    cq: Cq,
    qp: QpNumber,
    mr: MemoryRegion,
    psn: u32,
}

fn open(ip: IpAddr, access: AccessFlags, psn: u32) -> Result<End> {
    let dev = UdpDevice::open(&UdpConfig::new(ip))
        .map_err(|e| format!("UDP socket on {ip}:4791: {e}"))?;
    let nic = Nic::start(
        DeviceConfig::new(MacAddr::ZERO, ip),
        dev,
        NicOptions::default(),
    )?;
    let pd = nic.alloc_pd()?;
    let cq = nic.create_cq(64)?;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = nic.create_qp(QpInitAttr::new(pd, cq, cq, cap))?;
    let mr = nic.reg_mr(pd, REGION, access)?;
    Ok(End {
        nic,
        cq,
        qp,
        mr,
        psn,
    })
}

impl End {
    /// Our half of the exchange.
    fn key(&self) -> Result<KeyMsg> {
        let me = self.nic.local_end(self.qp, 0, self.psn).ok_or("no GID")?;
        Ok(KeyMsg {
            lid: 0,
            out_reads: 16,
            qpn: self.qp.get(),
            psn: self.psn,
            rkey: self.mr.rkey().0,
            vaddr: self.mr.addr(),
            gid: me.gid,
            srqn: 0,
        })
    }

    /// Exchange keys over `s`, connect the QP to the peer's, meet at a barrier.
    fn connect(&self, s: &mut Session) -> Result<KeyMsg> {
        let mtu = s.handshake(Mtu::M1024)?;
        let ours = self.key()?;
        let theirs = s.exchange_keys(&[ours])?.pop().ok_or("no key message")?;
        let remote = RemoteQp {
            qpn: QpNumber::new(theirs.qpn),
            gid: theirs.gid,
            // The UDP backend leaves Ethernet to the kernel.
            mac: MacAddr::ZERO,
            psn: theirs.psn,
        };
        let params = RcParams {
            mtu,
            local_psn: self.psn,
            ..RcParams::default()
        };
        self.nic.connect_rc(self.qp, &remote, &params)?;
        s.barrier(&ours)?;
        Ok(theirs)
    }

    /// Post `op` on our region at `[off, off + len)` and wait for its completion.
    fn run(&self, wr_id: u64, op: SendOp, off: usize, len: usize) -> Result<WorkCompletion> {
        let sge = Sge {
            addr: self.mr.addr() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        };
        self.nic
            .post_send(self.qp, SendWr::new(wr_id, op, vec![sge]))?;
        let mut wcs = Vec::new();
        while wcs.is_empty() {
            if !self.nic.wait_cq(self.cq, TIMEOUT)? {
                return Err(format!("no completion for work request {wr_id}").into());
            }
            self.nic.poll_cq(self.cq, &mut wcs, 1)?;
        }
        let wc = wcs[0];
        if wc.wr_id != wr_id || wc.status != WcStatus::Success {
            return Err(format!("work request {wr_id} completed with {wc:?}").into());
        }
        Ok(wc)
    }
}

fn server(ip: IpAddr) -> Result<()> {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let end = open(ip, all, 0x1000)?;
    end.mr.write(READ_AT, &pattern(0xb0, LEN))?;
    end.mr.write(COUNTER, &START.to_ne_bytes())?;
    let listener = TcpListener::bind((ip, OOB_PORT))?;
    println!("listening on {ip} port {OOB_PORT}");
    let (stream, peer) = listener.accept()?;
    let mut s = Session::new(stream, Role::Server, TIMEOUT);
    end.connect(&mut s)?;
    println!(
        "connected to {peer}: QP {} (RoCE v2 over UDP {ip}:4791)",
        end.qp
    );
    // The client works on our memory now; we wait for its closing barrier.
    let ours = end.key()?;
    s.close(&ours)?;
    let mut got = vec![0u8; LEN];
    end.mr.read(WRITE_AT, &mut got)?;
    if got != pattern(0xa0, LEN) {
        return Err("the bytes the client wrote are not what it sent".into());
    }
    let mut c = [0u8; 8];
    end.mr.read(COUNTER, &mut c)?;
    if u64::from_ne_bytes(c) != SWAPPED {
        return Err(format!("counter is {}, expected {SWAPPED}", u64::from_ne_bytes(c)).into());
    }
    println!("the WRITE's {LEN} bytes landed; the counter went {START} -> {SWAPPED}");
    end.nic.shutdown();
    Ok(())
}

fn client(server_ip: IpAddr, ip: IpAddr) -> Result<()> {
    let end = open(ip, AccessFlags::LOCAL_WRITE, 0x2000)?;
    let stream = TcpStream::connect_timeout(&(server_ip, OOB_PORT).into(), TIMEOUT)?;
    let mut s = Session::new(stream, Role::Client, TIMEOUT);
    let theirs = end.connect(&mut s)?;
    let rkey = ferroce::wire::RKey(theirs.rkey);
    let at = |off: usize| theirs.vaddr + off as u64;

    // RDMA WRITE: our [0, 1024) into theirs at WRITE_AT.
    end.mr.write(0, &pattern(0xa0, LEN))?;
    let write = SendOp::RdmaWrite {
        remote_addr: at(WRITE_AT),
        rkey,
    };
    end.run(1, write, 0, LEN)?;
    println!("RDMA WRITE of {LEN} bytes: done");

    // RDMA READ: theirs at READ_AT into our [1024, 2048).
    let read = SendOp::RdmaRead {
        remote_addr: at(READ_AT),
        rkey,
    };
    let wc = end.run(2, read, 1024, LEN)?;
    let mut got = vec![0u8; LEN];
    end.mr.read(1024, &mut got)?;
    if got != pattern(0xb0, LEN) || wc.byte_len as usize != LEN {
        return Err("the bytes read are not the server's".into());
    }
    println!("RDMA READ of {LEN} bytes: every byte is the server's");

    // Atomics on the counter: FETCH_ADD 1 returns 41, then CMP_SWAP 42 -> 1000 returns 42.
    let fetch_add = SendOp::AtomicFetchAdd {
        remote_addr: at(COUNTER),
        rkey,
        add: 1,
    };
    end.run(3, fetch_add, 2048, 8)?;
    let cmp_swap = SendOp::AtomicCmpSwp {
        remote_addr: at(COUNTER),
        rkey,
        compare: START + 1,
        swap: SWAPPED,
    };
    end.run(4, cmp_swap, 2056, 8)?;
    let mut old = [0u8; 16];
    end.mr.read(2048, &mut old)?;
    let (a, b) = (
        u64::from_ne_bytes(old[..8].try_into()?),
        u64::from_ne_bytes(old[8..].try_into()?),
    );
    if (a, b) != (START, START + 1) {
        return Err(format!(
            "atomics returned {a} and {b}, expected {START} and {}",
            START + 1
        )
        .into());
    }
    println!("FETCH_ADD returned {a}, CMP_SWAP returned {b}");

    let ours = end.key()?;
    s.close(&ours)?;
    end.nic.shutdown();
    Ok(())
}
