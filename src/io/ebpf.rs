//! A tiny eBPF assembler, the XDP program of the AF_XDP backend written with it, and an
//! interpreter for the instructions that program uses (so its packet parsing is unit-tested
//! without a kernel; the kernel's verifier and a real run check it again in
//! `tests/xdp_backend.rs`).
//!
//! No C toolchain, no ELF, no libbpf: [`xsk_redirect_program`] returns the instructions, and
//! the only relocation — the XSKMAP's file descriptor in a `BPF_LD_IMM64` with
//! `BPF_PSEUDO_MAP_FD` — is filled in right there.
//!
//! # The program
//!
//! ```text
//! Ethernet [802.1Q tag] → IPv4 (any IHL ≥ 5, not a fragment) | IPv6 (next header UDP)
//!   → UDP destination port 4791 → bpf_redirect_map(&xskmap, ctx->rx_queue_index, XDP_PASS)
//! anything else (ARP, ICMP, TCP, other UDP, IPv6 extension headers, fragments, truncated
//! frames)                      → XDP_PASS
//! ```
//!
//! The `XDP_PASS` in the helper's flags is its fallback: with no socket in the XSKMAP at that
//! queue, RoCE frames go up the kernel stack like everything else instead of being dropped.
//!
//! Every packet load is preceded by the comparison the verifier wants:
//! `ptr + N > data_end → pass`, on the same register the load then uses, so the verifier
//! knows `N` bytes from `ptr` are inside the packet. The IPv4 header length is a variable
//! (5..15 words): it is masked and shifted (so the verifier sees a bounded scalar, 20..60)
//! before it is added to the packet pointer, and the UDP bounds check comes after.

/// Name the program is loaded under (the kernel keeps 15 bytes); also how an attached
/// program is recognised as ferroce's.
pub const PROGRAM_NAME: &str = "ferroce_xsk";
/// Name of the XSKMAP.
pub const MAP_NAME: &str = "ferroce_xsks";

/// XDP verdicts (`enum xdp_action`).
pub mod action {
    /// Drop, signalling an error.
    pub const ABORTED: u32 = 0;
    /// Drop.
    pub const DROP: u32 = 1;
    /// Hand to the kernel's stack.
    pub const PASS: u32 = 2;
    /// Send back out of the interface.
    pub const TX: u32 = 3;
    /// Redirect (to an AF_XDP socket here).
    pub const REDIRECT: u32 = 4;
}

/// `BPF_FUNC_redirect_map`.
pub const HELPER_REDIRECT_MAP: i32 = 51;

// Instruction classes.
const BPF_LD: u8 = 0x00;
const BPF_LDX: u8 = 0x01;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
// Sizes.
/// 4-byte load.
pub const W: u8 = 0x00;
/// 2-byte load.
pub const H: u8 = 0x08;
/// 1-byte load.
pub const B: u8 = 0x10;
const DW: u8 = 0x18;
// Modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
// Operand source.
const K: u8 = 0x00;
const X: u8 = 0x08;
// ALU operations.
const ADD: u8 = 0x00;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const MOV: u8 = 0xb0;
// Jump operations.
const JA: u8 = 0x00;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `src_reg` of a `BPF_LD_IMM64` whose immediate is a map file descriptor.
pub const BPF_PSEUDO_MAP_FD: u8 = 1;

/// Conditional jumps (unsigned comparisons on 64-bit registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `==`.
    Eq = 0x10,
    /// `>`.
    Gt = 0x20,
    /// `>=`.
    Ge = 0x30,
    /// `!=`.
    Ne = 0x50,
    /// `<`.
    Lt = 0xa0,
    /// `<=`.
    Le = 0xb0,
}

