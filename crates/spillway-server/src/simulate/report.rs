//! Placeholder: replaced by the HTML report.
