//! Replica acknowledgement: after a decision that charged, `WAIT` until
//! enough replicas hold the charge, so a primary's death cannot lose it.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Cmd;
use tollgate_limiter::StoreError;

use crate::error::{from_redis, RedisStoreError};

/// How many replicas must acknowledge a charge, and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl ReplicaAck {
    /// At least one replica, a timeout Redis can express (`WAIT 0` would
    /// wait forever) and that leaves the decision's own call time within
    /// its deadline.
    pub(crate) fn check(&self, deadline: Duration) -> Result<(), StoreError> {
        let problem = if self.replicas == 0 {
            Some("replicas must be at least 1 (0 would wait for nothing)".to_string())
        } else if self.timeout < Duration::from_millis(1) {
            Some("timeout must be at least 1 ms (WAIT 0 waits forever)".to_string())
        } else if self.timeout >= deadline {
            Some(format!(
                "timeout {:?} must be shorter than the deadline {deadline:?}, which bounds the decision and its WAIT together",
                self.timeout
            ))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(RedisStoreError::InvalidReplicaAck(problem).into()),
            None => Ok(()),
        }
    }

    /// `WAIT` on the connection the charge went through: Redis waits for
    /// everything that connection wrote, so the charge is covered.
    pub(crate) async fn wait<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
    ) -> Result<(), StoreError> {
        let acknowledged: u64 = self.command().query_async(con).await.map_err(from_redis)?;
        self.judge(acknowledged)
    }

    /// `WAIT <replicas> <timeout ms>`, for a store that routes it itself
    /// (the Cluster: to the master that took the charge).
    pub(crate) fn command(&self) -> Cmd {
        let millis = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(millis);
        cmd
    }

    /// `WAIT`'s answer: enough replicas, or the decision fails.
    pub(crate) fn judge(&self, acknowledged: u64) -> Result<(), StoreError> {
        if acknowledged < u64::from(self.replicas) {
            return Err(RedisStoreError::NotReplicated {
                acknowledged,
                wanted: self.replicas,
                timeout: self.timeout,
            }
            .into());
        }
        Ok(())
    }
}
