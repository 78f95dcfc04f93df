//! Helpers shared by the fuzz targets: writing store files byte by byte, so a
//! target can hand the engine headers and entries that pass (or fail) exactly
//! the checks it wants to reach past.
//!
//! The layouts mirror engine/DESIGN.md (format version 1, little-endian).

use std::path::Path;

/// Format version the engine reads.
pub const VERSION: u32 = 1;
/// Bytes of a table entry.
pub const ENTRY_BYTES: usize = 32;
/// Bytes of the head and of the table header.
pub const HEADER_BYTES: usize = 64;
/// Largest record length a target lets the engine decode into memory.
pub const MAX_LOGICAL: u64 = 1 << 20;

/// The fields of `head.zr`.
#[derive(Clone, Copy, Debug, arbitrary::Arbitrary)]
pub struct Head {
    pub generation: u64,
    pub records: u64,
    pub chunk_base: u32,
    pub chunk_count: u32,
    pub tail_len: u64,
    pub dict_len: u32,
    pub dict_crc: u32,
    pub chunk_target: u64,
}

fn seal(b: &mut [u8; HEADER_BYTES]) {
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
}

impl Head {
    /// The 64 head bytes, with a valid checksum.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(b"ZRNG");
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.records.to_le_bytes());
        b[24..28].copy_from_slice(&self.chunk_base.to_le_bytes());
        b[28..32].copy_from_slice(&self.chunk_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.tail_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.dict_len.to_le_bytes());
        b[44..48].copy_from_slice(&self.dict_crc.to_le_bytes());
        b[48..56].copy_from_slice(&self.chunk_target.to_le_bytes());
        seal(&mut b);
        b
    }
}

/// A table file header for `generation`, with a valid checksum.
pub fn table_header(generation: u64) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[0..4].copy_from_slice(b"ZRTB");
    b[4..8].copy_from_slice(&VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..20].copy_from_slice(&(ENTRY_BYTES as u32).to_le_bytes());
    seal(&mut b);
    b
}

/// One table entry's fields.
#[derive(Clone, Copy, Debug, arbitrary::Arbitrary)]
pub struct Entry {
    pub offset: u64,
    pub chunk: u32,
    pub stored_len: u32,
    pub logical_len: u32,
    pub crc: u32,
    pub codec: u8,
}

impl Entry {
    /// The 32 entry bytes, with a valid entry checksum.
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.chunk.to_le_bytes());
        b[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.logical_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.crc.to_le_bytes());
        b[24] = self.codec;
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// File name of table generation `g`.
pub fn table_name(g: u64) -> String {
    format!("table-{g:06}.zr")
}

/// File name of chunk `id`.
pub fn chunk_name(id: u32) -> String {
    format!("chunk-{id:06}.zr")
}

/// Writes `bytes` to `dir/name`.
pub fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).expect("write fuzz input file");
}

/// Opens `dir` read-only and exercises every read path on what it finds:
/// stats, lengths, gathers (one by one and as a batch, fixed and ragged) and,
/// when the decoded total is bounded, verify. Every call may fail; none may
/// panic. Returns the records read when every read and verify succeeded.
pub fn read_everything(dir: &Path) -> Option<Vec<Vec<u8>>> {
    let store = zring_engine::Store::open(dir).ok()?;
    let _ = store.stats();
    let n = store.len().min(256);
    let idx: Vec<u64> = (0..n).collect();
    let mut lens = vec![0u64; idx.len()];
    store.lengths(&idx, &mut lens).ok()?;
    let total: u64 = lens.iter().sum();
    if lens.iter().any(|&l| l > MAX_LOGICAL) || total > 16 * MAX_LOGICAL {
        return None;
    }
    let mut out = Vec::with_capacity(idx.len());
    let mut all_ok = true;
    for (&i, &l) in idx.iter().zip(&lens) {
        let mut dst = vec![0u8; l as usize];
        match store.gather(&zring_engine::Gather::fixed(&[i], l as usize), &mut dst) {
            Ok(()) => out.push(dst),
            Err(_) => all_ok = false,
        }
    }
    let mut offsets = Vec::with_capacity(idx.len());
    let mut at = 0u64;
    for &l in &lens {
        offsets.push(at);
        at += l;
    }
    let mut dst = vec![0u8; at as usize];
    let ragged = store.gather(&zring_engine::Gather::ragged(&idx, &offsets), &mut dst);
    // verify decodes every record, even empty ones (a gather with stride 0
    // reads nothing, so it cannot vouch for them).
    let verified = if store.len() <= 256 { store.verify().map(drop) } else { Ok(()) };
    if !all_ok || ragged.is_err() || verified.is_err() {
        return None;
    }
    // A batch must give what single reads gave.
    assert_eq!(dst, out.concat(), "gather_var differs from single gathers");
    Some(out)
}