impl Cond {
    fn from_op(op: u8) -> Option<Cond> {
        Some(match op {
            0x10 => Cond::Eq,
            0x20 => Cond::Gt,
            0x30 => Cond::Ge,
            0x50 => Cond::Ne,
            0xa0 => Cond::Lt,
            0xb0 => Cond::Le,
            _ => return None,
        })
    }
    fn holds(self, a: u64, b: u64) -> bool {
        match self {
            Cond::Eq => a == b,
            Cond::Gt => a > b,
            Cond::Ge => a >= b,
            Cond::Ne => a != b,
            Cond::Lt => a < b,
            Cond::Le => a <= b,
        }
    }
}

/// Registers. R0: return value; R1..R5: arguments (clobbered by calls); R6..R9: preserved
/// across calls; R10: frame pointer.
pub type Reg = u8;
/// Return value.
pub const R0: Reg = 0;
/// First argument (the context in a program).
pub const R1: Reg = 1;
/// Second argument.
pub const R2: Reg = 2;
/// Third argument.
pub const R3: Reg = 3;
/// Fourth argument.
pub const R4: Reg = 4;
/// Fifth argument.
pub const R5: Reg = 5;
/// Preserved across calls.
pub const R6: Reg = 6;

/// One 8-byte eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Insn {
    /// Opcode.
    pub code: u8,
    /// Destination register.
    pub dst: u8,
    /// Source register.
    pub src: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

impl Insn {
    /// The kernel's layout: `code`, the two 4-bit registers (`dst_reg` is the low nibble on
    /// little-endian machines, the high one on big-endian: a C bitfield), `off`, `imm`, in
    /// native byte order.
    pub fn to_bytes(self) -> [u8; 8] {
        let regs = if cfg!(target_endian = "little") {
            (self.src << 4) | (self.dst & 0xf)
        } else {
            (self.dst << 4) | (self.src & 0xf)
        };
        let o = self.off.to_ne_bytes();
        let i = self.imm.to_ne_bytes();
        [self.code, regs, o[0], o[1], i[0], i[1], i[2], i[3]]
    }
}

/// A jump target, bound to an instruction index with [`Asm::bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// An assembler: appends instructions, resolves labels at [`Asm::finish`].
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    /// (jump instruction index, target)
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    /// An empty program.
    pub fn new() -> Self {
        Self::default()
    }
    /// A new label, to be bound later with `bind`.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    /// The next instruction is `l`'s target.
    pub fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> &mut Self {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
        self
    }
    /// `dst = src` (64-bit).
    pub fn mov_reg(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.push(BPF_ALU64 | MOV | X, dst, src, 0, 0)
    }
    /// `dst = imm` (sign-extended to 64 bits).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.push(BPF_ALU64 | MOV | K, dst, 0, 0, imm)
    }
    /// `dst += imm`.
    pub fn add_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.push(BPF_ALU64 | ADD | K, dst, 0, 0, imm)
    }
    /// `dst += src`.
    pub fn add_reg(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.push(BPF_ALU64 | ADD | X, dst, src, 0, 0)
    }
    /// `dst &= imm`.
    pub fn and_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.push(BPF_ALU64 | AND | K, dst, 0, 0, imm)
    }
    /// `dst <<= imm`.
    pub fn lsh_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.push(BPF_ALU64 | LSH | K, dst, 0, 0, imm)
    }
    /// `dst = *(size *)(src + off)` (zero-extended), `size` one of [`B`], [`H`], [`W`].
    pub fn load(&mut self, size: u8, dst: Reg, src: Reg, off: i16) -> &mut Self {
        self.push(BPF_LDX | MEM | size, dst, src, off, 0)
    }
    /// `if dst <cond> imm goto target`.
    pub fn jmp_imm(&mut self, c: Cond, dst: Reg, imm: i32, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.push(BPF_JMP | c as u8 | K, dst, 0, 0, imm)
    }
    /// `if dst <cond> src goto target`.
    pub fn jmp_reg(&mut self, c: Cond, dst: Reg, src: Reg, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.push(BPF_JMP | c as u8 | X, dst, src, 0, 0)
    }
    /// `goto target`.
    pub fn ja(&mut self, target: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), target));
        self.push(BPF_JMP | JA, 0, 0, 0, 0)
    }
    /// `dst = map` for the map with file descriptor `fd` (a two-slot `BPF_LD_IMM64` with
    /// `src_reg = BPF_PSEUDO_MAP_FD`; the kernel replaces the descriptor with the map).
    pub fn ld_map_fd(&mut self, dst: Reg, fd: i32) -> &mut Self {
        self.push(BPF_LD | DW | IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd);
        self.push(0, 0, 0, 0, 0)
    }
    /// Call helper `id` (arguments in R1..R5, result in R0).
    pub fn call(&mut self, id: i32) -> &mut Self {
        self.push(BPF_JMP | CALL, 0, 0, 0, id)
    }
    /// Return R0.
    pub fn exit(&mut self) -> &mut Self {
        self.push(BPF_JMP | EXIT, 0, 0, 0, 0)
    }
    /// Resolve jumps (offsets count instructions after the jump) and return the program.
    pub fn finish(mut self) -> Result<Vec<Insn>, AsmError> {
        for &(at, l) in &self.fixups {
            let target = self.labels[l.0].ok_or(AsmError::Unbound(l.0))?;
            let off = target as i64 - at as i64 - 1;
            self.insns[at].off = i16::try_from(off).map_err(|_| AsmError::TooFar { at, off })?;
        }
        Ok(self.insns)
    }
}

