//! Delete and compact: the operations that rewrite the record table.
//!
//! Both write a new table generation (and compaction new chunk files), make
//! them durable, and only then commit a head naming them. Files of the old
//! state are removed after the commit; a crash in between leaves files that
//! [`crate::write::recover`] removes.

use std::fs::File;
use std::io::Write;

use crate::error::{io_err, Error, Result};
use crate::format::codec::Codec;
use crate::format::fingerprint::{over_entries, over_records, SEED};
use crate::format::head::{Head, Layout};
use crate::format::names::{chunk_name, table_name, FORMAT_VERSION};
use crate::format::record::{check_index, ChunkId, Entry, ENTRY_BYTES};
use crate::format::table::{
    page_crc, table_header, Format, Sealed, BLOCK_BYTES, CRCS_PER_PAGE, PAGE, VAR_ENTRY, VAR_MAX_RECORD, VAR_PER_PAGE,
};
use crate::io::fs;
use crate::read::gather::Item;
use crate::read::gather::Snapshot;
use crate::store::Store;
use crate::write::Writer;

/// Records are copied by compaction in groups of about this many bytes.
const COMPACT_GROUP_BYTES: u64 = if cfg!(test) { 64 << 10 } else { 64 << 20 };

/// What [`Store::compact`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    /// Chunk bytes before.
    pub bytes_before: u64,
    /// Chunk bytes after.
    pub bytes_after: u64,
    /// Records copied.
    pub records: u64,
    /// Table format before.
    pub format_before: u32,
    /// Table format after.
    pub format_after: u32,
    /// Table bytes before.
    pub table_bytes_before: u64,
    /// Table bytes after.
    pub table_bytes_after: u64,
}

/// A table file to commit: its bytes, and what the head says of it.
pub(crate) struct NewTable {
    pub bytes: Vec<u8>,
    pub records: u64,
    pub content: u32,
    pub layout: Layout,
}

impl NewTable {
    /// A format-1 table of generation `gen` holding format-1 `entries`.
    fn v1(gen: u64, entries: &[u8]) -> NewTable {
        let mut bytes = Vec::with_capacity(entries.len() + 64);
        bytes.extend_from_slice(&table_header(gen));
        bytes.extend_from_slice(entries);
        NewTable {
            bytes,
            records: (entries.len() / ENTRY_BYTES) as u64,
            content: over_entries(SEED, entries),
            layout: Layout::V1,
        }
    }

    /// A format-2 table of generation `gen` sealing `entries` (records
    /// placed as `kind` requires; fixed block checksums in `blocks`).
    fn v2(gen: u64, kind: Sealed, entries: &[Entry], blocks: &[u32]) -> NewTable {
        let records = entries.len() as u64;
        let pages = kind.pages(records);
        let mut bytes = kind.header(gen, records);
        bytes.resize(PAGE * (1 + pages as usize), 0);
        for p in 0..pages as usize {
            let page = &mut bytes[PAGE * (1 + p)..PAGE * (2 + p)];
            match kind {
                Sealed::Variable => {
                    let on = &entries[p * VAR_PER_PAGE as usize..((p + 1) * VAR_PER_PAGE as usize).min(entries.len())];
                    let last = on.last().expect("a page holds at least one entry");
                    page[4..8].copy_from_slice(&on[0].chunk.0.to_le_bytes());
                    page[8..12].copy_from_slice(&(last.end() as u32).to_le_bytes());
                    for (j, e) in on.iter().enumerate() {
                        debug_assert!(e.chunk == on[0].chunk && e.end() <= u64::from(u32::MAX));
                        let b = &mut page[16 + j * VAR_ENTRY..16 + (j + 1) * VAR_ENTRY];
                        b[0..4].copy_from_slice(&(e.offset as u32).to_le_bytes());
                        b[4..8].copy_from_slice(&(e.logical_len | (e.codec as u32) << 30).to_le_bytes());
                        b[8..12].copy_from_slice(&e.checksum.unwrap_or(0).to_le_bytes());
                    }
                }
                Sealed::Fixed { .. } => {
                    let on = &blocks[p * CRCS_PER_PAGE as usize..((p + 1) * CRCS_PER_PAGE as usize).min(blocks.len())];
                    for (k, c) in on.iter().enumerate() {
                        page[4 + 4 * k..8 + 4 * k].copy_from_slice(&c.to_le_bytes());
                    }
                }
            }
            let crc = page_crc(p as u64, page);
            page[0..4].copy_from_slice(&crc.to_le_bytes());
        }
        NewTable {
            bytes,
            records,
            content: over_records(SEED, entries.iter().map(|e| (e.checksum.unwrap_or(0), e.logical_len))),
            layout: Layout { version: 2, sealed: records, tail_at: (PAGE as u64) * (1 + pages) },
        }
    }
}

