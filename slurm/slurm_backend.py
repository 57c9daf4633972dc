"""The Slurm launch backend: a job's tasks as one Slurm job, through submitit's Slurm executor.

`render_script(request)` is the one rendering of the sbatch script: `build` calls it,
`--dry-run` prints its text and `submit` hands that very text to sbatch
(`submitit_api.submit_script`), so what is printed is what is submitted; submitit keeps the
submitted file as `<job id>_submission.sh` in the job folder.

What the script asks of Slurm:
- `--nodes`, `--ntasks-per-node`, `--cpus-per-task` from the request; every task runs
  `TaskCommand` (the user's command, rank from `SLURM_PROCID`) through `srun`; a task that
  fails ends the step (`--kill-on-bad-exit`).
- `gres` (csrun.yaml `slurm.gres`, default `cs:1`): the CS system is a GRES, so a second job
  waits in the queue until the first ends. Slurm counts a GRES per node: a job of several
  nodes needs it on each of them (`gres_node` names the node that holds it; the chief's).
- `licenses` (csrun.yaml `slurm.licenses`, e.g. `cs:1`): the CS system as a cluster license,
  what a site of several nodes configures (one CS for the cluster, any node's job may hold it).
- `requeue` (csrun_wse --requeue, csrun.yaml `slurm.requeue`): `--requeue`, and a task that
  requeues the job when Slurm signals it (`slurm.task`: the chief checkpoints first).
- `partition`, `time` (none: the partition's default limit), `cyclic` (tasks round-robin over
  the nodes), `single_task_nodes` N (the first N nodes run one task each, the chief on the
  first; the other nodes `tasks_per_node` each).
- `same_host` (the tasks reach the embedded simulator on this host's loopback): the job is
  pinned to this host's Slurm node (`--nodelist`); several nodes, or a host that is not a
  Slurm node, are a clear error (start `wse_sim serve --host ADDR` and pass `--cs_ip`).
- `request.env` is exported in the script (it is visible in `--dry-run`).

Slurm's own refusals (sbatch's error) become one line naming what to change. Submitting
happens in `submitit.helpers.clean_env()` (SLURM_CONF kept), so a job submitted from inside another job does
not inherit its SLURM_* variables. The job's state comes from `scontrol show job` (then
`sacct` once the controller forgot it): submitit's own watcher throttles sacct to minutes.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from submitit.core.utils import FailedJobError
from submitit.helpers import clean_env

from common.errors import CSRunError
from slurm.backend import JobOutcome, JobRequest, LaunchBackend, LaunchedJob, Submission
from slurm.submitit_api import sbatch_script, submit_script
from slurm.task import TaskCommand
from slurm.task_logs import task_hosts

OPTION_KEYS = ("partition", "time", "gres", "gres_node", "licenses", "cyclic", "single_task_nodes", "requeue")
_TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
             "BOOT_FAIL", "DEADLINE")
_CANCELLED_EXIT = 143  # 128 + SIGTERM: what a shell reports for a job scancel ended


def slurm_answers(timeout_s: float = 5.0) -> bool:
    """Whether a Slurm controller answers here (`scontrol ping` succeeds)."""
    if shutil.which("scontrol") is None:
        return False
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "UP" in done.stdout


def _truthy(value: str | None) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def slurm_options(request: JobRequest) -> dict[str, str]:
    """The request's Slurm settings: the site's defaults, then the user's options."""
    unknown = sorted(set(request.options) - set(OPTION_KEYS))
    if unknown:
        raise CSRunError(f"the Slurm backend does not take {', '.join(unknown)}",
                         f"it takes {', '.join(OPTION_KEYS)}")
    merged = {k: v for k, v in {**request.defaults, **request.options}.items() if k in OPTION_KEYS}
    return {k: v for k, v in merged.items() if v not in (None, "")}


def task_layout(request: JobRequest, options: dict[str, str]) -> tuple[int, list[str]]:
    """How many tasks, and the setup lines placing them (single-task nodes, cyclic)."""
    single = int(options.get("single_task_nodes", "0") or 0)
    if not single:
        return request.num_tasks, []
    if not 0 < single < request.total_nodes:
        raise CSRunError(f"--single-task-nodes {single} with --total-nodes {request.total_nodes} leaves no "
                         "node for the other tasks", f"use --total-nodes {single + 1} or more, or fewer "
                         "single-task nodes")
    per_node = request.tasks_per_node
    tasks = single + (request.total_nodes - single) * per_node
    order = "cyclic" if _truthy(options.get("cyclic")) else "block"
    # SLURM_HOSTFILE + --distribution=arbitrary: one task on each of the first nodes, the chief first.
    rest = '"${nodes[@]:%d}"' % single
    setup = [
        f"# one task on each of the first {single} node(s), the chief's first; "
        f"{per_node} on each other node ({order})",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        f'export SLURM_HOSTFILE={shlex.quote(str(request.folder))}/"hostfile_$SLURM_JOB_ID"',
        '{ printf "%%s\\n" "${nodes[@]:0:%d}"; ' % single
        + ('for i in $(seq %d); do printf "%%s\\n" %s; done; }' % (per_node, rest)
           if order == "cyclic" else
           'for n in %s; do for i in $(seq %d); do echo "$n"; done; done; }' % (rest, per_node))
        + ' > "$SLURM_HOSTFILE"',
    ]
    return tasks, setup


