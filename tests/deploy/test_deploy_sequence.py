"""The first deploy as deploy.md writes it, read as the hosts rehearsal reads it
(``benchmarks.deploy_steps``): PgBouncer is applied with the migration, which reaches SQL
through it, and waited for before the Job; the rest follows; the URL's parameters say the
connection goes through a transaction pooler."""

from __future__ import annotations

import pytest

from benchmarks.deploy_steps import (
    as_documented,
    documented_sequence,
    selected_components,
    selects,
    workload_component,
)
from benchmarks.manifests import render
from seckill.store.database import through_transaction_pooler
from tests.deploy.test_manifests import selects as kubectl_selects


def test_the_rehearsal_reads_deploy_md_s_first_deploy() -> None:
    documents = render()
    sequence = documented_sequence()
    assert [c.verb for c in sequence] == ["delete", "apply", "rollout", "wait", "apply", "rollout"]
    first, second = (c for c in sequence if c.verb == "apply")
    assert selected_components(documents, first.selector) == ["pooler", "migration"]
    assert "migration" not in selected_components(documents, second.selector)
    assert {"api", "persister", "pooler"} <= set(selected_components(documents, second.selector))
    waited = [workload_component(documents, c.target) for c in sequence if c.verb != "delete"
              and c.verb != "apply"]  # fmt: skip
    assert waited == ["pooler", "migration", "api"]


def test_a_migration_step_without_pgbouncer_would_be_seen() -> None:
    text = (
        "**The migration, then the rest.** x\n```sh\n"
        "kubectl apply -k deploy/k8s/overlays/production -l 'app.kubernetes.io/component in "
        "(config,migration)'\nkubectl wait --for=condition=complete job/seckill-db-upgrade\n```\n"
    )
    (apply, wait) = documented_sequence(text)
    assert selected_components(render(), apply.selector) == ["migration"]
    assert wait.target == "job/seckill-db-upgrade"


@pytest.mark.parametrize(
    "selector",
    [
        "app.kubernetes.io/component in (config,pooler,migration)",
        "app.kubernetes.io/component!=migration",
        "app.kubernetes.io/component=config",
        "app.kubernetes.io/component notin (api)",
        "app.kubernetes.io/name=seckill,app.kubernetes.io/component!=api",
    ],
)
def test_selectors_read_as_the_manifest_tests_read_them(selector: str) -> None:
    for component in ("config", "pooler", "migration", "api", "persister"):
        labels = {"app.kubernetes.io/name": "seckill", "app.kubernetes.io/component": component}
        assert selects(selector, labels) == kubectl_selects(selector, labels), (selector, labels)


def test_the_documented_url_says_it_goes_through_a_transaction_pooler() -> None:
    url = as_documented("postgresql+asyncpg://postgres@10.0.0.25:6432/seckill")
    assert through_transaction_pooler(url)
    assert not through_transaction_pooler("postgresql+asyncpg://postgres@10.0.0.20:5432/seckill")
