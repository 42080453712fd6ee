//! The accept loop at the cap: who is let in, who is closed on arrival.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use super::Budget;

impl Budget {
    /// Whether more are open than the budget carries (those closed to
    /// make room whose tasks have not ended yet).
    pub(crate) fn over_full(&self) -> bool {
        self.open.load(Ordering::SeqCst) > self.max_connections()
    }

    /// Whether a client from `ip`, accepted with the budget full, is
    /// closed at once rather than let in by closing another: its network
    /// holds its fair share already (the budget over the networks
    /// holding connections), and another network holds some. Letting it
    /// in would close one of its own network's connections anyway (see
    /// [`Budget::shed_idle`]); closing it costs
    /// no wait for a task to end, so a flood that reconnects as fast as it
    /// is shed passes through the accept queue at once, and a client
    /// queued behind it is reached in time. A lone network (a gateway
    /// in front) is never refused: room is made among its connections.
    pub(crate) fn refuses(&self, ip: IpAddr) -> bool {
        let net = self.network(ip);
        let table = self.table.lock();
        let mut by_net: HashMap<IpAddr, usize> = HashMap::new();
        for e in table.values() {
            *by_net.entry(e.state.net).or_insert(0) += 1;
        }
        let mine = by_net.get(&net).copied().unwrap_or(0);
        if mine == 0 || by_net.len() < 2 {
            return false;
        }
        mine >= (self.max_connections() / by_net.len()).max(1)
    }
}
