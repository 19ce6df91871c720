"""``sharedfs demo``: reproduce the field failures on this machine, then run them again with sharedfs.

It runs the scenarios of :mod:`sharedfs.demo.scenarios` and reports them (docs/cli.md, "sharedfs demo")."""

from __future__ import annotations

import html
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from sharedfs.demo.scenarios import (
    FILESYSTEMS,
    OLD_FILELOCK,
    REFERENCES,
    SCENARIOS,
    OnRealFS,
    Outcome,
    Scenario,
    ScenarioSkipped,
    Sim,
    install_command,
    missing_modules,
)
from sharedfs.model.caches import PLACED_CACHES

__all__ = ["OLD_FILELOCK", "Result", "main", "render", "render_html", "render_markdown", "run_demo"]

#: What brings every framework the demo runs (pyproject.toml's ``demo`` extra), named in skip messages: from a
#: clone, since sharedfs is not on PyPI yet (``pip install 'sharedfs[demo]'`` would find nothing).
DEMO_EXTRA = "pip install '.[demo]' in a clone of sharedfs"


@dataclass
class Result:
    name: str
    field_report: str
    without: Outcome | None = None
    with_sharedfs: Outcome | None = None
    skipped: str | None = None
    #: The command that installs what a skipped scenario misses (``None``: nothing to install).
    install: str | None = None
    #: The scenario itself broke (a bug or a broken machine): it ran, and is not counted as fixed.
    error: str | None = None
    seconds: float = 0.0
    story: str = ""
    #: The framework release that fixed this failure itself ("torch 2.14"), when the installed one has it.
    upstream_fix: str = ""
    #: The filesystem it ran on (:data:`FILESYSTEMS`), and the cause of the failure as the run observed it.
    fs: str = "hostilefs"
    cause: str = ""
    #: Set when a real filesystem did not show the failure: why, as the run observed it.
    not_reproduced: str = ""

    @property
    def fixed(self) -> bool:
        """Reproduced without sharedfs, and gone with it."""
        return bool(self.without and self.with_sharedfs and self.without.failed and not self.with_sharedfs.failed)

    @property
    def fixed_upstream(self) -> bool:
        """The installed release fixed it (the program succeeded without sharedfs too), and sharedfs kept it so."""
        return bool(self.upstream_fix and self.without and self.with_sharedfs and not self.without.failed
                    and not self.with_sharedfs.failed)

    @property
    def ok(self) -> bool:
        """Fixed, fixed upstream, or a real filesystem without the failure where sharedfs did not fail either."""
        not_here = bool(self.not_reproduced and self.with_sharedfs and not self.with_sharedfs.failed)
        return self.fixed or self.fixed_upstream or not_here

    @property
    def not_run(self) -> bool:
        """Not a behaviour of the real filesystem chosen: listed with why, not run."""
        return bool(self.skipped and self.skipped.startswith("not run on "))

    @property
    def ran(self) -> bool:
        return self.skipped is None

    @property
    def verdict(self) -> str:
        if self.not_run:
            return f"not run on {self.fs}"
        if self.skipped:
            return "skipped"
        if self.fixed:
            return "fixed"
        if self.fixed_upstream:
            return f"fixed upstream in {self.upstream_fix} (sharedfs keeps older releases safe)"
        if self.ok:
            return f"not reproduced on {self.fs}"
        return "NOT FIXED"


