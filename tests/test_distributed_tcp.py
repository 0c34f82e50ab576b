"""Data parallelism without MPI (gputrain.distributed over TCP, csrc/dist/comm_tcp.c): ranks
started as local subprocesses with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT on a port the OS picked), running the scenarios of _dist_worker.py and
_zero_worker.py that test_distributed.py runs under mpiexec. Needs neither mpi4py nor mpiexec."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gputrain import _C
from gputrain import distributed as dist

TESTS = Path(__file__).parent
WORKER, ZERO_WORKER = str(TESTS / "_dist_worker.py"), str(TESTS / "_zero_worker.py")
CHAR_GPT = str(TESTS.parent / "examples" / "char_gpt.py")
LAUNCHERS = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCALRANKID")


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHERS)}
    env.update(OMP_NUM_THREADS="1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def run_tcp(world: int, script: str, *args: str, timeout: float = 120.0, only_rank0: bool = False,
            addr: str = "127.0.0.1") -> tuple[list[int], str]:
    """`world` ranks of `script`, torchrun-style: their exit codes and their output (rank order);
    `only_rank0`: the others are killed once rank 0 ended (a rank told to hang)."""
    port = free_port(addr)
    procs = [subprocess.Popen([sys.executable, script, *args], env=dict(rank_env(r, world, port), MASTER_ADDR=addr),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outputs = [procs[0].communicate(timeout=timeout)[0]]
        for p in procs[1:]:
            p.kill() if only_rank0 else None
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], "".join(outputs)


def reference(out: str, *args: str, world: int = 2) -> np.lib.npyio.NpzFile:
    subprocess.run([sys.executable, WORKER, *args, "--reference", str(world)], check=True, timeout=120)
    return np.load(f"{out}.reference.npz")


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_against_numpy_over_tcp(world):
    codes, output = run_tcp(world, WORKER, "mlp", "unused", "--collectives")
    assert codes == [0] * world, output
    assert output.count("collectives OK") == world


def test_an_ipv6_master_addr():
    """MASTER_ADDR=::1: the store and the ranks' listeners (rank 2 connects to rank 1's) are IPv6."""
    try:
        free_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    codes, output = run_tcp(3, WORKER, "mlp", "unused", "--collectives", addr="::1")
    assert codes == [0] * 3, output


@pytest.mark.parametrize("world, options", [
    (2, ["--precision", "fp16", "--clip", "0.5"]),
    (3, []),
    (2, ["--bucket-bytes", "20"]),  # overlapped buckets: messages of later buckets arrive early
    (2, ["--device", "sim"]),        # the device's collectives on its stream, over the same transport
], ids=["2-fp16-scaler-clip", "3-fp32", "2-overlap-20B", "2-sim"])
def test_ranks_over_tcp_give_the_weights_of_one_process_bit_for_bit(tmp_path, world, options):
    """The MLP of test_distributed.py's MPI runs: every rank's weights and step results equal the
    one process accumulating the ranks' micro-batches in rank order, bit for bit."""
    out = str(tmp_path / "run")
    args = ["mlp", out, "--steps", "3", *options]
    codes, output = run_tcp(world, WORKER, *args)
    assert codes == [0] * world, output
    expected = reference(out, *args, world=world)
    for r in range(world):
        got = np.load(f"{out}.rank{r}.npz")
        for name in expected.files:
            assert np.array_equal(got[name], expected[name]), (r, name)
        if "--bucket-bytes" in options:
            assert got["buckets_early"] == 45 * 3  # as over MPI: the last bias's buckets start early


def test_zero1_over_tcp(tmp_path):
    """ZeRO-1's reduce-scatter and all-gather over TCP: == zero_stage=0 bit for bit."""
    codes, output = run_tcp(2, ZERO_WORKER, "compare", str(tmp_path / "run"))
    assert codes == [0, 0], output
    assert output.count("identical") == 2 * 6, output


