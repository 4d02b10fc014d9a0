//! The node's default rules (`cheferd local --default-limit`): what a stage gets while
//! its job has no rules from the global controller on this node — the global is
//! starting, frozen, unreachable or fenced, or has not sent them yet — so that no new
//! job runs unthrottled because the control plane is busy, whatever the job's own
//! environment says.
//!
//! A stage gets them as it registers, before the global controller hears of it; the
//! global controller's rules replace them as they come (and the stage keeps what it got
//! while the control plane is away). The default is the job's on this node, as the
//! global controller's share is: split evenly over the job's stages here, split anew
//! (at most once a second) when their number changes. A stage of a job that already
//! has rules from the global controller here gets an even part of the job's share here
//! instead: the sum of what the global controller gave the job's stages, each
//! mountpoint's over the job's stages now that manage it. Each of those rules is one stage's part of the job's share (each
//! process has buckets of its own), so a copy to every new process would multiply the
//! job's rate by its processes while the global controller is away. While it is away,
//! that share is also split anew over the job's stages when their number changes.

use super::rules::{self, rule_to_spec};
use super::Local;
use crate::global::PROVISIONAL_SHARE;
use crate::proto;
use padll_wire::channel::{ChannelSpec, MAX_CHANNELS, MAX_RATE};
use padll_wire::config::{burst_for, parse_rule, RuleError, DEFAULT_BURST_MS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tracing::info;

/// How often the defaults of jobs whose number of stages changed are split anew.
const RESPLIT_INTERVAL: Duration = Duration::from_secs(1);

/// What a stage whose job has no rules from the global controller gets.
#[derive(Clone, Debug, PartialEq)]
pub enum DefaultLimit {
    /// [`PROVISIONAL_SHARE`] of each resource's `Max_R`, as the global controller's last
    /// resource table gives it (the share the global gives a new job until it is
    /// planned); nothing before a table arrived.
    BuiltIn,
    /// `0`: nothing (sites that prefer availability).
    Off,
    /// The site's limits (the `PADLL_RULES` syntax), for a job on this node.
    Site(Vec<ChannelSpec>),
}

/// A `--default-limit` refused.
#[derive(Debug, thiserror::Error)]
pub enum DefaultLimitError {
    /// No limit in it.
    #[error("no limit: give SELECTOR=RATE[,…] as in /scratch:metadata=2000/s, or 0 for none")]
    Empty,
    /// A limit that does not parse.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// More limits than a stage holds (how many).
    #[error("{0} limits (a stage holds at most {MAX_CHANNELS})")]
    TooMany(usize),
}

/// Parses `--default-limit`: `SELECTOR=RATE[,…]` (each as in `PADLL_RULES`, with a
/// bucket of 10 ms of the rate), or `0` for none.
pub fn parse_default_limit(text: &str) -> Result<DefaultLimit, DefaultLimitError> {
    if text.trim() == "0" {
        return Ok(DefaultLimit::Off);
    }
    let limits = text
        .split(',')
        .map(str::trim)
        .filter(|rule| !rule.is_empty())
        .map(|rule| parse_rule(rule, DEFAULT_BURST_MS))
        .collect::<Result<Vec<_>, _>>()?;
    match limits.len() {
        0 => Err(DefaultLimitError::Empty),
        n if n > MAX_CHANNELS => Err(DefaultLimitError::TooMany(n)),
        _ => Ok(DefaultLimit::Site(limits)),
    }
}

impl std::fmt::Display for DefaultLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefaultLimit::BuiltIn => write!(
                f,
                "{} % of each resource's Max_R as the global controller says (none until it has)",
                PROVISIONAL_SHARE * 100.0
            ),
            DefaultLimit::Off => write!(f, "none (--default-limit 0)"),
            DefaultLimit::Site(limits) => write!(f, "{}", list(limits)),
        }
    }
}

/// `limits` as `PADLL_RULES` writes them (`none` for none).
fn list(limits: &[ChannelSpec]) -> String {
    if limits.is_empty() {
        return "none".to_string();
    }
    let written: Vec<String> = limits.iter().map(ToString::to_string).collect();
    written.join(",")
}

