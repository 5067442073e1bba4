#!/usr/bin/env python3
"""Train glowlm's embedded default model: a small Llama-architecture
code-completion model on the Python standard library's own .py sources.

Everything is deterministic from --seed (file order is sorted, the held-out
set is fixed, batches come from a seeded permutation of fixed-size chunks).

Pipeline
  1. collect sorted *.py files under sysconfig.get_paths()["stdlib"]
     (any path with a "site-packages" component is excluded);
     file i (0-based index in that sorted list) is HELD OUT iff i % 50 == 0.
  2. train a byte-level BPE tokenizer (vocab 8192, specials <s>=0, </s>=1,
     <unk>=2) on the training files only.
  3. tokenize training files, pack them as  doc1 </s> doc2 </s> ...  (cached
     in the work dir), cut into non-overlapping chunks of ctx+1 tokens and
     visit them in a seeded random order.
  4. train transformers.LlamaForCausalLM in fp32 with AdamW, linear warmup
     then cosine decay to 10% of the peak LR, for a wall-clock budget
     (--max-minutes, measured from process start, summed over resumes).
     The number of optimizer steps (which the cosine schedule needs) is
     chosen from the throughput measured during the first minute.
  5. every --ckpt-minutes: save a resumable checkpoint in the work dir AND
     write the HF model directory (bf16) so intermediate models are usable.

Run with ONE thread:
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAYON_NUM_THREADS=1 \
      .venv/bin/python tools/train_default_model.py --max-minutes 70
Restarting the same command resumes from <work-dir>/ckpt.pt automatically
(use --fresh to start over).
"""
import argparse
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
    os.environ.setdefault(_v, "1" if _v != "TOKENIZERS_PARALLELISM" else "false")

