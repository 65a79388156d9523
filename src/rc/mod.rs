//! The Reliable Connection transport as a sans-IO state machine: per QP a requester
//! (`requester.rs`), a completer (`completer.rs`) and a responder (`responder.rs`) over shared
//! state (`qp.rs`). Time comes in as an argument; packets come in and go out as bytes; nothing
//! here reads a clock, touches a socket or a thread.
//!
//! # What this module may import
//!
//! [`crate::ib`] (the verbs vocabulary and the objects every transport works on),
//! [`crate::wire`], [`crate::cc`] (each QP owns its rate controller and pacer) and
//! [`crate::time`]. Never [`crate::verbs`] or anything above it: the device engine drives the
//! QPs, the QPs do not know the device.

pub(crate) mod completer;
pub mod deviations;
pub(crate) mod qp;
pub(crate) mod recovery;
pub(crate) mod reorder;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod timer;
