"""`delayq reschedule` on the embedded stack: a stored message moved earlier through the
command line arrives at its new time and not at its old one; an unknown id is rejected with its
record kept."""

from __future__ import annotations

import json
import time

import pytest

from delayq import constants as c
from delayq.store import id_of_sort_key
from delayq_local import EmbeddedStack, StackConfig
from delayq_local.cli import main
from delayq_local.producer import DelayProducer, Due
from tests.integration.support import consume, fast_stack, header_text

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

TARGET = "moved.orders"
# The old due time is well past the horizon (stored); the new one is sooner.
OLD_DELAY_MS = 60_000
NEW_DELAY_S = 8


def config(stack_name: str) -> StackConfig:
    return fast_stack(stack_name, "moved.*", TARGET)


def wait_until_stored(stack: EmbeddedStack, delay_id: str, timeout: float = 30) -> None:
    table = stack.resource("MessageTable").ref
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        items = stack.client("dynamodb").scan(TableName=table)["Items"]
        if any(i["kind"]["S"] == "msg" and id_of_sort_key(i) == delay_id for i in items):
            return
        time.sleep(0.2)
    raise AssertionError(f"{delay_id} was not stored within {timeout}s")


def test_reschedule_moves_a_stored_message_and_refuses_an_unknown_id(
    stack_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with EmbeddedStack(config(stack_name)) as stack:
        producer = DelayProducer(stack.kafka_bootstrap, stack.delay_topic)
        old_due_ms = int(time.time() * 1000) + OLD_DELAY_MS
        producer.send(TARGET, Due(at_ms=old_due_ms), value=b"order 7", delay_id="order-7")
        producer.flush()
        producer.close()
        # A reschedule applies to a message ingested before it: wait until ingest stored it.
        wait_until_stored(stack, "order-7")
        client = ["--bootstrap", stack.kafka_bootstrap, "--topic", stack.delay_topic]
        moved_at = time.time()
        argv = ["reschedule", "order-7", "--due", str(old_due_ms), "--delay", str(NEW_DELAY_S)]
        assert main([*argv, *client, "--json"]) == 0
        written = json.loads(capsys.readouterr().out)
        assert written["was_due_ms"] == old_due_ms
        assert main(["reschedule", "nobody", "--due", str(old_due_ms), "--at", "1", *client]) == 0
        assert "reschedule for nobody written" in capsys.readouterr().out
        # Past the old due time: it would have arrived by now if it had not moved.
        until = time.monotonic() + OLD_DELAY_MS / 1000 + 8
        messages = consume(stack.kafka_bootstrap, TARGET, until=until)
        rejects = (
            stack.client("sqs")
            .receive_message(QueueUrl=stack.resource("RejectQueue").ref, MaxNumberOfMessages=10)
            .get("Messages", [])
        )
    assert [header_text(m, c.HEADER_ID) for m in messages] == ["order-7"]
    [message] = messages
    assert message.value() == b"order 7"
    due_ms = int(header_text(message, c.HEADER_DUE_MS))
    assert moved_at * 1000 + NEW_DELAY_S * 1000 - 1000 <= due_ms < old_due_ms
    assert int(header_text(message, c.HEADER_EMITTED_MS)) >= due_ms
    [reject] = [json.loads(r["Body"]) for r in rejects]
    assert reject["reason"] == "reschedule-not-found"
    assert {"delay-reschedule": list(b"nobody")} in reject["record"]["headers"]
