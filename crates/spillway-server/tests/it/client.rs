//! Placeholder: spillway-client against the real binaries.