/// Why [`Asm::finish`] cannot resolve the program's jumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    /// A jump's target label was never bound.
    #[error("label {0} never bound")]
    Unbound(usize),
    /// A jump's offset does not fit 16 bits.
    #[error("jump at {at} too far ({off})")]
    TooFar {
        /// The jump's index.
        at: usize,
        /// Its offset.
        off: i64,
    },
}

/// Offsets in `struct xdp_md`, the XDP program's context.
pub mod xdp_md {
    /// `data`: the frame's first byte.
    pub const DATA: i16 = 0;
    /// `data_end`: one past its last byte.
    pub const DATA_END: i16 = 4;
    /// `rx_queue_index`: the receive queue.
    pub const RX_QUEUE_INDEX: i16 = 16;
}

/// The RoCE v2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// The 16-bit value a 2-byte packet load yields for wire bytes `be` (the load is in host
/// byte order, the packet is big-endian).
fn wire16(be: u16) -> i32 {
    i32::from(u16::from_ne_bytes(be.to_be_bytes()))
}

/// The XDP program: redirect RoCE v2 (UDP dport 4791 over IPv4/IPv6, optionally one 802.1Q
/// tag) to the AF_XDP socket of the receiving queue in XSKMAP `map_fd`, pass everything
/// else. See the module documentation.
pub fn xsk_redirect_program(map_fd: i32) -> Vec<Insn> {
    let mut a = Asm::new();
    let pass = a.label();
    let l3 = a.label();
    let ipv4 = a.label();
    let ipv6 = a.label();
    let udp = a.label();

    // R6 = ctx (R1 is clobbered by the helper call); R2 = data; R3 = data_end.
    a.mov_reg(R6, R1)
        .load(W, R2, R6, xdp_md::DATA)
        .load(W, R3, R6, xdp_md::DATA_END);
    // Ethernet: 14 bytes; ethertype at 12.
    a.mov_reg(R4, R2)
        .add_imm(R4, 14)
        .jmp_reg(Cond::Gt, R4, R3, pass);
    a.load(H, R5, R2, 12).add_imm(R2, 14);
    // One 802.1Q tag: 4 more bytes, the real ethertype at 2.
    a.jmp_imm(Cond::Ne, R5, wire16(0x8100), l3);
    a.mov_reg(R4, R2)
        .add_imm(R4, 4)
        .jmp_reg(Cond::Gt, R4, R3, pass);
    a.load(H, R5, R2, 2).add_imm(R2, 4);
    a.bind(l3);
    a.jmp_imm(Cond::Eq, R5, wire16(0x0800), ipv4);
    a.jmp_imm(Cond::Eq, R5, wire16(0x86dd), ipv6);
    a.ja(pass);

    // IPv4: the fixed 20 bytes first.
    a.bind(ipv4);
    a.mov_reg(R4, R2)
        .add_imm(R4, 20)
        .jmp_reg(Cond::Gt, R4, R3, pass);
    a.load(B, R5, R2, 9).jmp_imm(Cond::Ne, R5, 17, pass); // protocol UDP
                                                          // A fragment (MF set or offset ≠ 0) goes to the kernel for reassembly.
    a.load(H, R5, R2, 6)
        .and_imm(R5, wire16(0x3fff))
        .jmp_imm(Cond::Ne, R5, 0, pass);
    // Header length: IHL × 4, 20..60 (IHL < 5 is malformed).
    a.load(B, R5, R2, 0)
        .and_imm(R5, 0x0f)
        .jmp_imm(Cond::Lt, R5, 5, pass)
        .lsh_imm(R5, 2)
        .add_reg(R2, R5)
        .ja(udp);

    // IPv6: 40 bytes, next header must be UDP directly (no extension headers).
    a.bind(ipv6);
    a.mov_reg(R4, R2)
        .add_imm(R4, 40)
        .jmp_reg(Cond::Gt, R4, R3, pass);
    a.load(B, R5, R2, 6).jmp_imm(Cond::Ne, R5, 17, pass);
    a.add_imm(R2, 40);

    // UDP: 8 bytes, destination port at 2.
    a.bind(udp);
    a.mov_reg(R4, R2)
        .add_imm(R4, 8)
        .jmp_reg(Cond::Gt, R4, R3, pass);
    a.load(H, R5, R2, 2)
        .jmp_imm(Cond::Ne, R5, wire16(ROCE_PORT), pass);

    // return bpf_redirect_map(&xskmap, ctx->rx_queue_index, XDP_PASS);
    a.load(W, R2, R6, xdp_md::RX_QUEUE_INDEX)
        .ld_map_fd(R1, map_fd)
        .mov_imm(R3, action::PASS as i32)
        .call(HELPER_REDIRECT_MAP)
        .exit();

    a.bind(pass);
    a.mov_imm(R0, action::PASS as i32).exit();
    a.finish().expect("the XDP program's labels are all bound")
}

