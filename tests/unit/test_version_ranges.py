"""One version range per framework: the shim's, which the demo's install hint and the demo extra repeat.

The shim's ``supported`` is the source (``sharedfs status`` shows it and the version gate applies
it); the demo's install hint (sharedfs.demo.scenarios.DISTRIBUTIONS) and pyproject.toml's
``demo`` extra must say the same.  Before, wids read ``>=0.2,<0.3`` in ``status`` on a machine
without wids (webdataset 0.2's range), ``wids>=0.1,<0.2`` in the demo's hint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sharedfs.demo.scenarios import DISTRIBUTIONS
from sharedfs.startup import activation

ROOT = Path(__file__).resolve().parents[2]


def _demo_extra() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the bare 3.9 venv
        import tomli as tomllib
    return list(tomllib.loads(text)["project"]["optional-dependencies"]["demo"])


@pytest.mark.parametrize(("name", "module"), [("datasets", "datasets"), ("webdataset", "webdataset"),
                                              ("wids", "wids"), ("transformers", "transformers"),
                                              ("modelscope", "modelscope_hub"), ("megatron", "megatron"),
                                              ("tvm_ffi", "tvm_ffi")])
def test_the_demo_hint_and_extra_repeat_the_shims_range(name: str, module: str) -> None:
    """``module``: what the demo's scenario imports, keying its install hint."""
    shim = activation.shim_states()[name].shim
    if name == "wids":  # its own distribution's range, whatever provides `wids` here
        from sharedfs.shims.wids import SUPPORTED

        distribution, supported = "wids", SUPPORTED["wids"]
    else:
        distribution, supported = shim.distribution, shim.supported
    assert DISTRIBUTIONS[module] == f"{distribution}{supported}"
    assert f"{distribution}{supported}" in _demo_extra()
