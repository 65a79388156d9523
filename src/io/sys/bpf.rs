//! `bpf(2)`: the handful of commands the AF_XDP backend needs.
//!
//! - [`create_xskmap`]: `BPF_MAP_CREATE` of a `BPF_MAP_TYPE_XSKMAP` (queue index → AF_XDP
//!   socket), updated with [`MapFd::update_u32`] (`BPF_MAP_UPDATE_ELEM`, the value is the
//!   socket's file descriptor) and [`MapFd::delete_u32`] (`BPF_MAP_DELETE_ELEM`).
//! - [`load_xdp_program`]: `BPF_PROG_LOAD` of a `BPF_PROG_TYPE_XDP` program; on failure the
//!   load is repeated with a verifier log buffer and the log is returned in the error.
//! - [`attach_xdp_link`]: `BPF_LINK_CREATE` with attach type `BPF_XDP` (Linux ≥ 5.9). The
//!   program stays attached exactly as long as the returned [`LinkFd`] is open: dropping it
//!   (or the process dying) detaches the program. The netlink alternative is in
//!   [`super::netlink`].
//! - [`ProgFd::info`], [`MapFd::info`], [`prog_fd_by_id`], [`map_fd_by_id`]
//!   (`BPF_OBJ_GET_INFO_BY_FD`, `BPF_PROG_GET_FD_BY_ID`, `BPF_MAP_GET_FD_BY_ID`): find out
//!   what program an interface runs and which maps it uses (to reuse one ferroce attached).
//! - [`ProgFd::test_run`]: `BPF_PROG_TEST_RUN`, the kernel running the program on a buffer.
//!
//! Each command's attribute block is a `#[repr(C)]` struct laid out as the matching member
//! of `union bpf_attr` (linux/bpf.h), zero-padded: the kernel rejects non-zero bytes it does
//! not know, so unused fields must stay zero.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

// Commands (enum bpf_cmd).
const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_TEST_RUN: u32 = 10;
const BPF_PROG_GET_FD_BY_ID: u32 = 13;
const BPF_MAP_GET_FD_BY_ID: u32 = 14;
const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
const BPF_LINK_CREATE: u32 = 28;

/// `BPF_MAP_TYPE_XSKMAP`.
pub const MAP_TYPE_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_XDP`.
pub const PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`: the attach type of an XDP link (and the expected attach type of an XDP
/// program meant for one).
pub const ATTACH_TYPE_XDP: u32 = 37;
/// `BPF_F_XDP_HAS_FRAGS` (prog_flags): the program copes with multi-buffer frames.
pub const F_XDP_HAS_FRAGS: u32 = 1 << 5;
/// `BPF_ANY` (map update flags): create or replace the entry.
pub const ANY: u64 = 0;

/// Length of object names (`BPF_OBJ_NAME_LEN`, NUL included).
pub const OBJ_NAME_LEN: usize = 16;

/// Issue `bpf(cmd, attr, sizeof attr)`. Returns the (non-negative) result.
///
/// # Safety
/// `attr` must be the attribute layout `cmd` expects, and every pointer stored in it must be
/// valid for the accesses the kernel makes during the call (reads of inputs, writes of
/// outputs of the sizes given next to them).
unsafe fn sys_bpf<A>(cmd: u32, attr: &mut A) -> io::Result<i32> {
    let r = libc::syscall(
        libc::SYS_bpf,
        cmd as libc::c_long,
        attr as *mut A as *mut libc::c_void,
        std::mem::size_of::<A>() as libc::c_long,
    );
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as i32)
    }
}

