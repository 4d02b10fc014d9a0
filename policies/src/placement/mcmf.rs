//! Minimum-cost maximum flow by successive shortest paths with node potentials
//! (Dijkstra on reduced costs), for the load-balancing network of Paul et al. §III-C.
//!
//! The paper (§III-C2) minimises eq. (1) `Σ cost_ij · flow_ij` subject to eq. (2)
//! `0 ≤ flow_ij ≤ cap_ij` among the flows of maximum value, with a Ford–Fulkerson style
//! solver over the residual network: every arc `(i, j)` gets a reverse arc `(j, i)` of
//! cost `−cost_ij` and residual capacity `flow_ij`, and "the augmenting path that is
//! responsible for yielding the minimum cost is selected first … the next minimum cost
//! path is then selected and this continues until all the requests have been assigned".
//! That is successive shortest paths (SSP); we find each shortest path with Dijkstra on
//! the reduced costs `c(u,v) + π(u) − π(v) ≥ 0` (Edmonds–Karp/Tomizawa potentials), so a
//! path costs `O(E log V)` and the whole solve `O(F · E log V)` for a flow of value `F`.
//!
//! **Convex arcs.** An arc may have a marginal cost that grows with its flow: its
//! `u`-th unit (0-based) costs `cost + u · step` (`step ≥ 0`). This is the textbook
//! convex-cost arc, equivalent to `cap` parallel unit arcs of costs `cost`, `cost +
//! step`, … but without materialising them; SSP stays exact because marginal costs are
//! non-decreasing (the residual forward arc costs `cost + flow·step`, the reverse one
//! `−(cost + (flow−1)·step)`, and a convex arc is augmented one unit at a time). The
//! placement network uses it on OST → sink arcs so that an OST's cost is its load *with*
//! the stripes already given to it in this round (see [`super`]).
//!
//! Costs are integers (`i64`), so optimality is exact and results are deterministic
//! (ties are broken by node and arc order). Costs must be `≥ 0`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One arc of a [`Network`] as added (plus its flow after [`Network::solve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arc {
    /// Tail node.
    pub from: u32,
    /// Head node.
    pub to: u32,
    /// Capacity (`≥ 0`).
    pub cap: i64,
    /// Cost of the first unit (`≥ 0`).
    pub cost: i64,
    /// Increase of the marginal cost per unit already carried (`≥ 0`; 0 = linear arc).
    pub step: i64,
    /// Flow on the arc (set by [`Network::solve`]).
    pub flow: i64,
}

impl Arc {
    /// Cost of carrying `f` units on this arc: `Σ_{u<f} (cost + u·step)`.
    pub fn cost_of(&self, f: i64) -> i64 {
        self.cost * f + self.step * f * (f - 1) / 2
    }
}

/// A directed flow network with a source and a sink.
#[derive(Debug, Clone, Default)]
pub struct Network {
    nodes: usize,
    arcs: Vec<Arc>,
    /// Residual arcs leaving each node: `2·a` = arc `a` forward, `2·a + 1` = backward.
    adj: Vec<Vec<u32>>,
}

/// What [`Network::solve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowResult {
    /// Value of the flow (maximum, or `limit` if that is smaller).
    pub flow: i64,
    /// Its cost, eq. (1): `Σ` over arcs of [`Arc::cost_of`]`(flow)`.
    pub cost: i64,
    /// Augmenting paths used.
    pub paths: usize,
}

