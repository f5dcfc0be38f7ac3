//! Commands sent to data servers during a failover and to fence a
//! returning old master. Each operation opens its own short-lived
//! connection (the probe connections stay dedicated to measuring).

use std::time::Duration;

use tokio::time::Instant;

use super::CommandFailed;
use super::machine::PromoteError;
use crate::addr::Addr;
use crate::probe::info::{self, Flavour, InfoSnapshot, Role};
use crate::probe::reboot::Identity;
use crate::resp::{ClientOptions, Connection, RespError, ServerError, frame_int, frame_text};

/// How often a planned switchover's candidate is asked for its role (and,
/// on Redis and Valkey, for an acknowledgement of its offset).
pub const TAKEOVER_POLL: Duration = Duration::from_millis(10);

/// How long a promotion waits for the candidate to report `role:master`
/// after `REPLICAOF NO ONE` answered; also how long a re-point sent beside
/// a Dragonfly promotion is retried while the candidate refuses replicas.
pub const PROMOTE_ROLE_WAIT: Duration = Duration::from_secs(2);

/// Pause between two tries of a re-point sent beside a promotion.
const REPOINT_RETRY: Duration = Duration::from_millis(20);

/// What `SCRIPT KILL` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptKill {
    /// The script was stopped.
    Killed,
    /// Nothing was running any more.
    NotBusy,
    /// The script has written and cannot be stopped.
    Unkillable,
}

/// How to reach instances for administrative commands.
#[derive(Debug, Clone)]
pub struct InstanceOps {
    /// Connection settings (auth, TLS, timeouts).
    pub client: ClientOptions,
    /// Dragonfly: the admin port (commands on it are privileged and are
    /// not paused by `CLIENT PAUSE`).
    pub admin_port: Option<u16>,
}

impl InstanceOps {
    async fn connect(&self, addr: &Addr, flavour: Flavour) -> Result<Connection, RespError> {
        let target = match (flavour, self.admin_port) {
            (Flavour::Dragonfly, Some(p)) => Addr::new(addr.host.clone(), p),
            _ => addr.clone(),
        };
        Connection::connect(&target.to_string(), &self.client).await
    }

    /// Read INFO from `addr`.
    pub async fn info(&self, addr: &Addr) -> Result<InfoSnapshot, RespError> {
        let mut c = Connection::connect(&addr.to_string(), &self.client).await?;
        let text = c.call_text(["INFO"]).await?;
        Ok(info::parse_info(&text))
    }

