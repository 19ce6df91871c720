"""XTuner's ``process_hf_dataset`` with sharedfs vs without, side by side in one run.

1. A 2-rank job on one node, datasets cache on local disk: wall time of dataset
   preparation (``process_hf_dataset`` on every rank, until the last rank has its
   dataset), sharedfs vs ``SHAREDFS_DISABLE=1``, best of ``--repeat`` runs each (the
   median ratio is in ``--json``); goal <= 1.05x.
2. Node-local mode, 4 ranks as 2 simulated nodes x 2 ranks, each node with its own cache
   directory: how many processes per node ran the preparation (the dataset map
   function); goal 1 per node.  Without sharedfs XTuner prepares on rank 0 only, so the
   second node gets 0 -- and, on a real cluster, paths it cannot open.

Needs the XTuner stack (tests/helpers/xt_requirements.txt):

    python benchmarks/xtuner_prepare.py --python /path/to/xtuner-venv/bin/python [--json] [--quick] [--repeat 3]

Exit status 2 when no XTuner stack is found (benchmarks/run_all.py lists it as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as dist
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from xtuner.dataset import process_hf_dataset
    from xtuner.dataset.map_fns import alpaca_map_fn, template_map_fn_factory
    from xtuner.utils import PROMPT_TEMPLATE

    model_dir, data, counter = sys.argv[1], sys.argv[2], sys.argv[3]

    def counted_alpaca_map_fn(example):  # one line per process that really prepares
        with open(counter, "a") as f:
            f.write(os.environ["SHAREDFS_NODE_ID"] + " " + str(os.getpid()) + "\\n")
        return alpaca_map_fn(example)

    dist.init_process_group("gloo", init_method="env://")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dist.barrier()
    start = time.perf_counter()
    ds = process_hf_dataset(dataset=load_dataset("json", data_files=data, split="train"), tokenizer=tokenizer,
                            max_length=128, dataset_map_fn=counted_alpaca_map_fn,
                            template_map_fn=template_map_fn_factory(template=PROMPT_TEMPLATE.default),
                            remove_unused_columns=True, shuffle_before_pack=True, pack_to_max_length=True,
                            map_num_proc=1)
    mine = time.perf_counter() - start
    dist.barrier()
    total = time.perf_counter() - start
    print(json.dumps({"rank": dist.get_rank(), "mine": mine, "total": total, "rows": len(ds)}))
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHAREDFS_", "HF_", "PYTHON")) and k != "LD_PRELOAD"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def job(python: str, tiny: Path, work: Path, nodes: list[str], env: dict[str, str]) -> dict:
    """One job: rank i on simulated node nodes[i]; each node's cache under work/<node>/ when node-local."""
    counter = work / "prepared-by"
    port = str(_free_port())
    procs = []
    for rank, node in enumerate(nodes):
        penv = {**_base_env(), **env, "RANK": str(rank), "WORLD_SIZE": str(len(nodes)),
                "LOCAL_RANK": str(nodes[:rank].count(node)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "SHAREDFS_NODE_ID": node, "HF_HOME": str(work / "hf_home")}
        # Each simulated node's "local disk": its own directory (one machine cannot hide them from
        # each other, so this counts preparations; tests/integration/test_xtuner.py shows the failure).
        local = work / node
        local.mkdir(parents=True, exist_ok=True)
        penv["SHAREDFS_CACHE_ROOT"] = str(local)
        if penv.get("HF_DATASETS_CACHE") == "per-node":
            penv["HF_DATASETS_CACHE"] = str(local / "hf_datasets")
        procs.append(subprocess.Popen([python, "-c", WORKER, str(tiny / "model"), str(tiny / "alpaca.jsonl"),
                                       str(counter)], env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd="/"))
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed (exit {proc.returncode}):\n{stderr[-3000:]}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    preparers: dict[str, set[str]] = {node: set() for node in nodes}
    if counter.exists():
        for line in counter.read_text().split("\n"):
            if line:
                node, pid = line.split()
                preparers[node].add(pid)
    return {"seconds": max(o["total"] for o in outs), "rows": {o["rows"] for o in outs},
            "preparers": {node: len(pids) for node, pids in preparers.items()}}


def _xtuner_python() -> str:
    """This interpreter if it has XTuner, else the newest venv tests/integration/test_xtuner.py built."""
    if subprocess.run([sys.executable, "-c", "import xtuner"], capture_output=True).returncode == 0:
        return sys.executable
    cache = Path(os.environ.get("SHAREDFS_TEST_VENV_CACHE", "/var/tmp/sharedfs-test-venvs"))
    built = sorted(cache.glob("xtuner-*/bin/python"), key=lambda p: p.stat().st_mtime)
    return str(built[-1]) if built else sys.executable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=None,
                        help="interpreter of a venv with the XTuner stack (default: the one the tests built)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2000, help="Alpaca rows to prepare")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.rows = 1, 300
    args.python = args.python or _xtuner_python()
    check = subprocess.run([args.python, "-c", "import xtuner, sharedfs"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"{args.python} cannot import xtuner and sharedfs ({check.stderr.strip().splitlines()[-1]}); "
              "pass --python of a venv made with `pip install -r tests/helpers/xt_requirements.txt` + sharedfs",
              file=sys.stderr)
        return 2  # cannot run here: benchmarks/run_all.py lists it as skipped
    with tempfile.TemporaryDirectory(prefix="xtuner-prepare-") as tmp:
        tiny = Path(tmp) / "tiny"
        subprocess.run([args.python, str(ROOT / "tests" / "xt_tiny_llama.py"), str(tiny), str(args.rows)],
                       check=True, capture_output=True, env=_base_env())
        times: dict[str, list[float]] = {"sharedfs": [], "baseline": []}
        for i in range(args.repeat):
            # Alternate the order so neither side always runs on a warmer page cache.
            for label in (("baseline", "sharedfs") if i % 2 else ("sharedfs", "baseline")):
                env = {"HF_DATASETS_CACHE": "per-node"}
                if label == "baseline":
                    env["SHAREDFS_DISABLE"] = "1"
                times[label].append(job(args.python, tiny, Path(tmp) / f"t{i}-{label}", ["a", "a"], env)["seconds"])
        # Best of N: on a shared 2-core machine the noise is other processes, which only ever add time.
        ours, theirs = min(times["sharedfs"]), min(times["baseline"])
        node_local = job(args.python, tiny, Path(tmp) / "node-local", ["a", "a", "b", "b"], {"SHAREDFS_CACHE": "node-local"})
        naive = job(args.python, tiny, Path(tmp) / "naive", ["a", "a", "b", "b"],
                    {"SHAREDFS_DISABLE": "1", "HF_DATASETS_CACHE": "per-node"})
    per_node = node_local["preparers"]
    rows = [
        {"what": f"prepare {args.rows} rows, 2 ranks on 1 node, local-disk cache (best of {args.repeat})",
         "sharedfs": ours, "baseline": theirs, "unit": "s", "ratio": ours / theirs, "goal": "<= 1.05",
         "met": ours / theirs <= 1.05, "runs": times,
         "median_ratio": statistics.median(times["sharedfs"]) / statistics.median(times["baseline"])},
        {"what": "node-local cache, 2 nodes x 2 ranks: preparations on node a / node b",
         "sharedfs": [per_node["a"], per_node["b"]], "baseline": [naive["preparers"]["a"], naive["preparers"]["b"]],
         "unit": "", "ratio": None, "goal": "1 / 1", "met": per_node == {"a": 1, "b": 1}},
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'what':<78}{'sharedfs':>10}{'baseline':>10}{'ratio':>8}  goal")
    for row in rows:
        if row["unit"] == "s":
            print(f"{row['what']:<78}{row['sharedfs']:>9.2f}s{row['baseline']:>9.2f}s{row['ratio']:>8.3f}  {row['goal']}")
        else:
            ours_s = " / ".join(map(str, row["sharedfs"]))
            theirs_s = " / ".join(map(str, row["baseline"]))
            print(f"{row['what']:<78}{ours_s:>10}{theirs_s:>10}{'':>8}  {row['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