@pytest.mark.parametrize("how, waited, message", [
    ("exit", (0.0, 5.0), r"the connection with rank 1 was closed \(.*\): that rank exited or died"),
    ("hang", (2.0, 10.0), "with rank 1 did not complete within 2 s"),
])
def test_a_rank_that_exits_or_hangs_fails_the_other_over_tcp(how, waited, message):
    """A rank that exits: the other's next collective raises at once, naming it (its socket
    closed); one that stops answering: TimeoutError at the timeout. Never a hang."""
    started = time.monotonic()
    codes, output = run_tcp(2, WORKER, "mlp", "unused", "--die-at-step", "1", "--die-how", how, "--timeout", "2",
                            only_rank0=True)
    assert codes[0] == 3, output
    assert "rank 0 step 0 done" in output and "rank 0 step 1 done" not in output
    found = re.search(r"rank 0 (\w+) after ([0-9.]+) s: (.*)", output)
    assert found and found.group(1) == ("OSError" if how == "exit" else "TimeoutError"), output
    assert waited[0] <= float(found.group(2)) < waited[1], output
    assert re.search(message, found.group(3)), output
    assert time.monotonic() - started < 30


def test_an_exception_on_one_rank_fails_the_other_at_once():
    codes, output = run_tcp(2, WORKER, "mlp", "unused", "--raise-on-rank-1", "--timeout", "120", timeout=60)
    assert codes[1] != 0 and codes[0] != 0, output
    assert "ValueError: rank 1 fails on purpose" in output
    assert "the connection with rank 1 was closed" in output  # rank 0's first collective, not its 120 s


def test_char_gpt_example_runs_torchrun_style():
    codes, output = run_tcp(2, CHAR_GPT, "--distributed", "--steps", "3", "--layers", "1", "--embd", "32",
                            "--block", "16", "--batch", "4", "--threads", "1")
    assert codes == [0, 0], output
    assert "x 2 ranks" in output and output.count("trained 3 steps") == 1  # rank 0 reports


# ---- the launcher: python -m gputrain.distributed.run ----

def launch(nproc: int, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHERS)}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "gputrain.distributed.run", "--nproc-per-node", str(nproc), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal


def test_the_launcher_runs_the_ranks_and_fails_when_one_fails():
    done = launch(3, WORKER, "mlp", "unused", "--collectives")
    assert done.wait(timeout=60) == 0 and done.stdout.read().count("collectives OK") == 3
    started = time.monotonic()
    failed = launch(2, WORKER, "mlp", "unused", "--raise-on-rank-1", "--timeout", "120")
    assert failed.wait(timeout=60) == 1  # rank 1's status, not rank 0's 120 s timeout
    output = failed.stdout.read()
    # rank 0 fails at once too (its socket closed): the launcher may see either first
    assert "ValueError: rank 1 fails on purpose" in output, output
    assert re.search(r"rank [01] exited with status 1; stopping the other ranks", output), output
    assert time.monotonic() - started < 30


def test_ctrl_c_reaches_every_rank_and_abandons_the_step():
    """SIGINT to the launcher: rank 0, waiting in a step's all-reduce for rank 1 (asleep), and
    rank 1 both raise KeyboardInterrupt at once; the launcher exits 130."""
    job = launch(2, WORKER, "mlp", "unused", "--die-at-step", "1", "--die-how", "hang", "--timeout", "100")
    output = ""
    while "rank 0 step 0 done" not in output:  # rank 0 then waits in step 1
        line = job.stdout.readline()
        assert line, output
        output += line
    time.sleep(0.5)
    started = time.monotonic()
    job.send_signal(signal.SIGINT)
    output += job.communicate(timeout=30)[0]
    assert job.returncode == 130, output
    assert output.count("KeyboardInterrupt") == 2 and "_C.train_step" in output, output
    assert time.monotonic() - started < 10


