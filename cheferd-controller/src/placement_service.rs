//! Placement of new files across storage targets (Paul et al., paper
//! 004 §III): the global controller's mapper. A stage creating a file on a mountpoint
//! configured for placement asks its local controller (`place` on the stage socket),
//! which relays the request upstream ([`Relay`], `PlaceRequest` on the gRPC stream);
//! the global controller answers with the targets [`PlacementService::answer`] chooses
//! (`PlaceReply` → `placed`). No answer, or an empty one, means "create as usual".
//!
//! ```toml
//! [placement]
//! mount = "/lustre"              # the mountpoint whose new files are placed
//! placer = "mcmf"                # mcmf[:ORDER[,PREDICT]], round-robin, random[:SEED]
//! feed = "/run/cheferd/ost-load" # per-target load, re-read every refresh_ms
//! refresh_ms = 5000
//! application = "program"       # what one application is: program, job, user+program
//! ```
//!
//! **The feed** is what the operator points the service at: a text file (written by a
//! cron job or a collector on the servers) in the form of `lctl get_param` output, each
//! server's lines after one naming it:
//!
//! ```text
//! oss=0 cpu=35 memory=60
//! obdfilter.lustre-OST0000.kbytestotal=976762584
//! obdfilter.lustre-OST0000.kbytesavail=512000000
//! ```
//!
//! Target indices are the hexadecimal after `OST`; other lines (other parameters,
//! `stats` blocks, comments) are ignored; a malformed known line is an error naming its
//! line; a file that is not a regular one, larger than [`MAX_FEED_BYTES`], or naming no
//! target is refused naming it (the last loads stay in use). Replace the file by renaming a
//! new one over it (`lctl get_param … > feed.new && mv feed.new feed`): a file rewritten in
//! place can be read half-written, and is then what it says. `simulated:OSSES:TARGETS`
//! instead makes a feed of `OSSES × TARGETS` 1 TiB targets, target `i` being
//! `(i mod 10) × 5 %` full (for tests and demos). Between refreshes every placed stripe
//! counts as used on its target (its share of the predicted size, or one stripe size),
//! so consecutive files do not all go to the target that looked emptiest at the last
//! refresh.
//!
//! **Sizes**: a stage cannot know a file's size at `open`; it reports the size each file
//! it placed ends with (`FileSizes`), kept per application
//! ([`crate::placement_history`]). A request of an application with a history carries
//! the size its Markov chain predicts next (the placer's order), and MCMF also sees the
//! application's predicted next requests (§III-C2); without a history (or with a placer
//! other than `mcmf:ORDER>0`) a request counts one stripe size per stripe.
//!
//! Departures from the paper: loads come from a file the site fills rather than from a
//! publisher on every OSS; a request's size is predicted, never told.

use crate::bounds::LogLimit;
use crate::placement_history::{ApplicationKey, SizeHistory};
use crate::proto;
use policies::placement::{
    self, markov, History, Oss, PlaceInput, Placer, PlacerState, Request, Target,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Largest feed file read.
pub const MAX_FEED_BYTES: u64 = 4 << 20;
/// Most targets in a feed.
pub const MAX_TARGETS: usize = 65_536;
/// Most placement requests a local controller relays at once.
pub const MAX_RELAYED: usize = 4096;
/// Most of them from one stage (its threads creating files at the same time).
pub const MAX_RELAYED_PER_STAGE: usize = 64;

/// Feed problems, at most 5 lines per 5 s.
static FEED_LOG: LogLimit = LogLimit::new(5, Duration::from_secs(5));

/// `[placement]` of `global.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// The mountpoint whose new files are placed (as the stages name it).
    pub mount: String,
    /// The placer (`policies::placement::Placer::parse`).
    #[serde(default = "default_placer")]
    pub placer: String,
    /// A feed file, or `simulated:OSSES:TARGETS`.
    pub feed: String,
    /// How often the feed is re-read, ms.
    #[serde(default = "default_refresh_ms")]
    pub refresh_ms: u64,
    /// What one application is, for its size history: `program` (the default), `job`
    /// or `user+program` ([`ApplicationKey`]).
    #[serde(default = "default_application")]
    pub application: String,
}

