"""Models from the Hugging Face Hub, against a local server that speaks its API.

glowlm.testing.hub_server serves tiny random checkpoints and GGUF files over real
HTTP on 127.0.0.1; huggingface_hub downloads them as it would from the Hub
(HF_ENDPOINT), into a Hugging Face cache under the test's tmp dir (HF_HOME). Each
download is checked against loading the same files from a local directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from glowlm import LLM, SamplingParams
from glowlm.entrypoints.cli.main import main
from glowlm.errors import ModelLoadError
from glowlm.model_loader.hub import fetch
from glowlm.model_loader.resolve import resolve_model
from glowlm.testing.hub_server import TOKEN, HubServer
from glowlm.testing.tiny_gguf import write_tiny_gguf
from glowlm.testing.tiny_models import make_tiny_model

SMALL = dict(kv_cache_space_gib=0.02, block_size=32, show_progress=False, platform="generic")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [300, 12, 99, 4, 250] * 3]
JUNK = {
    "pytorch_model.bin": b"pickle" * 100,
    "onnx/model.onnx": b"onnx" * 100,
    "README.md": b"# tiny\n",
}


def _greedy(model: str, **kw) -> list[list[int]]:
    llm = LLM(model, **SMALL, **kw)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def hub():
    with HubServer() as server:
        yield server


@pytest.fixture(autouse=True)
def hf_env(hub, tmp_path, monkeypatch):
    """A fresh Hugging Face cache per test, the Hub at the local server, no token."""
    for name in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    hub.requests.clear()
    hub.heal()
    return tmp_path / "hf" / "hub"


@pytest.fixture(scope="module")
def published(hub, tmp_path_factory):
    """The repos every test reads: a checkpoint (with files glowlm must not fetch), two
    revisions of another, a gated one, a sharded one, and a repo of several GGUF files."""
    root = tmp_path_factory.mktemp("hub-repos")
    llama = make_tiny_model("llama", root / "llama")
    qwen2 = make_tiny_model("qwen2", root / "qwen2")
    hub.add_directory("acme/tiny-llama", llama, extra=JUNK)
    gguf_dir = root / "gguf"
    gguf_dir.mkdir()
    for qtype in ("Q4_0", "Q8_0", "F32"):
        write_tiny_gguf(qwen2, gguf_dir / f"tiny-qwen2-{qtype}.gguf", qtype)
    hub.add_directory("acme/tiny-qwen2-GGUF", gguf_dir, extra={"README.md": b"# gguf\n"})
    first = hub.add_directory("acme/tiny-revs", llama)
    second = hub.add_directory("acme/tiny-revs", qwen2, revision="v2")
    hub.add_directory("acme/gated", llama, gated=True)
    sharded = _shard(llama, root / "sharded")
    hub.add_directory("acme/tiny-sharded", sharded)
    return {
        "llama": llama,
        "qwen2": qwen2,
        "gguf": gguf_dir,
        "revs": (first, second),
        "sharded": sharded,
    }


def _shard(model_dir: Path, out: Path) -> Path:
    """``model_dir`` with its weights split in two safetensors shards and an index."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    (out / "model.safetensors").unlink()
    state = load_file(str(model_dir / "model.safetensors"))
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), 1):
        shard = f"model-0000{i}-of-00002.safetensors"
        save_file(
            {n: state[n].contiguous() for n in part}, str(out / shard), metadata={"format": "pt"}
        )
        weight_map.update(dict.fromkeys(part, shard))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return out


def test_download_serves_what_the_local_directory_gives(hub, published, hf_env, monkeypatch):
    want = _greedy(str(published["llama"]))
    assert _greedy("acme/tiny-llama") == want
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub.downloads()}
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert not fetched & {"pytorch_model.bin", "model.onnx", "README.md"}  # what glowlm reads
    snapshot = resolve_model("acme/tiny-llama").path
    assert hf_env in snapshot.parents  # the standard cache, under HF_HOME
    # Offline, from the cache: no request at all.
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _greedy("acme/tiny-llama") == want
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert _greedy("acme/tiny-llama", offline=True) == want
    assert hub.requests == []
    # Online again: the cached commit costs one request (the revision), no download.
    fetch("acme/tiny-llama")
    assert [r.path for r in hub.requests] == ["/api/models/acme/tiny-llama/revision/main"]


def test_offline_and_not_cached_is_todays_message(published, monkeypatch, hf_env):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as info:
        LLM("acme/tiny-llama", **SMALL)
    line = str(info.value)
    assert "\n" not in line and "hf download acme/tiny-llama" in line and str(hf_env) in line


