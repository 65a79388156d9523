//! A private `/dev` holding a device node that a program looks for (`ferroce run --dev-node`).
//!
//! UCX takes a verbs device only if `/dev/infiniband/<dev_name>` is a character device the
//! program may open; ferroce's device has no kernel driver to make one. Any openable character
//! device passes its check, so [`private_dev_node`] gives this process (and what it then
//! executes) a mount namespace of its own in which `/dev` is a fresh tmpfs holding every entry
//! of the real `/dev` (bind mounts: the same devices, directories and their submounts,
//! symbolic links recreated) plus the node, a bind mount of `/dev/null`. Nothing outside the
//! process changes. An unprivileged user gets the mount namespace inside a user namespace of
//! its own that maps its own user and group to themselves only: the program then runs with
//! its own identity and no privilege (the capabilities of the new namespace end at `execve`).
#![allow(unsafe_code)]

use super::cvt;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// `mount(2)`; `tmpfs` is mounted with `mode=0755` (a /dev's mode: in a sticky world-writable
/// directory the kernel refuses `O_CREAT` opens of the devices), everything else with no data.
fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let target = cstr(target)?;
    let data = (fstype == Some("tmpfs")).then_some(c"mode=0755");
    let fstype = fstype.map(|f| CString::new(f).expect("no NUL in a file system name"));
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null where
    // mount(2) allows it (no source for a propagation change, no file system type for a bind,
    // no data but tmpfs's mode).
    cvt(unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    })
    .map(drop)
    .map_err(|e| io::Error::new(e.kind(), format!("mount {}: {e}", target.to_string_lossy())))
}

/// Enter a new mount namespace (and, unless this process is root, a new user namespace that
/// maps its user and group to themselves), in which `rel` under `/dev` (`infiniband/uverbs_x`)
/// is a bind mount of `/dev/null` and every other entry of `/dev` is as before. Must be called
/// while the process has one thread (`unshare(CLONE_NEWUSER)` refuses otherwise).
pub fn private_dev_node(rel: &Path) -> io::Result<()> {
    let dev = Path::new("/dev");
    let node = dev.join(rel);
    let rel_parent = rel
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && rel.is_relative())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a node under /dev/DIR/"))?;
    // SAFETY: getuid/getgid cannot fail and have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let flags = if uid == 0 {
        libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS
    };
    // SAFETY: unshare(2) with namespace flags only; it changes this process's namespaces.
    cvt(unsafe { libc::unshare(flags) }).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("unshare (user and mount namespaces): {e}"),
        )
    })?;
    if uid != 0 {
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    // Nothing done here propagates back to the host's mount namespace.
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)?;
    // The real /dev, kept reachable while the new one is built over it.
    let old = std::env::temp_dir().join(format!("ferroce-dev-{}", std::process::id()));
    std::fs::create_dir_all(&old)?;
    mount(Some(dev), &old, None, libc::MS_BIND | libc::MS_REC)?;
    let r = build(dev, &old, rel_parent, &node);
    // SAFETY: umount2 on a path string that outlives the call; MNT_DETACH only.
    unsafe { libc::umount2(cstr(&old)?.as_ptr(), libc::MNT_DETACH) };
    let _ = std::fs::remove_dir(&old);
    r
}

/// Cover `dir` with a tmpfs holding bind mounts of what `orig` (its old contents) holds.
fn cover(dir: &Path, orig: &Path) -> io::Result<()> {
    mount(
        Some(Path::new("tmpfs")),
        dir,
        Some("tmpfs"),
        libc::MS_NOSUID,
    )?;
    for e in std::fs::read_dir(orig)? {
        let e = e?;
        let (from, to) = (e.path(), dir.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else if t.is_dir() {
            std::fs::create_dir(&to)?;
            mount(Some(&from), &to, None, libc::MS_BIND | libc::MS_REC)?;
        } else {
            std::fs::File::create(&to)?;
            mount(Some(&from), &to, None, libc::MS_BIND)?;
        }
    }
    Ok(())
}

/// Build the private `/dev` (the real one reachable at `old`) with `node`, whose directory is
/// `rel_parent` under `/dev`.
fn build(dev: &Path, old: &Path, rel_parent: &Path, node: &Path) -> io::Result<()> {
    // The node's directory exists in the real /dev (a host with other RDMA devices): cover
    // only it. Otherwise cover /dev and make the directory in the new tmpfs.
    let (parent, orig) = (dev.join(rel_parent), old.join(rel_parent));
    if orig.is_dir() {
        cover(&parent, &orig)?;
    } else {
        cover(dev, old)?;
        std::fs::create_dir_all(&parent)?;
    }
    if !node.exists() {
        std::fs::File::create(node)?;
    }
    mount(Some(&old.join("null")), node, None, libc::MS_BIND)
}

/// The `dev_name` of ferroce's verbs device (what the C library reports in `struct
/// ibv_device`; UCX looks for `/dev/infiniband/<dev_name>`).
pub const VERBS_DEV_NAME: &str = "uverbs_ferroce";

/// Where [`private_dev_node`] makes the node of ferroce's verbs device, under `/dev`.
pub fn verbs_node() -> PathBuf {
    Path::new("infiniband").join(VERBS_DEV_NAME)
}
