"""Placement invariants over random MLP and CNN stacks (hypothesis property tests)."""
from functools import partial

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from coordinator.compiler.placement import TooLargeError, place
from wafer import timing
from wafer.fabric import get_fabric
from wafer.kernels import build_kernel


def mlp(widths, n_in):
    kernels, shape = [], (n_in,)
    for i, units in enumerate(widths):
        k = build_kernel("dense", f"d{i}", {"units": units, "use_bias": True,
                                            "activation": "relu"}, [shape])
        kernels.append(k)
        shape = k.output_shape
    kernels.append(build_kernel("softmax_cross_entropy_with_logits", "xent", {"sparse": True},
                                [shape, ()]))
    kernels.append(build_kernel("loss", "loss", {"scale": 1 / 256}, [()]))
    return kernels


def cnn(side, channels, filters, pools, units):
    kernels, shape = [], (side, side, channels)
    for i, f in enumerate(filters):
        k = build_kernel("conv2d", f"c{i}", {"filters": f, "kernel_size": [3, 3],
                                             "strides": [1, 1], "padding": "SAME",
                                             "use_bias": True, "activation": "relu"}, [shape])
        kernels.append(k)
        shape = k.output_shape
        if i < pools and shape[0] >= 2:
            k = build_kernel("max_pool", f"p{i}", {"pool_size": [2, 2], "strides": [2, 2],
                                                   "padding": "VALID"}, [shape])
            kernels.append(k)
            shape = k.output_shape
    flat = build_kernel("reshape", "flat", {"shape": [shape[0] * shape[1] * shape[2]]}, [shape])
    kernels.append(flat)
    return kernels + mlp([units, 10], flat.output_shape[0])


mlps = st.builds(partial, st.just(mlp), st.lists(st.integers(1, 6000), min_size=1, max_size=30),
                 st.integers(1, 4096))
cnns = st.builds(partial, st.just(cnn), st.sampled_from([8, 16, 28, 64]), st.integers(1, 4),
                 st.lists(st.integers(1, 256), min_size=1, max_size=6), st.integers(0, 3),
                 st.integers(1, 2048))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.one_of(mlps, cnns), fabric_name=st.sampled_from(["cs1", "cs2"]),
       optimizer=st.sampled_from(["sgd", "momentum", "adam"]))
@example(model=partial(cnn, 64, 1, [24, 130, 24], 0, 1), fabric_name="cs1", optimizer="sgd")
@example(model=partial(cnn, 64, 1, [149], 0, 1), fabric_name="cs1", optimizer="sgd")
@example(model=partial(mlp, [4096] * 23 + [10], 784), fabric_name="cs1", optimizer="adam")
def test_every_kernel_gets_a_rectangle_inside_the_fabric_without_overlap(model, fabric_name,
                                                                        optimizer):
    kernels = model()
    fabric = get_fabric(fabric_name)
    try:
        placement = place(kernels, fabric, training=True, optimizer=optimizer)
    except TooLargeError as error:  # only when the memory really exceeds the wafer
        assert error.needed_bytes > 0.5 * fabric.sram_bytes
        return
    rects = placement.regions
    assert len(rects) == len(kernels)
    for r in rects:
        assert r.width >= 1 and r.height >= 1
        assert 0 <= r.x and r.x + r.width <= fabric.width
        assert 0 <= r.y and r.y + r.height <= fabric.height
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert not a.overlaps(b)
    assert all(m <= fabric.sram_per_core for m in placement.memory_per_core)
    n = len(kernels)
    for i, (k, r) in enumerate(zip(kernels, rects)):
        needed = timing.memory_bytes(k, i, n, optimizer, True)
        assert timing.memory_per_core(needed, r.cores) <= fabric.sram_per_core
    assert placement.timing.compute_samples_per_sec <= placement.balanced_bound * 1.000001
    assert placement.quality >= 0.9
