//! Who may run what on the RESP listener: users with roles (Redis ACL
//! users, `AUTH user password`), the `default` user (`AUTH password`, or
//! no `AUTH` at all when it has no password), and the permission each
//! command needs.
//!
//! | Permission | Commands | Roles |
//! |---|---|---|
//! | connection | `PING`, `AUTH`, `HELLO`, `QUIT`, `RESET`, `CLIENT` (but `KILL`), `COMMAND`, unknown commands | every role |
//! | read | `INFO`, `ROLE`, pub/sub, `SENTINEL` read-only subcommands, `MYID`, `HELP` | client, operator, peer, all |
//! | operate | `SENTINEL FAILOVER`, `RESET`, `SIMULATE-FAILURE`, `PICKET FAILOVER`, `PICKET SIMULATE-FAILURE`, `CLIENT KILL` | operator, all |
//! | peer | `PICKET IS-DOWN`, `PICKET HELLO`, `SENTINEL IS-MASTER-DOWN-BY-ADDR` | peer, all |
//!
//! `CLIENT KILL` is an operator's: a read-only credential must not be able
//! to cut the links between the daemons.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{DaemonConfig, Role};

/// What a command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Nothing beyond being logged in.
    Connection,
    /// Reading the state.
    Read,
    /// Changing it (failover, reset, disconnecting clients, crash tests).
    Operate,
    /// The peer protocol: questions and votes between daemons.
    Peer,
}

/// Whether `role` grants `p`.
pub fn allows(role: Role, p: Permission) -> bool {
    match p {
        Permission::Connection => role != Role::None,
        Permission::Read => matches!(role, Role::Client | Role::Operator | Role::Peer | Role::All),
        Permission::Operate => matches!(role, Role::Operator | Role::All),
        Permission::Peer => matches!(role, Role::Peer | Role::All),
    }
}

/// The permission `cmd` (upper case) with its first argument `sub` needs.
/// Unknown commands and subcommands need only a login: they get their own
/// error, as in Redis, whose ACL check comes after the command lookup.
pub fn needed(cmd: &str, sub: Option<&str>) -> Permission {
    let sub = sub.map(str::to_ascii_lowercase);
    let sub = sub.as_deref();
    match cmd {
        "INFO" | "ROLE" | "SUBSCRIBE" | "PSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" => {
            Permission::Read
        }
        "CLIENT" if sub == Some("kill") => Permission::Operate,
        "SENTINEL" => match sub {
            Some(
                "masters"
                | "primaries"
                | "master"
                | "primary"
                | "replicas"
                | "slaves"
                | "sentinels"
                | "get-master-addr-by-name"
                | "get-primary-addr-by-name"
                | "ckquorum"
                | "myid"
                | "help",
            ) => Permission::Read,
            Some("failover" | "reset" | "simulate-failure") => Permission::Operate,
            Some("is-master-down-by-addr" | "is-primary-down-by-addr") => Permission::Peer,
            _ => Permission::Connection,
        },
        "PICKET" => match sub {
            Some("is-down" | "hello") => Permission::Peer,
            Some("failover" | "simulate-failure") => Permission::Operate,
            _ => Permission::Connection,
        },
        _ => Permission::Connection,
    }
}

/// Redis' refusal: `NOPERM User <user> has no permissions to run the
/// '<cmd>' command` (`cmd` as `sentinel|failover`).
pub fn noperm(user: &str, cmd: &str) -> String {
    format!("NOPERM User {user} has no permissions to run the '{cmd}' command")
}

/// Who a connection is logged in as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user name (`default` for `AUTH <password>`).
    pub name: Arc<str>,
    /// What it may run.
    pub role: Role,
}

/// One user that logs in with a password.
#[derive(Clone)]
struct User {
    name: Arc<str>,
    password: String,
    role: Role,
}

/// The listener's users, read once at start.
#[derive(Clone)]
pub struct Users {
    default_password: Option<String>,
    default_role: Role,
    users: Vec<User>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passwords.
        f.debug_struct("Users")
            .field("default_password", &self.default_password.is_some())
            .field("default_role", &self.default_role)
            .field(
                "users",
                &self.users.iter().map(|u| &*u.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why `AUTH` failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// `AUTH <password>` while the default user has no password (Redis'
    /// text for it).
    NoDefaultPassword,
    /// Wrong user, wrong password, or a disabled user.
    WrongPass,
}

impl AuthError {
    /// The error reply's text, as Redis words it.
    pub fn text(&self) -> &'static str {
        match self {
            AuthError::NoDefaultPassword => {
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
            }
            AuthError::WrongPass => "WRONGPASS invalid username-password pair or user is disabled.",
        }
    }
}

/// A comparison whose time does not depend on where the inputs differ.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Users {
    /// The users of `d`: the default user from `password_file` and
    /// `default_role`, the others from `[[daemon.user]]` with the
    /// passwords already read by the caller (`passwords[i]` for
    /// `d.users[i]`).
    pub fn new(
        d: &DaemonConfig,
        default_password: Option<String>,
        passwords: Vec<String>,
    ) -> Users {
        Users {
            default_password,
            default_role: d.default_role,
            users: d
                .users
                .iter()
                .zip(passwords)
                .map(|(u, password)| User {
                    name: Arc::from(u.name.as_str()),
                    password,
                    role: u.role,
                })
                .collect(),
        }
    }

    /// Only a default user, with full access behind `password` (when
    /// set): picket before users existed.
    pub fn single_password(password: Option<String>) -> Users {
        Users {
            default_password: password,
            default_role: Role::All,
            users: Vec::new(),
        }
    }

