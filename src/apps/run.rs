//! `ferroce run -- COMMAND`: an unmodified RDMA application on ferroce.
//!
//! The command runs with ferroce's `libibverbs.so.1` (the `cabi/` crate, built by
//! tools/build-cabi) first on `LD_LIBRARY_PATH`, and the device it shows chosen by the
//! environment that library reads (`FERROCE_DEV`, `FERROCE_ADDR`, `FERROCE_BACKEND`,
//! `FERROCE_PCAP`, `FERROCE_POLL`; see `cabi/src/device.rs`), and UCX's UD destination-GID
//! check off unless set (see [`command`]). Nothing else changes: no kernel module, no RDMA
//! device, and with the UDP backend (the default) no privilege.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `ferroce run` was asked.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The interface (`eth0` or `ferroce_eth0`).
    pub dev: Option<String>,
    /// The one address of the interface to use (on `lo` with the UDP backend, any IPv4
    /// loopback address).
    pub addr: Option<IpAddr>,
    /// `udp`, `packet` or `xdp`.
    pub backend: Option<String>,
    /// Capture every frame into this pcap file.
    pub pcap: Option<PathBuf>,
    /// `inline`, `busy` or `adaptive`.
    pub poll: Option<String>,
    /// The directory holding ferroce's libibverbs.so.1.
    pub lib_dir: Option<PathBuf>,
    /// Give the command `/dev/infiniband/uverbs_ferroce` (a character device UCX insists on)
    /// in a private mount namespace when the host has none (see [`crate::io::private_dev_node`]).
    pub dev_node: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Why `ferroce run` could not start the program.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No program given.
    #[error("no command given (ferroce run [OPTIONS] -- COMMAND [ARGS...])")]
    NoCommand,
    /// The library is not where it was looked for.
    #[error("ferroce's libibverbs.so.1 is not in {0} (build it with tools/build-cabi, or give --lib-dir)")]
    NoLibrary(String),
    /// exec failed.
    #[error("{0}: {1}")]
    Exec(String, std::io::Error),
    /// The private `/dev` could not be made.
    #[error("--dev-node: {0} (user namespaces may be disabled here; as root, `mkdir -p /dev/infiniband && ln -s /dev/null /dev/infiniband/{name}` does the same for every program)", name = crate::io::VERBS_DEV_NAME)]
    DevNode(std::io::Error),
}

/// Where ferroce's libibverbs.so.1 is: `--lib-dir`, else `FERROCE_LIB_DIR`, else `cabi/` next
/// to this executable (target/release/cabi for a build tree).
pub fn lib_dir(explicit: Option<&Path>) -> Result<PathBuf, RunError> {
    let cands: Vec<PathBuf> = match explicit {
        Some(d) => vec![d.to_path_buf()],
        None => match std::env::var_os("FERROCE_LIB_DIR").filter(|s| !s.is_empty()) {
            Some(d) => vec![PathBuf::from(d)],
            None => std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
                .map(|d| vec![d.join("cabi"), d.join("../lib/ferroce")])
                .unwrap_or_default(),
        },
    };
    cands
        .iter()
        .find(|d| d.join("libibverbs.so.1").is_file())
        .cloned()
        .ok_or_else(|| {
            RunError::NoLibrary(
                cands
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            )
        })
}

/// UCX's switch for the destination-GID check of its UD transports (see [`command`]).
pub const UCX_DGID_CHECK: &str = "UCX_UD_VERBS_ETH_DGID_CHECK";

/// The command, with its environment, ready to run.
pub fn command(o: &RunOptions) -> Result<Command, RunError> {
    let (prog, args) = o.command.split_first().ok_or(RunError::NoCommand)?;
    let dir = lib_dir(o.lib_dir.as_deref())?;
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|s| !s.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut c = Command::new(prog);
    c.args(args).env("LD_LIBRARY_PATH", path);
    let mut set = |k: &str, v: Option<OsString>| {
        if let Some(v) = v {
            c.env(k, v);
        }
    };
    set("FERROCE_DEV", o.dev.clone().map(Into::into));
    set("FERROCE_ADDR", o.addr.map(|a| a.to_string().into()));
    set("FERROCE_BACKEND", o.backend.clone().map(Into::into));
    set("FERROCE_PCAP", o.pcap.clone().map(Into::into));
    set("FERROCE_POLL", o.poll.clone().map(Into::into));
    // UCX's UD transport (its connection set-up for every other transport) drops a datagram
    // whose receive buffer's GRH does not hold its own GID where it expects it; it learns
    // where from the kernel's sysfs GID type ("RoCE v2": the IPv4 destination in the last 4
    // bytes), which a device without a kernel driver has not, so it takes RoCE v1's layout
    // and drops every RoCE v2 datagram. Its check off, unless the caller chose.
    if std::env::var_os(UCX_DGID_CHECK).is_none() {
        c.env(UCX_DGID_CHECK, "n");
    }
    Ok(c)
}

/// Replace this process with the command (returns only on failure).
pub fn exec(o: &RunOptions) -> RunError {
    use std::os::unix::process::CommandExt;
    let node = crate::io::verbs_node();
    if o.dev_node && !Path::new("/dev").join(&node).exists() {
        if let Err(e) = crate::io::private_dev_node(&node) {
            return RunError::DevNode(e);
        }
    }
    match command(o) {
        Ok(mut c) => {
            let e = c.exec();
            RunError::Exec(o.command[0].to_string_lossy().into_owned(), e)
        }
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library first on the path, the options as the library's variables, and UCX's
    /// destination-GID check off unless this process's environment already chose.
    #[test]
    fn the_command_gets_the_library_and_the_environment() {
        let dir = std::env::temp_dir().join(format!("ferroce-run-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libibverbs.so.1"), b"").unwrap();
        let o = RunOptions {
            dev: Some("lo".into()),
            addr: Some("127.0.0.2".parse().unwrap()),
            lib_dir: Some(dir.clone()),
            command: vec!["prog".into(), "arg".into()],
            ..Default::default()
        };
        let c = command(&o).unwrap();
        let env: Vec<(String, Option<String>)> = c
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.clone())
        };
        assert!(get("LD_LIBRARY_PATH")
            .unwrap()
            .starts_with(dir.to_str().unwrap()));
        assert_eq!(get("FERROCE_DEV").as_deref(), Some("lo"));
        assert_eq!(get("FERROCE_ADDR").as_deref(), Some("127.0.0.2"));
        assert_eq!(get("FERROCE_BACKEND"), None);
        match std::env::var_os(UCX_DGID_CHECK) {
            None => assert_eq!(get(UCX_DGID_CHECK).as_deref(), Some("n")),
            Some(_) => assert_eq!(get(UCX_DGID_CHECK), None, "the caller's choice stays"),
        }
        assert_eq!(c.get_program(), "prog");
        assert!(matches!(
            command(&RunOptions::default()),
            Err(RunError::NoCommand)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