/// What [`interpret`] saw the program do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The verdict (R0 at exit).
    pub verdict: u32,
    /// The key of a `bpf_redirect_map` call, if one was made.
    pub redirect_key: Option<u32>,
}

/// Why [`interpret`] stopped without a verdict (`at`: the instruction's index).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// The program counter left the program.
    #[error("pc {0} out of the program")]
    PcOutOfProgram(usize),
    /// A register number above 10.
    #[error("bad register at {0}")]
    BadRegister(usize),
    /// An ALU operation the interpreter does not model.
    #[error("unsupported ALU op {op:#x} at {at}")]
    AluOp {
        /// The operation bits.
        op: u8,
        /// Where.
        at: usize,
    },
    /// A context field the interpreter does not model.
    #[error("unsupported context offset {0}")]
    ContextOffset(i16),
    /// A packet read past its end (what the kernel's verifier prevents).
    #[error("out-of-bounds packet read of {size} at {offset} (len {len})")]
    OutOfBounds {
        /// Bytes read.
        size: usize,
        /// From this offset.
        offset: usize,
        /// The packet's length.
        len: usize,
    },
    /// A load from an address that is not the context or the packet.
    #[error("load from unknown address {addr:#x} at {at}")]
    UnknownAddress {
        /// The address.
        addr: u64,
        /// Where.
        at: usize,
    },
    /// A load other than of the XSKMAP.
    #[error("unsupported LD at {0}")]
    Ld(usize),
    /// A call other than `bpf_redirect_map` on the XSKMAP.
    #[error("unsupported call at {0}")]
    Call(usize),
    /// A jump the interpreter does not model.
    #[error("unsupported jump {op:#x} at {at}")]
    Jump {
        /// The operation bits.
        op: u8,
        /// Where.
        at: usize,
    },
    /// An instruction class the interpreter does not model.
    #[error("unsupported instruction class {class} at {at}")]
    Class {
        /// The class bits.
        class: u8,
        /// Where.
        at: usize,
    },
    /// The program ran 10 000 instructions without exiting.
    #[error("no exit after 10000 steps")]
    NoExit,
}

