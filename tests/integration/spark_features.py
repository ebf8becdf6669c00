"""Markers for integration tests that need a feature some PySpark releases lack
(:mod:`kafka_source.spark_features`); the test then skips there, naming it (tests/conftest.py)."""

import pytest

#: Trigger.AvailableNow as several micro-batches under the rate limits, the last of them
#: committed to the group by the run itself: needs admission control for Python sources.
#: Without it (PySpark 4.0, 4.1) Spark runs AvailableNow as one micro-batch, the limits cut it
#: short and the group gets its offsets when the next run starts (docs/platforms.md);
#: tests/integration/test_stream.py::test_available_now_without_admission_control checks that.
AVAILABLE_NOW_IN_MICRO_BATCHES = pytest.mark.requires_spark(
    "ADMISSION_CONTROL", "Trigger.AvailableNow in several micro-batches, the last committed by "
    "the run itself (admission control for Python sources, PySpark 4.2, SPARK-55304)")
