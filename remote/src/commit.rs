//! Datasets of parts written to a bucket: each writer uploads its part's
//! files under `parts/<name>/`, and one driver commits them by writing the
//! manifest with a conditional PUT (`If-Match` on the ETag of the manifest
//! it read, `If-None-Match: *` for the first). A commit that loses the
//! race reads the manifest again and retries, so two committers never
//! lose each other's parts. The conditional PUT is the commit point:
//! a part uploaded and not committed is listed nowhere and read by no one,
//! and [`remove_unlisted`] removes it; a part listed already is not listed
//! twice, so a retried commit adds nothing.

use std::path::Path;

use bytes::Bytes;
use serde_json::Value;
use zring_engine::parts::{valid_part_name, Manifest, PartEntry, MANIFEST_FILE};

use crate::client::{Put, Remote};
use crate::error::{io_err, Error, Result};

/// A part uploaded by [`upload_part`], to commit.
#[derive(Clone, Debug, PartialEq)]
pub struct NewPart {
    /// The part's name (`p-...`); its files are at `parts/<name>/`.
    pub name: String,
    pub records: u64,
    /// The part's content CRC, 8 hex digits (its fingerprint).
    pub content: String,
    /// The part's schema (its `schema.json` but for the codec).
    pub schema: Value,
    /// The records' decoded bytes, if known (what ranks are balanced by).
    pub bytes: Option<u64>,
}

/// Uploads the files of the local store `local` (a staged part) to
/// `parts/<name>/`; the bytes uploaded.
pub fn upload_part(remote: &Remote, local: &Path, name: &str) -> Result<u64> {
    if !valid_part_name(name) {
        return Err(Error::InvalidArgument(format!("{name:?} is not a part's name (p- and letters, digits, - or _)")));
    }
    upload_store(remote, local, &format!("parts/{name}/"))
}

/// Uploads the files of the local store `local` under `prefix` (empty, or
/// ending in `/`), its `head.zr` last (a store whose head is in the bucket
/// is whole); the bytes uploaded.
pub fn upload_store(remote: &Remote, local: &Path, prefix: &str) -> Result<u64> {
    let mut files = Vec::new();
    walk(local, local, &mut files)?;
    if !files.iter().any(|(rel, _)| rel == "head.zr") {
        return Err(Error::InvalidArgument(format!("{} is not a store (no head.zr)", local.display())));
    }
    files.sort_by_key(|(rel, _)| rel == "head.zr");
    let mut bytes = 0;
    for (rel, path) in files {
        remote.put_file(&format!("{prefix}{rel}"), &path)?;
        bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    }
    Ok(bytes)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, std::path::PathBuf)>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(io_err("list", dir))? {
        let e = e.map_err(io_err("list", dir))?;
        let t = e.file_type().map_err(io_err("stat", e.path()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // locks and temporary files are not the store's
        }
        if t.is_dir() {
            walk(root, &e.path(), out)?;
        } else if t.is_file() {
            let rel = e.path().strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            out.push((rel, e.path()));
        }
    }
    Ok(())
}

/// What a remote commit did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub generation: u64,
    /// Commits lost to another committer and retried.
    pub retries: u32,
    /// Parts dropped by an overwrite whose objects could not be removed.
    pub warnings: Vec<String>,
}

const MAX_ATTEMPTS: u32 = 64;

