//! rdma-core's public structures (`<infiniband/verbs.h>`, rdma-core 44), field for field, as
//! `#[repr(C)]` Rust. Only the layout matters here: `tests/abi.rs` compiles a C program
//! against the system's headers and compares the size and every offset the library touches.
//!
//! Enumerations are C `int`s (`u32`/`i32`); `pthread_mutex_t`/`pthread_cond_t` come from libc.
#![allow(non_camel_case_types, missing_docs)]

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t};

/// `union ibv_gid`: 16 bytes, 8-aligned (its `global` member holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: usize,
    pub _dummy2: usize,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int;
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
/// `verbs_context.advise_mr` (the inline `ibv_advise_mr`).
pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, c_int, u32, *mut ibv_sge, u32) -> c_int;
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;

/// `struct ibv_context_ops`: 32 pointers; the inline `ibv_poll_cq`, `ibv_req_notify_cq`,
/// `ibv_post_srq_recv`, `ibv_post_send` and `ibv_post_recv` call through the named ones.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device` … `_compat_dereg_mr` (7 entries).
    pub _compat1: [usize; 7],
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub _compat_create_cq: usize,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    /// `_compat_cq_event` … `_compat_destroy_srq` (7 entries).
    pub _compat2: [usize; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp` … `_compat_destroy_qp` (4 entries).
    pub _compat3: [usize; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah` … `_compat_async_event` (5 entries).
    pub _compat4: [usize; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended operations (newest first), `sz`, and the
/// `ibv_context` last. `abi_compat == (void *)-1` tells the inline wrappers it is there.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    /// `alloc_null_mr` … `destroy_counters` (5 entries), all NULL: the inline wrappers then
    /// return EOPNOTSUPP or take their legacy path, as on a provider without them.
    pub _ex1: [usize; 5],
    pub reg_dm_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr>,
    pub alloc_dm:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm>,
    pub free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
    /// `modify_flow_action_esp` … `modify_qp_rate_limit` (4 entries), all NULL.
    pub _ex1a: [usize; 4],
    pub alloc_parent_domain: Option<
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
    >,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    pub alloc_td:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
    /// `modify_cq` … `create_wq` (7 entries), all NULL.
    pub _ex1b: [usize; 7],
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub _priv: usize,
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow`, `ABI_placeholder2`, `ibv_create_flow`, `ABI_placeholder1`,
    /// `open_qp`.
    pub _ex2: [usize; 5],
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub open_xrcd:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
    pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq_init_attr_ex` (`rdma_create_srq_ex`).
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    /// `struct ibv_tm_cap`: `max_num_tags`, `max_ops`.
    pub tm_cap: [u32; 2],
}
/// `enum ibv_srq_init_attr_mask`.
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
/// `enum ibv_srq_type`.
pub const IBV_SRQT_BASIC: c_int = 0;
pub const IBV_SRQT_XRC: c_int = 1;

/// `struct ibv_xrcd`: an XRC domain.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}
/// `enum ibv_xrcd_init_attr_mask`.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
/// `IBV_QPT_XRC_SEND`, `IBV_QPT_XRC_RECV`.
pub const IBV_QPT_XRC_SEND: c_int = 9;
pub const IBV_QPT_XRC_RECV: c_int = 10;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union wr_union {
    pub rdma: wr_rdma,
    pub atomic: wr_atomic,
    pub ud: wr_ud,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: wr_union,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// `bind_mw` (a union with `tso`, both 48 bytes).
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_dm` (device memory).
#[repr(C)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_td` (a thread domain).
#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
pub struct ibv_td_init_attr {
    pub comp_mask: u32,
}

/// A parent domain's allocator (`ibv_parent_domain_init_attr.alloc`).
pub type PdAllocFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// A parent domain's release (`ibv_parent_domain_init_attr.free`).
pub type PdFreeFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc: Option<PdAllocFn>,
    pub free: Option<PdFreeFn>,
    pub pd_context: *mut c_void,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `type` (`enum ibv_mw_type`).
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`'s request).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

impl ibv_send_wr_bind_mw {
    /// All zero (a request of another opcode).
    pub const NONE: ibv_send_wr_bind_mw = ibv_send_wr_bind_mw {
        mw: std::ptr::null_mut(),
        rkey: 0,
        bind_info: ibv_mw_bind_info {
            mr: std::ptr::null_mut(),
            addr: 0,
            length: 0,
            mw_access_flags: 0,
        },
    };
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

#[repr(C)]
pub struct ibv_async_event {
    pub element: ibv_async_element,
    pub event_type: c_int,
}

/// The layout facts `tests/abi.rs` checks against the C headers: (C expression, value):
/// sizes, offsets, and the numbers of the completion enums.
pub fn layout_facts() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    macro_rules! facts {
        ($($t:ident { $($f:ident),* }),* $(,)?) => {{
            let mut v = Vec::new();
            $(
                v.push((concat!("sizeof(struct ", stringify!($t), ")"), size_of::<$t>()));
                $( v.push((concat!("offsetof(struct ", stringify!($t), ", ", stringify!($f), ")"), offset_of!($t, $f))); )*
            )*
            v
        }};
    }
    let mut v = facts!(
        ibv_device {
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        },
        ibv_context {
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        },
        ibv_alloc_dm_attr {
            length,
            log_align_req,
            comp_mask
        },
        ibv_dm {
            context,
            memcpy_to_dm,
            memcpy_from_dm,
            comp_mask,
            handle
        },
        verbs_context {
            query_port,
            reg_dm_mr,
            alloc_dm,
            free_dm,
            alloc_parent_domain,
            dealloc_td,
            alloc_td,
            query_rt_values,
            sz,
            context
        },
        ibv_td { context },
        ibv_td_init_attr { comp_mask },
        ibv_parent_domain_init_attr {
            pd,
            td,
            comp_mask,
            alloc,
            free,
            pd_context
        },
        ibv_device_attr {
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt
        },
        ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2
        },
        ibv_gid_entry {
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        },
        ibv_wc {
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits
        },
        ibv_pd { context, handle },
        ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        },
        ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class
        },
        ibv_ah_attr {
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        },
        ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit
        },
        ibv_srq_init_attr { srq_context, attr },
        ibv_srq_init_attr_ex {
            srq_context,
            attr,
            comp_mask,
            srq_type,
            pd,
            xrcd,
            cq,
            tm_cap
        },
        ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        },
        ibv_qp_init_attr {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all
        },
        ibv_qp_attr {
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit
        },
        ibv_sge { addr, length, lkey },
        ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            wr,
            bind_mw
        },
        ibv_mw {
            context,
            pd,
            rkey,
            handle
        },
        ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags
        },
        ibv_mw_bind {
            wr_id,
            send_flags,
            bind_info
        },
        ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        },
        ibv_srq {
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed
        },
        ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed
        },
        ibv_comp_channel {
            context,
            fd,
            refcnt
        },
        ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed
        },
        ibv_ah {
            context,
            pd,
            handle
        },
        ibv_async_event {
            element,
            event_type
        },
    );
    // Fields inside the ops table and the work request's union, by their C names.
    v.push((
        "offsetof(struct ibv_context, ops.alloc_mw)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, alloc_mw),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.bind_mw)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, bind_mw),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.dealloc_mw)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, dealloc_mw),
    ));
    v.push(("offsetof(struct ibv_mw, type)", offset_of!(ibv_mw, mw_type)));
    let b = offset_of!(ibv_send_wr, bind_mw);
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw.mw)",
        b + offset_of!(ibv_send_wr_bind_mw, mw),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw.rkey)",
        b + offset_of!(ibv_send_wr_bind_mw, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, bind_mw.bind_info)",
        b + offset_of!(ibv_send_wr_bind_mw, bind_info),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.poll_cq)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.req_notify_cq)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.post_srq_recv)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.post_send)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
    ));
    v.push((
        "offsetof(struct ibv_context, ops.post_recv)",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
    ));
    v.push((
        "sizeof(struct ibv_context_ops)",
        size_of::<ibv_context_ops>(),
    ));
    let w = offset_of!(ibv_send_wr, wr);
    v.push((
        "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
        w + offset_of!(wr_rdma, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.atomic.compare_add)",
        w + offset_of!(wr_atomic, compare_add),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.atomic.swap)",
        w + offset_of!(wr_atomic, swap),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.atomic.rkey)",
        w + offset_of!(wr_atomic, rkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.ud.remote_qpn)",
        w + offset_of!(wr_ud, remote_qpn),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, wr.ud.remote_qkey)",
        w + offset_of!(wr_ud, remote_qkey),
    ));
    v.push((
        "offsetof(struct ibv_send_wr, qp_type.xrc.remote_srqn)",
        offset_of!(ibv_send_wr, remote_srqn),
    ));
    // The numbers of the completion enums ferroce::verbs writes into `ibv_wc`.
    use ferroce::verbs::{WcOpcode, WcStatus};
    for (name, st) in [
        ("IBV_WC_SUCCESS", WcStatus::Success),
        ("IBV_WC_LOC_LEN_ERR", WcStatus::LocLenErr),
        ("IBV_WC_LOC_QP_OP_ERR", WcStatus::LocQpOpErr),
        ("IBV_WC_LOC_PROT_ERR", WcStatus::LocProtErr),
        ("IBV_WC_WR_FLUSH_ERR", WcStatus::WrFlushErr),
        ("IBV_WC_MW_BIND_ERR", WcStatus::MwBindErr),
        ("IBV_WC_BAD_RESP_ERR", WcStatus::BadRespErr),
        ("IBV_WC_LOC_ACCESS_ERR", WcStatus::LocAccessErr),
        ("IBV_WC_REM_INV_REQ_ERR", WcStatus::RemInvReqErr),
        ("IBV_WC_REM_ACCESS_ERR", WcStatus::RemAccessErr),
        ("IBV_WC_REM_OP_ERR", WcStatus::RemOpErr),
        ("IBV_WC_RETRY_EXC_ERR", WcStatus::RetryExcErr),
        ("IBV_WC_RNR_RETRY_EXC_ERR", WcStatus::RnrRetryExcErr),
        ("IBV_WC_REM_INV_RD_REQ_ERR", WcStatus::RemInvRdReqErr),
        ("IBV_WC_GENERAL_ERR", WcStatus::GeneralErr),
    ] {
        v.push((name, st.to_ibv() as usize));
    }
    for (name, op) in [
        ("IBV_WC_SEND", WcOpcode::Send),
        ("IBV_WC_RDMA_WRITE", WcOpcode::RdmaWrite),
        ("IBV_WC_RDMA_READ", WcOpcode::RdmaRead),
        ("IBV_WC_COMP_SWAP", WcOpcode::CompSwap),
        ("IBV_WC_FETCH_ADD", WcOpcode::FetchAdd),
        ("IBV_WC_BIND_MW", WcOpcode::BindMw),
        ("IBV_WC_LOCAL_INV", WcOpcode::LocalInv),
        ("IBV_WC_ATOMIC_WRITE", WcOpcode::AtomicWrite),
        ("IBV_WC_RECV", WcOpcode::Recv),
        ("IBV_WC_RECV_RDMA_WITH_IMM", WcOpcode::RecvRdmaWithImm),
    ] {
        v.push((name, op.to_ibv() as usize));
    }
    v
}

// ---- librdmacm (`<rdma/rdma_cma.h>`, `<infiniband/sa.h>`) ------------------------------------

/// `struct ibv_qp_init_attr_ex`, up to the fields this library reads (`comp_mask`, `pd`,
/// `send_ops_flags` are checked against the header; the rest is never touched).
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf`: a u8 function, a u8 key length, a key pointer, a u64 mask.
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

impl ibv_qp_init_attr_ex {
    /// The leading fields it shares with `struct ibv_qp_init_attr`, as that structure (what
    /// `ibv_create_qp` takes).
    pub fn base(&self) -> ibv_qp_init_attr {
        ibv_qp_init_attr {
            qp_context: self.qp_context,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

/// `IBV_QP_INIT_ATTR_PD`, `IBV_QP_INIT_ATTR_XRCD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: the source and destination unions are `struct sockaddr_storage`
/// sized; `addr` holds only `ibaddr`.
#[repr(C)]
pub struct rdma_addr {
    pub src_storage: libc::sockaddr_storage,
    pub dst_storage: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `RDMA_PS_TCP`, `RDMA_PS_UDP`, `RDMA_PS_IB`, `RDMA_PS_IPOIB`.
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013F;
pub const RDMA_PS_IPOIB: c_int = 0x0002;
/// `RAI_PASSIVE`, `RAI_NUMERICHOST`, `RAI_NOROUTE`, `RAI_FAMILY`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;
/// `RDMA_UDP_QKEY`.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// `struct ibv_path_data` (`<infiniband/sa.h>`): flags and a packed SA path record
/// (`struct ibv_path_record`, 64 bytes in network byte order; offsets below).
#[repr(C)]
pub struct ibv_path_data {
    pub flags: u32,
    pub reserved: u32,
    pub path: [u8; 64],
}
/// Offsets in `struct ibv_path_record`.
pub const PATH_REC_DGID: usize = 8;
pub const PATH_REC_SGID: usize = 24;
pub const PATH_REC_FLOWLABEL_HOPLIMIT: usize = 44;
pub const PATH_REC_TCLASS: usize = 48;
pub const PATH_REC_MTU: usize = 54;
/// `IBV_PATH_FLAG_GMP`, `_PRIMARY`, `_BIDIRECTIONAL`.
pub const IBV_PATH_FLAG_GMP: u32 = 1 << 0;
pub const IBV_PATH_FLAG_PRIMARY: u32 = 1 << 1;
pub const IBV_PATH_FLAG_BIDIRECTIONAL: u32 = (1 << 3) | (1 << 5);

/// `rdma_set_option` levels (`RDMA_OPTION_ID`, `RDMA_OPTION_IB`) and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// The layout facts of librdmacm's structures (`<rdma/rdma_cma.h>`), as [`layout_facts`].
pub fn rdmacm_layout_facts() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    macro_rules! facts {
        ($($t:ident { $($f:ident),* }),* $(,)?) => {{
            let mut v = Vec::new();
            $(
                v.push((concat!("sizeof(struct ", stringify!($t), ")"), size_of::<$t>()));
                $( v.push((concat!("offsetof(struct ", stringify!($t), ", ", stringify!($f), ")"), offset_of!($t, $f))); )*
            )*
            v
        }};
    }
    let mut v = facts!(
        ibv_qp_init_attr_ex {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
            comp_mask,
            pd,
            xrcd,
            create_flags,
            max_tso_header,
            rwq_ind_tbl,
            rx_hash_conf,
            source_qpn,
            send_ops_flags
        },
        ibv_sa_path_rec {
            dgid,
            sgid,
            dlid,
            slid,
            raw_traffic,
            flow_label,
            hop_limit,
            traffic_class,
            reversible,
            numb_path,
            pkey,
            sl,
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            packet_life_time_selector,
            packet_life_time,
            preference
        },
        rdma_event_channel { fd },
        rdma_ib_addr { sgid, dgid, pkey },
        rdma_addr {
            src_storage,
            dst_storage
        },
        rdma_route {
            addr,
            path_rec,
            num_paths
        },
        rdma_cm_id {
            verbs,
            channel,
            context,
            qp,
            route,
            ps,
            port_num,
            event,
            send_cq_channel,
            send_cq,
            recv_cq_channel,
            recv_cq,
            srq,
            pd,
            qp_type
        },
        rdma_conn_param {
            private_data,
            private_data_len,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num
        },
        rdma_ud_param {
            private_data,
            private_data_len,
            ah_attr,
            qp_num,
            qkey
        },
        rdma_cm_event {
            id,
            listen_id,
            event,
            status,
            param
        },
        rdma_addrinfo {
            ai_flags,
            ai_family,
            ai_qp_type,
            ai_port_space,
            ai_src_len,
            ai_dst_len,
            ai_src_addr,
            ai_dst_addr,
            ai_src_canonname,
            ai_dst_canonname,
            ai_route_len,
            ai_route,
            ai_connect_len,
            ai_connect,
            ai_next
        },
    );
    v.push((
        "offsetof(struct rdma_addr, addr.ibaddr)",
        offset_of!(rdma_addr, ibaddr),
    ));
    v.push((
        "offsetof(struct rdma_cm_event, param.ud.qkey)",
        offset_of!(rdma_cm_event, param) + offset_of!(rdma_ud_param, qkey),
    ));
    v.push((
        "offsetof(struct rdma_cm_event, param.conn.qp_num)",
        offset_of!(rdma_cm_event, param) + offset_of!(rdma_conn_param, qp_num),
    ));
    v.push((
        "sizeof(((struct rdma_cm_event *)0)->param)",
        size_of::<rdma_cm_event_param>(),
    ));
    for (name, n) in [
        ("RDMA_PS_TCP", RDMA_PS_TCP),
        ("RDMA_PS_UDP", RDMA_PS_UDP),
        ("RDMA_PS_IB", RDMA_PS_IB),
        ("RDMA_PS_IPOIB", RDMA_PS_IPOIB),
        ("RAI_PASSIVE", RAI_PASSIVE),
        ("RAI_NUMERICHOST", RAI_NUMERICHOST),
        ("RAI_NOROUTE", RAI_NOROUTE),
        ("RAI_FAMILY", RAI_FAMILY),
        ("RDMA_UDP_QKEY", RDMA_UDP_QKEY as c_int),
        ("IBV_QP_INIT_ATTR_PD", IBV_QP_INIT_ATTR_PD as c_int),
        ("IBV_SRQ_INIT_ATTR_TYPE", IBV_SRQ_INIT_ATTR_TYPE as c_int),
        ("IBV_SRQ_INIT_ATTR_PD", IBV_SRQ_INIT_ATTR_PD as c_int),
        ("IBV_SRQT_BASIC", IBV_SRQT_BASIC),
        ("IBV_SRQT_XRC", IBV_SRQT_XRC),
        ("IBV_SRQ_INIT_ATTR_XRCD", IBV_SRQ_INIT_ATTR_XRCD as c_int),
        ("IBV_SRQ_INIT_ATTR_CQ", IBV_SRQ_INIT_ATTR_CQ as c_int),
        ("IBV_XRCD_INIT_ATTR_FD", IBV_XRCD_INIT_ATTR_FD as c_int),
        (
            "IBV_XRCD_INIT_ATTR_OFLAGS",
            IBV_XRCD_INIT_ATTR_OFLAGS as c_int,
        ),
        ("IBV_QPT_XRC_SEND", IBV_QPT_XRC_SEND),
        ("IBV_QPT_XRC_RECV", IBV_QPT_XRC_RECV),
        ("IBV_QP_INIT_ATTR_XRCD", IBV_QP_INIT_ATTR_XRCD as c_int),
        ("RDMA_OPTION_ID", RDMA_OPTION_ID),
        ("RDMA_OPTION_IB", RDMA_OPTION_IB),
        ("RDMA_OPTION_ID_TOS", RDMA_OPTION_ID_TOS),
        ("RDMA_OPTION_ID_REUSEADDR", RDMA_OPTION_ID_REUSEADDR),
        ("RDMA_OPTION_ID_AFONLY", RDMA_OPTION_ID_AFONLY),
        ("RDMA_OPTION_ID_ACK_TIMEOUT", RDMA_OPTION_ID_ACK_TIMEOUT),
        ("RDMA_OPTION_IB_PATH", RDMA_OPTION_IB_PATH),
        ("IBV_PATH_FLAG_GMP", IBV_PATH_FLAG_GMP as c_int),
        ("IBV_PATH_FLAG_PRIMARY", IBV_PATH_FLAG_PRIMARY as c_int),
        (
            "IBV_PATH_FLAG_BIDIRECTIONAL",
            IBV_PATH_FLAG_BIDIRECTIONAL as c_int,
        ),
    ] {
        v.push((name, n as usize));
    }
    for (name, n) in [
        ("sizeof(struct ibv_path_data)", size_of::<ibv_path_data>()),
        (
            "offsetof(struct ibv_path_data, path)",
            offset_of!(ibv_path_data, path),
        ),
        ("sizeof(struct ibv_path_record)", 64),
        ("offsetof(struct ibv_path_record, dgid)", PATH_REC_DGID),
        ("offsetof(struct ibv_path_record, sgid)", PATH_REC_SGID),
        (
            "offsetof(struct ibv_path_record, flowlabel_hoplimit)",
            PATH_REC_FLOWLABEL_HOPLIMIT,
        ),
        ("offsetof(struct ibv_path_record, tclass)", PATH_REC_TCLASS),
        ("offsetof(struct ibv_path_record, mtu)", PATH_REC_MTU),
    ] {
        v.push((name, n));
    }
    v
}

// ---- extended CQs and QPs (`struct ibv_cq_ex`, `struct ibv_qp_ex`) ----------------------------

/// An `ibv_cq_ex *` is the same address as its `ibv_cq *` (`ibv_cq_ex_to_cq` is a cast).
pub type CqExPtr = *mut ibv_cq;
/// An `ibv_qp_ex *` is the same address as its `ibv_qp *` (`qp_base` is its first field).
pub type QpExPtr = *mut ibv_qp;

/// What `struct ibv_cq_ex` adds after the fields it shares with `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq_ex_tail {
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(CqExPtr, *mut c_void) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(CqExPtr) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(CqExPtr)>,
    pub read_opcode: Option<unsafe extern "C" fn(CqExPtr) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(CqExPtr) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(CqExPtr) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(CqExPtr) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(CqExPtr) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(CqExPtr) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(CqExPtr) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(CqExPtr, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(CqExPtr) -> u64>,
}

/// `struct ibv_cq_ex`: `struct ibv_cq`'s fields, then the polling interface.
#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub ex: ibv_cq_ex_tail,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// What `struct ibv_qp_ex` adds after `struct ibv_qp qp_base`: the work request builder.
#[repr(C)]
pub struct ibv_qp_ex_tail {
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(QpExPtr, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(QpExPtr, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(QpExPtr, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(QpExPtr, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(QpExPtr, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(QpExPtr, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(QpExPtr, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(QpExPtr)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(QpExPtr, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(QpExPtr, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(QpExPtr, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(QpExPtr, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(QpExPtr, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(QpExPtr, *mut c_void, usize)>,
    pub wr_set_inline_data_list: Option<unsafe extern "C" fn(QpExPtr, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(QpExPtr, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(QpExPtr, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(QpExPtr)>,
    pub wr_complete: Option<unsafe extern "C" fn(QpExPtr) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(QpExPtr)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(QpExPtr, u32, u64, *const c_void)>,
}

/// `struct ibv_qp_ex`.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub ex: ibv_qp_ex_tail,
}

/// `struct ibv_device_attr_ex`: the legacy attributes, then the extended ones. The groups
/// the library leaves zero are opaque words of their C size and alignment.
#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    /// `struct ibv_tso_caps`.
    pub tso_caps: [u32; 2],
    /// `struct ibv_rss_caps`.
    pub rss_caps: [u64; 4],
    pub max_wq_type_rq: u32,
    /// `struct ibv_packet_pacing_caps`.
    pub packet_pacing_caps: [u32; 3],
    pub raw_packet_caps: u32,
    /// `struct ibv_tm_caps`.
    pub tm_caps: [u32; 5],
    /// `struct ibv_cq_moderation_caps`.
    pub cq_mod_caps: [u16; 2],
    pub max_dm_size: u64,
    /// `struct ibv_pci_atomic_caps`.
    pub pci_atomic_caps: [u16; 3],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_odp_caps` (its `per_transport_caps` members inline).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `IBV_ACCESS_ON_DEMAND` (`enum ibv_access_flags`).
pub const IBV_ACCESS_ON_DEMAND: c_int = 1 << 6;
/// `IBV_ODP_SUPPORT` and `IBV_ODP_SUPPORT_IMPLICIT` (`enum ibv_odp_general_caps`).
pub const IBV_ODP_SUPPORT: u64 = 1;
pub const IBV_ODP_SUPPORT_IMPLICIT: u64 = 2;
/// `enum ibv_odp_transport_cap_bits`.
pub const IBV_ODP_SUPPORT_SEND: u32 = 1;
pub const IBV_ODP_SUPPORT_RECV: u32 = 2;
pub const IBV_ODP_SUPPORT_WRITE: u32 = 4;
pub const IBV_ODP_SUPPORT_READ: u32 = 8;
pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 16;
pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 32;
/// `enum ibv_advise_mr_advice` and `IBV_ADVISE_MR_FLAG_FLUSH`.
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: c_int = 0;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: c_int = 1;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: c_int = 2;
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// `struct ibv_values_ex` (`ibv_query_rt_values_ex`).
#[repr(C)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
pub const IBV_VALUES_MASK_RAW_CLOCK: u32 = 1;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;

/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_MAX_TSO_HEADER`.
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
/// The `enum ibv_qp_create_send_ops_flags` the work request builder carries: WRITE, WRITE with
/// immediate, SEND, SEND with immediate, READ, compare-and-swap, fetch-and-add (`1 << 0` to
/// `1 << 6`) and SEND with invalidate (`1 << 9`).
pub const SEND_OPS_CARRIED: [(&str, u64); 11] = [
    ("IBV_QP_EX_WITH_RDMA_WRITE", 1),
    ("IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM", 1 << 1),
    ("IBV_QP_EX_WITH_SEND", 1 << 2),
    ("IBV_QP_EX_WITH_SEND_WITH_IMM", 1 << 3),
    ("IBV_QP_EX_WITH_RDMA_READ", 1 << 4),
    ("IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP", 1 << 5),
    ("IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD", 1 << 6),
    ("IBV_QP_EX_WITH_LOCAL_INV", 1 << 7),
    ("IBV_QP_EX_WITH_BIND_MW", 1 << 8),
    ("IBV_QP_EX_WITH_SEND_WITH_INV", 1 << 9),
    ("IBV_QP_EX_WITH_ATOMIC_WRITE", 1 << 12),
];
/// `IBV_WC_STANDARD_FLAGS`: the completion fields every CQ has (byte length, immediate, QP
/// number, source QP, SLID, SL, DLID path bits).
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;

/// The layout facts of the extended CQ and QP, as [`layout_facts`].
pub fn ex_layout_facts() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    let mut v = Vec::new();
    macro_rules! tail {
        ($outer:ident, $c:literal, $t:ident { $($f:ident),* }) => {
            $( v.push((concat!("offsetof(struct ", $c, ", ", stringify!($f), ")"),
                offset_of!($outer, ex) + offset_of!($t, $f))); )*
        };
    }
    v.push(("sizeof(struct ibv_cq_ex)", size_of::<ibv_cq_ex>()));
    tail!(
        ibv_cq_ex,
        "ibv_cq_ex",
        ibv_cq_ex_tail {
            comp_mask,
            status,
            wr_id,
            start_poll,
            next_poll,
            end_poll,
            read_opcode,
            read_vendor_err,
            read_byte_len,
            read_imm_data,
            read_qp_num,
            read_src_qp,
            read_wc_flags,
            read_slid,
            read_sl,
            read_dlid_path_bits,
            read_completion_ts,
            read_cvlan,
            read_flow_tag,
            read_tm_info,
            read_completion_wallclock_ns
        }
    );
    v.push(("sizeof(struct ibv_qp_ex)", size_of::<ibv_qp_ex>()));
    tail!(
        ibv_qp_ex,
        "ibv_qp_ex",
        ibv_qp_ex_tail {
            comp_mask,
            wr_id,
            wr_flags,
            wr_atomic_cmp_swp,
            wr_atomic_fetch_add,
            wr_bind_mw,
            wr_local_inv,
            wr_rdma_read,
            wr_rdma_write,
            wr_rdma_write_imm,
            wr_send,
            wr_send_imm,
            wr_send_inv,
            wr_send_tso,
            wr_set_ud_addr,
            wr_set_xrc_srqn,
            wr_set_inline_data,
            wr_set_inline_data_list,
            wr_set_sge,
            wr_set_sge_list,
            wr_start,
            wr_complete,
            wr_abort,
            wr_atomic_write
        }
    );
    macro_rules! plain {
        ($($t:ident { $($f:ident),* }),*) => { $(
            v.push((concat!("sizeof(struct ", stringify!($t), ")"), size_of::<$t>()));
            $( v.push((concat!("offsetof(struct ", stringify!($t), ", ", stringify!($f), ")"),
                offset_of!($t, $f))); )*
        )* };
    }
    plain!(
        ibv_cq_init_attr_ex {
            cqe,
            cq_context,
            channel,
            comp_vector,
            wc_flags,
            comp_mask,
            flags,
            parent_domain
        },
        ibv_data_buf { addr, length },
        ibv_device_attr_ex {
            orig_attr,
            comp_mask,
            odp_caps,
            completion_timestamp_mask,
            hca_core_clock,
            device_cap_flags_ex,
            tso_caps,
            rss_caps,
            max_wq_type_rq,
            packet_pacing_caps,
            raw_packet_caps,
            tm_caps,
            cq_mod_caps,
            max_dm_size,
            pci_atomic_caps,
            xrc_odp_caps,
            phys_port_cnt_ex
        },
        ibv_values_ex {
            comp_mask,
            raw_clock
        }
    );
    for (n, o) in [
        (
            "offsetof(struct verbs_context, advise_mr)",
            offset_of!(verbs_context, advise_mr),
        ),
        ("sizeof(struct ibv_odp_caps)", size_of::<ibv_odp_caps>()),
        (
            "offsetof(struct ibv_odp_caps, general_caps)",
            offset_of!(ibv_odp_caps, general_caps),
        ),
        (
            "offsetof(struct ibv_odp_caps, per_transport_caps.rc_odp_caps)",
            offset_of!(ibv_odp_caps, rc_odp_caps),
        ),
        (
            "offsetof(struct ibv_odp_caps, per_transport_caps.uc_odp_caps)",
            offset_of!(ibv_odp_caps, uc_odp_caps),
        ),
        (
            "offsetof(struct ibv_odp_caps, per_transport_caps.ud_odp_caps)",
            offset_of!(ibv_odp_caps, ud_odp_caps),
        ),
        ("IBV_ACCESS_ON_DEMAND", IBV_ACCESS_ON_DEMAND as usize),
        ("IBV_ODP_SUPPORT", IBV_ODP_SUPPORT as usize),
        (
            "IBV_ODP_SUPPORT_IMPLICIT",
            IBV_ODP_SUPPORT_IMPLICIT as usize,
        ),
        ("IBV_ODP_SUPPORT_SEND", IBV_ODP_SUPPORT_SEND as usize),
        ("IBV_ODP_SUPPORT_RECV", IBV_ODP_SUPPORT_RECV as usize),
        ("IBV_ODP_SUPPORT_WRITE", IBV_ODP_SUPPORT_WRITE as usize),
        ("IBV_ODP_SUPPORT_READ", IBV_ODP_SUPPORT_READ as usize),
        ("IBV_ODP_SUPPORT_ATOMIC", IBV_ODP_SUPPORT_ATOMIC as usize),
        (
            "IBV_ODP_SUPPORT_SRQ_RECV",
            IBV_ODP_SUPPORT_SRQ_RECV as usize,
        ),
        (
            "IBV_ADVISE_MR_ADVICE_PREFETCH",
            IBV_ADVISE_MR_ADVICE_PREFETCH as usize,
        ),
        (
            "IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE",
            IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE as usize,
        ),
        (
            "IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT",
            IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT as usize,
        ),
        (
            "IBV_ADVISE_MR_FLAG_FLUSH",
            IBV_ADVISE_MR_FLAG_FLUSH as usize,
        ),
        (
            "offsetof(struct verbs_context, query_rt_values)",
            offset_of!(verbs_context, query_rt_values),
        ),
        (
            "offsetof(struct verbs_context, query_device_ex)",
            offset_of!(verbs_context, query_device_ex),
        ),
        (
            "IBV_VALUES_MASK_RAW_CLOCK",
            IBV_VALUES_MASK_RAW_CLOCK as usize,
        ),
        (
            "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP",
            IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as usize,
        ),
        (
            "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK",
            IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as usize,
        ),
    ] {
        v.push((n, o));
    }
    v.push((
        "offsetof(struct verbs_context, create_cq_ex)",
        offset_of!(verbs_context, create_cq_ex),
    ));
    v.push((
        "offsetof(struct verbs_context, create_qp_ex)",
        offset_of!(verbs_context, create_qp_ex),
    ));
    for (n, o) in [
        (
            "offsetof(struct verbs_context, get_srq_num)",
            offset_of!(verbs_context, get_srq_num),
        ),
        (
            "offsetof(struct verbs_context, create_srq_ex)",
            offset_of!(verbs_context, create_srq_ex),
        ),
        (
            "offsetof(struct verbs_context, open_xrcd)",
            offset_of!(verbs_context, open_xrcd),
        ),
        (
            "offsetof(struct verbs_context, close_xrcd)",
            offset_of!(verbs_context, close_xrcd),
        ),
        ("sizeof(struct ibv_xrcd)", size_of::<ibv_xrcd>()),
        (
            "offsetof(struct ibv_xrcd, context)",
            offset_of!(ibv_xrcd, context),
        ),
        (
            "sizeof(struct ibv_xrcd_init_attr)",
            size_of::<ibv_xrcd_init_attr>(),
        ),
        (
            "offsetof(struct ibv_xrcd_init_attr, fd)",
            offset_of!(ibv_xrcd_init_attr, fd),
        ),
        (
            "offsetof(struct ibv_xrcd_init_attr, oflags)",
            offset_of!(ibv_xrcd_init_attr, oflags),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, xrcd)",
            offset_of!(ibv_srq_init_attr_ex, xrcd),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, cq)",
            offset_of!(ibv_srq_init_attr_ex, cq),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, xrcd)",
            offset_of!(ibv_qp_init_attr_ex, xrcd),
        ),
    ] {
        v.push((n, o));
    }
    v.push((
        "IBV_QP_INIT_ATTR_SEND_OPS_FLAGS",
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS as usize,
    ));
    v.push((
        "IBV_QP_INIT_ATTR_CREATE_FLAGS",
        IBV_QP_INIT_ATTR_CREATE_FLAGS as usize,
    ));
    v.push((
        "IBV_QP_INIT_ATTR_MAX_TSO_HEADER",
        IBV_QP_INIT_ATTR_MAX_TSO_HEADER as usize,
    ));
    for (n, f) in SEND_OPS_CARRIED {
        v.push((n, f as usize));
    }
    v.push(("IBV_WC_STANDARD_FLAGS", IBV_WC_STANDARD_FLAGS as usize));
    v
}
