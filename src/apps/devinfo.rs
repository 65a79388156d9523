//! `ferroce devinfo`: ferroce's devices in the shape of `ibv_devinfo` (rdma-core), one per
//! network interface, named `ferroce_<interface>` (`-d` takes that name or the interface's).
//!
//! The output keeps `ibv_devinfo`'s fields, order, indentation and tab alignment (checked
//! against Linux rxe's output in `tests/fixtures/ibv_devinfo/`); the port state comes from
//! the interface's kernel flags as a RoCE driver derives it (`PORT_ACTIVE` only when the
//! interface is up and has a carrier). ferroce adds, after the port's fields, the GID table
//! (which `ibv_devinfo` prints only with `-v`), the interface and the live counters of
//! `ferroce perf` processes using it.

use crate::io::netdev::{self, Netdev};
use crate::verbs::gid_of;
use crate::wire::MacAddr;
use std::fmt::Write as _;
use std::io::Write;
use std::net::Ipv6Addr;

/// What to print.
#[derive(Clone, Debug, Default)]
pub struct DevinfoOptions {
    /// Only this device: `ferroce_<interface>` or the interface name.
    pub dev: Option<String>,
    /// More port attributes (`ibv_devinfo -v`).
    pub verbose: bool,
    /// Only the device names (`ibv_devinfo -l`).
    pub list: bool,
}

/// The prefix of every ferroce device name.
pub const HCA_PREFIX: &str = "ferroce_";

/// The device name (`hca_id`) of an interface.
pub fn hca_id(ifname: &str) -> String {
    format!("{HCA_PREFIX}{ifname}")
}

/// The logical and physical port state `ibv_devinfo` prints, from the interface's flags.
pub use crate::io::netdev::{PortRate, PortState};

/// The interface's state in words, for the `netdev:` line.
fn link_words(flags: u32) -> &'static str {
    if flags & libc::IFF_UP as u32 == 0 {
        "down"
    } else if flags & libc::IFF_RUNNING as u32 == 0 {
        "up, no carrier"
    } else {
        "up"
    }
}

