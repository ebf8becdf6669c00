"""Kafka's wire format, shared by the driver and the executors.

``client``       protocol requests (Metadata, ListOffsets, Fetch, FindCoordinator) over
                 kafka-python's network layer
``tls``          the TLS context from trust and key stores (PKCS12, PEM)
``handshake``    connection set-up: TLS and SASL failures diagnosed on the first attempt
``records``      record batches v2 and legacy message sets: the reference decoder (the spec)
``fast_decode``  the executors' decoder: whole record batches straight into Arrow columns
``codecs``       gzip, snappy, lz4, zstd
``arrow``        decoded records -> Arrow, the reference for ``fast_decode``
"""
