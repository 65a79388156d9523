//! libibverbs' calls that need no device (rate conversions, the fork status) and those for
//! objects ferroce cannot have: objects imported from another process's kernel context
//! (`ibv_import_*`) and dma-buf memory. Each answers as libibverbs does on a provider
//! without the feature.

use crate::abi::{ibv_context, ibv_mr, ibv_pd};
use crate::verbs::fail;
use libc::{c_int, c_void};

/// `enum ibv_rate` values (verbs.h) with their multiple of 2.5 Gb/s (-1: none, as libibverbs
/// answers for the rates that are not one) and their data rate in Mb/s (what libibverbs'
/// tables give: the 64b/66b rates are not round numbers).
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2_500),
    (5, 2, 5_000),
    (3, 4, 10_000),
    (6, 8, 20_000),
    (4, 12, 30_000),
    (7, 16, 40_000),
    (8, 24, 60_000),
    (9, 32, 80_000),
    (10, 48, 120_000),
    (11, -1, 14_062),
    (12, -1, 56_250),
    (13, -1, 112_500),
    (14, -1, 168_750),
    (15, -1, 25_781),
    (16, -1, 103_125),
    (17, -1, 206_250),
    (18, -1, 309_375),
    (19, 11, 28_125),
    (20, 20, 53_125),
    (21, 160, 425_000),
    (22, 240, 637_500),
    (23, 320, 850_000),
    (24, 480, 1_275_000),
];

/// `IBV_RATE_MAX`: what the reverse conversions answer for a value no rate has.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, -1 if it is none.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`: the rate that is `mult` × 2.5 Gb/s, `IBV_RATE_MAX` if none is.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate's data rate in Mb/s, -1 for an unknown rate.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: the rate of exactly `mbps` Mb/s, `IBV_RATE_MAX` if none is.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `IBV_FORK_UNNEEDED`: fork(2) needs no preparation. libibverbs answers it when the kernel
/// keeps registered pages with the parent across a fork; here a memory region is the
/// process's ordinary memory, read and written by the engine through the parent's own
/// mappings (no device DMAs into pinned pages), so a child's copy-on-write pages never
/// take the parent's data.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_reg_dmabuf_mr`: memory exported by another device driver as a dma-buf (GPU memory)
/// cannot be read by a software NIC: NULL with `EOPNOTSUPP`, as on a provider without it.
#[no_mangle]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    fail(libc::EOPNOTSUPP)
}

/// `ibv_import_device`: a context shared from another process's uverbs descriptor; there is
/// no such descriptor here (NULL, `EOPNOTSUPP`).
#[no_mangle]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    fail(libc::EOPNOTSUPP)
}

/// `ibv_import_pd`: NULL with `EOPNOTSUPP` (no imported context can exist).
#[no_mangle]
pub extern "C" fn ibv_import_pd(_context: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    fail(libc::EOPNOTSUPP)
}

/// `ibv_import_mr`: NULL with `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    fail(libc::EOPNOTSUPP)
}

/// `ibv_import_dm`: NULL with `EOPNOTSUPP` (no device memory either).
#[no_mangle]
pub extern "C" fn ibv_import_dm(_context: *mut ibv_context, _handle: u32) -> *mut c_void {
    fail(libc::EOPNOTSUPP)
}

/// `ibv_unimport_pd`, `_mr`, `_dm`: nothing was imported, nothing to let go.
#[no_mangle]
pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// See [`ibv_unimport_pd`].
#[no_mangle]
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// See [`ibv_unimport_pd`].
#[no_mangle]
pub extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two directions agree for every rate, and values no rate has give the documented
    /// "none" answers. (The values themselves are checked against rdma-core's own library by
    /// `cabi/tests/debian.rs`, `rate_conversions_answer_as_rdma_core`.)
    #[test]
    fn conversions_are_inverse_and_total() {
        for (rate, mult, mbps) in RATES {
            assert_eq!(ibv_rate_to_mbps(rate), mbps);
            assert_eq!(mbps_to_ibv_rate(mbps), rate);
            if mult > 0 {
                assert_eq!(mult_to_ibv_rate(ibv_rate_to_mult(rate)), rate);
            }
        }
        for bad in [-1, 0, 1, 25, 1000, c_int::MIN, c_int::MAX] {
            assert_eq!(ibv_rate_to_mult(bad), -1);
            assert_eq!(ibv_rate_to_mbps(bad), -1);
        }
        assert_eq!(mult_to_ibv_rate(-1), IBV_RATE_MAX);
        assert_eq!(mbps_to_ibv_rate(0), IBV_RATE_MAX);
    }
}