# Imported only after the thread env vars above are set: numpy/torch read them at import time.
import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "core", "glowlm", "data", "default_model")
DEFAULT_WORK = os.path.join(REPO, ".train_work")
HELDOUT_MOD = 50

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "# {{ message['role'] }}: {{ message['content'] | replace('\\n', '\\n# ') }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}# assistant:{% endif %}"
)


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------- data ----
def stdlib_files():
    """Sorted list of (relative path, absolute path) of stdlib .py files."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "site-packages" and x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root), p))
    out.sort()
    return root, out


def split_files(files):
    train, held = [], []
    for i, (rel, p) in enumerate(files):
        (held if i % HELDOUT_MOD == 0 else train).append((rel, p))
    return train, held


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


# ------------------------------------------------------------ tokenizer ----
def train_tokenizer(train_files, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((read_text(p) for _, p in train_files), trainer=trainer,
                            length=len(train_files))
    assert (tok.token_to_id("<s>") == 0 and tok.token_to_id("</s>") == 1
            and tok.token_to_id("<unk>") == 2)
    return tok


def wrap_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(hf_tok, out_dir):
    hf_tok.save_pretrained(out_dir)
    # make sure the chat template also lives in tokenizer_config.json
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("chat_template") != CHAT_TEMPLATE:
        cfg["chat_template"] = CHAT_TEMPLATE
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
            f.write("\n")


# ---------------------------------------------------------------- model ----
def make_config(a):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=a.vocab_size, hidden_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        intermediate_size=a.intermediate, max_position_embeddings=1024,
        rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=0, eos_token_id=1, pad_token_id=None,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        initializer_range=0.02,
    )


def export_hf(model, hf_tok, out_dir, info, heldout_rel):
    """Write the HF model dir (bf16 weights) + tokenizer + metadata."""
    import copy

    from transformers import GenerationConfig

    os.makedirs(out_dir, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.bos_token_id, m.config.eos_token_id = 0, 1
    m.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, do_sample=False,
                                           max_length=1024)
    m.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(hf_tok, out_dir)
    with open(os.path.join(out_dir, "heldout_files.json"), "w") as f:
        json.dump({"stdlib_root_relative": True,
                   "rule": "sorted index of all stdlib .py files (site-packages excluded) "
                           f"% {HELDOUT_MOD} == 0",
                   "files": heldout_rel}, f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "training_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    del m


def lr_at(step, total, warmup, peak, min_ratio=0.1, time_frac=0.0):
    """Linear warmup, then cosine decay to min_ratio*peak.  Progress is the
    larger of the step fraction and the fraction of the wall-clock budget
    used, so the schedule still anneals fully if the (shared) CPU gets
    slower than measured in the first minute."""
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


# ----------------------------------------------------------------- main ----
def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--work-dir", default=DEFAULT_WORK)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--ctx", type=int, default=256, help="training context length")
    ap.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=70.0,
                    help="wall-clock budget from process start (summed over resumes); "
                         "training stops cleanly and saves")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="fix the number of steps "
                         "(0 = derive from throughput measured in the first minute)")
    ap.add_argument("--measure-seconds", type=float, default=60.0)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    a = ap.parse_args()

    t_proc = time.time()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    os.makedirs(a.work_dir, exist_ok=True)
    ckpt_path = os.path.join(a.work_dir, "ckpt.pt")
    log(f"[setup] torch {torch.__version__} threads={torch.get_num_threads()} seed={a.seed}")

    root, files = stdlib_files()
    train_files, held_files = split_files(files)
    heldout_rel = [r for r, _ in held_files]
    log(f"[data] stdlib={root} files={len(files)} train={len(train_files)} "
        f"heldout={len(held_files)}")

    # tokenizer (cached in work dir, keyed by file list + vocab size + seed)
    key = hashlib.sha256(
        json.dumps([[r for r, _ in train_files], a.vocab_size, a.seed]).encode()
    ).hexdigest()[:16]
    tok_path = os.path.join(a.work_dir, f"tokenizer-{key}.json")
    from tokenizers import Tokenizer
    if os.path.exists(tok_path):
        tok = Tokenizer.from_file(tok_path)
        log(f"[tok] loaded cached {tok_path}")
    else:
        t0 = time.time()
        tok = train_tokenizer(train_files, a.vocab_size)
        tok.save(tok_path)
        log(f"[tok] trained vocab={tok.get_vocab_size()} in {time.time()-t0:.1f}s")
    hf_tok = wrap_tokenizer(tok)

    # packed token stream
    ids_path = os.path.join(a.work_dir, f"train_ids-{key}.npy")
    if os.path.exists(ids_path):
        ids = np.load(ids_path)
        log(f"[tok] loaded cached corpus {ids_path}")
    else:
        t0 = time.time()
        parts, nbytes = [], 0
        for _, p in train_files:
            txt = read_text(p)
            nbytes += len(txt.encode("utf-8"))
            parts.append(np.asarray(tok.encode(txt).ids + [1], dtype=np.uint16))
        ids = np.concatenate(parts)
        np.save(ids_path, ids)
        log(f"[tok] corpus: {nbytes/1e6:.1f} MB -> {len(ids)/1e6:.2f}M tokens "
            f"({nbytes/len(ids):.2f} bytes/token) in {time.time()-t0:.1f}s")
    L = a.ctx + 1
    n_chunks = len(ids) // L
    chunks = torch.from_numpy(ids[: n_chunks * L].astype(np.int64)).view(n_chunks, L)
    perm_gen = torch.Generator().manual_seed(a.seed)
    perms = [torch.randperm(n_chunks, generator=perm_gen)]  # epoch 0; later epochs appended lazily

    def batch_for(step):
        start = step * a.batch
        while len(perms) <= (start + a.batch - 1) // n_chunks:
            perms.append(torch.randperm(n_chunks, generator=perm_gen))
        idx = [perms[(start + j) // n_chunks][(start + j) % n_chunks] for j in range(a.batch)]
        return chunks[torch.stack(idx)]

    # model
    from transformers import LlamaForCausalLM
    torch.manual_seed(a.seed)
    config = make_config(a)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[model] LlamaForCausalLM params={n_params:,} ({n_params/1e6:.2f}M) "
        f"hidden={a.hidden} layers={a.layers} heads={a.heads}/{a.kv_heads} "
        f"ffn={a.intermediate} ctx={a.ctx}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    step, total_steps, used_seconds, tokens_seen, loop_s_prev = 0, a.max_steps or 0, 0.0, 0, 0.0
    loss_hist = []
    if os.path.exists(ckpt_path) and not a.fresh:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, total_steps, used_seconds = ck["step"], ck["total_steps"], ck["used_seconds"]
        tokens_seen, loss_hist, loop_s_prev = ck["tokens_seen"], ck["loss_hist"], ck["loop_seconds"]
        torch.set_rng_state(ck["torch_rng"])
        log(f"[resume] step={step} total_steps={total_steps} used={used_seconds/60:.1f}min")

    budget = a.max_minutes * 60.0
    setup_s = time.time() - t_proc
    used_at_start = used_seconds + setup_s
    t_run = time.time()

    def elapsed_total():
        return used_at_start + (time.time() - t_run)

    def loop_seconds():
        return loop_s_prev + (time.time() - t_run)

    def save(final):
        t0 = time.time()
        st = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
              "total_steps": total_steps, "used_seconds": elapsed_total(),
              "tokens_seen": tokens_seen, "loss_hist": loss_hist[-200:],
              "loop_seconds": loop_seconds(),
              "torch_rng": torch.get_rng_state(), "args": vars(a)}
        torch.save(st, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)
        recent = loss_hist[-50:]
        info = {
            "status": "final" if final else "intermediate",
            "architecture": "LlamaForCausalLM",
            "params": n_params, "steps": step, "planned_steps": total_steps,
            "tokens_seen": tokens_seen, "train_minutes": round(elapsed_total() / 60, 2),
            "final_train_loss": round(float(np.mean(recent)), 4) if recent else None,
            "final_train_loss_note": "mean over the last 50 optimizer steps",
            "seed": a.seed, "ctx": a.ctx, "batch": a.batch, "peak_lr": a.lr,
            "warmup": a.warmup, "weight_decay": a.weight_decay, "threads": a.threads,
            "train_files": len(train_files), "heldout_files": len(held_files),
            "train_corpus_tokens": int(len(ids)),
            "tokens_per_second": round(tokens_seen / max(1e-9, loop_seconds()), 1),
            "tokens_per_second_note": "training-loop tokens / training-loop seconds "
                                      "(excludes tokenizer training and corpus tokenization)",
            "data": f"Python {sys.version_info[0]}.{sys.version_info[1]} standard library "
                    ".py files (site-packages excluded)",
            "heldout_rule": f"sorted index % {HELDOUT_MOD} == 0",
        }
        export_hf(model, hf_tok, a.out, info, heldout_rel)
        log(f"[ckpt] step={step} saved ckpt + HF dir "
            f"({'final' if final else 'intermediate'}) in {time.time()-t0:.1f}s")

    model.train()
    last_ckpt = time.time()
    t_measure0, step_measure0 = None, None
    ema = None
    t_log, tok_log = time.time(), 0
    log(f"[train] budget={a.max_minutes:.1f}min, already used {used_at_start/60:.1f}min; "
        f"batch={a.batch}x{a.ctx}")
    while True:
        if total_steps and step >= total_steps:
            break
        if elapsed_total() > budget - 30:  # leave ~30s for the final save
            log(f"[train] time budget reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps or 10**9, a.warmup, a.lr,
                            time_frac=elapsed_total() / (budget - 30) if total_steps else 0.0)
        x = batch_for(step)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                                 x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += a.batch * a.ctx
        tok_log += a.batch * a.ctx
        lv = loss.item()
        loss_hist.append(lv)
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv

        # pick the number of steps from throughput measured in the first minute
        if not total_steps:
            if step == 3:
                t_measure0, step_measure0 = time.time(), step
            elif t_measure0 and time.time() - t_measure0 >= a.measure_seconds:
                sps = (time.time() - t_measure0) / (step - step_measure0)
                remaining = budget - elapsed_total() - 60  # margin for checkpoints/final save
                total_steps = step + int(0.95 * remaining / sps)
                log(f"[plan] measured {sps:.2f}s/step = {a.batch*a.ctx/sps:.0f} tok/s "
                    f"-> total_steps={total_steps}")

        if step % a.log_every == 0 or step == 1:
            now = time.time()
            tps = tok_log / (now - t_log)
            t_log, tok_log = now, 0
            if total_steps:
                sps_now = (a.batch * a.ctx) / max(tps, 1e-9)
                eta = (total_steps - step) * sps_now
                eta_s = f"{eta/60:.1f}min"
            else:
                eta_s = "measuring"
            log(f"step {step}/{total_steps or '?'} loss {lv:.4f} ema {ema:.4f} "
                f"lr {opt.param_groups[0]['lr']:.2e} "
                f"tok/s {tps:.0f} elapsed {elapsed_total()/60:.1f}min ETA {eta_s}")
        if time.time() - last_ckpt > a.ckpt_minutes * 60:
            save(final=False)
            last_ckpt = time.time()
    save(final=True)
    log(f"[done] steps={step} tokens={tokens_seen:,} minutes={elapsed_total()/60:.1f} "
        f"final_loss(mean last 50)={np.mean(loss_hist[-50:]):.4f}")


if __name__ == "__main__":
    main()
