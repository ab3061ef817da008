"""GPU check at real size: a randomly initialised Qwen2.5-1.5B- (or 0.5B-) architecture model on one GPU, no network.

    python perf/gpu_check.py [--shape 1.5b|0.5b] [--steps 3] [--prompt-tokens N] [--out gpu_check.json]
    python perf/gpu_check.py --tiny --device cpu                    # the same code path on a CPU, in minutes

Prints (and writes as JSON):
1. Peak GPU memory of ONE scoring pass with gradient (forward + backward, bf16) of 8 completions x 2,048 tokens:
   chunked (``scoring_chunk_mb`` 256) vs the one-piece (B, T, V) logits (0), and chunked with a LoRA adapter.
2. A few `tepo` steps of the native loop (bench.engines.train) in bf16 for: full fine-tuning with and without chunked
   scoring, with activation checkpointing, and LoRA (r=16): peak GPU memory, seconds per step (median), rollout
   tokens/s and update tokens/s.
3. The same `tepo` steps with ``engine=trl`` (``--engine trl``: TRL's GRPOTrainer with pobench's loss, TRL's own HF
   generation, bf16 autocast): step seconds and tokens/s of the same batch, beside the native loop's.
4. The shared prefix: `full_chunked` (shared prefix on, the default) against `full_unshared` (``shared_prefix``
   off): step / update seconds, update tokens/s and verl's ``perf/throughput``. ``--prompt-tokens N`` puts a few-shot
   prefix before every question (as perf/step_vs_trl.py does) so that prompts are about N tokens long, where the
   shared prefix pays. Random weights give every completion reward 0, so every group has zero advantage: the native
   variants run with ``skip_zero_advantage`` off (the update does the work a run with informative groups does; the
   skip removes the zero-advantage fraction of it, measured on CPU: perf/step_profile.py).

On the H200 (no network, none of this project's dependencies but torch / transformers / accelerate / peft):
``bash perf/gpu_check.sh`` installs the wheels carried in ``.whl/`` (``bash perf/gpu_wheels.sh`` downloads
them here) and runs the native and TRL variants.

The model: the Qwen2.5-1.5B shape (hidden 1536, MLP 8960, 28 layers, 12 heads / 2 KV heads, vocabulary 151,936,
tied embeddings, 1.54B parameters; ``--shape 0.5b``: Qwen2.5-0.5B's hidden 896, MLP 4864, 24 layers, 14 heads / 2 KV
heads, 0.49B) as a Llama block with q/k/v biases (Qwen2's block; Llama's config puts the bias on o_proj too: hidden x
layers extra parameters), because the built-in character tokenizer only loads with a Llama folder (bench/model.py).
The tokenizer knows 98 ids: sampled ids beyond it decode to nothing, rewards are all 0, so the numbers measure memory
and speed only. Random weights rarely emit eos: completions run to max_new_tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree (no install needed)

QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151_936, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
                  attention_bias=True)
QWEN25_05B = dict(QWEN25_15B, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2)
SHAPES = {"1.5b": QWEN25_15B, "0.5b": QWEN25_05B}
TINY = dict(QWEN25_15B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def build_model_dir(root: Path, shape: dict) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from bench.model import build_char_tokenizer

    tok = build_char_tokenizer(model_max_length=shape["max_position_embeddings"])
    cfg = LlamaConfig(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      mlp_bias=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    out = root / "qwen2.5-shape"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters -> {out}", flush=True)
    return out


class Peak:
    """Peak device memory (GiB) above what was allocated on entry; RSS high-water mark on a CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_gib = torch.cuda.max_memory_allocated() / 2**30
            self.extra_gib = (torch.cuda.max_memory_allocated() - self.base) / 2**30
        else:
            import resource

            self.peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            self.extra_gib = float("nan")


