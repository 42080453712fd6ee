//! Placeholder: the rate limit headers a server sends.