fn default_application() -> String {
    "program".into()
}

fn default_placer() -> String {
    "mcmf".into()
}

fn default_refresh_ms() -> u64 {
    5000
}

impl PlacementConfig {
    /// `Ok` if usable; else one line naming the key and value.
    pub fn validate(&self) -> Result<(), PlacementConfigError> {
        if !self.mount.starts_with('/') {
            return Err(PlacementConfigError::RelativeMount(self.mount.clone()));
        }
        Placer::parse(&self.placer).map_err(PlacementConfigError::Placer)?;
        ApplicationKey::parse(&self.application)
            .ok_or_else(|| PlacementConfigError::Application(short(&self.application)))?;
        if !(100..=3_600_000).contains(&self.refresh_ms) {
            return Err(PlacementConfigError::RefreshMs(self.refresh_ms));
        }
        if let Some(spec) = self.feed.strip_prefix("simulated:") {
            simulated(spec).map_err(PlacementConfigError::Simulated)?;
        } else if !self.feed.starts_with('/') {
            return Err(PlacementConfigError::Feed(self.feed.clone()));
        }
        Ok(())
    }
}

/// A `[placement]` section refused, naming the key and the value.
#[derive(Debug, thiserror::Error)]
pub enum PlacementConfigError {
    /// `mount` is no absolute path.
    #[error("placement.mount = '{0}': not an absolute mountpoint")]
    RelativeMount(String),
    /// `placer` names no placer.
    #[error("placement.placer: {0}")]
    Placer(policies::SpecError),
    /// `refresh_ms` out of its range.
    #[error("placement.refresh_ms = {0}: must be between 100 and 3600000")]
    RefreshMs(u64),
    /// A bad `simulated:` feed.
    #[error("placement.feed: {0}")]
    Simulated(FeedError),
    /// `feed` is neither an absolute path nor `simulated:…`.
    #[error("placement.feed = '{0}': an absolute path or simulated:OSSES:TARGETS")]
    Feed(String),
    /// `application` names no [`ApplicationKey`].
    #[error("placement.application = '{0}': expected one of {names}", names = ApplicationKey::NAMES)]
    Application(String),
    /// The thread that reads the feed could not be started.
    #[error("placement: cannot start the feed's reader ({0})")]
    Reader(std::io::Error),
}

/// A feed refused: where (its `simulated:` spec, its file, a line, a target) and why.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// `simulated:SPEC` not of the form `OSSES:TARGETS_PER_OSS`.
    #[error("'simulated:{0}': expected simulated:OSSES:TARGETS_PER_OSS")]
    SimulatedSyntax(String),
    /// `simulated:SPEC` with no target or more than [`MAX_TARGETS`].
    #[error("'simulated:{0}': 1 to {MAX_TARGETS} targets in all")]
    SimulatedSize(String),
    /// A malformed known line (its number; the reason quotes the bad part, shortened).
    #[error("line {line}: {why}")]
    Line {
        /// 1-based.
        line: usize,
        /// What is wrong, naming the value.
        why: String,
    },
    /// A feed that names no target (an empty file: one being rewritten in place, say).
    #[error("names no target")]
    NoTarget,
    /// A target whose numbers do not fit together.
    #[error("OST{target:04x}: {why}")]
    Target {
        /// The target's index.
        target: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// The feed file could not be read.
    #[error("feed '{path}': {error}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        error: padll_wire::config::ReadError,
    },
    /// The feed file's text is bad.
    #[error("feed '{path}': {error}")]
    InFile {
        /// The file.
        path: String,
        /// What is wrong in it.
        error: Box<FeedError>,
    },
}

/// Servers and targets as the feed describes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Loads {
    /// The servers.
    pub osses: Vec<Oss>,
    /// The targets.
    pub targets: Vec<Target>,
}