def this_host_node() -> str:
    """The Slurm node that is this host (for jobs that must run here)."""
    for name in dict.fromkeys((socket.gethostname().split(".")[0], socket.gethostname())):
        done = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True)
        if done.returncode == 0 and f"NodeName={name} " in done.stdout:
            return name
    raise CSRunError(
        f"this host ({socket.gethostname()}) is not a Slurm node, so a job's tasks cannot reach the "
        "embedded CS simulator on its loopback",
        "start `wse_sim serve --host ADDRESS` where the tasks can reach it and pass --cs_ip ADDRESS:PORT")


def render_script(request: JobRequest, python: str) -> tuple[str, int]:
    """The sbatch script submitted for `request` (and printed by --dry-run); its task count."""
    options = slurm_options(request)
    num_tasks, placement = task_layout(request, options)
    sbatch: dict[str, object] = {"nodes": request.total_nodes, "cpus_per_task": request.cpus_per_task}
    extra: dict[str, object] = {}
    srun_args = ["--kill-on-bad-exit=1"]
    if placement:
        extra["ntasks"] = num_tasks
        srun_args += ["--distribution=arbitrary", f"--ntasks={num_tasks}"]
    else:
        sbatch["ntasks_per_node"] = request.tasks_per_node
        if _truthy(options.get("cyclic")):
            extra["distribution"] = "cyclic"
            srun_args.append("--distribution=cyclic")
    for key in ("partition", "gres"):
        if key in options:
            sbatch[key] = options[key]
    if "licenses" in options:
        extra["licenses"] = options["licenses"]
    if _truthy(options.get("requeue")):  # Slurm may requeue it (scontrol requeue, a preemption)
        extra["requeue"] = True
    if request.same_host:
        if request.total_nodes != 1:
            raise CSRunError(
                f"--total-nodes {request.total_nodes} without --cs_ip: the embedded CS simulator listens on "
                "this host's loopback, which other nodes cannot reach",
                "start `wse_sim serve --host ADDRESS` on a host the nodes reach and pass --cs_ip ADDRESS:PORT")
        sbatch["nodelist"] = this_host_node()
    elif "gres_node" in options:
        sbatch["nodelist"] = options["gres_node"]
    env = [f"export {k}={shlex.quote(v)}" for k, v in sorted(request.env.items())]
    setup = [
        f"# csrun: {num_tasks} task(s); rank 0 (SLURM_PROCID) is the chief, the others input workers.",
        f"# every task runs, from {request.workdir}:",
        f"#   {shlex.join(request.command)}",
        *env,
        *placement,
    ]
    # without --time the partition's default applies
    text = sbatch_script(request.folder, python, request.name, setup, srun_args, sbatch, extra,
                         options.get("time"))
    return text, num_tasks


class SlurmBackend(LaunchBackend):
    name = "slurm"

    @classmethod
    def available(cls) -> bool:
        return slurm_answers()

    def build(self, request: JobRequest) -> Submission:
        text, num_tasks = render_script(request, shlex.quote(sys.executable))
        task = TaskCommand(tuple(request.command), str(request.workdir), (),
                           requeue=_truthy(slurm_options(request).get("requeue")))
        return Submission(request, self.name, text, task, num_tasks)

    def submit(self, submission: Submission) -> "SlurmJob":
        request = submission.request
        conf = os.environ.get("SLURM_CONF")  # which cluster: not an outer job's variable
        with clean_env():
            if conf:
                os.environ["SLURM_CONF"] = conf
            # Slurm queues a job it can never run (reason PartitionConfig): ask it first.
            check = subprocess.run(["sbatch", "--test-only"], input=submission.text, capture_output=True,
                                   text=True)
            if check.returncode != 0:
                raise refusal(check.stderr or check.stdout, request)
            request.folder.mkdir(parents=True, exist_ok=True)
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's errors
                    job = submit_script(request.folder, submission.text, submission.num_tasks, submission.task)
            except FailedJobError as error:
                raise refusal(str(error), request) from None
        return SlurmJob(job, request.folder, submission.num_tasks)


