//! A worker: claims steps in the window, gathers every stream of each (one
//! call per source and stream, or a packer's fill for packed rows) and
//! hands the batch over in step order.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, PoisonError};
use std::thread;
use std::time::Instant;

use zring_sampler::Mode;

use super::shared::{Ctx, Packing, Shared};
use crate::batch::{Batch, Column};
use crate::error::Error;
use crate::plan::{self, Plan};
use crate::source::{Layout, Request, Source};
use crate::stats;

/// Marks the pipeline dead if its worker unwinds, so the consumer gets an
/// error instead of waiting for a step that will never come.
pub(super) struct DeathWatch<'a>(&'a Shared);

impl Drop for DeathWatch<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            let mut state = self.0.lock();
            state.died.get_or_insert_with(|| "a gather thread died".to_owned());
            drop(state);
            self.0.ready.notify_all();
        }
    }
}

pub(super) fn worker(shared: &Shared, i: usize) {
    let _watch = DeathWatch(shared);
    loop {
        let step = {
            let mut state = shared.lock();
            loop {
                if state.shutdown {
                    shared.cpu.publish(i);
                    return;
                }
                let window_end = state.next_deliver.saturating_add(shared.ctx.window(state.ragged_step_max));
                let loaded = !state.prefetching || state.next_claim < state.loaded_until;
                if state.next_claim < window_end && loaded {
                    let step = state.next_claim;
                    state.next_claim += 1;
                    if state.next_claim >= state.awaited {
                        // A prefetch thread waits for this claim to load
                        // the next window, which the workers may wait for
                        // in turn. The others waiting wait on again.
                        state.awaited = u64::MAX;
                        shared.claimed.notify_all();
                    }
                    break step;
                }
                state.idle += 1;
                state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner);
                state.idle -= 1;
            }
        };

        let started = Instant::now();
        let mut current_stream: Option<Arc<str>> = None;
        let gathered = panic::catch_unwind(AssertUnwindSafe(|| gather_step(&shared.ctx, step, &mut current_stream)));
        let elapsed = started.elapsed();
        shared.cpu.publish(i);
        let outcome = match gathered {
            Ok(outcome) => outcome,
            Err(payload) => Err(Error::Panicked {
                step: Some(step),
                stream: current_stream.map(|s| s.to_string()),
                message: panic_message(payload.as_ref()),
            }),
        };

        let mut state = shared.lock();
        let mut widened = false;
        if let Ok(batch) = &outcome {
            let g = &mut state.gather;
            g.steps += 1;
            g.records += (batch.indices.len() * batch.columns.len()) as u64;
            g.bytes += batch.columns.iter().map(|c| c.data.len() as u64).sum::<u64>();
            stats::record(&mut g.time, elapsed);
            if shared.ctx.has_ragged {
                let ragged: u64 =
                    batch.columns.iter().filter(|c| c.offsets.is_some()).map(|c| c.data.len() as u64).sum();
                let before = shared.ctx.window(state.ragged_step_max);
                let max = state.ragged_step_max.map_or(ragged, |m| m.max(ragged));
                state.ragged_step_max = Some(max);
                widened = shared.ctx.window(state.ragged_step_max) > before;
            }
        }
        // The window guarantees next_deliver <= step < next_deliver + depth.
        let slot = (step - state.next_deliver) as usize;
        let is_next = slot == 0;
        state.slots[slot] = Some(outcome);
        drop(state);
        if is_next {
            shared.ready.notify_one();
        }
        if widened {
            shared.work.notify_all();
        }
    }
}

