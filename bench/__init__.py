"""Benchmarks of the delay queue: handler CPU cost, AWS requests per message, cost and burst
models, and (on the embedded local stack) end-to-end lateness and a measured burst.

Run everything with ``make bench`` (or ``.venv/bin/python -m bench``). The figures, their
method, inputs and the machine are printed and written to ``results/bench.json`` and
``results/bench.md``; ``docs/benchmarks.md`` explains the method. Benchmarks print figures:
they never fail on speed.

Nothing here is shipped in the Lambda layer.
"""