def test_ctrl_c_abandons_a_collective_that_waits_for_a_live_rank():
    """SIGINT to rank 0 alone, waiting in a step's all-reduce for rank 1 (asleep, alive, its
    socket open): the transport polls the interrupt and rank 0 raises KeyboardInterrupt at once,
    not at the 100 s timeout."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "mlp", "unused", "--die-at-step", "1", "--die-how", "hang",
                               "--timeout", "100"], env=rank_env(r, 2, port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        output = ""
        while "rank 0 step 0 done" not in output:
            line = procs[0].stdout.readline()
            assert line, output
            output += line
        time.sleep(0.5)
        started = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        output += procs[0].communicate(timeout=20)[0]
        assert time.monotonic() - started < 5 and procs[1].poll() is None
        assert "KeyboardInterrupt" in output and "_C.train_step" in output, output
    finally:
        for p in procs:
            p.kill()
            p.communicate()


def rank_pids(job: subprocess.Popen, n: int) -> tuple[list[int], str]:
    """The pids that the ranks of _sleeper() print, and the output read so far."""
    output, pids = "", []
    while len(pids) < n:
        line = job.stdout.readline()
        assert line, output
        output += line
        pids = [int(pid) for pid in re.findall(r"rank \d+ pid (\d+)\n", output)]
    return pids, output


def sleeper(tmp_path: Path) -> str:
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nos.write(1, f\"rank {os.environ['RANK']} pid {os.getpid()}\\n\".encode())\n"
                      "time.sleep(120)\n")  # one write: the ranks' lines do not interleave
    return str(script)


def alive(pid: int) -> bool:
    """Running or sleeping: not gone, not a zombie nobody reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_ranks_die_with_a_launcher_killed_by_sigkill(tmp_path):
    """kill -9 of the launcher (no chance to stop its ranks): every rank is gone within 5 s."""
    job = launch(2, sleeper(tmp_path))
    pids: list[int] = []
    try:
        pids, output = rank_pids(job, 2)
        assert all(alive(pid) for pid in pids), output
        job.kill()
        job.wait(timeout=10)
        started = time.monotonic()
        while any(alive(pid) for pid in pids) and time.monotonic() - started < 5.0:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids), [pid for pid in pids if alive(pid)]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.kill()
        job.communicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_whose_launcher_died_while_it_started_exits_before_running():
    """The race the parent-pid check closes: the death signal was asked for after the parent had
    died (here: the child's parent is not the pid it expects) -> the child exits, status 1,
    without running the program."""
    from gputrain._parent_death import die_with_parent
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=30,
                          preexec_fn=die_with_parent(os.getpid() + 1_000_000))
    assert (done.returncode, done.stdout) == (1, "")
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=30,
                          preexec_fn=die_with_parent(os.getpid()))
    assert (done.returncode, done.stdout) == (0, "ran\n")


@pytest.mark.parametrize("exiting", [0, 1])
def test_a_rank_that_exits_before_init_fails_the_others_init_at_once(tmp_path, exiting):
    """Under the launcher, one of 3 ranks exits with status 0 before init(): the others, waiting
    with the default timeout (300 s) as the store (rank 0), for the store (ranks 1, 2) or for
    its table (rank 2), raise within seconds, naming it; the launcher exits with their status."""
    script = tmp_path / "early_exit.py"
    script.write_text(f"""import os, sys, time
if os.environ["RANK"] == "{exiting}":
    sys.exit(0)
from gputrain import distributed as dist
started = time.monotonic()
try:
    dist.init()
except ConnectionError as error:
    os.write(1, f"rank {{os.environ['RANK']}} after {{time.monotonic() - started:.1f}} s: {{error}}\\n".encode())
    sys.exit(3)
""")
    started = time.monotonic()
    job = launch(3, str(script))
    try:
        output = job.communicate(timeout=60)[0]
    finally:
        if job.poll() is None:
            job.kill()  # its ranks die with it
            job.communicate()
    assert job.returncode == 3, output
    waited = [float(w) for w in re.findall(r"^rank \d after ([0-9.]+) s: .*rank %d exited \(status 0\)" % exiting,
                                           output, re.MULTILINE)]
    assert waited and max(waited) < 5.0, output
    assert time.monotonic() - started < 30


