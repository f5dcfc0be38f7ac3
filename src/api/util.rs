//! Helpers every command file uses: argument text, Redis' error texts for
//! a wrong arity or an unknown subcommand, `HELP` replies.

use bytes::Bytes;

use super::reply::Reply;

/// The Redis version picket reports (`HELLO`, `INFO server`): the command
/// surface it copies is Redis Sentinel 7.2's.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// An argument as text (invalid UTF-8 replaced).
pub(crate) fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `ERR wrong number of arguments for '<cmd>' command` (`cmd` lower case,
/// `sentinel|master` style for subcommands).
pub fn arity(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_lowercase()
    ))
}

/// `ERR unknown subcommand '<sub>'. Try <CMD> HELP.`
pub fn unknown_sub(cmd: &str, sub: &str) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        clip(sub),
        cmd.to_uppercase()
    ))
}

/// Cap what is echoed back from the client in an error.
pub(crate) fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(128).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}

/// `HELP` lines as a reply.
pub fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::Simple((*l).into())).collect())
}
