"""csrun_wse: run a training script on the CS system, as a job of a chief and input workers.

    csrun_wse [--total-nodes N] [--tasks-per-node T] [--cpus-per-task C]
              [--single-task-nodes N] [--cyclic] [--partition P] [--time T] [--requeue]
              [--mount-dirs A,B] [--cs_ip HOST:PORT] [--job-dir DIR] [--dry-run] [--detach] [--emit-sbatch FILE]
              [--debug] [--] python run.py …

Every task runs the command; rank 0 is the chief, the others input workers
(`coordinator.roles`). When a Slurm controller answers the job is one Slurm job
(`slurm/slurm_backend.py`: the CS GRES, partition, time, placement flags); otherwise the
tasks are local processes (submitit's local executor, `slurm/local_backend.py`), which
refuse the Slurm-only flags. Defaults come from the site's csrun.yaml
(`launcher.site_config`); as in the original, `--cpus-per-task C` without `--tasks-per-node`
runs as many tasks per node as C-CPU tasks fit on this host's CPUs, and the first
`--single-task-nodes N` nodes (N below the node count) run one task each; when it names a container image every task runs inside it
(`containers.runtime`, with its mount dirs, `--mount-dirs` and the current directory
bound). Without `--cs_ip` an embedded `wse_sim serve` is started for the job on a free
loopback port and stopped at the end: the tasks must then run on this host (a Slurm job
is pinned to this host's node; several nodes are an error: pass `--cs_ip`), and
`--detach` is refused (the simulator lives as long as csrun_wse). `--detach` prints the
Slurm job id and returns; `--emit-sbatch FILE` writes `slurm/templates/csrun_wse.sbatch`
filled in with this job's settings, for plain `sbatch`. The chief's log streams to
the terminal; every task's log stays in the job folder; the exit code is the job's.

Before submitting, what the run would refuse is refused here (`launcher.command_checks`);
once submitted, the job is registered for `csrun_job` (`slurm.jobs`). Following it, the
launcher shows a progress line under the chief's log on a terminal and a summary at the end
(`launcher.progress_line`), and on Slurm keeps a heartbeat its tasks watch, so that they stop
when it dies, even by SIGKILL (`slurm.heartbeat`). `--requeue` (Slurm): a job Slurm signals
checkpoints and requeues itself, and the launcher follows it through the requeue (`slurm.task`).

The job's CS reaches every task by one channel, the task's environment (`CSRUN_CS_IP`,
`coordinator.roles`): it reaches any command, in a container or not; the command runs as
given. The embedded simulator's fabric is the job's `runconfig.fabric`, read from a
`python X.py` command's params as run.py reads them (`launcher.run_utils`).
"""
from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, cast

import grpc

from common import task_env
from common.errors import ArgumentParser, CSRunError, Stopped, cli_entry, stop_on_signals
from common.task_failure import FAILURES_DIR
from containers.runtime import add_mount_dirs_flag, container_exec, mount_dirs_of
from cs_api import pb, rpc
from cs_api.client import CSClient
from launcher.command_checks import check_command, check_run
from launcher.progress_line import ProgressLine, summary
from launcher.run_config import normalize_cs_ip
from launcher.run_utils import create_arg_parser, read_run_config
from launcher.site_config import SiteConfig, load_site_config
from slurm import jobs
from slurm.auto import choose_backend
from slurm.backend import JobRequest, LaunchedJob
from slurm.heartbeat import HEARTBEAT, HEARTBEAT_ENV, Heartbeat
from slurm.templates import write_wse_sbatch
from wafer.fabric import DEFAULT_FABRIC, FABRICS
from workers.rendezvous import RENDEZVOUS_DIR

PROG = "csrun_wse"
_SIM_START_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1  # prctl option, linux/prctl.h


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description="Run a training script on the CS system.")
    p.add_argument("--total-nodes", type=int, help="nodes (default: csrun.yaml slurm.nodes, 1)")
    p.add_argument("--tasks-per-node", type=int, help="tasks per node (default: as many --cpus-per-task "
                   "tasks as this host's CPUs hold when that is given, else slurm.tasks_per_node, 1)")
    p.add_argument("--cpus-per-task", type=int, help="CPUs per task (default: slurm.cpus_per_task, 1)")
    p.add_argument("--single-task-nodes", type=int, metavar="N",
                   help="the first N nodes run one task each, the chief's first (Slurm; default 0)")
    p.add_argument("--cyclic", action="store_true", help="place tasks round-robin over the nodes (Slurm)")
    p.add_argument("--partition", help="Slurm partition (default: slurm.partition)")
    p.add_argument("--time", help="Slurm time limit (default: slurm.time, else the partition's)")
    p.add_argument("--requeue", action="store_true",
                   help="when Slurm signals the job (time limit, preemption), checkpoint and requeue it "
                        "(default: slurm.requeue)")
    add_mount_dirs_flag(p)
    p.add_argument("--cs_ip", help="HOST:PORT of a running CS system (default: an embedded simulator)")
    p.add_argument("--cs-wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for a CS system busy with another job (default: 0, fail at once)")
    p.add_argument("--job-dir", type=Path, help="job folder (default: ./csrun_jobs/<time>-<id>)")
    p.add_argument("--dry-run", action="store_true", help="print the request, start nothing")
    p.add_argument("--detach", action="store_true", help="submit, print the job id, return (needs --cs_ip)")
    p.add_argument("--emit-sbatch", type=Path, metavar="FILE",
                   help="write an sbatch script for this job (plain sbatch), start nothing")
    p.add_command("the command every task runs")
    return p


