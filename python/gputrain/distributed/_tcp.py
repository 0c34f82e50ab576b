"""The TCP store and mesh behind ``gputrain.distributed.init()`` when a torchrun-style launcher
started the job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and there is no MPI.

Rank 0 listens at MASTER_ADDR:MASTER_PORT (the store); every other rank opens a listening socket
of its own on a port the OS picks, connects to the store (retrying until the deadline: rank 0 may
start later) and says (rank, world size, port). Once all have joined, rank 0 sends every rank the
table of addresses; each rank then connects to the ranks below it (the store's connection is
rank 0's) and accepts those above it. The result, one connected socket per peer, becomes the
``_C.Communicator.over_tcp`` that every collective runs on (csrc/dist/comm_tcp.c).

Started by ``gputrain.distributed.run``, a rank also reads the launcher's notices of ranks that
exited (a pipe named by GPUTRAIN_LAUNCHER_NOTICES): while it waits in the rendezvous, a rank that
exited (with any status) fails it at once, naming that rank, instead of at the timeout.
"""
from __future__ import annotations

import errno
import functools
import json
import os
import re
import select
import socket
import stat
import struct
import time
from dataclasses import dataclass
from typing import Mapping

from gputrain import _C

_MAGIC = b"GTS1"  # gputrain TCP store, protocol 1
_HELLO = struct.Struct("!4sIII")  # magic, rank, world size, the rank's listening port
MAX_WORLD_SIZE = 65536  # every rank holds a socket to every other: a full mesh, for one or a few machines
NOTICES_VAR = "GPUTRAIN_LAUNCHER_NOTICES"  # "<launcher pid>:<fd>": the read end of the launcher's pipe