/// Why `ferroce devinfo` failed.
#[derive(Debug, thiserror::Error)]
pub enum DevinfoError {
    /// `-d` names no device.
    #[error("no device named {0:?} (ferroce's devices are {HCA_PREFIX}<interface>, or give the interface; `ferroce devinfo -l` lists them)")]
    NoDevice(String),
    /// Standard output failed.
    #[error("{0}")]
    Write(#[from] std::io::Error),
}

/// Find a device by `ferroce_<interface>` or by the interface name.
pub fn find(name: &str) -> Result<Netdev, DevinfoError> {
    let candidates = [name.strip_prefix(HCA_PREFIX), Some(name)];
    for ifname in candidates.into_iter().flatten() {
        if ifname.is_empty() {
            continue;
        }
        if let Ok(d) = netdev::netdev(ifname) {
            return Ok(d);
        }
    }
    Err(DevinfoError::NoDevice(name.to_string()))
}

/// One `key:` followed by tabs up to `column` (as ibv_devinfo aligns: column 32 for the
/// device's fields, 24 for the port's, after the indentation), then the value.
fn field(s: &mut String, indent: usize, column: usize, key: &str, value: impl std::fmt::Display) {
    let key = format!("{key}:");
    let mut col = key.len();
    let mut tabs = 0;
    while col < column || tabs == 0 {
        col = (col / 8 + 1) * 8;
        tabs += 1;
    }
    let _ = writeln!(
        s,
        "{}{key}{}{value}",
        "\t".repeat(indent),
        "\t".repeat(tabs)
    );
}

/// The EUI-64 node GUID of a MAC address, as Linux derives it, in ibv_devinfo's format.
pub fn node_guid(m: &MacAddr) -> String {
    let b = m.eui64();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// `ibv_devinfo -v`'s device attributes: the limits a ferroce device on `d` enforces
/// ([`crate::verbs::Device::query_device`]), in ibv_devinfo's order and format; what ferroce
/// has none of (EE contexts, memory windows, multicast, FMRs) reads 0 as on any device
/// without it.
fn device_limits(s: &mut String, d: &Netdev) {
    let ip = d
        .gids
        .first()
        .copied()
        .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
    let l = crate::verbs::DeviceConfig::new(d.mac, ip).limits();
    let dev = |s: &mut String, k: &str, v: &dyn std::fmt::Display| field(s, 1, 32, k, v);
    dev(s, "max_mr_size", &format!("{:#x}", l.max_mr_size));
    dev(s, "page_size_cap", &"0xfffff000");
    dev(s, "max_qp", &l.max_qp);
    dev(s, "max_qp_wr", &l.max_qp_wr);
    dev(
        s,
        "device_cap_flags",
        &format!("0x{:08x}", l.device_cap_flags),
    );
    for (bit, name) in crate::verbs::limits::DEVICE_CAP_NAMES {
        if l.device_cap_flags & bit != 0 {
            let _ = writeln!(s, "\t\t\t\t\t{name}");
        }
    }
    dev(s, "max_sge", &l.max_sge);
    dev(s, "max_sge_rd", &l.max_sge_rd);
    dev(s, "max_cq", &l.max_cq);
    dev(s, "max_cqe", &l.max_cqe);
    dev(s, "max_mr", &l.max_mr);
    dev(s, "max_pd", &l.max_pd);
    dev(s, "max_qp_rd_atom", &l.max_qp_rd_atom);
    dev(s, "max_ee_rd_atom", &0);
    dev(s, "max_res_rd_atom", &l.max_res_rd_atom);
    dev(s, "max_qp_init_rd_atom", &l.max_qp_init_rd_atom);
    dev(s, "max_ee_init_rd_atom", &0);
    dev(s, "atomic_cap", &"ATOMIC_HCA (1)");
    for k in ["max_ee", "max_rdd"] {
        dev(s, k, &0);
    }
    dev(s, "max_mw", &l.max_mw);
    for k in [
        "max_raw_ipv6_qp",
        "max_raw_ethy_qp",
        "max_mcast_grp",
        "max_mcast_qp_attach",
        "max_total_mcast_qp_attach",
    ] {
        dev(s, k, &0);
    }
    dev(s, "max_ah", &l.max_ah);
    dev(s, "max_fmr", &0);
    dev(s, "max_srq", &l.max_srq);
    dev(s, "max_srq_wr", &l.max_srq_wr);
    dev(s, "max_srq_sge", &l.max_srq_sge);
    dev(s, "max_pkeys", &l.max_pkeys);
    dev(s, "local_ca_ack_delay", &15);
}

/// The `ibv_devinfo` block of one device (without the live counters), ending with the port's
/// fields, the GID table and the interface line.
pub fn device_block(
    d: &Netdev,
    state: PortState,
    rate: PortRate,
    flags: u32,
    verbose: bool,
) -> String {
    let mut s = String::new();
    let guid = node_guid(&d.mac);
    let _ = writeln!(s, "hca_id:\t{}", hca_id(&d.name));
    let dev = |s: &mut String, k: &str, v: &dyn std::fmt::Display| field(s, 1, 32, k, v);
    dev(&mut s, "transport", &"InfiniBand (0)");
    dev(&mut s, "fw_ver", &env!("CARGO_PKG_VERSION"));
    dev(&mut s, "node_guid", &guid);
    dev(&mut s, "sys_image_guid", &guid);
    dev(&mut s, "vendor_id", &"0x0000");
    dev(&mut s, "vendor_part_id", &0);
    dev(&mut s, "hw_ver", &"0x0");
    dev(&mut s, "phys_port_cnt", &1);
    if verbose {
        device_limits(&mut s, d);
    }
    let _ = writeln!(s, "\t\tport:\t1");
    let mtu = d.mtu.unwrap_or(1500);
    let active = netdev::ib_mtu_for(mtu);
    let port = |s: &mut String, k: &str, v: &dyn std::fmt::Display| field(s, 3, 24, k, v);
    port(&mut s, "state", &state.as_ibv());
    port(&mut s, "max_mtu", &"4096 (5)");
    port(
        &mut s,
        "active_mtu",
        &format!("{} ({})", active.bytes(), active.to_ibv()),
    );
    port(&mut s, "sm_lid", &0);
    port(&mut s, "port_lid", &0);
    port(&mut s, "port_lmc", &"0x00");
    port(&mut s, "link_layer", &"Ethernet");
    if verbose {
        port(&mut s, "gid_tbl_len", &d.gids.len());
        port(&mut s, "active_width", &rate.width_str());
        port(&mut s, "active_speed", &rate.speed_str());
        port(&mut s, "phys_state", &state.phys_state());
    }
    for (i, g) in d.gids.iter().enumerate() {
        port(
            &mut s,
            &format!("GID[{i:3}]"),
            &format!("{}, RoCE v2", Ipv6Addr::from(gid_of(*g))),
        );
    }
    port(
        &mut s,
        "netdev",
        &format!("{} (mtu {mtu}, {}, {})", d.name, d.mac, link_words(flags)),
    );
    s
}

/// Run `ferroce devinfo`.
pub fn run(o: &DevinfoOptions, out: &mut dyn Write) -> Result<(), DevinfoError> {
    let devs: Vec<Netdev> = match &o.dev {
        Some(n) => vec![find(n)?],
        None => netdev::netdevs(),
    };
    let w = |out: &mut dyn Write, s: &str| out.write_all(s.as_bytes()).map_err(DevinfoError::from);
    if o.list {
        let mut s = format!(
            "{} HCA{} found:\n",
            devs.len(),
            if devs.len() == 1 { "" } else { "s" }
        );
        for d in &devs {
            let _ = writeln!(s, "\t{}", hca_id(&d.name));
        }
        return w(out, &s);
    }
    for d in devs {
        let flags = netdev::if_flags(&d.name).unwrap_or(0);
        let rate = netdev::port_rate(&d.name);
        let mut s = device_block(&d, PortState::from_if_flags(flags), rate, flags, o.verbose);
        s.push_str(&crate::apps::tool::live_counter_lines(&d.name));
        s.push('\n');
        w(out, &s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and the whitespace around it of each line: `(leading tabs, key, tabs after)`.
    fn shape(text: &str) -> Vec<(usize, String, usize)> {
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let lead = l.len() - l.trim_start_matches('\t').len();
                let rest = &l[lead..];
                let (key, after) = rest.split_once(':').unwrap_or((rest, ""));
                let tabs = after.len() - after.trim_start_matches('\t').len();
                (lead, key.to_string(), tabs)
            })
            .collect()
    }

    fn dev(flags: u32) -> (Netdev, u32) {
        let d = Netdev {
            name: "eth0".into(),
            index: 2,
            mac: MacAddr([0x52, 0x54, 0x00, 0x77, 0x00, 0x0e]),
            mtu: Some(1500),
            gids: netdev::gid_order(&[
                "10.77.0.14".parse().unwrap(),
                "fe80::5054:ff:fe77:e".parse().unwrap(),
            ]),
        };
        (d, flags)
    }

    const UP: u32 = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
    /// The fixtures' rate: the guest's virtio NIC reports no speed.
    const SDR_1X: PortRate = PortRate { width: 1, speed: 1 };

    #[test]
    fn same_fields_order_and_alignment_as_rxe() {
        // rxe's ibv_devinfo for a port on eth0 (MTU 1500, EUI-64 GUID of 52:54:00:77:00:0e).
        let rxe = include_str!("../../tests/fixtures/ibv_devinfo/rxe-active.txt");
        let (d, f) = dev(UP);
        let ours = device_block(&d, PortState::from_if_flags(f), SDR_1X, f, false);
        let n = shape(rxe).len();
        assert_eq!(shape(&ours)[..n], shape(rxe)[..], "{ours}");
        // The values that mean the same thing are the same.
        for l in [
            "\ttransport:\t\t\tInfiniBand (0)",
            "\tnode_guid:\t\t\t5054:00ff:fe77:000e",
            "\tsys_image_guid:\t\t\t5054:00ff:fe77:000e",
            "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            "\t\t\tactive_mtu:\t\t1024 (3)",
            "\t\t\tlink_layer:\t\tEthernet",
        ] {
            assert!(rxe.lines().any(|r| r == l), "{l:?} not in the fixture");
            assert!(ours.lines().any(|r| r == l), "{l:?} not in\n{ours}");
        }
    }

    #[test]
    fn verbose_port_fields_and_gids_as_rxe_prints_them() {
        let rxe = include_str!("../../tests/fixtures/ibv_devinfo/rxe-verbose.txt");
        let (d, f) = dev(UP);
        let ours = device_block(&d, PortState::Active, SDR_1X, f, true);
        // GID lines in rxe's format (the GID as an IPv6 address), in the kernel's order.
        for l in [
            "\t\t\tGID[  0]:\t\tfe80::5054:ff:fe77:e, RoCE v2",
            "\t\t\tGID[  1]:\t\t::ffff:10.77.0.14, RoCE v2",
            "\t\t\tphys_state:\t\tLINK_UP (5)",
            "\t\t\tactive_width:\t\t1X (1)",
            "\t\t\tactive_speed:\t\t2.5 Gbps (1)",
        ] {
            assert!(rxe.lines().any(|r| r == l), "{l:?} not in the fixture");
            assert!(ours.lines().any(|r| r == l), "{l:?} not in\n{ours}");
        }
        // Every device field we print with -v appears in rxe's -v output in the same order
        // with the same alignment, and so does every port field.
        let theirs = shape(rxe);
        let mut at = 0;
        let dev_fields: Vec<_> = shape(&ours).into_iter().filter(|f| f.0 == 1).collect();
        assert!(dev_fields.iter().any(|f| f.1 == "max_srq_sge"), "{ours}");
        for f in dev_fields {
            let k = theirs[at..]
                .iter()
                .position(|t| t.0 == 1 && t.1 == f.1)
                .unwrap_or_else(|| panic!("{f:?} not (in this order) in rxe's -v output"));
            assert_eq!(theirs[at + k].2, f.2, "{f:?}");
            at += k + 1;
        }
        assert!(ours.contains("\n\t\t\t\t\tRC_RNR_NAK_GEN\n"), "{ours}");
        assert!(rxe.contains("\n\t\t\t\t\tRC_RNR_NAK_GEN\n"));
        let mut at = 0;
        for f in shape(&ours)
            .into_iter()
            .filter(|f| f.0 == 3 && f.1 != "netdev")
        {
            let k = theirs[at..]
                .iter()
                .position(|t| {
                    t.0 == 3 && (t.1 == f.1 || (t.1.starts_with("GID[") && f.1.starts_with("GID[")))
                })
                .unwrap_or_else(|| panic!("{f:?} not (in this order) in rxe's -v output"));
            assert_eq!(theirs[at + k].2, f.2, "{f:?}");
            at += k + 1;
        }
    }

    #[test]
    fn a_down_interface_is_a_down_port() {
        let rxe_down = include_str!("../../tests/fixtures/ibv_devinfo/rxe-port-down.txt");
        for flags in [
            0,
            libc::IFF_UP as u32,
            libc::IFF_RUNNING as u32,
            (libc::IFF_UP | libc::IFF_LOWER_UP) as u32,
        ] {
            let (d, f) = dev(flags);
            let ours = device_block(&d, PortState::from_if_flags(f), SDR_1X, f, true);
            let line = "\t\t\tstate:\t\t\tPORT_DOWN (1)";
            assert!(rxe_down.lines().any(|r| r == line));
            assert!(ours.lines().any(|r| r == line), "{flags:#x}: {ours}");
            // rxe_query_port: POLLING while the interface is up without its link, DISABLED
            // when it is down (rxe in the tools/rxe-peer guest, `ip link set eth0 down`:
            // DISABLED (3)).
            let phys = if flags & libc::IFF_UP as u32 != 0 {
                "phys_state:\t\tPOLLING (2)"
            } else {
                "phys_state:\t\tDISABLED (3)"
            };
            assert!(ours.contains(phys), "{flags:#x}: {ours}");
        }
        assert_eq!(PortState::from_if_flags(UP), PortState::Active);
    }

    #[test]
    fn names_are_the_hca_id_or_the_interface() {
        assert_eq!(hca_id("eth0"), "ferroce_eth0");
        let lo = find("lo").unwrap();
        assert_eq!(find(&hca_id("lo")).unwrap().name, lo.name);
        let e = find("ferroce_nosuch0").unwrap_err().to_string();
        assert!(e.contains("no device named \"ferroce_nosuch0\""), "{e}");
        assert!(find("ferroce_").is_err());
    }
}
