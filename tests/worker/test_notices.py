"""Preemption notice watchers against a fake metadata server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from raylight.worker.notices import (
    ENDPOINT_ENV,
    AwsSpotWatcher,
    AzureScheduledEventsWatcher,
    FileNoticeWatcher,
    GcpPreemptionWatcher,
    Notice,
    NoticeWatcher,
    build_watchers,
)

HANG = "hang"  # a route that answers only when the test ends
AZURE_EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NAME = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"


@dataclass
class Route:
    status: int
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)  # the request must carry these


@dataclass
class FakeMetadata:
    """Routes by (method, path with query); a route with AWS's token rules on top."""

    url: str
    routes: dict[tuple[str, str], Route | str] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    aws_token: str | None = None  # when set, /latest/meta-data/ needs it (IMDSv2 required)

    def serve(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        self.requests.append((method, path, headers, body))
        route = self.routes.get((method, path))
        if route == HANG:
            self.release.wait(30)
            return 500, b""
        token = headers.get("x-aws-ec2-metadata-token")
        if path.startswith("/latest/meta-data/") and self.aws_token is not None and token != self.aws_token:
            return 401, b""
        if not isinstance(route, Route):
            return 404, b""
        if any(headers.get(k.lower()) != v for k, v in route.headers.items()):
            return 403, b"missing header"
        return route.status, route.body.encode() if isinstance(route.body, str) else route.body

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p, _, _ in self.requests if (m, p) == (method, path))


@pytest.fixture
def fake() -> Iterator[FakeMetadata]:
    state: list[FakeMetadata] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out = state[0].serve(self.command, self.path, headers, body)
            # A HANG route answers after the watcher gave up on it (its timeout is what those
            # tests check): the client is gone, and the traceback would only be noise.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        do_GET = do_PUT = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.append(FakeMetadata(url=f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state[0]
    finally:
        state[0].release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def timed(watcher: NoticeWatcher) -> tuple[Notice | None, float]:
    start = time.monotonic()
    got = watcher.check()
    return got, time.monotonic() - start


# --- AWS ---------------------------------------------------------------------------------

TOKEN_HEADER = {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}


def aws(fake: FakeMetadata, *, action: dict[str, str] | str | None = None, rebalance: bool = False) -> None:
    fake.aws_token = "tok-1"
    fake.routes[("PUT", "/latest/api/token")] = Route(200, "tok-1", TOKEN_HEADER)
    if action is not None:
        body = action if isinstance(action, str) else json.dumps(action)
        fake.routes[("GET", "/latest/meta-data/spot/instance-action")] = Route(200, body)
    if rebalance:
        body = json.dumps({"noticeTime": "2026-11-24T11:50:00Z"})
        fake.routes[("GET", "/latest/meta-data/events/recommendations/rebalance")] = Route(200, body)


def test_aws_no_action_is_no_notice_and_the_token_is_reused(fake):
    aws(fake)
    watcher = AwsSpotWatcher(endpoint=fake.url, timeout_s=1.0)
    assert watcher.check() is None
    assert watcher.check() is None
    assert fake.count("PUT", "/latest/api/token") == 1
    assert fake.count("GET", "/latest/meta-data/spot/instance-action") == 2


def test_aws_instance_action_gives_its_time_as_the_deadline(fake):
    aws(fake, action={"action": "terminate", "time": "2026-11-24T12:00:00Z"})
    watcher = AwsSpotWatcher(endpoint=fake.url)
    notice = watcher.check()
    assert notice == Notice("aws", "spot-terminate", 1795521600.0, "instance-action terminate at 2026-11-24T12:00:00Z")
    assert watcher.check() == notice  # level-triggered: the same notice while it stands
    reads = [h for m, p, h, _ in fake.requests if p.startswith("/latest/meta-data/")]
    assert reads and all(h.get("x-aws-ec2-metadata-token") == "tok-1" for h in reads)


def test_aws_without_a_token_where_imdsv2_is_required_is_no_notice(fake):
    aws(fake, action={"action": "stop", "time": "2026-11-24T12:00:00Z"})
    fake.routes[("PUT", "/latest/api/token")] = Route(503)  # IMDSv2 required, but no token to be had
    watcher = AwsSpotWatcher(endpoint=fake.url)
    assert watcher.check() is None
    _, _, headers, _ = fake.requests[-1]
    assert "x-aws-ec2-metadata-token" not in headers  # it fell back to IMDSv1, which was refused
    # The refusal (401) says IMDSv2 is required: the next check asks for a token at once.
    fake.routes[("PUT", "/latest/api/token")] = Route(200, "tok-1", TOKEN_HEADER)
    assert watcher.check().reason == "spot-stop"


