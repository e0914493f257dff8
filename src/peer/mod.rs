//! Who is calling: the identity a call's resources are charged to and owned by.
//!
//! Input: the connection a call came on (the kernel's peer credentials of a Unix socket, or a TCP
//! peer's address), read once per call from the request's extensions. Output: a [`Peer`], whose
//! [`PeerKey`] keys per-client limits and owns shared-memory arenas.
//!
//! - On a Unix socket a client is a process: its pid, with the process's start time so a reused pid is
//!   another client. [`Peer::is_alive`] says when that process has gone, which is how the arenas of a
//!   SIGKILLed client are reclaimed without waiting for its next request.
//! - A Unix peer whose pid the kernel cannot name in this pid namespace (pid 0) is keyed by its uid.
//! - On TCP a client is its IP address (a reconnect from another port is the same client; clients behind
//!   one address share its limits). Liveness is unknowable there: its arenas expire by time. On loopback
//!   the kernel names the user owning the client's socket ([`Peer::tcp_uid`], `loopback.rs`); that decides
//!   only whether a released shared-memory arena may be lent to it and whom a root daemon gives its
//!   arena files to, never a privilege.
//! - A call with no connection (in-process tests) is [`PeerKey::Local`].

use std::net::IpAddr;

mod link;
mod loopback;

pub use link::{closed_error, connection, Conn, Link, OnLink, Reply};

/// The key limits are counted by and arenas owned by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A process on this host, by pid and start time (clock ticks after boot, from /proc).
    Process { pid: i32, start: u64 },
    /// A local user whose process this pid namespace cannot see.
    User(u32),
    /// A TCP client.
    Address(IpAddr),
    /// No connection (calls made in-process).
    Local,
}

impl PeerKey {
    /// A number for this client, the same for every call it makes (the decode fleet's turns go round
    /// clients by it).
    pub fn client_id(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// One calling client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    pub key: PeerKey,
    /// The peer's uid on a Unix socket.
    pub uid: Option<u32>,
    /// The uid owning the client's end of a loopback TCP connection: only for lending spare arenas and
    /// owning arena files (privileges go by `uid`, which TCP never has).
    pub tcp_uid: Option<u32>,
}

impl Peer {
    /// A Unix-socket peer from its kernel credentials.
    pub fn unix(pid: Option<i32>, uid: u32) -> Peer {
        let key = match pid.filter(|&p| p > 0) {
            Some(pid) => match process_start(pid) {
                Some(start) => PeerKey::Process { pid, start },
                None => {
                    unseen_processes(&format!("/proc/{pid}/stat cannot be read"));
                    PeerKey::User(uid)
                }
            },
            None => {
                unseen_processes("the socket names no process (pid 0: the client is in a PID namespace this daemon does not see)");
                PeerKey::User(uid)
            }
        };
        Peer {
            key,
            uid: Some(uid),
            tcp_uid: None,
        }
    }

    pub fn tcp(ip: IpAddr) -> Peer {
        Peer {
            key: PeerKey::Address(ip),
            uid: None,
            tcp_uid: None,
        }
    }

    pub fn local() -> Peer {
        Peer {
            key: PeerKey::Local,
            uid: None,
            tcp_uid: None,
        }
    }

    /// The peer of a call, from the connection information tonic puts in its extensions.
    pub fn from_extensions(ext: &http::Extensions) -> Peer {
        let (uds, tcp) = match connection(ext) {
            Some((Conn::Uds(u), _)) => (Some(u), None),
            Some((Conn::Tcp(t), _)) => (None, Some(t)),
            None => (None, None),
        };
        if let Some(uds) = uds {
            return match &uds.peer_cred {
                Some(cred) => Peer::unix(cred.pid(), cred.uid()),
                None => Peer::local(),
            };
        }
        match tcp.and_then(|t| t.remote_addr()) {
            Some(addr) => Peer {
                tcp_uid: tcp
                    .and_then(|t| t.local_addr())
                    .and_then(|server| loopback::uid(addr, server)),
                ..Peer::tcp(addr.ip())
            },
            None => Peer::local(),
        }
    }

    /// The local user the client runs as: a Unix socket's uid, or the owner of a loopback TCP socket.
    pub fn user(&self) -> Option<u32> {
        self.uid.or(self.tcp_uid)
    }

    /// Whether the client still runs: `Some(false)` once its process has exited (or its pid now names
    /// another process), `None` when that cannot be known (TCP, unseen pids).
    pub fn is_alive(&self) -> Option<bool> {
        match self.key {
            PeerKey::Process { pid, start } => Some(process_start(pid) == Some(start)),
            _ => None,
        }
    }

