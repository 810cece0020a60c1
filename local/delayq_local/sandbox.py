"""Invoking a handler the way Lambda does: an event, a context with a deadline, errors captured.

A `LocalFunction` makes execution environments; each loads its own copy of the handler module
(its own cold start and globals), as separate Lambda sandboxes would. One environment runs one
invocation at a time.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from delayq_local.exceptions import HandlerLoadError

log = logging.getLogger(__name__)

Handler = Callable[[Any, Any], Any]
_caller = threading.local()


def current_function() -> str:
    """The logical id of the function on whose behalf this thread runs ("" if none): set for
    the length of each invocation, so that AWS calls can be attributed to their function."""
    return str(getattr(_caller, "function", ""))


@contextmanager
def _attributed(role: str, function: str) -> Iterator[None]:
    """Set this thread's `role` attribute ("function" or "poller") meanwhile."""
    previous = getattr(_caller, role, "")
    setattr(_caller, role, function)
    try:
        yield
    finally:
        setattr(_caller, role, previous)


def acting_as(function: str) -> AbstractContextManager[None]:
    """Attribute what this thread does meanwhile to `function` (a logical id)."""
    return _attributed("function", function)


def current_poller() -> str:
    """The logical id of the function whose event source this thread polls for ("" if none):
    Lambda's pollers and destinations act with the function's execution role."""
    return str(getattr(_caller, "poller", ""))


def polling_for(function: str) -> AbstractContextManager[None]:
    """Attribute this thread's calls outside invocations to `function`'s event source."""
    return _attributed("poller", function)


class _OwnedClient:
    """Base class added to the handlers' client classes: each call is attributed to the function
    whose invocation created the client, whichever thread makes it (the layer sends batches from
    thread pools)."""

    delayq_function: str = ""

    def _make_api_call(self, operation_name: str, api_params: Any) -> Any:
        with acting_as(self.delayq_function):
            return super()._make_api_call(operation_name, api_params)  # type: ignore[misc]


def _stamp_client_class(
    class_attributes: dict[str, Any], base_classes: list[type], **_: Any
) -> None:
    function = current_function()
    if function and _OwnedClient not in base_classes:
        class_attributes["delayq_function"] = function
        base_classes.insert(0, _OwnedClient)


def attribute_clients(events: Any) -> None:
    """Stamp each client made from this event emitter (a session's) during an invocation with
    its function, so that its calls are attributed to it from any thread. Idempotent."""
    events.register(
        "creating-client-class", _stamp_client_class, unique_id="delayq-attribute-clients"
    )


class RuntimeCrash(BaseException):
    """Ends an invocation the way a dying process does (fault injection): a `BaseException`, so
    that no `except Exception` in the handler can swallow it. The runtime reports a function
    error (`Runtime.ExitError`) and the environment is not used again."""


@dataclass
class LambdaContext:
    """The attributes and the one method of Lambda's Python context object that handlers use."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    deadline_ms: int
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = "local"
    identity: Any = None
    client_context: Any = None

    def __post_init__(self) -> None:
        if not self.log_group_name:
            self.log_group_name = f"/aws/lambda/{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the deadline (0 once it has passed)."""
        return max(0, self.deadline_ms - int(time.time() * 1000))


@dataclass(frozen=True)
class Invocation:
    """The outcome of one invocation. `timed_out`: it ran past the deadline, and Lambda would
    have stopped it, so its response does not count."""

    request_id: str
    response: Any
    error: BaseException | None
    duration_seconds: float
    timed_out: bool

    @property
    def crashed(self) -> bool:
        """The invocation died (`RuntimeCrash`): its environment is gone."""
        return isinstance(self.error, RuntimeCrash)

    @property
    def ok(self) -> bool:
        """Returned within the deadline without raising."""
        return self.error is None and not self.timed_out

    def describe_error(self) -> tuple[str, str]:
        """`(error type, message)` as Lambda reports a function error."""
        if self.timed_out:
            return "TimeoutError", f"Task timed out after {self.duration_seconds:.2f} seconds"
        if self.error is None:
            return "", ""
        if self.crashed:
            return "Runtime.ExitError", f"RequestId: {self.request_id} Error: {self.error}"
        return type(self.error).__name__, str(self.error)