@pytest.mark.parametrize("status", [403, 404, 405, 500])
def test_aws_falls_back_to_imdsv1_when_the_token_is_refused(fake, status):
    aws(fake, action={"action": "hibernate", "time": "2026-11-24T12:00:00Z"})
    fake.aws_token = None  # IMDSv1 allowed
    fake.routes[("PUT", "/latest/api/token")] = Route(status)
    watcher = AwsSpotWatcher(endpoint=fake.url)
    assert watcher.check().reason == "spot-hibernate"
    watcher.check()
    assert fake.count("PUT", "/latest/api/token") == 1  # not asked again until token_retry_s


def test_aws_falls_back_to_imdsv1_when_the_token_reply_never_comes(fake):
    # An IMDSv2 hop limit of 1 drops the token's reply inside a container.
    aws(fake, action={"action": "terminate", "time": "2026-11-24T12:00:00Z"})
    fake.aws_token = None
    fake.routes[("PUT", "/latest/api/token")] = HANG
    notice, took = timed(AwsSpotWatcher(endpoint=fake.url, timeout_s=0.3))
    assert notice is not None and notice.deadline_wall == 1795521600.0
    assert took < 2.0


def test_aws_asks_for_a_new_token_when_the_old_one_is_refused(fake):
    aws(fake)
    watcher = AwsSpotWatcher(endpoint=fake.url)
    assert watcher.check() is None
    aws(fake, action={"action": "terminate", "time": "2026-11-24T12:00:00Z"})
    fake.aws_token = "tok-2"
    fake.routes[("PUT", "/latest/api/token")] = Route(200, "tok-2", TOKEN_HEADER)
    assert watcher.check().reason == "spot-terminate"
    assert fake.count("PUT", "/latest/api/token") == 2


def test_aws_malformed_action_is_a_notice_with_an_unknown_deadline(fake):
    aws(fake, action="{not json")
    notice = AwsSpotWatcher(endpoint=fake.url).check()
    assert notice is not None and notice.reason == "spot-interruption" and notice.deadline_wall is None
    aws(fake, action={"action": "terminate", "time": "soon"})
    notice = AwsSpotWatcher(endpoint=fake.url).check()
    assert notice is not None and notice.reason == "spot-terminate" and notice.deadline_wall is None


def test_aws_rebalance_is_a_deadline_less_notice_only_when_asked(fake):
    aws(fake, rebalance=True)
    assert AwsSpotWatcher(endpoint=fake.url).check() is None
    notice = AwsSpotWatcher(endpoint=fake.url, rebalance=True).check()
    assert notice == Notice("aws", "rebalance", None, "rebalance recommendation at 2026-11-24T11:50:00Z")
    aws(fake, action={"action": "terminate", "time": "2026-11-24T12:00:00Z"}, rebalance=True)
    assert AwsSpotWatcher(endpoint=fake.url, rebalance=True).check().reason == "spot-terminate"


# --- GCP ---------------------------------------------------------------------------------

GOOGLE = {"Metadata-Flavor": "Google"}


def gcp(fake: FakeMetadata, preempted: str = "FALSE", maintenance: str = "NONE") -> None:
    fake.routes[("GET", "/computeMetadata/v1/instance/preempted")] = Route(200, preempted, GOOGLE)
    fake.routes[("GET", "/computeMetadata/v1/instance/maintenance-event")] = Route(200, maintenance, GOOGLE)


def test_gcp_preempted_gives_30_s_from_when_first_seen(fake):
    now = [1000.0]
    watcher = GcpPreemptionWatcher(endpoint=fake.url, clock=lambda: now[0])
    gcp(fake)
    assert watcher.check() is None
    gcp(fake, preempted="TRUE")
    now[0] = 1005.0
    assert watcher.check() == Notice("gcp", "preempted", 1035.0, "instance/preempted is TRUE")
    now[0] = 1010.0
    assert watcher.check().deadline_wall == 1035.0  # counted from the first sighting
    assert all(h.get("metadata-flavor") == "Google" for _, _, h, _ in fake.requests)


