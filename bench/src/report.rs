//! Medians, ranges and ratios; the table printed on stdout.

use std::fmt::Write as _;

use serde::Serialize;

use crate::cluster::Side;
use crate::cost::CostRow;
use crate::runs::{FailoverRun, SwitchoverRun};

/// Median and range of one figure.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Stat {
    /// Values counted.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Median and range of `v` (None when empty).
pub fn stat(v: &[f64]) -> Option<Stat> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Some(Stat {
        n,
        median,
        min: s[0],
        max: s[n - 1],
    })
}

/// One figure compared: picket, redis-sentinel, and picket / redis-sentinel
/// of the medians.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    /// What is measured.
    pub figure: String,
    /// Unit.
    pub unit: String,
    /// picket's values.
    pub picket: Option<Stat>,
    /// redis-sentinel's values.
    pub redis_sentinel: Option<Stat>,
    /// picket median / redis-sentinel median.
    pub ratio: Option<f64>,
    /// A note (how it was measured, or why it is missing).
    pub note: Option<String>,
}

fn compared(figure: &str, unit: &str, p: &[f64], s: &[f64], note: Option<String>) -> Compared {
    let (p, s) = (stat(p), stat(s));
    let ratio = match (p, s) {
        (Some(p), Some(s)) if s.median != 0.0 => Some(p.median / s.median),
        _ => None,
    };
    Compared {
        figure: figure.to_string(),
        unit: unit.to_string(),
        picket: p,
        redis_sentinel: s,
        ratio,
        note,
    }
}

fn of<T>(
    runs: &[T],
    side: Side,
    sidef: impl Fn(&T) -> Side,
    f: impl Fn(&T) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter(|r| sidef(r) == side)
        .filter_map(f)
        .collect()
}

