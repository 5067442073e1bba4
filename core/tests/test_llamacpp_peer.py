"""The llama.cpp peer's checks, which must work where llama-cpp-python is absent.

The main venv never has llama-cpp-python (it is compiled into .venv-peers by
``make peers``), so what runs everywhere is argument validation and the one-line
error for the missing package; the API guard below runs only in the peers venv,
where it catches a llama-cpp-python upgrade that renamed what the peer calls.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # not installed
import llamacpp_peer  # noqa: E402


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def no_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now fails


@pytest.mark.usefixtures("no_llama_cpp")
def test_missing_package_says_how_to_build_it(gguf: Path) -> None:
    with pytest.raises(ImportError, match=r"make peers.*docs/peers\.md"):
        llamacpp_peer.llamacpp_latency(gguf, 128, 128, 32000, threads=2)
    with pytest.raises(ImportError, match="llama-cpp-python is not installed"):
        llamacpp_peer.llamacpp_throughput(gguf, 128, 128, 4, 32000, threads=2)


@pytest.mark.usefixtures("no_llama_cpp")
@pytest.mark.parametrize("bad", [{"threads": 0}, {"input_len": 0}, {"output_len": -1},
                                 {"iters": 0}, {"vocab": 2.5}])
def test_bad_arguments_fail_before_the_import(gguf: Path, bad: dict[str, float]) -> None:
    kwargs = {"input_len": 8, "output_len": 8, "vocab": 100, "threads": 1, "iters": 1} | bad
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a positive integer"):
        llamacpp_peer.llamacpp_latency(gguf, **kwargs)


@pytest.mark.usefixtures("no_llama_cpp")
def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        llamacpp_peer.llamacpp_throughput(tmp_path / "absent.gguf", 8, 8, 2, 100, threads=1)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python not installed (make peers)")
def test_llama_cpp_api_the_peer_uses() -> None:
    llama_cpp = llamacpp_peer.import_llama_cpp()
    for name in ("llama_get_logits_ith", "llama_get_logits", "llama_decode", "llama_batch_init",
                 "llama_batch_free", "llama_init_from_model", "llama_free",
                 "llama_context_default_params", "llama_max_parallel_sequences"):
        assert callable(getattr(llama_cpp, name)), name
    for name in ("eval", "reset", "close", "n_vocab", "ctx", "model"):
        assert hasattr(llama_cpp.Llama, name), name
    params = llama_cpp.llama_context_default_params()
    assert {"n_seq_max", "flash_attn_type", "type_k", "type_v"} <= {
        f[0] for f in type(params)._fields_}
