//! Sealing: a store written once gets its table in format 2 without a copy
//! of its records.
//!
//! Compaction to format 2 copies every record into new chunks laid out the
//! way a sealed section describes them. A store whose appends already laid
//! them out that way needs only a new table: that is [`seal`]. Records of one
//! length, raw, fill every chunk with the same number of records from offset
//! 0 whenever the chunk size is the same for all (appends start a chunk at a
//! size, so it is): a fixed section. Any other records form a variable
//! section when each page's 340 records lie back to back in one chunk, which
//! appends guarantee when the writer was opened with
//! [`crate::StoreBuilder::sealable`] (a chunk then starts only at a page's
//! first record).
//!
//! What the records look like is learnt as they are appended ([`Survey`],
//! fed by the writer, so sealing 20 million labels reads no table entry), or,
//! for a store this handle did not write from empty, in one pass over the
//! table. The new table is a new generation committed exactly as a delete
//! commits its table: written, fsynced, then named by a new head, so a crash
//! leaves the old table or the new one, never a mix.
//!
//! A writer that surveys its records (a sealable one that opened an empty
//! store) also seals *as it goes* ([`as_you_go`]): once the format-1 entries
//! past the sealed section outgrow a sixteenth of the data and sealed table
//! (and 1 MiB), the table is sealed again over every record so far, and the
//! old generation's file, entries and all, is removed. A one-shot write
//! therefore never holds the 32-byte entries of all its records on disk:
//! 4 M int64 labels (32 MB) would otherwise need 128 MB of entries before
//! the final seal drops them. At any moment the store takes its data, its
//! sealed table, at most a sixteenth more in entries (and those of one
//! block of 1 MiB of input, after which the writer looks) and, while a
//! seal writes, the next sealed table beside the old.

use crate::error::{Error, Result};
use crate::format::codec::Codec;
use crate::format::names::table_name;
use crate::format::record::{ChunkId, Entry};
use crate::format::table::{Sealed, BLOCK_BYTES, VAR_MAX_RECORD, VAR_PER_PAGE};
use crate::write::compact::{commit_table, CompactReport};
use crate::write::new_table::TableOut;
use crate::write::Ctx;

/// Block checksums a survey keeps in memory (256 MiB of them, at least
/// 256 GiB of records): a larger store of fixed records is sealed as a
/// variable section (12 bytes a record of at least 4 KiB, under 0.3 % of
/// the data) rather than hold more.
const MAX_BLOCKS: usize = 1 << 26;

/// What sealing needs to know of a store's records, learnt one record at a
/// time in index order from record 0.
pub(crate) struct Survey {
    /// Records seen.
    records: u64,
    /// While every record fits a fixed section: its layout and checksums.
    fixed: Option<Fixed>,
    /// Whether every record so far fits a variable section.
    variable: bool,
    /// The chunk and end of the current variable page's last record.
    page_chunk: ChunkId,
    page_end: u64,
    /// Stored bytes of the records seen.
    bytes: u64,
}

/// A fixed section in the making.
struct Fixed {
    item_len: u32,
    block_records: u32,
    first_chunk: u32,
    /// Records in each chunk, known once the second chunk begins.
    chunk_records: Option<u64>,
    /// The checksums of the blocks finished, and of the block being filled.
    blocks: Vec<u32>,
    block: Option<u32>,
    /// Carries a block's CRC-32C over one more record (`None`: a block is
    /// one record).
    shift: Option<Box<Shift>>,
}

impl Default for Survey {
    fn default() -> Self {
        Survey { records: 0, fixed: None, variable: true, page_chunk: ChunkId(0), page_end: 0, bytes: 0 }
    }
}