/// The compared figures of the failover runs at one down_after.
pub fn failover_figures(runs: &[FailoverRun]) -> Vec<Compared> {
    let side = |r: &FailoverRun| r.side;
    let both = |f: &dyn Fn(&FailoverRun) -> Option<f64>| {
        (
            of(runs, Side::Picket, side, f),
            of(runs, Side::RedisSentinel, side, f),
        )
    };
    let mut out = Vec::new();
    let (p, s) = both(&|r| r.unavailable_ms);
    out.push(compared("write unavailability", "ms", &p, &s, None));
    let (p, s) = both(&|r| r.switch_seen_ms);
    out.push(compared(
        "kill -> get-master-addr-by-name changes",
        "ms",
        &p,
        &s,
        Some("earliest of the three managers, polled every 10 ms".into()),
    ));
    let (p, s) = both(&|r| r.switch_event_ms);
    let unsupported = |sd: Side| {
        runs.iter()
            .filter(|r| r.side == sd)
            .any(|r| !r.switch_event_supported)
    };
    let note = if unsupported(Side::Picket) {
        Some(
            "picket does not accept SUBSCRIBE in this build: see the get-master-addr-by-name row"
                .into(),
        )
    } else {
        Some("earliest +switch-master on any of the three managers".into())
    };
    out.push(compared("kill -> +switch-master", "ms", &p, &s, note));
    for kind in [
        "refused",
        "readonly",
        "loading",
        "timeout",
        "closed",
        "error",
        "unresolved",
    ] {
        let (p, s) = both(&|r| Some(*r.errors.get(kind).unwrap_or(&0) as f64));
        if p.iter().chain(s.iter()).any(|v| *v > 0.0) {
            out.push(compared(
                &format!("client errors: {kind}"),
                "ops",
                &p,
                &s,
                None,
            ));
        }
    }
    let (p, s) = both(&|r| Some(r.acked_lost as f64));
    out.push(compared(
        "acknowledged writes lost",
        "writes",
        &p,
        &s,
        Some("acked but missing on the final master (async replication at the kill)".into()),
    ));
    let (p, s) = both(&|r| r.demotion_ms);
    let timeouts = |sd: Side| {
        runs.iter()
            .filter(|r| r.side == sd && r.failed_over && r.demotion_ms.is_none())
            .count()
    };
    out.push(compared(
        "restarted old master: first answer -> role:slave",
        "ms",
        &p,
        &s,
        Some(format!(
            "not demoted within the wait: picket {}, redis-sentinel {}",
            timeouts(Side::Picket),
            timeouts(Side::RedisSentinel)
        )),
    ));
    let (p, s) = both(&|r| r.config_epochs.iter().flatten().max().map(|e| *e as f64));
    out.push(compared(
        "final config epoch (highest of the managers)",
        "epoch",
        &p,
        &s,
        Some("1 = one successful election".into()),
    ));
    let count = |sd: Side, f: &dyn Fn(&FailoverRun) -> bool| {
        (
            runs.iter().filter(|r| r.side == sd && f(r)).count(),
            runs.iter().filter(|r| r.side == sd).count(),
        )
    };
    let (pd, pn) = count(Side::Picket, &|r| r.double_failover);
    let (sd, sn) = count(Side::RedisSentinel, &|r| r.double_failover);
    out.push(Compared {
        figure: "runs with more than one failover".into(),
        unit: "runs".into(),
        picket: Some(Stat {
            n: pn,
            median: pd as f64,
            min: pd as f64,
            max: pd as f64,
        }),
        redis_sentinel: Some(Stat {
            n: sn,
            median: sd as f64,
            min: sd as f64,
            max: sd as f64,
        }),
        ratio: None,
        note: Some(format!("picket {pd}/{pn}, redis-sentinel {sd}/{sn}")),
    });
    let retried = |r: &FailoverRun| r.config_epochs.iter().flatten().any(|e| *e > 1);
    let (pr, pn) = count(Side::Picket, &retried);
    let (sr, sn) = count(Side::RedisSentinel, &retried);
    out.push(Compared {
        figure: "runs ending with config epoch > 1".into(),
        unit: "runs".into(),
        picket: Some(Stat { n: pn, median: pr as f64, min: pr as f64, max: pr as f64 }),
        redis_sentinel: Some(Stat { n: sn, median: sr as f64, min: sr as f64, max: sr as f64 }),
        ratio: None,
        note: Some(format!(
            "picket {pr}/{pn}, redis-sentinel {sr}/{sn}: a failed first election (split vote), or a second failover"
        )),
    });
    let (pf, pn) = count(Side::Picket, &|r| r.failed_over);
    let (sf, sn) = count(Side::RedisSentinel, &|r| r.failed_over);
    out.push(Compared {
        figure: "runs that failed over".into(),
        unit: "runs".into(),
        picket: Some(Stat {
            n: pn,
            median: pf as f64,
            min: pf as f64,
            max: pf as f64,
        }),
        redis_sentinel: Some(Stat {
            n: sn,
            median: sf as f64,
            min: sf as f64,
            max: sf as f64,
        }),
        ratio: None,
        note: Some(format!("picket {pf}/{pn}, redis-sentinel {sf}/{sn}")),
    });
    out
}

