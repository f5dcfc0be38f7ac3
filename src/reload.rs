//! Reloading the configuration on SIGHUP (`systemctl reload picket`).
//!
//! The file is read and validated exactly as `picket check-config` does.
//! Then, all or nothing:
//!
//! - an invalid file is refused with check-config's `file:line: key:
//!   reason` lines in the log, and the daemon keeps the configuration it has;
//! - any change under `[daemon]` (identity, listeners, peers, data
//!   directory, password file, log format, client limit, fault injection)
//!   is refused as a
//!   whole with the list of keys that need a restart: these are bound into
//!   sockets, peer links and the state store at start-up, and applying the
//!   group part alone would leave the file and the daemon disagreeing
//!   silently;
//! - a group with a failover (or election) in progress is neither stopped
//!   nor restarted: the reload is refused and can be retried when it is over.
//!
//! Otherwise groups are compared by name: a new group is started, a removed
//! one is stopped and its persisted record (master, config epoch, vote) is
//! deleted, a changed one is restarted with its new settings and keeps its
//! persisted master and config epoch (the group task reads them at start),
//! and an unchanged one is left alone (its SDOWN and peer state survive).
//!
//! Every SIGHUP also reads the certificate, key and CA files of
//! `[daemon.tls]` again (same paths): new handshakes use the new files,
//! open connections keep theirs, and files that do not make a valid
//! configuration are refused with the old ones kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Running;
use crate::config::{self, Config, ConfigErrors, DaemonConfig, GroupConfig};
use crate::daemon::Daemon;
use crate::group::GroupHandle;

/// How long a stopped group task may take to end before the reload gives up
/// on it.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a reload was refused or only partly applied.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new file is invalid; nothing changed.
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// `[daemon]` keys changed; nothing changed.
    #[error("{} changed: restart picket to apply; nothing was reloaded", .keys.join(", "))]
    RestartRequired {
        /// The changed keys, e.g. `daemon.peers`.
        keys: Vec<&'static str>,
    },
    /// A group that would be stopped is failing over; nothing changed.
    #[error(
        "group {group}: a failover is in progress; nothing was reloaded, reload again when it has finished"
    )]
    Busy {
        /// The group.
        group: String,
    },
    /// A new or changed group cannot be started (unreadable secret, bad
    /// discovery settings); nothing changed.
    #[error("group {group}: {reason}; nothing was reloaded")]
    Group {
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
    /// Applying failed halfway: some groups may not run.
    #[error("reload partly failed: {}", .problems.join("; "))]
    Partial {
        /// What went wrong, per group.
        problems: Vec<String>,
        /// What was applied nonetheless.
        applied: Plan,
    },
}

/// What a reload does to the groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Groups to start, in file order.
    pub added: Vec<String>,
    /// Groups to stop and forget, in name order.
    pub removed: Vec<String>,
    /// Groups to restart with new settings, in file order.
    pub changed: Vec<String>,
    /// Groups left running as they are.
    pub unchanged: usize,
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(" ")
            }
        };
        write!(
            f,
            "added: {}, removed: {}, changed: {}, unchanged: {}",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            self.unchanged
        )
    }
}

/// The `[daemon]` keys whose values differ: every one of them is read only
/// at start-up.
pub fn restart_required(old: &DaemonConfig, new: &DaemonConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut diff = |changed: bool, key: &'static str| {
        if changed {
            keys.push(key);
        }
    };
    diff(old.id != new.id, "daemon.id");
    diff(old.listen != new.listen, "daemon.listen");
    diff(old.announce != new.announce, "daemon.announce");
    diff(old.http_listen != new.http_listen, "daemon.http_listen");
    diff(old.data_dir != new.data_dir, "daemon.data_dir");
    diff(
        old.password_file != new.password_file,
        "daemon.password_file",
    );
    diff(old.log_format != new.log_format, "daemon.log_format");
    diff(old.peers != new.peers, "daemon.peers");
    diff(old.max_clients != new.max_clients, "daemon.max_clients");
    diff(old.tcp_backlog != new.tcp_backlog, "daemon.tcp_backlog");
    diff(
        old.enable_fault_injection != new.enable_fault_injection,
        "daemon.enable_fault_injection",
    );
    diff(old.default_role != new.default_role, "daemon.default_role");
    diff(old.peer_user != new.peer_user, "daemon.peer_user");
    diff(old.tls != new.tls, "daemon.tls");
    diff(old.users != new.users, "daemon.user");
    keys
}