def test_a_quant_tag_picks_one_gguf_file_of_the_repo(hub, published, hf_env):
    want = _greedy(str(published["gguf"] / "tiny-qwen2-Q4_0.gguf"))
    hub.requests.clear()
    assert _greedy("acme/tiny-qwen2-GGUF:Q4_0") == want
    assert [r.path.rsplit("/", 1)[-1] for r in hub.downloads()] == ["tiny-qwen2-Q4_0.gguf"]
    # Case-insensitive; --gguf-file names a file outright; the choice is pinned.
    assert fetch("acme/tiny-qwen2-GGUF", tag="q8_0").gguf_file == "tiny-qwen2-Q8_0.gguf"
    assert (
        fetch("acme/tiny-qwen2-GGUF", gguf_file="tiny-qwen2-F32.gguf").gguf_file
        == "tiny-qwen2-F32.gguf"
    )
    with pytest.raises(ModelLoadError, match="tiny-qwen2-Q5_0.gguf|Q5_0"):
        fetch("acme/tiny-qwen2-GGUF", tag="Q5_0", offline=True)  # no such file anywhere
    with pytest.raises(ModelLoadError, match="F32.gguf of acme/tiny-qwen2-GGUF is not in") as e:
        shutil.rmtree(hf_env / "models--acme--tiny-qwen2-GGUF")
        fetch("acme/tiny-qwen2-GGUF", tag="Q4_0")
        fetch("acme/tiny-qwen2-GGUF", tag="F32", offline=True)  # listed, not downloaded
    assert "online" in str(e.value)
    llm = LLM("acme/tiny-qwen2-GGUF:Q4_0", **SMALL)
    assert llm.config.gguf_file == "tiny-qwen2-Q4_0.gguf"
    assert llm.engine.setup.info.gguf_file.name == "tiny-qwen2-Q4_0.gguf"


@pytest.mark.parametrize(
    "spec, kw, words",
    [
        (
            "acme/tiny-qwen2-GGUF:Q5_K",
            {},
            ["matches :Q5_K", "tiny-qwen2-Q4_0.gguf", "tiny-qwen2-F32.gguf"],
        ),
        ("acme/tiny-qwen2-GGUF", {}, ["holds 3 GGUF files", ":QUANT", "--gguf-file"]),
        (
            "acme/tiny-qwen2-GGUF",
            {"gguf_file": "nope.gguf"},
            ["--gguf-file nope.gguf", "tiny-qwen2-Q8_0.gguf"],
        ),
    ],
)
def test_a_gguf_choice_that_is_not_one_file_is_one_line(hub, published, spec, kw, words):
    with pytest.raises(ModelLoadError) as info:
        LLM(spec, **SMALL, **kw)
    line = str(info.value)
    assert "\n" not in line and all(w in line for w in words), line
    assert hub.downloads() == []  # decided from the file list, before any byte


def test_a_gated_repo_names_the_token_to_set(hub, published, monkeypatch):
    with pytest.raises(ModelLoadError) as info:
        fetch("acme/gated")
    line = str(info.value)
    assert "\n" not in line and "acme/gated" in line and "HF_TOKEN" in line and "401" in line
    with pytest.raises(ModelLoadError, match="403") as info:
        fetch("acme/gated", token="hf_not_granted")
    assert "acme/gated" in str(info.value) and "\n" not in str(info.value)
    assert fetch("acme/gated", token=TOKEN).commit  # --hf-token / hf_token=
    shutil.rmtree(resolve_model("acme/gated").path.parent.parent)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert _greedy("acme/gated") == _greedy(str(published["llama"]))
    assert {r.token for r in hub.downloads()} == {TOKEN}


def test_an_unknown_id_or_revision_is_one_line(published):
    with pytest.raises(ModelLoadError) as info:
        LLM("acme/no-such-model", **SMALL)
    line = str(info.value)
    assert "\n" not in line and "acme/no-such-model" in line and "404" in line
    with pytest.raises(ModelLoadError, match="no revision 'v9'"):
        fetch("acme/tiny-llama", revision="v9")


