//! Records the compiler's version for the `spillway_build_info` metric.
//!
//! It runs once: it depends on nothing but this file (a new compiler
//! rebuilds everything, this script included), so builds do not wait on it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SPILLWAY_RUSTC_VERSION={version}");
}
