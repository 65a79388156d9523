//! Classic BPF (`struct sock_filter`) programs for `SO_ATTACH_FILTER`: a small assembler
//! with forward labels, and a reference interpreter of the instructions ferroce's programs
//! use, so that every filter is tested without a kernel.
//!
//! Two programs are built on it: the packet socket's RoCE v2 filter
//! ([`crate::io::af_packet::filter`]) and the UDP socket's per-QP filter
//! ([`crate::io::udp_filter`]).

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Generic field (constant, offset).
    pub k: u32,
}

// Opcode parts (linux/filter.h, linux/bpf_common.h).
pub(crate) const LD: u16 = 0x00;
pub(crate) const LDX: u16 = 0x01;
pub(crate) const ALU: u16 = 0x04;
pub(crate) const JMP: u16 = 0x05;
pub(crate) const RET: u16 = 0x06;
pub(crate) const MISC: u16 = 0x07;
pub(crate) const W: u16 = 0x00;
pub(crate) const H: u16 = 0x08;
pub(crate) const B: u16 = 0x10;
pub(crate) const ABS: u16 = 0x20;
pub(crate) const IND: u16 = 0x40;
pub(crate) const LEN: u16 = 0x80;
pub(crate) const MSH: u16 = 0xa0;
pub(crate) const AND: u16 = 0x50;
pub(crate) const JEQ: u16 = 0x10;
pub(crate) const JGT: u16 = 0x20;
pub(crate) const JGE: u16 = 0x30;
pub(crate) const JSET: u16 = 0x40;
pub(crate) const K: u16 = 0x00;
pub(crate) const TXA: u16 = 0x80;

/// `SKF_NET_OFF`: an absolute load at `NET_OFF + n` reads byte `n` of the network (IP)
/// header, wherever the socket's data starts (a UDP socket's filter sees the UDP header at 0).
pub const NET_OFF: u32 = (-0x10_0000i32) as u32;

/// Snap length returned for an accepted packet: all of it.
pub const ACCEPT: u32 = u32::MAX;

/// The kernel's limit on a classic program's length (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// Jump targets while assembling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The next instruction.
    Next,
    /// A named label, placed later with [`Asm::label`].
    Label(&'static str),
    /// Skip this many instructions after the next.
    Skip(u8),
}

/// Why a program could not be assembled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    /// A jump to a label that was never placed.
    #[error("BPF: undefined label {0}")]
    Undefined(&'static str),
    /// A jump backwards (classic BPF only jumps forwards).
    #[error("BPF: backward jump to {0}")]
    Backward(&'static str),
    /// A jump further than 255 instructions.
    #[error("BPF: jump too far")]
    TooFar,
    /// More than [`MAX_INSNS`] instructions.
    #[error("BPF: program of {0} instructions, longer than the kernel takes")]
    TooLong(usize),
}

pub(crate) struct Asm {
    insns: Vec<(Insn, Target, Target)>,
    labels: Vec<(&'static str, usize)>,
}

impl Asm {
    pub(crate) fn new() -> Self {
        Asm {
            insns: Vec::new(),
            labels: Vec::new(),
        }
    }
    pub(crate) fn label(&mut self, name: &'static str) {
        self.labels.push((name, self.insns.len()));
    }
    pub(crate) fn op(&mut self, code: u16, k: u32) {
        self.insns.push((
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            Target::Next,
            Target::Next,
        ));
    }
    pub(crate) fn jmp(&mut self, code: u16, k: u32, jt: Target, jf: Target) {
        self.insns.push((
            Insn {
                code: JMP | code | K,
                jt: 0,
                jf: 0,
                k,
            },
            jt,
            jf,
        ));
    }
    pub(crate) fn finish(self) -> Result<Vec<Insn>, AsmError> {
        if self.insns.len() > MAX_INSNS {
            return Err(AsmError::TooLong(self.insns.len()));
        }
        let find = |name: &'static str| {
            self.labels
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, at)| *at)
                .ok_or(AsmError::Undefined(name))
        };
        self.insns
            .iter()
            .enumerate()
            .map(|(pc, (insn, jt, jf))| {
                let rel = |t: &Target| -> Result<u8, AsmError> {
                    match *t {
                        Target::Next => Ok(0),
                        Target::Skip(n) => Ok(n),
                        Target::Label(l) => {
                            let to = find(l)?;
                            if to <= pc {
                                return Err(AsmError::Backward(l));
                            }
                            u8::try_from(to - pc - 1).map_err(|_| AsmError::TooFar)
                        }
                    }
                };
                Ok(Insn {
                    jt: rel(jt)?,
                    jf: rel(jf)?,
                    ..*insn
                })
            })
            .collect()
    }
}

