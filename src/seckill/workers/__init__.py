"""Background workers: each a class with ``run_once()``, driven by one shared loop."""
