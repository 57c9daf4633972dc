"""The CS system: one job at a time, its input streams, and its train / evaluate / predict
runs. A plain Python object (no network): the gRPC servicer translates messages and calls
into it. Refusals are CSError (a status code and a message naming what is wrong).

Authenticate, then validate, then allocate: a Load's header is checked first (a busy CS
refuses it before any weight is read; then the header, the program's declared sizes
(`wse_sim.limits`) and the program itself), then the CS is reserved for it and only the
weights and slots the program declares are taken, each bounded by its declared shape.
Every later call of the job carries its token (compared in constant time); a caller
without it learns whether the CS is idle or busy and, when busy, the job's id, user, start
and step (what `squeue` shows of a job on a cluster) but never its token or why it failed;
no refusal names another job.
A job's client may hold a lease (`lease`): when the lease's call ends the job is unloaded.

Input streams: one per input worker. The job consumes batches strictly in `batch_index`
order from `first_batch` on, whichever worker sent them; a stream blocks while its batch
is more than a window of batches ahead of the next one consumed (bounded memory). A run
waiting for a batch ends with ABORTED instead of hanging when a stream broke, every
stream ended, or every stream is blocked on batches later than the one needed.
"""
from __future__ import annotations

import enum
import hmac
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import grpc
import numpy as np

from common.run_kinds import RunKind
from cs_api import cs_api_pb2 as pb
from cs_api.shared_input import SHARED_REFUSED, SharedInputReader, SlotLayout
from cs_api.tensors import CHUNK_BYTES, assemble, from_tensor, tensor_chunks, to_tensor
from wafer import timing
from wafer.fabric import Fabric
from wse_sim.errors import CSError, invalid
from wse_sim.limits import MAX_CHUNK_BYTES, check_header, check_sizes
from wse_sim.pipeline import Pipeline
from wse_sim.program import CheckedProgram, check_program, check_state, state_shapes
from wse_sim.stages import usable_cpus

BATCHES_PER_WORKER = 2  # flow-control window: batches buffered per input stream
WAIT_POLL_S = 0.5  # how often a waiting run or stream re-checks for a cancelled job
LEASE_BEAT_S = 2.0  # a lease's beat interval
RESULTS_AHEAD = 2  # step results a run computes ahead of those its client has taken


class JobState(enum.StrEnum):
    """What Status replies (`StatusReply.state`): a caller without the job's token learns
    IDLE or BUSY; the job's client the job's own state."""

    IDLE = "idle"
    BUSY = "busy"
    LOADING = "loading"  # the Load is being received
    LOADED = "loaded"  # between runs
    RUNNING = "running"
    FAILED = "failed"  # its last run failed (StatusReply.message says why); it stays loaded


class StreamState(enum.StrEnum):
    STREAMING = "streaming"
    BLOCKED = "blocked"  # holding a batch more than a window ahead of the one consumed
    DONE = "done"  # ended with its `end` message
    BROKEN = "broken"  # ended without it


@dataclass
class Stream:
    """One input worker's Feed stream, as the job sees it."""

    worker: int
    state: StreamState = StreamState.STREAMING
    waiting_batch: int = -1  # the batch it holds while blocked
    received: int = 0
    error: str = ""  # why a broken stream broke


@dataclass
class Lease:
    """One lease call on a job; it ends once (its call's end, or its beats' end)."""

    job: "Job"
    ended: bool = False


def same_token(given: str, token: str) -> bool:
    """Constant-time comparison: how long a refusal takes says nothing about the token."""
    return hmac.compare_digest(given.encode(), token.encode())


BUSY = "the CS system is busy with another job"


