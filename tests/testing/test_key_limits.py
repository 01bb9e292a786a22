"""The stub's key limits (``cupid_exp/testing/rate_limits.py``): the continuous bucket beside the one-second windows,
on a given clock (``check(..., now=)``), so that no test depends on the machine's timing."""

from __future__ import annotations

import pytest

from cupid_exp.testing.rate_limits import KeyLimits
from cupid_exp.testing.stub_config import stub_arguments
from cupid_exp.testing.stub_llm_server import StubServer

T0 = 1000.0  # a whole second: where the windows turn


def _body(model: str = "gpt-4o-2024-08-06", prompt_chars: int = 4, max_tokens: int = 0) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "x" * prompt_chars}], "max_tokens": max_tokens}


def _admitted(limits: KeyLimits, times: list[float], **body: object) -> list[float]:
    return [t for t in times if limits.check(_body(**body), now=T0 + t) is None]


def test_a_continuous_bucket_admits_a_seconds_burst_then_one_request_per_refill() -> None:
    """300 RPM: full at the start (5 at once), then one request each fifth of a second; a refused one is told to
    come back when one request is there, and when the bucket will be full."""
    limits = KeyLimits(rpm=300, pool="key", bucket="continuous")
    assert _admitted(limits, [0.0] * 5) == [0.0] * 5
    refused = limits.check(_body(model="gpt-4o-2024-11-20"), now=T0 + 0.1)  # the other snapshot: the same pool
    assert refused is not None and refused.status == 429
    assert refused.headers["retry-after-ms"] == "100"  # half a request refilled: the other half in 0.1 s
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"] == "900ms"  # 4.5 requests short of full
    assert refused.headers["x-ratelimit-limit-requests"] == "300"
    assert "Please try again in 100ms" in refused.body["error"]["message"]
    assert _admitted(limits, [0.2, 0.3, 0.4, 0.5, 0.6]) == [0.2, 0.4, 0.6]
    assert limits.stated(_body(), now=T0 + 0.7) == {"x-ratelimit-limit-requests": "300",
                                                   "x-ratelimit-remaining-requests": "0",
                                                   "x-ratelimit-reset-requests": "900ms"}
    assert limits.stated(_body(), now=T0 + 5.0)["x-ratelimit-remaining-requests"] == "5"  # full, no more


def test_sends_every_tenth_of_a_second_get_nine_in_the_bucket_and_five_in_a_window() -> None:
    """The refill is continuous: from a full bucket of 5, ten sends 0.1 s apart are refused only at the tenth
    (5 + 4.5 refilled); the one-second windows (the default) admit 5 and refuse the rest until the next second."""
    tenths = [i / 10 for i in range(10)]
    assert len(_admitted(KeyLimits(rpm=300, bucket="continuous"), tenths)) == 9
    windows = KeyLimits(rpm=300)
    assert _admitted(windows, tenths) == tenths[:5]
    refused = windows.check(_body(), now=T0 + 0.5)
    assert refused is not None and refused.headers["retry-after-ms"] == "500"  # until the next window


def test_a_token_bucket_holds_a_seconds_tokens_and_a_larger_request_waits_for_a_full_one() -> None:
    """6,000 TPM: a bucket of 100 tokens (prompt characters / 4 + max_tokens). A request is admitted when the
    bucket holds its cost; one larger than the bucket, when it is full (not refused for ever), and the tokens it
    spends beyond are owed by the next requests."""
    limits = KeyLimits(tpm=6000, bucket="continuous")
    assert limits.check(_body(prompt_chars=40, max_tokens=50), now=T0) is None  # 60 tokens: 40 left
    refused = limits.check(_body(prompt_chars=40, max_tokens=50), now=T0)
    assert refused is not None and refused.body["error"]["type"] == "tokens"
    assert refused.headers["retry-after-ms"] == "200"  # 20 tokens short, 100 a second
    assert refused.headers["x-ratelimit-remaining-tokens"] == "40"
    assert refused.headers["x-ratelimit-reset-tokens"] == "600ms"
    assert limits.check(_body(prompt_chars=40, max_tokens=50), now=T0 + 0.2) is None
    assert limits.check(_body(prompt_chars=4, max_tokens=249), now=T0 + 0.2) is not None  # 250: wants a full one
    assert limits.check(_body(prompt_chars=4, max_tokens=249), now=T0 + 1.2) is None  # full: admitted, 150 owed
    owed = limits.check(_body(prompt_chars=4, max_tokens=9), now=T0 + 1.2)
    assert owed is not None and owed.headers["retry-after-ms"] == "1600"  # 150 owed + 10 asked


def test_the_stub_command_line_and_server_take_the_bucket() -> None:
    _, config = stub_arguments(["--rpm", "300", "--bucket", "continuous"], "")
    with StubServer(config) as stub:
        assert _admitted(stub.limits, [0.0] * 6) == [0.0] * 5
        refused = stub.limits.check(_body(), now=T0)
        assert refused is not None and refused.headers["retry-after-ms"] == "200"
    with pytest.raises(ValueError, match="bucket"):
        KeyLimits(rpm=300, bucket="leaky")