    /// Who a new connection is before any `AUTH`: the default user when it
    /// needs no password (Redis' `nopass`), else nobody.
    pub fn initial(&self) -> Option<Identity> {
        (self.default_password.is_none() && self.default_role != Role::None).then(|| Identity {
            name: Arc::from("default"),
            role: self.default_role,
        })
    }

    /// Whether `name` is a user (`default` always is).
    pub fn exists(&self, name: &str) -> bool {
        name == "default" || self.users.iter().any(|u| *u.name == *name)
    }

    /// `AUTH [user] password`.
    pub fn authenticate(&self, user: Option<&str>, password: &str) -> Result<Identity, AuthError> {
        match user {
            None | Some("default") => {
                let Some(pw) = &self.default_password else {
                    return Err(AuthError::NoDefaultPassword);
                };
                if self.default_role != Role::None && same_secret(pw, password) {
                    Ok(Identity {
                        name: Arc::from("default"),
                        role: self.default_role,
                    })
                } else {
                    Err(AuthError::WrongPass)
                }
            }
            Some(name) => {
                // Every user's password is compared, so that the time taken
                // does not tell whether the name exists.
                let mut found = None;
                for u in &self.users {
                    if same_secret(&u.password, password) && *u.name == *name {
                        found = Some(Identity {
                            name: u.name.clone(),
                            role: u.role,
                        });
                    }
                }
                found.ok_or(AuthError::WrongPass)
            }
        }
    }
}

/// Failed `AUTH` attempts a connection may make without delay (typos).
pub const FREE_AUTH_FAILURES: u32 = 3;
/// After this many failed attempts the connection is closed.
pub const MAX_AUTH_FAILURES: u32 = 10;
/// Longest delay of one failed attempt's reply.
pub const MAX_AUTH_DELAY: Duration = Duration::from_secs(2);

/// How long the reply to the `n`-th failed `AUTH` (1-based) of one
/// connection waits: nothing for the first [`FREE_AUTH_FAILURES`], then
/// 250 ms doubling up to [`MAX_AUTH_DELAY`], so that one connection tries
/// at most a few passwords a second.
pub fn auth_delay(n: u32) -> Duration {
    if n <= FREE_AUTH_FAILURES {
        return Duration::ZERO;
    }
    let exp = (n - FREE_AUTH_FAILURES - 1).min(8);
    (Duration::from_millis(250) * 2u32.pow(exp)).min(MAX_AUTH_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> Users {
        let d: DaemonConfig = toml::from_str(
            "default_role = \"client\"\n[[user]]\nname = \"ops\"\nrole = \"operator\"\npassword_file = \"/x\"\n[[user]]\nname = \"picket\"\nrole = \"peer\"\npassword_file = \"/y\"\n",
        )
        .unwrap();
        Users::new(
            &d,
            Some("shared".into()),
            vec!["opspw".into(), "peerpw".into()],
        )
    }

    #[test]
    fn auth_as_redis_acl_users() {
        let u = users();
        assert_eq!(u.initial(), None);
        assert_eq!(u.authenticate(None, "shared").unwrap().role, Role::Client);
        assert_eq!(
            u.authenticate(Some("default"), "shared").unwrap().role,
            Role::Client
        );
        let ops = u.authenticate(Some("ops"), "opspw").unwrap();
        assert_eq!((&*ops.name, ops.role), ("ops", Role::Operator));
        assert_eq!(
            u.authenticate(Some("ops"), "peerpw"),
            Err(AuthError::WrongPass)
        );
        assert_eq!(
            u.authenticate(Some("nobody"), "opspw"),
            Err(AuthError::WrongPass)
        );
        assert_eq!(u.authenticate(None, "opspw"), Err(AuthError::WrongPass));
        let open = Users::single_password(None);
        assert_eq!(open.initial().map(|i| i.role), Some(Role::All));
        assert_eq!(
            open.authenticate(None, "x"),
            Err(AuthError::NoDefaultPassword)
        );
    }

    #[test]
    fn roles_and_permissions() {
        use Permission::*;
        assert_eq!(needed("SENTINEL", Some("FAILOVER")), Operate);
        assert_eq!(needed("SENTINEL", Some("get-master-addr-by-name")), Read);
        assert_eq!(needed("SENTINEL", Some("IS-MASTER-DOWN-BY-ADDR")), Peer);
        assert_eq!(needed("SENTINEL", Some("nope")), Connection);
        assert_eq!(needed("PICKET", Some("is-down")), Peer);
        assert_eq!(needed("PICKET", Some("FAILOVER")), Operate);
        assert_eq!(needed("CLIENT", Some("kill")), Operate);
        assert_eq!(needed("CLIENT", Some("list")), Connection);
        assert_eq!(needed("SUBSCRIBE", Some("+switch-master")), Read);
        assert!(allows(Role::Client, Read) && !allows(Role::Client, Operate));
        assert!(!allows(Role::Client, Peer) && !allows(Role::Operator, Peer));
        assert!(allows(Role::Peer, Peer) && !allows(Role::Peer, Operate));
        assert!(
            [Connection, Read, Operate, Peer]
                .iter()
                .all(|p| allows(Role::All, *p))
        );
        assert!(!allows(Role::None, Connection));
        assert_eq!(
            noperm("app", "sentinel|failover"),
            "NOPERM User app has no permissions to run the 'sentinel|failover' command"
        );
    }

    #[test]
    fn failed_auths_slow_down() {
        assert_eq!(auth_delay(3), Duration::ZERO);
        assert_eq!(auth_delay(4), Duration::from_millis(250));
        assert_eq!(auth_delay(5), Duration::from_millis(500));
        assert_eq!(auth_delay(9), MAX_AUTH_DELAY);
        assert_eq!(auth_delay(u32::MAX), MAX_AUTH_DELAY);
    }
}
