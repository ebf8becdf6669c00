"""Consumer-group partition assignors, mirroring Kafka's ``ConsumerPartitionAssignor``.

When the source joins a Kafka consumer group (JoinGroup protocol type ``"consumer"``) every member
sends a :class:`Subscription` under the protocol name of each assignor it supports; the member the
coordinator elects leader decodes all of them, runs the chosen assignor and sends one
:class:`Assignment` per member back in SyncGroup. Other members may be Java or kafka-python
consumers, so the protocol names (``"range"``, ``"roundrobin"``) and the byte layouts here are
exactly Kafka's ``ConsumerProtocol``.

Built-in assignors: :class:`RangeAssignor` (``"range"``), :class:`RoundRobinAssignor`
(``"roundrobin"``), and Kafka's sticky ones, ``"sticky"`` and ``"cooperative-sticky"``
(:mod:`kafka_source.group.sticky`). A user assignor is a subclass of :class:`PartitionAssignor`, selected with
``.option("assignor", "package.module:ClassName")`` (see :func:`load_assignor`)::

    # mypkg/assign.py
    from kafka_source.group.assignors import PartitionAssignor

    class EverythingToFirst(PartitionAssignor):
        '''Gives every partition to the first member (by id) subscribed to its topic.'''

        name = "everything-to-first"   # the protocol name sent in JoinGroup

        def assign(self, partitions_per_topic, subscriptions):
            result = {member: [] for member in subscriptions}
            for topic, count in partitions_per_topic.items():
                members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
                if members:
                    result[members[0]].extend((topic, p) for p in range(count))
            return result

    spark.readStream.format("pykafka").option("assignor", "mypkg.assign:EverythingToFirst")

The leader checks what an assignor returns with :func:`validate_assignment` (unknown members,
partitions that do not exist, are assigned twice or go to a member not subscribed to their topic
are errors; unassigned partitions only log a warning). :func:`assign_group` runs an assignor,
validates its result and wraps it into :class:`Assignment` objects ready to encode.
"""

from __future__ import annotations

import abc
import importlib
import logging
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import KafkaSourceError, OptionError

log = logging.getLogger(__name__)

# JoinGroup protocol type of every Kafka consumer group.
PROTOCOL_TYPE = "consumer"

TopicPartition = tuple[str, int]


