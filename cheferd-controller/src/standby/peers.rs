//! A leader whose lease has lapsed asks the standbys whether etcd is down.
//!
//! From etcd alone a leader cannot tell etcd being down (no one can be elected: it
//! should keep controlling) from itself being cut off from etcd (a standby is elected
//! once its lease expires: it must stop). The standbys can: each says, through the
//! `Standing` RPC of its gRPC port, which leader and term it knows and whether etcd
//! answers it. The candidates are learnt from the election while etcd answers the
//! leader. [`decide`] turns their answers into what the leader does.
//!
//! A leader that knows no standby (a single `cheferd global --etcd`) keeps controlling:
//! freezing would leave the site less protected with etcd than without it. It is safe
//! because of the terms, not of a confirmation: a standby elected while this leader is
//! cut off has a newer term, local controllers that reach it follow it and refuse this
//! leader from then on, and each node follows one leader at a time; once etcd answers
//! this leader again, it finds its lease gone and exits.

use super::{etcd::Etcd, StandbyError};
use crate::global::{LeaderTerm, Leadership};
use crate::proto::{global_client::GlobalClient, StandingReply, StandingRequest};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::ClientTlsConfig;
use tracing::{info, warn};

/// How often a leader whose lease has lapsed asks the standbys.
const ASK_EVERY: Duration = Duration::from_millis(500);
/// How long a standby may take to answer (connection included).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// Once etcd stops answering, the standbys are asked this long before the lease
/// lapses, so that control goes on without a gap if etcd is down for them too.
const ASK_AHEAD: Duration = ASK_EVERY.saturating_add(ANSWER_TIMEOUT);
/// How often a leader learns the candidates from etcd.
const LEARN_EVERY: Duration = Duration::from_secs(2);
/// At most this many candidates are asked (two or three are expected).
const MAX_CANDIDATES: usize = 16;
/// A candidate's URL longer than this is ignored.
const MAX_URL_BYTES: usize = 512;
/// How often "keeping control" is said again while etcd stays down.
const SAY_AGAIN_EVERY: Duration = Duration::from_secs(60);

/// What a leader whose lease has lapsed does, from the standbys' answers.
#[derive(Debug)]
pub enum Decision {
    /// A standby knows a newer term: another leader was elected. Stop, saying why.
    StepDown(StandbyError),
    /// Every standby answered that it cannot reach etcd either: no one can be elected
    /// while etcd is down, so keep controlling.
    EtcdDown,
    /// No standby is known: keep controlling (see the module's documentation).
    Alone,
    /// A standby reaches etcd (this leader is cut off from it and will be replaced) or
    /// could not be asked: send no rules, saying why.
    Freeze(String),
}

/// The decision of the leader of `term` from each standby's answer (`None`: it did
/// not answer). A newer term wins over everything; with standbys, keeping control needs
/// every one to confirm; without, it is kept.
pub fn decide(term: LeaderTerm, answers: &[(String, Option<StandingReply>)]) -> Decision {
    let replies = || {
        answers
            .iter()
            .filter_map(|(url, reply)| Some((url, reply.as_ref()?)))
    };
    let known = |reply: &StandingReply| LeaderTerm::of(reply.term, reply.generation.as_ref());
    if let Some((url, newer)) = replies().find(|(_, reply)| known(reply).newer_than(term)) {
        return Decision::StepDown(StandbyError::Deposed {
            standby: url.clone(),
            leader: newer.leader.clone(),
            term: known(newer),
            mine: term,
        });
    }
    if answers.is_empty() {
        return Decision::Alone;
    }
    if let Some((url, _)) = answers.iter().find(|(_, reply)| reply.is_none()) {
        return Decision::Freeze(format!(
            "standby {url} does not answer, so etcd being down cannot be confirmed"
        ));
    }
    if let Some((url, _)) = replies().find(|(_, reply)| reply.etcd_reachable) {
        return Decision::Freeze(format!(
            "etcd answers standby {url} but not this controller: cut off from etcd, it will be replaced once its lease expires there"
        ));
    }
    Decision::EtcdDown
}

/// Whether a leader asks the standbys now: its lease has lapsed, or etcd does not
/// answer it and the lease lapses within [`ASK_AHEAD`].
fn must_ask(leadership: &Leadership) -> bool {
    let ahead = if leadership.etcd_unreachable() {
        ASK_AHEAD
    } else {
        Duration::ZERO
    };
    !leadership.lease_valid_for(ahead)
}