/// Run `prog` on `packet` arriving on `rx_queue`, with an XSKMAP that holds a socket for the
/// keys where `has_socket` is true. Supports exactly the instructions the assembler emits.
/// A packet read outside `packet` (which the kernel's verifier exists to prevent) is an
/// error, as is any other fault; the interpreter is for tests.
pub fn interpret(
    prog: &[Insn],
    packet: &[u8],
    rx_queue: u32,
    has_socket: &dyn Fn(u32) -> bool,
) -> Result<Run, Fault> {
    // Pointers are modelled as addresses in disjoint regions.
    const CTX: u64 = 0x1_0000_0000;
    const PKT: u64 = 0x2_0000_0000;
    const MAP: u64 = 0x3_0000_0000;
    let mut r = [0u64; 11];
    r[1] = CTX;
    let mut redirect_key = None;
    let mut pc = 0usize;
    for _ in 0..10_000 {
        let i = *prog.get(pc).ok_or(Fault::PcOutOfProgram(pc))?;
        let (dst, src) = (usize::from(i.dst), usize::from(i.src));
        if dst > 10 || src > 10 {
            return Err(Fault::BadRegister(pc));
        }
        let class = i.code & 0x07;
        let operand = |r: &[u64; 11]| {
            if i.code & X != 0 {
                r[src]
            } else {
                i.imm as i64 as u64
            }
        };
        match class {
            BPF_ALU64 => {
                let v = operand(&r);
                r[dst] = match i.code & 0xf0 {
                    ADD => r[dst].wrapping_add(v),
                    AND => r[dst] & v,
                    LSH => r[dst].wrapping_shl(v as u32),
                    MOV => v,
                    op => return Err(Fault::AluOp { op, at: pc }),
                };
            }
            BPF_LDX => {
                let size = match i.code & 0x18 {
                    B => 1,
                    H => 2,
                    W => 4,
                    _ => 8,
                };
                let addr = r[src].wrapping_add(i.off as i64 as u64);
                r[dst] = if (CTX..CTX + 24).contains(&addr) {
                    // The verifier rewrites these 32-bit context loads into pointer loads.
                    match (addr - CTX) as i16 {
                        xdp_md::DATA => PKT,
                        xdp_md::DATA_END => PKT + packet.len() as u64,
                        xdp_md::RX_QUEUE_INDEX => u64::from(rx_queue),
                        o => return Err(Fault::ContextOffset(o)),
                    }
                } else if (PKT..PKT + (1 << 20)).contains(&addr) {
                    let o = (addr - PKT) as usize;
                    let b = packet.get(o..o + size).ok_or(Fault::OutOfBounds {
                        size,
                        offset: o,
                        len: packet.len(),
                    })?;
                    // Host byte order, like the machine the kernel runs on.
                    match size {
                        1 => u64::from(b[0]),
                        2 => u64::from(u16::from_ne_bytes([b[0], b[1]])),
                        _ => u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                    }
                } else {
                    return Err(Fault::UnknownAddress { addr, at: pc });
                };
            }
            BPF_LD => {
                if i.code != BPF_LD | DW | IMM || i.src != BPF_PSEUDO_MAP_FD {
                    return Err(Fault::Ld(pc));
                }
                r[dst] = MAP;
                pc += 2;
                continue;
            }
            BPF_JMP => match i.code & 0xf0 {
                JA => {
                    pc = (pc as i64 + 1 + i64::from(i.off)) as usize;
                    continue;
                }
                CALL => {
                    if i.imm != HELPER_REDIRECT_MAP || r[1] != MAP {
                        return Err(Fault::Call(pc));
                    }
                    let key = r[2] as u32;
                    redirect_key = Some(key);
                    r[0] = if has_socket(key) {
                        u64::from(action::REDIRECT)
                    } else {
                        r[3] & 0x3 // the fallback action in the flags' low bits
                    };
                    r[1..=5].fill(0xdead_beef); // clobbered
                }
                EXIT => {
                    return Ok(Run {
                        verdict: r[0] as u32,
                        redirect_key,
                    })
                }
                op => {
                    let c = Cond::from_op(op).ok_or(Fault::Jump { op, at: pc })?;
                    if c.holds(r[dst], operand(&r)) {
                        pc = (pc as i64 + 1 + i64::from(i.off)) as usize;
                        continue;
                    }
                }
            },
            _ => return Err(Fault::Class { class, at: pc }),
        }
        pc += 1;
    }
    Err(Fault::NoExit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::golden::{self, Framing};
    use crate::wire::Opcode;

    fn roce(framing: Framing) -> Vec<u8> {
        let (f, payload) = golden::frame(framing, 3, Opcode::RC_SEND_ONLY);
        let mut b = vec![0u8; f.buffer_len()];
        let n = f.emit(&mut b, &payload).unwrap();
        b.truncate(n);
        b
    }

    fn verdict(p: &[u8]) -> Run {
        let prog = xsk_redirect_program(7);
        interpret(&prog, p, 3, &|q| q == 3).unwrap()
    }

    const REDIRECTED: Run = Run {
        verdict: action::REDIRECT,
        redirect_key: Some(3),
    };
    const PASSED: Run = Run {
        verdict: action::PASS,
        redirect_key: None,
    };

    /// The IPv4 RoCE frame with `words` 4-byte option words (IHL 5 + words).
    fn with_ipv4_options(words: usize) -> Vec<u8> {
        let mut p = roce(Framing::Ipv4);
        p[14] = 0x40 | (5 + words as u8);
        let opts = vec![1u8; words * 4]; // NOP options
        p.splice(34..34, opts);
        p
    }

    #[test]
    fn encoding_matches_the_kernel_layout() {
        let i = Insn {
            code: 0x61,
            dst: 2,
            src: 6,
            off: 4,
            imm: -1,
        };
        assert_eq!(i.to_bytes(), [0x61, 0x62, 4, 0, 0xff, 0xff, 0xff, 0xff]);
        let p = xsk_redirect_program(42);
        let ld = p.iter().position(|i| i.code == 0x18).expect("an LD_IMM64");
        assert_eq!(p[ld].src, BPF_PSEUDO_MAP_FD);
        assert_eq!(p[ld].imm, 42);
        assert_eq!(p[ld + 1], Insn::default());
        assert!(p.len() < 64, "{} instructions", p.len());
    }

    #[test]
    fn roce_is_redirected_on_every_framing() {
        assert_eq!(verdict(&roce(Framing::Ipv4)), REDIRECTED);
        assert_eq!(verdict(&roce(Framing::Ipv6)), REDIRECTED);
        assert_eq!(verdict(&roce(Framing::VlanIpv4)), REDIRECTED);
        for words in 0..=10 {
            assert_eq!(
                verdict(&with_ipv4_options(words)),
                REDIRECTED,
                "IHL {}",
                5 + words
            );
        }
        // VLAN + IPv6.
        let mut v6 = roce(Framing::Ipv6);
        v6.splice(12..12, [0x81, 0x00, 0x20, 0x3d]);
        assert_eq!(verdict(&v6), REDIRECTED);
    }

    #[test]
    fn the_socket_of_the_receiving_queue_is_used_and_pass_is_the_fallback() {
        let prog = xsk_redirect_program(7);
        let p = roce(Framing::Ipv4);
        let run = interpret(&prog, &p, 5, &|_| false).unwrap();
        assert_eq!(
            run,
            Run {
                verdict: action::PASS,
                redirect_key: Some(5)
            }
        );
    }

    #[test]
    fn everything_else_passes() {
        let v4 = roce(Framing::Ipv4);
        let v6 = roce(Framing::Ipv6);
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut p = v4.clone();
        p[12..14].copy_from_slice(&[0x08, 0x06]); // ARP
        cases.push(("arp", p));
        let mut p = v4.clone();
        p[23] = 1; // ICMP
        cases.push(("icmp", p));
        let mut p = v4.clone();
        p[23] = 6; // TCP, "port" 4791
        cases.push(("tcp", p));
        let mut p = v4.clone();
        p[36..38].copy_from_slice(&53u16.to_be_bytes());
        cases.push(("udp dport 53", p));
        let mut p = v4.clone();
        p[34..36].copy_from_slice(&4791u16.to_be_bytes());
        p[36..38].copy_from_slice(&4792u16.to_be_bytes());
        cases.push(("udp sport 4791", p));
        let mut p = v4.clone();
        p[20] |= 0x20; // MF
        cases.push(("first fragment", p));
        let mut p = v4.clone();
        p[21] = 8; // offset 64
        cases.push(("later fragment", p));
        let mut p = v4.clone();
        p[14] = 0x44; // IHL 4
        cases.push(("ihl 4", p));
        let mut p = v6.clone();
        p[20] = 0; // hop-by-hop options first
        cases.push(("ipv6 extension header", p));
        let mut p = v4.clone();
        p.splice(12..12, [0x88, 0xa8, 0, 1]); // 802.1ad outer tag
        cases.push(("802.1ad", p));
        let mut p = v4.clone();
        p.splice(12..12, [0x81, 0x00, 0, 1, 0x81, 0x00, 0, 2]); // two 802.1Q tags
        cases.push(("double 802.1Q", p));
        let mut p = v4.clone();
        p[12..14].copy_from_slice(&[0x86, 0xdd]); // says IPv6, is IPv4
        cases.push(("wrong ethertype", p));
        for (what, p) in cases {
            assert_eq!(verdict(&p), PASSED, "{what}");
        }
    }

    #[test]
    fn no_truncation_reads_out_of_bounds() {
        let mut frames = vec![
            roce(Framing::Ipv4),
            roce(Framing::Ipv6),
            roce(Framing::VlanIpv4),
            with_ipv4_options(10),
        ];
        let mut v6 = roce(Framing::Ipv6);
        v6.splice(12..12, [0x81, 0x00, 0x20, 0x3d]);
        frames.push(v6);
        for f in &frames {
            // The program checks the whole UDP header is there before reading its port.
            let udp_end = headers_end(f);
            for cut in 0..f.len() {
                let r = verdict(&f[..cut]);
                if cut < udp_end {
                    assert_eq!(r, PASSED, "cut at {cut}");
                } else {
                    assert_eq!(r, REDIRECTED, "cut at {cut}");
                }
            }
        }
    }

    /// Offset just past the UDP header of a frame built above.
    fn headers_end(f: &[u8]) -> usize {
        let mut o = 14;
        let mut et = u16::from_be_bytes([f[12], f[13]]);
        if et == 0x8100 {
            et = u16::from_be_bytes([f[16], f[17]]);
            o += 4;
        }
        o += if et == 0x0800 {
            usize::from(f[o] & 0xf) * 4
        } else {
            40
        };
        o + 8
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_read_out_of_bounds(p in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)) {
            let prog = xsk_redirect_program(7);
            let r = interpret(&prog, &p, 0, &|_| true);
            proptest::prop_assert!(r.is_ok(), "{:?}", r);
        }

        #[test]
        fn mutated_roce_headers_never_read_out_of_bounds(
            at in 0usize..70, val in proptest::prelude::any::<u8>(), cut in 0usize..120
        ) {
            let mut p = roce(Framing::VlanIpv4);
            p[at] = val;
            p.truncate(cut);
            let prog = xsk_redirect_program(7);
            proptest::prop_assert!(interpret(&prog, &p, 0, &|_| true).is_ok());
        }
    }
}