def test_the_launcher_names_an_address_it_cannot_use(tmp_path):
    job = launch(2, "--master-addr", "no-such-host.invalid", sleeper(tmp_path))
    output = job.communicate(timeout=30)[0]
    assert job.returncode == 1 and "--master-addr 'no-such-host.invalid'" in output, output
    assert "pid" not in output  # no rank started


# ---- in this process: the environment, the store ----

@pytest.fixture
def torchrun_env(monkeypatch):
    """rank 0 of 2 with a free port; no MPI launcher's variables."""
    dist.destroy()
    for name in list(os.environ):
        if name.startswith(LAUNCHERS):
            monkeypatch.delenv(name)
    port = free_port()
    for name, value in rank_env(0, 2, port).items():
        if name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.setenv(name, value)
    yield port
    dist.destroy()


HUGE, MANY_DIGITS = str(2**40), "9" * 5000  # OverflowError / int()'s digit limit, unless checked first


@pytest.mark.parametrize("name, value, message", [
    ("RANK", "x", "RANK='x': not a decimal integer"),
    ("RANK", "1.0", "RANK='1.0': not a decimal integer"),
    ("RANK", "1_0", "RANK='1_0': not a decimal integer"),
    ("RANK", "2", r"RANK=2: need 0 <= RANK < WORLD_SIZE \(2\)"),
    ("RANK", "-1", r"RANK=-1: need 0 <= RANK < WORLD_SIZE \(2\)"),
    ("RANK", HUGE, f"RANK={HUGE}: need 0 <= RANK"),
    ("RANK", None, "RANK is not set"),
    ("WORLD_SIZE", "0", "WORLD_SIZE=0: must be in 1..65536"),
    ("WORLD_SIZE", "-2", "WORLD_SIZE=-2: must be in 1..65536"),
    ("WORLD_SIZE", HUGE, f"WORLD_SIZE={HUGE}: must be in 1..65536"),
    ("WORLD_SIZE", MANY_DIGITS, "WORLD_SIZE=9999.*: must be in 1..65536"),
    ("WORLD_SIZE", "two", "WORLD_SIZE='two': not a decimal integer"),
    ("LOCAL_RANK", "-1", "LOCAL_RANK=-1: need 0 <= LOCAL_RANK <= RANK"),
    ("LOCAL_RANK", HUGE, f"LOCAL_RANK={HUGE}: need 0 <= LOCAL_RANK <= RANK"),
    ("LOCAL_RANK", "zero", "LOCAL_RANK='zero': not a decimal integer"),
    ("MASTER_ADDR", " ", "MASTER_ADDR=' '"),
    ("MASTER_ADDR", None, "MASTER_ADDR=''"),
    ("MASTER_PORT", "70000", "MASTER_PORT=70000: not a TCP port"),
    ("MASTER_PORT", "-1", "MASTER_PORT=-1: not a TCP port"),
    ("MASTER_PORT", HUGE, f"MASTER_PORT={HUGE}: not a TCP port"),
    ("MASTER_PORT", "", "MASTER_PORT='': not a decimal integer"),
    ("MASTER_PORT", "http", "MASTER_PORT='http': not a decimal integer"),
])
def test_bad_torchrun_variables_raise_naming_the_variable(torchrun_env, monkeypatch, name, value, message):
    if value is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        dist.init(timeout=1.0, backend="tcp")
    assert not dist.is_initialized() and dist.communicator() is None


@pytest.mark.parametrize("rank", [0, 1])
def test_an_unresolvable_master_addr_raises_naming_it(torchrun_env, monkeypatch, rank):
    """At once, on the store's rank and on the joining one (not a retry until the timeout)."""
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    with pytest.raises(OSError, match=r"MASTER_ADDR='no-such-host.invalid' \(MASTER_PORT=%d\)" % torchrun_env):
        dist.init(timeout=60.0, backend="tcp")
    assert not dist.is_initialized()