/// Until when a leader whose lease has lapsed may control after `decision`, made at
/// `now`: half a TTL when etcd is confirmed down or no standby is known (asked again
/// every [`ASK_EVERY`], it lasts while that holds); not at all otherwise (a standby
/// may be elected soon).
fn controls_until(decision: &Decision, now: Instant, ttl: Duration) -> Instant {
    match decision {
        Decision::EtcdDown | Decision::Alone => now + ttl / 2,
        Decision::StepDown(_) | Decision::Freeze(_) => now,
    }
}

/// The other global controllers, as a leader asks them.
pub struct Standbys {
    tls: Option<ClientTlsConfig>,
    /// This controller's own URL, not asked.
    me: String,
    /// Their URLs, learnt from the election.
    urls: Mutex<Vec<String>>,
}

impl Standbys {
    /// The standbys of the leader advertised as `me`, their server certificates
    /// checked with `tls` (plaintext without).
    pub fn new(tls: Option<ClientTlsConfig>, me: &str) -> Standbys {
        Standbys {
            tls,
            me: me.to_string(),
            urls: Mutex::new(Vec::new()),
        }
    }

    /// Learns the candidates of `election` (every campaigning global controller's
    /// proclaimed URL) from etcd, and, while the lease has lapsed (or is about to, etcd
    /// not answering), asks them and acts on [`decide`]. Returns only to step down,
    /// saying why.
    pub async fn watch(
        &self,
        etcd: &Etcd,
        election: &str,
        leadership: &Leadership,
        ttl: Duration,
    ) -> StandbyError {
        let mut last_learnt = None::<Instant>;
        let mut said = None::<(bool, Instant)>;
        loop {
            tokio::time::sleep(ASK_EVERY).await;
            if !must_ask(leadership) {
                if last_learnt.is_none_or(|t| t.elapsed() >= LEARN_EVERY) {
                    self.learn(etcd, election).await;
                    last_learnt = Some(Instant::now());
                }
                said = None;
                continue;
            }
            let Some(term) = leadership.term().0 else {
                continue;
            };
            let answers = self.ask_all().await;
            let decision = decide(term, &answers);
            leadership.etcd_down_confirmed(controls_until(&decision, Instant::now(), ttl));
            let keeping = match decision {
                Decision::StepDown(why) => return why,
                Decision::EtcdDown => "every standby confirms that it cannot reach etcd either",
                Decision::Alone => "no standby is known",
                Decision::Freeze(why) => {
                    // Said once the lease has lapsed (asked ahead, it still controls).
                    if !leadership.lease_valid() && said.is_none_or(|(down, _)| down) {
                        warn!("not controlling: {why}");
                        said = Some((false, Instant::now()));
                    }
                    continue;
                }
            };
            if said.is_none_or(|(down, at)| !down || at.elapsed() >= SAY_AGAIN_EVERY) {
                let since = leadership.status().etcd_unreachable_since;
                warn!(
                    "etcd unreachable since {}: keeping control in term {} ({keeping}); administrative changes are not persisted until etcd answers again",
                    since.map_or("now".into(), crate::global::utc),
                    term.term
                );
                said = Some((true, Instant::now()));
            }
        }
    }

    /// Replaces the candidates by those campaigning in `election` now (etcd not
    /// answering: kept as they were).
    async fn learn(&self, etcd: &Etcd, election: &str) {
        let Ok(campaigning) = etcd.range_prefix(&format!("{election}/")).await else {
            return;
        };
        let mut urls: Vec<String> = campaigning
            .into_iter()
            .filter(|kv| kv.value.len() <= MAX_URL_BYTES)
            .filter_map(|kv| String::from_utf8(kv.value).ok())
            .filter(|url| *url != self.me)
            .collect();
        urls.sort();
        urls.dedup();
        urls.truncate(MAX_CANDIDATES);
        let mut known = padll_wire::sync::lock(&self.urls);
        if *known != urls {
            info!(standbys = ?urls, "standbys to ask if etcd becomes unreachable");
            *known = urls;
        }
    }

    /// Every standby's answer, asked at once, in the order of their URLs.
    async fn ask_all(&self) -> Vec<(String, Option<StandingReply>)> {
        let urls = padll_wire::sync::lock(&self.urls).clone();
        answers(urls, |url| ask(url, self.tls.clone())).await
    }
}

