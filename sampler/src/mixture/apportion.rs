//! How the rows so far are counted per source: the largest-remainder
//! allocation, and the rounding tree for sources of under a row per batch
//! (module docs of [`crate::mixture`]).

use crate::schedule::Track;

/// The largest-remainder allocation of `rows` by `quotas` (summing to
/// `rows`) into `out`: floors first, then one more row to each of the
/// largest remainders (ties to the lower source) until `rows` are given.
/// `order` is scratch.
pub(super) fn allocate(quotas: &[f64], rows: u64, out: &mut [u64], order: &mut Vec<(f64, usize)>) {
    order.clear();
    let mut given = 0u64;
    for (k, (&q, o)) in quotas.iter().zip(out.iter_mut()).enumerate() {
        let f = q.floor();
        *o = f as u64;
        given += *o;
        order.push((q - f, k));
    }
    // Rounded products may sum a hair past `rows` at astronomical row counts:
    // then nobody gets more.
    let left = rows.saturating_sub(given) as usize;
    if left == 0 {
        return;
    }
    let ahead = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if left < order.len() {
        order.select_nth_unstable_by(left - 1, ahead);
    }
    for &(_, k) in order.iter().take(left) {
        out[k] += 1;
    }
}

/// How a mixture counts each source's rows among the first `r` (module
/// docs).
#[derive(Clone, Debug)]
pub(super) enum Apportion {
    /// Every source gets at least a row per batch: largest remainders of
    /// all the shares.
    Hamilton,
    /// Some source gets under a row per batch: nearest roundings down a
    /// tree.
    Tree(Tree),
}

impl Apportion {
    /// `big[k]`: source `k` gets a row per batch or more (for fixed weights
    /// `w_k B >= 1`, the test the earlier refusal made, so that every
    /// mixture accepted then keeps its batches).
    pub(super) fn new(weights: &[f64], big: &[bool]) -> Apportion {
        if big.iter().all(|&b| b) {
            Apportion::Hamilton
        } else {
            Apportion::Tree(Tree::new(weights, big))
        }
    }
}

/// The rounding tree (module docs): node 0 holds all the rows, a split gives
/// its first child the nearest integer to its share of the node's rows and
/// the second child the rest, and each leaf is a source of under a row per
/// batch or the group of all the others.
#[derive(Clone, Debug)]
pub(super) struct Tree {
    /// Parents before their children.
    nodes: Vec<Node>,
    /// The sources of at least a row per batch, ascending: the group leaf's.
    pub(super) big: Vec<usize>,
    /// The others, ascending: a leaf each.
    pub(super) tiny: Vec<usize>,
    /// The most a leaf's rows so far can be from its share, in rows (the
    /// group's: of the group's share; each of its members is then within a
    /// row of its own when this is under one), from the rounding alone.
    pub(super) bound: f64,
}

#[derive(Clone, Copy, Debug)]
enum Node {
    /// `first` takes `share` of the node's rows, rounded to nearest (halves
    /// up); `second` the rest.
    Split { share: f64, first: usize, second: usize },
    /// All the node's rows are this source's.
    Source(usize),
    /// The node's rows go to the sources of at least a row per batch,
    /// each its global share rounded down or up by largest remainders.
    Group,
}

/// A leaf while the tree is built: its weight and what it is.
#[derive(Clone, Copy, Debug)]
struct Leaf {
    weight: f64,
    node: Node,
}

/// How many levels below a split [`Tree::new`] looks when choosing it:
/// three for mixtures of up to `LOOK_LEVELS[0]` leaves, two up to
/// `LOOK_LEVELS[1]`, one beyond.
const LOOK_LEVELS: [usize; 2] = [12, 24];

/// Up to this many leaves, [`Tree::build`] tries every tree
/// ([`exact_split`]: about 400,000 subtrees at 8).
const EXACT: usize = 8;

/// Above this many leaves, [`Tree::build`] tries prefixes only
/// ([`Tree::build_wide`]).
const WIDE: usize = 64;

