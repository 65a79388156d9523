//! Completion queues: the handle applications name them by and the ring the engine fills.

use super::wc::{WcStatus, WorkCompletion};
use std::collections::VecDeque;

/// A completion queue handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Cq(pub(crate) u32);

impl Cq {
    /// The CQ's index on its device (CQs are numbered from 0 in creation order).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// What a CQ notification was armed for (`ibv_req_notify_cq`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NotifyMode {
    /// The next completion of any kind.
    NextCompletion,
    /// The next receive completion with the solicited bit, or any error completion.
    SolicitedOnly,
}

/// The ring of one completion queue: at most `depth` completions, the armed notification and
/// the events it raised.
pub(crate) struct CqRing {
    ring: VecDeque<WorkCompletion>,
    depth: usize,
    armed: Option<NotifyMode>,
    /// Completion events raised (consumed by `get_cq_event`).
    events: u64,
    /// A completion found it full: the CQ is in error (IBTA 11.6.2), its QPs are moved to
    /// the error state by the device.
    overrun: bool,
}

impl CqRing {
    pub(crate) fn new(depth: usize) -> Self {
        CqRing {
            ring: VecDeque::with_capacity(depth.min(4096)),
            depth,
            armed: None,
            events: 0,
            overrun: false,
        }
    }

    /// Append a completion; false if the ring is full and the completion is lost (a CQ
    /// overrun, `IBV_EVENT_CQ_ERR`).
    #[must_use]
    /// Whether a completion was ever lost to a full ring (the CQ is in error).
    pub(crate) fn overrun(&self) -> bool {
        self.overrun
    }

    /// A new depth (`ibv_resize_cq`; the caller has checked it holds what is queued).
    pub(crate) fn set_depth(&mut self, depth: usize) {
        self.depth = depth;
    }

    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        if self.ring.len() >= self.depth {
            self.overrun = true;
            return false;
        }
        if let Some(mode) = self.armed {
            let fire = match mode {
                NotifyMode::NextCompletion => true,
                NotifyMode::SolicitedOnly => wc.solicited || wc.status != WcStatus::Success,
            };
            if fire {
                self.events += 1;
                self.armed = None;
            }
        }
        self.ring.push_back(wc);
        true
    }

    pub(crate) fn poll(&mut self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let n = max.min(self.ring.len());
        out.extend(self.ring.drain(..n));
        n
    }

    /// Remove the completions of QP `qpn` (a destroyed QP's: none of them is delivered);
    /// how many went.
    pub(crate) fn purge_qp(&mut self, qpn: crate::wire::QpNumber) -> usize {
        let before = self.ring.len();
        self.ring.retain(|wc| wc.qp_num != qpn);
        before - self.ring.len()
    }

    pub(crate) fn arm(&mut self, mode: NotifyMode) {
        self.armed = Some(mode);
    }

    pub(crate) fn take_event(&mut self) -> bool {
        if self.events > 0 {
            self.events -= 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }
}