/// How compaction to format 2 lays out `entries` (the live records, in
/// index order) in chunks of about `target` bytes from chunk `first_chunk`:
/// a fixed section when every record is raw and of one length, else a
/// variable one. Records too large for a variable section are an error.
fn plan_sealed(entries: &[Entry], target: u64, first_chunk: u32) -> Result<Sealed> {
    let first = entries.first();
    if let Some(f) = first.filter(|f| f.codec == Codec::Raw && f.logical_len > 0) {
        if entries.iter().all(|e| e.codec == Codec::Raw && e.logical_len == f.logical_len) {
            let len = u64::from(f.logical_len);
            let block_records = BLOCK_BYTES.div_ceil(len);
            let chunk_records = (target / len / block_records).max(1) * block_records;
            return Ok(Sealed::Fixed {
                item_len: f.logical_len,
                block_records: block_records as u32,
                chunk_records,
                first_chunk,
            });
        }
    }
    for (i, e) in entries.iter().enumerate() {
        let len = u64::from(e.own_len().max(e.logical_len));
        if len > VAR_MAX_RECORD {
            return Err(Error::InvalidArgument(format!(
                "format 2 keeps variable records below 1 GiB; record {i} is {len} bytes: compact to format 1"
            )));
        }
    }
    Ok(Sealed::Variable)
}

/// Every record's format-1 entry, for rewriting the table in format 1: the
/// entries after the sealed section as they are, those in it re-encoded.
/// Records of a fixed section have only block checksums; their own are
/// computed from the data (read and verified by block).
fn materialize(s: &Store, snap: &Snapshot) -> Result<Vec<u8>> {
    let sealed = snap.table.sealed_records();
    snap.table.will_scan();
    let mut out = Vec::with_capacity(snap.records() as usize * ENTRY_BYTES);
    let mut i = 0;
    while i < sealed {
        let end = (i + 65_536).min(sealed);
        let entries = (i..end).map(|k| snap.entry(k)).collect::<Result<Vec<_>>>()?;
        let parts: u64 = entries.iter().filter(|e| e.is_part()).map(|e| u64::from(e.logical_len)).sum();
        let mut buf = vec![0u8; parts as usize];
        let mut items = Vec::new();
        let mut rest: &mut [u8] = &mut buf;
        for (k, e) in entries.iter().enumerate().filter(|(_, e)| e.is_part()) {
            let (slot, tail) = std::mem::take(&mut rest).split_at_mut(e.logical_len as usize);
            rest = tail;
            items.push(Item {
                index: i + k as u64,
                entry: *e,
                dst: slot,
                keep_stored: false,
                next: crate::read::cache::NextUse::Unknown,
            });
        }
        crate::read::gather::read_items(s, snap, items)?;
        let mut pos = 0usize;
        for e in &entries {
            let e = if e.is_part() {
                let b = &buf[pos..pos + e.logical_len as usize];
                pos += b.len();
                Entry {
                    offset: e.offset + u64::from(e.within),
                    stored_len: e.logical_len,
                    checksum: Some(crate::format::crc::crc32c(b)),
                    within: 0,
                    ..*e
                }
            } else {
                *e
            };
            out.extend_from_slice(&e.encode());
        }
        i = end;
    }
    out.extend_from_slice(&snap.table.entry_bytes()?);
    Ok(out)
}

/// Sequential writer of compaction's new chunk files.
struct NewChunks<'a> {
    dir: &'a std::path::Path,
    base: u32,
    /// Chunks finished so far.
    count: u32,
    /// Bytes in the current chunk.
    len: u64,
    file: Option<std::io::BufWriter<File>>,
}