/// `OSSES:TARGETS`: `OSSES × TARGETS` 1 TiB targets, target `i` `(i mod 10) × 5 %` full.
fn simulated(spec: &str) -> Result<Loads, FeedError> {
    let bad = || FeedError::SimulatedSyntax(spec.to_string());
    let (osses, per_oss) = spec.split_once(':').ok_or_else(bad)?;
    let osses: u32 = osses.trim().parse().map_err(|_| bad())?;
    let per_oss: u32 = per_oss.trim().parse().map_err(|_| bad())?;
    if osses == 0 || per_oss == 0 || osses as usize * per_oss as usize > MAX_TARGETS {
        return Err(FeedError::SimulatedSize(spec.to_string()));
    }
    let capacity = (1u64 << 40) as f64;
    Ok(Loads {
        osses: (0..osses)
            .map(|id| Oss {
                id,
                cpu: 0.0,
                memory: 0.0,
            })
            .collect(),
        targets: (0..osses * per_oss)
            .map(|id| Target {
                id,
                oss: id / per_oss,
                capacity,
                used: capacity * f64::from(id % 10) * 0.05,
                load: 0.0,
            })
            .collect(),
    })
}

/// Parses a feed (see the module's documentation).
pub fn parse_feed(text: &str) -> Result<Loads, FeedError> {
    let mut loads = Loads::default();
    let mut oss = 0u32;
    // Per target: (server, kbytestotal, kbytesavail).
    let mut targets: std::collections::BTreeMap<u32, (u32, Option<f64>, Option<f64>)> =
        Default::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = |why: String| FeedError::Line { line: n + 1, why };
        if let Some(rest) = line.strip_prefix("oss=") {
            let mut words = rest.split_whitespace();
            oss = words
                .next()
                .and_then(|id| id.parse().ok())
                .ok_or_else(|| at(format!("bad server id in '{}'", short(line))))?;
            let mut server = Oss {
                id: oss,
                cpu: 0.0,
                memory: 0.0,
            };
            for word in words {
                let (key, value) = word
                    .split_once('=')
                    .ok_or_else(|| at(format!("'{}' is not KEY=VALUE", short(word))))?;
                let value = percent(value).ok_or_else(|| at(format!("bad {key} '{value}'")))?;
                match key {
                    "cpu" => server.cpu = value,
                    "memory" => server.memory = value,
                    _ => return Err(at(format!("unknown server key '{}'", short(key)))),
                }
            }
            if loads.osses.iter().any(|o| o.id == oss) {
                return Err(at(format!("server {oss} named twice")));
            }
            if loads.osses.len() == MAX_TARGETS {
                return Err(at(format!("more than {MAX_TARGETS} servers")));
            }
            loads.osses.push(server);
            continue;
        }
        let Some(rest) = line.strip_prefix("obdfilter.") else {
            continue;
        };
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        let Some((device, key)) = name.rsplit_once('.') else {
            continue;
        };
        if key != "kbytestotal" && key != "kbytesavail" {
            continue;
        }
        let index = device
            .rsplit_once("OST")
            .and_then(|(_, hex)| u32::from_str_radix(hex, 16).ok())
            .ok_or_else(|| at(format!("no OST index in '{}'", short(device))))?;
        let kbytes: f64 = value
            .trim()
            .parse::<u64>()
            .map_err(|_| at(format!("bad {key} '{}'", short(value))))?
            as f64;
        if !targets.contains_key(&index) && targets.len() == MAX_TARGETS {
            return Err(at(format!("more than {MAX_TARGETS} targets")));
        }
        let entry = targets.entry(index).or_insert((oss, None, None));
        let slot = if key == "kbytestotal" {
            &mut entry.1
        } else {
            &mut entry.2
        };
        *slot = Some(kbytes * 1024.0);
    }
    for (id, (oss, total, avail)) in targets {
        let (Some(capacity), Some(avail)) = (total, avail) else {
            return Err(FeedError::Target {
                target: id,
                why: "needs both kbytestotal and kbytesavail",
            });
        };
        if avail > capacity {
            return Err(FeedError::Target {
                target: id,
                why: "kbytesavail exceeds kbytestotal",
            });
        }
        loads.targets.push(Target {
            id,
            oss,
            capacity,
            used: capacity - avail,
            load: 0.0,
        });
    }
    if loads.targets.is_empty() {
        return Err(FeedError::NoTarget);
    }
    Ok(loads)
}

