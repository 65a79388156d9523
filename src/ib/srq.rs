//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_post_srq_recv`; IBTA Vol. 1 §10.2.9): one queue of receive WQEs that the responders of
//! several QPs (RC, UC, UD) take from, in order, whichever QP a message arrives on.
//!
//! # The rules kept here
//!
//! - A WQE leaves the SRQ when a responder takes it for a message; from then on it belongs to
//!   that QP (completed there, or flushed there if the QP fails). The SRQ's free slots are
//!   `max_wr` minus the WQEs still in it.
//! - The **limit** (`srq_limit`, the low watermark): once armed with a non-zero value by
//!   `ibv_modify_srq(IBV_SRQ_LIMIT)`, the first take that leaves fewer WQEs than the limit
//!   raises `IBV_EVENT_SRQ_LIMIT_REACHED` and disarms it (the limit reads 0 again). It is
//!   ignored at creation, as `ibv_create_srq(3)` says.
//! - `IBV_SRQ_MAX_WR` resizes the queue, but never below the WQEs it holds nor below an armed
//!   limit; a limit larger than `max_wr` is refused. A refused modify changes nothing.
//! - An SRQ cannot be destroyed while QPs are attached to it (EBUSY).

use super::event::{AsyncEvent, EventQueue};
use super::mr::Pd;
use super::tx::PostError;
use super::wqe::RecvWqe;
use bitflags::bitflags;
use std::collections::VecDeque;

/// A shared receive queue handle; its number is the `srq_num` verbs reports (and perftest
/// exchanges).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Srq(pub(crate) u32);

/// An XRC domain (`ibv_open_xrcd`): the scope within which an XRC target QP delivers to XRC
/// SRQs (IBTA Vol. 1 §9.8.3 XRC, §11.2.9). A request whose XRCETH names an SRQ outside the
/// target QP's domain is refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Xrcd(pub(crate) u32);

impl Xrcd {
    /// The domain's number on its device.
    pub fn number(self) -> u32 {
        self.0
    }
}

/// What makes an SRQ an XRC SRQ: its domain, and the CQ its receive completions go to (an
/// XRC SRQ's completions are its own, not the QP's, whose target half has no CQ).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct XrcSrq {
    pub xrcd: Xrcd,
    pub cq: super::cq::Cq,
}

impl Srq {
    /// The SRQ's number on its device.
    pub fn number(self) -> u32 {
        self.0
    }
}

/// `struct ibv_srq_attr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SrqAttr {
    /// Most receive WQEs the SRQ holds.
    pub max_wr: u32,
    /// Most scatter/gather entries per receive WQE.
    pub max_sge: u32,
    /// The limit (low watermark); 0 when not armed.
    pub srq_limit: u32,
}

bitflags! {
    /// `enum ibv_srq_attr_mask`: which attributes `modify_srq` changes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize.
        const MAX_WR = 1 << 0;
        /// `IBV_SRQ_LIMIT`: arm (or, with 0, disarm) the limit event.
        const LIMIT = 1 << 1;
    }
}

/// Why `modify_srq` refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SrqModifyError {
    /// `max_wr` of 0, or above the device's `max_srq_wr`.
    #[error("max_wr {0} outside 1..={1}")]
    MaxWrRange(u32, u32),
    /// The new `max_wr` is below the WQEs the SRQ holds.
    #[error("max_wr {max_wr} is below the {held} receive WQEs the SRQ holds")]
    MaxWrBelowHeld {
        /// The size asked for.
        max_wr: u32,
        /// WQEs in the queue.
        held: usize,
    },
    /// The new `max_wr` is below the armed limit.
    #[error("max_wr {max_wr} is below the armed limit {limit}")]
    MaxWrBelowLimit {
        /// The size asked for.
        max_wr: u32,
        /// The armed limit.
        limit: u32,
    },
    /// A limit larger than the queue.
    #[error("srq_limit {limit} exceeds max_wr {max_wr}")]
    LimitAboveMaxWr {
        /// The limit asked for.
        limit: u32,
        /// The queue's size.
        max_wr: u32,
    },
    /// A mask bit `ibv_srq_attr_mask` does not define.
    #[error("unknown attribute mask bits {0:#x}")]
    UnknownMask(u32),
}

