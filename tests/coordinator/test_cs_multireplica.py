"""Multireplica on the simulated CS, in process: R copies of the network each take their slice
of every batch and the replicas' gradients are summed before the one update, so a run ends
with the weights of a one-replica run and of TensorFlow (summation order only). Evaluation
runs one copy, saying so; counts that cannot work are one line each."""
from __future__ import annotations

import json
import os

import compiler_models as m
import cs_inprocess
import numpy as np
import pytest
import tf_reference
import training_models as tm

from common.errors import CSRunError
from coordinator.compiler import compile_model
from tests.wse_sim import test_wse_stages as stages
from wafer import timing
from wafer.fabric import get_fabric
from wse_sim.errors import CSError
from wse_sim.limits import check_sizes
from wse_sim.program import check_program

MLP = {"batch_size": 32, "hidden": [64, 32], "optimizer": "adam", "learning_rate": 0.01}


def with_replicas(params: dict, **runconfig) -> dict:
    return {**params, "runconfig": {"tf_random_seed": 1, **runconfig}}


def one_replica_run(model_fn, input_fn, params, model_dir, steps, weights):
    """The same model compiled without multireplica, trained from `weights` on the same batches."""
    single = cs_inprocess.compile_checked(model_fn, input_fn, params, model_dir)
    assert single.program.num_replicas == 1
    return cs_inprocess.run_on_cs(single.program, weights, tf_reference.batches(input_fn, params, steps))


def assert_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float = 1e-4) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        scale = float(np.abs(b[name]).max(initial=0.0))
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=rtol * scale, err_msg=name)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """An MLP trained 4 steps with 4 replicas (8 samples each of every batch of 32)."""
    return cs_inprocess.compare(m.keras_mlp, m.input_fn, with_replicas(MLP, num_replicas=4),
                                str(tmp_path_factory.mktemp("md")), steps=4)


