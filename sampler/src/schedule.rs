//! Mixture schedules: weights as a function of the step.
//!
//! A [`SchedulePiece`] is a list of [`SchedulePoint`]s, each a step and a
//! weight per source (normalised to sum to 1 at each point). Between two
//! points of different steps the weights move linearly; two points at the
//! same step are a jump (the second holds from that step on); before the
//! first point (always at step 0) and after the last the weights hold still.
//! So a piecewise constant schedule is a staircase of jumps, a linear one a
//! list of corners.
//!
//! The weights are a function `w_s(x)` of a real step `x`; step `t` covers
//! `x` in `[t, t + 1)`, and source `s`'s *target* among the first `r` rows of
//! a mixture of `B` rows per step is `B * (integral of w_s from 0 to r / B)`.
//! A step's own share is the integral over the step: the mean of the weights
//! over it (on a linear stretch, the weights at its middle, `t + 1/2`).
//! [`crate::Mixture`] rounds these targets as it rounds `w_s r` for fixed
//! weights.
//!
//! A run resumed under another schedule keeps what it ran: its
//! [`MixtureState`](crate::MixtureState) holds a list of pieces, each from
//! the step it took over at. The targets are the integral of the piece in
//! force at each `x` (piece `j` from its `from` step to the next piece's),
//! so every target up to a change is the saved run's, bit for bit.

use serde::{Deserialize, Serialize};

use crate::Error;

/// One corner of a schedule: the weights at `step` (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulePoint {
    /// The step these weights hold at.
    pub step: u64,
    /// One weight per source; normalised in a saved state.
    pub weights: Vec<f64>,
}

/// One schedule and the step it took over at (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulePiece {
    /// The first step it applies to: 0 for a run's first schedule, the step
    /// a run was resumed at for a schedule given then.
    pub from: u64,
    /// Its points, the first at step 0, weights normalised.
    pub points: Vec<SchedulePoint>,
}

impl SchedulePiece {
    /// A piece from step `from` over `points` as a user gives them: checked
    /// (sources, steps in order, at most two points per step, weights
    /// non-negative and finite, each point's sum positive, every source of
    /// a positive weight somewhere) and normalised point by point.
    pub fn new(from: u64, sources: usize, points: &[SchedulePoint]) -> Result<SchedulePiece, Error> {
        let bad = |why: String| Err(Error::BadSchedule { why });
        let Some(first) = points.first() else {
            return bad("a schedule needs at least one point".to_owned());
        };
        if first.step != 0 {
            return bad(format!("the first point is at step {}; a schedule starts at step 0", first.step));
        }
        let mut positive = vec![false; sources];
        let mut out = Vec::with_capacity(points.len());
        for (i, p) in points.iter().enumerate() {
            if p.weights.len() != sources {
                return bad(format!(
                    "point {i} (step {}) has {} weights for {sources} sources",
                    p.step,
                    p.weights.len()
                ));
            }
            if i > 0 && p.step < points[i - 1].step {
                return bad(format!(
                    "point {i} is at step {}, before point {}'s step {}",
                    p.step,
                    i - 1,
                    points[i - 1].step
                ));
            }
            if i > 1 && p.step == points[i - 2].step {
                return bad(format!("three points at step {}: a step holds at most two (a jump)", p.step));
            }
            if let Some((k, w)) = p.weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w >= 0.0)) {
                return bad(format!("point {i} (step {}) gives source {k} weight {w}: need finite and >= 0", p.step));
            }
            let total = crate::sum::pairwise_sum(&p.weights);
            if total <= 0.0 {
                return bad(format!("point {i} (step {}) has weights summing to 0", p.step));
            }
            for (k, &w) in p.weights.iter().enumerate() {
                positive[k] |= w > 0.0;
            }
            out.push(SchedulePoint { step: p.step, weights: p.weights.iter().map(|w| w / total).collect() });
        }
        if let Some(k) = positive.iter().position(|&p| !p) {
            return bad(format!("source {k} has weight 0 at every point, so it would never get a row"));
        }
        Ok(SchedulePiece { from, points: out })
    }

    /// Whether the piece holds one set of weights throughout.
    pub fn is_constant(&self) -> bool {
        self.points.iter().all(|p| p.weights == self.points[0].weights)
    }

    /// Whether `other` has the same points, weights equal up to NumPy's
    /// `allclose` tolerances (`from` is not compared).
    pub fn same_points(&self, other: &SchedulePiece) -> bool {
        self.points.len() == other.points.len()
            && self.points.iter().zip(&other.points).all(|(a, b)| {
                a.step == b.step
                    && a.weights.len() == b.weights.len()
                    && a.weights.iter().zip(&b.weights).all(|(x, y)| (x - y).abs() <= 1e-8 + 1e-5 * y.abs())
            })
    }
}

/// The weights at step `x` of the pieces `pieces` (the one in force there).
pub fn weights_at(pieces: &[SchedulePiece], x: f64) -> Vec<f64> {
    let piece = &pieces[pieces.iter().rposition(|p| p.from as f64 <= x).unwrap_or(0)];
    let n = piece.points[0].weights.len();
    (0..n).map(|k| Curve::of(&piece.points, 1.0, |w| w[k]).value(x)).collect()
}

