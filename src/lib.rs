//! ferroce: a pure-Rust userspace RoCE v2 software RDMA NIC.
//!
//! Layers (see README.md for the diagram):
//! - [`wire`]: zero-copy header views, `Repr` parse/emit pairs, the opcode table, PSN arithmetic, ICRC.
//! - [`time`]: the virtual/real time types every sans-IO state machine takes as an argument.
//!
//! `unsafe` is denied crate-wide (see `Cargo.toml`); only `src/io/sys/` may allow it.

pub mod capture;
pub mod cc;
pub mod cm;
pub mod demo;
pub mod golden;
pub mod inspect;
pub mod io;
pub mod nic;
pub mod pattern;
pub mod perf;
pub mod rc;
pub mod sim;
pub mod switch;
pub mod time;
pub mod tool;
pub mod verbs;
pub mod wire;
