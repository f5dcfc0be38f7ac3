//! SIGHUP reload of a running picket process, against real redis-server
//! masters: groups added, changed (keeping their persisted master and
//! config epoch) and removed (with their state record); an invalid file,
//! or a change that needs a restart, refused while the daemon keeps running
//! on the configuration it has.

use picket_harness::ops_support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ops_support::{Ports, group, group_names, group_table, log_count, status};
use picket::quorum::state::{GroupRecord, PersistedState, STATE_FILE};
use picket_harness::{PicketProcess, RedisOpts, RedisServer, wait_for};

const WAIT: Duration = Duration::from_secs(15);
const RELOADED: &str = "configuration reloaded";
const REFUSED: &str = "configuration not reloaded";

fn sighup(p: &PicketProcess) {
    let pid = i32::try_from(p.pid().expect("picket is running")).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGHUP).unwrap();
}

/// Write `config`, send SIGHUP and wait until the daemon logged the outcome
/// (`needle` one more time than before).
fn reload_with(p: &PicketProcess, config: &str, needle: &str) {
    let before = log_count(p, needle);
    fs::write(p.config_path(), config).unwrap();
    sighup(p);
    wait_for(&format!("{needle:?} logged after SIGHUP"), WAIT, || {
        log_count(p, needle) > before
    });
}

fn persisted(dir: &Path) -> PersistedState {
    serde_json::from_slice(&fs::read(dir.join(STATE_FILE)).unwrap()).unwrap()
}

fn names(p: &PicketProcess, http: std::net::SocketAddr) -> Vec<String> {
    let s = status(http).unwrap_or_else(|| panic!("no status\n{}", p.logs()));
    let mut n = group_names(&s);
    n.sort();
    n
}

