//! A stand-in for many Redis instances in one tokio process: each instance
//! is a listener on its own 127.x.y.z address that answers what a failover
//! manager sends while it only watches: `PING`, `INFO` (a full Redis 7.0
//! reply, about 4 KB, as a master with replicas or as a replica), `ROLE`,
//! `CLIENT ...`, `AUTH`, `SELECT`, and real per-instance pub/sub
//! (`SUBSCRIBE` / `PUBLISH`), because redis-sentinel exchanges its hello
//! messages through every instance and reconnects a silent pub/sub link.
//!
//! The instances are grouped: the first of each group is a master whose
//! INFO lists the others as online replicas; they report it as their master
//! with the link up. Nothing ever changes, so managers just keep probing.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use picket::resp::RespCodec;
use redis_protocol::resp2::types::BytesFrame;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_util::codec::FramedRead;

/// Which addresses form which group (the first of each is the master).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Layout {
    /// `ip:port` per instance, grouped.
    pub groups: Vec<Vec<String>>,
}

/// The address of instance `i` under `net` (`A.B`): `A.B.C.D` with D in
/// 2..=251, so that every instance has an address of its own.
pub fn target_ip(net: &str, i: usize) -> String {
    format!("{net}.{}.{}", i / 250, i % 250 + 2)
}

struct Instance {
    info: Bytes,
    /// `INFO replication`: that section alone, as redis-server answers.
    info_replication: Bytes,
    role: Bytes,
    hello: broadcast::Sender<(Bytes, Bytes)>,
}

/// Bind `count` instances (the `first`-th on, for the addresses) in groups
/// of `per_group`, write the layout as JSON to `layout_out`, then serve
/// until killed.
pub async fn serve(
    first: usize,
    count: usize,
    per_group: usize,
    net: &str,
    layout_out: &Path,
) -> anyhow::Result<()> {
    let per_group = per_group.max(1);
    let mut listeners = Vec::with_capacity(count);
    let mut addrs = Vec::with_capacity(count);
    for i in first..first + count {
        let ip = target_ip(net, i);
        let ipaddr: std::net::IpAddr = ip.parse().with_context(|| format!("bad address {ip}"))?;
        anyhow::ensure!(ipaddr.is_loopback(), "{ip} is not a loopback address");
        let l = TcpListener::bind((ip.as_str(), 0))
            .await
            .with_context(|| format!("bind {ip}:0"))?;
        addrs.push(format!("{ip}:{}", l.local_addr()?.port()));
        listeners.push(l);
    }
    let groups: Vec<Vec<String>> = addrs.chunks(per_group).map(<[String]>::to_vec).collect();
    let layout = Layout { groups };
    let tmp = layout_out.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&layout)?)?;
    std::fs::rename(&tmp, layout_out)?;
    let mut listeners = listeners.into_iter();
    for (gi, g) in layout.groups.iter().enumerate() {
        for k in 0..g.len() {
            let Some(l) = listeners.next() else { break };
            tokio::spawn(accept_loop(l, Arc::new(instance(gi * per_group + k, g, k))));
        }
    }
    std::future::pending::<()>().await;
    Ok(())
}

async fn accept_loop(l: TcpListener, inst: Arc<Instance>) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(connection(s, inst.clone()));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

fn split(addr: &str) -> (&str, &str) {
    addr.rsplit_once(':').unwrap_or((addr, "0"))
}

fn run_id(n: usize) -> String {
    // 40 hex digits, distinct per instance.
    format!("{:040x}", (n as u128 + 1) * 0x9e37_79b9_7f4a_7c15)
}

const OFFSET: u64 = 1_048_576;

