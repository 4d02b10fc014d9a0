//! Minimum-cost maximum flow by successive shortest paths (small flows) or cost scaling
//! (Goldberg–Tarjan push-relabel; large ones), for the load-balancing network of Paul et
//! al. §III-C.
//!
//! The paper (§III-C2) minimises eq. (1) `Σ cost_ij · flow_ij` subject to eq. (2)
//! `0 ≤ flow_ij ≤ cap_ij` among the flows of maximum value, with a Ford–Fulkerson style
//! solver that takes "the augmenting path that is responsible for yielding the minimum
//! cost … first" — successive shortest paths, one shortest-path search per unit of flow
//! when arcs are convex. That is [`Method::ShortestPaths`], with Dijkstra on reduced costs
//! (node potentials): cheapest for the few units of one decision. For a batch we reach
//! the same optimum (eqs. 1–2 say what is optimal, not how to find it) in two steps
//! ([`Method::CostScaling`]):
//!
//! 1. **Maximum flow** (Dinic's blocking flows), capped at `limit`: its value is the
//!    value of the answer, and the flow is a feasible start.
//! 2. **Cost scaling**: with costs multiplied by `n + 1` (`n` nodes), refine the flow to
//!    `ε`-optimality (every residual arc has reduced cost `c(u,v) + p(u) − p(v) ≥ −ε`)
//!    for `ε` divided by 8 each phase down to 1, by pushing excess along arcs of negative
//!    reduced cost and lowering potentials (FIFO order, current-arc pointers). A flow
//!    that is 1-optimal in the scaled costs is optimal in the original integer costs.
//!    Each push or relabel is local, so the work grows with the network's size and
//!    `log(n · max cost)`, not with one search of the whole network per unit.
//!
//! **Convex arcs.** An arc may have a marginal cost that grows with its flow: its
//! `u`-th unit (0-based) costs `cost + u · step` (`step ≥ 0`). This is the textbook
//! convex-cost arc, equivalent to `cap` parallel unit arcs of costs `cost`, `cost +
//! step`, … but without materialising them: the residual forward arc's next unit costs
//! `cost + flow·step`, the reverse one `−(cost + (flow−1)·step)`, and a push moves the
//! units whose reduced cost is negative (counted in `O(1)`). The placement network uses
//! it on OST and OSS arcs so that an OST's cost is its load *with* the stripes already
//! given to it in this round (see [`super`]).
//!
//! Costs are integers (`i64`; scaled costs and potentials in `i128`), so optimality is
//! exact and results are deterministic. Costs must be `≥ 0`.

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

/// Flows of at most this many units are solved by successive shortest paths: one
/// Dijkstra per unit is then cheaper than cost scaling's phases over the whole network
/// (a decision for one request of 4 stripes and 3 predicted ones is 16 units).
pub const SHORTEST_PATHS_UP_TO: i64 = 64;

/// The algorithms of [`Network::solve_by`]; both give a minimum-cost maximum flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Successive shortest paths (the paper's "minimum-cost augmenting path first").
    ShortestPaths,
    /// Maximum flow, then cost scaling.
    CostScaling,
}

