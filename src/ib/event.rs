//! Asynchronous events (`ibv_get_async_event`): what a device reports outside any work
//! completion — a QP that failed where no completion could say so, the low watermark of a
//! shared receive queue, the last receive WQE of a QP attached to one, a completion queue that
//! overflowed.
//!
//! The device keeps them in a bounded queue (`EventQueue`); an event that finds it full is
//! counted as lost, never blocks the engine and never grows memory.

use super::cq::Cq;
use super::srq::Srq;
use crate::wire::QpNumber;
use core::fmt;
use std::collections::VecDeque;

/// An asynchronous event, shaped like `struct ibv_async_event` (the element it concerns and
/// its `enum ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: a completion was lost because the CQ was full (an overrun).
    CqErr(Cq),
    /// `IBV_EVENT_QP_FATAL`: the QP met an error it cannot report in a completion (a
    /// malformed receive WQE, a remote operational error at the responder) and is in ERR.
    QpFatal(QpNumber),
    /// `IBV_EVENT_QP_REQ_ERR`: the QP's responder found an invalid request (opcode sequence,
    /// an operation it does not take, a bad length) and is in ERR.
    QpReqErr(QpNumber),
    /// `IBV_EVENT_QP_ACCESS_ERR`: the QP's responder found an access violation (R_Key, rights,
    /// bounds) and is in ERR.
    QpAccessErr(QpNumber),
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ holds fewer receive WQEs than the limit it was
    /// armed with (the limit is then disarmed: `ibv_modify_srq` arms it again).
    SrqLimitReached(Srq),
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR; it will take no
    /// more receive WQEs from the SRQ.
    QpLastWqeReached(QpNumber),
    /// `IBV_EVENT_PORT_ACTIVE`: the port (by number) became active: its interface is up and
    /// has its link again.
    PortActive(u8),
    /// `IBV_EVENT_PORT_ERR`: the port (by number) left the active state: its interface went
    /// down or lost its link.
    PortErr(u8),
    /// `IBV_EVENT_GID_CHANGE`: an entry of the port's (by number) GID table was added or
    /// deleted: its interface gained or lost an address.
    GidChange(u8),
}

impl AsyncEvent {
    /// The `enum ibv_event_type` value (`<infiniband/verbs.h>`).
    pub const fn event_type(self) -> u32 {
        match self {
            AsyncEvent::CqErr(_) => 0,
            AsyncEvent::QpFatal(_) => 1,
            AsyncEvent::QpReqErr(_) => 2,
            AsyncEvent::QpAccessErr(_) => 3,
            AsyncEvent::SrqLimitReached(_) => 15,
            AsyncEvent::QpLastWqeReached(_) => 16,
            AsyncEvent::PortActive(_) => 9,
            AsyncEvent::PortErr(_) => 10,
            AsyncEvent::GidChange(_) => 18,
        }
    }

    /// The `IBV_EVENT_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            AsyncEvent::CqErr(_) => "IBV_EVENT_CQ_ERR",
            AsyncEvent::QpFatal(_) => "IBV_EVENT_QP_FATAL",
            AsyncEvent::QpReqErr(_) => "IBV_EVENT_QP_REQ_ERR",
            AsyncEvent::QpAccessErr(_) => "IBV_EVENT_QP_ACCESS_ERR",
            AsyncEvent::SrqLimitReached(_) => "IBV_EVENT_SRQ_LIMIT_REACHED",
            AsyncEvent::QpLastWqeReached(_) => "IBV_EVENT_QP_LAST_WQE_REACHED",
            AsyncEvent::PortActive(_) => "IBV_EVENT_PORT_ACTIVE",
            AsyncEvent::PortErr(_) => "IBV_EVENT_PORT_ERR",
            AsyncEvent::GidChange(_) => "IBV_EVENT_GID_CHANGE",
        }
    }

    /// `ibv_event_type_str`'s text.
    pub const fn description(self) -> &'static str {
        match self {
            AsyncEvent::CqErr(_) => "CQ error",
            AsyncEvent::QpFatal(_) => "local work queue catastrophic error",
            AsyncEvent::QpReqErr(_) => "invalid request local work queue error",
            AsyncEvent::QpAccessErr(_) => "local access violation work queue error",
            AsyncEvent::SrqLimitReached(_) => "SRQ limit reached",
            AsyncEvent::QpLastWqeReached(_) => "last WQE reached",
            AsyncEvent::PortActive(_) => "port active",
            AsyncEvent::PortErr(_) => "port error",
            AsyncEvent::GidChange(_) => "GID table change",
        }
    }

    /// The QP the event concerns, if it concerns one.
    pub const fn qp(self) -> Option<QpNumber> {
        match self {
            AsyncEvent::QpFatal(q)
            | AsyncEvent::QpReqErr(q)
            | AsyncEvent::QpAccessErr(q)
            | AsyncEvent::QpLastWqeReached(q) => Some(q),
            _ => None,
        }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match *self {
            AsyncEvent::CqErr(cq) => write!(f, " (CQ {})", cq.index()),
            AsyncEvent::SrqLimitReached(s) => write!(f, " (SRQ {})", s.number()),
            AsyncEvent::PortActive(p) | AsyncEvent::PortErr(p) | AsyncEvent::GidChange(p) => {
                write!(f, " (port {p})")
            }
            e => match e.qp() {
                Some(q) => write!(f, " (QP {q})"),
                None => Ok(()),
            },
        }
    }
}