@dataclass(frozen=True)
class LocalFunction:
    """A function to invoke locally: its name, limits, and how to load a fresh handler.
    `logical_id`: its id in the template (`current_function()` during its invocations)."""

    name: str
    loader: Callable[[], Handler]
    timeout_seconds: float = 3.0
    memory_mb: int = 128
    arn: str = ""
    logical_id: str = ""

    @classmethod
    def of(
        cls, handler: Handler, name: str = "local-function", timeout_seconds: float = 3.0
    ) -> LocalFunction:
        """A function whose environments all share one callable (fake handlers in tests)."""
        return cls(name=name, loader=lambda: handler, timeout_seconds=timeout_seconds)

    def environment(self) -> ExecutionEnvironment:
        """A new execution environment (loads the handler: a cold start)."""
        with acting_as(self.logical_id):  # its cold start runs with its role too
            return ExecutionEnvironment(self, self.loader())


@dataclass
class ExecutionEnvironment:
    """One sandbox: a loaded handler, invoked one event at a time."""

    function: LocalFunction
    handler: Handler

    def invoke(self, event: Any) -> Invocation:
        """Call the handler with `event` and a fresh context; capture what it returns or raises."""
        request_id = str(uuid.uuid4())
        started = time.time()
        arn = (
            self.function.arn or f"arn:aws:lambda:local:000000000000:function:{self.function.name}"
        )
        context = LambdaContext(
            function_name=self.function.name,
            invoked_function_arn=arn,
            memory_limit_in_mb=self.function.memory_mb,
            aws_request_id=request_id,
            deadline_ms=int((started + self.function.timeout_seconds) * 1000),
        )
        response: Any = None
        error: BaseException | None = None
        try:
            with acting_as(self.function.logical_id):
                response = self.handler(event, context)
        # The runtime turns any exception into a function error; it is recorded, not dropped.
        except Exception as e:
            error = e
            log.warning("%s %s failed: %r", self.function.name, request_id, e, exc_info=e)
        except RuntimeCrash as e:
            error = e
            log.warning("%s %s crashed: %s", self.function.name, request_id, e)
        finally:
            _discard_disabled_metrics()
        duration = time.time() - started
        timed_out = duration > self.function.timeout_seconds
        if timed_out:
            log.warning(
                "%s %s ran %.2fs, past its %.0fs timeout",
                self.function.name,
                request_id,
                duration,
                self.function.timeout_seconds,
            )
        return Invocation(request_id, response, error, duration, timed_out)


def _discard_disabled_metrics() -> None:
    """Drop what the handlers recorded while Powertools metrics are disabled (the local stack
    disables them). Powertools keeps every ``Metrics`` object's metrics in one set, never
    flushed while disabled, and prints that set whenever a metric reaches 100 values: here,
    where every function's environments share one process, that printed one function's
    metrics under another's service in the handlers' output. In AWS each environment is a
    process of its own and the stack's metrics are enabled."""
    if is_metrics_disabled():
        Metrics().clear_metrics()


def load_handler(path: Path, attribute: str, module_name: str) -> Handler:
    """Import `path` as a new module named `module_name` and return its `attribute`.

    The module is registered in `sys.modules` under that unique name (dataclasses and pickling
    look modules up there) but nothing is added to `sys.path`.
    """
    if not path.is_file():
        raise HandlerLoadError(f"no handler file {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HandlerLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise HandlerLoadError(f"importing {path} failed: {e!r}") from e
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise HandlerLoadError(f"{path} has no callable {attribute}")
    return handler  # type: ignore[no-any-return]
