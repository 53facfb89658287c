"""The composition root: everything a process runs is built here from ``Settings``, once.

``runtime.py`` connects the stores (Redis, or the embedded one; the SQL pools) and builds the
engine; ``services.py`` builds what the API's routes and the commands work with; ``workers.py``
builds each background worker. Entry points (``api/``, ``cli/``, ``serve.py``) take what they
need from here; nothing below builds from settings itself.
"""
