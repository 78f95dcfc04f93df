//! Whole-store operations: statistics, verification, the dictionary, the
//! schema file, and conversion from loaderx.

use std::path::Path;
use std::sync::Arc;

use crate::error::{io_err, Error, Result};
use crate::format::codec::{Codec, Dict};
use crate::format::names::{DICT_FILE, SCHEMA_FILE};
use crate::format::table::Format;
use crate::read::item::{carve, Want};
use crate::write::append::{Block, Meta};
use crate::write::Ctx;

/// Records verified per batch.
const VERIFY_BATCH: u64 = 4096;

/// Numbers describing a store; see `Store::stats`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// On-disk layout.
    pub format: Format,
    /// The table's format version: 1 (32 bytes per record), 2 (a sealed
    /// section of 12 bytes per record, or none for raw records of one
    /// length, then 32 per record appended since), 0 for loaderx stores.
    pub table_format: u32,
    /// Bytes of the record table (metadata: head and dictionary excluded).
    pub table_bytes: u64,
    /// Number of records.
    pub records: u64,
    /// Sum of the records' decoded lengths.
    pub logical_bytes: u64,
    /// Sum of the records' stored lengths.
    pub live_bytes: u64,
    /// Bytes in the chunk files (committed part).
    pub chunk_bytes: u64,
    /// `chunk_bytes - live_bytes`: what `Store::compact` would reclaim.
    pub reclaimable: u64,
    /// Number of chunk files.
    pub chunks: u64,
    /// Whether a zstd dictionary is installed.
    pub has_dict: bool,
    /// Size of the dictionary.
    pub dict_bytes: u64,
    /// Records stored raw.
    pub raw_records: u64,
    /// Records stored as plain zstd.
    pub zstd_records: u64,
    /// Records stored as zstd with the dictionary.
    pub zstd_dict_records: u64,
    /// The I/O backend ("io_uring" or "pread").
    pub backend: &'static str,
    /// Whether reads use O_DIRECT.
    pub direct: bool,
}

/// What `Store::verify` checked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Records read, checksummed and decoded.
    pub records: u64,
    /// Stored bytes read.
    pub stored_bytes: u64,
    /// Decoded bytes produced.
    pub logical_bytes: u64,
}

/// Decodes every compressed record of an import batch (stored bytes back to
/// back in `buf`) on the decode pool; the first that fails is the error.
fn verify_imported(
    buf: &[u8],
    entries: &[crate::format::record::Entry],
    first: u64,
    dict: Option<&crate::format::codec::Dict>,
    src: &Path,
) -> Result<()> {
    use rayon::prelude::*;
    let mut starts = Vec::with_capacity(entries.len());
    let mut pos = 0usize;
    for e in entries {
        starts.push(pos);
        pos += e.stored_len as usize;
    }
    crate::pool::get().install(|| {
        entries.par_iter().zip(starts.par_iter()).enumerate().try_for_each_init(Vec::new, |out, (k, (e, &at))| {
            let stored = &buf[at..at + e.stored_len as usize];
            out.resize(e.logical_len as usize, 0);
            crate::format::codec::decode(e.codec, stored, out, dict).map_err(|why| {
                crate::error::corrupted(
                    format!("record {} of loaderx store {}", first + k as u64, src.display()),
                    format!("{why}; not imported"),
                )
            })
        })
    })
}

