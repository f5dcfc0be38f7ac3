//! A network namespace of the process's own, for runs whose sockets must
//! be theirs alone (the API benchmark's `ListenOverflows`, the tests' own
//! 198.18.0.0/15 addresses).

use std::process::Command;

/// Move the calling thread into a new network namespace, then run each of
/// `ip_commands` (`ip ARGS`) in it, e.g. `link set lo up`. Threads and
/// processes it starts afterwards inherit the namespace. Needs root
/// (CAP_SYS_ADMIN and CAP_NET_ADMIN); `Err` says which step failed.
pub fn enter(ip_commands: &[&[&str]]) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare(CLONE_NEWNET): {e} (needs root)"))?;
    for args in ip_commands {
        let out = Command::new("ip")
            .args(*args)
            .output()
            .map_err(|e| format!("ip {}: {e} (iproute2)", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}