/// The queue of one SRQ, as the device keeps it.
#[derive(Debug)]
pub(crate) struct SrqRing {
    pub(crate) pd: Pd,
    max_wr: u32,
    max_sge: u32,
    /// Armed limit, 0 when disarmed.
    limit: u32,
    q: VecDeque<RecvWqe>,
    /// QPs attached (destroy is refused while there are any).
    pub(crate) attached: u32,
    /// WQEs taken by responders so far (the runtime derives the free slots from it).
    taken: u64,
    /// An XRC SRQ's domain and CQ.
    pub(crate) xrc: Option<XrcSrq>,
}

impl SrqRing {
    pub(crate) fn new(pd: Pd, max_wr: u32, max_sge: u32) -> SrqRing {
        SrqRing {
            pd,
            max_wr,
            max_sge,
            limit: 0,
            q: VecDeque::new(),
            attached: 0,
            taken: 0,
            xrc: None,
        }
    }

    /// The attributes `ibv_query_srq` reports.
    pub(crate) fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.limit,
        }
    }

    /// Receive WQEs in the queue.
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    /// WQEs taken by responders so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }

    /// `ibv_post_srq_recv`'s room check.
    pub(crate) fn check_post(&self) -> Result<(), PostError> {
        if self.q.len() >= self.max_wr as usize {
            Err(PostError::QueueFull)
        } else {
            Ok(())
        }
    }

    /// Queue a receive WQE that [`check_post`](Self::check_post) admitted.
    pub(crate) fn post(&mut self, w: RecvWqe) {
        self.q.push_back(w);
    }

    /// A responder takes the oldest WQE for a message on one of the attached QPs; the limit
    /// event fires (once) if fewer than the armed limit remain.
    pub(crate) fn take(&mut self, me: Srq, events: &mut EventQueue) -> Option<RecvWqe> {
        let w = self.q.pop_front()?;
        self.taken += 1;
        if self.limit != 0 && (self.q.len() as u64) < u64::from(self.limit) {
            self.limit = 0;
            events.push(AsyncEvent::SrqLimitReached(me));
        }
        Some(w)
    }

    /// Give back a WQE a responder took for a message that was then lost on the wire before
    /// anything of it was delivered (UC): it is the next one taken again.
    pub(crate) fn put_back(&mut self, w: RecvWqe) {
        self.taken = self.taken.saturating_sub(1);
        self.q.push_front(w);
    }

    /// `ibv_modify_srq`: all or nothing. `max_srq_wr` is the device's limit.
    pub(crate) fn modify(
        &mut self,
        attr: &SrqAttr,
        mask: SrqAttrMask,
        max_srq_wr: u32,
    ) -> Result<(), SrqModifyError> {
        let unknown = mask.bits() & !SrqAttrMask::all().bits();
        if unknown != 0 {
            return Err(SrqModifyError::UnknownMask(unknown));
        }
        let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > max_srq_wr {
                return Err(SrqModifyError::MaxWrRange(attr.max_wr, max_srq_wr));
            }
            if (attr.max_wr as usize) < self.q.len() {
                return Err(SrqModifyError::MaxWrBelowHeld {
                    max_wr: attr.max_wr,
                    held: self.q.len(),
                });
            }
            attr.max_wr
        } else {
            self.max_wr
        };
        let limit = if mask.contains(SrqAttrMask::LIMIT) {
            attr.srq_limit
        } else {
            self.limit
        };
        if limit > max_wr {
            if mask.contains(SrqAttrMask::LIMIT) {
                return Err(SrqModifyError::LimitAboveMaxWr { limit, max_wr });
            }
            return Err(SrqModifyError::MaxWrBelowLimit { max_wr, limit });
        }
        self.max_wr = max_wr;
        self.limit = limit;
        Ok(())
    }
}

