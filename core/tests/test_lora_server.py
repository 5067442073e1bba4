"""LoRA adapters in ``glowlm serve``, driven by the official openai client over HTTP.

One real server of the tiny llama serves two PEFT adapters made by peft itself
(``--lora-modules``, ranks 8 and 16, attention and MLP targets), with runtime
updates on (``GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1``) and an API key. Greedy
completions and chat completions on each adapter must be transformers + peft's
greedy tokens for that adapter, base requests the base model's, also when requests
for both adapters and the base run at once. Expected text is the reference tokens
decoded by the engine's own incremental detokenizer, and each token's text is
compared too (completions' ``logprobs.tokens``), so a single wrong token shows.

A second server (no runtime updates) checks the refusal; start-up refusals (a
broken adapter, a rank above ``--max-lora-rank``, ``-dp 2``) are servers that
must exit with one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from glowlm.engine.detokenizer import IncrementalDetokenizer
from glowlm.testing.server import ServerProcess, start_server, stop_server
from glowlm.testing.tiny_lora import ATTENTION, MLP, make_peft_adapter, peft_greedy

MODEL = "tiny"
KEY = "lora-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [[5, 17, 99, 3, 42, 7, 250, 11], [300, 12, 8, 77]]
TOKENS = 10
EXACT = {"ignore_eos": True}
MESSAGES = [{"role": "user", "content": "write a query"}]
#: Adapters the server starts with, then the one loaded at run time.
STARTUP = ("sql", "json")
RUNTIME = "extra"


@pytest.fixture(scope="module")
def llama(tiny_model_dir: Any) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def adapters(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-server")
    targets = ATTENTION + MLP
    return {
        "sql": make_peft_adapter(llama, root / "sql", r=8, alpha=16, targets=targets, seed=1),
        "json": make_peft_adapter(llama, root / "json", r=16, alpha=8, targets=targets,
                                  seed=2),
        RUNTIME: make_peft_adapter(llama, root / RUNTIME, r=8, alpha=16,
                                   targets=["q_proj", "v_proj", "down_proj"], seed=3),
        "r32": make_peft_adapter(llama, root / "r32", r=32, targets=["q_proj"], seed=4),
    }


@pytest.fixture(scope="module")
def references(llama: Path, adapters: dict[str, Path]) -> dict[str, list[list[int]]]:
    """transformers + peft greedy tokens of every prompt, per adapter and the base."""
    out = {name: peft_greedy(llama, adapters[name], PROMPTS, TOKENS)
           for name in (*STARTUP, RUNTIME)}
    out[MODEL] = peft_greedy(llama, None, PROMPTS, TOKENS)
    for name in (*STARTUP, RUNTIME):
        assert out[name] != out[MODEL], f"{name}: the adapter changes nothing"
    return out


@pytest.fixture(scope="module")
def tokenizer(llama: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llama))


@pytest.fixture(scope="module")
def server(llama: Path, adapters: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("lora-server-log") / "server.log"
    json_module = json.dumps({"name": "json", "path": str(adapters["json"]),
                              "base_model_name": "tiny-base"})
    srv = start_server(llama, log, "--block-size", "32", "--served-model-name", MODEL,
                       "--api-key", KEY, "--enable-lora",
                       "--lora-modules", f"sql={adapters['sql']}", json_module,
                       "--max-loras", "2", "--max-lora-rank", "16",
                       env={"GLOWLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def post(server: ServerProcess, path: str, body: dict[str, Any],
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60,
                      headers=AUTH if headers is None else headers)


def decoded(tokenizer: Any, prompt: list[int], ids: list[int]) -> str:
    """The text the engine streams for ``ids`` after ``prompt`` (its own detokenizer)."""
    detok = IncrementalDetokenizer(tokenizer, prompt)
    return "".join(detok.add(t) for t in ids) + detok.flush()


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token alone, as the server's logprobs spell it."""
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def complete(client: openai.OpenAI, model: str, prompt: list[int]) -> Any:
    return client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                     temperature=0, logprobs=0, extra_body=EXACT)


def check_completion(out: Any, model: str, tokenizer: Any, prompt: list[int],
                     want: list[int]) -> None:
    assert out.model == model
    choice = out.choices[0]
    assert choice.logprobs.tokens == token_texts(tokenizer, want), model
    assert choice.text == decoded(tokenizer, prompt, want), model
    assert out.usage.completion_tokens == TOKENS


def model_ids(client: openai.OpenAI) -> list[str]:
    return [m.id for m in client.models.list().data]


# -- adapters from --lora-modules ------------------------------------------------------


def test_models_list_adapters_with_parent(client: openai.OpenAI, adapters: dict[str, Path],
                                          llama: Path) -> None:
    cards = {m.id: m.model_dump() for m in client.models.list().data}
    assert list(cards)[:3] == [MODEL, "sql", "json"]
    assert cards[MODEL]["parent"] is None and cards[MODEL]["root"] == str(llama)
    assert cards["sql"]["root"] == str(adapters["sql"]) and cards["sql"]["parent"] == MODEL
    assert cards["json"]["parent"] == "tiny-base"  # the JSON form's base_model_name
    assert all(c["object"] == "model" for c in cards.values())
    one = client.models.retrieve("sql").model_dump()
    assert one["id"] == "sql" and one["root"] == str(adapters["sql"])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-adapter")


