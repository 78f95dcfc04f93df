//! CPU cache hints: the one prefetch the mappings ([`crate::io::mmap`],
//! [`crate::io::mapset`]), the SIGBUS guard's flags ([`crate::io::sigbus`])
//! and the record tables issue before they read.

/// Asks the CPU to start loading the cache line holding `at`.
#[inline]
pub(crate) fn prefetch_line<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and never faults
    // (one at an unmapped page is dropped); `at` is a valid reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(std::ptr::from_ref(at).cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
