"""Shared weights, static views of weights and fixed-length recurrences (issue 22): each model
trains on the CS as TensorFlow trains it; a shared weight lives once and its reads are
charged by the timing model; what the CS cannot do is refused at validation, one line."""
from __future__ import annotations

import math

import cs_inprocess
import numpy as np
import pytest
import shared_weight_models as m

from common.errors import CSRunError
from cs_api import pb
from cs_api.tensors import to_tensor
from tests.wse_sim.test_wse_stages import assert_identical, train
from wafer import timing
from wafer.fabric import get_fabric
from wse_sim.errors import CSError
from wse_sim.program import check_program

BASE = {"batch_size": 8, "runconfig": {"tf_random_seed": 1}}
CASES = {
    "tied_embeddings": (m.tied_embeddings, m.token_input_fn, {"optimizer": "adam", "learning_rate": 0.01}),
    "embedding_called_twice": (m.embedding_called_twice, m.token_input_fn, {"optimizer": "adam"}),
    "dense_called_twice": (m.dense_called_twice, m.vector_input_fn, {"optimizer": "momentum"}),
    "sliced_positions": (m.sliced_positions, m.token_input_fn, {}),
    "small_transformer": (m.small_transformer, m.token_input_fn, {"optimizer": "adam", "learning_rate": 0.01}),
    "lstm": (m.recurrent, m.sequence_input_fn, {"optimizer": "adam"}),  # Keras' While loop
    "lstm_sequences": (m.recurrent, m.sequence_input_fn, {"return_sequences": True}),
    "gru": (m.recurrent, m.sequence_input_fn, {"cell": "GRU", "optimizer": "adam"}),
    "gru_sequences": (m.recurrent, m.sequence_input_fn, {"cell": "GRU", "return_sequences": True}),
    "simple_rnn": (m.recurrent, m.sequence_input_fn, {"cell": "SimpleRNN", "optimizer": "momentum"}),
    "lstm_unrolled_by_the_user": (m.recurrent, m.sequence_input_fn, {"unroll": True}),
    "nearest_code": (m.nearest_code, m.vector_input_fn, {"optimizer": "adam", "learning_rate": 0.01}),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    return cs_inprocess.cached_comparisons(CASES, BASE, tmp_path_factory)


# the other tests read the first three; the fourth is a sparse (IndexedSlices) shared update
FAST = ("tied_embeddings", "sliced_positions", "lstm", "embedding_called_twice", "nearest_code")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])
def test_models_reading_a_weight_in_several_places_train_like_tensorflow(compared, name):
    result = compared(name)
    cs_inprocess.assert_same_training(result)
    assert result.cs.losses[0] != result.cs.losses[-1]  # it trained


def test_a_looked_up_table_also_read_whole_is_refused_saying_how_to_pick_its_rows(tmp_path):
    """tf.gather(codebook, codes) makes TF's update sparse while the distances read the whole
    codebook: one line naming the read and the dense form, which trains (nearest_code)."""
    message = cs_inprocess.refusal(m.nearest_code, m.vector_input_fn, {**BASE, "pick": "gather"},
                                   str(tmp_path), m.__file__)
    assert "TF updates codebook as an embedding table (sparse" in message
    assert "by MatMul 'MatMul' at" in message and "tf.matmul(tf.one_hot(ids, rows), codebook)" in message


def shared_routes(program):
    return [r for r in program.routes if r.bytes_per_batch]


def test_a_tied_embedding_lives_once_and_its_read_is_charged(compared):
    program = compared("tied_embeddings").compiled.program
    users = [k.name for k in program.kernels for p in k.params
             if p.variable == "embedding/embeddings"]
    assert len(users) == 2  # the lookup and the output projection
    [route] = shared_routes(program)
    assert (route.src, route.dst, route.bytes_per_batch) == (users[0], users[1], 40 * 8 * 4)
    checked = check_program(program)
    assert checked.num_parameters == sum(math.prod(s) for s in checked.variable_shapes().values())
    fabric = get_fabric(program.fabric)
    t = timing.program_timing(program, checked.kernels, fabric, training=True)
    reader = next(k for k in program.kernels if k.name == route.dst)
    hops = timing.path_hops([(p.x, p.y) for p in route.path])
    expected = 2 * (hops / fabric.clock_hz + route.bytes_per_batch
                    / (reader.region.height * timing.link_bytes_per_sec(fabric)))
    assert t.shared_read_seconds == pytest.approx(expected)
    assert t.step_seconds(8) == pytest.approx(
        7 / t.samples_per_sec + t.fill_seconds + t.update_seconds + expected)
    assert program.estimate.pipeline_fill_seconds == pytest.approx(t.fill_seconds)
    report = compared("tied_embeddings").compiled.report_text
    assert f"Shared weight embedding/embeddings: held by {users[0]}, read over the fabric by " \
        f"{users[1]}" in report


