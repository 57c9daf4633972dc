"""`wse_sim serve --fabric cs1|cs2 --host H --port P [--idle-timeout S] [--threads N]`: start a
CS system."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

import threadpoolctl

from wse_sim.cs_system import CSSystem
from wse_sim.fabric import FABRICS
from wse_sim.server import CSServer
from wse_sim.stages import usable_cpus

PROG = "wse_sim"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The simulated CS system.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the CS API (gRPC) for one job at a time")
    serve.add_argument("--fabric", choices=sorted(FABRICS), default="cs1")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    serve.add_argument("--port", type=int, default=50051)
    serve.add_argument("--idle-timeout", type=float, default=120.0,
                       help="unload a job with no call in progress for this many seconds "
                            "(0: never)")
    serve.add_argument("--threads", type=int, default=usable_cpus(),
                       help="pipeline stages run at once, one thread each (default: the CPUs "
                            "this process may use, here %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 0 <= args.port < 65536 or args.idle_timeout < 0 or args.threads < 1:
        parser().error("--port must be in 0..65535, --idle-timeout >= 0 and --threads >= 1")
    # One BLAS thread for the process: its spinning threads would fight the stages for cores.
    threadpoolctl.threadpool_limits(1, user_api="blas")
    cs = CSSystem(FABRICS[args.fabric], idle_timeout=args.idle_timeout, threads=args.threads)
    try:
        server = CSServer(cs, args.host, args.port)
    except RuntimeError:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port} (hint: the port is taken "
              f"or the address is not this host's; choose another --port or --host)",
              file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"{PROG}: {args.fabric} CS system serving on {server.address} "
          f"(idle timeout {args.idle_timeout:g} s, {args.threads} thread(s))", flush=True)
    while not stop.wait(0.5):
        pass
    print(f"{PROG}: stopping", flush=True)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