/// The answer to `ask` of each of `urls`, asked at once, in the order of `urls`; `None`
/// if one gives none within [`ANSWER_TIMEOUT`].
async fn answers<F>(
    urls: Vec<String>,
    ask: impl Fn(String) -> F,
) -> Vec<(String, Option<StandingReply>)>
where
    F: Future<Output = Option<StandingReply>> + Send + 'static,
{
    let mut asking = tokio::task::JoinSet::new();
    for (index, url) in urls.iter().enumerate() {
        let asked = ask(url.clone());
        asking.spawn(async move {
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, asked).await;
            (index, answer.ok().flatten())
        });
    }
    let mut answers: Vec<_> = urls.into_iter().map(|url| (url, None)).collect();
    while let Some(Ok((index, answer))) = asking.join_next().await {
        answers[index].1 = answer;
    }
    answers
}

/// The answer of the standby at `url`, or `None` if its URL or certificate is refused,
/// or it cannot be reached within [`ANSWER_TIMEOUT`].
async fn ask(url: String, tls: Option<ClientTlsConfig>) -> Option<StandingReply> {
    let endpoint = crate::tls::endpoint(&url, tls)
        .ok()?
        .connect_timeout(ANSWER_TIMEOUT);
    let mut client = GlobalClient::connect(endpoint).await.ok()?;
    let reply = client.standing(StandingRequest {}).await.ok()?;
    Some(reply.into_inner())
}

#[cfg(test)]
mod tests {
    use super::super::{Leader, Role};
    use super::*;

    fn reply(leader: &str, term: u64, etcd_reachable: bool) -> Option<StandingReply> {
        Some(StandingReply {
            leader: leader.into(),
            term,
            etcd_reachable,
            generation: None,
        })
    }

    fn standby(url: &str, answer: Option<StandingReply>) -> (String, Option<StandingReply>) {
        (url.to_string(), answer)
    }

    fn leader_term(term: u64) -> LeaderTerm {
        LeaderTerm {
            generation: Some(generation(1_000)),
            term,
        }
    }

