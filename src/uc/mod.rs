//! The Unreliable Connection transport (IBTA Vol. 1 §9.8) as a sans-IO state machine: SEND
//! and RDMA WRITE (with immediate) between two connected QPs, packetised at the path MTU with
//! PSNs, and **no** acknowledgements, retries, READs or atomics.
//!
//! # Why a module of its own (and not a mode of `rc`)
//!
//! What UC shares with RC is what every transport shares, and that lives in [`crate::ib`]:
//! work requests and their queues, memory access, completions, attributes, paths, the transmit
//! contract. What makes up most of `rc` — the ACK queue and coalescing, go-back-N, the
//! retransmit and RNR timers, responder resources, duplicate replay, NAKs — UC has none of,
//! and its responder's rules are different where they meet RC's (any unexpected PSN ends the
//! message in progress instead of earning a NAK; errors drop a message instead of failing the
//! QP). A `uc` flag through `rc` would put a branch in most of its steps; a module of its own
//! reads as the IBTA's UC rules.
//!
//! # What this module may import
//!
//! [`crate::ib`], [`crate::wire`], [`crate::time`]; never [`crate::verbs`] or above.

pub(crate) mod qp;
