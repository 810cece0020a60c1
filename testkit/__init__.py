"""Test support shared by the tests, the benchmarks and the simulator (not shipped in the
layer): in-memory AWS clients (:mod:`testkit.aws`), Kafka producer stand-ins
(:mod:`testkit.kafka`), the events Lambda's event sources deliver (:mod:`testkit.events`), a
Lambda context for calling handlers directly (:mod:`testkit.lambda_context`), a clock that
moves only when told and the doubles built on it (:mod:`testkit.clock`)."""
