"""The Slurm backend's rendering and csrun_wse's Slurm flags, without a cluster."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import CSRunError
from launcher.csrun_wse import job_request, parse_args
from launcher.site_config import SiteConfig, SlurmConfig
from slurm.backend import JobRequest
from slurm.local_backend import LocalBackend
from slurm.slurm_backend import SlurmBackend, refusal, render_script, slurm_options, task_layout
from slurm.task_logs import task_hosts, where_task_runs
from slurm.templates import TEMPLATES, fill

ROOT = Path(__file__).resolve().parents[2]


def request(tmp_path, **fields) -> JobRequest:
    return JobRequest(("python", "run.py"), tmp_path / "job", tmp_path, env={"CSRUN_CS_IP": "h:1"}, **fields)


def test_script_carries_the_request(tmp_path):
    text, tasks = render_script(request(tmp_path, tasks_per_node=3, cpus_per_task=2,
                                        options={"partition": "p1", "time": "1:00:00", "cyclic": "1"},
                                        defaults={"gres": "cs:1", "partition": "site"}), "py")
    assert tasks == 3
    for line in ("#SBATCH --partition=p1", "#SBATCH --time=1:00:00", "#SBATCH --gres=cs:1",
                 "#SBATCH --ntasks-per-node=3", "#SBATCH --cpus-per-task=2", "#SBATCH --distribution=cyclic",
                 "export CSRUN_CS_IP=h:1", "#   python run.py"):
        assert line + "\n" in text
    srun = text.strip().splitlines()[-1]
    assert srun.startswith("srun --unbuffered") and "--kill-on-bad-exit=1 --distribution=cyclic py -u -m " \
        "submitit.core._submit" in srun


def test_without_time_the_partition_default_applies(tmp_path):
    text, _ = render_script(request(tmp_path), "py")
    assert "--time" not in text and "--gres" not in text and "--partition" not in text


def test_unknown_options_and_impossible_layouts_are_refused(tmp_path):
    with pytest.raises(CSRunError, match="the Slurm backend does not take colour"):
        slurm_options(request(tmp_path, options={"colour": "red"}))
    with pytest.raises(CSRunError, match="leaves no node for the other tasks"):
        render_script(request(tmp_path, options={"single_task_nodes": "1"}), "py")


def test_single_task_nodes_counts_one_chief_and_the_workers(tmp_path):
    text, tasks = render_script(request(tmp_path, total_nodes=3, tasks_per_node=4,
                                        options={"single_task_nodes": "1"}), "py")
    assert tasks == 9
    assert "#SBATCH --ntasks=9\n" in text and "--distribution=arbitrary --ntasks=9" in text
    assert "ntasks-per-node" not in text


def test_any_number_of_single_task_nodes_below_the_node_count(tmp_path):
    """The original's --single-task-nodes N: the first N nodes one task each (the chief's
    first), the other nodes --tasks-per-node each; the hostfile the script writes says so."""
    args = parse_args(["--cs_ip", "h:1", "--total-nodes", "4", "--tasks-per-node", "2",
                       "--single-task-nodes", "2", "--", "python", "run.py"])
    text, tasks = render_script(job_request(args, "h:1", tmp_path), "py")
    assert tasks == 6 and "#SBATCH --ntasks=6\n" in text and "--distribution=arbitrary --ntasks=6" in text
    hostfile = next(line for line in text.splitlines() if line.startswith("{ printf"))  # what runs
    for cyclic, expected in (("", "n1 n2 n3 n3 n4 n4"), ("1", "n1 n2 n3 n4 n3 n4")):
        _, setup = task_layout(request(tmp_path, total_nodes=4, tasks_per_node=2),
                               {"single_task_nodes": "2", "cyclic": cyclic})
        if not cyclic:
            assert setup[-1] == hostfile
        script = "nodes=(n1 n2 n3 n4); SLURM_HOSTFILE=/dev/stdout; " + setup[-1]
        assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.split() == \
            expected.split()


def test_tasks_per_node_from_cpus_per_task(tmp_path, capsys):
    """As the original's csrun_wse: --cpus-per-task C alone runs as many C-CPU tasks per node
    as this host's CPUs hold."""
    cpus = len(os.sched_getaffinity(0))
    args = parse_args(["--cs_ip", "h:1", "--cpus-per-task", "1", "true"])
    assert (args.tasks_per_node, args.cpus_per_task) == (cpus, 1)
    assert f"--cpus-per-task 1 without --tasks-per-node: {cpus} task(s) per node" in capsys.readouterr().err
    assert parse_args(["--cs_ip", "h:1", "--cpus-per-task", str(cpus + 1), "true"]).tasks_per_node == 1
    assert parse_args(["--cs_ip", "h:1", "--cpus-per-task", "1", "--tasks-per-node", "3", "true"]).tasks_per_node == 3
    done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--dry-run", "--cpus-per-task", "1",
                           "--cs_ip", "h:1", "--job-dir", str(tmp_path / "j"), "--", "python", "run.py"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert f"# local backend (submitit LocalExecutor): {cpus} task(s) on this host" in done.stdout