class Progress:
    """``[k/n] scenario ... 3.1 s (total 14.0 s)``: a live line on a terminal, plain lines when piped."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._current: tuple[int, str, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            print(text, file=self.stream, flush=True)
            self._draw()

    def begin(self, index: int, name: str) -> None:
        with self._lock:
            self._current = (index, name, time.monotonic())
            self._draw()
        if self.tty and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="sharedfs-demo-progress", daemon=True)
            self._ticker.start()

    def end(self, index: int, result: Result) -> None:
        extra = f": {result.skipped}" if result.skipped else (f": {result.error}" if result.error else "")
        extra = extra.replace(f": not run on {result.fs}:", ":", 1)  # the verdict says it already
        with self._lock:
            self._current = None
            self._clear()
            print(f"[{index}/{self.total}] {result.name}: {result.verdict}{extra} ({result.seconds:.1f} s; "
                  f"{self.elapsed():.0f} s elapsed)", file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                self._clear()
                self._draw()

    def _draw(self) -> None:
        if not self.tty or self._current is None:
            return
        index, name, since = self._current
        text = f"[{index}/{self.total}] {name} ... {time.monotonic() - since:.1f} s ({self.elapsed():.0f} s elapsed)"
        self.stream.write(text[:200])
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")


def run_demo(*, use_fuse: bool | None = None, only: list[str] | None = None,
             progress: Progress | None = None, fs: str = "hostilefs") -> tuple[list[Result], str]:
    """Run the chosen scenarios; the results and a description of the simulated filesystem.

    ``fs`` other than ``hostilefs`` runs the cross-node scenarios on that real filesystem (one client
    mount per node) and lists the others as not run there, with why.
    """
    from sharedfs.demo.hostilefs import fuse_available

    chosen = [s for s in SCENARIOS if not only or any(o.lower() in s.name.lower() for o in only)]
    progress = progress or Progress(sys.stderr, len(chosen))
    progress.total = len(chosen)
    if fs != "hostilefs":
        fuse, why = True, ""
        mode = f"{fs} (real FUSE client mounts, one per node, each with its own kernel caches)"
    elif use_fuse is False:
        fuse, why = False, "--no-fuse given"
    else:
        fuse, why = fuse_available()
    if fs == "hostilefs":
        mode = "FUSE filesystems (hostilefs)" if fuse else f"LD_PRELOAD flock faults (no FUSE: {why})"
    progress.line(f"sharedfs demo: {len(chosen)} scenario(s); simulated cluster filesystem = {mode}")
    # The scenarios show each library's default cache, so a placed-cache variable (the user's, or one
    # sharedfs exported into this process) would move it off the simulated filesystem: seen on CI.
    placed = {row.variable for row in PLACED_CACHES}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHAREDFS_", "HF_", "LD_PRELOAD")) and k not in placed}
    results = []
    with tempfile.TemporaryDirectory(prefix="sharedfs-demo-") as work, ExitStack() as stack:
        env["HF_HOME"] = str(Path(work) / "hf-home")
        sim = Sim(Path(work), stack, fuse, why, base_env=env, note=progress.line, fs=fs)
        for index, scenario in enumerate(chosen, 1):
            progress.begin(index, scenario.name)
            result = run_one(scenario, sim, fuse, why)
            for outcome in (result.without, result.with_sharedfs):  # the temp dir says nothing to a reader
                if outcome is not None:
                    outcome.evidence = outcome.evidence.replace(f"{work}/", ".../")
                    outcome.cause = outcome.cause.replace(f"{work}/", ".../")
            result.cause = result.cause.replace(f"{work}/", ".../")
            result.not_reproduced = result.not_reproduced.replace(f"{work}/", ".../")
            progress.end(index, result)
            results.append(result)
    progress.close()
    return results, mode


def run_one(scenario: Scenario, sim: Sim, fuse: bool, why_not_fuse: str) -> Result:
    result = Result(scenario.name, scenario.field_report, story=scenario.story, upstream_fix=scenario.upstream_fix,
                    fs=sim.fs)
    started = time.monotonic()
    missing = missing_modules(scenario.needs)
    plan = scenario.on(sim.fs) if sim.real else None
    sim.plan = plan if isinstance(plan, OnRealFS) else None
    if isinstance(plan, str):
        result.skipped = f"not run on {sim.fs}: {plan}"
    elif missing:
        result.skipped = f"needs {', '.join(missing)}, not installed"
        result.install = f"{install_command(missing)}  (or everything the demo uses: {DEMO_EXTRA})"
    elif scenario.needs_fuse and not fuse:
        result.skipped = f"needs FUSE to simulate a second node's view of the filesystem ({why_not_fuse})"
        if "mfusepy" in why_not_fuse:
            result.install = install_command(["mfusepy"])
    else:
        try:
            result.without, result.with_sharedfs = scenario.run(sim)
            result.cause = result.without.cause
            if sim.real and not result.without.failed:  # the run says why: this client does not show it
                result.not_reproduced = result.without.cause or (
                    f"not reproduced on {sim.fs}: the program succeeded without sharedfs")
        except ScenarioSkipped as exc:
            result.skipped = str(exc)
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
            result.error = f"could not run: {type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - started
    return result


# -- reports ------------------------------------------------------------------------------------


def summary(results: list[Result]) -> str:
    upstream = [r for r in results if r.ran and r.fixed_upstream]
    ran = [r for r in results if r.ran and not r.fixed_upstream]
    fixed = sum(r.fixed for r in ran)
    text = f"{fixed} of {len(ran)} field failures that ran here were reproduced and fixed"
    if upstream:
        releases = ", ".join(sorted({r.upstream_fix for r in upstream}))
        text += (f"; {len(upstream)} fixed upstream in the installed release ({releases}; sharedfs keeps older "
                 "releases safe)")
    not_here = [r for r in ran if r.not_reproduced]
    if not_here:
        text += f"; {len(not_here)} not reproduced on {not_here[0].fs} (see above for what the run showed)"
    not_run = [r for r in results if r.not_run]
    if not_run:
        text += f"; {len(not_run)} not run on {not_run[0].fs} (not its behaviour: see above)"
    skipped = [r for r in results if r.skipped and not r.not_run]
    if skipped:
        text += f"; {len(skipped)} skipped (see above for what they need)"
    return text


def render(results: list[Result], mode: str) -> str:
    real = bool(results) and results[0].fs != "hostilefs"
    lines = [f"\n{'ran on' if real else 'simulated with'}: {mode}\n"]
    for r in results:
        lines.append(f"{r.name}  [{r.field_report}]" + (f"  on {r.fs}" if r.fs != "hostilefs" else ""))
        if r.not_run:
            lines.append(f"    {r.skipped}")
            continue
        if r.skipped:
            lines.append(f"    skipped: {r.skipped}")
            if r.install:
                lines.append(f"    install: {r.install}")
            continue
        if r.error:
            lines.append(f"    ERROR: {r.error}")
            continue
        assert r.without and r.with_sharedfs
        lines.append(f"    without sharedfs: {'FAILS' if r.without.failed else 'ok   '}  {r.without.evidence}")
        lines.append(f"    with sharedfs:    {'FAILS' if r.with_sharedfs.failed else 'ok   '}  "
                     f"{r.with_sharedfs.evidence}")
        if r.cause:
            lines.append(f"    cause (observed): {r.cause}")
        if not r.fixed:
            lines.append(f"    verdict:          {r.verdict}")
    lines.append(f"\n{summary(results)}")
    return "\n".join(lines)


def as_data(results: list[Result], mode: str) -> dict[str, Any]:
    return {"mode": mode, "fs": results[0].fs if results else "hostilefs", "summary": summary(results),
            "scenarios": [{**asdict(r), "fixed": r.fixed, "fixed_upstream": r.fixed_upstream, "verdict": r.verdict}
                          for r in results]}


def machine_facts() -> dict[str, str]:
    from sharedfs import __version__
    return {
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "sharedfs": str(__version__),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "slurm job": os.environ.get("SLURM_JOB_ID", "-"),
    }


def _link(refs: str) -> str:
    parts = []
    for ref in (part.strip() for part in refs.split(",")):
        url = REFERENCES.get(ref)
        parts.append(f'<a href="{html.escape(url)}">{html.escape(ref)}</a>' if url else html.escape(ref))
    return ", ".join(parts)


def render_html(results: list[Result], mode: str, doctor: list[tuple[str, list[str]]]) -> str:
    esc = html.escape
    facts = machine_facts()
    rows = []
    for r in results:
        if r.skipped or r.error:
            why = (r.skipped or r.error or "").replace(f"not run on {r.fs}: ", "", 1)
            detail = esc(why) + (f"<br><code>{esc(r.install)}</code>" if r.install else "")
            rows.append(f"<tr class='skip'><td><b>{esc(r.name)}</b><br><small>{esc(r.story)} "
                        f"[{_link(r.field_report)}]</small></td><td colspan='2'>{r.verdict}: {detail}</td></tr>")
            continue
        assert r.without and r.with_sharedfs
        cells = []
        for outcome in (r.without, r.with_sharedfs):
            cls = "bad" if outcome.failed else "good"
            cells.append(f"<td class='{cls}'><b>{'FAILS' if outcome.failed else 'ok'}</b> {esc(outcome.evidence)}</td>")
        verdict = "" if r.fixed else f"<br><i>{esc(r.verdict)}</i>"
        verdict += f"<br><small>cause (observed): {esc(r.cause)}</small>" if r.cause else ""
        rows.append(f"<tr><td><b>{esc(r.name)}</b><br><small>{esc(r.story)} [{_link(r.field_report)}]</small>"
                    f"{verdict}</td>" + "".join(cells) + "</tr>")
    doctor_html = "".join(f"<h3><code>{esc(path)}</code></h3><pre>{esc(chr(10).join(lines))}</pre>"
                          for path, lines in doctor)
    facts_html = " &middot; ".join(f"{esc(k)}: <b>{esc(v)}</b>" for k, v in facts.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sharedfs demo on {esc(facts['host'])}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: .4em; vertical-align: top; }}
th {{ background: #f3f3f3; text-align: left; }} .bad {{ background: #fde8e8; }} .good {{ background: #e6f6e6; }}
.skip {{ color: #666; background: #f8f8f8; }} pre {{ background: #f6f6f6; padding: .6em; overflow-x: auto; }}
small {{ color: #555; }}
</style></head><body>
<h1>Cluster filesystem failures, reproduced and fixed</h1>
<p>{facts_html}</p>
<p>Each row ran real programs in separate processes on a simulated cluster filesystem ({esc(mode)}),
first without sharedfs, then with it. <b>{esc(summary(results))}.</b></p>
<table><tr><th>what</th><th>without sharedfs</th><th>with sharedfs</th></tr>
{''.join(rows)}
</table>
<h2>This cluster: <code>sharedfs doctor</code></h2>
<p>What the paths below are, what their locks really do, what sharedfs does there,
and the one setting or mount option that would make them better.</p>
{doctor_html or '<p>(no path probed: give <code>--doctor PATH</code>)</p>'}
<p><small>Made by <code>sharedfs demo --html</code>. The scenarios' programs are in
<code>sharedfs/demo/scenarios/</code>; the project's documentation explains every error above.</small></p>
</body></html>
"""


