//! The Unreliable Datagram transport (IBTA Vol. 1 §9.8, §10.2.4) as a sans-IO state machine:
//! a UD queue pair (`ud::qp::Qp`) sends each work request as one `SEND_ONLY` (or
//! `SEND_ONLY_WITH_IMMEDIATE`) packet with a DETH to the address its address handle names,
//! and delivers each packet it accepts into one receive WQE, behind the 40-byte GRH slot. No
//! ACKs, no retries, no PSN checks at the receiver.
//!
//! QP1, the general services QP that carries connection-management MADs, is a UD QP with the
//! well-known Q_Key 0x80010000 (`ud::qp::GSI_QKEY`).
//!
//! # What this module may import
//!
//! [`crate::ib`], [`crate::wire`], [`crate::time`]; never [`crate::verbs`] or above (the
//! device engine drives the QP through the same contract as an RC QP's, see `rc/qp.rs`).

pub(crate) mod qp;
