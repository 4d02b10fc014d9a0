//! etcd's v3 gRPC API (Lease, Election, KV), through clients generated from the subset
//! of its protocol in `proto/etcd/` (see ARCHITECTURE.md, Dependencies: why not the
//! `etcd-client` crate).

use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};
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

/// How long one request to etcd may take (a campaign waits for leadership as long as
/// it takes).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to an etcd cluster (any of its members).
#[derive(Clone)]
pub struct Etcd {
    channel: Channel,
}

impl Etcd {
    /// A client for the members at `endpoints` (`http://host:port`); connects lazily,
    /// balancing over them.
    pub fn new(endpoints: &[String]) -> Result<Etcd, String> {
        let endpoints = endpoints
            .iter()
            .map(|url| {
                if !url.starts_with("http://") {
                    return Err(format!(
                        "--etcd '{url}' must be a URL such as http://127.0.0.1:2379"
                    ));
                }
                Endpoint::from_shared(url.clone())
                    .map(|e| e.connect_timeout(REQUEST_TIMEOUT))
                    .map_err(|e| format!("--etcd '{url}': not a URL ({e})"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Etcd {
            channel: Channel::balance_list(endpoints.into_iter()),
        })
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel.clone())
    }

    /// A lease of `ttl`, asked for until etcd answers (saying once that it does not).
    pub async fn grant_retrying(&self, ttl: Duration) -> i64 {
        let mut said = false;
        loop {
            let request = pb::etcdserverpb::LeaseGrantRequest {
                ttl: ttl.as_secs().max(1) as i64,
                id: 0,
            };
            let granted = tokio::time::timeout(
                REQUEST_TIMEOUT,
                LeaseClient::new(self.channel.clone()).lease_grant(request),
            )
            .await;
            match granted {
                Ok(Ok(reply)) if reply.get_ref().error.is_empty() => return reply.get_ref().id,
                Ok(Ok(reply)) => warn!("etcd refused a lease: {}", reply.get_ref().error),
                Ok(Err(status)) if !said => {
                    warn!("cannot reach etcd ({}); retrying", status.message())
                }
                Err(_) if !said => warn!("etcd does not answer; retrying"),
                _ => {}
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
    ) -> String {
        let mut unreachable = false;
        loop {
            let sent = Instant::now();
            let request = pb::etcdserverpb::LeaseKeepAliveRequest { id: lease };
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let mut replies = LeaseClient::new(self.channel.clone())
                    .lease_keep_alive(tokio_stream::once(request))
                    .await?
                    .into_inner();
                replies.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(reply))) if reply.ttl > 0 => {
                    if unreachable {
                        info!("etcd answers again");
                        unreachable = false;
                    }
                    answered(Some(sent + Duration::from_secs(reply.ttl as u64)));
                }
                Ok(Ok(Some(_))) => {
                    return format!(
                        "etcd says lease {lease:x} has expired: another global controller may lead now; exiting to start again as a standby"
                    )
                }
                failed => {
                    answered(None);
                    if !unreachable {
                        let why = match failed {
                            Ok(Err(status)) => status.message().to_string(),
                            _ => "no answer".to_string(),
                        };
                        warn!("cannot renew the lease: etcd unreachable ({why}); if it is down, no other global controller can be elected meanwhile");
                        unreachable = true;
                    }
                }
            }
            tokio::time::sleep_until((sent + ttl / 3).into()).await;
        }
    }

    /// Campaigns in `election` with `lease`, proclaiming `value`, until elected (a
    /// campaign that fails, e.g. while etcd is down, is started again); returns the
    /// leadership key (its `rev`, the revision that created it, is the term).
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
            match ElectionClient::new(self.channel.clone())
                .campaign(request)
                .await
            {
                Ok(reply) => match reply.into_inner().leader {
                    Some(leader) => return leader,
                    None => warn!("etcd elected this controller but named no leadership key"),
                },
                Err(status) if !said => {
                    warn!(
                        "campaigning in etcd failed ({}); retrying",
                        status.message()
                    );
                    said = true;
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The leader of `election`: the value it proclaimed and its term, the revision
    /// that created its key (`None`: no leader).
    pub async fn leader(&self, election: &str) -> Result<Option<super::Leader>, tonic::Status> {
        let request = pb::v3electionpb::LeaderRequest {
            name: election.as_bytes().to_vec(),
        };
        let reply = tokio::time::timeout(
            REQUEST_TIMEOUT,
            ElectionClient::new(self.channel.clone()).leader(request),
        )
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("etcd does not answer"));
        match reply? {
            Ok(reply) => Ok(reply.into_inner().kv.map(|kv| super::Leader {
                url: String::from_utf8_lossy(&kv.value).into_owned(),
                term: kv.create_revision as u64,
            })),
            // etcd's `ErrElectionNoLeader`, sent with code Unknown.
            Err(status) if status.message() == "election: no leader" => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Every key-value under `prefix`, in key order.
    pub async fn range_prefix(&self, prefix: &str) -> Result<Vec<pb::mvccpb::KeyValue>, String> {
        self.range(prefix, prefix_end(prefix.as_bytes())).await
    }

    /// The value of `key`, if set.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let found = self.range(key, Vec::new()).await?;
        Ok(found.into_iter().next().map(|kv| kv.value))
    }

    /// The key-values from `key` up to `range_end` (empty: `key` alone).
    async fn range(
        &self,
        key: &str,
        range_end: Vec<u8>,
    ) -> Result<Vec<pb::mvccpb::KeyValue>, String> {
        let request = pb::etcdserverpb::RangeRequest {
            key: key.as_bytes().to_vec(),
            range_end,
            ..Default::default()
        };
        tokio::time::timeout(REQUEST_TIMEOUT, self.kv().range(request))
            .await
            .map_err(|_| "etcd does not answer".to_string())?
            .map(|reply| reply.into_inner().kvs)
            .map_err(|s| s.message().to_string())
    }

    /// Puts `key` = `value` if `guard`'s creation revision is still `revision` (the
    /// leadership key of this term); `Ok(false)` if it is not.
    pub async fn put_guarded(
        &self,
        guard: &[u8],
        revision: i64,
        key: &str,
        value: Vec<u8>,
    ) -> Result<bool, String> {
        use pb::etcdserverpb::{compare, request_op, Compare, PutRequest, RequestOp, TxnRequest};
        let request = TxnRequest {
            compare: vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Create as i32,
                key: guard.to_vec(),
                target_union: Some(compare::TargetUnion::CreateRevision(revision)),
                range_end: Vec::new(),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value,
                    lease: 0,
                })),
            }],
            failure: Vec::new(),
        };
        tokio::time::timeout(REQUEST_TIMEOUT, self.kv().txn(request))
            .await
            .map_err(|_| "etcd does not answer".to_string())?
            .map(|reply| reply.into_inner().succeeded)
            .map_err(|s| s.message().to_string())
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
    use super::prefix_end;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"/padll/changes/"), b"/padll/changes0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
