//! Rules from the global controller as stage channels: the resource table of
//! `Registered`, and each `Enforce` handed to the stages it names.

use super::stage::StageEntry;
use super::Local;
use crate::config::Resource;
use crate::proto;
use padll_wire::channel::{ChannelSpec, Costs, Scope, Unit};
use padll_wire::control::ControlMessage;
use padll_wire::ops::{Class, Op};
use std::collections::HashMap;
use tracing::warn;

/// A resource of the table, with what each operation's request costs in its channels.
#[derive(Clone, Debug, PartialEq)]
pub struct TableResource {
    /// Mountpoint and class.
    pub resource: Resource,
    /// Thousandths of a token per operation (empty: one token each).
    pub costs: Costs,
}

/// The resource table of a stream's `Registered`, which the rules of every `Enforce`
/// index; a resource this controller does not know (`None`) gets no channel. Costs
/// that are no costs (an unknown operation, more than `MAX_COST`, on a resource of
/// bytes) are dropped with a warning: its channels then count one token per request.
pub(super) fn resource_table(registered: Vec<proto::Resource>) -> Vec<Option<TableResource>> {
    registered
        .into_iter()
        .map(|r| {
            let resource = Resource {
                class: Class::from_name(&r.class)?,
                mount: r.mount,
            };
            let costs = costs_of(&resource, r.costs).unwrap_or_else(|why| {
                warn!(%resource, "ignored the resource's weights: {why}");
                Costs::default()
            });
            Some(TableResource { resource, costs })
        })
        .collect()
}

/// The costs the global controller gave `resource`, checked.
fn costs_of(resource: &Resource, named: HashMap<String, u32>) -> Result<Costs, String> {
    if resource.counts_bytes() && !named.is_empty() {
        return Err("a resource of bytes has no weights".into());
    }
    let costs = named
        .into_iter()
        .map(|(name, cost)| {
            Op::from_name(&name)
                .map(|op| (op, cost))
                .ok_or_else(|| format!("unknown operation '{}'", padll_wire::control::short(&name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Costs::new(costs).map_err(|e| e.to_string())
}

/// Hands each stage of an `Enforce` its rules, and records them to check its reports.
pub(super) fn enforce(
    local: &Local,
    cycle: u64,
    plans: Vec<proto::StageRules>,
    resources: &[Option<TableResource>],
) {
    let mut stages = local.lock_stages();
    for plan in plans {
        let Some(entry) = stages.get_mut(&plan.stage_id) else {
            continue;
        };
        let rules: Vec<ChannelSpec> = plan
            .rules
            .iter()
            .filter_map(|rule| rule_to_spec(rule, resources))
            .collect();
        local
            .defaults
            .replaced(plan.stage_id, &entry.info.job_id, &rules);
        give(entry, cycle, rules);
    }
}

/// Hands a stage a rule set (the whole set: its channels not named are removed), and
/// records it to check its reports.
pub(super) fn give(entry: &mut StageEntry, seq: u64, rules: Vec<ChannelSpec>) {
    // What the stage reports is checked against what it was given.
    entry.usage.set_rules(rules.iter().filter_map(|spec| {
        let (Some(mount), Scope::Class(class)) = (&spec.mount, spec.scope) else {
            return None;
        };
        let resource = Resource {
            mount: mount.clone(),
            class,
        };
        Some((resource, spec.rate, spec.burst))
    }));
    // A stage gone meanwhile needs no rules.
    let _ = entry.outbox.send(&ControlMessage::SetRules { seq, rules });
}

/// A rule from the global controller as a stage channel, its resource looked up in the
/// table from `Registered` (the stage protocol names mount and class).
pub fn rule_to_spec(
    rule: &proto::Rule,
    resources: &[Option<TableResource>],
) -> Option<ChannelSpec> {
    let TableResource { resource, costs } = resources.get(rule.resource as usize)?.as_ref()?;
    // A bytes rate cannot configure an ops resource, nor the reverse.
    if rule.bytes != resource.counts_bytes() {
        warn!(%resource, bytes = rule.bytes, "ignored a rule whose unit does not fit its resource");
        return None;
    }
    Some(ChannelSpec {
        mount: Some(resource.mount.clone()),
        scope: Scope::Class(resource.class),
        rate: rule.rate.max(1),
        unit: if rule.bytes {
            Unit::Bytes
        } else {
            Unit::Requests
        },
        burst: rule.burst.max(1),
        costs: costs.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(class: &str, costs: &[(&str, u32)]) -> Vec<Option<TableResource>> {
        resource_table(vec![proto::Resource {
            mount: "/scratch".into(),
            class: class.into(),
            max_rate: 1000,
            costs: costs.iter().map(|(op, c)| (op.to_string(), *c)).collect(),
        }])
    }

    #[test]
    fn weighted_resources_give_weighted_channels_and_bad_weights_none() {
        let rule = |bytes| proto::Rule {
            resource: 0,
            rate: 300,
            bytes,
            burst: 3,
        };
        let weighted = table("metadata", &[("open", 3000), ("close", 0)]);
        let spec = rule_to_spec(&rule(false), &weighted).unwrap();
        assert_eq!(spec.costs.of(Op::Open), 3000);
        assert_eq!(spec.costs.of(Op::Close), 0);
        assert_eq!((spec.rate, spec.unit), (300, Unit::Requests));
        // Costs that are no costs are dropped: the channel counts requests.
        for bad in [
            table("metadata", &[("create", 3000)]),
            table("metadata", &[("open", padll_wire::channel::MAX_COST + 1)]),
            table("data", &[("read", 2000)]),
        ] {
            let resource = bad[0].as_ref().unwrap();
            assert!(resource.costs.is_empty(), "{resource:?}");
        }
        assert!(table("bogus", &[])[0].is_none());
    }
}
