//! ThemisIO fairness policies (ThemisIO paper §2.2.2, §3) with opportunity fairness.
//!
//! A policy is a list of *levels* from the root down, e.g. `group,user,size`:
//! the capacity is split evenly across groups, then evenly across the users of each
//! group, then across each user's jobs in proportion to their size (ThemisIO's
//! "group-user-size-fair", Fig. 11). Primitive policies are one-level lists:
//! `job` (job-fair), `size` (size-fair), `user` (user-fair), `priority`
//! (priority-fair), `group` (group-fair).
//!
//! **Ideal shares** (§3, eq. (1)): the share of every job is the product of the
//! per-level transition matrices `Π T^i`. Each `T^i` has one row per entity of level
//! `i−1` and one column per entity of level `i`, with only one non-zero per column (an
//! entity belongs to one parent), so the product reduces to multiplying, along the path
//! from the root to the job, each entity's fraction of its parent scope.
//! [`transition_matrices`] builds the matrices explicitly (the tests check that their
//! product equals [`ideal_shares`]).
//!
//! **Opportunity fairness** (§1, §5.3.1): fairness is enforced only when the resource
//! is over-subscribed; the share of an entity that does not use it goes to the entities
//! that do. At every node of the tree the node's rate is water-filled over its children
//! by their fair fractions, each child capped by the total need of its subtree
//! ([`JobSnapshot::need`]); whatever is left once every need is met is given out by the
//! ideal shares. The result sums to `Max_R` and every job gets at least
//! `min(need, ideal share)`.

use crate::sharing::weight;
use crate::util::{clean, water_fill};
use crate::{JobSnapshot, Policy};

/// One level of a ThemisIO sharing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Even split across groups (accounts).
    Group,
    /// Even split across users.
    User,
    /// Even split across jobs (job-fair).
    Job,
    /// Split across jobs in proportion to node count (size-fair).
    Size,
    /// Split across jobs in proportion to their priority weight (priority-fair).
    Priority,
}

impl Level {
    /// Parse one level name.
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim() {
            "group" | "account" => Level::Group,
            "user" => Level::User,
            "job" => Level::Job,
            "size" => Level::Size,
            "priority" => Level::Priority,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Level::Group => "group",
            Level::User => "user",
            Level::Job => "job",
            Level::Size => "size",
            Level::Priority => "priority",
        }
    }
    /// Entity key of a job at an entity level (`None` for job levels).
    fn key(self, j: &JobSnapshot) -> Option<u32> {
        match self {
            Level::Group => Some(j.group),
            Level::User => Some(j.user),
            _ => None,
        }
    }
    /// Weight of a job at a job level.
    fn job_weight(self, j: &JobSnapshot) -> f64 {
        match self {
            Level::Size => j.size.max(1) as f64,
            Level::Priority => weight(j.priority),
            _ => 1.0,
        }
    }
}

