"""The shared layer of the Kafka delay queue.

Contract, time buckets, retries, adapters and the domain services the handlers call.
"""
