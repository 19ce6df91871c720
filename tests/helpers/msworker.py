"""One ModelScope user: downloads a file into a hub cache through ``modelscope_hub``'s own download path.

The program lives in :mod:`sharedfs.demo.scenario_modelscope` (``sharedfs demo`` runs it too, from an
installed wheel, which does not ship tests/helpers); this path keeps the tests' command line.  The stock
side may run in a venv without sharedfs (filelock 3.23.0): the module needs only the standard library,
so it is then loaded from its file.
"""

import importlib.util
from pathlib import Path

try:
    from sharedfs.demo.scenario_modelscope import main
except ModuleNotFoundError:
    _file = Path(__file__).resolve().parents[2] / "sharedfs" / "demo" / "scenario_modelscope.py"
    _spec = importlib.util.spec_from_file_location("scenario_modelscope", _file)
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    main = _module.main

if __name__ == "__main__":
    main()
