"""The OpenAI client against `trtbuild serve`: a chat completion, then the same question streamed.

Starts `trtbuild serve ENGINE_DIR --port 0` as a subprocess (the port the OS picks is in the URL it prints
on stdout once it accepts connections), or uses a running server with --base-url. The model name is the
server's own (GET /v1/models: the engine dir's name, or serve's --model-name). tools.py reuses `served()`.

    .venv/bin/python examples/openai_client.py build/demo/smollm2-engine
    .venv/bin/trtbuild serve build/demo/smollm2-engine --port 8000 &
    .venv/bin/python examples/openai_client.py --base-url http://127.0.0.1:8000
"""

import argparse
import contextlib
import subprocess
import sys
import tempfile

from openai import OpenAI


@contextlib.contextmanager
def served(engine_dir, base_url=None):
    """An OpenAI client of BASE_URL, or of a `trtbuild serve ENGINE_DIR` started here and stopped at the end."""
    if base_url:
        yield OpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="unused")
        return
    log = tempfile.TemporaryFile("w+")                                # its access log; stdout: its URL
    server = subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "serve", str(engine_dir), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=log, text=True)   # the trtbuild of this Python
    try:
        line = server.stdout.readline()                               # "serving at http://127.0.0.1:PORT"
        if not line.startswith("serving at "):
            log.seek(0)
            sys.exit(f"trtbuild serve did not start (exit {server.wait()}): {log.read()[-2000:]}")
        yield OpenAI(base_url=f"{line.split()[-1]}/v1", api_key="unused")
    finally:
        server.terminate()                                            # SIGTERM: a graceful stop
        server.wait(60)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine_dir", nargs="?", help="an engine dir to serve (or give --base-url)")
    parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if not (args.engine_dir or args.base_url):
        parser.error("give ENGINE_DIR or --base-url")

    with served(args.engine_dir, args.base_url) as client:
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": args.prompt}]
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                               temperature=0)
        choice = reply.choices[0]
        print(f"{model}: {choice.message.content}")
        print(f"[finish_reason={choice.finish_reason}, {reply.usage.prompt_tokens} prompt + "
              f"{reply.usage.completion_tokens} completion tokens]")

        print("streamed: ", end="", flush=True)
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                                    temperature=0, stream=True):
            if chunk.choices:
                print(chunk.choices[0].delta.content or "", end="", flush=True)
        print()
