"""Benchmarks: run each as a module from the project's root, e.g. ``python -m benchmarks.http``
(``make bench-http``). As modules, not scripts: a script's directory goes first on sys.path,
where ``http.py`` would stand in for the standard library's ``http`` in every benchmark."""
