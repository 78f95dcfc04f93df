//! Delete and compact: the operations that rewrite the record table.
//!
//! Both write a new table generation in one pass over the records
//! ([`crate::write::new_table`]; compaction also new chunk files), make
//! them durable, and only then commit a head naming them. Files of the old
//! state are removed after the commit; a crash in between leaves files that
//! [`crate::write::recover`] removes.

use std::fs::File;
use std::io::Write;

use crate::error::{io_err, Error, Result};
use crate::format::codec::Codec;
use crate::format::head::Head;
use crate::format::names::{chunk_name, table_name, FORMAT_VERSION};
use crate::format::record::{check_index, ChunkId, Entry};
use crate::format::table::{Format, Sealed, BLOCK_BYTES, VAR_MAX_RECORD, VAR_PER_PAGE};
use crate::io::fs::{self, Dir};
use crate::read::item::{carve, Want};
use crate::snapshot::Snapshot;
use crate::write::new_table::{NewTable, TableOut};
use crate::write::Ctx;
use crate::write::Writer;

/// Records are copied by compaction in groups of about this many bytes.
const COMPACT_GROUP_BYTES: u64 = if cfg!(test) { 64 << 10 } else { 64 << 20 };
/// … and at most this many records (labels of 8 bytes would make a group
/// of 64 MiB 8 million entries and reads).
const COMPACT_GROUP_RECORDS: usize = 1 << 20;

/// What `Store::compact` did.
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

/// What compaction learns of the live records in a first pass over the
/// table, before it writes anything.
#[derive(Default)]
struct Survey {
    records: u64,
    /// Stored bytes of the live records.
    live: u64,
    /// The length of every record while all are raw and of one length.
    fixed: Option<u32>,
    /// The first record too large for a variable section, and its length.
    too_large: Option<(u64, u64)>,
}

impl Survey {
    fn see(&mut self, e: &Entry) {
        self.live += u64::from(e.own_len());
        let raw = (e.codec == Codec::Raw && e.logical_len > 0).then_some(e.logical_len);
        self.fixed = if self.records == 0 { raw } else { self.fixed.filter(|&l| raw == Some(l)) };
        let len = u64::from(e.own_len().max(e.logical_len));
        if len > VAR_MAX_RECORD && self.too_large.is_none() {
            self.too_large = Some((self.records, len));
        }
        self.records += 1;
    }

    /// How compaction to format 2 lays the records out in chunks of about
    /// `target` bytes from chunk `first_chunk`: a fixed section when every
    /// record is raw and of one length, else a variable one. Records too
    /// large for a variable section are an error.
    fn plan(&self, target: u64, first_chunk: u32) -> Result<Sealed> {
        if let Some(item_len) = self.fixed {
            let len = u64::from(item_len);
            let block_records = BLOCK_BYTES.div_ceil(len);
            let chunk_records = (target / len / block_records).max(1) * block_records;
            return Ok(Sealed::Fixed { item_len, block_records: block_records as u32, chunk_records, first_chunk });
        }
        if let Some((i, len)) = self.too_large {
            return Err(Error::InvalidArgument(format!(
                "format 2 keeps variable records below 1 GiB; record {i} is {len} bytes: compact to format 1"
            )));
        }
        Ok(Sealed::Variable)
    }
}

