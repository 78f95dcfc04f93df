//! One column of a packed source as a [`Source`]: what the loader's streams
//! are built over.

use std::sync::Arc;

use super::packer::Packer;
use super::params::PACKED_ROWS;
use crate::source::{Fingerprint, Layout, Request, Source, SourceError};

/// One column of a packed source as a [`Source`] of fixed rows: the stream
/// the loader is built over. The loader fills all three columns of a step
/// with one call to the packer; `gather` here packs on its own (for a
/// caller that reads a column alone).
pub(crate) struct PackColumn {
    pub(crate) packer: Arc<Packer>,
    column: usize,
}

impl PackColumn {
    pub(crate) fn all(packer: &Arc<Packer>) -> Vec<PackColumn> {
        (0..packer.pack.columns().len()).map(|column| PackColumn { packer: Arc::clone(packer), column }).collect()
    }
}

impl Source for PackColumn {
    fn len(&self) -> u64 {
        PACKED_ROWS
    }

    fn layout(&self) -> Layout {
        Layout::Fixed { record_bytes: self.packer.pack.row_bytes()[self.column] }
    }

    fn gather(&self, req: &Request<'_>, dst: &mut [u8]) -> Result<(), SourceError> {
        let n = req.indices.len();
        let widths = self.packer.pack.row_bytes();
        let mut bufs: Vec<Vec<u8>> = widths.iter().map(|w| vec![0u8; n * w]).collect();
        let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        self.packer.fill(req.indices, &mut views, req.fan_out)?;
        let width = self.packer.pack.row_bytes()[self.column];
        for (slot, row) in req.slots(self, dst)?.into_iter().zip(bufs[self.column].chunks_exact(width.max(1))) {
            slot.copy_from_slice(row);
        }
        Ok(())
    }

    fn lengths(&self, _: &[u64], _: &mut [u64]) -> Result<(), SourceError> {
        Err("a packed column has fixed rows".into())
    }

    /// The tokens column carries the documents' fingerprint.
    fn fingerprint(&self) -> Result<Option<Fingerprint>, SourceError> {
        if self.column == 0 {
            self.packer.source().fingerprint()
        } else {
            Ok(None)
        }
    }

    fn extends(&self, earlier: Fingerprint) -> Result<bool, SourceError> {
        if self.column == 0 {
            self.packer.source().extends(earlier)
        } else {
            Ok(false)
        }
    }
}