def test_revisions_are_pinned(hub, published):
    first, second = published["revs"]
    assert fetch("acme/tiny-revs").commit == first
    got = fetch("acme/tiny-revs", revision="v2")
    assert got.commit == second
    assert json.loads((got.snapshot / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]
    llm = LLM("acme/tiny-revs", revision="v2", **SMALL)
    assert llm.config.revision == second  # the ranks and later look-ups read this commit
    assert _greedy("acme/tiny-revs", revision=second) == _greedy(str(published["qwen2"]))
    assert resolve_model("acme/tiny-revs", revision="v2").path.name == second


def test_no_network_uses_the_cache_else_one_line(published, monkeypatch):
    fetch("acme/tiny-llama")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert fetch("acme/tiny-llama").snapshot.is_dir()
    with pytest.raises(ModelLoadError) as info:
        fetch("acme/tiny-revs")
    line = str(info.value)
    assert "\n" not in line and "cannot reach the Hub at http://127.0.0.1:9" in line


def test_a_dropped_connection_resumes_and_the_model_loads(hub, published, monkeypatch):
    import huggingface_hub.constants

    # huggingface_hub writes whole 10 MiB chunks; tiny files need small ones to resume.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    hub.drop_once("acme/tiny-llama", "model.safetensors", after_bytes=100_000)
    assert _greedy("acme/tiny-llama") == _greedy(str(published["llama"]))
    gets = hub.downloads("/model.safetensors")
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range == f"bytes={6 * 16 * 1024}-"  # the whole chunks written before


def test_an_interrupted_download_is_never_loaded_and_continues(hub, published, monkeypatch, hf_env):
    """A connection that stays down: huggingface_hub retries, then gives up and removes
    the partial file (from version 1.x on it resumes within a run only); the snapshot
    holds the files that finished, is refused as a model, and the next start fetches
    only what is missing."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1024)
    shard = "model-00002-of-00002.safetensors"
    hub.drop_always("acme/tiny-sharded", shard, after_bytes=0, first_after=2500)
    with pytest.raises(ModelLoadError) as info:
        LLM("acme/tiny-sharded", **SMALL)
    assert "did not finish" in str(info.value) and "\n" not in str(info.value)
    assert len(hub.downloads(shard)) > 2  # retried, the second time from byte 2048
    assert hub.downloads(shard)[1].range == "bytes=2048-"
    # The snapshot has the index and shard 1: never taken for a model, online or not.
    for offline in (True, False):
        with pytest.raises(ModelLoadError) as info:
            resolve_model("acme/tiny-sharded") if offline else LLM(
                "acme/tiny-sharded", offline=True, **SMALL
            )
        assert "incomplete" in str(info.value) and shard in str(info.value)
    (listed,) = _models_json()["cached"]
    assert listed["id"] == "acme/tiny-sharded"
    (rev,) = listed["revision_list"]
    assert not rev["loadable"] and shard in rev["problem"]
    hub.heal()
    hub.requests.clear()
    assert _greedy("acme/tiny-sharded") == _greedy(str(published["llama"]))
    assert [r.path.rsplit("/", 1)[-1] for r in hub.downloads()] == [shard]


def _models_json() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["models", "--json"]) == 0
    return json.loads(out.getvalue())


def test_models_lists_and_deletes(published, capsys, monkeypatch, hf_env):
    import io

    fetch("acme/tiny-llama")
    fetch("acme/tiny-qwen2-GGUF", tag="Q8_0")
    fetch("acme/tiny-revs", revision="v2")
    listed = {m["id"]: m for m in _models_json()["cached"]}
    assert set(listed) == {"acme/tiny-llama", "acme/tiny-qwen2-GGUF", "acme/tiny-revs"}
    llama = listed["acme/tiny-llama"]
    assert llama["format"] == "safetensors" and llama["revisions"] == 1
    (rev,) = llama["revision_list"]
    on_disk = sum(f.stat().st_size for f in published["llama"].iterdir() if f.is_file())
    assert rev["loadable"] and rev["refs"] == ["main"] and rev["size_on_disk"] == on_disk
    gguf = listed["acme/tiny-qwen2-GGUF"]["revision_list"][0]
    assert gguf["loadable"] and gguf["gguf_files"] == ["tiny-qwen2-Q8_0.gguf"]
    assert listed["acme/tiny-revs"]["revision_list"][0]["refs"] == ["v2"]
    capsys.readouterr()
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "acme/tiny-llama  (safetensors, 1 revision(s)" in text
    assert "loadable: tiny-qwen2-Q8_0.gguf" in text and "main " in text
    # Deleting asks first; "no" (or end of input) keeps it, --yes does not ask.
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert main(["models", "--delete", "acme/tiny-llama"]) == 1
    assert "acme/tiny-llama" in {m["id"] for m in _models_json()["cached"]}
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["models", "--delete", "acme/tiny-llama"]) == 0
    assert main(["models", "--delete", "acme/tiny-revs", "--yes"]) == 0
    assert [m["id"] for m in _models_json()["cached"]] == ["acme/tiny-qwen2-GGUF"]
    assert not (hf_env / "models--acme--tiny-llama").exists()
    capsys.readouterr()
    assert main(["models", "--delete", "acme/absent"]) == 2
    err = capsys.readouterr().err
    assert "acme/absent" in err and "acme/tiny-qwen2-GGUF" in err


def test_local_checkpoints_never_touch_the_hub(hub, published):
    assert _greedy(str(published["llama"])) and hub.requests == []


def test_the_cli_flags_offline_and_hf_token(hub, published, capsys, monkeypatch):
    monkeypatch.setenv("GLOWLM_CPU_KVCACHE_SPACE", "0.02")
    gen = [
        "generate",
        "--prompt",
        "def",
        "--max-tokens",
        "2",
        "--platform",
        "generic",
        "--block-size",
        "32",
    ]
    assert main([gen[0], "acme/gated", *gen[1:], "--offline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "hf download acme/gated" in err and hub.requests == []
    assert main([gen[0], "acme/gated", *gen[1:]]) == 2
    assert "HF_TOKEN" in capsys.readouterr().err
    assert main([gen[0], "acme/gated", *gen[1:], "--hf-token", TOKEN]) == 0
    assert {r.token for r in hub.downloads()} == {TOKEN}


def test_a_mirror_without_a_tree_listing_downloads_file_by_file(published, monkeypatch):
    with HubServer(tree_listing=False) as mirror:
        mirror.add_directory("acme/tiny-llama", published["llama"], extra=JUNK)
        monkeypatch.setenv("HF_ENDPOINT", mirror.url)
        assert _greedy("acme/tiny-llama") == _greedy(str(published["llama"]))
        fetched = {r.path.rsplit("/", 1)[-1] for r in mirror.downloads()}
        assert "model.safetensors" in fetched and not fetched & set(JUNK)
        assert [r.path for r in mirror.requests if "/api/" in r.path][0].endswith("/revision/main")


def test_a_bare_hf_token_without_a_saved_login_is_one_line(published):
    with pytest.raises(ModelLoadError, match="saved, and there is none"):
        fetch("acme/gated", token=True)


QUANTS = [
    "m-Q4_K_M.gguf",
    "m-Q4_K_S.gguf",
    "m-q8_0.gguf",
    "mmproj-m-F16.gguf",
    "big/m-Q6_K-00001-of-00002.gguf",
    "big/m-Q6_K-00002-of-00002.gguf",
]


@pytest.mark.parametrize(
    "tag, explicit, want",
    [
        ("Q4_K_M", None, "m-Q4_K_M.gguf"),
        ("q8_0", None, "m-q8_0.gguf"),  # case-insensitive
        (None, None, "m-Q4_K_M.gguf"),  # llama-server's default
        (None, "m-Q4_K_S.gguf", "m-Q4_K_S.gguf"),
        ("Q4_K", None, "matches :Q4_K"),  # a whole word: not Q4_K_M / Q4_K_S
        ("F16", None, "matches :F16"),  # the mmproj file is not a model
        ("Q6_K", None, "split in 2 parts"),
    ],
)
def test_which_gguf_file_a_tag_names(tag, explicit, want):
    from glowlm.model_loader.hub_files import pick_gguf

    if want.endswith(".gguf"):
        assert pick_gguf(QUANTS, tag, explicit, "acme/m") == want
    else:
        with pytest.raises(ModelLoadError, match=want):
            pick_gguf(QUANTS, tag, explicit, "acme/m")


def test_which_files_a_checkpoint_needs():
    from glowlm.model_loader.hub_files import INDEX, plan_files

    repo = [
        "config.json",
        "tokenizer.json",
        "README.md",
        "consolidated.safetensors",
        INDEX,
        "model-00001-of-00002.safetensors",
        "original/params.json",
        "m-Q4_0.gguf",
    ]
    plan = plan_files(repo, where="acme/m")
    assert plan.files == ("config.json", "tokenizer.json", INDEX) and plan.index == INDEX
    assert plan_files(repo, tag="Q4_0").files == ("m-Q4_0.gguf",)
    with pytest.raises(ModelLoadError, match="--allow-pickle"):
        plan_files(["config.json", "pytorch_model.bin"], where="acme/m")
    assert plan_files(["config.json", "pytorch_model.bin"], allow_pickle=True).files == (
        "config.json",
        "pytorch_model.bin",
    )