/// Most events a device keeps unread; further ones are counted in [`EventQueue::lost`].
pub(crate) const MAX_EVENTS: usize = 1024;

/// The device's queue of unread asynchronous events.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    q: VecDeque<AsyncEvent>,
    lost: u64,
    /// Events queued so far (a driver compares it to notice new ones).
    queued: u64,
}

impl EventQueue {
    /// Report `e` (lost, and counted, if [`MAX_EVENTS`] are unread).
    pub(crate) fn push(&mut self, e: AsyncEvent) {
        tracing::debug!(event = %e, "async event");
        if self.q.len() >= MAX_EVENTS {
            self.lost += 1;
        } else {
            self.q.push_back(e);
            self.queued += 1;
        }
    }

    /// Events queued so far (read or not).
    pub(crate) fn queued(&self) -> u64 {
        self.queued
    }

    /// Events waiting to be read.
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    /// The oldest unread event.
    pub(crate) fn pop(&mut self) -> Option<AsyncEvent> {
        self.q.pop_front()
    }

    /// Events dropped because the queue was full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_are_those_of_verbs_h() {
        // enum ibv_event_type and ibv_event_type_str (rdma-core libibverbs/enum_strs.c).
        let q = QpNumber::new(0x12);
        let cases = [
            (AsyncEvent::CqErr(Cq(0)), 0, "CQ error"),
            (
                AsyncEvent::QpFatal(q),
                1,
                "local work queue catastrophic error",
            ),
            (
                AsyncEvent::QpReqErr(q),
                2,
                "invalid request local work queue error",
            ),
            (
                AsyncEvent::QpAccessErr(q),
                3,
                "local access violation work queue error",
            ),
            (AsyncEvent::SrqLimitReached(Srq(1)), 15, "SRQ limit reached"),
            (AsyncEvent::QpLastWqeReached(q), 16, "last WQE reached"),
            (AsyncEvent::PortActive(1), 9, "port active"),
            (AsyncEvent::PortErr(1), 10, "port error"),
            (AsyncEvent::GidChange(1), 18, "GID table change"),
        ];
        for (e, n, s) in cases {
            assert_eq!(e.event_type(), n, "{e}");
            assert_eq!(e.description(), s, "{e}");
        }
        assert_eq!(
            AsyncEvent::QpFatal(q).to_string(),
            "IBV_EVENT_QP_FATAL (QP 0x000012)"
        );
    }

    #[test]
    fn the_queue_is_bounded_and_counts_what_it_loses() {
        let mut eq = EventQueue::default();
        for i in 0..MAX_EVENTS + 5 {
            eq.push(AsyncEvent::QpFatal(QpNumber::new(i as u32)));
        }
        assert_eq!(eq.lost(), 5);
        assert_eq!(eq.pop(), Some(AsyncEvent::QpFatal(QpNumber::new(0))));
        let mut n = 1;
        while eq.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, MAX_EVENTS);
    }
}