fn instance(n: usize, group: &[String], k: usize) -> Instance {
    let me = &group[k];
    let (_, port) = split(me);
    let mut repl = String::new();
    let role = if k == 0 {
        let _ = write!(
            repl,
            "role:master\r\nconnected_slaves:{}\r\n",
            group.len() - 1
        );
        for (j, r) in group[1..].iter().enumerate() {
            let (h, p) = split(r);
            let _ = write!(
                repl,
                "slave{j}:ip={h},port={p},state=online,offset={OFFSET},lag=0\r\n"
            );
        }
        let mut rb = BytesMut::new();
        array(&mut rb, 3);
        bulk(&mut rb, b"master");
        int(&mut rb, OFFSET as i64);
        array(&mut rb, group.len() - 1);
        for r in &group[1..] {
            let (h, p) = split(r);
            array(&mut rb, 3);
            bulk(&mut rb, h.as_bytes());
            bulk(&mut rb, p.as_bytes());
            bulk(&mut rb, OFFSET.to_string().as_bytes());
        }
        rb.freeze()
    } else {
        let (h, p) = split(&group[0]);
        let _ = write!(
            repl,
            "role:slave\r\nmaster_host:{h}\r\nmaster_port:{p}\r\nmaster_link_status:up\r\n\
             master_last_io_seconds_ago:1\r\nmaster_sync_in_progress:0\r\n\
             slave_read_repl_offset:{OFFSET}\r\nslave_repl_offset:{OFFSET}\r\n\
             slave_priority:100\r\nslave_read_only:1\r\nreplica_announced:1\r\nconnected_slaves:0\r\n"
        );
        let mut rb = BytesMut::new();
        array(&mut rb, 5);
        bulk(&mut rb, b"slave");
        bulk(&mut rb, h.as_bytes());
        int(&mut rb, p.parse().unwrap_or(0));
        bulk(&mut rb, b"connected");
        int(&mut rb, OFFSET as i64);
        rb.freeze()
    };
    let _ = write!(
        repl,
        "master_failover_state:no-failover\r\nmaster_replid:{rid}\r\n\
         master_replid2:0000000000000000000000000000000000000000\r\n\
         master_repl_offset:{OFFSET}\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:1\r\n\
         repl_backlog_size:1048576\r\nrepl_backlog_first_byte_offset:1\r\nrepl_backlog_histlen:{OFFSET}\r\n",
        rid = run_id(n + 1_000_000)
    );
    let text = format!(
        "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\n\
         redis_build_id:ae4d7c971a948f0\r\nredis_mode:standalone\r\nos:Linux x86_64\r\narch_bits:64\r\n\
         monotonic_clock:POSIX clock_gettime\r\nmultiplexing_api:epoll\r\natomicvar_api:c11-builtin\r\n\
         gcc_version:12.2.0\r\nprocess_id:{pid}\r\nprocess_supervised:no\r\nrun_id:{rid}\r\n\
         tcp_port:{port}\r\nserver_time_usec:1796095445606290\r\nuptime_in_seconds:3600\r\n\
         uptime_in_days:0\r\nhz:10\r\nconfigured_hz:10\r\nlru_clock:933333\r\n\
         executable:/usr/bin/redis-server\r\nconfig_file:\r\nio_threads_active:0\r\n\r\n\
         {OTHER_SECTIONS}# Replication\r\n{repl}\r\n{TAIL_SECTIONS}",
        pid = 1000 + n,
        rid = run_id(n),
    );
    let mut info = BytesMut::new();
    bulk(&mut info, text.as_bytes());
    let mut info_replication = BytesMut::new();
    bulk(
        &mut info_replication,
        format!("# Replication\r\n{repl}").as_bytes(),
    );
    let (hello, _) = broadcast::channel(64);
    Instance {
        info: info.freeze(),
        info_replication: info_replication.freeze(),
        role,
        hello,
    }
}

