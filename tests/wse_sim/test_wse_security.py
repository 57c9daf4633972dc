"""The CS API as a hostile client meets it, through the repo's own proto against a running
`wse_sim serve`: authenticate, then validate, then allocate (a tokenless or undeclared
512 MiB chunk, an oversized program, a 1.5 GB Feed message with a wrong token cost the
server next to nothing and are refused); a tokenless Status and every refusal reveal no
job; the job lease frees the CS within seconds of its client's death; TLS with a
certificate the test makes. The soak: 100 jobs on one server, a third of them abandoned
mid-Load, mid-Feed and mid-Train, leave its threads and memory where they were."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from doubles import ClientDouble

from common.errors import CSRunError
from cs_api import MAX_MESSAGE_BYTES, pb
from cs_api.client import CSClient
from cs_api.input_spec import InputSpec
from launcher.csrun_wse import free_port
from launcher.site_config import load_site_config
from tests.wse_sim.test_wse_server import BATCH, batches, code_and_details, program, weights
from workers.feed import feed_requests, stream
from workers.rendezvous import Rendezvous

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
GROWTH_LIMIT = 64 * MIB  # what a refused hostile call may cost the server, at most


# ---- a running `wse_sim serve` and what /proc says of it ----
class Served:
    def __init__(self, process: subprocess.Popen, address: str, log: Path):
        self.process, self.address, self.log = process, address, log

    def proc(self, key: str) -> int:
        """A /proc/PID/status field (VmRSS in bytes, Threads as a count)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                value = int(line.split()[1])
                return value * 1024 if key == "VmRSS" else value
        raise KeyError(key)

    def state(self, token: str = "") -> str:
        return ClientDouble(self.address, token).status().state

    def wait_idle(self, timeout_s: float = 10.0) -> float:
        """Seconds until the CS says idle (AssertionError after timeout_s)."""
        start = time.monotonic()
        while self.state() != "idle":
            assert time.monotonic() - start < timeout_s, self.log.read_text()[-2000:]
            time.sleep(0.05)
        return time.monotonic() - start


def serve(tmp_path: Path, *extra: str, env: dict | None = None) -> Served:
    port = free_port()
    log = tmp_path / f"wse_sim-{port}.log"
    command = [sys.executable, "-c", "import sys; from wse_sim.cli import main; sys.exit(main())",
               "serve", "--port", str(port), "--threads", "1", *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    deadline = time.monotonic() + 30
    while "serving on" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return Served(process, f"127.0.0.1:{port}", log)


def stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(15)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()


def warm_server(folder: Path) -> Served:
    """`wse_sim serve` with the default 120 s idle timeout: only a lease frees a job sooner."""
    served = serve(folder)
    warm = ClientDouble(served.address, "warm-up")  # the first job's imports and pools, before any figure
    warm.load(program(), weights(), job_id="warm-up")
    warm.feed_in_background(batches(1))
    warm.run("train", 1)
    warm.unload()
    return served


@pytest.fixture
def server(tmp_path):
    served = warm_server(tmp_path)
    yield served
    stop(served)


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory):
    """One `server` for the tests that leave it idle, as each asserts (a start and stop each
    cost seconds)."""
    served = warm_server(tmp_path_factory.mktemp("idle_server"))
    yield served
    stop(served)


def load_stream(header: pb.JobHeader, chunk: pb.TensorChunk, hold: threading.Event):
    """A Load stream that sends its header and one chunk, then stays open until `hold`."""
    yield pb.LoadRequest(header=header)
    yield pb.LoadRequest(chunk=chunk)
    hold.wait(30)


def huge_chunk(name: str, shape=(128, MIB)) -> pb.TensorChunk:
    """A chunk announcing a 512 MiB float32 tensor, with 100 bytes of it."""
    return pb.TensorChunk(name=name, dtype=pb.FLOAT32, shape=shape, offset=0,
                          total_bytes=4 * int(np.prod(shape)), data=bytes(100))


