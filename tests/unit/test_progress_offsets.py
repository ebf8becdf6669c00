"""kafka_source.testing.progress.source_offsets: a source's offsets from Spark's progress reports,
as PySpark 4.2+ (JSON) and 4.0/4.1 (the text of a Python dict) hand them over."""

import pytest

from kafka_source.testing.progress import source_offsets

pytestmark = pytest.mark.pyspark_free


@pytest.mark.parametrize("text", [
    '{"clicks": {"0": 220, "1": 5}}',            # PySpark 4.2 and later
    "{'clicks': {'0': 220, '1': 5}}",            # PySpark 4.0, 4.1: str() of the parsed JSON
    {"clicks": {"0": 220, "1": 5}},
])
def test_each_form_gives_the_same_offsets(text):
    assert source_offsets(text) == {"clicks": {"0": 220, "1": 5}}


@pytest.mark.parametrize("text", [None, ""])
def test_no_offsets(text):
    assert source_offsets(text) == {}


def test_something_else_is_an_error():
    with pytest.raises(ValueError):
        source_offsets("[1, 2]")
    with pytest.raises((ValueError, SyntaxError)):
        source_offsets("not offsets")
