"""The write path: ``df.write`` / ``df.writeStream`` with ``format("pykafka")``.

Its modules import one way, from Spark's side down to the wire: a module imports the ones on
lines below its own (or one beside it, without a cycle), never one above, and only their
public names (``tests/unit/test_write_layers.py`` checks both):

    writer                    the sink Spark calls: options and columns checked, commit/abort
    task, exactly_once        a write task; exactly-once tasks and the driver's commit
    producer_pool             one producer per Python worker, across tasks
    producer                  Kafka's producer for Arrow columns, its parts' mixins from:
    transactions, ending,     producer ids and transactions; ending them (EndTxn);
    sending                   Produce requests in flight, their answers, retries
    batches                   the per-partition batches, encoded record batches
    produce_errors, clock     error codes and failure messages; the time

Beside them, for tasks and the driver: columns, routing, partitioner, digest, held_rows,
marker. Below them: ``config/`` (the options and :class:`ProducerSettings
<kafka_source.config.producer_settings.ProducerSettings>`) and ``wire/`` (Kafka's protocol
and record format).
"""
