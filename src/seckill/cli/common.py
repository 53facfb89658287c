"""What every command shares: the settings (read once per process), the console, how a
command fails, and how it runs a piece of async work against the wired runtime."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime
    from seckill.config import Settings

console = Console()
T = TypeVar("T")


@functools.cache  # one invocation per process: read once, on first use
def current_settings() -> Settings:
    """The settings; a value that does not parse, or a secret file that cannot be read, ends
    the command with exit 2 and what is wrong."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from seckill.config import Settings
    from seckill.domain.configuration import ConfigurationError

    try:
        return Settings()
    except ConfigurationError as exc:
        abort(exc)
    except ValidationError as exc:
        abort(_settings_errors(exc))
    except SettingsError as exc:
        abort(_unparsed(exc))


@functools.cache
def checked_settings(*, tokens: bool = True) -> Settings:
    """The settings, once every check of them passed (``configuration_problems``, the list
    `seckill config check` prints): else the command ends with exit 2 and what is wrong, one
    line per problem, before it creates or connects anything. Without ``tokens`` (a command
    that checks none) the key set of SECKILL_JWT_JWKS_URL is not fetched."""
    from seckill.bootstrap.checks import cannot_start, configuration_problems

    settings = current_settings()
    problems = configuration_problems(settings, fetch_key_set=tokens)
    if problems:
        abort(cannot_start(settings, problems))
    return settings


def _unparsed(exc: Exception) -> str:
    """pydantic-settings' refusal of a list or mapping setting that is not JSON, which names
    the field but not the variable, nor what was expected."""
    import re

    from seckill.domain.configuration import ENV_PREFIX

    found = re.search(r'field "(\w+)"', str(exc))
    if found is None:
        return f"invalid settings: {exc}"
    variable = f"{ENV_PREFIX}{found.group(1).upper()}"
    return f'invalid settings: {variable} is not JSON (a list is written ["a", "b"], empty [])'


def _settings_errors(exc: Any) -> str:
    from seckill.domain.configuration import ENV_PREFIX

    lines = [
        f"{ENV_PREFIX}{'_'.join(map(str, error['loc'])).upper()}: {error['msg']}"
        for error in exc.errors()
    ]
    return "invalid settings: " + "; ".join(lines)


def setting_default(name: str) -> str:
    """For a flag's help: the setting that decides it when the flag is left out, and its
    default (one home for both: the Settings field)."""
    from seckill.config import Settings

    return f"default SECKILL_{name.upper()}, {Settings.model_fields[name].default}"


def overridden(settings: Settings, **flags: object) -> Settings:
    """The settings, with each flag that was given (not None) in place of its setting."""
    return settings.model_copy(update={k: v for k, v in flags.items() if v is not None})


def start_process(*, processes: int = 1) -> Settings:
    """Set up a server or worker process once: its settings checked (``checked_settings``),
    its logs, Redis waited for (``_wait_for_redis``), then its metrics directory.

    With SECKILL_METRICS_DIR, this process writes its metrics into files there, which every
    process of the deployment shares. prometheus_client picks its mode when first imported, so
    this runs before anything imports it (seckill.serve and the workers do).
    """
    from seckill.observability.logs import configure_logging

    settings = checked_settings()  # before anything starts: nothing half-running
    configure_logging(settings.log_format, settings.log_level)
    _wait_for_redis(settings)  # before anything is made (its import leaves out prometheus)
    path = settings.metrics_dir
    if path is None and processes > 1:
        # The API's own processes still add up: a directory of its own, emptied at start.
        path = settings.data_dir / "metrics"
        shutil.rmtree(path, ignore_errors=True)
    if path is not None:
        if "prometheus_client" in sys.modules:
            raise RuntimeError(
                "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set"
            )
        path.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path.resolve())
    return settings


def _wait_for_redis(settings: Settings) -> None:
    """A server or worker started while Redis does not answer waits for it a few seconds
    (SECKILL_REDIS_START_WAIT_SECONDS), then stops in one line: checked once here, before any
    process is forked, so no supervisor respawns workers that cannot start."""
    from seckill.bootstrap.startup import RedisUnavailable, wait_for_redis

    try:
        asyncio.run(wait_for_redis(settings))
    except RedisUnavailable as exc:
        abort(exc)


def abort(message: object, code: int = 2) -> NoReturn:
    console.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def with_runtime(work: Callable[[Runtime], Awaitable[T]]) -> T:
    """Run ``work`` with everything wired from the settings. A refusal, a schema that is not
    current (see ``prepare_schema``) and a server that does not answer are each a clear error,
    exit 2."""
    from seckill.bootstrap.runtime import open_runtime
    from seckill.domain.configuration import ConfigurationError
    from seckill.domain.masking import mask_in
    from seckill.domain.outcomes import InvalidRequest
    from seckill.engine.cluster import REDIS_UNAVAILABLE
    from seckill.services.items import UnknownItem
    from seckill.store.migrate import NewerSchema

    settings = checked_settings(tokens=False)

    async def main() -> T:
        async with open_runtime(settings) as runtime:
            return await work(runtime)

    try:
        return asyncio.run(main())
    except (InvalidRequest, UnknownItem, ConfigurationError, NewerSchema) as exc:
        abort(exc)
    except REDIS_UNAVAILABLE as exc:
        abort(f"Redis did not answer: {mask_in(str(exc), settings.redis_url)}")
    except Exception as exc:
        trouble = database_trouble(exc)
        if trouble is None:
            raise
        abort(trouble)


def database_trouble(exc: BaseException) -> str | None:
    """The one line a command ends with when SQL failed it for a reason of the deployment's (a
    TLS handshake refused, a server that does not answer), None for anything else (a bug: its
    traceback is wanted)."""
    from sqlalchemy.exc import DBAPIError

    from seckill.bootstrap.tls import database_tls_refusal
    from seckill.domain.masking import mask_in
    from seckill.store.database import is_transient

    refusal = database_tls_refusal(exc)
    if refusal:
        return refusal
    if not is_transient(exc):
        return None
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    url = current_settings().database_url
    return f"the database did not answer: {mask_in(str(cause) or type(cause).__name__, url)}"