/// Wrap a descriptor a `bpf(2)` command just returned.
fn owned(fd: i32) -> OwnedFd {
    // SAFETY: the kernel just created `fd` for us; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Copy `name` into a fixed NUL-terminated name field (truncated to 15 bytes).
fn obj_name(name: &str) -> [u8; OBJ_NAME_LEN] {
    let mut out = [0u8; OBJ_NAME_LEN];
    for (d, s) in out[..OBJ_NAME_LEN - 1].iter_mut().zip(name.bytes()) {
        *d = s;
    }
    out
}

fn name_str(raw: &[u8; OBJ_NAME_LEN]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// A BPF map, closed on drop.
#[derive(Debug)]
pub struct MapFd(OwnedFd);

/// A loaded BPF program, closed on drop (the kernel frees it once nothing, such as an
/// interface or a link, refers to it any more).
#[derive(Debug)]
pub struct ProgFd(OwnedFd);

/// A BPF link. The attachment it represents is undone when the last descriptor of the link
/// is closed, i.e. when this is dropped (it is never pinned here).
#[derive(Debug)]
pub struct LinkFd(OwnedFd);

macro_rules! fd_impls {
    ($($t:ty),*) => {$(
        impl AsFd for $t {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.0.as_fd()
            }
        }
        impl AsRawFd for $t {
            fn as_raw_fd(&self) -> RawFd {
                self.0.as_raw_fd()
            }
        }
    )*};
}
fd_impls!(MapFd, ProgFd, LinkFd);

/// `union bpf_attr` for `BPF_MAP_CREATE` (the fields up to `map_ifindex`).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; OBJ_NAME_LEN],
    map_ifindex: u32,
}

/// Create an XSKMAP with `max_entries` slots (keys are receive-queue indices, values are
/// AF_XDP socket descriptors). Needs CAP_BPF (or CAP_SYS_ADMIN) and CAP_NET_ADMIN.
pub fn create_xskmap(name: &str, max_entries: u32) -> io::Result<MapFd> {
    let mut a = MapCreateAttr {
        map_type: MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries,
        map_name: obj_name(name),
        ..Default::default()
    };
    // SAFETY: MapCreateAttr is the BPF_MAP_CREATE layout and holds no pointers.
    let fd = unsafe { sys_bpf(BPF_MAP_CREATE, &mut a)? };
    Ok(MapFd(owned(fd)))
}

/// `union bpf_attr` for `BPF_MAP_*_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `union bpf_attr` for `BPF_*_GET_FD_BY_ID`.
#[repr(C)]
#[derive(Default)]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// The start of `struct bpf_map_info`.
#[repr(C)]
#[derive(Default)]
struct RawMapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; OBJ_NAME_LEN],
}

/// What the kernel says about a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub name: String,
}

/// Ask for information about the object behind `fd` into `info`.
///
/// # Safety
/// `I` must be a prefix of the info struct of that object type (plain integers; pointers in
/// it, if non-zero, valid for what they describe).
unsafe fn obj_info<I>(fd: BorrowedFd<'_>, info: &mut I) -> io::Result<()> {
    let mut a = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<I>() as u32,
        info: info as *mut I as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(())
}

impl MapFd {
    /// `map[key] = value` for a map of u32 keys and u32 values (`BPF_MAP_UPDATE_ELEM` with
    /// `flags`, e.g. [`ANY`]). For an XSKMAP the value is an AF_XDP socket descriptor bound
    /// to the same interface.
    pub fn update_u32(&self, key: u32, value: u32, flags: u64) -> io::Result<()> {
        let mut a = MapElemAttr {
            map_fd: self.0.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags,
            ..Default::default()
        };
        // SAFETY: key and value point to u32s that live across the call; the map has 4-byte
        // keys and values (the kernel checks this against the map and fails otherwise).
        unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut a)? };
        Ok(())
    }

    /// Delete `map[key]` (`BPF_MAP_DELETE_ELEM`). `NotFound` (ENOENT) if it was not there.
    pub fn delete_u32(&self, key: u32) -> io::Result<()> {
        let mut a = MapElemAttr {
            map_fd: self.0.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            ..Default::default()
        };
        // SAFETY: key points to a u32 that lives across the call.
        unsafe { sys_bpf(BPF_MAP_DELETE_ELEM, &mut a)? };
        Ok(())
    }

    /// Type, id, sizes and name of the map.
    pub fn info(&self) -> io::Result<MapInfo> {
        let mut i = RawMapInfo::default();
        // SAFETY: RawMapInfo is the start of struct bpf_map_info and has no pointers.
        unsafe { obj_info(self.0.as_fd(), &mut i)? };
        Ok(MapInfo {
            map_type: i.map_type,
            id: i.id,
            key_size: i.key_size,
            value_size: i.value_size,
            max_entries: i.max_entries,
            name: name_str(&i.name),
        })
    }
}

