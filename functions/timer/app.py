"""Timer: EventBridge rate(1 minute) -> one tick per period on the FIFO tick queue."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from delayq import runtime
from delayq.clock import handler_clock
from delayq.queues import TickQueue
from delayq.retry import Deadline
from delayq.scheduler import fire_timer
from delayq.settings import Settings
from delayq.tracing import traced

logger = Logger()
clock = handler_clock(__name__)


@cache
def _setup() -> tuple[Settings, TickQueue]:
    settings = Settings.from_env()
    return settings, runtime.tick_queue(settings)


@logger.inject_lambda_context
@traced
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Idempotent: every firing within one period sends the same de-duplication id."""
    settings, ticks = _setup()
    tick = fire_timer(
        tick_queue=ticks,
        settings=settings,
        clock=clock,
        deadline=Deadline.from_context(context),
    )
    logger.info("tick sent", tick=tick)
    return {"tick": tick}
