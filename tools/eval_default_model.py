#!/usr/bin/env python3
"""Evaluate glowlm's default model (core/glowlm/data/default_model/).

Figures (all on the held-out stdlib files listed in <model>/heldout_files.json):

(a) held-out perplexity: every held-out file is tokenized and followed by
    "</s>" exactly as in training; the files are concatenated in their listed
    order and cut into non-overlapping windows of --ctx tokens (default: the
    training context from training_info.json). Each window predicts its next
    --ctx tokens, so every token except the very first is scored exactly once
    with 0..ctx-1 tokens of context.  PPL = exp(mean token NLL).  Bits per
    UTF-8 byte of the same text is also reported (tokenizer-independent).
(b) unigram baseline: token frequencies counted on the TRAINING files (same
    tokenizer, same "</s>" separators), add-one smoothed over the whole vocab,
    scored on exactly the same target tokens as (a).
(c) completion parse rate.  Candidate functions: every (async) def in a
    held-out file that parses with ast, whose "def ...:" header is a single
    line, and whose body has at least one statement besides the docstring.
    Prompt = the header line + its docstring lines (if any), dedented so the
    def starts at column 0, ending with "\n".  Prompts longer than
    --max-prompt-tokens (128) are skipped so prompt + completion fits the
    training context.  At most --max-functions (100) are used, chosen with
    random.Random(0).sample and kept in source order.
    Token boundary: the byte-level BPE merges a newline with the following
    indentation ("\n   " is one token), so in training a lone "\n" token is
    almost always followed by a column-0 line.  The model is therefore fed
    the prompt WITHOUT its final "\n" (it generates the newline+indent token
    itself); the completion must start with "\n" (else it changed the prompt's
    last line and counts as a failure: "header_changed"), and that "\n" is
    removed again.  --keep-trailing-newline feeds the prompt as is (naive).
    Greedy generation of up to --max-new-tokens (128) new tokens, stopping at
    "</s>" or when a non-blank line starts at column 0 (the function ended).
    Rule: the completion is cut to its last complete line (text after the
    last "\n" is dropped) and at the first non-blank column-0 line.  It must
    contain at least one non-blank, non-comment line (otherwise it counts as
    a failure: "empty").  If generation hit the token limit and the last code
    line opens a block (ends with ":"), an indented "pass" is appended (only
    the block the limit cut off gets a body).  Success = ast.parse(prompt +
    completion) succeeds.  Nothing else is repaired (unclosed brackets or
    strings cut by the limit count as failures).

Run with one thread:
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python tools/eval_default_model.py --json eval.json
"""
import argparse
import ast
import json
import math
import os
import random
import sys
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Imported only after the thread env vars above are set: numpy/torch read them at import time.
import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# same file enumeration as training (importable only after the sys.path insert above)
from train_default_model import read_text, stdlib_files  # noqa: E402

DEFAULT_MODEL = os.path.join(REPO, "core", "glowlm", "data", "default_model")


def log(*a):
    print(*a, flush=True)


def encode(tok, text):
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------- perplexity ----
@torch.no_grad()
def heldout_nll(model, ids, ctx):
    """Sum of NLL (nats) and per-target NLL over non-overlapping windows."""
    x = torch.tensor(ids, dtype=torch.long)
    nlls = []
    for s in range(0, len(x) - 1, ctx):
        inp = x[s: s + ctx]
        tgt = x[s + 1: s + ctx + 1]
        inp = inp[: len(tgt)]
        logits = model(input_ids=inp[None]).logits[0].float()
        nlls.append(torch.nn.functional.cross_entropy(logits, tgt, reduction="none"))
    nll = torch.cat(nlls)
    return nll.double()


# ----------------------------------------------------- function prompts ----
def function_prompts(root, held_rel):
    cands = []
    for rel in held_rel:
        src = read_text(os.path.join(root, rel))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            header = lines[node.lineno - 1]
            body = node.body
            if body[0].lineno == node.lineno:  # one-liner "def f(): return x"
                continue
            if not header.rstrip().endswith(":") or not header.lstrip().startswith(
                ("def ", "async def ")
            ):
                continue  # multi-line signature or trailing comment
            has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                       and isinstance(body[0].value.value, str))
            rest = body[1:] if has_doc else body
            if not rest:
                continue
            end = body[0].end_lineno if has_doc else node.lineno
            chunk = "\n".join(lines[node.lineno - 1: end]) + "\n"
            indent = len(header) - len(header.lstrip())
            prompt = "\n".join(line[indent:] if line[:indent].strip() == "" else line.lstrip()
                               for line in chunk.splitlines()) + "\n"
            try:  # prompt + "pass" at the body's indentation must parse
                body_ind = " " * (rest[0].col_offset - indent)
                ast.parse(prompt + body_ind + "pass\n")
            except SyntaxError:
                continue
            ref = "\n".join(line[indent:] for line in lines[end: rest[-1].end_lineno]) + "\n"
            cands.append({"file": rel, "line": node.lineno, "name": node.name,
                          "has_docstring": has_doc, "prompt": prompt, "reference": ref})
    return cands


