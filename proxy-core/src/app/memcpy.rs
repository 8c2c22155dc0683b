//! Startup advice on glibc's large-copy routine, whose `rep movsb` path has a cliff on AMD Zen CPUs.
//!
//! glibc 2.36 (Debian 12, the image's base) copies blocks of 8 KiB and more with `rep movsb`. On
//! AMD Zen (measured on Zen 4) that runs about 30 times slower when the destination lies 1 to 15
//! bytes past the source modulo 4 KiB. rustls copies each received 16 KiB record out of its read
//! buffer into a fresh allocation, which glibc's allocator often places 11 bytes past the payload
//! modulo 4 KiB, and then record after record: up to a fifth of the tunnel's CPU. The tunable
//! below keeps glibc on its vector loop under 1 MiB. The image sets it; this says so at startup
//! when a process on such a CPU runs without it (a systemd unit, another image).

/// The tunable that avoids the cliff, as it goes into `GLIBC_TUNABLES`.
pub const TUNABLE: &str = "glibc.cpu.x86_rep_movsb_threshold=1048576";

/// The advice for a process with `tunables` (its `GLIBC_TUNABLES`) on a CPU described by
/// `cpuinfo` (`/proc/cpuinfo`), or `None` when it does not apply: another vendor, no fast
/// string moves, or a threshold already chosen by the operator.
pub fn advice(tunables: Option<&str>, cpuinfo: &str) -> Option<String> {
    if tunables.is_some_and(|t| t.contains("x86_rep_movsb_threshold")) {
        return None;
    }
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name).map(|(_, v)| v.trim()))
    };
    if field("vendor_id") != Some("AuthenticAMD") {
        return None;
    }
    let flags = field("flags").unwrap_or_default();
    if !flags.split_whitespace().any(|f| f == "fsrm" || f == "erms") {
        return None;
    }
    Some(format!(
        "this AMD CPU copies 8 KiB blocks slowly through glibc's rep movsb when source and destination nearly alias \
         modulo 4 KiB, which TLS record copies hit; start the process with GLIBC_TUNABLES={TUNABLE} \
         (the seedgate image sets it) for up to a fifth less CPU per tunnelled byte"
    ))
}

/// Log [`advice`] for this process, once, at startup. Only glibc builds on x86-64 Linux read
/// the tunable; elsewhere nothing is logged.
pub fn log_advice() {
    if !cfg!(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64")) {
        return;
    }
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else { return };
    if let Some(msg) = advice(tunables.as_deref(), &cpuinfo) {
        tracing::info!(advice = %msg, "glibc copy routine");
    }
}

#[cfg(test)]
mod tests {
    use super::advice;

    const AMD: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: fpu sse2 avx2 erms fsrm avx512f\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\n";
    const INTEL: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 erms fsrm\n";
    const OLD_AMD: &str = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2\n";

    #[test]
    fn advises_on_amd_with_fast_string_moves_and_no_threshold_set() {
        let msg = advice(None, AMD).expect("advice on this CPU");
        assert!(msg.contains("GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576"), "{msg}");
        // Other tunables set, but not this one: still advised.
        assert!(advice(Some("glibc.malloc.arena_max=2"), AMD).is_some());
    }

    #[test]
    fn silent_when_the_threshold_is_set_or_the_cpu_is_not_affected() {
        assert_eq!(advice(Some(super::TUNABLE), AMD), None);
        assert_eq!(advice(Some("glibc.malloc.arena_max=2:glibc.cpu.x86_rep_movsb_threshold=4096"), AMD), None);
        assert_eq!(advice(None, INTEL), None);
        assert_eq!(advice(None, OLD_AMD), None);
        assert_eq!(advice(None, ""), None);
    }
}
