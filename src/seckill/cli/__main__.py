"""``python -m seckill.cli``: the same command as ``seckill``."""

from seckill.cli import app

if __name__ == "__main__":  # importing the module (walking the package) runs nothing
    app()