    fn generation(created_ms: u64) -> crate::global::Generation {
        crate::global::Generation {
            created_ms,
            nonce: 5,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// The leader of term 40.
    fn leading() -> Leadership {
        let leadership = Leadership::default();
        leadership.set(Role::Leader(Leader {
            url: "https://a".into(),
            term: 40,
            generation: Some(generation(1_000)),
        }));
        leadership
    }

    #[tokio::test(start_paused = true)]
    async fn the_standbys_are_asked_once_the_lease_lapses_or_ahead_of_it_while_etcd_is_silent() {
        let leadership = leading();
        let ttl = Duration::from_secs(10);
        leadership.renewed(Instant::now() + ttl);
        tokio::time::advance(ttl - MS).await;
        assert!(!must_ask(&leadership));
        tokio::time::advance(MS).await;
        assert!(must_ask(&leadership));

        // etcd stops answering: asked ASK_AHEAD before the lease lapses.
        leadership.renewed(Instant::now() + ttl);
        leadership.etcd_answered(false);
        tokio::time::advance(ttl - ASK_AHEAD - MS).await;
        assert!(!must_ask(&leadership));
        tokio::time::advance(MS).await;
        assert!(must_ask(&leadership));
    }

    #[tokio::test(start_paused = true)]
    async fn a_confirmation_that_etcd_is_down_holds_half_a_ttl_and_a_freeze_withdraws_it() {
        let leadership = leading();
        leadership.renewed(Instant::now());
        assert!(!leadership.status().controlling, "the lease has lapsed");
        let ttl = Duration::from_secs(10);
        let confirm = |answers: &[(String, Option<StandingReply>)]| {
            let decision = decide(leader_term(40), answers);
            leadership.etcd_down_confirmed(controls_until(&decision, Instant::now(), ttl));
        };
        let down = [standby("https://b", reply("https://a", 40, false))];
        for answers in [&down[..], &[]] {
            confirm(answers);
            tokio::time::advance(ttl / 2 - MS).await;
            assert!(leadership.status().controlling, "{answers:?}");
            tokio::time::advance(MS).await;
            assert!(!leadership.status().controlling, "{answers:?}");
        }
        confirm(&down);
        assert!(leadership.status().controlling);
        confirm(&[standby("https://b", reply("https://a", 40, true))]);
        assert!(!leadership.status().controlling, "withdrawn at once");
    }

    #[tokio::test(start_paused = true)]
    async fn standbys_are_asked_at_once_and_one_answering_after_the_timeout_is_silent() {
        let urls = ["https://b", "https://c", "https://d"].map(String::from);
        let takes = |url: &str| match url {
            "https://b" => Some(ANSWER_TIMEOUT - MS),
            "https://c" => Some(ANSWER_TIMEOUT + MS),
            _ => None,
        };
        let asked_at = Instant::now();
        let answers = answers(urls.to_vec(), |url| {
            let takes = takes(&url);
            async move {
                match takes {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                reply("https://a", 40, false)
            }
        })
        .await;
        assert_eq!(Instant::now() - asked_at, ANSWER_TIMEOUT);
        let answered: Vec<(&str, bool)> = answers
            .iter()
            .map(|(url, reply)| (url.as_str(), reply.is_some()))
            .collect();
        assert_eq!(
            answered,
            [
                ("https://b", true),
                ("https://c", false),
                ("https://d", false)
            ]
        );
        let Decision::Freeze(why) = decide(leader_term(40), &answers) else {
            panic!("{:?}", decide(leader_term(40), &answers));
        };
        assert!(why.contains("https://c"), "{why}");
    }

    #[test]
    fn etcd_down_for_every_standby_keeps_control() {
        let answers = [
            standby("https://b", reply("https://a", 40, false)),
            standby("https://c", reply("", 0, false)),
        ];
        assert!(matches!(
            decide(leader_term(40), &answers),
            Decision::EtcdDown
        ));
    }

    #[test]
    fn a_newer_term_anywhere_steps_down_even_among_silent_standbys() {
        let answers = [
            standby("https://b", None),
            standby("https://c", reply("https://c", 41, true)),
        ];
        let Decision::StepDown(StandbyError::Deposed {
            standby,
            term,
            mine,
            ..
        }) = decide(leader_term(40), &answers)
        else {
            panic!("{:?}", decide(leader_term(40), &answers));
        };
        assert_eq!(
            (standby.as_str(), term.term, mine.term),
            ("https://c", 41, 40)
        );
    }

    #[test]
    fn a_standby_reaching_etcd_means_this_leader_is_cut_off_and_freezes() {
        let answers = [
            standby("https://b", reply("https://a", 40, false)),
            standby("https://c", reply("https://a", 40, true)),
        ];
        let Decision::Freeze(why) = decide(leader_term(40), &answers) else {
            panic!("{:?}", decide(leader_term(40), &answers));
        };
        assert!(
            why.contains("https://c") && why.contains("cut off"),
            "{why}"
        );
    }

    #[test]
    fn an_unanswered_or_unknown_standby_cannot_confirm_and_freezes() {
        let silent = [
            standby("https://b", reply("https://a", 40, false)),
            standby("https://c", None),
        ];
        assert!(
            matches!(decide(leader_term(40), &silent), Decision::Freeze(why) if why.contains("https://c"))
        );
    }

    #[test]
    fn a_leader_that_knows_no_standby_keeps_control() {
        assert!(matches!(decide(leader_term(40), &[]), Decision::Alone));
    }

    #[test]
    fn a_standby_leading_a_replaced_etcd_deposes_the_leader_of_the_old_data() {
        let mut rebuilt = reply("https://c", 2, true);
        if let Some(reply) = rebuilt.as_mut() {
            reply.generation = Some(generation(90_000).into());
        }
        let answers = [standby("https://c", rebuilt)];
        let Decision::StepDown(why) = decide(leader_term(40), &answers) else {
            panic!("{:?}", decide(leader_term(40), &answers));
        };
        let why = why.to_string();
        assert!(
            why.contains("in term 2 of the etcd data of 1970-01-01 00:01:30.000 UTC, newer than this controller's term 40 of"),
            "{why}"
        );
    }

    #[test]
    fn an_older_or_equal_term_is_not_a_reason_to_step_down() {
        let answers = [standby("https://b", reply("https://old", 12, false))];
        assert!(matches!(
            decide(leader_term(40), &answers),
            Decision::EtcdDown
        ));
    }
}
