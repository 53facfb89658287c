"""What an operator sees: Prometheus metric definitions, structured logs with a request id."""
