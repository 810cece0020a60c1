"""The child process of :class:`delayq_local.aws.MotoServer`: moto's server with `moto_fixes`
applied, on ``argv[1]:argv[2]`` (port 0: a free one).

It prints ``host port`` once it listens, then serves until its stdin closes (the parent
stopped it, or died), so that no server outlives the stack that started it.
"""

from __future__ import annotations

import sys

from moto.server import ThreadedMotoServer

from delayq_local import moto_fixes
from delayq_local.aws import quiet_werkzeug


def main(argv: list[str]) -> int:
    """Serve until stdin reaches its end."""
    host, port = argv[1], int(argv[2])
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
