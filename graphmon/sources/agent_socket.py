"""Where the agent's socket lives and who may connect to it.

Without a path the socket lives in a private directory (0700); with one (a volume shared with the
engine) its directory must exist. Every connection's peer is checked against a
:class:`PeerPolicy` (SO_PEERCRED, SO_PEERGROUPS): the agent's own uid, listed uids, or members
of listed groups (then the socket is 0660 and belongs to that group); anyone else is refused
before a byte is read (graphmon.sources.remote counts and logs it, and tells the peer why).
"""

from __future__ import annotations

import array
import errno
import logging
import os
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass
from typing import Iterable, Optional

log = logging.getLogger("graphmon.agent")
_UCRED = struct.Struct("3i")  # pid, uid, gid
ALLOW_UIDS_ENV = "GRAPHMON_AGENT_ALLOW_UIDS"
ALLOW_GIDS_ENV = "GRAPHMON_AGENT_ALLOW_GIDS"
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python's socket module lacks the name
MAX_REFUSAL_LOGS = 64  # distinct refused (uid, gid, groups) logged at WARNING; the rest at DEBUG


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (Linux SO_PEERCRED).
    The pid is 0 when the peer is in another pid namespace (another container of the pod)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


def peer_groups(conn: socket.socket) -> tuple[int, ...]:
    """Supplementary groups of the peer (SO_PEERGROUPS), () where the kernel cannot say. A
    Kubernetes pod's fsGroup is a supplementary group of every container, never the primary."""
    for size in (4 * 64, 4 * 65536):
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as e:
            if e.errno == errno.ERANGE:
                continue  # more groups than the buffer holds: ask again with room for NGROUPS_MAX
            return ()
        return tuple(array.array("I", raw[: len(raw) - len(raw) % 4]))
    return ()


def parse_ids(text: str, source: str) -> tuple[int, ...]:
    """``"0, 1000"`` -> (0, 1000). ValueError naming ``source`` (the flag or variable) otherwise."""
    out = []
    for part in text.replace(",", " ").split():
        if not part.isdigit() or int(part) > 0xFFFFFFFE:  # (uid_t)-1 means "no change", never an id
            raise ValueError(f"{source}: {part!r} is not a numeric id")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class PeerPolicy:
    """Who may connect to the agent: its own uid always, the listed ``uids``, and processes that
    have one of ``gids`` as primary or supplementary group. With ``gids`` the socket is 0660 and
    belongs to ``gids[0]``, so the kernel lets that group's members connect at all."""

    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()

    @classmethod
    def from_env(cls, environ=None, uids: Optional[str] = None, gids: Optional[str] = None) -> "PeerPolicy":
        """From flags' text (``uids``/``gids``), else GRAPHMON_AGENT_ALLOW_UIDS / _GIDS."""
        env = os.environ if environ is None else environ
        u = uids if uids is not None else env.get(ALLOW_UIDS_ENV, "")
        g = gids if gids is not None else env.get(ALLOW_GIDS_ENV, "")
        return cls(parse_ids(u, "--allow-uid" if uids is not None else ALLOW_UIDS_ENV),
                   parse_ids(g, "--allow-gid" if gids is not None else ALLOW_GIDS_ENV))

    def allows(self, uid: int, gid: int, groups: Iterable[int] = ()) -> bool:
        if uid == os.getuid() or uid in self.uids:
            return True
        return bool(self.gids) and (gid in self.gids or any(g in self.gids for g in groups))

    def describe(self) -> str:
        who = [f"uid {u}" for u in dict.fromkeys((os.getuid(), *self.uids))]
        who += [f"group {g}" for g in self.gids]
        return ", ".join(who)

    def hint(self, uid: int) -> str:
        """What would let a refused peer in."""
        group = (f"run the process with group {self.gids[0]} (Kubernetes: fsGroup or supplementalGroups {self.gids[0]})"
                 if self.gids else "give the agent --allow-gid GID (GRAPHMON_AGENT_ALLOW_GIDS, e.g. the pod's fsGroup) "
                 "and the process that group")
        return f"start the agent with --allow-uid {uid} ({ALLOW_UIDS_ENV}={uid}), or {group}"


def private_socket_path(prefix: str = "graphmon-agent-") -> str:
    """A socket path inside a fresh 0700 directory (mkdtemp creates it 0700)."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o700)
    return os.path.join(d, "agent.sock")


def _remove_stale_socket(path: str) -> None:
    """Unlink a socket left by an agent that is gone; refuse to touch anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a socket (left as it is)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # nobody listens: stale
    except PermissionError:
        raise PermissionError(errno.EACCES, f"{path} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}) "
                              "and this agent cannot tell whether it is still in use: remove it, or run the agent "
                              "as that user") from None
    except OSError:
        raise OSError(errno.EADDRINUSE, f"another agent is listening on {path}") from None
    else:
        raise OSError(errno.EADDRINUSE, f"another agent is listening on {path}")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def bind_socket(path: str, peers: PeerPolicy, explicit: bool) -> socket.socket:
    """A listening Unix socket at ``path``: 0600, or 0660 owned by ``peers.gids[0]``. An explicit
    path's directory must exist (a mounted volume): the agent writes nothing but the socket."""
    if explicit:
        d = os.path.dirname(os.path.abspath(path))
        try:
            is_dir = stat.S_ISDIR(os.stat(d).st_mode)
        except FileNotFoundError:
            is_dir = False
        except PermissionError:
            raise PermissionError(errno.EACCES, f"cannot reach directory {d}: permission denied on a folder above it "
                                  f"(the agent runs as uid {os.getuid()})") from None
        if not is_dir:
            raise FileNotFoundError(errno.ENOENT, f"directory {d} does not exist (the agent does not create it: "
                                    "mount the volume shared with the engine there)")
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117 if peers.gids else 0o177)
    try:
        sock.bind(path)  # created 0600 / 0660 under the umask: never wider, not even for a moment
    except OSError as e:
        sock.close()
        if e.errno != errno.EACCES:
            raise
        d = os.path.dirname(os.path.abspath(path))
        st = os.stat(d)
        raise PermissionError(e.errno, f"cannot create a socket in {d} (uid {st.st_uid} gid {st.st_gid} mode "
                              f"{stat.S_IMODE(st.st_mode):04o}): the agent runs as uid {os.getuid()} groups "
                              f"{sorted({os.getgid(), *os.getgroups()})}") from None
    finally:
        os.umask(old)
    if peers.gids and os.stat(path).st_gid != peers.gids[0]:
        try:
            os.chown(path, -1, peers.gids[0])
        except OSError as e:
            sock.close()
            os.unlink(path)
            raise OSError(e.errno, f"cannot give the socket group {peers.gids[0]}: {e.strerror} (the agent "
                          f"must be a member: its groups are {sorted({os.getgid(), *os.getgroups()})})") from None
    if peers.gids:
        d = os.path.dirname(os.path.abspath(path))
        st = os.stat(d)
        reach = stat.S_IXGRP if st.st_gid == peers.gids[0] else stat.S_IXOTH
        if not st.st_mode & reach:
            log.warning("graphmon agent: group %d cannot enter the socket's directory %s (mode %04o, uid %d gid %d): "
                        "its members cannot connect", peers.gids[0], d, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return sock
