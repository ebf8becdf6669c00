"""A Schema Registry client: Confluent's REST API, as Confluent's registry and Karapace serve it.

Settings carry the names confluent-kafka's ``SchemaRegistryClient`` takes, with the
``schema.registry.`` prefix a Spark option needs: ``schema.registry.url`` (one URL, or several
separated by commas, tried in turn), ``schema.registry.basic.auth.user.info`` (``user:password``,
sent as HTTP basic authentication), ``schema.registry.ssl.ca.location``,
``schema.registry.ssl.certificate.location`` and ``schema.registry.ssl.key.location`` (PEM files),
``schema.registry.request.timeout.ms``.

Schemas never change under an id, so a schema fetched by id is kept for the life of the process
(an executor fetches each writer schema once). A subject's *latest* version is asked for only
when a query is defined. Requests that fail for want of a registry (refused, timed out, HTTP 5xx)
are retried with backoff within ``schema.registry.retry.ms`` (30 s by default), then fail with an
error naming the URL; an answer that a subject, version or id does not exist is not retried.

Only the standard library talks HTTP here: the registry's API is a handful of JSON requests.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Mapping

from ..config.secrets import Secret
from ..errors import KafkaSourceError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_RETRY_MS = 30_000

SETTINGS = ("schema.registry.url", "schema.registry.basic.auth.user.info",
            "schema.registry.ssl.ca.location", "schema.registry.ssl.certificate.location",
            "schema.registry.ssl.key.location", "schema.registry.request.timeout.ms",
            "schema.registry.retry.ms")
SECRET_SETTINGS = ("schema.registry.basic.auth.user.info",)


class RegistryError(KafkaSourceError):
    """The registry answered that something does not exist or is not allowed (not retried)."""

    def __init__(self, message: str, *, status: int | None = None, code: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class RegistryUnavailableError(KafkaSourceError):
    """No registry answered within the retry time."""


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    schema: str
    schema_type: str = "AVRO"
    subject: str | None = None
    version: int | None = None
    references: tuple = ()


@dataclass(frozen=True)
class RegistrySettings:
    """What it takes to reach the registry; picklable, into the input partitions."""

    urls: tuple[str, ...]
    user_info: Secret | None = None
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    retry_ms: int = DEFAULT_RETRY_MS

    @classmethod
    def from_options(cls, opts: Mapping[str, str]) -> "RegistrySettings | None":
        """From lower-cased options; None when no ``schema.registry.url`` is set."""
        from ..errors import OptionError

        raw = opts.get("schema.registry.url")
        if not raw:
            return None
        urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
        for u in urls:
            parsed = urllib.parse.urlparse(u)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise OptionError(f"Option 'schema.registry.url': {u!r} is not an http:// or "
                                  "https:// URL, e.g. 'http://registry:8081'.")

        def millis(key: str, default: int) -> int:
            v = opts.get(key)
            if v is None:
                return default
            try:
                n = int(v)
            except ValueError:
                n = -1
            if n <= 0:
                raise OptionError(f"Option '{key}' must be a positive number of milliseconds, "
                                  f"got {v!r}.")
            return n

        user_info = opts.get("schema.registry.basic.auth.user.info")
        if user_info is not None and ":" not in user_info:
            raise OptionError("Option 'schema.registry.basic.auth.user.info' must be "
                              "'user:password'.")
        return cls(urls=urls, user_info=None if user_info is None else Secret(user_info),
                   ca_location=opts.get("schema.registry.ssl.ca.location"),
                   certificate_location=opts.get("schema.registry.ssl.certificate.location"),
                   key_location=opts.get("schema.registry.ssl.key.location"),
                   timeout_ms=millis("schema.registry.request.timeout.ms", DEFAULT_TIMEOUT_MS),
                   retry_ms=millis("schema.registry.retry.ms", DEFAULT_RETRY_MS))


def registry_settings(opts: Mapping[str, str], also: tuple[str, ...] = ()
                      ) -> "RegistrySettings | None":
    """:meth:`RegistrySettings.from_options`, after checking that no registry setting (nor any
    of ``also``) is given without ``schema.registry.url``."""
    from ..errors import OptionError

    registry = RegistrySettings.from_options(opts)
    if registry is None:
        for key in SETTINGS[1:] + also:
            if opts.get(key) is not None:
                raise OptionError(f"Option '{key}' is set but 'schema.registry.url' is not.")
    return registry


class RegistryClient:
    """One registry (its URLs); schemas by id cached for the process."""

    def __init__(self, settings: RegistrySettings):
        self.settings = settings
        self._by_id: dict[int, RegisteredSchema] = {}
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    # --- HTTP ---------------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext | None:
        s = self.settings
        if self._ssl is None and any(u.startswith("https:") for u in s.urls):
            ctx = ssl.create_default_context(cafile=s.ca_location)
            if s.certificate_location:
                ctx.load_cert_chain(s.certificate_location, s.key_location)
            self._ssl = ctx
        return self._ssl

    def _request(self, method: str, path: str, body: dict | None = None, *,
                 retry_server_errors: bool = True) -> object:
        s = self.settings
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/vnd.schemaregistry.v1+json"
        if s.user_info:
            headers["Authorization"] = "Basic " + base64.b64encode(
                s.user_info.reveal().encode()).decode()
        deadline = time.monotonic() + s.retry_ms / 1000
        delay, attempt, last = 0.1, 0, ""
        while True:
            for url in s.urls:
                attempt += 1
                req = urllib.request.Request(url + path, data=data, headers=headers,
                                             method=method)
                try:
                    with urllib.request.urlopen(req, timeout=s.timeout_ms / 1000,
                                                context=self._context()) as resp:
                        return json.loads(resp.read() or b"null")
                except urllib.error.HTTPError as e:
                    status = e.code
                    try:
                        answer = json.loads(e.read() or b"{}")
                    except ValueError:
                        answer = {}
                    message = answer.get("message") if isinstance(answer, dict) else None
                    code = answer.get("error_code") if isinstance(answer, dict) else None
                    if status < 500 or not retry_server_errors:
                        raise RegistryError(f"Schema Registry {url}: {method} {path} answered "
                                            f"HTTP {status}" + (f" (error {code}: {message})"
                                                                if message else ""),
                                            status=status, code=code) from None
                    last = f"HTTP {status}" + (f": {message}" if message else "")
                except (urllib.error.URLError, OSError, TimeoutError) as e:
                    last = str(getattr(e, "reason", e))
            if time.monotonic() + delay > deadline:
                raise RegistryUnavailableError(
                    f"Schema Registry {', '.join(s.urls)} did not answer {method} {path} within "
                    f"{s.retry_ms} ms ({attempt} attempts; last: {last}). Check "
                    "'schema.registry.url' and that the registry is up; "
                    "'schema.registry.retry.ms' sets how long to keep trying.")
            log.warning("Schema Registry %s: %s %s failed (%s); retrying in %.1f s",
                        ", ".join(s.urls), method, path, last, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # --- the API ------------------------------------------------------------------------------

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        with self._lock:
            found = self._by_id.get(schema_id)
        if found is not None:
            return found
        answer = self._request("GET", f"/schemas/ids/{int(schema_id)}")
        found = RegisteredSchema(id=schema_id, schema=answer["schema"],
                                 schema_type=answer.get("schemaType", "AVRO"),
                                 references=tuple(answer.get("references") or ()))
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def serialized(self, schema_id: int) -> tuple[str, list]:
        """A Protobuf schema as its serialized FileDescriptorProto (base64), and its
        references: ``GET /schemas/ids/{id}?format=serialized``."""
        try:
            answer = self._request("GET", f"/schemas/ids/{int(schema_id)}?format=serialized",
                                   retry_server_errors=False)
        except RegistryError as e:
            if e.status is not None and e.status >= 500:
                raise RegistryError(
                    f"{e}. The registry could not give schema id {schema_id} as a serialized "
                    "FileDescriptorProto (Karapace 5.0.3 cannot for a schema that imports another "
                    "subject's file; Confluent's registry can). Read it with 'valueSchema' (a "
                    "FileDescriptorSet) instead.", status=e.status, code=e.code) from None
            raise
        return answer["schema"], list(answer.get("references") or ())

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        quoted = urllib.parse.quote(subject, safe="")
        answer = self._request("GET", f"/subjects/{quoted}/versions/{version}")
        found = RegisteredSchema(id=answer["id"], schema=answer["schema"],
                                 schema_type=answer.get("schemaType", "AVRO"),
                                 subject=answer.get("subject", subject),
                                 version=answer.get("version"),
                                 references=tuple(answer.get("references") or ()))
        with self._lock:
            self._by_id.setdefault(found.id, found)
        return found

    def _post_schema(self, subject: str, suffix: str, schema: str, schema_type: str) -> int:
        quoted = urllib.parse.quote(subject, safe="")
        body: dict = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        answer = self._request("POST", f"/subjects/{quoted}{suffix}", body)
        return int(answer["id"])

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """The id of ``schema`` under ``subject``, registered as its next version if it is not
        there yet (RegistryError 409 when the subject's compatibility refuses it)."""
        return self._post_schema(subject, "/versions", schema, schema_type)

    def lookup(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """The id of ``schema`` if it is registered under ``subject`` (RegistryError 404 if
        not): what a serializer asks when it may not register."""
        return self._post_schema(subject, "", schema, schema_type)


_CLIENTS: dict[RegistrySettings, RegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(settings: RegistrySettings) -> RegistryClient:
    """The process's client for these settings (so that its cache outlives one task)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = RegistryClient(settings)
        return client
