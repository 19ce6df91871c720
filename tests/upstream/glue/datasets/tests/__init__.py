# Glue written for sharedfs's tests/upstream/run.py: the datasets sdist ships tests/test_*.py
# only, and they import ``from .utils`` as the package ``tests``.
