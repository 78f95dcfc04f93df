//! The names and numbers every file of a store is found by.

use crate::format::record::ChunkId;

/// Which on-disk layout a store has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// zring's own format (engine/DESIGN.md).
    Native,
    /// A store written by loaderx 0.7.3, read in place.
    Loaderx,
}

/// The newest format version this build reads and writes (head and table
/// headers). It reads and writes every version from 1 up: version 1 tables
/// hold a 32-byte entry per record; version 2 tables begin with a compact
/// sealed section written by compaction (`format/table.rs`).
pub const FORMAT_VERSION: u32 = 2;
/// The head: which table generation and chunk range are committed.
pub(crate) const HEAD_FILE: &str = "head.zr";
/// Bytes of a table file's header, before its first entry.
pub(crate) const TABLE_HEADER_BYTES: usize = 64;
/// The compression dictionary of `zstd_dict` records.
pub(crate) const DICT_FILE: &str = "dict.zr";
/// The single writer's advisory lock.
pub(crate) const LOCK_FILE: &str = "lock";
/// The file whose byte ranges readers lock to pin their snapshot's chunks
/// ([`crate::snapshot::pins`]).
pub(crate) const PINS_FILE: &str = "pins";
/// The Python layer's description of the records (dtype, shape, codec).
pub(crate) const SCHEMA_FILE: &str = "schema.json";
/// The Python layer's store of record names, one per record.
pub(crate) const NAMES_DIR: &str = "names";
/// A delete's intent while its records are committed and the record names
/// (`names/`) not yet: written and removed by the Python layer through
/// [`crate::Store::set_names_intent`].
pub(crate) const NAMES_INTENT_FILE: &str = "names.intent";
/// The record names of stores converted by earlier versions (one JSON list).
pub(crate) const LEGACY_NAMES_FILE: &str = "names.json";
/// loaderx 0.7.3: `meta.zr` is a 16-byte header and 16-byte entries.
pub(crate) const LOADERX_META: &str = "meta.zr";

/// The file of record table generation `generation`.
pub(crate) fn table_name(generation: u64) -> String {
    format!("table-{generation:06}.zr")
}

/// The file of chunk `id` in a store of layout `format`.
pub(crate) fn chunk_name(format: Format, id: ChunkId) -> String {
    match format {
        Format::Native => format!("chunk-{:06}.zr", id.0),
        Format::Loaderx => format!("{}.zr", id.0),
    }
}
