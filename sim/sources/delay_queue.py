"""SQS standard delay queue -> emitter: batches of up to 100 after a batching window, several
invocations at once, partial batch responses; a crashed batch comes back after the
visibility timeout; a message received more than ``maxReceiveCount`` times moves to the
dead-letter queue; a deleted message may come again (at-least-once); a received message may
be received again while the first receive's visibility timeout runs (by another poller, into
a concurrent invocation): the later receive's handle is the one that deletes it, a delete with
the earlier one succeeds and deletes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from botocore.exceptions import ClientError

from delayq.emitter import EmitterServices, emit_batch, messages_from_event
from sim.functions import Container
from sim.sources.sqs import QueuePoller
from sim.world import Invocation
from testkit.events import queue_arn, sqs_record

# From template.yaml: the emitter event source's BatchSize, batching window and maximum
# concurrency; the delay queue's visibility timeout and receive count.
EMITTER_BATCH: Final = 100
EMITTER_WINDOW_MS: Final = 1000
EMITTER_CONCURRENCY: Final = 5
DELAY_VISIBILITY_S: Final = 180
DELAY_MAX_RECEIVES: Final = 10


@dataclass(eq=False)
class DelayQueueSource(QueuePoller):
    """A delay queue's event source: up to ``concurrency`` emitter invocations at once
    (``running``); ``received`` counts the messages it handed to them."""

    function: ClassVar[str] = "emitter"
    window_ms: ClassVar[int] = EMITTER_WINDOW_MS

    concurrency: int = EMITTER_CONCURRENCY
    running: int = field(default=0, init=False)
    received: int = field(default=0, init=False)

    def poll(self) -> None:
        """Invoke the emitter with what the queue holds, while concurrency is left."""
        url = self.url
        if self.running >= self.concurrency:
            return  # a finishing invocation polls again
        if not self.may("ReceiveMessage"):
            return
        got: list[dict[str, Any]] = []
        while len(got) < EMITTER_BATCH:
            more = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=DELAY_VISIBILITY_S
            ).get("Messages", [])
            if not more:
                break
            for m in more:
                if int(m["Attributes"]["ApproximateReceiveCount"]) > DELAY_MAX_RECEIVES:
                    # The queue's redrive policy: to the dead-letter queue, as it is.
                    self.sqs.send_message(
                        QueueUrl=self.settings.delay_dlq_url, MessageBody=m["Body"]
                    )
                    self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    self.world.faults["sqs-redrive-to-dlq"] += 1
                else:
                    got.append(m)
        if not got:
            self.wake()
            return
        for m in got:
            if self.world.chance(self.knobs.sqs_concurrent_receive, "sqs-concurrent-receive"):
                # Not hidden from the other pollers after all: the next poll receives it too.
                self.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
        self.running += 1
        self.received += len(got)
        records = [
            sqs_record(
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                body=m["Body"],
                source_arn=queue_arn(url),
                receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
                sent_ms=int(m["Attributes"]["SentTimestamp"]),
            )
            for m in got
        ]
        failed: set[str] = set()

        def body(cn: Container, invocation: Invocation) -> None:
            services = EmitterServices(
                delivery=cn.delivery,
                store=cn.store,
                delay_queue=cn.delay_queue,
                dead_letters=cn.dead_letters,
                rejects=cn.rejects,
                payloads=cn.payloads,
                stats=cn.stats,
                shaper=cn.shaper,
            )
            result = emit_batch(
                messages_from_event({"Records": records}),
                settings=self.settings,
                services=services,
                clock=cn.clock,
                sleep=self.world.sleep,
                deadline=self.world.deadline(invocation),
            )
            failed.update(result.failed)

        def done(ok: bool) -> None:
            self.running -= 1
            if ok and self.may("DeleteMessage"):
                for m in got:
                    if m["MessageId"] in failed:
                        continue
                    if not self._delete(m["ReceiptHandle"]):
                        continue  # received again since: that receive deletes it
                    if self.world.chance(self.knobs.sqs_duplicate, "sqs-duplicate"):
                        # The delete did not reach every copy: it comes back.
                        self.sqs.send_message(
                            QueueUrl=url, MessageBody=m["Body"], DelaySeconds=DELAY_VISIBILITY_S
                        )
            self.world.at(self.world.now_ms, self.poll)

        self.functions.invoke("emitter", body, done)
        self.world.at(self.world.now_ms, self.poll)

    def _delete(self, handle: str) -> bool:
        """Delete a received message; False when a later receive took it (SQS answers the
        delete with an earlier handle as done, and the message stays)."""
        try:
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=handle)
        except ClientError as e:
            if e.response["Error"]["Code"] != "ReceiptHandleIsInvalid":
                raise
            self.world.faults["sqs-stale-handle"] += 1
            return False
        return True