@pytest.mark.parametrize("model", [MODEL, *STARTUP])
def test_greedy_completions_match_peft(client: openai.OpenAI, tokenizer: Any,
                                       references: dict[str, list[list[int]]],
                                       model: str) -> None:
    for prompt, want in zip(PROMPTS, references[model], strict=True):
        check_completion(complete(client, model, prompt), model, tokenizer, prompt, want)


def test_stream_on_an_adapter(client: openai.OpenAI, tokenizer: Any,
                              references: dict[str, list[list[int]]]) -> None:
    prompt, want = PROMPTS[0], references["json"][0]
    chunks = list(client.completions.create(model="json", prompt=prompt, max_tokens=TOKENS,
                                            temperature=0, stream=True, extra_body=EXACT))
    assert {c.model for c in chunks} == {"json"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == \
        decoded(tokenizer, prompt, want)


def test_chat_on_an_adapter(server: ServerProcess, client: openai.OpenAI, tokenizer: Any,
                            llama: Path, adapters: dict[str, Path]) -> None:
    ids = post(server, "/tokenize", {"model": "sql", "messages": MESSAGES}).json()["tokens"]
    want = peft_greedy(llama, adapters["sql"], [ids], TOKENS)[0]
    text = decoded(tokenizer, ids, want)
    args: dict[str, Any] = dict(model="sql", messages=MESSAGES, max_tokens=TOKENS,
                                temperature=0, extra_body=EXACT)
    out = client.chat.completions.create(**args)
    assert out.model == "sql" and out.choices[0].message.content == text
    chunks = list(client.chat.completions.create(**args, stream=True))
    assert {c.model for c in chunks} == {"sql"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_adapters_and_base_at_once(client: openai.OpenAI, tokenizer: Any,
                                   references: dict[str, list[list[int]]]) -> None:
    """Both adapters and the base in flight together (threads): each its own tokens."""
    jobs = [(model, i) for model in (MODEL, *STARTUP) for i in range(len(PROMPTS))] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: complete(client, job[0], PROMPTS[job[1]]), jobs))
    for (model, i), out in zip(jobs, outs, strict=True):
        check_completion(out, model, tokenizer, PROMPTS[i], references[model][i])


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="sql"):  # the message lists the names
        client.completions.create(model="sq1", prompt=PROMPTS[0], max_tokens=2)


# -- runtime load and unload -----------------------------------------------------------


def test_runtime_load_use_unload(server: ServerProcess, client: openai.OpenAI,
                                 tokenizer: Any, adapters: dict[str, Path],
                                 references: dict[str, list[list[int]]]) -> None:
    r = post(server, "/v1/load_lora_adapter",
             {"lora_name": RUNTIME, "lora_path": str(adapters[RUNTIME])})
    assert r.status_code == 200, r.text
    assert RUNTIME in r.text and "Success" in r.text
    card = client.models.retrieve(RUNTIME).model_dump()
    assert card["parent"] == MODEL and card["root"] == str(adapters[RUNTIME])
    assert model_ids(client)[-1] == RUNTIME
    for prompt, want in zip(PROMPTS, references[RUNTIME], strict=True):
        check_completion(complete(client, RUNTIME, prompt), RUNTIME, tokenizer, prompt, want)
    r = post(server, "/v1/unload_lora_adapter", {"lora_name": RUNTIME})
    assert r.status_code == 200, r.text
    assert RUNTIME in r.text and "Success" in r.text
    assert RUNTIME not in model_ids(client)
    with pytest.raises(openai.NotFoundError):
        complete(client, RUNTIME, PROMPTS[0])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(RUNTIME)


def test_unload_while_a_request_runs(server: ServerProcess, client: openai.OpenAI,
                                     tokenizer: Any, adapters: dict[str, Path],
                                     references: dict[str, list[list[int]]]) -> None:
    """The running stream finishes on the adapter; the name is gone at once."""
    name, total = "extra-long", 400
    r = post(server, "/v1/load_lora_adapter",
             {"lora_name": name, "lora_path": str(adapters[RUNTIME])})
    assert r.status_code == 200, r.text
    stream = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=total,
                                       temperature=0, stream=True, extra_body=EXACT,
                                       stream_options={"include_usage": True})
    first = next(iter(stream))
    assert first.model == name
    r = post(server, "/v1/unload_lora_adapter", {"lora_name": name})
    assert r.status_code == 200, r.text
    assert name not in model_ids(client)
    with pytest.raises(openai.NotFoundError):
        complete(client, name, PROMPTS[0])
    rest = list(stream)
    text = "".join(c.choices[0].text for c in [first, *rest] if c.choices)
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == total
    assert text.startswith(decoded(tokenizer, PROMPTS[1], references[RUNTIME][1]))