/// Compare two valid configurations.
pub fn plan(old: &Config, new: &Config) -> Result<Plan, ReloadError> {
    let keys = restart_required(&old.daemon, &new.daemon);
    if !keys.is_empty() {
        return Err(ReloadError::RestartRequired { keys });
    }
    let find = |groups: &[GroupConfig], name: &str| groups.iter().position(|g| g.name == name);
    let mut p = Plan::default();
    for g in &new.groups {
        match find(&old.groups, &g.name) {
            None => p.added.push(g.name.clone()),
            Some(i) if old.groups[i] != *g => p.changed.push(g.name.clone()),
            Some(_) => p.unchanged += 1,
        }
    }
    p.removed = old
        .groups
        .iter()
        .filter(|g| find(&new.groups, &g.name).is_none())
        .map(|g| g.name.clone())
        .collect();
    p.removed.sort();
    Ok(p)
}

/// Check that a group could be started (secrets readable, TLS and discovery
/// settings usable) without starting anything.
fn dry_run(g: &GroupConfig) -> Result<(), String> {
    crate::group::client_options(g).map_err(|e| e.to_string())?;
    crate::discovery::build(g)?;
    Ok(())
}

/// Wait until the task behind `handle` has ended (its view channel closes
/// when the task drops its state), at most [`STOP_TIMEOUT`].
async fn stopped(handle: &GroupHandle) -> bool {
    let mut view = handle.view.clone();
    tokio::time::timeout(STOP_TIMEOUT, async move {
        while view.changed().await.is_ok() {}
    })
    .await
    .is_ok()
}

/// Apply `new` (already validated) to a running daemon; see the module
/// documentation for what is refused. Group tasks are started as children
/// of `cancel`.
pub async fn apply(
    daemon: &Arc<Daemon>,
    cancel: &CancellationToken,
    new: Config,
) -> Result<Plan, ReloadError> {
    let old = daemon
        .config
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let plan = plan(&old, &new)?;
    for name in plan.removed.iter().chain(&plan.changed) {
        if let Some(h) = daemon.group(name)
            && h.view.borrow().failover.is_some()
        {
            return Err(ReloadError::Busy {
                group: name.clone(),
            });
        }
    }
    let settings = |name: &str| new.groups.iter().find(|g| g.name == name);
    for name in plan.added.iter().chain(&plan.changed) {
        if let Some(g) = settings(name) {
            dry_run(g).map_err(|reason| ReloadError::Group {
                group: name.clone(),
                reason,
            })?;
        }
    }

    // From here on the reload is committed: problems are reported per group
    // and the rest is still applied.
    let mut problems = Vec::new();
    let mut applied = Plan {
        unchanged: plan.unchanged,
        ..Plan::default()
    };
    let leaving: Vec<(String, GroupHandle)> = {
        let mut groups = daemon.groups.write().unwrap_or_else(|e| e.into_inner());
        plan.removed
            .iter()
            .chain(&plan.changed)
            .filter_map(|n| groups.remove(n).map(|h| (n.clone(), h)))
            .collect()
    };
    for (_, h) in &leaving {
        h.cancel.cancel();
    }
    let mut gone = std::collections::HashSet::new();
    for (name, h) in &leaving {
        if stopped(h).await {
            gone.insert(name.clone());
        } else {
            problems.push(format!(
                "group {name}: its task did not stop within {STOP_TIMEOUT:?}; restart picket"
            ));
        }
    }
    for name in &plan.removed {
        if !gone.contains(name) {
            continue;
        }
        match daemon.ctx.state.remove_group(name).await {
            Ok(()) => {
                tracing::info!(group = %name, "group removed");
                applied.removed.push(name.clone());
            }
            Err(e) => problems.push(format!(
                "group {name}: stopped, but its state record could not be removed: {e}"
            )),
        }
    }
    for (name, is_new) in plan
        .added
        .iter()
        .map(|n| (n, true))
        .chain(plan.changed.iter().map(|n| (n, false)))
    {
        if !is_new && !gone.contains(name) {
            // Two tasks must never run one group.
            continue;
        }
        let Some(g) = settings(name) else { continue };
        match crate::start_group(g, &daemon.ctx, cancel, &daemon.group_tasks) {
            Ok(h) => {
                daemon
                    .groups
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), h);
                if is_new {
                    tracing::info!(group = %name, "group added");
                    applied.added.push(name.clone());
                } else {
                    tracing::info!(group = %name, "group restarted with its new settings");
                    applied.changed.push(name.clone());
                }
            }
            Err(reason) => problems.push(format!("group {name}: cannot start: {reason}")),
        }
    }
    *daemon.config.write().unwrap_or_else(|e| e.into_inner()) = new;
    // Peers learn the new set of groups from the next hello.
    daemon.ctx.hello_now.notify_one();
    if problems.is_empty() {
        Ok(applied)
    } else {
        Err(ReloadError::Partial { problems, applied })
    }
}