impl NewChunks<'_> {
    fn path(&self) -> std::path::PathBuf {
        self.dir.join(chunk_name(Format::Native, ChunkId(self.base + self.count)))
    }

    /// Writes `bytes` at the end of the current chunk, or of a new one when
    /// `new_chunk` says so (and the current one holds anything).
    fn put(&mut self, bytes: &[u8], new_chunk: bool) -> Result<(ChunkId, u64)> {
        if self.file.is_some() && self.len > 0 && new_chunk {
            self.seal()?;
            self.count += 1;
            self.len = 0;
        }
        if self.file.is_none() {
            let p = self.path();
            let f = fs::create_new(&p)?;
            self.file = Some(std::io::BufWriter::with_capacity(8 << 20, f));
        }
        let p = self.path();
        crate::io::fault::record(|| crate::io::fault::Event::Write(p.clone(), self.len, bytes.to_vec()));
        crate::io::fault::hit(crate::io::fault::Kind::Write)
            .and_then(|()| self.file.as_mut().expect("opened above").write_all(bytes))
            .map_err(io_err("write", &p))?;
        let at = self.len;
        self.len += bytes.len() as u64;
        Ok((ChunkId(self.base + self.count), at))
    }

    fn seal(&mut self) -> Result<()> {
        let p = self.path();
        if let Some(f) = self.file.take() {
            let f = f.into_inner().map_err(|e| io_err("write", &p)(e.into_error()))?;
            fs::fsync(&f, &p)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.file.is_none() {
            // An empty store still has one (empty) chunk.
            let p = self.path();
            fs::create(&p)?;
        }
        self.seal()?;
        fs::fsync_dir(self.dir)
    }
}

/// Removes records, keeping the index space dense: each hole is filled by
/// the record at the end of the table, in descending index order (the
/// semantics of loaderx 0.7.3, so the same deletes give the same order).
/// Indices of survivors may change. Duplicates and any order are fine;
/// every index is checked before anything changes. Only the table is
/// rewritten; [`Store::compact`] reclaims the bytes.
pub(crate) fn delete(s: &Store, indices: &[u64]) -> Result<()> {
    let mut w = s.writer()?;
    let snap = s.snapshot();
    for &i in indices {
        check_index(i, w.records)?;
    }
    let mut order = indices.to_vec();
    order.sort_unstable_by(|a, b| b.cmp(a));
    order.dedup();
    let mut bytes = materialize(s, &snap)?;
    let mut len = w.records as usize;
    for i in order {
        let i = i as usize;
        let last = len - 1;
        if i != last {
            bytes.copy_within(last * ENTRY_BYTES..len * ENTRY_BYTES, i * ENTRY_BYTES);
        }
        len -= 1;
    }
    bytes.truncate(len * ENTRY_BYTES);
    let table = NewTable::v1(w.head.generation + 1, &bytes);
    let r = commit_table(s, &mut w, table, None);
    match r {
        Ok(()) => crate::write::republish(s, &w),
        Err(e) => w.poison(e),
    }
}

