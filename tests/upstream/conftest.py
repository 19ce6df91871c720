# tests/upstream/ is not part of sharedfs's own pytest run: run.py runs the frameworks' suites,
# and glue/ holds their conftest/utils glue (a `tests` package each), which must never be
# imported here.  CI calls `python tests/upstream/run.py` directly.
collect_ignore = ["glue", "run.py"]
