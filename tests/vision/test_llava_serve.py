"""A vision-language engine behind a live `trtbuild serve` (issue 35): the OpenAI client's chat completion with a
base64 image content part and TGI's /generate with a markdown image give transformers' greedy tokens for the same
prompt layout; bad images are 400s with one line, and a text-only server refuses image parts."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from PIL import Image
from runner_engines import TINY_CHAT_TEMPLATE, build_engine
from server.live_server import live_server  # tests/server/live_server.py (tests/ is on sys.path)
from tiny_llava import IMAGE_TOKEN, tiny_llava
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from converters.convert import convert
from engine_builder import LLM
from engine_builder.formats.build_config import Limits
from engine_builder.runner.chat_session import ChatSession

TOKENS = 16
STEPS = 6


@pytest.fixture(scope="module")
def llava(module_tmp_factory):
    root = module_tmp_factory.mktemp("llava-serve")
    hf_dir = tiny_llava(root / "hf")
    (hf_dir / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)
    convert(hf_dir, root / "ckpt", dtype="float32")
    engine = build_engine(root / "ckpt", root / "engine", Limits(max_batch=2, max_input_len=64, max_seq_len=96))
    model = transformers.LlavaForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    with live_server(engine) as server:
        yield server, LLM(engine, backend="onnxruntime"), model, CLIPImageProcessorPil.from_pretrained(hf_dir)


def png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 48, 3), np.uint8)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def hf_text(llava, ids: list[int], image: bytes) -> str:
    """transformers' greedy continuation of IDS (one image token, expanded here) on its processor's pixels."""
    _, llm, model, processor = llava
    assert ids.count(IMAGE_TOKEN) == 1
    expanded = [t for i in ids for t in ([i] * TOKENS if i == IMAGE_TOKEN else [i])]
    pixels = processor(Image.open(io.BytesIO(image)), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        # the word tokenizer reads the template's words as w0 (= pad): the mask must not drop them
        out = model.generate(torch.tensor([expanded]), attention_mask=torch.ones(1, len(expanded), dtype=torch.long),
                             pixel_values=pixels, do_sample=False, max_new_tokens=STEPS, pad_token_id=0)
    return llm.tokenizer.decode(out[0, len(expanded):].tolist())


def test_openai_chat_with_an_image_part_equals_transformers(llava):
    server, llm = llava[0], llava[1]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    answer = client.chat.completions.create(model="engine", max_tokens=STEPS, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "w7 w8 "},
                                     {"type": "image_url", "image_url": {"url": data_url(png(1))}}]}])
    # the server's layout: the text part, then the image token and a newline where the image part is
    ids = llm.encode_chat([{"role": "user", "content": "w7 w8 w300\n"}])
    assert answer.choices[0].message.content.split() == hf_text(llava, ids, png(1)).split()
    assert answer.usage.prompt_tokens == len(ids) - 1 + TOKENS


def test_tgi_generate_with_a_markdown_image_equals_transformers(llava):
    server, llm = llava[0], llava[1]
    reply = httpx.post(f"{server.url}/generate", timeout=60, json={
        "inputs": f"w7 ![]({data_url(png(2))}) w8", "parameters": {"max_new_tokens": STEPS}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["generated_text"].split() == hf_text(llava, llm.encode("w7 w300 w8"), png(2)).split()


def test_bad_images_are_400s_naming_the_problem(llava):
    server = llava[0]
    cases = [("https://example.com/cat.png", "image URLs are not fetched"),
             ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "not an image Pillow can read"),
             ("data:image/png;base64,@@@", "not valid base64")]
    for url, message in cases:
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "engine", "max_tokens": 2, "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
        assert reply.status_code == 400 and message in reply.json()["error"]["message"], reply.text
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200


def solid_png(width: int, height: int) -> bytes:
    """A one-colour PNG: many pixels in few bytes."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


def test_image_limit_flags_refuse_with_a_400_naming_the_limit_and_the_flag(llava):
    """serve --limit-mm-per-prompt (vLLM's JSON), --max-image-bytes, --max-image-pixels: a request over one is a 400
    that names it and its flag; one within them is answered; a bad flag value is one line, exit 2."""
    engine = llava[1].engine.path
    small, many_pixels, many_bytes = solid_png(40, 40), solid_png(50, 50), png(5)  # 1600 px; 2500 px; 1920 px
    assert len(small) < 3000 and len(many_pixels) < 3000 < len(many_bytes)

    def chat(server, *images: bytes) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "engine", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "w7"},
                *({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images)]}]})

    with live_server(engine, "--limit-mm-per-prompt", '{"image": 1}', "--max-image-bytes", "3000",
                     "--max-image-pixels", "2000") as server:
        cases = [((small, small), "2 images in one request; at most 1 are taken (--limit-mm-per-prompt)"),
                 ((many_bytes,), "above the limit of 3000 bytes (--max-image-bytes)"),
                 ((many_pixels,), "50x50 pixels; at most 2000 pixels are taken (--max-image-pixels)")]
        for images, message in cases:
            reply = chat(server, *images)
            assert reply.status_code == 400 and message in reply.json()["error"]["message"], reply.text
        assert chat(server, small).status_code == 200
        reply = httpx.post(f"{server.url}/generate", timeout=60, json={  # TGI's shape of the same refusal
            "inputs": f"![]({data_url(small)}) ![]({data_url(small)}) w7", "parameters": {"max_new_tokens": 2}})
        assert reply.status_code == 422 and "(--limit-mm-per-prompt)" in reply.json()["error"], reply.text
    assert_user_error(trtbuild("serve", engine, "--limit-mm-per-prompt", '{"image": "two"}'),
                      "--limit-mm-per-prompt", "whole number")
    assert_user_error(trtbuild("serve", engine, "--limit-mm-per-prompt", "image=2"), '{"image": 4}')


def test_a_text_only_server_refuses_image_parts(tiny_serve_engine):
    with live_server(tiny_serve_engine) as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "engine", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "w5"}, {"type": "image_url", "image_url": {"url": data_url(png(3))}}]}]})
    assert reply.status_code == 400 and "takes no images" in reply.json()["error"]["message"], reply.text


def test_chat_with_an_image_command(llava, tmp_path):
    """`trtbuild chat`'s /image PATH goes with the next message: the first answer is transformers' for that turn; the
    second turn keeps the image in the prompt and reuses its KV blocks (ChatSession, as the REPL drives it)."""
    llm = llava[1]
    path = tmp_path / "cat.png"
    path.write_bytes(png(4))
    proc = trtbuild("chat", llm.engine.path, "--max-new-tokens", str(STEPS), "--temperature", "0",
                    stdin=f"/image {path}\nw7 w8\nw9\n")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    ids = llm.encode_chat([{"role": "user", "content": "w300\nw7 w8"}])
    assert first.split() == hf_text(llava, ids, png(4)).split()
    session = ChatSession(llm, params=llm.default_params(max_new_tokens=STEPS, temperature=0))
    assert "".join(session.send("w7 w8", [str(path)])).split() == first.split()
    assert "".join(session.send("w9")).split() == second.split()
    assert session.last.reused_tokens >= TOKENS  # the image's blocks came back from the cache