@pytest.mark.parametrize(("event", "expected"), [
    ("NONE", None), ("MIGRATE_ON_HOST_MAINTENANCE", None), ("garbage", None),
    ("TERMINATE_ON_HOST_MAINTENANCE", 1060.0),
])
def test_gcp_host_maintenance_that_terminates_is_a_notice(fake, event, expected):
    gcp(fake, maintenance=event)
    notice = GcpPreemptionWatcher(endpoint=fake.url, clock=lambda: 1000.0).check()
    assert (notice and notice.deadline_wall) == expected
    assert GcpPreemptionWatcher(endpoint=fake.url, maintenance=False).check() is None


def test_gcp_unexpected_bodies_are_no_notice(fake):
    gcp(fake, preempted="<html>captive portal</html>")
    assert GcpPreemptionWatcher(endpoint=fake.url).check() is None
    fake.routes[("GET", "/computeMetadata/v1/instance/preempted")] = Route(500, "TRUE")
    assert GcpPreemptionWatcher(endpoint=fake.url).check() is None


# --- Azure -------------------------------------------------------------------------------

AZURE = {"Metadata": "true"}


def azure(fake: FakeMetadata, events: list[dict[str, Any]] | str, name: str = "vm-3") -> None:
    body = events if isinstance(events, str) else json.dumps({"DocumentIncarnation": 2, "Events": events})
    fake.routes[("GET", AZURE_EVENTS)] = Route(200, body, AZURE)
    fake.routes[("GET", AZURE_NAME)] = Route(200, name, AZURE)
    fake.routes[("POST", AZURE_EVENTS)] = Route(200, "", AZURE)


def event(kind: str, *, vm: str = "vm-3", status: str = "Scheduled", not_before: str = "Tue, 24 Nov 2026 12:00:00 GMT", id: str = "E1") -> dict[str, Any]:
    return {
        "EventId": id, "EventType": kind, "ResourceType": "VirtualMachine", "Resources": [vm],
        "EventStatus": status, "NotBefore": not_before, "Description": "", "EventSource": "Platform",
    }


def test_azure_preempt_gives_not_before_as_the_deadline(fake):
    azure(fake, [])
    watcher = AzureScheduledEventsWatcher(endpoint=fake.url)
    assert watcher.check() is None
    azure(fake, [event("Freeze", id="E0"), event("Preempt")])
    notice = watcher.check()
    assert notice is not None and (notice.source, notice.reason, notice.deadline_wall) == ("azure", "preempt", 1795521600.0)
    assert watcher.check() == notice


def test_azure_takes_the_earliest_deadline_and_only_this_vms_events(fake):
    azure(fake, [
        event("Terminate", id="E1"),
        event("Reboot", id="E2", not_before="Tue, 24 Nov 2026 11:59:00 GMT"),
        event("Preempt", id="E3", vm="vm-4", not_before="Tue, 24 Nov 2026 11:00:00 GMT"),
    ])
    notice = AzureScheduledEventsWatcher(endpoint=fake.url).check()
    assert (notice.reason, notice.deadline_wall) == ("reboot", 1795521540.0)
    azure(fake, [event("Preempt", vm="_vm-4")])
    assert AzureScheduledEventsWatcher(endpoint=fake.url).check() is None
    # A scale set's instance is named with a leading underscore in Resources.
    azure(fake, [event("Preempt", vm="_VM-3")])
    assert AzureScheduledEventsWatcher(endpoint=fake.url).check() is not None


def test_azure_started_is_due_now_and_a_bad_not_before_is_unknown(fake):
    now = [5000.0]
    azure(fake, [event("Preempt", status="Started", not_before="")])
    watcher = AzureScheduledEventsWatcher(endpoint=fake.url, clock=lambda: now[0])
    assert watcher.check().deadline_wall == 5000.0
    now[0] = 5002.0
    assert watcher.check().deadline_wall == 5000.0
    azure(fake, [event("Preempt", not_before="whenever")])
    notice = AzureScheduledEventsWatcher(endpoint=fake.url).check()
    assert notice is not None and notice.deadline_wall is None


def test_azure_malformed_documents_are_no_notice(fake):
    for body in ("{not json", json.dumps({"Events": "none"}), json.dumps([1, 2])):
        azure(fake, body)
        assert AzureScheduledEventsWatcher(endpoint=fake.url).check() is None


def test_azure_an_unknown_vm_name_counts_every_event(fake):
    azure(fake, [event("Preempt", vm="vm-9")])
    del fake.routes[("GET", AZURE_NAME)]
    assert AzureScheduledEventsWatcher(endpoint=fake.url).check() is not None


