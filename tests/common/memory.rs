//! A process's resident memory from `/proc`, for the tests and benches that bound it.

/// `VmHWM:` (the peak) or `VmRSS:` (now) of a process, in bytes.
pub fn resident(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kb * 1024
}

/// Resets a process's `VmHWM` to its current RSS (`echo 5 > clear_refs`); false if refused.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Bytes as whole MiB, for a report.
pub fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}
