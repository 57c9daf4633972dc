"""The NER tagger of tests/weighted_loss_models.py (tf.compat.v1.losses' default reduction
with a padding mask: sum(w * l) / count_nonzero(w)) through a modelzoo-shaped run.py (in
process, against a CS system serving on a local port): `--cs_ip` trains it on the CS with
the CPU path's losses, and the CS evaluates its checkpoint with the CPU path's metrics."""
from __future__ import annotations

import pytest
import yaml
from fc_mnist_runs import REPO, eval_results, losses
from processes import run_py_in_process

STEPS = 4
RUN_PY = f"""\
import os, sys
sys.path.insert(0, {str(REPO / "tests")!r})
from weighted_loss_models import ner_tagger, tagging_input_fn
from launcher.run_flow import run

run(ner_tagger, tagging_input_fn, tagging_input_fn, here=os.path.dirname(os.path.abspath(__file__)))
"""


@pytest.mark.slow
def test_run_py_trains_and_evaluates_a_masked_loss_on_the_cs_as_on_the_cpu(tmp_path, server):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "params.yaml").write_text(yaml.safe_dump({"runconfig": {
        "max_steps": STEPS, "save_checkpoints_steps": STEPS, "log_step_count_steps": 1,
        "tf_random_seed": 5}}))
    (tmp_path / "run.py").write_text(RUN_PY)

    def tagger(*argv: str) -> str:
        return run_py_in_process(tmp_path / "run.py", list(argv), tmp_path)

    cpu = losses(tagger("--mode", "train", "-o", "cpu"))
    out = tagger("--mode", "train", "--cs_ip", server.address, "-o", "cs")
    assert "Simulated CS system:" in out, out
    cs = losses(out)
    assert sorted(cs) == sorted(cpu) == list(range(1, STEPS + 1))
    for step in cpu:  # (as printed: 6 digits)
        assert cs[step] == pytest.approx(cpu[step], rel=1e-5), step
    on_cpu = eval_results(tagger("--mode", "eval", "--eval_steps", "2", "-o", "cs"))
    on_cs = eval_results(tagger("--mode", "eval", "--eval_steps", "2", "--cs_ip", server.address,
                                "-o", "cs"))
    assert set(on_cs) == set(on_cpu) == {"token_accuracy", "loss", "global_step"}
    for key in on_cpu:
        assert on_cs[key] == pytest.approx(on_cpu[key], rel=1e-5), key
