"""Data parallelism (gputrain.distributed): `mpiexec -n 2` runs of _dist_worker.py against one
process accumulating the same micro-batches in rank order, a rank that stops answering, and the
single-process API. The MPI runs need the test extras' mpi4py + mpich (CI installs them: there a
missing one fails; elsewhere these tests are skipped)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C
from gputrain import distributed as dist

WORKER = str(Path(__file__).with_name("_dist_worker.py"))


def mpiexec() -> str:
    """The mpiexec of the MPI library mpi4py loads (the mpich wheel's, beside this Python)."""
    if not os.environ.get("CI"):
        pytest.importorskip("mpi4py", reason="the test extras' mpi4py + mpich run the multi-process tests")
    for folder in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        if (folder / "mpiexec").exists():
            return str(folder / "mpiexec")
    found = shutil.which("mpiexec")
    if found is None and not os.environ.get("CI"):
        pytest.skip("mpi4py is installed but no mpiexec was found (pip install mpich: Linux wheels)")
    if found is None:
        pytest.fail("mpi4py is installed but no mpiexec was found (pip install mpich)")
    return found


def run_ranks(ranks: int, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", RANK="", WORLD_SIZE="")
    return subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, WORKER, *args], capture_output=True,
                          text=True, timeout=timeout, env={k: v for k, v in env.items() if v})


def distributed_run(tmp_path, kind, steps, *options, device: str | None = None):
    """The two ranks' weights and results (their models on `device`, None: the CPU), and the
    one-process CPU reference's (in a process of its own too, so that all three run on the same
    CPU: CI runs pytest itself under qemu)."""
    out = str(tmp_path / "run")
    args = [kind, out, "--steps", str(steps), *options]
    done = run_ranks(2, *args, *(["--device", device] if device else []))
    assert done.returncode == 0, done.stdout + done.stderr
    subprocess.run([sys.executable, WORKER, *args, "--reference", "2"], check=True, timeout=240)
    return [np.load(f"{out}.rank{r}.npz") for r in range(2)], np.load(f"{out}.reference.npz")


def assert_ranks_equal(ranks, reference):
    """Every rank's weights and results (loss, grad norm, skipped, scale) are the reference's bits."""
    for r, got in enumerate(ranks):
        for name in reference.files:
            assert np.array_equal(got[name], reference[name]), (r, name)


@pytest.mark.parametrize("precision, clip", [("fp32", None), ("fp16", 0.5), ("bf16", 0.05)],
                         ids=["fp32", "fp16-scaler-clip", "bf16-clip"])
def test_two_ranks_give_the_weights_of_one_process_bit_for_bit(tmp_path, precision, clip):
    """An MLP with dropout and LayerNorm, AdamW: 2 ranks of 4 rows each = one process with two
    accumulated micro-batches of 4 rows (rank 0's then rank 1's), bit for bit: each rank's
    gradient is scaled by 1/(2 micro-batches) as the reference's is, the all-reduce computes
    g0 + g1 in rank order exactly as the reference's second backward adds g1 onto g0, dropout
    draws with the micro-batch's global index, and the losses sum in rank order."""
    options = ["--precision", precision] + (["--clip", str(clip)] if clip else [])
    ranks, reference = distributed_run(tmp_path, "mlp", 3, *options)
    assert_ranks_equal(ranks, reference)
    if clip:
        assert (reference["results"][:, 1] > clip).all()  # clipping acted in every step


def test_two_ranks_of_a_gpt_step(tmp_path):
    """The GPT step on 2 ranks: after one step every weight but the token embedding equals the
    one-process reference bit for bit, and the loss too. The token embedding's
    gradient is a scatter-add, which the reference accumulates row by row onto micro-batch 0's
    sum ((g0 + r1) + r2 ...) where the ranks add whole sums (g0 + (r1 + r2 ...)): a rounding
    apart (the embedding backward would have to sum a micro-batch apart first to match)."""
    (got, _), reference = distributed_run(tmp_path, "gpt", 1, "--precision", "fp16")
    for name in reference.files:
        if name == "wte.weight":
            np.testing.assert_allclose(got[name], reference[name], rtol=0, atol=1e-6)
        elif name != "results":
            assert np.array_equal(got[name], reference[name]), name
    results = reference["results"]
    assert got["results"][0, 0] == results[0, 0]  # the loss
    np.testing.assert_allclose(got["results"][0, 1], results[0, 1], rtol=1e-6)  # the norm (of that embedding)