def refusal(text: str, request: JobRequest) -> CSRunError:
    """sbatch's refusal as one line that says what to change."""
    lines = [ln.strip() for ln in text.splitlines() if "error:" in ln or "failure:" in ln]
    message = lines[-1] if lines else (text.strip().splitlines() or ["no reason given"])[-1]
    message = re.sub(r"^(sbatch: error: )?((Batch job submission failed|allocation failure):\s*)?", "", message)
    options = slurm_options(request)
    if "Invalid partition" in message:
        return CSRunError(f"Slurm has no partition {options.get('partition')!r}",
                          f"partitions here: {', '.join(partitions()) or 'none'} (sinfo -s)")
    if "node configuration is not available" in message or "More processors requested" in message:
        return CSRunError(
            f"Slurm can never give this job {request.total_nodes} node(s) x {request.tasks_per_node} task(s) "
            f"x {request.cpus_per_task} CPU(s) ({message})",
            f"the cluster has {capacity()}; ask for fewer --total-nodes/--tasks-per-node/--cpus-per-task")
    if "license" in message.lower():
        return CSRunError(f"Slurm refused the license {options.get('licenses')!r}: {message}",
                          "set slurm.licenses in csrun.yaml to the CS system's license (scontrol show "
                          "licenses), or null")
    if "gres" in message.lower():
        return CSRunError(f"Slurm refused the GRES {options.get('gres')!r}: {message}",
                          "set slurm.gres in csrun.yaml to the CS system's GRES (e.g. cs:1), or null")
    return CSRunError(f"Slurm refused the job: {message}", "see sbatch's documentation for the setting named")


def partitions() -> list[str]:
    done = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    return sorted(set(done.stdout.split())) if done.returncode == 0 else []


def capacity() -> str:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %G"], capture_output=True, text=True)
    nodes = sorted(set(done.stdout.strip().splitlines()))
    return "; ".join(f"node {n.split()[0]}: {n.split()[1]} CPUs, gres {n.split()[2]}" for n in nodes) or "no nodes"


def job_fields(job_id: str) -> dict[str, str] | None:
    """The controller's `scontrol show job` fields, None once it forgot the job."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)


def failed_nodes(nodelist: str, probe: bool = False) -> list[tuple[str, str]]:
    """(node, reason) of the nodes in `nodelist` that are down or not answering the controller;
    with `probe`, also those whose slurmd does not accept a connection now (the controller
    notices only after SlurmdTimeout; srun reaches slurmd from here too, so a refusal means
    the node, not the network policy)."""
    done = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E|%o"], capture_output=True,
                          text=True)
    nodes, addresses = {}, {}
    for line in done.stdout.splitlines():
        node, state, reason, address = (line.split("|", 3) + ["", "", ""])[:4]
        addresses[node] = address
        if state.endswith("*") or state.startswith(("down", "fail")):
            nodes[node] = f"{state.rstrip('*')}{', not responding' if state.endswith('*') else ''}" + (
                f": {reason}" if reason and reason != "none" else "")
    if probe and len(addresses) > 1:
        port = slurmd_port()
        with ThreadPoolExecutor(len(addresses)) as pool:
            silent = pool.map(lambda a: _refuses(a, port), addresses.values())
            for (node, address), why in zip(addresses.items(), silent):
                if why and node not in nodes:
                    nodes[node] = f"its slurmd at {address}:{port} does not answer: {why}"
    return sorted(nodes.items())


def slurmd_port() -> int:
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    match = re.search(r"^SlurmdPort\s*=\s*(\d+)", done.stdout, re.M)
    return int(match.group(1)) if match else 6818


def _refuses(address: str, port: int, timeout_s: float = 3.0) -> str:
    """Why a TCP connection to address:port fails ("" when it is accepted)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return ""
    except OSError as error:
        return error.strerror or type(error).__name__


def job_state(job_id: str) -> tuple[str, str]:
    """(state, reason) of a Slurm job: the controller's view, else the accounting's."""
    fields = job_fields(job_id)
    if fields is not None:
        return fields.get("JobState", "UNKNOWN"), fields.get("Reason", "")
    done = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    state = done.stdout.strip().splitlines()[0] if done.stdout.strip() else "UNKNOWN"
    return state.split()[0], state


