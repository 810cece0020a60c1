"""The child process of :class:`delayq_local.aws.MotoServer`: moto's server with `moto_fixes`
applied, on ``argv[1]:argv[2]`` (port 0: a free one).

It prints ``host port`` once it listens, then serves until its stdin closes (the parent
stopped it, or died), so that no server outlives the stack that started it.

Garbage collection. The server's heap holds every stored item, stream record and message as
Python objects (millions, for a 20,000-message table), and each full collection of CPython's
cyclic collector walks all of them while every request waits: 1 s and more every 10 to 20 s
with 20,000 messages stored, on a busy machine up to about 3 s, in which no emitter received
or produced anything. AWS's services do not pause like that. So after each full collection the
survivors are frozen (``gc.freeze``): later collections walk only what is newer. Frozen objects
are still freed by reference counting; only cycles among them are never collected, a bounded
cost for a server that lives as long as a test or a demo.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from moto.server import ThreadedMotoServer

from delayq_local import moto_fixes
from delayq_local.aws import quiet_werkzeug


def freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    """A ``gc.callbacks`` entry: after a full collection, freeze what survived it."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def main(argv: list[str]) -> int:
    """Serve until stdin reaches its end."""
    host, port = argv[1], int(argv[2])
    gc.callbacks.append(freeze_survivors)
    moto_fixes.apply()
    quiet_werkzeug()
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    bound_host, bound_port = server.get_host_and_port()
    sys.stdout.write(f"{bound_host} {bound_port}\n")
    sys.stdout.flush()
    try:
        sys.stdin.read()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