# ---- authenticate, then validate, then allocate ----
@pytest.mark.parametrize("case", ["tokenless", "undeclared", "declared name, other shape", "busy"])
def test_a_512_mib_chunk_costs_the_server_nothing_and_is_refused(idle_server, case):
    server = idle_server
    header = pb.JobHeader(job_id="hostile", token="" if case == "tokenless" else "t" * 32,
                          program=program(), num_workers=1)
    name = {"tokenless": "hidden/kernel", "undeclared": "stray",
            "declared name, other shape": "hidden/kernel", "busy": "hidden/kernel"}[case]
    holder = None
    if case == "busy":
        holder = ClientDouble(server.address, "holder")
        holder.load(program(), weights(), job_id="held")
    before = server.proc("VmRSS")
    hold = threading.Event()
    calls = [ClientDouble(server.address).stub.Load.future(load_stream(header, huge_chunk(name), hold))
             for _ in range(8)]  # eight at once, each stream left open
    try:
        errors = [call.exception(timeout=30) for call in calls]
        grown = server.proc("VmRSS") - before
    finally:
        hold.set()
    expected = {"tokenless": (grpc.StatusCode.INVALID_ARGUMENT, "needs a job_id and a token"),
                "undeclared": (grpc.StatusCode.INVALID_ARGUMENT, "'stray'"),
                "declared name, other shape": (grpc.StatusCode.INVALID_ARGUMENT, "(12, 8)"),
                "busy": (grpc.StatusCode.ALREADY_EXISTS, "busy with another job")}[case]
    print(f"512 MiB chunk ({case}), 8 streams held open: server RSS +{grown / MIB:.1f} MiB")
    assert grown < GROWTH_LIMIT, f"server grew {grown / MIB:.0f} MiB"
    outcomes = {(e.code(), expected[1] in e.details()) for e in errors}
    assert expected[:1] + (True,) in outcomes, [e.details() for e in errors]
    # loads that overlap one that holds the CS (while it reads its header) are told it is busy
    assert outcomes <= {expected[:1] + (True,), (grpc.StatusCode.ALREADY_EXISTS, False)}
    if holder is not None:
        assert holder.status().state == "loaded"
        holder.unload()
    assert server.wait_idle() < 10  # a refused load leaves nothing reserved
    taker = ClientDouble(server.address)
    taker.load(program(), weights())  # and the CS takes the next job
    taker.unload()


def avg_pool_program(size: int, pool: int, padding: str = "VALID") -> pb.Program:
    """features (size, size, 1) -> avg_pool: a 120-byte program declaring a huge sample."""
    out = (size - pool) // pool + 1 if padding == "VALID" else -(-size // pool)
    p = pb.Program(name="pool", fabric="cs1", batch_size=1, micro_batch_size=1, outputs=["pool"])
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=[size, size, 1])
    k = p.kernels.add(name="pool", type="avg_pool", inputs=["features"], output_shape=[out, out, 1],
                      region=pb.Region(x=0, y=0, width=1, height=1))
    k.attrs["pool_size"].ints.values[:] = [pool, pool]
    k.attrs["strides"].ints.values[:] = [pool, pool]
    k.attrs["padding"].s = padding
    return p


def spatial_program(kind: str, attrs: dict) -> pb.Program:
    """features (64, 64, 1) -> one spatial kernel whose attributes ask for a huge window or
    output (its declared output is small: the attributes alone must be refused)."""
    p = pb.Program(name="spatial", fabric="cs1", batch_size=1, micro_batch_size=1, outputs=["k"])
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=[64, 64, 1])
    k = p.kernels.add(name="k", type=kind, inputs=["features"], output_shape=[64, 64, 1],
                      region=pb.Region(x=0, y=0, width=1, height=1))
    for key, value in attrs.items():
        if isinstance(value, str):
            k.attrs[key].s = value
        else:
            k.attrs[key].ints.values[:] = value
    return p


def with_region(region: pb.Region) -> pb.Program:
    p = program()
    p.kernels[1].region.CopyFrom(region)
    return p


