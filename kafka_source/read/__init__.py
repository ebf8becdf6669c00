"""The read path: ``spark.read`` and ``spark.readStream`` with ``format("pykafka")``.

Driver side: ``offsets`` (offset ranges from the cluster), ``admission`` (how much a micro-batch
takes), ``planning`` (ranges -> Spark tasks), ``batch`` and ``stream`` (the readers Spark calls).
Executor side: ``executor`` (a task's entry point) and ``fetcher`` (the fetch loop).
"""