# --------------------------------------------------------------------------------------------
# Wire format (Kafka's ConsumerProtocol; big-endian, non-flexible: int16-length strings,
# int32-length arrays and bytes, -1 for null). Versions 0..3 are known; newer versions only
# append fields, so they are read as v3 and trailing bytes are ignored, as Kafka's clients do.
# --------------------------------------------------------------------------------------------

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _Reader:
    """Reads ConsumerProtocol primitives from ``data``; any problem raises a ValueError that names
    ``what`` is being decoded and the byte offset."""

    def __init__(self, data: bytes, what: str):
        self._data = bytes(data)
        self._pos = 0
        self._what = what

    def fail(self, problem: str) -> ValueError:
        return ValueError(f"cannot decode {self._what}: {problem} (at byte {self._pos} of "
                          f"{len(self._data)})")

    def at_end(self) -> bool:
        return self._pos >= len(self._data)

    def _take(self, n: int, field: str) -> bytes:
        if self._pos + n > len(self._data):
            raise self.fail(f"truncated {field}: needs {n} bytes, "
                            f"{len(self._data) - self._pos} left")
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return chunk

    def int16(self, field: str) -> int:
        return _INT16.unpack(self._take(2, field))[0]

    def int32(self, field: str) -> int:
        return _INT32.unpack(self._take(4, field))[0]

    def nullable_string(self, field: str) -> str | None:
        length = self.int16(f"{field} length")
        if length == -1:
            return None
        if length < 0:
            raise self.fail(f"negative {field} length {length}")
        raw = self._take(length, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{field} is not valid UTF-8 ({e})") from None

    def string(self, field: str) -> str:
        value = self.nullable_string(field)
        if value is None:
            raise self.fail(f"{field} is null")
        return value

    def nullable_bytes(self, field: str) -> bytes | None:
        length = self.int32(f"{field} length")
        if length == -1:
            return None
        if length < 0:
            raise self.fail(f"negative {field} length {length}")
        return self._take(length, field)

    def array_length(self, field: str) -> int:
        length = self.int32(f"{field} count")
        if length < 0:
            raise self.fail(f"{field} array is null or has negative length {length}")
        # Each element takes at least 2 bytes: reject absurd counts before looping over them.
        if length * 2 > len(self._data) - self._pos:
            raise self.fail(f"{field} count {length} exceeds the bytes left")
        return length

    def topic_partitions(self, field: str) -> tuple[TopicPartition, ...]:
        """An array of (topic string, array of int32 partitions), flattened."""
        result: list[TopicPartition] = []
        for _ in range(self.array_length(f"{field} topic")):
            topic = self.string(f"{field} topic name")
            count = self.array_length(f"{field} partition")
            result.extend((topic, self.int32(f"{field} partition")) for _ in range(count))
        return tuple(result)


def _encode_string(value: str | None) -> bytes:
    if value is None:
        return _INT16.pack(-1)
    raw = value.encode("utf-8")
    return _INT16.pack(len(raw)) + raw


def _encode_bytes(value: bytes | None) -> bytes:
    if value is None:
        return _INT32.pack(-1)
    return _INT32.pack(len(value)) + value


def _encode_topic_partitions(partitions: Iterable[TopicPartition]) -> bytes:
    """Groups (topic, partition) pairs by topic, topics in order of first appearance."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    parts = [_INT32.pack(len(by_topic))]
    for topic, numbers in by_topic.items():
        parts.append(_encode_string(topic))
        parts.append(_INT32.pack(len(numbers)))
        parts.append(struct.pack(f">{len(numbers)}i", *numbers))
    return b"".join(parts)


def _read_version(reader: _Reader) -> int:
    version = reader.int16("version")
    if version < 0:
        raise reader.fail(f"unsupported version {version}")
    return version


def _normalize_partitions(partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
    return tuple((str(topic), int(partition)) for topic, partition in partitions)


def _normalize_user_data(user_data: bytes | None) -> bytes | None:
    return None if user_data is None else bytes(user_data)


@dataclass(frozen=True)
class Subscription:
    """What a member sends in JoinGroup: the topics it wants, plus optional assignor data.

    ``owned_partitions`` (v1+), ``generation_id`` (v2+) and ``rack_id`` (v3+) are read from
    other clients' subscriptions; :meth:`encode` writes the lowest version that carries every
    field that is set (v0 for a plain subscription, v1 with owned partitions), since Kafka
    clients from before 2.4 only know v0 (and skip the fields they do not know).
    """

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1
    rack_id: str | None = None

    def __post_init__(self):
        # Accept lists and other iterables, store tuples (hashable, immutable).
        if isinstance(self.topics, str):
            raise TypeError(f"Subscription topics must be a collection of names, not the "
                            f"string {self.topics!r}")
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "user_data", _normalize_user_data(self.user_data))
        object.__setattr__(self, "owned_partitions", _normalize_partitions(self.owned_partitions))

    def _version_needed(self) -> int:
        if self.rack_id is not None:
            return 3
        if self.generation_id != -1:
            return 2
        return 1 if self.owned_partitions else 0

    def encode(self) -> bytes:
        version = self._version_needed()
        parts = [_INT16.pack(version), _INT32.pack(len(self.topics))]
        parts.extend(_encode_string(topic) for topic in self.topics)
        parts.append(_encode_bytes(self.user_data))
        if version >= 1:
            parts.append(_encode_topic_partitions(self.owned_partitions))
        if version >= 2:
            parts.append(_INT32.pack(self.generation_id))
        if version >= 3:
            parts.append(_encode_string(self.rack_id))
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> Subscription:
        """Decodes versions 0..3 (and newer ones as 3, ignoring the fields they add).

        A field that is missing entirely (the data ends right before it) takes its default:
        null user data, no owned partitions, generation -1, no rack.
        """
        reader = _Reader(data, "consumer protocol Subscription")
        version = _read_version(reader)
        topics = tuple(reader.string("topic") for _ in range(reader.array_length("topic")))
        user_data = None if reader.at_end() else reader.nullable_bytes("user_data")
        owned: tuple[TopicPartition, ...] = ()
        generation_id, rack_id = -1, None
        if version >= 1 and not reader.at_end():
            owned = reader.topic_partitions("owned_partitions")
        if version >= 2 and not reader.at_end():
            generation_id = reader.int32("generation_id")
        if version >= 3 and not reader.at_end():
            rack_id = reader.nullable_string("rack_id")
        return cls(topics, user_data, owned, generation_id, rack_id)


@dataclass(frozen=True)
class Assignment:
    """What the leader sends each member in SyncGroup. Always encoded as version 0 (versions
    1..3 have the same layout)."""

    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None

    def __post_init__(self):
        object.__setattr__(self, "partitions", _normalize_partitions(self.partitions))
        object.__setattr__(self, "user_data", _normalize_user_data(self.user_data))

    def encode(self) -> bytes:
        return (_INT16.pack(0) + _encode_topic_partitions(self.partitions)
                + _encode_bytes(self.user_data))

    @classmethod
    def decode(cls, data: bytes) -> Assignment:
        """Decodes any version; ``b""`` (what brokers send a member that got nothing, and on
        errors) is an empty assignment."""
        if not data:
            return cls(())
        reader = _Reader(data, "consumer protocol Assignment")
        _read_version(reader)
        partitions = reader.topic_partitions("assigned_partitions")
        user_data = None if reader.at_end() else reader.nullable_bytes("user_data")
        return cls(partitions, user_data)


# --------------------------------------------------------------------------------------------
# The assignor interface and Kafka's two classic assignors
# --------------------------------------------------------------------------------------------

class PartitionAssignor(abc.ABC):
    """A group partition assignor, as Kafka's ``ConsumerPartitionAssignor``.

    ``name`` is the protocol name sent in JoinGroup; every member of a group must support the
    one the group uses, so it must match the name other clients use for the same algorithm.
    """

    name: str = ""

    def subscription_user_data(self, topics: set[str]) -> bytes | None:
        """Opaque bytes sent in this member's Subscription, seen by the leader's assignor."""
        return None

    @abc.abstractmethod
    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        """member id -> (topic, partition) list. partitions_per_topic: topic -> partition count
        (topics any member subscribed to that exist). Every member id of `subscriptions` must be
        a key of the result (possibly with an empty list)."""

    def on_assignment(self, assignment: Assignment) -> None:
        """Called on every member (leader included) with the assignment it received."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _java_string_order(value: str) -> bytes:
    """Sort key giving Java's ``String.compareTo`` order (UTF-16 code units), which Kafka's
    assignors use for member ids; it differs from Python's only for characters above U+FFFF."""
    return value.encode("utf-16-be", "surrogatepass")


def _sorted_members(members: Iterable[str]) -> list[str]:
    return sorted(members, key=_java_string_order)


class RangeAssignor(PartitionAssignor):
    """Kafka's ``RangeAssignor``: per topic, the members subscribed to it sorted by member id
    each get a contiguous range of partitions; with n partitions and m members each gets n // m
    and the first n % m members one more.

    Example (Kafka's): members C0, C1 both subscribed to t0 and t1, 3 partitions each:
    C0 gets t0p0, t0p1, t1p0, t1p1 and C1 gets t0p2, t1p2.
    """

    name = "range"

    def assign(self, partitions_per_topic, subscriptions):
        result: dict[str, list[TopicPartition]] = {member: [] for member in subscriptions}
        for topic in sorted(partitions_per_topic):
            members = _sorted_members(m for m, s in subscriptions.items() if topic in s.topics)
            if not members:
                continue
            share, extra = divmod(partitions_per_topic[topic], len(members))
            start = 0
            for i, member in enumerate(members):
                length = share + (1 if i < extra else 0)
                result[member].extend((topic, p) for p in range(start, start + length))
                start += length
        return result


class RoundRobinAssignor(PartitionAssignor):
    """Kafka's ``RoundRobinAssignor``: all partitions of the subscribed topics, sorted by
    (topic, partition), are dealt in turn to all members sorted by member id, going round in a
    circle; a member not subscribed to a partition's topic is skipped (and the next partition
    goes to the member after the one that took this one).

    Example (Kafka's): C0 subscribed to t0; C1 to t0, t1; C2 to t0, t1, t2; t0 has 1 partition,
    t1 2 and t2 3: C0 gets t0p0, C1 t1p0, C2 t1p1, t2p0, t2p1, t2p2.
    """

    name = "roundrobin"

    def assign(self, partitions_per_topic, subscriptions):
        members = _sorted_members(subscriptions)
        result: dict[str, list[TopicPartition]] = {member: [] for member in members}
        subscribed = {t for s in subscriptions.values() for t in s.topics}
        turn = 0  # index into `members` of the member whose turn it is
        for topic in sorted(subscribed & set(partitions_per_topic)):
            for partition in range(partitions_per_topic[topic]):
                # Some member is subscribed to `topic`, so this stops within one lap.
                while topic not in subscriptions[members[turn]].topics:
                    turn = (turn + 1) % len(members)
                result[members[turn]].append((topic, partition))
                turn = (turn + 1) % len(members)
        return result


BUILTIN_ASSIGNORS: dict[str, type[PartitionAssignor]] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
}