def test_four_replicas_train_like_tensorflow_and_like_one_replica(four, tmp_path):
    program = four.compiled.program
    assert program.num_replicas == 4 and program.batch_size == 32
    assert (32 // 4) % program.micro_batch_size == 0 and len(program.replica_offsets) == 4
    assert cs_inprocess.mismatches(four) == []  # TensorFlow's losses and weights (and slots)
    single = one_replica_run(m.keras_mlp, m.input_fn, with_replicas(MLP), str(tmp_path), 4,
                             four.compiled.initial_weights)
    np.testing.assert_allclose(four.cs.losses, single.losses, rtol=1e-5)
    assert_close(four.cs.state, single.state)


def test_the_compile_report_and_its_json_show_the_replicas(four):
    text = four.compiled.report_text
    assert "Replicas: 4 copies of the network (multireplica)" in text
    assert "each taking 8 consecutive samples of every batch of 32" in text
    with open(os.path.join(four.compiled.directory, "compile_report.json")) as f:
        estimate = json.load(f)
    assert estimate["replicas"]["count"] == 4 and len(estimate["replicas"]["offsets"]) == 4
    assert os.path.getsize(os.path.join(four.compiled.directory, "placement.png")) > 0
    # the CS times a step from the program as the compiler did
    program = four.compiled.program
    simulated = timing.program_timing(program, check_program(program).kernels, get_fabric("cs1"),
                                      training=True)
    assert simulated.replicas == 4
    assert simulated.step_seconds(32) == pytest.approx(estimate["estimate"]["step_seconds"])
    assert simulated.samples_per_sec == pytest.approx(estimate["estimate"]["samples_per_sec"])


@pytest.mark.slow
@pytest.mark.parametrize("model_fn, input_fn, params", [
    (tm.embedding_bag, tm.ids_input_fn, {"optimizer": "adam"}),  # ids repeated across replicas
    (tm.clip_global_norm, tm.input_fn, {}),  # the norm of the replicas' summed gradients
], ids=["sparse_embedding", "clip_by_global_norm"])
def test_sparse_updates_and_gradient_clipping_over_two_replicas(model_fn, input_fn, params,
                                                                tmp_path):
    """An embedding table's IndexedSlices from both replicas, and a global-norm clip of the
    summed gradient: TF's numbers."""
    result = cs_inprocess.compare(model_fn, input_fn, with_replicas(params, num_replicas=2),
                                  str(tmp_path), steps=2)
    assert result.compiled.program.num_replicas == 2
    assert cs_inprocess.mismatches(result) == []


@pytest.mark.slow
def test_dropout_masks_are_those_of_one_replica(tmp_path):
    """Each replica's samples get the masks a one-replica run draws for them."""
    params = with_replicas({}, num_replicas=2)
    two = cs_inprocess.compile_checked(tm.keras_dropout_adam, tm.input_fn, params, str(tmp_path / "a"))
    data = tf_reference.batches(tm.input_fn, params, 3)
    multi = cs_inprocess.run_on_cs(two.program, two.initial_weights, data)
    single = one_replica_run(tm.keras_dropout_adam, tm.input_fn, with_replicas({}),
                             str(tmp_path / "b"), 3, two.initial_weights)
    np.testing.assert_allclose(multi.losses, single.losses, rtol=1e-6)
    assert_close(multi.state, single.state, rtol=1e-5)


def test_evaluation_under_multireplica_runs_one_copy_and_says_so(four, tmp_path, capsys):
    params = with_replicas(MLP, multireplica=True)
    assert cs_inprocess.evaluation_mismatch(m.keras_mlp, m.input_fn, params, str(tmp_path), four) == ""
    out = capsys.readouterr().out
    assert out.count("multireplica is for training (as on the original CS system): eval runs "
                     "on one copy of the network") == 1


@pytest.mark.parametrize("runconfig, message", [
    ({"num_replicas": 3}, "runconfig.num_replicas 3 does not divide the batch size 32"),
    ({"num_replicas": 0}, "runconfig.num_replicas is 0, not a whole number >= 1 or -1"),
    ({"multireplica": "yes"}, "runconfig.multireplica is 'yes', not true or false"),
])
def test_counts_that_cannot_work_are_one_line(runconfig, message, tmp_path):
    with pytest.raises(CSRunError, match=message) as error:
        compile_model(m.keras_mlp, m.input_fn, with_replicas(MLP, **runconfig), str(tmp_path))
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_more_copies_than_fit_are_one_line(tmp_path):
    """784-2000-2000-10 with Adam needs about 1,850 cores for its memory: 256 copies do not fit
    on the 400,689 cores of a CS-1."""
    params = with_replicas({"batch_size": 256, "hidden": [2000, 2000], "optimizer": "adam"},
                           num_replicas=256)
    with pytest.raises(CSRunError, match=r"runconfig.num_replicas 256: 256 copies of the model "
                                         r"do not fit on cs1 \(400,689 cores\)") as error:
        compile_model(m.keras_mlp, m.input_fn, params, str(tmp_path))
    assert "\n" not in str(error.value)


def test_the_cs_refuses_replicas_that_overlap_or_do_not_split_the_batch(four):
    fabric = get_fabric("cs1")
    overlapping = type(four.compiled.program)()
    overlapping.CopyFrom(four.compiled.program)
    overlapping.replica_offsets[1].x, overlapping.replica_offsets[1].y = 1, 0
    with pytest.raises(CSError, match="overlap"):
        check_sizes(overlapping, fabric)
    uneven = type(four.compiled.program)()
    uneven.CopyFrom(four.compiled.program)
    uneven.num_replicas = 3
    del uneven.replica_offsets[3]
    with pytest.raises(CSError, match="does not split into 3 replicas"):
        check_sizes(uneven, fabric)
    off = type(four.compiled.program)()
    off.CopyFrom(four.compiled.program)
    off.replica_offsets[3].x = fabric.width
    with pytest.raises(CSError, match="is not on the cs1 fabric"):
        check_sizes(off, fabric)


@pytest.mark.slow
def test_the_replicas_sum_is_the_same_on_one_two_or_three_stage_threads(tmp_path):
    compiled, data = stages.mlp(tmp_path, "adam", learning_rate=1e-3,
                                runconfig={"tf_random_seed": 1, "num_replicas": 4})
    assert compiled.program.num_replicas == 4
    one = stages.train(compiled, data, 1)
    stages.assert_identical(one, stages.train(compiled, data, 2))
    stages.assert_identical(one, stages.train(compiled, data, 3))