/// Copies the records, dictionary and schema of the loaderx store `from`
/// into the new store `to` ([`crate::import_loaderx`]).
pub(crate) fn import(from: &Ctx<'_>, to: &Ctx<'_>) -> Result<()> {
    let snap = from.snapshot();
    if let Some(d) = &snap.dict {
        install_dict(to, d.bytes.clone())?;
    }
    let mut start = 0u64;
    while start < snap.records() {
        let mut end = start;
        let mut bytes = 0u64;
        let mut entries = Vec::new();
        while end < snap.records() && (end == start || bytes < 64 << 20) {
            let e = snap.entry(end)?;
            bytes += u64::from(e.stored_len);
            entries.push(e);
            end += 1;
        }
        let mut buf = vec![0u8; bytes as usize];
        let items = carve(&mut buf, (start..).zip(&entries).map(|(i, e)| Want::stored(i, *e)));
        crate::read::gather::read_items(&from.read_ctx(), &snap, items, true)?;
        verify_imported(&buf, &entries, start, snap.dict.as_deref(), from.dir.path())?;
        let records = entries
            .iter()
            .scan(0usize, |pos, e| {
                let b = &buf[*pos..*pos + e.stored_len as usize];
                *pos += b.len();
                Some(Meta {
                    stored_len: e.stored_len,
                    logical_len: e.logical_len,
                    codec: e.codec,
                    crc: crate::format::crc::crc32c(b),
                })
            })
            .collect();
        let mut w = to.writer()?;
        crate::write::write_blocks(to, &mut w, &[Block { bytes: std::borrow::Cow::Borrowed(&buf), records }])?;
        crate::write::republish(to, &w)?;
        drop(w);
        start = end;
    }
    if let Some(schema) = schema(from)? {
        set_schema(to, &schema)?;
    }
    Ok(())
}

/// Counts records, bytes and codecs (a scan of the table, no data reads).
pub(crate) fn stats(s: &Ctx<'_>) -> Result<Stats> {
    let snap = s.snapshot();
    let (table_format, table_bytes) = snap.table_format();
    snap.table.will_scan();
    let mut s = Stats {
        format: snap.table.format,
        table_format,
        table_bytes,
        records: snap.records(),
        logical_bytes: 0,
        live_bytes: 0,
        chunk_bytes: snap.chunks.iter().map(|c| c.len).sum(),
        reclaimable: 0,
        chunks: snap.chunks.len() as u64,
        has_dict: snap.dict.is_some(),
        dict_bytes: snap.dict.as_ref().map_or(0, |d| d.bytes.len() as u64),
        raw_records: 0,
        zstd_records: 0,
        zstd_dict_records: 0,
        backend: s.backend.name(),
        direct: s.reads.direct(),
    };
    for i in 0..snap.records() {
        let e = snap.entry(i)?;
        s.logical_bytes += u64::from(e.logical_len);
        s.live_bytes += u64::from(e.own_len());
        match e.codec {
            Codec::Raw => s.raw_records += 1,
            Codec::Zstd => s.zstd_records += 1,
            Codec::ZstdDict => s.zstd_dict_records += 1,
        }
    }
    s.reclaimable = s.chunk_bytes.saturating_sub(s.live_bytes);
    Ok(s)
}

/// Reads every record, checks its checksum and decodes it: the explicit
/// full scan that `open` does not do. The first damaged record is the error.
pub(crate) fn verify(s: &Ctx<'_>) -> Result<VerifyReport> {
    let snap = s.snapshot();
    let mut rep = VerifyReport { records: 0, stored_bytes: 0, logical_bytes: 0 };
    let mut buf = Vec::new();
    let mut start = 0;
    while start < snap.records() {
        let end = (start + VERIFY_BATCH).min(snap.records());
        let entries = (start..end).map(|i| snap.entry(i)).collect::<Result<Vec<_>>>()?;
        let total: usize = entries.iter().map(|e| e.logical_len as usize).sum();
        buf.resize(total, 0);
        for e in &entries {
            rep.stored_bytes += u64::from(e.own_len());
            rep.logical_bytes += u64::from(e.logical_len);
        }
        let items = carve(&mut buf, (start..).zip(&entries).map(|(i, e)| Want::logical(i, *e)));
        crate::read::gather::read_items_by_block(&s.read_ctx(), &snap, items)?;
        rep.records += end - start;
        start = end;
    }
    Ok(rep)
}

/// Whether the store has a zstd dictionary.
pub(crate) fn has_dict(s: &Ctx<'_>) -> bool {
    s.snapshot().dict.is_some()
}