/// What [`Network::solve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowResult {
    /// Value of the flow (maximum, or `limit` if that is smaller).
    pub flow: i64,
    /// Its cost, eq. (1): `Σ` over arcs of [`Arc::cost_of`]`(flow)`.
    pub cost: i64,
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

    /// Residual capacity of residual arc `r` (`2·a` = arc `a` forward, `2·a + 1` =
    /// backward) and its head.
    #[inline]
    fn residual(&self, r: u32) -> (i64, usize) {
        let a = &self.arcs[(r / 2) as usize];
        if r.is_multiple_of(2) {
            (a.cap - a.flow, a.to as usize)
        } else {
            (a.flow, a.from as usize)
        }
    }

    /// Cost of the next unit along residual arc `r` (forward: the next unit's; backward:
    /// minus the last unit's).
    #[inline]
    fn marginal(&self, r: u32) -> i64 {
        let a = &self.arcs[(r / 2) as usize];
        if r.is_multiple_of(2) {
            a.cost + a.flow * a.step
        } else {
            -(a.cost + (a.flow - 1) * a.step)
        }
    }

    /// Move `units` along residual arc `r`.
    #[inline]
    fn push(&mut self, r: u32, units: i64) {
        let a = &mut self.arcs[(r / 2) as usize];
        if r.is_multiple_of(2) {
            a.flow += units;
        } else {
            a.flow -= units;
        }
    }

    /// Send a flow of maximum value (at most `limit`) from `source` to `sink` at minimum
    /// cost among flows of that value (eqs. 1–2), starting from zero flow: by successive
    /// shortest paths if that value is at most [`SHORTEST_PATHS_UP_TO`], else by cost
    /// scaling.
    pub fn solve(&mut self, source: usize, sink: usize, limit: i64) -> FlowResult {
        self.solve_by(source, sink, limit, None)
    }

    /// [`Network::solve`] with the algorithm chosen (`None`: by the flow's value).
    pub fn solve_by(
        &mut self,
        source: usize,
        sink: usize,
        limit: i64,
        method: Option<Method>,
    ) -> FlowResult {
        for a in &mut self.arcs {
            a.flow = 0;
        }
        let flow = if source == sink {
            0
        } else {
            self.max_flow(source, sink, limit.max(0))
        };
        let method = method.unwrap_or(if flow <= SHORTEST_PATHS_UP_TO {
            Method::ShortestPaths
        } else {
            Method::CostScaling
        });
        match method {
            Method::ShortestPaths => {
                for a in &mut self.arcs {
                    a.flow = 0;
                }
                self.shortest_paths(source, sink, flow);
            }
            Method::CostScaling => CostScaling::new(self).run(),
        }
        FlowResult {
            flow,
            cost: self.arcs.iter().map(|a| a.cost_of(a.flow)).sum(),
        }
    }

    /// Successive shortest paths from zero flow up to `value` units (a value the network
    /// can carry): Dijkstra on the reduced costs `c(u,v) + π(u) − π(v) ≥ 0`, convex arcs
    /// one unit at a time.
    fn shortest_paths(&mut self, source: usize, sink: usize, value: i64) {
        let n = self.nodes;
        let mut pot = vec![0i64; n];
        let mut dist = vec![i64::MAX; n];
        let mut via = vec![u32::MAX; n];
        let mut done = vec![false; n];
        let mut heap = BinaryHeap::new();
        let mut total = 0i64;
        while total < value {
            // Dijkstra on reduced costs; stop as soon as the sink is settled.
            dist.iter_mut().for_each(|d| *d = i64::MAX);
            done.iter_mut().for_each(|d| *d = false);
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
                    let (res, v) = self.residual(r);
                    if res <= 0 || done[v] {
                        continue;
                    }
                    let reduced = self.marginal(r) + pot[u] - pot[v];
                    debug_assert!(reduced >= 0, "negative reduced cost");
                    if d + reduced < dist[v] {
                        dist[v] = d + reduced;
                        via[v] = r;
                        heap.push(Reverse((d + reduced, v as u32)));
                    }
                }
            }
            if !done[sink] {
                break; // only if `value` was more than the network carries
            }
            // π(v) += min(d(v), d(sink)): keeps every residual reduced cost ≥ 0 even for
            // nodes not settled before the early exit.
            let to_sink = dist[sink];
            for v in 0..n {
                pot[v] += dist[v].min(to_sink);
            }
            // Bottleneck along the path (convex arcs: one unit at a time).
            let mut path = Vec::new();
            let mut push = value - total;
            let mut v = sink;
            while v != source {
                let r = via[v];
                let a = &self.arcs[(r / 2) as usize];
                push = push.min(self.residual(r).0);
                if a.step > 0 {
                    push = push.min(1);
                }
                v = if r.is_multiple_of(2) { a.from } else { a.to } as usize;
                path.push(r);
            }
            for r in path {
                self.push(r, push);
            }
            total += push;
        }
    }

    /// Dinic: blocking flows along BFS levels until `limit` or no augmenting path.
    fn max_flow(&mut self, source: usize, sink: usize, limit: i64) -> i64 {
        let mut total = 0;
        let mut level = vec![u32::MAX; self.nodes];
        let mut next = vec![0usize; self.nodes];
        let mut queue = Vec::with_capacity(self.nodes);
        while total < limit {
            level.iter_mut().for_each(|l| *l = u32::MAX);
            level[source] = 0;
            queue.clear();
            queue.push(source);
            let mut head = 0;
            while head < queue.len() {
                let u = queue[head];
                head += 1;
                for &r in &self.adj[u] {
                    let (res, v) = self.residual(r);
                    if res > 0 && level[v] == u32::MAX {
                        level[v] = level[u] + 1;
                        queue.push(v);
                    }
                }
            }
            if level[sink] == u32::MAX {
                break;
            }
            next.iter_mut().for_each(|i| *i = 0);
            loop {
                let sent = self.blocking(source, sink, limit - total, &level, &mut next);
                if sent == 0 {
                    break;
                }
                total += sent;
                if total == limit {
                    break;
                }
            }
        }
        total
    }

    /// One augmenting path of at most `want` units along increasing levels (DFS with
    /// per-node arc pointers, so dead ends are not retried).
    fn blocking(
        &mut self,
        u: usize,
        sink: usize,
        want: i64,
        level: &[u32],
        next: &mut [usize],
    ) -> i64 {
        if u == sink {
            return want;
        }
        while next[u] < self.adj[u].len() {
            let r = self.adj[u][next[u]];
            let (res, v) = self.residual(r);
            if res > 0 && level[v] == level[u] + 1 {
                let sent = self.blocking(v, sink, want.min(res), level, next);
                if sent > 0 {
                    self.push(r, sent);
                    return sent;
                }
            }
            next[u] += 1;
        }
        0
    }
}

