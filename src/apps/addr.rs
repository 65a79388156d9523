//! The HOST argument of `ferroce perf` and `ferroce pingpong`: an IPv4 or IPv6 address or a
//! host name, checked when the command line is parsed (so that `999.1.1.1` is reported as
//! an invalid address, not as a failed name lookup) and resolved when the test connects.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// A HOST argument that is not an address or a host name, or a name that does not resolve.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// An empty argument.
    #[error("the host is empty")]
    Empty,
    /// Only digits and dots, but not a dotted quad.
    #[error("{0:?} is not a valid IPv4 address (four numbers 0-255 separated by dots)")]
    BadIpv4(String),
    /// `HOST:PORT`.
    #[error("{host:?}: give the port with -p/--port ({port}), not in the host")]
    PortInHost {
        /// The argument.
        host: String,
        /// The port in it.
        port: String,
    },
    /// A colon, but not an IPv6 address.
    #[error("{0:?} is not a valid IPv6 address")]
    BadIpv6(String),
    /// Not a syntactically valid host name.
    #[error("{0:?} is not a valid host name or address")]
    BadName(String),
    /// The name lookup failed.
    #[error("cannot resolve host name {host:?}: {err}")]
    Resolve {
        /// The name.
        host: String,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// The name resolved to nothing.
    #[error("host name {0:?} has no address")]
    NoAddress(String),
}

/// Check a HOST argument without resolving it: an IPv4 address (only digits and dots must be
/// a dotted quad; no `inet_aton` shorthand such as `127.1`), an IPv6 address (anything with a
/// colon; brackets and a `%zone` allowed), or a syntactically valid host name. Returns the
/// argument unchanged; the error says what is wrong in one line.
pub fn check_host(s: &str) -> Result<String, HostError> {
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    if s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return s
            .parse::<Ipv4Addr>()
            .map(|_| s.to_string())
            .map_err(|_| HostError::BadIpv4(s.to_string()));
    }
    if let Some((_, port)) = s.split_once(':').filter(|(h, p)| {
        !h.contains(':')
            && !p.contains(':')
            && !p.is_empty()
            && p.chars().all(|c| c.is_ascii_digit())
    }) {
        return Err(HostError::PortInHost {
            host: s.to_string(),
            port: port.to_string(),
        });
    }
    if s.contains(':') {
        let inner = s
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .unwrap_or(s);
        let addr = inner.split_once('%').map_or(inner, |(a, _)| a);
        return addr
            .parse::<Ipv6Addr>()
            .map(|_| s.to_string())
            .map_err(|_| HostError::BadIpv6(s.to_string()));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let name = s.strip_suffix('.').unwrap_or(s);
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(HostError::BadName(s.to_string()));
    }
    Ok(s.to_string())
}

/// Resolve a HOST argument (see [`check_host`]) and `port` to the first socket address; a
/// name that does not resolve is reported as such.
pub fn resolve_host(host: &str, port: u16) -> Result<SocketAddr, HostError> {
    let host = check_host(host)?;
    let bare = host
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(&host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (bare, port)
        .to_socket_addrs()
        .map_err(|err| HostError::Resolve {
            host: host.clone(),
            err,
        })?
        .next()
        .ok_or(HostError::NoAddress(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_are_accepted() {
        for ok in [
            "10.0.0.1",
            "255.255.255.255",
            "::1",
            "[fe80::1]",
            "fe80::1%eth0",
            "localhost",
            "host-a.example.",
            "rxe_peer",
        ] {
            assert_eq!(check_host(ok).unwrap(), ok, "{ok}");
        }
    }

    #[test]
    fn invalid_addresses_say_so() {
        for (bad, what) in [
            ("999.1.1.1", "not a valid IPv4 address"),
            ("10.0.0", "not a valid IPv4 address"),
            ("127.1", "not a valid IPv4 address"),
            ("1234", "not a valid IPv4 address"),
            ("1.2.3.4.", "not a valid IPv4 address"),
            ("fe80::1::2", "not a valid IPv6 address"),
            ("10.0.0.1:18515", "give the port with -p/--port (18515)"),
            ("a b", "not a valid host name or address"),
            ("-a", "not a valid host name or address"),
            ("a..b", "not a valid host name or address"),
            ("", "empty"),
        ] {
            let e = check_host(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
            let r = resolve_host(bad, 1).unwrap_err().to_string();
            assert!(r.contains(what), "{bad}");
        }
    }

    #[test]
    fn literal_addresses_resolve_without_a_lookup() {
        assert_eq!(
            resolve_host("10.1.2.3", 7).unwrap(),
            "10.1.2.3:7".parse().unwrap()
        );
        assert_eq!(
            resolve_host("[::1]", 7).unwrap(),
            "[::1]:7".parse().unwrap()
        );
    }
}
