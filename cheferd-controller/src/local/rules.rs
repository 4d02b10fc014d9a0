//! Rules from the global controller as stage channels: the resource table of
//! `Registered`, and each `Enforce` handed to the stages it names.

use super::stage::StageEntry;
use super::Local;
use crate::config::Resource;
use crate::proto;
use padll_wire::channel::{ChannelSpec, Scope, Unit};
use padll_wire::control::ControlMessage;
use padll_wire::ops::Class;
use tracing::warn;

/// The resource table of a stream's `Registered`, which the rules of every `Enforce`
/// index; a resource this controller does not know (`None`) gets no channel.
pub(super) fn resource_table(registered: Vec<proto::Resource>) -> Vec<Option<Resource>> {
    registered
        .into_iter()
        .map(|r| {
            Some(Resource {
                class: Class::from_name(&r.class)?,
                mount: r.mount,
            })
        })
        .collect()
}

/// Hands each stage of an `Enforce` its rules, and records them to check its reports.
pub(super) fn enforce(
    local: &Local,
    cycle: u64,
    plans: Vec<proto::StageRules>,
    resources: &[Option<Resource>],
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
pub fn rule_to_spec(rule: &proto::Rule, resources: &[Option<Resource>]) -> Option<ChannelSpec> {
    let resource = resources.get(rule.resource as usize)?.as_ref()?;
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
        costs: Default::default(),
    })
}