def test_azure_acknowledges_only_when_asked(fake):
    azure(fake, [event("Preempt", id="E7"), event("Terminate", id="E8")])
    watcher = AzureScheduledEventsWatcher(endpoint=fake.url)
    assert watcher.acknowledge() is False  # no notice yet: nothing to approve
    watcher.check()
    assert fake.count("POST", AZURE_EVENTS) == 0
    assert watcher.acknowledge() is True
    posts = [json.loads(b) for m, _, _, b in fake.requests if m == "POST"]
    assert posts == [{"StartRequests": [{"EventId": "E7"}, {"EventId": "E8"}]}]


# --- every cloud: unreachable, slow, wrong headers ---------------------------------------

WATCHER_TYPES = [AwsSpotWatcher, GcpPreemptionWatcher, AzureScheduledEventsWatcher]


@pytest.mark.parametrize("kind", WATCHER_TYPES)
def test_an_unreachable_endpoint_is_no_notice_at_once(kind, closed_port):
    notice, took = timed(kind(endpoint=closed_port, timeout_s=1.0))
    assert notice is None and took < 1.0


@pytest.mark.parametrize("kind", WATCHER_TYPES)
def test_an_endpoint_that_never_answers_is_no_notice_within_the_timeout(kind, fake):
    aws(fake)
    for method, path in [
        ("GET", "/latest/meta-data/spot/instance-action"), ("GET", "/computeMetadata/v1/instance/preempted"),
        ("GET", AZURE_EVENTS),
    ]:
        fake.routes[(method, path)] = HANG
    notice, took = timed(kind(endpoint=fake.url, timeout_s=0.3))
    assert notice is None and took < 1.0


def test_a_silent_host_is_no_notice_within_the_timeout():
    # Accepts connections (the kernel's backlog) but never reads or answers them.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        for kind in WATCHER_TYPES:
            notice, took = timed(kind(endpoint=url, timeout_s=0.2))
            assert notice is None and took < 1.0, kind


def test_requests_without_the_clouds_header_are_refused_by_the_fake(fake):
    gcp(fake, preempted="TRUE")
    azure(fake, [event("Preempt")])
    # The fake enforces the headers: a watcher that forgot them would see 403 here.
    assert GcpPreemptionWatcher(endpoint=fake.url).check() is not None
    assert AzureScheduledEventsWatcher(endpoint=fake.url).check() is not None
    assert fake.serve("GET", "/computeMetadata/v1/instance/preempted", {}, b"")[0] == 403


# --- file --------------------------------------------------------------------------------


def test_file_notice(tmp_path):
    path = tmp_path / "preempt.json"
    watcher = FileNoticeWatcher(path)
    assert watcher.check() is None
    path.write_text("")
    assert watcher.check() == Notice("file", "notice-file", None, str(path))
    path.write_text(json.dumps({"reason": "k8s-prestop", "deadline": 1795521600}))
    assert watcher.check() == Notice("file", "k8s-prestop", 1795521600.0, str(path))
    path.write_text(json.dumps({"deadline": "soon"}))
    assert watcher.check() == Notice("file", "notice-file", None, str(path))
    path.write_text("{torn")
    notice = watcher.check()
    assert notice is not None and notice.deadline_wall is None


# --- build_watchers ----------------------------------------------------------------------


def test_build_watchers_by_name(fake):
    watchers = build_watchers(["aws", "gcp", "azure", "aws"], endpoint=fake.url, timeout_s=0.5)
    assert [type(w) for w in watchers] == WATCHER_TYPES
    assert all(isinstance(w, NoticeWatcher) and w.endpoint == fake.url and w.timeout_s == 0.5 for w in watchers)
    assert build_watchers(["gcp"])[0].endpoint == "http://metadata.google.internal"
    assert isinstance(FileNoticeWatcher("x"), NoticeWatcher)


def test_build_watchers_names_an_unknown_source_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"\['ec2'\].*preemption_notices.*\['aws', 'azure', 'gcp'\]"):
        build_watchers(["aws", "ec2"])


@pytest.mark.parametrize("url", ["169.254.169.254", "https://169.254.169.254", "http://:80", "http://host:port"])
def test_an_endpoint_that_is_not_an_http_url_is_refused_at_once(url):
    with pytest.raises(ValueError, match="not an http://host"):
        AwsSpotWatcher(endpoint=url)


def test_the_endpoint_variable_points_every_watcher_elsewhere(fake, monkeypatch):
    monkeypatch.setenv(ENDPOINT_ENV, fake.url)
    assert {w.endpoint for w in build_watchers(["aws", "azure"])} == {fake.url}
    assert build_watchers(["aws"], endpoint="http://127.0.0.1:9")[0].endpoint == "http://127.0.0.1:9"
