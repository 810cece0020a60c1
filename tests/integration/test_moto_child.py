"""The embedded stack's moto server runs in a child process (its own interpreter, off the
handlers' global interpreter lock), with the fixes applied there, and never outlives its
parent's use of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from delayq_local import AwsEndpoint, LocalStackError, MotoServer

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