def test_refusals_name_what_to_change(tmp_path):
    r = request(tmp_path, defaults={"gres": "cs:2"})
    error = refusal("sbatch: error: Invalid generic resource (gres) specification\n", r)
    assert str(error).startswith("Slurm refused the GRES 'cs:2': Invalid generic resource (gres) specification")
    error = refusal("sbatch: error: Batch job submission failed: Job dependency problem", r)
    assert error.message == "Slurm refused the job: Job dependency problem"


def test_the_cs_as_a_cluster_license(tmp_path):
    """A site of several nodes: the CS system is a license, asked for by every job."""
    site = SiteConfig(slurm=SlurmConfig(gres=None, licenses="cs:1"))
    args = parse_args(["--cs_ip", "h:1", "--total-nodes", "3", "--", "python", "run.py"], site)
    text, _ = render_script(job_request(args, "h:1", tmp_path, site), "py")
    assert "#SBATCH --licenses=cs:1\n" in text and "--gres" not in text and "#SBATCH --nodes=3\n" in text
    error = refusal("sbatch: error: Invalid license specification\n", request(tmp_path, defaults={"licenses": "x:1"}))
    assert str(error).startswith("Slurm refused the license 'x:1': Invalid license specification")
    assert "scontrol show licenses" in error.hint


def test_site_defaults_and_flags(tmp_path):
    site = SiteConfig(slurm=SlurmConfig(nodes=1, tasks_per_node=4, cpus_per_task=2, partition="cs", gres="cs:1"))
    args = parse_args(["--cs_ip", "h:1", "--cyclic", "--", "python", "run.py"], site)
    assert (args.total_nodes, args.tasks_per_node, args.cpus_per_task) == (1, 4, 2)
    req = job_request(args, "h:1", tmp_path, site)
    assert dict(req.options) == {"cyclic": "1"}
    assert dict(req.defaults) == {"partition": "cs", "gres": "cs:1"}
    assert parse_args(["--tasks-per-node", "2", "true"], site).tasks_per_node == 2
    with pytest.raises(CSRunError, match="--detach needs --cs_ip"):
        parse_args(["--detach", "true"])
    with pytest.raises(CSRunError, match=r"--single-task-nodes 2 must be at least 0 and less than the number "
                                         r"of nodes \(2\)"):
        parse_args(["--total-nodes", "2", "--single-task-nodes", "2", "true"])


def test_requeue_from_the_flag_or_the_site_asks_slurm_and_arms_the_task(tmp_path):
    """--requeue (or csrun.yaml slurm.requeue): the job is requeueable and its task requeues it
    when Slurm signals it; without, Slurm's signal ends the job after the chief's checkpoint."""
    site = SiteConfig(slurm=SlurmConfig(requeue=True))
    for args, config in ((["--requeue"], SiteConfig()), ([], site)):
        req = job_request(parse_args(["--cs_ip", "h:1", *args, "--", "python", "run.py"], config), "h:1", tmp_path,
                          config)
        text, _ = render_script(req, "py")
        assert "#SBATCH --requeue\n" in text
        assert SlurmBackend().build(req).task.requeue
    plain = job_request(parse_args(["--cs_ip", "h:1", "python", "run.py"]), "h:1", tmp_path)
    assert "--requeue" not in render_script(plain, "py")[0] and not SlurmBackend().build(plain).task.requeue
    with pytest.raises(CSRunError, match="the local backend does not take --requeue"):
        LocalBackend().build(request(tmp_path, options={"requeue": "1"}))


def test_local_backend_ignores_site_defaults_and_refuses_slurm_flags(tmp_path):
    ok = LocalBackend().build(request(tmp_path, defaults={"gres": "cs:1", "partition": "cs"}))
    assert ok.backend == "local"
    with pytest.raises(CSRunError, match="the local backend does not take --cyclic, --partition"):
        LocalBackend().build(request(tmp_path, options={"partition": "cs", "cyclic": "1"}))


