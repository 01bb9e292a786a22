"""The stub's own measurements, which the benches read: requests in flight over time, and the HTTP/1.0 server kind."""

from __future__ import annotations

import http.client
import json

from cupid_exp.testing import stub_llm_server
from cupid_exp.testing.stub_llm_server import StubServer, _Counters


def test_the_mean_in_flight_weighs_each_count_by_how_long_it_held(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(stub_llm_server.time, "monotonic", lambda: now[0])
    counters = _Counters()
    for at, change in ((10.0, "arrived"), (11.0, "arrived"), (12.0, "departed"), (14.0, "departed")):
        now[0] = at
        counters.flight.change(1 if change == "arrived" else -1)
    # 1 in flight for 1 s, 2 for 1 s, 1 for 2 s: 5 request-seconds over the 4 s from first arrival to last answer
    assert counters.flight.mean() == 1.25 and counters.flight.now == 0 and counters.flight.peak == 2


def _two_requests_on_one_connection(stub: StubServer) -> list[tuple[int, bool]]:
    host, port = stub.url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    seen = []
    body = json.dumps({"model": "stub", "messages": [{"role": "user", "content": "Say hello."}]})
    for _ in range(2):
        connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["choices"]
        seen.append((response.version, response.will_close))
    connection.close()
    return seen


def test_the_stub_answers_as_an_http_10_server_when_asked() -> None:
    """``close_connections``: each reply closes its connection (the client opens one per request), as the issue's
    second server kind does; by default connections are kept alive."""
    with StubServer(close_connections=True) as stub:
        assert _two_requests_on_one_connection(stub) == [(10, True), (10, True)]  # the 2nd on a new connection
        assert stub.stats()["total_received"] == 2
    with StubServer() as stub:
        assert _two_requests_on_one_connection(stub) == [(11, False), (11, False)]
