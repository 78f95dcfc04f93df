//! `schema.json`, the Python layer's description of the records (dtype,
//! shape, codec), with a checksum of its own.
//!
//! The engine treats the description as opaque JSON-object text, but a
//! flipped bit in it changes how every record is read (`"<f4"` becomes
//! `">f4"`: byte-swapped floats) while no record checksum sees it. So the
//! file carries a CRC-32C as its first member:
//!
//! ```text
//! {
//!   "crc32c": "1a2b3c4d",
//!   ...the caller's members, exactly as given...
//! }
//! ```
//!
//! The checksum covers the caller's text (the file without that member and
//! the comma after it), which is what [`decode`] returns, so the caller
//! never sees the member. The file stays JSON that loaderx and other
//! readers of the fields can parse.
//!
//! Files written before the checksum existed have no such member and are
//! read as they are: they begin with another key (zring always wrote
//! `"format"` first). A damaged checksum member must not pass for such an
//! old file, so a file whose first bytes are within [`MARK_DAMAGE_BITS`]
//! bits of the member's opening is reported damaged instead (`"format"`
//! is 21 bits away from `"crc32c"`). The caller checks an old file's
//! fields itself.

use std::path::Path;

use crate::error::{corrupted, Error, Result};
use crate::format::crc::crc32c;

/// How the checksum member opens, up to its 8 hex digits.
const MARK: &[u8] = b"{\n  \"crc32c\": \"";
/// Hex digits of the checksum.
const HEX: usize = 8;
/// A file whose first `MARK.len()` bytes differ from [`MARK`] in this many
/// bits or fewer is a checksummed file with damage there, not an old file.
const MARK_DAMAGE_BITS: u32 = 3;

/// The file's bytes for the caller's JSON-object text `body`.
pub(crate) fn encode(body: &str) -> Result<Vec<u8>> {
    let body = body.trim_start();
    let Some(members) = body.strip_prefix('{') else {
        return Err(Error::InvalidArgument(format!(
            "a schema must be a JSON object (text starting with '{{'), got {:?}",
            body.chars().take(20).collect::<String>()
        )));
    };
    let mut out = Vec::with_capacity(MARK.len() + HEX + 2 + body.len());
    out.extend_from_slice(MARK);
    out.extend_from_slice(format!("{:08x}\"", crc32c(body.as_bytes())).as_bytes());
    if !members.trim_start().starts_with('}') {
        out.push(b',');
    }
    out.extend_from_slice(members.as_bytes());
    Ok(out)
}

/// The caller's text from the bytes of the file at `path`; damage is
/// [`Error::Corrupted`] naming the file.
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<String> {
    let bad = |detail: String| corrupted(path.display().to_string(), detail);
    let text =
        std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8 text (byte {} is not)", e.valid_up_to())))?;
    let Some(rest) = text.strip_prefix(std::str::from_utf8(MARK).expect("ASCII")) else {
        let head = bytes.get(..MARK.len());
        let bits = head.map(|h| h.iter().zip(MARK).map(|(a, b)| (a ^ b).count_ones()).sum::<u32>());
        if bits.is_some_and(|b| b <= MARK_DAMAGE_BITS) {
            return Err(bad(format!("its checksum member (bytes 0..{}) is damaged", MARK.len())));
        }
        // Written before schema files had a checksum.
        return Ok(text.to_string());
    };
    let at = MARK.len();
    let stored = rest
        .get(..HEX)
        // Lower case only, as written: a flipped case bit is damage too.
        .filter(|h| h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| bad(format!("its checksum (bytes {at}..{}) is not {HEX} lower-case hex digits", at + HEX)))?;
    let members = rest[HEX..]
        .strip_prefix('"')
        .ok_or_else(|| bad(format!("byte {} should close the checksum with '\"'", at + HEX)))?;
    let members = members.strip_prefix(',').unwrap_or(members);
    let body = format!("{{{members}");
    let got = crc32c(body.as_bytes());
    if got != stored {
        return Err(bad(format!(
            "the text after its checksum member (bytes {}..{}) has checksum {got:08x}, the file stores {stored:08x}",
            at + HEX + 1,
            bytes.len()
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "{\n  \"format\": \"loaderx-zrecord\",\n  \"version\": 1,\n  \"dtype\": \"<f4\",\n  \"shape\": [\n    3\n  ],\n  \"codec\": \"raw\"\n}\n";

    #[test]
    fn round_trips_and_every_flipped_bit_is_caught() {
        let p = Path::new("s/schema.json");
        let file = encode(BODY).unwrap();
        assert!(file.starts_with(b"{\n  \"crc32c\": \""));
        assert_eq!(decode(p, &file).unwrap(), BODY);
        let v: serde_json::Value = serde_json::from_slice(&file).expect("the file is JSON");
        assert_eq!(v["dtype"], "<f4");
        for bit in 0..file.len() * 8 {
            let mut b = file.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            match decode(p, &b) {
                Err(Error::Corrupted { what, .. }) => assert_eq!(what, "s/schema.json", "bit {bit}"),
                other => panic!("flip of bit {bit} gave {other:?}"),
            }
        }
    }

    #[test]
    fn empty_objects_and_old_files() {
        let p = Path::new("schema.json");
        for body in ["{}", "{ }\n"] {
            let file = encode(body).unwrap();
            serde_json::from_slice::<serde_json::Value>(&file).expect("JSON");
            assert_eq!(decode(p, &file).unwrap(), body);
        }
        // A file written before the checksum, as zring and loaderx wrote them.
        assert_eq!(decode(p, BODY.as_bytes()).unwrap(), BODY);
        let loaderx = "{\"format\": \"loaderx-zrecord\", \"dtype\": \"<i8\"}";
        assert_eq!(decode(p, loaderx.as_bytes()).unwrap(), loaderx);
        assert!(matches!(encode("[1]"), Err(Error::InvalidArgument(_))));
        assert!(matches!(decode(p, b"{\"a\": \"\xff\"}"), Err(Error::Corrupted { .. })));
    }
}
