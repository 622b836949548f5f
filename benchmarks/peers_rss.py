"""Where benchmarks/peers.py's peak RSS comes from: each system's memory stage by stage, in a process of its own.

    python benchmarks/peers_rss.py [--systems ours-fp32 genai-fp32 ...] [--threads 2] [--work build/bench-peers]

For every system (the artifacts of benchmarks/peers.py, made if missing under the same --work) a fresh
process walks the stages peers_worker.py goes through (imports, load, a warm-up of 8 tokens, a batch-1
decode of 64, a 512-token prefill, a batch-8 decode of 64) and prints after each: VmHWM (the peak the
benchmark reports), RssAnon, RssFile, AnonHugePages and FilePmdMapped (smaps_rollup: anonymous and file
memory mapped 2 MiB at a time by transparent huge pages), then the mappings holding the most resident
memory at the end (anonymous memory grouped as [anon]) and the extension modules loaded that the other
systems did not load. The figures that differ between two machines say which stage and which mapping
holds the difference (issue 22: the same systems took ~580 MB more on a 16-core GPU host than here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the repo root: benchmarks/passes.py would shadow passes/

FIELDS = ("VmHWM", "RssAnon", "RssFile", "AnonHugePages", "FilePmdMapped", "Threads")


def memory() -> dict[str, int]:
    """MB of each of FIELDS, now."""
    out = {}
    for file in ("/proc/self/status", "/proc/self/smaps_rollup"):
        for line in Path(file).read_text().splitlines():
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) // (1 if key == "Threads" else 1024)
    return out


def top_mappings(count: int) -> list[tuple[str, int]]:
    """The COUNT mappings (by file, anonymous ones as [anon]) holding the most resident MB."""
    rss: dict[str, int] = {}
    name = "[anon]"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # "start-end perms offset dev inode [path]"
            name = head[5] if len(head) > 5 and not head[5].startswith("[anon") else "[anon]"
        elif head and head[0] == "Rss:":
            rss[name] = rss.get(name, 0) + int(head[1])
    return [(n, kb // 1024) for n, kb in sorted(rss.items(), key=lambda x: -x[1])[:count]]


def thp_settings() -> str:
    """The kernel's transparent huge page modes: PMD-sized, khugepaged's fill rule, and any smaller size enabled."""
    root = Path("/sys/kernel/mm/transparent_hugepage")

    def chosen(file: Path) -> str:
        try:
            text = file.read_text()
        except OSError:
            return "?"
        return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()

    sizes = [f"{d.name.split('-')[1]} {chosen(d / 'enabled')}" for d in sorted(root.glob("hugepages-*kB"))
             if chosen(d / "enabled") not in ("never", "?")]
    return (f"THP enabled {chosen(root / 'enabled')}, defrag {chosen(root / 'defrag')}, khugepaged max_ptes_none "
            f"{chosen(root / 'khugepaged' / 'max_ptes_none')}; sizes on: {', '.join(sizes) or 'none'}")


def child(kind: str, path: Path, threads: int, prompt: list[int], long_ids: list[int]) -> None:
    stages = [("python + numpy", memory())]
    import peers_systems

    opened = {"ours": peers_systems.Ours, "genai": peers_systems.OrtGenAI}[kind]
    system = opened(path, threads)
    stages.append(("load", memory()))
    system.generate([prompt], 8)
    stages.append(("warm-up, 8 tokens", memory()))
    system.generate([prompt], 64)
    stages.append(("decode 64, batch 1", memory()))
    system.prefill(long_ids)
    stages.append((f"prefill {len(long_ids)}", memory()))
    system.generate([prompt] * 8, 64)
    stages.append(("decode 64, batch 8", memory()))
    modules = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())} - {""})
    heavy = sorted(m for m in ("torch", "transformers", "tensorrt", "tensorrt_rtx", "onnxruntime", "tokenizers",
                               "jinja2", "onnx") if m in sys.modules)
    print(json.dumps({"stages": stages, "top": top_mappings(12), "heavy": heavy,
                      "extensions": [m for m in modules if m.endswith(".so")]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=["ours-fp32", "genai-fp32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("build/bench-peers"))
    parser.add_argument("--max-seq", type=int, default=640, help="peers.py's engines: 512-token prefill + 128")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        ids = json.loads(args.ids)
        child(args.child[0], Path(args.child[1]), args.threads, ids[:32], ids)
        return
    from peers import eval_ids
    from peers_build import SYSTEMS, artifact

    fp32 = artifact(args.work, "ours-fp32", 640, 512, 8)  # the prompt ids, from peers.py's own fp32 engine
    ids = eval_ids(args.work, fp32, 512)
    results = {}
    for name in args.systems:
        path = artifact(args.work, name, args.max_seq, 512, 8)
        done = subprocess.run([sys.executable, __file__, "--child", SYSTEMS[name].kind, str(path), "--threads",
                               str(args.threads), "--ids", json.dumps(ids)],
                              capture_output=True, text=True, env=os.environ)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.splitlines()[-1])
    everyone = [set(r["extensions"]) for r in results.values()]
    print(thp_settings())
    for name, r in results.items():
        print(f"== {name} ({args.threads} threads, {os.cpu_count()} CPUs, "
              f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB)")
        print(f"  {'stage':<22}" + "".join(f"{f:>15}" for f in FIELDS) + "   (MB; Threads: a count)")
        for stage, m in r["stages"]:
            print(f"  {stage:<22}" + "".join(f"{m.get(f, 0):>15}" for f in FIELDS))
        print("  most resident mappings: " + ", ".join(f"{Path(n).name} {mb}" for n, mb in r["top"]))
        print(f"  of torch, transformers, tensorrt(_rtx), onnxruntime, tokenizers, jinja2, onnx, imported: "
              f"{', '.join(r['heavy']) or 'none'}")
        own = set(r["extensions"]) - set.intersection(*everyone)
        if own:
            print(f"  extension modules only some systems load: {', '.join(sorted(Path(m).name for m in own))}")


if __name__ == "__main__":
    main()
