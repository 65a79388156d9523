//! Connecting an RC QP: the three `modify_qp` calls every RC application makes (RESET → INIT
//! → RTR → RTS) from the far end's numbers exchanged out of band ([`RemoteQp`]) and the
//! local choices ([`RcParams`]). One copy of the attribute sets: [`RcParams::init_attr`],
//! [`RcParams::rtr_attr`] and [`RcParams::rts_attr`] give each step's attributes and mask
//! for callers that make the calls themselves (to post receives in INIT, or through a runtime);
//! [`Device::connect_rc`] makes all three.

use super::device::{Device, VerbsError};
use crate::ib::{AccessFlags, AddressVector, Mtu, QpAttr, QpAttrMask, QpState};
use crate::wire::{MacAddr, QpNumber};

/// The far end of an RC connection, as exchanged out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// The peer's QP number.
    pub qpn: QpNumber,
    /// The peer's GID (an IPv4-mapped or IPv6 address).
    pub gid: [u8; 16],
    /// The peer's (or the next hop's) MAC address.
    pub mac: MacAddr,
    /// The peer's starting send PSN (our receive PSN).
    pub psn: u32,
}

/// Connection parameters for [`Device::connect_rc`]. The defaults are perftest's:
/// timeout 14 (≈ 67 ms), retry_cnt 7, rnr_retry 7, min_rnr_timer 12 (0.64 ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    /// The path MTU.
    pub mtu: Mtu,
    /// The remote access rights the QP grants.
    pub access: AccessFlags,
    /// The GID to send from.
    pub sgid_index: u8,
    /// Our starting send PSN.
    pub local_psn: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout; 0: none).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
    /// The RNR timer code our RNR NAKs carry.
    pub min_rnr_timer: u8,
    /// READs and ATOMICs we may have outstanding.
    pub max_rd_atomic: u8,
    /// READs and ATOMICs of the peer we keep resources for.
    pub max_dest_rd_atomic: u8,
    /// IP traffic class (DSCP << 2 | ECN) of our packets.
    pub traffic_class: u8,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            mtu: Mtu::M1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sgid_index: 0,
            local_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            traffic_class: 0,
        }
    }
}

impl RcParams {
    /// RESET → INIT: port 1, P_Key index 0, the access rights.
    pub fn init_attr(&self) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
    }

    /// INIT → RTR towards `remote`: the path, the path MTU, the peer's QPN and starting PSN,
    /// the responder's resources and RNR timer.
    pub fn rtr_attr(&self, remote: &RemoteQp) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: self.mtu,
            dest_qp_num: remote.qpn.get(),
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ah_attr: AddressVector {
                dgid: remote.gid,
                sgid_index: self.sgid_index,
                hop_limit: 64,
                traffic_class: self.traffic_class,
                flow_label: 0,
                dmac: Some(remote.mac.0),
            },
            ..QpAttr::default()
        };
        let mask = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        (a, mask)
    }

    /// RTR → RTS: our starting PSN, the local ACK timeout, the retry counts and the READs and
    /// ATOMICs we may have outstanding.
    pub fn rts_attr(&self) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.local_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..QpAttr::default()
        };
        let mask =
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        (a, mask)
    }
}

impl Device {
    /// Move a QP from RESET through INIT and RTR to RTS, connected to `remote`: the three
    /// `modify_qp` calls every RC application makes.
    pub fn connect_rc(
        &mut self,
        qpn: QpNumber,
        remote: &RemoteQp,
        p: &RcParams,
    ) -> Result<(), VerbsError> {
        self.modify_through(qpn, [p.init_attr(), p.rtr_attr(remote), p.rts_attr()])
    }

    /// RESET → INIT → RTR → RTS: the three `modify_qp` calls of a bring-up, in order.
    fn modify_through(
        &mut self,
        qpn: QpNumber,
        steps: [(QpAttr, QpAttrMask); 3],
    ) -> Result<(), VerbsError> {
        for (a, mask) in steps {
            self.modify_qp(qpn, &a, mask)?;
        }
        Ok(())
    }

