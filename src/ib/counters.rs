//! Counters in the spirit of rxe's `hw_counters` and `rdma stat`.

use serde::Serialize;

/// Per-QP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QpCounters {
    /// Packets sent (every kind: requests, responses, CNPs).
    pub tx_packets: u64,
    /// Payload bytes sent.
    pub tx_bytes: u64,
    /// Packets received for this QP.
    pub rx_packets: u64,
    /// Payload bytes received.
    pub rx_bytes: u64,
    /// Packets sent again by go-back-N (timeouts, sequence-error NAKs, RNR retries).
    pub retransmits: u64,
    /// Local ACK timeouts that led to a retry or to RETRY_EXC_ERR.
    pub timeouts: u64,
    /// Fast recovery's probes: go-back-N resends after a probe timeout, before the local
    /// ACK timeout (`DeviceConfig::fast_recovery`).
    pub probes: u64,
    /// Selective repeat: single packets resent for a sequence-error NAK.
    pub sr_resends: u64,
    /// Selective repeat: request packets kept ahead of the expected PSN.
    pub reordered_kept: u64,
    /// PSN-sequence-error NAKs sent (one per gap).
    pub seq_naks_sent: u64,
    /// PSN-sequence-error NAKs received.
    pub seq_naks_rcvd: u64,
    /// RNR NAKs sent (no receive WQE).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// RNR NAKs received while an RNR wait was already running, not acted on.
    pub rnr_naks_ignored: u64,
    /// Other NAKs (invalid request, remote access, remote operational) sent.
    pub err_naks_sent: u64,
    /// Other NAKs received.
    pub err_naks_rcvd: u64,
    /// Duplicate requests received (re-ACKed or replayed, never re-executed).
    pub duplicates: u64,
    /// Duplicate or stale responses received and ignored.
    pub dup_responses: u64,
    /// ACKs for PSNs never sent, dropped.
    pub ghost_acks: u64,
    /// Requests received out of sequence and dropped.
    pub out_of_sequence: u64,
    /// Packets dropped because the QP state does not accept them.
    pub state_drops: u64,
    /// READ responses that were replayed for duplicate READ requests.
    pub read_replays: u64,
    /// Duplicate READs refused: their R_Key, rights or bounds no longer hold (a forged or a
    /// stale retry, or the region deregistered or invalidated since).
    pub dup_refused: u64,
    /// READ responses and WRITE packets stopped because their region was deregistered or
    /// invalidated after the request was accepted.
    pub mr_gone: u64,
    /// ATOMIC results replayed for duplicate ATOMIC requests.
    pub atomic_replays: u64,
    /// Requests not taken because the response queue had no room for their answer
    /// (back-pressure: nothing executed, the requester's retry brings them back).
    pub resp_full_drops: u64,
    /// Responses lost because the response queue was full after all (none expected: requests
    /// are only taken with room for their answers).
    pub resp_queue_drops: u64,
    /// ACK packets sent (positive and NAK).
    pub acks_sent: u64,
    /// Positive ACKs received.
    pub acks_rcvd: u64,
    /// Send completions made (signaled, or with an error).
    pub send_completions: u64,
    /// Receive completions made.
    pub recv_completions: u64,
    /// CE-marked packets received (ECN).
    pub ce_rcvd: u64,
    /// CNPs this QP sent (as a notification point).
    pub cnps_sent: u64,
    /// CNPs this QP handled (as a reaction point).
    pub cnps_handled: u64,
    /// UD: packets dropped because their Q_Key is not the QP's (IBTA C10-23).
    pub qkey_drops: u64,
    /// UD and UC: messages dropped because no receive WQE was there to take them (the
    /// unreliable services have no RNR NAK).
    pub no_wqe_drops: u64,
    /// UC and UD: messages dropped silently for any other reason (UC: the message in progress
    /// abandoned at a PSN gap, an opcode out of sequence, a bad length, R_Key or right; UD: a
    /// message longer than its receive buffer). Never delivered in part.
    pub msg_drops: u64,
    /// XRC: packets of the direction the QP's half does not take (requests at an initiator,
    /// responses at a target), dropped.
    pub opcode_drops: u64,
}

/// `named()` (every field with its name, in declaration order) for a struct of `u64`
/// counters, and for [`QpCounters`] also `accumulate` over the same list.
macro_rules! counter_fields {
    ($t:ty { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Every counter with its field name, in declaration order (for `ferroce stat`).
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f)),*]
            }
        }
    };
}
pub(crate) use counter_fields;

macro_rules! qp_counters {
    ($($f:ident),* $(,)?) => {
        counter_fields!(QpCounters { $($f),* });
        impl QpCounters {
            /// Add `o` into `self` (for device totals).
            pub fn accumulate(&mut self, o: &QpCounters) {
                $( self.$f += o.$f; )*
            }
        }
    };
}

qp_counters!(
    tx_packets,
    tx_bytes,
    rx_packets,
    rx_bytes,
    retransmits,
    timeouts,
    probes,
    sr_resends,
    reordered_kept,
    seq_naks_sent,
    seq_naks_rcvd,
    rnr_naks_sent,
    rnr_naks_rcvd,
    rnr_naks_ignored,
    err_naks_sent,
    err_naks_rcvd,
    duplicates,
    dup_responses,
    ghost_acks,
    out_of_sequence,
    state_drops,
    read_replays,
    dup_refused,
    mr_gone,
    atomic_replays,
    resp_full_drops,
    resp_queue_drops,
    acks_sent,
    acks_rcvd,
    send_completions,
    recv_completions,
    ce_rcvd,
    cnps_sent,
    cnps_handled,
    qkey_drops,
    no_wqe_drops,
    msg_drops,
    opcode_drops,
);

counter_fields!(DeviceCounters {
    rx_frames,
    tx_frames,
    icrc_drops,
    malformed_drops,
    not_roce,
    unknown_qp_drops,
    address_drops,
    header_drops,
    cnps_rcvd,
    cq_overruns,
});

/// Per-device counters: the receive path's drops before a packet reaches a QP, plus totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceCounters {
    /// Frames received.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames dropped for a bad ICRC.
    pub icrc_drops: u64,
    /// Frames on UDP 4791 that did not parse (truncated, bad lengths, unknown opcode...).
    pub malformed_drops: u64,
    /// Frames that are not RoCE v2 at all.
    pub not_roce: u64,
    /// RoCE frames for a QPN that does not exist.
    pub unknown_qp_drops: u64,
    /// Frames not addressed to this device, or from an address other than the QP's peer.
    pub address_drops: u64,
    /// P_Key mismatch, TVer not 0, or an opcode of another transport.
    pub header_drops: u64,
    /// CNPs received.
    pub cnps_rcvd: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_lists_every_counter() {
        // Every field is a u64: the lists behind `named` and `accumulate` miss none.
        let n = std::mem::size_of::<QpCounters>() / 8;
        assert_eq!(QpCounters::default().named().len(), n);
        let d = std::mem::size_of::<DeviceCounters>() / 8;
        assert_eq!(DeviceCounters::default().named().len(), d);
        let q = QpCounters {
            opcode_drops: 3,
            ..Default::default()
        };
        let mut t = q;
        t.accumulate(&q);
        assert_eq!(t.named().last(), Some(&("opcode_drops", 6)));
    }
}