/// A weight over the steps, piecewise linear with jumps, and its integral.
#[derive(Clone, Debug)]
pub(crate) struct Curve {
    xs: Vec<f64>,
    vs: Vec<f64>,
    /// The integral from 0 to `xs[i]`.
    prefix: Vec<f64>,
}

impl Curve {
    /// The curve of `pick(weights)` over `points`, over rows of `scale` a
    /// step: its integral from 0 to row `r` is a source's target among the
    /// first `r` rows (for one point of weight `w`, `r * w` exactly).
    pub(crate) fn of(points: &[SchedulePoint], scale: f64, pick: impl Fn(&[f64]) -> f64) -> Curve {
        let xs: Vec<f64> = points.iter().map(|p| p.step as f64 * scale).collect();
        let vs: Vec<f64> = points.iter().map(|p| pick(&p.weights)).collect();
        Curve::new(xs, vs)
    }

    fn new(xs: Vec<f64>, vs: Vec<f64>) -> Curve {
        let mut prefix = vec![0.0; xs.len()];
        for i in 1..xs.len() {
            prefix[i] = prefix[i - 1] + (xs[i] - xs[i - 1]) * (vs[i - 1] + vs[i]) / 2.0;
        }
        Curve { xs, vs, prefix }
    }

    /// The sum of `curves` (all over the same steps).
    pub(crate) fn sum(curves: &[&Curve]) -> Curve {
        let xs = curves[0].xs.clone();
        let vs = (0..xs.len()).map(|i| curves.iter().map(|c| c.vs[i]).sum()).collect();
        Curve::new(xs, vs)
    }

    /// The last point at or before `x`.
    fn at(&self, x: f64) -> usize {
        self.xs.partition_point(|&p| p <= x).saturating_sub(1)
    }

    /// The weight at `x` (after a jump there, the later one).
    fn value(&self, x: f64) -> f64 {
        let i = self.at(x);
        match self.xs.get(i + 1) {
            Some(&next) if x < next => {
                self.vs[i] + (self.vs[i + 1] - self.vs[i]) * (x - self.xs[i]) / (next - self.xs[i])
            }
            _ => self.vs[i],
        }
    }

    /// The integral from 0 to `x >= 0`.
    pub(crate) fn integral(&self, x: f64) -> f64 {
        let i = self.at(x);
        let u = x - self.xs[i];
        match self.xs.get(i + 1) {
            Some(&next) if x < next => {
                let slope = (self.vs[i + 1] - self.vs[i]) / (next - self.xs[i]);
                self.prefix[i] + u * (self.vs[i] + slope * u / 2.0)
            }
            _ => self.prefix[i] + u * self.vs[i],
        }
    }

    /// The least `x >= 0` whose integral reaches `y` (infinite when none
    /// does: the weight is 0 from some step on and `y` is past its total).
    pub(crate) fn inverse(&self, y: f64) -> f64 {
        if y <= 0.0 {
            return 0.0;
        }
        // The last point whose integral is below y.
        let i = self.prefix.partition_point(|&p| p < y).saturating_sub(1);
        let d = y - self.prefix[i];
        match self.xs.get(i + 1) {
            Some(&next) => {
                let (a, len) = (self.vs[i], next - self.xs[i]);
                let slope = (self.vs[i + 1] - a) / len;
                // a u + slope u^2 / 2 = d, in the form that holds for any
                // slope (no cancellation when it is near 0).
                let root = (a * a + 2.0 * slope * d).max(0.0).sqrt();
                let u = if a + root > 0.0 { 2.0 * d / (a + root) } else { len };
                self.xs[i] + u.min(len)
            }
            None if self.vs[i] > 0.0 => self.xs[i] + d / self.vs[i],
            None => f64::INFINITY,
        }
    }
}

/// The integral of one source (or a sum of sources) over a run of pieces:
/// each piece's curve from its `from` step to the next piece's.
#[derive(Clone, Debug)]
pub(crate) struct Track {
    /// Per piece: its first step, its curve, and the integral up to its
    /// first step.
    pieces: Vec<(f64, Curve, f64)>,
}

impl Track {
    /// A track of `curves`, each from its row on.
    pub(crate) fn new(curves: Vec<(f64, Curve)>) -> Track {
        let mut pieces: Vec<(f64, Curve, f64)> = Vec::with_capacity(curves.len());
        for (from, curve) in curves {
            let base = match pieces.last() {
                None => 0.0,
                Some((f, c, b)) => b + c.integral(from) - c.integral(*f),
            };
            pieces.push((from, curve, base));
        }
        Track { pieces }
    }

    /// The sum of `tracks` (the same pieces and steps).
    pub(crate) fn sum(tracks: &[&Track]) -> Track {
        let n = tracks[0].pieces.len();
        Track::new(
            (0..n)
                .map(|j| {
                    let curves: Vec<&Curve> = tracks.iter().map(|t| &t.pieces[j].1).collect();
                    (tracks[0].pieces[j].0, Curve::sum(&curves))
                })
                .collect(),
        )
    }

