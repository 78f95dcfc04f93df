//! The manifest of a dataset of parts: its form on disk, read through the
//! dataset folder's descriptor.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{corrupted, Error, Result};
use crate::format::fingerprint::Fingerprint;
use crate::io::fs::Dir;

/// The manifest's file name, at the dataset's root.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Committed parts' folder, in the dataset's.
pub const PARTS_DIR: &str = "parts";
/// Staged parts' folder, in the dataset's.
pub const STAGING_DIR: &str = "staging";
/// Marks of dropped parts, in the dataset's.
pub const DROPPED_DIR: &str = "dropped";
/// The manifest's `format` member.
pub(crate) const FORMAT: &str = "zring-parts";
/// The manifest version this build writes and reads.
pub(crate) const VERSION: u64 = 1;
/// The content of a dataset of no parts ("ZRPT" read as a number).
pub(crate) const SEED: u32 = 0x5450_525a;

/// One committed part as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartEntry {
    /// The part's store directory, relative to the dataset's root.
    pub dir: String,
    /// Records in the part.
    pub records: u64,
    /// The part's fingerprint content, 8 lower-case hex digits.
    pub content: String,
    /// The records' decoded bytes (for a token store, tokens times their
    /// size): what ranks are balanced by ([`placement_weights`]). Absent
    /// from manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl PartEntry {
    /// The entry of a part whose fingerprint is `fp`.
    pub fn new(dir: impl Into<String>, fp: Fingerprint) -> PartEntry {
        PartEntry { dir: dir.into(), records: fp.records, content: format!("{:08x}", fp.content), bytes: None }
    }

    /// Whether `other` lists the same part: its folder, records and content
    /// (its recorded bytes aside).
    pub fn same_part(&self, other: &PartEntry) -> bool {
        self.dir == other.dir && self.records == other.records && self.content == other.content
    }

    /// The fingerprint the entry records.
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        let content =
            u32::from_str_radix(&self.content, 16).ok().filter(|_| self.content.len() == 8).ok_or_else(|| {
                Error::InvalidArgument(format!("part {}: content {:?} is not 8 hex digits", self.dir, self.content))
            })?;
        Ok(Fingerprint { records: self.records, content })
    }
}

/// The manifest of a dataset of parts (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"zring-parts"`.
    pub format: String,
    /// The manifest version.
    pub version: u64,
    /// Commits so far (the first commit writes 1).
    pub generation: u64,
    /// The parts' `schema.json` members but `"codec"`, or `null` for raw
    /// stores.
    pub schema: Value,
    /// The committed parts, in order.
    pub parts: Vec<PartEntry>,
}

impl Manifest {
    /// A manifest of `parts` at `generation`.
    pub fn new(generation: u64, schema: Value, parts: Vec<PartEntry>) -> Manifest {
        Manifest { format: FORMAT.into(), version: VERSION, generation, schema, parts }
    }

    /// Records in all parts.
    pub fn records(&self) -> u64 {
        self.parts.iter().map(|p| p.records).sum()
    }

    /// The manifest as stored: pretty JSON with its CRC-32C member first.
    /// What a commit writes to `manifest.json`, locally or in a bucket.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_string_pretty(self).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        crate::format::schema::encode(&(body + "\n"))
    }

    /// A manifest read from the bytes of `manifest.json` (found at `path`,
    /// which errors name), checked as [`read_manifest`] checks it.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        parse(path, bytes)
    }
}

/// What each part weighs when parts are placed on ranks
/// ([`assign_ranks`](super::assign_ranks)): its decoded bytes when the
/// manifest records them for every part (so ranks of a token store hold
/// about as many tokens each; for fixed-size records bytes are records
/// times one size), else its records (manifests written before bytes were
/// recorded, and their appends, keep the placement they had).
pub fn placement_weights(m: &Manifest) -> Vec<u64> {
    if m.parts.iter().all(|p| p.bytes.is_some()) {
        m.parts.iter().map(|p| p.bytes.unwrap_or(0)).collect()
    } else {
        m.parts.iter().map(|p| p.records).collect()
    }
}

