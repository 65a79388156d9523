//! `ibv_query_device`: the device's limits, each one enforced where the object or request it
//! bounds is made (a typed [`VerbsError`](super::VerbsError) at the boundary, see
//! `tests/limits.rs`).

use super::device::{Device, DeviceConfig, MAX_MSG};
use super::PKEY_TABLE;

/// What `ibv_query_device` reports, field for field with `struct ibv_device_attr` (the fields
/// that mean something for a RoCE device without memory windows, multicast or EE contexts),
/// plus the two per-QP limits libibverbs reports elsewhere (`max_inline`, `max_msg_sz` of
/// `ibv_query_port`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Longest memory region (`ibv_reg_mr` refuses a longer one: `BadCap`).
    pub max_mr_size: u64,
    /// Most QPs (`NoResources("max_qp")`).
    pub max_qp: u32,
    /// Most work requests per send or receive queue (`BadCap` at `create_qp`/`create_srq`).
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most scatter/gather entries of an RDMA READ's local side.
    pub max_sge_rd: u32,
    /// Most completion queues (`NoResources("max_cq")`).
    pub max_cq: u32,
    /// Most entries per completion queue (`BadCap("CQ depth")`).
    pub max_cqe: u32,
    /// Most memory regions (`NoResources("max_mr")`).
    pub max_mr: u32,
    /// Most protection domains (`NoResources("max_pd")`).
    pub max_pd: u32,
    /// Most READ/atomic requests a QP accepts as responder (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Responder resources of the whole device (`max_qp` × `max_qp_rd_atom`).
    pub max_res_rd_atom: u64,
    /// Most READ/atomic requests a QP has outstanding as initiator (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Most address handles (`NoResources("max_ah")`).
    pub max_ah: u32,
    /// Most shared receive queues (`NoResources("max_srq")`).
    pub max_srq: u32,
    /// Most receive requests per SRQ.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries per SRQ receive request.
    pub max_srq_sge: u32,
    /// P_Key table entries.
    pub max_pkeys: u16,
    /// Most inline data per send request (`BadCap("max_inline_data")`).
    pub max_inline: u32,
    /// Longest message (`MessageTooLong` at `post_send`): 2^31 bytes.
    pub max_msg_sz: u64,
    /// `device_cap_flags`, libibverbs' `IBV_DEVICE_*` bits of what the device does:
    /// RC_RNR_NAK_GEN (1 << 12), SRQ_RESIZE (1 << 13), N_NOTIFY_CQ (1 << 14), MEM_WINDOW
    /// (1 << 17), XRC (1 << 20), MEM_WINDOW_TYPE_2B (1 << 24).
    pub device_cap_flags: u32,
    /// Most memory windows.
    pub max_mw: u32,
}

/// The names `ibv_devinfo -v` prints for the bits of [`DeviceAttr::device_cap_flags`].
pub const DEVICE_CAP_NAMES: [(u32, &str); 6] = [
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 13, "SRQ_RESIZE"),
    (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 20, "XRC"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
];

/// Most XRC domains open at once on a device (a bound on its table; verbs reports no such
/// limit).
pub const MAX_XRCD: u32 = 1 << 12;

/// The QPs of a device with a block of QPNs ([`DeviceConfig::qpn_block`]) at most: its
/// 65,536 numbers but the lowest 0x11 (kept free as below the first block's first QPN).
pub const QPN_BLOCK_QPS: u32 = 0x1_0000 - 0x11;

impl DeviceConfig {
    /// The limits a device made with this configuration enforces (what
    /// [`Device::query_device`] reports).
    pub fn limits(&self) -> DeviceAttr {
        let c = self;
        DeviceAttr {
            max_mr_size: c.max_mr_size,
            // A block of QPNs holds 0xffff - 0x10 numbers ([`DeviceConfig::qpn_block`]).
            max_qp: match c.qpn_block {
                Some(_) => c.max_qp.min(QPN_BLOCK_QPS),
                None => c.max_qp,
            },
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_sge_rd: c.max_sge,
            max_cq: c.max_cq,
            max_cqe: c.max_cqe,
            max_mr: c.max_mr,
            max_pd: c.max_pd,
            max_qp_rd_atom: c.max_qp_rd_atom.into(),
            max_res_rd_atom: u64::from(c.max_qp) * u64::from(c.max_qp_rd_atom),
            max_qp_init_rd_atom: c.max_qp_rd_atom.into(),
            max_ah: c.max_ah,
            max_srq: c.max_srq,
            max_srq_wr: c.max_qp_wr,
            max_srq_sge: c.max_sge,
            max_pkeys: PKEY_TABLE.len() as u16,
            max_inline: c.max_inline,
            max_msg_sz: MAX_MSG,
            device_cap_flags: DEVICE_CAP_NAMES.iter().map(|f| f.0).sum(),
            max_mw: c.max_mw,
        }
    }
}

impl Device {
    /// `ibv_query_device`: the limits this device enforces.
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// let mut cfg = DeviceConfig::new(
    ///     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap());
    /// cfg.max_pd = 1;
    /// let mut dev = Device::new(cfg);
    /// assert_eq!(dev.query_device().max_pd, 1);
    /// let pd = dev.alloc_pd()?;
    /// assert!(matches!(dev.alloc_pd(), Err(VerbsError::NoResources("max_pd"))));
    /// dev.dealloc_pd(pd)?;
    /// dev.alloc_pd()?;
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn query_device(&self) -> DeviceAttr {
        self.config().limits()
    }
}
