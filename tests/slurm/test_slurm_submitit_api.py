"""What csrun uses of submitit beyond its API (slurm/submitit_api.py), checked against the
installed submitit: a submitit upgrade that changes any of it fails here."""
from __future__ import annotations

import io
import os
import subprocess

import pytest

from slurm import submitit_api as api
from slurm.task import TaskCommand, TaskFailed
from slurm.task_logs import LogCopy, last_error_line

SBATCH = {"nodes": 2, "cpus_per_task": 3, "ntasks_per_node": 4, "partition": "p", "gres": "cs:1",
          "nodelist": "n1"}


def test_the_sbatch_script_runs_submitits_task_wrapper_with_every_setting(tmp_path):
    folder = tmp_path / "job"
    text = api.sbatch_script(folder, "py", "csrun_wse", ["# setup line", "export A=1"],
                             ["--kill-on-bad-exit=1", "--distribution=cyclic"], SBATCH,
                             {"licenses": "cs:1", "distribution": "cyclic"}, "1:00:00")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for flag in ("--nodes=2", "--cpus-per-task=3", "--ntasks-per-node=4", "--partition=p", "--gres=cs:1",
                 "--nodelist=n1", "--licenses=cs:1", "--distribution=cyclic", "--time=1:00:00",
                 "--job-name=csrun_wse"):
        assert f"#SBATCH {flag}" in lines, flag
    assert not any(line.startswith("#SBATCH --error") for line in lines)  # stderr goes to the task's log
    assert lines.index("# setup line") < lines.index("export A=1") < lines.index(lines[-1])
    # The last line: srun runs the task wrapper, each task's output where the launcher reads it.
    srun = lines[-1]
    pattern = str(api.task_log(folder, "%j", 0)).replace("_0_log", "_%t_log")
    assert srun == (f"srun --unbuffered --output {pattern} --kill-on-bad-exit=1 --distribution=cyclic "
                    f"{api.task_wrapper_command('py', folder)}")
    assert api.task_wrapper_command("py", folder) == f"py -u -m submitit.core._submit {folder}"
    untimed = api.sbatch_script(folder, "py", "j", [], [], {}, {}, None)
    assert "--time" not in untimed  # the partition's default limit


def test_a_changed_sbatch_renderer_is_named(tmp_path, monkeypatch):
    def renderer_without_srun_args(command, folder, job_name="submitit", setup=None, stderr_to_stdout=False,
                                   additional_parameters=None, nodes=1):
        return "#!/bin/bash\n#SBATCH --time=5\n"

    monkeypatch.setattr(api, "_make_sbatch_string", renderer_without_srun_args)
    with pytest.raises(api.SubmititChanged, match=r"submitit \S+ changed _make_sbatch_string's parameters "
                                                  r".*srun_args"):
        api.sbatch_script(tmp_path, "py", "j", [], ["--x"], {}, {}, None)


@pytest.fixture()
def slurm_commands(tmp_path, monkeypatch):
    """Test doubles of sbatch and scancel (and srun, which submitit only looks for): sbatch keeps
    the script it is given and answers as Slurm does; scancel records the job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    doubles = {
        "sbatch": f'cp "$1" {tmp_path}/sbatched.sh\necho "Submitted batch job 4242"',
        "scancel": f'echo "$1" >> {tmp_path}/scancelled',
        "srun": "exit 1",
    }
    for name, body in doubles.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_the_script_executor_submits_the_rendered_script_as_it_is(slurm_commands):
    folder = slurm_commands / "job"
    script = api.sbatch_script(folder, "py", "j", [], [], {"nodes": 1}, {"ntasks": 3}, None)
    job = api.submit_script(folder, script, 3, TaskCommand(("true",), str(slurm_commands), ()))
    assert job.job_id == "4242" and job.num_tasks == 3
    assert (slurm_commands / "sbatched.sh").read_text() == script
    assert api.task_paths(folder, "4242").submission_file.read_text() == script
    assert not (slurm_commands / "scancelled").exists()


def test_a_job_not_submitted_as_rendered_is_cancelled_and_named(slurm_commands, monkeypatch):
    folder = slurm_commands / "job"
    script = api.sbatch_script(folder, "py", "j", [], [], {"nodes": 1}, {}, None)
    monkeypatch.setattr(api.ScriptExecutor, "_make_submission_file_text", lambda self, command, uid: "#!/bin/sh\n")
    with pytest.raises(api.SubmititChanged, match=r"job 4242 was not submitted as rendered, and is cancelled"):
        api.submit_script(folder, script, 1, TaskCommand(("true",), str(slurm_commands), ()))
    assert (slurm_commands / "scancelled").read_text() == "4242\n"


def test_local_tasks_have_their_ranks_logs_and_results(tmp_path):
    """Two local tasks through submitit's LocalExecutor: rank 1 fails with its own error line."""
    script = ('echo "rank $SUBMITIT_LOCAL_GLOBALID"; '
              'if [ "$SUBMITIT_LOCAL_GLOBALID" = 1 ]; then echo "run.py: error: bad batch" >&2; exit 7; fi')
    folder = tmp_path / "job"
    job = api.submit_local(folder, TaskCommand(("sh", "-c", script), str(tmp_path), ()), 2, "j", 5)
    controller = api.local_controller(job)
    assert isinstance(controller, subprocess.Popen)
    assert controller.wait(60) == 0
    chief, worker = (api.task_result(folder, job.job_id, rank) for rank in (0, 1))
    assert chief.succeeded and chief.text == "0"
    assert not worker.succeeded and TaskFailed.exit_code_in(worker.text) == 7
    logs = [api.task_log(folder, job.job_id, rank) for rank in (0, 1)]
    texts = [log.read_text() for log in logs]
    assert all(line.startswith(api.LOG_PREFIX) for text in texts for line in text.splitlines()
               if line.startswith("submitit"))
    assert "csrun: task 1 of 2 on " in texts[1] and api.ERROR_MARKER in texts[1]
    assert last_error_line(logs[1], 7) == "run.py: error: bad batch"
    shown = io.StringIO()
    LogCopy(logs[1], shown).copy_new(final=True)
    assert shown.getvalue() == "rank 1\n"  # its error line: once, in the launcher's line naming the task
    assert api.task_result(folder, job.job_id, 2) is None