impl Tree {
    pub(super) fn new(weights: &[f64], is_big: &[bool]) -> Tree {
        let big: Vec<usize> = (0..weights.len()).filter(|&k| is_big[k]).collect();
        let mut leaves: Vec<Leaf> = (0..weights.len())
            .filter(|&k| !is_big[k])
            .map(|k| Leaf { weight: weights[k], node: Node::Source(k) })
            .collect();
        if !big.is_empty() {
            let weight = big.iter().map(|&k| weights[k]).sum();
            leaves.push(Leaf { weight, node: Node::Group });
        }
        // Heaviest first; ties by source, the group after the sources (a
        // fixed order: the tree is part of what a saved run's batches are).
        let key = |l: &Leaf| match l.node {
            Node::Source(k) => k,
            _ => usize::MAX,
        };
        leaves.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(key(a).cmp(&key(b))));
        let tiny = (0..weights.len()).filter(|&k| !is_big[k]).collect();
        let mut tree = Tree { nodes: Vec::new(), big, tiny, bound: 0.0 };
        let lookahead = 1 + LOOK_LEVELS.iter().filter(|&&n| leaves.len() <= n).count();
        tree.build(&leaves, 0.0, 0, lookahead);
        tree
    }

    /// Adds the subtree of `leaves` (heaviest first) at `depth`, whose
    /// ancestors below the root sum `1 / W` to `above`; returns its node.
    ///
    /// A node at depth `d >= 1` of weight `W` is `W r` rounded to nearest
    /// from its parent's count, so its error is its parent's error times
    /// `W / W_parent` plus at most half a row: a leaf of weight `w` is off
    /// by at most `(1 + w * sum of 1 / W_a over its ancestors a below the
    /// root) / 2` rows. The splits are chosen to keep that under one.
    fn build(&mut self, leaves: &[Leaf], above: f64, depth: usize, lookahead: usize) -> usize {
        let at = self.nodes.len();
        if let [leaf] = leaves {
            self.bound = self.bound.max(0.5 + 0.5 * leaf.weight * above);
            self.nodes.push(leaf.node);
            return at;
        }
        let total: f64 = leaves.iter().map(|l| l.weight).sum();
        let here = if depth == 0 { above } else { above + 1.0 / total };
        let weights: Vec<f64> = leaves.iter().map(|l| l.weight).collect();
        if weights.len() > WIDE {
            return self.build_wide(leaves, here, total, depth, lookahead);
        }
        if weights.len() <= EXACT {
            let full = (1u32 << weights.len()) - 1;
            let (_, first) = exact_split(&weights, full, above, depth);
            let part = |inside: bool| {
                (0..leaves.len()).filter(|&i| (first >> i & 1 == 1) == inside).map(|i| leaves[i]).collect::<Vec<_>>()
            };
            return self.split(leaves.len(), part(true), part(false), total, here, depth, lookahead);
        }
        let mut best = (f64::INFINITY, 0);
        for (c, (first, second)) in candidates(weights.len()).enumerate() {
            let pick = |set: &[usize]| set.iter().map(|&i| weights[i]).collect::<Vec<f64>>();
            let score = worst(&pick(&first), here, depth + 1, lookahead - 1).max(worst(
                &pick(&second),
                here,
                depth + 1,
                lookahead - 1,
            ));
            if score < best.0 {
                best = (score, c);
            }
        }
        let (first, second) = candidates(weights.len()).nth(best.1).expect("a split of two or more leaves");
        let pick = |set: &[usize]| set.iter().map(|&i| leaves[i]).collect::<Vec<Leaf>>();
        self.split(leaves.len(), pick(&first), pick(&second), total, here, depth, lookahead)
    }

    /// Adds a split of `n` leaves into `first` and `second` (weights
    /// `total`, `here` the sum of `1 / W` down to it) and their subtrees.
    #[allow(clippy::too_many_arguments)]
    fn split(
        &mut self,
        n: usize,
        first: Vec<Leaf>,
        second: Vec<Leaf>,
        total: f64,
        here: f64,
        depth: usize,
        lookahead: usize,
    ) -> usize {
        debug_assert_eq!(first.len() + second.len(), n);
        let at = self.nodes.len();
        let share = first.iter().map(|l| l.weight).sum::<f64>() / total;
        self.nodes.push(Node::Split { share, first: 0, second: 0 });
        let f = self.build(&first, here, depth + 1, lookahead);
        let s = self.build(&second, here, depth + 1, lookahead);
        self.nodes[at] = Node::Split { share, first: f, second: s };
        at
    }

    /// [`Tree::build`] for more than [`WIDE`] leaves: a prefix and the
    /// rest only, each scored by its heaviest leaf one level down, in
    /// `O(leaves)` (`O(leaves^2)` for the tree).
    fn build_wide(&mut self, leaves: &[Leaf], here: f64, total: f64, depth: usize, lookahead: usize) -> usize {
        let at = self.nodes.len();
        let n = leaves.len();
        let mut prefix = vec![0.0; n + 1];
        for (i, l) in leaves.iter().enumerate() {
            prefix[i + 1] = prefix[i] + l.weight;
        }
        // Heaviest first: a part's heaviest leaf is its first.
        let score = |from: usize, to: usize| {
            let w = leaves[from].weight;
            if to - from == 1 {
                w * here
            } else {
                w * (here + 1.0 / (prefix[to] - prefix[from]))
            }
        };
        let k = (1..n)
            .map(|k| (score(0, k).max(score(k, n)), k))
            .fold((f64::INFINITY, 1), |a, b| if b.0 < a.0 { b } else { a })
            .1;
        let share = prefix[k] / total;
        self.nodes.push(Node::Split { share, first: 0, second: 0 });
        let f = self.build(&leaves[..k], here, depth + 1, lookahead);
        let s = self.build(&leaves[k..], here, depth + 1, lookahead);
        self.nodes[at] = Node::Split { share, first: f, second: s };
        at
    }

    /// Each node's integral over a schedule, for each split: its own and its
    /// first child's (indexed by node; `None` for leaves).
    pub(super) fn split_tracks(&self, sources: &[Track]) -> Vec<Option<(Track, Track)>> {
        let mut of: Vec<Option<Track>> = vec![None; self.nodes.len()];
        // Children come after their parents: fill from the end.
        for i in (0..self.nodes.len()).rev() {
            of[i] = Some(match self.nodes[i] {
                Node::Source(k) => sources[k].clone(),
                Node::Group => Track::sum(&self.big.iter().map(|&k| &sources[k]).collect::<Vec<_>>()),
                Node::Split { first, second, .. } => {
                    Track::sum(&[of[first].as_ref().expect("child"), of[second].as_ref().expect("child")])
                }
            });
        }
        (0..self.nodes.len())
            .map(|i| match self.nodes[i] {
                Node::Split { first, .. } => Some((of[i].clone().expect("node"), of[first].clone().expect("child"))),
                _ => None,
            })
            .collect()
    }

    /// Each source's rows among the first `rows`, into `out`, from their
    /// targets `quotas`. With a schedule (`splits`: each split's tracks,
    /// and the rows per batch), a split gives its first child the nearest
    /// integer to the child's target at the step where the node's target
    /// reaches the node's rows (module docs).
    pub(super) fn allocate(
        &self,
        quotas: &[f64],
        splits: Option<&[Option<(Track, Track)>]>,
        rows: u64,
        out: &mut [u64],
        order: &mut Vec<(f64, usize)>,
    ) {
        let mut count = vec![0u64; self.nodes.len()];
        count[0] = rows;
        for (i, node) in self.nodes.iter().enumerate() {
            match *node {
                Node::Split { share, first, second } => {
                    let n = count[i];
                    let want = match splits {
                        None => share * n as f64,
                        Some(tracks) => {
                            let (node, child) = tracks[i].as_ref().expect("a split's tracks");
                            let x = node.inverse(n as f64);
                            if x.is_finite() {
                                child.integral(x)
                            } else {
                                // The node's weight is 0 from some step on
                                // and its rows are past its target: the
                                // child's share of the whole.
                                child.integral(f64::MAX.sqrt())
                            }
                        }
                    };
                    // Nearest, halves up; never more than the node holds.
                    let f = ((want + 0.5).floor() as u64).min(n);
                    count[first] = f;
                    count[second] = n - f;
                }
                Node::Source(k) => out[k] = count[i],
                Node::Group => apportion_group(quotas, &self.big, count[i], out, order),
            }
        }
    }
}

