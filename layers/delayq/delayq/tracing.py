"""X-Ray tracing of the handlers: opt-in, free when off.

The template's `Tracing` parameter turns Lambda's active tracing on and sets
``POWERTOOLS_TRACE_DISABLED=false`` (``true`` otherwise). Only then does `traced` wrap a handler
with Powertools Tracer (an invocation subsegment with the cold-start annotation and the error,
and the boto3 calls, which Tracer patches), importing Tracer and the X-Ray SDK at cold start.
Otherwise `traced` returns the handler itself: nothing imported, nothing added per invocation.

Tracing is on only inside Lambda (``LAMBDA_TASK_ROOT`` set) and only when the variable says
false explicitly: the local stack, the tests and a stack deployed with ``Tracing=Disabled`` run
the plain handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from delayq.settings import tracing_enabled

__all__ = ["traced"]

F = TypeVar("F", bound=Callable[..., Any])


def traced(
    handler: F,
    *,
    environ: Mapping[str, str] | None = None,
    tracer_factory: Callable[[], Any] | None = None,
) -> F:
    """`handler` under Powertools Tracer when tracing is enabled, else `handler` unchanged.

    Responses are not recorded (they can name topics and ids); errors are."""
    if not tracing_enabled(environ):
        return handler
    if tracer_factory is None:
        from aws_lambda_powertools import Tracer  # noqa: PLC0415 (imported only when tracing)

        tracer_factory = Tracer
    tracer = tracer_factory()
    return cast(F, tracer.capture_lambda_handler(handler, capture_response=False))
