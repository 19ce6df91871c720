"""The documentation: the site builds with warnings as errors, and says what the code does.

* ``mkdocs build --strict`` (a broken link, a missing anchor, a page left out of nav fail it);
* the docs toolchain is pinned in one place (docs/requirements.txt) and the extras agree with it;
* nothing cites a document users cannot open, or a path of the machine that built it;
* every public API name has its section, every setting its row, and the docs' Slurm recipe is
  the README's (which tests/integration/test_slurm_recipe.py runs).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: Documents users cannot open, and paths of the machine that built the project.
UNREACHABLE = re.compile(r"failures\.md|DESIGN\.md|harness\.md|seed \d{3}|/work/|/root/|shared/research")


def _require_docs_toolchain() -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError as exc:
        import importlib.util

        reason = f"the docs toolchain is not installed ({exc}): pip install -r docs/requirements.txt"
        if importlib.util.find_spec("mfusepy") is None:
            # A bare kernel venv (CI's extra Python versions install sharedfs and pytest only).
            pytest.skip(reason)
        # The [test] extra brings mfusepy and the docs toolchain together: one without the other
        # is a broken setup, which CI must not pass over.
        from harness.skips import skip_or_fail

        skip_or_fail(reason)


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    _require_docs_toolchain()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], check=False, capture_output=True, text=True,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, proc.stderr
    for page in ("troubleshooting", "errors", "cli", "settings", "api", "slurm", "architecture", "security",
                 "frameworks/datasets", "frameworks/torch"):
        assert (tmp_path / "site" / page / "index.html").exists(), page
    assert (tmp_path / "site" / "index.html").exists()


def _toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.9/3.10 (tomli is a dependency there)
        import tomli as tomllib
    return tomllib.loads(path.read_text())


def test_docs_toolchain_is_pinned_once() -> None:
    pins = [line.strip() for line in (DOCS / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert pins and all("==" in pin for pin in pins), pins
    extras = _toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]
    assert extras["docs"] == pins
    assert set(pins) <= set(extras["test"])  # the suite builds the docs, so the test env has them


def shipped_texts() -> dict[str, str]:
    """Everything a user reads: README, CHANGELOG, every docs page, the site config, the CLI's help, the demo."""
    from sharedfs.commands.cli import build_parser
    from sharedfs.demo.scenarios import SCENARIOS

    texts = {str(p.relative_to(ROOT)): p.read_text() for p in [README, ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml",
                                                                  *sorted(DOCS.rglob("*.md"))]}
    parser = build_parser()
    texts["sharedfs --help"] = parser.format_help()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, command in sub.choices.items():
        texts[f"sharedfs {name} --help"] = command.format_help()
    texts["demo scenarios"] = "\n".join(f"{s.name} [{s.field_report}] {s.story}" for s in SCENARIOS)
    return texts


@pytest.mark.parametrize("name", sorted(shipped_texts()))
def test_nothing_cites_what_users_cannot_open(name: str) -> None:
    found = UNREACHABLE.search(shipped_texts()[name])
    assert found is None, f"{name} cites {found.group(0)!r}: cite a public thread or the project's docs instead"


def test_every_public_api_name_has_its_section() -> None:
    import sharedfs

    page = (DOCS / "api.md").read_text()
    missing = [name for name in sharedfs.__all__ if f"### `{name}`" not in page]
    assert missing == [], f"docs/api.md has no section for {missing}"


def test_every_setting_has_its_row_with_its_default() -> None:
    from sharedfs.model.settings import SETTINGS

    readme_table = README.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    docs_page = (DOCS / "settings.md").read_text()
    for setting in SETTINGS:
        for where, text in (("README", readme_table), ("docs/settings.md", docs_page)):
            row = next((line for line in text.splitlines() if line.startswith(f"| `{setting.env}` |")), None)
            assert row is not None, f"{where} has no row for {setting.env}"
            default = setting.default
            if isinstance(default, float) and default.is_integer():
                default = int(default)
            if default not in (None, (), False):
                assert f"`{default}`" in row, f"{where}: {setting.env}'s default {default!r} is not in {row}"


def _fenced(text: str, marker: str) -> str:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_docs_slurm_recipe_is_the_readmes() -> None:
    marker = "# sharedfs-recipe: slurm-batch"
    assert _fenced((DOCS / "slurm.md").read_text(), marker) == _fenced(README.read_text(), marker)


def test_readme_links_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text()):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
