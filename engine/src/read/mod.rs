//! The read path: a gather's request ([`request`]), its plan and transfers
//! ([`gather`]), the records it reads ([`item`]), those already in memory
//! ([`hot`]), and mode 3's block loads ([`blocks`]).

pub(crate) mod blocks;
pub(crate) mod gather;
pub(crate) mod hot;
pub(crate) mod item;
pub(crate) mod request;

use crate::io::uring::BackendKind;
use crate::memory::policy::Policy;
use crate::memory::reads::Reads;
use std::path::Path;

/// What a read needs of its store, and no more: the directory its chunk
/// files are named in, the I/O backend, whether records may be copied from
/// mappings, the store's read counters and policy, and whoever can put a
/// new read policy in force ([`Adopt`]).
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub dir: &'a Path,
    pub backend: BackendKind,
    pub mmap: bool,
    pub reads: &'a Reads,
    pub adopt: &'a dyn Adopt,
}

/// A store as a gather's [`gather::Source`] holds it: read only for its
/// [`Ctx`], when records not in memory need it.
pub(crate) trait Contexts: Sync {
    /// What this store's reads need of it.
    fn read_ctx(&self) -> Ctx<'_>;
}

/// Puts in force a read policy that a gather's counts chose
/// ([`crate::memory::reads::Reads::observe`]): the store, which owns the
/// published snapshot, reopens its chunks in a new one.
pub(crate) trait Adopt: Sync {
    /// Switches to `policy` for `data` stored bytes.
    fn adopt(&self, policy: Policy, data: u64);
}
