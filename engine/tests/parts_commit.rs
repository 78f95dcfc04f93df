//! The commit of a dataset of parts, from outside the engine: links,
//! FIFOs and non-folders planted at every name of the dataset are refused
//! (naming the file) and nothing outside the dataset changes; a manifest
//! missing over committed parts is an error that keeps every part; a
//! commit killed at each of its crash points, or failed by an injected
//! error at each of its operations, leaves a dataset that opens and lists
//! exactly the commits acknowledged, and a retried commit lists a part
//! once.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use zring_engine::parts::{commit, Mode, Options};
use zring_engine::{Error, Parts};

#[path = "common/parts.rs"]
mod parts;
use parts::{listed, req, stage};

/// Every file under `dir` with its bytes (links as their targets' names).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            out.extend(snapshot(&p));
        } else if m.file_type().is_symlink() {
            out.push((p.clone(), std::fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes()));
        } else if m.is_file() {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        } else {
            out.push((p.clone(), Vec::new()));
        }
    }
    out.sort();
    out
}

#[test]
fn links_planted_at_the_datasets_names_are_refused_and_nothing_outside_changes() {
    for name in ["staging", "parts", "dropped", "manifest.json", ".commit.lock"] {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("ds");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("keep"), b"private").unwrap();
        std::fs::write(outside.join("sub/keep"), b"private too").unwrap();
        // A dataset of one part, overwritten below (so `dropped` is written).
        let first = stage(&root, 3, None);
        commit(&[req(&root, vec![first], Mode::Append)], &Options::default()).unwrap();
        let next = stage(&root, 2, None);
        let before = snapshot(&outside);
        let at = root.join(name);
        if at.is_dir() {
            std::fs::rename(&at, t.path().join("moved")).unwrap();
        } else if at.exists() {
            std::fs::remove_file(&at).unwrap();
        }
        let target =
            if name.ends_with(".json") || name.ends_with(".lock") { outside.join("keep") } else { outside.clone() };
        symlink(&target, &at).unwrap();
        let err = commit(&[req(&root, vec![next], Mode::Overwrite)], &Options::default()).unwrap_err();
        assert!(err.to_string().contains(&at.display().to_string()), "{name}: the refusal names the file: {err}");
        assert_eq!(snapshot(&outside), before, "{name}: nothing outside the dataset changed");
    }
}

#[test]
fn a_temporary_manifest_planted_as_a_link_is_replaced_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("ds");
    let outside = t.path().join("private");
    std::fs::write(&outside, b"private").unwrap();
    let a = stage(&root, 3, None);
    symlink(&outside, root.join(format!(".manifest.json.{}.tmp", std::process::id()))).unwrap();
    commit(&[req(&root, vec![a.clone()], Mode::Append)], &Options::default()).unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"private");
    assert_eq!(listed(&root), vec![format!("parts/{}", a.name)]);
}

#[test]
fn a_fifo_or_a_huge_file_at_the_manifest_is_refused_without_waiting() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("ds");
    let a = stage(&root, 3, None);
    commit(&[req(&root, vec![a], Mode::Append)], &Options::default()).unwrap();
    std::fs::remove_file(root.join("manifest.json")).unwrap();
    let c = std::ffi::CString::new(root.join("manifest.json").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let b = stage(&root, 2, None);
    let err = commit(&[req(&root, vec![b], Mode::Append)], &Options::default()).unwrap_err();
    assert!(err.to_string().contains("manifest.json") && err.to_string().contains("not a regular file"), "{err}");
    assert!(Parts::open(&root).is_err());
}

#[test]
fn a_missing_manifest_over_committed_parts_is_an_error_and_keeps_every_part() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("ds");
    let a = stage(&root, 3, None);
    commit(&[req(&root, vec![a.clone()], Mode::Append)], &Options::default()).unwrap();
    std::fs::remove_file(root.join("manifest.json")).unwrap();
    let b = stage(&root, 2, None);
    for mode in [Mode::Append, Mode::Overwrite] {
        let err = commit(&[req(&root, vec![b.clone()], mode)], &Options::default()).unwrap_err();
        assert!(matches!(err, Error::Corrupted { .. }), "{err}");
        assert!(err.to_string().contains("restore manifest.json"), "{err}");
    }
    assert!(root.join("parts").join(&a.name).join("head.zr").is_file(), "the committed part stays");
    assert!(root.join("staging").join(&b.name).is_dir(), "the staged part stays");
    let err = Parts::open(&root).unwrap_err();
    assert!(err.to_string().contains("manifest.json is missing"), "{err}");
}

#[test]
fn a_refused_column_commits_no_column() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a.zr"), t.path().join("b.zr"));
    let (pa, pb) = (stage(&a, 3, None), stage(&b, 3, None));
    commit(&[req(&a, vec![pa], Mode::Append), req(&b, vec![pb], Mode::Append)], &Options::default()).unwrap();
    let (qa, mut qb) = (stage(&a, 2, None), stage(&b, 2, None));
    qb.records += 1; // refused: its records differ from what its writer saw
    let err = commit(&[req(&a, vec![qa.clone()], Mode::Append), req(&b, vec![qb], Mode::Append)], &Options::default())
        .unwrap_err();
    assert!(matches!(err, Error::Corrupted { .. }), "{err}");
    assert_eq!(listed(&a).len(), 1, "column a as before");
    assert_eq!(listed(&b).len(), 1, "column b as before");
    assert!(a.join("staging").join(&qa.name).is_dir(), "a's part stays staged");
}

#[test]
fn a_retried_commit_lists_a_part_once() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("ds");
    let a = stage(&root, 3, None);
    let r = [req(&root, vec![a.clone()], Mode::Append)];
    let g1 = commit(&r, &Options::default()).unwrap()[0].generation;
    let g2 = commit(&r, &Options::default()).unwrap()[0].generation;
    assert_eq!(listed(&root), vec![format!("parts/{}", a.name)]);
    assert_eq!(g2, g1 + 1);
}