impl Survey {
    /// Records seen so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The next record's entry.
    pub fn see(&mut self, e: &Entry) {
        let i = self.records;
        self.records += 1;
        self.bytes += u64::from(e.stored_len);
        let Some(crc) = e.checksum.filter(|_| !e.is_part()) else {
            // A block's entry or a loaderx record without a checksum:
            // neither section can say what its own checksum is.
            self.fixed = None;
            self.variable = false;
            return;
        };
        if i == 0 {
            self.fixed = Fixed::new(e);
        }
        if let Some(f) = &mut self.fixed {
            if !f.see(i, e, crc) {
                self.fixed = None;
            }
        }
        if self.variable {
            let len = u64::from(e.stored_len.max(e.logical_len));
            let joined = i.is_multiple_of(VAR_PER_PAGE) || (e.chunk == self.page_chunk && e.offset == self.page_end);
            self.variable = joined && len <= VAR_MAX_RECORD && e.end() <= u64::from(u32::MAX);
            (self.page_chunk, self.page_end) = (e.chunk, e.end());
        }
    }

    /// The section all the records seen fit in, if any: fixed where it can
    /// be (no entry per record), else variable.
    fn kind(&self) -> Option<Sealed> {
        if self.records == 0 {
            return None;
        }
        if let Some(f) = &self.fixed {
            return Some(Sealed::Fixed {
                item_len: f.item_len,
                block_records: f.block_records,
                chunk_records: f.chunk_records.unwrap_or(self.records),
                first_chunk: f.first_chunk,
            });
        }
        self.variable.then_some(Sealed::Variable)
    }
}

impl Fixed {
    fn new(e: &Entry) -> Option<Fixed> {
        let len = e.logical_len;
        if e.codec != Codec::Raw || len == 0 || e.stored_len != len || e.offset != 0 {
            return None;
        }
        let block_records = BLOCK_BYTES.div_ceil(u64::from(len)) as u32;
        Some(Fixed {
            item_len: len,
            block_records,
            first_chunk: e.chunk.0,
            chunk_records: None,
            blocks: Vec::new(),
            block: None,
            shift: (block_records > 1).then(|| Box::new(Shift::new(len as usize))),
        })
    }

    /// Whether record `i` (checksum `crc`) is where a fixed section would
    /// have it; folds it into its block's checksum.
    fn see(&mut self, i: u64, e: &Entry, crc: u32) -> bool {
        if e.codec != Codec::Raw || e.logical_len != self.item_len || e.stored_len != self.item_len {
            return false;
        }
        let r = match self.chunk_records {
            Some(n) => {
                if u64::from(e.chunk.0.wrapping_sub(self.first_chunk)) != i / n {
                    return false;
                }
                i % n
            }
            None if e.chunk.0 == self.first_chunk => i,
            None if i > 0 && e.chunk.0 == self.first_chunk.wrapping_add(1) => {
                self.chunk_records = Some(i);
                0
            }
            None => return false,
        };
        if e.offset != r * u64::from(self.item_len) {
            return false;
        }
        self.block = match (self.block, &self.shift) {
            (Some(c), Some(shift)) if !r.is_multiple_of(u64::from(self.block_records)) => Some(shift.apply(c) ^ crc),
            (last, _) => {
                self.blocks.extend(last);
                Some(crc)
            }
        };
        self.blocks.len() < MAX_BLOCKS
    }
}

/// The CRC-32C of `A ‖ B` from those of `A` and `B` for a `B` of one fixed
/// length `n`: `crc(A ‖ B) = Z(crc(A)) ^ crc(B)`, where `Z` runs the CRC's
/// register (without its pre- and post-inversion) over `n` zero bytes.
/// `Z` is linear over GF(2), so it is four table lookups, one per byte of its
/// argument, instead of a pass over `n` bytes.
struct Shift([[u32; 256]; 4]);

impl Shift {
    fn new(n: usize) -> Shift {
        let zeros = vec![0u8; n];
        let z = |x: u32| !crate::format::crc::crc32c_append(!x, &zeros);
        let mut t = [[0u32; 256]; 4];
        for (k, row) in t.iter_mut().enumerate() {
            for (b, v) in row.iter_mut().enumerate() {
                *v = z((b as u32) << (8 * k));
            }
        }
        Shift(t)
    }

