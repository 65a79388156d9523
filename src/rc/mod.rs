//! The Reliable Connection transport as a sans-IO state machine: per QP a requester
//! (`requester.rs`), a completer (`completer.rs`) and a responder (`responder.rs`) over shared
//! state (`qp.rs`), driven by [`crate::verbs::Device`]. Time comes in as an argument; packets
//! come in and go out as bytes; nothing here reads a clock, touches a socket or a thread.

pub(crate) mod completer;
pub mod counters;
pub(crate) mod qp;
pub(crate) mod requester;
pub(crate) mod responder;
pub mod state;
