//! The uid owning the client's end of a loopback TCP connection, asked of the kernel's socket table
//! through `NETLINK_SOCK_DIAG` (what `ss -e` shows): one exact lookup of the connection's addresses and
//! ports, a few microseconds (reading `/proc/net/tcp` costs milliseconds). What SO_PEERCRED gives a Unix
//! socket, for TCP on this host. `None` when the kernel does not answer (another network namespace, no
//! netlink, the client already gone).

use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const INET_DIAG_NOCOOKIE: u32 = !0;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Request {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// `struct inet_diag_msg`, up to the uid.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Reply {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: SockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Message {
    header: NlMsgHdr,
    request: Request,
}

/// The uid of the socket whose local end is `client` and remote end `server` (the daemon's side of the
/// connection seen from the client), if `client` is a loopback address and the kernel knows the socket.
pub fn uid(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let (client, server) = (plain(client), plain(server));
    if !client.ip().is_loopback() {
        return None;
    }
    let (family, src, dst) = match (client.ip(), server.ip()) {
        (IpAddr::V4(c), IpAddr::V4(s)) => (libc::AF_INET, v4(c.octets()), v4(s.octets())),
        (IpAddr::V6(c), IpAddr::V6(s)) => (libc::AF_INET6, c.octets(), s.octets()),
        _ => return None,
    };
    let request = Request {
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        states: !0,
        id: SockId {
            sport: client.port().to_be_bytes(),
            dport: server.port().to_be_bytes(),
            src,
            dst,
            interface: 0,
            cookie: [INET_DIAG_NOCOOKIE; 2],
        },
        ..Request::default()
    };
    ask(request)
}

/// An IPv4-mapped IPv6 address (a dual-stack listener's view of an IPv4 client) as the IPv4 one.
fn plain(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

fn v4(octets: [u8; 4]) -> [u8; 16] {
    let mut a = [0; 16];
    a[..4].copy_from_slice(&octets);
    a
}

fn ask(request: Request) -> Option<u32> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The kernel answers an exact lookup at once; this runs on a call's path, so never wait long for it.
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: setsockopt with a pointer to a timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let message = Message {
        header: NlMsgHdr {
            len: size_of::<Message>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: NLM_F_REQUEST,
            seq: 1,
            pid: 0,
        },
        request,
    };
    // SAFETY: sends the bytes of a plain repr(C) value to the kernel's netlink socket (the default
    // destination of a netlink socket is the kernel).
    let sent = unsafe {
        libc::send(
            fd.as_raw_fd(),
            (&message as *const Message).cast(),
            size_of::<Message>(),
            0,
        )
    };
    if sent != size_of::<Message>() as isize {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: receives into a buffer we own, at most its length.
    let got = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let got = usize::try_from(got).ok()?;
    let need = size_of::<NlMsgHdr>() + size_of::<Reply>();
    if got < need {
        return None; // NLMSG_ERROR (no such socket) is shorter, or a truncated answer.
    }
    // SAFETY: `buf` holds at least `need` initialised bytes; read_unaligned copies plain repr(C) values.
    let (header, reply) = unsafe {
        (
            std::ptr::read_unaligned(buf.as_ptr().cast::<NlMsgHdr>()),
            std::ptr::read_unaligned(buf[size_of::<NlMsgHdr>()..].as_ptr().cast::<Reply>()),
        )
    };
    (header.kind == SOCK_DIAG_BY_FAMILY && header.len as usize >= need).then_some(reply.uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connection_is_owned_by_this_user() {
        if !sock_diag_here() {
            eprintln!("skipped: this kernel has no NETLINK_SOCK_DIAG (the daemon then lends nothing over TCP)");
            return;
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(host) else {
                continue; // no IPv6 loopback here
            };
            let server = listener.local_addr().unwrap();
            let client = std::net::TcpStream::connect(server).unwrap();
            let (_accepted, seen) = listener.accept().unwrap();
            assert_eq!(seen, client.local_addr().unwrap());
            // As the daemon sees it: the client's address and its own.
            assert_eq!(uid(seen, server), Some(me), "{host}");
            // No such connection (a port nobody uses), and a remote address: nothing.
            let closed = SocketAddr::new(seen.ip(), 1);
            assert_eq!(uid(closed, server), None);
        }
        let remote: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        assert_eq!(uid(remote, "10.0.0.1:7070".parse().unwrap()), None);
    }

    /// Whether this kernel has the netlink family at all (a kernel without it refuses the socket).
    fn sock_diag_here() -> bool {
        // SAFETY: socket(2) with constant arguments; closed at once.
        let fd =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG) };
        if fd >= 0 {
            // SAFETY: closes the descriptor just opened.
            unsafe { libc::close(fd) };
        }
        fd >= 0
    }
}
