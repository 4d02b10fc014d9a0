//! etcd's v3 gRPC API (Lease, Election, KV), through clients generated from the subset
//! of its protocol in `proto/etcd/` (see ARCHITECTURE.md, Dependencies: why not the
//! `etcd-client` crate).

use super::StandbyError;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tracing::{info, warn};

/// The generated etcd protocol.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    /// etcd's key-value record.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// KV and Lease.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// Election.
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

use pb::etcdserverpb::{kv_client::KvClient, lease_client::LeaseClient};
use pb::v3electionpb::election_client::ElectionClient;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tonic::{Code, Status};

/// How long one request to etcd may take (a campaign waits for leadership as long as
/// it takes).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to an etcd cluster: to one member at a time, moving to the next when
/// it is unreachable or does not answer (tonic's balancing kept sending some calls to
/// a dead member, long enough for a lease to lapse).
#[derive(Clone)]
pub struct Etcd {
    members: Arc<[Channel]>,
    /// The index of the member used now.
    current: Arc<AtomicUsize>,
}

/// Whether a call failed for want of that member (down, cut off from its cluster's
/// quorum, too slow), so that another may answer it.
fn member_failed(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
}

impl Etcd {
    /// A client for the members at `endpoints` (`http://host:port`, or `https://`
    /// with `tls`); connects lazily.
    pub fn new(endpoints: &[String], tls: Option<ClientTlsConfig>) -> Result<Etcd, StandbyError> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let members = endpoints
            .iter()
            .map(|url| {
                let bad = |why: String| StandbyError::EtcdUrl {
                    url: url.clone(),
                    why,
                };
                if !url.starts_with(&format!("{scheme}://")) {
                    return Err(bad(format!(
                        "must be a URL such as {scheme}://127.0.0.1:2379 (https:// with \
                         --etcd-ca, http:// without)"
                    )));
                }
                let endpoint = Endpoint::from_shared(url.clone())
                    .map_err(|e| bad(format!("not a URL ({e})")))?;
                let endpoint = match &tls {
                    Some(tls) => endpoint
                        .tls_config(tls.clone())
                        .map_err(|e| bad(format!("TLS: {}", crate::tls::error_chain(&e))))?,
                    None => endpoint,
                };
                Ok(endpoint.connect_timeout(REQUEST_TIMEOUT).connect_lazy())
            })
            .collect::<Result<Arc<[Channel]>, _>>()?;
        if members.is_empty() {
            return Err(StandbyError::NoEtcd);
        }
        Ok(Etcd {
            members,
            current: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The member used now, and its index.
    fn member(&self) -> (usize, Channel) {
        let index = self.current.load(Ordering::Relaxed) % self.members.len();
        (index, self.members[index].clone())
    }

    /// Member `index` failed a call: use the next (unless another call moved on
    /// already).
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.members.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// `call` on the member used now, then on each other member while it fails for want
    /// of that member, each try within [`REQUEST_TIMEOUT`]; the last failure if none
    /// answers.
    async fn call<T, F>(&self, call: impl Fn(Channel) -> F) -> Result<T, Status>
    where
        F: Future<Output = Result<T, Status>>,
    {
        let mut failure = Status::unavailable("no etcd member");
        for _ in 0..self.members.len() {
            let (index, channel) = self.member();
            failure = match tokio::time::timeout(REQUEST_TIMEOUT, call(channel)).await {
                Ok(Err(status)) if member_failed(&status) => status,
                Ok(answered) => return answered,
                Err(_) => Status::deadline_exceeded("etcd does not answer"),
            };
            self.move_on(index);
        }
        Err(failure)
    }

    /// A lease of `ttl`, asked for until etcd answers (saying once that it does not).
    pub async fn grant_retrying(&self, ttl: Duration) -> i64 {
        let mut said = false;
        loop {
            let request = pb::etcdserverpb::LeaseGrantRequest {
                ttl: ttl.as_secs().max(1) as i64,
                id: 0,
            };
            let granted = self
                .call(|channel| async move { LeaseClient::new(channel).lease_grant(request).await })
                .await;
            match granted {
                Ok(reply) if reply.get_ref().error.is_empty() => return reply.get_ref().id,
                Ok(reply) => warn!("etcd refused a lease: {}", reply.get_ref().error),
                Err(status) if !said => {
                    warn!("cannot reach etcd ({}); retrying", status.message())
                }
                Err(_) => {}
            }
            said = true;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Keeps `lease` alive, a keep-alive every third of `ttl`, calling `answered` after
    /// each with the instant until which etcd's answer makes it valid (`None`: etcd did
    /// not answer). Returns only when etcd says the lease is gone (it expired there);
    /// says when etcd stops and starts answering.
    pub async fn keep_alive(
        &self,
        lease: i64,
        ttl: Duration,
        answered: impl Fn(Option<Instant>),
    ) -> StandbyError {
        let renew = || async {
            let request = pb::etcdserverpb::LeaseKeepAliveRequest { id: lease };
            self.call(|channel| async move {
                let mut replies = LeaseClient::new(channel)
                    .lease_keep_alive(tokio_stream::once(request))
                    .await?
                    .into_inner();
                replies.message().await
            })
            .await
        };
        keep_lease_alive(lease, ttl, renew, answered).await
    }

    /// Campaigns in `election` with `lease`, proclaiming `value`, until elected (a
    /// campaign that fails, e.g. while etcd is down, is started again, on the next
    /// member if that one failed); returns the leadership key (its `rev`, the revision
    /// that created it, is the term).
    pub async fn campaign(
        &self,
        election: &str,
        lease: i64,
        value: &str,
    ) -> pb::v3electionpb::LeaderKey {
        let mut said = false;
        loop {
            let request = pb::v3electionpb::CampaignRequest {
                name: election.as_bytes().to_vec(),
                lease,
                value: value.as_bytes().to_vec(),
            };
            let (index, channel) = self.member();
            match ElectionClient::new(channel).campaign(request).await {
                Ok(reply) => match reply.into_inner().leader {
                    Some(leader) => return leader,
                    None => warn!("etcd elected this controller but named no leadership key"),
                },
                Err(status) => {
                    if member_failed(&status) {
                        self.move_on(index);
                    }
                    if !said {
                        warn!(
                            "campaigning in etcd failed ({}); retrying",
                            status.message()
                        );
                        said = true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The leader of `election`: the value it proclaimed and its term, the revision
    /// that created its key (`None`: no leader).
    pub async fn leader(&self, election: &str) -> Result<Option<crate::global::Leader>, Status> {
        let request = pb::v3electionpb::LeaderRequest {
            name: election.as_bytes().to_vec(),
        };
        let reply = self
            .call(|channel| {
                let request = request.clone();
                async move { ElectionClient::new(channel).leader(request).await }
            })
            .await;
        match reply {
            Ok(reply) => Ok(reply.into_inner().kv.map(|kv| crate::global::Leader {
                url: String::from_utf8_lossy(&kv.value).into_owned(),
                term: kv.create_revision as u64,
                generation: None,
            })),
            // etcd's `ErrElectionNoLeader`, sent with code Unknown.
            Err(status) if status.message() == "election: no leader" => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Every key-value under `prefix`, in key order.
    pub async fn range_prefix(&self, prefix: &str) -> Result<Vec<pb::mvccpb::KeyValue>, Status> {
        self.range(prefix, prefix_end(prefix.as_bytes())).await
    }

    /// The value of `key`, if set.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Status> {
        let found = self.range(key, Vec::new()).await?;
        Ok(found.into_iter().next().map(|kv| kv.value))
    }

    /// The key-values from `key` up to `range_end` (empty: `key` alone).
    async fn range(
        &self,
        key: &str,
        range_end: Vec<u8>,
    ) -> Result<Vec<pb::mvccpb::KeyValue>, Status> {
        let request = pb::etcdserverpb::RangeRequest {
            key: key.as_bytes().to_vec(),
            range_end,
            ..Default::default()
        };
        self.call(|channel| {
            let request = request.clone();
            async move { KvClient::new(channel).range(request).await }
        })
        .await
        .map(|reply| reply.into_inner().kvs)
    }

    /// Puts `key` = `value` if `guard`'s creation revision is still `revision` (the
    /// leadership key of this term); `Ok(false)` if it is not.
    pub async fn put_guarded(
        &self,
        guard: &[u8],
        revision: i64,
        key: &str,
        value: Vec<u8>,
    ) -> Result<bool, Status> {
        self.txn_guarded(guard, revision, vec![put(key, value)])
            .await
    }

    /// Applies `operations` in one transaction if `guard`'s creation revision is still
    /// `revision`; `Ok(false)` if it is not.
    pub async fn txn_guarded(
        &self,
        guard: &[u8],
        revision: i64,
        operations: Vec<pb::etcdserverpb::RequestOp>,
    ) -> Result<bool, Status> {
        use pb::etcdserverpb::{compare, Compare, TxnRequest};
        let request = TxnRequest {
            compare: vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Create as i32,
                key: guard.to_vec(),
                target_union: Some(compare::TargetUnion::CreateRevision(revision)),
                range_end: Vec::new(),
            }],
            success: operations,
            failure: Vec::new(),
        };
        self.call(|channel| {
            let request = request.clone();
            async move { KvClient::new(channel).txn(request).await }
        })
        .await
        .map(|reply| reply.into_inner().succeeded)
    }
}

/// etcd's answer to one keep-alive: the lease's remaining TTL, or no answer.
type KeepAliveAnswer = Result<Option<pb::etcdserverpb::LeaseKeepAliveResponse>, Status>;

/// [`Etcd::keep_alive`]'s loop, `renew` sending one keep-alive. The lease is valid for
/// the TTL etcd answers from when the keep-alive was *sent* (a slow answer only
/// shortens it), and the next is sent a third of `ttl` after the last was.
async fn keep_lease_alive<F>(
    lease: i64,
    ttl: Duration,
    renew: impl Fn() -> F,
    answered: impl Fn(Option<Instant>),
) -> StandbyError
where
    F: Future<Output = KeepAliveAnswer>,
{
    let mut unreachable = false;
    loop {
        let sent = Instant::now();
        match renew().await {
            Ok(Some(reply)) if reply.ttl > 0 => {
                if unreachable {
                    info!("etcd answers again");
                    unreachable = false;
                }
                answered(Some(sent + Duration::from_secs(reply.ttl as u64)));
            }
            Ok(Some(_)) => return StandbyError::LeaseExpired(lease),
            failed => {
                answered(None);
                if !unreachable {
                    let why = match failed {
                        Err(status) => status.message().to_string(),
                        _ => "no answer".to_string(),
                    };
                    warn!("cannot renew the lease: etcd unreachable ({why}); if it is down, no other global controller can be elected meanwhile");
                    unreachable = true;
                }
            }
        }
        tokio::time::sleep_until(sent + ttl / 3).await;
    }
}

/// A put of `key` = `value`, for [`Etcd::txn_guarded`].
pub fn put(key: &str, value: Vec<u8>) -> pb::etcdserverpb::RequestOp {
    use pb::etcdserverpb::{request_op::Request, PutRequest, RequestOp};
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            lease: 0,
        })),
    }
}

/// Deleting the keys from `key` up to (not including) `range_end`, for
/// [`Etcd::txn_guarded`].
pub fn delete_range(key: &str, range_end: Vec<u8>) -> pb::etcdserverpb::RequestOp {
    use pb::etcdserverpb::{request_op::Request, DeleteRangeRequest, RequestOp};
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end,
            prev_kv: false,
        })),
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `clientv3.GetPrefixRangeEnd`):
/// the prefix with its last byte below 0xff incremented.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::super::{Leader, Leadership, Role};
    use super::{keep_lease_alive, pb, prefix_end, Etcd, KeepAliveAnswer, StandbyError};
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::time::Instant;
    use tonic::transport::ClientTlsConfig;
    use tonic::Status;