def test_fill_sets_sbatch_lines_and_settings():
    template = (TEMPLATES / "csrun_wse.sbatch").read_text()
    text = fill(template, {"nodes": "2", "partition": "cs"}, {"CS_IP": "h:1"})
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node" in text
    assert "#SBATCH --output=csrun_wse-%j.out\n#SBATCH --partition=cs\n" in text
    assert "\nCS_IP=h:1\n" in text and text.count("#SBATCH --nodes=") == 1
    with pytest.raises(ValueError, match="no setting NOPE"):
        fill(template, {}, {"NOPE": "1"})


def csrun_wse(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    return subprocess.run([sys.executable, "-m", "launcher.csrun_wse", *args], cwd=cwd, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)


def test_emit_sbatch_writes_a_filled_in_template(tmp_path):
    done = csrun_wse(["--emit-sbatch", "j.sbatch", "--tasks-per-node", "3", "--cyclic", "--cs_ip", "h:9",
                      "--", "python", "run.py", "--mode", "train"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "j.sbatch").read_text()
    for line in ("#SBATCH --ntasks-per-node=3", "#SBATCH --gres=cs:1", "#SBATCH --distribution=cyclic",
                 "COMMAND=(python run.py --mode train)", "CS_IP=h:9", f"CSRUN_ENV={sys.prefix}"):
        assert f"\n{line}\n" in text
    assert os.access(tmp_path / "j.sbatch", os.X_OK)
    refused = csrun_wse(["--emit-sbatch", "k.sbatch", "--total-nodes", "2", "--single-task-nodes", "1",
                         "--", "true"], tmp_path)
    assert refused.returncode == 1 and not (tmp_path / "k.sbatch").exists()
    assert refused.stderr.startswith("csrun_wse: error: --single-task-nodes is not in the sbatch template")


def test_slurm_flags_without_slurm_are_one_line(tmp_path):
    done = csrun_wse(["--partition", "cs", "--cs_ip", "h:1", "--", "true"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "csrun_wse: error: the local backend does not take --partition (hint: these settings only apply to Slurm)"]


TASK_LOG = ("submitit INFO (2026-11-22) - Starting with JobEnvironment\n"
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            "I0000 00:00:1795381587.539320   20723 port.cc:153] oneDNN custom operations are on.\n"
            "global step 100: loss = 0.0191494 (56.94 steps/sec)\n"
            "submitit ERROR (2026-11-22) - Submitted job triggered an exception\n"
            "Traceback (most recent call last):\n"
            "  File \"x.py\", line 1, in <module>\n"
            "slurm.task.TaskFailed: exit code 1\n"
            "Loss for final step: 0.1.\n")
TASK_LOG_SHOWN = "global step 100: loss = 0.0191494 (56.94 steps/sec)\nLoss for final step: 0.1.\n"


def test_the_terminal_copy_of_a_task_log_leaves_out_submitit_and_tensorflow_chatter(tmp_path):
    import io

    from slurm.task_logs import LogCopy

    log = tmp_path / "0_log.out"
    log.write_text(TASK_LOG)
    shown = io.StringIO()
    copy = LogCopy(log, shown)
    copy.copy_new(final=True)
    assert copy.offset == log.stat().st_size
    assert shown.getvalue() == TASK_LOG_SHOWN


def test_a_task_log_read_while_it_is_written_shows_the_same_lines(tmp_path):
    """The launcher reads the chief's log while the task writes it: however its reads cut the
    text (between submitit's line and the traceback after it, inside a line), the terminal
    shows what one read of the whole log shows."""
    import io

    from slurm.task_logs import LogCopy

    log = tmp_path / "0_log.out"
    for cut in range(1, len(TASK_LOG)):
        log.write_text(TASK_LOG[:cut])
        shown = io.StringIO()
        copy = LogCopy(log, shown)
        copy.copy_new()
        with open(log, "a") as f:
            f.write(TASK_LOG[cut:])
        copy.copy_new(final=True)
        assert shown.getvalue() == TASK_LOG_SHOWN, cut


def test_every_task_says_where_it_runs_and_the_launcher_reads_it_back(tmp_path):
    line = where_task_runs({"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURMD_NODENAME": "node2",
                            "CSRUN_CS_IP": "127.0.0.1:9"})
    assert line == "csrun: task 3 of 6 on node2 (127.0.0.1 to the CS system at 127.0.0.1:9)"
    log = tmp_path / "log.out"
    log.write_text(f"submitit INFO (...) - Starting\n{line}\nglobal step 1: loss = 2.0\n")
    assert task_hosts(log) == ("node2", "127.0.0.1")
    assert task_hosts(tmp_path / "missing.out") is None
