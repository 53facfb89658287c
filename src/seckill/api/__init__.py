"""The HTTP API: a FastAPI app whose routes parse, call one service, and return a schema."""
