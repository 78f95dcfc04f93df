//! The published snapshot: the table, chunks and dictionary a reader sees
//! ([`Snapshot`]), loading one from a store's directory ([`load`]), the
//! chunk files ([`chunk`]), the cell a handle publishes it in ([`cell`]), and the pins that keep a snapshot's files for its
//! readers in any process ([`pins`]).

pub(crate) mod cell;
pub(crate) mod chunk;
pub(crate) mod pins;

use crate::error::{corrupted, io_err, Error, Result};
use crate::format::codec::Dict;
use crate::format::head::Head;
use crate::format::names::{chunk_name, HEAD_FILE};
use crate::format::record::{check_index, ChunkId, Entry};
use crate::format::table::{Format, Table};
use crate::io::fds::StoreId;
use crate::io::fs::Dir;
use crate::memory::reads::Reads;
use chunk::{open_chunk, Chunk};
use std::sync::Arc;

/// An immutable view of the store; gathers hold one for their whole duration,
/// so a concurrent append, delete or compaction never changes what they see.
pub(crate) struct Snapshot {
    /// Keeps the chunk files this snapshot names from being removed by a
    /// compaction in any process ([`crate::snapshot::pins`]); `None` when unpinned.
    pub pin: Option<Arc<crate::snapshot::pins::Pin>>,
    pub table: Arc<Table>,
    pub chunk_base: u32,
    pub chunks: Vec<Chunk>,
    pub dict: Option<Arc<Dict>>,
    /// The fingerprint content as far as a head knows it: (records, content),
    /// content 0 when unknown ([`crate::format::fingerprint`]).
    pub known: (u64, u32),
    /// The content of all of `table`'s records, once computed.
    pub content: std::sync::OnceLock<u32>,
}

impl Snapshot {
    /// The table's format version (0 for loaderx) and its bytes
    /// ([`crate::Store::table_format`]).
    pub fn table_format(&self) -> (u32, u64) {
        match self.table.format {
            Format::Loaderx => (0, self.table.bytes()),
            Format::Native => (if self.table.sealed_kind().is_some() { 2 } else { 1 }, self.table.bytes()),
        }
    }

    pub fn records(&self) -> u64 {
        self.table.records
    }

    pub fn chunk(&self, id: ChunkId) -> Option<&Chunk> {
        id.0.checked_sub(self.chunk_base).and_then(|k| self.chunks.get(k as usize))
    }

    /// Entry `index`, checked against the chunk it points into, so a damaged
    /// table is an error before any I/O is issued.
    pub fn entry(&self, index: u64) -> Result<Entry> {
        check_index(index, self.records())?;
        let e = self.table.entry(index)?;
        let table = self.table.path().display();
        let chunk = self.chunk(e.chunk).ok_or_else(|| {
            corrupted(
                format!("{table}, table entry {index}"),
                format!(
                    "names chunk {} ({}) which the head does not name (it names chunks {}..{})",
                    e.chunk.0,
                    chunk_name(self.table.format, e.chunk),
                    self.chunk_base,
                    self.chunk_base as usize + self.chunks.len()
                ),
            )
        })?;
        if e.end() > chunk.len {
            return Err(corrupted(
                format!("{table}, table entry {index}"),
                format!(
                    "bytes {}..{} lie past the end of {} ({} bytes)",
                    e.offset,
                    e.end(),
                    chunk.file.path().display(),
                    chunk.len
                ),
            ));
        }
        Ok(e)
    }
}

/// Loads a snapshot (and for native stores the head it came from), with the
/// read policy `reads` chooses for the store's size.
pub(crate) fn load(
    dir: &Arc<Dir>,
    dict_level: i32,
    reads: &dyn Fn(u64) -> Result<Reads>,
) -> Result<(Snapshot, Option<Head>, Reads)> {
    // The store's identity before its head is read: a chunk file opened
    // later is checked against it, so a store replaced at this path is never
    // read under this snapshot's table ([`crate::io::fds::ChunkFile`]).
    let store = StoreId::of_dir(dir).ok();
    if dir.exists(HEAD_FILE) {
        let head = Head::read(dir)?;
        // Pinned before the chunks are checked ([`crate::snapshot::pins`]).
        let pin = crate::snapshot::pins::pin(dir, head.chunk_base, head.chunk_count)?.map(Arc::new);
        let table = Table::open_native(dir, head.generation, head.layout, head.records)?;
        // Check every chunk before deciding on O_DIRECT (which needs the total
        // size); a missing chunk fails here, before any large allocation.
        let mut chunks = Vec::new();
        for k in 0..head.chunk_count {
            let len = (k + 1 == head.chunk_count).then_some(head.tail_len);
            chunks.push(open_chunk(dir, store, Format::Native, ChunkId(head.chunk_base + k), len, false)?);
        }
        if store.is_some() && StoreId::of(dir.path()).ok() != store {
            return Err(Error::Io {
                op: "open",
                path: dir.path().to_path_buf(),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        let reads = reads(chunks.iter().map(|c| c.len).sum())?;
        if reads.direct() {
            chunks.iter_mut().for_each(|c| c.direct = true);
        }
        let dict = if head.dict_len > 0 {
            let p = dir.join(crate::format::names::DICT_FILE);
            let bytes = dir.read(crate::format::names::DICT_FILE).map_err(io_err("read", &p))?;
            let crc = crate::format::crc::crc32c(&bytes);
            if bytes.len() != head.dict_len as usize || crc != head.dict_crc {
                return Err(corrupted(
                    p.display().to_string(),
                    format!(
                        "{} bytes with checksum {crc:#010x}; the head says {} bytes with checksum {:#010x}",
                        bytes.len(),
                        head.dict_len,
                        head.dict_crc
                    ),
                ));
            }
            let dict = Dict::new(bytes, Some(dict_level)).map_err(|e| match e {
                Error::Corrupted { detail, .. } => corrupted(p.display().to_string(), detail),
                e => e,
            })?;
            Some(Arc::new(dict))
        } else {
            None
        };
        let snap = Snapshot {
            pin,
            table: Arc::new(table),
            chunk_base: head.chunk_base,
            chunks,
            dict,
            known: (head.records, head.content),
            content: Default::default(),
        };
        Ok((snap, Some(head), reads))
    } else {
        let (table, tail_chunk, tail_offset) = Table::open_loaderx(dir)?;
        // loaderx chunk files are 4 GiB sparse files; only the data below the
        // frontier counts toward the direct-read threshold.
        let reads = reads(u64::from(tail_chunk) * (1 << 32) + tail_offset)?;
        let direct = reads.direct();
        let chunks = (0..=tail_chunk)
            .map(|k| {
                open_chunk(dir, store, Format::Loaderx, ChunkId(k), (k == tail_chunk).then_some(tail_offset), direct)
            })
            .collect::<Result<Vec<_>>>()?;
        let p = dir.join(crate::format::names::DICT_FILE);
        let dict = match dir.read(crate::format::names::DICT_FILE) {
            Ok(bytes) => Some(Arc::new(Dict::new(bytes, None)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &p)(e)),
        };
        let snap = Snapshot {
            pin: None,
            table: Arc::new(table),
            chunk_base: 0,
            chunks,
            dict,
            known: (0, 0),
            content: Default::default(),
        };
        Ok((snap, None, reads))
    }
}
