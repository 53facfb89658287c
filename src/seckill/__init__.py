"""seckill: a flash-sale backend. Purchases are decided by one atomic Redis script each."""

__version__ = "0.1.0"
