//! What a cycle keeps from the last: the planner's view of every stage and the rates
//! each stage was last sent, in one flat order (node by node, its live stages then its
//! orphans). Rebuilding the views cost ≈ 0.4 ms a cycle at 4 000 stages, and reading
//! what was sent from every stage's record was most of a cycle's cache misses at 1 000
//! local controllers; so both are kept, usage reports update the views in place, and
//! [`PlanCache::invalidate`] — called whenever a stage or node comes or goes — has
//! them rebuilt at the next cycle, carrying over what each stage was sent.

use super::node::{Nodes, Slot};
use crate::config::GlobalConfig;
use crate::plan::{self, Plan, StageUsage, StageView};
use crate::prefetch::prefetch;
use crate::proto;
use std::ops::Range;

/// The planner's stage views and the rates last sent, kept between cycles.
#[derive(Default)]
pub(super) struct PlanCache {
    /// Whether the views are those of the stages registered now.
    current: bool,
    /// Configured resources (they never change while the controller runs).
    resources: usize,
    views: Vec<StageView>,
    /// Where the views' usage of each resource is, resolved when they were built.
    layout: plan::Layout,
    /// `sent[view * resources + resource]`: the rate last sent (0: no rule), where
    /// `was_sent[view]`. Apart from the flags so that a node's rates compare with the
    /// plan's as one block.
    sent: Vec<u64>,
    /// Whether the stage at each view was sent rules (`false`: never, or to be sent all
    /// again).
    was_sent: Vec<bool>,
    /// Each view's stage id.
    ids: Vec<u64>,
}

impl PlanCache {
    /// The stages registered changed: the next cycle rebuilds the views.
    pub(super) fn invalidate(&mut self) {
        self.current = false;
    }

    /// Whether the views are those of the stages registered now.
    pub(super) fn is_current(&self) -> bool {
        self.current
    }

    /// The views of every stage of `nodes` (orphans included), and where their usage
    /// is; rebuilt first if stale.
    pub(super) fn views(
        &mut self,
        config: &GlobalConfig,
        nodes: &mut Nodes,
    ) -> (&[StageView], &plan::Layout) {
        if !self.current {
            self.rebuild(config, nodes);
        }
        (&self.views, &self.layout)
    }

    fn rebuild(&mut self, config: &GlobalConfig, nodes: &mut Nodes) {
        let resources = config.resources.len();
        let previous_rates = std::mem::take(&mut self.sent);
        let previous_was_sent = std::mem::take(&mut self.was_sent);
        self.views.clear();
        self.ids.clear();
        // In slot order, as the enforce step walks them.
        for (index, node) in nodes.values_mut().enumerate() {
            for record in node.stages.values_mut().chain(node.orphans.values_mut()) {
                let view = self.views.len();
                let slot = std::mem::replace(&mut record.slot, Slot::Cached(view));
                let sent = match slot {
                    Slot::Cached(old) if previous_was_sent[old] => {
                        Some(&previous_rates[old * resources..(old + 1) * resources])
                    }
                    Slot::New(Some(ref rates)) => Some(&rates[..]),
                    Slot::Cached(_) | Slot::New(None) => None,
                };
                match sent {
                    Some(rates) => self.sent.extend_from_slice(rates),
                    None => self.sent.extend(std::iter::repeat_n(0, resources)),
                }
                self.was_sent.push(sent.is_some());
                self.ids.push(record.stage.stage_id);
                self.views.push(StageView {
                    node: index,
                    job: record.job,
                    uid: record.stage.uid,
                    gid: record.stage.gid,
                    job_size: record.stage.job_size,
                    mountpoints: record.stage.mountpoints.clone(),
                    usage: record.usage.clone(),
                });
            }
        }
        self.resources = resources;
        self.layout = plan::Layout::new(config, &self.views);
        self.current = true;
    }

    /// Sets the usage of the stage at `slot` in its view, while the views are current (a
    /// stage's usage report updates it in place; stale views are rebuilt from the
    /// records).
    pub(super) fn update_usage(&mut self, slot: &Slot, usage: &[(usize, StageUsage)]) {
        let Slot::Cached(view) = *slot else {
            return;
        };
        let Some(kept) = self.views.get_mut(view).filter(|_| self.current) else {
            return;
        };
        for ((_, value), (_, u)) in kept.usage.iter_mut().zip(usage) {
            *value = *u;
        }
        self.layout.refresh(&self.views, view);
    }

    /// Asks for what [`PlanCache::update_usage`] will write for the stage at `slot`
    /// ([`crate::prefetch`]): the view's usage and its row of the layout.
    pub(super) fn prefetch_usage(&self, slot: &Slot) {
        let Slot::Cached(view) = *slot else {
            return;
        };
        if let Some(kept) = self.views.get(view).filter(|_| self.current) {
            prefetch(kept.usage.as_ptr());
            self.layout.prefetch_row(view);
        }
    }

    /// Forgets what the stages at `views` were sent, so all their rules go out again.
    pub(super) fn forget_sent(&mut self, views: Range<usize>) {
        self.was_sent[views].fill(false);
    }

    /// The rules of those stages at `views` whose planned rates differ from the ones
    /// last sent; records them as sent.
    pub(super) fn changed_rules(
        &mut self,
        config: &GlobalConfig,
        plan: &Plan,
        views: Range<usize>,
    ) -> Vec<proto::StageRules> {
        let resources = self.resources;
        let flat = views.start * resources..views.end * resources;
        if self.was_sent[views.clone()].iter().all(|&sent| sent)
            && self.sent[flat.clone()] == plan.rates[flat]
        {
            return Vec::new();
        }
        let mut changed = Vec::new();
        for i in views {
            let rates = plan.stage_rates(i, resources);
            let last = &mut self.sent[i * resources..(i + 1) * resources];
            if !self.was_sent[i] || last != rates {
                last.copy_from_slice(rates);
                self.was_sent[i] = true;
                changed.push(proto::StageRules {
                    stage_id: self.ids[i],
                    rules: rules(config, rates),
                });
            }
        }
        changed
    }
}

/// A stage's rules from its rates (one per configured resource, 0 = none). A rule names
/// its resource by index into the table the node was sent in `Registered`: copying
/// mount and class strings into every rule was most of the cost of an `Enforce`.
pub(super) fn rules(config: &GlobalConfig, rates: &[u64]) -> Vec<proto::Rule> {
    config
        .resources
        .iter()
        .zip(rates)
        .enumerate()
        .filter(|(_, (_, &rate))| rate > 0)
        .map(|(index, (r, &rate))| proto::Rule {
            resource: index as u32,
            rate,
            bytes: r.resource.counts_bytes(),
            burst: ((rate as u128 * config.burst_ms as u128) / 1000).max(1) as u64,
        })
        .collect()
}
