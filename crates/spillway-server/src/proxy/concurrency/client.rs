//! Clients as the in-flight limit's fair share names them.

use std::hash::BuildHasher;

/// A client, as [`Concurrency::acquire_for`](super::Concurrency::acquire_for) names it.
pub type Client = u64;

/// Names clients by network, as the connection budget groups them
/// (`server.ipv4_prefix`, `server.ipv6_prefix`).
#[derive(Debug)]
pub struct Clients {
    hasher: std::hash::RandomState,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Clients {
    /// Networks of the first `ipv4_prefix` (IPv4) or `ipv6_prefix` (IPv6)
    /// bits.
    pub fn new(ipv4_prefix: u8, ipv6_prefix: u8) -> Clients {
        Clients {
            hasher: std::hash::RandomState::new(),
            ipv4_prefix,
            ipv6_prefix,
        }
    }

    /// The client `ip` stands for: its network hashed, so every address
    /// of a network is one client. Text that is not an address (a client
    /// named otherwise) is hashed as it is.
    pub fn of(&self, ip: &str) -> Client {
        match ip.parse::<std::net::IpAddr>() {
            Ok(a) => self.hasher.hash_one(spillway_wire::budget::network(
                a,
                self.ipv4_prefix,
                self.ipv6_prefix,
            )),
            Err(_) => self.hasher.hash_one(ip),
        }
    }
}
