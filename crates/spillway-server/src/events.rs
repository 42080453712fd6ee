//! What the ways in report to the metrics: value types both sides know.
//! Not a way in: ways in and metrics import it; it imports neither.

/// What one descriptor adds to its limit's hit counters, counted as
/// envoyproxy/ratelimit counts them: in hits (a call's `hits_addend`), not
/// calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Hits {
    /// Every hit on the limit.
    pub total: u64,
    /// Hits over the limit (shadow limits' included).
    pub over_limit: u64,
    /// Hits within the limit past its near-limit share.
    pub near_limit: u64,
    /// Hits within the limit.
    pub within_limit: u64,
    /// Hits over a shadow limit (answered OK).
    pub shadow_mode: u64,
}