/// The sections a manager does not read, as redis-server 7.0 sends them, so
/// that every INFO reply has a realistic size.
const OTHER_SECTIONS: &str = "# Clients\r\nconnected_clients:3\r\ncluster_connections:0\r\n\
maxclients:10000\r\nclient_recent_max_input_buffer:20480\r\nclient_recent_max_output_buffer:0\r\n\
blocked_clients:0\r\ntracking_clients:0\r\nclients_in_timeout_table:0\r\n\r\n\
# Memory\r\nused_memory:917088\r\nused_memory_human:895.59K\r\nused_memory_rss:12185600\r\n\
used_memory_rss_human:11.62M\r\nused_memory_peak:917088\r\nused_memory_peak_human:895.59K\r\n\
used_memory_peak_perc:100.00%\r\nused_memory_overhead:876456\r\nused_memory_startup:876256\r\n\
used_memory_dataset:40632\r\nused_memory_dataset_perc:99.51%\r\nallocator_allocated:1690848\r\n\
allocator_active:1826816\r\nallocator_resident:4497408\r\ntotal_system_memory:25276059648\r\n\
total_system_memory_human:23.54G\r\nused_memory_lua:32768\r\nused_memory_vm_eval:32768\r\n\
used_memory_lua_human:32.00K\r\nused_memory_scripts_eval:0\r\nnumber_of_cached_scripts:0\r\n\
number_of_functions:0\r\nnumber_of_libraries:0\r\nused_memory_vm_functions:33792\r\n\
used_memory_vm_total:66560\r\nused_memory_vm_total_human:65.00K\r\nused_memory_functions:200\r\n\
used_memory_scripts:200\r\nused_memory_scripts_human:200B\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\n\
maxmemory_policy:noeviction\r\nallocator_frag_ratio:1.08\r\nallocator_frag_bytes:135968\r\n\
allocator_rss_ratio:2.46\r\nallocator_rss_bytes:2670592\r\nrss_overhead_ratio:2.71\r\n\
rss_overhead_bytes:7688192\r\nmem_fragmentation_ratio:13.90\r\nmem_fragmentation_bytes:11309136\r\n\
mem_not_counted_for_evict:0\r\nmem_replication_backlog:1048592\r\nmem_total_replication_buffers:0\r\n\
mem_clients_slaves:0\r\nmem_clients_normal:0\r\nmem_cluster_links:0\r\nmem_aof_buffer:0\r\n\
mem_allocator:jemalloc-5.3.0\r\nactive_defrag_running:0\r\nlazyfree_pending_objects:0\r\n\
lazyfreed_objects:0\r\n\r\n\
# Persistence\r\nloading:0\r\nasync_loading:0\r\ncurrent_cow_peak:0\r\ncurrent_cow_size:0\r\n\
current_cow_size_age:0\r\ncurrent_fork_perc:0.00\r\ncurrent_save_keys_processed:0\r\n\
current_save_keys_total:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:0\r\n\
rdb_last_save_time:1796095443\r\nrdb_last_bgsave_status:ok\r\nrdb_last_bgsave_time_sec:-1\r\n\
rdb_current_bgsave_time_sec:-1\r\nrdb_saves:0\r\nrdb_last_cow_size:0\r\nrdb_last_load_keys_expired:0\r\n\
rdb_last_load_keys_loaded:0\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\naof_rewrite_scheduled:0\r\n\
aof_last_rewrite_time_sec:-1\r\naof_current_rewrite_time_sec:-1\r\naof_last_bgrewrite_status:ok\r\n\
aof_rewrites:0\r\naof_rewrites_consecutive_failures:0\r\naof_last_write_status:ok\r\n\
aof_last_cow_size:0\r\nmodule_fork_in_progress:0\r\nmodule_fork_last_cow_size:0\r\n\r\n\
# Stats\r\ntotal_connections_received:12\r\ntotal_commands_processed:5000\r\n\
instantaneous_ops_per_sec:5\r\ntotal_net_input_bytes:140000\r\ntotal_net_output_bytes:2000000\r\n\
total_net_repl_input_bytes:0\r\ntotal_net_repl_output_bytes:0\r\ninstantaneous_input_kbps:0.10\r\n\
instantaneous_output_kbps:4.00\r\ninstantaneous_input_repl_kbps:0.00\r\n\
instantaneous_output_repl_kbps:0.00\r\nrejected_connections:0\r\nsync_full:1\r\nsync_partial_ok:0\r\n\
sync_partial_err:0\r\nexpired_keys:0\r\nexpired_stale_perc:0.00\r\nexpired_time_cap_reached_count:0\r\n\
expire_cycle_cpu_milliseconds:0\r\nevicted_keys:0\r\nevicted_clients:0\r\n\
total_eviction_exceeded_time:0\r\ncurrent_eviction_exceeded_time:0\r\nkeyspace_hits:0\r\n\
keyspace_misses:0\r\npubsub_channels:1\r\npubsub_patterns:0\r\npubsubshard_channels:0\r\n\
latest_fork_usec:0\r\ntotal_forks:0\r\nmigrate_cached_sockets:0\r\nslave_expires_tracked_keys:0\r\n\
active_defrag_hits:0\r\nactive_defrag_misses:0\r\nactive_defrag_key_hits:0\r\n\
active_defrag_key_misses:0\r\ntotal_active_defrag_time:0\r\ncurrent_active_defrag_time:0\r\n\
tracking_total_keys:0\r\ntracking_total_items:0\r\ntracking_total_prefixes:0\r\n\
unexpected_error_replies:0\r\ntotal_error_replies:0\r\ndump_payload_sanitizations:0\r\n\
total_reads_processed:5000\r\ntotal_writes_processed:5000\r\nio_threaded_reads_processed:0\r\n\
io_threaded_writes_processed:0\r\nreply_buffer_shrinks:0\r\nreply_buffer_expands:0\r\n\r\n";

