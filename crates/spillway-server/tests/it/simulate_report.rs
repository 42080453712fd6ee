//! Placeholder: the simulate report in headless Chromium.
