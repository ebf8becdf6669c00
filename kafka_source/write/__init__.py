"""The write path: ``df.write`` / ``df.writeStream`` with ``format("pykafka")``."""
