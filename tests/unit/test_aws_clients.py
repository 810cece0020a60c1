"""Every AWS client the layer builds: one attempt each, bounded by short timeouts from the
settings, so the layer's own deadline-bounded retries are the only ones."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from botocore.exceptions import ReadTimeoutError

from delayq import constants as c
from delayq.runtime import client
from delayq.settings import Settings
from delayq_local.redrive import MAX_WAIT_SECONDS, redrive_services


@pytest.fixture
def hanging_endpoint(
    monkeypatch: pytest.MonkeyPatch, aws_credentials: None
) -> Iterator[list[socket.socket]]:
    """An endpoint (``AWS_ENDPOINT_URL``) that accepts connections and never answers; yields
    the connections it accepted. Each is closed after 10 s, so a client that would wait
    longer fails the test rather than hang it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)
            threading.Timer(10, conn.close).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    yield accepted
    stop.set()
    thread.join()
    server.close()
    for conn in accepted:
        conn.close()


@pytest.mark.parametrize("service", ["dynamodb", "s3", "sqs"])
def test_clients_make_one_attempt_with_the_default_timeouts(
    service: str, aws_credentials: None
) -> None:
    built = client(service, Settings(region="eu-west-1"))  # type: ignore[call-overload]
    config = built.meta.config
    assert config.retries["total_max_attempts"] == 1
    assert (config.connect_timeout, config.read_timeout) == (
        c.DEFAULT_AWS_CONNECT_TIMEOUT_SECONDS,
        c.DEFAULT_AWS_READ_TIMEOUT_SECONDS,
    )


def test_clients_take_their_timeouts_from_the_settings(aws_credentials: None) -> None:
    settings = Settings.from_env(
        {c.ENV_AWS_CONNECT_TIMEOUT_SECONDS: "1.5", c.ENV_AWS_READ_TIMEOUT_SECONDS: "3"},
        region="eu-west-1",
    )
    config = client("sqs", settings).meta.config
    assert (config.connect_timeout, config.read_timeout) == (1.5, 3.0)


def test_a_call_to_an_endpoint_that_never_answers_fails_once_within_the_read_timeout(
    hanging_endpoint: list[socket.socket],
) -> None:
    sqs = client("sqs", Settings(region="eu-west-1", aws_read_timeout_seconds=0.5))
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        sqs.list_queues()
    assert time.monotonic() - started < 3
    assert len(hanging_endpoint) == 1  # no retry underneath the layer's own


def test_a_redrive_s_queue_client_reads_past_its_longest_poll(aws_credentials: None) -> None:
    settings = Settings(
        region="eu-west-1",
        table_name="t",
        delay_queue_url="https://sqs/delay",
        reject_queue_url="https://sqs/rejects",
        payload_bucket="b",
    )
    services = redrive_services(settings)
    assert services.sqs.meta.config.read_timeout == (
        c.DEFAULT_AWS_READ_TIMEOUT_SECONDS + MAX_WAIT_SECONDS
    )
    assert services.s3.meta.config.read_timeout == c.DEFAULT_AWS_READ_TIMEOUT_SECONDS
