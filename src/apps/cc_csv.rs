//! The congestion-control time series `ferroce perf --cc-csv` writes and `ferroce cc-plot`
//! reads: one header line, then one row per QP per sample.

/// The header line (without the newline).
pub const HEADER: &str = "t_unix_s,qpn,rate_bps,alpha,cnps_handled,ce_rcvd";

/// One row (without the newline): the sample time in seconds since the Unix epoch, the QP
/// number, the controller's rate (b/s), its α if it has one (empty otherwise), the CNPs it
/// handled and the CE-marked packets the QP received.
pub fn row(
    t_unix_s: f64,
    qpn: u32,
    rate_bps: u64,
    alpha: Option<f64>,
    cnps: u64,
    ce: u64,
) -> String {
    format!(
        "{t_unix_s:.6},{qpn:#08x},{rate_bps},{},{cnps},{ce}",
        alpha.map(|a| format!("{a:.6}")).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_the_header_s_columns() {
        assert_eq!(
            row(1.5, 0x11, 25_000_000_000, Some(0.5), 3, 7),
            "1.500000,0x000011,25000000000,0.500000,3,7"
        );
        assert_eq!(
            row(2.0, 0xabcdef, 0, None, 0, 0),
            "2.000000,0xabcdef,0,,0,0"
        );
        assert_eq!(
            HEADER.split(',').count(),
            row(0.0, 1, 1, None, 1, 1).split(',').count()
        );
    }
}
