//! The fuzz input, read front to back, for the harnesses that read it so (`backend_rx`,
//! `cm_mad`, `share_rx`); each includes this file as a module of its own.

/// Bytes of the input, read front to back; zeros once it is used up.
pub struct Input<'a> {
    d: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(d: &'a [u8]) -> Self {
        Input { d }
    }
    pub fn u8(&mut self) -> u8 {
        match self.d.split_first() {
            Some((&b, r)) => {
                self.d = r;
                b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// `n` bytes: the input's, then (past its end) a pattern, so lengths stay what the input
    /// asked for.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let take = n.min(self.d.len());
        let mut v = self.d[..take].to_vec();
        self.d = &self.d[take..];
        v.extend((take..n).map(|i| (i * 7 + 3) as u8));
        v
    }
    pub fn empty(&self) -> bool {
        self.d.is_empty()
    }
}
