"""The contenders of benchmarks/peers.py behind one interface, each opened inside its own worker process.

Every system takes token ids (never text: all see the same ids) and answers
  generate(prompts, n)  -> the wall-clock time at which each of the n tokens of every row was in hand
                           (t_1 after prefill + the first sample, t_k after the k-th), EOS ignored
  prefill(prompt)       -> seconds from the ids to the first token's logits
  log_probs(windows)    -> [positions, vocab] log-softmax of the next-token logits of every window position
                           but the last (the eval windows of `trtbuild eval`, engine_builder/eval/text.py)
Timing is done here, in the worker, around the system's own generation loop: nothing of the
orchestrator (pipes, JSON) is inside a timed region.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class Ours:
    """A trtbuild engine dir on the onnxruntime backend (the float32 twin)."""

    def __init__(self, engine: Path, threads: int) -> None:
        from engine_builder import LLM

        # no prefix cache: the peers keep no KV between calls, and a timed prefill of the warm-up's prompt
        # would only load cached blocks (measured: 8,137 "prefill tok/s" for 512 tokens on 2 threads)
        self.llm = LLM(engine, backend="onnxruntime", threads=threads, prefix_cache=False)

    def spinning(self) -> str:
        """Whether the session's intra-op threads spin-wait (runner/ort_spinning.py chose it at open)."""
        options = self.llm.backend.session.get_session_options()
        return "on" if options.get_session_config_entry("session.intra_op.allow_spinning") != "0" else "off"

    def generate(self, prompts: list[list[int]], n: int) -> list[float]:
        from engine_builder import SamplingParams

        params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)] * len(prompts)
        requests, events = self.llm.generator.start(prompts, params)
        times, seen = [], 0
        for _ in events:  # one event per row per step; a step's events arrive together
            seen += 1
            if seen % len(prompts) == 0:
                times.append(time.perf_counter())
        assert all(len(r.token_ids) == n for r in requests), [len(r.token_ids) for r in requests]
        return times

    def prefill(self, prompt: list[int]) -> float:
        started = time.perf_counter()
        self.generate([prompt], 1)
        return time.perf_counter() - started

    def log_probs(self, windows: list[np.ndarray]) -> np.ndarray:
        backend, out = self.llm.backend, []
        for w in windows:  # one token per step: the graph returns the last position's logits only
            backend.kv.allocate(0, len(w) - 1, 1)
            for t in range(len(w) - 1):
                out.append(log_softmax(backend.step(0, np.asarray([[w[t]]], np.int64))[0]))
                backend.kv.advance(0, 1)
            backend.release(0)
        return np.stack(out)


class OrtGenAI:
    """onnxruntime-genai on a model its own builder made (genai_config.json sets the thread count)."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import onnxruntime_genai as og

        config = json.loads((model_dir / "genai_config.json").read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        if options.get("intra_op_num_threads") != threads or options.get("inter_op_num_threads") != 1:
            options.update(intra_op_num_threads=threads, inter_op_num_threads=1)
            (model_dir / "genai_config.json").write_text(json.dumps(config, indent=4))
        self.og, self.dir, self.threads = og, model_dir, threads
        self.model = og.Model(str(model_dir))
        entries = options.get("config_entries", {})
        # onnxruntime's default is to spin; onnxruntime-genai 0.18 sets nothing else unless its config says so
        self._spinning = "off" if entries.get("session.intra_op.allow_spinning") == "0" else "on"

    def spinning(self) -> str:
        return self._spinning

    def generate(self, prompts: list[list[int]], n: int) -> list[float]:
        og = self.og
        params = og.GeneratorParams(self.model)
        length = len(prompts[0]) + n
        # min_length = max_length: EOS is masked until the last token (exactly n new tokens)
        params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=len(prompts))
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray(prompts, np.int32))
        times = []
        for _ in range(n):
            generator.generate_next_token()
            times.append(time.perf_counter())
        sequences = [generator.get_sequence(i) for i in range(len(prompts))]
        assert all(len(s) == length for s in sequences), [len(s) for s in sequences]
        del generator
        return times

    def prefill(self, prompt: list[int]) -> float:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + 1, batch_size=1)
        generator = og.Generator(self.model, params)
        started = time.perf_counter()
        generator.append_tokens(np.asarray([prompt], np.int32))
        seconds = time.perf_counter() - started
        del generator
        return seconds

    def log_probs(self, windows: list[np.ndarray]) -> np.ndarray:
        """From its ONNX model itself in onnxruntime: a whole window per run, every position's logits."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        session = ort.InferenceSession(str(self.dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        decoder = json.loads((self.dir / "genai_config.json").read_text())["model"]["decoder"]
        empty = np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
        past = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        out = []
        for w in windows:
            feeds = {"input_ids": w[None, :-1].astype(np.int64),
                     "attention_mask": np.ones((1, len(w) - 1), np.int64)}
            feeds.update(dict.fromkeys(past, empty))  # no past: [1, kv_heads, 0, head_dim]
            logits = session.run(["logits"], feeds)[0][0]  # [len - 1, vocab]
            out.extend(log_softmax(row) for row in logits)
        return np.stack(out)


class LlamaCpp:
    """llama.cpp (`llama-cpp-python`) on a GGUF file, greedy."""

    def __init__(self, gguf: Path, threads: int, context: int, logits_all: bool = False) -> None:
        from smollm2_quant import import_llama_cpp

        self.model = import_llama_cpp().Llama(model_path=str(gguf), n_ctx=context, n_batch=512, n_ubatch=512,
                                              n_threads=threads, n_threads_batch=threads, logits_all=logits_all,
                                              verbose=False)

    def generate(self, prompts: list[list[int]], n: int) -> list[float]:
        if len(prompts) != 1:
            raise NotImplementedError("llama-cpp-python's Llama decodes one sequence")
        self.model.reset()
        times = []
        for _ in self.model.generate(prompts[0], temp=0.0, top_k=1, reset=True):  # no EOS check of its own
            times.append(time.perf_counter())
            if len(times) == n:
                break
        return times

    def prefill(self, prompt: list[int]) -> float:
        self.model.reset()
        started = time.perf_counter()
        self.model.eval(prompt)
        return time.perf_counter() - started

    def log_probs(self, windows: list[np.ndarray]) -> np.ndarray:
        out = []
        for w in windows:
            self.model.reset()
            self.model.eval(w[:-1].tolist())
            out.extend(log_softmax(row) for row in np.asarray(self.model.scores[:len(w) - 1], np.float32))
        return np.stack(out)


class Transformers:
    """Hugging Face transformers, float32, on the dequantized GGUF (the issue's non-anchor row)."""

    def __init__(self, hf_dir: Path, threads: int) -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

    def generate(self, prompts: list[list[int]], n: int) -> list[float]:
        torch = self.torch
        times: list[float] = []

        class Clock:  # a logits processor sees every step once its logits exist
            def __call__(self, ids, scores):
                times.append(time.perf_counter())
                return scores

        with torch.inference_mode():
            out = self.model.generate(torch.tensor(prompts), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      logits_processor=[Clock()], pad_token_id=0)
        assert out.shape[1] == len(prompts[0]) + n
        return times

    def prefill(self, prompt: list[int]) -> float:
        with self.torch.inference_mode():
            started = time.perf_counter()
            self.model(self.torch.tensor([prompt]))
            return time.perf_counter() - started

    def log_probs(self, windows: list[np.ndarray]) -> np.ndarray:
        with self.torch.inference_mode():
            return np.concatenate([log_softmax(self.model(self.torch.tensor(w[None, :-1])).logits[0].numpy())
                                   for w in windows])
