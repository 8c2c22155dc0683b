//! glibc's heap trimming, raised above what a tunnel frees at once (the `unsafe` of mallopt(3) is isolated here).
#![allow(unsafe_code)]

/// Free memory a glibc heap keeps at its top before giving it back to the kernel. glibc's
/// default is 128 KiB, raised only after a block of its mmap size is freed, which a tunnel
/// never does: it frees 64 KiB frames one after another. Each such free shrank the heap
/// (`madvise`), and the next frame's buffer faulted its pages back in, one fault per 4 KiB
/// received: a sixth of the receiving end's CPU in bulk transfers. 1 MiB holds the frames one
/// stream has in flight; a process keeps at most that much more per heap (glibc makes one per
/// thread, up to eight per CPU).
pub const TRIM_THRESHOLD: usize = 1 << 20;

/// Whether [`keep_heap_top`] leaves the setting alone: the operator chose a trim threshold in
/// `GLIBC_TUNABLES`, which stands.
pub fn operator_chose(tunables: Option<&str>) -> bool {
    tunables.is_some_and(|t| t.split(':').any(|kv| kv.starts_with("glibc.malloc.trim_threshold=")))
}

/// Set [`TRIM_THRESHOLD`] for this process, unless [`operator_chose`] one. Call it first in
/// `main`, before any thread starts. `Some(granted)`: set; `None`: left alone (the operator's
/// choice, or not glibc).
pub fn keep_heap_top() -> Option<bool> {
    if operator_chose(std::env::var("GLIBC_TUNABLES").ok().as_deref()) {
        return None;
    }
    set_trim_threshold()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_trim_threshold() -> Option<bool> {
    let value = libc::c_int::try_from(TRIM_THRESHOLD).ok()?;
    // SAFETY: mallopt(3) takes two integers and only changes a parameter of glibc's allocator,
    // under the allocator's own lock; no memory of ours is passed or shared. It returns 1 on
    // success and 0 for a parameter or value it rejects.
    Some(unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, value) } == 1)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_trim_threshold() -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_threshold_stands_and_others_do_not_count() {
        assert!(operator_chose(Some("glibc.malloc.trim_threshold=4096")));
        assert!(operator_chose(Some("glibc.cpu.x86_rep_movsb_threshold=1048576:glibc.malloc.trim_threshold=0")));
        assert!(!operator_chose(Some("glibc.cpu.x86_rep_movsb_threshold=1048576")));
        assert!(!operator_chose(Some("glibc.malloc.mmap_threshold=1048576")));
        assert!(!operator_chose(None));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_the_threshold() {
        assert_eq!(set_trim_threshold(), Some(true));
    }
}
