"""Stand-ins for ``confluent_kafka.Producer``: :class:`FakeProducer`, which acknowledges (or
fails, as told) in memory what the layer's ``delayq.kafka.KafkaDelivery`` produces, and
:class:`CapturedProducer`, which only keeps the configuration it was built with."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from confluent_kafka import KafkaError

from testkit.aws import MsClock, RequestCounter

DeliveryCallback = Callable[[Any, Any], None]


@dataclass(frozen=True)
class ProducedRecord:
    """One record the fake producer acknowledged."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None when absent)."""
        found = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found


class _Delivered:
    """What confluent-kafka passes to a delivery callback as the message."""

    __slots__ = ("_record",)

    def __init__(self, record: ProducedRecord) -> None:
        self._record = record

    def topic(self) -> str:
        return self._record.topic

    def key(self) -> bytes | None:
        return self._record.key

    def value(self) -> bytes | None:
        return self._record.value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._record.headers)


class FakeProducer:
    """``confluent_kafka.Producer``'s produce / poll / flush contract, in memory: every record
    is acknowledged at the next poll or flush, unless told otherwise.

    - ``fail_topics`` get a delivery error, the cluster's refusal (unknown topic);
    - ``unavailable`` fails every record as an unreachable cluster does (message timed out);
    - ``silent`` records never get a report (a flush timeout: flush returns them as pending);
    - ``refuse`` makes ``produce()`` itself raise.

    Acknowledged records are kept in ``produced`` unless ``keep=False`` (long benchmark runs:
    then they are only counted, in ``per_topic`` and the request ``counter``). With a
    ``clock``, ``produced_at`` holds the time of every ``produce()`` call (kept runs only).
    """

    service = "kafka"

    def __init__(
        self,
        counter: RequestCounter | None = None,
        *,
        keep: bool = True,
        fail_topics: Collection[str] = frozenset(),
        unavailable: bool = False,
        silent: bool = False,
        refuse: bool = False,
        clock: MsClock | None = None,
    ) -> None:
        self.counter = counter or RequestCounter()
        self.keep = keep
        self.fail_topics = frozenset(fail_topics)
        self.unavailable = unavailable
        self.silent = silent
        self.refuse = refuse
        self.clock = clock
        self.produced: list[ProducedRecord] = []
        self.produced_at: list[int] = []
        self.per_topic: Counter[str] = Counter()
        self._pending: list[tuple[DeliveryCallback | None, ProducedRecord]] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        on_delivery: DeliveryCallback | None = None,
        **_: Any,
    ) -> None:
        """Queue one record for its delivery report."""
        if self.refuse:
            raise ValueError("refused by the test")
        if self.keep and self.clock is not None:
            self.produced_at.append(self.clock())
        self._pending.append((on_delivery, ProducedRecord(topic, key, value, tuple(headers or ()))))

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports; returns how many were served."""
        return 0 if self.silent else self._serve()

    def flush(self, timeout: float = 0) -> int:
        """Serve every delivery report; returns how many are still pending (0 unless
        ``silent``)."""
        if not self.silent:
            self._serve()
        return len(self._pending)

    def __len__(self) -> int:
        return len(self._pending)

    def _serve(self) -> int:
        pending, self._pending = self._pending, []
        for callback, record in pending:
            error = self._error_for(record)
            if error is not None:
                if callback:
                    callback(error, None)
                continue
            self.per_topic[record.topic] += 1
            self.counter.record(self.service, "Produce", records=1)
            if self.keep:
                self.produced.append(record)
            if callback:
                callback(None, _Delivered(record))
        return len(pending)

    def _error_for(self, record: ProducedRecord) -> KafkaError | None:
        if self.unavailable:
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        if record.topic in self.fail_topics:
            return KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        return None


class CapturedProducer:
    """Stands in for the ``confluent_kafka.Producer`` class (monkeypatch it in): keeps the
    configuration it is built with (``config``; every instance's in the class-wide ``configs``,
    which a test resets), connects nowhere, and has nothing to flush."""

    configs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        type(self).configs.append(config)

    def flush(self, timeout: float = 0) -> int:
        return 0
