//! Clients as the in-flight limit's fair share names them.

/// A client, as [`Concurrency::acquire_for`](super::Concurrency::acquire_for) names it.
pub type Client = u64;

/// The client `ip` stands for in the fair share: its network (IPv4 `/24`,
/// IPv6 `/64`, as the connection budget groups clients) hashed with
/// `hasher`, so every address of a network is one client. Text that is
/// not an address (a client named otherwise) is hashed as it is.
pub fn client_of(hasher: &impl std::hash::BuildHasher, ip: &str) -> Client {
    match ip.parse::<std::net::IpAddr>() {
        Ok(a) => hasher.hash_one(spillway_wire::budget::network(a, 24, 64)),
        Err(_) => hasher.hash_one(ip),
    }
}