@dataclass
class Job:
    job_id: str
    token: str
    checked: CheckedProgram
    pipeline: Pipeline
    timings: dict[str, timing.PipelineTiming]  # "train" / "infer"
    num_workers: int
    global_step: int  # batches trained
    next_batch: int
    variable_step: int  # TF's global step variable: global_step less skipped steps (step_counts_applied)
    user: str = ""  # JobHeader.user
    since: float = field(default_factory=time.time)  # when its Load began
    state: JobState = JobState.LOADED  # LOADED, RUNNING or FAILED
    message: str = ""
    closed: str = ""  # why the job ended (unloaded); wakes waiting streams and runs
    pending: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    streams: dict[int, Stream] = field(default_factory=dict)
    calls: int = 0  # calls in progress (feeds and leases excluded)
    leases: int = 0  # leases held
    last_active: float = field(default_factory=time.monotonic)

    @property
    def window(self) -> int:
        return BATCHES_PER_WORKER * max(self.num_workers, 1)


class CSSystem:
    """One wafer (`fabric`) serving one job at a time."""

    def __init__(self, fabric: Fabric, *, idle_timeout: float = 120.0, threads: int | None = None,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)):
        self.fabric = fabric
        self.idle_timeout = idle_timeout
        self.threads = threads or usable_cpus()  # computing a batch (Pipeline's threads)
        self.log = log
        self.job: Job | None = None
        self._loading: pb.JobHeader | None = None  # the load being received (the CS is reserved)
        self._loading_since = 0.0  # when it began
        self._last: tuple[str, str] = ("", "")  # the last job's token, and why it ended
        # One lock, three conditions, so that a wake-up reaches only the threads it concerns:
        # `_cond` the CS's state (a job's end, loads, leases); `_arrived` a batch or a
        # stream's state for the waiting run; `_taken` a batch consumed, for blocked streams.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._arrived = threading.Condition(lock)
        self._taken = threading.Condition(lock)
        self._stop = threading.Event()
        self._runs: dict[threading.Event, Job] = {}  # runs in progress, by their cancel event
        self._reaper: threading.Thread | None = None

    # ---- lifecycle ----
    def start(self) -> None:
        """Start unloading jobs idle for longer than idle_timeout."""
        if self._reaper is None and self.idle_timeout > 0:
            self._reaper = threading.Thread(target=self._reap, name="cs-idle-reaper", daemon=True)
            self._reaper.start()

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            if self.job is not None:
                self._unload(self.job, "the CS system stopped")
        if self._reaper is not None:
            self._reaper.join()
            self._reaper = None

    def _reap(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_timeout / 4)):
            with self._cond:
                job = self.job
                if job is not None and job.calls == 0 and \
                        time.monotonic() - job.last_active > self.idle_timeout:
                    self._unload(job, f"no call for {self.idle_timeout:g} s (client gone?)")

    # ---- jobs ----
    def _refuse(self, error: CSError, what: str) -> CSError:
        self.log(f"refused {what}: {error.code.name}: {error.message}")
        return error

    def load(self, header: pb.JobHeader, chunks: Iterable[pb.TensorChunk]) -> pb.LoadReply:
        """Make `header`'s program the job. Refuse it while busy, then check the header and
        the program, then reserve the CS and take the weights and slots (`chunks`) the
        program declares; keep them resident."""
        what = f"load of job {header.job_id!r}"
        with self._cond:
            if self.job is not None or self._loading is not None:
                raise self._refuse(CSError(grpc.StatusCode.ALREADY_EXISTS, BUSY), what)
            try:
                check_header(header)
            except CSError as error:
                raise self._refuse(error, what) from None
            self._loading, self._loading_since = header, time.time()
        try:
            job = self._receive(header, chunks)
        except CSError as error:
            raise self._refuse(error, what) from None
        finally:
            with self._cond:
                if self._loading is header:
                    self._loading = None
                    self._cond.notify_all()
        program, optimizer = job.checked.message, job.checked.optimizer
        t = job.timings["train" if optimizer else "infer"]
        self.log(f"loaded job {job.job_id}: program {program.name!r}, {len(job.checked.kernels)} kernels, "
                 f"{job.checked.num_parameters:,} parameters"
                 + (f" x {job.pipeline.replicas} replicas" if job.pipeline.replicas > 1 else "")
                 + f" on {job.pipeline.stages} stage(s) and {job.pipeline.threads} thread(s), "
                 f"{job.num_workers} input stream(s), "
                 f"first batch {job.next_batch}, estimate {t.samples_per_sec:,.0f} samples/s")
        return pb.LoadReply(job_id=job.job_id, num_parameters=job.checked.num_parameters,
                            estimate=estimate(t))

    def _receive(self, header: pb.JobHeader, chunks: Iterable[pb.TensorChunk]) -> Job:
        """The checked program, then its state from `chunks`, as the (reserved) CS's job."""
        if header.program.fabric and header.program.fabric != self.fabric.name:
            raise invalid(f"program compiled for {header.program.fabric}, this CS system is "
                          f"{self.fabric.name} (recompile with runconfig.fabric: {self.fabric.name})")
        check_sizes(header.program, self.fabric, header.num_workers)
        checked = check_program(header.program)
        expected = {name: (checked.state_dtype(name), shape) for name, shape in state_shapes(checked).items()}
        try:
            tensors = assemble(chunks, expected)
        except ValueError as error:
            raise invalid(str(error)) from None
        state = check_state(checked, tensors)
        program = checked.message
        pipeline = Pipeline.load(checked, state, threads=self.threads)
        weight_kernels = [step.kernel for step in checked.weight_program.steps] \
            if checked.weight_program is not None else []
        timings = {mode: timing.program_timing(program, checked.kernels, self.fabric,
                                               training=mode == "train",
                                               weight_kernels=weight_kernels)
                   for mode in ("train", "infer")}
        job = Job(header.job_id, header.token, checked, pipeline, timings,
                  num_workers=int(header.num_workers), global_step=int(header.global_step),
                  variable_step=int(header.global_step), next_batch=int(header.first_batch), user=header.user, since=self._loading_since)
        with self._cond:
            if self._stop.is_set():
                pipeline.close()
                raise CSError(grpc.StatusCode.UNAVAILABLE, "the CS system stopped")
            self.job = job
            self._last = ("", "")
        return job

    def _job(self, token: str, what: str) -> Job:
        """The loaded job, if `token` is its token. Call with the lock held."""
        job = self.job
        if job is not None and same_token(token, job.token):
            return job
        if job is not None or self._loading is not None:
            raise self._refuse(CSError(grpc.StatusCode.PERMISSION_DENIED,
                                       f"the token is not the loaded job's ({BUSY})"), what)
        last_token, why = self._last
        raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION, "no job is loaded" + (
            f" ({why})" if last_token and same_token(token, last_token) else "")), what)

    def _unload(self, job: Job, reason: str) -> None:
        """Drop `job` (lock held): streams and runs waiting on it wake up and end."""
        if self.job is job:
            self.job = None
            self._last = (job.token, f"job {job.job_id} unloaded: {reason}")
            self.log(f"unloaded job {job.job_id}: {reason}")
        job.closed = reason
        job.pending.clear()
        for condition in (self._cond, self._arrived, self._taken):
            condition.notify_all()
        job.pipeline.close()  # its stage threads end after the batch in progress

    def unload(self, token: str) -> None:
        with self._cond:
            job = self._job(token, "unload")
            self._unload(job, "unloaded by its client")

    def status(self, token: str = "") -> pb.StatusReply:
        """The job's state for its token; anyone else learns idle, or busy with which job
        (id, user, since, step: what squeue shows), never the job's token or message."""
        fabric = self.fabric.name
        with self._cond:
            job, loading = self.job, self._loading
            if job is not None:
                mine = same_token(token, job.token)
                return pb.StatusReply(state=(job.state if mine else JobState.BUSY).value, job_id=job.job_id,
                                      global_step=job.global_step, fabric=fabric, user=job.user,
                                      since=job.since, message=job.message if mine else "")
            if loading is not None:
                mine = same_token(token, loading.token)
                return pb.StatusReply(state=(JobState.LOADING if mine else JobState.BUSY).value,
                                      job_id=loading.job_id, global_step=loading.global_step, fabric=fabric,
                                      user=loading.user, since=self._loading_since)
            last_token, why = self._last
            return pb.StatusReply(state=JobState.IDLE.value, fabric=fabric, message=why if last_token and
                                  same_token(token, last_token) else "")

    # ---- leases ----
    def lease(self, token: str) -> Lease:
        """A lease on the job of `token`: while it lasts the job's client is alive."""
        with self._cond:
            job = self._job(token, "lease")
            job.leases += 1
            return Lease(job)

    def beats(self, lease: Lease) -> Iterator[pb.LeaseBeat]:
        """A beat every LEASE_BEAT_S while the job is loaded; ends with the job."""
        def ended() -> bool:
            return bool(lease.job.closed) or self._stop.is_set()

        try:
            while True:
                with self._cond:
                    if self._cond.wait_for(ended, LEASE_BEAT_S):
                        return
                    step = lease.job.global_step
                yield pb.LeaseBeat(global_step=step)
        finally:
            self.end_lease(lease)

    def end_lease(self, lease: Lease) -> None:
        """The lease's call ended: its job's last lease ending unloads the job."""
        with self._cond:
            if lease.ended:
                return
            lease.ended = True
            job = lease.job
            job.leases -= 1
            if job.leases == 0 and self.job is job:
                self._unload(job, "its client's lease ended (the client went away)")

    # ---- input streams ----
    def feed(self, requests: Iterable[pb.FeedRequest]) -> pb.FeedReply:
        """Take one input worker's batches (blocks while it runs ahead) until its `end`
        message. A stream that ends without it broke (a cancelled call's requests may just
        stop): the job's waiting run ends with ABORTED naming the worker. A stream whose
        first message names a shared input file (`cs_api.shared_input`) takes its batches
        from there; one the CS cannot open is refused before the stream counts."""
        job: Job | None = None
        stream: Stream | None = None
        shared: SharedInputReader | None = None
        error = "the worker disconnected"
        ok = False
        try:
            for request in requests:
                if job is None or stream is None:  # (the first request: both are set together)
                    what = f"input stream of worker {request.worker_id}"
                    with self._cond:
                        job = self._job(request.token, what)
                    if request.HasField("shared_input"):
                        shared = self._open_shared(job, request, what)
                    with self._cond:
                        stream = job.streams.setdefault(request.worker_id, Stream(request.worker_id))
                        stream.state = StreamState.STREAMING
                    if shared is not None:
                        continue
                elif not same_token(request.token, job.token):
                    raise self._refuse(CSError(grpc.StatusCode.PERMISSION_DENIED,
                                               "the token is not the job's"),
                                       f"batch of worker {request.worker_id}")
                if request.end:
                    ok = True
                    break
                self._put(job, stream, request.batch_index, self._decode(job, request, shared))
        except CSError as refused:
            error = refused.message
            raise
        finally:
            if shared is not None:
                shared.close()
            if stream is not None:
                with self._cond:
                    stream.state = StreamState.DONE if ok else StreamState.BROKEN
                    stream.error = "" if ok else error
                    self._arrived.notify_all()
        return pb.FeedReply(batches_received=stream.received if stream else 0)

    def _open_shared(self, job: Job, request: pb.FeedRequest, what: str) -> SharedInputReader:
        """The stream's shared input file, opened (the token checked already); refused with
        FAILED_PRECONDITION (the worker then sends its batches in the messages)."""
        declared = request.shared_input
        if request.tensors or request.end:
            raise self._refuse(invalid("a stream's shared_input message comes alone"), what)
        layout = SlotLayout.of(job.checked.inputs, job.checked.message.batch_size)
        try:
            return SharedInputReader(declared.name, declared.slots, layout)
        except ValueError as problem:
            raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"{SHARED_REFUSED}: {problem}"), what) from None

    def _decode(self, job: Job, request: pb.FeedRequest,
                shared: SharedInputReader | None = None) -> dict[str, np.ndarray]:
        where = f"worker {request.worker_id} batch {request.batch_index}"
        if shared is not None:
            if request.tensors or request.HasField("shared_input"):
                raise invalid(f"{where}: a stream through a shared input file carries batch indices only")
            try:
                return shared.take()
            except (OSError, ValueError) as error:
                raise invalid(f"{where}: {error}") from None
        specs = job.checked.inputs
        names = [t.name for t in request.tensors]
        if sorted(names) != sorted(s.name for s in specs):
            raise invalid(f"{where} has inputs {sorted(names)}, the program takes "
                          f"{sorted(s.name for s in specs)}")
        by_name = {t.name: t for t in request.tensors}
        batch = {}
        size = job.checked.message.batch_size
        for spec in specs:
            tensor = by_name[spec.name]
            try:
                array = from_tensor(tensor)
            except ValueError as error:
                raise invalid(f"{where}: {error}") from None
            expected = (size, *spec.shape)
            if array.shape != expected or array.dtype != spec.dtype:
                raise invalid(f"{where}: {spec.name} is {array.shape} {array.dtype.name}, the "
                              f"program takes {expected} {spec.dtype}")
            batch[spec.name] = array
        return batch

    def _put(self, job: Job, stream: Stream, index: int, batch: dict[str, np.ndarray]) -> None:
        with self._cond:
            if index < job.next_batch or index in job.pending:
                raise invalid(f"worker {stream.worker} sent batch {index} again (the job's next "
                              f"batch is {job.next_batch})")
            while index >= job.next_batch + job.window and not job.closed:
                if (stream.state, stream.waiting_batch) != (StreamState.BLOCKED, index):
                    # said once (the waiting run re-checks whether the job stalled), not on
                    # every wake-up
                    stream.state, stream.waiting_batch = StreamState.BLOCKED, index
                    self._arrived.notify_all()
                self._taken.wait(WAIT_POLL_S)
            if job.closed:
                raise CSError(grpc.StatusCode.ABORTED, f"job {job.job_id} ended: {job.closed}")
            stream.state = StreamState.STREAMING
            job.pending[index] = batch
            stream.received += 1
            self._arrived.notify_all()

    def _take(self, job: Job, cancelled: threading.Event) -> dict[str, np.ndarray]:
        """The job's next batch, waiting for it; ABORTED when it cannot come."""
        with self._cond:
            while True:
                index = job.next_batch
                if index in job.pending:
                    job.next_batch += 1
                    self._taken.notify_all()
                    return job.pending.pop(index)
                if cancelled.is_set() or job.closed:
                    raise CSError(grpc.StatusCode.CANCELLED,
                                  f"job {job.job_id} ended: {job.closed or 'the client cancelled'}")
                stalled = self._stalled(job, index)
                if stalled:
                    raise CSError(grpc.StatusCode.ABORTED, stalled)
                self._arrived.wait(WAIT_POLL_S)

    @staticmethod
    def _stalled(job: Job, index: int) -> str:
        """Why batch `index` can never arrive, or ""."""
        broken = sorted((s.worker, s.error) for s in job.streams.values() if s.state == StreamState.BROKEN)
        if broken:
            return (f"the input stream of worker {broken[0][0]} broke ({broken[0][1]}) while the "
                    f"run waited for batch {index}")
        if len(job.streams) < job.num_workers:
            return ""
        if all(s.state == StreamState.DONE for s in job.streams.values()):
            return (f"every input stream ended ({sum(s.received for s in job.streams.values())} "
                    f"batches) before batch {index}")
        stuck = [s for s in job.streams.values()
                 if s.state == StreamState.BLOCKED and s.waiting_batch >= index + job.window]
        if stuck and all(s.state == StreamState.DONE or s in stuck for s in job.streams.values()):
            held = sorted(s.waiting_batch for s in stuck)
            return (f"the run needs batch {index} but the input workers hold batches from "
                    f"{held[0]} on (the job's first batch is set by JobHeader.first_batch)")
        return ""

    # ---- runs ----
    def run(self, kind: RunKind, request: pb.RunRequest, cancelled: threading.Event) -> Iterator[pb.RunResult]:
        """Stream `request.steps` step results of a train / evaluate / predict run, then the
        summary. If the client goes away (`cancelled` set, or the generator closed before
        the summary), the job is unloaded."""
        with self._cond:
            job = self._job(request.token, kind)
            program = job.checked.message
            if kind == RunKind.TRAIN and (job.checked.optimizer is None or not program.loss_kernel):
                raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"job {job.job_id}'s program has no optimizer and loss: "
                                           "it was compiled for evaluation or prediction"), kind)
            if kind == RunKind.EVALUATE and not program.loss_kernel:
                raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"job {job.job_id}'s program has no loss: it was "
                                           "compiled for prediction"), kind)
            if job.state == JobState.RUNNING:
                raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"job {job.job_id} is already running"), kind)
            if request.steps < 0:
                raise self._refuse(invalid(f"steps must be >= 0, got {request.steps}"), kind)
            job.state, job.message = JobState.RUNNING, ""
            job.calls += 1
            self._runs[cancelled] = job
        return self._steps(job, kind, request, cancelled)

    def _steps(self, job: Job, kind: RunKind, request: pb.RunRequest,
               cancelled: threading.Event) -> Iterator[pb.RunResult]:
        """The run's results as a thread of its own computes them (`_compute`), up to
        RESULTS_AHEAD ahead: sending a step's result to the client (a round trip through
        gRPC's completion queue) overlaps the next step instead of stalling the pipeline."""
        results: queue.Queue = queue.Queue(RESULTS_AHEAD)
        ended = threading.Event()  # this stream ended: the computing thread stops
        computing = threading.Thread(target=self._compute, args=(job, kind, request, cancelled, ended, results),
                                     name="cs-run", daemon=True)
        finished = failed = False
        try:
            computing.start()
            while not finished:
                item = results.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.HasField("summary")
                yield item
        except CSError as error:
            failed = True
            with self._cond:
                job.state, job.message = JobState.FAILED, error.message
            self.log(f"job {job.job_id} {kind} failed: {error.code.name}: {error.message}")
            raise
        finally:
            ended.set()
            with self._cond:
                # gone before its summary: unloaded, even if the computing thread has already
                # finished the run (it works ahead of the client)
                if not finished and not failed:
                    self._unload(job, f"the client cancelled its {kind} stream")
            if computing.is_alive():
                computing.join()  # it ends with the batch in progress (the job is unloaded)
            with self._cond:
                self._runs.pop(cancelled, None)
                job.calls -= 1
                job.last_active = time.monotonic()

    def _compute(self, job: Job, kind: RunKind, request: pb.RunRequest, cancelled: threading.Event,
                 ended: threading.Event, results: queue.Queue) -> None:
        """Take the run's batches, compute them, and queue each step's result, then the
        summary (the job back to LOADED) — or the error that ended the run."""
        def put(item: pb.RunResult | BaseException) -> bool:
            while not ended.is_set():
                try:
                    results.put(item, timeout=WAIT_POLL_S)
                    return True
                except queue.Full:
                    pass
            return False

        program = job.checked.message
        training = kind == RunKind.TRAIN
        pipe_timing = job.timings["train" if training else "infer"]
        step_sim = pipe_timing.step_seconds(program.batch_size)
        output_steps = set(request.output_steps)
        outputs = list(program.outputs)
        wall = sim = waited = 0.0
        try:
            for _ in range(request.steps):
                waiting = time.perf_counter()
                batch = self._take(job, cancelled)
                start = time.perf_counter()
                waited += start - waiting
                step = job.global_step + 1 if training else job.global_step
                wanted = outputs if not training or step in output_steps else []
                counted = job.variable_step
                try:
                    result = job.pipeline.run(batch, training=training, outputs=wanted,
                                              step=counted, index=job.next_batch - 1)
                except (ValueError, FloatingPointError) as error:
                    raise invalid(f"batch {job.next_batch - 1}: {error}") from None
                except Exception as error:  # a defect of the simulator: said, not a bare gRPC UNKNOWN
                    raise CSError(grpc.StatusCode.INTERNAL, f"batch {job.next_batch - 1}: the simulated CS "
                                  f"failed ({type(error).__name__}: {error}), a csrun defect: please report "
                                  "it with the compile report") from error
                seconds = time.perf_counter() - start
                wall, sim = wall + seconds, sim + step_sim
                if training:
                    job.global_step = step
                    counted += 1 if result.applied or not job.checked.step_counts_applied else 0
                    job.variable_step = counted
                if not put(pb.RunResult(step=pb.StepResult(
                        step=step, global_step_variable=counted,
                        loss=result.loss if program.loss_kernel and kind != RunKind.PREDICT else 0.0,
                        timing=pb.StepTiming(sim_seconds=step_sim,
                                             sim_samples_per_sec=program.batch_size / step_sim,
                                             wall_seconds=seconds, input_wait_seconds=start - waiting),
                        outputs=[to_tensor(name, value) for name, value in result.outputs.items()]))):
                    return
            samples = request.steps * program.batch_size
            with self._cond:
                job.state = JobState.LOADED
            put(pb.RunResult(summary=pb.JobSummary(
                steps=request.steps, samples=samples, sim_seconds=sim,
                sim_samples_per_sec=samples / sim if sim > 0 else 0.0, wall_seconds=wall,
                wall_samples_per_sec=samples / wall if wall > 0 else 0.0,
                utilization=timing.run_utilization(pipe_timing, samples, sim), input_wait_seconds=waited)))
        except BaseException as error:  # the client's stream raises it
            put(error)

    def cancel(self, cancelled: threading.Event) -> None:
        """The call of a run ended (the servicer's callback). If the run was still in
        progress its client went away: unload its job and wake the run so that it ends."""
        with self._cond:
            job = self._runs.pop(cancelled, None)
            cancelled.set()
            if job is not None:
                self._unload(job, "the client cancelled its run")

    # ---- snapshot ----
    def snapshot(self, token: str, chunk_bytes: int = 0) -> Iterator[pb.TensorChunk]:
        """Every weight, optimizer slot and beta power of the job, in chunks."""
        with self._cond:
            job = self._job(token, "snapshot")
            if job.state == JobState.RUNNING:
                raise self._refuse(CSError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"job {job.job_id} is running; snapshot between runs"),
                                   "snapshot")
            state = {name: np.array(a) for name, a in
                     job.checked.reshaped(job.pipeline.state(), to_kernels=False).items()}
            job.last_active = time.monotonic()
        size = min(int(chunk_bytes), MAX_CHUNK_BYTES) if chunk_bytes > 0 else CHUNK_BYTES
        for name in sorted(state):
            yield from tensor_chunks(name, state[name], size)


def estimate(t: timing.PipelineTiming) -> pb.Estimate:
    return pb.Estimate(samples_per_sec=t.samples_per_sec,
                       compute_samples_per_sec=t.compute_samples_per_sec,
                       transmission_samples_per_sec=t.transmission_samples_per_sec,
                       active_cores=t.active_cores, compute_utilization=t.compute_utilization,
                       pipeline_fill_seconds=t.fill_seconds)
