"""``python -m seckill.cli``: the same command as ``seckill``."""

from seckill.cli import app

app()