def clean_completion(text, hit_limit):
    """Apply the documented cutting rule; returns (completion, status)."""
    if "\n" not in text:
        text = ""
    else:
        text = text[: text.rfind("\n") + 1]
    out = []
    for line in text.splitlines():
        if line.strip() and not line[0].isspace():
            break  # function ended: a column-0 line
        out.append(line)
    code = [line for line in out if line.strip() and not line.strip().startswith("#")]
    if not code:
        return "", "empty"
    comp = "\n".join(out) + "\n"
    last = code[-1]
    if hit_limit and last.rstrip().endswith(":"):
        ind = len(last) - len(last.lstrip())
        comp += " " * (ind + 4) + "pass\n"
    return comp, "ok"


def generate(model, tok, prompt, max_new, strip_nl=True):
    """Greedy completion of prompt.

    Returns (text relative to prompt, hit_limit, n_new, header_ok)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    strip_nl = strip_nl and prompt.endswith("\n")
    fed = prompt[:-1] if strip_nl else prompt
    ids = torch.tensor([encode(tok, fed)], dtype=torch.long)
    n0 = ids.shape[1]

    class TopLevel(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            t = tok.decode(input_ids[0, n0:], skip_special_tokens=True)
            if strip_nl:
                if not t.startswith("\n"):
                    return torch.full((input_ids.shape[0],), bool(t), dtype=torch.bool)
                t = t[1:]
            # stop once a complete line starting at column 0 (non-blank) exists
            done = any(line.strip() and not line[0].isspace() for line in t.split("\n")[:-1])
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new,
                             do_sample=False, eos_token_id=1, pad_token_id=1,
                             stopping_criteria=StoppingCriteriaList([TopLevel()]))
    new = out[0, n0:].tolist()
    hit_eos = 1 in new
    if hit_eos:
        new = new[: new.index(1)]
    text = tok.decode(new, skip_special_tokens=True)
    hit_limit = (not hit_eos) and len(new) >= max_new
    header_ok = True
    if strip_nl:
        header_ok = text.startswith("\n")
        text = text[1:] if header_ok else ""
    return text, hit_limit, len(new), header_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=DEFAULT_MODEL)
    ap.add_argument("--ctx", type=int, default=0,
                    help="window length (0 = training ctx from training_info.json)")
    ap.add_argument("--max-functions", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show", type=int, default=3, help="print this many example completions")
    ap.add_argument("--keep-trailing-newline", action="store_true",
                    help="feed prompts with their final newline "
                         "(naive; see the token-boundary note above)")
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--skip-parse", action="store_true")
    ap.add_argument("--json", default="", help="write the figures to this JSON file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t_start = time.time()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).eval()
    info_path = os.path.join(a.model_dir, "training_info.json")
    info = json.load(open(info_path)) if os.path.exists(info_path) else {}
    ctx = a.ctx or info.get("ctx", 256)
    held = json.load(open(os.path.join(a.model_dir, "heldout_files.json")))["files"]
    root, files = stdlib_files()
    held_set = set(held)
    missing = [r for r in held if not os.path.exists(os.path.join(root, r))]
    if missing:
        log(f"warning: {len(missing)} held-out files missing in this Python's stdlib: "
            f"{missing[:5]}")
        held = [r for r in held if r not in missing]
    train_rel = [r for r, _ in files if r not in held_set]
    V = len(tok)
    res = {"model_dir": os.path.relpath(a.model_dir, REPO), "training_status": info.get("status"),
           "training_steps": info.get("steps"),
           "params": sum(p.numel() for p in model.parameters()),
           "heldout_files": len(held), "ctx": ctx}
    log(f"model {a.model_dir}: params={res['params']:,} vocab={V} status={info.get('status')} "
        f"steps={info.get('steps')} ctx={ctx} heldout_files={len(held)}")

    if not a.skip_ppl:
        t0 = time.time()
        ids, nbytes = [], 0
        for r in held:
            txt = read_text(os.path.join(root, r))
            nbytes += len(txt.encode("utf-8"))
            ids += encode(tok, txt) + [1]
        nll = heldout_nll(model, ids, ctx)
        ppl = math.exp(nll.mean().item())
        bpb = nll.sum().item() / math.log(2) / nbytes
        log(f"(a) held-out: {len(ids):,} tokens ({nbytes:,} bytes), {len(nll):,} scored; "
            f"PPL {ppl:.3f}  loss {nll.mean().item():.4f} nats/token  {bpb:.4f} bits/byte  "
            f"[{time.time()-t0:.0f}s]")
        # unigram baseline
        t0 = time.time()
        counts = np.zeros(V, dtype=np.int64)
        ntrain = 0
        for r in train_rel:
            tids = np.asarray(encode(tok, read_text(os.path.join(root, r))) + [1], dtype=np.int64)
            counts += np.bincount(tids, minlength=V)
            ntrain += len(tids)
        logp = np.log((counts + 1) / (ntrain + V))
        tgt = np.asarray(ids[1:], dtype=np.int64)
        uni_nll = -logp[tgt].mean()
        uni_ppl = math.exp(uni_nll)
        uni_bpb = -logp[tgt].sum() / math.log(2) / nbytes
        log(f"(b) unigram baseline (add-one, {ntrain:,} training tokens): PPL {uni_ppl:.3f}  "
            f"loss {uni_nll:.4f}  {uni_bpb:.4f} bits/byte  [{time.time()-t0:.0f}s]")
        res.update({"heldout_tokens": len(ids), "heldout_scored_tokens": len(nll),
                    "heldout_bytes": nbytes,
                    "heldout_ppl": round(ppl, 3), "heldout_loss_nats": round(nll.mean().item(), 4),
                    "heldout_bits_per_byte": round(bpb, 4), "unigram_train_tokens": ntrain,
                    "unigram_ppl": round(uni_ppl, 3), "unigram_loss_nats": round(float(uni_nll), 4),
                    "unigram_bits_per_byte": round(float(uni_bpb), 4)})

    if not a.skip_parse:
        t0 = time.time()
        cands = function_prompts(root, held)
        n_all = len(cands)
        cands = [c for c in cands if len(encode(tok, c["prompt"])) <= a.max_prompt_tokens]
        n_fit = len(cands)
        if len(cands) > a.max_functions:
            keep = sorted(random.Random(0).sample(range(len(cands)), a.max_functions))
            cands = [cands[i] for i in keep]
        n_ok, stats, examples = 0, {"empty": 0, "header_changed": 0, "hit_limit": 0,
                                   "parse_ok_hit_limit": 0, "with_docstring": 0,
                                   "parse_ok_with_docstring": 0}, []
        for i, c in enumerate(cands):
            text, hit_limit, n_new, header_ok = generate(model, tok, c["prompt"], a.max_new_tokens,
                                                          strip_nl=not a.keep_trailing_newline)
            comp, status = (clean_completion(text, hit_limit) if header_ok
                            else ("", "header_changed"))
            ok = False
            if status == "ok":
                try:
                    ast.parse(c["prompt"] + comp)
                    ok = True
                except SyntaxError:
                    pass
            else:
                stats[status] += 1
            n_ok += ok
            stats["hit_limit"] += hit_limit
            stats["parse_ok_hit_limit"] += ok and hit_limit
            stats["with_docstring"] += c["has_docstring"]
            stats["parse_ok_with_docstring"] += ok and c["has_docstring"]
            examples.append({"file": c["file"], "line": c["line"], "name": c["name"], "ok": ok,
                             "hit_limit": hit_limit, "prompt": c["prompt"], "completion": comp})
            if (i + 1) % 10 == 0:
                log(f"  [{i+1}/{len(cands)}] parse ok so far {n_ok}  ({time.time()-t0:.0f}s)")
        rate = n_ok / max(1, len(cands))
        log(f"(c) completions that parse: {n_ok}/{len(cands)} = {100*rate:.1f}%  "
            f"(candidates {n_all}, prompt<= {a.max_prompt_tokens} tokens {n_fit}; {stats})  "
            f"[{time.time()-t0:.0f}s]")
        for e in examples[: a.show]:
            log(f"---- {e['file']}:{e['line']} {e['name']} parse={'ok' if e['ok'] else 'FAIL'}\n"
                f"{e['prompt']}{e['completion']}")
        res.update({"functions_evaluated": len(cands), "functions_candidates": n_all,
                    "functions_prompt_fits": n_fit, "parse_ok": n_ok, "parse_rate": round(rate, 4),
                    "parse_stats": stats, "max_new_tokens": a.max_new_tokens,
                    "max_prompt_tokens": a.max_prompt_tokens,
                    "prompt_trailing_newline_fed": bool(a.keep_trailing_newline)})
        if a.json:
            res["examples"] = examples

    # a fixed smoke prompt, fed with and without its final newline
    for key, p in (("fibonacci_sample", "def fibonacci(n):\n"),
                   ("fibonacci_sample_no_newline", "def fibonacci(n):")):
        ids = torch.tensor([encode(tok, p)])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=64,
                                 do_sample=False, eos_token_id=1, pad_token_id=1)
        sample = tok.decode(out[0], skip_special_tokens=True)
        log(f"greedy sample from {p!r}:\n{sample}\n----")
        res[key] = sample
    res["eval_seconds"] = round(time.time() - t_start, 1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        log(f"wrote {a.json}")


if __name__ == "__main__":
    main()