    fn piece(&self, x: f64) -> &(f64, Curve, f64) {
        &self.pieces[self.pieces.partition_point(|p| p.0 <= x).saturating_sub(1)]
    }

    /// The integral from 0 to `x`. Up to the second piece's first step, the
    /// first piece's integral itself.
    pub(crate) fn integral(&self, x: f64) -> f64 {
        let (from, curve, base) = self.piece(x);
        if *base == 0.0 && *from == 0.0 {
            curve.integral(x)
        } else {
            base + curve.integral(x) - curve.integral(*from)
        }
    }

    /// The least `x` whose integral reaches `y` (infinite if none).
    pub(crate) fn inverse(&self, y: f64) -> f64 {
        let j = self.pieces.partition_point(|p| p.2 < y).saturating_sub(1);
        // Piece j is the last that starts below y; its x lies in it unless
        // the weight is 0 through the rest of it.
        for (from, curve, base) in &self.pieces[j..] {
            let x = curve.inverse(y - base + curve.integral(*from)).max(*from);
            let next = self.pieces.iter().find(|p| p.0 > *from).map_or(f64::INFINITY, |p| p.0);
            if x < next {
                return x;
            }
        }
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: u64, weights: &[f64]) -> SchedulePoint {
        SchedulePoint { step, weights: weights.to_vec() }
    }

    #[test]
    fn integrals_of_linear_and_stepped_weights_and_their_inverses() {
        let p = SchedulePiece::new(0, 2, &[point(0, &[0.7, 0.3]), point(1000, &[0.3, 0.7])]).unwrap();
        let c = Curve::of(&p.points, 1.0, |w| w[0]);
        // The mean of 0.7 and 0.3 over 1,000 steps, then 0.3 a step.
        assert!((c.integral(1000.0) - 500.0).abs() < 1e-9);
        assert!((c.integral(1500.0) - 650.0).abs() < 1e-9);
        // Step t's share is the weight at its middle.
        assert!((c.integral(11.0) - c.integral(10.0) - (0.7 - 0.4 * 10.5 / 1000.0)).abs() < 1e-12);
        for y in [0.0, 0.3, 17.0, 499.9, 500.0, 640.0] {
            let x = c.inverse(y);
            assert!((c.integral(x) - y).abs() < 1e-9, "{y}: {x}");
        }
        let s =
            SchedulePiece::new(0, 2, &[point(0, &[1.0, 0.0]), point(10, &[1.0, 0.0]), point(10, &[0.0, 1.0])]).unwrap();
        let c = Curve::of(&s.points, 1.0, |w| w[1]);
        assert_eq!(c.integral(10.0), 0.0);
        assert_eq!(c.integral(12.5), 2.5);
        assert_eq!(c.inverse(2.5), 12.5);
        // Zero until step 10: the least step reaching a hair above 0 is 10.
        assert_eq!(c.inverse(1e-12), 10.0 + 1e-12);
        let first = Curve::of(&s.points, 1.0, |w| w[0]);
        assert_eq!(first.inverse(11.0), f64::INFINITY);
    }

    #[test]
    fn a_later_piece_leaves_the_integral_before_it_alone() {
        let a = SchedulePiece::new(0, 2, &[point(0, &[0.7, 0.3]), point(1000, &[0.3, 0.7])]).unwrap();
        let b = SchedulePiece::new(500, 2, &[point(0, &[0.1, 0.9])]).unwrap();
        let one = Track::new(vec![(0.0, Curve::of(&a.points, 1.0, |w| w[0]))]);
        let two =
            Track::new(vec![(0.0, Curve::of(&a.points, 1.0, |w| w[0])), (500.0, Curve::of(&b.points, 1.0, |w| w[0]))]);
        for x in [0.0, 1.0, 250.5, 499.0, 500.0] {
            assert_eq!(one.integral(x), two.integral(x));
        }
        assert!((two.integral(600.0) - (one.integral(500.0) + 10.0)).abs() < 1e-9);
        for y in [1.0, 300.0, 310.0, 330.0] {
            assert!((two.integral(two.inverse(y)) - y).abs() < 1e-9);
        }
    }

    #[test]
    fn schedules_that_cannot_be_are_refused() {
        let cases: &[&[SchedulePoint]] = &[
            &[],
            &[point(5, &[1.0, 1.0])],
            &[point(0, &[1.0])],
            &[point(0, &[1.0, 1.0]), point(3, &[1.0, 1.0]), point(2, &[1.0, 1.0])],
            &[point(0, &[1.0, 1.0]), point(3, &[1.0, 1.0]), point(3, &[1.0, 1.0]), point(3, &[1.0, 1.0])],
            &[point(0, &[1.0, -1.0])],
            &[point(0, &[0.0, 0.0])],
            &[point(0, &[1.0, 0.0]), point(9, &[2.0, 0.0])],
        ];
        for (i, points) in cases.iter().enumerate() {
            assert!(matches!(SchedulePiece::new(0, 2, points), Err(Error::BadSchedule { .. })), "case {i}");
        }
    }
}