fn percent(text: &str) -> Option<f64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=100.0).contains(v))
}

fn short(text: &str) -> String {
    padll_wire::control::short(text)
}

/// Reads a feed file: regular, at most [`MAX_FEED_BYTES`], opened non-blocking (a FIFO
/// is refused at once).
fn read_feed(path: &str) -> Result<Loads, FeedError> {
    let text = padll_wire::config::read_text_file(path, MAX_FEED_BYTES).map_err(|error| {
        FeedError::Unreadable {
            path: path.to_string(),
            error,
        }
    })?;
    parse_feed(&text).map_err(|error| FeedError::InFile {
        path: path.to_string(),
        error: Box::new(error),
    })
}

/// The loads of `feed`: its file's, or simulated ones.
fn load(feed: &str) -> Result<Loads, FeedError> {
    match feed.strip_prefix("simulated:") {
        Some(spec) => simulated(spec),
        None => read_feed(feed),
    }
}

/// What the service knows between requests.
struct State {
    /// The servers and targets of the last feed read, with the stripes placed since
    /// counted in; its request is set for each answer.
    input: PlaceInput,
    placer: PlacerState,
}

/// The mapper: answers placement requests from the feed's loads. A thread of its own
/// reads the feed at start and every `refresh_ms`, and swaps the new loads in: a
/// request never waits for the file (a slow file system, a FIFO), and the lock it takes
/// is held only while it places. Until the feed is first read it gives no advice.
pub struct PlacementService {
    config: PlacementConfig,
    placer: Placer,
    application: ApplicationKey,
    state: Arc<Mutex<State>>,
    /// Each application's file sizes (its own lock: recording never waits for a
    /// placement).
    history: Mutex<SizeHistory>,
    /// Dropped with the service: the reader thread then ends.
    _stop_reading: mpsc::Sender<()>,
}

impl PlacementService {
    /// A service for a validated configuration, its feed reader started.
    pub fn new(config: PlacementConfig) -> Result<PlacementService, PlacementConfigError> {
        config.validate()?;
        let state = Arc::new(Mutex::new(State {
            input: PlaceInput {
                stripe_size: placement::DEFAULT_STRIPE_SIZE,
                osses: Vec::new(),
                targets: Vec::new(),
                requests: Vec::new(),
                history: Vec::new(),
            },
            placer: PlacerState::default(),
        }));
        let (stop_reading, stopped) = mpsc::channel();
        let (feed, every, loads) = (
            config.feed.clone(),
            Duration::from_millis(config.refresh_ms),
            state.clone(),
        );
        std::thread::Builder::new()
            .name("placement feed".into())
            .spawn(move || read_feed_until_stopped(&feed, every, &loads, &stopped))
            .map_err(PlacementConfigError::Reader)?;
        Ok(PlacementService {
            placer: Placer::parse(&config.placer).map_err(PlacementConfigError::Placer)?,
            application: ApplicationKey::parse(&config.application).unwrap_or_default(),
            config,
            state,
            history: Mutex::default(),
            _stop_reading: stop_reading,
        })
    }

    /// The application `stage` belongs to (`[placement] application`).
    pub fn application_of(&self, stage: &proto::Stage) -> String {
        self.application.of(stage)
    }

    /// Adds the final sizes of files of `app` on `mount` (checked: at most
    /// `MAX_FILE_SIZES`, each at most `MAX_FILE_BYTES`) to its history; sizes on
    /// another mountpoint are not this service's.
    pub fn record_sizes(
        &self,
        app: &str,
        mount: &str,
        sizes: &[u64],
    ) -> Result<(), crate::placement_history::SizesRefused> {
        crate::placement_history::check(sizes)?;
        if mount == self.config.mount {
            padll_wire::sync::lock(&self.history).record(app, sizes);
        }
        Ok(())
    }