/// The sections after Replication.
const TAIL_SECTIONS: &str = "# CPU\r\nused_cpu_sys:0.004959\r\nused_cpu_user:0.009918\r\n\
used_cpu_sys_children:0.000000\r\nused_cpu_user_children:0.000000\r\n\
used_cpu_sys_main_thread:0.004939\r\nused_cpu_user_main_thread:0.009878\r\n\r\n\
# Modules\r\n\r\n# Errorstats\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\n";

fn array(b: &mut BytesMut, n: usize) {
    b.put_slice(format!("*{n}\r\n").as_bytes());
}

fn bulk(b: &mut BytesMut, s: &[u8]) {
    b.put_slice(format!("${}\r\n", s.len()).as_bytes());
    b.put_slice(s);
    b.put_slice(b"\r\n");
}

fn int(b: &mut BytesMut, i: i64) {
    b.put_slice(format!(":{i}\r\n").as_bytes());
}

fn simple(b: &mut BytesMut, s: &str) {
    b.put_slice(format!("+{s}\r\n").as_bytes());
}

fn arg(f: &BytesFrame) -> Option<Bytes> {
    match f {
        BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Some(b.clone()),
        _ => None,
    }
}

async fn connection(s: TcpStream, inst: Arc<Instance>) {
    let (rd, mut wr) = s.into_split();
    let mut frames = FramedRead::new(rd, RespCodec::default());
    let mut subscribed: HashSet<Bytes> = HashSet::new();
    let mut rx: Option<broadcast::Receiver<(Bytes, Bytes)>> = None;
    let mut out = BytesMut::with_capacity(8192);
    loop {
        let msg = async {
            match rx.as_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            f = frames.next() => {
                let Some(Ok(BytesFrame::Array(parts))) = f else { return };
                let args: Vec<Bytes> = parts.iter().filter_map(arg).collect();
                if args.is_empty() {
                    continue;
                }
                let quit = reply(&inst, &args, &mut subscribed, &mut rx, &mut out);
                if wr.write_all(&out).await.is_err() || quit {
                    return;
                }
                out.clear();
            }
            m = msg => match m {
                Ok((ch, payload)) if subscribed.contains(&ch) => {
                    array(&mut out, 3);
                    bulk(&mut out, b"message");
                    bulk(&mut out, &ch);
                    bulk(&mut out, &payload);
                    if wr.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// Answer one command into `out`; returns true when the connection should
/// close (QUIT).
fn reply(
    inst: &Instance,
    args: &[Bytes],
    subscribed: &mut HashSet<Bytes>,
    rx: &mut Option<broadcast::Receiver<(Bytes, Bytes)>>,
    out: &mut BytesMut,
) -> bool {
    let cmd = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    match cmd.as_str() {
        "PING" if rx.is_some() => {
            array(out, 2);
            bulk(out, b"pong");
            bulk(out, args.get(1).map(|b| &b[..]).unwrap_or(b""));
        }
        "PING" => match args.get(1) {
            Some(m) => bulk(out, m),
            None => simple(out, "PONG"),
        },
        "INFO" => match args.get(1).map(|a| a.to_ascii_lowercase()) {
            Some(section) if section == b"replication" => out.put_slice(&inst.info_replication),
            // Other single sections are not asked for by either manager.
            _ => out.put_slice(&inst.info),
        },
        "ROLE" => out.put_slice(&inst.role),
        "SUBSCRIBE" => {
            if rx.is_none() {
                *rx = Some(inst.hello.subscribe());
            }
            for ch in &args[1..] {
                subscribed.insert(ch.clone());
                array(out, 3);
                bulk(out, b"subscribe");
                bulk(out, ch);
                int(out, subscribed.len() as i64);
            }
        }
        "PUBLISH" if args.len() == 3 => {
            let n = inst
                .hello
                .send((args[1].clone(), args[2].clone()))
                .unwrap_or(0);
            int(out, n as i64);
        }
        "CLIENT" => {
            let sub = args
                .get(1)
                .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
                .unwrap_or_default();
            match sub.as_str() {
                "KILL" => int(out, 0),
                "ID" => int(out, 1),
                _ => simple(out, "OK"),
            }
        }
        "AUTH" | "SELECT" | "CONFIG" | "SCRIPT" | "MULTI" | "READONLY" => simple(out, "OK"),
        "EXEC" | "COMMAND" => array(out, 0),
        "QUIT" => {
            simple(out, "OK");
            return true;
        }
        _ => out.put_slice(
            format!(
                "-ERR unknown command '{}'\r\n",
                String::from_utf8_lossy(&args[0])
            )
            .as_bytes(),
        ),
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_and_distinct() {
        let a: HashSet<String> = (0..1000).map(|i| target_ip("127.78", i)).collect();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|ip| {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            ip.is_loopback()
        }));
    }

    #[test]
    fn master_and_replica_info() {
        let g = vec!["127.78.0.2:7000".to_string(), "127.78.0.3:7001".to_string()];
        let m = instance(0, &g, 0);
        let text = String::from_utf8_lossy(&m.info);
        assert!(text.contains("role:master\r\nconnected_slaves:1\r\n"));
        assert!(text.contains("slave0:ip=127.78.0.3,port=7001,state=online"));
        assert!(text.contains("tcp_port:7000\r\n"));
        assert!(text.len() > 3000, "INFO should have a realistic size");
        let repl = String::from_utf8_lossy(&m.info_replication);
        assert!(repl.contains("# Replication\r\nrole:master\r\n"));
        assert!(!repl.contains("# Server") && !repl.contains("# Memory"));
        let r = instance(1, &g, 1);
        let text = String::from_utf8_lossy(&r.info);
        assert!(text.contains("role:slave\r\nmaster_host:127.78.0.2\r\nmaster_port:7000\r\n"));
        assert!(text.contains("master_link_status:up"));
        // The bulk header matches the body length.
        let body_start = text.find("\r\n").unwrap() + 2;
        let declared: usize = text[1..body_start - 2].parse().unwrap();
        assert_eq!(declared, text.len() - body_start - 2);
    }
}