    fn apply(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.0[0][usize::from(b[0])]
            ^ self.0[1][usize::from(b[1])]
            ^ self.0[2][usize::from(b[2])]
            ^ self.0[3][usize::from(b[3])]
    }
}

/// Format-1 entries past the sealed section below which [`as_you_go`]
/// never seals: a small store is sealed once, at its end.
const MIN_TAIL_BYTES: u64 = 1 << 20;

/// Whether the writer's format-1 entries have outgrown what [`as_you_go`]
/// lets them take: a sixteenth of the records' bytes and the sealed table,
/// and [`MIN_TAIL_BYTES`].
fn due(w: &crate::write::Writer) -> bool {
    let Some(survey) = &w.survey else { return false };
    if survey.records() != w.records || survey.kind().is_none() {
        return false;
    }
    let layout = w.head.layout;
    let tail = w.records.saturating_sub(layout.sealed).saturating_mul(crate::format::record::ENTRY_BYTES as u64);
    tail >= MIN_TAIL_BYTES && tail.saturating_mul(16) > survey.bytes.saturating_add(layout.tail_at)
}

/// Seals the table of a surveying writer again when its format-1 entries
/// are due ([module docs](self)), between two batches of an append: the
/// records appended so far are published, synced and sealed.
pub(crate) fn as_you_go(s: &Ctx<'_>, w: &mut crate::write::compact::Locked<'_>) -> Result<()> {
    if !due(w) {
        return Ok(());
    }
    crate::write::republish(s, w)?;
    seal_with(s, w).map(|_| ())
}

/// Rewrites the table of a format-1 store in format 2 when its records are
/// laid out as a sealed section needs ([module docs](self)); the records are
/// not touched. Syncs first. A store that is already format 2, empty, or
/// whose records do not fit (a chunk switched in a variable page's middle,
/// a record of 1 GiB or more) is left as it is; the report says which
/// (`format_after`).
pub(crate) fn seal(s: &Ctx<'_>) -> Result<CompactReport> {
    let mut w = s.writer()?;
    let r = seal_with(s, &mut w);
    crate::write::settle(s, &mut w, r)
}