/// The SRQs of a device, by number (an SRQ's slot is `None` once destroyed).
pub(crate) type SrqTable = Vec<Option<SrqRing>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn wqe(id: u64) -> RecvWqe {
        RecvWqe {
            wr_id: id,
            sges: crate::ib::SgList::new(),
            len: 0,
            local_err: None,
        }
    }

    #[test]
    fn the_limit_fires_once_below_the_watermark_and_disarms() {
        let me = Srq(3);
        let mut ev = EventQueue::default();
        let mut s = SrqRing::new(Pd(1), 8, 1);
        for i in 0..5 {
            s.check_post().unwrap();
            s.post(wqe(i));
        }
        // Ignored at creation: nothing armed.
        assert_eq!(s.attr().srq_limit, 0);
        s.modify(
            &SrqAttr {
                srq_limit: 3,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
            64,
        )
        .unwrap();
        assert_eq!(s.attr().srq_limit, 3);
        // 5 -> 4 -> 3: not below 3 yet.
        assert_eq!(s.take(me, &mut ev).unwrap().wr_id, 0);
        assert_eq!(s.take(me, &mut ev).unwrap().wr_id, 1);
        assert_eq!(ev.pop(), None);
        // 3 -> 2: below, fires and disarms.
        assert_eq!(s.take(me, &mut ev).unwrap().wr_id, 2);
        assert_eq!(ev.pop(), Some(AsyncEvent::SrqLimitReached(me)));
        assert_eq!(s.attr().srq_limit, 0);
        // No second event without re-arming.
        s.take(me, &mut ev).unwrap();
        assert_eq!(ev.pop(), None);
        assert_eq!(s.taken(), 4);
    }

    #[test]
    fn modify_is_checked_and_all_or_nothing() {
        let mut s = SrqRing::new(Pd(1), 4, 1);
        for i in 0..3 {
            s.post(wqe(i));
        }
        let a = |max_wr, srq_limit| SrqAttr {
            max_wr,
            max_sge: 0,
            srq_limit,
        };
        use SrqAttrMask as M;
        assert_eq!(
            s.modify(&a(2, 0), M::MAX_WR, 64),
            Err(SrqModifyError::MaxWrBelowHeld { max_wr: 2, held: 3 })
        );
        assert_eq!(
            s.modify(&a(0, 0), M::MAX_WR, 64),
            Err(SrqModifyError::MaxWrRange(0, 64))
        );
        assert_eq!(
            s.modify(&a(65, 0), M::MAX_WR, 64),
            Err(SrqModifyError::MaxWrRange(65, 64))
        );
        assert_eq!(
            s.modify(&a(0, 5), M::LIMIT, 64),
            Err(SrqModifyError::LimitAboveMaxWr {
                limit: 5,
                max_wr: 4
            })
        );
        // Both at once: the new size admits the limit.
        s.modify(&a(16, 5), M::MAX_WR | M::LIMIT, 64).unwrap();
        assert_eq!(s.attr(), a(16, 5).with_sge(1));
        // Shrinking below the armed limit is refused and changes nothing.
        assert_eq!(
            s.modify(&a(4, 0), M::MAX_WR, 64),
            Err(SrqModifyError::MaxWrBelowLimit {
                max_wr: 4,
                limit: 5
            })
        );
        assert_eq!(s.attr().max_wr, 16);
        assert_eq!(
            s.modify(&a(4, 0), SrqAttrMask::from_bits_retain(4), 64),
            Err(SrqModifyError::UnknownMask(4))
        );
        // Room follows max_wr.
        for i in 3..16 {
            s.check_post().unwrap();
            s.post(wqe(i));
        }
        assert_eq!(s.check_post(), Err(PostError::QueueFull));
    }

    impl SrqAttr {
        fn with_sge(mut self, n: u32) -> SrqAttr {
            self.max_sge = n;
            self
        }
    }
}
