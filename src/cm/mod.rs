//! Connection management: the IB CM (IBTA Vol. 1 ch. 12) and RDMA-CM on top of it, as
//! sans-IO state machines.
//!
//! # The sans-IO contract
//!
//! Like the RC engine, nothing here reads a clock, opens a socket or starts a thread. MADs
//! come in as bytes with the time and the sender's address
//! ([`Cm::handle_mad`]`(now, src, bytes)`), go out as 256-byte MADs with a destination
//! ([`Cm::poll_transmit`]), timers are run by the driver at [`Cm::poll_timeout`] with
//! [`Cm::handle_timeout`]`(now)`, and the consumer reads [`Cm::poll_event`]. The driver is the
//! QP1 (GSI) layer: a UD QP with Q_Key 0x80010000 that hands every CM-class MAD it receives to
//! the CM and sends what the CM returns to the destination's QP1.
//!
//! # Layers
//!
//! - [`ib`]: the IB CM engine [`Cm`]: REQ/REP/RTU with the timeouts and retry counts the REQ
//!   carries, MRA, REJ, duplicates, DREQ/DREP, TimeWait, SIDR, listeners with a bounded
//!   backlog, ClassPortInfo; every dropped MAD counted.
//! - [`rdma`]: RDMA-CM on top: port spaces and their service IDs, the private-data header,
//!   CM ids with librdmacm's states and events (`RdmaCm`).
//! - [`types`]: the shared vocabulary (addresses, IDs, parameters, events, counters, IBA time
//!   units).
//!
//! Communication and transaction IDs come from [`crate::keys::KeyGen`]: unpredictable unless
//! a seed is configured.

pub mod ib;
pub mod rdma;
pub mod types;

pub use ib::{Cm, Transmit};
pub use rdma::RdmaCm;
pub use types::*;
