"""Credentials: API tokens, payment callback signatures and secrets generated on first use."""