/// The built-in default of a resource table from `Registered`: [`PROVISIONAL_SHARE`] of
/// the `Max_R` of each resource this controller knows and whose `Max_R` is said.
fn built_in(resources: &[proto::Resource]) -> Vec<ChannelSpec> {
    let table = rules::resource_table(resources.to_vec());
    resources
        .iter()
        .enumerate()
        .filter(|(_, resource)| resource.max_rate > 0)
        .filter_map(|(index, resource)| {
            let bytes = table.get(index)?.as_ref()?.resource.counts_bytes();
            let rate = (resource.max_rate as f64 * PROVISIONAL_SHARE).round() as u64;
            let rate = rate.clamp(1, MAX_RATE);
            let rule = proto::Rule {
                resource: index as u32,
                rate,
                bytes,
                burst: burst_for(rate, DEFAULT_BURST_MS),
            };
            rule_to_spec(&rule, &table)
        })
        .collect()
}

/// Those of `rules` a stage managing `mountpoints` can hold (a stage refuses a rule set
/// naming another mountpoint), each rate and burst split over `split` stages.
fn for_stage(rules: &[ChannelSpec], mountpoints: &[String], split: usize) -> Vec<ChannelSpec> {
    let split = split.max(1) as u64;
    rules
        .iter()
        .filter(|rule| rule.mount.as_ref().is_none_or(|m| mountpoints.contains(m)))
        .map(|rule| ChannelSpec {
            rate: (rule.rate / split).max(1),
            burst: (rule.burst / split).max(1),
            ..rule.clone()
        })
        .collect()
}

/// A job with rules from the global controller here.
#[derive(Debug, Default)]
struct Governed {
    /// The rules the global controller last gave each of the job's stages here.
    given: BTreeMap<u64, Vec<ChannelSpec>>,
    /// The job's share here: the sum of `given` (kept as the job's stages come and go
    /// while the global controller is away).
    share: Vec<ChannelSpec>,
    /// Rules came from the global controller since the share was summed.
    heard: bool,
    /// The job's stages here when the share was last split (by the global controller,
    /// or here while it is away).
    split_for: usize,
}

impl Governed {
    /// The job's share here, summed anew if rules came since.
    fn share(&mut self) -> &[ChannelSpec] {
        if std::mem::take(&mut self.heard) {
            self.share = sum(self.given.values().flatten());
        }
        &self.share
    }
}

/// The part of a job's `share` here for a stage managing `mountpoints`: each rule of
/// its mountpoints split over those of the job's stages here (`of_job`: each one's
/// mountpoints) that manage the rule's mountpoint.
fn part_of(
    share: &[ChannelSpec],
    mountpoints: &[String],
    of_job: &[&[String]],
) -> Vec<ChannelSpec> {
    let manages = |mounts: &[String], rule: &ChannelSpec| {
        rule.mount.as_ref().is_none_or(|m| mounts.contains(m))
    };
    share
        .iter()
        .filter(|rule| manages(mountpoints, rule))
        .map(|rule| {
            let holders = of_job.iter().filter(|m| manages(m, rule)).count().max(1) as u64;
            ChannelSpec {
                rate: (rule.rate / holders).max(1),
                burst: (rule.burst / holders).max(1),
                ..rule.clone()
            }
        })
        .collect()
}

/// The rules summed per channel (mountpoint, operations and unit): rates and bursts
/// added up.
fn sum<'a>(rules: impl Iterator<Item = &'a ChannelSpec>) -> Vec<ChannelSpec> {
    let mut total: Vec<ChannelSpec> = Vec::new();
    for rule in rules {
        let same = |t: &&mut ChannelSpec| {
            t.mount == rule.mount && t.scope == rule.scope && t.unit == rule.unit
        };
        match total.iter_mut().find(same) {
            Some(t) => {
                t.rate = t.rate.saturating_add(rule.rate).min(MAX_RATE);
                t.burst = t.burst.saturating_add(rule.burst);
            }
            None => total.push(rule.clone()),
        }
    }
    total
}

/// A registered stage as the defaults see it: id, job and mountpoints.
type StageView<'a> = (u64, &'a str, &'a [String]);

/// Who holds what, for [`Local`]'s defaults.
#[derive(Default)]
pub(super) struct Defaults(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    /// The built-in default from the global controller's last resource table.
    built_in: Vec<ChannelSpec>,
    /// Jobs with rules from the global controller here.
    governed: HashMap<String, Governed>,
    /// Stages holding a default: over how many of their job's stages it was split.
    defaulted: HashMap<u64, usize>,
}

