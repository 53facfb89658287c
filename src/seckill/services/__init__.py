"""What the API does, as plain async functions and classes: no framework types, so any server
(a FastAPI route, a lean ASGI route, a CLI, a benchmark) can call them."""
