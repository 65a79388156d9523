// The parts the engine_pair and ud_uc harnesses share, included into each with `include!`
// (each harness is compiled alone, as a fuzz target and as a stable test). The including file
// provides `Device`, `Pd`, `AccessFlags`, `MemoryRegion` and `REGION`.

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