    /// `app`'s sizes, oldest first.
    pub fn sizes_of(&self, app: &str) -> Vec<f64> {
        padll_wire::sync::lock(&self.history).of(app)
    }

    /// Every application's sizes, for the next leader.
    pub fn saved_sizes(&self) -> Vec<crate::placement_history::SavedSizes> {
        padll_wire::sync::lock(&self.history).saved()
    }

    /// Replaces the history by a previous leader's (checked against the bounds).
    pub fn load_sizes(
        &self,
        saved: Vec<crate::placement_history::SavedSizes>,
    ) -> Result<(), crate::placement_history::SizesRefused> {
        *padll_wire::sync::lock(&self.history) = SizeHistory::load(saved)?;
        Ok(())
    }

    /// The size `app`'s next file is predicted to have (its Markov chain of the
    /// placer's order), or 0 without a history or a chain.
    pub fn predicted_bytes(&self, app: &str) -> f64 {
        let order = match self.placer {
            Placer::Mcmf { order, .. } if order > 0 => order,
            _ => return 0.0,
        };
        let history = self.sizes_of(app);
        markov::predict(&history, order, 1)
            .first()
            .map_or(0.0, |b| b.max(0.0))
    }

    /// The targets for a new file of `request` of application `app` (if known; empty:
    /// no advice).
    pub fn answer(&self, request: &proto::PlaceRequest, app: Option<&str>) -> Vec<u32> {
        if request.mount != self.config.mount {
            return Vec::new();
        }
        let (bytes, history) = match app {
            Some(app) => (self.predicted_bytes(app), self.sizes_of(app)),
            None => (0.0, Vec::new()),
        };
        let mut state = padll_wire::sync::lock(&self.state);
        let State { input, placer } = &mut *state;
        let available = input
            .targets
            .len()
            .min(padll_wire::config::MAX_STRIPES as usize);
        if available == 0 {
            return Vec::new();
        }
        let stripes = request.stripes.clamp(1, available as u32);
        input.requests = vec![Request {
            id: request.request,
            app: 0,
            stripes,
            bytes,
        }];
        input.history = vec![History {
            app: 0,
            bytes: history,
        }];
        let decision = placement::place(&self.placer, input, placer);
        let Some(chosen) = decision.ok().and_then(|d| d.placements.into_iter().next()) else {
            return Vec::new();
        };
        let stripe = if bytes > 0.0 {
            bytes / f64::from(stripes)
        } else {
            placement::DEFAULT_STRIPE_SIZE
        };
        for id in &chosen.targets {
            if let Some(target) = input.targets.iter_mut().find(|t| t.id == *id) {
                target.used = (target.used + stripe).min(target.capacity);
            }
        }
        chosen.targets
    }
}

/// The feed reader: loads `feed` now and every `every` into `state` (a feed refused
/// leaves the last loads in use), until `stopped` is disconnected.
fn read_feed_until_stopped(
    feed: &str,
    every: Duration,
    state: &Mutex<State>,
    stopped: &mpsc::Receiver<()>,
) {
    loop {
        match load(feed) {
            Ok(loads) => {
                let mut state = padll_wire::sync::lock(state);
                state.input.osses = loads.osses;
                state.input.targets = loads.targets;
            }
            Err(e) => crate::limited_warn!(FEED_LOG, "placement: {e}; keeping the last loads"),
        }
        if stopped.recv_timeout(every) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
    }
}

/// A local controller's placement requests in flight upstream: which stage asked, under
/// which of its ids. Bounded; emptied when the upstream stream ends (no answer will
/// come, and the stages stop waiting on their own).
#[derive(Default)]
pub struct Relay {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, (u64, u64)>>,
}

