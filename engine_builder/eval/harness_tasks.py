"""`trtbuild eval ENGINE --tasks ...`: EleutherAI's lm-eval harness scores an engine through the OpenAI
API, exactly as it scores any server (its `local-completions` model), against this process's own
`serve` app on a free loopback port for the length of the run.

loglikelihood tasks read /v1/completions echo + logprobs (the prompt's own logprobs, equal to the
twin's log-softmax); generate_until tasks read completions. Tasks whose data lm-eval would download
need the network (HF_DATASETS_OFFLINE=1 refuses them); `--include-path DIR` adds task YAMLs of your
own, e.g. over local JSONL files. lm-eval is an optional dependency: `pip install 'lm-eval[api]'`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.util.errors import InputError

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HarnessResult:
    tasks: tuple[str, ...]
    results: dict[str, dict[str, Any]]  # task -> {"acc,none": ..., "acc_stderr,none": ...}, as lm-eval reports
    samples: dict[str, int]  # task -> documents scored
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "results": self.results, "samples": self.samples,
                "seconds": round(self.seconds, 3)}


@contextlib.contextmanager
def _loopback_server(engine_dir: Path, backend: str) -> Iterator[tuple[str, str]]:
    """The engine's OpenAI app on 127.0.0.1:<free port> in a thread: (base URL, model name)."""
    import uvicorn

    from engine_builder.executor import Executor
    from engine_builder.runner.llm import LLM
    from engine_builder.server.asgi_app import create_app
    from engine_builder.server.config import ServerConfig
    from engine_builder.util.listen_socket import bind, url_of

    name = Path(engine_dir).resolve().name
    with LLM(engine_dir, backend=backend) as llm:
        executor = Executor(llm)
        sock = bind("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(create_app(executor, ServerConfig.for_engine(llm.engine.limits, name)),
                                               log_level="warning", access_log=False, lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="trtbuild-eval-server",
                                  daemon=True)
        thread.start()  # not the main thread: uvicorn leaves the signal handlers alone there
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not server.started and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not server.started:
                raise InputError(f"the evaluation server for {engine_dir} did not start within {START_TIMEOUT_S:g} s")
            yield url_of(sock), name
        finally:
            server.should_exit = True
            thread.join()
            sock.close()
            executor.shutdown(drain=False)


def run_tasks(engine_dir: str | Path, tasks: Sequence[str], *, include_path: str | Path | None = None,
              limit: int | None = None, num_fewshot: int | None = None, backend: str = "auto") -> HarnessResult:
    """lm-eval's simple_evaluate over TASKS, its model an OpenAI client of this engine."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise InputError("trtbuild eval --tasks needs EleutherAI's lm-eval harness: pip install 'lm-eval[api]'") \
            from None
    if not tasks:
        raise InputError("--tasks is empty; name lm-eval tasks, e.g. --tasks arc_easy,hellaswag")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be >= 1 documents per task, got {limit}")
    if include_path is not None and not Path(include_path).is_dir():
        raise InputError(f"--include-path {include_path} is not a directory of task YAML files")
    manager = TaskManager(include_path=str(include_path) if include_path is not None else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"lm-eval has no task {unknown[0]!r}; `lm_eval --tasks list` lists them, and "
                         "--include-path DIR adds your own task YAMLs")
    started = time.perf_counter()
    with _loopback_server(Path(engine_dir), backend) as (url, name):
        # tokenized_requests: lm-eval tokenizes with the engine's own tokenizer and sends token ids, so the
        # scored continuation is exactly the tokens it split off (no re-tokenization on the server)
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"base_url={url}/v1/completions,model={name},tokenizer={Path(engine_dir).resolve()},"
                       "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1",
            tasks=list(tasks), task_manager=manager, limit=limit, num_fewshot=num_fewshot)
    if results is None:  # simple_evaluate returns None on non-zero ranks only; one process here
        raise InputError("lm-eval returned no results")
    scores = {task: {k: v for k, v in metrics.items() if k != "alias"} for task, metrics in results["results"].items()}
    counts = {task: int(n.get("effective", n.get("original", 0))) if isinstance(n, dict) else int(n)
              for task, n in results.get("n-samples", {}).items()}
    return HarnessResult(tuple(tasks), scores, counts, time.perf_counter() - started)
