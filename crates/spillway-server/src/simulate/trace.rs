//! Placeholder: replaced by the trace readers.