@pytest.mark.parametrize("bad, words", [
    (avg_pool_program(10583, 2), ["'features'", "(10583, 10583, 1)", "111,999,889", "16,777,216"]),
    (avg_pool_program(64, 100_000, "SAME"), ["kernel 'pool' (avg_pool)", "window (100000, 100000)"]),
    (spatial_program("depthwise_conv2d", {"kernel_size": [3, 3], "dilations": [100_000, 100_000],
                                          "padding": "SAME"}), ["kernel 'k' (depthwise_conv2d)", "window (200001, 200001)"]),
    (spatial_program("resize", {"size": [1 << 13, 1 << 13], "method": "nearest"}),
     ["kernel 'k' (resize)", "more than 16,777,216 elements"]),
    (spatial_program("tile", {"multiples": [1 << 13, 1, 1]}), ["kernel 'k' (tile)", "more than 16,777,216"]),
    (with_region(pb.Region(x=3, y=0, width=0, height=2)),
     ["kernel 'logits' (dense)", "x=3 y=0 0x2", "at least one core", "633x633"]),
    (with_region(pb.Region(x=630, y=0, width=8, height=1)), ["kernel 'logits'", "630", "8x1"]),
    (avg_pool_program(4096, 2), ["a batch of its inputs is 64.0 MiB"]),
])
def test_declared_sizes_are_refused_before_anything_is_built(idle_server, bad, words):
    server = idle_server
    if "batch of its inputs" in words[0]:
        bad.batch_size = bad.micro_batch_size = 5  # 5 x 64 MiB: above a Feed message
        words = ["a batch of its inputs is 320.0 MiB", "at most 256.0 MiB", "lower the batch size"]
    before = server.proc("VmRSS")
    code, details = code_and_details(lambda: ClientDouble(server.address, "t").load(bad, {}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in details, details
    assert server.proc("VmRSS") - before < GROWTH_LIMIT
    assert server.state() == "idle"


def test_a_tokenless_caller_learns_who_holds_the_cs_and_nothing_it_could_use(idle_server):
    """What squeue shows of a job on a cluster (its id, user, since, step), never its token,
    its failures, or any way to act on it."""
    server = idle_server
    owner = ClientDouble(server.address, "owner-token")
    before = time.time()
    owner.load(program(), weights(), job_id="secret-job", global_step=7)
    for token in ("", "guess"):
        seen = ClientDouble(server.address, token).status()
        assert (seen.state, seen.job_id, seen.global_step, seen.fabric, seen.message) == (
            "busy", "secret-job", 7, "cs1", "")
        assert before <= seen.since <= time.time() and "owner-token" not in str(seen)
    mine = owner.status()
    assert (mine.state, mine.job_id, mine.global_step) == ("loaded", "secret-job", 7)
    stranger = ClientDouble(server.address, "guess")
    for call in (lambda: stranger.run("train", 1), stranger.snapshot, stranger.unload,
                 lambda: stranger.stub.Feed(stranger.feed_requests(batches(1))),
                 lambda: next(stranger.stub.Lease(pb.LeaseRequest(token="guess"))),
                 lambda: stranger.load(program(), weights(), job_id="other")):
        code, details = code_and_details(call)
        assert "secret-job" not in details and "owner-token" not in details
        assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS), details
    owner.unload()
    assert ClientDouble(server.address).status() == pb.StatusReply(state="idle", fabric="cs1")
    assert owner.status().message == "job secret-job unloaded: unloaded by its client"  # its owner learns why
    assert "secret-job" not in code_and_details(lambda: stranger.run("train", 1))[1]


def feed_message(size: int, token: str) -> bytes:
    """A serialized FeedRequest whose one tensor holds `size` bytes (built without protobuf
    copying it twice)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    tensor_head = pb.Tensor(name="features", dtype=pb.FLOAT32, shape=[size // 4]).SerializeToString()
    tensor_len = len(tensor_head) + 1 + len(varint(size)) + size
    head = pb.FeedRequest(token=token, worker_id=0, batch_index=0).SerializeToString()
    return b"".join([head, b"\x22", varint(tensor_len), tensor_head, b"\x22", varint(size), bytes(size)])


@pytest.mark.slow
def test_a_1_5_gb_feed_message_with_a_wrong_token_is_refused_unread(server):
    owner = ClientDouble(server.address, "owner-token")
    owner.load(program(), weights())
    message = feed_message(1536 * MIB, "wrong")
    before = server.proc("VmRSS")
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1)])
    feed = channel.stream_unary("/csrun.cs_api.CSSystem/Feed", request_serializer=lambda b: b,
                                response_deserializer=pb.FeedReply.FromString)
    code, details = code_and_details(lambda: feed(iter([message]), timeout=120))
    grown = server.proc("VmRSS") - before
    channel.close()
    print(f"1.5 GB Feed message, wrong token: server RSS +{grown / MIB:.1f} MiB")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(MAX_MESSAGE_BYTES) in details, details
    assert grown < GROWTH_LIMIT, f"server grew {grown / MIB:.0f} MiB"
    assert owner.status().state == "loaded"  # the job is untouched
    owner.unload()


# ---- the lease ----
CLIENT_THEN_SLEEP = """
import signal, sys, time
# Ctrl-C's KeyboardInterrupt even where the suite runs with SIGINT ignored (a background job of a
# non-interactive shell): set here, not in a preexec_fn, which forks unsafely beside grpc's threads
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
from cs_api.client import CSClient
from cs_api import pb
program = pb.Program.FromString(open(sys.argv[1], "rb").read())
weights = dict(np.load(sys.argv[2]))
client = CSClient(sys.argv[3])
client.load("leased", program, weights, 1, 0, 0)
print("loaded", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_chief_that_dies_between_runs_frees_the_cs_within_seconds(idle_server, tmp_path, how):
    """The chief's client (CSClient) loads a job and holds its lease, then dies."""
    server, logged = idle_server, len(idle_server.log.read_text())
    (tmp_path / "program.pb").write_bytes(program().SerializeToString())
    np.savez(tmp_path / "weights.npz", **weights())
    client = subprocess.Popen([sys.executable, "-c", CLIENT_THEN_SLEEP, str(tmp_path / "program.pb"),
                               str(tmp_path / "weights.npz"), server.address],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if client.stdout.readline() != "loaded\n":
            error = client.stderr.read()
            pytest.fail(f"the client ended (exit status {client.wait()}) before it loaded: {error}")
        assert server.state() == "busy"
        client.send_signal(getattr(signal, how))
        client.wait(20)
        freed = server.wait_idle(10)
        print(f"chief {how} between runs: the CS was idle {freed:.2f} s later")
        assert freed < 5  # the idle timeout is 120 s
    finally:
        client.kill()
        client.wait()
    assert "its client's lease ended" in server.log.read_text()[logged:]


# ---- TLS ----
def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate it signs for 127.0.0.1, and an unrelated CA (openssl)."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test's certificates")
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", "-days", "1", "-subj", f"/CN=csrun test {ca}")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.cnf")
    return {name: folder / f"{name}.pem" for name in ("ca", "other-ca", "server")} | \
        {"key": folder / "server.key"}


@pytest.fixture
def tls_server(tmp_path):
    certs = make_certificates(tmp_path / "certs")
    served = serve(tmp_path, "--tls-cert", str(certs["server"]), "--tls-key", str(certs["key"]))
    yield served, certs
    stop(served)


def test_a_job_trains_over_tls_and_a_client_without_the_ca_is_refused(tls_server):
    served, certs = tls_server
    assert "(TLS," in served.log.read_text()
    client = CSClient(served.address, str(certs["ca"]))  # the chief's client and the worker's stream, verifying
    client.load("over-tls", program(), weights(), 1, 0, 0)
    specs = tuple(InputSpec(n, d, s) for n, d, s in (("features", "float32", (12,)),
                                                      ("labels", "int32", ())))
    rendezvous = Rendezvous(served.address, "over-tls", client.token, 1, 0, 3, specs, BATCH,
                            cs_tls_ca=str(certs["ca"]))
    data = [(i, (b["features"], b["labels"])) for i, b in enumerate(batches(3))]
    feeder = threading.Thread(target=stream, args=(feed_requests(data, rendezvous, 0), served.address, 0,
                                                     str(certs["ca"])))
    feeder.start()
    steps = [r.step.step for r in client.run("train", 3) if r.HasField("step")]
    feeder.join(30)
    assert steps == [1, 2, 3]
    assert client.snapshot()["hidden/kernel"].shape == (12, 8)
    client.unload()
    client.close()
    for ca in ("", str(certs["other-ca"])):  # plaintext, or a CA that did not sign the server
        stranger = CSClient(served.address, ca or None)
        with pytest.raises(CSRunError, match="cannot reach the CS system"):
            stranger.status()
        stranger.close()
    with pytest.raises(CSRunError, match="cannot read the CS system's CA certificate .*missing.pem"):
        CSClient(served.address, str(served.log.parent / "missing.pem"))


def csrun_wse(args: list, env: dict) -> subprocess.Popen:
    from fc_mnist_runs import EXAMPLE

    return subprocess.Popen([sys.executable, "-m", "launcher.csrun_wse", *map(str, args)], cwd=EXAMPLE,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_csrun_wse_trains_over_tls_with_the_ca_csrun_yaml_names(tls_server, tmp_path):
    from fc_mnist_runs import ENV, fc_mnist_params, losses

    served, certs = tls_server
    (tmp_path / "csrun.yaml").write_text(f"cs: {{tls_ca: {certs['ca']}}}\n")
    params = fc_mnist_params(tmp_path, steps=4, every=2)
    def args(name: str) -> list:
        return ["--job-dir", tmp_path / name, "--tasks-per-node", "2", "--cs_ip", served.address, "--",
                "python", "run.py", "--mode", "train", "-p", params, "-o", tmp_path / name / "model"]

    run = csrun_wse(args("tls"), {**ENV, "CSRUN_CONFIG": str(tmp_path / "csrun.yaml")})
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, out + err
    assert sorted(losses(out)) == [1, 2, 3, 4] and (tmp_path / "tls/model/model.ckpt-4.index").exists()
    assert "loaded job" in served.log.read_text()
    (tmp_path / "plain.yaml").write_text("cs: {tls_ca: null}\n")
    plain = csrun_wse(args("plain"), {**ENV, "CSRUN_CONFIG": str(tmp_path / "plain.yaml")})
    try:
        out, err = plain.communicate(timeout=300)
    finally:
        if plain.poll() is None:
            plain.kill()
    assert plain.returncode != 0 and "Traceback" not in err
    assert f"cannot reach the CS system at {served.address}" in err


@pytest.mark.slow
def test_ctrl_c_of_csrun_wse_frees_the_cs_at_once(server, tmp_path):
    from fc_mnist_runs import ENV, fc_mnist_params

    params = fc_mnist_params(tmp_path, steps=100_000, every=100_000)
    run = csrun_wse(["--tasks-per-node", "2", "--job-dir", tmp_path / "job", "--cs_ip", server.address,
                     "--", "python", "run.py", "--mode", "train", "-p", params, "-o", tmp_path / "model"],
                    ENV)
    try:
        deadline = time.monotonic() + 120
        while server.state() != "busy":
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.2)
        time.sleep(2)  # training
        run.send_signal(signal.SIGINT)
        freed = server.wait_idle(10)
        run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    print(f"Ctrl-C: the CS was idle {freed:.2f} s after SIGINT")
    assert freed < 5  # the idle timeout is 120 s


def test_csrun_yaml_names_the_ca_relative_to_itself(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "csrun.yaml").write_text("cs: {tls_ca: certs/ca.pem}\n")
    config = load_site_config({"CSRUN_CONFIG": str(tmp_path / "etc" / "csrun.yaml")}, tmp_path)
    assert config.cs.tls_ca == str(tmp_path / "etc" / "certs" / "ca.pem")


def test_serve_refuses_half_a_tls_pair_and_warns_without_tls_off_loopback(tmp_path):
    command = [sys.executable, "-c", "import sys; from wse_sim.cli import main; sys.exit(main())", "serve"]
    half = subprocess.run([*command, "--tls-cert", str(tmp_path / "c.pem")], capture_output=True,
                          text=True, timeout=60)
    assert half.returncode == 2 and "--tls-cert and --tls-key go together" in half.stderr
    missing = subprocess.run([*command, "--tls-cert", str(tmp_path / "c.pem"), "--tls-key",
                              str(tmp_path / "k.pem")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"cannot read {tmp_path / 'c.pem'}" in missing.stderr
    served = serve(tmp_path, "--host", "0.0.0.0")
    try:
        assert "travel in clear text (hint: --tls-cert and --tls-key)" in served.log.read_text()
    finally:
        stop(served)


# ---- the soak ----
def abandoned_job(address: str, i: int, where: str) -> None:
    """A client that loads (holding the lease as the chief does) and vanishes mid-`where`."""
    client = ClientDouble(address, f"token-{i}")
    job = pb.JobHeader(job_id=f"job-{i}", token=client.token, program=program(), num_workers=1)
    if where == "load":
        def some_chunks():
            yield pb.LoadRequest(header=job)
            yield pb.LoadRequest(chunk=pb.TensorChunk(name="hidden/bias", dtype=pb.FLOAT32, shape=[8],
                                                      total_bytes=32, data=bytes(16)))
            time.sleep(0.3)
            client.channel.close()  # gone halfway through a tensor
            time.sleep(30)

        code_and_details(lambda: client.stub.Load(some_chunks()))
        return
    client.load(program(), weights(), job_id=f"job-{i}")
    lease = client.stub.Lease(pb.LeaseRequest(token=client.token))
    if where == "feed":
        def one_batch_then_gone():
            yield from client.feed_requests(batches(1), end=False)
            time.sleep(0.2)
            client.channel.close()
            time.sleep(30)

        threading.Thread(target=lambda: code_and_details(
            lambda: client.stub.Feed(one_batch_then_gone())), daemon=True).start()
    else:
        client.feed_in_background(batches(5))
        call = client.stub.Train(pb.RunRequest(token=client.token, steps=5))
        next(call)
        client.channel.close()
    lease_of_a_vanished_client(lease)


def lease_of_a_vanished_client(lease) -> None:
    """Drain the lease of a client whose channel closed: its close cancels the lease, unless
    the server, which unloads the job as the first of the client's calls ends (the run), ended
    the lease first (measured: 1 in 150 abandoned trains)."""
    try:
        beats = list(lease)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.CANCELLED, error
    else:
        assert lease.code() == grpc.StatusCode.OK, beats


def normal_job(address: str, i: int) -> None:
    client = ClientDouble(address, f"token-{i}")
    client.load(program(), weights(), job_id=f"job-{i}")
    lease = client.stub.Lease(pb.LeaseRequest(token=client.token))
    client.feed_in_background(batches(2))
    steps, _ = client.run("train", 2)
    assert [s.step for s in steps] == [1, 2]
    client.unload()
    for _ in lease:  # the lease ends with its job, without an error
        pass
    client.channel.close()


@pytest.mark.slow
def test_soak_100_jobs_a_third_abandoned_leave_threads_and_memory_where_they_were(server):
    kinds = ["normal", "normal", "load", "normal", "normal", "feed", "normal", "normal", "train"]

    def job(i: int) -> None:
        kind = kinds[i % len(kinds)]
        if kind == "normal":
            normal_job(server.address, i)
        else:
            abandoned_job(server.address, i, kind)
        server.wait_idle(10)

    for i in range(2 * len(kinds)):  # warm up on every kind of job (the call pool grows on demand)
        job(i)
    threads, rss = server.proc("Threads"), server.proc("VmRSS")
    for i in range(100):
        job(2 * len(kinds) + i)
    # gRPC's own event-engine pool grows and shrinks with load: give it a few seconds to settle
    deadline = time.monotonic() + 10
    while server.proc("Threads") > threads * 1.1 and time.monotonic() < deadline:
        time.sleep(0.2)
    after_threads, after_rss = server.proc("Threads"), server.proc("VmRSS")
    print(f"soak: threads {threads} -> {after_threads}, RSS {rss / MIB:.1f} -> {after_rss / MIB:.1f} MiB")
    assert after_threads <= threads * 1.1 and after_rss <= rss * 1.1
    normal_job(server.address, 1000)  # and a normal job trains
    log = server.log.read_text()
    assert log.count("its client's lease ended") >= 100 // len(kinds)  # the mid-Feed ones
