# Glue written for sharedfs's tests/upstream/run.py: the huggingface_hub sdist ships tests/test_*.py
# and tests/testing_*.py but no tests/__init__.py, and the tests import ``from .testing_utils``.
