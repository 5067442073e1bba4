"""tools/quant_accuracy.py's metrics (the models themselves run only in
``make quant-accuracy``): log-prob differences, perplexities, greedy agreement."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("quant_accuracy",
                                                  REPO / "tools/quant_accuracy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_metrics_of_a_run_against_its_reference() -> None:
    qa = _tool()
    n = qa.GREEDY_TOKENS
    ref = {"passage_logprobs": [[-1.0, -2.0], [-3.0]],
           "greedy": [list(range(n)), list(range(n)), list(range(n))]}
    got = {"logprobs": [[-1.5, -2.0], [-2.0]],
           "greedy": [list(range(n)), [0, 1, 9] + [0] * (n - 3), [0, 1, 2]],
           "int8_layers": 3, "layers": 4, "kernels": ["x86"]}
    m = qa._metrics(got, ref)
    assert m["tokens"] == 3
    assert m["mean_abs_dlogprob"] == pytest.approx(0.5)
    assert m["max_abs_dlogprob"] == pytest.approx(1.0)
    assert m["ppl"] == pytest.approx(math.exp(5.5 / 3))
    assert m["ref_ppl"] == pytest.approx(math.exp(2.0))
    # The third stopped at EOS after three equal tokens: equal over its length.
    assert (m["greedy_equal"], m["mean_common_prefix"]) == (2, (n + 2 + 3) / 3)


def test_schemes_fit_the_default_models_widths() -> None:
    qa = _tool()
    for _, scheme in qa.SCHEMES.values():
        group = scheme["weights"].get("group_size")
        assert group is None or (576 % group == 0 and 1536 % group == 0)