    /// The groups file access checks grant this peer's process (its filesystem gid and supplementary
    /// groups, from /proc/PID/status), `None` when no process is known (TCP, unseen pids) or it has
    /// gone (or its pid now names another process).
    pub fn groups(&self) -> Option<Vec<u32>> {
        let PeerKey::Process { pid, .. } = self.key else {
            return None;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        if self.is_alive() != Some(true) {
            return None;
        }
        parse_groups(&status)
    }

    /// For messages and logs: `pid 4242 (uid 1000)`, `10.0.0.7`, `uid 1000`, `in-process`.
    pub fn describe(&self) -> String {
        match &self.key {
            PeerKey::Process { pid, .. } => match self.uid {
                Some(uid) => format!("pid {pid} (uid {uid})"),
                None => format!("pid {pid}"),
            },
            PeerKey::User(uid) => format!("uid {uid}"),
            PeerKey::Address(ip) => ip.to_string(),
            PeerKey::Local => "in-process".into(),
        }
    }
}

/// The filesystem gid (the fourth of `Gid:`) and the `Groups:` of a /proc/PID/status.
fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| rest.split_whitespace().map(str::parse::<u32>))
    };
    let fs_gid = field("Gid:")?.nth(3)?.ok()?;
    let mut groups = vec![fs_gid];
    for g in field("Groups:")? {
        groups.push(g.ok()?);
    }
    Some(groups)
}

/// A process's start time (field 22 of /proc/PID/stat), `None` when there is no such process.
/// Warns once that a Unix-socket client is counted as its user: the daemon cannot see its process (a
/// `/proc` mounted `hidepid=`, systemd's `ProtectProc=invisible`, a PID namespace of its own as a pod
/// without `hostPID`), so every process of that user shares one client's limits. (Also the rare client
/// that exits between connecting and its call.)
fn unseen_processes(why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(%why, "a client's process is not visible to this daemon, so it counts as its user: every process of that user shares one client's limits (a /proc mounted hidepid=, systemd ProtectProc=invisible, or a Kubernetes pod without hostPID: true); warned once");
    }
}

fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': split after the last one.
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so start time (field 22) is the 20th field of the rest.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_peer_lives_as_long_as_its_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let peer = Peer::unix(Some(child.id() as i32), 1000);
        assert!(
            matches!(peer.key, PeerKey::Process { pid, .. } if pid == child.id() as i32),
            "{peer:?}"
        );
        assert_eq!(peer.is_alive(), Some(true));
        assert_eq!(peer.describe(), format!("pid {} (uid 1000)", child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(peer.is_alive(), Some(false));
        // Our own process: its start time parses, and two reads agree.
        let me = Peer::unix(Some(std::process::id() as i32), 0);
        assert_eq!(me.is_alive(), Some(true));
        assert_eq!(me, Peer::unix(Some(std::process::id() as i32), 0));
    }

    #[test]
    fn a_processs_groups_are_its_filesystem_gid_and_supplementary_groups() {
        let status = "Name:\tpython3\nUid:\t65533\t65533\t65533\t65533\nGid:\t100\t101\t102\t103\nFDSize:\t64\nGroups:\t4 27 \nNStgid:\t1\n";
        assert_eq!(parse_groups(status), Some(vec![103, 4, 27]));
        let none = "Gid:\t7\t7\t7\t7\nGroups:\t\n";
        assert_eq!(parse_groups(none), Some(vec![7]));
        assert_eq!(
            parse_groups("Gid:\t7\t7\nGroups:\t\n"),
            None,
            "a short Gid line"
        );
        assert_eq!(parse_groups("Gid:\t7\t7\t7\t7\n"), None, "no Groups line");
        // Our own process, as the kernel says.
        let me = Peer::unix(Some(std::process::id() as i32), 0);
        // SAFETY: getegid has no preconditions.
        let egid = unsafe { libc::getegid() };
        assert!(me.groups().unwrap().contains(&egid));
        assert_eq!(Peer::tcp("10.1.2.3".parse().unwrap()).groups(), None);
    }

    #[test]
    fn unseen_pids_fall_back_to_the_user_and_tcp_to_the_address() {
        assert_eq!(Peer::unix(Some(0), 7).key, PeerKey::User(7));
        assert_eq!(Peer::unix(None, 7).key, PeerKey::User(7));
        assert_eq!(Peer::unix(Some(0), 7).is_alive(), None);
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(Peer::tcp(ip).key, PeerKey::Address(ip));
        assert_eq!(Peer::tcp(ip).is_alive(), None);
        assert_eq!(
            Peer::from_extensions(&http::Extensions::new()).key,
            PeerKey::Local
        );
    }
}