/// The refinement phases of [`Network::solve`] on a feasible flow.
struct CostScaling<'n> {
    net: &'n mut Network,
    /// `n + 1`: costs are multiplied by it so that 1-optimal means optimal.
    scale: i128,
    potential: Vec<i128>,
    excess: Vec<i64>,
    /// Current-arc pointer of each node (index into its adjacency).
    next: Vec<usize>,
}

impl<'n> CostScaling<'n> {
    fn new(net: &'n mut Network) -> Self {
        let n = net.nodes;
        CostScaling {
            net,
            scale: n as i128 + 1,
            potential: vec![0; n],
            excess: vec![0; n],
            next: vec![0; n],
        }
    }

    fn run(&mut self) {
        // With zero potentials only the backward arcs, of cost −(the last unit's cost),
        // are negative: the starting flow is ε-optimal for the most costly last unit.
        let mut eps = self
            .net
            .arcs
            .iter()
            .filter(|a| a.flow > 0)
            .map(|a| (a.cost as i128 + a.step as i128 * (a.flow as i128 - 1)) * self.scale)
            .max()
            .unwrap_or(0);
        while eps > 1 {
            eps = (eps / 8).max(1);
            self.refine(eps);
        }
    }

    /// Scaled reduced cost of the `u`-th unit (0-based) of arc `a` forward.
    #[inline]
    fn reduced(&self, a: &Arc, u: i64) -> i128 {
        (a.cost as i128 + u as i128 * a.step as i128) * self.scale + self.potential[a.from as usize]
            - self.potential[a.to as usize]
    }

    /// Units of residual arc `r` with negative reduced cost (admissible): forward, the
    /// next units while `reduced < 0`; backward, the last units while `reduced > 0`.
    #[inline]
    fn admissible(&self, r: u32) -> i64 {
        let a = &self.net.arcs[(r / 2) as usize];
        let forward = r.is_multiple_of(2);
        let (res, unit) = if forward {
            (a.cap - a.flow, a.flow)
        } else {
            (a.flow, a.flow - 1)
        };
        if res <= 0 {
            return 0;
        }
        let first = self.reduced(a, unit);
        if forward && first >= 0 || !forward && first <= 0 {
            return 0;
        }
        if a.step == 0 {
            return res;
        }
        // Units `unit ± k` stay admissible while `|first| > k · step · scale`.
        let per_unit = a.step as i128 * self.scale;
        let k = (first.abs() - 1) / per_unit + 1;
        k.min(res as i128) as i64
    }

    /// From an ε·8-optimal flow to an ε-optimal one of the same value.
    fn refine(&mut self, eps: i128) {
        // Saturate every admissible unit: all reduced costs become ≥ 0.
        for r in 0..2 * self.net.arcs.len() as u32 {
            let units = self.admissible(r);
            if units > 0 {
                self.net.push(r, units);
                let a = &self.net.arcs[(r / 2) as usize];
                let (from, to) = if r.is_multiple_of(2) {
                    (a.from, a.to)
                } else {
                    (a.to, a.from)
                };
                self.excess[from as usize] -= units;
                self.excess[to as usize] += units;
            }
        }
        let mut active: std::collections::VecDeque<usize> = (0..self.net.nodes)
            .filter(|&v| self.excess[v] > 0)
            .collect();
        self.next.iter_mut().for_each(|i| *i = 0);
        while let Some(v) = active.pop_front() {
            // Discharge v: push along admissible arcs, relabel when none is left.
            while self.excess[v] > 0 {
                if self.next[v] == self.net.adj[v].len() {
                    self.relabel(v, eps);
                    self.next[v] = 0;
                    continue;
                }
                let r = self.net.adj[v][self.next[v]];
                let units = self.admissible(r).min(self.excess[v]);
                if units == 0 {
                    self.next[v] += 1;
                    continue;
                }
                let (_, w) = self.net.residual(r);
                self.net.push(r, units);
                self.excess[v] -= units;
                if self.excess[w] <= 0 && self.excess[w] + units > 0 {
                    active.push_back(w);
                }
                self.excess[w] += units;
            }
        }
    }

    /// Lower `v`'s potential so that its cheapest residual arc has reduced cost `−ε`.
    fn relabel(&mut self, v: usize, eps: i128) {
        let best = self.net.adj[v]
            .iter()
            .filter_map(|&r| {
                let (res, w) = self.net.residual(r);
                (res > 0).then(|| self.potential[w] - self.net.marginal(r) as i128 * self.scale)
            })
            .max()
            .expect("a node with excess has a residual arc (the flow is feasible)");
        self.potential[v] = best - eps;
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
