//! Small helpers shared by the operations tests (reload, systemd): status
//! documents, picket configs, and log polling.

use std::net::SocketAddr;

use crate::{PicketProcess, free_port, next_loopback_ip};

pub use crate::http_get;

/// `/v1/status` as JSON, or None when the daemon does not answer.
pub fn status(http: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) = http_get(http, "/v1/status").ok()?;
    if code != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

/// Names of the groups in a status document.
pub fn group_names(status: &serde_json::Value) -> Vec<String> {
    status["groups"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .filter_map(|g| g["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One group of a status document.
pub fn group<'a>(status: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    status["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == name)
}

/// The listeners of one single-daemon picket on a fresh loopback address.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// RESP (`listen`).
    pub resp: SocketAddr,
    /// HTTP (`http_listen`).
    pub http: SocketAddr,
}

impl Ports {
    /// Two free ports on a fresh 127.0.0.x address.
    pub fn fresh() -> Ports {
        let ip = next_loopback_ip();
        let resp_port = free_port(&ip);
        let http_port = (0..10)
            .map(|_| free_port(&ip))
            .find(|p| *p != resp_port)
            .expect("two distinct free ports");
        let resp = format!("{ip}:{resp_port}");
        let http = format!("{ip}:{http_port}");
        Ports {
            resp: resp.parse().unwrap(),
            http: http.parse().unwrap(),
        }
    }

    /// The `[daemon]` table of a daemon with id `id`, no peers and its
    /// state in `data_dir`.
    pub fn daemon_table(&self, id: &str, data_dir: &std::path::Path) -> String {
        format!(
            "[daemon]\nid = \"{id}\"\nlisten = \"{}\"\nhttp_listen = \"{}\"\ndata_dir = \"{}\"\n",
            self.resp,
            self.http,
            data_dir.display()
        )
    }
}

/// A `[[group]]` table with quorum 1 (one daemon).
pub fn group_table(name: &str, master: SocketAddr, extra: &str) -> String {
    format!("\n[[group]]\nname = \"{name}\"\nmaster = \"{master}\"\nquorum = 1\n{extra}\n")
}

/// How many lines of picket's captured output contain `needle`.
pub fn log_count(p: &PicketProcess, needle: &str) -> usize {
    p.logs().lines().filter(|l| l.contains(needle)).count()
}