/// Streams the format-1 entries of records `source(0)`, …,
/// `source(count - 1)` into `out`. Records of a fixed section have only
/// block checksums; their own are computed from the data (read and
/// verified by block).
fn materialize(
    s: &Ctx<'_>,
    snap: &Snapshot,
    count: u64,
    source: impl Fn(u64) -> u64,
    out: &mut TableOut,
) -> Result<()> {
    snap.table.will_scan();
    let mut k = 0;
    while k < count {
        let end = (k + 65_536).min(count);
        let entries = (k..end)
            .map(|p| {
                let i = source(p);
                Ok((i, snap.entry(i)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let parts: u64 = entries.iter().filter(|(_, e)| e.is_part()).map(|(_, e)| u64::from(e.logical_len)).sum();
        let mut buf = vec![0u8; parts as usize];
        let items = carve(&mut buf, entries.iter().filter(|(_, e)| e.is_part()).map(|&(i, e)| Want::logical(i, e)));
        crate::read::gather::read_items_by_block(&s.read_ctx(), snap, items)?;
        let mut pos = 0usize;
        for (_, e) in &entries {
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
            out.push(&e)?;
        }
        k = end;
    }
    Ok(())
}

/// Sequential writer of compaction's new chunk files.
struct NewChunks<'a> {
    dir: &'a Dir,
    base: u32,
    /// Chunks finished so far.
    count: u32,
    /// Bytes in the current chunk.
    len: u64,
    file: Option<std::io::BufWriter<File>>,
}

impl NewChunks<'_> {
    fn name(&self) -> String {
        chunk_name(Format::Native, ChunkId(self.base + self.count))
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.join(self.name())
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
            let f = self.dir.create_new(&self.name())?;
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
            self.dir.create(&self.name())?;
        }
        self.seal()?;
        self.dir.fsync()
    }
}

/// Removes records, keeping the index space dense: each hole is filled by
/// the record at the end of the table, in descending index order (the
/// semantics of loaderx 0.7.3, so the same deletes give the same order).
/// Indices of survivors may change. Duplicates and any order are fine;
/// every index is checked before anything changes. Only the table is
/// rewritten; [`Store::compact`] reclaims the bytes.
pub(crate) fn delete(s: &Ctx<'_>, indices: &[u64]) -> Result<()> {
    let mut w = s.writer()?;
    let r = delete_with(s, &mut w, indices);
    crate::write::settle(s, &mut w, r)
}

fn delete_with(s: &Ctx<'_>, w: &mut Locked<'_>, indices: &[u64]) -> Result<()> {
    let snap = s.snapshot();
    for &i in indices {
        check_index(i, w.records)?;
    }
    let mut order = indices.to_vec();
    order.sort_unstable_by(|a, b| b.cmp(a));
    order.dedup();
    // Where each filled hole's record comes from: O(deletes), not a copy
    // of the table.
    let mut moved = std::collections::HashMap::new();
    let mut len = w.records;
    for i in order {
        let last = len - 1;
        let from = moved.remove(&last).unwrap_or(last);
        if i != last {
            moved.insert(i, from);
        }
        len -= 1;
    }
    let mut out = TableOut::create(s.dir, w.head.generation + 1, None, len)?;
    let written = materialize(s, &snap, len, |p| moved.get(&p).copied().unwrap_or(p), &mut out);
    let table = match written.and_then(|()| out.finish()) {
        Ok(t) => t,
        Err(e) => {
            // Nothing committed: the new file is garbage. A record that
            // does not read leaves the store as it was; after a failed
            // write what reached the device is unknown: no more writes.
            let _ = s.dir.remove(&table_name(w.head.generation + 1));
            return match e {
                e @ Error::Io { op, .. } if op != "read" => w.poison(e),
                e => Err(e),
            };
        }
    };
    let r = commit_table(s, w, table, None);
    match r {
        Ok(()) => crate::write::republish(s, w),
        Err(e) => w.poison(e),
    }
}

/// Reclaims the bytes of deleted records: copies every live record, in
/// index order, into new chunk files, then commits a table naming them and
/// removes the old files. Needs free space for the live data. Concurrent
/// gathers keep reading the old files through their snapshot.
pub(crate) fn compact(s: &Ctx<'_>, format: Option<u32>) -> Result<CompactReport> {
    let mut w = s.writer()?;
    let r = compact_with(s, &mut w, format);
    crate::write::settle(s, &mut w, r)
}

/// The writer, held for a whole operation.
pub(crate) type Locked<'a> = crate::fork::Gated<std::sync::MutexGuard<'a, Writer>>;

fn compact_with(s: &Ctx<'_>, w: &mut Locked<'_>, format: Option<u32>) -> Result<CompactReport> {
    w.sync(s.dir)?;
    let snap = s.snapshot();
    let before: u64 = snap.chunks.iter().map(|c| c.len).sum();
    let version = w.head.layout.version;
    let to = format.unwrap_or(version);
    if to == 0 || to > FORMAT_VERSION {
        return Err(Error::InvalidArgument(format!(
            "format {to} does not exist: formats 1 to {FORMAT_VERSION} can be written"
        )));
    }
    snap.table.will_scan();
    let records = snap.records();
    let mut survey = Survey::default();
    for i in 0..records {
        survey.see(&snap.entry(i)?);
    }
    let live = survey.live;
    let mut report = CompactReport {
        bytes_before: before,
        bytes_after: before,
        records: 0,
        format_before: version,
        format_after: version,
        table_bytes_before: snap.table.bytes(),
        table_bytes_after: snap.table.bytes(),
    };
    if live == before && to == version && snap.table.sealed_records() == records * u64::from(to - 1) {
        return Ok(report);
    }
    let base = w.head.chunk_base + w.head.chunk_count;
    let target = w.head.chunk_target;
    let kind = if to == 2 { Some(survey.plan(target, base)?) } else { None };
    let gen = w.head.generation + 1;
    let mut out = NewChunks { dir: s.dir, base, count: 0, len: 0, file: None };
    let r: Result<NewTable> = (|| {
        let mut table = TableOut::create(s.dir, gen, kind, records)?;
        // The second pass over the entries: the mapping is read at random,
        // and a table larger than memory lost the first pass's pages.
        snap.table.will_scan();
        let mut start = 0u64;
        let mut block: Option<u32> = None;
        let mut group = Vec::new();
        while start < records {
            // The next group of records: about COMPACT_GROUP_BYTES, and
            // not so many that their entries and reads weigh more.
            group.clear();
            let mut bytes = 0u64;
            while start + (group.len() as u64) < records && group.len() < COMPACT_GROUP_RECORDS {
                let e = snap.entry(start + group.len() as u64)?;
                if !group.is_empty() && bytes + u64::from(e.own_len()) > COMPACT_GROUP_BYTES {
                    break;
                }
                bytes += u64::from(e.own_len());
                group.push(e);
            }
            let mut buf = vec![0u8; bytes as usize];
            // A record inside a block is read as itself (verified with its
            // block); every other record as stored.
            let want = |(i, e): (u64, &Entry)| if e.is_part() { Want::logical(i, *e) } else { Want::stored(i, *e) };
            let items = carve(&mut buf, (start..).zip(&group).map(want));
            crate::read::gather::read_items_by_block(&s.read_ctx(), &snap, items)?;
            let mut pos = 0usize;
            for (i, e) in (start..).zip(&group) {
                let n = e.own_len() as usize;
                let b = &buf[pos..pos + n];
                pos += n;
                let new_chunk = match kind {
                    None => out.len + n as u64 > target,
                    Some(Sealed::Fixed { chunk_records, .. }) => i.is_multiple_of(chunk_records),
                    Some(Sealed::Variable) => i.is_multiple_of(VAR_PER_PAGE) && out.len + n as u64 > target,
                };
                if let Some(Sealed::Fixed { block_records, chunk_records, .. }) = kind {
                    if (i % chunk_records).is_multiple_of(u64::from(block_records)) {
                        if let Some(c) = block.take() {
                            table.push_block(c)?;
                        }
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
                table.push(&Entry { chunk, offset, stored_len: n as u32, checksum, within: 0, ..*e })?;
            }
            start += group.len() as u64;
            // A fork waits for this group, not the whole compaction.
            w.yield_to_fork();
        }
        if let Some(c) = block.take() {
            table.push_block(c)?;
        }
        out.finish()?;
        table.finish()
    })();
    let table = match r {
        Ok(t) => t,
        Err(e) => {
            // Nothing committed: the new chunks and table are garbage,
            // removed now or by the next writer's recovery.
            for k in 0..=out.count {
                let _ = s.dir.remove(&chunk_name(Format::Native, ChunkId(base + k)));
            }
            let _ = s.dir.remove(&table_name(gen));
            // The committed state is untouched, but what the failed write
            // or fsync left on the device is unknown: refuse further writes
            // (an argument error found before anything was written does
            // not).
            return match e {
                Error::InvalidArgument(_) => Err(e),
                e => w.poison(e),
            };
        }
    };
    crate::io::fault::crash_point("compact.copied");
    report.table_bytes_after = table.bytes;
    let new_chunks = (base, out.count + 1, out.len);
    let old = (w.head.chunk_base, w.head.chunk_count);
    if let Err(e) = commit_table(s, w, table, Some(new_chunks)) {
        return w.poison(e);
    }
    // Republished first, so this handle's own old snapshot no longer pins
    // the old chunks (gathers still running on it do, and keep them).
    crate::write::republish(s, w)?;
    // Nor does the snapshot this compaction copied from.
    drop(snap);
    let deferred = std::mem::take(&mut w.deferred);
    w.remove_old_chunks(s.dir, deferred.into_iter().chain(old.0..old.0 + old.1));
    // The old chunks are gone: their records can never be asked for again.
    s.reads.forget();
    report.bytes_after = live;
    report.records = records;
    report.format_after = to;
    Ok(report)
}

/// Writes the table file of generation `w.head.generation + 1`, makes it
/// (and any pending data) durable, commits a head naming it, and removes the
/// old table. `chunks` = (base, count, tail length) when compaction replaced
/// them.
pub(crate) fn commit_table(
    s: &Ctx<'_>,
    w: &mut Writer,
    table: NewTable,
    chunks: Option<(u32, u32, u64)>,
) -> Result<()> {
    let gen = w.head.generation + 1;
    debug_assert_eq!(table.path, s.dir.join(table_name(gen)));
    fs::fsync(&table.file, &table.path)?;
    crate::io::fault::crash_point("table.written");
    w.sync(s.dir)?;
    s.dir.fsync()?;
    let mut head =
        Head { generation: gen, records: table.records, content: table.content, layout: table.layout, ..w.head };
    if let Some((base, count, tail)) = chunks {
        head.chunk_base = base;
        head.chunk_count = count;
        head.tail_len = tail;
    }
    head.commit(s.dir)?;
    crate::io::fault::crash_point("table.committed");
    let _ = s.dir.remove(&table_name(w.head.generation));
    w.head = head;
    w.records = head.records;
    w.chunk_count = head.chunk_count;
    w.tail_len = head.tail_len;
    w.table = table.file;
    // The records are where they were, but the writer's survey no longer
    // describes their order (a delete) or their chunks (a compaction).
    w.survey = None;
    if chunks.is_some() {
        w.tail = s.dir.open_rw(&chunk_name(Format::Native, ChunkId(head.last_chunk())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{Codec, Store};
    use std::sync::Arc;

    /// `fork()` used to wait for a whole compaction (the writer held the fork
    /// gate for the operation); now it waits for one group at most, and the
    /// child cannot write through the inherited handle (it would wait on a
    /// writer locked by a thread it does not have).
    #[test]
    fn fork_during_a_compaction_waits_for_one_group_not_the_whole() {
        let dir = tempfile::Builder::new().tempdir_in(crate::io::disk_scratch_dir()).unwrap();
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
        let child = crate::io::process::fork(|| {
            let refused = matches!(store.sync(), Err(crate::Error::ReadOnly(m)) if m.contains("forked child"));
            if refused {
                0
            } else {
                3
            }
        });
        // What the compaction had copied when fork returned: all of it if fork
        // waited for the whole operation.
        let copied = std::fs::metadata(&first_new).unwrap().len();
        let status = child.wait();
        compactor.join().unwrap();
        assert_eq!(status, Some(0), "the child was refused its write");
        let total = std::fs::metadata(&first_new).unwrap().len();
        assert!(copied < total, "fork waited for the whole compaction ({copied} of {total} bytes copied)");
        assert_eq!(store.len(), 4095);
    }
}