/// The compared figures of the switchover runs.
pub fn switchover_figures(runs: &[SwitchoverRun]) -> Vec<Compared> {
    let side = |r: &SwitchoverRun| r.side;
    let both = |f: &dyn Fn(&SwitchoverRun) -> Option<f64>| {
        (
            of(runs, Side::Picket, side, f),
            of(runs, Side::RedisSentinel, side, f),
        )
    };
    let mut out = Vec::new();
    let (p, s) = both(&|r| Some(r.acked_lost as f64));
    out.push(compared("acknowledged writes lost", "writes", &p, &s, None));
    let (p, s) = both(&|r| Some(r.acked_by_old_after_switch as f64));
    out.push(compared(
        "writes acked by the old master after the switch",
        "writes",
        &p,
        &s,
        None,
    ));
    let (p, s) = both(&|r| r.write_gap_ms);
    out.push(compared("longest write gap", "ms", &p, &s, None));
    let (p, s) = both(&|r| Some(r.reply_ms));
    out.push(compared("command reply time", "ms", &p, &s, None));
    let (p, s) = both(&|r| r.switch_seen_ms);
    out.push(compared(
        "command -> get-master-addr-by-name changes",
        "ms",
        &p,
        &s,
        None,
    ));
    let (p, s) = both(&|r| r.old_master_demoted_ms);
    out.push(compared(
        "command -> old master role:slave",
        "ms",
        &p,
        &s,
        None,
    ));
    let (p, s) = both(&|r| Some(r.errors.values().sum::<u64>() as f64));
    out.push(compared("client errors", "ops", &p, &s, None));
    out
}

fn cell(s: &Option<Stat>, unit: &str) -> String {
    match s {
        None => "-".into(),
        Some(s) if unit == "runs" => format!("{}", s.median as u64),
        Some(s) if s.min == s.max => format!("{:.0}", s.median),
        Some(s) => format!("{:.0} [{:.0}-{:.0}]", s.median, s.min, s.max),
    }
}

/// A table of compared figures.
pub fn table(title: &str, rows: &[Compared]) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "\n{title}");
    let _ = writeln!(
        t,
        "{:<50} {:>22} {:>22} {:>8}",
        "figure (median [min-max])", "picket", "redis-sentinel", "ratio"
    );
    for r in rows {
        let ratio = r.ratio.map_or("-".to_string(), |x| {
            if x < 0.1 {
                format!("{x:.4}")
            } else {
                format!("{x:.2}")
            }
        });
        let _ = writeln!(
            t,
            "{:<50} {:>22} {:>22} {:>8}",
            format!("{} ({})", r.figure, r.unit),
            cell(&r.picket, &r.unit),
            cell(&r.redis_sentinel, &r.unit),
            ratio
        );
        if let Some(n) = &r.note {
            let _ = writeln!(t, "    {n}");
        }
    }
    t
}

/// The table of `picket-bench tls`: picket without and with TLS, and the
/// difference of the medians of the write unavailability (with TLS minus
/// without), also returned.
pub fn tls_table(down_after: std::time::Duration, runs: &[FailoverRun]) -> (String, Option<f64>) {
    let side = |r: &FailoverRun| r.side;
    let col = |f: &dyn Fn(&FailoverRun) -> Option<f64>| {
        (
            stat(&of(runs, Side::Picket, side, f)),
            stat(&of(runs, Side::PicketTls, side, f)),
        )
    };
    let mut t = String::new();
    let n = runs.iter().filter(|r| r.side == Side::PicketTls).count();
    let _ = writeln!(
        t,
        "\nFailover after kill -9 of the master, picket without and with TLS, down_after {} ms ({n} runs per side, interleaved)",
        down_after.as_millis()
    );
    let _ = writeln!(
        t,
        "{:<50} {:>22} {:>22} {:>10}",
        "figure (median [min-max])", "picket", "picket-tls", "tls - plain"
    );
    let mut gap = None;
    for (name, f) in [
        (
            "write unavailability (ms)",
            &(|r: &FailoverRun| r.unavailable_ms) as &dyn Fn(&FailoverRun) -> Option<f64>,
        ),
        ("kill -> get-master-addr-by-name changes (ms)", &|r| {
            r.switch_seen_ms
        }),
        ("kill -> +switch-master (ms)", &|r| r.switch_event_ms),
        ("errors after the kill (ops)", &|r| {
            Some(r.errors.values().sum::<u64>() as f64)
        }),
        ("acknowledged writes lost", &|r| Some(r.acked_lost as f64)),
    ] {
        let (p, s) = col(f);
        let delta = match (p, s) {
            (Some(p), Some(s)) => Some(s.median - p.median),
            _ => None,
        };
        if gap.is_none() && name.starts_with("write unavailability") {
            gap = delta;
        }
        let _ = writeln!(
            t,
            "{:<50} {:>22} {:>22} {:>10}",
            name,
            cell(&p, "ms"),
            cell(&s, "ms"),
            delta.map_or("-".to_string(), |d| format!("{d:+.0}"))
        );
    }
    if let Some(d) = gap {
        let _ = writeln!(
            t,
            "target: the medians of the write unavailability within 50 ms of each other: {} ({d:+.0} ms)",
            if d.abs() <= 50.0 { "met" } else { "NOT met" }
        );
    }
    (t, gap)
}