/// Commits `parts` (uploaded with [`upload_part`]) to the dataset at
/// `remote`: appended after the parts listed, or, with `overwrite`, in
/// their place (the dropped parts' objects are removed after the commit
/// point). Parts listed already with the same fingerprint are not listed
/// again.
pub fn commit(remote: &Remote, parts: &[NewPart], overwrite: bool) -> Result<Committed> {
    for p in parts {
        if !valid_part_name(&p.name) {
            return Err(Error::InvalidArgument(format!("{:?} is not a part's name", p.name)));
        }
        let head = remote.list(&format!("parts/{}/", p.name))?;
        if !head.iter().any(|o| o.key.ends_with("/head.zr")) {
            return Err(Error::NotFound {
                url: format!(
                    "{} (part {} was not uploaded whole)",
                    remote.url_of(&format!("parts/{}/head.zr", p.name)),
                    p.name
                ),
            });
        }
    }
    let schema = match parts.first() {
        Some(first) => {
            for (k, p) in parts.iter().enumerate() {
                if p.schema != first.schema {
                    return Err(Error::InvalidArgument(format!(
                        "part {k} ({}) has schema {}, part 0 {}: its dtype or shape differs; nothing was committed",
                        p.name, p.schema, first.schema
                    )));
                }
            }
            first.schema.clone()
        }
        None => Value::Null,
    };
    let mut retries = 0;
    loop {
        let cur = remote.get(MANIFEST_FILE)?;
        let old = match &cur {
            Some((bytes, _)) => Some(Manifest::from_bytes(Path::new(&remote.url_of(MANIFEST_FILE)), bytes)?),
            None => None,
        };
        let mut list: Vec<PartEntry> =
            if overwrite { Vec::new() } else { old.as_ref().map(|m| m.parts.clone()).unwrap_or_default() };
        let mut schema_now = schema.clone();
        if let Some(m) = old.as_ref().filter(|m| !overwrite && !m.parts.is_empty()) {
            if !parts.is_empty() && m.schema != schema {
                return Err(Error::InvalidArgument(format!(
                    "the parts have schema {schema}, the dataset's other parts {}: its dtype or shape differs; \
                     nothing was committed",
                    m.schema
                )));
            }
            schema_now = m.schema.clone();
        }
        for p in parts {
            let dir = format!("parts/{}", p.name);
            match list.iter().find(|e| e.dir == dir) {
                Some(e) if e.records == p.records && e.content == p.content => continue,
                Some(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "{dir} is listed already with other records: a part is committed once, under a new name"
                    )))
                }
                None => list.push(PartEntry { dir, records: p.records, content: p.content.clone(), bytes: p.bytes }),
            }
        }
        let generation = old.as_ref().map_or(1, |m| m.generation + 1);
        let m = Manifest::new(generation, schema_now, list);
        let body = Bytes::from(m.to_bytes()?);
        match remote.put_if(MANIFEST_FILE, body, cur.as_ref().map(|c| c.1.etag.as_str()))? {
            Put::Done(_) => {
                let mut warnings = Vec::new();
                if let Some(old) = old.filter(|_| overwrite) {
                    for p in old.parts.iter().filter(|p| !m.parts.iter().any(|n| n.dir == p.dir)) {
                        if let Err(e) = remove_prefix(remote, &format!("{}/", p.dir)) {
                            warnings.push(format!("the dropped part {} was not removed: {e}", p.dir));
                        }
                    }
                }
                return Ok(Committed { generation, retries, warnings });
            }
            Put::Conflict if retries + 1 < MAX_ATTEMPTS => retries += 1,
            Put::Conflict => {
                return Err(Error::Conflict(format!(
                    "{}: the manifest changed under {MAX_ATTEMPTS} commits in a row (other committers); nothing \
                     was committed",
                    remote.url_of(MANIFEST_FILE)
                )))
            }
        }
    }
}

fn remove_prefix(remote: &Remote, prefix: &str) -> Result<()> {
    for o in remote.list(prefix)? {
        remote.delete(&o.key)?;
    }
    Ok(())
}

/// Removes the uploaded parts named `names` that the manifest does not
/// list (a failed or abandoned job's); the names removed.
pub fn remove_unlisted(remote: &Remote, names: &[String]) -> Result<Vec<String>> {
    let listed: Vec<String> = match remote.get(MANIFEST_FILE)? {
        Some((b, _)) => Manifest::from_bytes(Path::new(&remote.url_of(MANIFEST_FILE)), &b)?
            .parts
            .into_iter()
            .map(|p| p.dir)
            .collect(),
        None => Vec::new(),
    };
    let mut out = Vec::new();
    for n in names {
        if !valid_part_name(n) || listed.iter().any(|d| d == &format!("parts/{n}")) {
            continue;
        }
        remove_prefix(remote, &format!("parts/{n}/"))?;
        out.push(n.clone());
    }
    Ok(out)
}
