//! Client IP addresses as text: formatted without allocating, and in one
//! spelling per address for keys.

/// An IP address as text, formatted on the stack without allocating (at
/// most 45 bytes: an IPv4-mapped IPv6 address written out).
#[derive(Debug, Clone, Copy)]
pub struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl IpText {
    /// Formats `ip` as `Display` does (RFC 5952 for IPv6).
    pub fn new(ip: std::net::IpAddr) -> IpText {
        use std::io::Write as _;
        let mut buf = [0u8; 48];
        let len = match ip {
            // The common case, without the formatting machinery (it
            // showed in the proxy's profile).
            std::net::IpAddr::V4(v4) => {
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        buf[len] = b'.';
                        len += 1;
                    }
                    let digits = 1 + usize::from(octet >= 10) + usize::from(octet >= 100);
                    let mut n = octet;
                    for d in (0..digits).rev() {
                        buf[len + d] = b'0' + n % 10;
                        n /= 10;
                    }
                    len += digits;
                }
                len
            }
            std::net::IpAddr::V6(_) => {
                let mut w = &mut buf[..];
                let _ = write!(w, "{ip}");
                48 - w.len()
            }
        };
        IpText { buf, len }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

/// A client IP as it counts in a key: one key per address. An IPv6
/// address has many spellings (`2001:DB8::1`, `2001:db8:0:0::1`,
/// `::ffff:192.0.2.1` for an IPv4 client), and a client whose address
/// reaches a way in as text must not get a fresh counter by spelling it
/// differently. IPv6 addresses become their RFC 5952 form (an IPv4-mapped
/// one its IPv4 form); IPv4 addresses parse only in their one form;
/// anything else is kept as it is, an opaque client id. Borrows (and allocates
/// nothing) unless it rewrites.
///
/// ```
/// assert_eq!(spillway_core::canonical_ip("2001:DB8:0::7"), "2001:db8::7");
/// assert_eq!(spillway_core::canonical_ip("::ffff:192.0.2.1"), "192.0.2.1");
/// assert_eq!(spillway_core::canonical_ip("client-7"), "client-7");
/// ```
pub fn canonical_ip(ip: &str) -> std::borrow::Cow<'_, str> {
    if ip.contains(':')
        && let Ok(v6) = ip.parse::<std::net::Ipv6Addr>()
    {
        // Compared on the stack: the usual address is already in its one
        // form, and an allocation per request would be for nothing.
        let canonical = IpText::new(v6.to_canonical());
        if canonical.as_str() != ip {
            return canonical.as_str().to_string().into();
        }
    }
    ip.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ip_address_has_one_key() {
        for (given, key) in [
            ("2001:DB8::1", "2001:db8::1"),
            ("2001:db8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:0db8::0001", "2001:db8::1"),
            ("::ffff:192.0.2.1", "192.0.2.1"),
            ("::1", "::1"),
            ("192.0.2.1", "192.0.2.1"),
            ("client-7", "client-7"),
            ("10.0.12345", "10.0.12345"),
            ("fe80::1%eth0", "fe80::1%eth0"),
        ] {
            assert_eq!(canonical_ip(given), key, "{given}");
        }
        assert!(matches!(
            canonical_ip("2001:db8::1"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn ip_text_holds_the_longest_addresses() {
        for ip in [
            "255.255.255.255",
            "0.0.0.0",
            "10.9.100.99",
            "127.0.0.1",
            "1.20.199.200",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
            "::1",
        ] {
            let parsed: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(parsed).as_str(), parsed.to_string());
        }
    }
}
