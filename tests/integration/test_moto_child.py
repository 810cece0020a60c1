"""The embedded stack's moto server runs in a child process (its own interpreter, off the
handlers' global interpreter lock), with the fixes applied there, and never outlives its
parent's use of it."""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from delayq_local import AwsEndpoint, LocalStackError, MotoServer, moto_child
from delayq_local.moto_child import freeze_survivors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_the_server_runs_in_a_child_process_that_stop_ends() -> None:
    server = MotoServer().start()
    pid = server.pid
    assert pid is not None
    assert pid != os.getpid()
    assert _alive(pid)
    sqs = AwsEndpoint(server.endpoint_url).client("sqs")
    url = sqs.create_queue(QueueName="child-check")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url)["Messages"]] == ["hello"]

    server.stop()

    assert not _alive(pid)
    with pytest.raises(LocalStackError, match="not running"):
        server.endpoint_url  # noqa: B018 -- the property raises


def test_the_child_has_the_fixes_applied() -> None:
    # SQS keeps a FIFO de-duplication id for 5 minutes even after the message is deleted;
    # plain moto forgets it (tests/integration/test_moto_fixes.py).
    with MotoServer() as server:
        sqs = AwsEndpoint(server.endpoint_url).client("sqs")
        url = sqs.create_queue(QueueName="dedup.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]

        def send(body: str) -> None:
            sqs.send_message(
                QueueUrl=url, MessageBody=body, MessageGroupId="g", MessageDeduplicationId="same"
            )

        send("first")
        (first,) = sqs.receive_message(QueueUrl=url)["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
        send("again")
        assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []


PARENT = """
import sys, time
from delayq_local import MotoServer
server = MotoServer().start()
print(server.pid, flush=True)
time.sleep(600)
"""


def test_the_child_exits_when_its_parent_dies() -> None:
    parent = subprocess.Popen(  # noqa: S603 -- this interpreter, our own code
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)

    parent.send_signal(signal.SIGKILL)
    parent.wait()

    deadline = time.monotonic() + 20
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid)


@pytest.fixture
def collector() -> Iterator[None]:
    """The child's collection policy installed in this process for the test; nothing left
    frozen after it."""
    gc.collect()
    gc.unfreeze()
    gc.callbacks.append(freeze_survivors)
    try:
        yield
    finally:
        gc.callbacks.remove(freeze_survivors)
        gc.unfreeze()


def test_a_full_collection_freezes_its_survivors(collector: None) -> None:
    kept = [{"item": i} for i in range(1000)]
    gc.collect(1)
    assert gc.get_freeze_count() == 0  # a young collection walks only the young
    gc.collect()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_objects(2) == []  # the next full collection starts from nothing


def test_later_full_collections_walk_only_what_is_newer(collector: None) -> None:
    gc.collect()
    frozen = gc.get_freeze_count()
    newer = [[i] for i in range(500)]
    gc.collect()
    assert gc.get_freeze_count() >= frozen + len(newer)
    assert gc.get_objects(2) == []


def test_the_child_installs_the_policy_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[bool] = []

    class Server:
        def __init__(self, **_: Any) -> None:
            installed.append(freeze_survivors in gc.callbacks)

        def start(self) -> None: ...

        def get_host_and_port(self) -> tuple[str, int]:
            return "127.0.0.1", 1

        def stop(self) -> None: ...

    monkeypatch.setattr(moto_child, "ThreadedMotoServer", Server)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    try:
        assert moto_child.main(["moto_child", "127.0.0.1", "0"]) == 0
    finally:
        gc.callbacks.remove(freeze_survivors)
        gc.unfreeze()
    assert installed == [True]
