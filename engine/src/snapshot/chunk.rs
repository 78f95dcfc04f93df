//! One chunk file as readers see it: its descriptors, read mode and mapping.

use crate::error::{corrupted, io_err, Result};
use crate::format::names::chunk_name;
use crate::format::record::ChunkId;
use crate::format::table::Format;
use crate::io::fds::{ChunkFile, StoreId};
use crate::io::fs::Dir;
use once_cell::race::OnceBox;
use std::os::fd::AsFd;
use std::sync::Arc;

/// The bytes of one readahead request: the kernel's usual readahead
/// window (128 KiB), which caps a single `WILLNEED`.
const AHEAD_PIECE: u64 = 128 << 10;

/// One chunk file as readers see it.
#[derive(Clone)]
pub(crate) struct Chunk {
    /// The file; its descriptors are opened on first use and cached by the
    /// process ([`crate::io::fds`]).
    pub file: Arc<ChunkFile>,
    /// Whether reads bypass the page cache (O_DIRECT) where the file system
    /// allows it.
    pub direct: bool,
    /// Bytes of this chunk that committed records may occupy.
    pub len: u64,
    /// A read-only mapping of the first `len` bytes, made on first use, for
    /// copying records that are already in the page cache without a system
    /// call. `None` inside when mapping failed or direct reads are on. Made
    /// without blocking (racing threads may both map; one mapping is kept),
    /// so no thread can wait on another's initialisation, even in a child
    /// forked while it ran.
    pub map: Arc<OnceBox<Option<crate::io::mmap::ChunkMap>>>,
}

impl Chunk {
    /// The stored bytes at `offset..offset + len` if every page of them is in
    /// memory (so reading them performs no I/O). Ask
    /// [`crate::io::mmap::Resident::faulted`] after using them.
    pub fn resident(&self, offset: u64, len: usize, epoch: Option<u64>) -> Option<crate::io::mmap::Resident<'_>> {
        if !self.copies_from_map() {
            return None;
        }
        self.mapping()?.resident_checked(offset as usize, len, epoch)
    }

    /// Whether records are copied from the mapping (no O_DIRECT in force).
    fn copies_from_map(&self) -> bool {
        !self.direct || self.file.direct_refused()
    }

    /// The mapping, made now if it is not yet (`None` where mapping fails
    /// or the chunk is empty).
    pub fn mapping(&self) -> Option<&crate::io::mmap::ChunkMap> {
        self.map
            .get_or_init(|| {
                let map = (self.len > 0)
                    .then(|| self.file.buffered().ok())
                    .flatten()
                    .and_then(|f| crate::io::mmap::ChunkMap::new(&f, self.len as usize).ok());
                Box::new(map)
            })
            .as_ref()
    }

    /// Starts loading what [`Chunk::resident`] will ask about `offset`.
    pub fn prefetch_residency(&self, offset: u64) {
        if self.copies_from_map() {
            if let Some(m) = self.map.get().and_then(Option::as_ref) {
                m.prefetch_residency(offset as usize);
            }
        }
    }

    /// Asks the kernel to read the whole file into the page cache
    /// (`POSIX_FADV_WILLNEED`, in pieces of [`AHEAD_PIECE`], since the kernel
    /// cuts one request at its readahead window), without waiting for it
    /// (`crate::read::gather::gather_over`: a small part of a dataset).
    /// Advice only: a descriptor that cannot be had, or a file system that
    /// ignores the advice, costs the gathers their own reads (which report
    /// the error), never wrong bytes.
    pub fn read_ahead(&self) {
        let Ok(file) = self.file.buffered() else { return };
        let mut at = 0;
        while at < self.len {
            let len = std::num::NonZeroU64::new(AHEAD_PIECE.min(self.len - at));
            let _ = rustix::fs::fadvise(file.as_fd(), at, len, rustix::fs::Advice::WillNeed);
            at += AHEAD_PIECE;
        }
    }

    /// The same file under another read mode.
    pub fn with_direct(&self, direct: bool) -> Chunk {
        Chunk { direct, ..self.clone() }
    }
}

pub(crate) fn open_chunk(
    dir: &Arc<Dir>,
    store: Option<StoreId>,
    format: Format,
    id: ChunkId,
    len: Option<u64>,
    direct: bool,
) -> Result<Chunk> {
    let name = chunk_name(format, id);
    let path = dir.join(&name);
    // Only its size is checked now (a link is not followed, nor is it a
    // chunk); it is opened when first read.
    let size = dir.stat(&name).map_err(io_err("stat", &path))?.st_size as u64;
    let len = match len {
        Some(l) if l > size => {
            return Err(corrupted(
                path.display().to_string(),
                format!("{size} bytes, the head says {l}: bytes {size}..{l} are missing"),
            ))
        }
        Some(l) => l,
        None => size,
    };
    Ok(Chunk { file: ChunkFile::new(Arc::clone(dir), name, store), direct, len, map: Default::default() })
}