/// Open the map with kernel id `id` (`BPF_MAP_GET_FD_BY_ID`; needs CAP_SYS_ADMIN).
pub fn map_fd_by_id(id: u32) -> io::Result<MapFd> {
    let mut a = GetFdByIdAttr {
        id,
        ..Default::default()
    };
    // SAFETY: plain integers.
    let fd = unsafe { sys_bpf(BPF_MAP_GET_FD_BY_ID, &mut a)? };
    Ok(MapFd(owned(fd)))
}

/// Open the program with kernel id `id` (`BPF_PROG_GET_FD_BY_ID`; needs CAP_SYS_ADMIN).
pub fn prog_fd_by_id(id: u32) -> io::Result<ProgFd> {
    let mut a = GetFdByIdAttr {
        id,
        ..Default::default()
    };
    // SAFETY: plain integers.
    let fd = unsafe { sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut a)? };
    Ok(ProgFd(owned(fd)))
}

/// `union bpf_attr` for `BPF_PROG_LOAD` (the fields up to `expected_attach_type`).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// A failed `BPF_PROG_LOAD`: the error and the verifier's log (empty if the kernel gave
/// none, e.g. for a permission error).
#[derive(Debug)]
pub struct ProgLoadError {
    /// The system call's error.
    pub error: io::Error,
    /// The verifier's log.
    pub log: String,
}

impl std::fmt::Display for ProgLoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BPF_PROG_LOAD: {}", self.error)?;
        if !self.log.is_empty() {
            write!(f, "; verifier log:\n{}", self.log.trim_end())?;
        }
        Ok(())
    }
}

impl std::error::Error for ProgLoadError {}

impl From<ProgLoadError> for io::Error {
    /// A rejection by the verifier (which reports most as EACCES) becomes `InvalidData`, not
    /// `PermissionDenied`: it is the program that is wrong, not the privileges.
    fn from(e: ProgLoadError) -> io::Error {
        let kind = if e.log.is_empty() {
            e.error.kind()
        } else {
            io::ErrorKind::InvalidData
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Size of the verifier log buffer used when a load fails (the log of a short program
/// fits easily; a longer one is truncated, which the kernel reports as ENOSPC).
const VERIFIER_LOG_SIZE: usize = 1 << 20;

/// Load an XDP program of raw eBPF instructions (8 bytes each, in `struct bpf_insn` layout).
/// `prog_flags` e.g. [`F_XDP_HAS_FRAGS`]. The expected attach type is `BPF_XDP`, which both
/// netlink and link attachment accept.
///
/// The first attempt runs without a log (cheaper); if it fails, the load is repeated with
/// `log_level` 1 and a 1 MiB buffer, and the verifier's explanation is returned.
pub fn load_xdp_program(
    insns: &[[u8; 8]],
    name: &str,
    license: &CStr,
    prog_flags: u32,
) -> Result<ProgFd, ProgLoadError> {
    let attempt = |log: Option<&mut Vec<u8>>| -> io::Result<ProgFd> {
        let mut a = ProgLoadAttr {
            prog_type: PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_flags,
            prog_name: obj_name(name),
            expected_attach_type: ATTACH_TYPE_XDP,
            ..Default::default()
        };
        if let Some(log) = log {
            a.log_level = 1;
            a.log_size = log.len() as u32;
            a.log_buf = log.as_mut_ptr() as u64;
        }
        // SAFETY: insns points to insn_cnt 8-byte instructions, license to a NUL-terminated
        // string, log_buf (if set) to log_size writable bytes; all outlive the call.
        let fd = unsafe { sys_bpf(BPF_PROG_LOAD, &mut a)? };
        Ok(ProgFd(owned(fd)))
    };
    match attempt(None) {
        Ok(p) => Ok(p),
        Err(first) => {
            // EPERM: missing privileges, the verifier was not involved. (The verifier itself
            // reports most rejections as EACCES, so that one is retried with the log.)
            if first.raw_os_error() == Some(libc::EPERM) {
                return Err(ProgLoadError {
                    error: first,
                    log: String::new(),
                });
            }
            let mut log = vec![0u8; VERIFIER_LOG_SIZE];
            match attempt(Some(&mut log)) {
                // Succeeding the second time would be odd, but is a success.
                Ok(p) => Ok(p),
                Err(error) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    Err(ProgLoadError {
                        error,
                        log: String::from_utf8_lossy(&log[..end]).into_owned(),
                    })
                }
            }
        }
    }
}

/// The start of `struct bpf_prog_info` (up to `name`).
#[repr(C)]
#[derive(Default)]
struct RawProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; OBJ_NAME_LEN],
}

/// What the kernel says about a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgInfo {
    pub prog_type: u32,
    pub id: u32,
    pub name: String,
    /// Ids of the maps the program uses.
    pub map_ids: Vec<u32>,
}