impl Network {
    /// An empty network with `nodes` nodes (numbered `0..nodes`).
    pub fn new(nodes: usize) -> Self {
        Network {
            nodes,
            arcs: Vec::new(),
            adj: vec![Vec::new(); nodes],
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Add an arc `from → to`; returns its index. Negative capacities and costs are
    /// clamped to 0 (the solver needs non-negative costs).
    pub fn add_arc(&mut self, from: usize, to: usize, cap: i64, cost: i64, step: i64) -> usize {
        assert!(from < self.nodes && to < self.nodes, "arc out of range");
        let a = self.arcs.len();
        self.arcs.push(Arc {
            from: from as u32,
            to: to as u32,
            cap: cap.max(0),
            cost: cost.max(0),
            step: step.max(0),
            flow: 0,
        });
        self.adj[from].push(2 * a as u32);
        self.adj[to].push(2 * a as u32 + 1);
        a
    }

    /// The arcs, with their flows.
    pub fn arcs(&self) -> &[Arc] {
        &self.arcs
    }

    /// Flow on arc `a`.
    pub fn flow(&self, a: usize) -> i64 {
        self.arcs[a].flow
    }

    /// Residual capacity and marginal cost of residual arc `r`, and its head.
    #[inline]
    fn residual(&self, r: u32) -> (i64, i64, usize) {
        let a = &self.arcs[(r / 2) as usize];
        if r.is_multiple_of(2) {
            (a.cap - a.flow, a.cost + a.flow * a.step, a.to as usize)
        } else {
            let c = if a.flow > 0 {
                -(a.cost + (a.flow - 1) * a.step)
            } else {
                0
            };
            (a.flow, c, a.from as usize)
        }
    }

    /// Send a flow of maximum value (at most `limit`) from `source` to `sink` at minimum
    /// cost among flows of that value (eqs. 1–2), starting from zero flow.
    pub fn solve(&mut self, source: usize, sink: usize, limit: i64) -> FlowResult {
        for a in &mut self.arcs {
            a.flow = 0;
        }
        let n = self.nodes;
        let mut pot = vec![0i64; n];
        let mut dist = vec![i64::MAX; n];
        let mut via = vec![u32::MAX; n];
        let mut done = vec![false; n];
        let mut heap = BinaryHeap::new();
        let mut total = 0i64;
        let mut paths = 0usize;
        while total < limit && source != sink {
            // Dijkstra on reduced costs; stop as soon as the sink is settled.
            dist.iter_mut().for_each(|d| *d = i64::MAX);
            done.iter_mut().for_each(|d| *d = false);
            via.iter_mut().for_each(|v| *v = u32::MAX);
            heap.clear();
            dist[source] = 0;
            heap.push(Reverse((0i64, source as u32)));
            while let Some(Reverse((d, u))) = heap.pop() {
                let u = u as usize;
                if done[u] || d > dist[u] {
                    continue;
                }
                done[u] = true;
                if u == sink {
                    break;
                }
                for &r in &self.adj[u] {
                    let (res, c, v) = self.residual(r);
                    if res <= 0 || done[v] {
                        continue;
                    }
                    let nd = d + c + pot[u] - pot[v];
                    debug_assert!(c + pot[u] - pot[v] >= 0, "negative reduced cost");
                    if nd < dist[v] {
                        dist[v] = nd;
                        via[v] = r;
                        heap.push(Reverse((nd, v as u32)));
                    }
                }
            }
            if !done[sink] {
                break;
            }
            // π(v) += min(d(v), d(sink)): keeps every residual reduced cost ≥ 0 even for
            // nodes not settled before the early exit.
            let dt = dist[sink];
            for v in 0..n {
                pot[v] += dist[v].min(dt);
            }
            // Bottleneck along the path (convex arcs: one unit at a time).
            let mut push = limit - total;
            let mut v = sink;
            while v != source {
                let r = via[v];
                let (res, _, _) = self.residual(r);
                push = push.min(res);
                let a = &self.arcs[(r / 2) as usize];
                if a.step > 0 {
                    push = push.min(1);
                }
                v = if r % 2 == 0 {
                    a.from as usize
                } else {
                    a.to as usize
                };
            }
            let mut v = sink;
            while v != source {
                let r = via[v];
                let a = &mut self.arcs[(r / 2) as usize];
                if r % 2 == 0 {
                    a.flow += push;
                    v = a.from as usize;
                } else {
                    a.flow -= push;
                    v = a.to as usize;
                }
            }
            total += push;
            paths += 1;
        }
        FlowResult {
            flow: total,
            cost: self.arcs.iter().map(|a| a.cost_of(a.flow)).sum(),
            paths,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convex_arc_spreads_units() {
        // s → a, s → b (cap 3 each), a → t and b → t convex: 3 units prefer 2 + 1.
        let mut n = Network::new(4);
        n.add_arc(0, 1, 3, 0, 0);
        n.add_arc(0, 2, 3, 0, 0);
        let at = n.add_arc(1, 3, 3, 10, 5);
        let bt = n.add_arc(2, 3, 3, 12, 5);
        let r = n.solve(0, 3, 3);
        assert_eq!(r.flow, 3);
        assert_eq!((n.flow(at), n.flow(bt)), (2, 1));
        assert_eq!(r.cost, 10 + 15 + 12);
    }

    #[test]
    fn reroutes_through_reverse_arcs() {
        // Classic: the greedy first path must be undone to reach the maximum flow.
        let mut n = Network::new(4);
        n.add_arc(0, 1, 1, 0, 0);
        n.add_arc(0, 2, 1, 0, 0);
        n.add_arc(1, 2, 1, 0, 0);
        n.add_arc(1, 3, 1, 5, 0);
        n.add_arc(2, 3, 1, 0, 0);
        let r = n.solve(0, 3, i64::MAX);
        assert_eq!(r.flow, 2);
        assert_eq!(r.cost, 5);
    }
}
