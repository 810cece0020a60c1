"""AWS endpoints for the local runner: an embedded moto server, or any endpoint by configuration."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from localstack_client.config import get_service_endpoint
from moto.server import ThreadedMotoServer

from delayq_local import moto_fixes
from delayq_local.exceptions import LocalStackError

FAKE_CREDENTIALS: Final[Mapping[str, str]] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}
DEFAULT_REGION: Final = "us-east-1"
# moto's default account; other endpoints report their own in ARNs.
DEFAULT_ACCOUNT: Final = "123456789012"


# How long a child moto server may take to import moto and listen.
MOTO_START_TIMEOUT_SECONDS: Final = 60.0


class MotoServer:
    """moto in server mode on a free loopback port, with `moto_fixes` applied.

    By default in a child process (`python -m delayq_local.moto_child`): moto's request
    handling then runs on its own interpreter, not under the global interpreter lock of the
    handlers and event sources, which on a 2-core machine is where the local stack's
    lateness came from. The child exits when this object stops it or when this process dies
    (it watches its stdin). `in_process=True` serves from a background thread of this
    process instead, for tests that look into moto's backends; moto's backends are
    process-global, so two such servers share their state and callers isolate by resource
    names (a stack name per test).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, in_process: bool = False) -> None:
        self._host, self._port = host, port
        self._thread = (
            ThreadedMotoServer(ip_address=host, port=port, verbose=False) if in_process else None
        )
        self._child: subprocess.Popen[str] | None = None
        self._endpoint = ""

    def start(self) -> MotoServer:
        """Start serving; `endpoint_url` is valid when this returns."""
        if self._endpoint:
            return self
        if self._thread is None:
            host, port = self._start_child()
        else:
            moto_fixes.apply()
            quiet_werkzeug()
            self._thread.start()
            host, port = self._thread.get_host_and_port()
        self._endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        """Stop serving (an in-process server's backends keep their state in this process;
        a child's state ends with it)."""
        if not self._endpoint:
            return
        self._endpoint = ""
        if self._thread is not None:
            self._thread.stop()
        elif self._child is not None:
            child, self._child = self._child, None
            if child.stdin is not None:
                child.stdin.close()  # the child's signal to stop
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()

    def _start_child(self) -> tuple[str, int]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(  # noqa: S603 -- our own module, on this interpreter
                [sys.executable, "-m", "delayq_local.moto_child", self._host, str(self._port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            )
            ready: list[str] = []
            reader = threading.Thread(
                target=lambda: ready.append(child.stdout.readline() if child.stdout else ""),
                daemon=True,
            )
            reader.start()
            reader.join(MOTO_START_TIMEOUT_SECONDS)
            line = ready[0].split() if ready else []
            if len(line) != 2:  # "host port"
                child.kill()
                child.wait()
                errors.seek(0)
                raise LocalStackError(
                    f"the moto server process did not start: {errors.read()[-2000:].strip()}"
                )
        self._child = child
        return line[0], int(line[1])

    @property
    def pid(self) -> int | None:
        """The child process serving (None when serving in this process, or stopped)."""
        return self._child.pid if self._child is not None else None

    @property
    def endpoint_url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        if not self._endpoint:
            raise LocalStackError("the moto server is not running (call start())")
        return self._endpoint

    def __enter__(self) -> MotoServer:
        return self.start()

    def __del__(self) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.kill()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class AwsEndpoint:
    """Where AWS calls go: an endpoint URL (None: the real AWS endpoints) and credentials."""

    url: str | None
    region: str = DEFAULT_REGION
    fake_credentials: bool = True

    def client(self, service: str) -> Any:
        """A boto3 client for `service` on this endpoint (cached: clients are thread-safe and
        slow to build)."""
        return _client(self, service)

    def environ(self) -> dict[str, str]:
        """The environment variables that point boto3 in a handler at this endpoint."""
        env = {"AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}
        if self.url:
            env["AWS_ENDPOINT_URL"] = self.url
        if self.fake_credentials:
            env.update(FAKE_CREDENTIALS)
        return env

    def _session_kwargs(self) -> dict[str, str]:
        kwargs = {"region_name": self.region}
        if self.fake_credentials:
            kwargs["aws_access_key_id"] = FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"]
            kwargs["aws_secret_access_key"] = FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
            kwargs["aws_session_token"] = FAKE_CREDENTIALS["AWS_SESSION_TOKEN"]
        return kwargs


def quiet_werkzeug() -> None:
    """werkzeug logs one line per request at INFO."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


_clients: dict[tuple[AwsEndpoint, str], Any] = {}
_clients_lock = threading.Lock()


def _client(endpoint: AwsEndpoint, service: str) -> Any:
    # Sessions are not thread-safe, so clients are built under a lock (then shared).
    with _clients_lock:
        key = (endpoint, service)
        if key not in _clients:
            session = boto3.session.Session(**endpoint._session_kwargs())
            _clients[key] = session.client(
                service,
                endpoint_url=endpoint.url,
                config=Config(retries={"mode": "standard", "max_attempts": 5}, read_timeout=70),
            )
        return _clients[key]


def localstack_endpoint(environ: Mapping[str, str] | None = None) -> str:
    """LocalStack's edge URL: `LOCALSTACK_ENDPOINT`, else what localstack-client derives
    (`LOCALSTACK_HOST`, default `http://localhost:4566`)."""
    env = os.environ if environ is None else environ
    explicit = env.get("LOCALSTACK_ENDPOINT", "").strip()
    if explicit:
        return explicit
    url = get_service_endpoint("sqs")
    if not url:
        raise LocalStackError("localstack-client gave no endpoint for sqs")
    return str(url)


def reachable(address: str, timeout: float = 1.0) -> bool:
    """True when a TCP connection to `address` (a URL or `host:port[,host:port...]`) succeeds."""
    first = address.split(",", 1)[0].strip()
    parsed = urlparse(first if "://" in first else f"//{first}")
    try:
        port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
    except ValueError:
        return False
    if not parsed.hostname or port is None:
        return False
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False
