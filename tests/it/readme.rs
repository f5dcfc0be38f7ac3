//! The README's first-contact commands are true on a fresh machine: every
//! command of its "Running it" section is run here (or said why not), and
//! the minimal configuration it shows is `config/minimal.toml`, which
//! validates as it stands.

use picket_harness::obs_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use obs_support::{ROOT, read};
use picket_harness::{ClusterPlan, Topology, group_toml};

/// The fenced blocks of `lang` in the README section titled `title`.
fn blocks(readme: &str, title: &str, lang: &str) -> Vec<String> {
    let start = readme
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("README has no section {title:?}"));
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut out = Vec::new();
    let mut rest = section;
    let fence = format!("```{lang}\n");
    while let Some(a) = rest.find(&fence) {
        let body = &rest[a + fence.len()..];
        let end = body.find("```").expect("closed block");
        out.push(body[..end].to_string());
        rest = &body[end..];
        rest = &rest[3..];
    }
    out
}

/// The commands of a shell block: one per line, comments dropped.
fn commands(block: &str) -> Vec<String> {
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn picket(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_picket"))
        .args(args)
        .current_dir(ROOT)
        .output()
        .expect("run picket")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_first_lines_of_the_readme_name_two_scripts_that_exist() {
    let readme = read("README.md");
    let first: Vec<&str> = readme
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .take(2)
        .collect();
    for (line, script) in first.iter().zip(["scripts/demo", "scripts/test"]) {
        assert!(line.trim_start().starts_with(script), "{line:?}");
        let meta = std::fs::metadata(Path::new(ROOT).join(script)).unwrap();
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
            "{script} is not executable"
        );
    }
}

#[test]
fn the_minimal_configuration_of_the_readme_is_config_minimal_toml_and_validates() {
    let readme = read("README.md");
    let shown = blocks(&readme, "Running it", "toml");
    assert_eq!(shown.len(), 1, "one configuration in Running it");
    let shown: toml::Value = toml::from_str(&shown[0]).unwrap();
    let file: toml::Value = toml::from_str(&read("config/minimal.toml")).unwrap();
    assert_eq!(shown, file, "the README shows config/minimal.toml");

    // And the fully commented example fails on this machine only because
    // of the files it names, as the README says (each problem is a
    // missing file), unless the machine has them all.
    let out = picket(&[
        "check-config".into(),
        "--config".into(),
        "config/picket.toml".into(),
    ]);
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(64), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                line.ends_with("does not exist"),
                "not a missing file: {line}"
            );
        }
    }
}

#[test]
fn every_command_of_running_it_works_as_written() {
    let readme = read("README.md");
    let cmds: Vec<String> = blocks(&readme, "Running it", "sh")
        .iter()
        .flat_map(|b| commands(b))
        .collect();
    assert!(cmds.len() >= 6, "{cmds:?}");

    // A daemon for status and failover: a master, one replica, quorum 1.
    let topo = Topology::master_with_replicas(1);
    let replica = topo.replicas[0].addr();
    let plan = ClusterPlan::new(1);
    let cluster = plan.start(&group_toml("cache", topo.master.addr(), 1, ""));
    let node = &cluster.nodes[0];
    cluster.wait_converged(&[0], "cache", 2, Duration::from_secs(20));

    let mut ran = 0;
    for cmd in &cmds {
        let words: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
        let args: Vec<String> = match words.first().map(String::as_str) {
            // The tests run the binary cargo built for them; CI builds the
            // release binary in scripts/build-deb.
            Some("cargo") if cmd == "cargo build --release" => continue,
            // No systemd here: the unit is checked by tests/it/systemd.rs and
            // by scripts/package-test in the package's image.
            Some("systemctl") if cmd == "systemctl enable --now picket" => continue,
            Some("target/release/picket") | Some("picket") => words[1..].to_vec(),
            _ => panic!("README command not covered by this test: {cmd}"),
        };
        // The documented addresses are the defaults of a daemon on this
        // host; the test's daemon listens elsewhere. /etc/picket/picket.toml
        // is config/minimal.toml in the package (scripts/package-test runs
        // the command there as written).
        let args: Vec<String> = args
            .iter()
            .map(|a| match a.as_str() {
                "/etc/picket/picket.toml" => "config/minimal.toml".to_string(),
                "127.0.0.1:9479" => node.http.to_string(),
                "127.0.0.1:26379" => node.resp.to_string(),
                _ => a.clone(),
            })
            .collect();
        // `[--to ADDR]`: the optional argument, given.
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a == "[--to" {
                    "--to".to_string()
                } else if a.ends_with(']') && a.contains(':') {
                    replica.to_string()
                } else {
                    a.clone()
                }
            })
            .collect();
        let out = picket(&args);
        assert!(
            out.status.success(),
            "README: {cmd}\nran: picket {}\n{}\n{}",
            args.join(" "),
            text(&out),
            node.logs()
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        match args.first().map(String::as_str) {
            Some("check-config") => assert!(stdout.contains("group cache"), "{stdout}"),
            Some("status") => assert!(stdout.contains("cache"), "{stdout}"),
            Some("--help") => assert!(stdout.contains("check-config"), "{stdout}"),
            Some("failover") => picket_harness::wait_for(
                "the switchover to the replica",
                Duration::from_secs(20),
                || {
                    node.master_addr("cache") == Some(replica)
                        && picket_harness::redis_cmd(replica, &["ROLE"]).is_ok_and(|r| {
                            matches!(r, picket_harness::Reply::Array(a) if a.first().and_then(|x| x.as_str()) == Some("master"))
                        })
                },
            ),
            other => panic!("no check for {other:?}"),
        }
        ran += 1;
    }
    assert!(ran >= 5, "ran only {ran} of {cmds:?}");
}
