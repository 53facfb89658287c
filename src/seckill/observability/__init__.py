"""What an operator sees: Prometheus metrics, structured logs with a request id, the dashboard."""
