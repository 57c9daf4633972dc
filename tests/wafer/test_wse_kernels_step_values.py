"""The `schedule` kernel: a value of the global step given to every sample, its program
evaluated at the step the run computes (RunContext.step) as TF's CPU kernels compute it;
a program reading more than the step and constants refused at Load."""
from __future__ import annotations

import numpy as np
import pytest

from wafer.kernels import KernelError, RunContext, build_kernel
from wafer.schedules import ScalarOp, Schedule, programs_attr

# tf.minimum(1.0, tf.cast(global_step, tf.float32) / 3.0) as Grappler runs it: * (1 / 3)
ANNEALING = Schedule("beta", (ScalarOp("step", "int64"), ScalarOp("cast", "float32", (0,)),
                              ScalarOp("const", "float32", value=float(np.float32(1 / 3))),
                              ScalarOp("mul", "float32", (1, 2)),
                              ScalarOp("const", "float32", value=1.0),
                              ScalarOp("minimum", "float32", (4, 3))))


def test_every_sample_gets_the_value_at_the_step_computed():
    kernel = build_kernel("schedule", "beta", {"program": programs_attr([ANNEALING])}, [(5,)])
    x = np.zeros((4, 5), np.float32)
    for step, want in ((0, 0.0), (1, np.float32(1) * np.float32(1 / 3)), (2, np.float32(2) *
                       np.float32(1 / 3)), (3, 1.0), (10**6, 1.0)):
        out, _ = kernel.forward({}, [x], RunContext(training=False, batch_size=4, step=step))
        assert out.dtype == np.float32 and out.shape == (4,)
        np.testing.assert_array_equal(out, np.full(4, want, np.float32))
    assert not kernel.input_differentiable(0)


@pytest.mark.parametrize("leaf", [ScalarOp("variable", "float32", name="beta"),
                                  ScalarOp("input", "float32", name="S0")])
def test_a_program_reading_more_than_the_step_is_refused(leaf):
    program = Schedule("beta", (leaf, ScalarOp("identity", "float32", (0,))))
    with pytest.raises(KernelError, match="reads more than the global step"):
        build_kernel("schedule", "beta", {"program": programs_attr([program])}, [(5,)])
