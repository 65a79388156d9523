//! The applications behind the `ferroce` command line: perftest-compatible `perf`,
//! `ibv_rc_pingpong`-compatible `pingpong`, `devinfo`, `demo`, the software `switch` with
//! ECN marking, and the DCQCN plots. They are built only with the `cli` feature (the
//! default), which brings clap, plotters and serde_json; the library below them needs none.

pub mod addr;
pub mod cc_csv;
pub mod conform;
pub mod demo;
pub mod devinfo;
pub mod incast;
pub mod incast_plot;
pub mod inspect;
pub mod links;
pub mod logging;
pub mod pattern;
pub mod perf;
pub mod pingpong;
pub mod rping;
pub mod run;
pub mod stat;
pub mod switch;
pub mod tool;
