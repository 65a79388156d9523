//! Placeholder: pcap reading/writing helpers live here.