# --------------------------------------------------------------------------------------------
# Loading a user assignor from the "assignor" option
# --------------------------------------------------------------------------------------------

_VALID_CHOICES = ('"range", "roundrobin", "sticky", "cooperative-sticky", or '
                  '"package.module:ClassName"')


def _option_error(spec: object, problem: str) -> OptionError:
    return OptionError(f"option assignor={spec!r}: {problem}; valid values are {_VALID_CHOICES} "
                       f"(a subclass of kafka_source.group.assignors.PartitionAssignor)")


class _DuckTypedAssignor(PartitionAssignor):
    """Gives an object that only has ``name`` and ``assign`` the optional methods too."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        self.name = wrapped.name

    def subscription_user_data(self, topics):
        method = getattr(self.wrapped, "subscription_user_data", None)
        return method(topics) if callable(method) else None

    def assign(self, partitions_per_topic, subscriptions):
        return self.wrapped.assign(partitions_per_topic, subscriptions)

    def on_assignment(self, assignment):
        method = getattr(self.wrapped, "on_assignment", None)
        if callable(method):
            method(assignment)


def _import_attribute(spec: str, module_name: str, qualname: str):
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or anything the module raised while importing
        raise _option_error(spec, f"cannot import module {module_name!r} "
                                  f"({type(e).__name__}: {e})") from e
    obj = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _option_error(spec, f"module {module_name!r} has no class "
                                      f"{qualname!r}") from None
    return obj


def _instantiate(spec: str, cls) -> PartitionAssignor:
    if not isinstance(cls, type):
        raise _option_error(spec, f"{cls!r} is not a class")
    duck_typed = not issubclass(cls, PartitionAssignor)
    if duck_typed and not callable(getattr(cls, "assign", None)):
        raise _option_error(spec, f"class {cls.__qualname__} is not a partition assignor "
                                  f"(it neither subclasses PartitionAssignor nor has an assign "
                                  f"method)")
    try:
        assignor = cls()
    except Exception as e:
        raise _option_error(spec, f"cannot instantiate {cls.__qualname__}() with no arguments "
                                  f"({type(e).__name__}: {e})") from e
    name = getattr(assignor, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise _option_error(spec, f"class {cls.__qualname__} has no protocol name: its `name` "
                                  f"attribute must be a non-empty string, not {name!r}")
    return _DuckTypedAssignor(assignor) if duck_typed else assignor


def load_assignor(spec: str) -> PartitionAssignor:
    """The assignor named by the ``assignor`` option: ``"range"``, ``"roundrobin"``,
    ``"sticky"`` or ``"cooperative-sticky"`` (any case), or ``"package.module:ClassName"`` of a
    class instantiated with no arguments."""
    if not isinstance(spec, str) or not spec.strip():
        raise _option_error(spec, "the value is empty")
    text = spec.strip()
    from .sticky import CooperativeStickyAssignor, StickyAssignor  # noqa: PLC0415 - a cycle

    builtin = {**BUILTIN_ASSIGNORS, StickyAssignor.name: StickyAssignor,
               CooperativeStickyAssignor.name: CooperativeStickyAssignor}.get(text.lower())
    if builtin is not None:
        return builtin()
    module_name, sep, qualname = text.partition(":")
    module_name, qualname = module_name.strip(), qualname.strip()
    if not sep or not module_name or not qualname:
        raise _option_error(spec, "unknown assignor")
    return _instantiate(spec, _import_attribute(spec, module_name, qualname))


# --------------------------------------------------------------------------------------------
# Checking an assignor's result (on the group leader)
# --------------------------------------------------------------------------------------------

def _as_topic_partition(entry, member: str, fail) -> TopicPartition:
    try:
        topic, partition = entry
    except (TypeError, ValueError):
        raise fail(f"member {member!r} got {entry!r}, not a (topic, partition) pair") from None
    if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
        raise fail(f"member {member!r} got {entry!r}, not a (str topic, int partition) pair")
    return topic, partition


def _check_member_partitions(member, entries, partitions_per_topic, subscription, owner, fail):
    """Normalizes one member's list, recording each partition's owner in ``owner``."""
    checked: list[TopicPartition] = []
    for entry in entries:
        topic, partition = _as_topic_partition(entry, member, fail)
        count = partitions_per_topic.get(topic)
        if count is None or not 0 <= partition < count:
            raise fail(f"member {member!r} got {topic}-{partition}, which does not exist "
                       f"({topic!r} has {count if count is not None else 'no'} partitions "
                       f"in the metadata)")
        if topic not in subscription.topics:
            raise fail(f"member {member!r} got {topic}-{partition} but is not subscribed to "
                       f"{topic!r} (it subscribed to {sorted(subscription.topics)})")
        if (topic, partition) in owner:
            raise fail(f"{topic}-{partition} is assigned twice (to {owner[topic, partition]!r} "
                       f"and {member!r})")
        owner[topic, partition] = member
        checked.append((topic, partition))
    return checked


def _warn_unassigned(partitions_per_topic, subscriptions, owner, assignor_name) -> None:
    subscribed = {t for s in subscriptions.values() for t in s.topics}
    missing = [(t, p) for t in sorted(subscribed & set(partitions_per_topic))
               for p in range(partitions_per_topic[t]) if (t, p) not in owner]
    # A cooperative assignor leaves a partition out while the member that gives it up still
    # owns it: it is assigned in the rebalance that follows at once.
    owned = {tp for s in subscriptions.values() for tp in s.owned_partitions}
    if missing and assignor_name == "cooperative-sticky":
        waiting = [tp for tp in missing if tp in owned]
        if waiting:
            log.info("assignor %r moves %d partition(s) in two rounds: %s", assignor_name,
                     len(waiting), ", ".join(f"{t}-{p}" for t, p in waiting[:10]))
        missing = [tp for tp in missing if tp not in owned]
    if missing:
        shown = ", ".join(f"{t}-{p}" for t, p in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        log.warning("assignor %r left %d subscribed partition(s) unassigned: %s%s; no member "
                    "of the group will read them", assignor_name, len(missing), shown, more)


def validate_assignment(result: Mapping[str, Iterable[TopicPartition]],
                        partitions_per_topic: Mapping[str, int],
                        subscriptions: Mapping[str, Subscription],
                        assignor_name: str) -> dict[str, list[TopicPartition]]:
    """Checks what an assignor returned and returns it normalized (lists of tuples, every
    member present: members it left out get an empty list).

    Raises KafkaSourceError for a member not in the group, a partition that does not exist, one
    assigned twice, or one given to a member not subscribed to its topic. Partitions of
    subscribed topics that nobody got are allowed but logged as a warning.
    """
    def fail(problem: str) -> KafkaSourceError:
        return KafkaSourceError(f"assignor {assignor_name!r} returned an invalid assignment: "
                                f"{problem}")

    if not isinstance(result, Mapping):
        raise fail(f"expected a dict of member id -> partitions, got {type(result).__name__}")
    unknown = [m for m in result if m not in subscriptions]
    if unknown:
        raise fail(f"member(s) {sorted(map(str, unknown))} are not in the group "
                   f"(members: {sorted(subscriptions)})")
    owner: dict[TopicPartition, str] = {}
    checked = {member: [] for member in subscriptions}
    for member in subscriptions:
        if member in result:
            checked[member] = _check_member_partitions(
                member, result[member], partitions_per_topic, subscriptions[member], owner, fail)
    _warn_unassigned(partitions_per_topic, subscriptions, owner, assignor_name)
    return checked


def to_assignments(result: Mapping[str, Iterable[TopicPartition]],
                   user_data: Mapping[str, bytes | None] | None = None) -> dict[str, Assignment]:
    """Wraps member id -> partitions into Assignment objects, partitions sorted by
    (topic, partition); ``user_data`` optionally gives a member its assignment user data."""
    user_data = user_data or {}
    return {member: Assignment(tuple(sorted(partitions)), user_data.get(member))
            for member, partitions in result.items()}


def assign_group(assignor: PartitionAssignor, partitions_per_topic: Mapping[str, int],
                 subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
    """What the group leader does: run ``assignor``, validate its result and wrap it, one
    Assignment for every member of ``subscriptions``."""
    result = assignor.assign(partitions_per_topic, subscriptions)
    checked = validate_assignment(result, partitions_per_topic, subscriptions, assignor.name)
    return to_assignments(checked)
