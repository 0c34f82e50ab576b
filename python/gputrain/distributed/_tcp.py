"""The TCP store and mesh behind ``gputrain.distributed.init()`` when a torchrun-style launcher
started the job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and there is no MPI.

Rank 0 listens at MASTER_ADDR:MASTER_PORT (the store); every other rank opens a listening socket
of its own on a port the OS picks, connects to the store (retrying until the deadline: rank 0 may
start later) and says (rank, world size, port). Once all have joined, rank 0 sends every rank the
table of addresses; each rank then connects to the ranks below it (the store's connection is
rank 0's) and accepts those above it. The result, one connected socket per peer, becomes the
``_C.Communicator.over_tcp`` that every collective runs on (csrc/dist/comm_tcp.c).
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Mapping

from gputrain import _C

_MAGIC = b"GTS1"  # gputrain TCP store, protocol 1
_HELLO = struct.Struct("!4sIII")  # magic, rank, world size, the rank's listening port


@dataclass(frozen=True)
class TcpEnv:
    """The launcher's variables, checked."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _int_var(env: Mapping[str, str], name: str, low: int, high: int | None, what: str) -> int:
    if name not in env:
        raise ValueError(f"{name} is not set: a torchrun-style launch sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
                         "and MASTER_PORT")
    try:
        value = int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r}: not an integer") from None
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={value}: {what}")
    return value


def tcp_env(environ: Mapping[str, str] | None = None) -> TcpEnv:
    """The torchrun-style variables of `environ` (os.environ), or ValueError naming the bad one."""
    env = os.environ if environ is None else environ
    size = _int_var(env, "WORLD_SIZE", 1, None, "must be at least 1")
    rank = _int_var(env, "RANK", 0, size - 1, f"need 0 <= RANK < WORLD_SIZE ({size})")
    local = _int_var(env, "LOCAL_RANK", 0, rank, f"need 0 <= LOCAL_RANK <= RANK ({rank})") if "LOCAL_RANK" in env \
        else 0
    addr = env.get("MASTER_ADDR", "")
    if not addr.strip():
        raise ValueError(f"MASTER_ADDR={addr!r}: the host name or address of rank 0 is needed")
    port = _int_var(env, "MASTER_PORT", 1, 65535, "not a TCP port (1..65535)")
    return TcpEnv(rank, size, local, addr.strip(), port)


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout")
    return left


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    data = bytearray()
    while len(data) < n:
        sock.settimeout(_left(deadline, what))
        try:
            part = sock.recv(n - len(data))
        except socket.timeout:
            raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout") from None
        if not part:
            raise ConnectionError(f"gputrain.distributed.init(): {what}: the other side closed the connection "
                                  "(it exited, or is not a gputrain rank of this job)")
        data += part
    return bytes(data)


def _send_json(sock: socket.socket, value: object) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_json(sock: socket.socket, deadline: float, what: str) -> object:
    (length,) = struct.unpack("!I", _recv_exact(sock, 4, deadline, what))
    return json.loads(_recv_exact(sock, length, deadline, what))


def _listen(host: str, port: int, backlog: int, family: int = socket.AF_INET) -> socket.socket:
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as error:
        where = f"MASTER_ADDR:MASTER_PORT={host}:{port}" if port else "an OS-chosen port"
        raise OSError(error.errno, f"gputrain.distributed.init(): cannot listen on {where}: {error.strerror}"
                      + ("; another process uses MASTER_PORT: choose a free one" if port else "")) from None


def _accept(listener: socket.socket, deadline: float, what: str) -> socket.socket:
    listener.settimeout(_left(deadline, what))
    try:
        sock, _ = listener.accept()
    except socket.timeout:
        raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout") from None
    sock.settimeout(None)
    return sock


def _connect(host: str, port: int, deadline: float, what: str) -> socket.socket:
    """Connects, retrying while nobody listens yet (the other rank may start later)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.05, min(5.0, _left(deadline, what))))
        except (ConnectionRefusedError, socket.timeout, socket.gaierror) as error:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"gputrain.distributed.init(): {what} did not happen within the timeout "
                                   f"(last error: {error})") from None
            time.sleep(min(0.1, left))


def _store_serve(listener: socket.socket, env: TcpEnv, deadline: float) -> list[socket.socket | None]:
    """Rank 0: the other ranks join; each gets the table of (host, port) of every rank."""
    peers: list[socket.socket | None] = [None] * env.world_size
    try:
        return _serve(listener, env, deadline, peers)
    except BaseException:
        for sock in peers:
            if sock is not None:
                sock.close()
        raise


def _serve(listener: socket.socket, env: TcpEnv, deadline: float,
           peers: list[socket.socket | None]) -> list[socket.socket | None]:
    table: list[tuple[str, int]] = [("", 0)] * env.world_size
    for _ in range(env.world_size - 1):
        sock = _accept(listener, deadline, f"rank 0: all {env.world_size} ranks joining the store")
        magic, rank, size, port = _HELLO.unpack(_recv_exact(sock, _HELLO.size, deadline, "rank 0: a rank's hello"))
        if magic != _MAGIC:
            sock.close()
            raise ConnectionError(f"rank 0: something that is not a gputrain rank connected to MASTER_PORT="
                                  f"{env.master_port}")
        if size != env.world_size or not 0 < rank < size or peers[rank] is not None:
            sock.close()
            raise ValueError(f"WORLD_SIZE/RANK: a rank joined as rank {rank} of {size}; rank 0 has WORLD_SIZE="
                             f"{env.world_size}" + (" and that rank already joined" if peers[rank] else ""))
        peers[rank], table[rank] = sock, (sock.getpeername()[0], port)
    for sock in peers[1:]:
        _send_json(sock, table)
    return peers


def _join(env: TcpEnv, deadline: float) -> list[socket.socket | None]:
    """Rank > 0: joins the store, then connects to the ranks below and accepts those above."""
    peers: list[socket.socket | None] = [None] * env.world_size
    listener = None
    try:
        store = _connect(env.master_addr, env.master_port, deadline,
                         f"rank {env.rank}: connecting to rank 0's store at {env.master_addr}:{env.master_port}")
        peers[0] = store
        if env.rank < env.world_size - 1:  # the ranks above connect to the address the store saw (its family)
            listener = _listen("", 0, env.world_size, store.family)
        port = listener.getsockname()[1] if listener else 0
        store.sendall(_HELLO.pack(_MAGIC, env.rank, env.world_size, port))
        table = _recv_json(store, deadline, f"rank {env.rank}: the store's table of ranks")
        for r in range(1, env.rank):
            sock = _connect(table[r][0], table[r][1], deadline, f"rank {env.rank}: connecting to rank {r}")
            sock.sendall(_HELLO.pack(_MAGIC, env.rank, env.world_size, 0))
            peers[r] = sock
        for _ in range(env.rank + 1, env.world_size):
            sock = _accept(listener, deadline, f"rank {env.rank}: the ranks above it connecting")
            _, r, _, _ = _HELLO.unpack(_recv_exact(sock, _HELLO.size, deadline, f"rank {env.rank}: a rank's hello"))
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
    """The _C.Communicator of this rank over a TCP mesh; every rank must call it within `timeout`."""
    deadline = time.monotonic() + timeout
    if env.rank == 0:
        family = socket.AF_INET6 if ":" in env.master_addr else socket.AF_INET
        listener = _listen(env.master_addr, env.master_port, env.world_size, family)
        try:
            peers = _store_serve(listener, env, deadline)
        finally:
            listener.close()
    else:
        peers = _join(env, deadline)
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
