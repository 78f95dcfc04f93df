//! The hot records of a gather: those whose stored bytes are already in
//! memory (in the page cache, read through a chunk's mapping, in the record
//! cache or in a loaded window), shared out in groups that any of the gather's threads may claim
//! while its own reads are in flight (see `read::gather::read_items`).

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use crate::error::{corrupted, Error, Result};
use crate::format::codec::Dict;
use crate::format::names::chunk_name;
use crate::format::table::Format;
use crate::read::item::{finish_record, Item};

/// Records per claim from the hot queue: about 100 KiB of 12 KiB records,
/// far more work (tens of microseconds to decode) than a claim costs (one
/// atomic add and an uncontended lock), and small enough that two threads
/// finish a 256-record batch within a group of each other.
pub(crate) const HOT_GROUP: usize = 8;

/// Where a hot record's stored bytes are: in a chunk's mapping (the page
/// cache), in the record cache, or in a loaded window's slab
/// ([`crate::memory::window`]).
pub(crate) enum Hot<'m> {
    Mapped(crate::io::mmap::Resident<'m>),
    Cached(bytes::Bytes),
    Held(&'m [u8]),
}

impl std::ops::Deref for Hot<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Hot::Mapped(b) => b.bytes(),
            Hot::Cached(b) => b,
            Hot::Held(b) => b,
        }
    }
}

/// Hot records of one gather, in groups any of its threads may claim.
pub(crate) struct HotQueue<'q, 'i, 'm> {
    pub groups: &'q [Mutex<&'q mut [(Item<'i>, Hot<'m>)]>],
    pub next: AtomicUsize,
    pub dict: Option<&'m Dict>,
    /// The store's directory and format, to name a chunk file in an error.
    pub dir: &'m Path,
    pub format: Format,
    /// The first error of a hot record.
    pub error: Mutex<Option<Error>>,
}

impl HotQueue<'_, '_, '_> {
    /// Copies or decodes groups until none is left unclaimed; an error is
    /// kept for [`HotQueue::finish`] and the other groups still run (a
    /// failed gather's slots are undefined anyway, and stopping early would
    /// need a second flag for no gain).
    pub fn drain(&self) {
        loop {
            let k = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(group) = self.groups.get(k) else { return };
            let mut group = group.lock().unwrap_or_else(|p| p.into_inner());
            for (it, stored) in group.iter_mut() {
                let r = finish_record(it, stored, self.dict);
                if let Hot::Mapped(m) = stored {
                    if m.faulted() {
                        // The copy may have read zeros for pages the file lost.
                        let path = self.dir.join(chunk_name(self.format, it.entry.chunk));
                        self.failed(corrupted(
                            format!("chunk {}", it.entry.chunk.0),
                            format!(
                                "{} shrank or could not be read while mapped (record {})",
                                path.display(),
                                it.index
                            ),
                        ));
                        continue;
                    }
                }
                if let Err(e) = r {
                    self.failed(e);
                }
            }
        }
    }

    fn failed(&self, e: Error) {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }

    /// Drains what is left (a thread whose reads failed before it drained)
    /// and returns the first error: `r`, else one from a hot record.
    pub fn finish(&self, r: Result<()>) -> Result<()> {
        self.drain();
        let hot = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        r.and(hot.map_or(Ok(()), Err))
    }
}
