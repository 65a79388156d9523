//! ferroce: a pure-Rust userspace RoCE v2 software RDMA NIC.
//!
//! Layers, top to bottom (dependencies point down; see `docs/architecture.md`):
//! - [`apps`] (feature `cli`): the applications behind the `ferroce` command line.
//! - [`runtime`]: engine threads, lock-free doorbells and completion queues around a device.
//! - [`verbs`]: the public API in libibverbs' shape and the sans-IO device engine.
//! - [`rc`]: the Reliable Connection transport (requester, completer, responder); [`uc`] and
//!   [`ud`] beside it: the Unreliable Connection and Unreliable Datagram transports.
//! - [`cc`]: congestion control (DCQCN) behind one trait, and the pacer.
//! - [`cm`]: connection management: the IB CM (REQ/REP/RTU, DREQ/DREP, SIDR over QP1's MADs)
//!   and RDMA-CM on top, sans-IO.
//! - [`ib`]: what every transport shares: the verbs vocabulary (QP attributes and the
//!   `modify_qp` rules, work requests and completions, asynchronous events) and the objects a
//!   QP works on (WQEs, the CQ ring, shared receive queues, memory regions and their key table,
//!   the path, address handles, counters).
//! - [`oob`]: the out-of-band TCP exchanges of ibv_rc_pingpong and perftest.
//! - [`wire`]: zero-copy header views, `Repr` parse/emit pairs, the opcode table, PSN
//!   arithmetic, ICRC.
//!
//! Beside them: [`io`] (packet backends: AF_XDP, AF_PACKET, UDP socket, loopback; pcap tap
//! and fault injector), [`pcap`] (capture files, golden captures, inspect), [`sim`] (the seeded
//! network simulator and the incast model), [`time`] (the time types every sans-IO state
//! machine takes as an argument), [`rng`] (the one pseudo-random generator) and [`keys`] (the
//! one place keys, identifiers and PSNs a peer must not guess are drawn).
//!
//! `unsafe` is denied crate-wide (see `Cargo.toml`); only `src/io/sys/` (system calls) and
//! `src/ib/appmem.rs` (memory regions on the application's own memory) may allow it.

#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub mod apps;
pub mod cc;
pub mod cm;
pub mod ib;
pub mod io;
pub mod keys;
pub mod oob;
pub mod pcap;
pub mod rc;
pub mod rng;
pub mod runtime;
pub mod sim;
pub mod time;
pub mod uc;
pub mod ud;
pub mod verbs;
pub mod wire;
