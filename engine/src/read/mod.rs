//! The read path: a gather's plan and transfers ([`gather`]), the records
//! already in memory ([`hot`]), each store's read policy and counters
//! ([`reads`]) decided by [`policy`] from the memory [`budget`], the one owner
//! of that memory in the process ([`memory`]) with its per-store record
//! caches ([`cache`]) and the host's rank registry ([`ranks`]), and the pins
//! that keep a snapshot's files for its readers ([`pins`]).

pub(crate) mod blocks;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod gather;
pub(crate) mod hot;
pub(crate) mod memory;
#[allow(
    unsafe_code,
    reason = "takes open file description locks through libc::fcntl; every block has its SAFETY argument"
)]
pub(crate) mod pins;
pub(crate) mod policy;
#[allow(
    unsafe_code,
    reason = "registers ranks with libc::fcntl OFD locks and an atexit handler; every block has its SAFETY argument"
)]
pub(crate) mod ranks;
pub(crate) mod reads;
pub(crate) mod request;
