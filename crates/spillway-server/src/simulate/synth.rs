//! Placeholder: replaced by the synthetic traces.