fn seal_with(s: &Ctx<'_>, w: &mut crate::write::compact::Locked<'_>) -> Result<CompactReport> {
    w.sync(s.dir)?;
    let snap = s.snapshot();
    let records = snap.records();
    let bytes: u64 = snap.chunks.iter().map(|c| c.len).sum();
    let version = w.head.layout.version;
    let mut report = CompactReport {
        bytes_before: bytes,
        bytes_after: bytes,
        records: 0,
        format_before: version,
        format_after: version,
        table_bytes_before: snap.table.bytes(),
        table_bytes_after: snap.table.bytes(),
    };
    // A table sealed as it went is sealed again over the entries since.
    let resealable = w.survey.as_ref().is_some_and(|v| v.records() == records) && records > w.head.layout.sealed;
    if version != 1 && !resealable {
        return Ok(report);
    }
    let survey = match w.survey.take() {
        Some(v) if v.records() == records => v,
        _ => {
            snap.table.will_scan();
            let mut v = Survey::default();
            for i in 0..records {
                v.see(&snap.entry(i)?);
            }
            v
        }
    };
    let Some(kind) = survey.kind() else {
        // Still true of records 0.., whoever learnt it: later appends
        // extend it.
        w.survey = Some(survey);
        return Ok(report);
    };
    if matches!(kind, Sealed::Variable) && matches!(snap.table.sealed_kind(), Some(Sealed::Fixed { .. })) {
        // Records of another length after a fixed section: a variable
        // section needs each record's own checksum, which the fixed
        // section does not keep (only its blocks'), so it could only be
        // written by reading every record again. The store stays as it is
        // (a fixed section and format-1 entries after it), and the survey
        // goes: no later batch seals as it goes over it again.
        return Ok(report);
    }
    let gen = w.head.generation + 1;
    let written = (|| {
        let mut out = TableOut::create(s.dir, gen, Some(kind), records)?;
        match (kind, &survey.fixed) {
            (Sealed::Fixed { .. }, Some(f)) => {
                for c in f.blocks.iter().chain(&f.block) {
                    out.push_block(*c)?;
                }
                // A fixed section keeps no record's own checksum: the
                // fingerprint over them is the one the head holds.
                let content = match w.head.content_known() {
                    true => w.head.content,
                    false => crate::format::fingerprint::over_table(
                        crate::format::fingerprint::SEED,
                        &snap.table,
                        0,
                        records,
                    )?,
                };
                out.carry(records, content);
            }
            _ => {
                snap.table.will_scan();
                for i in 0..records {
                    out.push(&snap.entry(i)?)?;
                }
            }
        }
        out.finish()
    })();
    let table = match written {
        Ok(t) => t,
        Err(e) => {
            // Nothing committed: the new file is garbage.
            let _ = s.dir.remove(&table_name(gen));
            return match e {
                e @ Error::Io { op, .. } if op != "read" => w.poison(e),
                e => Err(e),
            };
        }
    };
    report.table_bytes_after = table.bytes;
    if let Err(e) = commit_table(s, w, table, None) {
        return w.poison(e);
    }
    // The records stay where they are: later appends extend the survey.
    w.survey = Some(survey);
    crate::write::republish(s, w)?;
    report.format_after = 2;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::Shift;
    use crate::format::crc::crc32c;
    use crate::{Codec, Store};

    /// The bytes of every file under `dir`.
    fn bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
    }

    /// Issue 36: a one-shot write of 4 M int64 labels (32 MB) peaked at
    /// 163 MB on disk, the 32-byte format-1 entry of every record, before
    /// the seal at its end dropped them. A writer that seals as it goes
    /// stays within 1.25x the store it leaves, measured after every block
    /// (where it looks), and leaves the same records, checksums and
    /// fingerprint as one sealed once at the end.
    #[test]
    fn a_one_shot_write_stays_within_a_quarter_over_the_store_it_leaves() {
        let (n, step) = (1u64 << 20, 1u64 << 17); // 8 MiB of labels, one 1 MiB block a call
        let labels = |from: u64| (from..from + step).flat_map(u64::to_le_bytes).collect::<Vec<u8>>();
        let dir = tempfile::tempdir().unwrap();
        let once = tempfile::tempdir().unwrap();
        let store = Store::builder(dir.path()).codec(Codec::Raw).sealable(true).create().unwrap();
        let plain = Store::builder(once.path()).codec(Codec::Raw).create().unwrap();
        let mut peak = 0;
        let mut formats = Vec::new();
        for from in (0..n).step_by(step as usize) {
            store.append_fixed(&labels(from), 8, None).unwrap();
            plain.append_fixed(&labels(from), 8, None).unwrap();
            peak = peak.max(bytes(dir.path()));
            formats.push(store.table_format().0);
        }
        assert!(formats.contains(&2), "sealed on the way: {formats:?}");
        assert_eq!(store.seal().unwrap().format_after, 2);
        assert_eq!(plain.seal().unwrap().format_after, 2);
        let end = bytes(dir.path());
        assert!(peak * 4 <= end * 5, "peak {peak} bytes for a store of {end}");
        assert_eq!(store.verify().unwrap().records, n);
        assert_eq!(store.fingerprint().unwrap(), plain.fingerprint().unwrap());
        assert_eq!(bytes(once.path()), end);
    }

    /// The block checksums of a fixed section are built from the records'
    /// own: the shift must give exactly the CRC of the concatenation.
    #[test]
    fn shifted_crcs_combine_into_the_crc_of_the_concatenation() {
        for n in [1usize, 3, 8, 12, 1000, 4095] {
            let shift = Shift::new(n);
            let data: Vec<u8> = (0..n * 9).map(|i| (i * 131 + 7) as u8).collect();
            let mut c = crc32c(&data[..n]);
            for k in 1..9 {
                c = shift.apply(c) ^ crc32c(&data[k * n..(k + 1) * n]);
                assert_eq!(c, crc32c(&data[..(k + 1) * n]), "{k} records of {n} bytes");
            }
        }
    }
}