@pytest.mark.parametrize("env, message", [
    ({"RANK": HUGE, "WORLD_SIZE": "2"}, f"RANK='{HUGE}': not an integer in 0..2147483647"),
    ({"RANK": "0", "WORLD_SIZE": HUGE}, f"WORLD_SIZE='{HUGE}': not an integer"),
    ({"RANK": "0", "WORLD_SIZE": MANY_DIGITS}, "WORLD_SIZE='9999"),
    ({"PMI_RANK": "-1", "PMI_SIZE": "2"}, "PMI_RANK='-1': not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "four"}, "SLURM_NTASKS='four': not an integer"),
])
def test_bad_launcher_variables_of_the_mpi_path_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        dist.launcher_env(env)


def test_a_port_in_use_raises_naming_master_port(torchrun_env):
    with socket.create_server(("127.0.0.1", torchrun_env)):
        with pytest.raises(OSError, match="MASTER_ADDR:MASTER_PORT=127.0.0.1:%d.*choose a free one" % torchrun_env):
            dist.init(timeout=1.0)
    assert not dist.is_initialized()


def test_a_store_nobody_serves_times_out(torchrun_env, monkeypatch):
    """Rank 1 retries connecting to rank 0's store until the timeout, then says so."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="rank 1: connecting to rank 0's store at 127.0.0.1"):
        dist.init(timeout=1.0)
    assert 0.95 <= time.monotonic() - started < 5.0 and not dist.is_initialized()


def test_a_world_of_one_needs_no_store(torchrun_env, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init(backend="tcp")
    assert (dist.get_rank(), dist.get_world_size(), dist.communicator()) == (0, 1, None)


def test_a_store_that_fails_tells_the_rank_that_joined_why():
    """Rank 1 joins with WORLD_SIZE=3, rank 0 (a thread here) has 2: both raise at once, and rank
    1 says what rank 0 refused instead of "the other side closed the connection"."""
    import threading
    from gputrain.distributed import _tcp
    port, errors = free_port(), []

    def rank0() -> None:
        try:
            _tcp.connect(_tcp.TcpEnv(0, 2, 0, "127.0.0.1", port), 20.0)
        except Exception as error:  # noqa: BLE001 (recorded for the assertion)
            errors.append(error)

    thread = threading.Thread(target=rank0)
    thread.start()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"rank 1: rank 0's store failed: ValueError: WORLD_SIZE/RANK: a rank "
                                              r"joined as rank 1 of 3; rank 0 has WORLD_SIZE=2"):
        _tcp.connect(_tcp.TcpEnv(1, 3, 1, "127.0.0.1", port), 20.0)
    thread.join(timeout=20)
    assert len(errors) == 1 and isinstance(errors[0], ValueError) and time.monotonic() - started < 10


def test_the_launchers_notices_name_the_rank_that_exited():
    """The pipe that gputrain.distributed.run gives each rank: read only by the launcher's own
    child (the pid in the variable is its parent), and a notice of an exit fails the wait on a
    socket at once."""
    from gputrain.distributed import _tcp
    read, write = os.pipe()
    try:
        assert _tcp._Notices({_tcp.NOTICES_VAR: f"{os.getppid() + 1}:{read}"}).fd is None  # a grandchild
        assert _tcp._Notices({_tcp.NOTICES_VAR: f"{os.getppid()}:{write + 1000}"}).fd is None  # not open
        notices = _tcp._Notices({_tcp.NOTICES_VAR: f"{os.getppid()}:{read}"})
        assert notices.fd == read and not os.get_inheritable(read)
        notices.check("waiting")  # nothing yet
        a, b = socket.socketpair()
        with a, b:
            os.write(write, b"2 0\n")
            started = time.monotonic()
            with pytest.raises(ConnectionError, match=r"waiting: rank 2 exited \(status 0\) before the ranks"):
                notices.wait(a, time.monotonic() + 30.0, "waiting")
            assert time.monotonic() - started < 5
        with pytest.raises(ConnectionError, match="rank 2 exited"):  # remembered
            notices.check("waiting")
    finally:
        os.close(read), os.close(write)


def test_backend_is_checked_and_chosen(torchrun_env, monkeypatch):
    with pytest.raises(ValueError, match="backend must be None, 'mpi' or 'tcp'"):
        dist.init(backend="nccl")
    assert dist._choose_backend(None) == "tcp"
    monkeypatch.setenv("PMI_RANK", "0")
    assert dist._choose_backend(None) == "mpi" and dist._choose_backend("tcp") == "tcp"


def test_over_tcp_refuses_what_it_cannot_use():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ValueError, match="fds must be a list of one socket per rank"):
            _C.Communicator.over_tcp([a.fileno()], 0, 2, 1.0)
        with pytest.raises(ValueError, match=r"fds\[1\]: -1 is not an open socket"):
            _C.Communicator.over_tcp([-1, -1], 0, 2, 1.0)
        with pytest.raises(ValueError, match="rank 2 of world size 2"):
            _C.Communicator.over_tcp([-1, a.fileno()], 2, 2, 1.0)
        a.send(b"x")  # the sockets stayed the caller's: still open
        assert b.recv(1) == b"x"


def test_a_size_mismatch_between_ranks_fails_instead_of_corrupting():
    """Two ranks calling different collectives over socketpairs (threads): a clear error."""
    import threading
    a, b = socket.socketpair()
    comms = [_C.Communicator.over_tcp([-1, a.fileno()], 0, 2, 2.0), _C.Communicator.over_tcp([b.fileno(), -1], 1, 2, 2.0)]
    a.detach(), b.detach()
    errors = []

    def call(r, n):
        try:
            comms[r].allgather(np.zeros(n, np.float32))
        except Exception as error:  # noqa: BLE001 (recorded for the assertion)
            errors.append(error)

    threads = [threading.Thread(target=call, args=(0, 10)), threading.Thread(target=call, args=(1, 12))]
    [t.start() for t in threads], [t.join() for t in threads]
    assert errors and any("the ranks called different collectives" in str(e) for e in errors), errors
    assert comms[0].failed or comms[1].failed


def test_messages_that_arrive_before_their_collective_are_kept():
    """Rank 0 of 3 in this process, the test playing ranks 1 and 2 over socketpairs with the
    transport's framing (a header of the collective's number and the payload's bytes): while
    rank 0 waits in collective #1 for rank 2, rank 1 (ahead) sends the header and a part of #2's
    payload; rank 0 reads them into a buffer of their own, and collective #2 adopts that buffer
    and reads the rest straight into its array."""
    import struct
    import threading
    pairs = [socket.socketpair() for _ in range(2)]
    comm = _C.Communicator.over_tcp([-1, pairs[0][0].fileno(), pairs[1][0].fileno()], 0, 3, 3.0)
    for ours, _ in pairs:
        ours.detach()
    one, two = pairs[0][1], pairs[1][1]
    want_a, want_b = np.arange(1000, dtype=np.float32), np.arange(300_000, dtype=np.float32)
    a, b, errors = np.zeros_like(want_a), np.zeros_like(want_b), []

    def rank0() -> None:
        try:
            comm.broadcast(a, 2)  # collective #1: from rank 2
            comm.broadcast(b, 1)  # collective #2: from rank 1
        except Exception as error:  # noqa: BLE001 (recorded for the assertion)
            errors.append(error)

    def message(call: int, payload: np.ndarray) -> bytes:
        return struct.pack("=QQ", call, payload.nbytes) + payload.tobytes()

    thread = threading.Thread(target=rank0)
    thread.start()
    early = message(2, want_b)
    one.sendall(early[:16 + 1000])  # #2's header and 1000 bytes, while rank 0 is in #1
    time.sleep(0.3)
    two.sendall(message(1, want_a))
    time.sleep(0.3)
    one.sendall(early[16 + 1000:])
    thread.join(timeout=10)
    assert not thread.is_alive() and not errors, errors
    assert np.array_equal(a, want_a) and np.array_equal(b, want_b)
    comm.close()
    one.close(), two.close()
