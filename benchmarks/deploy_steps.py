"""The documented first deploy, read from docs/operations/deploy.md: the commands of its
Kubernetes step "The migration, then the rest" (``kubectl delete job``, ``kubectl apply -k DIR
-l SELECTOR``, ``kubectl rollout status``, ``kubectl wait``) and the database URL its step
"Secrets first" writes. ``benchmarks.hosts`` follows these commands in order on its hosts, so
the rehearsal runs the sequence as written: a changed step in deploy.md changes the rehearsal.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from benchmarks.manifests import COMPONENT, ROOT

DEPLOY_MD = ROOT / "docs" / "operations" / "deploy.md"
_STEP = re.compile(r"\*\*The migration, then the rest\.\*\*.*?```sh\n(.*?)```", re.S)
_DATABASE_URL = re.compile(r"printf %s '([^']+)' > database-url")


@dataclass(frozen=True, slots=True)
class Command:
    """One documented kubectl command."""

    line: str  # as deploy.md writes it
    verb: str  # delete, apply, rollout, wait
    target: str = ""  # apply: the kustomize directory; rollout/wait: kind/name
    selector: str | None = None  # apply: -l


def documented_sequence(text: str | None = None) -> list[Command]:
    """The commands of deploy.md's step "The migration, then the rest", in order."""
    text = DEPLOY_MD.read_text() if text is None else text
    block = _STEP.search(text)
    if block is None:
        raise ValueError(f"{DEPLOY_MD}: no step 'The migration, then the rest' with commands")
    found = []
    for line in block.group(1).splitlines():
        words = shlex.split(line)
        if not words or words[0] != "kubectl":
            continue
        verb = words[1]
        if verb == "apply":
            target = words[words.index("-k") + 1]
            selector = words[words.index("-l") + 1] if "-l" in words else None
            found.append(Command(line, verb, target, selector))
        elif verb in ("rollout", "wait"):
            found.append(Command(line, verb, words[-1]))
        else:
            found.append(Command(line, verb, words[3] if len(words) > 3 else ""))
    return found


def documented_database_url(text: str | None = None) -> str:
    """The database URL deploy.md writes into the Secret (its host is PgBouncer's Service)."""
    text = DEPLOY_MD.read_text() if text is None else text
    found = _DATABASE_URL.search(text)
    if found is None:
        raise ValueError(f"{DEPLOY_MD}: no database-url written")
    return found.group(1)


def as_documented(url: str, *, text: str | None = None) -> str:
    """``url`` (a host's own server, user and database) with the documented URL's query: what
    the documented URL says of the connection (through a transaction pooler)."""
    query = dict(make_url(documented_database_url(text)).query)
    return make_url(url).update_query_dict(query).render_as_string(hide_password=False)


_TERM = re.compile(
    r"\s*([\w./-]+)\s*(?:(!=|==|=)\s*([\w.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*(?:,|$)"
)


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Does the label selector (``a=b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``,
    comma-joined) choose an object with ``labels``, as kubectl reads it?"""
    position = 0
    while position < len(selector):
        term = _TERM.match(selector, position)
        if term is None or term.end() == position:
            raise ValueError(f"not a label selector kubectl reads: {selector!r}")
        key, op, value, set_op, values = term.groups()
        position = term.end()
        if op in ("=", "=="):
            chosen = labels.get(key) == value
        elif op == "!=":
            chosen = labels.get(key) != value
        elif set_op is not None:
            within = labels.get(key) in {v.strip() for v in values.split(",")}
            chosen = within if set_op == "in" else not within
        else:
            chosen = key in labels
        if not chosen:
            return False
    return True


def selected_components(documents: list[dict[str, Any]], selector: str | None) -> list[str]:
    """The components of the Deployments and Jobs an apply with ``selector`` takes, in the
    order rendered."""
    found = []
    for doc in documents:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        labels = doc["metadata"].get("labels") or {}
        if selector is None or selects(selector, labels):
            component = labels[COMPONENT]
            if component not in found:
                found.append(component)
    return found


def workload_component(documents: list[dict[str, Any]], kind_name: str) -> str:
    """The component of ``deployment/NAME`` or ``job/NAME``."""
    kind, _, name = kind_name.partition("/")
    for doc in documents:
        if doc["kind"].lower() == kind.lower() and doc["metadata"]["name"] == name:
            return str(doc["metadata"]["labels"][COMPONENT])
    raise ValueError(f"deploy.md names {kind_name}, which the manifests do not declare")


def kustomize_dir(command: Command) -> Path:
    return ROOT / command.target