/// Whether `dir` holds a dataset of parts (a manifest).
pub fn is_parts(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// The most bytes a manifest may hold (about 10 million parts): a larger
/// file at the name is refused, not read.
const MANIFEST_MAX: u64 = 1 << 30;

/// The manifest of the dataset at `dir`, checked against its checksum.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let root = match Dir::open(dir) {
        Ok(d) => d,
        Err(Error::Io { source, .. }) if matches!(source.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
            return Err(Error::NotAStore { path: dir.to_path_buf(), reason: "no such directory".into() })
        }
        Err(e) => return Err(e),
    };
    read_manifest_in(&root)?.ok_or_else(|| missing_manifest(&root))
}

/// The error for a folder without a manifest: a dataset of parts whose
/// manifest was removed (its `parts/` or `staging/` folders are there), or
/// a folder that is no dataset.
pub(crate) fn missing_manifest(root: &Dir) -> Error {
    let held = [PARTS_DIR, STAGING_DIR].iter().any(|n| root.exists(n));
    let reason = if held {
        format!(
            "{MANIFEST_FILE} is missing, but the folder holds the parts/ or staging/ of a dataset of parts: restore \
             {MANIFEST_FILE} from a copy (the parts are unchanged; no commit starts a new dataset over them)"
        )
    } else {
        format!("no {MANIFEST_FILE}: not a dataset of parts (commit parts to make one)")
    };
    Error::NotAStore { path: root.path().to_path_buf(), reason }
}

/// The manifest in the dataset folder `root` (read through its descriptor,
/// never through a link, never waiting on a FIFO), or `None` when there is
/// none.
pub(crate) fn read_manifest_in(root: &Dir) -> Result<Option<Manifest>> {
    let path = root.join(MANIFEST_FILE);
    let Some(bytes) = root.read_small(MANIFEST_FILE, MANIFEST_MAX)? else { return Ok(None) };
    // Only a commit writes the manifest: one edited or damaged is restored,
    // never repaired in place (its parts are still there).
    parse(&path, &bytes).map(Some)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    let path = path.to_path_buf();
    const RESTORE: &str = "restore manifest.json from a copy or undo the edit (only zring.parts.commit \
                           writes it; the parts it lists are unchanged)";
    let bad = |detail: String| corrupted(path.display().to_string(), format!("{detail}; {RESTORE}"));
    let text = crate::format::schema::decode(&path, bytes).map_err(|e| match e {
        Error::Corrupted { detail, .. } => bad(detail),
        other => other,
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| bad(format!("not a manifest: {e}")))?;
    if m.format != FORMAT {
        return Err(bad(format!("format {:?}, expected {FORMAT:?}", m.format)));
    }
    if m.version != VERSION {
        return Err(Error::UnsupportedVersion { path, found: m.version as u32, supported: VERSION as u32 });
    }
    for p in &m.parts {
        p.fingerprint().map_err(|e| bad(e.to_string()))?;
        if !relative_inside(&p.dir) {
            return Err(bad(format!("part directory {:?} is not a relative path inside the dataset", p.dir)));
        }
    }
    Ok(m)
}

/// Whether `dir` is a relative path that stays inside the dataset.
pub(crate) fn relative_inside(dir: &str) -> bool {
    let p = Path::new(dir);
    !dir.is_empty() && p.components().all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The schema a part's `schema.json` text describes, as a manifest keeps
/// it: every member but `"codec"`; `null` for a store without one.
pub fn schema_of(text: Option<&str>, path: &Path) -> Result<Value> {
    let Some(text) = text else { return Ok(Value::Null) };
    let mut v: Value = serde_json::from_str(text)
        .map_err(|e| corrupted(path.join("schema.json").display().to_string(), format!("not JSON: {e}")))?;
    if let Value::Object(m) = &mut v {
        m.remove("codec");
    }
    Ok(v)
}