impl Relay {
    /// The upstream id for stage `stage`'s request `id`; `None` when too many wait (on
    /// this node, or from this stage).
    pub fn ask(&self, stage: u64, id: u64) -> Option<u64> {
        let mut waiting = padll_wire::sync::lock(&self.waiting);
        let from_stage = waiting.values().filter(|(s, _)| *s == stage).count();
        if waiting.len() >= MAX_RELAYED || from_stage >= MAX_RELAYED_PER_STAGE {
            return None;
        }
        let request = self.next.fetch_add(1, Ordering::Relaxed);
        waiting.insert(request, (stage, id));
        Some(request)
    }

    /// Who asked upstream request `request` (stage, its id), once.
    pub fn answered(&self, request: u64) -> Option<(u64, u64)> {
        let mut waiting = padll_wire::sync::lock(&self.waiting);
        waiting.remove(&request)
    }

    /// Forgets every request (the stream they went on ended).
    pub fn clear(&self) {
        padll_wire::sync::lock(&self.waiting).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feeds_parse_and_name_their_errors() {
        let loads = parse_feed(
            "# two servers\noss=0 cpu=35 memory=60\nobdfilter.lustre-OST0000.kbytestotal=1000\n\
             obdfilter.lustre-OST0000.kbytesavail=250\nobdfilter.lustre-OST0000.stats=\n\
             write_bytes 8 samples [bytes] 4096 1048576 4198400\noss=1\n\
             obdfilter.lustre-OST000a.kbytestotal=2000\nobdfilter.lustre-OST000a.kbytesavail=2000\n",
        )
        .unwrap();
        assert_eq!(loads.osses.len(), 2);
        assert_eq!((loads.osses[0].cpu, loads.osses[0].memory), (35.0, 60.0));
        assert_eq!(loads.targets.len(), 2);
        assert_eq!(
            (
                loads.targets[0].id,
                loads.targets[0].oss,
                loads.targets[0].used
            ),
            (0, 0, 750.0 * 1024.0)
        );
        assert_eq!((loads.targets[1].id, loads.targets[1].oss), (10, 1));
        for (text, needle) in [
            ("oss=x", "line 1: bad server id"),
            ("oss=0 cpu=150", "bad cpu '150'"),
            ("oss=0 disk=3", "unknown server key 'disk'"),
            ("oss=0\noss=0", "line 2: server 0 named twice"),
            ("obdfilter.lustre-OSTzz.kbytestotal=1", "no OST index"),
            (
                "obdfilter.lustre-OST0000.kbytesavail=-1",
                "bad kbytesavail '-1'",
            ),
            (
                "obdfilter.lustre-OST0001.kbytestotal=1",
                "OST0001: needs both",
            ),
            (
                "obdfilter.l-OST0000.kbytestotal=1\nobdfilter.l-OST0000.kbytesavail=2",
                "exceeds",
            ),
            ("", "names no target"),
            (
                "oss=0 cpu=10\n# a feed cut before its first target\n",
                "names no target",
            ),
        ] {
            let error = parse_feed(text).unwrap_err();
            assert!(error.to_string().contains(needle), "{text}: {error}");
        }
    }

    fn request(stripes: u32) -> proto::PlaceRequest {
        proto::PlaceRequest {
            request: 1,
            mount: "/lustre".into(),
            stripes,
            stage_id: 0,
        }
    }

    /// A service whose feed is re-read every `refresh_ms`.
    fn refreshed(placer: &str, feed: &str, refresh_ms: u64) -> PlacementService {
        PlacementService::new(PlacementConfig {
            mount: "/lustre".into(),
            placer: placer.into(),
            feed: feed.into(),
            refresh_ms,
            application: "program".into(),
        })
        .unwrap()
    }

    /// A service whose feed has been read once (and is not again during a test).
    fn service(placer: &str, feed: &str) -> PlacementService {
        let service = refreshed(placer, feed, 600_000);
        targets_within(&service, Duration::from_secs(10), |targets| targets > 0);
        service
    }

    /// Waits until the service's target count satisfies `wanted`.
    fn targets_within(
        service: &PlacementService,
        timeout: Duration,
        wanted: impl Fn(usize) -> bool,
    ) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let targets = padll_wire::sync::lock(&service.state).input.targets.len();
            if wanted(targets) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{targets} targets after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A feed of `targets` targets on one server, padded with comments to `bytes`.
    fn feed_of(targets: u32, bytes: usize) -> String {
        let mut text = String::from("oss=0\n");
        for t in 0..targets {
            text.push_str(&format!(
                "obdfilter.l-OST{t:04x}.kbytestotal=1000000\nobdfilter.l-OST{t:04x}.kbytesavail=1000000\n"
            ));
        }
        let line = "# padding to make the feed larger than a configuration file\n";
        while text.len() < bytes {
            text.push_str(line);
        }
        text
    }

    #[test]
    fn feeds_up_to_4_mib_are_read_larger_ones_and_fifos_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("feed");
        std::fs::write(&path, feed_of(3, 3 << 20)).unwrap();
        let path = path.to_str().unwrap();
        assert_eq!(read_feed(path).unwrap().targets.len(), 3, "a 3 MiB feed");
        std::fs::write(path, feed_of(3, MAX_FEED_BYTES as usize + 1)).unwrap();
        let error = read_feed(path).unwrap_err().to_string();
        assert!(
            error.contains(path) && error.contains("exceeds the limit of 4194304"),
            "{error}"
        );
        std::fs::remove_file(path).unwrap();
        let made = std::ffi::CString::new(path).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path, which lives across the call.
        assert_eq!(unsafe { libc::mkfifo(made.as_ptr(), 0o600) }, 0);
        // No writer: a blocking open would wait for ever.
        let error = read_feed(path).unwrap_err().to_string();
        assert!(
            error.contains(path) && error.contains("not a regular file"),
            "{error}"
        );
    }