@pytest.mark.parametrize("kind, bucket_bytes, early", [
    # MLP of 645 parameters; before its first Linear's backward the last 645 - 416 gradients are final
    ("mlp", 4, 229 * 3),  # a bucket per element (every parameter larger than a bucket), 3 steps
    ("mlp", 20, 45 * 3),  # the last bias (5) is one bucket: those from element 420 on start early
    ("mlp", 1 << 30, 0),  # one bucket: it can only start when the backward is over
    ("gpt", 64, None),  # the GPT's blocks: some buckets start during the backward
], ids=["mlp-4B", "mlp-20B", "mlp-1-bucket", "gpt-64B"])
def test_the_all_reduce_overlaps_the_backward_bit_for_bit(tmp_path, kind, bucket_bytes, early):
    """Buckets start while the backward still runs (buckets_early counts those started before its
    first layer) and the weights stay those of the one-process reference, whatever the bucket size
    (the sum of each element is the same rank-order sum)."""
    steps = 3 if kind == "mlp" else 1
    ranks, reference = distributed_run(tmp_path, kind, steps, "--bucket-bytes", str(bucket_bytes))
    for got in ranks:
        for name in reference.files:
            if name == "wte.weight":  # a rounding apart: see test_two_ranks_of_a_gpt_step
                np.testing.assert_allclose(got[name], reference[name], rtol=0, atol=1e-6)
            elif name != "results" or kind == "mlp":
                assert np.array_equal(got[name], reference[name]), name
        if early is None:
            assert got["buckets_early"] > 0
        else:
            assert got["buckets_early"] == early


@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_against_numpy(ranks):
    done = run_ranks(ranks, "mlp", "unused", "--collectives")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("collectives OK") == ranks


def test_a_deferred_step_of_a_device_model_is_refused():
    done = run_ranks(2, "mlp", "unused", "--device-model")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ValueError: sync=False: data parallelism checks the collectives at the step's read") == 2


@pytest.mark.parametrize("delay_us", ["0", "300"], ids=["no-delay", "sim-delay-300us"])
@pytest.mark.parametrize("precision, clip", [("fp32", None), ("fp16", 0.5)], ids=["fp32", "fp16-scaler-clip"])
def test_two_ranks_of_sim_models_give_the_cpu_weights_bit_for_bit(tmp_path, monkeypatch, precision, clip, delay_us):
    """Models on "sim": the gradients all-reduced by the device in rank order, on the
    communicator's stream between an event after the backward and one before the
    unscale/clip/update, give the one-process CPU reference's weights and results bit for bit;
    with the simulator's random delays a collective not ordered by the events would read or
    write stale gradients."""
    monkeypatch.setenv("GPUTRAIN_SIM_DELAY_US", delay_us)
    options = ["--precision", precision] + (["--clip", str(clip)] if clip else [])
    ranks, reference = distributed_run(tmp_path, "mlp", 3, *options, device="sim")
    assert_ranks_equal(ranks, reference)
    if clip:
        assert (reference["results"][:, 1] > clip).all()


@pytest.mark.parametrize("device, delay_us", [("cpu", "0"), ("sim", "0"), ("sim", "300")],
                         ids=["cpu", "sim", "sim-delay-300us"])
def test_broadcast_parameters_gives_every_rank_the_roots_weights(tmp_path, monkeypatch, device, delay_us):
    """Ranks seeded differently; after broadcast_parameters(root=1) both hold rank 1's weights.
    On "sim" the device sends them on the communicator's stream, after an event recorded on the
    model's stream (with random delays, a broadcast not ordered after the init would send stale
    weights or be overwritten)."""
    monkeypatch.setenv("GPUTRAIN_SIM_DELAY_US", delay_us)
    out = str(tmp_path / "run")
    done = run_ranks(2, "mlp", out, "--broadcast-params", "--device", device)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(f"{out}.rank{r}.npz") for r in range(2)]
    names = [name[len("before."):] for name in ranks[0].files if name.startswith("before.")]
    assert not all(np.array_equal(ranks[0][f"before.{n}"], ranks[1][f"before.{n}"]) for n in names)
    for r in range(2):
        for n in names:
            assert np.array_equal(ranks[r][f"after.{n}"], ranks[1][f"before.{n}"]), (r, n)