def render_markdown(results: list[Result], mode: str, doctor: list[tuple[str, list[str]]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    facts = machine_facts()
    lines = ["# Cluster filesystem failures, reproduced and fixed", "",
             " · ".join(f"{k}: **{v}**" for k, v in facts.items()), "",
             (f"Each row ran real programs in separate processes on a simulated cluster filesystem ({mode}), "
              f"first without sharedfs, then with it. **{summary(results)}.**"), "",
             "| what | without sharedfs | with sharedfs |", "| --- | --- | --- |"]
    for r in results:
        refs = ", ".join(f"[{ref}]({REFERENCES[ref]})" if ref in REFERENCES else ref
                         for ref in (p.strip() for p in r.field_report.split(",")))
        what = f"**{cell(r.name)}** ({refs})" + ("" if r.fixed or not r.ran or r.error else f" *{cell(r.verdict)}*")
        if r.skipped or r.error:
            install = f" `{r.install}`" if r.install else ""
            why = (r.skipped or r.error or "").replace(f"not run on {r.fs}: ", "", 1)
            lines.append(f"| {what} | {r.verdict}: {cell(why)}{install} | |")
            continue
        assert r.without and r.with_sharedfs
        what += f" cause (observed): {cell(r.cause)}" if r.cause else ""
        lines.append(f"| {what} | {'**FAILS**' if r.without.failed else 'ok'} {cell(r.without.evidence)} | "
                     f"{'**FAILS**' if r.with_sharedfs.failed else 'ok'} {cell(r.with_sharedfs.evidence)} |")
    lines += ["", "## This cluster: `sharedfs doctor`", ""]
    for path, doctor_text in doctor:
        lines += [f"### `{path}`", "", "```text", *doctor_text, "```", ""]
    if not doctor:
        lines.append("(no path probed: give `--doctor PATH`)")
    return "\n".join(lines) + "\n"


#: ``sharedfs doctor`` of some paths, as (path, text lines): given by the command line, which owns doctor.
DoctorSections = Callable[[list[str]], list[tuple[str, list[str]]]]


#: Names ``--fs`` also takes, for the filesystems' own spellings.
FS_ALIASES = {"gluster": "glusterfs", "hostile": "hostilefs"}


def chosen_fs(args: Any) -> tuple[str | None, str]:
    """The filesystem ``--fs`` names (``hostilefs`` when absent), or ``None`` and the one line that says why not."""
    name = (getattr(args, "fs", None) or "hostilefs").strip().lower()
    fs = FS_ALIASES.get(name, name)
    if fs not in FILESYSTEMS:
        return None, (f"sharedfs demo: --fs {getattr(args, 'fs', '')!r} is not a filesystem the demo knows; "
                      f"use one of {', '.join(FILESYSTEMS)}")
    if fs != "hostilefs" and getattr(args, "no_fuse", False):
        return None, f"sharedfs demo: --fs {fs} runs on FUSE client mounts; drop --no-fuse"
    if fs != "hostilefs":
        from sharedfs.demo.realfs import unavailable

        reason = unavailable(fs)
        if reason:
            return None, f"sharedfs demo: {fs} cannot run here: {reason}"
    return fs, ""


def main(args: Any, doctor_sections: DoctorSections | None = None) -> int:
    as_json = getattr(args, "json", False)
    only = getattr(args, "only", None)
    fs, why_not = chosen_fs(args)
    if fs is None:
        print(why_not, file=sys.stderr)
        return 2
    chosen = [s for s in SCENARIOS if not only or any(o.lower() in s.name.lower() for o in only)]
    if not chosen:
        names = "\n  ".join(s.name for s in SCENARIOS)
        print(f"sharedfs demo: no scenario matches {only}; the scenarios are:\n  {names}", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr, len(chosen))
    try:
        results, mode = run_demo(use_fuse=False if getattr(args, "no_fuse", False) else None, only=only,
                                 progress=progress, fs=fs)
    except KeyboardInterrupt:
        progress.close()
        print("\nsharedfs demo: interrupted; everything it mounted and started was cleaned up", file=sys.stderr)
        return 130
    html_path, md_path = getattr(args, "html", None), getattr(args, "markdown", None)
    if html_path or md_path:
        paths = getattr(args, "doctor", None) or [os.getcwd()]
        doctor = doctor_sections(paths) if doctor_sections else []
        for path, text in ((html_path, render_html(results, mode, doctor) if html_path else ""),
                           (md_path, render_markdown(results, mode, doctor) if md_path else "")):
            if path:
                Path(path).write_text(text, encoding="utf-8")
                print(f"sharedfs demo: report written to {path}", file=sys.stderr)
    if as_json:
        print(json.dumps(as_data(results, mode), indent=2))
    else:
        print(render(results, mode))
    return 0 if all(r.ok for r in results if r.ran) else 1

