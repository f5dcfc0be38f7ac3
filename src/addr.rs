//! `host:port` addresses of instances and daemons.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The address of a data server or a daemon, as the user wrote it or as a
/// server reported it (`INFO replication`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// IP address or host name.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Why a `host:port` string is not an address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    /// No `:port` part.
    #[error("expected host:port, got {0:?}")]
    MissingPort(String),
    /// The port is not a number in 1..=65535.
    #[error("invalid port in {0:?}")]
    BadPort(String),
    /// The host part is empty.
    #[error("empty host in {0:?}")]
    EmptyHost(String),
}

impl Addr {
    /// Build an address from its parts.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Addr {
            host: host.into(),
            port,
        }
    }
}

impl Addr {
    /// Whether a server reporting `host:port` (a replica's `master_host`,
    /// a master's replica list) means this address: the same text, or the
    /// IP this address's name resolved to when it was last reached. A
    /// server told a name reports it as told; one told an IP, or listing
    /// its replicas, reports IPs.
    pub fn is_reported_as(
        &self,
        resolved: Option<IpAddr>,
        host: Option<&str>,
        port: Option<u16>,
    ) -> bool {
        let (Some(host), Some(port)) = (host, port) else {
            return false;
        };
        port == self.port
            && (host == self.host
                || resolved.is_some_and(|ip| host.parse::<IpAddr>().is_ok_and(|h| h == ip)))
    }

    /// How this address is given to clients and servers: as written with
    /// `announce_hostnames` or when the name's IP is not known yet,
    /// otherwise the IP the name resolved to (`resolved`).
    pub fn announced(&self, resolved: Option<IpAddr>, announce_hostnames: bool) -> Addr {
        match resolved {
            Some(ip) if !announce_hostnames && self.ip().is_none() => {
                Addr::new(ip.to_string(), self.port)
            }
            _ => self.clone(),
        }
    }

    /// The host as an IP, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for Addr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| AddrError::MissingPort(s.to_string()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(AddrError::EmptyHost(s.to_string()));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| AddrError::BadPort(s.to_string()))?;
        Ok(Addr::new(host, port))
    }
}

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let a: Addr = "127.0.0.2:6379".parse().unwrap();
        assert_eq!(a, Addr::new("127.0.0.2", 6379));
        assert_eq!(a.to_string(), "127.0.0.2:6379");
        let v6: Addr = "[::1]:26379".parse().unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.to_string(), "[::1]:26379");
    }

    #[test]
    fn reported_addresses_match_the_name_or_its_ip() {
        let named = Addr::new("redis-a", 6379);
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        assert!(named.is_reported_as(None, Some("redis-a"), Some(6379)));
        assert!(named.is_reported_as(Some(ip), Some("10.0.0.5"), Some(6379)));
        assert!(!named.is_reported_as(None, Some("10.0.0.5"), Some(6379)));
        assert!(!named.is_reported_as(Some(ip), Some("10.0.0.5"), Some(6380)));
        assert!(!named.is_reported_as(Some(ip), Some("10.0.0.6"), Some(6379)));
        assert!(!named.is_reported_as(Some(ip), None, Some(6379)));
        assert_eq!(
            named.announced(Some(ip), false).to_string(),
            "10.0.0.5:6379"
        );
        assert_eq!(named.announced(Some(ip), true), named);
        assert_eq!(named.announced(None, false), named);
        let by_ip = Addr::new("10.0.0.7", 6379);
        assert_eq!(by_ip.announced(Some(ip), false), by_ip);
        assert_eq!(Addr::new("::1", 1).ip(), "::1".parse().ok());
        assert_eq!(named.ip(), None);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            "localhost".parse::<Addr>(),
            Err(AddrError::MissingPort(_))
        ));
        assert!(matches!("h:0".parse::<Addr>(), Err(AddrError::BadPort(_))));
        assert!(matches!(
            "h:70000".parse::<Addr>(),
            Err(AddrError::BadPort(_))
        ));
        assert!(matches!(
            ":80".parse::<Addr>(),
            Err(AddrError::EmptyHost(_))
        ));
    }
}
