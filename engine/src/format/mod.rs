//! What is on disk: the head, the record table, a record's entry, the codecs,
//! the file names, the checksummed `schema.json`, and the content fingerprint
//! over the table. Nothing here
//! performs I/O beyond reading and writing these structures through
//! [`crate::io::fs`]; the byte layouts are drawn in `engine/DESIGN.md`.

pub(crate) mod codec;
#[allow(
    unsafe_code,
    reason = "the copy that checksums as it goes uses SIMD intrinsics; every block has its SAFETY argument"
)]
pub(crate) mod crc;
pub(crate) mod fingerprint;
pub(crate) mod head;
pub(crate) mod names;
pub(crate) mod record;
pub(crate) mod schema;
pub(crate) mod table;
