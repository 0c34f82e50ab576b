"""The simulated device's op table (csrc/sim/sim_ops.c) op by op through _C_testing.run_op: every
op's arguments are copied into a job on a sim stream and the worker runs the CPU op, so every
output array and host result must equal the CPU table's bit for bit (a wrongly wired argument
shows here even where a model never exercises it)."""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
from gputrain import _C_testing

pytestmark = pytest.mark.sim
DTYPES = ["f32", "f16", "bf16"]


def randn(shape, seed, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def act(shape, dt, seed, scale=1.0):
    return ref.to_dtype(randn(shape, seed, scale), dt)


def cases(dt):
    """(op, arrays, args) for every op of the table, in dtype dt where the op takes one."""
    rows, cols, n = 37, 29, 1001
    x, dout, bias = act((rows, cols), dt, 1), act((rows, cols), dt, 2), randn(cols, 3)
    a, b, c = act((rows, 53), dt, 4), act((53, cols), dt, 5), act((rows, cols), dt, 6)
    mean, rstd = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    _C_testing.run_op("cpu", "layernorm_forward", [np.zeros_like(x), mean, rstd, x, bias, bias], (rows, cols, 1e-5, dt))
    ids, table = np.random.default_rng(7).integers(0, 11, rows).astype(np.int64), randn((11, cols), 8)
    targets = np.random.default_rng(9).integers(0, cols, rows).astype(np.int64)
    targets[::5] = -100
    return [
        ("gemm", [a, b, c], (False, False, rows, cols, 53, 0.5, dt, 53, dt, cols, 1.0, dt, cols, 1, 0, 0, 0)),
        ("bias_add", [x.copy(), bias], (rows, cols, dt)),
        ("bias_backward", [randn(cols, 10), dout], (rows, cols, dt, True)),
        ("activation_forward", [np.zeros_like(x), x], (x.size, 1, dt)),
        ("activation_backward", [np.zeros_like(x), dout, x], (x.size, 4, dt)),
        ("dropout_forward", [np.zeros_like(x), x], (x.size, 0.3, 1234, 2, 7, 5, dt)),
        ("dropout_backward", [np.zeros_like(x), dout], (x.size, 0.3, 1234, 2, 7, 5, dt)),
        ("add", [np.zeros_like(x), x, dout], (x.size, dt)),
        ("layernorm_forward", [np.zeros_like(x), np.zeros(rows, np.float32), np.zeros(rows, np.float32), x, bias,
                               randn(cols, 11)], (rows, cols, 1e-5, dt)),
        ("layernorm_backward", [np.zeros_like(x), randn(cols, 12), randn(cols, 13), dout, x, bias, mean, rstd],
         (rows, cols, dt, True)),
        ("embedding_forward", [np.zeros((rows, cols), ref.NUMPY_TYPES[dt]), ids, table], (rows, 11, cols, dt)),
        ("embedding_backward", [table.copy(), dout, ids], (rows, 11, cols, dt, True)),
        ("softmax_xent", [np.zeros(rows, np.float32), np.zeros_like(x), x, targets], (rows, cols, 0.1, -100, 0.5, dt)),
        ("mse", [np.zeros_like(x), x, randn((rows, cols), 14)], (x.size, 0.25, dt)),
        ("sum_squares", [randn(n, 15, scale=3.0)], (n,)),
        ("cast", [np.zeros(x.size, np.float32), x.ravel()], ("f32", dt, x.size)),
        ("copy", [np.zeros(n, np.float32), randn(n, 16)], (4 * n,)),
        ("zero", [randn(n, 17)], (2 * n,)),
    ]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("index", range(len(cases("f32"))), ids=[case[0] for case in cases("f32")])
def test_every_op_on_sim_gives_the_cpu_bits(dt, index):
    op, arrays, args = cases(dt)[index]
    cpu, sim = [a if a is None else a.copy() for a in arrays], [a if a is None else a.copy() for a in arrays]
    result_cpu, result_sim = _C_testing.run_op("cpu", op, cpu, args), _C_testing.run_op("sim", op, sim, args)
    assert result_sim == result_cpu
    for k, (got, expected) in enumerate(zip(sim, cpu)):
        assert ref.same_bits(got, expected), f"{op}: array {k}"
    wrote = any(not ref.same_bits(after, before) for after, before in zip(cpu, arrays))
    assert wrote or result_cpu, f"{op} computed nothing: the case checks nothing"