/// Run `prog` over `pkt` like the kernel's classic BPF interpreter, for the instructions
/// ferroce's programs use; anything else, a load out of bounds, a jump past the end or
/// falling off the end drops (returns 0). `net` is what a load at [`NET_OFF`] `+ n` reads
/// (the IP header and what follows, for a UDP socket's filter); `None` fails such loads.
pub fn run_at(prog: &[Insn], pkt: &[u8], net: Option<&[u8]>) -> u32 {
    let (mut acc, mut x) = (0u32, 0u32);
    let mut pc = 0usize;
    let load = |off: u32, size: usize| -> Option<u32> {
        let (buf, o) = if off >= NET_OFF {
            (net?, (off - NET_OFF) as usize)
        } else if off < 0x8000_0000 {
            (pkt, off as usize)
        } else {
            return None;
        };
        let b = buf.get(o..o.checked_add(size)?)?;
        Some(b.iter().fold(0u32, |v, &c| (v << 8) | u32::from(c)))
    };
    while let Some(i) = prog.get(pc) {
        pc += 1;
        let size = match i.code & 0x18 {
            W => 4,
            H => 2,
            _ => 1,
        };
        match i.code & 0x07 {
            LD => {
                let v = match i.code & 0xe0 {
                    ABS => load(i.k, size),
                    IND => x.checked_add(i.k).and_then(|o| load(o, size)),
                    LEN if i.code & 0x18 == W => u32::try_from(pkt.len()).ok(),
                    _ => return 0,
                };
                match v {
                    Some(v) => acc = v,
                    None => return 0,
                }
            }
            LDX if i.code & 0xe0 == MSH => match load(i.k, 1) {
                Some(v) => x = 4 * (v & 0xf),
                None => return 0,
            },
            MISC if i.code & 0xf8 == TXA => acc = x,
            ALU if i.code & 0xf8 == AND | K => acc &= i.k,
            JMP => {
                let taken = match i.code & 0xf0 {
                    JEQ => acc == i.k,
                    JGT => acc > i.k,
                    JGE => acc >= i.k,
                    JSET => acc & i.k != 0,
                    _ => return 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET => return i.k,
            _ => return 0,
        }
    }
    0
}

/// [`run_at`] without a network header (the packet socket's filter sees whole frames).
pub fn run(prog: &[Insn], pkt: &[u8]) -> u32 {
    run_at(prog, pkt, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_skips_and_errors() {
        let mut a = Asm::new();
        a.op(LD | W | LEN, 0);
        a.jmp(JGE, 4, Target::Skip(1), Target::Next);
        a.op(RET | K, 0);
        a.op(LD | B | ABS, NET_OFF + 1);
        a.jmp(JEQ, 7, Target::Label("yes"), Target::Next);
        a.op(RET | K, 0);
        a.label("yes");
        a.op(RET | K, ACCEPT);
        let p = a.finish().unwrap();
        assert_eq!(run_at(&p, &[0; 4], Some(&[0, 7])), ACCEPT);
        assert_eq!(run_at(&p, &[0; 4], Some(&[0, 6])), 0);
        assert_eq!(run_at(&p, &[0; 3], Some(&[0, 7])), 0, "short");
        assert_eq!(
            run_at(&p, &[0; 4], None),
            0,
            "no network header: the load fails"
        );
        let mut a = Asm::new();
        a.jmp(JEQ, 0, Target::Label("nowhere"), Target::Next);
        assert_eq!(a.finish(), Err(AsmError::Undefined("nowhere")));
        let mut a = Asm::new();
        a.label("back");
        a.jmp(JEQ, 0, Target::Label("back"), Target::Next);
        assert_eq!(a.finish(), Err(AsmError::Backward("back")));
        let mut a = Asm::new();
        a.jmp(JEQ, 0, Target::Label("far"), Target::Next);
        for _ in 0..300 {
            a.op(RET | K, 0);
        }
        a.label("far");
        assert_eq!(a.finish(), Err(AsmError::TooFar));
        let mut a = Asm::new();
        for _ in 0..=MAX_INSNS {
            a.op(RET | K, 0);
        }
        assert_eq!(a.finish(), Err(AsmError::TooLong(MAX_INSNS + 1)));
    }

    #[test]
    fn alu_and_comparisons() {
        let mut a = Asm::new();
        a.op(LD | H | ABS, 0);
        a.op(ALU | AND | K, 0x7fff);
        a.jmp(JGT, 0x10, Target::Next, Target::Skip(1));
        a.op(RET | K, ACCEPT);
        a.op(RET | K, 0);
        let p = a.finish().unwrap();
        assert_eq!(run(&p, &[0x80, 0x11]), ACCEPT);
        assert_eq!(run(&p, &[0x80, 0x10]), 0);
        assert_eq!(run(&p, &[0xff, 0xff]), ACCEPT);
    }
}