@pytest.mark.cuda
@pytest.mark.parametrize("precision, clip", [("fp32", None), ("fp16", 0.5)], ids=["fp32", "fp16-scaler-clip"])
def test_two_ranks_on_two_gpus_give_the_cpu_weights_bit_for_bit(tmp_path, precision, clip):
    """NCCL (cuda/comm_nccl.cu): the rank-order sum of grouped send/recv and a summing kernel on
    the communicator's stream gives the one-process CPU reference's weights bit for bit, with the
    step's one wait. NCCL refuses two ranks on one GPU, so this needs two."""
    if _C.cuda_device_count() < 2:
        pytest.skip("NCCL needs a GPU per rank: fewer than 2 CUDA devices")
    options = ["--precision", precision] + (["--clip", str(clip)] if clip else [])
    ranks, reference = distributed_run(tmp_path, "mlp", 3, *options, device="cuda-per-rank")
    assert_ranks_equal(ranks, reference)


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_a_rank_that_stops_answering_fails_the_others_within_the_timeout(device):
    """On "sim" the all-reduce runs on a stream's worker thread: its deadline still ends the step,
    with the transport's message naming the silent rank, at the step's one wait."""
    started = time.monotonic()
    done = run_ranks(2, "mlp", "unused", "--die-at-step", "1", "--die-how", "hang", "--timeout", "3", "--device", device)
    # Rank 0 exits 3 at its TimeoutError and mpiexec kills the silent rank. Hydra ORs the exit codes
    # it has seen, and what it has seen depends on the order of its socket and waitpid events
    # (pmodels/mpich#5930): once, under load, it returned 9 (the killed rank's signal), not 3.
    assert done.returncode != 0, done.stdout + done.stderr
    assert "rank 0 step 0 done" in done.stdout
    waited = re.search(r"rank 0 TimeoutError after ([0-9.]+) s", done.stdout)
    assert waited and 3.0 <= float(waited.group(1)) < 30, done.stdout  # the step's compute, then the 3 s
    assert "with rank 1 did not complete within 3 s" in done.stdout
    assert time.monotonic() - started < 60


def test_a_rank_that_exits_mid_run_ends_the_job_without_a_hang():
    """mpiexec ends the job when a rank exits; the survivor never finishes a step alone."""
    started = time.monotonic()
    done = run_ranks(2, "mlp", "unused", "--die-at-step", "1", "--die-how", "exit", "--timeout", "30")
    assert "rank 0 step 1 done" not in done.stdout
    assert time.monotonic() - started < 60


# ---- one process: no launcher, no MPI ----

@pytest.fixture
def single():
    dist.destroy()
    yield
    dist.destroy()


def test_one_process_needs_no_mpi(single, monkeypatch):
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    dist.init()
    assert (dist.get_rank(), dist.get_world_size(), dist.is_main_process()) == (0, 1, True)
    assert dist.communicator() is None
    dist.barrier()
    a = np.ones(3, np.float32)
    dist.all_reduce(a)
    assert a.tolist() == [1, 1, 1] and dist.bytes_sent() == 0
    with pytest.raises(RuntimeError, match="already initialised"):
        dist.init()


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, (1, 4)),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, (0, 2)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8"}, (3, 8)),
    ({"RANK": "2", "WORLD_SIZE": "3"}, (2, 3)),
    ({"RANK": "2"}, None),
    ({}, None),
])
def test_launcher_variables(env, expected):
    assert dist.launcher_env(env) == expected


@pytest.mark.parametrize("env, message", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x': not an integer"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "0 <= rank < world size"),
])
def test_bad_launcher_variables_raise(env, message):
    with pytest.raises(ValueError, match=message):
        dist.launcher_env(env)