    /// etcd's answer to a keep-alive: the TTL left to the lease, in seconds (0: gone).
    fn alive(ttl: i64) -> KeepAliveAnswer {
        Ok(Some(pb::etcdserverpb::LeaseKeepAliveResponse {
            ttl,
            ..Default::default()
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_is_valid_a_ttl_after_each_keep_alive_sent_until_etcd_says_it_is_gone() {
        let ttl = Duration::from_secs(9);
        let ms = Duration::from_millis(1);
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        // Each keep-alive's answer, and how long it takes.
        let script = Mutex::new(VecDeque::from([
            (Duration::from_secs(1), alive(9)),
            (Duration::ZERO, alive(9)),
            (Duration::ZERO, Err(Status::unavailable("etcd is down"))),
            (Duration::ZERO, Err(Status::unavailable("etcd is down"))),
            (Duration::ZERO, alive(0)),
        ]));
        let sent = Mutex::new(Vec::new());
        let renew = || {
            sent.lock().unwrap().push(Instant::now());
            let (delay, answer) = script.lock().unwrap().pop_front().expect("a keep-alive");
            async move {
                tokio::time::sleep(delay).await;
                answer
            }
        };
        let leadership = Leadership::default();
        leadership.set(Role::Leader(Leader {
            url: "https://g1:50051".into(),
            term: 42,
            generation: None,
        }));
        let renewals = Mutex::new(Vec::new());
        let answered = |until| {
            renewals.lock().unwrap().push(until);
            leadership.keep_alive_answered(until);
        };
        // The second keep-alive (at 3 s) made it valid until 12 s; etcd answers no
        // other until it says the lease is gone.
        let lapses = async {
            tokio::time::sleep_until(at(12) - ms).await;
            assert_eq!(leadership.status().lease_valid, Some(true));
            tokio::time::sleep_until(at(12)).await;
            let status = leadership.status();
            assert_eq!(
                (
                    status.lease_valid,
                    status.controlling,
                    status.etcd_reachable
                ),
                (Some(false), false, Some(false))
            );
        };
        let (gone, ()) = tokio::join!(keep_lease_alive(7, ttl, renew, answered), lapses);
        assert!(matches!(gone, StandbyError::LeaseExpired(7)), "{gone}");
        // A keep-alive every third of the TTL, whatever the answers; the slow first
        // answer counts from when it was sent (valid until 9 s, not 10 s).
        assert_eq!(*sent.lock().unwrap(), [at(0), at(3), at(6), at(9), at(12)]);
        assert_eq!(
            *renewals.lock().unwrap(),
            [Some(at(9)), Some(at(12)), None, None]
        );
    }

    #[tokio::test]
    async fn the_urls_scheme_must_match_whether_tls_is_given() {
        let plain = Etcd::new(&["https://127.0.0.1:2379".into()], None).err();
        assert!(plain.is_some_and(|e| e.to_string().contains("http://127.0.0.1:2379")));
        let tls = Some(ClientTlsConfig::new());
        let secure = Etcd::new(&["http://127.0.0.1:2379".into()], tls.clone()).err();
        let secure = secure.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            secure.contains("https://") && secure.contains("--etcd-ca"),
            "{secure}"
        );
        assert!(Etcd::new(&["https://127.0.0.1:2379".into()], tls).is_ok());
        assert!(Etcd::new(&[], None).is_err());
    }

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"/padll/changes/"), b"/padll/changes0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
