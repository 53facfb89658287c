"""``seckill config``: the settings as this process reads them (``check``), and their reference
page (``docs``): every setting, its variable, default and meaning, shown with keys and passwords
masked."""

from __future__ import annotations

import typer

from seckill.cli.common import console, current_settings

commands = typer.Typer(help="The settings.", no_args_is_help=True)


@commands.command("check")
def config_check() -> None:
    """Print the effective settings (keys and passwords masked) and what keeps them from
    running under their profile: exit 0 when nothing does, 2 otherwise. For a deploy pipeline,
    before anything starts."""
    from seckill.bootstrap.checks import configuration_problems

    settings = current_settings()
    for name in type(settings).model_fields:
        shown = masked(name, getattr(settings, name))
        console.print(f"SECKILL_{name.upper()}={shown}", markup=False, highlight=False)
    problems = configuration_problems(settings)
    if problems:
        for problem in problems:
            console.print(f"[red]problem:[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    console.print(f"[green]ok:[/] the {settings.profile} profile can start", highlight=False)


@commands.command("docs")
def config_docs() -> None:
    """Print the configuration reference (docs/operations/configuration.md): every setting,
    its variable, default and meaning."""
    typer.echo(settings_reference(), nl=False)


def masked(name: str, value: object) -> str:
    """A setting's value as `seckill config check` shows it: keys hidden, every URL's
    credentials hidden (``mask_url``, the rule every URL shown follows), the rest as is."""
    from seckill.config import SECRET_SETTINGS
    from seckill.domain.masking import mask_url

    if not value:
        return str(value)
    if name.endswith("_url"):
        return mask_url(str(value))
    if name not in SECRET_SETTINGS:
        return str(value)
    keys = str(value).split(",")
    return ",".join("***" for _ in keys)


REFERENCE_INTRO = """\
# Configuration

One typed `Settings` (`seckill/config.py`), read from `SECKILL_*` environment variables or a
`.env` file. This page is generated from it (`seckill config docs`); a test fails when it is
stale. What the durability settings trade: [durability](durability.md); the cluster:
[Redis Cluster](redis-cluster.md); the waiting room: [waiting room](waiting-room.md); the
bridge: [order events to brokers](bridge.md). Each secret setting (the Redis, database and
bridge URLs, which may hold a password, and the keys) may instead be read from a file:
`SECKILL_<NAME>_FILE=/run/secrets/<name>`. Running on many hosts: [production](production.md);
TLS to Redis and to SQL: [TLS](tls.md). Rotating the keys without refusing anyone:
[keys](keys.md).
"""


def settings_reference() -> str:
    """Every setting as a Markdown table (variable, default, meaning), after an introduction:
    the configuration page of the docs, from the one place each setting is described."""
    from seckill.config import Settings

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = (
            "unset" if default is None
            else "empty" if default == ""
            else f"`{str(default).lower()}`" if isinstance(default, bool)
            else f"`{default}`"
        )  # fmt: skip
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| `SECKILL_{name.upper()}` | {shown} | {meaning} |")
    return REFERENCE_INTRO + "\n" + "\n".join(rows) + "\n"
