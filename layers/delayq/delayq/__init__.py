"""The shared layer of the Kafka delay queue.

Contract, time buckets, retries, adapters and the domain services the handlers call.
"""

# The package itself exports nothing: import the modules (``from delayq import buckets``).
__all__: list[str] = []
