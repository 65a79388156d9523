//! Captures: reading and writing pcap/pcapng ([`capture`]) and the golden
//! one-packet-per-opcode captures ([`golden`]).

pub mod capture;
pub mod golden;
