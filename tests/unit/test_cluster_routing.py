"""Routing on a Redis Cluster, without a cluster: which key a command goes by, where a node's
URL points, and what a buyer is answered when a slot cannot answer."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import ClusterDownError, MovedError, SlotNotCoveredError, TryAgainError

from seckill.api.errors import answer_for
from seckill.engine.cluster import node_url, routing_key


def test_a_script_goes_by_its_first_key_and_a_plain_command_by_its_first_argument() -> None:
    assert routing_key(("EVALSHA", "ab12", 2, "seckill:{item:7}", "other", "arg")) == (
        "seckill:{item:7}"
    )
    assert routing_key(("GET", "seckill:{item:8}:idem:1:a:k")) == "seckill:{item:8}:idem:1:a:k"
    with pytest.raises(ValueError, match="no key"):
        routing_key(("EVALSHA", "ab12", 0, "arg"))


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ("redis://127.0.0.1:7000", "redis://10.0.0.2:7003"),
        ("redis://user:secret@127.0.0.1:7000/0?socket_timeout=2",
         "redis://user:secret@10.0.0.2:7003?socket_timeout=2"),
        ("rediss://:pw@seed.example:6380", "rediss://:pw@10.0.0.2:7003"),
    ],
)  # fmt: skip
def test_a_node_url_keeps_the_seeds_scheme_credentials_and_options(
    seed: str, expected: str
) -> None:
    assert node_url(seed, ClusterNode("10.0.0.2", 7003)) == expected


@pytest.mark.parametrize(
    "error",
    [
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        MovedError("3999 127.0.0.1:7001"),
        SlotNotCoveredError('Slot "12" is not covered by the cluster.'),
    ],
)
def test_a_slot_that_cannot_answer_is_a_503_with_retry_after(error: Exception) -> None:
    answer = answer_for(error)
    assert answer is not None
    assert (answer.status, answer.code) == (503, "redis_unavailable")
    assert answer.headers == {"Retry-After": "1"}
