"""librdkafka's mock Kafka cluster, driven through ctypes.

The confluent-kafka wheel ships librdkafka as a shared library; its experimental mock-cluster API
(`rdkafka_mock.h`) starts real Kafka-protocol brokers on loopback, so any client (confluent-kafka,
kcat) can produce and consume through them. The cluster needs an `rd_kafka_t` handle for its
bookkeeping; this module creates one from the same library.
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import confluent_kafka

from delayq_local.exceptions import KafkaMockError

# Consumer settings for the mock cluster. Its broker answers a fetch when fetch.wait.max.ms runs
# out, not when data arrives (a real broker answers at once), which would add ~0.5 s per hop;
# and its group coordinator completes a rebalance only after a session timeout (45 s by
# default), which would keep a group of several consumers waiting that long.
CONSUMER_TUNING: Final[Mapping[str, Any]] = {
    "fetch.wait.max.ms": 20,
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
}

_RD_KAFKA_PRODUCER = 0
_ERRSTR_SIZE = 512


class ApiKey(enum.IntEnum):
    """Kafka protocol request types, for `push_request_errors`."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    INIT_PRODUCER_ID = 22


def find_librdkafka() -> Path:
    """The librdkafka shared library bundled in the installed confluent-kafka wheel."""
    package_dir = Path(confluent_kafka.__file__).resolve().parent
    candidates = sorted((package_dir.parent / "confluent_kafka.libs").glob("librdkafka*.so*"))
    if not candidates:
        raise KafkaMockError(
            f"no librdkafka*.so* next to {package_dir} (confluent-kafka must come from a wheel)"
        )
    return candidates[0]


def _bind(library: Path) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as e:
        raise KafkaMockError(f"cannot load {library}: {e}") from e
    vp, cp, i32, i16 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int16
    signatures: dict[str, tuple[list[type], type | None]] = {
        "rd_kafka_conf_new": ([], vp),
        "rd_kafka_conf_set": ([vp, cp, cp, cp, ctypes.c_size_t], ctypes.c_int),
        "rd_kafka_new": ([ctypes.c_int, vp, cp, ctypes.c_size_t], vp),
        "rd_kafka_destroy": ([vp], None),
        "rd_kafka_err2str": ([ctypes.c_int], cp),
        "rd_kafka_mock_cluster_new": ([vp, ctypes.c_int], vp),
        "rd_kafka_mock_cluster_destroy": ([vp], None),
        "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
        "rd_kafka_mock_topic_create": ([vp, cp, ctypes.c_int, ctypes.c_int], ctypes.c_int),
        "rd_kafka_mock_broker_set_down": ([vp, i32], ctypes.c_int),
        "rd_kafka_mock_broker_set_up": ([vp, i32], ctypes.c_int),
        "rd_kafka_mock_push_request_errors_array": (
            [vp, i16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
            None,
        ),
        "rd_kafka_mock_group_initial_rebalance_delay_ms": ([vp, i32], None),
    }
    for name, (argtypes, restype) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise KafkaMockError(f"{library} does not export {name}") from e
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


class MockKafkaCluster:
    """A mock Kafka cluster with `brokers` brokers (ids 1..brokers) on loopback.

    Use as a context manager, or call `start()` and `stop()`. Topics are also auto-created by
    clients on first use (with the mock's default partition count); `create_topic` sets the
    partition count explicitly.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        library: Path | None = None,
        rebalance_delay_ms: int = 0,
        log_level: int = 3,
    ) -> None:
        if brokers < 1:
            raise KafkaMockError("a mock cluster needs at least one broker")
        self.brokers = brokers
        self._library_path = library
        self._rebalance_delay_ms = rebalance_delay_ms
        self._log_level = log_level
        self._lib: ctypes.CDLL | None = None
        self._rk: int | None = None
        self._cluster: int | None = None
        self._bootstrap = ""
        self._lock = threading.Lock()

    def start(self) -> MockKafkaCluster:
        """Create the handle and the cluster; brokers listen as soon as this returns."""
        with self._lock:
            if self._cluster is not None:
                return self
            lib = _bind(self._library_path or find_librdkafka())
            errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
            conf = lib.rd_kafka_conf_new()
            # The handle only hosts the cluster; its own log lines are noise below errors.
            if lib.rd_kafka_conf_set(
                conf, b"log_level", str(self._log_level).encode(), errstr, _ERRSTR_SIZE
            ):
                raise KafkaMockError(f"rd_kafka_conf_set(log_level): {errstr.value.decode()}")
            # rd_kafka_new takes ownership of conf, on success and on failure alike.
            rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
            if not rk:
                raise KafkaMockError(f"rd_kafka_new: {errstr.value.decode()}")
            cluster = lib.rd_kafka_mock_cluster_new(rk, self.brokers)
            if not cluster:
                lib.rd_kafka_destroy(rk)
                raise KafkaMockError("rd_kafka_mock_cluster_new failed")
            lib.rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, self._rebalance_delay_ms)
            self._lib, self._rk, self._cluster = lib, rk, cluster
            self._bootstrap = lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()
        return self

    def stop(self) -> None:
        """Destroy the cluster (brokers close their connections) and its handle."""
        with self._lock:
            if self._lib is None or self._cluster is None:
                return
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._rk)
            self._cluster = self._rk = None
            self._bootstrap = ""

    def __enter__(self) -> MockKafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between `start()` and `stop()`."""
        return self._cluster is not None

    @property
    def bootstrap_servers(self) -> str:
        """`host:port,host:port,...` of the brokers, for `bootstrap.servers`."""
        self._require()
        return self._bootstrap

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create a topic (the mock broker does not implement the CreateTopics admin API)."""
        lib, cluster = self._require()
        replication = min(replication_factor, self.brokers)
        self._check(
            lib,
            lib.rd_kafka_mock_topic_create(cluster, name.encode(), partitions, replication),
            f"create topic {name}",
        )

    def broker_down(self, broker_id: int) -> None:
        """Disconnect a broker and refuse new connections (-1: all brokers)."""
        lib, cluster = self._require()
        self._check(lib, lib.rd_kafka_mock_broker_set_down(cluster, broker_id), "broker down")

    def broker_up(self, broker_id: int) -> None:
        """Let a broker accept connections again (-1: all brokers)."""
        lib, cluster = self._require()
        self._check(lib, lib.rd_kafka_mock_broker_set_up(cluster, broker_id), "broker up")

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Fail the next `len(errors)` requests of type `api_key` with these error codes, in order.

        Codes are `confluent_kafka.KafkaError` values; `KafkaError._TRANSPORT` makes the broker
        drop the connection instead of answering.
        """
        lib, cluster = self._require()
        array = (ctypes.c_int * len(errors))(*errors)
        lib.rd_kafka_mock_push_request_errors_array(cluster, api_key, len(errors), array)

    def _require(self) -> tuple[ctypes.CDLL, int]:
        if self._lib is None or self._cluster is None:
            raise KafkaMockError("the mock cluster is not running (call start())")
        return self._lib, self._cluster

    @staticmethod
    def _check(lib: ctypes.CDLL, err: int, what: str) -> None:
        if err:
            message = lib.rd_kafka_err2str(err).decode()
            raise KafkaMockError(f"{what}: {message} ({err})")