def test_bad_updates_are_400_and_the_server_serves_on(
        server: ServerProcess, client: openai.OpenAI, tokenizer: Any, tmp_path: Path,
        adapters: dict[str, Path], references: dict[str, list[list[int]]]) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": str(tmp_path / "no")},
         "does not exist"),
        ("/v1/load_lora_adapter", {"lora_name": "big", "lora_path": str(adapters["r32"])},
         "--max-lora-rank 16"),
        ("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapters[RUNTIME])},
         "already"),
        ("/v1/load_lora_adapter", {"lora_name": MODEL, "lora_path": str(adapters[RUNTIME])},
         "base model"),
        ("/v1/load_lora_adapter", {"lora_name": "x"}, "lora_path"),
        ("/v1/load_lora_adapter", {"lora_name": "", "lora_path": str(adapters[RUNTIME])},
         "lora_name"),
        ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, "no LoRA adapter named"),
        ("/v1/unload_lora_adapter", {}, "lora_name"),
    ]
    for path, body, message in cases:
        r = post(server, path, body)
        assert r.status_code == 400, (path, body, r.status_code, r.text)
        assert message in r.json()["error"]["message"], (path, body, r.text)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "broken", "lora_path": str(broken)})
    assert r.status_code == 400 and "broken" in r.json()["error"]["message"], r.text
    assert model_ids(client)[:3] == [MODEL, *STARTUP]
    assert not {"gone", "big", "broken", "x"} & set(model_ids(client))
    for model in (MODEL, "sql"):
        check_completion(complete(client, model, PROMPTS[0]), model, tokenizer, PROMPTS[0],
                         references[model][0])


def test_lora_routes_need_the_key(server: ServerProcess, adapters: dict[str, Path]) -> None:
    for path, body in (("/v1/load_lora_adapter", {"lora_name": "k", "lora_path":
                                                  str(adapters[RUNTIME])}),
                       ("/v1/unload_lora_adapter", {"lora_name": "sql"})):
        r = post(server, path, body, headers={})
        assert r.status_code == 401, (path, r.text)
    assert "k" not in [m["id"] for m in httpx.get(server.url + "/v1/models",
                                                  headers=AUTH).json()["data"]]


def test_openapi_lists_the_lora_routes(server: ServerProcess) -> None:
    paths = httpx.get(server.url + "/openapi.json", headers=AUTH).json()["paths"]
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        op = paths[path]["post"]
        assert set(op["responses"]["200"]["content"]) == {"text/plain"}
        assert {"400", "401", "404"} <= set(op["responses"])


# -- refusals --------------------------------------------------------------------------


def test_runtime_updates_off_without_the_variable(llama: Path, adapters: dict[str, Path],
                                                   tmp_path: Path) -> None:
    srv = start_server(llama, tmp_path / "server.log", "--block-size", "32",
                       "--served-model-name", MODEL, "--enable-lora",
                       "--lora-modules", f"sql={adapters['sql']}",
                       env={"GLOWLM_ALLOW_RUNTIME_LORA_UPDATING": "0"})
    try:
        r = post(srv, "/v1/load_lora_adapter",
                 {"lora_name": RUNTIME, "lora_path": str(adapters[RUNTIME])}, headers={})
        assert r.status_code == 404, r.text
        assert "GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1" in r.json()["error"]["message"]
        r = post(srv, "/v1/unload_lora_adapter", {"lora_name": "sql"}, headers={})
        assert r.status_code == 404, r.text
        ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert ids == [MODEL, "sql"]  # nothing was loaded, nothing unloaded
    finally:
        stop_server(srv)


def _start_fails(llama: Path, log: Path, *args: str) -> str:
    """The error line of a server that must exit at start-up."""
    with pytest.raises(RuntimeError, match="server exited with 2"):
        start_server(llama, log, "--block-size", "32", *args, timeout=120)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("glowlm: error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_bad_adapter_at_start_is_one_line(llama: Path, adapters: dict[str, Path],
                                          tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    line = _start_fails(llama, tmp_path / "a.log", "--lora-modules", f"nope={missing}")
    assert f"--lora-modules nope={missing}" in line and "does not exist" in line
    # A rank above --max-lora-rank is found when the adapter meets the model (after it
    # loaded): still one line.
    line = _start_fails(llama, tmp_path / "b.log", "--lora-modules",
                        f"big={adapters['r32']}", "--max-lora-rank", "16")
    assert "--lora-modules big=" in line and "--max-lora-rank" in line
    line = _start_fails(llama, tmp_path / "c.log", "--served-model-name", MODEL,
                        "--lora-modules", f"{MODEL}={adapters['sql']}")
    assert "also a served model name" in line


def test_data_parallel_with_lora_is_refused(llama: Path, adapters: dict[str, Path],
                                            tmp_path: Path) -> None:
    line = _start_fails(llama, tmp_path / "dp.log", "-dp", "2",
                        "--lora-modules", f"sql={adapters['sql']}")
    assert "-dp 2" in line and "not supported" in line
