"""Kafka message specs kafka-python 3 lacks, in its JSON format (see ``group_protocol.py``)."""
