"""Ray's client proxier (what `ray start --head` runs for ray:// on --ray-client-server-port)
with the ports of its per-client servers chosen by the test.

``python -m tests.support.ray_client_proxy PORT,PORT,... ARGS...`` runs ``python -m
ray.util.client.server ARGS...`` (ARGS: the head's own proxier's, with another --port)
whose proxier starts each client's server on the next of the PORTs. Ray's proxier takes
them from a fixed range, 23000 up (``proxier.MIN_SPECIFIC_SERVER_PORT``; no setting
changes it), so two heads on one machine that each serve a client at the same moment
both start it on port 23000, and one fails ("Starting Ray client server failed ...
ray_client_server_23000.err"): tests/jobs/test_jobs_on_ray.py. The same message also
came from a client's server that died with SIGSEGV as it was forked (the proxier forks
while its gRPC threads run; Ray logs no exit status, so this proxier prints it): the test
runs this proxier with gRPC's fork handlers off (GRPC_ENABLE_FORK_SUPPORT=false), after
which 4 runs of 4 passed where 2 of 6 had failed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ray.util.client.server import proxier, server


def _say_exit(process: Any) -> None:
    code = process.wait()
    print(f"ray_client_proxy: client server pid {process.pid} exited with {code}", file=sys.stderr, flush=True)


def main() -> None:
    ports = [int(p) for p in sys.argv[1].split(",")]
    original = proxier.ProxyManager.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._free_ports = list(ports)  # what _get_unused_port takes from, in order

    proxier.ProxyManager.__init__ = __init__  # type: ignore[method-assign]
    start = proxier.start_ray_client_server

    def start_and_say(*args: Any, **kwargs: Any) -> Any:
        # Ray logs "SpecificServer startup failed" without the exit status: a failing test's
        # message (the proxier's log) says how the client's server ended
        info = start(*args, **kwargs)
        threading.Thread(target=_say_exit, args=(info.process,), daemon=True).start()
        return info

    proxier.start_ray_client_server = start_and_say
    sys.argv = ["ray.util.client.server", *sys.argv[2:]]
    server.main()


if __name__ == "__main__":
    main()