impl Defaults {
    fn lock(&self) -> MutexGuard<'_, State> {
        padll_wire::sync::lock_or_panic(&self.0, super::STATE)
    }

    /// The global controller gave stage `stage_id` of `job` these rules (which replace
    /// whatever it held).
    pub(super) fn replaced(&self, stage_id: u64, job: &str, rules: &[ChannelSpec]) {
        self.lock().replaced(stage_id, job, rules);
    }
}

impl State {
    /// The rules of a stage that just registered (`of_job`: the mountpoints of each of
    /// the job's stages here, its own included): its part of its job's share from the
    /// global controller if it has one here, else `default` split over the job's
    /// stages (recorded, to be split anew).
    fn first_rules(
        &mut self,
        (stage_id, job, mountpoints): StageView,
        of_job: &[&[String]],
        default: &[ChannelSpec],
    ) -> Vec<ChannelSpec> {
        if let Some(governed) = self.governed.get_mut(job) {
            return part_of(governed.share(), mountpoints, of_job);
        }
        let stages = of_job.len();
        let rules = for_stage(default, mountpoints, stages);
        if !rules.is_empty() {
            self.defaulted.insert(stage_id, stages);
        }
        rules
    }

    fn replaced(&mut self, stage_id: u64, job: &str, rules: &[ChannelSpec]) {
        self.defaulted.remove(&stage_id);
        if !self.governed.contains_key(job) {
            self.governed.insert(job.to_string(), Governed::default());
        }
        let governed = self.governed.get_mut(job).expect("just inserted");
        governed.given.insert(stage_id, rules.to_vec());
        governed.heard = true;
    }

    /// Forgets the stages and jobs gone, and returns the rules to hand again: to the
    /// stages holding a default whose job (still without rules from the global
    /// controller) has another number of stages here now, and, while the global
    /// controller is `away`, to every stage of a job with a share from it whose number
    /// of stages here changed since that share was last split.
    fn resplit(
        &mut self,
        stages: &[StageView],
        default: &[ChannelSpec],
        away: bool,
    ) -> Vec<(u64, Vec<ChannelSpec>)> {
        let mut per_job: HashMap<&str, usize> = HashMap::new();
        for (_, job, _) in stages {
            *per_job.entry(job).or_default() += 1;
        }
        let live: HashSet<u64> = stages.iter().map(|(id, _, _)| *id).collect();
        self.defaulted.retain(|id, _| live.contains(id));
        self.governed
            .retain(|job, _| per_job.contains_key(job.as_str()));
        let mut again = Vec::new();
        for (job, governed) in &mut self.governed {
            let now = per_job[job.as_str()];
            governed.share();
            governed.given.retain(|id, _| live.contains(id));
            if !away {
                governed.split_for = now;
            } else if governed.split_for != now {
                governed.split_for = now;
                let of_job: Vec<StageView> =
                    stages.iter().filter(|s| s.1 == job).copied().collect();
                let mounts: Vec<&[String]> = of_job.iter().map(|s| s.2).collect();
                for (stage_id, _, mountpoints) in of_job {
                    again.push((stage_id, part_of(&governed.share, mountpoints, &mounts)));
                }
            }
        }
        for &(stage_id, job, mountpoints) in stages {
            if self.governed.contains_key(job) {
                continue;
            }
            let Some(split) = self.defaulted.get_mut(&stage_id) else {
                continue;
            };
            let now = per_job[job];
            if *split != now {
                *split = now;
                again.push((stage_id, for_stage(default, mountpoints, now)));
            }
        }
        again
    }
}

impl Local {
    /// The default in force: the site's, or the built-in one as last learnt.
    fn default_rules<'a>(&'a self, state: &'a State) -> &'a [ChannelSpec] {
        match &self.options.default_limit {
            DefaultLimit::BuiltIn => &state.built_in,
            DefaultLimit::Off => &[],
            DefaultLimit::Site(limits) => limits,
        }
    }