#[test]
fn sighup_adds_changes_and_removes_groups() {
    let a = RedisServer::start_fresh(RedisOpts::default());
    let b1 = RedisServer::start_fresh(RedisOpts::default());
    let b2 = RedisServer::start_fresh(RedisOpts::default());
    let c = RedisServer::start_fresh(RedisOpts::default());
    let ports = Ports::fresh();
    let data = tempfile::tempdir().unwrap();
    // A failover moved group b to b2 in epoch 4 before this run.
    let state = PersistedState {
        version: 1,
        daemon_id: "reload-a".into(),
        // Written before run ids existed: the daemon adds one.
        run_id: String::new(),
        current_epoch: 4,
        groups: BTreeMap::from([
            (
                "a".to_string(),
                GroupRecord {
                    config_epoch: 3,
                    master: Some(a.addr().to_string().parse().unwrap()),
                    vote_epoch: 3,
                    voted_for: Some("reload-a".into()),
                    vote_promote: None,
                    known_replicas: Vec::new(),
                    led_epoch: 0,
                    led_switchover_until: 0,
                    master_identity: None,
                },
            ),
            (
                "b".to_string(),
                GroupRecord {
                    config_epoch: 4,
                    master: Some(b2.addr().to_string().parse().unwrap()),
                    vote_epoch: 4,
                    voted_for: Some("reload-a".into()),
                    vote_promote: None,
                    known_replicas: Vec::new(),
                    led_epoch: 0,
                    led_switchover_until: 0,
                    master_identity: None,
                },
            ),
        ]),
    };
    fs::write(
        data.path().join(STATE_FILE),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    let daemon = ports.daemon_table("reload-a", data.path());
    let first = format!(
        "{daemon}{}{}",
        group_table("a", a.addr(), ""),
        group_table("b", b1.addr(), "down_after = \"1s\"")
    );
    let p = PicketProcess::start(&first);
    wait_for("groups a and b in /v1/status", WAIT, || {
        status(ports.http).is_some_and(|s| group_names(&s).len() == 2)
    });
    let s = status(ports.http).unwrap();
    let b = group(&s, "b").unwrap();
    assert_eq!(b["master"], b2.addr().to_string(), "persisted master wins");
    assert_eq!(b["config_epoch"], 4);

    // Add c, change b's down_after.
    let second = format!(
        "{daemon}{}{}{}",
        group_table("a", a.addr(), ""),
        group_table("b", b1.addr(), "down_after = \"2s\""),
        group_table("c", c.addr(), "")
    );
    reload_with(&p, &second, RELOADED);
    wait_for("group c in /v1/status", WAIT, || {
        status(ports.http)
            .is_some_and(|s| group(&s, "c").is_some_and(|g| g["master"] == c.addr().to_string()))
    });
    let s = status(ports.http).unwrap();
    let b = group(&s, "b").unwrap();
    assert_eq!(
        b["down_after_ms"], 2000,
        "b restarted with its new settings"
    );
    assert_eq!(
        b["master"],
        b2.addr().to_string(),
        "b kept its persisted master"
    );
    assert_eq!(b["config_epoch"], 4, "b kept its config epoch");
    assert!(
        p.logs()
            .contains("added: c, removed: -, changed: b, unchanged: 1"),
        "{}",
        p.logs()
    );
    assert!(persisted(data.path()).groups.contains_key("a"));

    // Remove a: its task stops and its config is forgotten; its vote is
    // kept so that re-adding it cannot vote twice in epoch 3.
    let third = format!(
        "{daemon}{}{}",
        group_table("b", b1.addr(), "down_after = \"2s\""),
        group_table("c", c.addr(), "")
    );
    reload_with(&p, &third, RELOADED);
    wait_for("group a gone from /v1/status", WAIT, || {
        status(ports.http).is_some_and(|s| !group_names(&s).contains(&"a".to_string()))
    });
    assert_eq!(names(&p, ports.http), ["b", "c"]);
    let st = persisted(data.path());
    let a_rec = &st.groups["a"];
    assert_eq!(a_rec.master, None, "config of a forgotten: {st:?}");
    assert_eq!(a_rec.config_epoch, 0, "config of a forgotten: {st:?}");
    assert_eq!(
        (a_rec.vote_epoch, a_rec.voted_for.as_deref()),
        (3, Some("reload-a")),
        "the vote of a is kept: {st:?}"
    );
    assert_eq!(st.groups["b"].config_epoch, 4, "b's record kept");
    assert_eq!(st.current_epoch, 4, "epochs never go back");

    // The daemon keeps serving and stops cleanly.
    assert_eq!(
        ops_support::http_get(ports.http, "/healthz").unwrap().0,
        200
    );
    let mut p = p;
    let (exit, killed) = p.stop().expect("was running");
    assert!(exit.success() && !killed, "{exit:?}\n{}", p.logs());
}

#[test]
fn invalid_files_and_daemon_changes_are_refused_and_the_old_config_kept() {
    let a = RedisServer::start_fresh(RedisOpts::default());
    let b = RedisServer::start_fresh(RedisOpts::default());
    let c = RedisServer::start_fresh(RedisOpts::default());
    let ports = Ports::fresh();
    let data = tempfile::tempdir().unwrap();
    let daemon = ports.daemon_table("reload-b", data.path());
    let good = format!(
        "{daemon}{}{}",
        group_table("a", a.addr(), ""),
        group_table("b", b.addr(), "")
    );
    let p = PicketProcess::start(&good);
    wait_for("groups a and b in /v1/status", WAIT, || {
        status(ports.http).is_some_and(|s| group_names(&s).len() == 2)
    });

    // Invalid: quorum 0 in the second group, and an unknown key would stop
    // the parse, so only a validation error here (with its line number).
    let invalid = format!(
        "{daemon}{}{}",
        group_table("a", a.addr(), ""),
        group_table("b", b.addr(), "").replace("quorum = 1", "quorum = 0")
    );
    reload_with(&p, &invalid, REFUSED);
    let expected = picket::config::load(&p.config_path())
        .expect_err("the file is invalid")
        .to_string();
    assert!(
        expected.starts_with(&format!("{}:", p.config_path().display())),
        "{expected}"
    );
    let logs = p.logs();
    for line in expected.lines() {
        assert!(
            line.contains(": group[1].quorum: "),
            "check-config line: {line}"
        );
        assert!(logs.contains(line), "log lacks {line:?}\n{logs}");
    }
    assert_eq!(names(&p, ports.http), ["a", "b"], "still the old groups");

    // A group change together with a peer change: refused as a whole.
    let peers = format!(
        "{}peers = [\"127.0.0.1:1\"]\n{}{}{}",
        daemon,
        group_table("a", a.addr(), ""),
        group_table("b", b.addr(), ""),
        group_table("c", c.addr(), "")
    );
    reload_with(&p, &peers, REFUSED);
    assert!(
        p.logs().contains(
            "daemon.peers changed: restart picket to apply; nothing was reloaded; still running with the previous configuration"
        ),
        "{}",
        p.logs()
    );
    assert_eq!(names(&p, ports.http), ["a", "b"], "c was not added");

    // The old configuration still reloads fine afterwards.
    let removed_b = format!("{daemon}{}", group_table("a", a.addr(), ""));
    reload_with(&p, &removed_b, RELOADED);
    wait_for("group b removed", WAIT, || {
        status(ports.http).is_some_and(|s| group_names(&s) == ["a"])
    });
    assert!(p.logs().contains("group removed"), "{}", p.logs());
}