@dataclass(frozen=True)
class TcpEnv:
    """The launcher's variables, checked."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _int_var(env: Mapping[str, str], name: str, low: int, high: int, what: str) -> int:
    if name not in env:
        raise ValueError(f"{name} is not set: a torchrun-style launch sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
                         "and MASTER_PORT")
    text = env[name]
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # int() would also take "1_0" and non-ASCII digits
        raise ValueError(f"{name}={text!r}: not a decimal integer")
    digits = text.strip().lstrip("+-").lstrip("0")
    value = int(text) if len(digits) <= 19 else None  # int() refuses over 4300 digits
    if value is None or not low <= value <= high:
        raise ValueError(f"{name}={text.strip() if value is None else value}: {what}")
    return value


def tcp_env(environ: Mapping[str, str] | None = None) -> TcpEnv:
    """The torchrun-style variables of `environ` (os.environ), or ValueError naming the bad one."""
    env = os.environ if environ is None else environ
    size = _int_var(env, "WORLD_SIZE", 1, MAX_WORLD_SIZE, f"must be in 1..{MAX_WORLD_SIZE} (a full mesh of sockets)")
    rank = _int_var(env, "RANK", 0, size - 1, f"need 0 <= RANK < WORLD_SIZE ({size})")
    local = _int_var(env, "LOCAL_RANK", 0, rank, f"need 0 <= LOCAL_RANK <= RANK ({rank})") if "LOCAL_RANK" in env \
        else 0
    addr = env.get("MASTER_ADDR", "")
    if not addr.strip():
        raise ValueError(f"MASTER_ADDR={addr!r}: the host name or address of rank 0 is needed")
    port = _int_var(env, "MASTER_PORT", 1, 65535, "not a TCP port (1..65535)")
    return TcpEnv(rank, size, local, addr.strip(), port)


def _resolve(env: TcpEnv) -> None:
    """OSError (socket.gaierror) naming MASTER_ADDR when it cannot be resolved at all; a
    temporary failure (EAI_AGAIN) is left to the connection's retries."""
    try:
        socket.getaddrinfo(env.master_addr, env.master_port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno == socket.EAI_AGAIN:
            return
        raise socket.gaierror(error.errno, f"gputrain.distributed.init(): MASTER_ADDR={env.master_addr!r} "
                                           f"(MASTER_PORT={env.master_port}): {error.strerror}") from None


class _Notices:
    """The launcher's notices of ranks that exited ("<rank> <status>" lines on a pipe), when
    gputrain.distributed.run started this process; without one, nothing to wait on. One per
    process (_notices()): what one init() read, a later one still knows."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.fd = _notices_fd(environ)
        self.text = ""

    def fds(self) -> list[int]:
        return [] if self.fd is None else [self.fd]

    def check(self, what: str) -> None:
        """ConnectionError naming the first rank the launcher saw exit, if any."""
        if self.fd is not None and select.select([self.fd], [], [], 0)[0]:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                data = None
            if data == b"":  # the launcher closed it (it is exiting): nothing more will come
                self.fd = None
            elif data:
                self.text += data.decode("ascii", "replace")
        found = re.search(r"^(\d+) (-?\d+)$", self.text, re.MULTILINE)
        if found:
            raise ConnectionError(f"gputrain.distributed.init(): {what}: rank {found.group(1)} exited (status "
                                  f"{found.group(2)}) before the ranks had all joined; a rank that does not call "
                                  "init() cannot be waited for")

    def wait(self, sock: socket.socket, deadline: float, what: str) -> None:
        """Returns when `sock` is readable (or accepting); TimeoutError at the deadline,
        ConnectionError as soon as the launcher says a rank exited."""
        while True:
            self.check(what)
            ready = select.select([sock, *self.fds()], [], [], _left(deadline, what))[0]
            if sock in ready:
                return


@functools.lru_cache(maxsize=None)
def _notices() -> _Notices:
    return _Notices(os.environ)


def _notices_fd(env: Mapping[str, str]) -> int | None:
    """The pipe's fd in NOTICES_VAR, only in the launcher's own child (not a grandchild that
    inherited the variable but not the pipe)."""
    found = re.fullmatch(r"(\d+):(\d+)", env.get(NOTICES_VAR, ""))
    if not found or int(found.group(1)) != os.getppid():
        return None
    fd = int(found.group(2))
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        os.set_inheritable(fd, False)  # the rank's own subprocesses are not the launcher's ranks
        os.set_blocking(fd, False)
    except (OSError, OverflowError):
        return None
    return fd


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout")
    return left


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str, notices: _Notices) -> bytes:
    data = bytearray()
    while len(data) < n:
        notices.wait(sock, deadline, what)
        try:
            part = sock.recv(n - len(data))
        except BlockingIOError:
            continue
        if not part:
            raise ConnectionError(f"gputrain.distributed.init(): {what}: the other side closed the connection "
                                  "(it exited, or is not a gputrain rank of this job)")
        data += part
    return bytes(data)


def _send_json(sock: socket.socket, value: object) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_json(sock: socket.socket, deadline: float, what: str, notices: _Notices) -> object:
    (length,) = struct.unpack("!I", _recv_exact(sock, 4, deadline, what, notices))
    return json.loads(_recv_exact(sock, length, deadline, what, notices))


def _listen(host: str, port: int, backlog: int, family: int = socket.AF_INET) -> socket.socket:
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as error:
        where = f"MASTER_ADDR:MASTER_PORT={host}:{port}" if port else "an OS-chosen port"
        raise OSError(error.errno, f"gputrain.distributed.init(): cannot listen on {where}: {error.strerror}"
                      + ("; another process uses MASTER_PORT: choose a free one" if port else "")) from None


def _accept(listener: socket.socket, deadline: float, what: str, notices: _Notices) -> socket.socket:
    notices.wait(listener, deadline, what)
    listener.settimeout(_left(deadline, what))
    try:
        sock, _ = listener.accept()
    except socket.timeout:
        raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout") from None
    sock.settimeout(None)
    return sock


def _connect(host: str, port: int, deadline: float, what: str, notices: _Notices) -> socket.socket:
    """Connects to the store, retrying while nobody listens yet (rank 0 may start later)."""
    while True:
        notices.check(what)
        try:
            return socket.create_connection((host, port), timeout=max(0.05, min(5.0, _left(deadline, what))))
        except (ConnectionRefusedError, socket.timeout, socket.gaierror) as error:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout "
                                   f"(last error: {error})") from None
            select.select(notices.fds(), [], [], min(0.1, left))


def _connect_peer(host: str, port: int, deadline: float, what: str) -> socket.socket:
    """Connects to a rank that listened before it joined the store: once, as a refusal means it exited."""
    try:
        return socket.create_connection((host, port), timeout=max(0.05, min(30.0, _left(deadline, what))))
    except socket.timeout:
        raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout") from None
    except OSError as error:
        raise ConnectionError(error.errno or errno.ECONNREFUSED,
                              f"gputrain.distributed.init(): {what} at {host}:{port}: {error.strerror or error}; "
                              "that rank exited or gave up after it joined the store") from None


def _refuse(sock: socket.socket, error: BaseException) -> None:
    """Tells a rank that joined why the rendezvous failed (instead of its table), then closes."""
    try:
        _send_json(sock, {"error": f"{type(error).__name__}: {error}"})
    except OSError:
        pass
    sock.close()


def _store_serve(listener: socket.socket, env: TcpEnv, deadline: float,
                 notices: _Notices) -> list[socket.socket | None]:
    """Rank 0: the other ranks join; each gets the table of (host, port) of every rank. When the
    rendezvous fails, the ranks that joined get the reason instead of the table."""
    peers: list[socket.socket | None] = [None] * env.world_size
    try:
        return _serve(listener, env, deadline, peers, notices)
    except BaseException as error:
        for sock in peers:
            if sock is not None:
                _refuse(sock, error)
        raise


def _serve(listener: socket.socket, env: TcpEnv, deadline: float, peers: list[socket.socket | None],
           notices: _Notices) -> list[socket.socket | None]:
    table: list[tuple[str, int]] = [("", 0)] * env.world_size
    for _ in range(env.world_size - 1):
        sock = _accept(listener, deadline, f"rank 0: all {env.world_size} ranks joining the store", notices)
        try:
            hello = _recv_exact(sock, _HELLO.size, deadline, "rank 0: a rank's hello", notices)
        except BaseException:
            sock.close()
            raise
        magic, rank, size, port = _HELLO.unpack(hello)
        if magic != _MAGIC:
            sock.close()
            raise ConnectionError(f"rank 0: something that is not a gputrain rank connected to MASTER_PORT="
                                  f"{env.master_port}")
        if size != env.world_size or not 0 < rank < env.world_size or peers[rank] is not None:
            error = ValueError(f"WORLD_SIZE/RANK: a rank joined as rank {rank} of {size}; rank 0 has WORLD_SIZE="
                               f"{env.world_size}" + (" and that rank already joined"
                                                      if 0 < rank < env.world_size and peers[rank] else ""))
            _refuse(sock, error)
            raise error
        peers[rank], table[rank] = sock, (sock.getpeername()[0], port)
    notices.check(f"rank 0: all {env.world_size} ranks joining the store")  # one joined, then exited
    for sock in peers[1:]:
        _send_json(sock, table)
    return peers


def _join(env: TcpEnv, deadline: float, notices: _Notices) -> list[socket.socket | None]:
    """Rank > 0: joins the store, then connects to the ranks below and accepts those above."""
    peers: list[socket.socket | None] = [None] * env.world_size
    listener = None
    try:
        store = _connect(env.master_addr, env.master_port, deadline,
                         f"rank {env.rank}: connecting to rank 0's store at {env.master_addr}:{env.master_port}",
                         notices)
        peers[0] = store
        if env.rank < env.world_size - 1:  # the ranks above connect to the address the store saw (its family)
            listener = _listen("", 0, env.world_size, store.family)
        port = listener.getsockname()[1] if listener else 0
        store.sendall(_HELLO.pack(_MAGIC, env.rank, env.world_size, port))
        table = _recv_json(store, deadline, f"rank {env.rank}: the store's table of ranks", notices)
        if isinstance(table, dict):
            raise ConnectionError(f"gputrain.distributed.init(): rank {env.rank}: rank 0's store failed: "
                                  f"{table.get('error')}")
        for r in range(1, env.rank):
            sock = _connect_peer(table[r][0], table[r][1], deadline, f"rank {env.rank}: connecting to rank {r}")
            peers[r] = sock
            sock.sendall(_HELLO.pack(_MAGIC, env.rank, env.world_size, 0))
        for _ in range(env.rank + 1, env.world_size):
            what = f"rank {env.rank}: the ranks above it connecting"
            sock = _accept(listener, deadline, what, notices)
            try:
                _, r, _, _ = _HELLO.unpack(_recv_exact(sock, _HELLO.size, deadline, f"rank {env.rank}: a rank's hello",
                                                       notices))
            except BaseException:
                sock.close()
                raise
            if not env.rank < r < env.world_size or peers[r] is not None:
                sock.close()
                raise ConnectionError(f"rank {env.rank}: an unexpected rank {r} connected")
            peers[r] = sock
        return peers
    except BaseException:
        for sock in peers:
            if sock is not None:
                sock.close()
        raise
    finally:
        if listener is not None:
            listener.close()


def connect(env: TcpEnv, timeout: float) -> object:
    """The _C.Communicator of this rank over a TCP mesh; every rank must call it within `timeout`
    (a rank that the launcher saw exit fails it at once)."""
    deadline = time.monotonic() + timeout
    _resolve(env)
    notices = _notices()
    if env.rank == 0:
        family = socket.AF_INET6 if ":" in env.master_addr else socket.AF_INET
        listener = _listen(env.master_addr, env.master_port, env.world_size, family)
        try:
            peers = _store_serve(listener, env, deadline, notices)
        finally:
            listener.close()
    else:
        peers = _join(env, deadline, notices)
    try:
        for sock in peers:
            if sock is not None:
                sock.setblocking(True)
        comm = _C.Communicator.over_tcp([-1 if s is None else s.fileno() for s in peers], env.rank, env.world_size,
                                        float(timeout))
    except BaseException:
        for sock in peers:
            if sock is not None:
                sock.close()
        raise
    for sock in peers:
        if sock is not None:
            sock.detach()  # the communicator owns the descriptors now
    comm.barrier()  # every rank's mesh is complete
    return comm
