"""Watchers of cloud preemption notices: each reads one source and says whether its node
is about to go, and by when.

A watcher's ``check()`` makes at most a few HTTP requests to its node's metadata
endpoint, each with a short timeout, and never raises: an endpoint that cannot be
reached, does not answer in time or answers nonsense means "no notice" (the exceptions,
where an answer can only mean an action is scheduled, are documented on the watcher).
Checks are level-triggered: while a notice stands every ``check()`` returns an equal
``Notice`` (the same deadline, the same detail), so a poller can compare with the last.

A watcher keeps a little state (a cached token, when a notice was first seen) and is
meant for one polling thread; it takes no locks. Requests go straight to the endpoint
with ``http.client``, never through a proxy named in the environment. This module is
pure: the standard library only, nothing of raylight, Ray or torch. See docs/notices.md.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, runtime_checkable

ENDPOINT_ENV = "RAYLIGHT_NOTICE_ENDPOINT"
AWS_ENDPOINT = "http://169.254.169.254"
AZURE_ENDPOINT = "http://169.254.169.254"
GCP_ENDPOINT = "http://metadata.google.internal"
GCP_PREEMPT_GRACE_S = 30.0  # GCP stops a preempted VM about 30 s after the flag turns TRUE
GCP_MAINTENANCE_GRACE_S = 60.0  # maintenance-event changes 60 s before the event
_MAX_BODY = 1 << 16


@dataclass(frozen=True)
class Notice:
    """A node is going away. ``deadline_wall`` is when, in wall-clock epoch seconds
    (None when the source gives no time); ``reason`` is a short fixed word per kind."""

    source: str
    reason: str
    deadline_wall: float | None
    detail: str = ""


@runtime_checkable
class NoticeWatcher(Protocol):
    name: str

    def check(self) -> Notice | None: ...


class _Unreachable(Exception):
    """Nothing answered: the connection failed (refused, no route, no such host)."""


class _NoReply(Exception):
    """Connected, but no complete answer came in time."""


def _http(method: str, url: str, headers: Mapping[str, str], timeout_s: float, body: bytes | None = None) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        try:
            conn.connect()
        except OSError as e:  # refused, timed out, unroutable, DNS failure
            raise _Unreachable(str(e)) from e
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, path, body=body, headers=dict(headers))
            resp = conn.getresponse()
            return resp.status, resp.read(_MAX_BODY)
        except (OSError, http.client.HTTPException) as e:
            raise _NoReply(str(e)) from e
    finally:
        conn.close()


def _get(url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes] | None:
    """One request; None when it got no answer at all."""
    try:
        return _http("GET", url, headers, timeout_s)
    except (_Unreachable, _NoReply):
        return None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _iso_epoch(value: Any) -> float | None:
    """``2026-11-24T12:00:00Z`` -> epoch seconds, None when it is not such a time."""
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _endpoint(base: str) -> str:
    """A metadata base URL, checked once so that ``check()`` cannot fail on it later."""
    parts = urllib.parse.urlsplit(base)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"notice endpoint {base!r} is not an http://host[:port] URL")
    return base.rstrip("/")


class AwsSpotWatcher:
    """EC2 Spot: ``/latest/meta-data/spot/instance-action`` (404 while none is scheduled,
    else ``{"action": ..., "time": ...}`` about two minutes ahead) through IMDSv2.

    The session token is asked for once (TTL ``token_ttl_s``) and reused until a minute
    before it expires, or until a request with it is refused with 401. When the token
    request is refused (403 where IMDS is off, 404/405 from older or proxied endpoints,
    a server error) or not answered in time (an IMDSv2 hop limit of 1 drops the reply
    inside containers), the watcher reads with IMDSv1 (no token) for ``token_retry_s``
    before asking again; an instance that requires IMDSv2 answers such a read with 401,
    which is no notice and makes the next check ask for a token again. When nothing
    answers at all it stops there: one timeout per check.

    A 200 on instance-action means an action is scheduled, whatever its body: a body
    that does not parse is a notice with an unknown deadline. With ``rebalance`` the
    rebalance recommendation (``events/recommendations/rebalance``) is a notice too,
    reason ``rebalance``, never with a deadline: it says the instance is at raised risk,
    often minutes ahead, and often it is not interrupted; off by default.
    """

    name = "aws"

    def __init__(
        self,
        *,
        endpoint: str = AWS_ENDPOINT,
        timeout_s: float = 1.0,
        rebalance: bool = False,
        token_ttl_s: int = 21600,
        token_retry_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = _endpoint(endpoint)
        self.timeout_s = timeout_s
        self.rebalance = rebalance
        self.token_ttl_s = token_ttl_s
        self.token_retry_s = token_retry_s
        self.clock = clock
        self._token: str | None = None
        self._token_until = 0.0  # monotonic: reuse the token until then
        self._v1_until = 0.0  # monotonic: read without a token until then

    def _session(self) -> dict[str, str] | None:
        """Headers for the next reads; None when the endpoint does not answer at all."""
        now = self.clock()
        if self._token is not None and now < self._token_until:
            return {"X-aws-ec2-metadata-token": self._token}
        if now < self._v1_until:
            return {}
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}
        try:
            status, body = _http("PUT", f"{self.endpoint}/latest/api/token", headers, self.timeout_s)
        except _Unreachable:
            return None
        except _NoReply:
            status, body = 0, b""
        if status == 200 and body.strip():
            self._token = body.decode("ascii", "replace").strip()
            self._token_until = now + max(self.token_ttl_s - 60, 1)
            return {"X-aws-ec2-metadata-token": self._token}
        self._v1_until = now + self.token_retry_s  # refused (403/404/405, 5xx) or unanswered
        return {}

    def _read(self, path: str) -> tuple[int, bytes] | None:
        headers = self._session()
        if headers is None:
            return None
        got = _get(f"{self.endpoint}/latest/meta-data/{path}", headers, self.timeout_s)
        if got is not None and got[0] == 401 and not headers:
            self._v1_until = 0.0  # IMDSv2 is required: ask for a token again next check
        elif got is not None and got[0] == 401:  # the token expired early: one more try
            self._token = None
            headers = self._session()
            got = None if headers is None else _get(f"{self.endpoint}/latest/meta-data/{path}", headers, self.timeout_s)
        return got

    def check(self) -> Notice | None:
        got = self._read("spot/instance-action")
        if got is None:
            return None
        if got[0] == 200:
            doc = _json(got[1])
            action = doc.get("action") if isinstance(doc, dict) else None
            when = doc.get("time") if isinstance(doc, dict) else None
            if not isinstance(action, str):
                return Notice("aws", "spot-interruption", None, f"unparsed instance-action: {got[1][:200]!r}")
            return Notice("aws", f"spot-{action.lower()}", _iso_epoch(when), f"instance-action {action} at {when}")
        if not self.rebalance:
            return None
        got = self._read("events/recommendations/rebalance")
        if got is None or got[0] != 200:
            return None
        doc = _json(got[1])
        when = doc.get("noticeTime") if isinstance(doc, dict) else None
        return Notice("aws", "rebalance", None, f"rebalance recommendation at {when}")


class GcpPreemptionWatcher:
    """GCE: ``instance/preempted`` (``TRUE`` once a Spot or preemptible VM is being
    preempted; it stops about 30 s later) and, with ``maintenance`` (on by default),
    ``instance/maintenance-event`` = ``TERMINATE_ON_HOST_MAINTENANCE`` (it changes 60 s
    before the host's maintenance stops the VM). ``MIGRATE_ON_HOST_MAINTENANCE`` is a live
    migration the VM survives: no notice. Any other body is no notice. GCE gives no time,
    so the deadline counts from when this watcher first saw the value.
    """

    name = "gcp"

    def __init__(
        self,
        *,
        endpoint: str = GCP_ENDPOINT,
        timeout_s: float = 1.0,
        maintenance: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = _endpoint(endpoint)
        self.timeout_s = timeout_s
        self.maintenance = maintenance
        self.clock = clock
        self._first_seen: dict[str, float] = {}

    def _value(self, key: str) -> str | None:
        url = f"{self.endpoint}/computeMetadata/v1/instance/{key}"
        got = _get(url, {"Metadata-Flavor": "Google"}, self.timeout_s)
        if got is None or got[0] != 200:
            return None
        return got[1].decode("utf-8", "replace").strip()

    def _notice(self, reason: str, grace_s: float, detail: str) -> Notice:
        first = self._first_seen.setdefault(reason, self.clock())
        return Notice("gcp", reason, first + grace_s, detail)

    def check(self) -> Notice | None:
        preempted = self._value("preempted")
        if preempted is None:
            return None  # nothing answered: do not spend a second timeout
        if preempted.upper() == "TRUE":
            return self._notice("preempted", GCP_PREEMPT_GRACE_S, "instance/preempted is TRUE")
        if not self.maintenance:
            return None
        event = self._value("maintenance-event")
        if event is not None and event.upper().startswith("TERMINATE_ON_HOST_MAINTENANCE"):
            return self._notice("host-maintenance", GCP_MAINTENANCE_GRACE_S, f"maintenance-event is {event}")
        return None


class AzureScheduledEventsWatcher:
    """Azure Scheduled Events (``/metadata/scheduledevents``): events of the types in
    ``event_types`` (by default Preempt, the Spot eviction about 30 s ahead, Terminate,
    Reboot and Redeploy: each ends the training process; Freeze, a pause of seconds,
    does not) whose ``Resources`` name this VM. The deadline is the earliest
    ``NotBefore``; an event already ``Started`` is due now; one whose ``NotBefore`` does
    not parse has an unknown deadline. A body that is not JSON is no notice.

    Events go to every VM of an availability set or scale set; each names the VMs it
    affects. This VM's name is read once from ``/metadata/instance/compute/name``
    (or given as ``vm_name``); while it is unknown every event counts as this VM's.
    ``acknowledge()`` approves the events behind the last notice (POST StartRequests),
    which lets Azure act at once: call it only once the work is safe. Nothing here
    acknowledges on its own.
    """

    name = "azure"
    api_version = "2020-07-01"

    def __init__(
        self,
        *,
        endpoint: str = AZURE_ENDPOINT,
        timeout_s: float = 1.0,
        event_types: Sequence[str] = ("Preempt", "Terminate", "Reboot", "Redeploy"),
        vm_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = _endpoint(endpoint)
        self.timeout_s = timeout_s
        self.event_types = frozenset(t.lower() for t in event_types)
        self.vm_name = vm_name
        self.clock = clock
        self._event_ids: tuple[str, ...] = ()
        self._started: dict[str, float] = {}  # event id -> when first seen Started

    @property
    def _url(self) -> str:
        return f"{self.endpoint}/metadata/scheduledevents?api-version={self.api_version}"

    def _name(self) -> str | None:
        if self.vm_name is None:
            url = f"{self.endpoint}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
            got = _get(url, {"Metadata": "true"}, self.timeout_s)
            if got is not None and got[0] == 200 and got[1].strip():
                self.vm_name = got[1].decode("utf-8", "replace").strip()
        return self.vm_name

    def check(self) -> Notice | None:
        got = _get(self._url, {"Metadata": "true"}, self.timeout_s)
        doc = _json(got[1]) if got is not None and got[0] == 200 else None
        events = doc.get("Events") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            return None
        due = [e for e in events if isinstance(e, dict) and str(e.get("EventType", "")).lower() in self.event_types]
        name = self._name() if due else None
        if name is not None:
            mine = name.lower().lstrip("_")
            due = [e for e in due if _names(e.get("Resources"), mine)]
        if not due:
            return None
        timed = sorted(((self._deadline(e), i) for i, e in enumerate(due)), key=lambda t: (t[0] is None, t[0] or 0.0, t[1]))
        self._event_ids = tuple(str(e["EventId"]) for e in due if e.get("EventId"))
        deadline, first = timed[0]
        detail = "; ".join(f"{e.get('EventType')} {e.get('EventId')} {e.get('EventStatus')} NotBefore={e.get('NotBefore')!r}" for e in due)
        return Notice("azure", str(due[first].get("EventType")).lower(), deadline, detail)

    def _deadline(self, event: dict[str, Any]) -> float | None:
        if event.get("EventStatus") == "Started":  # under way: due now (as first seen)
            return self._started.setdefault(str(event.get("EventId")), self.clock())
        try:
            dt = parsedate_to_datetime(str(event.get("NotBefore")))
        except (TypeError, ValueError, IndexError):
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()

    def acknowledge(self) -> bool:
        """Approve the events of the last notice; True when the endpoint accepted."""
        if not self._event_ids:
            return False
        body = json.dumps({"StartRequests": [{"EventId": i} for i in self._event_ids]}).encode()
        headers = {"Metadata": "true", "Content-Type": "application/json"}
        try:
            status, _ = _http("POST", self._url, headers, self.timeout_s, body)
        except (_Unreachable, _NoReply):
            return False
        return 200 <= status < 300


def _names(resources: Any, mine: str) -> bool:
    """Whether an event's ``Resources`` names this VM; an event naming none is everyone's."""
    if not isinstance(resources, list) or not resources:
        return True
    return any(isinstance(r, str) and r.lower().lstrip("_") == mine for r in resources)


class FileNoticeWatcher:
    """A file whose presence is the notice, written by a Kubernetes preStop hook or a
    spot agent: empty, or JSON ``{"reason": "...", "deadline": <epoch seconds>}`` (both
    optional). A file that does not parse is still a notice, with an unknown deadline."""

    name = "file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def check(self) -> Notice | None:
        try:
            with open(self.path, "rb") as f:
                body = f.read(_MAX_BODY)
        except OSError:
            return None
        if not body.strip():
            return Notice("file", "notice-file", None, self.path)
        doc = _json(body)
        if not isinstance(doc, dict):
            return Notice("file", "notice-file", None, f"{self.path}: not a JSON object")
        reason = doc.get("reason")
        deadline = doc.get("deadline")
        if not isinstance(deadline, int | float) or isinstance(deadline, bool):
            deadline = None
        reason = reason if isinstance(reason, str) and reason else "notice-file"
        return Notice("file", reason, None if deadline is None else float(deadline), self.path)


WATCHERS: dict[str, Callable[..., NoticeWatcher]] = {
    "aws": AwsSpotWatcher,
    "gcp": GcpPreemptionWatcher,
    "azure": AzureScheduledEventsWatcher,
}


def build_watchers(names: Sequence[str], *, endpoint: str | None = None, timeout_s: float = 1.0) -> list[NoticeWatcher]:
    """One watcher per name in ``WATCHERS``. ``endpoint`` (else ``$RAYLIGHT_NOTICE_ENDPOINT``)
    replaces every watcher's metadata address: a test's fake server, or a proxy."""
    unknown = [n for n in names if n not in WATCHERS and not (n.startswith(FILE_PREFIX) and n[len(FILE_PREFIX):])]
    if unknown:
        raise ValueError(
            f"unknown preemption notice source(s) {unknown}: "
            f"FailureConfig.preemption_notices takes {sorted(WATCHERS)} or '{FILE_PREFIX}PATH'"
        )
    endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
    extra = {"endpoint": endpoint} if endpoint else {}
    return [
        FileNoticeWatcher(n[len(FILE_PREFIX):]) if n.startswith(FILE_PREFIX) else WATCHERS[n](timeout_s=timeout_s, **extra)
        for n in dict.fromkeys(names)
    ]


FILE_PREFIX = "file:"  # "file:/run/notice": a FileNoticeWatcher on that path

