//! The only place in the crate where `unsafe` is allowed: thin, documented wrappers around
//! the system interfaces the packet backends need (sockets, `setsockopt`, ring `mmap`s,
//! `bpf(2)`, netlink). Everything above this module is safe Rust.
#![allow(unsafe_code)]

pub mod event;
