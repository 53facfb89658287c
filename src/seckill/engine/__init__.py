"""The Redis engine: every purchase decided by one atomic Lua script."""