def cs_queue(gres: str | None, licenses: str | None) -> list[dict[str, str]]:
    """The Slurm jobs holding or waiting for the CS system (the site's GRES or license, by
    name), running first, then by expected start: id, user, state, reason, start (the
    start time, or Slurm's expected start of a pending job), node list."""
    names = [n.split(":")[0] for n in (gres, licenses) if n]
    done = subprocess.run(["squeue", "-h", "-t", "RUNNING,PENDING,COMPLETING,CONFIGURING", "-o",
                           "%i|%u|%T|%r|%S|%N|%b|%W"], capture_output=True, text=True)
    rows = []
    for line in done.stdout.splitlines():
        fields = line.split("|")
        if len(fields) != 8:
            continue
        wants = f"{fields[6]},{fields[7]}"
        if any(re.search(rf"(^|[,:/]){re.escape(name)}([:,(]|$)", wants) for name in names):
            rows.append(dict(zip(("job_id", "user", "state", "reason", "start", "nodes"), fields[:6])))
    return sorted(rows, key=lambda r: (r["state"] != "RUNNING", r["start"]))


def scancel(job_id: str) -> None:
    """Cancel a Slurm job (every step and task of it)."""
    subprocess.run(["scancel", job_id], capture_output=True, text=True)


class SlurmJob(LaunchedJob):
    poll_seconds = 0.5

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._restarts = 0  # Slurm's requeues of the job seen so far

    def _restart_count(self) -> int:
        return int((job_fields(self.job_id) or {}).get("Restarts", "0") or 0)

    def _requeued(self) -> str | None:
        restarts = self._restart_count()
        if restarts <= self._restarts:
            return None
        self._restarts = restarts
        deadline = time.monotonic() + 30.0
        while self.state() in ("COMPLETING", "REQUEUED") and time.monotonic() < deadline:
            time.sleep(0.2)  # the run before stops; its tasks leave their results
        return (f"csrun: Slurm requeued job {self.job_id} (restart {restarts}); it resumes from the newest "
                "checkpoint when it runs again")

    def state(self) -> str:
        return job_state(self.job_id)[0]

    def _ended_state(self) -> str | None:
        state = self.state()
        return state if state in _TERMINAL else None

    def _ended(self, state: str) -> JobOutcome:
        if state == "NODE_FAIL":  # a lost host: name it, not the symptom
            return self._node_failure() or self._without_result(state)
        return super()._ended(state)

    def _explain_failure(self, outcome: JobOutcome) -> JobOutcome | None:
        state = self._settled_state()
        if self._restart_count() > self._restarts:  # stopped by a requeue: the next look says so
            return None
        if state == "CANCELLED":  # scancel: the tasks' SIGTERM is its sign
            return self._without_result("CANCELLED")
        if state == "NODE_FAIL" or self._multi_node:  # a lost host: name it, not the symptom
            return self._node_failure(probe=state != "NODE_FAIL") or outcome
        return outcome

    def _settled_state(self, timeout_s: float = 10.0) -> str:
        """The job's state once it is past COMPLETING (Slurm's state while it stops tasks)."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state()) == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.2)
        return state

    @property
    def _multi_node(self) -> bool:
        return int((job_fields(self.job_id) or {}).get("NumNodes", "1").split("-")[0] or 1) > 1

    def _node_failure(self, probe: bool = False) -> JobOutcome | None:
        """A node of the job failed (the job ended NODE_FAIL, or, with `probe`, a task failed
        and a node's slurmd does not answer): which node, and the tasks that ran there (from
        their first log line)."""
        fields = job_fields(self.job_id) or {}
        nodes = failed_nodes(fields["NodeList"], probe) if fields.get("NodeList") else []
        if not nodes:
            return None
        node, why = nodes[0]
        on_node = [(rank, hosts[1]) for rank in range(self.num_tasks)
                   if (hosts := task_hosts(self.task_log(rank))) and hosts[0] == node]
        if not on_node:
            return JobOutcome(1, None, f"Slurm job {self.job_id} ended NODE_FAIL: node {node} failed ({why}) "
                                       "before any task started on it")
        ranks = ", ".join(str(rank) for rank, _ in on_node)
        return JobOutcome(1, on_node[0][0], f"its node {node} ({on_node[0][1]}) failed ({why}); "
                                            f"task(s) on {node}: {ranks}")

    def _without_result(self, state: str) -> JobOutcome:
        if state == "CANCELLED":
            return JobOutcome(_CANCELLED_EXIT, None, f"Slurm job {self.job_id} was cancelled (scancel)")
        return JobOutcome(1, None, f"Slurm job {self.job_id} ended {state} without a result from its tasks")

    def _stop(self) -> None:
        self._job.cancel(check=False)  # scancel