/// The cost table.
pub fn cost_table(rows: &[CostRow]) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "\nCost of monitoring (one manager alone, quorum 1)");
    let _ = writeln!(
        t,
        "{:<15} {:>9} {:>7} {:>8} {:>11} {:>9} {:>15} {:>10} {:>12} {:>10} {:>9}",
        "manager",
        "instances",
        "groups",
        "targets",
        "down_after",
        "ping",
        "info m/r",
        "CPU %",
        "CPU us/PING",
        "RSS MiB",
        "ready s"
    );
    for r in rows {
        let _ = writeln!(
            t,
            "{:<15} {:>9} {:>7} {:>8} {:>9}ms {:>7}ms {:>15} {:>10.2} {:>12.1} {:>10.1} {:>9.1}",
            r.side.name(),
            r.instances,
            r.groups,
            format!("{:?}", r.targets).to_lowercase(),
            r.down_after_ms,
            r.ping_period_ms,
            format!("{}/{} ms", r.info_period_ms, r.replica_info_period_ms),
            r.cpu_pct,
            r.cpu_us_per_ping(),
            r.rss_mib,
            r.ready_s
        );
    }
    // Ratios at the same instance count and ping period.
    for r in rows.iter().filter(|r| r.side == Side::Picket) {
        if let Some(s) = rows.iter().find(|s| {
            s.side == Side::RedisSentinel
                && s.instances == r.instances
                && s.targets == r.targets
                && s.ping_period_ms == r.ping_period_ms
        }) {
            let _ = writeln!(
                t,
                "    picket / redis-sentinel at {} instances, ping {} ms ({:?}): CPU {:.2}, RSS {:.2}",
                r.instances,
                r.ping_period_ms,
                r.targets,
                if s.cpu_pct > 0.0 {
                    r.cpu_pct / s.cpu_pct
                } else {
                    f64::NAN
                },
                r.rss_mib / s.rss_mib
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(stat(&[]), None);
        let s = stat(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = stat(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
    }

    #[test]
    fn ratio_of_medians() {
        let c = compared("x", "ms", &[100.0, 300.0, 200.0], &[400.0, 400.0], None);
        assert_eq!(c.ratio, Some(0.5));
        let c = compared("x", "ms", &[1.0], &[0.0], None);
        assert_eq!(c.ratio, None);
    }
}

/// One of the project's performance targets, checked on picket's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    /// The target.
    pub target: String,
    /// Met.
    pub met: bool,
    /// The figures it was judged on.
    pub measured: String,
}

/// Check picket's figures against the targets of docs/benchmarks.md
/// ("The targets").
pub fn check_targets(
    failover: &[(u64, &[FailoverRun])],
    switchover: &[SwitchoverRun],
    cost: &[CostRow],
) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for (da, runs) in failover {
        let p: Vec<&FailoverRun> = runs.iter().filter(|r| r.side == Side::Picket).collect();
        if p.is_empty() {
            continue;
        }
        let u: Vec<f64> = p.iter().filter_map(|r| r.unavailable_ms).collect();
        if let Some(st) = stat(&u) {
            let limit = *da as f64 + 250.0;
            out.push(TargetCheck {
                target: format!("write unavailability <= down_after + 250 ms ({limit:.0} ms) at down_after {da} ms"),
                met: st.max <= limit && u.len() == p.len(),
                measured: format!(
                    "median {:.0}, max {:.0} ms over {} runs ({} without a figure)",
                    st.median,
                    st.max,
                    u.len(),
                    p.len() - u.len()
                ),
            });
        }
        let d: Vec<f64> = p.iter().filter_map(|r| r.demotion_ms).collect();
        let missing = p
            .iter()
            .filter(|r| r.failed_over && r.demotion_ms.is_none())
            .count();
        if let Some(st) = stat(&d) {
            out.push(TargetCheck {
                target: format!(
                    "returning old master demoted within 1 s of answering (down_after {da} ms)"
                ),
                met: st.max <= 1000.0 && missing == 0,
                measured: format!(
                    "median {:.0}, max {:.0} ms; not demoted: {missing}",
                    st.median, st.max
                ),
            });
        }
        let doubles = p.iter().filter(|r| r.double_failover).count();
        out.push(TargetCheck {
            target: format!("no double failover (down_after {da} ms)"),
            met: doubles == 0,
            measured: format!("{doubles} of {} runs", p.len()),
        });
    }
    let sw: Vec<&SwitchoverRun> = switchover
        .iter()
        .filter(|r| r.side == Side::Picket)
        .collect();
    if !sw.is_empty() {
        let lost: u64 = sw.iter().map(|r| r.acked_lost).sum();
        let switched = sw.iter().filter(|r| r.switched).count();
        out.push(TargetCheck {
            target: "planned switchover loses no acknowledged write".into(),
            met: lost == 0 && switched == sw.len(),
            measured: format!("{lost} lost over {} runs ({switched} switched)", sw.len()),
        });
    }
    // At the same PING period as Sentinel's (1 s): at most Sentinel's CPU
    // and RSS where both were measured, and within 50 % of a core and
    // 256 MiB at 10,000 instances or more.
    for r in cost
        .iter()
        .filter(|r| r.side == Side::Picket && r.ping_period_ms == 1000)
    {
        if let Some(s) = cost.iter().find(|s| {
            s.side == Side::RedisSentinel
                && s.instances == r.instances
                && s.targets == r.targets
                && s.ping_period_ms == r.ping_period_ms
        }) && r.instances >= 1000
        {
            out.push(TargetCheck {
                target: format!(
                    "{} instances ({:?}), PING every {} ms on both: CPU <= redis-sentinel's, RSS <= redis-sentinel's",
                    r.instances, r.targets, r.ping_period_ms
                ),
                met: r.cpu_pct <= s.cpu_pct && r.rss_mib <= s.rss_mib,
                measured: format!(
                    "picket {:.2}% / {:.1} MiB; redis-sentinel {:.2}% / {:.1} MiB (CPU ratio {:.2})",
                    r.cpu_pct,
                    r.rss_mib,
                    s.cpu_pct,
                    s.rss_mib,
                    r.cpu_pct / s.cpu_pct
                ),
            });
        }
        if r.instances >= 10_000 {
            out.push(TargetCheck {
                target: format!(
                    "{} instances in one daemon, PING every {} ms: <= 50% of one core, <= 256 MiB",
                    r.instances, r.ping_period_ms
                ),
                met: r.cpu_pct <= 50.0 && r.rss_max_mib <= 256.0,
                measured: format!(
                    "{:.2}% / {:.1} MiB (max {:.1})",
                    r.cpu_pct, r.rss_mib, r.rss_max_mib
                ),
            });
        }
    }
    out
}

/// The target checks as text.
pub fn targets_table(checks: &[TargetCheck]) -> String {
    let mut t = String::from("\nTargets (docs/benchmarks.md, The targets)\n");
    for c in checks {
        let _ = writeln!(
            t,
            "  [{}] {}\n        {}",
            if c.met { "met" } else { "MISSED" },
            c.target,
            c.measured
        );
    }
    t
}
