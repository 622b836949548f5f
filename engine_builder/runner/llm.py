"""The Python API: LLM(engine_dir).generate / stream / chat, vLLM-shaped.

    from engine_builder import LLM, SamplingParams
    llm = LLM("engine-dir")                       # TensorRT if it can run here, else onnxruntime
    out = llm.generate(["The capital of France is"], SamplingParams(max_new_tokens=32, temperature=0))
    print(out[0].text, out[0].finish_reason)
    for delta in llm.stream("Once upon a time"): print(delta, end="", flush=True)
    llm.chat([{"role": "user", "content": "Hi!"}])

Without params, the checkpoint's generation_config.json decides (greedy unless do_sample, its
top_k/top_p/temperature, EOS ids): SamplingParams.from_generation_config. EOS ids of the
tokenizer and of generation_config.json always stop a request unless ignore_eos.

A facade: the loop is runner/generate.py's Generator (`.generator`), over the backend the engine dir's
verdict picks (`.backend`); what a request gives back is runner/outputs.py's. Over an encoder engine (BERT
family) an LLM holds runner/embeddings.py's Embeddings (`.embeddings`, the entry point of its own) and
only embed() works: generate / stream / chat say so in one line.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engine_builder.runner.async_decode import AsyncDecode
from engine_builder.runner.backend import WarmUp
from engine_builder.runner.backend_choice import open_backend
from engine_builder.runner.chat_parts import as_parts, takes_parts
from engine_builder.runner.embeddings import Embeddings
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.generate import Generator
from engine_builder.runner.kv.prefix_cache import PrefixCache
from engine_builder.runner.ort_spinning import sessions_take_turns
from engine_builder.runner.outputs import RequestOutput, TokenStream, request_output
from engine_builder.runner.request_state import Timings
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.block_admission import BlockAdmission
from engine_builder.runner.scheduling.scheduler import SchedulerConfig
from engine_builder.runner.speculative import SpeculativeConfig, SpeculativeDecode, speculative_decode
from engine_builder.runner.tunables import PREFIX_CACHE_BYTES
from engine_builder.runner.vision.image_limits import ImageLimits
from engine_builder.util.errors import InputError, UnsupportedError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "TokenStream"]

Messages = Sequence[Mapping[str, Any]]


def _no_generation(engine: EngineDir) -> InputError:
    """What generate / stream / chat (and .generator, .backend) of an LLM over an encoder engine raise."""
    return InputError(f"{engine.path} is an encoder ({engine.model.architecture}) engine: it computes embeddings, "
                      "not text; use LLM.embed(texts), `trtbuild run --embed TEXT` or POST /v1/embeddings")


def _backend_and_tokenizer(engine: EngineDir, backend: str, threads: int | None) -> tuple[Any, Any, Any]:
    """open_backend in a thread while the tokenizer loads here: onnxruntime releases the GIL while it creates
    its session (packing the weights, most of a load), so the two overlap where a core is free (cold start)."""
    with ThreadPoolExecutor(1, thread_name_prefix="open-backend") as pool:
        # in this context: a speculative LLM's target session opens as one that takes turns (ort_spinning.py)
        opening = pool.submit(contextvars.copy_context().run, open_backend, engine, backend, threads=threads)
        try:
            tokenizer = engine.load_tokenizer()
        except BaseException:
            with contextlib.suppress(Exception):
                opening.result()[0].close()
            raise
        opened, choice = opening.result()
    return opened, choice, tokenizer


class LLM:
    def __init__(self, engine_dir: str | Path, backend: str = "auto", *, seed: int | None = None,
                 threads: int | None = None, verify: bool = True, prefix_cache: bool = True,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES, speculative: SpeculativeConfig | str | None = None,
                 kv_cache_memory: int | None = None, kv_budget_tokens: int | None = None,
                 gpu_memory_utilization: float | None = None, image_limits: ImageLimits = ImageLimits(),
                 async_scheduling: bool | None = None) -> None:
        """Open an engine dir. backend: auto (TensorRT when its verdict allows, else onnxruntime),
        tensorrt or onnxruntime. seed seeds requests that carry no seed of their own. threads:
        onnxruntime intra-op threads (default: the physical cores this process may use). verify=False
        skips checking the files' sha256 against the manifest (trusted dirs, fastest start).
        prefix_cache (on by default): keep the KV of prompts' and answers' full blocks (up to prefix_cache_bytes)
        and copy them into later requests that start the same way, which then prefill only the rest
        (runner/kv/prefix_cache.py): a shared system prompt is prefilled once, a conversation's next turn
        prefills only the new turn. Greedy answers are the same with and without it. onnxruntime backend
        only, and not for longrope models (their cached keys change past a length); False turns it off.
        kv_cache_memory: bytes of the block pool of a paged engine (`build --kv-layout paged`; default a
        quarter of the available RAM; InputError for a slot engine, whose KV is fixed); there prefix_cache
        shares cached blocks by reference (runner/kv/paged_kv_cache.py) and prefix_cache_bytes does not apply. The torch
        backend always pages its KV, on its device, whatever the engine's layout.
        gpu_memory_utilization: the torch backend on a CUDA GPU: the fraction of the GPU's memory the process may
        use, the KV pool taking what the weights leave (vLLM's knob; default 0.9); InputError for other backends.
        kv_budget_tokens: the KV all of generate()'s running requests may hold together, in tokens (default: every
        slot's max_seq_len; a paged engine's pool, which it caps). Requests are admitted by the free KV blocks of
        this one budget for their context, grow block by block and are preempted by recompute when blocks run out, with
        the tokens they get alone (runner/scheduling/block_admission.py, the server's scheduler); beam search
        reserves its beams' full length.
        speculative: "ngram", or a SpeculativeConfig (e.g. a draft engine dir): draft tokens verified k+1 at a
        time, same tokens at temperature 0, same distribution when sampling (runner/speculative/).
        image_limits: what one request's images may be on a vision-language engine (images per prompt, bytes and
        pixels of each: runner/vision/image_limits.py); more is an InputError.
        async_scheduling: the torch backend launches each decode step before the last one's tokens reach the host, so
        the host's per-token work overlaps the GPU's (runner/async_decode.py; vLLM's --async-scheduling): the same
        tokens, each request's last one a step later; not with speculative decoding. None (the default): on where the
        backend runs on a GPU and nothing speculative is asked for; False: never."""
        self._image_limits = image_limits
        spec = SpeculativeConfig.of(speculative)  # a bad value fails before anything loads
        if async_scheduling and spec is not None:
            raise InputError("async scheduling and speculative decoding do not combine (a verify step needs the "
                             "last tokens on the host); leave one of them out")
        SchedulerConfig(kv_budget_tokens=kv_budget_tokens)  # so does a bad budget (ConfigError)
        # the files' sha256 are checked in a thread while the tokenizer and the backend load (cold start,
        # issue 16); _open() waits for them before it returns, so a changed file is refused before any token
        self.engine = EngineDir.load(engine_dir, verify="overlap" if verify else False)
        try:
            # a target and its draft alternate; an LLM opened inside a caller's sessions_take_turns() keeps it
            turns = sessions_take_turns() if spec is not None and spec.method == "draft" else contextlib.nullcontext()
            with turns:
                self._open(spec, backend, seed, threads, prefix_cache, prefix_cache_bytes, kv_cache_memory,
                           gpu_memory_utilization, async_scheduling)
            if self._generator is not None:
                self._generator.admission = self._admission(kv_budget_tokens)
        except Exception:
            self.engine.wait_verified()  # a changed file explains a failed load better than the failure itself
            raise
        try:
            self.engine.wait_verified()
        except InputError:
            self.close()
            raise

    def _open(self, spec: SpeculativeConfig | None, backend: str, seed: int | None, threads: int | None,
              prefix_cache: bool, prefix_cache_bytes: int, kv_cache_memory: int | None,
              gpu_memory_utilization: float | None = None, async_scheduling: bool | None = None) -> None:
        # exactly one of the two is set: embeddings over an encoder engine, the generation loop over a decoder
        self.embeddings: Embeddings | None = None
        self._generator: Generator | None = None
        self._threads, self._image_prompts = threads, None  # the vision graph opens with the first images
        if self.engine.model.encoder is not None:  # BERT family: embed() only (runner/embeddings.py)
            self.embeddings = Embeddings(self.engine, backend, threads=threads)
            self.tokenizer = self.embeddings.tokenizer
            self.backend_name, self.backend_reason = self.embeddings.backend_name, self.embeddings.backend_reason
            return
        self._backend, choice, self.tokenizer = _backend_and_tokenizer(self.engine, backend, threads)
        self.backend_name, self.backend_reason = choice.name, choice.reason
        eos = self.engine.generation_config.get("eos_token_id", [])
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.insert(0, self.tokenizer.eos_token_id)
        try:
            if async_scheduling and not self._backend.takes_device_tokens:
                raise InputError(f"async scheduling overlaps the host with a GPU's steps; the {self._backend.title} "
                                 "backend computes on the host. Run with --backend torch, or leave it out")
            self._check_pool_options(kv_cache_memory, gpu_memory_utilization)
            if kv_cache_memory is not None:  # before the prefix cache takes the pool it holds
                self._backend.resize_kv(kv_cache_memory)
        except Exception:
            self._backend.close()
            raise
        cache = None
        if prefix_cache and self._backend.reprefill_after is None:  # longrope: cached keys change past a length
            cache = self._backend.kv.prefix_cache(budget_bytes=prefix_cache_bytes)
        if async_scheduling is None:
            async_scheduling = spec is None and self._backend.async_by_default
        decoding = AsyncDecode() if async_scheduling else None
        if spec is not None:
            decoding = speculative_decode(spec, self._backend, self.tokenizer, seed=seed, threads=threads)
        generator = Generator(self._backend, self.tokenizer, eos, self._backend.make_sampler(seed), cache, decoding)
        # answers too: a conversation's next prompt starts with this one and its answer (multi-turn reuse); the
        # slot layout's copying cache only (a paged engine shares prompt blocks by reference; chat sessions there
        # keep answers themselves, runner/chat_session.py)
        generator.cache_outputs = isinstance(cache, PrefixCache)
        self._generator = generator

    def _check_pool_options(self, kv_cache_memory: int | None, gpu_memory_utilization: float | None) -> None:
        """Refuse a pool size the backend cannot take; size a device pool by utilization (before the prefix cache
        takes the pool it holds)."""
        if kv_cache_memory is not None and not self._backend.kv.sized_by_bytes:
            # a slot engine's KV is max_batch x max_seq_len, fixed at build time
            raise InputError(f"kv_cache_memory (--kv-cache-memory) sizes a paged engine's block pool, and "
                             f"{self.engine.path} keeps one KV slot per sequence; rebuild it with "
                             "`trtbuild build --kv-layout paged`, run it with --backend torch, or leave the option out")
        if gpu_memory_utilization is None:
            return
        resize = getattr(self._backend, "size_kv_by_device", None)
        if resize is None:
            raise InputError(f"gpu_memory_utilization (--gpu-memory-utilization) sizes the torch backend's KV pool on "
                             f"a GPU, and {self.backend_name} runs this engine; run it with --backend torch, or leave "
                             "the option out")
        if kv_cache_memory is not None:
            raise InputError("give --kv-cache-memory or --gpu-memory-utilization, not both: each sizes the KV pool")
        resize(gpu_memory_utilization)

    def _admission(self, kv_budget_tokens: int | None) -> BlockAdmission:
        """generate()'s admission by free KV blocks; prompts prefilled whole (a step may take every slot's longest)."""
        kv = self._backend.kv
        return BlockAdmission(SchedulerConfig(kv_budget_tokens=kv_budget_tokens,
                                              max_tokens_per_step=kv.batch_slots * self._backend.max_input_len))

    # --- parameters and prompts -------------------------------------------------------------

    def default_params(self, **overrides: Any) -> SamplingParams:
        """generation_config.json's defaults with `overrides` on top (None = not given)."""
        return SamplingParams.from_generation_config(self.engine.generation_config, **overrides)

    def encode(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise InputError(f"a prompt must be a string, got {type(prompt).__name__}")
        return list(self.tokenizer(prompt).input_ids)

    def encode_chat(self, messages: Messages, tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """The chat template's text as token ids; the template already holds the special tokens
        (BOS, turn markers), so none are added again."""
        return list(self.tokenizer(self.apply_chat_template(messages, tools), add_special_tokens=False).input_ids)

    def apply_chat_template(self, messages: Messages, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The model's chat template over `messages` (and OpenAI-style `tools`, for templates that render
        them), ending with the assistant's turn opener."""
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise InputError(f"the tokenizer in {self.engine.path} has no chat template; use generate() "
                             "with a plain prompt instead of chat()")
        if isinstance(template, str) and takes_parts(template):  # SmolVLM's, llava-hf's: typed parts (chat_parts.py)
            from engine_builder.runner.vision.image_prompts import placeholder_text

            messages = as_parts(messages, placeholder_text(self.engine, self.tokenizer))
        try:
            extra = {"tools": list(tools)} if tools else {}
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                                      **extra)
        except Exception as exc:  # jinja's TemplateError, or a message without role/content
            raise InputError(f"cannot apply the chat template to these messages: {exc}; give a list of "
                             '{"role": ..., "content": ...} dicts') from None

    # --- generation -------------------------------------------------------------------------

    def generate(self, prompts: str | Sequence[str] | None = None,
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None, images: Any = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. Give text prompts, or token ids instead. images (a
        vision-language engine): per prompt a list of images (bytes, a path, a data: URL or a PIL image), each
        standing where its image token is in the prompt; with one prompt, its list."""
        generator = self.generator
        texts, ids = self._prompts(prompts, prompt_token_ids)
        ids, prepared = self._with_images(ids, images)
        requests, events = generator.start(ids, self._params(params, len(ids)), prepared)
        for _ in events:
            pass
        return [request_output(r, t) for r, t in zip(requests, texts)]

    def stream(self, prompt: str, params: SamplingParams | None = None, *, images: Any = None) -> TokenStream:
        """Iterate over text deltas of one prompt's generation (images: as generate's, of this one prompt)."""
        generator = self.generator
        ids, prepared = self._with_images([self.encode(prompt)], images)
        return TokenStream(generator, generator.start(ids, self._params(params, 1), prepared), prompt)

    def chat(self, messages: Messages | Sequence[Messages],
             params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             images: Any = None) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation (a list of messages) or to several. images: as
        generate's, per conversation; each goes where its image token is in the messages (in order), else (no
        message holds one) all before the last user message's text."""
        if self._generator is None:  # an encoder engine's refusal before its tokenizer's (it has no chat template)
            raise _no_generation(self.engine)
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        if not conversations or any(not c for c in conversations):
            raise InputError("chat() needs at least one message, e.g. [{'role': 'user', 'content': 'Hi'}]")
        from engine_builder.runner.vision.image_prompts import per_prompt

        per = per_prompt(images, len(conversations)) if images is not None else [[]] * len(conversations)
        ids = [self.encode_chat(self._image_turn(c, i)) for c, i in zip(conversations, per)]
        return self.generate(params=params, prompt_token_ids=ids, images=images if images is not None else None)

    def stream_chat(self, messages: Messages, params: SamplingParams | None = None, *,
                    images: Any = None) -> TokenStream:
        from engine_builder.runner.vision.image_prompts import per_prompt

        generator = self.generator
        per = per_prompt(images, 1)[0] if images is not None else []
        ids, prepared = self._with_images([self.encode_chat(self._image_turn(messages, per))], images)
        return TokenStream(generator, generator.start(ids, self._params(params, 1), prepared), None)

    def _image_turn(self, messages: Messages, images: list) -> Messages:
        """The conversation with an image token per image in its last user message (runner/vision)."""
        from engine_builder.runner.vision.image_prompts import placeholder_text, with_image_tokens

        token = placeholder_text(self.engine, self.tokenizer)
        if not images or token is None or any(token in str(m.get("content", "")) for m in messages):
            return messages  # no images, or the messages already say where each goes
        return with_image_tokens(messages, len(images), token)

    def embed(self, texts: str | Sequence[str]) -> np.ndarray:
        """Embeddings from an encoder engine: float32 [hidden] for one string, [len(texts), hidden] for a list
        (Embeddings.embed; `Embeddings(engine_dir)` opens an encoder engine without the LLM around it)."""
        if self.embeddings is None:
            raise InputError(f"{self.engine.path} is a text-generation ({self.engine.model.architecture}) engine; "
                             "embeddings need an encoder engine (convert a BERT / sentence-transformers model)")
        return self.embeddings.embed(texts)

    @property
    def generator(self) -> Generator:
        """The generation loop over this LLM's backend (what an Executor drives); an encoder engine has none
        (InputError)."""
        if self._generator is None:
            raise _no_generation(self.engine)
        return self._generator

    @property
    def backend(self) -> Any:
        """The backend the loop runs (runner/backend.py's Backend: onnxruntime, TensorRT, torch or the tp/pp
        ranks); an encoder engine's session is `.embeddings`' own (InputError here)."""
        if self.embeddings is not None:
            raise _no_generation(self.engine)
        return self._backend

    @property
    def speculation(self) -> SpeculativeDecode | None:
        """Speculative decoding's policy on the loop (its stats, its proposer), or None without --speculative."""
        decoding = self._generator.decoding if self._generator is not None else None
        return decoding if isinstance(decoding, SpeculativeDecode) else None

    @property
    def last_timings(self) -> Timings | None:
        """Timings of the last finished generate/stream/chat call (None before one, and on an encoder engine)."""
        return self._generator.timings if self._generator is not None else None

    def warm_up(self, progress: Callable[[str], None] | None = None) -> WarmUp | None:
        """Compile and capture now what the first requests would pay for (the torch backend on a GPU: torch.compile
        of the layers, a CUDA graph per batch-size bucket; `serve` does this before it listens), telling progress
        what; None where there is nothing to warm."""
        return None if self._generator is None else self._generator.backend.warm_up(progress)

    def close(self) -> None:
        if self.embeddings is not None:
            self.embeddings.close()
            return
        if self._generator is not None:
            self._generator.close()  # a draft engine's backend
        self._backend.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prompts(self, prompts: str | Sequence[str] | None,
                 token_ids: Sequence[Sequence[int]] | None) -> tuple[list[str | None], list[list[int]]]:
        if (prompts is None) == (token_ids is None):
            raise InputError("give either prompts (text) or prompt_token_ids, not both or neither")
        if token_ids is not None:
            ids = [[int(t) for t in p] for p in token_ids]
            return [None] * len(ids), ids
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not texts:
            raise InputError("no prompts given; pass a string or a list of strings")
        return texts, [self.encode(t) for t in texts]

    def _with_images(self, ids: list[list[int]], images: Any) -> tuple[list[list[int]], list | None]:
        """The prompts with their images encoded and spliced (runner/vision/image_prompts.py): each image token
        expanded; (ids, None) without images, after checking no prompt holds an image token alone. The vision
        modules (Pillow) load with the first vision engine: a text model's cold start does without them."""
        if images is None and self.engine.model.vision is None:
            return ids, None
        from engine_builder.runner.vision.image_prompts import image_prompts_for, refuse_image_tokens

        vision = self.engine.model.vision
        if images is None:  # a vision engine's text prompt
            for prompt in ids:
                refuse_image_tokens(prompt, vision.image_token_id)
            return ids, None
        if vision is None:
            raise InputError(f"{self.engine.path} is a text-only engine; images need one built from a "
                             "vision-language checkpoint (e.g. llava)")
        if not self.backend.takes_images:
            raise UnsupportedError(f"the {self.backend_name} backend does not run image inputs yet; run this "
                                   "vision-language engine with --backend onnxruntime")
        if self._image_prompts is None:
            self._image_prompts = image_prompts_for(self.engine, self.tokenizer, self._threads, self._image_limits)
        prepared = self._image_prompts.prepare_all(ids, images)
        return [p.ids if p is not None else i for p, i in zip(prepared, ids)], prepared

    def _params(self, params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
        if params is None:
            return [self.default_params()] * n
        if isinstance(params, SamplingParams):
            params = [params] * n
        params = [p.with_engine_defaults(self.engine.generation_config) if isinstance(p, SamplingParams) else p
                  for p in params]
        if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
            raise InputError(f"give one SamplingParams for all prompts or one per prompt ({n}), got {len(params)}")
        return params
