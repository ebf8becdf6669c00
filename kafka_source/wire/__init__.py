"""Kafka's protocol, shared by the driver and the executors, in two halves that meet only in
the fetch loop's receive buffer:

``net/``     talking to brokers: requests and responses, connections, TLS and SASL, the cluster's
             metadata. Knows nothing of what a record batch holds.
``format/``  Kafka's on-disk and on-the-wire record format: record batches v2 and legacy message
             sets, decoded to and encoded from Arrow, and their compression codecs. Needs no
             socket: it works on bytes, which is how the decoders are tested against each other.

``net`` imports ``format`` (a Fetch connection reads straight into the decoder's padded buffer);
``format`` never imports ``net``.
"""
