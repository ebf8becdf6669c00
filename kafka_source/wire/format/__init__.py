"""Kafka's record format, on bytes only (no sockets).

``records``      record batches v2 and legacy message sets: the reference decoder (the spec)
``fast_decode``  the executors' decoder: whole record batches straight into Arrow columns
``arrow``        decoded records -> Arrow, the reference for ``fast_decode``
``encode``       Arrow columns -> record batches v2, for the sink
``codecs``       gzip, snappy, lz4, zstd
"""