    /// Gives a stage that just registered its first rules (see [`State::first_rules`]),
    /// if any. Called before the global controller hears of the stage, so its rules
    /// always come after these.
    pub(super) fn give_first_rules(&self, stage_id: u64) {
        let mut stages = self.lock_stages();
        let Some(entry) = stages.get(&stage_id) else {
            return;
        };
        let job = entry.info.job_id.as_str();
        let of_job: Vec<&[String]> = stages
            .values()
            .filter(|e| e.info.job_id == job)
            .map(|e| e.info.mountpoints.as_slice())
            .collect();
        let mut state = self.defaults.lock();
        let default = self.default_rules(&state).to_vec();
        let view = (stage_id, job, entry.info.mountpoints.as_slice());
        let rules = state.first_rules(view, &of_job, &default);
        if let (false, Some(entry)) = (rules.is_empty(), stages.get_mut(&stage_id)) {
            rules::give(entry, 0, rules);
        }
    }

    /// The global controller's resource table arrived: the built-in default from it.
    pub(super) fn learn_resources(&self, resources: &[proto::Resource]) {
        if self.options.default_limit != DefaultLimit::BuiltIn {
            return;
        }
        let built_in = built_in(resources);
        let mut state = self.defaults.lock();
        if state.built_in != built_in {
            info!(
                "stages without rules from the global controller get, per job: {}",
                list(&built_in)
            );
            state.built_in = built_in;
        }
    }

    /// Splits the defaults anew where the number of a job's stages changed.
    fn resplit_defaults(&self) {
        // Between streams: no stream is waiting to take a stage's rules over.
        let away = self.lock_upstream().is_none();
        let mut stages = self.lock_stages();
        let views: Vec<StageView> = stages
            .iter()
            .map(|(id, e)| (*id, e.info.job_id.as_str(), e.info.mountpoints.as_slice()))
            .collect();
        let mut state = self.defaults.lock();
        let default = self.default_rules(&state).to_vec();
        let again = state.resplit(&views, &default, away);
        for (stage_id, rules) in again {
            if let Some(entry) = stages.get_mut(&stage_id) {
                rules::give(entry, 0, rules);
            }
        }
    }
}

