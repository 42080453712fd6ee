//! Clients grouped by network for fairness: an IPv6 client usually holds
//! a whole `/64` (one address costs it nothing more than another), and an
//! IPv4 flood from many addresses usually comes from few `/24`s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Default IPv4 prefix length of a network.
pub(crate) const IPV4_PREFIX: u8 = 24;
/// Default IPv6 prefix length of a network.
pub(crate) const IPV6_PREFIX: u8 = 64;

/// The network of `ip`: its first `v4` (IPv4) or `v6` (IPv6) bits, the
/// rest zero. An IPv4-mapped IPv6 address is read as the IPv4 address it
/// maps (a dual-stack listener sees IPv4 clients so).
pub fn network(ip: IpAddr, v4: u8, v6: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(v4.min(32)))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_are_grouped_by_their_prefix() {
        assert_eq!(network(ip("10.1.2.3"), 24, 64), ip("10.1.2.0"));
        assert_eq!(network(ip("10.1.2.3"), 32, 64), ip("10.1.2.3"));
        assert_eq!(network(ip("10.1.2.3"), 0, 64), ip("0.0.0.0"));
        assert_eq!(
            network(ip("2001:db8:1:2:3:4:5:6"), 24, 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            network(ip("2001:db8:1:2:3:4:5:6"), 24, 128),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(
            network(ip("2001:db8:1:2:3:4:5:6"), 24, 48),
            ip("2001:db8:1::")
        );
        assert_eq!(network(ip("::ffff:10.1.2.3"), 24, 64), ip("10.1.2.0"));
        // Out of range reads as the whole address.
        assert_eq!(network(ip("10.1.2.3"), 99, 200), ip("10.1.2.3"));
    }
}
