//! Facts about the running process read from the OS (for reports and benchmarks).

/// Peak resident set size of this process in bytes (`VmHWM` in
/// `/proc/self/status`, the kernel's high-water mark), `None` where that file
/// or field is unavailable (non-Linux systems).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_kib_field(&status, "VmHWM:")
}

/// Current resident set size in bytes (`VmRSS`), `None` where unavailable.
pub fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_kib_field(&status, "VmRSS:")
}

/// Memory the OS says is available for new allocations without swapping
/// (`MemAvailable` in `/proc/meminfo`), `None` where unavailable.
pub fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_kib_field(&info, "MemAvailable:")
}

/// `"VmHWM:\t  123456 kB"` → 123456 × 1024.
fn parse_kib_field(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let mut it = line[field.len()..].split_whitespace();
    let value: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kib_fields() {
        let s = "Name:\thsparity\nVmPeak:\t  2000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_kib_field(s, "VmHWM:"), Some(1234 * 1024));
        assert_eq!(parse_kib_field(s, "VmRSS:"), Some(1000 * 1024));
        assert_eq!(parse_kib_field(s, "VmSwap:"), None);
    }

    #[test]
    fn peak_rss_is_at_least_current_on_linux() {
        if cfg!(target_os = "linux") {
            let peak = peak_rss_bytes().expect("VmHWM on Linux");
            assert!(peak > 0);
            assert!(peak >= current_rss_bytes().unwrap_or(0) / 2);
        }
    }
}
