//! What [`Loader::next`](crate::Loader::next) returns.

use std::sync::Arc;

use crate::pool::{Pooled, PooledBuf};

/// One stream's share of a batch: the gathered bytes of this step's records,
/// in the order of [`Batch::indices`].
///
/// The buffers are pooled: dropping a column (or its parts, once taken out
/// with [`Column::into_parts`]) returns them to the loader for reuse.
#[derive(Debug)]
pub struct Column {
    /// The stream's name.
    pub name: Arc<str>,
    /// The records back to back. For a fixed layout, record `i` is
    /// `data[i * record_bytes..][..record_bytes]`.
    pub data: PooledBuf,
    /// For a ragged layout, `len + 1` offsets: record `i` is
    /// `data[offsets[i]..offsets[i + 1]]`. `None` for a fixed layout.
    pub offsets: Option<Pooled<u64>>,
}

impl Column {
    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All gathered bytes of this column.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The record offsets of a ragged column, `None` for a fixed one.
    pub fn offsets(&self) -> Option<&[u64]> {
        self.offsets.as_deref()
    }

    /// Splits the column into its name, data and offsets, so each buffer can
    /// be handed on (for example to NumPy) without copying.
    pub fn into_parts(self) -> (Arc<str>, PooledBuf, Option<Pooled<u64>>) {
        (self.name, self.data, self.offsets)
    }
}

/// The records of one step: this shard's indices and one [`Column`] per
/// stream, in the order the streams were given to the loader.
#[derive(Debug)]
pub struct Batch {
    /// The step this batch belongs to; consecutive calls to
    /// [`Loader::next`](crate::Loader::next) return consecutive steps.
    pub step: u64,
    /// The record indices of this shard's slice of the step (for a mixture,
    /// each into its row's source).
    pub indices: Pooled<u64>,
    /// For a mixture, the source of each row (rows interleaved, see
    /// `zring_sampler::RowOrder`);
    /// `None` for a loader over one set of streams.
    pub sources: Option<Pooled<u32>>,
    /// One column per stream.
    pub columns: Vec<Column>,
}

impl Batch {
    /// The number of records in this batch (per stream).
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch holds no records.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The column of the stream called `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| &*c.name == name)
    }

    /// The bytes of record `i` (the record at `indices[i]`) in stream
    /// `name`, or `None` if there is no such stream or record.
    pub fn record(&self, name: &str, i: usize) -> Option<&[u8]> {
        let column = self.column(name)?;
        match &column.offsets {
            Some(offsets) => {
                let start = usize::try_from(*offsets.get(i)?).ok()?;
                let end = usize::try_from(*offsets.get(i + 1)?).ok()?;
                column.data.get(start..end)
            }
            None => {
                if i >= self.len() {
                    return None;
                }
                let width = column.data.len() / self.len();
                column.data.get(i * width..(i + 1) * width)
            }
        }
    }

    /// Gives up the batch for its columns, so their buffers can be owned
    /// elsewhere without copying; they still return to the pool when dropped.
    pub fn into_columns(self) -> Vec<Column> {
        self.columns
    }
}