/// The least largest `w * (sum of 1 / W_a over ancestors)` any subtree of
/// the leaves in `mask` (of `weights`) can have, its ancestors above it
/// summing to `above`, and the leaves its best split puts first (the one
/// with the lowest leaf of the first such split found; 0 for a leaf).
pub(super) fn exact_split(weights: &[f64], mask: u32, above: f64, depth: usize) -> (f64, u32) {
    if mask.count_ones() == 1 {
        return (weights[mask.trailing_zeros() as usize] * above, 0);
    }
    let total: f64 = (0..weights.len()).filter(|&i| mask >> i & 1 == 1).map(|i| weights[i]).sum();
    let here = if depth == 0 { above } else { above + 1.0 / total };
    let low = mask & mask.wrapping_neg();
    let rest = mask ^ low;
    let mut best = (f64::INFINITY, 0);
    // Every split once: the first part holds the lowest leaf.
    let mut sub = rest;
    loop {
        let first = low | sub;
        if first != mask {
            let a = exact_split(weights, first, here, depth + 1).0;
            if a < best.0 {
                let score = a.max(exact_split(weights, mask ^ first, here, depth + 1).0);
                if score < best.0 {
                    best = (score, first);
                }
            }
        }
        if sub == 0 {
            break;
        }
        sub = (sub - 1) & rest;
    }
    best
}

