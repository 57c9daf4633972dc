"""The CS system's refusals and robustness over gRPC: busy, wrong token, bad programs and
weights, broken input streams, cancelled runs, snapshots above 4 MB, and no threads or
jobs left behind after many jobs; `wse_sim serve` stops cleanly on SIGTERM."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from doubles import RUN_DEADLINE_S, ClientDouble

from cs_api import pb
from cs_api.tensors import to_tensor
from launcher.csrun_wse import free_port

FEATURES, HIDDEN, BATCH = 12, 8, 16


def program(hidden: int = HIDDEN, features: int = FEATURES, optimizer: str = "adam") -> pb.Program:
    """A small dense -> dense -> sparse softmax cross-entropy -> mean program, by hand."""
    p = pb.Program(name="tiny", fabric="cs1", batch_size=BATCH, micro_batch_size=4,
                   loss_kernel="loss", outputs=["logits", "labels"], seed=1)
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=[features])
    p.inputs.add(name="labels", dtype=pb.INT32, shape=[])
    for name, src, n, units, act in (("hidden", "features", features, hidden, "relu"),
                                     ("logits", "hidden", hidden, 10, "linear")):
        k = p.kernels.add(name=name, type="dense", inputs=[src], output_shape=[units],
                          region=pb.Region(x=0, y=0, width=2, height=2))
        k.attrs["units"].i, k.attrs["use_bias"].b, k.attrs["activation"].s = units, True, act
        k.params.add(role="kernel", variable=f"{name}/kernel", shape=[n, units], dtype=pb.FLOAT32)
        k.params.add(role="bias", variable=f"{name}/bias", shape=[units], dtype=pb.FLOAT32)
    xent = p.kernels.add(name="xent", type="softmax_cross_entropy_with_logits",
                         inputs=["logits", "labels"], region=pb.Region(x=2, y=0, width=1, height=1))
    xent.attrs["sparse"].b = True
    loss = p.kernels.add(name="loss", type="loss", inputs=["xent"],
                         region=pb.Region(x=3, y=0, width=1, height=1))
    loss.attrs["scale"].f = 1.0 / BATCH
    if optimizer:
        p.optimizer.CopyFrom(pb.Optimizer(type=optimizer, learning_rate=0.01, beta1=0.9,
                                          beta2=0.999, epsilon=1e-8, momentum=0.9))
    return p


def weights(hidden: int = HIDDEN, features: int = FEATURES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"hidden/kernel": rng.normal(size=(features, hidden)).astype(np.float32) * 0.1,
            "hidden/bias": np.zeros(hidden, np.float32),
            "logits/kernel": rng.normal(size=(hidden, 10)).astype(np.float32) * 0.1,
            "logits/bias": np.zeros(10, np.float32)}


def batches(count: int, features: int = FEATURES) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"features": rng.normal(size=(BATCH, features)).astype(np.float32),
             "labels": rng.integers(0, 10, BATCH).astype(np.int32)} for _ in range(count)]


def code_and_details(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_second_job_wrong_token_and_unknown_job_are_refused(server):
    first = ClientDouble(server.address, "token-a")
    first.load(program(), weights(), job_id="job-a")
    other = ClientDouble(server.address, "token-b")
    code, details = code_and_details(lambda: other.load(program(), weights(), job_id="job-b"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and details == "the CS system is busy with another job"
    for call in (lambda: other.run("train", 1), other.snapshot, other.unload,
                 lambda: other.stub.Feed(other.feed_requests(batches(1))),
                 lambda: next(other.stub.Lease(pb.LeaseRequest(token=other.token)))):
        code, details = code_and_details(call)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "job-a" not in details
        assert "busy with another job" in details
    assert first.status().state == "loaded" and first.status().job_id == "job-a"
    seen = other.status()  # what squeue would show, never the token or the job's messages
    assert (seen.state, seen.job_id, seen.global_step, seen.fabric, seen.message) == ("busy", "job-a", 0, "cs1", "")
    first.unload()
    assert first.status().state == "idle"
    code, _ = code_and_details(lambda: first.run("train", 1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def broken(mutate):
    p = program()
    mutate(p)
    return p


@pytest.mark.parametrize("bad_program, tensors, words", [
    (broken(lambda p: setattr(p.kernels[0], "type", "fft")), weights(), ["unknown kernel type 'fft'"]),
    (broken(lambda p: p.kernels[1].inputs.__setitem__(0, "nowhere")), weights(),
     ["'nowhere'", "neither a program input nor an earlier kernel"]),
    (broken(lambda p: p.inputs[0].shape.__setitem__(0, 13)), weights(),
     ["hidden/kernel", "(12, 8)", "(13, 8)"]),
    (program(), {k: v for k, v in weights().items() if k != "logits/bias"},
     ["'logits/bias'", "missing"]),
    (program(), {**weights(), "logits/kernel": np.zeros((8, 11), np.float32)},
     ["'logits/kernel'", "(8, 11)", "(8, 10)"]),
    (program(), {**weights(), "stray": np.zeros(3, np.float32)}, ["'stray'", "not a weight"]),
    (program(), {**weights(), "hidden/kernel/Adam": np.zeros((3, 8), np.float32)},
     ["hidden/kernel/Adam", "(3, 8)", "(12, 8)"]),
])
def test_malformed_programs_and_weights_are_refused_precisely(server, bad_program, tensors, words):
    client = ClientDouble(server.address)
    code, details = code_and_details(lambda: client.load(bad_program, tensors))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in details
    assert client.status().state == "idle"  # the server keeps serving
    client.load(program(), weights())
    client.unload()


def test_batches_are_consumed_in_index_order_from_first_batch_whatever_the_worker(server):
    data = batches(6)
    client = ClientDouble(server.address)
    client.load(program(), weights(), num_workers=3, first_batch=4, global_step=4)
    # Workers start in reverse order; batch indices 4..9 regardless.
    threads = []
    for worker in (2, 1, 0):
        t = threading.Thread(target=lambda w=worker: client.stub.Feed(
            client.feed_requests(data, w, 3, first=4)), daemon=True)
        t.start()
        threads.append(t)
        time.sleep(0.05)
    results, summary = client.run("train", 6, output_steps=[5])
    assert [r.step for r in results] == list(range(5, 11))
    outputs = {t.name: t for t in results[0].outputs}
    assert set(outputs) == {"logits", "labels"} and not results[1].outputs
    labels = np.frombuffer(outputs["labels"].data, np.int32)
    np.testing.assert_array_equal(labels, data[0]["labels"])  # step 5 consumed batch 4
    assert all(r.timing.sim_seconds > 0 and r.timing.wall_seconds > 0 for r in results)
    assert summary.sim_samples_per_sec > summary.wall_samples_per_sec > 0
    assert 0 < summary.utilization <= 1
    for t in threads:
        t.join(5)
    assert client.status().global_step == 10


def test_each_step_reports_how_long_the_cs_waited_for_its_batch(server):
    """Batches already sent: little wait; a worker sending one batch every 0.3 s: the CS waits
    about that long for each (the job's input starvation, as the chief sees it)."""
    data = batches(8)
    client = ClientDouble(server.address)
    client.load(program(), weights(), num_workers=2)  # a window of 4 batches: 0..3 sent at once
    first_run_done = threading.Event()

    def stream():
        for index in range(8):
            if index >= 4:
                first_run_done.wait(RUN_DEADLINE_S)
                time.sleep(0.3)
            yield pb.FeedRequest(token=client.token, worker_id=0, batch_index=index, tensors=[
                to_tensor(name, array) for name, array in data[index].items()])
        yield pb.FeedRequest(token=client.token, worker_id=0, end=True)

    threading.Thread(target=lambda: client.stub.Feed(stream()), daemon=True).start()
    time.sleep(1.0)  # batches 0..3 arrive before the run asks for them
    ready, ready_summary = client.run("train", 4)
    first_run_done.set()
    slow, slow_summary = client.run("train", 4)
    assert all(r.timing.input_wait_seconds > 0.2 for r in slow), [r.timing for r in slow]
    assert slow_summary.input_wait_seconds > 0.8 > ready_summary.input_wait_seconds
    for results, summary in ((ready, ready_summary), (slow, slow_summary)):
        assert summary.input_wait_seconds == pytest.approx(sum(r.timing.input_wait_seconds for r in results))


def test_a_wrong_batch_and_a_broken_feed_end_the_run_with_a_clear_status(server):
    client = ClientDouble(server.address)
    client.load(program(), weights())
    bad = [{"features": np.zeros((BATCH, FEATURES + 1), np.float32),
            "labels": np.zeros(BATCH, np.int32)}]
    code, details = code_and_details(lambda: client.stub.Feed(client.feed_requests(bad)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"({BATCH}, {FEATURES + 1})" in details and f"({BATCH}, {FEATURES})" in details
    code, details = code_and_details(lambda: client.run("train", 1))
    assert code == grpc.StatusCode.ABORTED and "worker 0" in details
    client.unload()

    client.load(program(), weights(), num_workers=1)
    data = batches(1)

    def one_then_vanish():
        yield from client.feed_requests(data, end=False)
        # break only once the CS has the batch: a stream cancelled before the CS saw it is a
        # worker that never connected, which the launcher (not the CS) notices
        deadline = time.monotonic() + 60
        while not any(s.received for s in server.cs.job.streams.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("worker killed")  # the client's stream breaks

    threading.Thread(target=lambda: code_and_details(lambda: client.stub.Feed(one_then_vanish())),
                     daemon=True).start()
    code, details = code_and_details(lambda: client.run("train", 3))
    assert code == grpc.StatusCode.ABORTED and "worker 0" in details and "batch 1" in details
    assert client.status().state == "failed"
    client.unload()


def test_a_simulator_defect_in_a_step_ends_the_run_saying_what_failed(server, monkeypatch):
    """An exception of the simulator's own (a defect, here injected into Pipeline.run) reaches
    the client as INTERNAL naming the batch and the exception, not gRPC's bare UNKNOWN."""
    from wse_sim.pipeline import Pipeline

    def broken_run(self, *args, **kwargs):
        raise KeyError("p1")

    monkeypatch.setattr(Pipeline, "run", broken_run)
    client = ClientDouble(server.address)
    client.load(program(), weights())
    def feed():
        try:
            client.stub.Feed(client.feed_requests(batches(2)))
        except grpc.RpcError:
            pass  # (the job ended under the stream)

    threading.Thread(target=feed, daemon=True).start()
    code, details = code_and_details(lambda: client.run("train", 1))
    assert code == grpc.StatusCode.INTERNAL
    assert details.startswith("batch 0: the simulated CS failed (KeyError: 'p1'), a csrun defect")
    client.unload()


def test_a_run_needing_batches_the_workers_do_not_send_aborts_instead_of_hanging(server):
    client = ClientDouble(server.address)
    client.load(program(), weights(), first_batch=0)  # workers send from batch 10 on
    threading.Thread(target=lambda: code_and_details(
        lambda: client.stub.Feed(client.feed_requests(batches(8), first=10))), daemon=True).start()
    code, details = code_and_details(lambda: client.run("train", 1))
    assert code == grpc.StatusCode.ABORTED and "batch 0" in details and "first_batch" in details
    client.unload()


def test_a_cancelled_train_stream_unloads_the_job(server):
    client = ClientDouble(server.address)
    client.load(program(), weights())
    call = client.stub.Train(pb.RunRequest(token=client.token, steps=5))  # no batches come
    time.sleep(0.3)
    call.cancel()
    deadline = time.monotonic() + 10
    while client.status().state != "idle" and time.monotonic() < deadline:
        time.sleep(0.05)
    status = client.status()
    assert status.state == "idle" and "cancelled" in status.message


def test_snapshot_of_a_model_above_4_mb_round_trips_exactly(server):
    hidden, features = 1200, 1000  # 4.8 MB of kernel, plus 2 Adam slots
    tensors = weights(hidden, features)
    rng = np.random.default_rng(5)
    for name in list(tensors):
        tensors[f"{name}/Adam"] = rng.normal(size=tensors[name].shape).astype(np.float32)
        tensors[f"{name}/Adam_1"] = rng.random(tensors[name].shape, dtype=np.float32)
    tensors["beta1_power"] = np.asarray(0.5, np.float32)
    tensors["beta2_power"] = np.asarray(0.25, np.float32)
    client = ClientDouble(server.address)
    client.load(program(hidden, features), tensors)
    for chunk_bytes in (0, 3_000_001):
        got = client.snapshot(chunk_bytes)
        assert set(got) == set(tensors)
        for name, value in tensors.items():
            assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes(), name
    client.unload()


def test_train_on_an_eval_program_is_refused(server):
    client = ClientDouble(server.address)
    client.load(program(optimizer=""), weights())
    code, details = code_and_details(lambda: client.run("train", 1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "evaluation" in details
    client.feed_in_background(batches(1))
    results, _ = client.run("predict", 1)
    assert results[0].loss == 0 and {t.name for t in results[0].outputs} == {"logits", "labels"}
    client.unload()


def test_many_jobs_leave_no_threads_or_state_behind(server):
    def job(i):
        client = ClientDouble(server.address, f"token-{i}")
        client.load(program(), weights(), job_id=f"job-{i}")
        release = threading.Event()
        if i % 3 == 1:  # a stream kept open: the run below cannot end before the cancel
            def held_open():
                yield from client.feed_requests(batches(8), end=False)
                release.wait(RUN_DEADLINE_S)

            def feed():
                try:
                    client.stub.Feed(held_open())
                except grpc.RpcError:  # the job is gone when the stream ends
                    pass

            threading.Thread(target=feed, daemon=True).start()
        else:
            client.feed_in_background(batches(8), num_workers=1)  # what the runs below take
        client.run("train", 2)
        if i % 3 == 1:  # cancelled mid-stream: it needs 10 batches, 6 more are coming
            call = client.stub.Train(pb.RunRequest(token=client.token, steps=10))
            next(call)
            call.cancel()
            release.set()
        elif i % 3 == 2:  # a wrong token on the way
            code_and_details(lambda: ClientDouble(server.address, "bad").run("train", 1))
            client.run("train", 1)
            client.unload()
        else:
            client.unload()
        deadline = time.monotonic() + 30
        while (state := client.status().state) != "idle" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state == "idle", f"job {i} still {state!r} 30 s after its end"
        client.channel.close()

    for i in range(6):
        job(i)  # warm up: the server's pool starts its call threads on demand
    time.sleep(0.5)
    baseline = threading.active_count()
    for i in range(6, 18):
        job(i)
    # A leak grows with the 12 jobs; the call pool may still start a thread or two, and on a
    # loaded host a finished job's threads take a moment to end.
    deadline = time.monotonic() + 10
    while threading.active_count() > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= baseline + 2, [t.name for t in threading.enumerate()]
    cs = server.cs
    assert cs.job is None and not cs._runs
    assert ClientDouble(server.address).status().state == "idle"


def test_wse_sim_serve_answers_health_and_stops_on_sigterm():
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = free_port()
    command = [sys.executable, "-c", "import sys; from wse_sim.cli import main; sys.exit(main())",
               "serve", "--fabric", "cs2", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=20)
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="csrun.cs_api.CSSystem"), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert ClientDouble(f"127.0.0.1:{port}").status().fabric == "cs2"
            taken = subprocess.run(command, capture_output=True, text=True, timeout=30)
            assert taken.returncode == 1 and "Traceback" not in taken.stderr
            assert taken.stderr.strip().splitlines()[-1] == (
                f"wse_sim: error: cannot listen on 127.0.0.1:{port} (hint: the port is taken or "
                "the address is not this host's; choose another --port or --host)")
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert "serving on 127.0.0.1" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_wse_sim_status_names_the_job_holding_the_cs_and_an_unreachable_address_in_one_line(server, capsys):
    from cs_api.client import CSClient, this_user
    from wse_sim import cli

    assert cli.main(["status", "--cs_ip", server.address]) == 0
    assert capsys.readouterr().out == f"CS system at {server.address}: idle\n"
    holder = CSClient(server.address)  # the chief's client: it declares its user
    holder.load("job-7", program(), weights(), num_workers=1, global_step=3, first_batch=3)
    try:
        assert cli.main(["status", "--cs_ip", server.address]) == 0
        out = capsys.readouterr().out
        assert re.fullmatch(rf"CS system at {re.escape(server.address)}: busy with job job-7 of "
                            rf"{re.escape(this_user())} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d, step 3\n", out), out
    finally:
        holder.unload()
        holder.close()
    port = free_port()
    assert cli.main(["status", "--cs_ip", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"wse_sim: error: cannot reach the CS system at 127.0.0.1:{port} "
                                               "(status): "), err
    assert err[0].endswith("(hint: check --cs_ip and that the CS system (wse_sim serve) is running)")
    with pytest.raises(SystemExit):
        cli.main(["status", "--cs_ip", "no-port"])
    assert capsys.readouterr().err.strip().endswith("error: --cs_ip 'no-port' is not HOST:PORT")
