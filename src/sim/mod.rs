//! The seeded network simulator ([`net`]) and the two-device harness ([`pair`]): virtual
//! time, per-link latency, bandwidth, loss, duplication, reordering, jitter, corruption and
//! ECN marking, all reproducible from a seed. [`cm`] joins two connection managers over the
//! same network. For deterministic tests and benchmarks, in
//! addition to (never instead of) the real packet paths.

pub mod cm;
pub mod fabric;
pub mod incast;
pub mod net;
pub mod pair;
pub mod queue;

pub use net::*;
pub use pair::{Family, Pair};
pub use queue::{Admission, EgressConfig, EgressQueue, Verdict};