/// The splits of `n >= 2` leaves (heaviest first) tried: a prefix and the
/// rest, and the heaviest with a suffix and the rest (a heavy leaf with the
/// lightest ones, the others together).
fn candidates(n: usize) -> impl Iterator<Item = (Vec<usize>, Vec<usize>)> {
    let prefixes = (1..n).map(move |k| ((0..k).collect(), (k..n).collect()));
    let ends = (2..n).map(move |j| (std::iter::once(0).chain(j..n).collect(), (1..j).collect()));
    prefixes.chain(ends)
}

/// The largest `w * (sum of 1 / W_a over ancestors)` a subtree of
/// `weights` (heaviest first) can be held to, looking `lookahead` levels
/// down (at 0, a bound from below: the heaviest leaf lies below the node).
fn worst(weights: &[f64], above: f64, depth: usize, lookahead: usize) -> f64 {
    if let [w] = weights {
        return w * above;
    }
    let total: f64 = weights.iter().sum();
    let here = if depth == 0 { above } else { above + 1.0 / total };
    if lookahead == 0 {
        return weights[0] * here;
    }
    let pick = |set: &[usize]| set.iter().map(|&i| weights[i]).collect::<Vec<f64>>();
    candidates(weights.len())
        .map(|(first, second)| {
            worst(&pick(&first), here, depth + 1, lookahead - 1).max(worst(
                &pick(&second),
                here,
                depth + 1,
                lookahead - 1,
            ))
        })
        .fold(f64::INFINITY, f64::min)
}

/// Gives `members` (the sources of at least a row per batch) `total` rows:
/// each its target `quotas[k]` (its global share) rounded down,
/// then one more to the largest remainders (ties to the lower source) until
/// `total` are given. The tree keeps `total` within a row of the members'
/// share, which makes that each member's share rounded down or up; should
/// float rounding ever leave it outside, the rows still add up.
fn apportion_group(quotas: &[f64], members: &[usize], total: u64, out: &mut [u64], order: &mut Vec<(f64, usize)>) {
    order.clear();
    let mut given = 0u64;
    for &k in members {
        let q = quotas[k];
        let f = q.floor();
        out[k] = f as u64;
        given += out[k];
        order.push((q - f, k));
    }
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let n = order.len() as u64;
    if total >= given {
        let left = total - given;
        for (i, &(_, k)) in order.iter().enumerate() {
            out[k] += left / n + u64::from((i as u64) < left % n);
        }
    } else {
        // Take back from the smallest remainders.
        let mut over = given - total;
        while over > 0 {
            for &(_, k) in order.iter().rev() {
                if over > 0 && out[k] > 0 {
                    out[k] -= 1;
                    over -= 1;
                }
            }
        }
    }
}
