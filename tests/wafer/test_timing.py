"""The timing model's formulas (wafer/timing.py), on kernels with known costs."""
import math
from dataclasses import dataclass

import pytest

from wafer import timing
from wafer.fabric import get_fabric
from wafer.kernels import build_kernel
from wafer.kernels.base import Kernel


class Matvec(Kernel):
    """A kernel with hand-computable costs: n -> m matrix-vector product."""

    type_name = "test_matvec"

    @property
    def output_shape(self):
        return (self.attrs["units"],)

    def param_shapes(self):
        return {"kernel": (self.input_shapes[0][0], self.attrs["units"])}

    def flops_per_sample(self):
        return 2 * self.input_shapes[0][0] * self.attrs["units"]

    def max_cores(self):
        return self.attrs["max_cores"]

    def activation_bytes_per_sample(self):
        return 4 * self.input_shapes[0][0]


@dataclass
class Rect:
    x: int
    y: int
    width: int
    height: int


def test_kernel_timing_formulas():
    fabric = get_fabric("cs2")
    k = Matvec("d", {"units": 500, "max_cores": 10_000}, [(784,)])
    t = timing.kernel_timing(k, Rect(0, 0, 20, 10), fabric, training=True, optimizer="adam")
    assert t.cores == 200 and t.useful_cores == 200
    assert t.t_comp == pytest.approx(3 * 2 * 784 * 500 / (200 * fabric.core_flops_per_sec))
    assert t.t_comm == pytest.approx(784 * 4 / (10 * 4 * fabric.clock_hz))
    assert t.update_seconds == pytest.approx(784 * 500 * 12 / (200 * fabric.core_flops_per_sec))
    # More cores than the kernel can use do not make it faster.
    capped = timing.kernel_timing(Matvec("d", {"units": 500, "max_cores": 50}, [(784,)]),
                                  Rect(0, 0, 20, 10), fabric, training=False)
    assert capped.useful_cores == 50
    assert capped.t_comp == pytest.approx(2 * 784 * 500 / (50 * fabric.core_flops_per_sec))


def test_pipeline_is_as_fast_as_its_slowest_kernel_and_step_adds_fill():
    fabric = get_fabric("cs1")
    a = Matvec("a", {"units": 100, "max_cores": 10**6}, [(100,)])
    b = Matvec("b", {"units": 10, "max_cores": 10**6}, [(100,)])
    p = timing.pipeline_timing([(a, Rect(0, 0, 10, 10)), (b, Rect(10, 0, 1, 10))], fabric,
                               training=True, input_bytes_per_sample=404)
    slowest = max(k.seconds_per_sample for k in p.kernels)
    assert p.compute_samples_per_sec == pytest.approx(1 / slowest)
    assert p.transmission_samples_per_sec == pytest.approx(fabric.io_bytes_per_sec / 404)
    assert p.samples_per_sec == min(p.compute_samples_per_sec, p.transmission_samples_per_sec)
    assert p.fill_seconds == pytest.approx(sum(k.seconds_per_sample for k in p.kernels))
    assert p.step_seconds(256) == pytest.approx(255 / p.samples_per_sec + p.fill_seconds
                                                + p.update_seconds)
    assert p.active_cores == 110


@pytest.mark.parametrize("training", [True, False])
def test_a_batch_barrier_stalls_the_step_by_the_batch_and_its_reductions(training):
    """BatchNormalization in training: the batch queues at the barrier (forward, and again
    backward when training), then C channels' sums cross the region and back."""
    fabric = get_fabric("cs1")
    a = Matvec("a", {"units": 16, "max_cores": 10**6}, [(100,)])
    bn = build_kernel("batch_norm_training", "bn", {"epsilon": 1e-3}, [(16,)])
    plain = timing.pipeline_timing([(a, Rect(0, 0, 10, 10))], fabric, training=training,
                                   input_bytes_per_sample=400)
    p = timing.pipeline_timing([(a, Rect(0, 0, 10, 10)), (bn, Rect(10, 0, 3, 2))], fabric,
                               training=training, input_bytes_per_sample=400)
    passes = 2 if training else 1
    sync = passes * timing.BARRIER_REDUCTIONS * (2 * (3 + 2) + 16 * 4 / 4) / fabric.clock_hz
    assert [(b.name, b.passes) for b in p.barriers] == [("bn", passes)]
    assert p.barriers[0].sync_seconds == pytest.approx(sync)
    assert not plain.barriers
    assert p.step_seconds(256) == pytest.approx(
        255 / p.samples_per_sec * (1 + passes) + p.fill_seconds + p.update_seconds + sync)


def test_a_batch_barrier_and_the_kernels_before_it_hold_the_whole_batch():
    """BatchNormalization in training releases no sample before the batch's last arrived,
    and no gradient returns before its backward gathered the batch: the barrier and every
    kernel before it keep the whole batch's activations (inference: the barrier alone)."""
    dense = Matvec("d", {"units": 16, "max_cores": 1}, [(100,)])
    bn = build_kernel("batch_norm_training", "bn", {"epsilon": 1e-3}, [(16,)])
    after = Matvec("e", {"units": 10, "max_cores": 1}, [(16,)])
    kernels = [dense, bn, after]
    assert timing.batch_samples_held(kernels, 256, training=True) == [256, 256, 0]
    assert timing.batch_samples_held(kernels, 256, training=False) == [0, 256, 0]
    assert timing.batch_samples_held([dense, after], 256, training=True) == [0, 0]
    held = timing.memory_bytes(bn, 1, 3, "sgd", True, 256)
    assert held - timing.weight_bytes(bn, "sgd", True) == bn.activation_bytes_per_sample() * 256
    assert timing.memory_bytes(bn, 1, 3, "sgd", True, 2) == timing.memory_bytes(bn, 1, 3, "sgd", True)


def test_memory_counts_optimizer_slots_and_in_flight_activations():
    k = Matvec("d", {"units": 10, "max_cores": 1}, [(100,)])
    assert timing.memory_bytes(k, 0, 3, "adam", True) == 1000 * 4 * 4 + 400 * 5
    assert timing.memory_bytes(k, 2, 3, "sgd", False) == 1000 * 4 + 400
    assert timing.min_cores_for_memory(48 * 1024 + 1, get_fabric("cs1")) == 2


def test_balanced_bound_respects_parallelism_and_fabric():
    fabric = get_fabric("cs1")
    small = [Matvec("a", {"units": 100, "max_cores": 10}, [(100,)])]
    cap = 10 * fabric.core_flops_per_sec / (3 * 2 * 100 * 100)
    assert timing.balanced_bound_samples_per_sec(small, fabric, training=True) == pytest.approx(cap)
    big = [Matvec(str(i), {"units": 4096, "max_cores": 10**9}, [(4096,)]) for i in range(3)]
    bound = timing.balanced_bound_samples_per_sec(big, fabric, training=True)
    assert bound == pytest.approx(timing.fabric_bound_samples_per_sec(big, fabric, training=True),
                                  rel=1e-6)
    assert math.isfinite(bound)