/// Trains a zstd dictionary of at most `max_size` bytes on `samples`,
/// stores it durably and installs it for `zstd_dict` appends. A store has
/// at most one dictionary, fixed once trained. Returns its size.
pub(crate) fn train_dict(s: &Ctx<'_>, samples: &[&[u8]], max_size: usize) -> Result<usize> {
    if samples.is_empty() || max_size < 256 {
        return Err(Error::InvalidArgument(format!(
            "train_dict needs samples and a max_size of at least 256 bytes (got {} samples, max_size {max_size})",
            samples.len()
        )));
    }
    let bytes = zstd::dict::from_samples(samples, max_size)
        .map_err(|e| Error::InvalidArgument(format!("zstd could not train a dictionary from these samples: {e}")))?;
    install_dict(s, bytes)
}

/// Installs dictionary bytes (trained here or copied from another store).
pub(crate) fn install_dict(s: &Ctx<'_>, bytes: Vec<u8>) -> Result<usize> {
    let mut w = s.writer()?;
    if w.head.dict_len != 0 {
        return Err(Error::InvalidArgument(
            "the store already has a dictionary; records encoded with it depend on it, so it cannot be replaced".into(),
        ));
    }
    let dict = Dict::new(bytes, Some(s.dict_level))?;
    let n = dict.bytes.len();
    s.dir.write_atomic(DICT_FILE, &dict.bytes)?;
    // Pending appends are made durable and committed first; then a head
    // naming the dictionary.
    w.sync(s.dir)?;
    let head =
        crate::format::head::Head { dict_len: n as u32, dict_crc: crate::format::crc::crc32c(&dict.bytes), ..w.head };
    if let Err(e) = head.commit(s.dir) {
        return w.poison(e);
    }
    w.head = head;
    let old = s.snapshot();
    s.publish(crate::snapshot::Snapshot {
        pin: old.pin.clone(),
        table: Arc::new(crate::format::table::Table::open_native(s.dir, w.head.generation, w.head.layout, w.records)?),
        chunk_base: old.chunk_base,
        chunks: old.chunks.clone(),
        dict: Some(Arc::new(dict)),
        known: (w.head.records, w.head.content),
        content: Default::default(),
    });
    Ok(n)
}

/// The contents of `schema.json`, the Python layer's metadata, if any,
/// checked against its checksum ([`crate::format::schema`]).
pub(crate) fn schema(s: &Ctx<'_>) -> Result<Option<String>> {
    let p = s.dir.join(SCHEMA_FILE);
    match s.dir.read(SCHEMA_FILE) {
        Ok(b) => crate::format::schema::decode(&p, &b).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", &p)(e)),
    }
}

/// The names intent's bytes ([`crate::Store::names_intent`]), if any.
pub(crate) fn names_intent(s: &Ctx<'_>) -> Result<Option<Vec<u8>>> {
    use crate::format::names::NAMES_INTENT_FILE;
    match s.dir.read(NAMES_INTENT_FILE) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", s.dir.join(NAMES_INTENT_FILE))(e)),
    }
}

/// Writes (atomically) or durably removes the names intent.
pub(crate) fn set_names_intent(s: &Ctx<'_>, bytes: Option<&[u8]>) -> Result<()> {
    use crate::format::names::NAMES_INTENT_FILE;
    let _w = s.writer()?;
    match bytes {
        Some(b) => s.dir.write_atomic(NAMES_INTENT_FILE, b),
        None => {
            match s.dir.remove(NAMES_INTENT_FILE) {
                Ok(()) => {}
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            s.dir.fsync()
        }
    }
}

/// Replaces `schema.json` atomically, with a checksum.
pub(crate) fn set_schema(s: &Ctx<'_>, json: &str) -> Result<()> {
    let bytes = crate::format::schema::encode(json)?;
    let _w = s.writer()?;
    s.dir.write_atomic(SCHEMA_FILE, &bytes)
}
