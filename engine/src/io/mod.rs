//! The operating system: batched positional transfers (io_uring, or pread
//! where it is unavailable, [`uring`]), every other file operation behind the
//! fault-injection seam ([`fs`], [`fault`]), the process's chunk descriptors
//! ([`fds`]), read-only mappings ([`mmap`]; many small files' at once: [`mapset`]; the CPU cache hint they issue: [`prefetch`]) and the SIGBUS guard that keeps a
//! file shrinking under a mapping an error ([`sigbus`]), gathers' scratch buffers ([`scratch`]), the slabs block
//! reads land in ([`slab`]), the OFD byte-range locks ([`locks`]), and the values each process makes for itself,
//! which `fork()` locks ([`process`]), and the per-thread dictionary copies
//! `zstd_dict` records decode after ([`zprefix`]).

pub mod fault;
#[allow(unsafe_code, reason = "raises the soft RLIMIT_NOFILE through libc; the block has its SAFETY argument")]
pub(crate) mod fds;
pub(crate) mod fs;
#[allow(unsafe_code, reason = "takes OFD locks through libc::fcntl; every block has its SAFETY argument")]
pub(crate) mod locks;
#[allow(
    unsafe_code,
    reason = "reads many files' mappings through addresses kept beside their owners; the invariant is argued at the unsafe call"
)]
pub(crate) mod mapset;
#[allow(
    unsafe_code,
    reason = "memory-maps tables and chunks under the SIGBUS guard; the invariant is argued at the unsafe call"
)]
pub(crate) mod mmap;
#[allow(unsafe_code, reason = "issues the CPU's prefetch instruction; the block has its SAFETY argument")]
pub(crate) mod prefetch;
#[allow(
    unsafe_code,
    reason = "registers an exit handler, trims the heap, reads thread CPU clocks and (in tests) forks; every block has its SAFETY argument"
)]
pub(crate) mod process;
pub(crate) mod scratch;
#[allow(
    unsafe_code,
    reason = "installs the SIGBUS handler and maps zero pages over a faulted mapping; every block has its SAFETY argument"
)]
pub(crate) mod sigbus;
#[allow(
    unsafe_code,
    reason = "allocates aligned buffers and hands them to the cache as shared bytes; every block has its SAFETY argument"
)]
pub(crate) mod slab;
#[allow(unsafe_code, reason = "hands raw buffer pointers to io_uring and pread; every block has its SAFETY argument")]
pub(crate) mod uring;
#[allow(
    unsafe_code,
    reason = "a zstd dictionary digested by reference over a per-thread copy; the block has its SAFETY argument"
)]
pub(crate) mod zprefix;

/// A directory for tests that need a disk file system (not tmpfs, whose
/// pages cannot be evicted): the one holding the test binary, inside the
/// build's target directory wherever `CARGO_TARGET_DIR` put it.
#[cfg(test)]
pub(crate) fn disk_scratch_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("the test binary's directory").to_path_buf()
}