/// Read `path` like `picket check-config` and [`apply`] it.
pub async fn reload(
    daemon: &Arc<Daemon>,
    cancel: &CancellationToken,
    path: &Path,
) -> Result<Plan, ReloadError> {
    let new = config::load(path).map_err(ReloadError::Invalid)?;
    apply(daemon, cancel, new).await
}

/// Log the outcome of a reload the way an operator reads it: one error line
/// per configuration problem, exactly as `picket check-config` prints them.
pub fn log_outcome(result: &Result<Plan, ReloadError>) {
    match result {
        Ok(plan) => tracing::info!(%plan, "configuration reloaded"),
        Err(ReloadError::Invalid(errors)) => {
            for line in errors.to_string().lines() {
                tracing::error!("{line}");
            }
            tracing::error!(
                "configuration not reloaded: the file is invalid; still running with the previous configuration"
            );
        }
        Err(e @ ReloadError::Partial { .. }) => tracing::error!("{e}"),
        Err(e) => tracing::error!(
            "configuration not reloaded: {e}; still running with the previous configuration"
        ),
    }
}

/// Reload `path` on every SIGHUP until the daemon stops, telling the
/// service manager (`RELOADING=1`, then `READY=1`).
pub fn spawn_sighup_handler(running: &Running, path: PathBuf) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGHUP handler: reload disabled");
            return;
        }
    };
    let daemon = running.daemon.clone();
    let cancel = running.cancel.clone();
    let tls = running.tls.clone();
    running.tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            tracing::info!(config = %path.display(), "SIGHUP received: reloading the configuration");
            crate::service::notify_reloading();
            let result = reload(&daemon, &cancel, &path).await;
            log_outcome(&result);
            if let Some(t) = &tls {
                // The files named in force are read again whatever became
                // of the rest: a renewed certificate needs no other change.
                match t.reload() {
                    Ok(()) => tracing::info!("TLS certificates reloaded: new connections use them"),
                    Err(e) => tracing::error!(
                        "TLS certificates not reloaded: {e}; the previous ones stay in use"
                    ),
                }
            }
            crate::service::notify_ready(&daemon);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        config::load_str(Path::new("t.toml"), text).unwrap()
    }

    const DAEMON: &str = "[daemon]\nid = \"a\"\nlisten = \"127.0.0.1:26379\"\nhttp_listen = \"127.0.0.1:9479\"\ndata_dir = \"/tmp/x\"\n";

    fn group(name: &str, master: &str, extra: &str) -> String {
        format!("[[group]]\nname = \"{name}\"\nmaster = \"{master}\"\nquorum = 1\n{extra}\n")
    }

    #[test]
    fn groups_are_compared_by_name() {
        let old = cfg(&format!(
            "{DAEMON}{}{}{}",
            group("keep", "10.0.0.1:6379", ""),
            group("change", "10.0.0.2:6379", ""),
            group("drop", "10.0.0.3:6379", "")
        ));
        let new = cfg(&format!(
            "{DAEMON}{}{}{}",
            group("new", "10.0.0.4:6379", ""),
            group("change", "10.0.0.2:6379", "down_after = \"3s\""),
            group("keep", "10.0.0.1:6379", "")
        ));
        assert_eq!(
            plan(&old, &new).unwrap(),
            Plan {
                added: vec!["new".into()],
                removed: vec!["drop".into()],
                changed: vec!["change".into()],
                unchanged: 1,
            }
        );
        assert_eq!(
            plan(&old, &old).unwrap(),
            Plan {
                unchanged: 3,
                ..Plan::default()
            }
        );
    }

    #[test]
    fn a_discovery_change_is_a_change() {
        let old = cfg(&format!("{DAEMON}{}", group("g", "10.0.0.1:6379", "")));
        let new = cfg(&format!(
            "{DAEMON}{}[[group.discovery]]\ntype = \"memory\"\n",
            group("g", "10.0.0.1:6379", "")
        ));
        assert_eq!(plan(&old, &new).unwrap().changed, vec!["g".to_string()]);
    }

    #[test]
    fn every_daemon_key_requires_a_restart() {
        let old = cfg(DAEMON);
        let cases = [
            ("id = \"a\"", "id = \"b\"", "daemon.id"),
            (
                "listen = \"127.0.0.1:26379\"",
                "listen = \"127.0.0.1:26380\"",
                "daemon.listen",
            ),
            (
                "http_listen = \"127.0.0.1:9479\"",
                "http_listen = \"127.0.0.1:9480\"",
                "daemon.http_listen",
            ),
            (
                "data_dir = \"/tmp/x\"",
                "data_dir = \"/tmp/y\"",
                "daemon.data_dir",
            ),
        ];
        for (from, to, key) in cases {
            let new = cfg(&DAEMON.replace(from, to));
            match plan(&old, &new) {
                Err(ReloadError::RestartRequired { keys }) => assert_eq!(keys, vec![key]),
                other => panic!("{key}: {other:?}"),
            }
        }
        let more = [
            ("peers = [\"127.0.0.1:26380\"]", "daemon.peers"),
            ("password_file = \"/etc/hostname\"", "daemon.password_file"),
            ("announce = \"10.0.0.9:26379\"", "daemon.announce"),
            ("log_format = \"json\"", "daemon.log_format"),
            ("max_clients = 5", "daemon.max_clients"),
            ("tcp_backlog = 128", "daemon.tcp_backlog"),
            ("default_role = \"client\"", "daemon.default_role"),
            (
                "enable_fault_injection = true",
                "daemon.enable_fault_injection",
            ),
        ];
        for (line, key) in more {
            let new = cfg(&format!("{DAEMON}{line}\n"));
            match plan(&old, &new) {
                Err(ReloadError::RestartRequired { keys }) => assert_eq!(keys, vec![key]),
                other => panic!("{key}: {other:?}"),
            }
        }
        let new = cfg(&DAEMON
            .replace("id = \"a\"", "id = \"b\"")
            .replace("/tmp/x", "/tmp/y"));
        let err = plan(&old, &new).unwrap_err();
        assert_eq!(
            err.to_string(),
            "daemon.id, daemon.data_dir changed: restart picket to apply; nothing was reloaded"
        );
    }

    #[test]
    fn a_group_that_cannot_start_is_found_before_anything_changes() {
        let g = cfg(&format!(
            "{DAEMON}{}",
            group("g", "10.0.0.1:6379", "password_file = \"/etc/hostname\"")
        ))
        .groups
        .remove(0);
        assert_eq!(dry_run(&g), Ok(()));
        let mut missing = g.clone();
        missing.password_file = Some(PathBuf::from("/nonexistent/picket-secret"));
        let err = dry_run(&missing).unwrap_err();
        assert!(err.contains("/nonexistent/picket-secret"), "{err}");
    }

    #[test]
    fn plans_read_well_in_the_log() {
        let p = Plan {
            added: vec!["a".into(), "b".into()],
            removed: vec![],
            changed: vec!["c".into()],
            unchanged: 2,
        };
        assert_eq!(
            p.to_string(),
            "added: a b, removed: -, changed: c, unchanged: 2"
        );
    }
}