/// Whether `min(threads, depth)` concurrent gathers leave cores for a
/// store's decode pool to use. (`ZRING_LOADER_FAN_OUT=0|1` decides instead.)
pub(super) fn gathers_leave_cores_idle(threads: usize, depth: usize) -> bool {
    if let Some(v) = std::env::var_os("ZRING_LOADER_FAN_OUT") {
        return v != "0";
    }
    fan_out_for(threads, depth, thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

pub(super) fn fan_out_for(threads: usize, depth: usize, cores: usize) -> bool {
    threads.min(depth) < cores
}

/// Gathers every stream of `step`. `current` names the stream being gathered,
/// so a panic in a source can be attributed to it.
///
/// A mixture's rows are gathered with one call per source and stream
/// (below).
pub(super) fn gather_step(ctx: &Ctx, step: u64, current: &mut Option<Arc<str>>) -> Result<Batch, Error> {
    // Asked once per step: a store's read policy may change while it runs.
    let mut wants = Vec::with_capacity(ctx.streams.len());
    for stream in &ctx.streams {
        let mut per_source = Vec::with_capacity(stream.sources.len());
        for (source, label) in stream.sources.iter().zip(&stream.labels) {
            *current = Some(Arc::clone(label));
            per_source.push(source.wants_hints());
        }
        wants.push(per_source);
    }
    let mut indices = ctx.indices.take(ctx.shard_len);
    let mut sources = ctx.sources.as_ref().map(|p| p.take(ctx.shard_len));
    let rows_sources: &mut [u32] = sources.as_deref_mut().unwrap_or(&mut []);
    let hints = if wants.iter().flatten().any(|&w| w) {
        let blocked = ctx.plan.mode() == Mode::Blocked;
        let mut next = ctx.hints.take(ctx.shard_len);
        match &ctx.lookahead {
            Some(look) => {
                ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
                look.fill(&ctx.plan, step, rows_sources, &indices, &mut next)?;
            }
            // Mode 3 draws a record again only in its (source's) next cycle,
            // far past the windows read ahead: "none in sight" ranks it as
            // the prefetch's window ranks what it loaded, and spares
            // inverting the permutation for every row (a mixture: searching
            // its rows, several times the cost of the rows,
            // bench-results/engine-notes.md).
            None if blocked => {
                ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
                next.fill(None);
            }
            None => ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, Some(&mut next))?,
        }
        Some(next)
    } else {
        ctx.plan.fill(step, ctx.shard, rows_sources, &mut indices, None)?;
        None
    };
    // Each source's rows are gathered in one call per stream. A mixture's
    // rows are interleaved (`zring_sampler::RowOrder`): each source's call
    // then puts its records straight into their rows' slots
    // ([`Slots::At`](crate::Slots::At)).
    let grouping = match &sources {
        Some(rows) => plan::Grouping::new(rows),
        None => plan::Grouping::single(indices.len()),
    };
    let grouped_indices: Option<Vec<u64>> = grouping.order.as_ref().map(|o| o.iter().map(|&r| indices[r]).collect());
    let gidx: &[u64] = grouped_indices.as_deref().unwrap_or(&indices);
    if let Some(packing) = &ctx.pack {
        let columns = match &grouping.order {
            None => pack_step(ctx, packing, step, &indices, &grouping.runs, current)?,
            Some(order) => {
                // Packed grouped by source (each source's rows of the shard
                // are one stretch of its row stream), then each row moved to
                // its interleaved place.
                let grouped = pack_step(ctx, packing, step, gidx, &grouping.runs, current)?;
                grouped
                    .into_iter()
                    .zip(&ctx.streams)
                    .map(|(column, stream)| {
                        let width = column.data.len() / indices.len().max(1);
                        let mut data = stream.data.take(column.data.len());
                        for (slot, &row) in order.iter().enumerate() {
                            data[row * width..][..width].copy_from_slice(&column.data[slot * width..][..width]);
                        }
                        Column { name: column.name, data, offsets: None }
                    })
                    .collect()
            }
        };
        return Ok(Batch { step, indices, sources, columns });
    }
    // A cyclic plan's hints all lie in the next cycle (each record comes
    // once a cycle): the sources learn where it starts.
    let cycle_end = match &ctx.plan {
        Plan::Single(s) if hints.is_some() && s.state().mode == Mode::Cyclic => Some(s.cycle_boundary(step + 1)),
        _ => None,
    };
    let grouped_hints: Option<Vec<Option<u64>>> =
        grouping.order.as_ref().zip(hints.as_deref()).map(|(o, h)| o.iter().map(|&r| h[r]).collect());
    let ghints: Option<&[Option<u64>]> = grouped_hints.as_deref().or(hints.as_deref());
    let runs = &grouping.runs;
    let mut starts = Vec::new();
    let mut columns = Vec::with_capacity(ctx.streams.len());
    for (stream, wants) in ctx.streams.iter().zip(&wants) {
        let gather_err = |k: usize| {
            let label = stream.labels[k].to_string();
            move |source| Error::Gather { step, stream: label, source }
        };
        // One view of each source for the whole step: a ragged column's
        // lengths and its records come from the same records.
        let mut views = Vec::with_capacity(stream.sources.len());
        for (k, source) in stream.sources.iter().enumerate() {
            *current = Some(Arc::clone(&stream.labels[k]));
            views.push(source.view().map_err(gather_err(k))?);
        }
        let views: Vec<&dyn Source> =
            views.iter().zip(&stream.sources).map(|(v, s)| v.as_deref().unwrap_or(&**s)).collect();
        let too_large = |bytes: u128| Error::BatchTooLarge { step, stream: stream.name.to_string(), bytes };
        let column = match stream.layout {
            Layout::Fixed { record_bytes } => {
                let bytes = indices
                    .len()
                    .checked_mul(record_bytes)
                    .ok_or_else(|| too_large(indices.len() as u128 * record_bytes as u128))?;
                let mut data = stream.data.take(bytes);
                for (k, rows) in runs {
                    let (k, rows) = (*k, rows.clone());
                    *current = Some(Arc::clone(&stream.labels[k]));
                    let source = views[k];
                    let idx = &gidx[rows.clone()];
                    let next = ghints.filter(|_| wants[k]).map(|h| &h[rows.clone()]);
                    let next = next.unwrap_or(&[]);
                    match &grouping.order {
                        None => {
                            let dst = &mut data[rows.start * record_bytes..rows.end * record_bytes];
                            source.gather(
                                &Request::packed(idx).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                dst,
                            )
                        }
                        Some(order) => {
                            starts.clear();
                            starts.extend(order[rows].iter().map(|&r| (r * record_bytes) as u64));
                            source.gather(
                                &Request::at(idx, &starts).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                &mut data,
                            )
                        }
                    }
                    .map_err(gather_err(k))?;
                }
                Column { name: Arc::clone(&stream.name), data, offsets: None }
            }
            Layout::Ragged => {
                // Lengths in grouped order (one call per source), then put in
                // row order: the batch's offsets.
                let mut glens = vec![0u64; indices.len()];
                for (k, rows) in runs {
                    *current = Some(Arc::clone(&stream.labels[*k]));
                    views[*k].lengths(&gidx[rows.clone()], &mut glens[rows.clone()]).map_err(gather_err(*k))?;
                }
                let mut offsets = stream.offsets.take(indices.len() + 1);
                offsets[0] = 0;
                match &grouping.order {
                    None => offsets[1..].copy_from_slice(&glens),
                    Some(order) => {
                        for (slot, &row) in order.iter().enumerate() {
                            offsets[row + 1] = glens[slot];
                        }
                    }
                }
                let total = prefix_sum(&mut offsets[1..])
                    .ok_or_else(|| too_large(glens.iter().map(|&l| u128::from(l)).sum::<u128>()))?;
                let bytes = usize::try_from(total).map_err(|_| too_large(u128::from(total)))?;
                let mut data = stream.data.take(bytes);
                let mut rebased = Vec::new();
                for (k, rows) in runs {
                    let (k, rows) = (*k, rows.clone());
                    *current = Some(Arc::clone(&stream.labels[k]));
                    let source = views[k];
                    let idx = &gidx[rows.clone()];
                    let next = ghints.filter(|_| wants[k]).map_or(&[][..], |h| &h[rows.clone()]);
                    match &grouping.order {
                        None => {
                            // Lossless: the offsets are at most `bytes`, a usize.
                            let (a, z) = (offsets[rows.start] as usize, offsets[rows.end] as usize);
                            let dst = &mut data[a..z];
                            // A source sees offsets from the start of its run.
                            let offs = if a == 0 {
                                &offsets[rows.start..=rows.end]
                            } else {
                                rebased.clear();
                                rebased.extend(offsets[rows.start..=rows.end].iter().map(|&o| o - a as u64));
                                &rebased[..]
                            };
                            source.gather(
                                &Request::ragged(idx, offs).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                dst,
                            )
                        }
                        Some(order) => {
                            starts.clear();
                            starts.extend(order[rows].iter().map(|&r| offsets[r]));
                            source.gather(
                                &Request::at(idx, &starts).hints(next).cycle_end(cycle_end).fan_out(ctx.fan_out),
                                &mut data,
                            )
                        }
                    }
                    .map_err(gather_err(k))?;
                }
                Column { name: Arc::clone(&stream.name), data, offsets: Some(offsets) }
            }
        };
        columns.push(column);
    }
    *current = None;
    Ok(Batch { step, indices, sources, columns })
}

/// A packed step: the three columns of the rows in `indices`, each run of
/// one source's rows filled by its packer in one call.
pub(super) fn pack_step(
    ctx: &Ctx,
    packing: &Packing,
    step: u64,
    indices: &[u64],
    runs: &[(usize, std::ops::Range<usize>)],
    current: &mut Option<Arc<str>>,
) -> Result<Vec<Column>, Error> {
    let widths = packing.pack.row_bytes();
    let mut data: Vec<_> = ctx.streams.iter().zip(&widths).map(|(s, w)| s.data.take(indices.len() * w)).collect();
    for (k, rows) in runs {
        let label = &ctx.streams[0].labels[*k];
        *current = Some(Arc::clone(label));
        let mut bufs: Vec<&mut [u8]> =
            data.iter_mut().zip(&widths).map(|(d, w)| &mut d[rows.start * w..rows.end * w]).collect();
        packing.packers[*k].fill(&indices[rows.clone()], &mut bufs, ctx.fan_out).map_err(|source| Error::Gather {
            step,
            stream: label.to_string(),
            source,
        })?;
    }
    *current = None;
    Ok(ctx
        .streams
        .iter()
        .zip(data)
        .map(|(s, data)| Column { name: Arc::clone(&s.name), data, offsets: None })
        .collect())
}

/// Turns lengths into end offsets in place; `None` if the total overflows.
pub(super) fn prefix_sum(lengths: &mut [u64]) -> Option<u64> {
    let mut total = 0u64;
    for l in lengths {
        total = total.checked_add(*l)?;
        *l = total;
    }
    Some(total)
}

pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}
