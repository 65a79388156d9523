//! `libibverbs.so.1` on ferroce: the functions and structures of rdma-core's libibverbs,
//! implemented on the ferroce software RNIC, so that an unmodified RDMA application (linked
//! against Debian's `libibverbs.so.1`) runs with no RDMA NIC, no `rdma_rxe` module and no
//! root: `ferroce run -- ibv_rc_pingpong -g 0 host`, or `LD_LIBRARY_PATH=<dir with this
//! library> ibv_rc_pingpong …`.
//!
//! - [`abi`]: rdma-core's structures as `#[repr(C)]` (checked against the C headers by
//!   `tests/abi.rs`).
//! - `device`: the one device this process sees (`ferroce_<interface>`), chosen by the
//!   environment (`FERROCE_DEV`, `FERROCE_BACKEND`, `FERROCE_PCAP`), and the running NIC
//!   behind every open context.
//! - `verbs`: the exported `ibv_*` functions, and the operations the inline wrappers of
//!   `<infiniband/verbs.h>` call through the context's ops table (`ibv_post_send`,
//!   `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) and through the
//!   extended context (`ibv_query_port`).
//!
//! - `ex`: the extended verbs (`ibv_create_cq_ex` and its polling interface,
//!   `ibv_create_qp_ex` and the `ibv_wr_*` builder) and inline data copied at post time.
//! - [`rdmacm`]: librdmacm's `rdma_*` functions on ferroce's RDMA-CM, exported from this
//!   library as `ferroce_rdma_*`; `librdmacm.so.1` (tools/build-cabi) forwards to them.
//!
//! Symbol versions are rdma-core's (`libibverbs.map`, applied when tools/build-cabi links the
//! shared object), so binaries built against rdma-core bind to these functions unchanged.
//!
//! # Safety
//! Every exported function takes pointers from C. The contract is libibverbs': pointers are
//! either NULL (checked where libibverbs allows it) or point to live objects of the right type
//! that this library handed out (contexts, PDs, CQs, QPs, …) or that the caller owns for the
//! duration of the call (attribute structs, work request lists). Objects are `Box`es of a
//! `#[repr(C)]` wrapper whose first field is the C structure, so a pointer to the C structure
//! is a pointer to the wrapper.
#![allow(clippy::missing_safety_doc)]
// SAFETY: pointers from the caller, valid per libibverbs' contract (see the crate's Safety section).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
mod device;
#[doc(hidden)]
pub mod entry_fuzz;
mod ex;
pub mod rdmacm;
mod rsocket;
/// The datagram rsocket fuzz harness (`cabi/src/rsocket/dgram/fuzz.rs`).
pub use rsocket::dgram_fuzz as rsocket_dgram_fuzz;
/// The rsocket fuzz harness (`cabi/src/rsocket/fuzz.rs`).
pub use rsocket::fuzz as rsocket_fuzz;
mod stubs;
mod util;
mod verbs;

pub use device::DEVICE_PREFIX;

/// Wait on `cv` (`g` the guard of its mutex) until `done` holds or `limit` has passed, as the
/// destroy calls of libibverbs and librdmacm wait for their objects' events to be
/// acknowledged (theirs without a limit). Returns the guard and whether `done` held.
pub(crate) fn wait_until<'a, T>(
    mut g: std::sync::MutexGuard<'a, T>,
    cv: &std::sync::Condvar,
    limit: std::time::Duration,
    mut done: impl FnMut(&mut T) -> bool,
) -> (std::sync::MutexGuard<'a, T>, bool) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if done(&mut g) {
            return (g, true);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return (g, false);
        }
        g = cv
            .wait_timeout(g, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