/// Fairness levels [`parse_levels`] refused, naming the level.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LevelsError {
    /// No such level (the text).
    #[error("unknown fairness level `{0}` (expected group, user, job, size or priority)")]
    Unknown(String),
    /// A level that splits among jobs, followed by another.
    #[error("fairness level `{0}` must be the last one (it splits among jobs)")]
    NotLast(&'static str),
    /// A level named twice.
    #[error("fairness level `{0}` appears twice")]
    Twice(&'static str),
    /// No level at all.
    #[error("empty fairness policy")]
    Empty,
}

/// Parse a composite policy (`"group,user,size"`). Entity levels (`group`, `user`) may
/// appear in any order; at most one job level (`job`, `size`, `priority`) and only
/// last. A list that ends with an entity level splits each entity's share evenly
/// among its jobs.
pub fn parse_levels(spec: &str) -> Result<Vec<Level>, LevelsError> {
    let mut levels = Vec::new();
    for part in spec.split(',') {
        let l = Level::parse(part).ok_or_else(|| LevelsError::Unknown(part.trim().to_string()))?;
        if let Some(last) = levels.last() {
            if Level::key(*last, &JobSnapshot::new(0, 0.0, 0.0)).is_none() {
                return Err(LevelsError::NotLast(last.name()));
            }
            if levels.contains(&l) {
                return Err(LevelsError::Twice(l.name()));
            }
        }
        levels.push(l);
    }
    if levels.is_empty() {
        return Err(LevelsError::Empty);
    }
    Ok(levels)
}

/// A ThemisIO sharing policy with opportunity fairness (see the module docs).
#[derive(Debug, Clone)]
pub struct Themis {
    levels: Vec<Level>,
    name: String,
    order: Vec<u32>,
    keys: Vec<(u64, u32)>,
    needs: Vec<f64>,
    ideal: Vec<f64>,
    scratch: Scratch,
}

#[derive(Debug, Clone, Default)]
struct Scratch {
    caps: Vec<f64>,
    weights: Vec<f64>,
    alloc: Vec<f64>,
    bounds: Vec<usize>,
    fill: Vec<(f64, u32)>,
}

impl Themis {
    /// A policy over the given levels, reported under `name`.
    pub fn new(levels: Vec<Level>, name: impl Into<String>) -> Self {
        Themis {
            levels,
            name: name.into(),
            order: Vec::new(),
            keys: Vec::new(),
            needs: Vec::new(),
            ideal: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    /// The levels, root first.
    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// Sort job indices so that every entity's jobs are contiguous at every level.
    /// There are at most two entity levels (group, user; no repeats), so one `u64`
    /// key per job orders them.
    fn sort(&mut self, jobs: &[JobSnapshot]) {
        self.keys.clear();
        self.keys.extend(jobs.iter().enumerate().map(|(i, j)| {
            let key = self
                .levels
                .iter()
                .filter_map(|l| l.key(j))
                .fold(0u64, |k, x| (k << 32) | x as u64);
            (key, i as u32)
        }));
        self.keys.sort_unstable();
        self.order.clear();
        self.order.extend(self.keys.iter().map(|k| k.1));
    }
}

/// Distribute `capacity` over the jobs `order[lo..hi]` (all in one entity at every level
/// above `depth`), water-filling by fair fractions with caps `needs` (use infinite
/// needs for the ideal shares). Writes into `out` by job index.
#[allow(clippy::too_many_arguments)]
fn distribute(
    capacity: f64,
    depth: usize,
    levels: &[Level],
    jobs: &[JobSnapshot],
    order: &[u32],
    needs: &[f64],
    out: &mut [f64],
    s: &mut Scratch,
) {
    if order.is_empty() {
        return;
    }
    let level = levels.get(depth).copied().unwrap_or(Level::Job);
    match level.key(&jobs[order[0] as usize]) {
        None => {
            // Job level: one child per job.
            s.caps.clear();
            s.weights.clear();
            for &i in order {
                s.caps.push(needs[i as usize]);
                s.weights.push(level.job_weight(&jobs[i as usize]));
            }
            s.alloc.clear();
            s.alloc.resize(order.len(), 0.0);
            water_fill(capacity, &s.caps, &s.weights, &mut s.alloc, &mut s.fill);
            for (&i, &a) in order.iter().zip(&s.alloc) {
                out[i as usize] = a;
            }
        }
        Some(_) => {
            // Entity level: children are runs of equal key, weighted evenly.
            let mut bounds = std::mem::take(&mut s.bounds);
            bounds.clear();
            bounds.push(0);
            for k in 1..order.len() {
                if level.key(&jobs[order[k] as usize]) != level.key(&jobs[order[k - 1] as usize]) {
                    bounds.push(k);
                }
            }
            bounds.push(order.len());
            let children = bounds.len() - 1;
            s.caps.clear();
            for c in 0..children {
                s.caps.push(
                    order[bounds[c]..bounds[c + 1]]
                        .iter()
                        .map(|&i| needs[i as usize])
                        .sum(),
                );
            }
            s.weights.clear();
            s.weights.resize(children, 1.0);
            s.alloc.clear();
            s.alloc.resize(children, 0.0);
            water_fill(capacity, &s.caps, &s.weights, &mut s.alloc, &mut s.fill);
            let allocs: Vec<f64> = s.alloc.clone();
            for c in 0..children {
                distribute(
                    allocs[c],
                    depth + 1,
                    levels,
                    jobs,
                    &order[bounds[c]..bounds[c + 1]],
                    needs,
                    out,
                    s,
                );
            }
            s.bounds = bounds;
        }
    }
}

/// The ideal (fully loaded) share of `Max_R = 1` of every job under `levels`: the
/// product of the transition matrices of ThemisIO eq. (1).
pub fn ideal_shares(levels: &[Level], jobs: &[JobSnapshot]) -> Vec<f64> {
    let mut t = Themis::new(levels.to_vec(), "ideal");
    t.sort(jobs);
    let needs = vec![f64::INFINITY; jobs.len()];
    let mut out = vec![0.0; jobs.len()];
    distribute(
        1.0,
        0,
        levels,
        jobs,
        &t.order,
        &needs,
        &mut out,
        &mut t.scratch,
    );
    out
}

/// A dense matrix (rows of columns).
pub type Matrix = Vec<Vec<f64>>;

/// The transition matrices `T^0 … T^{N−1}` of ThemisIO §3 (Fig. 4) for `levels`:
/// `T^i[j][k]` is the fair share of entity `k` of level `i` within its parent `j` of
/// level `i−1` (the root for `i = 0`). The last matrix's columns are the jobs, in input
/// order. Meant for small inputs (dense); the policy itself never builds them.
pub fn transition_matrices(levels: &[Level], jobs: &[JobSnapshot]) -> Vec<Matrix> {
    let probe = JobSnapshot::new(0, 0.0, 0.0);
    let job_level = levels
        .iter()
        .copied()
        .find(|l| l.key(&probe).is_none())
        .unwrap_or(Level::Job);
    // Row entities of the current level: distinct entity paths (root = empty path).
    let mut rows: Vec<Vec<u32>> = vec![Vec::new()];
    let mut path_of: Vec<Vec<u32>> = vec![Vec::new(); jobs.len()];
    let mut mats = Vec::new();
    for l in levels.iter().copied().filter(|l| l.key(&probe).is_some()) {
        let mut cols: Vec<Vec<u32>> = Vec::new();
        for (p, j) in path_of.iter_mut().zip(jobs) {
            p.push(l.key(j).unwrap_or(0));
            if !cols.contains(p) {
                cols.push(p.clone());
            }
        }
        let mut m = vec![vec![0.0; cols.len()]; rows.len()];
        for (c, path) in cols.iter().enumerate() {
            let parent = &path[..path.len() - 1];
            let row = rows.iter().position(|r| r[..] == *parent).unwrap_or(0);
            let siblings = cols.iter().filter(|q| q[..q.len() - 1] == *parent).count();
            m[row][c] = 1.0 / siblings as f64;
        }
        mats.push(m);
        rows = cols;
    }
    // Last matrix: jobs within their innermost entity.
    let row_of: Vec<usize> = path_of
        .iter()
        .map(|p| rows.iter().position(|r| r == p).unwrap_or(0))
        .collect();
    let mut m = vec![vec![0.0; jobs.len()]; rows.len()];
    for (i, j) in jobs.iter().enumerate() {
        let total: f64 = jobs
            .iter()
            .zip(&row_of)
            .filter(|(_, &r)| r == row_of[i])
            .map(|(k, _)| job_level.job_weight(k))
            .sum();
        m[row_of[i]][i] = job_level.job_weight(j) / total;
    }
    mats.push(m);
    mats
}

/// Multiply the chain of matrices (`Π T^i`, ThemisIO eq. (1)).
pub fn chain_product(mats: &[Matrix]) -> Matrix {
    let mut acc: Matrix = vec![vec![1.0]];
    for m in mats {
        let cols = m.first().map_or(0, |r| r.len());
        let mut next = vec![vec![0.0; cols]; acc.len()];
        for (r, row) in acc.iter().enumerate() {
            for (k, &a) in row.iter().enumerate() {
                if a != 0.0 {
                    for (c, &b) in m[k].iter().enumerate() {
                        next[r][c] += a * b;
                    }
                }
            }
        }
        acc = next;
    }
    acc
}

impl Policy for Themis {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn allocate_into(&mut self, max_rate: f64, jobs: &[JobSnapshot], out: &mut Vec<f64>) {
        let max_rate = clean(max_rate);
        out.clear();
        out.resize(jobs.len(), 0.0);
        if jobs.is_empty() {
            return;
        }
        self.sort(jobs);
        self.needs.clear();
        self.needs.extend(jobs.iter().map(|j| clean(j.need())));
        distribute(
            max_rate,
            0,
            &self.levels,
            jobs,
            &self.order,
            &self.needs,
            out,
            &mut self.scratch,
        );
        let used: f64 = out.iter().sum();
        let left = max_rate - used;
        if left > 0.0 {
            // Every need is met: the rest goes out by the ideal shares.
            self.ideal.clear();
            self.ideal.resize(jobs.len(), 0.0);
            self.needs.iter_mut().for_each(|n| *n = f64::INFINITY);
            distribute(
                left,
                0,
                &self.levels,
                jobs,
                &self.order,
                &self.needs,
                &mut self.ideal,
                &mut self.scratch,
            );
            for (o, i) in out.iter_mut().zip(&self.ideal) {
                *o += i;
            }
        }
    }
}
