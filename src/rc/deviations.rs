//! Deliberate deviations from IBTA, for testing conformance testers (test-only).
//!
//! `ferroce conform`'s own tests must show that each of its checks can fail. They run it
//! against a ferroce peer made non-conformant on purpose, one named break at a time
//! (`ferroce conform --serve --break NAME`, or [`DeviceConfig::deviations`]). Every flag is
//! off by default; the responder and the device consult them at the one decision point each
//! names, so a default device pays one predictable branch there and nothing else.
//! Never set these on a device that talks to anything but a tester.
//!
//! [`DeviceConfig::deviations`]: crate::verbs::DeviceConfig::deviations

/// One flag per deliberate non-conformance (all `false`: a conformant device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deviations {
    /// An R_Key that names no region is not an error: the request is acknowledged and
    /// touches no memory (instead of a remote-access-error NAK; IBTA 9.7.5.1.7, C9-94).
    pub skip_rkey_check: bool,
    /// A duplicate ATOMIC is executed again instead of answered with the saved original
    /// value (IBTA 9.7.5.1.1, C9-112).
    pub dup_atomic_again: bool,
    /// A duplicate READ is answered with an ACK instead of its responses (IBTA 9.7.5.1.1,
    /// C9-110).
    pub dup_read_ack: bool,
    /// A PSN ahead of the expected one is dropped without the PSN-sequence-error NAK
    /// (IBTA 9.7.5.1.1, C9-106).
    pub no_seq_nak: bool,
    /// A SEND with no receive posted is dropped without the RNR NAK (IBTA 9.7.5.1.4).
    pub no_rnr_nak: bool,
    /// A CNP for every CE-marked packet, not at most one per notification interval.
    pub cnp_every_ce: bool,
    /// Packets with a bad ICRC are processed as if it were good (IBTA C9-70 drops them).
    pub accept_bad_icrc: bool,
    /// The opcode sequence is not checked: MIDDLE/LAST without FIRST, FIRST or ONLY inside
    /// a message are taken as they come (IBTA 9.7.5.1.2: invalid-request NAK).
    pub no_opseq_check: bool,
    /// Payload lengths are not checked against the MTU and the packet's place in the
    /// message, nor a READ's length or an ATOMIC's alignment (IBTA 9.7.5.1.5).
    pub no_length_check: bool,
    /// Every ACK advertises zero credits, whatever the receive queue holds (IBTA 9.7.7.2).
    pub zero_credits: bool,
    /// A retry count of 7 means "retry without end" for the local ACK timeout, as Linux
    /// rxe treats it (IBTA 9.7.6.1.3: only an RNR retry count of 7 is infinite; a retry
    /// count of 7 is seven retries, then RETRY_EXC_ERR).
    pub retry_seven_forever: bool,
    /// A READ or ATOMIC beyond `max_dest_rd_atomic` unanswered ones is executed, the oldest
    /// saved resource recycled, as Linux rxe does (IBTA 9.9.3, class C: an invalid-request
    /// NAK for too many RDMA READ or ATOMIC requests).
    pub recycle_rd_atomic: bool,
    /// The requester sends READ/ATOMIC requests without the `max_rd_atomic` bound (IBTA
    /// 9.5, 11.2.4.2: at most max_rd_atomic outstanding, as the responder can take them).
    pub exceed_rd_atomic: bool,
    /// A PSN sequence error NAK acknowledges nothing: the requester resends from the oldest
    /// outstanding PSN, not the NAK's (IBTA 9.7.5.2.3: the requests before the NAK's PSN
    /// are acknowledged by it, the resend starts at its PSN).
    pub nak_resend_from_start: bool,
    /// An ACK completes only the oldest outstanding request, not every one up to its PSN
    /// (IBTA 9.7.6.1: ACKs may be coalesced); the rest are resent after the ACK timeout.
    pub ack_head_only: bool,
    /// A READ response for a later READ completes an earlier READ that has had no
    /// response, its unanswered bytes left unwritten (IBTA 9.7.5.2, 9.7.6.1: a response
    /// beyond an unanswered READ implies the earlier responses were lost, and the requester
    /// sends that READ again).
    pub read_gap_completes: bool,
}

/// The break names `--break` takes, each with what it does.
pub const BREAKS: &[(&str, &str)] = &[
    (
        "skip-rkey-check",
        "ACK requests whose R_Key names no region",
    ),
    ("dup-atomic-again", "execute duplicate ATOMICs again"),
    (
        "dup-read-ack",
        "ACK duplicate READs instead of replaying them",
    ),
    ("no-seq-nak", "no PSN-sequence-error NAK for a gap"),
    ("no-rnr-nak", "no RNR NAK when no receive is posted"),
    ("cnp-every-ce", "a CNP for every CE-marked packet"),
    ("accept-bad-icrc", "process packets with a bad ICRC"),
    ("no-opseq-check", "no opcode sequence check"),
    (
        "no-length-check",
        "no payload length, READ length or ATOMIC alignment check",
    ),
    ("zero-credits", "advertise zero credits in every ACK"),
    (
        "retry-seven-forever",
        "retry_cnt 7 retries timeouts without end (as rxe)",
    ),
    (
        "recycle-rd-atomic",
        "execute READ/ATOMIC beyond max_dest_rd_atomic, recycling the oldest (as rxe)",
    ),
    (
        "exceed-rd-atomic",
        "the requester ignores max_rd_atomic (READ/ATOMIC requests without bound)",
    ),
    (
        "nak-resend-from-start",
        "the requester resends from its oldest PSN after a sequence NAK, not the NAK's",
    ),
    (
        "ack-head-only",
        "an ACK completes only the requester's oldest request, not all up to its PSN",
    ),
    (
        "read-gap-completes",
        "a later READ's response completes an unanswered earlier READ (its bytes unwritten)",
    ),
];

impl Deviations {
    /// Set the break named `name` (one of [`BREAKS`]); `false` if there is none by that name.
    pub fn set(&mut self, name: &str) -> bool {
        let flag = match name {
            "skip-rkey-check" => &mut self.skip_rkey_check,
            "dup-atomic-again" => &mut self.dup_atomic_again,
            "dup-read-ack" => &mut self.dup_read_ack,
            "no-seq-nak" => &mut self.no_seq_nak,
            "no-rnr-nak" => &mut self.no_rnr_nak,
            "cnp-every-ce" => &mut self.cnp_every_ce,
            "accept-bad-icrc" => &mut self.accept_bad_icrc,
            "no-opseq-check" => &mut self.no_opseq_check,
            "no-length-check" => &mut self.no_length_check,
            "zero-credits" => &mut self.zero_credits,
            "retry-seven-forever" => &mut self.retry_seven_forever,
            "recycle-rd-atomic" => &mut self.recycle_rd_atomic,
            "exceed-rd-atomic" => &mut self.exceed_rd_atomic,
            "nak-resend-from-start" => &mut self.nak_resend_from_start,
            "ack-head-only" => &mut self.ack_head_only,
            "read-gap-completes" => &mut self.read_gap_completes,
            _ => return false,
        };
        *flag = true;
        true
    }

    /// Any break set.
    pub fn any(&self) -> bool {
        *self != Deviations::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_break_sets_exactly_one_flag() {
        for (name, _) in BREAKS {
            let mut d = Deviations::default();
            assert!(d.set(name), "{name}");
            assert!(d.any());
            let mut n = 0;
            for (other, _) in BREAKS {
                let mut e = Deviations::default();
                e.set(other);
                n += usize::from(e == d);
            }
            assert_eq!(n, 1, "{name}");
        }
        assert!(!Deviations::default().set("no-such-break"));
    }
}