    #[test]
    fn a_refused_feed_keeps_the_last_loads_and_a_good_one_replaces_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("feed");
        std::fs::write(&path, feed_of(3, 0)).unwrap();
        let mapper = refreshed("round-robin", path.to_str().unwrap(), 100);
        targets_within(&mapper, Duration::from_secs(10), |n| n == 3);
        // A FIFO is refused at once: requests are answered from the last loads meanwhile,
        // and the reader goes on (it takes the next good feed).
        std::fs::remove_file(&path).unwrap();
        let made = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path, which lives across the call.
        assert_eq!(unsafe { libc::mkfifo(made.as_ptr(), 0o600) }, 0);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(mapper.answer(&request(1), None).len(), 1);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, feed_of(5, 0)).unwrap();
        targets_within(&mapper, Duration::from_secs(10), |n| n == 5);
    }

    #[test]
    fn mcmf_places_on_the_emptiest_targets_of_distinct_servers() {
        // Targets 0 and 10 are empty (i mod 10 = 0), on servers 0 and 2 of 4 × 5.
        let mapper = service("mcmf", "simulated:4:5");
        let mut first = mapper.answer(&request(2), None);
        first.sort();
        assert_eq!(first, vec![0, 10]);
        // Another mount, or no targets wanted beyond what exists: no advice / clamped.
        let mut other = request(1);
        other.mount = "/scratch".into();
        assert!(mapper.answer(&other, None).is_empty());
        assert_eq!(mapper.answer(&request(100), None).len(), 20);
    }

    #[test]
    fn a_predicted_large_file_goes_where_it_fits() {
        // OST0 is the emptiest but on a busy server; OST1 and OST2, on an idle one,
        // have 600 MB and 500 MB free: a small file goes to the idle server, a file of
        // 800 MB fits only on OST0.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("feed");
        std::fs::write(
            &path,
            "oss=0 cpu=90 memory=90\n\
             obdfilter.l-OST0000.kbytestotal=1000000\n\
             obdfilter.l-OST0000.kbytesavail=950000\n\
             oss=1 cpu=0 memory=0\n\
             obdfilter.l-OST0001.kbytestotal=1000000\n\
             obdfilter.l-OST0001.kbytesavail=600000\n\
             obdfilter.l-OST0002.kbytestotal=1000000\n\
             obdfilter.l-OST0002.kbytesavail=500000\n",
        )
        .unwrap();
        let mapper = service("mcmf", path.to_str().unwrap());
        assert_eq!(mapper.predicted_bytes("small"), 0.0, "no history");
        assert_eq!(mapper.answer(&request(1), Some("small")), vec![1]);
        let big = 800u64 << 20;
        mapper.record_sizes("big", "/lustre", &[big; 5]).unwrap();
        assert_eq!(mapper.predicted_bytes("big"), big as f64);
        assert_eq!(mapper.answer(&request(1), Some("big")), vec![0]);
        // Sizes on another mountpoint are not this service's; bad ones are refused.
        mapper.record_sizes("other", "/scratch", &[big]).unwrap();
        assert!(mapper.sizes_of("other").is_empty());
        let error = mapper.record_sizes("big", "/lustre", &[]).unwrap_err();
        assert_eq!(error.to_string(), "0 sizes in one message (1 to 64)");
        assert_eq!(mapper.sizes_of("big").len(), 5);
        // A placer without a chain predicts nothing.
        let round_robin = service("round-robin", path.to_str().unwrap());
        round_robin.record_sizes("big", "/lustre", &[big]).unwrap();
        assert_eq!(round_robin.predicted_bytes("big"), 0.0);
    }

    #[test]
    fn round_robin_goes_round() {
        let mapper = service("round-robin", "simulated:2:2");
        let picks: Vec<u32> = (0..4)
            .flat_map(|_| mapper.answer(&request(1), None))
            .collect();
        let mut sorted = picks.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3], "{picks:?}");
    }

    #[test]
    fn a_missing_feed_gives_no_advice() {
        let mapper = refreshed("mcmf", "/nonexistent/feed", 100);
        std::thread::sleep(Duration::from_millis(300));
        assert!(mapper.answer(&request(1), None).is_empty());
    }

    #[test]
    fn bad_configurations_are_named() {
        let config = |mount: &str, placer: &str, feed: &str, refresh_ms| PlacementConfig {
            mount: mount.into(),
            placer: placer.into(),
            feed: feed.into(),
            refresh_ms,
            application: "program".into(),
        };
        for (bad, needle) in [
            (config("lustre", "mcmf", "/f", 5000), "placement.mount"),
            (config("/l", "fastest", "/f", 5000), "placement.placer"),
            (config("/l", "mcmf", "/f", 10), "placement.refresh_ms = 10"),
            (
                config("/l", "mcmf", "feed", 5000),
                "placement.feed = 'feed'",
            ),
            (config("/l", "mcmf", "simulated:0:4", 5000), "1 to 65536"),
            (config("/l", "mcmf", "simulated:x", 5000), "simulated:OSSES"),
            (
                PlacementConfig {
                    application: "host".into(),
                    ..config("/l", "mcmf", "/f", 5000)
                },
                "placement.application = 'host': expected one of program, job, user+program",
            ),
        ] {
            let error = bad.validate().unwrap_err();
            assert!(error.to_string().contains(needle), "{error}");
        }
    }

    #[test]
    fn the_relay_is_bounded_and_answers_once() {
        let relay = Relay::default();
        let first = relay.ask(7, 1).unwrap();
        assert_eq!(relay.answered(first), Some((7, 1)));
        assert_eq!(relay.answered(first), None);
        for i in 0..MAX_RELAYED_PER_STAGE as u64 {
            relay.ask(1, i).unwrap();
        }
        assert_eq!(relay.ask(1, 0), None, "one stage's share is full");
        for stage in 2..(MAX_RELAYED / MAX_RELAYED_PER_STAGE) as u64 + 1 {
            for i in 0..MAX_RELAYED_PER_STAGE as u64 {
                relay.ask(stage, i).unwrap();
            }
        }
        assert_eq!(relay.ask(999, 0), None, "the node's share is full");
        relay.clear();
        assert!(relay.ask(1, 0).is_some());
    }
}
