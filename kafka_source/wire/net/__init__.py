"""Talking to Kafka brokers.

``client``            protocol requests (Metadata, ListOffsets, FindCoordinator, ...) over
                      kafka-python's network layer, with bounded retries
``metadata_view``     which Metadata answers to believe (leader epochs, brokers that just started)
``handshake``         connection set-up: TLS and SASL failures diagnosed on the first attempt
``tls``               the TLS context from trust and key stores (PKCS12, PEM)
``fetch_connection``  the executors' dedicated Fetch connections, one per broker
``fetch_protocol``    Fetch requests and responses, framed without copying the records
``fetch_session``     incremental fetch sessions (KIP-227)
"""