def scoring_memory(model_dir: Path, device: str, batch: int, length: int) -> dict:
    from bench.engines.native.scale import apply_lora
    from bench.model import load_policy
    from bench.rollout.scoring import score

    model, _ = load_policy(str(model_dir), device, "bfloat16")
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts = torch.randint(3, 98, (batch, 128), generator=g).tolist()
    comps = torch.randint(3, V, (batch, length), generator=g).tolist()
    out = {}
    for name, chunk in (("chunked_256mb", 256.0), ("one_piece", 0.0)):
        with Peak(device) as p:
            t0 = time.perf_counter()
            lp, ent, mask = score(model, prompts, comps, grad=True, chunk_mb=chunk)
            (lp.sum() + ent.sum()).backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        del lp, ent, mask
        out[name] = {"peak_gib": p.peak_gib, "extra_gib": p.extra_gib, "seconds": secs}
        print(f"scoring {batch}x{length} {name}: {out[name]}", flush=True)
    model = apply_lora(model, 16, 32.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    with Peak(device) as p:
        lp, ent, mask = score(model, prompts, comps, grad=True, chunk_mb=256.0)
        (lp.sum() + ent.sum()).backward()
    out["lora16_chunked_256mb"] = {"peak_gib": p.peak_gib, "extra_gib": p.extra_gib}
    print(f"scoring {batch}x{length} lora16_chunked_256mb: {out['lora16_chunked_256mb']}", flush=True)
    del model, lp, ent, mask
    return out


def train_variant(model_dir: Path, root: Path, device: str, name: str, steps: int, prompts: int, group: int,
                  max_new: int, template: str = "auto", **fields) -> dict:
    from bench.config import TrainConfig
    from bench.engines import train

    per_step: list[dict] = []
    if fields.get("engine", "native") == "native":  # random weights: every group has zero advantage (module doc)
        fields = {"skip_zero_advantage": False, **fields}
    cfg = TrainConfig(model=str(model_dir), algo="tepo", dtype="bfloat16", device=device, steps=steps,
                      prompts_per_step=prompts, group_size=group, max_new_tokens=max_new, micro_batch_size=16,
                      prompt_template=template, eval_every=0, checkpoint_every=0, samples_every=0, lr=1e-6,
                      output_dir=str(root / "runs"), run_name=name, tracking_uri=f"sqlite:///{root}/mlflow.db",
                      experiment="gpu-check", **fields)
    with Peak(device) as p:
        train(cfg, on_step=lambda step, m: per_step.append(dict(m)))
    later = per_step[1:] or per_step  # the first step includes warm-up (kernels, allocator)
    tokens = prompts * group * max_new
    if not later:
        raise RuntimeError(f"{name}: no training step reported metrics")
    # (the TRL engine reports step and rollout times but no separate reference-scoring time: NaN where absent)
    med = {k: statistics.median(m.get(k, float("nan")) for m in later)
           for k in ("time/step_s", "time/rollout_s", "time/update_s", "time/scoring_s", "rollout/tokens_per_s",
                     "rollout/length_mean", "perf/throughput", "perf/total_num_tokens")}
    if med["time/update_s"] != med["time/update_s"]:  # NaN: the engine reports no update time
        med["time/update_s"] = med["time/step_s"] - med["time/rollout_s"]
    res = {"peak_gib": p.peak_gib, "step_s": med["time/step_s"], "rollout_s": med["time/rollout_s"],
           "ref_scoring_s": med["time/scoring_s"], "update_s": med["time/update_s"],
           "rollout_tokens_per_s": med["rollout/tokens_per_s"], "mean_completion_tokens": med["rollout/length_mean"],
           "update_tokens_per_s": med["rollout/length_mean"] * prompts * group / max(med["time/update_s"], 1e-9),
           "perf_throughput": med["perf/throughput"], "perf_total_num_tokens": med["perf/total_num_tokens"],
           "completions_per_step": prompts * group, "max_tokens_per_step": tokens, "fields": fields}
    print(f"train {name}: {json.dumps(res)}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, 2 layers (same vocabulary): a CPU dry run")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b", help="the Qwen2.5 size whose shape is built")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="a few-shot prefix before every question, prompts of about N tokens (step_vs_trl.py's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--score-batch", type=int, default=8)
    ap.add_argument("--score-length", type=int, default=2048)
    ap.add_argument("--only", default="", help="comma-separated variants to run (default: all)")
    ap.add_argument("--skip-scoring", action="store_true", help="skip part 1 (the scoring-pass memory)")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()
    results: dict = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
                     "torch": torch.__version__, "args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = build_model_dir(root, TINY if args.tiny else SHAPES[args.shape])
        template = "auto"
        if args.prompt_tokens:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from step_vs_trl import prompt_template

            template = prompt_template(args.prompt_tokens, args.prompts)
        if not args.skip_scoring:
            results["scoring"] = scoring_memory(model_dir, args.device, args.score_batch, args.score_length)
        variants = {
            "full_chunked": {},
            "full_unshared": {"shared_prefix": False},  # the same steps without the shared prefix
            "full_one_piece": {"scoring_chunk_mb": 0.0},
            "full_chunked_ckpt": {"activation_checkpointing": True},
            "lora16_chunked": {"lora_rank": 16, "lora_alpha": 32.0},
            "lora16_chunked_ckpt": {"lora_rank": 16, "lora_alpha": 32.0, "activation_checkpointing": True},
            # TRL's GRPOTrainer with pobench's tepo loss; bf16 weights as above (TRL's own bf16 flag: autocast)
            "trl_full": {"engine": "trl", "engine_args": {"bf16": args.device.startswith("cuda")}},
        }
        only = [v for v in args.only.split(",") if v]
        results["train"] = {}
        for name, fields in variants.items():
            if only and name not in only:
                continue
            try:
                results["train"][name] = train_variant(model_dir, root, args.device, name, args.steps, args.prompts,
                                                       args.group, args.max_new_tokens, template, **fields)
            except torch.OutOfMemoryError as e:
                results["train"][name] = {"error": f"out of memory: {e}"[:300]}
                print(f"train {name}: out of memory", flush=True)
            except Exception as e:  # noqa: BLE001  (one GPU lease: record it and run the other variants)
                import traceback

                traceback.print_exc()
                results["train"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    mods = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names))
    results["imported"] = mods  # what the run needed beyond the standard library (checks the carried wheels)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    if "full_chunked" in results["train"] and "full_unshared" in results["train"]:
        on, off = results["train"]["full_chunked"], results["train"]["full_unshared"]
        if "step_s" in on and "step_s" in off:
            print(f"shared prefix on / off: step seconds {on['step_s']:.2f} / {off['step_s']:.2f}, update seconds "
                  f"{on['update_s']:.2f} / {off['update_s']:.2f}, update tokens/s {on['update_tokens_per_s']:.0f} / "
                  f"{off['update_tokens_per_s']:.0f}, perf/throughput {on['perf_throughput']:.0f} / "
                  f"{off['perf_throughput']:.0f}")
    if "full_chunked" in results["train"] and "trl_full" in results["train"]:
        nat, trl = results["train"]["full_chunked"], results["train"]["trl_full"]
        if "step_s" in nat and "step_s" in trl:
            print(f"tepo step seconds: native {nat['step_s']:.2f}, trl {trl['step_s']:.2f} (trl/native "
                  f"{trl['step_s'] / nat['step_s']:.2f}); rollout tokens/s: native {nat['rollout_tokens_per_s']:.0f}, "
                  f"trl {trl['rollout_tokens_per_s']:.0f}")


if __name__ == "__main__":
    main()