/// Reclaims the bytes of deleted records: copies every live record, in
/// index order, into new chunk files, then commits a table naming them and
/// removes the old files. Needs free space for the live data. Concurrent
/// gathers keep reading the old files through their snapshot.
pub(crate) fn compact(s: &Store, format: Option<u32>) -> Result<CompactReport> {
    let mut w = s.writer()?;
    w.sync(&s.dir)?;
    let snap = s.snapshot();
    let before: u64 = snap.chunks.iter().map(|c| c.len).sum();
    let version = w.head.layout.version;
    let to = format.unwrap_or(version);
    if to == 0 || to > FORMAT_VERSION {
        return Err(Error::InvalidArgument(format!(
            "format {to} does not exist: formats 1 to {FORMAT_VERSION} can be written"
        )));
    }
    let mut live = 0u64;
    snap.table.will_scan();
    let mut entries = Vec::with_capacity(snap.records() as usize);
    for i in 0..snap.records() {
        let e = snap.entry(i)?;
        live += u64::from(e.own_len());
        entries.push(e);
    }
    let mut report = CompactReport {
        bytes_before: before,
        bytes_after: before,
        records: 0,
        format_before: version,
        format_after: version,
        table_bytes_before: snap.table.bytes(),
        table_bytes_after: snap.table.bytes(),
    };
    if live == before && to == version && snap.table.sealed_records() == snap.records() * u64::from(to - 1) {
        return Ok(report);
    }
    let base = w.head.chunk_base + w.head.chunk_count;
    let target = w.head.chunk_target;
    let kind = if to == 2 { Some(plan_sealed(&entries, target, base)?) } else { None };
    let mut out = NewChunks { dir: &s.dir, base, count: 0, len: 0, file: None };
    let mut copied = Vec::with_capacity(entries.len());
    let mut blocks = Vec::new();
    let r: Result<()> = (|| {
        let mut start = 0usize;
        let mut block: Option<u32> = None;
        while start < entries.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < entries.len()
                && (end == start || bytes + u64::from(entries[end].own_len()) <= COMPACT_GROUP_BYTES)
            {
                bytes += u64::from(entries[end].own_len());
                end += 1;
            }
            let mut buf = vec![0u8; bytes as usize];
            let mut items = Vec::with_capacity(end - start);
            let mut rest: &mut [u8] = &mut buf;
            for (k, e) in entries[start..end].iter().enumerate() {
                let (slot, tail) = std::mem::take(&mut rest).split_at_mut(e.own_len() as usize);
                rest = tail;
                items.push(Item {
                    index: (start + k) as u64,
                    entry: *e,
                    dst: slot,
                    // A record inside a block is read as itself (verified
                    // with its block); every other record as stored.
                    keep_stored: !e.is_part(),
                    next: crate::read::cache::NextUse::Unknown,
                });
            }
            crate::read::gather::read_items(s, &snap, items)?;
            let mut pos = 0usize;
            for (i, e) in (start..end).zip(&entries[start..end]) {
                let n = e.own_len() as usize;
                let b = &buf[pos..pos + n];
                pos += n;
                let i = i as u64;
                let new_chunk = match kind {
                    None => out.len + n as u64 > target,
                    Some(Sealed::Fixed { chunk_records, .. }) => i.is_multiple_of(chunk_records),
                    Some(Sealed::Variable) => i.is_multiple_of(VAR_PER_PAGE) && out.len + n as u64 > target,
                };
                if let Some(Sealed::Fixed { block_records, chunk_records, .. }) = kind {
                    if (i % chunk_records).is_multiple_of(u64::from(block_records)) {
                        blocks.extend(block.take());
                    }
                    let c = block
                        .map_or_else(|| crate::format::crc::crc32c(b), |c| crate::format::crc::crc32c_append(c, b));
                    block = Some(c);
                }
                let (chunk, offset) = out.put(b, new_chunk)?;
                if kind == Some(Sealed::Variable) && offset + n as u64 > u64::from(u32::MAX) {
                    return Err(Error::InvalidArgument(format!(
                        "format 2 keeps a chunk's records below 4 GiB and switches chunks every {VAR_PER_PAGE} \
                         records; records {}.. are too large for that: compact to format 1",
                        i / VAR_PER_PAGE * VAR_PER_PAGE
                    )));
                }
                let checksum = if e.is_part() { Some(crate::format::crc::crc32c(b)) } else { e.checksum };
                copied.push(Entry { chunk, offset, stored_len: n as u32, checksum, within: 0, ..*e });
            }
            start = end;
            // A fork waits for this group, not the whole compaction.
            w.yield_to_fork();
        }
        blocks.extend(block.take());
        out.finish()
    })();
    if let Err(e) = r {
        // Nothing committed: the new chunks are garbage, removed now or by
        // the next writer's recovery.
        for k in 0..=out.count {
            let _ = fs::remove(&s.dir.join(chunk_name(Format::Native, ChunkId(base + k))));
        }
        // The committed state is untouched, but what the failed write or
        // fsync left on the device is unknown: refuse further writes (an
        // argument error found before anything was written does not).
        return match e {
            Error::InvalidArgument(_) => Err(e),
            e => w.poison(e),
        };
    }
    crate::io::fault::crash_point("compact.copied");
    let gen = w.head.generation + 1;
    let table = match kind {
        None => NewTable::v1(gen, &copied.iter().flat_map(|e| e.encode()).collect::<Vec<u8>>()),
        Some(kind) => NewTable::v2(gen, kind, &copied, &blocks),
    };
    report.table_bytes_after = table.bytes.len() as u64;
    let new_chunks = (base, out.count + 1, out.len);
    let old = (w.head.chunk_base, w.head.chunk_count);
    if let Err(e) = commit_table(s, &mut w, table, Some(new_chunks)) {
        return w.poison(e);
    }
    // Republished first, so this handle's own old snapshot no longer pins
    // the old chunks (gathers still running on it do, and keep them).
    crate::write::republish(s, &w)?;
    let deferred = std::mem::take(&mut w.deferred);
    w.remove_old_chunks(&s.dir, deferred.into_iter().chain(old.0..old.0 + old.1));
    // The old chunks are gone: their records can never be asked for again.
    s.reads.forget();
    report.bytes_after = live;
    report.records = entries.len() as u64;
    report.format_after = to;
    Ok(report)
}