/// `union bpf_attr` for `BPF_PROG_TEST_RUN` (the fields up to `ctx_out`).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
}

impl ProgFd {
    /// Type, id, name and map ids of the program.
    pub fn info(&self) -> io::Result<ProgInfo> {
        let mut map_ids = [0u32; 16];
        let mut i = RawProgInfo {
            nr_map_ids: map_ids.len() as u32,
            map_ids: map_ids.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: RawProgInfo is the start of struct bpf_prog_info; map_ids points to
        // nr_map_ids writable u32s that live across the call; the other pointers are zero
        // (the kernel fills only what it is given room for).
        unsafe { obj_info(self.0.as_fd(), &mut i)? };
        let n = (i.nr_map_ids as usize).min(map_ids.len());
        Ok(ProgInfo {
            prog_type: i.prog_type,
            id: i.id,
            name: name_str(&i.name),
            map_ids: map_ids[..n].to_vec(),
        })
    }

    /// Run the program once on `data` in the kernel (`BPF_PROG_TEST_RUN`, no context: the
    /// frame "arrives" on the loopback device, queue 0) and return its verdict. Helpers run
    /// for real (a map lookup happens); a redirect is reported, not carried out.
    pub fn test_run(&self, data: &[u8]) -> io::Result<u32> {
        let mut a = TestRunAttr {
            prog_fd: self.0.as_raw_fd() as u32,
            data_size_in: data.len() as u32,
            data_in: data.as_ptr() as u64,
            repeat: 1,
            ..Default::default()
        };
        // SAFETY: data_in points to data_size_in readable bytes; no output buffers are given
        // (data_out and ctx_out are null, so the kernel writes only the attr itself).
        unsafe { sys_bpf(BPF_PROG_TEST_RUN, &mut a)? };
        Ok(a.retval)
    }
}

/// `union bpf_attr` for `BPF_LINK_CREATE` (the common fields).
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u64; 4],
}

/// Attach `prog` to interface `ifindex` (in the calling thread's network namespace) through
/// a BPF link (`BPF_LINK_CREATE`, attach type `BPF_XDP`). `xdp_flags` selects the mode:
/// `XDP_FLAGS_DRV_MODE` or `XDP_FLAGS_SKB_MODE` (see [`super::netlink`]); a link never
/// replaces a program already attached (EBUSY), so `XDP_FLAGS_UPDATE_IF_NOEXIST` is
/// implied and must not be passed.
pub fn attach_xdp_link(prog: &ProgFd, ifindex: u32, xdp_flags: u32) -> io::Result<LinkFd> {
    let mut a = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: ATTACH_TYPE_XDP,
        flags: xdp_flags,
        ..Default::default()
    };
    // SAFETY: plain integers.
    let fd = unsafe { sys_bpf(BPF_LINK_CREATE, &mut a)? };
    Ok(LinkFd(owned(fd)))
}