def test_an_lstm_over_fixed_length_sequences_is_unrolled_reading_its_cell_at_every_step(compared):
    program = compared("lstm").compiled.program
    kernel_reads = [k.name for k in program.kernels for p in k.params
                    if p.variable == "lstm/lstm_cell/kernel"]
    assert len(kernel_reads) == m.LENGTH
    assert len(shared_routes(program)) >= 2 * (m.LENGTH - 1)  # kernel and recurrent kernel


def test_a_sliced_position_table_is_a_view_with_its_gradient_scattered_back(compared):
    result = compared("sliced_positions")
    [param] = [p for k in result.compiled.program.kernels for p in k.params
               if p.variable == "position_table/table"]
    assert tuple(param.shape) == (m.LENGTH, m.DIM) and tuple(param.variable_shape) == (m.MAXLEN, m.DIM)
    start = result.compiled.initial_weights["position_table/table"]
    end = result.cs.state["position_table/table"]
    assert not np.array_equal(end[:m.LENGTH], start[:m.LENGTH])
    np.testing.assert_array_equal(end[m.LENGTH:], start[m.LENGTH:])  # rows no sample reads
    assert f"View of position_table/table ({m.MAXLEN}, {m.DIM}): ({m.LENGTH}, {m.DIM})" in \
        result.compiled.report_text


def test_shared_weights_give_the_same_bits_on_any_number_of_stages(compared):
    compiled = compared("tied_embeddings").compiled
    rng = np.random.default_rng(3)
    batches = [{"features": rng.integers(0, m.VOCAB, (8, m.LENGTH)).astype(np.int32),
                "labels": rng.integers(0, m.VOCAB, (8, m.LENGTH)).astype(np.int32)}
               for _ in range(3)]
    assert_identical(train(compiled, batches, 1), train(compiled, batches, 3))


@pytest.mark.parametrize("model_fn, input_fn, extra, words", [
    (m.gathered_rows, m.token_input_fn, {"optimizer": "adam"}, "TF updates embeddings sparsely"),
])
def test_what_the_cs_cannot_do_is_refused_at_validation_in_one_line(tmp_path, model_fn,
                                                                    input_fn, extra, words):
    with pytest.raises(CSRunError) as refused:
        cs_inprocess.compile_checked(model_fn, input_fn, {**BASE, **extra}, str(tmp_path))
    assert words in str(refused.value)
    assert cs_inprocess.refusal_problem(refused.value, m.__file__, cs_inprocess.model_op_words(
        model_fn, input_fn, {**BASE, **extra})) == ""


def program_with(views: list[np.ndarray | None], frozen=(False, False)) -> pb.Program:
    """Two binary kernels adding a weight (or views of it) to the features."""
    program = pb.Program(name="p", batch_size=4, micro_batch_size=4)
    program.inputs.add(name="features", dtype=pb.FLOAT32, shape=[3])
    source = "features"
    for k, (view, fr) in enumerate(zip(views, frozen)):
        kernel = program.kernels.add(name=f"add{k}", type="binary", inputs=[source],
                                     output_shape=[3])
        kernel.attrs["op"].s = "add"
        kernel.attrs["operands"].s = "ip"
        kernel.attrs["p1"].ints.values.extend([3])
        param = kernel.params.add(role="p1", variable="w", shape=[3], dtype=pb.FLOAT32,
                                  variable_shape=[6] if view is not None else [], frozen=fr)
        if view is not None:
            param.view.CopyFrom(to_tensor("view", view))
        source = kernel.name
    return program


def test_the_cs_checks_a_shared_weight_and_its_views():
    checked = check_program(program_with([None, None]))
    assert [u.kernel for u in checked.shared["w"].uses] == [0, 1]
    checked = check_program(program_with([np.array([0, 2, 4]), np.array([5, 4, 3])]))
    assert checked.variable_shapes() == {"w": (6,)} and checked.num_parameters == 6
    for bad, words in [(program_with([np.array([0, 2, 6]), None]), "outside the variable"),
                       (program_with([np.array([0, 2], np.int64), None]), "must be int64 (3,)"),
                       (program_with([np.array([0, 1, 2], np.int32), None]), "must be int64"),
                       (program_with([None, None], frozen=(False, True)), "trains it otherwise")]:
        with pytest.raises(CSError, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_program(bad)


@pytest.mark.parametrize("name", ["lstm", pytest.param("gru_sequences", marks=pytest.mark.slow)])
def test_a_recurrent_layer_trained_on_the_cs_predicts_and_evaluates_there_like_the_cpu(compared, name, tmp_path):
    """The predict graph has no loss: its unrolled recurrence is proven by its predictions."""
    model_fn, input_fn, extra = CASES[name]
    params = {**BASE, **extra}
    for mismatch in (cs_inprocess.prediction_mismatch, cs_inprocess.evaluation_mismatch):
        assert not mismatch(model_fn, input_fn, params, str(tmp_path), compared(name))