    /// Wait until `addr` reports `want`, polling INFO, for at most `within`.
    pub async fn wait_role(
        &self,
        addr: &Addr,
        want: Role,
        within: Duration,
    ) -> Result<InfoSnapshot, String> {
        let deadline = Instant::now() + within;
        loop {
            let last = match self.info(addr).await {
                Ok(i) if i.role == want => return Ok(i),
                Ok(i) => format!("reports role {:?}", i.role),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "{addr} did not report role {want:?} within {within:?}: {last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Watch `candidate` closely during a planned switchover until it
    /// reports `role:master`, for at most `within`: `ROLE` every
    /// [`TAKEOVER_POLL`] on one kept connection, so that the new master is
    /// published within milliseconds of the switch rather than at the next
    /// INFO of its probe.
    ///
    /// On Redis and Valkey each round also sends `REPLCONF GETACK *` to the
    /// candidate (on a connection of its own, whose replies are never
    /// read: the server sends none). `FAILOVER` pauses the master's writers
    /// and waits until the replica's acknowledged offset equals the
    /// master's, but while the writers are paused the master asks for no
    /// acknowledgement, so it would wait for the replica's own, which comes
    /// once a second: half a second of write gap on average. Asked, the
    /// replica acknowledges what it has processed at once. The master still
    /// checks the offset itself: nothing is switched before the replica has
    /// every acknowledged write.
    pub async fn watch_takeover(
        &self,
        candidate: &Addr,
        flavour: Flavour,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let nudge = matches!(flavour, Flavour::Redis | Flavour::Valkey);
        let mut conn: Option<Connection> = None;
        let mut nudger: Option<Connection> = None;
        let mut last = String::from("not asked yet");
        loop {
            if nudge {
                if nudger.is_none() {
                    nudger = self.connect(candidate, flavour).await.ok();
                }
                if let Some(n) = nudger.as_mut()
                    && n.send_only(["REPLCONF", "GETACK", "*"]).await.is_err()
                {
                    nudger = None;
                }
            }
            if conn.is_none() {
                match self.connect(candidate, flavour).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => last = e.to_string(),
                }
            }
            if let Some(c) = conn.as_mut() {
                match c.call(["ROLE"]).await {
                    Ok(f) => match info::parse_role(&f) {
                        Ok(info::RoleReply::Master { .. }) => return Ok(()),
                        Ok(other) => last = format!("reports {other:?}"),
                        Err(e) => last = e.to_string(),
                    },
                    Err(e) => {
                        last = e.to_string();
                        if e.is_fatal_to_connection() {
                            conn = None;
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{candidate} did not report role master within {within:?}: {last}"
                ));
            }
            tokio::time::sleep(TAKEOVER_POLL).await;
        }
    }

    /// Promote `addr` (unplanned failover): `REPLICAOF NO ONE`, with
    /// `flush` also `FLUSHALL` and a check that `DBSIZE` is 0, then verify
    /// `role:master`. On Redis/Valkey the promotion and the flush run in
    /// one MULTI/EXEC so that no write can land between them; Dragonfly
    /// refuses FLUSHALL in a transaction, so client writes are paused from
    /// the admin port instead.
    pub async fn promote(
        &self,
        addr: &Addr,
        flavour: Flavour,
        flush: bool,
        chosen: Option<&Identity>,
    ) -> Result<(), PromoteError> {
        let perr = |e: RespError| PromoteError::Promotion(format!("{addr}: {e}"));
        let mut c = self.connect(addr, flavour).await.map_err(perr)?;
        // The process chosen, not one started since at its address (a
        // leader's retries can outlast a restart of the candidate).
        if let Some(chosen) = chosen.filter(|c| c.known()) {
            let why = Self::restarted_since(&mut c, chosen).await.map_err(perr)?;
            if let Some(why) = why {
                return Err(PromoteError::CandidateRestarted(format!("{addr}: {why}")));
            }
        }
        if !flush {
            c.call(["REPLICAOF", "NO", "ONE"]).await.map_err(perr)?;
        } else if flavour == Flavour::Dragonfly {
            let paused = self.admin_port.is_some()
                && c.call(["CLIENT", "PAUSE", "5000", "WRITE"]).await.is_ok();
            let result = async {
                c.call(["REPLICAOF", "NO", "ONE"]).await.map_err(perr)?;
                c.call(["FLUSHALL"])
                    .await
                    .map_err(|e| PromoteError::Flush(format!("{addr}: FLUSHALL: {e}")))?;
                Ok::<(), PromoteError>(())
            }
            .await;
            if paused {
                let _ = c.call(["CLIENT", "UNPAUSE"]).await;
            }
            result?;
        } else {
            // A read-only replica refuses FLUSHALL as soon as it is queued in
            // MULTI (before REPLICAOF NO ONE has run), which would make every
            // flush fail: let it accept writes for the few milliseconds of
            // the transaction. A write landing in that window is flushed by
            // the same EXEC.
            let read_only = match c.call(["CONFIG", "GET", "replica-read-only"]).await {
                Ok(redis_protocol::resp2::types::BytesFrame::Array(kv)) => {
                    kv.get(1).and_then(frame_text).as_deref() != Some("no")
                }
                _ => true,
            };
            if read_only {
                c.call(["CONFIG", "SET", "replica-read-only", "no"])
                    .await
                    .map_err(|e| {
                        PromoteError::Flush(format!(
                            "{addr}: cannot let the replica accept FLUSHALL (CONFIG SET replica-read-only no): {e}"
                        ))
                    })?;
            }
            let result = Self::promote_and_flush_in_multi(&mut c, addr).await;
            if read_only {
                // Only matters once it is a replica again, but an operator
                // expects the setting they made.
                let _ = c.call(["CONFIG", "SET", "replica-read-only", "yes"]).await;
            }
            result?;
        }
        if flush {
            let n = c
                .call(["DBSIZE"])
                .await
                .ok()
                .and_then(|f| frame_int(&f))
                .ok_or_else(|| PromoteError::Flush(format!("{addr}: DBSIZE unreadable")))?;
            if n != 0 {
                return Err(PromoteError::Flush(format!(
                    "{addr}: DBSIZE is {n} after FLUSHALL"
                )));
            }
        }
        self.wait_role(addr, Role::Master, PROMOTE_ROLE_WAIT)
            .await
            .map_err(PromoteError::Promotion)?;
        Ok(())
    }

    /// `MULTI`, `REPLICAOF NO ONE`, `FLUSHALL`, `EXEC` on Redis/Valkey: no
    /// write can land between the promotion and the flush.
    async fn promote_and_flush_in_multi(
        c: &mut Connection,
        addr: &Addr,
    ) -> Result<(), PromoteError> {
        let perr = |e: RespError| PromoteError::Promotion(format!("{addr}: {e}"));
        c.call(["MULTI"]).await.map_err(perr)?;
        c.call(["REPLICAOF", "NO", "ONE"]).await.map_err(perr)?;
        // Inside MULTI a refused command (renamed, ACL) answers an error
        // right away and EXEC then aborts the whole transaction: the
        // replica is not even promoted.
        if let Err(e) = c.call(["FLUSHALL"]).await {
            let _ = c.call(["DISCARD"]).await;
            return Err(PromoteError::Flush(format!("{addr}: FLUSHALL: {e}")));
        }
        match c.call(["EXEC"]).await {
            Ok(redis_protocol::resp2::types::BytesFrame::Array(replies)) => {
                for r in replies {
                    if let redis_protocol::resp2::types::BytesFrame::Error(m) = r {
                        return Err(PromoteError::Flush(format!("{addr}: {m}")));
                    }
                }
                Ok(())
            }
            Ok(other) => Err(PromoteError::Flush(format!(
                "{addr}: EXEC replied {other:?}"
            ))),
            Err(e) => Err(PromoteError::Flush(format!("{addr}: EXEC: {e}"))),
        }
    }

    /// `SCRIPT KILL` on `addr`, which answers `-BUSY`: a script (or
    /// function) that has not written can be stopped; one that has
    /// written cannot (`-UNKILLABLE`), and one that ended meanwhile
    /// answers `-NOTBUSY`. On the probe's own connection would not do: it
    /// waits for its PING.
    pub async fn script_kill(&self, addr: &Addr) -> Result<ScriptKill, RespError> {
        let mut c = Connection::connect(&addr.to_string(), &self.client).await?;
        match c.call(["SCRIPT", "KILL"]).await {
            Ok(_) => Ok(ScriptKill::Killed),
            Err(RespError::Server(e)) if e.message().starts_with("NOTBUSY") => {
                Ok(ScriptKill::NotBusy)
            }
            Err(RespError::Server(e)) if e.message().starts_with("UNKILLABLE") => {
                Ok(ScriptKill::Unkillable)
            }
            Err(e) => Err(e),
        }
    }

    /// `CLIENT PAUSE <for> ALL` on `addr` (Redis, Valkey): nobody is served
    /// until it ends, a replica's replication handshake included, so no
    /// replica takes a full copy of a server that restarted empty while
    /// the quorum decides. Everything sent to it meanwhile waits, picket's
    /// own commands too: the pause cannot be lifted early.
    pub async fn pause_all(&self, addr: &Addr, duration: Duration) -> Result<(), RespError> {
        let mut c = Connection::connect(&addr.to_string(), &self.client).await?;
        let ms = duration.as_millis().to_string();
        c.call(["CLIENT", "PAUSE", ms.as_str(), "ALL"]).await?;
        Ok(())
    }

    /// Set back the replication settings a sync hold changed on `addr`
    /// (`probe::hold`: Redis and Valkey only, on the data port).
    pub async fn release_sync_hold(
        &self,
        addr: &Addr,
        restore: &[(String, String)],
    ) -> Result<(), RespError> {
        let mut c = Connection::connect(&addr.to_string(), &self.client).await?;
        let t = self.client.command_timeout;
        crate::probe::hold::release(&mut c, restore, t).await
    }

    /// `REPLICAOF master` on `replica`.
    pub async fn repoint(
        &self,
        replica: &Addr,
        flavour: Flavour,
        master: &Addr,
    ) -> Result<(), RespError> {
        let mut c = self.connect(replica, flavour).await?;
        let port = match (flavour, self.admin_port) {
            // Dragonfly replicates over the admin port when one is used.
            (Flavour::Dragonfly, Some(p)) => p,
            _ => master.port,
        };
        c.call(["REPLICAOF", master.host.as_str(), &port.to_string()])
            .await?;
        Ok(())
    }

    /// [`InstanceOps::repoint`], tried again every [`REPOINT_RETRY`] for
    /// `retry_for` while the replica answers with an error (a re-point sent
    /// beside a Dragonfly promotion that overtook it: the candidate still
    /// refuses replicas, `ReplConf`'s "Replicating a replica is
    /// unsupported", which the replica reports as "could not greet master"
    /// and leaves its replication as it was). A failure to reach the
    /// replica is not retried.
    pub async fn repoint_retrying(
        &self,
        replica: &Addr,
        flavour: Flavour,
        master: &Addr,
        retry_for: Duration,
        master_chosen: Option<&Identity>,
    ) -> Result<(), CommandFailed> {
        // Sent beside a promotion, before the new master answered: the
        // process chosen, not an empty one started since at its address,
        // which the replica would copy.
        if let Some(chosen) = master_chosen.filter(|c| c.known()) {
            let mut c = self.connect(master, flavour).await?;
            if let Some(why) = Self::restarted_since(&mut c, chosen).await? {
                return Err(CommandFailed(format!(
                    "{replica} not re-pointed: {master} restarted since it was chosen ({why})"
                )));
            }
        }
        let until = Instant::now() + retry_for;
        loop {
            match self.repoint(replica, flavour, master).await {
                Err(RespError::Server(e)) if Instant::now() + REPOINT_RETRY < until => {
                    tracing::debug!(%replica, %master, error = %e, "re-point beside the promotion refused; trying again");
                    tokio::time::sleep(REPOINT_RETRY).await;
                }
                r => return r.map_err(CommandFailed::from),
            }
        }
    }

    /// Why the server on `c` is no longer the process `chosen`, if it is
    /// not.
    async fn restarted_since(
        c: &mut Connection,
        chosen: &Identity,
    ) -> Result<Option<String>, RespError> {
        let text = c.call_text(["INFO", "server"]).await?;
        Ok(chosen.changed(&Identity::of(&info::parse_info(&text))))
    }

    /// Fence a returning old master: make it a replica of `master`, then
    /// disconnect its clients so that none keeps writing to it (Redis and
    /// Valkey: `CLIENT KILL TYPE normal` and `pubsub`; Dragonfly has no
    /// TYPE filter: `CLIENT KILL LADDR`, which also closes our connection).
    pub async fn demote(
        &self,
        addr: &Addr,
        flavour: Flavour,
        master: &Addr,
    ) -> Result<(), RespError> {
        self.repoint(addr, flavour, master).await?;
        let mut c = self.connect(addr, flavour).await?;
        match flavour {
            Flavour::Dragonfly => {
                // No reply comes back: the sending connection is closed too.
                c.send_only(["CLIENT", "KILL", "LADDR", &addr.to_string()])
                    .await?;
            }
            Flavour::Redis | Flavour::Valkey => {
                for t in ["normal", "pubsub"] {
                    match c.call(["CLIENT", "KILL", "TYPE", t]).await {
                        Ok(_) | Err(RespError::Server(ServerError::Other(_))) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Read `min-replicas-to-write` and `min-replicas-max-lag` (seconds)
    /// of `addr` (Redis, Valkey; Dragonfly has neither and gets an error).
    async fn read_min_replicas(c: &mut Connection, addr: &Addr) -> Result<(u32, u64), RespError> {
        let mut values = [0u64; 2];
        for (i, name) in ["min-replicas-to-write", "min-replicas-max-lag"]
            .iter()
            .enumerate()
        {
            let reply = c.call(["CONFIG", "GET", name]).await?;
            values[i] = match &reply {
                redis_protocol::resp2::types::BytesFrame::Array(kv) => kv
                    .get(1)
                    .and_then(frame_int)
                    .and_then(|v| u64::try_from(v).ok()),
                _ => None,
            }
            .ok_or_else(|| {
                RespError::Unexpected(format!(
                    "{addr}: CONFIG GET {name} replied {reply:?} (no such setting: not Redis or Valkey?)"
                ))
            })?;
        }
        let to_write = u32::try_from(values[0]).map_err(|_| {
            RespError::Unexpected(format!("{addr}: min-replicas-to-write {}", values[0]))
        })?;
        Ok((to_write, values[1]))
    }

    /// Make `min-replicas-to-write` of `addr` `to_write` and, when
    /// `max_lag` is given, `min-replicas-max-lag` that many seconds; only
    /// what differs is set, and a threshold found above `to_write` but no
    /// higher than `keep` is left as it is (raised by another daemon: see
    /// `FenceState::found`). Returns the values found before.
    ///
    /// The lag is set before the threshold, so that a raised threshold
    /// never applies with another lag than the one configured.
    pub async fn set_min_replicas(
        &self,
        addr: &Addr,
        to_write: u32,
        max_lag: Option<u64>,
        keep: u32,
    ) -> Result<(u32, u64), RespError> {
        let mut c = Connection::connect(&addr.to_string(), &self.client).await?;
        let before = Self::read_min_replicas(&mut c, addr).await?;
        if let Some(lag) = max_lag
            && before.1 != lag
        {
            c.call(["CONFIG", "SET", "min-replicas-max-lag", &lag.to_string()])
                .await?;
        }
        if before.0 != to_write && !threshold_kept(before.0, to_write, keep) {
            c.call([
                "CONFIG",
                "SET",
                "min-replicas-to-write",
                &to_write.to_string(),
            ])
            .await?;
        }
        Ok(before)
    }

    /// Planned switchover from `old_master` to `candidate`, which the
    /// master lists among its replicas as `listed_as` (an IP when the
    /// candidate is known by name). Redis/Valkey:
    /// `FAILOVER TO host port TIMEOUT ms` on the master (it pauses writes,
    /// waits for the replica to catch up and demotes itself first).
    /// Dragonfly: `REPLTAKEOVER secs` on the replica, with a client timeout
    /// longer than `secs`. On timeout the old master must serve again.
    /// With `history` (Redis/Valkey), the master is first read to be
    /// still in it ([`check_switchover_source`]).
    pub async fn switchover(
        &self,
        old_master: &Addr,
        old_flavour: Flavour,
        candidate: &Addr,
        listed_as: &Addr,
        timeout: Duration,
        history: Option<&str>,
    ) -> Result<(), PromoteError> {
        let perr = |e: String| PromoteError::Promotion(e);
        match old_flavour {
            Flavour::Dragonfly => {
                let secs = timeout.as_secs().max(1);
                let mut c = self
                    .connect(candidate, Flavour::Dragonfly)
                    .await
                    .map_err(|e| perr(format!("{candidate}: {e}")))?;
                let reply = c
                    .call_timeout(
                        ["REPLTAKEOVER", &secs.to_string()],
                        Duration::from_secs(secs + 5),
                    )
                    .await;
                match reply {
                    Ok(_) => {
                        self.watch_takeover(candidate, Flavour::Dragonfly, Duration::from_secs(2))
                            .await
                            .map_err(perr)?;
                        Ok(())
                    }
                    Err(e) => {
                        // The takeover failed: the old master unlocks and
                        // serves again; confirm it before giving up.
                        let back = self
                            .wait_role(old_master, Role::Master, Duration::from_secs(secs + 2))
                            .await;
                        Err(PromoteError::SwitchoverTimedOut(format!(
                            "REPLTAKEOVER on {candidate}: {e}; old master {}",
                            match back {
                                Ok(_) => "serves again".to_string(),
                                Err(w) => w,
                            }
                        )))
                    }
                }
            }
            Flavour::Redis | Flavour::Valkey => {
                let ms = timeout.as_millis().max(100).to_string();
                let mut c = self
                    .connect(old_master, old_flavour)
                    .await
                    .map_err(|e| perr(format!("{old_master}: {e}")))?;
                if let Some(history) = history {
                    // On the connection the command goes on: nothing but
                    // this daemon's next command comes between.
                    let text = c
                        .call_text(["INFO", "replication"])
                        .await
                        .map_err(|e| perr(format!("INFO on {old_master}: {e}")))?;
                    check_switchover_source(old_master, &info::parse_info(&text), history)?;
                }
                c.call([
                    "FAILOVER",
                    "TO",
                    listed_as.host.as_str(),
                    &listed_as.port.to_string(),
                    "TIMEOUT",
                    &ms,
                ])
                .await
                .map_err(|e| {
                    PromoteError::from_failover_refusal(format!("FAILOVER on {old_master}: {e}"))
                })?;
                match self
                    .watch_takeover(candidate, old_flavour, timeout + Duration::from_secs(1))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let back = self
                            .wait_role(old_master, Role::Master, Duration::from_secs(2))
                            .await;
                        Err(PromoteError::SwitchoverTimedOut(format!(
                            "{e}; old master {}",
                            match back {
                                Ok(_) => "serves again".to_string(),
                                Err(w) => w,
                            }
                        )))
                    }
                }
            }
        }
    }
}

/// Whether a `min-replicas-to-write` of `found` is left in place when
/// `to_write` is wanted and up to `keep` would be justified: found above
/// what is wanted but no higher than `keep` (raised by another daemon;
/// `FenceState::found`).
pub fn threshold_kept(found: u32, to_write: u32, keep: u32) -> bool {
    found > to_write && found <= keep
}

/// Whether a switchover's `FAILOVER` may go to `old_master`, read as
/// `now`: still a master, and in the history (`master_replid`) it had when
/// the failover began. Redis and Valkey draw a new replication id at every
/// promotion and restart, so another one means the server was handed over
/// and promoted back, or restarted, since: a command retried then, by a
/// leader that did not hear of it, would hand the group over to a replica
/// chosen for another state of it (the simulation with switchovers and the
/// network's faults, seed 6131: after two newer switchovers, the stale
/// retry handed the newer master's group over to the first candidate).
pub fn check_switchover_source(
    old_master: &Addr,
    now: &InfoSnapshot,
    history: &str,
) -> Result<(), PromoteError> {
    if now.role == Role::Replica {
        return Err(PromoteError::OldMasterNotMaster(format!(
            "{old_master} reports role:slave"
        )));
    }
    match now.replid.as_deref() {
        Some(id) if id != history => Err(PromoteError::OldMasterNotMaster(format!(
            "{old_master} is in another history since the switchover began \
             (master_replid {history} -> {id}): handed over and back, or restarted"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real servers' `INFO` (Redis 7.0): the master as read when a
    /// switchover began, and its replica.
    const MASTER: &str = include_str!("../probe/testdata/redis7_master.txt");
    const REPLICA: &str = include_str!("../probe/testdata/redis7_replica.txt");
    const HISTORY: &str = "7a750eab7bf8c53558539eeccf9e208bfec638af";

    #[test]
    fn a_switchover_goes_only_to_a_master_still_in_its_history() {
        let a = Addr::new("10.0.0.1", 6379);
        assert_eq!(
            check_switchover_source(&a, &info::parse_info(MASTER), HISTORY),
            Ok(())
        );
        // Promoted again since (handed over and back, or restarted): Redis
        // drew another replication id.
        let again = MASTER.replace(HISTORY, "0123456789abcdef0123456789abcdef01234567");
        let e = check_switchover_source(&a, &info::parse_info(&again), HISTORY);
        assert!(
            matches!(&e, Err(PromoteError::OldMasterNotMaster(m)) if m.contains("another history")),
            "{e:?}"
        );
        // A replica now, in the same history (handed over): refused too.
        let e = check_switchover_source(&a, &info::parse_info(REPLICA), HISTORY);
        assert!(
            matches!(&e, Err(PromoteError::OldMasterNotMaster(m)) if m.contains("role:slave")),
            "{e:?}"
        );
        // A reply without the field leaves the decision to the server.
        let none = MASTER.replace(&format!("master_replid:{HISTORY}"), "");
        assert_eq!(
            check_switchover_source(&a, &info::parse_info(&none), HISTORY),
            Ok(())
        );
    }
}