def test_bad_timeout_raises(single):
    for bad in (0, -1.0, float("nan"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            dist.init(timeout=bad)
    assert not dist.is_initialized()


def test_communicator_refuses_what_it_cannot_call():
    with pytest.raises(ValueError, match="not loaded in this process"):
        _C.Communicator("/nonexistent/libmpi.so.12", 0, 0, 4, 20, 0, 2, 1.0)
    with pytest.raises(ValueError, match="not Open MPI yet"):
        _C.Communicator("libc.so.6", 0, 0, 8, 20, 0, 2, 1.0)
    with pytest.raises(ValueError, match="has no MPI_Isend"):
        _C.Communicator("libc.so.6", 0, 0, 4, 20, 0, 2, 1.0)


def test_train_step_refuses_a_comm_that_is_not_a_communicator():
    model = gt.nn.Sequential(gt.nn.Linear(3, 2))
    before = model.state_dict()
    with pytest.raises(TypeError, match="comm must be a gputrain._C.Communicator"):
        _C.train_step(_C.StepConfig(("cross_entropy", 0.0, -100)), model.compiled, np.ones((2, 3), np.float32),
                      np.zeros(2, np.int64), comm=object())
    for name, value in model.state_dict().items():
        assert np.array_equal(value, before[name])


def test_char_gpt_example_runs_on_two_ranks():
    example = Path(__file__).parents[1] / "examples" / "char_gpt.py"
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(example), "--distributed", "--steps", "3",
                           "--layers", "1", "--embd", "32", "--block", "16", "--batch", "4", "--threads", "1"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "x 2 ranks" in done.stdout and done.stdout.count("trained 3 steps") == 1  # rank 0 reports


def test_loader_and_trainer_on_two_ranks(tmp_path):
    """The DataLoader shards by rank without being told, the ranks train the same weights, and
    rank 0 alone writes the checkpoint, which a single process then resumes (another world size)."""
    if not os.environ.get("CI"):
        pytest.importorskip("safetensors", reason="checkpoints need safetensors (a gputrain dependency)")
    done = run_ranks(2, "mlp", str(tmp_path / "trainer"), "--trainer")
    assert done.returncode == 0, done.stdout + done.stderr
    shards = [np.load(str(tmp_path / f"trainer.rank{r}.npz")) for r in range(2)]
    rows = [set(s["rows"].tolist()) for s in shards]
    assert not rows[0] & rows[1] and rows[0] | rows[1] == set(range(16))
    assert np.array_equal(shards[0]["weight"], shards[1]["weight"])
    checkpoints = sorted(p.name for p in (tmp_path / "trainer-out").iterdir() if p.name.startswith("checkpoint"))
    assert checkpoints == ["checkpoint-2"]
    resumed = subprocess.run([sys.executable, WORKER, "mlp", str(tmp_path / "trainer"), "--trainer", "--resume"],
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed at step 2, trained to step 6" in resumed.stdout


def test_an_exception_on_one_rank_ends_the_job_at_once():
    started = time.monotonic()
    done = run_ranks(2, "mlp", "unused", "--raise-on-rank-1", "--timeout", "120")
    assert done.returncode != 0
    assert "ValueError: rank 1 fails on purpose" in done.stderr
    assert time.monotonic() - started < 60  # not the 120 s timeout: MPI_Abort ended rank 0's wait


# ---- ZeRO-1: AdamW(zero_stage=1), tests/_zero_worker.py ----

ZERO_WORKER = str(Path(__file__).with_name("_zero_worker.py"))


def run_zero(ranks: int | None, *args: str, worker: str = ZERO_WORKER) -> str:
    """A worker (_zero_worker.py) on `ranks` ranks (None: one process without a launcher); its output."""
    if ranks is None:
        done = subprocess.run([sys.executable, worker, *args], capture_output=True, text=True, timeout=240)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
        env.update(OMP_NUM_THREADS="1", RANK="", WORLD_SIZE="")
        done = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, worker, *args], capture_output=True,
                              text=True, timeout=240, env={k: v for k, v in env.items() if v})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_zero1_gives_the_weights_of_unsharded_data_parallelism_bit_for_bit(tmp_path, ranks):
    """Each rank's AdamW state covers 1/N of the parameters, and weights, losses, gradient norms,
    skipped steps and the gathered optimizer state equal zero_stage=0's bit for bit: an MLP in
    fp32; with GradScaler (a first step skipped on overflow), clipping and cpu_offload_fraction
    0.5; a wider MLP whose norm summation has chunks inside shards and chunks cut by them; a GPT;
    2 parameters over 3 ranks (an empty shard). The memory plan shows one rank's optimizer bytes."""
    out = run_zero(ranks, "compare", str(tmp_path / "run"))
    assert out.count("identical") == ranks * 6, out


def test_zero1_checkpoints_move_across_world_sizes(tmp_path):
    """A ZeRO-1 state_dict of 2 ranks (the whole state, gathered) loads into 3 ranks (re-sharded,
    gathered back unchanged, then trained on as zero_stage=0 is) and into one process, which
    continues it to the 3 ranks' weights bit for bit."""
    out = str(tmp_path / "run")
    run_zero(2, "checkpoint", out)
    assert run_zero(3, "resume", out).count("resumed identical") == 3
    assert "resumed identical" in run_zero(None, "resume", out, "--reference", "3")
    ranks, single = np.load(f"{out}.resumed.npz"), np.load(f"{out}.reference.npz")
    for name in single.files:
        assert np.array_equal(ranks[name], single[name], equal_nan=True), name


@pytest.mark.parametrize("ranks, delay_us", [(2, "0"), (3, "300")])
def test_zero1_of_sim_models_gives_the_weights_of_unsharded_and_of_cpu_zero1(tmp_path, monkeypatch, ranks, delay_us):
    """Models on sim:0: each rank's AdamW state (its offloaded share in pinned memory included)
    covers its shard only, the step all-gathers the updated shards on the device, and weights,
    step results and the gathered state equal zero_stage=0 on sim and ZeRO-1 on the cpu bit for
    bit (fp32; fp16 + scaler with skipped steps + clip + offload 0.5; a GPT; an empty shard),
    with one wait per step, also when sim's kernels are slow (GPUTRAIN_SIM_DELAY_US)."""
    monkeypatch.setenv("GPUTRAIN_SIM_DELAY_US", delay_us)
    out = run_zero(ranks, "device", str(tmp_path / "run"))
    assert out.count("identical on sim") == ranks * 4, out


def test_zero1_refuses_what_it_cannot_shard():
    """step()/clip_grad_norm_()/add_param_group outside TrainStep, parameters of two models:
    clear errors naming zero_stage, nothing changed."""
    assert run_zero(2, "errors", "unused").count("errors OK") == 2


ZERO_TRAINER_WORKER = str(Path(__file__).with_name("_zero_trainer_worker.py"))


@pytest.mark.parametrize("fp16, device", [(False, "cpu"), (True, "cpu"), (True, "sim")])
def test_trainer_zero_stage_1_resumes_across_world_sizes_bit_for_bit(tmp_path, fp16, device):
    """TrainingArguments(zero_stage=1) against zero_stage=0 in the same processes, 2 ranks to step
    2, then 3 ranks resuming checkpoint-2 to step 4, then one process resuming checkpoint-4: the
    weights, the logged losses and gradient norms and every checkpoint's files (the optimizer
    state gathered whole on every rank, written by rank 0) are the same bit for bit, on the cpu
    and with models on sim."""
    if not os.environ.get("CI"):
        pytest.importorskip("safetensors", reason="checkpoints need safetensors (a gputrain dependency)")
    out, flags = str(tmp_path / "run"), ["--device", device, *(["--fp16"] if fp16 else [])]
    for ranks, steps, resume in ((2, 2, None), (3, 4, 2), (None, 12, 4)):
        resumed = ["--resume", str(resume)] if resume else []
        out_text = run_zero(ranks, out, str(steps), *flags, *resumed, worker=ZERO_TRAINER_WORKER)
        # one process: the 3 ranks' checkpoint sits half-way through epoch 1, which ends at step 7
        expected = f"identical at step {steps}, checkpoint-{steps}" if ranks else "identical at step 7, checkpoint-6"
        assert out_text.count(expected) == (ranks or 1), out_text
