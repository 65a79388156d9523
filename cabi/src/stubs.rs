//! The rest of libibverbs' exported names, so that every library an application loads with
//! it resolves (Debian builds with `-z now`: one missing symbol and the program does not
//! start). perftest links rdma-core's provider libraries (libmlx5, libefa) and librdmacm,
//! which import libibverbs' provider interface (`ibv_cmd_*`, `verbs_*`, IBVERBS_PRIVATE_34)
//! and a few public calls. None of them is reached on ferroce: providers are only entered
//! through a device they own, and librdmacm's kernel path needs `/dev/infiniband/rdma_cm`.
//! Each stub fails the way its real counterpart reports "not supported", and says so on
//! standard error once per name.

use libc::{c_char, c_int, c_void};
use std::sync::atomic::AtomicBool;

fn not_here(name: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut s = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !s.iter().any(|n| n == name) {
        s.push(name.to_string());
        eprintln!("ferroce libibverbs: {name} (a provider-internal call) is not available");
    }
}

macro_rules! int_stubs {
    ($($n:ident),* $(,)?) => { $(
        /// Provider interface of libibverbs: not available on ferroce (EOPNOTSUPP).
        #[no_mangle]
        pub extern "C" fn $n() -> c_int {
            not_here(stringify!($n));
            libc::EOPNOTSUPP
        }
    )* };
}

macro_rules! void_stubs {
    ($($n:ident),* $(,)?) => { $(
        /// Provider interface of libibverbs: nothing to do on ferroce.
        #[no_mangle]
        pub extern "C" fn $n() {
            not_here(stringify!($n));
        }
    )* };
}

macro_rules! null_stubs {
    ($($n:ident),* $(,)?) => { $(
        /// Provider interface of libibverbs: not available on ferroce (NULL).
        #[no_mangle]
        pub extern "C" fn $n() -> *mut c_void {
            not_here(stringify!($n));
            std::ptr::null_mut()
        }
    )* };
}

int_stubs!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_query_ece,
    ibv_resolve_eth_l2_from_gid,
    ibv_set_ece,
    __ioctl_final_num_attrs,
    verbs_init_cq,
);

void_stubs!(
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    verbs_set_ops,
    verbs_uninit_context
);

null_stubs!(_verbs_init_and_alloc_context, verbs_open_device);

/// `verbs_register_driver_34`: the provider libraries an application links (libmlx5, libefa)
/// register themselves from their constructors; ferroce has no use for them: silently ignored.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `ibv_dontfork_range`: nothing is pinned, so nothing to protect across fork(): success.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: as `ibv_dontfork_range`.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `__verbs_log` (variadic in rdma-core): a provider's debug log line, dropped (a provider
/// loaded beside the application, libfabric's libefa for one, may log while it looks for
/// devices of its own).
#[no_mangle]
pub extern "C" fn __verbs_log(_ctx: *mut c_void, _level: u32, _format: *const c_char) {}

/// `ibv_read_ibdev_sysfs_file` (variadic in rdma-core; the format's arguments are not read):
/// a provider reads its device's sysfs files with it, and a ferroce device has none: -1 with
/// `ENOENT`.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _sysfs_dev: *const c_char,
    _fnfmt: *const c_char,
) -> c_int {
    crate::verbs::set_errno(libc::ENOENT);
    -1
}

/// `ibv_get_sysfs_path`: where sysfs is mounted.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// libibverbs' provider flag (a `bool` in rdma-core): never set on ferroce.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);
