//! New table files, written in one pass.
//!
//! Delete, compaction and sealing rewrite the whole record table. They stream its
//! entries, in index order, through a [`TableOut`], which encodes them in
//! the format asked for and writes them out a megabyte at a time: rewriting
//! the table of 1e9 records holds one page of it in memory, not the table.
//! The file is the next generation's, which no head names until
//! [`crate::write::compact::commit_table`] commits it; a crash before that
//! leaves a file recovery removes.

use std::fs::File;
use std::path::PathBuf;

use crate::error::Result;
use crate::format::fingerprint::{over_records, SEED};
use crate::format::head::Layout;
use crate::format::names::table_name;
use crate::format::record::Entry;
use crate::format::table::{page_crc, table_header, Sealed, CRCS_PER_PAGE, PAGE, VAR_ENTRY, VAR_PER_PAGE};
use crate::io::fs::{self, Dir};

/// Bytes gathered before they are written.
const WRITE_BYTES: usize = 1 << 20;

/// A table file written and not yet durable: what the head will say of it.
pub(crate) struct NewTable {
    pub file: File,
    pub path: PathBuf,
    /// Its length.
    pub bytes: u64,
    pub records: u64,
    pub content: u32,
    pub layout: Layout,
}

/// A table file being written, entry after entry ([module docs](self)).
pub(crate) struct TableOut {
    file: File,
    path: PathBuf,
    /// `None`: format 1; else the format-2 section every record goes in.
    kind: Option<Sealed>,
    /// Records the caller will push (a format-2 header states them).
    records: u64,
    pushed: u64,
    /// The fingerprint content over the records pushed.
    content: u32,
    /// Bytes not yet written, which start at `at` of the file.
    buf: Vec<u8>,
    at: u64,
    /// Format 2: the page being filled, the entries or checksums on it, and
    /// the pages finished.
    page: Vec<u8>,
    on_page: usize,
    pages: u64,
}

impl TableOut {
    /// Creates (or truncates) table generation `generation` in `dir`, to hold
    /// `records` records in format 1 (`kind` `None`) or in a format-2
    /// section of `kind`.
    pub fn create(dir: &Dir, generation: u64, kind: Option<Sealed>, records: u64) -> Result<TableOut> {
        let path = dir.join(table_name(generation));
        let file = dir.create(&table_name(generation))?;
        let (buf, page) = match kind {
            None => (table_header(generation).to_vec(), Vec::new()),
            Some(k) => (k.header(generation, records), vec![0u8; PAGE]),
        };
        Ok(TableOut { file, path, kind, records, pushed: 0, content: SEED, buf, at: 0, page, on_page: 0, pages: 0 })
    }

    /// The next record's entry. A fixed section keeps no entry (its block
    /// checksums come through [`Self::push_block`]); a variable section's
    /// entries must keep to its page rules (checked by the caller).
    pub fn push(&mut self, e: &Entry) -> Result<()> {
        self.content = over_records(self.content, [(e.checksum.unwrap_or(0), e.logical_len)]);
        self.pushed += 1;
        match self.kind {
            None => self.buf.extend_from_slice(&e.encode()),
            Some(Sealed::Fixed { .. }) => {}
            Some(Sealed::Variable) => {
                let page = &mut self.page;
                if self.on_page == 0 {
                    page[4..8].copy_from_slice(&e.chunk.0.to_le_bytes());
                }
                debug_assert!(
                    page[4..8] == e.chunk.0.to_le_bytes() && e.end() <= u64::from(u32::MAX),
                    "a page's records are in one chunk, below 4 GiB"
                );
                // The page's end is its last record's.
                page[8..12].copy_from_slice(&(e.end() as u32).to_le_bytes());
                let b = &mut page[16 + self.on_page * VAR_ENTRY..16 + (self.on_page + 1) * VAR_ENTRY];
                b[0..4].copy_from_slice(&(e.offset as u32).to_le_bytes());
                b[4..8].copy_from_slice(&(e.logical_len | (e.codec as u32) << 30).to_le_bytes());
                b[8..12].copy_from_slice(&e.checksum.unwrap_or(0).to_le_bytes());
                self.on_page += 1;
                if self.on_page as u64 == VAR_PER_PAGE {
                    self.end_page();
                }
            }
        }
        self.write_if_full()
    }

    /// Counts `records` records of a fixed section as pushed, with `content`,
    /// the fingerprint content over them, which the caller knows: a fixed
    /// section keeps only block checksums, so a table sealed from them
    /// alone ([`crate::write::seal`]) never sees a record's own.
    pub fn carry(&mut self, records: u64, content: u32) {
        debug_assert!(matches!(self.kind, Some(Sealed::Fixed { .. })) && self.pushed == 0);
        self.pushed += records;
        self.content = content;
    }

    /// A fixed section's next block checksum.
    pub fn push_block(&mut self, crc: u32) -> Result<()> {
        debug_assert!(matches!(self.kind, Some(Sealed::Fixed { .. })));
        self.page[4 + 4 * self.on_page..8 + 4 * self.on_page].copy_from_slice(&crc.to_le_bytes());
        self.on_page += 1;
        if self.on_page as u64 == CRCS_PER_PAGE {
            self.end_page();
        }
        self.write_if_full()
    }

    /// Seals the page being filled with its checksum.
    fn end_page(&mut self) {
        let crc = page_crc(self.pages, &self.page);
        self.page[0..4].copy_from_slice(&crc.to_le_bytes());
        self.buf.extend_from_slice(&self.page);
        self.page.fill(0);
        self.on_page = 0;
        self.pages += 1;
    }

    fn write_if_full(&mut self) -> Result<()> {
        if self.buf.len() >= WRITE_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    fn write_out(&mut self) -> Result<()> {
        fs::write_all(&mut self.file, &self.path, self.at, &self.buf)?;
        self.at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is left (not durably: the commit syncs it).
    pub fn finish(mut self) -> Result<NewTable> {
        if self.on_page > 0 {
            self.end_page();
        }
        self.write_out()?;
        let layout = match self.kind {
            None => Layout::V1,
            Some(k) => Layout { version: 2, sealed: self.records, tail_at: PAGE as u64 * (1 + k.pages(self.records)) },
        };
        assert!(
            self.pushed == self.records && (self.kind.is_none() || layout.tail_at == self.at),
            "{}: {} of {} records pushed, {} bytes written where the layout says {}",
            self.path.display(),
            self.pushed,
            self.records,
            self.at,
            layout.tail_at
        );
        Ok(NewTable {
            file: self.file,
            path: self.path,
            bytes: self.at,
            records: self.records,
            content: self.content,
            layout,
        })
    }
}