/// Writes the table file of generation `w.head.generation + 1`, makes it
/// (and any pending data) durable, commits a head naming it, and removes the
/// old table. `chunks` = (base, count, tail length) when compaction replaced
/// them.
pub(crate) fn commit_table(s: &Store, w: &mut Writer, table: NewTable, chunks: Option<(u32, u32, u64)>) -> Result<()> {
    let gen = w.head.generation + 1;
    let tp = s.dir.join(table_name(gen));
    let mut f = crate::io::fs::create(&tp)?;
    fs::write_all(&mut f, &tp, 0, &table.bytes)?;
    fs::fsync(&f, &tp)?;
    crate::io::fault::crash_point("table.written");
    w.sync(&s.dir)?;
    fs::fsync_dir(&s.dir)?;
    let mut head =
        Head { generation: gen, records: table.records, content: table.content, layout: table.layout, ..w.head };
    if let Some((base, count, tail)) = chunks {
        head.chunk_base = base;
        head.chunk_count = count;
        head.tail_len = tail;
    }
    head.commit(&s.dir)?;
    crate::io::fault::crash_point("table.committed");
    let old_table = s.dir.join(table_name(w.head.generation));
    let _ = fs::remove(&old_table);
    w.head = head;
    w.records = head.records;
    w.chunk_count = head.chunk_count;
    w.tail_len = head.tail_len;
    w.table = f;
    if chunks.is_some() {
        let cp = s.dir.join(chunk_name(Format::Native, ChunkId(head.last_chunk())));
        w.tail = fs::open_rw(&cp)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(
    unsafe_code,
    reason = "the test forks the process (libc::fork, _exit, waitpid); each block has its SAFETY note"
)]
mod tests {
    use crate::{Codec, Store};
    use std::sync::Arc;

    /// `fork()` used to wait for a whole compaction (the writer held the fork
    /// gate for the operation); now it waits for one group at most, and the
    /// child cannot write through the inherited handle (it would wait on a
    /// writer locked by a thread it does not have).
    #[test]
    fn fork_during_a_compaction_waits_for_one_group_not_the_whole() {
        let dir = tempfile::Builder::new().tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let store = Arc::new(Store::builder(dir.path()).codec(Codec::Raw).create().unwrap());
        let recs: Vec<Vec<u8>> = (0..4096u32).map(|i| vec![i as u8; 16 << 10]).collect(); // 64 MiB, 1024 groups
        store.append(&recs.iter().map(Vec::as_slice).collect::<Vec<_>>(), None).unwrap();
        store.delete(&[0]).unwrap();
        let compactor = {
            let store = store.clone();
            std::thread::spawn(move || store.compact().unwrap())
        };
        // Compaction has begun once its first new chunk exists.
        let first_new = dir.path().join("chunk-000001.zr");
        while !first_new.exists() {
            std::thread::yield_now();
        }
        // SAFETY: the child calls only async-signal-tolerant Rust code of this
        // crate (no allocation-dependent locks are held across fork: the gate
        // guarantees it) and ends with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let refused = matches!(store.sync(), Err(crate::Error::ReadOnly(m)) if m.contains("forked child"));
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if refused { 0 } else { 3 }) };
        }
        // What the compaction had copied when fork returned: all of it if fork
        // waited for the whole operation.
        let copied = std::fs::metadata(&first_new).unwrap().len();
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is valid.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        compactor.join().unwrap();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        let total = std::fs::metadata(&first_new).unwrap().len();
        assert!(copied < total, "fork waited for the whole compaction ({copied} of {total} bytes copied)");
        assert_eq!(store.len(), 4095);
    }
}
