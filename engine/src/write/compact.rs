//! Delete and compact: the operations that rewrite the record table.
//!
//! Both write a new table generation (and compaction new chunk files), make
//! them durable, and only then commit a head naming them. Files of the old
//! state are removed after the commit; a crash in between leaves files that
//! [`crate::write::recover`] removes.

use std::fs::File;
use std::io::Write;

use crate::error::{io_err, Result};
use crate::format::head::Head;
use crate::format::names::chunk_name;
use crate::format::names::{table_name, TABLE_HEADER_BYTES};
use crate::format::record::{check_index, ChunkId, Entry, ENTRY_BYTES};
use crate::format::table::{table_header, Format};
use crate::io::fs;
use crate::read::gather::Item;
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
}

/// Sequential writer of compaction's new chunk files.
struct NewChunks<'a> {
    dir: &'a std::path::Path,
    base: u32,
    /// Chunks finished so far.
    count: u32,
    /// Bytes in the current chunk.
    len: u64,
    target: u64,
    file: Option<std::io::BufWriter<File>>,
}

impl NewChunks<'_> {
    fn path(&self) -> std::path::PathBuf {
        self.dir.join(chunk_name(Format::Native, ChunkId(self.base + self.count)))
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(ChunkId, u64)> {
        if self.file.is_some() && self.len > 0 && self.len + bytes.len() as u64 > self.target {
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
    let mut bytes = snap.table.entry_bytes()?;
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
    let gen = w.head.generation + 1;
    let r = commit_table(s, &mut w, gen, &bytes, None);
    match r {
        Ok(()) => crate::write::republish(s, &w),
        Err(e) => w.poison(e),
    }
}

/// Reclaims the bytes of deleted records: copies every live record, in
/// index order, into new chunk files, then commits a table naming them and
/// removes the old files. Needs free space for the live data. Concurrent
/// gathers keep reading the old files through their snapshot.
pub(crate) fn compact(s: &Store) -> Result<CompactReport> {
    let mut w = s.writer()?;
    w.sync(&s.dir)?;
    let snap = s.snapshot();
    let before: u64 = snap.chunks.iter().map(|c| c.len).sum();
    let mut live = 0u64;
    let mut entries = Vec::with_capacity(snap.records() as usize);
    for i in 0..snap.records() {
        let e = snap.entry(i)?;
        live += u64::from(e.stored_len);
        entries.push(e);
    }
    if live == before {
        return Ok(CompactReport { bytes_before: before, bytes_after: before, records: 0 });
    }
    let base = w.head.chunk_base + w.head.chunk_count;
    let mut out = NewChunks { dir: &s.dir, base, count: 0, len: 0, target: w.head.chunk_target, file: None };
    let mut table = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    let r: Result<()> = (|| {
        let mut start = 0usize;
        while start < entries.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < entries.len()
                && (end == start || bytes + u64::from(entries[end].stored_len) <= COMPACT_GROUP_BYTES)
            {
                bytes += u64::from(entries[end].stored_len);
                end += 1;
            }
            let mut buf = vec![0u8; bytes as usize];
            let mut items = Vec::with_capacity(end - start);
            let mut rest: &mut [u8] = &mut buf;
            for (k, e) in entries[start..end].iter().enumerate() {
                let (slot, tail) = std::mem::take(&mut rest).split_at_mut(e.stored_len as usize);
                rest = tail;
                items.push(Item {
                    index: (start + k) as u64,
                    entry: *e,
                    dst: slot,
                    keep_stored: true,
                    next: crate::read::cache::NextUse::Unknown,
                });
            }
            crate::read::gather::read_items(s, &snap, items)?;
            let mut pos = 0usize;
            for e in &entries[start..end] {
                let n = e.stored_len as usize;
                let (id, offset) = out.put(&buf[pos..pos + n])?;
                pos += n;
                table.extend_from_slice(&Entry { chunk: id, offset, ..*e }.encode());
            }
            start = end;
            // A fork waits for this group, not the whole compaction.
            w.yield_to_fork();
        }
        out.finish()
    })();
    if let Err(e) = r {
        // Nothing committed: the new chunks are garbage, removed now or by
        // the next writer's recovery.
        for k in 0..=out.count {
            let _ = fs::remove(&s.dir.join(chunk_name(Format::Native, ChunkId(base + k))));
        }
        // The committed state is untouched, but what the failed write or
        // fsync left on the device is unknown: refuse further writes.
        return w.poison(e);
    }
    crate::io::fault::crash_point("compact.copied");
    let gen = w.head.generation + 1;
    let new_chunks = (base, out.count + 1, out.len);
    let old = (w.head.chunk_base, w.head.chunk_count);
    if let Err(e) = commit_table(s, &mut w, gen, &table, Some(new_chunks)) {
        return w.poison(e);
    }
    // Republished first, so this handle's own old snapshot no longer pins
    // the old chunks (gathers still running on it do, and keep them).
    crate::write::republish(s, &w)?;
    let deferred = std::mem::take(&mut w.deferred);
    w.remove_old_chunks(&s.dir, deferred.into_iter().chain(old.0..old.0 + old.1));
    // The old chunks are gone: their records can never be asked for again.
    s.reads.forget();
    Ok(CompactReport { bytes_before: before, bytes_after: live, records: entries.len() as u64 })
}

/// Writes table generation `gen` holding `entries`, makes it (and any
/// pending data) durable, commits a head naming it, and removes the old
/// table. `chunks` = (base, count, tail length) when compaction replaced them.
pub(crate) fn commit_table(
    s: &Store,
    w: &mut Writer,
    gen: u64,
    entries: &[u8],
    chunks: Option<(u32, u32, u64)>,
) -> Result<()> {
    let tp = s.dir.join(table_name(gen));
    let mut f = crate::io::fs::create(&tp)?;
    let mut bytes = Vec::with_capacity(entries.len() + TABLE_HEADER_BYTES);
    bytes.extend_from_slice(&table_header(gen));
    bytes.extend_from_slice(entries);
    fs::write_all(&mut f, &tp, 0, &bytes)?;
    fs::fsync(&f, &tp)?;
    crate::io::fault::crash_point("table.written");
    w.sync(&s.dir)?;
    fs::fsync_dir(&s.dir)?;
    let mut head = Head {
        generation: gen,
        records: (entries.len() / ENTRY_BYTES) as u64,
        content: crate::format::fingerprint::over_entries(crate::format::fingerprint::SEED, entries),
        ..w.head
    };
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