/// Splits the defaults anew every [`RESPLIT_INTERVAL`], for the life of the process.
pub(super) async fn resplit_loop(local: Arc<Local>) {
    let mut tick = tokio::time::interval(RESPLIT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        local.resplit_defaults();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::{Scope, Unit};
    use padll_wire::ops::Class;

    fn limits(text: &str) -> Vec<ChannelSpec> {
        match parse_default_limit(text).unwrap() {
            DefaultLimit::Site(limits) => limits,
            other => panic!("{other:?}"),
        }
    }

    fn mounts(list: &[&str]) -> Vec<String> {
        list.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn the_flag_takes_padll_rules_or_0() {
        assert_eq!(parse_default_limit(" 0 ").unwrap(), DefaultLimit::Off);
        let site = limits("/scratch:metadata=2000/s, /scratch:data=100MiB/s,open=50");
        assert_eq!(site.len(), 3);
        assert_eq!(site[0].mount.as_deref(), Some("/scratch"));
        assert_eq!(site[0].scope, Scope::Class(Class::Metadata));
        assert_eq!((site[0].rate, site[0].burst), (2000, 20));
        assert_eq!((site[1].unit, site[1].rate), (Unit::Bytes, 100 << 20));
        assert_eq!(site[2].mount, None);
        assert_eq!(
            DefaultLimit::Site(site).to_string(),
            "/scratch:metadata=2000/s,/scratch:data=100MiB/s,open=50/s"
        );
    }

    #[test]
    fn bad_flags_name_the_bad_part() {
        for (text, named) in [
            ("", "no limit"),
            (" , ", "no limit"),
            ("metadata", "bad limit 'metadata'"),
            ("metadata=fast", "'fast'"),
            ("scratch:metadata=5", "absolute mountpoint"),
            ("/s:metadata=1MiB/s", "counts operations"),
            ("/s:metadata=-1", "'-1'"),
        ] {
            let error = parse_default_limit(text).unwrap_err().to_string();
            assert!(error.contains(named), "{text:?}: {error}");
        }
        let many = vec!["open=1"; MAX_CHANNELS + 1].join(",");
        let error = parse_default_limit(&many).unwrap_err().to_string();
        assert!(
            error.contains(&format!("{} limits", MAX_CHANNELS + 1)),
            "{error}"
        );
    }

    fn resource(mount: &str, class: &str, max_rate: u64) -> proto::Resource {
        proto::Resource {
            mount: mount.into(),
            class: class.into(),
            max_rate,
            costs: Default::default(),
        }
    }

    #[test]
    fn the_built_in_default_is_the_provisional_share_of_each_max_r() {
        let table = [
            resource("/scratch", "metadata", 4000),
            resource("/scratch", "data", 10 << 30),
            // Not said (an earlier global controller), tiny, or unknown to this one.
            resource("/home", "metadata", 0),
            resource("/tiny", "metadata", 10),
            resource("/odd", "colour", 5000),
        ];
        let rules = built_in(&table);
        let summary: Vec<String> = rules.iter().map(|r| format!("{r} {}", r.burst)).collect();
        assert_eq!(
            summary,
            [
                "/scratch:metadata=40/s 1",
                "/scratch:data=107374182B/s 1073741",
                "/tiny:metadata=1/s 1"
            ]
        );
        assert_eq!(rules[1].unit, Unit::Bytes);
    }

    #[test]
    fn a_stage_gets_the_rules_of_its_mountpoints_split_over_its_job() {
        let site = limits("/a:metadata=3000/s,/b:metadata=10/s,data=1GiB/s");
        let one = for_stage(&site, &mounts(&["/a"]), 1);
        assert_eq!(one.len(), 2, "{one:?}");
        assert_eq!((one[0].rate, one[0].burst), (3000, 30));
        let three = for_stage(&site, &mounts(&["/a", "/b"]), 3);
        let rates: Vec<(u64, u64)> = three.iter().map(|r| (r.rate, r.burst)).collect();
        assert_eq!(
            rates,
            [(1000, 10), (3, 1), ((1 << 30) / 3, (1 << 30) / 300)]
        );
        assert!(for_stage(&site[..2], &mounts(&["/c"]), 1).is_empty());
    }

    #[test]
    fn a_job_without_global_rules_shares_the_default_until_they_come() {
        let default = limits("/s:metadata=1200/s");
        let m = mounts(&["/s"]);
        let mut state = State::default();
        let first = state.first_rules((1, "j", &m), &[m.as_slice(); 1], &default);
        assert_eq!(first[0].rate, 1200);
        let second = state.first_rules((2, "j", &m), &[m.as_slice(); 2], &default);
        assert_eq!(second[0].rate, 600);
        // The first is split anew, once; stage 2 holds its share already.
        let stages = [(1, "j", m.as_slice()), (2, "j", m.as_slice())];
        let again = state.resplit(&stages, &default, true);
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].0, again[0].1[0].rate), (1, 600));
        assert!(state.resplit(&stages, &default, true).is_empty());
        // Stage 2 leaves: stage 1 gets the whole default back.
        let again = state.resplit(&stages[..1], &default, true);
        assert_eq!((again[0].0, again[0].1[0].rate), (1, 1200));
        assert_eq!(state.defaulted.len(), 1);

        // The global controller's rules replace it; a new stage of the job gets its part
        // of the job's share here (the sum of what its stages were given).
        let global = limits("/s:metadata=5000/s,/t:data=1MiB/s");
        state.replaced(1, "j", &global);
        let third = state.first_rules((3, "j", &m), &[m.as_slice(); 2], &default);
        assert_eq!((third.len(), third[0].rate), (1, 2500));
        let stages = [(1, "j", m.as_slice()), (3, "j", m.as_slice())];
        assert!(state.resplit(&stages, &default, false).is_empty());
        assert!(state.defaulted.is_empty());
        // Gone from the node, the job is forgotten: a new stage of it gets the default.
        assert!(state.resplit(&[], &default, true).is_empty());
        assert!(state.governed.is_empty());
        assert_eq!(
            state.first_rules((4, "j", &m), &[m.as_slice(); 1], &default),
            default
        );
    }

    #[test]
    fn new_processes_share_the_jobs_rules_while_the_global_is_away() {
        let m = mounts(&["/s"]);
        let mut state = State::default();
        // The global controller gave the job's one stage here its whole share, 10 000/s.
        state.replaced(1, "j", &limits("/s:metadata=10000/s"));
        let mut stages = vec![(1, "j", m.as_slice())];
        assert!(state.resplit(&stages, &[], false).is_empty());
        // It is away; 30 processes of the job start: none gets more than its part.
        let mut held = HashMap::from([(1, 10_000)]);
        for id in 2..=31u64 {
            stages.push((id, "j", m.as_slice()));
            let rules = state.first_rules((id, "j", &m), &vec![m.as_slice(); stages.len()], &[]);
            assert_eq!(rules[0].rate, 10_000 / id);
            held.insert(id, rules[0].rate);
        }
        // The next split gives every stage an even part: the job holds its share.
        for (id, rules) in state.resplit(&stages, &[], true) {
            held.insert(id, rules[0].rate);
        }
        assert_eq!(held.values().sum::<u64>(), 31 * (10_000 / 31));
        assert!(state.resplit(&stages, &[], true).is_empty());
        // Stages leave: those left share it again.
        stages.truncate(2);
        let again = state.resplit(&stages, &[], true);
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|(_, rules)| rules[0].rate == 5000));
        // While a stream to the global controller stands, it splits: nothing is handed.
        stages.truncate(1);
        assert!(state.resplit(&stages, &[], false).is_empty());
        // Its rules come again and replace the share.
        state.replaced(1, "j", &limits("/s:metadata=300/s"));
        stages.push((2, "j", m.as_slice()));
        assert_eq!(
            state.first_rules((2, "j", &m), &[m.as_slice(); 2], &[])[0].rate,
            150
        );
    }

    #[test]
    fn processes_started_as_the_global_goes_away_are_split_at_the_next_tick() {
        let m = mounts(&["/s"]);
        let mut state = State::default();
        // Rules came within the last second, and 30 processes started since.
        state.replaced(1, "j", &limits("/s:metadata=10000/s"));
        let mut held = HashMap::from([(1, 10_000)]);
        let mut stages = vec![(1, "j", m.as_slice())];
        for id in 2..=31u64 {
            stages.push((id, "j", m.as_slice()));
            let rules = state.first_rules((id, "j", &m), &vec![m.as_slice(); stages.len()], &[]);
            held.insert(id, rules[0].rate);
        }
        for (id, rules) in state.resplit(&stages, &[], true) {
            held.insert(id, rules[0].rate);
        }
        assert!(held.values().sum::<u64>() <= 10_000, "{held:?}");
    }

    #[test]
    fn a_mountpoints_share_is_split_over_the_stages_that_manage_it() {
        let (a, b) = (mounts(&["/a"]), mounts(&["/b"]));
        let mut state = State::default();
        state.replaced(1, "j", &limits("/a:metadata=1000/s"));
        let mut stages = vec![(1, "j", a.as_slice())];
        for id in 2..=11u64 {
            state.replaced(id, "j", &limits("/b:metadata=100/s"));
            stages.push((id, "j", b.as_slice()));
        }
        assert!(state.resplit(&stages, &[], false).is_empty());
        // Away, one stage of /b ends: /a's one stage keeps /a's whole share.
        stages.pop();
        let again: HashMap<u64, Vec<ChannelSpec>> =
            state.resplit(&stages, &[], true).into_iter().collect();
        assert_eq!(again[&1].len(), 1);
        assert_eq!(again[&1][0].rate, 1000);
        assert!((2..=10).all(|id| again[&id][0].rate == 1000 / 9));
        // A new stage on both gets its part of each.
        let both = mounts(&["/a", "/b"]);
        stages.push((12, "j", both.as_slice()));
        let of_job: Vec<&[String]> = stages.iter().map(|s| s.2).collect();
        let rules = state.first_rules((12, "j", &both), &of_job, &[]);
        let rates: Vec<u64> = rules.iter().map(|r| r.rate).collect();
        assert_eq!(rates, [500, 100]);
    }

    #[test]
    fn without_a_default_nothing_is_given_or_kept() {
        let m = mounts(&["/s"]);
        let mut state = State::default();
        assert!(state
            .first_rules((1, "j", &m), &[m.as_slice(); 1], &[])
            .is_empty());
        // A default for other mountpoints only is none either.
        let elsewhere = limits("/t:metadata=5/s");
        assert!(state
            .first_rules((2, "j", &m), &[m.as_slice(); 2], &elsewhere)
            .is_empty());
        assert!(state.defaulted.is_empty());
        let stages = [(1, "j", m.as_slice()), (2, "j", m.as_slice())];
        assert!(state.resplit(&stages, &elsewhere, true).is_empty());
    }
}