@dataclass(frozen=True)
class WseArgs:
    total_nodes: int
    tasks_per_node: int
    cpus_per_task: int
    cs_ip: str | None
    job_dir: Path
    dry_run: bool
    command: tuple[str, ...]
    mount_dirs: tuple[str, ...] = ()
    detach: bool = False
    emit_sbatch: Path | None = None
    # Slurm settings the user gave (partition, time, cyclic, single_task_nodes)
    slurm_options: tuple[tuple[str, str], ...] = ()
    cs_wait_s: float = 0.0  # how long the chief waits for a busy CS


def parse_args(argv: list[str], site: SiteConfig | None = None) -> WseArgs:
    site = site or SiteConfig()
    parser = _parser()
    ns = parser.parse_args(argv)
    command = parser.command(ns, "python run.py --mode train")
    if ns.tasks_per_node is None and ns.cpus_per_task is not None and ns.cpus_per_task >= 1:
        cpus = len(os.sched_getaffinity(0))
        ns.tasks_per_node = max(cpus // ns.cpus_per_task, 1)
        print(f"{PROG}: --cpus-per-task {ns.cpus_per_task} without --tasks-per-node: {ns.tasks_per_node} "
              f"task(s) per node ({cpus} CPU(s) on this host)", file=sys.stderr)
    for flag in ("total_nodes", "tasks_per_node", "cpus_per_task"):
        if getattr(ns, flag) is None:
            setattr(ns, flag, getattr(site.slurm, flag.replace("total_", "")))
        if getattr(ns, flag) < 1:
            raise CSRunError(f"--{flag.replace('_', '-')} {getattr(ns, flag)}: must be at least 1")
    single = ns.single_task_nodes or 0
    if not 0 <= single < ns.total_nodes:
        raise CSRunError(f"--single-task-nodes {single} must be at least 0 and less than the number of "
                         f"nodes ({ns.total_nodes})", "give more --total-nodes, or fewer single-task nodes")
    if ns.cs_ip is not None:
        ns.cs_ip = normalize_cs_ip(ns.cs_ip)
    if not ns.cs_wait >= 0:
        raise CSRunError(f"--cs-wait {ns.cs_wait}: must be a number of seconds >= 0")
    if ns.detach and ns.cs_ip is None and not ns.dry_run:
        raise CSRunError("--detach needs --cs_ip: the embedded CS simulator lives only as long as csrun_wse",
                         "start `wse_sim serve` and pass --cs_ip HOST:PORT, or leave --detach out")
    options = {"partition": ns.partition, "time": ns.time,
               "cyclic": "1" if ns.cyclic else None, "requeue": "1" if ns.requeue else None,
               "single_task_nodes": str(single) if single else None}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_dir = (ns.job_dir or Path("csrun_jobs") / f"{stamp}-{uuid.uuid4().hex[:6]}").resolve()
    mount_dirs = mount_dirs_of(ns.mount_dirs)
    return WseArgs(ns.total_nodes, ns.tasks_per_node, ns.cpus_per_task, ns.cs_ip, job_dir,
                   ns.dry_run, command, mount_dirs, ns.detach, ns.emit_sbatch,
                   tuple((k, v) for k, v in options.items() if v is not None), ns.cs_wait)


def fabric_of(command: tuple[str, ...], workdir: Path) -> str:
    """The fabric of the job's runconfig, for the embedded simulator: a `python X.py …`
    command's params, found and read as run.py finds and reads them; DEFAULT_FABRIC for
    another command or params that cannot be read (the run itself then says why)."""
    if not (len(command) >= 2 and Path(command[0]).name.startswith("python") and command[1].endswith(".py")):
        return DEFAULT_FABRIC
    try:
        parser = create_arg_parser(str((workdir / command[1]).parent / "model_dir"))
        flags, _ = parser.parse_known_args([a for a in command[2:] if a not in ("-h", "--help")])
        path = workdir / flags.params
        fabric = read_run_config(str(path)).fabric
    except CSRunError:
        return DEFAULT_FABRIC
    if fabric not in FABRICS:  # the simulator could not start: say why here, not in its log
        raise CSRunError(f"unknown fabric {fabric!r} (runconfig.fabric in {path})",
                         f"set runconfig.fabric to one of {', '.join(FABRICS)}")
    return fabric


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _end_with_parent() -> None:
    """In the embedded simulator's process, before it runs: Linux sends it SIGTERM when
    csrun_wse dies, even by SIGKILL (no orphaned CS holding its port and memory)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedSimulator:
    """A `wse_sim serve` for one job, on a free loopback port; its log in the job folder."""

    def __init__(self, fabric: str, log: Path, host: str = "127.0.0.1"):
        self.address = f"{host}:{free_port(host)}"
        self.log = log
        self.command = [sys.executable, "-c", "import sys; from wse_sim.cli import main; sys.exit(main())",
                        "serve", "--fabric", fabric, "--host", host, "--port", self.address.rsplit(":", 1)[1]]
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self._process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=_end_with_parent)
        deadline = time.monotonic() + _SIM_START_TIMEOUT_S
        with grpc.insecure_channel(self.address) as channel:
            stub = rpc.CSSystemStub(channel)
            while True:
                if self._process.poll() is not None:
                    raise CSRunError(f"the embedded simulator exited with code {self._process.returncode}",
                                     f"see {self.log}")
                try:
                    stub.Status(pb.StatusRequest(), timeout=1.0)
                    return
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise CSRunError(f"the embedded simulator did not answer on {self.address} "
                                         f"within {_SIM_START_TIMEOUT_S:.0f} s", f"see {self.log}") from None
                    time.sleep(0.2)

    def cpu_seconds(self) -> float:
        """The CPU time the simulator's process has used (user and system)."""
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()  # type: ignore[union-attr]
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def ended(self) -> str | None:
        """Why the simulator ended while its job ran (killed, exited), None while it runs."""
        code = None if self._process is None else self._process.poll()
        if code is None:
            return None
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"the embedded CS system at {self.address} ended while the job ran ({how}; its log: {self.log.name})"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def task_command(args: WseArgs, workdir: Path, site: SiteConfig) -> tuple[str, ...]:
    """What every task runs: the user's command, in the site's container if any."""
    if site.container.image is None:
        return args.command
    _, argv = container_exec(site.container.image, args.command, (*site.mount_dirs, *args.mount_dirs),
                             str(workdir), site.container.runtime)
    return tuple(argv)


def site_defaults(site: SiteConfig) -> dict[str, str]:
    """The site's Slurm settings, for a backend that takes them."""
    slurm = site.slurm
    values = {"partition": slurm.partition, "time": slurm.time, "gres": slurm.gres, "gres_node": slurm.gres_node,
              "licenses": slurm.licenses, "requeue": "1" if slurm.requeue else None}
    return {k: v for k, v in values.items() if v is not None}


def job_request(args: WseArgs, cs_ip: str, workdir: Path, site: SiteConfig | None = None,
                embedded: bool = False, heartbeat: bool = False) -> JobRequest:
    """The job's request; `heartbeat`: its tasks stop when this launcher dies (`slurm.heartbeat`)."""
    site = site or SiteConfig()
    return JobRequest(
        command=task_command(args, workdir, site),
        folder=args.job_dir,
        workdir=workdir,
        name=PROG,
        total_nodes=args.total_nodes,
        tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        env={task_env.JOB_DIR: str(args.job_dir), task_env.JOB_ID: args.job_dir.name,
             task_env.CS_IP: cs_ip, task_env.CS_TLS_CA: "" if embedded else (site.cs.tls_ca or ""),
             task_env.CS_WAIT_S: f"{args.cs_wait_s:g}",
             "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
             **({HEARTBEAT_ENV: str(args.job_dir / HEARTBEAT)} if heartbeat else {})},
        options=dict(args.slurm_options),
        defaults=site_defaults(site),
        same_host=embedded,
        detached=args.detach,
    )


def register(job: LaunchedJob, backend: str, args: WseArgs, cs_ip: str, embedded: bool) -> None:
    """The job in this user's registry (`slurm.jobs`), for `csrun_job`."""
    why = jobs.register(jobs.JobRecord(
        job.job_id, backend, str(args.job_dir), str(Path.cwd()), args.command, job.num_tasks, cs_ip, embedded,
        socket.gethostname(), time.time(), None if args.detach else os.getpid()))
    if why is not None:
        print(f"{PROG}: note: job {job.job_id} runs, but csrun_job will not know it ({why})", file=sys.stderr)


def cs_gone(cs_ip: str, tls_ca: str | None) -> str | None:
    """Why the CS system at `cs_ip` cannot serve the job any more (it does not answer its
    Status call), None while it answers."""
    client = CSClient(cs_ip, tls_ca)
    try:
        client.status()
    except CSRunError as error:
        return str(error)
    finally:
        client.close()
    return None


def with_hint(message: str, hint: str) -> str:
    """`message (hint: hint)`; a task's own one-line error keeps its hint, `hint` joins it."""
    if message.endswith(")") and " (hint: " in message:
        return f"{message[:-1]}; {hint})"
    return f"{message} (hint: {hint})"


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    site = load_site_config()
    args = parse_args(sys.argv[1:] if argv is None else argv, site)
    workdir = Path.cwd()
    if args.emit_sbatch is not None:
        write_wse_sbatch(args.emit_sbatch, job_request(args, args.cs_ip or "", workdir), args.command,
                         args.cs_ip, site.container.image, (*site.mount_dirs, *args.mount_dirs),
                         fabric_of(args.command, workdir))
        print(f"{PROG}: wrote {args.emit_sbatch} (submit it with: sbatch {args.emit_sbatch})", file=sys.stderr)
        return 0
    if not args.dry_run:
        check_command(args.command, workdir, in_container=site.container.image is not None)
        check_run(args.command, workdir, args.cs_ip)
    backend = choose_backend()
    simulator = None if args.cs_ip else EmbeddedSimulator(
        fabric_of(args.command, workdir), args.job_dir / "wse_sim.log")
    cs_ip = args.cs_ip or simulator.address  # type: ignore[union-attr]
    # a Slurm job's tasks outlive a SIGKILLed launcher but for its heartbeat (local ones end by
    # parent-death signals)
    beating = backend.name == "slurm" and not args.detach
    submission = backend.build(job_request(args, cs_ip, workdir, site, embedded=simulator is not None,
                                           heartbeat=beating))
    if args.dry_run:
        if simulator is not None:
            print(f"# embedded CS system: {shlex.join(simulator.command)}")
        print(submission.text, end="")
        return 0
    job = None
    heartbeat = None
    stop_on_signals()  # SIGTERM / SIGHUP stop the job as Ctrl-C does
    try:
        if not args.detach:
            backend.warm_up(submission)  # the tasks' start-up runs while the simulator starts
        if simulator is not None:
            simulator.start()
            print(f"{PROG}: embedded CS system ({simulator.command[-5]}) at {cs_ip}", file=sys.stderr)
        for old in (RENDEZVOUS_DIR, FAILURES_DIR):  # a reused job folder's old phases and failures
            shutil.rmtree(args.job_dir / old, ignore_errors=True)
        for old in (jobs.END, jobs.PROGRESS):
            (args.job_dir / old).unlink(missing_ok=True)
        job = backend.submit(submission)
        if beating:  # a task that starts first waits HEARTBEAT_TIMEOUT_S for the first beat
            heartbeat = Heartbeat(args.job_dir)
        register(job, backend.name, args, cs_ip, embedded=simulator is not None)
        if args.detach:
            print(job.job_id, flush=True)
            return 0
        print(f"{PROG}: job {job.job_id}: {job.num_tasks} task(s) through the {backend.name} "
              f"backend; logs in {args.job_dir}", file=sys.stderr, flush=True)
        job.cs_gone = simulator.ended if simulator is not None else lambda: cs_gone(cs_ip, site.cs.tls_ca)
        line = ProgressLine(args.job_dir, sys.stdout)
        try:
            outcome = job.follow(cast(TextIO, line), line.refresh)  # a text stream (io.TextIOBase)
        finally:
            line.done()
    except KeyboardInterrupt as interrupt:
        if job is not None:
            job.cancel()
        if simulator is not None:
            simulator.stop()
        if job is not None:
            name = interrupt.name if isinstance(interrupt, Stopped) else "SIGINT"
            jobs.record_end(args.job_dir, 130 if name == "SIGINT" else 143, f"cancelled ({name} to csrun_wse)")
        if isinstance(interrupt, Stopped):  # cli_entry prints it in its one line
            stopped = [f"job {job.job_id} cancelled, every task stopped"] if job is not None else []
            stopped += ["the embedded CS system stopped"] if simulator is not None else []
            interrupt.done = ", ".join(stopped)
        raise
    finally:
        if simulator is not None:
            simulator.stop()
        if heartbeat is not None:
            heartbeat.stop()
    jobs.record_end(args.job_dir, outcome.exit_code, outcome.message)
    trained = summary(args.job_dir)
    if trained is not None:
        print(f"{PROG}: job {job.job_id}: {trained}", file=sys.stderr, flush=True)
    if outcome.exit_code != 0:
        where = (f"its log: {job.task_log(outcome.failed_rank)}" if outcome.failed_rank is not None
                 else f"logs in {args.job_dir}")
        print(f"{PROG}: error: {with_hint(outcome.message, where)}", file=sys.stderr, flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