    /// This end of a QP as a [`RemoteQp`] for the peer.
    pub fn local_end(&self, qpn: QpNumber, sgid_index: usize, psn: u32) -> Option<RemoteQp> {
        Some(RemoteQp {
            qpn,
            gid: self.gid(sgid_index)?,
            mac: self.config().mac,
            psn,
        })
    }
}

/// Connection parameters of a UC QP (RESET → INIT → RTR → RTS towards a [`RemoteQp`]): what
/// `ibv_uc_pingpong` and perftest `-c UC` set. UC has no ACK timeout, retries, RNR timer or
/// READ/atomic resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UcParams {
    /// The path MTU.
    pub mtu: Mtu,
    /// The remote access rights the QP grants (only remote write means anything for UC).
    pub access: AccessFlags,
    /// The GID to send from.
    pub sgid_index: u8,
    /// Our starting send PSN.
    pub local_psn: u32,
    /// IP traffic class (DSCP << 2 | ECN) of our packets.
    pub traffic_class: u8,
}

impl Default for UcParams {
    fn default() -> Self {
        UcParams {
            mtu: Mtu::M1024,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            sgid_index: 0,
            local_psn: 0,
            traffic_class: 0,
        }
    }
}

impl UcParams {
    /// RESET → INIT: port 1, P_Key index 0, the access rights.
    pub fn init_attr(&self) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
    }

    /// INIT → RTR towards `remote`: the path, the path MTU, the peer's QPN and starting PSN.
    pub fn rtr_attr(&self, remote: &RemoteQp) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: self.mtu,
            dest_qp_num: remote.qpn.get(),
            rq_psn: remote.psn,
            ah_attr: AddressVector {
                dgid: remote.gid,
                sgid_index: self.sgid_index,
                hop_limit: 64,
                traffic_class: self.traffic_class,
                flow_label: 0,
                dmac: Some(remote.mac.0),
            },
            ..QpAttr::default()
        };
        (a, M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN)
    }

    /// RTR → RTS: our starting PSN.
    pub fn rts_attr(&self) -> (QpAttr, QpAttrMask) {
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.local_psn,
            ..QpAttr::default()
        };
        (a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }
}

/// The bring-up of a UD QP (RESET → INIT → RTR → RTS): a Q_Key and a starting PSN; there is
/// no peer (each send names its destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdParams {
    /// The QP's Q_Key: received packets must carry it; sends with a controlled Q_Key (most
    /// significant bit set) carry it instead.
    pub qkey: u32,
    /// Our starting send PSN.
    pub local_psn: u32,
}

impl Default for UdParams {
    /// ibv_ud_pingpong's and perftest's Q_Key, 0x11111111.
    fn default() -> Self {
        UdParams {
            qkey: 0x1111_1111,
            local_psn: 0,
        }
    }
}

impl UdParams {
    /// RESET → INIT: P_Key index 0, port 1, the Q_Key.
    pub fn init_attr(&self) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: self.qkey,
            ..QpAttr::default()
        };
        (a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
    }

    /// INIT → RTR: nothing more is needed.
    pub fn rtr_attr(&self) -> (QpAttr, QpAttrMask) {
        let a = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        (a, QpAttrMask::STATE)
    }

    /// RTR → RTS: our starting PSN.
    pub fn rts_attr(&self) -> (QpAttr, QpAttrMask) {
        let a = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.local_psn,
            ..QpAttr::default()
        };
        (a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }
}

impl Device {
    /// Move a UC QP from RESET through INIT and RTR to RTS, connected to `remote`.
    pub fn connect_uc(
        &mut self,
        qpn: QpNumber,
        remote: &RemoteQp,
        p: &UcParams,
    ) -> Result<(), VerbsError> {
        self.modify_through(qpn, [p.init_attr(), p.rtr_attr(remote), p.rts_attr()])
    }

    /// Move a UD QP from RESET through INIT and RTR to RTS.
    pub fn bring_up_ud(&mut self, qpn: QpNumber, p: &UdParams) -> Result<(), VerbsError> {
        self.modify_through(qpn, [p.init_attr(), p.rtr_attr(), p.rts_attr()])
    }
}
